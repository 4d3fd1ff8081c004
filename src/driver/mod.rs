//! The thin I/O shell around the [`Core`]: one `mio::Poll`, one socket per link (two per
//! master: the lock link and the sub link), TLS (rustls, sans-IO), host names resolved on
//! a helper thread. It feeds the core what the sockets did and read, writes what the core
//! gives out, opens and closes sockets when the core asks ([`Action`]), and reads the
//! clock; it decides nothing about locks.
//!
//! mio discipline: edge-triggered, so reads and writes are drained until `WouldBlock` (a
//! plain socket's short read means drained); `Interrupted` is retried; `Ok(0)` on a read is
//! a closed peer; spurious events are ignored; non-blocking connects follow the documented
//! steps; the clock is re-read after every poll. Lock links and sub links share one read
//! path and one write path.

mod memory;
mod transport;

#[cfg(feature = "tls")]
mod tls;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token as MioToken, Waker};

use crate::core::{Action, ConnectPhase, Core, LinkId, IDLE_SHIFT_MIN};
use crate::rules::{ErrorText, Fault};
use crate::stats::MasterStats;

pub(crate) use memory::InMemory;
#[cfg(feature = "tls")]
pub(crate) use tls::{client_config, TlsTarget};
pub(crate) use transport::Target;
use transport::{connect_tcp, connect_unix, read_some, write_some, Conn, IoCounts, Stream};

/// The mio token reserved for the cross-thread waker.
pub(crate) const WAKER: MioToken = MioToken(usize::MAX);

/// What the shared client's loop (`shared::event_loop::Loop`) needs of its I/O: the
/// [`Driver`] (sockets, one `mio::Poll`), or [`InMemory`] (masters scripted in memory,
/// for exact instruction counts: `examples/shared_loop_cycles.rs`). The loop is generic
/// over it, so the real loop calls the driver's methods directly (no `dyn`).
pub(crate) trait LoopIo: Send + 'static {
    /// Wakes the loop from [`LoopIo::wait`], from any thread.
    type Waker: Send + Sync + 'static;
    fn waker(&self) -> Self::Waker;
    fn wake(waker: &Self::Waker);
    /// See [`Driver::catch_up`].
    fn catch_up(&mut self, core: &mut Core) -> io::Result<Instant>;
    /// See [`Driver::apply_actions`].
    fn apply_actions(&mut self, core: &mut Core, now: Instant);
    /// See [`Driver::flush`].
    fn flush(&mut self, core: &mut Core, now: Instant);
    /// See [`Driver::next_wake`].
    fn next_wake(&self, core: &Core, until: Option<Instant>) -> Option<Instant>;
    /// See [`Driver::wait`].
    fn wait(&mut self, core: &mut Core, now: Instant, wake: Option<Instant>)
        -> io::Result<Instant>;
    /// See [`Driver::stats`].
    fn stats(&self, core: &Core) -> Vec<MasterStats>;
}

impl LoopIo for Driver {
    type Waker = Arc<Waker>;
    #[inline]
    fn waker(&self) -> Arc<Waker> {
        Driver::waker(self)
    }
    #[inline]
    fn wake(waker: &Arc<Waker>) {
        let _ = waker.wake();
    }
    #[inline]
    fn catch_up(&mut self, core: &mut Core) -> io::Result<Instant> {
        Driver::catch_up(self, core)
    }
    #[inline]
    fn apply_actions(&mut self, core: &mut Core, now: Instant) {
        Driver::apply_actions(self, core, now);
    }
    #[inline]
    fn flush(&mut self, core: &mut Core, now: Instant) {
        Driver::flush(self, core, now);
    }
    #[inline]
    fn next_wake(&self, core: &Core, until: Option<Instant>) -> Option<Instant> {
        Driver::next_wake(self, core, until)
    }
    #[inline]
    fn wait(
        &mut self,
        core: &mut Core,
        now: Instant,
        wake: Option<Instant>,
    ) -> io::Result<Instant> {
        Driver::wait(self, core, now, wake)
    }
    fn stats(&self, core: &Core) -> Vec<MasterStats> {
        Driver::stats(self, core)
    }
}

/// Where a master is, and what its connections need to get there.
pub(crate) struct Peer {
    pub target: Target,
    /// `rediss://`: the TLS configuration and the name to verify.
    #[cfg(feature = "tls")]
    pub tls: Option<TlsTarget>,
    /// The address the host name resolved to last (`Target::Host`): the sub link goes
    /// there too.
    addr: Option<SocketAddr>,
    /// A resolve of this master's host runs on a helper thread (at most one at a time).
    resolving: bool,
    /// Which resolve the lock link waits for: a late answer to an older one is ignored.
    resolve_gen: u64,
}

impl Peer {
    pub(crate) fn new(target: Target) -> Peer {
        Peer {
            target,
            #[cfg(feature = "tls")]
            tls: None,
            addr: None,
            resolving: false,
            resolve_gen: 0,
        }
    }
}

/// The master of link `l` among `n` masters (`extra`: the masters of the links from
/// `2 n` on).
#[inline]
fn master_index(n: usize, extra: &[usize], l: LinkId) -> usize {
    if l.0 < n {
        l.0
    } else if l.0 < 2 * n {
        l.0 - n
    } else {
        extra[l.0 - 2 * n]
    }
}

/// A resolver thread's answer: master, link, which resolve, the address or why none.
type Resolved = (usize, usize, u64, Result<SocketAddr, ErrorText>);

/// The sockets and the poll of one client.
pub(crate) struct Driver {
    poll: Poll,
    /// The readiness events of the last poll; `None` only while they are being handled
    /// (taken out of `self` for the walk, see [`Driver::handle_events`]).
    events: Option<Events>,
    waker: Arc<Waker>,
    ends: Vec<Peer>,
    /// One per link: `i` master `i`'s lock link, `n + i` its sub link, and from `2 n` on
    /// the links of cluster masters (their discovery and shard connections), added as the
    /// core asks to connect them.
    socks: Vec<Conn>,
    /// The master of each link from `2 n` on.
    extra_master: Vec<usize>,
    /// Syscalls, per master.
    io: Vec<IoCounts>,
    busy_poll: bool,
    /// Some master speaks TLS (its records may wait to be written after a flush).
    #[cfg(feature = "tls")]
    tls: bool,
    /// The last clock reading inside the loop, within one step of leaving it: the client's
    /// idle time starts there.
    left_loop: Instant,
    /// Answers of the resolver threads, handed back with a wake of `waker`.
    resolved: Arc<Mutex<Vec<Resolved>>>,
    /// Resolver threads running (their answers not taken yet).
    resolving: usize,
}

impl Driver {
    pub(crate) fn new(ends: Vec<Peer>, busy_poll: bool, now: Instant) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let n = ends.len();
        #[cfg(feature = "tls")]
        let tls = ends.iter().any(|e| e.tls.is_some());
        Ok(Driver {
            poll,
            events: Some(Events::with_capacity(64)),
            waker,
            #[cfg(feature = "tls")]
            tls,
            socks: (0..2 * n).map(|_| Conn::Down).collect(),
            extra_master: Vec::new(),
            io: vec![IoCounts::default(); n],
            ends,
            busy_poll,
            left_loop: now,
            resolved: Arc::new(Mutex::new(Vec::new())),
            resolving: 0,
        })
    }

    /// Busy-poll on or off (a keeper that waits for the masters' pushes for the whole
    /// hold sleeps in `epoll_wait` even on a busy-polling client); returns what it was.
    pub(crate) fn set_busy_poll(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.busy_poll, on)
    }

    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    fn n(&self) -> usize {
        self.ends.len()
    }

    /// The master of link `l` (no division on the hot path).
    #[inline]
    fn master_of(&self, l: LinkId) -> usize {
        master_index(self.ends.len(), &self.extra_master, l)
    }

    /// What every master did, by name: the core's counters with the syscalls added.
    pub(crate) fn stats(&self, core: &Core) -> Vec<MasterStats> {
        let mut stats = core.stats();
        for (s, io) in stats.iter_mut().zip(&self.io) {
            s.add_io(io.writes, io.reads);
        }
        stats
    }

    /// Drive `core` until `done` holds (`Ok(true)`), `until` passes or `interrupted` says
    /// so (`Ok(false)`). `now`: the time the loop was entered at ([`Driver::enter`], or
    /// [`Driver::catch_up`] just before the work was submitted).
    pub(crate) fn drive(
        &mut self,
        core: &mut Core,
        mut now: Instant,
        until: Option<Instant>,
        mut done: impl FnMut(&Core) -> bool,
        mut interrupted: impl FnMut() -> bool,
    ) -> io::Result<bool> {
        loop {
            self.turn(core, now);
            if done(core) {
                return Ok(true);
            }
            if interrupted() {
                return Ok(false);
            }
            if until.is_some_and(|u| now >= u) {
                return Ok(false);
            }
            now = self.wait(core, now, self.next_wake(core, until))?;
        }
    }

    /// When the loop must look again at the latest: at once when the core has news it did
    /// not step over yet (a round a failed socket decided), else its next timer.
    #[inline]
    pub(crate) fn next_wake(&self, core: &Core, until: Option<Instant>) -> Option<Instant> {
        if core.has_news() {
            return Some(self.left_loop);
        }
        core.next_timer(until)
    }

    /// One step of the core at `now`, then what it asks of the sockets, then its writes:
    /// whatever was submitted or advanced in one step goes out in one write per master.
    ///
    /// A timer due at `now` (a round's deadline, a stall) is judged only on what the sockets
    /// hold: what is ready is read first. Otherwise replies that came while this thread was
    /// not running (a loaded machine, a client back from its own work) would count as
    /// timed out.
    #[inline(always)]
    pub(crate) fn turn(&mut self, core: &mut Core, now: Instant) {
        if core.timer_due(now) {
            self.read_ready(core, now);
        }
        core.step(now);
        self.apply_actions(core, now);
        self.flush(core, now);
    }

    /// Enter the loop; returns the time. Time the client spent outside the loop (idle
    /// between calls) shifts the core's stall clocks (see `Rounds::shift_clocks`).
    pub(crate) fn enter(&mut self, core: &mut Core) -> Instant {
        let entered = Instant::now();
        self.shift(core, entered);
        entered
    }

    /// Tell the core how long the client was away (when at least `IDLE_SHIFT_MIN`);
    /// returns whether it was.
    fn shift(&mut self, core: &mut Core, entered: Instant) -> bool {
        let left = std::mem::replace(&mut self.left_loop, entered);
        // `entered - left < IDLE_SHIFT_MIN`, without the subtraction (the common case: a
        // client back within a millisecond).
        if entered < left + IDLE_SHIFT_MIN {
            return false;
        }
        core.shift_clocks(entered.saturating_duration_since(left), entered);
        true
    }

    /// Call before starting requests: after the client was away from the loop, read what
    /// the masters sent meanwhile (late replies, and above all closed connections: a
    /// master that restarted closed ours), so that the requests go out on a fresh
    /// connection rather than into one the master already closed. One `epoll_wait` that
    /// does not block; nothing at all when the client was back within `IDLE_SHIFT_MIN`
    /// (it read everything then). Returns the time it read last: requests submitted next
    /// start at it, and the loop that drives them ([`Driver::drive`]) enters at it.
    pub(crate) fn catch_up(&mut self, core: &mut Core) -> io::Result<Instant> {
        let entered = Instant::now();
        if !self.shift(core, entered) {
            return Ok(entered);
        }
        match self.poll(Some(Duration::ZERO)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(entered),
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        self.handle_events(core, now);
        self.left_loop = now;
        Ok(now)
    }

    /// One `epoll_wait` into the events buffer.
    #[inline]
    fn poll(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let events = self.events.get_or_insert_with(|| Events::with_capacity(64));
        self.poll.poll(events, timeout)
    }

    /// Read what the sockets hold now, without waiting (one `epoll_wait`).
    #[cold]
    fn read_ready(&mut self, core: &mut Core, now: Instant) {
        // Interrupted, or a poll that cannot work: the wait that follows says so.
        if let Ok(()) = self.poll(Some(Duration::ZERO)) {
            self.handle_events(core, now);
        }
    }

    /// Wait for readiness until `wake` at the latest (at once when busy-polling) and handle
    /// it; returns the time the wait ended. The clock is read once per poll.
    pub(crate) fn wait(
        &mut self,
        core: &mut Core,
        now: Instant,
        wake: Option<Instant>,
    ) -> io::Result<Instant> {
        let timeout = if self.busy_poll {
            Some(Duration::ZERO)
        } else {
            wake.map(|w| w.saturating_duration_since(now))
        };
        match self.poll(timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                self.left_loop = Instant::now();
                return Ok(self.left_loop);
            }
            Err(e) => return Err(e),
        }
        if self.busy_poll
            && timeout == Some(Duration::ZERO)
            && self.events.as_ref().is_some_and(Events::is_empty)
        {
            // Busy-poll found nothing: give the core away for a moment. Where the masters
            // share the machine (tests, benches, small hosts), a pure spin would steal the
            // very CPU the replies need; with a core to spare this costs one cheap syscall.
            std::thread::yield_now();
            self.left_loop = Instant::now();
            return Ok(self.left_loop);
        }
        let now = Instant::now();
        self.handle_events(core, now);
        self.left_loop = now;
        Ok(now)
    }

    /// Write every link's queued bytes that the core says may have some: one `write` per
    /// master when the kernel takes them all (the normal case). Bytes a link could not
    /// write wait for its writable event (or its connect).
    #[inline]
    pub(crate) fn flush(&mut self, core: &mut Core, now: Instant) {
        let (lock, sub) = core.flush_wanted();
        if lock || sub {
            self.flush_wanted(core, now);
        }
    }

    /// [`Driver::flush`] when some link may have bytes to write.
    #[inline(never)]
    fn flush_wanted(&mut self, core: &mut Core, now: Instant) {
        let n = self.n();
        let (socks, io, extra) = (&mut self.socks, &mut self.io, &self.extra_master);
        core.flush_with(now, |l, bytes| match socks.get_mut(l.0) {
            Some(Conn::Up(s)) => write_some(s, bytes, &mut io[master_index(n, extra, l)]),
            _ => Ok(0),
        });
        #[cfg(feature = "tls")]
        if self.tls {
            for l in 0..self.socks.len() {
                self.flush_tls(core, LinkId(l), now);
            }
        }
        self.apply_actions(core, now);
    }

    /// Do what the core asked of the sockets, in order.
    #[inline]
    pub(crate) fn apply_actions(&mut self, core: &mut Core, now: Instant) {
        while let Some(a) = core.take_action() {
            match a {
                Action::Connect(l) => self.connect(core, l, now),
                Action::Close { link, reset } => self.close(link, reset),
            }
        }
    }

    /// Handle the readiness events of the last poll.
    fn handle_events(&mut self, core: &mut Core, now: Instant) {
        // Handling an event needs `&mut self`: take the events out for the walk and put
        // them back after.
        let Some(events) = self.events.take() else {
            return;
        };
        for ev in events.iter() {
            let l = ev.token().0;
            if l >= self.socks.len() {
                // The waker (a resolver thread may have answered), or spurious.
                if self.resolving > 0 {
                    self.take_resolved(core, now);
                }
                continue;
            }
            let error = ev.is_error();
            let closed = ev.is_read_closed() || error;
            let readable = ev.is_readable() || closed;
            let writable = ev.is_writable() || ev.is_write_closed() || error;
            self.link_event(core, LinkId(l), readable, writable, closed, now);
            self.apply_actions(core, now);
        }
        self.events = Some(events);
    }

    /// A readiness event of link `l`.
    fn link_event(
        &mut self,
        core: &mut Core,
        l: LinkId,
        readable: bool,
        writable: bool,
        closed: bool,
        now: Instant,
    ) {
        match &mut self.socks[l.0] {
            Conn::Connecting(stream) => {
                if !writable && !readable {
                    return;
                }
                match stream.connected() {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(f) => return self.failed(core, l, f, now),
                }
                let Conn::Connecting(s) = std::mem::replace(&mut self.socks[l.0], Conn::Down)
                else {
                    unreachable!()
                };
                if s.is_tls() {
                    self.socks[l.0] = Conn::Handshaking(s);
                    core.handle_connect_phase(l, ConnectPhase::Tls);
                    // The ClientHello.
                    self.handshake(core, l, now);
                    return;
                }
                self.socks[l.0] = Conn::Up(s);
                core.handle_connected(l);
                self.write_link(core, l, now);
            }
            Conn::Handshaking(_) => {
                if readable || writable {
                    self.handshake(core, l, now);
                }
                return;
            }
            Conn::Up(_) => {
                // Edge-triggered: every readable edge reports writable too; most of them
                // find nothing to write.
                if writable && (core.has_output(l) || self.socks[l.0].tls_wants_write()) {
                    self.write_link(core, l, now);
                }
            }
            Conn::Down | Conn::Resolving => return,
        }
        if readable {
            self.read_link(core, l, closed, now);
        }
    }

    /// Drive a TLS handshake; once done the link is up and its queued bytes go out.
    #[cfg(feature = "tls")]
    fn handshake(&mut self, core: &mut Core, l: LinkId, now: Instant) {
        let m = self.master_of(l);
        let Conn::Handshaking(Stream::Tls(t)) = &mut self.socks[l.0] else {
            return;
        };
        match t.handshake(&mut self.io[m]) {
            Ok(false) => {}
            Ok(true) => {
                let Conn::Handshaking(s) = std::mem::replace(&mut self.socks[l.0], Conn::Down)
                else {
                    unreachable!()
                };
                self.socks[l.0] = Conn::Up(s);
                core.handle_connected(l);
                self.write_link(core, l, now);
                // Plaintext that came with the last handshake flight.
                self.read_link(core, l, false, now);
            }
            Err(f) => self.failed(core, l, f, now),
        }
    }

    #[cfg(not(feature = "tls"))]
    fn handshake(&mut self, _core: &mut Core, _l: LinkId, _now: Instant) {}

    /// Read until the socket is drained. `closed`: the peer's FIN (or an error) came with
    /// this event; read on to the end of stream rather than trusting a short read, since no
    /// further edge will announce it.
    fn read_link(&mut self, core: &mut Core, l: LinkId, closed: bool, now: Instant) {
        let m = self.master_of(l);
        let Conn::Up(stream) = &mut self.socks[l.0] else {
            return;
        };
        // A short read drained the socket: the next edge will tell us more.
        let drains = stream.short_read_drains() && !closed;
        let io = &mut self.io[m];
        let kick = core.read_with(l, now, |buf| {
            let space = buf.len();
            let k = read_some(stream, buf, io)?;
            Ok((k, !(drains && k < space)))
        });
        // What the replies let out (requests behind a confirmed AUTH, an `EVAL` retry),
        // and TLS records the reads call for.
        if kick || self.socks[l.0].tls_wants_write() {
            self.write_link(core, l, now);
        }
    }

    /// Write what link `l` may write, until the kernel would block.
    fn write_link(&mut self, core: &mut Core, l: LinkId, now: Instant) {
        let m = self.master_of(l);
        let (socks, io) = (&mut self.socks, &mut self.io[m]);
        core.write_with(l, now, |l, bytes| match &mut socks[l.0] {
            Conn::Up(s) => write_some(s, bytes, io),
            _ => Ok(0),
        });
        #[cfg(feature = "tls")]
        self.flush_tls(core, l, now);
    }

    /// Records rustls holds without plaintext of ours behind them (a TLS link).
    #[cfg(feature = "tls")]
    fn flush_tls(&mut self, core: &mut Core, l: LinkId, now: Instant) {
        let m = self.master_of(l);
        if let Conn::Up(Stream::Tls(t)) = &mut self.socks[l.0] {
            if t.wants_write() {
                if let Err(f) = t.flush(&mut self.io[m]) {
                    self.failed(core, l, f, now);
                }
            }
        }
    }

    /// Link `l`'s socket failed: tell the core (which fails what it owed and asks for the
    /// close, with a reset when requests were owed), then make sure the socket is gone.
    #[cold]
    fn failed(&mut self, core: &mut Core, l: LinkId, fault: Fault, now: Instant) {
        // The socket first: what the core asks next may be a new connection of the same
        // link (a cluster's discovery tries its next node at once).
        self.close(l, true);
        core.handle_closed(l, fault, now);
        self.apply_actions(core, now);
    }

    /// Close link `l`'s socket (if it has one). `reset`: a TCP reset rather than a FIN.
    fn close(&mut self, l: LinkId, reset: bool) {
        let Some(sock) = self.socks.get_mut(l.0) else {
            return; // a cluster's link never connected
        };
        match std::mem::replace(sock, Conn::Down) {
            Conn::Up(s) | Conn::Connecting(s) | Conn::Handshaking(s) => {
                s.close(self.poll.registry(), reset)
            }
            // A resolve in flight: its late answer is dropped (the link is not resolving).
            Conn::Down | Conn::Resolving => {}
        }
    }

    /// Open link `l`'s socket: resolve, connect (and TLS), as its master's URL says.
    fn connect(&mut self, core: &mut Core, l: LinkId, now: Instant) {
        let n = self.n();
        if l.0 >= 2 * n {
            // A cluster's link: its master, and a socket slot for it.
            let m = core.link_master(l);
            if self.socks.len() <= l.0 {
                self.socks.resize_with(l.0 + 1, || Conn::Down);
            }
            if self.extra_master.len() <= l.0 - 2 * n {
                self.extra_master.resize(l.0 - 2 * n + 1, m);
            }
            self.extra_master[l.0 - 2 * n] = m;
        }
        let m = self.master_of(l);
        self.close(l, false);
        let shard = core.link_addr(l);
        let stream = match &self.ends[m].target {
            // A cluster's shard primary, at the address its map gave.
            _ if shard.is_some() => self.open_tcp(m, shard.expect("tested")),
            &Target::Addr(addr) => self.open_tcp(m, addr),
            Target::Unix(path) => connect_unix(path)
                .map(Stream::Unix)
                .map_err(|e| Fault::Connect(e.kind())),
            Target::Host { .. } if l.0 < n || l.0 >= 2 * n => {
                return self.start_resolve(core, l, now)
            }
            // The sub link goes where the lock link's name resolved to last.
            Target::Host { .. } => match self.ends[m].addr {
                Some(addr) => self.open_tcp(m, addr),
                None => Err(Fault::Down),
            },
        };
        let registered = stream.and_then(|mut s| {
            s.register(self.poll.registry(), MioToken(l.0))
                .map(|()| s)
                .map_err(|e| Fault::Connect(e.kind()))
        });
        match registered {
            Ok(stream) => self.socks[l.0] = Conn::Connecting(stream),
            Err(f) => core.handle_closed(l, f, now),
        }
    }

    /// Start a TCP connect to `addr` for master `m`, with TLS when its URL asks.
    fn open_tcp(&self, m: usize, addr: SocketAddr) -> Result<Stream, Fault> {
        let tcp = connect_tcp(addr).map_err(|e| Fault::Connect(e.kind()))?;
        #[cfg(feature = "tls")]
        if let Some(target) = &self.ends[m].tls {
            return Ok(Stream::Tls(Box::new(tls::TlsStream::new(tcp, target)?)));
        }
        let _ = m;
        Ok(Stream::Tcp(tcp))
    }

    /// Resolve the host of lock link `l` on a helper thread: `getaddrinfo` blocks for as
    /// long as the system's resolver takes, and the loop must not. The answer comes back
    /// through `resolved` and a wake of the loop's waker ([`Driver::take_resolved`]);
    /// requests queue in the core meanwhile. The core's connect timeout covers the
    /// resolve: past it the master is down (its thread's late answer is dropped). One
    /// thread per master at a time: while an old one still hangs, the master stays down.
    fn start_resolve(&mut self, core: &mut Core, l: LinkId, now: Instant) {
        let m = self.master_of(l);
        let link = l.0;
        let end = &mut self.ends[m];
        let Target::Host { host, port } = &end.target else {
            unreachable!("only host names are resolved")
        };
        if end.resolving {
            let f = Fault::Resolve(ErrorText::new(b"timed out (the last resolve still runs)"));
            core.handle_closed(l, f, now);
            return;
        }
        let (host, port) = (host.clone(), *port);
        end.resolve_gen += 1;
        let gen = end.resolve_gen;
        let results = self.resolved.clone();
        let waker = self.waker.clone();
        let spawned = std::thread::Builder::new()
            .name("redlock-resolve".into())
            .spawn(move || {
                let answer = match (&*host, port).to_socket_addrs() {
                    Ok(addrs) => crate::url::pick_addr(&addrs.collect::<Vec<_>>())
                        .ok_or_else(|| ErrorText::new(b"no addresses")),
                    Err(e) => {
                        let msg = e.to_string();
                        // std prefixes getaddrinfo's words with this; keep the words.
                        let msg = msg
                            .strip_prefix("failed to lookup address information: ")
                            .unwrap_or(&msg);
                        Err(ErrorText::new(msg.as_bytes()))
                    }
                };
                if let Ok(mut r) = results.lock() {
                    r.push((m, link, gen, answer));
                }
                let _ = waker.wake();
            });
        if let Err(e) = spawned {
            let f = Fault::Resolve(ErrorText::new(
                format!("cannot start a resolver thread: {e}").as_bytes(),
            ));
            core.handle_closed(l, f, now);
            return;
        }
        self.ends[m].resolving = true;
        self.resolving += 1;
        self.socks[l.0] = Conn::Resolving;
        core.handle_connect_phase(l, ConnectPhase::Resolving);
    }

    /// Take the resolver threads' answers: connect where a lock link still waits for one,
    /// fail it where its host did not resolve.
    #[cold]
    fn take_resolved(&mut self, core: &mut Core, now: Instant) {
        let answers = match self.resolved.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(_) => return,
        };
        for (m, link, gen, answer) in answers {
            self.resolving -= 1;
            let end = &mut self.ends[m];
            end.resolving = false;
            if !matches!(self.socks[link], Conn::Resolving) || end.resolve_gen != gen {
                continue; // timed out meanwhile: the master is down already
            }
            if let Ok(addr) = &answer {
                end.addr = Some(*addr);
            }
            let l = LinkId(link);
            let stream = answer.map_err(Fault::Resolve).and_then(|addr| {
                let mut s = self.open_tcp(m, addr)?;
                s.register(self.poll.registry(), MioToken(link))
                    .map_err(|e| Fault::Connect(e.kind()))?;
                Ok(s)
            });
            match stream {
                Ok(s) => {
                    self.socks[link] = Conn::Connecting(s);
                    core.handle_connect_phase(l, ConnectPhase::Connecting);
                }
                Err(f) => {
                    self.socks[link] = Conn::Down;
                    core.handle_closed(l, f, now);
                }
            }
            self.apply_actions(core, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Master, NetConfig, Rounds, Settings};
    use crate::rules::{Outcome, Request};

    /// A resolve that outlives the connect timeout: the master is down with
    /// `Fault::Resolve("timed out")` at once, and the late answer is dropped when it comes.
    #[test]
    fn a_resolve_past_the_connect_timeout_is_dropped() {
        let now = Instant::now();
        let target = Target::Host {
            host: Arc::from("localhost"),
            port: 1,
        };
        let cfg = NetConfig::default();
        let (connect_timeout, backoff_max) = (cfg.connect_timeout, cfg.backoff_max);
        let master = Master::new(Arc::from("localhost:1"), None, None, 0);
        let rounds = Rounds::new(vec![master], cfg, now);
        let settings = Settings::for_tests();
        let tokens = crate::token::TokenSource::new().unwrap();
        let mut core = Core::new(rounds, settings, tokens, Some(1), now, 0).unwrap();
        let mut d = Driver::new(vec![Peer::new(target)], false, now).unwrap();
        let token = crate::token::TokenSource::new().unwrap().next().unwrap();
        let keys: [&[u8]; 1] = [b"k"];
        let start = |core: &mut Core, d: &mut Driver, now| {
            let op = core.rounds.start(
                Request::Acquire,
                |a| a.set(keys, token, 1000),
                Duration::from_secs(5),
                now,
                |_| true,
                None,
            );
            d.apply_actions(core, now);
            op
        };
        let op = start(&mut core, &mut d, now);
        assert!(matches!(d.socks[0], Conn::Resolving));
        assert_eq!(d.resolving, 1);
        // The connect timeout passes before anyone looks at the answer.
        let late = now + connect_timeout;
        core.step(late);
        d.apply_actions(&mut core, late);
        let timed_out = Fault::Resolve(ErrorText::new(b"timed out"));
        assert!(matches!(d.socks[0], Conn::Down));
        assert_eq!(core.stats()[0].last_fault(), Some(timed_out));
        assert_eq!(
            core.rounds.op(op).tally.outcomes()[0],
            Outcome::Failed(timed_out),
            "the op owed by the master failed with it"
        );
        // The thread's answer arrives (a wake), and is dropped: the master stays down.
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.resolving > 0 && Instant::now() < deadline {
            let wake = Some(Instant::now() + Duration::from_millis(10));
            d.wait(&mut core, Instant::now(), wake).unwrap();
        }
        assert_eq!(d.resolving, 0);
        assert!(!d.ends[0].resolving);
        assert!(matches!(d.socks[0], Conn::Down));
        // After the backoff, a new resolve starts (the old thread is done).
        let after_backoff = late + backoff_max;
        let op = start(&mut core, &mut d, after_backoff);
        assert!(
            matches!(d.socks[0], Conn::Resolving),
            "{:?}",
            core.rounds.op(op).tally.outcomes()
        );
    }
}
