//! A warm lock+release cycle allocates nothing: proven with a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redlock_mux::local::LocalMasters;
use redlock_mux::Redlock;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    c.release(extended).unwrap();
    assert_eq!(
        n, 0,
        "{n} allocations in {cycles} warm lock+release+extend cycles"
    );
}
