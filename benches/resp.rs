//! RESP parsing: `redlock_mux::resp` beside the `redis-protocol` crate's zero-copy
//! `decode_range` (its RESP2 and RESP3 modules, each where it reads the input: the RESP3 one
//! takes `$-1` for a streamed string, the RESP2 one does not know `_`) and redis-rs's parser
//! (`redis::Parser`, reused across iterations), on the replies a lock client gets.
//!
//! Each input is a criterion group (`Throughput::Bytes`) with one function per
//! implementation, so they print side by side. Aggregates are walked fully by every
//! implementation (ours walks lazily, the others have built a tree already).
//!
//! `cargo bench --bench resp` (about 2 s of measurement per function), or
//! `cargo bench --bench resp -- --quick` for a fast look. For instruction counts instead of
//! times, see [`count_loop`] (`RESP_LOOP`).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BenchmarkGroup, Criterion, Throughput};
use redis_protocol::resp2::types::RangeFrame as R2;
use redis_protocol::resp3::types::RangeFrame as R3;
use redlock_mux::resp::{parse, Frame, Limits, Status};

/// The seven replies a lock client really gets (SET NX PX, the release/extend scripts).
const LOCK_REPLIES: [&[u8]; 7] = [
    b"+OK\r\n",
    b"$-1\r\n",
    b"_\r\n",
    b":1\r\n",
    b":0\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"-ERR wrong number of arguments\r\n",
];

const SINGLE_NAMES: [&str; 7] = [
    "ok",
    "null_bulk",
    "null_resp3",
    "int_1",
    "int_0",
    "noscript",
    "err_args",
];

/// 64 replies cycling through the six replies of one protocol version: a RESP2 connection
/// gets `$-1` for "no value", a RESP3 one `_` (`redis-protocol`'s RESP3 module reads `$-1`
/// as a streamed string, its RESP2 module does not know `_`, so neither reads a mix).
fn pipeline64(resp3: bool) -> Vec<u8> {
    let six: Vec<&[u8]> = LOCK_REPLIES
        .iter()
        .copied()
        .filter(|r| {
            *r != if resp3 {
                &b"$-1\r\n"[..]
            } else {
                &b"_\r\n"[..]
            }
        })
        .collect();
    assert_eq!(six.len(), 6);
    (0..64).flat_map(|i| six[i % 6].iter().copied()).collect()
}

fn bulk4k() -> Vec<u8> {
    let mut v = b"$4096\r\n".to_vec();
    v.extend((0..4096u32).map(|i| b'a' + (i % 26) as u8));
    v.extend_from_slice(b"\r\n");
    v
}

/// Three levels of arrays, 21 elements in all (RESP2, so every parser can read it).
fn nested() -> Vec<u8> {
    let mut v = b"*3\r\n".to_vec();
    for i in 0..3 {
        v.extend_from_slice(format!("*3\r\n$6\r\nlock:{i}\r\n:{}\r\n", 30000 + i).as_bytes());
        v.extend_from_slice(b"*2\r\n+OK\r\n$5\r\nhello\r\n");
    }
    v
}

/// Whether `redis_protocol::resp2` reads all of `input` (else it is left out of the group).
fn is_resp2(input: &[u8]) -> bool {
    let mut pos = 0;
    while pos < input.len() {
        match redis_protocol::resp2::decode::decode_range(&input[pos..]) {
            Ok(Some((_, used))) => pos += used,
            _ => return false,
        }
    }
    true
}

/// Whether `redis_protocol::resp3` reads all of `input` as complete frames.
fn is_resp3(input: &[u8]) -> bool {
    let mut pos = 0;
    while pos < input.len() {
        match redis_protocol::resp3::decode::complete::decode_range(&input[pos..]) {
            Ok(Some((_, used))) => pos += used,
            _ => return false,
        }
    }
    true
}

// --- ours -------------------------------------------------------------------------------

fn walk_ours(f: &Frame<'_>) -> u64 {
    match *f {
        Frame::Simple(s) | Frame::Error(s) | Frame::Bulk(s) => s.len() as u64,
        Frame::Integer(i) => i as u64,
        Frame::Aggregate(a) => a.iter().map(|e| walk_ours(&e)).sum::<u64>() + 1,
        _ => 1,
    }
}

/// Parse every frame of `buf`, walking aggregates; returns a checksum.
fn ours_all(buf: &[u8], limits: &Limits) -> u64 {
    let mut pos = 0;
    let mut sum = 0;
    while pos < buf.len() {
        match parse(&buf[pos..], limits) {
            Ok(Status::Complete((f, used))) => {
                sum += walk_ours(&f);
                pos += used;
            }
            other => panic!("ours: {other:?}"),
        }
    }
    sum
}

// --- redis-protocol ---------------------------------------------------------------------

fn walk_r2(f: &R2) -> u64 {
    match f {
        R2::SimpleString(r) | R2::Error(r) | R2::BulkString(r) => (r.1 - r.0) as u64,
        R2::Integer(i) => *i as u64,
        R2::Array(v) => v.iter().map(walk_r2).sum::<u64>() + 1,
        R2::Null => 1,
    }
}

fn walk_r3(f: &R3) -> u64 {
    match f {
        R3::SimpleString { data, .. }
        | R3::SimpleError { data, .. }
        | R3::BlobString { data, .. } => (data.1 - data.0) as u64,
        R3::Number { data, .. } => *data as u64,
        R3::Array { data, .. } | R3::Push { data, .. } => data.iter().map(walk_r3).sum::<u64>() + 1,
        _ => 1,
    }
}

fn r2_all(buf: &[u8]) -> u64 {
    let mut pos = 0;
    let mut sum = 0;
    while pos < buf.len() {
        match redis_protocol::resp2::decode::decode_range(&buf[pos..]) {
            Ok(Some((f, used))) => {
                sum += walk_r2(&f);
                pos += used;
            }
            other => panic!("redis-protocol resp2: {other:?}"),
        }
    }
    sum
}

fn r3_all(buf: &[u8]) -> u64 {
    let mut pos = 0;
    let mut sum = 0;
    while pos < buf.len() {
        match redis_protocol::resp3::decode::complete::decode_range(&buf[pos..]) {
            Ok(Some((f, used))) => {
                sum += walk_r3(&f);
                pos += used;
            }
            other => panic!("redis-protocol resp3: {other:?}"),
        }
    }
    sum
}

// --- redis-rs ---------------------------------------------------------------------------

fn walk_rs(v: &redis::Value) -> u64 {
    use redis::Value;
    match v {
        Value::Int(i) => *i as u64,
        Value::BulkString(b) => b.len() as u64,
        Value::SimpleString(s) => s.len() as u64,
        Value::Array(v) | Value::Set(v) => v.iter().map(walk_rs).sum::<u64>() + 1,
        _ => 1,
    }
}

/// Parse `frames` values from `buf` with a reused parser (as a connection would).
fn rs_all(p: &mut redis::Parser, buf: &[u8], frames: usize) -> u64 {
    let mut reader = buf;
    let mut sum = 0;
    for _ in 0..frames {
        match p.parse_value(&mut reader) {
            Ok(v) => sum += walk_rs(&v),
            Err(e) => panic!("redis-rs: {e:?}"),
        }
    }
    sum
}

// --- the groups -------------------------------------------------------------------------

fn count_frames(buf: &[u8]) -> usize {
    let limits = Limits::default();
    let mut pos = 0;
    let mut n = 0;
    while pos < buf.len() {
        let Ok(Status::Complete((_, used))) = parse(&buf[pos..], &limits) else {
            panic!("bench input does not parse")
        };
        pos += used;
        n += 1;
    }
    n
}

/// One group: `input` (one or more whole frames) through every implementation.
fn compare(c: &mut Criterion, name: &str, input: &[u8]) {
    let limits = Limits::default();
    let frames = count_frames(input);
    // Every implementation reads the whole input before it is timed.
    ours_all(input, &limits);
    let mut rs = redis::Parser::new();
    rs_all(&mut rs, input, frames);
    assert!(
        rs_all(&mut rs, b"+x\r\n", 1) == 1,
        "redis-rs parser kept state"
    );

    let mut g: BenchmarkGroup<'_, _> = c.benchmark_group(name);
    g.throughput(Throughput::Bytes(input.len() as u64));
    g.bench_function("ours", |b| {
        b.iter(|| ours_all(black_box(input), black_box(&limits)))
    });
    if is_resp2(input) {
        g.bench_function("redis-protocol-resp2", |b| {
            b.iter(|| r2_all(black_box(input)))
        });
    }
    if is_resp3(input) {
        g.bench_function("redis-protocol-resp3", |b| {
            b.iter(|| r3_all(black_box(input)))
        });
    }
    g.bench_function("redis-rs", |b| {
        b.iter(|| rs_all(&mut rs, black_box(input), frames))
    });
    g.finish();
}

fn singles(c: &mut Criterion) {
    for (name, input) in SINGLE_NAMES.iter().zip(LOCK_REPLIES) {
        compare(c, name, input);
    }
}

/// The seven lock replies in sequence, each parsed on its own (as separate reads would).
/// `redis-protocol` reads each with the module that accepts it: RESP2 (its faster one) for
/// all but `_`, RESP3 for `_`.
fn lock_mix(c: &mut Criterion) {
    let limits = Limits::default();
    let use_resp2: Vec<bool> = LOCK_REPLIES.iter().map(|r| is_resp2(r)).collect();
    assert_eq!(use_resp2.iter().filter(|x| **x).count(), 6);
    let bytes: usize = LOCK_REPLIES.iter().map(|r| r.len()).sum();
    let mut rs = redis::Parser::new();
    let mut g = c.benchmark_group("lock_reply_mix");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("ours", |b| {
        b.iter(|| {
            let mut sum = 0;
            for r in LOCK_REPLIES {
                sum += ours_all(black_box(r), black_box(&limits));
            }
            sum
        })
    });
    g.bench_function("redis-protocol", |b| {
        b.iter(|| {
            let mut sum = 0;
            for (r, resp2) in LOCK_REPLIES.iter().zip(&use_resp2) {
                sum += if *resp2 {
                    r2_all(black_box(r))
                } else {
                    r3_all(black_box(r))
                };
            }
            sum
        })
    });
    g.bench_function("redis-rs", |b| {
        b.iter(|| {
            let mut sum = 0;
            for r in LOCK_REPLIES {
                sum += rs_all(&mut rs, black_box(r), 1);
            }
            sum
        })
    });
    g.finish();
}

fn larger(c: &mut Criterion) {
    compare(c, "pipeline64_resp2", &pipeline64(false));
    compare(c, "pipeline64_resp3", &pipeline64(true));
    compare(c, "bulk4k", &bulk4k());
    compare(c, "nested", &nested());
}

/// `RESP_LOOP=<name>:<n>` (a single reply's group name, or `lock_reply_mix`): parse that
/// input `n` times exactly as the `ours` function of its group does, with no timing, and
/// exit. Under `valgrind --tool=callgrind`, two values of `n` give instructions per
/// iteration free of this VM's timing noise.
fn count_loop(spec: &str) {
    let (name, n) = spec.split_once(':').expect("RESP_LOOP=<name>:<n>");
    let n: u64 = n.parse().expect("RESP_LOOP count");
    let limits = Limits::default();
    let inputs: Vec<&[u8]> = match SINGLE_NAMES.iter().position(|s| *s == name) {
        Some(i) => vec![LOCK_REPLIES[i]],
        None if name == "lock_reply_mix" => LOCK_REPLIES.to_vec(),
        None => panic!("RESP_LOOP: unknown input {name:?}"),
    };
    let mut sum = 0u64;
    for _ in 0..n {
        for r in &inputs {
            sum = sum.wrapping_add(ours_all(black_box(r), black_box(&limits)));
        }
    }
    println!("{sum}");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    targets = singles, lock_mix, larger
}
// `criterion_main!(benches)`, plus the `RESP_LOOP` counting mode.
fn main() {
    if let Ok(spec) = std::env::var("RESP_LOOP") {
        count_loop(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
