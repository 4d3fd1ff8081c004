//! The plain-socket pipelined floor of a lock+release cycle, shared by the benches.
//!
//! One std `TcpStream` per master. A cycle writes `K` x `SET k v NX PX ttl` to every master
//! (one write each), reads the `K` replies from each, then does the same with `K` x
//! `EVALSHA release`. No parsing beyond counting reply lines: every reply here is one line
//! (`+OK`, `$-1`, `:1`), or two for the `SCRIPT LOAD` bulk.

#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use redlock_mux::resp::{encode_command, Arg};

/// The floor's release: the Redis page's compare-and-delete, one key (not the crate's
/// `scripts::RELEASE`, which declares each key's line and liveness set beside it: given one
/// key it read no key at all, and the floor's releases did nothing, 2026-11-28).
const FLOOR_RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
/// Its SHA1 (what `SCRIPT LOAD` of it answers).
const FLOOR_RELEASE_SHA: &str = "e9f69f2beb755be68b5e456ee2ce9aadfbc4ebf4";

/// TTL used by the floor's `SET`s.
pub const TTL: Duration = Duration::from_secs(10);

pub struct Floor {
    socks: Vec<TcpStream>,
    buf: Vec<u8>,
    rd: Vec<u8>,
    counter: u64,
    busy: bool,
    keys: Vec<String>,
}

impl Floor {
    /// Connect to every master; `busy` = non-blocking sockets, spinning on `read`.
    pub fn new(addrs: &[SocketAddr], busy: bool) -> Floor {
        let socks: Vec<TcpStream> = addrs
            .iter()
            .map(|a| {
                let s = TcpStream::connect(a).unwrap();
                s.set_nodelay(true).unwrap();
                s
            })
            .collect();
        let mut f = Floor {
            socks,
            buf: Vec::with_capacity(64 * 1024),
            rd: vec![0; 64 * 1024],
            counter: 0,
            busy: false,
            keys: (0..1024).map(|k| format!("floor:{k}")).collect(),
        };
        f.buf.clear();
        encode_command(
            &mut f.buf,
            &[
                Arg::Bytes(b"SCRIPT"),
                Arg::Bytes(b"LOAD"),
                Arg::Bytes(FLOOR_RELEASE.as_bytes()),
            ],
        );
        f.fan_out(2).unwrap();
        for s in &f.socks {
            s.set_nonblocking(busy).unwrap();
        }
        f.busy = busy;
        f
    }

    /// Write `buf` to every master, then read until `lines` reply lines came from each.
    fn fan_out(&mut self, lines: usize) -> io::Result<()> {
        for s in &mut self.socks {
            s.write_all(&self.buf)?;
        }
        for s in &mut self.socks {
            let mut seen = 0;
            while seen < lines {
                match s.read(&mut self.rd) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => seen += self.rd[..n].iter().filter(|b| **b == b'\n').count(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.busy => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// One lock+release cycle on one key: (acquire time, release time).
    pub fn cycle(&mut self) -> (Duration, Duration) {
        let t0 = Instant::now();
        self.acquire(1);
        let t1 = Instant::now();
        self.release(1);
        (t1 - t0, t1.elapsed())
    }

    /// `k` independent lock+release cycles pipelined: `k` SETs per write, then `k`
    /// releases per write.
    pub fn cycle_k(&mut self, k: usize) {
        self.acquire(k);
        self.release(k);
    }

    fn token(counter: u64, j: usize) -> [u8; 32] {
        let mut t = [b'0'; 32];
        let v = counter.wrapping_mul(1024).wrapping_add(j as u64);
        for (i, c) in t.iter_mut().rev().take(16).enumerate() {
            *c = b"0123456789abcdef"[((v >> (4 * i)) & 15) as usize];
        }
        t
    }

    fn acquire(&mut self, k: usize) {
        self.counter += 1;
        self.buf.clear();
        for j in 0..k {
            let token = Self::token(self.counter, j);
            encode_command(
                &mut self.buf,
                &[
                    Arg::Bytes(b"SET"),
                    Arg::Bytes(self.keys[j].as_bytes()),
                    Arg::Bytes(&token),
                    Arg::Bytes(b"NX"),
                    Arg::Bytes(b"PX"),
                    Arg::Uint(TTL.as_millis() as u64),
                ],
            );
        }
        self.fan_out(k).unwrap();
    }

    fn release(&mut self, k: usize) {
        self.buf.clear();
        for j in 0..k {
            let token = Self::token(self.counter, j);
            encode_command(
                &mut self.buf,
                &[
                    Arg::Bytes(b"EVALSHA"),
                    Arg::Bytes(FLOOR_RELEASE_SHA.as_bytes()),
                    Arg::Uint(1),
                    Arg::Bytes(self.keys[j].as_bytes()),
                    Arg::Bytes(&token),
                ],
            );
        }
        self.fan_out(k).unwrap();
    }
}
