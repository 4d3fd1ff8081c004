//! Every step of a lock operation, as a state machine over fan-out rounds.
//!
//! A lock task runs attempts: the acquire round; with fencing, once the lock is held, the
//! draw round and the write-back round; then either the lock, or the cleanup release
//! (wherever the acquire may have set a key) and, while retries and the deadline allow, a
//! random delay before the next attempt. A release or extend task is one round.

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{Core, Phase, TaskId};
use crate::core::{fingerprint, ChanId, Fingerprint, KeyList, Line, OpId};
use crate::error::{Error, Operation, Report};
use crate::lock::Lock;
use crate::rules::{self, AcquireVerdict, Decision, Outcome, Request};
use crate::scripts::{CLIENT_ID_LEN, WAITER_ID_LEN};
use crate::token::Token;

/// What a finished task produced. (Moved out at once; boxing the lock would cost an
/// allocation per lock.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Done {
    /// A lock task: the lock.
    Locked(Lock),
    /// A release task: a quorum confirmed.
    Released,
    /// An extend task: the lock's new deadline and TTL.
    Extended { valid_until: Instant, ttl: Duration },
    /// An inspect task: what every master holds for the resource.
    Inspected(crate::inspect::Inspection),
    /// A forced release: what every master deleted.
    ForceReleased(crate::inspect::ForcedRelease),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Lock,
    Release,
    Extend,
    /// An operator's look at a resource (`core::admin`).
    Inspect,
    /// An operator's forced release (`core::admin`).
    ForceRelease,
}

/// How many of a wait's own cleanup announcements a task recognises (see `Task::own`).
pub(super) const OWN_KEPT: usize = 8;

pub(super) struct Task {
    pub gen: u32,
    pub live: bool,
    pub(super) kind: Kind,
    pub phase: Phase,
    pub keys: KeyList,
    pub token: Token,
    ttl: Duration,
    pub deadline: Option<Instant>,
    /// Attempts allowed after the first.
    pub retries: u32,
    /// The attempt running (from 1).
    pub attempt: u32,
    /// When the current attempt's acquire round (or the task's one round) started.
    pub(super) t1: Instant,
    /// When the task was submitted (its first attempt).
    pub(super) began: Instant,
    /// Extend: the lock's deadline before this extend.
    pub valid_until: Instant,
    acquire_op: Option<OpId>,
    /// The round the task waits for.
    pub(super) op: Option<OpId>,
    fence: Option<u64>,
    pub wake: Instant,
    cancelled: bool,
    /// The previous attempt's report (for a deadline that cut the last round short).
    last: Option<Box<Report>>,
    pub result: Option<Result<Done, Error>>,
    /// The result is `Ok(Done::Released)`, kept as this flag (`result` stays `None`): a
    /// result is as large as a lock, and a release's is then neither written nor dropped.
    pub released: bool,
    /// The operation's span (`tracing` feature).
    #[cfg(feature = "tracing")]
    pub span: tracing::Span,
    /// Arrival order among the client's lock tasks (fairness).
    pub seq: u64,
    /// Arrival on the client's clock (µs since the epoch): the task's place in the lines
    /// of waiters on the masters.
    pub score: u64,
    /// The task's id in those lines: the client's id, then its first token's first 8
    /// bytes.
    pub wait_id: Option<Fingerprint>,
    /// While it stands in line: the client's own channel, held.
    pub direct: Option<ChanId>,
    /// While it waits (notify mode): the channels of its keys.
    pub chans: SmallVec<[ChanId; 2]>,
    /// The announced release that started the running attempt (its copies from the other
    /// masters are no news).
    pub woken_by: Option<Fingerprint>,
    /// The releases our own cleanups announced during this wait, the last [`OWN_KEPT`]
    /// (no news to us either). Not the last one only: a cleanup's announcement may come
    /// after the next attempt's cleanup (the next attempt was started right behind it), and
    /// taken for news it started another attempt at once, whose cleanup fed the one after:
    /// a spin outside `retry_count` (issue 19, item 2). Attempts come at least a round
    /// apart, so an announcement would have to lag `OWN_KEPT` attempts to be mistaken.
    pub own: SmallVec<[Fingerprint; OWN_KEPT]>,
    /// Releases announced while the attempt ran (master, or `u32::MAX` for this client's
    /// own; fingerprint; whether it named this task, or nobody, as next): if the attempt is
    /// refused and one of them frees enough, try again at once.
    pub heard: SmallVec<[(u32, Fingerprint, bool); 4]>,
    /// Masters (bit i) that confirmed a subscription of the task's while the attempt ran
    /// (a subscription connection that came back): weighed against the attempt's answers
    /// as a confirmation heard while sleeping would be (`Core::on_subscribed`).
    pub confirmed: u64,
    /// The running attempt stands out of line (the one before could not reach a quorum).
    pub out: bool,
    /// Who held the key on each master in the last attempt (one-key locks), where known:
    /// that holder's announcement from that master is news.
    pub holders: SmallVec<[Option<Fingerprint>; 8]>,
    /// Masters (bit i) that said "taken" in the last attempt.
    pub taken: u64,
    /// Of those, the masters whose holder has not been announced gone since.
    pub blocked: u64,
    /// Of those, the masters that had not answered when the last attempt was decided (who
    /// holds the key there is not known).
    pub unknown: u64,
    /// Masters (bit i) that failed the last attempt or timed out: no announcement frees
    /// them (they count against a quorum until the next attempt).
    pub failed: u64,
    /// Timed retries used (`retries` bounds them; attempts on a notice come on top).
    pub polls: u32,
    /// When the next timed retry is due.
    pub next_poll: Instant,
    /// The running attempt is a timed one (or the first).
    pub timed: bool,
    /// Attempts refused because the lock was taken (a quorum was not reached and some
    /// master said "taken").
    pub refusals: u32,
    /// The running attempt was started by the announcement of a release (the holder's,
    /// or one made by this client), not by a timer.
    pub woken: bool,
    /// Some field of the waiting state (`chans` to `woken` above, but `next_poll`) may
    /// differ from what [`Task::begin`] sets: set wherever one is written (a task that
    /// never waited, nearly every one, has nothing of it to reset).
    pub waited: bool,
}

impl Kind {
    /// An operator's task (one round over every master, `core::admin`).
    pub(super) fn is_admin(self) -> bool {
        matches!(self, Kind::Inspect | Kind::ForceRelease)
    }
}

impl Task {
    pub(super) fn new(now: Instant) -> Task {
        Task {
            gen: 0,
            live: false,
            kind: Kind::Lock,
            phase: Phase::Done,
            keys: KeyList::default(),
            token: Token::ZERO,
            ttl: Duration::ZERO,
            deadline: None,
            retries: 0,
            attempt: 1,
            t1: now,
            began: now,
            valid_until: now,
            acquire_op: None,
            op: None,
            fence: None,
            wake: now,
            cancelled: false,
            last: None,
            result: None,
            released: false,
            #[cfg(feature = "tracing")]
            span: tracing::Span::none(),
            seq: 0,
            score: 0,
            wait_id: None,
            direct: None,
            chans: SmallVec::new(),
            woken_by: None,
            own: SmallVec::new(),
            heard: SmallVec::new(),
            confirmed: 0,
            out: false,
            holders: SmallVec::new(),
            taken: 0,
            blocked: 0,
            unknown: 0,
            failed: 0,
            polls: 0,
            next_poll: now,
            timed: true,
            refusals: 0,
            woken: false,
            waited: false,
        }
    }

    /// Reset for a new task of `kind` (the slot is reused), submitted at `now`.
    #[inline]
    pub(super) fn begin(&mut self, kind: Kind, ttl: Duration, now: Instant) {
        self.live = true;
        self.began = now;
        self.kind = kind;
        self.ttl = ttl;
        self.deadline = None;
        self.retries = 0;
        self.attempt = 1;
        self.acquire_op = None;
        self.op = None;
        self.fence = None;
        self.cancelled = false;
        self.last = None;
        self.result = None;
        self.released = false;
        self.next_poll = now;
        if self.waited {
            self.reset_waiting();
        }
        debug_assert!(
            self.waiting_state_is_reset(),
            "a waiting field written unflagged"
        );
    }

    /// [`Task::begin`]'s reset of the waiting state, for a task that waited.
    #[cold]
    #[inline(never)]
    fn reset_waiting(&mut self) {
        self.waited = false;
        self.chans.clear();
        self.wait_id = None;
        self.direct = None;
        self.woken_by = None;
        self.own.clear();
        self.heard.clear();
        self.confirmed = 0;
        self.out = false;
        self.holders.clear();
        self.taken = 0;
        self.blocked = 0;
        self.unknown = 0;
        self.failed = 0;
        self.polls = 0;
        self.timed = true;
        self.refusals = 0;
        self.woken = false;
    }

    /// The waiting state is as [`Task::begin`] leaves it (see [`Task::waited`]).
    fn waiting_state_is_reset(&self) -> bool {
        self.chans.is_empty()
            && self.wait_id.is_none()
            && self.direct.is_none()
            && self.woken_by.is_none()
            && self.own.is_empty()
            && self.heard.is_empty()
            && self.confirmed == 0
            && !self.out
            && self.holders.is_empty()
            && (self.taken | self.blocked | self.unknown | self.failed) == 0
            && self.polls == 0
            && self.timed
            && self.refusals == 0
            && !self.woken
    }

    /// The task's result is in (see [`Task::released`]).
    #[inline]
    pub(super) fn has_result(&self) -> bool {
        self.released || self.result.is_some()
    }

    /// A lock task that may wait (retries or a deadline): its acquire learns the holder's
    /// remaining TTL, and it takes part in the wait lists.
    pub(super) fn waits(&self) -> bool {
        self.kind == Kind::Lock && (self.retries > 0 || self.deadline.is_some())
    }
}

impl Core {
    /// The round timeout for `ttl`, cut short by the deadline.
    fn timeout(&self, ttl: Duration, deadline: Option<Instant>, now: Instant) -> Duration {
        let t = self.round_timeout(ttl);
        match deadline {
            Some(d) => t.min(d.saturating_duration_since(now)),
            None => t,
        }
    }

    /// Start an attempt of lock task `id`: its acquire round.
    pub(super) fn start_attempt(&mut self, id: TaskId, now: Instant) {
        let t = &mut self.tasks[id.slot as usize];
        if t.deadline.is_some_and(|d| now >= d) {
            // Woken late, past the deadline (a loaded machine): no attempt starts; the
            // report's total still covers the whole wait.
            let began = t.began;
            let last = t.last.take().map(|mut r| {
                r.total = now.saturating_duration_since(began);
                r
            });
            self.finish(id, Err(Error::DeadlineExceeded(last)), now);
            return;
        }
        let token = match self.next_token() {
            Ok(tok) => tok,
            Err(e) => {
                self.finish(id, Err(e.into()), now);
                return;
            }
        };
        let t = &self.tasks[id.slot as usize];
        let timeout = self.timeout(t.ttl, t.deadline, now);
        let req = if t.waits() {
            Request::AcquireWait
        } else if t.keys.len() == 1 {
            Request::Acquire
        } else {
            Request::AcquireMany
        };
        let ttl_ms = t.ttl.as_millis() as u64;
        // A waiting one-key task stands in the key's line on the masters while refused
        // (notify mode): releases name the first live waiter, which alone tries on them.
        //
        // Unless its last attempt could not reach a quorum for lack of masters (too many
        // failed it, timed out or refused its vote: not "taken"): then it stands out of
        // line (issue 19, item 1). The line's promise that it cannot deadlock (the first
        // live waiter is first wherever it stands, so politeness never refuses it) assumes
        // that the first waiter can reach a quorum; one that cannot, first in line on the
        // masters it reaches, would keep its place there with every attempt and hold a
        // free lock back from every waiter behind it (with fairness) and from the
        // announcements (which name it) for as long as it waits. So such an attempt
        // leaves the line and takes no place in it (a polite one yields to every live
        // waiter in line), and the next attempt that reaches enough masters takes its
        // place again, at its arrival score.
        let n = self.rounds.n();
        let cut_off = (t.failed.count_ones() as usize) > n - self.rounds.quorum();
        let line = (req == Request::AcquireWait && t.keys.len() == 1 && self.notify()).then(|| {
            let alive = self.cfg.retry_delay
                + self.cfg.retry_jitter
                + 2 * self.round_timeout(t.ttl)
                + Duration::from_millis(100);
            Line {
                id: t.wait_id.unwrap_or_else(|| {
                    let mut id = [0u8; WAITER_ID_LEN];
                    id[..CLIENT_ID_LEN].copy_from_slice(&self.client_id);
                    id[CLIENT_ID_LEN..]
                        .copy_from_slice(&token.as_bytes()[..WAITER_ID_LEN - CLIENT_ID_LEN]);
                    id
                }),
                alive_ms: alive.as_millis() as u64,
                score: t.score,
                polite: self.cfg.fairness,
                out: cut_off,
                expect: self.expect(id),
            }
        });
        let keys = &self.tasks[id.slot as usize].keys;
        let op = self.rounds.start(
            req,
            |a| {
                a.set_list(keys, token, ttl_ms);
                a.line = line;
            },
            timeout,
            now,
            |_| true,
            Some(id.owner()),
        );
        let t = &mut self.tasks[id.slot as usize];
        if let Some(line) = line {
            t.wait_id = Some(line.id);
            t.waited = true;
        }
        t.out = line.is_some_and(|l| l.out);
        t.token = token;
        t.t1 = now;
        t.acquire_op = Some(op);
        t.op = Some(op);
        t.fence = None;
        t.heard.clear();
        t.confirmed = 0;
        t.phase = Phase::Acquire;
    }

    /// Start the one round of a release or extend task (an extend of a lock whose validity
    /// ran out fails at once).
    pub(super) fn start_round_on_lock(&mut self, id: TaskId, keys: &KeyList, now: Instant) {
        let t = &self.tasks[id.slot as usize];
        let req = match t.kind {
            Kind::Extend if now >= t.valid_until => {
                self.finish(id, Err(Error::Expired), now);
                return;
            }
            Kind::Extend => Request::Extend,
            _ => Request::Release,
        };
        let timeout = self.round_timeout(t.ttl);
        let (token, ttl_ms) = (t.token, t.ttl.as_millis() as u64);
        let leave = if req == Request::Release {
            t.wait_id
        } else {
            None
        };
        let waiters_here = req == Request::Release && self.listens_on(keys);
        let op = self.rounds.start(
            req,
            |a| {
                a.set_list(keys, token, ttl_ms);
                a.leave = leave;
                a.of_lock = true;
                a.waiters_here = waiters_here;
            },
            timeout,
            now,
            |_| true,
            Some(id.owner()),
        );
        let t = &mut self.tasks[id.slot as usize];
        t.t1 = now;
        t.op = Some(op);
        t.phase = Phase::OnLock;
        if req == Request::Release {
            let token = t.token;
            self.released_here(keys, token.as_bytes(), None, None, now);
        }
    }

    /// Round `op` of task `id` was decided.
    pub(super) fn on_decided(&mut self, id: TaskId, op: OpId, now: Instant) {
        let Some(t) = self.task(id) else { return };
        if t.op != Some(op) {
            return;
        }
        let (phase, ttl, t1, cancelled) = (t.phase, t.ttl, t.t1, t.cancelled);
        let o = self.rounds.op(op);
        let decided_at = o.decided_at;
        #[cfg(feature = "tracing")]
        {
            let span = &self.tasks[id.slot as usize].span;
            for (i, outcome) in o.tally.outcomes().iter().enumerate() {
                tracing::trace!(
                    parent: span,
                    master = &*self.rounds.masters[i].name,
                    request = ?o.req,
                    %outcome,
                    "answer"
                );
            }
        }
        match phase {
            Phase::Acquire => {
                let elapsed = decided_at.saturating_duration_since(t1);
                let verdict = rules::judge_acquire_drifted(
                    &o.tally,
                    ttl,
                    elapsed,
                    self.drift(ttl),
                    self.cfg.min_validity,
                );
                let fenced = self.cfg.fencing && !cancelled;
                if fenced && matches!(verdict, AcquireVerdict::Acquired(_)) {
                    self.start_fence_round(id, Request::FenceDraw, now);
                } else {
                    self.conclude_timed(id, verdict, op, decided_at, Some(elapsed), now);
                }
            }
            Phase::Draw | Phase::WriteBack => {
                if o.tally.decision() != Decision::Reached {
                    self.conclude(id, AcquireVerdict::NoQuorum, op, decided_at, now);
                    return;
                }
                if phase == Phase::Draw {
                    // The largest answer so far: at least every answer of the deciding quorum.
                    let fence = o.max_value.max(1) as u64;
                    self.tasks[id.slot as usize].fence = Some(fence);
                    self.rounds.finish(op);
                    self.start_fence_round(id, Request::FenceWriteBack, now);
                    return;
                }
                self.rounds.finish(op);
                // Validity counts all three rounds.
                let verdict = match rules::validity_drifted(
                    ttl,
                    decided_at.saturating_duration_since(t1),
                    self.drift(ttl),
                ) {
                    Some(v) if v > self.cfg.min_validity => AcquireVerdict::Acquired(v),
                    _ => AcquireVerdict::ValidityUsedUp,
                };
                let acquire = self.tasks[id.slot as usize].acquire_op.unwrap_or(op);
                self.conclude(id, verdict, acquire, decided_at, now);
            }
            Phase::OnLock => self.conclude_on_lock(id, op, now),
            Phase::Sleep | Phase::Done => {}
        }
    }

    /// Fencing, once the lock is held: the draw (1 + the largest counter of any of the
    /// lock's resources, over a quorum, while each master still holds our key), then the
    /// write-back (every counter of the lock raised to at least the token on a quorum,
    /// still only while our key is held). A later holder's draw meets that quorum, after
    /// this lock ended, so its token is larger.
    fn start_fence_round(&mut self, id: TaskId, req: Request, now: Instant) {
        let t = &self.tasks[id.slot as usize];
        // The counters are named where the request is encoded (`encode`, `scripts::FENCE`).
        let timeout = self.timeout(t.ttl, t.deadline, now);
        let (token, ttl_ms, value) = (t.token, t.ttl.as_millis() as u64, t.fence.unwrap_or(0));
        let op = self.rounds.start(
            req,
            |a| {
                a.set_list(&t.keys, token, ttl_ms);
                a.value = value;
            },
            timeout,
            now,
            |_| true,
            Some(id.owner()),
        );
        let t = &mut self.tasks[id.slot as usize];
        t.op = Some(op);
        t.phase = if req == Request::FenceDraw {
            Phase::Draw
        } else {
            Phase::WriteBack
        };
    }

    /// An attempt is over: the lock, or the cleanup release and then an error or the next
    /// attempt. `failed` is the round to report on a failure.
    fn conclude(
        &mut self,
        id: TaskId,
        verdict: AcquireVerdict,
        failed: OpId,
        decided_at: Instant,
        now: Instant,
    ) {
        self.conclude_timed(id, verdict, failed, decided_at, None, now);
    }

    /// [`Core::conclude`], given `decided_at - t1` where it is known (`elapsed`).
    fn conclude_timed(
        &mut self,
        id: TaskId,
        verdict: AcquireVerdict,
        failed: OpId,
        decided_at: Instant,
        elapsed: Option<Duration>,
        now: Instant,
    ) {
        let t = &mut self.tasks[id.slot as usize];
        let acquire = t.acquire_op.take().unwrap_or(failed);
        t.op = None;
        if let (false, AcquireVerdict::Acquired(v)) = (t.cancelled, verdict) {
            self.rounds.finish(acquire);
            self.finishing(id, true, now);
            let t = &mut self.tasks[id.slot as usize];
            // The task is done with its keys (nothing reads a finished task's): they move
            // into the lock, not copied.
            let keys = std::mem::take(&mut t.keys);
            // The first attempt began the task: the wait is the attempt's time.
            let waited = match elapsed {
                Some(e) if t.began == t.t1 => e,
                _ => decided_at.saturating_duration_since(t.began),
            };
            // Built where it is kept (a lock is 272 bytes: each move is a copy).
            t.result = Some(Ok(Done::Locked(Lock {
                keys,
                token: t.token,
                ttl: t.ttl,
                acquired_at: t.t1,
                valid_until: decided_at + v,
                fence: if self.cfg.fencing { t.fence } else { None },
                attempts: t.attempt,
                waited,
                refusals: t.refusals,
                woken: t.woken,
                line: t.wait_id,
                dropped: None,
                #[cfg(feature = "tracing")]
                span: t.span.clone(),
            })));
            #[cfg(feature = "tracing")]
            t.span.record(
                "waited_us",
                decided_at.saturating_duration_since(t.began).as_micros() as u64,
            );
            self.finished_task(id);
            return;
        }
        // The attempt failed: what follows (the wait hint, announcements heard, the
        // sleep, the cleanup's own announcement) is waiting state.
        t.waited = true;
        if verdict == AcquireVerdict::Taken {
            t.refusals += 1;
        }
        let (t1, began, attempt) = (t.t1, t.began, t.attempt);
        let report = self.report(Operation::Acquire, failed, t1, began, attempt);
        if failed != acquire {
            self.rounds.finish(failed);
        }
        // What the round says about waiting (who said taken and who holds it there, when
        // the holder's keys expire), read before the cleanup finishes the round.
        let hint = self.wait_hint(acquire);
        let wake = match self.next_attempt(id, verdict, report, &hint, now) {
            Ok(wake) => wake,
            Err(e) => {
                // The last cleanup: it takes the task out of its key's line.
                self.cleanup(id, acquire, true, now);
                self.finish(id, Err(e), now);
                return;
            }
        };
        self.cleanup(id, acquire, false, now);
        let t = &mut self.tasks[id.slot as usize];
        t.taken = hint.taken;
        // A master that had not answered when the round was decided (it was decided by
        // the others' refusals) is not known free: it blocks until a release there is
        // announced, like one that said taken. Counted free, a sibling's cleanup freeing
        // one more master looked like room for a quorum, and two callers of one client
        // still woke each other while the lock was held elsewhere (issue 19, item 4).
        t.blocked = hint.taken | hint.unknown;
        t.unknown = hint.unknown;
        t.failed = hint.failed;
        t.holders = hint.holders;
        if self.notify() {
            self.watch(id, now);
            if self.eligible(id) {
                // A release announced while the attempt ran that frees a master where it
                // was refused, or a subscription confirmed since it was sent (a release
                // before that may have gone unheard): try again now.
                let mut heard = std::mem::take(&mut self.tasks[id.slot as usize].heard);
                let mut news = None;
                for (m, fp, turn) in heard.drain(..) {
                    // A master's announcement is the task's turn now that it may try
                    // (whatever its standing when it arrived: a fair task whose first
                    // attempt ran was in no wait list yet, so not first in one; heard as
                    // not its turn, the announcement still freed its masters, and the turn
                    // that came after found nothing left to free: a lost wake-up, found by
                    // the simulation, live_hot_fair_without_faults seed 148). A release
                    // made here keeps its turn (it went to this client's oldest waiter).
                    let turn = turn || m != u32::MAX;
                    if self.hear(id, (m != u32::MAX).then_some(m as usize), &fp) && turn {
                        news = Some(fp);
                    }
                }
                // The cover the attempt lacked was completed while it ran: a release in
                // between may have gone unheard, try once more (a partial cover waits for
                // the confirmation that completes it: `on_subscribed`).
                let recheck = !self.covered(id, t1) && self.covered(id, now);
                self.tasks[id.slot as usize].heard = heard;
                // Masters that failed the attempt (a connection cut) and whose subscription
                // came back while it ran are back, as on a confirmation heard asleep.
                let confirmed = std::mem::take(&mut self.tasks[id.slot as usize].confirmed);
                let back = self.came_back(id, confirmed);
                // An attempt out of line that reached enough masters (refused by a holder,
                // not for lack of masters): take the place in line now, not a retry delay
                // later (once: the next attempt stands in line). Meanwhile later arrivals
                // took places ahead of it: a fair waiter whose first round timed out while
                // its connections warmed up was overtaken by them (the simulation's
                // live_hot_fair_without_faults, seed 1905).
                let t = &self.tasks[id.slot as usize];
                let n = self.rounds.n();
                let rejoin = t.out && (t.failed.count_ones() as usize) <= n - self.rounds.quorum();
                if news.is_some() || recheck || back || rejoin {
                    self.tasks[id.slot as usize].phase = Phase::Sleep;
                    self.wake_now(id, news, now);
                    return;
                }
            }
        }
        self.tasks[id.slot as usize].phase = Phase::Sleep;
        self.sleep(id, wake);
    }

    /// After a refused attempt: when the task sleeps until (its next timed attempt, at the
    /// latest the holder's expiry, never past the deadline), or why it ends.
    fn next_attempt(
        &mut self,
        id: TaskId,
        verdict: AcquireVerdict,
        report: Box<Report>,
        hint: &super::wait::Hint,
        now: Instant,
    ) -> Result<Instant, Error> {
        let t = &mut self.tasks[id.slot as usize];
        let (t1, ttl) = (t.t1, t.ttl);
        if t.cancelled {
            return Err(Error::Cancelled);
        }
        if let Some(d) = t.deadline {
            if now >= d {
                // A round whose timeout the deadline clipped reports masters as timed out
                // that may simply not have had time to answer: the previous attempt's
                // report says more (e.g. "taken", not "timed out").
                // Its attempt count and total time still cover every attempt.
                let clipped = d.saturating_duration_since(t1) < self.cfg.round_timeout(ttl);
                let r = match t.last.take() {
                    Some(mut last) if clipped => {
                        last.attempts = report.attempts;
                        last.total = report.total;
                        Some(last)
                    }
                    _ => Some(report),
                };
                return Err(Error::DeadlineExceeded(r));
            }
        }
        let err = match verdict {
            AcquireVerdict::Acquired(_) | AcquireVerdict::ValidityUsedUp => {
                Error::ValidityUsedUp(report)
            }
            AcquireVerdict::Taken => Error::Taken(report),
            AcquireVerdict::NoQuorum => Error::NoQuorum(report),
        };
        // Refusals no retry changes (a wrong password...): when they alone make a quorum
        // impossible, say so now.
        let refused = err.report().map_or(0, |r| {
            r.outcomes()
                .filter(|(_, o)| matches!(o, Outcome::Failed(f) if f.is_configuration()))
                .count()
        });
        let n = self.rounds.n();
        if refused > n - self.rounds.quorum() {
            let report = err.report().cloned().map(Box::new).expect("a report");
            return Err(Error::Refused(report));
        }
        let t = &self.tasks[id.slot as usize];
        if t.timed {
            // With a deadline, the deadline bounds the retries, not the count. The count
            // is of timed attempts: those made on a notice come on top.
            if t.polls >= t.retries && t.deadline.is_none() {
                return Err(err);
            }
        }
        // A timed attempt plans the next one a retry delay away; so does an attempt made on
        // a notice that ran past the timed one it had planned (that one would otherwise go
        // out at once, right behind it: found by the engine fuzzer, BUG engine-fuzz-1).
        if t.timed || t.next_poll <= now {
            let delay =
                rules::retry_delay(self.cfg.retry_delay, self.cfg.retry_jitter, &mut self.rng);
            self.tasks[id.slot as usize].next_poll = now + delay;
        }
        // Never sleep past the holder's expiry (plus jitter): nobody announces an expiry.
        if let Some(left) = hint.free_in {
            let at = now + left + self.expiry_jitter();
            let t = &mut self.tasks[id.slot as usize];
            t.next_poll = t.next_poll.min(at);
        }
        let t = &mut self.tasks[id.slot as usize];
        let mut wake = t.next_poll;
        if let Some(d) = t.deadline {
            // Never sleep past the deadline: the last attempt starts just before it (its
            // round is cut short at the deadline), as `flock -w` waits its whole time.
            let last = d.checked_sub(Duration::from_millis(1)).unwrap_or(d);
            if now >= last {
                let report = err.report().cloned().map(Box::new);
                return Err(Error::DeadlineExceeded(report));
            }
            wake = wake.min(last);
        }
        t.last = err.report().cloned().map(Box::new);
        Ok(wake)
    }

    /// Release wherever the acquire round `acquire` may have set the key
    /// (`rules::may_hold`); the round is finished.
    /// `last`: the task ends here; its release takes it out of its key's line.
    fn cleanup(&mut self, id: TaskId, acquire: OpId, last: bool, now: Instant) {
        let o = self.rounds.op(acquire);
        let req = o.req;
        // Our keys stood in anyone's way only where a master said yes; a cleanup that may
        // only reach masters that had not answered yet frees nothing worth a wake-up.
        let blocked_others = o.tally.yes() > 0;
        let may_hold: SmallVec<[bool; 8]> = o
            .tally
            .outcomes()
            .iter()
            .map(|x| rules::may_hold(req, *x))
            .collect();
        self.rounds.finish(acquire);
        let t = &mut self.tasks[id.slot as usize];
        // The last cleanup of a task that waited in line takes it out of line on every
        // master (it stands in line where the key was taken, not only where it may hold it).
        let leave = if last { t.wait_id.take() } else { None };
        if leave.is_none() && !may_hold.iter().any(|b| *b) {
            return;
        }
        let token = t.token;
        self.release_attempt(id, leave, |i| leave.is_some() || may_hold[i], now);
        if self.notify() {
            // The cleanup announces itself where it deletes a key: no news to this task;
            // this client's other waiters hear it master by master, where our keys may
            // have stood, and try behind it only if that frees a quorum for them (not
            // when a holder elsewhere still blocks one: issue 19, item 4).
            let t = &mut self.tasks[id.slot as usize];
            t.waited = true;
            if t.own.len() == OWN_KEPT {
                t.own.remove(0);
            }
            t.own.push(fingerprint(token.as_bytes()));
            if blocked_others {
                let stood = may_hold
                    .iter()
                    .take(64)
                    .enumerate()
                    .filter(|(_, b)| **b)
                    .fold(0u64, |s, (i, _)| s | 1 << i);
                let keys = std::mem::take(&mut t.keys);
                self.released_here(&keys, token.as_bytes(), Some(id), Some(stood), now);
                self.tasks[id.slot as usize].keys = keys;
            }
        }
    }

    /// A lock call that waited ends without the lock (cancelled, its deadline passed while
    /// it slept): take it out of its key's line on every master, so that the next release
    /// names a waiter that is still there. (Compare-and-delete: harmless where the key is
    /// not ours.) After the last cleanup there is nothing left to do here.
    pub(super) fn leave_line(&mut self, id: TaskId, now: Instant) {
        let t = &mut self.tasks[id.slot as usize];
        if t.kind != Kind::Lock {
            return;
        }
        if let Some(leave) = t.wait_id.take() {
            self.release_attempt(id, Some(leave), |_| true, now);
        }
    }

    /// Release the task's current attempt (its keys, its token) on the masters `to`
    /// selects, leaving the keys' lines with `leave`; nobody waits for the answers.
    fn release_attempt(
        &mut self,
        id: TaskId,
        leave: Option<Fingerprint>,
        to: impl Fn(usize) -> bool,
        now: Instant,
    ) {
        let t = &self.tasks[id.slot as usize];
        let timeout = self.round_timeout(t.ttl);
        let (token, ttl_ms) = (t.token, t.ttl.as_millis() as u64);
        let keys = &t.keys;
        self.rounds.start(
            Request::Release,
            |a| {
                a.set_list(keys, token, ttl_ms);
                a.leave = leave;
            },
            timeout,
            now,
            to,
            None,
        );
    }

    /// The release or extend round `op` of task `id` is decided.
    fn conclude_on_lock(&mut self, id: TaskId, op: OpId, now: Instant) {
        if self.tasks[id.slot as usize].kind.is_admin() {
            self.conclude_admin(id, op, now);
            return;
        }
        let t = &self.tasks[id.slot as usize];
        let (kind, t1, ttl, valid_until) = (t.kind, t.t1, t.ttl, t.valid_until);
        let o = self.rounds.op(op);
        if kind == Kind::Release && o.tally.decision() == Decision::Reached {
            // A release a quorum confirmed (nearly every one): `finish` with
            // `Ok(Done::Released)`, whose result is a flag (no result passed along).
            self.rounds.finish(op);
            self.tasks[id.slot as usize].op = None;
            self.finishing(id, false, now);
            self.tasks[id.slot as usize].released = true;
            self.finished_task(id);
            return;
        }
        let what = if kind == Kind::Extend {
            Operation::Extend
        } else {
            Operation::Release
        };
        // Read only where a round failed (a count over every master).
        let not_held = || o.tally.count(Outcome::NotHeld) > 0;
        let result = if kind == Kind::Release {
            if o.tally.decision() == Decision::Reached {
                Ok(Done::Released)
            } else if not_held() {
                Err(Error::NotHeld(self.report(what, op, t1, t1, 1)))
            } else {
                Err(Error::NoQuorum(self.report(what, op, t1, t1, 1)))
            }
        } else {
            match rules::judge_acquire_drifted(
                &o.tally,
                ttl,
                o.decided_at.saturating_duration_since(t1),
                self.drift(ttl),
                self.cfg.min_validity,
            ) {
                // The script never shortens a key's life, so the old deadline still holds
                // when this extend asked for less.
                AcquireVerdict::Acquired(v) => Ok(Done::Extended {
                    valid_until: valid_until.max(o.decided_at + v),
                    ttl,
                }),
                AcquireVerdict::ValidityUsedUp => {
                    Err(Error::ValidityUsedUp(self.report(what, op, t1, t1, 1)))
                }
                _ if not_held() => Err(Error::NotHeld(self.report(what, op, t1, t1, 1))),
                _ => Err(Error::NoQuorum(self.report(what, op, t1, t1, 1))),
            }
        };
        if kind == Kind::Extend {
            // Keys a master lost go back once the quorum is there; the watch of a watched
            // lock reads its keys again after the extension (which ended their tracking).
            self.rounds.restore_if_reached(op);
            let token = self.tasks[id.slot as usize].token;
            self.rounds.rearm(&token, now);
        }
        self.rounds.finish(op);
        self.tasks[id.slot as usize].op = None;
        self.finish(id, result, now);
    }

    /// Cancel lock task `id`: an acquire round in flight is abandoned (its partial lock
    /// released), a sleep ends; a fencing round runs to its end and a lock it would grant
    /// is released instead. The task ends with [`Error::Cancelled`]. Release and extend
    /// tasks are not cancelled.
    pub fn cancel(&mut self, id: TaskId, now: Instant) {
        let Some(t) = self.task(id) else { return };
        if t.kind != Kind::Lock {
            return;
        }
        t.cancelled = true;
        match (t.phase, t.op) {
            (Phase::Acquire, Some(op)) => {
                let decided_at = self.rounds.op(op).decided_at;
                self.conclude(id, AcquireVerdict::NoQuorum, op, decided_at, now);
            }
            (Phase::Sleep, _) => {
                self.sleeping.retain(|s| *s != id.slot);
                self.finish(id, Err(Error::Cancelled), now);
            }
            _ => {}
        }
    }
}
