//! A counting global allocator for the allocation tests of real clients
//! (`alloc_engine`, `alloc_cluster`): a test binary that includes this module counts every
//! allocation and reallocation made while [`COUNTING`] is on, in [`ALLOCS`] (process-wide:
//! one test function per binary).
//!
//! Included by `#[path = "support/alloc.rs"] mod alloc;`, not through `support`: the
//! allocator is the whole binary's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct Counting;

pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
pub static COUNTING: AtomicBool = AtomicBool::new(false);

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
