//! The whole Redlock client as a state machine, without I/O (quinn-proto's shape): the
//! same code for both front-ends, the deterministic simulation and the fuzzer.
//!
//! A *task* is one lock operation as a user asked for it (take a lock with retries and a
//! deadline, release one, extend one), run over fan-out *rounds* (`rounds.rs`) on the
//! masters' links (`link.rs`, `chans.rs` for the release announcements).
//!
//! In: submissions ([`Core::submit_lock`], ...), the bytes the driver read per link
//! ([`Core::recv_buf`], [`Core::received`]), what its sockets did
//! ([`Core::handle_connected`], [`Core::handle_closed`]), and the time with every call.
//! Out: the bytes to write per link ([`Core::send_buf`], [`Core::sent`]), what to do with
//! the sockets ([`Core::take_action`]), the next timer ([`Core::next_timer`]) and the
//! finished tasks ([`Core::is_done`], [`Core::take`]). Nothing here reads a clock, opens a
//! socket or sleeps; randomness comes from a seed (and the lock tokens from the token
//! source the core was built with).
//!
//! The single-owner [`crate::Redlock`] submits a task and drives the loop on the caller's
//! thread until it is done; the shared client's loop thread drives many tasks at once and
//! hands each result to whoever waits for it. Either way the same code decides: `task.rs`
//! holds every step (acquire, fencing draw and write-back, cleanup release, retry delay,
//! deadline, cancellation), `wait.rs` how waiting tasks hear of releases; this file holds
//! the table of tasks and the step that feeds them the rounds' decisions and timers.

mod admin;
mod chans;
// Cluster masters (issue 22): slot maps, redirections, one ordered stream over the shards.
mod cluster;
mod cluster_link;
mod encode;
mod link;
mod ops;
mod rounds;
mod task;
mod wait;
mod watch;

use std::io;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::error::{Error, Operation, Report};
use crate::lock::Lock;
use crate::rules;
use crate::token::{Token, TokenSource};

pub(crate) use chans::{fingerprint, ChanId, Fingerprint, Notice};
pub(crate) use link::Master;
pub use link::{Action, ConnectPhase, LinkId};
pub(crate) use ops::{KeyList, Line, OpId};
pub use rounds::IDLE_SHIFT_MIN;
pub(crate) use rounds::{NetConfig, Owner, Rounds};
pub use task::Done;
use task::Task;
pub use wait::WaitMode;
pub use watch::WatchId;

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the acquire round.
    Acquire,
    /// Fencing: waiting for the draw round.
    Draw,
    /// Fencing: waiting for the write-back round.
    WriteBack,
    /// Between attempts, until `wake`.
    Sleep,
    /// A release or extend round.
    OnLock,
    /// The result is in.
    Done,
}

/// The Redlock settings of a client (from its builder).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub retry_count: u32,
    pub retry_delay: Duration,
    pub retry_jitter: Duration,
    pub drift_factor: f64,
    pub node_timeout: Option<Duration>,
    pub min_validity: Duration,
    pub fencing: bool,
    pub amnesia_guard: Option<Duration>,
    pub wait_mode: WaitMode,
    pub fairness: bool,
}

#[cfg(test)]
impl Settings {
    /// The builder's defaults, no retry and `WaitMode::Poll`: what unit tests of the core
    /// and the driver start from.
    pub(crate) fn for_tests() -> Settings {
        Settings {
            retry_count: 0,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(100),
            drift_factor: 0.01,
            node_timeout: None,
            min_validity: Duration::ZERO,
            fencing: false,
            amnesia_guard: None,
            wait_mode: WaitMode::Poll,
            fairness: false,
        }
    }
}

impl Settings {
    /// The round timeout used for a TTL.
    pub(crate) fn round_timeout(&self, ttl: Duration) -> Duration {
        let t = self.node_timeout.unwrap_or_else(|| {
            (ttl / 100).clamp(Duration::from_millis(10), Duration::from_millis(50))
        });
        // A round that outlives the TTL minus drift can never yield validity.
        t.min(ttl.saturating_sub(rules::drift(ttl, self.drift_factor)))
            .max(Duration::from_millis(1))
    }

    /// Check a TTL; returns it in whole milliseconds, as `PX` and `PEXPIRE` take it (the
    /// validity is computed from what the masters were sent, not from more).
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<Duration, Error> {
        if ttl < Duration::from_millis(1) {
            return Err(Error::InvalidArgument(format!(
                "ttl {ttl:?} is below the 1 ms resolution of PX"
            )));
        }
        if ttl > crate::lock::MAX_TTL {
            return Err(Error::InvalidArgument(format!(
                "ttl {ttl:?} is above the maximum {:?}",
                crate::lock::MAX_TTL
            )));
        }
        if let Some(max) = self.amnesia_guard {
            if ttl > max {
                return Err(Error::InvalidArgument(format!(
                    "ttl {ttl:?} is above the amnesia guard's max_ttl {max:?}"
                )));
            }
        }
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        let drift = rules::drift(ttl, self.drift_factor);
        if ttl <= drift.saturating_add(self.min_validity) {
            return Err(Error::InvalidArgument(format!(
                "ttl {ttl:?} leaves no validity after the drift allowance {drift:?} \
                 and minimum validity {:?}",
                self.min_validity
            )));
        }
        Ok(ttl)
    }
}

/// What a release or an extend reads of the lock it runs on.
pub(crate) struct OnLock<'a> {
    pub keys: &'a KeyList,
    pub token: Token,
    /// The lock's deadline: an extend's bound (`None` for a release, which reads none).
    pub valid_until: Option<Instant>,
    /// The line the lock's call stood in (left by its release).
    pub line: Option<Fingerprint>,
}

/// A task's handle: slot plus generation, so a stale handle never aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId {
    slot: u32,
    gen: u32,
}

impl TaskId {
    fn owner(self) -> Owner {
        Owner(u64::from(self.gen) << 32 | u64::from(self.slot))
    }
    fn from_owner(o: Owner) -> TaskId {
        TaskId {
            slot: o.0 as u32,
            gen: (o.0 >> 32) as u32,
        }
    }
    /// The slot, for a front-end's own per-task table (unique among live tasks).
    pub(crate) fn slot(self) -> usize {
        self.slot as usize
    }
}

/// The rounds, the tasks, and what they need: the token source, the jitter generator,
/// the settings.
pub struct Core {
    pub(crate) rounds: Rounds,
    pub(crate) cfg: Settings,
    tasks: Vec<Task>,
    free: Vec<u32>,
    /// Slots of the tasks sleeping between attempts.
    sleeping: Vec<u32>,
    /// No sleeping task wakes before this (a lower bound; `None`: none sleeps).
    next_wake: Option<Instant>,
    /// Tasks finished since the front-end last took them (see [`Core::take_finished`]),
    /// kept only when `track_finished` (the shared client's loop; the single owner waits
    /// for one task at a time and asks it directly).
    finished: Vec<TaskId>,
    pub(crate) track_finished: bool,
    tokens: TokenSource,
    rng: fastrand::Rng,
    /// Notify mode: per channel (by slot), the tasks waiting on it in arrival order.
    waitlists: Vec<SmallVec<[TaskId; 4]>>,
    /// The next lock task's arrival number.
    next_seq: u64,
    /// This client's id (hex): the start of its waiters' ids in the lines on the masters,
    /// and the name of its own channel there (see `scripts::NEXT_PREFIX`).
    client_id: [u8; crate::scripts::CLIENT_ID_LEN],
    /// The client's wall clock (µs since the epoch) at an instant: the arrival scores in
    /// the lines of waiters are read from it and the monotonic clock (a step of the wall
    /// clock later does not reorder this client's waiters).
    wall: (u64, Instant),
    /// The last arrival score given.
    last_score: u64,
    /// The last TTL whose round timeout was asked, and that timeout (see
    /// [`Core::round_timeout`]): a client's locks nearly always share one TTL.
    timeout_memo: std::cell::Cell<(Duration, Duration)>,
    /// The last TTL [`Core::check_ttl`] accepted, and what it made of it.
    ttl_memo: std::cell::Cell<Option<(Duration, Duration)>>,
    /// The last TTL whose drift allowance was asked, and that allowance (see
    /// [`Core::drift`]).
    drift_memo: std::cell::Cell<(Duration, Duration)>,
}

impl Core {
    pub(crate) fn new(
        rounds: Rounds,
        cfg: Settings,
        mut tokens: TokenSource,
        seed: Option<u64>,
        now: Instant,
        wall_us: u64,
    ) -> io::Result<Self> {
        let seed = match seed {
            Some(s) => s,
            None => tokens.seed()?,
        };
        let mut m = Core {
            rounds,
            cfg,
            tasks: Vec::with_capacity(64),
            free: Vec::with_capacity(64),
            sleeping: Vec::with_capacity(16),
            next_wake: None,
            finished: Vec::with_capacity(64),
            track_finished: false,
            tokens,
            rng: fastrand::Rng::with_seed(seed),
            waitlists: Vec::new(),
            next_seq: 0,
            client_id: [0; crate::scripts::CLIENT_ID_LEN],
            wall: (wall_us, now),
            last_score: 0,
            timeout_memo: std::cell::Cell::new((Duration::ZERO, Duration::ZERO)),
            ttl_memo: std::cell::Cell::new(None),
            drift_memo: std::cell::Cell::new((Duration::ZERO, Duration::ZERO)),
        };
        m.timeout_memo
            .set((Duration::ZERO, m.cfg.round_timeout(Duration::ZERO)));
        m.drift_memo.set((
            Duration::ZERO,
            rules::drift(Duration::ZERO, m.cfg.drift_factor),
        ));
        let id = m.tokens.next()?;
        m.client_id
            .copy_from_slice(&id.as_bytes()[..crate::scripts::CLIENT_ID_LEN]);
        for _ in 0..4 {
            m.new_slot(now);
        }
        Ok(m)
    }

    fn new_slot(&mut self, now: Instant) {
        self.tasks.push(Task::new(now));
        self.free.push((self.tasks.len() - 1) as u32);
    }

    #[inline]
    fn alloc(&mut self, now: Instant) -> TaskId {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.new_slot(now);
                self.free.pop().expect("slot just pushed")
            }
        };
        let t = &mut self.tasks[slot as usize];
        t.gen = t.gen.wrapping_add(1);
        TaskId { slot, gen: t.gen }
    }

    fn task(&mut self, id: TaskId) -> Option<&mut Task> {
        self.tasks
            .get_mut(id.slot as usize)
            .filter(|t| t.gen == id.gen && t.live)
    }

    /// Whether the task has its result.
    #[inline]
    pub fn is_done(&self, id: TaskId) -> bool {
        let t = &self.tasks[id.slot as usize];
        t.gen == id.gen && t.has_result()
    }

    /// Free finished task `id` (its slot goes back to the free list) and give it for its
    /// result to be taken.
    #[inline]
    fn free_task(&mut self, id: TaskId) -> &mut Task {
        let t = &mut self.tasks[id.slot as usize];
        debug_assert!(t.gen == id.gen && t.live);
        t.live = false;
        self.free.push(id.slot);
        &mut self.tasks[id.slot as usize]
    }

    /// Take a finished task's result and free it.
    pub fn take(&mut self, id: TaskId) -> Result<Done, Error> {
        let t = self.free_task(id);
        // A result is as large as a lock (272 bytes): a release's is a flag.
        if t.released {
            t.released = false;
            return Ok(Done::Released);
        }
        // One move of the result, out of the task into the caller's.
        match t.result.take() {
            Some(r) => r,
            None => Err(Error::Cancelled),
        }
    }

    /// [`Core::take`] of a task whose result says only whether it went through (a
    /// release): nothing built, moved or dropped when it did.
    #[inline]
    pub(crate) fn take_unit(&mut self, id: TaskId) -> Result<(), Error> {
        let t = self.free_task(id);
        if t.released {
            t.released = false;
            return Ok(());
        }
        match t.result.take() {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(e),
            None => Err(Error::Cancelled),
        }
    }

    /// [`Core::take`] for a front-end that keeps a lock's parts elsewhere (the shared
    /// client's lock state): `f` reads the result where the task holds it (a result is as
    /// large as a lock, 272 bytes: not moved out whole), then the task is freed and what
    /// `f` left of the result dropped.
    #[inline]
    pub(crate) fn take_in_place<R>(
        &mut self,
        id: TaskId,
        f: impl FnOnce(&mut Result<Done, Error>) -> R,
    ) -> R {
        let t = self.free_task(id);
        if t.released {
            t.released = false;
            return f(&mut Ok(Done::Released));
        }
        match &mut t.result {
            Some(r) => {
                let out = f(r);
                t.result = None;
                out
            }
            None => f(&mut Err(Error::Cancelled)),
        }
    }

    /// [`Settings::check_ttl`] of `ttl`, remembered for the last TTL accepted (a client's
    /// locks nearly always share a TTL; the check takes a floating-point product).
    #[inline]
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<Duration, Error> {
        if let Some((asked, whole)) = self.ttl_memo.get() {
            if asked == ttl {
                return Ok(whole);
            }
        }
        let whole = self.cfg.check_ttl(ttl)?;
        self.ttl_memo.set(Some((ttl, whole)));
        Ok(whole)
    }

    /// [`Settings::round_timeout`] of `ttl`, remembered for the last TTL asked (it takes a
    /// floating-point product and a division; a client's locks nearly always share a TTL).
    #[inline]
    pub(crate) fn round_timeout(&self, ttl: Duration) -> Duration {
        let (last, timeout) = self.timeout_memo.get();
        if ttl == last {
            return timeout;
        }
        let timeout = self.cfg.round_timeout(ttl);
        self.timeout_memo.set((ttl, timeout));
        timeout
    }

    /// [`rules::drift`] of `ttl` (the allowance a verdict subtracts), remembered for the
    /// last TTL asked (a floating-point product and a rounding; a client's locks nearly
    /// always share a TTL).
    #[inline]
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        let (last, drift) = self.drift_memo.get();
        if ttl == last {
            return drift;
        }
        let drift = rules::drift(ttl, self.cfg.drift_factor);
        self.drift_memo.set((ttl, drift));
        drift
    }

    /// Tasks finished since the last call (each once).
    pub(crate) fn take_finished(&mut self) -> std::vec::Drain<'_, TaskId> {
        self.finished.drain(..)
    }

    /// How many tasks [`Core::take_finished`] would give.
    #[inline]
    pub(crate) fn finished_count(&self) -> usize {
        self.finished.len()
    }

    /// [`Core::take_finished`] when one task finished: that one.
    #[inline]
    pub(crate) fn take_one_finished(&mut self) -> Option<TaskId> {
        debug_assert!(self.finished.len() <= 1);
        self.finished.pop()
    }

    /// Take `keys` for `ttl` (whole ms, checked): one attempt, then up to `retries` more
    /// after a random delay while the lock is taken or no quorum answers, never past
    /// `deadline`.
    pub fn submit_lock<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
        now: Instant,
    ) -> TaskId {
        self.new_lock(
            |list| {
                list.clear();
                for k in keys {
                    list.push(k);
                }
            },
            ttl,
            deadline,
            retries,
            now,
        )
    }

    /// [`Core::submit_lock`] of keys a front-end already holds as a list (the shared
    /// client's command): swapped into the task, not copied key by key; `keys` is left
    /// with what the task's slot held (nothing a caller reads).
    pub(crate) fn submit_lock_list(
        &mut self,
        keys: &mut KeyList,
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
        now: Instant,
    ) -> TaskId {
        self.new_lock(
            |list| std::mem::swap(list, keys),
            ttl,
            deadline,
            retries,
            now,
        )
    }

    /// [`Core::submit_lock`], its keys put in the task's list by `fill`.
    #[inline(always)]
    fn new_lock(
        &mut self,
        fill: impl FnOnce(&mut KeyList),
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
        now: Instant,
    ) -> TaskId {
        let id = self.alloc(now);
        let t = &mut self.tasks[id.slot as usize];
        t.begin(task::Kind::Lock, ttl, now);
        fill(&mut t.keys);
        #[cfg(feature = "tracing")]
        {
            t.span = tracing::debug_span!(
                "redlock_mux::lock",
                resource = %String::from_utf8_lossy(t.keys.iter().next().unwrap_or_default()),
                resources = t.keys.len(),
                ttl_ms = ttl.as_millis() as u64,
                retries,
                waited_us = tracing::field::Empty,
                held_us = tracing::field::Empty
            );
        }
        t.deadline = deadline;
        t.retries = retries;
        t.seq = self.next_seq;
        self.next_seq += 1;
        // Arrival on the client's clock: every master orders a key's line by it alike.
        // Strictly increasing within the client (calls submitted in one step share their
        // `now`), so that the lines order this client's waiters as it does itself. Only a
        // task that may wait ever stands in a line (`Task::waits`).
        if retries > 0 || deadline.is_some() {
            let since = now.saturating_duration_since(self.wall.1);
            let wall = self.wall.0 + since.as_secs() * 1_000_000 + u64::from(since.subsec_micros());
            t.score = wall.max(self.last_score + 1);
            self.last_score = t.score;
        }
        self.start_attempt(id, now);
        id
    }

    /// Release `lock` on every master.
    pub fn submit_release(&mut self, lock: &Lock, now: Instant) -> TaskId {
        lock.record_hold(now);
        self.submit_release_of(
            OnLock {
                keys: &lock.keys,
                token: lock.token,
                valid_until: None,
                line: lock.line,
            },
            lock.ttl,
            now,
        )
    }

    /// [`Core::submit_release`] of a lock kept elsewhere, by the parts a release reads (the
    /// shared client's lock state: no [`Lock`] is built for it, no key copied into one).
    /// The caller records the hold (`Lock::record_hold`).
    #[inline]
    pub(crate) fn submit_release_of(
        &mut self,
        lock: OnLock<'_>,
        ttl: Duration,
        now: Instant,
    ) -> TaskId {
        if self.rounds.watches.any() {
            self.rounds.watches.remove_token(&lock.token);
        }
        if self.rounds.has_restores() {
            self.rounds.forget_restores(&lock.token);
        }
        self.submit_on(task::Kind::Release, lock, ttl, now)
    }

    /// Release `lock` on every master, fire and forget (a lock its user dropped).
    pub fn release_detached(&mut self, lock: &Lock, now: Instant) {
        lock.record_hold(now);
        if self.rounds.watches.any() {
            self.rounds.watches.remove_token(&lock.token);
        }
        if self.rounds.has_restores() {
            self.rounds.forget_restores(&lock.token);
        }
        let timeout = self.round_timeout(lock.ttl);
        let (token, ttl_ms) = (lock.token, lock.ttl.as_millis() as u64);
        let leave = lock.line;
        let waiters_here = self.listens_on(&lock.keys);
        self.rounds.start(
            crate::rules::Request::Release,
            |a| {
                a.set_list(&lock.keys, token, ttl_ms);
                a.leave = leave;
                a.of_lock = true;
                a.waiters_here = waiters_here;
            },
            timeout,
            now,
            |_| true,
            None,
        );
        self.released_here(&lock.keys, token.as_bytes(), None, None, now);
    }

    /// Extend `lock` to live at least `ttl` (whole ms, checked) from now.
    pub fn submit_extend(&mut self, lock: &Lock, ttl: Duration, now: Instant) -> TaskId {
        self.submit_on_lock(task::Kind::Extend, lock, ttl, now)
    }

    fn submit_on_lock(
        &mut self,
        kind: task::Kind,
        lock: &Lock,
        ttl: Duration,
        now: Instant,
    ) -> TaskId {
        let on = OnLock {
            keys: &lock.keys,
            token: lock.token,
            valid_until: Some(lock.valid_until),
            line: lock.line,
        };
        self.submit_on(kind, on, ttl, now)
    }

    fn submit_on(
        &mut self,
        kind: task::Kind,
        lock: OnLock<'_>,
        ttl: Duration,
        now: Instant,
    ) -> TaskId {
        let id = self.alloc(now);
        let t = &mut self.tasks[id.slot as usize];
        t.begin(kind, ttl, now);
        // The keys go to the round's arguments alone: a release or an extend reads them
        // nowhere else (no copy kept in the task).
        t.keys.clear();
        #[cfg(feature = "tracing")]
        {
            t.span = tracing::debug_span!(
                "redlock_mux::on_lock",
                op = ?kind,
                resource = %String::from_utf8_lossy(lock.keys.iter().next().unwrap_or_default()),
                ttl_ms = ttl.as_millis() as u64
            );
        }
        t.token = lock.token;
        if let Some(v) = lock.valid_until {
            t.valid_until = v;
        }
        t.wait_id = lock.line;
        t.waited |= lock.line.is_some();
        self.start_round_on_lock(id, lock.keys, now);
        id
    }

    /// The earliest of the rounds' timers, the sleeping tasks' and `until`.
    #[inline]
    pub fn next_timer(&self, until: Option<Instant>) -> Option<Instant> {
        let min = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        };
        min(min(self.rounds.next_due(), self.next_wake), until)
    }

    /// Some timer is due at `now` (the driver reads what the sockets hold before the step
    /// judges it).
    #[inline]
    pub fn timer_due(&self, now: Instant) -> bool {
        // The earliest is due when either is (two comparisons, no minimum taken).
        self.rounds.next_due().is_some_and(|t| now >= t) || self.next_wake.is_some_and(|t| now >= t)
    }

    /// One step at `now`: run the due timers, hand each decided round to its task, wake the
    /// tasks whose retry delay is over, hand the announcements heard to the waiters.
    /// Whatever was submitted or advanced in one step goes out in the driver's next flush,
    /// in one write per master.
    #[inline]
    pub fn step(&mut self, now: Instant) {
        // Most turns of a loop have nothing to step over (replies read that decided
        // nothing): a test, no call.
        if self.has_news() || self.timer_due(now) {
            self.step_due(now);
        }
    }

    /// [`Core::step`] when a timer is due or a round was decided, or a notice heard.
    #[inline(never)]
    fn step_due(&mut self, now: Instant) {
        self.rounds.tick_if_due(now);
        if self.next_wake.is_some_and(|w| now >= w) {
            self.wake_sleepers(now);
        }
        loop {
            while let Some((owner, op)) = self.rounds.take_decided() {
                self.on_decided(TaskId::from_owner(owner), op, now);
            }
            // Releases announced, subscriptions confirmed: waiters try (an attempt can be
            // decided at once, e.g. every master down: round again).
            self.take_notices(now);
            if !self.rounds.has_decided() {
                break;
            }
        }
        if self.rounds.has_restores() {
            self.rounds.start_restores(now);
        }
    }

    /// Something the last [`Core::step`] did not see is waiting for the next one (a round
    /// decided by a socket's failure, an announcement read): step again before sleeping.
    #[inline]
    pub fn has_news(&self) -> bool {
        self.rounds.has_decided() || self.rounds.chans.has_notices() || self.rounds.has_restores()
    }

    // ---- The driver's side: sockets, bytes, the clock ----------------------------------

    /// The masters (`n`): links `0..n` are their lock links, `n..2n` their sub links.
    #[inline]
    pub fn masters(&self) -> usize {
        self.rounds.n()
    }

    /// The master link `l` belongs to. Links from `2 n` on are cluster masters' (their
    /// discovery and shard connections).
    pub fn link_master(&self, l: LinkId) -> usize {
        self.rounds.link_master(l)
    }

    /// Where to connect link `l`: `Some` for a cluster's shard link (the address its map
    /// gave), `None` for every other link (its master's own endpoint, as its URL says).
    pub fn link_addr(&self, l: LinkId) -> Option<std::net::SocketAddr> {
        self.rounds.link_addr(l)
    }

    /// The next thing the driver must do with a socket, in order.
    #[inline]
    pub fn take_action(&mut self) -> Option<Action> {
        self.rounds.take_action()
    }

    /// Whether [`Core::take_action`] has something to give (a test for the loop's turn,
    /// which nearly never has: connects and closes).
    #[inline]
    pub(crate) fn has_actions(&self) -> bool {
        self.rounds.has_actions()
    }

    /// A connect of link `l` has come as far as `phase` (what its timeout will mean).
    pub fn handle_connect_phase(&mut self, l: LinkId, phase: ConnectPhase) {
        self.rounds.handle_connect_phase(l, phase);
    }

    /// Link `l` is connected (TLS handshake included): its queued bytes may go out.
    pub fn handle_connected(&mut self, l: LinkId) {
        self.rounds.handle_connected(l);
    }

    /// Link `l`'s connect failed, or its connection broke or was closed by the master.
    pub fn handle_closed(&mut self, l: LinkId, fault: rules::Fault, now: Instant) {
        self.rounds.handle_closed(l, fault, now);
    }

    /// Where the driver reads link `l`'s next bytes to; `None` when it is not up (or its
    /// input outgrew the limits: then it was closed).
    #[inline]
    pub fn recv_buf(&mut self, l: LinkId, now: Instant) -> Option<&mut [u8]> {
        self.rounds.recv_buf(l, now)
    }

    /// `len` bytes were read into [`Core::recv_buf`]: handle every complete reply.
    /// `false`: the link was closed (a protocol error, a refused handshake...).
    #[inline]
    pub fn received(&mut self, l: LinkId, len: usize, now: Instant) -> bool {
        self.rounds.received(l, len, now)
    }

    /// Link `l` is up and has bytes that may be written now.
    #[inline]
    pub fn has_output(&self, l: LinkId) -> bool {
        self.rounds.has_output(l)
    }

    /// The bytes link `l` may write now; report the bytes written with [`Core::sent`].
    #[inline]
    pub fn send_buf(&mut self, l: LinkId) -> &[u8] {
        self.rounds.send_buf(l)
    }

    /// `written` bytes of [`Core::send_buf`] went out (0: the socket would block).
    /// Returns whether bytes are left that may be written now.
    #[inline]
    pub fn sent(&mut self, l: LinkId, written: usize) -> bool {
        self.rounds.sent(l, written)
    }

    /// Which links may have bytes to write since the last flush: (lock links, sub links).
    #[inline]
    pub fn flush_wanted(&self) -> (bool, bool) {
        self.rounds.flush_wanted()
    }

    /// The driver's flush is over (what a link could not write stays queued in it).
    #[inline]
    pub fn flushed(&mut self) {
        self.rounds.flushed();
    }

    /// Write what every link that may have bytes holds (see [`Core::flush_wanted`]) with
    /// `write` (the bytes the socket took, 0 when it would block), then
    /// [`Core::flushed`]: the driver's flush in one call, one `write` per master when the
    /// kernel takes it all. A write that fails closes its link.
    #[inline]
    pub fn flush_with(
        &mut self,
        now: Instant,
        write: impl FnMut(LinkId, &[u8]) -> Result<usize, rules::Fault>,
    ) {
        self.rounds.flush_with(now, write);
    }

    /// Write what link `l` may write now with `write`, until it would block or all is out.
    #[inline]
    pub fn write_with(
        &mut self,
        l: LinkId,
        now: Instant,
        write: impl FnMut(LinkId, &[u8]) -> Result<usize, rules::Fault>,
    ) {
        self.rounds.write_with(l, now, write);
    }

    /// Read link `l` with `read` (it fills the buffer it is given and says how many bytes
    /// came, 0 when none, and whether more may be waiting) and handle every complete reply,
    /// until `read` says the socket is drained. Returns whether the link asks to be written
    /// (requests behind a confirmed AUTH, an `EVAL` retry).
    #[inline]
    pub fn read_with(
        &mut self,
        l: LinkId,
        now: Instant,
        read: impl FnMut(&mut [u8]) -> Result<(usize, bool), rules::Fault>,
    ) -> bool {
        self.rounds.read_with(l, now, read)
    }

    /// The client was away from the loop for `idle` until `now` (see `Rounds::shift_clocks`).
    pub fn shift_clocks(&mut self, idle: Duration, now: Instant) {
        self.rounds.shift_clocks(idle, now);
    }

    /// No round is undecided (cleanup releases included).
    pub fn is_idle(&self) -> bool {
        self.rounds.is_idle()
    }

    /// Releases wait to be sent (to a master that fell behind, or behind bytes its
    /// connection has not taken): the loop keeps running for them.
    pub fn releases_unsent(&self) -> bool {
        self.rounds.releases_unsent()
    }

    /// Some master is still owed a release: a client that shuts down delivers them first.
    pub fn owes_releases(&self) -> bool {
        self.rounds.owes_releases()
    }

    /// Some channel is held or lingers: the sub links want the loop run.
    pub fn listening(&self) -> bool {
        self.rounds.listening()
    }

    /// What every master did so far, by name (the driver adds its syscall counts).
    pub fn stats(&self) -> Vec<crate::stats::MasterStats> {
        self.rounds.stats()
    }

    /// Watch held `lock` for a loss (see `watch.rs`): every master tracks its keys and
    /// pushes an invalidation when they change; once fewer than a quorum may still hold
    /// it, [`Core::take_lost`] names it. The reads that arm the tracking go out with the
    /// next write. Watching a watched lock again returns its id.
    pub fn watch_lock(&mut self, lock: &Lock, now: Instant) -> WatchId {
        if let Some(w) = self.rounds.watches.find_token(&lock.token) {
            return w;
        }
        let n = self.rounds.n();
        let w = self.rounds.watches.add(&lock.keys, lock.token, n);
        for i in 0..n {
            self.rounds.arm(i, w, now);
        }
        w
    }

    /// Stop watching (a lock released, a guard dropped). Releasing a lock stops its watch
    /// too.
    pub fn unwatch_lock(&mut self, w: WatchId) {
        self.rounds.watches.remove(w);
    }

    /// Some lock is watched: the loop must keep reading the masters' connections.
    pub fn watching_locks(&self) -> bool {
        self.rounds.watches.any()
    }

    /// Whether watched lock `w` was found lost.
    pub fn is_watch_lost(&self, w: WatchId) -> bool {
        self.rounds.watches.get(w).is_some_and(|x| x.lost)
    }

    /// The next watched lock found lost since the last call (each is reported once).
    pub fn take_lost(&mut self) -> Option<WatchId> {
        self.rounds.watches.take_lost()
    }

    /// Why watched lock `w` is lost (`None` while it may be held, or for an id no longer
    /// watched): `Error::NotHeld` whose report says, per master, what the watch knows.
    pub fn watch_lost(&self, w: WatchId) -> Option<Error> {
        let watch = self.rounds.watches.get(w).filter(|x| x.lost)?;
        let nodes = self
            .rounds
            .masters
            .iter()
            .zip(watch.votes.iter())
            .map(|(m, v)| (m.name.clone(), v.outcome()))
            .collect();
        Some(Error::NotHeld(Box::new(Report {
            op: Operation::Watch,
            nodes,
            quorum: self.rounds.quorum(),
            elapsed: Duration::ZERO,
            attempts: 0,
            total: Duration::ZERO,
        })))
    }

    /// Start the timed retries that are due (with fairness, polite ones: see
    /// `Builder::fairness`).
    fn wake_sleepers(&mut self, now: Instant) {
        let mut due: SmallVec<[TaskId; 8]> = SmallVec::new();
        let mut k = 0;
        while k < self.sleeping.len() {
            let slot = self.sleeping[k];
            let t = &self.tasks[slot as usize];
            if now >= t.wake {
                due.push(TaskId { slot, gen: t.gen });
                self.sleeping.swap_remove(k);
            } else {
                k += 1;
            }
        }
        for id in due {
            // Woken meanwhile by another's step (a notice, a head that left).
            let t = &self.tasks[id.slot as usize];
            if t.gen != id.gen || !t.live || t.phase != Phase::Sleep {
                continue;
            }
            let polls = t.polls + 1;
            let t = &mut self.tasks[id.slot as usize];
            t.polls = polls;
            t.timed = true;
            t.woken = false;
            t.waited = true;
            t.attempt += 1;
            self.start_attempt(id, now);
        }
        self.next_wake = self
            .sleeping
            .iter()
            .map(|&s| self.tasks[s as usize].wake)
            .min();
    }

    fn sleep(&mut self, id: TaskId, wake: Instant) {
        self.tasks[id.slot as usize].wake = wake;
        self.sleeping.push(id.slot);
        self.next_wake = Some(self.next_wake.map_or(wake, |n| n.min(wake)));
    }

    /// Record a task's result.
    fn finish(&mut self, id: TaskId, result: Result<Done, Error>, now: Instant) {
        let granted = matches!(result, Ok(Done::Locked(_)));
        self.finishing(id, granted, now);
        let t = &mut self.tasks[id.slot as usize];
        match result {
            // A result is as large as a lock (272 bytes): a release's is a flag (see
            // `Task::released`).
            Ok(Done::Released) => t.released = true,
            r => t.result = Some(r),
        }
        self.finished_task(id);
    }

    /// A task ends (`granted`: with the lock): it stops waiting, and leaves its key's line
    /// unless it got the lock. Its result is stored next, then [`Core::finished_task`].
    fn finishing(&mut self, id: TaskId, granted: bool, now: Instant) {
        if !self.tasks[id.slot as usize].chans.is_empty() {
            self.unwatch(id, granted, now);
        }
        if !granted {
            self.leave_line(id, now);
        }
    }

    /// A task's result is stored: it is done.
    fn finished_task(&mut self, id: TaskId) {
        let t = &mut self.tasks[id.slot as usize];
        #[cfg(feature = "tracing")]
        match &t.result {
            Some(Ok(done)) => {
                tracing::debug!(parent: &t.span, attempts = t.attempt, ?done, "done")
            }
            Some(Err(error)) => {
                tracing::debug!(parent: &t.span, attempts = t.attempt, %error, "failed")
            }
            None if t.released => {
                let done = Done::Released;
                tracing::debug!(parent: &t.span, attempts = t.attempt, ?done, "done")
            }
            None => {}
        }
        t.phase = Phase::Done;
        if self.track_finished {
            self.finished.push(id);
        }
    }

    /// A report of round `op` (which started at `started`; the task at `began`).
    fn report(
        &self,
        what: Operation,
        op: OpId,
        started: Instant,
        began: Instant,
        attempts: u32,
    ) -> Box<Report> {
        let o = self.rounds.op(op);
        Box::new(Report::new(
            what,
            self.rounds.masters.iter().map(|n| n.name.clone()),
            &o.tally,
            o.decided_at.saturating_duration_since(started),
            attempts,
            o.decided_at.saturating_duration_since(began),
        ))
    }

    /// A fresh random token.
    fn next_token(&mut self) -> io::Result<Token> {
        self.tokens.next()
    }
}

#[cfg(test)]
mod memo_tests {
    use super::*;

    /// The TTL check and the drift allowance are remembered for the last TTL: whatever
    /// the order of TTLs asked, each answer is what the uncached rule gives.
    #[test]
    fn remembered_ttl_checks_and_drifts_follow_the_ttl_asked() {
        let now = Instant::now();
        let master = Master::new(std::sync::Arc::from("127.0.0.1:1"), None, None, 0);
        let rounds = Rounds::new(vec![master], NetConfig::default(), now);
        let settings = Settings::for_tests();
        let tokens = TokenSource::new().unwrap();
        let core = Core::new(rounds, settings.clone(), tokens, Some(1), now, 0).unwrap();
        let ms = Duration::from_millis;
        for ttl in [
            ms(10_000),
            ms(10_000),
            ms(1_000),
            ms(10_000),
            ms(250),
            Duration::from_micros(250_700),
            ms(250),
            ms(7),
            Duration::ZERO,
        ] {
            assert_eq!(
                core.drift(ttl),
                rules::drift(ttl, settings.drift_factor),
                "{ttl:?}"
            );
            assert_eq!(
                core.check_ttl(ttl).ok(),
                settings.check_ttl(ttl).ok(),
                "{ttl:?}"
            );
        }
    }
}
