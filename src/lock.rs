//! [`Lock`]: a held lock, as both front-ends hand it out.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::core::KeyList;
use crate::token::Token;

/// Longest resource name accepted, in bytes.
pub const MAX_RESOURCE_LEN: usize = 4096;
/// Longest TTL accepted: 2^31 - 1 ms (about 24.8 days), like most timer APIs.
pub const MAX_TTL: Duration = Duration::from_millis((1 << 31) - 1);

/// A lock held through the single-owner [`Redlock`](crate::Redlock). Release it with
/// [`Redlock::release`](crate::Redlock::release), which says how that went. A `Lock`
/// dropped without a release is not leaked for its whole TTL: its client releases it at
/// its next call (or when the client is dropped); to leave one to expire by itself, as a
/// holder that died would, `std::mem::forget` it. Not `Clone`: one lock, one release.
///
/// ```compile_fail
/// # fn f(lock: redlock_mux::Lock) {
/// let twice = lock.clone(); // a lock has one owner, and one release
/// # }
/// ```
#[must_use = "a dropped lock is only released by its client's next call: release it"]
pub struct Lock {
    pub(crate) keys: KeyList,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) fence: Option<u64>,
    /// Acquire attempts this lock took (1: the first one).
    pub(crate) attempts: u32,
    /// From the lock call to the grant.
    pub(crate) waited: Duration,
    /// Attempts refused because the lock was taken.
    pub(crate) refusals: u32,
    /// The granting attempt was started by a release's announcement.
    pub(crate) woken: bool,
    /// The lock call's span: the hold's duration is recorded in it at the release.
    #[cfg(feature = "tracing")]
    pub(crate) span: tracing::Span,
    /// Its id in its key's line of waiters on the masters, if it waited there: the release
    /// takes it out of line.
    pub(crate) line: Option<crate::core::Fingerprint>,
    /// Where this lock goes if it is dropped unreleased (`None`: not handed to a user).
    pub(crate) dropped: Option<Arc<Dropped>>,
}

/// The locks a single-owner client's user dropped without releasing them.
#[derive(Default)]
pub(crate) struct Dropped {
    /// How many are in `locks`: a check without the mutex on every call.
    count: AtomicUsize,
    locks: Mutex<Vec<Lock>>,
}

impl Dropped {
    /// Move the dropped locks into `into` (reused storage); nothing when there are none.
    pub(crate) fn take_into(&self, into: &mut Vec<Lock>) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut v = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        self.count.store(0, Ordering::Release);
        into.append(&mut v);
    }

    fn push(&self, lock: Lock) {
        let mut v = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        v.push(lock);
        self.count.store(v.len(), Ordering::Release);
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if let Some(d) = self.dropped.take() {
            let lock = Lock {
                keys: std::mem::take(&mut self.keys),
                token: self.token,
                ttl: self.ttl,
                acquired_at: self.acquired_at,
                valid_until: self.valid_until,
                fence: self.fence,
                attempts: self.attempts,
                waited: self.waited,
                refusals: self.refusals,
                woken: self.woken,
                line: self.line,
                dropped: None,
                #[cfg(feature = "tracing")]
                span: std::mem::replace(&mut self.span, tracing::Span::none()),
            };
            d.push(lock);
        }
    }
}

impl Lock {
    /// The (first) resource name.
    pub fn resource(&self) -> &[u8] {
        self.keys.iter().next().unwrap_or(&[])
    }
    /// The resource name as text, if it is UTF-8.
    pub fn resource_str(&self) -> Option<&str> {
        std::str::from_utf8(self.resource()).ok()
    }
    /// Every resource of a multi-resource lock (one for a plain lock).
    pub fn resources(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.keys.iter()
    }
    /// The random token stored as the keys' value.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// The TTL the lock was last set (or extended) with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
    /// When the acquiring round started, on the monotonic clock.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }
    /// Until when the lock can be trusted, on the monotonic clock:
    /// round start + TTL - drift allowance.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
    /// Validity left now (zero once it ran out).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
    /// `true` while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
    /// `true` when less than `margin` of validity is left: time to [`Redlock::extend`](crate::Redlock::extend).
    /// The building block for a hand-written keep-alive loop.
    pub fn should_extend(&self, margin: Duration) -> bool {
        self.remaining() < margin
    }
    /// The fencing token, when the client was built with [`Builder::fencing`](crate::Builder::fencing): strictly
    /// greater than the token of every earlier holder of any of this lock's resources,
    /// under the conditions of mutual exclusion plus masters that keep their data (see
    /// [`Builder::fencing`](crate::Builder::fencing)). Send it with every write to the protected resource, which
    /// should refuse a token lower than the highest it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }
    /// How many acquire attempts the lock call made to get this lock: 1 when the first
    /// one was granted; each refused attempt before it (the lock was taken, or no quorum
    /// answered) adds one.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
    /// How long the lock call waited for this lock: from the call to the grant (the
    /// granting round included; about one round trip when it was free). With the `tracing`
    /// feature it is also the `waited_us` field of the lock call's span (and the hold,
    /// from [`Lock::acquired_at`] to the release, its `held_us`).
    pub fn waited(&self) -> Duration {
        self.waited
    }
    /// How many of the call's attempts were refused because the lock was held elsewhere
    /// (the others of [`Lock::attempts`] failed for want of a quorum, or granted it).
    pub fn refusals(&self) -> u32 {
        self.refusals
    }
    /// Whether the attempt that got the lock was started by a release: the holder's
    /// release announced on the masters (or made by this client), not a timed retry.
    pub fn woken_by_release(&self) -> bool {
        self.woken
    }
    /// The lock is released at `now`: its hold's duration goes into the lock call's span
    /// (`held_us`, with the `tracing` feature; nothing without).
    #[inline]
    pub(crate) fn record_hold(&self, now: Instant) {
        #[cfg(feature = "tracing")]
        self.span.record(
            "held_us",
            now.saturating_duration_since(self.acquired_at).as_micros() as u64,
        );
        #[cfg(not(feature = "tracing"))]
        let _ = now;
    }
    /// An extension of this lock succeeded (`core::Done::Extended`): its new deadline and
    /// TTL. What the front-ends do after an extend; for those who drive the core by hand
    /// (the simulation).
    #[doc(hidden)]
    pub fn extended(&mut self, valid_until: Instant, ttl: Duration) {
        self.valid_until = valid_until;
        self.ttl = ttl;
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: SmallVec<[String; 2]> = self
            .keys
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        f.debug_struct("Lock")
            .field("resources", &names)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .field("fence", &self.fence)
            .field("attempts", &self.attempts)
            .field("waited", &self.waited)
            .finish()
    }
}
