//! Emulated links (`PEERS_HOT_DELAY_US`): a TCP proxy in front of each local master that
//! holds every byte for a fixed one-way delay, each direction, so the masters behave as if
//! on other hosts. On this VM the masters share two cores with the clients, so a loopback
//! "round trip" is mostly the five masters' CPU time one after another; behind the proxy
//! it is mostly the link, as between hosts.
//!
//! One thread serves every proxy and connection: a mio loop, with a `timerfd` for the due
//! times (epoll's own timeout has a resolution of 1 ms, far coarser than the delays).
//! Bytes read are stamped with their due time and written when it comes, in order (the
//! delay is the same for all). Dropping the [`DelayNet`] stops the thread and closes
//! every socket.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

const WAKER: Token = Token(usize::MAX - 1);
const TIMER: Token = Token(usize::MAX - 2);
/// Tokens below this are listeners (one per master); above, two per connection.
const CONN_BASE: usize = 1 << 20;

/// The proxies in front of a set of masters, and the thread that runs them.
pub struct DelayNet {
    addrs: Vec<SocketAddr>,
    waker: Arc<Waker>,
    thread: Option<thread::JoinHandle<()>>,
}

impl DelayNet {
    /// A proxy on a free loopback port for each of `targets`.
    pub fn start(targets: &[SocketAddr], delay: Duration) -> io::Result<DelayNet> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for (i, _) in targets.iter().enumerate() {
            let mut l = TcpListener::bind("127.0.0.1:0".parse().unwrap())?;
            poll.registry()
                .register(&mut l, Token(i), Interest::READABLE)?;
            addrs.push(l.local_addr()?);
            listeners.push(l);
        }
        // SAFETY: timerfd_create has no preconditions; the result is checked.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let timer = unsafe { OwnedFd::from_raw_fd(fd) };
        poll.registry()
            .register(&mut SourceFd(&timer.as_raw_fd()), TIMER, Interest::READABLE)?;
        let mut net = Net {
            poll,
            listeners,
            targets: targets.to_vec(),
            delay,
            conns: Vec::new(),
            due: BinaryHeap::new(),
            timer,
            armed: None,
        };
        let thread = thread::Builder::new()
            .name("delay-net".into())
            .spawn(move || net.run())?;
        Ok(DelayNet {
            addrs,
            waker,
            thread: Some(thread),
        })
    }

    /// The proxies' addresses, in the order of the targets.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

impl Drop for DelayNet {
    fn drop(&mut self) {
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One direction of a connection: what was read, each chunk with its due time.
#[derive(Default)]
struct Lane {
    queue: VecDeque<(Instant, Vec<u8>)>,
    /// How much of the front chunk was written already.
    written: usize,
}

struct Pair {
    /// [0]: the client's side, [1]: the master's side.
    socks: [TcpStream; 2],
    /// [0]: client to master, [1]: master to client.
    lanes: [Lane; 2],
}

struct Net {
    poll: Poll,
    listeners: Vec<TcpListener>,
    targets: Vec<SocketAddr>,
    delay: Duration,
    conns: Vec<Option<Pair>>,
    /// (due, connection, lane): a lane has bytes due then.
    due: BinaryHeap<Reverse<(Instant, usize, usize)>>,
    timer: OwnedFd,
    armed: Option<Instant>,
}

impl Net {
    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            self.flush_due(now);
            self.arm();
            if self.poll.poll(&mut events, None).is_err() {
                return;
            }
            for e in events.iter() {
                match e.token() {
                    WAKER => return,
                    TIMER => {
                        let mut buf = [0u8; 8];
                        // SAFETY: reads 8 bytes into a buffer of 8 from our own timerfd.
                        unsafe {
                            libc::read(self.timer.as_raw_fd(), buf.as_mut_ptr().cast(), 8);
                        }
                        self.armed = None;
                    }
                    Token(i) if i < CONN_BASE => self.accept(i),
                    Token(t) => {
                        let (c, side) = ((t - CONN_BASE) / 2, (t - CONN_BASE) % 2);
                        if e.is_readable() || e.is_read_closed() {
                            self.read(c, side);
                        }
                        if e.is_writable() {
                            // The lane that writes to this side.
                            self.write(c, 1 - side, Instant::now());
                        }
                    }
                }
            }
        }
    }

    fn accept(&mut self, i: usize) {
        while let Ok((mut client, _)) = self.listeners[i].accept() {
            let Ok(server) = std::net::TcpStream::connect(self.targets[i]) else {
                continue;
            };
            let _ = server.set_nonblocking(true);
            let mut server = TcpStream::from_std(server);
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let c = self.conns.len();
            let r = self.poll.registry();
            let both = Interest::READABLE | Interest::WRITABLE;
            if r.register(&mut client, Token(CONN_BASE + 2 * c), both)
                .is_err()
                || r.register(&mut server, Token(CONN_BASE + 2 * c + 1), both)
                    .is_err()
            {
                continue;
            }
            self.conns.push(Some(Pair {
                socks: [client, server],
                lanes: [Lane::default(), Lane::default()],
            }));
        }
    }

    /// Read all `side` has; its bytes go into the lane from that side.
    fn read(&mut self, c: usize, side: usize) {
        let Some(pair) = self.conns[c].as_mut() else {
            return;
        };
        let mut buf = [0u8; 16 * 1024];
        loop {
            match pair.socks[side].read(&mut buf) {
                Ok(0) => return self.close(c),
                Ok(n) => {
                    let due = Instant::now() + self.delay;
                    pair.lanes[side].queue.push_back((due, buf[..n].to_vec()));
                    self.due.push(Reverse((due, c, side)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(c),
            }
        }
    }

    /// Write what is due of `lane` to the other side.
    fn write(&mut self, c: usize, lane: usize, now: Instant) {
        let Some(pair) = self.conns[c].as_mut() else {
            return;
        };
        let to = 1 - lane;
        let Pair { socks, lanes } = pair;
        let l = &mut lanes[lane];
        while let Some((due, bytes)) = l.queue.front() {
            if *due > now {
                return;
            }
            match socks[to].write(&bytes[l.written..]) {
                Ok(n) => {
                    l.written += n;
                    if l.written == bytes.len() {
                        l.queue.pop_front();
                        l.written = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(c),
            }
        }
    }

    fn close(&mut self, c: usize) {
        if let Some(mut pair) = self.conns[c].take() {
            for s in pair.socks.iter_mut() {
                let _ = self.poll.registry().deregister(s);
            }
        }
    }

    fn flush_due(&mut self, now: Instant) {
        while let Some(Reverse((due, c, lane))) = self.due.peek().copied() {
            if due > now {
                return;
            }
            self.due.pop();
            self.write(c, lane, now);
        }
    }

    /// Arm the timer for the next due time (past due: at once).
    fn arm(&mut self) {
        let Some(Reverse((next, _, _))) = self.due.peek().copied() else {
            return;
        };
        if self.armed == Some(next) {
            return;
        }
        let left = next
            .saturating_duration_since(Instant::now())
            .max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: a valid itimerspec for our own timerfd.
        unsafe {
            libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut());
        }
        self.armed = Some(next);
    }
}
