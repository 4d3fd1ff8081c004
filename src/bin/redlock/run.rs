//! `redlock run`: run a command while holding a lock, keep the lock extended while it
//! runs, release it when it exits.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use redlock_mux::{Error, HoldOptions, Lock, LockSignal, Outcome, Redlock};
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::common::{exit, human_duration, say};
use crate::{duration, MasterArgs};

pub const AFTER_HELP: &str = "\
How it works:
  Takes the lock (waiting up to --wait), runs COMMAND in its own process group, extends the
  lock whenever a third of its validity is left, and releases it when COMMAND exits. The
  lock is lost when an extension fails (no quorum, or no longer held) or its validity runs
  out; then COMMAND's process group gets SIGTERM, and SIGKILL after --kill-grace.
  SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to redlock are forwarded to COMMAND's process
  group (followed by SIGCONT); the lock is released once COMMAND has exited. Because
  COMMAND has its own process group it cannot use the terminal interactively (reading from
  it stops it): run non-interactive commands, as from cron or scripts.
  A loss is noticed when at most a third of the TTL is left: keep --kill-grace below
  --ttl / 3 (the defaults, 5s and 30s, do) so that COMMAND is gone before the lock expires.

Exit status:
  COMMAND's exit status   COMMAND ran and exited (128+N if it was killed by signal N)
  1 (-E N)                the lock is held by someone else (after --wait, or at once
                          with --no-wait); COMMAND did not run
  75 (--lost-exit-code)   the lock was lost before COMMAND finished; COMMAND (its whole
                          process group) was terminated if still running
  64                      usage or configuration error (no masters, bad URL, bad duration)
  69                      no quorum of masters answered; COMMAND did not run
  71                      local OS error (event loop, signals)
  126, 127                COMMAND could not be executed / was not found
  128+N                   redlock got signal N before COMMAND started

Example (crontab on several hosts: the nightly backup runs on one of them):
  REDLOCK_MASTERS=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
  0 3 * * *  redlock run -n -q -E 0 backup-nightly -- /usr/local/bin/backup.sh";

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// Lock time-to-live. The lock is extended while COMMAND runs, so this bounds how long
    /// the lock outlives a redlock that died, not how long COMMAND may run.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
    ttl: Duration,
    /// Wait up to this long for the lock, retrying while it is taken.
    #[arg(
        short,
        long,
        value_name = "DURATION",
        default_value = "10s",
        value_parser = duration,
        conflicts_with = "no_wait"
    )]
    wait: Duration,
    /// Try once and fail at once if the lock is taken (like `flock -n`).
    #[arg(short, long)]
    no_wait: bool,
    /// Exit status when the lock is held by someone else (like `flock -E`).
    #[arg(short = 'E', long, value_name = "N", default_value_t = exit::CONFLICT)]
    conflict_exit_code: u8,
    /// Exit status when the lock was lost while COMMAND ran (COMMAND is terminated).
    #[arg(long, value_name = "N", default_value_t = exit::LOST)]
    lost_exit_code: u8,
    /// After the lock is lost: time between SIGTERM and SIGKILL to COMMAND.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    kill_grace: Duration,
    /// How long one round (acquire, extend or release on all masters at once) waits for
    /// the masters' answers [default: TTL / 100, within 50ms..500ms]. A round that gets no
    /// quorum in time fails; an extension that fails loses the lock.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    round_timeout: Option<Duration>,
    /// Say nothing when the lock is held by someone else (cron mails stay quiet); other
    /// errors are still reported.
    #[arg(short, long, conflicts_with = "verbose")]
    quiet: bool,
    /// Report acquire, extend and release on stderr.
    #[arg(short, long)]
    verbose: bool,
    /// The lock's name (the Redis key).
    #[arg(value_name = "RESOURCE")]
    resource: String,
    /// The command to run, and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Longest time the main loop sleeps before checking the child and the lock again.
const POLL: Duration = Duration::from_millis(50);

fn is_terminating(sig: i32) -> bool {
    matches!(sig, SIGINT | SIGTERM | SIGHUP | SIGQUIT)
}

pub fn main(args: RunArgs) -> u8 {
    let urls = args.masters.urls();
    if urls.is_empty() {
        say!("no masters: pass --masters URLS or set REDLOCK_MASTERS");
        return exit::USAGE;
    }
    if args.kill_grace > args.ttl / 3 {
        say!(
            "warning: --kill-grace {} is above a third of --ttl {}: after a lost lock the \
             command may outlive the lock's validity",
            humantime::format_duration(args.kill_grace),
            humantime::format_duration(args.ttl)
        );
    }
    // More patient than the library's default (TTL / 100 within 10..50 ms): a command
    // is killed when one extension fails, and a few hundred ms cost a cron job nothing.
    let round_timeout = args.round_timeout.unwrap_or_else(|| {
        (args.ttl / 100).clamp(Duration::from_millis(50), Duration::from_millis(500))
    });
    let mut client = match Redlock::builder()
        .masters(&urls)
        .node_timeout(round_timeout)
        // `--wait` bounds the retries, not a count.
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
    // attempt, so that a Ctrl-C does not wait out `--wait`.
    let mut signals = match Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD]) {
        Ok(s) => s,
        Err(e) => {
            say!("cannot install signal handlers: {e}");
            return exit::OSERR;
        }
    };
    let signals_handle = signals.handle();
    let acquiring = Arc::new(Mutex::new(true));
    let (tx, rx) = mpsc::channel::<i32>();
    {
        let acquiring = acquiring.clone();
        let cancel = client.cancel_handle();
        thread::spawn(move || {
            for sig in signals.forever() {
                // Cancel and send under the lock: once the main thread has cleared
                // `acquiring`, every signal that cancelled is already in the channel.
                let acquiring = acquiring.lock().unwrap_or_else(|p| p.into_inner());
                if is_terminating(sig) && *acquiring {
                    cancel.cancel();
                }
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }

    let code = hold_and_run(&args, &mut client, &acquiring, rx);
    signals_handle.close();
    code
}

fn hold_and_run(
    args: &RunArgs,
    client: &mut Redlock,
    acquiring: &Mutex<bool>,
    rx: Receiver<i32>,
) -> u8 {
    let resource = args.resource.as_str();
    let ttl = args.ttl;
    let started = Instant::now();
    let no_wait = args.no_wait || args.wait.is_zero();
    if args.verbose {
        say!(
            "locking {resource} (ttl {}, {})",
            humantime::format_duration(ttl),
            if no_wait {
                "no wait".to_string()
            } else {
                format!("waiting up to {}", humantime::format_duration(args.wait))
            }
        );
    }
    let result = if no_wait {
        client.try_lock(resource, ttl)
    } else {
        client.lock_with_deadline(resource, ttl, started + args.wait)
    };
    // From here on a signal no longer cancels: a cancel would cut short the extend and
    // release rounds.
    *acquiring.lock().unwrap_or_else(|p| p.into_inner()) = false;
    let early_signal = rx.try_iter().find(|s| is_terminating(*s));

    let lock = match result {
        Ok(lock) => lock,
        Err(Error::Cancelled) => {
            let sig = early_signal.unwrap_or(SIGINT);
            say!("got {}, gave up waiting for {resource}", signal_name(sig));
            return exit::signal(sig);
        }
        Err(e) => return acquire_failed(args, &e),
    };
    if args.verbose {
        say!(
            "acquired {resource} (token {}…, validity {}) after {}",
            lock.token().short(),
            human_duration(lock.remaining()),
            human_duration(started.elapsed())
        );
    }
    if let Some(sig) = early_signal {
        // The signal may have raised the client's cancel flag after the attempt had
        // already succeeded. An attempt whose deadline has passed consumes a pending cancel
        // or returns at once, with no I/O either way; then the release runs normally.
        let _ = client.lock_with_deadline(resource, ttl, Instant::now());
        release(args, client, lock);
        say!("got {}, did not start the command", signal_name(sig));
        return exit::signal(sig);
    }

    // Processes of the command orphaned by its exit come to us, so that a lost lock can
    // wait for (reap) every one of them, even where PID 1 reaps lazily.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let mut child = match spawn(&args.command) {
        Ok(c) => c,
        Err(e) => {
            say!(
                "cannot run {}: {e}",
                args.command[0].to_string_lossy().into_owned()
            );
            release(args, client, lock);
            return match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXEC,
            };
        }
    };

    // This thread keeps the lock extended (extend when a third of the validity is left);
    // the scoped worker watches the command, forwards signals, and terminates the command
    // the moment the lock is lost. The lock is released when the worker returns.
    let held = client.hold(lock, ttl, HoldOptions::default(), move |signal| {
        supervise(args, &mut child, signal, &rx)
    });
    let status = match held.value {
        Ok(status) => status,
        Err(e) => {
            say!("cannot wait for the command: {e}");
            return exit::OSERR;
        }
    };
    if let Some(why) = held.lost {
        say!(
            "the lock on {resource} was lost before the command finished ({why}); the command \
             exited with status {}",
            status_code(status)
        );
        return args.lost_exit_code;
    }
    if args.verbose {
        say!(
            "released {resource} after {} extension{}",
            held.extensions,
            if held.extensions == 1 { "" } else { "s" }
        );
    }
    status_code(status)
}

/// Runs on the worker thread while the lock is held: wait for the command to exit,
/// forward signals to its process group, and terminate it when the lock is lost (SIGTERM,
/// then SIGKILL after the grace period).
fn supervise(
    args: &RunArgs,
    child: &mut Child,
    signal: &LockSignal,
    rx: &Receiver<i32>,
) -> io::Result<ExitStatus> {
    let group = Pid::from_raw(-(child.id() as i32));
    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        let status = match child.try_wait() {
            Ok(s) => s,
            Err(e) => {
                let _ = kill(group, Signal::SIGKILL);
                let _ = child.wait();
                return Err(e);
            }
        };
        let now = Instant::now();
        if let Some(status) = status {
            if let Some(at) = lost_at {
                // The leader exited; no member of its group may outlive the grace.
                drain_group(group, at + args.kill_grace);
            }
            return Ok(status);
        }
        // Signal first, then say so: nothing may delay the signal.
        if lost_at.is_none() && signal.is_lost() {
            signal_group(group, Signal::SIGTERM);
            lost_at = Some(now);
            say!(
                "LOST THE LOCK on {}: terminating the command (SIGTERM, SIGKILL after {})",
                args.resource,
                humantime::format_duration(args.kill_grace)
            );
        }
        if let Some(at) = lost_at {
            if !killed && now >= at + args.kill_grace {
                let _ = kill(group, Signal::SIGKILL);
                killed = true;
                say!(
                    "the command was still running {} after SIGTERM: SIGKILL",
                    humantime::format_duration(args.kill_grace)
                );
            }
        }
        // SIGCHLD arrives through the channel too, so a command's exit wakes this at once.
        match rx.recv_timeout(POLL) {
            Ok(sig) if is_terminating(sig) => {
                if args.verbose {
                    say!("forwarding {} to the command", signal_name(sig));
                }
                if let Ok(sig) = Signal::try_from(sig) {
                    signal_group(group, sig);
                }
            }
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => thread::sleep(POLL),
        }
    }
}

/// Send `sig` to the command's process group, then SIGCONT, so that a stopped command
/// (one that tried to read from the terminal, say) gets it too, as shells do for jobs.
fn signal_group(group: Pid, sig: Signal) {
    let _ = kill(group, sig);
    let _ = kill(group, Signal::SIGCONT);
}

/// Wait until no process of the command's group is left, reaping the ones orphaned to us;
/// SIGKILL whatever is left at `deadline`. Call only after the leader was reaped.
fn drain_group(group: Pid, deadline: Instant) {
    loop {
        while let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
            waitpid(group, Some(WaitPidFlag::WNOHANG))
        {}
        if kill(group, None).is_err() {
            return;
        }
        if Instant::now() >= deadline {
            let _ = kill(group, Signal::SIGKILL);
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn spawn(command: &[OsString]) -> io::Result<Child> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    // Its own process group: forwarded signals and the lost-lock kill reach every process
    // of the command (`sh -c 'a | b'` included), and a terminal's Ctrl-C reaches it once,
    // through redlock.
    cmd.process_group(0);
    cmd.spawn()
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

fn acquire_failed(args: &RunArgs, e: &Error) -> u8 {
    let resource = &args.resource;
    match e {
        Error::Taken(_) => {
            if !args.quiet {
                say!("{resource} is locked: {e}");
            }
            args.conflict_exit_code
        }
        Error::DeadlineExceeded(Some(r)) if r.masters_with(Outcome::Taken).next().is_some() => {
            if !args.quiet {
                say!(
                    "{resource} is still locked after waiting {}: last attempt: {r}",
                    humantime::format_duration(args.wait)
                );
            }
            args.conflict_exit_code
        }
        Error::DeadlineExceeded(_) | Error::NoQuorum(_) | Error::ValidityUsedUp(_) => {
            say!("cannot lock {resource}: {e}");
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
        Error::Config(_) | Error::InvalidArgument(_) => exit::USAGE,
        Error::Io(_) => exit::OSERR,
        Error::Taken(_)
        | Error::NoQuorum(_)
        | Error::ValidityUsedUp(_)
        | Error::DeadlineExceeded(_) => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    }
}

fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(sig)) => exit::signal(sig),
        (None, None) => exit::SOFTWARE,
    }
}

fn signal_name(sig: i32) -> &'static str {
    Signal::try_from(sig)
        .map(|s| s.as_str())
        .unwrap_or("a signal")
}
