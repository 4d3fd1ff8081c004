//! A warm lock+release cycle allocates nothing: proven with a counting global allocator,
//! for every kind of call: `try_lock`, `lock` (the waiting acquire with its line
//! arguments), `lock_with_deadline`, `lock_many`, `extend`, and the batch calls.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redlock_mux::local::LocalMasters;
use redlock_mux::Redlock;

#[path = "support/alloc.rs"]
mod alloc;
use alloc::{ALLOCS, COUNTING};

/// One test function on purpose: the counter is process-wide.
#[test]
fn warm_cycles_allocate_nothing() {
    let m = LocalMasters::start(5).unwrap_or_else(|e| panic!("cannot start masters: {e}"));
    let mut c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    for _ in 0..300 {
        // Warm: connections, buffers, token batch, op slots.
        let lock = c.try_lock("alloc-test", ttl).unwrap();
        c.release(lock).unwrap();
    }
    let mut extended = c.try_lock("alloc-ext", ttl).unwrap();
    c.extend(&mut extended, ttl).unwrap();
    // Default retries: `lock` and `lock_with_deadline` are calls that may wait (the
    // waiting acquire script, a waiter id and score).
    let mut w = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let names = ["alloc-b0", "alloc-b1", "alloc-b2", "alloc-b3"];
    let (mut got, mut freed) = (Vec::with_capacity(4), Vec::with_capacity(4));
    let waiting_cycle = |w: &mut Redlock, got: &mut Vec<_>, freed: &mut Vec<_>| {
        let lock = w.lock("alloc-wait", ttl).unwrap();
        w.release(lock).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let lock = w.lock_with_deadline("alloc-wait", ttl, deadline).unwrap();
        w.release(lock).unwrap();
        let lock = w.lock_many(["alloc-m0", "alloc-m1"], ttl).unwrap();
        w.release(lock).unwrap();
        w.try_lock_batch(&names, ttl, got).unwrap();
        let locks: Vec<_> = got.drain(..).map(Result::unwrap).collect();
        w.release_batch(locks, freed).unwrap();
        for r in freed.drain(..) {
            r.unwrap();
        }
    };
    for _ in 0..300 {
        waiting_cycle(&mut w, &mut got, &mut freed);
    }

    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let cycles = 1000;
    for _ in 0..cycles {
        let lock = c.try_lock("alloc-test", ttl).unwrap();
        c.release(lock).unwrap();
        c.extend(&mut extended, ttl).unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);

    // The other calls; the batch's `Vec` of locks is the test's own (one per cycle).
    let cycles_w = 300;
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..cycles_w {
        waiting_cycle(&mut w, &mut got, &mut freed);
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n_w = ALLOCS.load(Ordering::SeqCst);
    c.release(extended).unwrap();
    assert_eq!(
        n, 0,
        "{n} allocations in {cycles} warm lock+release+extend cycles"
    );
    assert_eq!(
        n_w, cycles_w,
        "{n_w} allocations in {cycles_w} warm cycles of lock, lock_with_deadline, lock_many \
         and a batch of 4 (want exactly one per cycle: the test's own Vec of locks)"
    );
}
