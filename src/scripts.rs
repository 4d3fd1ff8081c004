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

/// Every script, in handshake order.
pub const ALL: [Script; 3] = [RELEASE, EXTEND, ACQUIRE_MANY];

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
