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

/// Compare-and-delete every key; returns 1 when all held the token, else 0. Every key it
/// deletes is announced on [`RELEASED_PREFIX`]`<key>` with the token's first
/// [`NOTICE_LEN`] bytes (with `pcall`: a user without the right to publish still releases).
pub const RELEASE: Script = Script {
    src: concat!(
        "local held = 1\n",
        "for i = 1, #KEYS do\n",
        "  if redis.call('get', KEYS[i]) == ARGV[1] then\n",
        "    redis.call('del', KEYS[i])\n",
        "    redis.pcall('publish', 'redlock-mux:released:' .. KEYS[i], string.sub(ARGV[1], 1, 16))\n",
        "  else\n",
        "    held = 0\n",
        "  end\n",
        "end\n",
        "return held"
    ),
    sha: "3a02ab0a3dae9fe94e588af984716a5c370f9bbd",
};

/// Compare-and-extend: when every key holds the token, make each key live at least
/// `ARGV[2]` ms from now, never shorter than it already does (a late or failed extend with
/// a shorter TTL can then never cut a lock short); returns 1, else 0.
pub const EXTEND: Script = Script {
    src: concat!(
        "for i = 1, #KEYS do\n",
        "  if redis.call('get', KEYS[i]) ~= ARGV[1] then return 0 end\n",
        "end\n",
        "local ttl = tonumber(ARGV[2])\n",
        "for i = 1, #KEYS do\n",
        "  if redis.call('pttl', KEYS[i]) < ttl then redis.call('pexpire', KEYS[i], ttl) end\n",
        "end\n",
        "return 1"
    ),
    sha: "f792595486921a2d800137f1d9918035081b2ae4",
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
pub const ACQUIRE_WAIT: Script = Script {
    src: concat!(
        "local left = 0\n",
        "for i = 1, #KEYS do\n",
        "  local t = redis.call('pttl', KEYS[i])\n",
        "  if t == -1 then left = -1\n",
        "  elseif t >= 0 and left >= 0 then left = math.max(left, t, 1) end\n",
        "end\n",
        "if left == 0 then\n",
        "  for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end\n",
        "  return 0\n",
        "end\n",
        "if #KEYS > 1 then return left end\n",
        "local v = redis.pcall('get', KEYS[1])\n",
        "if type(v) ~= 'string' then v = '' end\n",
        "return {left, string.sub(v, 1, 16)}"
    ),
    sha: "4d2f51ec63f0d48a5ae9fb0b057c33abade1d7d1",
};

/// Fencing draw (read-only): `KEYS` = the lock's n keys, then their n counters. When every
/// lock key holds the token, returns 1 + the largest counter (absent counts as 0); else 0.
pub const FENCE_DRAW: Script = Script {
    src: concat!(
        "local n = #KEYS / 2\n",
        "for i = 1, n do\n",
        "  if redis.call('get', KEYS[i]) ~= ARGV[1] then return 0 end\n",
        "end\n",
        "local top = 0\n",
        "for i = n + 1, #KEYS do\n",
        "  local c = tonumber(redis.call('get', KEYS[i]) or '0')\n",
        "  if c > top then top = c end\n",
        "end\n",
        "return top + 1"
    ),
    sha: "03b58009bde0f17dd258880c0fcb98d5e41d3e7a",
};

/// Fencing write-back: `KEYS` as [`FENCE_DRAW`]. When every lock key holds the token,
/// raises every counter to at least `ARGV[2]` and returns 1; else 0. Counters only grow.
pub const FENCE_RAISE: Script = Script {
    src: concat!(
        "local n = #KEYS / 2\n",
        "for i = 1, n do\n",
        "  if redis.call('get', KEYS[i]) ~= ARGV[1] then return 0 end\n",
        "end\n",
        "local t = tonumber(ARGV[2])\n",
        "for i = n + 1, #KEYS do\n",
        "  if tonumber(redis.call('get', KEYS[i]) or '0') < t then redis.call('set', KEYS[i], ARGV[2]) end\n",
        "end\n",
        "return 1"
    ),
    sha: "c6fca2d9375ab51887b50606d5e474e52a874884",
};

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
        for s in ALL {
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
