//! Client CPU per bench variant, each variant on a thread that runs only that variant.
//!
//! Why: with tick-based CPU accounting (`CONFIG_TICK_CPU_ACCOUNTING=y`, the usual default)
//! the kernel knows a thread's total runtime exactly (`sum_exec_runtime`), but it splits it
//! into user and system time only by sampling, at every scheduler tick (`HZ`, e.g. 250 a
//! second), the mode the thread is in. `getrusage` reports the runtime split by the
//! thread's *cumulative* user/system tick ratio (`cputime_adjust` in
//! `kernel/sched/cputime.c`). A `getrusage` delta around one block on a thread that also
//! ran other variants is that block's runtime times the ratio of everything the thread
//! ever ran, which pulls every variant's user figure toward the thread's average.
//! `getrusage` also lags a running thread by up to a tick: it does not add the slice that
//! is running, which a busy-polling client that never sleeps shows.
//!
//! So each variant gets a worker thread of its own for a whole pass ([`spawn`], on a
//! `std::thread::scope`, pinned to the client CPU when the bench pins). The bench hands the
//! workers their blocks in turn ([`Worker::run`]), so the interleaving is the one the
//! benches always had. Around every block the worker reads its exact runtime
//! (`CLOCK_THREAD_CPUTIME_ID`, which does add the running slice). When the pass ends
//! ([`Worker::finish`]) one `getrusage(RUSAGE_THREAD)` gives the worker's lifetime
//! user/system ratio, and that ratio splits the summed runtime of its measured blocks.
//! Spawning, pinning, warm-up accounting and the hand-over of blocks are outside the
//! measured windows. The hand-over costs a few µs of futex calls per block, which go into
//! the ratio's ticks, not into the runtime.
//!
//! Limits: the split is a sample of about (worker CPU / tick) ticks. The user figure's
//! relative error is about 1/sqrt(user ticks): at HZ=250 (4 ms ticks), 10k cycles of 14 µs
//! user time each hold about 35 user ticks, ±17 %. CPU figures need long runs.
//! A worker with no tick at all is counted as all user time by the kernel. Below
//! [`FEW_TICKS`] of CPU (10 ticks at HZ=250, e^-10 odds of no tick), [`Cpu::few_ticks`]
//! flags the split as unreliable. A worker with ticks in only one mode is counted all
//! user or all system, which is what its ratio says anyway.
//!
//! Helper threads: a shared-client variant's work runs on threads besides its worker (the
//! client's loop thread; caller threads; the worker itself may only wait). For those,
//! [`Cpu::add_with_helpers`] counts the whole process's runtime during the job, less the
//! worker's own, as the helpers' (nothing else runs then: the other workers wait for their
//! turn and an idle loop thread sleeps in `epoll_wait`), and [`Cpu::split_helpers_by`]
//! splits it by the helper threads' lifetime ratio ([`lifetime_of`], from
//! `/proc/self/task/TID/stat`, the same tick-based split `getrusage` gives).

#![allow(dead_code)]

use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

use redlock_mux::local::pin_current_thread;

/// A worker with less CPU than this over its life gets a user/system split from fewer than
/// about 10 ticks at HZ=250; see [`Cpu::few_ticks`].
pub const FEW_TICKS: Duration = Duration::from_millis(40);

fn clock(id: libc::clockid_t) -> Duration {
    // SAFETY: clock_gettime only writes the struct we pass; zeroed is a valid timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local timespec.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Exact CPU time of the calling thread so far (brings the scheduler's count up to date).
pub fn thread_time() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Exact CPU time of the whole process so far, all threads.
pub fn process_time() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The calling thread's user and system time as `getrusage(RUSAGE_THREAD)` reports them.
fn rusage_thread() -> (Duration, Duration) {
    // Brings `sum_exec_runtime` up to date, which `getrusage` alone does not.
    let _ = thread_time();
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv =
        |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// CPU during one job on a worker.
#[derive(Clone, Copy, Default, Debug)]
pub struct Sample {
    /// The worker thread's own runtime.
    pub thread: Duration,
    /// The whole process's, to catch work on other threads (which there should be none of).
    pub process: Duration,
}

/// A worker's whole life as `getrusage` splits it.
#[derive(Clone, Copy, Default, Debug)]
pub struct Lifetime {
    pub user: Duration,
    pub sys: Duration,
}

impl std::ops::AddAssign for Lifetime {
    fn add_assign(&mut self, o: Lifetime) {
        self.user += o.user;
        self.sys += o.sys;
    }
}

fn share(life: Lifetime) -> f64 {
    let all = life.user + life.sys;
    if all.is_zero() {
        0.0
    } else {
        life.user.as_secs_f64() / all.as_secs_f64()
    }
}

/// The calling thread's id (`gettid`), to find it under `/proc/self/task`.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The ids of this process's threads named `name` (`/proc/self/task/TID/comm`).
pub fn threads_named(name: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether thread `tid` of this process still exists.
pub fn thread_alive(tid: i32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// The user and system time of this process's threads `tids` so far, as the kernel splits
/// them (`utime` and `stime` of `/proc/self/task/TID/stat`); threads gone count nothing.
pub fn lifetime_of(tids: &[i32]) -> Lifetime {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut life = Lifetime::default();
    for tid in tids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        life.user += Duration::from_secs_f64(ticks(11) as f64 / hz);
        life.sys += Duration::from_secs_f64(ticks(12) as f64 / hz);
    }
    life
}

/// The measured CPU of one variant: its jobs' samples summed, split by its worker's
/// lifetime user/system ratio once [`Cpu::split_by`] has it.
#[derive(Clone, Copy, Default, Debug)]
pub struct Cpu {
    thread: Duration,
    process: Duration,
    life: Lifetime,
    /// Runtime of the variant's helper threads (see the module documentation).
    helpers: Duration,
    helpers_life: Lifetime,
}

impl Cpu {
    pub fn add(&mut self, s: Sample) {
        self.thread += s.thread;
        self.process += s.process;
    }

    /// Like [`Cpu::add`], for a variant whose work also runs on helper threads: the
    /// process's runtime beyond the worker's counts as theirs.
    pub fn add_with_helpers(&mut self, s: Sample) {
        self.add(s);
        self.helpers += s.process.saturating_sub(s.thread);
    }

    /// Sets the ratio that splits the runtime into user and system time.
    pub fn split_by(&mut self, life: Lifetime) {
        self.life = life;
    }

    /// Sets the ratio that splits the helpers' runtime (their summed [`lifetime_of`]).
    pub fn split_helpers_by(&mut self, life: Lifetime) {
        self.helpers_life = life;
    }

    /// Worker and helpers.
    pub fn total(&self) -> Duration {
        self.thread + self.helpers
    }

    /// The helper threads' share of [`Cpu::total`].
    pub fn helpers(&self) -> Duration {
        self.helpers
    }

    pub fn user(&self) -> Duration {
        self.thread.mul_f64(share(self.life)) + self.helpers.mul_f64(share(self.helpers_life))
    }

    pub fn sys(&self) -> Duration {
        self.total().saturating_sub(self.user())
    }

    /// CPU spent by threads other than the worker (and its helpers) while it ran its jobs.
    pub fn other(&self) -> Duration {
        self.process.saturating_sub(self.thread + self.helpers)
    }

    /// More CPU on other threads than 5 % of the worker's own.
    pub fn noticeable_other(&self) -> bool {
        self.other().as_secs_f64() > 0.05 * self.thread.as_secs_f64()
    }

    /// The worker ran for less than [`FEW_TICKS`]: its user/system split rests on a handful
    /// of ticks or none.
    /// With helpers, the ticks of worker and helpers together.
    pub fn few_ticks(&self) -> bool {
        let (w, h) = (self.life, self.helpers_life);
        w.user + w.sys + h.user + h.sys < FEW_TICKS
    }
}

/// A thread that runs only one variant; see the module documentation.
pub struct Worker<'scope, J, R> {
    jobs: mpsc::Sender<J>,
    done: mpsc::Receiver<(R, Sample)>,
    thread: ScopedJoinHandle<'scope, Lifetime>,
}

/// Starts a worker on `scope` that runs `f(job)` for every job given to [`Worker::run`],
/// pinned to CPU `pin` when given (a thread's affinity is its own; a pinned bench pins each
/// of them to the client CPU before the first job).
pub fn spawn<'scope, 'env, J, R, F>(
    scope: &'scope Scope<'scope, 'env>,
    pin: Option<usize>,
    mut f: F,
) -> Worker<'scope, J, R>
where
    J: Send + 'scope,
    R: Send + 'scope,
    F: FnMut(J) -> R + Send + 'scope,
{
    let (jobs, job_rx) = mpsc::channel::<J>();
    let (done_tx, done) = mpsc::channel();
    let thread = scope.spawn(move || {
        if let Some(cpu) = pin {
            pin_current_thread(cpu)
                .unwrap_or_else(|e| panic!("pinning a measuring thread to CPU {cpu}: {e}"));
        }
        for job in job_rx {
            let (t0, p0) = (thread_time(), process_time());
            let r = f(job);
            let (p1, t1) = (process_time(), thread_time());
            let s = Sample {
                thread: t1 - t0,
                process: p1 - p0,
            };
            if done_tx.send((r, s)).is_err() {
                break;
            }
        }
        let (user, sys) = rusage_thread();
        Lifetime { user, sys }
    });
    Worker { jobs, done, thread }
}

impl<J, R> Worker<'_, J, R> {
    /// Runs `job` on the worker and waits for it: its result and the CPU it took.
    pub fn run(&self, job: J) -> (R, Sample) {
        let died = "a measuring thread panicked (its message is above)";
        self.jobs.send(job).expect(died);
        self.done.recv().expect(died)
    }

    /// Ends the worker: its lifetime user/system time, for [`Cpu::split_by`].
    pub fn finish(self) -> Lifetime {
        drop(self.jobs);
        match self.thread.join() {
            Ok(life) => life,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

/// A line naming the variants whose user/system split rests on too few ticks to mean
/// much, if any.
pub fn few_ticks_note<'a>(cpus: impl Iterator<Item = (&'a str, &'a Cpu)>) -> Option<String> {
    let few: Vec<&str> = cpus
        .filter(|(_, c)| c.few_ticks())
        .map(|(n, _)| n)
        .collect();
    (!few.is_empty()).then(|| {
        format!(
            "note: under {} ms of CPU (~10 scheduler ticks at HZ=250) for {}: that user/sys split is a guess",
            FEW_TICKS.as_millis(),
            few.join(", ")
        )
    })
}
