//! Cluster masters in the simulated world (issue 22): a master may be a Redis Cluster of K
//! nodes, each its own `SimRedis` keyspace (a server of the world, with its own address
//! `127.0.0.1:7000 + server`), sharing one slot map.
//!
//! A node answers as a Redis 7.0 cluster node does, before the command runs
//! ([`ClusterRole::gate`], the one hook in `server.rs`): `CLUSTER SHARDS` and `CLUSTER
//! SLOTS` with the map (RESP2 and RESP3, byte for byte as 7.0: see the captured replies in
//! `tests/data/cluster-*.bin`), `ASKING`, `-CROSSSLOT` for keys in several slots,
//! `-CLUSTERDOWN Hash slot not served`, `-MOVED slot host:port` for a slot another node
//! serves, `-ASK slot host:port` for keys missing from a slot being migrated away (and the
//! command served after `ASKING` on the node importing it), `-TRYAGAIN` for a multi-key
//! request of which only some keys moved. A script's `redis.call` of a key this node does
//! not serve fails as in 7.0 ("non local key"); a script with a shebang may not touch a key
//! of another slot than its first declared key's.
//!
//! The cluster bus: a `PUBLISH` on one node reaches every node's subscribers (at once).
//!
//! Faults: slot migrations (`Migrate`: the slot is migrating on its owner and importing on
//! another node; its keys move one at a time, atomically (`MIGRATE`), at random moments;
//! then the slot is the other node's on every node at once (`SETSLOT NODE`), hot slots (a
//! resource's) more often than cold ones; the faults' heal ends every migration); a node
//! crash (the world's `Restart` of a node's server: every connection to it reset, connects
//! refused while it is down); a failover (`Failover`: the node's connections reset and a
//! replica takes its address: a new run id, a long uptime, and each key kept only with
//! probability `1 - failover_loss`: the writes it had not replicated yet).
//!
//! Not modelled: replicas as nodes of their own (a failover keeps the address), gossip
//! delays (every node learns a slot's new owner at once), `CLUSTERDOWN` for a failed node's
//! slots (a dead node refuses connects), `READONLY`, `SPUBLISH`, cluster-wide
//! `FLUSHALL`/`SCRIPT FLUSH` (each node's own).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::rc::Rc;

use redlock_mux::core::LinkId;
use redlock_mux::slot::{key_slot, SLOTS};

use super::server::{self, ClusterRole, SimRedis};
use super::{Ev, Master, Us, World};

/// A node's port: `BASE_PORT + server`.
pub const BASE_PORT: u16 = 7000;
const NONE: u8 = u8::MAX;

/// One cluster's shared state: its nodes, who serves each slot, the migrations under way.
#[derive(Debug)]
pub struct Map {
    /// Each node's server (world index) and cluster node id.
    pub nodes: Vec<(usize, String)>,
    /// The node serving each slot ([`NONE`]: nobody).
    pub owner: Vec<u8>,
    /// Slot -> (from, to, migration id).
    pub migrating: BTreeMap<u16, (usize, usize, u64)>,
    /// Redirections answered: MOVED, ASK, TRYAGAIN, CROSSSLOT, CLUSTERDOWN; scripts refused.
    pub moved: u64,
    pub asked: u64,
    pub tryagain: u64,
    pub crossslot: u64,
    pub down: u64,
    pub script_refused: std::cell::Cell<u64>,
}

impl Map {
    /// A map of `nodes` (server, id), the slots split evenly in order.
    pub fn new(nodes: Vec<(usize, String)>) -> Map {
        let k = nodes.len().max(1);
        let owner = (0..SLOTS).map(|s| (s * k / SLOTS) as u8).collect();
        Map {
            nodes,
            owner,
            migrating: BTreeMap::new(),
            moved: 0,
            asked: 0,
            tryagain: 0,
            crossslot: 0,
            down: 0,
            script_refused: std::cell::Cell::new(0),
        }
    }

    fn owner(&self, slot: u16) -> Option<usize> {
        match self.owner[slot as usize] {
            NONE => None,
            o => Some(o as usize),
        }
    }

    fn addr(&self, k: usize) -> String {
        format!("127.0.0.1:{}", BASE_PORT as usize + self.nodes[k].0)
    }

    /// Node `k`'s slot ranges, in order.
    fn ranges(&self, k: usize) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for s in 0..SLOTS {
            if self.owner[s] as usize != k {
                continue;
            }
            match out.last_mut() {
                Some(r) if r.1 + 1 == s => r.1 = s,
                _ => out.push((s, s)),
            }
        }
        out
    }

    /// `CLUSTER SHARDS` as Redis 7.0 writes it (one shard per node: no replicas).
    pub fn shards(&self, resp3: bool) -> Vec<u8> {
        let mut o = String::new();
        let bulk = |o: &mut String, s: &str| {
            let _ = write!(o, "${}\r\n{s}\r\n", s.len());
        };
        let _ = write!(o, "*{}\r\n", self.nodes.len());
        for (k, (server, id)) in self.nodes.iter().enumerate() {
            o.push_str(if resp3 { "%2\r\n" } else { "*4\r\n" });
            bulk(&mut o, "slots");
            let ranges = self.ranges(k);
            let _ = write!(o, "*{}\r\n", 2 * ranges.len());
            for (a, b) in ranges {
                let _ = write!(o, ":{a}\r\n:{b}\r\n");
            }
            bulk(&mut o, "nodes");
            o.push_str("*1\r\n");
            o.push_str(if resp3 { "%7\r\n" } else { "*14\r\n" });
            bulk(&mut o, "id");
            bulk(&mut o, id);
            bulk(&mut o, "port");
            let _ = write!(o, ":{}\r\n", BASE_PORT as usize + server);
            bulk(&mut o, "ip");
            bulk(&mut o, "127.0.0.1");
            bulk(&mut o, "endpoint");
            bulk(&mut o, "127.0.0.1");
            bulk(&mut o, "role");
            bulk(&mut o, "master");
            bulk(&mut o, "replication-offset");
            o.push_str(":0\r\n");
            bulk(&mut o, "health");
            bulk(&mut o, "online");
        }
        o.into_bytes()
    }

    /// `CLUSTER SLOTS` as Redis 7.0 writes it: every range, in slot order.
    pub fn slots(&self, resp3: bool) -> Vec<u8> {
        let mut all: Vec<(usize, usize, usize)> = Vec::new();
        for k in 0..self.nodes.len() {
            all.extend(self.ranges(k).into_iter().map(|(a, b)| (a, b, k)));
        }
        all.sort_unstable();
        let mut o = format!("*{}\r\n", all.len());
        for (a, b, k) in all {
            let (server, id) = &self.nodes[k];
            let _ = write!(
                o,
                "*3\r\n:{a}\r\n:{b}\r\n*4\r\n$9\r\n127.0.0.1\r\n:{}\r\n${}\r\n{id}\r\n{}\r\n",
                BASE_PORT as usize + server,
                id.len(),
                if resp3 { "%0" } else { "*0" }
            );
        }
        o.into_bytes()
    }
}

/// A node's role, the hook `SimRedis` asks.
#[derive(Debug)]
pub struct Node {
    map: Rc<RefCell<Map>>,
    me: usize,
    /// Connections whose next command follows an `ASKING`.
    asking: BTreeSet<u32>,
    /// The command running came after an `ASKING` (its script's calls may use it).
    cur_asking: bool,
}

impl Node {
    pub fn new(map: Rc<RefCell<Map>>, me: usize) -> Node {
        Node {
            map,
            me,
            asking: BTreeSet::new(),
            cur_asking: false,
        }
    }
}

/// The keys of a command the client (or a test) sends.
fn keys_of(args: &[Vec<u8>]) -> Vec<&[u8]> {
    let name = args[0].to_ascii_lowercase();
    let one = [
        &b"get"[..],
        b"set",
        b"pttl",
        b"pexpire",
        b"append",
        b"zadd",
        b"zrem",
        b"zrange",
        b"zscore",
        b"zrank",
        b"zcard",
    ];
    if one.contains(&name.as_slice()) {
        args.get(1).map(Vec::as_slice).into_iter().collect()
    } else if [&b"del"[..], b"exists", b"mget"].contains(&name.as_slice()) {
        args[1..].iter().map(Vec::as_slice).collect()
    } else if name == b"eval" || name == b"evalsha" {
        let n: usize = args
            .get(2)
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        args.iter().skip(3).take(n).map(Vec::as_slice).collect()
    } else {
        Vec::new()
    }
}

impl ClusterRole for Node {
    fn gate(
        &mut self,
        conn: u32,
        args: &[Vec<u8>],
        resp3: bool,
        has_key: &dyn Fn(&[u8]) -> bool,
    ) -> Option<Vec<u8>> {
        let name = args[0].to_ascii_lowercase();
        let mut map = self.map.borrow_mut();
        match name.as_slice() {
            b"asking" => {
                self.asking.insert(conn);
                return Some(b"+OK\r\n".to_vec());
            }
            b"cluster" => {
                let sub = args.get(1).map(|s| s.to_ascii_lowercase());
                return Some(match sub.as_deref() {
                    Some(b"shards") => map.shards(resp3),
                    Some(b"slots") => map.slots(resp3),
                    Some(b"myid") => {
                        let id = &map.nodes[self.me].1;
                        format!("${}\r\n{id}\r\n", id.len()).into_bytes()
                    }
                    _ => b"-ERR unknown subcommand. Try CLUSTER HELP.\r\n".to_vec(),
                });
            }
            b"select" if args.get(1).is_some_and(|d| d != b"0") => {
                return Some(b"-ERR SELECT is not allowed in cluster mode\r\n".to_vec());
            }
            _ => {}
        }
        let asking = self.asking.remove(&conn);
        self.cur_asking = asking;
        let keys = keys_of(args);
        let first = keys.first()?;
        let slot = key_slot(first);
        if keys.iter().any(|k| key_slot(k) != slot) {
            map.crossslot += 1;
            return Some(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n".to_vec());
        }
        let missing = keys.iter().filter(|k| !has_key(k)).count();
        let migrating = map.migrating.get(&slot).copied();
        match map.owner(slot) {
            None => {
                map.down += 1;
                Some(b"-CLUSTERDOWN Hash slot not served\r\n".to_vec())
            }
            Some(o) if o == self.me => match migrating {
                Some((from, to, _)) if from == self.me && missing > 0 => {
                    if missing == keys.len() {
                        map.asked += 1;
                        Some(format!("-ASK {slot} {}\r\n", map.addr(to)).into_bytes())
                    } else {
                        map.tryagain += 1;
                        Some(
                            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
                                .to_vec(),
                        )
                    }
                }
                _ => None,
            },
            Some(o) => match migrating {
                Some((from, to, _)) if asking && from == o && to == self.me => {
                    if missing > 0 && missing < keys.len() {
                        map.tryagain += 1;
                        Some(
                            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
                                .to_vec(),
                        )
                    } else {
                        None
                    }
                }
                _ => {
                    map.moved += 1;
                    Some(format!("-MOVED {slot} {}\r\n", map.addr(o)).into_bytes())
                }
            },
        }
    }

    fn script_key(
        &self,
        key: &[u8],
        here: bool,
        declared: Option<&[u8]>,
        strict: bool,
    ) -> Option<&'static str> {
        let map = self.map.borrow();
        let slot = key_slot(key);
        let migrating = map.migrating.get(&slot).copied();
        let local = match map.owner(slot) {
            Some(o) if o == self.me => {
                here || !matches!(migrating, Some((from, _, _)) if from == self.me)
            }
            Some(o) => {
                self.cur_asking && matches!(migrating, Some((f, t, _)) if f == o && t == self.me)
            }
            None => false,
        };
        if !local {
            map.script_refused.set(map.script_refused.get() + 1);
            return Some("ERR Script attempted to access a non local key in a cluster node");
        }
        if strict && declared.is_some_and(|d| key_slot(d) != slot) {
            map.script_refused.set(map.script_refused.get() + 1);
            return Some("ERR Script attempted to access keys that do not hash to the same slot");
        }
        None
    }
}

/// The world's clusters.
#[derive(Default)]
pub struct Clusters {
    /// Per server: its cluster and node index.
    pub of_server: Vec<Option<(usize, usize)>>,
    pub maps: Vec<Rc<RefCell<Map>>>,
    /// A `PUBLISH` is being carried to the other nodes.
    in_bus: bool,
    next_migration: u64,
    /// Connections reset: (client, server, when).
    pub resets: Vec<(usize, usize, Us)>,
    /// Slots that migrated (or started to), per cluster.
    pub migrated: BTreeSet<(usize, u16)>,
}

/// A cluster's own events.
#[derive(Debug, Clone, Copy)]
pub enum ClusterEv {
    /// One key of a migrating slot moves.
    Step { ci: usize, slot: u16, id: u64 },
    /// The migration ends: the rest of its keys move, the slot is the target's.
    Finish { ci: usize, slot: u16, id: u64 },
}

impl World {
    /// Turn the servers `cfg.cluster_shards` names into clusters: node 0 is the server the
    /// clients list (its seed), the others are new servers of the world.
    pub(crate) fn build_clusters(&mut self) {
        for s in 0..self.cfg.masters {
            let k = self.cfg.cluster_shards.get(s).copied().unwrap_or(0);
            if k == 0 {
                continue;
            }
            let mut servers = vec![s];
            for _ in 1..k {
                let j = self.masters.len();
                let scfg = server::Config {
                    seed: self.rng.u64(..),
                    tcp_port: BASE_PORT + j as u16,
                    process_id: 1000 + j as u32 * 100,
                    ..self.masters[s].server.config().clone()
                };
                let (rate, offset_ms) = (self.masters[s].rate, 1_000_000.0 + self.rng.f64() * 1e6);
                self.masters.push(Master {
                    server: SimRedis::new(scfg, 0),
                    rate,
                    offset_ms,
                    down_until: None,
                });
                servers.push(j);
            }
            let nodes: Vec<(usize, String)> = servers
                .iter()
                .map(|&j| {
                    let id: String = (0..40)
                        .map(|_| char::from(b"0123456789abcdef"[self.rng.usize(..16)]))
                        .collect();
                    (j, id)
                })
                .collect();
            let ci = self.cl.maps.len();
            self.cl.maps.push(Rc::new(RefCell::new(Map::new(nodes))));
            self.cl.of_server.resize(self.masters.len(), None);
            for (node, &j) in servers.iter().enumerate() {
                self.cl.of_server[j] = Some((ci, node));
                // Every node logs what it publishes: the bus carries it to the others.
                let c = self.masters[j].server.config().clone();
                self.masters[j].server = SimRedis::new(
                    server::Config {
                        log_published: true,
                        ..c
                    },
                    0,
                );
                self.attach_role(j);
            }
        }
    }

    fn attach_role(&mut self, server: usize) {
        if let Some(Some((ci, k))) = self.cl.of_server.get(server).copied() {
            let role = Node::new(self.cl.maps[ci].clone(), k);
            self.masters[server].server.cluster = Some(Box::new(role));
        }
    }

    /// The cluster of listed server `s` (its seed node), if it is one.
    fn cluster_of(&self, s: usize) -> Option<usize> {
        self.cl
            .of_server
            .get(s)
            .copied()
            .flatten()
            .map(|(ci, _)| ci)
    }

    /// The servers of the master whose seed is `s` (itself when standalone).
    pub(crate) fn master_servers(&self, s: usize) -> Vec<usize> {
        match self.cluster_of(s) {
            Some(ci) => self.cl.maps[ci]
                .borrow()
                .nodes
                .iter()
                .map(|n| n.0)
                .collect(),
            None => vec![s],
        }
    }

    /// The URL clients give for listed master `i`.
    pub(crate) fn master_url(&self, i: usize) -> String {
        let s = self.listed[i];
        if self.cluster_of(s).is_some() {
            format!("redis+cluster://127.0.0.1:{}", BASE_PORT as usize + s)
        } else {
            format!("redis://127.0.0.1:{}", BASE_PORT as usize + i)
        }
    }

    /// The server a client's link `l` connects to: where the core says (a cluster's links),
    /// else its master's (a cluster's seed).
    pub(crate) fn link_server(&self, c: usize, l: usize) -> usize {
        let core = &self.clients[c].core;
        if let Some(a) = core.link_addr(LinkId(l)) {
            let s = (a.port() - BASE_PORT) as usize;
            assert!(
                s < self.masters.len(),
                "client {c} link {l}: no node at {a}"
            );
            return s;
        }
        self.listed[core.link_master(LinkId(l))]
    }

    /// Whether connection `conn` is a subscription link (`n <= link < 2 n`).
    pub(crate) fn is_sub_link(&self, conn: usize) -> bool {
        let n = self.listed.len();
        (n..2 * n).contains(&self.conns[conn].link)
    }

    /// The value of `key` on the master whose seed is `s` (any of a cluster's nodes: a key
    /// lives on one).
    pub(crate) fn master_get(&self, s: usize, key: &[u8]) -> Option<Vec<u8>> {
        self.master_servers(s).into_iter().find_map(|j| {
            let m = &self.masters[j];
            if m.down_until.is_some() {
                return None;
            }
            m.server.get(0, key, m.clock_ms(self.t))
        })
    }

    /// A node of the master whose seed is `s` is down (a cluster master is down then).
    pub(crate) fn master_down(&self, s: usize) -> bool {
        self.master_servers(s)
            .iter()
            .any(|&j| self.masters[j].down_until.is_some())
    }

    /// A cut holds some bytes between `client` and the master whose seed is `s`.
    pub(crate) fn master_cut(&self, client: usize, s: usize, t: Us) -> bool {
        self.master_servers(s)
            .iter()
            .any(|&j| self.cut_until(client, j, t).is_some())
    }

    /// The cluster bus: what node `server` published reaches every other node's
    /// subscribers.
    pub(crate) fn cluster_bus(&mut self, server: usize) {
        let Some(Some((ci, _))) = self.cl.of_server.get(server).copied() else {
            return;
        };
        let msgs = self.masters[server].server.take_published();
        if self.cl.in_bus || msgs.is_empty() {
            return;
        }
        self.cl.in_bus = true;
        let nodes: Vec<usize> = self.cl.maps[ci]
            .borrow()
            .nodes
            .iter()
            .map(|n| n.0)
            .collect();
        for j in nodes {
            if j == server || self.masters[j].down_until.is_some() {
                continue;
            }
            for m in &msgs {
                self.operator(j, &[b"PUBLISH", &m.channel, &m.payload]);
            }
        }
        self.cl.in_bus = false;
    }

    /// Fault: a slot of some cluster starts migrating to another node.
    pub(crate) fn start_migration(&mut self) {
        let many: Vec<usize> = (0..self.cl.maps.len())
            .filter(|&ci| self.cl.maps[ci].borrow().nodes.len() > 1)
            .collect();
        if many.is_empty() {
            return;
        }
        let ci = many[self.rng.usize(..many.len())];
        let slot = if self.rng.f64() < 0.7 {
            let r = self.rng.usize(..self.cfg.resources.max(1));
            key_slot(&World::resource_name(r))
        } else {
            self.rng.u16(..SLOTS as u16)
        };
        let id = self.cl.next_migration;
        let (from, to) = {
            let map = self.cl.maps[ci].borrow();
            if map.migrating.contains_key(&slot) {
                return;
            }
            let Some(from) = map.owner(slot) else { return };
            let k = map.nodes.len();
            (from, (from + self.rng.usize(1..k)) % k)
        };
        self.cl.next_migration += 1;
        self.cl.migrated.insert((ci, slot));
        self.cl.maps[ci]
            .borrow_mut()
            .migrating
            .insert(slot, (from, to, id));
        self.stats.migrations += 1;
        self.log(|| format!("MIGRATE cluster {ci} slot {slot}: node {from} -> node {to}"));
        let (a, b) = self.cfg.migrate_len;
        let len = self.rng.u64(a..=b.max(a)).max(1);
        for _ in 0..self.rng.usize(0..=3) {
            let at = self.t + self.rng.u64(..len);
            self.schedule(at, Ev::Cluster(ClusterEv::Step { ci, slot, id }));
        }
        let at = self.t + len;
        self.schedule(at, Ev::Cluster(ClusterEv::Finish { ci, slot, id }));
    }

    pub(crate) fn cluster_event(&mut self, e: ClusterEv) {
        match e {
            ClusterEv::Step { ci, slot, id } => {
                self.move_keys(ci, slot, id, false);
            }
            ClusterEv::Finish { ci, slot, id } => {
                if !self.move_keys(ci, slot, id, true) {
                    // A node is down: the operator tries again later.
                    let at = self.t + self.cfg.migrate_len.0.max(super::MS);
                    self.schedule(at, Ev::Cluster(e));
                }
            }
        }
    }

    /// Move one key (or, `all`, every key and then the slot) of migration `id`; `false`:
    /// a node is down, nothing moved.
    fn move_keys(&mut self, ci: usize, slot: u16, id: u64, all: bool) -> bool {
        let Some((from, to, mid)) = self.cl.maps[ci].borrow().migrating.get(&slot).copied() else {
            return true;
        };
        if mid != id {
            return true;
        }
        let (a, b) = {
            let map = self.cl.maps[ci].borrow();
            (map.nodes[from].0, map.nodes[to].0)
        };
        if self.masters[a].down_until.is_some() || self.masters[b].down_until.is_some() {
            return false;
        }
        let (am, bm) = (
            self.masters[a].clock_ms(self.t),
            self.masters[b].clock_ms(self.t),
        );
        let mut keys: Vec<Vec<u8>> = self.masters[a]
            .server
            .keys(0, am)
            .into_iter()
            .filter(|k| key_slot(k) == slot)
            .collect();
        if !all && !keys.is_empty() {
            let i = self.rng.usize(..keys.len());
            keys = vec![keys.swap_remove(i)];
        }
        let (x, y) = if a < b {
            let (l, r) = self.masters.split_at_mut(b);
            (&mut l[a], &mut r[0])
        } else {
            let (l, r) = self.masters.split_at_mut(a);
            (&mut r[0], &mut l[b])
        };
        for k in &keys {
            if x.server.migrate_key(k, am, &mut y.server, bm) {
                self.stats.keys_migrated += 1;
            }
        }
        if all {
            let mut map = self.cl.maps[ci].borrow_mut();
            map.migrating.remove(&slot);
            map.owner[slot as usize] = to as u8;
        }
        let n = keys.len();
        self.log(|| {
            format!(
                "  cluster {ci} slot {slot}: {n} keys to node {to}{}",
                if all { ", the slot is its now" } else { "" }
            )
        });
        self.flush_server(a);
        self.flush_server(b);
        self.update_truth(false);
        true
    }

    /// The faults heal: every migration ends.
    pub(crate) fn cluster_heal(&mut self) {
        for ci in 0..self.cl.maps.len() {
            let all: Vec<(u16, u64)> = self.cl.maps[ci]
                .borrow()
                .migrating
                .iter()
                .map(|(&s, &(_, _, id))| (s, id))
                .collect();
            for (slot, id) in all {
                self.move_keys(ci, slot, id, true);
            }
        }
    }

    /// Fault: node `server` fails over to a replica at its address: its connections reset,
    /// a new run id and a long uptime, the keys it had not replicated lost
    /// (`failover_loss`).
    pub(crate) fn failover(&mut self, server: usize) {
        if self.cl.of_server.get(server).copied().flatten().is_none() {
            return;
        }
        // As for a swap: the amnesia guard knows the new run id only where a client saw
        // the old one.
        let seen = (0..self.clients.len()).all(|c| self.seen.contains(&(c, server)));
        if self.masters[server].down_until.is_some() || !seen {
            return;
        }
        self.crash(server);
        let old = self.masters[server].server.config().clone();
        let scfg = server::Config {
            seed: self.rng.u64(..),
            process_id: old.process_id + 7,
            ..old
        };
        let now = self.masters[server].clock_ms(self.t);
        let mut new = SimRedis::new(scfg, now.saturating_sub(36_000_000));
        let mut lost = 0;
        for key in self.masters[server].server.keys(0, now) {
            if self.rng.f64() < self.cfg.failover_loss {
                lost += 1;
                continue;
            }
            self.masters[server]
                .server
                .migrate_key(&key, now, &mut new, now);
        }
        self.masters[server].server = new;
        self.attach_role(server);
        self.stats.failovers += 1;
        self.log(|| format!("FAILOVER of node server {server}: {lost} keys lost"));
    }

    /// Counters of the clusters, into the run's statistics.
    pub(crate) fn cluster_stats(&mut self) {
        for m in &self.cl.maps {
            let m = m.borrow();
            self.stats.moved += m.moved;
            self.stats.asked += m.asked;
            self.stats.tryagain += m.tryagain;
            self.stats.crossslot += m.crossslot;
            self.stats.script_refused += m.script_refused.get();
        }
    }
}

impl World {
    /// Some master is a cluster: the clients flush as the driver does (`flush_with`).
    pub(crate) fn clustered(&self) -> bool {
        !self.cl.maps.is_empty()
    }

    /// (xi)'s excuse on a cluster: a key left on node `server` by an attempt whose answer
    /// its client never read because a connection of that cluster master reset while it
    /// was in flight (the shards' replies go to the rounds in request order: an answer
    /// that came behind another shard's is lost with the connection, and the design
    /// leaves what a lost connection's requests did to the key's TTL: `fail_node`).
    pub(crate) fn left_by_lost_cluster_connection(&self, server: usize, token: &[u8]) -> bool {
        let Some(Some((ci, _))) = self.cl.of_server.get(server).copied() else {
            return false;
        };
        let nodes: Vec<usize> = self.cl.maps[ci]
            .borrow()
            .nodes
            .iter()
            .map(|n| n.0)
            .collect();
        let Some(a) = self.attempts.iter().find(|a| a.token == token) else {
            return false;
        };
        let until = a.at + 2 * self.cfg.ttl.1;
        self.cl
            .resets
            .iter()
            .any(|&(c, s, t)| c == a.client && nodes.contains(&s) && a.at <= t && t <= until)
    }
}
