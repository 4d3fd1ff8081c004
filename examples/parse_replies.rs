//! The RESP parser alone, on the replies a lock client lives on: parses a fixed set of
//! replies (one of each kind below) N times, for the parser's instruction budget in CI
//! (`.ci/budget.sh`):
//!
//! ```sh
//! cargo build --release --example parse_replies
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='parse_replies::run_passes' target/release/examples/parse_replies 3000
//! ```
//!
//! Per pass: every reply of [`REPLIES`] parsed with [`resp::parse`] from its own buffer, as
//! the lock links do (a whole small reply takes the stateless fast path), the frame handed
//! to `black_box` and, for arrays, its elements walked (as the core reads them). The
//! difference of two runs over the difference of their N, divided by the number of
//! replies, is the cost of one reply.
use std::hint::black_box;

use redlock_mux::resp::{self, Frame, Limits, Status};

/// The replies, in the proportions of nothing in particular: one of each kind a lock
/// client reads (acquire, release and extend answers, a waiter's refusal, a subscriber's
/// announcement and confirmation, an error, a script's SHA1).
pub const REPLIES: &[&[u8]] = &[
    b"+OK\r\n",
    b"$-1\r\n",
    b":1\r\n",
    b":0\r\n",
    b":9876\r\n",
    b"*2\r\n:9000\r\n$16\r\n0123456789abcdef\r\n",
    b"*3\r\n$7\r\nmessage\r\n$25\r\nredlock-mux:next:0123abcd\r\n$32\r\n0123456789abcdef0123abcd89abcdef\r\n",
    b"*3\r\n$9\r\nsubscribe\r\n$26\r\nredlock-mux:released:sku:1\r\n:1\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"$40\r\n16109271968973e69a54ed567550aeea5b9c5a76\r\n",
];

fn main() {
    let passes: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    // Each reply in a buffer of its own, as a read would leave it.
    let bufs: Vec<Vec<u8>> = REPLIES.iter().map(|r| r.to_vec()).collect();
    let limits = black_box(Limits::default());
    black_box(run_passes(&bufs, &limits, passes));
    // What `.ci/budget.sh` divides by.
    println!("replies_per_pass={}", REPLIES.len());
}

/// The measured part (`.ci/budget.sh` counts only under it): `passes` passes over `bufs`.
#[inline(never)]
fn run_passes(bufs: &[Vec<u8>], limits: &Limits, passes: usize) -> usize {
    let mut total = 0usize;
    for _ in 0..passes {
        for b in bufs {
            match resp::parse(black_box(&b[..]), limits) {
                Ok(Status::Complete((frame, used))) => {
                    if let Frame::Aggregate(a) = &frame {
                        for e in a.iter() {
                            black_box(&e);
                        }
                    }
                    black_box(&frame);
                    total += used;
                }
                other => panic!("a reply did not parse: {other:?}"),
            }
        }
    }
    total
}
