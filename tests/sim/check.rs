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
//!     timed out / failed (checked when a key is created, and after the run).

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
}

impl Violation {
    pub fn property(&self) -> Property {
        match self {
            Violation::Overlap(_) => Property::MutualExclusion,
            Violation::Fence { .. } => Property::FencingOrder,
            Violation::AfterFailedExtend { .. } => Property::GrantAfterFailedExtend,
            Violation::Orphan { .. } => Property::OrphanKey,
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
