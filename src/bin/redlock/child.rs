//! How `run` starts COMMAND so that it cannot outlive redlock: through an exec helper that
//! ties COMMAND to redlock's life before it runs, next to a watchdog that takes the rest
//! of COMMAND's process group down if redlock dies.
//!
//! Both are redlock itself, re-executed (`/proc/self/exe`) with a hidden subcommand:
//! the crate forbids `unsafe`, so no code runs between `fork` and `exec` in redlock.
//!
//! * `redlock __exec --parent PID -- COMMAND...` (the leader of COMMAND's process group):
//!   sets a parent-death signal (SIGKILL), checks that its parent is still PID, stops
//!   itself (SIGSTOP) until redlock has armed the watchdog and checked the lock, then
//!   execs COMMAND. The parent-death signal survives the exec: if redlock dies, COMMAND
//!   (the leader) gets SIGKILL from the kernel, whatever killed redlock.
//! * `redlock __watchdog --parent PID` (its own process group; SIGINT, SIGTERM, SIGHUP,
//!   SIGQUIT, SIGTSTP, SIGTTIN and SIGTTOU blocked): reads `arm PGID` and `done` lines on
//!   its stdin, a pipe whose write end only redlock holds. At end of input after `arm`
//!   without `done` (redlock died, however), it SIGKILLs that process group: the
//!   parent-death signal reaches the leader only, not the jobs it started.
//!
//! Why both: the parent-death signal needs no other process and covers the window before
//! the watchdog is armed; the watchdog covers the grandchildren. Redlock writes `done` only
//! once it has seen the group empty, so any other end of redlock (a panic, an early
//! return, a signal) ends with the group killed.

use std::ffi::OsString;
use std::io::{self, BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{getpid, getppid, Pid};

use crate::common::{exit, say};

/// `redlock __exec`: the exec helper (see the module docs). Not for people.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The redlock that spawned this helper; if it is gone already, COMMAND does not run.
    #[arg(long, value_name = "PID")]
    parent: i32,
    /// The command to exec, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// `redlock __watchdog`: the watchdog (see the module docs). Not for people.
#[derive(Args, Debug)]
pub struct WatchdogArgs {
    /// The redlock it watches (for its message).
    #[arg(long, value_name = "PID")]
    parent: i32,
}

/// This program, for re-execution: `/proc/self/exe` names the running binary even if its
/// file was replaced or deleted since (an upgrade while a long job runs).
fn this_program() -> io::Result<PathBuf> {
    if cfg!(target_os = "linux") {
        Ok(PathBuf::from("/proc/self/exe"))
    } else {
        std::env::current_exe()
    }
}

/// Body of `redlock __exec`. Returns only if COMMAND was not executed: 126 (cannot
/// execute) or 127 (not found), as shells do, with a message; 71 if the helper cannot tie
/// COMMAND to redlock.
pub fn exec_main(args: ExecArgs) -> u8 {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        say!("cannot set a parent-death signal for the command: {e}");
        return exit::OSERR;
    }
    // Redlock may have died before the line above: then no signal will come. Its PID
    // cannot have been reused by a new parent of ours (orphans go to a reaper).
    if getppid() != Pid::from_raw(args.parent) {
        return exit::OSERR;
    }
    // Wait, stopped, until redlock continues us (or kills us).
    if let Err(e) = kill(getpid(), Signal::SIGSTOP) {
        say!("cannot stop the command before it starts: {e}");
        return exit::OSERR;
    }
    // COMMAND starts with no signal blocked: redlock blocks SIGTTIN and SIGTTOU, and a
    // blocked mask is inherited through spawn and exec.
    if let Err(e) = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None) {
        say!("cannot clear the signal mask for the command: {e}");
        return exit::OSERR;
    }
    let program = &args.command[0];
    let e = Command::new(program).args(&args.command[1..]).exec();
    say!("cannot run {}: {e}", program.to_string_lossy());
    match e.kind() {
        io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::CANNOT_EXEC,
    }
}

/// Spawn COMMAND through the exec helper, as the leader of a new process group, with
/// `env` set and `unset` removed in its environment (the helper's, which COMMAND inherits
/// through the exec). Call from the thread that lives as long as redlock (the main
/// thread): the parent-death signal fires when the thread that spawned the helper exits,
/// not the process.
pub fn spawn_command(
    command: &[OsString],
    env: &[(&str, OsString)],
    unset: &[&str],
) -> io::Result<Child> {
    let mut cmd = Command::new(this_program()?);
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    cmd.arg0("redlock")
        .arg("__exec")
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(command)
        // Its own process group: forwarded signals, job control and the lost-lock kill
        // reach every process of the command (`sh -c 'a | b'` included), and a terminal's
        // Ctrl-C reaches it once, through redlock.
        .process_group(0);
    cmd.spawn()
}

/// Body of `redlock __watchdog`.
pub fn watchdog_main(args: WatchdogArgs) -> u8 {
    // A Ctrl-C, a hangup or a Ctrl-Z meant for redlock's job must not take the watchdog
    // along (its process group is its own, but `kill` can name it). Blocked signals stay
    // pending; a blocked SIGTTOU lets a write to the terminal through.
    let mut deaf = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        deaf.add(sig);
    }
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&deaf), None);

    let mut armed: Option<i32> = None;
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line == "done" {
            return exit::OK;
        }
        // Never 0 or 1: kill(0, _) is our own group, kill(-1, _) every process we may signal.
        if let Some(pgid) = line
            .strip_prefix("arm ")
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|&p| p > 1)
        {
            armed = Some(pgid);
        }
    }
    // End of input without `done`: redlock is gone.
    if let Some(pgid) = armed {
        if kill(Pid::from_raw(-pgid), Signal::SIGKILL).is_ok() {
            say!(
                "redlock (pid {}) ended while the command ran: killed the command's process \
                 group {pgid}",
                args.parent
            );
        }
    }
    exit::OK
}

/// redlock's end of the watchdog.
pub struct Watchdog {
    child: Child,
    /// The only write end of the watchdog's stdin (close-on-exec: no other process gets it).
    input: Option<ChildStdin>,
    /// Reported gone already.
    gone: bool,
}

impl Watchdog {
    /// Start the watchdog, in a process group of its own. Spawn it before COMMAND, from
    /// any thread (it has no parent-death signal: it must outlive redlock).
    pub fn spawn() -> io::Result<Watchdog> {
        let mut child = Command::new(this_program()?)
            .arg0("redlock")
            .arg("__watchdog")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let input = child.stdin.take();
        Ok(Watchdog {
            child,
            input,
            gone: false,
        })
    }

    /// From now on, if redlock ends without [`Watchdog::done`], process group `pgid` gets
    /// SIGKILL.
    pub fn arm(&mut self, pgid: Pid) -> io::Result<()> {
        self.send(&format!("arm {pgid}\n"))
    }

    /// COMMAND's process group is gone: let the watchdog go, and reap it (bounded).
    pub fn done(&mut self) {
        let _ = self.send("done\n");
        self.input = None; // end of input, should `done` not have got through
        let deadline = Instant::now() + Duration::from_secs(1);
        while let Ok(None) = self.child.try_wait() {
            if Instant::now() >= deadline {
                return;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// `Some(pid)` the first time the watchdog is seen gone (killed by someone) while still
    /// needed.
    pub fn newly_gone(&mut self) -> Option<u32> {
        if self.gone || self.input.is_none() {
            return None;
        }
        match self.child.try_wait() {
            Ok(Some(_)) | Err(_) => {
                self.gone = true;
                Some(self.child.id())
            }
            Ok(None) => None,
        }
    }

    fn send(&mut self, line: &str) -> io::Result<()> {
        match self.input.as_mut() {
            Some(input) => input.write_all(line.as_bytes()),
            None => Err(io::Error::from(io::ErrorKind::BrokenPipe)),
        }
    }
}
