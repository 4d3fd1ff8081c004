//! Keeping a lock alive: when to extend, how long to retry an extension that got no
//! answer good enough, when the lock counts as lost. One policy for both front-ends: the
//! single owner's [`crate::Redlock::hold`] runs it on the caller's thread, the shared
//! client's loop runs it on its timers.

use std::time::{Duration, Instant};

use crate::error::Error;

/// How a lock is kept alive: by [`Redlock::run_locked`](crate::Redlock::run_locked) and
/// [`Redlock::hold`](crate::Redlock::hold), and by the shared client's auto-extension
/// ([`LockGuard::auto_extend`](crate::LockGuard::auto_extend)).
///
/// Any value is accepted: fractions are clamped into their range (a NaN means the
/// default), durations may be anything up to `Duration::MAX`.
#[derive(Debug, Clone, Copy)]
pub struct HoldOptions {
    /// Extend when less than this fraction of the TTL's validity is left (default 1/3;
    /// clamped to 0.05..=0.9).
    pub extend_at: f64,
    /// The lost-lock margin: the signal fires when less than this fraction of the TTL is
    /// left before the lock's deadline and no extension moved it (default 0.1; clamped to
    /// 0..=`extend_at / 2`, which leaves the other half of the extension margin for
    /// retries). An extension that fails for want of answers (masters down, slow
    /// or restarting) is retried until then; one that finds the lock gone fires at once.
    pub lost_at: f64,
    /// At most this many extensions (default unlimited); after that the lock runs out and
    /// the signal fires, the margin before its end.
    pub max_extensions: Option<u32>,
    /// Hold at most this long in all (default unlimited); extensions stop there.
    pub max_hold: Option<Duration>,
}

impl Default for HoldOptions {
    fn default() -> Self {
        HoldOptions {
            extend_at: 1.0 / 3.0,
            lost_at: 0.1,
            max_extensions: None,
            max_hold: None,
        }
    }
}

impl HoldOptions {
    /// `(extend margin, lost margin)` for a TTL, from the clamped fractions.
    pub(crate) fn margins(&self, ttl: Duration) -> (Duration, Duration) {
        let d = HoldOptions::default();
        let or = |x: f64, default: f64| if x.is_nan() { default } else { x };
        let extend_at = or(self.extend_at, d.extend_at).clamp(0.05, 0.9);
        // At most half the extension margin: the other half is for retrying.
        let lost_at = or(self.lost_at, d.lost_at).clamp(0.0, extend_at / 2.0);
        (ttl.mul_f64(extend_at), ttl.mul_f64(lost_at))
    }
}

/// The keep-alive state of one held lock.
#[derive(Debug)]
pub(crate) struct KeepAlive {
    ttl: Duration,
    margin: Duration,
    lost_margin: Duration,
    max_extensions: Option<u32>,
    max_hold: Option<Duration>,
    started: Instant,
    pub extensions: u32,
    retry_at: Option<Instant>,
    /// Why the last extension failed, while it is being retried.
    pub last_failure: Option<Error>,
}

/// What to do after an extension.
#[derive(Debug)]
pub(crate) enum AfterExtend {
    /// Carry on (extended, or retry at the next wake).
    KeepGoing,
    /// The lock is lost: stop, for this reason.
    Lost(Error),
}

impl KeepAlive {
    pub(crate) fn new(ttl: Duration, opts: &HoldOptions, now: Instant) -> KeepAlive {
        let (margin, lost_margin) = opts.margins(ttl);
        KeepAlive {
            ttl,
            margin,
            lost_margin,
            max_extensions: opts.max_extensions,
            max_hold: opts.max_hold,
            started: now,
            extensions: 0,
            retry_at: None,
            last_failure: None,
        }
    }

    /// How long before the deadline the lock counts as lost.
    pub(crate) fn lost_margin(&self) -> Duration {
        self.lost_margin
    }

    /// The TTL each extension asks for.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// From this instant the lock counts as lost: its deadline minus the lost margin.
    pub(crate) fn stop_at(&self, valid_until: Instant) -> Instant {
        valid_until
            .checked_sub(self.lost_margin)
            .unwrap_or(valid_until)
    }

    /// Whether another extension is allowed (`max_extensions`, `max_hold`).
    pub(crate) fn may_extend(&self, now: Instant) -> bool {
        self.max_extensions.is_none_or(|m| self.extensions < m)
            && self.max_hold.is_none_or(|h| {
                now.saturating_duration_since(self.started)
                    .saturating_add(self.ttl)
                    <= h
            })
    }

    /// When to act next for a lock valid until `valid_until`: extend (or retry), or, with
    /// no extension allowed, the lost instant. Never after the lost instant.
    pub(crate) fn next_wake(&self, valid_until: Instant, now: Instant) -> Instant {
        let stop = self.stop_at(valid_until);
        let wake = match self.retry_at {
            Some(at) => at,
            None if self.may_extend(now) => {
                valid_until.checked_sub(self.margin).unwrap_or(valid_until)
            }
            None => stop,
        };
        wake.min(stop)
    }

    /// The outcome of an extension at `now`; `retry_in` is how soon to try again after a
    /// failure that may be passing (no quorum of answers, validity used up, local I/O).
    pub(crate) fn after_extend(
        &mut self,
        result: Result<(), Error>,
        now: Instant,
        retry_in: Duration,
    ) -> AfterExtend {
        match result {
            Ok(()) => {
                self.extensions += 1;
                self.retry_at = None;
                self.last_failure = None;
                AfterExtend::KeepGoing
            }
            // No answer good enough, but the lock may well be ours still (masters
            // restarting, slow, a connection that just closed): try again soon, on fresh
            // connections, until the lost margin is reached.
            Err(e @ (Error::NoQuorum(_) | Error::ValidityUsedUp(_) | Error::Io(_))) => {
                self.last_failure = Some(e);
                self.retry_at = Some(now + retry_in);
                AfterExtend::KeepGoing
            }
            // Not held any more (or expired, or a TTL the client refuses).
            Err(e) => AfterExtend::Lost(e),
        }
    }

    /// The lost instant passed: why the lock is lost.
    pub(crate) fn lost_reason(&mut self) -> Error {
        self.last_failure.take().unwrap_or(Error::Expired)
    }
}
