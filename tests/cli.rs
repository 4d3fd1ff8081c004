//! The `redlock` binary against real local masters: `run` (hold, release, exit codes,
//! lost lock, signal forwarding), `status`, and `bench` (mutual-exclusion check, cleanup).
//!
//! Every wait is a bounded poll; commands that must wait for the test are gated on files
//! the test creates, never on sleeps that happen to be long enough.
#![cfg(feature = "cli")]

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use redlock_mux::local::{AdminReply, LocalCluster, LocalMasters};
use redlock_mux::Redlock;

const BIN: &str = env!("CARGO_BIN_EXE_redlock");

fn masters(n: usize) -> LocalMasters {
    LocalMasters::start(n).unwrap_or_else(|e| panic!("cannot start {n} redis-server masters: {e}"))
}

/// `redlock ARGS` with `REDLOCK_MASTERS` naming `m` (or unset for `None`).
fn redlock(m: Option<&LocalMasters>, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    match m {
        Some(m) => cmd.env("REDLOCK_MASTERS", m.urls().join(",")),
        None => cmd.env_remove("REDLOCK_MASTERS"),
    };
    cmd
}

/// Run to completion (bounded) and return the output.
fn output(mut cmd: Command, within: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn redlock");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("redlock did not finish within {within:?}"))
        .expect("wait for redlock")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| {
        panic!(
            "redlock was killed by a signal: {:?}; stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Wait (bounded) for a child to exit; kill it and panic if it does not.
fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {within:?}", child.id());
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Poll (bounded) until `cond` holds.
fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// A scratch directory for marker files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "redlock-cli-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn file(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A shell command that creates `started`, then waits (at most ~20 s) for `go` to exist.
fn gated(s: &Scratch, then: &str) -> String {
    format!(
        "touch '{started}'; i=0; while [ ! -e '{go}' ] && [ $i -lt 400 ]; do sleep 0.05; \
         i=$((i+1)); done; {then}",
        started = s.file("started"),
        go = s.file("go"),
    )
}

fn get(m: &LocalMasters, i: usize, key: &str) -> Option<Vec<u8>> {
    match m[i].cmd(&[b"GET", key.as_bytes()]).expect("GET") {
        AdminReply::Bulk(v) => v,
        other => panic!("GET {key}: {other:?}"),
    }
}

/// Who holds `key` on each master: the token (a refused waiter's mark after it,
/// `scripts::WAITED`, is no other holder).
fn holders(m: &LocalMasters, key: &str) -> Vec<Option<Vec<u8>>> {
    (0..m.len())
        .map(|i| {
            get(m, i, key).map(|mut v| {
                if v.len() == 33 && v.ends_with(redlock_mux::scripts::WAITED) {
                    v.pop();
                }
                v
            })
        })
        .collect()
}

/// `run` starts its command once a quorum granted the lock, and exits once a quorum
/// confirmed its release: the last master's SET or release may land a little later. Polls
/// (bounded) until every master holds `key` with one token, and returns that token.
fn held_everywhere(m: &LocalMasters, key: &str) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let held = holders(m, key);
        if let Some(Some(token)) = held.first() {
            if held.iter().all(|h| h.as_ref() == Some(token)) {
                return token.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{key} not held with one token on every master: {held:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Polls (bounded, as for [`held_everywhere`]) until no master has `key`.
fn released_everywhere(m: &LocalMasters, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let held = holders(m, key);
        if held.iter().all(Option::is_none) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} still on some master: {held:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

/// Whether `pid` is a live process (zombies count as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn run_holds_the_lock_while_the_command_runs_and_releases_it_after() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:hold";
    let mut holder = redlock(Some(&m), &["run", "--ttl", "5s", key, "--", "sh", "-c"])
        .arg(gated(&s, "exit 0"))
        .spawn()
        .expect("spawn redlock run");
    eventually("the command to start", Duration::from_secs(10), || {
        s.path("started").exists()
    });

    // Held on every master, with one token.
    let token = held_everywhere(&m, key);

    // A second run is refused at once and does not run its command.
    let second = output(
        {
            let mut c = redlock(Some(&m), &["run", "--no-wait", key, "--", "touch"]);
            c.arg(s.file("second"));
            c
        },
        Duration::from_secs(10),
    );
    assert_eq!(code(&second), 1, "stderr: {}", stderr(&second));
    assert!(
        stderr(&second).starts_with("redlock: "),
        "{}",
        stderr(&second)
    );
    assert!(
        !s.path("second").exists(),
        "the refused run ran its command"
    );

    // status shows the holder (its token's fingerprint, never the token) on all masters.
    let status = output(redlock(Some(&m), &["status", key]), Duration::from_secs(10));
    assert_eq!(code(&status), 0, "stderr: {}", stderr(&status));
    let table = String::from_utf8_lossy(&status.stdout);
    let short = String::from_utf8_lossy(&token[..16]).into_owned();
    assert_eq!(table.matches(&short).count(), 4, "{table}"); // 3 rows + the verdict
    assert!(table.contains("\nheld by"), "{table}");
    assert!(
        !table.contains(std::str::from_utf8(&token).unwrap()),
        "whole token shown"
    );
    let st = json(&output(
        redlock(Some(&m), &["status", "--json", key]),
        Duration::from_secs(10),
    ));
    assert_eq!(st["locked"], true, "{st}");
    assert_eq!(st["holder"], short.as_str(), "{st}");
    assert_eq!(st["holder_masters"], 3, "{st}");
    assert!(
        st["masters"][0]["pttl_ms"].as_u64().unwrap() <= 5000,
        "{st}"
    );

    // Let the command finish: exit 0, keys gone.
    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    released_everywhere(&m, key);
    let st = json(&output(
        redlock(Some(&m), &["status", "--json", key]),
        Duration::from_secs(10),
    ));
    assert_eq!(st["locked"], false, "{st}");

    // And now a --no-wait run gets it.
    let third = output(
        {
            let mut c = redlock(Some(&m), &["run", "-n", key, "--", "touch"]);
            c.arg(s.file("third"));
            c
        },
        Duration::from_secs(10),
    );
    assert_eq!(code(&third), 0, "stderr: {}", stderr(&third));
    assert!(s.path("third").exists());
}

#[test]
fn run_exits_with_the_command_status() {
    let m = masters(3);
    let out = output(
        redlock(Some(&m), &["run", "cli:status", "--", "sh", "-c", "exit 7"]),
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 7, "stderr: {}", stderr(&out));
    let out = output(
        redlock(
            Some(&m),
            &["run", "cli:status", "--", "sh", "-c", "kill -KILL $$"],
        ),
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 128 + 9, "stderr: {}", stderr(&out));
    released_everywhere(&m, "cli:status");

    // Not found / not executable, like shells; the lock is released.
    let out = output(
        redlock(
            Some(&m),
            &["run", "cli:status", "--", "/nonexistent/redlock-test-cmd"],
        ),
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 127, "stderr: {}", stderr(&out));
    released_everywhere(&m, "cli:status");
}

#[test]
fn run_starts_the_command_with_no_signal_blocked() {
    // redlock blocks SIGTTIN and SIGTTOU for itself; the command must not inherit that.
    let m = masters(3);
    let out = output(
        redlock(
            Some(&m),
            &[
                "run",
                "cli:mask",
                "--",
                "grep",
                "^SigBlk:",
                "/proc/self/status",
            ],
        ),
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(line.trim(), "SigBlk:\t0000000000000000", "{line}");
}

#[test]
fn run_returns_the_conflict_code_when_the_lock_is_taken() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:conflict";
    let mut other = Redlock::new(m.urls()).expect("client");
    let lock = other.try_lock(key, Duration::from_secs(30)).expect("lock");

    let attempt = |args: &[&str]| {
        let mut c = redlock(Some(&m), &["run"]);
        c.args(args).args([key, "--", "touch"]).arg(s.file("ran"));
        output(c, Duration::from_secs(15))
    };
    let out = attempt(&["--no-wait"]);
    assert_eq!(code(&out), 1, "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains("is locked"), "{}", stderr(&out));
    let out = attempt(&["-n", "-E", "9"]);
    assert_eq!(code(&out), 9, "stderr: {}", stderr(&out));
    let out = attempt(&["-n", "-q", "-E", "0"]);
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert_eq!(stderr(&out), "", "--quiet");
    let out = attempt(&["--wait", "300ms", "--conflict-exit-code", "3"]);
    assert_eq!(code(&out), 3, "stderr: {}", stderr(&out));
    assert!(!s.path("ran").exists(), "a refused run ran its command");

    other.release(lock).expect("release");
    let out = attempt(&["-n"]);
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert!(s.path("ran").exists());
}

#[test]
fn run_exit_codes_for_usage_errors_and_unavailable_masters() {
    let mut m = masters(3);
    // No masters at all.
    let out = output(
        redlock(None, &["run", "r", "--", "true"]),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 64, "stderr: {}", stderr(&out));
    // Bad duration, missing command, bad URL.
    for args in [
        &["run", "--ttl", "soon", "r", "--", "true"][..],
        &["run", "r"][..],
        &["run", "--masters", "http://x:1", "r", "--", "true"][..],
    ] {
        let out = output(redlock(Some(&m), args), Duration::from_secs(10));
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    // Two of three masters down: no quorum, the command does not run.
    m[0].kill().unwrap();
    m[1].kill().unwrap();
    let out = output(
        redlock(Some(&m), &["run", "-n", "r", "--", "true"]),
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 69, "stderr: {}", stderr(&out));
    // status: exit 1 and the dead masters marked unreachable.
    let out = output(redlock(Some(&m), &["status", "r"]), Duration::from_secs(10));
    assert_eq!(code(&out), 1, "stderr: {}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table.matches("unreachable").count(), 2, "{table}");
}

/// Kills a process group (a command started by `run` leads its own) when dropped during a
/// panic, so that a failing test leaves nothing running.
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if thread::panicking() {
            let _ = kill(Pid::from_raw(-(self.0 as i32)), Signal::SIGKILL);
        }
    }
}

/// SIGKILLs a process (a `redlock` the test started and has not reaped, so its PID cannot
/// be reused) when dropped during a panic: a stopped redlock left behind would hold the
/// test's pipes open.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if thread::panicking() {
            let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGKILL);
        }
    }
}

/// Start a long command under `run --ttl 1s`, wait until the lock was kept past its TTL,
/// then break two of the three masters with `fault`; `run` must terminate the command and
/// exit with the lost code within a bounded time. `{term}` in `command` names a file the
/// command may write.
fn lost_lock_case(command: &str, extra: &[&str], fault: fn(&mut LocalMasters, usize)) -> Scratch {
    let mut m = masters(3);
    let s = Scratch::new();
    let key = "cli:lost";
    let command = command.replace("{term}", &s.file("term"));
    let script = format!("echo $$ > '{}'; {command}", s.file("pid"));
    let mut run = redlock(
        Some(&m),
        &[
            "run",
            "--ttl",
            "1s",
            "--kill-grace",
            "1s",
            "--round-timeout",
            "200ms",
        ],
    )
    .args(extra)
    .args([key, "--", "sh", "-c", &script])
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn redlock run");
    let pid = await_pid(&s, "pid");
    // Should this test fail, do not leave the command running.
    let _group = KillGroupOnDrop(pid);
    let started = Instant::now();
    // First the lock is kept past its 1 s TTL by extensions.
    await_extended_past_ttl(&m, key, started);
    let broke = Instant::now();
    fault(&mut m, 0);
    fault(&mut m, 1);
    // Lost at the next extension (within a third of the TTL), then SIGTERM, then SIGKILL
    // after the 1 s grace: 5 s is ample.
    let status = wait_exit(&mut run, Duration::from_secs(10));
    let took = broke.elapsed();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err);
    let want = if extra.contains(&"--lost-exit-code") {
        42
    } else {
        75
    };
    assert_eq!(status.code(), Some(want), "stderr: {err}");
    assert!(err.contains("LOST THE LOCK"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    assert!(!alive(pid), "the command (pid {pid}) outlived redlock");
    s
}

#[test]
fn lost_lock_terminates_the_command_when_masters_freeze() {
    // The command gets SIGTERM and exits.
    let s = lost_lock_case(
        "trap 'echo got > \"{term}\"; exit 0' TERM; while :; do sleep 0.05; done",
        &[],
        |m, i| m[i].freeze().unwrap(),
    );
    let got = std::fs::read_to_string(s.path("term")).unwrap_or_default();
    assert_eq!(got.trim(), "got", "the command did not get SIGTERM");
}

#[test]
fn lost_lock_kills_a_command_that_ignores_sigterm_when_masters_die() {
    // SIGTERM is ignored (and inherited as ignored by the sleeps): SIGKILL after the grace.
    let _ = lost_lock_case(
        "trap '' TERM; while :; do sleep 0.05; done",
        &["--lost-exit-code", "42"],
        |m, i| m[i].kill().unwrap(),
    );
}

/// Issue 21: with `--ttl 30s` the next extension comes 20 s after the grant; a quorum of
/// keys deleted by hand is heard from the masters at once, and the command gets SIGTERM
/// then (the time is printed; the assertion's bound, 3 s, leaves room for a loaded machine
/// and is still far below the extension).
#[test]
fn run_terminates_the_command_at_once_when_a_quorum_of_keys_is_deleted() {
    let m = masters(5);
    let s = Scratch::new();
    let key = "cli:lost-at-once";
    let script = format!(
        "echo $$ > '{}'; trap 'echo got > \"{}\"; exit 0' TERM; while :; do sleep 0.05; done",
        s.file("pid"),
        s.file("term")
    );
    let mut run = redlock(Some(&m), &["run", "--ttl", "30s"])
        .args([key, "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlock run");
    let pid = await_pid(&s, "pid");
    let _group = KillGroupOnDrop(pid);
    // The watch is armed once every master tracks the key.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let armed = (0..5).all(|i| {
            let Ok(AdminReply::Bulk(Some(text))) = m[i].cmd(&[b"INFO", b"stats"]) else {
                return false;
            };
            String::from_utf8_lossy(&text).contains("tracking_total_keys:1")
        });
        if armed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the masters never tracked the key"
        );
        thread::sleep(Duration::from_millis(2));
    }
    let t0 = Instant::now();
    for i in 0..3 {
        m[i].cmd(&[b"DEL", key.as_bytes()]).unwrap();
    }
    let status = wait_exit(&mut run, Duration::from_secs(10));
    let took = t0.elapsed();
    let err = take_stderr(&mut run);
    let got = std::fs::read_to_string(s.path("term")).unwrap_or_default();
    eprintln!("redlock run: the command exited {took:?} after the DELs");
    assert_eq!(
        got.trim(),
        "got",
        "the command did not get SIGTERM; stderr: {err}"
    );
    assert_eq!(status.code(), Some(75), "stderr: {err}");
    assert!(err.contains("LOST THE LOCK"), "{err}");
    assert!(err.contains("watch"), "{err}");
    assert!(took < Duration::from_secs(3), "took {took:?}: {err}");
}

#[test]
fn sigterm_is_forwarded_to_the_command_and_the_lock_released_after() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:signal";
    let script = format!(
        "trap 'echo got > \"{term}\"; exit 3' TERM; {gate}",
        term = s.file("term"),
        gate = gated(&s, "exit 0")
    );
    // stderr piped: the shell says "Terminated" of the `sleep` the signal ended (the test
    // would print it among cargo's lines).
    let mut run = redlock(Some(&m), &["run", key, "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlock run");
    let _run = KillOnDrop(run.id());
    await_start(&mut run, &s);
    held_everywhere(&m, key);
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    let err = take_stderr(&mut run);
    assert_eq!(
        status.code(),
        Some(3),
        "the command's trap status; stderr: {err}"
    );
    let got = std::fs::read_to_string(s.path("term")).unwrap_or_default();
    assert_eq!(got.trim(), "got", "the command did not get SIGTERM");
    released_everywhere(&m, key);
}

#[test]
fn sigint_while_waiting_gives_up_at_once_without_running_the_command() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:wait-signal";
    let mut other = Redlock::new(m.urls()).expect("client");
    let lock = other.try_lock(key, Duration::from_secs(30)).expect("lock");
    // On every master before `run` asks (a late SET of ours would land after its attempt).
    let seen = other.inspect("settle").expect("the settling inspection");
    assert_eq!(seen.answered(), 3, "every master answered: {seen}");
    let mut run = redlock(
        Some(&m),
        &["run", "-v", "--wait", "60s", key, "--", "touch"],
    )
    .arg(s.file("ran"))
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn redlock run");
    // The "locking" line comes after the signal handlers are installed.
    let (tx, rx) = mpsc::channel();
    let err = run.stderr.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a first stderr line");
    assert!(line.contains("locking"), "{line}");
    let sent = Instant::now();
    kill(Pid::from_raw(run.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(130));
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert!(!s.path("ran").exists());
    // Still ours.
    assert!(holders(&m, key)
        .iter()
        .all(|h| h.as_deref() == Some(lock.token().as_bytes())));
    other.release(lock).expect("release");
}

fn bench(args: &[&str]) -> (Output, serde_json::Value) {
    // A patient round timeout: on a loaded machine the default (50 ms for a 10 s TTL)
    // can pass, which is an error the bench rightly counts, not a broken run.
    let mut all = vec![
        "bench",
        "--json",
        "--local",
        "3",
        "--duration",
        "1s",
        "--round-timeout",
        "2s",
    ];
    all.extend_from_slice(args);
    let out = output(redlock(None, &all), Duration::from_secs(60));
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    let j = json(&out);
    // Local masters are stopped on exit: their processes are gone. (Not "their ports
    // refuse connections": another test running beside this one may have been given a
    // port the bench's masters freed.)
    let pids = j["local_master_pids"]
        .as_array()
        .expect("local_master_pids");
    assert_eq!(
        pids.len(),
        j["masters"].as_array().expect("masters").len(),
        "{j}"
    );
    for pid in pids {
        let pid = pid.as_u64().expect("a pid");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("redis-server"),
            "local master (pid {pid}) still runs after bench exited"
        );
    }
    (out, j)
}

fn assert_sane(j: &serde_json::Value) {
    let me = &j["mutual_exclusion"];
    assert_eq!(me["ok"], true, "{j}");
    assert_eq!(me["violations"], 0, "{j}");
    let acquired = j["acquired"].as_u64().unwrap();
    let cycles = j["cycles"].as_u64().unwrap();
    assert!(acquired > 0, "{j}");
    assert_eq!(cycles, acquired, "every grant completes its cycle: {j}");
    assert_eq!(me["grants"], acquired, "{j}");
    assert_eq!(me["holds_checked"], acquired, "{j}");
    for op in ["acquire", "release", "cycle"] {
        let l = &j["latency_us"][op];
        assert_eq!(l["count"], cycles, "{op}: {j}");
        let p50 = l["p50"].as_u64().unwrap();
        let p99 = l["p99"].as_u64().unwrap();
        let max = l["max"].as_u64().unwrap();
        assert!(0 < p50 && p50 <= p99 && p99 <= max, "{op}: {j}");
    }
    assert!(j["throughput_per_s"].as_f64().unwrap() > 0.0, "{j}");
    assert!(
        j["cpu_us_per_cycle"]["total"].as_f64().unwrap() > 0.0,
        "{j}"
    );
    assert_eq!(j["errors"], 0, "{j}");
}

#[test]
fn bench_json_reports_no_violations_and_sane_counts() {
    let (_, j) = bench(&[]);
    assert_sane(&j);
    assert_eq!(j["masters"].as_array().unwrap().len(), 3);
    assert_eq!(j["quorum"], 2);
    assert_eq!(
        j["refused"], 0,
        "one client, one resource: no contention: {j}"
    );
    // The masters' side (issue 23): CPU time, and per master and cycle what the floor with
    // a Lua release runs (SET, then EVALSHA running GET and DEL), nothing more; on Valkey 9
    // SET and DELIFEQ, no script.
    if server_offers_delifeq() {
        assert_commands_per_cycle(&j, &[("delifeq", 1), ("set", 1)]);
    } else {
        assert_commands_per_cycle(&j, &[("del", 1), ("evalsha", 1), ("get", 1), ("set", 1)]);
    }
}

/// The local masters' server (`REDIS_SERVER`) is Valkey 9 or later: a lock that did not
/// wait is released with `DELIFEQ` there, not the script.
fn server_offers_delifeq() -> bool {
    let path = redlock_mux::local::redis_server_path().expect("the server binary");
    let out = Command::new(&path)
        .arg("--version")
        .output()
        .expect("server --version");
    String::from_utf8_lossy(&out.stdout)
        .strip_prefix("Valkey server v=")
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 9)
}

/// Each master that took every grant ran `expected` (command, times per cycle) and nothing
/// else; a command under 0.05 per cycle is the connections' handshake, once per run. At
/// least a quorum (2 of 3) must have taken every grant: under heavy load (load average 12,
/// other test binaries and builds beside) one master can fall behind the quorum by more
/// than `NetConfig::backlog_limit` requests; it is then not sent grants until it catches up
/// (its releases, always sent, find no key: `ZREM` of the line), and the commands it still
/// owes are not in the statistics read at the end (seen: `set` 0.52 per cycle on one
/// master of a debug build's run).
fn assert_commands_per_cycle(j: &serde_json::Value, expected: &[(&str, u32)]) {
    let servers = &j["servers"];
    assert!(servers["cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{j}");
    let masters = servers["per_master"].as_array().expect("per_master");
    assert_eq!(masters.len(), 3, "{j}");
    let names: Vec<&str> = expected.iter().map(|(name, _)| *name).collect();
    let took_every_grant =
        |m: &&serde_json::Value| m["commands_per_cycle"]["set"].as_f64().unwrap_or(0.0) >= 0.95;
    let checked: Vec<&serde_json::Value> = masters.iter().filter(took_every_grant).collect();
    assert!(
        checked.len() >= 2,
        "fewer than a quorum took every grant: {j}"
    );
    for m in checked {
        let commands = m["commands_per_cycle"].as_object().expect("commands");
        let mut run: Vec<&str> = commands
            .iter()
            .filter(|(_, n)| n.as_f64().unwrap() >= 0.05)
            .map(|(name, _)| name.as_str())
            .collect();
        run.sort_unstable();
        assert_eq!(run, names, "{j}");
        for (name, times) in expected {
            let n = commands[*name].as_f64().unwrap() / f64::from(*times);
            assert!(
                (0.95..1.2).contains(&n),
                "{name} {n} x {times} per cycle: {j}"
            );
        }
    }
}

/// An uncontended `lock()` (the waiting acquire, `--wait-mode notify`) costs each master
/// one `EXISTS` more than the floor (the acquire script looks for a line of waiters) and
/// runs through `EVALSHA`: its release leaves no line it never stood in (it ran `DEL` of a
/// waiter key and `ZREM` besides, issue 23).
#[test]
fn bench_notify_uncontended_runs_the_floor_and_one_exists() {
    let (_, j) = bench(&["--wait-mode", "notify"]);
    assert_sane(&j);
    assert_eq!(
        j["refused"], 0,
        "one client, one resource: no contention: {j}"
    );
    // On Valkey 9 too: a `lock()` in notify mode takes a place id for the key's line, and
    // its release (which leaves the line where it may stand) keeps the script.
    assert_commands_per_cycle(
        &j,
        &[
            ("del", 1),
            ("evalsha", 2),
            ("exists", 1),
            ("get", 1),
            ("set", 1),
        ],
    );
}

/// A contended hand-off (issue 23): each master runs the release's `GET`, `ZREM`, `DEL`,
/// `ZRANGE`, `EXISTS` (the next waiter's liveness) and `PUBLISH`, the granted waiter's
/// `ZRANK` (its place in line), `SET NX`, liveness `PEXPIRE` and the line's `PTTL`, and the
/// refused re-asker's `GET`, `ZADD`, `PTTL`s and liveness `SET`. Before: an `EXISTS` of the
/// line in every attempt and every release, a failing `SET NX` and a `ZADD NX` of a waiter
/// already in line in every attempt, and a `DEL` of the releasing waiter's liveness key
/// (`exists` about 4 and `del` about 2 per grant and master, `zrank` never).
#[test]
fn bench_notify_contended_grant_skips_what_it_knows() {
    let (_, j) = bench(&[
        "--clients",
        "4",
        "--resources",
        "1",
        "--wait-mode",
        "notify",
    ]);
    assert_sane(&j);
    assert!(j["refused"].as_u64().unwrap() > 0, "no contention: {j}");
    for m in j["servers"]["per_master"].as_array().expect("per_master") {
        let c = &m["commands_per_cycle"];
        let n = |name: &str| c[name].as_f64().unwrap_or(0.0);
        assert!(n("zrank") > 0.3, "the in-line path is used: {j}");
        assert!(n("exists") < 2.5, "exists {} per grant: {j}", n("exists"));
        assert!(n("del") < 1.6, "del {} per grant: {j}", n("del"));
    }
}

#[test]
fn bench_with_contention_reports_no_violations() {
    let (_, j) = bench(&["--clients", "3", "--resources", "1"]);
    assert_sane(&j);
    assert_eq!(j["resources"], 1);
    assert!(
        j["refused"].as_u64().unwrap() > 0,
        "no contention seen: {j}"
    );
}

#[test]
fn bench_with_locks_in_flight_reports_no_violations() {
    let (_, j) = bench(&["--clients", "2", "--in-flight", "4", "--resources", "3"]);
    assert_sane(&j);
    assert_eq!(j["in_flight"], 4);
    assert_eq!(j["round_timeout_ms"], 2000.0);
}

/// `--release-with-next` (issue 22's scaling runs): each batch's locks are dropped, and
/// the client releases them with the next batch's locks, in the same write. Contended
/// resources still pass the mutual-exclusion check (a hold is recorded as ending before
/// its keys are deleted); the locks are released during the run (3 resources under a 10 s
/// TTL could give 3 grants in 1 s otherwise) and after it (no key left once the bench has
/// exited, long before any TTL); no release latency is reported, none being measured.
#[test]
fn bench_release_with_next_releases_every_lock() {
    let m = masters(3);
    let urls = m.urls().join(",");
    let args = [
        "bench",
        "--json",
        "--masters",
        urls.as_str(),
        "--duration",
        "1s",
        "--round-timeout",
        "2s",
        "--clients",
        "2",
        "--in-flight",
        "4",
        "--resources",
        "3",
        "--release-with-next",
    ];
    let out = output(redlock(None, &args), Duration::from_secs(60));
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["release_with_next"], true, "{j}");
    let me = &j["mutual_exclusion"];
    assert_eq!(me["ok"], true, "{j}");
    assert_eq!(me["violations"], 0, "{j}");
    let acquired = j["acquired"].as_u64().unwrap();
    assert!(acquired > 3, "locks released during the run: {j}");
    assert_eq!(j["cycles"], acquired, "{j}");
    assert_eq!(me["holds_checked"], acquired, "{j}");
    assert_eq!(j["errors"], 0, "{j}");
    assert_eq!(j["latency_us"]["release"]["count"], 0, "{j}");
    assert_eq!(j["latency_us"]["cycle"]["count"], acquired, "{j}");
    // The last batch's locks were released when the client was dropped: bounded poll (the
    // releases were written before the process exited; each master runs them in order).
    let keys = || -> i64 {
        (0..3)
            .map(|i| match m[i].cmd(&[b"DBSIZE"]).unwrap() {
                AdminReply::Int(n) => n,
                other => panic!("DBSIZE: {other:?}"),
            })
            .sum()
    };
    let until = Instant::now() + Duration::from_secs(5);
    while keys() != 0 && Instant::now() < until {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(keys(), 0, "keys left after the bench (TTL 10 s): {j}");
}

#[test]
fn bench_callers_share_one_client_with_no_violations() {
    let (_, j) = bench(&["--callers", "4"]);
    assert_sane(&j);
    assert_eq!(j["mode"], "callers", "{j}");
    assert_eq!(j["shared_client"], true, "{j}");
    assert_eq!(j["callers"], 4, "{j}");
    assert_eq!(j["clients"], 1, "{j}");
    assert_eq!(j["resources"], 4, "one resource per caller by default: {j}");
    assert_eq!(j["refused"], 0, "no contention: {j}");
}

#[test]
fn bench_tasks_share_one_client_with_no_violations() {
    let (_, j) = bench(&["--tasks", "8", "--busy-poll"]);
    assert_sane(&j);
    assert_eq!(j["mode"], "tasks", "{j}");
    assert_eq!(j["callers"], 8, "{j}");
    assert_eq!(j["tokio_worker_threads"], 1, "{j}");
    assert_eq!(j["busy_poll"], true, "{j}");
    assert_eq!(j["resources"], 8, "one resource per task by default: {j}");
    assert_eq!(j["refused"], 0, "no contention: {j}");
}

#[test]
fn bench_shared_client_with_contention_reports_no_violations() {
    for mode in ["--callers", "--tasks"] {
        let (_, j) = bench(&[mode, "6", "--resources", "1"]);
        assert_sane(&j);
        assert_eq!(j["resources"], 1, "{mode}: {j}");
        assert!(
            j["refused"].as_u64().unwrap() > 0,
            "{mode}: no contention seen: {j}"
        );
    }
}

#[test]
fn bench_shared_modes_reject_single_owner_options() {
    for args in [
        &["bench", "--callers", "2", "--clients", "2"][..],
        &["bench", "--tasks", "2", "--in-flight", "4"],
        &["bench", "--callers", "2", "--tasks", "2"],
        &["bench", "--tasks", "2", "--pin"],
        &["bench", "--callers", "0"],
    ] {
        let out = output(redlock(None, args), Duration::from_secs(10));
        assert_eq!(code(&out), 64, "{args:?}: stderr: {}", stderr(&out));
    }
}

#[test]
fn bench_pin_puts_the_client_and_the_local_masters_on_separate_cpus() {
    // Only for the masters it starts itself.
    let out = output(
        redlock(
            None,
            &[
                "bench",
                "--pin",
                "--masters",
                "redis://127.0.0.1:1",
                "-d",
                "1s",
            ],
        ),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 64, "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains("--pin only works with the local masters"));
    // A CPU per client and one left for the masters, or a usage error before any start.
    let cpus = redlock_mux::local::current_thread_cpus().expect("CPU affinity");
    let too_many = cpus.len().to_string();
    let out = output(
        redlock(
            None,
            &["bench", "--pin", "--clients", &too_many, "-d", "1s"],
        ),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 64, "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("keep one for the masters"),
        "{}",
        stderr(&out)
    );
    if cpus.len() < 2 {
        return; // nothing to pin apart on one CPU
    }
    let (_, j) = bench(&["--pin", "--busy-poll"]);
    assert_sane(&j);
    assert_eq!(
        j["pinned"]["client_cpus"],
        serde_json::json!([cpus[0]]),
        "{j}"
    );
    assert_eq!(
        j["pinned"]["master_cpus"],
        serde_json::json!(cpus[1..]),
        "{j}"
    );
    let (_, j) = bench(&[]);
    assert!(j["pinned"].is_null(), "unpinned by default: {j}");
}

#[test]
fn bench_ctrl_c_stops_the_local_masters_and_exits_130() {
    let mut run = redlock(None, &["bench", "--local", "3", "--duration", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redlock bench");
    let children = |pid: u32| -> Vec<u32> {
        let mut out = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    out.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
                }
            }
        }
        out
    };
    let mut servers = Vec::new();
    eventually("3 redis-server children", Duration::from_secs(20), || {
        servers = children(run.id());
        servers.len() == 3
    });
    kill(Pid::from_raw(run.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
    for pid in servers {
        assert!(!alive(pid), "redis-server {pid} outlived the bench");
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z` zombie...), or `None`
/// when there is no such process.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Read a child's piped stderr to the end (after it exited).
fn take_stderr(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    err
}

#[test]
fn sigkill_to_redlock_takes_the_command_and_its_background_jobs_with_it() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:killed";
    // A background grandchild in COMMAND's process group, and the leader waiting for it.
    let script = format!(
        "sleep 600 & echo $! > '{job}'; echo $$ > '{pid}'; wait",
        job = s.file("job"),
        pid = s.file("pid")
    );
    let mut run = redlock(
        Some(&m),
        &[
            "run",
            "--ttl",
            "1s",
            "--kill-grace",
            "300ms",
            key,
            "--",
            "sh",
            "-c",
        ],
    )
    .arg(&script)
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn redlock run");
    eventually("the command to start", Duration::from_secs(10), || {
        read_pid(&s.path("pid")).is_some() && read_pid(&s.path("job")).is_some()
    });
    let pid = read_pid(&s.path("pid")).unwrap();
    let job = read_pid(&s.path("job")).unwrap();
    let _group = KillGroupOnDrop(pid);
    assert!(alive(pid) && alive(job));
    held_everywhere(&m, key);

    kill(Pid::from_raw(run.id() as i32), Signal::SIGKILL).unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(5));
    assert_eq!(status.signal(), Some(9), "{status:?}");
    // The leader (parent-death signal) and the background job (watchdog) go at once,
    // long before the lock's TTL lets anyone else in.
    eventually(
        "the command and its background job to be gone after redlock was killed",
        Duration::from_secs(2),
        || !alive(pid) && !alive(job),
    );

    // After the TTL a second holder runs, and nothing of the first command runs with it.
    eventually("the lock to expire", Duration::from_secs(5), || {
        holders(&m, key).iter().all(Option::is_none)
    });
    let second = output(
        {
            let mut c = redlock(Some(&m), &["run", "-n", key, "--", "sh", "-c"]);
            c.arg(format!("touch '{}'", s.file("second")));
            c
        },
        Duration::from_secs(10),
    );
    assert_eq!(code(&second), 0, "stderr: {}", stderr(&second));
    assert!(s.path("second").exists());
    assert!(
        !alive(pid) && !alive(job),
        "the first command overlapped the second holder"
    );
}

/// Start `sh -c` ticking into a file under `run --ttl TTL`, and wait until it ticks.
fn ticking(m: &LocalMasters, s: &Scratch, key: &str, ttl: &str, extra: &[&str]) -> (Child, u32) {
    let script = format!(
        "echo $$ > '{pid}'; i=0; while [ ! -e '{go}' ] && [ $i -lt 1200 ]; do \
         echo t >> '{ticks}'; sleep 0.05; i=$((i+1)); done",
        pid = s.file("pid"),
        go = s.file("go"),
        ticks = s.file("ticks"),
    );
    let run = redlock(
        Some(m),
        &[
            "run",
            "--ttl",
            ttl,
            "--kill-grace",
            "300ms",
            "--round-timeout",
            "200ms",
        ],
    )
    .args(extra)
    .args([key, "--", "sh", "-c", &script])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn redlock run");
    eventually("the command to tick", Duration::from_secs(10), || {
        read_pid(&s.path("pid")).is_some() && lines(&s.path("ticks")) > 0
    });
    (run, read_pid(&s.path("pid")).unwrap())
}

/// Whether the command (its process group's leader, `sh`) is stopped: in state `T`, or in
/// `D` inside a `vfork` whose child is stopped before its `exec`. dash starts `sleep`
/// with `vfork`: a SIGSTOP to the group that lands between the `vfork` and the child's
/// `exec` stops the child there, and the parent waits for it (uninterruptibly, `D`) until
/// both are continued: it cannot run either. A loaded machine widens that window (2 of 300
/// stops of such a loop under two CPU hogs); the state lasts until SIGCONT, so no wait
/// turns it into `T`. A leader in `D` for any other reason, or whose child runs on, is not
/// stopped.
fn command_stopped(pid: u32) -> bool {
    match proc_state(pid) {
        Some('T') => true,
        Some('D') => in_vfork_of_a_stopped_child(pid),
        _ => false,
    }
}

/// `pid` waits in `vfork` (where the kernel says: `wchan`, unless hidden) for a child that
/// is stopped and still runs `pid`'s program (it has not called `exec`).
fn in_vfork_of_a_stopped_child(pid: u32) -> bool {
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    let hidden = wchan.is_empty() || wchan == "0";
    if !hidden && !wchan.contains("clone") && !wchan.contains("fork") {
        return false;
    }
    let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe")).ok();
    let Some(program) = exe(pid) else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .any(|c| proc_state(c) == Some('T') && exe(c).as_ref() == Some(&program))
}

/// Wait (bounded) until redlock is stopped (`T`) and the command too ([`command_stopped`]).
/// Generous: on a loaded machine the command may sit in uninterruptible sleep (`D`,
/// appending to its file) for a while before a stop takes it.
fn both_stopped(redlock: u32, command: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (stopped, stopped_command) = (proc_state(redlock), command_stopped(command));
        if stopped == Some('T') && stopped_command {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redlock and the command not both stopped (T) after SIGTSTP to redlock: \
             redlock {stopped:?}, command {:?} (wchan {:?})",
            proc_state(command),
            std::fs::read_to_string(format!("/proc/{command}/wchan")).unwrap_or_default(),
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn ctrl_z_stops_the_command_too_and_kills_it_if_the_lock_expired_meanwhile() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:tstp-expired";
    let (mut run, pid) = ticking(&m, &s, key, "1s", &[]);
    let _run = KillOnDrop(run.id());
    let _group = KillGroupOnDrop(pid);
    let started = Instant::now();
    await_extended_past_ttl(&m, key, started);

    kill(Pid::from_raw(run.id() as i32), Signal::SIGTSTP).unwrap();
    both_stopped(run.id(), pid);
    let ticks = lines(&s.path("ticks"));
    // Stopped past its TTL: the lock expires, and a second holder may run.
    eventually("the lock to expire", Duration::from_secs(5), || {
        holders(&m, key).iter().all(Option::is_none)
    });
    let second = output(
        redlock(Some(&m), &["run", "-n", key, "--", "true"]),
        Duration::from_secs(10),
    );
    assert_eq!(code(&second), 0, "stderr: {}", stderr(&second));
    assert!(
        command_stopped(pid),
        "the first command ran on: {:?}",
        proc_state(pid)
    );
    assert_eq!(lines(&s.path("ticks")), ticks, "the first command ran on");

    // Continued: the lock is gone, so the command is killed, never continued.
    kill(Pid::from_raw(run.id() as i32), Signal::SIGCONT).unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    let err = take_stderr(&mut run);
    assert_eq!(status.code(), Some(75), "stderr: {err}");
    assert!(!alive(pid), "the command outlived the lost lock");
    assert_eq!(
        lines(&s.path("ticks")),
        ticks,
        "the command ran after the lock expired"
    );
}

#[test]
fn ctrl_z_then_fg_within_the_ttl_continues_the_command_under_the_lock() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:tstp-fg";
    let (mut run, pid) = ticking(&m, &s, key, "20s", &[]);
    let _run = KillOnDrop(run.id());
    let _group = KillGroupOnDrop(pid);
    let token = held_everywhere(&m, key);

    kill(Pid::from_raw(run.id() as i32), Signal::SIGTSTP).unwrap();
    both_stopped(run.id(), pid);
    let ticks = lines(&s.path("ticks"));
    kill(Pid::from_raw(run.id() as i32), Signal::SIGCONT).unwrap();
    eventually("the command to tick again", Duration::from_secs(5), || {
        lines(&s.path("ticks")) > ticks
    });
    assert!(holders(&m, key)
        .iter()
        .all(|h| h.as_deref() == Some(&token[..])));

    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    let err = take_stderr(&mut run);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    released_everywhere(&m, key);
}

#[test]
fn lost_lock_with_stderr_a_broken_pipe_still_terminates_the_command() {
    let mut m = masters(3);
    let s = Scratch::new();
    let key = "cli:epipe";
    // The command's own stderr goes elsewhere: `sh` reporting its killed `sleep` on a
    // broken pipe would die of SIGPIPE before its trap runs.
    let script = format!(
        "exec 2>/dev/null; echo $$ > '{pid}'; trap 'echo got > \"{term}\"; exit 0' TERM; \
         i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        pid = s.file("pid"),
        term = s.file("term"),
    );
    // --kill-grace below a third of --ttl: no warning at start, the first message is the
    // lost lock's.
    let mut run = redlock(
        Some(&m),
        &[
            "run",
            "--ttl",
            "1s",
            "--kill-grace",
            "300ms",
            "--round-timeout",
            "200ms",
            key,
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn redlock run");
    // Nobody reads redlock's stderr any more: writes to it fail with EPIPE.
    drop(run.stderr.take());
    let pid = await_pid(&s, "pid");
    let _group = KillGroupOnDrop(pid);
    let started = Instant::now();
    await_extended_past_ttl(&m, key, started);
    m[0].freeze().unwrap();
    m[1].freeze().unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(75), "{status:?}");
    let got = std::fs::read_to_string(s.path("term")).unwrap_or_default();
    assert_eq!(got.trim(), "got", "the command did not get SIGTERM");
    assert!(!alive(pid), "the command outlived the lost lock");
}

#[test]
fn run_keeps_the_lock_until_background_jobs_of_the_command_exit() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:background";
    // The leader starts a job in its process group and exits at once.
    let script = format!(
        "( {job} ) & echo $$ > '{pid}'; exit 0",
        job = gated(&s, "exit 0"),
        pid = s.file("pid")
    );
    let mut run = redlock(Some(&m), &["run", "--ttl", "1s", "--kill-grace", "300ms"])
        .args([key, "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlock run");
    eventually("the command to start", Duration::from_secs(10), || {
        read_pid(&s.path("pid")).is_some() && s.path("started").exists()
    });
    let pid = read_pid(&s.path("pid")).unwrap();
    let _group = KillGroupOnDrop(pid);
    eventually("the leader to exit", Duration::from_secs(5), || !alive(pid));
    let leader_gone = Instant::now();
    // (A lock released when the leader exited, while its job still runs, is never held
    // everywhere again: this times out.)
    let token = held_everywhere(&m, key);
    // Held, and extended past its TTL, while the job runs.
    while leader_gone.elapsed() < Duration::from_millis(1500) {
        assert!(
            holders(&m, key)
                .iter()
                .all(|h| h.as_deref() == Some(&token[..])),
            "the lock was released while a job of the command still ran"
        );
        assert_eq!(run.try_wait().expect("try_wait"), None, "redlock exited");
        thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    let err = take_stderr(&mut run);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    released_everywhere(&m, key);
}

/// Wait (bounded) until the gated command of `run` created `started`; panic with
/// redlock's stderr (piped) if redlock exits first.
fn await_start(run: &mut Child, s: &Scratch) {
    let mut exited = None;
    eventually("the command to start", Duration::from_secs(10), || {
        exited = run.try_wait().expect("try_wait");
        s.path("started").exists() || exited.is_some()
    });
    if let Some(status) = exited {
        if !s.path("started").exists() {
            panic!(
                "redlock exited ({status}) before the command started: {}",
                take_stderr(run)
            );
        }
    }
}

/// `PTTL key` on master `i`, in ms.
fn pttl(m: &LocalMasters, i: usize, key: &str) -> i64 {
    match m[i].cmd(&[b"PTTL", key.as_bytes()]).expect("PTTL") {
        AdminReply::Int(ms) => ms,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

#[test]
fn durations_take_bare_seconds_like_flock_and_humantime_forms() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:durations";
    // `--ttl 2` is two seconds (fractions too: `--wait 0.5`), like `flock -w 10`.
    let mut holder = redlock(
        Some(&m),
        &["run", "--ttl", "2", "-w", "10", key, "--", "sh", "-c"],
    )
    .arg(gated(&s, "exit 0"))
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn redlock run");
    let _run = KillOnDrop(holder.id());
    await_start(&mut holder, &s);
    held_everywhere(&m, key);
    let ms = pttl(&m, 0, key);
    assert!(0 < ms && ms <= 2000, "--ttl 2 gave PTTL {ms} ms");

    // The lock is held: `-w 0.5` waits half a second (its last attempt starts then), then
    // gives up.
    let started = Instant::now();
    let out = output(
        redlock(Some(&m), &["run", "-w", "0.5", key, "--", "true"]),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 1, "stderr: {}", stderr(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "-w 0.5 gave up after {:?}",
        started.elapsed()
    );
    // humantime forms still work, `1.5s` and `1m30s` included.
    let out = output(
        redlock(
            Some(&m),
            &[
                "run",
                "-w",
                "250ms",
                "--ttl",
                "1m30s",
                "--kill-grace",
                "1.5s",
                key,
                "--",
                "true",
            ],
        ),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 1, "stderr: {}", stderr(&out));
    let out = output(
        redlock(Some(&m), &["status", "--timeout", "0.25", key]),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));

    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(0),
        "stderr: {}",
        take_stderr(&mut holder)
    );

    // A bad duration is a usage error whose hint shows forms that work.
    for bad in ["10x", "soon", "-1", "1e3", "0.5.1", ""] {
        let wait = format!("--wait={bad}");
        let out = output(
            redlock(Some(&m), &["run", &wait, key, "--", "true"]),
            Duration::from_secs(10),
        );
        assert_eq!(code(&out), 64, "-w {bad}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("30s") && err.contains("0.5") && !err.contains("0sec"),
            "-w {bad}: {err}"
        );
    }
}

#[test]
fn help_never_shows_the_masters_from_the_environment() {
    // REDLOCK_MASTERS holds passwords: `--help` names the variable, never its value.
    let m = LocalMasters::start_with(3, &["--requirepass", "s3cret-in-env"])
        .expect("start 3 redis-server masters with a password");
    assert!(m.urls()[0].contains("s3cret-in-env"), "{:?}", m.urls());
    for sub in [
        &["run", "--help"][..],
        &["status", "--help"],
        &["bench", "--help"],
        &["--help"],
    ] {
        let out = output(redlock(Some(&m), sub), Duration::from_secs(10));
        assert_eq!(code(&out), 0, "{sub:?}: {}", stderr(&out));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            !help.contains("s3cret-in-env"),
            "{sub:?} shows the password:\n{help}"
        );
        for port in m.iter().map(|x| format!("127.0.0.1:{}", x.port())) {
            assert!(!help.contains(&port), "{sub:?} shows the masters:\n{help}");
        }
        if sub[0] != "--help" {
            assert!(help.contains("REDLOCK_MASTERS"), "{sub:?}:\n{help}");
        }
    }
    // Usage errors do not show it either.
    let out = output(redlock(Some(&m), &["run"]), Duration::from_secs(10));
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(!stderr(&out).contains("s3cret-in-env"), "{}", stderr(&out));
}

/// `run ARGS` to completion (bounded), with the command's stdout captured.
fn run_out(m: &LocalMasters, args: &[&str]) -> Output {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    output(redlock(Some(m), &all), Duration::from_secs(15))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn run_takes_the_command_with_or_without_a_double_dash_like_flock() {
    let m = masters(3);
    let key = "cli:argv";
    // flock FILE COMMAND...: the first word after RESOURCE starts COMMAND, and every option
    // after it is COMMAND's (`-n` is not redlock's --no-wait here, `--` is printf's).
    let out = run_out(&m, &[key, "printf", "%s|", "-n", "--", "-c", "x"]);
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "-n|--|-c|x|");
    // redlock's options before RESOURCE, or between it and COMMAND.
    let out = run_out(&m, &["-n", "--ttl", "5", key, "printf", "%s|", "a"]);
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "a|");
    let out = run_out(&m, &[key, "--ttl", "5", "-n", "printf", "%s|", "b"]);
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "b|");
    // `--` still works, and lets COMMAND start with a dash.
    let out = run_out(&m, &[key, "--", "printf", "%s|", "-n", "--"]);
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "-n|--|");
    let out = run_out(&m, &[key, "--", "-not-a-command"]);
    assert_eq!(code(&out), 127, "stderr: {}", stderr(&out));
    // No COMMAND at all is a usage error.
    for args in [&[key][..], &[key, "--"]] {
        let out = run_out(&m, args);
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    released_everywhere(&m, key);
}

#[test]
fn run_dash_c_passes_one_command_to_the_shell_like_flock() {
    let m = masters(3);
    let key = "cli:dash-c";
    let out = run_out(&m, &[key, "-c", "echo \"$((6 * 7))\" | tr 4 x; exit 3"]);
    assert_eq!(code(&out), 3, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "x2\n");
    // Long form, before RESOURCE; the lock is held while it runs.
    let s = Scratch::new();
    let mut run = redlock(
        Some(&m),
        &["run", "--command", &gated(&s, "exit 5"), "-n", key],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn redlock run");
    let _run = KillOnDrop(run.id());
    await_start(&mut run, &s);
    held_everywhere(&m, key);
    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(5), "stderr: {}", take_stderr(&mut run));
    // -c and a COMMAND together are a usage error; so is -c without RESOURCE.
    for args in [&[key, "-c", "true", "false"][..], &["-c", "true"]] {
        let out = run_out(&m, args);
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    released_everywhere(&m, key);
}

/// Start `run EXTRA KEY -c SCRIPT`, where SCRIPT writes the lock variables of its
/// environment to a file, then waits on the gate; return them (and the holders of the key
/// while the command runs) once it has exited 0.
fn lock_env(
    m: &LocalMasters,
    key: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vec<String>, Vec<Option<Vec<u8>>>) {
    let s = Scratch::new();
    let script = format!(
        "printf '%s\\n' \"${{REDLOCK_RESOURCE-unset}}\" \"${{REDLOCK_TOKEN-unset}}\" \
         \"${{REDLOCK_FENCING_TOKEN-unset}}\" > '{env}'; {gate}",
        env = s.file("env"),
        gate = gated(&s, "exit 0")
    );
    let mut run = redlock(Some(m), &["run"]);
    run.args(extra)
        .args([key, "-c", &script])
        .stderr(Stdio::piped());
    for (k, v) in env {
        run.env(k, v);
    }
    let mut run = run.spawn().expect("spawn redlock run");
    let _run = KillOnDrop(run.id());
    await_start(&mut run, &s);
    held_everywhere(m, key);
    let held = holders(m, key);
    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr: {}", take_stderr(&mut run));
    let vars = std::fs::read_to_string(s.path("env")).expect("the command's variables");
    (vars.lines().map(str::to_string).collect(), held)
}

#[test]
fn run_gives_the_command_the_resource_and_the_token_in_its_environment() {
    let m = masters(3);
    let key = "cli:env";
    // A REDLOCK_FENCING_TOKEN from an outer run does not leak into a run without fencing.
    let (vars, held) = lock_env(
        &m,
        key,
        &["-n"],
        &[("REDLOCK_FENCING_TOKEN", "99"), ("REDLOCK_TOKEN", "outer")],
    );
    let token = held[0].clone().expect("held while the command ran");
    assert_eq!(vars[0], key);
    assert_eq!(
        vars[1].as_bytes(),
        &token[..],
        "REDLOCK_TOKEN is the lock's token"
    );
    assert_eq!(vars[2], "unset", "REDLOCK_FENCING_TOKEN without --fencing");
    released_everywhere(&m, key);
}

#[test]
fn run_fencing_gives_the_command_an_increasing_fencing_token() {
    // Fencing needs masters that persist every write.
    let m = LocalMasters::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"])
        .expect("start 3 durable redis-server masters");
    let key = "cli:fencing";
    let mut last = 0u64;
    for _ in 0..2 {
        let (vars, held) = lock_env(&m, key, &["--fencing"], &[]);
        assert_eq!(vars[0], key);
        assert_eq!(vars[1].as_bytes(), &held[0].clone().expect("held")[..]);
        let fence: u64 = vars[2]
            .parse()
            .unwrap_or_else(|_| panic!("REDLOCK_FENCING_TOKEN {:?}", vars[2]));
        assert!(fence > last, "fencing token {fence} after {last}");
        last = fence;
    }
}

#[test]
fn run_without_a_quorum_waits_out_wait_then_says_no_quorum_and_what_the_masters_did() {
    let mut m = masters(3);
    let key = "cli:no-quorum";
    let alive = m[2].addr().to_string();
    // Two masters refuse connections (killed), then two do not answer (frozen): the lock
    // may come back within --wait, so run waits all of it, then says what it found.
    m[0].kill().unwrap();
    m[1].kill().unwrap();
    let (down0, down1) = (m[0].addr().to_string(), m[1].addr().to_string());
    for (fault, what) in [("killed", "connection refused"), ("frozen", "timed out")] {
        if fault == "frozen" {
            m[0].restart().unwrap();
            m[1].restart().unwrap();
            m[0].freeze().unwrap();
            m[1].freeze().unwrap();
        }
        let started = Instant::now();
        let out = output(
            redlock(
                Some(&m),
                &[
                    "run",
                    "-w",
                    "1",
                    "--round-timeout",
                    "300ms",
                    key,
                    "--",
                    "true",
                ],
            ),
            Duration::from_secs(15),
        );
        let err = stderr(&out);
        assert_eq!(code(&out), 69, "{fault}: {err}");
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "{fault}: gave up after {:?}: {err}",
            started.elapsed()
        );
        assert!(err.contains("no quorum"), "{fault}: {err}");
        assert!(!err.contains("deadline passed"), "{fault}: {err}");
        // The report groups the masters by what they did: the two named under "down" or
        // "timed out" (after a refused connect, a master may be down "waiting to
        // reconnect"), the live one under "ok".
        assert!(
            err.contains(what) || err.contains("waiting to reconnect"),
            "{fault}: {err}"
        );
        let group = if fault == "frozen" {
            "2 timed out ("
        } else {
            "2 down"
        };
        let (at, names) = (err.find(group), [&down0, &down1]);
        assert!(
            at.is_some_and(|at| names.iter().all(|d| err[at..].contains(d.as_str()))),
            "{fault}: {err}"
        );
        if fault == "frozen" {
            // (with two refused at once, the round may end before the third answered)
            assert!(err.contains(&format!("1 ok ({alive})")), "{fault}: {err}");
        }
    }
    m[0].thaw().unwrap();
    m[1].thaw().unwrap();
}

#[test]
fn run_fails_at_once_when_every_master_refuses_the_connection() {
    let mut m = masters(3);
    for i in 0..3 {
        m[i].kill().unwrap();
    }
    // Nothing listens at any address (wrong ports, Redis not running): no use waiting 60 s.
    let started = Instant::now();
    let out = output(
        redlock(Some(&m), &["run", "-w", "60", "cli:refused", "--", "true"]),
        Duration::from_secs(10),
    );
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.contains("3 down, connect failed: connection refused ("),
        "{err}"
    );
    for a in m.addrs() {
        assert!(err.contains(&a.to_string()), "{a} not named: {err}");
    }
}

#[test]
fn run_with_a_wrong_password_fails_at_once_as_a_configuration_error() {
    let m = LocalMasters::start_with(3, &["--requirepass", "right-pw"])
        .expect("start 3 redis-server masters with a password");
    let s = Scratch::new();
    let key = "cli:auth";
    let urls = m.urls();
    let wrong: Vec<String> = urls
        .iter()
        .map(|u| u.replace("right-pw", "wrong-pw"))
        .collect();
    let none: Vec<String> = urls.iter().map(|u| u.replace(":right-pw@", "")).collect();
    let attempt = |masters: Vec<&str>, extra: &[&str]| {
        let mut c = redlock(None, &["run", "-w", "60", "--masters", &masters.join(",")]);
        c.args(extra).args([key, "touch"]).arg(s.file("ran"));
        let started = Instant::now();
        let out = output(c, Duration::from_secs(10));
        (out, started.elapsed())
    };
    // Every master refuses the password, or wants one: 64 at once, naming each master.
    for (urls, why) in [(&wrong, "WRONGPASS"), (&none, "NOAUTH")] {
        let (out, took) = attempt(urls.iter().map(String::as_str).collect(), &[]);
        let err = stderr(&out);
        assert_eq!(code(&out), 64, "{why}: {err}");
        assert!(took < Duration::from_secs(5), "{why}: took {took:?}: {err}");
        for a in m.addrs() {
            assert!(err.contains(&a.to_string()), "{why}: {a} not named: {err}");
        }
        assert!(err.contains(why), "{err}");
        assert!(
            !err.contains("wrong-pw") && !err.contains("right-pw"),
            "{err}"
        );
    }
    // Two of three refuse: no quorum is possible: 64 as well.
    let (out, _) = attempt(vec![&wrong[0], &wrong[1], &urls[2]], &[]);
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(!s.path("ran").exists(), "a refused run ran its command");
    // One refuses: the lock is taken on the other two, COMMAND runs.
    let (out, _) = attempt(vec![&wrong[0], &urls[1], &urls[2]], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(s.path("ran").exists());
}

#[test]
fn run_fencing_on_masters_that_do_not_persist_fails_at_once() {
    // LocalMasters run without persistence: no master may vote for a fenced lock.
    let m = masters(3);
    let out = output(
        redlock(
            Some(&m),
            &["run", "--fencing", "-w", "60", "cli:fence-nd", "--", "true"],
        ),
        Duration::from_secs(10),
    );
    let err = stderr(&out);
    assert_eq!(code(&out), 64, "{err}");
    assert!(err.contains("appendfsync always"), "{err}");
}

/// Run to completion (bounded) with stdout going to `stdout`; stderr captured.
fn output_to(mut cmd: Command, stdout: Stdio, within: Duration) -> Output {
    cmd.stdout(stdout).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn redlock");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("redlock did not finish within {within:?}"))
        .expect("wait for redlock")
}

#[test]
fn status_with_stdout_a_closed_pipe_or_a_full_disk_does_not_panic() {
    let m = masters(3);
    for args in [
        &["status", "cli:epipe-status"][..],
        &["status", "--json", "cli:epipe-status"],
    ] {
        // `redlock status | head -1`, head gone: every write fails with EPIPE.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        drop(theirs);
        let out = output_to(
            redlock(Some(&m), args),
            Stdio::from(std::os::fd::OwnedFd::from(ours)),
            Duration::from_secs(10),
        );
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
        // Output to a full disk is an error, said on stderr.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        let out = output_to(
            redlock(Some(&m), args),
            Stdio::from(full),
            Duration::from_secs(10),
        );
        assert_eq!(code(&out), 71, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with("redlock: "),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_short_ttl_alone_does_not_warn_about_a_kill_grace_never_set() {
    let m = masters(3);
    let key = "cli:grace";
    // --kill-grace defaults to min(5s, ttl/6): nothing to warn about.
    for ttl in ["5s", "1s", "2"] {
        let out = run_out(&m, &["--ttl", ttl, key, "--", "true"]);
        assert_eq!(code(&out), 0, "--ttl {ttl}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "--ttl {ttl} alone");
    }
    // One set too large is still warned about.
    let out = run_out(
        &m,
        &["--ttl", "5s", "--kill-grace", "3s", key, "--", "true"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: --kill-grace 3s"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_waits_for_masters_that_refuse_the_handshake_only_for_now() {
    // A master busy running a script answers the handshake (SCRIPT LOAD) with -BUSY: it
    // will answer again once the script ends, so run waits for it, as for a timeout.
    let m = LocalMasters::start_with(3, &["--lua-time-limit", "50"])
        .expect("start 3 redis-server masters");
    let busy: Vec<_> = (0..2)
        .map(|i| {
            let addr = m[i].addr();
            thread::spawn(move || {
                redlock_mux::local::command(
                    addr,
                    &[b"EVAL", b"while true do end", b"0"],
                    Duration::from_secs(30),
                )
            })
        })
        .collect();
    for i in 0..2 {
        eventually("the master to be busy", Duration::from_secs(10), || {
            matches!(
                redlock_mux::local::command(m[i].addr(), &[b"PING"], Duration::from_secs(2)),
                Ok(AdminReply::Error(e)) if e.starts_with("BUSY")
            )
        });
    }
    let started = Instant::now();
    let out = output(
        redlock(
            Some(&m),
            &[
                "run",
                "-w",
                "1",
                "--round-timeout",
                "100ms",
                "cli:busy",
                "--",
                "true",
            ],
        ),
        Duration::from_secs(15),
    );
    let took = started.elapsed();
    for i in 0..2 {
        let _ =
            redlock_mux::local::command(m[i].addr(), &[b"SCRIPT", b"KILL"], Duration::from_secs(2));
    }
    for b in busy {
        let _ = b.join();
    }
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        took >= Duration::from_secs(1),
        "gave up after {took:?}: {err}"
    );
    assert!(err.contains("no quorum") && err.contains("BUSY"), "{err}");
}

/// `run` and `status` take the library's URL forms: Unix sockets (both schemes, with a
/// database in the query string) and a host name.
#[test]
fn run_and_status_with_unix_sockets_and_a_host_name() {
    let unix = LocalMasters::start_unix(2, &[]).expect("unix-socket masters");
    let tcp = masters(1);
    let urls = [
        unix[0].url(),
        format!("redis+unix://{}?db=0", unix[1].socket_path().display()),
        format!("redis://localhost:{}", tcp[0].port()),
    ]
    .join(",");
    let s = Scratch::new();
    let key = "cli:unix";
    let mut holder = Command::new(BIN)
        .env("REDLOCK_MASTERS", &urls)
        .args(["run", "--ttl", "5s", key, "--", "sh", "-c"])
        .arg(gated(&s, "exit 0"))
        .spawn()
        .expect("spawn redlock run");
    eventually("the command to start", Duration::from_secs(10), || {
        s.path("started").exists()
    });
    let on_unix = |i: usize| match unix[i].cmd(&[b"GET", key.as_bytes()]).unwrap() {
        AdminReply::Bulk(v) => v,
        other => panic!("{other:?}"),
    };
    // Decided at the quorum-th answer: the last master (the name, resolved on a helper
    // thread) may lag. The client runs its loop only inside its calls (here, the
    // extensions), so its connection may take a few extensions to come up.
    eventually(
        "every master to hold the key",
        Duration::from_secs(15),
        || {
            let t = get(&tcp, 0, key);
            t.is_some() && on_unix(0) == t && on_unix(1) == t
        },
    );

    let mut status = Command::new(BIN);
    status
        .env("REDLOCK_MASTERS", &urls)
        .args(["status", "--json", key]);
    let st = json(&output(status, Duration::from_secs(10)));
    assert_eq!(st["locked"], true, "{st}");
    assert_eq!(st["holder_masters"], 3, "{st}");
    let first = st["masters"][0]["master"].as_str().unwrap();
    assert!(
        first.starts_with("unix:/") && first.ends_with("redis.sock"),
        "{st}"
    );

    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    // Released at a quorum: the last master's release may land a little later.
    eventually(
        "the key gone from every master",
        Duration::from_secs(5),
        || get(&tcp, 0, key).is_none() && (on_unix(0), on_unix(1)) == (None, None),
    );
}

/// With the `tls` feature: `run` and `status` over `rediss://`, trusting a CA file; without
/// it, the CA is unknown and both say so.
#[cfg(feature = "tls")]
#[test]
fn run_and_status_over_tls() {
    use redlock_mux::local::TestCerts;
    let certs = TestCerts::generate().expect("test certificates");
    let m =
        LocalMasters::start_tls(3, &certs, &["--tls-auth-clients", "yes"]).expect("TLS masters");
    let ca = certs.ca_cert();
    let tls_args = |c: &mut Command| {
        c.env("REDLOCK_MASTERS", m.urls().join(","))
            .arg("--tls-ca-file")
            .arg(&ca)
            .arg("--tls-cert")
            .arg(certs.client_cert())
            .arg("--tls-key")
            .arg(certs.client_key());
    };
    let s = Scratch::new();
    let key = "cli:tls";
    let mut holder = Command::new(BIN);
    holder.args(["run", "--ttl", "5s"]);
    tls_args(&mut holder);
    let mut holder = holder
        .args([key, "--", "sh", "-c"])
        .arg(gated(&s, "exit 0"))
        .spawn()
        .expect("spawn redlock run");
    eventually("the command to start", Duration::from_secs(10), || {
        s.path("started").exists()
    });
    let mut status = Command::new(BIN);
    status.args(["status", "--json"]);
    tls_args(&mut status);
    status.arg(key);
    let st = json(&output(status, Duration::from_secs(10)));
    assert_eq!(st["locked"], true, "{st}");
    // redis-cli's spellings: --tls (host:port masters speak TLS), --cacert, --cert, --key.
    let addrs: Vec<String> = m.addrs().iter().map(|a| a.to_string()).collect();
    let mut cli_style = Command::new(BIN);
    cli_style
        .env_remove("REDLOCK_MASTERS")
        .args(["status", "--json", "--tls", "--masters", &addrs.join(",")])
        .arg("--cacert")
        .arg(&ca)
        .arg("--cert")
        .arg(certs.client_cert())
        .arg("--key")
        .arg(certs.client_key())
        .arg(key);
    let st = json(&output(cli_style, Duration::from_secs(10)));
    assert_eq!(st["locked"], true, "{st}");

    // Without the client certificate: refused by every master, and said so.
    let mut bare = Command::new(BIN);
    bare.env("REDLOCK_MASTERS", m.urls().join(","))
        .args(["status", "--tls-ca-file"])
        .arg(&ca)
        .arg(key);
    let out = output(bare, Duration::from_secs(10));
    assert_eq!(code(&out), 1, "stderr: {}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table.matches("unreachable").count(), 3, "{table}");

    std::fs::write(s.path("go"), b"").unwrap();
    let status = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    // The command ran under the lock: released after.
    let mut after = Command::new(BIN);
    after.args(["status", "--json"]);
    tls_args(&mut after);
    after.arg(key);
    let st = json(&output(after, Duration::from_secs(10)));
    assert_eq!(st["locked"], false, "{st}");
}

/// `bench` does not measure a degraded cluster without saying so: with a master down it
/// refuses (exit 69, naming the master), and measures only with `--allow-degraded`.
#[test]
fn bench_refuses_to_measure_with_a_master_down() {
    let mut m = masters(3);
    m[2].kill().unwrap();
    let urls = m.urls().join(",");
    let args = |extra: &[&str]| {
        let mut all = vec![
            "bench",
            "--masters",
            urls.as_str(),
            "--duration",
            "300ms",
            "--round-timeout",
            "2s",
        ];
        all.extend_from_slice(extra);
        output(redlock(None, &all), Duration::from_secs(60))
    };
    let out = args(&[]);
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        err.contains("master down") && err.contains(&m[2].addr().to_string()),
        "{err}"
    );
    let out = args(&["--allow-degraded"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// `bench`'s report to a closed pipe (`redlock bench | head -1`) does not panic: the run
/// ends with its own exit status.
#[test]
fn bench_survives_a_closed_stdout() {
    let mut cmd = redlock(
        None,
        &[
            "bench",
            "--local",
            "1",
            "--duration",
            "200ms",
            "--round-timeout",
            "2s",
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn redlock bench");
    drop(child.stdout.take()); // the reader is gone before anything is written
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let mut err = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `run` waits like `lock()`: it stands in the resource's line on the masters and is woken
/// by the holder's release, not by its next timed attempt (200 ms +- 100 ms apart).
#[test]
fn run_waits_in_line_and_is_woken_by_the_release() {
    let m = masters(3);
    let s = Scratch::new();
    let key = "cli:woken";
    let line = String::from_utf8(redlock_mux::scripts::aux_key(
        redlock_mux::scripts::QUEUE,
        key.as_bytes(),
    ))
    .unwrap();
    let in_line = |i: usize| match m[i].cmd(&[b"ZCARD", line.as_bytes()]).expect("ZCARD") {
        AdminReply::Int(n) => n,
        other => panic!("ZCARD {line}: {other:?}"),
    };
    let mut holder = Redlock::new(m.urls()).expect("client");
    let mut took = Vec::new();
    for round in 0..5 {
        let lock = holder
            .try_lock(key, Duration::from_secs(30))
            .expect("the holder takes the lock");
        let marker = s.path(&format!("ran-{round}"));
        let mut run = redlock(
            Some(&m),
            &[
                "run",
                "-w",
                "20",
                key,
                "--",
                "touch",
                &marker.to_string_lossy(),
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlock run");
        let _kill = KillOnDrop(run.id());
        // Its attempts were refused; it waits in line on every master (a polling waiter
        // never would).
        eventually(
            "run waiting in the resource's line",
            Duration::from_secs(10),
            || (0..3).all(|i| in_line(i) >= 1),
        );
        assert!(!marker.exists(), "the command ran while the lock was held");
        let released = Instant::now();
        holder.release(lock).expect("release");
        let deadline = released + Duration::from_secs(10);
        while !marker.exists() {
            assert!(
                Instant::now() < deadline,
                "run did not get the released lock"
            );
            thread::sleep(Duration::from_micros(200));
        }
        took.push(released.elapsed());
        let status = wait_exit(&mut run, Duration::from_secs(10));
        assert!(status.success(), "run exited with {status:?}");
    }
    // Woken by the release: the release, one round, starting `touch`. A waiter retrying
    // every 200 ms +- 100 ms instead would pass all five rounds with a chance of ~0.4%.
    took.sort();
    assert!(
        took[4] < Duration::from_millis(100),
        "release to command start, sorted: {took:?}"
    );
}

/// Wait (bounded) until the command under `run` wrote its PID to `name`; return it.
fn await_pid(s: &Scratch, name: &str) -> u32 {
    eventually("the command to start", Duration::from_secs(10), || {
        read_pid(&s.path(name)).is_some()
    });
    read_pid(&s.path(name)).unwrap()
}

/// Wait (bounded) until a lock taken with a 1 s TTL at `started` is still held on every
/// master 1.5 s later: kept by extensions.
fn await_extended_past_ttl(m: &LocalMasters, key: &str, started: Instant) {
    eventually(
        "the lock extended past its TTL",
        Duration::from_secs(5),
        || {
            started.elapsed() > Duration::from_millis(1500)
                && holders(m, key).iter().all(Option::is_some)
        },
    );
}

/// `run -w 10 ARGS RESOURCE true` with `masters` (bounded), and how long it took.
fn run_timed(masters: &str, args: &[&str], resource: &str) -> (Output, Duration) {
    let mut c = redlock(None, &["run", "-w", "10", "--masters", masters]);
    c.args(args).args([resource, "true"]);
    let started = Instant::now();
    let out = output(c, Duration::from_secs(20));
    (out, started.elapsed())
}

/// The error line (without `-`) the server at `addr` answers to `SET key` from `user`.
fn noperm_text(addr: std::net::SocketAddr, user: &str, password: &str, key: &str) -> String {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let resp = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        out
    };
    let request = resp(&["AUTH", user, password]) + &resp(&["SET", key, "x"]);
    conn.write_all(request.as_bytes()).unwrap();
    let mut lines = BufReader::new(conn).lines();
    let auth = lines.next().unwrap().unwrap();
    assert_eq!(auth, "+OK");
    let reply = lines.next().unwrap().unwrap();
    reply
        .strip_prefix('-')
        .unwrap_or_else(|| panic!("SET {key} as {user}: {reply}"))
        .to_string()
}

/// An ACL user without the right to the lock's key: every master answers the lock request
/// itself with `-NOPERM` (the handshake went through). Waiting cannot change that: `run -w
/// 10` says so at once (64, well under 2 s), names the masters, the whole reason cut at a
/// word, and the ACL to give. (It used to wait its whole 10 s and exit 69, "no quorum".)
/// The user has the right to the crate's own keys (`redlock-mux:*`), which the scripts
/// declare beside the lock's key.
#[test]
fn run_as_an_acl_user_without_rights_to_the_key_fails_at_once() {
    let m = masters(3);
    for i in 0..3 {
        let r = m[i].cmd(&[
            b"ACL",
            b"SETUSER",
            b"app",
            b"on",
            b">app-pw",
            b"~app:*",
            b"~redlock-mux:*",
            b"&*",
            b"+@all",
        ]);
        assert!(r.unwrap().is_ok());
    }
    let urls: Vec<String> = m
        .addrs()
        .iter()
        .map(|a| format!("redis://app:app-pw@{a}"))
        .collect();
    let (out, took) = run_timed(&urls.join(","), &[], "cli:acl");
    let err = stderr(&out);
    assert_eq!(code(&out), 64, "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert!(err.contains("NOPERM") && err.contains("ACL"), "{err}");
    // What this server itself answers: Redis's long text is cut, Valkey's short one
    // ("NOPERM No permissions to access a key") is shown whole.
    let own = noperm_text(m.addrs()[0], "app", "app-pw", "cli:acl");
    if own.contains("access one of the keys used as arguments") {
        assert!(
            err.contains("access one of the keys…") && !err.contains("keys ,"),
            "a Redis error is cut at a word and marked: {err}"
        );
    } else {
        assert!(
            err.contains(&own) && !err.contains('…'),
            "a short error is shown whole ({own:?}): {err}"
        );
    }
    for a in m.addrs() {
        assert!(err.contains(&a.to_string()), "{a} not named: {err}");
    }
    assert!(!err.contains("app-pw"), "{err}");
    // The same user takes a key it has the right to.
    let (out, _) = run_timed(&urls.join(","), &[], "app:job");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// TLS configurations that cannot work are said at once (64, under 2 s of a 10 s
/// `--wait`), in words with a hint: a CA the masters' certificates are not signed by, a CA
/// certificate used as a server's own (as a self-signed certificate is), and `rediss://`
/// pointed at a port that speaks plain RESP. (They used to wait out `--wait` and exit 69,
/// the first two in rustls' debug text, `Other(OtherError(CaUsedAsEndEntity))`, the
/// third as "timed out".) redis-cli's spellings of the TLS options are taken too.
#[cfg(feature = "tls")]
#[test]
fn run_with_a_tls_configuration_that_cannot_work_fails_at_once_in_words() {
    use redlock_mux::local::{LocalMaster, TestCerts};
    let certs = TestCerts::generate().expect("test certificates");
    let m = LocalMasters::start_tls(3, &certs, &[]).expect("TLS masters");
    let urls = m.urls().join(",");
    let stranger = TestCerts::generate().expect("other certificates");
    let ca = certs.ca_cert();
    let stranger_ca = stranger.ca_cert();
    for flag in ["--tls-ca-file", "--cacert"] {
        let (out, took) = run_timed(&urls, &[flag, stranger_ca.to_str().unwrap()], "cli:tls-ca");
        let err = stderr(&out);
        assert_eq!(code(&out), 64, "{flag}: {err}");
        assert!(
            took < Duration::from_secs(2),
            "{flag}: took {took:?}: {err}"
        );
        assert!(
            err.contains("not signed by a trusted CA") && err.contains("--cacert"),
            "{flag}: {err}"
        );
        let (out, _) = run_timed(&urls, &[flag, ca.to_str().unwrap()], "cli:tls-ca");
        assert_eq!(code(&out), 0, "{flag}: {}", stderr(&out));
    }

    // The CA's own certificate as a server's (CA:TRUE): webpki's CaUsedAsEndEntity.
    let ca_key = certs.dir().join("ca.key");
    let ca_as_server = LocalMaster::start_tls(
        &certs,
        &[
            "--tls-cert-file",
            ca.to_str().unwrap(),
            "--tls-key-file",
            ca_key.to_str().unwrap(),
        ],
    )
    .expect("a TLS master presenting the CA certificate");
    let (out, took) = run_timed(
        &ca_as_server.url(),
        &["--cacert", ca.to_str().unwrap()],
        "k",
    );
    let err = stderr(&out);
    assert_eq!(code(&out), 64, "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert!(
        err.contains("presents a CA certificate") && !err.contains("OtherError"),
        "{err}"
    );

    // rediss:// at a plain port: a plain Redis never answers the TLS hello.
    let plain = masters(1);
    let url = format!("rediss://{}", plain[0].addr());
    let (out, took) = run_timed(&url, &["--cacert", ca.to_str().unwrap()], "cli:tls-plain");
    let err = stderr(&out);
    assert_eq!(code(&out), 64, "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert!(err.contains("this port speaks plain RESP"), "{err}");
}

/// One row of the flock(1) compatibility table: what `redlock run` does with what a flock
/// user types.
struct Habit {
    what: &'static str,
    /// `run`'s options, before RESOURCE (COMMAND is `true`).
    args: &'static [&'static str],
    /// The resource is held by another client, released this long after the row starts;
    /// `None`: free.
    held_for: Option<Duration>,
    /// Expected exit status.
    code: i32,
    /// `run` must end after the release (it waited for it), or before (it gave up).
    after_release: bool,
    /// It must take at least this long (it waited that long).
    at_least: Duration,
    /// Its stderr must start with this.
    stderr: &'static str,
}

/// The flock(1) compatibility table, every row run at once, each on its own resource.
/// Without `-w`, and with `-w inf` or `-w forever`, `run` waits until the lock is free, as
/// flock without `-w` does (it used to give up after 10 s; `inf` and `forever` were usage
/// errors); `-w N` gives up after N seconds, `-n` and `-w 0` at once, `-E` picks the
/// status; clap's own usage errors carry the `redlock:` prefix every message has.
#[test]
fn flock_compatibility_table() {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    #[rustfmt::skip]
    let table = [
        // No -w: flock waits as long as it takes. Held past the old default of 10 s.
        Habit { what: "no -w waits until free", args: &[], held_for: Some(s(11)), code: 0,
                after_release: true, at_least: s(11), stderr: "" },
        Habit { what: "-w inf waits until free", args: &["-w", "inf"], held_for: Some(s(2)),
                code: 0, after_release: true, at_least: s(2), stderr: "" },
        Habit { what: "-w forever waits until free", args: &["-w", "forever"],
                held_for: Some(s(2)), code: 0, after_release: true, at_least: s(2), stderr: "" },
        Habit { what: "--wait=Infinity waits until free", args: &["--wait=Infinity"],
                held_for: Some(s(2)), code: 0, after_release: true, at_least: s(2), stderr: "" },
        Habit { what: "-w 0.5 gives up after half a second", args: &["-w", "0.5"],
                held_for: Some(s(8)), code: 1, after_release: false, at_least: ms(500),
                stderr: "redlock: " },
        Habit { what: "-n gives up at once", args: &["-n"], held_for: Some(s(8)), code: 1,
                after_release: false, at_least: Duration::ZERO, stderr: "redlock: " },
        Habit { what: "-w 0 is one attempt", args: &["-w", "0"], held_for: Some(s(8)), code: 1,
                after_release: false, at_least: Duration::ZERO, stderr: "redlock: " },
        Habit { what: "-E 7 with -n: the conflict status", args: &["-n", "-E", "7"],
                held_for: Some(s(8)), code: 7, after_release: false, at_least: Duration::ZERO,
                stderr: "redlock: " },
        Habit { what: "a free lock with no -w: at once", args: &[], held_for: None, code: 0,
                after_release: false, at_least: Duration::ZERO, stderr: "" },
        Habit { what: "an unknown option: redlock: error", args: &["--bogus"], held_for: None,
                code: 64, after_release: false, at_least: Duration::ZERO,
                stderr: "redlock: error: unexpected argument '--bogus'" },
        Habit { what: "a bad -w: redlock: error", args: &["-w", "soon"], held_for: None,
                code: 64, after_release: false, at_least: Duration::ZERO,
                stderr: "redlock: error: invalid value 'soon'" },
    ];
    let m = masters(3);
    let urls = m.urls();
    let rows: Vec<_> = table
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            let urls = urls.clone();
            thread::spawn(move || {
                let key = format!("cli:flock-habit:{i}");
                let started = Instant::now();
                let released = h.held_for.map(|hold| {
                    let mut holder = Redlock::new(&urls).unwrap();
                    let lock = holder.lock(&key, Duration::from_secs(60)).unwrap();
                    let (tx, rx) = mpsc::channel();
                    thread::spawn(move || {
                        thread::sleep(hold.saturating_sub(started.elapsed()));
                        let at = Instant::now();
                        holder.release(lock).unwrap();
                        let _ = tx.send(at);
                    });
                    rx
                });
                let mut c = redlock(None, &["run", "--masters", &urls.join(",")]);
                c.args(h.args).args([key.as_str(), "true"]);
                let out = output(c, Duration::from_secs(40));
                let (ended, took) = (Instant::now(), started.elapsed());
                let err = stderr(&out);
                let row = format!("{}: exit {:?} after {took:?}: {err}", h.what, out.status);
                assert_eq!(out.status.code(), Some(h.code), "{row}");
                assert!(took >= h.at_least, "{row}");
                assert!(err.starts_with(h.stderr), "{row}");
                if let Some(released) = released {
                    let at = released
                        .recv_timeout(Duration::from_secs(40))
                        .expect("release");
                    assert_eq!(ended > at, h.after_release, "released at {at:?}: {row}");
                }
            })
        })
        .collect();
    let failed: Vec<String> = rows
        .into_iter()
        .filter_map(|r| r.join().err())
        .map(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "a row panicked".into())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} rows failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A COMMAND stopped by job control (here it sends itself SIGTTIN, as the kernel does to
/// a background process group that reads the terminal: `redlock run job sh -c 'read x'`
/// under a terminal) gets a word on stderr: what stopped it, that the lock is held
/// meanwhile, and how to continue or end it. Continued, it runs on under the lock.
#[test]
fn run_says_when_the_command_is_stopped_by_job_control() {
    let m = masters(3);
    let s = Scratch::new();
    let script = format!(
        "echo $$ > '{pid}'; kill -TTIN $$; echo continued > '{after}'",
        pid = s.file("pid"),
        after = s.file("after")
    );
    let mut run = redlock(Some(&m), &["run", "cli:ttin", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlock run");
    let _run = KillOnDrop(run.id());
    let pid = await_pid(&s, "pid");
    let _group = KillGroupOnDrop(pid);
    let (tx, rx) = mpsc::channel();
    let lines = BufReader::new(run.stderr.take().unwrap());
    thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let said = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a word on stderr about the stopped command");
    assert!(
        said.starts_with("redlock: the command is stopped (SIGTTIN)")
            && said.contains("terminal")
            && said.contains(&format!("kill -CONT -{pid}")),
        "{said}"
    );
    assert!(!s.path("after").exists());
    held_everywhere(&m, "cli:ttin");
    kill(Pid::from_raw(-(pid as i32)), Signal::SIGCONT).unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    assert!(s.path("after").exists());
    released_everywhere(&m, "cli:ttin");
}

/// `status` on a key without expiry (set by hand, or by another tool) does not promise it
/// will "expire with its TTL": it says the key has none and stays until deleted. (It used
/// to say "such leftovers expire with their TTL".)
#[test]
fn status_says_when_a_key_never_expires() {
    let m = masters(3);
    let key = "cli:no-expiry";
    assert!(m[0]
        .cmd(&[b"SET", key.as_bytes(), b"by-hand"])
        .unwrap()
        .is_ok());
    let out = output(redlock(Some(&m), &["status", key]), Duration::from_secs(10));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains("no expiry"), "{table}");
    assert!(
        table.contains("has no expiry on 1 master") && !table.contains("expire with their TTL"),
        "{table}"
    );
}

/// `n` local clusters of `primaries` shard primaries each, started side by side.
fn clusters(n: usize, primaries: usize) -> Vec<LocalCluster> {
    thread::scope(|s| {
        let starts: Vec<_> = (0..n)
            .map(|_| s.spawn(move || LocalCluster::start_with(primaries, 0, &[])))
            .collect();
        starts
            .into_iter()
            .map(|h| h.join().unwrap().expect("start a local cluster"))
            .collect()
    })
}

/// `redlock ARGS` with `REDLOCK_MASTERS` set to `urls`.
fn at(urls: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("REDLOCK_MASTERS", urls).args(args);
    cmd
}

/// One resource per shard primary of `c` (index i: served by primary i).
fn one_name_per_shard(c: &LocalCluster, prefix: &str) -> Vec<String> {
    let primaries = c.primaries().expect("primaries");
    primaries
        .iter()
        .map(|p| {
            (0..)
                .map(|i| format!("{prefix}:{i}"))
                .find(|k| c.primary_of_key(k.as_bytes()).unwrap() == *p)
                .unwrap()
        })
        .collect()
}

/// `GET key` on the primary of `c` that serves it.
fn cluster_get(c: &LocalCluster, key: &str) -> Option<Vec<u8>> {
    let p = c
        .primary_of_key(key.as_bytes())
        .expect("primary of the key");
    match c.node(p).cmd(&[b"GET", key.as_bytes()]).expect("GET") {
        AdminReply::Bulk(v) => v,
        other => panic!("GET {key}: {other:?}"),
    }
}

/// `run`, `status`, `list` and `release --force` with three 3-primary clusters as the three
/// masters, one resource per shard: each lock lands on the shard primary that serves its
/// slot in every cluster; `list` scans every shard primary; `release` deletes on the right
/// shard.
#[test]
fn run_status_list_and_release_on_cluster_masters() {
    let cs = clusters(3, 3);
    let urls: Vec<String> = cs.iter().map(LocalCluster::seed_url).collect();
    let urls = urls.join(",");
    let names = one_name_per_shard(&cs[0], "cli:cluster");
    let scratch: Vec<Scratch> = names.iter().map(|_| Scratch::new()).collect();
    let mut holders: Vec<Child> = names
        .iter()
        .zip(&scratch)
        .map(|(name, s)| {
            Command::new(BIN)
                .env("REDLOCK_MASTERS", &urls)
                .args(["run", "--ttl", "5s", name, "--", "sh", "-c"])
                .arg(gated(s, "exit 0"))
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn redlock run")
        })
        .collect();
    for (h, s) in holders.iter_mut().zip(&scratch) {
        await_start(h, s);
    }
    for name in &names {
        eventually(
            "every cluster to hold the key on its shard",
            Duration::from_secs(15),
            || {
                let t = cluster_get(&cs[0], name);
                t.is_some() && cs.iter().all(|c| cluster_get(c, name) == t)
            },
        );
    }

    // `status` (the library's inspect script) works on cluster masters once the scripts'
    // auxiliary keys share the lock key's slot; until then it says why it cannot.
    let mut inspectable = true;
    for name in &names {
        let out = output(
            at(&urls, &["status", "--json", name]),
            Duration::from_secs(10),
        );
        let st = json(&out);
        if code(&out) == 1 && stderr(&out).contains("CROSSSLOT") {
            assert!(
                stderr(&out).contains("only plain locks work"),
                "{}",
                stderr(&out)
            );
            inspectable = false;
            continue;
        }
        assert_eq!(code(&out), 0, "{st} {}", stderr(&out));
        assert_eq!(st["locked"], true, "{st}");
        assert_eq!(st["holder_masters"], 3, "{st}");
    }

    let out = output(
        at(&urls, &["list", "--json", "cli:cluster:*"]),
        Duration::from_secs(20),
    );
    let j = json(&out);
    if inspectable {
        assert_eq!(code(&out), 0, "{j} {}", stderr(&out));
        assert_eq!(j["complete"], true, "{j}");
    } else {
        // Found by the scan of every shard, but not inspected: listed, the holder unknown.
        assert_eq!(code(&out), 1, "{j} {}", stderr(&out));
        assert!(stderr(&out).contains("CROSSSLOT"), "{}", stderr(&out));
    }
    let mut listed: Vec<&str> = j["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resource"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    let mut want: Vec<&str> = names.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(listed, want, "one lock per shard, every shard scanned: {j}");

    // A forced release of the first: gone from its shard in every cluster (or, while
    // `status` cannot look, refused with the reason).
    let out = output(
        at(&urls, &["release", "--force", "--yes", &names[0]]),
        Duration::from_secs(10),
    );
    if inspectable {
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(cs.iter().all(|c| cluster_get(c, &names[0]).is_none()));
    } else {
        assert_ne!(code(&out), 0, "{}", stderr(&out));
        assert!(stderr(&out).contains("CROSSSLOT"), "{}", stderr(&out));
    }

    for s in &scratch {
        std::fs::write(s.path("go"), b"").unwrap();
    }
    for (mut h, name) in holders.into_iter().zip(&names) {
        let status = wait_exit(&mut h, Duration::from_secs(15));
        if name != &names[0] || !inspectable {
            assert_eq!(status.code(), Some(0), "{}", take_stderr(&mut h));
            // Released at a quorum: the last master's release may land a little later.
            eventually(
                "the key gone from every cluster",
                Duration::from_secs(5),
                || cs.iter().all(|c| cluster_get(c, name).is_none()),
            );
        }
    }
}

/// `bench` on local clusters (`--local-shards`): plain and 64 locks in flight, the
/// mutual-exclusion check, server figures summed over every shard primary and each
/// shard's operations in the report.
#[test]
fn bench_on_local_cluster_masters_reports_operations_per_shard() {
    for extra in [&[][..], &["--in-flight", "64"][..]] {
        let mut args = vec![
            "bench",
            "--local",
            "3",
            "--local-shards",
            "2",
            "--duration",
            "1s",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = output(redlock(None, &args), Duration::from_secs(60));
        let j = json(&out);
        assert_eq!(code(&out), 0, "{j} {}", stderr(&out));
        assert_eq!(j["mutual_exclusion"]["ok"], true, "{j}");
        assert!(j["acquired"].as_u64().unwrap() > 0, "{j}");
        assert_eq!(j["local_servers"]["shards_per_master"], 2, "{j}");
        let per_master = j["servers"]["per_master"].as_array().expect("servers");
        assert_eq!(per_master.len(), 3, "{j}");
        for m in per_master {
            assert!(m["master"].as_str().unwrap().starts_with("cluster "), "{m}");
            let shards = m["shards"].as_array().expect("per-shard figures");
            assert_eq!(shards.len(), 2, "{m}");
            let sum: u64 = shards
                .iter()
                .map(|s| s["operations"].as_u64().unwrap())
                .sum();
            assert_eq!(sum, m["operations"].as_u64().unwrap(), "{m}");
            if extra.is_empty() {
                // One resource: one slot, one shard does all the work.
                assert!(
                    shards.iter().any(|s| s["share"].as_f64().unwrap() > 0.9),
                    "{m}"
                );
            } else {
                // 64 resources spread over both shards.
                assert!(
                    shards.iter().all(|s| s["operations"].as_u64().unwrap() > 0),
                    "{m}"
                );
            }
        }
    }
    // Local options with masters given, and a quota below the kernel's smallest: usage.
    let out = output(
        redlock(
            None,
            &["bench", "-m", "redis://127.0.0.1:1", "--local-shards", "2"],
        ),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    let out = output(
        redlock(None, &["bench", "--shard-cpu", "0"]),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(stderr(&out).contains("--shard-cpu"), "{}", stderr(&out));
}
