//! Exit codes and message helpers shared by the subcommands.

/// Exit codes. Where one fits, the BSD `sysexits.h` value is used (as `flock(1)` does).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// `run`: the lock is held by someone else (default; `-E` changes it, like `flock -E`).
    /// `status`: some master did not answer.
    pub const CONFLICT: u8 = 1;
    /// `bench`: the mutual-exclusion check failed.
    pub const VIOLATION: u8 = 2;
    /// EX_USAGE: bad arguments or configuration (no masters, bad URL, bad duration...).
    pub const USAGE: u8 = 64;
    /// EX_UNAVAILABLE: no quorum of masters reachable, or `redis-server` missing.
    pub const UNAVAILABLE: u8 = 69;
    /// EX_SOFTWARE: an internal error (a bench thread panicked).
    pub const SOFTWARE: u8 = 70;
    /// EX_OSERR: a local OS error (event loop, random source, signals).
    pub const OSERR: u8 = 71;
    /// EX_TEMPFAIL: `run` lost the lock while the command ran and terminated it
    /// (default; `--lost-exit-code` changes it).
    pub const LOST: u8 = 75;
    /// The command could not be executed (as in shells).
    pub const CANNOT_EXEC: u8 = 126;
    /// The command was not found (as in shells).
    pub const NOT_FOUND: u8 = 127;
    /// 128 + signal number: the command (or redlock itself, before the command started)
    /// was ended by this signal.
    pub fn signal(sig: i32) -> u8 {
        (128 + sig).clamp(0, 255) as u8
    }
}

/// Print a message to stderr, prefixed `redlock:`. Never panics: a write error (stderr a
/// closed pipe, a full disk) is ignored, since a message must never stop redlock from
/// doing what it says (`eprintln!` panics on EPIPE).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "redlock: {}", format_args!($($arg)*));
    }};
}
pub(crate) use say;

/// Print a line to stdout. Never panics (`println!` does when stdout is a closed pipe:
/// `redlock bench | head`); a reader that went away gets nothing more.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use out;

/// [`out!`] without the newline.
macro_rules! out_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use out_part;

/// A duration the way people read it: `950 µs`, `12.3 ms`, `4.50 s`.
pub fn human_duration(d: std::time::Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    human_micros(us)
}

/// Microseconds the way people read them.
pub fn human_micros(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// `12345678` -> `12,345,678`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Warn about masters that are the same server as one listed before them (the same
/// `run_id`: a host name and its address, an alias): the server votes once, so the list
/// promises more fault tolerance than there is. Returns whether it warned.
pub fn warn_same_servers(stats: &[redlock_mux::MasterStats]) -> bool {
    let mut warned = false;
    for s in stats {
        if let Some(k) = s.same_server_as() {
            let first = stats.get(k).map_or("?", |f| f.name());
            say!(
                "warning: master {} is the same server as {first} (same run_id): it votes \
                 once; list each server once ({} masters listed, fewer servers)",
                s.name(),
                stats.len()
            );
            warned = true;
        }
    }
    warned
}

/// Whether a master's outcome is a cluster's refusal of a script whose keys are in several
/// slots.
pub fn cross_slot(o: redlock_mux::Outcome) -> bool {
    matches!(o, redlock_mux::Outcome::Failed(redlock_mux::Fault::Redis(t)) if t.starts_with(b"CROSSSLOT"))
}

/// What a `CROSSSLOT` refusal means, said once.
pub const CROSS_SLOT_HINT: &str = "a cluster master refused a script whose keys hash to several \
slots (CROSSSLOT): this version's scripts for status, release --force, --fencing, \
multi-resource locks and waiting in line touch auxiliary keys (redlock-mux:...) outside the \
lock key's slot; on cluster masters only plain locks work for now";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(12345678), "12,345,678");
        assert_eq!(human_micros(12.4), "12 µs");
        assert_eq!(human_micros(1500.0), "1.50 ms");
        assert_eq!(exit::signal(15), 143);
    }
}
