//! # redlock-mux
//!
//! A Redlock client over N independent Redis masters, speaking raw RESP from one `mio`
//! event loop: every lock operation writes its request to all masters at once, then reads
//! the answers as they arrive, and decides as soon as a quorum is reached or impossible.
//!
//! * [`Redlock`]: the single-owner client. Its calls run the loop on the caller's thread
//!   (`&mut self`): the lowest latency, for one thread.
//! * [`SharedRedlock`]: the shared client. A cloneable `Send + Sync` handle to one loop
//!   that every thread and async task of a process can use; locks come as [`LockGuard`]s
//!   released on drop, operations as [`Pending`]s to `.await` or `.wait()` for.
//! * [`resp`]: a strict, bounded, zero-allocation RESP2/RESP3 parser and encoder, usable
//!   alone (`default-features = false`).
//!
//! Features:
//!
//! | feature | gives | pulls in |
//! |---|---|---|
//! | `client` (default) | the two clients | `mio`, `socket2`, `smallvec`, `fastrand` |
//! | `tls` | `rediss://` masters | `rustls` (ring provider, no OpenSSL), `rustls-native-certs` |
//! | `tracing` | a span per lock operation, an event per master's answer | `tracing` (nothing is compiled in without it) |
//! | `cli` | the `redlock` binary | `clap`, `tokio`, `nix`, `signal-hook`, `indicatif`, `hdrhistogram`, `humantime`, `serde_json` (never in a library user's build unless asked for) |
//! | `local` | local `redis-server` (or `valkey-server`) processes and clusters for tests and benches (`redlock_mux::local`) | `nix` |
//!
//! With `default-features = false` only [`resp`] is left, with no dependency at all. The
//! README has the guarantees and what they assume; `docs/` in the repository has the rest.
//!
//! The examples run against three local masters in the crate's tests (hidden lines start
//! them); read `urls` as your masters' URLs.
//!
//! Masters are given as URLs (see [`Builder::masters`]): `redis://` over TCP, `rediss://`
//! over TLS (feature `tls`: rustls driven inside the same loop), `unix://` for a Unix
//! socket. Host names are resolved at every connect, off the loop.
//!
//! # How long a lock call waits
//!
//! The caller's own bound rules, and each client offers the bound that fits it:
//!
//! * [`SharedRedlock::lock`] waits until it gets the lock, like `Mutex::lock`: its caller
//!   bounds the wait by dropping the [`Pending`] (`tokio::time::timeout(d, lock(..))`,
//!   `select!`, an aborted task), which cancels the attempt and leaves nothing behind.
//! * [`Redlock::lock`] blocks, and a blocking call cannot be dropped: it keeps a bound of
//!   its own, [`Builder::retry_count`] timed retries, 10 by default (about 2 s with the
//!   default delay of 200 ms ± 100 ms).
//! * `lock_with_deadline` (both clients) waits until a deadline and reports what the
//!   masters did in its last attempt; a `retry_count` set on the builder bounds both
//!   clients' `lock`.
//! * Whatever the bound, refusals that waiting cannot change (a wrong password, an ACL
//!   without the right to the lock's keys, a certificate that does not verify:
//!   [`Fault::is_configuration`]) end a call at once with [`Error::Refused`] when they leave
//!   no quorum possible; a taken lock and masters that are down or slow are waited for.
//!
//! # Lock and release
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start(3)?;
//! use std::time::Duration;
//! use redlock_mux::Redlock;
//!
//! let urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
//! # let urls = local.urls();
//! let mut redlock = Redlock::new(&urls)?;
//! let mut lock = redlock.lock("orders:42", Duration::from_secs(10))?;
//! assert!(lock.is_valid());
//! redlock.extend(&mut lock, Duration::from_secs(10))?;
//! redlock.release(lock)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
//!
//! # One client for a whole process
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start(3)?;
//! # let urls = local.urls();
//! use std::time::Duration;
//! use redlock_mux::Redlock;
//!
//! let redlock = Redlock::builder().masters(&urls).build_shared()?;
//! let workers: Vec<_> = (0..4)
//!     .map(|w| {
//!         let redlock = redlock.clone();
//!         std::thread::spawn(move || {
//!             let guard = redlock.lock("report", Duration::from_secs(5)).wait()?;
//!             println!("worker {w} holds it until {:?}", guard.valid_until());
//!             guard.release().wait() // or drop it: the release is queued, never blocks
//!         })
//!     })
//!     .collect();
//! for w in workers {
//!     w.join().unwrap()?;
//! }
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
//!
//! In async code, `.await` the same operations (any executor); dropping the future cancels
//! the attempt, and a lock granted after the drop is released.
//!
//! # Auto-extension with a lost-lock signal
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start(3)?;
//! # let urls = local.urls();
//! # use std::time::Duration;
//! let mut redlock = redlock_mux::Redlock::new(&urls)?;
//! let held = redlock.run_locked("nightly", Duration::from_secs(5), |signal| {
//!     let mut steps = 0;
//!     while steps < 3 && !signal.wait_lost(Duration::from_millis(10)) {
//!         steps += 1; // a step of work; stop as soon as the signal fires
//!     }
//!     steps
//! })?;
//! println!("{} steps, held throughout: {}", held.value, held.held_throughout);
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
//!
//! # Deadlines and cancellation
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start(3)?;
//! # let urls = local.urls();
//! # use std::time::{Duration, Instant};
//! let mut redlock = redlock_mux::Redlock::new(&urls)?;
//! let cancel = redlock.cancel_handle();
//! std::thread::spawn(move || cancel.cancel()); // from anywhere
//! let deadline = Instant::now() + Duration::from_secs(2);
//! match redlock.lock_with_deadline("job", Duration::from_secs(5), deadline) {
//!     Ok(lock) => redlock.release(lock)?,
//!     Err(redlock_mux::Error::Cancelled | redlock_mux::Error::DeadlineExceeded(_)) => {}
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
//!
//! # Multi-resource locks
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start(3)?;
//! # let urls = local.urls();
//! # use std::time::Duration;
//! let mut redlock = redlock_mux::Redlock::new(&urls)?;
//! let both = redlock.lock_many(["account:1", "account:2"], Duration::from_secs(5))?;
//! redlock.release(both)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
//!
//! # Fencing tokens and the amnesia guard
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"])?;
//! # let urls = local.urls();
//! # use std::time::Duration;
//! let mut redlock = redlock_mux::Redlock::builder()
//!     .masters(&urls)   // with appendonly yes and appendfsync always: fencing needs it
//!     .fencing(true)    // two more round trips per acquire
//!     .build()?;
//! let lock = redlock.lock("ledger", Duration::from_secs(30))?;
//! let token = lock.fencing_token().unwrap(); // send it with every write
//! # assert!(token >= 1);
//! redlock.release(lock)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
//!
//! # Many locks in flight from one thread
//!
//! ```
//! # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let local = redlock_mux::local::LocalMasters::start(3)?;
//! # let urls = local.urls();
//! # use std::time::Duration;
//! let mut redlock = redlock_mux::Redlock::new(&urls)?;
//! let resources: Vec<String> = (0..64).map(|i| format!("sku:{i}")).collect();
//! let mut results = Vec::with_capacity(64);
//! redlock.try_lock_batch(&resources, Duration::from_secs(5), &mut results)?;
//! let locks: Vec<_> = results.drain(..).filter_map(Result::ok).collect();
//! let mut released = Vec::with_capacity(64);
//! redlock.release_batch(locks, &mut released)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "local"))] fn main() {}
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Local `redis-server` processes and clusters for the tests, the benches and `redlock
// bench`: public behind its feature, for tests of code that uses the client too.
#[cfg(feature = "local")]
pub mod local;
pub mod resp;

#[cfg(feature = "client")]
mod builder;
// The sans-IO core: public (hidden) only for the simulation and the fuzz targets, which
// drive the code users run.
#[cfg(feature = "client")]
#[doc(hidden)]
pub mod core;
#[cfg(feature = "client")]
mod driver;
#[cfg(feature = "client")]
mod error;
#[cfg(feature = "client")]
mod inspect;
#[cfg(feature = "client")]
mod keep;
#[cfg(feature = "client")]
mod lock;
// The rules and the scripts are the core's internals, public (hidden) only for the
// simulation, the fuzz targets and the benches' floor client.
#[cfg(feature = "client")]
#[doc(hidden)]
pub mod rules;
#[cfg(feature = "client")]
#[doc(hidden)]
pub mod scripts;
#[cfg(feature = "client")]
mod shared;
#[cfg(feature = "client")]
mod single;
// Cluster hash slots and the per-slot hash tags of the keys kept beside a lock key:
// public (hidden) for the simulation, which names those keys as the scripts do. No
// dependency: `local` (which may be built without the client) uses it too.
#[doc(hidden)]
pub mod slot;
#[cfg(feature = "client")]
mod stats;
#[cfg(feature = "client")]
mod token;
#[cfg(feature = "client")]
mod url;

#[cfg(feature = "client")]
pub use crate::core::WaitMode;
#[cfg(feature = "client")]
pub use builder::Builder;
#[cfg(feature = "client")]
pub use error::{Error, Operation, Report};
#[cfg(feature = "client")]
pub use inspect::{ForcedRelease, Inspection, MasterRemoval, MasterView, Waiter};
#[cfg(feature = "client")]
pub use keep::HoldOptions;
#[cfg(feature = "client")]
pub use lock::Lock;
#[cfg(feature = "client")]
pub use rules::{ErrorText, Fault, Outcome, TlsFault};
#[cfg(feature = "client")]
pub use shared::{LockGuard, Lost, Pending, SharedRedlock};
#[cfg(feature = "client")]
pub use single::{CancelHandle, Held, LockSignal, Redlock};
#[cfg(feature = "client")]
pub use stats::{Latency, MasterStats};
#[cfg(feature = "client")]
pub use token::Token;
// URL parsing for the `redlock` binary (`status`).
#[cfg(feature = "client")]
#[doc(hidden)]
pub use url::{Endpoint, MasterSpec};

#[cfg(feature = "client")]
pub use lock::{MAX_RESOURCE_LEN, MAX_TTL};

/// The README's Rust snippets, compiled as doc tests (`cargo test --doc`).
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust snippets of `docs/library.md`, compiled as doc tests.
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../docs/library.md")]
pub struct LibraryDoctests;

/// The Rust snippets of `docs/production.md`, compiled as doc tests.
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../docs/production.md")]
pub struct ProductionDoctests;

/// The Rust snippets of `docs/tls.md`, compiled as doc tests.
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../docs/tls.md")]
pub struct TlsDoctests;
