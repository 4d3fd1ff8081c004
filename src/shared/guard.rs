//! [`LockGuard`]: a lock held through the shared client, released when dropped; and the
//! state it shares with the loop (deadline, lost flag, who waits for a loss).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::pending::{Pending, Slot};
use super::{Command, Inner};
use crate::engine::KeyList;
use crate::error::Error;
use crate::keep::HoldOptions;
use crate::lock::Lock;
use crate::token::Token;

/// A lock's state, shared by its guard and the loop.
pub(crate) struct LockState {
    pub keys: KeyList,
    pub token: Token,
    pub fence: Option<u64>,
    pub acquired_at: Instant,
    pub attempts: u32,
    pub line: Option<crate::engine::Fingerprint>,
    /// The clock's origin for the atomics below.
    base: Instant,
    valid_until_ns: AtomicU64,
    ttl_ms: AtomicU64,
    /// Past this instant (ns after `base`) the lock counts as lost: its deadline minus the
    /// lost margin (no margin unless auto-extended).
    stop_at_ns: AtomicU64,
    lost: AtomicBool,
    watch: Mutex<Watch>,
    cv: Condvar,
}

#[derive(Default)]
struct Watch {
    lost: bool,
    /// Why, when the loop knows.
    why: Option<String>,
    wakers: Vec<Waker>,
    /// The loop was asked to wake `wakers` when the lost instant passes.
    timer: bool,
}

fn ns(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

impl LockState {
    pub(crate) fn new(mut lock: Lock, base: Instant) -> LockState {
        let until = ns(base, lock.valid_until);
        LockState {
            keys: std::mem::take(&mut lock.keys),
            token: lock.token,
            fence: lock.fence,
            acquired_at: lock.acquired_at,
            attempts: lock.attempts,
            line: lock.line,
            base,
            valid_until_ns: AtomicU64::new(until),
            ttl_ms: AtomicU64::new(lock.ttl.as_millis() as u64),
            stop_at_ns: AtomicU64::new(until),
            lost: AtomicBool::new(false),
            watch: Mutex::new(Watch::default()),
            cv: Condvar::new(),
        }
    }

    fn at(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.at(self.valid_until_ns.load(Ordering::Acquire))
    }

    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Acquire))
    }

    pub(crate) fn stop_at(&self) -> Instant {
        self.at(self.stop_at_ns.load(Ordering::Acquire))
    }

    /// The lock as a value, for the loop's release and extend tasks.
    pub(crate) fn to_lock(&self) -> Lock {
        let mut keys = KeyList::default();
        keys.assign(&self.keys);
        Lock {
            keys,
            token: self.token,
            ttl: self.ttl(),
            acquired_at: self.acquired_at,
            valid_until: self.valid_until(),
            fence: self.fence,
            attempts: self.attempts,
            line: self.line,
            dropped: None,
        }
    }

    /// An extension went through: the new deadline and TTL, and the lost instant
    /// `margin` before the deadline.
    pub(crate) fn extended(&self, valid_until: Instant, ttl: Duration, margin: Duration) {
        let stop = valid_until.checked_sub(margin).unwrap_or(valid_until);
        self.ttl_ms.store(ttl.as_millis() as u64, Ordering::Release);
        self.valid_until_ns
            .store(ns(self.base, valid_until), Ordering::Release);
        self.stop_at_ns
            .store(ns(self.base, stop), Ordering::Release);
    }

    /// Move the lost instant (auto-extension sets its margin).
    pub(crate) fn set_stop_at(&self, at: Instant) {
        self.stop_at_ns.store(ns(self.base, at), Ordering::Release);
    }

    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if Instant::now() >= self.stop_at() {
            self.mark_lost(None);
            return true;
        }
        false
    }

    /// The lock is lost (`why`, when known): wake everyone who waits for it.
    pub(crate) fn mark_lost(&self, why: Option<&Error>) {
        let mut w = self.watch();
        if !w.lost {
            w.lost = true;
            w.why = why.map(|e| e.to_string());
        }
        self.lost.store(true, Ordering::Release);
        let wakers = std::mem::take(&mut w.wakers);
        drop(w);
        self.cv.notify_all();
        for waker in wakers {
            waker.wake();
        }
    }

    fn watch(&self) -> MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A lock held through the shared client ([`crate::SharedRedlock`]).
///
/// Dropping it releases the lock: the release is queued to the loop, and dropping never
/// blocks. [`LockGuard::release`] releases it and says how that went. Not `Clone`: one
/// guard, one release.
///
/// The lost-lock signal: [`LockGuard::is_lost`] (an atomic load and a clock read),
/// [`LockGuard::wait_lost`] (blocking) and [`LockGuard::lost`] (a future). A lock is lost
/// when its validity runs out (minus the [`HoldOptions::lost_at`] margin when it is
/// auto-extended), or when an extension finds it no longer held.
pub struct LockGuard {
    inner: Arc<Inner>,
    state: Arc<LockState>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self
            .state
            .keys
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        f.debug_struct("LockGuard")
            .field("resources", &names)
            .field("token", &self.state.token)
            .field("remaining", &self.remaining())
            .field("fence", &self.state.fence)
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(inner: Arc<Inner>, state: Arc<LockState>) -> LockGuard {
        LockGuard {
            inner,
            state,
            released: false,
        }
    }

    /// The (first) resource name.
    pub fn resource(&self) -> &[u8] {
        self.state.keys.iter().next().unwrap_or(&[])
    }
    /// Every resource of a multi-resource lock (one for a plain lock).
    pub fn resources(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.state.keys.iter()
    }
    /// The random token stored as the keys' value.
    pub fn token(&self) -> &Token {
        &self.state.token
    }
    /// The fencing token, when the client was built with
    /// [`Builder::fencing`](crate::Builder::fencing) (see
    /// [`Lock::fencing_token`](crate::Lock::fencing_token)).
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.fence
    }
    /// How many acquire attempts the lock call made to get this lock (see
    /// [`Lock::attempts`](crate::Lock::attempts)).
    pub fn attempts(&self) -> u32 {
        self.state.attempts
    }
    /// The TTL the lock was last set (or extended) with.
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }
    /// Until when the lock can be trusted, on the monotonic clock (moved by extensions).
    pub fn valid_until(&self) -> Instant {
        self.state.valid_until()
    }
    /// Validity left now (zero once it ran out).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }
    /// `true` while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until()
    }

    /// `true` once the lock is lost: its validity ran out (less than the margin left when
    /// auto-extended), or an extension found it no longer held. Stays true.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Block up to `timeout` for the lock to be lost; returns [`LockGuard::is_lost`]. An
    /// interruptible sleep for work done under the lock. Any timeout is fine
    /// (`Duration::MAX` waits until the loss).
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut w = self.state.watch();
        loop {
            if w.lost {
                return true;
            }
            let now = Instant::now();
            let stop = self.state.stop_at();
            if now >= stop {
                drop(w);
                self.state.mark_lost(None);
                return true;
            }
            let until = deadline.map_or(stop, |d| d.min(stop));
            if now >= until {
                return false;
            }
            w = self
                .state
                .cv
                .wait_timeout(w, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A future that completes when the lock is lost (the loop's timers wake it when the
    /// validity runs out). For `select!` against the work done under the lock.
    pub fn lost(&self) -> Lost<'_> {
        Lost { guard: self }
    }

    /// Why the lock was lost, when an extension said (e.g. "not held"); `None` while it
    /// is not lost or when it simply ran out.
    pub fn lost_reason(&self) -> Option<String> {
        self.state.watch().why.clone()
    }

    /// Extend the lock to live at least `ttl` from now (as
    /// [`Redlock::extend`](crate::Redlock::extend): never shortens it). The guard's
    /// deadline moves when it succeeds.
    pub fn extend(&self, ttl: Duration) -> Pending<()> {
        let ttl = match self.inner.settings.check_ttl(ttl) {
            Ok(t) => t,
            Err(e) => return Pending::ready(self.inner.clone(), Err(e)),
        };
        let slot = Slot::new();
        self.inner.queue(Command::Extend {
            state: self.state.clone(),
            ttl,
            slot: slot.clone(),
        });
        Pending::new(self.inner.clone(), slot)
    }

    /// Keep the lock extended from the loop's timers (no thread per lock): extend when
    /// less than `opts.extend_at` of the TTL is left, retry extensions that get no quorum
    /// until less than `opts.lost_at` is left; the lock is lost then, or when an extension
    /// finds it no longer held. Extensions ask for the lock's current TTL.
    pub fn auto_extend(&self, opts: HoldOptions) {
        self.inner.submit(Command::KeepAlive {
            state: self.state.clone(),
            opts,
        });
    }

    /// Release the lock on every master and say how it went: `Ok` when a quorum
    /// confirmed, [`Error::NotHeld`] when the lock had already expired or been lost.
    pub fn release(mut self) -> Pending<()> {
        self.released = true;
        let slot = Slot::new();
        self.inner.queue(Command::Release {
            state: self.state.clone(),
            slot: Some(slot.clone()),
        });
        Pending::new(self.inner.clone(), slot)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            self.inner.submit(Command::Release {
                state: self.state.clone(),
                slot: None,
            });
        }
    }
}

/// The future of [`LockGuard::lost`].
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct Lost<'g> {
    guard: &'g LockGuard,
}

impl Future for Lost<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let state = &self.guard.state;
        if state.is_lost() {
            return Poll::Ready(());
        }
        let mut w = state.watch();
        if w.lost {
            return Poll::Ready(());
        }
        if !w.wakers.iter().any(|x| x.will_wake(cx.waker())) {
            w.wakers.push(cx.waker().clone());
        }
        let first = !std::mem::replace(&mut w.timer, true);
        drop(w);
        if first {
            // The loop wakes us when the lost instant passes.
            self.guard.inner.submit(Command::Watch(state.clone()));
        }
        Poll::Pending
    }
}
