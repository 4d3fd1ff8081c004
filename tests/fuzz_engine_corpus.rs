//! Replays the checked-in seeds of the `engine` fuzz target (`fuzz/seeds/engine/`) through
//! its body (`fuzz/engine_body.rs`: the real sans-IO core, driven in simulated time), so the
//! target is exercised by every `cargo test` and cannot rot. A local fuzzing run's corpus
//! (`fuzz/corpus/engine/`, not tracked) is replayed too when present. Then seeded random
//! mutations of the seeds, and seeded random inputs: a cheap stand-in for the fuzzer.

#[path = "../fuzz/engine_body.rs"]
mod engine_body;

use std::path::{Path, PathBuf};

use engine_body::engine_body;

/// Every regular file under `dir` (not recursive), sorted; none if `dir` is absent.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .map(|e| e.expect("read_dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut all = files(&root.join("seeds").join("engine"));
    assert!(
        all.len() >= 20,
        "fuzz/seeds/engine/ has {} files, expected at least 20 (python3 fuzz/make_engine_seeds.py)",
        all.len()
    );
    all.extend(files(&root.join("corpus").join("engine")));
    all.iter()
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read(p).expect("read seed"),
            )
        })
        .collect()
}

/// Runs `engine_body` on `data`; the panic message if it panicked.
fn run(data: &[u8]) -> Option<String> {
    let err = std::panic::catch_unwind(|| engine_body(data)).err()?;
    Some(
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(not a string)".into()),
    )
}

#[test]
fn replay_engine_seeds() {
    let mut failed = Vec::new();
    let all = seeds();
    for (name, data) in &all {
        if let Some(msg) = run(data) {
            failed.push(format!("{name}: {msg}"));
        }
    }
    assert!(
        failed.is_empty(),
        "engine: {} of {} inputs failed:\n{}",
        failed.len(),
        all.len(),
        failed.join("\n")
    );
}

/// Seeded byte-level mutations of the seeds (flip, insert, delete, splice), a cheap stand-in
/// for the fuzzer in the normal test run. A failure prints the input to add as a seed.
#[test]
fn engine_body_survives_seeded_mutations() {
    let seeds: Vec<Vec<u8>> = seeds().into_iter().map(|(_, d)| d).collect();
    let mut rng = fastrand::Rng::with_seed(0x5eed_e791);
    for i in 0..3_000u32 {
        let mut d = seeds[rng.usize(..seeds.len())].clone();
        for _ in 0..rng.usize(1..=8) {
            match rng.u8(..4) {
                0 if !d.is_empty() => {
                    let at = rng.usize(..d.len());
                    d[at] = rng.u8(..);
                }
                1 => {
                    let at = rng.usize(..=d.len());
                    d.insert(at, rng.u8(..));
                }
                2 if d.len() > 1 => {
                    d.remove(rng.usize(..d.len()));
                }
                _ => {
                    let other = &seeds[rng.usize(..seeds.len())];
                    let from = rng.usize(..other.len());
                    let at = rng.usize(..=d.len());
                    let piece: Vec<u8> = other[from..].iter().take(16).copied().collect();
                    d.splice(at..at, piece);
                }
            }
        }
        if let Some(msg) = run(&d) {
            panic!("mutation {i} failed: {msg}\ninput (add it to fuzz/seeds/engine/): {d:?}");
        }
    }
}

/// Seeded random inputs: a random header (any client configuration) and random events,
/// 2,000 of them, up to 400 bytes each.
#[test]
fn engine_body_survives_random_inputs() {
    let mut rng = fastrand::Rng::with_seed(0x7a5d_0e61);
    for i in 0..2_000u32 {
        let len = rng.usize(1..=400);
        let d: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        if let Some(msg) = run(&d) {
            panic!("random input {i} failed: {msg}\ninput (add it to fuzz/seeds/engine/): {d:?}");
        }
    }
}

/// Replays one input file with a trace of every event (`ENGINE_TRACE=1 ENGINE_INPUT=path
/// cargo test --test fuzz_engine_corpus replay_one -- --ignored --nocapture`).
#[test]
#[ignore]
fn replay_one() {
    let path = std::env::var("ENGINE_INPUT").expect("ENGINE_INPUT=<file>");
    let data = std::fs::read(&path).expect("read the input");
    engine_body(&data);
}
