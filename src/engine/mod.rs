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
//! closed (a hung or frozen master), which also bounds the memory its FIFO can take. The
//! releases still unanswered when a connection closes are owed to the master's next
//! connection (`conn::Owed`), sent there after the handshake while the lock's TTL lasts.

mod conn;
mod encode;
mod ops;
mod sub;
#[cfg(feature = "tls")]
mod tls;
mod transport;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token as MioToken, Waker};

use crate::resp::{self, Frame};
use crate::rules::{self, Decision, ErrorText, Fault, Outcome, Request, Tally, TlsFault};
use crate::stats::MasterStats;

pub(crate) use conn::Node;
use conn::{interpret, write_handshake, Owed, Setup, SetupReply, Tag};
use encode::encode_request;
use ops::OpState;
pub(crate) use ops::{KeyList, Line, Op, OpArgs, OpId};
pub(crate) use sub::{fingerprint, ChanId, Fingerprint, Notice};
#[cfg(feature = "tls")]
pub(crate) use tls::{client_config, TlsTarget};
pub(crate) use transport::Target;
use transport::{connect_tcp, connect_unix, read_some, write_some, Conn, Stream};

/// The mio token reserved for the cross-thread waker.
pub(crate) const WAKER: MioToken = MioToken(usize::MAX);

/// Op slots the table has room for before it allocates.
const OPS_RESERVED: usize = 256;
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
    /// The owners of ops decided since the driver last looked (see [`Engine::take_decided`]).
    decided: Vec<(Owner, OpId)>,
    /// The origin of [`Engine::micros`], and its last answer: replies of one poll share
    /// their `now`, so latencies cost one clock subtraction per poll, not one per reply.
    base: Instant,
    clock: (Instant, u64),
    /// Answers of the resolver threads, handed back with a wake of `waker`.
    resolved: Arc<Mutex<Vec<Resolved>>>,
    /// Resolver threads running (their answers not taken yet).
    resolving: usize,
    /// The channels waiters listen on for releases (see `sub.rs`).
    chans: sub::Channels,
    /// Some master is known to be the same server as another (same `run_id`): a yes to a
    /// grant is then checked against the other names' votes (one server, one vote).
    same_servers: bool,
}

/// A resolver thread's answer: master, which resolve, the address or why none.
type Resolved = (usize, u64, Result<SocketAddr, ErrorText>);

/// Whoever started an op and wants to hear when it is decided (a task of the layer
/// above, as an opaque number). Ops without one are fire-and-forget (cleanup releases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner(pub u64);

impl Engine {
    pub(crate) fn new(nodes: Vec<Node>, cfg: NetConfig) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let quorum = rules::quorum(nodes.len());
        let mut e = Engine {
            poll,
            events: Events::with_capacity(64),
            nodes,
            // Reserved, not touched: the table grows into it without an allocation when a
            // lagging master keeps many ops waiting for its replies (the pages are only
            // mapped when used).
            ops: Vec::with_capacity(OPS_RESERVED),
            free: Vec::with_capacity(OPS_RESERVED),
            shared: Vec::with_capacity(1024),
            cfg,
            quorum,
            waker,
            left_loop: Instant::now(),
            active: Vec::with_capacity(OPS_RESERVED),
            next_due: None,
            decided: Vec::with_capacity(OPS_RESERVED),
            base: Instant::now(),
            clock: (Instant::now(), 0),
            resolved: Arc::new(Mutex::new(Vec::new())),
            resolving: 0,
            chans: sub::Channels::default(),
            same_servers: false,
        };
        e.clock = (e.base, 0);
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

    /// `t` in microseconds since the engine's origin (cached for the last `t` asked).
    #[inline]
    fn micros(&mut self, t: Instant) -> u64 {
        if t != self.clock.0 {
            let us = t.saturating_duration_since(self.base);
            self.clock = (t, us.as_secs() * 1_000_000 + u64::from(us.subsec_micros()));
        }
        self.clock.1
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
            started_us: 0,
            deadline: now,
            decided_at: now,
            args: OpArgs::default(),
            max_value: 0,
            left_ms: smallvec::SmallVec::new(),
            holders: smallvec::SmallVec::new(),
            outstanding: 0,
            owner: None,
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
    /// starting all ops of a batch. When the op is decided, `owner` (if any) is queued for
    /// [`Engine::take_decided`]; an op without an owner is freed once its replies are in.
    pub(crate) fn start(
        &mut self,
        req: Request,
        fill: impl FnOnce(&mut OpArgs),
        timeout: Duration,
        now: Instant,
        target: impl Fn(usize) -> bool,
        owner: Option<Owner>,
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
        let started_us = self.micros(now);
        let op = &mut self.ops[slot as usize];
        op.started_us = started_us;
        let deadline = now + timeout;
        op.deadline = deadline;
        op.decided_at = now;
        op.outstanding = 0;
        op.max_value = 0;
        if req == Request::AcquireWait {
            op.left_ms.clear();
            op.left_ms.resize(n, 0);
            op.holders.clear();
            op.holders.resize(n, None);
        }
        op.owner = owner;
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
            // that is still queued); grants wait until a backlogged master catches up, and
            // are never sent to a master known to be the same server as one listed before
            // it (its `SET` could run first and make the other name's answer "taken").
            if req != Request::Release {
                let node = &self.nodes[i];
                let refused = if node.same_server {
                    Some(Fault::SameServer)
                } else if node.pending.len() >= self.cfg.backlog_limit {
                    Some(Fault::Backlogged)
                } else {
                    None
                };
                if let Some(fault) = refused {
                    self.unshare(i, at);
                    self.record(id, i, Outcome::Failed(fault), now);
                    continue;
                }
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
                    node.stats.requests += 1;
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

    /// The caller has read the op's result (or gave up on it); its slot is reused once no
    /// reply is owed, and its owner is not told of a decision after this.
    pub(crate) fn finish(&mut self, id: OpId) {
        let op = &mut self.ops[id.slot as usize];
        if op.gen == id.gen {
            op.collected = true;
            op.owner = None;
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
        if op.state == OpState::Decided
            && op.outstanding == 0
            && (op.collected || op.owner.is_none())
        {
            op.state = OpState::Free;
            self.free.push(slot);
        }
    }

    fn record(&mut self, id: OpId, node: usize, outcome: Outcome, now: Instant) {
        let op = &mut self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return;
        }
        // Faults count (once: not for a request its round already counted as timed out);
        // a master not asked (`NotHeld` from `start`) did nothing.
        let first = op.tally.outcomes().get(node) == Some(&Outcome::Pending);
        if let (true, Outcome::Failed(_)) = (first, outcome) {
            self.nodes[node].stats.outcome(outcome);
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
            if let Some(owner) = self.ops[id.slot as usize].owner {
                self.decided.push((owner, id));
            }
        }
        self.maybe_free(id.slot);
    }

    /// Some op was decided and its owner not told yet.
    #[inline]
    pub(crate) fn has_decided(&self) -> bool {
        !self.decided.is_empty()
    }

    /// The next op decided since the last call, with its owner.
    #[inline]
    pub(crate) fn take_decided(&mut self) -> Option<(Owner, OpId)> {
        self.decided.pop()
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
            Conn::Up(_) | Conn::Connecting(_) | Conn::Resolving => {
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
        let stream = match &node.target {
            &Target::Addr(addr) => self.open_tcp(i, addr),
            Target::Unix(path) => connect_unix(path)
                .map(Stream::Unix)
                .map_err(|e| Fault::Connect(e.kind())),
            Target::Host { .. } => return self.start_resolve(i, now),
        };
        let registered = stream.and_then(|mut s| {
            s.register(self.poll.registry(), MioToken(i))
                .map(|()| s)
                .map_err(|e| Fault::Connect(e.kind()))
        });
        match registered {
            Ok(stream) => {
                self.new_connection(i, now);
                self.nodes[i].conn = Conn::Connecting(stream);
                Ok(())
            }
            Err(f) => {
                self.connect_refused(i, f, now);
                Err(f)
            }
        }
    }

    /// Start a TCP connect to `addr` for master `i`, with TLS when its URL asks.
    fn open_tcp(&self, i: usize, addr: SocketAddr) -> Result<Stream, Fault> {
        let tcp = connect_tcp(addr).map_err(|e| Fault::Connect(e.kind()))?;
        #[cfg(feature = "tls")]
        if let Some(target) = &self.nodes[i].tls {
            return Ok(Stream::Tls(Box::new(tls::TlsStream::new(tcp, target)?)));
        }
        let _ = i;
        Ok(Stream::Tcp(tcp))
    }

    /// A new connection of master `i` starts (resolving or connecting): fresh buffers, its
    /// handshake queued, the connect deadline set.
    fn new_connection(&mut self, i: usize, now: Instant) {
        let node = &mut self.nodes[i];
        node.connect_deadline = now + self.cfg.connect_timeout;
        node.last_progress = now;
        let first = node.connect_deadline.min(now + self.cfg.stall_timeout);
        node.answered = false;
        node.clear_streams();
        node.votes_from = None;
        node.durable = false;
        write_handshake(node, self.cfg.require_durable);
        // The releases a closed connection still owed, behind the handshake (and its gate).
        node.owed.retain(|o| o.until > now);
        for o in node.owed.iter() {
            encode_request(&mut node.out, Request::Release, &o.args, false);
            node.pending.push_back(Tag::Owed);
        }
        self.due_by(first);
    }

    /// Resolve master `i`'s host on a helper thread: `getaddrinfo` blocks for as long as
    /// the system's resolver takes, and the loop must not. The answer comes back through
    /// `resolved` and a wake of the loop's waker ([`Engine::take_resolved`]); requests queue
    /// meanwhile. The connect timeout covers the resolve: past it the master is down (its
    /// thread's late answer is dropped). One thread per master at a time: while an old one
    /// still hangs, the master stays down.
    fn start_resolve(&mut self, i: usize, now: Instant) -> Result<(), Fault> {
        let node = &mut self.nodes[i];
        let Target::Host { host, port } = &node.target else {
            unreachable!("only host names are resolved")
        };
        if node.resolving {
            let f = Fault::Resolve(ErrorText::new(b"timed out (the last resolve still runs)"));
            self.connect_refused(i, f, now);
            return Err(f);
        }
        let (host, port) = (host.clone(), *port);
        node.resolve_gen += 1;
        let gen = node.resolve_gen;
        let results = self.resolved.clone();
        let waker = self.waker.clone();
        let spawned = std::thread::Builder::new()
            .name("redlock-resolve".into())
            .spawn(move || {
                let answer = match (&*host, port).to_socket_addrs() {
                    Ok(addrs) => crate::url::pick_addr(&addrs.collect::<Vec<_>>())
                        .ok_or_else(|| ErrorText::new(b"no addresses")),
                    Err(e) => {
                        let msg = e.to_string();
                        // std prefixes getaddrinfo's words with this; keep the words.
                        let msg = msg
                            .strip_prefix("failed to lookup address information: ")
                            .unwrap_or(&msg);
                        Err(ErrorText::new(msg.as_bytes()))
                    }
                };
                if let Ok(mut r) = results.lock() {
                    r.push((i, gen, answer));
                }
                let _ = waker.wake();
            });
        if let Err(e) = spawned {
            let f = Fault::Resolve(ErrorText::new(
                format!("cannot start a resolver thread: {e}").as_bytes(),
            ));
            self.connect_refused(i, f, now);
            return Err(f);
        }
        self.nodes[i].resolving = true;
        self.resolving += 1;
        self.new_connection(i, now);
        self.nodes[i].conn = Conn::Resolving;
        Ok(())
    }

    /// Take the resolver threads' answers: connect where a master still waits for one,
    /// fail it where its host did not resolve.
    #[cold]
    fn take_resolved(&mut self, now: Instant) {
        let answers = match self.resolved.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(_) => return,
        };
        for (i, gen, answer) in answers {
            self.resolving -= 1;
            let node = &mut self.nodes[i];
            node.resolving = false;
            if !matches!(node.conn, Conn::Resolving) || node.resolve_gen != gen {
                continue; // timed out meanwhile: the master is down already
            }
            if let Ok(addr) = &answer {
                node.addr = Some(*addr);
            }
            let stream = answer.map_err(Fault::Resolve).and_then(|addr| {
                let mut s = self.open_tcp(i, addr)?;
                s.register(self.poll.registry(), MioToken(i))
                    .map_err(|e| Fault::Connect(e.kind()))?;
                Ok(s)
            });
            match stream {
                Ok(s) => {
                    let node = &mut self.nodes[i];
                    node.conn = Conn::Connecting(s);
                    node.last_progress = now;
                }
                Err(f) => self.fail_node(i, f, now),
            }
        }
    }

    /// A connect failed at once (no connection to close): count it, then back off.
    fn connect_refused(&mut self, i: usize, fault: Fault, now: Instant) {
        let stats = &mut self.nodes[i].stats;
        stats.disconnects += 1;
        stats.last_fault = Some(fault);
        self.connect_failed(i, fault, now);
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
        let owed = !node.pending.is_empty();
        match conn {
            // With requests owed, close with a reset, not a FIN: requests still unsent or
            // unread by the master are dropped rather than run later, behind a cleanup
            // release sent on the next connection. (A request the master already took may
            // still run: such a key expires within its TTL, and the round reports the
            // master as "connection lost".)
            Conn::Up(s) | Conn::Connecting(s) => s.close(self.poll.registry(), owed),
            Conn::Down | Conn::Resolving => {}
        }
        let node = &mut self.nodes[i];
        node.clear_streams();
        let answered = node.answered;
        let mut pending = std::mem::take(&mut node.pending);
        for tag in pending.drain(..) {
            if let Tag::Op { id, req, .. } = tag {
                // A release the master may not have run: owed to its next connection.
                let op = &self.ops[id.slot as usize];
                if req == Request::Release && op.gen == id.gen {
                    let until = op.started + Duration::from_millis(op.args.ttl_ms);
                    if until > now {
                        let args = op.args.clone();
                        // Bounded (a master frozen under load is owed thousands), oldest
                        // kept: a connection closed with a reset may still run the start of
                        // what it was sent (Redis reads one more buffer, 16 KiB), not the
                        // rest; past the bound a release is left to the TTL, as before.
                        // Half of `max_pending`: sending them leaves the new connection
                        // room (a full one would be closed again at once).
                        let owed = &mut self.nodes[i].owed;
                        if owed.len() < self.cfg.max_pending / 2 {
                            owed.push_back(Owed { args, until });
                        }
                    }
                }
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
        // Releases owed: reconnect once the backoff allows (see `tick`).
        if !self.nodes[i].owed.is_empty() {
            self.due_by(self.nodes[i].retry_at.unwrap_or(now));
        }
    }

    /// Releases wait to be sent: for a master's next connection (within the lock's TTL),
    /// or behind bytes its connection has not taken (a master that stopped reading). The
    /// shared client's loop keeps running for them (a cheap test: no queue is walked).
    pub(crate) fn releases_unsent(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| !n.owed.is_empty() || (!n.pending.is_empty() && n.has_unwritten()))
    }

    /// Some master is still owed a release: queued or unanswered on its connection, or
    /// waiting for its next connection (within the lock's TTL). A client that shuts down
    /// delivers them first, within its bound.
    pub(crate) fn owes_releases(&self) -> bool {
        self.nodes.iter().any(|n| {
            !n.owed.is_empty()
                || n.pending.iter().any(|t| {
                    matches!(
                        t,
                        Tag::Op {
                            req: Request::Release,
                            ..
                        }
                    )
                })
        })
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
        if self.chans.dirty {
            self.sub_flush_all();
        }
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
        // Records rustls holds without plaintext of ours behind them (the ClientHello).
        #[cfg(feature = "tls")]
        if let Stream::Tls(t) = stream {
            if let Err(f) = t.flush(&mut node.stats) {
                self.fail_node(i, f, Instant::now());
            }
        }
    }

    /// Enter the loop; returns the time. Time the client spent outside the loop (idle
    /// between calls) is no sign of a hung master: replies may be waiting unread. Every
    /// stall clock is shifted by it. Gaps under a millisecond are left alone: a client
    /// back in the loop that often reads every reply within that millisecond, so its stall
    /// clocks are right to within one.
    pub(crate) fn enter(&mut self) -> Instant {
        let entered = Instant::now();
        self.shift_stall_clocks(entered);
        entered
    }

    /// Shift every stall clock and connect timeout by the time since the client left the
    /// loop (when that is at least `IDLE_SHIFT_MIN`); returns whether it was.
    fn shift_stall_clocks(&mut self, entered: Instant) -> bool {
        let idle = entered.saturating_duration_since(self.left_loop);
        self.left_loop = entered;
        if idle < IDLE_SHIFT_MIN {
            return false;
        }
        for node in self.nodes.iter_mut() {
            node.last_progress = (node.last_progress + idle).min(entered);
            // A connect (or a resolve) nobody watched over may well be done, its event
            // still unread: its timeout counts the time the loop ran, not the idle gap.
            let connecting = match &node.conn {
                Conn::Connecting(_) | Conn::Resolving => true,
                Conn::Up(s) => s.tls_handshaking(),
                Conn::Down => false,
            };
            if connecting {
                node.connect_deadline += idle;
            }
            node.sub.shift(idle, entered);
        }
        // Channels whose linger ran out while the client was away: dropped before their
        // connections' backlog is read.
        if self.chans.idle > 0 {
            let _ = self.expire_idle_channels(entered);
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

    /// Run the timers (op deadlines, connects, stalls) when one is due at `now`.
    #[inline]
    pub(crate) fn tick_if_due(&mut self, now: Instant) {
        if self.next_due.is_some_and(|d| now >= d) {
            self.tick(now);
        }
    }

    /// No round is undecided.
    pub(crate) fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    /// When the engine's next timer is due (a lower bound), if it has one.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.next_due
    }

    /// Wait for readiness until `wake` at the latest (at once when busy-polling) and handle
    /// it; returns the time the wait ended. The clock is read once per poll.
    pub(crate) fn wait(&mut self, now: Instant, wake: Option<Instant>) -> io::Result<Instant> {
        let timeout = if self.cfg.busy_poll {
            Some(Duration::ZERO)
        } else {
            wake.map(|w| w.saturating_duration_since(now))
        };
        let now = self.poll_once(timeout)?;
        self.left_loop = now;
        Ok(now)
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
                for (i, o) in op.tally.outcomes().iter().enumerate() {
                    if *o == Outcome::Pending {
                        self.nodes[i].stats.outcome(Outcome::TimedOut);
                    }
                }
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
                Conn::Resolving if now >= node.connect_deadline => {
                    let f = Fault::Resolve(ErrorText::new(b"timed out"));
                    self.fail_node(i, f, now);
                }
                Conn::Connecting(_) | Conn::Resolving => due(node.connect_deadline),
                // The connect timeout covers the TLS handshake too.
                Conn::Up(ref s) if s.tls_handshaking() && now >= node.connect_deadline => {
                    let f = Fault::Tls(TlsFault::Other(ErrorText::new(b"handshake timed out")));
                    self.fail_node(i, f, now);
                }
                Conn::Up(ref s) if s.tls_handshaking() => due(node.connect_deadline),
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
            // Down with releases owed (and no request to bring it back): reconnect once
            // the backoff allows; the new connection sends them.
            let node = &mut self.nodes[i];
            if matches!(node.conn, Conn::Down) && !node.owed.is_empty() {
                node.owed.retain(|o| o.until > now);
                if !node.owed.is_empty() {
                    match node.retry_at {
                        Some(t) if now < t => due(t),
                        _ => {
                            let _ = self.connect_if_down(i, now);
                            let node = &self.nodes[i];
                            let retry = node.retry_at.filter(|t| *t > now);
                            due(retry.unwrap_or(node.connect_deadline));
                        }
                    }
                }
            }
        }
        if self.chans.live > 0 {
            self.sub_tick(now, &mut due);
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
            let n = self.nodes.len();
            if i >= n && i < 2 * n {
                self.sub_event(i - n, ev, now);
                continue;
            }
            if i >= n {
                // The waker (a resolver thread may have answered), or spurious.
                if self.resolving > 0 {
                    self.take_resolved(now);
                }
                continue;
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
            } else if writable
                && (self.nodes[i].has_unwritten() || self.nodes[i].conn.tls_wants_write())
            {
                // Edge-triggered: every readable edge reports writable too; most of them
                // find nothing to write.
                self.flush_node(i);
            }
            if readable && self.nodes[i].is_up() {
                self.read_node(i, closed, now);
                // TLS: the records read may want an answer (the handshake's), and the
                // plaintext rustls buffered during the handshake may now go out.
                #[cfg(feature = "tls")]
                if self.nodes[i].conn.tls_wants_write() {
                    self.flush_node(i);
                }
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
        if !stream.connected()? {
            return Ok(false);
        }
        let Conn::Connecting(s) = std::mem::replace(&mut node.conn, Conn::Down) else {
            unreachable!()
        };
        node.conn = Conn::Up(s);
        Ok(true)
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
            let drains = stream.short_read_drains();
            match read_some(stream, &mut node.inbuf[node.in_end..], &mut node.stats) {
                Ok(0) => return,
                Ok(n) => {
                    node.in_end += n;
                    node.last_progress = now;
                    if !self.process_replies(i, now) {
                        return;
                    }
                    // A short read drained the socket: the next edge will tell us more.
                    if n < space && !closed && drains {
                        return;
                    }
                }
                Err(f) => {
                    self.fail_node(i, f, now);
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
                    let (value, holder) = match frame {
                        Frame::Integer(v) => (v, None),
                        // `AcquireWait` with one key: the holder's TTL left and fingerprint.
                        Frame::Aggregate(ref a) if req == Request::AcquireWait => {
                            match rules::holder_left(a) {
                                Some((v, h)) => (v, Some(sub::fingerprint(h))),
                                None => (0, None),
                            }
                        }
                        _ => (0, None),
                    };
                    let classified = rules::classify(req, &frame);
                    node.in_start += used;
                    node.answered = true;
                    match classified {
                        Ok(outcome) => self.op_reply(i, id, req, eval, outcome, value, holder, now),
                        Err(()) => {
                            // A reply that fits no request: the stream can not be trusted.
                            let f = Fault::Unexpected;
                            self.op_reply(i, id, req, eval, Outcome::Failed(f), 0, None, now);
                            self.fail_node(i, f, now);
                            return false;
                        }
                    }
                    continue;
                }
                Tag::Setup(setup) => interpret(setup, &frame),
                Tag::Owed => {
                    // Delivered (or refused: then the keys expire by their TTL).
                    node.in_start += used;
                    node.answered = true;
                    node.owed.pop_front();
                    continue;
                }
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
                    // A `run_id` other than the one last seen at this address is a restart
                    // whatever the uptime (another server took the address over: a promoted
                    // replica, a VIP or a DNS name that flips, never saw our keys): held back
                    // for max_ttl from the moment the change was seen, across reconnects.
                    let guard = self.cfg.amnesia_guard.unwrap_or_default();
                    let up = Duration::from_secs(uptime.saturating_sub(1));
                    if node.run_id.is_some_and(|old| old != run_id) {
                        node.run_id_changed = Some(now);
                    }
                    let mut from = now + guard.saturating_sub(up);
                    if let Some(seen) = node.run_id_changed {
                        from = from.max(seen + guard);
                    }
                    node.votes_from = Some(from);
                    node.run_id = Some(run_id);
                    self.mark_same_servers();
                }
            }
        }
    }

    /// A master whose `run_id` equals that of a master listed before it is the same
    /// server reached twice: mark it (its votes are refused). Run at every `INFO` reply.
    fn mark_same_servers(&mut self) {
        let mut any = false;
        for i in 0..self.nodes.len() {
            let id = self.nodes[i].run_id;
            let first = match id {
                Some(_) => self.nodes[..i].iter().position(|n| n.run_id == id),
                None => None,
            };
            any |= first.is_some();
            #[cfg(feature = "tracing")]
            if let (Some(k), None) = (first, self.nodes[i].stats.same_as) {
                tracing::warn!(
                    master = &*self.nodes[i].name,
                    same_as = &*self.nodes[k].name,
                    "one server listed twice (same run_id): it is sent no grants and votes once"
                );
            }
            let node = &mut self.nodes[i];
            node.same_server = first.is_some();
            node.stats.same_as = first;
        }
        self.same_servers = any;
    }

    /// Another name of master `i`'s server (same `run_id`) already said yes in op `id`: the
    /// server votes once. (A name known to be a duplicate is sent no grants; a reply to
    /// one sent before the handshakes told the names apart counts if it came first.)
    fn voted_under_another_name(&self, i: usize, id: OpId) -> bool {
        let Some(run_id) = self.nodes[i].run_id else {
            return false;
        };
        let op = &self.ops[id.slot as usize];
        op.gen == id.gen
            && self.nodes.iter().enumerate().any(|(k, n)| {
                k != i
                    && n.run_id == Some(run_id)
                    && op.tally.outcomes().get(k) == Some(&Outcome::Ok)
            })
    }

    /// Why master `i`'s yes to a grant in op `id` must not count now, if it must not: the
    /// same server already said yes under another name, fencing needs durability it
    /// lacks, or the amnesia guard still holds it back. The vote's effect stands on the master; cleanup treats
    /// it like any yes (`rules::may_hold`).
    #[inline]
    fn refuse_vote(&self, i: usize, id: OpId, now: Instant) -> Option<Fault> {
        let node = &self.nodes[i];
        if self.same_servers && self.voted_under_another_name(i, id) {
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
        holder: Option<Fingerprint>,
        now: Instant,
    ) {
        if outcome.is_ok() && req.grants() {
            if let Some(fault) = self.refuse_vote(i, id, now) {
                outcome = Outcome::Failed(fault);
            }
        }
        if let Outcome::Failed(Fault::Redis(t)) = outcome {
            if t.starts_with(b"NOSCRIPT") && !eval && self.retry_with_eval(i, id, req) {
                return;
            }
        }
        if self.ops[id.slot as usize].gen != id.gen {
            return;
        }
        let latency_us = self
            .micros(now)
            .saturating_sub(self.ops[id.slot as usize].started_us);
        // Counted once per request: not again when its round already counted it as timed
        // out (a late reply still tells the latency).
        let first = {
            let op = &self.ops[id.slot as usize];
            op.state != OpState::Free && op.tally.outcomes().get(i) == Some(&Outcome::Pending)
        };
        let stats = &mut self.nodes[i].stats;
        stats.latency.record_us(latency_us);
        if first {
            stats.outcome(outcome);
        }
        let op = &mut self.ops[id.slot as usize];
        op.outstanding = op.outstanding.saturating_sub(1);
        if op.state != OpState::Free {
            if outcome.is_ok() && value > op.max_value {
                op.max_value = value;
            }
            if req == Request::AcquireWait && outcome == Outcome::Taken {
                if let Some(left) = op.left_ms.get_mut(i) {
                    *left = value;
                }
                if let Some(h) = op.holders.get_mut(i) {
                    *h = holder;
                }
            }
            op.tally.record(i, outcome);
        }
        self.check_decided(id, now);
    }

    /// `-NOSCRIPT` (the master restarted or its script cache was flushed): send the same
    /// request again with `EVAL`, which also caches the script. The op keeps waiting.
    ///
    /// A grant is retried only while its round is undecided and its owner still waits for
    /// it (not cancelled): otherwise its result is final, and a failed or cancelled
    /// attempt's cleanup release may already be queued on this master;
    /// an `EVAL` behind it would take the key again for the whole TTL, for nobody. The
    /// script did not run, so nothing is left to clean up. A release is always retried.
    fn retry_with_eval(&mut self, i: usize, id: OpId, req: Request) -> bool {
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return false;
        }
        if req.grants() && (op.state != OpState::Active || op.collected) {
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

    /// What every master did, by name.
    pub(crate) fn stats(&self) -> Vec<MasterStats> {
        self.nodes
            .iter()
            .map(|n| MasterStats::new(n.name.clone(), n.stats.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resolve that outlives the connect timeout: the master is down with
    /// `Fault::Resolve("timed out")` at once, and the late answer is dropped when it comes.
    #[test]
    fn a_resolve_past_the_connect_timeout_is_dropped() {
        let now = Instant::now();
        let target = Target::Host {
            host: Arc::from("localhost"),
            port: 1,
        };
        let limits = NetConfig::default().limits;
        let node = Node::new(Arc::from("localhost:1"), target, None, None, 0, limits, now);
        let mut e = Engine::new(vec![node], NetConfig::default()).unwrap();
        let token = crate::token::TokenSource::new().unwrap().next().unwrap();
        let keys: [&[u8]; 1] = [b"k"];
        let start = |e: &mut Engine, now| {
            e.start(
                Request::Acquire,
                |a| a.set(keys, token, 1000),
                Duration::from_secs(5),
                now,
                |_| true,
                None,
            )
        };
        let op = start(&mut e, now);
        assert!(matches!(e.nodes[0].conn, Conn::Resolving));
        assert_eq!(e.resolving, 1);
        // The connect timeout passes before anyone looks at the answer.
        let late = now + e.cfg.connect_timeout;
        e.tick(late);
        let timed_out = Fault::Resolve(ErrorText::new(b"timed out"));
        assert!(matches!(e.nodes[0].conn, Conn::Down));
        assert_eq!(e.nodes[0].stats.last_fault, Some(timed_out));
        assert_eq!(
            e.op(op).tally.outcomes()[0],
            Outcome::Failed(timed_out),
            "the op owed by the master failed with it"
        );
        // The thread's answer arrives (a wake), and is dropped: the master stays down.
        let deadline = Instant::now() + Duration::from_secs(10);
        while e.resolving > 0 && Instant::now() < deadline {
            let now = e.wait(
                Instant::now(),
                Some(Instant::now() + Duration::from_millis(10)),
            );
            now.unwrap();
        }
        assert_eq!(e.resolving, 0);
        assert!(!e.nodes[0].resolving);
        assert!(matches!(e.nodes[0].conn, Conn::Down));
        // After the backoff, a new resolve starts (the old thread is done).
        let after_backoff = late + e.cfg.backoff_max;
        let op = start(&mut e, after_backoff);
        assert!(
            matches!(e.nodes[0].conn, Conn::Resolving),
            "{:?}",
            e.op(op).tally.outcomes()
        );
    }
}
