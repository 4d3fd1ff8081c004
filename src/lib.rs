#![forbid(unsafe_code)]
pub mod resp;
