//! Fuzz target `fragment`: the body is `fragment_body` in `fuzz/bodies.rs`, shared with the
//! corpus-replay test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::fragment_body(data));
