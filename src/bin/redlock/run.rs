//! `redlock run`: run a command while holding a lock, keep the lock extended while it
//! runs, release it once no process of the command is left.
//!
//! The promise: COMMAND never runs without the lock. Decisions, each also in `--help`:
//! * redlock killed: COMMAND's leader gets SIGKILL from the kernel (parent-death signal,
//!   set by the exec helper) and the rest of its process group from the watchdog
//!   (child.rs). A watchdog, not just the signal: background jobs are common in the
//!   scripts this runs (`a & b; wait`), and the signal reaches the direct child only.
//! * Ctrl-Z: COMMAND's group is stopped first (SIGSTOP), then redlock. Continued, redlock
//!   lets the group go on only while the lock is valid for more than the extension margin,
//!   and SIGKILLs it if the lock expired meanwhile (it never ran without the lock). Stopping
//!   rather than ignoring SIGTSTP: a Ctrl-Z that does nothing surprises people, one that
//!   stops the job as usual and costs the lock only if it lasts does not. SIGSTOP to
//!   redlock cannot be caught (documented).
//! * COMMAND's exit: the lock is released only after every process of its process group
//!   is gone (reaped); while some run, the lock is held and extended, however long. A
//!   release while a job runs would break the promise; a job that never ends is the
//!   user's to end (SIGTERM to redlock is forwarded to it).
//! * Messages never panic and come after the signals they report.

use std::ffi::OsString;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use nix::errno::Errno;
use nix::sys::signal::{kill, pthread_sigmask, raise, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use redlock_mux::{
    CancelHandle, Error, Fault, HoldOptions, Lock, LockSignal, Outcome, Redlock, Report, TlsFault,
};
use signal_hook::consts::{SIGCHLD, SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP};
use signal_hook::iterator::Signals;

use crate::child::{self, Watchdog};
use crate::common::{exit, human_duration, say};
use crate::{duration, MasterArgs};

pub const USAGE: &str = "\
redlock run [OPTIONS] RESOURCE [--] COMMAND [ARGS]...
       redlock run [OPTIONS] RESOURCE -c CMD";

pub const AFTER_HELP: &str = "\
Like flock(1): COMMAND starts at the first word after RESOURCE (`--` is optional; every
word after COMMAND is COMMAND's, options included), or -c CMD runs `sh -c CMD`. Durations
are seconds (10, 0.5) or a number with a unit (30s, 1m30s, 1.5s, 250ms).

How it works:
  Takes the lock, runs COMMAND in its own process group, extends the lock whenever a third
  of its validity is left, and releases it once no process of that group is left (see
  below). The lock is lost when an extension fails (no quorum, or no longer held) or its
  validity runs out; then COMMAND's process group gets SIGTERM, and SIGKILL after
  --kill-grace.
  SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to redlock are forwarded to COMMAND's process
  group (followed by SIGCONT). Because COMMAND has its own process group it cannot use the
  terminal interactively (reading from it stops it, and redlock says so): run
  non-interactive commands, as from cron or scripts.
  An extension that gets no quorum of answers is retried (on fresh connections) until the
  lost margin is reached: --kill-grace plus two round timeouts before the lock's end (at
  least a tenth of the TTL; extensions start at twice that, and at least at a third).
  Then the lock counts as lost, and COMMAND is gone before the lock can expire. Keep
  --kill-grace plus two round timeouts below 0.45 x --ttl (the defaults, 5s and 30s, do);
  redlock warns otherwise.

Waiting for the lock:
  As flock: without -w (or with -w inf, -w forever) run waits until the lock is free;
  with -w N it gives up after N seconds (the last attempt starts then); -n (or -w 0)
  tries once. While waiting it stands in the resource's line on the masters and tries
  again when the holder's release is announced, or its keys expire, at the latest 200ms
  (+-100ms) after its last attempt. Masters that are taken, time out or are down are
  waited for; after -w, redlock says what each master did in the last attempt (taken:
  exit 1; no quorum: exit 69). What waiting cannot change fails at once: masters refuse
  this client (handshake refused: wrong or missing password, unknown user, no right to a
  command, bad database; an ACL without the right to the lock's key; a TLS certificate
  that does not verify, or one the master refuses; not durable enough for --fencing; the
  same server listed twice) so that no quorum is possible, or while no other master
  answers; a rediss:// master whose port speaks plain RESP: exit 64, naming them and
  why; every master refuses the connection (nothing listens: wrong ports, Redis not
  running): exit 69. Refusals for the moment (LOADING after a restart, BUSY with a
  script, too many clients) are waited for.

COMMAND's environment:
  REDLOCK_RESOURCE        RESOURCE
  REDLOCK_TOKEN           the lock's token (32 hex characters). It is a capability: with
                          it anyone can release or extend the lock. Do not log it or pass
                          it on to anything you would not let hold the lock
  REDLOCK_FENCING_TOKEN   with --fencing: the lock's fencing token, a number that
                          increases from one holder of RESOURCE to the next; send it with
                          each write to the protected resource, which should refuse a token
                          lower than one it has seen. Fencing needs every master to persist
                          every write (appendonly yes, appendfsync always): other masters
                          get no vote. Without --fencing this variable is removed (an outer
                          run's does not leak in)
  No validity deadline is passed: the environment is fixed when COMMAND starts and the
  validity moves with every extension; redlock itself ends COMMAND before the lock can
  expire (see above).

COMMAND does not run without the lock:
  Background jobs: the lock is held, and extended, until every process of COMMAND's
  process group has exited, not only COMMAND: `sh -c 'job & exit 0'` keeps it until job
  ends, however long that is (end it with a signal to redlock, which is forwarded).
  Processes that leave the group (setsid, setpgid: daemons) are neither waited for nor
  killed: do not run daemons under redlock.
  redlock killed (SIGKILL, the OOM killer, a crash): COMMAND gets SIGKILL from the kernel
  at once (a parent-death signal, set by redlock's exec helper before COMMAND starts), and
  a watchdog process (`redlock __watchdog`, in a process group of its own, blocking
  SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGTSTP) SIGKILLs the rest of COMMAND's process
  group. If the watchdog is killed as well (`kill -9` of both, say), background jobs of
  COMMAND may outlive the lock; redlock warns when it sees the watchdog gone.
  Ctrl-Z (SIGTSTP): redlock stops COMMAND's process group (SIGSTOP), then itself. When
  continued (fg, bg, SIGCONT), it lets COMMAND go on only while the lock is valid for
  more than a third of the TTL (waiting for an extension otherwise); if the lock was lost
  meanwhile, COMMAND's group gets SIGKILL without running again and redlock exits with
  --lost-exit-code. SIGSTOP to redlock itself (`kill -STOP`) cannot be caught: COMMAND runs
  on while redlock is stopped, and the lock expires after the TTL; so does anything that
  pauses redlock alone (a debugger, a frozen cgroup). Send SIGTSTP instead.

Exit status:
  COMMAND's exit status   COMMAND ran and exited (128+N if it was killed by signal N); its
                          background jobs in its process group have exited too
  1 (-E N)                the lock is held by someone else (after --wait, or at once
                          with --no-wait); COMMAND did not run
  75 (--lost-exit-code)   the lock was lost before COMMAND finished; COMMAND (its whole
                          process group) was terminated if still running
  64                      usage or configuration error (no masters, bad URL, bad
                          duration; masters refusing this client, such as a wrong
                          password, see above); COMMAND did not run
  69                      no quorum of masters answered within --wait, or every master
                          refused the connection (at once); COMMAND did not run
  71                      local OS error (event loop, signals, starting the watchdog or the
                          exec helper); COMMAND did not run, or was killed
  126, 127                COMMAND could not be executed / was not found; reported by the
                          exec helper once the lock was held (and released after), so a
                          COMMAND that itself exits 126 or 127 looks the same, as in shells
  128+N                   redlock got signal N before COMMAND started

Examples (crontab on several hosts: the nightly backup runs on one of them; a report
waits up to 30 seconds for the previous one):
  REDLOCK_MASTERS=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
  0 3 * * *    redlock run -n -q -E 0 backup-nightly /usr/local/bin/backup.sh --full
  */5 * * * *  redlock run -w 30 report -c 'rollup.sh && publish.sh'";

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// Lock time-to-live. The lock is extended while COMMAND runs, so this bounds how long
    /// the lock outlives a redlock that died, not how long COMMAND may run.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
    ttl: Duration,
    /// Wait up to this long for the lock, retrying while it is taken or no quorum
    /// answers (`-w 10`: ten seconds, as for flock). Without -w, or with `-w inf` or `-w
    /// forever`, wait until the lock is free, as flock does.
    #[arg(
        short,
        long,
        value_name = "DURATION",
        value_parser = wait_limit,
        conflicts_with = "no_wait"
    )]
    wait: Option<Wait>,
    /// Try once and fail at once if the lock is taken (like `flock -n`).
    #[arg(short, long)]
    no_wait: bool,
    /// Exit status when the lock is held by someone else (like `flock -E`).
    #[arg(short = 'E', long, value_name = "N", default_value_t = exit::CONFLICT)]
    conflict_exit_code: u8,
    /// Exit status when the lock was lost while COMMAND ran (COMMAND is terminated).
    #[arg(long, value_name = "N", default_value_t = exit::LOST)]
    lost_exit_code: u8,
    /// After the lock is lost: time between SIGTERM and SIGKILL to COMMAND [default: 5s,
    /// or a sixth of --ttl if that is less].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    kill_grace: Option<Duration>,
    /// How long one round (acquire, extend or release on all masters at once) waits for
    /// the masters' answers [default: TTL / 100, within 50ms..500ms]. An extension that
    /// gets no quorum in time is retried until the lost margin (see below).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    round_timeout: Option<Duration>,
    /// Take the lock with a fencing token, passed to COMMAND as REDLOCK_FENCING_TOKEN.
    /// Needs masters with `appendonly yes` and `appendfsync always` (others get no vote).
    #[arg(long)]
    fencing: bool,
    /// Say nothing when the lock is held by someone else (cron mails stay quiet); other
    /// errors are still reported.
    #[arg(short, long, conflicts_with = "verbose")]
    quiet: bool,
    /// Report acquire, extend and release on stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Pass a single command to the shell: run `sh -c CMD` (like `flock -c`).
    #[arg(
        short = 'c',
        long = "command",
        value_name = "CMD",
        conflicts_with = "command"
    )]
    shell_command: Option<OsString>,
    /// The lock's name (the Redis key).
    #[arg(value_name = "RESOURCE")]
    resource: String,
    /// The command to run, and its arguments. It starts at the first word after RESOURCE
    /// (or after `--`): every word from there on, options included, is COMMAND's.
    // `trailing_var_arg`: once COMMAND started, clap parses nothing more, a `--` included;
    // without `allow_hyphen_values`, options between RESOURCE and COMMAND are redlock's.
    #[arg(
        trailing_var_arg = true,
        num_args = 1..,
        value_name = "COMMAND",
        required_unless_present = "shell_command"
    )]
    command: Vec<OsString>,
}

/// How long `run` waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until it is free (no `-w`, `-w inf`, `-w forever`), as flock without `-w`.
    Forever,
    /// At most this long (`-w 0` or `-n`: one attempt).
    For(Duration),
}

/// `-w`'s value: a duration, or `inf`, `infinity`, `forever` (any case).
fn wait_limit(s: &str) -> Result<Wait, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "inf" | "infinity" | "forever" => Ok(Wait::Forever),
        _ => duration(s)
            .map(Wait::For)
            .map_err(|e| format!("{e}; or inf (forever) to wait until the lock is free")),
    }
}

/// Longest time the supervisor sleeps before checking the command and the lock again.
const POLL: Duration = Duration::from_millis(50);

impl RunArgs {
    /// The program and arguments to run: COMMAND, or `sh -c CMD`.
    fn argv(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(cmd) => vec!["sh".into(), "-c".into(), cmd.clone()],
            None => self.command.clone(),
        }
    }

    /// How long to wait for the lock.
    fn wait(&self) -> Wait {
        if self.no_wait {
            return Wait::For(Duration::ZERO);
        }
        self.wait.unwrap_or(Wait::Forever)
    }

    /// One attempt only (`-n`, `-w 0`).
    fn no_wait(&self) -> bool {
        self.wait() == Wait::For(Duration::ZERO)
    }

    /// `--kill-grace`, or its default: 5 s, or a sixth of the TTL if that is less.
    fn kill_grace(&self) -> Duration {
        self.kill_grace
            .unwrap_or_else(|| Duration::from_secs(5).min(self.ttl / 6))
    }
}

fn is_terminating(sig: i32) -> bool {
    matches!(sig, SIGINT | SIGTERM | SIGHUP | SIGQUIT)
}

/// What the signal thread, the main thread and the supervisor share about COMMAND's
/// process group. Job control (stop, continue) is signalled to the group under this lock
/// only, so that a stop and a continue never cross.
#[derive(Debug, Default)]
struct Job {
    /// The lock is being acquired: a terminating signal cancels the attempt.
    acquiring: bool,
    /// A terminating signal came while acquiring: the client is cancelled again every few
    /// ms until the acquisition ends (see `recancel`).
    recancelling: bool,
    /// COMMAND's process group (the PID of its leader, the exec helper), from the spawn
    /// until the group is seen empty; after that its number may be reused: never signal it.
    group: Option<Pid>,
    /// The exec helper has stopped itself, waiting to be continued. Before that, stopping
    /// the group would be mistaken for the helper's own stop.
    started: bool,
    /// The group is stopped by redlock and stays so until the supervisor has checked the
    /// lock: from the spawn to the first continue, and again from each Ctrl-Z.
    held: bool,
}

/// Cancel the client again every 2 ms until the acquisition has ended. A cancel reaches
/// only the lock call running when it is sent (it never cancels a later, unrelated call),
/// and acquiring is a few calls in a row: a signal that came between two of them would
/// otherwise be dropped, and the wait would run on to `--wait`. Bounded: the calls end at
/// the first cancel they see; the loop gives up after 10 s in any case.
fn recancel(job: Arc<Mutex<Job>>, cancel: CancelHandle) {
    thread::spawn(move || {
        for _ in 0..5_000 {
            thread::sleep(Duration::from_millis(2));
            if !lock_job(&job).acquiring {
                return;
            }
            cancel.cancel();
        }
    });
}

fn lock_job(job: &Mutex<Job>) -> MutexGuard<'_, Job> {
    job.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The target of `kill` for process group `pgid`.
fn group_of(pgid: Pid) -> Pid {
    Pid::from_raw(-pgid.as_raw())
}

/// Ctrl-Z (SIGTSTP), on the signal thread under the job lock: stop COMMAND's process group,
/// then redlock itself, so that COMMAND never runs while nobody keeps the lock. Returns
/// once redlock is continued; the group stays stopped ("held") until the supervisor has
/// seen the lock still valid.
fn stop_job(job: &mut Job) {
    if let (Some(pgid), true) = (job.group, job.started) {
        let _ = kill(group_of(pgid), Signal::SIGSTOP);
        job.held = true;
    }
    // `raise`, not `kill(getpid())`: a signal to the process may be taken by another
    // thread, and this one would run on, drop the job lock, and let the supervisor
    // continue the group before redlock stops. Raised on this thread, the stop takes it
    // before it returns to user code; it holds the job lock until redlock is continued.
    let _ = raise(Signal::SIGSTOP);
}

pub fn main(args: RunArgs) -> u8 {
    // redlock never reads the terminal, and a message of its own must not stop it alone
    // (a background job under `stty tostop` gets SIGTTOU for a write, which would stop
    // redlock and leave COMMAND running): with SIGTTIN and SIGTTOU blocked, such a write
    // goes through. Set before any thread starts (threads inherit the mask); children
    // inherit it too: the exec helper clears it before it execs COMMAND.
    let mut tty = SigSet::empty();
    tty.add(Signal::SIGTTIN);
    tty.add(Signal::SIGTTOU);
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&tty), None);

    let urls = args.masters.urls();
    if urls.is_empty() {
        say!("no masters: pass --masters URLS or set REDLOCK_MASTERS");
        return exit::USAGE;
    }
    // More patient than the library's default (TTL / 100 within 10..50 ms): a few
    // hundred ms cost a cron job nothing.
    let round_timeout = args.round_timeout.unwrap_or_else(|| {
        (args.ttl / 100).clamp(Duration::from_millis(50), Duration::from_millis(500))
    });
    if let Some(grace) = args.kill_grace {
        if (grace + 2 * round_timeout).as_secs_f64() > 0.45 * args.ttl.as_secs_f64() {
            say!(
                "warning: --kill-grace {} plus two round timeouts is above 0.45 x --ttl {}: \
                 after a lost lock the command may outlive the lock's validity",
                humantime::format_duration(grace),
                humantime::format_duration(args.ttl)
            );
        }
    }
    let mut client = match args
        .masters
        .builder()
        .node_timeout(round_timeout)
        .fencing(args.fencing)
        // Only `lock` (no deadline: waiting forever) uses the count.
        .retry_count(u32::MAX)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            say!("{e}");
            return error_code(&e);
        }
    };

    // Signals are read on a thread and handed over a channel to whoever watches the
    // command. While the lock is being acquired, a terminating signal also cancels the
    // attempt, so that a Ctrl-C does not wait out `--wait`. A Ctrl-Z is acted on here, at
    // once (stop_job); this thread never writes anything, so it cannot block on stderr.
    let mut signals =
        match Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGTSTP, SIGCONT]) {
            Ok(s) => s,
            Err(e) => {
                say!("cannot install signal handlers: {e}");
                return exit::OSERR;
            }
        };
    let signals_handle = signals.handle();
    let job = Arc::new(Mutex::new(Job {
        acquiring: true,
        ..Job::default()
    }));
    let (tx, rx) = mpsc::channel::<i32>();
    // Also wakes the supervisor the moment the lock is found lost (see `hold_and_run`).
    let lost_tx = tx.clone();
    {
        let job_ref = job.clone();
        let job = job.clone();
        let cancel = client.cancel_handle();
        thread::spawn(move || {
            for sig in signals.forever() {
                // Cancel and send under the lock: once the main thread has cleared
                // `acquiring`, every signal that cancelled is already in the channel.
                let mut job = lock_job(&job);
                if sig == SIGTSTP {
                    stop_job(&mut job);
                }
                if is_terminating(sig) && job.acquiring {
                    cancel.cancel();
                    if !job.recancelling {
                        job.recancelling = true;
                        recancel(job_ref.clone(), cancel.clone());
                    }
                }
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }

    let code = hold_and_run(&args, &mut client, &job, rx, lost_tx);
    signals_handle.close();
    code
}

fn hold_and_run(
    args: &RunArgs,
    client: &mut Redlock,
    job: &Mutex<Job>,
    rx: Receiver<i32>,
    lost_tx: Sender<i32>,
) -> u8 {
    let resource = args.resource.as_str();
    let ttl = args.ttl;
    let started = Instant::now();
    let no_wait = args.no_wait();
    if args.verbose {
        say!(
            "locking {resource} (ttl {}, {})",
            humantime::format_duration(ttl),
            match args.wait() {
                _ if no_wait => "no wait".to_string(),
                Wait::Forever => "waiting until it is free".to_string(),
                Wait::For(d) => format!("waiting up to {}", humantime::format_duration(d)),
            }
        );
    }
    let result = acquire(args, client, started);
    // From here on a signal no longer cancels: a cancel would cut short the extend and
    // release rounds.
    lock_job(job).acquiring = false;
    let early_signal = rx.try_iter().find(|s| is_terminating(*s));

    let lock = match result {
        Ok(lock) => lock,
        Err(Failed::Error(Error::Cancelled)) => {
            let sig = early_signal.unwrap_or(SIGINT);
            say!("got {}, gave up waiting for {resource}", signal_name(sig));
            return exit::signal(sig);
        }
        Err(Failed::Hopeless(code)) => return code,
        Err(Failed::Error(e)) => return acquire_failed(args, &e, no_wait),
    };
    // Known once the handshakes are in: at the latest after the release.
    let warned = crate::common::warn_same_servers(&client.stats());
    if args.verbose {
        let fence = lock
            .fencing_token()
            .map_or_else(String::new, |f| format!(", fencing token {f}"));
        say!(
            "acquired {resource} (token {}…{fence}, validity {}) after {}",
            lock.token().short(),
            human_duration(lock.remaining()),
            human_duration(started.elapsed())
        );
    }
    if let Some(sig) = early_signal {
        // A cancel raised after the attempt had succeeded reaches nothing (it only ever
        // reaches the lock call running, and release is not cancellable): release normally.
        release(args, client, lock);
        say!("got {}, did not start the command", signal_name(sig));
        return exit::signal(sig);
    }

    // COMMAND must not outlive redlock (see child.rs): the watchdog first, then COMMAND
    // through the exec helper, which waits stopped until the supervisor has armed the
    // watchdog and seen the lock valid.
    let mut watchdog = match Watchdog::spawn() {
        Ok(w) => w,
        Err(e) => {
            say!("cannot start the watchdog process: {e}; the command did not run");
            release(args, client, lock);
            return exit::OSERR;
        }
    };
    // Processes of the command orphaned by an exit in their group come to us, so that the
    // supervisor can reap them while it waits for the group to drain, even where PID 1
    // reaps lazily.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_child_subreaper(true);
    // Spawned on this (the main) thread, which lives as long as redlock: the helper's
    // parent-death signal fires when the spawning thread ends. Under the job lock, so that
    // a Ctrl-Z sees the group either not yet or fully registered.
    // Variables of ours that COMMAND must not inherit from an outer run.
    let unset: &[&str] = if lock.fencing_token().is_some() {
        &[]
    } else {
        &[ENV_FENCING_TOKEN]
    };
    let spawned = {
        let mut job = lock_job(job);
        child::spawn_command(&args.argv(), &command_env(args, &lock), unset).map(|c| {
            let leader = Pid::from_raw(c.id() as i32);
            job.group = Some(leader);
            job.held = true;
            leader
        })
    };
    let leader = match spawned {
        Ok(leader) => leader,
        Err(e) => {
            say!("cannot start the command's exec helper: {e}; the command did not run");
            watchdog.done();
            release(args, client, lock);
            return exit::OSERR;
        }
    };

    // This thread keeps the lock extended (extend when a third of the validity is left);
    // the scoped worker supervises the command's process group. The lock is released when
    // the worker returns, which is once no process of the group is left.
    // The lock counts as lost while enough validity is left to end COMMAND: its SIGKILL
    // comes --kill-grace after the SIGTERM, and a round timeout more covers the clocks.
    let lost_margin = args.kill_grace() + 2 * client.round_timeout(ttl);
    // (`HoldOptions` clamps the same way: extensions at most at 0.9, the lost margin at
    // most half of the extension margin.)
    let lost_at = (lost_margin.as_secs_f64() / ttl.as_secs_f64()).clamp(0.1, 0.45);
    let opts = HoldOptions {
        lost_at,
        // Room for retries between the extension and the lost margin.
        extend_at: (2.0 * lost_at).clamp(1.0 / 3.0, 0.9),
        ..HoldOptions::default()
    };
    let margin = ttl.mul_f64(opts.extend_at);
    let held = client.hold(lock, ttl, opts, move |signal| {
        let mut sup = Supervisor {
            args,
            job,
            signal,
            watchdog: &mut watchdog,
            leader,
            margin,
            status: None,
            started: false,
            ran: false,
            killed_held: false,
            lost_at: None,
            killed: false,
        };
        // The masters' watch can find the lock lost at any moment (issue 21): wake the
        // supervisor then (a 0 on its channel), not at its next look, POLL later.
        let finished = AtomicBool::new(false);
        let finished = &finished;
        let lost_tx = &lost_tx;
        thread::scope(|s| {
            s.spawn(move || {
                while !finished.load(Ordering::Acquire) {
                    if signal.wait_lost(POLL) {
                        let _ = lost_tx.send(0);
                        break;
                    }
                }
            });
            struct Finished<'a>(&'a AtomicBool);
            impl Drop for Finished<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _finished = Finished(finished);
            match panic::catch_unwind(AssertUnwindSafe(|| sup.run(&rx))) {
                Ok(done) => done,
                Err(p) => {
                    // The lock is released after the work returns, even by a panic: not
                    // while the group lives.
                    sup.kill_and_drain();
                    panic::resume_unwind(p)
                }
            }
        })
    });
    let done = match held.value {
        Ok(done) => done,
        Err(e) => {
            say!("cannot wait for the command: {e}; its process group was killed");
            return exit::OSERR;
        }
    };
    let lost = held.lost.map(|e| e.to_string()).or_else(|| {
        done.lost
            .then(|| "its validity ran out before an extension came through".to_string())
    });
    if let Some(why) = lost {
        say!(
            "the lock on {resource} was lost before the command finished ({why}); the command \
             exited with status {}{}",
            done.status,
            match (done.killed_held, done.ran) {
                (false, _) => "",
                (true, false) => " (killed before it started)",
                (true, true) => " (killed while stopped, without running again)",
            }
        );
        return args.lost_exit_code;
    }
    if !warned {
        crate::common::warn_same_servers(&client.stats());
    }
    if args.verbose {
        say!(
            "released {resource} after {} extension{}",
            held.extensions,
            if held.extensions == 1 { "" } else { "s" }
        );
    }
    done.status
}

/// What the supervisor saw.
struct Done {
    /// The leader's exit status as an exit code (128+N for signal N).
    status: u8,
    /// The supervisor found the lock lost (the keeper's signal, or validity run out).
    lost: bool,
    /// The group was continued at least once: COMMAND ran.
    ran: bool,
    /// The group was killed while held stopped (after a Ctrl-Z, or before it started).
    killed_held: bool,
}

/// Runs on the worker thread while the lock is held: starts COMMAND (arms the watchdog,
/// continues the stopped exec helper once the lock is seen valid), forwards signals,
/// continues the group after a Ctrl-Z only while the lock is valid, terminates it when the
/// lock is lost, and returns once no process of the group is left.
struct Supervisor<'a> {
    args: &'a RunArgs,
    job: &'a Mutex<Job>,
    signal: &'a LockSignal,
    watchdog: &'a mut Watchdog,
    /// The exec helper, then COMMAND: leader of the process group of the same number.
    leader: Pid,
    /// Continue the group only with more validity than this left: the keeper extends at
    /// that point, so less means an extension is due (wait for it).
    margin: Duration,
    /// The leader's exit status, once reaped.
    status: Option<u8>,
    /// The exec helper has stopped itself (and the watchdog is armed).
    started: bool,
    /// The group was continued at least once: COMMAND ran.
    ran: bool,
    /// SIGKILL went to the group while it was held stopped.
    killed_held: bool,
    lost_at: Option<Instant>,
    killed: bool,
}

impl Supervisor<'_> {
    fn group(&self) -> Pid {
        group_of(self.leader)
    }

    fn run(&mut self, rx: &Receiver<i32>) -> io::Result<Done> {
        loop {
            if let Err(e) = self.reap_leader() {
                self.kill_and_drain();
                return Err(e);
            }
            if let Some(status) = self.status {
                // The leader is gone; the lock is kept (and extended) until the rest of
                // its group is too, however long that takes.
                if self.drained() {
                    return Ok(Done {
                        status,
                        lost: self.lost_at.is_some(),
                        ran: self.ran,
                        killed_held: self.killed_held,
                    });
                }
            }
            self.check_lock();
            self.continue_if_valid();
            if let Some(pid) = self.watchdog.newly_gone() {
                say!(
                    "warning: the watchdog process {pid} is gone: should redlock be killed \
                     now, processes of the command's group other than its leader would run on"
                );
            }
            // SIGCHLD and SIGCONT arrive through the channel too, so an exit or a continue
            // wakes this at once.
            match rx.recv_timeout(POLL) {
                Ok(sig) if is_terminating(sig) => self.forward(sig),
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => thread::sleep(POLL),
            }
        }
    }

    /// Reap the leader if it exited. Until it has started: see whether the exec helper has
    /// stopped itself, and arm the watchdog then.
    fn reap_leader(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        let flags = WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED;
        match waitpid(self.leader, Some(flags)) {
            Ok(WaitStatus::Exited(_, code)) => self.status = Some(code.clamp(0, 255) as u8),
            Ok(WaitStatus::Signaled(_, sig, _)) => self.status = Some(exit::signal(sig as i32)),
            Ok(WaitStatus::Stopped(_, sig)) if self.started => self.stopped(sig),
            Ok(WaitStatus::Stopped(..)) if !self.started => {
                self.watchdog.arm(self.leader).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot arm the watchdog: {e}"))
                })?;
                lock_job(self.job).started = true;
                self.started = true;
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// COMMAND's leader was stopped by `sig`. A stop of redlock's own (Ctrl-Z, or the group
    /// held until the lock is seen valid) is not news; any other is said, since COMMAND
    /// then waits, holding the lock, with no word: typically an interactive COMMAND that
    /// read the terminal (SIGTTIN), which it cannot use from its own process group.
    fn stopped(&mut self, sig: Signal) {
        if lock_job(self.job).held {
            return;
        }
        let why = match sig {
            Signal::SIGTTIN => {
                "it read from the terminal, which it cannot use: it runs in a process group \
                 of its own (give it its input otherwise, e.g. < file or </dev/null)"
            }
            Signal::SIGTTOU => {
                "it wrote to or set up the terminal (stty tostop), which it cannot use from a \
                 process group of its own"
            }
            _ => "by a signal sent to it",
        };
        say!(
            "the command is stopped ({}): {why}. It holds the lock while stopped; continue it \
             with `kill -CONT -{}`, or end it with Ctrl-C or `kill {}` (redlock forwards the \
             signal)",
            sig.as_str(),
            self.leader,
            std::process::id()
        );
    }

    /// Reap the group's processes orphaned to us; `true` once none is left. Then forget the
    /// group (its number may be reused) and let the watchdog go.
    fn drained(&mut self) -> bool {
        let group = self.group();
        while let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
            waitpid(group, Some(WaitPidFlag::WNOHANG))
        {}
        // EPERM (a member we may not signal) is a member too.
        if kill(group, None) != Err(Errno::ESRCH) {
            return false;
        }
        lock_job(self.job).group = None;
        self.watchdog.done();
        true
    }

    /// Terminate the group once the lock is lost (the keeper said so, or the validity ran
    /// out before it noticed, as after a stop): SIGTERM and SIGCONT, SIGKILL after the
    /// grace. A group held stopped gets SIGKILL at once: it must not run again. Signals go
    /// out before any message.
    fn check_lock(&mut self) {
        if self.lost_at.is_none() {
            let job = lock_job(self.job);
            // Read the clock under the lock: taking it may have waited out a stop.
            let now = Instant::now();
            if !self.signal.is_lost() && now < self.signal.valid_until() {
                return;
            }
            let held = job.held;
            if held {
                let _ = kill(self.group(), Signal::SIGKILL);
            } else {
                let _ = kill(self.group(), Signal::SIGTERM);
                let _ = kill(self.group(), Signal::SIGCONT);
            }
            drop(job);
            self.lost_at = Some(now);
            self.killed = held;
            if held {
                self.killed_held = true;
                say!(
                    "LOST THE LOCK on {} while the command was stopped: killed it (SIGKILL) \
                     before it could run again",
                    self.args.resource
                );
            } else {
                say!(
                    "LOST THE LOCK on {}: terminating the command (SIGTERM, SIGKILL after {})",
                    self.args.resource,
                    humantime::format_duration(self.args.kill_grace())
                );
            }
        }
        if let Some(at) = self.lost_at {
            if !self.killed && Instant::now() >= at + self.args.kill_grace() {
                let _ = kill(self.group(), Signal::SIGKILL);
                self.killed = true;
                say!(
                    "the command was still running {} after SIGTERM: SIGKILL",
                    humantime::format_duration(self.args.kill_grace())
                );
            }
        }
    }

    /// Let a held group run (the exec helper waiting to exec COMMAND, or the group after a
    /// Ctrl-Z) once the lock is valid for more than the margin; with less, an extension is
    /// due: look again after it.
    fn continue_if_valid(&mut self) {
        if !self.started || self.lost_at.is_some() {
            return;
        }
        let mut job = lock_job(self.job);
        if !job.held {
            return;
        }
        let left = self
            .signal
            .valid_until()
            .saturating_duration_since(Instant::now());
        if self.signal.is_lost() || left <= self.margin {
            return;
        }
        let _ = kill(self.group(), Signal::SIGCONT);
        job.held = false;
        drop(job);
        if self.args.verbose {
            if self.ran {
                say!(
                    "continued after a stop: the lock is valid for {} more, the command goes on",
                    human_duration(left)
                );
            } else {
                say!("running the command (process group {})", self.leader);
            }
        }
        self.ran = true;
    }

    /// Forward a terminating signal sent to redlock to the group, with SIGCONT so that a
    /// command stopped by itself (reading the terminal) gets it too, as shells do for jobs;
    /// not to a group held stopped: it gets the signal when it is continued (or killed).
    fn forward(&mut self, sig: i32) {
        let Ok(sig) = Signal::try_from(sig) else {
            return;
        };
        {
            let job = lock_job(self.job);
            if job.group.is_none() {
                return;
            }
            let _ = kill(self.group(), sig);
            if !job.held {
                let _ = kill(self.group(), Signal::SIGCONT);
            }
        }
        if self.args.verbose {
            say!("forwarded {} to the command", sig.as_str());
        }
    }

    /// After an error or a panic: SIGKILL the group and wait until none of it is left
    /// (SIGKILL cannot be caught: this ends), so that the release comes after.
    fn kill_and_drain(&mut self) {
        if lock_job(self.job).group.is_none() {
            return;
        }
        let _ = kill(self.group(), Signal::SIGKILL);
        while !self.drained() {
            let _ = kill(self.group(), Signal::SIGKILL);
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// COMMAND's environment variables that name its lock.
const ENV_RESOURCE: &str = "REDLOCK_RESOURCE";
const ENV_TOKEN: &str = "REDLOCK_TOKEN";
const ENV_FENCING_TOKEN: &str = "REDLOCK_FENCING_TOKEN";

/// What COMMAND is told about its lock: the resource, the token (a capability: with it,
/// anyone can release or extend the lock), and the fencing token with `--fencing`. No
/// validity deadline: an environment is fixed at exec, the validity moves with every
/// extension, and `run` ends COMMAND itself before the lock can expire.
fn command_env(args: &RunArgs, lock: &Lock) -> Vec<(&'static str, OsString)> {
    let mut env = vec![
        (ENV_RESOURCE, OsString::from(&args.resource)),
        (ENV_TOKEN, OsString::from(lock.token().as_str())),
    ];
    if let Some(fence) = lock.fencing_token() {
        env.push((ENV_FENCING_TOKEN, fence.to_string().into()));
    }
    env
}

fn release(args: &RunArgs, client: &mut Redlock, lock: Lock) {
    match client.release(lock) {
        Ok(()) => {
            if args.verbose {
                say!("released {}", args.resource);
            }
        }
        Err(e) => say!(
            "warning: release of {} failed, the keys expire by themselves within the TTL: {e}",
            args.resource
        ),
    }
}

/// Why no lock was acquired.
enum Failed {
    /// The last attempt's error (or a local one).
    Error(Error),
    /// Retrying could not help; said so, exit with this code.
    Hopeless(u8),
}

/// Take the lock: one attempt (`--no-wait`), or wait until it is ours or `--wait` has
/// passed (a failed run waited all of `--wait`: its last attempt starts at the deadline),
/// or, without `--wait` (or `-w inf`), until it is ours.
///
/// The first attempt is the client's own (`try_lock`) so that its report can be judged:
/// when masters refuse the client for good, or none accepts a connection, waiting cannot
/// help (`hopeless`). Then the client waits (`lock_with_deadline`, or `lock` with no retry
/// count when there is no deadline): it stands in the
/// resource's line on the masters, is woken by the holder's release (`WaitMode::Notify`)
/// and never sleeps past the holder's keys' expiry; otherwise it tries every 200 ms +-
/// 100 ms. One call for the whole wait, so the waiter keeps its place in line. Masters
/// that start refusing this client's credentials meanwhile end the wait at once
/// (`Error::Refused`; other refusals, e.g. a master no longer durable for `--fencing`, are
/// judged by the last attempt at the deadline); a
/// terminating signal cancels it at once (the signal thread cancels the client while
/// `acquiring`). At the deadline one more attempt says how things stand (taken, or no
/// quorum, and what each master did).
fn acquire(args: &RunArgs, client: &mut Redlock, started: Instant) -> Result<Lock, Failed> {
    let no_wait = args.no_wait();
    let deadline = match args.wait() {
        Wait::For(d) => started.checked_add(d),
        Wait::Forever => None,
    };
    let judge = |e: Error| -> Result<Error, Failed> {
        match e {
            Error::Taken(_) | Error::NoQuorum(_) | Error::ValidityUsedUp(_) => {}
            // Said with the hints of `hopeless` (the library's `Refused` is one case of it).
            Error::Refused(ref r) => {
                return Err(hopeless(args, r).map_or(Failed::Error(e), Failed::Hopeless))
            }
            e => return Err(Failed::Error(e)),
        }
        match e.report().and_then(|r| hopeless(args, r)) {
            Some(code) => Err(Failed::Hopeless(code)),
            None => Ok(e),
        }
    };
    let e = match client.try_lock(&args.resource, args.ttl) {
        Ok(lock) => return Ok(lock),
        Err(e) => judge(e)?,
    };
    if no_wait || deadline.is_some_and(|d| Instant::now() >= d) {
        return Err(Failed::Error(e));
    }
    // Without a deadline the client was built with no retry count (`u32::MAX`): `lock`
    // waits until the lock is free, a refusal or a signal (a cancel) ends it.
    let waited = match deadline {
        Some(deadline) => client.lock_with_deadline(&args.resource, args.ttl, deadline),
        None => client.lock(&args.resource, args.ttl),
    };
    match waited {
        Ok(lock) => return Ok(lock),
        Err(Error::DeadlineExceeded(_)) => {}
        Err(e @ Error::Refused(_)) => return Err(judge(e).map_or_else(|f| f, Failed::Error)),
        Err(e) => return Err(Failed::Error(e)),
    }
    match client.try_lock(&args.resource, args.ttl) {
        Ok(lock) => Ok(lock),
        Err(e) => Err(Failed::Error(judge(e)?)),
    }
}

/// A master that refuses this client whatever the wait: what the library counts as a
/// configuration refusal ([`Fault::is_configuration`]: a handshake refused for who we are
/// or what we ask, a lock request refused by the master's ACL, a certificate that does not
/// verify or that the master refuses), a handshake refused with another `-ERR` (the
/// library waits for those; `run` knows better: an `ERR` there is about this client),
/// not durable enough for `--fencing`, or the same server as another master listed. A
/// refusal for the moment is not one: `-LOADING` (a master reading its data after a
/// restart), `-BUSY` (running a long script), `-ERR max number of clients reached`, and
/// any code not known here, are waited for.
pub(crate) fn refuses(o: Outcome) -> bool {
    match o {
        Outcome::Failed(f) if f.is_configuration() => true,
        Outcome::Failed(Fault::Handshake(t)) => {
            t.starts_with(b"ERR ") && !t.starts_with(b"ERR max number of clients")
        }
        Outcome::Failed(Fault::NotDurable | Fault::SameServer) => true,
        // A cluster refuses the script's keys (several slots) every time.
        o if crate::common::cross_slot(o) => true,
        _ => false,
    }
}

/// A master that gave no answer at all: not connected, connection lost, timed out, not
/// asked, or not heard from before the round was decided.
fn silent(o: Outcome) -> bool {
    matches!(
        o,
        Outcome::Pending
            | Outcome::TimedOut
            | Outcome::Failed(
                Fault::Down
                    | Fault::Connect(_)
                    | Fault::Closed(_)
                    | Fault::Backlogged
                    | Fault::Tls(TlsFault::Other(_))
            )
    )
}

/// What to do about the refusals seen, one hint per kind.
pub(crate) fn hints(refusing: &[(&str, Outcome)], resource: &str) -> Vec<String> {
    let mut hints = Vec::new();
    let any = |f: &dyn Fn(Outcome) -> bool| refusing.iter().any(|(_, o)| f(*o));
    if any(&crate::common::cross_slot) {
        hints.push(crate::common::CROSS_SLOT_HINT.to_string());
    }
    if any(&|o| matches!(o, Outcome::Failed(Fault::Handshake(_)))) {
        hints.push("check the user, password and database in the master URLs".to_string());
    }
    if any(&|o| matches!(o, Outcome::Failed(Fault::Redis(t)) if t.starts_with(b"NOPERM"))) {
        hints.push(format!(
            "the user's ACL must allow the lock's key and the commands SET, EVALSHA, EVAL \
             (e.g. ACL SETUSER <user> ~{resource} ~redlock-mux:* &redlock-mux:* +@all, or a \
             key pattern that covers {resource})"
        ));
    }
    if any(&|o| {
        matches!(o, Outcome::Failed(Fault::Redis(t)) if !t.starts_with(b"NOPERM"))
            && !crate::common::cross_slot(o)
    }) {
        hints.push("check the user and password in the master URLs".to_string());
    }
    if any(&|o| matches!(o, Outcome::Failed(Fault::Tls(TlsFault::Alert(_))))) {
        hints.push(
            "the masters refused this client's TLS session: give --cert and --key signed by \
             a CA the masters trust (tls-ca-cert-file)"
                .to_string(),
        );
    }
    if any(
        &|o| matches!(o, Outcome::Failed(Fault::Tls(t)) if !matches!(t, TlsFault::Alert(_) | TlsFault::Other(_))),
    ) {
        hints.push(
            "--cacert (--tls-ca-file) must hold the CA that signed the masters' certificates, \
             and each master needs a certificate of its own for its host name or address, \
             signed by that CA (docs/tls.md shows how to make both with openssl)"
                .to_string(),
        );
    }
    if any(&|o| o == Outcome::Failed(Fault::NotDurable)) {
        hints.push("--fencing needs masters with appendonly yes and appendfsync always".into());
    }
    if any(&|o| o == Outcome::Failed(Fault::SameServer)) {
        hints.push("list each server once".into());
    }
    hints
}

/// Whether an attempt's report shows that waiting cannot help; if so, say why and return
/// the exit code.
/// * Masters refuse the client (`refuses`), so many that no quorum is possible without
///   them, or while no other master answered at all (a wrong password for every master is
///   the common case): a configuration error, 64.
/// * `rediss://` masters that gave no answer speak plain RESP on that port (a plain Redis
///   never answers a TLS hello: it waits for a line), found by a `PING` in clear: 64.
/// * Every master refused the connection: nothing listens at any address (wrong ports, or
///   Redis not running), 69. Masters that time out are waited for: a network may come
///   back; so are some masters refusing while others answer.
fn hopeless(args: &RunArgs, r: &Report) -> Option<u8> {
    let n = r.outcomes().count();
    let refusing: Vec<(&str, Outcome)> = r.outcomes().filter(|(_, o)| refuses(*o)).collect();
    if !refusing.is_empty()
        && (n - refusing.len() < r.quorum() || r.outcomes().all(|(_, o)| refuses(o) || silent(o)))
    {
        let k = refusing.len();
        let why = if n - k < r.quorum() {
            format!("so no quorum of {} is possible", r.quorum())
        } else {
            "and no other master answered".to_string()
        };
        say!(
            "cannot lock {}: {k} of {n} master{} refuse{} this client, {why}, and waiting will \
             not change that: {}. Last attempt: {r}",
            args.resource,
            if n == 1 { "" } else { "s" },
            if k == 1 { "s" } else { "" },
            hints(&refusing, &args.resource).join("; "),
        );
        return Some(exit::USAGE);
    }
    let plain = plain_resp_masters(args, r);
    if !plain.is_empty() {
        say!(
            "cannot lock {}: {} answer{} in plain RESP, not TLS: {} (use redis:// for a \
             plain port, or rediss:// with the server's tls-port). Last attempt: {r}",
            args.resource,
            plain.join(", "),
            if plain.len() == 1 { "s" } else { "" },
            if plain.len() == 1 {
                "this port speaks plain RESP"
            } else {
                "these ports speak plain RESP"
            },
        );
        return Some(exit::USAGE);
    }
    let refused = Outcome::Failed(Fault::Connect(io::ErrorKind::ConnectionRefused));
    if r.outcomes().all(|(_, o)| o == refused) {
        say!(
            "cannot lock {}: every master refused the connection (nothing listens there: is \
             Redis running, are the addresses right?): {r}",
            args.resource
        );
        return Some(exit::UNAVAILABLE);
    }
    None
}

/// The `rediss://` masters that gave no answer in `r` and answer a `PING` in clear: ports
/// that speak plain RESP (a plain Redis never answers a TLS hello; a TLS port answers a
/// `PING` in clear with an alert or a close, never a RESP reply). Bounded: one connect and
/// one read of at most 500 ms per such master.
fn plain_resp_masters(args: &RunArgs, r: &Report) -> Vec<String> {
    let urls = args.masters.urls();
    r.outcomes()
        .zip(&urls)
        .filter(|((_, o), url)| silent(*o) && url.to_ascii_lowercase().starts_with("rediss://"))
        .filter(|(_, url)| speaks_plain_resp(url, Duration::from_millis(500)))
        .map(|((name, _), _)| name.to_string())
        .collect()
}

/// Whether the TCP address of `url` answers `PING` with a RESP reply (`+PONG`, or an error
/// such as `-NOAUTH`).
fn speaks_plain_resp(url: &str, timeout: Duration) -> bool {
    use std::io::{Read, Write};
    let Ok(spec) = redlock_mux::MasterSpec::parse(url) else {
        return false;
    };
    let Ok(addr) = spec.resolve() else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let mut first = [0u8; 1];
    s.write_all(b"PING\r\n").is_ok()
        && matches!(s.read(&mut first), Ok(1) if first[0] == b'+' || first[0] == b'-')
}

/// Say why the last attempt failed, and return the exit code.
fn acquire_failed(args: &RunArgs, e: &Error, no_wait: bool) -> u8 {
    let resource = &args.resource;
    let waited = match args.wait() {
        Wait::For(d) if !no_wait => format!(" after waiting {}", humantime::format_duration(d)),
        _ => String::new(),
    };
    match e {
        Error::Taken(r) => {
            if !args.quiet {
                if no_wait {
                    say!("{resource} is locked: {e}");
                } else {
                    say!("{resource} is still locked{waited}: last attempt: {r}");
                }
            }
            args.conflict_exit_code
        }
        Error::NoQuorum(_) | Error::ValidityUsedUp(_) => {
            say!("cannot lock {resource}{waited}: {e}");
            exit::UNAVAILABLE
        }
        _ => {
            say!("cannot lock {resource}: {e}");
            error_code(e)
        }
    }
}

/// The exit code for an error that is not about the lock itself.
pub fn error_code(e: &Error) -> u8 {
    match e {
        Error::Config(_) | Error::InvalidArgument(_) | Error::Refused(_) => exit::USAGE,
        Error::Io(_) => exit::OSERR,
        Error::Taken(_)
        | Error::NoQuorum(_)
        | Error::ValidityUsedUp(_)
        | Error::DeadlineExceeded(_) => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    }
}

fn signal_name(sig: i32) -> &'static str {
    Signal::try_from(sig)
        .map(|s| s.as_str())
        .unwrap_or("a signal")
}
