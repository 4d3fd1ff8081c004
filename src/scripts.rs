//! The Lua scripts the lock runs on each master, and their SHA1 digests for `EVALSHA`.
//!
//! All scripts take the lock's keys as `KEYS` and the token as `ARGV[1]`; they are atomic
//! on a master, which is what makes compare-and-delete and compare-and-pexpire safe. With
//! one key, `RELEASE` is the Redis page's `if get == token then del` script.

/// A script and its SHA1 (checked against `SCRIPT LOAD` during every handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// The Lua source.
    pub src: &'static str,
    /// Hex SHA1 of `src`.
    pub sha: &'static str,
}

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

/// Compare-and-pexpire: `ARGV[2]` ms on every key, only when all hold the token.
pub const EXTEND: Script = Script {
    src: concat!(
        "for i = 1, #KEYS do\n",
        "  if redis.call('get', KEYS[i]) ~= ARGV[1] then return 0 end\n",
        "end\n",
        "for i = 1, #KEYS do redis.call('pexpire', KEYS[i], ARGV[2]) end\n",
        "return 1"
    ),
    sha: "243dadbbdd59bc34a3196b4233e9a6954bc7bc66",
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

/// Fenced acquire: the last key is the fencing counter; set every other key only when none
/// exists, then return the incremented counter (0 when taken).
pub const ACQUIRE_FENCED: Script = Script {
    src: concat!(
        "for i = 1, #KEYS - 1 do\n",
        "  if redis.call('exists', KEYS[i]) == 1 then return 0 end\n",
        "end\n",
        "for i = 1, #KEYS - 1 do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end\n",
        "return redis.call('incr', KEYS[#KEYS])"
    ),
    sha: "c4e0a8b8280d6fb3b172ec006310a5d59db95097",
};

/// Fencing write-back: raise the counter `KEYS[1]` to at least `ARGV[1]`.
pub const FENCE_MAX: Script = Script {
    src: concat!(
        "local c = tonumber(redis.call('get', KEYS[1]) or '0')\n",
        "if c < tonumber(ARGV[1]) then redis.call('set', KEYS[1], ARGV[1]) end\n",
        "return 1"
    ),
    sha: "d327ce9e5b56e45f23cd6ef153674428dc198504",
};

/// Every script, in handshake order.
pub const ALL: [Script; 5] = [RELEASE, EXTEND, ACQUIRE_MANY, ACQUIRE_FENCED, FENCE_MAX];

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
