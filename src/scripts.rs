//! The Lua scripts the lock runs on each master, and their SHA1 digests for `EVALSHA`.
//!
//! All scripts take the lock's keys as `KEYS` and the token as `ARGV[1]`; they are atomic
//! on a master, which is what makes compare-and-delete and compare-and-pexpire safe. With
//! one key, `RELEASE` is the Redis page's `if get == token then del` script, plus a
//! `PUBLISH` that wakes the waiters of the key ([`RELEASED_PREFIX`]).
//!
//! **All of a lock key's keys live in its cluster slot, and every key a script touches is
//! one of its `KEYS`, but for one:** beside lock key `K` a master may keep its line of
//! waiters, their liveness and its fencing counter ([`aux_key`]): the fencing counter is
//! `redlock-mux:{T}:fence:K` (`T` is [`crate::slot::tag_of`]`(K)`, three bytes whose hash
//! is `K`'s slot, so the name's hash tag puts it in `K`'s slot whatever `K` is, braces
//! included); the line and liveness set are `redlock-mux:{K}:queue` and `...:alive` when
//! `K` has no `}` ([`lines_named_by_key`]: the hash tag is `K` itself), else named with `T`
//! like the counter. The client builds these names where it encodes the requests and
//! declares them: a Redis or Valkey Cluster then accepts every script (no key of another
//! slot), and so does a server that refuses undeclared keys (Dragonfly). The exception is
//! [`RELEASE_LEAN`], the release of a lock that left no line (nearly every release): it
//! takes the lock keys alone and names their lines itself when a waiter marked the key, so
//! that a master's work per uncontended release is the Redis page's compare-and-delete;
//! a cluster accepts those names (same slot), a server that refuses undeclared keys
//! refuses the line's commands (`pcall`: the key is still released, its waiters retry on
//! their timer). A multi-key script's keys are all in one slot only when
//! the lock's keys are (on a cluster, grouping them by slot is the caller's work); on
//! standalone masters any keys go in one script.
//!
//! **On Valkey 9, [`RELEASE_LEAN`] of one key mostly does not run.** A master whose
//! handshake reports `valkey_version` 9 or later is sent `DELIFEQ key token` for the
//! release of a granted one-key lock that took no place in a line and that no waiter of
//! the same client waits for (`core::encode::delifeq_fits`); only when that answers
//! 0 (the key is not exactly the token: gone, someone else's, or marked by a waiter,
//! [`WAITED`]) or an error does [`RELEASE_LEAN`] follow on that master, to delete a marked
//! key and announce it. Every other request keeps its script: a marked value and
//! [`EXTEND`]'s "never shorter" are not one command. Redis 8.4's `DELEX key IFEQ value` is
//! not used (not tested against). See `docs/production.md`, "Releases without Lua".
//!
//! **Every script starts with a `#!lua` shebang**, so that a cluster server itself refuses
//! any cross-slot access (the read-only scripts carry `flags=no-writes`; the releases and
//! the extension `flags=allow-oom`, so that a master out of memory still lets a lock go or
//! keep its key, as the plain `DEL` and `PEXPIRE` they run would). Shebangs need Redis 7.0
//! or later (Valkey 7.2 or later). **A Redis 6 master is refused** at the handshake: its
//! `SCRIPT LOAD` fails to compile the first line, and the handshake reports that the
//! master needs Redis 7 (`core::link`). Redis 6 is past its end of life, and keeping the
//! sources without the shebang too would mean a second SHA1 per script chosen per
//! connection, for a server whose scripts could still reach undeclared keys.
//!
//! **Fencing continuity across the change of layout.** Before it, a resource `r`'s
//! counter was `redlock-mux:fence:<r>` ([`OLD_FENCE_PREFIX`], in another slot). On
//! standalone masters the fencing scripts take that old counter too, as one more declared
//! key per resource: the draw reads both, and the write-back raises the new counter to at
//! least the old one (and the token) and deletes the old one, so that a token drawn after
//! the upgrade is above every token drawn before it, and the old counters disappear with
//! the first fenced lock of each resource. (A cluster never ran the old fencing: it was
//! always `CROSSSLOT` there, so a cluster master's caller leaves the old counters out.)
//! Clients of both layouts must not fence the same resources at once: an old client
//! would draw from the old counter only. Mutual exclusion never depended on the layout
//! (the lock key is the same).

/// A script and its SHA1 (checked against `SCRIPT LOAD` during every handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// The Lua source.
    pub src: &'static str,
    /// Hex SHA1 of `src`.
    pub sha: &'static str,
}

/// The fencing counter of resource `r` before the keys moved into their lock key's slot:
/// `redlock-mux:fence:<r>`. Read, raised past and deleted by the fencing scripts on
/// standalone masters (see the module's doc: fencing continuity).
pub const OLD_FENCE_PREFIX: &[u8] = b"redlock-mux:fence:";

/// The kind of key of a resource's line of waiters ([`aux_key`]): a sorted set of waiter
/// ids scored by their arrival (the client's clock, so that every master orders them
/// alike). Kept by [`ACQUIRE_WAIT`], read by [`RELEASE`] to name the next waiter.
pub const QUEUE: &[u8] = b"queue";

/// The kind of key of the liveness of a resource's waiters ([`aux_key`]): a sorted set of
/// the same waiter ids as the line, each scored by the moment (the master's own clock,
/// `TIME`, in ms) until which it is alive: set at each of its refused attempts to now plus
/// the time until its next one. A waiter that stops asking drops out of line once that
/// moment has passed. The line and this set hold the same waiters (a waiter enters and
/// leaves both in one script) and their expiry is set together, to their longest-lived
/// waiter's (an attempt only ever lengthens it, to its own liveness): they expire as a
/// whole when nobody asks any more. (Server time in a script that writes is safe with
/// effects replication, the only kind Redis 7 has.)
pub const ALIVE: &[u8] = b"alive";

// `aux_key` tells the fencing counter from the lines by its first byte.
const _: () = assert!(
    QUEUE.len() == ALIVE.len()
        && QUEUE.len() == FENCE.len()
        && QUEUE[0] != FENCE[0]
        && ALIVE[0] != FENCE[0]
);

/// The kind of key of a resource's fencing counter ([`aux_key`]): `redlock-mux:{T}:fence:<r>`,
/// no TTL, only ever raised.
pub const FENCE: &[u8] = b"fence";

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

/// Lock names starting with this are refused: the fencing counters, the lines of waiters
/// and their liveness live under it.
pub const RESERVED_PREFIX: &[u8] = b"redlock-mux:";

/// Bytes of a waiter id in the line ([`QUEUE`]) and in a release's announcement: the
/// first [`CLIENT_ID_LEN`] name the waiter's client, the rest the waiting lock call.
pub const WAITER_ID_LEN: usize = 16;

/// Bytes of a client's id (the start of its waiters' ids).
pub const CLIENT_ID_LEN: usize = 8;

/// A client's channel: `redlock-mux:next:<client id>` carries the announcements of the
/// releases that make it the turn of one of its waiters (the first in line), so that a
/// release wakes that waiter's client only, not every client with a waiter.
pub const NEXT_PREFIX: &[u8] = b"redlock-mux:next:";

/// Whether the line and liveness set of lock key `key` are named after the key itself,
/// `redlock-mux:{<key>}:<kind>` ([`aux_key`]), so that a script given the lock key alone
/// can name them ([`RELEASE_LEAN`]): when `key` is not empty and has no `}`. The name's
/// hash tag is then `key` whole, and `key` has no hash tag of its own (a tag needs a `}`),
/// so both hash to `key`'s slot.
pub const fn lines_named_by_key(key: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    let mut i = 0;
    while i < key.len() {
        if key[i] == b'}' {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether [`aux_key`]`(kind, key)` is named after the key itself (see there).
const fn by_key(kind: &[u8], key: &[u8]) -> bool {
    // Not the fencing counter (`FENCE`: its name stays where fencing continuity expects
    // it); the kinds are all five bytes, `f` is the fence's alone.
    !(kind.len() == FENCE.len() && kind[0] == FENCE[0]) && lines_named_by_key(key)
}

/// Length of [`aux_key`]`(kind, key)`.
pub const fn aux_key_len(kind: &[u8], key: &[u8]) -> usize {
    if by_key(kind, key) {
        // "redlock-mux:" "{" key "}" ":" kind
        RESERVED_PREFIX.len() + 1 + key.len() + 2 + kind.len()
    } else {
        // "redlock-mux:" "{TAG}" ":" kind ":" key
        RESERVED_PREFIX.len() + 5 + 1 + kind.len() + 1 + key.len()
    }
}

/// Append the name of the key of `kind` ([`QUEUE`], [`ALIVE`], [`FENCE`]) kept beside lock
/// key `key` (see [`aux_key`]), whose slot's tag is `tag` (`crate::slot::tag_of(key)`,
/// computed once per request by the caller; unused for a line named by its key).
pub fn push_aux_key(out: &mut Vec<u8>, kind: &[u8], tag: &[u8; 3], key: &[u8]) {
    if by_key(kind, key) {
        out.extend_from_slice(b"redlock-mux:{");
        out.extend_from_slice(key);
        out.extend_from_slice(b"}:");
        out.extend_from_slice(kind);
        return;
    }
    let head = [
        b'r', b'e', b'd', b'l', b'o', b'c', b'k', b'-', b'm', b'u', b'x', b':', b'{', tag[0],
        tag[1], tag[2], b'}', b':',
    ];
    out.extend_from_slice(&head);
    out.extend_from_slice(kind);
    out.push(b':');
    out.extend_from_slice(key);
}

/// The name of the key of `kind` kept beside lock key `key`, in `key`'s cluster slot:
/// a line ([`QUEUE`]) or liveness set ([`ALIVE`]) of a key without `}` is
/// `redlock-mux:{<key>}:<kind>` ([`lines_named_by_key`]: a release given the lock key alone
/// names them, [`RELEASE_LEAN`]); any other is `redlock-mux:{T}:<kind>:<key>` with `T` =
/// [`crate::slot::tag_of`]`(key)`, three bytes whose hash is `key`'s slot (braces in `key`
/// included). The two forms never name the same key: the first has one `}`, followed by
/// `:queue` or `:alive` and nothing else; the second's `}` is followed by `:<kind>:`.
pub fn aux_key(kind: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(aux_key_len(kind, key));
    push_aux_key(&mut out, kind, crate::slot::tag_of(key), key);
    out
}

/// The end of [`RELEASE`] and [`RELEASE_LEAN`] (Lua, one source): a marked key `k` was
/// deleted; its line `q` and liveness set `a` name the first live waiter (dead ones on the
/// way leave both), announced on its client's channel, else the key's channel hears it.
macro_rules! announce_release {
    () => {
        concat!(
            "    local turn\n",
            "    for _ = 1, 8 do\n",
            "      local r = redis.pcall('zrange', q, 0, 0)\n",
            "      local h = type(r) == 'table' and r[1]\n",
            "      if not h then break end\n",
            "      if not now then local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000) end\n",
            "      local d = tonumber(redis.pcall('zscore', a, h))\n",
            "      if d and d >= now then\n",
            "        turn = h\n",
            "        break\n",
            "      end\n",
            "      redis.pcall('zrem', q, h)\n",
            "      redis.pcall('zrem', a, h)\n",
            "    end\n",
            "    local note = string.sub(ARGV[1], 1, 16)\n",
            "    if turn then\n",
            "      redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)\n",
            "    else\n",
            "      redis.pcall('publish', 'redlock-mux:released:' .. k, note)\n",
            "    end\n",
            "  else\n",
            "    held = 0\n",
            "  end\n",
            "end\n",
            "return held"
        )
    };
}

/// Compare-and-delete every key: `KEYS` = the lock's n keys, then their n lines
/// ([`QUEUE`]), then their n liveness sets ([`ALIVE`]); returns 1 when all held the token,
/// else 0. A key holds the token when its value is the token, or the token and [`WAITED`]
/// (a waiter was refused while it was held: see [`ACQUIRE_WAIT`]). Only such a key's
/// release looks for waiters and announces itself (an uncontended release runs `GET` and
/// `DEL`, nothing more), with the token's first [`NOTICE_LEN`] bytes: to the first live
/// waiter in the key's line if there is one (the waiter whose turn it is; waiters found
/// dead at the head on the way leave the line and the liveness set), on its client's
/// channel [`NEXT_PREFIX`]`<first 8 bytes of its id>` with its id after the fingerprint;
/// else to every waiter, on [`RELEASED_PREFIX`]`<key>` (with `pcall` throughout: a user
/// without the right to publish still releases; the lines and liveness sets being
/// declared keys, an ACL user needs the right to them, `~redlock-mux:*`, as to the lock's
/// own keys: the server checks every declared key before it runs a script). `ARGV[2]`, if given, is
/// the releasing lock's id in the keys' lines: it leaves them and their liveness sets (a
/// lock that waited, at its release or its last cleanup; whether or not it still held the
/// key) where it may stand in them, that is wherever the key does not hold the unmarked
/// token: a waiter in a key's line that wins the key sets it marked ([`ACQUIRE_WAIT`]), so
/// an unmarked key held with the token was won where no line existed, and the lock never
/// stood in one there (the lines of waiters expire as a whole, with their longest-lived
/// waiter). An uncontended `lock()` therefore releases with the same `GET` and `DEL` as
/// the compare-and-delete, nothing more; a contended one with `GET`, `ZREM` (line and
/// liveness), `DEL`, `ZRANGE`, `TIME`, `ZSCORE` and `PUBLISH`.
pub const RELEASE: Script = Script {
    src: concat!(
        "#!lua flags=allow-oom\n",
        "local n = #KEYS / 3\n",
        "local held = 1\n",
        "local now\n",
        "for i = 1, n do\n",
        "  local k, q, a = KEYS[i], KEYS[n + i], KEYS[2 * n + i]\n",
        "  local v = redis.call('get', k)\n",
        "  if ARGV[2] and v ~= ARGV[1] then\n",
        "    redis.pcall('zrem', q, ARGV[2])\n",
        "    redis.pcall('zrem', a, ARGV[2])\n",
        "  end\n",
        "  if v == ARGV[1] then\n",
        "    redis.call('del', k)\n",
        "  elseif v == ARGV[1] .. '+' then\n",
        "    redis.call('del', k)\n",
        announce_release!()
    ),
    sha: "b9b3d670a9d1db84805c4728751c1382090b4caa",
};

/// [`RELEASE`] given the lock keys alone: `KEYS` = the lock's keys, each
/// [`lines_named_by_key`], `ARGV[1]` the token, nothing else. What a release sends when it
/// leaves no line (no `ARGV[2]`), that is every release of a lock that did not wait: a
/// master's work per uncontended release is then the Redis page's (one declared key, one
/// argument, `GET` and `DEL`), where [`RELEASE`]'s two more declared keys cost it about
/// 0.45 µs more per release (`scripts/server-cost.py`). A marked key's release names the
/// key's line and liveness set itself (`redlock-mux:{<key>}:queue`, `...:alive`) and does
/// what [`RELEASE`] does. Those names are not declared: they hash to the key's slot, which
/// a cluster accepts from a `#!lua` script; a server that refuses undeclared keys
/// (Dragonfly without `--default_lua_flags=allow-undeclared-keys`) refuses the line's
/// commands, which run under `pcall`: the key is still released, and its waiters try
/// again at their timed retry instead of being woken.
pub const RELEASE_LEAN: Script = Script {
    src: concat!(
        "#!lua flags=allow-oom\n",
        "local held = 1\n",
        "local now\n",
        "for i = 1, #KEYS do\n",
        "  local k = KEYS[i]\n",
        "  local v = redis.call('get', k)\n",
        "  if v == ARGV[1] then\n",
        "    redis.call('del', k)\n",
        "  elseif v == ARGV[1] .. '+' then\n",
        "    redis.call('del', k)\n",
        "    local q, a = 'redlock-mux:{' .. k .. '}:queue', 'redlock-mux:{' .. k .. '}:alive'\n",
        announce_release!()
    ),
    sha: "56ba9b235833d594f3a4e33cf3b1a3cebb776dcf",
};

/// The compare-and-delete alone: each key deleted where it holds the token, marked
/// ([`WAITED`]) or not; answers 1 when every key did, else 0. What a release falls back to
/// where the full [`RELEASE`] is refused for the keys it declares beside the lock keys: an
/// ACL user without the right to `redlock-mux:*` (`-NOPERM`: the lock is still released,
/// as before the line's keys were declared), or a cluster slot being migrated (`-TRYAGAIN`:
/// a script's keys not all on one side of the migration). Nobody is announced: the waiters
/// try at their timed retry. Sent with `EVAL` (rare: not loaded by the handshake).
pub const RELEASE_PLAIN: Script = Script {
    src: concat!(
        "#!lua flags=allow-oom\n",
        "local held = 1\n",
        "for i = 1, #KEYS do\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if v == ARGV[1] or v == ARGV[1] .. '+' then\n",
        "    redis.call('del', KEYS[i])\n",
        "  else\n",
        "    held = 0\n",
        "  end\n",
        "end\n",
        "return held",
    ),
    sha: "17dd915a2c5fbeafe665b2b147bf6c500f90ab02",
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
        "#!lua flags=allow-oom\n",
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
    sha: "ed7028c0c24869890f579f9d1b1b70efa504b977",
};

/// All-or-nothing multi-key acquire: set every key (`PX ARGV[2]`) only when none exists.
pub const ACQUIRE_MANY: Script = Script {
    src: concat!(
        "#!lua\n",
        "for i = 1, #KEYS do\n",
        "  if redis.call('exists', KEYS[i]) == 1 then return 0 end\n",
        "end\n",
        "for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end\n",
        "return 1"
    ),
    sha: "9d860f90fc4540f804c98f19c465c815b2eae554",
};

/// The acquire of a lock that waits (`lock`, `lock_with_deadline`, `lock_many`): set every
/// key (`PX ARGV[2]`) only when none exists, and answer 0; else answer how long the holder
/// still has: the largest `PTTL` of the keys that exist (at least 1, or -1 when one of them
/// never expires), and with one key, who holds it: `{pttl, the first 16 bytes of its
/// value}` (the fingerprint its release will publish). The waiter never sleeps past the
/// holder's expiry, and knows which announcement frees this master.
///
/// With one key, `KEYS` = that key alone, or with `ARGV[3..7]` the key, its line
/// ([`QUEUE`]) and its liveness set ([`ALIVE`]); with several keys, `KEYS` = the lock's
/// keys and no `ARGV[3]`.
///
/// `ARGV[3..6]` (waiter id, how long it stays in line without asking again in ms, `p` for
/// polite or empty, its arrival score): a refused waiter takes its place in the key's line
/// (keeping its place if it has one) and its liveness set; it leaves them with its release
/// ([`RELEASE`]'s `ARGV[2]`), not at the grant on one master (the attempt may fail
/// elsewhere, and its place must stay the same on every master). A polite waiter does not
/// take a free key while another live waiter comes first in line: it is refused with
/// `{-1, ''}` (and keeps its place), and the key being free, it tells that first waiter it
/// is its turn ([`NEXT_PREFIX`], its token's first 16 bytes and the waiter's id, as a
/// release does): the masters' lines may disagree on who is first (a waiter that won a
/// master before a line existed there is not in that line), and the one first on a quorum,
/// asleep until its retry delay, would otherwise hear from nobody while the others yield
/// to it (the simulation's soak: live_hot_fair_without_faults seed 3810). With `ARGV[7]` =
/// `o` the waiter stands out of line (its last attempt could not reach a quorum): it leaves
/// the line and takes no place in it, and a polite one still yields to every live waiter
/// in line. Otherwise `ARGV[7]` says which answer the client expects, so that the script
/// runs the fewest commands on that path (what it does and answers never depends on it):
/// `h` (held: this client waited on the key lately) reads the key first, and a refused
/// waiter then needs no `EXISTS` of the line and no failing `SET NX` (not for a polite
/// waiter, which looks at the line first); `l` (the waiter stands in line: one of its
/// attempts was refused) looks for its own place with `ZRANK` first, which also says that
/// the line exists and spares the `ZADD NX`. Absent (a first attempt), `EXISTS` of the
/// line and `SET NX`, as an uncontended `lock()` needs. (Differences on invalid arguments
/// only, which the client never sends: with `h` and the key held, a `PX` that `SET` would
/// refuse is not looked at.)
/// Every attempt of a waiter refreshes its liveness (`ZADD` of `TIME` plus its liveness to
/// the set) and the line's expiry, the ones that take the key too: a waiter whose attempt
/// wins here but fails the round (a split vote, a timeout elsewhere) is still asking and
/// keeps its place. One that wins a master where a line exists takes its place there too
/// (a waiter refused on the others and missing here made the lines disagree: each master
/// named another first waiter, each refused the other's polite attempts, and nobody was
/// woken until a timed retry; found by the simulation's soak, live_hot_fair_without_faults
/// seed 3810). The line's and the liveness set's expiry is only ever moved later (to this
/// waiter's liveness when that is longer than what the line has left), never earlier: a
/// waiter with a short liveness (short retry delay) must not expire a line in which a
/// waiter with a long one is still alive and asking (issue 19, item 3).
///
/// A waiter refused by a key held with one of this crate's tokens marks it
/// ([`WAITED`]: the one-key waiter that stands in a line, and every waiter on several
/// keys, which listens on the keys' channels), and a grant while the key's line exists
/// sets the key marked: only a marked key's release looks for waiters and announces
/// itself, so an uncontended release costs the master no more than the Redis page's
/// compare-and-delete.
pub const ACQUIRE_WAIT: Script = Script {
    src: concat!(
        "#!lua\n",
        "local function mark(k)\n",
        "  local v = redis.pcall('get', k)\n",
        "  if type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then\n",
        "    redis.pcall('append', k, '+')\n",
        "  end\n",
        "  return v\n",
        "end\n",
        "if ARGV[3] or #KEYS == 1 then\n",
        "  local id = ARGV[3]\n",
        "  local q, a = KEYS[2], KEYS[3]\n",
        "  local how = ARGV[7]\n",
        "  local out = how == 'o'\n",
        "  if id and out then\n",
        "    redis.pcall('zrem', q, id)\n",
        "    redis.pcall('zrem', a, id)\n",
        "  end\n",
        "  local now\n",
        "  local function clock()\n",
        "    if not now then local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000) end\n",
        "    return now\n",
        "  end\n",
        "  local function keep()\n",
        "    if redis.pcall('pttl', q) < tonumber(ARGV[4]) then\n",
        "      redis.pcall('pexpire', q, ARGV[4])\n",
        "      redis.pcall('pexpire', a, ARGV[4])\n",
        "    end\n",
        "  end\n",
        "  local function alive()\n",
        "    redis.pcall('zadd', a, clock() + tonumber(ARGV[4]), id)\n",
        "  end\n",
        "  local v, inq = false, false\n",
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
        "        local d = tonumber(redis.pcall('zscore', a, h))\n",
        "        if d and d >= clock() then\n",
        "          behind = true if redis.pcall('exists', KEYS[1]) == 0 then redis.pcall('publish', 'redlock-mux:next:' .. string.sub(h, 1, 8), string.sub(ARGV[1], 1, 16) .. h) end\n",
        "          break\n",
        "        end\n",
        "        redis.pcall('zrem', q, h)\n",
        "        redis.pcall('zrem', a, h)\n",
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
        "    alive()\n",
        "    keep()\n",
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
    sha: "32e8cfc9481b108c7dc35ecb606ef0ceb5591d9c",
};

/// Fencing draw (read-only): `KEYS` = the lock's n keys, then their n counters ([`FENCE`]),
/// then (standalone masters) their n old counters ([`OLD_FENCE_PREFIX`]); `ARGV[2]` = n.
/// When every lock key holds the token, returns 1 + the largest counter, old or new
/// (absent counts as 0); else 0.
pub const FENCE_DRAW: Script = Script {
    src: concat!(
        "#!lua flags=no-writes\n",
        "local n = tonumber(ARGV[2])\n",
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
    sha: "a8fc0792161c2f4fe7b946ab5fa0fd0cd3c33892",
};

/// Fencing write-back: `KEYS` as [`FENCE_DRAW`], `ARGV[2]` the token drawn, `ARGV[3]` = n.
/// When every lock key holds the token, raises every counter to at least `ARGV[2]` and
/// its resource's old counter where there is one (which it then deletes: the new counter
/// carries it on) and returns 1; else 0. Counters only grow.
pub const FENCE_RAISE: Script = Script {
    src: concat!(
        "#!lua\n",
        "local n = tonumber(ARGV[3])\n",
        "for i = 1, n do\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end\n",
        "end\n",
        "for i = 1, n do\n",
        "  local t, s = tonumber(ARGV[2]), ARGV[2]\n",
        "  local old = KEYS[2 * n + i]\n",
        "  if old then\n",
        "    local o = redis.call('get', old)\n",
        "    if o then\n",
        "      if tonumber(o) > t then t, s = tonumber(o), o end\n",
        "      redis.call('del', old)\n",
        "    end\n",
        "  end\n",
        "  if tonumber(redis.call('get', KEYS[n + i]) or '0') < t then redis.call('set', KEYS[n + i], s) end\n",
        "end\n",
        "return 1"
    ),
    sha: "b68ba8a3681130f32a805302ebe6fe55b9003ced",
};

/// Read-only: what a master holds for resource `KEYS[1]` (`KEYS[2]` its line, [`QUEUE`],
/// `KEYS[3]` its liveness set, [`ALIVE`], `KEYS[4]` its fencing counter, [`FENCE`], and on
/// standalone masters `KEYS[5]` its old counter, [`OLD_FENCE_PREFIX`]), for
/// `Redlock::inspect` and `redlock status` / `redlock list`. `ARGV[1]`: how many waiters
/// of the line to name. Answers `{kind, holder, lock, marked, pttl, waiters, ids, alive,
/// counter}`: `kind` is `none`, `string` or `other` (a key of another type); `holder` the
/// value's first [`NOTICE_LEN`] bytes (the fingerprint a release publishes; never the whole
/// token, which is the capability to release); `lock` 1 when the value is one of this
/// crate's tokens (32 lowercase hex digits, and [`WAITED`] or not), `marked` 1 when it
/// carries the mark; `pttl` the key's `PTTL`; `waiters` the line's length, `ids` the first
/// `ARGV[1]` waiter ids in line and `alive` whether each is still alive (its moment in the
/// liveness set not passed); `counter` the fencing counter (the old one while there is no
/// new one; empty when there is none). Nothing is written.
pub const INSPECT: Script = Script {
    src: concat!(
        "#!lua flags=no-writes\n",
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
        "  local t = redis.call('time')\n",
        "  local now = t[1] * 1000 + math.floor(t[2] / 1000)\n",
        "  for i = 1, #ids do\n",
        "    local d = tonumber(redis.pcall('zscore', KEYS[3], ids[i]))\n",
        "    if d and d >= now then alive[i] = 1 else alive[i] = 0 end\n",
        "  end\n",
        "end\n",
        "local f = redis.pcall('get', KEYS[4])\n",
        "if type(f) ~= 'string' and KEYS[5] then f = redis.pcall('get', KEYS[5]) end\n",
        "if type(f) ~= 'string' then f = '' end\n",
        "return {kind, string.sub(v, 1, 16), lock, marked, redis.call('pttl', KEYS[1]), n, ids, alive, f}"
    ),
    sha: "05be400f4678bf1877f2ddc3cce40852724f9e4b",
};

/// An operator's forced release of resource `KEYS[1]` (`KEYS[2]` its line, `KEYS[3]` its
/// liveness set): delete the key whatever its value (a lock whose holder is gone, or must
/// go), and announce it as [`RELEASE`] announces a marked key's release, with the value's
/// first [`NOTICE_LEN`] bytes: to the first live waiter in line on its client's channel,
/// else on the key's channel, so that the waiters try at once. A key of another type is an
/// error (nothing is deleted). Answers `{holder, pttl, turn}`: the deleted value's first
/// [`NOTICE_LEN`] bytes (empty when there was no key), the `PTTL` it had (-2: none), the id
/// of the waiter named (empty: the key's channel, or nothing deleted).
pub const FORCE_RELEASE: Script = Script {
    src: concat!(
        "#!lua flags=allow-oom\n",
        "local v = redis.call('get', KEYS[1])\n",
        "if not v then return {'', -2, ''} end\n",
        "local left = redis.call('pttl', KEYS[1])\n",
        "redis.call('del', KEYS[1])\n",
        "local note = string.sub(v, 1, 16)\n",
        "local turn = ''\n",
        "local now\n",
        "for _ = 1, 8 do\n",
        "  local r = redis.pcall('zrange', KEYS[2], 0, 0)\n",
        "  local h = type(r) == 'table' and r[1]\n",
        "  if not h then break end\n",
        "  if not now then local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000) end\n",
        "  local d = tonumber(redis.pcall('zscore', KEYS[3], h))\n",
        "  if d and d >= now then\n",
        "    turn = h\n",
        "    break\n",
        "  end\n",
        "  redis.pcall('zrem', KEYS[2], h)\n",
        "  redis.pcall('zrem', KEYS[3], h)\n",
        "end\n",
        "if turn ~= '' and #note == 16 then\n",
        "  redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)\n",
        "else\n",
        "  turn = ''\n",
        "  redis.pcall('publish', 'redlock-mux:released:' .. KEYS[1], note)\n",
        "end\n",
        "return {note, left, turn}"
    ),
    sha: "8697580246d287ed6fe0c6041a7c6ddf731bec98",
};

/// The operators' scripts ([`INSPECT`], [`FORCE_RELEASE`]). Not loaded by the handshake:
/// a lock client never runs them. They are sent with `EVALSHA`, and with `EVAL` after a
/// `-NOSCRIPT` (which caches them on that master).
pub const ADMIN: [Script; 2] = [INSPECT, FORCE_RELEASE];

/// Every script, in handshake order.
pub const ALL: [Script; 7] = [
    RELEASE,
    EXTEND,
    ACQUIRE_MANY,
    FENCE_DRAW,
    FENCE_RAISE,
    ACQUIRE_WAIT,
    RELEASE_LEAN,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    #[test]
    fn digests_match_sources() {
        for s in ALL.iter().chain(ADMIN.iter()).chain([&RELEASE_PLAIN]) {
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
