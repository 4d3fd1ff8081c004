//! The plain-socket floor's lock+release cycles against 5 local masters, for comparing
//! instruction counts with `examples/cycles.rs` under `valgrind --tool=callgrind`.
use redlock_mux::local::LocalMasters;

#[path = "../benches/common/floor.rs"]
mod floor;

fn main() {
    let cycles: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let m = LocalMasters::start(5).expect("local masters (is redis-server installed?)");
    let mut f = floor::Floor::new(&m.addrs(), false);
    for _ in 0..100 {
        f.cycle();
    }
    let t = std::time::Instant::now();
    for _ in 0..cycles {
        f.cycle();
    }
    println!("{cycles} floor cycles in {:.2?}", t.elapsed());
}
