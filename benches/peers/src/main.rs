//! Peer comparison: redlock-mux next to the plain-socket floor, `redlock` 2.x and `rslock`
//! 0.10, in one run, against the same local `redis-server` masters.
//!
//! Two passes, each interleaving its variants in blocks so machine noise hits them alike:
//!
//! 1. Single-cycle latency (lock + release of one resource, TTL 10 s) on 5 masters, then
//!    on 1 master: p50/p90/p99/p99.9/max, ratios to the floor's p50 and p99, and user and
//!    system CPU per cycle from `getrusage(RUSAGE_THREAD)` around each block.
//! 2. Throughput with 64 locks in flight from one thread on 5 masters: the pipelined floor
//!    at K = 64, redlock-mux `try_lock_batch` + `release_batch` of 64, rslock with 64
//!    concurrent tasks on the current-thread runtime, and `redlock` 2.x sequentially (it
//!    has no way to keep more than one lock operation in flight).
//!
//! Knobs: `PEERS_CYCLES` (latency cycles per variant and master count, default 8000),
//! `PEERS_SECS` (throughput seconds per variant, default 3), `PEERS_BLOCK` (latency cycles
//! per interleaved block, default 200), `--pin` or `PEERS_PIN=1` (the measuring thread on
//! the first CPU it may use, the masters on the others; Linux, 2 CPUs or more; default
//! unpinned).
//!
//! `cargo run --release --manifest-path benches/peers/Cargo.toml [-- --pin]`

use std::str::FromStr;
use std::time::{Duration, Instant};

#[path = "../../common/floor.rs"]
mod floor;

use floor::Floor;
use redlock_mux::local::{cpu_list, pin_current_thread, split_cpus, AdminReply, LocalMasters};
use redlock_mux::Redlock;
use redlock_rs::RedLock;
use rslock::LockManager;
use tokio::runtime::Runtime;

/// Lock TTL for every variant (the floor's `floor::TTL` is the same 10 s).
const TTL: Duration = Duration::from_secs(10);
/// Locks in flight in the throughput pass.
const K: usize = 64;
/// Interleaved slices per variant in the throughput pass.
const SLICES: u32 = 10;

fn env<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// CPU accounting
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct Cpu {
    /// User CPU of the calling thread.
    user: Duration,
    /// System CPU of the calling thread.
    sys: Duration,
    /// CPU of the whole process (to catch work on other threads, which there should be
    /// none of: redis-rs and tokio run on the calling thread here).
    process: Duration,
}

fn rusage(who: libc::c_int) -> (Duration, Duration) {
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local rusage.
    let rc = unsafe { libc::getrusage(who, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv =
        |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

fn cpu_now() -> Cpu {
    let (user, sys) = rusage(libc::RUSAGE_THREAD);
    let (pu, ps) = rusage(libc::RUSAGE_SELF);
    Cpu {
        user,
        sys,
        process: pu + ps,
    }
}

impl Cpu {
    fn since(self, start: Cpu) -> Cpu {
        Cpu {
            user: self.user - start.user,
            sys: self.sys - start.sys,
            process: self.process - start.process,
        }
    }
    fn add(&mut self, o: Cpu) {
        self.user += o.user;
        self.sys += o.sys;
        self.process += o.process;
    }
    fn total(&self) -> Duration {
        self.user + self.sys
    }
    /// CPU spent by threads other than the measuring one.
    fn other(&self) -> Duration {
        self.process.saturating_sub(self.total())
    }
    /// More CPU on other threads than the accounting noise between the thread and
    /// process clocks (both are sampled, a few percent apart at most).
    fn noticeable_other(&self) -> bool {
        self.other().as_secs_f64() > 0.05 * self.total().as_secs_f64()
    }
}

fn us_per(d: Duration, cycles: u64) -> f64 {
    d.as_nanos() as f64 / 1000.0 / cycles as f64
}

// ---------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------

fn mux(m: &LocalMasters, busy: bool) -> Redlock {
    Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .busy_poll(busy)
        .build()
        .expect("redlock-mux client")
}

fn current_thread_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio current-thread runtime")
}

/// Prints the number of keys on every master (all locks released: 0 each), and names a
/// few of the keys left behind, if any.
fn report_keys_left(m: &LocalMasters) {
    let counts: Vec<i64> = m
        .iter()
        .map(|x| match x.cmd(&[b"DBSIZE"]) {
            Ok(AdminReply::Int(n)) => n,
            other => panic!("DBSIZE: {other:?}"),
        })
        .collect();
    println!("\nkeys left on the masters after the pass: {counts:?}");
    for (i, x) in m.iter().enumerate().filter(|(i, _)| counts[*i] > 0) {
        let mut names: Vec<String> = match x.cmd(&[b"KEYS", b"*"]) {
            Ok(AdminReply::Array(v)) => v
                .iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect(),
            other => vec![format!("{other:?}")],
        };
        names.sort_unstable();
        println!(
            "  master {i}: {} keys, e.g. {:?}",
            names.len(),
            &names[..names.len().min(6)]
        );
    }
}

fn redis_version(m: &LocalMasters) -> String {
    let master = m.iter().next().expect("a master");
    match master.cmd(&[b"INFO", b"server"]) {
        Ok(r) => r
            .as_str()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| "?".into()),
        Err(e) => format!("? ({e})"),
    }
}

// ---------------------------------------------------------------------------------------
// Latency pass
// ---------------------------------------------------------------------------------------

/// Runs `n` lock+release cycles, pushing the duration in ns of each cycle that got its
/// lock; returns the number of cycles whose lock was refused or failed.
type Block<'a> = Box<dyn FnMut(usize, &mut Vec<u64>) -> u64 + 'a>;

struct LatVariant<'a> {
    name: &'static str,
    block: Block<'a>,
    ns: Vec<u64>,
    failed: u64,
    cpu: Cpu,
}

impl<'a> LatVariant<'a> {
    fn new(name: &'static str, block: Block<'a>) -> Self {
        LatVariant {
            name,
            block,
            ns: Vec::new(),
            failed: 0,
            cpu: Cpu::default(),
        }
    }
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// One redlock-mux lock+release cycle; `None` when the lock was not granted.
fn mux_cycle(c: &mut Redlock, key: &str) -> Option<u64> {
    let t0 = Instant::now();
    let lock = c.try_lock(key, TTL).ok()?;
    // A release without quorum still ends the cycle (the keys expire with the TTL).
    let _ = c.release(lock);
    Some(t0.elapsed().as_nanos() as u64)
}

/// Connects beyond the first per master: a reconnect means the client dropped a connection
/// (and whatever it still owed on it) during the pass.
fn reconnects(c: &Redlock) -> Vec<u64> {
    c.stats()
        .iter()
        .map(|s| s.connects.saturating_sub(1))
        .collect()
}

fn latency_pass(m: &LocalMasters, rt: &Runtime, cycles: usize, block: usize) {
    let n_masters = m.len();
    let mut fl = Floor::new(&m.addrs(), false);
    let mut ours = mux(m, false);
    let mut ours_busy = mux(m, true);
    let rs = LockManager::new(m.urls());
    let rl = RedLock::new(m.urls());

    let mut variants: Vec<LatVariant> = vec![
        LatVariant::new(
            "floor (std sockets)",
            Box::new(|n, out| {
                for _ in 0..n {
                    let (a, r) = fl.cycle();
                    out.push((a + r).as_nanos() as u64);
                }
                0
            }),
        ),
        LatVariant::new(
            "redlock-mux",
            Box::new(|n, out| {
                let mut failed = 0;
                for _ in 0..n {
                    match mux_cycle(&mut ours, "peers:mux") {
                        Some(ns) => out.push(ns),
                        None => failed += 1,
                    }
                }
                failed
            }),
        ),
        LatVariant::new(
            "redlock-mux busy-poll",
            Box::new(|n, out| {
                let mut failed = 0;
                for _ in 0..n {
                    match mux_cycle(&mut ours_busy, "peers:muxbusy") {
                        Some(ns) => out.push(ns),
                        None => failed += 1,
                    }
                }
                failed
            }),
        ),
        LatVariant::new(
            "rslock (tokio 1 thread)",
            // One `block_on` per block: the cycles of a block run in one async loop on the
            // current-thread runtime, which also drives redis-rs's connection tasks.
            Box::new(|n, out| {
                rt.block_on(async {
                    let mut failed = 0;
                    for _ in 0..n {
                        let t0 = Instant::now();
                        match rs.lock("peers:rslock", TTL).await {
                            Ok(lock) => {
                                rs.unlock(&lock).await;
                                out.push(t0.elapsed().as_nanos() as u64);
                            }
                            Err(_) => failed += 1,
                        }
                    }
                    failed
                })
            }),
        ),
        LatVariant::new(
            "redlock 2.x (sync)",
            Box::new(|n, out| {
                let mut failed = 0;
                for _ in 0..n {
                    let t0 = Instant::now();
                    match rl.lock(b"peers:redlock", TTL.as_millis() as usize) {
                        Ok(Some(lock)) => {
                            rl.unlock(&lock);
                            out.push(t0.elapsed().as_nanos() as u64);
                        }
                        Ok(None) | Err(_) => failed += 1,
                    }
                }
                failed
            }),
        ),
    ];

    // Warm up: connections, script caches, allocator, branch predictors.
    let mut scratch = Vec::with_capacity(block.max(500));
    for v in variants.iter_mut() {
        (v.block)(500, &mut scratch);
        scratch.clear();
        v.ns.reserve(cycles);
    }
    let mut done = 0;
    while done < cycles {
        let k = block.min(cycles - done);
        for v in variants.iter_mut() {
            let c0 = cpu_now();
            v.failed += (v.block)(k, &mut v.ns);
            v.cpu.add(cpu_now().since(c0));
        }
        done += k;
    }
    for v in variants.iter_mut() {
        v.ns.sort_unstable();
    }

    let f50 = pct(&variants[0].ns, 0.5) as f64;
    let f99 = pct(&variants[0].ns, 0.99) as f64;
    let fcpu = variants[0].cpu.total();
    let n = cycles as u64;
    println!(
        "\n### Lock+release cycle, {n_masters} master{}: {cycles} cycles per variant, interleaved in blocks of {block}\n",
        if n_masters == 1 { "" } else { "s" }
    );
    println!("| variant | p50 µs | p90 | p99 | p99.9 | max | p50/floor | p99/floor | user µs/cyc | sys µs/cyc | cpu/floor | failed |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let us = |ns: u64| ns as f64 / 1000.0;
    for v in &variants {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {} |",
            v.name,
            us(pct(&v.ns, 0.5)),
            us(pct(&v.ns, 0.9)),
            us(pct(&v.ns, 0.99)),
            us(pct(&v.ns, 0.999)),
            us(v.ns.last().copied().unwrap_or(0)),
            pct(&v.ns, 0.5) as f64 / f50,
            pct(&v.ns, 0.99) as f64 / f99,
            us_per(v.cpu.user, n),
            us_per(v.cpu.sys, n),
            v.cpu.total().as_secs_f64() / fcpu.as_secs_f64(),
            v.failed,
        );
    }
    let other: Vec<String> = variants
        .iter()
        .filter(|v| v.cpu.noticeable_other())
        .map(|v| format!("{} {:.1} µs/cyc", v.name, us_per(v.cpu.other(), n)))
        .collect();
    if !other.is_empty() {
        println!(
            "\nnote: CPU on threads other than the measuring one (not in the table): {}",
            other.join(", ")
        );
    }
    drop(variants);
    println!(
        "\nredlock-mux reconnects per master during the pass: {:?}, busy-poll {:?}",
        reconnects(&ours),
        reconnects(&ours_busy)
    );
    report_keys_left(m);
}

// ---------------------------------------------------------------------------------------
// Throughput pass
// ---------------------------------------------------------------------------------------

/// Runs lock+release cycles until `slice` has passed; returns the cycles that got their
/// lock and the ones whose lock was refused or failed.
type Slice<'a> = Box<dyn FnMut(Duration) -> (u64, u64) + 'a>;

struct TputVariant<'a> {
    name: &'static str,
    in_flight: &'static str,
    run: Slice<'a>,
    cycles: u64,
    failed: u64,
    time: Duration,
    cpu: Cpu,
}

impl<'a> TputVariant<'a> {
    fn new(name: &'static str, in_flight: &'static str, run: Slice<'a>) -> Self {
        TputVariant {
            name,
            in_flight,
            run,
            cycles: 0,
            failed: 0,
            time: Duration::ZERO,
            cpu: Cpu::default(),
        }
    }
}

fn throughput_pass(m: &LocalMasters, rt: &Runtime, secs: f64) {
    let mut fl = Floor::new(&m.addrs(), false);
    let mut ours = mux(m, false);
    let rs = LockManager::new(m.urls());
    let rl = RedLock::new(m.urls());

    let names: Vec<String> = (0..K).map(|j| format!("peers:mux:tput:{j}")).collect();
    let mut out = Vec::with_capacity(K);
    let mut locks = Vec::with_capacity(K);
    let mut rel = Vec::with_capacity(K);

    let mut variants: Vec<TputVariant> = vec![
        TputVariant::new(
            "floor (pipelined)",
            "64",
            Box::new(|slice| {
                let t = Instant::now();
                let mut c = 0;
                while t.elapsed() < slice {
                    fl.cycle_k(K);
                    c += K as u64;
                }
                (c, 0)
            }),
        ),
        TputVariant::new(
            "redlock-mux batch",
            "64",
            Box::new(|slice| {
                let t = Instant::now();
                let (mut c, mut failed) = (0, 0);
                while t.elapsed() < slice {
                    ours.try_lock_batch(&names, TTL, &mut out)
                        .expect("redlock-mux batch");
                    for r in out.drain(..) {
                        match r {
                            Ok(lock) => locks.push(lock),
                            Err(_) => failed += 1,
                        }
                    }
                    c += locks.len() as u64;
                    ours.release_batch(locks.drain(..), &mut rel)
                        .expect("redlock-mux release batch");
                }
                (c, failed)
            }),
        ),
        TputVariant::new(
            "rslock, 64 tasks",
            "64",
            // 64 tasks spawned on the current-thread runtime, each looping lock+release on
            // its own resource until the slice's deadline; the slice ends when all have
            // finished their last cycle.
            Box::new(|slice| {
                let deadline = Instant::now() + slice;
                rt.block_on(async {
                    let mut set = tokio::task::JoinSet::new();
                    for j in 0..K {
                        let rs = rs.clone();
                        set.spawn(async move {
                            let key = format!("peers:rslock:tput:{j}");
                            let (mut c, mut failed) = (0u64, 0u64);
                            while Instant::now() < deadline {
                                match rs.lock(key.as_str(), TTL).await {
                                    Ok(lock) => {
                                        rs.unlock(&lock).await;
                                        c += 1;
                                    }
                                    Err(_) => failed += 1,
                                }
                            }
                            (c, failed)
                        });
                    }
                    let (mut c, mut failed) = (0, 0);
                    while let Some(r) = set.join_next().await {
                        let (a, b) = r.expect("rslock task");
                        c += a;
                        failed += b;
                    }
                    (c, failed)
                })
            }),
        ),
        TputVariant::new(
            "redlock 2.x (sequential)",
            "1",
            Box::new(|slice| {
                let t = Instant::now();
                let (mut c, mut failed) = (0, 0);
                while t.elapsed() < slice {
                    match rl.lock(b"peers:redlock:tput", TTL.as_millis() as usize) {
                        Ok(Some(lock)) => {
                            rl.unlock(&lock);
                            c += 1;
                        }
                        Ok(None) | Err(_) => failed += 1,
                    }
                }
                (c, failed)
            }),
        ),
    ];

    for v in variants.iter_mut() {
        (v.run)(Duration::from_millis(200));
    }
    let slice = Duration::from_secs_f64(secs / SLICES as f64);
    for _ in 0..SLICES {
        for v in variants.iter_mut() {
            let c0 = cpu_now();
            let t = Instant::now();
            let (c, failed) = (v.run)(slice);
            v.time += t.elapsed();
            v.cpu.add(cpu_now().since(c0));
            v.cycles += c;
            v.failed += failed;
        }
    }

    let rate = |v: &TputVariant| v.cycles as f64 / v.time.as_secs_f64();
    let cpu_per = |v: &TputVariant| us_per(v.cpu.total(), v.cycles);
    let (f_rate, f_cpu) = (rate(&variants[0]), cpu_per(&variants[0]));
    let r_rate = rate(&variants[2]);
    println!(
        "\n### Throughput from one thread, {} masters: ~{secs} s per variant in {SLICES} interleaved slices\n",
        m.len()
    );
    println!("| variant | in flight | cycles/s | x floor | x rslock | user µs/cyc | sys µs/cyc | cpu/floor | failed |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for v in &variants {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {} |",
            v.name,
            v.in_flight,
            rate(v),
            rate(v) / f_rate,
            rate(v) / r_rate,
            us_per(v.cpu.user, v.cycles),
            us_per(v.cpu.sys, v.cycles),
            cpu_per(v) / f_cpu,
            v.failed,
        );
    }
    let other: Vec<String> = variants
        .iter()
        .filter(|v| v.cpu.noticeable_other())
        .map(|v| format!("{} {:.1} µs/cyc", v.name, us_per(v.cpu.other(), v.cycles)))
        .collect();
    if !other.is_empty() {
        println!(
            "\nnote: CPU on threads other than the measuring one (not in the table): {}",
            other.join(", ")
        );
    }
    drop(variants);
    println!(
        "\nredlock-mux reconnects per master during the pass: {:?}",
        reconnects(&ours)
    );
    report_keys_left(m);
}

// ---------------------------------------------------------------------------------------

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

const USAGE: &str = "usage: redlock-mux-peers [--pin]\n\n  --pin   the measuring thread (every variant) on the first CPU it may use, the masters\n          on the others (also PEERS_PIN=1)\n\nKnobs: PEERS_CYCLES, PEERS_SECS, PEERS_BLOCK (see README.md)";

/// `--pin` or `PEERS_PIN` set to anything but empty or `0`.
fn pin_requested() -> bool {
    let mut pin = std::env::var("PEERS_PIN").is_ok_and(|v| !v.is_empty() && v != "0");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--pin" => pin = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument `{other}`\n\n{USAGE}");
                std::process::exit(64);
            }
        }
    }
    pin
}

fn main() {
    let pin = pin_requested();
    let cycles: usize = env("PEERS_CYCLES", 8000);
    let secs: f64 = env("PEERS_SECS", 3.0);
    let block: usize = env("PEERS_BLOCK", 200).max(1);
    let started = Instant::now();

    // Pinned: this thread (every variant runs on it) on one CPU, the masters on the others.
    // Before anything starts, so that later threads inherit the pinning.
    let (placement, master_cpus) = if pin {
        let (client, masters) = split_cpus(1).unwrap_or_else(|e| panic!("--pin: {e}"));
        pin_current_thread(client[0]).unwrap_or_else(|e| panic!("--pin: {e}"));
        (
            format!(
                "pinned (--pin): the measuring thread on CPU {}, the masters on CPU {}",
                client[0],
                cpu_list(&masters)
            ),
            Some(masters),
        )
    } else {
        (
            "unpinned: measuring thread and masters on any CPU (--pin to pin)".to_string(),
            None,
        )
    };
    let start = |n: usize| {
        match &master_cpus {
            Some(cpus) => LocalMasters::start_on_cpus(n, cpus),
            None => LocalMasters::start(n),
        }
        .expect("local masters (is redis-server installed?)")
    };
    let m5 = start(5);
    let m1 = start(1);
    // Every variant runs on this thread: the sync ones directly, rslock's futures and
    // redis-rs's connection driver tasks inside `block_on` of this current-thread runtime.
    let rt = current_thread_runtime();

    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("## redlock-mux peer comparison\n");
    println!(
        "- machine: nproc {nproc}, load average at start {}",
        loadavg()
    );
    println!(
        "- masters: local redis-server {} on 127.0.0.1, no persistence; 5-master set and a separate 1-master set",
        redis_version(&m5)
    );
    println!("- placement: {placement}");
    println!(
        "- every lock: TTL 10 s, a distinct free resource per variant (per task for rslock), so no retry ever runs; CPU from getrusage(RUSAGE_THREAD) around each block on the one measuring thread"
    );
    println!(
        "- floor: std blocking sockets, SET NX PX to all masters then read all; EVALSHA release to all then read all (pipelined K per write in the throughput pass)"
    );
    println!(
        "- redlock-mux {}: retry_count(0), busy_poll(false|true), default timeouts",
        env!("PEERS_V_MUX")
    );
    println!(
        "- rslock {} (feature tokio-comp, redis-rs {}, tokio {} current-thread runtime): LockManager::new(urls), lock(resource, ttl) + unlock(&lock); defaults: retry 3 x 0-200 ms, multiplexed connections, response timeout 500 ms",
        env!("PEERS_V_RSLOCK"),
        env!("PEERS_V_REDIS"),
        env!("PEERS_V_TOKIO"),
    );
    println!(
        "- redlock {} (sync API; redis-rs 0.23): RedLock::new(urls), lock(resource, ttl_ms) + unlock(&lock); defaults: retry 3 x 0-200 ms; opens a new TCP connection per master for every SET and every release, masters one after another",
        env!("PEERS_V_REDLOCK")
    );

    latency_pass(&m5, &rt, cycles, block);
    latency_pass(&m1, &rt, cycles, block);
    throughput_pass(&m5, &rt, secs);

    println!(
        "\nthreads in this process at the end: {}; load average at end {}; run took {:.0} s (PEERS_CYCLES={cycles}, PEERS_SECS={secs}, PEERS_BLOCK={block}, {})",
        std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count()),
        loadavg(),
        started.elapsed().as_secs_f64(),
        if pin { "pinned" } else { "unpinned" }
    );
}
