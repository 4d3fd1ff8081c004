//! Issue 21 in the world: what happens to invalidation pushes on the way (lost, late; the
//! spurious ones are the masters' own, `SimRedis::evict_tracked`), the faults that take a
//! watched lock's keys away (an operator's `DEL` or overwrite, `FLUSHALL`), and the ground
//! truth the properties (xii) and (xiii) of `check.rs` are checked against: which masters
//! hold each watched lock's token, over time.

use redlock_mux::resp::{self, AggregateKind, Frame, Status};

use super::check::{Property, WatchRec};
use super::{Ev, Us, World, MS, READ_LIMITS};

/// A token no client draws: an operator's overwrite.
const OPERATOR_TOKEN: &[u8] = b"0perat0r0perat0r0perat0r0perat0r";

impl World {
    /// The longest a byte takes one way (a slow delivery included).
    pub(crate) fn max_delay(&self) -> Us {
        if self.cfg.slow_prob > 0.0 {
            self.cfg.latency.1.max(self.cfg.slow_max)
        } else {
            self.cfg.latency.1
        }
    }

    /// Server output for lock link `conn`: invalidation pushes lost or delayed as the
    /// family says; what goes now.
    pub(crate) fn push_faults(&mut self, conn: usize, out: Vec<u8>) -> Vec<u8> {
        let faults = self.cfg.push_lost + self.cfg.push_late > 0.0;
        if (!faults && self.watches.is_empty())
            || self.is_sub_link(conn)
            || (!out.starts_with(b">") && !out.windows(3).any(|w| w == b"\n>2"))
        {
            return out;
        }
        let mut kept = Vec::with_capacity(out.len());
        let mut at = 0;
        while at < out.len() {
            let (push, used) = match resp::parse(&out[at..], &READ_LIMITS) {
                Ok(Status::Complete((frame, used))) => (invalidated_keys(&frame), used),
                // The master writes whole frames.
                other => panic!("the simulated master wrote bad RESP: {other:?}"),
            };
            let bytes = &out[at..at + used];
            at += used;
            let Some(keys) = push else {
                kept.extend_from_slice(bytes);
                continue;
            };
            self.stats.pushes += 1;
            let client = self.conns[conn].client;
            let p = self.rng.f64();
            if p < self.cfg.push_lost {
                self.stats.pushes_lost += 1;
                self.log(|| format!("  push to client {client} LOST: {keys:?}"));
                for r in &mut self.watches {
                    let hit = keys
                        .as_ref()
                        .is_none_or(|ks| ks.iter().any(|k| r.keys.contains(k)));
                    if r.client == client && r.end.is_none() && hit {
                        r.push_lost = true;
                    }
                }
            } else if p < self.cfg.push_lost + self.cfg.push_late {
                self.stats.pushes_late += 1;
                let at = self.t + self.rng.u64(1..=self.cfg.late_max.max(1));
                self.schedule(
                    at,
                    Ev::LatePush {
                        conn,
                        bytes: bytes.to_vec(),
                    },
                );
            } else {
                kept.extend_from_slice(bytes);
            }
        }
        kept
    }

    /// An operator's command on master `server` (its own connection, closed at once).
    pub(crate) fn operator(&mut self, server: usize, args: &[&[u8]]) {
        let now_ms = self.masters[server].clock_ms(self.t);
        let mut bytes = Vec::new();
        let args: Vec<resp::Arg<'_>> = args.iter().map(|a| resp::Arg::Bytes(a)).collect();
        resp::encode_command(&mut bytes, &args);
        let m = &mut self.masters[server].server;
        let c = m.open();
        m.feed(c, &bytes, now_ms);
        m.close(c);
        self.flush_server(server);
    }

    /// An operator takes a watched lock's keys away on some masters: `DEL`, or `SET` of
    /// its own value (which lives a TTL).
    pub(crate) fn steal(&mut self, overwrite: bool) {
        let live: Vec<usize> = (0..self.watches.len())
            .filter(|&r| self.watches[r].end.is_none() && self.watches[r].reported.is_none())
            .collect();
        if live.is_empty() {
            return;
        }
        let r = live[self.rng.usize(..live.len())];
        let n = self.listed.len();
        let k = self.rng.usize(1..=n);
        let mut order: Vec<usize> = (0..n).collect();
        self.rng.shuffle(&mut order);
        let keys = self.watches[r].keys.clone();
        let ttl = (self.cfg.ttl.1 / MS).to_string();
        self.stats.steals += 1;
        let token = String::from_utf8_lossy(&self.watches[r].token[..16]).into_owned();
        self.log(|| {
            format!(
                "STEAL {token} on masters {:?} (overwrite {overwrite})",
                &order[..k]
            )
        });
        for &i in &order[..k] {
            let server = self.listed[i];
            if self.masters[server].down_until.is_some() {
                continue;
            }
            for key in &keys {
                if overwrite {
                    self.operator(
                        server,
                        &[b"SET", key, OPERATOR_TOKEN, b"PX", ttl.as_bytes()],
                    );
                } else {
                    self.operator(server, &[b"DEL", key]);
                }
            }
        }
        if overwrite && !self.vanished.iter().any(|v| v == OPERATOR_TOKEN) {
            // Its keys live their TTL: no orphan.
            self.vanished.push(OPERATOR_TOKEN.to_vec());
        }
        self.update_truth(true);
    }

    /// Master `server`'s tracking table evicts one of its keys: a spurious invalidation.
    pub(crate) fn evict(&mut self, server: usize) {
        if self.masters[server].down_until.is_some() {
            return;
        }
        let keys = self.masters[server].server.tracked_keys();
        if keys.is_empty() {
            return;
        }
        let key = keys[self.rng.usize(..keys.len())].clone();
        if self.masters[server].server.evict_tracked(&key) {
            self.stats.evictions += 1;
            self.log(|| format!("EVICT {} on master {server}", String::from_utf8_lossy(&key)));
        }
        self.flush_server(server);
    }

    /// The listed masters (bit i: the i-th listed) on which every key of `rec` holds its
    /// token now (a master that is down holds nothing).
    pub(crate) fn truth_mask(&self, rec: &WatchRec) -> u64 {
        let t = self.t;
        let mut mask = 0;
        let _ = t;
        for (i, &s) in self.listed.iter().enumerate() {
            if self.master_down(s) {
                continue;
            }
            let all = rec.keys.iter().all(|k| {
                self.master_get(s, k).is_some_and(|v| {
                    let v = v.strip_suffix(b"+").unwrap_or(&v);
                    v == rec.token.as_slice()
                })
            });
            if all {
                mask |= 1 << i;
            }
        }
        mask
    }

    /// Something changed on the masters: each live watch's ground truth, and what (xiii)
    /// owes. `operator`: an operator's command made the change (a hold whose token it
    /// took from a quorum ends there for (i)).
    pub(crate) fn update_truth(&mut self, operator: bool) {
        if self.watches.is_empty() {
            return;
        }
        let q = self.quorum();
        let t = self.t;
        for r in 0..self.watches.len() {
            let rec = &self.watches[r];
            if rec.end.is_some() || rec.reported.is_some() {
                continue;
            }
            let mask = self.truth_mask(rec);
            let rec = &mut self.watches[r];
            if rec.hist.last().is_some_and(|&(_, m)| m == mask) {
                continue;
            }
            let before = rec.hist.last().map_or(0, |&(_, m)| m);
            rec.hist.push((t, mask));
            if operator && before & !mask != 0 {
                rec.tampered = true;
            }
            let held = mask.count_ones() as usize >= q;
            if held {
                rec.owe_since = None;
                continue;
            }
            if operator || rec.tampered {
                let fp = rec.token[..16].to_vec();
                self.stolen.entry(fp).or_insert(t);
            }
            if rec.owe_since.is_none() {
                rec.owe_since = Some(t);
                if let Some(bound) = self.cfg.watch_bound {
                    self.schedule(t + bound, Ev::WatchDue { rec: r, since: t });
                }
            }
        }
    }

    /// A new watch of client `c`'s caller `k`.
    pub(crate) fn add_watch(&mut self, rec: WatchRec) -> usize {
        self.stats.watched += 1;
        self.watches.push(rec);
        let r = self.watches.len() - 1;
        let mask = self.truth_mask(&self.watches[r]);
        let t = self.t;
        let q = self.quorum();
        let rec = &mut self.watches[r];
        rec.hist.push((t, mask));
        if (mask.count_ones() as usize) < q {
            rec.owe_since = Some(t);
            if let Some(bound) = self.cfg.watch_bound {
                self.schedule(t + bound, Ev::WatchDue { rec: r, since: t });
            }
        }
        r
    }

    /// (xiii) at its due time.
    pub(crate) fn watch_due(&mut self, r: usize, since: Us) {
        let Some(bound) = self.cfg.watch_bound else {
            return;
        };
        let rec = &self.watches[r];
        if rec.owe_since != Some(since) {
            // The quorum came back meanwhile (an extension put the keys back).
            return;
        }
        self.stats.owed += 1;
        if rec.reported.is_some() {
            self.stats.owed_met += 1;
            return;
        }
        if rec.end.is_some() {
            // The hold ended first (its validity, its work).
            self.stats.owed_excused += 1;
            return;
        }
        let due = since + bound;
        let client = rec.client;
        // Excused: a push of its keys was lost (only the next extension finds the loss),
        // the client's bytes were held by a cut or its loop frozen, its validity ends
        // first (an honest holder stops there anyway).
        let cut = self
            .cuts
            .iter()
            .any(|c| c.client.is_none_or(|x| x == client) && c.from < due && c.to > since);
        let paused = self
            .pauses
            .iter()
            .any(|&(c, from, to)| c == client && from < due && to > since);
        let valid = rec.hold.map_or(u64::MAX, |h| self.held[h].valid_until);
        let cut_off = self.cfg.clients[client].cut_off != 0;
        // A master that restarted: its lost connection is no loss by itself (one that
        // kept its keys still holds them); the loss is read on the new connection, once
        // the master is back and the client's reconnect backoff allows (up to a second),
        // which this bound does not cover: the real-master test times it
        // (`lost::lost_fires_when_a_quorum_restarts_without_persistence`).
        let restarted = self
            .downs
            .iter()
            .any(|&(from, to)| from < due && to + 1_000_000 > since);
        if rec.push_lost || cut || paused || cut_off || restarted || valid <= due {
            self.stats.owed_excused += 1;
            return;
        }
        let what = format!(
            "client {} caller {}: lock {} held by fewer than a quorum of masters since \
             {:.3} ms (masters holding it: {:?}), no loss reported by {:.3} ms (bound {:.3} \
             ms; its validity ends at {:.3} ms)",
            rec.client,
            rec.caller,
            String::from_utf8_lossy(&rec.token[..16]),
            super::ms(since),
            rec.hist
                .iter()
                .map(|&(t, m)| (super::ms(t), format!("{m:b}")))
                .collect::<Vec<_>>(),
            super::ms(due),
            super::ms(bound),
            super::ms(valid)
        );
        let t = self.t;
        self.violation(Property::LossReported, t, what);
    }
}

/// The keys an `invalidate` push names (`Some(None)`: a flush, every key); `None`: not an
/// invalidation.
fn invalidated_keys(frame: &Frame<'_>) -> Option<Option<Vec<Vec<u8>>>> {
    let Frame::Aggregate(a) = frame else {
        return None;
    };
    if a.kind() != AggregateKind::Push {
        return None;
    }
    let mut it = a.iter();
    match it.next() {
        Some(Frame::Bulk(b"invalidate")) => {}
        _ => return None,
    }
    match it.next() {
        Some(Frame::Aggregate(keys)) => Some(Some(
            keys.iter()
                .filter_map(|k| match k {
                    Frame::Bulk(k) => Some(k.to_vec()),
                    _ => None,
                })
                .collect(),
        )),
        _ => Some(None),
    }
}
