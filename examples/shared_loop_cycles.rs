//! Lock+release cycles of the shared client with one caller, its loop driven over masters
//! scripted in memory: the shared client's own hand-over (`shared/hub.rs`) and loop
//! (`shared/event_loop.rs`) over the same core, with no socket, no poll and no clock read,
//! so the instructions a cycle costs are exact and the same on every run. This is what
//! the `shared_cycle` instruction budget in CI measures (`.ci/budget.sh`):
//!
//! ```sh
//! cargo build --release --example shared_loop_cycles
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='shared_loop_cycles::run_cycles' \
//!     --toggle-collect='shared_loop_cycles::script_*' \
//!     target/release/examples/shared_loop_cycles 3000
//! ```
//!
//! Per cycle, on 5 masters: `try_lock` (every master answers `+OK`), then `release`
//! (every master answers `:1`), each waited for on this thread, which drives the loop
//! itself as a `SharedRedlock` caller blocked in `Pending::wait` does (the loop's own
//! thread is started and parks). The loop's clock moves 50 µs per round trip. What a
//! master answers is worked out by `script_answer` (it parses the requests): its
//! `--toggle-collect` turns the count off inside it. The count is then the hand-over's,
//! the loop's and the core's work, plus the moving of bytes in and out of the core's
//! buffers as a driver does it; not the `Pending` and `LockGuard` wrappers, nor the
//! syscalls and clock reads of a real driver. The first cycle (connects, handshakes) is
//! the same for every N, so the difference of two runs over the difference of their N is
//! the cost of one cycle.
use std::time::{Duration, Instant};

use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::scripts;
use redlock_mux::Redlock;

const MASTERS: usize = 5;

fn main() {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let urls: Vec<String> = (0..MASTERS)
        .map(|i| format!("redis://127.0.0.1:{}", 7000 + i))
        .collect();
    let now = aligned_now();
    let client = Redlock::builder()
        .masters(&urls)
        .retry_count(0)
        .build_shared_in_memory(
            now,
            1_700_000_000_000_000,
            7,
            Duration::from_micros(50),
            |link: usize, written: &[u8], answers: &mut Vec<u8>| {
                script_answer(written, link, answers)
            },
        )
        .expect("a client");
    // The loop's own thread starts and parks before the count begins (it must not run
    // during it: this thread drives).
    std::thread::sleep(Duration::from_millis(200));
    let ttl = Duration::from_secs(10);
    run_cycles(cycles, || {
        let lock = client.try_lock(b"sku:0", ttl).expect("a lock");
        client.release(lock).expect("a release");
    });
}

/// The measured part: `cycles` calls of `cycle` (the first one also connects and answers
/// the handshakes). `.ci/budget.sh` counts only the instructions under this function
/// (`--toggle-collect`), so the setup above stays out of the count.
#[inline(never)]
fn run_cycles(cycles: usize, mut cycle: impl FnMut()) {
    for _ in 0..cycles {
        cycle();
    }
}

/// What the master of link `link` answers to `written`: the handshake's `SCRIPT LOAD`s and
/// `INFO`, `+OK` to a `SET`, `:1` to a release. (Which master it is, is its work too:
/// counted out with the rest.)
#[inline(never)]
fn script_answer(mut written: &[u8], link: usize, answers: &mut Vec<u8>) {
    let master = link % MASTERS;
    let limits = Limits::default();
    while let Ok(Status::Complete((Frame::Aggregate(a), used))) = resp::parse(written, &limits) {
        let args: Vec<&[u8]> = a
            .iter()
            .map(|f| match f {
                Frame::Bulk(b) => b,
                _ => &[][..],
            })
            .collect();
        written = &written[used..];
        match args[0].to_ascii_uppercase().as_slice() {
            b"SCRIPT" => {
                let sha = scripts::ALL
                    .iter()
                    .find(|x| x.src.as_bytes() == args[2])
                    .expect("a script of ours")
                    .sha;
                answers.extend_from_slice(format!("$40\r\n{sha}\r\n").as_bytes());
            }
            b"INFO" => {
                let text =
                    format!("# Server\r\nrun_id:{master:040x}\r\nuptime_in_seconds:86400\r\n");
                answers.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
            }
            b"SET" => answers.extend_from_slice(b"+OK\r\n"),
            b"EVALSHA"
                if args[1] == scripts::RELEASE_LEAN.sha.as_bytes()
                    || args[1] == scripts::RELEASE.sha.as_bytes() =>
            {
                answers.extend_from_slice(b":1\r\n");
            }
            _ => panic!(
                "master {master} was asked {:?}",
                args.iter()
                    .map(|a| String::from_utf8_lossy(a))
                    .collect::<Vec<_>>()
            ),
        }
    }
    assert!(written.is_empty(), "a partial request: {written:?}");
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
