//! Cluster masters (issue 22): a Redlock master that is a Redis Cluster, reached with
//! `redis+cluster://`, against real local clusters of three primaries each.
//!
//! What is checked: locks land on the shard that serves their key and are gone from it
//! after the release (the client routes every request by slot, over one connection per
//! shard); a slot moved to another shard after the client learned the map is followed
//! (`-MOVED`, resent once); a shard primary killed fails that cluster master's votes only
//! (its connection as a whole is lost, the other masters still make the quorum).

mod support;

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use redlock_mux::local::{command, AdminReply, LocalMaster};
use redlock_mux::Redlock;

const T: Duration = Duration::from_secs(2);

/// A local cluster of `k` primaries (no replicas), slots spread evenly.
struct Cluster {
    nodes: Vec<LocalMaster>,
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn ok(r: std::io::Result<AdminReply>, what: &str) -> AdminReply {
    match r {
        Ok(AdminReply::Error(e)) => panic!("{what}: -{e}"),
        Ok(r) => r,
        Err(e) => panic!("{what}: {e}"),
    }
}

impl Cluster {
    fn start(k: usize) -> Cluster {
        let mut nodes = Vec::new();
        for _ in 0..k {
            let bus = free_port().to_string();
            let node = support::master_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus,
                "--cluster-node-timeout",
                "2000",
            ]);
            nodes.push(node);
        }
        let per = 16384 / k;
        for (i, n) in nodes.iter().enumerate() {
            let (a, b) = (i * per, if i + 1 == k { 16383 } else { (i + 1) * per - 1 });
            let (a, b) = (a.to_string(), b.to_string());
            ok(
                n.cmd(&[b"CLUSTER", b"ADDSLOTSRANGE", a.as_bytes(), b.as_bytes()]),
                "ADDSLOTSRANGE",
            );
        }
        for n in &nodes[1..] {
            let bus = n
                .cmd(&[b"CONFIG", b"GET", b"cluster-port"])
                .ok()
                .and_then(|r| match r {
                    AdminReply::Array(a) => a.get(1).and_then(|v| v.as_str().map(String::from)),
                    _ => None,
                })
                .unwrap();
            let me = n.port().to_string();
            ok(
                nodes[0].cmd(&[
                    b"CLUSTER",
                    b"MEET",
                    b"127.0.0.1",
                    me.as_bytes(),
                    bus.as_bytes(),
                ]),
                "MEET",
            );
        }
        let c = Cluster { nodes };
        c.wait_agreed();
        c
    }

    /// Until every node says `cluster_state:ok` and knows every other (bounded).
    fn wait_agreed(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let agreed = self.nodes.iter().all(|n| {
                let info = n.cmd(&[b"CLUSTER", b"INFO"]).ok();
                let text = info.as_ref().and_then(|r| r.as_str()).unwrap_or("");
                text.contains("cluster_state:ok")
                    && text.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
            });
            if agreed {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster did not agree within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.nodes[0].port())
    }

    /// The node id of node `k`.
    fn id(&self, k: usize) -> Vec<u8> {
        match ok(self.nodes[k].cmd(&[b"CLUSTER", b"MYID"]), "MYID") {
            AdminReply::Bulk(Some(id)) => id,
            r => panic!("MYID: {r:?}"),
        }
    }

    /// `GET key` on every node: (node, value) where it answered (the others: MOVED).
    fn holders(&self, key: &str) -> Vec<(usize, Option<Vec<u8>>)> {
        self.nodes
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
}

/// Keys served by `node` of a `k`-primary [`Cluster`], `count` of them.
fn keys_on(k: usize, node: usize, count: usize, prefix: &str) -> Vec<String> {
    let per = 16384 / k;
    let range = node * per..if node + 1 == k {
        16384
    } else {
        (node + 1) * per
    };
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|n| range.contains(&(redlock_mux::slot::key_slot(n.as_bytes()) as usize)))
        .take(count)
        .collect()
}

#[test]
fn locks_on_cluster_masters_land_on_the_shard_of_their_key() {
    let clusters: Vec<Cluster> = (0..3).map(|_| Cluster::start(3)).collect();
    let mut client = Redlock::builder()
        .masters(clusters.iter().map(Cluster::url))
        .retry_count(0)
        .build()
        .unwrap();
    for node in 0..3 {
        for key in keys_on(3, node, 4, &format!("sku:{node}:")) {
            let lock = client
                .try_lock(&key, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            for (c, cluster) in clusters.iter().enumerate() {
                let h = cluster.holders(&key);
                assert_eq!(h.len(), 1, "{key} on cluster {c}: {h:?}");
                assert_eq!(h[0].0, node, "{key} on cluster {c}: served by node {node}");
                assert_eq!(h[0].1.as_deref(), Some(lock.token().as_bytes()), "{key}");
            }
            client.release(lock).unwrap();
            for cluster in &clusters {
                assert_eq!(cluster.holders(&key), [(node, None)], "{key} released");
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
    let clusters: Vec<Cluster> = (0..3).map(|_| Cluster::start(3)).collect();
    let mut client = Redlock::builder()
        .masters(clusters.iter().map(Cluster::url))
        .retry_count(0)
        .build()
        .unwrap();
    // The client reads the maps.
    let warm = client.try_lock("warm", Duration::from_secs(10)).unwrap();
    client.release(warm).unwrap();
    // Move an empty slot of node 0 to node 1 in every cluster.
    let key = keys_on(3, 0, 1, "moved:").remove(0);
    let slot = redlock_mux::slot::key_slot(key.as_bytes()).to_string();
    for c in &clusters {
        let to = c.id(1);
        for n in &c.nodes {
            ok(
                n.cmd(&[b"CLUSTER", b"SETSLOT", slot.as_bytes(), b"NODE", &to]),
                "SETSLOT NODE",
            );
        }
    }
    let lock = client
        .try_lock(&key, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{key} after its slot moved: {e}"));
    for c in &clusters {
        assert_eq!(
            c.holders(&key),
            [(1, Some(lock.token().as_bytes().to_vec()))],
            "{key} is on the node its slot moved to"
        );
    }
    client.release(lock).unwrap();
    for c in &clusters {
        assert_eq!(c.holders(&key), [(1, None)]);
    }
    // Followed within the connection: no reconnect.
    for s in client.stats() {
        assert_eq!(s.connects(), 1, "{s:?}");
    }
}

#[test]
fn a_dead_shard_fails_its_cluster_master_only() {
    let mut clusters: Vec<Cluster> = (0..3).map(|_| Cluster::start(3)).collect();
    let mut client = Redlock::builder()
        .masters(clusters.iter().map(Cluster::url))
        .retry_count(0)
        .build()
        .unwrap();
    let warm = client.try_lock("warm", Duration::from_secs(10)).unwrap();
    client.release(warm).unwrap();
    clusters[0].nodes[2].kill().unwrap();
    // Every key, whatever its shard: cluster 0's connection is lost as a whole; clusters 1
    // and 2 still make the quorum.
    for node in 0..3 {
        let key = keys_on(3, node, 1, "dead:").remove(0);
        let lock = client
            .try_lock(&key, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        client.release(lock).unwrap();
    }
    let stats = client.stats();
    assert!(stats[0].last_fault().is_some(), "{:?}", stats[0]);
}
