//! The hot-resource pass: K clients on ONE resource, each looping lock(), a tiny critical
//! section, release, next to one client on a free resource (the uncontended rate), in one
//! run, the variants interleaved in slices so that machine noise hits them alike.
//!
//! Variants (every contended one has K clients, each a thread with a client of its own):
//! - `uncontended`: one redlock-mux client, `lock()` + `release` on its own resource. Its
//!   cycles/s is the reference rate; its `lock()` p50 is one fan-out round trip ("RTT").
//! - `notify`: redlock-mux `lock()` with default settings (`WaitMode::Notify`).
//! - `fair`: the same with `.fairness(true)`.
//! - `shared`: K threads sharing ONE `SharedRedlock` (one process), `lock()` with default
//!   settings: a release hands over to the next caller in the same write.
//! - `poll`: `WaitMode::Poll` (the retry delay only: 200 ms +- 100 ms).
//! - `spin`: `try_lock` retried at once (no waiting at all; what a hot loop does without a
//!   wait mode).
//! - `rslock`: rslock 0.10 `lock()` (its defaults: 3 retries 0-200 ms apart), retried when it
//!   gives up, each client on a current-thread runtime of its own.
//!
//! Per variant: grants/s and its ratio to the uncontended rate; hand-off latency (from a
//! holder's release start to the grant of a client that was already waiting then: not the
//! holder taking it again) in µs and in RTTs; refused attempts per grant (redlock-mux:
//! `Lock::attempts` - 1 per grant, plus every attempt of a call that gave up); grants that
//! overtook a client that had asked earlier; and the mutual-exclusion check (no two holds of
//! the resource overlap).
//!
//! Knobs: `PEERS_HOT_CLIENTS` (8), `PEERS_HOT_SECS` (seconds per slice, 2),
//! `PEERS_HOT_ROUNDS` (3).

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::local::LocalMasters;
use redlock_mux::{Error, Lock, LockGuard, Redlock, SharedRedlock, WaitMode};
use rslock::LockManager;
use tokio::runtime::Runtime;

use crate::delay::DelayNet;
use crate::{current_thread_runtime, env, pct, TTL};

/// One hold of the resource, in ns since the pass's epoch.
#[derive(Clone, Copy)]
struct Hold {
    asked: u64,
    start: u64,
    end: u64,
    /// The granting attempt's start (`Lock::acquired_at`; redlock-mux only).
    attempt: u64,
    /// When the release call returned.
    released: u64,
}

#[derive(Default)]
struct Tally {
    holds: Vec<Hold>,
    /// Refused attempts (attempts that did not grant), where the client says.
    refused: u64,
    /// lock() calls that ended without the lock.
    gave_up: u64,
    /// Seconds measured.
    secs: f64,
    /// Acquire latencies (ns) of the uncontended variant: one round each.
    acquire_ns: Vec<u64>,
    /// When an observer subscribed on master 0 saw an announcement (ns since the epoch).
    announced: Vec<u64>,
}

impl Tally {
    fn merge(&mut self, t: Tally) {
        self.holds.extend(t.holds);
        self.refused += t.refused;
        self.gave_up += t.gave_up;
    }
}

/// What the hand-off measurement reads of a granted lock, either client's.
trait Held {
    fn attempts(&self) -> u32;
    fn acquired_at(&self) -> Instant;
    fn valid_until(&self) -> Instant;
}

impl Held for Lock {
    fn attempts(&self) -> u32 {
        Lock::attempts(self)
    }
    fn acquired_at(&self) -> Instant {
        Lock::acquired_at(self)
    }
    fn valid_until(&self) -> Instant {
        Lock::valid_until(self)
    }
}

impl Held for LockGuard {
    fn attempts(&self) -> u32 {
        LockGuard::attempts(self)
    }
    fn acquired_at(&self) -> Instant {
        LockGuard::acquired_at(self)
    }
    fn valid_until(&self) -> Instant {
        LockGuard::valid_until(self)
    }
}

/// One client's loop until `end`: acquire (a refusal counts its attempts, and as a call
/// that gave up when `waits`), an empty critical section, release, `think`.
fn client_loop<C, H: Held>(
    c: &mut C,
    end: Instant,
    think: Duration,
    epoch: Instant,
    waits: bool,
    mut acquire: impl FnMut(&mut C) -> Result<H, Error>,
    mut release: impl FnMut(&mut C, H) -> Result<(), Error>,
) -> Tally {
    let mut t = Tally::default();
    while Instant::now() < end {
        let asked = Instant::now();
        let lock = match acquire(c) {
            Ok(l) => l,
            Err(Error::Taken(report)) => {
                t.refused += u64::from(report.attempts());
                t.gave_up += u64::from(waits);
                continue;
            }
            Err(e) => panic!("lock: {e}"),
        };
        let granted = Instant::now();
        t.refused += u64::from(lock.attempts() - 1);
        let attempt = ns(epoch, lock.acquired_at());
        let release_start = Instant::now();
        let end = ns(epoch, release_start.min(lock.valid_until()));
        release(c, lock).expect("release");
        t.holds.push(Hold {
            asked: ns(epoch, asked),
            start: ns(epoch, granted),
            end,
            attempt,
            released: ns(epoch, Instant::now()),
        });
        if !think.is_zero() {
            thread::sleep(think);
        }
    }
    t
}

enum Clients {
    Mux(Vec<Redlock>),
    Spin(Vec<Redlock>),
    /// K threads sharing one `SharedRedlock`.
    Shared(SharedRedlock, usize),
    Rslock(Vec<(Runtime, LockManager)>),
}

struct Variant {
    name: &'static str,
    what: &'static str,
    clients: Clients,
    /// After a release, the client waits this long before asking again (zero: greedy).
    think: Duration,
    tally: Tally,
}

fn mux_clients(
    urls: &[String],
    k: usize,
    f: impl Fn(redlock_mux::Builder) -> redlock_mux::Builder,
) -> Vec<Redlock> {
    (0..k)
        .map(|_| {
            f(Redlock::builder().masters(urls))
                .build()
                .expect("redlock-mux client")
        })
        .collect()
}

fn ns(epoch: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(epoch).as_nanos() as u64
}

/// Watch master `addr` for announcements (`PSUBSCRIBE redlock-mux:*`) until `end`: when
/// each was seen, in ns since `epoch`.
fn observe_announcements(addr: std::net::SocketAddr, epoch: Instant, end: Instant) -> Vec<u64> {
    use std::io::{BufRead, BufReader, Write};
    let mut seen = Vec::new();
    let Ok(mut conn) = std::net::TcpStream::connect(addr) else {
        return seen;
    };
    let _ = conn.set_nodelay(true);
    let _ = conn.write_all(b"*2\r\n$10\r\nPSUBSCRIBE\r\n$13\r\nredlock-mux:*\r\n");
    let _ = conn.set_read_timeout(Some(Duration::from_millis(20)));
    let mut r = BufReader::new(conn);
    let mut line = Vec::new();
    while Instant::now() < end {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) if line.starts_with(b"pmessage") => seen.push(ns(epoch, Instant::now())),
            Ok(_) => {}
            Err(_) => {}
        }
    }
    seen
}

/// Run one slice of `secs` of a variant: every client loops until the slice ends. With
/// `observe`, a raw subscriber on that master records when announcements arrive.
fn slice(
    v: &mut Variant,
    key: &str,
    epoch: Instant,
    secs: f64,
    observe: Option<std::net::SocketAddr>,
) {
    let out = Mutex::new(Tally::default());
    let spin = matches!(v.clients, Clients::Spin(_));
    let think = v.think;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let observed = Mutex::new(Vec::new());
    thread::scope(|s| {
        if let Some(addr) = observe {
            let observed = &observed;
            s.spawn(move || *observed.lock().unwrap() = observe_announcements(addr, epoch, end));
        }
        match &mut v.clients {
            Clients::Mux(cs) | Clients::Spin(cs) => {
                for c in cs.iter_mut() {
                    let out = &out;
                    s.spawn(move || {
                        let acquire = |c: &mut Redlock| {
                            if spin {
                                c.try_lock(key, TTL)
                            } else {
                                c.lock(key, TTL)
                            }
                        };
                        let release = |c: &mut Redlock, l| c.release(l);
                        let t = client_loop(c, end, think, epoch, !spin, acquire, release);
                        out.lock().unwrap().merge(t);
                    });
                }
            }
            Clients::Shared(c, k) => {
                for _ in 0..*k {
                    let (out, mut c) = (&out, c.clone());
                    s.spawn(move || {
                        let t = client_loop(
                            &mut c,
                            end,
                            think,
                            epoch,
                            true,
                            |c: &mut SharedRedlock| c.lock(key, TTL).wait(),
                            |_: &mut SharedRedlock, g: LockGuard| g.release().wait(),
                        );
                        out.lock().unwrap().merge(t);
                    });
                }
            }
            Clients::Rslock(cs) => {
                for (rt, lm) in cs.iter_mut() {
                    let out = &out;
                    s.spawn(move || {
                        let mut t = Tally::default();
                        rt.block_on(async {
                            while Instant::now() < end {
                                let asked = Instant::now();
                                let lock = match lm.lock(key, TTL).await {
                                    Ok(l) => l,
                                    Err(_) => {
                                        t.gave_up += 1;
                                        continue;
                                    }
                                };
                                let granted = Instant::now();
                                let release = Instant::now();
                                lm.unlock(&lock).await;
                                t.holds.push(Hold {
                                    asked: ns(epoch, asked),
                                    start: ns(epoch, granted),
                                    end: ns(epoch, release),
                                    attempt: ns(epoch, granted),
                                    released: ns(epoch, Instant::now()),
                                });
                                if !think.is_zero() {
                                    thread::sleep(think);
                                }
                            }
                        });
                        out.lock().unwrap().merge(t);
                    });
                }
            }
        }
    });
    let o = out.into_inner().unwrap();
    // Only the grants inside the slice count (a call that outlived it is not measured).
    let end_ns = ns(epoch, end);
    v.tally
        .holds
        .extend(o.holds.into_iter().filter(|h| h.start < end_ns));
    v.tally.refused += o.refused;
    v.tally.gave_up += o.gave_up;
    v.tally.secs += secs;
    v.tally.announced.extend(observed.into_inner().unwrap());
}

/// A slice of the uncontended reference: one client, its own resource.
fn uncontended_slice(c: &mut Redlock, t: &mut Tally, secs: f64) {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut cycles = 0u64;
    while Instant::now() < end {
        let t0 = Instant::now();
        let lock = c.lock("peers:hot:free", TTL).expect("uncontended lock");
        t.acquire_ns.push(t0.elapsed().as_nanos() as u64);
        c.release(lock).expect("release");
        cycles += 1;
    }
    t.holds.extend((0..cycles).map(|_| Hold {
        asked: 0,
        start: 0,
        end: 0,
        attempt: 0,
        released: 0,
    }));
    t.secs += secs;
}

struct Summary {
    grants_per_s: f64,
    handoff_us: Vec<u64>,
    out_of_order: u64,
    overlaps: u64,
}

fn summarize(t: &Tally) -> Summary {
    let mut h = t.holds.clone();
    h.sort_unstable_by_key(|x| x.start);
    let mut handoff_us = Vec::new();
    let mut overlaps = 0;
    for w in h.windows(2) {
        let (p, x) = (w[0], w[1]);
        if x.start < p.end {
            overlaps += 1;
        }
        if x.asked <= p.end && x.start >= p.end {
            handoff_us.push((x.start - p.end) / 1000);
        }
    }
    handoff_us.sort_unstable();
    let mut out_of_order = 0;
    let mut earliest_after = u64::MAX;
    for x in h.iter().rev() {
        if earliest_after < x.asked {
            out_of_order += 1;
        }
        earliest_after = earliest_after.min(x.asked);
    }
    Summary {
        grants_per_s: t.holds.len() as f64 / t.secs.max(1e-9),
        handoff_us,
        out_of_order,
        overlaps,
    }
}

pub fn hot_pass(m: &LocalMasters) {
    let k: usize = env("PEERS_HOT_CLIENTS", 8);
    let secs: f64 = env("PEERS_HOT_SECS", 2.0);
    let rounds: usize = env("PEERS_HOT_ROUNDS", 3);
    let delay_us: u64 = env("PEERS_HOT_DELAY_US", 0);
    // With a delay, every client reaches the masters through a proxy that holds each byte
    // that long each way: masters as if on other hosts.
    let net = (delay_us > 0).then(|| {
        DelayNet::start(&m.addrs(), Duration::from_micros(delay_us)).expect("delay proxies")
    });
    let urls: Vec<String> = match &net {
        None => m.urls(),
        Some(net) => net.addrs().iter().map(|a| format!("redis://{a}")).collect(),
    };
    let observe_addr = net.as_ref().map_or(m[0].addr(), |n| n.addrs()[0]);
    let epoch = Instant::now();
    let mut free = Redlock::builder()
        .masters(&urls)
        .build()
        .expect("redlock-mux client");
    let mut reference = Tally::default();
    let think: f64 = env("PEERS_HOT_THINK_MS", 1.0);
    let think = Duration::from_secs_f64(think / 1000.0);
    let mut variants = Vec::new();
    for (loop_name, t) in [("greedy", Duration::ZERO), ("polite", think)] {
        let v = |name, what, clients| Variant {
            name,
            what,
            clients,
            think: t,
            tally: Tally::default(),
        };
        let polite = !t.is_zero();
        variants.push(v(
            if polite { "notify, polite" } else { "notify" },
            "redlock-mux lock(), default settings (WaitMode::Notify)",
            Clients::Mux(mux_clients(&urls, k, |b| b)),
        ));
        variants.push(v(
            if polite { "fair, polite" } else { "fair" },
            "redlock-mux lock(), .fairness(true)",
            Clients::Mux(mux_clients(&urls, k, |b| b.fairness(true))),
        ));
        variants.push(v(
            if polite { "poll, polite" } else { "poll" },
            "redlock-mux lock(), WaitMode::Poll (retry delay 200 ms +- 100 ms)",
            Clients::Mux(mux_clients(&urls, k, |b| b.wait_mode(WaitMode::Poll))),
        ));
        if !polite {
            variants.push(v(
                "shared",
                "8 threads sharing one redlock-mux SharedRedlock, lock(), default settings",
                Clients::Shared(
                    Redlock::builder()
                        .masters(&urls)
                        .build_shared()
                        .expect("shared client"),
                    k,
                ),
            ));
            variants.push(v(
                "spin",
                "redlock-mux try_lock() retried at once",
                Clients::Spin(mux_clients(&urls, k, |b| b.retry_count(0))),
            ));
        }
        variants.push(v(
            if polite { "rslock, polite" } else { "rslock" },
            "rslock 0.10 lock() (3 retries 0-200 ms apart), again when it gives up",
            Clients::Rslock(
                (0..k)
                    .map(|_| (current_thread_runtime(), LockManager::new(urls.clone())))
                    .collect(),
            ),
        ));
        let _ = loop_name;
    }
    // Warm up every client (connections, scripts) outside the measurement.
    for v in variants.iter_mut() {
        slice(v, "peers:hot:warmup", epoch, 0.2, None);
        v.tally = Tally::default();
    }
    uncontended_slice(&mut free, &mut Tally::default(), 0.2);
    println!(
        "\n## hot resource: {k} clients on one resource, 5 masters ({rounds} rounds of {secs} s \
         slices per variant, interleaved){}\n",
        if delay_us == 0 {
            String::new()
        } else {
            format!(", every master behind a proxy holding each byte {delay_us} µs each way")
        }
    );
    for round in 0..rounds {
        uncontended_slice(&mut free, &mut reference, secs);
        for v in variants.iter_mut() {
            let key = format!("peers:hot:{}:{round}", v.name.replace(", ", "-"));
            let observe = matches!(v.name, "notify" | "fair" | "shared").then_some(observe_addr);
            slice(v, &key, epoch, secs, observe);
        }
    }
    let ref_rate = reference.holds.len() as f64 / reference.secs;
    reference.acquire_ns.sort_unstable();
    let rtt_us = pct(&reference.acquire_ns, 0.5) as f64 / 1000.0;
    println!(
        "- uncontended (1 client, its own resource, lock() + release): {:.0} cycles/s; \
         lock() p50 {rtt_us:.1} µs = one fan-out round trip (RTT)",
        ref_rate
    );
    for v in variants.iter().filter(|v| v.think.is_zero()) {
        println!("- {}: {}", v.name, v.what);
    }
    println!(
        "- greedy: each client asks again as soon as it released; polite (`, polite`): it \
         waits {:.1} ms after its release before it asks again (each grant then goes to a \
         client that was waiting)",
        think.as_secs_f64() * 1000.0
    );
    println!(
        "- hand-off: from a holder's release start to the grant of a client that was already \
         waiting then; hand-offs/s counts those grants"
    );
    println!();
    println!("| variant | grants/s | x uncontended | hand-offs/s | hand-off p50 µs | p90 | p99 | p50 / RTT | refused per grant | calls that gave up | out of arrival order | mutual exclusion |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|");
    let mut rates = Vec::new();
    for v in &variants {
        let s = summarize(&v.tally);
        let grants = v.tally.holds.len().max(1) as f64;
        let refused = match v.clients {
            Clients::Rslock(_) => "–".to_string(),
            _ => format!("{:.2}", v.tally.refused as f64 / grants),
        };
        let handoffs_per_s = s.handoff_us.len() as f64 / v.tally.secs.max(1e-9);
        rates.push((v.name, s.grants_per_s, handoffs_per_s));
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            v.name,
            s.grants_per_s,
            s.grants_per_s / ref_rate,
            handoffs_per_s,
            pct(&s.handoff_us, 0.5),
            pct(&s.handoff_us, 0.9),
            pct(&s.handoff_us, 0.99),
            pct(&s.handoff_us, 0.5) as f64 / rtt_us,
            refused,
            v.tally.gave_up,
            s.out_of_order,
            if s.overlaps == 0 {
                format!("ok ({} holds)", v.tally.holds.len())
            } else {
                format!("VIOLATED: {} overlaps", s.overlaps)
            }
        );
    }
    println!(
        "\nWhere a hand-off's time goes (medians over the hand-offs; an observer subscribed on \
         master 0 marks when the announcement arrived there; the waiter's granting attempt \
         starts at Lock::acquired_at):\n"
    );
    println!("| variant | holder's release round µs | release start -> announcement seen µs | announcement -> waiter's attempt starts µs | waiter's acquire round µs | hand-off p50 µs |");
    println!("|---|--:|--:|--:|--:|--:|");
    for v in variants.iter().filter(|v| !v.tally.announced.is_empty()) {
        let mut h = v.tally.holds.clone();
        h.sort_unstable_by_key(|x| x.start);
        let mut ann = v.tally.announced.clone();
        ann.sort_unstable();
        let (mut rel, mut seen, mut wake, mut acq) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for w in h.windows(2) {
            let (p, x) = (w[0], w[1]);
            if !(x.asked <= p.end && x.start >= p.end && x.attempt >= p.end) {
                continue;
            }
            let k = ann.partition_point(|&t| t < p.end);
            let Some(&a) = ann.get(k).filter(|&&a| a <= x.attempt) else {
                continue;
            };
            rel.push((p.released - p.end) / 1000);
            seen.push((a - p.end) / 1000);
            wake.push((x.attempt - a) / 1000);
            acq.push((x.start - x.attempt) / 1000);
        }
        for x in [&mut rel, &mut seen, &mut wake, &mut acq] {
            x.sort_unstable();
        }
        let s = summarize(&v.tally);
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            v.name,
            pct(&rel, 0.5),
            pct(&seen, 0.5),
            pct(&wake, 0.5),
            pct(&acq, 0.5),
            pct(&s.handoff_us, 0.5)
        );
    }
    let handoffs = |n: &str| rates.iter().find(|(x, _, _)| *x == n).map_or(0.0, |r| r.2);
    for loop_suffix in ["", ", polite"] {
        let name = |v: &str| format!("{v}{loop_suffix}");
        println!(
            "\n{}: hand-offs/s: notify {:.1}x poll, {:.1}x rslock; fair {:.1}x poll, {:.1}x rslock",
            if loop_suffix.is_empty() {
                "greedy"
            } else {
                "polite"
            },
            handoffs(&name("notify")) / handoffs(&name("poll")).max(1e-9),
            handoffs(&name("notify")) / handoffs(&name("rslock")).max(1e-9),
            handoffs(&name("fair")) / handoffs(&name("poll")).max(1e-9),
            handoffs(&name("fair")) / handoffs(&name("rslock")).max(1e-9),
        );
    }
}
