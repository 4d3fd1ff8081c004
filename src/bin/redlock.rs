//! `redlock`: a distributed `flock(1)` over N independent Redis masters, a benchmark, and
//! a status probe. See `redlock --help`.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[path = "redlock/bench.rs"]
mod bench;
#[path = "redlock/child.rs"]
mod child;
#[path = "redlock/common.rs"]
mod common;
#[path = "redlock/conn.rs"]
mod conn;
#[path = "redlock/list.rs"]
mod list;
#[path = "redlock/release.rs"]
mod release;
#[path = "redlock/run.rs"]
mod run;
#[path = "redlock/status.rs"]
mod status;

use common::exit;

/// Parse a duration for any flag: a bare number is seconds, fractions included (`10`,
/// `0.5`: what `flock -w` takes), anything else a `humantime` duration (`30s`, `1m30s`,
/// `1.5s`, `250ms`).
fn duration(s: &str) -> Result<Duration, String> {
    const FORMS: &str = "write seconds (10, 0.5) or a number with a unit (30s, 1m30s, 250ms)";
    let s = s.trim();
    let bare_seconds = {
        let (whole, frac) = s.split_once('.').unwrap_or((s, "0"));
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        digits(whole) && digits(frac)
    };
    // humantime does the arithmetic (exact fractions, overflow) once it has the unit.
    let parsed = if bare_seconds {
        humantime::parse_duration(&format!("{s}s"))
    } else {
        humantime::parse_duration(s)
    };
    parsed.map_err(|e| match e {
        // Its list of units helps; its other messages ("time unit needed, for example
        // 0sec") do not, or point at forms that are no longer needed.
        humantime::DurationError::UnknownUnit { ref unit, .. } if !unit.is_empty() => {
            format!("{e}; {FORMS}")
        }
        humantime::DurationError::NumberOverflow => format!("too large or too precise; {FORMS}"),
        _ => format!("not a duration; {FORMS}"),
    })
}

#[derive(Parser, Debug)]
#[command(
    name = "redlock",
    version,
    about = "Redlock over N independent Redis masters: run a command under a distributed lock, \
             benchmark lock latency, see the locks and force one free.",
    after_help = "Masters are redis://[user:password@]host:port[/db] or host:port, given with \
                  --masters (comma separated, repeatable) or in REDLOCK_MASTERS.\n\
                  Durations are seconds (10, 0.5, as for flock -w) or a number with a unit \
                  (30s, 1m30s, 1.5s, 250ms).\n\
                  Messages go to stderr, prefixed `redlock:`. Usage and configuration errors \
                  exit with 64."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock (a distributed flock for cron jobs and scripts).
    #[command(after_help = run::AFTER_HELP, override_usage = run::USAGE)]
    Run(run::RunArgs),
    /// Measure lock+unlock latency and throughput, and check mutual exclusion.
    #[command(after_help = bench::AFTER_HELP)]
    Bench(bench::BenchArgs),
    /// Show who holds a lock on each master, for how long, who waits in its line.
    #[command(after_help = status::AFTER_HELP)]
    Status(status::StatusArgs),
    /// List the locks on the masters (SCAN, bounded): holder, TTLs, quorum, line, fencing.
    #[command(after_help = list::AFTER_HELP)]
    List(list::ListArgs),
    /// Force a lock free whoever holds it (--force), waking its waiters.
    #[command(after_help = release::AFTER_HELP)]
    Release(release::ReleaseArgs),
    /// `run`'s exec helper (internal): parent-death signal, then exec COMMAND.
    #[command(name = "__exec", hide = true)]
    Exec(child::ExecArgs),
    /// `run`'s watchdog (internal): kills COMMAND's process group if redlock dies.
    #[command(name = "__watchdog", hide = true)]
    Watchdog(child::WatchdogArgs),
}

/// The masters to use, shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct MasterArgs {
    /// Redis masters, comma separated; repeatable. An odd number, 3 or more, each
    /// independent (not replicas of each other).
    // `hide_env_values`: the URLs may hold passwords; `--help` names the variable only.
    #[arg(
        short,
        long = "masters",
        value_name = "URLS",
        env = "REDLOCK_MASTERS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    masters: Vec<String>,
    /// Speak TLS to every TCP master: redis://host:port and host:port are taken as
    /// rediss://host:port (as redis-cli --tls). Unix sockets are left as they are.
    #[arg(long)]
    tls: bool,
    /// rediss:// masters: trust only the CA certificates in this PEM file (default: the
    /// system's trust roots). `--cacert` as for redis-cli.
    #[cfg(feature = "tls")]
    #[arg(
        long,
        visible_alias = "cacert",
        value_name = "PEM",
        env = "REDLOCK_TLS_CA_FILE"
    )]
    tls_ca_file: Option<std::path::PathBuf>,
    /// rediss:// masters: a client certificate (PEM) for mutual TLS; needs --tls-key.
    /// `--cert` as for redis-cli.
    #[cfg(feature = "tls")]
    #[arg(
        long,
        visible_alias = "cert",
        value_name = "PEM",
        env = "REDLOCK_TLS_CERT",
        requires = "tls_key"
    )]
    tls_cert: Option<std::path::PathBuf>,
    /// rediss:// masters: the client certificate's private key (PEM). `--key` as for
    /// redis-cli.
    #[cfg(feature = "tls")]
    #[arg(
        long,
        visible_alias = "key",
        value_name = "PEM",
        env = "REDLOCK_TLS_KEY",
        requires = "tls_cert"
    )]
    tls_key: Option<std::path::PathBuf>,
}

impl MasterArgs {
    /// The CA file and the client certificate and key given.
    #[cfg(feature = "tls")]
    pub fn tls_files(
        &self,
    ) -> (
        Option<&std::path::Path>,
        Option<(&std::path::Path, &std::path::Path)>,
    ) {
        let cert = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            _ => None,
        };
        (self.tls_ca_file.as_deref(), cert)
    }

    /// The builder with the masters and, when built with TLS, the TLS options.
    pub fn builder(&self) -> redlock_mux::Builder {
        self.with_tls(redlock_mux::Redlock::builder().masters(self.urls()))
    }

    /// `b` with the TLS options, when built with TLS.
    #[allow(unused_mut)]
    pub fn with_tls(&self, mut b: redlock_mux::Builder) -> redlock_mux::Builder {
        #[cfg(feature = "tls")]
        {
            if let Some(ca) = &self.tls_ca_file {
                b = b.tls_ca_file(ca);
            }
            if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
                b = b.tls_client_cert(cert, key);
            }
        }
        b
    }

    /// The non-empty master URLs (with `--tls`, the TCP ones as `rediss://`).
    pub fn urls(&self) -> Vec<String> {
        self.masters
            .iter()
            .map(|m| m.trim())
            .filter(|m| !m.is_empty())
            .map(|m| if self.tls { tls_url(m) } else { m.to_string() })
            .collect()
    }
}

/// `--tls`: a TCP master's URL as `rediss://` (`redis://h:p` and `h:p`); any other URL
/// (already `rediss://`, a Unix socket, something unparsable) as it is.
fn tls_url(url: &str) -> String {
    let lower = url.to_ascii_lowercase();
    if let Some(rest) = lower
        .strip_prefix("redis://")
        .map(|_| &url["redis://".len()..])
    {
        format!("rediss://{rest}")
    } else if lower.contains("://") {
        url.to_string()
    } else {
        format!("rediss://{url}")
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` as clap prints them, on stdout.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(exit::OK);
        }
        // Usage errors as every other message: on stderr, prefixed `redlock:`.
        Err(e) => {
            use std::io::Write as _;
            let text = e.render().to_string();
            let _ = write!(std::io::stderr(), "redlock: {text}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let code = match cli.command {
        Command::Run(args) => run::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Status(args) => status::main(args),
        Command::List(args) => list::main(args),
        Command::Release(args) => release::main(args),
        Command::Exec(args) => child::exec_main(args),
        Command::Watchdog(args) => child::watchdog_main(args),
    };
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::duration;
    use std::time::Duration;

    #[test]
    fn tls_urls() {
        use super::tls_url;
        assert_eq!(tls_url("redis://u:p@h:6379/2"), "rediss://u:p@h:6379/2");
        assert_eq!(tls_url("REDIS://h:1"), "rediss://h:1");
        assert_eq!(tls_url("10.0.0.1:6380"), "rediss://10.0.0.1:6380");
        assert_eq!(tls_url("rediss://h:1"), "rediss://h:1");
        assert_eq!(tls_url("unix:///run/r.sock"), "unix:///run/r.sock");
        assert_eq!(
            tls_url("redis+unix:///run/r.sock"),
            "redis+unix:///run/r.sock"
        );
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("0.5"), Ok(ms(500)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("1.25"), Ok(ms(1250)));
        assert_eq!(duration(" 2 "), Ok(ms(2000)));
        assert_eq!(duration("0.000000001"), Ok(Duration::from_nanos(1)));
        assert_eq!(duration("30s"), Ok(ms(30_000)));
        assert_eq!(duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(duration("1.5s"), Ok(ms(1500)));
        assert_eq!(duration("250ms"), Ok(ms(250)));
        for bad in [
            "",
            "10x",
            "-1",
            "1e3",
            ".5",
            "5.",
            "0.5.1",
            "soon",
            "0.0000000001",
        ] {
            let e = duration(bad).expect_err(bad);
            assert!(e.contains("(10, 0.5)") && !e.contains("0sec"), "{bad}: {e}");
        }
        assert!(duration("10x").unwrap_err().contains("supported units"));
    }
}
