//! A blocking connection to one master for the commands that are no lock operation
//! (`redlock list`'s `SCAN`): TCP, TLS over TCP or a Unix socket, authenticated and on the
//! URL's database, every step bounded by a deadline.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use redlock_mux::resp::{self, Arg, Frame, Limits, Status};
use redlock_mux::{Endpoint, MasterSpec};

use crate::MasterArgs;

/// The rustls configuration for `rediss://` masters (the library's own code).
#[cfg(feature = "tls")]
#[path = "../../driver/tls_config.rs"]
mod tls_config;

/// TLS for the connections: the client configuration, made once.
#[cfg(feature = "tls")]
pub type Tls = Option<std::sync::Arc<rustls::ClientConfig>>;
#[cfg(not(feature = "tls"))]
pub type Tls = Option<()>;

/// The TLS configuration, when a master is `rediss://` (and redlock was built with TLS).
#[cfg(feature = "tls")]
pub fn tls_setup(args: &MasterArgs, specs: &[MasterSpec]) -> Result<Tls, String> {
    if !specs.iter().any(|s| s.tls) {
        return Ok(None);
    }
    let (ca, cert) = args.tls_files();
    tls_config::client_config(ca, cert).map(Some)
}

#[cfg(not(feature = "tls"))]
pub fn tls_setup(_: &MasterArgs, _: &[MasterSpec]) -> Result<Tls, String> {
    Ok(None)
}

/// A reply, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    Simple(Vec<u8>),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Val>),
}

fn val(f: &Frame<'_>) -> Val {
    match f {
        Frame::Simple(s) => Val::Simple(s.to_vec()),
        Frame::Error(e) | Frame::BulkError(e) => Val::Error(String::from_utf8_lossy(e).into()),
        Frame::Integer(n) => Val::Int(*n),
        Frame::Bulk(b) => Val::Bulk(Some(b.to_vec())),
        Frame::Aggregate(a) => Val::Array(a.iter().map(|f| val(&f)).collect()),
        _ => Val::Bulk(None),
    }
}

/// A blocking connection: TCP, TLS over TCP, or a Unix socket.
enum Stream {
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
    Unix(UnixStream),
}

impl Stream {
    fn open(spec: &MasterSpec, timeout: Duration, tls: &Tls) -> io::Result<Stream> {
        match &spec.endpoint {
            Endpoint::Tcp { host, .. } => {
                let addr = spec
                    .resolve()
                    .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
                let stream = TcpStream::connect_timeout(&addr, timeout)?;
                stream.set_nodelay(true)?;
                if !spec.tls {
                    return Ok(Stream::Tcp(stream));
                }
                #[cfg(feature = "tls")]
                if let Some(config) = tls {
                    let name = rustls::pki_types::ServerName::try_from(host.clone())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    let conn = rustls::ClientConnection::new(config.clone(), name)
                        .map_err(io::Error::other)?;
                    return Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(
                        conn, stream,
                    ))));
                }
                let _ = (host, tls);
                Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "rediss:// (TLS) needs redlock built with the `tls` feature",
                ))
            }
            Endpoint::Unix(path) => UnixStream::connect(path)
                .map(Stream::Unix)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }

    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s
                .set_read_timeout(Some(t))
                .and(s.set_write_timeout(Some(t))),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                let s = &s.sock;
                s.set_read_timeout(Some(t))
                    .and(s.set_write_timeout(Some(t)))
            }
            Stream::Unix(s) => s
                .set_read_timeout(Some(t))
                .and(s.set_write_timeout(Some(t))),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
}

/// A session with one master, bounded by a deadline: every read and write gives up then
/// (`TimedOut`).
pub struct Session {
    stream: Stream,
    deadline: Instant,
    buf: Vec<u8>,
    start: usize,
}

impl Session {
    /// Connect, authenticate with the URL's user and password, select its database.
    pub fn open(spec: &MasterSpec, deadline: Instant, tls: &Tls) -> io::Result<Session> {
        let stream = Stream::open(spec, remaining(deadline)?, tls)?;
        let mut s = Session {
            stream,
            deadline,
            buf: Vec::with_capacity(4096),
            start: 0,
        };
        let mut setup: Vec<Vec<Arg<'_>>> = Vec::new();
        match (&spec.user, &spec.password) {
            (Some(u), Some(p)) => setup.push(vec![
                Arg::from("AUTH"),
                u.as_str().into(),
                p.as_str().into(),
            ]),
            (None, Some(p)) => setup.push(vec![Arg::from("AUTH"), p.as_str().into()]),
            _ => {}
        }
        if spec.db != 0 {
            setup.push(vec![Arg::from("SELECT"), Arg::Uint(spec.db.into())]);
        }
        if !setup.is_empty() {
            for reply in s.pipeline(&setup)? {
                if let Val::Error(e) = reply {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, e));
                }
            }
        }
        Ok(s)
    }

    /// Send `commands` in one write, read one reply each.
    pub fn pipeline(&mut self, commands: &[Vec<Arg<'_>>]) -> io::Result<Vec<Val>> {
        let mut out = Vec::with_capacity(64 * commands.len());
        for c in commands {
            resp::encode_command(&mut out, c);
        }
        self.stream.set_timeouts(remaining(self.deadline)?)?;
        self.stream.write_all(&out)?;
        self.stream.flush()?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.read_reply()?);
        }
        Ok(replies)
    }

    fn read_reply(&mut self) -> io::Result<Val> {
        // Large enough for a SCAN page of long names; RESP limits still bound each frame.
        let limits = Limits {
            max_bulk_len: 1 << 20,
            max_elements: 1 << 16,
            max_depth: 4,
            max_line_len: 4096,
        };
        loop {
            match resp::parse(&self.buf[self.start..], &limits) {
                Ok(Status::Complete((f, n))) => {
                    let v = val(&f);
                    self.start += n;
                    if self.start == self.buf.len() {
                        self.buf.clear();
                        self.start = 0;
                    }
                    return Ok(v);
                }
                Ok(Status::Partial(_)) => {}
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad reply: {e:?}"),
                    ))
                }
            }
            self.stream.set_timeouts(remaining(self.deadline)?)?;
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed by the master",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"))
    } else {
        Ok(left)
    }
}

/// An I/O error in words: a timeout says how long was waited.
pub fn io_words(e: &io::Error, waited: Duration) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no answer within {}", crate::common::human_duration(waited))
        }
        _ => e.to_string(),
    }
}
