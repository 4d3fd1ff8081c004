//! Auto-extension: run work under a lock that the client keeps extended, with a lost-lock
//! signal the work can poll or wait on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Redlock;
use crate::core::WatchId;
use crate::error::Error;
use crate::keep::{AfterExtend, HoldOptions, KeepAlive};
use crate::lock::Lock;

/// Tells the work whether its lock is still held. Cheap to poll ([`LockSignal::is_lost`]:
/// one atomic load and one clock read); can also be waited on ([`LockSignal::wait_lost`]).
///
/// The signal reads the clock itself: it reports the lock lost once less than the
/// [`HoldOptions::lost_at`] share of the TTL is left before the lock's deadline, even when
/// the thread that extends it is late, and at once when an extension finds the lock no
/// longer held or the masters' watch finds fewer than a quorum that may still hold it.
/// Once lost, it stays lost.
#[derive(Debug)]
pub struct LockSignal {
    lost: AtomicBool,
    /// The work returned (or panicked): the keeper stops.
    done: AtomicBool,
    /// Past this instant (nanoseconds after `base`) the lock counts as lost: its deadline
    /// minus the margin. Moved later by each extension.
    stop_at: AtomicU64,
    /// The lock's deadline (nanoseconds after `base`), as of the last extension.
    valid_until: AtomicU64,
    base: Instant,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    lost: bool,
    done: bool,
}

impl LockSignal {
    fn new(valid_until: Instant, stop_at: Instant) -> Self {
        let base = Instant::now();
        let signal = LockSignal {
            lost: AtomicBool::new(false),
            done: AtomicBool::new(false),
            stop_at: AtomicU64::new(0),
            valid_until: AtomicU64::new(0),
            base,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        };
        signal.set_deadline(valid_until, stop_at);
        signal
    }

    /// When the lock's validity ends, as of its acquisition or its last successful
    /// extension (each extension moves it forward; after a loss it stays where it was).
    /// Work that was paused (its process stopped, say) can compare it with the clock
    /// before it touches the protected resource again.
    pub fn valid_until(&self) -> Instant {
        self.base + Duration::from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// `true` once the lock is lost: an extension or the masters' watch found it no longer
    /// held on a quorum, or less than the margin of validity is left (however late the
    /// extending thread is). Stop touching the protected resource when it turns true.
    pub fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if Instant::now() >= self.stop_at() {
            self.mark_lost();
            return true;
        }
        false
    }

    /// Wait up to `timeout` for the lock to be lost; returns [`LockSignal::is_lost`].
    /// Useful as an interruptible sleep inside the work. Any `timeout` is fine
    /// (`Duration::MAX` waits until the lock is lost).
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if st.lost {
                return true;
            }
            let now = Instant::now();
            let stop = self.stop_at();
            if now >= stop {
                drop(st);
                self.mark_lost();
                return true;
            }
            let until = deadline.map_or(stop, |d| d.min(stop));
            if now >= until {
                return false;
            }
            st = self
                .cv
                .wait_timeout(st, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn stop_at(&self) -> Instant {
        self.base + Duration::from_nanos(self.stop_at.load(Ordering::Acquire))
    }

    /// The lock's deadline moved (acquired, extended), and with it the lost instant.
    fn set_deadline(&self, valid_until: Instant, stop_at: Instant) {
        let ns = |t: Instant| {
            u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
        };
        self.valid_until.store(ns(valid_until), Ordering::Release);
        self.stop_at.store(ns(stop_at), Ordering::Release);
    }

    fn mark_lost(&self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.lost = true;
        self.lost.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    fn mark_done(&self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.done = true;
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Wait until the work is done or `until`; returns whether it is done.
    fn wait_done(&self, until: Instant) -> bool {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while !st.done {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        st.done
    }
}

/// What [`Redlock::run_locked`] returns.
#[derive(Debug)]
pub struct Held<T> {
    /// The work's result.
    pub value: T,
    /// `true` when the lock was held (extended in time) until the work returned.
    pub held_throughout: bool,
    /// Extensions made.
    pub extensions: u32,
    /// Why the lock was lost, when it was.
    pub lost: Option<Error>,
}

impl Redlock {
    /// Take `resource` (with retries, as [`Redlock::lock`]), run `work` on a scoped thread
    /// while this thread keeps the lock extended by quorum, then release it.
    ///
    /// The work gets a [`LockSignal`] that fires when an extension finds the lock no longer
    /// held, or when less than [`HoldOptions::lost_at`] of the TTL is left before the lock's
    /// deadline (extensions that fail for want of answers are retried until then); the work
    /// should then stop (it is not killed). The result says whether the lock held
    /// throughout.
    ///
    /// Meanwhile the masters watch the lock's keys, and this thread waits on their
    /// connections: keys deleted by hand, overwritten or lost with restarted masters on a
    /// quorum fire the signal within a round trip, not at the next extension (see
    /// docs/production.md, "Lost at once").
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let mut redlock = redlock_mux::Redlock::new(["127.0.0.1:7000"]).unwrap();
    /// let held = redlock.run_locked("report:daily", Duration::from_secs(10), |signal| {
    ///     let mut done = 0;
    ///     while done < 100 && !signal.is_lost() {
    ///         done += 1; // one step of work
    ///     }
    ///     done
    /// })?;
    /// assert!(held.held_throughout || held.lost.is_some());
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn run_locked<T, F>(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        work: F,
    ) -> Result<Held<T>, Error>
    where
        F: FnOnce(&LockSignal) -> T + Send,
        T: Send,
    {
        self.run_locked_with(resource, ttl, HoldOptions::default(), work)
    }

    /// [`Redlock::run_locked`] with explicit [`HoldOptions`].
    pub fn run_locked_with<T, F>(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        opts: HoldOptions,
        work: F,
    ) -> Result<Held<T>, Error>
    where
        F: FnOnce(&LockSignal) -> T + Send,
        T: Send,
    {
        let lock = self.lock(resource, ttl)?;
        Ok(self.hold(lock, ttl, opts, work))
    }

    /// Run `work` while keeping an already acquired `lock` extended; releases it at the end.
    pub fn hold<T, F>(
        &mut self,
        mut lock: Lock,
        ttl: Duration,
        opts: HoldOptions,
        work: F,
    ) -> Held<T>
    where
        F: FnOnce(&LockSignal) -> T + Send,
        T: Send,
    {
        let mut keep = KeepAlive::new(ttl, &opts, Instant::now());
        let signal = LockSignal::new(lock.valid_until(), keep.stop_at(lock.valid_until()));
        let mut lost: Option<Error> = None;
        // The masters watch the lock's keys: this thread reads their connections while it
        // waits, and hears within a round trip that the lock is gone (see `core::watch`).
        let watch = self.core.watch_lock(&lock, Instant::now());
        let waker = self.driver.waker();
        let value = std::thread::scope(|s| {
            let worker = s.spawn(|| {
                // Mark done even if the work panics, so the keeper stops.
                struct Done<'a>(&'a LockSignal, &'a mio::Waker);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.mark_done();
                        // The keeper may be waiting on the masters' sockets.
                        let _ = self.1.wake();
                    }
                }
                let _done = Done(&signal, &waker);
                work(&signal)
            });
            // Keep the lock until the work is done; after a loss there is nothing left to
            // keep, and `join` below waits for the work.
            loop {
                let wake = keep.next_wake(lock.valid_until(), Instant::now());
                if self.wait_on_masters(&signal, watch, wake) {
                    break;
                }
                if let Some(e) = self.core.watch_lost(watch) {
                    lost = Some(e);
                    signal.mark_lost();
                    break;
                }
                if signal.is_lost() {
                    lost = Some(keep.lost_reason());
                    break;
                }
                let now = Instant::now();
                if !keep.may_extend(now) {
                    continue; // woke early: wait on for the margin
                }
                let result = self.extend(&mut lock, keep.ttl());
                let retry_in = self.round_timeout(keep.ttl());
                match keep.after_extend(result, Instant::now(), retry_in) {
                    AfterExtend::KeepGoing => {
                        let until = lock.valid_until();
                        signal.set_deadline(until, keep.stop_at(until));
                    }
                    AfterExtend::Lost(e) => {
                        lost = Some(e);
                        signal.mark_lost();
                        break;
                    }
                }
            }
            worker.join()
        });
        self.core.unwatch_lock(watch);
        let value = match value {
            Ok(v) => v,
            Err(panic) => {
                let _ = self.release(lock);
                std::panic::resume_unwind(panic)
            }
        };
        // The work may have been told the lock was lost (the margin passed) although the
        // keeper saw the work finish first: then it did not hold throughout either.
        let still_valid = lock.is_valid() && !signal.lost.load(Ordering::Acquire);
        let released = self.release(lock);
        if lost.is_none() && !still_valid {
            lost = Some(Error::Expired);
        }
        if lost.is_none() {
            if let Err(e @ Error::NotHeld(_)) = released {
                lost = Some(e);
            }
        }
        Held {
            value,
            held_throughout: lost.is_none(),
            extensions: keep.extensions,
            lost,
        }
    }

    /// The keeper's wait until `wake`: on the masters' connections (their invalidations,
    /// the replies still owed), until the work is done, the watch finds the lock lost or
    /// `wake` passes. Returns whether the work is done. Should the event loop fail, the
    /// wait goes on without the masters (the lock is then kept by its extensions alone).
    fn wait_on_masters(&mut self, signal: &LockSignal, watch: WatchId, wake: Instant) -> bool {
        if signal.done.load(Ordering::Acquire) {
            return true;
        }
        let now = match self.enter() {
            Ok(now) => now,
            Err(_) => return signal.wait_done(wake),
        };
        let done = &signal.done;
        // A whole hold is no time to spin, whatever the client's busy-poll setting.
        let busy = self.driver.set_busy_poll(false);
        let r = self.driver.drive(
            &mut self.core,
            now,
            Some(wake),
            |c| c.is_watch_lost(watch),
            || done.load(Ordering::Acquire),
        );
        self.driver.set_busy_poll(busy);
        match r {
            Ok(_) => done.load(Ordering::Acquire),
            Err(_) => signal.wait_done(wake),
        }
    }
}
