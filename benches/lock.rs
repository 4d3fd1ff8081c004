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

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/floor.rs"]
mod floor;
use cpu::Cpu;
use floor::Floor;
use redlock_mux::local::{cpu_list, pin_current_thread, split_cpus, LocalMasters};
use redlock_mux::Redlock;

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

fn our_cycle(c: &mut Redlock, key: &str) -> (Duration, Duration) {
    let t0 = Instant::now();
    let lock = c.try_lock(key, TTL).unwrap();
    let t1 = Instant::now();
    c.release(lock).unwrap();
    (t1 - t0, t1.elapsed())
}

struct Stats {
    name: String,
    cycle: Vec<u64>,
    cpu: Cpu,
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
    type Runner = Box<dyn FnMut() -> (Duration, Duration) + Send>;
    let mut variants: Vec<(String, Runner)> = Vec::new();
    let mut floor = Floor::new(&m.addrs(), false);
    variants.push((
        "floor (std sockets)".into(),
        Box::new(move || floor.cycle()),
    ));
    let mut fb = Floor::new(&m.addrs(), true);
    variants.push(("floor busy-poll".into(), Box::new(move || fb.cycle())));
    let mut c = ours(&m, false);
    variants.push((
        "redlock-mux".into(),
        Box::new(move || our_cycle(&mut c, "mux")),
    ));
    let mut cb = ours(&m, true);
    variants.push((
        "redlock-mux busy-poll".into(),
        Box::new(move || our_cycle(&mut cb, "muxbusy")),
    ));
    let mut cf = ours_fenced(&m);
    variants.push((
        "redlock-mux fenced".into(),
        Box::new(move || our_cycle(&mut cf, "muxfenced")),
    ));
    let mut stats: Vec<Stats> = variants
        .iter()
        .map(|(n, _)| Stats {
            name: n.clone(),
            cycle: Vec::with_capacity(cycles),
            cpu: Cpu::default(),
        })
        .collect();
    // Every variant on a measuring thread of its own (see the top of the file): warm up,
    // then interleave blocks of 200 cycles per variant. The blocks can be short because a
    // worker's user/system split comes from its whole life, not from one block.
    let warm = if smoke() { 5 } else { 500 };
    let block = 200;
    let cpus: Vec<Cpu> = std::thread::scope(|s| {
        let workers: Vec<_> = variants
            .iter_mut()
            .zip(stats.iter_mut())
            .map(|((_, run), st)| {
                let out = &mut st.cycle;
                // Job: (cycles, keep their times).
                cpu::spawn(s, client_cpu(), move |(k, keep): (usize, bool)| {
                    for _ in 0..k {
                        let (a, r) = run();
                        if keep {
                            out.push((a + r).as_nanos() as u64);
                        }
                    }
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
                c.add(w.run((k, true)).1);
            }
            done += k;
        }
        for (w, c) in workers.into_iter().zip(cpus.iter_mut()) {
            c.split_by(w.finish());
        }
        cpus
    });
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
        "{:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>7} {:>8}",
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
            "{:<24} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>8.2} {:>8.2} {:>7.2} {:>8}",
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
    for k in [1usize, 8, 64] {
        let mut floor = Floor::new(&m.addrs(), false);
        let mut c = ours(&m, false);
        let names: Vec<String> = (0..k).map(|j| format!("tput:{j}")).collect();
        let mut out = Vec::with_capacity(k);
        let mut rel = Vec::with_capacity(k);
        let mut locks = Vec::with_capacity(k);
        let mut run_ours = move || {
            c.try_lock_batch(&names, TTL, &mut out).unwrap();
            locks.extend(out.drain(..).map(|r| r.unwrap()));
            c.release_batch(locks.drain(..), &mut rel).unwrap();
        };
        // Floor and ours each on a measuring thread of its own (see the top of the file),
        // handed interleaved slices (see `timed`).
        let ((fb, ft, fcpu), (ob, ot, ocpu)) = std::thread::scope(|s| {
            let wf = cpu::spawn(s, client_cpu(), timed(warm, || floor.cycle_k(k)));
            let wo = cpu::spawn(s, client_cpu(), timed(warm, &mut run_ours));
            wf.run(None);
            wo.run(None);
            let (mut fb, mut ob) = (0u64, 0u64);
            let (mut ft, mut ot) = (Duration::ZERO, Duration::ZERO);
            let (mut fcpu, mut ocpu) = (Cpu::default(), Cpu::default());
            for _ in 0..slices {
                let ((n, t), smp) = wf.run(Some(slice));
                fb += n;
                ft += t;
                fcpu.add(smp);
                let ((n, t), smp) = wo.run(Some(slice));
                ob += n;
                ot += t;
                ocpu.add(smp);
            }
            fcpu.split_by(wf.finish());
            ocpu.split_by(wo.finish());
            ((fb, ft, fcpu), (ob, ot, ocpu))
        });
        let fr = (fb * k as u64) as f64 / ft.as_secs_f64();
        let or = (ob * k as u64) as f64 / ot.as_secs_f64();
        let per = |cpu: Duration, batches: u64| {
            cpu.as_nanos() as f64 / 1000.0 / (batches * k as u64) as f64
        };
        println!(
            "{:<6} {:>14.0} {:>14.0} {:>7.2} {:>12.2} {:>12.2} {:>9.2} {:>9.2} {:>10} {:>10}",
            k,
            fr,
            or,
            or / fr,
            per(fcpu.total(), fb),
            per(ocpu.total(), ob),
            per(ocpu.user(), ob),
            per(ocpu.total(), ob) / per(fcpu.total(), fb),
            fb * k as u64,
            ob * k as u64,
        );
        cpus.push((format!("floor K={k}"), fcpu));
        cpus.push((format!("ours K={k}"), ocpu));
    }
    print_cpu_notes(cpus.iter().map(|(n, c)| (n.as_str(), c)));
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
}
