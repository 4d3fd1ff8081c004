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
/// for the fuzzer in the normal test run: 8,000 (about 6 s in a debug build). A failure
/// prints the input to add as a seed.
#[test]
fn engine_body_survives_seeded_mutations() {
    let seeds: Vec<Vec<u8>> = seeds().into_iter().map(|(_, d)| d).collect();
    let mut rng = fastrand::Rng::with_seed(0x5eed_e791);
    for i in 0..8_000u32 {
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

/// A random input shaped like the layout (`fuzz/engine_body.rs`): a random client
/// configuration, then 1 to 40 well-formed events, the ones that move rounds along
/// (submissions, owed answers to every link) more often than the rest.
fn random_input(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut d = vec![
        rng.u8(..),                              // masters
        rng.u8(..),                              // flags
        rng.u8(..),                              // retry count
        rng.u8(..=120),                          // retry delay, ms
        rng.u8(..=60),                           // retry jitter, ms
        if rng.bool() { 0 } else { rng.u8(..) }, // node timeout
        rng.u8(..),                              // drift
    ];
    let minv: u16 = if rng.u8(..4) == 0 { rng.u16(..) } else { 0 };
    d.extend_from_slice(&minv.to_le_bytes());
    for _ in 0..2 {
        d.push(rng.u8(..4));
        d.extend_from_slice(&rng.u16(..2000).to_le_bytes());
    }
    d.extend_from_slice(&rng.u16(..).to_le_bytes()); // amnesia extra
    d.push(rng.u8(..)); // connect timeout
    d.push(rng.u8(..)); // stall timeout
    d.push(if rng.u8(..4) == 0 { rng.u8(..) } else { 0 }); // manual connects
    d.push(if rng.u8(..4) == 0 { rng.u8(1..) } else { 0 }); // write cap
    d.push(rng.u8(..)); // seed
    d.push(rng.u8(..)); // ending
    let link = |rng: &mut fastrand::Rng| match rng.u8(..6) {
        0..=2 => 255,
        3 => 254,
        _ => rng.u8(..),
    };
    for _ in 0..rng.usize(1..=40) {
        match rng.u8(..17) {
            0..=2 => d.extend_from_slice(&[0, rng.u8(..), rng.u8(..30)]),
            3..=6 => d.extend_from_slice(&[rng.u8(1..=4), rng.u8(..)]),
            7 => d.extend_from_slice(&[5, link(rng), rng.u8(..)]),
            8 => {
                let len = rng.u8(..20);
                d.extend_from_slice(&[6, link(rng), len]);
                d.extend((0..len).map(|_| rng.u8(..)));
            }
            9 => d.extend_from_slice(&[7, link(rng), rng.u8(..), rng.u8(..4)]),
            10..=12 => {
                let mood = if rng.bool() { rng.u8(..2) } else { rng.u8(..) };
                let split = if rng.u8(..4) == 0 { rng.u8(..) } else { 0 };
                d.extend_from_slice(&[8, link(rng), mood, rng.u8(..4), split]);
            }
            13 => d.extend_from_slice(&[9, link(rng), rng.u8(..)]),
            14 => {
                let scale = if rng.u8(..8) == 0 {
                    rng.u8(..)
                } else {
                    rng.u8(..2)
                };
                let v: u32 = if rng.bool() {
                    rng.u32(..300)
                } else {
                    rng.u32(..)
                };
                d.extend_from_slice(&[10, scale]);
                d.extend_from_slice(&v.to_le_bytes());
            }
            15 => d.extend_from_slice(&[11, rng.u8(..)]),
            _ => {
                let away: u16 = if rng.bool() {
                    rng.u16(..3000)
                } else {
                    rng.u16(..)
                };
                d.push(12);
                d.extend_from_slice(&away.to_le_bytes());
            }
        }
    }
    d
}

/// Seeded random inputs shaped like the layout: 4,000 of them (about 3 s in a debug build).
#[test]
fn engine_body_survives_random_inputs() {
    let mut rng = fastrand::Rng::with_seed(0x7a5d_0e61);
    for i in 0..4_000u32 {
        let d = random_input(&mut rng);
        if let Some(msg) = run(&d) {
            panic!("random input {i} failed: {msg}\ninput (add it to fuzz/seeds/engine/): {d:?}");
        }
    }
}

/// Replays one input file with a trace of every event (`ENGINE_TRACE=1 ENGINE_INPUT=path
/// [ENGINE_STRICT=n] cargo test --test fuzz_engine_corpus replay_one -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn replay_one() {
    let path = std::env::var("ENGINE_INPUT").expect("ENGINE_INPUT=<file>");
    let strict: u8 = std::env::var("ENGINE_STRICT").map_or(0, |s| s.parse().expect("a number"));
    let data = std::fs::read(&path).expect("read the input");
    engine_body::engine_body_with(&data, strict);
}

/// The panic message of `engine_body_with(data, strict)`, if it panicked.
fn run_with(data: &[u8], strict: u8) -> Option<String> {
    let err = std::panic::catch_unwind(|| engine_body::engine_body_with(data, strict)).err()?;
    Some(
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

/// Shrinks a failing input: removes chunks (halves down to single bytes) and lowers bytes
/// while it fails with a message that starts like the first one (up to its first digit).
/// `ENGINE_INPUT=path [ENGINE_STRICT=n] cargo test --test fuzz_engine_corpus minimize --
/// --ignored --nocapture`; writes `path.min`.
#[test]
#[ignore]
fn minimize() {
    let path = std::env::var("ENGINE_INPUT").expect("ENGINE_INPUT=<file>");
    let strict: u8 = std::env::var("ENGINE_STRICT").map_or(0, |s| s.parse().expect("a number"));
    let mut data = std::fs::read(&path).expect("read the input");
    let first = run_with(&data, strict).expect("the input does not fail");
    let key: String = first.chars().take_while(|c| !c.is_ascii_digit()).collect();
    let fails = |d: &[u8]| run_with(d, strict).is_some_and(|m| m.starts_with(&key));
    let mut chunk = data.len() / 2;
    while chunk >= 1 {
        let mut at = 23.min(data.len());
        while at < data.len() {
            let end = (at + chunk).min(data.len());
            let mut d = data.clone();
            d.drain(at..end);
            if fails(&d) {
                data = d;
            } else {
                at += chunk;
            }
        }
        chunk /= 2;
    }
    for i in 0..data.len() {
        for v in [0u8, 1] {
            if data[i] > v {
                let mut d = data.clone();
                d[i] = v;
                if fails(&d) {
                    data = d;
                    break;
                }
            }
        }
    }
    std::fs::write(format!("{path}.min"), &data).expect("write");
    println!(
        "{} bytes: {:?}\n{}",
        data.len(),
        data,
        run_with(&data, strict).unwrap()
    );
}

/// Looks for inputs that break the strict properties (`ENGINE_STRICT`, default both):
/// seeded mutations of the seeds and of random inputs; writes the first failure per
/// message to /tmp/engine-strict-N.
#[test]
#[ignore]
fn hunt_strict() {
    let strict: u8 = std::env::var("ENGINE_STRICT").map_or(3, |s| s.parse().expect("a number"));
    let seeds: Vec<Vec<u8>> = seeds().into_iter().map(|(_, d)| d).collect();
    let mut rng = fastrand::Rng::with_seed(0x4a11);
    let mut seen = std::collections::HashSet::new();
    for i in 0..20_000u32 {
        let mut d = seeds[rng.usize(..seeds.len())].clone();
        if i % 2 == 1 {
            d = random_input(&mut rng);
        }
        for _ in 0..rng.usize(0..=8) {
            let at = rng.usize(..=d.len());
            match rng.u8(..3) {
                0 if at < d.len() => d[at] = rng.u8(..),
                1 => d.insert(at, rng.u8(..)),
                _ => {
                    let other = &seeds[rng.usize(..seeds.len())];
                    let from = rng.usize(..other.len());
                    let piece: Vec<u8> = other[from..].iter().take(24).copied().collect();
                    d.splice(at.max(23.min(d.len()))..at.max(23.min(d.len())), piece);
                }
            }
        }
        if let Some(msg) = run_with(&d, strict) {
            let key: String = msg.chars().take_while(|c| !c.is_ascii_digit()).collect();
            if seen.insert(key.clone()) {
                let path = format!("/tmp/engine-strict-{}", seen.len());
                std::fs::write(&path, &d).unwrap();
                println!("{i}: {path}: {msg}");
            }
        }
    }
}

fn seed(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds/engine")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// BUG engine-fuzz-1 (`engine_body::STRICT_TIMERS`; /work/notes/FUZZ_NOTES.md): a waiter
/// whose attempt on a notice is refused sleeps until the timed retry it planned before,
/// which has passed: `next_timer` is in the past after the step. Fixed (the seeds fail on the
/// code before the fix).
#[test]
fn strict_timers_bug_engine_fuzz_1() {
    for name in ["strict_bug_1_overdue_wake", "strict_bug_1_minimized"] {
        engine_body::engine_body_with(&seed(name), engine_body::STRICT_TIMERS);
    }
}

/// BUG engine-fuzz-2 (`engine_body::STRICT_CONNECTS`): a subscription link reconnected by
/// the timer tick has no timer for its connect timeout. Fixed (the seed fails on the code
/// before the fix).
#[test]
fn strict_connects_bug_engine_fuzz_2() {
    engine_body::engine_body_with(
        &seed("strict_bug_2_sub_connect_timer"),
        engine_body::STRICT_CONNECTS,
    );
}
