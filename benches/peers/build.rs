//! Records the resolved versions of the peer crates (from this package's own Cargo.lock)
//! so the bench output states exactly what was measured.

use std::collections::BTreeMap;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut name: Option<String> = None;
    for line in lock.lines() {
        if let Some(v) = line.strip_prefix("name = ") {
            name = Some(v.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            versions
                .entry(n)
                .or_default()
                .push(v.trim_matches('"').to_string());
        }
    }
    for (krate, var) in [
        ("rslock", "PEERS_V_RSLOCK"),
        ("redlock", "PEERS_V_REDLOCK"),
        ("redis", "PEERS_V_REDIS"),
        ("tokio", "PEERS_V_TOKIO"),
        ("redlock-mux", "PEERS_V_MUX"),
    ] {
        let v = versions
            .get(krate)
            .map(|v| v.join("/"))
            .unwrap_or_else(|| "?".into());
        println!("cargo:rustc-env={var}={v}");
    }
}
