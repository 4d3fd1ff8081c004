#![forbid(unsafe_code)]
#[cfg(feature = "local")]
pub mod local;
pub mod resp;
