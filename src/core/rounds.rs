//! Fan-out rounds over the masters' links, without I/O.
//!
//! An *op* is one fan-out round (acquire, release or extend of one lock). Starting an op
//! encodes its request into every master's output queue; the driver writes the queues
//! (one `write` per master when the kernel takes it all) and hands back what it read, and
//! the replies are fed to the op's [`Tally`] until it is decided.
//!
//! Every link has a FIFO of pending requests; a reply is always matched to the oldest
//! one, so a late reply is credited to the op that asked for it, never to a newer one.
//! An op's slot stays alive until every reply it is owed has arrived (or its connection
//! died), even after the op was decided: a late `-NOSCRIPT` is then still retried with
//! `EVAL`, so a release never silently misses a master. (The single-owner client has no
//! background thread: replies that arrive after an operation returned are read, and such
//! retries sent, by the client's next operation. Until then the key's TTL bounds it.)
//!
//! Reconnect policy: a connection that worked and then broke is reconnected on the next
//! request. A connect that fails, or a connection that breaks before answering anything,
//! backs off: 25 ms, 50 ms, ... up to 1 s. During backoff the master is reported as
//! [`Fault::Down`] at once, so a dead master costs a round nothing, not a connect timeout.
//! A connection with requests outstanding and no byte received for `stall_timeout` is
//! closed (a hung or frozen master), which also bounds the memory its FIFO can take.
//!
//! Nothing here reads a clock or touches a socket: the time comes with every call, and
//! what the sockets must do goes out as [`Action`]s.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use super::chans::{self, Channels, Fingerprint};
use super::encode::{delifeq_fits, encode_delifeq, encode_request, encode_request_memo, BulkUint};
use super::link::{interpret, write_handshake, Action, ConnectPhase, Link, LinkId, Master};
use super::link::{Owed, Setup, SetupReply, State, Tag, TrackStep, Tracking, INBUF_START};
use super::ops::{Op, OpArgs, OpId, OpState};
use super::watch::{self, Vote, WatchId, Watches};
use crate::resp::{self, Arg, Frame};
use crate::rules::{self, Decision, ErrorText, Fault, Outcome, Request, Tally, TlsFault};
use crate::stats::{MasterStats, WatchCounters};

/// Op slots the table has room for before it allocates, at least: the hard bound on what
/// a link may owe (`NetConfig::max_pending`: past it the connection is closed) is the real
/// one. A master that falls behind (descheduled on a loaded machine, paused) keeps the
/// rounds it owes answers to alive, and a round decided at the quorum goes on without it:
/// up to that bound, that costs no allocation (the reserved pages are only touched when
/// used).
const OPS_RESERVED: usize = 256;
/// Idle gaps between `drive` calls shorter than this do not shift the stall clocks.
pub const IDLE_SHIFT_MIN: Duration = Duration::from_millis(1);

/// Tuning of the connections (set from the builder).
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

/// The masters, their links and the op table.
pub(crate) struct Rounds {
    pub masters: Vec<Master>,
    /// `2 n` links: master `i`'s lock link at `i`, its sub link at `n + i`.
    pub(super) links: Vec<Link>,
    ops: Vec<Op>,
    free: Vec<u32>,
    /// Requests encoded once for every master that takes them. A master whose own queue
    /// was empty is written straight from here (no per-master copy); one that already had
    /// bytes queued, or misses a request, gets its share copied into its own queue.
    /// [`Rounds::flushed`] empties it.
    pub(super) shared: Vec<u8>,
    pub cfg: NetConfig,
    quorum: usize,
    /// Slots of the ops in the `Active` state (undecided): all `tick` has to look at.
    active: Vec<u32>,
    /// No timer is due before this instant (`None`: no timer at all). A lower bound: every
    /// place that creates a deadline lowers it, progress only moves deadlines later, and
    /// `tick` recomputes it exactly. The loop skips `tick` until it passes.
    next_due: Option<Instant>,
    /// The owners of ops decided since the task layer last looked
    /// (see [`Rounds::take_decided`]).
    decided: Vec<(Owner, OpId)>,
    /// The origin of [`Rounds::micros`], and its last answer: replies of one read share
    /// their `now`, so latencies cost one clock subtraction per read, not one per reply.
    base: Instant,
    clock: (Instant, u64),
    /// What the driver must do with the sockets, in order.
    actions: VecDeque<Action>,
    /// The channels waiters listen on for releases (see `chans.rs`).
    pub(super) chans: Channels,
    /// Some master is known to be the same server as another (same `run_id`): a yes to a
    /// grant is then checked against the other names' votes (one server, one vote).
    same_servers: bool,
    /// Some master offers `DELIFEQ` (`Master::delifeq`; a maybe: set by a handshake that
    /// says so, never cleared): releases look for it only then.
    delifeq: bool,
    /// A yes to a grant may be refused (see [`Rounds::refuse_vote`]): some master is the
    /// same server as another, fencing requires durability, or the amnesia guard is on.
    /// Kept with `same_servers` (the rest is configuration): one test per reply.
    vote_checks: bool,
    /// The locks watched for a loss (see `watch.rs`).
    pub(super) watches: Watches,
    /// Bytes were queued on a lock link's own queue outside a round (a watch's read): the
    /// next flush writes the lock links even with nothing shared.
    lock_dirty: bool,
    /// Some lock link may hold bytes not written yet behind requests still owed a reply:
    /// set wherever a lock link's queue gains a request, cleared by a flush that left
    /// every lock link with nothing unwritten. Clear, it is exact; set, only a maybe
    /// ([`Rounds::releases_unsent`] then looks at the links).
    unsent: bool,
    /// How many releases the masters are owed for their next connections (the sum of
    /// every `Master::owed`'s length, kept where they change). A `u32`: it fits where
    /// the core's layout had room (a `usize` moved what memcpy copies in the single
    /// owner's cycle off its alignment: 12 instructions per cycle).
    owed_count: u32,
    /// Extensions that reached their quorum while some masters had lost the keys (by
    /// master bit): the keys are put back there at the next step (see `scripts::EXTEND`).
    restores: Vec<(OpArgs, u64, Duration)>,
    /// The watch's counters, by master.
    watch_stats: Vec<WatchCounters>,
    /// Masters whose connection was lost while locks were watched: reconnected as soon as
    /// the backoff allows, and every watch read there again (see `watch.rs`).
    reread: Vec<bool>,
    /// Links from `2 n` on: cluster masters' discovery links, shard links and listeners
    /// (`cluster_link.rs`).
    pub(super) extra: Vec<super::cluster_link::Extra>,
    /// Some master is a cluster.
    pub(super) clusters: bool,
    /// The last TTL a round's request carried, as a bulk string (see `encode`).
    ttl_bulk: BulkUint,
}

/// Whoever started an op and wants to hear when it is decided (a task of the layer
/// above, as an opaque number). Ops without one are fire-and-forget (cleanup releases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner(pub u64);

impl Rounds {
    pub(crate) fn new(masters: Vec<Master>, cfg: NetConfig, now: Instant) -> Self {
        let n = masters.len();
        let quorum = rules::quorum(n);
        let reserved = cfg.max_pending.max(OPS_RESERVED);
        let mut links = Vec::with_capacity(2 * n);
        for _ in 0..n {
            links.push(Link::new(cfg.limits, INBUF_START, reserved, now));
        }
        for _ in 0..n {
            links.push(Link::new(cfg.limits, 0, 0, now));
        }
        let mut r = Rounds {
            masters,
            links,
            // Reserved, not touched: the table grows into it without an allocation when a
            // lagging master keeps many ops waiting for its replies (the pages are only
            // mapped when used).
            ops: Vec::with_capacity(reserved),
            free: Vec::with_capacity(reserved),
            shared: Vec::with_capacity(1024),
            cfg,
            quorum,
            active: Vec::with_capacity(reserved),
            next_due: None,
            decided: Vec::with_capacity(reserved),
            base: now,
            clock: (now, 0),
            actions: VecDeque::with_capacity(16),
            chans: Channels::default(),
            same_servers: false,
            delifeq: false,
            vote_checks: false,
            watches: Watches::default(),
            lock_dirty: false,
            unsent: false,
            owed_count: 0,
            restores: Vec::new(),
            watch_stats: vec![WatchCounters::default(); n],
            reread: vec![false; n],
            extra: Vec::new(),
            clusters: false,
            ttl_bulk: BulkUint::new(0),
        };
        r.clusters = r.masters.iter().any(|m| m.cluster.is_some());
        r.vote_checks = r.cfg.require_durable || r.cfg.amnesia_guard.is_some();
        // Pre-build a few slots so the first cycles do not allocate either.
        for _ in 0..4 {
            r.new_slot();
        }
        r
    }

    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// Some master may offer `DELIFEQ` (see `Master::delifeq`).
    #[inline]
    pub(crate) fn offers_delifeq(&self) -> bool {
        self.delifeq
    }

    /// The number of masters.
    #[inline]
    pub(crate) fn n(&self) -> usize {
        self.masters.len()
    }

    /// `t` in microseconds since the origin (cached for the last `t` asked).
    #[inline(always)]
    fn micros(&mut self, t: Instant) -> u64 {
        if t != self.clock.0 {
            let us = t.saturating_duration_since(self.base);
            self.clock = (t, us.as_secs() * 1_000_000 + u64::from(us.subsec_micros()));
        }
        self.clock.1
    }

    /// A timer at `t` exists now: make sure the loop looks at it.
    pub(super) fn due_by(&mut self, t: Instant) {
        self.next_due = Some(self.next_due.map_or(t, |n| n.min(t)));
    }

    fn new_slot(&mut self) -> u32 {
        let n = self.n();
        let t = self.base;
        self.ops.push(Op {
            gen: 0,
            state: OpState::Free,
            req: Request::Acquire,
            tally: Tally::new(n, self.quorum),
            started: t,
            started_us: 0,
            deadline: t,
            decided_at: t,
            args: OpArgs::default(),
            max_value: 0,
            left_ms: smallvec::SmallVec::new(),
            holders: smallvec::SmallVec::new(),
            views: Vec::new(),
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

    /// The op, to change (an operator's round sets up its table of answers).
    pub(crate) fn op_mut(&mut self, id: OpId) -> &mut Op {
        let op = &mut self.ops[id.slot as usize];
        debug_assert_eq!(op.gen, id.gen);
        op
    }

    /// Start an op: encode `req` for every master `target` accepts, queue it, and record
    /// an immediate failure for masters that are down. The driver writes it with the
    /// next flush (after all ops of a batch). When the op is decided, `owner` (if any) is
    /// queued for [`Rounds::take_decided`]; an op without an owner is freed once its
    /// replies are in.
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
        let n = self.n();
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
        if req == Request::AcquireWait || req == Request::Extend {
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
        encode_request_memo(
            &mut self.shared,
            req,
            &self.ops[slot as usize].args,
            false,
            &mut self.ttl_bulk,
        );
        // The common case, tested at once: the master is asked, its connection is up, its
        // queue below every limit, and it is not known to be another's server (see below).
        let fast_limit = if req == Request::Release {
            self.cfg.max_pending
        } else {
            self.cfg.max_pending.min(self.cfg.backlog_limit)
        };
        let fast_server = req == Request::Release || !self.same_servers;
        // A release that fits `DELIFEQ` (see `encode::delifeq_fits`) goes as `DELIFEQ key
        // token` to the masters that offer it, from their own queues.
        let delifeq =
            self.delifeq && req == Request::Release && delifeq_fits(&self.ops[slot as usize].args);
        let mut sent = 0u32;
        // The masters in the common case, from the first on, walked side by side with
        // their links (no index, no bounds check); the rest below from the first that is
        // not (rarely any).
        // (A `DELIFEQ` release takes the indexed walk below: the side-by-side one stays
        // as tight as it is without it.)
        let mut first_slow = 0;
        if fast_server && !delifeq {
            let (links, masters, shared) = (&mut self.links, &mut self.masters, &self.shared);
            for (link, master) in links.iter_mut().zip(masters.iter_mut()) {
                if !(link.is_up() && link.pending.len() < fast_limit && target(first_slow)) {
                    break;
                }
                // Its stall clock, if its queue was empty, is seen to below.
                enqueue_on(link, master, shared, id, req, at, now);
                first_slow += 1;
            }
            // Every master of the walk was sent the request.
            sent = first_slow as u32;
            self.unsent = true;
        } else if delifeq {
            // As the walk would have (its lock links gain requests below).
            self.unsent = true;
        }
        for i in first_slow..n {
            let link = &mut self.links[i];
            if fast_server && link.is_up() && link.pending.len() < fast_limit && target(i) {
                stall_clock_started |= if delifeq && self.masters[i].delifeq {
                    self.enqueue_delifeq(i, id, at, now)
                } else {
                    self.enqueue(i, id, req, at, now)
                };
                sent += 1;
                continue;
            }
            // What the op is owed so far, before a failure below may decide it (and free
            // it when nothing is owed).
            self.ops[slot as usize].outstanding += std::mem::take(&mut sent);
            // A master that does not take this request must not send it either: its
            // earlier shared bytes go to its own queue first (`unshare` below).
            if !target(i) {
                // Not asked: counts as a no, so the tally still decides.
                self.unshare(i, at);
                self.tally(id, i, Outcome::NotHeld);
                continue;
            }
            // Releases always go out (the master may run an earlier SET of this lock
            // that is still queued); grants wait until a backlogged master catches up, and
            // are never sent to a master known to be the same server as one listed before
            // it (its `SET` could run first and make the other name's answer "taken").
            if req != Request::Release {
                let refused = if self.masters[i].same_server {
                    Some(Fault::SameServer)
                } else if self.links[i].pending.len() >= self.cfg.backlog_limit {
                    Some(Fault::Backlogged)
                } else {
                    None
                };
                if let Some(fault) = refused {
                    self.unshare(i, at);
                    self.tally(id, i, Outcome::Failed(fault));
                    continue;
                }
            }
            match self.ensure_connection(i, now) {
                Ok(()) => {
                    stall_clock_started |= if delifeq && self.masters[i].delifeq {
                        self.enqueue_delifeq(i, id, at, now)
                    } else {
                        self.enqueue(i, id, req, at, now)
                    };
                    sent += 1;
                }
                Err(fault) => {
                    self.unshare(i, at);
                    if req == Request::Release && self.ops[slot as usize].args.of_lock {
                        // Down (backing off, or connecting): the master may hold the key
                        // all the same (a lock granted before its connection broke). Owed
                        // to its next connection, as a release its connection lost is:
                        // a release takes effect on every master back within the TTL.
                        self.owe_release(i, id, now);
                        self.due_by(self.links[i].retry_at.unwrap_or(now));
                    }
                    self.tally(id, i, Outcome::Failed(fault));
                }
            }
        }
        self.ops[slot as usize].outstanding += sent;
        // The loop looks by the stall timeout of the masters whose queues were empty. Asked
        // whenever the walk above sent anything (no test per master): for a master whose
        // queue held requests already it moves nothing (its clock started earlier and the
        // loop looks by then, see `tick`), and at worst it is one early look (a tick only
        // acts on what is due).
        if stall_clock_started || first_slow > 0 {
            self.due_by(now + self.cfg.stall_timeout);
        }
        // Decided already (masters down or not asked): rarely; a test, not a call.
        if self.ops[slot as usize].tally.decision() != Decision::Open {
            self.check_decided(id, now);
        }
        id
    }

    /// Queue op `id`'s request (encoded at `at` in the shared buffer) on master `i`'s link;
    /// whether the link's stall clock starts now (its queue was empty).
    #[inline(always)]
    fn enqueue(&mut self, i: usize, id: OpId, req: Request, at: usize, now: Instant) -> bool {
        self.unsent = true;
        let (link, master) = (&mut self.links[i], &mut self.masters[i]);
        enqueue_on(link, master, &self.shared, id, req, at, now)
    }

    /// Queue release `id` on master `i`'s link as `DELIFEQ key token` (the master offers
    /// it), in its own queue (its share of the shared buffer, up to the release's script
    /// at `at`, moved there first); whether the link's stall clock starts now.
    #[inline(never)]
    fn enqueue_delifeq(&mut self, i: usize, id: OpId, at: usize, now: Instant) -> bool {
        self.unshare(i, at);
        let link = &mut self.links[i];
        let started = link.pending.is_empty();
        if started {
            link.last_progress = now;
        }
        encode_delifeq(&mut link.out, &self.ops[id.slot as usize].args);
        link.pending.push_back(Tag::DelIfEq(id));
        self.masters[i].stats.requests += 1;
        started
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
        // What follows writes into the link's own queue (a retry, a request out of turn).
        self.unsent = true;
        let link = &mut self.links[i];
        if let Some(from) = link.shared_from.take() {
            link.out.extend_from_slice(&self.shared[from..upto]);
        }
    }

    #[inline]
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
        if self.tally(id, node, outcome) {
            self.check_decided(id, now);
        }
    }

    /// Count `outcome` of master `node` for op `id` (whether the op is live), without
    /// deciding: [`Rounds::start`] decides once every master was asked (deciding on the
    /// first master not asked freed an op without an owner before its requests to the
    /// others were counted: their replies then found it gone, and a cleanup release's
    /// `-NOSCRIPT` was never retried, leaving its key until the TTL).
    fn tally(&mut self, id: OpId, node: usize, outcome: Outcome) -> bool {
        let op = &mut self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return false;
        }
        // Faults count (once: not for a request its round already counted as timed out);
        // a master not asked (`NotHeld` from `start`) did nothing.
        let first = op.tally.outcomes().get(node) == Some(&Outcome::Pending);
        if let (true, Outcome::Failed(_)) = (first, outcome) {
            self.masters[node].stats.outcome(outcome);
        }
        op.tally.record(node, outcome);
        true
    }

    fn check_decided(&mut self, id: OpId, now: Instant) {
        let op = &self.ops[id.slot as usize];
        // An operator's round waits for every master (`Request::is_admin`).
        if op.state == OpState::Active
            && op.tally.decision() != Decision::Open
            && (!op.req.is_admin() || op.tally.pending() == 0)
        {
            self.decide(id, now);
        } else {
            self.maybe_free(id.slot);
        }
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

    /// Make sure master `i`'s lock link is connected (or connecting); `Err` when it is
    /// backing off. Inline: the common case is one test.
    #[inline]
    fn ensure_connection(&mut self, i: usize, now: Instant) -> Result<(), Fault> {
        let link = &self.links[i];
        if link.is_up() && link.pending.len() < self.cfg.max_pending {
            return Ok(());
        }
        self.connect_if_down(i, now)
    }

    /// The rest of [`Rounds::ensure_connection`]: a full queue, or a (re)connect.
    #[inline(never)]
    fn connect_if_down(&mut self, i: usize, now: Instant) -> Result<(), Fault> {
        let link = &mut self.links[i];
        if link.state != State::Down {
            if link.pending.len() >= self.cfg.max_pending {
                self.fail_node(i, Fault::Closed(io::ErrorKind::OutOfMemory), now);
                return Err(Fault::Down);
            }
            return Ok(());
        }
        if let Some(at) = link.retry_at {
            if now < at {
                return Err(link.last_fault.unwrap_or(Fault::Down));
            }
        }
        self.new_connection(i, now);
        Ok(())
    }

    /// A new connection of master `i`'s lock link starts: fresh buffers, its handshake
    /// queued, the connect deadline set, the driver asked to connect.
    fn new_connection(&mut self, i: usize, now: Instant) {
        let durability = self.cfg.require_durable;
        let link = &mut self.links[i];
        link.connect_deadline = now + self.cfg.connect_timeout;
        link.last_progress = now;
        let first = link.connect_deadline.min(now + self.cfg.stall_timeout);
        link.answered = false;
        link.clear_streams();
        link.state = State::Connecting(ConnectPhase::Connecting);
        let master = &mut self.masters[i];
        master.votes_from = None;
        master.durable = false;
        // Until this connection's `INFO` says so (requests queued behind the handshake
        // before its answer keep the script).
        master.delifeq = false;
        write_handshake(link, master, durability);
        self.unsent = true;
        // The releases a closed connection still owed, behind the handshake (and its gate).
        let owed_before = master.owed.len();
        master.owed.retain(|o| o.until > now);
        self.owed_count -= (owed_before - master.owed.len()) as u32;
        for o in master.owed.iter() {
            encode_request(&mut link.out, Request::Release, &o.args, false);
            link.pending.push_back(Tag::Owed);
        }
        self.actions.push_back(Action::Connect(LinkId(i)));
        self.due_by(first);
    }

    /// A connection could not be opened, or broke before answering anything: back off.
    pub(super) fn backoff(&mut self, l: usize, fault: Fault, now: Instant) {
        let link = &mut self.links[l];
        link.failures = link.failures.saturating_add(1);
        let shift = (link.failures - 1).min(16);
        let backoff = self
            .cfg
            .backoff_min
            .saturating_mul(1 << shift)
            .min(self.cfg.backoff_max);
        link.retry_at = Some(now + backoff);
        link.last_fault = Some(fault);
    }

    /// Drop link `l`'s connection: the driver closes the socket (with a reset when
    /// requests were owed).
    pub(super) fn drop_connection(&mut self, l: usize) {
        let reset = !self.links[l].pending.is_empty();
        self.close_link(l, reset);
    }

    /// Drop link `l`'s connection with a FIN (nothing owed that matters).
    pub(super) fn drop_connection_quietly(&mut self, l: usize) {
        self.close_link(l, false);
    }

    fn close_link(&mut self, l: usize, reset: bool) {
        let was = std::mem::replace(&mut self.links[l].state, State::Down);
        if was != State::Down {
            self.actions.push_back(Action::Close {
                link: LinkId(l),
                reset,
            });
        }
    }

    pub(super) fn actions_push(&mut self, a: Action) {
        self.actions.push_back(a);
    }

    /// Close master `i`'s lock connection: every request still owed an answer fails with
    /// `fault`.
    #[cold]
    #[inline(never)]
    pub(crate) fn fail_node(&mut self, i: usize, fault: Fault, now: Instant) {
        let stats = &mut self.masters[i].stats;
        stats.disconnects += 1;
        stats.last_fault = Some(fault);
        // With requests owed, close with a reset, not a FIN: requests still unsent or
        // unread by the master are dropped rather than run later, behind a cleanup
        // release sent on the next connection. (A request the master already took may
        // still run: such a key expires within its TTL, and the round reports the master
        // as "connection lost".)
        self.drop_connection(i);
        let link = &mut self.links[i];
        link.clear_streams();
        let answered = link.answered;
        let mut pending = std::mem::take(&mut link.pending);
        for tag in pending.drain(..) {
            let op = match tag {
                Tag::Op { id, req, .. } => Some((id, req)),
                Tag::DelIfEq(id) => Some((id, Request::Release)),
                _ => None,
            };
            if let Some((id, req)) = op {
                // A release the master may not have run: owed to its next connection.
                if req == Request::Release {
                    self.owe_release(i, id, now);
                }
                self.owed_reply_arrived(id);
                self.record(id, i, Outcome::Failed(fault), now);
                self.maybe_free(id.slot);
            }
        }
        // Give the (empty) queue its storage back.
        self.links[i].pending = pending;
        // The connection that held the watched keys is gone: what the master holds is
        // unknown until a new connection reads the keys again (a restart without
        // persistence lost them, one with persistence or a cut connection did not).
        if self.watches.any() {
            self.watches.link_lost(i, fault, self.quorum);
            self.reread[i] = true;
            self.due_by(self.links[i].retry_at.unwrap_or(now));
        }
        if answered {
            let link = &mut self.links[i];
            link.failures = 0;
            link.retry_at = None;
            link.last_fault = Some(fault);
        } else {
            self.backoff(i, fault, now);
        }
        // Releases owed: reconnect once the backoff allows (see `tick`).
        if !self.masters[i].owed.is_empty() {
            self.due_by(self.links[i].retry_at.unwrap_or(now));
        }
    }

    /// Release `id` is owed to master `i`'s next connection (the master may hold its key:
    /// its connection closed before it answered, or was down when the release started),
    /// within the lock's TTL.
    ///
    /// Bounded (a master frozen under load is owed thousands), oldest kept: a connection
    /// closed with a reset may still run the start of what it was sent (Redis reads one
    /// more buffer, 16 KiB), not the rest; past the bound a release is left to the TTL.
    /// Half of `max_pending`: sending them leaves the new connection room (a full one
    /// would be closed again at once).
    #[cold]
    fn owe_release(&mut self, i: usize, id: OpId, now: Instant) {
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen {
            return;
        }
        let until = op.started + Duration::from_millis(op.args.ttl_ms);
        let owed = &mut self.masters[i].owed;
        if until > now && owed.len() < self.cfg.max_pending / 2 {
            owed.push_back(Owed {
                args: op.args.clone(),
                until,
            });
            self.owed_count += 1;
        }
    }

    /// Releases wait to be sent: for a master's next connection (within the lock's TTL),
    /// or behind bytes its connection has not taken (a master that stopped reading). The
    /// shared client's loop keeps running for them (a cheap test: no queue is walked).
    #[inline]
    pub(crate) fn releases_unsent(&self) -> bool {
        // Both kept by hand: checked against what they stand for in every debug build.
        debug_assert_eq!(
            self.owed_count as usize,
            self.masters.iter().map(|m| m.owed.len()).sum::<usize>(),
            "owed_count is the number of releases owed"
        );
        debug_assert!(
            self.unsent
                || !self.links[..self.n()]
                    .iter()
                    .any(|link| !link.pending.is_empty()
                        && (link.shared_from.is_some() || link.out_pos < link.out.len())),
            "unsent clear while a lock link holds unwritten bytes"
        );
        // Nearly always after a write that took everything: two tests, no walk.
        if self.owed_count == 0 && !self.unsent {
            return false;
        }
        self.releases_unsent_walk()
    }

    /// [`Rounds::releases_unsent`] when some master may owe or some link may hold bytes.
    #[cold]
    fn releases_unsent_walk(&self) -> bool {
        // Masters and their lock links walked side by side: no index, no bounds check.
        self.masters.iter().zip(&self.links).any(|(master, link)| {
            !master.owed.is_empty()
                || (!link.pending.is_empty()
                    && (link.shared_from.is_some() || link.out_pos < link.out.len()))
        })
    }

    /// Some master is still owed a release: queued or unanswered on its connection, or
    /// waiting for its next connection (within the lock's TTL). A client that shuts down
    /// delivers them first, within its bound.
    pub(crate) fn owes_releases(&self) -> bool {
        (0..self.n()).any(|i| {
            !self.masters[i].owed.is_empty()
                || self.links[i].pending.iter().any(|t| {
                    matches!(
                        t,
                        Tag::Op {
                            req: Request::Release,
                            ..
                        } | Tag::DelIfEq(_)
                            | Tag::Owed
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

    // ---- What the driver calls -------------------------------------------------------

    /// Whether the driver has something to do with a socket.
    #[inline]
    pub(crate) fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// The next thing the driver must do with a socket.
    #[inline]
    pub(crate) fn take_action(&mut self) -> Option<Action> {
        if self.actions.is_empty() {
            return None;
        }
        if self.clusters {
            // A cluster's lock link has no socket of its own (see `cluster_link.rs`).
            while let Some(a) = self.actions.pop_front() {
                if let Some(a) = self.cluster_action(a) {
                    return Some(a);
                }
            }
            return None;
        }
        self.actions.pop_front()
    }

    /// The next flush writes the lock links (and the clusters' shard links) even with
    /// nothing in the shared buffer.
    pub(super) fn mark_lock_dirty(&mut self) {
        self.lock_dirty = true;
    }

    /// A connect of link `l` has come as far as `phase`.
    pub(crate) fn handle_connect_phase(&mut self, l: LinkId, phase: ConnectPhase) {
        let link = &mut self.links[l.0];
        if link.is_connecting() {
            link.state = State::Connecting(phase);
        }
    }

    /// Link `l` is connected (and its TLS handshake done): its queued bytes may go out.
    pub(crate) fn handle_connected(&mut self, l: LinkId) {
        let n = self.n();
        let link = &mut self.links[l.0];
        if !link.is_connecting() {
            return;
        }
        link.state = State::Up;
        if l.0 < n {
            self.masters[l.0].stats.connects += 1;
        } else if l.0 >= 2 * n {
            self.cluster_connected(l.0);
        }
    }

    /// Link `l`'s connection failed or closed (a connect that failed, a read or write
    /// error, the end of the stream).
    pub(crate) fn handle_closed(&mut self, l: LinkId, fault: Fault, now: Instant) {
        let n = self.n();
        if self.links[l.0].state == State::Down {
            return;
        }
        if l.0 < n {
            self.fail_node(l.0, fault, now);
        } else if l.0 < 2 * n {
            self.sub_fail(l.0 - n, fault, now);
        } else {
            self.cluster_closed(l.0, fault, now);
        }
    }

    /// Where the driver reads link `l`'s next bytes to (`None`: the link is not up, or its
    /// input would outgrow the limits, which closed it).
    #[inline]
    pub(crate) fn recv_buf(&mut self, l: LinkId, now: Instant) -> Option<&mut [u8]> {
        let n = self.n();
        let link = &mut self.links[l.0];
        if !link.is_up() {
            return None;
        }
        // Room left (nearly always): no floor worked out, no call.
        if link.input.in_end >= link.input.inbuf.len() {
            let floor = if l.0 < n || l.0 >= 2 * n {
                INBUF_START
            } else {
                chans::SUB_INBUF
            };
            if let Err(f) = link.input.make_room(floor) {
                self.handle_closed(l, f, now);
                return None;
            }
        }
        let input = &mut self.links[l.0].input;
        Some(&mut input.inbuf[input.in_end..])
    }

    /// The driver read `len` bytes into link `l`'s buffer: handle every complete reply.
    /// Returns `false` when the link was closed.
    #[inline]
    pub(crate) fn received(&mut self, l: LinkId, len: usize, now: Instant) -> bool {
        let n = self.n();
        let link = &mut self.links[l.0];
        link.input.in_end += len;
        link.last_progress = now;
        if l.0 < n {
            self.process_replies(l.0, now)
        } else if l.0 < 2 * n {
            self.sub_process(l.0 - n, now)
        } else {
            self.cluster_received(l.0, now)
        }
    }

    /// Link `l` has bytes that may be written now.
    #[inline]
    pub(crate) fn has_output(&self, l: LinkId) -> bool {
        let link = &self.links[l.0];
        link.is_up() && (link.shared_from.is_some() || link.out_pos < link.writable_end())
    }

    /// The bytes link `l` may write now (empty: nothing, or not up). Report what was
    /// written with [`Rounds::sent`].
    #[inline]
    pub(crate) fn send_buf(&mut self, l: LinkId) -> &[u8] {
        let link = &mut self.links[l.0];
        if !link.is_up() {
            return &[];
        }
        if let Some(from) = link.shared_from {
            if link.gate.is_none() {
                // Straight from the shared buffer.
                return &self.shared[from..];
            }
            // Behind an unconfirmed AUTH or SELECT: wait in the link's own queue.
            link.shared_from = None;
            link.out.extend_from_slice(&self.shared[from..]);
        }
        let end = link.writable_end();
        &link.out[link.out_pos..end]
    }

    /// The driver wrote `written` bytes of what [`Rounds::send_buf`] gave (0: the socket
    /// would block). Returns whether bytes are left that may be written now.
    #[inline]
    pub(crate) fn sent(&mut self, l: LinkId, written: usize) -> bool {
        let link = &mut self.links[l.0];
        if let Some(from) = link.shared_from.take() {
            // The link's own queue was empty: whatever the kernel did not take goes there.
            let rest = &self.shared[from + written..];
            if rest.is_empty() {
                return false;
            }
            link.out.extend_from_slice(rest);
            return true;
        }
        link.out_pos += written;
        if link.out_pos == link.out.len() {
            link.out.clear();
            link.out_pos = 0;
            // The handshake is written: whatever is queued from here on waits for the gate.
            if let Some(g) = link.gate.as_mut() {
                *g = 0;
            }
            return false;
        }
        link.out_pos < link.writable_end()
    }

    /// Write link `l` with `write` until it would block or all is out; a failed write
    /// closes the link.
    #[inline]
    pub(crate) fn write_with(
        &mut self,
        l: LinkId,
        now: Instant,
        mut write: impl FnMut(LinkId, &[u8]) -> Result<usize, Fault>,
    ) {
        loop {
            let bytes = self.send_buf(l);
            if bytes.is_empty() {
                return;
            }
            match write(l, bytes) {
                Ok(n) => {
                    if !self.sent(l, n) || n == 0 {
                        return;
                    }
                }
                Err(f) => {
                    self.handle_closed(l, f, now);
                    return;
                }
            }
        }
    }

    /// The driver's flush in one call (see `Core::flush_with`).
    #[inline]
    pub(crate) fn flush_with(
        &mut self,
        now: Instant,
        mut write: impl FnMut(LinkId, &[u8]) -> Result<usize, Fault>,
    ) {
        let n = self.n();
        // Some lock link may still hold a share of the shared buffer (for `flushed` to
        // move into its own queue); clear when every link took all of its share here.
        let mut kept = self.clusters;
        if !self.shared.is_empty() || self.lock_dirty {
            if self.clusters {
                // Clusters' requests to their shards' links, written below.
                self.cluster_flush(now);
            }
            // Every lock link is left with nothing unwritten that a reply is owed for
            // (see `unsent`): the links that took their whole share skip the test.
            let mut all_out = true;
            for i in 0..n {
                let link = &mut self.links[i];
                // The common case: the link's share of the shared buffer, its own queue
                // empty, the whole of it taken by the kernel in one write.
                if let (true, Some(from), None) = (link.is_up(), link.shared_from, link.gate) {
                    // Every appender to a link's own queue first moves the link's share
                    // there (`flushed`), so a link with a share has an empty queue: its
                    // share is all it has to write, in order.
                    debug_assert_eq!(
                        link.out_pos,
                        link.out.len(),
                        "link {i}: a share and a queue"
                    );
                    match write(LinkId(i), &self.shared[from..]) {
                        Ok(k) if from + k == self.shared.len() => {
                            // Its own queue is empty while it shares: nothing is left.
                            link.shared_from = None;
                            continue;
                        }
                        Ok(k) => {
                            link.shared_from = None;
                            link.out.extend_from_slice(&self.shared[from + k..]);
                        }
                        Err(f) => {
                            self.handle_closed(LinkId(i), f, now);
                            kept = true;
                            all_out = false;
                            continue;
                        }
                    }
                }
                if self.has_output(LinkId(i)) {
                    self.write_with(LinkId(i), now, &mut write);
                }
                let link = &self.links[i];
                kept |= link.shared_from.is_some();
                all_out &= link.pending.is_empty()
                    || (link.shared_from.is_none() && link.out_pos == link.out.len());
            }
            if all_out {
                self.unsent = false;
            }
        }
        if self.chans.dirty {
            for i in n..2 * n {
                if self.has_output(LinkId(i)) {
                    self.write_with(LinkId(i), now, &mut write);
                }
            }
        }
        for l in 2 * n..self.links.len() {
            if self.has_output(LinkId(l)) {
                self.write_with(LinkId(l), now, &mut write);
            }
        }
        if kept {
            self.flushed();
        } else {
            // `flushed` without its walk of the lock links: none holds a share.
            self.chans.dirty = false;
            self.lock_dirty = false;
            self.shared.clear();
        }
    }

    /// Read link `l` with `read` (see `Core::read_with`); returns whether the link asks to
    /// be written.
    #[inline]
    pub(crate) fn read_with(
        &mut self,
        l: LinkId,
        now: Instant,
        mut read: impl FnMut(&mut [u8]) -> Result<(usize, bool), Fault>,
    ) -> bool {
        loop {
            let Some(buf) = self.recv_buf(l, now) else {
                return false;
            };
            match read(buf) {
                Ok((0, _)) => break,
                Ok((k, more)) => {
                    if !self.received(l, k, now) {
                        return false;
                    }
                    if !more {
                        break;
                    }
                }
                Err(f) => {
                    self.handle_closed(l, f, now);
                    return false;
                }
            }
        }
        std::mem::take(&mut self.links[l.0].kick)
    }

    /// Which links may have bytes to write since the last flush: (lock links, sub links).
    #[inline]
    pub(crate) fn flush_wanted(&self) -> (bool, bool) {
        (!self.shared.is_empty() || self.lock_dirty, self.chans.dirty)
    }

    /// The driver's flush is over: every lock link takes what is left of its share into its
    /// own queue (not connected yet, or the kernel refused it), and the shared buffer
    /// empties.
    #[inline]
    pub(crate) fn flushed(&mut self) {
        self.chans.dirty = false;
        self.lock_dirty = false;
        if self.shared.is_empty() {
            return;
        }
        let n = self.n();
        for i in 0..n {
            let link = &mut self.links[i];
            if let Some(from) = link.shared_from.take() {
                link.out.extend_from_slice(&self.shared[from..]);
            }
        }
        self.shared.clear();
    }

    /// The client was away from the loop for `idle` (from the driver's clock). Time the
    /// client spent outside the loop (idle between calls) is no sign of a hung master:
    /// replies may be waiting unread. Every stall clock and connect timeout is shifted by
    /// it. Gaps under a millisecond are left alone: a client back in the loop that often
    /// reads every reply within that millisecond, so its stall clocks are right to within
    /// one.
    pub(crate) fn shift_clocks(&mut self, idle: Duration, entered: Instant) {
        for link in self.links.iter_mut() {
            link.last_progress = (link.last_progress + idle).min(entered);
            // A connect nobody watched over may well be done, its event still unread: its
            // timeout counts the time the loop ran, not the idle gap.
            if link.is_connecting() {
                link.connect_deadline += idle;
            }
        }
        // Channels whose linger ran out while the client was away: dropped before their
        // connections' backlog is read.
        if self.chans.idle > 0 {
            let _ = self.expire_idle_channels(entered);
        }
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

    /// When the next timer is due (a lower bound), if there is one.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.next_due
    }

    /// Handle timers and recompute [`Rounds::next_due`]: the timers due later, and every
    /// timer the tick itself set (a reconnect, a new connect's timeout: dropping those
    /// left a subscription link's connect without its timeout, found by the engine fuzzer,
    /// BUG engine-fuzz-2).
    fn tick(&mut self, now: Instant) {
        self.next_due = None;
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
                        self.masters[i].stats.outcome(Outcome::TimedOut);
                    }
                }
                op.tally.expire();
                let id = OpId { slot, gen: op.gen };
                self.check_decided(id, now);
            } else {
                due(op.deadline);
            }
        }
        for i in 0..self.n() {
            let link = &self.links[i];
            match link.state {
                State::Connecting(phase) if now >= link.connect_deadline => {
                    self.fail_node(i, connect_timed_out(phase), now);
                }
                State::Connecting(_) => due(link.connect_deadline),
                State::Up if !link.pending.is_empty() => {
                    let stall = link.last_progress + self.cfg.stall_timeout;
                    if now >= stall {
                        self.fail_node(i, Fault::Closed(io::ErrorKind::TimedOut), now);
                    } else {
                        due(stall);
                    }
                }
                _ => {}
            }
            // Watched locks to read again on a new connection: reconnect once the backoff
            // allows, and queue the reads behind its handshake.
            if self.reread[i] {
                if !self.watches.any() {
                    self.reread[i] = false;
                } else if self.links[i].state == State::Down {
                    match self.links[i].retry_at {
                        Some(t) if now < t => due(t),
                        _ => {
                            if self.connect_if_down(i, now).is_ok() {
                                self.reread_watches(i, now);
                            }
                            let link = &self.links[i];
                            let retry = link.retry_at.filter(|t| *t > now);
                            due(retry.unwrap_or(link.connect_deadline));
                        }
                    }
                } else {
                    self.reread_watches(i, now);
                }
            }
            // Down with releases owed (and no request to bring it back): reconnect once
            // the backoff allows; the new connection sends them.
            if self.links[i].state == State::Down && !self.masters[i].owed.is_empty() {
                let owed_before = self.masters[i].owed.len();
                self.masters[i].owed.retain(|o| o.until > now);
                self.owed_count -= (owed_before - self.masters[i].owed.len()) as u32;
                if !self.masters[i].owed.is_empty() {
                    match self.links[i].retry_at {
                        Some(t) if now < t => due(t),
                        _ => {
                            let _ = self.connect_if_down(i, now);
                            let link = &self.links[i];
                            let retry = link.retry_at.filter(|t| *t > now);
                            due(retry.unwrap_or(link.connect_deadline));
                        }
                    }
                }
            }
        }
        if self.chans.live > 0 {
            self.sub_tick(now, &mut due);
        }
        if self.clusters {
            self.cluster_tick(now, &mut due);
        }
        self.next_due = match (self.next_due, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Parse and dispatch every complete reply of master `i`'s lock link; `false` if the
    /// connection was closed.
    fn process_replies(&mut self, i: usize, now: Instant) -> bool {
        loop {
            let link = &mut self.links[i];
            // The answers of a lock cycle (`+OK`, `$-1`, `:0`, `:1` to a round's request)
            // are read straight off the input: no frame, no classification (the same
            // outcomes as `rules::classify` gives them; a unit test checks).
            if let (false, Some(&Tag::Op { id, req, eval })) =
                (link.input.resuming, link.pending.front())
            {
                let input = &link.input;
                let literal = input.parser.limits().max_line_len >= 2;
                if let (true, Some((outcome, value, used))) = (
                    literal,
                    literal_vote(req, &input.inbuf[input.in_start..input.in_end]),
                ) {
                    link.pending.pop_front();
                    link.answered = true;
                    link.input.in_start += used;
                    let drained = link.input.in_start == link.input.in_end;
                    if drained {
                        link.input.in_start = 0;
                        link.input.in_end = 0;
                    }
                    self.literal_reply(i, id, req, eval, outcome, value, now);
                    if drained {
                        return true;
                    }
                    continue;
                }
            }
            if let Some(open) = self.process_frame(i, now) {
                return open;
            }
        }
    }

    /// One reply of master `i`'s lock link that is not a literal answer (see
    /// [`Rounds::process_replies`]): parsed and dispatched. `Some(open)` when the read is
    /// over (`false`: the connection was closed), `None` to look for the next reply.
    /// Out of line: the literal answers' loop stays small.
    #[inline(never)]
    fn process_frame(&mut self, i: usize, now: Instant) -> Option<bool> {
        let link = &mut self.links[i];
        let (frame, used) = match link.input.next_frame() {
            Ok(resp::Status::Complete(complete)) => complete,
            Ok(resp::Status::Partial(_)) => return Some(true),
            Err(e) => {
                self.fail_node(i, Fault::Protocol(e), now);
                return Some(false);
            }
        };
        if let Frame::Aggregate(ref a) = frame {
            // Out of band on a connection that tracks keys (RESP3): answers no request.
            // Anywhere else a push is no answer to anything: taken as the answer to the
            // oldest request below, which it does not fit (the stream is not trusted).
            if a.kind() == resp::AggregateKind::Push && link.tracking == Tracking::On {
                let touched = watch::invalidated(a, &self.watches);
                link.input.in_start += used;
                self.on_invalidated(i, touched, now);
                return None;
            }
        }
        let tag = match link.pending.pop_front() {
            Some(Tag::Track(step)) => {
                let ok = match step {
                    TrackStep::Hello => matches!(frame, Frame::Aggregate(_)),
                    TrackStep::On => matches!(frame, Frame::Simple(b"OK")),
                };
                link.input.in_start += used;
                link.answered = true;
                if !ok {
                    link.tracking = Tracking::Refused;
                } else if step == TrackStep::On && link.tracking == Tracking::Asked {
                    link.tracking = Tracking::On;
                }
                self.watch_stats[i].tracking = Some(link.tracking == Tracking::On);
                return None;
            }
            Some(Tag::Caching) => {
                link.input.in_start += used;
                link.answered = true;
                return None;
            }
            Some(Tag::Watch(w)) => {
                let vote = match self.watches.get(w) {
                    Some(_) if link.tracking != Tracking::On => Vote::Blind,
                    Some(watch) => watch::vote_of(&frame, watch),
                    None => Vote::Blind,
                };
                link.input.in_start += used;
                link.answered = true;
                self.watches.set_vote(w, i, vote, self.quorum);
                return None;
            }
            Some(Tag::DelIfEq(id)) => {
                let answer = DelIfEq::of(&frame);
                link.input.in_start += used;
                link.answered = true;
                if answer == DelIfEq::Unexpected {
                    // A reply that fits no request: the stream can not be trusted.
                    let f = Fault::Unexpected;
                    let failed = Outcome::Failed(f);
                    self.op_reply(i, id, Request::Release, false, failed, 0, None, now);
                    self.fail_node(i, f, now);
                    return Some(false);
                }
                self.delifeq_reply(i, id, answer, now);
                return None;
            }
            Some(Tag::Owed) => {
                // Delivered (or refused: then the keys expire by their TTL).
                link.input.in_start += used;
                link.answered = true;
                if self.masters[i].owed.pop_front().is_some() {
                    self.owed_count -= 1;
                }
                return None;
            }
            Some(Tag::Subscribe(_) | Tag::Unsubscribe) | None => {
                // More replies than requests: the stream can not be trusted.
                self.fail_node(i, Fault::Unexpected, now);
                return Some(false);
            }
            Some(tag) => tag,
        };
        let setup = match tag {
            Tag::Op { id, req, eval } => {
                let (value, holder) = match frame {
                    Frame::Integer(v) => (v, None),
                    // `AcquireWait` with one key: the holder's TTL left and fingerprint.
                    Frame::Aggregate(ref a) if req == Request::AcquireWait => {
                        match rules::holder_left(a) {
                            Some((v, h)) => (v, Some(chans::fingerprint(h))),
                            None => (0, None),
                        }
                    }
                    _ => (0, None),
                };
                let classified = rules::classify(req, &frame);
                if req.is_admin() {
                    super::admin::keep_view(&mut self.ops, i, id, req, &frame);
                }
                link.input.in_start += used;
                link.answered = true;
                // The input is used up (the common case: one reply per read): no need
                // to look for another frame.
                let drained = link.input.in_start == link.input.in_end;
                if drained {
                    link.input.in_start = 0;
                    link.input.in_end = 0;
                }
                match classified {
                    Ok(outcome) => {
                        self.op_reply(i, id, req, eval, outcome, value, holder, now);
                        // 2: the master lost a key (never a literal answer, see
                        // `literal_vote`).
                        if req == Request::Extend && value == 2 {
                            self.extend_found_missing(i, id, now);
                        }
                        // A refused waiting acquire marked the held key: read the
                        // watches of its keys again (never a literal answer either).
                        if req == Request::AcquireWait && self.watches.any() {
                            self.after_mark(i, id, now);
                        }
                    }
                    Err(()) => {
                        // A reply that fits no request: the stream can not be trusted.
                        let f = Fault::Unexpected;
                        self.op_reply(i, id, req, eval, Outcome::Failed(f), 0, None, now);
                        self.fail_node(i, f, now);
                        return Some(false);
                    }
                }
                if drained {
                    return Some(true);
                }
                return None;
            }
            Tag::Setup(setup) => interpret(setup, &frame),
            Tag::Subscribe(_)
            | Tag::Unsubscribe
            | Tag::DelIfEq(_)
            | Tag::Owed
            | Tag::Track(_)
            | Tag::Caching
            | Tag::Watch(_) => unreachable!("taken above"),
        };
        link.input.in_start += used;
        link.answered = true;
        match setup {
            SetupReply::Done(Ok(())) => {
                link.failures = 0;
                link.retry_at = None;
                // The last of AUTH and SELECT confirmed: requests may go out now (the
                // driver writes them after this read).
                let last_gate = matches!(tag, Tag::Setup(Setup::Select))
                    || (matches!(tag, Tag::Setup(Setup::Auth)) && self.masters[i].db == 0);
                if last_gate {
                    link.gate = None;
                    link.kick = true;
                }
            }
            SetupReply::Durable(durable) => self.masters[i].durable = durable,
            SetupReply::InfoRefused(f) => {
                // Only the amnesia guard cannot do without INFO; the duplicate check
                // just goes without it.
                if self.cfg.amnesia_guard.is_some() {
                    self.fail_node(i, f, now);
                    return Some(false);
                }
            }
            SetupReply::Done(Err(f)) => {
                if matches!(f, Fault::Handshake(_)) {
                    // A refused handshake is a configuration problem: back off.
                    link.answered = false;
                }
                self.fail_node(i, f, now);
                return Some(false);
            }
            SetupReply::Info {
                uptime,
                run_id,
                delifeq,
            } => {
                // Trust the master's yes votes only once it has been up for max_ttl:
                // before that it may have forgotten locks that are still held.
                // Redis computes `uptime_in_seconds` from a start time truncated to the
                // second, so it can overstate the uptime by up to a second: count one
                // second less.
                // A `run_id` other than the one last seen at this address is a restart
                // whatever the uptime (another server took the address over: a promoted
                // replica, a VIP or a DNS name that flips, never saw our keys): held
                // back for max_ttl from the moment the change was seen, across
                // reconnects.
                let guard = self.cfg.amnesia_guard.unwrap_or_default();
                let up = Duration::from_secs(uptime.saturating_sub(1));
                let master = &mut self.masters[i];
                if master.run_id.is_some_and(|old| old != run_id) {
                    master.run_id_changed = Some(now);
                }
                let mut from = now + guard.saturating_sub(up);
                if let Some(seen) = master.run_id_changed {
                    from = from.max(seen + guard);
                }
                master.votes_from = Some(from);
                master.run_id = Some(run_id);
                // `DELIFEQ` for this connection's releases (a cluster's merged INFO
                // never says so: see `cluster.rs`).
                master.delifeq = delifeq && !master.delifeq_refused && master.cluster.is_none();
                self.delifeq |= master.delifeq;
                self.mark_same_servers();
            }
        }
        None
    }

    /// A master whose `run_id` equals that of a master listed before it is the same
    /// server reached twice: mark it (it is sent no grants, and the server votes once).
    /// Run at every `INFO` reply.
    fn mark_same_servers(&mut self) {
        let mut any = false;
        for i in 0..self.n() {
            let id = self.masters[i].run_id;
            let first = match id {
                Some(_) => self.masters[..i].iter().position(|n| n.run_id == id),
                None => None,
            };
            any |= first.is_some();
            #[cfg(feature = "tracing")]
            if let (Some(k), None) = (first, self.masters[i].stats.same_as) {
                tracing::warn!(
                    master = &*self.masters[i].name,
                    same_as = &*self.masters[k].name,
                    "one server listed twice (same run_id): it is sent no grants and votes once"
                );
            }
            let master = &mut self.masters[i];
            master.same_server = first.is_some();
            master.stats.same_as = first;
        }
        self.same_servers = any;
        self.vote_checks = any || self.cfg.require_durable || self.cfg.amnesia_guard.is_some();
    }

    /// Another name of master `i`'s server (same `run_id`) already said yes in op `id`: the
    /// server votes once. (A name known to be a duplicate is sent no grants; a reply to
    /// one sent before the handshakes told the names apart counts if it came first.)
    fn voted_under_another_name(&self, i: usize, id: OpId) -> bool {
        let Some(run_id) = self.masters[i].run_id else {
            return false;
        };
        let op = &self.ops[id.slot as usize];
        op.gen == id.gen
            && self.masters.iter().enumerate().any(|(k, n)| {
                k != i
                    && n.run_id == Some(run_id)
                    && op.tally.outcomes().get(k) == Some(&Outcome::Ok)
            })
    }

    /// Why master `i`'s yes to a grant in op `id` must not count now, if it must not: the
    /// same server already said yes under another name, fencing needs durability it
    /// lacks, or the amnesia guard still holds it back. The vote's effect stands on the
    /// master; cleanup treats it like any yes (`rules::may_hold`).
    #[inline]
    fn refuse_vote(&self, i: usize, id: OpId, now: Instant) -> Option<Fault> {
        let master = &self.masters[i];
        if self.same_servers && self.voted_under_another_name(i, id) {
            Some(Fault::SameServer)
        } else if self.cfg.require_durable && !master.durable {
            Some(Fault::NotDurable)
        } else if self.cfg.amnesia_guard.is_some() && master.votes_from.is_none_or(|t| now < t) {
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
            // The full release refused for the keys it declares beside the lock keys: the
            // compare-and-delete alone (`scripts::RELEASE_PLAIN`), once.
            if req == Request::Release
                && !eval
                && (t.starts_with(b"NOPERM") || t.starts_with(b"TRYAGAIN"))
                && self.retry_plain_release(i, id)
            {
                return;
            }
            // A waiting acquire refused for its line's keys (an ACL user without the right
            // to `redlock-mux:*`): the same acquire out of any line, once (no fairness and
            // no direct wake-up on that master: what such a user always had).
            if req == Request::AcquireWait
                && !eval
                && t.starts_with(b"NOPERM")
                && self.retry_out_of_line(i, id)
            {
                return;
            }
        }
        if self.ops[id.slot as usize].gen != id.gen {
            return;
        }
        let us = self.micros(now);
        let op = &mut self.ops[id.slot as usize];
        let latency_us = us.saturating_sub(op.started_us);
        op.outstanding = op.outstanding.saturating_sub(1);
        // Counted once per request: not again when its round already counted it as timed
        // out (a late reply still tells the latency). The tally records the first answer
        // of each master only: what it recorded is what the statistics count.
        let first = op.state != OpState::Free && {
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
            op.tally.record(i, outcome)
        };
        let state = op.state;
        let stats = &mut self.masters[i].stats;
        stats.latency.record_us(latency_us);
        if first {
            stats.outcome(outcome);
        }
        if state == OpState::Active {
            self.check_decided(id, now);
        } else {
            self.maybe_free(id.slot);
        }
    }

    /// Master `i`'s literal answer to op `id` (see [`literal_vote`]: `Ok`, `Taken` or
    /// `NotHeld`, never a failure, a holder, a waiting acquire's refusal or an operator's
    /// round: its test checks): what [`Rounds::op_reply`] does with it, without the tests
    /// only those need. A yes to a grant where a vote may be refused (duplicate servers,
    /// fencing's durability, the amnesia guard: `vote_checks`) takes the general path.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn literal_reply(
        &mut self,
        i: usize,
        id: OpId,
        req: Request,
        eval: bool,
        outcome: Outcome,
        value: i64,
        now: Instant,
    ) {
        let ok = matches!(outcome, Outcome::Ok);
        debug_assert_eq!(
            self.vote_checks,
            self.same_servers || self.cfg.require_durable || self.cfg.amnesia_guard.is_some()
        );
        debug_assert!(!req.is_admin(), "no literal answer to an operator's round");
        debug_assert!(
            ok || req != Request::AcquireWait,
            "a waiting acquire's refusal"
        );
        if ok && self.vote_checks && req.grants() {
            self.op_reply(i, id, req, eval, outcome, value, None, now);
            return;
        }
        let slot = id.slot as usize;
        // The clock first (a cache: nothing else changes), then the op looked up once.
        let us = self.micros(now);
        let (ops, masters) = (&mut self.ops, &mut self.masters);
        let op = &mut ops[slot];
        if op.gen != id.gen {
            return;
        }
        let latency_us = us.saturating_sub(op.started_us);
        op.outstanding = op.outstanding.saturating_sub(1);
        let state = op.state;
        let first = state != OpState::Free && {
            if ok && value > op.max_value {
                op.max_value = value;
            }
            // Rebuilt from its tag: the tally stores a byte, not a 64-byte outcome.
            let plain = match outcome {
                Outcome::Ok => Outcome::Ok,
                Outcome::Taken => Outcome::Taken,
                _ => Outcome::NotHeld,
            };
            op.tally.record(i, plain)
        };
        let decided = state == OpState::Active && op.tally.decision() != Decision::Open;
        // `maybe_free`'s test, on the op at hand (a late answer nearly never frees it: its
        // owner has not read the result yet).
        let freed = state == OpState::Decided
            && op.outstanding == 0
            && (op.collected || op.owner.is_none());
        if freed {
            op.state = OpState::Free;
        }
        let stats = &mut masters[i].stats;
        stats.latency.record_us(latency_us);
        if first {
            if ok {
                stats.ok += 1;
            } else {
                stats.refused += 1;
            }
        }
        if decided {
            self.decide(id, now);
        } else if freed {
            self.free.push(id.slot);
        }
    }

    /// An op found decided (`Active`, its tally no longer open; an operator's round with
    /// every master answered): decided now, its owner told, freed if nothing else is
    /// owed. [`Rounds::check_decided`] tests first; a reply's path that knows calls it
    /// directly.
    #[inline(always)]
    fn decide(&mut self, id: OpId, now: Instant) {
        let op = &mut self.ops[id.slot as usize];
        debug_assert!(op.state == OpState::Active && op.tally.decision() != Decision::Open);
        debug_assert!(!op.req.is_admin() || op.tally.pending() == 0);
        op.state = OpState::Decided;
        op.decided_at = now;
        let k = op.active_at as usize;
        let owner = op.owner;
        let free = op.outstanding == 0 && (op.collected || owner.is_none());
        if free {
            op.state = OpState::Free;
        }
        debug_assert_eq!(self.active.get(k), Some(&id.slot));
        self.active.swap_remove(k);
        if let Some(&moved) = self.active.get(k) {
            self.ops[moved as usize].active_at = k as u32;
        }
        if let Some(owner) = owner {
            self.decided.push((owner, id));
        }
        if free {
            self.free.push(id.slot);
        }
    }

    /// Master `i` answered an extend with 2: it had lost a key. For an extension, the
    /// keys are put back once it has its quorum ([`Rounds::restore_where_missing`]); for the
    /// extend that put them back, the master is counted and its watch re-armed.
    #[cold]
    #[inline(never)]
    fn extend_found_missing(&mut self, i: usize, id: OpId, now: Instant) {
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen {
            return;
        }
        if !op.args.put {
            self.restore_where_missing(i, id);
            return;
        }
        self.watch_stats[i].restored += 1;
        if let Some(w) = op.args.token.and_then(|t| self.watches.find_token(&t)) {
            self.arm(i, w, now);
        }
    }

    /// Read every watch again on master `i`'s (new) connection.
    #[cold]
    fn reread_watches(&mut self, i: usize, now: Instant) {
        self.reread[i] = false;
        let ids = self.watches.with_key(None);
        for w in ids {
            let may_hold = self
                .watches
                .get(w)
                .and_then(|x| x.votes.get(i))
                .is_some_and(|v| *v == Vote::Asked);
            if may_hold {
                self.arm(i, w, now);
            }
        }
    }

    /// Re-arm the watch of the lock of `token` on every master, if it is watched: our own
    /// extension ended the tracking of its keys (`NOLOOP` does not report it). Queued behind
    /// the extension on each connection, so each master's read sees the keys after it.
    pub(crate) fn rearm(&mut self, token: &crate::token::Token, now: Instant) {
        if !self.watches.any() {
            return;
        }
        if let Some(w) = self.watches.find_token(token) {
            for i in 0..self.n() {
                self.arm(i, w, now);
            }
        }
    }

    /// Master `i` answered extension `id` with 2: it had lost a key (see
    /// `scripts::EXTEND`). Remembered in the op while it is undecided; put back when the
    /// extension is decided with its quorum (from masters that still held the lock), so
    /// that a lock held on a quorum does not erode one master at a time. An extension that
    /// fails puts nothing back (a lock broken on purpose, `force_release`, stays broken),
    /// and an answer after the decision is left to the next extension: by then the lock may
    /// be released, and a put behind its release would leave the key for a whole TTL
    /// (the simulation's issue19_3, seed 60: an orphan key).
    fn restore_where_missing(&mut self, i: usize, id: OpId) {
        let op = &mut self.ops[id.slot as usize];
        if op.state != OpState::Active {
            // Decided: a watched lock is still held (its release ends the watch, and drops
            // the puts not started yet: `forget_restores`), so its key goes back at once.
            let token = op.args.token;
            if op.tally.decision() == Decision::Reached
                && token.is_some_and(|t| self.watches.find_token(&t).is_some())
            {
                if let Some(m) = op.left_ms.get_mut(i) {
                    *m = 2;
                }
                self.restore_if_reached(id);
            }
            return;
        }
        // `left_ms` of an extend round: 2 where the master lost a key, 0 elsewhere (and
        // once the keys are put back there).
        if let Some(m) = op.left_ms.get_mut(i) {
            *m = 2;
        }
    }

    /// Extension `id` is decided: with its quorum, put back the keys of the masters that
    /// answered that they had lost them (at the end of this step, before the lock can be
    /// released).
    pub(crate) fn restore_if_reached(&mut self, id: OpId) {
        let op = &mut self.ops[id.slot as usize];
        if op.gen != id.gen
            || op.req != Request::Extend
            || op.args.put
            || op.tally.decision() != Decision::Reached
            || !op.left_ms.contains(&2)
        {
            return;
        }
        let mut mask = 0u64;
        for (m, v) in op.left_ms.iter_mut().enumerate() {
            if *v == 2 && m < 64 {
                mask |= 1 << m;
                *v = 0;
            }
        }
        let timeout = op.deadline.saturating_duration_since(op.started);
        self.restores.push((op.args.clone(), mask, timeout));
    }

    /// The lock of `token` is being released: no key of it goes back any more.
    pub(crate) fn forget_restores(&mut self, token: &crate::token::Token) {
        if !self.restores.is_empty() {
            self.restores
                .retain(|(a, _, _)| a.token.as_ref() != Some(token));
        }
    }

    /// Extensions wait to put keys back (see [`Rounds::restore_where_missing`]).
    #[inline]
    pub(crate) fn has_restores(&self) -> bool {
        !self.restores.is_empty()
    }

    /// Put back the keys the extensions found missing: the same extend, with `put`, to
    /// the masters that lost them (fire and forget; the answer re-arms a watch).
    #[cold]
    pub(crate) fn start_restores(&mut self, now: Instant) {
        while let Some((args, mask, timeout)) = self.restores.pop() {
            self.start(
                Request::Extend,
                |a| {
                    *a = args;
                    a.put = true;
                },
                timeout,
                now,
                |m| m < 64 && mask & (1 << m) != 0,
                None,
            );
        }
    }

    /// Arm (or re-arm) the tracking of watch `w`'s keys on master `i` and read them (see
    /// `watch.rs`): `CLIENT CACHING YES` and `MGET`, behind `HELLO 3` and `CLIENT TRACKING
    /// ON OPTIN NOLOOP` where this connection has not turned tracking on yet. A master whose
    /// connection is down loses its vote (the connection that may have held the keys is
    /// gone); one that can not track counts as holding.
    pub(crate) fn arm(&mut self, i: usize, w: WatchId, now: Instant) {
        let Some(keys) = self.watches.get(w).map(|x| &x.keys) else {
            return;
        };
        let link = &self.links[i];
        if !(link.is_up() || link.is_connecting()) {
            // Read once a connection is back (see `tick`); meanwhile unknown where the
            // master showed the token before, nothing where it never did (down at the
            // grant: issue21_watch seed 1077 reported no loss with it counted as holding).
            let fault = link.last_fault.unwrap_or(Fault::Down);
            let vote = self.watches.after_link_lost(w, i, fault);
            self.watches.set_vote(w, i, vote, self.quorum);
            self.reread[i] = true;
            self.due_by(link.retry_at.unwrap_or(now));
            return;
        }
        if link.tracking == Tracking::Refused {
            self.watches.set_vote(w, i, Vote::Blind, self.quorum);
            return;
        }
        if let Some(from) = self.links[i].shared_from.take() {
            let link = &mut self.links[i];
            link.out.extend_from_slice(&self.shared[from..]);
        }
        let link = &mut self.links[i];
        if link.pending.is_empty() {
            link.last_progress = now;
            self.next_due = Some(self.next_due.map_or(now + self.cfg.stall_timeout, |d| {
                d.min(now + self.cfg.stall_timeout)
            }));
        }
        if link.tracking == Tracking::Off {
            resp::encode_command(&mut link.out, &[Arg::Bytes(b"HELLO"), Arg::Uint(3)]);
            link.pending.push_back(Tag::Track(TrackStep::Hello));
            resp::encode_command(
                &mut link.out,
                &[
                    Arg::Bytes(b"CLIENT"),
                    Arg::Bytes(b"TRACKING"),
                    Arg::Bytes(b"ON"),
                    Arg::Bytes(b"OPTIN"),
                    Arg::Bytes(b"NOLOOP"),
                ],
            );
            link.pending.push_back(Tag::Track(TrackStep::On));
            link.tracking = Tracking::Asked;
        }
        resp::encode_command(
            &mut link.out,
            &[
                Arg::Bytes(b"CLIENT"),
                Arg::Bytes(b"CACHING"),
                Arg::Bytes(b"YES"),
            ],
        );
        link.pending.push_back(Tag::Caching);
        watch::encode_mget(&mut link.out, keys);
        link.pending.push_back(Tag::Watch(w));
        link.kick = true;
        self.lock_dirty = true;
        self.unsent = true;
        self.watches.set_vote(w, i, Vote::Asked, self.quorum);
    }

    /// Master `i` pushed an invalidation for the keys of `touched`: none is taken on trust
    /// (a tracking table that evicts sends them for keys that did not change); each
    /// watch that master may hold for is read again there.
    #[cold]
    fn on_invalidated(
        &mut self,
        i: usize,
        touched: smallvec::SmallVec<[WatchId; 4]>,
        now: Instant,
    ) {
        self.watch_stats[i].invalidations += 1;
        self.reread_touched(i, touched, now);
    }

    /// Read the watches of `touched` again on master `i`, those it may hold for.
    fn reread_touched(
        &mut self,
        i: usize,
        touched: smallvec::SmallVec<[WatchId; 4]>,
        now: Instant,
    ) {
        for w in touched {
            let may_hold = self
                .watches
                .get(w)
                .and_then(|x| x.votes.get(i))
                .is_some_and(|v| matches!(v, Vote::Yes | Vote::Asked));
            if may_hold {
                self.arm(i, w, now);
            }
        }
    }

    /// A waiting acquire's reply from master `i`: its script marks a held key (`WAITED`),
    /// and with NOLOOP a write by this very connection ends the tracking of the key
    /// without a word. A shared client's caller that waits for a lock a sibling holds (or
    /// any waiter of ours on a watched key) would leave that watch deaf on this master
    /// until its next extension: every watch of the op's keys is read (and armed) again.
    #[cold]
    #[inline(never)]
    fn after_mark(&mut self, i: usize, id: OpId, now: Instant) {
        if self.ops[id.slot as usize].gen != id.gen {
            return;
        }
        let mut touched: smallvec::SmallVec<[WatchId; 4]> = smallvec::SmallVec::new();
        for k in self.ops[id.slot as usize].args.keys.iter() {
            for w in self.watches.with_key(Some(k)) {
                if !touched.contains(&w) {
                    touched.push(w);
                }
            }
        }
        if !touched.is_empty() {
            self.reread_touched(i, touched, now);
        }
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
        let link = &mut self.links[i];
        self.masters[i].stats.noscript += 1;
        encode_request(&mut link.out, req, &op.args, true);
        link.pending.push_back(Tag::Op {
            id,
            req,
            eval: true,
        });
        link.kick = true;
        let stall = link.last_progress + self.cfg.stall_timeout;
        self.due_by(stall);
        // The extension now runs after the watch's read that was queued behind it: read
        // again after it (its write ends the keys' tracking).
        if req == Request::Extend && self.watches.any() {
            let token = self.ops[id.slot as usize].args.token;
            if let Some(w) = token.and_then(|t| self.watches.find_token(&t)) {
                self.arm(i, w, self.clock.0);
            }
        }
        true
    }

    /// Master `i` answered release `id`'s `DELIFEQ key token`. `:1`: deleted, the master's
    /// yes. Else the release's script goes after it, and its answer is the master's: `:0`
    /// says only that the key's value is not exactly the token (gone, someone else's, or
    /// ours *marked* by a refused waiter, `scripts::WAITED`: that one must still be
    /// deleted and its waiters announced, which only the script does); an error is the
    /// script's to meet as any release's (`-NOPERM` or an unknown command also stops
    /// `DELIFEQ` to that master for good: `Master::delifeq_refused`).
    fn delifeq_reply(&mut self, i: usize, id: OpId, answer: DelIfEq, now: Instant) {
        match answer {
            DelIfEq::Deleted => {
                self.op_reply(i, id, Request::Release, false, Outcome::Ok, 1, None, now);
                return;
            }
            DelIfEq::Refused => {
                let master = &mut self.masters[i];
                master.delifeq = false;
                master.delifeq_refused = true;
            }
            DelIfEq::NotDeleted | DelIfEq::Failed | DelIfEq::Unexpected => {}
        }
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return;
        }
        // Behind whatever the link queued since (the script runs after the requests
        // sent before it, as any request of a later round would).
        let upto = self.shared.len();
        self.unshare(i, upto);
        let op = &self.ops[id.slot as usize];
        let link = &mut self.links[i];
        encode_request(&mut link.out, Request::Release, &op.args, false);
        link.pending.push_back(Tag::Op {
            id,
            req: Request::Release,
            eval: false,
        });
        // Written after this read (`kick`), and by the next flush whatever the driver
        // does with `kick` (as a watch's read is): a script not written would hold the
        // marked key, and its waiters, until the stall timeout closed the connection.
        link.kick = true;
        self.lock_dirty = true;
        let stall = link.last_progress + self.cfg.stall_timeout;
        self.due_by(stall);
    }

    /// Send release `id` again to master `i` as the compare-and-delete alone
    /// ([`crate::scripts::RELEASE_PLAIN`]): the full script was refused for its line's keys.
    #[cold]
    fn retry_plain_release(&mut self, i: usize, id: OpId) -> bool {
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen || op.state == OpState::Free {
            return false;
        }
        let upto = self.shared.len();
        self.unshare(i, upto);
        let op = &self.ops[id.slot as usize];
        let link = &mut self.links[i];
        super::encode::encode_plain_release(&mut link.out, &op.args);
        link.pending.push_back(Tag::Op {
            id,
            req: Request::Release,
            eval: true,
        });
        link.kick = true;
        let stall = link.last_progress + self.cfg.stall_timeout;
        self.due_by(stall);
        true
    }

    /// Send waiting acquire `id` again to master `i` without its line's keys and arguments.
    #[cold]
    fn retry_out_of_line(&mut self, i: usize, id: OpId) -> bool {
        let op = &self.ops[id.slot as usize];
        if op.gen != id.gen || op.state != OpState::Active || op.collected || op.args.line.is_none()
        {
            return false;
        }
        let upto = self.shared.len();
        self.unshare(i, upto);
        let op = &mut self.ops[id.slot as usize];
        let line = op.args.line.take();
        let link = &mut self.links[i];
        // With `EVAL` (the source): its tag says so, and a `-NOSCRIPT` is then not retried.
        encode_request(&mut link.out, Request::AcquireWait, &op.args, true);
        op.args.line = line;
        link.pending.push_back(Tag::Op {
            id,
            req: Request::AcquireWait,
            eval: true,
        });
        link.kick = true;
        let stall = link.last_progress + self.cfg.stall_timeout;
        self.due_by(stall);
        true
    }

    /// What every master did, by name (the driver adds its syscall counts).
    pub(crate) fn stats(&self) -> Vec<MasterStats> {
        self.masters
            .iter()
            .zip(self.watch_stats.iter())
            .map(|(m, w)| MasterStats::new(m.name.clone(), m.stats.clone()).with_watch(*w))
            .collect()
    }
}

/// What a `DELIFEQ` answer says (see [`Rounds::delifeq_reply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DelIfEq {
    /// `:1`: the key held the token; deleted.
    Deleted,
    /// `:0`: the key does not hold exactly the token.
    NotDeleted,
    /// `-NOPERM` or `-ERR unknown command`: the master will not run `DELIFEQ` for us.
    Refused,
    /// Another error (`-WRONGTYPE`, `-LOADING`...).
    Failed,
    /// No answer to `DELIFEQ`: the stream can not be trusted.
    Unexpected,
}

impl DelIfEq {
    fn of(frame: &Frame<'_>) -> DelIfEq {
        match frame {
            Frame::Integer(1) => DelIfEq::Deleted,
            Frame::Integer(0) => DelIfEq::NotDeleted,
            Frame::Error(m) | Frame::BulkError(m)
                if m.starts_with(b"NOPERM") || m.starts_with(b"ERR unknown command") =>
            {
                DelIfEq::Refused
            }
            Frame::Error(_) | Frame::BulkError(_) => DelIfEq::Failed,
            _ => DelIfEq::Unexpected,
        }
    }
}

/// [`Rounds::enqueue`] on master `master`'s lock link `link` (`shared`: the shared buffer).
#[inline(always)]
fn enqueue_on(
    link: &mut Link,
    master: &mut Master,
    shared: &[u8],
    id: OpId,
    req: Request,
    at: usize,
    now: Instant,
) -> bool {
    let started = link.pending.is_empty();
    if started {
        link.last_progress = now;
    }
    // Already sharing: this request rides along. Empty queue: share from here. Bytes
    // queued: append a copy behind them.
    if link.shared_from.is_none() {
        if link.out.is_empty() {
            link.shared_from = Some(at);
        } else {
            link.out.extend_from_slice(&shared[at..]);
        }
    }
    link.pending.push_back(Tag::Op {
        id,
        req,
        eval: false,
    });
    master.stats.requests += 1;
    started
}

/// The outcome, value and length of a whole literal answer at the start of `buf` to
/// `req`, for the answers a lock cycle lives on (`None`: anything else, which the parser
/// and `rules::classify` read). The same outcome and value as the general path gives.
#[inline(always)]
fn literal_vote(req: Request, buf: &[u8]) -> Option<(Outcome, i64, usize)> {
    const fn word(b: &[u8; 4]) -> u32 {
        u32::from_le_bytes(*b)
    }
    let w = u32::from_le_bytes(*buf.first_chunk::<4>()?);
    match req {
        Request::Acquire if buf.get(4) == Some(&b'\n') => {
            if w == word(b"+OK\r") {
                Some((Outcome::Ok, 0, 5))
            } else if w == word(b"$-1\r") {
                Some((Outcome::Taken, 0, 5))
            } else {
                None
            }
        }
        Request::Release | Request::Extend if w == word(b":1\r\n") => Some((Outcome::Ok, 1, 4)),
        Request::Release | Request::Extend if w == word(b":0\r\n") => {
            Some((Outcome::NotHeld, 0, 4))
        }
        Request::AcquireMany if w == word(b":1\r\n") => Some((Outcome::Ok, 1, 4)),
        Request::AcquireMany if w == word(b":0\r\n") => Some((Outcome::Taken, 0, 4)),
        Request::AcquireWait if w == word(b":0\r\n") => Some((Outcome::Ok, 0, 4)),
        _ => None,
    }
}

/// What a connect that timed out in `phase` failed with.
fn connect_timed_out(phase: ConnectPhase) -> Fault {
    match phase {
        ConnectPhase::Resolving => Fault::Resolve(ErrorText::new(b"timed out")),
        ConnectPhase::Connecting => Fault::Connect(io::ErrorKind::TimedOut),
        ConnectPhase::Tls => Fault::Tls(TlsFault::Other(ErrorText::new(b"handshake timed out"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The literal answers read off the input mean what the parser and `classify` make of
    /// them, and whatever else is left to those.
    #[test]
    fn literal_votes_agree_with_the_general_path() {
        let limits = NetConfig::default().limits;
        let inputs: &[&[u8]] = &[
            b"+OK\r\n",
            b"+OK\r\n:1\r\n",
            b"$-1\r\n",
            b"$-1\r\n+OK\r\n",
            b":0\r\n",
            b":1\r\n",
            b":1\r\n:0\r\n",
            b":2\r\n",
            b":-1\r\n",
            b"_\r\n",
            b"+OK\r",
            b"+OK",
            b":1\r",
            b"+OKX\r\n",
            b"+ok\r\n",
            b"$-1\rX",
            b"-ERR no\r\n",
            b"*2\r\n:9000\r\n$16\r\n0123456789abcdef\r\n",
        ];
        let requests = [
            Request::Acquire,
            Request::AcquireMany,
            Request::AcquireWait,
            Request::Release,
            Request::Extend,
            Request::FenceDraw,
            Request::FenceWriteBack,
            Request::Inspect,
            Request::ForceRelease,
        ];
        for &req in &requests {
            for &input in inputs {
                let Some((outcome, value, used)) = literal_vote(req, input) else {
                    continue;
                };
                // What `literal_reply` leaves out: no operator's round, no refusal of a
                // waiting acquire (it names its holder), never a failure.
                assert!(!req.is_admin(), "{req:?} {input:?}: an operator's round");
                assert!(
                    req != Request::AcquireWait || outcome == Outcome::Ok,
                    "{req:?} {input:?}: a waiting acquire's {outcome:?}"
                );
                assert!(
                    matches!(outcome, Outcome::Ok | Outcome::Taken | Outcome::NotHeld),
                    "{req:?} {input:?}: {outcome:?}"
                );
                let Ok(resp::Status::Complete((frame, n))) = resp::parse(input, &limits) else {
                    panic!("{req:?} {input:?}: a literal that does not parse");
                };
                assert_eq!(used, n, "{req:?} {input:?}");
                assert_eq!(
                    rules::classify(req, &frame),
                    Ok(outcome),
                    "{req:?} {input:?}"
                );
                let v = match frame {
                    Frame::Integer(v) => v,
                    _ => 0,
                };
                assert_eq!(value, v, "{req:?} {input:?}");
            }
        }
        // The common answers do take the literal path.
        assert!(literal_vote(Request::Acquire, b"+OK\r\n").is_some());
        assert!(literal_vote(Request::Release, b":1\r\n").is_some());
        assert!(literal_vote(Request::Acquire, b"+OK\r").is_none());
    }
}
