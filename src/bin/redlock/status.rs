//! `redlock status`: per master, is it reachable, who holds the key, for how long.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mux::resp::{self, Arg, Frame, Limits, Status};
use redlock_mux::{Endpoint, MasterSpec};

use crate::common::{exit, human_duration, say, short_token};
use crate::{duration, MasterArgs};

pub const AFTER_HELP: &str = "\
Asks every master, in parallel, for the lock's key (GET) and its time to live (PTTL),
authenticating with the URL's user and password and selecting its database.
Tokens are shown shortened: a whole token is the capability to release the lock.
Durations are seconds (0.5) or a number with a unit (500ms). Output to a closed pipe
(`redlock status R | head -1`) stops quietly.

Exit status:
  0    every master answered (whether or not the lock is held)
  1    some master did not answer (down, refused, timed out) or answered an error
       (wrong password, for instance)
  64   usage or configuration error
  71   the output could not be written (a full disk, say; not a closed pipe)";

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// How long each master may take to connect and answer.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = duration)]
    timeout: Duration,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// The lock's name (the Redis key).
    #[arg(value_name = "RESOURCE")]
    resource: String,
}

/// What one master said about the key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// The key holds this token, expiring in this many ms (`None`: no expiry set).
    Held(Vec<u8>, Option<u64>),
    /// No such key.
    Free,
    /// Could not connect, or timed out.
    Unreachable(String),
    /// Answered with an error (authentication, for instance).
    Failed(String),
}

impl State {
    fn answered(&self) -> bool {
        matches!(self, State::Held(..) | State::Free)
    }
}

pub fn main(args: StatusArgs) -> u8 {
    let urls = args.masters.urls();
    if urls.is_empty() {
        say!("no masters: pass --masters URLS or set REDLOCK_MASTERS");
        return exit::USAGE;
    }
    let mut specs = Vec::with_capacity(urls.len());
    for url in &urls {
        match MasterSpec::parse(url) {
            Ok(s) => specs.push(s),
            Err(e) => {
                say!("bad configuration: {e}");
                return exit::USAGE;
            }
        }
    }
    let tls = match tls_setup(&args.masters, &specs) {
        Ok(t) => t,
        Err(e) => {
            say!("bad configuration: {e}");
            return exit::USAGE;
        }
    };
    let tls = &tls;
    let key = args.resource.as_bytes();
    let states: Vec<State> = std::thread::scope(|s| {
        let probes: Vec<_> = specs
            .iter()
            .map(|spec| s.spawn(move || probe(spec, key, args.timeout, tls)))
            .collect();
        probes
            .into_iter()
            .map(|p| {
                p.join()
                    .unwrap_or_else(|_| State::Unreachable("probe panicked".into()))
            })
            .collect()
    });
    let quorum = specs.len() / 2 + 1;
    let verdict = verdict(&states, quorum);
    // Written whole, then flushed; never with `println!`, which panics when stdout fails
    // (`redlock status | head -1`: EPIPE once head is gone).
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = if args.json {
        print_json(&mut out, &args.resource, &specs, &states, quorum, &verdict)
    } else {
        print_table(&mut out, &args.resource, &specs, &states, quorum, &verdict)
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        // Whoever reads stopped reading: nothing to say, and nobody to say it to.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            say!("cannot write the status: {e}");
            return exit::OSERR;
        }
    }
    if states.iter().all(State::answered) {
        exit::OK
    } else {
        exit::CONFLICT
    }
}

/// The token held on the most masters, and on how many.
fn verdict(states: &[State], quorum: usize) -> (Option<Vec<u8>>, usize, String) {
    let mut best: Option<(&[u8], usize)> = None;
    for s in states {
        if let State::Held(t, _) = s {
            let n = states
                .iter()
                .filter(|x| matches!(x, State::Held(u, _) if u == t))
                .count();
            if best.is_none_or(|(_, m)| n > m) {
                best = Some((t, n));
            }
        }
    }
    let reachable = states.iter().filter(|s| s.answered()).count();
    let total = states.len();
    // Keys of the holder with no expiry: never a lock of this client's (its keys always
    // have a TTL), and they stay until someone deletes them.
    let forever = |t: &[u8]| {
        states
            .iter()
            .filter(|x| matches!(x, State::Held(u, None) if u == t))
            .count()
    };
    let no_expiry = |k: usize| {
        format!(
            "; its key has no expiry on {k} master{} (not a lock this client makes: it stays \
             until deleted, e.g. redis-cli DEL)",
            if k == 1 { "" } else { "s" }
        )
    };
    match best {
        Some((t, n)) if n >= quorum => (
            Some(t.to_vec()),
            n,
            format!(
                "locked: held by {} on {n} of {total} masters (quorum {quorum}){}",
                short_token(t),
                match forever(t) {
                    0 => String::new(),
                    k => no_expiry(k),
                }
            ),
        ),
        Some((t, n)) => (
            Some(t.to_vec()),
            n,
            format!(
                "not locked by a quorum: {} holds {n} of {total} masters (quorum {quorum}){}",
                short_token(t),
                match forever(t) {
                    0 => "; such leftovers expire with their TTL".to_string(),
                    k => no_expiry(k),
                }
            ),
        ),
        None if reachable >= quorum => (
            None,
            0,
            format!("free: no key on the {reachable} of {total} masters that answered"),
        ),
        None => (
            None,
            0,
            format!(
                "unknown: only {reachable} of {total} masters answered (quorum {quorum}), \
                 and none holds the key"
            ),
        ),
    }
}

fn print_table(
    out: &mut impl Write,
    resource: &str,
    specs: &[MasterSpec],
    states: &[State],
    quorum: usize,
    verdict: &(Option<Vec<u8>>, usize, String),
) -> io::Result<()> {
    writeln!(
        out,
        "{resource} on {} masters (quorum {quorum}):",
        specs.len()
    )?;
    let width = specs
        .iter()
        .map(|s| s.to_string().len())
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        out,
        "  {:<width$}  {:<11}  {:<10}  PTTL",
        "MASTER", "STATE", "HOLDER"
    )?;
    for (spec, state) in specs.iter().zip(states) {
        let name = spec.to_string();
        match state {
            State::Held(t, pttl) => writeln!(
                out,
                "  {name:<width$}  {:<11}  {:<10}  {}",
                "held",
                short_token(t),
                pttl.map_or_else(
                    || "no expiry".to_string(),
                    |ms| humantime::format_duration(Duration::from_millis(ms)).to_string()
                )
            )?,
            State::Free => writeln!(out, "  {name:<width$}  {:<11}  {:<10}  -", "free", "-")?,
            State::Unreachable(why) => {
                writeln!(out, "  {name:<width$}  {:<11}  {why}", "unreachable")?
            }
            State::Failed(why) => writeln!(out, "  {name:<width$}  {:<11}  {why}", "error")?,
        }
    }
    writeln!(out, "{}", verdict.2)
}

fn print_json(
    out: &mut impl Write,
    resource: &str,
    specs: &[MasterSpec],
    states: &[State],
    quorum: usize,
    verdict: &(Option<Vec<u8>>, usize, String),
) -> io::Result<()> {
    let masters: Vec<serde_json::Value> = specs
        .iter()
        .zip(states)
        .map(|(spec, state)| match state {
            State::Held(t, pttl) => serde_json::json!({
                "master": spec.to_string(),
                "reachable": true,
                "held": true,
                "holder": short_token(t),
                "pttl_ms": pttl,
            }),
            State::Free => serde_json::json!({
                "master": spec.to_string(),
                "reachable": true,
                "held": false,
            }),
            State::Unreachable(why) => serde_json::json!({
                "master": spec.to_string(),
                "reachable": false,
                "error": why,
            }),
            State::Failed(why) => serde_json::json!({
                "master": spec.to_string(),
                "reachable": true,
                "error": why,
            }),
        })
        .collect();
    let report = serde_json::json!({
        "resource": resource,
        "quorum": quorum,
        "locked": verdict.1 >= quorum,
        "holder": verdict.0.as_deref().map(short_token),
        "holder_masters": verdict.1,
        "summary": verdict.2,
        "masters": masters,
    });
    writeln!(out, "{report}")
}

/// Connect, authenticate, select the database, then `GET key` and `PTTL key`, pipelined.
fn probe(spec: &MasterSpec, key: &[u8], timeout: Duration, tls: &Tls) -> State {
    match probe_io(spec, key, timeout, tls) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
            State::Unreachable(format!("no answer within {}", human_duration(timeout)))
        }
        Err(e) => State::Unreachable(e.to_string()),
    }
}

/// The rustls configuration for `rediss://` masters (the library's own code).
#[cfg(feature = "tls")]
#[path = "../../driver/tls_config.rs"]
mod tls_config;

/// TLS for the probes: the client configuration, made once.
#[cfg(feature = "tls")]
pub type Tls = Option<std::sync::Arc<rustls::ClientConfig>>;
#[cfg(not(feature = "tls"))]
pub type Tls = Option<()>;

/// A blocking connection to a master: TCP, TLS over TCP, or a Unix socket.
enum Conn {
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
    Unix(UnixStream),
}

impl Conn {
    fn open(spec: &MasterSpec, timeout: Duration, tls: &Tls) -> io::Result<Conn> {
        match &spec.endpoint {
            Endpoint::Tcp { host, .. } => {
                let addr = spec
                    .resolve()
                    .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
                let stream = TcpStream::connect_timeout(&addr, timeout)?;
                stream.set_nodelay(true)?;
                if !spec.tls {
                    return Ok(Conn::Tcp(stream));
                }
                #[cfg(feature = "tls")]
                if let Some(config) = tls {
                    let name = rustls::pki_types::ServerName::try_from(host.clone())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    let conn = rustls::ClientConnection::new(config.clone(), name)
                        .map_err(io::Error::other)?;
                    return Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(conn, stream))));
                }
                let _ = (host, tls);
                Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "rediss:// (TLS) needs redlock built with the `tls` feature",
                ))
            }
            Endpoint::Unix(path) => UnixStream::connect(path)
                .map(Conn::Unix)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }

    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s
                .set_read_timeout(Some(t))
                .and(s.set_write_timeout(Some(t))),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => {
                let s = &s.sock;
                s.set_read_timeout(Some(t))
                    .and(s.set_write_timeout(Some(t)))
            }
            Conn::Unix(s) => s
                .set_read_timeout(Some(t))
                .and(s.set_write_timeout(Some(t))),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            #[cfg(feature = "tls")]
            Conn::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
}

fn probe_io(spec: &MasterSpec, key: &[u8], timeout: Duration, tls: &Tls) -> io::Result<State> {
    let deadline = Instant::now() + timeout;
    let mut stream = Conn::open(spec, timeout, tls)?;
    let mut out = Vec::with_capacity(128);
    let mut setup = 0usize;
    match (&spec.user, &spec.password) {
        (Some(u), Some(p)) => {
            resp::encode_command(
                &mut out,
                &[Arg::from("AUTH"), u.as_str().into(), p.as_str().into()],
            );
            setup += 1;
        }
        (None, Some(p)) => {
            resp::encode_command(&mut out, &[Arg::from("AUTH"), p.as_str().into()]);
            setup += 1;
        }
        _ => {}
    }
    if spec.db != 0 {
        resp::encode_command(&mut out, &[Arg::from("SELECT"), Arg::Uint(spec.db.into())]);
        setup += 1;
    }
    resp::encode_command(&mut out, &[Arg::from("GET"), Arg::Bytes(key)]);
    resp::encode_command(&mut out, &[Arg::from("PTTL"), Arg::Bytes(key)]);
    stream.set_timeouts(remaining(deadline)?)?;
    stream.write_all(&out)?;
    stream.flush()?;

    let limits = Limits::default();
    let mut buf: Vec<u8> = Vec::with_capacity(512);
    let mut start = 0;
    let mut token: Option<Vec<u8>> = None;
    let mut pttl: i64 = -2;
    for reply in 0..setup + 2 {
        // Read until one whole frame is buffered.
        let (frame, used) = loop {
            match resp::parse(&buf[start..], &limits) {
                Ok(Status::Complete((f, n))) => break (f, n),
                Ok(Status::Partial(_)) => {}
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad reply: {e:?}"),
                    ))
                }
            }
            stream.set_timeouts(remaining(deadline)?)?;
            let mut chunk = [0u8; 512];
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed by the master",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        if let Frame::Error(e) | Frame::BulkError(e) = frame {
            return Ok(State::Failed(String::from_utf8_lossy(e).into_owned()));
        }
        match (reply.checked_sub(setup), frame) {
            // A holder's token, with the mark of a refused waiter or without
            // (`scripts::WAITED`): the same holder on every master.
            (Some(0), Frame::Bulk(t)) => {
                let t = match t.strip_suffix(redlock_mux::scripts::WAITED) {
                    Some(token) if token.len() == 32 => token,
                    _ => t,
                };
                token = Some(t.to_vec())
            }
            (Some(1), Frame::Integer(ms)) => pttl = ms,
            _ => {}
        }
        start += used;
    }
    Ok(match token {
        // -2: the key vanished between GET and PTTL.
        Some(_) if pttl == -2 => State::Free,
        Some(t) => State::Held(t, u64::try_from(pttl).ok()),
        None => State::Free,
    })
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"))
    } else {
        Ok(left)
    }
}

/// The TLS configuration, when a master is `rediss://` (and redlock was built with TLS).
#[cfg(feature = "tls")]
fn tls_setup(args: &MasterArgs, specs: &[MasterSpec]) -> Result<Tls, String> {
    if !specs.iter().any(|s| s.tls) {
        return Ok(None);
    }
    let (ca, cert) = args.tls_files();
    tls_config::client_config(ca, cert).map(Some)
}

#[cfg(not(feature = "tls"))]
fn tls_setup(_: &MasterArgs, _: &[MasterSpec]) -> Result<Tls, String> {
    Ok(None)
}
