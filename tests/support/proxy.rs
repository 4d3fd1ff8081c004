//! A fault-injecting TCP proxy in front of one master, switchable while a test runs.
//!
//! ```ignore
//! let master = support::master();
//! let proxy = Proxy::start(master.addr()).unwrap();
//! let url = proxy.url();                              // give this to the client
//! proxy.set_mode(Mode::Latency(Duration::from_millis(50)));
//! proxy.set_mode(Mode::Blackhole);                    // read, forward nothing
//! proxy.set_mode(Mode::PassThrough);
//! proxy.reset_all();                                  // RST every current connection
//! proxy.cut_next_reply(3);                            // next reply: 3 bytes, then close
//! proxy.set_upstream(other.addr());                   // new connections go there
//! ```
//!
//! Threads and std sockets: one accept thread, two pump threads per connection. Every
//! blocking call has a short timeout, so all threads notice a stop within milliseconds;
//! dropping the proxy stops and joins them.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::SockRef;

/// Read/write/accept timeout of the proxy's threads: how fast they notice a change.
const TICK: Duration = Duration::from_millis(5);
/// How long `reset_all` and `Drop` wait for connection threads to finish.
const SETTLE: Duration = Duration::from_secs(5);

/// What the proxy does with the bytes of every connection (applies at once, also to
/// connections already open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything as it arrives.
    PassThrough,
    /// Hold each chunk for this long before forwarding it, in both directions (a request and
    /// its reply each pay it: a round trip grows by about twice this).
    Latency(Duration),
    /// Accept and read, forward nothing, in both directions: the bytes are discarded
    /// (counted by [`Proxy::dropped_bytes`]). Switching back does not bring them back.
    Blackhole,
    /// Stop reading in both directions: bytes wait in the kernel buffers and are delivered,
    /// late, when the mode changes (a pause, not a loss).
    Hold,
    /// Forward server-to-client bytes one at a time with this delay before each (client to
    /// server is passed through).
    Drip(Duration),
    /// On each connection, the `n`-th client-to-server chunk (one read, counting from 1) is
    /// discarded and the connection reset (RST both ways), as when a connection breaks just
    /// as a request is sent; everything else passes through. With a client that writes each
    /// request batch at once: "the n-th write on a connection is lost with the connection".
    ResetOnUpChunk(usize),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

struct Conn {
    reset: AtomicBool,
    closed: AtomicBool,
    pumps_alive: AtomicUsize,
}

impl Conn {
    fn alive(&self) -> bool {
        self.pumps_alive.load(Ordering::SeqCst) > 0
    }
}

struct Shared {
    /// Where new connections go (switchable: a server swapped behind one address).
    upstream: Mutex<SocketAddr>,
    mode: Mutex<Mode>,
    cut: Mutex<Option<usize>>,
    stop: AtomicBool,
    conns: Mutex<Vec<Arc<Conn>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    accepted: AtomicUsize,
    dropped: AtomicU64,
    forwarded_up: AtomicU64,
    forwarded_down: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }
}

/// The proxy and its control handle (`&self` methods; share it with `Arc` if needed).
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream())
            .field("mode", &self.shared.mode())
            .finish()
    }
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port; each accepted connection gets its own connection
    /// to `upstream` (if that connect fails, the client connection is closed at once).
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        // accept() honours SO_RCVTIMEO on Linux: the accept thread wakes every TICK.
        SockRef::from(&listener).set_read_timeout(Some(TICK))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            mode: Mutex::new(Mode::PassThrough),
            cut: Mutex::new(None),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            forwarded_up: AtomicU64::new(0),
            forwarded_down: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = shared.clone();
            thread::Builder::new()
                .name(format!("proxy-accept-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The proxy's address (connect here instead of to the master).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:port` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// The master behind it (for new connections).
    pub fn upstream(&self) -> SocketAddr {
        *lock(&self.shared.upstream)
    }

    /// Sends new connections to `upstream` from now on (connections already open keep
    /// theirs: [`Proxy::reset_all`] them to move every client): another server takes over
    /// the address, as a promoted replica behind a VIP or a DNS name does.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *lock(&self.shared.upstream) = upstream;
    }

    /// Switches the mode for all connections, current and future.
    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.mode) = mode;
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Resets every current connection: both the client and the master side are closed
    /// with SO_LINGER 0, so each peer gets a TCP RST. Returns once they are closed (waits
    /// at most 5 s). New connections are accepted as before.
    pub fn reset_all(&self) {
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns).clone();
        for conn in &conns {
            conn.reset.store(true, Ordering::SeqCst);
        }
        let closed = poll(SETTLE, || conns.iter().all(|c| !c.alive()));
        assert!(
            closed,
            "proxy: connections did not close within {SETTLE:?} after reset"
        );
    }

    /// One shot: the next server-to-client chunk (one read from the master, on whichever
    /// connection gets one first) is forwarded only up to its first `k` bytes, then that
    /// connection is closed (FIN) on both sides.
    pub fn cut_next_reply(&self, k: usize) {
        *lock(&self.shared.cut) = Some(k);
    }

    /// `true` while a `cut_next_reply` is armed and not yet used.
    pub fn cut_pending(&self) -> bool {
        lock(&self.shared.cut).is_some()
    }

    /// Connections currently open through the proxy.
    pub fn connections(&self) -> usize {
        let mut conns = lock(&self.shared.conns);
        conns.retain(|c| c.alive());
        conns.len()
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Bytes discarded in `Blackhole` mode, both directions.
    pub fn dropped_bytes(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Bytes forwarded client to server (counted just before they are written).
    pub fn forwarded_up(&self) -> u64 {
        self.shared.forwarded_up.load(Ordering::SeqCst)
    }

    /// Bytes forwarded server to client (counted just before they are written).
    pub fn forwarded_down(&self) -> u64 {
        self.shared.forwarded_down.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let threads: Vec<JoinHandle<()>> = lock(&self.shared.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Polls `cond` every millisecond, bounded in time and count.
fn poll(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    for _ in 0..timeout.as_millis().saturating_mul(2).saturating_add(10) {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    cond()
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = open(client, &shared) {
                    eprintln!("proxy {}: {e}", *lock(&shared.upstream));
                }
            }
            Err(e) if super::is_transient(&e) => {}
            // EMFILE and the like: back off one tick, the loop stays bounded by `stop`.
            Err(_) => thread::sleep(TICK),
        }
    }
}

fn setup(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TICK))?;
    stream.set_write_timeout(Some(TICK))
}

fn open(client: TcpStream, shared: &Arc<Shared>) -> io::Result<()> {
    let to = *lock(&shared.upstream);
    let upstream = match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
        Ok(s) => s,
        Err(e) => {
            drop(client);
            return Err(io::Error::new(e.kind(), format!("connect upstream: {e}")));
        }
    };
    setup(&client)?;
    setup(&upstream)?;
    let conn = Arc::new(Conn {
        reset: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        pumps_alive: AtomicUsize::new(2),
    });
    {
        let mut conns = lock(&shared.conns);
        conns.retain(|c| c.alive());
        conns.push(conn.clone());
    }
    let pumps = [
        (Direction::Up, client.try_clone()?, upstream.try_clone()?),
        (Direction::Down, upstream, client),
    ];
    let mut threads = lock(&shared.threads);
    threads.retain(|t| !t.is_finished());
    for (direction, from, to) in pumps {
        let (pump_shared, pump_conn) = (shared.clone(), conn.clone());
        let spawned = thread::Builder::new()
            .name("proxy-pump".into())
            .spawn(move || pump(direction, from, to, &pump_conn, &pump_shared));
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                conn.pumps_alive.fetch_sub(1, Ordering::SeqCst);
                conn.closed.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Why a pump stops.
enum End {
    /// EOF, an error, a cut, or the other pump finished: close both sides with FIN.
    Close,
    /// `reset_all`: close both sides with RST.
    Reset,
    /// The proxy is dropped.
    Stop,
}

fn interrupted(conn: &Conn, shared: &Shared) -> Option<End> {
    if shared.stop.load(Ordering::SeqCst) {
        Some(End::Stop)
    } else if conn.reset.load(Ordering::SeqCst) {
        Some(End::Reset)
    } else if conn.closed.load(Ordering::SeqCst) {
        Some(End::Close)
    } else {
        None
    }
}

/// Sleeps `d` in slices of at most TICK, cut short by a stop, reset or close.
fn pause(d: Duration, conn: &Conn, shared: &Shared) -> Result<(), End> {
    let deadline = Instant::now() + d;
    loop {
        if let Some(end) = interrupted(conn, shared) {
            return Err(end);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(());
        }
        thread::sleep((deadline - now).min(TICK));
    }
}

fn write_all(
    to: &mut TcpStream,
    mut bytes: &[u8],
    conn: &Conn,
    shared: &Shared,
) -> Result<(), End> {
    while !bytes.is_empty() {
        if let Some(end) = interrupted(conn, shared) {
            return Err(end);
        }
        match to.write(bytes) {
            Ok(0) => return Err(End::Close),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if super::is_transient(&e) => {}
            Err(_) => return Err(End::Close),
        }
    }
    Ok(())
}

fn pump(
    direction: Direction,
    mut from: TcpStream,
    mut to: TcpStream,
    conn: &Conn,
    shared: &Shared,
) {
    let end = pump_loop(direction, &mut from, &mut to, conn, shared);
    match end {
        End::Reset => {
            for s in [&from, &to] {
                let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
            }
        }
        End::Close | End::Stop => {
            conn.closed.store(true, Ordering::SeqCst);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        }
    }
    // Close our descriptors before saying we are done, so that once `reset_all` sees no
    // pump alive, the RSTs have been sent.
    drop(from);
    drop(to);
    conn.pumps_alive.fetch_sub(1, Ordering::SeqCst);
}

fn pump_loop(
    direction: Direction,
    from: &mut TcpStream,
    to: &mut TcpStream,
    conn: &Conn,
    shared: &Shared,
) -> End {
    let mut buf = vec![0u8; 64 * 1024];
    let mut chunks = 0usize;
    let forwarded = match direction {
        Direction::Up => &shared.forwarded_up,
        Direction::Down => &shared.forwarded_down,
    };
    loop {
        if let Some(end) = interrupted(conn, shared) {
            return end;
        }
        if shared.mode() == Mode::Hold {
            if let Err(end) = pause(Duration::from_millis(1), conn, shared) {
                return end;
            }
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => return End::Close,
            Ok(n) => n,
            Err(e) if super::is_transient(&e) => continue,
            Err(_) => return End::Close,
        };
        let chunk = &buf[..n];
        chunks += 1;
        // Read in one mode, switched to Hold before forwarding: keep the chunk until
        // the hold ends.
        while shared.mode() == Mode::Hold {
            if let Err(end) = pause(Duration::from_millis(1), conn, shared) {
                return end;
            }
        }
        if direction == Direction::Down {
            if let Some(k) = lock(&shared.cut).take() {
                let head = &chunk[..k.min(n)];
                forwarded.fetch_add(head.len() as u64, Ordering::SeqCst);
                let _ = write_all(to, head, conn, shared);
                return End::Close;
            }
        }
        // Counted before writing, so that a peer that has the bytes sees them counted.
        let send = |bytes: &[u8], to: &mut TcpStream| {
            forwarded.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            write_all(to, bytes, conn, shared)
        };
        let result = match shared.mode() {
            Mode::Blackhole => {
                shared.dropped.fetch_add(n as u64, Ordering::SeqCst);
                Ok(())
            }
            Mode::Latency(d) => pause(d, conn, shared).and_then(|()| send(chunk, to)),
            Mode::ResetOnUpChunk(k) if direction == Direction::Up && chunks == k => {
                shared.dropped.fetch_add(n as u64, Ordering::SeqCst);
                conn.reset.store(true, Ordering::SeqCst);
                Err(End::Reset)
            }
            Mode::Drip(d) if direction == Direction::Down => {
                let mut result = Ok(());
                for (i, byte) in chunk.iter().enumerate() {
                    if !matches!(shared.mode(), Mode::Drip(_)) {
                        // Switched away mid-chunk: the rest goes at once.
                        result = send(&chunk[i..], to);
                        break;
                    }
                    result =
                        pause(d, conn, shared).and_then(|()| send(std::slice::from_ref(byte), to));
                    if result.is_err() {
                        break;
                    }
                }
                result
            }
            Mode::PassThrough | Mode::Drip(_) | Mode::Hold | Mode::ResetOnUpChunk(_) => {
                send(chunk, to)
            }
        };
        if let Err(end) = result {
            return end;
        }
    }
}
