//! `loom` models of what the shared client's threads share: the completion slot
//! ([`Slot`], [`SlotPool`]) between the loop and a `Pending`, and the hand-over of who
//! drives the loop ([`Hub`]) between callers, the loop's own thread and `close`.
//!
//! Built only with `RUSTFLAGS="--cfg loom"` (then `super::sync` is `loom`'s); every
//! interleaving up to `LOOM_MAX_PREEMPTIONS` preemptions (3 unless set; `.ci/run` uses 2)
//! is run. A target directory of its own keeps the normal builds cached:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --lib shared::loom_tests
//! ```
//!
//! (`--release` runs the interleavings about twice as fast, but builds slower.)
//!
//! A `Pending` holds the whole client, so the models make the same calls on the slot
//! that it makes: [`Slot::wait`] for `wait`, [`Slot::poll`] for `.await`,
//! [`SlotPool::let_go`] once it took its result, [`SlotPool::abandon`] when dropped
//! before. A lost wake-up shows as a deadlock (every thread blocked), which `loom`
//! reports as a failure.
//!
//! The completer wakes at most `FAN_OUT` parked waiters and each waiter it woke wakes as
//! many more (`pending::Handover`); `FAN_OUT` is 1 here, so two waiters already need a
//! wake-up passed on.
//!
//! The hub drives [`FakeLoop`]: the same hand-over code as the shared client's, over a
//! loop with no sockets whose `wait` blocks, like `mio::Poll`, until its waker is woken
//! when nothing it sent is answered yet.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Instant;

use loom::sync::mpsc;

use super::hub::{Drive, Hub};
use super::pending::{Out, Owed, Slot, SlotPool, FAN_OUT};
use super::sync::{lock, thread, Condvar, Mutex};
use super::KeyStore;
use crate::error::Error;

/// Run `f` at every interleaving, with at most 3 preemptions unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise; says how many it ran (`--nocapture`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    b.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let bound = b.preemption_bound.unwrap_or(0);
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    println!("{runs} interleavings (at most {bound} preemptions)");
}

/// A result that says which operation it is for.
fn tagged(tag: u32) -> Result<Out, Error> {
    Err(Error::InvalidArgument(tag.to_string()))
}

/// The tag of a result made by [`tagged`]; `None` for any other (a failure).
fn tag(r: &Result<Out, Error>) -> Option<u32> {
    match r {
        Err(Error::InvalidArgument(t)) => t.parse().ok(),
        _ => None,
    }
}

// The completion slot.

/// The loop completes while a thread waits: the waiter gets the result (no lost wake-up:
/// its thread is registered before or after `complete`, at every point), and the slot is
/// back in the pool for the next operation, clean even while `complete` returns (not
/// ready: a caller would park without driving the loop for its command).
#[test]
fn loom_slot_complete_vs_wait() {
    model(|| {
        let pool = SlotPool::new();
        let slot = pool.take();
        let s = slot.clone();
        let lp = thread::spawn(move || s.complete(tagged(1)).is_none());
        let r = slot.wait();
        assert_eq!(tag(&r), Some(1));
        pool.let_go(&slot);
        let next = pool.take();
        assert!(Arc::ptr_eq(&next, &slot), "both holders let go: reused");
        assert!(
            !next.is_ready(),
            "a reused slot is ready before its operation"
        );
        assert!(
            lp.join().unwrap(),
            "a waiting Pending's result went to the loop"
        );
    });
}

/// The loop completes while a future is polled: after a first poll with another waker
/// (the task moved), the waker of the last poll is the one woken.
#[test]
fn loom_slot_complete_vs_poll() {
    model(|| {
        let pool = SlotPool::new();
        let slot = pool.take();
        let s = slot.clone();
        let lp = thread::spawn(move || s.complete(tagged(1)).is_none());
        let first = slot.poll(&mut Context::from_waker(Waker::noop()));
        let r = match first {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => loom::future::block_on(poll_fn(|cx| slot.poll(cx))),
        };
        assert_eq!(tag(&r), Some(1));
        assert!(
            lp.join().unwrap(),
            "a polled Pending's result came back to the loop"
        );
        pool.let_go(&slot);
        assert!(Arc::ptr_eq(&pool.take(), &slot));
    });
}

/// A `Pending` dropped while the loop completes: the result goes to exactly one of them
/// (the dropping `Pending`, which releases a lock, or the loop, from `complete`), and a
/// slot the loop may still complete is not reused.
#[test]
fn loom_slot_complete_vs_drop() {
    model(|| {
        let pool = SlotPool::new();
        let slot = pool.take();
        let s = slot.clone();
        let lp = thread::spawn(move || s.complete(tagged(1)).map(|r| tag(&r)));
        let to_pending = pool.abandon(&slot).map(|r| tag(&r));
        let to_loop = lp.join().unwrap();
        match (to_pending, to_loop) {
            (Some(Some(1)), None) => {
                assert!(Arc::ptr_eq(&pool.take(), &slot), "let go by both: reused");
            }
            (None, Some(Some(1))) => {
                assert!(
                    !Arc::ptr_eq(&pool.take(), &slot),
                    "a cancel may still name it"
                );
            }
            other => panic!("result delivered to (Pending, loop) = {other:?}, not once"),
        }
    });
}

/// Slot reuse through the pool: operation 1's `Pending` is dropped at any point while
/// the loop completes it, then operation 2 takes a slot from the pool and waits. The loop
/// completes the slots in the order it is sent them. Operation 2 gets its own result,
/// never operation 1's (a slot is not handed out while the loop may still complete it),
/// and operation 1's result goes to exactly one taker.
#[test]
fn loom_slot_reuse_waits_for_every_holder() {
    model(|| {
        let pool = Arc::new(SlotPool::new());
        let (tx, rx) = mpsc::channel::<(Arc<Slot>, u32)>();
        let lp = thread::spawn(move || {
            let mut back = Vec::new();
            for _ in 0..2 {
                let (slot, t) = rx.recv().unwrap();
                if let Some(r) = slot.complete(tagged(t)) {
                    back.push(tag(&r));
                }
            }
            back
        });
        let one = pool.take();
        tx.send((one.clone(), 1)).unwrap();
        let kept = pool.abandon(&one).map(|r| tag(&r));
        let two = pool.take();
        assert!(
            !two.is_ready(),
            "a reused slot is ready before its operation"
        );
        tx.send((two.clone(), 2)).unwrap();
        let r = two.wait();
        assert_eq!(
            tag(&r),
            Some(2),
            "operation 2 got another operation's result"
        );
        pool.let_go(&two);
        let back = lp.join().unwrap();
        let delivered = usize::from(kept.is_some()) + back.len();
        assert_eq!(
            delivered, 1,
            "operation 1's result: Pending {kept:?}, loop {back:?}"
        );
    });
}

/// The pool's first slot is taken and given back without a lock: two callers at once
/// never hold the same slot, and each gets its own operation's result from the slot it
/// holds (one may take the first slot just given back by the other, or a spare one).
#[test]
fn loom_pool_first_slot_one_holder_at_a_time() {
    model(|| {
        let pool = Arc::new(SlotPool::new());
        let caller = |pool: Arc<SlotPool>, t: u32| {
            let slot = pool.take();
            assert!(
                !slot.is_ready(),
                "a taken slot is ready before its operation"
            );
            // The loop's part (it lets go as it completes), then the caller's.
            assert!(slot.complete(tagged(t)).is_none());
            assert_eq!(tag(&slot.wait()), Some(t), "another operation's result");
            pool.let_go(&slot);
        };
        let p = pool.clone();
        let other = thread::spawn(move || caller(p, 2));
        caller(pool.clone(), 1);
        other.join().unwrap();
        caller(pool, 3);
    });
}

// Passing wake-ups on (`pending::Handover`).

/// The loop completes two parked waiters in one turn and pays its wake-ups after the turn:
/// it wakes one (`FAN_OUT`), which wakes the other before it returns. Both get their
/// results whether each was parked, about to park, or not registered yet when its slot
/// was completed (no lost wake-up).
#[test]
fn loom_handover_passes_wake_ups_on() {
    assert_eq!(FAN_OUT, 1, "the models pass every wake-up on");
    model(|| {
        let pool = SlotPool::new();
        let (a, b) = (pool.take(), pool.take());
        let (a2, b2) = (a.clone(), b.clone());
        let lp = thread::spawn(move || {
            let mut owed = Owed::default();
            assert!(a2.complete_later(tagged(1), &mut owed).is_none());
            assert!(b2.complete_later(tagged(2), &mut owed).is_none());
            owed.pay();
        });
        let waiter = thread::spawn(move || tag(&b.wait()));
        assert_eq!(tag(&a.wait()), Some(1));
        assert_eq!(waiter.join().unwrap(), Some(2));
        lp.join().unwrap();
    });
}

/// A waiter's slot goes back to the pool and serves its next operation while another
/// waiter's wake-up is still to be passed on, and the loop completes the operations one
/// turn each in the order sent: each waiter gets its own results, and nobody is left
/// parked (an entry of a reused slot whose new operation is not complete is skipped, not
/// taken for a wake-up).
#[test]
fn loom_handover_with_a_reused_slot() {
    model(|| {
        let pool = Arc::new(SlotPool::new());
        let (tx, rx) = mpsc::channel::<(Arc<Slot>, u32)>();
        let lp = thread::spawn(move || {
            let mut owed = Owed::default();
            for _ in 0..3 {
                let (slot, t) = rx.recv().unwrap();
                assert!(slot.complete_later(tagged(t), &mut owed).is_none());
                owed.pay();
            }
        });
        let (p, tx2) = (pool.clone(), tx.clone());
        let other = thread::spawn(move || {
            let slot = p.take();
            tx2.send((slot.clone(), 3)).unwrap();
            let r = tag(&slot.wait());
            p.let_go(&slot);
            r
        });
        for t in 1..=2 {
            let slot = pool.take();
            tx.send((slot.clone(), t)).unwrap();
            assert_eq!(tag(&slot.wait()), Some(t));
            pool.let_go(&slot);
        }
        assert_eq!(other.join().unwrap(), Some(3));
        lp.join().unwrap();
    });
}

// The hand-over of who drives.

/// What a model's handles queue; each completes its slot with its tag.
enum Cmd {
    /// Answered by the wait after the turn that sent it.
    Op(Arc<Slot>, u32),
    /// A lock that waits for a release: done only once some `Free` was answered. Until
    /// then the loop has work, and its `wait` blocks until the waker is woken.
    Waits(Arc<Slot>, u32),
    /// A release: answered like `Op`, and it frees every `Waits`.
    Free(Arc<Slot>, u32),
}

impl Cmd {
    /// Complete at once (a command that fails outside the loop).
    fn done(self, r: impl FnOnce(u32) -> Result<Out, Error>) {
        let (Cmd::Op(slot, t) | Cmd::Waits(slot, t) | Cmd::Free(slot, t)) = self;
        let back = slot.complete(r(t));
        assert!(back.is_none(), "no model drops a Pending");
    }

    /// Complete from the loop, its wake-ups paid after the turn (as `Loop` does).
    fn done_later(self, r: impl FnOnce(u32) -> Result<Out, Error>, owed: &mut Owed) {
        let (Cmd::Op(slot, t) | Cmd::Waits(slot, t) | Cmd::Free(slot, t)) = self;
        let back = slot.complete_later(r(t), owed);
        assert!(back.is_none(), "no model drops a Pending");
    }
}

fn stopped(_: u32) -> Result<Out, Error> {
    Err(Error::Io(io::Error::other("stopped")))
}

/// The loop's `mio::Waker` and the part of its poll the waker reaches: a wake-up is
/// latched until a `wait` returns (an edge-triggered eventfd's event is reported once).
#[derive(Default)]
struct Poll {
    woken: Mutex<bool>,
    cv: Condvar,
}

/// A loop without sockets.
struct FakeLoop {
    poll: Arc<Poll>,
    /// The fixed start of time: time moves only to the deadlines `wait` is given.
    t0: Instant,
    inbox: Vec<Cmd>,
    /// The keys of keyed commands (none here), swapped with the queue's as the shared
    /// client's loop does.
    keys: KeyStore,
    /// Sent, not answered yet.
    sent: Vec<Cmd>,
    /// Answered by the last wait, for the next turn to deliver.
    answered: Vec<Cmd>,
    /// `Waits` answered, not freed yet.
    waiting: Vec<Cmd>,
    freed: bool,
    /// Wake-ups of parked waiters, paid at the end of each turn.
    owed: Owed,
    /// The slot of the caller driving for its result (see `Loop::aim`), and that result.
    aimed: usize,
    direct: Option<Result<Out, Error>>,
}

impl FakeLoop {
    fn new(poll: Arc<Poll>) -> FakeLoop {
        FakeLoop {
            poll,
            t0: Instant::now(),
            inbox: Vec::new(),
            keys: KeyStore::default(),
            sent: Vec::new(),
            answered: Vec::new(),
            waiting: Vec::new(),
            freed: false,
            owed: Owed::default(),
            aimed: 0,
            direct: None,
        }
    }
}

impl FakeLoop {
    /// Complete `cmd`: to the aimed caller directly (as `Loop::complete` does), or
    /// through its slot.
    fn complete(&mut self, cmd: Cmd) {
        let (Cmd::Op(slot, t) | Cmd::Waits(slot, t) | Cmd::Free(slot, t)) = &cmd;
        if Arc::as_ptr(slot) as usize == self.aimed {
            self.aimed = 0;
            slot.let_go_unfilled();
            self.direct = Some(tagged(*t));
            return;
        }
        cmd.done_later(tagged, &mut self.owed);
    }
}

impl Drive for FakeLoop {
    type Command = Cmd;
    type Waker = Arc<Poll>;

    fn wake(poll: &Arc<Poll>) {
        *lock(&poll.woken) = true;
        poll.cv.notify_one();
    }

    fn fail(cmd: Cmd) {
        cmd.done(stopped);
    }

    fn enter(&mut self) -> io::Result<Instant> {
        Ok(self.t0)
    }

    fn iterate(
        &mut self,
        take: impl FnOnce(&mut Vec<Cmd>, &mut KeyStore),
        _now: Instant,
    ) -> Option<Instant> {
        take(&mut self.inbox, &mut self.keys);
        let mut answered = std::mem::take(&mut self.answered);
        for cmd in answered.drain(..) {
            match cmd {
                Cmd::Waits(..) => self.waiting.push(cmd),
                Cmd::Free(..) => {
                    self.freed = true;
                    self.complete(cmd);
                }
                Cmd::Op(..) => self.complete(cmd),
            }
        }
        self.answered = answered;
        if self.freed {
            let mut waiting = std::mem::take(&mut self.waiting);
            for cmd in waiting.drain(..) {
                self.complete(cmd);
            }
            self.waiting = waiting;
        }
        self.sent.append(&mut self.inbox);
        self.owed.pay();
        None
    }

    fn inbox(&mut self) -> (&mut Vec<Cmd>, &mut KeyStore) {
        (&mut self.inbox, &mut self.keys)
    }

    fn aim(&mut self, slot: &Slot) {
        self.aimed = slot as *const Slot as usize;
    }

    fn has_direct(&self) -> bool {
        self.direct.is_some()
    }

    fn take_direct(&mut self) -> Option<Result<Out, Error>> {
        self.aimed = 0;
        self.direct.take()
    }

    fn wait(&mut self, now: Instant, wake: Option<Instant>) -> io::Result<Instant> {
        let mut woken = lock(&self.poll.woken);
        if self.sent.is_empty() {
            while !*woken {
                if let Some(t) = wake {
                    return Ok(t);
                }
                woken = self.poll.cv.wait(woken).unwrap();
            }
        }
        *woken = false;
        drop(woken);
        self.answered.append(&mut self.sent);
        Ok(now)
    }

    fn has_work(&self) -> bool {
        !(self.sent.is_empty() && self.answered.is_empty() && self.waiting.is_empty())
    }

    fn wants_loop(&self) -> bool {
        self.has_work()
    }

    fn rounds_idle(&self) -> bool {
        true
    }

    /// A release is answered in the turn after it is sent (`has_work` until then).
    fn owes_releases(&self) -> bool {
        false
    }

    fn shut(&mut self, _why: io::Error, kill: impl FnOnce(&mut Vec<Cmd>)) {
        kill(&mut self.inbox);
        let all = [
            &mut self.inbox,
            &mut self.sent,
            &mut self.answered,
            &mut self.waiting,
        ];
        for cmds in all {
            for cmd in cmds.drain(..) {
                cmd.done_later(stopped, &mut self.owed);
            }
        }
        self.owed.pay();
    }
}

/// What `Pending::wait` does: drive the loop for its slot if nobody else does (then the
/// result comes straight from the loop), or park until the result is in the slot.
fn wait_out(hub: &Hub<FakeLoop>, slot: &Slot) -> Option<u32> {
    if !slot.is_ready() {
        if let Some(r) = hub.drive_for(slot) {
            return tag(&r);
        }
    }
    tag(&slot.wait())
}

/// What `.await` on a `Pending` does: kick the loop once, then poll until the result is in.
fn await_out(hub: &Hub<FakeLoop>, slot: &Slot) -> Option<u32> {
    hub.kick();
    tag(&loom::future::block_on(poll_fn(|cx| slot.poll(cx))))
}

fn start() -> (Arc<Hub<FakeLoop>>, thread::JoinHandle<()>) {
    let poll = Arc::new(Poll::default());
    Hub::launch(FakeLoop::new(poll.clone()), poll, false).expect("a model thread")
}

/// A caller queues a lock that waits for a release and waits for it on its thread (so
/// drives the loop itself, or leaves it to whoever drives), while a guard's release comes
/// from another thread: whoever drives takes the release (a driver blocked in its poll is
/// woken), the caller gets its lock, and the loop's thread ends after `close`.
#[test]
fn loom_hub_caller_drives_while_a_release_comes() {
    model(|| {
        let (hub, background) = start();
        let pool = Arc::new(SlotPool::new());
        let (h, p) = (hub.clone(), pool.clone());
        let caller = thread::spawn(move || {
            let slot = p.take();
            h.submit(Cmd::Waits(slot.clone(), 1), false);
            let r = wait_out(&h, &slot);
            p.let_go(&slot);
            r
        });
        let release = pool.take();
        hub.submit(Cmd::Free(release.clone(), 2), true);
        assert_eq!(caller.join().unwrap(), Some(1));
        hub.close();
        background.join().unwrap();
        assert!(
            release.is_ready(),
            "a release was left with nobody to run it"
        );
        assert_eq!(tag(&release.wait()), Some(2));
    });
}

/// A caller's two operations one after the other, each waited for on its thread (so
/// mostly driven by the caller, its result handed over directly), while a guard's
/// release comes from another thread: each gets its own result, and the slot of the
/// first, let go by both holders whichever way its result came, is the one the second
/// operation takes from the pool.
#[test]
fn loom_hub_direct_results_and_slot_reuse() {
    model(|| {
        let (hub, background) = start();
        let pool = Arc::new(SlotPool::new());
        let (h, p) = (hub.clone(), pool.clone());
        let caller = thread::spawn(move || {
            let first = p.take();
            h.submit(Cmd::Op(first.clone(), 1), false);
            let a = wait_out(&h, &first);
            p.let_go(&first);
            let second = p.take();
            assert!(Arc::ptr_eq(&first, &second), "the first slot went back");
            h.submit(Cmd::Op(second.clone(), 2), false);
            let b = wait_out(&h, &second);
            p.let_go(&second);
            (a, b)
        });
        let release = SlotPool::new().take();
        hub.submit(Cmd::Free(release.clone(), 3), true);
        assert_eq!(caller.join().unwrap(), (Some(1), Some(2)));
        hub.close();
        background.join().unwrap();
        assert_eq!(tag(&release.wait()), Some(3));
    });
}

/// Two callers at once, each waiting on its thread, and nothing else (no release, no
/// `close` before both have their results, which would run a command left behind): one
/// drives, the other queues while it does (or while it stops) and finds the loop held.
/// The driver stops without the queue's lock (`driving` cleared, a `SeqCst` fence, then
/// `queued` read); the other reads `driving` after queuing and a fence. Whichever way they
/// interleave, the command queued is run by the driver, handed by it to the loop's
/// thread, or driven by its own caller, and each gets its own result (a command left
/// behind shows as a deadlock: so it does when the stop reads `queued` before clearing
/// `driving`, or without its fence).
#[test]
fn loom_hub_two_waiting_callers() {
    model(|| {
        let (hub, background) = start();
        let pool = Arc::new(SlotPool::new());
        let (h, p) = (hub.clone(), pool.clone());
        let other = thread::spawn(move || {
            let slot = p.take();
            h.submit(Cmd::Op(slot.clone(), 2), false);
            let r = wait_out(&h, &slot);
            p.let_go(&slot);
            r
        });
        let slot = pool.take();
        hub.submit(Cmd::Op(slot.clone(), 1), false);
        assert_eq!(wait_out(&hub, &slot), Some(1));
        pool.let_go(&slot);
        assert_eq!(other.join().unwrap(), Some(2));
        hub.close();
        background.join().unwrap();
    });
}

/// Two callers at once, one waiting on its thread and one awaiting a future, while a
/// release is queued with a wake-up: every command is taken by some driver and each
/// caller gets its own result.
#[test]
fn loom_hub_a_waiter_and_a_future() {
    model(|| {
        let (hub, background) = start();
        let pool = Arc::new(SlotPool::new());
        let (h, p) = (hub.clone(), pool.clone());
        let waiter = thread::spawn(move || {
            let slot = p.take();
            h.submit(Cmd::Op(slot.clone(), 1), false);
            wait_out(&h, &slot)
        });
        let (h, p) = (hub.clone(), pool.clone());
        let task = thread::spawn(move || {
            let slot = p.take();
            h.submit(Cmd::Waits(slot.clone(), 2), false);
            await_out(&h, &slot)
        });
        let release = pool.take();
        hub.submit(Cmd::Free(release.clone(), 3), true);
        assert_eq!(waiter.join().unwrap(), Some(1));
        assert_eq!(task.join().unwrap(), Some(2));
        hub.close();
        background.join().unwrap();
        assert!(
            release.is_ready(),
            "a release was left with nobody to run it"
        );
    });
}

/// Commands queued with a wake-up and nobody waiting (a dropped guard's release, a lock
/// nobody will free) while the loop's thread parks and `close` comes: the loop's thread
/// runs the release, gives up the lock at the end of the drain, then stops; a command
/// after that fails at once.
#[test]
fn loom_hub_close_drains() {
    model(|| {
        let (hub, background) = start();
        let pool = Arc::new(SlotPool::new());
        let (release, stuck) = (pool.take(), pool.take());
        let h = hub.clone();
        let (r, s) = (release.clone(), stuck.clone());
        let guard = thread::spawn(move || {
            h.submit(Cmd::Op(r, 1), true);
            h.submit(Cmd::Waits(s, 2), true);
        });
        guard.join().unwrap();
        hub.close();
        background.join().unwrap();
        assert!(
            release.is_ready() && stuck.is_ready(),
            "left with nobody to run it"
        );
        assert_eq!(
            tag(&release.wait()),
            Some(1),
            "a release queued before close ran"
        );
        assert_eq!(
            tag(&stuck.wait()),
            None,
            "a lock still waiting at the end fails"
        );
        let late = pool.take();
        hub.submit(Cmd::Op(late.clone(), 3), true);
        assert!(
            late.is_ready(),
            "a command for a stopped loop fails at once"
        );
        assert_eq!(tag(&late.wait()), None);
    });
}
