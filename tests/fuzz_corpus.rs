//! Replays the checked-in fuzz seeds (`fuzz/seeds/<target>/`) through the fuzz targets'
//! bodies (`fuzz/bodies.rs`), so the targets are exercised by every `cargo test` and cannot
//! rot. A local fuzzing run's corpus (`fuzz/corpus/<target>/`, not tracked) is replayed too
//! when present.

#[path = "../fuzz/bodies.rs"]
mod bodies;

use std::path::{Path, PathBuf};

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

fn replay(target: &str, body: fn(&[u8]), min_seeds: usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let seeds = files(&root.join("seeds").join(target));
    assert!(
        seeds.len() >= min_seeds,
        "fuzz/seeds/{target}/ has {} files, expected at least {min_seeds}",
        seeds.len()
    );
    let mut all = seeds;
    all.extend(files(&root.join("corpus").join(target)));

    let mut failed = Vec::new();
    for path in &all {
        let data = std::fs::read(path).expect("read seed");
        if std::panic::catch_unwind(|| body(&data)).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs failed:\n{}",
        failed.len(),
        all.len(),
        failed.join("\n")
    );
}

#[test]
fn replay_parse() {
    replay("parse", bodies::parse_body, 20);
}

#[test]
fn replay_fragment() {
    replay("fragment", bodies::fragment_body, 20);
}

#[test]
fn replay_roundtrip() {
    replay("roundtrip", bodies::roundtrip_body, 20);
}
