//! Lock+release cycles through the shared client (`SharedRedlock`), next to the single
//! owner, for profiling and syscall counting; prints every thread's CPU time and context
//! switches per cycle (from `/proc/self/task`), which is where a hand-off between threads
//! shows.
//!
//! ```sh
//! cargo build --release --example shared_cycles
//! target/release/examples/shared_cycles 20000                  # 1 caller, shared client
//! MODE=single target/release/examples/shared_cycles 20000      # the single owner, same loop
//! MODE=tasks K=64 target/release/examples/shared_cycles 200000 # 64 tokio tasks, one handle
//! MODE=threads K=64 target/release/examples/shared_cycles 200000
//! MODE=batch K=64 target/release/examples/shared_cycles 200000 # try_lock_batch of 64
//! strace -f -c target/release/examples/shared_cycles 10000     # syscalls, all threads
//! ```
//!
//! The local masters' CPU is reported too (`masters`, all five summed): on a machine whose
//! cores they share, what the client saves is theirs to use.
//!
//! `BUSY=1`: busy-poll. `N` is the total of cycles over all callers; with threads and
//! tasks a cycle that fails is not counted (the first failure is printed). Tasks run on a
//! current-thread runtime driven by the main thread (as in the benches). Local masters
//! (5) unless `REDLOCK_MASTERS` is set. Setup and warm-up (200 cycles) are outside the
//! counted window; the per-thread figures are deltas over the measured cycles.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_mux::local::LocalMasters;
use redlock_mux::{Redlock, SharedRedlock};

const TTL: Duration = Duration::from_secs(10);

/// The local masters' process ids (their CPU is reported too: on a machine whose cores
/// the masters share, what the client saves they can use).
static MASTER_PIDS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// Per thread (by thread id): name, CPU ns (schedstat), voluntary and involuntary
/// context switches; the masters' threads under the name `masters`.
fn threads() -> BTreeMap<u32, (String, u64, u64, u64)> {
    let mut out = BTreeMap::new();
    threads_in("/proc/self/task", None, &mut out);
    for p in MASTER_PIDS.get().into_iter().flatten() {
        threads_in(&format!("/proc/{p}/task"), Some("masters"), &mut out);
    }
    out
}

fn threads_in(dir: &str, name: Option<&str>, out: &mut BTreeMap<u32, (String, u64, u64, u64)>) {
    for t in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let name = name.map_or_else(|| read("comm").trim_end().to_string(), str::to_string);
        let cpu = read("schedstat")
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let status = read("status");
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        out.insert(
            tid,
            (
                name,
                cpu,
                field("voluntary_ctxt_switches:"),
                field("nonvoluntary_ctxt_switches:"),
            ),
        );
    }
}

fn report(before: &BTreeMap<u32, (String, u64, u64, u64)>, cycles: u64, took: Duration) {
    let after = threads();
    println!(
        "{cycles} cycles in {:.3} s: {:.0} cycles/s, {:.1} µs per cycle",
        took.as_secs_f64(),
        cycles as f64 / took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / cycles as f64
    );
    // Threads with the same name (callers) are summed.
    let mut by_name: BTreeMap<String, (u64, u64, u64, usize)> = BTreeMap::new();
    for (tid, (name, cpu, vol, inv)) in &after {
        let (c0, v0, i0) = before.get(tid).map_or((0, 0, 0), |b| (b.1, b.2, b.3));
        let name = name
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .to_string();
        let e = by_name.entry(name).or_default();
        e.0 += cpu - c0;
        e.1 += vol - v0;
        e.2 += inv - i0;
        e.3 += 1;
    }
    println!(
        "{:<22} {:>7} {:>12} {:>14} {:>14}",
        "thread", "count", "CPU µs/cyc", "vol. cs/cyc", "invol. cs/cyc"
    );
    for (name, (cpu, vol, inv, n)) in by_name {
        println!(
            "{:<22} {:>7} {:>12.2} {:>14.3} {:>14.3}",
            name,
            n,
            cpu as f64 / 1000.0 / cycles as f64,
            vol as f64 / cycles as f64,
            inv as f64 / cycles as f64
        );
    }
}

/// Prints the first cycle that failed (e.g. a master backlogged: the rounds decide at the
/// quorum-th reply, so the client can run ahead of a slow master).
fn first_failure(e: &redlock_mux::Error) {
    static SHOWN: std::sync::Once = std::sync::Once::new();
    SHOWN.call_once(|| println!("first failed cycle: {e}"));
}

fn failed(n: u64) {
    if n > 0 {
        println!("{n} cycles failed (not counted above)");
    }
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

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let busy = std::env::var("BUSY").is_ok_and(|v| !v.is_empty() && v != "0");
    let mode = std::env::var("MODE").unwrap_or_else(|_| "caller".into());
    let k: usize = std::env::var("K")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let (local, urls) = match std::env::var("REDLOCK_MASTERS") {
        Ok(list) => (
            None,
            list.split(',').map(str::to_string).collect::<Vec<_>>(),
        ),
        Err(_) => {
            let m = LocalMasters::start(5).expect("local masters (is redis-server installed?)");
            let urls = m.urls();
            let _ = MASTER_PIDS.set((0..m.len()).filter_map(|i| m[i].pid()).collect());
            (Some(m), urls)
        }
    };
    let builder = || {
        Redlock::builder()
            .masters(&urls)
            .retry_count(0)
            // Generous: under valgrind or strace the first round is slow.
            .node_timeout(Duration::from_secs(2))
            .busy_poll(busy)
    };
    println!("mode {mode}, busy-poll {busy}, {} masters", urls.len());
    match mode.as_str() {
        "single" => {
            let mut c = builder().build().expect("client");
            for _ in 0..200 {
                let l = c.try_lock("sc:single", TTL).unwrap();
                c.release(l).unwrap();
            }
            let before = threads();
            let t = Instant::now();
            for _ in 0..n {
                let l = c.try_lock("sc:single", TTL).unwrap();
                c.release(l).unwrap();
            }
            report(&before, n, t.elapsed());
        }
        "batch" => {
            let mut c = builder().build().expect("client");
            let names: Vec<String> = (0..k)
                .map(|j| format!("sc:{}:batch:{j}", std::process::id()))
                .collect();
            let (mut out, mut locks, mut rel) = (Vec::new(), Vec::new(), Vec::new());
            let mut batch = |c: &mut Redlock| {
                c.try_lock_batch(&names, TTL, &mut out).unwrap();
                locks.extend(out.drain(..).map(|r| r.unwrap()));
                c.release_batch(locks.drain(..), &mut rel).unwrap();
            };
            for _ in 0..20 {
                batch(&mut c);
            }
            let rounds = n / k as u64;
            let before = threads();
            let t = Instant::now();
            for _ in 0..rounds {
                batch(&mut c);
            }
            report(&before, rounds * k as u64, t.elapsed());
        }
        "caller" => {
            let c = builder().build_shared().expect("shared client");
            let cycle = |c: &SharedRedlock| {
                let g = c.try_lock("sc:caller", TTL).wait().unwrap();
                g.release().wait().unwrap();
            };
            for _ in 0..200 {
                cycle(&c);
            }
            let before = threads();
            let t = Instant::now();
            for _ in 0..n {
                cycle(&c);
            }
            report(&before, n, t.elapsed());
        }
        "threads" => {
            let c = builder().build_shared().expect("shared client");
            let per = n / k as u64;
            // Met three times: warmed up, measured, figures read (callers stay alive for it).
            let line = Arc::new(std::sync::Barrier::new(k + 1));
            let done = Arc::new(AtomicU64::new(0));
            let handles: Vec<_> = (0..k)
                .map(|j| {
                    let (c, line, done) = (c.clone(), line.clone(), done.clone());
                    std::thread::Builder::new()
                        .name(format!("caller{j}"))
                        .spawn(move || {
                            let key = format!("sc:{}:thread:{j}", std::process::id());
                            for _ in 0..20 {
                                let g = c.try_lock(&key, TTL).wait().unwrap();
                                g.release().wait().unwrap();
                            }
                            line.wait();
                            line.wait();
                            let mut ok = 0;
                            for _ in 0..per {
                                let r = c.try_lock(&key, TTL).wait();
                                match r.and_then(|g| g.release().wait()) {
                                    Ok(()) => ok += 1,
                                    Err(e) => first_failure(&e),
                                }
                            }
                            done.fetch_add(ok, Ordering::Relaxed);
                            line.wait();
                            line.wait();
                        })
                        .unwrap()
                })
                .collect();
            line.wait(); // warmed up
            let before = threads();
            let t = Instant::now();
            line.wait(); // go
            line.wait(); // done
            let ok = done.load(Ordering::Relaxed);
            report(&before, ok, t.elapsed());
            failed(per * k as u64 - ok);
            line.wait();
            for h in handles {
                h.join().unwrap();
            }
            let keys: Vec<String> = (0..k)
                .map(|j| format!("sc:{}:thread:{j}", std::process::id()))
                .collect();
            if let Some(m) = &local {
                println!("keys left on the masters: {}", keys_left(m, &keys));
            }
        }
        "tasks" => {
            let c = builder().build_shared().expect("shared client");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            // Cycles that went through (a refused or failed one is not counted).
            let run = |per: u64| {
                rt.block_on(async {
                    let mut set = tokio::task::JoinSet::new();
                    for j in 0..k {
                        let c = c.clone();
                        set.spawn(async move {
                            let key = format!("sc:{}:task:{j}", std::process::id());
                            let mut ok = 0u64;
                            for _ in 0..per {
                                let r = match c.try_lock(&key, TTL).await {
                                    Ok(g) => g.release().await,
                                    Err(e) => Err(e),
                                };
                                match r {
                                    Ok(()) => ok += 1,
                                    Err(e) => first_failure(&e),
                                }
                            }
                            ok
                        });
                    }
                    let mut ok = 0;
                    while let Some(r) = set.join_next().await {
                        ok += r.unwrap();
                    }
                    ok
                })
            };
            run(20);
            let per = n / k as u64;
            let before = threads();
            let t = Instant::now();
            let ok = run(per);
            report(&before, ok, t.elapsed());
            failed(per * k as u64 - ok);
        }
        other => panic!("MODE={other}: single, batch, caller, threads or tasks"),
    }
}
