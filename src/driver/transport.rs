//! The transport under a master's connections (the lock connection in `conn.rs`, the
//! subscription connection in `sub.rs`): where a master is, the socket (TCP, Unix, TLS),
//! non-blocking connects, and one read or write at a time.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, Socket, Type};

use crate::rules::Fault;

/// Syscalls made for one master (both its links).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IoCounts {
    pub writes: u64,
    pub reads: u64,
}

/// Where a link's socket stands.
pub(super) enum Conn {
    Down,
    /// Its host name is being resolved on a helper thread (see `Driver::take_resolved`);
    /// requests queue in the core meanwhile, as while connecting.
    Resolving,
    Connecting(Stream),
    /// Connected; the TLS handshake is under way.
    Handshaking(Stream),
    Up(Stream),
}

impl Conn {
    /// TLS records wait to be written (a handshake message, or data the kernel refused).
    #[inline]
    pub(super) fn tls_wants_write(&self) -> bool {
        match self {
            #[cfg(feature = "tls")]
            Conn::Up(Stream::Tls(t)) | Conn::Handshaking(Stream::Tls(t)) => t.wants_write(),
            _ => false,
        }
    }
}

/// How to reach a master (from its URL).
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// An IP literal: never resolved.
    Addr(SocketAddr),
    /// A host name: resolved on a helper thread at every connect.
    Host { host: Arc<str>, port: u16 },
    /// A Unix domain socket.
    Unix(PathBuf),
}

/// One connection's socket: plain TCP (the hot path), a Unix socket, or TLS over TCP.
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    #[cfg(feature = "tls")]
    Tls(Box<super::tls::TlsStream>),
}

impl Stream {
    pub(super) fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        let interest = Interest::READABLE | Interest::WRITABLE;
        match self {
            Stream::Tcp(s) => registry.register(s, token, interest),
            Stream::Unix(s) => registry.register(s, token, interest),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => registry.register(&mut t.tcp, token, interest),
        }
    }

    /// Deregister and close. `reset`: requests are owed, so a TCP connection closes with a
    /// reset rather than a FIN (see `Rounds::fail_node`).
    pub(super) fn close(mut self, registry: &Registry, reset: bool) {
        let tcp = match &mut self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => {
                let _ = registry.deregister(s);
                return;
            }
            #[cfg(feature = "tls")]
            Stream::Tls(t) => {
                // Best effort: an alert rustls queued (after a TLS error) tells the master why.
                let _ = t.flush(&mut IoCounts::default());
                &mut t.tcp
            }
        };
        let _ = registry.deregister(tcp);
        if reset {
            let _ = socket2::SockRef::from(&*tcp).set_linger(Some(Duration::ZERO));
        }
    }

    /// The non-blocking connect's result so far: `Ok(true)` connected, `Ok(false)` not yet.
    pub(super) fn connected(&mut self) -> Result<bool, Fault> {
        let (error, peer) = match self {
            Stream::Tcp(s) => (s.take_error(), s.peer_addr().map(drop)),
            Stream::Unix(s) => (s.take_error(), s.peer_addr().map(drop)),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => (t.tcp.take_error(), t.tcp.peer_addr().map(drop)),
        };
        if let Ok(Some(e)) | Err(e) = error {
            return Err(Fault::Connect(e.kind()));
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(Fault::Connect(e.kind())),
        }
    }

    /// A TLS session (its handshake comes after the connect).
    #[inline]
    pub(super) fn is_tls(&self) -> bool {
        match self {
            #[cfg(feature = "tls")]
            Stream::Tls(_) => true,
            _ => false,
        }
    }

    /// Whether a read shorter than the buffer means the socket is drained (edge-triggered:
    /// no need to read on until `WouldBlock`). Not for TLS: rustls may hold more plaintext.
    #[inline]
    pub(super) fn short_read_drains(&self) -> bool {
        match self {
            Stream::Tcp(_) | Stream::Unix(_) => true,
            #[cfg(feature = "tls")]
            Stream::Tls(_) => false,
        }
    }
}

#[cfg(target_os = "linux")]
const EINPROGRESS: i32 = 115;
#[cfg(not(target_os = "linux"))]
const EINPROGRESS: i32 = 36;

/// One `write`: the bytes the kernel took (0 when it would block), or why the connection
/// is broken.
#[inline(always)]
pub(super) fn write_some(
    stream: &mut Stream,
    bytes: &[u8],
    stats: &mut IoCounts,
) -> Result<usize, Fault> {
    loop {
        stats.writes += 1;
        let written = match stream {
            Stream::Tcp(s) => s.write(bytes),
            Stream::Unix(s) => s.write(bytes),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => return t.write(bytes, stats),
        };
        return match written {
            Ok(0) => Err(Fault::Closed(io::ErrorKind::WriteZero)),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(Fault::Closed(e.kind())),
        };
    }
}

/// One `read` into `buf` (never empty): the bytes read (0 when the socket is drained), or
/// why the connection is broken (the end of stream is `Closed(UnexpectedEof)`).
#[inline(always)]
pub(super) fn read_some(
    stream: &mut Stream,
    buf: &mut [u8],
    stats: &mut IoCounts,
) -> Result<usize, Fault> {
    loop {
        stats.reads += 1;
        let read = match stream {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => return t.read(buf, stats),
        };
        return match read {
            Ok(0) => Err(Fault::Closed(io::ErrorKind::UnexpectedEof)),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(Fault::Closed(e.kind())),
        };
    }
}

/// Start a non-blocking TCP connect.
pub(super) fn connect_tcp(addr: SocketAddr) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    sock.set_keepalive(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        // EINPROGRESS (Linux 115): the connect goes on in the background.
        Err(e) if e.raw_os_error() == Some(EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(sock)))
}

/// Start a non-blocking connect to a Unix socket. (A full backlog is `WouldBlock`: a
/// failed connect like any other.)
pub(super) fn connect_unix(path: &std::path::Path) -> io::Result<UnixStream> {
    UnixStream::connect(path)
}
