//! The shared client's bench variants, used by both benches: one caller's lock+release
//! cycle through a `SharedRedlock`, and many callers through one handle (threads that
//! block on `wait()`, or tokio tasks that `.await`).
//!
//! CPU: a shared client's work runs on its loop thread as well as on the caller, so these
//! variants measure their own CPU around the measured cycles (the whole process's runtime,
//! see [`Measured`]) and name their helper threads (the loop thread, found by its name
//! [`LOOP_THREAD`]; caller threads) for the user/system split (`cpu::lifetime_of`).
//!
//! A busy-polling shared client spins its loop thread for as long as it exists, with or
//! without work (measured: ~1 s of CPU per idle second). In an interleaved pass it would
//! eat the CPU of every other variant's blocks, so [`PerBlock`] builds it at the start of
//! each of its blocks and stops it (waiting for the loop thread to end) after.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redlock_mux::{Error, SharedRedlock};

use crate::cpu::{self, Lifetime, Sample};

/// The name of the shared client's loop thread.
pub const LOOP_THREAD: &str = "redlock-mux";

/// One lock+release cycle through the shared client, blocking on each result: the
/// acquire and release times.
pub fn cycle(c: &SharedRedlock, key: &str, ttl: Duration) -> Result<(Duration, Duration), Error> {
    let t0 = Instant::now();
    let guard = c.try_lock(key, ttl).wait()?;
    let t1 = Instant::now();
    guard.release().wait()?;
    Ok((t1 - t0, t1.elapsed()))
}

/// CPU around a stretch of work: the calling thread's and the whole process's.
pub struct Measured {
    t0: Duration,
    p0: Duration,
}

impl Measured {
    pub fn start() -> Measured {
        Measured {
            t0: cpu::thread_time(),
            p0: cpu::process_time(),
        }
    }

    pub fn stop(self) -> Sample {
        let (p1, t1) = (cpu::process_time(), cpu::thread_time());
        Sample {
            thread: t1 - self.t0,
            process: p1 - self.p0,
        }
    }
}

/// A shared client and the id of its loop thread.
pub struct WithLoop {
    pub client: SharedRedlock,
    pub loop_tid: i32,
}

impl WithLoop {
    /// Builds the client with `build`, runs `warm` cycles on `key` (the first connects
    /// and loads the scripts) and finds the loop thread it started: the thread named
    /// [`LOOP_THREAD`] that was not there before (named by the thread itself, so only
    /// certain once a cycle went through it).
    pub fn start(
        build: impl FnOnce() -> SharedRedlock,
        key: &str,
        ttl: Duration,
        warm: usize,
    ) -> Self {
        let before = cpu::threads_named(LOOP_THREAD);
        let client = build();
        for _ in 0..warm.max(1) {
            cycle(&client, key, ttl).expect("shared client warm-up cycle");
        }
        let started = Instant::now();
        let loop_tid = loop {
            let new: Vec<i32> = cpu::threads_named(LOOP_THREAD)
                .into_iter()
                .filter(|t| !before.contains(t))
                .collect();
            match new[..] {
                [tid] => break tid,
                [] if started.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => panic!("cannot tell the shared client's loop thread: new {new:?}"),
            }
        };
        WithLoop { client, loop_tid }
    }

    /// The loop thread's user/system time so far.
    pub fn loop_life(&self) -> Lifetime {
        cpu::lifetime_of(&[self.loop_tid])
    }

    /// Drops the client and waits (up to 5 s) for its loop thread to end; returns the
    /// loop thread's lifetime user/system time, read just before.
    pub fn stop(self) -> Lifetime {
        let life = self.loop_life();
        let tid = self.loop_tid;
        drop(self.client);
        let t = Instant::now();
        while cpu::thread_alive(tid) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the shared client's loop thread did not end"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        life
    }
}

/// A shared client that exists only during its blocks (for busy-poll: see the top of the
/// file). Each block builds it, warms it up (untimed), runs the measured cycles and stops
/// it. The sum of its loop threads' lifetimes ([`PerBlock::loops_life`]) splits its CPU.
pub struct PerBlock<B> {
    build: B,
    key: String,
    ttl: Duration,
    warm: usize,
    loops_life: Arc<Mutex<Lifetime>>,
}

impl<B: FnMut() -> SharedRedlock> PerBlock<B> {
    pub fn new(build: B, key: &str, ttl: Duration, warm: usize) -> Self {
        PerBlock {
            build,
            key: key.to_string(),
            ttl,
            warm,
            loops_life: Arc::default(),
        }
    }

    /// The summed lifetimes of the loop threads so far (readable after `self` moved).
    pub fn loops_life(&self) -> Arc<Mutex<Lifetime>> {
        self.loops_life.clone()
    }

    /// `n` measured cycles, each one's time given to `out` (`Ok((acquire, release))`, or
    /// the error of a cycle that failed); the CPU of the measured cycles.
    pub fn block(
        &mut self,
        n: usize,
        mut out: impl FnMut(Result<(Duration, Duration), Error>),
    ) -> Sample {
        let c = WithLoop::start(&mut self.build, &self.key, self.ttl, self.warm);
        let m = Measured::start();
        for _ in 0..n {
            out(cycle(&c.client, &self.key, self.ttl));
        }
        let s = m.stop();
        let life = c.stop();
        *self.loops_life.lock().unwrap() += life;
        s
    }
}

/// How a caller of a [`CallerPool`] lets go of each lock.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each bench uses the modes it compares
pub enum Release {
    /// `guard.release().wait()`: the caller blocks for the release's outcome too (two
    /// blocking waits per cycle).
    Wait,
    /// `drop(guard)`: the release is queued to the loop and the caller goes on (one
    /// blocking wait per cycle; the outcome is not known).
    Drop,
}

/// `keys.len()` threads sharing one handle, kept for a whole pass. Each slice, every
/// thread loops lock+release on its own key until the deadline; the slice ends when all
/// have finished their last cycle.
pub struct CallerPool {
    state: Arc<PoolState>,
    threads: Vec<JoinHandle<()>>,
    /// The callers' thread ids, for `cpu::lifetime_of`.
    pub tids: Vec<i32>,
}

struct PoolState {
    start: Barrier,
    end: Barrier,
    /// `None`: leave.
    deadline: Mutex<Option<Instant>>,
    cycles: AtomicU64,
    failed: AtomicU64,
}

impl CallerPool {
    pub fn new(client: &SharedRedlock, keys: &[String], ttl: Duration, release: Release) -> Self {
        let k = keys.len();
        let state = Arc::new(PoolState {
            start: Barrier::new(k + 1),
            end: Barrier::new(k + 1),
            deadline: Mutex::new(None),
            cycles: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let (tid_tx, tid_rx) = mpsc::channel();
        let threads = keys
            .iter()
            .enumerate()
            .map(|(j, key)| {
                let (state, client, key, tid_tx) =
                    (state.clone(), client.clone(), key.clone(), tid_tx.clone());
                std::thread::Builder::new()
                    .name(format!("caller-{j}"))
                    .spawn(move || {
                        let _ = tid_tx.send(cpu::gettid());
                        drop(tid_tx);
                        loop {
                            state.start.wait();
                            let Some(deadline) = *state.deadline.lock().unwrap() else {
                                return;
                            };
                            let (mut c, mut failed) = (0, 0);
                            while Instant::now() < deadline {
                                match client.try_lock(&key, ttl).wait() {
                                    Ok(guard) if release == Release::Drop => {
                                        drop(guard);
                                        c += 1;
                                    }
                                    Ok(guard) => match guard.release().wait() {
                                        Ok(()) => c += 1,
                                        Err(_) => failed += 1,
                                    },
                                    Err(_) => failed += 1,
                                }
                            }
                            state.cycles.fetch_add(c, Ordering::Relaxed);
                            state.failed.fetch_add(failed, Ordering::Relaxed);
                            state.end.wait();
                        }
                    })
                    .expect("spawn a caller thread")
            })
            .collect();
        drop(tid_tx);
        let tids = tid_rx.iter().take(k).collect();
        CallerPool {
            state,
            threads,
            tids,
        }
    }

    /// Every caller loops until `deadline`; returns (cycles done, cycles failed).
    pub fn slice(&self, deadline: Instant) -> (u64, u64) {
        *self.state.deadline.lock().unwrap() = Some(deadline);
        self.state.cycles.store(0, Ordering::Relaxed);
        self.state.failed.store(0, Ordering::Relaxed);
        self.state.start.wait();
        self.state.end.wait();
        (
            self.state.cycles.load(Ordering::Relaxed),
            self.state.failed.load(Ordering::Relaxed),
        )
    }
}

impl Drop for CallerPool {
    fn drop(&mut self) {
        *self.state.deadline.lock().unwrap() = None;
        self.state.start.wait();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `keys.len()` tokio tasks on `rt` sharing one handle, each looping lock+release on its
/// own key until `deadline`; the slice ends when all have finished their last cycle.
/// Returns (cycles done, cycles failed).
pub fn tasks_slice(
    rt: &tokio::runtime::Runtime,
    client: &SharedRedlock,
    keys: &[String],
    ttl: Duration,
    deadline: Instant,
) -> (u64, u64) {
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for key in keys {
            let (client, key) = (client.clone(), key.clone());
            set.spawn(async move {
                let (mut c, mut failed) = (0u64, 0u64);
                while Instant::now() < deadline {
                    match client.try_lock(&key, ttl).await {
                        Ok(guard) => match guard.release().await {
                            Ok(()) => c += 1,
                            Err(_) => failed += 1,
                        },
                        Err(_) => failed += 1,
                    }
                }
                (c, failed)
            });
        }
        let (mut c, mut failed) = (0, 0);
        while let Some(r) = set.join_next().await {
            let (a, b) = r.expect("shared client task");
            c += a;
            failed += b;
        }
        (c, failed)
    })
}
