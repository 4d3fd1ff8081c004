//! What the masters hold for a resource, for operators: [`Inspection`] (from
//! [`Redlock::inspect`](crate::Redlock::inspect) and
//! [`SharedRedlock::inspect`](crate::SharedRedlock::inspect)) and [`ForcedRelease`] (from
//! `force_release`).
//!
//! Both come from one round of the core over every master (`scripts::INSPECT`, read-only;
//! `scripts::FORCE_RELEASE`), which waits for every master's answer up to its timeout, not
//! for a quorum: an operator wants to see each master. A holder is shown by its
//! fingerprint, the first 16 hex digits of its token (what its release announces), never
//! by the whole token: the whole token is the capability to release the lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::resp::{Aggregate, Frame};
use crate::rules::{Fault, Outcome};
use crate::scripts::{CLIENT_ID_LEN, NOTICE_LEN, WAITER_ID_LEN};

/// How many waiters of a line an inspection names (the line's length is always counted).
pub(crate) const NAMED_WAITERS: usize = 4;

/// A holder's fingerprint as the master gave it: up to [`NOTICE_LEN`] bytes of the value.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Fp {
    len: u8,
    bytes: [u8; NOTICE_LEN],
}

impl Fp {
    fn new(b: &[u8]) -> Option<Fp> {
        let n = b.len();
        if n > NOTICE_LEN {
            return None;
        }
        let mut bytes = [0u8; NOTICE_LEN];
        bytes[..n].copy_from_slice(b);
        Some(Fp {
            len: n as u8,
            bytes,
        })
    }
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
    /// As text: the 16 hex digits of one of our tokens; any other value with its bytes
    /// escaped (a value set by another tool may be anything).
    fn text(&self) -> String {
        self.as_bytes().escape_ascii().to_string()
    }
}

/// What kind of key a master has under the resource's name.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    #[default]
    None,
    String,
    /// A hash, a list...: not a lock.
    Other,
}

/// One master's answer to `scripts::INSPECT`, owned.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyView {
    kind: KeyKind,
    holder: Fp,
    lock: bool,
    marked: bool,
    pttl: i64,
    waiters: u64,
    /// The first waiters in line: their client's part of the id, and whether they live.
    named: SmallVec<[([u8; CLIENT_ID_LEN], bool); NAMED_WAITERS]>,
    counter: Option<u64>,
    /// The counter's value when it is not a number (set by another tool).
    counter_bad: bool,
}

/// The elements of a flat array of a script's answer.
fn elements<'a>(a: &Aggregate<'a>, n: usize) -> Option<SmallVec<[Frame<'a>; 9]>> {
    if a.len() != n || a.kind() != crate::resp::AggregateKind::Array {
        return None;
    }
    Some(a.iter().collect())
}

impl KeyView {
    /// `{kind, holder, lock, marked, pttl, waiters, ids, alive, counter}` (see
    /// `scripts::INSPECT`); `None` when the answer has another shape.
    pub(crate) fn parse(a: &Aggregate<'_>) -> Option<KeyView> {
        let e = elements(a, 9)?;
        let flag = |f: &Frame<'_>| match f {
            Frame::Integer(0) => Some(false),
            Frame::Integer(1) => Some(true),
            _ => None,
        };
        let kind = match &e[0] {
            Frame::Bulk(b"none") => KeyKind::None,
            Frame::Bulk(b"string") => KeyKind::String,
            Frame::Bulk(b"other") => KeyKind::Other,
            _ => return None,
        };
        let holder = match &e[1] {
            Frame::Bulk(b) => Fp::new(b)?,
            _ => return None,
        };
        let (lock, marked) = (flag(&e[2])?, flag(&e[3])?);
        let pttl = match e[4] {
            Frame::Integer(n) if n >= -2 => n,
            _ => return None,
        };
        let waiters = match e[5] {
            Frame::Integer(n) if n >= 0 => n as u64,
            _ => return None,
        };
        let (Frame::Aggregate(ids), Frame::Aggregate(alive)) = (&e[6], &e[7]) else {
            return None;
        };
        if ids.len() != alive.len() || ids.len() > NAMED_WAITERS {
            return None;
        }
        let mut named = SmallVec::new();
        for (id, live) in ids.iter().zip(alive.iter()) {
            let (Frame::Bulk(id), Some(live)) = (id, flag(&live)) else {
                return None;
            };
            let mut client = [0u8; CLIENT_ID_LEN];
            let n = id.len().min(CLIENT_ID_LEN);
            client[..n].copy_from_slice(&id[..n]);
            named.push((client, live));
        }
        let (counter, counter_bad) = match &e[8] {
            Frame::Bulk(b"") => (None, false),
            Frame::Bulk(b) => match std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()) {
                Some(c) => (Some(c), false),
                None => (None, true),
            },
            _ => return None,
        };
        Some(KeyView {
            kind,
            holder,
            lock,
            marked,
            pttl,
            waiters,
            named,
            counter,
            counter_bad,
        })
    }
}

/// One master's answer to `scripts::FORCE_RELEASE`, owned.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Removal {
    /// The deleted value's fingerprint (`None`: there was no key).
    holder: Option<Fp>,
    pttl: i64,
    /// The client part of the waiter the release named next.
    turn: Option<[u8; CLIENT_ID_LEN]>,
}

impl Removal {
    /// `{holder, pttl, turn}` (see `scripts::FORCE_RELEASE`).
    pub(crate) fn parse(a: &Aggregate<'_>) -> Option<Removal> {
        let e = elements(a, 3)?;
        let (Frame::Bulk(holder), Frame::Integer(pttl), Frame::Bulk(turn)) = (&e[0], &e[1], &e[2])
        else {
            return None;
        };
        let turn = match turn.len() {
            0 => None,
            WAITER_ID_LEN => {
                let mut client = [0u8; CLIENT_ID_LEN];
                client.copy_from_slice(&turn[..CLIENT_ID_LEN]);
                Some(client)
            }
            _ => return None,
        };
        let holder = match *pttl {
            -2 if holder.is_empty() && turn.is_none() => None,
            n if n >= -1 => Some(Fp::new(holder)?),
            _ => return None,
        };
        Some(Removal {
            holder,
            pttl: *pttl,
            turn,
        })
    }

    /// A key was deleted.
    pub(crate) fn deleted(&self) -> bool {
        self.holder.is_some()
    }
}

/// A master's answer to an operator's request, kept by its round (`core::admin`).
#[derive(Clone)]
pub(crate) enum View {
    Key(Box<KeyView>),
    Removed(Removal),
}

impl View {
    /// The answer in `frame` to `req` (`None` for another request or another shape).
    pub(crate) fn of(req: crate::rules::Request, frame: &Frame<'_>) -> Option<View> {
        let Frame::Aggregate(a) = frame else {
            return None;
        };
        match req {
            crate::rules::Request::Inspect => KeyView::parse(a).map(|k| View::Key(Box::new(k))),
            crate::rules::Request::ForceRelease => Removal::parse(a).map(View::Removed),
            _ => None,
        }
    }
}

fn ttl_of(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn client_text(c: &[u8; CLIENT_ID_LEN]) -> String {
    c.escape_ascii().to_string()
}

/// A waiter in a resource's line on a master ([`MasterView::first_waiters`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    client: String,
    alive: bool,
}

impl Waiter {
    /// The client the waiter belongs to: the first 8 hex digits of its id in the line (one
    /// client's waiters share them).
    pub fn client(&self) -> &str {
        &self.client
    }
    /// Whether it is still asking: its liveness key, set at each of its refused attempts,
    /// has not expired. A waiter that stopped asking (its process died) drops out of the
    /// line at the next release.
    pub fn is_alive(&self) -> bool {
        self.alive
    }
}

/// What one master holds for a resource ([`Inspection::masters`]).
#[derive(Debug, Clone)]
pub struct MasterView {
    name: Arc<str>,
    outcome: Outcome,
    key: Option<KeyKind>,
    holder: Option<String>,
    lock: bool,
    marked: bool,
    pttl: i64,
    waiters: u64,
    first: Vec<Waiter>,
    counter: Option<u64>,
    counter_bad: bool,
}

impl MasterView {
    fn new(name: Arc<str>, outcome: Outcome, view: Option<&View>) -> MasterView {
        let mut m = MasterView {
            name,
            outcome,
            key: None,
            holder: None,
            lock: false,
            marked: false,
            pttl: -2,
            waiters: 0,
            first: Vec::new(),
            counter: None,
            counter_bad: false,
        };
        if let (Outcome::Ok, Some(View::Key(k))) = (outcome, view) {
            m.key = Some(k.kind);
            m.holder = (k.kind == KeyKind::String).then(|| k.holder.text());
            m.lock = k.lock;
            m.marked = k.marked;
            m.pttl = k.pttl;
            m.waiters = k.waiters;
            m.first = k
                .named
                .iter()
                .map(|(c, alive)| Waiter {
                    client: client_text(c),
                    alive: *alive,
                })
                .collect();
            m.counter = k.counter;
            m.counter_bad = k.counter_bad;
        }
        m
    }

    /// The master, as `host:port[/db]`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the master did: [`Outcome::Ok`] when it answered; otherwise why there is no
    /// answer (down, refused, timed out...), and every other accessor says nothing.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }
    /// Whether the master answered.
    pub fn answered(&self) -> bool {
        self.outcome.is_ok()
    }
    /// Whether a key exists under the resource's name (a lock, or a key of another kind).
    pub fn exists(&self) -> bool {
        matches!(self.key, Some(KeyKind::String | KeyKind::Other))
    }
    /// Who holds the key: the fingerprint of its value, the first 16 hex digits of the
    /// holder's token (what its release announces; never the whole token). `None` when
    /// there is no key, or it is not a string. A value that is not one of this crate's
    /// tokens is shown with its first 16 bytes escaped.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
    /// Whether the key's value is one of this crate's lock tokens (32 hex digits): a key
    /// set by another tool under the same name is not.
    pub fn is_lock(&self) -> bool {
        self.lock
    }
    /// Whether a waiter was refused while this holder held it (the value carries the mark
    /// that makes its release look for waiters).
    pub fn is_contended(&self) -> bool {
        self.marked
    }
    /// How long the key lives on: `None` when there is no key or it never expires (see
    /// [`MasterView::never_expires`]).
    pub fn ttl(&self) -> Option<Duration> {
        ttl_of(self.pttl)
    }
    /// The key exists and has no expiry: not a lock this crate takes (its keys always
    /// expire); it stays until someone deletes it.
    pub fn never_expires(&self) -> bool {
        self.exists() && self.pttl == -1
    }
    /// How many waiters stand in the resource's line on this master (live or not).
    pub fn waiters(&self) -> u64 {
        self.waiters
    }
    /// The first waiters in line (up to 4), first first.
    pub fn first_waiters(&self) -> &[Waiter] {
        &self.first
    }
    /// The resource's fencing counter on this master (see
    /// [`Builder::fencing`](crate::Builder::fencing)); `None` when it has none.
    pub fn fencing_counter(&self) -> Option<u64> {
        self.counter
    }
    /// The fencing counter exists but is not a number (written by another tool).
    pub fn fencing_counter_is_bad(&self) -> bool {
        self.counter_bad
    }
}

/// What every master holds for one resource: who holds it where, for how long, who waits in
/// its line, its fencing counter; and whether a quorum holds it. From
/// [`Redlock::inspect`](crate::Redlock::inspect) or
/// [`SharedRedlock::inspect`](crate::SharedRedlock::inspect).
///
/// Its `Display` is a one-line summary (`held by 5f0c…: 3 of 3 masters (quorum 2) …`).
#[derive(Debug, Clone)]
#[must_use]
pub struct Inspection {
    resource: Vec<u8>,
    quorum: usize,
    masters: Vec<MasterView>,
    elapsed: Duration,
}

impl Inspection {
    pub(crate) fn new(
        resource: &[u8],
        quorum: usize,
        masters: Vec<MasterView>,
        elapsed: Duration,
    ) -> Self {
        Inspection {
            resource: resource.to_vec(),
            quorum,
            masters,
            elapsed,
        }
    }

    pub(crate) fn master(name: Arc<str>, outcome: Outcome, view: Option<&View>) -> MasterView {
        MasterView::new(name, outcome, view)
    }

    /// The resource.
    pub fn resource(&self) -> &[u8] {
        &self.resource
    }
    /// Each master's view, in configuration order.
    pub fn masters(&self) -> &[MasterView] {
        &self.masters
    }
    /// Masters needed for a lock: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.quorum
    }
    /// How many masters answered.
    pub fn answered(&self) -> usize {
        self.masters.iter().filter(|m| m.answered()).count()
    }
    /// How long the round took (until the last master's answer, or the timeout).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
    /// The holder found on the most masters (the first one listed on a tie): its
    /// fingerprint (see [`MasterView::holder`]). `None` when no master has the key.
    pub fn holder(&self) -> Option<&str> {
        let mut best: Option<(&str, usize)> = None;
        for m in &self.masters {
            if let Some(h) = m.holder() {
                let n = self.held_by(h);
                if best.is_none_or(|(_, k)| n > k) {
                    best = Some((h, n));
                }
            }
        }
        best.map(|(h, _)| h)
    }
    /// On how many masters [`Inspection::holder`] holds the key.
    pub fn held_on(&self) -> usize {
        self.holder().map_or(0, |h| self.held_by(h))
    }
    fn held_by(&self, holder: &str) -> usize {
        self.masters
            .iter()
            .filter(|m| m.holder() == Some(holder))
            .count()
    }
    /// Whether a quorum of masters holds the key for one holder: the lock is held (until
    /// those keys expire or are released).
    pub fn is_held(&self) -> bool {
        self.held_on() >= self.quorum
    }
    /// Whether a quorum of masters answered that they have no key: the lock is free (a
    /// minority may still hold leftovers, which expire with their TTL).
    pub fn is_free(&self) -> bool {
        let free = self
            .masters
            .iter()
            .filter(|m| m.answered() && !m.exists())
            .count();
        free >= self.quorum
    }
    /// The longest line of waiters on any master.
    pub fn waiters(&self) -> u64 {
        self.masters.iter().map(|m| m.waiters).max().unwrap_or(0)
    }
    /// The largest fencing counter on any master (the last fencing token given, if the
    /// masters kept it).
    pub fn fencing_counter(&self) -> Option<u64> {
        self.masters.iter().filter_map(|m| m.counter).max()
    }
}

/// Whether a master that gave no usable answer refused (an error reply: no right to the
/// key, a key of another type; a configuration refusal) rather than gave none (down,
/// timed out).
fn refused(o: Outcome) -> bool {
    match o {
        Outcome::Failed(fault) => matches!(fault, Fault::Redis(_)) || fault.is_configuration(),
        _ => false,
    }
}

/// `3 refused`, `1 did not answer`, `1 refused, 1 did not answer`: why the masters that
/// could not tell could not (each master's own fault is in its view).
struct Unanswered {
    refused: usize,
    silent: usize,
}

impl Unanswered {
    fn of<'a>(
        outcomes: impl Iterator<Item = &'a Outcome>,
        tells: impl Fn(Outcome) -> bool,
    ) -> Self {
        let (mut refused_n, mut silent) = (0, 0);
        for &o in outcomes {
            if tells(o) {
                continue;
            }
            if refused(o) {
                refused_n += 1;
            } else {
                silent += 1;
            }
        }
        Unanswered {
            refused: refused_n,
            silent,
        }
    }
}

impl fmt::Display for Unanswered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.refused, self.silent) {
            (0, 0) => Ok(()),
            (0, s) => write!(f, "{s} did not answer"),
            (r, 0) => write!(f, "{r} refused"),
            (r, s) => write!(f, "{r} refused, {s} did not answer"),
        }
    }
}

fn masters_word(n: usize) -> &'static str {
    if n == 1 {
        "master"
    } else {
        "masters"
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, q) = (self.masters.len(), self.quorum);
        let answered = self.answered();
        let why = Unanswered::of(self.masters.iter().map(|m| &m.outcome), |o| o.is_ok());
        match self.holder() {
            Some(h) if self.is_held() => write!(
                f,
                "held by {h} on {} of {n} masters (quorum {q})",
                self.held_on()
            )?,
            Some(h) if self.is_free() => {
                write!(
                    f,
                    "free on a quorum (quorum {q} of {n}); {h} holds a leftover on {} {}",
                    self.held_on(),
                    masters_word(self.held_on())
                )?;
                let expiring = self
                    .masters
                    .iter()
                    .any(|m| m.holder() == Some(h) && m.ttl().is_some());
                if expiring {
                    f.write_str(" (it expires with its TTL)")?;
                }
            }
            Some(h) => {
                write!(
                    f,
                    "not held by a quorum: {h} holds {} of {n} masters (quorum {q}), {answered} \
                     answered",
                    self.held_on()
                )?;
                if answered < n {
                    write!(f, " ({why})")?;
                }
            }
            None if self.is_free() => write!(
                f,
                "free: no key on the {answered} of {n} masters that answered"
            )?,
            None => write!(
                f,
                "unknown: only {answered} of {n} masters answered (quorum {q}; {why}), none \
                 holds it"
            )?,
        }
        let forever = self.masters.iter().filter(|m| m.never_expires()).count();
        if forever > 0 {
            write!(
                f,
                "; the key has no expiry on {forever} {} (not a lock this crate takes: it \
                 stays until deleted)",
                masters_word(forever)
            )?;
        }
        let other = self
            .masters
            .iter()
            .filter(|m| m.key == Some(KeyKind::Other))
            .count();
        if other > 0 {
            write!(
                f,
                "; a key of another type (not a lock) on {other} {}",
                masters_word(other)
            )?;
        }
        match self.waiters() {
            0 => {}
            1 => f.write_str("; 1 waiter in line")?,
            w => write!(f, "; {w} waiters in line")?,
        }
        if let Some(c) = self.fencing_counter() {
            write!(f, "; fencing counter {c}")?;
        }
        Ok(())
    }
}

/// What a forced release did on one master ([`ForcedRelease::masters`]).
#[derive(Debug, Clone)]
pub struct MasterRemoval {
    name: Arc<str>,
    outcome: Outcome,
    removed: Option<String>,
    pttl: i64,
    woke: Option<String>,
}

impl MasterRemoval {
    /// The master, as `host:port[/db]`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the master did: [`Outcome::Ok`] when it deleted a key, [`Outcome::NotHeld`]
    /// when there was none; otherwise why it did not answer (down, timed out...) or
    /// refused (a key of another type under the name: nothing deleted).
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }
    /// The master answered, and has no key under the name now.
    pub fn is_free(&self) -> bool {
        matches!(self.outcome, Outcome::Ok | Outcome::NotHeld)
    }
    /// Whose key it deleted: the holder's fingerprint (see [`MasterView::holder`]).
    pub fn removed(&self) -> Option<&str> {
        self.removed.as_deref()
    }
    /// How long the deleted key still had to live (`None`: no key, or no expiry).
    pub fn ttl(&self) -> Option<Duration> {
        self.removed.as_ref().and_then(|_| ttl_of(self.pttl))
    }
    /// The waiter whose turn the release announced (the client part of its id, see
    /// [`Waiter::client`]); `None` when it was announced to every waiter of the resource
    /// (or nothing was deleted).
    pub fn woke(&self) -> Option<&str> {
        self.woke.as_deref()
    }
}

/// What `force_release` did: on every master, the resource's key deleted whatever its
/// value, and the waiters told. From
/// [`Redlock::force_release`](crate::Redlock::force_release) or
/// [`SharedRedlock::force_release`](crate::SharedRedlock::force_release).
///
/// Check [`ForcedRelease::is_free`]: the lock is free only when a quorum of masters
/// answered (a master that was down keeps its key until it expires).
#[derive(Debug, Clone)]
#[must_use = "a forced release may have reached too few masters: check is_free()"]
pub struct ForcedRelease {
    resource: Vec<u8>,
    quorum: usize,
    masters: Vec<MasterRemoval>,
}

impl ForcedRelease {
    pub(crate) fn new(resource: &[u8], quorum: usize) -> Self {
        ForcedRelease {
            resource: resource.to_vec(),
            quorum,
            masters: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, name: Arc<str>, outcome: Outcome, view: Option<&View>) {
        let (removed, pttl, woke) = match (outcome, view) {
            (Outcome::Ok, Some(View::Removed(r))) => (
                r.holder.map(|h| h.text()),
                r.pttl,
                r.turn.as_ref().map(client_text),
            ),
            _ => (None, -2, None),
        };
        self.masters.push(MasterRemoval {
            name,
            outcome,
            removed,
            pttl,
            woke,
        });
    }

    /// The resource.
    pub fn resource(&self) -> &[u8] {
        &self.resource
    }
    /// What each master did, in configuration order.
    pub fn masters(&self) -> &[MasterRemoval] {
        &self.masters
    }
    /// Masters needed for a lock: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.quorum
    }
    /// The holder whose keys were deleted on the most masters (its fingerprint); `None`
    /// when no master had a key.
    pub fn holder(&self) -> Option<&str> {
        let mut best: Option<(&str, usize)> = None;
        for m in &self.masters {
            if let Some(h) = m.removed() {
                let n = self.removed_by(h);
                if best.is_none_or(|(_, k)| n > k) {
                    best = Some((h, n));
                }
            }
        }
        best.map(|(h, _)| h)
    }
    fn removed_by(&self, holder: &str) -> usize {
        self.masters
            .iter()
            .filter(|m| m.removed() == Some(holder))
            .count()
    }
    /// On how many masters a key was deleted (whoever held it).
    pub fn removed_on(&self) -> usize {
        self.masters.iter().filter(|m| m.removed.is_some()).count()
    }
    /// A quorum of masters has no key now: the lock is free (the next lock call can take
    /// it). The masters that did not answer keep theirs until it expires.
    pub fn is_free(&self) -> bool {
        self.masters.iter().filter(|m| m.is_free()).count() >= self.quorum
    }
}

impl fmt::Display for ForcedRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.masters.len();
        let free = self.masters.iter().filter(|m| m.is_free()).count();
        // A master that is not free now either refused (an error reply: no right to the
        // key, a key of another type) or gave no answer (down, timed out): say which, so
        // that "no key" is never read off masters that could not tell.
        let why = Unanswered::of(self.masters.iter().map(|m| &m.outcome), |o| {
            matches!(o, Outcome::Ok | Outcome::NotHeld)
        });
        match self.holder() {
            Some(h) => write!(
                f,
                "deleted the key of {h} on {} of {n} masters",
                self.removed_by(h)
            )?,
            None if free == n => f.write_str("no master had the key")?,
            None if free == 0 => f.write_str("nothing deleted")?,
            None => write!(f, "no key on the {free} of {n} masters that could tell")?,
        }
        let others = self.removed_on() - self.holder().map_or(0, |h| self.removed_by(h));
        if others > 0 {
            write!(
                f,
                " (and other holders' keys on {others} {})",
                masters_word(others)
            )?;
        }
        if self.is_free() {
            write!(
                f,
                "; free on {free} of {n} masters (quorum {}): free",
                self.quorum
            )?;
        } else {
            write!(
                f,
                "; no key now on only {free} of {n} masters (quorum {}; ",
                self.quorum
            )?;
            write!(
                f,
                "{why}): it may still be held until the other masters' keys expire"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{parse, Limits, Status};

    fn agg(bytes: &'static [u8]) -> Frame<'static> {
        match parse(bytes, &Limits::default()) {
            Ok(Status::Complete((f, n))) if n == bytes.len() => f,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn inspect_answers_parse_or_are_refused() {
        let held = agg(
            b"*9\r\n$6\r\nstring\r\n$16\r\n0123456789abcdef\r\n:1\r\n:1\r\n:2500\r\n:2\r\n\
              *2\r\n$16\r\ncli1aaaacall0001\r\n$16\r\ncli2bbbbcall0002\r\n*2\r\n:0\r\n:1\r\n\
              $2\r\n42\r\n",
        );
        let Frame::Aggregate(a) = &held else { panic!() };
        let k = KeyView::parse(a).expect("a held key");
        assert_eq!(k.kind, KeyKind::String);
        assert_eq!(k.holder.as_bytes(), b"0123456789abcdef");
        assert!(k.lock && k.marked);
        assert_eq!((k.pttl, k.waiters, k.counter), (2500, 2, Some(42)));
        assert_eq!(k.named[0], (*b"cli1aaaa", false));
        assert_eq!(k.named[1], (*b"cli2bbbb", true));
        let m = MasterView::new("m".into(), Outcome::Ok, Some(&View::Key(Box::new(k))));
        assert_eq!(m.holder(), Some("0123456789abcdef"));
        assert_eq!(m.first_waiters()[1].client(), "cli2bbbb");
        assert!(m.first_waiters()[1].is_alive());
        assert_eq!(m.ttl(), Some(Duration::from_millis(2500)));

        let free =
            agg(b"*9\r\n$4\r\nnone\r\n$0\r\n\r\n:0\r\n:0\r\n:-2\r\n:0\r\n*0\r\n*0\r\n$0\r\n\r\n");
        let Frame::Aggregate(a) = &free else { panic!() };
        let k = KeyView::parse(a).expect("no key");
        let m = MasterView::new("m".into(), Outcome::Ok, Some(&View::Key(Box::new(k))));
        assert!(!m.exists() && m.holder().is_none() && m.ttl().is_none());
        assert!(!m.never_expires());

        for bad in [
            &b"*8\r\n$4\r\nnone\r\n$0\r\n\r\n:0\r\n:0\r\n:-2\r\n:0\r\n*0\r\n*0\r\n"[..],
            b"*9\r\n$4\r\nnope\r\n$0\r\n\r\n:0\r\n:0\r\n:-2\r\n:0\r\n*0\r\n*0\r\n$0\r\n\r\n",
            b"*9\r\n$4\r\nnone\r\n$0\r\n\r\n:2\r\n:0\r\n:-2\r\n:0\r\n*0\r\n*0\r\n$0\r\n\r\n",
            b"*9\r\n$4\r\nnone\r\n$0\r\n\r\n:0\r\n:0\r\n:-3\r\n:0\r\n*0\r\n*0\r\n$0\r\n\r\n",
            b"*9\r\n$4\r\nnone\r\n$0\r\n\r\n:0\r\n:0\r\n:-2\r\n:1\r\n*1\r\n$1\r\nx\r\n*0\r\n$0\r\n\r\n",
            b"*9\r\n$4\r\nnone\r\n$17\r\n0123456789abcdefg\r\n:0\r\n:0\r\n:-2\r\n:0\r\n*0\r\n*0\r\n$0\r\n\r\n",
        ] {
            let f = match parse(bad, &Limits::default()) {
                Ok(Status::Complete((f, _))) => f,
                other => panic!("{other:?}"),
            };
            let Frame::Aggregate(a) = &f else { panic!() };
            assert!(KeyView::parse(a).is_none(), "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn force_release_answers_parse_or_are_refused() {
        let gone = agg(b"*3\r\n$16\r\n0123456789abcdef\r\n:900\r\n$16\r\ncli1aaaacall0001\r\n");
        let Frame::Aggregate(a) = &gone else { panic!() };
        let r = Removal::parse(a).expect("deleted");
        assert!(r.deleted());
        assert_eq!(r.turn, Some(*b"cli1aaaa"));
        let none = agg(b"*3\r\n$0\r\n\r\n:-2\r\n$0\r\n\r\n");
        let Frame::Aggregate(a) = &none else { panic!() };
        assert!(!Removal::parse(a).expect("nothing").deleted());
        let bad = agg(b"*3\r\n$0\r\n\r\n:-2\r\n$3\r\nabc\r\n");
        let Frame::Aggregate(a) = &bad else { panic!() };
        assert!(Removal::parse(a).is_none());
    }

    /// A forced release that no master could carry out never reads "no master had the
    /// key": it says nothing was deleted, and which masters refused and which gave no
    /// answer (it said "no master had the key; only 0 of 3 masters answered" of three
    /// masters that refused the script with NOPERM).
    #[test]
    fn a_forced_release_says_which_masters_refused_and_which_did_not_answer() {
        use crate::rules::ErrorText;
        let noperm = Outcome::Failed(Fault::Redis(ErrorText::new(
            b"NOPERM this user has no permissions to access one of the keys used as arguments",
        )));
        let mut all_refused = ForcedRelease::new(b"job", 2);
        for m in ["m0", "m1", "m2"] {
            all_refused.push(m.into(), noperm, None);
        }
        assert!(!all_refused.is_free());
        assert_eq!(
            all_refused.to_string(),
            "nothing deleted; no key now on only 0 of 3 masters (quorum 2; 3 refused): it may \
             still be held until the other masters' keys expire"
        );
        let mut mixed = ForcedRelease::new(b"job", 2);
        mixed.push("m0".into(), Outcome::NotHeld, None);
        mixed.push("m1".into(), noperm, None);
        mixed.push("m2".into(), Outcome::TimedOut, None);
        assert_eq!(
            mixed.to_string(),
            "no key on the 1 of 3 masters that could tell; no key now on only 1 of 3 masters \
             (quorum 2; 1 refused, 1 did not answer): it may still be held until the other \
             masters' keys expire"
        );
        let mut none = ForcedRelease::new(b"job", 2);
        for m in ["m0", "m1", "m2"] {
            none.push(m.into(), Outcome::NotHeld, None);
        }
        assert!(none.is_free());
        assert!(
            none.to_string().starts_with("no master had the key; free"),
            "{none}"
        );
    }

    #[test]
    fn the_holder_is_the_one_on_most_masters_and_a_quorum_decides() {
        let view = |holder: &[u8], pttl: i64| {
            let mut k = KeyView {
                kind: if holder.is_empty() {
                    KeyKind::None
                } else {
                    KeyKind::String
                },
                pttl,
                lock: true,
                ..KeyView::default()
            };
            k.holder = Fp::new(holder).unwrap();
            View::Key(Box::new(k))
        };
        let (a, b) = (view(b"aaaa", 100), view(b"bbbb", 100));
        let none = view(b"", -2);
        let i = Inspection::new(
            b"r",
            2,
            vec![
                MasterView::new("m0".into(), Outcome::Ok, Some(&b)),
                MasterView::new("m1".into(), Outcome::Ok, Some(&a)),
                MasterView::new("m2".into(), Outcome::Ok, Some(&a)),
            ],
            Duration::ZERO,
        );
        assert_eq!(
            (i.holder(), i.held_on(), i.is_held()),
            (Some("aaaa"), 2, true)
        );
        assert!(!i.is_free());
        assert!(
            i.to_string().starts_with("held by aaaa on 2 of 3 masters"),
            "{i}"
        );
        let down = Outcome::Failed(crate::rules::Fault::Down);
        let i = Inspection::new(
            b"r",
            2,
            vec![
                MasterView::new("m0".into(), Outcome::Ok, Some(&a)),
                MasterView::new("m1".into(), Outcome::Ok, Some(&none)),
                MasterView::new("m2".into(), down, None),
            ],
            Duration::ZERO,
        );
        assert!(!i.is_held() && !i.is_free());
        assert_eq!(i.answered(), 2);
        assert!(i.to_string().starts_with("not held by a quorum"), "{i}");
        assert!(
            i.to_string().contains("2 answered (1 did not answer)"),
            "{i}"
        );
        // Masters that refused are told from masters that gave no answer (it said "only 0
        // of 3 masters answered" of masters that refused with NOPERM).
        let noperm = Outcome::Failed(crate::rules::Fault::Redis(crate::rules::ErrorText::new(
            b"NOPERM this user has no permissions to access one of the keys used as arguments",
        )));
        let i = Inspection::new(
            b"r",
            2,
            vec![
                MasterView::new("m0".into(), noperm, None),
                MasterView::new("m1".into(), noperm, None),
                MasterView::new("m2".into(), down, None),
            ],
            Duration::ZERO,
        );
        assert_eq!(
            i.to_string(),
            "unknown: only 0 of 3 masters answered (quorum 2; 2 refused, 1 did not answer), \
             none holds it"
        );
    }
}
