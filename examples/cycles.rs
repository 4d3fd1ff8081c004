//! Run lock+release cycles against local masters (or `REDLOCK_MASTERS`), for profiling
//! and syscall counting:
//!
//! ```sh
//! cargo build --release --features local --example cycles
//! strace -c -e trace=!wait4 target/release/examples/cycles 10000
//! ```
//!
//! Only the main thread is traced without `-f`, and the client runs on it; setup is a few
//! hundred syscalls, noise next to 10 000 cycles. `BATCH=64` makes every cycle a
//! `try_lock_batch` + `release_batch` of 64 resources.
use std::time::{Duration, Instant};

use redlock_mux::local::LocalMasters;
use redlock_mux::Redlock;

fn main() {
    let cycles: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let busy = std::env::var_os("BUSY").is_some();
    let (_local, urls) = match std::env::var("REDLOCK_MASTERS") {
        Ok(list) => (
            None,
            list.split(',').map(str::to_string).collect::<Vec<_>>(),
        ),
        Err(_) => {
            let m = LocalMasters::start(5).expect("local masters (is redis-server installed?)");
            let urls = m.urls();
            (Some(m), urls)
        }
    };
    let mut c = Redlock::builder()
        .masters(&urls)
        .retry_count(0)
        // Generous: under valgrind the first round (connect + handshake) is slow.
        .node_timeout(Duration::from_secs(2))
        .busy_poll(busy)
        .build()
        .expect("client");
    let ttl = Duration::from_secs(10);
    for _ in 0..100 {
        let l = c.try_lock("cycles", ttl).unwrap();
        c.release(l).unwrap();
    }
    // `BATCH=k`: each cycle is `try_lock_batch` + `release_batch` of k resources.
    let batch: usize = std::env::var("BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let names: Vec<String> = (0..batch).map(|j| format!("cycles:{j}")).collect();
    let (mut out, mut locks, mut rel) = (Vec::new(), Vec::new(), Vec::new());
    let before: Vec<_> = c.stats();
    let t = Instant::now();
    for _ in 0..cycles {
        if batch > 0 {
            c.try_lock_batch(&names, ttl, &mut out).unwrap();
            locks.extend(out.drain(..).map(|r| r.unwrap()));
            c.release_batch(locks.drain(..), &mut rel).unwrap();
            continue;
        }
        let l = c.try_lock("cycles", ttl).unwrap();
        c.release(l).unwrap();
    }
    let el = t.elapsed();
    let after = c.stats();
    let writes: u64 = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.writes() - b.writes())
        .sum();
    let reads: u64 = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.reads() - b.reads())
        .sum();
    println!(
        "{cycles} cycles on {} masters in {el:.2?}: {:.1} µs/cycle; per cycle {:.2} writes, {:.2} reads",
        urls.len(),
        el.as_secs_f64() * 1e6 / cycles as f64,
        writes as f64 / cycles as f64,
        reads as f64 / cycles as f64
    );
    for (i, s) in after.iter().enumerate() {
        if s.disconnects() > 0 {
            println!(
                "master {i}: {} disconnects, last: {:?}",
                s.disconnects(),
                s.last_fault()
            );
        }
    }
}
