//! The thin I/O shell: one non-blocking connection per master, one `mio::Poll`.
//!
//! An *op* is one fan-out round (acquire, release or extend of one lock). Starting an op
//! encodes its request into every master's output buffer; [`Engine::flush`] then writes
//! each buffer with one `write` per master, and [`Engine::drive`] polls and feeds replies
//! to the op's [`Tally`] until the caller's condition holds.
//!
//! Every master has a FIFO of pending requests; a reply is always matched to the oldest
//! one, so a late reply is credited to the op that asked for it, never to a newer one.
//! An op's slot stays alive until every reply it is owed has arrived (or its connection
//! died), even after the op was decided: a late `-NOSCRIPT` is then still retried with
//! `EVAL`, so a release never silently misses a master. (The client has no background
//! thread: replies that arrive after an operation returned are read, and such retries sent,
//! by the client's next operation. Until then the key's TTL bounds it, as always.)
//!
//! Reconnect policy: a connection that worked and then broke is reconnected on the next
//! request. A connect that fails, or a connection that breaks before answering anything,
//! backs off: 25 ms, 50 ms, ... up to 1 s. During backoff the master is reported as
//! [`Fault::Down`] at once, so a dead master costs a round nothing, not a connect timeout.
//! A connection with requests outstanding and no byte received for `stall_timeout` is
//! closed (a hung or frozen master), which also bounds the memory its FIFO can take.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token as MioToken, Waker};
use smallvec::SmallVec;
use socket2::{Domain, Protocol, Socket, Type};

use crate::client::KeyList;
use crate::resp::{self, Arg, Frame};
use crate::rules::{self, Decision, ErrorText, Fault, Outcome, Request, Tally};
use crate::scripts::{self, Script};
use crate::token::{Token, TOKEN_LEN};

/// The mio token reserved for the cross-thread waker.
pub(crate) const WAKER: MioToken = MioToken(usize::MAX);

const INBUF_START: usize = 16 * 1024;
/// Idle gaps between `drive` calls shorter than this do not shift the stall clocks.
const IDLE_SHIFT_MIN: Duration = Duration::from_millis(1);

/// Tuning of the shell (set from the builder).
#[derive(Debug, Clone)]
pub(crate) struct NetConfig {
    pub connect_timeout: Duration,
    pub stall_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub busy_poll: bool,
    /// A master with this many requests in flight is not asked to grant (acquire or
    /// extend) until it catches up: back-pressure, so a slow master's queue stays bounded.
    pub backlog_limit: usize,
    /// Hard limit: past it the connection is closed (only reachable by releases alone).
    pub max_pending: usize,
    pub limits: resp::Limits,
    /// The amnesia guard: a master up for less than this does not vote yes.
    pub amnesia_guard: Option<Duration>,
    /// Fencing: only masters that persist every write (`appendonly yes`, `appendfsync
    /// always`, checked with `CONFIG GET` at connect) vote yes to a grant.
    pub require_durable: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            connect_timeout: Duration::from_secs(1),
            stall_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(25),
            backoff_max: Duration::from_secs(1),
            busy_poll: false,
            backlog_limit: 1024,
            max_pending: 4096,
            // Our replies are tiny; INFO is a few KiB. Anything larger is hostile.
            limits: resp::Limits {
                max_bulk_len: 1024 * 1024,
                max_elements: 1024,
                max_depth: 4,
                max_line_len: 4096,
            },
            amnesia_guard: None,
            require_durable: false,
        }
    }
}

/// Where a master's connection stands.
enum Conn {
    Down,
    Connecting(TcpStream),
    Up(TcpStream),
}

/// What a pending request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// Part of the connection's handshake.
    Setup(Setup),
    /// A round's request.
    Op { id: OpId, req: Request, eval: bool },
}

/// The handshake requests written ahead of the first op on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
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
    addr: SocketAddr,
    user: Option<String>,
    password: Option<String>,
    db: u32,
    conn: Conn,
    out: Vec<u8>,
    out_pos: usize,
    /// Requests queued for this master that still sit in the engine's shared buffer, from
    /// this offset on (see `Engine::shared`); `out` is empty meanwhile.
    shared_from: Option<usize>,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    parser: resp::Parser,
    /// The resumable parser holds a partial frame: continue with it, not the fast path.
    resuming: bool,
    pending: VecDeque<Tag>,
    /// Consecutive connections that failed before answering anything.
    failures: u32,
    /// The connection has answered at least one request.
    answered: bool,
    retry_at: Option<Instant>,
    connect_deadline: Instant,
    last_progress: Instant,
    pub last_fault: Option<Fault>,
    /// Amnesia guard: yes votes count only from this instant (set from `INFO server`).
    votes_from: Option<Instant>,
    /// The master's `run_id` as of the last handshake.
    run_id: Option<[u8; 40]>,
    /// Same `run_id` as a master listed before this one: one server reached twice.
    same_server: bool,
    /// `CONFIG GET append*` said `appendonly yes` and `appendfsync always` (last handshake).
    durable: bool,
    /// While `Some(n)`: the connection's AUTH or SELECT is not confirmed yet, and only the
    /// first `n` bytes of `out` (the handshake) may be written. A request written before a
    /// refused AUTH or SELECT would still run, as another user or in database 0.
    gate: Option<usize>,
    /// Counters, for tests and benchmarks.
    pub stats: NodeStats,
}

/// Per-master counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Successful `connect`s.
    pub connects: u64,
    /// `write` calls.
    pub writes: u64,
    /// `read` calls.
    pub reads: u64,
    /// Requests retried with `EVAL` after `-NOSCRIPT`.
    pub noscript: u64,
    /// Connections closed (by us or the peer) or connects that failed.
    pub disconnects: u64,
    /// Why the last connection closed (or the last connect failed).
    pub last_fault: Option<Fault>,
}

impl Node {
    pub(crate) fn new(
        name: Arc<str>,
        addr: SocketAddr,
        user: Option<String>,
        password: Option<String>,
        db: u32,
        limits: resp::Limits,
        now: Instant,
    ) -> Self {
        Node {
            name,
            addr,
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
            same_server: false,
            durable: false,
            gate: None,
            stats: NodeStats::default(),
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        matches!(self.conn, Conn::Up(_))
    }

    /// Bytes for this master not yet handed to the kernel: a share of the shared buffer,
    /// or its own queue.
    fn has_unwritten(&self) -> bool {
        self.shared_from.is_some() || self.out_pos < self.writable_end()
    }

    /// How much of `out` may be written now (all of it, unless the handshake is gated).
    fn writable_end(&self) -> usize {
        self.gate.map_or(self.out.len(), |g| g.min(self.out.len()))
    }

    /// Forget every byte queued or buffered for the (old) connection.
    fn clear_streams(&mut self) {
        self.out.clear();
        self.out_pos = 0;
        self.shared_from = None;
        self.in_start = 0;
        self.in_end = 0;
        self.parser.reset();
        self.resuming = false;
    }
}

/// A handle to an op: slot index plus generation, so a stale handle never aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OpId {
    slot: u32,
    gen: u32,
}

/// The arguments of an op, kept so a request can be re-sent with `EVAL`.
#[derive(Clone, Default)]
pub(crate) struct OpArgs {
    pub keys: KeyList,
    pub token: Option<Token>,
    pub ttl_ms: u64,
    /// The fencing value to write back.
    pub value: u64,
}

impl OpArgs {
    pub(crate) fn set<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        token: Token,
        ttl_ms: u64,
    ) {
        self.keys.clear();
        for k in keys {
            self.keys.push(k);
        }
        self.token = Some(token);
        self.ttl_ms = ttl_ms;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpState {
    Free,
    Active,
    Decided,
}

/// One fan-out round.
pub(crate) struct Op {
    gen: u32,
    state: OpState,
    pub req: Request,
    pub tally: Tally,
    pub started: Instant,
    pub deadline: Instant,
    pub decided_at: Instant,
    pub args: OpArgs,
    /// The largest integer among the yes answers (the fencing counter).
    pub max_value: i64,
    /// Replies still owed to this op.
    outstanding: u32,
    /// Nobody collects the result (cleanup releases).
    detached: bool,
    collected: bool,
    /// Where this op sits in [`Engine::active`] while `Active`: removal without a search
    /// (many locks in flight make that list long).
    active_at: u32,
}

impl Op {
    pub(crate) fn is_decided(&self) -> bool {
        self.state == OpState::Decided
    }
}

/// The event loop and its masters.
pub(crate) struct Engine {
    poll: Poll,
    events: Events,
    pub nodes: Vec<Node>,
    ops: Vec<Op>,
    free: Vec<u32>,
    /// Requests encoded once for every master that takes them. A master whose own queue
    /// was empty is written straight from here (no per-master copy); one that already had
    /// bytes queued, or misses a request, gets its share copied into its own queue.
    /// [`Engine::flush`] empties it.
    shared: Vec<u8>,
    pub cfg: NetConfig,
    quorum: usize,
    waker: Arc<Waker>,
    /// The last clock reading inside `drive`, within one loop step of its return: the
    /// client's idle time starts there.
    left_loop: Instant,
    /// Slots of the ops in the `Active` state (undecided): all `tick` has to look at.
    active: Vec<u32>,
    /// No timer is due before this instant (`None`: no timer at all). A lower bound: every
    /// place that creates a deadline lowers it, progress only moves deadlines later, and
    /// `tick` recomputes it exactly. The loop skips `tick` until it passes.
    next_due: Option<Instant>,
}

impl Engine {
    pub(crate) fn new(nodes: Vec<Node>, cfg: NetConfig) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let quorum = rules::quorum(nodes.len());
        let mut e = Engine {
            poll,
            events: Events::with_capacity(64),
            nodes,
            ops: Vec::with_capacity(64),
            free: Vec::with_capacity(64),
            shared: Vec::with_capacity(1024),
            cfg,
            quorum,
            waker,
            left_loop: Instant::now(),
            active: Vec::with_capacity(64),
            next_due: None,
        };
        // Pre-build a few slots so the first cycles do not allocate either.
        for _ in 0..4 {
            e.new_slot();
        }
        Ok(e)
    }

    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// A timer at `t` exists now: make sure the loop looks at it.
    fn due_by(&mut self, t: Instant) {
        self.next_due = Some(self.next_due.map_or(t, |n| n.min(t)));
    }

    fn new_slot(&mut self) -> u32 {
        let n = self.nodes.len();
        let now = Instant::now();
        self.ops.push(Op {
            gen: 0,
            state: OpState::Free,
            req: Request::Acquire,
            tally: Tally::new(n, self.quorum),
            started: now,
            deadline: now,
            decided_at: now,
            args: OpArgs::default(),
            max_value: 0,
            outstanding: 0,
            detached: false,
            collected: false,
            active_at: 0,
        });
        let slot = (self.ops.len() - 1) as u32;
        self.free.push(slot);
        slot
    }

    pub(crate) fn op(&self, id: OpId) -> &Op {
        let op = &self.ops[id.slot as usize];
        debug_assert_eq!(op.gen, id.gen);
        op
    }

    /// Start an op: encode `req` for every master `target` accepts, queue it, and record
    /// an immediate failure for masters that are down. Call [`Engine::flush`] after
    /// starting all ops of a batch.
    pub(crate) fn start(
        &mut self,
        req: Request,
        fill: impl FnOnce(&mut OpArgs),
        timeout: Duration,
        now: Instant,
        target: impl Fn(usize) -> bool,
        detached: bool,
    ) -> OpId {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.new_slot();
                self.free.pop().expect("slot just pushed")
            }
        };
        let n = self.nodes.len();
        let quorum = self.quorum;
        let op = &mut self.ops[slot as usize];
        op.gen = op.gen.wrapping_add(1);
        op.state = OpState::Active;
        op.active_at = self.active.len() as u32;
        self.active.push(slot);
        op.req = req;
        op.tally.reset(n, quorum);
        op.started = now;
        let deadline = now + timeout;
        op.deadline = deadline;
        op.decided_at = now;
        op.outstanding = 0;
        op.max_value = 0;
        op.detached = detached;
        op.collected = false;
        fill(&mut op.args);
        let id = OpId { slot, gen: op.gen };
        self.due_by(deadline);
        // A master whose queue was empty starts its stall clock now.
        let mut stall_clock_started = false;
        // Encode once, into the shared buffer.
        let at = self.shared.len();
        encode_request(&mut self.shared, req, &self.ops[slot as usize].args, false);
        for i in 0..n {
            // A master that does not take this request must not send it either: its
            // earlier shared bytes go to its own queue first (`unshare` below).
            if !target(i) {
                // Not asked: counts as a no, so the tally still decides.
                self.unshare(i, at);
                self.record(id, i, Outcome::NotHeld, now);
                continue;
            }
            // Releases always go out (the master may run an earlier SET of this lock
            // that is still queued); grants wait until a backlogged master catches up.
            if req != Request::Release && self.nodes[i].pending.len() >= self.cfg.backlog_limit {
                self.unshare(i, at);
                self.record(id, i, Outcome::Failed(Fault::Backlogged), now);
                continue;
            }
            match self.ensure_connection(i, now) {
                Ok(()) => {
                    let node = &mut self.nodes[i];
                    if node.pending.is_empty() {
                        node.last_progress = now;
                        stall_clock_started = true;
                    }
                    // Already sharing: this request rides along. Empty queue: share from
                    // here. Bytes queued: append a copy behind them.
                    if node.shared_from.is_none() {
                        if node.out.is_empty() {
                            node.shared_from = Some(at);
                        } else {
                            node.out.extend_from_slice(&self.shared[at..]);
                        }
                    }
                    node.pending.push_back(Tag::Op {
                        id,
                        req,
                        eval: false,
                    });
                    self.ops[slot as usize].outstanding += 1;
                }
                Err(fault) => {
                    self.unshare(i, at);
                    self.record(id, i, Outcome::Failed(fault), now)
                }
            }
        }
        if stall_clock_started {
            self.due_by(now + self.cfg.stall_timeout);
        }
        self.check_decided(id, now);
        id
    }

    /// The caller has read the op's result; its slot is reused once no reply is owed.
    pub(crate) fn finish(&mut self, id: OpId) {
        let op = &mut self.ops[id.slot as usize];
        if op.gen == id.gen {
            op.collected = true;
            self.maybe_free(id.slot);
        }
    }

    /// Move master `i`'s shared bytes before `upto` into its own queue.
    fn unshare(&mut self, i: usize, upto: usize) {
        let node = &mut self.nodes[i];
        if let Some(from) = node.shared_from.take() {
            node.out.extend_from_slice(&self.shared[from..upto]);
        }
    }

    fn maybe_free(&mut self, slot: u32) {
        let op = &mut self.ops[slot as usize];
        if op.state == OpState::Decided && op.outstanding == 0 && (op.collected || op.detached) {
            op.state = OpState::Free;
            self.free.push(slot);
        }
    }

    fn record(&mut self, id: OpId, node: usize, outcome: Outcome, now: Instant) {
        let op = &mut self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return;
        }
        op.tally.record(node, outcome);
        self.check_decided(id, now);
    }

    fn check_decided(&mut self, id: OpId, now: Instant) {
        let op = &mut self.ops[id.slot as usize];
        if op.state == OpState::Active && op.tally.decision() != Decision::Open {
            op.state = OpState::Decided;
            op.decided_at = now;
            let k = op.active_at as usize;
            debug_assert_eq!(self.active.get(k), Some(&id.slot));
            self.active.swap_remove(k);
            if let Some(&moved) = self.active.get(k) {
                self.ops[moved as usize].active_at = k as u32;
            }
        }
        self.maybe_free(id.slot);
    }

    /// Make sure master `i` has (or is getting) a connection; `Err` when it is backing off
    /// or the connect failed at once. Inline: the common case is one test.
    #[inline]
    fn ensure_connection(&mut self, i: usize, now: Instant) -> Result<(), Fault> {
        let node = &self.nodes[i];
        if node.is_up() && node.pending.len() < self.cfg.max_pending {
            return Ok(());
        }
        self.connect_if_down(i, now)
    }

    /// The rest of [`Engine::ensure_connection`]: a full queue, or a (re)connect.
    #[inline(never)]
    fn connect_if_down(&mut self, i: usize, now: Instant) -> Result<(), Fault> {
        let node = &mut self.nodes[i];
        match node.conn {
            Conn::Up(_) | Conn::Connecting(_) => {
                if node.pending.len() >= self.cfg.max_pending {
                    self.fail_node(i, Fault::Closed(io::ErrorKind::OutOfMemory), now);
                    return Err(Fault::Down);
                }
                return Ok(());
            }
            Conn::Down => {}
        }
        if let Some(at) = node.retry_at {
            if now < at {
                return Err(node.last_fault.unwrap_or(Fault::Down));
            }
        }
        match connect(node.addr) {
            Ok(mut stream) => {
                if let Err(e) = self.poll.registry().register(
                    &mut stream,
                    MioToken(i),
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    let f = Fault::Connect(e.kind());
                    self.connect_failed(i, f, now);
                    return Err(f);
                }
                let node = &mut self.nodes[i];
                node.conn = Conn::Connecting(stream);
                node.connect_deadline = now + self.cfg.connect_timeout;
                node.last_progress = now;
                let first = node.connect_deadline.min(now + self.cfg.stall_timeout);
                node.answered = false;
                node.clear_streams();
                node.votes_from = None;
                node.durable = false;
                write_handshake(node, self.cfg.require_durable);
                self.due_by(first);
                Ok(())
            }
            Err(e) => {
                let f = Fault::Connect(e.kind());
                self.connect_failed(i, f, now);
                Err(f)
            }
        }
    }

    fn connect_failed(&mut self, i: usize, fault: Fault, now: Instant) {
        let node = &mut self.nodes[i];
        node.failures = node.failures.saturating_add(1);
        let shift = (node.failures - 1).min(16);
        let backoff = self
            .cfg
            .backoff_min
            .saturating_mul(1 << shift)
            .min(self.cfg.backoff_max);
        node.retry_at = Some(now + backoff);
        node.last_fault = Some(fault);
    }

    /// Close master `i`'s connection: every request still owed an answer fails with
    /// `fault`.
    #[cold]
    #[inline(never)]
    pub(crate) fn fail_node(&mut self, i: usize, fault: Fault, now: Instant) {
        let node = &mut self.nodes[i];
        node.stats.disconnects += 1;
        node.stats.last_fault = Some(fault);
        let conn = std::mem::replace(&mut node.conn, Conn::Down);
        match conn {
            Conn::Up(mut s) | Conn::Connecting(mut s) => {
                let _ = self.poll.registry().deregister(&mut s);
            }
            Conn::Down => {}
        }
        let node = &mut self.nodes[i];
        node.clear_streams();
        let answered = node.answered;
        let mut pending = std::mem::take(&mut node.pending);
        for tag in pending.drain(..) {
            if let Tag::Op { id, .. } = tag {
                self.owed_reply_arrived(id);
                self.record(id, i, Outcome::Failed(fault), now);
                self.maybe_free(id.slot);
            }
        }
        // Give the (empty) queue its storage back.
        self.nodes[i].pending = pending;
        if answered {
            let node = &mut self.nodes[i];
            node.failures = 0;
            node.retry_at = None;
            node.last_fault = Some(fault);
        } else {
            self.connect_failed(i, fault, now);
        }
    }

    fn owed_reply_arrived(&mut self, id: OpId) {
        let op = &mut self.ops[id.slot as usize];
        if op.gen == id.gen {
            op.outstanding = op.outstanding.saturating_sub(1);
        }
    }

    /// Write every master's queued bytes: one `write` per master when the kernel takes
    /// them all (the normal case).
    ///
    /// Nothing to do when no request was started since the last flush: every request goes
    /// through the shared buffer, and bytes a master's queue still holds from before are
    /// waiting for its writable event (the kernel refused them) or for its connect.
    pub(crate) fn flush(&mut self) {
        if self.shared.is_empty() {
            return;
        }
        for i in 0..self.nodes.len() {
            self.flush_node(i);
        }
        // Every master took its shared bytes (wrote them, or queued what was left).
        debug_assert!(self.nodes.iter().all(|n| n.shared_from.is_none()));
        self.shared.clear();
    }

    /// A write failure reads the clock itself: the normal path needs no time.
    fn flush_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let Conn::Up(stream) = &mut node.conn else {
            // Not connected yet: its shared bytes wait in its own queue.
            if let Some(from) = node.shared_from.take() {
                node.out.extend_from_slice(&self.shared[from..]);
            }
            return;
        };
        if let Some(from) = node.shared_from.take() {
            let bytes = &self.shared[from..];
            if node.gate.is_some() {
                // Behind an unconfirmed AUTH or SELECT: wait in the master's own queue.
                node.out.extend_from_slice(bytes);
            } else {
                // Straight from the shared buffer; whatever the kernel does not take now
                // goes to the master's own queue.
                match write_some(stream, bytes, &mut node.stats) {
                    Ok(n) if n == bytes.len() => return,
                    Ok(n) => node.out.extend_from_slice(&bytes[n..]),
                    Err(f) => {
                        self.fail_node(i, f, Instant::now());
                        return;
                    }
                }
            }
        }
        // `writable_end`, by fields: `stream` borrows the connection.
        let end = node.gate.map_or(node.out.len(), |g| g.min(node.out.len()));
        while node.out_pos < end {
            match write_some(stream, &node.out[node.out_pos..end], &mut node.stats) {
                Ok(0) => return,
                Ok(n) => node.out_pos += n,
                Err(f) => {
                    self.fail_node(i, f, Instant::now());
                    return;
                }
            }
        }
        if node.out_pos == node.out.len() {
            node.out.clear();
            node.out_pos = 0;
            // The handshake is written: whatever is queued from here on waits for the gate.
            if let Some(g) = node.gate.as_mut() {
                *g = 0;
            }
        }
    }

    /// Poll and process replies until `done` holds, or `until` passes. Expires ops whose
    /// deadline passed. Returns `Ok(true)` when `done` held, `Ok(false)` at `until`.
    pub(crate) fn drive(
        &mut self,
        until: Option<Instant>,
        mut done: impl FnMut(&Engine) -> bool,
        mut interrupted: impl FnMut() -> bool,
    ) -> io::Result<bool> {
        // Time the client spent outside the loop (idle between calls) is no sign of a hung
        // master: replies may be waiting unread. Shift every stall clock by it. Gaps under
        // a millisecond are left alone: a client back in the loop that often reads every
        // reply within that millisecond, so its stall clocks are right to within one.
        let entered = Instant::now();
        self.shift_stall_clocks(entered);
        self.drive_inner(entered, until, &mut done, &mut interrupted)
    }

    /// Shift every stall clock by the time since the client left the loop (when that is
    /// at least `IDLE_SHIFT_MIN`); returns whether it was.
    fn shift_stall_clocks(&mut self, entered: Instant) -> bool {
        let idle = entered.saturating_duration_since(self.left_loop);
        self.left_loop = entered;
        if idle < IDLE_SHIFT_MIN {
            return false;
        }
        for node in self.nodes.iter_mut() {
            node.last_progress = (node.last_progress + idle).min(entered);
        }
        true
    }

    /// Call before starting requests: after the client was away from the loop, read what
    /// the masters sent meanwhile (late replies, and above all closed connections: a
    /// master that restarted closed ours), so that the requests go out on a fresh
    /// connection rather than into one the master already closed. One `epoll_wait` that
    /// does not block; nothing at all when the client was back within `IDLE_SHIFT_MIN`
    /// (it read everything then).
    pub(crate) fn catch_up(&mut self) -> io::Result<()> {
        if !self.shift_stall_clocks(Instant::now()) {
            return Ok(());
        }
        match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        self.handle_events(now);
        self.left_loop = now;
        Ok(())
    }

    /// The loop of [`Engine::drive`]. It reads the clock once per poll, not once per step,
    /// and keeps the last reading in `left_loop`.
    fn drive_inner(
        &mut self,
        mut now: Instant,
        until: Option<Instant>,
        done: &mut impl FnMut(&Engine) -> bool,
        interrupted: &mut impl FnMut() -> bool,
    ) -> io::Result<bool> {
        loop {
            if self.next_due.is_some_and(|d| now >= d) {
                self.tick(now);
            }
            if done(self) {
                return Ok(true);
            }
            if interrupted() {
                return Ok(false);
            }
            if let Some(u) = until {
                if now >= u {
                    return Ok(false);
                }
            }
            let timeout = if self.cfg.busy_poll {
                Some(Duration::ZERO)
            } else {
                let wake = match (self.next_due, until) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                wake.map(|w| w.saturating_duration_since(now))
            };
            now = self.poll_once(timeout)?;
            self.left_loop = now;
        }
    }

    /// Handle timers and recompute [`Engine::next_due`].
    fn tick(&mut self, now: Instant) {
        let mut next: Option<Instant> = None;
        let mut due = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        // Backwards: expiring an op swap-removes it from `active`.
        let mut k = self.active.len();
        while k > 0 {
            k -= 1;
            let slot = self.active[k];
            let op = &mut self.ops[slot as usize];
            if now >= op.deadline {
                op.tally.expire();
                let id = OpId { slot, gen: op.gen };
                self.check_decided(id, now);
            } else {
                due(op.deadline);
            }
        }
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            match node.conn {
                Conn::Connecting(_) if now >= node.connect_deadline => {
                    self.fail_node(i, Fault::Connect(io::ErrorKind::TimedOut), now);
                }
                Conn::Connecting(_) => due(node.connect_deadline),
                Conn::Up(_) if !node.pending.is_empty() => {
                    let stall = node.last_progress + self.cfg.stall_timeout;
                    if now >= stall {
                        self.fail_node(i, Fault::Closed(io::ErrorKind::TimedOut), now);
                    } else {
                        due(stall);
                    }
                }
                _ => {}
            }
        }
        self.next_due = next;
    }

    /// Wait for readiness (up to `timeout`) and handle it; returns the instant the wait
    /// ended.
    fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<Instant> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(Instant::now()),
            Err(e) => return Err(e),
        }
        if self.events.is_empty() && timeout == Some(Duration::ZERO) {
            // Busy-poll found nothing: give the core away for a moment. Where the masters
            // share the machine (tests, benches, small hosts), a pure spin would steal the
            // very CPU the replies need; with a core to spare this costs one cheap syscall.
            std::thread::yield_now();
            return Ok(Instant::now());
        }
        let now = Instant::now();
        self.handle_events(now);
        Ok(now)
    }

    /// Handle the readiness events of the last poll.
    fn handle_events(&mut self, now: Instant) {
        // Handling an event needs `&mut self`: borrow the events out for the walk (an
        // empty `Events` allocates nothing) and put them back after.
        let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        for ev in events.iter() {
            let i = ev.token().0;
            if i >= self.nodes.len() {
                continue; // the waker, or spurious
            }
            let error = ev.is_error();
            let closed = ev.is_read_closed() || error;
            let readable = ev.is_readable() || closed;
            let writable = ev.is_writable() || ev.is_write_closed() || error;
            if matches!(self.nodes[i].conn, Conn::Connecting(_)) {
                if !writable && !readable {
                    continue;
                }
                match self.finish_connect(i) {
                    Ok(true) => {
                        let node = &mut self.nodes[i];
                        node.stats.connects += 1;
                        self.flush_node(i);
                    }
                    Ok(false) => continue,
                    Err(f) => {
                        self.fail_node(i, f, now);
                        continue;
                    }
                }
            } else if writable && self.nodes[i].has_unwritten() {
                // Edge-triggered: every readable edge reports writable too; most of them
                // find nothing to write.
                self.flush_node(i);
            }
            if readable && self.nodes[i].is_up() {
                self.read_node(i, closed, now);
            }
        }
        self.events = events;
    }

    /// The documented non-blocking connect steps: a pending error means failure; a
    /// `peer_addr` means connected; `NotConnected` means not yet.
    fn finish_connect(&mut self, i: usize) -> Result<bool, Fault> {
        let node = &mut self.nodes[i];
        let Conn::Connecting(stream) = &mut node.conn else {
            return Ok(true);
        };
        if let Ok(Some(e)) | Err(e) = stream.take_error() {
            return Err(Fault::Connect(e.kind()));
        }
        match stream.peer_addr() {
            Ok(_) => {
                let Conn::Connecting(s) = std::mem::replace(&mut node.conn, Conn::Down) else {
                    unreachable!()
                };
                node.conn = Conn::Up(s);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(Fault::Connect(e.kind())),
        }
    }

    /// Read until the socket is drained. `closed`: the peer's FIN (or an error) came with
    /// this event; read on to the end of stream rather than trusting a short read, since no
    /// further edge will announce it.
    fn read_node(&mut self, i: usize, closed: bool, now: Instant) {
        loop {
            let node = &mut self.nodes[i];
            // Make room: compact, or grow up to the largest frame the limits allow.
            if node.in_end == node.inbuf.len() {
                if node.in_start > 0 {
                    node.inbuf.copy_within(node.in_start..node.in_end, 0);
                    node.in_end -= node.in_start;
                    node.in_start = 0;
                } else {
                    let cap = node.parser.limits().max_bulk_len + 64 * 1024;
                    if node.inbuf.len() >= cap {
                        self.fail_node(i, Fault::Protocol(resp::Error::BulkTooLong), now);
                        return;
                    }
                    let new_len = (node.inbuf.len() * 2).min(cap);
                    node.inbuf.resize(new_len, 0);
                }
            }
            let Conn::Up(stream) = &mut node.conn else {
                return;
            };
            let space = node.inbuf.len() - node.in_end;
            node.stats.reads += 1;
            match stream.read(&mut node.inbuf[node.in_end..]) {
                Ok(0) => {
                    self.fail_node(i, Fault::Closed(io::ErrorKind::UnexpectedEof), now);
                    return;
                }
                Ok(n) => {
                    node.in_end += n;
                    node.last_progress = now;
                    if !self.process_replies(i, now) {
                        return;
                    }
                    // A short read drained the socket: the next edge will tell us more.
                    if n < space && !closed {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail_node(i, Fault::Closed(e.kind()), now);
                    return;
                }
            }
        }
    }

    /// Parse and dispatch every complete reply; `false` if the connection was closed.
    fn process_replies(&mut self, i: usize, now: Instant) -> bool {
        loop {
            let node = &mut self.nodes[i];
            if node.in_start == node.in_end {
                node.in_start = 0;
                node.in_end = 0;
                return true;
            }
            // Whole small replies (nearly all of them) take the stateless fast path; once a
            // frame is seen partial, the resumable parser takes over until it completes, so
            // a large reply arriving in pieces is still scanned once.
            let buf = &node.inbuf[node.in_start..node.in_end];
            let parsed = if node.resuming {
                node.parser.parse(buf)
            } else {
                match resp::parse(buf, node.parser.limits()) {
                    Ok(resp::Status::Partial(_)) => node.parser.parse(buf),
                    other => other,
                }
            };
            node.resuming = matches!(parsed, Ok(resp::Status::Partial(_)));
            let (frame, used) = match parsed {
                Ok(resp::Status::Complete(complete)) => complete,
                Ok(resp::Status::Partial(_)) => return true,
                Err(e) => {
                    self.fail_node(i, Fault::Protocol(e), now);
                    return false;
                }
            };
            let Some(tag) = node.pending.pop_front() else {
                // More replies than requests: the stream can not be trusted.
                self.fail_node(i, Fault::Unexpected, now);
                return false;
            };
            let setup = match tag {
                Tag::Op { id, req, eval } => {
                    let value = match frame {
                        Frame::Integer(v) => v,
                        _ => 0,
                    };
                    let classified = rules::classify(req, &frame);
                    node.in_start += used;
                    node.answered = true;
                    match classified {
                        Ok(outcome) => self.op_reply(i, id, req, eval, outcome, value, now),
                        Err(()) => {
                            // A reply that fits no request: the stream can not be trusted.
                            let f = Fault::Unexpected;
                            self.op_reply(i, id, req, eval, Outcome::Failed(f), 0, now);
                            self.fail_node(i, f, now);
                            return false;
                        }
                    }
                    continue;
                }
                Tag::Setup(setup) => interpret(setup, &frame),
            };
            node.in_start += used;
            node.answered = true;
            match setup {
                SetupReply::Done(Ok(())) => {
                    node.failures = 0;
                    node.retry_at = None;
                    // The last of AUTH and SELECT confirmed: requests may go out now.
                    let last_gate = matches!(tag, Tag::Setup(Setup::Select))
                        || (matches!(tag, Tag::Setup(Setup::Auth)) && node.db == 0);
                    if last_gate && node.gate.take().is_some() {
                        self.flush_node(i);
                    }
                }
                SetupReply::Durable(durable) => node.durable = durable,
                SetupReply::InfoRefused(f) => {
                    // Only the amnesia guard cannot do without INFO; the duplicate check
                    // just goes without it.
                    if self.cfg.amnesia_guard.is_some() {
                        self.fail_node(i, f, now);
                        return false;
                    }
                }
                SetupReply::Done(Err(f)) => {
                    if matches!(f, Fault::Handshake(_)) {
                        // A refused handshake is a configuration problem: back off.
                        node.answered = false;
                    }
                    self.fail_node(i, f, now);
                    return false;
                }
                SetupReply::Info { uptime, run_id } => {
                    // Trust the master's yes votes only once it has been up for max_ttl:
                    // before that it may have forgotten locks that are still held.
                    // Redis computes `uptime_in_seconds` from a start time truncated to the
                    // second, so it can overstate the uptime by up to a second: count one
                    // second less.
                    let guard = self.cfg.amnesia_guard.unwrap_or_default();
                    let up = Duration::from_secs(uptime.saturating_sub(1));
                    node.votes_from = Some(now + guard.saturating_sub(up));
                    node.run_id = Some(run_id);
                    self.mark_same_servers();
                }
            }
        }
    }

    /// A master whose `run_id` equals that of a master listed before it is the same
    /// server reached twice: mark it (its votes are refused). Run at every `INFO` reply.
    fn mark_same_servers(&mut self) {
        for i in 0..self.nodes.len() {
            let id = self.nodes[i].run_id;
            let dup = id.is_some() && self.nodes[..i].iter().any(|n| n.run_id == id);
            self.nodes[i].same_server = dup;
        }
    }

    /// Why master `i`'s yes to a grant must not count now, if it must not: it is the same
    /// server as an earlier master, fencing needs durability it lacks, or the amnesia
    /// guard still holds it back. The vote's effect stands on the master; cleanup treats
    /// it like any yes (`rules::may_hold`).
    #[inline]
    fn refuse_vote(&self, i: usize, now: Instant) -> Option<Fault> {
        let node = &self.nodes[i];
        if node.same_server {
            Some(Fault::SameServer)
        } else if self.cfg.require_durable && !node.durable {
            Some(Fault::NotDurable)
        } else if self.cfg.amnesia_guard.is_some() && node.votes_from.is_none_or(|t| now < t) {
            Some(Fault::Amnesiac)
        } else {
            None
        }
    }

    /// Master `i` answered op `id`: apply the vote checks, retry `-NOSCRIPT` with `EVAL`,
    /// count the vote, decide and free the op when due.
    #[allow(clippy::too_many_arguments)]
    fn op_reply(
        &mut self,
        i: usize,
        id: OpId,
        req: Request,
        eval: bool,
        mut outcome: Outcome,
        value: i64,
        now: Instant,
    ) {
        if outcome.is_ok() && req.grants() {
            if let Some(fault) = self.refuse_vote(i, now) {
                outcome = Outcome::Failed(fault);
            }
        }
        if let Outcome::Failed(Fault::Redis(t)) = outcome {
            if t.starts_with(b"NOSCRIPT") && !eval && self.retry_with_eval(i, id, req) {
                return;
            }
        }
        let op = &mut self.ops[id.slot as usize];
        if op.gen != id.gen {
            return;
        }
        op.outstanding = op.outstanding.saturating_sub(1);
        if op.state != OpState::Free {
            if outcome.is_ok() && value > op.max_value {
                op.max_value = value;
            }
            op.tally.record(i, outcome);
        }
        self.check_decided(id, now);
    }

    /// `-NOSCRIPT` (the master restarted or its script cache was flushed): send the same
    /// request again with `EVAL`, which also caches the script. The op keeps waiting.
    ///
    /// A grant is retried only while its round is undecided: once decided, its result is
    /// final, and a failed attempt's cleanup release may already be queued on this master;
    /// an `EVAL` behind it would take the key again for the whole TTL, for nobody. The
    /// script did not run, so nothing is left to clean up. A release is always retried.
    fn retry_with_eval(&mut self, i: usize, id: OpId, req: Request) -> bool {
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return false;
        }
        if req.grants() && op.state != OpState::Active {
            return false;
        }
        let upto = self.shared.len();
        self.unshare(i, upto);
        let op = &self.ops[id.slot as usize];
        let node = &mut self.nodes[i];
        node.stats.noscript += 1;
        encode_request(&mut node.out, req, &op.args, true);
        node.pending.push_back(Tag::Op {
            id,
            req,
            eval: true,
        });
        let stall = node.last_progress + self.cfg.stall_timeout;
        self.due_by(stall);
        self.flush_node(i);
        true
    }

    /// Counters of every master.
    pub(crate) fn stats(&self) -> impl Iterator<Item = NodeStats> + '_ {
        self.nodes.iter().map(|n| n.stats)
    }
}

/// What a handshake reply means.
enum SetupReply {
    /// Accepted, or refused with this fault.
    Done(Result<(), Fault>),
    /// `INFO server`: how long the master has been up, and its run id.
    Info { uptime: u64, run_id: [u8; 40] },
    /// `INFO server` refused or unreadable.
    InfoRefused(Fault),
    /// `CONFIG GET append*`: whether every write is persisted (a refusal reads as no).
    Durable(bool),
}

fn interpret(setup: Setup, frame: &Frame<'_>) -> SetupReply {
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

#[cfg(target_os = "linux")]
const EINPROGRESS: i32 = 115;
#[cfg(not(target_os = "linux"))]
const EINPROGRESS: i32 = 36;

/// One `write`: the bytes the kernel took (0 when it would block), or why the connection
/// is broken.
#[inline]
fn write_some(stream: &mut TcpStream, bytes: &[u8], stats: &mut NodeStats) -> Result<usize, Fault> {
    loop {
        stats.writes += 1;
        return match stream.write(bytes) {
            Ok(0) => Err(Fault::Closed(io::ErrorKind::WriteZero)),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(Fault::Closed(e.kind())),
        };
    }
}

fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    sock.set_keepalive(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        // EINPROGRESS (Linux 115): the connect goes on in the background.
        Err(e) if e.raw_os_error() == Some(EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(sock)))
}

/// The handshake: AUTH, SELECT, SCRIPT LOAD, `INFO server` (uptime for the amnesia guard,
/// `run_id` to catch one server listed twice) and, for fencing, `CONFIG GET append*`.
/// Queued ahead of whatever the first round sends. Without AUTH or SELECT the requests go
/// out in the same write (a reconnect costs no extra round trip); with them, requests wait
/// for their confirmation (see `Node::gate`).
fn write_handshake(node: &mut Node, durability: bool) {
    if let Some(pw) = &node.password {
        match &node.user {
            Some(u) => resp::encode_command(
                &mut node.out,
                &[
                    Arg::Bytes(b"AUTH"),
                    Arg::Bytes(u.as_bytes()),
                    Arg::Bytes(pw.as_bytes()),
                ],
            ),
            None => resp::encode_command(
                &mut node.out,
                &[Arg::Bytes(b"AUTH"), Arg::Bytes(pw.as_bytes())],
            ),
        }
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

/// Encode one request of an op. Single-key acquire is `SET key token NX PX ttl`; the rest
/// are scripts, by `EVALSHA` (or `EVAL` after `-NOSCRIPT`).
fn encode_request(out: &mut Vec<u8>, req: Request, args: &OpArgs, eval: bool) {
    let token: &[u8] = args.token.as_ref().map_or(&[], |t| t.as_bytes());
    let nkeys = args.keys.len();
    // The hot requests of a lock cycle, written from constant pieces: same bytes as the
    // general path below (a unit test checks), a fraction of the instructions.
    if nkeys == 1 && token.len() == TOKEN_LEN && !eval {
        let key = args.keys.iter().next().unwrap_or(&[]);
        match req {
            Request::Acquire => {
                out.extend_from_slice(b"*6\r\n$3\r\nSET\r\n");
                push_bulk(out, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n$2\r\nNX\r\n$2\r\nPX\r\n");
                push_bulk_uint(out, args.ttl_ms);
                return;
            }
            Request::Release | Request::Extend => {
                let (head, sha) = if req == Request::Release {
                    (&b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n"[..], scripts::RELEASE.sha)
                } else {
                    (&b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n"[..], scripts::EXTEND.sha)
                };
                out.extend_from_slice(head);
                out.extend_from_slice(sha.as_bytes());
                out.extend_from_slice(b"\r\n$1\r\n1\r\n");
                push_bulk(out, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n");
                if req == Request::Extend {
                    push_bulk_uint(out, args.ttl_ms);
                }
                return;
            }
            _ => {}
        }
    }
    encode_request_general(out, req, args, eval, token, nkeys);
}

/// `$<len>\r\n<bytes>\r\n`.
fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    push_decimal(out, bytes.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// An integer argument as a bulk string.
fn push_bulk_uint(out: &mut Vec<u8>, v: u64) {
    let mut digits = [0u8; 20];
    let n = decimal(v, &mut digits);
    out.push(b'$');
    push_decimal(out, n as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&digits[20 - n..]);
    out.extend_from_slice(b"\r\n");
}

fn push_decimal(out: &mut Vec<u8>, v: u64) {
    // Lengths of keys and numbers: nearly always one or two digits.
    if v < 10 {
        out.push(b'0' + v as u8);
        return;
    }
    if v < 100 {
        out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]);
        return;
    }
    let mut digits = [0u8; 20];
    let n = decimal(v, &mut digits);
    out.extend_from_slice(&digits[20 - n..]);
}

/// Write `v` right-aligned into `buf`; returns the digit count.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> usize {
    let mut i = 20;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return 20 - i;
        }
    }
}

fn encode_request_general(
    out: &mut Vec<u8>,
    req: Request,
    args: &OpArgs,
    eval: bool,
    token: &[u8],
    nkeys: usize,
) {
    let mut v: SmallVec<[Arg<'_>; 16]> = SmallVec::new();
    let script: Script = match req {
        Request::Acquire if nkeys == 1 => {
            let key = args.keys.iter().next().unwrap_or(&[]);
            resp::encode_command(
                out,
                &[
                    Arg::Bytes(b"SET"),
                    Arg::Bytes(key),
                    Arg::Bytes(token),
                    Arg::Bytes(b"NX"),
                    Arg::Bytes(b"PX"),
                    Arg::Uint(args.ttl_ms),
                ],
            );
            return;
        }
        Request::Acquire | Request::AcquireMany => scripts::ACQUIRE_MANY,
        Request::Release => scripts::RELEASE,
        Request::Extend => scripts::EXTEND,
        Request::FenceDraw => scripts::FENCE_DRAW,
        Request::FenceWriteBack => scripts::FENCE_RAISE,
    };
    if eval {
        v.push(Arg::Bytes(b"EVAL"));
        v.push(Arg::Bytes(script.src.as_bytes()));
    } else {
        v.push(Arg::Bytes(b"EVALSHA"));
        v.push(Arg::Bytes(script.sha.as_bytes()));
    }
    v.push(Arg::Uint(nkeys as u64));
    v.extend(args.keys.iter().map(Arg::Bytes));
    match req {
        Request::FenceWriteBack => {
            v.push(Arg::Bytes(token));
            v.push(Arg::Uint(args.value));
        }
        Request::Release | Request::FenceDraw => v.push(Arg::Bytes(token)),
        _ => {
            v.push(Arg::Bytes(token));
            v.push(Arg::Uint(args.ttl_ms));
        }
    }
    resp::encode_command(out, &v);
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

    #[test]
    fn fast_encoder_matches_the_general_encoder() {
        let mut src = crate::token::TokenSource::new().unwrap();
        for key in [
            &b"k"[..],
            b"orders:42",
            &[0u8, 13, 10, 255][..],
            &[b'y'; 10][..],
            &[b'z'; 99][..],
            &[b'w'; 100][..],
            &[b'x'; 300][..],
        ] {
            for ttl in [0u64, 1, 9, 10, 99, 100, 30_000, (1 << 31) - 1, u64::MAX] {
                let mut a = OpArgs::default();
                a.set([key], src.next().unwrap(), ttl);
                for req in [Request::Acquire, Request::Release, Request::Extend] {
                    let (mut fast, mut general) = (Vec::new(), Vec::new());
                    encode_request(&mut fast, req, &a, false);
                    let token = a.token.as_ref().unwrap().as_bytes();
                    encode_request_general(&mut general, req, &a, false, token, 1);
                    assert_eq!(fast, general, "{req:?} key {key:?} ttl {ttl}");
                }
            }
        }
    }

    #[test]
    fn requests_encode_as_documented() {
        let mut a = OpArgs::default();
        let tok = crate::token::TokenSource::new().unwrap().next().unwrap();
        a.set([&b"k"[..]], tok, 1500);
        let mut out = Vec::new();
        encode_request(&mut out, Request::Acquire, &a, false);
        let want = format!(
            "*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$32\r\n{}\r\n$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n1500\r\n",
            tok.as_str()
        );
        assert_eq!(String::from_utf8(out.clone()).unwrap(), want);
        out.clear();
        encode_request(&mut out, Request::Release, &a, false);
        let want = format!(
            "*5\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n1\r\n$1\r\nk\r\n$32\r\n{}\r\n",
            scripts::RELEASE.sha,
            tok.as_str()
        );
        assert_eq!(String::from_utf8(out.clone()).unwrap(), want);
        out.clear();
        encode_request(&mut out, Request::Extend, &a, true);
        assert!(out.starts_with(b"*6\r\n$4\r\nEVAL\r\n"));
        assert!(out.ends_with(b"$4\r\n1500\r\n"));
    }
}
