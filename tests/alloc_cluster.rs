//! A warm lock+release cycle allocates nothing on cluster masters either (issue 22): the
//! requests routed by slot over the shards' connections and the replies put back in order
//! (`ShardMux`) reuse their buffers, and so does the periodic refresh of the map. Counted with a global allocator, as `alloc_engine`
//! does for standalone masters.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redlock_mux::local::LocalCluster;
use redlock_mux::Redlock;

#[path = "support/alloc.rs"]
mod alloc;
use alloc::{ALLOCS, COUNTING};

/// One test function on purpose: the counter is process-wide.
#[test]
fn warm_cycles_on_cluster_masters_allocate_nothing() {
    let clusters: Vec<LocalCluster> = (0..3)
        .map(|_| LocalCluster::start().unwrap_or_else(|e| panic!("cannot start a cluster: {e}")))
        .collect();
    let mut c = Redlock::builder()
        .masters(clusters.iter().map(LocalCluster::seed_url))
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    // Keys on every shard.
    let keys = [
        "alloc-a", "alloc-b", "alloc-c", "alloc-d", "alloc-e", "alloc-f",
    ];
    let shards: std::collections::BTreeSet<usize> = keys
        .iter()
        .map(|k| clusters[0].primary_of_key(k.as_bytes()).unwrap())
        .collect();
    assert_eq!(shards.len(), 3, "the keys cover every shard");
    let mut extended = c.try_lock("alloc-ext", ttl).unwrap();
    let cycle = |c: &mut Redlock, extended: &mut redlock_mux::Lock| {
        for k in keys {
            let lock = c.try_lock(k, ttl).unwrap();
            c.release(lock).unwrap();
        }
        c.extend(extended, ttl).unwrap();
    };
    for _ in 0..300 {
        cycle(&mut c, &mut extended);
    }
    // Counted for longer than the map's refresh period (10 s): a refresh of each cluster's
    // map falls inside, and allocates nothing either.
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let start = std::time::Instant::now();
    let mut cycles = 0;
    while start.elapsed() < Duration::from_secs(11) && cycles < 1_000_000 {
        cycle(&mut c, &mut extended);
        cycles += 1;
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    c.release(extended).unwrap();
    assert_eq!(
        n, 0,
        "{n} allocations in {cycles} warm cycles of 6 lock+release and an extend on cluster masters"
    );
}
