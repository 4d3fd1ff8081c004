//! What the shared client's threads share, from `std`, or from `loom` in the crate's own
//! tests built with `RUSTFLAGS="--cfg loom"` (the model tests, `loom_tests.rs`; `loom` is
//! a dev-dependency only there, so any other build with that flag keeps `std`): the
//! completion slots ([`super::pending`]) and the hand-over of who drives the loop
//! ([`super::hub`]) take their locks, atomics and thread parking from here.
//!
//! `Arc` stays `std`'s: the slots and lock states travel through the loop's own types,
//! and a reference count's ordering is not what the models check. `loom`'s locks never
//! poison; their `lock` still returns a `LockResult`, so the same helpers serve both.

#[cfg(not(all(test, loom)))]
pub(crate) use std::{
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, Ordering},
        Condvar, Mutex, MutexGuard, TryLockError,
    },
    thread,
};

#[cfg(all(test, loom))]
pub(crate) use loom::{
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, Ordering},
        Condvar, Mutex, MutexGuard,
    },
    thread,
};
#[cfg(all(test, loom))]
pub(crate) use std::sync::TryLockError;

/// Lock `m`, whether or not a holder panicked with it (whoever locks restores what it
/// needs).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
