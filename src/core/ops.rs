//! The op table's entries: one fan-out round (acquire, release, extend, fencing draw or
//! write-back of one lock) with its tally, its arguments and its bookkeeping.

use std::time::Instant;

use smallvec::SmallVec;

use crate::rules::{Request, Tally};
use crate::token::Token;

/// A handle to an op: slot index plus generation, so a stale handle never aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OpId {
    pub(super) slot: u32,
    pub(super) gen: u32,
}

/// The arguments of an op, kept so a request can be re-sent with `EVAL`.
#[derive(Clone, Default)]
pub(crate) struct OpArgs {
    pub keys: KeyList,
    pub token: Option<Token>,
    pub ttl_ms: u64,
    /// The fencing value to write back.
    pub value: u64,
    /// An `AcquireWait` of one key: the waiter's place in the key's line.
    pub line: Option<Line>,
    /// A release: the lock's id in its keys' lines, which it leaves.
    pub leave: Option<crate::core::Fingerprint>,
    /// A release of a granted lock (not a failed attempt's cleanup): owed to a master whose
    /// link is down when it starts (the master may hold the key from before its connection
    /// broke). A cleanup is not: where its attempt's request never went out (the link was
    /// down then too), the master holds nothing, and owing it filled the bounded queue of
    /// owed releases with useless ones while waiters retried during a backoff.
    pub of_lock: bool,
    /// An extend that puts back the keys a master lost (`scripts::EXTEND`'s `put`): sent
    /// only to those masters, once an extension reached its quorum without them.
    pub put: bool,
    /// A release of a lock whose keys this client listens on (a waiter of its own waits
    /// on one: it is started right behind the release, `Core::released_here`, and its
    /// refusal likely marked the key): the release must run whole as one request on each
    /// master, ahead of the waiter's attempt (the script), not as `DELIFEQ` and the script
    /// after it (see `encode::delifeq_fits`).
    pub waiters_here: bool,
}

/// A waiter's place in a key's line (see `scripts::QUEUE_PREFIX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Line {
    /// The waiter's id (hex, `scripts::WAITER_ID_LEN` bytes).
    pub id: crate::core::Fingerprint,
    /// How long it stays in line without asking again.
    pub alive_ms: u64,
    /// Its arrival (µs on the client's clock): every master orders the line alike.
    pub score: u64,
    /// It does not take a free key while a live waiter is ahead of it.
    pub polite: bool,
    /// It stands out of line: the attempt leaves the line and takes no place in it (its
    /// last attempt could not reach a quorum; see `Core::start_attempt`).
    pub out: bool,
    /// What the attempt expects to find, which orders the script's commands (never what it
    /// does): see [`Expect`](super::wait::Expect).
    pub expect: super::wait::Expect,
}

impl OpArgs {
    #[cfg(test)]
    pub(crate) fn set<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        token: Token,
        ttl_ms: u64,
    ) {
        self.keys.clear();
        for k in keys {
            self.keys.push(k);
        }
        self.set_rest(token, ttl_ms);
    }

    /// [`OpArgs::set`] with the keys of a list (copied whole: see [`KeyList::assign`]).
    pub(crate) fn set_list(&mut self, keys: &KeyList, token: Token, ttl_ms: u64) {
        self.keys.assign(keys);
        self.set_rest(token, ttl_ms);
    }

    /// Everything but the keys, for a plain round.
    #[inline]
    fn set_rest(&mut self, token: Token, ttl_ms: u64) {
        self.token = Some(token);
        self.ttl_ms = ttl_ms;
        self.line = None;
        self.leave = None;
        self.of_lock = false;
        self.put = false;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpState {
    Free,
    Active,
    Decided,
}

/// One fan-out round.
pub(crate) struct Op {
    pub(super) gen: u32,
    pub(super) state: OpState,
    pub req: Request,
    pub tally: Tally,
    pub started: Instant,
    /// `started` in the rounds' microseconds (for latencies).
    pub(super) started_us: u64,
    pub deadline: Instant,
    pub decided_at: Instant,
    pub args: OpArgs,
    /// The largest integer among the yes answers (the fencing counter).
    pub max_value: i64,
    /// `AcquireWait` rounds: the holder's remaining TTL (ms; -1: none) each master that
    /// said "taken" reported, by master (0: no such answer). `Extend` rounds: 2 where the
    /// master answered that it had lost a key (to be put back once the round has its
    /// quorum), else 0.
    pub left_ms: SmallVec<[i64; 8]>,
    /// `AcquireWait` rounds with one key: who holds it, by master (the fingerprint its
    /// release will publish), where a master said "taken".
    pub holders: SmallVec<[Option<super::Fingerprint>; 8]>,
    /// Operators' rounds (`Request::is_admin`): each master's answer, by master (see
    /// `core::admin`). Empty for every other round.
    pub views: Vec<Option<crate::inspect::View>>,
    /// Replies still owed to this op.
    pub(super) outstanding: u32,
    /// Told when the op is decided; `None`: nobody collects the result (cleanup releases).
    pub(super) owner: Option<super::Owner>,
    pub(super) collected: bool,
    /// Where this op sits in `Rounds::active` while `Active`: removal without a search
    /// (many locks in flight make that list long).
    pub(super) active_at: u32,
}

/// A packed list of byte strings (the lock's keys), inline for the common small case.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyList {
    bytes: KeyBytes,
    ends: SmallVec<[u32; 2]>,
}

impl KeyList {
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
    pub(crate) fn push(&mut self, k: &[u8]) {
        self.bytes.extend(k);
        self.ends.push(self.bytes.len as u32);
    }
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let bytes = self.bytes.as_slice();
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let k = &bytes[start..end as usize];
            start = end as usize;
            k
        })
    }
    /// The inline array of the key bytes and how many of it are used, while they are kept
    /// inline (`None`: spilled).
    #[inline]
    pub(crate) fn inline_bytes(&self) -> Option<(&[u8; INLINE_KEY_BYTES], usize)> {
        self.bytes
            .heap
            .is_empty()
            .then_some((&self.bytes.inline, self.bytes.len))
    }
    #[inline]
    pub(crate) fn assign(&mut self, other: &KeyList) {
        self.bytes.assign(&other.bytes);
        match other.ends.as_slice() {
            // One key (nearly always): the inline list written whole, not cleared and
            // pushed to (a spilled one keeps its storage).
            &[end] if !self.ends.spilled() => {
                self.ends = SmallVec::from_buf_and_len([end, 0], 1);
            }
            ends => {
                self.ends.clear();
                self.ends.extend_from_slice(ends);
            }
        }
    }
}

/// Bytes kept inline up to this many (a lock on keys this short never allocates).
const INLINE_KEY_BYTES: usize = 64;

/// The key bytes of a [`KeyList`]: inline while they fit, else all in `heap` (whose
/// storage is kept across `clear`, like a spilled `SmallVec`). One copy per push, where
/// `SmallVec::extend_from_slice` makes a reserve call and two.
#[derive(Clone)]
struct KeyBytes {
    len: usize,
    inline: [u8; INLINE_KEY_BYTES],
    /// Empty while inline; holds every byte once spilled.
    heap: Vec<u8>,
}

impl Default for KeyBytes {
    fn default() -> Self {
        KeyBytes {
            len: 0,
            inline: [0; INLINE_KEY_BYTES],
            heap: Vec::new(),
        }
    }
}

impl PartialEq for KeyBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for KeyBytes {}

impl KeyBytes {
    fn as_slice(&self) -> &[u8] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
    fn clear(&mut self) {
        self.len = 0;
        self.heap.clear();
    }
    /// `clear` then `extend` with `other`'s bytes: while `other` is inline, its whole
    /// inline array is copied (a fixed size: a few moves, no length-dependent copy).
    fn assign(&mut self, other: &KeyBytes) {
        if other.heap.is_empty() {
            self.heap.clear();
            self.inline = other.inline;
            self.len = other.len;
        } else {
            self.len = 0;
            self.heap.clear();
            self.extend(&other.heap);
        }
    }
    fn extend(&mut self, k: &[u8]) {
        let end = self.len + k.len();
        if self.heap.is_empty() && end <= INLINE_KEY_BYTES {
            self.inline[self.len..end].copy_from_slice(k);
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline[..self.len]);
            }
            self.heap.extend_from_slice(k);
        }
        self.len = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(keys: &[&[u8]]) -> KeyList {
        let mut l = KeyList::default();
        for k in keys {
            l.push(k);
        }
        l
    }

    #[test]
    fn key_list_keeps_every_key_inline_spilled_and_across_the_boundary() {
        let long = vec![b'x'; 100];
        let cases: Vec<Vec<Vec<u8>>> = vec![
            vec![],
            vec![b"a".to_vec()],
            vec![b"".to_vec(), b"b".to_vec()],
            vec![vec![b'k'; 64]],
            vec![vec![b'k'; 64], b"".to_vec()],
            vec![vec![b'k'; 60], b"12345".to_vec(), b"z".to_vec()],
            vec![long.clone()],
            vec![b"a".to_vec(), long.clone(), b"b".to_vec()],
        ];
        for case in &cases {
            let refs: Vec<&[u8]> = case.iter().map(|k| &k[..]).collect();
            let mut l = list(&refs);
            assert_eq!(l.iter().collect::<Vec<_>>(), refs, "{case:?}");
            assert_eq!(l.len(), refs.len());
            let mut copy = KeyList::default();
            copy.assign(&l);
            assert!(copy == l);
            assert!(l.clone() == l);
            // Reused after clear (a spilled list keeps its heap storage): still exact.
            l.clear();
            assert_eq!(l.len(), 0);
            l.push(b"again");
            assert_eq!(l.iter().collect::<Vec<_>>(), vec![&b"again"[..]]);
            assert!(l != copy || refs == [&b"again"[..]]);
        }
        assert!(list(&[b"ab", b"c"]) != list(&[b"a", b"bc"]));
    }
}
