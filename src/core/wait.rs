//! How lock tasks wait while the lock is held elsewhere (hot resources).
//!
//! * **Sized by the holder**: a waiting task's acquire (`Request::AcquireWait`) answers,
//!   where the key is taken, the holder's remaining TTL and (one key) who holds it; the task
//!   never sleeps past the moment a quorum of the holder's keys expires ([`rules::free_in`])
//!   plus jitter.
//! * **In line** ([`WaitMode::Notify`], one key): the acquire also puts a refused task in
//!   the key's line on each master (`scripts::QUEUE_PREFIX`; its id is the client's id and
//!   its first token's start, its place its arrival on the client's clock). A release names
//!   the first live waiter in line and announces itself on that waiter's client's channel
//!   (`Notice::Turn`): only the named task tries. With nobody in line the release is
//!   announced on the key's channel to every waiter (`Notice::Released`).
//! * **What an announcement frees** ([`Core::hear`]): where the last attempt found the
//!   key held, that holder's release frees that master (the copies of an older release are
//!   ignored; those of the release that woke the task still count from the masters it had
//!   not reached yet: where its attempt found that holder, or, for several keys, found them
//!   taken); any other release but our own cleanup's frees its master too (the
//!   holder changed). The task whose turn it is tries once the masters still blocked leave
//!   room for a quorum, on the announcement that freed one of them (one that frees nothing
//!   starts nothing; the task's own cleanups' announcements are never news; masters that
//!   failed its last attempt or timed out stay in the way: no announcement frees them, the
//!   timed retry tries them again). An announcement that arrives while an attempt runs is
//!   kept, and weighed against that attempt's answers. A release made by this very client
//!   (a guard dropped, another task's release or cleanup) starts its waiters' attempts
//!   right behind it, in the same write.
//! * **Never unheard for long**: a task is *covered* when some master that said "taken" in
//!   its last attempt had confirmed the subscriptions (the key's, and the client's own if it
//!   stands in line) before that attempt was sent. An uncovered task tries once more when
//!   a confirmation completes its cover (its first subscriptions, or a subscription
//!   connection that came back): a release before that may have gone unheard; one
//!   attempt, not one per channel confirmed. A confirmation from a master the last
//!   attempt could not reach (or had no answer from) makes room again, and one that
//!   arrives while an attempt runs is weighed against that attempt's answers, as an
//!   announcement is. Everything else falls to the timed retry.
//! * **Fairness** (opt-in): attempts are polite (the script does not give a free key to a
//!   waiter while a live one stands ahead of it in line), so grants follow arrival across
//!   clients; within the client, an announcement that names nobody wakes the oldest waiter
//!   only, and a head that leaves without the lock wakes the next.
//!
//! Nothing here grants anything: every attempt is an ordinary quorum round.

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{Core, TaskId};
use crate::core::{fingerprint, ChanId, Fingerprint, KeyList, Notice, OpId};
use crate::rules::{self, Outcome, Request};

use super::Phase;

/// How a lock call (`lock`, `lock_with_deadline`, `lock_many`) waits between attempts while
/// the lock is held elsewhere (see [`Builder::wait_mode`](crate::Builder::wait_mode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WaitMode {
    /// Try again as soon as a release of the resource is announced to this waiter (the
    /// release script names the first waiter in the resource's line on each master), and
    /// at the latest after the retry delay or when the holder's keys expire. The default.
    #[default]
    Notify,
    /// Try again after the retry delay only (or when the holder's keys expire): the
    /// classic Redlock client. No subscription connections, no line.
    Poll,
}

/// What a waiter's attempt expects to find on the masters (`scripts::ACQUIRE_WAIT`'s
/// `ARGV[7]`): the script runs the fewest commands on the path expected, and does and
/// answers the same whatever the guess. A wrong guess costs the master one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// A first attempt on a key this client has not waited on lately: as likely free as
    /// not (an uncontended `lock()`), `EXISTS` of the line and `SET NX` first.
    Free,
    /// A first attempt on a key this client waited on lately (its channel is still held or
    /// lingers): a hot key, likely held, read first (a refusal then needs no `EXISTS` of
    /// the line and no failing `SET NX`).
    Held,
    /// A later attempt: the waiter stands in the key's line (it was refused before), which
    /// `ZRANK` of its own place says at once (no `EXISTS`, no `ZADD NX`), and its
    /// liveness key, alive, only needs a `PEXPIRE`.
    InLine,
}

/// What a refused acquire round tells its task about waiting.
pub(super) struct Hint {
    /// When a quorum of the holder's keys expires, at the earliest (from `AcquireWait`).
    pub free_in: Option<Duration>,
    /// Masters (bit i) that said "taken".
    pub taken: u64,
    /// Masters (bit i) that failed the round (down, refused the connection or the vote,
    /// an error) or timed out: no announcement frees them.
    pub failed: u64,
    /// Masters (bit i) that had not answered when the round was decided: not known free.
    pub unknown: u64,
    /// Who held the key on each master that said so (one-key locks).
    pub holders: SmallVec<[Option<Fingerprint>; 8]>,
}

impl Core {
    /// What task `id`'s next attempt expects to find (see [`Expect`]).
    pub(super) fn expect(&self, id: TaskId) -> Expect {
        let t = &self.tasks[id.slot as usize];
        if t.wait_id.is_some() {
            Expect::InLine
        } else if t.keys.iter().any(|k| self.rounds.channel(k).is_some()) {
            Expect::Held
        } else {
            Expect::Free
        }
    }

    /// Whether waiting tasks listen for releases.
    #[inline]
    pub(super) fn notify(&self) -> bool {
        self.cfg.wait_mode == WaitMode::Notify
    }

    /// What acquire round `op` tells a waiter (read before the round is finished).
    pub(super) fn wait_hint(&self, op: OpId) -> Hint {
        let o = self.rounds.op(op);
        let mut taken = 0u64;
        let mut failed = 0u64;
        let mut unknown = 0u64;
        for (i, x) in o.tally.outcomes().iter().enumerate().take(64) {
            match x {
                Outcome::Taken => taken |= 1 << i,
                Outcome::Failed(_) | Outcome::TimedOut => failed |= 1 << i,
                Outcome::Pending => unknown |= 1 << i,
                _ => {}
            }
        }
        let free_in =
            if o.req == Request::AcquireWait && taken != 0 && o.tally.yes() < o.tally.need() {
                let left = o
                    .tally
                    .outcomes()
                    .iter()
                    .zip(o.left_ms.iter())
                    .filter(|(x, _)| **x == Outcome::Taken)
                    .map(|(_, v)| *v);
                rules::free_in(left, o.tally.yes(), o.tally.need())
            } else {
                None
            };
        let holders = if o.req == Request::AcquireWait {
            o.holders.iter().copied().collect()
        } else {
            SmallVec::new()
        };
        Hint {
            free_in,
            taken,
            failed,
            unknown,
            holders,
        }
    }

    /// Master `master` announced release `fp` (`None`: this client made it): note what it
    /// frees for task `id`, and say whether the task should try now.
    ///
    /// A master is freed by the release of the holder the task's last attempt found there
    /// (it came after the attempt), or by any release but the one that started the attempt
    /// and our own cleanup's (the holder changed since). The copies of the release that woke
    /// the task count from the masters it had not reached yet when the attempt got there:
    /// the attempt found its holder there (a lock of several keys, whose holders the masters
    /// do not name: the masters the attempt found taken, none announced since). The task tries once the masters still blocked
    /// leave room for a quorum: an attempt before that would only be refused again (even
    /// when the announcement names it: trying at the first one measured more refusals and
    /// no shorter hand-off, the release not having reached enough masters yet).
    /// This client's own release frees everything it held: its waiters try at once.
    ///
    /// An attempt started by an announcement must be justified by it (issue 19, item 2):
    /// the announcement is news only when it frees a master that still blocked the task;
    /// one from a master that did not (where the task's attempt won, or was never told
    /// taken) changes nothing, so it starts nothing, even when room for a quorum was
    /// already left (then the timed retry, or an announcement that frees more, rules).
    pub(super) fn hear(&mut self, id: TaskId, master: Option<usize>, fp: &Fingerprint) -> bool {
        let n = self.rounds.n();
        let quorum = self.rounds.quorum();
        let t = &mut self.tasks[id.slot as usize];
        let fresh = t.woken_by.as_ref() != Some(fp) && !t.own.contains(fp);
        let Some(m) = master else {
            return fresh;
        };
        let holder_gone = match t.holders.get(m) {
            Some(Some(h)) => h == fp,
            // Who held the keys there is unknown (a lock of several keys): a copy of the
            // release that woke the task frees a master its attempt found taken and that
            // nothing announced since (the attempt got there before the release did).
            _ => t.woken_by.as_ref() == Some(fp) && m < 64 && t.blocked & (1u64 << m) != 0,
        };
        if !holder_gone && !fresh {
            return false;
        }
        if m < 64 {
            if t.blocked & (1u64 << m) == 0 {
                return false;
            }
            t.blocked &= !(1u64 << m);
            t.waited = true;
        }
        // Masters that failed the last attempt stay in the way whatever is announced: a
        // release frees a key, not a master that is down, partitioned, or refuses our vote
        // (issue 19, item 9). Only the timed retry (or a confirmation) tries them again.
        let out = (t.blocked | t.failed).count_ones() as usize;
        n - out.min(n) >= quorum
    }

    /// The jitter added to a wake-up at the holder's expiry: 1 ms (Redis expires to the
    /// millisecond) plus up to a tenth of the retry jitter, so that waiters who learnt
    /// the same expiry do not all come at once.
    pub(super) fn expiry_jitter(&mut self) -> Duration {
        let spread = self.cfg.retry_jitter / 10;
        Duration::from_millis(1) + rules::retry_delay(spread / 2, spread / 2, &mut self.rng)
    }

    /// Task `id` waits on its keys: hold their channels and join their wait lists (in
    /// arrival order), once per task.
    pub(super) fn watch(&mut self, id: TaskId, now: Instant) {
        let t = &self.tasks[id.slot as usize];
        if !t.chans.is_empty() {
            return;
        }
        let mut chans: SmallVec<[ChanId; 2]> =
            std::mem::take(&mut self.tasks[id.slot as usize].chans);
        let keys = std::mem::take(&mut self.tasks[id.slot as usize].keys);
        for key in keys.iter() {
            chans.push(self.rounds.subscribe(key, now));
        }
        self.tasks[id.slot as usize].keys = keys;
        if self.tasks[id.slot as usize].wait_id.is_some() {
            // It stands in a line: the releases that make it its turn come on the client's
            // own channel.
            let client_id = self.client_id;
            let direct = self.rounds.subscribe_direct(&client_id, now);
            self.tasks[id.slot as usize].direct = Some(direct);
        }
        let seq = self.tasks[id.slot as usize].seq;
        for chan in chans.iter() {
            let k = chan.slot();
            if self.waitlists.len() <= k {
                self.waitlists.resize_with(k + 1, SmallVec::new);
            }
            let list = &self.waitlists[k];
            let at = list
                .iter()
                .position(|w| self.tasks[w.slot as usize].seq > seq)
                .unwrap_or(list.len());
            self.waitlists[k].insert(at, id);
        }
        let t = &mut self.tasks[id.slot as usize];
        t.chans = chans;
        t.waited = true;
    }

    /// Task `id` stops waiting (granted, failed, cancelled): leave the wait lists and let
    /// the channels go. With fairness, a head that leaves without the lock wakes the next
    /// waiter (the release it may have been told of is the next one's now).
    pub(super) fn unwatch(&mut self, id: TaskId, granted: bool, now: Instant) {
        let mut chans = std::mem::take(&mut self.tasks[id.slot as usize].chans);
        let mut next: SmallVec<[TaskId; 2]> = SmallVec::new();
        for chan in chans.drain(..) {
            let list = &mut self.waitlists[chan.slot()];
            if let Some(at) = list.iter().position(|w| *w == id) {
                list.remove(at);
                if at == 0 && !granted {
                    if let Some(&head) = list.first() {
                        next.push(head);
                    }
                }
            }
            self.rounds.unsubscribe(chan, now);
        }
        self.tasks[id.slot as usize].chans = chans;
        if let Some(direct) = self.tasks[id.slot as usize].direct.take() {
            self.rounds.unsubscribe(direct, now);
        }
        if self.cfg.fairness {
            for head in next {
                if self.sleeping_task(head) {
                    self.wake_now(head, None, now);
                }
            }
        }
    }

    fn sleeping_task(&self, id: TaskId) -> bool {
        let t = &self.tasks[id.slot as usize];
        t.gen == id.gen && t.live && t.phase == Phase::Sleep
    }

    /// The head of one of the task's wait lists (the oldest waiter of this client there).
    pub(super) fn is_head(&self, id: TaskId) -> bool {
        self.tasks[id.slot as usize]
            .chans
            .iter()
            .any(|c| self.waitlists[c.slot()].first() == Some(&id))
    }

    /// May task `id` try on a notice now: always, or with fairness only at the head.
    pub(super) fn eligible(&self, id: TaskId) -> bool {
        !self.cfg.fairness || self.is_head(id)
    }

    /// Some master that said "taken" in the task's last attempt (started at `t1`) had
    /// confirmed the subscriptions (the key's channel, and the client's own if the task
    /// stands in line) before it: a release there will be announced to us.
    pub(super) fn covered(&self, id: TaskId, t1: Instant) -> bool {
        let t = &self.tasks[id.slot as usize];
        let before = |c: ChanId, i: usize| {
            self.rounds
                .subscribed_since(c, i)
                .is_some_and(|since| since <= t1)
        };
        t.chans.iter().any(|&c| {
            (0..self.rounds.n().min(64)).any(|i| {
                t.taken & (1 << i) != 0 && before(c, i) && t.direct.is_none_or(|d| before(d, i))
            })
        })
    }

    /// Start a sleeping task's next attempt now (not a timed one: its retry budget is
    /// untouched), told of release `fp` if a notice woke it.
    pub(super) fn wake_now(&mut self, id: TaskId, fp: Option<Fingerprint>, now: Instant) {
        if let Some(k) = self.sleeping.iter().position(|s| *s == id.slot) {
            self.sleeping.swap_remove(k);
        }
        let t = &mut self.tasks[id.slot as usize];
        if fp.is_some() {
            t.woken_by = fp;
        }
        t.woken = fp.is_some();
        t.timed = false;
        t.waited = true;
        t.attempt += 1;
        self.start_attempt(id, now);
    }

    /// Hand what the subscription connections heard to the waiters.
    pub(super) fn take_notices(&mut self, now: Instant) {
        while let Some(n) = self.rounds.take_notice() {
            match n {
                Notice::Released { chan, master, fp } => {
                    self.on_released(chan, Some(master), fp, None, None, now)
                }
                Notice::Turn { master, fp, id } => {
                    if let Some(task) = self.waiter(&id) {
                        self.notify_task(task, Some(master), fp, true, now);
                    }
                }
                Notice::Subscribed { chan, master } => self.on_subscribed(chan, master, now),
            }
        }
    }

    /// A release of channel `chan` (token fingerprint `fp`) was announced by `master` on
    /// the key's channel (nobody stood in its line there; a named waiter hears a `Turn`
    /// instead), or made by this client (`master` `None`; `except`: the task whose cleanup
    /// it is; `stood`: for a cleanup, the masters (bit i) where its keys may have stood,
    /// `None` for a lock's release, which frees everything). The waiters whose turn it is
    /// (every waiter, or with fairness this client's oldest; for a release made here, this
    /// client's oldest) try once what they heard leaves room for a quorum; a waiter whose
    /// attempt runs notes it, to weigh it against that attempt's answers.
    pub(super) fn on_released(
        &mut self,
        chan: ChanId,
        master: Option<usize>,
        fp: Fingerprint,
        except: Option<TaskId>,
        stood: Option<u64>,
        now: Instant,
    ) {
        let mut list: SmallVec<[TaskId; 8]> = self
            .waitlists
            .get(chan.slot())
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default();
        // Tasks whose first refusal is in flight are not listed yet (they are once it is
        // in): a release announced meanwhile is theirs to weigh against that attempt.
        if master.is_some() {
            for (slot, t) in self.tasks.iter().enumerate() {
                if t.live
                    && t.phase == Phase::Acquire
                    && t.chans.is_empty()
                    && t.waits()
                    && t.keys.iter().any(|k| self.rounds.channel(k) == Some(chan))
                {
                    list.push(TaskId {
                        slot: slot as u32,
                        gen: t.gen,
                    });
                }
            }
        }
        // A release made here goes to this client's oldest waiter (it tries right behind
        // it): waking every local waiter for it is a herd, however cheap the write.
        let mut local_turn = master.is_none();
        for id in list {
            if Some(id) == except {
                continue;
            }
            let t = &self.tasks[id.slot as usize];
            if t.gen != id.gen || !t.live {
                continue;
            }
            let turn = if master.is_none() {
                std::mem::take(&mut local_turn)
            } else {
                self.eligible(id)
            };
            match (master, stood) {
                // A failed attempt's cleanup frees only the masters where its keys stood,
                // as those masters' announcements would: heard master by master, it wakes
                // a sibling only when that leaves room for a quorum (issue 19, item 4:
                // with the lock held elsewhere, two callers of one client woke each other
                // at round-trip speed, each cleanup taken for a release of everything).
                (None, Some(stood)) => {
                    for m in (0..self.rounds.n().min(64)).filter(|m| stood >> m & 1 != 0) {
                        self.notify_task(id, Some(m), fp, turn, now);
                    }
                }
                _ => self.notify_task(id, master, fp, turn, now),
            }
        }
    }

    /// The waiting task of this client whose id in the lines is `id`.
    ///
    /// Any phase: a release may name a task whose first attempt is still in flight (it
    /// stands in line on the masters that refused it already); the task then weighs the
    /// announcement against that attempt's answers, instead of missing it.
    fn waiter(&self, id: &Fingerprint) -> Option<TaskId> {
        self.tasks.iter().enumerate().find_map(|(slot, t)| {
            (t.live && !t.has_result() && t.wait_id.as_ref() == Some(id)).then_some(TaskId {
                slot: slot as u32,
                gen: t.gen,
            })
        })
    }

    /// Master `master` announced release `fp` (`None`: this client made it) to task `id`;
    /// `turn`: it is the task's turn (named first in line, or nobody named). A sleeping
    /// task tries once it may; a task whose attempt runs keeps it for later.
    fn notify_task(
        &mut self,
        id: TaskId,
        master: Option<usize>,
        fp: Fingerprint,
        turn: bool,
        now: Instant,
    ) {
        match self.tasks[id.slot as usize].phase {
            Phase::Sleep => {
                if self.hear(id, master, &fp) && turn {
                    self.wake_now(id, Some(fp), now);
                }
            }
            Phase::Acquire | Phase::Draw | Phase::WriteBack => {
                let m = master.map_or(u32::MAX, |m| m as u32);
                let t = &mut self.tasks[id.slot as usize];
                if t.heard.len() < 16 && !t.heard.contains(&(m, fp, turn)) {
                    t.heard.push((m, fp, turn));
                    t.waited = true;
                }
            }
            Phase::OnLock | Phase::Done => {}
        }
    }

    /// A master confirmed channel `chan`: waiters that are not covered (refused before
    /// any confirmation, or every master that covered them lost its connection) try once
    /// more now.
    fn on_subscribed(&mut self, chan: ChanId, master: usize, now: Instant) {
        let list: SmallVec<[TaskId; 8]> = match self.waitlists.get(chan.slot()) {
            Some(list) if !list.is_empty() => list.iter().copied().collect(),
            // The client's own channel: every task that stands in line.
            _ => self
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| t.live && t.direct == Some(chan))
                .map(|(slot, t)| TaskId {
                    slot: slot as u32,
                    gen: t.gen,
                })
                .collect(),
        };
        let bit = if master < 64 { 1u64 << master } else { 0 };
        for id in list {
            let t = &mut self.tasks[id.slot as usize];
            if t.gen != id.gen || !t.live {
                continue;
            }
            if matches!(t.phase, Phase::Acquire | Phase::Draw | Phase::WriteBack) {
                // Weighed against the running attempt's answers when it is refused: the
                // connection that came back may be one that attempt lost (a confirmation
                // dropped here left a waiter whose attempt failed on a cut asleep until its
                // timed retry: hot::a_cut_subscription_does_not_lose_the_release).
                t.confirmed |= bit;
                t.waited = true;
                continue;
            }
            if !self.sleeping_task(id) || !self.eligible(id) {
                continue;
            }
            // The cover the last attempt lacked is complete now: a release in between
            // may have gone unheard, try once. A partial cover waits for the rest (each
            // channel's confirmation would otherwise be one more attempt).
            let back = self.came_back(id, bit);
            let t1 = self.tasks[id.slot as usize].t1;
            if back || (!self.covered(id, t1) && self.covered(id, now)) {
                self.wake_now(id, None, now);
            }
        }
    }

    /// Masters `masters` (bits) confirmed a subscription of task `id`'s: those its last
    /// attempt could not reach, or had no answer from when it was decided, answer again.
    /// Whether that makes room for a quorum (then try, as on an announcement that frees
    /// one; once per master come back, not once per channel).
    pub(super) fn came_back(&mut self, id: TaskId, masters: u64) -> bool {
        let (n, quorum) = (self.rounds.n(), self.rounds.quorum());
        let t = &mut self.tasks[id.slot as usize];
        let back = masters & (t.failed | t.unknown);
        if back == 0 {
            return false;
        }
        t.failed &= !back;
        t.blocked &= !(back & t.unknown);
        t.unknown &= !back;
        t.waited = true;
        let out = (t.blocked | t.failed).count_ones() as usize;
        n - out.min(n) >= quorum
    }

    /// This client releases `keys` (token `token`), e.g. a guard dropped or a failed
    /// attempt's cleanup (`stood`: the masters where its keys may have stood; see
    /// [`Core::on_released`]): its own waiters on them try now, their requests written
    /// right behind the release on every connection (Redis runs one connection's commands
    /// in order, so each finds the key deleted where the release deleted it).
    #[inline]
    pub(super) fn released_here(
        &mut self,
        keys: &KeyList,
        token: &[u8],
        except: Option<TaskId>,
        stood: Option<u64>,
        now: Instant,
    ) {
        // No channel at all (nobody of this client waits): no key has one, a test.
        if !self.notify() || !self.rounds.listening() {
            return;
        }
        self.released_here_to(keys, token, except, stood, now);
    }

    /// Some waiter of this client waits on one of `keys` (or did lately): a release of
    /// them starts it right behind (`released_here`), so the release keeps its script
    /// (`OpArgs::waiters_here`). Asked only where some master may offer `DELIFEQ`.
    #[inline]
    pub(super) fn listens_on(&self, keys: &KeyList) -> bool {
        self.rounds.offers_delifeq()
            && self.notify()
            && self.rounds.listening()
            && keys.iter().any(|k| self.rounds.channel(k).is_some())
    }

    /// [`Core::released_here`] when some channel is live.
    #[inline(never)]
    fn released_here_to(
        &mut self,
        keys: &KeyList,
        token: &[u8],
        except: Option<TaskId>,
        stood: Option<u64>,
        now: Instant,
    ) {
        for key in keys.iter() {
            if let Some(chan) = self.rounds.channel(key) {
                self.on_released(chan, None, fingerprint(token), except, stood, now);
            }
        }
    }
}
