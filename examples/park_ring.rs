//! What one blocking hand-off between threads costs this machine, with no lock client in
//! it: `T` threads in a ring pass a token, each parked (`std::thread::park`) until its
//! predecessor hands it the token and wakes it (`Thread::unpark`), as a caller of the
//! shared client blocked on a result is woken when the result is in. Every hand-off is
//! one park and one wake: the floor under what 64 threads blocking on a `SharedRedlock`
//! pay per operation (two per lock+release cycle) on a machine with fewer cores than
//! threads, where a waiting thread cannot spin (benches/README.md, "Threads on the
//! shared client").
//!
//! `cargo run --release --example park_ring [-- THREADS HANDOFFS]` (defaults 64 and
//! 200,000): prints hand-offs per second and the process's CPU per hand-off (user and
//! system, `getrusage`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread::{self, Thread};
use std::time::Instant;

fn cpu_us() -> (f64, f64) {
    // SAFETY: getrusage writes the struct it is given; RUSAGE_SELF is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    (us(ru.ru_utime), us(ru.ru_stime))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map_or(64, |a| a.parse().expect("THREADS"));
    let handoffs: usize = args
        .next()
        .map_or(200_000, |a| a.parse().expect("HANDOFFS"));
    assert!(threads >= 2, "a ring needs 2 threads or more");

    // `turn` counts hand-offs: thread `i` holds the token when `turn % threads == i`.
    let turn = Arc::new(AtomicUsize::new(usize::MAX));
    let ring: Arc<OnceLock<Vec<Thread>>> = Arc::new(OnceLock::new());
    let ready = Arc::new(Barrier::new(threads + 1));
    let mut joins = Vec::with_capacity(threads);
    for i in 0..threads {
        let (turn, ring, ready) = (turn.clone(), ring.clone(), ready.clone());
        joins.push(thread::spawn(move || {
            ready.wait();
            let next = &ring.get().expect("the ring is set before the barrier")[(i + 1) % threads];
            let mut next_turn = i;
            while next_turn < handoffs {
                // Parked until the token is ours (a spurious wake-up parks again).
                while turn.load(Ordering::Acquire) != next_turn {
                    thread::park();
                }
                turn.store(next_turn + 1, Ordering::Release);
                next.unpark();
                next_turn += threads;
            }
        }));
    }
    let threads_of: Vec<Thread> = joins.iter().map(|j| j.thread().clone()).collect();
    let first = threads_of[0].clone();
    ring.set(threads_of).expect("set once");
    ready.wait();
    let (u0, s0) = cpu_us();
    let t0 = Instant::now();
    turn.store(0, Ordering::Release);
    first.unpark();
    for j in joins {
        j.join().expect("ring thread");
    }
    let secs = t0.elapsed().as_secs_f64();
    let (u1, s1) = cpu_us();
    let n = handoffs as f64;
    println!(
        "threads={threads} handoffs={handoffs} per_s={:.0} wall_us={:.2} user_us={:.2} sys_us={:.2} cpu_us={:.2}",
        n / secs,
        secs * 1e6 / n,
        (u1 - u0) / n,
        (s1 - s0) / n,
        (u1 - u0 + s1 - s0) / n
    );
}
