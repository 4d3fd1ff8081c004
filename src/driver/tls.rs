//! TLS (`rediss://` masters), rustls driven sans-IO inside the mio loop: no thread, no
//! blocking call. The connection's plaintext goes through `ClientConnection::writer()`
//! (buffered by rustls until the handshake is done, so our own handshake requests leave in
//! the first flight after it), records through `write_tls`/`read_tls` on the non-blocking
//! socket, and `process_new_packets` after every read. Trust roots: the CA file given to
//! the builder, else the system's store (`rustls-native-certs`), loaded once at `build()`.

use std::io::{self, Read, Write};
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig, ClientConnection};

use super::transport::IoCounts;
use crate::rules::{ErrorText, Fault, TlsFault};

#[path = "tls_config.rs"]
mod tls_config;
pub(crate) use tls_config::client_config;

/// What one `rediss://` master needs to start a TLS session.
#[derive(Clone)]
pub(crate) struct TlsTarget {
    pub config: Arc<ClientConfig>,
    /// The name the certificate must be valid for (SNI too, unless an IP address).
    pub name: ServerName<'static>,
}

impl TlsTarget {
    pub(crate) fn new(config: Arc<ClientConfig>, host: &str) -> Result<Self, String> {
        let name = ServerName::try_from(host.to_string()).map_err(|_| {
            format!("{host:?} is neither a valid DNS name nor an IP address for TLS")
        })?;
        Ok(TlsTarget { config, name })
    }
}

/// A TLS session over a non-blocking TCP connection.
pub(crate) struct TlsStream {
    pub tcp: TcpStream,
    conn: ClientConnection,
    /// The peer closed the TCP stream (`read_tls` returned 0).
    eof: bool,
}

impl TlsStream {
    pub(super) fn new(tcp: TcpStream, target: &TlsTarget) -> Result<Self, Fault> {
        let conn =
            ClientConnection::new(target.config.clone(), target.name.clone()).map_err(tls_fault)?;
        Ok(TlsStream {
            tcp,
            conn,
            eof: false,
        })
    }

    /// Read and process handshake records until the socket would block, write what they
    /// call for; `Ok(true)` once the handshake is done (bounded by the core's connect
    /// timeout).
    #[inline(never)]
    pub(super) fn handshake(&mut self, stats: &mut IoCounts) -> Result<bool, Fault> {
        while self.conn.is_handshaking() && self.read_records(stats)? {
            self.flush(stats)?;
        }
        self.flush(stats)?;
        Ok(!self.conn.is_handshaking())
    }

    /// Read the records the socket holds and process them: `Ok(false)` when it would
    /// block (nothing was read).
    fn read_records(&mut self, stats: &mut IoCounts) -> Result<bool, Fault> {
        loop {
            if self.eof {
                return Err(Fault::Closed(io::ErrorKind::UnexpectedEof));
            }
            stats.reads += 1;
            match self.conn.read_tls(&mut self.tcp) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fault::Closed(e.kind())),
            }
            self.conn.process_new_packets().map_err(tls_fault)?;
            return Ok(true);
        }
    }

    #[inline]
    pub(super) fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Hand plaintext to rustls (the bytes it took; 0 when its buffer is full), then write
    /// what records the socket takes.
    // Out of line: the plain-TCP path that shares the match stays small enough to inline.
    #[inline(never)]
    pub(super) fn write(&mut self, bytes: &[u8], stats: &mut IoCounts) -> Result<usize, Fault> {
        let n = self
            .conn
            .writer()
            .write(bytes)
            .map_err(|e| Fault::Closed(e.kind()))?;
        self.flush(stats)?;
        Ok(n)
    }

    /// Write pending records until none is left or the socket would block (a writable
    /// event then calls again).
    // Out of line: the plain-TCP path that shares the match stays small enough to inline.
    #[inline(never)]
    pub(super) fn flush(&mut self, stats: &mut IoCounts) -> Result<(), Fault> {
        while self.conn.wants_write() {
            stats.writes += 1;
            match self.conn.write_tls(&mut self.tcp) {
                Ok(0) => return Err(Fault::Closed(io::ErrorKind::WriteZero)),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Fault::Closed(e.kind())),
            }
        }
        Ok(())
    }

    /// Plaintext into `buf` (the bytes; 0 when the socket is drained and rustls holds no
    /// plaintext), reading and processing records as needed. Handshake records may leave
    /// records to send: the caller checks [`TlsStream::wants_write`].
    // Out of line: the plain-TCP path that shares the match stays small enough to inline.
    #[inline(never)]
    pub(super) fn read(&mut self, buf: &mut [u8], stats: &mut IoCounts) -> Result<usize, Fault> {
        loop {
            match self.conn.reader().read(buf) {
                Ok(0) => return Err(Fault::Closed(io::ErrorKind::UnexpectedEof)), // close_notify
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The peer closed without close_notify.
                Err(e) => return Err(Fault::Closed(e.kind())),
            }
            if !self.read_records(stats)? {
                return Ok(0);
            }
        }
    }
}

/// What a rustls error means for the reports.
fn tls_fault(e: rustls::Error) -> Fault {
    use rustls::Error as E;
    let text = |s: String| ErrorText::new(s.as_bytes());
    Fault::Tls(match e {
        E::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => TlsFault::UnknownIssuer,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFault::NameMismatch
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                TlsFault::Expired
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                TlsFault::NotYetValid
            }
            // webpki's own error (`CaUsedAsEndEntity`, `UnsupportedCertVersion`...), by
            // name: `TlsFault`'s Display puts it in words.
            CertificateError::Other(e) => TlsFault::BadCertificate(text(e.to_string())),
            // rustls' variant name, without its context (`InvalidPurposeContext { .. }`).
            other => {
                let debug = format!("{other:?}");
                let name = debug.split([' ', '{', '(']).next().unwrap_or_default();
                let name = name.strip_suffix("Context").unwrap_or(name);
                TlsFault::BadCertificate(text(name.to_string()))
            }
        },
        E::AlertReceived(alert) => TlsFault::Alert(text(format!("{alert:?}"))),
        other => TlsFault::Other(text(other.to_string())),
    })
}
