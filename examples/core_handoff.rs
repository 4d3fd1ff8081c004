//! Contended hand-offs of the sans-IO core alone, driven in memory with scripted replies:
//! a waiter refused while another client holds the lock, woken by the holder's release
//! announcement, granted, then releasing. No socket, no clock, no thread: the instructions
//! a hand-off costs are exact and the same on every run (the instruction budget in CI,
//! `.ci/budget.sh`, measures them):
//!
//! ```sh
//! cargo build --release --example core_handoff
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='core_handoff::run_cycles' \
//!     --toggle-collect='core_handoff::script_*' target/release/examples/core_handoff 3000
//! ```
//!
//! Per cycle, on 5 masters with `lock()`'s defaults (notify mode): the waiter's
//! `AcquireWait` is answered "taken" by every master (`[9000, <holder>]`: the holder's TTL
//! left and its fingerprint); it sleeps in the key's line, subscribed (the key's channel
//! and the client's own, held over from the last cycle: they linger); every master then
//! announces the holder's release on the client's channel naming the waiter (`message
//! redlock-mux:next:<client> <holder><waiter>`); the waiter tries at the third (a quorum
//! freed), every master answers `:0` (granted), and the lock is released (`:1`). The time
//! advances 50 µs per round trip.
//!
//! What a master answers is worked out by the `script_*` functions (they parse the
//! requests): their `--toggle-collect` turns the count off inside them, as the one of
//! `run_cycles` turns it on inside the cycles only (not the setup, whose cost varies a
//! little from run to run). The count is then the core's work plus the moving of bytes in
//! and out of its buffers, as a driver does it. The first cycle (connects, handshakes,
//! subscriptions) is the same for every N, so the difference of two runs over the
//! difference of their N is the cost of one hand-off.
use std::time::{Duration, Instant};

use redlock_mux::core::{Action, Core, Done, LinkId};
use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::scripts::{self, NEXT_PREFIX, WAITER_ID_LEN};
use redlock_mux::Redlock;

const MASTERS: usize = 5;
/// The holder's token fingerprint, as the masters name it in a refusal and announce it.
const HOLDER: &[u8; 16] = b"h0ld3r0123456789";

/// What the scripted masters answer next, and what they learnt.
#[derive(Default)]
struct Script {
    /// Acquire attempts are granted (`:0`), else refused as held by [`HOLDER`].
    grant: bool,
    /// The waiter's id in the key's line, from its last `AcquireWait`.
    waiter: Option<[u8; WAITER_ID_LEN]>,
    /// Scratch for the answers of one link.
    answer: Vec<u8>,
}

fn main() {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let urls: Vec<String> = (0..MASTERS)
        .map(|i| format!("redis://127.0.0.1:{}", 7000 + i))
        .collect();
    let now = aligned_now();
    let mut core = Redlock::builder()
        .masters(&urls)
        .build_core(now, 1_700_000_000_000_000, 7)
        .expect("a core");
    run_cycles(&mut core, cycles, now);
}

/// The measured part: `cycles` hand-offs (the first one also connects, answers the
/// handshakes and subscribes).
#[inline(never)]
fn run_cycles(core: &mut Core, cycles: usize, mut now: Instant) {
    let ttl = Duration::from_secs(10);
    let key: &[u8] = b"hot";
    let mut s = Script {
        answer: Vec::with_capacity(4096),
        ..Script::default()
    };
    let mut turn = Vec::with_capacity(256);
    for _ in 0..cycles {
        s.grant = false;
        let id = core.submit_lock([key], ttl, None, 5, now);
        pump(core, &mut s, &mut now);
        assert!(!core.is_done(id), "the waiter was not refused");
        // The holder releases: every master announces it, naming the waiter.
        script_turn(&s, &mut turn);
        for i in 0..MASTERS {
            feed(core, LinkId(MASTERS + i), &turn, now);
        }
        s.grant = true;
        pump(core, &mut s, &mut now);
        let lock = match core.take(id) {
            Ok(Done::Locked(lock)) => lock,
            other => panic!("the hand-off failed: {other:?}"),
        };
        let id = core.submit_release(&lock, now);
        pump(core, &mut s, &mut now);
        if let Err(e) = core.take(id) {
            panic!("a release failed: {e}");
        }
    }
}

/// Round trips until no link has anything to write: step, connect what the core asks to,
/// take what every link writes, answer it, step again.
fn pump(core: &mut Core, s: &mut Script, now: &mut Instant) {
    loop {
        core.step(*now);
        while let Some(a) = core.take_action() {
            match a {
                Action::Connect(l) => core.handle_connected(l),
                Action::Close { .. } => panic!("a link was closed: {a:?}"),
            }
        }
        *now += Duration::from_micros(50);
        let mut wrote = false;
        for l in (0..2 * MASTERS).map(LinkId) {
            let out = core.send_buf(l);
            if out.is_empty() {
                continue;
            }
            wrote = true;
            let written = out.len();
            script_answer(out, l.0 % MASTERS, s);
            core.sent(l, written);
            feed(core, l, &s.answer, *now);
        }
        core.flushed();
        core.step(*now);
        if !wrote {
            return;
        }
    }
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

/// What master `master` answers to the commands in `out` (into `s.answer`). Left out of
/// the count (`--toggle-collect`): it parses every request.
#[inline(never)]
fn script_answer(mut out: &[u8], master: usize, s: &mut Script) {
    let limits = Limits::default();
    s.answer.clear();
    while let Ok(Status::Complete((Frame::Aggregate(a), used))) = resp::parse(out, &limits) {
        let args: Vec<&[u8]> = a
            .iter()
            .map(|f| match f {
                Frame::Bulk(b) => b,
                _ => &[][..],
            })
            .collect();
        out = &out[used..];
        let a = &mut s.answer;
        match args[0].to_ascii_uppercase().as_slice() {
            b"SCRIPT" => {
                let sha = scripts::ALL
                    .iter()
                    .find(|x| x.src.as_bytes() == args[2])
                    .expect("a script of ours")
                    .sha;
                a.extend_from_slice(format!("$40\r\n{sha}\r\n").as_bytes());
            }
            b"INFO" => {
                let text =
                    format!("# Server\r\nrun_id:{master:040x}\r\nuptime_in_seconds:86400\r\n");
                a.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
            }
            b"SUBSCRIBE" | b"UNSUBSCRIBE" => {
                let kind = String::from_utf8_lossy(args[0]).to_ascii_lowercase();
                let ch = args[1];
                a.extend_from_slice(format!("*3\r\n${}\r\n{kind}\r\n", kind.len()).as_bytes());
                a.extend_from_slice(format!("${}\r\n", ch.len()).as_bytes());
                a.extend_from_slice(ch);
                a.extend_from_slice(b"\r\n:1\r\n");
            }
            b"EVALSHA" if args[1] == scripts::ACQUIRE_WAIT.sha.as_bytes() => {
                // KEYS (the key, its line, its liveness set), then ARGV: token, ttl, the
                // waiter's id, ...
                let nkeys: usize = std::str::from_utf8(args[2]).unwrap().parse().unwrap();
                let id: [u8; WAITER_ID_LEN] = args[3 + nkeys + 2].try_into().expect("a waiter id");
                s.waiter = Some(id);
                if s.grant {
                    a.extend_from_slice(b":0\r\n");
                } else {
                    a.extend_from_slice(b"*2\r\n:9000\r\n$16\r\n");
                    a.extend_from_slice(HOLDER);
                    a.extend_from_slice(b"\r\n");
                }
            }
            b"EVALSHA"
                if args[1] == scripts::RELEASE_LEAN.sha.as_bytes()
                    || args[1] == scripts::RELEASE.sha.as_bytes() =>
            {
                a.extend_from_slice(b":1\r\n");
            }
            other => panic!("unexpected command {:?}", String::from_utf8_lossy(other)),
        }
    }
    assert!(out.is_empty(), "a partial command was written");
}

/// The announcement of the holder's release that names the waiter (into `turn`). Left out
/// of the count.
#[inline(never)]
fn script_turn(s: &Script, turn: &mut Vec<u8>) {
    let id = s.waiter.expect("the waiter asked");
    let mut ch = NEXT_PREFIX.to_vec();
    ch.extend_from_slice(&id[..scripts::CLIENT_ID_LEN]);
    turn.clear();
    turn.extend_from_slice(format!("*3\r\n$7\r\nmessage\r\n${}\r\n", ch.len()).as_bytes());
    turn.extend_from_slice(&ch);
    turn.extend_from_slice(b"\r\n$32\r\n");
    turn.extend_from_slice(HOLDER);
    turn.extend_from_slice(&id);
    turn.extend_from_slice(b"\r\n");
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
