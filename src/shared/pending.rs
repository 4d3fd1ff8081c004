//! [`Pending`]: an operation submitted to the shared client's loop, awaited as a future or
//! waited for on a thread; and the completion slot the loop fills.

use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::state::LockState;
use super::sync::{lock, thread, AtomicBool, AtomicU32, Mutex, Ordering};
use super::{Command, Inner};
use crate::error::Error;
use crate::inspect::{ForcedRelease, Inspection};
use crate::stats::MasterStats;

/// What the loop hands back.
pub(crate) enum Out {
    /// A lock: its state, to become a [`LockGuard`](crate::LockGuard) in the caller's hands.
    Lock(Arc<LockState>),
    /// A release or an extend went through.
    Unit,
    /// The masters' statistics.
    Stats(Vec<MasterStats>),
    /// What the masters hold for a resource.
    Inspection(Box<Inspection>),
    /// What a forced release deleted.
    Forced(Box<ForcedRelease>),
}

/// Where the loop puts an operation's result and whom it wakes.
///
/// Slots are pooled ([`SlotPool`]): an operation's slot is reused once both of its
/// holders, the [`Pending`] and the loop, are done with it (no allocation per operation).
pub(crate) struct Slot {
    /// Set (after the result is stored) when the result is in: a cheap check to spin on.
    ready: AtomicBool,
    /// Holders that have not let go yet (see [`SlotPool::let_go`]).
    holders: AtomicU32,
    state: Mutex<SlotState>,
    /// Where a completed slot whose thread is parked waits for its wake-up.
    hand: Arc<Handover>,
}

#[derive(Default)]
struct SlotState {
    result: Option<Result<Out, Error>>,
    waker: Option<Waker>,
    /// The thread parked in [`Slot::wait`]; taken only by [`Handover::forward`] (once the
    /// result is in), which wakes it and so hands it the next wake-ups.
    thread: Option<thread::Thread>,
    /// Nobody will take the result: the `Pending` was dropped first.
    dropped: bool,
}

impl Slot {
    /// Whether the result is in.
    #[inline]
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn new(holders: u32, hand: Arc<Handover>) -> Arc<Slot> {
        Arc::new(Slot {
            ready: AtomicBool::new(false),
            holders: AtomicU32::new(holders),
            state: Mutex::new(SlotState::default()),
            hand,
        })
    }

    /// Ready for another operation with `holders` holders.
    ///
    /// INVARIANT (a slot comes back clean): a slot goes back to the pool with its state
    /// as new, so that only the two atomics are reset here, without the lock: its result
    /// was taken (by [`Slot::wait`], [`Slot::poll`] or [`SlotPool::abandon`]) or never
    /// stored (a result handed over directly), whoever took it also took the future's
    /// waker and the parked thread (or found none), and a slot marked `dropped` is never
    /// let go by its `Pending`, so never comes back. Every write to the state happened
    /// before the last holder let go, which happened before the pool handed it out again
    /// (its mutex, or for the pool's first slot the count of holders: the last one's
    /// release, the taker's acquire).
    fn reset(&self, holders: u32) {
        self.check_clean();
        self.ready.store(false, Ordering::Relaxed);
        self.holders.store(holders, Ordering::Relaxed);
    }

    /// The INVARIANT of [`Slot::reset`], checked in debug builds.
    fn check_clean(&self) {
        #[cfg(debug_assertions)]
        {
            let st = lock(&self.state);
            debug_assert!(
                st.result.is_none() && st.waker.is_none() && st.thread.is_none() && !st.dropped,
                "a slot came back to the pool with its state not clean"
            );
        }
    }

    /// The waiter took its result another way ([`Pending`]'s direct hand-over) after a
    /// poll that may have left a waker: the slot is made clean for the pool.
    pub(crate) fn clear_waker(&self) {
        let waker = lock(&self.state).waker.take();
        drop(waker);
    }

    /// Store the result and wake whoever waits. Returns it back when the `Pending` is
    /// gone (then the loop deals with it: a lock is released).
    ///
    /// Completing is the loop's last touch of the slot: it lets go here, under the lock,
    /// before the `Pending` can see the result, so the `Pending` is always the last holder
    /// and puts the slot back itself (its next operation finds it in the pool). A slot
    /// whose `Pending` was dropped first is never let go (a queued cancel may still name
    /// it).
    pub(crate) fn complete(
        self: &Arc<Self>,
        result: Result<Out, Error>,
    ) -> Option<Result<Out, Error>> {
        let mut owed = Owed::default();
        let back = self.complete_later(result, &mut owed);
        owed.pay();
        back
    }

    /// [`Slot::complete`], except that a parked thread is not woken here: the slot joins
    /// its [`Handover`], and the wake-up that starts it, when one is needed, is left in
    /// `owed` for the caller to [`Owed::pay`] (the loop pays once per turn, after its
    /// writes: its requests go out before any waiter runs, and it wakes at most
    /// [`FAN_OUT`] threads per turn however many results it hands over).
    pub(crate) fn complete_later(
        self: &Arc<Self>,
        result: Result<Out, Error>,
        owed: &mut Owed,
    ) -> Option<Result<Out, Error>> {
        let mut st = lock(&self.state);
        if st.dropped {
            return Some(result);
        }
        self.holders.fetch_sub(1, Ordering::AcqRel);
        st.result = Some(result);
        self.ready.store(true, Ordering::Release);
        let waker = st.waker.take();
        let parked = st.thread.is_some();
        drop(st);
        if let Some(w) = waker {
            super::wake(w);
        }
        if parked {
            self.hand.queue(self.clone());
            owed.add(&self.hand);
        }
        None
    }

    /// The loop handed this slot's result to its waiter directly (the caller that drove
    /// the loop for it, see `Hub::drive_for`): it lets go as [`Slot::complete`] would, the
    /// slot left unfilled (its waiter never looks).
    pub(crate) fn let_go_unfilled(&self) {
        self.holders.fetch_sub(1, Ordering::AcqRel);
    }

    /// Block the calling thread until the result is in, and take it.
    ///
    /// The thread is registered under the lock that [`Slot::complete`] stores the result
    /// under: either the result is seen here, or the completer finds the thread and
    /// queues the slot in its [`Handover`]. A thread woken from there (its registration
    /// taken) wakes the next ones before it returns.
    ///
    /// It parks at once, without spinning first. A result takes a round trip to the
    /// masters, and on a machine whose cores the masters share, a spin uses CPU that they
    /// and the loop need. Measured with 64 threads on 2 cores (`examples/shared_cycles.rs`
    /// in threads mode, 2026-11-28): with or without a spin, every operation still parked
    /// (2.00 voluntary context switches per cycle). Spinning up to 200 `spin_loop`s took
    /// the callers from 9.6-11.1 to 19-20 µs of CPU per cycle and throughput from about
    /// 55k to 42k cycles/s. With 2,000 spins it was 101 µs and 12.5k. What a blocked
    /// thread costs here is one park and one wake per operation: a ring of 64 threads
    /// passing a token with park/unpark takes 3.4-4.8 µs of CPU per hand-off on the same
    /// machine, and a cycle is two operations.
    pub(crate) fn wait(&self) -> Result<Out, Error> {
        let mut st = lock(&self.state);
        let mut registered = false;
        loop {
            if let Some(r) = st.result.take() {
                // Registered and no longer: a `forward` took it (and woke us, or will):
                // the wake-ups queued after ours are ours to pass on.
                let woken = registered && st.thread.is_none();
                st.thread = None;
                // A waker of an earlier poll (the slot goes back to the pool clean).
                let waker = st.waker.take();
                drop(st);
                drop(waker);
                if woken {
                    self.hand.forward();
                }
                return r;
            }
            if st.thread.is_none() {
                st.thread = Some(thread::current());
                registered = true;
            }
            drop(st);
            thread::park();
            st = lock(&self.state);
        }
    }

    /// Take the result if it is in; otherwise leave `cx`'s waker for [`Slot::complete`]
    /// (under the same lock, so a completion in between is never missed).
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<Out, Error>> {
        let mut st = lock(&self.state);
        if let Some(r) = st.result.take() {
            // Not needed any more (the slot goes back to the pool clean); dropped outside
            // the lock.
            let waker = st.waker.take();
            drop(st);
            drop(waker);
            return Poll::Ready(r);
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// How many parked waiters a wake-up passes on: each thread woken from a [`Handover`]
/// wakes this many more before it returns, so the waiters of one loop turn are woken as a
/// tree (64 in 2 steps), on the callers' CPUs, and the loop wakes at most this many.
/// Measured with 64 threads (`examples/shared_cycles.rs`, 2026-11-27): 2, 4, 8 and 16
/// all took the loop's thread from ~8 to ~3.5 µs of CPU per cycle; 8 gave the least
/// client and masters' CPU in two runs (the noise is as large as the differences), and
/// a shallow tree keeps a caller that runs late from delaying many others.
#[cfg(not(all(test, loom)))]
pub(crate) const FAN_OUT: usize = 8;
/// One in the model tests: two waiters already need a wake-up passed on.
#[cfg(all(test, loom))]
pub(crate) const FAN_OUT: usize = 1;

/// The completed slots of one client whose threads are parked, in completion order,
/// waiting to be woken: the completer wakes the first [`FAN_OUT`] ([`Owed::pay`]), and
/// every waiter woken from here wakes as many more ([`Slot::wait`] passes wake-ups on).
///
/// Why: a futex wake costs the waker a system call and often an inter-processor
/// interrupt, and a woken caller preempts the loop's thread; 64 threads woken one by one
/// by the loop made it spend most of its time waking (`benches/README.md`).
///
/// INVARIANT (no lost wake-up): whenever the list holds a slot, someone owes a
/// [`Handover::forward`]: a completer that queued and has not paid yet, or a thread whose
/// registration a `forward` took (it was parked in [`Slot::wait`] with its result in, so
/// it returns, forwarding first). A `forward` pops until it has woken [`FAN_OUT`]
/// threads or the list is empty, so the debt passes on or ends with the list.
/// Stale entries (the waiter saw its result on its own, or the slot was reused for an
/// operation not complete yet) are skipped: a registration is taken only with the result
/// in. An entry holds its slot, which holds the handover: by the invariant the list is
/// empty once nobody waits, so that cycle of references does not outlive the client.
pub(crate) struct Handover {
    parked: Mutex<VecDeque<Arc<Slot>>>,
}

impl Handover {
    fn new() -> Handover {
        Handover {
            parked: Mutex::new(VecDeque::with_capacity(64)),
        }
    }

    /// Queue `slot` (its result in, its thread parked); the caller owes a
    /// [`Handover::forward`].
    fn queue(&self, slot: Arc<Slot>) {
        lock(&self.parked).push_back(slot);
    }

    /// Wake up to [`FAN_OUT`] queued threads whose result is in.
    pub(crate) fn forward(&self) {
        let mut woken = 0;
        while woken < FAN_OUT {
            let Some(slot) = lock(&self.parked).pop_front() else {
                return;
            };
            let mut st = lock(&slot.state);
            let thread = if st.result.is_some() {
                st.thread.take()
            } else {
                None
            };
            drop(st);
            if let Some(t) = thread {
                t.unpark();
                woken += 1;
            }
        }
    }
}

/// Wake-ups a completer owes ([`Slot::complete_later`]); paid with [`Owed::pay`]. Once it
/// has seen a [`Handover`] it keeps it, and every `pay` also passes on what is queued
/// there: a waiter that was woken but runs late (preempted, a low priority) delays the
/// ones after it by at most one turn of a running loop.
#[derive(Default)]
pub(crate) struct Owed {
    hand: Option<Arc<Handover>>,
}

impl Owed {
    fn add(&mut self, hand: &Arc<Handover>) {
        if self.hand.is_none() {
            self.hand = Some(hand.clone());
        }
    }

    /// Wake the first [`FAN_OUT`] of what is queued (they pass the rest on).
    #[inline]
    pub(crate) fn pay(&self) {
        if let Some(h) = &self.hand {
            h.forward();
        }
    }
}

/// Spare completion slots, shared by the handles and the loop.
///
/// A slot has two holders while its operation is queued or in flight: the [`Pending`] and
/// whoever completes it (the loop). The completer lets go in [`Slot::complete`], the
/// `Pending` in [`SlotPool::let_go`] when dropped; the last one puts it back. A holder
/// that does not let go (a `Pending` dropped before its result, whose slot a queued cancel
/// still names) only costs the slot its reuse: it is freed like any `Arc`.
pub(crate) struct SlotPool {
    /// The pool's own slot, never in `spare`: free while nobody holds it (its holders at
    /// 0), taken by whoever turns that 0 into 2, given back by the last holder's let-go,
    /// no lock either way. A client whose operations do not overlap (one caller at a
    /// time, each operation waited for before the next) uses only this one; the others
    /// come from `spare`.
    first: Arc<Slot>,
    spare: Mutex<Vec<Arc<Slot>>>,
    /// The client's parked waiters (every slot of the pool queues there).
    hand: Arc<Handover>,
}

/// Spare slots kept at most (more are freed).
const MAX_SPARE_SLOTS: usize = 1024;

impl SlotPool {
    pub(crate) fn new() -> SlotPool {
        let hand = Arc::new(Handover::new());
        SlotPool {
            first: Slot::new(0, hand.clone()),
            spare: Mutex::new(Vec::with_capacity(64)),
            hand,
        }
    }

    /// A slot for an operation (held by its `Pending` and by whoever completes it).
    pub(crate) fn take(&self) -> Arc<Slot> {
        let holders = 2;
        // Acquire: whatever its last holders wrote happened before (see `let_go`).
        if self
            .first
            .holders
            .compare_exchange(0, holders, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            self.first.check_clean();
            self.first.ready.store(false, Ordering::Relaxed);
            return self.first.clone();
        }
        let spare = lock(&self.spare).pop();
        match spare {
            Some(slot) => {
                slot.reset(holders);
                slot
            }
            None => Slot::new(holders, self.hand.clone()),
        }
    }

    /// The `Pending` is done with `slot` (it will not touch it again); the last holder
    /// puts it back (the pool's first slot is back once its holders are 0).
    pub(crate) fn let_go(&self, slot: &Arc<Slot>) {
        if slot.holders.fetch_sub(1, Ordering::AcqRel) != 1 || Arc::ptr_eq(slot, &self.first) {
            return;
        }
        let mut spare = lock(&self.spare);
        if spare.len() < MAX_SPARE_SLOTS {
            spare.push(slot.clone());
        }
    }

    /// A `Pending` is dropped without having taken its result. If the result is in, it
    /// is returned (the `Pending` deals with it: a lock is released) and the slot let go.
    /// Otherwise the slot is marked so that [`Slot::complete`] hands the result back to
    /// the loop, and it is not let go: a queued cancel may still name it.
    pub(crate) fn abandon(&self, slot: &Arc<Slot>) -> Option<Result<Out, Error>> {
        let mut st = lock(&slot.state);
        let result = st.result.take();
        let waker = if result.is_none() {
            st.dropped = true;
            None
        } else {
            // Let go below: the slot goes back to the pool clean.
            st.waker.take()
        };
        drop(st);
        drop(waker);
        if result.is_some() {
            self.let_go(slot);
        }
        result
    }
}

/// An operation of the shared client ([`crate::SharedRedlock`]) on its way: `.await` it
/// from async code (any executor; only `std::task::Waker` is used), or [`Pending::wait`]
/// for it on a thread.
///
/// The operation is queued when the `Pending` is made and runs no later than when it is
/// first awaited or waited for (earlier if the loop runs for others meanwhile): make
/// several, then wait for each, and they go out together. A thread that waits drives the
/// loop itself when nobody else does, so one caller pays no hand-off between threads.
///
/// Dropping it before it completes cancels it: a lock attempt in flight is abandoned (its
/// partial lock released), and a lock granted after the drop is released by the loop. No
/// lock is ever granted to nobody. A release or an extend that was already sent goes on.
///
/// ```
/// # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let local = redlock_mux::local::LocalMasters::start(3)?;
/// # let urls = local.urls();
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
/// # rt.block_on(async {
/// use std::time::Duration;
/// use redlock_mux::Redlock;
///
/// let redlock = Redlock::builder().masters(&urls).build_shared()?;
/// let ttl = Duration::from_secs(5);
/// // Made together, sent together (one write per master), awaited one by one.
/// let a = redlock.try_lock("sku:1", ttl);
/// let b = redlock.try_lock("sku:2", ttl);
/// let (a, b) = (a.await?, b.await?);
/// // A Pending dropped unawaited cancels its operation: nothing is left behind.
/// drop(redlock.lock("sku:3", ttl));
/// // A bound on the wait: the timeout drops the Pending, and so cancels the attempt.
/// let c = tokio::time::timeout(Duration::from_millis(50), redlock.lock("sku:1", ttl)).await;
/// assert!(c.is_err(), "sku:1 is still held by `a`");
/// a.release().await?;
/// b.release().await?;
/// # Ok::<(), redlock_mux::Error>(()) })?;
/// # Ok(()) }
/// # #[cfg(not(feature = "local"))] fn main() {}
/// ```
#[must_use = "an operation does nothing useful unless awaited or waited for; dropping it cancels it"]
pub struct Pending<T> {
    pub(crate) inner: Arc<Inner>,
    slot: Arc<Slot>,
    taken: bool,
    /// Polled at least once: the loop was told to run.
    kicked: bool,
    _out: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("ready", &self.slot.ready.load(Ordering::Relaxed))
            .finish()
    }
}

/// How long a waiting caller of a busy-polling client spins before it parks.
const SPIN: Duration = Duration::from_micros(100);

impl<T> Pending<T> {
    pub(crate) fn new(inner: Arc<Inner>, slot: Arc<Slot>) -> Self {
        Pending {
            inner,
            slot,
            taken: false,
            kicked: false,
            _out: PhantomData,
        }
    }

    /// A `Pending` that is complete already (an argument error, found before anything was
    /// sent).
    pub(crate) fn ready(inner: Arc<Inner>, result: Result<Out, Error>) -> Self {
        let slot = inner.slots.take();
        slot.complete(result);
        Pending::new(inner, slot)
    }

    /// Block the calling thread until the result is in: drive the loop on this thread if
    /// nobody else does (no hand-off), otherwise park until the driver has it.
    pub(crate) fn wait_out(&mut self) -> Result<Out, Error> {
        if !self.slot.is_ready() {
            if let Some(r) = self.inner.hub().drive_for(&self.slot) {
                if self.kicked {
                    // Polled before: its waker must not come back to the pool with it.
                    self.slot.clear_waker();
                }
                self.taken = true;
                return r;
            }
        }
        if self.inner.busy_poll {
            let until = Instant::now() + SPIN;
            // Yield rather than spin: the driver and the masters may need this core.
            while !self.slot.is_ready() && Instant::now() < until {
                std::thread::yield_now();
            }
        }
        let r = self.slot.wait();
        self.taken = true;
        r
    }

    pub(crate) fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<Out, Error>> {
        if !self.kicked {
            self.kicked = true;
            self.inner.hub().kick();
        }
        let r = self.slot.poll(cx);
        if r.is_ready() {
            self.taken = true;
        }
        r
    }
}

impl Pending<()> {
    /// Block the calling thread until the operation is done.
    pub fn wait(mut self) -> Result<(), Error> {
        self.wait_out().map(|_| ())
    }
}

impl Pending<Vec<MasterStats>> {
    /// Block the calling thread until the statistics are in.
    pub fn wait(mut self) -> Result<Vec<MasterStats>, Error> {
        self.wait_out().map(stats)
    }
}

fn stats(out: Out) -> Vec<MasterStats> {
    match out {
        Out::Stats(s) => s,
        _ => unreachable!("a statistics request completes with statistics"),
    }
}

impl Future for Pending<Vec<MasterStats>> {
    type Output = Result<Vec<MasterStats>, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_out(cx).map(|r| r.map(stats))
    }
}

impl Pending<Inspection> {
    /// Block the calling thread until every master answered (or timed out).
    pub fn wait(mut self) -> Result<Inspection, Error> {
        self.wait_out().map(inspection)
    }
}

fn inspection(out: Out) -> Inspection {
    match out {
        Out::Inspection(i) => *i,
        _ => unreachable!("an inspection completes with an inspection"),
    }
}

impl Future for Pending<Inspection> {
    type Output = Result<Inspection, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_out(cx).map(|r| r.map(inspection))
    }
}

impl Pending<ForcedRelease> {
    /// Block the calling thread until every master answered (or timed out).
    pub fn wait(mut self) -> Result<ForcedRelease, Error> {
        self.wait_out().map(forced)
    }
}

fn forced(out: Out) -> ForcedRelease {
    match out {
        Out::Forced(f) => *f,
        _ => unreachable!("a forced release completes with what it deleted"),
    }
}

impl Future for Pending<ForcedRelease> {
    type Output = Result<ForcedRelease, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_out(cx).map(|r| r.map(forced))
    }
}

impl Future for Pending<()> {
    type Output = Result<(), Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_out(cx).map(|r| r.map(|_| ()))
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.taken {
            self.inner.slots.let_go(&self.slot);
            return;
        }
        match self.inner.slots.abandon(&self.slot) {
            // Completed but never taken: the lock is released (queued to the loop; nothing
            // blocks), as a guard's drop would.
            Some(Ok(Out::Lock(state))) => {
                self.inner.submit(Command::Release { state, slot: None });
            }
            Some(_) => {}
            None => self.inner.submit(Command::Cancel(self.slot.clone())),
        }
    }
}
