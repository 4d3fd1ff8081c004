//! Test support shared by the integration tests: real local `redis-server` masters
//! ([`masters`], from `redlock_mux::local`), a fault proxy ([`proxy::Proxy`]) and a
//! scripted fake server for bytes Redis would never send ([`fake::FakeServer`]).
//!
//! Use it from a test file with `mod support;`. Everything talks to 127.0.0.1 only, and
//! every wait is a bounded poll (in time and in count), never a sleep that hopes.
#![allow(dead_code, unused_imports)]

pub mod fake;
pub mod proxy;

use std::io::{self, Read};
use std::net::TcpStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

pub use redlock_mux::local::{
    command, redis_server_path, AdminReply, LocalMaster, LocalMasters, INSTALL_HINT,
};

/// Starts `n` local masters (no persistence). Panics with the reason (for a missing
/// binary: how to install `redis-server`); never skips.
pub fn masters(n: usize) -> LocalMasters {
    LocalMasters::start(n)
        .unwrap_or_else(|e| panic!("cannot start {n} local redis-server master(s): {e}"))
}

/// Starts `n` local masters with extra `redis-server` arguments (see
/// `LocalMaster::start_with`). Panics like [`masters`].
pub fn masters_with(n: usize, extra_args: &[&str]) -> LocalMasters {
    LocalMasters::start_with(n, extra_args)
        .unwrap_or_else(|e| panic!("cannot start {n} local redis-server master(s): {e}"))
}

/// Starts one local master. Panics like [`masters`].
pub fn master() -> LocalMaster {
    LocalMaster::start().unwrap_or_else(|e| panic!("cannot start a local redis-server: {e}"))
}

/// Starts one local master with extra arguments. Panics like [`masters`].
pub fn master_with(extra_args: &[&str]) -> LocalMaster {
    LocalMaster::start_with(extra_args)
        .unwrap_or_else(|e| panic!("cannot start a local redis-server: {e}"))
}

/// Polls `cond` every millisecond until it is true; panics naming `what` if that takes
/// longer than `timeout` (or more than a bounded number of polls).
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    if !poll_until(timeout, &mut cond) {
        panic!("timed out after {timeout:?} waiting for {what}");
    }
}

/// Polls `cond` every millisecond until it is true or `timeout` passes (also bounded in
/// count); returns whether it became true.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let max_polls = timeout.as_millis().saturating_mul(2).saturating_add(10);
    let mut polls = 0u128;
    loop {
        if cond() {
            return true;
        }
        polls += 1;
        if Instant::now() >= deadline || polls >= max_polls {
            return cond();
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// `true` while `/proc/<pid>` exists (a running, stopped or zombie process).
pub fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Encodes a command as a RESP array of bulk strings (independent of `redlock_mux::resp`).
pub fn encode_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Connects to `addr` (1 s connect timeout, TCP_NODELAY); read it with [`read_raw`].
pub fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// How a raw read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// The peer closed (read returned 0).
    Eof,
    /// `limit` passed first.
    TimedOut,
    /// `want` bytes arrived.
    Enough,
    /// An error (`ConnectionReset`, ...).
    Error(io::ErrorKind),
}

/// Reads raw bytes until `want` bytes arrived, the peer closes, an error, or `limit`
/// passes (this sets the stream's read timeout). To check for silence: `read_raw(s, 1,
/// short)` must give `(vec![], ReadEnd::TimedOut)`.
pub fn read_raw(stream: &mut TcpStream, want: usize, limit: Duration) -> (Vec<u8>, ReadEnd) {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < want {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return (out, ReadEnd::TimedOut);
        }
        let _ = stream.set_read_timeout(Some(remaining.max(Duration::from_millis(1))));
        let room = buf.len().min(want - out.len());
        match stream.read(&mut buf[..room]) {
            Ok(0) => return (out, ReadEnd::Eof),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if is_transient(&e) => {}
            Err(e) => return (out, ReadEnd::Error(e.kind())),
        }
    }
    (out, ReadEnd::Enough)
}

/// `GET key` on master `i`: the value, or `None` when the key is absent.
pub fn get(m: &LocalMasters, i: usize, key: &str) -> Option<Vec<u8>> {
    match m[i].cmd(&[b"GET", key.as_bytes()]).expect("GET") {
        AdminReply::Bulk(v) => v,
        other => panic!("GET {key} on master {i}: {other:?}"),
    }
}

/// A socket error that only means "nothing yet" (non-blocking or timed-out read/accept).
pub fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// A shared client on `urls` with a patient round timeout (500 ms: a loaded machine does
/// not fail a round) and no retries: what a test that counts attempts or keys wants.
pub fn patient_shared<I, S>(urls: I) -> redlock_mux::SharedRedlock
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    redlock_mux::Redlock::builder()
        .masters(urls)
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build_shared()
        .expect("shared client")
}

/// Returns once every master of `client` has answered everything sent to it before: the
/// client's calls return at a quorum, and a late master's answer (its key written or
/// deleted) lands afterwards. An inspection waits for every master's answer, and a master
/// answers one connection's requests in order. `masters`: how many must answer (those up).
pub fn settle(client: &mut redlock_mux::Redlock, masters: usize) {
    let seen = client.inspect("settle").expect("the settling inspection");
    assert_eq!(seen.answered(), masters, "every master answered: {seen}");
}

/// [`settle`] for the shared client (its inspection, too, waits for every master, and
/// goes out behind everything queued before it).
pub fn settle_shared(client: &redlock_mux::SharedRedlock, masters: usize) {
    let seen = client
        .inspect("settle")
        .wait()
        .expect("the settling inspection");
    assert_eq!(seen.answered(), masters, "every master answered: {seen}");
}

/// `INFO commandstats` of master `i`: calls per command (commands run by scripts count
/// under their own names, as the server counts them).
pub fn command_calls(m: &LocalMasters, i: usize) -> std::collections::BTreeMap<String, u64> {
    let text = match m[i].cmd(&[b"INFO", b"commandstats"]).expect("INFO") {
        AdminReply::Bulk(Some(t)) => String::from_utf8(t).unwrap(),
        other => panic!("INFO commandstats: {other:?}"),
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}
