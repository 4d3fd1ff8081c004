//! `redlock bench`: lock+unlock latency and throughput against real masters (local ones by
//! default), with a mutual-exclusion check.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeValLike;
use redlock_mux::local::{
    cpu_list, pin_current_thread, set_current_thread_cpus, split_cpus, LocalCluster, LocalMasters,
};
use redlock_mux::{Error, Lock, LockGuard, Redlock, SharedRedlock, WaitMode};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::common::{exit, human_micros, out, out_part, say, thousands};
use crate::{duration, MasterArgs};

pub const AFTER_HELP: &str = "\
With no masters (neither --masters nor REDLOCK_MASTERS), starts --local redis-server
processes on free 127.0.0.1 ports in a temporary directory and stops them on exit, Ctrl-C
included. Each client is a thread with its own Redlock client (one connection per master)
that loops: try_lock (retried at once while taken), a tiny critical section, release.
With --in-flight K above 1, a client takes K locks per round trip (try_lock_batch) and
releases them together (release_batch).

--callers K and --tasks K measure the shared client instead: ONE SharedRedlock (one loop
thread, one connection per master) used by K callers at once, each looping try_lock
(retried at once while taken), the critical section, release, and waiting for each result.
--callers: K OS threads, each waiting with Pending::wait(). --tasks: K tokio tasks awaiting
the same operations, on a multi-thread runtime with 1 worker thread (one thread polls every
task, so the tasks' side costs what one core gives it; the shared client's loop thread is
the other busy thread). Whatever the callers submit while the loop is busy goes out in its
next write to each master. --busy-poll makes the loop thread spin (and waiting threads spin
briefly before they park).

--pin (Linux, local masters only) gives every client thread a CPU of its own, the first C
CPUs this process may use, and starts the masters on the others (the main thread, which
only draws the progress bar, joins the masters). It models a client with a core to itself,
which is what --busy-poll is for; it needs at least C + 1 CPUs.

  acquire   from the first attempt to the grant, refused attempts included
  release   one release round
  cycle     acquire + critical section + release

Mutual-exclusion check: every holder records the interval [grant, min(release start,
validity end)] on the monotonic clock, and increments a per-resource counter with a
deliberately non-atomic read-modify-write (load, a short spin, store) inside the lock.
The run fails if two intervals of one resource overlap or a counter differs from its
grants.

Exit status:
  0    the run completed and the mutual-exclusion check passed
  2    MUTUAL EXCLUSION VIOLATED (overlapping holders or lost counter updates)
  64   usage or configuration error
  69   redis-server missing, masters unreachable, or no lock acquired at all
  70   a client thread panicked
  71   an OS error (signal handlers; --pin could not pin a client thread)
  130  interrupted (Ctrl-C); local masters are stopped first";

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// Local masters to start when no masters are given.
    #[arg(short, long, value_name = "N", default_value_t = 5)]
    local: usize,
    /// Make each local master a Redis Cluster of S shard primaries (named
    /// redis+cluster://; 0: single servers).
    #[arg(long, value_name = "S", default_value_t = 0)]
    local_shards: usize,
    /// Limit every local server (each shard primary with --local-shards) to CORES of a
    /// CPU's time (0.1: 10% of a core) with a cgroup v1 CPU quota, so that the servers, not
    /// the machine, bound the rate (Linux; root or a delegated cgroup).
    #[arg(long, value_name = "CORES")]
    shard_cpu: Option<f64>,
    /// Client threads, each with its own client and connections.
    #[arg(short, long, value_name = "C", default_value_t = 1)]
    clients: usize,
    /// Locks in flight per client: above 1, each client takes and releases K locks per
    /// round trip (pipelined try_lock_batch / release_batch).
    #[arg(long, value_name = "K", default_value_t = 1)]
    in_flight: usize,
    /// With --in-flight above 1: send each batch's releases with the next batch's locks,
    /// in the same write (a dropped Lock is released by its client's next call): one round
    /// trip and one server turn per shard per cycle instead of two. Release latency is then
    /// not measured (the cycle ends when its release is handed over).
    #[arg(long)]
    release_with_next: bool,
    /// K threads sharing one SharedRedlock handle, each locking and releasing in a loop
    /// (blocking on every result with wait()).
    #[arg(
        long,
        value_name = "K",
        conflicts_with_all = ["clients", "in_flight", "tasks", "pin"]
    )]
    callers: Option<usize>,
    /// K tokio tasks sharing one SharedRedlock handle, each locking and releasing in a
    /// loop (awaiting every result), on a multi-thread runtime with 1 worker thread.
    #[arg(
        long,
        value_name = "K",
        conflicts_with_all = ["clients", "in_flight", "callers", "pin"]
    )]
    tasks: Option<usize>,
    /// Distinct resources (default: clients x in-flight, or one per caller or task: no
    /// contention; fewer: contention).
    #[arg(short, long, value_name = "R")]
    resources: Option<usize>,
    /// How long to run.
    #[arg(short, long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    duration: Duration,
    /// TTL of each lock.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    ttl: Duration,
    /// How long a round waits for the masters' answers [default: the library's, TTL / 100
    /// within 10..50 ms]. Raise it for distant masters or a loaded machine.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    round_timeout: Option<Duration>,
    /// Print one JSON object on stdout instead of the table (no progress bar).
    #[arg(long)]
    json: bool,
    /// Poll without sleeping in the kernel: lower latency, one busy core per client.
    #[arg(long)]
    busy_poll: bool,
    /// Measure even when a master does not answer at the start (by default `bench`
    /// refuses: figures with a master down are not comparable).
    #[arg(long)]
    allow_degraded: bool,
    /// Pin each client thread to a CPU of its own and start the local masters on the
    /// other CPUs (Linux; only with local masters; needs clients + 1 CPUs).
    #[arg(long)]
    pin: bool,
    /// How a caller waits while the lock is taken: `spin` retries try_lock at once;
    /// `poll` calls lock() with the retry delay only (WaitMode::Poll); `notify` calls
    /// lock() and is woken when a release is announced (WaitMode::Notify, the library's
    /// default). lock() runs with the blocking client's default retries (10), in every
    /// mode.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = WaitArg::Spin)]
    wait_mode: WaitArg,
    /// First come, first served (Builder::fairness; with --wait-mode notify): waiters
    /// stand in a line on the masters, across clients, and do not take the lock ahead of an
    /// earlier one.
    #[arg(long)]
    fair: bool,
    /// Fencing tokens (Builder::fencing): every grant draws one, and the check also
    /// requires each resource's tokens to rise with its grants. The masters are taken as
    /// durable (Builder::fencing_assume_durable): a benchmark measures, it protects nothing.
    #[arg(long)]
    fencing: bool,
    /// Names per lock: each lock takes K names at once (lock_many: one script per master,
    /// one per slot group on a cluster master). Not with --in-flight above 1 or --tasks.
    #[arg(long, value_name = "K", default_value_t = 1)]
    names_per_lock: usize,
    /// After a release, a caller waits this long before it asks again (default 0: at once).
    /// With contention, a think time lets each grant go to a caller that was waiting
    /// instead of the one that just released.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    think: Option<Duration>,
}

/// `--wait-mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitArg {
    /// try_lock, retried at once while taken.
    Spin,
    /// lock() with WaitMode::Poll.
    Poll,
    /// lock() with WaitMode::Notify.
    Notify,
}

impl WaitArg {
    fn name(self) -> &'static str {
        match self {
            WaitArg::Spin => "spin",
            WaitArg::Poll => "poll",
            WaitArg::Notify => "notify",
        }
    }
}

/// Worker threads of the tokio runtime of `--tasks`. One: every task is polled on one
/// thread and the shared client's loop thread is the other busy one, which leaves a
/// small machine's remaining CPU to the masters. On the project's 2-vCPU VM two workers
/// measured no different (64 tasks, 3 s runs alternated: 62-87k cycles/s with one,
/// 74-81k with two), so the simpler setting stays.
const TOKIO_WORKERS: usize = 1;

/// Who takes the locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `--clients C` threads, each with a single-owner `Redlock` (`--in-flight` per client).
    Clients,
    /// `--callers K` threads sharing one `SharedRedlock`.
    Callers,
    /// `--tasks K` tokio tasks sharing one `SharedRedlock`.
    Tasks,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Clients => "clients",
            Mode::Callers => "callers",
            Mode::Tasks => "tasks",
        }
    }
}

impl BenchArgs {
    fn mode(&self) -> Mode {
        match (self.callers, self.tasks) {
            (Some(_), _) => Mode::Callers,
            (_, Some(_)) => Mode::Tasks,
            _ => Mode::Clients,
        }
    }

    /// The threads or tasks that take locks: clients, or the callers / tasks of the shared
    /// client.
    fn lockers(&self) -> usize {
        self.callers.or(self.tasks).unwrap_or(self.clients)
    }

    /// Locks in flight per client: `--in-flight`, or every caller's through the one shared
    /// client.
    fn in_flight(&self) -> usize {
        match self.mode() {
            Mode::Clients => self.in_flight,
            Mode::Callers | Mode::Tasks => self.lockers(),
        }
    }
}

/// Where `--pin` puts the client threads (one CPU each) and the local masters.
#[derive(Debug)]
struct Pinning {
    clients: Vec<usize>,
    masters: Vec<usize>,
}

/// One hold of a resource, in nanoseconds since the bench epoch.
#[derive(Clone, Copy)]
struct Hold {
    resource: u32,
    /// Its fencing token (0: none).
    fence: u64,
    /// When its lock was first asked for (the first attempt).
    asked: u64,
    start: u64,
    end: u64,
}

/// What one client thread measured.
struct ClientResult {
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    cycle: Histogram<u64>,
    acquired: u64,
    refused: u64,
    retried: u64,
    errors: u64,
    overran: u64,
    cycles: u64,
    /// lock() calls that used up their retries (`--wait-mode poll|notify`).
    gave_up: u64,
    grants: Vec<u64>,
    holds: Vec<Hold>,
    first_error: Option<String>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 h, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    d.as_micros().try_into().unwrap_or(u64::MAX)
}

impl ClientResult {
    fn new(resources: usize) -> Self {
        ClientResult {
            acquire: histogram(),
            release: histogram(),
            cycle: histogram(),
            acquired: 0,
            refused: 0,
            retried: 0,
            errors: 0,
            overran: 0,
            cycles: 0,
            gave_up: 0,
            grants: vec![0; resources],
            holds: Vec::new(),
            first_error: None,
        }
    }

    /// A refusal: one refused `try_lock`, or a `lock()` call that used up its retries
    /// (every attempt of it refused).
    fn taken(&mut self, shared: &Shared, report: &redlock_mux::Report) {
        if shared.lock_calls {
            self.refused += u64::from(report.attempts());
            self.gave_up += 1;
        } else {
            self.refused += 1;
        }
    }

    fn error(&mut self, e: &Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    fn merge(&mut self, o: ClientResult) {
        // Same bounds on both sides: addition cannot fail.
        let _ = self.acquire.add(&o.acquire);
        let _ = self.release.add(&o.release);
        let _ = self.cycle.add(&o.cycle);
        self.acquired += o.acquired;
        self.refused += o.refused;
        self.retried += o.retried;
        self.errors += o.errors;
        self.overran += o.overran;
        self.cycles += o.cycles;
        self.gave_up += o.gave_up;
        for (g, x) in self.grants.iter_mut().zip(o.grants) {
            *g += x;
        }
        self.holds.extend(o.holds);
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }
}

/// State shared by the client threads (and the shared client's callers or tasks).
struct Shared {
    epoch: Instant,
    stop: AtomicBool,
    cycles: AtomicU64,
    /// Incremented non-atomically (load, spin, store) by each holder: lost updates show
    /// up as a count below the grants.
    counters: Vec<AtomicU64>,
    names: Vec<String>,
    /// The names each resource's lock takes (`--names-per-lock`; the resource's name alone
    /// by default).
    group: Vec<Vec<String>>,
    ttl: Duration,
    /// Clients, or callers / tasks of the shared client (each takes one lock at a time).
    clients: usize,
    /// Locks per round trip per client (1 for the shared client's callers and tasks).
    in_flight: usize,
    /// `lock()` instead of `try_lock` retried at once.
    lock_calls: bool,
    /// `--release-with-next`: a batch's locks are dropped, released with the next batch.
    release_with_next: bool,
    /// Pause after each release (`--think`).
    think: Duration,
}

pub fn main(args: BenchArgs) -> u8 {
    let clients = args.clients;
    let resources = match args.mode() {
        Mode::Clients => args
            .resources
            .unwrap_or(clients.saturating_mul(args.in_flight)),
        Mode::Callers | Mode::Tasks => args.resources.unwrap_or(args.lockers()),
    };
    if args.callers == Some(0) || args.tasks == Some(0) {
        say!("--callers and --tasks must be at least 1");
        return exit::USAGE;
    }
    if args.names_per_lock == 0 {
        say!("--names-per-lock must be at least 1");
        return exit::USAGE;
    }
    if args.names_per_lock > 1 && (args.in_flight > 1 || args.tasks.is_some()) {
        say!("--names-per-lock above 1 works with --clients and --callers, one lock at a time (not --in-flight above 1, not --tasks)");
        return exit::USAGE;
    }
    if clients == 0 || resources == 0 || args.in_flight == 0 {
        say!("--clients, --in-flight and --resources must be at least 1");
        return exit::USAGE;
    }
    if args.duration.is_zero() {
        say!("--duration must be above zero");
        return exit::USAGE;
    }
    if args.release_with_next && (args.mode() != Mode::Clients || args.in_flight < 2) {
        say!("--release-with-next pipelines batches: it needs --in-flight 2 or more");
        return exit::USAGE;
    }
    if args.wait_mode != WaitArg::Spin && args.mode() == Mode::Clients && args.in_flight > 1 {
        say!("--wait-mode poll|notify calls lock(), one lock at a time: not with --in-flight");
        return exit::USAGE;
    }
    if args.fair && args.wait_mode != WaitArg::Notify {
        say!("--fair needs --wait-mode notify (a queue of waiters is served on release)");
        return exit::USAGE;
    }
    if u32::try_from(resources).is_err() {
        say!("--resources is too large");
        return exit::USAGE;
    }

    // Ctrl-C / SIGTERM: stop the run, stop the local masters, exit 130. A second one
    // exits at once.
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        let ok = signal_hook::flag::register_conditional_shutdown(
            sig,
            exit::signal(SIGINT).into(),
            interrupted.clone(),
        )
        .and_then(|_| signal_hook::flag::register(sig, interrupted.clone()));
        if let Err(e) = ok {
            say!("cannot install signal handlers: {e}");
            return exit::OSERR;
        }
    }

    let mut urls = args.masters.urls();
    let mut pinning = None;
    if args.pin {
        if !urls.is_empty() {
            say!(
                "--pin only works with the local masters the bench starts itself (it puts them \
                 on the CPUs the clients do not use): drop --masters / REDLOCK_MASTERS"
            );
            return exit::USAGE;
        }
        match split_cpus(clients) {
            Ok((clients, masters)) => pinning = Some(Pinning { clients, masters }),
            Err(e) => {
                say!("--pin: {e}");
                return exit::USAGE;
            }
        }
    }
    let mut local = None;
    if !urls.is_empty() && (args.local_shards > 0 || args.shard_cpu.is_some()) {
        say!(
            "--local-shards and --shard-cpu only work with the local masters the bench starts \
             itself: drop --masters / REDLOCK_MASTERS"
        );
        return exit::USAGE;
    }
    if args
        .shard_cpu
        .is_some_and(|c| !(c.is_finite() && c >= 0.01))
    {
        say!("--shard-cpu must be a share of a core of 0.01 (1%) or more, such as 0.1");
        return exit::USAGE;
    }
    if urls.is_empty() && args.local_shards > 0 {
        if pinning.is_some() {
            say!("--pin does not work with --local-shards (the clusters' nodes are not pinned)");
            return exit::USAGE;
        }
        if args.local == 0 {
            say!("--local must be at least 1 when no masters are given");
            return exit::USAGE;
        }
        if !args.json {
            say!(
                "starting {} local clusters of {} shard primar{} each{}",
                args.local,
                args.local_shards,
                if args.local_shards == 1 { "y" } else { "ies" },
                args.shard_cpu
                    .map(|c| format!(", each primary limited to {c} of a core"))
                    .unwrap_or_default()
            );
        }
        match start_clusters(args.local, args.local_shards, args.shard_cpu) {
            Ok(c) => {
                urls = c.iter().map(LocalCluster::seed_url).collect();
                local = Some(Local::Clusters(c));
            }
            Err((code, e)) => {
                say!("{e}");
                return code;
            }
        }
    }
    if urls.is_empty() {
        if args.local == 0 {
            say!("--local must be at least 1 when no masters are given");
            return exit::USAGE;
        }
        if !args.json {
            match &pinning {
                Some(p) => say!(
                    "starting {} local redis-server masters on CPU {}; clients on CPU {}",
                    args.local,
                    cpu_list(&p.masters),
                    cpu_list(&p.clients)
                ),
                None => say!("starting {} local redis-server masters", args.local),
            }
        }
        let started = match &pinning {
            Some(p) => LocalMasters::start_on_cpus(args.local, &p.masters),
            None => LocalMasters::start(args.local),
        };
        match started {
            Ok(mut m) => {
                if let Some(cores) = args.shard_cpu {
                    for master in m.iter_mut() {
                        if let Err(e) = master.limit_cpu(cores) {
                            say!("--shard-cpu: cannot limit a local master's CPU: {e}");
                            return exit::OSERR;
                        }
                    }
                }
                urls = m.urls();
                local = Some(Local::Masters(m));
            }
            Err(e) => {
                say!("cannot start local masters: {e}");
                return exit::UNAVAILABLE;
            }
        }
    }
    let local_pids: Option<Vec<u32>> = local.as_ref().map(|l| match l {
        Local::Masters(m) => m.iter().filter_map(|x| x.pid()).collect(),
        Local::Clusters(c) => c
            .iter()
            .flat_map(|c| c.nodes().iter().filter_map(|x| x.pid()))
            .collect(),
    });
    let code = bench(
        &args,
        &urls,
        local_pids.as_deref(),
        pinning.as_ref(),
        resources,
        &interrupted,
    );
    // Stop the local masters before exiting (also after Ctrl-C).
    drop(local);
    code
}

/// The local servers the bench started: single servers, or clusters.
enum Local {
    Masters(LocalMasters),
    Clusters(Vec<LocalCluster>),
}

/// `n` local clusters of `shards` primaries each (started side by side), every primary
/// under a CPU quota of `cpu` cores when given.
fn start_clusters(
    n: usize,
    shards: usize,
    cpu: Option<f64>,
) -> Result<Vec<LocalCluster>, (u8, String)> {
    let started: Vec<std::io::Result<LocalCluster>> = thread::scope(|s| {
        let starts: Vec<_> = (0..n)
            .map(|_| s.spawn(move || LocalCluster::start_with(shards, 0, &[])))
            .collect();
        starts
            .into_iter()
            .map(|h| h.join().expect("a cluster start panicked"))
            .collect()
    });
    let mut clusters = Vec::with_capacity(n);
    for c in started {
        clusters.push(c.map_err(|e| {
            (
                exit::UNAVAILABLE,
                format!("cannot start a local cluster: {e}"),
            )
        })?);
    }
    if let Some(cores) = cpu {
        for c in &mut clusters {
            let primaries = c.primaries().map_err(|e| {
                (
                    exit::UNAVAILABLE,
                    format!("cannot read a local cluster's primaries: {e}"),
                )
            })?;
            for i in primaries {
                c.node_mut(i).limit_cpu(cores).map_err(|e| {
                    (
                        exit::OSERR,
                        format!("--shard-cpu: cannot limit a shard primary's CPU: {e}"),
                    )
                })?;
            }
        }
    }
    Ok(clusters)
}

fn bench(
    args: &BenchArgs,
    urls: &[String],
    // The local masters' process ids, when the bench started them.
    local: Option<&[u32]>,
    pinning: Option<&Pinning>,
    resources: usize,
    interrupted: &AtomicBool,
) -> u8 {
    let builder = || {
        let mut b = args
            .masters
            .with_tls(Redlock::builder().masters(urls))
            .busy_poll(args.busy_poll)
            .wait_mode(match args.wait_mode {
                WaitArg::Poll => WaitMode::Poll,
                WaitArg::Spin | WaitArg::Notify => WaitMode::Notify,
            })
            .fairness(args.fair)
            .fencing(args.fencing)
            .fencing_assume_durable(args.fencing)
            // The blocking client's default bound, for the shared client too (whose own
            // default is none): `lock()` callers of both modes give up alike.
            .retry_count(10);
        if let Some(t) = args.round_timeout {
            b = b.node_timeout(t);
        }
        b
    };
    let build = || builder().build();
    // One client up front checks the configuration and names the masters.
    let mut probe = match build() {
        Ok(c) => c,
        Err(e) => {
            say!("{e}");
            return crate::run::error_code(&e);
        }
    };
    let master_names: Vec<String> = probe.masters().map(str::to_string).collect();
    let quorum = probe.quorum();
    let round_timeout = probe.round_timeout(args.ttl);
    if !args.allow_degraded {
        if let Some(code) = check_every_master(&mut probe, args.ttl) {
            return code;
        }
    }
    drop(probe);

    let run_id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0)
    );
    let mode = args.mode();
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        stop: AtomicBool::new(false),
        cycles: AtomicU64::new(0),
        counters: (0..resources).map(|_| AtomicU64::new(0)).collect(),
        names: (0..resources)
            .map(|r| format!("redlock-bench:{run_id}:{r}"))
            .collect(),
        // Names without a common hash tag: on a cluster master they lie in several slots.
        group: (0..resources)
            .map(|r| {
                let name = format!("redlock-bench:{run_id}:{r}");
                if args.names_per_lock == 1 {
                    vec![name]
                } else {
                    (0..args.names_per_lock)
                        .map(|j| format!("{name}:{j}"))
                        .collect()
                }
            })
            .collect(),
        ttl: args.ttl,
        clients: args.lockers(),
        in_flight: if mode == Mode::Clients {
            args.in_flight
        } else {
            1
        },
        lock_calls: args.wait_mode != WaitArg::Spin,
        release_with_next: args.release_with_next,
        think: args.think.unwrap_or_default(),
    });
    // The shared client of --callers / --tasks: one handle, cloned for every caller.
    let shared_client = match mode {
        Mode::Clients => None,
        Mode::Callers | Mode::Tasks => match builder().build_shared() {
            Ok(c) => Some(c),
            Err(e) => {
                say!("{e}");
                return crate::run::error_code(&e);
            }
        },
    };
    // Who meets at the start line besides this thread: every client or caller thread, or
    // the one thread that drives the tasks' runtime.
    let starters = match mode {
        Mode::Clients | Mode::Callers => args.lockers(),
        Mode::Tasks => 1,
    };
    let barrier = Arc::new(Barrier::new(starters + 1));
    let mut handles = Vec::with_capacity(starters);
    match (mode, &shared_client) {
        (Mode::Callers, Some(client)) => {
            for id in 0..args.lockers() {
                let shared = shared.clone();
                let barrier = barrier.clone();
                let client = client.clone();
                handles.push(
                    thread::Builder::new()
                        .name(format!("bench-caller-{id}"))
                        .spawn(move || caller_thread(id, &client, &shared, &barrier))
                        .expect("spawn a caller thread"),
                );
            }
        }
        (Mode::Tasks, Some(client)) => {
            let shared = shared.clone();
            let barrier = barrier.clone();
            let client = client.clone();
            handles.push(
                thread::Builder::new()
                    .name("bench-tasks".into())
                    .spawn(move || tasks_thread(&client, &shared, &barrier))
                    .expect("spawn the tasks' thread"),
            );
        }
        _ => {
            for id in 0..args.clients {
                let shared = shared.clone();
                let barrier = barrier.clone();
                let client = build();
                let cpu = pinning.map(|p| p.clients[id]);
                handles.push(
                    thread::Builder::new()
                        .name(format!("bench-client-{id}"))
                        .spawn(move || client_thread(id, cpu, client, &shared, &barrier))
                        .expect("spawn a client thread"),
                );
            }
        }
    }
    // The callers hold clones; the loop thread stops once the last is gone.
    drop(shared_client);
    if let Some(p) = pinning {
        // Keep this thread's progress-bar wake-ups off the clients' CPUs. Only a nicety:
        // the measurement does not depend on it.
        let _ = set_current_thread_cpus(&p.masters);
    }

    // What the masters have done so far (CPU time, commands run): the run's share is the
    // difference with the same taken after it.
    let nodes = sample_nodes(args, urls);
    let servers0 = nodes.as_ref().and_then(server_samples);
    barrier.wait();
    let usage0 = getrusage(UsageWho::RUSAGE_SELF).ok();
    let t0 = Instant::now();
    let bar = progress_bar(args);
    let end = t0 + args.duration;
    loop {
        let now = Instant::now();
        if now >= end || interrupted.load(Ordering::Relaxed) {
            break;
        }
        let cycles = shared.cycles.load(Ordering::Relaxed);
        let elapsed = now - t0;
        bar.set_position(elapsed.as_millis() as u64);
        bar.set_message(format!(
            "{} cycles, {}/s",
            thousands(cycles),
            thousands((cycles as f64 / elapsed.as_secs_f64().max(1e-9)) as u64)
        ));
        thread::sleep((end - now).min(Duration::from_millis(100)));
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut total = ClientResult::new(resources);
    let mut setup_error = None;
    let mut panicked = false;
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => total.merge(r),
            Ok(Err(e)) => setup_error = setup_error.or(Some(e)),
            Err(_) => panicked = true,
        }
    }
    let elapsed = t0.elapsed();
    // Includes the shared client's loop thread and the tasks' runtime workers.
    let usage1 = getrusage(UsageWho::RUSAGE_SELF).ok();
    let servers = servers0.and_then(|a| {
        let b = server_samples(nodes.as_ref()?)?;
        Some(
            a.iter()
                .zip(&b)
                .map(|(a, b)| b.since(a))
                .collect::<Vec<_>>(),
        )
    });
    bar.finish_and_clear();

    if interrupted.load(Ordering::Relaxed) {
        say!(
            "interrupted after {:.1}s; stopping{}",
            elapsed.as_secs_f64(),
            if local.is_some() {
                " the local masters"
            } else {
                ""
            }
        );
        return exit::signal(SIGINT);
    }
    if panicked {
        say!("a client thread panicked");
        return exit::SOFTWARE;
    }
    if let Some(e) = setup_error {
        say!("{e}");
        return match e {
            SetupError::Pin(_) | SetupError::Runtime(_) => exit::OSERR,
            SetupError::Lock(_) => exit::UNAVAILABLE,
        };
    }

    let cpu = match (usage0, usage1) {
        (Some(a), Some(b)) => Some((
            (b.user_time() - a.user_time()).num_microseconds() as f64,
            (b.system_time() - a.system_time()).num_microseconds() as f64,
        )),
        _ => None,
    };
    let counted: Vec<u64> = shared
        .counters
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .collect();
    let check = check_exclusion(&shared.names, &counted, &total.grants, &total.holds);
    let waited = waiting(&total.holds);
    let report = Report {
        args,
        masters: &master_names,
        local,
        pinning,
        quorum,
        round_timeout,
        resources,
        elapsed,
        total: &total,
        cpu,
        servers: servers.as_deref(),
        check: &check,
        waiting: &waited,
    };
    if args.json {
        out!("{}", report.json());
    } else {
        report.print();
    }
    if !check.ok() {
        say!(
            "MUTUAL EXCLUSION VIOLATED: {} overlapping holds, {} lost counter updates, {} \
             fencing tokens not above the one before",
            check.overlaps,
            check.lost_updates,
            check.fence_regressions
        );
        for line in &check.details {
            say!("  {line}");
        }
        return exit::VIOLATION;
    }
    if total.acquired == 0 {
        say!(
            "no lock was acquired{}",
            total
                .first_error
                .as_deref()
                .map(|e| format!(" (first error: {e})"))
                .unwrap_or_default()
        );
        return exit::UNAVAILABLE;
    }
    exit::OK
}

fn progress_bar(args: &BenchArgs) -> ProgressBar {
    if args.json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(args.duration.as_millis() as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} bench [{bar:30}] {elapsed:>3}/{duration_s}  {msg}")
    {
        let total = format!("{}s", args.duration.as_secs_f64());
        let style = style
            .with_key(
                "duration_s",
                move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&total);
                },
            )
            .progress_chars("=> ");
        bar.set_style(style);
    }
    bar
}

/// Why a client thread could not start measuring.
enum SetupError {
    /// `--pin` could not pin the thread.
    Pin(String),
    /// No client, or the warm-up locks failed.
    Lock(String),
    /// `--tasks`: the tokio runtime could not start.
    Runtime(String),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Pin(e) => write!(f, "--pin: {e}"),
            SetupError::Lock(e) => write!(f, "cannot lock on the masters: {e}"),
            SetupError::Runtime(e) => write!(f, "--tasks: cannot start the tokio runtime: {e}"),
        }
    }
}

fn client_thread(
    id: usize,
    cpu: Option<usize>,
    client: Result<Redlock, Error>,
    shared: &Shared,
    barrier: &Barrier,
) -> Result<ClientResult, SetupError> {
    let resources = shared.names.len();
    let mut out = ClientResult::new(resources);
    // Pinned before the warm-up, so the connections' first use is already on its CPU.
    if let Some(Err(e)) = cpu.map(pin_current_thread) {
        barrier.wait();
        return Err(SetupError::Pin(format!("client thread {id}: {e}")));
    }
    let mut client = match client {
        Ok(c) => c,
        Err(e) => {
            barrier.wait();
            return Err(SetupError::Lock(e.to_string()));
        }
    };
    // Warm up (connect, load the scripts) on keys of our own, outside the measurement.
    let warm_error = warm_up(shared, id, |warm| {
        client
            .try_lock(warm, shared.ttl)
            .and_then(|l| client.release(l))
    });
    barrier.wait();
    if let Some(e) = warm_error {
        return Err(SetupError::Lock(e));
    }

    if shared.in_flight == 1 {
        run_cycles(id, &mut client, shared, &mut out);
    } else {
        run_batched(id, &mut client, shared, &mut out);
    }
    Ok(out)
}

/// A `--callers` thread: warm up on a key of its own, then loop lock / release through
/// the shared handle.
fn caller_thread(
    id: usize,
    client: &SharedRedlock,
    shared: &Shared,
    barrier: &Barrier,
) -> Result<ClientResult, SetupError> {
    let mut out = ClientResult::new(shared.names.len());
    let warm_error = warm_up(shared, id, |warm| {
        client
            .try_lock(warm, shared.ttl)
            .wait()
            .and_then(|g| g.release().wait())
    });
    barrier.wait();
    if let Some(e) = warm_error {
        return Err(SetupError::Lock(e));
    }
    run_cycles(id, client, shared, &mut out);
    Ok(out)
}

/// The `--tasks` thread: builds the runtime, runs the tasks' warm-up, meets the others
/// at the start line, then runs the tasks to the end and merges what they measured.
fn tasks_thread(
    client: &SharedRedlock,
    shared: &Arc<Shared>,
    barrier: &Barrier,
) -> Result<ClientResult, SetupError> {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(TOKIO_WORKERS)
        .thread_name("bench-tokio")
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            barrier.wait();
            return Err(SetupError::Runtime(e.to_string()));
        }
    };
    let tasks = shared.clients;
    // Warm up (connections, scripts, the runtime's threads) outside the measurement; as a
    // client thread's warm-up, rounds that find too few masters in time are tried again
    // for WARM_UP_LIMIT, a key per cycle.
    let until = Instant::now() + WARM_UP_LIMIT;
    let warm_error = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for id in 0..tasks {
            let client = client.clone();
            let prefix = format!("{}:warmup:{id}", shared.names[0]);
            let ttl = shared.ttl;
            set.spawn(async move {
                let (mut cycle, mut warmed) = (0, 0);
                while warmed < 20 {
                    let warm = format!("{prefix}:{cycle}");
                    cycle += 1;
                    let r = match client.try_lock(&warm, ttl).await {
                        Ok(guard) => guard.release().await,
                        Err(e) => Err(e),
                    };
                    match r {
                        Ok(()) => warmed += 1,
                        Err(e) if passing(&e) && Instant::now() < until => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok::<(), Error>(())
            });
        }
        let mut first = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => first = first.or(Some(e.to_string())),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        first
    });
    barrier.wait();
    if let Some(e) = warm_error {
        return Err(SetupError::Lock(e));
    }
    let total = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for id in 0..tasks {
            let client = client.clone();
            let shared = shared.clone();
            set.spawn(async move {
                let mut out = ClientResult::new(shared.names.len());
                run_task(id, &client, &shared, &mut out).await;
                out
            });
        }
        let mut total = ClientResult::new(shared.names.len());
        while let Some(r) = set.join_next().await {
            match r {
                Ok(out) => total.merge(out),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        total
    });
    Ok(total)
}

/// [`run_cycles`] as a task: the same loop, awaiting each result.
async fn run_task(id: usize, client: &SharedRedlock, shared: &Shared, out: &mut ClientResult) {
    let mut k = 0usize;
    'run: while !shared.stop.load(Ordering::Relaxed) {
        let r = resource_for(shared, id, 0, k);
        k = k.wrapping_add(1);
        let name = &shared.names[r];
        let t0 = Instant::now();
        let guard = loop {
            let r = if shared.lock_calls {
                client.lock(name, shared.ttl).await
            } else {
                client.try_lock(name, shared.ttl).await
            };
            match r {
                Ok(guard) => {
                    out.refused += u64::from(guard.attempts().saturating_sub(1));
                    break guard;
                }
                Err(Error::Taken(report)) => out.taken(shared, &report),
                Err(e) => {
                    out.error(&e);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            if shared.stop.load(Ordering::Relaxed) {
                break 'run;
            }
            out.retried += 1;
            tokio::task::yield_now().await;
        };
        let granted = Instant::now();
        out.acquired += 1;
        out.grants[r] += 1;
        out.acquire.saturating_record(micros(granted - t0).max(1));
        critical_section_async(&shared.counters[r]).await;

        let release_start = Instant::now();
        record_hold(
            shared,
            out,
            r,
            t0,
            (granted, guard.fencing_token()),
            release_start,
            guard.valid_until(),
        );
        let released = guard.release().await;
        let done = Instant::now();
        if let Err(e) = released {
            out.error(&e);
        }
        out.release
            .saturating_record(micros(done - release_start).max(1));
        out.cycle.saturating_record(micros(done - t0).max(1));
        out.cycles += 1;
        shared.cycles.fetch_add(1, Ordering::Relaxed);
        if !shared.think.is_zero() {
            tokio::time::sleep(shared.think).await;
        }
    }
}

/// The resource of client `id`'s slot `slot` in its `k`-th cycle: with one resource per
/// slot (the default) every slot keeps its own; with fewer, slots share (contention).
fn resource_for(shared: &Shared, id: usize, slot: usize, k: usize) -> usize {
    let slots = shared.clients * shared.in_flight;
    (id * shared.in_flight + slot + k.wrapping_mul(slots)) % shared.names.len()
}

/// How many `spin_loop` hints a thread's critical section spends between its load and its
/// store (well under a microsecond here).
const CRITICAL_SPINS: u32 = 64;

/// The critical section: a read-modify-write that loses updates unless it is exclusive.
///
/// It keeps its CPU between the load and the store (a short spin, as a short piece of
/// work would), rather than yielding it: a holder that yields on a machine with more
/// runnable threads than cores waits behind the others' time slices while it holds the
/// lock, so that a contended run measured the scheduler more than the client. With 8
/// clients on one resource on this project's 2-core machine (`--clients 8 --resources 1
/// --wait-mode notify`), a yield there took the grants from 0.45-0.48x to 0.26x the
/// uncontended rate of the same run (2026-11-28), while one client, with a core to
/// itself, hardly noticed. Two holders at once still lose updates: on two cores they
/// interleave within the spin (`the_critical_section_loses_updates_without_a_lock`).
fn critical_section(counter: &AtomicU64) {
    let v = counter.load(Ordering::Relaxed);
    std::hint::black_box(v);
    for _ in 0..CRITICAL_SPINS {
        std::hint::spin_loop();
    }
    counter.store(v + 1, Ordering::Relaxed);
}

/// [`critical_section`] for a task: it yields to the runtime between the load and the
/// store, so that other tasks on the same worker thread run in between (a thread yield
/// would not let them).
async fn critical_section_async(counter: &AtomicU64) {
    let v = counter.load(Ordering::Relaxed);
    std::hint::black_box(v);
    tokio::task::yield_now().await;
    counter.store(v + 1, Ordering::Relaxed);
}

/// Record a grant: the critical section, then the hold interval
/// `[grant, min(release start, validity end)]`.
fn record_hold(
    shared: &Shared,
    out: &mut ClientResult,
    r: usize,
    asked: Instant,
    (granted, fence): (Instant, Option<u64>),
    release_start: Instant,
    valid_until: Instant,
) {
    if release_start > valid_until {
        out.overran += 1;
    }
    let ns = |t: Instant| t.saturating_duration_since(shared.epoch).as_nanos() as u64;
    out.holds.push(Hold {
        resource: r as u32,
        fence: fence.unwrap_or(0),
        asked: ns(asked),
        start: ns(granted),
        end: ns(release_start.min(valid_until)),
    });
}

/// What one blocking cycle needs of a client: the single owner (`--clients`) and a
/// shared handle blocking on each result (`--callers`) run the same loop.
trait CycleClient {
    type Held;
    /// Take `names` (one: `lock` or `try_lock`; several: `lock_many`).
    fn acquire(
        &mut self,
        names: &[String],
        ttl: Duration,
        lock_calls: bool,
    ) -> Result<Self::Held, Error>;
    fn attempts(held: &Self::Held) -> u32;
    fn fence(held: &Self::Held) -> Option<u64>;
    fn valid_until(held: &Self::Held) -> Instant;
    fn release(&mut self, held: Self::Held) -> Result<(), Error>;
}

impl CycleClient for &mut Redlock {
    type Held = Lock;
    fn acquire(
        &mut self,
        names: &[String],
        ttl: Duration,
        lock_calls: bool,
    ) -> Result<Lock, Error> {
        match names {
            [name] if lock_calls => self.lock(name, ttl),
            [name] => self.try_lock(name, ttl),
            names => self.lock_many(names, ttl),
        }
    }
    fn attempts(held: &Lock) -> u32 {
        held.attempts()
    }
    fn fence(held: &Lock) -> Option<u64> {
        held.fencing_token()
    }
    fn valid_until(held: &Lock) -> Instant {
        held.valid_until()
    }
    fn release(&mut self, held: Lock) -> Result<(), Error> {
        Redlock::release(self, held)
    }
}

impl CycleClient for &SharedRedlock {
    type Held = LockGuard;
    fn acquire(
        &mut self,
        names: &[String],
        ttl: Duration,
        lock_calls: bool,
    ) -> Result<LockGuard, Error> {
        match names {
            [name] if lock_calls => self.lock(name, ttl).wait(),
            [name] => self.try_lock(name, ttl).wait(),
            names => self.lock_many(names, ttl).wait(),
        }
    }
    fn attempts(held: &LockGuard) -> u32 {
        held.attempts()
    }
    fn fence(held: &LockGuard) -> Option<u64> {
        held.fencing_token()
    }
    fn valid_until(held: &LockGuard) -> Instant {
        held.valid_until()
    }
    fn release(&mut self, held: LockGuard) -> Result<(), Error> {
        held.release().wait()
    }
}

/// One lock at a time, blocking on each result: `try_lock` (retried at once while taken)
/// or `lock`, critical section, `release`.
fn run_cycles<C: CycleClient>(id: usize, mut client: C, shared: &Shared, out: &mut ClientResult) {
    let mut k = 0usize;
    'run: while !shared.stop.load(Ordering::Relaxed) {
        let r = resource_for(shared, id, 0, k);
        k = k.wrapping_add(1);
        let names = &shared.group[r];
        let t0 = Instant::now();
        let held = loop {
            match client.acquire(names, shared.ttl, shared.lock_calls) {
                Ok(held) => {
                    out.refused += u64::from(C::attempts(&held).saturating_sub(1));
                    break held;
                }
                Err(Error::Taken(report)) => out.taken(shared, &report),
                Err(e) => {
                    out.error(&e);
                    // Do not spin on masters that are down.
                    thread::sleep(Duration::from_millis(1));
                }
            }
            if shared.stop.load(Ordering::Relaxed) {
                break 'run;
            }
            out.retried += 1;
            thread::yield_now();
        };
        let granted = Instant::now();
        out.acquired += 1;
        out.grants[r] += 1;
        out.acquire.saturating_record(micros(granted - t0).max(1));
        critical_section(&shared.counters[r]);

        let release_start = Instant::now();
        let valid_until = C::valid_until(&held);
        let fence = C::fence(&held);
        record_hold(
            shared,
            out,
            r,
            t0,
            (granted, fence),
            release_start,
            valid_until,
        );
        let released = client.release(held);
        let done = Instant::now();
        if let Err(e) = released {
            out.error(&e);
        }
        out.release
            .saturating_record(micros(done - release_start).max(1));
        out.cycle.saturating_record(micros(done - t0).max(1));
        out.cycles += 1;
        shared.cycles.fetch_add(1, Ordering::Relaxed);
        if !shared.think.is_zero() {
            thread::sleep(shared.think);
        }
    }
}

/// `--in-flight K`: K locks per round trip with `try_lock_batch` / `release_batch`. A slot
/// whose attempt was refused tries again in the next batch; its acquire latency runs from
/// its first attempt.
fn run_batched(id: usize, client: &mut Redlock, shared: &Shared, out: &mut ClientResult) {
    let k_slots = shared.in_flight;
    // Per slot: its resource and when its current cycle started (None: not started).
    let mut slots: Vec<(usize, Option<Instant>, u64)> = (0..k_slots)
        .map(|slot| (resource_for(shared, id, slot, 0), None, 0))
        .collect();
    let mut names: Vec<&str> = Vec::with_capacity(k_slots);
    let mut results = Vec::with_capacity(k_slots);
    let mut released = Vec::with_capacity(k_slots);
    let mut held = Vec::with_capacity(k_slots);
    while !shared.stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        names.clear();
        for (r, since, _) in slots.iter_mut() {
            since.get_or_insert(t0);
            names.push(&shared.names[*r]);
        }
        if let Err(e) = client.try_lock_batch(&names, shared.ttl, &mut results) {
            out.error(&e);
            thread::sleep(Duration::from_millis(1));
            continue;
        }
        let granted = Instant::now();
        held.clear();
        for (slot, result) in results.drain(..).enumerate() {
            match result {
                Ok(lock) => {
                    let (r, since, _) = slots[slot];
                    out.acquired += 1;
                    out.grants[r] += 1;
                    let since = since.unwrap_or(t0);
                    out.acquire
                        .saturating_record(micros(granted - since).max(1));
                    critical_section(&shared.counters[r]);
                    held.push((slot, lock));
                }
                Err(Error::Taken(_)) => {
                    out.refused += 1;
                    out.retried += 1;
                }
                Err(e) => {
                    out.error(&e);
                    out.retried += 1;
                }
            }
        }
        if held.is_empty() {
            thread::yield_now();
            continue;
        }
        let release_start = Instant::now();
        for (slot, lock) in &held {
            let r = slots[*slot].0;
            let asked = slots[*slot].1.unwrap_or(t0);
            record_hold(
                shared,
                out,
                r,
                asked,
                (granted, lock.fencing_token()),
                release_start,
                lock.valid_until(),
            );
        }
        let done_slots: Vec<usize> = held.iter().map(|(slot, _)| *slot).collect();
        if shared.release_with_next {
            // Dropped unreleased: the client releases them at its next call, first in the
            // same write as the next batch's locks. The holds recorded above end at
            // `release_start`, before the masters delete the keys: the check stays sound.
            held.clear();
        } else {
            let batch = client.release_batch(held.drain(..).map(|(_, lock)| lock), &mut released);
            if let Err(e) = batch {
                out.error(&e);
            }
            for e in released.drain(..).filter_map(Result::err) {
                out.error(&e);
            }
        }
        let done = Instant::now();
        for slot in done_slots {
            let (r, since, k) = &mut slots[slot];
            if !shared.release_with_next {
                out.release
                    .saturating_record(micros(done - release_start).max(1));
            }
            out.cycle
                .saturating_record(micros(done - since.unwrap_or(t0)).max(1));
            out.cycles += 1;
            shared.cycles.fetch_add(1, Ordering::Relaxed);
            *k += 1;
            *r = resource_for(shared, id, slot, *k as usize);
            *since = None;
        }
    }
}

/// The mutual-exclusion verdict.
struct Check {
    overlaps: u64,
    lost_updates: u64,
    /// Grants whose fencing token was not above the token of the resource's grant before
    /// them (fencing on).
    fence_regressions: u64,
    details: Vec<String>,
}

impl Check {
    fn ok(&self) -> bool {
        self.overlaps == 0 && self.lost_updates == 0 && self.fence_regressions == 0
    }
}

/// Check that no two holds of one resource overlap, and that every resource's counter
/// equals its grants.
fn check_exclusion(names: &[String], counted: &[u64], grants: &[u64], holds: &[Hold]) -> Check {
    let mut check = Check {
        overlaps: 0,
        lost_updates: 0,
        fence_regressions: 0,
        details: Vec::new(),
    };
    let mut holds = holds.to_vec();
    holds.sort_unstable_by_key(|h| (h.resource, h.start));
    // Fencing: each resource's tokens rise with its grants.
    for w in holds.windows(2) {
        let (p, h) = (w[0], w[1]);
        if p.resource == h.resource && p.fence != 0 && h.fence != 0 && h.fence <= p.fence {
            check.fence_regressions += 1;
            if check.details.len() < 10 {
                check.details.push(format!(
                    "{}: fencing token {} granted after {}",
                    names[h.resource as usize], h.fence, p.fence
                ));
            }
        }
    }
    let mut prev: Option<Hold> = None;
    for h in holds {
        match prev {
            Some(p) if p.resource == h.resource && h.start < p.end => {
                check.overlaps += 1;
                if check.details.len() < 10 {
                    check.details.push(format!(
                        "{}: a hold began {} ns after the previous one began and {} ns before \
                         it ended",
                        names[h.resource as usize],
                        h.start - p.start,
                        p.end - h.start
                    ));
                }
                // Keep the later end, so every overlap with the union is found.
                if h.end > p.end {
                    prev = Some(h);
                }
            }
            _ => prev = Some(h),
        }
    }
    for (r, (&counted, &grants)) in counted.iter().zip(grants).enumerate() {
        if counted != grants {
            check.lost_updates += grants.abs_diff(counted);
            if check.details.len() < 20 {
                check.details.push(format!(
                    "{}: counter {counted} != grants {grants}",
                    names[r]
                ));
            }
        }
    }
    check
}

/// What the holds say about waiting for a taken lock.
struct Waiting {
    /// Hand-off latency, µs: from a holder's release start (or the end of its validity) to
    /// the grant of a caller of the same resource that was already waiting then.
    handoff: Histogram<u64>,
    /// Grants that came before the grant of a caller of the same resource that had asked
    /// earlier (overtook a waiter).
    out_of_order: u64,
}

fn waiting(holds: &[Hold]) -> Waiting {
    let mut h = holds.to_vec();
    h.sort_unstable_by_key(|x| (x.resource, x.start));
    let mut handoff = histogram();
    for w in h.windows(2) {
        let (p, x) = (w[0], w[1]);
        if p.resource == x.resource && x.asked <= p.end && x.start >= p.end {
            handoff.saturating_record(((x.start - p.end) / 1000).max(1));
        }
    }
    // Walking the grants of each resource backwards: the earliest ask among the later
    // grants.
    let mut out_of_order = 0;
    let mut earliest_after: Option<(u32, u64)> = None;
    for x in h.iter().rev() {
        earliest_after = match earliest_after {
            Some((r, m)) if r == x.resource => {
                if m < x.asked {
                    out_of_order += 1;
                }
                Some((r, m.min(x.asked)))
            }
            _ => Some((x.resource, x.asked)),
        };
    }
    Waiting {
        handoff,
        out_of_order,
    }
}

/// Everything the end of a run prints.
struct Report<'a> {
    args: &'a BenchArgs,
    masters: &'a [String],
    /// The process ids of the local masters this run started (stopped before it exits).
    local: Option<&'a [u32]>,
    pinning: Option<&'a Pinning>,
    quorum: usize,
    round_timeout: Duration,
    resources: usize,
    elapsed: Duration,
    total: &'a ClientResult,
    /// User and system CPU time of this process during the run, in µs.
    cpu: Option<(f64, f64)>,
    /// What each master did during the run (`None`: a master would not say).
    servers: Option<&'a [MasterSample]>,
    check: &'a Check,
    waiting: &'a Waiting,
}

const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

impl Report<'_> {
    fn throughput(&self) -> f64 {
        self.total.cycles as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn refused_per_grant(&self) -> f64 {
        self.total.refused as f64 / (self.total.acquired.max(1) as f64)
    }

    fn per_cycle(&self, us: f64) -> f64 {
        us / (self.total.cycles.max(1) as f64)
    }

    fn latency_json(h: &Histogram<u64>) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, q) in QUANTILES {
            m.insert(name.to_string(), h.value_at_quantile(q).into());
        }
        m.insert("max".into(), h.max().into());
        m.insert("mean".into(), ((h.mean() * 10.0).round() / 10.0).into());
        m.insert("count".into(), h.len().into());
        serde_json::Value::Object(m)
    }

    /// The masters' CPU time and commands per cycle: summed over the masters, and each
    /// master's own.
    fn servers_json(&self, servers: &[MasterSample]) -> serde_json::Value {
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        let commands = |calls: &std::collections::BTreeMap<String, u64>| {
            let mut m = serde_json::Map::new();
            for (name, n) in calls {
                m.insert(name.clone(), round(self.per_cycle(*n as f64)).into());
            }
            serde_json::Value::Object(m)
        };
        let mut total = std::collections::BTreeMap::new();
        for s in servers {
            for (name, n) in &s.total.calls {
                *total.entry(name.clone()).or_insert(0) += n;
            }
        }
        let cpu: f64 = servers.iter().map(|s| s.total.cpu_us).sum();
        let shard = |name: &String, s: &ServerSample, of: u64| {
            serde_json::json!({
                "node": name,
                "operations": operations(s),
                "share": round(operations(s) as f64 / of.max(1) as f64),
                "cpu_us_per_cycle": (self.per_cycle(s.cpu_us) * 10.0).round() / 10.0,
                "commands_per_cycle": commands(&s.calls),
            })
        };
        serde_json::json!({
            "cpu_us_per_cycle": (self.per_cycle(cpu) * 10.0).round() / 10.0,
            "commands_per_cycle": commands(&total),
            "per_master": servers.iter().zip(self.masters).map(|(s, name)| serde_json::json!({
                "master": name,
                "cpu_us_per_cycle": (self.per_cycle(s.total.cpu_us) * 10.0).round() / 10.0,
                "operations": operations(&s.total),
                "commands_per_cycle": commands(&s.total.calls),
                "shards": (!s.shards.is_empty()).then(|| s.shards.iter()
                    .map(|(n, x)| shard(n, x, operations(&s.total)))
                    .collect::<Vec<_>>()),
            })).collect::<Vec<_>>(),
        })
    }

    fn json(&self) -> serde_json::Value {
        let t = self.total;
        let mode = self.args.mode();
        let cpu = self.cpu.map(|(u, s)| {
            serde_json::json!({
                "user": (self.per_cycle(u) * 10.0).round() / 10.0,
                "system": (self.per_cycle(s) * 10.0).round() / 10.0,
                "total": (self.per_cycle(u + s) * 10.0).round() / 10.0,
            })
        });
        // Set apart: one more field in the json! below runs into the macro's recursion limit.
        let local_servers = self.local.map(|_| {
            serde_json::json!({
                "shards_per_master": (self.args.local_shards > 0).then_some(self.args.local_shards),
                "cpu_cores_each": self.args.shard_cpu,
            })
        });
        let violations =
            self.check.overlaps + self.check.lost_updates + self.check.fence_regressions;
        let exclusion = serde_json::json!({
            "ok": self.check.ok(),
            "violations": violations,
            "overlaps": self.check.overlaps,
            "lost_updates": self.check.lost_updates,
            "fence_regressions": self.check.fence_regressions,
            "grants": t.acquired,
            "holds_checked": t.holds.len(),
            "holds_past_validity": t.overran,
            "details": self.check.details,
        });
        let mut report = serde_json::json!({
            "masters": self.masters,
            "local_masters": self.local.is_some(),
            "local_master_pids": self.local,
            "pinned": self.pinning.map(|p| serde_json::json!({
                "client_cpus": p.clients,
                "master_cpus": p.masters,
            })),
            "quorum": self.quorum,
            "mode": mode.name(),
            "shared_client": mode != Mode::Clients,
            "clients": if mode == Mode::Clients { self.args.clients } else { 1 },
            "callers": (mode != Mode::Clients).then(|| self.args.lockers()),
            "tokio_worker_threads": (mode == Mode::Tasks).then_some(TOKIO_WORKERS),
            "in_flight": self.args.in_flight(),
            "release_with_next": self.args.release_with_next,
            "resources": self.resources,
            "ttl_ms": self.args.ttl.as_millis() as u64,
            "round_timeout_ms": self.round_timeout.as_secs_f64() * 1000.0,
            "busy_poll": self.args.busy_poll,
            "wait_mode": self.args.wait_mode.name(),
            "fair": self.args.fair,
            "think_us": self.args.think.map_or(0, |t| t.as_micros() as u64),
            "elapsed_s": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "cycles": t.cycles,
            "throughput_per_s": self.throughput().round(),
            "acquired": t.acquired,
            "refused": t.refused,
            "refused_per_grant": (self.refused_per_grant() * 1000.0).round() / 1000.0,
            "gave_up": t.gave_up,
            "out_of_order": self.waiting.out_of_order,
            "retried": t.retried,
            "errors": t.errors,
            "first_error": t.first_error,
            "latency_us": {
                "acquire": Self::latency_json(&t.acquire),
                "release": Self::latency_json(&t.release),
                "cycle": Self::latency_json(&t.cycle),
                "handoff": Self::latency_json(&self.waiting.handoff),
            },
            "cpu_us_per_cycle": cpu,
            "servers": self.servers.map(|s| self.servers_json(s)),
            "mutual_exclusion": exclusion,
        });
        report["local_servers"] = local_servers.into();
        report
    }

    fn print(&self) {
        let t = self.total;
        let a = self.args;
        let k = a.lockers();
        let who = match a.mode() {
            Mode::Clients if a.in_flight > 1 => format!(
                "{k} client{} x {} in flight{}",
                if k == 1 { "" } else { "s" },
                a.in_flight,
                if a.release_with_next {
                    " (releases sent with the next batch)"
                } else {
                    ""
                }
            ),
            Mode::Clients => format!("{k} client{}", if k == 1 { "" } else { "s" }),
            Mode::Callers => format!(
                "{k} thread{} sharing one SharedRedlock",
                if k == 1 { "" } else { "s" }
            ),
            Mode::Tasks => format!(
                "{k} tokio task{} sharing one SharedRedlock ({TOKIO_WORKERS} worker thread{})",
                if k == 1 { "" } else { "s" },
                if TOKIO_WORKERS == 1 { "" } else { "s" }
            ),
        };
        out!(
            "redlock bench: {} {}masters (quorum {}), {who}, {} resource{}, ttl {}, {:.2} s{}",
            self.masters.len(),
            if self.local.is_some() { "local " } else { "" },
            self.quorum,
            self.resources,
            if self.resources == 1 { "" } else { "s" },
            humantime::format_duration(a.ttl),
            self.elapsed.as_secs_f64(),
            if a.busy_poll { ", busy-poll" } else { "" },
        );
        if self.local.is_some() && (a.local_shards > 0 || a.shard_cpu.is_some()) {
            out!(
                "local servers: {}{}",
                if a.local_shards > 0 {
                    format!(
                        "each master a cluster of {} shard primaries",
                        a.local_shards
                    )
                } else {
                    "single servers".to_string()
                },
                a.shard_cpu
                    .map(|c| format!(", each server's CPU limited to {c} of a core (cgroup quota)"))
                    .unwrap_or_default()
            );
        }
        if a.wait_mode != WaitArg::Spin {
            out!(
                "waiting: lock() with WaitMode::{}{}, default retries (10 x 200 ms +- 100 ms)",
                if a.wait_mode == WaitArg::Poll {
                    "Poll"
                } else {
                    "Notify"
                },
                if a.fair { ", fairness on" } else { "" }
            );
        }
        if let Some(t) = a.think {
            out!(
                "think: each caller waits {} after its release before it asks again",
                humantime::format_duration(t)
            );
        }
        if let Some(p) = self.pinning {
            out!(
                "pinned: client thread{} on CPU {}, masters on CPU {}",
                if a.clients == 1 { "" } else { "s" },
                cpu_list(&p.clients),
                cpu_list(&p.masters)
            );
        } else if self.local.is_some() && a.mode() == Mode::Clients {
            out!("unpinned: clients and masters on any CPU (--pin to pin)");
        } else if self.local.is_some() {
            out!("unpinned: callers, the shared client's loop thread and masters on any CPU");
        }
        out!();
        out_part!("{:<10}", "latency");
        for (name, _) in QUANTILES {
            out_part!("{name:>10}");
        }
        out!("{:>10}", "max");
        let handoff = &self.waiting.handoff;
        for (name, h) in [
            ("acquire", &t.acquire),
            ("release", &t.release),
            ("cycle", &t.cycle),
            ("hand-off", handoff),
        ] {
            if h.is_empty() {
                continue;
            }
            out_part!("{name:<10}");
            for (_, q) in QUANTILES {
                out_part!("{:>10}", human_micros(h.value_at_quantile(q) as f64));
            }
            out!("{:>10}", human_micros(h.max() as f64));
        }
        out!();
        out!(
            "throughput    {} cycles/s ({} cycles in {:.2} s)",
            thousands(self.throughput().round() as u64),
            thousands(t.cycles),
            self.elapsed.as_secs_f64()
        );
        out!(
            "counts        acquired {}, refused (taken) {}, retried {}, errors {}",
            thousands(t.acquired),
            thousands(t.refused),
            thousands(t.retried),
            thousands(t.errors)
        );
        if let Some(e) = &t.first_error {
            out!("first error   {e}");
        }
        if t.refused > 0 || !handoff.is_empty() {
            out!(
                "waiting       {} hand-offs (a release to the grant of a caller already waiting), \
                 {:.2} refused attempts per grant, {} grants out of arrival order{}",
                thousands(handoff.len()),
                self.refused_per_grant(),
                thousands(self.waiting.out_of_order),
                if a.wait_mode == WaitArg::Spin {
                    String::new()
                } else {
                    format!(
                        ", {} lock() calls used up their retries",
                        thousands(t.gave_up)
                    )
                }
            );
        }
        if let Some((u, s)) = self.cpu {
            out!(
                "client CPU    {:.1} µs per cycle ({:.1} µs user + {:.1} µs system)",
                self.per_cycle(u + s),
                self.per_cycle(u),
                self.per_cycle(s)
            );
        }
        if let Some(servers) = self.servers {
            let cpu: f64 = servers.iter().map(|s| s.total.cpu_us).sum();
            let mut calls = std::collections::BTreeMap::new();
            for s in servers {
                for (name, n) in &s.total.calls {
                    *calls.entry(name.as_str()).or_insert(0u64) += n;
                }
            }
            // Per master: what one master runs for a cycle (scripts' own commands counted).
            let per_master = servers.len().max(1) as f64;
            let commands: Vec<String> = calls
                .iter()
                .map(|(name, n)| format!("{name} {:.2}", self.per_cycle(*n as f64) / per_master))
                .filter(|c| !c.ends_with(" 0.00"))
                .collect();
            out!(
                "server CPU    {:.1} µs per cycle over {} masters; per master and cycle: {}",
                self.per_cycle(cpu),
                servers.len(),
                commands.join(", ")
            );
            // Cluster masters: how the operations spread over the shard primaries.
            for (s, name) in servers.iter().zip(self.masters) {
                if s.shards.is_empty() {
                    continue;
                }
                let all = operations(&s.total).max(1) as f64;
                let each: Vec<String> = s
                    .shards
                    .iter()
                    .map(|(node, x)| {
                        format!(
                            "{node} {} ({:.0}%, {:.1} µs CPU/cycle)",
                            thousands(operations(x)),
                            100.0 * operations(x) as f64 / all,
                            self.per_cycle(x.cpu_us)
                        )
                    })
                    .collect();
                out!(
                    "shards        {name}: {} shard{}, operations {}",
                    s.shards.len(),
                    if s.shards.len() == 1 { "" } else { "s" },
                    each.join(", ")
                );
            }
        }
        if self.check.ok() {
            out!(
                "mutual excl.  ok: {} holds on {} resource{} checked, no overlap, counters match grants",
                thousands(t.holds.len() as u64),
                self.resources,
                if self.resources == 1 { "" } else { "s" }
            );
        } else {
            out!(
                "mutual excl.  VIOLATED: {} overlapping holds, {} lost counter updates, {} \
                 fencing tokens not above the one before",
                self.check.overlaps,
                self.check.lost_updates,
                self.check.fence_regressions
            );
        }
        if t.overran > 0 {
            out!(
                "warning       {} holds were released after their validity ended",
                t.overran
            );
        }
    }
}

/// How long the checks and warm-ups before a measurement retry rounds that found too few
/// masters answering in time (connections still being made, a loaded machine): a master
/// that answers none of them in this time counts as down.
const WARM_UP_LIMIT: Duration = Duration::from_secs(1);

/// Warm-up of client (or caller) `id`: 20 lock + release cycles through `cycle`, each on a
/// key of its own. The first rounds carry the connections: those that find too few
/// masters in time are tried again, for [`WARM_UP_LIMIT`] (a key per cycle: one whose
/// release got no quorum in time may still be held somewhere). The error that ended it,
/// if any.
fn warm_up(
    shared: &Shared,
    id: usize,
    mut cycle: impl FnMut(&str) -> Result<(), Error>,
) -> Option<String> {
    let until = Instant::now() + WARM_UP_LIMIT;
    let (mut k, mut warmed) = (0, 0);
    while warmed < 20 {
        let warm = format!("{}:warmup:{id}:{k}", shared.names[0]);
        k += 1;
        match cycle(&warm) {
            Ok(()) => warmed += 1,
            Err(e) if passing(&e) && Instant::now() < until => {}
            Err(e) => return Some(e.to_string()),
        }
    }
    None
}

/// A lock round's failure that a later round may not have: too few answers in time (no
/// quorum, or its validity used up by a slow round). Refusals, wrong arguments and the
/// like are for good.
fn passing(e: &Error) -> bool {
    matches!(e, Error::NoQuorum(_) | Error::ValidityUsedUp(_))
}

/// Before measuring: every master must answer a lock round (connect, handshake, a yes).
/// With one down, the figures would measure a degraded cluster without saying so: refuse
/// (exit 69), naming the masters, unless `--allow-degraded`.
fn check_every_master(probe: &mut Redlock, ttl: Duration) -> Option<u8> {
    let key = format!("redlock-bench:probe:{}", std::process::id());
    // Rounds until every master answered, for a second at most: the client runs its
    // loop only inside its calls, and a round is decided at a quorum, so a master still
    // connecting answers a later round. So does a quorum still connecting: the first
    // round carries the connections (a cluster master's discovery and its shards'), and
    // on a loaded machine they can take longer than a round's timeout.
    let until = Instant::now() + WARM_UP_LIMIT;
    while Instant::now() < until {
        match probe.try_lock(&key, ttl) {
            Ok(lock) => {
                let _ = probe.release(lock);
            }
            Err(e) if passing(&e) => {}
            Err(e) => {
                say!("cannot lock on the masters: {e}");
                return Some(crate::run::error_code(&e));
            }
        }
        let stats = probe.stats();
        // A master that is the same server as one listed before it is sent no grants.
        if stats
            .iter()
            .all(|s| s.ok() > 0 || s.same_server_as().is_some())
        {
            crate::common::warn_same_servers(&stats);
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let down: Vec<String> = probe
        .stats()
        .iter()
        .filter(|s| s.ok() == 0)
        .map(|s| match s.last_fault() {
            Some(f) => format!("{} ({f})", s.name()),
            None => format!("{} (no answer)", s.name()),
        })
        .collect();
    say!(
        "not measuring with a master down: {}; pass --allow-degraded to measure anyway",
        down.join(", ")
    );
    Some(exit::UNAVAILABLE)
}

/// What one master had done at some instant: its CPU time (`INFO cpu`: `used_cpu_sys` +
/// `used_cpu_user`, in µs) and the calls of each command (`INFO commandstats`, which
/// counts the commands scripts run too), or, from [`ServerSample::since`], during a run.
struct ServerSample {
    cpu_us: f64,
    /// Calls by command name (lowercase), `info` left out (the samples' own).
    calls: std::collections::BTreeMap<String, u64>,
}

impl ServerSample {
    /// What the master did between `earlier` and this sample.
    fn since(&self, earlier: &ServerSample) -> ServerSample {
        ServerSample {
            cpu_us: (self.cpu_us - earlier.cpu_us).max(0.0),
            calls: self
                .calls
                .iter()
                .map(|(k, n)| {
                    (
                        k.clone(),
                        n - earlier.calls.get(k).copied().unwrap_or(0).min(*n),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        }
    }

    /// Read from the texts of `INFO cpu` and `INFO commandstats`.
    fn parse(cpu: &str, commandstats: &str) -> Option<ServerSample> {
        let mut cpu_us = None::<f64>;
        for line in cpu.lines() {
            let line = line.trim_end();
            for key in ["used_cpu_sys:", "used_cpu_user:"] {
                if let Some(v) = line.strip_prefix(key) {
                    let s: f64 = v.parse().ok()?;
                    cpu_us = Some(cpu_us.unwrap_or(0.0) + s * 1e6);
                }
            }
        }
        let mut calls = std::collections::BTreeMap::new();
        for line in commandstats.lines() {
            // `cmdstat_set:calls=12,usec=34,...` (`cmdstat_client|list` for subcommands).
            let Some((name, rest)) = line
                .trim_end()
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let n = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok());
            if let (Some(n), false) = (n, name.eq_ignore_ascii_case("info")) {
                calls.insert(name.to_ascii_lowercase(), n);
            }
        }
        Some(ServerSample {
            cpu_us: cpu_us?,
            calls,
        })
    }
}

/// What one master did: its [`ServerSample`], summed over its shard primaries for a
/// cluster master, and each shard's own (`host:port`; empty for a single server).
struct MasterSample {
    total: ServerSample,
    shards: Vec<(String, ServerSample)>,
}

impl MasterSample {
    fn since(&self, earlier: &MasterSample) -> MasterSample {
        MasterSample {
            total: self.total.since(&earlier.total),
            shards: self
                .shards
                .iter()
                .zip(&earlier.shards)
                .map(|((name, b), (_, a))| (name.clone(), b.since(a)))
                .collect(),
        }
    }
}

/// The nodes whose `INFO` makes each master's sample: the server itself, or every shard
/// primary of a cluster master (found once, before the run, with `CLUSTER SHARDS`, or
/// `CLUSTER SLOTS` before Redis 7).
struct SampleNodes {
    tls: crate::conn::Tls,
    /// Per master: is it a cluster, and its nodes (`host:port`, the node as a master).
    masters: Vec<(bool, Vec<(String, redlock_mux::MasterSpec)>)>,
}

/// The nodes to sample (`None`, with a warning for a cluster whose shards cannot be
/// found: then the report has no `servers`).
fn sample_nodes(args: &BenchArgs, urls: &[String]) -> Option<SampleNodes> {
    let specs = urls
        .iter()
        .map(|u| redlock_mux::MasterSpec::parse(u).ok())
        .collect::<Option<Vec<_>>>()?;
    let tls = crate::conn::tls_setup(&args.masters, &specs).ok()?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut masters = Vec::with_capacity(specs.len());
    for spec in specs {
        if !spec.cluster {
            masters.push((false, vec![(spec.to_string(), spec)]));
            continue;
        }
        match crate::conn::shards(&spec, deadline, &tls) {
            Ok(shards) => masters.push((
                true,
                shards.into_iter().map(|s| (s.name(), s.spec)).collect(),
            )),
            Err(e) => {
                if !args.json {
                    say!("no server figures: cannot find the shards of {spec}: {e}");
                }
                return None;
            }
        }
    }
    Some(SampleNodes { tls, masters })
}

/// Every master's [`MasterSample`] now, over a connection of its own to each node (`None`
/// when one cannot be reached or will not say: then the report has no `servers`).
fn server_samples(nodes: &SampleNodes) -> Option<Vec<MasterSample>> {
    use crate::conn::{Session, Val};
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut out = Vec::with_capacity(nodes.masters.len());
    for (cluster, list) in &nodes.masters {
        let mut total = ServerSample {
            cpu_us: 0.0,
            calls: std::collections::BTreeMap::new(),
        };
        let mut shards = Vec::new();
        for (name, spec) in list {
            let mut s = Session::open(spec, deadline, &nodes.tls).ok()?;
            let replies = s
                .pipeline(&[
                    vec!["INFO".into(), "cpu".into()],
                    vec!["INFO".into(), "commandstats".into()],
                ])
                .ok()?;
            let text = |v: &Val| match v {
                Val::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            };
            let sample = ServerSample::parse(&text(&replies[0])?, &text(&replies[1])?)?;
            total.cpu_us += sample.cpu_us;
            for (k, n) in &sample.calls {
                *total.calls.entry(k.clone()).or_insert(0) += n;
            }
            if *cluster {
                shards.push((name.clone(), sample));
            }
        }
        out.push(MasterSample { total, shards });
    }
    Some(out)
}

/// A node's operations: every command it ran, those of scripts included, except the
/// samples' own `INFO` and the clients' cluster discovery (`CLUSTER ...`).
fn operations(s: &ServerSample) -> u64 {
    s.calls
        .iter()
        .filter(|(name, _)| !name.starts_with("cluster"))
        .map(|(_, n)| n)
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_samples_read_cpu_and_command_calls() {
        let cpu = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.0\r\n";
        let stats = "# Commandstats\r\ncmdstat_set:calls=10,usec=5,usec_per_call=0.5\r\ncmdstat_info:calls=3,usec=1\r\ncmdstat_client|list:calls=2,usec=1\r\n";
        let a = super::ServerSample::parse(cpu, stats).unwrap();
        assert_eq!(a.cpu_us, 1_750_000.0);
        assert_eq!(a.calls.get("set"), Some(&10));
        assert_eq!(a.calls.get("client|list"), Some(&2));
        assert_eq!(
            a.calls.get("info"),
            None,
            "the samples' own INFO is left out"
        );
        let stats = "cmdstat_set:calls=14,usec=7\r\ncmdstat_get:calls=4,usec=1\r\n";
        let b = super::ServerSample::parse("used_cpu_sys:2.0\r\nused_cpu_user:0.25\r\n", stats);
        let d = b.unwrap().since(&a);
        assert_eq!(d.cpu_us, 500_000.0);
        assert_eq!(d.calls.get("set"), Some(&4));
        assert_eq!(d.calls.get("get"), Some(&4));
        assert_eq!(d.calls.get("client|list"), None);
        assert!(super::ServerSample::parse("no cpu here", "").is_none());
    }

    use super::*;

    fn hold(resource: u32, start: u64, end: u64) -> Hold {
        Hold {
            fence: 0,
            resource,
            asked: start,
            start,
            end,
        }
    }

    #[test]
    fn hand_offs_and_arrival_order() {
        let h = |resource, asked, start, end| Hold {
            fence: 0,
            resource,
            asked,
            start,
            end,
        };
        // Resource 0: B waited from 5 µs while A held until 20 µs, granted at 50 µs; C
        // asked at 60 µs, after B's release began (no hand-off, but in order). Resource 1:
        // E asked before D and was granted after it.
        let w = waiting(&[
            h(0, 0, 1_000, 20_000),
            h(0, 5_000, 50_000, 70_000),
            h(0, 80_000, 90_000, 95_000),
            h(1, 2_000, 10_000, 11_000),
            h(1, 1_000, 30_000, 31_000),
        ]);
        assert_eq!(w.handoff.len(), 2, "B after A, E after D");
        assert_eq!(w.handoff.min(), 19);
        assert_eq!(w.handoff.max(), 30);
        assert_eq!(w.out_of_order, 1, "D overtook E");
    }

    #[test]
    fn the_checker_finds_overlaps_and_lost_updates() {
        let names = vec!["a".to_string(), "b".to_string()];
        // Back to back (end == next start) is not an overlap; resources are independent.
        let ok = check_exclusion(
            &names,
            &[2, 1],
            &[2, 1],
            &[hold(0, 10, 20), hold(0, 20, 30), hold(1, 15, 25)],
        );
        assert!(ok.ok(), "{:?}", ok.details);
        // One hold inside a long one, then one overlapping the long one's tail only.
        let bad = check_exclusion(
            &names,
            &[3, 1],
            &[3, 1],
            &[
                hold(0, 10, 100),
                hold(0, 20, 30),
                hold(0, 90, 120),
                hold(1, 0, 5),
            ],
        );
        assert_eq!(bad.overlaps, 2, "{:?}", bad.details);
        let lost = check_exclusion(&names, &[2, 1], &[3, 1], &[]);
        assert_eq!((lost.overlaps, lost.lost_updates), (0, 1));
        assert!(!lost.ok());
        // Fencing tokens rise with the grants of a resource (0: no token).
        let fenced = |f: [u64; 3]| {
            let mut h = [hold(0, 10, 20), hold(0, 20, 30), hold(0, 30, 40)];
            for (h, f) in h.iter_mut().zip(f) {
                h.fence = f;
            }
            check_exclusion(&names[..1], &[3], &[3], &h)
        };
        assert!(fenced([1, 2, 7]).ok());
        assert!(fenced([0, 0, 0]).ok());
        assert_eq!(fenced([1, 3, 3]).fence_regressions, 1);
        assert_eq!(fenced([5, 2, 9]).fence_regressions, 1);
    }

    #[test]
    fn the_critical_section_loses_updates_without_a_lock() {
        // Shows the counter check can fail: unsynchronised holders lose increments. Whether
        // the threads interleave in one try depends on the scheduler (on a loaded machine
        // they may run one after another): try again, a bounded number of times.
        let per_thread = 20_000u64;
        let threads = 4u64;
        let lost = (0..50).any(|_| {
            let counter = AtomicU64::new(0);
            thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for _ in 0..per_thread {
                            critical_section(&counter);
                        }
                    });
                }
            });
            counter.load(Ordering::SeqCst) < threads * per_thread
        });
        assert!(lost, "no increment was lost in 50 tries");
    }

    #[test]
    fn the_async_critical_section_loses_updates_without_a_lock() {
        // The same for --tasks: tasks on one worker thread interleave at the yield.
        let counter = Arc::new(AtomicU64::new(0));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(TOKIO_WORKERS)
            .build()
            .unwrap();
        let (tasks, per_task) = (4u64, 1000u64);
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..tasks {
                let counter = counter.clone();
                set.spawn(async move {
                    for _ in 0..per_task {
                        critical_section_async(&counter).await;
                    }
                });
            }
            while let Some(r) = set.join_next().await {
                r.unwrap();
            }
        });
        assert!(counter.load(Ordering::SeqCst) < tasks * per_task);
    }
}
