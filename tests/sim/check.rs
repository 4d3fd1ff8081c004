//! The properties the simulation checks, and what a violation of each looks like.
//!
//! (i) mutual exclusion: hold intervals of different clients on one resource never overlap
//!     ([`check_intervals`], after the run);
//! (ii) fencing tokens strictly increase in grant order per resource; a multi-resource
//!     lock's token exceeds every earlier token of any of its resources ([`check_tokens`],
//!     after the run);
//! (iii) no grant of a resource while another client's lock on it still reports valid after
//!     a failed extend (checked at every grant, in the simulation);
//! (iv) no key of a lock attempt outlives that attempt's release on a master where the
//!     release ran, and a failed attempt's key survives only on masters its report marks as
//!     timed out / failed (checked when a key is created, and after the run);
//! (v) no starvation under fairness: a fair call that keeps asking is granted within a
//!     bound the family derives (after the run, [`Violation::Starved`]);
//! (vi) with fairness, grants follow arrival: a fair call is not granted while a fair call
//!     of another client that arrived earlier (smaller score) already stood in line on a
//!     quorum of masters when the grant's acquire was sent (checked at every grant).

use std::fmt;

use super::{ms, Keys, Us};

/// An interval during which `client` believed it held `res`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub res: usize,
    pub client: usize,
    pub token: u64,
    /// The client's clock when it sent the acquire (or the extend that opened this interval).
    pub t1: Us,
    pub start: Us,
    pub end: Us,
    /// The round's votes, e.g. `[ok, ok, timed out]`.
    pub votes: String,
}

/// A fenced grant: `client` holds `keys` from `at` with fencing token `fence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub at: Us,
    pub client: usize,
    pub keys: Keys,
    /// The lock attempt's (random, unique) token; not the fencing token.
    pub token: u64,
    pub fence: u64,
    /// The acquire's t1.
    pub t1: Us,
    /// The fencing rounds' votes and values.
    pub votes: String,
}

/// One lock call of a waiting client (hot resources): its attempts until a grant or the
/// caller's cancel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub client: usize,
    pub keys: Keys,
    /// Notify mode with fairness (polite attempts).
    pub fair: bool,
    /// Its arrival on the client's clock: its place in the lines.
    pub score: Us,
    pub start: Us,
    /// When a decided attempt of it had been refused by more than `n - quorum` masters
    /// (it stood in line on a quorum), the first time.
    pub inline_at: Option<Us>,
    pub granted: Option<Us>,
    /// The caller cancelled it (it stopped asking).
    pub ended: Option<Us>,
    pub attempts: u32,
}

/// Which property a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Property {
    /// (i) at most one holder at any instant.
    MutualExclusion,
    /// (ii) fencing tokens strictly increase in grant order per resource.
    FencingOrder,
    /// (iii) no other grant while a lock reports valid after a failed extend.
    GrantAfterFailedExtend,
    /// (iv) no key of an attempt outlives its cleanup (except TTL-bounded, on masters
    /// reported as timed out / failed).
    OrphanKey,
    /// (v) a fair call that keeps asking is granted within the bound.
    NoStarvation,
    /// (vi) fair grants follow arrival order.
    ArrivalOrder,
}

/// Two holders of the same resource whose intervals overlap.
#[derive(Clone, Debug)]
pub struct Overlap {
    pub first: Held,
    pub second: Held,
}

#[derive(Clone, Debug)]
pub enum Violation {
    Overlap(Overlap),
    Fence {
        res: usize,
        earlier: Grant,
        later: Grant,
    },
    AfterFailedExtend {
        res: usize,
        holder: usize,
        holder_token: u64,
        /// When the holder's hold started (its acquire's t1, for the trace window).
        held_t1: Us,
        failed_at: Us,
        failed_ttl: Us,
        deadline: Us,
        grantee: usize,
        grantee_token: u64,
        granted_at: Us,
        votes: String,
    },
    Orphan {
        token: u64,
        client: usize,
        master: usize,
        /// When the attempt started.
        t1: Us,
        /// When the key appeared (or the run ended, for a key that survived).
        at: Us,
        what: String,
    },
    /// (v): `call` waited `waited` (until its grant, or the end of the run) > `bound`.
    Starved {
        call: Call,
        waited: Us,
        bound: Us,
    },
    /// (vi): `second` was granted at `granted_at` (its acquire sent at `t1`) while `first`,
    /// which arrived earlier, stood in line on a quorum since `first.inline_at`.
    OutOfOrder {
        first: Call,
        second: Call,
        granted_at: Us,
        t1: Us,
    },
}

impl Violation {
    pub fn property(&self) -> Property {
        match self {
            Violation::Overlap(_) => Property::MutualExclusion,
            Violation::Fence { .. } => Property::FencingOrder,
            Violation::AfterFailedExtend { .. } => Property::GrantAfterFailedExtend,
            Violation::Orphan { .. } => Property::OrphanKey,
            Violation::Starved { .. } => Property::NoStarvation,
            Violation::OutOfOrder { .. } => Property::ArrivalOrder,
        }
    }

    /// The time window (true time) and the clients worth tracing to see what happened.
    pub fn window(&self, ttl: Us) -> (Us, Us, Vec<usize>) {
        match self {
            Violation::Overlap(o) => (
                o.first.t1.min(o.second.t1).saturating_sub(ttl),
                o.second.start,
                vec![o.first.client, o.second.client],
            ),
            Violation::Fence { earlier, later, .. } => (
                earlier.t1.min(later.t1).saturating_sub(ttl),
                later.at,
                vec![earlier.client, later.client],
            ),
            Violation::AfterFailedExtend {
                holder,
                held_t1,
                grantee,
                granted_at,
                ..
            } => (
                held_t1.saturating_sub(ttl),
                *granted_at,
                vec![*holder, *grantee],
            ),
            Violation::Orphan { client, t1, at, .. } => {
                (t1.saturating_sub(ttl), *at, vec![*client])
            }
            Violation::Starved { call, waited, .. } => {
                (call.start, call.start + waited, vec![call.client])
            }
            Violation::OutOfOrder {
                first,
                second,
                granted_at,
                ..
            } => (
                first.start.saturating_sub(ttl),
                *granted_at,
                vec![first.client, second.client],
            ),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap(Overlap { first: a, second: b }) => write!(
                f,
                "(i) double grant of r{}: c{} (token {}) believed it held it {}..{} ms, c{} (token {}) \
                 from {} ms (until {} ms), votes {} / {}",
                a.res,
                a.client,
                a.token,
                ms(a.start),
                ms(a.end),
                b.client,
                b.token,
                ms(b.start),
                ms(b.end),
                a.votes,
                b.votes
            ),
            Violation::Fence {
                res,
                earlier: a,
                later: b,
            } => write!(
                f,
                "(ii) fencing token of r{res} went backwards: c{} granted {} with fencing token {} at {} ms \
                 (votes {}), then c{} granted {} with fencing token {} at {} ms (votes {})",
                a.client,
                a.keys,
                a.fence,
                ms(a.at),
                a.votes,
                b.client,
                b.keys,
                b.fence,
                ms(b.at),
                b.votes
            ),
            Violation::AfterFailedExtend {
                res,
                holder,
                holder_token,
                failed_at,
                failed_ttl,
                deadline,
                grantee,
                grantee_token,
                granted_at,
                votes,
                ..
            } => write!(
                f,
                "(iii) c{grantee} (token {grantee_token}) granted r{res} at {} ms (votes {votes}) while \
                 c{holder}'s lock (token {holder_token}) still reports valid until {} ms, after its \
                 extend with px {} ms failed at {} ms",
                ms(*granted_at),
                ms(*deadline),
                failed_ttl / 1000,
                ms(*failed_at)
            ),
            Violation::Orphan {
                token,
                client,
                master,
                at,
                what,
                ..
            } => write!(
                f,
                "(iv) orphan key: c{client}'s token {token} on m{master} at {} ms: {what}",
                ms(*at)
            ),
            Violation::Starved {
                call,
                waited,
                bound,
            } => write!(
                f,
                "(v) starvation: c{}'s call for {} (score {} ms) {} after {} ms and {} attempts, \
                 above the bound {} ms",
                call.client,
                call.keys,
                ms(call.score),
                if call.granted.is_some() {
                    "granted only"
                } else {
                    "still not granted"
                },
                ms(*waited),
                call.attempts,
                ms(*bound)
            ),
            Violation::OutOfOrder {
                first,
                second,
                granted_at,
                t1,
            } => write!(
                f,
                "(vi) out of arrival order: c{} (score {} ms) granted {} at {} ms (acquire sent \
                 at {} ms) while c{} (score {} ms, earlier) stood in line on a quorum since {} ms",
                second.client,
                ms(second.score),
                second.keys,
                ms(*granted_at),
                ms(*t1),
                first.client,
                ms(first.score),
                ms(first.inline_at.unwrap_or(0))
            ),
        }
    }
}

/// The first pair of overlapping intervals (same resource, different holders), by start.
pub fn check_intervals(held: &[Held]) -> Option<Overlap> {
    let mut sorted: Vec<&Held> = held.iter().collect();
    sorted.sort_by_key(|h| (h.res, h.start, h.end));
    let mut reach: Option<&Held> = None;
    for h in sorted {
        if let Some(p) = reach {
            if p.res == h.res && h.start < p.end {
                return Some(Overlap {
                    first: p.clone(),
                    second: h.clone(),
                });
            }
            if p.res == h.res && p.end >= h.end {
                continue;
            }
        }
        reach = Some(h);
    }
    None
}

/// (ii) over fenced grants in grant order: each grant's token must exceed every earlier
/// grant's token on each of its resources. Returns the first violation.
pub fn check_tokens(grants: &[Grant], resources: usize) -> Option<Violation> {
    let mut best: Vec<Option<&Grant>> = vec![None; resources];
    let mut order: Vec<&Grant> = grants.iter().collect();
    // Stable: grants at the same instant keep the order they were recorded in.
    order.sort_by_key(|g| g.at);
    for g in order {
        for r in g.keys.iter() {
            if let Some(prev) = best[r] {
                if prev.fence >= g.fence {
                    return Some(Violation::Fence {
                        res: r,
                        earlier: prev.clone(),
                        later: g.clone(),
                    });
                }
            }
        }
        for r in g.keys.iter() {
            best[r] = Some(g);
        }
    }
    None
}
