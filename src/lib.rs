//! # redlock-mux
//!
//! A Redlock client over N independent Redis masters, speaking raw RESP from one thread
//! and one `mio` event loop: every lock operation writes its request to all masters at
//! once, then reads the answers as they arrive, and decides as soon as a quorum is reached
//! or impossible.
//!
//! * [`resp`]: a strict, bounded, zero-allocation RESP2/RESP3 parser and encoder, usable
//!   alone (`default-features = false`).
//! * [`rules`]: the Redlock rules (quorum, validity, verdicts) as plain, testable state.
//! * [`Redlock`]: the blocking client (feature `client`, on by default). One client per
//!   thread; its methods take `&mut self`.
//! * [`local`]: start and control local `redis-server` processes (feature `local`), for
//!   tests and benchmarks.
//!
//! Masters are given as URLs ([`MasterSpec::parse`]): `redis://` over TCP, `rediss://` over
//! TLS (feature `tls`: rustls driven inside the same loop), `unix://` for a Unix socket.
//! Host names are resolved at every connect, off the loop.
//!
//! # Lock and release
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_mux::Redlock;
//!
//! let mut redlock = Redlock::new(["redis://127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"])?;
//! let mut lock = redlock.lock("orders:42", Duration::from_secs(10))?;
//! assert!(lock.is_valid());
//! redlock.extend(&mut lock, Duration::from_secs(10))?;
//! redlock.release(lock)?;
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! # Auto-extension with a lost-lock signal
//!
//! ```no_run
//! # use std::time::Duration;
//! # let mut redlock = redlock_mux::Redlock::new(["127.0.0.1:7000"])?;
//! let held = redlock.run_locked("nightly", Duration::from_secs(5), |signal| {
//!     while !signal.wait_lost(Duration::from_millis(100)) {
//!         // a step of work; stop as soon as the signal fires
//!         # break;
//!     }
//! })?;
//! println!("held throughout: {}, extensions: {}", held.held_throughout, held.extensions);
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! # Deadlines and cancellation
//!
//! ```no_run
//! # use std::time::{Duration, Instant};
//! # let mut redlock = redlock_mux::Redlock::new(["127.0.0.1:7000"])?;
//! let cancel = redlock.cancel_handle();
//! std::thread::spawn(move || cancel.cancel()); // from anywhere
//! match redlock.lock_with_deadline("job", Duration::from_secs(5), Instant::now() + Duration::from_secs(2)) {
//!     Err(redlock_mux::Error::Cancelled | redlock_mux::Error::DeadlineExceeded(_)) => {}
//!     other => { let _ = other?; }
//! }
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! # Multi-resource locks
//!
//! ```no_run
//! # use std::time::Duration;
//! # let mut redlock = redlock_mux::Redlock::new(["127.0.0.1:7000"])?;
//! let both = redlock.lock_many(["account:1", "account:2"], Duration::from_secs(5))?;
//! redlock.release(both)?;
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! # Fencing tokens and the amnesia guard
//!
//! ```no_run
//! # use std::time::Duration;
//! let mut redlock = redlock_mux::Redlock::builder()
//!     .masters(["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"])
//!     .fencing(true)                               // two more round trips per acquire
//!     .amnesia_guard(Duration::from_secs(30))      // the largest TTL in use
//!     .build()?;
//! let lock = redlock.lock("ledger", Duration::from_secs(30))?;
//! let token = lock.fencing_token().unwrap();       // send it with every write
//! # let _ = token;
//! redlock.release(lock)?;
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! # Many locks in flight from one thread
//!
//! ```no_run
//! # use std::time::Duration;
//! # let mut redlock = redlock_mux::Redlock::new(["127.0.0.1:7000"])?;
//! let resources: Vec<String> = (0..64).map(|i| format!("sku:{i}")).collect();
//! let mut results = Vec::with_capacity(64);
//! redlock.try_lock_batch(&resources, Duration::from_secs(5), &mut results)?;
//! let locks: Vec<_> = results.drain(..).filter_map(Result::ok).collect();
//! let mut released = Vec::with_capacity(64);
//! redlock.release_batch(locks, &mut released)?;
//! # Ok::<(), redlock_mux::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "local")]
pub mod local;
pub mod resp;

#[cfg(feature = "client")]
mod builder;
#[cfg(feature = "client")]
mod engine;
#[cfg(feature = "client")]
mod error;
#[cfg(feature = "client")]
mod keep;
#[cfg(feature = "client")]
mod lock;
#[cfg(feature = "client")]
mod machine;
#[cfg(feature = "client")]
pub mod rules;
#[cfg(feature = "client")]
pub mod scripts;
#[cfg(feature = "client")]
mod shared;
#[cfg(feature = "client")]
mod single;
#[cfg(feature = "client")]
mod token;
#[cfg(feature = "client")]
mod url;

#[cfg(feature = "client")]
pub use builder::Builder;
#[cfg(feature = "client")]
pub use engine::NodeStats;
#[cfg(feature = "client")]
pub use error::{Error, Operation, Report};
#[cfg(feature = "client")]
pub use keep::HoldOptions;
#[cfg(feature = "client")]
pub use lock::Lock;
#[cfg(feature = "client")]
pub use rules::{Fault, Outcome, TlsFault};
#[cfg(feature = "client")]
pub use shared::{LockGuard, Lost, Pending, SharedRedlock};
#[cfg(feature = "client")]
pub use single::{CancelHandle, Held, LockSignal, Redlock};
#[cfg(feature = "client")]
pub use token::Token;
#[cfg(feature = "client")]
pub use url::{Endpoint, MasterSpec};

/// Longest resource name accepted, in bytes.
pub const MAX_RESOURCE_LEN: usize = 4096;
/// Longest TTL accepted: 2^31 - 1 ms (about 24.8 days), like most timer APIs.
pub const MAX_TTL: std::time::Duration = std::time::Duration::from_millis((1 << 31) - 1);
