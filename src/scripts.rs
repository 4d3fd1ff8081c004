//! The Lua scripts the lock runs on each master, and their SHA1 digests for `EVALSHA`.
//!
//! All scripts take the lock's keys as `KEYS` and the token as `ARGV[1]`; they are atomic
//! on a master, which is what makes compare-and-delete and compare-and-pexpire safe. With
//! one key, `RELEASE` is the Redis page's `if get == token then del` script, plus a
//! `PUBLISH` that wakes the waiters of the key ([`RELEASED_PREFIX`]).
//!
//! The fencing scripts take the lock's keys followed by as many counter keys (one per
//! resource, [`FENCE_PREFIX`] + resource), and act only while every lock key still holds
//! the token: a token is drawn and written back only by the lock's holder.

/// A script and its SHA1 (checked against `SCRIPT LOAD` during every handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// The Lua source.
    pub src: &'static str,
    /// Hex SHA1 of `src`.
    pub sha: &'static str,
}

/// The namespace of the fencing counters: resource `r`'s counter is the key
/// `redlock-mux:fence:<r>`. Lock names starting with it are refused, so a lock key and a
/// counter never share a name.
pub const FENCE_PREFIX: &[u8] = b"redlock-mux:fence:";

/// The channel a release announces itself on: releasing resource `r` publishes on
/// `redlock-mux:released:<r>` on every master where it deleted the key, so that waiting
/// clients try again at once instead of after their retry delay. (Channels are a namespace
/// of their own, shared by every database of a server: a waiter on database 1 may be woken
/// by a release on database 0, which only costs it an early attempt.)
pub const RELEASED_PREFIX: &[u8] = b"redlock-mux:released:";

/// Bytes of the token a release publishes: its first 16 hex digits. They name the release
/// (a waiter ignores the copies the other masters send of one it already acted on) and are
/// no capability: releasing or extending takes the whole token.
pub const NOTICE_LEN: usize = 16;

/// The line of waiters of resource `r` on a master: `redlock-mux:queue:<r>`, a sorted set of
/// waiter ids scored by their arrival (the client's clock, so that every master orders
/// them alike), expiring with its longest-lived waiter (an attempt only ever lengthens the
/// line's TTL, to its own liveness). Kept by [`ACQUIRE_WAIT`], read by
/// [`RELEASE`] to name the next waiter. A waiter in line is alive while its key
/// [`WAITER_PREFIX`]`<id>` lives (set at each of its refused attempts, with the time until
/// its next one): a waiter that stops asking drops out of line.
pub const QUEUE_PREFIX: &[u8] = b"redlock-mux:queue:";
/// See [`QUEUE_PREFIX`].
pub const WAITER_PREFIX: &[u8] = b"redlock-mux:waiter:";

/// Lock names starting with this are refused: the fencing counters, the lines of waiters
/// and their keys live under it.
pub const RESERVED_PREFIX: &[u8] = b"redlock-mux:";

/// Bytes of a waiter id in the line ([`QUEUE_PREFIX`]) and in a release's announcement: the
/// first [`CLIENT_ID_LEN`] name the waiter's client, the rest the waiting lock call.
pub const WAITER_ID_LEN: usize = 16;

/// Bytes of a client's id (the start of its waiters' ids).
pub const CLIENT_ID_LEN: usize = 8;

/// A client's channel: `redlock-mux:next:<client id>` carries the announcements of the
/// releases that make it the turn of one of its waiters (the first in line), so that a
/// release wakes that waiter's client only, not every client with a waiter.
pub const NEXT_PREFIX: &[u8] = b"redlock-mux:next:";

/// Compare-and-delete every key; returns 1 when all held the token, else 0. A key holds
/// the token when its value is the token, or the token and [`WAITED`] (a waiter was
/// refused while it was held: see [`ACQUIRE_WAIT`]). Only such a key's release looks for
/// waiters and announces itself (an uncontended release runs `GET` and `DEL`, nothing
/// more), with the token's first [`NOTICE_LEN`] bytes: to the first live waiter in the
/// key's line if there is one (the waiter whose turn it is), on its client's channel
/// [`NEXT_PREFIX`]`<first 8 bytes of its id>` with its id after the fingerprint; else to
/// every waiter, on [`RELEASED_PREFIX`]`<key>` (with `pcall` throughout: a user without the
/// right to publish or to the line still releases). `ARGV[2]`, if given, is the releasing
/// lock's id in the keys' lines: it leaves them (a lock that waited, at its release or its
/// last cleanup; whether or not it still held the key) where it may stand in them, that is
/// wherever the key does not hold the unmarked token: a waiter in a key's line that wins
/// the key sets it marked ([`ACQUIRE_WAIT`]), so an unmarked key held with the token was
/// won where no line existed, and the lock never stood in one there (the lines of waiters
/// expire as a whole, with their longest-lived waiter). Its liveness key
/// ([`WAITER_PREFIX`]`<id>`) is left to expire: no line names it any more, and a lock call's
/// id is never used again, so deleting it would only cost the master a command per contended
/// release. An uncontended `lock()` therefore releases with the same `GET` and `DEL` as the
/// compare-and-delete, nothing more; a contended one with `GET`, `ZREM`, `DEL`, `ZRANGE`,
/// `EXISTS` and `PUBLISH`.
pub const RELEASE: Script = Script {
    src: concat!(
        "local held = 1\n",
        "for i = 1, #KEYS do\n",
        "  local q = 'redlock-mux:queue:' .. KEYS[i]\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if ARGV[2] and v ~= ARGV[1] then\n",
        "    redis.pcall('zrem', q, ARGV[2])\n",
        "  end\n",
        "  if v == ARGV[1] then\n",
        "    redis.call('del', KEYS[i])\n",
        "  elseif v == ARGV[1] .. '+' then\n",
        "    redis.call('del', KEYS[i])\n",
        "    local turn\n",
        "    for _ = 1, 8 do\n",
        "      local r = redis.pcall('zrange', q, 0, 0)\n",
        "      local h = type(r) == 'table' and r[1]\n",
        "      if not h then break end\n",
        "      if redis.pcall('exists', 'redlock-mux:waiter:' .. h) == 1 then\n",
        "        turn = h\n",
        "        break\n",
        "      end\n",
        "      redis.pcall('zrem', q, h)\n",
        "    end\n",
        "    local note = string.sub(ARGV[1], 1, 16)\n",
        "    if turn then\n",
        "      redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)\n",
        "    else\n",
        "      redis.pcall('publish', 'redlock-mux:released:' .. KEYS[i], note)\n",
        "    end\n",
        "  else\n",
        "    held = 0\n",
        "  end\n",
        "end\n",
        "return held"
    ),
    sha: "135d170f8c306908611ebc0d06e429c22c0e59d4",
};

/// The mark a refused waiter appends to the value of a key held with one of this crate's
/// tokens (32 lowercase hex digits): somebody waits, the release must look for them. The
/// holder's token still names it (every script compares the value with the token, marked
/// or not); a value that is not one of our tokens (another application's key) is never
/// touched.
pub const WAITED: &[u8] = b"+";

/// Compare-and-extend: when every key holds the token, make each key live at least
/// `ARGV[2]` ms from now, never shorter than it already does (a late or failed extend with
/// a shorter TTL can then never cut a lock short); returns 1. When every key holds the
/// token or is missing (the master lost it: restarted without persistence, deleted by
/// hand), it extends the others and returns 2: the client counts that master as *not*
/// holding the lock in this round. Once the extension has its quorum from the masters that
/// did hold it, the client sends the same extend with `ARGV[3]` = `put` to the masters that
/// answered 2, which sets the missing keys with the token for `ARGV[2]` ms (still only
/// where no key is someone else's): a lock held on a quorum does not erode one master at a
/// time, and a lock broken on a quorum (`force_release`) is never put back. Else 0.
pub const EXTEND: Script = Script {
    src: concat!(
        "local gone = false\n",
        "for i = 1, #KEYS do\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if not v then gone = true\n",
        "  elseif v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end\n",
        "end\n",
        "local ttl = tonumber(ARGV[2])\n",
        "for i = 1, #KEYS do\n",
        "  local left = redis.call('pttl', KEYS[i])\n",
        "  if left == -2 then\n",
        "    if ARGV[3] == 'put' then redis.call('set', KEYS[i], ARGV[1], 'PX', ttl) end\n",
        "  elseif left < ttl then redis.call('pexpire', KEYS[i], ttl) end\n",
        "end\n",
        "if gone then return 2 end\n",
        "return 1"
    ),
    sha: "dfdcff0460af9a0bf9b3eda53622411ff35f9fc5",
};

/// All-or-nothing multi-key acquire: set every key (`PX ARGV[2]`) only when none exists.
pub const ACQUIRE_MANY: Script = Script {
    src: concat!(
        "for i = 1, #KEYS do\n",
        "  if redis.call('exists', KEYS[i]) == 1 then return 0 end\n",
        "end\n",
        "for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end\n",
        "return 1"
    ),
    sha: "9354dcfccee51ca201cd5006613aa659e4837198",
};

/// The acquire of a lock that waits (`lock`, `lock_with_deadline`, `lock_many`): set every
/// key (`PX ARGV[2]`) only when none exists, and answer 0; else answer how long the holder
/// still has: the largest `PTTL` of the keys that exist (at least 1, or -1 when one of them
/// never expires), and with one key, who holds it: `{pttl, the first 16 bytes of its
/// value}` (the fingerprint its release will publish). The waiter never sleeps past the
/// holder's expiry, and knows which announcement frees this master.
///
/// With one key and `ARGV[3..6]` (waiter id, how long it stays in line without asking
/// again in ms, `p` for polite or empty, its arrival score): a refused waiter takes its
/// place in the key's line ([`QUEUE_PREFIX`], keeping its place if it has one); it leaves
/// the line with its release ([`RELEASE`]'s `ARGV[2]`), not at the grant on one master
/// (the attempt may fail elsewhere, and its place must stay the same on every master). A
/// polite waiter does not take a free key while another live waiter comes first in line:
/// it is refused with `{-1, ''}` (and keeps its place), and the key being free, it tells
/// that first waiter it is its turn ([`NEXT_PREFIX`], its token's first 16 bytes and the
/// waiter's id, as a release does): the masters' lines may disagree on who is first (a
/// waiter that won a master before a line existed there is not in that line), and the one
/// first on a quorum, asleep until its retry delay, would otherwise hear from nobody while
/// the others yield to it (the simulation's soak: live_hot_fair_without_faults seed 3810). With `ARGV[7]` = `o` the waiter
/// stands out of line (its last attempt could not reach a quorum): it leaves the line and
/// takes no place in it, and a polite one still yields to every live waiter in line.
/// Otherwise `ARGV[7]` says which answer the client expects, so that the script runs the
/// fewest commands on that path (what it does and answers never depends on it): `h` (held:
/// this client waited on the key lately) reads the key first, and a refused waiter then
/// needs no `EXISTS` of the line and no failing `SET NX` (not for a polite waiter, which
/// looks at the line first); `l` (the waiter stands in line: one of its attempts was
/// refused) looks for its own place with `ZRANK` first, which also says that the line
/// exists and spares the `ZADD NX`, and refreshes its liveness key with `PEXPIRE` (a
/// `SET` only when that key is gone). Absent (a first attempt), `EXISTS` of the line and
/// `SET NX`, as an uncontended `lock()` needs. (Differences on invalid arguments only,
/// which the client never sends: with `h` and the key held, a `PX` that `SET` would refuse
/// is not looked at; with `l`, a liveness of 0 ms or less deletes a live waiter's key
/// instead of being refused.)
/// Every attempt of a waiter refreshes its liveness key and the line's expiry, the ones
/// that take the key too: a waiter whose attempt wins here but fails the round (a split
/// vote, a timeout elsewhere) is still asking and keeps its place. One that wins a master
/// where a line exists takes its place there too (a waiter refused on the others and
/// missing here made the lines disagree: each master named another first waiter, each
/// refused the other's polite attempts, and nobody was woken until a timed retry; found by
/// the simulation's soak, live_hot_fair_without_faults seed 3810). The
/// line's expiry is only ever moved later (to this waiter's liveness when that is longer
/// than what the line has left), never earlier: a waiter with a short liveness (short
/// retry delay) must not expire a line in which a waiter with a long one is still alive
/// and asking (issue 19, item 3).
///
/// A waiter refused by a key held with one of this crate's tokens marks it
/// ([`WAITED`]: the one-key waiter that stands in a line, and every waiter on several
/// keys, which listens on the keys' channels), and a grant while the key's line exists
/// sets the key marked: only a marked key's release looks for waiters and announces
/// itself, so an uncontended release costs the master no more than the Redis page's
/// compare-and-delete.
pub const ACQUIRE_WAIT: Script = Script {
    src: concat!(
        "local function mark(k)\n",
        "  local v = redis.pcall('get', k)\n",
        "  if type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then\n",
        "    redis.pcall('append', k, '+')\n",
        "  end\n",
        "  return v\n",
        "end\n",
        "if #KEYS == 1 then\n",
        "  local id = ARGV[3]\n",
        "  local q = 'redlock-mux:queue:' .. KEYS[1]\n",
        "  local how = ARGV[7]\n",
        "  local out = how == 'o'\n",
        "  if id and out then\n",
        "    redis.pcall('zrem', q, id)\n",
        "    redis.pcall('del', 'redlock-mux:waiter:' .. id)\n",
        "  end\n",
        "  local function keep()\n",
        "    if redis.pcall('pttl', q) < tonumber(ARGV[4]) then redis.pcall('pexpire', q, ARGV[4]) end\n",
        "  end\n",
        "  local v, inq = false, false\n",
        "  local function alive()\n",
        "    local w = 'redlock-mux:waiter:' .. id\n",
        "    if not (inq and redis.pcall('pexpire', w, ARGV[4]) == 1) then redis.pcall('set', w, '1', 'PX', ARGV[4]) end\n",
        "  end\n",
        "  if how == 'h' and ARGV[5] ~= 'p' then v = redis.pcall('get', KEYS[1]) end\n",
        "  if not v then\n",
        "    if id and how == 'l' then inq = type(redis.pcall('zrank', q, id)) == 'number' end\n",
        "    local lined = inq or (id and redis.pcall('exists', q) == 1)\n",
        "    local behind = false\n",
        "    if lined and ARGV[5] == 'p' then\n",
        "      for _ = 1, 8 do\n",
        "        local r = redis.pcall('zrange', q, 0, 0)\n",
        "        local h = type(r) == 'table' and r[1]\n",
        "        if not h or h == id then break end\n",
        "        if redis.pcall('exists', 'redlock-mux:waiter:' .. h) == 1 then\n",
        "          behind = true if redis.pcall('exists', KEYS[1]) == 0 then redis.pcall('publish', 'redlock-mux:next:' .. string.sub(h, 1, 8), string.sub(ARGV[1], 1, 16) .. h) end\n",
        "          break\n",
        "        end\n",
        "        redis.pcall('zrem', q, h)\n",
        "      end\n",
        "    end\n",
        "    local val = ARGV[1]\n",
        "    if lined then val = val .. '+' end\n",
        "    if not behind and redis.call('set', KEYS[1], val, 'NX', 'PX', ARGV[2]) then\n",
        "      if lined and not out then\n",
        "        if not inq then redis.pcall('zadd', q, 'NX', ARGV[6], id) end\n",
        "        alive()\n",
        "        keep()\n",
        "      end\n",
        "      return 0\n",
        "    end\n",
        "  end\n",
        "  if id and not out then\n",
        "    if not inq then redis.pcall('zadd', q, 'NX', ARGV[6], id) end\n",
        "    keep()\n",
        "    alive()\n",
        "  end\n",
        "  local left = redis.call('pttl', KEYS[1])\n",
        "  if left == -2 then left = -1 elseif left == 0 then left = 1 end\n",
        "  if not v then\n",
        "    if id then v = mark(KEYS[1]) else v = redis.pcall('get', KEYS[1]) end\n",
        "  elseif id and type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then\n",
        "    redis.pcall('append', KEYS[1], '+')\n",
        "  end\n",
        "  if type(v) ~= 'string' then v = '' end\n",
        "  return {left, string.sub(v, 1, 16)}\n",
        "end\n",
        "local left = 0\n",
        "for i = 1, #KEYS do\n",
        "  local t = redis.call('pttl', KEYS[i])\n",
        "  if t == -1 then left = -1\n",
        "  elseif t >= 0 and left >= 0 then left = math.max(left, t, 1) end\n",
        "end\n",
        "if left ~= 0 then\n",
        "  for i = 1, #KEYS do mark(KEYS[i]) end\n",
        "  return left\n",
        "end\n",
        "for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end\n",
        "return 0"
    ),
    sha: "4ef795f7f5f557aecaf4d9137c6047c309ced2f6",
};

/// Fencing draw (read-only): `KEYS` = the lock's n keys, then their n counters. When every
/// lock key holds the token, returns 1 + the largest counter (absent counts as 0); else 0.
pub const FENCE_DRAW: Script = Script {
    src: concat!(
        "local n = #KEYS / 2\n",
        "for i = 1, n do\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end\n",
        "end\n",
        "local top = 0\n",
        "for i = n + 1, #KEYS do\n",
        "  local c = tonumber(redis.call('get', KEYS[i]) or '0')\n",
        "  if c > top then top = c end\n",
        "end\n",
        "return top + 1"
    ),
    sha: "275d0d082734ba1863507f86af15bf83ef7087fa",
};

/// Fencing write-back: `KEYS` as [`FENCE_DRAW`]. When every lock key holds the token,
/// raises every counter to at least `ARGV[2]` and returns 1; else 0. Counters only grow.
pub const FENCE_RAISE: Script = Script {
    src: concat!(
        "local n = #KEYS / 2\n",
        "for i = 1, n do\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end\n",
        "end\n",
        "local t = tonumber(ARGV[2])\n",
        "for i = n + 1, #KEYS do\n",
        "  if tonumber(redis.call('get', KEYS[i]) or '0') < t then redis.call('set', KEYS[i], ARGV[2]) end\n",
        "end\n",
        "return 1"
    ),
    sha: "5ed1e2804f79de9ac51a20bca4f325c19326fa85",
};

/// Read-only: what a master holds for resource `KEYS[1]` (`KEYS[2]` its line,
/// [`QUEUE_PREFIX`]`<r>`, `KEYS[3]` its fencing counter, [`FENCE_PREFIX`]`<r>`), for
/// `Redlock::inspect` and `redlock status` / `redlock list`. `ARGV[1]`: how many waiters
/// of the line to name. Answers `{kind, holder, lock, marked, pttl, waiters, ids, alive,
/// counter}`: `kind` is `none`, `string` or `other` (a key of another type); `holder` the
/// value's first [`NOTICE_LEN`] bytes (the fingerprint a release publishes; never the whole
/// token, which is the capability to release); `lock` 1 when the value is one of this
/// crate's tokens (32 lowercase hex digits, and [`WAITED`] or not), `marked` 1 when it
/// carries the mark; `pttl` the key's `PTTL`; `waiters` the line's length, `ids` the first
/// `ARGV[1]` waiter ids in line and `alive` whether each still has its liveness key
/// ([`WAITER_PREFIX`]); `counter` the fencing counter (empty when there is none). Nothing
/// is written.
pub const INSPECT: Script = Script {
    src: concat!(
        "local v = redis.pcall('get', KEYS[1])\n",
        "local kind = 'string'\n",
        "if not v then kind = 'none' v = ''\n",
        "elseif type(v) ~= 'string' then kind = 'other' v = '' end\n",
        "local lock, marked = 0, 0\n",
        "local body = v\n",
        "if #v == 33 and string.sub(v, 33) == '+' then body = string.sub(v, 1, 32) marked = 1 end\n",
        "if #body == 32 and not string.find(body, '[^0-9a-f]') then lock = 1 else marked = 0 end\n",
        "local n = redis.pcall('zcard', KEYS[2])\n",
        "local ids, alive = {}, {}\n",
        "if type(n) ~= 'number' then n = 0 end\n",
        "if n > 0 then\n",
        "  ids = redis.call('zrange', KEYS[2], 0, tonumber(ARGV[1]) - 1)\n",
        "  for i = 1, #ids do\n",
        "    alive[i] = redis.call('exists', 'redlock-mux:waiter:' .. ids[i])\n",
        "  end\n",
        "end\n",
        "local f = redis.pcall('get', KEYS[3])\n",
        "if type(f) ~= 'string' then f = '' end\n",
        "return {kind, string.sub(v, 1, 16), lock, marked, redis.call('pttl', KEYS[1]), n, ids, alive, f}"
    ),
    sha: "f458f167f546dd741e60622c2969f6e402a175a3",
};

/// An operator's forced release of resource `KEYS[1]` (`KEYS[2]` its line): delete the key
/// whatever its value (a lock whose holder is gone, or must go), and announce it as
/// [`RELEASE`] announces a marked key's release, with the value's first [`NOTICE_LEN`]
/// bytes: to the first live waiter in line on its client's channel, else on the key's
/// channel, so that the waiters try at once. A key of another type is an error (nothing is
/// deleted). Answers `{holder, pttl, turn}`: the deleted value's first [`NOTICE_LEN`] bytes
/// (empty when there was no key), the `PTTL` it had (-2: none), the id of the waiter named
/// (empty: the key's channel, or nothing deleted).
pub const FORCE_RELEASE: Script = Script {
    src: concat!(
        "local v = redis.call('get', KEYS[1])\n",
        "if not v then return {'', -2, ''} end\n",
        "local left = redis.call('pttl', KEYS[1])\n",
        "redis.call('del', KEYS[1])\n",
        "local note = string.sub(v, 1, 16)\n",
        "local turn = ''\n",
        "for _ = 1, 8 do\n",
        "  local r = redis.pcall('zrange', KEYS[2], 0, 0)\n",
        "  local h = type(r) == 'table' and r[1]\n",
        "  if not h then break end\n",
        "  if redis.pcall('exists', 'redlock-mux:waiter:' .. h) == 1 then\n",
        "    turn = h\n",
        "    break\n",
        "  end\n",
        "  redis.pcall('zrem', KEYS[2], h)\n",
        "end\n",
        "if turn ~= '' and #note == 16 then\n",
        "  redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)\n",
        "else\n",
        "  turn = ''\n",
        "  redis.pcall('publish', 'redlock-mux:released:' .. KEYS[1], note)\n",
        "end\n",
        "return {note, left, turn}"
    ),
    sha: "bc7b24083c25819c13160f6c7b031add115635ff",
};

/// The operators' scripts ([`INSPECT`], [`FORCE_RELEASE`]). Not loaded by the handshake:
/// a lock client never runs them. They are sent with `EVALSHA`, and with `EVAL` after a
/// `-NOSCRIPT` (which caches them on that master).
pub const ADMIN: [Script; 2] = [INSPECT, FORCE_RELEASE];

/// Every script, in handshake order.
pub const ALL: [Script; 6] = [
    RELEASE,
    EXTEND,
    ACQUIRE_MANY,
    FENCE_DRAW,
    FENCE_RAISE,
    ACQUIRE_WAIT,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    #[test]
    fn digests_match_sources() {
        for s in ALL.iter().chain(ADMIN.iter()) {
            let mut child = Command::new("sha1sum")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("sha1sum (coreutils) is needed for this test");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(s.src.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            let hex = String::from_utf8(out.stdout).unwrap();
            assert_eq!(&hex[..40], s.sha, "stale SHA1 for:\n{}", s.src);
        }
    }
}
