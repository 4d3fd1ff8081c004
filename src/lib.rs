//! # redlock-mux
//!
//! A Redlock client over N independent Redis masters, speaking raw RESP from one thread
//! and one `mio` event loop: every lock operation writes its request to all masters at
//! once, then reads the answers as they arrive.
//!
//! * [`resp`]: a strict, bounded, zero-allocation RESP2/RESP3 parser and encoder, usable
//!   alone (`default-features = false`).
//! * [`rules`]: the Redlock rules (quorum, validity, verdicts) as plain, testable state.
//! * [`Redlock`]: the blocking client (feature `client`, on by default).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "local")]
pub mod local;
pub mod resp;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod error;
#[cfg(feature = "client")]
mod hold;
#[cfg(feature = "client")]
mod net;
#[cfg(feature = "client")]
pub mod rules;
#[cfg(feature = "client")]
pub mod scripts;
#[cfg(feature = "client")]
mod token;
#[cfg(feature = "client")]
mod url;

#[cfg(feature = "client")]
pub use client::{Builder, CancelHandle, Lock, Redlock, MAX_RESOURCE_LEN, MAX_TTL};
#[cfg(feature = "client")]
pub use error::{Error, Operation, Report};
#[cfg(feature = "client")]
pub use hold::{Held, HoldOptions, LockSignal};
#[cfg(feature = "client")]
pub use net::NodeStats;
#[cfg(feature = "client")]
pub use rules::{Fault, Outcome};
#[cfg(feature = "client")]
pub use token::Token;
#[cfg(feature = "client")]
pub use url::MasterSpec;
