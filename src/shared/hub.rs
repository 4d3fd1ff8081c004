//! Who runs the shared client's loop, and when.
//!
//! The loop state ([`Loop`]) sits behind one mutex: whoever holds it drives. A caller
//! blocked in [`super::Pending::wait`] drives the loop itself when nobody else does (no
//! hand-off between threads: one caller costs what the single-owner client costs), and
//! stops once its own result is in. The loop's own thread drives whenever work is left
//! that nobody waits on in a thread: async tasks' operations, released guards, retry
//! delays, auto-extension, `lost()` timers. While someone drives, others queue their
//! commands and park; the driver runs them along with its own (natural batching) and
//! wakes them.
//!
//! The hand-over never leaves a command with nobody to run it. A submitter queues under
//! the queue's mutex (and sets `queued`), then reads whether someone drives (`driving`,
//! after a `SeqCst` fence); a caller that stops driving clears `driving`, then reads
//! `queued` (after a `SeqCst` fence), without the queue's lock: of two such store-then-
//! load sequences at least one sees the other's store, so either the submitter sees
//! nobody driving (and hands its command to the loop's thread) or the stopping driver
//! sees the command (and does). The loop's thread stops under the queue's lock, having
//! seen it empty. Lock order: loop, then queue; never the other way.
//!
//! The hand-over is written against [`Drive`], what it needs of a loop: the shared
//! client's [`Loop`], or a loop without sockets in the `loom` model tests
//! (`loom_tests.rs`), which check these invariants at every interleaving.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event_loop::Loop;
use super::pending::{Out, Slot};
use super::sync::{
    fence, lock, thread, AtomicBool, Condvar, Mutex, MutexGuard, Ordering, TryLockError,
};
use super::{Command, KeyStore};
use crate::core::{Core, KeyList};
use crate::driver::{Driver, LoopIo};
use crate::error::Error;

/// How long the loop goes on after the last handle is gone, finishing what is in flight.
const DRAIN: Duration = Duration::from_secs(2);

/// A loop as the hand-over drives it: [`Loop`]'s methods of the same names.
pub(crate) trait Drive: Send + 'static {
    /// What the handles queue for the loop.
    type Command: Send + 'static;
    /// Wakes a driver from [`Drive::wait`] (from any thread, without the loop).
    type Waker: Send + Sync + 'static;
    fn wake(waker: &Self::Waker);
    /// A command that will never run: its waiter learns why.
    fn fail(cmd: Self::Command);
    fn enter(&mut self) -> io::Result<Instant>;
    fn iterate(
        &mut self,
        take: impl FnOnce(&mut Vec<Self::Command>, &mut KeyStore),
        now: Instant,
    ) -> Option<Instant>;
    /// Where [`Drive::iterate`] takes the queued commands and their keys into (empty
    /// between turns).
    fn inbox(&mut self) -> (&mut Vec<Self::Command>, &mut KeyStore);
    /// The caller driving for `slot` takes its result from the loop, not from the slot
    /// (see [`Loop::aim`]).
    fn aim(&mut self, slot: &Slot);
    /// The result handed to the aimed caller, once in.
    fn has_direct(&self) -> bool;
    /// Stop aiming: the result handed to the caller, if it came.
    fn take_direct(&mut self) -> Option<Result<Out, Error>>;
    fn wait(&mut self, now: Instant, wake: Option<Instant>) -> io::Result<Instant>;
    fn has_work(&self) -> bool;
    fn wants_loop(&self) -> bool;
    fn rounds_idle(&self) -> bool;
    fn owes_releases(&self) -> bool;
    fn shut(&mut self, why: io::Error, kill: impl FnOnce(&mut Vec<Self::Command>));
}

/// The loop over any I/O (the sockets' `Driver`, or `driver::InMemory` for the exact
/// instruction count): the hand-over drives the same loop code either way.
impl<D: LoopIo> Drive for Loop<D> {
    type Command = Command;
    type Waker = D::Waker;
    fn wake(waker: &D::Waker) {
        D::wake(waker);
    }
    fn fail(cmd: Command) {
        fail(cmd);
    }
    fn enter(&mut self) -> io::Result<Instant> {
        Loop::enter(self)
    }
    #[inline(always)]
    fn iterate(
        &mut self,
        take: impl FnOnce(&mut Vec<Command>, &mut KeyStore),
        now: Instant,
    ) -> Option<Instant> {
        Loop::iterate(self, take, now)
    }
    fn inbox(&mut self) -> (&mut Vec<Command>, &mut KeyStore) {
        Loop::inbox(self)
    }
    fn aim(&mut self, slot: &Slot) {
        Loop::aim(self, slot);
    }
    fn has_direct(&self) -> bool {
        Loop::has_direct(self)
    }
    fn take_direct(&mut self) -> Option<Result<Out, Error>> {
        Loop::take_direct(self)
    }
    fn wait(&mut self, now: Instant, wake: Option<Instant>) -> io::Result<Instant> {
        Loop::wait(self, now, wake)
    }
    #[inline]
    fn has_work(&self) -> bool {
        Loop::has_work(self)
    }
    #[inline]
    fn wants_loop(&self) -> bool {
        Loop::wants_loop(self)
    }
    fn rounds_idle(&self) -> bool {
        Loop::rounds_idle(self)
    }
    fn owes_releases(&self) -> bool {
        Loop::owes_releases(self)
    }
    fn shut(&mut self, why: io::Error, kill: impl FnOnce(&mut Vec<Command>)) {
        Loop::shut(self, why, kill);
    }
}

pub(crate) struct Hub<L: Drive = Loop> {
    queue: Mutex<Queue<L::Command>>,
    /// The loop's thread parks here when nobody needs it.
    cv: Condvar,
    lp: Mutex<L>,
    /// Every handle is gone: finish what is in flight, then stop.
    closed: AtomicBool,
    /// The queue holds commands: set with the first one queued, cleared as the queue is
    /// taken, both under the queue's lock, so that a driver's turn that finds it clear
    /// skips the lock (most turns: the one after each wait). A command queued just after
    /// that look is not lost: its submitter wakes the driver (`woken` is only set with
    /// commands queued), whose next turn, after that wake-up, sees the flag; and a
    /// caller that stops driving reads it after clearing `driving` (see the module's
    /// notes).
    queued: AtomicBool,
    /// Someone holds the loop and is driving it (in a poll, or about to be). Written only
    /// by the loop's holder: set under the queue's lock, cleared under it by the loop's
    /// thread and `kill`, or without it by a caller that stops driving (a store, a
    /// `SeqCst` fence, then `queued` read: see the module's notes). Read under the queue's
    /// lock, after a `SeqCst` fence, by whoever queued a command ([`Hub::wake_driver`]).
    driving: AtomicBool,
    waker: L::Waker,
    busy_poll: bool,
}

pub(crate) struct Queue<C> {
    pub commands: Vec<C>,
    /// The keys of the keyed commands among them.
    keys: KeyStore,
    /// Work is left that the loop's thread must drive.
    wanted: bool,
    /// The driver was woken from its poll and has not taken the queue since: one wake-up
    /// serves every command queued meanwhile.
    woken: bool,
    /// The loop stopped for good: nothing is taken any more.
    dead: bool,
}

impl Hub {
    /// The hub of a new shared client, and its loop thread started.
    pub(crate) fn start((core, driver): (Core, Driver)) -> io::Result<Arc<Hub>> {
        let busy_poll = core.rounds.cfg.busy_poll;
        let waker = driver.waker();
        let (hub, _thread) = Hub::launch(Loop::new(core, driver), waker, busy_poll)?;
        Ok(hub)
    }
}

impl<L: Drive> Hub<L> {
    /// The hub of `lp`, and the loop's thread started (its handle: the shared client lets
    /// it go; a model test joins it).
    pub(crate) fn launch(
        lp: L,
        waker: L::Waker,
        busy_poll: bool,
    ) -> io::Result<(Arc<Self>, thread::JoinHandle<()>)> {
        let hub = Arc::new(Hub {
            queue: Mutex::new(Queue {
                commands: Vec::with_capacity(64),
                keys: KeyStore::with_capacity(64),
                wanted: false,
                woken: false,
                dead: false,
            }),
            cv: Condvar::new(),
            waker,
            busy_poll,
            lp: Mutex::new(lp),
            closed: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            driving: AtomicBool::new(false),
        });
        let h = hub.clone();
        let handle = thread::Builder::new()
            .name("redlock-mux".into())
            .spawn(move || h.background())?;
        Ok((hub, handle))
    }

    /// Queue `cmd`; with `wake`, make sure someone drives the loop to run it.
    #[inline]
    pub(crate) fn submit(&self, cmd: L::Command, wake: bool) {
        let mut q = lock(&self.queue);
        if q.dead {
            drop(q);
            L::fail(cmd);
            return;
        }
        q.commands.push(cmd);
        self.queued.store(true, Ordering::Relaxed);
        if wake {
            self.wake_driver(q);
        }
    }

    /// [`Hub::submit`] of a keyed command (`Lock`, `Admin`), no wake-up: `keys` writes its
    /// keys into the queue's store, in place.
    #[inline]
    pub(crate) fn submit_keyed(&self, cmd: L::Command, keys: impl FnOnce(&mut KeyList)) {
        let mut q = lock(&self.queue);
        if q.dead {
            drop(q);
            L::fail(cmd);
            return;
        }
        keys(q.keys.next());
        q.commands.push(cmd);
        self.queued.store(true, Ordering::Relaxed);
    }

    /// Make sure someone drives the loop soon (a future was polled).
    pub(crate) fn kick(&self) {
        self.wake_driver(lock(&self.queue));
    }

    /// Make sure someone drives the loop and sees the queue: wake the driver from its poll,
    /// or the loop's thread from its park.
    fn wake_driver(&self, mut q: MutexGuard<'_, Queue<L::Command>>) {
        // Our command was queued (`queued` stored) before: a caller that stops driving
        // after this read sees it (see the module's notes).
        fence(Ordering::SeqCst);
        if self.driving.load(Ordering::Relaxed) {
            // The driver takes the whole queue each turn: wake it once, and only if it has
            // something to take (busy-polling drivers look anyway).
            if q.woken || q.commands.is_empty() || self.busy_poll {
                return;
            }
            q.woken = true;
            drop(q);
            L::wake(&self.waker);
        } else {
            q.wanted = true;
            drop(q);
            self.cv.notify_one();
        }
    }

    /// The last handle is gone.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut q = lock(&self.queue);
        q.wanted = true;
        drop(q);
        self.cv.notify_one();
        L::wake(&self.waker);
    }

    /// A blocked caller waits for `slot`: drive the loop until it is complete if nobody
    /// else drives; otherwise leave it to the driver (the caller parks on the slot).
    ///
    /// A caller that drives gets its result straight from the loop (`Some`), not through
    /// the slot: it holds the loop from before its result comes until it takes it, so
    /// nobody else sees the hand-over. The slot is then never completed; the loop lets go
    /// of it as completing would. `None`: the result is (or will be) in the slot.
    pub(crate) fn drive_for(&self, slot: &Slot) -> Option<Result<Out, Error>> {
        let mut lp = match self.lp.try_lock() {
            Ok(lp) => lp,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Someone holds the loop: if it is driving, it must see our command; if
                // it is just leaving, the loop's thread takes over.
                let q = lock(&self.queue);
                self.wake_driver(q);
                return None;
            }
        };
        if lp.has_work() {
            // Others' operations are in flight: the loop's thread serves everyone (one
            // driver for many callers; a caller that drove would hand over after its own
            // result anyway).
            drop(lp);
            self.wake_driver(lock(&self.queue));
            return None;
        }
        {
            // Driving from now on, and the queue (our command in it) taken at once: one
            // hold of the queue's lock for both; the first turn takes nothing more.
            let mut q = lock(&self.queue);
            self.driving.store(true, Ordering::Relaxed);
            q.woken = false;
            let (commands, keys) = lp.inbox();
            std::mem::swap(&mut q.commands, commands);
            std::mem::swap(&mut q.keys, keys);
            self.queued.store(false, Ordering::Relaxed);
        }
        lp.aim(slot);
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.run_until(&mut lp, |lp| lp.has_direct() || slot.is_ready())
        }))
        .unwrap_or_else(|_| Err(panicked()));
        if let Err(e) = result {
            lp.shut(e, |into| self.kill(into));
        } else {
            self.stop_driving(&lp);
        }
        lp.take_direct()
    }

    /// Stop driving: if work is left (or queued meanwhile), hand it to the loop's thread.
    /// Without the queue's lock: `driving` cleared, then `queued` read, a `SeqCst` fence
    /// between (a submitter that still saw us driving had queued before: see the module's
    /// notes).
    fn stop_driving(&self, lp: &L) {
        self.driving.store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if lp.wants_loop() || self.queued.load(Ordering::Relaxed) {
            lock(&self.queue).wanted = true;
            self.cv.notify_one();
        }
    }

    /// Drive until `done` (or until the loop has nothing left, when `done` never holds).
    /// The queue was taken as driving began: the first turn runs what it took.
    fn run_until(&self, lp: &mut L, mut done: impl FnMut(&L) -> bool) -> io::Result<()> {
        let mut now = lp.enter()?;
        let mut wake = lp.iterate(|_, _| {}, now);
        while !done(lp) {
            now = lp.wait(now, wake)?;
            wake = lp.iterate(|into, keys| self.take_commands(into, keys), now);
        }
        Ok(())
    }

    /// The loop's own thread: drive while work is left that nobody else drives, park
    /// otherwise; stop once every handle is gone and nothing is in flight.
    fn background(self: Arc<Self>) {
        let mut closing: Option<Instant> = None;
        loop {
            {
                let mut q = lock(&self.queue);
                while !q.wanted && !self.closed.load(Ordering::Acquire) {
                    q = self
                        .cv
                        .wait(q)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                q.wanted = false;
            }
            let mut lp = lock(&self.lp);
            {
                // Under the queue's lock: a submitter that queues after this sees it.
                let _q = lock(&self.queue);
                self.driving.store(true, Ordering::Relaxed);
            }
            let result = catch_unwind(AssertUnwindSafe(|| {
                self.drive_while_wanted(&mut lp, &mut closing)
            }))
            .unwrap_or_else(|_| Err(panicked()));
            match result {
                Ok(true) => {}
                Ok(false) => {
                    let why = io::Error::other("the shared client's loop has stopped");
                    lp.shut(why, |into| self.kill(into));
                    return;
                }
                Err(e) => {
                    lp.shut(e, |into| self.kill(into));
                    return;
                }
            }
        }
    }

    /// Drive until nothing is left to do (`Ok(true)`: park) or the client is closed and
    /// drained (`Ok(false)`: stop).
    fn drive_while_wanted(&self, lp: &mut L, closing: &mut Option<Instant>) -> io::Result<bool> {
        let mut now = lp.enter()?;
        loop {
            if closing.is_none() && self.closed.load(Ordering::Acquire) {
                *closing = Some(now + DRAIN);
            }
            let mut wake = lp.iterate(|into, keys| self.take_commands(into, keys), now);
            if let Some(end) = *closing {
                // Done once nothing is in flight and every release reached its master.
                if (!lp.has_work() && lp.rounds_idle() && !lp.owes_releases()) || now >= end {
                    return Ok(false);
                }
                wake = Some(wake.map_or(end, |w| w.min(end)));
            } else if !lp.wants_loop() {
                let q = lock(&self.queue);
                if q.commands.is_empty() {
                    self.driving.store(false, Ordering::Relaxed);
                    return Ok(true);
                }
            }
            now = lp.wait(now, wake)?;
        }
    }

    /// Move every queued command into `into` (the driver).
    #[inline]
    pub(crate) fn take_commands(&self, into: &mut Vec<L::Command>, keys: &mut KeyStore) {
        if !self.queued.load(Ordering::Relaxed) {
            // Nothing queued (see `queued`): `woken` is clear too.
            return;
        }
        let mut q = lock(&self.queue);
        q.woken = false;
        std::mem::swap(&mut q.commands, into);
        std::mem::swap(&mut q.keys, keys);
        self.queued.store(false, Ordering::Relaxed);
    }

    /// The loop stops: take what is queued, refuse what comes.
    pub(crate) fn kill(&self, into: &mut Vec<L::Command>) {
        let mut q = lock(&self.queue);
        q.dead = true;
        self.driving.store(false, Ordering::Relaxed);
        into.append(&mut q.commands);
        // The commands fail: their keys are not read.
        q.keys.reset();
        self.queued.store(false, Ordering::Relaxed);
    }
}

/// The loop's code panicked (a bug): the loop stops, and every operation in flight or
/// queued fails with this instead of waiting forever.
fn panicked() -> io::Error {
    io::Error::other("the shared client's loop stopped on an internal error (a panic)")
}

/// A command that will never run: its waiter learns why.
pub(crate) fn fail(cmd: Command) {
    let stopped = || {
        Err(Error::Io(io::Error::other(
            "the shared client's loop has stopped",
        )))
    };
    match cmd {
        Command::Lock { slot, .. }
        | Command::Extend { slot, .. }
        | Command::Admin { slot, .. }
        | Command::Stats(slot)
        | Command::Release {
            slot: Some(slot), ..
        } => {
            slot.complete(stopped());
        }
        _ => {}
    }
}
