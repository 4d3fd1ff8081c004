//! Lock+release cycles of the sans-IO core alone, driven in memory with scripted replies:
//! no socket, no clock, no thread, so the instructions a cycle costs are exact and the
//! same on every run. This is what the instruction budget in CI measures
//! (`.ci/budget.sh`):
//!
//! ```sh
//! cargo build --release --example core_cycles
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='core_cycles::run_cycles' target/release/examples/core_cycles 3000
//! ```
//!
//! Per cycle: `try_lock` on 5 masters (every master answers `+OK`), then `release` (every
//! master answers `:1`), the time advancing 50 µs per round trip. The setup (connects,
//! handshakes) is the same for every N, so the difference of two runs over the difference
//! of their N is the cost of one cycle. `MODE=batch64` makes a cycle 64 locks in flight
//! (`try_lock` x 64, then release x 64, each wave in one write per master).
use std::time::{Duration, Instant};

use redlock_mux::core::{Action, Core, Done, LinkId};
use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::{Lock, Redlock};

const MASTERS: usize = 5;

fn main() {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let batch = match std::env::var("MODE").as_deref() {
        Ok("batch64") => 64,
        _ => 1,
    };
    let urls: Vec<String> = (0..MASTERS)
        .map(|i| format!("redis://127.0.0.1:{}", 7000 + i))
        .collect();
    let now = aligned_now();
    let mut core = Redlock::builder()
        .masters(&urls)
        .retry_count(0)
        .build_core(now, 1_700_000_000_000_000, 7)
        .expect("a core");
    let keys: Vec<Vec<u8>> = (0..batch)
        .map(|i| format!("sku:{i}").into_bytes())
        .collect();
    run_cycles(&mut core, &keys, cycles, now);
}

/// The measured part: `cycles` cycles of lock+release over `keys` (the first one also
/// connects and answers the handshakes). `.ci/budget.sh` counts only the instructions
/// under this function (`--toggle-collect`), so the setup above, whose cost varies a
/// little from run to run (it formats the clock), stays out of the count.
#[inline(never)]
fn run_cycles(core: &mut Core, keys: &[Vec<u8>], cycles: usize, mut now: Instant) {
    let batch = keys.len();
    let ttl = Duration::from_secs(10);
    let mut ids = Vec::with_capacity(batch);
    let mut locks: Vec<Lock> = Vec::with_capacity(batch);
    let mut ok = Vec::with_capacity(64);
    let mut one = Vec::with_capacity(64);
    for _ in 0..batch {
        ok.extend_from_slice(b"+OK\r\n");
        one.extend_from_slice(b":1\r\n");
    }
    let mut first = true;
    for _ in 0..cycles {
        for k in keys {
            ids.push(core.submit_lock([&k[..]], ttl, None, 0, now));
        }
        now += Duration::from_micros(50);
        round(core, &mut first, &ok, now);
        for id in ids.drain(..) {
            match core.take(id) {
                Ok(Done::Locked(lock)) => locks.push(lock),
                other => panic!("a lock cycle failed: {other:?}"),
            }
        }
        for lock in &locks {
            ids.push(core.submit_release(lock, now));
        }
        now += Duration::from_micros(50);
        round(core, &mut first, &one, now);
        for id in ids.drain(..) {
            if let Err(e) = core.take(id) {
                panic!("a release failed: {e}");
            }
        }
        locks.clear();
    }
}

/// One round trip: step, connect and answer the handshakes the first time, take what every
/// lock link writes, answer `reply` on each, step again.
fn round(core: &mut Core, first: &mut bool, reply: &[u8], now: Instant) {
    core.step(now);
    while let Some(a) = core.take_action() {
        match a {
            Action::Connect(l) => core.handle_connected(l),
            Action::Close { .. } => panic!("a link was closed: {a:?}"),
        }
    }
    for i in 0..MASTERS {
        let l = LinkId(i);
        if *first {
            let out = core.send_buf(l);
            let (written, mut answer) = (out.len(), handshake_answers(out, i));
            core.sent(l, written);
            answer.extend_from_slice(reply);
            feed(core, l, &answer, now);
            continue;
        }
        // The kernel takes everything: one write per master.
        let written = core.send_buf(l).len();
        core.sent(l, written);
        feed(core, l, reply, now);
    }
    core.flushed();
    *first = false;
    core.step(now);
}

/// Hand `bytes` to link `l` as the driver would.
fn feed(core: &mut Core, l: LinkId, mut bytes: &[u8], now: Instant) {
    while !bytes.is_empty() {
        let buf = core.recv_buf(l, now).expect("the link is up");
        let n = buf.len().min(bytes.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        assert!(core.received(l, n, now), "the link was closed");
        bytes = &bytes[n..];
    }
}

/// What a master answers to the handshake: the leading `SCRIPT LOAD`s and `INFO`, not the
/// round's own requests behind them (one, or 64 with `MODE=batch64`).
fn handshake_answers(out: &[u8], master: usize) -> Vec<u8> {
    let limits = Limits::default();
    let mut rest = out;
    let mut answers = Vec::new();
    let mut commands = Vec::new();
    while let Ok(Status::Complete((Frame::Aggregate(a), used))) = resp::parse(rest, &limits) {
        let args: Vec<Vec<u8>> = a
            .iter()
            .map(|f| match f {
                Frame::Bulk(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        commands.push(args);
        rest = &rest[used..];
    }
    for args in commands {
        match args[0].to_ascii_uppercase().as_slice() {
            b"SCRIPT" => {
                let src = &args[2];
                let s = redlock_mux::scripts::ALL
                    .iter()
                    .find(|s| s.src.as_bytes() == &src[..])
                    .expect("a script of ours");
                answers.extend_from_slice(format!("$40\r\n{}\r\n", s.sha).as_bytes());
            }
            b"INFO" => {
                let run_id = format!("{master:040x}");
                let text = format!("# Server\r\nrun_id:{run_id}\r\nuptime_in_seconds:86400\r\n");
                answers.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
            }
            // The first of the round's own requests: the handshake is over.
            _ => break,
        }
    }
    answers
}

/// `Instant::now()` moved forward to a whole second of the monotonic clock: the time
/// arithmetic then carries at the same steps on every run (a different sub-second start
/// takes other branches in `Instant + Duration` and moves the count by a few hundred
/// instructions). Read from `Instant`'s `Debug` (`tv_sec`, `tv_nsec` on Unix); left as it
/// is where that says something else.
fn aligned_now() -> Instant {
    let now = Instant::now();
    let text = format!("{now:?}");
    let nanos = text.split("tv_nsec: ").nth(1).and_then(|s| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u64>()
            .ok()
    });
    match nanos {
        Some(ns) if ns < 1_000_000_000 => now + Duration::from_nanos(1_000_000_000 - ns),
        _ => now,
    }
}
