//! Body of the `engine` fuzz target, shared by `fuzz/fuzz_targets/engine.rs` (libFuzzer)
//! and `tests/fuzz_engine_corpus.rs` (replays `fuzz/seeds/engine/` on every `cargo test`,
//! then seeded mutations of the seeds and seeded random inputs).
//!
//! It drives the real client: the sans-IO [`redlock_mux::core::Core`], built with
//! `Redlock::builder()...build_core`, with no socket and in simulated time, in the order the
//! mio driver (`src/driver/mod.rs`) calls it. The input is a client configuration and a
//! sequence of events: the user submits, releases, extends, drops and cancels; connects
//! succeed or fail, connections break, the kernel takes writes whole or in part; the
//! masters answer with raw bytes, with canned replies, or with what a master would answer
//! to what the client actually wrote; the time passes (by microseconds or by years).
//!
//! Layout (missing bytes read as zero; integers little-endian):
//!
//! | bytes | meaning |
//! | --- | --- |
//! | 0 | N = 1 + b % 7 masters (`redis://[fuzz:pw@]127.0.0.1:700i[/3]`) |
//! | 1 | flags: 1 fencing, 2 `fencing_assume_durable`, 4 wait mode Poll (else Notify), 8 fairness (Notify only), 16 amnesia guard, 32 password (AUTH), 64 user `fuzz` (with a password), 128 database 3 (SELECT) |
//! | 2 | retry count b % 4 |
//! | 3 | retry delay, ms |
//! | 4 | retry jitter, ms |
//! | 5 | node timeout, ms (0: the builder's default) |
//! | 6 | drift factor b / 256 * 0.5 (the builder accepts `[0, 0.5)`) |
//! | 7..9 | minimum validity, u16 x 100 µs |
//! | 9, 10..12 | lock TTL: scale s % 4 and u16 v: v ms, v x 10 ms, v s, `MAX_TTL` - v ms; raised to the smallest TTL the client accepts (`Settings::check_ttl`: above drift + minimum validity) |
//! | 12, 13..15 | extend TTL, the same way |
//! | 15..17 | amnesia guard `max_ttl` = the larger TTL + u16 ms (at most `MAX_TTL`) |
//! | 17 | connect timeout (1 + b) x 8 ms |
//! | 18 | stall timeout (1 + b) x 16 ms |
//! | 19 | manual connects: bit i, master i's connects (both links) wait for a CONNECT event |
//! | 20 | the kernel takes at most b bytes per link per flush (0: everything) |
//! | 21 | seed (tokens, jitter) |
//! | 22 | ending: bit 0 graceful (see below) |
//! | 23.. | events, each a kind byte (k % 13) and its payload |
//!
//! Events (`l` is a link byte: 255 every lock link, 254 every sub link, else link
//! b % 2N: `i < N` master i's lock link, `N + i` its subscription link):
//!
//! | k | payload | event |
//! | --- | --- | --- |
//! | 0 | p, d | submit on the resources `sku:1`, `sku:2`, `orders` (r = (p >> 2) % 3): p % 4 = 0 `try_lock`, 1 `lock`, 2 `lock_with_deadline` (now + d x 10 ms), 3 `lock_many` of 2 + (p >> 4) % 2 resources |
//! | 1 | i | release held lock i (mod the count) |
//! | 2 | i | extend held lock i by the extend TTL |
//! | 3 | i | drop held lock i (`release_detached`) |
//! | 4 | i | cancel submitted task i (done ones too: a stale id) |
//! | 5 | l, x | a manual connect succeeds (`handle_connected`), or fails if x is odd |
//! | 6 | l, len, bytes | the master sends raw bytes |
//! | 7 | l, r, s | the master sends canned reply r (table below); s != 0 splits it in two reads |
//! | 8 | l, m, c, s | the master answers the next c (0: all) commands it owes, in mood m % 8: 0 yes, 1 no (taken / not held / NOPERM), 2 `-NOSCRIPT` to `EVALSHA`, 3 `-ERR` to all, 4 restarted (uptime 0) and yes (`ACQUIRE_WAIT`: held with no expiry), 5 one `run_id` for all, no durability, RESP3 null to SET, 6 long holders and `CONFIG` refused, 7 wrong answers (bad password, SHA1, INFO, integers) |
//! | 9 | l, f | the connection breaks (`handle_closed`, f % 4: reset, EOF, broken pipe, refused) |
//! | 10 | s, u32 v | the time passes: s % 4 = 0 v % 2^16 µs, 1 v % 2^16 ms, 2 v seconds, 3 `MAX_TTL` + v ms |
//! | 11 | b | the time jumps to the core's next timer, + b µs |
//! | 12 | u16 v | the client was away from the loop v ms (the time passes unwatched), then enters it: `shift_clocks` |
//!
//! Canned replies (r % 32; p = r / 32): `+OK`, `$-1`, `_`, `:0`, `:1`, `:-1`, `:5000`,
//! `*2 :100 $16 <holder>`, `-NOSCRIPT`, `-ERR`, `-NOPERM`, `-WRONGPASS`, the SHA1 of
//! `scripts::ALL[p % 7]`, `INFO server` (own `run_id` and long uptime / uptime 0 / one
//! `run_id` for every master / no fields), `CONFIG GET` pairs (durable / not), a subscribe
//! and an unsubscribe confirmation, a release announced on a resource's channel (by the
//! holder / by the last token the client sent), a turn announced on the client's own
//! channel for a waiter it put in line, a message on a foreign channel, `:2`, a wrong SHA1,
//! `+QUEUED`, `*2 :-1 $32 <holder>`, `*3 :1 :2 :3`, `*-1`, `:i64::MAX`.
//!
//! After every event the driver's order of calls runs: `step`, every `Action` (Connect:
//! a new connection, connected at once unless manual; Close: forgotten), a flush (every
//! link `flush_wanted` names and every link with output, partial writes as byte 20 says),
//! `flushed`, again while `has_news` or a timer is overdue (the driver would poll with a
//! zero timeout). Then every finished task is taken.
//!
//! At the end of the input: everything queued is written. A graceful ending (byte 22)
//! then cancels every lock task and runs the timers with the connections open, and checks
//! that each attempt that may have set a key was followed by its cleanup release. Every
//! ending then closes every link, fails every connect, and runs the time past every
//! deadline and retry budget: every task must be done. Then the core must be quiet.
//!
//! Properties (each an assert with its message):
//! * never panics; settles at every instant (within 64 steps no news and no overdue timer);
//!   never asks for connects without end at one instant; `next_timer` never in the past
//!   after a step unless `has_news`; a connect under way has a timer by its connect
//!   timeout ([`STRICT_TIMERS`], [`STRICT_CONNECTS`]: two bugs this target found, fixed);
//! * the core and the driver agree on the links: no output on a link that is not up, a
//!   link the core closed (`received`/`recv_buf`) gets its `Close`; no subscription link in
//!   poll mode;
//! * the bytes written on every link are complete RESP arrays of bulk strings; a lock
//!   link's connection starts with its handshake, exactly (AUTH, SELECT, SCRIPT LOAD of
//!   every script, INFO server, CONFIG GET for fencing); no request passes an unconfirmed
//!   AUTH or SELECT; requests are well formed (keys, TTLs, tokens of 32 bytes, fencing
//!   scripts only with fencing, a waiter's line only in notify mode with one key, polite
//!   only with fairness, a line liveness that outlives the retry delay, one client id);
//!   an `EVAL` only after a `-NOSCRIPT` on that connection; an acquire token never sent
//!   twice to a master but as the retry of a `-NOSCRIPT`; a subscription link says only
//!   AUTH, SUBSCRIBE and UNSUBSCRIBE of the client's channels;
//! * a task is done once: its result is taken once and `is_done` is false after; its
//!   result is of its kind (`Locked` for lock tasks, `Released`, `Extended`), and each
//!   error is one its kind may give, with a report that matches it (quorum, outcomes);
//! * a granted lock: `valid_until - acquired_at` is `ttl - drift(ttl)` (so at most that),
//!   more than the minimum validity left when it is handed out, its `ttl()` and
//!   `resources()` are what was asked, `fencing_token()` is Some (>= 1) iff fencing, never
//!   granted to a task cancelled before it was done, nor after its deadline; tokens are
//!   unique; a `try_lock` makes one attempt, a poll-mode lock at most 1 + its retries;
//! * an extension: its TTL is what was asked, its deadline the later of the old one and
//!   `start + ttl - drift`; `Expired` exactly when it was asked past the lock's validity;
//! * graceful ending: every attempt that may have set a key (no answer, a yes, or a
//!   vote not counted) and was not granted is followed by a release of its token on that
//!   connection; every waiter that stood in a line and is not a lock still held leaves
//!   the line (a release naming it) after its last attempt, on every open connection;
//! * timeliness: a release or extend ends within its round timeout, a lock call with a
//!   deadline by the deadline, a `try_lock` (without fencing) within its round timeout;
//! * votes (when every reply read answers a command written): a lock is granted only
//!   with a quorum of masters whose yes to its acquire the core may count (amnesia guard:
//!   up for `max_ttl` by its INFO; fencing: durable by its CONFIG), and with fencing a
//!   quorum of draws and of write-backs; an extension with a quorum of counted yes to its
//!   extend, a release with a quorum of yes to its release; a fenced lock's token is the
//!   value its write-backs wrote;
//! * liveness: with every link closed and the time run past the deadlines and retry
//!   budgets, every task is done; then no round is undecided, no channel held, no timer
//!   left;
//! * stats: connects and subscription connects as the driver saw them, `noscript`
//!   between the EVALs written and the `-NOSCRIPT`s read, yes and refused votes and
//!   latencies at most the replies read, notifications at most the messages read.
#![allow(dead_code)]

use std::collections::HashSet;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

use redlock_mux::core::{Action, Core, Done, LinkId, TaskId, WaitMode};
use redlock_mux::resp::{self, AggregateKind, Frame, Limits, Status};
use redlock_mux::rules::{self, Fault, Outcome};
use redlock_mux::scripts::{self, Script};
use redlock_mux::{Error, Lock, Redlock, Report, MAX_TTL};

/// Inputs beyond this are not more interesting.
const MAX_INPUT: usize = 4096;

/// The resources the user locks.
const RESOURCES: [&[u8]; 3] = [b"sku:1", b"sku:2", b"{ord}ers"];

/// A holder's token (another client's), as `ACQUIRE_WAIT` reports it and its release
/// announces it.
const HOLDER: &[u8] = b"f00dfacef00dfacef00dfacef00dface";

/// The limits the core reads replies with (`NetConfig::default`): the fed bytes are
/// parsed with the same, so that both count the same frames.
const CORE_LIMITS: Limits = Limits {
    max_bulk_len: 1024 * 1024,
    max_elements: 1024,
    max_depth: 4,
    max_line_len: 4096,
};

/// What the client may write: arrays (depth 1) of bulk strings (the scripts are a few KiB).
const WIRE_LIMITS: Limits = Limits {
    max_bulk_len: 1024 * 1024,
    max_elements: 1024,
    max_depth: 1,
    max_line_len: 4096,
};

/// The simulated clock stops here (`Instant + Duration` must not overflow).
const MAX_US: u64 = 1 << 62;

/// The client's reconnect backoff at most (`NetConfig::default`).
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long a channel lingers after its last waiter (`chans::LINGER`).
const LINGER: Duration = Duration::from_secs(2);

struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.at += n;
        &self.data[start..end]
    }
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// The client's settings, from the header.
#[derive(Debug, Clone)]
struct Cfg {
    n: usize,
    fencing: bool,
    assume_durable: bool,
    poll: bool,
    fairness: bool,
    password: bool,
    user: bool,
    db: bool,
    retry_count: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    node_timeout: Option<Duration>,
    drift_factor: f64,
    min_validity: Duration,
    ttl: Duration,
    ttl2: Duration,
    amnesia: Option<Duration>,
    connect_timeout: Duration,
    stall_timeout: Duration,
    manual: u8,
    cap: usize,
    seed: u64,
    graceful: bool,
}

/// A TTL from a scale and a value, in whole ms within `[1 ms, MAX_TTL]`.
fn ttl_from(scale: u8, v: u16) -> u64 {
    let max = MAX_TTL.as_millis() as u64;
    let v = u64::from(v);
    let t = match scale % 4 {
        0 => v,
        1 => v * 10,
        2 => v * 1000,
        _ => max - v,
    };
    t.clamp(1, max)
}

/// Whether the client accepts `ttl` (what `Settings::check_ttl` says of a whole-ms TTL).
fn accepted(ttl: Duration, drift_factor: f64, min_validity: Duration) -> bool {
    ttl > rules::drift(ttl, drift_factor).saturating_add(min_validity)
}

/// `ms` raised to the smallest TTL the client accepts.
fn valid_ttl(ms_: u64, drift_factor: f64, min_validity: Duration) -> Duration {
    let mut t = ms(ms_);
    if !accepted(t, drift_factor, min_validity) {
        // ttl > ttl * f + 2 ms + min  <=>  ttl > (2 ms + min) / (1 - f)
        let floor = (rules::DRIFT_FIXED + min_validity).as_secs_f64() / (1.0 - drift_factor);
        t = ms((floor * 1000.0) as u64 + 1).max(t);
        while !accepted(t, drift_factor, min_validity) {
            t += ms(1);
        }
    }
    t.min(MAX_TTL)
}

impl Cfg {
    fn read(b: &mut Bytes<'_>) -> Cfg {
        let n = 1 + (b.u8() % 7) as usize;
        let flags = b.u8();
        let poll = flags & 4 != 0;
        let password = flags & 32 != 0;
        let guard = flags & 16 != 0;
        let retry_count = u32::from(b.u8() % 4);
        let retry_delay = ms(b.u8().into());
        let retry_jitter = ms(b.u8().into());
        let nt = b.u8();
        let node_timeout = (nt != 0).then(|| ms(nt.into()));
        let drift_factor = f64::from(b.u8()) / 256.0 * 0.5;
        let min_validity = Duration::from_micros(u64::from(b.u16()) * 100);
        let (s, v) = (b.u8(), b.u16());
        let ttl = valid_ttl(ttl_from(s, v), drift_factor, min_validity);
        let (s, v) = (b.u8(), b.u16());
        let ttl2 = valid_ttl(ttl_from(s, v), drift_factor, min_validity);
        let extra = ms(b.u16().into());
        let amnesia = guard.then(|| (ttl.max(ttl2) + extra).min(MAX_TTL));
        let connect_timeout = ms((1 + u64::from(b.u8())) * 8);
        let stall_timeout = ms((1 + u64::from(b.u8())) * 16);
        Cfg {
            n,
            fencing: flags & 1 != 0,
            assume_durable: flags & 2 != 0,
            poll,
            fairness: !poll && flags & 8 != 0,
            password,
            user: password && flags & 64 != 0,
            db: flags & 128 != 0,
            retry_count,
            retry_delay,
            retry_jitter,
            node_timeout,
            drift_factor,
            min_validity,
            ttl,
            ttl2,
            amnesia,
            connect_timeout,
            stall_timeout,
            manual: b.u8(),
            cap: b.u8().into(),
            seed: b.u8().into(),
            graceful: b.u8() & 1 != 0,
        }
    }

    fn url(&self, i: usize) -> String {
        let auth = match (self.password, self.user) {
            (true, true) => "fuzz:pw@",
            (true, false) => ":pw@",
            _ => "",
        };
        let db = if self.db { "/3" } else { "" };
        format!("redis://{auth}127.0.0.1:{}{db}", 7000 + i)
    }

    /// The lock link's handshake, command by command.
    fn handshake(&self) -> Vec<Vec<Vec<u8>>> {
        let mut v = Vec::new();
        if self.password {
            v.push(if self.user {
                cmd(&[b"AUTH", b"fuzz", b"pw"])
            } else {
                cmd(&[b"AUTH", b"pw"])
            });
        }
        if self.db {
            v.push(cmd(&[b"SELECT", b"3"]));
        }
        for s in scripts::ALL {
            v.push(cmd(&[b"SCRIPT", b"LOAD", s.src.as_bytes()]));
        }
        v.push(cmd(&[b"INFO", b"server"]));
        if self.fencing && !self.assume_durable {
            v.push(cmd(&[b"CONFIG", b"GET", b"append*"]));
        }
        v
    }
}

fn cmd(args: &[&[u8]]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.to_vec()).collect()
}

/// A reply the simulated master sent, as far as the checks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Ok,
    Null,
    Int(i64),
    Err {
        noscript: bool,
    },
    /// `[ttl, holder]`, as `ACQUIRE_WAIT` answers a taken key.
    Holder,
    /// `INFO server` with a `run_id` and an uptime (s).
    Info {
        uptime: u64,
    },
    /// Any other aggregate, read as `CONFIG GET` pairs: durable or not.
    Pairs {
        durable: bool,
    },
    Other,
}

fn classify_reply(f: &Frame<'_>) -> Reply {
    match f {
        Frame::Simple(b"OK") => Reply::Ok,
        f if f.is_null() => Reply::Null,
        Frame::Integer(v) => Reply::Int(*v),
        Frame::Error(m) | Frame::BulkError(m) => Reply::Err {
            noscript: m.starts_with(b"NOSCRIPT"),
        },
        Frame::Aggregate(a) if rules::holder_left(a).is_some() => Reply::Holder,
        Frame::Aggregate(a) => {
            let (mut aof, mut always) = (false, false);
            let mut it = a.iter();
            while let (Some(name), Some(value)) = (it.next(), it.next()) {
                if let (Frame::Bulk(name), Frame::Bulk(value)) = (name, value) {
                    if name.eq_ignore_ascii_case(b"appendonly") {
                        aof = value.eq_ignore_ascii_case(b"yes");
                    } else if name.eq_ignore_ascii_case(b"appendfsync") {
                        always = value.eq_ignore_ascii_case(b"always");
                    }
                }
            }
            Reply::Pairs {
                durable: aof && always,
            }
        }
        Frame::Bulk(text) | Frame::Verbatim { text, .. } => {
            let (mut uptime, mut run_id) = (None, false);
            for line in text.split(|b| *b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
                    uptime = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok());
                } else if let Some(v) = line.strip_prefix(b"run_id:") {
                    run_id = v.len() == 40;
                }
            }
            match (uptime, run_id) {
                (Some(uptime), true) => Reply::Info { uptime },
                _ => Reply::Other,
            }
        }
        _ => Reply::Other,
    }
}

/// A vote a master may give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vote {
    Acquire,
    Draw,
    Raise,
    Release,
    Extend,
}

/// Command `c` answered `r`: the yes vote it is (a vote that grants or releases), and for
/// which token.
fn yes_vote(c: &[Vec<u8>], r: Reply) -> Option<(Vote, &[u8])> {
    if c[0].eq_ignore_ascii_case(b"SET") {
        return (r == Reply::Ok).then_some((Vote::Acquire, &c[2][..]));
    }
    let (s, _) = script_of(c)?;
    let (_, args) = keys_args(c)?;
    let token = &args.first()?[..];
    let Reply::Int(v) = r else { return None };
    let vote = if s == scripts::ACQUIRE_MANY && v == 1 || s == scripts::ACQUIRE_WAIT && v == 0 {
        Vote::Acquire
    } else if s == scripts::FENCE_DRAW && v > 0 {
        Vote::Draw
    } else if s == scripts::FENCE_RAISE && v == 1 {
        Vote::Raise
    } else if (s == scripts::RELEASE || s == scripts::RELEASE_LEAN) && v > 0 {
        Vote::Release
    } else if s == scripts::EXTEND && v > 0 {
        Vote::Extend
    } else {
        return None;
    };
    Some((vote, token))
}

/// A `message` push on a subscription connection (not the answer to a command).
fn is_message(f: &Frame<'_>) -> bool {
    match f {
        Frame::Aggregate(a) if a.len() == 3 => {
            matches!(a.iter().next(), Some(Frame::Bulk(k)) if k == b"message")
        }
        _ => false,
    }
}

/// One connection the driver opened for a link.
struct Conn {
    link: usize,
    /// When the driver was asked to connect it.
    opened: Instant,
    /// Connected (`handle_connected`); else the connect is under way.
    up: bool,
    /// Not closed yet.
    open: bool,
    /// Every byte written on it, and how far they were parsed into `cmds`.
    wire: Vec<u8>,
    wire_at: usize,
    cmds: Vec<Vec<Vec<u8>>>,
    /// Every byte the master sent on it, and how far they were parsed.
    fed: Vec<u8>,
    fed_at: usize,
    /// The fed bytes are not RESP (the core closes the link).
    broken: bool,
    /// Frames read that answer commands (every frame on a lock link; all but `message`
    /// pushes on a sub link), in order: reply k answers command k.
    replies: Vec<Reply>,
    /// When each reply was read (µs).
    reply_at: Vec<u64>,
    messages: usize,
    noscripts: usize,
    /// Other error replies (the plain release and the waiting acquire out of line follow
    /// one).
    errors: usize,
    evals: usize,
}

impl Conn {
    fn new(link: usize, opened: Instant) -> Conn {
        Conn {
            link,
            opened,
            up: false,
            open: true,
            wire: Vec::new(),
            wire_at: 0,
            cmds: Vec::new(),
            fed: Vec::new(),
            fed_at: 0,
            broken: false,
            replies: Vec::new(),
            reply_at: Vec::new(),
            messages: 0,
            noscripts: 0,
            errors: 0,
            evals: 0,
        }
    }
}

#[derive(Debug)]
enum Kind {
    Lock {
        keys: Vec<Vec<u8>>,
        deadline: Option<Instant>,
        retries: u32,
    },
    Release {
        token: Vec<u8>,
    },
    Extend {
        token: Vec<u8>,
        old: Instant,
        ttl: Duration,
    },
}

struct TaskRec {
    id: TaskId,
    kind: Kind,
    at: Instant,
    cancelled: bool,
    taken: bool,
}

/// Which of our scripts a script command runs, and whether by `EVAL`.
fn script_of(c: &[Vec<u8>]) -> Option<(Script, bool)> {
    let name = c.first()?.to_ascii_uppercase();
    let what = c.get(1)?;
    match &name[..] {
        b"EVALSHA" => scripts::ALL
            .into_iter()
            .find(|s| s.sha.as_bytes().eq_ignore_ascii_case(what))
            .map(|s| (s, false)),
        // `RELEASE_PLAIN`, the fallback of a release refused for its lines' keys, is only
        // ever sent with `EVAL`.
        b"EVAL" => scripts::ALL
            .into_iter()
            .chain([scripts::RELEASE_PLAIN])
            .find(|s| s.src.as_bytes() == &what[..])
            .map(|s| (s, true)),
        _ => None,
    }
}

/// One argument of a command, as written.
type Arg = Vec<u8>;

/// A script command's keys and arguments.
fn keys_args(c: &[Vec<u8>]) -> Option<(&[Arg], &[Arg])> {
    let nkeys: usize = std::str::from_utf8(c.get(2)?).ok()?.parse().ok()?;
    let rest = c.get(3..)?;
    (nkeys <= rest.len()).then(|| rest.split_at(nkeys))
}

/// An acquire command (SET, or the acquire scripts): its token, and whether its reply
/// (`None`: none yet) lets it have set a key (`rules::may_hold` of what the core records).
fn acquire_may_hold<'c>(c: &'c [Vec<u8>], reply: Option<&Reply>) -> Option<(&'c [u8], bool)> {
    if c[0].eq_ignore_ascii_case(b"SET") {
        let may = matches!(reply, None | Some(Reply::Ok));
        return Some((&c[2], may));
    }
    let (s, _) = script_of(c)?;
    let (_, args) = keys_args(c)?;
    let token = args.first()?;
    let may = if s == scripts::ACQUIRE_MANY {
        matches!(
            reply,
            None | Some(Reply::Int(1)) | Some(Reply::Err { noscript: false })
        )
    } else if s == scripts::ACQUIRE_WAIT {
        matches!(
            reply,
            None | Some(Reply::Int(0)) | Some(Reply::Err { noscript: false })
        )
    } else {
        return None;
    };
    Some((token, may))
}

/// The token a release command releases.
fn release_token(c: &[Vec<u8>]) -> Option<&[u8]> {
    let (s, _) = script_of(c)?;
    if s != scripts::RELEASE && s != scripts::RELEASE_LEAN {
        return None;
    }
    let (_, args) = keys_args(c)?;
    args.first().map(|t| &t[..])
}

fn resp_bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

fn resp_err(out: &mut Vec<u8>, m: &str) {
    out.extend_from_slice(format!("-{m}\r\n").as_bytes());
}

fn resp_int(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(format!(":{v}\r\n").as_bytes());
}

/// `*3 $<n> <kind> $<n> <channel> :<count>` (a subscribe or unsubscribe confirmation).
fn resp_confirm(out: &mut Vec<u8>, kind: &[u8], channel: &[u8], count: i64) {
    out.extend_from_slice(b"*3\r\n");
    resp_bulk(out, kind);
    resp_bulk(out, channel);
    resp_int(out, count);
}

/// `*3 $7 message $<n> <channel> $<n> <payload>`.
fn resp_message(out: &mut Vec<u8>, channel: &[u8], payload: &[u8]) {
    out.extend_from_slice(b"*3\r\n");
    resp_bulk(out, b"message");
    resp_bulk(out, channel);
    resp_bulk(out, payload);
}

/// `INFO server` as a master answers it.
fn resp_info(out: &mut Vec<u8>, run_id: usize, uptime: u64) {
    let text = format!(
        "# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id:040x}\r\nuptime_in_seconds:{uptime}\r\n"
    );
    resp_bulk(out, text.as_bytes());
}

/// `CONFIG GET append*`: durable or not.
fn resp_config(out: &mut Vec<u8>, durable: bool) {
    out.extend_from_slice(b"*4\r\n");
    resp_bulk(out, b"appendonly");
    resp_bulk(out, if durable { b"yes" } else { b"no" });
    resp_bulk(out, b"appendfsync");
    resp_bulk(out, if durable { &b"always"[..] } else { b"everysec" });
}

/// `[ttl, holder]`.
fn resp_holder(out: &mut Vec<u8>, left: i64, holder: &[u8]) {
    out.extend_from_slice(b"*2\r\n");
    resp_int(out, left);
    resp_bulk(out, holder);
}

fn lossy(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.chars().count() > 300 {
        format!("{}...", s.chars().take(300).collect::<String>())
    } else {
        s.into_owned()
    }
}

fn show(c: &[Vec<u8>]) -> String {
    c.iter()
        .map(|a| {
            if a.len() > 40 {
                format!("<{} bytes>", a.len())
            } else {
                String::from_utf8_lossy(a).into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The simulation: the core, the driver's view of its links, the user's tasks and locks.
struct Sim {
    cfg: Cfg,
    core: Core,
    n: usize,
    base: Instant,
    us: u64,
    handshake: Vec<Vec<Vec<u8>>>,
    /// Every connection ever opened, and each link's current one.
    conns: Vec<Conn>,
    link: Vec<Option<usize>>,
    /// Connections the core closed (`received` false, `recv_buf` none): a `Close` is due.
    closing: Vec<usize>,
    tasks: Vec<TaskRec>,
    held: Vec<Lock>,
    /// Tokens of every lock granted.
    granted: HashSet<Vec<u8>>,
    /// Token and fencing token of every fenced lock granted.
    fences: Vec<(Vec<u8>, u64)>,
    /// (master, token) of every acquire written.
    acquired: HashSet<(usize, Vec<u8>)>,
    client_id: Option<Vec<u8>>,
    waiters: Vec<Vec<u8>>,
    last_token: Option<Vec<u8>>,
    draws: i64,
    cap: usize,
    fail_connects: bool,
    /// `handle_connected` of a lock link, and `Connect` of a sub link, per master.
    connected: Vec<u64>,
    sub_connects: Vec<u64>,
    /// `ENGINE_TRACE` set: print every event and what the client did (for a failing input).
    trace: bool,
    /// The strict properties checked ([`STRICT_TIMERS`], [`STRICT_CONNECTS`]; all of them
    /// in the fuzz target and the corpus test).
    strict: u8,
}

/// Whether `ENGINE_TRACE` is set (read once).
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ENGINE_TRACE").is_some())
}

impl Sim {
    fn new(cfg: Cfg) -> Sim {
        let base = Instant::now();
        let urls: Vec<String> = (0..cfg.n).map(|i| cfg.url(i)).collect();
        let mut builder = Redlock::builder()
            .masters(&urls)
            .retry_count(cfg.retry_count)
            .retry_delay(cfg.retry_delay)
            .retry_jitter(cfg.retry_jitter)
            .drift_factor(cfg.drift_factor)
            .min_validity(cfg.min_validity)
            .fencing(cfg.fencing)
            .fencing_assume_durable(cfg.assume_durable)
            .wait_mode(if cfg.poll {
                WaitMode::Poll
            } else {
                WaitMode::Notify
            })
            .fairness(cfg.fairness)
            .connect_timeout(cfg.connect_timeout)
            .stall_timeout(cfg.stall_timeout);
        if let Some(t) = cfg.node_timeout {
            builder = builder.node_timeout(t);
        }
        if let Some(max) = cfg.amnesia {
            builder = builder.amnesia_guard(max);
        }
        let core = match builder.build_core(base, 1_700_000_000_000_000, cfg.seed) {
            Ok(core) => core,
            Err(e) => panic!("a valid configuration is refused: {e} ({cfg:?})"),
        };
        let n = cfg.n;
        assert_eq!(core.masters(), n, "masters()");
        Sim {
            handshake: cfg.handshake(),
            cap: cfg.cap,
            cfg,
            core,
            n,
            base,
            us: 0,
            conns: Vec::new(),
            link: vec![None; 2 * n],
            closing: Vec::new(),
            tasks: Vec::new(),
            held: Vec::new(),
            granted: HashSet::new(),
            fences: Vec::new(),
            acquired: HashSet::new(),
            client_id: None,
            waiters: Vec::new(),
            last_token: None,
            draws: 0,
            fail_connects: false,
            connected: vec![0; n],
            sub_connects: vec![0; n],
            trace: tracing(),
            strict: 0,
        }
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.us)
    }

    fn advance(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.us = self.us.saturating_add(us).min(MAX_US);
    }

    fn targets(&self, b: u8) -> Vec<usize> {
        match b {
            255 => (0..self.n).collect(),
            254 => (self.n..2 * self.n).collect(),
            b => vec![b as usize % (2 * self.n)],
        }
    }

    fn manual(&self, l: usize) -> bool {
        self.cfg.manual & (1 << (l % self.n)) != 0
    }

    // ---- Events --------------------------------------------------------------------

    fn event(&mut self, b: &mut Bytes<'_>) {
        let at = b.at;
        let kind = b.u8() % 13;
        if self.trace {
            let end = (at + 8).min(b.data.len());
            eprintln!(
                "[{:.6}s] event {kind} at byte {at}: {:?}",
                self.us as f64 / 1e6,
                &b.data[at..end]
            );
        }
        match kind {
            0 => {
                let (p, d) = (b.u8(), b.u8());
                self.submit(p, d);
            }
            1 => {
                let i = b.u8() as usize;
                if !self.held.is_empty() {
                    let lock = self.held.remove(i % self.held.len());
                    let now = self.now();
                    let id = self.core.submit_release(&lock, now);
                    let token = lock.token().as_bytes().to_vec();
                    self.track(id, Kind::Release { token }, now);
                }
            }
            2 => {
                let i = b.u8() as usize;
                if !self.held.is_empty() {
                    let lock = &self.held[i % self.held.len()];
                    let now = self.now();
                    let (token, old, ttl) = (
                        lock.token().as_bytes().to_vec(),
                        lock.valid_until(),
                        self.cfg.ttl2,
                    );
                    let id = self.core.submit_extend(lock, ttl, now);
                    self.track(id, Kind::Extend { token, old, ttl }, now);
                }
            }
            3 => {
                let i = b.u8() as usize;
                if !self.held.is_empty() {
                    let lock = self.held.remove(i % self.held.len());
                    let now = self.now();
                    self.core.release_detached(&lock, now);
                }
            }
            4 => {
                let i = b.u8() as usize;
                if !self.tasks.is_empty() {
                    let k = i % self.tasks.len();
                    let now = self.now();
                    self.core.cancel(self.tasks[k].id, now);
                    let t = &mut self.tasks[k];
                    if !t.taken && matches!(t.kind, Kind::Lock { .. }) {
                        t.cancelled = true;
                    }
                }
            }
            5 => {
                let (l, x) = (b.u8(), b.u8());
                for l in self.targets(l) {
                    self.manual_connect(l, x & 1 == 0);
                }
            }
            6 => {
                let l = b.u8();
                let len = b.u8() as usize;
                let raw = b.take(len).to_vec();
                for l in self.targets(l) {
                    self.feed(l, &raw);
                }
            }
            7 => {
                let (l, r, s) = (b.u8(), b.u8(), b.u8());
                for l in self.targets(l) {
                    let bytes = self.canned(r, l);
                    self.feed_split(l, &bytes, s);
                }
            }
            8 => {
                let (l, m, c, s) = (b.u8(), b.u8(), b.u8(), b.u8());
                for l in self.targets(l) {
                    let bytes = self.owed_answers(l, m, c as usize);
                    if !bytes.is_empty() {
                        self.feed_split(l, &bytes, s);
                    }
                }
            }
            9 => {
                let (l, f) = (b.u8(), b.u8());
                let fault = match f % 4 {
                    0 => Fault::Closed(ErrorKind::ConnectionReset),
                    1 => Fault::Closed(ErrorKind::UnexpectedEof),
                    2 => Fault::Closed(ErrorKind::BrokenPipe),
                    _ => Fault::Connect(ErrorKind::ConnectionRefused),
                };
                for l in self.targets(l) {
                    self.break_link(l, fault);
                }
            }
            10 => {
                let (s, v) = (b.u8(), b.u32());
                let d = match s % 4 {
                    0 => Duration::from_micros(u64::from(v % 65536)),
                    1 => ms(u64::from(v % 65536)),
                    2 => Duration::from_secs(v.into()),
                    _ => MAX_TTL + ms(v.into()),
                };
                self.advance(d);
            }
            11 => {
                let extra = Duration::from_micros(b.u8().into());
                if let Some(t) = self.core.next_timer(None) {
                    let now = self.now();
                    self.advance(t.saturating_duration_since(now) + extra);
                }
            }
            _ => {
                // The single-owner client was away from the loop (between two calls): the
                // time passes unwatched, then its next call enters the loop and shifts the
                // stall clocks and connect deadlines (gaps under 1 ms are not shifted).
                let away = ms(b.u16().into());
                self.advance(away);
                if away >= ms(1) {
                    let now = self.now();
                    self.core.shift_clocks(away, now);
                    for c in self.link.iter().flatten() {
                        let conn = &mut self.conns[*c];
                        if !conn.up {
                            conn.opened += away;
                        }
                    }
                }
            }
        }
        self.cycle();
    }

    fn submit(&mut self, p: u8, d: u8) {
        let r = (p >> 2) as usize % 3;
        let now = self.now();
        let retries = self.cfg.retry_count;
        let (keys, deadline, retries): (Vec<&[u8]>, _, _) = match p % 4 {
            0 => (vec![RESOURCES[r]], None, 0),
            1 => (vec![RESOURCES[r]], None, retries),
            2 => (
                vec![RESOURCES[r]],
                Some(now + ms(u64::from(d) * 10)),
                retries,
            ),
            _ => {
                let k = 2 + (p >> 4) as usize % 2;
                let keys = (0..k).map(|j| RESOURCES[(r + j) % 3]).collect();
                (keys, None, retries)
            }
        };
        let id = self
            .core
            .submit_lock(keys.iter().copied(), self.cfg.ttl, deadline, retries, now);
        let keys = keys.iter().map(|k| k.to_vec()).collect();
        self.track(
            id,
            Kind::Lock {
                keys,
                deadline,
                retries,
            },
            now,
        );
    }

    fn track(&mut self, id: TaskId, kind: Kind, at: Instant) {
        assert!(
            !self.tasks.iter().any(|t| !t.taken && t.id == id),
            "task id {id:?} given to two live tasks"
        );
        self.tasks.push(TaskRec {
            id,
            kind,
            at,
            cancelled: false,
            taken: false,
        });
    }

    fn manual_connect(&mut self, l: usize, ok: bool) {
        let Some(c) = self.link[l] else { return };
        if self.conns[c].up {
            return;
        }
        if ok {
            self.core.handle_connected(LinkId(l));
            self.conns[c].up = true;
            if l < self.n {
                self.connected[l] += 1;
            }
        } else {
            self.end_conn(l);
            let now = self.now();
            self.core
                .handle_closed(LinkId(l), Fault::Connect(ErrorKind::ConnectionRefused), now);
        }
    }

    fn break_link(&mut self, l: usize, fault: Fault) {
        if self.link[l].is_none() {
            return;
        }
        self.end_conn(l);
        let now = self.now();
        self.core.handle_closed(LinkId(l), fault, now);
    }

    fn end_conn(&mut self, l: usize) {
        if let Some(c) = self.link[l].take() {
            self.conns[c].open = false;
            self.conns[c].up = false;
        }
    }

    // ---- The driver's calls ----------------------------------------------------------

    /// Step, actions, flush, `flushed`, again while the core has news; then take what is
    /// done.
    fn cycle(&mut self) {
        let mut settled = false;
        for _ in 0..64 {
            let now = self.now();
            self.core.step(now);
            if self.trace {
                eprintln!(
                    "  step: next timer in {:?}, news {}",
                    self.core
                        .next_timer(None)
                        .map(|t| t.checked_duration_since(now)),
                    self.core.has_news()
                );
            }
            let overdue =
                !self.core.has_news() && self.core.next_timer(None).is_some_and(|t| t < now);
            if let (true, true, Some(t)) = (
                overdue,
                self.strict & STRICT_TIMERS != 0,
                self.core.next_timer(None),
            ) {
                panic!(
                    "next_timer is {:?} in the past after a step (BUG engine-fuzz-1)",
                    now - t
                );
            }
            self.apply_actions();
            self.flush();
            // An overdue timer: the driver polls with a zero timeout and steps again, as
            // for news. Either way the core must settle at this instant.
            if !self.core.has_news() && !overdue {
                settled = true;
                break;
            }
        }
        assert!(
            settled,
            "the core never settles: news or an overdue timer after 64 steps at one instant"
        );
        if self.strict & STRICT_CONNECTS != 0 {
            self.check_connect_timers();
        }
        self.check_tasks();
    }

    /// A connect under way times out by the connect timeout: the core has a timer by then
    /// (fails today: BUG engine-fuzz-2, see [`STRICT_CONNECTS`]).
    fn check_connect_timers(&self) {
        let next = self.core.next_timer(None);
        for c in self.link.iter().flatten() {
            let conn = &self.conns[*c];
            if conn.up {
                continue;
            }
            let by = conn.opened + self.cfg.connect_timeout;
            assert!(
                next.is_some_and(|t| t <= by),
                "link {}: a connect under way since {:?} and no timer by its timeout (next \
                 timer {:?} after it; BUG engine-fuzz-2)",
                conn.link,
                self.now().saturating_duration_since(conn.opened),
                next.map(|t| t.saturating_duration_since(by))
            );
        }
    }

    fn apply_actions(&mut self) {
        for _ in 0..64 {
            let mut opened: Vec<usize> = Vec::new();
            while let Some(a) = self.core.take_action() {
                if self.trace {
                    eprintln!("  action {a:?}");
                }
                match a {
                    Action::Connect(LinkId(l)) => {
                        assert!(l < 2 * self.n, "Connect(link {l}) of {} masters", self.n);
                        assert!(
                            l < self.n || !self.cfg.poll,
                            "subscription link {l} opened in poll mode"
                        );
                        // The driver closes the old socket first.
                        self.end_conn(l);
                        let now = self.now();
                        self.conns.push(Conn::new(l, now));
                        self.link[l] = Some(self.conns.len() - 1);
                        if l >= self.n {
                            self.sub_connects[l - self.n] += 1;
                        }
                        opened.push(l);
                    }
                    Action::Close {
                        link: LinkId(l), ..
                    } => {
                        assert!(l < 2 * self.n, "Close(link {l}) of {} masters", self.n);
                        self.end_conn(l);
                    }
                }
            }
            for c in std::mem::take(&mut self.closing) {
                assert!(
                    !self.conns[c].open,
                    "the core closed link {} (received/recv_buf) but asked for no Close",
                    self.conns[c].link
                );
            }
            if opened.is_empty() {
                return;
            }
            // Sockets report after the actions are applied.
            let now = self.now();
            for l in opened {
                let Some(c) = self.link[l] else { continue };
                if self.conns[c].up {
                    continue;
                }
                if self.fail_connects {
                    self.end_conn(l);
                    self.core.handle_closed(
                        LinkId(l),
                        Fault::Connect(ErrorKind::ConnectionRefused),
                        now,
                    );
                } else if !self.manual(l) {
                    self.core.handle_connected(LinkId(l));
                    self.conns[c].up = true;
                    if l < self.n {
                        self.connected[l] += 1;
                    }
                }
            }
        }
        panic!("the core asks for connects without end at one instant");
    }

    fn flush(&mut self) {
        let (lock, sub) = self.core.flush_wanted();
        for l in 0..2 * self.n {
            let up = self.link[l].is_some_and(|c| self.conns[c].up);
            if !up {
                assert!(
                    !self.core.has_output(LinkId(l)),
                    "link {l} has output but the driver has no connection up"
                );
                assert!(
                    self.core.send_buf(LinkId(l)).is_empty(),
                    "link {l} gives bytes to write but the driver has no connection up"
                );
                continue;
            }
            let wanted = if l < self.n { lock } else { sub };
            if wanted || self.core.has_output(LinkId(l)) {
                self.write_link(l);
            }
        }
        self.core.flushed();
        self.apply_actions();
    }

    fn write_link(&mut self, l: usize) {
        let Some(c) = self.link[l] else { return };
        let mut budget = if self.cap == 0 { usize::MAX } else { self.cap };
        loop {
            let out = self.core.send_buf(LinkId(l));
            if out.is_empty() {
                break;
            }
            let k = out.len().min(budget);
            self.conns[c].wire.extend_from_slice(&out[..k]);
            budget -= k;
            if !self.core.sent(LinkId(l), k) || budget == 0 {
                break;
            }
        }
        self.parse_wire(c);
        if self.cap == 0 {
            // The kernel took everything the link may write: whole commands (a handshake
            // gated on AUTH or SELECT stops at its end).
            let conn = &self.conns[c];
            assert_eq!(
                conn.wire_at,
                conn.wire.len(),
                "link {l}: a whole write ended inside a command: {:?}",
                lossy(&conn.wire[conn.wire_at..])
            );
        }
    }

    /// Hand `bytes` to link `l` as the driver's read path does.
    fn feed(&mut self, l: usize, bytes: &[u8]) {
        let Some(c) = self.link[l] else { return };
        if !self.conns[c].up {
            return;
        }
        let now = self.now();
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some(buf) = self.core.recv_buf(LinkId(l), now) else {
                self.closing.push(c);
                break;
            };
            let k = buf.len().min(rest.len());
            buf[..k].copy_from_slice(&rest[..k]);
            self.note_fed(c, &rest[..k]);
            let alive = self.core.received(LinkId(l), k, now);
            rest = &rest[k..];
            if !alive {
                self.closing.push(c);
                break;
            }
        }
    }

    /// Feed `bytes` in one read, or (s != 0) in two with a turn of the loop between.
    fn feed_split(&mut self, l: usize, bytes: &[u8], s: u8) {
        if s == 0 || bytes.len() < 2 {
            self.feed(l, bytes);
            return;
        }
        let at = 1 + (s as usize - 1) % (bytes.len() - 1);
        let c = self.link[l];
        self.feed(l, &bytes[..at]);
        self.cycle();
        if self.link[l] == c {
            self.feed(l, &bytes[at..]);
        }
    }

    // ---- What the client wrote ---------------------------------------------------------

    fn parse_wire(&mut self, c: usize) {
        loop {
            let conn = &self.conns[c];
            let buf = &conn.wire[conn.wire_at..];
            let (args, used) = match resp::parse(buf, &WIRE_LIMITS) {
                Ok(Status::Complete((Frame::Aggregate(a), used)))
                    if a.kind() == AggregateKind::Array && !a.is_empty() =>
                {
                    let args: Option<Vec<Vec<u8>>> = a
                        .iter()
                        .map(|f| match f {
                            Frame::Bulk(b) => Some(b.to_vec()),
                            _ => None,
                        })
                        .collect();
                    match args {
                        Some(args) => (args, used),
                        None => panic!(
                            "link {} wrote an array that is not all bulk strings: {:?}",
                            conn.link,
                            lossy(&buf[..used])
                        ),
                    }
                }
                Ok(Status::Partial(_)) => return,
                Ok(Status::Complete((f, _))) => panic!(
                    "link {} wrote {f:?}, not a command (an array of bulk strings)",
                    conn.link
                ),
                Err(e) => panic!(
                    "link {} wrote bytes that are not a RESP command ({e:?}): {:?}",
                    conn.link,
                    lossy(buf)
                ),
            };
            self.conns[c].wire_at += used;
            if self.trace {
                eprintln!("  link {} writes {}", self.conns[c].link, show(&args));
            }
            if self.conns[c].link < self.n {
                self.check_lock_command(c, &args);
            } else {
                self.check_sub_command(c, &args);
            }
            self.conns[c].cmds.push(args);
        }
    }

    fn check_lock_command(&mut self, c: usize, args: &[Vec<u8>]) {
        let conn = &self.conns[c];
        let (master, k) = (conn.link, conn.cmds.len());
        if let Some(want) = self.handshake.get(k) {
            assert!(
                args == &want[..],
                "master {master}: command {k} of a connection is {:?}, the handshake says {:?}",
                show(args),
                show(want)
            );
            return;
        }
        let gate = usize::from(self.cfg.password) + usize::from(self.cfg.db);
        assert!(
            conn.replies.len() >= gate,
            "master {master}: request {:?} written before AUTH/SELECT was answered",
            show(args)
        );
        let ttl_ms = self.cfg.ttl.as_millis().to_string().into_bytes();
        let ttl2_ms = self.cfg.ttl2.as_millis().to_string().into_bytes();
        let is_resource = |k: &Vec<u8>| RESOURCES.contains(&&k[..]);
        let distinct = |ks: &[Vec<u8>]| ks.iter().collect::<HashSet<_>>().len() == ks.len();
        let name = args[0].to_ascii_uppercase();
        let mut acquire_token: Option<Vec<u8>> = None;
        if name == b"SET" {
            assert!(
                args.len() == 6
                    && is_resource(&args[1])
                    && args[2].len() == 32
                    && args[3] == b"NX"
                    && args[4] == b"PX"
                    && args[5] == ttl_ms,
                "master {master}: bad SET {:?} (ttl {ttl_ms:?})",
                show(args)
            );
            acquire_token = Some(args[2].clone());
        } else if let Some((s, eval)) = script_of(args) {
            let Some((keys, argv)) = keys_args(args) else {
                panic!("master {master}: bad key count in {:?}", show(args))
            };
            let token_ok = argv.first().is_some_and(|t| t.len() == 32);
            assert!(token_ok, "master {master}: no token in {:?}", show(args));
            // The keys a script declares beside each lock key (`scripts::aux_key`), after
            // the lock keys: kinds in order, each for every lock key.
            let beside = |lock_keys: &[Vec<u8>], rest: &[Vec<u8>], kinds: &[&[u8]]| {
                rest.len() == lock_keys.len() * kinds.len()
                    && rest
                        .chunks(lock_keys.len().max(1))
                        .zip(kinds)
                        .all(|(names, kind)| {
                            names.iter().zip(lock_keys).all(|(name, k)| {
                                if *kind == scripts::OLD_FENCE_PREFIX {
                                    name.strip_prefix(scripts::OLD_FENCE_PREFIX) == Some(&k[..])
                                } else {
                                    *name == scripts::aux_key(kind, k)
                                }
                            })
                        })
            };
            if s == scripts::FENCE_DRAW || s == scripts::FENCE_RAISE {
                assert!(self.cfg.fencing, "fencing script without fencing");
                let n = keys.len() / 3;
                let (lock_keys, rest) = keys.split_at(n);
                let fenced = keys.len() % 3 == 0
                    && n > 0
                    && lock_keys.iter().all(is_resource)
                    && distinct(lock_keys)
                    && beside(
                        lock_keys,
                        rest,
                        &[scripts::FENCE, scripts::OLD_FENCE_PREFIX],
                    );
                assert!(fenced, "master {master}: bad fencing keys {:?}", show(args));
                let count = argv.last().map(|c| c == n.to_string().as_bytes());
                if s == scripts::FENCE_DRAW {
                    assert!(
                        argv.len() == 2 && count == Some(true),
                        "FENCE_DRAW args: {:?}",
                        show(args)
                    );
                } else {
                    let value: Option<u64> = argv
                        .get(1)
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
                    assert!(
                        argv.len() == 3 && value.is_some_and(|v| v >= 1) && count == Some(true),
                        "FENCE_RAISE args: {:?}",
                        show(args)
                    );
                }
            } else {
                // A release that leaves a line declares each key's line and liveness set;
                // a waiting acquire of one key in line, its line and liveness set.
                // (The lean release, and the plain release, a fallback, declare the lock
                // keys alone.)
                let kinds: &[&[u8]] =
                    if s == scripts::RELEASE || (s == scripts::ACQUIRE_WAIT && argv.len() > 2) {
                        &[scripts::QUEUE, scripts::ALIVE]
                    } else {
                        &[]
                    };
                let n = keys.len() / (1 + kinds.len());
                let (keys, rest) = keys.split_at(n);
                assert!(
                    !keys.is_empty()
                        && keys.iter().all(is_resource)
                        && distinct(keys)
                        && beside(keys, rest, kinds),
                    "master {master}: bad keys in {:?}",
                    show(args)
                );
                if s == scripts::RELEASE {
                    // The full release: a lock that leaves a line, or keys whose lines
                    // are not named after them (a `}` in the name).
                    assert!(
                        (argv.len() == 2 && argv[1].len() == 16)
                            || (argv.len() == 1
                                && !keys.iter().all(|k| scripts::lines_named_by_key(k))),
                        "RELEASE args: {:?}",
                        show(args)
                    );
                } else if s == scripts::RELEASE_LEAN {
                    assert!(
                        argv.len() == 1 && keys.iter().all(|k| scripts::lines_named_by_key(k)),
                        "RELEASE_LEAN args: {:?}",
                        show(args)
                    );
                } else if s == scripts::RELEASE_PLAIN {
                    // After a release refused with an error (-NOPERM for its lines' keys).
                    assert!(argv.len() == 1, "RELEASE_PLAIN args: {:?}", show(args));
                    assert!(
                        self.conns[c].errors > 0,
                        "master {master}: a plain release without a refused release before it"
                    );
                } else if s == scripts::EXTEND {
                    assert!(
                        argv.len() == 2 && argv[1] == ttl2_ms,
                        "EXTEND args (ttl {ttl2_ms:?}): {:?}",
                        show(args)
                    );
                } else if s == scripts::ACQUIRE_MANY {
                    assert!(
                        argv.len() == 2 && argv[1] == ttl_ms,
                        "ACQUIRE_MANY args: {:?}",
                        show(args)
                    );
                    acquire_token = Some(argv[0].clone());
                } else if s == scripts::ACQUIRE_WAIT {
                    // Sent again out of any line (`EVAL`, no line arguments) after a -NOPERM.
                    let out_of_line = eval && argv.len() == 2 && self.conns[c].errors > 0;
                    let line = !self.cfg.poll && keys.len() == 1 && !out_of_line;
                    // A waiter out of line (its last attempt could not reach a quorum) adds
                    // `o` (issue 19 item 1); one in line may add what it expects, `h` (the
                    // key held) or `l` (its place in line), which orders the script's
                    // commands only (issue 23).
                    let seventh =
                        line && argv.len() == 7 && matches!(argv[6].as_slice(), b"o" | b"h" | b"l");
                    assert!(
                        (argv.len() == if line { 6 } else { 2 } || seventh) && argv[1] == ttl_ms,
                        "ACQUIRE_WAIT args (a line: {line}): {:?}",
                        show(args)
                    );
                    if line {
                        self.check_line(argv);
                    }
                    acquire_token = Some(argv[0].clone());
                }
            }
            // The fallbacks after an error are `EVAL`s of their own (not -NOSCRIPT retries).
            let fallback = s == scripts::RELEASE_PLAIN
                || (s == scripts::ACQUIRE_WAIT && argv.len() == 2 && self.conns[c].errors > 0);
            if eval && !fallback {
                let conn = &mut self.conns[c];
                conn.evals += 1;
                assert!(
                    conn.evals <= conn.noscripts,
                    "master {master}: EVAL without a -NOSCRIPT before it on the connection"
                );
            }
        } else {
            panic!("master {master}: unexpected request {:?}", show(args));
        }
        if let Some(token) = acquire_token {
            if !self.acquired.insert((master, token.clone())) {
                let conn = &self.conns[c];
                // A -NOSCRIPT retry, or a waiting acquire sent again out of line after an
                // error (-NOPERM).
                let retry = conn.cmds.iter().zip(&conn.replies).any(|(cmd, r)| {
                    acquire_may_hold(cmd, Some(r)).is_some_and(|(t, _)| t == &token[..])
                        && matches!(r, Reply::Err { .. })
                });
                assert!(
                    retry,
                    "master {master}: acquire token {} sent twice (not as a retry after an error)",
                    lossy(&token)
                );
            }
            self.last_token = Some(token);
        }
    }

    /// An `ACQUIRE_WAIT` with a place in line: token, ttl, id, liveness, polite, score.
    fn check_line(&mut self, argv: &[Vec<u8>]) {
        let id = &argv[2];
        assert_eq!(id.len(), 16, "waiter id {:?}", lossy(id));
        self.note_client(&id[..8]);
        let alive: Option<u64> = std::str::from_utf8(&argv[3])
            .ok()
            .and_then(|v| v.parse().ok());
        let sleep = (self.cfg.retry_delay + self.cfg.retry_jitter).as_millis() as u64;
        assert!(
            alive.is_some_and(|a| a >= sleep),
            "a waiter's liveness {:?} ms is shorter than its sleep ({sleep} ms): it drops out of line",
            lossy(&argv[3])
        );
        let polite: &[u8] = if self.cfg.fairness { b"p" } else { b"" };
        assert_eq!(
            argv[4], polite,
            "polite flag with fairness {}",
            self.cfg.fairness
        );
        let score: Option<u64> = std::str::from_utf8(&argv[5])
            .ok()
            .and_then(|v| v.parse().ok());
        assert!(score.is_some(), "score {:?}", lossy(&argv[5]));
        if !self.waiters.contains(id) {
            self.waiters.push(id.clone());
        }
    }

    fn note_client(&mut self, id: &[u8]) {
        match &self.client_id {
            Some(known) => assert_eq!(
                &known[..],
                id,
                "two client ids: {:?} and {:?}",
                lossy(known),
                lossy(id)
            ),
            None => self.client_id = Some(id.to_vec()),
        }
    }

    fn check_sub_command(&mut self, c: usize, args: &[Vec<u8>]) {
        let conn = &self.conns[c];
        let (master, k) = (conn.link - self.n, conn.cmds.len());
        if k == 0 && self.cfg.password {
            let want = &self.handshake[0];
            assert!(
                args == &want[..],
                "master {master}'s sub link starts with {:?}, not {:?}",
                show(args),
                show(want)
            );
            return;
        }
        let name = args[0].to_ascii_uppercase();
        assert!(
            (name == b"SUBSCRIBE" || name == b"UNSUBSCRIBE") && args.len() == 2,
            "master {master}'s sub link wrote {:?}",
            show(args)
        );
        let ch = &args[1];
        if let Some(key) = ch.strip_prefix(scripts::RELEASED_PREFIX) {
            assert!(
                RESOURCES.contains(&key),
                "channel of an unknown resource: {:?}",
                lossy(ch)
            );
        } else if let Some(client) = ch.strip_prefix(scripts::NEXT_PREFIX) {
            assert_eq!(client.len(), 8, "client channel {:?}", lossy(ch));
            self.note_client(client);
        } else {
            panic!("master {master}'s sub link subscribes to {:?}", lossy(ch));
        }
    }

    // ---- What the masters sent ---------------------------------------------------------

    fn note_fed(&mut self, c: usize, bytes: &[u8]) {
        let sub = self.conns[c].link >= self.n;
        if self.trace {
            eprintln!("  link {} reads {:?}", self.conns[c].link, lossy(bytes));
        }
        let us = self.us;
        let conn = &mut self.conns[c];
        conn.fed.extend_from_slice(bytes);
        while !conn.broken {
            match resp::parse(&conn.fed[conn.fed_at..], &CORE_LIMITS) {
                Ok(Status::Complete((f, used))) => {
                    if sub && is_message(&f) {
                        conn.messages += 1;
                    } else {
                        let r = classify_reply(&f);
                        if r == (Reply::Err { noscript: true }) {
                            conn.noscripts += 1;
                        } else if r == (Reply::Err { noscript: false }) {
                            conn.errors += 1;
                        }
                        conn.replies.push(r);
                        conn.reply_at.push(us);
                    }
                    conn.fed_at += used;
                }
                Ok(Status::Partial(_)) => break,
                Err(_) => conn.broken = true,
            }
        }
    }

    /// What master `l % n` answers, in `mood`, to the next `count` (0: all) commands it
    /// owes on link `l`.
    fn owed_answers(&mut self, l: usize, mood: u8, count: usize) -> Vec<u8> {
        let Some(c) = self.link[l] else {
            return Vec::new();
        };
        let conn = &self.conns[c];
        let from = conn.replies.len().min(conn.cmds.len());
        let to = if count == 0 {
            conn.cmds.len()
        } else {
            conn.cmds.len().min(from + count)
        };
        let owed: Vec<Vec<Vec<u8>>> = conn.cmds[from..to].to_vec();
        let mut out = Vec::new();
        for cmd in &owed {
            self.answer(&mut out, l % self.n, cmd, mood % 8);
        }
        out
    }

    fn answer(&mut self, out: &mut Vec<u8>, master: usize, c: &[Vec<u8>], mood: u8) {
        let name = c[0].to_ascii_uppercase();
        let arg = |i: usize| c.get(i).map_or(&[][..], |a| &a[..]);
        match &name[..] {
            b"AUTH" | b"SELECT" => match mood {
                3 => resp_err(out, "ERR fuzz"),
                7 if name == b"AUTH" => resp_err(out, "WRONGPASS invalid username-password pair"),
                7 => resp_err(out, "ERR DB index is out of range"),
                _ => out.extend_from_slice(b"+OK\r\n"),
            },
            b"SCRIPT" => match (
                mood,
                scripts::ALL.iter().find(|s| s.src.as_bytes() == arg(2)),
            ) {
                (3, _) | (_, None) => resp_err(out, "ERR fuzz"),
                (7, _) => resp_bulk(out, &[b'0'; 40]),
                (_, Some(s)) => resp_bulk(out, s.sha.as_bytes()),
            },
            b"INFO" => match mood {
                3 => resp_err(out, "ERR fuzz"),
                4 => resp_info(out, master + 1, 0),
                5 => resp_info(out, 99, 100_000_000),
                7 => resp_bulk(out, b"hello"),
                _ => resp_info(out, master + 1, 100_000_000),
            },
            b"CONFIG" => match mood {
                3 => resp_err(out, "ERR fuzz"),
                5 => out.extend_from_slice(b"*0\r\n"),
                6 => resp_err(out, "NOPERM this user has no permissions to run 'config'"),
                _ => resp_config(out, true),
            },
            b"SUBSCRIBE" => match mood {
                1 => resp_err(
                    out,
                    "NOPERM this user has no permissions to access one of the channels",
                ),
                3 => resp_err(out, "ERR fuzz"),
                _ => resp_confirm(out, b"subscribe", arg(1), 1),
            },
            b"UNSUBSCRIBE" => resp_confirm(out, b"unsubscribe", arg(1), 0),
            b"SET" => match mood {
                1 => out.extend_from_slice(b"$-1\r\n"),
                3 => resp_err(out, "ERR fuzz"),
                5 => out.extend_from_slice(b"_\r\n"),
                7 => resp_int(out, 5000),
                _ => out.extend_from_slice(b"+OK\r\n"),
            },
            _ => {
                let Some((s, eval)) = script_of(c) else {
                    return resp_err(out, "ERR unknown command");
                };
                let nkeys = keys_args(c).map_or(0, |(k, _)| k.len());
                if mood == 2 && !eval {
                    return resp_err(out, "NOSCRIPT No matching script. Please use EVAL.");
                }
                if mood == 3 {
                    return resp_err(out, "ERR fuzz");
                }
                if s == scripts::RELEASE || s == scripts::RELEASE_LEAN || s == scripts::EXTEND {
                    resp_int(out, [1, 0, 1, 1, 1, 1, 1, 5000][mood as usize]);
                } else if s == scripts::ACQUIRE_MANY {
                    resp_int(out, i64::from(mood != 1));
                } else if s == scripts::ACQUIRE_WAIT {
                    match (mood, nkeys) {
                        (1, 1) => resp_holder(out, 150, HOLDER),
                        (1, _) => resp_int(out, 150),
                        (4, _) => resp_int(out, -1),
                        (6, 1) => resp_holder(out, 5000, HOLDER),
                        (6 | 7, _) => resp_int(out, 5000),
                        _ => resp_int(out, 0),
                    }
                } else if s == scripts::FENCE_DRAW {
                    if mood == 1 {
                        resp_int(out, 0);
                    } else {
                        self.draws += 1;
                        resp_int(out, self.draws);
                    }
                } else {
                    resp_int(out, i64::from(mood != 1));
                }
            }
        }
    }

    /// Canned reply `r` (see the table at the top) for link `l`.
    fn canned(&self, r: u8, l: usize) -> Vec<u8> {
        let (kind, p) = (r % 32, (r / 32) as usize);
        let master = l % self.n;
        let mut out = Vec::new();
        let res = RESOURCES[p % 3];
        let released = |key: &[u8]| [scripts::RELEASED_PREFIX, key].concat();
        match kind {
            0 => out.extend_from_slice(b"+OK\r\n"),
            1 => out.extend_from_slice(b"$-1\r\n"),
            2 => out.extend_from_slice(b"_\r\n"),
            3 => resp_int(&mut out, 0),
            4 => resp_int(&mut out, 1),
            5 => resp_int(&mut out, -1),
            6 => resp_int(&mut out, 5000),
            7 => resp_holder(&mut out, 100, &HOLDER[..16]),
            8 => resp_err(&mut out, "NOSCRIPT No matching script. Please use EVAL."),
            9 => resp_err(&mut out, "ERR fuzz"),
            10 => resp_err(
                &mut out,
                "NOPERM this user has no permissions to access one of the channels",
            ),
            11 => resp_err(&mut out, "WRONGPASS invalid username-password pair"),
            12 => resp_bulk(
                &mut out,
                scripts::ALL[p % scripts::ALL.len()].sha.as_bytes(),
            ),
            13 => resp_info(&mut out, master + 1, 100_000_000),
            14 => resp_info(&mut out, master + 1, 0),
            15 => resp_info(&mut out, 99, 100_000_000),
            16 => resp_bulk(&mut out, b"# Server\r\nredis_version:7.0.15\r\n"),
            17 => resp_config(&mut out, true),
            18 => resp_config(&mut out, false),
            19 => resp_confirm(&mut out, b"subscribe", &released(res), 1),
            20 => resp_confirm(&mut out, b"unsubscribe", &released(res), 0),
            21 => resp_message(&mut out, &released(res), HOLDER),
            22 => {
                let token = self.last_token.as_deref().unwrap_or(HOLDER);
                resp_message(&mut out, &released(res), token);
            }
            23 => {
                let client = self.client_id.as_deref().unwrap_or(b"00000000");
                let channel = [scripts::NEXT_PREFIX, client].concat();
                let waiter = match self.waiters.len() {
                    0 => &b"0000000000000000"[..],
                    k => &self.waiters[p % k][..],
                };
                resp_message(&mut out, &channel, &[&HOLDER[..16], waiter].concat());
            }
            24 => resp_message(&mut out, b"news", b"hello"),
            25 => resp_int(&mut out, 2),
            26 => resp_bulk(&mut out, &[b'0'; 40]),
            27 => out.extend_from_slice(b"+QUEUED\r\n"),
            28 => resp_holder(&mut out, -1, HOLDER),
            29 => out.extend_from_slice(b"*3\r\n:1\r\n:2\r\n:3\r\n"),
            30 => out.extend_from_slice(b"*-1\r\n"),
            _ => resp_int(&mut out, i64::MAX),
        }
        out
    }

    // ---- Votes ----------------------------------------------------------------------------

    /// Every reply read so far answers a command already written (none was read ahead of
    /// its command): the votes for a token are all visible.
    fn replies_known(&self) -> bool {
        self.conns.iter().all(|c| c.replies.len() <= c.cmds.len())
    }

    /// Whether the core counts a yes to a grant read as reply `k` of lock connection `c`:
    /// with the amnesia guard, only once the master has been up for `max_ttl` by its
    /// `INFO` (less one second); with fencing (not assumed durable), only if `CONFIG GET`
    /// said durable.
    fn counted(&self, c: &Conn, k: usize) -> bool {
        let at = |name: &[u8]| self.handshake.iter().position(|h| h[0] == name);
        if let Some(guard) = self.cfg.amnesia {
            let Some(j) = at(b"INFO") else { return false };
            let Some(Reply::Info { uptime }) = c.replies.get(j) else {
                return false;
            };
            let up = Duration::from_secs(uptime.saturating_sub(1));
            let wait = u64::try_from(guard.saturating_sub(up).as_micros()).unwrap_or(u64::MAX);
            if c.reply_at[k] < c.reply_at[j].saturating_add(wait) {
                return false;
            }
        }
        if self.cfg.fencing && !self.cfg.assume_durable {
            let Some(j) = at(b"CONFIG") else { return false };
            if c.replies.get(j) != Some(&Reply::Pairs { durable: true }) {
                return false;
            }
        }
        true
    }

    /// The masters that gave a yes `vote` for `token` read at `since` or later (counted by
    /// the core, when `grant`).
    fn yes_votes(&self, vote: Vote, token: &[u8], since: u64, grant: bool) -> usize {
        let mut masters = HashSet::new();
        for c in self.conns.iter().filter(|c| c.link < self.n) {
            for (k, cmd) in c.cmds.iter().enumerate() {
                let Some(&r) = c.replies.get(k) else { break };
                if c.reply_at[k] >= since
                    && yes_vote(cmd, r) == Some((vote, token))
                    && (!grant || self.counted(c, k))
                {
                    masters.insert(c.link);
                }
            }
        }
        masters.len()
    }

    // ---- Results -------------------------------------------------------------------------

    fn check_tasks(&mut self) {
        let now = self.now();
        for i in 0..self.tasks.len() {
            let id = self.tasks[i].id;
            if self.tasks[i].taken {
                assert!(
                    !self.core.is_done(id),
                    "task {i} is done again after its result was taken"
                );
                continue;
            }
            if !self.core.is_done(id) {
                continue;
            }
            let result = self.core.take(id);
            if self.trace {
                eprintln!("  task {i} done: {result:?}");
            }
            self.tasks[i].taken = true;
            assert!(
                !self.core.is_done(id),
                "task {i} still done after its result was taken"
            );
            self.check_result(i, result, now);
        }
        self.check_timeliness(now);
    }

    /// The latest a task can still be running at, where one timer ends it whatever the
    /// time did before: a release or extend is one round (its timeout is at most the node
    /// timeout, default 50 ms); a lock call with a deadline ends by it (its rounds are cut
    /// short at it, its sleeps end before it); a `try_lock` without fencing is one round.
    /// `None` for chains of timers (fencing rounds, retries): after a jump of the time each
    /// link starts late, as it would for a driver that slept too long.
    fn latest(&self, t: &TaskRec) -> Option<Instant> {
        let round = self.cfg.node_timeout.unwrap_or(ms(50));
        match &t.kind {
            Kind::Release { .. } | Kind::Extend { .. } => Some(t.at + round),
            Kind::Lock {
                deadline: Some(d), ..
            } => Some(*d),
            Kind::Lock { retries: 0, .. } if !self.cfg.fencing => Some(t.at + round),
            Kind::Lock { .. } => None,
        }
    }

    /// No task runs past its latest end ([`Sim::latest`]): its timers fired. (Unless a
    /// timer is due right now, e.g. a retry delay of 0: the driver steps again at once.)
    fn check_timeliness(&self, now: Instant) {
        if self.core.next_timer(None).is_some_and(|t| t <= now) {
            return;
        }
        for (i, t) in self.tasks.iter().enumerate() {
            if t.taken {
                continue;
            }
            if let Some(latest) = self.latest(t) {
                assert!(
                    now <= latest,
                    "task {i} ({:?}) still runs {:?} after it must have ended",
                    t.kind,
                    now - latest
                );
            }
        }
    }

    fn check_report(&self, r: &Report, what: &str) {
        assert_eq!(r.outcomes().count(), self.n, "{what}: report of {r}");
        assert_eq!(r.quorum(), rules::quorum(self.n), "{what}: report of {r}");
        assert!(r.attempts() >= 1, "{what}: report of {r}");
        assert!(
            r.total() >= r.elapsed(),
            "{what}: the call's total {:?} is shorter than its last round {:?}",
            r.total(),
            r.elapsed()
        );
    }

    fn check_result(&mut self, i: usize, result: Result<Done, Error>, now: Instant) {
        let t = &self.tasks[i];
        let quorum = rules::quorum(self.n);
        let has = |r: &Report, o: Outcome| r.outcomes().any(|(_, x)| x == o);
        match (&t.kind, result) {
            (
                Kind::Lock {
                    keys,
                    deadline,
                    retries,
                },
                Ok(Done::Locked(lock)),
            ) => {
                assert!(!t.cancelled, "task {i}: granted after it was cancelled");
                let (ttl, minv) = (self.cfg.ttl, self.cfg.min_validity);
                assert_eq!(lock.ttl(), ttl, "task {i}: the lock's ttl");
                let resources: Vec<&[u8]> = lock.resources().collect();
                let asked: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                assert_eq!(resources, asked, "task {i}: the lock's resources");
                assert_eq!(
                    lock.fencing_token().is_some(),
                    self.cfg.fencing,
                    "task {i}: fencing token {:?} with fencing {}",
                    lock.fencing_token(),
                    self.cfg.fencing
                );
                assert!(
                    lock.fencing_token().is_none_or(|f| f >= 1),
                    "task {i}: fencing token 0"
                );
                let drift = rules::drift(ttl, self.cfg.drift_factor);
                let span = lock
                    .valid_until()
                    .checked_duration_since(lock.acquired_at());
                assert!(
                    span.is_some_and(|s| s <= ttl - drift),
                    "task {i}: valid_until - acquired_at = {span:?} > ttl - drift = {:?}",
                    ttl - drift
                );
                assert_eq!(
                    span,
                    Some(ttl - drift),
                    "task {i}: validity is not counted from the attempt's start"
                );
                assert!(
                    lock.acquired_at() >= t.at && lock.acquired_at() <= now,
                    "task {i}: acquired_at outside the task's life"
                );
                let left = lock.valid_until().saturating_duration_since(now);
                assert!(
                    left > minv,
                    "task {i}: handed out with {left:?} of validity, not above the minimum {minv:?}"
                );
                if let Some(d) = deadline {
                    assert!(
                        now <= *d,
                        "task {i}: granted {:?} after its deadline",
                        now - *d
                    );
                }
                let attempts = lock.attempts();
                self.check_attempts(i, attempts, *retries, deadline.is_some());
                let token = lock.token().as_bytes().to_vec();
                if self.replies_known() {
                    let since = self.tasks[i].at;
                    let since = u64::try_from((since - self.base).as_micros()).unwrap_or(0);
                    let votes = |v| self.yes_votes(v, &token, since, true);
                    let acquired = votes(Vote::Acquire);
                    assert!(
                        acquired >= quorum,
                        "task {i}: granted with {acquired} counted yes votes of {} (quorum \
                         {quorum})",
                        self.n
                    );
                    if self.cfg.fencing {
                        let (drawn, raised) = (votes(Vote::Draw), votes(Vote::Raise));
                        assert!(
                            drawn >= quorum && raised >= quorum,
                            "task {i}: fenced with {drawn} draws and {raised} write-backs"
                        );
                    }
                }
                if let Some(f) = lock.fencing_token() {
                    self.fences.push((token.clone(), f));
                }
                assert!(
                    self.granted.insert(token),
                    "task {i}: a token granted twice"
                );
                self.held.push(lock);
            }
            (
                Kind::Lock {
                    deadline, retries, ..
                },
                Err(e),
            ) => {
                let what = format!("lock task {i}: {e}");
                match &e {
                    Error::Cancelled => assert!(t.cancelled, "{what}: never cancelled"),
                    Error::DeadlineExceeded(r) => {
                        let Some(d) = deadline else {
                            panic!("{what}: no deadline was given")
                        };
                        assert!(now + ms(1) >= *d, "{what}: {:?} before it", *d - now);
                        if let Some(r) = r {
                            self.check_report(r, &what);
                        }
                    }
                    Error::Taken(r) => {
                        self.check_report(r, &what);
                        assert!(r.ok() < quorum && has(r, Outcome::Taken), "{what}");
                    }
                    Error::NoQuorum(r) => {
                        self.check_report(r, &what);
                        assert!(r.ok() < quorum && !has(r, Outcome::Taken), "{what}");
                    }
                    Error::ValidityUsedUp(r) => {
                        self.check_report(r, &what);
                        assert!(r.ok() >= quorum, "{what}");
                    }
                    Error::Refused(r) => {
                        self.check_report(r, &what);
                        let refused = r
                            .outcomes()
                            .filter(
                                |(_, o)| matches!(o, Outcome::Failed(f) if f.is_configuration()),
                            )
                            .count();
                        assert!(refused > self.n - quorum, "{what}");
                    }
                    _ => panic!("{what}: not an error a lock call gives"),
                }
                if let Some(r) = e.report() {
                    if !matches!(e, Error::DeadlineExceeded(_)) {
                        self.check_attempts(i, r.attempts(), *retries, deadline.is_some());
                    }
                }
            }
            (Kind::Release { token }, Ok(Done::Released)) => {
                if self.replies_known() {
                    let since = u64::try_from((t.at - self.base).as_micros()).unwrap_or(0);
                    let released = self.yes_votes(Vote::Release, token, since, false);
                    assert!(
                        released >= quorum,
                        "release task {i}: released with {released} yes votes"
                    );
                }
            }
            (Kind::Release { .. }, Err(e)) => {
                let what = format!("release task {i}: {e}");
                match &e {
                    Error::NotHeld(r) => {
                        self.check_report(r, &what);
                        assert!(has(r, Outcome::NotHeld) && r.ok() < quorum, "{what}");
                    }
                    Error::NoQuorum(r) => {
                        self.check_report(r, &what);
                        assert!(!has(r, Outcome::NotHeld) && r.ok() < quorum, "{what}");
                    }
                    _ => panic!("{what}: not an error a release gives"),
                }
            }
            (Kind::Extend { token, old, ttl }, result) => {
                let expired = t.at >= *old;
                match result {
                    Ok(Done::Extended {
                        valid_until,
                        ttl: got,
                    }) => {
                        assert!(
                            !expired,
                            "extend task {i}: extended a lock that had expired"
                        );
                        assert_eq!(got, *ttl, "extend task {i}: the TTL");
                        let fresh = t.at + *ttl - rules::drift(*ttl, self.cfg.drift_factor);
                        assert_eq!(
                            valid_until,
                            (*old).max(fresh),
                            "extend task {i}: the new deadline"
                        );
                        if valid_until > *old {
                            let left = valid_until.saturating_duration_since(now);
                            assert!(
                                left > self.cfg.min_validity,
                                "extend task {i}: {left:?} left"
                            );
                        }
                        let (token, ttl) = (token.clone(), *ttl);
                        if let Some(lock) = self
                            .held
                            .iter_mut()
                            .find(|l| l.token().as_bytes() == &token[..])
                        {
                            lock.extended(valid_until, ttl);
                        }
                    }
                    Err(e) => {
                        let what = format!("extend task {i}: {e}");
                        match &e {
                            Error::Expired => assert!(expired, "{what}: the lock was valid"),
                            Error::NotHeld(r) => {
                                self.check_report(r, &what);
                                assert!(has(r, Outcome::NotHeld) && r.ok() < quorum, "{what}");
                            }
                            Error::NoQuorum(r) => {
                                self.check_report(r, &what);
                                assert!(!has(r, Outcome::NotHeld) && r.ok() < quorum, "{what}");
                            }
                            Error::ValidityUsedUp(r) => {
                                self.check_report(r, &what);
                                assert!(r.ok() >= quorum, "{what}");
                            }
                            _ => panic!("{what}: not an error an extend gives"),
                        }
                        assert!(
                            !expired || matches!(e, Error::Expired),
                            "{what}: asked past the lock's validity, not Expired"
                        );
                    }
                    Ok(other) => panic!("extend task {i} ended with {other:?}"),
                }
            }
            (kind, other) => panic!("task {i} ({kind:?}) ended with {other:?}"),
        }
    }

    /// A `try_lock` makes one attempt; a poll-mode call at most one plus its retries.
    fn check_attempts(&self, i: usize, attempts: u32, retries: u32, deadline: bool) {
        if retries == 0 && !deadline {
            assert_eq!(attempts, 1, "task {i}: a try_lock made {attempts} attempts");
        }
        if self.cfg.poll && !deadline {
            assert!(
                attempts <= retries + 1,
                "task {i}: {attempts} attempts in poll mode with {retries} retries"
            );
        }
    }

    fn all_done(&self) -> bool {
        self.tasks.iter().all(|t| t.taken)
    }

    fn undone(&self) -> String {
        let now = self.now();
        self.tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.taken)
            .map(|(i, t)| {
                format!(
                    "task {i} {:?} submitted {:?} ago",
                    t.kind,
                    now.saturating_duration_since(t.at)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    // ---- The end ---------------------------------------------------------------------------

    fn finish(&mut self) {
        // Everything queued goes out.
        self.cap = 0;
        self.cycle();
        if self.cfg.graceful {
            self.graceful();
        }
        self.liveness();
        self.quiescence();
        self.check_stats();
    }

    /// Cancel every lock call, run the timers with the connections open: everything ends,
    /// and every attempt that may hold a key was released where it may hold it.
    fn graceful(&mut self) {
        let now = self.now();
        for t in self.tasks.iter_mut() {
            if !t.taken && matches!(t.kind, Kind::Lock { .. }) {
                self.core.cancel(t.id, now);
                t.cancelled = true;
            }
        }
        self.cycle();
        for _ in 0..256 {
            if self.all_done() {
                break;
            }
            let Some(t) = self.core.next_timer(None) else {
                break;
            };
            let now = self.now();
            self.advance(
                t.saturating_duration_since(now)
                    .max(Duration::from_micros(1)),
            );
            self.cycle();
        }
        assert!(
            self.all_done(),
            "cancelled calls did not end with the connections open: {}",
            self.undone()
        );
        for conn in self.conns.iter().filter(|c| c.open && c.link < self.n) {
            for (k, cmd) in conn.cmds.iter().enumerate() {
                let Some((token, may)) = acquire_may_hold(cmd, conn.replies.get(k)) else {
                    continue;
                };
                if !may || self.granted.contains(token) {
                    continue;
                }
                let released = conn.cmds[k + 1..]
                    .iter()
                    .any(|c| release_token(c) == Some(token));
                assert!(
                    released,
                    "master {}: acquire {k} ({}) may have set a key (reply {:?}) and was not \
                     granted, but no release of its token followed on the connection",
                    conn.link,
                    show(cmd),
                    conn.replies.get(k)
                );
            }
        }
        self.check_lines_left();
    }

    /// Every waiter that stood in a resource's line (an `ACQUIRE_WAIT` with a place) and is
    /// not a lock still held left the line: a release naming it (`ARGV[2]`) follows its
    /// last attempt on every connection still open.
    fn check_lines_left(&self) {
        if !self.replies_known() {
            return;
        }
        let line = |c: &[Vec<u8>]| -> Option<(Vec<u8>, Vec<u8>)> {
            let (s, _) = script_of(c)?;
            let (_, argv) = keys_args(c)?;
            let in_line =
                argv.len() == 6 || (argv.len() == 7 && matches!(argv[6].as_slice(), b"h" | b"l"));
            (s == scripts::ACQUIRE_WAIT && in_line).then(|| (argv[0].clone(), argv[2].clone()))
        };
        let held: HashSet<&[u8]> = self.held.iter().map(|l| l.token().as_bytes()).collect();
        let mut staying: HashSet<Vec<u8>> = HashSet::new();
        for c in &self.conns {
            for (token, id) in c.cmds.iter().filter_map(|c| line(c)) {
                if held.contains(&token[..]) {
                    staying.insert(id);
                }
            }
        }
        for c in self.conns.iter().filter(|c| c.open && c.link < self.n) {
            let mut last: Vec<(Vec<u8>, usize)> = Vec::new();
            for (k, cmd) in c.cmds.iter().enumerate() {
                if let Some((_, id)) = line(cmd) {
                    last.retain(|(w, _)| *w != id);
                    last.push((id, k));
                }
                // An attempt out of line (`o`, issue 19 item 1) takes the waiter out.
                if let (Some((s, _)), Some((_, argv))) = (script_of(cmd), keys_args(cmd)) {
                    if s == scripts::ACQUIRE_WAIT && argv.len() == 7 && argv[6] == b"o" {
                        last.retain(|(w, _)| *w != argv[2]);
                    }
                }
            }
            for (id, k) in last {
                if staying.contains(&id) {
                    continue;
                }
                let left = c.cmds[k + 1..].iter().any(|cmd| {
                    release_token(cmd).is_some()
                        && keys_args(cmd).is_some_and(|(_, argv)| argv.get(1) == Some(&id))
                });
                assert!(
                    left,
                    "master {}: waiter {} never left the line after its last attempt ({k})",
                    c.link,
                    lossy(&id)
                );
            }
        }
    }

    /// The time for every task to end with no master reachable: its deadline, its timed
    /// retries (delay and jitter, rounds, connects, stalls, backoffs), channels lingering.
    fn horizon(&self) -> Duration {
        let now = self.now();
        let deadlines = self
            .tasks
            .iter()
            .filter(|t| !t.taken)
            .filter_map(|t| match t.kind {
                Kind::Lock {
                    deadline: Some(d), ..
                } => Some(d.saturating_duration_since(now)),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        let round = self.cfg.node_timeout.unwrap_or(ms(50));
        let per_attempt = self.cfg.retry_delay
            + self.cfg.retry_jitter
            + 3 * round
            + self.cfg.connect_timeout
            + self.cfg.stall_timeout
            + BACKOFF_MAX
            + ms(10);
        deadlines + per_attempt * (self.cfg.retry_count + 3) + LINGER + ms(1000)
    }

    /// Close every link, fail every connect, run the time: every task ends.
    fn liveness(&mut self) {
        self.fail_connects = true;
        for l in 0..2 * self.n {
            self.break_link(l, Fault::Closed(ErrorKind::ConnectionReset));
        }
        self.cycle();
        let horizon = self.horizon();
        let end = self.now() + horizon;
        let step = horizon / 128 + ms(1);
        while !self.all_done() && self.now() <= end {
            self.advance(step);
            self.cycle();
        }
        assert!(
            self.all_done(),
            "hang: tasks not done {horizon:?} after every link closed: {}",
            self.undone()
        );
    }

    /// Nothing left to do: no round, no channel, no timer.
    fn quiescence(&mut self) {
        let gap =
            LINGER + BACKOFF_MAX + self.cfg.connect_timeout + self.cfg.stall_timeout + ms(1000);
        for _ in 0..3 {
            self.advance(gap);
            self.cycle();
        }
        assert!(
            self.core.is_idle(),
            "a round is undecided with every link closed"
        );
        assert!(
            !self.core.listening(),
            "a channel is still held with no task waiting"
        );
        // Releases owed to masters that never came back keep their reconnect timer for
        // as long as the lock's TTL may keep a key there (issue 19 item 8); nothing else
        // may keep one.
        if !self.core.owes_releases() {
            assert_eq!(
                self.core.next_timer(None),
                None,
                "a timer is left with nothing to do"
            );
        }
        assert!(self.core.take_action().is_none(), "an action is left");
    }

    fn check_stats(&self) {
        // A fenced lock's token is what its write-back wrote.
        for c in self.conns.iter().filter(|c| c.link < self.n) {
            for cmd in &c.cmds {
                let Some((s, _)) = script_of(cmd) else {
                    continue;
                };
                let Some((_, argv)) = keys_args(cmd) else {
                    continue;
                };
                if s != scripts::FENCE_RAISE {
                    continue;
                }
                for (token, f) in &self.fences {
                    if argv[0] == *token {
                        assert_eq!(
                            argv[1],
                            f.to_string().into_bytes(),
                            "master {}: the write-back of a lock whose token is {f}",
                            c.link
                        );
                    }
                }
            }
        }
        let stats = self.core.stats();
        assert_eq!(stats.len(), self.n);
        for (i, s) in stats.iter().enumerate() {
            let lock = || self.conns.iter().filter(move |c| c.link == i);
            let sub = || self.conns.iter().filter(move |c| c.link == self.n + i);
            let replies: usize = lock().map(|c| c.replies.len()).sum();
            let noscripts: usize = lock().map(|c| c.noscripts).sum();
            let evals: usize = lock().map(|c| c.evals).sum();
            let messages: usize = sub().map(|c| c.messages).sum();
            assert_eq!(s.connects(), self.connected[i], "master {i}: connects");
            assert_eq!(
                s.subscription_connects(),
                self.sub_connects[i],
                "master {i}: subscription connects"
            );
            let noscript = s.noscript() as usize;
            assert!(
                evals <= noscript && noscript <= noscripts,
                "master {i}: noscript {noscript}, EVALs written {evals}, -NOSCRIPT read {noscripts}"
            );
            assert!(
                s.ok() + s.refused() <= replies as u64,
                "master {i}: {} yes and {} refused of {replies} replies",
                s.ok(),
                s.refused()
            );
            assert!(
                s.latency().count() <= replies as u64,
                "master {i}: {} latencies of {replies} replies",
                s.latency().count()
            );
            assert!(
                s.notifications() <= messages as u64,
                "master {i}: {} notifications of {messages} messages",
                s.notifications()
            );
        }
    }
}

/// Strict property (BUG engine-fuzz-1, found by this target, fixed: a refused attempt on a
/// notice that ran past its planned timed retry plans the next one a retry delay away):
/// `next_timer` is never in the past after a step unless `has_news`. A waiter whose attempt
/// on a notice (or a subscription confirmation) is refused sleeps until the timed retry it
/// had planned before, which may have passed meanwhile: the step returns with that wake-up
/// overdue, and the next step makes that timed attempt at once (two attempts back to back,
/// not a retry delay apart). The driver steps again at once, as for news; the body always
/// checks that the core settles within 64 steps at one instant.
pub const STRICT_TIMERS: u8 = 1;

/// Strict property (BUG engine-fuzz-2, found by this target, fixed: `tick` keeps the timers
/// set during it): while a connect is under way, the core
/// has a timer by its connect timeout. A subscription link that the timer tick reconnects
/// (`Rounds::sub_tick`, after its backoff) gets no timer for its connect timeout: `tick`
/// ends by overwriting `next_due` with what it collected, which drops the one `sub_connect`
/// set. Its connect then times out only when some other timer makes the loop tick.
pub const STRICT_CONNECTS: u8 = 2;

/// The fuzz target body, every property checked. Panics on a property violation.
pub fn engine_body(data: &[u8]) {
    engine_body_with(data, STRICT_TIMERS | STRICT_CONNECTS);
}

/// The body with the strict properties in `strict` ([`STRICT_TIMERS`], [`STRICT_CONNECTS`])
/// checked too.
pub fn engine_body_with(data: &[u8], strict: u8) {
    if data.is_empty() || data.len() > MAX_INPUT {
        return;
    }
    let mut b = Bytes { data, at: 0 };
    let cfg = Cfg::read(&mut b);
    if tracing() {
        eprintln!("{cfg:?}");
    }
    let mut sim = Sim::new(cfg);
    sim.strict = strict;
    while !b.done() {
        sim.event(&mut b);
    }
    sim.finish();
}
