//! Cluster masters (issue 22): a Redlock master that is a Redis Cluster, reached with
//! `redis+cluster://`, against real local clusters of three primaries each.
//!
//! What is checked: locks land on the shard that serves their key and are gone from it
//! after the release (the client routes every request by slot, over one connection per
//! shard); a slot moved to another shard after the client learned the map is followed
//! (`-MOVED`, resent once); a shard primary killed fails that cluster master's votes only
//! (its connection as a whole is lost, the other masters still make the quorum).

mod support;

use std::time::Duration;

use redlock_mux::local::{command, key_slot, AdminReply, FailoverMode, LocalCluster};
use redlock_mux::Redlock;

const T: Duration = Duration::from_secs(2);

/// Every master's answer is awaited this long: the assertions below count on each
/// cluster's vote, on a loaded machine too (a cluster's first connection is a discovery,
/// three connections and their handshakes).
const ROUND: Duration = Duration::from_secs(2);

fn cluster() -> LocalCluster {
    LocalCluster::start().unwrap_or_else(|e| panic!("cannot start a local cluster: {e}"))
}

/// `GET key` on every node of `c`: (node, value) where it answered (the others: MOVED).
fn holders(c: &LocalCluster, key: &str) -> Vec<(usize, Option<Vec<u8>>)> {
    c.nodes()
        .iter()
        .enumerate()
        .filter_map(
            |(k, n)| match command(n.addr(), &[b"GET", key.as_bytes()], T) {
                Ok(AdminReply::Bulk(v)) => Some((k, v)),
                Ok(AdminReply::Error(e)) if e.starts_with("MOVED") => None,
                r => panic!("GET {key} on node {k}: {r:?}"),
            },
        )
        .collect()
}

/// A client of `clusters` (no retries, a generous round timeout), connected: its first
/// lock read every cluster's map and connected every shard.
fn warm_client(clusters: &[LocalCluster]) -> Redlock {
    let mut client = Redlock::builder()
        .masters(clusters.iter().map(LocalCluster::seed_url))
        .retry_count(0)
        .node_timeout(ROUND)
        .build()
        .unwrap();
    let warm = client.try_lock("warm", Duration::from_secs(10)).unwrap();
    client.release(warm).unwrap();
    client
}

/// Returns once every master of `client` has answered everything sent to it before: the
/// client's calls return at a quorum, a late master answers after. An inspection waits for
/// every master's answer, and a cluster master answers in request order.
fn settle(client: &mut Redlock) {
    let seen = client.inspect("settle").unwrap();
    assert_eq!(seen.answered(), 3, "every master answered: {seen}");
}

/// `count` keys served by primary `node` of `c`.
fn keys_on(c: &LocalCluster, node: usize, count: usize, prefix: &str) -> Vec<String> {
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| c.primary_of_key(k.as_bytes()).unwrap() == node)
        .take(count)
        .collect()
}

#[test]
fn locks_on_cluster_masters_land_on_the_shard_of_their_key() {
    let clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    // Connected (a discovery and a connection per shard, for each master).
    let mut client = warm_client(&clusters);
    for node in 0..3 {
        for key in keys_on(&clusters[0], node, 4, &format!("sku:{node}:")) {
            let lock = client
                .try_lock(&key, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            settle(&mut client);
            for (c, cluster) in clusters.iter().enumerate() {
                let h = holders(cluster, &key);
                let node = cluster.primary_of_key(key.as_bytes()).unwrap();
                assert_eq!(h.len(), 1, "{key} on cluster {c}: {h:?}");
                assert_eq!(h[0].0, node, "{key} on cluster {c}: served by node {node}");
                assert_eq!(h[0].1.as_deref(), Some(lock.token().as_bytes()), "{key}");
            }
            client.release(lock).unwrap();
            settle(&mut client);
            for cluster in &clusters {
                let node = cluster.primary_of_key(key.as_bytes()).unwrap();
                assert_eq!(holders(cluster, &key), [(node, None)], "{key} released");
            }
        }
    }
    // One connection per shard primary and master, made once.
    for s in client.stats() {
        assert_eq!(s.connects(), 1, "{s:?}");
    }
}

#[test]
fn a_slot_moved_after_the_map_was_read_is_followed() {
    let mut clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    // The client reads the maps.
    let mut client = warm_client(&clusters);
    // Move an (empty) slot of node 0 to node 1 in every cluster.
    let key = keys_on(&clusters[0], 0, 1, "moved:").remove(0);
    let slot = key_slot(key.as_bytes());
    for c in &mut clusters {
        assert_eq!(c.primary_of_slot(slot).unwrap(), 0);
        c.move_slot(slot, 1).unwrap();
    }
    let lock = client
        .try_lock(&key, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{key} after its slot moved: {e}"));
    settle(&mut client);
    for c in &clusters {
        assert_eq!(
            holders(c, &key),
            [(1, Some(lock.token().as_bytes().to_vec()))],
            "{key} is on the node its slot moved to"
        );
    }
    client.release(lock).unwrap();
    settle(&mut client);
    for c in &clusters {
        assert_eq!(holders(c, &key), [(1, None)]);
    }
    // Followed within the connection: no reconnect.
    for s in client.stats() {
        assert_eq!(s.connects(), 1, "{s:?}");
    }
}

#[test]
fn a_dead_shard_fails_its_cluster_master_only() {
    let mut clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let mut client = warm_client(&clusters);
    clusters[0].kill(2).unwrap();
    // Every key, whatever its shard: cluster 0's connection is lost as a whole; clusters 1
    // and 2 still make the quorum.
    for node in 0..3 {
        let key = keys_on(&clusters[1], node, 1, "dead:").remove(0);
        let lock = client
            .try_lock(&key, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        client.release(lock).unwrap();
    }
    let stats = client.stats();
    assert!(stats[0].last_fault().is_some(), "{:?}", stats[0]);
}

#[test]
fn multi_resource_locks_span_the_slots_of_cluster_masters() {
    let clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let build = || {
        Redlock::builder()
            .masters(clusters.iter().map(LocalCluster::seed_url))
            .retry_count(0)
            .node_timeout(ROUND)
            .build()
            .unwrap()
    };
    let (mut client, mut other) = (build(), build());
    for c in [&mut client, &mut other] {
        let warm = c.try_lock("warm", Duration::from_secs(10)).unwrap();
        c.release(warm).unwrap();
    }
    // One key per shard, and two sharing a hash tag (one slot group of two keys).
    let mut names: Vec<String> = (0..3)
        .map(|node| keys_on(&clusters[0], node, 1, "many:").remove(0))
        .collect();
    names.push("{tagged}a".into());
    names.push("{tagged}b".into());
    let mut lock = client
        .lock_many(&names, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{names:?}: {e}"));
    settle(&mut client);
    for c in &clusters {
        for name in &names {
            let node = c.primary_of_key(name.as_bytes()).unwrap();
            assert_eq!(
                holders(c, name),
                [(node, Some(lock.token().as_bytes().to_vec()))],
                "{name}"
            );
        }
    }
    // Held: another lock on one of the names is refused everywhere. Its group on the other
    // shard was granted: the cluster masters answer that some groups were (a no vote, and
    // a release there), or taken where the held name's group answered first.
    let e = other
        .lock_many(
            [&names[1], &"free:elsewhere".to_string()],
            Duration::from_secs(10),
        )
        .expect_err("one name is held");
    let text = e.to_string();
    assert!(text.contains("PARTIAL") || text.contains("taken"), "{e}");
    settle(&mut other);
    // Nothing of the refused attempt is left on any shard: the groups it set were released.
    for c in &clusters {
        let node = c.primary_of_key(b"free:elsewhere").unwrap();
        assert_eq!(holders(c, "free:elsewhere"), [(node, None)]);
    }
    client.extend(&mut lock, Duration::from_secs(20)).unwrap();
    settle(&mut client);
    for c in &clusters {
        let n = c.primary_of_key(names[0].as_bytes()).unwrap();
        let ttl = command(c.node(n).addr(), &[b"PTTL", names[0].as_bytes()], T).unwrap();
        assert!(matches!(ttl, AdminReply::Int(t) if t > 10_000), "{ttl:?}");
    }
    client.release(lock).unwrap();
    settle(&mut client);
    for c in &clusters {
        for name in &names {
            let node = c.primary_of_key(name.as_bytes()).unwrap();
            assert_eq!(holders(c, name), [(node, None)], "{name} released");
        }
    }
}

#[test]
fn a_slot_being_migrated_is_followed_with_asking() {
    let mut clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let mut client = warm_client(&clusters);
    let key = keys_on(&clusters[0], 0, 1, "asked:").remove(0);
    let slot = key_slot(key.as_bytes());
    let migrations: Vec<_> = clusters
        .iter_mut()
        .map(|c| c.begin_slot_migration(slot, 1).unwrap())
        .collect();
    // The source does not hold the key: it answers -ASK, the client asks the target.
    let lock = client
        .try_lock(&key, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{key} during its slot's migration: {e}"));
    let asked = |c: &LocalCluster| {
        let r = c
            .node(1)
            .cmds(&[&[b"ASKING"], &[b"GET", key.as_bytes()]])
            .unwrap();
        match &r[1] {
            AdminReply::Bulk(v) => v.clone(),
            r => panic!("{r:?}"),
        }
    };
    for c in &clusters {
        assert_eq!(asked(c).as_deref(), Some(lock.token().as_bytes()));
    }
    client.release(lock).unwrap();
    for c in &clusters {
        assert_eq!(asked(c), None, "released on the target");
    }
    for (c, m) in clusters.iter_mut().zip(migrations) {
        c.finish_slot_migration(m).unwrap();
    }
    // The map did not change on an ASK: still one connection each.
    for s in client.stats() {
        assert_eq!(s.connects(), 1, "{s:?}");
    }
}

/// Until every node of `clusters` has been up for `at_least` (their `INFO server`).
fn wait_uptime(clusters: &[&LocalCluster], at_least: Duration) {
    let deadline = std::time::Instant::now() + at_least + Duration::from_secs(30);
    loop {
        let up = clusters.iter().flat_map(|c| c.nodes()).all(|n| {
            let info = n.cmd(&[b"INFO", b"server"]).unwrap();
            let text = info.as_str().unwrap_or_default().to_string();
            text.lines()
                .find_map(|l| l.trim().strip_prefix("uptime_in_seconds:"))
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|s| s > at_least.as_secs())
        });
        if up {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "uptime never reached");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_failover_is_amnesia_for_its_cluster_master() {
    // Cluster 0 has a replica per primary; a lock is granted while the replica of its
    // key's primary does not replicate, the primary dies, the replica takes over without
    // the key: the cluster forgot a grant, as a master restarted without persistence does.
    let guard = Duration::from_secs(8);
    let mut c0 = LocalCluster::start_with(3, 1, &[]).expect("a cluster with replicas");
    let others: Vec<LocalCluster> = (0..2).map(|_| cluster()).collect();
    wait_uptime(&[&c0, &others[0], &others[1]], guard);
    let urls = [c0.seed_url(), others[0].seed_url(), others[1].seed_url()];
    let build = || {
        Redlock::builder()
            .masters(&urls)
            .retry_count(0)
            .node_timeout(ROUND)
            .amnesia_guard(guard)
            .build()
            .unwrap()
    };
    let (mut a, mut b) = (build(), build());
    // Both clients know the masters as they are before the failover.
    for c in [&mut a, &mut b] {
        let l = c.try_lock("warm", guard).unwrap();
        c.release(l).unwrap();
    }
    let key = keys_on(&c0, 0, 1, "failover:").remove(0);
    let replica = c0.replicas_of(0).unwrap()[0];
    c0.node_mut(replica).freeze().unwrap();
    // Its replication connection cut while it is frozen: nothing the primary writes next
    // reaches it, not even through a socket buffer.
    let killed = c0
        .node(0)
        .cmd(&[b"CLIENT", b"KILL", b"TYPE", b"replica"])
        .unwrap();
    assert_eq!(killed, AdminReply::Int(1), "one replica connection cut");
    let lock = a.try_lock(&key, guard).unwrap();
    c0.kill(0).unwrap();
    c0.node_mut(replica).thaw().unwrap();
    c0.failover(replica, FailoverMode::Takeover).unwrap();
    let on_replica = command(c0.node(replica).addr(), &[b"GET", key.as_bytes()], T).unwrap();
    assert_eq!(
        on_replica,
        AdminReply::Bulk(None),
        "the new primary lacks the grant"
    );
    // Another master forgets the grant too (a restart without persistence, say): the
    // holder's keys now live on one master of three. Cluster 0's yes would make a second
    // holder with the third; it answers from a server that never saw the grant (its merged
    // run_id changed), so its yes is not counted.
    let n2 = others[1].primary_of_key(key.as_bytes()).unwrap();
    let del = command(others[1].node(n2).addr(), &[b"DEL", key.as_bytes()], T).unwrap();
    assert_eq!(del, AdminReply::Int(1));
    let e = b
        .try_lock(&key, guard)
        .expect_err("cluster 0's vote must not count");
    let text = e.to_string();
    assert!(text.contains("amnesia"), "{text}");
    drop(lock);
}

/// Channels subscribed on `node` whose name ends with `key`.
fn channels_of(node: &redlock_mux::local::LocalMaster, key: &str) -> usize {
    match node.cmd(&[b"PUBSUB", b"CHANNELS", b"*"]) {
        Ok(AdminReply::Array(a)) => a
            .iter()
            .filter(|c| c.as_str().is_some_and(|c| c.ends_with(key)))
            .count(),
        r => panic!("PUBSUB CHANNELS: {r:?}"),
    }
}

#[test]
fn a_waiter_on_cluster_masters_is_woken_by_the_release() {
    woken_by_the_release(false, false);
}

#[test]
fn a_fair_waiter_on_cluster_masters_is_woken_by_the_release() {
    woken_by_the_release(true, false);
}

/// A listener whose connection is lost while its client waits is opened again (after
/// `LISTENER_RETRY`, 1 s), to the shard's primary: killed on the key's shard of every
/// cluster, it is back there within the wait.
#[test]
fn a_listener_lost_while_waiting_is_opened_again() {
    woken_by_the_release(false, true);
}

/// Waits, up to `bound`, until the waiter is subscribed on the seed (node 0) and listens on
/// `key`'s shard (node 2) of every cluster; panics with `what` and the channel counts.
fn wait_listening(clusters: &[LocalCluster], key: &str, bound: Duration, what: &str) {
    let counts = || -> Vec<(usize, usize)> {
        clusters
            .iter()
            .map(|c| (channels_of(c.node(0), key), channels_of(c.node(2), key)))
            .collect()
    };
    let deadline = std::time::Instant::now() + bound;
    while !counts().iter().all(|&(seed, shard)| seed > 0 && shard > 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            counts()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn woken_by_the_release(fair: bool, kill_listeners: bool) {
    // The release runs on the key's shard; its announcement reaches the waiter there, where
    // the client listens while it waits (a listener per shard primary), and crosses the
    // cluster bus to the node of its subscription connection (the first seed).
    let clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let fallback = Duration::from_secs(10);
    let build = || {
        Redlock::builder()
            .fairness(fair)
            .masters(clusters.iter().map(LocalCluster::seed_url))
            .node_timeout(ROUND)
            .retry_delay(fallback)
            .retry_jitter(Duration::ZERO)
            .retry_count(3)
            .build()
            .unwrap()
    };
    // A key on another shard than the seed's.
    let key: &'static str = keys_on(&clusters[0], 2, 1, "hot:").remove(0).leak();
    let mut holder = build();
    let held = holder.try_lock(key, Duration::from_secs(30)).unwrap();
    let mut waiter = build();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = waiter.lock(key, Duration::from_secs(30));
        let _ = tx.send(r);
    });
    // Subscribed on the seed (its subscription connection) and on the key's shard (a
    // listener): without the listener, the announcement would only reach it over the
    // cluster bus, about 40 ms late now and then.
    wait_listening(
        &clusters,
        key,
        Duration::from_secs(5),
        "the waiter never subscribed on the seed and on its key's shard",
    );
    if kill_listeners {
        for c in &clusters {
            // The listener is the waiter's only subscriber connection on node 2 (its
            // subscription connection is on the seed, node 0).
            match c.node(2).cmd(&[b"CLIENT", b"KILL", b"TYPE", b"pubsub"]) {
                Ok(AdminReply::Int(n)) => assert_eq!(n, 1, "one listener killed"),
                r => panic!("CLIENT KILL: {r:?}"),
            }
            assert_eq!(channels_of(c.node(2), key), 0, "the listener is gone");
        }
        // Back within the wait: reopened after 1 s (bounded by 5 s of a loaded machine;
        // the waiter's retry comes only after 10 s).
        wait_listening(
            &clusters,
            key,
            Duration::from_secs(6),
            "no listener on the key's shard again",
        );
    }
    let released = std::time::Instant::now();
    holder.release(held).unwrap();
    let lock = rx
        .recv_timeout(fallback / 2)
        .expect("woken by the release, not the retry delay")
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "{:?}",
        released.elapsed()
    );
    assert!(lock.attempts() >= 2, "refused first: {}", lock.attempts());
}

#[test]
fn scripts_flushed_on_one_shard_are_sent_again_in_full() {
    let clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let mut client = warm_client(&clusters);
    let key = keys_on(&clusters[0], 1, 1, "flushed:").remove(0);
    let lock = client.try_lock(&key, Duration::from_secs(10)).unwrap();
    for c in &clusters {
        let n = c.primary_of_key(key.as_bytes()).unwrap();
        assert!(c.node(n).cmd(&[b"SCRIPT", b"FLUSH"]).unwrap().is_ok());
    }
    // The release is a script: -NOSCRIPT on that shard, then EVAL there (the handshake
    // loaded the scripts on every shard; one flushed them since).
    client.release(lock).unwrap();
    // The release returns at a quorum; a late master's -NOSCRIPT is answered at the
    // client's next call: drive it until every master has answered.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let noscript: u64 = client.stats().iter().map(|s| s.noscript()).sum();
        if noscript == 3 {
            break;
        }
        assert!(noscript < 3, "one -NOSCRIPT per master: {noscript}");
        assert!(std::time::Instant::now() < deadline, "{noscript} -NOSCRIPT");
        let l = client.try_lock("drive", Duration::from_secs(10)).unwrap();
        client.release(l).unwrap();
    }
    for c in &clusters {
        let n = c.primary_of_key(key.as_bytes()).unwrap();
        assert_eq!(holders(c, &key), [(n, None)], "released");
    }
}

#[test]
fn resharding_a_hot_slot_keeps_mutual_exclusion() {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    let mut clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let urls: Vec<String> = clusters.iter().map(LocalCluster::seed_url).collect();
    // Two names in one slot (one hash tag), four clients on them.
    let names: Arc<Vec<String>> = Arc::new((0..2).map(|i| format!("{{hot}}:{i}")).collect());
    let slot = key_slot(b"hot");
    let holders_now: Arc<Vec<AtomicUsize>> =
        Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let (stop, grants, overlaps) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let threads: Vec<_> = (1..=4)
        .map(|me| {
            let (urls, names, holders_now) = (urls.clone(), names.clone(), holders_now.clone());
            let (stop, grants, overlaps) = (stop.clone(), grants.clone(), overlaps.clone());
            std::thread::spawn(move || {
                let mut c = Redlock::builder()
                    .masters(&urls)
                    .node_timeout(ROUND)
                    .retry_delay(Duration::from_millis(20))
                    .retry_count(5)
                    .build()
                    .unwrap();
                let mut k = me;
                while !stop.load(Ordering::SeqCst) {
                    k = (k * 7 + 3) % names.len();
                    // `lock()`: the waiting acquire and its line's keys (declared beside the
                    // lock key, migrated with it).
                    let Ok(lock) = c.lock(&names[k], Duration::from_secs(10)) else {
                        continue;
                    };
                    if holders_now[k].swap(me, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    grants.fetch_add(1, Ordering::SeqCst);
                    // A critical section long enough for a second holder to show.
                    std::thread::sleep(Duration::from_millis(5));
                    if holders_now[k].swap(0, Ordering::SeqCst) != me {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = c.release(lock);
                }
            })
        })
        .collect();
    // Move the hot slot around every cluster at once, keys and all, while it is locked:
    // every master is migrating it at the same time (-ASK for the names not moved yet),
    // then every master has moved it (-MOVED for a client's old map).
    let before = grants.load(Ordering::SeqCst);
    let mut owner: Vec<usize> = clusters
        .iter()
        .map(|c| c.primary_of_slot(slot).unwrap())
        .collect();
    for _ in 0..4 {
        let migrations: Vec<_> = clusters
            .iter_mut()
            .zip(&owner)
            .map(|(c, o)| c.begin_slot_migration(slot, (o + 1) % 3).unwrap())
            .collect();
        for (c, m) in clusters.iter_mut().zip(&migrations) {
            c.migrate_slot_keys(m).unwrap();
        }
        for ((c, m), o) in clusters.iter_mut().zip(migrations).zip(owner.iter_mut()) {
            *o = m.to();
            c.finish_slot_migration(m).unwrap();
        }
    }
    let during = grants.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders of one name at once"
    );
    assert!(during > 0, "no lock granted while the slot moved");
}

#[test]
fn a_lock_on_cluster_masters_is_lost_at_once_when_a_quorum_deletes_it() {
    // The watch (client-side tracking) on cluster masters: HELLO 3 and CLIENT TRACKING go
    // to every shard, the read that arms it to the key's shard, and the shard's
    // invalidation comes back through the cluster master's stream.
    let clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let mut c = Redlock::builder()
        .masters(clusters.iter().map(LocalCluster::seed_url))
        .node_timeout(ROUND)
        .build()
        .unwrap();
    let key = keys_on(&clusters[0], 2, 1, "watched:").remove(0);
    let tracked = |cl: &LocalCluster| {
        let n = cl.primary_of_key(key.as_bytes()).unwrap();
        let Ok(AdminReply::Bulk(Some(text))) = cl.node(n).cmd(&[b"INFO", b"stats"]) else {
            panic!("INFO stats");
        };
        String::from_utf8_lossy(&text)
            .lines()
            .find_map(|l| l.strip_prefix("tracking_total_keys:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let held = c
        .run_locked(&key, Duration::from_secs(30), |signal| {
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while !clusters.iter().all(|cl| tracked(cl) >= 1) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the watch never armed"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(!signal.is_lost());
            for cl in &clusters[..2] {
                let n = cl.primary_of_key(key.as_bytes()).unwrap();
                command(cl.node(n).addr(), &[b"DEL", key.as_bytes()], T).unwrap();
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while !signal.is_lost() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the loss was not heard"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .unwrap();
    assert!(!held.held_throughout);
    assert_eq!(held.extensions, 0, "found by the watch, not an extension");
}

#[test]
fn fencing_tokens_rise_on_cluster_masters() {
    let clusters: Vec<LocalCluster> = (0..3).map(|_| cluster()).collect();
    let mut c = Redlock::builder()
        .masters(clusters.iter().map(LocalCluster::seed_url))
        .node_timeout(ROUND)
        .retry_count(0)
        .fencing(true)
        .fencing_assume_durable(true)
        .build()
        .unwrap();
    let mut last = 0;
    for name in ["fenced:a", "fenced:a", "fenced:b", "fenced:a"] {
        let lock = c.try_lock(name, Duration::from_secs(10)).unwrap();
        let token = lock.fencing_token().expect("a token");
        if name == "fenced:a" {
            assert!(token > last, "{token} after {last}");
            last = token;
        }
        c.release(lock).unwrap();
    }
}
