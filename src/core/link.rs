//! One connection's protocol state, without its socket: the byte queues both ways, the
//! requests it still owes answers to, where its connect stands, and the handshake. Every
//! master has two: the *lock link* (rounds) and the *sub link* (release announcements,
//! `chans.rs`). The driver owns the sockets; it moves bytes between them and these queues
//! ([`super::Core::send_buf`], [`super::Core::recv_buf`]) and reports what the sockets did.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::chans::ChanId;
use super::encode::encode_auth;
use super::ops::OpId;
use crate::resp::{self, Arg, Frame};
use crate::rules::{ErrorText, Fault, Request};
use crate::scripts;
use crate::stats::Counters;

pub(super) const INBUF_START: usize = 16 * 1024;

/// A connection of a master: `index < n` is master `index`'s lock link, `n + i` master
/// `i`'s sub link (n masters). The driver keys its sockets by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkId(pub usize);

/// What the driver is asked to do with a link's socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Open a connection (resolve, connect, TLS) and report how it went:
    /// [`super::Core::handle_connected`], [`super::Core::handle_closed`].
    Connect(LinkId),
    /// Close the socket. `reset`: requests were owed, so a TCP connection closes with a reset
    /// rather than a FIN (requests still unread by the master are dropped rather than run
    /// later, behind a cleanup sent on the next connection).
    Close { link: LinkId, reset: bool },
}

/// How far a connect has come (the driver tells): what its timeout means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectPhase {
    /// The host name is being resolved.
    Resolving,
    /// The TCP (or Unix) connect is under way.
    Connecting,
    /// The TLS handshake is under way.
    Tls,
}

/// Where a link's connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Down,
    /// The driver was asked to connect; not confirmed yet.
    Connecting(ConnectPhase),
    Up,
}

/// What a pending request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    /// Part of the connection's handshake.
    Setup(Setup),
    /// A round's request.
    Op { id: OpId, req: Request, eval: bool },
    /// A release round's `DELIFEQ key token` (a master that offers it: see
    /// `Master::delifeq`). `:1` is the master's yes; anything else sends the release's
    /// script after it (`Rounds::delifeq_reply`), whose answer is the master's.
    DelIfEq(OpId),
    /// A sub link's `SUBSCRIBE` of a channel.
    Subscribe(ChanId),
    /// A sub link's `UNSUBSCRIBE`.
    Unsubscribe,
    /// A release sent again on a new connection (the front of `Master::owed`).
    Owed,
    /// Turning client-side tracking on (see `watch.rs`): `HELLO 3`, then
    /// `CLIENT TRACKING ON OPTIN NOLOOP`.
    Track(TrackStep),
    /// `CLIENT CACHING YES` ahead of a watch's read.
    Caching,
    /// A watch's `MGET` of its keys (arms their tracking, and says who holds them).
    Watch(super::watch::WatchId),
}

/// The steps of turning tracking on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TrackStep {
    Hello,
    On,
}

/// Where a lock link's client-side tracking stands (reset with each connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tracking {
    /// Never asked on this connection.
    Off,
    /// `HELLO 3` and `CLIENT TRACKING` are on their way.
    Asked,
    /// The master pushes invalidations on this connection.
    On,
    /// The master can not track (no RESP3 or no tracking, or not allowed to us).
    Refused,
}

/// A release a connection closed before its master answered it (its round may well be
/// decided: a quorum confirmed it elsewhere): sent again on the master's next connection
/// while the lock's keys may still live there, so that a master that fell behind does not
/// keep them for their whole TTL. (A compare-and-delete: harmless where it already ran.)
pub(super) struct Owed {
    pub args: super::ops::OpArgs,
    /// The keys expire by then at the latest (the release's start plus the lock's TTL).
    pub until: Instant,
}

/// The handshake requests written ahead of the first op on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Setup {
    Auth,
    Select,
    ScriptLoad(usize),
    Info,
    /// `CONFIG GET append*` (fencing's durability check).
    Durability,
}

/// One connection's queues and state.
pub(super) struct Link {
    pub state: State,
    pub out: Vec<u8>,
    pub out_pos: usize,
    /// Requests queued for this link that still sit in the rounds' shared buffer, from
    /// this offset on (see `Rounds::shared`); `out` is empty meanwhile.
    pub shared_from: Option<usize>,
    /// While `Some(n)`: the connection's AUTH or SELECT is not confirmed yet, and only the
    /// first `n` bytes of `out` (the handshake) may be written. A request written before a
    /// refused AUTH or SELECT would still run, as another user or in database 0.
    pub gate: Option<usize>,
    /// Bytes were queued while its replies were read (requests behind a confirmed AUTH, an
    /// `EVAL` retry): the driver writes the link after the read.
    pub kick: bool,
    pub input: Input,
    pub pending: VecDeque<Tag>,
    /// Consecutive connections that failed before answering anything.
    pub failures: u32,
    /// The connection has answered at least one request.
    pub answered: bool,
    pub retry_at: Option<Instant>,
    /// Why the last connection failed (reported at once while backing off).
    pub last_fault: Option<Fault>,
    pub connect_deadline: Instant,
    pub last_progress: Instant,
    /// Client-side tracking on this connection (lock links; see `watch.rs`).
    pub tracking: Tracking,
}

impl Link {
    pub(super) fn new(limits: resp::Limits, inbuf: usize, pending: usize, now: Instant) -> Link {
        Link {
            state: State::Down,
            out: Vec::with_capacity(if inbuf > 0 { 4096 } else { 0 }),
            out_pos: 0,
            shared_from: None,
            gate: None,
            kick: false,
            input: Input {
                inbuf: vec![0; inbuf],
                in_start: 0,
                in_end: 0,
                parser: resp::Parser::new(limits),
                resuming: false,
            },
            pending: VecDeque::with_capacity(pending),
            failures: 0,
            answered: false,
            retry_at: None,
            last_fault: None,
            connect_deadline: now,
            last_progress: now,
            tracking: Tracking::Off,
        }
    }

    #[inline]
    pub(super) fn is_up(&self) -> bool {
        self.state == State::Up
    }

    pub(super) fn is_connecting(&self) -> bool {
        matches!(self.state, State::Connecting(_))
    }

    /// How much of `out` may be written now (all of it, unless the handshake is gated).
    pub(super) fn writable_end(&self) -> usize {
        self.gate.map_or(self.out.len(), |g| g.min(self.out.len()))
    }

    /// Forget every byte queued or buffered for the (old) connection.
    pub(super) fn clear_streams(&mut self) {
        self.out.clear();
        self.out_pos = 0;
        self.shared_from = None;
        self.gate = None;
        self.kick = false;
        self.input.clear();
        self.tracking = Tracking::Off;
    }
}

/// A link's input: the bytes read and not parsed yet, and the parser.
pub(super) struct Input {
    pub inbuf: Vec<u8>,
    pub in_start: usize,
    pub in_end: usize,
    pub parser: resp::Parser,
    /// The resumable parser holds a partial frame: continue with it, not the fast path.
    pub resuming: bool,
}

impl Input {
    fn clear(&mut self) {
        self.in_start = 0;
        self.in_end = 0;
        self.parser.reset();
        self.resuming = false;
    }

    /// Room at the end of the input buffer: compacted, or grown up to the largest frame the
    /// limits allow (`Err` past that: a frame too large to be ours).
    #[inline]
    pub(super) fn make_room(&mut self, floor: usize) -> Result<(), Fault> {
        if self.in_end < self.inbuf.len() {
            return Ok(());
        }
        if self.in_start > 0 {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
            return Ok(());
        }
        let cap = self.parser.limits().max_bulk_len + 64 * 1024;
        if self.inbuf.len() >= cap {
            return Err(Fault::Protocol(resp::Error::BulkTooLong));
        }
        let new_len = (self.inbuf.len() * 2).clamp(floor, cap);
        self.inbuf.resize(new_len, 0);
        Ok(())
    }

    /// The next frame of the input, parsed (a whole small reply takes the stateless fast
    /// path; once a frame is seen partial, the resumable parser takes over until it
    /// completes, so a large reply arriving in pieces is still scanned once). `Partial`:
    /// no complete frame yet (the input is empty, or holds a frame's start).
    #[inline(always)]
    pub(super) fn next_frame(&mut self) -> Result<resp::Status<(Frame<'_>, usize)>, resp::Error> {
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
            return Ok(resp::Status::Partial(1));
        }
        let buf = &self.inbuf[self.in_start..self.in_end];
        let parsed = if self.resuming {
            self.parser.parse(buf)
        } else {
            match resp::parse(buf, self.parser.limits()) {
                Ok(resp::Status::Partial(_)) => self.parser.parse(buf),
                other => other,
            }
        };
        self.resuming = matches!(parsed, Ok(resp::Status::Partial(_)));
        parsed
    }
}

/// One master: who it is, how to log in, what its handshake said, what it did.
pub(crate) struct Master {
    pub name: Arc<str>,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    pub(super) db: u32,
    /// Amnesia guard: yes votes count only from this instant (set from `INFO server`).
    pub(super) votes_from: Option<Instant>,
    /// The master's `run_id` as of the last handshake.
    pub(super) run_id: Option<[u8; 40]>,
    /// When a handshake last found a `run_id` other than the one before (a restart, or
    /// another server behind the address): the amnesia guard counts from here too.
    pub(super) run_id_changed: Option<Instant>,
    /// Same `run_id` as a master listed before this one: one server reached twice.
    pub(super) same_server: bool,
    /// `CONFIG GET append*` said `appendonly yes` and `appendfsync always` (last handshake).
    pub(super) durable: bool,
    /// The last handshake's `INFO server` reported `valkey_version` 9.0 or later: the
    /// release of a one-key lock that did not wait is sent as `DELIFEQ key token`
    /// (see `Rounds::start`). Cleared at each new connection, set by its handshake.
    pub(super) delifeq: bool,
    /// The master refused a `DELIFEQ` (`-NOPERM`: an ACL user without the right to it, or
    /// an unknown command): never sent to it again by this client, whatever its handshakes
    /// report (its releases keep the script).
    pub(super) delifeq_refused: bool,
    /// Counters, for tests and benchmarks.
    pub stats: Counters,
    /// Releases owed to this master: sent on its lock link's next connection, oldest first
    /// (see [`Owed`]). While sent and unanswered, they stay here (a `Tag::Owed` each).
    pub(super) owed: VecDeque<Owed>,
    /// A Redis or Valkey Cluster: its lock link's connections (`cluster_link.rs`).
    pub(super) cluster: Option<Box<super::cluster_link::ClusterConn>>,
}

impl Master {
    pub(crate) fn new(
        name: Arc<str>,
        user: Option<String>,
        password: Option<String>,
        db: u32,
    ) -> Self {
        Master {
            name,
            user,
            password,
            db,
            votes_from: None,
            run_id: None,
            run_id_changed: None,
            same_server: false,
            durable: false,
            delifeq: false,
            delifeq_refused: false,
            stats: Counters::default(),
            owed: VecDeque::new(),
            cluster: None,
        }
    }

    /// This master is a cluster reached through `seed_host` (its first seed's host), or
    /// the other `seeds` (IP addresses).
    pub(crate) fn into_cluster(
        mut self,
        seed_host: String,
        tls: bool,
        seeds: Vec<std::net::SocketAddr>,
    ) -> Self {
        let c = super::cluster_link::ClusterConn::new(seed_host, tls, seeds);
        self.cluster = Some(Box::new(c));
        self
    }
}

/// What a handshake reply means.
pub(super) enum SetupReply {
    /// Accepted, or refused with this fault.
    Done(Result<(), Fault>),
    /// `INFO server`: how long the master has been up, its run id, and whether it offers
    /// `DELIFEQ` (see [`parse_info`]).
    Info {
        uptime: u64,
        run_id: [u8; 40],
        delifeq: bool,
    },
    /// `INFO server` refused or unreadable.
    InfoRefused(Fault),
    /// `CONFIG GET append*`: whether every write is persisted (a refusal reads as no).
    Durable(bool),
}

pub(super) fn interpret(setup: Setup, frame: &Frame<'_>) -> SetupReply {
    let refused = |f: &Frame<'_>| match f {
        Frame::Error(m) | Frame::BulkError(m) => Fault::Handshake(ErrorText::new(m)),
        _ => Fault::Unexpected,
    };
    match setup {
        Setup::Auth | Setup::Select => match frame {
            Frame::Simple(b"OK") => SetupReply::Done(Ok(())),
            f => SetupReply::Done(Err(refused(f))),
        },
        Setup::ScriptLoad(k) => match frame {
            Frame::Bulk(sha) if sha.eq_ignore_ascii_case(scripts::ALL[k].sha.as_bytes()) => {
                SetupReply::Done(Ok(()))
            }
            Frame::Bulk(_) => SetupReply::Done(Err(Fault::Handshake(ErrorText::new(
                b"SCRIPT LOAD returned an unexpected SHA1",
            )))),
            // A server before Redis 7.0 cannot compile the `#!lua` line the scripts start
            // with (see `scripts`): say what it lacks rather than quote the Lua error.
            Frame::Error(m) | Frame::BulkError(m)
                if m.windows(9).any(|w| w.eq_ignore_ascii_case(b"compiling")) =>
            {
                SetupReply::Done(Err(Fault::Handshake(ErrorText::new(
                    b"SCRIPT LOAD: the scripts (#!lua) need Redis 7.0 or later",
                ))))
            }
            f => SetupReply::Done(Err(refused(f))),
        },
        Setup::Info => match frame {
            Frame::Bulk(text) | Frame::Verbatim { text, .. } => match parse_info(text) {
                Some(info) => SetupReply::Info {
                    uptime: info.uptime,
                    run_id: info.run_id,
                    delifeq: info.delifeq,
                },
                None => SetupReply::InfoRefused(Fault::Handshake(ErrorText::new(
                    b"INFO server lacks uptime_in_seconds or run_id",
                ))),
            },
            f @ (Frame::Error(_) | Frame::BulkError(_)) => SetupReply::InfoRefused(refused(f)),
            f => SetupReply::Done(Err(refused(f))),
        },
        Setup::Durability => match frame {
            Frame::Aggregate(a) => SetupReply::Durable(config_is_durable(a)),
            Frame::Error(_) | Frame::BulkError(_) => SetupReply::Durable(false),
            f => SetupReply::Done(Err(refused(f))),
        },
    }
}

/// The lock link's handshake: AUTH, SELECT, SCRIPT LOAD, `INFO server` (uptime for the
/// amnesia guard, `run_id` to catch one server listed twice) and, for fencing, `CONFIG GET
/// append*`. Queued ahead of whatever the first round sends. Without AUTH or SELECT the
/// requests go out in the same write (a reconnect costs no extra round trip); with them,
/// requests wait for their confirmation (see `Link::gate`).
pub(super) fn write_handshake(link: &mut Link, master: &Master, durability: bool) {
    if encode_auth(
        &mut link.out,
        master.user.as_deref(),
        master.password.as_deref(),
    ) {
        link.pending.push_back(Tag::Setup(Setup::Auth));
    }
    if master.db != 0 {
        resp::encode_command(
            &mut link.out,
            &[Arg::Bytes(b"SELECT"), Arg::Uint(master.db as u64)],
        );
        link.pending.push_back(Tag::Setup(Setup::Select));
    }
    for (k, s) in scripts::ALL.iter().enumerate() {
        resp::encode_command(
            &mut link.out,
            &[
                Arg::Bytes(b"SCRIPT"),
                Arg::Bytes(b"LOAD"),
                Arg::Bytes(s.src.as_bytes()),
            ],
        );
        link.pending.push_back(Tag::Setup(Setup::ScriptLoad(k)));
    }
    resp::encode_command(&mut link.out, &[Arg::Bytes(b"INFO"), Arg::Bytes(b"server")]);
    link.pending.push_back(Tag::Setup(Setup::Info));
    if durability {
        resp::encode_command(
            &mut link.out,
            &[
                Arg::Bytes(b"CONFIG"),
                Arg::Bytes(b"GET"),
                Arg::Bytes(b"append*"),
            ],
        );
        link.pending.push_back(Tag::Setup(Setup::Durability));
    }
    link.gate = (master.password.is_some() || master.db != 0).then_some(link.out.len());
}

/// Whether a `CONFIG GET append*` reply (pairs of name and value, as an array or a map)
/// says `appendonly yes` and `appendfsync always`.
pub(super) fn config_is_durable(reply: &resp::Aggregate<'_>) -> bool {
    let (mut aof, mut always) = (false, false);
    let mut it = reply.iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        let (Frame::Bulk(name), Frame::Bulk(value)) = (name, value) else {
            continue;
        };
        if name.eq_ignore_ascii_case(b"appendonly") {
            aof = value.eq_ignore_ascii_case(b"yes");
        } else if name.eq_ignore_ascii_case(b"appendfsync") {
            always = value.eq_ignore_ascii_case(b"always");
        }
    }
    aof && always
}

/// What the handshake reads in `INFO server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ServerInfo {
    pub uptime: u64,
    pub run_id: [u8; 40],
    /// `valkey_version` is 9.0 or later: the server has `DELIFEQ key value` (delete the
    /// key when its value is `value`; `:1` deleted, `:0` not). Redis 8.4's `DELEX key
    /// IFEQ value` does the same, but is not used: no Redis 8.4 is tested against.
    pub delifeq: bool,
}

/// `uptime_in_seconds`, `run_id` and `valkey_version` from an `INFO server` reply
/// (`None` without the first two).
pub(super) fn parse_info(text: &[u8]) -> Option<ServerInfo> {
    let mut uptime = None;
    let mut run_id = None;
    let mut delifeq = false;
    for line in text.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
            uptime = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok());
        } else if let Some(v) = line.strip_prefix(b"run_id:") {
            run_id = v.try_into().ok();
        } else if let Some(v) = line.strip_prefix(b"valkey_version:") {
            delifeq = major_version(v).is_some_and(|m| m >= 9);
        }
    }
    Some(ServerInfo {
        uptime: uptime?,
        run_id: run_id?,
        delifeq,
    })
}

/// The major number of a version such as `9.1.2` (`None`: not digits before a dot).
fn major_version(v: &[u8]) -> Option<u64> {
    let major = v.split(|b| *b == b'.').next()?;
    if major.is_empty() || major.len() > 9 || !major.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(major).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_server_parsing() {
        let text = b"# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\nuptime_in_seconds:42\r\n";
        let info = parse_info(text).unwrap();
        assert_eq!(info.uptime, 42);
        assert_eq!(&info.run_id, b"0123456789abcdef0123456789abcdef01234567");
        assert!(!info.delifeq, "Redis 7 has no DELIFEQ");
        assert_eq!(parse_info(b"# Server\r\nuptime_in_seconds:x\r\n"), None);
        assert_eq!(parse_info(b"run_id:short\r\nuptime_in_seconds:1\r\n"), None);
    }

    #[test]
    fn valkey_9_offers_delifeq() {
        let with = |version: &str| {
            let text = format!(
                "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{version}\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\nuptime_in_seconds:42\r\n"
            );
            parse_info(text.as_bytes()).unwrap().delifeq
        };
        assert!(with("9.1.2"));
        assert!(with("9.0.0"));
        assert!(with("10.0.0"));
        assert!(!with("8.1.4"));
        assert!(!with("7.2.4"));
        assert!(!with("x.0"));
        assert!(!with(""));
    }

    #[test]
    fn a_server_that_cannot_compile_the_shebang_is_told_it_needs_redis_7() {
        // Redis 6.2's answer to `SCRIPT LOAD "#!lua\n..."`.
        let refusal = Frame::Error(
            b"ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'",
        );
        let SetupReply::Done(Err(Fault::Handshake(text))) =
            interpret(Setup::ScriptLoad(0), &refusal)
        else {
            panic!("a handshake fault expected");
        };
        let text = String::from_utf8_lossy(text.as_bytes()).into_owned();
        assert!(
            text.contains("Redis 7.0") && text.contains("#!lua"),
            "{text}"
        );
        // Any other refusal is quoted as it came.
        let SetupReply::Done(Err(Fault::Handshake(text))) =
            interpret(Setup::ScriptLoad(0), &Frame::Error(b"NOPERM no scripts"))
        else {
            panic!("a handshake fault expected");
        };
        assert_eq!(text.as_bytes(), b"NOPERM no scripts");
    }
}
