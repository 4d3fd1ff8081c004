//! A scripted fake server, for the bytes Redis would never send (hostile input). Not a
//! Redis stand-in: everything the tests can do against a real master, they do against one.
//!
//! It listens on a free 127.0.0.1 port and, per connection, reads RESP commands (arrays of
//! bulk strings, or inline commands) and asks the script what to do with each. The script
//! gets the command and how many commands of the same name the server received before it
//! (over all connections), and returns an [`Action`]. [`Action::Default`] answers like
//! Redis for the handshake a client sends on connect (`PING`, `AUTH`, `SELECT`, `HELLO`,
//! `CLIENT ...`, `SCRIPT LOAD` -> the script's real SHA-1, `INFO` -> a bulk with `run_id:`
//! and `uptime_in_seconds:`, `QUIT`), and with an `-ERR` for anything else, so only the
//! scripted command is hostile.
//!
//! ```ignore
//! let fake = FakeServer::start(|cmd, n| {
//!     if cmd.is("SET") && n == 0 {
//!         Action::reply(b"$9223372036854775807\r\n") // first SET: a huge bulk header
//!     } else if cmd.is("SET") {
//!         Action::reply(b"+OK\r\n")
//!     } else {
//!         Action::Default
//!     }
//! })
//! .unwrap();
//! // ... point a client at fake.url() ...
//! assert_eq!(fake.count("SET"), 1);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::SockRef;

/// Read and accept timeout of the server's threads: how fast they notice a stop.
const TICK: Duration = Duration::from_millis(5);
/// Limits of the command reader (a client sending more is answered with a protocol error).
const MAX_ARGS: usize = 1024 * 1024;
const MAX_ARG_LEN: usize = 512 * 1024 * 1024;
const MAX_LINE: usize = 64 * 1024;
const MAX_BUFFERED: usize = 64 * 1024 * 1024;

/// One command received by the fake server.
#[derive(Clone, PartialEq, Eq)]
pub struct Command {
    /// The arguments, the command name first, as sent.
    pub args: Vec<Vec<u8>>,
    /// Which connection it came on (0 for the first accepted).
    pub conn: usize,
    /// Its position among all commands the server received (0-based).
    pub seq: usize,
}

impl Command {
    /// The command name, upper-cased (`"SET"`, `"SCRIPT"`); empty for an empty command.
    pub fn name(&self) -> String {
        self.args
            .first()
            .map(|a| String::from_utf8_lossy(a).to_ascii_uppercase())
            .unwrap_or_default()
    }

    /// `true` when the name matches, ignoring case. `"SCRIPT LOAD"` (two words) also checks
    /// the subcommand.
    pub fn is(&self, name: &str) -> bool {
        let mut words = name.split_whitespace();
        let mut args = self.args.iter();
        words.all(|w| {
            args.next()
                .is_some_and(|a| a.eq_ignore_ascii_case(w.as_bytes()))
        })
    }

    /// Argument `i` (0 is the name); empty if absent.
    pub fn arg(&self, i: usize) -> &[u8] {
        self.args.get(i).map(Vec::as_slice).unwrap_or_default()
    }
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        write!(f, "#{} conn {} {:?}", self.seq, self.conn, args)
    }
}

/// What the fake server does with one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Answer like Redis for handshake commands, `-ERR` for the rest.
    Default,
    /// Send these bytes as they are (any number of frames, garbage included).
    Reply(Vec<u8>),
    /// Send these bytes one at a time, waiting this long before each.
    ReplyDripped(Vec<u8>, Duration),
    /// Send nothing; keep reading.
    NoReply,
    /// Close the connection (FIN) without a reply.
    Close,
    /// Send these bytes, then close the connection.
    CloseAfter(Vec<u8>),
}

impl Action {
    /// `Action::Reply` from anything byte-like.
    pub fn reply(bytes: impl AsRef<[u8]>) -> Action {
        Action::Reply(bytes.as_ref().to_vec())
    }
}

type Script = dyn Fn(&Command, usize) -> Action + Send + Sync;

struct Shared {
    script: Box<Script>,
    stop: AtomicBool,
    commands: Mutex<Vec<Command>>,
    counts: Mutex<HashMap<String, usize>>,
    accepted: AtomicUsize,
    open: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    run_id: String,
    started: Instant,
    port: u16,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The fake server; dropping it closes every connection and joins its threads.
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl FakeServer {
    /// Starts the server with a script (called for every command, handshake included).
    pub fn start(
        script: impl Fn(&Command, usize) -> Action + Send + Sync + 'static,
    ) -> io::Result<FakeServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        // accept() honours SO_RCVTIMEO on Linux: the accept thread wakes every TICK.
        SockRef::from(&listener).set_read_timeout(Some(TICK))?;
        let addr = listener.local_addr()?;
        let run_id: String = (0..40)
            .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
            .collect();
        let shared = Arc::new(Shared {
            script: Box::new(script),
            stop: AtomicBool::new(false),
            commands: Mutex::new(Vec::new()),
            counts: Mutex::new(HashMap::new()),
            accepted: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
            run_id,
            started: Instant::now(),
            port: addr.port(),
        });
        let acceptor = {
            let shared = shared.clone();
            thread::Builder::new()
                .name(format!("fake-accept-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(FakeServer {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// A fake that answers everything with [`Action::Default`].
    pub fn redis_like() -> io::Result<FakeServer> {
        Self::start(|_, _| Action::Default)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// The `run_id` its `INFO` reports.
    pub fn run_id(&self) -> &str {
        &self.shared.run_id
    }

    /// Every command received so far, in order.
    pub fn commands(&self) -> Vec<Command> {
        lock(&self.shared.commands).clone()
    }

    /// How many commands named `name` (case-insensitive) were received.
    pub fn count(&self, name: &str) -> usize {
        lock(&self.shared.counts)
            .get(&name.to_ascii_uppercase())
            .copied()
            .unwrap_or(0)
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until at least `n` commands named `name` arrived; returns whether
    /// they did.
    pub fn wait_for_count(&self, name: &str, n: usize, timeout: Duration) -> bool {
        super::poll_until(timeout, || self.count(name) >= n)
    }
}

impl Drop for FakeServer {
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

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let conn = shared.accepted.fetch_add(1, Ordering::SeqCst);
                shared.open.fetch_add(1, Ordering::SeqCst);
                let worker = shared.clone();
                let spawned = thread::Builder::new()
                    .name(format!("fake-conn-{conn}"))
                    .spawn(move || {
                        // Counts the connection closed even if the script panics.
                        let open = OpenGuard(worker.clone());
                        let _ = serve(stream, conn, &open.0);
                    });
                match spawned {
                    Ok(t) => {
                        let mut threads = lock(&shared.threads);
                        threads.retain(|t| !t.is_finished());
                        threads.push(t);
                    }
                    Err(_) => {
                        shared.open.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            Err(e) if super::is_transient(&e) => {}
            Err(_) => thread::sleep(TICK),
        }
    }
}

struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `true` when the server is being dropped.
fn stopping(shared: &Shared) -> bool {
    shared.stop.load(Ordering::SeqCst)
}

fn write_all(stream: &mut TcpStream, mut bytes: &[u8], shared: &Shared) -> io::Result<()> {
    while !bytes.is_empty() {
        if stopping(shared) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if super::is_transient(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Closes gently: FIN after what was written, then read (and drop) what the client still
/// sends for a moment, so the kernel sends no RST over unread data.
fn close(mut stream: TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(100);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
}

fn serve(mut stream: TcpStream, conn: usize, shared: &Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TICK))?;
    stream.set_write_timeout(Some(TICK))?;
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // Answer every complete command in the buffer, in order.
        loop {
            let (args, used) = match parse_command(&buf) {
                Ok(Some(parsed)) => parsed,
                Ok(None) => break,
                Err(msg) => {
                    let _ = write_all(
                        &mut stream,
                        format!("-ERR Protocol error: {msg}\r\n").as_bytes(),
                        shared,
                    );
                    close(stream);
                    return Ok(());
                }
            };
            buf.drain(..used);
            if args.is_empty() {
                continue;
            }
            let (command, n) = record(args, conn, shared);
            let mut action = (shared.script)(&command, n);
            if action == Action::Default {
                action = default_action(&command, shared);
            }
            match action {
                Action::Default | Action::NoReply => {}
                Action::Reply(bytes) => write_all(&mut stream, &bytes, shared)?,
                Action::ReplyDripped(bytes, delay) => {
                    for byte in &bytes {
                        let deadline = Instant::now() + delay;
                        while Instant::now() < deadline {
                            if stopping(shared) {
                                return Ok(());
                            }
                            thread::sleep((deadline - Instant::now()).min(TICK));
                        }
                        write_all(&mut stream, std::slice::from_ref(byte), shared)?;
                    }
                }
                Action::Close => {
                    close(stream);
                    return Ok(());
                }
                Action::CloseAfter(bytes) => {
                    write_all(&mut stream, &bytes, shared)?;
                    close(stream);
                    return Ok(());
                }
            }
        }
        if stopping(shared) {
            return Ok(());
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_BUFFERED {
                    let _ = write_all(
                        &mut stream,
                        b"-ERR Protocol error: too much input\r\n",
                        shared,
                    );
                    close(stream);
                    return Ok(());
                }
            }
            Err(e) if super::is_transient(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Records the command; returns it and how many of the same name came before it.
fn record(args: Vec<Vec<u8>>, conn: usize, shared: &Shared) -> (Command, usize) {
    let mut commands = lock(&shared.commands);
    let command = Command {
        args,
        conn,
        seq: commands.len(),
    };
    let n = {
        let mut counts = lock(&shared.counts);
        let count = counts.entry(command.name()).or_insert(0);
        *count += 1;
        *count - 1
    };
    commands.push(command.clone());
    (command, n)
}

fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
    out
}

/// What Redis 7 would answer to the handshake commands; `-ERR` for the rest.
fn default_action(cmd: &Command, shared: &Shared) -> Action {
    let reply = match cmd.name().as_str() {
        "PING" if cmd.args.len() > 1 => bulk(cmd.arg(1)),
        "PING" => b"+PONG\r\n".to_vec(),
        "AUTH" | "SELECT" | "CLIENT" => b"+OK\r\n".to_vec(),
        "QUIT" => return Action::CloseAfter(b"+OK\r\n".to_vec()),
        "SCRIPT" if cmd.is("SCRIPT LOAD") => bulk(
            sha1_smol::Sha1::from(cmd.arg(2))
                .digest()
                .to_string()
                .as_bytes(),
        ),
        "INFO" => bulk(
            format!(
                "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\
                 process_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n",
                std::process::id(),
                shared.run_id,
                shared.port,
                shared.started.elapsed().as_secs()
            )
            .as_bytes(),
        ),
        "HELLO" => {
            let proto = if cmd.arg(1) == b"3" { 3 } else { 2 };
            let fields = [
                bulk(b"server"),
                bulk(b"redis"),
                bulk(b"version"),
                bulk(b"7.0.15"),
                bulk(b"proto"),
                format!(":{proto}\r\n").into_bytes(),
                bulk(b"id"),
                b":1\r\n".to_vec(),
                bulk(b"mode"),
                bulk(b"standalone"),
                bulk(b"role"),
                bulk(b"master"),
                bulk(b"modules"),
                b"*0\r\n".to_vec(),
            ];
            let mut out = if proto == 3 {
                b"%7\r\n".to_vec()
            } else {
                b"*14\r\n".to_vec()
            };
            fields.iter().for_each(|f| out.extend_from_slice(f));
            out
        }
        other => format!("-ERR fake server: no scripted reply for '{other}'\r\n").into_bytes(),
    };
    Action::Reply(reply)
}

/// Finds the CRLF-terminated line at `pos`: `Ok(Some((line, next)))`, `Ok(None)` if
/// incomplete.
fn line_at(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, String> {
    let rest = &buf[pos..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(i) if i <= MAX_LINE => Ok(Some((&rest[..i], pos + i + 2))),
        Some(_) => Err("line too long".into()),
        None if rest.len() > MAX_LINE => Err("line too long".into()),
        None => Ok(None),
    }
}

fn number(digits: &[u8], what: &str) -> Result<usize, String> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .map(|n| n.max(0) as usize)
        .ok_or_else(|| format!("invalid {what}"))
}

/// A parsed command's arguments and how many bytes of the input it used.
pub type Parsed = (Vec<Vec<u8>>, usize);

/// Parses one command from the start of `buf`: `Ok(Some((args, bytes used)))`, `Ok(None)`
/// when incomplete, `Err` for input Redis would reject.
pub fn parse_command(buf: &[u8]) -> Result<Option<Parsed>, String> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        // Inline command: words up to the end of the line.
        let Some(end) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > MAX_LINE {
                Err("too big inline request".into())
            } else {
                Ok(None)
            };
        };
        let line = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
        let args = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        return Ok(Some((args, end + 1)));
    }
    let Some((header, mut pos)) = line_at(buf, 0)? else {
        return Ok(None);
    };
    let count = number(&header[1..], "multibulk length")?;
    if count > MAX_ARGS {
        return Err("invalid multibulk length".into());
    }
    let mut args = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let Some((header, next)) = line_at(buf, pos)? else {
            return Ok(None);
        };
        if header.first() != Some(&b'$') {
            return Err(format!(
                "expected '$', got '{}'",
                char::from(header.first().copied().unwrap_or(b' '))
            ));
        }
        let len = number(&header[1..], "bulk length")?;
        if len > MAX_ARG_LEN {
            return Err("invalid bulk length".into());
        }
        if buf.len() < next + len + 2 {
            return Ok(None);
        }
        if &buf[next + len..next + len + 2] != b"\r\n" {
            return Err("bulk string not followed by CRLF".into());
        }
        args.push(buf[next..next + len].to_vec());
        pos = next + len + 2;
    }
    Ok(Some((args, pos)))
}
