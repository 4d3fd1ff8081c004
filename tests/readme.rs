//! The README as a newcomer reads it (issue 20): short enough to read in five minutes, the
//! dependency line with its features, the two commands with how long they take, links
//! that lead somewhere, and every Rust snippet (README and `docs/`) compiled as a doc test.
//! (It was 931 lines, with no `[dependencies]` line and no durations.)

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fenced blocks of a markdown text: (info string, body).
fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in md.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (fence, open.take()) {
            (Some(info), None) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(block)) => out.push(block),
            (None, Some((info, mut body))) => {
                body.push_str(line);
                body.push('\n');
                open = Some((info, body));
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

/// Rust blocks as rustdoc sees them: info `rust...`, or none at all.
fn is_rust(info: &str) -> bool {
    info.is_empty() || info.split(',').next() == Some("rust")
}

#[test]
fn the_readme_is_short_and_says_how_to_add_it_and_how_long_the_commands_take() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines (at most 300)");

    let toml: Vec<String> = blocks(&readme)
        .into_iter()
        .filter(|(info, _)| info == "toml")
        .map(|(_, body)| body)
        .collect();
    assert!(
        toml.iter().any(|b| b.contains("[dependencies]")
            && b.contains("redlock-mux = {")
            && b.contains("features = [\"tls\"]")),
        "no [dependencies] block with the crate and its features: {toml:?}"
    );
    for feature in ["`client`", "`tls`", "`tracing`", "`cli`"] {
        assert!(
            readme.contains(&format!("| {feature}")),
            "the feature table lacks {feature}"
        );
    }

    // The two commands, as a newcomer copies them, and how long each takes.
    let commands = blocks(&readme)
        .into_iter()
        .find(|(info, body)| info == "sh" && body.contains("scripts/bench.sh"))
        .map(|(_, body)| body)
        .expect("a sh block with the two commands");
    for script in ["scripts/bench.sh", "scripts/test.sh"] {
        assert!(commands.contains(script), "{script} not in {commands}");
        assert!(root().join(script).is_file(), "{script} does not exist");
        let said = readme
            .lines()
            .any(|l| l.contains(&format!("`{script}`")) && l.contains("minute"));
        assert!(said, "the README does not say how long {script} takes");
    }
}

#[test]
fn every_relative_link_of_the_readme_leads_to_a_file() {
    let readme = read(&root().join("README.md"));
    let mut links = 0;
    for (i, _) in readme.match_indices("](") {
        let target = &readme[i + 2..];
        let target = &target[..target.find(')').expect("a closed link")];
        if target.starts_with("http") || target.starts_with('#') {
            continue;
        }
        let target = target.split('#').next().unwrap_or(target);
        links += 1;
        assert!(
            root().join(target).is_file(),
            "README.md links to {target}, which does not exist"
        );
    }
    assert!(links > 0, "no links to docs/");
}

/// Every markdown file with Rust blocks is compiled by `cargo test --doc`: src/lib.rs
/// includes it (`#[doc = include_str!(...)]`) under `cfg(doctest)`, and no block opts out
/// with `ignore`. A snippet that no longer compiles fails the doc tests.
#[test]
fn every_rust_snippet_of_the_readme_and_docs_is_a_doc_test() {
    let lib = read(&root().join("src/lib.rs"));
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut compiled = 0;
    for file in files {
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let rust: Vec<(String, String)> = blocks(&read(&file))
            .into_iter()
            .filter(|(info, _)| is_rust(info))
            .collect();
        if rust.is_empty() {
            continue;
        }
        assert!(
            lib.contains(&format!("#[doc = include_str!(\"../{rel}\")]")),
            "{rel} has {} Rust blocks, but src/lib.rs does not include it as doc tests \
             (a block with no language is Rust to rustdoc: mark text blocks `text`)",
            rust.len()
        );
        for (info, body) in &rust {
            assert!(
                !info.contains("ignore"),
                "{rel}: a Rust block is not compiled ({info}):\n{body}"
            );
        }
        compiled += rust.len();
    }
    assert!(compiled >= 2, "{compiled} Rust snippets found");
}
