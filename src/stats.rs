//! What each master did, for monitoring: counters and a fixed-size latency histogram,
//! named by master ([`MasterStats`]). Kept by the core (the driver adds its syscalls) at a few instructions per reply.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::rules::{Fault, Outcome};

/// Buckets of [`Latency`]: 4 per power of two, from 0 µs to about 35 minutes.
const BUCKETS: usize = 128;

/// A latency histogram with a fixed size and no allocation: 4 buckets per power of two of
/// microseconds (a value is known to within 25%), 0 µs to about 35 minutes.
#[derive(Clone, PartialEq, Eq)]
pub struct Latency {
    /// How many latencies fell in each bucket (their sum is the count: not kept aside, one
    /// addition less per reply).
    counts: [u64; BUCKETS],
    max_us: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            counts: [0; BUCKETS],
            max_us: 0,
        }
    }
}

impl Latency {
    /// Record one latency.
    #[cfg(test)]
    fn record(&mut self, d: Duration) {
        self.record_us(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    /// Record one latency, in microseconds.
    #[inline(always)]
    pub(crate) fn record_us(&mut self, us: u64) {
        self.counts[bucket(us)] += 1;
        self.max_us = self.max_us.max(us);
    }

    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The latency at quantile `q` (0.0..=1.0; 0.5 is the median), as the upper edge of
    /// its bucket (at most 25% above the true value); `None` before the first record.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let upper = upper_edge(i).min(self.max_us);
                return Some(Duration::from_micros(upper));
            }
        }
        Some(Duration::from_micros(self.max_us))
    }

    /// The largest latency recorded.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }
}

impl fmt::Debug for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Latency")
            .field("count", &self.count())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max())
            .finish()
    }
}

/// The bucket of `us` microseconds: 0..3 exactly, then 4 per power of two.
#[inline]
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros() as usize; // >= 2
    let sub = ((us >> (exp - 2)) & 3) as usize;
    ((exp - 1) * 4 + sub).min(BUCKETS - 1)
}

/// The largest value in bucket `i`.
fn upper_edge(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let exp = i / 4 + 1;
    let sub = (i % 4) as u64;
    ((4 + sub + 1) << (exp - 2)) - 1
}

/// The core's counters of one master (plain numbers, updated in place).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub connects: u64,
    pub writes: u64,
    pub reads: u64,
    pub noscript: u64,
    pub disconnects: u64,
    pub last_fault: Option<Fault>,
    pub requests: u64,
    pub ok: u64,
    pub refused: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub latency: Latency,
    /// Subscription connections opened (release notifications).
    pub sub_connects: u64,
    /// Release notifications received.
    pub notices: u64,
    /// Why the last subscription connection closed, or a subscription was refused.
    pub last_sub_fault: Option<Fault>,
    /// The master listed before this one that is the same server (same `run_id`).
    pub same_as: Option<usize>,
}

/// The counters of the watch of held locks (see `core::watch`), by master: apart from
/// [`Counters`], which a lock cycle touches on every reply.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WatchCounters {
    /// Invalidations the master pushed for watched locks' keys.
    pub invalidations: u64,
    /// Keys the master had lost that an extension put back.
    pub restored: u64,
    /// Whether the master tracks watched keys (`None`: never asked).
    pub tracking: Option<bool>,
}

impl Counters {
    /// Master's outcome for a request of a round (a reply, a failure, or a timeout).
    #[inline]
    pub(crate) fn outcome(&mut self, o: Outcome) {
        match o {
            Outcome::Ok => self.ok += 1,
            Outcome::Taken | Outcome::NotHeld => self.refused += 1,
            Outcome::TimedOut => self.timed_out += 1,
            Outcome::Failed(_) => self.failed += 1,
            Outcome::Pending => {}
        }
    }
}

/// What one master did since the client was built: connections, requests and their
/// outcomes, and how long its answers took (from a round's start to the master's reply).
#[derive(Clone)]
pub struct MasterStats {
    name: Arc<str>,
    c: Counters,
    w: WatchCounters,
}

impl MasterStats {
    pub(crate) fn new(name: Arc<str>, c: Counters) -> Self {
        MasterStats {
            name,
            c,
            w: WatchCounters::default(),
        }
    }
    /// With the watch's counters of this master.
    pub(crate) fn with_watch(mut self, w: WatchCounters) -> Self {
        self.w = w;
        self
    }
    /// The driver's syscalls for this master, added to the core's counters.
    pub(crate) fn add_io(&mut self, writes: u64, reads: u64) {
        self.c.writes += writes;
        self.c.reads += reads;
    }
    /// The master, as `host:port[/db]` (never a password).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Connections established.
    pub fn connects(&self) -> u64 {
        self.c.connects
    }
    /// Connections closed (by either side) or connects that failed.
    pub fn disconnects(&self) -> u64 {
        self.c.disconnects
    }
    /// Why the last connection closed (or the last connect failed).
    pub fn last_fault(&self) -> Option<Fault> {
        self.c.last_fault
    }
    /// `write` calls (one per round when the kernel takes the bytes at once).
    pub fn writes(&self) -> u64 {
        self.c.writes
    }
    /// `read` calls.
    pub fn reads(&self) -> u64 {
        self.c.reads
    }
    /// Requests retried with `EVAL` after `-NOSCRIPT`.
    pub fn noscript(&self) -> u64 {
        self.c.noscript
    }
    /// Invalidations this master pushed for the keys of watched locks (each one checked
    /// with a read of the keys before it counts against the lock).
    pub fn invalidations(&self) -> u64 {
        self.w.invalidations
    }
    /// Keys of a held lock that this master had lost (restarted without persistence,
    /// deleted by hand) and that an extension put back: the lock stays held on a quorum and
    /// does not erode one master at a time.
    pub fn restored(&self) -> u64 {
        self.w.restored
    }
    /// Whether this master pushes invalidations for watched locks (client-side tracking:
    /// Redis 6+, Valkey): `Some(false)` when it can not (the lock is then watched on the
    /// other masters only, and this master counts as holding it); `None` before a lock was
    /// watched on this connection.
    pub fn tracking(&self) -> Option<bool> {
        self.w.tracking
    }
    /// Yes votes (acquired, released, extended, fencing draw or write-back).
    pub fn ok(&self) -> u64 {
        self.c.ok
    }
    /// "Taken" or "not held" answers.
    pub fn refused(&self) -> u64 {
        self.c.refused
    }
    /// Failures: error replies, lost connections, votes not counted, masters down.
    pub fn failed(&self) -> u64 {
        self.c.failed
    }
    /// Requests with no answer within their round's timeout.
    pub fn timed_out(&self) -> u64 {
        self.c.timed_out
    }
    /// How long this master's answers took.
    pub fn latency(&self) -> &Latency {
        &self.c.latency
    }
    /// Subscription connections opened to this master, to hear of releases while some lock
    /// call waits (see [`Builder::wait_mode`](crate::Builder::wait_mode)).
    pub fn subscription_connects(&self) -> u64 {
        self.c.sub_connects
    }
    /// Release notifications received from this master (each names one release of a
    /// resource some lock call waited on, or did within the last two seconds).
    pub fn notifications(&self) -> u64 {
        self.c.notices
    }
    /// Why the last subscription connection to this master closed, or why the master
    /// refused a subscription (e.g. `NOPERM`: an ACL user without the right to the
    /// channel; waiters then rely on their timed retries).
    pub fn last_subscription_fault(&self) -> Option<Fault> {
        self.c.last_sub_fault
    }
    /// This master is the same server (the same `run_id`, as of the last handshakes) as
    /// the master listed at this index before it: one server under two names (a host name
    /// and its address, an alias). It is sent no grants and the server votes once
    /// ([`Fault::SameServer`] in reports): list each server once, or the client has less
    /// fault tolerance than its list of masters suggests.
    pub fn same_server_as(&self) -> Option<usize> {
        self.c.same_as
    }
}

impl fmt::Debug for MasterStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterStats")
            .field("name", &self.name)
            .field("connects", &self.c.connects)
            .field("disconnects", &self.c.disconnects)
            .field("ok", &self.c.ok)
            .field("refused", &self.c.refused)
            .field("failed", &self.c.failed)
            .field("timed_out", &self.c.timed_out)
            .field("latency", &self.c.latency)
            .field("last_fault", &self.c.last_fault)
            .field("same_as", &self.c.same_as)
            .finish()
    }
}

impl fmt::Display for MasterStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.c.latency;
        write!(
            f,
            "{}: {} ok, {} refused, {} failed, {} timed out; latency p50 {:?} p99 {:?} max {:?}; \
             {} connects, {} disconnects",
            self.name,
            self.c.ok,
            self.c.refused,
            self.c.failed,
            self.c.timed_out,
            l.quantile(0.5).unwrap_or_default(),
            l.quantile(0.99).unwrap_or_default(),
            l.max(),
            self.c.connects,
            self.c.disconnects
        )?;
        if let Some(k) = self.c.same_as {
            write!(
                f,
                "; the same server as master {} (same run_id): sent no grants, votes once",
                k + 1
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_within_a_quarter() {
        let mut last = 0;
        for us in (0..100_000u64).chain([1 << 20, 1 << 30, 1 << 31, u64::MAX]) {
            let b = bucket(us);
            assert!(b >= last || us == 0, "bucket of {us} went down");
            last = b;
            if us < (1 << 31) {
                assert!(upper_edge(b) >= us, "{us} above its bucket's edge");
                assert!(
                    upper_edge(b) as f64 <= us as f64 * 1.25 + 1.0,
                    "{us}: edge {}",
                    upper_edge(b)
                );
            }
        }
    }

    #[test]
    fn quantiles() {
        let mut l = Latency::default();
        assert_eq!(l.quantile(0.5), None);
        for us in 1..=100u64 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.count(), 100);
        let p50 = l.quantile(0.5).unwrap().as_micros() as u64;
        assert!((50..=63).contains(&p50), "{p50}");
        assert_eq!(l.quantile(1.0).unwrap(), Duration::from_micros(100));
        assert_eq!(l.max(), Duration::from_micros(100));
        assert!(l.quantile(f64::NAN).is_some());
        l.record(Duration::MAX);
        assert!(l.quantile(1.0).unwrap() > Duration::from_secs(1000));
    }
}
