//! The simulated Redis (`tests/sim/server.rs`) against a real `redis-server` 7.0: a table
//! of scripted cases, each run on a real server (raw RESP over a `TcpStream`, real
//! sleeps) and on a `SimRedis` (the same bytes, its clock advanced by the same amounts),
//! whose replies must agree frame by frame.
//!
//! The cases cover every branch of every script in `src/scripts.rs` (and their error
//! paths), the handshake the client sends (AUTH, SELECT, SCRIPT LOAD, INFO, CONFIG GET),
//! `-NOSCRIPT` and `EVAL`, pub/sub, protocol errors and restarts, and the client-side
//! tracking a watched lock uses (`HELLO 3`, `CLIENT TRACKING`/`CACHING`, `MGET` and the
//! `invalidate` pushes, compared frame by frame with their RESP3 types). When a script changes,
//! the case that runs the changed line fails until `server.rs` mirrors it.
//!
//! How the replies are read: the simulated server is fed first; for each connection, the
//! test then reads on the real server as many frames as the simulation produced (a
//! missing frame times out after 5 s and fails), and then proves that nothing more came:
//! it sends `PING <nonce>` and the next frame must be its answer (`$<nonce>`,
//! `["pong", <nonce>]` in subscriber mode, or `-NOAUTH` before AUTH). A connection the
//! simulation closed must reach EOF on the real server.
//!
//! Normalisation, only where values differ by nature (everything else is compared
//! exactly):
//! * `Ttl` steps: an integer the simulation answers above 1 (a PTTL) may be lower on the
//!   real server by at most the wall time the case has run (its clock moved on while the
//!   test worked; the simulated clock moves only by the sleeps), or higher by 1 ms
//!   (millisecond truncation).
//! * `INFO server`: the simulation's fields must appear in the real reply in the same
//!   order with equal values, except `run_id` (40 hex digits, compared by the order in
//!   which distinct ids appear within the case: a restart must change it), `redis_version`
//!   (the real one any `7.0.x`), and `process_id`, `tcp_port`, `server_time_usec`,
//!   `uptime_in_seconds`, `uptime_in_days` (digits).
//! * `CONFIG GET`: the pairs compared as a set (Redis lists them in hash order).
//! * `KEYS`: compared sorted (hash order).
//!
//! The simulation models Redis 7.0. Against another server (`REDIS_SERVER` naming Valkey,
//! or a Redis other than 7.0.x; told by `INFO server`), the case runs all the same, and
//! what differs by nature between servers is compared at the level the client reads it:
//! an error by its code (the first word: `NOSCRIPT`, `NOAUTH`, `ERR`...; the text is the
//! server's own), a command the client never sends (a wrong number of arguments) only as
//! refused, `INFO server` by the fields the client reads (`run_id`, `uptime_in_seconds`),
//! and `HELLO` but for the server's name, version and modules. A step marked
//! `Cmp::ModelOnly` (an input the client never sends, on which servers differ, each
//! with its reason) is compared against the modelled server only.
//!
//! Run: `cargo test --features local --test sim_table` (one case:
//! `SIM_TABLE_CASE=<name>`).

#[path = "sim/server.rs"]
mod server;

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::local::{AdminReply, LocalMaster};
use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::scripts::{self, Script};
use server::{ConnId, SimRedis};

// ----- replies ---------------------------------------------------------------------------------

/// A reply frame, owned.
#[derive(Clone, PartialEq)]
enum Val {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    /// RESP3's `_` (`Null` is `$-1` or `*-1`).
    Null3,
    Array(Vec<Val>),
    /// RESP3 `%` (keys and values in order) and `>`.
    Map(Vec<Val>),
    Push(Vec<Val>),
    /// A RESP3 type the client never sees from a RESP2 server.
    Other(String),
}

fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

impl fmt::Debug for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Simple(s) => write!(f, "+{}", esc(s)),
            Val::Error(s) => write!(f, "-{}", esc(s)),
            Val::Int(n) => write!(f, ":{n}"),
            Val::Bulk(b) => write!(f, "\"{}\"", esc(b)),
            Val::Null => write!(f, "nil"),
            Val::Null3 => write!(f, "_"),
            Val::Array(a) => f.debug_list().entries(a).finish(),
            Val::Map(a) => write!(f, "%{a:?}"),
            Val::Push(a) => write!(f, ">{a:?}"),
            Val::Other(s) => write!(f, "<{s}>"),
        }
    }
}

fn val(f: &Frame<'_>) -> Val {
    match f {
        Frame::Simple(s) => Val::Simple(s.to_vec()),
        Frame::Error(s) => Val::Error(s.to_vec()),
        Frame::Integer(n) => Val::Int(*n),
        Frame::Bulk(b) => Val::Bulk(b.to_vec()),
        Frame::NullBulk | Frame::NullArray => Val::Null,
        Frame::Null => Val::Null3,
        Frame::Aggregate(a) => {
            let items = a.iter().map(|f| val(&f)).collect();
            match a.kind() {
                resp::AggregateKind::Map => Val::Map(items),
                resp::AggregateKind::Push => Val::Push(items),
                _ => Val::Array(items),
            }
        }
        other => Val::Other(format!("{other:?}")),
    }
}

/// Every frame of `bytes` (the simulation writes whole frames only).
fn frames(mut bytes: &[u8]) -> Vec<Val> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        match resp::parse(bytes, &Limits::default()) {
            Ok(Status::Complete((f, n))) => {
                out.push(val(&f));
                bytes = &bytes[n..];
            }
            other => panic!("the simulation wrote bad RESP ({other:?}): {}", esc(bytes)),
        }
    }
    out
}

// ----- cases -----------------------------------------------------------------------------------

/// Which real server a case runs on (each started once, emptied before each case).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// No password, no persistence (LocalMaster's defaults).
    Plain,
    /// `--requirepass s3cret`, plus the ACL user `alice` with password `pw`.
    Auth,
    /// `--appendonly yes --appendfsync always`.
    Durable,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cmp {
    Exact,
    Ttl,
    Info,
    Config,
    Sorted,
    /// `HELLO`: equal but the connection `id` (any integer on both).
    Hello,
    /// Exact against the modelled server (Redis 7.0); not compared against another, where
    /// the answer differs for a documented reason (an input the client never sends).
    ModelOnly,
    /// A bulk string on both (its value not compared: a score on the server's clock,
    /// which the simulated clock does not follow), or a null on both.
    Present,
}

enum Step {
    /// Bytes on connection `conn`; `whole`: they end on a command boundary (then the
    /// sentinel PING may follow on `conn`).
    Send {
        conn: usize,
        bytes: Vec<u8>,
        cmp: Cmp,
        whole: bool,
        what: String,
    },
    /// Both clocks move on by this many ms (a real sleep).
    Sleep(u64),
    /// The server restarts (persistent for `Kind::Durable`); every connection is opened
    /// again.
    Restart,
}

struct Case {
    name: &'static str,
    kind: Kind,
    conns: usize,
    steps: Vec<Step>,
}

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    let args: Vec<resp::Arg<'_>> = args.iter().map(|a| resp::Arg::Bytes(a)).collect();
    resp::encode_command(&mut out, &args);
    out
}

fn describe(args: &[&[u8]]) -> String {
    let mut s = String::new();
    for a in args {
        let a = if a.len() > 40 {
            format!("{}..({} bytes)", esc(&a[..24]), a.len())
        } else {
            esc(a)
        };
        s.push_str(&a);
        s.push(' ');
    }
    s
}

/// A case's steps, built call by call.
struct Steps(Vec<Step>);

impl Steps {
    fn new() -> Steps {
        Steps(Vec::new())
    }
    fn send(&mut self, conn: usize, args: &[&[u8]], cmp: Cmp) -> &mut Steps {
        self.0.push(Step::Send {
            conn,
            bytes: encode(args),
            cmp,
            whole: true,
            what: describe(args),
        });
        self
    }
    /// A command of text arguments, compared exactly.
    fn c(&mut self, conn: usize, args: &[&str]) -> &mut Steps {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send(conn, &args, Cmp::Exact)
    }
    /// A command whose integers above 1 are TTLs.
    fn ttl(&mut self, conn: usize, args: &[&str]) -> &mut Steps {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send(conn, &args, Cmp::Ttl)
    }
    fn cmp(&mut self, conn: usize, args: &[&str], cmp: Cmp) -> &mut Steps {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send(conn, &args, cmp)
    }
    fn raw(&mut self, conn: usize, bytes: &[u8], whole: bool) -> &mut Steps {
        self.0.push(Step::Send {
            conn,
            bytes: bytes.to_vec(),
            cmp: Cmp::Exact,
            whole,
            what: format!("raw {}", esc(bytes)),
        });
        self
    }
    /// Commands of text arguments sent as one step (no sentinel between them: a
    /// `CLIENT CACHING YES` lasts for the next command only), compared exactly.
    fn pipe(&mut self, conn: usize, cmds: &[&[&str]]) -> &mut Steps {
        let mut bytes = Vec::new();
        let mut what = String::new();
        for args in cmds {
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            bytes.extend(encode(&args));
            what.push_str(&describe(&args));
            what.push_str("; ");
        }
        self.0.push(Step::Send {
            conn,
            bytes,
            cmp: Cmp::Exact,
            whole: true,
            what,
        });
        self
    }
    fn sleep(&mut self, ms: u64) -> &mut Steps {
        self.0.push(Step::Sleep(ms));
        self
    }
    fn restart(&mut self) -> &mut Steps {
        self.0.push(Step::Restart);
        self
    }
    /// The client's handshake loads: `SCRIPT LOAD` of every script.
    fn load_all(&mut self, conn: usize) -> &mut Steps {
        for s in scripts::ALL {
            self.send(conn, &[b"SCRIPT", b"LOAD", s.src.as_bytes()], Cmp::Exact);
        }
        self
    }
    fn script(
        &mut self,
        conn: usize,
        by_sha: bool,
        s: Script,
        keys: &[&str],
        argv: &[&str],
        cmp: Cmp,
    ) -> &mut Steps {
        // The keys a client declares beside the lock keys (see `declared`).
        let (keys, argv) = declared(s, keys, argv);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let n = keys.len().to_string();
        let mut args: Vec<&[u8]> = if by_sha {
            vec![b"EVALSHA", s.sha.as_bytes()]
        } else {
            vec![b"EVAL", s.src.as_bytes()]
        };
        args.push(n.as_bytes());
        args.extend(keys.iter().map(|k| k.as_bytes()));
        args.extend(argv.iter().map(|a| a.as_bytes()));
        self.send(conn, &args, cmp)
    }
    /// `EVALSHA` of `s`, compared exactly.
    fn sha(&mut self, conn: usize, s: Script, keys: &[&str], argv: &[&str]) -> &mut Steps {
        self.script(conn, true, s, keys, argv, Cmp::Exact)
    }
    /// `EVALSHA` of `s` whose answer carries a TTL.
    fn sha_ttl(&mut self, conn: usize, s: Script, keys: &[&str], argv: &[&str]) -> &mut Steps {
        self.script(conn, true, s, keys, argv, Cmp::Ttl)
    }
    /// `ACQUIRE_WAIT` of one key on connection 0 by a waiter standing in line:
    /// `[token, 30000, id, alive_ms, polite, score]`.
    fn wait(
        &mut self,
        key: &str,
        token: &str,
        id: &str,
        alive: &str,
        polite: bool,
        score: &str,
    ) -> &mut Steps {
        let p = if polite { "p" } else { "" };
        self.script(
            0,
            true,
            scripts::ACQUIRE_WAIT,
            &[key],
            &[token, "30000", id, alive, p, score],
            Cmp::Ttl,
        )
    }
    fn done(&mut self) -> Vec<Step> {
        std::mem::take(&mut self.0)
    }
}

/// What the client sends for a script on lock keys `keys`: the keys it declares beside
/// them (`scripts::aux_key`: the lines and liveness sets of a release, of a waiting acquire
/// with a line, of the operators' scripts; `INSPECT`'s counter and old counter) and, for
/// the fencing scripts given `[lock keys.., counters..]` with the arguments before the
/// count, the count of lock keys. Keys already naming one of the crate's keys, and
/// argument lists of another length, are sent as given (the cases of invalid requests).
fn declared(s: Script, keys: &[&str], argv: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut k: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    let mut a: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let raw = keys.iter().any(|k| k.starts_with("redlock-mux:"));
    let beside = |kinds: &[&[u8]]| -> Vec<String> {
        kinds
            .iter()
            .flat_map(|kind| keys.iter().map(move |key| aux(kind, key)))
            .collect()
    };
    if raw {
        return (k, a);
    }
    if s == scripts::RELEASE
        || (s == scripts::ACQUIRE_WAIT && keys.len() == 1 && argv.len() > 2)
        || (s == scripts::FORCE_RELEASE && keys.len() == 1)
    {
        k.extend(beside(&[scripts::QUEUE, scripts::ALIVE]));
    } else if s == scripts::INSPECT && keys.len() == 1 {
        k.extend(beside(&[scripts::QUEUE, scripts::ALIVE, scripts::FENCE]));
        k.push(format!("redlock-mux:fence:{}", keys[0]));
    } else if (s == scripts::FENCE_DRAW && argv.len() == 1)
        || (s == scripts::FENCE_RAISE && argv.len() == 2)
    {
        a.push((keys.len() / 2).to_string());
    }
    (k, a)
}

/// `scripts::aux_key(kind, key)` as a string.
fn aux(kind: &[u8], key: &str) -> String {
    String::from_utf8(scripts::aux_key(kind, key.as_bytes())).unwrap()
}

fn case(name: &'static str, kind: Kind, conns: usize, steps: &mut Steps) -> Case {
    Case {
        name,
        kind,
        conns,
        steps: steps.done(),
    }
}

// Tokens: 32 bytes like the client's; their first 16 bytes are what a release publishes.
const TA: &str = "a0a0a0a0a0a0a0a0aaaaaaaaaaaaaaaa";
const TB: &str = "b0b0b0b0b0b0b0b0bbbbbbbbbbbbbbbb";
const TH: &str = "d0d0d0d0d0d0d0d0dddddddddddddddd";
const TW1: &str = "e1e1e1e1e1e1e1e1eeeeeeeeeeeeeeee";
const TW2: &str = "e2e2e2e2e2e2e2e2eeeeeeeeeeeeeeee";
const TW3: &str = "e3e3e3e3e3e3e3e3eeeeeeeeeeeeeeee";
// Waiter ids: 16 bytes, the first 8 name the client (`redlock-mux:next:<client>`).
const W1: &str = "cli1aaaacall0001";
const W2: &str = "cli2bbbbcall0002";
const W3: &str = "cli3cccccall0003";
/// The line of `k` (`scripts::aux_key(QUEUE, "k")`: named after the key, which has no `}`).
const Q: &str = "redlock-mux:{k}:queue";
/// The liveness set of `k`'s waiters.
const A: &str = "redlock-mux:{k}:alive";
/// A moment on the server's clock (ms) that no run reaches: alive for good.
const FOREVER: &str = "9000000000000000";
const RELEASED_K: &str = "redlock-mux:released:k";

fn next(id: &str) -> String {
    format!("redlock-mux:next:{}", &id[..8])
}

/// A line of `dead` waiters without liveness (scores 1..), then a live one
/// (`liveclntcall0099`, score 99). Built with ZADD: standing in line through ACQUIRE_WAIT
/// with a short liveness would make the line's own TTL short too, and on a loaded machine
/// the line could expire between two steps (the simulated clock does not move there).
fn line_of_dead(s: &mut Steps, dead: usize) {
    let mut zadd: Vec<String> = vec!["ZADD".into(), Q.into()];
    for d in 1..=dead {
        zadd.push(d.to_string());
        zadd.push(format!("deadcli{d}call000{d}"));
    }
    zadd.extend(["99".into(), "liveclntcall0099".into()]);
    let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
    s.c(0, &zadd)
        .c(0, &["ZADD", A, FOREVER, "liveclntcall0099"]);
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let s = &mut Steps::new();

    // ---- plain commands -----------------------------------------------------------------
    let long = "x".repeat(100);
    s.c(0, &["SET", "k", "v"])
        .c(0, &["GET", "k"])
        .c(0, &["SET", "k", "v2", "NX", "PX", "60000"])
        .c(0, &["SET", "n", "v", "NX", "PX", "60000"])
        .ttl(0, &["PTTL", "n"])
        .c(0, &["PTTL", "k"])
        .c(0, &["PTTL", "nokey"])
        .c(0, &["EXISTS", "k", "n", "nokey", "k"])
        .c(0, &["DEL", "k", "n", "nokey"])
        .c(0, &["GET", "k"])
        .c(0, &["SET", "k", "v", "PX", "0"])
        .c(0, &["SET", "k", "v", "PX", "-5"])
        .c(0, &["SET", "k", "v", "PX", "abc"])
        .c(0, &["SET", "k", "v", "PX", "+5"])
        .c(0, &["SET", "k", "v", "FOO"])
        .c(0, &["SET", "k", "v", "NX", "XX"])
        .c(0, &["SET", "k", "v", "EX", "10", "PX", "10"])
        .c(0, &["SET", "k", "v", "PX"])
        .c(0, &["SET", "k", "v", "px", "60000", "nx"])
        .c(0, &["SET", "k", "v2", "XX", "GET"])
        .c(0, &["SET", "k", "v3", "NX", "GET"])
        .ttl(0, &["PTTL", "k"])
        .c(0, &["SET", "k", "v4", "KEEPTTL"])
        .ttl(0, &["PTTL", "k"])
        .c(0, &["SET", "k", "v5", "EX", "100"])
        .ttl(0, &["PTTL", "k"])
        .c(0, &["SET", "k", "v6"])
        .c(0, &["PTTL", "k"])
        .c(0, &["GET"])
        .c(0, &["GET", "a", "b"])
        .c(0, &["FOO", "a", "b"])
        .c(0, &["foo"])
        .c(0, &["FOO", &long, &long, "c"])
        .c(0, &["ZADD", "z", "1", "a"])
        .c(0, &["GET", "z"])
        .c(0, &["SET", "z", "v", "NX"])
        .c(0, &["SET", "z", "v", "GET"])
        .c(0, &["DBSIZE"])
        .c(0, &["PING"])
        .c(0, &["PING", "hi"])
        .c(0, &["PING", "a", "b"]);
    v.push(case("plain_commands", Kind::Plain, 1, s));

    // `DELIFEQ` (issue 23): Valkey 9's, modelled when the real server is Valkey 9
    // (`Config::valkey`); an unknown command on Redis 7.0 and in its model.
    let marked = format!("{TA}+");
    s.c(0, &["SET", "k", TA])
        .c(0, &["DELIFEQ", "k", TB])
        .c(0, &["GET", "k"])
        .c(0, &["DELIFEQ", "k", TA])
        .c(0, &["GET", "k"])
        .c(0, &["DELIFEQ", "k", TA])
        .c(0, &["SET", "k", &marked])
        .c(0, &["DELIFEQ", "k", TA])
        .c(0, &["DELIFEQ", "k", &marked])
        .c(0, &["ZADD", "z", "1", "m"])
        .c(0, &["DELIFEQ", "z", "m"])
        .c(0, &["DELIFEQ", "k"]);
    v.push(case("delifeq", Kind::Plain, 1, s));

    s.c(
        0,
        &["ZADD", "z", "2", "b", "1", "a", "1.5", "c", "1e3", "d"],
    )
    .c(0, &["ZADD", "z", "NX", "9", "a", "3", "e"])
    .c(0, &["ZADD", "z", "XX", "9", "a", "3", "f"])
    .c(0, &["ZADD", "z", "CH", "0.5", "b", "7", "g"])
    .c(0, &["ZADD", "z", "NX", "XX", "1", "a"])
    .c(0, &["ZADD", "z", "1"])
    .c(0, &["ZADD", "z", "x", "a"])
    .c(0, &["ZADD", "z", "nan", "a"])
    .c(0, &["ZRANGE", "z", "0", "-1", "WITHSCORES"])
    .c(0, &["ZRANGE", "z", "0", "0"])
    .c(0, &["ZRANGE", "z", "-2", "100"])
    .c(0, &["ZRANGE", "z", "5", "2"])
    .c(0, &["ZRANGE", "nokey", "0", "-1"])
    .c(0, &["ZSCORE", "z", "c"])
    .c(0, &["ZSCORE", "z", "nobody"])
    .c(0, &["ZRANK", "z", "c"])
    .c(0, &["ZRANK", "z", "nobody"])
    .c(0, &["ZRANK", "nokey", "a"])
    .c(0, &["ZCARD", "z"])
    .c(0, &["ZREM", "z", "a", "nobody", "b"])
    .c(0, &["ZREM", "z", "c", "d", "e", "g"])
    .c(0, &["EXISTS", "z"])
    .c(0, &["SET", "s", "v"])
    .c(0, &["ZADD", "s", "1", "a"])
    .c(0, &["ZRANGE", "s", "0", "0"])
    .c(0, &["ZRANK", "s", "a"])
    .c(0, &["ZREM", "s", "a"]);
    v.push(case("sorted_sets", Kind::Plain, 1, s));

    s.c(0, &["SET", "a", "1", "PX", "40"])
        .c(0, &["SET", "b", "1", "PX", "60000"])
        .c(0, &["SET", "c", "1"])
        .sleep(80)
        .c(0, &["GET", "a"])
        .c(0, &["EXISTS", "a", "b", "c"])
        .cmp(0, &["KEYS", "*"], Cmp::Sorted)
        .c(0, &["PEXPIRE", "b", "100000"])
        .ttl(0, &["PTTL", "b"])
        .c(0, &["PEXPIRE", "c", "0"])
        .c(0, &["EXISTS", "c"])
        .c(0, &["PEXPIRE", "nokey", "10"])
        .c(0, &["PEXPIRE", "b", "abc"])
        .c(0, &["PEXPIRE", "b", "9223372036854775807"])
        .c(0, &["SET", "d", "1", "PX", "9223372036854775807"])
        .c(0, &["SET", "d", "1", "EX", "9223372036854775"])
        .c(0, &["SET", "e", "1", "PXAT", "1"])
        .c(0, &["SET", "b2", "1"])
        .cmp(0, &["KEYS", "*"], Cmp::Sorted)
        .cmp(0, &["KEYS", "b*"], Cmp::Sorted)
        .cmp(0, &["KEYS", "?"], Cmp::Sorted)
        .cmp(0, &["KEYS", "[a-b]?"], Cmp::Sorted)
        .c(0, &["FLUSHALL"])
        .c(0, &["DBSIZE"]);
    v.push(case("expiry_and_keys", Kind::Plain, 1, s));

    s.c(0, &["SELECT", "1"])
        .c(0, &["SET", "k", "one"])
        .c(0, &["SELECT", "0"])
        .c(0, &["GET", "k"])
        .c(0, &["SELECT", "16"])
        .c(0, &["SELECT", "-1"])
        .c(0, &["SELECT", "x"])
        .c(0, &["SELECT", "99999999999"])
        .c(0, &["SELECT"])
        .c(1, &["GET", "k"])
        .c(0, &["SELECT", "1"])
        .c(0, &["GET", "k"])
        .c(1, &["SELECT", "15"])
        // A script in database 1 publishes on a channel every database shares.
        .load_all(0)
        .c(2, &["SUBSCRIBE", "redlock-mux:released:k1"])
        .c(0, &["SET", "k1", TA, "PX", "60000"])
        .sha(0, scripts::RELEASE, &["k1"], &[TA])
        .c(1, &["SELECT", "1"])
        .c(1, &["EXISTS", "k", "k1"]);
    v.push(case("select_databases", Kind::Plain, 3, s));

    s.c(0, &["AUTH", "x"])
        .c(0, &["AUTH", "u", "x"])
        .c(0, &["AUTH", "default", "anything"])
        .c(0, &["AUTH", "a", "b", "c"])
        .c(0, &["AUTH"]);
    v.push(case("auth_without_password", Kind::Plain, 1, s));

    s.c(0, &["GET", "k"])
        .c(0, &["GET"])
        .c(0, &["FOO"])
        .c(0, &["PING"])
        .c(0, &["SUBSCRIBE", "a"])
        .c(0, &["SCRIPT", "LOAD", "x"])
        .c(0, &["AUTH", "bad"])
        .c(0, &["AUTH", "default", "bad"])
        .c(0, &["AUTH", "alice", "bad"])
        .c(0, &["AUTH", "nobody", "pw"])
        .c(0, &["AUTH", "a", "b", "c"])
        .c(0, &["AUTH", "s3cret"])
        .c(0, &["GET", "k"])
        .c(1, &["AUTH", "alice", "pw"])
        .c(1, &["SET", "x", "1"])
        .c(1, &["AUTH", "alice", "bad"])
        .c(1, &["GET", "x"])
        .c(1, &["AUTH", "default", "s3cret"])
        .c(0, &["QUIT"])
        .raw(2, b"*11\r\n", true)
        .raw(3, b"*2\r\n$3\r\nGET\r\n$20000\r\n", true)
        .c(4, &["QUIT", "extra"]);
    v.push(case("auth_required", Kind::Auth, 5, s));

    s.cmp(0, &["INFO", "server"], Cmp::Info)
        .cmp(0, &["CONFIG", "GET", "append*"], Cmp::Config)
        .c(0, &["CONFIG", "GET", "appendonly"])
        .c(0, &["CONFIG", "GET", "APPENDFSYNC"])
        .c(0, &["CONFIG", "GET", "nonexist"])
        .c(0, &["CONFIG", "GET"])
        .c(0, &["CONFIG", "FOO"])
        .c(0, &["CONFIG"])
        .cmp(0, &["INFO", "server"], Cmp::Info);
    v.push(case("info_and_config", Kind::Plain, 1, s));

    s.cmp(0, &["CONFIG", "GET", "append*"], Cmp::Config)
        .c(0, &["CONFIG", "GET", "appendfsync"]);
    v.push(case("durable_config", Kind::Durable, 1, s));

    let upper = scripts::RELEASE.sha.to_ascii_uppercase();
    let rel = scripts::RELEASE.sha;
    s.sha(0, scripts::RELEASE, &["k"], &[TA])
        .script(0, false, scripts::RELEASE, &["k"], &[TA], Cmp::Exact)
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .sha(0, scripts::EXTEND, &["k"], &[TA, "100"])
        .load_all(0)
        .c(
            0,
            &["SCRIPT", "EXISTS", rel, scripts::FENCE_RAISE.sha, "abc"],
        )
        .c(0, &["EVALSHA", &upper, "1", "k", TA])
        .c(0, &["EVALSHA", rel, "x"])
        .c(0, &["EVALSHA", rel, "5", "k"])
        .c(0, &["EVALSHA", rel, "-1"])
        .c(0, &["EVALSHA", "abc", "x"])
        .c(0, &["EVALSHA", &"a".repeat(40), "0"])
        .c(0, &["EVALSHA", rel])
        .c(0, &["EVAL", scripts::RELEASE.src, "x"])
        .c(0, &["EVAL", scripts::RELEASE.src, "3", "k"])
        .c(0, &["SCRIPT", "FLUSH"])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .c(0, &["SCRIPT", "EXISTS", rel])
        .c(0, &["SCRIPT", "FLUSH", "X"])
        .c(0, &["SCRIPT", "FLUSH", "ASYNC"])
        .c(0, &["SCRIPT", "FLUSH", "sync"])
        .c(0, &["SCRIPT", "LOAD"])
        .c(0, &["SCRIPT", "FOO"])
        .c(0, &["SCRIPT"])
        .c(0, &["EVAL"]);
    v.push(case("script_cache_and_noscript", Kind::Plain, 1, s));

    s.c(0, &["SUBSCRIBE", "a", "b"])
        .c(0, &["SUBSCRIBE", "a"])
        .c(0, &["GET", "k"])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .c(0, &["PING"])
        .c(0, &["PING", "x"])
        .c(0, &["PING", "x", "y"])
        .c(0, &["UNSUBSCRIBE", "zz"])
        .c(0, &["UNSUBSCRIBE", "b"])
        .c(1, &["PUBLISH", "a", "hello"])
        .c(1, &["PUBLISH", "b", "nobody hears"])
        .c(0, &["UNSUBSCRIBE", "a"])
        .c(0, &["GET", "k"])
        .c(0, &["UNSUBSCRIBE"])
        .c(0, &["SUBSCRIBE", "c"])
        .c(0, &["UNSUBSCRIBE"])
        .c(2, &["SUBSCRIBE", "a"])
        .c(1, &["SUBSCRIBE", "a"])
        .c(0, &["PUBLISH", "a", "two"])
        .c(1, &["QUIT"])
        .c(0, &["PUBLISH", "nobody", "x"])
        .c(0, &["PUBLISH", "a"]);
    v.push(case("subscribe_and_publish", Kind::Plain, 3, s));

    // ---- RELEASE ---------------------------------------------------------------------------
    s.load_all(0)
        .c(1, &["SUBSCRIBE", RELEASED_K, &next(W1)])
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .c(0, &["GET", "k"])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .c(0, &["SET", "k", "short", "PX", "60000"])
        .sha(0, scripts::RELEASE, &["k"], &["short"])
        .c(0, &["SET", "k", TA])
        .sha(0, scripts::RELEASE, &["k"], &[TB])
        .c(0, &["GET", "k"])
        .sha(0, scripts::RELEASE, &["k"], &[])
        .sha(0, scripts::RELEASE, &[], &[TA])
        .c(0, &["SET", "k1", TA, "PX", "60000"])
        .c(0, &["SET", "k2", TB, "PX", "60000"])
        .c(
            1,
            &[
                "SUBSCRIBE",
                "redlock-mux:released:k1",
                "redlock-mux:released:k2",
            ],
        )
        // Not all held: 0, but the key it held is deleted and announced.
        .sha(0, scripts::RELEASE, &["k1", "k2"], &[TA])
        .c(0, &["EXISTS", "k1", "k2"])
        .c(0, &["SET", "k1", TA, "PX", "60000"])
        .c(0, &["SET", "k2", TA, "PX", "60000"])
        .sha(0, scripts::RELEASE, &["k1", "k2"], &[TA])
        .c(0, &["ZADD", "zk", "1", "a"])
        .sha(0, scripts::RELEASE, &["zk"], &[TA])
        .c(0, &["SET", Q, "junk"])
        .c(0, &["SET", "k", TA, "PX", "60000"])
        // The line is not a sorted set: pcall errors are ignored, the key channel hears it.
        .sha(0, scripts::RELEASE, &["k"], &[TA, W1])
        .c(0, &["GET", Q]);
    v.push(case(
        "release_announces_on_the_key_channel",
        Kind::Plain,
        2,
        s,
    ));

    s.load_all(0)
        .c(2, &["SUBSCRIBE", RELEASED_K, &next(W1), &next(W2)])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .ttl(0, &["PTTL", Q])
        .ttl(0, &["PTTL", A])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        // The first live waiter's client hears it, with the waiter's id after the note.
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        .cmp(0, &["ZSCORE", A, W2], Cmp::Present);
    v.push(case(
        "release_names_the_first_live_waiter",
        Kind::Plain,
        3,
        s,
    ));

    s.load_all(0)
        .c(2, &["SUBSCRIBE", RELEASED_K, &next(W1), &next(W2)])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "40", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        .sleep(80)
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        .cmp(0, &["ZSCORE", A, W2], Cmp::Present)
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"]);
    v.push(case("release_skips_a_dead_waiter", Kind::Plain, 3, s));

    for (name, dead) in [
        ("release_looks_at_eight_waiters", 8),
        ("release_finds_the_live_one_after_seven_dead", 7),
    ] {
        s.load_all(0)
            .c(
                2,
                &[
                    "SUBSCRIBE",
                    RELEASED_K,
                    "redlock-mux:next:liveclnt",
                    "redlock-mux:next:deadcli1",
                ],
            )
            .c(0, &["SET", "k", TH, "PX", "60000"]);
        line_of_dead(s, dead);
        s.sha(0, scripts::RELEASE, &["k"], &[TH])
            .c(0, &["ZRANGE", Q, "0", "-1"]);
        v.push(case(name, Kind::Plain, 3, s));
    }

    s.load_all(0)
        .c(
            2,
            &["SUBSCRIBE", RELEASED_K, &next(W1), &next(W2), &next(W3)],
        )
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        // W1 gives up: its release (not holding) leaves the line and drops its liveness.
        .sha(0, scripts::RELEASE, &["k"], &[TW1, W1])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        .wait("k", TW2, W2, "60000", false, "200")
        .wait("k", TW3, W3, "60000", false, "300")
        // W2 releases and leaves first: the turn is W3's.
        .sha(0, scripts::RELEASE, &["k"], &[TW2, W2])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .cmp(0, &["ZSCORE", A, W2], Cmp::Present)
        .sha(0, scripts::RELEASE, &["k"], &[TW3, W3])
        .c(0, &["EXISTS", Q])
        .cmp(0, &["ZSCORE", A, W3], Cmp::Present)
        .sha(0, scripts::RELEASE, &["k"], &[TW3, ""])
        .c(0, &["ZADD", Q, "1", W1])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        // The only one in line has no liveness key: removed, the key channel hears it.
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        .c(0, &["EXISTS", Q]);
    v.push(case("release_leaves_the_line", Kind::Plain, 3, s));

    // ---- RELEASE_LEAN ----------------------------------------------------------------------
    s.load_all(0)
        .c(1, &["SUBSCRIBE", RELEASED_K, &next(W1)])
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .sha(0, scripts::RELEASE_LEAN, &["k"], &[TA])
        .c(0, &["GET", "k"])
        .sha(0, scripts::RELEASE_LEAN, &["k"], &[TA])
        .c(0, &["SET", "k", "short", "PX", "60000"])
        .sha(0, scripts::RELEASE_LEAN, &["k"], &["short"])
        .c(0, &["SET", "k", TA])
        .sha(0, scripts::RELEASE_LEAN, &["k"], &[TB])
        .sha(0, scripts::RELEASE_LEAN, &["k"], &[])
        .sha(0, scripts::RELEASE_LEAN, &[], &[TA])
        .c(0, &["SET", "k1", TA, "PX", "60000"])
        .c(0, &["SET", "k2", TB, "PX", "60000"])
        .sha(0, scripts::RELEASE_LEAN, &["k1", "k2"], &[TA])
        .c(0, &["EXISTS", "k1", "k2"])
        .c(0, &["ZADD", "zk", "1", "a"])
        .sha(0, scripts::RELEASE_LEAN, &["zk"], &[TA])
        // Marked: the line is looked at; not a sorted set, the key channel hears it.
        .c(0, &["SET", Q, "junk"])
        .c(0, &["SET", "k", &format!("{TA}+"), "PX", "60000"])
        .sha(0, scripts::RELEASE_LEAN, &["k"], &[TA])
        .c(0, &["EXISTS", "k"])
        .c(0, &["GET", Q]);
    v.push(case("release_lean_compares_and_deletes", Kind::Plain, 2, s));

    s.load_all(0)
        .c(2, &["SUBSCRIBE", RELEASED_K, &next(W1), &next(W2)])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "40", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        .sleep(80)
        // The first live waiter's client hears it (the dead one leaves the line), as from
        // the full release: the lean one finds the line by the key's name.
        .sha(0, scripts::RELEASE_LEAN, &["k"], &[TH])
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .cmp(0, &["ZSCORE", A, W2], Cmp::Present);
    v.push(case(
        "release_lean_names_the_first_live_waiter",
        Kind::Plain,
        3,
        s,
    ));

    // ---- EXTEND ----------------------------------------------------------------------------
    s.load_all(0)
        .c(0, &["SET", "k", TA, "PX", "10000"])
        .sha(0, scripts::EXTEND, &["k"], &[TB, "60000"])
        .ttl(0, &["PTTL", "k"])
        .sha(0, scripts::EXTEND, &["k"], &[TA, "60000"])
        .ttl(0, &["PTTL", "k"])
        .sha(0, scripts::EXTEND, &["k"], &[TA, "20000"])
        .ttl(0, &["PTTL", "k"])
        .c(0, &["SET", "m", TA])
        .sha(0, scripts::EXTEND, &["k", "m"], &[TA, "30000"])
        .ttl(0, &["PTTL", "m"])
        .ttl(0, &["PTTL", "k"])
        .sha(0, scripts::EXTEND, &["k", "nokey"], &[TA, "90000"])
        .ttl(0, &["PTTL", "k"])
        .sha(0, scripts::EXTEND, &["k"], &[TA, "0x10"])
        .sha(0, scripts::EXTEND, &[], &[TA])
        .sha(0, scripts::EXTEND, &["k"], &[])
        .c(0, &["SET", "n", TA])
        .sha(0, scripts::EXTEND, &["n"], &[TA])
        .sha(0, scripts::EXTEND, &["n"], &[TA, "abc"])
        .sha(0, scripts::EXTEND, &["n"], &[TA, "1.5"])
        // Lua writes tonumber("-0") back as "-0": Redis 7.0's PEXPIRE refuses it (-ERR),
        // Valkey 9 reads it as 0 and deletes the key (:1). The client never sends "-0".
        .script(
            0,
            true,
            scripts::EXTEND,
            &["n"],
            &[TA, "-0"],
            Cmp::ModelOnly,
        )
        .c(0, &["SET", "n", TA])
        // PTTL -1 is not below -1: no PEXPIRE (which would delete the key).
        .sha(0, scripts::EXTEND, &["n"], &[TA, "-1"])
        .c(0, &["PTTL", "n"])
        .sha(0, scripts::EXTEND, &["n"], &[TA, "-0.5"])
        .c(0, &["EXISTS", "n"])
        .c(0, &["SET", "n", TA])
        .sha(0, scripts::EXTEND, &["n"], &[TA, "1e20"])
        .sha(0, scripts::EXTEND, &["n"], &[TA, " 1e4 "])
        .ttl(0, &["PTTL", "n"])
        .c(0, &["ZADD", "z", "1", "a"])
        .sha(0, scripts::EXTEND, &["z"], &[TA, "100"]);
    v.push(case("extend_never_shortens", Kind::Plain, 1, s));

    // A master that lost a key: 2, and nothing set unless `put`; with `put`, the missing
    // keys set where every other key holds the token, never where one is someone else's;
    // with no TTL argument the SET raises.
    s.load_all(0)
        .sha(0, scripts::EXTEND, &["gone"], &[TA, "60000"])
        .c(0, &["EXISTS", "gone"])
        .sha(0, scripts::EXTEND, &["gone"], &[TA, "60000", "put"])
        .c(0, &["GET", "gone"])
        .ttl(0, &["PTTL", "gone"])
        .c(0, &["SET", "mine", TA, "PX", "10000"])
        .sha(0, scripts::EXTEND, &["mine", "gone2"], &[TA, "50000"])
        .ttl(0, &["PTTL", "mine"])
        .c(0, &["EXISTS", "gone2"])
        .sha(
            0,
            scripts::EXTEND,
            &["mine", "gone2"],
            &[TA, "50000", "put"],
        )
        .ttl(0, &["PTTL", "gone2"])
        .sha(
            0,
            scripts::EXTEND,
            &["mine", "gone2"],
            &[TA, "50000", "put"],
        )
        .c(0, &["SET", "theirs", TB, "PX", "10000"])
        .sha(
            0,
            scripts::EXTEND,
            &["gone3", "theirs"],
            &[TA, "50000", "put"],
        )
        .c(0, &["EXISTS", "gone3"])
        .sha(0, scripts::EXTEND, &["gone4"], &[TA, "x", "put"])
        .sha(0, scripts::EXTEND, &["gone4"], &[TA])
        .c(0, &["EXISTS", "gone4"])
        .sha(0, scripts::EXTEND, &["gone5"], &[])
        .c(0, &["SET", "marked", &format!("{TA}+"), "PX", "10000"])
        .sha(
            0,
            scripts::EXTEND,
            &["marked", "gone6"],
            &[TA, "40000", "put"],
        )
        .c(0, &["GET", "gone6"]);
    v.push(case("extend_puts_back_a_lost_key", Kind::Plain, 1, s));

    // ---- client-side tracking (issue 21) -----------------------------------------------------
    // Connection 0 tracks as the client's lock links do (RESP3, OPTIN, NOLOOP), connection
    // 1 is someone else (RESP2), connection 2 tracks every read and without NOLOOP.
    s.cmp(0, &["HELLO", "3"], Cmp::Hello)
        .c(0, &["CLIENT", "TRACKING", "ON", "OPTIN", "NOLOOP"])
        .pipe(0, &[&["CLIENT", "CACHING", "YES"], &["MGET", "k"]])
        // Someone else writes a key read under CACHING: one push, and the key is forgotten.
        .c(1, &["SET", "k", TA, "PX", "60000"])
        .c(1, &["SET", "k", TA, "PX", "60000"])
        // A read without CACHING does not track.
        .c(0, &["MGET", "k"])
        .c(1, &["SET", "k", TB, "PX", "60000"])
        .pipe(
            0,
            &[&["CLIENT", "CACHING", "YES"], &["MGET", "k", "a", "k"]],
        )
        .c(0, &["GET", "nokey"])
        // Our own write (NOLOOP): no push, and the key is forgotten: someone's DEL is
        // not heard (why a waiting acquire's reply re-arms the watch).
        .c(0, &["APPEND", "k", "+"])
        .c(1, &["DEL", "k"])
        // A missing key read under CACHING is tracked too.
        .c(1, &["SET", "a", "v"])
        .pipe(0, &[&["CLIENT", "CACHING", "YES"], &["GET", "a"]])
        .c(1, &["PEXPIRE", "a", "60000"])
        .c(1, &["PEXPIRE", "a", "60000"])
        .pipe(0, &[&["CLIENT", "CACHING", "YES"], &["GET", "a"]])
        .c(1, &["DEL", "nokey", "a"])
        // A refused SET NX writes nothing; SET XX does.
        .c(1, &["SET", "b", "v"])
        .pipe(0, &[&["CLIENT", "CACHING", "YES"], &["MGET", "b"]])
        .c(1, &["SET", "b", "v2", "NX"])
        .c(1, &["SET", "b", "v3", "XX"])
        // CACHING lasts one command, but a CLIENT command does not use it up.
        .pipe(
            0,
            &[
                &["CLIENT", "CACHING", "YES"],
                &["CLIENT", "TRACKING", "ON", "OPTIN", "NOLOOP"],
                &["GET", "c"],
                &["GET", "d"],
            ],
        )
        .c(1, &["SET", "c", "v"])
        .c(1, &["SET", "d", "v"])
        // A script's reads count for its caller (EXTEND of someone else's key reads it,
        // answers 0 and writes nothing).
        .c(1, &["SET", "s", TB, "PX", "60000"])
        .load_all(0)
        .pipe(
            0,
            &[
                &["CLIENT", "CACHING", "YES"],
                &["EVALSHA", scripts::EXTEND.sha, "1", "s", TA, "1000"],
            ],
        )
        .c(1, &["SET", "s", TA, "PX", "60000"])
        // EXTEND of our own key reads it and writes it (PEXPIRE): forgotten, no push.
        .pipe(
            0,
            &[
                &["CLIENT", "CACHING", "YES"],
                &["EVALSHA", scripts::EXTEND.sha, "1", "s", TA, "90000"],
            ],
        )
        .c(1, &["DEL", "s"])
        // Expiry: the key goes (lazily on someone's read, or by the active expiry) and the
        // push follows.
        .c(1, &["SET", "e", "v", "PX", "100"])
        .pipe(0, &[&["CLIENT", "CACHING", "YES"], &["GET", "e"]])
        .sleep(400)
        .c(1, &["GET", "e"])
        // Without OPTIN every read tracks; without NOLOOP our own write is pushed to us
        // too, after its reply.
        .cmp(2, &["HELLO", "3"], Cmp::Hello)
        .c(2, &["CLIENT", "CACHING", "YES"])
        .c(2, &["CLIENT", "TRACKING", "ON"])
        .c(2, &["CLIENT", "CACHING", "YES"])
        .c(2, &["CLIENT", "CACHING", "NO"])
        .c(2, &["CLIENT", "CACHING", "maybe"])
        .c(2, &["GET", "x"])
        .c(2, &["SET", "x", "1"])
        .c(2, &["GET", "x"])
        .c(1, &["SET", "x", "2"])
        // FLUSHALL: a null invalidation to every tracking connection, ours after the reply.
        .c(1, &["FLUSHALL"])
        .c(0, &["FLUSHALL"])
        // Errors.
        .c(1, &["CLIENT", "CACHING", "YES"])
        .c(1, &["CLIENT", "TRACKING"])
        .c(1, &["CLIENT", "TRACKING", "maybe"])
        .c(1, &["CLIENT", "FOO"])
        .c(1, &["HELLO", "4"])
        .c(1, &["HELLO", "abc"])
        .cmp(1, &["HELLO", "2"], Cmp::Hello)
        .cmp(0, &["HELLO", "2"], Cmp::Hello)
        .c(0, &["GET", "nokey"])
        .cmp(0, &["HELLO"], Cmp::Hello);
    v.push(case("client_side_tracking", Kind::Plain, 3, s));

    // ---- ACQUIRE_MANY ----------------------------------------------------------------------
    s.load_all(0)
        .sha(0, scripts::ACQUIRE_MANY, &["a", "b"], &[TA, "60000"])
        .c(0, &["GET", "a"])
        .c(0, &["GET", "b"])
        .ttl(0, &["PTTL", "a"])
        .sha(0, scripts::ACQUIRE_MANY, &["c", "b"], &[TB, "60000"])
        .c(0, &["EXISTS", "c"])
        .c(0, &["GET", "b"])
        .sha(0, scripts::ACQUIRE_MANY, &[], &[TA, "100"])
        .sha(0, scripts::ACQUIRE_MANY, &["d"], &[TA, "0"])
        .sha(0, scripts::ACQUIRE_MANY, &["d"], &[TA])
        .sha(0, scripts::ACQUIRE_MANY, &["d", "e"], &[TA, "abc"])
        .c(0, &["EXISTS", "d", "e"])
        .c(0, &["ZADD", "z", "1", "a"])
        .sha(0, scripts::ACQUIRE_MANY, &["f", "z"], &[TA, "100"]);
    v.push(case("acquire_many_all_or_nothing", Kind::Plain, 1, s));

    // ---- ACQUIRE_WAIT ----------------------------------------------------------------------
    s.load_all(0)
        .sha(0, scripts::ACQUIRE_WAIT, &["k"], &[TA, "60000"])
        .c(0, &["GET", "k"])
        .ttl(0, &["PTTL", "k"])
        .sha_ttl(0, scripts::ACQUIRE_WAIT, &["k"], &[TB, "60000"])
        .c(0, &["SET", "n", "short"])
        .sha(0, scripts::ACQUIRE_WAIT, &["n"], &[TB, "100"])
        .sha(0, scripts::ACQUIRE_WAIT, &["m"], &[TA])
        .sha(0, scripts::ACQUIRE_WAIT, &["m"], &[TA, "0"])
        .c(0, &["ZADD", "z", "1", "a"])
        .sha(0, scripts::ACQUIRE_WAIT, &["z"], &[TA, "100"])
        // A refused waiter without the rest of its line arguments: the pcalls fail quietly.
        .sha_ttl(0, scripts::ACQUIRE_WAIT, &["k"], &[TB, "100", W1])
        .c(0, &["EXISTS", Q])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present);
    v.push(case("acquire_wait_one_key", Kind::Plain, 1, s));

    s.load_all(0)
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", false, "1700000000000100")
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .ttl(0, &["PTTL", Q])
        .ttl(0, &["PTTL", A])
        // Asking again keeps its place (ZADD NX).
        .wait("k", TW1, W1, "50000", false, "999")
        .c(0, &["ZSCORE", Q, W1])
        .ttl(0, &["PTTL", A])
        .wait("k", TW2, W2, "60000", false, "1.5")
        .wait("k", TW3, W3, "60000", false, "notanumber")
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        // A waiter with a shorter liveness does not shorten the line's TTL (issue 19 item 3):
        // W1, alive for a minute, keeps its place after W3's 40 ms ran out.
        .wait("k", TW3, W3, "40", false, "300")
        .sleep(80)
        .c(0, &["EXISTS", Q])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        .cmp(0, &["ZSCORE", A, W3], Cmp::Present);
    v.push(case("acquire_wait_stands_in_line", Kind::Plain, 1, s));

    // A waiter whose last attempt could not reach a quorum stands out of line (issue 19
    // item 1): `ARGV[7] = 'o'` leaves the line, takes no place, and stays polite.
    let out = |token, id, polite| {
        let p = if polite { "p" } else { "" };
        [token, "30000", id, "60000", p, "100", "o"]
    };
    s.load_all(0)
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", false, "100")
        .wait("k", TW2, W2, "60000", true, "200")
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .sha_ttl(0, scripts::ACQUIRE_WAIT, &["k"], &out(TW1, W1, false))
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        .cmp(0, &["ZSCORE", A, W2], Cmp::Present)
        .c(0, &["DEL", "k"])
        // Free, W2 live and first: the polite W1, out of line, is refused and takes no place.
        .sha(0, scripts::ACQUIRE_WAIT, &["k"], &out(TW1, W1, true))
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        // Not polite: takes the free key, and is still not in line.
        .sha(0, scripts::ACQUIRE_WAIT, &["k"], &out(TW1, W1, false))
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .cmp(0, &["ZSCORE", A, W1], Cmp::Present)
        // Its next attempt in line rejoins at its own score.
        .sha(0, scripts::RELEASE, &["k"], &[TW1])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", true, "100")
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"]);
    v.push(case("acquire_wait_out_of_line", Kind::Plain, 1, s));

    // The waiter's mark (issue 23: a release looks for waiters only where one was refused).
    s.load_all(0)
        .c(
            1,
            &[
                "SUBSCRIBE",
                RELEASED_K,
                "redlock-mux:released:f",
                "redlock-mux:released:m2",
            ],
        )
        // An uncontended release: GET and DEL, no announcement.
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        // A refused waiter marks a key held with one of our tokens...
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", false, "100")
        .c(0, &["GET", "k"])
        .ttl(0, &["PTTL", "k"])
        // ...once.
        .wait("k", TW1, W1, "60000", false, "100")
        .c(0, &["GET", "k"])
        // The holder still holds it: extend and fencing read the marked value as its.
        .sha(0, scripts::EXTEND, &["k"], &[TH, "90000"])
        .sha(
            0,
            scripts::FENCE_DRAW,
            &["k", &aux(scripts::FENCE, "k")],
            &[TH, "1"],
        )
        .sha(
            0,
            scripts::FENCE_RAISE,
            &["k", &aux(scripts::FENCE, "k")],
            &[TH, "4", "1"],
        )
        .sha(0, scripts::EXTEND, &["k"], &[TW1, "90000"])
        // Its release announces (to W1, first in line).
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        .c(0, &["EXISTS", "k"])
        // Never another application's value; a waiter without a line (poll mode) reads it
        // and marks nothing.
        .c(0, &["SET", "f", "foreign-holder", "PX", "60000"])
        .wait("f", TW2, W2, "60000", false, "200")
        .c(0, &["GET", "f"])
        .c(0, &["SET", "p", TH, "PX", "60000"])
        .sha_ttl(0, scripts::ACQUIRE_WAIT, &["p"], &[TW2, "60000"])
        .c(0, &["GET", "p"])
        // A waiter on several keys marks each of ours it found (it listens on their
        // channels), and the release of one announces it.
        .c(0, &["SET", "m1", TH, "PX", "60000"])
        .c(0, &["SET", "m2", TA, "PX", "60000"])
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["m1", "m2", "m3"],
            &[TW3, "60000"],
        )
        .c(0, &["GET", "m1"])
        .c(0, &["GET", "m2"])
        .c(0, &["EXISTS", "m3"])
        .sha(0, scripts::RELEASE, &["m2"], &[TA])
        // A grant while the line exists sets the key marked; a grant with no line, not.
        .c(0, &["DEL", "k"])
        .wait("k", TW2, W2, "60000", false, "200")
        .c(0, &["GET", "k"])
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["n"],
            &[TW3, "60000", W3, "60000", "", "300"],
        )
        .c(0, &["GET", "n"]);
    v.push(case(
        "waiters_mark_the_key_they_wait_for",
        Kind::Plain,
        2,
        s,
    ));

    s.load_all(0)
        .c(2, &["SUBSCRIBE", RELEASED_K, &next(W1)])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", true, "100")
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        // Free, but W1 is first and alive: the polite W2 is refused and stands behind it.
        .wait("k", TW2, W2, "60000", true, "200")
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .ttl(0, &["PTTL", A])
        // Not polite: takes it anyway.
        .wait("k", TW3, W3, "60000", false, "300")
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .sha(0, scripts::RELEASE, &["k"], &[TW3, W3])
        // W1 is first: takes it; its liveness and the line's TTL are refreshed.
        .wait("k", TW1, W1, "50000", true, "100")
        .c(0, &["GET", "k"])
        .ttl(0, &["PTTL", A])
        .ttl(0, &["PTTL", Q])
        .c(0, &["ZRANGE", Q, "0", "-1"]);
    v.push(case("acquire_wait_polite", Kind::Plain, 3, s));

    s.load_all(0)
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "40", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        .sleep(80)
        .c(0, &["DEL", "k"])
        // The dead W1 is dropped; the live W2 is ahead.
        .wait("k", TW3, W3, "60000", true, "300")
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .c(0, &["ZREM", A, W2])
        .wait("k", TW3, W3, "60000", true, "300")
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1"]);
    v.push(case(
        "acquire_wait_polite_skips_dead_waiters",
        Kind::Plain,
        1,
        s,
    ));

    for (name, dead) in [
        ("acquire_wait_polite_looks_at_eight_waiters", 8),
        ("acquire_wait_polite_sees_the_live_one_after_seven_dead", 7),
    ] {
        s.load_all(0);
        line_of_dead(s, dead);
        s.wait("k", TW3, W3, "60000", true, "300")
            .c(0, &["GET", "k"])
            .c(0, &["ZRANGE", Q, "0", "-1"])
            .cmp(0, &["ZSCORE", A, W3], Cmp::Present);
        v.push(case(name, Kind::Plain, 1, s));
    }

    s.load_all(0)
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "60000", false, "100")
        .c(0, &["DEL", "k"])
        .wait("k", TW1, W1, "90000", false, "100")
        .ttl(0, &["PTTL", A])
        .ttl(0, &["PTTL", Q])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        // Never in line: the grant touches no line.
        .wait("k2", TW2, W2, "60000", true, "200")
        .cmp(0, &["ZSCORE", &aux(scripts::ALIVE, "k2"), W2], Cmp::Present)
        .c(0, &["EXISTS", &aux(scripts::QUEUE, "k2")])
        // The line is not a sorted set: polite or not, the pcalls fail quietly.
        .c(0, &["SET", &aux(scripts::QUEUE, "k3"), "junk"])
        .wait("k3", TW1, W1, "60000", true, "100")
        .wait("k3", TW2, W2, "70000", true, "200")
        .ttl(0, &["PTTL", &aux(scripts::QUEUE, "k3")])
        .c(0, &["GET", &aux(scripts::QUEUE, "k3")])
        .ttl(0, &["PTTL", &aux(scripts::ALIVE, "k3")]);
    v.push(case(
        "acquire_wait_grant_refreshes_the_waiter",
        Kind::Plain,
        1,
        s,
    ));

    // What the client expects (`ARGV[7]`: `h` held, `l` in line) orders the commands only:
    // every branch answers and leaves what the plain attempt would (issue 23).
    let how = |token, id, alive, polite, score, how| {
        let p = if polite { "p" } else { "" };
        [token, "30000", id, alive, p, score, how]
    };
    s.load_all(0)
        .c(
            1,
            &["SUBSCRIBE", RELEASED_K, &next(W1), &next(W2), &next(W3)],
        )
        // Held, as expected: refused, marks our token once, takes its place.
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW1, W1, "60000", false, "100", "h"),
        )
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .ttl(0, &["PTTL", Q])
        .ttl(0, &["PTTL", A])
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW2, W2, "50000", false, "200", "h"),
        )
        .c(0, &["GET", "k"])
        // In line, as expected: refused, keeps its score, liveness refreshed.
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW1, W1, "70000", false, "999", "l"),
        )
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .ttl(0, &["PTTL", Q])
        .ttl(0, &["PTTL", A])
        // In line with its liveness key gone (it expired): PEXPIRE finds nothing, SET makes it.
        .c(0, &["ZREM", A, W2])
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW2, W2, "65000", false, "200", "l"),
        )
        .ttl(0, &["PTTL", A])
        .cmp(0, &["ZSCORE", A, W2], Cmp::Present)
        // "In line" but not (W3 never stood there): it takes its place.
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW3, W3, "60000", false, "300", "l"),
        )
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        // The holder's release names W1; W1, in line, takes the key marked, keeps its place.
        .sha(0, scripts::RELEASE, &["k"], &[TH])
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW1, W1, "80000", false, "100", "l"),
        )
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .ttl(0, &["PTTL", Q])
        .ttl(0, &["PTTL", A])
        // Its release leaves the line and names W2; W1's liveness key is left to expire.
        .sha(0, scripts::RELEASE, &["k"], &[TW1, W1])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .ttl(0, &["PTTL", A])
        // "Held" but free, with a line: W3 takes it marked and keeps its place (not polite).
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW3, W3, "60000", false, "300", "h"),
        )
        .c(0, &["GET", "k"])
        .c(0, &["ZRANGE", Q, "0", "-1", "WITHSCORES"])
        .sha(0, scripts::RELEASE, &["k"], &[TW3, W3])
        // "Held" but free and no line: granted unmarked, no line made.
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["n"],
            &how(TW1, W1, "60000", false, "100", "h"),
        )
        .c(0, &["GET", "n"])
        .c(0, &["EXISTS", &aux(scripts::QUEUE, "n")])
        // "In line" but free and no line: the same.
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["n2"],
            &how(TW1, W1, "60000", false, "100", "l"),
        )
        .c(0, &["GET", "n2"])
        .c(0, &["EXISTS", &aux(scripts::QUEUE, "n2")])
        // Held by another application: refused, never marked; a key of another type: the
        // holder unnamed.
        .c(0, &["SET", "f", "foreign-holder", "PX", "60000"])
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["f"],
            &how(TW2, W2, "60000", false, "200", "h"),
        )
        .c(0, &["GET", "f"])
        .c(0, &["ZADD", "z", "1", "a"])
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["z"],
            &how(TW2, W2, "60000", false, "200", "h"),
        )
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["z"],
            &how(TW2, W2, "60000", false, "200", "l"),
        )
        .c(0, &["ZRANGE", &aux(scripts::QUEUE, "z"), "0", "-1"])
        // A polite waiter expecting a held key looks at the line first, as without: W2 is
        // behind the live W3 on the free key, refused and W3 told.
        .c(0, &["DEL", "k"])
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW2, W2, "60000", true, "200", "h"),
        )
        .c(0, &["GET", "k"])
        // Refused with the PTTL of the key W2 just took: a TTL (the real clock moves on).
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k"],
            &how(TW2, W2, "60000", true, "200", "l"),
        )
        .c(0, &["EXISTS", "k"])
        // The line is not a sorted set: "in line" falls back to EXISTS, the pcalls fail.
        .c(0, &["SET", &aux(scripts::QUEUE, "k3"), "junk"])
        .sha(
            0,
            scripts::ACQUIRE_WAIT,
            &["k3"],
            &how(TW1, W1, "60000", false, "100", "l"),
        )
        .c(0, &["GET", "k3"])
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k3"],
            &how(TW2, W2, "60000", false, "200", "h"),
        )
        .c(0, &["GET", &aux(scripts::QUEUE, "k3")])
        // Arguments the client never sends: with the key held, "held" does not look at the
        // PX (SET would refuse it); free, SET does.
        .sha_ttl(
            0,
            scripts::ACQUIRE_WAIT,
            &["k3"],
            &how(TW3, W3, "60000", false, "300", "h"),
        )
        .script(
            0,
            true,
            scripts::ACQUIRE_WAIT,
            &["k3"],
            &[TW3, "0", W3, "60000", "", "300", "h"],
            Cmp::Ttl,
        )
        .script(
            0,
            true,
            scripts::ACQUIRE_WAIT,
            &["k4"],
            &[TW3, "0", W3, "60000", "", "300", "h"],
            Cmp::Exact,
        )
        .script(
            0,
            true,
            scripts::ACQUIRE_WAIT,
            &["k4"],
            &[TW3, "0", W3, "60000", "", "300", "l"],
            Cmp::Exact,
        );
    v.push(case(
        "acquire_wait_expects_held_or_in_line",
        Kind::Plain,
        2,
        s,
    ));

    s.load_all(0)
        .sha(0, scripts::ACQUIRE_WAIT, &["a", "b"], &[TA, "60000"])
        .c(0, &["GET", "b"])
        .ttl(0, &["PTTL", "a"])
        .sha_ttl(0, scripts::ACQUIRE_WAIT, &["c", "b"], &[TB, "60000"])
        .c(0, &["EXISTS", "c"])
        .c(0, &["SET", "d", "x"])
        .sha(0, scripts::ACQUIRE_WAIT, &["c", "d", "a"], &[TB, "60000"])
        .sha(0, scripts::ACQUIRE_WAIT, &["a", "d", "c"], &[TB, "60000"])
        .sha(0, scripts::ACQUIRE_WAIT, &["c", "e"], &[TB, "60000"])
        .c(0, &["GET", "e"])
        .sha(0, scripts::ACQUIRE_WAIT, &[], &[TB, "60000"])
        .sha(0, scripts::ACQUIRE_WAIT, &["f", "g"], &[TB, "0"])
        .sha(0, scripts::ACQUIRE_WAIT, &["f", "g"], &[TB])
        .c(0, &["ZADD", "z", "1", "a"])
        .sha(0, scripts::ACQUIRE_WAIT, &["f", "z"], &[TB, "100"])
        .c(0, &["EXISTS", "f"]);
    v.push(case("acquire_wait_many_keys", Kind::Plain, 1, s));

    // ---- FENCE_DRAW / FENCE_RAISE ---------------------------------------------------------
    s.load_all(0)
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .c(0, &["SET", "k2", TA, "PX", "60000"])
        .sha(0, scripts::FENCE_DRAW, &["k", "c"], &[TB])
        .sha(0, scripts::FENCE_DRAW, &["k", "c"], &[TA])
        .sha(0, scripts::FENCE_RAISE, &["k", "c"], &[TA, "5"])
        .c(0, &["GET", "c"])
        .c(0, &["PTTL", "c"])
        .sha(0, scripts::FENCE_DRAW, &["k", "c"], &[TA])
        .sha(0, scripts::FENCE_RAISE, &["k", "c"], &[TA, "3"])
        .c(0, &["GET", "c"])
        // Equal is not below: "5.0" is not written over "5".
        .sha(0, scripts::FENCE_RAISE, &["k", "c"], &[TA, "5.0"])
        .c(0, &["GET", "c"])
        .sha(0, scripts::FENCE_RAISE, &["k", "c"], &[TB, "99"])
        .c(0, &["GET", "c"])
        .c(0, &["SET", "c2", "9"])
        .sha(0, scripts::FENCE_DRAW, &["k", "k2", "c", "c2"], &[TA])
        .sha(
            0,
            scripts::FENCE_RAISE,
            &["k", "k2", "c", "c2"],
            &[TA, "12"],
        )
        .c(0, &["GET", "c"])
        .c(0, &["GET", "c2"])
        .sha(0, scripts::FENCE_DRAW, &["k", "nokey", "c", "c2"], &[TA])
        .sha(0, scripts::FENCE_DRAW, &[], &[TA])
        .sha(0, scripts::FENCE_RAISE, &[], &[TA, "1"])
        .sha(0, scripts::FENCE_DRAW, &["k"], &[TA])
        .sha(0, scripts::FENCE_DRAW, &["k", "c", "c2"], &[TA])
        .sha(0, scripts::FENCE_RAISE, &["k", "c", "c2"], &[TA, "50"])
        .c(0, &["SET", "c1", "abc"])
        .sha(0, scripts::FENCE_DRAW, &["k", "c1"], &[TA])
        .sha(0, scripts::FENCE_RAISE, &["k", "c1"], &[TA, "5"])
        .sha(0, scripts::FENCE_RAISE, &["k", "c3"], &[TA, "x"])
        .sha(0, scripts::FENCE_RAISE, &["k", "c1"], &[TA, "x"])
        .sha(0, scripts::FENCE_RAISE, &["k", "c3"], &[TA])
        .c(0, &["SET", "c4", "2.5"])
        .sha(0, scripts::FENCE_DRAW, &["k", "c4"], &[TA])
        .c(0, &["SET", "c5", " 0x10 "])
        .sha(0, scripts::FENCE_DRAW, &["k", "c5"], &[TA])
        .sha(0, scripts::FENCE_RAISE, &["k", "c5"], &[TA, "20"])
        .c(0, &["GET", "c5"])
        .c(0, &["ZADD", "zc", "1", "a"])
        .sha(0, scripts::FENCE_DRAW, &["k", "zc"], &[TA])
        .sha(0, scripts::FENCE_RAISE, &["zc", "c"], &[TA, "1"]);
    v.push(case("fence_draw_and_raise", Kind::Plain, 1, s));

    // The counters of the layout before (`redlock-mux:fence:<r>`, declared after the new
    // ones on standalone masters): read by the draw, carried into the new counter and
    // deleted by the write-back.
    let (new_k, old_k) = (aux(scripts::FENCE, "k"), "redlock-mux:fence:k".to_string());
    let (new_k2, old_k2) = (
        aux(scripts::FENCE, "k2"),
        "redlock-mux:fence:k2".to_string(),
    );
    let fence4 = ["k", new_k.as_str(), old_k.as_str()];
    let fence6 = [
        "k",
        "k2",
        new_k.as_str(),
        new_k2.as_str(),
        old_k.as_str(),
        old_k2.as_str(),
    ];
    s.load_all(0)
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .c(0, &["SET", "k2", TA, "PX", "60000"])
        // Only the old counter: the draw is above it; the raise moves it to the new name.
        .c(0, &["SET", &old_k, "7"])
        .sha(0, scripts::FENCE_DRAW, &fence4, &[TA, "1"])
        .sha(0, scripts::FENCE_DRAW, &fence4, &[TB, "1"])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TB, "8", "1"])
        .c(0, &["EXISTS", &old_k])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TA, "8", "1"])
        .c(0, &["GET", &new_k])
        .c(0, &["EXISTS", &old_k])
        // Both, the old one above the token written back (a master outside the draw's
        // quorum): the new counter takes the old one's value, as it was written.
        .c(0, &["SET", &old_k, "0020"])
        .sha(0, scripts::FENCE_DRAW, &fence4, &[TA, "1"])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TA, "9", "1"])
        .c(0, &["GET", &new_k])
        .c(0, &["EXISTS", &old_k])
        // The old one below the new one: deleted, the new one kept.
        .c(0, &["SET", &old_k, "3"])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TA, "5", "1"])
        .c(0, &["GET", &new_k])
        .c(0, &["EXISTS", &old_k])
        // Two resources, each with its own old counter.
        .c(0, &["SET", &old_k2, "40"])
        .sha(0, scripts::FENCE_DRAW, &fence6, &[TA, "2"])
        .sha(0, scripts::FENCE_RAISE, &fence6, &[TA, "41", "2"])
        .c(0, &["MGET", &new_k, &new_k2, &old_k, &old_k2])
        // An old counter that is not a number: the comparison raises.
        .c(0, &["SET", &old_k, "abc"])
        .sha(0, scripts::FENCE_DRAW, &fence4, &[TA, "1"])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TA, "50", "1"])
        // ...or of another type.
        .c(0, &["DEL", &old_k])
        .c(0, &["ZADD", &old_k, "1", "a"])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TA, "50", "1"])
        // A count that is no number; a count above the keys.
        .sha(0, scripts::FENCE_DRAW, &fence4, &[TA, "x"])
        .sha(0, scripts::FENCE_RAISE, &fence4, &[TA, "50", "3"]);
    v.push(case(
        "fence_reads_and_retires_the_old_counters",
        Kind::Plain,
        1,
        s,
    ));

    // ---- the wire ----------------------------------------------------------------------------
    s.raw(0, b"*abc\r\n", true)
        .raw(1, b"*2\r\n:1\r\n", true)
        .raw(2, b"*1\r\n$abc\r\n", true)
        .raw(3, b"*1\r\n$-1\r\n", true)
        .raw(4, b"*0\r\n*-1\r\n*-5\r\n*1\r\n$4\r\nPING\r\n", true)
        .raw(5, b"PING\r\n\r\n  \r\nGET  k\r\n", true)
        .raw(6, b"*1\r\n$0\r\n\r\n", true)
        .raw(7, b"*2\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n", true)
        .raw(8, b"*3\r\n$3\r\nSET\r\n$1\r\nk", false)
        .raw(8, b"\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\n", false)
        .raw(8, b"k\r\n*1\r\n$4\r\nPING\r\n", true)
        .raw(9, b"*1\r\n$4\r\nQUIT\r\n*1\r\n$4\r\nPING\r\n", true)
        .raw(10, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$-2\r\n", true)
        .raw(11, b"*-2\r\n*1\r\n$4\r\nPING\r\n", true);
    v.push(case("protocol_and_pipelining", Kind::Plain, 12, s));

    // ---- restarts ----------------------------------------------------------------------------
    s.load_all(0)
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .c(0, &["SET", "c", "5"])
        .c(1, &["SUBSCRIBE", RELEASED_K])
        .cmp(0, &["INFO", "server"], Cmp::Info)
        .restart()
        .c(0, &["GET", "k"])
        .c(0, &["GET", "c"])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .cmp(0, &["INFO", "server"], Cmp::Info)
        .c(0, &["PUBLISH", RELEASED_K, "x"]);
    v.push(case("restart_forgets_everything", Kind::Plain, 2, s));

    s.load_all(0)
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .sha(0, scripts::FENCE_RAISE, &["k", "c"], &[TA, "5"])
        .cmp(0, &["INFO", "server"], Cmp::Info)
        .restart()
        .c(0, &["GET", "k"])
        .ttl(0, &["PTTL", "k"])
        .c(0, &["GET", "c"])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .c(0, &["SCRIPT", "LOAD", scripts::RELEASE.src])
        .sha(0, scripts::RELEASE, &["k"], &[TA])
        .cmp(0, &["INFO", "server"], Cmp::Info);
    v.push(case(
        "restart_with_persistence_keeps_keys",
        Kind::Durable,
        1,
        s,
    ));

    // ---- INSPECT (operators, read-only) -----------------------------------------------------
    // `k` alone: `declared` adds its line, liveness set, counter and old counter.
    let (fence_k, new_fence_k) = ("redlock-mux:fence:k", aux(scripts::FENCE, "k"));
    let inspect_keys = ["k"];
    let marked = format!("{TH}+");
    let upper = TA.to_ascii_uppercase();
    let long = format!("{TA}x");
    let upper_marked = format!("{upper}+");
    s.load_all(0)
        // Not loaded by the handshake: EVALSHA is refused until an EVAL cached it.
        .sha(0, scripts::INSPECT, &inspect_keys, &["4"])
        .script(
            0,
            false,
            scripts::INSPECT,
            &inspect_keys,
            &["4"],
            Cmp::Exact,
        )
        .sha(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", TA])
        .sha(0, scripts::INSPECT, &inspect_keys, &["4"])
        // The old counter while there is no new one; then the new one.
        .c(0, &["SET", fence_k, "41"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", &new_fence_k, "45"])
        .c(0, &["SET", "k", TH, "PX", "60000"])
        // Two waiters in line (the first one's liveness runs out), the holder marked.
        .wait("k", TW1, W1, "40", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        .wait("k", TW3, W3, "60000", false, "300")
        .sleep(80)
        .c(0, &["GET", "k"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["2"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["0"])
        // Values that are not this crate's tokens: short, upper case, one byte too long,
        // a mark without a token.
        .c(0, &["SET", "k", "short", "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", &upper, "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", &long, "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", "short+", "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", &upper_marked, "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        .c(0, &["SET", "k", &marked, "PX", "60000"])
        .sha_ttl(0, scripts::INSPECT, &inspect_keys, &["4"])
        // Keys of other types under the three names.
        .c(0, &["DEL", "k", Q])
        .c(0, &["ZADD", "k", "1", "a"])
        .c(0, &["SET", Q, "junk"])
        .c(0, &["ZADD", fence_k, "1", "a"])
        .c(0, &["ZADD", &new_fence_k, "1", "a"])
        .c(0, &["SET", A, "junk"])
        .sha(0, scripts::INSPECT, &inspect_keys, &["4"])
        // No keys at all: the last redis.call gets a nil argument and raises.
        .sha(0, scripts::INSPECT, &[], &["4"])
        // Without the liveness set and counters (nil keys), and a line of waiters.
        .c(0, &["DEL", Q])
        .c(0, &["ZADD", Q, "1", W1])
        .sha(0, scripts::INSPECT, &["k", Q], &["4"]);
    v.push(case(
        "inspect_reads_key_line_and_counter",
        Kind::Plain,
        1,
        s,
    ));

    // ---- FORCE_RELEASE (operators) -----------------------------------------------------------
    // `k` alone: `declared` adds its line and liveness set.
    let force_keys = ["k"];
    s.load_all(0)
        .c(1, &["SUBSCRIBE", RELEASED_K, &next(W1), &next(W2)])
        .sha(0, scripts::FORCE_RELEASE, &force_keys, &[])
        .script(
            0,
            false,
            scripts::FORCE_RELEASE,
            &force_keys,
            &[],
            Cmp::Exact,
        )
        // Someone else's lock, nobody in line: deleted, announced on the key's channel.
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .sha_ttl(0, scripts::FORCE_RELEASE, &force_keys, &[])
        .c(0, &["EXISTS", "k"])
        // A key with no expiry goes too.
        .c(0, &["SET", "k", TA])
        .sha(0, scripts::FORCE_RELEASE, &force_keys, &[])
        // A contended lock: the first live waiter's client hears whose turn it is.
        .c(0, &["SET", "k", TH, "PX", "60000"])
        .wait("k", TW1, W1, "40", false, "100")
        .wait("k", TW2, W2, "60000", false, "200")
        .sleep(80)
        .sha_ttl(0, scripts::FORCE_RELEASE, &force_keys, &[])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        .c(0, &["EXISTS", "k"])
        // A short value: no waiter can be named with it, the key's channel hears it.
        .c(0, &["SET", "k", "short", "PX", "60000"])
        .sha_ttl(0, scripts::FORCE_RELEASE, &force_keys, &[])
        .c(0, &["ZRANGE", Q, "0", "-1"])
        // The line is not a sorted set: the pcalls fail quietly.
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .c(0, &["SET", Q, "junk"])
        .sha_ttl(0, scripts::FORCE_RELEASE, &force_keys, &[])
        // A key of another type: an error, nothing deleted.
        .c(0, &["ZADD", "k", "1", "a"])
        .sha(0, scripts::FORCE_RELEASE, &force_keys, &[])
        .c(0, &["EXISTS", "k"])
        .sha(0, scripts::FORCE_RELEASE, &[], &[])
        .sha(0, scripts::FORCE_RELEASE, &["nokey"], &[])
        // Without its liveness set (a nil key): the pcalls fail quietly, nobody is named.
        .c(0, &["SET", "k", TA, "PX", "60000"])
        .c(0, &["DEL", Q])
        .c(0, &["ZADD", Q, "1", W1])
        .sha_ttl(0, scripts::FORCE_RELEASE, &["k", Q], &[]);
    v.push(case("force_release_deletes_and_wakes", Kind::Plain, 2, s));
    s.load_all(0)
        .c(
            1,
            &[
                "SUBSCRIBE",
                RELEASED_K,
                "redlock-mux:next:liveclnt",
                "redlock-mux:next:deadcli1",
            ],
        )
        .c(0, &["SET", "k", TH, "PX", "60000"]);
    line_of_dead(s, 3);
    s.script(0, false, scripts::FORCE_RELEASE, &force_keys, &[], Cmp::Ttl)
        .c(0, &["ZRANGE", Q, "0", "-1"]);
    v.push(case("force_release_skips_dead_waiters", Kind::Plain, 2, s));

    v
}

// ----- running a case ----------------------------------------------------------------------------

/// The simulated clock at the start of a case.
const T0: u64 = 1_000_000;
/// How long the real server may take to send one frame before the case fails.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const NONCE: &[u8] = b"sim-table-sentinel";

#[derive(Default)]
struct Servers {
    plain: Option<LocalMaster>,
    auth: Option<LocalMaster>,
    durable: Option<LocalMaster>,
}

impl Servers {
    fn get(&mut self, kind: Kind) -> &mut LocalMaster {
        let slot = match kind {
            Kind::Plain => &mut self.plain,
            Kind::Auth => &mut self.auth,
            Kind::Durable => &mut self.durable,
        };
        slot.get_or_insert_with(|| {
            let args: &[&str] = match kind {
                Kind::Plain => &[],
                Kind::Auth => &["--requirepass", "s3cret"],
                Kind::Durable => &["--appendonly", "yes", "--appendfsync", "always"],
            };
            let m = LocalMaster::start_with(args)
                .unwrap_or_else(|e| panic!("cannot start a local redis-server: {e}"));
            if kind == Kind::Auth {
                let acl: &[&[u8]] = &[
                    b"ACL", b"SETUSER", b"alice", b"on", b">pw", b"~*", b"&*", b"+@all",
                ];
                assert!(m.cmd(acl).expect("ACL SETUSER").is_ok());
            }
            m
        })
    }
}

fn sim_config(kind: Kind, port: u16) -> server::Config {
    let mut cfg = server::Config {
        tcp_port: port,
        ..server::Config::default()
    };
    match kind {
        Kind::Plain => {}
        Kind::Auth => {
            cfg.requirepass = Some(b"s3cret".to_vec());
            cfg.users = vec![(b"alice".to_vec(), b"pw".to_vec())];
        }
        Kind::Durable => {
            cfg.appendonly = true;
            cfg.appendfsync = "always".into();
        }
    }
    cfg
}

/// Empties the real server and waits until no connection of an earlier case is left (a
/// closed subscriber would still count in `PUBLISH` answers).
fn reset(master: &LocalMaster) -> Result<(), String> {
    for cmd in [&[&b"FLUSHALL"[..]][..], &[b"SCRIPT", b"FLUSH"]] {
        match master.cmd(cmd) {
            Ok(r) if r.is_ok() => {}
            other => return Err(format!("reset {cmd:?}: {other:?}")),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..10_000 {
        let info = master
            .cmd(&[b"INFO", b"clients"])
            .map_err(|e| e.to_string())?;
        let AdminReply::Bulk(Some(text)) = info else {
            return Err(format!("INFO clients: {info:?}"));
        };
        // The admin connection itself is the one client.
        if String::from_utf8_lossy(&text).contains("connected_clients:1\r\n") {
            return Ok(());
        }
        if Instant::now() > deadline {
            break;
        }
        thread::sleep(Duration::from_millis(2));
    }
    Err("the connections of the previous case are still open after 10 s".into())
}

enum End {
    Eof,
    Timeout,
    Bad(String),
}

struct RealConn {
    stream: TcpStream,
    buf: Vec<u8>,
    open: bool,
}

impl RealConn {
    fn connect(master: &LocalMaster) -> RealConn {
        let stream = TcpStream::connect(master.addr()).expect("connect to the real server");
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        RealConn {
            stream,
            buf: Vec::new(),
            open: true,
        }
    }

    fn read_frame(&mut self) -> Result<Val, End> {
        let deadline = Instant::now() + READ_TIMEOUT;
        for _ in 0..100_000 {
            if !self.buf.is_empty() {
                match resp::parse(&self.buf, &Limits::default()) {
                    Ok(Status::Complete((f, n))) => {
                        let v = val(&f);
                        self.buf.drain(..n);
                        return Ok(v);
                    }
                    Ok(Status::Partial(_)) => {}
                    Err(e) => return Err(End::Bad(format!("{e}: {}", esc(&self.buf)))),
                }
            }
            if Instant::now() > deadline {
                return Err(End::Timeout);
            }
            let mut tmp = [0u8; 16 * 1024];
            match self.stream.read(&mut tmp) {
                Ok(0) => return Err(End::Eof),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(End::Timeout)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Err(End::Eof),
                Err(e) => return Err(End::Bad(e.to_string())),
            }
        }
        Err(End::Timeout)
    }
}

/// The ids of `run_id`s in order of appearance within a case, per side.
#[derive(Default)]
struct RunIds(Vec<Vec<u8>>);

impl RunIds {
    fn label(&mut self, id: &[u8]) -> usize {
        match self.0.iter().position(|x| x == id) {
            Some(i) => i,
            None => {
                self.0.push(id.to_vec());
                self.0.len() - 1
            }
        }
    }
}

struct Ctx {
    slack_ms: i64,
    real_ids: RunIds,
    sim_ids: RunIds,
    /// The real server is the one the simulation models (Redis 7.0.x).
    modelled: bool,
}

/// `true` when `INFO server` reports `valkey_version` 9 or later: the model then answers as
/// Valkey 9 where it can (`server::Config::valkey`).
fn offers_delifeq(master: &LocalMaster) -> bool {
    let info = master.cmd(&[b"INFO", b"server"]).expect("INFO server");
    let info = info.as_str().unwrap_or("");
    info.lines()
        .find_map(|l| l.strip_prefix("valkey_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 9)
}

/// `true` when `INFO server` is Redis 7.0's, the server the simulation models.
fn is_modelled_server(master: &LocalMaster) -> bool {
    let info = master.cmd(&[b"INFO", b"server"]).expect("INFO server");
    let info = info.as_str().unwrap_or("");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    field("redis_version").is_some_and(|v| v.starts_with("7.0."))
        && field("server_name").is_none_or(|n| n == "redis")
}

/// For another server than the modelled one: errors by their code only.
fn error_codes(v: &Val) -> Val {
    match v {
        Val::Error(e) => Val::Error(e.split(|&b| b == b' ').next().unwrap_or(e).to_vec()),
        Val::Array(a) => Val::Array(a.iter().map(error_codes).collect()),
        Val::Map(a) => Val::Map(a.iter().map(error_codes).collect()),
        Val::Push(a) => Val::Push(a.iter().map(error_codes).collect()),
        v => v.clone(),
    }
}

fn compare(cmp: Cmp, real: &Val, sim: &Val, cx: &mut Ctx) -> Result<(), String> {
    if !cx.modelled {
        if let (Val::Error(_), Val::Error(e)) = (real, sim) {
            if e.starts_with(b"ERR wrong number of arguments")
                || e.starts_with(b"ERR unknown command")
            {
                // A command the client never sends: servers check it and the connection's
                // authentication in either order.
                return Ok(());
            }
        }
        if cmp != Cmp::Info {
            let (r, s) = (error_codes(real), error_codes(sim));
            if (&r, &s) != (real, sim) {
                return compare(cmp, &r, &s, cx);
            }
        }
    }
    let fail = |why: &str| Err(format!("{why}\n      real: {real:?}\n      sim:  {sim:?}"));
    match cmp {
        Cmp::ModelOnly if !cx.modelled => {}
        Cmp::Exact | Cmp::ModelOnly => {
            if real != sim {
                return fail("differ");
            }
        }
        Cmp::Ttl => {
            if !ttl_eq(real, sim, cx.slack_ms) {
                return fail(&format!("differ (TTLs within -{} .. +1 ms)", cx.slack_ms));
            }
        }
        Cmp::Present => {
            let present = |v: &Val| match v {
                Val::Bulk(_) => Some(true),
                Val::Null => Some(false),
                _ => None,
            };
            if present(real).is_none() || present(real) != present(sim) {
                return fail("differ (present or not)");
            }
        }
        Cmp::Sorted => {
            let (Val::Array(r), Val::Array(s)) = (real, sim) else {
                return fail("not arrays");
            };
            let key = |v: &Val| format!("{v:?}");
            let mut r = r.clone();
            let mut s = s.clone();
            r.sort_by_key(key);
            s.sort_by_key(key);
            if r != s {
                return fail("differ (sorted)");
            }
        }
        Cmp::Config => {
            let (Val::Array(r), Val::Array(s)) = (real, sim) else {
                return fail("not arrays");
            };
            let pairs = |a: &[Val]| {
                let mut p: Vec<String> = a.chunks(2).map(|c| format!("{c:?}")).collect();
                p.sort();
                p
            };
            if r.len() % 2 != 0 || pairs(r) != pairs(s) {
                return fail("differ (as a set of pairs)");
            }
        }
        Cmp::Hello => {
            let (Val::Map(r) | Val::Array(r), Val::Map(s) | Val::Array(s)) = (real, sim) else {
                return fail("not maps");
            };
            let same_kind = matches!(
                (real, sim),
                (Val::Map(_), Val::Map(_)) | (Val::Array(_), Val::Array(_))
            );
            let id = Val::Bulk(b"id".to_vec());
            let server_own = |k: &Val| {
                !cx.modelled
                    && [&b"server"[..], b"version", b"modules"]
                        .iter()
                        .any(|n| *k == Val::Bulk(n.to_vec()))
            };
            let ok = same_kind
                && r.len() == s.len()
                && r.chunks(2).zip(s.chunks(2)).all(|(r, s)| match (r, s) {
                    ([k, Val::Int(_)], [l, Val::Int(_)]) if *k == id && *l == id => true,
                    ([k, _], [l, _]) if k == l && server_own(k) => true,
                    _ => r == s,
                });
            if !ok {
                return fail("differ (but the connection id)");
            }
        }
        Cmp::Info => {
            let (Val::Bulk(r), Val::Bulk(s)) = (real, sim) else {
                return fail("not bulk strings");
            };
            if let Err(why) = info_eq(r, s, cx) {
                return fail(&why);
            }
        }
    }
    Ok(())
}

/// Equal, except integers the simulation answers above 1 (TTLs): the real one may be
/// lower by the slack or higher by 1 ms.
fn ttl_eq(real: &Val, sim: &Val, slack: i64) -> bool {
    match (real, sim) {
        (Val::Int(r), Val::Int(s)) if *s > 1 => *r >= s - slack && *r <= s + 1,
        (Val::Array(r), Val::Array(s)) => {
            r.len() == s.len() && r.iter().zip(s).all(|(r, s)| ttl_eq(r, s, slack))
        }
        (r, s) => r == s,
    }
}

fn info_eq(real: &[u8], sim: &[u8], cx: &mut Ctx) -> Result<(), String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (real, sim) = (text(real), text(sim));
    for t in [&real, &sim] {
        if !t.starts_with("# Server\r\n") || !t.ends_with("\r\n") {
            return Err("not an INFO server section".into());
        }
    }
    let fields = |t: &str| -> Vec<(String, String)> {
        t.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let real = fields(&real);
    let mut at = 0;
    for (name, value) in fields(&sim) {
        if !cx.modelled && name != "run_id" && name != "uptime_in_seconds" {
            continue; // another server's INFO: only what the client reads
        }
        let Some(pos) = real[at..].iter().position(|(k, _)| *k == name) else {
            return Err(format!(
                "field {name} missing in the real reply, or out of order"
            ));
        };
        let real_value = &real[at + pos].1;
        at += pos + 1;
        let digits = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
        let hex40 = |v: &str| {
            v.len() == 40
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let ok = match name.as_str() {
            "redis_version" => real_value.starts_with("7.0.") && value == server::REDIS_VERSION,
            "run_id" => {
                hex40(real_value)
                    && hex40(&value)
                    && cx.real_ids.label(real_value.as_bytes())
                        == cx.sim_ids.label(value.as_bytes())
            }
            "process_id" | "tcp_port" | "server_time_usec" | "uptime_in_seconds"
            | "uptime_in_days" => digits(real_value) && digits(&value),
            _ => *real_value == value,
        };
        if !ok {
            return Err(format!("field {name}: real {real_value:?}, sim {value:?}"));
        }
    }
    Ok(())
}

/// Runs one case; returns how many frames were compared.
fn run_case(case: &Case, servers: &mut Servers) -> Result<usize, String> {
    let kind = case.kind;
    let master = servers.get(kind);
    reset(master)?;
    let mut now = T0;
    let mut scfg = sim_config(kind, master.port());
    scfg.valkey = offers_delifeq(master);
    let mut sim = SimRedis::new(scfg, now);
    let mut sim_conns: Vec<ConnId> = (0..case.conns).map(|_| sim.open()).collect();
    let mut real: Vec<RealConn> = (0..case.conns).map(|_| RealConn::connect(master)).collect();
    let start = Instant::now();
    let mut cx = Ctx {
        slack_ms: 0,
        real_ids: RunIds::default(),
        sim_ids: RunIds::default(),
        modelled: is_modelled_server(master),
    };
    let mut compared = 0;
    for (n, step) in case.steps.iter().enumerate() {
        let (conn, bytes, cmp, whole, what) = match step {
            Step::Sleep(ms) => {
                now += ms;
                thread::sleep(Duration::from_millis(*ms));
                continue;
            }
            Step::Restart => {
                let old = sim_conns.clone();
                sim.restart(kind == Kind::Durable, now);
                for (i, c) in old.iter().enumerate() {
                    if sim.is_open(*c) {
                        return Err(format!(
                            "step {n}: connection {i} still open after the restart"
                        ));
                    }
                    sim.take_output(*c);
                }
                sim_conns = (0..case.conns).map(|_| sim.open()).collect();
                let master = servers.get(kind);
                master.restart().map_err(|e| format!("restart: {e}"))?;
                real = (0..case.conns).map(|_| RealConn::connect(master)).collect();
                continue;
            }
            Step::Send {
                conn,
                bytes,
                cmp,
                whole,
                what,
            } => (*conn, bytes, *cmp, *whole, what),
        };
        let at = format!("step {n} (conn {conn}: {what})");
        assert!(
            sim.is_open(sim_conns[conn]),
            "{at}: the case sends on a closed connection"
        );
        sim.feed(sim_conns[conn], bytes, now);
        real[conn]
            .stream
            .write_all(bytes)
            .map_err(|e| format!("{at}: write: {e}"))?;
        for i in 0..case.conns {
            if !real[i].open {
                continue;
            }
            let want = frames(&sim.take_output(sim_conns[i]));
            let sim_closed = !sim.is_open(sim_conns[i]);
            for (k, w) in want.iter().enumerate() {
                let got = match real[i].read_frame() {
                    Ok(v) => v,
                    Err(End::Eof) => return Err(format!("{at}: conn {i}: the real server closed before frame {k}; sim: {w:?}")),
                    Err(End::Timeout) => return Err(format!("{at}: conn {i}: no frame {k} from the real server in {READ_TIMEOUT:?}; sim: {w:?}")),
                    Err(End::Bad(e)) => return Err(format!("{at}: conn {i}: {e}")),
                };
                // Replies to the sender are compared as the step says; messages pushed to
                // other connections exactly.
                let cmp = if i == conn { cmp } else { Cmp::Exact };
                // The real server ran the command before its answer arrived: its clock
                // has moved on by at most the wall time since the case started.
                cx.slack_ms = start.elapsed().as_millis() as i64 + 2;
                compare(cmp, &got, w, &mut cx)
                    .map_err(|e| format!("{at}: conn {i} frame {k}: {e}"))?;
                compared += 1;
            }
            if sim_closed {
                real[i].open = false;
                match real[i].read_frame() {
                    Err(End::Eof) => {}
                    Ok(v) => {
                        return Err(format!(
                            "{at}: conn {i}: the sim closed it, the real server sent {v:?}"
                        ))
                    }
                    Err(_) => {
                        return Err(format!(
                            "{at}: conn {i}: the sim closed it, the real server did not"
                        ))
                    }
                }
                continue;
            }
            if i == conn && !whole {
                continue;
            }
            // Nothing more came: the next frame is the sentinel's answer.
            let ping = encode(&[b"PING", NONCE]);
            real[i]
                .stream
                .write_all(&ping)
                .map_err(|e| format!("{at}: conn {i}: sentinel write: {e}"))?;
            let sentinel = real[i].read_frame();
            let pong = Val::Array(vec![Val::Bulk(b"pong".to_vec()), Val::Bulk(NONCE.to_vec())]);
            match sentinel {
                Ok(Val::Bulk(b)) if b == NONCE => {}
                Ok(ref v) if *v == pong => {}
                Ok(Val::Error(e)) if e == b"NOAUTH Authentication required." => {}
                Ok(v) => {
                    return Err(format!(
                        "{at}: conn {i}: the real server sent more than the sim: {v:?}"
                    ))
                }
                Err(End::Eof) => {
                    return Err(format!(
                        "{at}: conn {i}: the real server closed it, the sim did not"
                    ))
                }
                Err(_) => return Err(format!("{at}: conn {i}: no answer to the sentinel PING")),
            }
        }
    }
    Ok(compared)
}

#[test]
fn the_simulated_server_answers_as_redis_server() {
    let only = std::env::var("SIM_TABLE_CASE").ok();
    let mut servers = Servers::default();
    let mut failures = Vec::new();
    let (mut ran, mut steps, mut compared) = (0, 0, 0);
    for case in cases() {
        if only.as_deref().is_some_and(|o| o != case.name) {
            continue;
        }
        ran += 1;
        steps += case.steps.len();
        match run_case(&case, &mut servers) {
            Ok(n) => compared += n,
            Err(e) => failures.push(format!("case {}: {e}", case.name)),
        }
    }
    assert!(ran > 0, "no case named {only:?}");
    eprintln!("{ran} cases, {steps} steps, {compared} frames compared");
    assert!(
        failures.is_empty(),
        "{} of {ran} cases differ from redis-server:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ----- the simulated server alone: what a real server cannot be made to show -------------------

fn sim(now: u64) -> SimRedis {
    SimRedis::new(server::Config::default(), now)
}

/// The bytes of a client's handshake and a lock cycle with a line, as one pipeline.
fn pipeline() -> Vec<u8> {
    let mut out = Vec::new();
    for s in scripts::ALL {
        out.extend(encode(&[b"SCRIPT", b"LOAD", s.src.as_bytes()]));
    }
    out.extend(encode(&[b"INFO", b"server"]));
    out.extend(encode(&[b"CONFIG", b"GET", b"append*"]));
    out.extend(encode(&[
        b"SET",
        b"k",
        TH.as_bytes(),
        b"NX",
        b"PX",
        b"30000",
    ]));
    let aw = scripts::ACQUIRE_WAIT.sha.as_bytes();
    out.extend(encode(&[
        b"EVALSHA",
        aw,
        b"3",
        b"k",
        Q.as_bytes(),
        A.as_bytes(),
        TW1.as_bytes(),
        b"30000",
        W1.as_bytes(),
        b"60000",
        b"p",
        b"100",
    ]));
    out.extend(encode(&[
        b"EVALSHA",
        scripts::RELEASE.sha.as_bytes(),
        b"3",
        b"k",
        Q.as_bytes(),
        A.as_bytes(),
        TH.as_bytes(),
    ]));
    out.extend(encode(&[
        b"EVALSHA",
        aw,
        b"3",
        b"k",
        Q.as_bytes(),
        A.as_bytes(),
        TW1.as_bytes(),
        b"30000",
        W1.as_bytes(),
        b"60000",
        b"p",
        b"100",
    ]));
    out.extend(encode(&[
        b"EVALSHA",
        scripts::RELEASE.sha.as_bytes(),
        b"3",
        b"k",
        Q.as_bytes(),
        A.as_bytes(),
        TW1.as_bytes(),
        W1.as_bytes(),
    ]));
    out.extend(b"PING\r\n");
    out
}

#[test]
fn the_simulated_server_answers_the_same_however_the_bytes_are_split() {
    let bytes = pipeline();
    let whole = {
        let mut s = sim(T0);
        let c = s.open();
        assert!(s.feed(c, &bytes, T0));
        s.take_output(c)
    };
    let replies = frames(&whole);
    assert_eq!(replies.len(), scripts::ALL.len() + 8, "{replies:?}");
    assert!(
        replies.iter().all(|r| !matches!(r, Val::Error(_))),
        "{replies:?}"
    );
    for split in 0..=bytes.len() {
        let mut s = sim(T0);
        let c = s.open();
        let mut out = Vec::new();
        assert!(s.feed(c, &bytes[..split], T0));
        s.drain_output(c, &mut out);
        assert!(s.feed(c, &bytes[split..], T0));
        s.drain_output(c, &mut out);
        assert_eq!(out, whole, "split at {split}");
    }
    let mut s = sim(T0);
    let c = s.open();
    let mut out = Vec::new();
    for b in &bytes {
        assert!(s.feed(c, std::slice::from_ref(b), T0));
        s.drain_output(c, &mut out);
    }
    assert_eq!(out, whole, "byte by byte");
}

#[test]
fn a_restart_closes_every_connection_and_forgets_what_it_should() {
    let mut s = sim(T0);
    let (a, b) = (s.open(), s.open());
    assert!(s.feed(b, &encode(&[b"SUBSCRIBE", b"ch"]), T0));
    s.take_output(b);
    let load = encode(&[b"SCRIPT", b"LOAD", scripts::RELEASE.src.as_bytes()]);
    assert!(s.feed(a, &load, T0));
    assert!(s.feed(a, &encode(&[b"SET", b"k", b"v", b"PX", b"5000"]), T0));
    assert!(s.script_cached(0));
    let run_id = s.run_id().to_owned();
    assert_eq!(s.uptime_s(T0 + 2500), 2);

    s.restart(true, T0 + 3000);
    assert!(!s.is_open(a) && !s.is_open(b));
    assert!(
        !s.feed(a, b"*1\r\n$4\r\nPING\r\n", T0 + 3000),
        "fed a closed connection"
    );
    // What was written before the restart can still be taken, once.
    assert_eq!(frames(&s.take_output(a)).len(), 2);
    assert!(s.take_output(a).is_empty());
    assert_ne!(s.run_id(), run_id);
    assert_eq!(s.uptime_s(T0 + 3999), 0);
    assert!(!s.script_cached(0));
    // Persistent: the key keeps its absolute expiry.
    assert_eq!(s.pttl(0, b"k", T0 + 3000), 2000);
    let c = s.open();
    assert!(c != a && c != b, "connection ids are never reused");
    assert!(s.feed(c, &encode(&[b"PUBLISH", b"ch", b"m"]), T0 + 3000));
    assert_eq!(frames(&s.take_output(c)), [Val::Int(0)]);

    s.restart(false, T0 + 4000);
    assert!(s.keys(0, T0 + 4000).is_empty());
}

#[test]
fn a_closed_connection_hears_nothing_more() {
    let mut s = SimRedis::new(
        server::Config {
            log_published: true,
            ..server::Config::default()
        },
        T0,
    );
    let (a, b, c) = (s.open(), s.open(), s.open());
    for x in [b, c] {
        assert!(s.feed(x, &encode(&[b"SUBSCRIBE", b"ch"]), T0));
        s.take_output(x);
    }
    s.close(b);
    assert!(s.feed(a, &encode(&[b"PUBLISH", b"ch", b"m"]), T0));
    assert_eq!(frames(&s.take_output(a)), [Val::Int(1)]);
    assert_eq!(s.with_output(), [c]);
    assert!(s.take_output(b).is_empty());
    let published = s.take_published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].receivers, 1);
    assert_eq!(published[0].payload, b"m");
}

#[test]
fn run_ids_come_from_the_seed() {
    let cfg = |seed| server::Config {
        seed,
        ..server::Config::default()
    };
    let (mut x, mut y) = (SimRedis::new(cfg(7), T0), SimRedis::new(cfg(7), T0));
    let z = SimRedis::new(cfg(8), T0);
    assert_eq!(x.run_id(), y.run_id());
    assert_ne!(x.run_id(), z.run_id());
    assert!(x.run_id().len() == 40 && x.run_id().bytes().all(|b| b.is_ascii_hexdigit()));
    x.restart(false, T0);
    y.restart(false, T0);
    assert_eq!(x.run_id(), y.run_id());
}

#[test]
fn nulls_are_resp3_when_asked() {
    let mut s = SimRedis::new(
        server::Config {
            resp3_nulls: true,
            ..server::Config::default()
        },
        T0,
    );
    let c = s.open();
    let set = encode(&[b"SET", b"k", b"v", b"NX", b"PX", b"100"]);
    assert!(s.feed(c, &set, T0));
    assert!(s.feed(c, &set, T0));
    assert_eq!(s.take_output(c), b"+OK\r\n_\r\n");
}

#[test]
fn keys_live_until_their_expiry_millisecond_inclusive() {
    // Redis: a key expires when now > when (keyIsExpired); a real server cannot be stopped
    // on that millisecond, so the table cannot show it.
    let mut s = sim(T0);
    s.set_key(0, b"k", b"v", Some(10), T0);
    assert_eq!(s.pttl(0, b"k", T0 + 10), 0);
    assert_eq!(s.get(0, b"k", T0 + 10).as_deref(), Some(&b"v"[..]));
    assert_eq!(s.pttl(0, b"k", T0 + 11), -2);
    // ACQUIRE_WAIT answers at least 1 for a holder on its last millisecond.
    let c = s.open();
    let aw = encode(&[
        b"EVAL",
        scripts::ACQUIRE_WAIT.src.as_bytes(),
        b"1",
        b"k",
        TA.as_bytes(),
        b"100",
    ]);
    assert!(s.feed(c, &aw, T0 + 10));
    assert_eq!(
        frames(&s.take_output(c)),
        [Val::Array(vec![Val::Int(1), Val::Bulk(b"v".to_vec())])]
    );
    assert!(s.feed(c, &aw, T0 + 11));
    assert_eq!(frames(&s.take_output(c)), [Val::Int(0)]);
}

#[test]
fn sources_other_than_the_crates_scripts_are_refused() {
    let mut s = sim(T0);
    let c = s.open();
    assert!(s.feed(c, &encode(&[b"SCRIPT", b"LOAD", b"return 1"]), T0));
    assert!(s.feed(c, &encode(&[b"EVAL", b"return 1", b"0"]), T0));
    for r in frames(&s.take_output(c)) {
        let Val::Error(e) = r else { panic!("{r:?}") };
        assert!(
            e.starts_with(b"ERR simredis: unknown script source"),
            "{}",
            esc(&e)
        );
    }
}

#[test]
fn a_protocol_error_closes_the_connection() {
    let mut s = sim(T0);
    let c = s.open();
    assert!(!s.feed(c, b"*1\r\n$4\r\nPING\r\n*abc\r\n*1\r\n$4\r\nPING\r\n", T0));
    assert!(!s.is_open(c));
    assert_eq!(
        s.take_output(c),
        b"+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n"
    );
    assert!(!s.feed(c, b"*1\r\n$4\r\nPING\r\n", T0));
}

#[test]
fn evictions_and_active_expiry_push_invalidations() {
    // A full tracking table and the active expiry cycle act on their own time: a real
    // server cannot be made to show them at a chosen step.
    let mut s = sim(T0);
    let (a, b) = (s.open(), s.open());
    let track = [
        encode(&[b"HELLO", b"3"]),
        encode(&[b"CLIENT", b"TRACKING", b"ON", b"OPTIN", b"NOLOOP"]),
        encode(&[b"CLIENT", b"CACHING", b"YES"]),
        encode(&[b"MGET", b"k", b"e"]),
    ]
    .concat();
    assert!(s.feed(b, &encode(&[b"SET", b"k", b"v"]), T0));
    assert!(s.feed(b, &encode(&[b"SET", b"e", b"v", b"PX", b"10"]), T0));
    s.take_output(b);
    assert!(s.feed(a, &track, T0));
    s.take_output(a);
    assert!(s.tracks(a, b"k") && s.tracks(a, b"e"));
    assert_eq!(s.tracked_keys(), [b"e".to_vec(), b"k".to_vec()]);
    // An eviction: the key did not change, the tracker hears it did and forgets it.
    assert!(s.evict_tracked(b"k"));
    assert!(!s.tracks(a, b"k"));
    let push = Val::Push(vec![
        Val::Bulk(b"invalidate".to_vec()),
        Val::Array(vec![Val::Bulk(b"k".to_vec())]),
    ]);
    assert_eq!(frames(&s.take_output(a)), [push]);
    assert!(!s.evict_tracked(b"k"));
    assert!(s.take_output(a).is_empty());
    // The active expiry: nothing before the key's last millisecond, a push after it.
    s.active_expire(T0 + 10);
    assert!(s.take_output(a).is_empty());
    s.active_expire(T0 + 11);
    let push = Val::Push(vec![
        Val::Bulk(b"invalidate".to_vec()),
        Val::Array(vec![Val::Bulk(b"e".to_vec())]),
    ]);
    assert_eq!(frames(&s.take_output(a)), [push]);
    assert!(s.tracked_keys().is_empty());
    assert_eq!(s.get(0, b"k", T0 + 11).as_deref(), Some(&b"v"[..]));
}
