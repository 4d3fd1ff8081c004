//! The Redlock rules as plain state: no sockets, no clock reads, no sleeping.
//!
//! Everything here takes time as an argument, so it runs the same under the mio shell
//! ([`crate::Redlock`]) and under a simulator with fake masters and simulated time.
//!
//! * [`quorum`]: N/2 + 1.
//! * [`Tally`]: the votes of one fan-out round, and whether it is decided.
//! * [`validity`]: `ttl - elapsed - (ttl * drift_factor + 2 ms)`.
//! * [`judge_acquire`]: acquired, taken, no quorum, or validity used up.
//! * [`classify`]: what a master's reply to one of our requests means.
//! * [`retry_delay`]: a uniformly random delay around a base, so competing clients
//!   desynchronise.

use std::time::Duration;

use smallvec::SmallVec;

use crate::resp::Frame;

/// The fixed part of the clock-drift allowance: Redis expires keys with ~1 ms precision,
/// plus a margin for the client's own timer granularity.
pub const DRIFT_FIXED: Duration = Duration::from_millis(2);

/// The smallest majority of `n` masters: `n / 2 + 1`.
///
/// ```
/// assert_eq!(redlock_mux::rules::quorum(1), 1);
/// assert_eq!(redlock_mux::rules::quorum(4), 3);
/// assert_eq!(redlock_mux::rules::quorum(5), 3);
/// ```
pub const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The clock-drift allowance for a TTL: `ttl * drift_factor + 2 ms`, the product computed
/// in nanoseconds and rounded up (within 1 ns of `ttl.mul_f64(drift_factor)`).
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    // Whole nanoseconds as f64 are exact below 2^53 ns (104 days; TTLs stop at 2^31 ms).
    // Cheaper than `Duration::mul_f64`, which goes through `from_secs_f64`; `as u64`
    // saturates and maps NaN to 0, so this cannot panic.
    let ns = ttl.as_secs() as f64 * 1e9 + f64::from(ttl.subsec_nanos());
    Duration::from_nanos((ns * drift_factor).ceil() as u64) + DRIFT_FIXED
}

/// How long a lock taken with `ttl`, whose round took `elapsed`, can still be trusted:
/// `ttl - elapsed - drift`, or `None` when that is zero or less.
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::rules::validity;
/// let ttl = Duration::from_secs(10);
/// // 10 s - 5 ms - (100 ms + 2 ms)
/// assert_eq!(validity(ttl, Duration::from_millis(5), 0.01), Some(Duration::from_millis(9893)));
/// assert_eq!(validity(ttl, Duration::from_secs(10), 0.01), None);
/// ```
pub fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    validity_drifted(ttl, elapsed, drift(ttl, drift_factor))
}

/// [`validity`] given the drift allowance of `ttl` ([`drift`]: a client's locks nearly
/// always share a TTL, and the core keeps the allowance of the last one).
#[inline]
pub(crate) fn validity_drifted(
    ttl: Duration,
    elapsed: Duration,
    drift: Duration,
) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|left| left.checked_sub(drift))
        .filter(|v| !v.is_zero())
}

/// A uniformly random delay in `[base - jitter, base + jitter]` (saturating at zero).
pub fn retry_delay(base: Duration, jitter: Duration, rng: &mut fastrand::Rng) -> Duration {
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let lo = us(base.saturating_sub(jitter));
    let hi = us(base.saturating_add(jitter));
    Duration::from_micros(rng.u64(lo..=hi))
}

/// When, at the earliest, a quorum of masters can be free of a holder's keys by expiry
/// alone: `left_ms` are the remaining TTLs the masters that said "taken" reported (`-1`:
/// the key never expires), `ok` the masters that said yes (free again once our cleanup
/// ran), `need` the quorum. `None` when expiry alone never frees a quorum (too few
/// masters answered, or keys without expiry). A waiter never sleeps past this (plus
/// jitter): the holder may have crashed, and nobody announces an expiry.
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::rules::free_in;
/// // 5 masters, quorum 3: two said yes; the holder's keys expire in 40, 90 and 10 ms.
/// assert_eq!(free_in([40, 90, 10], 2, 3), Some(Duration::from_millis(10)));
/// assert_eq!(free_in([40, 90, 10], 0, 3), Some(Duration::from_millis(90)));
/// assert_eq!(free_in([40, -1], 0, 3), None);
/// ```
pub fn free_in(left_ms: impl IntoIterator<Item = i64>, ok: usize, need: usize) -> Option<Duration> {
    let Some(k) = need.checked_sub(ok).filter(|k| *k > 0) else {
        return Some(Duration::ZERO);
    };
    let mut left: SmallVec<[u64; 8]> = left_ms
        .into_iter()
        .filter(|&v| v >= 0)
        .map(|v| v as u64)
        .collect();
    if left.len() < k {
        return None;
    }
    left.sort_unstable();
    Some(Duration::from_millis(left[k - 1]))
}

/// A copy of a Redis error line (`-ERR ...`), kept inline so reporting it never allocates.
///
/// Up to 62 bytes are kept: it travels inside every [`Outcome`], which the rounds copy
/// (a round's tally holds one per master), so a wider copy would cost every round. A
/// longer message is cut at the last word that fits and shown with a trailing `…`
/// ([`ErrorText::is_cut`]), never mid-word: Redis puts what matters first (the code, then
/// the reason).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ErrorText {
    /// The length kept, with [`CUT`] set when the message was longer.
    len: u8,
    buf: [u8; 62],
}

/// The bit of `ErrorText::len` that says the message was cut.
const CUT: u8 = 0x80;

impl ErrorText {
    /// Keep `msg`, or as many of its first words as fit in 62 bytes.
    pub fn new(msg: &[u8]) -> Self {
        let mut buf = [0u8; 62];
        let (len, cut) = if msg.len() <= buf.len() {
            (msg.len(), false)
        } else {
            (cut_at_word(msg, buf.len()), true)
        };
        buf[..len].copy_from_slice(&msg[..len]);
        ErrorText {
            len: len as u8 | if cut { CUT } else { 0 },
            buf,
        }
    }
    /// The bytes kept (all of the message unless [`ErrorText::is_cut`]).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..(self.len & !CUT) as usize]
    }
    /// Whether the message was longer than what is kept (its last words are missing).
    pub fn is_cut(&self) -> bool {
        self.len & CUT != 0
    }
    /// `true` when the message starts with `prefix` (e.g. `b"NOSCRIPT"`).
    pub fn starts_with(&self, prefix: &[u8]) -> bool {
        self.as_bytes().starts_with(prefix)
    }
}

/// How many bytes of `msg` (longer than `max`) to keep: up to the last space within `max`
/// bytes, trailing spaces dropped; with no space in the second half, `max` bytes backed off
/// to the start of a UTF-8 character.
fn cut_at_word(msg: &[u8], max: usize) -> usize {
    let word_end = if msg[max] == b' ' {
        Some(max)
    } else {
        msg[..max].iter().rposition(|&b| b == b' ')
    };
    match word_end {
        Some(end) if end >= max / 2 => {
            let mut end = end;
            while end > 0 && msg[end - 1] == b' ' {
                end -= 1;
            }
            end
        }
        _ => {
            let mut end = max;
            while end > 0 && msg[end] & 0b1100_0000 == 0b1000_0000 {
                end -= 1;
            }
            end
        }
    }
}

impl std::fmt::Display for ErrorText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))?;
        if self.is_cut() {
            f.write_str("…")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for ErrorText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// Why a master could not give a usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Not connected, and the reconnect backoff has not run out yet.
    Down,
    /// Connecting failed (refused, unreachable, timed out...).
    Connect(std::io::ErrorKind),
    /// The connection closed or failed while the request was outstanding.
    Closed(std::io::ErrorKind),
    /// The master sent bytes that are not valid RESP; the connection was closed.
    Protocol(crate::resp::Error),
    /// A valid frame, but not a possible answer to the request; the connection was closed.
    Unexpected,
    /// The master answered with an error reply.
    Redis(ErrorText),
    /// The connection handshake (AUTH, SELECT, SCRIPT LOAD, INFO) was refused.
    Handshake(ErrorText),
    /// The master restarted less than `max_ttl` ago and may have forgotten held locks:
    /// its votes do not count yet (the amnesia guard).
    Amnesiac,
    /// The master had too many requests in flight (it is slower than the client's
    /// rate): it was not asked, until it catches up.
    Backlogged,
    /// Fencing is on and the master does not persist every write (`appendonly yes` and
    /// `appendfsync always`, read with `CONFIG GET` at connect), or would not say: a
    /// restart could forget its fencing counters, so its votes do not count.
    NotDurable,
    /// The master is the same server (same `run_id`) as a master listed before it: its
    /// votes do not count, or one server would vote twice.
    SameServer,
    /// Its host name did not resolve (the resolver's reason, or `timed out` after the
    /// connect timeout). Resolved again at the next connect, after the backoff.
    Resolve(ErrorText),
    /// The TLS session failed (`rediss://`): the certificate did not verify, the master
    /// refused ours, or the handshake broke. Backs off like a failed connect.
    Tls(TlsFault),
}

/// Why a TLS session with a master failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFault {
    /// The master's certificate is not signed by a trusted CA (the system's roots, or the
    /// CA file given to the builder).
    UnknownIssuer,
    /// The master's certificate is not valid for the host name (or IP address) of its URL.
    NameMismatch,
    /// The master's certificate has expired.
    Expired,
    /// The master's certificate is not valid yet.
    NotYetValid,
    /// The master's certificate was rejected for another reason (rustls' name for it).
    BadCertificate(ErrorText),
    /// The master ended the handshake with this alert, e.g. `CertificateRequired` (it wants
    /// a client certificate) or `UnknownCA` / `BadCertificate` (it rejected ours).
    Alert(ErrorText),
    /// Any other TLS failure (rustls' message).
    Other(ErrorText),
}

impl std::fmt::Display for TlsFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bad = "certificate verification failed";
        match self {
            TlsFault::UnknownIssuer => write!(
                f,
                "{bad}: not signed by a trusted CA (unknown issuer): the client must trust \
                 the CA that signed the master's certificate"
            ),
            TlsFault::NameMismatch => {
                write!(f, "{bad}: not valid for the master's host name or address")
            }
            TlsFault::Expired => write!(f, "{bad}: expired"),
            TlsFault::NotYetValid => write!(f, "{bad}: not valid yet (check the clocks)"),
            TlsFault::BadCertificate(t) => match certificate_words(t.as_bytes()) {
                Some(words) => write!(f, "{bad}: {words} ({t})"),
                None => write!(f, "{bad}: {t}"),
            },
            TlsFault::Alert(t) if t.as_bytes() == b"CertificateRequired" => write!(
                f,
                "the master requires a client certificate (alert {t}): see tls_client_cert"
            ),
            TlsFault::Alert(t) => write!(f, "the master refused the handshake (alert {t})"),
            TlsFault::Other(t) if t.as_bytes() == HANDSHAKE_TIMED_OUT => write!(
                f,
                "{t}: no answer to the TLS hello (a port that speaks plain RESP never answers \
                 one: is this the server's tls-port?)"
            ),
            TlsFault::Other(t) => t.fmt(f),
        }
    }
}

/// The text of the driver's TLS fault for a handshake with no answer within the connect
/// timeout.
const HANDSHAKE_TIMED_OUT: &[u8] = b"handshake timed out";

/// What the certificate errors rustls names (its `CertificateError`, or webpki's error
/// inside `CertificateError::Other`) mean, and what to do.
fn certificate_words(name: &[u8]) -> Option<&'static str> {
    Some(match name {
        b"CaUsedAsEndEntity" => {
            "the master presents a CA certificate (CA:TRUE), such as a self-signed one used \
             as its own CA; a server needs a certificate of its own, signed by the CA the \
             client trusts (make a CA, then a server certificate signed by it)"
        }
        b"UnsupportedCertVersion" => {
            "the master's certificate is X.509 version 1 (what `openssl x509 -req` makes \
             without -extfile); only version 3 is accepted: sign it again with extensions \
             (-extfile with a subjectAltName)"
        }
        b"EndEntityUsedAsCa" => {
            "the master's certificate is signed by a certificate that is not a CA (CA:FALSE)"
        }
        b"InvalidPurpose" => {
            "the master's certificate is not for server authentication (its extendedKeyUsage \
             lacks serverAuth)"
        }
        b"BadSignature" => {
            "the master's certificate has a bad signature (not signed by the CA it names)"
        }
        b"BadEncoding" => "the master's certificate is malformed (bad DER)",
        b"Revoked" => "the master's certificate is revoked",
        b"UnsupportedSignatureAlgorithm" => {
            "the master's certificate is signed with an algorithm rustls does not support"
        }
        b"UnhandledCriticalExtension" | b"UnsupportedCriticalExtension" => {
            "the master's certificate has a critical extension rustls does not know"
        }
        b"PathLenConstraintViolated" => {
            "the master's certificate chain is longer than a CA in it allows (pathlen)"
        }
        _ => return None,
    })
}

impl TlsFault {
    /// A failure no retry will change: the certificate does not verify, or the master
    /// refused ours (or wants one).
    fn is_configuration(&self) -> bool {
        /// The master's alerts about who we are or what we offer.
        const ALERTS: [&[u8]; 11] = [
            b"CertificateRequired",
            b"UnknownCA",
            b"BadCertificate",
            b"UnsupportedCertificate",
            b"CertificateRevoked",
            b"CertificateExpired",
            b"CertificateUnknown",
            b"AccessDenied",
            b"HandshakeFailure",
            b"ProtocolVersion",
            b"InsufficientSecurity",
        ];
        match self {
            TlsFault::UnknownIssuer
            | TlsFault::NameMismatch
            | TlsFault::Expired
            | TlsFault::NotYetValid
            | TlsFault::BadCertificate(_) => true,
            TlsFault::Alert(t) => ALERTS.contains(&t.as_bytes()),
            TlsFault::Other(_) => false,
        }
    }
}

impl Fault {
    /// A refusal no retry will change:
    /// * the handshake was refused for a wrong password or user, a missing permission, or
    ///   a database the master does not have;
    /// * the lock request itself was refused by the master's ACL (`NOPERM`: the user has no
    ///   right to the lock's keys or to the command), or for want of authentication;
    /// * the TLS session failed over a certificate: the master's does not verify (unknown
    ///   issuer, wrong name, expired, not a server certificate...), or the master refused
    ///   ours or wants one.
    ///
    /// When such refusals leave too few masters for a quorum, a lock call ends at once with
    /// [`Error::Refused`](crate::Error::Refused) instead of waiting.
    pub fn is_configuration(&self) -> bool {
        const HANDSHAKE: [&[u8]; 6] = [
            b"WRONGPASS",
            b"NOAUTH",
            b"NOPERM",
            b"ERR AUTH",
            b"ERR invalid password",
            b"ERR DB index",
        ];
        const REPLY: [&[u8]; 3] = [b"NOPERM", b"NOAUTH", b"WRONGPASS"];
        match self {
            Fault::Handshake(t) => HANDSHAKE.iter().any(|p| t.starts_with(p)),
            Fault::Redis(t) => REPLY.iter().any(|p| t.starts_with(p)),
            Fault::Tls(t) => t.is_configuration(),
            _ => false,
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Down => f.write_str("down (waiting to reconnect)"),
            Fault::Connect(k) => write!(f, "connect failed: {k}"),
            Fault::Closed(k) => write!(f, "connection lost: {k}"),
            Fault::Protocol(e) => write!(f, "protocol error: {e}"),
            Fault::Unexpected => f.write_str("unexpected reply"),
            Fault::Redis(t) => write!(f, "error reply: {t}"),
            Fault::Handshake(t) => write!(f, "handshake refused: {t}"),
            Fault::Amnesiac => f.write_str("restarted recently (amnesia guard): vote not counted"),
            Fault::Backlogged => f.write_str("backlogged (too many requests in flight): not asked"),
            Fault::NotDurable => f.write_str(
                "not durable (fencing needs appendonly yes and appendfsync always): vote not counted",
            ),
            Fault::SameServer => {
                f.write_str("same server as a master listed before it (same run_id): vote not counted")
            }
            Fault::Resolve(t) => write!(f, "cannot resolve host: {t}"),
            Fault::Tls(t) => write!(f, "TLS: {t}"),
        }
    }
}

/// What one master did in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// No answer yet.
    Pending,
    /// Yes: the key was set (acquire), deleted (release) or extended (extend).
    Ok,
    /// The key is held by someone else (`SET NX` answered null).
    Taken,
    /// Release or extend: the key does not hold our token (expired or someone else's).
    NotHeld,
    /// No answer within the round's timeout.
    TimedOut,
    /// No usable answer.
    Failed(Fault),
}

impl Outcome {
    /// `true` for [`Outcome::Ok`].
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Pending => f.write_str("not waited for (the round was decided)"),
            Outcome::Ok => f.write_str("ok"),
            Outcome::Taken => f.write_str("taken"),
            Outcome::NotHeld => f.write_str("not held"),
            Outcome::TimedOut => f.write_str("timed out"),
            Outcome::Failed(fault) => fault.fmt(f),
        }
    }
}

/// Where a round stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Neither a quorum of yes nor enough no's yet.
    Open,
    /// At least a quorum said yes.
    Reached,
    /// Too many said no (or failed) for a quorum to be possible.
    Impossible,
}

/// The votes of one fan-out round over N masters.
///
/// Inline for up to 8 masters (no allocation); more masters work but allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    need: usize,
    yes: usize,
    no: usize,
    outcomes: SmallVec<[Outcome; 8]>,
}

impl Tally {
    /// A round over `n` masters that needs `need` yes votes.
    pub fn new(n: usize, need: usize) -> Self {
        let mut outcomes = SmallVec::new();
        outcomes.resize(n, Outcome::Pending);
        Tally {
            need,
            yes: 0,
            no: 0,
            outcomes,
        }
    }

    /// Reset for reuse, keeping the storage.
    pub fn reset(&mut self, n: usize, need: usize) {
        self.need = need;
        self.yes = 0;
        self.no = 0;
        // Resized only for another master count (never, in a client: `resize` is a call
        // even when it does nothing), then overwritten in place: cheaper than clearing and
        // refilling a SmallVec.
        if self.outcomes.len() != n {
            self.outcomes.resize(n, Outcome::Pending);
        }
        self.outcomes.fill(Outcome::Pending);
    }

    /// Record master `node`'s outcome. Only the first answer per master counts; returns
    /// whether this one was recorded.
    #[inline(always)]
    pub fn record(&mut self, node: usize, outcome: Outcome) -> bool {
        match self.outcomes.get_mut(node) {
            Some(slot @ Outcome::Pending) if outcome != Outcome::Pending => {
                *slot = outcome;
                if outcome.is_ok() {
                    self.yes += 1;
                } else {
                    self.no += 1;
                }
                true
            }
            _ => false,
        }
    }

    /// Whether the round is decided.
    pub fn decision(&self) -> Decision {
        if self.yes >= self.need {
            Decision::Reached
        } else if self.yes + self.pending() < self.need {
            Decision::Impossible
        } else {
            Decision::Open
        }
    }

    /// The round's time ran out: every master still pending has timed out.
    pub fn expire(&mut self) {
        for o in self.outcomes.iter_mut() {
            if *o == Outcome::Pending {
                *o = Outcome::TimedOut;
                self.no += 1;
            }
        }
    }

    /// Yes votes so far.
    pub fn yes(&self) -> usize {
        self.yes
    }
    /// Masters that have not answered.
    pub fn pending(&self) -> usize {
        self.outcomes.len() - self.yes - self.no
    }
    /// Yes votes needed.
    pub fn need(&self) -> usize {
        self.need
    }
    /// Each master's outcome, by index.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }
    /// How many masters had `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.iter().filter(|o| **o == outcome).count()
    }
}

/// The verdict on an acquire round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireVerdict {
    /// A quorum said OK and this much validity is left.
    Acquired(Duration),
    /// No quorum, and at least one master said the key is held by someone else.
    Taken,
    /// No quorum, only because masters failed or timed out.
    NoQuorum,
    /// A quorum said OK, but the validity left is not above the minimum.
    ValidityUsedUp,
}

/// Judge a decided (or expired) acquire or extend round.
///
/// `elapsed` is measured on the monotonic clock from just before the first request was
/// written to the moment of the decision.
pub fn judge_acquire(
    tally: &Tally,
    ttl: Duration,
    elapsed: Duration,
    drift_factor: f64,
    min_validity: Duration,
) -> AcquireVerdict {
    judge_acquire_drifted(tally, ttl, elapsed, drift(ttl, drift_factor), min_validity)
}

/// [`judge_acquire`] given the drift allowance of `ttl` (see [`validity_drifted`]).
#[inline]
pub(crate) fn judge_acquire_drifted(
    tally: &Tally,
    ttl: Duration,
    elapsed: Duration,
    drift: Duration,
    min_validity: Duration,
) -> AcquireVerdict {
    if tally.yes() >= tally.need() {
        match validity_drifted(ttl, elapsed, drift) {
            Some(v) if v > min_validity => AcquireVerdict::Acquired(v),
            _ => AcquireVerdict::ValidityUsedUp,
        }
    } else if tally.count(Outcome::Taken) > 0 {
        AcquireVerdict::Taken
    } else {
        AcquireVerdict::NoQuorum
    }
}

/// After a failed acquire: may our request `req` have set our key on a master with this
/// outcome? Those masters get the compare-and-delete release.
///
/// Not set: "taken", "not held", a master we could not reach or did not ask (never got the
/// request), and an error reply to a plain `SET` (Redis runs a command whole or not at all)
/// or a `-NOSCRIPT` (the script did not run). Everything else may have: an OK, no answer
/// yet, a lost connection, a vote we did not count, a refused handshake with the request
/// already pipelined, and an error reply from a script (Lua does not roll back the writes
/// it made before the error).
pub fn may_hold(req: Request, outcome: Outcome) -> bool {
    match outcome {
        Outcome::Taken | Outcome::NotHeld => false,
        Outcome::Ok | Outcome::Pending | Outcome::TimedOut => true,
        Outcome::Failed(Fault::Down | Fault::Connect(_) | Fault::Backlogged) => false,
        Outcome::Failed(Fault::Redis(t)) => req != Request::Acquire && !t.starts_with(b"NOSCRIPT"),
        Outcome::Failed(_) => true,
    }
}

/// `[ttl, holder]` (an `AcquireWait` answer when the key is taken): the TTL left (ms, or -1)
/// and the first bytes of the holder's value.
pub fn holder_left<'a>(a: &crate::resp::Aggregate<'a>) -> Option<(i64, &'a [u8])> {
    if a.len() != 2 || a.kind() != crate::resp::AggregateKind::Array {
        return None;
    }
    let mut it = a.iter();
    match (it.next(), it.next()) {
        (Some(Frame::Integer(n)), Some(Frame::Bulk(holder))) if n > 0 || n == -1 => {
            Some((n, holder))
        }
        _ => None,
    }
}

/// What a request was, for reading its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `SET key token NX PX ttl` (one resource).
    Acquire,
    /// The all-or-nothing multi-key acquire script (answers 1 or 0).
    AcquireMany,
    /// The acquire of a waiting lock (one key or several): the script answers 0 when it set
    /// the keys, else the holder's remaining TTL in ms (or -1: no expiry), with one key as
    /// `[ttl, holder's fingerprint]`.
    AcquireWait,
    /// The compare-and-delete script.
    Release,
    /// The compare-and-extend script.
    Extend,
    /// The fencing draw: 1 + the largest counter, while the lock is held (0 when not).
    FenceDraw,
    /// The fencing write-back: raise the counters to at least a value, while the lock is
    /// held (1; 0 when not held).
    FenceWriteBack,
    /// An operator's look at a resource (`scripts::INSPECT`, read-only): its holder, TTL,
    /// line of waiters and fencing counter on the master. Yes when it answered.
    Inspect,
    /// An operator's forced release (`scripts::FORCE_RELEASE`): the key deleted whatever
    /// its value. Yes when a key was deleted, "not held" when there was none.
    ForceRelease,
}

impl Request {
    /// Whether a yes to this request grants something (a lock, more time, a fencing
    /// token): such votes are subject to the amnesia guard and the durability check.
    pub fn grants(self) -> bool {
        !matches!(
            self,
            Request::Release | Request::Inspect | Request::ForceRelease
        )
    }

    /// An operator's request ([`Request::Inspect`], [`Request::ForceRelease`]): its round
    /// waits for every master's answer (or its timeout), not for a quorum, and each answer
    /// is kept (see `core::admin`).
    #[inline]
    pub fn is_admin(self) -> bool {
        matches!(self, Request::Inspect | Request::ForceRelease)
    }
}

/// What a reply to `request` means. `Err(())` for a frame that can not be an answer to it
/// (the shell then closes that connection). A `-NOSCRIPT` error is returned as
/// `Outcome::Failed(Fault::Redis(..))`; the shell checks for it and retries with `EVAL`.
#[allow(clippy::result_unit_err)]
pub fn classify(request: Request, frame: &Frame<'_>) -> Result<Outcome, ()> {
    match (request, frame) {
        (_, Frame::Error(msg)) | (_, Frame::BulkError(msg)) => {
            Ok(Outcome::Failed(Fault::Redis(ErrorText::new(msg))))
        }
        (Request::Acquire, Frame::Simple(b"OK")) => Ok(Outcome::Ok),
        (Request::Acquire, f) if f.is_null() => Ok(Outcome::Taken),
        (Request::AcquireMany, Frame::Integer(1)) => Ok(Outcome::Ok),
        (Request::AcquireMany, Frame::Integer(0)) => Ok(Outcome::Taken),
        (Request::AcquireWait, Frame::Integer(0)) => Ok(Outcome::Ok),
        (Request::AcquireWait, Frame::Integer(n)) if *n > 0 || *n == -1 => Ok(Outcome::Taken),
        (Request::AcquireWait, Frame::Aggregate(a)) => match holder_left(a) {
            Some(_) => Ok(Outcome::Taken),
            None => Err(()),
        },
        // 2: the master had lost a key and the script put it back: not a vote this round
        // (see `scripts::EXTEND`).
        (Request::Extend, Frame::Integer(2)) => Ok(Outcome::NotHeld),
        (Request::Release | Request::Extend, Frame::Integer(n)) if *n > 0 => Ok(Outcome::Ok),
        (Request::Release | Request::Extend, Frame::Integer(0)) => Ok(Outcome::NotHeld),
        (Request::FenceDraw, Frame::Integer(n)) if *n > 0 => Ok(Outcome::Ok),
        (Request::FenceWriteBack, Frame::Integer(1)) => Ok(Outcome::Ok),
        (Request::FenceDraw | Request::FenceWriteBack, Frame::Integer(0)) => Ok(Outcome::NotHeld),
        (Request::Inspect, Frame::Aggregate(a)) => match crate::inspect::KeyView::parse(a) {
            Some(_) => Ok(Outcome::Ok),
            None => Err(()),
        },
        (Request::ForceRelease, Frame::Aggregate(a)) => match crate::inspect::Removal::parse(a) {
            Some(r) if r.deleted() => Ok(Outcome::Ok),
            Some(_) => Ok(Outcome::NotHeld),
            None => Err(()),
        },
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_strict_majority() {
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)] {
            assert_eq!(quorum(n), q, "n={n}");
            assert!(2 * quorum(n) > n, "two quorums of {n} must intersect");
        }
    }

    #[test]
    fn drift_is_the_product_rounded_up_to_the_nanosecond() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let ttl = Duration::from_nanos(rng.u64(..(1u64 << 31) * 1_000_000));
            let f = rng.f64() / 10.0; // 0 .. 0.1
            let d = drift(ttl, f) - DRIFT_FIXED;
            let reference = ttl.mul_f64(f);
            let ns = Duration::from_nanos(1);
            assert!(d + ns >= reference, "{ttl:?} * {f}: {d:?} < {reference:?}");
            assert!(d <= reference + ns, "{ttl:?} * {f}: {d:?} > {reference:?}");
        }
        assert_eq!(
            drift(Duration::from_secs(10), 0.01),
            Duration::from_millis(102)
        );
        assert_eq!(drift(Duration::from_secs(1), 0.0), DRIFT_FIXED);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_millis(1000);
        // drift = 10 ms + 2 ms
        assert_eq!(
            validity(ttl, Duration::from_millis(8), 0.01),
            Some(Duration::from_millis(980))
        );
        assert_eq!(validity(ttl, Duration::from_millis(988), 0.01), None);
        assert_eq!(
            validity(ttl, Duration::from_millis(987), 0.01),
            Some(Duration::from_millis(1))
        );
        assert_eq!(validity(ttl, Duration::from_secs(5), 0.01), None);
        assert_eq!(validity(Duration::ZERO, Duration::ZERO, 0.0), None);
    }

    #[test]
    fn tally_decides_at_quorum_and_at_impossibility() {
        let mut t = Tally::new(5, 3);
        assert_eq!(t.decision(), Decision::Open);
        t.record(0, Outcome::Ok);
        t.record(1, Outcome::Taken);
        t.record(2, Outcome::Ok);
        assert_eq!(t.decision(), Decision::Open);
        t.record(3, Outcome::Ok);
        assert_eq!(t.decision(), Decision::Reached);

        let mut t = Tally::new(5, 3);
        t.record(0, Outcome::Taken);
        t.record(1, Outcome::TimedOut);
        assert_eq!(t.decision(), Decision::Open);
        t.record(4, Outcome::Failed(Fault::Down));
        assert_eq!(t.decision(), Decision::Impossible, "3 no's of 5");
    }

    #[test]
    fn tally_counts_each_master_once() {
        let mut t = Tally::new(3, 2);
        assert!(t.record(0, Outcome::Ok));
        assert!(!t.record(0, Outcome::Ok), "a second answer must not count");
        assert!(!t.record(7, Outcome::Ok), "no such master");
        assert_eq!(t.yes(), 1);
        assert_eq!(t.decision(), Decision::Open);
        t.expire();
        assert_eq!(
            t.outcomes(),
            &[Outcome::Ok, Outcome::TimedOut, Outcome::TimedOut]
        );
        assert_eq!(t.decision(), Decision::Impossible);
    }

    #[test]
    fn judge_prefers_taken_over_no_quorum() {
        let ttl = Duration::from_secs(10);
        let mut t = Tally::new(3, 2);
        t.record(0, Outcome::Ok);
        t.record(1, Outcome::Taken);
        t.record(2, Outcome::TimedOut);
        assert_eq!(
            judge_acquire(&t, ttl, Duration::ZERO, 0.01, Duration::ZERO),
            AcquireVerdict::Taken
        );
        let mut t = Tally::new(3, 2);
        t.record(1, Outcome::Failed(Fault::Down));
        t.expire();
        assert_eq!(
            judge_acquire(&t, ttl, Duration::ZERO, 0.01, Duration::ZERO),
            AcquireVerdict::NoQuorum
        );
    }

    #[test]
    fn judge_refuses_when_validity_is_used_up() {
        let ttl = Duration::from_millis(100);
        let mut t = Tally::new(1, 1);
        t.record(0, Outcome::Ok);
        // drift = 1 ms + 2 ms; 100 - 96 - 3 = 1 ms left
        assert_eq!(
            judge_acquire(&t, ttl, Duration::from_millis(96), 0.01, Duration::ZERO),
            AcquireVerdict::Acquired(Duration::from_millis(1))
        );
        assert_eq!(
            judge_acquire(&t, ttl, Duration::from_millis(97), 0.01, Duration::ZERO),
            AcquireVerdict::ValidityUsedUp
        );
        assert_eq!(
            judge_acquire(
                &t,
                ttl,
                Duration::from_millis(50),
                0.01,
                Duration::from_millis(47)
            ),
            AcquireVerdict::ValidityUsedUp,
            "a configured minimum validity must be exceeded"
        );
    }

    #[test]
    fn classify_lock_replies() {
        use Request::*;
        assert_eq!(classify(Acquire, &Frame::Simple(b"OK")), Ok(Outcome::Ok));
        assert_eq!(classify(Acquire, &Frame::NullBulk), Ok(Outcome::Taken));
        assert_eq!(classify(Acquire, &Frame::Null), Ok(Outcome::Taken));
        assert_eq!(classify(Release, &Frame::Integer(1)), Ok(Outcome::Ok));
        assert_eq!(classify(Release, &Frame::Integer(0)), Ok(Outcome::NotHeld));
        assert_eq!(classify(Extend, &Frame::Integer(0)), Ok(Outcome::NotHeld));
        assert_eq!(classify(Extend, &Frame::Integer(1)), Ok(Outcome::Ok));
        assert_eq!(classify(Extend, &Frame::Integer(2)), Ok(Outcome::NotHeld));
        assert_eq!(classify(Release, &Frame::Simple(b"OK")), Err(()));
        assert_eq!(classify(Acquire, &Frame::Simple(b"QUEUED")), Err(()));
        assert_eq!(
            classify(Acquire, &Frame::Integer(1)),
            Err(()),
            "SET never answers an integer"
        );
        assert_eq!(classify(AcquireMany, &Frame::Integer(1)), Ok(Outcome::Ok));
        assert_eq!(
            classify(AcquireMany, &Frame::Integer(0)),
            Ok(Outcome::Taken)
        );
        assert_eq!(classify(AcquireMany, &Frame::Simple(b"OK")), Err(()));
        assert_eq!(classify(AcquireWait, &Frame::Integer(0)), Ok(Outcome::Ok));
        assert_eq!(
            classify(AcquireWait, &Frame::Integer(2500)),
            Ok(Outcome::Taken)
        );
        assert_eq!(
            classify(AcquireWait, &Frame::Integer(-1)),
            Ok(Outcome::Taken)
        );
        assert_eq!(classify(AcquireWait, &Frame::Integer(-2)), Err(()));
        assert_eq!(classify(AcquireWait, &Frame::NullBulk), Err(()));
        let limits = crate::resp::Limits::default();
        let parse = |b: &'static [u8]| match crate::resp::parse(b, &limits) {
            Ok(crate::resp::Status::Complete((f, _))) => f,
            other => panic!("{other:?}"),
        };
        let held = parse(b"*2\r\n:2500\r\n$4\r\nabcd\r\n");
        assert_eq!(classify(AcquireWait, &held), Ok(Outcome::Taken));
        let Frame::Aggregate(a) = held else { panic!() };
        assert_eq!(holder_left(&a), Some((2500, &b"abcd"[..])));
        let bad = parse(b"*2\r\n:0\r\n$4\r\nabcd\r\n");
        assert_eq!(classify(AcquireWait, &bad), Err(()));
        let bad = parse(b"*1\r\n:5\r\n");
        assert_eq!(classify(AcquireWait, &bad), Err(()));
        assert!(matches!(
            classify(Release, &Frame::Error(b"NOSCRIPT No matching script")),
            Ok(Outcome::Failed(Fault::Redis(t))) if t.starts_with(b"NOSCRIPT")
        ));
    }

    #[test]
    fn retry_delay_stays_in_range_and_varies() {
        let mut rng = fastrand::Rng::with_seed(7);
        let base = Duration::from_millis(200);
        let jitter = Duration::from_millis(100);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let d = retry_delay(base, jitter, &mut rng);
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(300));
            seen.insert(d);
        }
        assert!(seen.len() > 100, "jitter must spread the delays");
        let d = retry_delay(
            Duration::from_millis(5),
            Duration::from_millis(50),
            &mut rng,
        );
        assert!(d <= Duration::from_millis(55));
    }

    #[test]
    fn error_text_keeps_whole_words_and_says_when_it_cut() {
        let long = [b'x'; 200];
        assert_eq!(ErrorText::new(&long).as_bytes().len(), 62);
        assert!(ErrorText::new(&long).is_cut());
        let short = ErrorText::new(b"ERR x");
        assert_eq!(short.to_string(), "ERR x");
        assert!(!short.is_cut());
        // Redis 7's refusal of a key outside the user's ACL: cut after "keys", not inside
        // a word, and marked.
        let noperm = ErrorText::new(
            b"NOPERM this user has no permissions to access one of the keys used as arguments",
        );
        assert_eq!(
            noperm.to_string(),
            "NOPERM this user has no permissions to access one of the keys…"
        );
        assert!(noperm.starts_with(b"NOPERM"));
        let exact = [b'y'; 62];
        assert!(!ErrorText::new(&exact).is_cut());
        // No space to cut at: whole UTF-8 characters only.
        let accents = "é".repeat(40);
        let t = ErrorText::new(accents.as_bytes());
        assert_eq!(t.to_string(), format!("{}…", "é".repeat(31)));
        // Same size as before: an Outcome is copied into every round's tally.
        assert_eq!(std::mem::size_of::<ErrorText>(), 63);
    }
}
