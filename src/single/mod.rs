//! The single-owner front-end: [`Redlock`], whose calls run the event loop on the caller's
//! thread (the lowest latency: no hand-off between threads).

mod hold;

pub use hold::{Held, LockSignal};

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::builder::Builder;
use crate::core::{Core, Done, KeyList, TaskId};
use crate::driver::Driver;
use crate::error::Error;
use crate::inspect::{ForcedRelease, Inspection};
use crate::lock::MAX_RESOURCE_LEN;
use crate::lock::{Dropped, Lock};

/// Cancels the lock attempt running on the client it came from, from any thread.
///
/// A cancel sent while no lock call runs does nothing: it never cancels a later call.
#[derive(Clone)]
pub struct CancelHandle {
    flag: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
}

impl CancelHandle {
    /// End the current attempt promptly with [`Error::Cancelled`]; partial locks are
    /// released.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

impl fmt::Debug for CancelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CancelHandle")
    }
}

/// A Redlock client over N independent Redis masters.
///
/// One client owns one connection per master and one event loop, and its methods block
/// the calling thread (`&mut self`): use one client per thread. Every operation writes its
/// request to all masters at once, then reads the answers as they come.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_mux::Redlock;
///
/// let mut redlock = Redlock::new([
///     "redis://127.0.0.1:7000",
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
/// ])?;
/// let lock = redlock.lock("orders:42", Duration::from_secs(10))?;
/// // ... work while lock.is_valid() ...
/// redlock.release(lock)?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
pub struct Redlock {
    core: Core,
    driver: Driver,
    cancel: CancelHandle,
    batch: Vec<TaskId>,
    /// Locks our user dropped unreleased; released by the next call.
    dropped: Arc<Dropped>,
    orphans: Vec<Lock>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("masters", &self.masters().collect::<Vec<_>>())
            .field("quorum", &self.quorum())
            .finish()
    }
}

impl Redlock {
    pub(crate) fn from_parts((core, driver): (Core, Driver)) -> Redlock {
        Redlock {
            cancel: CancelHandle {
                flag: Arc::new(AtomicBool::new(false)),
                waker: driver.waker(),
            },
            core,
            driver,
            batch: Vec::with_capacity(64),
            dropped: Arc::default(),
            orphans: Vec::new(),
        }
    }

    /// Every call starts here: read what the masters sent while the client was away, and
    /// release the locks the user dropped unreleased. Returns the time, read on entering:
    /// the call's requests start at it, and its loop enters at it (one clock read).
    fn enter(&mut self) -> Result<Instant, Error> {
        let caught_up = self.driver.catch_up(&mut self.core);
        // Queued even when catching up failed: the releases go out with the next write.
        self.dropped.take_into(&mut self.orphans);
        if !self.orphans.is_empty() {
            let now = Instant::now();
            for lock in self.orphans.drain(..) {
                self.core.release_detached(&lock, now);
            }
        }
        Ok(caught_up?)
    }

    /// A lock for our user: dropped unreleased, it comes back to us.
    fn hand_out(&self, mut lock: Lock) -> Lock {
        lock.dropped = Some(self.dropped.clone());
        lock
    }

    /// A client with default settings over these masters.
    pub fn new<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder::default().masters(urls).build()
    }

    /// Start configuring a client.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The masters, as `host:port[/db]`.
    pub fn masters(&self) -> impl Iterator<Item = &str> + '_ {
        self.core.rounds.masters.iter().map(|n| &*n.name)
    }

    /// OK answers needed: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.core.rounds.quorum()
    }

    /// A handle that cancels this client's current lock attempt from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// The round timeout used for a TTL.
    pub fn round_timeout(&self, ttl: Duration) -> Duration {
        self.core.cfg.round_timeout(ttl)
    }

    /// One attempt to take `resource` for `ttl`: write `SET resource token NX PX ttl` to
    /// every master, decide as soon as a quorum said OK (or can no longer), and on failure
    /// release wherever the key may have been set.
    pub fn try_lock(&mut self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        self.lock_keys(|| std::iter::once(resource), ttl, None, 0)
    }

    /// Take `resource` for `ttl`, retrying while it is taken or no quorum answers (after a
    /// random delay, at the holder's expiry, or at once when the holder's release is
    /// announced: see [`crate::WaitMode`]), up to the configured retry count.
    ///
    /// **The bound.** A blocking call cannot be dropped by its caller, so it has a bound of
    /// its own: [`Builder::retry_count`] timed retries, 10 by default (about 2 s with the
    /// default delay of 200 ms ± 100 ms), after which it fails with [`Error::Taken`] or
    /// [`Error::NoQuorum`] and the last attempt's report. To wait a given time instead,
    /// use [`Redlock::lock_with_deadline`]; to wait until granted, `retry_count(u32::MAX)`
    /// (with a [`CancelHandle`] to end it from another thread). Refusals that waiting cannot
    /// change end it at once ([`Error::Refused`]).
    pub fn lock(&mut self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        let retries = self.core.cfg.retry_count;
        let resource = resource.as_ref();
        self.lock_keys(|| std::iter::once(resource), ttl, None, retries)
    }

    /// Like [`Redlock::lock`], but bounded by `deadline` instead of the retry count: it
    /// retries until the deadline (the last attempt starts just before it), never sleeps
    /// beyond it, and no round outlives it. Past it: [`Error::DeadlineExceeded`] with the
    /// last attempt's report.
    pub fn lock_with_deadline(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        let retries = self.core.cfg.retry_count;
        let resource = resource.as_ref();
        self.lock_keys(|| std::iter::once(resource), ttl, Some(deadline), retries)
    }

    /// Take several resources as one lock: on each master all keys are set only if none
    /// exists (one script), and the lock needs a quorum of masters where that worked.
    pub fn lock_many<I, R>(&mut self, resources: I, ttl: Duration) -> Result<Lock, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<[u8]>,
    {
        let mut keys = KeyList::default();
        for r in resources {
            keys.push(r.as_ref());
        }
        check_distinct(&keys)?;
        let retries = self.core.cfg.retry_count;
        self.lock_keys(|| keys.iter(), ttl, None, retries)
    }

    /// Take the resources `keys()` walks (a one-resource call walks its argument: no list
    /// is built for it).
    fn lock_keys<'k, I: Iterator<Item = &'k [u8]>>(
        &mut self,
        keys: impl Fn() -> I,
        ttl: Duration,
        deadline: Option<Instant>,
        retries: u32,
    ) -> Result<Lock, Error> {
        if keys().next().is_none() {
            return Err(Error::InvalidArgument("no resource given".into()));
        }
        check_resources(keys())?;
        let ttl = self.core.check_ttl(ttl)?;
        self.arm_cancel();
        let now = self.enter()?;
        let id = self.core.submit_lock(keys(), ttl, deadline, retries, now);
        match self.run(id, true, now)? {
            Done::Locked(lock) => Ok(self.hand_out(lock)),
            other => unreachable!("a lock task ended with {other:?}"),
        }
    }

    /// A lock call starts: a cancel sent before it is not for it.
    fn arm_cancel(&self) {
        self.cancel.flag.store(false, Ordering::SeqCst);
    }

    /// Drive the loop until task `id` is done; a cancel (for lock tasks) cancels it.
    /// `entered`: the time [`Redlock::enter`] returned (the loop enters at it).
    fn run(&mut self, id: TaskId, cancellable: bool, entered: Instant) -> Result<Done, Error> {
        let mut now = entered;
        loop {
            let flag = &self.cancel.flag;
            let done = self.driver.drive(
                &mut self.core,
                now,
                None,
                |c| c.is_done(id),
                || cancellable && flag.load(Ordering::Relaxed),
            );
            match done {
                Ok(true) => return self.core.take(id),
                Ok(false) => {
                    self.cancel.flag.store(false, Ordering::SeqCst);
                    self.core.cancel(id, Instant::now());
                    now = self.driver.enter(&mut self.core);
                }
                Err(e) => {
                    self.core.cancel(id, Instant::now());
                    if self.core.is_done(id) {
                        let _ = self.core.take(id);
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// Drive the loop until every task of the batch is done; a cancel cancels them all.
    /// `entered`: the time [`Redlock::enter`] returned (the loop enters at it).
    fn run_batch(&mut self, cancellable: bool, entered: Instant) -> Result<(), Error> {
        let mut now = entered;
        loop {
            let flag = &self.cancel.flag;
            let batch = &self.batch;
            let done = self.driver.drive(
                &mut self.core,
                now,
                None,
                |c| batch.iter().all(|id| c.is_done(*id)),
                || cancellable && flag.load(Ordering::Relaxed),
            )?;
            if done {
                return Ok(());
            }
            self.cancel.flag.store(false, Ordering::SeqCst);
            let cancelled = Instant::now();
            for id in self.batch.iter() {
                self.core.cancel(*id, cancelled);
            }
            now = self.driver.enter(&mut self.core);
        }
    }

    /// One attempt on each of many resources at once, pipelined: every master gets all
    /// `SET NX PX` requests in one write, and the replies are matched in order. Results
    /// go to `out` (cleared first) in the order of `resources`; failed attempts are
    /// released like [`Redlock::try_lock`]'s. Reuse `out` and no allocation happens once
    /// warm.
    pub fn try_lock_batch<R: AsRef<[u8]>>(
        &mut self,
        resources: &[R],
        ttl: Duration,
        out: &mut Vec<Result<Lock, Error>>,
    ) -> Result<(), Error> {
        out.clear();
        check_resources(resources.iter().map(AsRef::as_ref))?;
        let ttl = self.core.check_ttl(ttl)?;
        self.arm_cancel();
        let now = self.enter()?;
        self.batch.clear();
        for r in resources {
            let id = self.core.submit_lock([r.as_ref()], ttl, None, 0, now);
            self.batch.push(id);
        }
        let driven = self.run_batch(true, now);
        for k in 0..self.batch.len() {
            let id = self.batch[k];
            let r = self.core.take(id).map(|d| match d {
                Done::Locked(lock) => self.hand_out(lock),
                other => unreachable!("a lock task ended with {other:?}"),
            });
            out.push(r);
        }
        driven
    }

    /// Release many locks at once, pipelined (one write per master for all of them).
    /// `out` gets one result per lock, in order.
    pub fn release_batch(
        &mut self,
        locks: impl IntoIterator<Item = Lock>,
        out: &mut Vec<Result<(), Error>>,
    ) -> Result<(), Error> {
        out.clear();
        let now = self.enter()?;
        self.batch.clear();
        for mut lock in locks {
            lock.dropped = None;
            let id = self.core.submit_release(&lock, now);
            self.batch.push(id);
        }
        let driven = self.run_batch(false, now);
        for k in 0..self.batch.len() {
            let id = self.batch[k];
            out.push(self.core.take(id).map(|_| ()));
        }
        driven
    }

    /// Release the lock on every master at once (compare-and-delete: only keys that still
    /// hold this lock's token are deleted). `Ok` when a quorum confirmed.
    pub fn release(&mut self, mut lock: Lock) -> Result<(), Error> {
        // Should `enter` fail, `lock` is dropped still armed: queued for the next call.
        let now = self.enter()?;
        lock.dropped = None;
        let id = self.core.submit_release(&lock, now);
        self.run(id, false, now).map(|_| ())
    }

    /// Extend the lock to live at least `ttl` from now (compare-and-extend on every
    /// master: where a key still holds this lock's token, its expiry becomes `now + ttl`
    /// unless it already lives longer; an extend never shortens a lock). Succeeds when a
    /// quorum confirmed and validity is left, computed exactly like acquire; the lock's
    /// deadline then becomes the later of the old one and the new one. On failure the lock
    /// keeps its old deadline, which still holds: no master's key was cut short.
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let ttl = self.core.check_ttl(ttl)?;
        if !lock.is_valid() {
            return Err(Error::Expired);
        }
        let now = self.enter()?;
        let id = self.core.submit_extend(lock, ttl, now);
        match self.run(id, false, now)? {
            Done::Extended { valid_until, ttl } => {
                lock.valid_until = valid_until;
                lock.ttl = ttl;
                Ok(())
            }
            other => unreachable!("an extend task ended with {other:?}"),
        }
    }

    /// Look at `resource` on every master, for an operator: who holds it there (the
    /// fingerprint of the holder's token, never the token), for how long, who waits in its
    /// line, its fencing counter; and whether a quorum holds it ([`Inspection::is_held`]).
    /// Read-only. Waits for every master's answer (not just a quorum), up to the connect
    /// timeout and a second; a master that fails is in the inspection with its fault.
    ///
    /// ```
    /// # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let local = redlock_mux::local::LocalMasters::start(3)?;
    /// use std::time::Duration;
    /// use redlock_mux::Redlock;
    ///
    /// let mut redlock = Redlock::new(local.urls())?;
    /// let lock = redlock.lock("report", Duration::from_secs(30))?;
    /// let seen = redlock.inspect("report")?;
    /// assert!(seen.is_held());
    /// assert_eq!(seen.holder(), Some(&lock.token().as_str()[..16]));
    /// println!("{seen}"); // held by 5f0c…: on 3 of 3 masters (quorum 2)
    /// redlock.release(lock)?;
    /// assert!(redlock.inspect("report")?.is_free());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "local"))] fn main() {}
    /// ```
    pub fn inspect(&mut self, resource: impl AsRef<[u8]>) -> Result<Inspection, Error> {
        let resource = resource.as_ref();
        check_resources([resource])?;
        let now = self.enter()?;
        let id = self.core.submit_inspect(resource, now);
        match self.run(id, false, now)? {
            Done::Inspected(i) => Ok(i),
            other => unreachable!("an inspect task ended with {other:?}"),
        }
    }

    /// An operator's release of `resource`, whoever holds it: its key is deleted on every
    /// master whatever its token, and its waiters are woken (as by the holder's release).
    /// Says whose keys it deleted where. The holder is not told: its next extension fails
    /// with [`Error::NotHeld`] (a `redlock run` then stops its command), and until then it
    /// may still believe it holds the lock: use it for holders that are gone or stuck, and
    /// look first ([`Redlock::inspect`]).
    ///
    /// The lock is free when [`ForcedRelease::is_free`]: a quorum answered. A master that
    /// did not keeps its key until it expires.
    pub fn force_release(&mut self, resource: impl AsRef<[u8]>) -> Result<ForcedRelease, Error> {
        let resource = resource.as_ref();
        check_resources([resource])?;
        let now = self.enter()?;
        let id = self.core.submit_force_release(resource, now);
        match self.run(id, false, now)? {
            Done::ForceReleased(f) => Ok(f),
            other => unreachable!("a forced release ended with {other:?}"),
        }
    }

    /// What each master did so far, by name: connections, outcomes, answer latency.
    pub fn stats(&self) -> Vec<crate::stats::MasterStats> {
        self.driver.stats(&self.core)
    }
}

impl Builder {
    /// Check the configuration and build the single-owner client. Connections are opened
    /// lazily, by the first operation.
    pub fn build(self) -> Result<Redlock, Error> {
        Ok(Redlock::from_parts(self.parts_with_driver()?))
    }
}

/// The same resource twice in one lock is a mistake (the all-or-nothing script would find
/// its own key).
pub(crate) fn check_distinct(keys: &KeyList) -> Result<(), Error> {
    // Inline up to 16 resources: a warm `lock_many` allocates nothing.
    let mut sorted: smallvec::SmallVec<[&[u8]; 16]> = keys.iter().collect();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::InvalidArgument(
            "the same resource is listed twice".into(),
        ));
    }
    Ok(())
}

pub(crate) fn check_resources<'k>(keys: impl IntoIterator<Item = &'k [u8]>) -> Result<(), Error> {
    for k in keys {
        if k.is_empty() {
            return Err(Error::InvalidArgument("resource name is empty".into()));
        }
        if k.len() > MAX_RESOURCE_LEN {
            return Err(Error::InvalidArgument(format!(
                "resource name is {} bytes, above the maximum {MAX_RESOURCE_LEN}",
                k.len()
            )));
        }
        if k.starts_with(crate::scripts::RESERVED_PREFIX) {
            return Err(Error::InvalidArgument(format!(
                "resource names starting with {:?} are reserved (fencing counters, lines of \
                 waiters)",
                String::from_utf8_lossy(crate::scripts::RESERVED_PREFIX)
            )));
        }
    }
    Ok(())
}

impl Drop for Redlock {
    fn drop(&mut self) {
        // Push out the releases still queued (dropped locks, cleanup after a failed
        // attempt) before closing.
        let _ = self.enter();
        self.driver.turn(&mut self.core, Instant::now());
    }
}
