//! One master's connection (over `transport.rs`): the handshake, the byte queues both ways, and
//! what a handshake reply means. The engine ([`super::Engine`]) owns one per master and
//! routes replies to ops.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use super::encode::encode_auth;
use super::ops::OpId;
use super::transport::{Conn, Target};
use crate::resp::{self, Arg, Frame};
use crate::rules::{ErrorText, Fault, Request};
use crate::scripts;
use crate::stats::Counters;

pub(super) const INBUF_START: usize = 16 * 1024;

/// What a pending request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    /// Part of the connection's handshake.
    Setup(Setup),
    /// A round's request.
    Op { id: OpId, req: Request, eval: bool },
    /// A release sent again on a new connection (the front of `Node::owed`).
    Owed,
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

/// One master.
pub(crate) struct Node {
    pub name: Arc<str>,
    pub(super) target: Target,
    /// `rediss://`: the TLS configuration and the name to verify.
    #[cfg(feature = "tls")]
    pub(super) tls: Option<super::tls::TlsTarget>,
    /// A resolve of this master's host runs on a helper thread (at most one at a time).
    pub(super) resolving: bool,
    /// Which resolve the connection waits for: a late answer to an older one is ignored.
    pub(super) resolve_gen: u64,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    pub(super) db: u32,
    pub(super) conn: Conn,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    /// Requests queued for this master that still sit in the engine's shared buffer, from
    /// this offset on (see `Engine::shared`); `out` is empty meanwhile.
    pub(super) shared_from: Option<usize>,
    pub(super) inbuf: Vec<u8>,
    pub(super) in_start: usize,
    pub(super) in_end: usize,
    pub(super) parser: resp::Parser,
    /// The resumable parser holds a partial frame: continue with it, not the fast path.
    pub(super) resuming: bool,
    pub(super) pending: VecDeque<Tag>,
    /// Consecutive connections that failed before answering anything.
    pub(super) failures: u32,
    /// The connection has answered at least one request.
    pub(super) answered: bool,
    pub(super) retry_at: Option<Instant>,
    pub(super) connect_deadline: Instant,
    pub(super) last_progress: Instant,
    pub last_fault: Option<Fault>,
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
    /// While `Some(n)`: the connection's AUTH or SELECT is not confirmed yet, and only the
    /// first `n` bytes of `out` (the handshake) may be written. A request written before a
    /// refused AUTH or SELECT would still run, as another user or in database 0.
    pub(super) gate: Option<usize>,
    /// Counters, for tests and benchmarks.
    pub stats: Counters,
    /// The address the host name resolved to last (`Target::Host`): the subscription
    /// connection goes there too.
    pub(super) addr: Option<SocketAddr>,
    /// The subscription connection, for release notifications (see `sub.rs`).
    pub(super) sub: super::sub::SubConn,
    /// Releases owed to this master: sent on its next connection, oldest first (see
    /// [`Owed`]). While sent and unanswered, they stay here (a `Tag::Owed` each).
    pub(super) owed: VecDeque<Owed>,
}

impl Node {
    pub(crate) fn new(
        name: Arc<str>,
        target: Target,
        user: Option<String>,
        password: Option<String>,
        db: u32,
        limits: resp::Limits,
        now: Instant,
    ) -> Self {
        Node {
            name,
            target,
            #[cfg(feature = "tls")]
            tls: None,
            resolving: false,
            resolve_gen: 0,
            user,
            password,
            db,
            conn: Conn::Down,
            out: Vec::with_capacity(4096),
            out_pos: 0,
            shared_from: None,
            inbuf: vec![0; INBUF_START],
            in_start: 0,
            in_end: 0,
            parser: resp::Parser::new(limits),
            resuming: false,
            pending: VecDeque::with_capacity(256),
            failures: 0,
            answered: false,
            retry_at: None,
            connect_deadline: now,
            last_progress: now,
            last_fault: None,
            votes_from: None,
            run_id: None,
            run_id_changed: None,
            same_server: false,
            durable: false,
            gate: None,
            stats: Counters::default(),
            addr: None,
            sub: super::sub::SubConn::new(limits, now),
            owed: VecDeque::new(),
        }
    }

    /// Speak TLS to this master (`rediss://`).
    #[cfg(feature = "tls")]
    pub(crate) fn set_tls(&mut self, target: super::tls::TlsTarget) {
        self.tls = Some(target);
    }

    pub(crate) fn is_up(&self) -> bool {
        matches!(self.conn, Conn::Up(_))
    }

    /// Bytes for this master not yet handed to the kernel: a share of the shared buffer,
    /// or its own queue.
    pub(super) fn has_unwritten(&self) -> bool {
        self.shared_from.is_some() || self.out_pos < self.writable_end()
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
        self.in_start = 0;
        self.in_end = 0;
        self.parser.reset();
        self.resuming = false;
    }
}

/// What a handshake reply means.
pub(super) enum SetupReply {
    /// Accepted, or refused with this fault.
    Done(Result<(), Fault>),
    /// `INFO server`: how long the master has been up, and its run id.
    Info { uptime: u64, run_id: [u8; 40] },
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
            f => SetupReply::Done(Err(refused(f))),
        },
        Setup::Info => match frame {
            Frame::Bulk(text) | Frame::Verbatim { text, .. } => match parse_info(text) {
                Some((uptime, run_id)) => SetupReply::Info { uptime, run_id },
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

/// The handshake: AUTH, SELECT, SCRIPT LOAD, `INFO server` (uptime for the amnesia guard,
/// `run_id` to catch one server listed twice) and, for fencing, `CONFIG GET append*`.
/// Queued ahead of whatever the first round sends. Without AUTH or SELECT the requests go
/// out in the same write (a reconnect costs no extra round trip); with them, requests wait
/// for their confirmation (see `Node::gate`).
pub(super) fn write_handshake(node: &mut Node, durability: bool) {
    if encode_auth(
        &mut node.out,
        node.user.as_deref(),
        node.password.as_deref(),
    ) {
        node.pending.push_back(Tag::Setup(Setup::Auth));
    }
    if node.db != 0 {
        resp::encode_command(
            &mut node.out,
            &[Arg::Bytes(b"SELECT"), Arg::Uint(node.db as u64)],
        );
        node.pending.push_back(Tag::Setup(Setup::Select));
    }
    for (k, s) in scripts::ALL.iter().enumerate() {
        resp::encode_command(
            &mut node.out,
            &[
                Arg::Bytes(b"SCRIPT"),
                Arg::Bytes(b"LOAD"),
                Arg::Bytes(s.src.as_bytes()),
            ],
        );
        node.pending.push_back(Tag::Setup(Setup::ScriptLoad(k)));
    }
    resp::encode_command(&mut node.out, &[Arg::Bytes(b"INFO"), Arg::Bytes(b"server")]);
    node.pending.push_back(Tag::Setup(Setup::Info));
    if durability {
        resp::encode_command(
            &mut node.out,
            &[
                Arg::Bytes(b"CONFIG"),
                Arg::Bytes(b"GET"),
                Arg::Bytes(b"append*"),
            ],
        );
        node.pending.push_back(Tag::Setup(Setup::Durability));
    }
    node.gate = (node.password.is_some() || node.db != 0).then_some(node.out.len());
}

/// Whether a `CONFIG GET append*` reply (pairs of name and value, as an array or a map)
/// says `appendonly yes` and `appendfsync always`.
fn config_is_durable(reply: &resp::Aggregate<'_>) -> bool {
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

/// `uptime_in_seconds` and `run_id` from an `INFO server` reply.
fn parse_info(text: &[u8]) -> Option<(u64, [u8; 40])> {
    let mut uptime = None;
    let mut run_id = None;
    for line in text.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
            uptime = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok());
        } else if let Some(v) = line.strip_prefix(b"run_id:") {
            run_id = v.try_into().ok();
        }
    }
    Some((uptime?, run_id?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_server_parsing() {
        let text = b"# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\nuptime_in_seconds:42\r\n";
        let (up, id) = parse_info(text).unwrap();
        assert_eq!(up, 42);
        assert_eq!(&id, b"0123456789abcdef0123456789abcdef01234567");
        assert_eq!(parse_info(b"# Server\r\nuptime_in_seconds:x\r\n"), None);
        assert_eq!(parse_info(b"run_id:short\r\nuptime_in_seconds:1\r\n"), None);
    }
}
