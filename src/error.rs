//! Errors that say which master did what.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::rules::{Outcome, Tally};

/// Which operation a [`Report`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Taking a lock.
    Acquire,
    /// Releasing a lock.
    Release,
    /// Extending a lock.
    Extend,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Acquire => "acquire",
            Operation::Release => "release",
            Operation::Extend => "extend",
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

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} masters ok, {} needed",
            self.ok(),
            self.nodes.len(),
            self.quorum,
        )?;
        if self.attempts > 1 {
            write!(
                f,
                ", {} attempts in {:.1?} (the last round {:.1?})",
                self.attempts, self.total, self.elapsed
            )?;
        } else {
            write!(f, ", after {:.1?}", self.elapsed)?;
        }
        f.write_str(": ")?;
        for (k, (name, o)) in self.nodes.iter().enumerate() {
            if k > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} {o}")?;
        }
        Ok(())
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
    /// Too many masters refused the connection handshake for a configuration reason (a
    /// wrong password or user, a missing ACL permission, a database they do not have) for a
    /// quorum to be possible: not retried, since retrying changes nothing.
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
            Error::NotHeld(r) => write!(
                f,
                "lock not held on a quorum any more (expired or lost) ({r})"
            ),
            Error::Refused(r) => write!(
                f,
                "masters refused the connection (a wrong password or user, a missing ACL \
                 permission, or a database they do not have): fix the configuration; not \
                 retried ({r})"
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
