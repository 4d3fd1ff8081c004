//! Tests of the local-cluster harness itself (`redlock_mux::local::LocalCluster`, issue 22):
//! each checks an observable effect on real `redis-server` (or `valkey-server`, same
//! `$REDIS_SERVER`) cluster nodes. Every wait is the harness's bounded one; no sleep
//! decides a race.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use redlock_mux::local::{
    key_slot, AdminReply, FailoverMode, LocalCluster, LocalMaster, Role, CLUSTER_SLOTS,
};

fn bulk(b: &[u8]) -> AdminReply {
    AdminReply::Bulk(Some(b.to_vec()))
}

fn error(reply: AdminReply) -> String {
    match reply {
        AdminReply::Error(e) => e,
        r => panic!("expected an error reply, got {r:?}"),
    }
}

/// A key whose slot is `slot` (a hash tag found by trying short ones).
fn key_in_slot(slot: u16, name: &str) -> Vec<u8> {
    (0u32..)
        .map(|i| format!("{{t{i}}}{name}").into_bytes())
        .find(|k| key_slot(k) == slot)
        .expect("some tag maps to every slot")
}

#[test]
fn slots_cover_every_slot_once_and_every_node_agrees() {
    let cluster = LocalCluster::start().unwrap();
    assert_eq!(cluster.len(), 3);
    let seed = cluster.seed_url();
    assert_eq!(
        seed,
        format!("redis+cluster://127.0.0.1:{}", cluster.node(0).port())
    );
    assert_eq!(cluster.seed_urls().len(), 3);

    let map = cluster.wait_agreed().unwrap();
    let mut owner = vec![None; usize::from(CLUSTER_SLOTS)];
    for node in map.primaries() {
        for range in &node.slots {
            for slot in range.clone() {
                assert_eq!(owner[usize::from(slot)], None, "slot {slot} twice: {map}");
                owner[usize::from(slot)] = node.index;
            }
        }
    }
    assert!(
        owner.iter().all(Option::is_some),
        "a slot nobody serves: {map}"
    );
    // Spread evenly, in index order.
    assert_eq!(owner[0], Some(0));
    assert_eq!(owner[5461], Some(1));
    assert_eq!(owner[16_383], Some(2));
    for i in 0..3 {
        let view = cluster.view_of(i).unwrap();
        assert!(view.state_ok, "{view}");
        assert_eq!(view.nodes, map.nodes, "node {i} disagrees");
        let node = view.node(i).unwrap();
        assert_eq!(node.id, cluster.node_id(i));
        assert_eq!(node.port, cluster.node(i).port());
        assert_eq!(node.role, Role::Primary);
    }
    // The server's slot function is the harness's.
    for key in [&b"a"[..], b"inventory:sku-17", b"{user}:1", b"x{}y", b""] {
        assert_eq!(cluster.slot_of(key).unwrap(), key_slot(key), "{key:?}");
    }
}

#[test]
fn a_key_sent_to_the_wrong_node_answers_moved() {
    let cluster = LocalCluster::start().unwrap();
    let key = b"inventory:sku-1";
    let slot = cluster.slot_of(key).unwrap();
    let owner = cluster.primary_of_slot(slot).unwrap();
    assert!(cluster
        .node(owner)
        .cmd(&[b"SET", key, b"v"])
        .unwrap()
        .is_ok());
    for other in (0..3).filter(|&i| i != owner) {
        let e = error(cluster.node(other).cmd(&[b"GET", key]).unwrap());
        assert_eq!(
            e,
            format!("MOVED {slot} 127.0.0.1:{}", cluster.node(owner).port())
        );
    }
    assert_eq!(cluster.node(owner).cmd(&[b"GET", key]).unwrap(), bulk(b"v"));
}

#[test]
fn a_slot_in_migration_answers_ask_then_moved() {
    let mut cluster = LocalCluster::start().unwrap();
    let slot = 100;
    let from = cluster.primary_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    let (from_port, to_port) = (cluster.node(from).port(), cluster.node(to).port());
    let key = key_in_slot(slot, "held");
    let absent = key_in_slot(slot, "absent");
    assert!(cluster
        .node(from)
        .cmd(&[b"SET", &key, b"v", b"PX", b"600000"])
        .unwrap()
        .is_ok());

    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    assert_eq!(
        (migration.slot(), migration.from(), migration.to()),
        (slot, from, to)
    );
    let ask = format!("ASK {slot} 127.0.0.1:{to_port}");
    // A key still on the old primary is served there; one it does not hold is asked for.
    assert_eq!(cluster.node(from).cmd(&[b"GET", &key]).unwrap(), bulk(b"v"));
    assert_eq!(
        error(cluster.node(from).cmd(&[b"GET", &absent]).unwrap()),
        ask
    );

    assert_eq!(cluster.migrate_slot_keys(&migration).unwrap(), 1);
    assert_eq!(error(cluster.node(from).cmd(&[b"GET", &key]).unwrap()), ask);
    // The new primary serves the slot only after ASKING (on the same connection).
    let moved_back = format!("MOVED {slot} 127.0.0.1:{from_port}");
    assert_eq!(
        error(cluster.node(to).cmd(&[b"GET", &key]).unwrap()),
        moved_back
    );
    let replies = cluster
        .node(to)
        .cmds(&[
            &[b"ASKING"],
            &[b"GET", &key],
            &[b"ASKING"],
            &[b"PTTL", &key],
        ])
        .unwrap();
    assert!(replies[0].is_ok() && replies[2].is_ok(), "{replies:?}");
    assert_eq!(replies[1], bulk(b"v"));
    assert!(
        matches!(replies[3], AdminReply::Int(ms) if ms > 500_000),
        "the TTL moves with the key: {replies:?}"
    );

    let map = cluster.finish_slot_migration(migration).unwrap();
    assert_eq!(map.primary_of(slot).and_then(|n| n.index), Some(to));
    assert_eq!(cluster.primary_of_slot(slot).unwrap(), to);
    let moved = format!("MOVED {slot} 127.0.0.1:{to_port}");
    assert_eq!(
        error(cluster.node(from).cmd(&[b"GET", &key]).unwrap()),
        moved
    );
    assert_eq!(cluster.node(to).cmd(&[b"GET", &key]).unwrap(), bulk(b"v"));
    // Its neighbours stay where they were.
    assert_eq!(cluster.primary_of_slot(slot + 1).unwrap(), from);

    // All three steps at once, and back.
    cluster.move_slot(slot, from).unwrap();
    assert_eq!(cluster.node(from).cmd(&[b"GET", &key]).unwrap(), bulk(b"v"));
}

#[test]
fn a_failover_changes_the_primary_of_a_range() {
    let mut cluster = LocalCluster::start_with(3, 1, &[]).unwrap();
    assert_eq!(cluster.len(), 6);
    // One failover of each kind, one per primary.
    let modes = [
        FailoverMode::Coordinated,
        FailoverMode::Force,
        FailoverMode::Takeover,
    ];
    for (primary, mode) in modes.into_iter().enumerate() {
        let slot = cluster.wait_agreed().unwrap().node(primary).unwrap().slots[0]
            .start()
            .to_owned();
        assert_eq!(cluster.primary_of_slot(slot).unwrap(), primary);
        let replicas = cluster.replicas_of(primary).unwrap();
        assert_eq!(replicas, vec![3 + primary], "{mode:?}");
        let replica = replicas[0];
        let key = key_in_slot(slot, "written-before");
        assert!(cluster
            .node(primary)
            .cmd(&[b"SET", &key, b"v"])
            .unwrap()
            .is_ok());
        // WAIT: the replica has the write before a failover that may lose unreplicated ones.
        assert_eq!(
            cluster
                .node(primary)
                .cmd(&[b"WAIT", b"1", b"5000"])
                .unwrap(),
            AdminReply::Int(1)
        );

        let map = cluster.failover(replica, mode).unwrap();
        assert_eq!(map.primary_of(slot).and_then(|n| n.index), Some(replica));
        assert_eq!(cluster.primary_of_slot(slot).unwrap(), replica, "{mode:?}");
        assert_eq!(
            map.node(primary).unwrap().role,
            Role::Replica {
                primary: cluster.node_id(replica).to_string()
            },
            "{mode:?}: the old primary follows the new one: {map}"
        );
        // The write replicated before the failover (WAIT above) is on the new primary.
        let got = cluster.node(replica).cmd(&[b"GET", &key]).unwrap();
        assert_eq!(
            got,
            bulk(b"v"),
            "{mode:?}: the new primary lacks the write; {map}"
        );
        let e = error(cluster.node(primary).cmd(&[b"GET", &key]).unwrap());
        assert_eq!(
            e,
            format!("MOVED {slot} 127.0.0.1:{}", cluster.node(replica).port())
        );
    }
    let err = cluster.failover(3, FailoverMode::Coordinated).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidInput,
        "node 3 is a primary now: {err}"
    );
    let err = cluster.failover(6, FailoverMode::Coordinated).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "no node 6: {err}");
}

#[test]
fn a_killed_primary_is_gone_and_its_replica_takes_over() {
    let mut cluster = LocalCluster::start_with(3, 1, &[]).unwrap();
    let slot = 0;
    assert_eq!(cluster.primary_of_slot(slot).unwrap(), 0);
    let port = cluster.node(0).port();
    cluster.kill(0).unwrap();
    assert_eq!(cluster.node(0).pid(), None);
    let refused = TcpStream::connect_timeout(&cluster.node(0).addr(), Duration::from_secs(1));
    assert!(refused.is_err(), "port {port} still answers");
    assert!(!cluster
        .seed_urls()
        .iter()
        .any(|u| u.ends_with(&format!(":{port}"))));

    // The others agree it is down; its replica is elected in its place.
    cluster.wait_failed(0).unwrap();
    let map = cluster.wait_agreed().unwrap();
    assert_eq!(map.primary_of(slot).and_then(|n| n.index), Some(3), "{map}");
    assert!(map.node(0).unwrap().failed, "{map}");
    assert_eq!(cluster.primary_of_slot(slot).unwrap(), 3);

    // Back, it keeps its ID and follows the new primary.
    let map = cluster.restart(0).unwrap();
    assert_eq!(
        map.node(0).unwrap().role,
        Role::Replica {
            primary: cluster.node_id(3).to_string()
        },
        "{map}"
    );
    assert!(!map.node(0).unwrap().failed, "{map}");
    let view = cluster.view_of(0).unwrap();
    assert_eq!(view.node(0).unwrap().id, cluster.node_id(0));
}

#[test]
fn a_cluster_without_replicas_is_down_while_a_primary_is() {
    // Three primaries: a node is flagged `fail` by a majority of them.
    let mut cluster = LocalCluster::start().unwrap();
    cluster.set_wait_timeout(Duration::from_secs(20));
    cluster.stop(1).unwrap();
    cluster.wait_failed(1).unwrap();
    let view = cluster.view_of(0).unwrap();
    assert!(
        !view.state_ok,
        "slots of a failed primary are served by no one: {view}"
    );
    let e = error(cluster.node(0).cmd(&[b"GET", b"anything"]).unwrap());
    assert!(e.starts_with("CLUSTERDOWN"), "{e}");
    // Back on its port with its nodes.conf, it claims its slots again.
    cluster.restart(1).unwrap();
    assert!(cluster.view_of(0).unwrap().state_ok);
    assert_eq!(cluster.primary_of_slot(8_000).unwrap(), 1);
}

#[test]
fn a_cpu_quota_is_applied_and_removed() {
    // A standalone master.
    let mut master = LocalMaster::start().unwrap();
    master.limit_cpu(0.1).unwrap_or_else(|e| {
        panic!("a cgroup v1 cpu group (root, /sys/fs/cgroup/cpu writable): {e}")
    });
    let group = master.cpu_cgroup().unwrap();
    let path = group.path().to_path_buf();
    assert_eq!(group.quota_us().unwrap(), 2_000);
    assert_eq!(group.period_us().unwrap(), 20_000);
    assert_eq!(group.processes().unwrap(), vec![master.pid().unwrap()]);
    // A second call changes the quota; a restart keeps the group.
    master.limit_cpu(0.25).unwrap();
    assert_eq!(master.cpu_cgroup().unwrap().quota_us().unwrap(), 5_000);
    // Under 0.05 core the period grows (the kernel's least quota is 1 ms).
    master.limit_cpu(0.02).unwrap();
    let group = master.cpu_cgroup().unwrap();
    assert_eq!(
        (group.quota_us().unwrap(), group.period_us().unwrap()),
        (1_000, 50_000)
    );
    master.restart().unwrap();
    assert_eq!(
        master.cpu_cgroup().unwrap().processes().unwrap(),
        vec![master.pid().unwrap()]
    );
    drop(master);
    assert!(!Path::new(&path).exists(), "{} left behind", path.display());

    // A cluster's primaries, each in a group of its own.
    let mut cluster = LocalCluster::start_with(2, 0, &[]).unwrap();
    for i in cluster.primaries().unwrap() {
        cluster.node_mut(i).limit_cpu(0.1).unwrap();
    }
    let paths: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| {
            let group = n.cpu_cgroup().unwrap();
            assert_eq!(group.quota_us().unwrap(), 2_000);
            assert_eq!(group.processes().unwrap(), vec![n.pid().unwrap()]);
            group.path().to_path_buf()
        })
        .collect();
    assert_ne!(paths[0], paths[1]);
    assert!(cluster.node(0).cmd(&[b"PING"]).unwrap().as_str() == Some("PONG"));
    drop(cluster);
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?} left behind");

    let e = LocalMaster::start().unwrap().limit_cpu(0.0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}
