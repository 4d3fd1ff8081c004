//! Peer comparison: redlock-mux next to the plain-socket floor, `redlock` 2.x and `rslock`
//! 0.10, in one run, against the same local `redis-server` masters.
//!
//! Two passes, each interleaving its variants in blocks so machine noise hits them alike:
//!
//! 1. Single-cycle latency (lock + release of one resource, TTL 10 s) on 5 masters, then
//!    on 1 master: p50/p90/p99/p99.9/max, ratios to the floor's p50 and p99, and user and
//!    system CPU per cycle.
//! 2. Throughput with 64 locks in flight from one thread on 5 masters: the pipelined floor
//!    at K = 64, redlock-mux `try_lock_batch` + `release_batch` of 64, rslock with 64
//!    concurrent tasks on the current-thread runtime, and `redlock` 2.x sequentially (it
//!    has no way to keep more than one lock operation in flight). The redlock-mux shared
//!    client (`SharedRedlock`) twice: 64 tasks on a current-thread runtime of their own
//!    (set up as rslock's), and 64 threads, each looping lock+release through one handle;
//!    the 64 threads twice: blocking on the release's outcome (`release().wait()`), and
//!    dropping each guard (the release queued to the loop, the thread going on).
//!
//! The shared client also has a one-caller row in the latency pass (`try_lock(..).wait()`,
//! `release().wait()` from the measuring thread). Its CPU includes the client's loop
//! thread (and the caller threads in the throughput pass): `benches/common/shared.rs`.
//!
//! Client CPU: every variant runs on a worker thread of its own for the whole pass, and the
//! bench hands the workers their blocks and slices in turn. Tick-based CPU accounting
//! (`CONFIG_TICK_CPU_ACCOUNTING`, the usual default) splits a thread's exact runtime into
//! user and system time by the thread's *cumulative* tick ratio. A
//! `getrusage(RUSAGE_THREAD)` delta around one block on a thread shared by all variants
//! would pull every variant's user figure toward the thread's average. So each worker sums
//! its exact runtime per block (`CLOCK_THREAD_CPUTIME_ID`), and its own lifetime tick ratio
//! splits that sum. `benches/common/cpu.rs` has the details and the limits. The tables say
//! how many cycles the CPU figures average over. The split rests on about one tick per 4 ms
//! of CPU (HZ=250), so it needs long runs.
//!
//! Knobs: `PEERS_CYCLES` (latency cycles per variant and master count, default 8000),
//! `PEERS_SECS` (throughput seconds per variant, default 3), `PEERS_BLOCK` (latency cycles
//! per interleaved block, default 200), `--pin` or `PEERS_PIN=1` (the main thread and every
//! measuring thread on the first CPU the bench may use, the masters on the others; Linux,
//! 2 CPUs or more; default unpinned).
//!
//! `cargo run --release --manifest-path benches/peers/Cargo.toml [-- --pin]`

use std::str::FromStr;
use std::time::{Duration, Instant};

#[path = "../../common/cpu.rs"]
mod cpu;
mod delay;
#[path = "../../common/floor.rs"]
mod floor;
mod hot;
#[path = "../../common/shared.rs"]
mod shared;

use cpu::{Cpu, Lifetime, Sample};
use floor::Floor;
use redlock_mux::local::{cpu_list, pin_current_thread, split_cpus, AdminReply, LocalMasters};
use redlock_mux::{Redlock, SharedRedlock};
use redlock_rs::RedLock;
use rslock::LockManager;
use tokio::runtime::Runtime;

/// Lock TTL for every variant (the floor's `floor::TTL` is the same 10 s).
pub(crate) const TTL: Duration = Duration::from_secs(10);
/// Locks in flight in the throughput pass.
const K: usize = 64;
/// Interleaved slices per variant in the throughput pass.
const SLICES: u32 = 10;

pub(crate) fn env<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn us_per(d: Duration, cycles: u64) -> f64 {
    d.as_nanos() as f64 / 1000.0 / cycles as f64
}

/// Names the variants whose user/system split rests on too few ticks to mean much.
fn cpu_notes<'a>(cpus: impl Iterator<Item = (&'a str, &'a Cpu)>) {
    if let Some(note) = cpu::few_ticks_note(cpus) {
        println!("\n{note}");
    }
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

/// The shared client, as `mux` builds the single owner.
fn mux_shared(m: &LocalMasters) -> SharedRedlock {
    Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .build_shared()
        .expect("redlock-mux shared client")
}

pub(crate) fn current_thread_runtime() -> Runtime {
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
type Block<'a> = Box<dyn FnMut(usize, &mut Vec<u64>) -> u64 + Send + 'a>;

/// A [`Block`] that measures its own CPU (helper threads included): failures and the
/// CPU of the block's cycles.
type OwnCpuBlock<'a> = Box<dyn FnMut(usize, &mut Vec<u64>) -> (u64, Sample) + Send + 'a>;

/// The lifetime user/system time of a variant's helper threads (shared client variants).
type Helpers<'a> = Option<Box<dyn Fn() -> Lifetime + 'a>>;

struct LatVariant<'a> {
    name: &'static str,
    block: OwnCpuBlock<'a>,
    /// Whether the block's own CPU sample replaces the worker's (shared client variants).
    own_cpu: bool,
    helpers: Helpers<'a>,
    ns: Vec<u64>,
    failed: u64,
    cpu: Cpu,
}

impl<'a> LatVariant<'a> {
    fn new(name: &'static str, mut block: Block<'a>) -> Self {
        LatVariant {
            name,
            block: Box::new(move |n, out| (block(n, out), Sample::default())),
            own_cpu: false,
            helpers: None,
            ns: Vec::new(),
            failed: 0,
            cpu: Cpu::default(),
        }
    }

    /// A variant whose work also runs on helper threads: its blocks measure their own CPU
    /// and `helpers` gives the helpers' lifetime split at the end of the pass.
    fn with_helpers(
        name: &'static str,
        block: OwnCpuBlock<'a>,
        helpers: Box<dyn Fn() -> Lifetime + 'a>,
    ) -> Self {
        LatVariant {
            name,
            block,
            own_cpu: true,
            helpers: Some(helpers),
            ns: Vec::new(),
            failed: 0,
            cpu: Cpu::default(),
        }
    }
}

pub(crate) fn pct(v: &[u64], p: f64) -> u64 {
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

/// A latency block of redlock-mux cycles on `key`: every cycle's time, and the failures.
fn mux_block<'a>(c: &'a mut Redlock, key: &'static str) -> Block<'a> {
    Box::new(move |n, out| {
        let mut failed = 0;
        for _ in 0..n {
            match mux_cycle(c, key) {
                Some(ns) => out.push(ns),
                None => failed += 1,
            }
        }
        failed
    })
}

/// Connects beyond the first per master: a reconnect means the client dropped a connection
/// (and whatever it still owed on it) during the pass.
fn reconnects(c: &Redlock) -> Vec<u64> {
    c.stats()
        .iter()
        .map(|s| s.connects().saturating_sub(1))
        .collect()
}

/// `pin`: the CPU to pin every measuring thread to.
fn latency_pass(m: &LocalMasters, rt: &Runtime, cycles: usize, block: usize, pin: Option<usize>) {
    let n_masters = m.len();
    let mut fl = Floor::new(&m.addrs(), false);
    let mut ours = mux(m, false);
    let mut ours_busy = mux(m, true);
    let rs = LockManager::new(m.urls());
    let rl = RedLock::new(m.urls());
    let sh = shared::WithLoop::start(|| mux_shared(m), "peers:shared", TTL, 1);
    let sh_loop = sh.loop_tid;

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
        LatVariant::new("redlock-mux", mux_block(&mut ours, "peers:mux")),
        LatVariant::new(
            "redlock-mux busy-poll",
            mux_block(&mut ours_busy, "peers:muxbusy"),
        ),
        LatVariant::with_helpers(
            "redlock-mux shared, 1 caller",
            // One caller blocking on each result; the CPU includes the loop thread's.
            Box::new(|n, out| {
                let measured = shared::Measured::start();
                let mut failed = 0;
                for _ in 0..n {
                    let t0 = Instant::now();
                    match shared::cycle(&sh.client, "peers:shared", TTL) {
                        Ok(_) => out.push(t0.elapsed().as_nanos() as u64),
                        Err(_) => failed += 1,
                    }
                }
                (failed, measured.stop())
            }),
            Box::new(move || cpu::lifetime_of(&[sh_loop])),
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

    // Every variant on a measuring thread of its own (see the top of the file), handed
    // the blocks in turn. Blocks can stay short: a worker's user/system split comes from
    // its whole life, not from one block. Job: (cycles, keep their times); result: the
    // cycles that failed.
    let results: Vec<(u64, Cpu)> = std::thread::scope(|s| {
        let workers: Vec<_> = variants
            .iter_mut()
            .map(|v| {
                let (run, ns, own_cpu) = (&mut v.block, &mut v.ns, v.own_cpu);
                ns.reserve(cycles);
                let mut scratch = Vec::with_capacity(500);
                cpu::spawn(s, pin, move |(k, keep): (usize, bool)| {
                    let (failed, smp) = if keep {
                        run(k, ns)
                    } else {
                        let r = run(k, &mut scratch);
                        scratch.clear();
                        r
                    };
                    (failed, own_cpu.then_some(smp))
                })
            })
            .collect();
        // Warm up: connections, script caches, allocator, branch predictors.
        for w in &workers {
            w.run((500, false));
        }
        let mut results = vec![(0u64, Cpu::default()); workers.len()];
        let mut done = 0;
        while done < cycles {
            let k = block.min(cycles - done);
            for (w, (failed, cpu)) in workers.iter().zip(results.iter_mut()) {
                let ((f, own), smp) = w.run((k, true));
                *failed += f;
                match own {
                    Some(own) => cpu.add_with_helpers(own),
                    None => cpu.add(smp),
                }
            }
            done += k;
        }
        for (w, (_, cpu)) in workers.into_iter().zip(results.iter_mut()) {
            cpu.split_by(w.finish());
        }
        results
    });
    for (v, (failed, mut cpu)) in variants.iter_mut().zip(results) {
        if let Some(helpers) = &v.helpers {
            cpu.split_helpers_by(helpers());
        }
        v.failed = failed;
        v.cpu = cpu;
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
    println!("| variant | p50 µs | p90 | p99 | p99.9 | max | p50/floor | p99/floor | user µs/cyc | sys µs/cyc | cpu/floor | cpu over cycles | failed |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let us = |ns: u64| ns as f64 / 1000.0;
    for v in &variants {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {} | {} |",
            v.name,
            us(pct(&v.ns, 0.5)),
            us(pct(&v.ns, 0.9)),
            us(pct(&v.ns, 0.99)),
            us(pct(&v.ns, 0.999)),
            us(v.ns.last().copied().unwrap_or(0)),
            pct(&v.ns, 0.5) as f64 / f50,
            pct(&v.ns, 0.99) as f64 / f99,
            us_per(v.cpu.user(), n),
            us_per(v.cpu.sys(), n),
            v.cpu.total().as_secs_f64() / fcpu.as_secs_f64(),
            n,
            v.failed,
        );
    }
    cpu_notes(variants.iter().map(|v| (v.name, &v.cpu)));
    let (single, sh_v) = (&variants[1], &variants[3]);
    println!(
        "\nredlock-mux shared, 1 caller / redlock-mux (the single owner): p50 {:.2}x, p99 {:.2}x, \
         CPU {:.2}x; the shared client's loop thread took {:.0}% of its CPU (in the row's figures)",
        pct(&sh_v.ns, 0.5) as f64 / pct(&single.ns, 0.5) as f64,
        pct(&sh_v.ns, 0.99) as f64 / pct(&single.ns, 0.99) as f64,
        sh_v.cpu.total().as_secs_f64() / single.cpu.total().as_secs_f64(),
        100.0 * sh_v.cpu.helpers().as_secs_f64() / sh_v.cpu.total().as_secs_f64().max(1e-12),
    );
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
    drop(sh);
    println!(
        "\nredlock-mux reconnects per master during the pass: {:?}, busy-poll {:?} (the shared \
         client has no stats() to show)",
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
type Slice<'a> = Box<dyn FnMut(Duration) -> (u64, u64) + Send + 'a>;

/// A [`Slice`] that measures its own CPU (helper threads included).
type OwnCpuSlice<'a> = Box<dyn FnMut(Duration) -> (u64, u64, Sample) + Send + 'a>;

struct TputVariant<'a> {
    name: &'static str,
    in_flight: &'static str,
    run: OwnCpuSlice<'a>,
    /// Whether the slice's own CPU sample replaces the worker's (shared client variants).
    own_cpu: bool,
    helpers: Helpers<'a>,
    cycles: u64,
    failed: u64,
    time: Duration,
    cpu: Cpu,
}

impl<'a> TputVariant<'a> {
    fn new(name: &'static str, in_flight: &'static str, mut run: Slice<'a>) -> Self {
        TputVariant {
            name,
            in_flight,
            run: Box::new(move |slice| {
                let (c, failed) = run(slice);
                (c, failed, Sample::default())
            }),
            own_cpu: false,
            helpers: None,
            cycles: 0,
            failed: 0,
            time: Duration::ZERO,
            cpu: Cpu::default(),
        }
    }

    /// A shared client variant: `run(deadline)` runs every caller until the deadline; the
    /// slice's CPU is the whole process's (see `shared.rs`).
    fn shared(
        name: &'static str,
        mut run: impl FnMut(Instant) -> (u64, u64) + Send + 'a,
        helpers: Box<dyn Fn() -> Lifetime + 'a>,
    ) -> Self {
        TputVariant {
            name,
            in_flight: "64",
            run: Box::new(move |slice| {
                let measured = shared::Measured::start();
                let (c, failed) = run(Instant::now() + slice);
                (c, failed, measured.stop())
            }),
            own_cpu: true,
            helpers: Some(helpers),
            cycles: 0,
            failed: 0,
            time: Duration::ZERO,
            cpu: Cpu::default(),
        }
    }
}

/// `pin`: the CPU to pin every measuring thread to.
fn throughput_pass(m: &LocalMasters, rt: &Runtime, secs: f64, pin: Option<usize>) {
    let mut fl = Floor::new(&m.addrs(), false);
    let mut ours = mux(m, false);
    let rs = LockManager::new(m.urls());
    let rl = RedLock::new(m.urls());

    let names: Vec<String> = (0..K).map(|j| format!("peers:mux:tput:{j}")).collect();
    // The shared client: 64 tasks on a current-thread runtime of their own (set up as
    // rslock's, driven by the measuring thread), and 64 threads; one handle each.
    let sh_tasks = shared::WithLoop::start(|| mux_shared(m), "peers:shared:warm", TTL, 1);
    let sh_tasks_loop = sh_tasks.loop_tid;
    let task_keys: Vec<String> = (0..K).map(|j| format!("peers:shared:task:{j}")).collect();
    let sh_rt = current_thread_runtime();
    let sh_threads = shared::WithLoop::start(|| mux_shared(m), "peers:shared:warm2", TTL, 1);
    let thread_keys: Vec<String> = (0..K).map(|j| format!("peers:shared:thread:{j}")).collect();
    let pool =
        shared::CallerPool::new(&sh_threads.client, &thread_keys, TTL, shared::Release::Wait);
    let mut pool_tids = pool.tids.clone();
    pool_tids.push(sh_threads.loop_tid);
    // The same with every guard dropped (released by the loop, the caller not waiting).
    let sh_dropped = shared::WithLoop::start(|| mux_shared(m), "peers:shared:warm3", TTL, 1);
    let dropped_keys: Vec<String> = (0..K)
        .map(|j| format!("peers:shared:dropped:{j}"))
        .collect();
    let dropped = shared::CallerPool::new(
        &sh_dropped.client,
        &dropped_keys,
        TTL,
        shared::Release::Drop,
    );
    let mut dropped_tids = dropped.tids.clone();
    dropped_tids.push(sh_dropped.loop_tid);
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
        TputVariant::shared(
            "redlock-mux shared, 64 tokio tasks",
            |deadline| shared::tasks_slice(&sh_rt, &sh_tasks.client, &task_keys, TTL, deadline),
            Box::new(move || cpu::lifetime_of(&[sh_tasks_loop])),
        ),
        TputVariant::shared(
            "redlock-mux shared, 64 threads",
            |deadline| pool.slice(deadline),
            Box::new(move || cpu::lifetime_of(&pool_tids)),
        ),
        TputVariant::shared(
            "redlock-mux shared, 64 threads, guards dropped",
            |deadline| dropped.slice(deadline),
            Box::new(move || cpu::lifetime_of(&dropped_tids)),
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

    // Every variant on a measuring thread of its own (see the top of the file), handed
    // the slices in turn. Job: the slice; result: (cycles, failed, time taken).
    let slice = Duration::from_secs_f64(secs / SLICES as f64);
    type Tally = (u64, u64, Duration, Cpu);
    let results: Vec<Tally> = std::thread::scope(|s| {
        let workers: Vec<_> = variants
            .iter_mut()
            .map(|v| {
                let (run, own_cpu) = (&mut v.run, v.own_cpu);
                cpu::spawn(s, pin, move |slice: Duration| {
                    let t = Instant::now();
                    let (c, failed, smp) = run(slice);
                    (c, failed, t.elapsed(), own_cpu.then_some(smp))
                })
            })
            .collect();
        for w in &workers {
            w.run(Duration::from_millis(200));
        }
        let mut results = vec![(0, 0, Duration::ZERO, Cpu::default()); workers.len()];
        for _ in 0..SLICES {
            for (w, r) in workers.iter().zip(results.iter_mut()) {
                let ((c, failed, t, own), smp) = w.run(slice);
                r.0 += c;
                r.1 += failed;
                r.2 += t;
                match own {
                    Some(own) => r.3.add_with_helpers(own),
                    None => r.3.add(smp),
                }
            }
        }
        for (w, r) in workers.into_iter().zip(results.iter_mut()) {
            r.3.split_by(w.finish());
        }
        results
    });
    for (v, (c, failed, t, mut cpu)) in variants.iter_mut().zip(results) {
        if let Some(helpers) = &v.helpers {
            cpu.split_helpers_by(helpers());
        }
        v.cycles = c;
        v.failed = failed;
        v.time = t;
        v.cpu = cpu;
    }

    let rate = |v: &TputVariant| v.cycles as f64 / v.time.as_secs_f64();
    let cpu_per = |v: &TputVariant| us_per(v.cpu.total(), v.cycles);
    let (f_rate, f_cpu) = (rate(&variants[0]), cpu_per(&variants[0]));
    let by_name = |n: &str| variants.iter().find(|v| v.name == n).expect(n);
    let r_rate = rate(by_name("rslock, 64 tasks"));
    println!(
        "\n### Throughput from one thread, {} masters: ~{secs} s per variant in {SLICES} interleaved slices\n",
        m.len()
    );
    println!("| variant | in flight | cycles/s | x floor | x rslock | user µs/cyc | sys µs/cyc | cpu/floor | cpu over cycles | failed |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for v in &variants {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {} | {} |",
            v.name,
            v.in_flight,
            rate(v),
            rate(v) / f_rate,
            rate(v) / r_rate,
            us_per(v.cpu.user(), v.cycles),
            us_per(v.cpu.sys(), v.cycles),
            cpu_per(v) / f_cpu,
            v.cycles,
            v.failed,
        );
    }
    cpu_notes(variants.iter().map(|v| (v.name, &v.cpu)));
    let batch = rate(by_name("redlock-mux batch"));
    println!();
    for (name, t_batch, t_rslock) in [
        ("redlock-mux shared, 64 tokio tasks", 0.9, 3.0),
        ("redlock-mux shared, 64 threads", 0.85, 2.0),
        ("redlock-mux shared, 64 threads, guards dropped", 0.85, 2.0),
    ] {
        let v = by_name(name);
        println!(
            "{name}: {:.2}x redlock-mux batch (target >= {t_batch}), {:.2}x rslock (target >= {t_rslock}); \
             CPU {:.2}x the batch's, {:.0}% of it on the loop and caller threads",
            rate(v) / batch,
            rate(v) / r_rate,
            cpu_per(v) / cpu_per(by_name("redlock-mux batch")),
            100.0 * v.cpu.helpers().as_secs_f64() / v.cpu.total().as_secs_f64().max(1e-12),
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
    drop(pool);
    drop((sh_threads, sh_tasks));
    println!(
        "\nredlock-mux reconnects per master during the pass: {:?} (the shared clients have no \
         stats() to show)",
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

const USAGE: &str = "usage: redlock-mux-peers [--pin] [--hot]\n\n  --pin   the measuring threads (one per variant) on the first CPU the bench may use, the\n          masters on the others (also PEERS_PIN=1)\n  --hot   only the hot-resource pass: K clients on one resource (also PEERS_HOT=1)\n\nKnobs: PEERS_CYCLES, PEERS_SECS, PEERS_BLOCK, PEERS_HOT_CLIENTS, PEERS_HOT_SECS,\nPEERS_HOT_ROUNDS, PEERS_HOT_DELAY_US (see README.md)";

/// `--pin` or `PEERS_PIN` set to anything but empty or `0`.
fn pin_requested() -> bool {
    let mut pin = std::env::var("PEERS_PIN").is_ok_and(|v| !v.is_empty() && v != "0");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--pin" => pin = true,
            "--hot" => {}
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

    // Pinned: this thread and every measuring thread on one CPU, the masters on the others.
    // Before anything starts, so that later threads inherit the pinning (the measuring
    // threads also pin themselves, as a thread's affinity is its own).
    let (placement, master_cpus, client_cpu) = if pin {
        let (client, masters) = split_cpus(1).unwrap_or_else(|e| panic!("--pin: {e}"));
        pin_current_thread(client[0]).unwrap_or_else(|e| panic!("--pin: {e}"));
        (
            format!(
                "pinned (--pin): the measuring threads on CPU {}, the masters on CPU {}",
                client[0],
                cpu_list(&masters)
            ),
            Some(masters),
            Some(client[0]),
        )
    } else {
        (
            "unpinned: measuring threads and masters on any CPU (--pin to pin)".to_string(),
            None,
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
    // Every variant runs on its measuring thread: the sync ones directly, rslock's futures
    // and redis-rs's connection driver tasks inside `block_on` of this current-thread
    // runtime, called from rslock's measuring thread.
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
        "- every lock: TTL 10 s, a distinct free resource per variant (per task for rslock), so no retry ever runs; CPU: every variant on a measuring thread of its own, its exact runtime (CLOCK_THREAD_CPUTIME_ID) summed over its blocks, split into user/sys by that thread's lifetime getrusage(RUSAGE_THREAD) ratio (tick-sampled, ~1 tick per 4 ms at HZ=250)"
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

    let hot_only = std::env::args().any(|a| a == "--hot")
        || std::env::var("PEERS_HOT").is_ok_and(|v| !v.is_empty() && v != "0");
    if !hot_only {
        latency_pass(&m5, &rt, cycles, block, client_cpu);
        latency_pass(&m1, &rt, cycles, block, client_cpu);
        throughput_pass(&m5, &rt, secs, client_cpu);
    }
    hot::hot_pass(&m5);

    println!(
        "\nthreads in this process at the end: {}; load average at end {}; run took {:.0} s (PEERS_CYCLES={cycles}, PEERS_SECS={secs}, PEERS_BLOCK={block}, {})",
        std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count()),
        loadavg(),
        started.elapsed().as_secs_f64(),
        if pin { "pinned" } else { "unpinned" }
    );
}
