//! The shared client: one loop thread owns the core, the driver and the connections; cloneable
//! handles ([`SharedRedlock`]) submit lock operations from any thread or task. Whatever is
//! submitted while the loop is busy goes out in its next write to each master (natural
//! batching: nobody forms batches). Results come back as [`Pending`] operations, awaited
//! as futures or waited for on a thread; locks come as [`LockGuard`]s, released when
//! dropped.

mod event_loop;
mod guard;
mod hub;
#[cfg(all(test, loom))]
mod loom_tests;
mod pending;
mod state;
mod sync;

pub use guard::{LockGuard, Lost};
pub use pending::Pending;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::builder::Builder;
use crate::core::{Core, KeyList, Settings};
use crate::driver::{Driver, InMemory, LoopIo};
use crate::error::Error;
use crate::inspect::{ForcedRelease, Inspection};
use crate::keep::HoldOptions;
use crate::single::{check_distinct, check_resources};
use event_loop::Loop;
use hub::Hub;
use pending::{Out, Slot, SlotPool};
use state::LockState;

/// What a handle asks of the loop. A lock's or an operator's keys are not in the command
/// (120 bytes, as large as the rest of it twice over: every move of a command was a
/// `memcpy`): they are written straight into the queue's [`KeyStore`], in the commands'
/// order, and the loop reads them there.
pub(crate) enum Command {
    /// Its keys: the next of the [`KeyStore`].
    Lock {
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
        slot: Arc<Slot>,
    },
    /// `slot: None`: a guard was dropped; nobody waits for the result.
    Release {
        state: Arc<LockState>,
        slot: Option<Arc<Slot>>,
    },
    Extend {
        state: Arc<LockState>,
        ttl: Duration,
        slot: Arc<Slot>,
    },
    KeepAlive {
        state: Arc<LockState>,
        opts: HoldOptions,
    },
    /// Wake the lock's `lost()` futures when its lost instant passes.
    Watch(Arc<LockState>),
    /// The `Pending` of this slot was dropped.
    Cancel(Arc<Slot>),
    /// A snapshot of the masters' statistics.
    Stats(Arc<Slot>),
    /// An operator's look at a resource (`force: false`) or forced release (`true`); the
    /// resource: the next of the [`KeyStore`].
    Admin { force: bool, slot: Arc<Slot> },
}

/// The keys of the queued `Lock` and `Admin` commands, in their order: written in place by
/// the submitter (under the queue's lock), read in place by the loop (a lock's are swapped
/// into its task), and kept for reuse, with the storage the tasks swapped back, once the
/// loop has read them all ([`KeyStore::reset`]). It travels with the commands: the queue's
/// and the loop's are swapped with them.
#[derive(Default)]
pub(crate) struct KeyStore {
    lists: Vec<KeyList>,
    /// Lists written (the first `used` of `lists`).
    used: usize,
    /// Lists the loop has read.
    read: usize,
}

impl KeyStore {
    pub(crate) fn with_capacity(n: usize) -> Self {
        KeyStore {
            lists: Vec::with_capacity(n),
            used: 0,
            read: 0,
        }
    }

    /// The list of the next command's keys, empty.
    #[inline]
    pub(crate) fn next(&mut self) -> &mut KeyList {
        if self.used == self.lists.len() {
            self.lists.push(KeyList::default());
        } else {
            self.lists[self.used].clear();
        }
        self.used += 1;
        &mut self.lists[self.used - 1]
    }

    /// The keys of the next command the loop runs.
    #[inline]
    pub(crate) fn take(&mut self) -> &mut KeyList {
        debug_assert!(self.read < self.used, "a keyed command without its keys");
        self.read += 1;
        &mut self.lists[self.read - 1]
    }

    /// Every list read (or the commands gone): all of them reusable.
    #[inline]
    pub(crate) fn reset(&mut self) {
        self.used = 0;
        self.read = 0;
    }
}

/// What the handles share; dropped with the last handle, guard and pending operation.
pub(crate) struct Inner {
    hub: Arc<Hub>,
    /// Completion slots, reused (shared with the loop).
    pub(crate) slots: Arc<SlotPool>,
    settings: TtlChecks,
    /// Retries of `lock` and `lock_many` (no deadline): the count set on the builder, or
    /// none (see `Builder::retry_count`).
    lock_retries: u32,
    masters: Vec<Arc<str>>,
    quorum: usize,
    busy_poll: bool,
}

impl Inner {
    /// Queue `cmd` and make sure the loop runs it soon (a dropped guard's release, a
    /// cancel, auto-extension): wakes whoever drives, or the loop's thread.
    pub(crate) fn submit(&self, cmd: Command) {
        self.hub.submit(cmd, true);
    }

    /// Queue `cmd` for a [`Pending`]: it runs no later than when the `Pending` is first
    /// awaited or waited for (or dropped), and earlier if the loop runs meanwhile. No
    /// wake-up now: a caller about to wait drives the loop itself, without a hand-off.
    pub(crate) fn queue(&self, cmd: Command) {
        self.hub.submit(cmd, false);
    }

    /// [`Inner::queue`] of a `Lock` or `Admin` command, its keys written by `keys` into the
    /// queue's [`KeyStore`].
    pub(crate) fn queue_keyed(&self, cmd: Command, keys: impl FnOnce(&mut KeyList)) {
        self.hub.submit_keyed(cmd, keys);
    }

    pub(crate) fn hub(&self) -> &Hub {
        &self.hub
    }
}

/// The core's settings as the handles check a TTL against them: [`Settings::check_ttl`]
/// remembered for the last TTL accepted (a client's locks nearly always share a TTL; the
/// check takes a floating-point product and a rounding), as the single owner's
/// `Core::check_ttl` does. Shared by every thread: one relaxed atomic, the TTL packed as
/// `secs << 30 | nanos` (`u64::MAX`, which no TTL packs to: none yet), since any TTL it
/// holds passed the check against settings that never change.
pub(crate) struct TtlChecks {
    settings: Settings,
    accepted: std::sync::atomic::AtomicU64,
}

impl TtlChecks {
    fn new(settings: Settings) -> Self {
        TtlChecks {
            settings,
            accepted: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }

    /// [`Settings::check_ttl`] of `ttl`: the TTL in whole milliseconds, or why not.
    #[inline]
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<Duration, Error> {
        use std::sync::atomic::Ordering::Relaxed;
        // Packed only when its seconds fit in 32 bits: every TTL that can pass does
        // (`MAX_TTL` is 2^31 ms); one that does not is checked every time.
        let packed =
            (ttl.as_secs() < 1 << 32).then(|| ttl.as_secs() << 30 | u64::from(ttl.subsec_nanos()));
        if packed.is_some_and(|p| p == self.accepted.load(Relaxed)) {
            let nanos = ttl.subsec_nanos();
            return Ok(Duration::new(ttl.as_secs(), nanos - nanos % 1_000_000));
        }
        let whole = self.settings.check_ttl(ttl)?;
        if let Some(p) = packed {
            self.accepted.store(p, Relaxed);
        }
        Ok(whole)
    }
}

/// Wake `w`, catching a panic of its executor's wake-up code: whoever wakes (the loop's
/// thread, a caller driving the loop) must not be taken down by someone else's waker.
pub(crate) fn wake(w: std::task::Waker) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.hub.close();
    }
}

/// A Redlock client for a whole process: a cloneable, `Send + Sync` handle to one event
/// loop thread that owns one connection per master. Every thread and async task can use
/// it at once; all their lock operations are multiplexed over the same connections.
///
/// Every operation returns a [`Pending`]: `.await` it (any executor), or
/// [`wait`](Pending::wait) for it on a thread. Locks come as [`LockGuard`]s: dropping one
/// releases the lock (queued to the loop, never blocking); dropping a `Pending` cancels
/// the operation, and a lock granted after that is released by the loop.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_mux::Redlock;
///
/// let redlock = Redlock::builder()
///     .masters(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001", "redis://127.0.0.1:7002"])
///     .build_shared()?;
/// let worker = redlock.clone(); // another thread's handle to the same loop
/// std::thread::spawn(move || {
///     let guard = worker.lock("orders:42", Duration::from_secs(10)).wait()?;
///     // ... work while guard.is_valid() ...
///     guard.release().wait()
/// });
/// # Ok::<(), redlock_mux::Error>(())
/// ```
///
/// In async code, `.await` the same operations, on any executor (the client has no
/// runtime of its own: a `Pending` is a plain `Future`); bound a wait with the
/// executor's timeout, which drops the `Pending` and so cancels the attempt:
///
/// ```
/// # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let local = redlock_mux::local::LocalMasters::start(3)?;
/// # let urls = local.urls();
/// # let rt = tokio::runtime::Builder::new_multi_thread().enable_time().build()?;
/// # rt.block_on(async {
/// use std::time::Duration;
/// use redlock_mux::Redlock;
///
/// let redlock = Redlock::builder().masters(&urls).build_shared()?;
/// let tasks: Vec<_> = (0..4)
///     .map(|t| {
///         let redlock = redlock.clone();
///         tokio::spawn(async move {
///             let wait = Duration::from_secs(10);
///             let guard = tokio::time::timeout(wait, redlock.lock("report", Duration::from_secs(5)))
///                 .await
///                 .map_err(|_| format!("task {t}: still taken after {wait:?}"))??;
///             // ... work while guard.is_valid() ...
///             guard.release().await?;
///             Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
///         })
///     })
///     .collect();
/// for t in tasks {
///     t.await??;
/// }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(()) }).map_err(|e| e.to_string())?;
/// # Ok(()) }
/// # #[cfg(not(feature = "local"))] fn main() {}
/// ```
///
/// The single-owner [`crate::Redlock`] is faster for one thread (no hand-off between
/// threads); this client is for sharing: thread pools, async services, many callers.
///
/// **Lifetime.** Guards and pending operations keep the client alive. Once the last
/// handle, guard and `Pending` are gone, the loop finishes what is in flight (the guards'
/// releases; at most 2 s), closes its connections and its thread exits. A caller that
/// panics holding a guard releases it as it unwinds; a waker that panics when the loop
/// wakes it is caught; neither stops the loop (`tests/shared.rs`,
/// `tests/shared_shutdown.rs`). Warm operations allocate nothing
/// (`tests/alloc_shared.rs`).
#[derive(Clone)]
pub struct SharedRedlock {
    inner: Arc<Inner>,
}

impl fmt::Debug for SharedRedlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRedlock")
            .field("masters", &self.inner.masters)
            .field("quorum", &self.inner.quorum)
            .finish()
    }
}

impl SharedRedlock {
    pub(crate) fn start(parts: (Core, Driver), lock_retries: u32) -> Result<SharedRedlock, Error> {
        let core = &parts.0;
        let busy_poll = core.rounds.cfg.busy_poll;
        let settings = core.cfg.clone();
        let masters = core.rounds.masters.iter().map(|n| n.name.clone()).collect();
        let quorum = core.rounds.quorum();
        let slots = Arc::new(SlotPool::new());
        let hub = Hub::start(parts)?;
        Ok(SharedRedlock {
            inner: Arc::new(Inner {
                hub,
                slots,
                settings: TtlChecks::new(settings),
                lock_retries,
                masters,
                quorum,
                busy_poll,
            }),
        })
    }

    /// A shared client with default settings over these masters.
    pub fn new<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder::default().masters(urls).build_shared()
    }

    /// The masters, as `host:port[/db]`.
    pub fn masters(&self) -> impl Iterator<Item = &str> + '_ {
        self.inner.masters.iter().map(|n| &**n)
    }

    /// OK answers needed: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// What each master did so far, by name: connections, outcomes, answer latency (see
    /// [`MasterStats`](crate::stats::MasterStats)).
    pub fn stats(&self) -> Pending<Vec<crate::stats::MasterStats>> {
        let slot = self.inner.slots.take();
        self.inner.queue(Command::Stats(slot.clone()));
        Pending::new(self.inner.clone(), slot)
    }

    /// Look at `resource` on every master, for an operator (see
    /// [`Redlock::inspect`](crate::Redlock::inspect)): who holds it where (by fingerprint),
    /// for how long, its line of waiters, its fencing counter, and whether a quorum holds
    /// it. Read-only.
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
    /// let guard = redlock.lock("nightly", Duration::from_secs(30)).await?;
    /// let seen = redlock.inspect("nightly").await?;
    /// assert_eq!((seen.is_held(), seen.held_on()), (true, 3));
    /// for m in seen.masters() {
    ///     println!("{}: {:?} for {:?}, {} waiting", m.name(), m.holder(), m.ttl(), m.waiters());
    /// }
    /// guard.release().await?;
    /// # Ok::<(), redlock_mux::Error>(()) })?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "local"))] fn main() {}
    /// ```
    pub fn inspect(&self, resource: impl AsRef<[u8]>) -> Pending<Inspection> {
        self.submit_admin(resource.as_ref(), false)
    }

    /// An operator's release of `resource`, whoever holds it (see
    /// [`Redlock::force_release`](crate::Redlock::force_release)): its key deleted on every
    /// master whatever its token, its waiters woken; says whose keys it deleted where.
    pub fn force_release(&self, resource: impl AsRef<[u8]>) -> Pending<ForcedRelease> {
        self.submit_admin(resource.as_ref(), true)
    }

    fn submit_admin<T>(&self, resource: &[u8], force: bool) -> Pending<T> {
        if let Err(e) = check_resources([resource]) {
            return Pending::ready(self.inner.clone(), Err(e));
        }
        let slot = self.inner.slots.take();
        self.inner.queue_keyed(
            Command::Admin {
                force,
                slot: slot.clone(),
            },
            |keys| keys.push(resource),
        );
        Pending::new(self.inner.clone(), slot)
    }

    /// One attempt to take `resource` for `ttl` (see [`crate::Redlock::try_lock`]).
    pub fn try_lock(&self, resource: impl AsRef<[u8]>, ttl: Duration) -> Pending<LockGuard> {
        self.submit_one(resource.as_ref(), ttl, None, 0)
    }

    /// Take `resource` for `ttl`, waiting until it is granted: retrying while it is taken
    /// or no quorum answers, woken by the holder's release (see [`crate::WaitMode`]).
    ///
    /// **The caller bounds the wait.** Like `Mutex::lock`, this waits until it gets the
    /// lock; drop the `Pending` to give up (a `tokio::time::timeout`, a `select!`, an
    /// aborted task: the attempt is cancelled, the call leaves the line of waiters, and a
    /// lock granted after the drop is released). On a thread, [`Pending::wait`] waits as
    /// long; use [`SharedRedlock::lock_with_deadline`] for a bound that reports what the
    /// masters did. Only a [`Builder::retry_count`](crate::Builder::retry_count) set on the
    /// builder bounds it by a count. Refusals that waiting cannot change end it at once
    /// ([`Error::Refused`]: a wrong password, an ACL without the right to the keys, an
    /// untrusted certificate, on too many masters for a quorum).
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
    /// // Wait at most 10 s for the lock, then hold it for up to 30 s.
    /// match tokio::time::timeout(Duration::from_secs(10), redlock.lock("orders:42", Duration::from_secs(30))).await {
    ///     Ok(Ok(guard)) => {
    ///         // ... work while guard.is_valid() ...
    ///         guard.release().await?;
    ///     }
    ///     Ok(Err(e)) => return Err(e.into()), // refused: fix the configuration
    ///     Err(_elapsed) => {}                  // still taken after 10 s: nothing is left behind
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "local"))] fn main() {}
    /// ```
    pub fn lock(&self, resource: impl AsRef<[u8]>, ttl: Duration) -> Pending<LockGuard> {
        let retries = self.inner.lock_retries;
        self.submit_one(resource.as_ref(), ttl, None, retries)
    }

    /// Like [`SharedRedlock::lock`], but never past `deadline`: it retries until then
    /// (whatever the retry count), and ends with [`Error::DeadlineExceeded`] carrying the
    /// last attempt's report (who holds it, which masters are down).
    pub fn lock_with_deadline(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        deadline: Instant,
    ) -> Pending<LockGuard> {
        let retries = self.inner.lock_retries;
        self.submit_one(resource.as_ref(), ttl, Some(deadline), retries)
    }

    /// Several resources as one lock (see [`crate::Redlock::lock_many`]); it waits like
    /// [`SharedRedlock::lock`], until granted or dropped.
    pub fn lock_many<I, R>(&self, resources: I, ttl: Duration) -> Pending<LockGuard>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<[u8]>,
    {
        let mut keys = KeyList::default();
        for r in resources {
            keys.push(r.as_ref());
        }
        if let Err(e) = check_distinct(&keys) {
            return Pending::ready(self.inner.clone(), Err(e));
        }
        let checked = if keys.len() == 0 {
            Err(Error::InvalidArgument("no resource given".into()))
        } else {
            check_resources(keys.iter())
        };
        let retries = self.inner.lock_retries;
        // The list moves into the queue's store (a swap: no key copied).
        self.submit_lock(checked, ttl, None, retries, |k| {
            std::mem::swap(k, &mut keys)
        })
    }

    /// A lock on one resource: its key written straight into the queue.
    fn submit_one(
        &self,
        resource: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
    ) -> Pending<LockGuard> {
        let checked = check_resources([resource]);
        self.submit_lock(checked, ttl, deadline, retries, |k| k.push(resource))
    }

    /// A lock whose resources were checked (`checked`), its keys written by `keys`.
    #[inline]
    fn submit_lock(
        &self,
        checked: Result<(), Error>,
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
        keys: impl FnOnce(&mut KeyList),
    ) -> Pending<LockGuard> {
        let ttl = match checked.and_then(|()| self.inner.settings.check_ttl(ttl)) {
            Ok(t) => t,
            Err(e) => return Pending::ready(self.inner.clone(), Err(e)),
        };
        let slot = self.inner.slots.take();
        self.inner.queue_keyed(
            Command::Lock {
                ttl,
                deadline,
                retries,
                slot: slot.clone(),
            },
            keys,
        );
        Pending::new(self.inner.clone(), slot)
    }
}

impl Builder {
    /// Check the configuration and start the shared client: its loop thread starts now,
    /// connections open with the first operation.
    pub fn build_shared(self) -> Result<SharedRedlock, Error> {
        let lock_retries = self.shared_lock_retries();
        SharedRedlock::start(self.parts_with_driver()?, lock_retries)
    }
}

impl Builder {
    /// The shared client over masters scripted in memory, for exact instruction counts
    /// (`examples/shared_loop_cycles.rs`, the `shared_cycle` budget): the core as
    /// [`Builder::build_core`] makes it (its clock starts at `now`, seeded tokens: never
    /// for real locks), driven by the shared client's own hand-over and loop, over
    /// `script` instead of sockets (see [`InMemoryShared`]).
    #[doc(hidden)]
    pub fn build_shared_in_memory<S>(
        self,
        now: Instant,
        wall_us: u64,
        seed: u64,
        round_trip: Duration,
        script: S,
    ) -> Result<InMemoryShared<S>, Error>
    where
        S: FnMut(usize, &[u8], &mut Vec<u8>) + Send + 'static,
    {
        let core = self.build_core(now, wall_us, seed)?;
        let settings = core.cfg.clone();
        let io = InMemory::new(2 * core.masters(), script, now, round_trip);
        let waker = io.waker();
        let (hub, _thread) = Hub::launch(Loop::new(core, io), waker, false)?;
        Ok(InMemoryShared {
            hub,
            slots: SlotPool::new(),
            settings: TtlChecks::new(settings),
        })
    }
}

/// A shared client whose masters are scripted in memory: `script(link, written, answers)`
/// appends to `answers` what the master of `link` (`0..n` lock links, `n..2n` sub links)
/// answers to the bytes `written` to it; they are read one `round_trip` later, on the
/// loop's clock, which nothing else moves (no clock read, no socket, no poll).
///
/// Its operations make the calls a [`SharedRedlock`] handle's do for a caller that waits
/// on a thread: queue the command, drive the loop on the caller's thread (the hand-over's
/// `drive_for`, the loop's `enter`, `iterate` and `wait`: the code users run), take the
/// result from the completion slot. What it leaves out of a handle's path: the `Pending`
/// and `LockGuard` wrappers (reference counts of the client). The loop's own thread
/// starts too, and parks: one caller that waits drives the loop itself.
#[doc(hidden)]
pub struct InMemoryShared<S: FnMut(usize, &[u8], &mut Vec<u8>) + Send + 'static> {
    hub: Arc<Hub<Loop<InMemory<S>>>>,
    slots: SlotPool,
    settings: TtlChecks,
}

/// A lock held through an [`InMemoryShared`]; give it to [`InMemoryShared::release`]
/// (dropping it releases nothing).
#[doc(hidden)]
pub struct InMemoryLock(Arc<LockState>);

impl<S: FnMut(usize, &[u8], &mut Vec<u8>) + Send + 'static> InMemoryShared<S> {
    /// `SharedRedlock::try_lock(resource, ttl).wait()`.
    pub fn try_lock(&self, resource: &[u8], ttl: Duration) -> Result<InMemoryLock, Error> {
        check_resources([resource])?;
        let ttl = self.settings.check_ttl(ttl)?;
        let slot = self.slots.take();
        self.hub.submit_keyed(
            Command::Lock {
                ttl,
                deadline: None,
                retries: 0,
                slot: slot.clone(),
            },
            |keys| keys.push(resource),
        );
        match self.wait(&slot)? {
            Out::Lock(state) => Ok(InMemoryLock(state)),
            _ => unreachable!("a lock operation completes with a lock"),
        }
    }

    /// `LockGuard::release(guard).wait()`.
    pub fn release(&self, lock: InMemoryLock) -> Result<(), Error> {
        let slot = self.slots.take();
        self.hub.submit(
            Command::Release {
                state: lock.0,
                slot: Some(slot.clone()),
            },
            false,
        );
        self.wait(&slot).map(|_| ())
    }

    /// `Pending::wait`: drive the loop until the result is in, take it, let the slot go.
    fn wait(&self, slot: &Arc<Slot>) -> Result<Out, Error> {
        let direct = if slot.is_ready() {
            None
        } else {
            self.hub.drive_for(slot)
        };
        let r = direct.unwrap_or_else(|| slot.wait());
        self.slots.let_go(slot);
        r
    }
}

impl<S: FnMut(usize, &[u8], &mut Vec<u8>) + Send + 'static> Drop for InMemoryShared<S> {
    fn drop(&mut self) {
        self.hub.close();
    }
}

#[allow(unused)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<SharedRedlock>();
    is::<LockGuard>();
    is::<Pending<LockGuard>>();
    is::<Pending<()>>();
    is::<Pending<Inspection>>();
    is::<Pending<ForcedRelease>>();
    let _ = Out::Unit;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Redlock;

    /// The remembered check answers as the check does: a TTL rejected before or after one
    /// accepted, the same TTL again, and one in whole and in part milliseconds.
    #[test]
    fn remembered_ttl_checks_answer_as_the_check() {
        let core = Redlock::builder()
            .masters(["redis://127.0.0.1:1"])
            .build_core(Instant::now(), 0, 1)
            .unwrap();
        let checks = TtlChecks::new(core.cfg.clone());
        let ttls = [
            Duration::ZERO,
            Duration::from_micros(999),
            Duration::from_secs(10),
            Duration::ZERO,
            Duration::from_secs(10),
            Duration::from_micros(10_500_700),
            Duration::from_micros(10_500_700),
            Duration::from_secs(10),
            crate::lock::MAX_TTL + Duration::from_millis(1),
            Duration::MAX,
            Duration::from_millis(1),
        ];
        for ttl in ttls {
            let want = core.cfg.check_ttl(ttl);
            for _ in 0..2 {
                match (checks.check_ttl(ttl), &want) {
                    (Ok(a), Ok(b)) => assert_eq!(a, *b, "{ttl:?}"),
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("{ttl:?}: {a:?}, the check says {b:?}"),
                }
            }
        }
    }
}
