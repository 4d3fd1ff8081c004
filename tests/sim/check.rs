//! What the simulation records of a run, and the properties it checks on it.
//!
//! (i) mutual exclusion: the hold intervals of different locks on one resource never
//!     overlap. A hold runs from the moment the caller got the lock to the earlier of its
//!     release (or drop) and the lock's validity as the lock reported it last (an honest
//!     holder stops at its validity; extensions move it, a failed extension does not: that
//!     is (iii), no grant to another while a lock reports valid after a failed extend).
//! (ii) fencing tokens strictly increase in grant order per resource; a multi-resource
//!     lock's token exceeds every earlier token of any of its resources.
//! (vii) bounded attempts: a lock call makes at most its timed retries, plus one per piece
//!     of news that could free it (a release of a granted lock announced to its client or
//!     made by it, a subscription confirmed, the holder's expiry, a sibling call that left
//!     the line), plus one. A waiter that spins on its own cleanups, or on its siblings',
//!     breaks it by orders of magnitude.
//! (viii) progress: while a resource is free on a quorum and some waiting call's client
//!     reaches a quorum of masters, somebody is granted it within a bound derived from the
//!     settings.
//! (ix) fair waiters keep their place: a fair call is not granted while a fair call that
//!     arrived earlier stands in line on a quorum of masters and keeps asking.
//! (x) no lost wake-up: a release of a resource with a call waiting for it in notify mode is
//!     followed by an attempt of some waiting call within a few round trips (families whose
//!     retry delays are far longer, so only a wake-up explains an attempt).
//! (xi) no orphan key: after the run, with every master back and every client shut down
//!     as its front-end does, no master keeps a key of a lock that was released, dropped or
//!     never granted (only locks whose holder vanished without releasing keep theirs until
//!     their TTL; a single-owner client that still owed releases when it was dropped may
//!     leave keys until their TTL, which its documentation says).
//! (xii) no spurious loss (issue 21): a watched lock is never reported lost (`take_lost`)
//!     while a quorum of masters holds its token, in the world's ground truth, throughout
//!     the last `2 x` the longest one-way delay before the report (a read's answer, or an
//!     extension that put a key back, may be that old). The masters whose connection
//!     closed (their vote in the report is `Failed`: "a closed connection takes the
//!     master's vote") do not count as holding: that rule is the design's. An invalidation
//!     the master sends for a key that did not change (a tracking-table eviction) must be
//!     confirmed away by a read.
//! (xiii) a loss is reported within a bound (issue 21): once fewer than a quorum of masters
//!     hold a watched lock's token (ground truth; a master that is down holds nothing)
//!     and it stays so, the client reports it lost within `watch_bound` (a few one-way
//!     delays, a late push's delay, the client's turn) -- unless a push of the lock's keys
//!     to that client was lost (then only the next extension finds the loss), a cut held
//!     the client's bytes or its loop was frozen meanwhile, or the lock's validity ends
//!     first (an honest holder stops there anyway).

use std::fmt;

use super::Us;

/// An interval during which a caller believed it held a lock on `res`.
#[derive(Clone, Debug)]
pub struct Held {
    pub res: usize,
    pub client: usize,
    pub caller: usize,
    /// The lock's token (its first 16 hex digits).
    pub token: String,
    pub start: Us,
    pub end: Us,
    /// The lock's validity end as reported last, and whether an extension failed.
    pub valid_until: Us,
    pub failed_extend: bool,
}

/// A fenced grant.
#[derive(Clone, Debug)]
pub struct Grant {
    pub at: Us,
    pub client: usize,
    pub res: Vec<usize>,
    pub token: String,
    pub fence: u64,
}

/// One lock call, for the liveness properties.
#[derive(Clone, Debug)]
pub struct Call {
    pub client: usize,
    pub caller: usize,
    pub res: Vec<usize>,
    pub kind: &'static str,
    pub fair: bool,
    pub notify: bool,
    pub start: Us,
    pub end: Option<Us>,
    pub granted: bool,
    /// Attempts, as the lock or the error's report says.
    pub attempts: u32,
    /// The retries its settings allow (`retry_count`), or `None` with a deadline.
    pub retries: Option<u32>,
    pub deadline: Option<Us>,
    pub result: String,
}

/// Which property a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Property {
    MutualExclusion,
    FencingOrder,
    BoundedAttempts,
    Progress,
    KeepsItsPlace,
    LostWakeup,
    OrphanKey,
    /// A `try_lock` without contention or faults failed.
    Uncontended,
    /// The run itself went wrong: the core never settled, a call never ended.
    Stuck,
    /// (xii).
    NoSpuriousLoss,
    /// (xiii).
    LossReported,
}

/// A watched lock (issue 21), and what the masters held of it.
#[derive(Clone, Debug)]
pub struct WatchRec {
    pub client: usize,
    pub caller: usize,
    pub id: redlock_mux::core::WatchId,
    /// The lock's token (whole) and keys.
    pub token: Vec<u8>,
    pub keys: Vec<Vec<u8>>,
    /// Its first hold record (`World::held`).
    pub hold: Option<usize>,
    pub start: Us,
    /// Unwatched (the hold ended), reported lost.
    pub end: Option<Us>,
    pub reported: Option<Us>,
    /// Ground truth: from each instant, the listed masters that hold its token (bits).
    pub hist: Vec<(Us, u64)>,
    /// (xiii): fewer than a quorum hold it since then.
    pub owe_since: Option<Us>,
    /// A push of its keys to its client was lost.
    pub push_lost: bool,
    /// An operator took its token from some master: Redlock's guarantee assumes nobody
    /// touches the keys, so from then on the hold ends for (i) as soon as fewer than a
    /// quorum hold its token, whatever takes the last one (an expiry of a key an
    /// extension did not reach: seed 183 of issue21_watch).
    pub tampered: bool,
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub property: Property,
    pub at: Us,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} at {:.3} ms: {}",
            self.property,
            self.at as f64 / 1000.0,
            self.what
        )
    }
}

/// (i): overlapping holds of one resource by different locks.
pub fn check_intervals(held: &[Held]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_res: Vec<Vec<&Held>> = Vec::new();
    for h in held {
        if h.end <= h.start {
            continue;
        }
        if by_res.len() <= h.res {
            by_res.resize_with(h.res + 1, Vec::new);
        }
        by_res[h.res].push(h);
    }
    for list in &mut by_res {
        list.sort_by_key(|h| (h.start, h.end));
        let mut reach: Option<&Held> = None;
        for h in list.iter() {
            if let Some(r) = reach {
                if h.start < r.end && h.token != r.token {
                    out.push(Violation {
                        property: Property::MutualExclusion,
                        at: h.start,
                        what: format!(
                            "resource {}: client {} caller {} held {} from {:.3} to {:.3} ms \
                             (valid until {:.3}{}), client {} caller {} was granted {} at {:.3} ms",
                            h.res,
                            r.client,
                            r.caller,
                            r.token,
                            r.start as f64 / 1000.0,
                            r.end as f64 / 1000.0,
                            r.valid_until as f64 / 1000.0,
                            if r.failed_extend {
                                ", after a failed extend"
                            } else {
                                ""
                            },
                            h.client,
                            h.caller,
                            h.token,
                            h.start as f64 / 1000.0
                        ),
                    });
                    if out.len() > 4 {
                        return out;
                    }
                }
            }
            if reach.is_none_or(|r| h.end > r.end) {
                reach = Some(h);
            }
        }
    }
    out
}

/// (ii): fencing tokens in grant order.
pub fn check_tokens(grants: &[Grant]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut sorted: Vec<&Grant> = grants.iter().collect();
    sorted.sort_by_key(|g| g.at);
    let mut best: Vec<Option<&Grant>> = Vec::new();
    for g in sorted {
        for &r in &g.res {
            if best.len() <= r {
                best.resize(r + 1, None);
            }
            if let Some(prev) = best[r] {
                if g.fence <= prev.fence {
                    out.push(Violation {
                        property: Property::FencingOrder,
                        at: g.at,
                        what: format!(
                            "resource {r}: client {} got fencing token {} at {:.3} ms after \
                             client {} got {} at {:.3} ms",
                            g.client,
                            g.fence,
                            g.at as f64 / 1000.0,
                            prev.client,
                            prev.fence,
                            prev.at as f64 / 1000.0
                        ),
                    });
                }
            }
        }
        for &r in &g.res {
            if best[r].is_none_or(|p| g.fence > p.fence) {
                best[r] = Some(g);
            }
        }
    }
    out
}

use super::client::{min_retry_gap, State};
use super::World;
use redlock_mux::Lock;

impl World {
    pub(crate) fn quorum(&self) -> usize {
        self.listed.len() / 2 + 1
    }

    /// Calls waiting (in a lock call) on resource `r`: (client, caller, call).
    fn waiting_on(&self, r: usize) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for (c, cl) in self.clients.iter().enumerate() {
            for (k, caller) in cl.callers.iter().enumerate() {
                if let (State::Calling { .. }, Some(call)) = (&caller.state, caller.call) {
                    if self.calls[call].res.contains(&r) {
                        out.push((c, k, call));
                    }
                }
            }
        }
        out
    }

    /// A client wrote an acquire of `keys`: a release awaiting a waiter's attempt is
    /// answered (x).
    pub(crate) fn on_attempt(&mut self, client: usize, keys: &[Vec<u8>]) {
        for key in keys {
            let Some(r) = World::resource_of(key) else {
                continue;
            };
            if r < self.wake_due.len()
                && self.wake_due[r].is_some()
                && self.waiting_on(r).iter().any(|(c, _, _)| *c == client)
            {
                self.wake_due[r] = None;
            }
        }
    }

    /// A lock was granted to `call` of client `c`: (ix) no fair call that arrived earlier
    /// and stands in line was overtaken.
    pub(crate) fn on_grant(&mut self, c: usize, call: usize, lock: &Lock) {
        let res = self.calls[call].res.clone();
        for &r in &res {
            if r < self.wake_due.len() {
                self.wake_due[r] = None;
            }
            if r < self.stuck_since.len() {
                self.stuck_since[r] = None;
            }
        }
        if !self.cfg.check_place || !self.calls[call].fair || res.len() != 1 {
            return;
        }
        let r = res[0];
        let me = &self.calls[call];
        let token = lock.token().as_bytes().to_vec();
        let Some(grant_attempt) = self.attempts.iter().rev().find(|a| a.token == token) else {
            return;
        };
        let grant_at = grant_attempt.at;
        let latency = self.cfg.latency.1.max(self.cfg.slow_max);
        for (oc, ok, other) in self.waiting_on(r) {
            let y = &self.calls[other];
            if other == call || !y.fair || y.res.len() != 1 || y.start >= me.start {
                continue;
            }
            // Its first attempt reached the masters before the grant's did: it stood in
            // line ahead.
            let first = self.attempts.iter().find(|a| {
                a.client == oc && a.at >= y.start && a.keys.len() == 1 && a.waiter.is_some()
            });
            let Some(first) = first else { continue };
            if first.at + latency >= grant_at {
                continue;
            }
            let what = format!(
                "resource {r}: client {c} (call at {:.3} ms) was granted by its attempt at \
                 {:.3} ms while client {oc} caller {ok} (call at {:.3} ms, in line since its \
                 attempt at {:.3} ms) still waited",
                super::ms(me.start),
                super::ms(grant_at),
                super::ms(y.start),
                super::ms(first.at)
            );
            let t = self.t;
            self.violation(Property::KeepsItsPlace, t, what);
            return;
        }
    }

    /// A call ended: (vii) its attempts are bounded; without contention a `try_lock` is
    /// granted.
    pub(crate) fn check_call(&mut self, call: usize) {
        if self.cfg.check_uncontended
            && !self.stopping
            && self.calls[call].kind == "try_lock"
            && !self.calls[call].granted
        {
            let x = &self.calls[call];
            let what = format!(
                "client {} caller {}: try_lock {:?} of a free resource, nobody else asking: {}",
                x.client, x.caller, x.res, x.result
            );
            let at = x.end.unwrap_or(self.t);
            self.violation(Property::Uncontended, at, what);
        }
        if !self.cfg.check_attempts {
            return;
        }
        let mut x = self.calls[call].clone();
        let end = x.end.unwrap_or(self.t);
        // A call that ended without a report (cancelled) tells no attempts: count what its
        // client wrote for its keys meanwhile, when no other call of the client on them ran.
        let names: Vec<Vec<u8>> = x.res.iter().map(|&r| World::resource_name(r)).collect();
        let alone = !self.calls.iter().enumerate().any(|(i, y)| {
            i != call
                && y.client == x.client
                && y.res.iter().any(|r| x.res.contains(r))
                && y.start <= end
                && y.end.is_none_or(|e| e >= x.start)
        });
        if alone {
            let written = self
                .attempts
                .iter()
                .filter(|a| {
                    a.client == x.client
                        && x.start <= a.at
                        && a.at <= end
                        && a.keys.iter().any(|k| names.contains(k))
                })
                .count() as u32;
            x.attempts = x.attempts.max(written);
        }
        let cfg = &self.cfg.clients[x.client];
        let gap = min_retry_gap(cfg);
        let timed = match x.retries {
            Some(n) => n as u64,
            None => (end - x.start) / gap + 1,
        };
        let during = |at: Us| x.start <= at && at <= end;
        // Announcements that could free a quorum (not of this client's own tokens), and
        // subscriptions confirmed.
        let mut news = 0u64;
        for h in &self.heard {
            if h.client != x.client || !during(h.at) || !h.could_free {
                continue;
            }
            if !h.key.as_ref().is_none_or(|k| names.contains(k)) {
                continue;
            }
            match &h.fp {
                None => news += 1,
                Some(fp) if self.fp_client.get(fp) != Some(&x.client) => news += 1,
                Some(_) => {}
            }
        }
        // This client's own releases (a sibling's lock or cleanup) that could free a
        // quorum.
        news += self
            .written_releases
            .iter()
            .filter(|r| {
                r.client == x.client
                    && r.could_free
                    && during(r.at)
                    && r.keys.iter().any(|k| names.contains(k))
            })
            .count() as u64;
        // Other clients' attempts and grants: keys that came and went (their expiries).
        let others = self
            .attempts
            .iter()
            .filter(|a| {
                a.client != x.client && during(a.at) && a.keys.iter().any(|k| names.contains(k))
            })
            .count() as u64;
        let siblings = self
            .calls
            .iter()
            .filter(|y| {
                y.client == x.client
                    && y.res.iter().any(|r| x.res.contains(r))
                    && y.end.is_some_and(during)
            })
            .count() as u64;
        let bound = 3 + timed + news + others + siblings;
        if x.attempts as u64 > bound {
            let what = format!(
                "client {} caller {} {} {:?} made {} attempts in {:.3} ms (from {:.3} ms): \
                 bound {bound} = 3 + timed {timed} + news {news} + others' attempts \
                 {others} + siblings {siblings}; {}",
                x.client,
                x.caller,
                x.kind,
                x.res,
                x.attempts,
                super::ms(end - x.start),
                super::ms(x.start),
                x.result
            );
            self.violation(Property::BoundedAttempts, end, what);
        }
    }

    /// (viii) and (x), looked at every few milliseconds.
    pub(crate) fn monitor(&mut self) {
        let t = self.t;
        if let Some(bound) = self.cfg.wakeup_bound {
            let _ = bound;
            for r in 0..self.wake_due.len() {
                if let Some((since, due)) = self.wake_due[r] {
                    if t > due {
                        self.wake_due[r] = None;
                        if self.waiting_on(r).is_empty() {
                            continue;
                        }
                        let what = format!(
                            "resource {r}: released at {:.3} ms with calls waiting \
                             ({:?}), and no attempt of theirs by {:.3} ms",
                            super::ms(since),
                            self.waiting_on(r),
                            super::ms(due)
                        );
                        self.violation(Property::LostWakeup, t, what);
                    }
                }
            }
        }
        let Some(bound) = self.cfg.progress_bound else {
            return;
        };
        let q = self.quorum();
        for r in 0..self.cfg.resources {
            let key = World::resource_name(r);
            // Masters (listed) that are up, and where nothing holds the key.
            let free: Vec<bool> = self
                .listed
                .iter()
                .map(|&s| !self.master_down(s) && self.master_get(s, &key).is_none())
                .collect();
            let held = self
                .held
                .iter()
                .any(|h| h.res == r && h.start <= t && t < h.end.min(h.valid_until));
            let capable = !held
                && free.iter().filter(|f| **f).count() >= q
                && self.waiting_on(r).iter().any(|&(c, _, call)| {
                    let cl = &self.clients[c];
                    if cl.paused_until.is_some() {
                        return false;
                    }
                    // Every resource of the call is free where this client reaches.
                    let reach = (0..self.listed.len())
                        .filter(|&i| {
                            let s = self.listed[i];
                            !self.master_cut(c, s, t)
                                && self.calls[call].res.iter().all(|&x| {
                                    let k = World::resource_name(x);
                                    !self.master_down(s) && self.master_get(s, &k).is_none()
                                })
                        })
                        .count();
                    reach >= q
                });
            if capable {
                let since = *self.stuck_since[r].get_or_insert(t);
                if t - since > bound {
                    let what = format!(
                        "resource {r}: free on a quorum since {:.3} ms with a waiter that \
                         reaches a quorum ({:?}), and nobody granted for {:.3} ms; lines: {}",
                        super::ms(since),
                        self.waiting_on(r),
                        super::ms(t - since),
                        self.lines(&key)
                    );
                    self.violation(Property::Progress, t, what);
                    self.stuck_since[r] = Some(t);
                }
            } else {
                self.stuck_since[r] = None;
            }
        }
    }

    /// The line of `key` on every master: waiter ids (first 8 hex digits of the call's
    /// part), scores, and whether each is alive.
    fn lines(&self, key: &[u8]) -> String {
        let t = self.t;
        let q = redlock_mux::scripts::aux_key(redlock_mux::scripts::QUEUE, key);
        let a = redlock_mux::scripts::aux_key(redlock_mux::scripts::ALIVE, key);
        let mut out = String::new();
        for (s, m) in self.masters.iter().enumerate() {
            let now = m.clock_ms(t);
            let until = m.server.zset(0, &a, now);
            let line: Vec<String> = m
                .server
                .zset(0, &q, now)
                .iter()
                .map(|(id, score)| {
                    // The server's clock is `now` (its `TIME`, in ms).
                    let alive = until.iter().any(|(w, d)| w == id && *d >= now as f64);
                    format!(
                        "{}@{score}{}",
                        String::from_utf8_lossy(id),
                        if alive { "" } else { " (dead)" }
                    )
                })
                .collect();
            out.push_str(&format!(
                "master {s}: {line:?} pttl {}; ",
                m.server.pttl(0, &q, now)
            ));
        }
        out
    }

    /// A release of resource `r` was sent: (x) a waiting call must try soon.
    pub(crate) fn expect_wakeup(&mut self, r: usize, valid_until: Us) {
        let Some(bound) = self.cfg.wakeup_bound else {
            return;
        };
        let t = self.t;
        // An expired lock's release finds nothing to announce; the waiter wakes at the
        // holder's expiry instead.
        if t + bound >= valid_until {
            return;
        }
        let settle = bound;
        let waiting = self
            .waiting_on(r)
            .iter()
            .any(|&(_, _, call)| self.calls[call].notify && self.calls[call].start + settle < t);
        if waiting && self.wake_due[r].is_none() {
            self.wake_due[r] = Some((t, t + bound));
        }
    }

    /// (xii): watch `r` was reported lost now; `failed`: the listed masters whose vote
    /// the report gives as a closed connection.
    pub(crate) fn check_report(&mut self, r: usize, failed: u64) {
        let t = self.t;
        let q = self.quorum();
        let window = 2 * self.max_delay() + 2 * super::MS;
        let rec = &self.watches[r];
        let from = t.saturating_sub(window);
        // The truth in force at `from`, and every later one.
        let first = rec
            .hist
            .iter()
            .rposition(|&(at, _)| at <= from)
            .unwrap_or(0);
        let held = |m: u64| (m & !failed).count_ones() as usize >= q;
        if rec.hist[first..].iter().all(|&(_, m)| held(m)) {
            let what = format!(
                "client {} caller {}: lock {} reported lost at {:.3} ms while a quorum of \
                 masters held it since {:.3} ms at least (holding, by instant: {:?}; votes \
                 taken by a closed connection: {failed:b})",
                rec.client,
                rec.caller,
                String::from_utf8_lossy(&rec.token[..16]),
                super::ms(t),
                super::ms(from),
                rec.hist
                    .iter()
                    .map(|&(t, m)| (super::ms(t), format!("{m:b}")))
                    .collect::<Vec<_>>(),
            );
            self.violation(Property::NoSpuriousLoss, t, what);
        }
    }

    /// After the run: (i), (ii), (xi), and every call ended.
    pub(crate) fn final_checks(&mut self) {
        let t = self.t;
        for h in &mut self.held {
            if h.end == u64::MAX {
                h.end = h.valid_until.min(t);
            }
            // An operator took the lock's keys from a quorum: not the client's doing.
            if let Some(&at) = self.stolen.get(h.token.as_bytes()) {
                h.end = h.end.min(at.max(h.start));
            }
        }
        for v in check_intervals(&self.held) {
            self.violation(v.property, v.at, v.what);
        }
        for v in check_tokens(&self.grants) {
            self.violation(v.property, v.at, v.what);
        }
        for (i, call) in self.calls.iter().enumerate() {
            if call.end.is_none() {
                let what = format!(
                    "call {i} ({} {:?} of client {}) never ended",
                    call.kind, call.res, call.client
                );
                self.violations.push(Violation {
                    property: Property::Stuck,
                    at: t,
                    what,
                });
                break;
            }
        }
        if self.cfg.check_orphans {
            self.check_orphans();
        }
    }

    /// (xi): every key left on a master is a vanished holder's, or a single owner's that
    /// still owed releases when it was dropped (until its TTL).
    fn check_orphans(&mut self) {
        let t = self.t;
        let mut found = Vec::new();
        for s in 0..self.masters.len() {
            let m = &self.masters[s];
            let now = m.clock_ms(t);
            for key in m.server.keys(0, now) {
                if key.starts_with(redlock_mux::scripts::RESERVED_PREFIX) {
                    continue;
                }
                let Some(v) = m.server.get(0, &key, now) else {
                    continue;
                };
                let token = v.strip_suffix(b"+").unwrap_or(&v).to_vec();
                if self.vanished.contains(&token) {
                    continue;
                }
                let client = self.token_client.get(&token).copied();
                if self.left_by_lost_cluster_connection(s, &token) {
                    self.stats.keys_left_ttl += 1;
                    continue;
                }
                if let Some(c) = client {
                    if !self.clients[c].cfg.shared && self.clients[c].owed_at_drop {
                        self.stats.keys_left_ttl += 1;
                        continue;
                    }
                }
                found.push(format!(
                    "master {s}: key {} = {} (client {client:?}, pttl {} ms)",
                    String::from_utf8_lossy(&key),
                    String::from_utf8_lossy(&v[..v.len().min(16)]),
                    m.server.pttl(0, &key, now)
                ));
            }
        }
        if !found.is_empty() {
            let what = format!("keys left after every client released and shut down: {found:?}");
            self.violation(Property::OrphanKey, t, what);
        }
    }
}
