//! The Lua scripts the lock runs on each master, and their SHA1 digests for `EVALSHA`.
//!
//! All scripts take the lock's keys as `KEYS` and the token as `ARGV[1]`; they are atomic
//! on a master, which is what makes compare-and-delete and compare-and-pexpire safe. With
//! one key, `RELEASE` is the Redis page's `if get == token then del` script.
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

/// Compare-and-delete every key; returns 1 when all held the token, else 0.
pub const RELEASE: Script = Script {
    src: concat!(
    "local held = 1\n",
    "for i = 1, #KEYS do\n",
    "  if redis.call('get', KEYS[i]) == ARGV[1] then redis.call('del', KEYS[i]) else held = 0 end\n",
    "end\n",
    "return held"
),
    sha: "75d99ece287ed6605a39866a9d57152153f2da2f",
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
pub const ALL: [Script; 5] = [RELEASE, EXTEND, ACQUIRE_MANY, FENCE_DRAW, FENCE_RAISE];

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
