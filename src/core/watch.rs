//! Watching held locks: a holder hears within a round trip that its lock is gone, without
//! polling (issue 21).
//!
//! A watched lock's keys are *tracked* on every master's lock connection (Redis 6+ and
//! Valkey client-side caching): the connection switches to RESP3 (`HELLO 3`) and turns
//! `CLIENT TRACKING ON OPTIN NOLOOP` on, once; then `CLIENT CACHING YES` and `MGET` of the
//! lock's keys arm the tracking of those keys and read them in one go (the read also says
//! whether the master still holds them). From then on the master pushes `invalidate` on
//! that connection when anyone else modifies a key (a `DEL` by an operator, an overwrite,
//! the key expiring or being evicted, a `FLUSHALL`); `NOLOOP` keeps our own extensions and
//! releases quiet.
//!
//! Each master has a *vote*: it holds the lock as far as we know (its read showed our
//! token), it was asked (a read is on its way, or its connection closed and a new one will
//! read again: a restart without persistence lost the keys, one with persistence or a cut
//! connection did not), it does not (its read showed another value or none), or it cannot
//! be watched (no tracking: Redis before 6, or an ACL without `CLIENT`). An invalidation is
//! never taken on trust: the master's vote goes back to "asked" and one read of the keys
//! confirms (a tracking table that evicts keys sends invalidations for keys that did not
//! change). When fewer than a quorum of masters may still hold the lock, it is lost, at
//! once, and for good: [`Watches::take_lost`] reports it to the front-end.
//!
//! Our own extension modifies the keys and so ends their tracking: each reply to an
//! extension re-arms that master (whatever the reply said: a master that lost the key and
//! got it back from the extension script votes yes again after the read). A waiting acquire
//! of ours marks a held key (`WAITED`): with NOLOOP that write too ends the tracking without
//! a push (a shared client's caller waiting for a lock its sibling holds), so each reply to
//! one re-arms the watches of its keys there.

use smallvec::SmallVec;

use super::ops::KeyList;
use crate::resp::{self, AggregateKind, Arg, Frame};
use crate::rules::{Fault, Outcome};
use crate::scripts::WAITED;
use crate::token::Token;

/// A watch's handle: slot plus generation (a stale handle never aliases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchId {
    slot: u32,
    gen: u32,
}

/// What a master says of a watched lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vote {
    /// A read of the keys is on its way (after arming, or to confirm an invalidation).
    Asked,
    /// The last read showed our token on every key; tracking is armed.
    Yes,
    /// The master does not hold the lock: `NotHeld` (another value, or none), or the
    /// connection that held it was lost (`Failed`).
    No(Outcome),
    /// The master cannot be watched (no tracking): it counts as holding.
    Blind,
}

impl Vote {
    /// May this master still hold the lock?
    fn may_hold(self) -> bool {
        !matches!(self, Vote::No(_))
    }

    /// As a report's outcome: `Ok` for a master that may still hold the lock.
    pub(crate) fn outcome(self) -> Outcome {
        match self {
            Vote::Yes | Vote::Asked | Vote::Blind => Outcome::Ok,
            Vote::No(o) => o,
        }
    }
}

/// One watched lock.
pub(crate) struct Watch {
    gen: u32,
    live: bool,
    pub keys: KeyList,
    pub token: Token,
    pub votes: SmallVec<[Vote; 8]>,
    /// Lost: the votes at that moment.
    pub lost: bool,
    /// The masters (bit `i`) whose read showed the token at least once: only those may
    /// still hold the lock when their connection is lost (the others never answered for
    /// it: down at the grant, say).
    pub held_once: u64,
}

/// The watched locks of a client.
#[derive(Default)]
pub(crate) struct Watches {
    list: Vec<Watch>,
    free: Vec<u32>,
    live: usize,
    /// Watches lost since the front-end last looked.
    lost: Vec<WatchId>,
}

impl Watches {
    /// Any lock watched?
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.live > 0
    }

    /// Watch a lock of `keys` and `token` on `n` masters; every vote starts as asked.
    pub(crate) fn add(&mut self, keys: &KeyList, token: Token, n: usize) -> WatchId {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.list.push(Watch {
                    gen: 0,
                    live: false,
                    keys: KeyList::default(),
                    token,
                    votes: SmallVec::new(),
                    lost: false,
                    held_once: 0,
                });
                (self.list.len() - 1) as u32
            }
        };
        let w = &mut self.list[slot as usize];
        w.gen = w.gen.wrapping_add(1);
        w.live = true;
        w.keys.assign(keys);
        w.token = token;
        w.votes.clear();
        w.votes.resize(n, Vote::Asked);
        w.lost = false;
        w.held_once = 0;
        self.live += 1;
        WatchId { slot, gen: w.gen }
    }

    /// Stop watching (a stale id does nothing).
    pub(crate) fn remove(&mut self, id: WatchId) {
        if self.get(id).is_some() {
            self.list[id.slot as usize].live = false;
            self.free.push(id.slot);
            self.live -= 1;
            self.lost.retain(|x| *x != id);
        }
    }

    /// Stop watching the lock of `token` (it is being released).
    #[cold]
    #[inline(never)]
    pub(crate) fn remove_token(&mut self, token: &Token) {
        if let Some(id) = self.find_token(token) {
            self.remove(id);
        }
    }

    pub(crate) fn get(&self, id: WatchId) -> Option<&Watch> {
        self.list
            .get(id.slot as usize)
            .filter(|w| w.live && w.gen == id.gen)
    }

    /// The live watch of the lock of `token`.
    pub(crate) fn find_token(&self, token: &Token) -> Option<WatchId> {
        if self.live == 0 {
            return None;
        }
        self.list
            .iter()
            .enumerate()
            .find(|(_, w)| w.live && w.token == *token)
            .map(|(slot, w)| WatchId {
                slot: slot as u32,
                gen: w.gen,
            })
    }

    /// The live watches one of whose keys is `key` (`None`: every live watch, as for a
    /// flush).
    pub(crate) fn with_key(&self, key: Option<&[u8]>) -> SmallVec<[WatchId; 4]> {
        self.list
            .iter()
            .enumerate()
            .filter(|(_, w)| w.live && key.is_none_or(|k| w.keys.iter().any(|x| x == k)))
            .map(|(slot, w)| WatchId {
                slot: slot as u32,
                gen: w.gen,
            })
            .collect()
    }

    /// Set master `i`'s vote on watch `id`; `true` when this made the lock lost.
    pub(crate) fn set_vote(&mut self, id: WatchId, i: usize, vote: Vote, quorum: usize) -> bool {
        let Some(w) = self
            .list
            .get_mut(id.slot as usize)
            .filter(|w| w.live && w.gen == id.gen)
        else {
            return false;
        };
        if let Some(v) = w.votes.get_mut(i) {
            *v = vote;
        }
        if vote == Vote::Yes && i < 64 {
            w.held_once |= 1 << i;
        }
        if w.lost {
            return false;
        }
        let may_hold = w.votes.iter().filter(|v| v.may_hold()).count();
        if may_hold < quorum {
            w.lost = true;
            self.lost.push(id);
            return true;
        }
        false
    }

    /// Master `i`'s connection closed with `fault`: where its reads showed the token, what
    /// it holds is unknown until a new connection reads the keys again (a restart with its
    /// data, a cut connection: still held); where they never did, it holds nothing of it
    /// (a vote already lost stays lost).
    pub(crate) fn link_lost(&mut self, i: usize, fault: Fault, quorum: usize) {
        for slot in 0..self.list.len() {
            let w = &self.list[slot];
            if !w.live || !w.votes.get(i).is_some_and(|v| v.may_hold()) {
                continue;
            }
            let id = WatchId {
                slot: slot as u32,
                gen: w.gen,
            };
            let vote = self.after_link_lost(id, i, fault);
            self.set_vote(id, i, vote, quorum);
        }
    }

    /// Master `i`'s vote on watch `id` once the connection is lost (see
    /// [`Watches::link_lost`]).
    pub(crate) fn after_link_lost(&self, id: WatchId, i: usize, fault: Fault) -> Vote {
        let held = self
            .get(id)
            .is_some_and(|w| i < 64 && w.held_once & (1 << i) != 0);
        if held {
            Vote::Asked
        } else {
            Vote::No(Outcome::Failed(fault))
        }
    }

    /// The next watch lost since the last call.
    pub(crate) fn take_lost(&mut self) -> Option<WatchId> {
        self.lost.pop()
    }
}

/// Whether a read of a watched key shows the lock's token (plain, or marked as won in a
/// line of waiters).
pub(crate) fn holds(value: &[u8], token: &Token) -> bool {
    let t = token.as_bytes();
    value == t
        || (value.len() == t.len() + WAITED.len()
            && value.starts_with(t)
            && value.ends_with(WAITED))
}

/// `MGET` of `keys` into `out`.
pub(super) fn encode_mget(out: &mut Vec<u8>, keys: &KeyList) {
    let mut args: SmallVec<[Arg<'_>; 4]> = SmallVec::new();
    args.push(Arg::Bytes(b"MGET"));
    args.extend(keys.iter().map(Arg::Bytes));
    resp::encode_command(out, &args);
}

/// The watches a pushed frame invalidates: `invalidate` with an array of keys (each
/// watch one of whose keys is listed), or with a null (a flush: every watch). Any other
/// push touches none.
pub(super) fn invalidated(push: &resp::Aggregate<'_>, watches: &Watches) -> SmallVec<[WatchId; 4]> {
    let mut out = SmallVec::new();
    let mut it = push.iter();
    let (Some(Frame::Bulk(kind) | Frame::Simple(kind)), Some(what)) = (it.next(), it.next()) else {
        return out;
    };
    if !kind.eq_ignore_ascii_case(b"invalidate") {
        return out;
    }
    match what {
        f if f.is_null() => out = watches.with_key(None),
        Frame::Aggregate(keys) => {
            for k in keys.iter() {
                if let Frame::Bulk(k) | Frame::Simple(k) = k {
                    for w in watches.with_key(Some(k)) {
                        if !out.contains(&w) {
                            out.push(w);
                        }
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// What a watch's `MGET` reply says of the master: yes when every key holds the token;
/// an error (the read refused, say by an ACL) leaves it blind.
pub(super) fn vote_of(reply: &Frame<'_>, watch: &Watch) -> Vote {
    match reply {
        Frame::Aggregate(a) if a.kind() == AggregateKind::Array && a.len() == watch.keys.len() => {
            let all = a
                .iter()
                .all(|v| matches!(v, Frame::Bulk(v) if holds(v, &watch.token)));
            if all {
                Vote::Yes
            } else {
                Vote::No(Outcome::NotHeld)
            }
        }
        _ => Vote::Blind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(b: u8) -> Token {
        Token::filled(b'0' + b)
    }

    #[test]
    fn lost_when_fewer_than_a_quorum_may_hold() {
        let mut ws = Watches::default();
        let mut keys = KeyList::default();
        keys.push(b"k");
        let id = ws.add(&keys, token(1), 5);
        assert!(!ws.set_vote(id, 0, Vote::Yes, 3));
        assert!(!ws.set_vote(id, 1, Vote::No(Outcome::NotHeld), 3));
        assert!(!ws.set_vote(id, 2, Vote::No(Outcome::NotHeld), 3));
        assert!(ws.take_lost().is_none());
        // A blind master counts as holding; an asked one too.
        assert!(!ws.set_vote(id, 3, Vote::Blind, 3));
        assert!(ws.set_vote(id, 4, Vote::No(Outcome::NotHeld), 3));
        assert_eq!(ws.take_lost(), Some(id));
        // Lost for good: a later yes does not take it back, and it is reported once.
        assert!(!ws.set_vote(id, 4, Vote::Yes, 3));
        assert!(ws.get(id).unwrap().lost);
        assert!(ws.take_lost().is_none());
    }

    #[test]
    fn a_closed_connection_makes_the_votes_there_unknown_not_lost() {
        let mut ws = Watches::default();
        let mut keys = KeyList::default();
        keys.push(b"a");
        let a = ws.add(&keys, token(1), 3);
        let b = ws.add(&keys, token(2), 3);
        for i in 0..3 {
            ws.set_vote(a, i, Vote::Yes, 2);
            ws.set_vote(b, i, Vote::Yes, 2);
        }
        ws.set_vote(b, 2, Vote::No(Outcome::NotHeld), 2);
        ws.link_lost(0, Fault::Unexpected, 2);
        ws.link_lost(1, Fault::Unexpected, 2);
        assert!(ws.take_lost().is_none(), "a lost connection is no loss");
        assert_eq!(ws.get(a).unwrap().votes[0], Vote::Asked);
        assert_eq!(ws.get(b).unwrap().votes[2], Vote::No(Outcome::NotHeld));
        // The new connections' reads decide.
        ws.set_vote(a, 0, Vote::No(Outcome::NotHeld), 2);
        assert!(ws.set_vote(a, 1, Vote::No(Outcome::NotHeld), 2));
        assert_eq!(ws.take_lost(), Some(a));
        ws.remove(a);
        assert!(ws.get(a).is_none());
        assert_eq!(ws.find_token(&token(2)), Some(b));
        assert_eq!(ws.with_key(Some(b"a")).as_slice(), &[b]);
        assert!(ws.with_key(Some(b"z")).is_empty());
    }

    fn frame(bytes: &[u8]) -> Frame<'_> {
        match resp::parse(bytes, &resp::Limits::default()) {
            Ok(resp::Status::Complete((f, n))) if n == bytes.len() => f,
            other => panic!("{other:?}"),
        }
    }

    fn push_touches(ws: &Watches, bytes: &[u8]) -> SmallVec<[WatchId; 4]> {
        match frame(bytes) {
            Frame::Aggregate(a) => invalidated(&a, ws),
            f => panic!("{f:?}"),
        }
    }

    #[test]
    fn invalidations_name_the_watches_of_their_keys_and_nothing_else() {
        let mut ws = Watches::default();
        let mut ab = KeyList::default();
        ab.push(b"a");
        ab.push(b"b");
        let mut c = KeyList::default();
        c.push(b"c");
        let w1 = ws.add(&ab, token(1), 3);
        let w2 = ws.add(&c, token(2), 3);
        assert_eq!(
            push_touches(
                &ws,
                b">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\nb\r\n$1\r\na\r\n"
            )
            .as_slice(),
            &[w1],
            "one watch, once, for two of its keys"
        );
        let mut all = push_touches(&ws, b">2\r\n$10\r\ninvalidate\r\n_\r\n");
        all.sort_by_key(|w| w.slot);
        assert_eq!(all.as_slice(), &[w1, w2], "a flush touches every watch");
        // Shapes Redis never sends touch nothing (and never panic).
        for hostile in [
            &b">2\r\n$7\r\nmessage\r\n*1\r\n$1\r\na\r\n"[..],
            b">1\r\n$10\r\ninvalidate\r\n",
            b">0\r\n",
            b">2\r\n:1\r\n*1\r\n$1\r\na\r\n",
            b">2\r\n$10\r\ninvalidate\r\n:5\r\n",
            b">2\r\n$10\r\ninvalidate\r\n*2\r\n:1\r\n*0\r\n",
            b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nz\r\n",
        ] {
            assert!(push_touches(&ws, hostile).is_empty(), "{hostile:?}");
        }
    }

    #[test]
    fn a_read_votes_yes_only_when_every_key_holds_the_token() {
        let mut ws = Watches::default();
        let mut ab = KeyList::default();
        ab.push(b"a");
        ab.push(b"b");
        let t = token(1);
        let w = ws.add(&ab, t, 3);
        let watch = ws.get(w).unwrap();
        let tok = std::str::from_utf8(t.as_bytes()).unwrap();
        let both = format!("*2\r\n$32\r\n{tok}\r\n$33\r\n{tok}+\r\n");
        assert_eq!(vote_of(&frame(both.as_bytes()), watch), Vote::Yes);
        let one = format!("*2\r\n$32\r\n{tok}\r\n_\r\n");
        assert_eq!(
            vote_of(&frame(one.as_bytes()), watch),
            Vote::No(Outcome::NotHeld)
        );
        let other = format!("*2\r\n$32\r\n{tok}\r\n$5\r\nother\r\n");
        assert_eq!(
            vote_of(&frame(other.as_bytes()), watch),
            Vote::No(Outcome::NotHeld)
        );
        // Not an answer to MGET of two keys: the master is not counted either way.
        for hostile in [
            &b"-NOPERM no\r\n"[..],
            b"*1\r\n$1\r\na\r\n",
            b"%1\r\n$1\r\na\r\n$1\r\nb\r\n",
            b":1\r\n",
        ] {
            assert_eq!(vote_of(&frame(hostile), watch), Vote::Blind, "{hostile:?}");
        }
    }

    #[test]
    fn a_marked_token_is_held() {
        let t = token(3);
        let mut marked = t.as_bytes().to_vec();
        marked.extend_from_slice(WAITED);
        assert!(holds(t.as_bytes(), &t));
        assert!(holds(&marked, &t));
        assert!(!holds(b"other", &t));
        assert!(!holds(&marked[..marked.len() - 2], &t));
    }
}
