//! Warm operations of the shared client allocate nothing, on the caller's side or the
//! loop's: a blocking caller that drives the loop itself, threads served by the loop's
//! thread, async tasks woken by it, guards released by drop. Proven with a counting global
//! allocator over every thread of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use redlock_mux::local::LocalMasters;
use redlock_mux::{Redlock, SharedRedlock};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);
static SIZES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// Count one allocation and keep the first sizes (for the failure message).
fn note(size: usize) {
    let n = ALLOCS.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = SIZES.get(n as usize) {
        s.store(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            note(layout.size());
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
            note(new_size);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The smallest executor: poll on this thread, park until woken. Its waker is an `Arc`
/// (cloning it allocates nothing), so every allocation counted is the client's.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(waker: &Waker, f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(waker);
    for _ in 0..10_000_000u64 {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park_timeout(Duration::from_millis(100));
    }
    panic!("a future never completed");
}

const TTL: Duration = Duration::from_secs(10);

/// One blocking cycle: take, extend another lock, release; every other cycle the guard is
/// released by dropping it.
fn cycle(c: &SharedRedlock, key: &str, held: &redlock_mux::LockGuard, i: u32) {
    let g = c.try_lock(key, TTL).wait().unwrap();
    held.extend(TTL).wait().unwrap();
    if i % 2 == 0 {
        g.release().wait().unwrap();
    } else {
        drop(g);
    }
}

async fn async_cycle(c: &SharedRedlock, key: &str, held: &redlock_mux::LockGuard, i: u32) {
    let g = c.try_lock(key, TTL).await.unwrap();
    held.extend(TTL).await.unwrap();
    if i % 2 == 0 {
        g.release().await.unwrap();
    } else {
        drop(g);
    }
}

/// Count the allocations of `run` (every thread), warmed by two runs first; at most
/// `growth` are allowed.
///
/// `growth` is for concurrent callers only: the engine keeps an operation's slot until
/// every master answered it, so a master that falls behind (a descheduled `redis-server`
/// on a loaded machine) holds more slots at once than warm-up ever did, and the slot
/// table doubles (then stays). That is a handful of allocations in a run, never one per
/// operation: without pooling this run makes thousands.
fn count(what: &str, growth: u64, run: impl Fn()) {
    run();
    run();
    ALLOCS.store(0, Ordering::SeqCst);
    for s in &SIZES {
        s.store(0, Ordering::SeqCst);
    }
    COUNTING.store(true, Ordering::SeqCst);
    run();
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    let sizes: Vec<u64> = SIZES.iter().map(|s| s.load(Ordering::SeqCst)).collect();
    assert!(
        n <= growth,
        "{n} allocations (at most {growth} allowed): {what} (first sizes in bytes: {sizes:?})"
    );
}

/// One test function on purpose: the counter is process-wide.
#[test]
fn warm_shared_operations_allocate_nothing() {
    let m = LocalMasters::start(3).unwrap_or_else(|e| panic!("cannot start masters: {e}"));
    let c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build_shared()
        .unwrap();
    let held = c.try_lock("alloc-held", TTL).wait().unwrap();

    // One blocking caller: it drives the loop itself.
    count("one blocking caller, 500 cycles", 0, || {
        for i in 0..500 {
            cycle(&c, "alloc-one", &held, i);
        }
    });

    // Four threads at once: the loop's thread serves them, they park and are unparked.
    // Each thread's handle exists before counting starts (spawning allocates).
    const THREADS: usize = 4;
    let start = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (c, start, done, stop) = (c.clone(), start.clone(), done.clone(), stop.clone());
            let held = c.try_lock(format!("alloc-held-{t}"), TTL).wait().unwrap();
            let key = format!("alloc-threads-{t}");
            thread::spawn(move || loop {
                start.wait();
                if stop.load(Ordering::SeqCst) {
                    held.release().wait().unwrap();
                    return;
                }
                for i in 0..300 {
                    cycle(&c, &key, &held, i);
                }
                done.wait();
            })
        })
        .collect();
    count("four blocking threads, 300 cycles each", 8, || {
        start.wait();
        done.wait();
    });

    // Async: the same, awaited; the loop's thread wakes the tasks.
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    count("one async task, 500 cycles", 0, || {
        block_on(&waker, async {
            for i in 0..500 {
                async_cycle(&c, "alloc-async", &held, i).await;
            }
        })
    });

    // The calls that may wait (default retries: the waiting acquire, a waiter id and
    // score), blocking: lock, lock_with_deadline, lock_many.
    let w = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(500))
        .build_shared()
        .unwrap();
    count("lock, lock_with_deadline, lock_many: 300 cycles", 0, || {
        for _ in 0..300 {
            w.lock("alloc-wait", TTL)
                .wait()
                .unwrap()
                .release()
                .wait()
                .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let g = w
                .lock_with_deadline("alloc-wait", TTL, deadline)
                .wait()
                .unwrap();
            drop(g);
            let g = w.lock_many(["alloc-m0", "alloc-m1"], TTL).wait().unwrap();
            g.release().wait().unwrap();
        }
    });

    stop.store(true, Ordering::SeqCst);
    start.wait();
    for w in workers {
        w.join().unwrap();
    }
    held.release().wait().unwrap();
}
