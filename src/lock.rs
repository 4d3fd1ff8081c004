//! [`Lock`]: a held lock, as both front-ends hand it out.

use std::fmt;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::engine::KeyList;
use crate::token::Token;

/// A held lock. Release it with [`Redlock::release`](crate::Redlock::release); dropping it releases nothing (the
/// keys then expire after the TTL).
#[must_use = "a lock that is dropped stays held on the masters until its TTL runs out"]
#[derive(Clone)]
pub struct Lock {
    pub(crate) keys: KeyList,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) fence: Option<u64>,
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
            .finish()
    }
}
