//! One turn of the shared client's loop: take the queued commands, run the tasks (the same
//! [`Core`] the single owner drives), hand each result to its [`Slot`], keep
//! auto-extended locks alive and wake `lost()` futures, all from one `mio::Poll`. Who
//! drives it, and when, is `hub.rs`'s business.
//!
//! The loop is written against [`LoopIo`], what it needs of its I/O: the sockets'
//! [`Driver`] (the default), or masters scripted in memory ([`InMemory`]), which lets an
//! example count what this code costs a cycle exactly (`examples/shared_loop_cycles.rs`).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pending::{Out, Owed, Slot};
use super::state::LockState;
use super::{Command, KeyStore};
use crate::core::{Core, Done, TaskId, WatchId};
use crate::driver::{Driver, LoopIo};
use crate::error::Error;
use crate::keep::{AfterExtend, KeepAlive};
use crate::lock::Lock;

/// Who waits for a task.
enum Waiter {
    Lock(Arc<Slot>),
    /// A release somebody waits for (a dropped guard's goes out detached).
    Release(Arc<Slot>),
    /// `slot: None`: an auto-extension (the keeper of `state` waits).
    Extend {
        state: Arc<LockState>,
        slot: Option<Arc<Slot>>,
    },
    /// An operator's inspection or forced release.
    Admin(Arc<Slot>),
}

/// An auto-extended lock.
struct Keeper {
    state: Arc<LockState>,
    keep: KeepAlive,
    /// An extension is in flight.
    extending: bool,
}

pub(crate) struct Loop<D = Driver> {
    m: Core,
    driver: D,
    /// By task slot.
    waiters: Vec<Option<(TaskId, Waiter)>>,
    live: usize,
    keepers: Vec<Keeper>,
    watched: Vec<Arc<LockState>>,
    /// The locks the masters watch for a loss (auto-extended, or someone awaits `lost()`).
    watches: Vec<(WatchId, Arc<LockState>)>,
    inbox: Vec<Command>,
    /// The keys of the keyed commands of `inbox`.
    keys: KeyStore,
    finished: Vec<TaskId>,
    /// Lock states nobody else holds any more, reused for the next grants.
    spare_states: Vec<Arc<LockState>>,
    /// The wake-ups of the parked callers whose results this turn handed over, paid once
    /// the turn's requests are written (see `pending::Handover`).
    owed: Owed,
    /// The slot (its address; 0: none) of the caller driving the loop for its result,
    /// which it takes from `direct` (see [`Loop::aim`]).
    aimed: usize,
    direct: Option<Result<Out, Error>>,
}

/// Spare lock states kept at most.
const MAX_SPARE_STATES: usize = 1024;

/// The shared state of `lock`, just granted: one of the `spare` states refilled, or a new
/// one. The lock's keys move into it.
fn new_state(spare: &mut Vec<Arc<LockState>>, lock: &mut Lock) -> Arc<LockState> {
    if let Some(mut state) = spare.pop() {
        if let Some(s) = Arc::get_mut(&mut state) {
            s.refill(lock);
            return state;
        }
    }
    Arc::new(LockState::new(lock))
}

impl<D: LoopIo> Loop<D> {
    pub(crate) fn new(mut m: Core, driver: D) -> Self {
        m.track_finished = true;
        Loop {
            m,
            driver,
            waiters: Vec::with_capacity(64),
            live: 0,
            keepers: Vec::new(),
            watched: Vec::new(),
            watches: Vec::new(),
            inbox: Vec::with_capacity(64),
            keys: KeyStore::with_capacity(64),
            finished: Vec::with_capacity(64),
            spare_states: Vec::new(),
            owed: Owed::default(),
            aimed: 0,
            direct: None,
        }
    }

    /// The loop is done with `state`: kept for reuse when nobody else holds it (a guard
    /// hands its reference over with the release; an extension in flight still holds one).
    fn recycle(&mut self, state: Arc<LockState>) {
        if Arc::strong_count(&state) == 1 && self.spare_states.len() < MAX_SPARE_STATES {
            self.spare_states.push(state);
        }
    }

    /// Start driving (after a pause, read what the masters sent meanwhile: above all the
    /// connections they closed, so that the requests go out on fresh ones); returns the
    /// time. `catch_up` takes the idle gap itself: a `Driver::enter` before it reset the
    /// gap, and the loop never read anything on entering (a parked client's first lock
    /// after a master restart failed on that master).
    pub(crate) fn enter(&mut self) -> io::Result<Instant> {
        self.driver.catch_up(&mut self.m)
    }

    /// One turn at `now`: commands, tasks, results, keepers, watchers, writes. Returns
    /// when the loop must look again at the latest (`None` too once the aimed caller's
    /// result is in: its driver stops after this turn).
    /// `take` moves the queued commands into the vector it is given.
    #[inline(always)]
    pub(crate) fn iterate(
        &mut self,
        take: impl FnOnce(&mut Vec<Command>, &mut KeyStore),
        now: Instant,
    ) -> Option<Instant> {
        take(&mut self.inbox, &mut self.keys);
        // Half the turns of a caller's operation take no command (the one after a wait)
        // and most hold no auto-extended or watched lock: tests, not calls.
        if !self.inbox.is_empty() {
            self.drain(now);
        }
        self.m.step(now);
        // Half the turns of a caller's operation (the one before its wait) finish no task.
        if self.m.finished_count() != 0 {
            self.deliver(now);
        }
        let timers =
            !self.keepers.is_empty() || !self.watched.is_empty() || !self.watches.is_empty();
        if timers {
            self.keep_alive(now);
            self.watch(now);
        }
        // What the tasks, results and keepers started (releases, extensions) goes out now:
        // first the connects and closes they asked for, if any (nearly never).
        if self.m.has_actions() {
            self.driver.apply_actions(&mut self.m, now);
        }
        self.driver.flush(&mut self.m, now);
        // Then the callers whose results came: the loop wakes the first few, they wake the
        // rest (see `pending::Handover`).
        self.owed.pay();
        if self.direct.is_some() {
            // The caller driving for its result has it: it stops driving after this turn
            // and nobody uses the next wake (whoever drives next computes it afresh).
            return None;
        }
        let wake = self.driver.next_wake(&self.m, None);
        if !timers {
            return wake;
        }
        [wake, self.next_wake(now)].into_iter().flatten().min()
    }

    /// Where [`Loop::iterate`] takes the queued commands into (empty between turns: each
    /// turn runs all it took).
    pub(crate) fn inbox(&mut self) -> (&mut Vec<Command>, &mut KeyStore) {
        (&mut self.inbox, &mut self.keys)
    }

    /// The caller about to drive the loop waits for `slot`: its result goes to
    /// [`Loop::take_direct`], not into the slot (no lock, no wake-up, nothing for the
    /// caller to take from the slot). Only while that caller holds the loop: it takes the
    /// result (or learns it has none, then its slot has it or will) before letting go.
    pub(crate) fn aim(&mut self, slot: &Slot) {
        self.aimed = slot as *const Slot as usize;
    }

    /// The aimed caller's result is in.
    pub(crate) fn has_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Stop aiming; the aimed caller's result, if it came.
    pub(crate) fn take_direct(&mut self) -> Option<Result<Out, Error>> {
        self.aimed = 0;
        self.direct.take()
    }

    /// Hand `out` to `slot`'s waiter: the aimed caller directly, anyone else through the
    /// slot ([`Slot::complete_later`], whose return it returns).
    #[inline(always)]
    fn complete(&mut self, slot: Arc<Slot>, out: Result<Out, Error>) -> Option<Result<Out, Error>> {
        if Arc::as_ptr(&slot) as usize == self.aimed {
            self.aimed = 0;
            slot.let_go_unfilled();
            self.direct = Some(out);
            return None;
        }
        slot.complete_later(out, &mut self.owed)
    }

    /// Wait for the masters until `wake` at the latest.
    pub(crate) fn wait(&mut self, now: Instant, wake: Option<Instant>) -> io::Result<Instant> {
        self.driver.wait(&mut self.m, now, wake)
    }

    /// Something is in flight or scheduled that needs the loop.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        self.live > 0 || !self.keepers.is_empty() || !self.watched.is_empty()
    }

    /// The loop must keep running: work, subscriptions still lingering after the last
    /// wait (their connections are read, and closed when the linger ends; not a reason to
    /// delay the loop's end once the client is gone), or releases not sent yet to a master
    /// that fell behind (sent when it is back, within the lock's TTL).
    #[inline]
    pub(crate) fn wants_loop(&self) -> bool {
        self.has_work() || self.m.listening() || self.m.releases_unsent()
    }

    /// Some master is still owed a release (queued, unanswered, or for its next
    /// connection): the loop delivers them before it ends, within its bound.
    pub(crate) fn owes_releases(&self) -> bool {
        self.m.owes_releases()
    }

    /// No round is undecided (cleanup releases included).
    pub(crate) fn rounds_idle(&self) -> bool {
        self.m.is_idle()
    }

    /// Take every command queued since the last time round.
    #[inline]
    fn drain(&mut self, now: Instant) {
        // One command (a caller's own, nearly always): taken off the list, no drain.
        if self.inbox.len() == 1 {
            if let Some(cmd) = self.inbox.pop() {
                self.command(cmd, now);
            }
            self.keys.reset();
            return;
        }
        self.drain_all(now);
    }

    /// [`Loop::drain`] of several commands.
    #[inline(never)]
    fn drain_all(&mut self, now: Instant) {
        let mut inbox = std::mem::take(&mut self.inbox);
        for cmd in inbox.drain(..) {
            self.command(cmd, now);
        }
        self.inbox = inbox;
        self.keys.reset();
    }

    #[inline]
    fn wait_for(&mut self, id: TaskId, w: Waiter) {
        let k = id.slot();
        if self.waiters.len() <= k {
            self.waiters.resize_with(k + 1, || None);
        }
        self.waiters[k] = Some((id, w));
        self.live += 1;
    }

    fn command(&mut self, cmd: Command, now: Instant) {
        match cmd {
            Command::Lock {
                ttl,
                deadline,
                retries,
                slot,
            } => {
                // The keys swapped into the task where the store holds them.
                let keys = self.keys.take();
                let id = self.m.submit_lock_list(keys, ttl, deadline, retries, now);
                self.wait_for(id, Waiter::Lock(slot));
            }
            Command::Release { state, slot } => {
                if !self.keepers.is_empty() {
                    self.keepers.retain(|k| !Arc::ptr_eq(&k.state, &state));
                }
                if !self.watched.is_empty() {
                    self.watched.retain(|s| !Arc::ptr_eq(s, &state));
                }
                // The release ends the masters' watch too.
                if !self.watches.is_empty() {
                    self.watches.retain(|(_, s)| !Arc::ptr_eq(s, &state));
                }
                match slot {
                    Some(slot) => {
                        state.record_hold(now);
                        let id = self.m.submit_release_of(state.on_lock(), state.ttl(), now);
                        self.wait_for(id, Waiter::Release(slot));
                    }
                    // A dropped guard: the same path as the single owner's dropped lock.
                    None => self.m.release_detached(&state.to_lock(), now),
                }
                self.recycle(state);
            }
            Command::Extend { state, ttl, slot } => {
                let id = self.m.submit_extend(&state.to_lock(), ttl, now);
                self.wait_for(
                    id,
                    Waiter::Extend {
                        state,
                        slot: Some(slot),
                    },
                );
            }
            Command::KeepAlive { state, opts } => {
                if self.keepers.iter().any(|k| Arc::ptr_eq(&k.state, &state)) {
                    return;
                }
                let keep = KeepAlive::new(state.ttl(), &opts, now);
                state.set_stop_at(keep.stop_at(state.valid_until()));
                self.watch_on_masters(&state, now);
                self.keepers.push(Keeper {
                    state,
                    keep,
                    extending: false,
                });
            }
            Command::Watch(state) => {
                if !self.watched.iter().any(|s| Arc::ptr_eq(s, &state)) {
                    self.watch_on_masters(&state, now);
                    self.watched.push(state);
                }
            }
            Command::Stats(slot) => {
                let stats = Ok(Out::Stats(self.driver.stats(&self.m)));
                self.complete(slot, stats);
            }
            Command::Admin { force, slot } => {
                let resource = self.keys.take();
                let r = resource.iter().next().unwrap_or_default();
                let id = if force {
                    self.m.submit_force_release(r, now)
                } else {
                    self.m.submit_inspect(r, now)
                };
                self.wait_for(id, Waiter::Admin(slot));
            }
            Command::Cancel(slot) => {
                let found = self.waiters.iter().flatten().find_map(|(id, w)| match w {
                    Waiter::Lock(s) if Arc::ptr_eq(s, &slot) => Some(*id),
                    _ => None,
                });
                if let Some(id) = found {
                    self.m.cancel(id, now);
                }
            }
        }
    }

    /// Hand every finished task's result to whoever waits for it.
    #[inline]
    fn deliver(&mut self, now: Instant) {
        // The common case (one caller): no copy of the list.
        if self.m.finished_count() == 1 {
            if let Some(id) = self.m.take_one_finished() {
                self.deliver_one(id, now);
            }
            return;
        }
        self.deliver_all(now);
    }

    /// [`Loop::deliver`] of several finished tasks (or none).
    #[inline(never)]
    fn deliver_all(&mut self, now: Instant) {
        self.finished.extend(self.m.take_finished());
        let mut finished = std::mem::take(&mut self.finished);
        for id in finished.drain(..) {
            self.deliver_one(id, now);
        }
        self.finished = finished;
    }

    /// Hand finished task `id`'s result to whoever waits for it.
    #[inline]
    fn deliver_one(&mut self, id: TaskId, now: Instant) {
        let Some((_, waiter)) = self.waiters.get_mut(id.slot()).and_then(Option::take) else {
            let _ = self.m.take(id);
            return;
        };
        self.live -= 1;
        match waiter {
            Waiter::Lock(slot) => {
                // The lock's parts go from the task straight into its state (a lock is 272
                // bytes: not moved out of the core, then into the state).
                let spare = &mut self.spare_states;
                let out = self.m.take_in_place(id, |result| match result {
                    Ok(Done::Locked(lock)) => Ok(Out::Lock(new_state(spare, lock))),
                    Ok(other) => unreachable!("a lock task ended with {other:?}"),
                    Err(e) => Err(std::mem::replace(e, Error::Cancelled)),
                });
                self.settle_lock(slot, out, now);
            }
            Waiter::Release(slot) => {
                // Not the whole result (272 bytes): a release's says only whether it went
                // through.
                let out = self.m.take_unit(id).map(|()| Out::Unit);
                self.complete(slot, out);
            }
            waiter => {
                let result = self.m.take(id);
                self.settle(waiter, result, now);
            }
        }
    }

    /// Hand a lock task's result to its waiter.
    #[inline]
    fn settle_lock(&mut self, slot: Arc<Slot>, out: Result<Out, Error>, now: Instant) {
        // Nobody wants it any more (the `Pending` was dropped): released as a dropped lock
        // is.
        if let Some(Ok(Out::Lock(state))) = self.complete(slot, out) {
            self.m.release_detached(&state.to_lock(), now);
            self.recycle(state);
        }
    }

    fn settle(&mut self, waiter: Waiter, result: Result<Done, Error>, now: Instant) {
        match waiter {
            Waiter::Lock(_) | Waiter::Release(_) => {
                unreachable!("a lock or release task's result is taken in place")
            }
            Waiter::Admin(slot) => {
                let out = result.map(|d| match d {
                    Done::Inspected(i) => Out::Inspection(Box::new(i)),
                    Done::ForceReleased(f) => Out::Forced(Box::new(f)),
                    other => unreachable!("an operator's task ended with {other:?}"),
                });
                self.complete(slot, out);
            }
            Waiter::Extend { state, slot } => {
                let k = self
                    .keepers
                    .iter()
                    .position(|k| Arc::ptr_eq(&k.state, &state));
                let margin = k.map_or(Duration::ZERO, |k| self.keepers[k].keep.lost_margin());
                let r = match result {
                    Ok(Done::Extended { valid_until, ttl }) => {
                        state.extended(valid_until, ttl, margin);
                        Ok(())
                    }
                    Ok(other) => unreachable!("an extend task ended with {other:?}"),
                    Err(e) => Err(e),
                };
                match slot {
                    Some(slot) => {
                        if let Err(e @ (Error::NotHeld(_) | Error::Expired)) = &r {
                            state.mark_lost(Some(e));
                        }
                        self.complete(slot, r.map(|()| Out::Unit));
                    }
                    None => {
                        let Some(k) = k else { return };
                        let retry_in = self.m.cfg.round_timeout(self.keepers[k].keep.ttl());
                        let keeper = &mut self.keepers[k];
                        keeper.extending = false;
                        if let AfterExtend::Lost(e) = keeper.keep.after_extend(r, now, retry_in) {
                            keeper.state.mark_lost(Some(&e));
                            self.keepers.swap_remove(k);
                        }
                    }
                }
            }
        }
    }

    /// Extend the auto-extended locks that are due; mark lost those past their margin.
    fn keep_alive(&mut self, now: Instant) {
        let mut k = self.keepers.len();
        while k > 0 {
            k -= 1;
            let keeper = &mut self.keepers[k];
            if keeper.extending {
                continue;
            }
            if keeper.state.is_lost() {
                let why = keeper.keep.lost_reason();
                keeper.state.mark_lost(Some(&why));
                self.keepers.swap_remove(k);
                continue;
            }
            let until = keeper.state.valid_until();
            if now < keeper.keep.next_wake(until, now) || !keeper.keep.may_extend(now) {
                continue;
            }
            keeper.extending = true;
            let (state, ttl) = (keeper.state.clone(), keeper.keep.ttl());
            let id = self.m.submit_extend(&state.to_lock(), ttl, now);
            self.wait_for(id, Waiter::Extend { state, slot: None });
        }
    }

    /// Have the masters watch `state`'s lock for a loss (see `core::watch`).
    fn watch_on_masters(&mut self, state: &Arc<LockState>, now: Instant) {
        if state.is_lost() || self.watches.iter().any(|(_, s)| Arc::ptr_eq(s, state)) {
            return;
        }
        let w = self.m.watch_lock(&state.to_lock(), now);
        self.watches.push((w, state.clone()));
    }

    /// Mark lost the locks the masters' watch found lost (and stop keeping them); wake
    /// the `lost()` futures of locks whose lost instant passed.
    fn watch(&mut self, _now: Instant) {
        while let Some(w) = self.m.take_lost() {
            let Some(k) = self.watches.iter().position(|(x, _)| *x == w) else {
                continue;
            };
            let (w, state) = self.watches.swap_remove(k);
            let why = self.m.watch_lost(w);
            self.m.unwatch_lock(w);
            state.mark_lost(why.as_ref());
            self.keepers.retain(|k| !Arc::ptr_eq(&k.state, &state));
        }
        self.watched.retain(|s| !s.is_lost());
        if !self.watches.is_empty() {
            let m = &mut self.m;
            self.watches.retain(|(w, s)| {
                let keep = !s.is_lost();
                if !keep {
                    m.unwatch_lock(*w);
                }
                keep
            });
        }
    }

    /// The next instant a keeper or a watched lock needs the loop.
    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let keepers = self
            .keepers
            .iter()
            .filter(|k| !k.extending)
            .map(|k| k.keep.next_wake(k.state.valid_until(), now));
        let watched = self.watched.iter().map(|s| s.stop_at());
        keepers.chain(watched).min()
    }

    /// The loop is ending: every operation still waiting, and every command still queued
    /// or queued later, fails with `why`.
    /// `kill` stops the queue for good and moves what it held into the vector it is given.
    pub(crate) fn shut(&mut self, why: io::Error, kill: impl FnOnce(&mut Vec<Command>)) {
        let err = || Error::Io(io::Error::new(why.kind(), why.to_string()));
        kill(&mut self.inbox);
        self.keys.reset();
        for cmd in self.inbox.drain(..) {
            match cmd {
                Command::Lock { slot, .. }
                | Command::Extend { slot, .. }
                | Command::Admin { slot, .. }
                | Command::Stats(slot) => {
                    slot.complete_later(Err(err()), &mut self.owed);
                }
                Command::Release {
                    slot: Some(slot), ..
                } => {
                    slot.complete_later(Err(err()), &mut self.owed);
                }
                _ => {}
            }
        }
        for (_, w) in self.waiters.drain(..).flatten() {
            match w {
                Waiter::Lock(slot)
                | Waiter::Release(slot)
                | Waiter::Admin(slot)
                | Waiter::Extend {
                    slot: Some(slot), ..
                } => {
                    slot.complete_later(Err(err()), &mut self.owed);
                }
                _ => {}
            }
        }
        for k in self.keepers.drain(..) {
            k.state.mark_lost(Some(&err()));
        }
        self.driver.flush(&mut self.m, Instant::now());
        self.owed.pay();
    }
}
