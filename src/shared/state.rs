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
    /// The clock's origin for the atomics below: the deadline the lock was granted with,
    /// so that a grant stores [`AT_BASE`] there, no clock arithmetic.
    base: Instant,
    /// The deadline (see [`offset`]).
    valid_until_ns: AtomicU64,
    ttl_ms: AtomicU64,
    /// Past this instant (see [`offset`]) the lock counts as lost: its deadline minus the
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

/// `base` itself as an offset: the offsets are nanoseconds after `base` above it, before
/// `base` below it.
const AT_BASE: u64 = 1 << 63;

/// Instant `t` as an offset from `base` (see [`AT_BASE`]; saturating about 292 years
/// either side).
fn offset(base: Instant, t: Instant) -> u64 {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match t.checked_duration_since(base) {
        Some(after) => AT_BASE.saturating_add(ns(after)),
        None => AT_BASE.saturating_sub(ns(base.saturating_duration_since(t))),
    }
}

/// The instant `offset` stands for (see [`AT_BASE`]).
fn instant_at(base: Instant, offset: u64) -> Instant {
    if offset >= AT_BASE {
        base + Duration::from_nanos(offset - AT_BASE)
    } else {
        let before = Duration::from_nanos(AT_BASE - offset);
        base.checked_sub(before).unwrap_or(base)
    }
}

impl LockState {
    /// The state of `lock` (its keys taken out of it).
    pub(crate) fn new(lock: &mut Lock) -> LockState {
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
            base: lock.valid_until,
            valid_until_ns: AtomicU64::new(AT_BASE),
            ttl_ms: AtomicU64::new(lock.ttl.as_millis() as u64),
            stop_at_ns: AtomicU64::new(AT_BASE),
            lost: AtomicBool::new(false),
            watch: Mutex::new(Watch::default()),
            cv: Condvar::new(),
        }
    }

    /// [`LockState::new`] written into a spare state nobody else holds: the fields one by
    /// one (no state built aside, moved in and the old one dropped); the keys are swapped
    /// with the lock's (its old ones go with the lock).
    pub(crate) fn refill(&mut self, lock: &mut Lock) {
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
        self.base = lock.valid_until;
        *self.valid_until_ns.get_mut() = AT_BASE;
        *self.ttl_ms.get_mut() = lock.ttl.as_millis() as u64;
        *self.stop_at_ns.get_mut() = AT_BASE;
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

    fn at(&self, offset: u64) -> Instant {
        instant_at(self.base, offset)
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
            .store(offset(self.base, valid_until), Ordering::Release);
        self.stop_at_ns
            .store(offset(self.base, stop), Ordering::Release);
    }

    /// Move the lost instant (auto-extension sets its margin).
    pub(crate) fn set_stop_at(&self, at: Instant) {
        self.stop_at_ns
            .store(offset(self.base, at), Ordering::Release);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An instant before, at or after the base comes back as it went in.
    #[test]
    fn offsets_round_trip_either_side_of_the_base() {
        let base = Instant::now() + Duration::from_secs(3600);
        for t in [
            base,
            base + Duration::from_nanos(1),
            base + Duration::from_millis(10_500),
            base - Duration::from_nanos(1),
            base - Duration::from_secs(1800),
        ] {
            assert_eq!(instant_at(base, offset(base, t)), t);
        }
        assert_eq!(offset(base, base), AT_BASE);
        assert!(offset(base, base - Duration::from_millis(1)) < AT_BASE);
        assert!(offset(base, base + Duration::from_millis(1)) > AT_BASE);
    }
}
