//! Contention torture (issue 6, items 2 and 3): several clients, each its own `Redlock` on
//! its own thread, fight over a few resources on 5 real masters while faults are injected
//! at random from a printed seed. Mutual exclusion is checked two ways:
//!
//! * **intervals**: every grant records the interval in which its holder used the lock,
//!   and no two intervals of one resource may overlap;
//! * **a non-atomic counter**: under the lock, holders do read-modify-write units (load,
//!   pause, store) on a per-resource counter; any overlap of two holders' units loses an
//!   update, so the counter must equal the number of units done.
//!
//! Which interval: the one in which the holder may use the lock, from the moment `lock`
//! returned (the quorum's `SET`s had landed) until it lets go: just before its release is
//! sent, or, for a lock it leaves to expire, `Lock::valid_until`. Holders do their units
//! only while more than [`WORK_MARGIN`] of validity is left, and every unit must end before
//! `valid_until` (checked: "overruns"). Not `Lock::acquired_at` as the start: that is when
//! the acquiring round *started*, before its `SET`s were sent, so a client whose round
//! starts just before the previous holder lets go and lands just after would show an
//! overlap that is no double grant. What Redlock guarantees: a grant observed at `g` came
//! from a quorum of `SET`s, which intersects every earlier holder's quorum, and there it
//! landed after that holder's key was gone: deleted by its release (sent after it let go)
//! or expired (at least `ttl` after its round started, later than its
//! `valid_until = start + ttl - drift`). So `g` is after every earlier holder let go.
//!
//! Faults (one shuffled cycle of every kind after another, at most 2 of the 5 masters
//! affected at once): a master killed and restarted (without persistence) only after the
//! maximum TTL, or, with the amnesia guard on in every client, restarted at once; a master
//! frozen with SIGSTOP and thawed; latency spikes through the fault proxy (each way up to
//! 20 ms, well below the validity margin); every connection to a master reset (RST); a
//! master's traffic held (a pause of the network, delivered late).
//!
//! Environment: `TORTURE_SECS` (default 8, per mode), `TORTURE_SEED` (decimal or 0x-hex)
//! to replay a run's fault schedule and client choices (thread timing still differs). Soak:
//!
//! ```text
//! TORTURE_SECS=60 cargo test --release --features local --test torture -- --nocapture
//! ```
//!
//! Item 3, the checker can fail: [`checker_catches_the_double_grant_of_a_restart_without_persistence`]
//! builds the known hazard step by step (a master restarted at once without persistence,
//! guards off) and asserts that both checks report the double grant.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::{Error, Fault, Lock, Outcome, Redlock};
use support::proxy::{Mode as ProxyMode, Proxy};
use support::{masters, AdminReply, LocalMasters};

const MASTERS: usize = 5;
const CLIENTS: usize = 4;
const RESOURCES: usize = 3;
/// The largest TTL any client uses (lock or extend), and the amnesia guard's `max_ttl`.
const MAX_TTL: Duration = Duration::from_millis(1000);
const MIN_TTL_MS: u64 = 400;
const NODE_TIMEOUT: Duration = Duration::from_millis(60);
const STALL: Duration = Duration::from_millis(400);
/// A holder starts a unit of work only with more validity than this left.
const WORK_MARGIN: Duration = Duration::from_millis(150);
/// The pause between the load and the store of a unit (widens the race window).
const WORK_PAUSE: Duration = Duration::from_micros(300);
/// At most this many masters are faulty at once (a minority of 5).
const MAX_AFFECTED: usize = 2;

// ---------------------------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------------------------

/// One grant and how its holder used it.
#[derive(Debug, Clone, Copy)]
struct Grant {
    client: usize,
    /// `Lock::acquired_at`: when the acquiring round started.
    acquired_at: Instant,
    /// When the holder saw the grant (the lock call had returned).
    start: Instant,
    /// When it let go: just before its release was sent, or `valid_until` for a lock left
    /// to expire (in the hazard test: the end of its last unit).
    end: Instant,
    /// `Lock::valid_until` at the end (after any extension).
    valid_until: Instant,
    units: u64,
    /// Units that finished after the validity had run out (a pause beyond the model).
    overruns: u64,
}

/// Collects grants and owns the non-atomic counters.
struct Checker {
    grants: Mutex<Vec<Vec<Grant>>>,
    counters: Vec<AtomicU64>,
}

/// What the checker found.
#[derive(Debug, Default)]
struct Verdict {
    /// Two grants of one resource whose use intervals overlap: (resource, earlier, later).
    overlaps: Vec<(usize, Grant, Grant)>,
    /// (resource, counter, units done): lost updates.
    counter_mismatches: Vec<(usize, u64, u64)>,
    /// Grants whose holder worked past `valid_until` or outside `[acquired_at, valid_until]`.
    overruns: Vec<(usize, Grant)>,
    grants: u64,
    units: u64,
}

impl Verdict {
    fn violations(&self) -> usize {
        self.overlaps.len() + self.counter_mismatches.len() + self.overruns.len()
    }
}

impl Checker {
    fn new(resources: usize) -> Checker {
        Checker {
            grants: Mutex::new(vec![Vec::new(); resources]),
            counters: (0..resources).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The first half of a unit: read the counter.
    fn begin_unit(&self, res: usize) -> u64 {
        self.counters[res].load(Ordering::SeqCst)
    }

    /// The second half: write back what was read, plus one. Not atomic with the read.
    fn end_unit(&self, res: usize, read: u64) {
        self.counters[res].store(read + 1, Ordering::SeqCst);
    }

    fn work_unit(&self, res: usize) {
        let v = self.begin_unit(res);
        thread::sleep(WORK_PAUSE);
        self.end_unit(res, v);
    }

    fn record(&self, res: usize, g: Grant) {
        self.grants.lock().unwrap()[res].push(g);
    }

    fn verdict(&self) -> Verdict {
        let grants = self.grants.lock().unwrap();
        let mut v = Verdict::default();
        for (res, list) in grants.iter().enumerate() {
            let mut sorted = list.clone();
            sorted.sort_by_key(|g| g.start);
            let mut latest: Option<Grant> = None;
            for g in &sorted {
                v.grants += 1;
                v.units += g.units;
                if g.overruns > 0
                    || g.end > g.valid_until
                    || g.start < g.acquired_at
                    || g.end < g.start
                {
                    v.overruns.push((res, *g));
                }
                if let Some(l) = latest {
                    if g.start <= l.end {
                        v.overlaps.push((res, l, *g));
                    }
                }
                match latest {
                    Some(l) if l.end >= g.end => {}
                    _ => latest = Some(*g),
                }
            }
            let units: u64 = list.iter().map(|g| g.units).sum();
            let counter = self.counters[res].load(Ordering::SeqCst);
            if counter != units {
                v.counter_mismatches.push((res, counter, units));
            }
        }
        v
    }
}

fn grant(client: usize, lock: &Lock, start: Instant, end: Instant, units: u64) -> Grant {
    Grant {
        client,
        acquired_at: lock.acquired_at(),
        start,
        end,
        valid_until: lock.valid_until(),
        units,
        overruns: 0,
    }
}

#[test]
fn checker_accepts_disjoint_and_flags_overlapping_use() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let g = |client, start, end| Grant {
        client,
        acquired_at: at(0),
        start: at(start),
        end: at(end),
        valid_until: at(1000),
        units: 1,
        overruns: 0,
    };
    let c = Checker::new(2);
    c.record(0, g(0, 10, 20));
    c.record(0, g(1, 21, 30));
    c.record(0, g(2, 40, 40)); // a grant with no work is a point
    c.record(1, g(0, 10, 20)); // another resource may overlap
    c.counters[0].store(3, Ordering::SeqCst);
    c.counters[1].store(1, Ordering::SeqCst);
    let v = c.verdict();
    assert_eq!(v.violations(), 0, "{v:?}");
    assert_eq!((v.grants, v.units), (4, 4));

    c.record(0, g(3, 25, 26)); // inside client 1's use
    c.record(0, g(4, 5, 50)); // spans everything
    let v = c.verdict();
    assert!(v.overlaps.len() >= 2, "{v:?}");
    assert_eq!(v.counter_mismatches, vec![(0, 3, 5)]);

    let c = Checker::new(1);
    let mut late = g(0, 10, 1001); // worked past valid_until
    late.overruns = 1;
    c.record(0, late);
    c.counters[0].store(1, Ordering::SeqCst);
    assert_eq!(c.verdict().overruns.len(), 1);
}

// ---------------------------------------------------------------------------------------
// The torture run
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RestartPolicy {
    /// Killed masters come back only after `MAX_TTL`; no client uses the guard.
    Delayed,
    /// Killed masters come back at once; every client uses `amnesia_guard(MAX_TTL)`.
    ImmediateWithGuard,
    /// Outside the model: killed masters come back at once and no client uses the guard.
    ImmediateUnguarded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    KillRestart,
    Freeze,
    Latency,
    Reset,
    Hold,
}

const ALL_FAULTS: [FaultKind; 5] = [
    FaultKind::KillRestart,
    FaultKind::Freeze,
    FaultKind::Latency,
    FaultKind::Reset,
    FaultKind::Hold,
];

#[derive(Default)]
struct Counters {
    grants: AtomicU64,
    units: AtomicU64,
    too_little_validity: AtomicU64,
    extends_ok: AtomicU64,
    extends_failed: AtomicU64,
    released: AtomicU64,
    release_failed: AtomicU64,
    left_to_expire: AtomicU64,
    taken: AtomicU64,
    no_quorum: AtomicU64,
    gave_up: AtomicU64,
    validity_used_up: AtomicU64,
    amnesiac_votes: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn env_seed() -> u64 {
    match std::env::var("TORTURE_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("TORTURE_SEED={s:?} is not a u64"))
        }
        Err(_) => {
            let mut seed = [0u8; 8];
            let f = std::fs::File::open("/dev/urandom").and_then(|mut f| {
                use std::io::Read;
                f.read_exact(&mut seed)
            });
            f.expect("seed from /dev/urandom");
            u64::from_le_bytes(seed)
        }
    }
}

fn env_secs() -> Duration {
    let secs: f64 = std::env::var("TORTURE_SECS")
        .ok()
        .map(|s| s.parse().unwrap_or_else(|_| panic!("TORTURE_SECS={s:?}")))
        .unwrap_or(8.0);
    Duration::from_secs_f64(secs)
}

fn resource(res: usize) -> String {
    format!("torture:{res}")
}

/// What a holder did with its lock.
struct Usage {
    units: u64,
    /// The end of its last unit.
    end: Instant,
    /// Units that ended after `valid_until`.
    overruns: u64,
}

impl Usage {
    /// Up to `n` units of work, each only while more than `WORK_MARGIN` of validity is left.
    fn work(&mut self, checker: &Checker, res: usize, lock: &Lock, n: u32) {
        for _ in 0..n {
            if lock.remaining() <= WORK_MARGIN {
                return;
            }
            checker.work_unit(res);
            self.units += 1;
            self.end = Instant::now();
            if self.end > lock.valid_until() {
                self.overruns += 1;
            }
        }
    }
}

fn client_loop(
    id: usize,
    urls: Vec<String>,
    policy: RestartPolicy,
    seed: u64,
    checker: &Checker,
    counters: &Counters,
    stop: &AtomicBool,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Redlock::builder()
        .masters(&urls)
        .node_timeout(NODE_TIMEOUT)
        .stall_timeout(STALL)
        .retry_count(1000)
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(4))
        .seed(rng.u64(..));
    if policy == RestartPolicy::ImmediateWithGuard {
        b = b.amnesia_guard(MAX_TTL);
    }
    let mut c = b.build().expect("client");
    while !stop.load(Ordering::SeqCst) {
        let res = rng.usize(0..RESOURCES);
        let ttl = Duration::from_millis(rng.u64(MIN_TTL_MS..=MAX_TTL.as_millis() as u64));
        // Half the time the engine's retry loop, half a single attempt (whose failure
        // report then tells what each master said).
        let single = rng.bool();
        let attempt = if single {
            c.try_lock(resource(res), ttl)
        } else {
            c.lock_with_deadline(
                resource(res),
                ttl,
                Instant::now() + Duration::from_millis(800),
            )
        };
        match attempt {
            Ok(mut lock) => {
                let start = Instant::now();
                bump(&counters.grants);
                if lock.remaining() <= WORK_MARGIN {
                    bump(&counters.too_little_validity);
                }
                let mut usage = Usage {
                    units: 0,
                    end: start,
                    overruns: 0,
                };
                usage.work(checker, res, &lock, rng.u32(1..=3));
                if rng.u8(0..4) == 0 && lock.remaining() > WORK_MARGIN {
                    let ttl =
                        Duration::from_millis(rng.u64(MIN_TTL_MS..=MAX_TTL.as_millis() as u64));
                    match c.extend(&mut lock, ttl) {
                        Ok(()) => {
                            bump(&counters.extends_ok);
                            usage.work(checker, res, &lock, rng.u32(1..=3));
                        }
                        Err(_) => bump(&counters.extends_failed),
                    }
                }
                counters.units.fetch_add(usage.units, Ordering::Relaxed);
                // The interval the holder may use the lock in: until it lets go, i.e. until
                // just before its release is sent, or, if it leaves the lock to expire,
                // until `valid_until` (the engine's validity is then checked tightly).
                let mut g = grant(id, &lock, start, usage.end, usage.units);
                g.overruns = usage.overruns;
                if rng.u8(0..20) == 0 {
                    g.end = lock.valid_until();
                    checker.record(res, g);
                    // Left to expire, as by a holder that died: a `Lock` merely dropped is
                    // released by the client's next call.
                    std::mem::forget(lock);
                    bump(&counters.left_to_expire);
                } else {
                    g.end = Instant::now();
                    checker.record(res, g);
                    match c.release(lock) {
                        Ok(()) => bump(&counters.released),
                        Err(_) => bump(&counters.release_failed),
                    }
                }
            }
            Err(e) => {
                if let Some(r) = e.report() {
                    let amnesiac = r
                        .outcomes()
                        .filter(|(_, o)| *o == Outcome::Failed(Fault::Amnesiac))
                        .count();
                    counters
                        .amnesiac_votes
                        .fetch_add(amnesiac as u64, Ordering::Relaxed);
                }
                match e {
                    Error::Taken(_) => bump(&counters.taken),
                    Error::NoQuorum(_) => bump(&counters.no_quorum),
                    Error::ValidityUsedUp(_) => bump(&counters.validity_used_up),
                    Error::DeadlineExceeded(_) => bump(&counters.gave_up),
                    other => panic!("client {id}: unexpected error: {other}"),
                }
                if single {
                    thread::sleep(Duration::from_micros(rng.u64(1000..=6000)));
                }
            }
        }
    }
}

/// What a faulty master needs to be healed, and when.
enum Heal {
    Restart,
    Thaw,
    PassThrough,
    /// Nothing to undo; the master only counts as affected until then (a restarted
    /// master in quarantine under the amnesia guard).
    Nothing,
}

struct Injector {
    policy: RestartPolicy,
    rng: fastrand::Rng,
    cycle: Vec<FaultKind>,
    active: Vec<Option<(Instant, Heal)>>,
    log: BTreeMap<FaultKind, u64>,
}

impl Injector {
    fn next_kind(&mut self) -> FaultKind {
        if self.cycle.is_empty() {
            self.cycle = ALL_FAULTS.to_vec();
            self.rng.shuffle(&mut self.cycle);
        }
        self.cycle.pop().expect("refilled")
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rng.u64(lo..=hi))
    }

    fn heal(&mut self, i: usize, ms: &mut LocalMasters, proxies: &[Proxy], now: Option<Instant>) {
        let due = match &self.active[i] {
            Some((at, _)) => match now {
                Some(n) => n >= *at,
                None => true,
            },
            None => false,
        };
        if !due {
            return;
        }
        let (_, heal) = self.active[i].take().expect("active");
        match heal {
            Heal::Restart => ms[i].restart().expect("restart master"),
            Heal::Thaw => ms[i].thaw().expect("thaw master"),
            Heal::PassThrough => proxies[i].set_mode(ProxyMode::PassThrough),
            Heal::Nothing => {}
        }
    }

    fn inject(&mut self, ms: &mut LocalMasters, proxies: &[Proxy]) {
        let free: Vec<usize> = (0..MASTERS).filter(|&i| self.active[i].is_none()).collect();
        if MASTERS - free.len() >= MAX_AFFECTED {
            return;
        }
        let i = free[self.rng.usize(0..free.len())];
        let kind = self.next_kind();
        let now = Instant::now();
        let heal = match kind {
            FaultKind::KillRestart => {
                ms[i].kill().expect("kill master");
                match self.policy {
                    // Every key it held has expired before it comes back empty.
                    RestartPolicy::Delayed => {
                        Some((now + MAX_TTL + Duration::from_millis(200), Heal::Restart))
                    }
                    // Outside the model: the hazard, for the demonstration only.
                    RestartPolicy::ImmediateUnguarded => {
                        ms[i].restart().expect("restart master");
                        Some((now + Duration::from_millis(300), Heal::Nothing))
                    }
                    RestartPolicy::ImmediateWithGuard => {
                        ms[i].restart().expect("restart master");
                        // Its votes do not count for MAX_TTL (uptime is whole seconds).
                        Some((now + MAX_TTL + Duration::from_millis(1500), Heal::Nothing))
                    }
                }
            }
            FaultKind::Freeze => {
                ms[i].freeze().expect("freeze master");
                Some((now + self.ms(50, 700), Heal::Thaw))
            }
            FaultKind::Latency => {
                let d = self.ms(1, 20);
                proxies[i].set_mode(ProxyMode::Latency(d));
                Some((now + self.ms(200, 800), Heal::PassThrough))
            }
            FaultKind::Hold => {
                proxies[i].set_mode(ProxyMode::Hold);
                Some((now + self.ms(50, 600), Heal::PassThrough))
            }
            FaultKind::Reset => {
                proxies[i].reset_all();
                None
            }
        };
        self.active[i] = heal;
        *self.log.entry(kind).or_default() += 1;
    }
}

/// Masters' uptime must reach `MAX_TTL` before a guarded client trusts them.
fn wait_for_uptime(ms: &LocalMasters, at_least_secs: u64) {
    for m in ms.iter() {
        support::wait_until(
            "masters up for max_ttl (amnesia guard)",
            Duration::from_secs(at_least_secs + 3),
            || {
                let info = m.cmd(&[b"INFO", b"server"]).expect("INFO");
                let text = match info {
                    AdminReply::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
                    other => panic!("INFO: {other:?}"),
                };
                text.lines()
                    .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .is_some_and(|up| up >= at_least_secs)
            },
        );
    }
}

/// One run; returns the checker's verdict and a summary line (also printed). Asserts only
/// what holds in every mode: the run did something, every fault kind was injected.
fn run_torture(policy: RestartPolicy) -> (Verdict, String) {
    let seed = env_seed();
    let secs = env_secs();
    let name = match policy {
        RestartPolicy::Delayed => "delayed-restart",
        RestartPolicy::ImmediateWithGuard => "amnesia-guard",
        RestartPolicy::ImmediateUnguarded => "unguarded",
    };
    println!("torture[{name}]: seed {seed:#x} (TORTURE_SEED={seed:#x} to replay), {secs:?}");
    let mut ms = masters(MASTERS);
    let proxies: Vec<Proxy> = ms
        .iter()
        .map(|m| Proxy::start(m.addr()).expect("proxy"))
        .collect();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    if policy == RestartPolicy::ImmediateWithGuard {
        wait_for_uptime(&ms, MAX_TTL.as_secs_f64().ceil() as u64);
    }
    let checker = Checker::new(RESOURCES);
    let counters = Counters::default();
    let stop_clients = AtomicBool::new(false);
    let stop_faults = AtomicBool::new(false);
    let mut seeds = fastrand::Rng::with_seed(seed);
    let injector = Injector {
        policy,
        rng: fastrand::Rng::with_seed(seeds.u64(..)),
        cycle: Vec::new(),
        active: (0..MASTERS).map(|_| None).collect(),
        log: BTreeMap::new(),
    };
    let started = Instant::now();
    let log = thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|id| {
                let (urls, seed) = (urls.clone(), seeds.u64(..));
                let (checker, counters, stop) = (&checker, &counters, &stop_clients);
                s.spawn(move || client_loop(id, urls, policy, seed, checker, counters, stop))
            })
            .collect();
        let faults = {
            let (ms, proxies, stop) = (&mut ms, &proxies, &stop_faults);
            let mut injector = injector;
            s.spawn(move || {
                let mut next = Instant::now() + Duration::from_millis(200);
                while !stop.load(Ordering::SeqCst) {
                    let now = Instant::now();
                    for i in 0..MASTERS {
                        injector.heal(i, ms, proxies, Some(now));
                    }
                    if now >= next {
                        injector.inject(ms, proxies);
                        next = now + injector.ms(50, 300);
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                // Clients are gone: heal everything now.
                for i in 0..MASTERS {
                    injector.heal(i, ms, proxies, None);
                }
                injector.log
            })
        };
        // The bounded run time (not a wait for some race to resolve).
        thread::sleep(secs);
        stop_clients.store(true, Ordering::SeqCst);
        let mut panics = Vec::new();
        for c in clients {
            if let Err(p) = c.join() {
                panics.push(p);
            }
        }
        stop_faults.store(true, Ordering::SeqCst);
        let log = faults.join().expect("fault injector");
        if let Some(p) = panics.pop() {
            std::panic::resume_unwind(p);
        }
        log
    });
    let elapsed = started.elapsed();
    let v = checker.verdict();
    let faults: u64 = log.values().sum();
    let summary = format!(
        "torture[{name}] seed {seed:#x}, {elapsed:.1?}: {} grants ({} with too little validity \
         to work), {} work units, {} extends ok / {} failed, {} released / {} release errors / {} \
         left to expire; refused: {} taken, {} no quorum, {} validity used up, {} deadline; {} \
         votes refused by the amnesia guard (seen in failure reports); faults {faults}: {log:?}; violations {} (overlaps {}, counter \
         mismatches {}, overruns {})",
        get(&counters.grants),
        get(&counters.too_little_validity),
        v.units,
        get(&counters.extends_ok),
        get(&counters.extends_failed),
        get(&counters.released),
        get(&counters.release_failed),
        get(&counters.left_to_expire),
        get(&counters.taken),
        get(&counters.no_quorum),
        get(&counters.validity_used_up),
        get(&counters.gave_up),
        get(&counters.amnesiac_votes),
        v.violations(),
        v.overlaps.len(),
        v.counter_mismatches.len(),
        v.overruns.len(),
    );
    println!("{summary}");
    assert_eq!(v.grants, get(&counters.grants), "{summary}");
    assert!(
        v.grants >= 20,
        "too few grants for a meaningful run: {summary}"
    );
    if secs >= Duration::from_secs(5) {
        for kind in ALL_FAULTS {
            assert!(
                log.get(&kind).copied().unwrap_or(0) > 0,
                "{kind:?} never injected: {summary}"
            );
        }
    }
    (v, summary)
}

/// Inside the model: zero violations.
fn torture(policy: RestartPolicy) {
    let (v, summary) = run_torture(policy);
    assert!(
        v.violations() == 0,
        "MUTUAL EXCLUSION VIOLATED: {summary}\noverlaps: {:#?}\ncounters: {:?}\noverruns: {:#?}",
        v.overlaps.iter().take(5).collect::<Vec<_>>(),
        v.counter_mismatches,
        v.overruns.iter().take(5).collect::<Vec<_>>()
    );
}

#[test]
fn torture_delayed_restart() {
    torture(RestartPolicy::Delayed);
}

#[test]
fn torture_amnesia_guard() {
    torture(RestartPolicy::ImmediateWithGuard);
}

// ---------------------------------------------------------------------------------------
// Item 3: the checker can fail
// ---------------------------------------------------------------------------------------

fn hazard_client(m: &LocalMasters, guard: Option<Duration>) -> Redlock {
    let mut b = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(150))
        .retry_count(0);
    if let Some(max_ttl) = guard {
        b = b.amnesia_guard(max_ttl);
    }
    b.build().expect("client")
}

/// The known hazard, step by step: A locks while master 2 is down (A's quorum is masters 0
/// and 1) and starts a unit of work; master 1 restarts at once without persistence and
/// master 2 comes back, so with no guard B gets a quorum (masters 1 and 2) while A still
/// holds a valid lock. B does its unit, then A finishes its own. Both checks must report
/// the double grant: overlapping use intervals, and a lost counter update (1 after 2 units).
/// The control run takes the same steps with the amnesia guard in B: B is refused, and the
/// checker finds nothing.
#[test]
fn checker_catches_the_double_grant_of_a_restart_without_persistence() {
    for guarded in [false, true] {
        let ttl = Duration::from_secs(5);
        let mut m = masters(3);
        let checker = Checker::new(1);
        m[2].kill().unwrap();
        let mut a = hazard_client(&m, None);
        let lock_a = a.try_lock(resource(0), ttl).expect("A: masters 0 and 1");
        let start_a = Instant::now();
        let read_a = checker.begin_unit(0);
        // Master 1 forgets A's key; master 2 returns (empty).
        m[1].kill().unwrap();
        m[1].restart().unwrap();
        m[2].restart().unwrap();
        let mut b = hazard_client(&m, guarded.then_some(ttl));
        let granted_b = b.try_lock(resource(0), ttl);
        if let Ok(lock_b) = &granted_b {
            let start_b = Instant::now();
            assert!(lock_a.is_valid() && lock_b.is_valid());
            checker.work_unit(0);
            let end_b = Instant::now();
            assert!(lock_b.is_valid(), "B used its lock only while valid");
            checker.record(0, grant(1, lock_b, start_b, end_b, 1));
        }
        checker.end_unit(0, read_a);
        let end_a = Instant::now();
        assert!(lock_a.is_valid(), "A used its lock only while valid");
        checker.record(0, grant(0, &lock_a, start_a, end_a, 1));
        let v = checker.verdict();
        if guarded {
            let e = granted_b.expect_err("the guard refuses B");
            let report = e.report().expect("report");
            assert!(
                report
                    .outcomes()
                    .any(|(_, o)| o == Outcome::Failed(Fault::Amnesiac)),
                "{e}"
            );
            assert_eq!(v.violations(), 0, "control run: {v:?}");
            assert_eq!(v.grants, 1);
        } else {
            assert!(granted_b.is_ok(), "the hazard: B is granted A's lock");
            assert_eq!(
                v.overlaps.len(),
                1,
                "the interval check must catch it: {v:?}"
            );
            let (_, first, second) = v.overlaps[0];
            assert_eq!((first.client, second.client), (0, 1), "{v:?}");
            assert_eq!(
                v.counter_mismatches,
                vec![(0, 1, 2)],
                "the counter check must catch it (one update lost): {v:?}"
            );
            assert!(v.overruns.is_empty(), "both worked within validity: {v:?}");
        }
    }
}

/// The torture checker has teeth in the randomized setting too: outside the model (killed
/// masters restarted at once, no guard) it finds double grants. Probabilistic (in 8 s runs
/// about 2 of 3 find some), hence opt-in; give it time:
/// `TORTURE_SECS=30 cargo test --release --features local --test torture -- --ignored --nocapture`.
#[test]
#[ignore = "demonstration outside the model, probabilistic: run with -- --ignored"]
fn torture_without_the_guard_finds_double_grants() {
    let (v, summary) = run_torture(RestartPolicy::ImmediateUnguarded);
    assert!(
        v.violations() > 0,
        "no double grant found this time (probabilistic; raise TORTURE_SECS): {summary}"
    );
}
