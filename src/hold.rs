//! Auto-extension: run work under a lock that the client keeps extended, with a lost-lock
//! signal the work can poll or wait on.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::client::{Lock, Redlock};
use crate::error::Error;

/// Tells the work whether its lock is still held. Cheap to poll ([`LockSignal::is_lost`]);
/// can also be waited on ([`LockSignal::wait_lost`]).
#[derive(Debug)]
pub struct LockSignal {
    lost: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Clone, Copy)]
struct State {
    lost: bool,
    done: bool,
    valid_until: Instant,
}

impl LockSignal {
    fn new(valid_until: Instant) -> Self {
        LockSignal {
            lost: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(State {
                lost: false,
                done: false,
                valid_until,
            }),
            cv: Condvar::new(),
        }
    }

    /// `true` once the lock is lost (an extension failed to reach a quorum, or validity
    /// ran out). Stop touching the protected resource when it turns true.
    pub fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Acquire)
    }

    /// When the lock's validity ends, as of its acquisition or its last successful
    /// extension (each extension moves it forward; after a loss it stays where it was).
    ///
    /// The keeper marks a loss only when it wakes up to extend: work that was paused (its
    /// process stopped, say) can compare this with `Instant::now()` before it touches the
    /// protected resource again, rather than trust [`LockSignal::is_lost`] alone.
    pub fn valid_until(&self) -> Instant {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .valid_until
    }

    fn set_valid_until(&self, until: Instant) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .valid_until = until;
    }

    /// Wait up to `timeout` for the lock to be lost; returns [`LockSignal::is_lost`].
    /// Useful as an interruptible sleep inside the work.
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        self.wait_until(Instant::now() + timeout, |st| st.lost).lost
    }

    /// Wait until `pred` holds or `deadline` passes; returns the state then.
    fn wait_until(&self, deadline: Instant, pred: impl Fn(&State) -> bool) -> State {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while !pred(&st) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *st
    }

    fn mark_lost(&self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.lost = true;
        self.lost.store(true, std::sync::atomic::Ordering::Release);
        self.cv.notify_all();
    }

    fn mark_done(&self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.done = true;
        self.cv.notify_all();
    }

    /// Wait until the work is done or `until`; returns whether it is done.
    fn wait_done(&self, until: Instant) -> bool {
        self.wait_until(until, |st| st.done).done
    }
}

/// How [`Redlock::run_locked`] keeps a lock alive.
#[derive(Debug, Clone, Copy)]
pub struct HoldOptions {
    /// Extend when less than this fraction of the TTL's validity is left (default 1/3;
    /// clamped to 0.05..=0.9).
    pub extend_at: f64,
    /// At most this many extensions (default unlimited); after that the lock runs out and
    /// the signal fires.
    pub max_extensions: Option<u32>,
    /// Hold at most this long in all (default unlimited); extensions stop there.
    pub max_hold: Option<Duration>,
}

impl Default for HoldOptions {
    fn default() -> Self {
        HoldOptions {
            extend_at: 1.0 / 3.0,
            max_extensions: None,
            max_hold: None,
        }
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
    /// The work gets a [`LockSignal`] that fires the moment an extension fails to reach a
    /// quorum or the validity runs out; the work should then stop (it is not killed). The
    /// result says whether the lock held throughout.
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
        let signal = LockSignal::new(lock.valid_until());
        let started = Instant::now();
        let margin = ttl.mul_f64(opts.extend_at.clamp(0.05, 0.9));
        let mut extensions = 0u32;
        let mut lost: Option<Error> = None;
        let value = std::thread::scope(|s| {
            let worker = s.spawn(|| {
                // Mark done even if the work panics, so the keeper stops.
                struct Done<'a>(&'a LockSignal);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.mark_done();
                    }
                }
                let _done = Done(&signal);
                work(&signal)
            });
            // Keep the lock until the work is done; after a loss there is nothing left to
            // keep, and `join` below waits for the work.
            loop {
                let may_extend = opts.max_extensions.is_none_or(|m| extensions < m)
                    && opts.max_hold.is_none_or(|h| started.elapsed() + ttl <= h);
                let until = lock.valid_until();
                let wake = if may_extend {
                    until.checked_sub(margin).unwrap_or(until)
                } else {
                    until
                };
                if signal.wait_done(wake) {
                    break;
                }
                let kept = if !lock.is_valid() {
                    Err(Error::Expired)
                } else if may_extend {
                    self.extend(&mut lock, ttl).map(|()| {
                        signal.set_valid_until(lock.valid_until());
                        extensions += 1;
                    })
                } else {
                    Ok(()) // woke early: wait on
                };
                if let Err(e) = kept {
                    lost = Some(e);
                    signal.mark_lost();
                    break;
                }
            }
            match worker.join() {
                Ok(v) => v,
                Err(panic) => {
                    let _ = self.release(lock.clone());
                    std::panic::resume_unwind(panic)
                }
            }
        });
        let still_valid = lock.is_valid();
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
            extensions,
            lost,
        }
    }
}
