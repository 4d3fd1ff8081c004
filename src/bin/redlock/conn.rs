//! A blocking connection to one master for the commands that are no lock operation
//! (`redlock list`'s `SCAN`, `redlock bench`'s `INFO`): TCP, TLS over TCP or a Unix socket,
//! authenticated and on the URL's database, every step bounded by a deadline. A cluster
//! master is a session per shard primary ([`shards`], [`Master`]), keyed requests routed
//! by slot.

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

/// A reply's text: a simple string or a bulk string.
fn text(v: &Val) -> Option<&[u8]> {
    match v {
        Val::Simple(s) | Val::Bulk(Some(s)) => Some(s),
        _ => None,
    }
}

/// A reply's number: an integer, or a string holding one.
fn int(v: &Val) -> Option<i64> {
    match v {
        Val::Int(n) => Some(*n),
        _ => std::str::from_utf8(text(v)?).ok()?.parse().ok(),
    }
}

fn slot(n: i64) -> Option<u16> {
    u16::try_from(n)
        .ok()
        .filter(|s| usize::from(*s) < redlock_mux::slot::SLOTS)
}

/// One shard primary of a cluster master: where it listens (as a one-node master, with
/// the cluster's user, password and TLS) and the slot ranges it serves.
#[derive(Debug, Clone)]
pub struct Shard {
    pub spec: MasterSpec,
    pub ranges: Vec<(u16, u16)>,
}

impl Shard {
    /// `host:port`.
    pub fn name(&self) -> String {
        self.spec.to_string()
    }

    fn serves(&self, slot: u16) -> bool {
        self.ranges.iter().any(|(s, e)| (*s..=*e).contains(&slot))
    }
}

/// `spec` (a cluster's) as a one-node master at `endpoint`.
fn node_spec(spec: &MasterSpec, endpoint: Endpoint) -> MasterSpec {
    let mut node = spec.clone();
    node.endpoint = endpoint;
    node.cluster = false;
    node.seeds = Vec::new();
    node
}

fn bad_map(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected cluster map: {what}"),
    )
}

/// A cluster master's shard primaries, asked of its first seed that answers: `CLUSTER
/// SHARDS` (Redis 7+, Valkey), `CLUSTER SLOTS` where that is refused. A seed that is no
/// cluster node is an `InvalidInput` error that says so.
pub fn shards(spec: &MasterSpec, deadline: Instant, tls: &Tls) -> io::Result<Vec<Shard>> {
    let mut last = None;
    for seed in std::iter::once(&spec.endpoint).chain(&spec.seeds) {
        let node = node_spec(spec, seed.clone());
        let found = Session::open(&node, deadline, tls).and_then(|mut s| slot_map(&mut s, &node));
        match found {
            Ok(shards) => return Ok(shards),
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no seed")))
}

fn slot_map(s: &mut Session, seed: &MasterSpec) -> io::Result<Vec<Shard>> {
    let seed_host = match &seed.endpoint {
        Endpoint::Tcp { host, .. } => host.clone(),
        Endpoint::Unix(_) => String::new(),
    };
    let node = |host: &[u8], port: i64| -> io::Result<MasterSpec> {
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad_map("a primary without a port"))?;
        let host = match host {
            b"" | b"?" => seed_host.clone(),
            h => String::from_utf8_lossy(h).into_owned(),
        };
        Ok(node_spec(seed, Endpoint::Tcp { host, port }))
    };
    let reply = s.pipeline(&[vec![Arg::from("CLUSTER"), Arg::from("SHARDS")]])?;
    let shards = match reply.into_iter().next() {
        Some(Val::Array(shards)) => shards,
        Some(Val::Error(e)) if e.contains("cluster support disabled") => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{seed} is not a cluster node ({e}): name it redis://, not redis+cluster://"
                ),
            ))
        }
        // Before Redis 7: no CLUSTER SHARDS.
        Some(Val::Error(_)) => return slots_map(s, &node),
        other => return Err(bad_map(&format!("CLUSTER SHARDS answered {other:?}"))),
    };
    let mut out = Vec::new();
    for shard in &shards {
        let Val::Array(fields) = shard else {
            return Err(bad_map("a shard is not a map"));
        };
        let (mut ranges, mut primary) = (Vec::new(), None);
        for kv in fields.chunks(2) {
            match (text(&kv[0]), kv.get(1)) {
                (Some(b"slots"), Some(Val::Array(a))) => {
                    for r in a.chunks(2) {
                        let (Some(s), Some(e)) = (
                            int(&r[0]).and_then(slot),
                            r.get(1).and_then(int).and_then(slot),
                        ) else {
                            return Err(bad_map("a slot range"));
                        };
                        ranges.push((s, e));
                    }
                }
                (Some(b"nodes"), Some(Val::Array(nodes))) => {
                    for n in nodes {
                        let Val::Array(f) = n else { continue };
                        let get = |k: &[u8]| {
                            f.chunks(2)
                                .find(|kv| text(&kv[0]) == Some(k))
                                .and_then(|kv| kv.get(1))
                        };
                        let role = get(b"role").and_then(text);
                        let health = get(b"health").and_then(text);
                        if role != Some(b"master") || health.is_some_and(|h| h != b"online") {
                            continue;
                        }
                        let port = if seed.tls {
                            get(b"tls-port").and_then(int).filter(|p| *p != 0)
                        } else {
                            None
                        }
                        .or_else(|| get(b"port").and_then(int))
                        .unwrap_or(0);
                        let host = get(b"endpoint")
                            .or_else(|| get(b"ip"))
                            .and_then(text)
                            .unwrap_or(b"?");
                        primary = Some(node(host, port)?);
                    }
                }
                _ => {}
            }
        }
        if let (Some(spec), false) = (primary, ranges.is_empty()) {
            out.push(Shard { spec, ranges });
        }
    }
    Ok(out)
}

/// `CLUSTER SLOTS`: `[start, end, [host, port, id, ...], replicas...]` per range, merged
/// by primary.
fn slots_map(
    s: &mut Session,
    node: &dyn Fn(&[u8], i64) -> io::Result<MasterSpec>,
) -> io::Result<Vec<Shard>> {
    let reply = s.pipeline(&[vec![Arg::from("CLUSTER"), Arg::from("SLOTS")]])?;
    let entries = match reply.into_iter().next() {
        Some(Val::Array(e)) => e,
        Some(Val::Error(e)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a cluster node: CLUSTER SLOTS answered {e}"),
            ))
        }
        other => return Err(bad_map(&format!("CLUSTER SLOTS answered {other:?}"))),
    };
    let mut out: Vec<Shard> = Vec::new();
    for e in &entries {
        let Val::Array(e) = e else {
            return Err(bad_map("a slot range is not an array"));
        };
        let (Some(s), Some(end), Some(Val::Array(n))) = (
            e.first().and_then(int).and_then(slot),
            e.get(1).and_then(int).and_then(slot),
            e.get(2),
        ) else {
            return Err(bad_map("a slot range without its primary"));
        };
        let spec = node(
            n.first().and_then(text).unwrap_or(b"?"),
            n.get(1).and_then(int).unwrap_or(0),
        )?;
        match out.iter_mut().find(|sh| sh.spec == spec) {
            Some(sh) => sh.ranges.push((s, end)),
            None => out.push(Shard {
                spec,
                ranges: vec![(s, end)],
            }),
        }
    }
    Ok(out)
}

/// A master for requests outside the lock protocol: one session, or for a cluster master
/// one session per shard primary (opened when first needed), keyed requests routed to the
/// shard that serves their key's slot, a `-MOVED` or `-ASK` followed once.
pub enum Master {
    One(Session),
    Cluster {
        shards: Vec<Shard>,
        sessions: Vec<Option<Session>>,
        deadline: Instant,
        tls: Tls,
    },
}

/// A `-MOVED slot host:port` or `-ASK slot host:port` answer.
fn redirect(e: &str) -> Option<(bool, String)> {
    let mut w = e.split(' ');
    let ask = match w.next()? {
        "MOVED" => false,
        "ASK" => true,
        _ => return None,
    };
    let _slot = w.next()?;
    Some((ask, w.next()?.to_string()))
}

impl Master {
    /// Connect (a cluster: discover its shards; their sessions open when first used).
    pub fn open(spec: &MasterSpec, deadline: Instant, tls: &Tls) -> io::Result<Master> {
        if !spec.cluster {
            return Session::open(spec, deadline, tls).map(Master::One);
        }
        let shards = shards(spec, deadline, tls)?;
        Ok(Master::Cluster {
            sessions: shards.iter().map(|_| None).collect(),
            shards,
            deadline,
            tls: tls.clone(),
        })
    }

    /// The nodes that hold the master's keys: 1, or a cluster's shard primaries.
    pub fn nodes(&self) -> usize {
        match self {
            Master::One(_) => 1,
            Master::Cluster { shards, .. } => shards.len(),
        }
    }

    /// The name of node `i` for messages (`host:port`); `None` for a single server.
    pub fn node_name(&self, i: usize) -> Option<String> {
        match self {
            Master::One(_) => None,
            Master::Cluster { shards, .. } => shards.get(i).map(Shard::name),
        }
    }

    /// The session to node `i`.
    pub fn node(&mut self, i: usize) -> io::Result<&mut Session> {
        match self {
            Master::One(s) => Ok(s),
            Master::Cluster {
                shards,
                sessions,
                deadline,
                tls,
            } => {
                if sessions[i].is_none() {
                    sessions[i] = Some(Session::open(&shards[i].spec, *deadline, tls)?);
                }
                Ok(sessions[i].as_mut().expect("just opened"))
            }
        }
    }

    /// Send each keyed request (its key, the command) to the node that serves the key, in
    /// one pipeline per node; follow a `-MOVED` or `-ASK` once. Replies in request order.
    pub fn keyed(&mut self, requests: &[(&[u8], Vec<Arg<'_>>)]) -> io::Result<Vec<Val>> {
        let owners: Vec<usize> = match self {
            Master::One(s) => {
                let commands: Vec<Vec<Arg<'_>>> = requests.iter().map(|(_, c)| c.clone()).collect();
                return s.pipeline(&commands);
            }
            Master::Cluster { shards, .. } => requests
                .iter()
                .map(|(k, _)| {
                    let slot = redlock_mux::slot::key_slot(k);
                    shards.iter().position(|s| s.serves(slot)).ok_or_else(|| {
                        io::Error::other(format!("slot {slot} is served by no shard primary"))
                    })
                })
                .collect::<io::Result<_>>()?,
        };
        let mut replies: Vec<Option<Val>> = requests.iter().map(|_| None).collect();
        for node in 0..self.nodes() {
            let mine: Vec<usize> = (0..requests.len()).filter(|i| owners[*i] == node).collect();
            if mine.is_empty() {
                continue;
            }
            let commands: Vec<Vec<Arg<'_>>> = mine.iter().map(|i| requests[*i].1.clone()).collect();
            let got = self.node(node)?.pipeline(&commands)?;
            for (i, v) in mine.into_iter().zip(got) {
                replies[i] = Some(v);
            }
        }
        for (i, reply) in replies.iter_mut().enumerate() {
            let Some((ask, addr)) = reply.as_ref().and_then(|v| match v {
                Val::Error(e) => redirect(e),
                _ => None,
            }) else {
                continue;
            };
            let Master::Cluster {
                deadline,
                tls,
                shards,
                ..
            } = &*self
            else {
                continue;
            };
            // `host:port`, an IPv6 host without brackets: the port is after the last colon.
            let endpoint = addr
                .rsplit_once(':')
                .and_then(|(h, p)| {
                    Some(Endpoint::Tcp {
                        host: h.trim_start_matches('[').trim_end_matches(']').to_string(),
                        port: p.parse().ok()?,
                    })
                })
                .ok_or_else(|| bad_map(&format!("a redirect to {addr:?}")))?;
            let spec = node_spec(&shards[0].spec, endpoint);
            let mut s = Session::open(&spec, *deadline, tls)?;
            let mut commands = Vec::new();
            if ask {
                commands.push(vec![Arg::from("ASKING")]);
            }
            commands.push(requests[i].1.clone());
            *reply = s.pipeline(&commands)?.pop();
        }
        Ok(replies
            .into_iter()
            .map(|v| v.expect("every request answered"))
            .collect())
    }
}
