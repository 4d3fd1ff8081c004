//! A lock's state, shared by its guard and the loop: deadline, TTL, lost flag, and who
//! waits for a loss.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::core::KeyList;
use crate::error::Error;
use crate::lock::Lock;
use crate::token::Token;

/// A lock's state, shared by its guard and the loop.
pub(crate) struct LockState {
    pub keys: KeyList,
    pub token: Token,
    pub fence: Option<u64>,
    pub acquired_at: Instant,
    pub attempts: u32,
    pub waited: Duration,
    pub refusals: u32,
    pub woken: bool,
    /// The lock call's span (the hold is recorded in it at the release).
    #[cfg(feature = "tracing")]
    pub span: tracing::Span,
    /// The line this lock's call stood in, left by its release (hot resources).
    pub line: Option<crate::core::Fingerprint>,
    /// The clock's origin for the atomics below.
    base: Instant,
    valid_until_ns: AtomicU64,
    ttl_ms: AtomicU64,
    /// Past this instant (ns after `base`) the lock counts as lost: its deadline minus the
    /// lost margin (no margin unless auto-extended).
    stop_at_ns: AtomicU64,
    lost: AtomicBool,
    watch: Mutex<Watch>,
    pub(crate) cv: Condvar,
}

#[derive(Default)]
pub(crate) struct Watch {
    pub lost: bool,
    /// Why, when the loop knows.
    pub why: Option<String>,
    pub wakers: Vec<Waker>,
    /// The loop was asked to wake `wakers` when the lost instant passes.
    pub timer: bool,
}

fn ns(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

impl LockState {
    /// The state of `lock` (its keys taken out of it).
    pub(crate) fn new(lock: &mut Lock, base: Instant) -> LockState {
        let until = ns(base, lock.valid_until);
        LockState {
            keys: std::mem::take(&mut lock.keys),
            token: lock.token,
            fence: lock.fence,
            acquired_at: lock.acquired_at,
            attempts: lock.attempts,
            waited: lock.waited,
            refusals: lock.refusals,
            woken: lock.woken,
            #[cfg(feature = "tracing")]
            span: std::mem::replace(&mut lock.span, tracing::Span::none()),
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

    /// [`LockState::new`] written into a spare state nobody else holds: the fields one by
    /// one (no state built aside, moved in and the old one dropped); the keys are swapped
    /// with the lock's (its old ones go with the lock).
    pub(crate) fn refill(&mut self, lock: &mut Lock, base: Instant) {
        let until = ns(base, lock.valid_until);
        std::mem::swap(&mut self.keys, &mut lock.keys);
        self.token = lock.token;
        self.fence = lock.fence;
        self.acquired_at = lock.acquired_at;
        self.attempts = lock.attempts;
        self.waited = lock.waited;
        self.refusals = lock.refusals;
        self.woken = lock.woken;
        #[cfg(feature = "tracing")]
        std::mem::swap(&mut self.span, &mut lock.span);
        self.line = lock.line;
        self.base = base;
        *self.valid_until_ns.get_mut() = until;
        *self.ttl_ms.get_mut() = lock.ttl.as_millis() as u64;
        *self.stop_at_ns.get_mut() = until;
        *self.lost.get_mut() = false;
        match self.watch.get_mut() {
            // As new (nearly always already: nobody watched the last lock's loss).
            Ok(w) => {
                if w.lost || w.timer || w.why.is_some() || !w.wakers.is_empty() {
                    *w = Watch::default();
                }
            }
            Err(_) => self.watch = Mutex::new(Watch::default()),
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

    /// What a release reads of the lock (no [`Lock`] built, no key copied for it; no
    /// deadline, which a release does not read).
    pub(crate) fn on_lock(&self) -> crate::core::OnLock<'_> {
        crate::core::OnLock {
            keys: &self.keys,
            token: self.token,
            valid_until: None,
            line: self.line,
        }
    }

    /// The lock is released at `now`: its hold's duration goes into the lock call's span
    /// (`held_us`, with the `tracing` feature), as [`Lock::record_hold`] does.
    pub(crate) fn record_hold(&self, now: Instant) {
        #[cfg(feature = "tracing")]
        self.span.record(
            "held_us",
            now.saturating_duration_since(self.acquired_at).as_micros() as u64,
        );
        #[cfg(not(feature = "tracing"))]
        let _ = now;
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
            waited: self.waited,
            refusals: self.refusals,
            woken: self.woken,
            line: self.line,
            dropped: None,
            #[cfg(feature = "tracing")]
            span: self.span.clone(),
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
            super::wake(waker);
        }
    }

    pub(crate) fn watch(&self) -> MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
