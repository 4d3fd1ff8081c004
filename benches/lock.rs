//! Lock+release cycle latency: redlock-mux next to the plain-socket floor, in one run.
//!
//! Starts its own local `redis-server` masters. First a percentile pass (criterion reports
//! means and medians, not tails) that interleaves every variant in blocks, so machine noise
//! hits them alike, and prints p50/p90/p99/p99.9, ratios to the floor, and client CPU per
//! cycle from `getrusage`. Then the criterion groups.
//!
//! The floor: blocking std sockets, one per master; write `SET k v NX PX` to all, read all
//! replies; write `EVALSHA release` to all, read all. The busy floor does the same on
//! non-blocking sockets, spinning on `read`.
//!
//! `cargo bench --bench lock` (all); `LOCK_BENCH_CYCLES=20000 cargo bench --bench lock --
//! --skip-criterion` style knobs: `LOCK_BENCH_CYCLES` (percentile pass cycles per variant,
//! default 4000), `LOCK_BENCH_SKIP_CRITERION=1`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use redlock_mux::local::LocalMasters;
use redlock_mux::resp::{encode_command, Arg};
use redlock_mux::{scripts, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// The plain-socket pipelined floor.
struct Floor {
    socks: Vec<TcpStream>,
    buf: Vec<u8>,
    rd: [u8; 256],
    counter: u64,
    busy: bool,
}

impl Floor {
    fn new(m: &LocalMasters, busy: bool) -> Floor {
        let socks: Vec<TcpStream> = m
            .addrs()
            .into_iter()
            .map(|a| {
                let s = TcpStream::connect(a).unwrap();
                s.set_nodelay(true).unwrap();
                s
            })
            .collect();
        let mut f = Floor {
            socks,
            buf: Vec::with_capacity(512),
            rd: [0; 256],
            counter: 0,
            busy: false,
        };
        // Load the release script so EVALSHA works, then switch mode.
        f.buf.clear();
        encode_command(
            &mut f.buf,
            &[
                Arg::Bytes(b"SCRIPT"),
                Arg::Bytes(b"LOAD"),
                Arg::Bytes(scripts::RELEASE.src.as_bytes()),
            ],
        );
        f.fan_out().unwrap();
        for s in &f.socks {
            s.set_nonblocking(busy).unwrap();
        }
        f.busy = busy;
        f
    }

    /// Write `buf` to every master, then read one reply from each.
    fn fan_out(&mut self) -> io::Result<()> {
        for s in &mut self.socks {
            s.write_all(&self.buf)?;
        }
        for s in &mut self.socks {
            let mut have = 0;
            // Every reply here is one line (+OK, $-1, :1, $40 sha...): read to its last LF.
            loop {
                match s.read(&mut self.rd[have..]) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => {
                        have += n;
                        let lfs = self.rd[..have].iter().filter(|b| **b == b'\n').count();
                        let need = if self.rd[0] == b'$' && self.rd[1] != b'-' {
                            2
                        } else {
                            1
                        };
                        if lfs >= need {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.busy => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    fn cycle(&mut self) -> (Duration, Duration) {
        self.counter += 1;
        let mut token = [0u8; 32];
        let hex = format!("{:032x}", self.counter);
        token.copy_from_slice(hex.as_bytes());
        let t0 = Instant::now();
        self.buf.clear();
        encode_command(
            &mut self.buf,
            &[
                Arg::Bytes(b"SET"),
                Arg::Bytes(b"floor"),
                Arg::Bytes(&token),
                Arg::Bytes(b"NX"),
                Arg::Bytes(b"PX"),
                Arg::Uint(TTL.as_millis() as u64),
            ],
        );
        self.fan_out().unwrap();
        let t1 = Instant::now();
        self.buf.clear();
        encode_command(
            &mut self.buf,
            &[
                Arg::Bytes(b"EVALSHA"),
                Arg::Bytes(scripts::RELEASE.sha.as_bytes()),
                Arg::Uint(1),
                Arg::Bytes(b"floor"),
                Arg::Bytes(&token),
            ],
        );
        self.fan_out().unwrap();
        (t1 - t0, t1.elapsed())
    }
}

fn ours(m: &LocalMasters, busy: bool) -> Redlock {
    Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .busy_poll(busy)
        .build()
        .unwrap()
}

fn our_cycle(c: &mut Redlock, key: &str) -> (Duration, Duration) {
    let t0 = Instant::now();
    let lock = c.try_lock(key, TTL).unwrap();
    let t1 = Instant::now();
    c.release(lock).unwrap();
    (t1 - t0, t1.elapsed())
}

fn cpu_now() -> (Duration, Duration) {
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0);
    let tv =
        |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

struct Stats {
    name: String,
    cycle: Vec<u64>,
    user: Duration,
    sys: Duration,
}

fn pct(v: &[u64], p: f64) -> u64 {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn percentile_pass(n_masters: usize) {
    let m = LocalMasters::start(n_masters).expect("local masters (is redis-server installed?)");
    let cycles: usize = std::env::var("LOCK_BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    type Runner = Box<dyn FnMut() -> (Duration, Duration)>;
    let mut variants: Vec<(String, Runner)> = Vec::new();
    let mut floor = Floor::new(&m, false);
    variants.push((
        "floor (std sockets)".into(),
        Box::new(move || floor.cycle()),
    ));
    let mut fb = Floor::new(&m, true);
    variants.push(("floor busy-poll".into(), Box::new(move || fb.cycle())));
    let mut c = ours(&m, false);
    variants.push((
        "redlock-mux".into(),
        Box::new(move || our_cycle(&mut c, "mux")),
    ));
    let mut cb = ours(&m, true);
    variants.push((
        "redlock-mux busy-poll".into(),
        Box::new(move || our_cycle(&mut cb, "muxbusy")),
    ));
    let mut stats: Vec<Stats> = variants
        .iter()
        .map(|(n, _)| Stats {
            name: n.clone(),
            cycle: Vec::with_capacity(cycles),
            user: Duration::ZERO,
            sys: Duration::ZERO,
        })
        .collect();
    // Warm up, then interleave blocks of 200 cycles per variant.
    for (_, run) in variants.iter_mut() {
        for _ in 0..500 {
            run();
        }
    }
    let block = 200;
    let mut done = 0;
    while done < cycles {
        let k = block.min(cycles - done);
        for (vi, (_, run)) in variants.iter_mut().enumerate() {
            let (u0, s0) = cpu_now();
            for _ in 0..k {
                let (a, r) = run();
                stats[vi].cycle.push((a + r).as_nanos() as u64);
            }
            let (u1, s1) = cpu_now();
            stats[vi].user += u1 - u0;
            stats[vi].sys += s1 - s0;
        }
        done += k;
    }
    for s in stats.iter_mut() {
        s.cycle.sort_unstable();
    }
    let f50 = pct(&stats[0].cycle, 0.5) as f64;
    let f99 = pct(&stats[0].cycle, 0.99) as f64;
    let fcpu = (stats[0].user + stats[0].sys).as_nanos() as f64 / cycles as f64;
    println!(
        "\nlock+release cycle, {n_masters} local masters, {cycles} cycles per variant (interleaved)"
    );
    println!(
        "{:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>7}",
        "variant",
        "p50 µs",
        "p90",
        "p99",
        "p99.9",
        "max",
        "p50/fl",
        "p99/fl",
        "user µs",
        "sys µs",
        "cpu/fl"
    );
    for s in &stats {
        let us = |ns: u64| ns as f64 / 1000.0;
        let cpu = (s.user + s.sys).as_nanos() as f64 / cycles as f64;
        println!(
            "{:<24} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>8.2} {:>8.2} {:>7.2}",
            s.name,
            us(pct(&s.cycle, 0.5)),
            us(pct(&s.cycle, 0.9)),
            us(pct(&s.cycle, 0.99)),
            us(pct(&s.cycle, 0.999)),
            us(*s.cycle.last().unwrap()),
            pct(&s.cycle, 0.5) as f64 / f50,
            pct(&s.cycle, 0.99) as f64 / f99,
            s.user.as_nanos() as f64 / 1000.0 / cycles as f64,
            s.sys.as_nanos() as f64 / 1000.0 / cycles as f64,
            cpu / fcpu,
        );
    }
}

fn criterion_cycles(c: &mut Criterion) {
    for n in [1usize, 5] {
        let m = LocalMasters::start(n).expect("local masters");
        let mut g = c.benchmark_group(format!("cycle/{n}-masters"));
        g.measurement_time(Duration::from_secs(3));
        g.warm_up_time(Duration::from_millis(500));
        let mut floor = Floor::new(&m, false);
        g.bench_function("floor", |b| b.iter(|| floor.cycle()));
        let mut cl = ours(&m, false);
        g.bench_function("redlock-mux", |b| b.iter(|| our_cycle(&mut cl, "crit")));
        let mut cb = ours(&m, true);
        g.bench_function("redlock-mux busy-poll", |b| {
            b.iter(|| our_cycle(&mut cb, "critbusy"))
        });
        g.finish();
    }
}

criterion_group!(benches, criterion_cycles);

fn main() {
    for n in [5usize, 1] {
        percentile_pass(n);
    }
    if std::env::var_os("LOCK_BENCH_SKIP_CRITERION").is_none() {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
}
