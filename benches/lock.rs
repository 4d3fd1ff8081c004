//! Lock+release cycle latency: redlock-mux next to the plain-socket floor, in one run.
//!
//! Starts its own local `redis-server` masters. First a percentile pass (criterion reports
//! means and medians, not tails) that interleaves every variant in blocks, so machine noise
//! hits them alike, and prints p50/p90/p99/p99.9, ratios to the floor, and client CPU per
//! cycle. Then the criterion groups.
//!
//! Client CPU: every variant runs on a worker thread of its own for the whole pass, and
//! the bench hands the workers their blocks in turn. Tick-based CPU accounting
//! (`CONFIG_TICK_CPU_ACCOUNTING`, the usual default) splits a thread's exact runtime into
//! user and system time by the thread's *cumulative* tick ratio. A
//! `getrusage(RUSAGE_THREAD)` delta around one block on a thread shared by all variants
//! would pull every variant's user figure toward the thread's average. So each worker sums
//! its exact runtime per block (`CLOCK_THREAD_CPUTIME_ID`), and its own lifetime tick ratio
//! splits that sum. `common/cpu.rs` has the details and the limits. The tables say how
//! many cycles the figures average over. The user/system split rests on about one tick per
//! 4 ms of CPU (HZ=250), so it needs long runs: `LOCK_BENCH_CYCLES=20000` or more.
//!
//! The floor: blocking std sockets, one per master; write `SET k v NX PX` to all, read all
//! replies; write `EVALSHA release` to all, read all. The busy floor does the same on
//! non-blocking sockets, spinning on `read`.
//!
//! The shared client (`SharedRedlock`) runs next to the single-owner `Redlock`: one caller
//! thread locking and releasing through it (`try_lock(..).wait()`, `release().wait()`), in
//! normal and busy-poll mode, in the percentile pass; 64 tokio tasks (on a current-thread
//! runtime driven by the measuring thread, as the peers bench runs rslock) and 64 threads
//! sharing one handle in the throughput pass, next to `try_lock_batch` of 64. Their CPU
//! includes the client's loop thread (and the caller threads): see `common/shared.rs`.
//!
//! `cargo bench --features local --bench lock` (all); `LOCK_BENCH_CYCLES=20000 cargo bench --features local --bench lock --
//! --skip-criterion` style knobs: `LOCK_BENCH_CYCLES` (percentile pass cycles per variant,
//! default 4000), `LOCK_BENCH_SKIP_CRITERION=1`, `LOCK_BENCH_PIN=1`.
//!
//! `LOCK_BENCH_PIN=1` models a client that has a core to itself (what busy-poll is for):
//! the main thread and every variant's measuring thread are pinned to the first CPU the
//! bench may use, and the masters are started on the others (Linux, at least 2 CPUs).
//! Unpinned (the default), the scheduler puts client and masters anywhere, so on a small
//! machine a spinning client competes with the masters it waits for. The output says which
//! it was.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/floor.rs"]
mod floor;
#[path = "common/shared.rs"]
mod shared;
use cpu::{Cpu, Lifetime, Sample};
use floor::Floor;
use redlock_mux::local::{cpu_list, pin_current_thread, split_cpus, LocalMasters};
use redlock_mux::{Redlock, SharedRedlock};

const TTL: Duration = Duration::from_secs(10);

/// Where client and masters run with `LOCK_BENCH_PIN=1`.
struct Pin {
    client: usize,
    masters: Vec<usize>,
}

/// Set once in `main`, before any master starts: `None` = unpinned.
static PIN: OnceLock<Option<Pin>> = OnceLock::new();

fn pin() -> Option<&'static Pin> {
    PIN.get().and_then(Option::as_ref)
}

/// `LOCK_BENCH_PIN` set to anything but empty or `0`: pin this thread, pick the masters'
/// CPUs. Panics with the reason when that is impossible (one CPU, not Linux).
fn pin_from_env() -> Option<Pin> {
    let on = std::env::var("LOCK_BENCH_PIN").is_ok_and(|v| !v.is_empty() && v != "0");
    if !on {
        return None;
    }
    let (client, masters) = split_cpus(1).unwrap_or_else(|e| panic!("LOCK_BENCH_PIN: {e}"));
    pin_current_thread(client[0]).unwrap_or_else(|e| panic!("LOCK_BENCH_PIN: {e}"));
    Some(Pin {
        client: client[0],
        masters,
    })
}

/// The CPU every measuring thread is pinned to, when pinned.
fn client_cpu() -> Option<usize> {
    pin().map(|p| p.client)
}

fn placement() -> String {
    match pin() {
        Some(p) => format!(
            "pinned: client threads on CPU {}, masters on CPU {}",
            p.client,
            cpu_list(&p.masters)
        ),
        None => "unpinned: client and masters on any CPU (LOCK_BENCH_PIN=1 to pin)".into(),
    }
}

/// `n` local masters, on the masters' CPUs when pinned.
fn start_masters(n: usize) -> LocalMasters {
    match pin() {
        Some(p) => LocalMasters::start_on_cpus(n, &p.masters),
        None => LocalMasters::start(n),
    }
    .expect("local masters (is redis-server installed?)")
}

fn ours(m: &LocalMasters, busy: bool) -> Redlock {
    Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .busy_poll(busy)
        .build()
        .unwrap()
}

/// The shared client, as `ours` builds the single owner.
fn ours_shared(m: &LocalMasters, busy: bool) -> SharedRedlock {
    Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .busy_poll(busy)
        .build_shared()
        .unwrap()
}

/// A fencing client. The bench masters do not persist (a disk's fsync would time the disk,
/// not the client), so the durability check is waived: the rounds are those of a real
/// fenced acquire.
fn ours_fenced(m: &LocalMasters) -> Redlock {
    Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .fencing(true)
        .fencing_assume_durable(true)
        .build()
        .unwrap()
}

/// Round trips (writes per master) per lock+release cycle, from the client's counters.
fn round_trips_per_cycle(c: &mut Redlock, key: &str) -> f64 {
    let writes = |c: &Redlock| c.stats().iter().map(|s| s.writes()).sum::<u64>();
    our_cycle(c, key); // connected
    let before = writes(c);
    let n = 100;
    for _ in 0..n {
        our_cycle(c, key);
    }
    (writes(c) - before) as f64 / n as f64 / c.masters().count() as f64
}

/// A single-owner cycle: its lock and release times, `None` if it failed (a loaded machine
/// can stall a round past its timeout): counted and said (see [`failed`]), not timed.
fn our_cycle(c: &mut Redlock, key: &str) -> Option<(Duration, Duration)> {
    let t0 = Instant::now();
    let lock = match c.try_lock(key, TTL) {
        Ok(lock) => lock,
        Err(e) => return failed("lock", &e),
    };
    let t1 = Instant::now();
    if let Err(e) = c.release(lock) {
        return failed("release", &e);
    }
    Some((t1 - t0, t1.elapsed()))
}

/// Single-owner operations that failed, over the whole run (printed at the end).
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// Count a single-owner operation that failed, and say the first few.
fn failed<T>(what: &str, e: &redlock_mux::Error) -> Option<T> {
    let n = FAILURES.fetch_add(1, Ordering::Relaxed);
    if n < 10 {
        eprintln!("single-owner {what} failed (not timed): {e}");
    }
    None
}

struct Stats {
    name: String,
    cycle: Vec<u64>,
    cpu: Cpu,
}

/// Runs `k` cycles of a variant, pushing each one's time (ns) to the vector when given.
/// Returns `Some(cpu)` for a variant that measures its own CPU (helper threads included),
/// `None` for one whose worker's CPU is all of it.
type Runner = Box<dyn FnMut(usize, Option<&mut Vec<u64>>) -> Option<Sample> + Send>;

/// A variant of the percentile pass: its runner, and the lifetime user/system time of its
/// helper threads at the end of the pass (none for the single-threaded ones).
struct Variant {
    name: String,
    run: Runner,
    helpers: Option<Box<dyn Fn() -> Lifetime>>,
}

impl Variant {
    /// A variant run one cycle at a time by `cycle` on the worker alone.
    /// (`None`: the cycle failed, it is not timed.)
    fn per_cycle(
        name: &str,
        mut cycle: impl FnMut() -> Option<(Duration, Duration)> + Send + 'static,
    ) -> Self {
        Variant {
            name: name.into(),
            run: Box::new(move |k, mut out| {
                for _ in 0..k {
                    let Some((a, r)) = cycle() else { continue };
                    if let Some(out) = out.as_deref_mut() {
                        out.push((a + r).as_nanos() as u64);
                    }
                }
                None
            }),
            helpers: None,
        }
    }
}

/// One caller through a shared client that lives for the whole pass.
fn shared_variant(name: &str, m: &LocalMasters, key: &'static str) -> Variant {
    let c = shared::WithLoop::start(|| ours_shared(m, false), key, TTL, 1);
    let tid = c.loop_tid;
    Variant {
        name: name.into(),
        run: Box::new(move |k, mut out| {
            let t = shared::Measured::start();
            for _ in 0..k {
                let (a, r) = shared::cycle(&c.client, key, TTL).unwrap();
                if let Some(out) = out.as_deref_mut() {
                    out.push((a + r).as_nanos() as u64);
                }
            }
            Some(t.stop())
        }),
        helpers: Some(Box::new(move || cpu::lifetime_of(&[tid]))),
    }
}

/// One caller through a busy-poll shared client built per block (see the top of the file).
fn shared_busy_variant(name: &str, m: &LocalMasters, key: &'static str) -> Variant {
    let urls = m.urls();
    let warm = if smoke() { 2 } else { 20 };
    let mut pb = shared::PerBlock::new(
        move || {
            Redlock::builder()
                .masters(&urls)
                .retry_count(0)
                .busy_poll(true)
                .build_shared()
                .unwrap()
        },
        key,
        TTL,
        warm,
    );
    let life = pb.loops_life();
    Variant {
        name: name.into(),
        run: Box::new(move |k, mut out| {
            Some(pb.block(k, |r| match r {
                Ok((a, r)) => {
                    if let Some(out) = out.as_deref_mut() {
                        out.push((a + r).as_nanos() as u64);
                    }
                }
                // A cycle that failed (a loaded machine can stall a round past its
                // timeout) is said, not timed.
                Err(e) => eprintln!("shared busy-poll cycle failed: {e}"),
            }))
        }),
        helpers: Some(Box::new(move || *life.lock().unwrap())),
    }
}

fn pct(v: &[u64], p: f64) -> u64 {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn percentile_pass(n_masters: usize) {
    let m = start_masters(n_masters);
    let cycles: usize = if smoke() {
        20
    } else {
        std::env::var("LOCK_BENCH_CYCLES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4000)
    };
    let mut variants: Vec<Variant> = Vec::new();
    let mut floor = Floor::new(&m.addrs(), false);
    variants.push(Variant::per_cycle("floor (std sockets)", move || {
        Some(floor.cycle())
    }));
    let mut fb = Floor::new(&m.addrs(), true);
    variants.push(Variant::per_cycle("floor busy-poll", move || {
        Some(fb.cycle())
    }));
    let mut c = ours(&m, false);
    variants.push(Variant::per_cycle("redlock-mux", move || {
        our_cycle(&mut c, "mux")
    }));
    let mut cb = ours(&m, true);
    variants.push(Variant::per_cycle("redlock-mux busy-poll", move || {
        our_cycle(&mut cb, "muxbusy")
    }));
    let mut cf = ours_fenced(&m);
    variants.push(Variant::per_cycle("redlock-mux fenced", move || {
        our_cycle(&mut cf, "muxfenced")
    }));
    variants.push(shared_variant("shared, 1 caller", &m, "shared"));
    variants.push(shared_busy_variant(
        "shared busy-poll, 1 caller",
        &m,
        "sharedbusy",
    ));
    let mut stats: Vec<Stats> = variants
        .iter()
        .map(|v| Stats {
            name: v.name.clone(),
            cycle: Vec::with_capacity(cycles),
            cpu: Cpu::default(),
        })
        .collect();
    // Every variant on a measuring thread of its own (see the top of the file): warm up,
    // then interleave blocks of 200 cycles per variant. The blocks can be short because a
    // worker's user/system split comes from its whole life, not from one block.
    let warm = if smoke() { 5 } else { 500 };
    let block = 200;
    let mut cpus: Vec<Cpu> = std::thread::scope(|s| {
        let workers: Vec<_> = variants
            .iter_mut()
            .zip(stats.iter_mut())
            .map(|(v, st)| {
                let (run, out) = (&mut v.run, &mut st.cycle);
                // Job: (cycles, keep their times).
                cpu::spawn(s, client_cpu(), move |(k, keep): (usize, bool)| {
                    run(k, keep.then_some(&mut *out))
                })
            })
            .collect();
        for w in &workers {
            w.run((warm, false));
        }
        let mut cpus = vec![Cpu::default(); workers.len()];
        let mut done = 0;
        while done < cycles {
            let k = block.min(cycles - done);
            for (w, c) in workers.iter().zip(cpus.iter_mut()) {
                match w.run((k, true)) {
                    (Some(own), _) => c.add_with_helpers(own),
                    (None, worker) => c.add(worker),
                }
            }
            done += k;
        }
        for (w, c) in workers.into_iter().zip(cpus.iter_mut()) {
            c.split_by(w.finish());
        }
        cpus
    });
    for (v, c) in variants.iter().zip(cpus.iter_mut()) {
        if let Some(helpers) = &v.helpers {
            c.split_helpers_by(helpers());
        }
    }
    for (s, c) in stats.iter_mut().zip(cpus) {
        s.cycle.sort_unstable();
        s.cpu = c;
    }
    let f50 = pct(&stats[0].cycle, 0.5) as f64;
    let f99 = pct(&stats[0].cycle, 0.99) as f64;
    let fcpu = stats[0].cpu.total().as_nanos() as f64 / cycles as f64;
    println!(
        "\nlock+release cycle, {n_masters} local masters, {cycles} cycles per variant (interleaved), {}",
        placement()
    );
    println!(
        "{:<28} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>7} {:>8}",
        "variant",
        "p50 µs",
        "p90",
        "p99",
        "p99.9",
        "max",
        "p50/fl",
        "p99/fl",
        "user µs",
        "sys µs",
        "cpu/fl",
        "cpu over"
    );
    for s in &stats {
        let us = |ns: u64| ns as f64 / 1000.0;
        let cpu = s.cpu.total().as_nanos() as f64 / cycles as f64;
        println!(
            "{:<28} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>8.2} {:>8.2} {:>7.2} {:>8}",
            s.name,
            us(pct(&s.cycle, 0.5)),
            us(pct(&s.cycle, 0.9)),
            us(pct(&s.cycle, 0.99)),
            us(pct(&s.cycle, 0.999)),
            us(*s.cycle.last().unwrap()),
            pct(&s.cycle, 0.5) as f64 / f50,
            pct(&s.cycle, 0.99) as f64 / f99,
            s.cpu.user().as_nanos() as f64 / 1000.0 / cycles as f64,
            s.cpu.sys().as_nanos() as f64 / 1000.0 / cycles as f64,
            cpu / fcpu,
            cycles,
        );
    }
    print_cpu_notes(stats.iter().map(|s| (s.name.as_str(), &s.cpu)));
    println!(
        "(shared rows: CPU includes the client's loop thread, which took {} of their CPU; the \
         busy-poll one is built per block: its loop spins while it exists)",
        stats
            .iter()
            .filter(|s| s.name.starts_with("shared"))
            .map(|s| format!(
                "{:.0}%",
                100.0 * s.cpu.helpers().as_secs_f64() / s.cpu.total().as_secs_f64().max(1e-12)
            ))
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let by_name = |n: &str| stats.iter().find(|s| s.name == n).unwrap();
    for (shared, single, target) in [
        ("shared, 1 caller", "redlock-mux", 1.20),
        ("shared busy-poll, 1 caller", "redlock-mux busy-poll", 1.05),
    ] {
        let (a, b) = (by_name(shared), by_name(single));
        let r50 = pct(&a.cycle, 0.5) as f64 / pct(&b.cycle, 0.5) as f64;
        let r99 = pct(&a.cycle, 0.99) as f64 / pct(&b.cycle, 0.99) as f64;
        // A smoke run (`cargo test --all-targets`) has too few cycles to judge a ratio.
        let verdict = match (smoke(), r50 <= target) {
            (true, _) => "not judged in a smoke run",
            (false, true) => "met",
            (false, false) => "MISSED",
        };
        println!(
            "{shared} / {single}: p50 {r50:.2}x (target <= {target:.2}x: {verdict}), p99 {r99:.2}x"
        );
    }
    let plain = round_trips_per_cycle(&mut ours(&m, false), "rt");
    let fenced = round_trips_per_cycle(&mut ours_fenced(&m), "rtfenced");
    println!(
        "round trips per lock+release cycle (writes per master): plain {plain:.2}, fenced \
         {fenced:.2} (acquire, draw, write-back, release)"
    );
}

/// The legend of the CPU columns, and the variants whose user/system split rests on too
/// few ticks.
fn print_cpu_notes<'a>(cpus: impl Iterator<Item = (&'a str, &'a Cpu)>) {
    println!(
        "(CPU: each variant on a thread of its own; user/sys split by that thread's tick ratio, \
         ~1 tick per 4 ms at HZ=250; the \"over\" columns: cycles the CPU figures average over)"
    );
    if let Some(note) = cpu::few_ticks_note(cpus) {
        println!("{note}");
    }
}

/// A throughput worker's job: `None` = `warm` untimed batches, `Some(slice)` = batches until
/// `slice` has passed. Result: (batches, time taken).
fn timed(
    warm: usize,
    mut batch: impl FnMut() + Send,
) -> impl FnMut(Option<Duration>) -> (u64, Duration) + Send {
    move |job| match job {
        None => {
            for _ in 0..warm {
                batch();
            }
            (0, Duration::ZERO)
        }
        Some(slice) => {
            let t = Instant::now();
            let mut n = 0;
            while t.elapsed() < slice {
                batch();
                n += 1;
            }
            (n, t.elapsed())
        }
    }
}

/// Many locks in flight from one thread: `k` independent lock+release cycles per batch,
/// ours (`try_lock_batch` + `release_batch`) next to the pipelined floor at the same `k`.
/// At `k` = [`SHARED_K`], also the shared client with as many tokio tasks, and threads,
/// each looping lock+release through one handle (interleaved with the other two).
fn throughput_pass(n_masters: usize) {
    let m = start_masters(n_masters);
    let secs: f64 = if smoke() {
        0.05
    } else {
        std::env::var("LOCK_BENCH_TPUT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2.0)
    };
    println!(
        "\nmany in flight from one thread, {n_masters} local masters, ~{secs} s per variant (interleaved), {}",
        placement()
    );
    println!(
        "{:<6} {:>14} {:>14} {:>7} {:>12} {:>12} {:>9} {:>9} {:>10} {:>10}",
        "K",
        "floor cyc/s",
        "ours cyc/s",
        "ratio",
        "floor cpu µs",
        "ours cpu µs",
        "ours usr",
        "cpu/fl",
        "floor over",
        "ours over"
    );
    let warm = if smoke() { 2 } else { 200 };
    let slices = 10;
    let slice = Duration::from_secs_f64(secs / slices as f64);
    let mut cpus = Vec::new();
    let mut shared_rows = Vec::new();
    let mut left = 0;
    for k in [1usize, 8, SHARED_K] {
        let mut floor = Floor::new(&m.addrs(), false);
        let mut c = ours(&m, false);
        let names: Vec<String> = (0..k).map(|j| format!("tput:{j}")).collect();
        let mut out = Vec::with_capacity(k);
        let mut rel = Vec::with_capacity(k);
        let mut locks = Vec::with_capacity(k);
        let run_ours = move || {
            if let Err(e) = c.try_lock_batch(&names, TTL, &mut out) {
                failed::<()>("try_lock_batch", &e);
            }
            for r in out.drain(..) {
                match r {
                    Ok(lock) => locks.push(lock),
                    Err(e) => {
                        failed::<()>("lock of a batch", &e);
                    }
                }
            }
            if let Err(e) = c.release_batch(locks.drain(..), &mut rel) {
                failed::<()>("release_batch", &e);
            }
            for r in rel.drain(..) {
                if let Err(e) = r {
                    failed::<()>("release of a batch", &e);
                }
            }
        };
        let mut tvs = vec![
            TputVariant::batched("floor", k, timed(warm, move || floor.cycle_k(k))),
            TputVariant::batched("ours", k, timed(warm, run_ours)),
        ];
        if k == SHARED_K {
            tvs.extend(shared_tput_variants(&m, k));
        }
        // Every variant on a measuring thread of its own (see the top of the file), handed
        // interleaved slices (see `timed`).
        let results: Vec<(u64, u64, Duration, Cpu)> = std::thread::scope(|s| {
            let workers: Vec<_> = tvs
                .iter_mut()
                .map(|v| cpu::spawn(s, client_cpu(), &mut v.run))
                .collect();
            // Warm-up: batches, or one untimed slice for the shared variants.
            for w in &workers {
                w.run(None);
            }
            let mut results = vec![(0u64, 0u64, Duration::ZERO, Cpu::default()); workers.len()];
            for _ in 0..slices {
                for (w, r) in workers.iter().zip(results.iter_mut()) {
                    let (t, worker) = w.run(Some(slice));
                    r.0 += t.cycles;
                    r.1 += t.failed;
                    r.2 += t.time;
                    match t.cpu {
                        Some(own) => r.3.add_with_helpers(own),
                        None => r.3.add(worker),
                    }
                }
            }
            for (w, r) in workers.into_iter().zip(results.iter_mut()) {
                r.3.split_by(w.finish());
            }
            results
        });
        let mut rows = Vec::new();
        for (v, (cycles, failed, time, mut cpu)) in tvs.iter().zip(results) {
            if let Some(helpers) = &v.helpers {
                cpu.split_helpers_by(helpers());
            }
            rows.push((v.name, cycles, failed, time, cpu));
        }
        drop(tvs);
        if k == SHARED_K {
            left = keys_left(&m, &shared_keys(k));
        }
        let rate = |r: &(&str, u64, u64, Duration, Cpu)| r.1 as f64 / r.3.as_secs_f64();
        let per = |cpu: Duration, cycles: u64| cpu.as_nanos() as f64 / 1000.0 / cycles as f64;
        let (f, o) = (&rows[0], &rows[1]);
        println!(
            "{:<6} {:>14.0} {:>14.0} {:>7.2} {:>12.2} {:>12.2} {:>9.2} {:>9.2} {:>10} {:>10}",
            k,
            rate(f),
            rate(o),
            rate(o) / rate(f),
            per(f.4.total(), f.1),
            per(o.4.total(), o.1),
            per(o.4.user(), o.1),
            per(o.4.total(), o.1) / per(f.4.total(), f.1),
            f.1,
            o.1,
        );
        for r in &rows[2..] {
            shared_rows.push(format!(
                "{:<28} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.0}% {:>10} {:>7}",
                r.0,
                rate(r),
                rate(r) / rate(o),
                rate(r) / rate(f),
                per(r.4.total(), r.1),
                per(r.4.user(), r.1),
                per(r.4.total(), r.1) / per(o.4.total(), o.1),
                100.0 * r.4.helpers().as_secs_f64() / r.4.total().as_secs_f64().max(1e-12),
                r.1,
                r.2,
            ));
        }
        for (name, _, _, _, cpu) in rows {
            cpus.push((format!("{name} K={k}"), cpu));
        }
    }
    println!(
        "\nshared client, {SHARED_K} callers through one handle (same slices as K={SHARED_K} above; x batch = \
         x the single-owner try_lock_batch of {SHARED_K}):"
    );
    println!(
        "{:<28} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "variant",
        "cyc/s",
        "x batch",
        "x floor",
        "cpu µs",
        "usr µs",
        "cpu/batch",
        "helpers",
        "over",
        "failed"
    );
    for r in &shared_rows {
        println!("{r}");
    }
    println!("keys of the shared callers left on the masters after the run: {left}");
    println!(
        "(targets: tokio tasks >= 0.90x batch, threads >= 0.60x batch; \"helpers\": the share of \
         CPU on the loop thread and the caller threads; tasks run on a current-thread runtime \
         driven by the measuring thread)"
    );
    print_cpu_notes(cpus.iter().map(|(n, c)| (n.as_str(), c)));
}

/// Callers of the shared variants of the throughput pass.
const SHARED_K: usize = 64;

/// The resources of the shared variants' `k` tasks and `k` threads.
fn shared_keys(k: usize) -> Vec<String> {
    let tasks = (0..k).map(|j| format!("tput:shared:task:{j}"));
    tasks
        .chain((0..k).map(|j| format!("tput:shared:thread:{j}")))
        .collect()
}

/// How many of `keys` some master still holds (each was released: should be 0).
fn keys_left(m: &LocalMasters, keys: &[String]) -> usize {
    keys.iter()
        .filter(|key| {
            (0..m.len()).any(|i| {
                let r = m[i].cmd(&[b"EXISTS", key.as_bytes()]);
                !matches!(r, Ok(redlock_mux::local::AdminReply::Int(0)))
            })
        })
        .count()
}

/// What a throughput slice did.
struct Tput {
    cycles: u64,
    failed: u64,
    time: Duration,
    /// The slice's CPU when the variant measures it itself (helper threads included).
    cpu: Option<Sample>,
}

/// A throughput variant's job: `None` = warm up, `Some(slice)` = run for `slice`.
type TputJob = Box<dyn FnMut(Option<Duration>) -> Tput + Send>;

struct TputVariant {
    name: &'static str,
    run: TputJob,
    /// The lifetime user/system time of the variant's helper threads (shared variants).
    helpers: Option<Box<dyn Fn() -> Lifetime>>,
}

impl TputVariant {
    /// A variant of `k` cycles per batch on the worker alone (see [`timed`]).
    fn batched(
        name: &'static str,
        k: usize,
        mut job: impl FnMut(Option<Duration>) -> (u64, Duration) + Send + 'static,
    ) -> Self {
        TputVariant {
            name,
            run: Box::new(move |slice| {
                let (batches, time) = job(slice);
                Tput {
                    cycles: batches * k as u64,
                    failed: 0,
                    time,
                    cpu: None,
                }
            }),
            helpers: None,
        }
    }
}

/// The shared client's throughput variants: `k` tokio tasks, and `k` threads, each
/// looping lock+release on a resource of its own through one handle.
fn shared_tput_variants(m: &LocalMasters, k: usize) -> Vec<TputVariant> {
    // Each slice: run until the deadline; the slice's time runs until the last caller's
    // last cycle ended. Warm-up (`None`): one slice of `warm`, untimed.
    fn sliced(
        mut run: impl FnMut(Instant) -> (u64, u64) + Send + 'static,
        warm: Duration,
    ) -> TputJob {
        Box::new(move |slice| {
            let t = Instant::now();
            let measured = shared::Measured::start();
            let (cycles, failed) = run(t + slice.unwrap_or(warm));
            let cpu = measured.stop();
            Tput {
                cycles,
                failed,
                time: t.elapsed(),
                cpu: slice.map(|_| cpu),
            }
        })
    }
    let warm = Duration::from_millis(if smoke() { 10 } else { 200 });

    let tasks = shared::WithLoop::start(|| ours_shared(m, false), "tput:shared:warm", TTL, 1);
    let tasks_tid = tasks.loop_tid;
    let task_keys: Vec<String> = shared_keys(k)[..k].to_vec();
    // A current-thread runtime driven by the measuring thread: the tasks' side of the work
    // is on that thread, as rslock's is in the peers bench.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tasks_run =
        move |deadline| shared::tasks_slice(&rt, &tasks.client, &task_keys, TTL, deadline);

    let threads = shared::WithLoop::start(|| ours_shared(m, false), "tput:shared:warm2", TTL, 1);
    let thread_keys: Vec<String> = shared_keys(k)[k..].to_vec();
    let pool = shared::CallerPool::new(&threads.client, &thread_keys, TTL, shared::Release::Wait);
    let mut threads_tids = pool.tids.clone();
    threads_tids.push(threads.loop_tid);
    let threads_run = move |deadline| {
        let _keep = &threads;
        pool.slice(deadline)
    };

    vec![
        TputVariant {
            name: "shared, 64 tokio tasks",
            run: sliced(tasks_run, warm),
            helpers: Some(Box::new(move || cpu::lifetime_of(&[tasks_tid]))),
        },
        TputVariant {
            name: "shared, 64 threads",
            run: sliced(threads_run, warm),
            helpers: Some(Box::new(move || cpu::lifetime_of(&threads_tids))),
        },
    ]
}

fn criterion_cycles(c: &mut Criterion) {
    for n in [1usize, 5] {
        let m = start_masters(n);
        // A group of its own when pinned, so criterion does not compare it with unpinned runs.
        let pinned = if pin().is_some() { "-pinned" } else { "" };
        let mut g = c.benchmark_group(format!("cycle/{n}-masters{pinned}"));
        g.measurement_time(Duration::from_secs(3));
        g.warm_up_time(Duration::from_millis(500));
        let mut floor = Floor::new(&m.addrs(), false);
        g.bench_function("floor", |b| b.iter(|| floor.cycle()));
        let mut cl = ours(&m, false);
        g.bench_function("redlock-mux", |b| b.iter(|| our_cycle(&mut cl, "crit")));
        let mut cb = ours(&m, true);
        g.bench_function("redlock-mux busy-poll", |b| {
            b.iter(|| our_cycle(&mut cb, "critbusy"))
        });
        g.finish();
    }
}

criterion_group!(benches, criterion_cycles);

/// `cargo test --all-targets` runs this binary without `--bench`: then only a smoke run
/// that checks every variant works.
fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn main() {
    // Pin before any master starts or client connects.
    let _ = PIN.set(pin_from_env());
    println!("placement: {}", placement());
    for n in [5usize, 1] {
        percentile_pass(n);
    }
    throughput_pass(5);
    if std::env::var_os("LOCK_BENCH_SKIP_CRITERION").is_none() && !smoke() {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    println!(
        "single-owner operations that failed (not timed): {}",
        FAILURES.load(Ordering::Relaxed)
    );
}
