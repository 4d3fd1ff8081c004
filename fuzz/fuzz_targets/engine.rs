//! Fuzz target `engine`: the real sans-IO client core (`redlock_mux::core::Core`) driven by
//! structure-aware events (calls, connects, replies, time). The body is `engine_body` in
//! `fuzz/engine_body.rs`, shared with the corpus-replay test `tests/fuzz_engine_corpus.rs`.
#![no_main]

#[path = "../engine_body.rs"]
mod engine_body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| engine_body::engine_body(data));
