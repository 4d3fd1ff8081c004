//! Errors that say which master did what.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::rules::{Fault, Outcome, Tally};

/// Which operation a [`Report`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// Taking a lock.
    Acquire,
    /// Releasing a lock.
    Release,
    /// Extending a lock.
    Extend,
    /// Watching a held lock (the masters' invalidations and connections; see
    /// [`crate::LockGuard::lost`]).
    Watch,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Acquire => "acquire",
            Operation::Release => "release",
            Operation::Extend => "extend",
            Operation::Watch => "watch",
        })
    }
}

/// What every master answered in the last round of an operation.
#[derive(Clone, PartialEq, Eq)]
pub struct Report {
    pub(crate) op: Operation,
    pub(crate) nodes: SmallVec<[(Arc<str>, Outcome); 8]>,
    pub(crate) quorum: usize,
    pub(crate) elapsed: Duration,
    pub(crate) attempts: u32,
    /// From the first attempt's start to the last attempt's end (also when the report
    /// shows an earlier round, the last having been cut short by a deadline).
    pub(crate) total: Duration,
}

impl Report {
    pub(crate) fn new(
        op: Operation,
        names: impl Iterator<Item = Arc<str>>,
        tally: &Tally,
        elapsed: Duration,
        attempts: u32,
        total: Duration,
    ) -> Self {
        Report {
            op,
            nodes: names.zip(tally.outcomes().iter().copied()).collect(),
            quorum: tally.need(),
            elapsed,
            attempts,
            total,
        }
    }

    /// The operation.
    pub fn operation(&self) -> Operation {
        self.op
    }
    /// Each master (as `host:port`) and what it did, in configuration order.
    pub fn outcomes(&self) -> impl Iterator<Item = (&str, Outcome)> + '_ {
        self.nodes.iter().map(|(n, o)| (&**n, *o))
    }
    /// The masters with outcome `o` (compared by kind for failures: any
    /// `Outcome::Failed(_)` matches `Outcome::Failed(_)` only if equal).
    pub fn masters_with(&self, o: Outcome) -> impl Iterator<Item = &str> + '_ {
        self.nodes
            .iter()
            .filter(move |(_, x)| *x == o)
            .map(|(n, _)| &**n)
    }
    /// The masters that failed (down, error, protocol) or timed out.
    pub fn unavailable(&self) -> impl Iterator<Item = &str> + '_ {
        self.nodes
            .iter()
            .filter(|(_, x)| matches!(x, Outcome::Failed(_) | Outcome::TimedOut))
            .map(|(n, _)| &**n)
    }
    /// How many masters answered OK.
    pub fn ok(&self) -> usize {
        self.nodes.iter().filter(|(_, o)| o.is_ok()).count()
    }
    /// OK answers needed.
    pub fn quorum(&self) -> usize {
        self.quorum
    }
    /// Time the last round took.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
    /// Time from the first attempt's start to the end of the last round (equal to
    /// [`Report::elapsed`] for one attempt).
    pub fn total(&self) -> Duration {
        self.total
    }
    /// Rounds tried (1 for a single attempt).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// How a master's outcome is reported: grouped with the others of its kind, so that an
/// operator sees at a glance which masters answered, which refused, which are down and
/// which were not waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ok,
    Taken,
    NotHeld,
    /// Refusals no retry changes ([`Fault::is_configuration`]).
    Refused,
    /// Answered, but the vote does not count (amnesia guard, durability, same server).
    NotCounted,
    /// An answer that is not a vote (an error reply, bad bytes, a broken TLS session).
    Failed,
    /// Not connected: the connect failed, the connection was lost, the name did not resolve.
    Down,
    TimedOut,
    /// Not asked: too many requests in flight on its connection.
    NotAsked,
    /// Asked, but the round was decided before its answer came.
    NotWaited,
}

impl Kind {
    fn of(o: Outcome) -> Kind {
        match o {
            Outcome::Ok => Kind::Ok,
            Outcome::Taken => Kind::Taken,
            Outcome::NotHeld => Kind::NotHeld,
            Outcome::TimedOut => Kind::TimedOut,
            Outcome::Pending => Kind::NotWaited,
            Outcome::Failed(f) if f.is_configuration() => Kind::Refused,
            Outcome::Failed(Fault::Amnesiac | Fault::NotDurable | Fault::SameServer) => {
                Kind::NotCounted
            }
            Outcome::Failed(
                Fault::Down | Fault::Connect(_) | Fault::Closed(_) | Fault::Resolve(_),
            ) => Kind::Down,
            Outcome::Failed(Fault::Backlogged) => Kind::NotAsked,
            Outcome::Failed(_) => Kind::Failed,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Taken => "taken by another client",
            Kind::NotHeld => "not held",
            Kind::Refused => "refused this client",
            Kind::NotCounted => "vote not counted",
            Kind::Failed => "failed",
            Kind::Down => "down",
            Kind::TimedOut => "timed out",
            Kind::NotAsked => "not asked, backlogged",
            Kind::NotWaited => "not waited for once the round was decided",
        }
    }
}

/// What to say about one master beyond its kind's label: the fault, in words.
struct Detail(Outcome);

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Outcome::Failed(Fault::Down) => f.write_str("waiting to reconnect"),
            Outcome::Failed(Fault::Backlogged) => Ok(()),
            Outcome::Failed(fault) => fault.fmt(f),
            _ => Ok(()),
        }
    }
}

/// Groups the masters by kind (ok, taken, refused, down, ... not waited for), each with its count and names,
/// and a master's fault next to its name (once for the group when they all share it):
///
/// `3 of 5 needed: 1 ok (a), 1 taken by another client (b), 2 down, connect failed:
/// connection refused (c, d), 1 not waited for once the round was decided (e); after 1.1ms`
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} needed: ", self.quorum, self.nodes.len())?;
        let mut kinds: SmallVec<[Kind; 10]> =
            self.nodes.iter().map(|(_, o)| Kind::of(*o)).collect();
        kinds.sort_unstable();
        kinds.dedup();
        for (g, kind) in kinds.iter().enumerate() {
            if g > 0 {
                f.write_str(", ")?;
            }
            let members = || self.nodes.iter().filter(|(_, o)| Kind::of(*o) == *kind);
            let count = members().count();
            write!(f, "{count} {}", kind.label())?;
            let first = members().next().map(|(_, o)| *o);
            let shared = members().all(|(_, o)| Some(*o) == first);
            let detail = first.map(Detail).map(|d| d.to_string()).unwrap_or_default();
            if shared && !detail.is_empty() {
                write!(f, ", {detail}")?;
            }
            f.write_str(" (")?;
            for (k, (name, o)) in members().enumerate() {
                if k > 0 {
                    f.write_str(if shared { ", " } else { "; " })?;
                }
                f.write_str(name)?;
                let own = Detail(*o).to_string();
                if !shared && !own.is_empty() {
                    write!(f, " {own}")?;
                }
            }
            f.write_str(")")?;
        }
        if self.op == Operation::Watch {
            return Ok(());
        }
        if self.attempts > 1 {
            write!(f, "; {} attempts in {:.1?}, ", self.attempts, self.total)?;
            // A round decided before any answer could come (every master it needed
            // already known down) took no time: "0.0ns" reads as a measurement.
            if self.elapsed.is_zero() {
                f.write_str("the last round decided at once")
            } else {
                write!(f, "the last round {:.1?}", self.elapsed)
            }
        } else if self.elapsed.is_zero() {
            f.write_str("; decided at once")
        } else {
            write!(f, "; after {:.1?}", self.elapsed)
        }
    }
}

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Report({self})")
    }
}

/// Everything that can go wrong. `Display` says what to do about it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration can not work (no masters, bad URL, duplicate master...).
    Config(String),
    /// A call's argument is invalid (empty resource, zero TTL...).
    InvalidArgument(String),
    /// The lock is held by someone else: masters said taken and no quorum was reached.
    Taken(Box<Report>),
    /// Not enough masters answered OK, because masters were down, erred or timed out.
    NoQuorum(Box<Report>),
    /// A quorum said OK, but the round took so long that no validity was left (over the
    /// minimum). The partial lock was released.
    ValidityUsedUp(Box<Report>),
    /// Release or extend: the lock is no longer held on a quorum (it expired, or was
    /// taken over after expiring).
    NotHeld(Box<Report>),
    /// Too many masters refused this client for a configuration reason
    /// ([`Fault::is_configuration`](crate::Fault::is_configuration): a wrong password or
    /// user, an ACL without the right to the lock's keys or commands, a database they do not
    /// have, a TLS certificate that does not verify) for a quorum to be possible: not
    /// retried, since waiting changes nothing.
    Refused(Box<Report>),
    /// Extend: the lock's validity already ran out locally; it may be held by someone
    /// else by now. Take a new lock.
    Expired,
    /// The overall deadline passed before the lock was acquired.
    DeadlineExceeded(Option<Box<Report>>),
    /// The attempt was cancelled through a [`crate::CancelHandle`].
    Cancelled,
    /// A local I/O failure (the event loop or the OS random source).
    Io(std::io::Error),
}

impl Error {
    /// The report of the last round, when there was one.
    pub fn report(&self) -> Option<&Report> {
        match self {
            Error::Taken(r)
            | Error::NoQuorum(r)
            | Error::ValidityUsedUp(r)
            | Error::NotHeld(r)
            | Error::Refused(r) => Some(r),
            Error::DeadlineExceeded(r) => r.as_deref(),
            _ => None,
        }
    }
    /// `true` when another client holds the lock (retrying later may succeed).
    pub fn is_taken(&self) -> bool {
        matches!(self, Error::Taken(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m) => write!(f, "bad configuration: {m}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Taken(r) => write!(f, "lock is held by another client ({r})"),
            Error::NoQuorum(r) => write!(
                f,
                "no quorum: too few masters reachable or answering in time; check the \
                 masters marked down, timed out or failed ({r})"
            ),
            Error::ValidityUsedUp(r) => write!(
                f,
                "quorum reached too late, no validity left: raise the TTL or lower the \
                 round timeout ({r})"
            ),
            Error::NotHeld(r) if r.op == Operation::Watch => write!(
                f,
                "lock lost: the masters' watch found fewer than a quorum that may still hold \
                 it (keys deleted, overwritten or expired, masters restarted or cut off) ({r})"
            ),
            Error::NotHeld(r) => write!(
                f,
                "lock not held on a quorum any more (expired or lost) ({r})"
            ),
            Error::Refused(r) => write!(
                f,
                "masters refused this client (a wrong password or user, an ACL without the \
                 right to the lock's keys, a database they do not have, or a TLS certificate \
                 that does not verify): fix the configuration; not retried ({r})"
            ),
            Error::Expired => f.write_str(
                "lock validity already ran out: it may be held by someone else; take a new lock",
            ),
            Error::DeadlineExceeded(Some(r)) => {
                write!(
                    f,
                    "deadline passed before the lock was acquired (last round: {r})"
                )
            }
            Error::DeadlineExceeded(None) => {
                f.write_str("deadline passed before the lock was acquired")
            }
            Error::Cancelled => f.write_str("lock attempt cancelled"),
            Error::Io(e) => write!(f, "local I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{ErrorText, TlsFault};
    use std::io::ErrorKind;

    fn report(outcomes: &[Outcome], elapsed: Duration, attempts: u32) -> Report {
        let mut tally = Tally::new(outcomes.len(), crate::rules::quorum(outcomes.len()));
        for (i, o) in outcomes.iter().enumerate() {
            tally.record(i, *o);
        }
        let names = (0..outcomes.len()).map(|i| Arc::from(format!("10.0.0.{}:6379", i + 1)));
        Report::new(
            Operation::Acquire,
            names,
            &tally,
            elapsed,
            attempts,
            elapsed * attempts,
        )
    }

    /// The report says which masters answered what, which are down and which were not
    /// waited for: a master that said "taken" is never hidden behind "0 ok".
    #[test]
    fn a_report_groups_the_masters_by_what_they_did() {
        let refused = Outcome::Failed(Fault::Connect(ErrorKind::ConnectionRefused));
        let r = report(
            &[
                Outcome::Taken,
                refused,
                refused,
                Outcome::Pending,
                Outcome::Pending,
            ],
            Duration::from_micros(1100),
            1,
        );
        assert_eq!(
            r.to_string(),
            "3 of 5 needed: 1 taken by another client (10.0.0.1:6379), 2 down, connect \
             failed: connection refused (10.0.0.2:6379, 10.0.0.3:6379), 2 not waited for once \
             the round was decided (10.0.0.4:6379, 10.0.0.5:6379); after 1.1ms"
        );
        // Two masters, one down: the healthy one is named as ok.
        let r = report(
            &[Outcome::Ok, Outcome::Failed(Fault::Down)],
            Duration::ZERO,
            12,
        );
        assert_eq!(
            r.to_string(),
            "2 of 2 needed: 1 ok (10.0.0.1:6379), 1 down, waiting to reconnect \
             (10.0.0.2:6379); 12 attempts in 0.0ns, the last round decided at once"
        );
        // Attempts over 700 ms whose last round was decided before any answer could come
        // (it said "the last round 0.0ns").
        let mut tally = Tally::new(2, 2);
        tally.record(0, Outcome::Pending);
        tally.record(
            1,
            Outcome::Failed(Fault::Connect(ErrorKind::ConnectionRefused)),
        );
        let names = ["127.0.0.1:7000", "127.0.0.1:7001"].map(Arc::from);
        let r = Report::new(
            Operation::Acquire,
            names.into_iter(),
            &tally,
            Duration::ZERO,
            5,
            Duration::from_millis(699),
        );
        assert_eq!(
            r.to_string(),
            "2 of 2 needed: 1 down, connect failed: connection refused (127.0.0.1:7001), 1 not \
             waited for once the round was decided (127.0.0.1:7000); 5 attempts in 699.0ms, \
             the last round decided at once"
        );
        // Different faults in one group: each next to its master.
        let r = report(
            &[
                Outcome::Failed(Fault::Down),
                Outcome::Failed(Fault::Closed(ErrorKind::ConnectionReset)),
                Outcome::Ok,
            ],
            Duration::ZERO,
            1,
        );
        assert_eq!(
            r.to_string(),
            "2 of 3 needed: 1 ok (10.0.0.3:6379), 2 down (10.0.0.1:6379 waiting to \
             reconnect; 10.0.0.2:6379 connection lost: connection reset); decided at once"
        );
        // Refusals no retry changes, and whole words of a long error.
        let noperm = Outcome::Failed(Fault::Redis(ErrorText::new(
            b"NOPERM this user has no permissions to access one of the keys used as arguments",
        )));
        let tls = Outcome::Failed(Fault::Tls(TlsFault::UnknownIssuer));
        let r = report(&[noperm, noperm, tls], Duration::from_millis(2), 1);
        let text = r.to_string();
        assert!(
            text.starts_with(
                "2 of 3 needed: 3 refused this client (10.0.0.1:6379 error reply: NOPERM this \
                 user has no permissions to access one of the keys…; 10.0.0.2:6379 error \
                 reply: NOPERM"
            ),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.3:6379 TLS: certificate verification failed"),
            "{text}"
        );
    }
}
