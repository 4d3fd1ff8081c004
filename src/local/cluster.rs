//! Local Redis (or Valkey) Clusters: [`LocalCluster`].

use std::fmt;
use std::io;
use std::ops::RangeInclusive;
use std::thread;
use std::time::{Duration, Instant};

use super::{start_many, AdminReply, LocalMaster, Transport};

/// The number of hash slots of a Redis Cluster: slots are `0..CLUSTER_SLOTS`.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// Default bound on every wait of a [`LocalCluster`] (formation, agreement, failover).
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// Pause between two looks at the nodes while waiting.
const WAIT_POLL: Duration = Duration::from_millis(20);
/// Keys moved by one `MIGRATE`.
const MIGRATE_BATCH: usize = 100;
/// `MIGRATE`'s own timeout, in milliseconds.
const MIGRATE_TIMEOUT_MS: &str = "5000";

/// Settings every node starts with, before the caller's extra arguments (the last value
/// of an option wins): a node is judged failing after 5 s without an answer (15 s by
/// default: tests of a failover would wait that long; 2 s judged busy nodes failing on a
/// loaded 2-core machine, and their replicas took over by themselves in the middle of a
/// test: `cluster_harness::a_failover_changes_the_primary_of_a_range` lost a write in CI); a replica may always be promoted,
/// however long ago it heard from its primary; replicas never move to another primary on
/// their own; SIGTERM stops a node at once (no wait for lagging replicas).
const CLUSTER_DEFAULTS: &[&str] = &[
    "--cluster-node-timeout",
    "5000",
    "--cluster-replica-validity-factor",
    "0",
    "--cluster-allow-replica-migration",
    "no",
    "--shutdown-on-sigterm",
    "now",
];

/// The role of a cluster node in one node's view.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// A primary (`master` in `CLUSTER NODES`), serving the slots it holds.
    Primary,
    /// A replica of the primary with this node ID.
    Replica {
        /// The node ID of its primary.
        primary: String,
    },
}

/// One node as a node's `CLUSTER NODES` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// Its index in the [`LocalCluster`] (found by port), `None` for a node the cluster
    /// did not start.
    pub index: Option<usize>,
    /// Its node ID (40 hex characters).
    pub id: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Primary or replica.
    pub role: Role,
    /// The slot ranges it serves (a primary's; empty for a replica), ascending.
    pub slots: Vec<RangeInclusive<u16>>,
    /// Flagged `fail` (agreed down by a majority of primaries) in this view.
    pub failed: bool,
    /// Flagged `pfail` or `fail?` (not answering, not yet agreed down) in this view.
    pub suspected: bool,
}

impl ClusterNode {
    /// `true` for a primary.
    pub fn is_primary(&self) -> bool {
        self.role == Role::Primary
    }

    /// `true` when it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }
}

/// The cluster as one node sees it (`CLUSTER INFO` and `CLUSTER NODES`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Topology {
    /// The index of the node whose view this is.
    pub observer: usize,
    /// `cluster_state:ok` in its `CLUSTER INFO`.
    pub state_ok: bool,
    /// Every node it knows of, ordered by index (nodes the cluster did not start last).
    pub nodes: Vec<ClusterNode>,
}

impl Topology {
    /// The node that serves `slot`, if one does.
    pub fn primary_of(&self, slot: u16) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.is_primary() && n.serves(slot))
    }

    /// The primaries that serve at least one slot.
    pub fn primaries(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes
            .iter()
            .filter(|n| n.is_primary() && !n.slots.is_empty())
    }

    /// The replicas of the node with ID `primary_id`.
    pub fn replicas_of<'a>(&'a self, primary_id: &'a str) -> impl Iterator<Item = &'a ClusterNode> {
        self.nodes
            .iter()
            .filter(move |n| matches!(&n.role, Role::Replica { primary } if primary == primary_id))
    }

    /// The node with this [`LocalCluster`] index.
    pub fn node(&self, index: usize) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.index == Some(index))
    }

    /// What must be the same on every node for the map to be agreed: IDs, ports, roles and
    /// slots (not the flags, which each node sets on its own clock).
    fn map(&self) -> Vec<(&str, u16, &Role, &[RangeInclusive<u16>])> {
        let mut map: Vec<_> = self
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.port, &n.role, n.slots.as_slice()))
            .collect();
        map.sort_by(|a, b| a.0.cmp(b.0));
        map
    }
}

impl fmt::Display for Topology {
    /// One line per node: `#index port id-prefix role slots [fail]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node {}'s view (cluster_state:{}):",
            self.observer,
            if self.state_ok { "ok" } else { "fail" }
        )?;
        for n in &self.nodes {
            let index = n.index.map_or("?".into(), |i| i.to_string());
            let id = n.id.get(..8).unwrap_or(&n.id);
            let role = match &n.role {
                Role::Primary => "primary".to_string(),
                Role::Replica { primary } => {
                    format!("replica of {}", primary.get(..8).unwrap_or(primary))
                }
            };
            let slots: Vec<String> = n
                .slots
                .iter()
                .map(|r| {
                    if r.start() == r.end() {
                        r.start().to_string()
                    } else {
                        format!("{}-{}", r.start(), r.end())
                    }
                })
                .collect();
            write!(f, " [#{index} :{} {id} {role}", n.port)?;
            if !slots.is_empty() {
                write!(f, " {}", slots.join(","))?;
            }
            if n.failed {
                f.write_str(" fail")?;
            } else if n.suspected {
                f.write_str(" pfail")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// How [`LocalCluster::failover`] promotes a replica (`CLUSTER FAILOVER [FORCE|TAKEOVER]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverMode {
    /// With its primary's help: the primary stops taking writes until the replica has
    /// caught up, then the replica is elected. Needs the primary up and the replication
    /// link up. No write is lost.
    Coordinated,
    /// `FORCE`: without the primary (down or unreachable), elected by the other primaries.
    /// Writes the replica had not received are lost.
    Force,
    /// `TAKEOVER`: without the primary and without an election (a new config epoch of its
    /// own). Writes the replica had not received are lost.
    Takeover,
}

/// A slot being moved between two primaries, step by step (see
/// [`LocalCluster::begin_slot_migration`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a migration left unfinished keeps the slot in the ASK phase"]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration {
    /// The slot.
    pub fn slot(&self) -> u16 {
        self.slot
    }
    /// The index of the primary it leaves (`MIGRATING`).
    pub fn from(&self) -> usize {
        self.from
    }
    /// The index of the primary it goes to (`IMPORTING`).
    pub fn to(&self) -> usize {
        self.to
    }
}

/// The hash slot of `key` as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of
/// its hash tag (the bytes between the first `{` and the first `}` after it, when not
/// empty), modulo 16,384. [`LocalCluster::slot_of`] asks a server instead.
///
/// ```
/// use redlock_mux::local::key_slot;
///
/// assert_eq!(key_slot(b"123456789"), 12_739); // 0x31C3, the CRC16 check value
/// assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    crate::slot::key_slot(key)
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// `Ok` for `+OK`, the error text otherwise.
fn expect_ok(reply: AdminReply, what: &str) -> io::Result<()> {
    match reply {
        r if r.is_ok() => Ok(()),
        AdminReply::Error(e) => Err(other(format!("{what}: -{e}"))),
        r => Err(other(format!("{what}: unexpected reply {r:?}"))),
    }
}

/// A Redis (or Valkey: the binary of [`redis_server_path`](super::redis_server_path)) Cluster of
/// local nodes on free `127.0.0.1` ports, each a [`LocalMaster`] with `cluster-enabled
/// yes`, its own `nodes.conf` in its temporary directory and a free cluster bus port of
/// its own (`--cluster-port`: Redis 7 or later, or Valkey). Dropping it stops every node by
/// PID and removes their directories.
///
/// [`start`](Self::start) makes 3 primaries; [`start_with`](Self::start_with) any number,
/// with replicas. The 16,384 slots are spread evenly over the primaries in index order
/// (`CLUSTER ADDSLOTSRANGE`), the nodes meet (`CLUSTER MEET`), replicas follow their
/// primary (`CLUSTER REPLICATE`): nodes `0..primaries` are the primaries, then the
/// replicas of primary 0, of primary 1, and so on. A start returns once every node says
/// `cluster_state:ok`, every node shows the same slot map, and every replica's
/// replication link is up.
///
/// Clients name a cluster by a seed URL, `redis+cluster://127.0.0.1:<port>` (any node's
/// port: [`seed_url`](Self::seed_url), [`seed_urls`](Self::seed_urls)).
///
/// Nodes are addressed by index, which stays the node's whatever its role becomes: kill,
/// stop, freeze or restart one through [`node_mut`](Self::node_mut) or
/// [`kill`](Self::kill) and [`restart`](Self::restart) (a restarted node keeps its ID and
/// port and rejoins; without persistence it comes back empty, a restarted primary still
/// claiming its slots unless a replica took them over). [`failover`](Self::failover)
/// promotes a replica; [`begin_slot_migration`](Self::begin_slot_migration),
/// [`migrate_slot_keys`](Self::migrate_slot_keys) and
/// [`finish_slot_migration`](Self::finish_slot_migration) move a slot in steps, so that a
/// test sees the `-ASK` phase, then the `-MOVED` one. Every wait is bounded
/// ([`set_wait_timeout`](Self::set_wait_timeout), 30 s by default) and ends in an error
/// that shows each node's view.
///
/// Nodes time out after 5 s (`cluster-node-timeout 5000`), replicas may always be
/// promoted (`cluster-replica-validity-factor 0`) and never move to another primary by
/// themselves; extra arguments override these.
///
/// # Examples
///
/// ```no_run
/// use redlock_mux::local::{AdminReply, FailoverMode, LocalCluster};
///
/// let mut cluster = LocalCluster::start_with(3, 1, &[])?; // 3 primaries, 1 replica each
/// println!("{}", cluster.seed_url()); // redis+cluster://127.0.0.1:<port>
///
/// let slot = cluster.slot_of(b"inventory:sku-1")?;
/// let primary = cluster.primary_of_slot(slot)?;
/// let other = (primary + 1) % 3;
/// let reply = cluster.node(other).cmd(&[b"GET", b"inventory:sku-1"])?;
/// assert!(matches!(reply, AdminReply::Error(e) if e.starts_with("MOVED ")));
///
/// let replica = cluster.replicas_of(primary)?[0];
/// cluster.failover(replica, FailoverMode::Coordinated)?;
/// assert_eq!(cluster.primary_of_slot(slot)?, replica);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct LocalCluster {
    nodes: Vec<LocalMaster>,
    ids: Vec<String>,
    wait: Duration,
}

impl fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCluster")
            .field("seed", &self.seed_url())
            .field("nodes", &self.nodes)
            .field("ids", &self.ids)
            .finish()
    }
}

impl LocalCluster {
    /// Starts a cluster of 3 primaries without replicas (see
    /// [`start_with`](Self::start_with)).
    ///
    /// ```no_run
    /// let cluster = redlock_mux::local::LocalCluster::start()?;
    /// assert_eq!(cluster.len(), 3);
    /// assert!(cluster.seed_url().starts_with("redis+cluster://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<LocalCluster> {
        Self::start_with(3, 0, &[])
    }

    /// Starts `primaries` primaries with `replicas_per_primary` replicas each, every node
    /// with the extra `redis-server` arguments `extra_args` (after the defaults, see
    /// [`LocalMaster::start_with`]; a `--requirepass` is also passed as `--masterauth`).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for no primaries or more than 16,384; `NotFound` when the server
    /// binary is missing; a start error of a node; `TimedOut` (with every node's view)
    /// when the cluster is not formed within the wait bound.
    pub fn start_with(
        primaries: usize,
        replicas_per_primary: usize,
        extra_args: &[&str],
    ) -> io::Result<LocalCluster> {
        if primaries == 0 || primaries > usize::from(CLUSTER_SLOTS) {
            return Err(invalid_input(format!(
                "a cluster needs 1 to {CLUSTER_SLOTS} primaries, not {primaries}"
            )));
        }
        let total = primaries * (1 + replicas_per_primary);
        let mut args: Vec<&str> = CLUSTER_DEFAULTS.to_vec();
        args.extend_from_slice(extra_args);
        let password = extra_args
            .iter()
            .position(|a| a.eq_ignore_ascii_case("--requirepass"))
            .and_then(|i| extra_args.get(i + 1))
            .copied();
        if let Some(p) = password {
            args.extend_from_slice(&["--masterauth", p]);
        }
        let nodes = start_many(total, Transport::Tcp, &args, None, true)?;
        let mut cluster = LocalCluster {
            nodes,
            ids: Vec::new(),
            wait: DEFAULT_WAIT,
        };
        cluster.form(primaries, replicas_per_primary)?;
        Ok(cluster)
    }

    /// Assigns slots and epochs, introduces the nodes, makes the replicas, and waits until
    /// all agree.
    fn form(&mut self, primaries: usize, replicas_per_primary: usize) -> io::Result<()> {
        for i in 0..self.nodes.len() {
            let id = self.nodes[i].cmd(&[b"CLUSTER", b"MYID"])?;
            let id = id
                .as_str()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| other(format!("CLUSTER MYID on node {i}: {id:?}")))?
                .to_string();
            self.ids.push(id);
        }
        let slots = u32::from(CLUSTER_SLOTS);
        for (i, node) in self.nodes.iter().enumerate() {
            // Distinct epochs from the start, as `redis-cli --cluster create` sets them
            // (else the nodes first resolve their collisions).
            let epoch = (i + 1).to_string();
            expect_ok(
                node.cmd(&[b"CLUSTER", b"SET-CONFIG-EPOCH", epoch.as_bytes()])?,
                &format!("CLUSTER SET-CONFIG-EPOCH on node {i}"),
            )?;
            if i < primaries {
                let p = primaries as u32;
                let first = (i as u32 * slots / p).to_string();
                let last = ((i as u32 + 1) * slots / p - 1).to_string();
                expect_ok(
                    node.cmd(&[
                        b"CLUSTER",
                        b"ADDSLOTSRANGE",
                        first.as_bytes(),
                        last.as_bytes(),
                    ])?,
                    &format!("CLUSTER ADDSLOTSRANGE {first} {last} on node {i}"),
                )?;
            }
        }
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            let port = node.port().to_string();
            let bus = node.cluster_port().unwrap_or(0).to_string();
            expect_ok(
                self.nodes[0].cmd(&[
                    b"CLUSTER",
                    b"MEET",
                    b"127.0.0.1",
                    port.as_bytes(),
                    bus.as_bytes(),
                ])?,
                &format!("CLUSTER MEET of node {i} (port {port}, bus {bus})"),
            )?;
        }
        // A replica must know its primary before it can follow it.
        let total = self.nodes.len();
        self.wait_until("every node to know every other", |views| {
            views
                .iter()
                .all(|v| v.nodes.len() == total && v.nodes.iter().all(|n| n.index.is_some()))
        })?;
        for p in 0..primaries {
            for r in 0..replicas_per_primary {
                let i = primaries + p * replicas_per_primary + r;
                expect_ok(
                    self.nodes[i].cmd(&[b"CLUSTER", b"REPLICATE", self.ids[p].as_bytes()])?,
                    &format!("CLUSTER REPLICATE on node {i} (of node {p})"),
                )?;
            }
        }
        let ids = self.ids.clone();
        self.wait_agreed_and("the replicas to follow their primaries", |v| {
            (0..total).all(|i| {
                let want = if i < primaries {
                    Role::Primary
                } else {
                    Role::Replica {
                        primary: ids[(i - primaries) / replicas_per_primary].clone(),
                    }
                };
                v.node(i).is_some_and(|n| n.role == want)
            })
        })?;
        self.wait_replication_links()
    }

    /// Waits until every running replica's replication link is up (`master_link_status:up`).
    fn wait_replication_links(&self) -> io::Result<()> {
        let deadline = Instant::now() + self.wait;
        loop {
            let mut down = Vec::new();
            for (i, node) in self.nodes.iter().enumerate() {
                if node.pid().is_none() {
                    continue;
                }
                let info = node.cmd(&[b"INFO", b"replication"])?;
                let info = info.as_str().unwrap_or("");
                if info.contains("role:slave") && !info.contains("master_link_status:up") {
                    down.push(i);
                }
            }
            if down.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the replication link of node(s) {down:?} is not up after {:?}",
                        self.wait
                    ),
                ));
            }
            thread::sleep(WAIT_POLL);
        }
    }

    /// Changes the bound on every wait (formation aside: it is set before).
    pub fn set_wait_timeout(&mut self, wait: Duration) {
        self.wait = wait;
    }

    /// Number of nodes (primaries and replicas).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `true` for a cluster of no node (never: a start makes at least one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node with this index (kill, freeze, restart it through
    /// [`node_mut`](Self::node_mut)).
    ///
    /// # Panics
    ///
    /// When `index` is out of range.
    pub fn node(&self, index: usize) -> &LocalMaster {
        &self.nodes[index]
    }

    /// The node with this index, mutably. Its [`LocalMaster::limit_cpu`] puts it under a
    /// CPU quota; after a [`LocalMaster::restart`] call [`wait_agreed`](Self::wait_agreed).
    ///
    /// # Panics
    ///
    /// When `index` is out of range.
    pub fn node_mut(&mut self, index: usize) -> &mut LocalMaster {
        &mut self.nodes[index]
    }

    /// Every node, in index order.
    pub fn nodes(&self) -> &[LocalMaster] {
        &self.nodes
    }

    /// The cluster node ID of the node with this index (it keeps it across restarts).
    ///
    /// # Panics
    ///
    /// When `index` is out of range.
    pub fn node_id(&self, index: usize) -> &str {
        &self.ids[index]
    }

    /// The index of the node with this ID.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|i| i == id)
    }

    /// `redis+cluster://127.0.0.1:<port>` of the first running node (of node 0 when none
    /// runs), with the password as in [`LocalMaster::url`].
    pub fn seed_url(&self) -> String {
        let node = self
            .nodes
            .iter()
            .find(|n| n.pid().is_some())
            .unwrap_or(&self.nodes[0]);
        cluster_url(node)
    }

    /// `redis+cluster://127.0.0.1:<port>` of every running node, in index order: a client
    /// given several seeds needs only one of them to answer.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .map(cluster_url)
            .collect()
    }

    /// The index of a running node to ask.
    fn any_running(&self) -> io::Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.pid().is_some())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    "no node of the cluster is running",
                )
            })
    }

    /// The view of node `index` (`CLUSTER INFO` and `CLUSTER NODES`).
    pub fn view_of(&self, index: usize) -> io::Result<Topology> {
        let node = self
            .nodes
            .get(index)
            .ok_or_else(|| invalid_input(format!("no node {index}")))?;
        let replies = node.cmds(&[&[b"CLUSTER", b"INFO"], &[b"CLUSTER", b"NODES"]])?;
        let info = replies
            .first()
            .and_then(AdminReply::as_str)
            .ok_or_else(|| {
                other(format!(
                    "CLUSTER INFO on node {index}: {:?}",
                    replies.first()
                ))
            })?;
        let text = replies.get(1).and_then(AdminReply::as_str).ok_or_else(|| {
            other(format!(
                "CLUSTER NODES on node {index}: {:?}",
                replies.get(1)
            ))
        })?;
        let mut nodes = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| self.parse_node_line(l))
            .collect::<io::Result<Vec<ClusterNode>>>()
            .map_err(|e| other(format!("CLUSTER NODES on node {index}: {e}")))?;
        nodes.sort_by_key(|n| (n.index.unwrap_or(usize::MAX), n.port));
        Ok(Topology {
            observer: index,
            state_ok: info.lines().any(|l| l.trim() == "cluster_state:ok"),
            nodes,
        })
    }

    /// One line of `CLUSTER NODES`: `id ip:port@cport[,hostname] flags primary-id
    /// ping-sent pong-recv epoch link slot...`.
    fn parse_node_line(&self, line: &str) -> io::Result<ClusterNode> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || invalid_input(format!("unexpected CLUSTER NODES line {line:?}"));
        if fields.len() < 8 {
            return Err(bad());
        }
        let addr = fields[1].split(['@', ',']).next().unwrap_or("");
        let port: u16 = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(bad)?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let role = if flags.iter().any(|f| *f == "slave" || *f == "replica") {
            Role::Replica {
                primary: fields[3].to_string(),
            }
        } else {
            Role::Primary
        };
        let mut slots = Vec::new();
        for s in &fields[8..] {
            if s.starts_with('[') {
                continue; // [slot->-id] / [slot-<-id]: a migration in progress
            }
            let range = match s.split_once('-') {
                Some((a, b)) => a.parse().ok().zip(b.parse().ok()),
                None => s.parse().ok().map(|a| (a, a)),
            };
            let (a, b): (u16, u16) = range.ok_or_else(bad)?;
            slots.push(a..=b);
        }
        slots.sort_by_key(|r| *r.start());
        let id = fields[0].to_string();
        Ok(ClusterNode {
            // The nodes a cluster started are found by ID (a node in the handshake has a
            // random one of its own until it is known) and port.
            index: self.index_of(&id).filter(|&i| self.nodes[i].port() == port),
            id,
            port,
            role,
            slots,
            failed: flags.contains(&"fail"),
            suspected: flags.iter().any(|f| *f == "pfail" || *f == "fail?"),
        })
    }

    /// The view of every running node.
    fn views(&self) -> io::Result<Vec<Topology>> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].pid().is_some())
            .map(|i| self.view_of(i))
            .collect()
    }

    /// Polls every running node's view until `done` holds (bounded by the wait timeout).
    fn wait_until(
        &self,
        what: &str,
        mut done: impl FnMut(&[Topology]) -> bool,
    ) -> io::Result<Vec<Topology>> {
        let deadline = Instant::now() + self.wait;
        let max_polls = (self.wait.as_millis() / WAIT_POLL.as_millis()).max(1) as u64 + 1;
        let mut last = String::from("no answer yet");
        for _ in 0..max_polls {
            match self.views() {
                Ok(views) if done(&views) => return Ok(views),
                Ok(views) => {
                    last = views
                        .iter()
                        .map(Topology::to_string)
                        .collect::<Vec<_>>()
                        .join("\n  ")
                }
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(WAIT_POLL);
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "waited {:?} for {what}; last look at the nodes:\n  {last}",
                self.wait
            ),
        ))
    }

    /// Waits until every running node says `cluster_state:ok` and shows the same map
    /// (node IDs, ports, roles and slots, including of nodes that are down), and returns
    /// that map.
    ///
    /// # Errors
    ///
    /// `TimedOut`, with each running node's view, when that does not happen within the
    /// wait bound (for instance while a primary with no replica is down: its slots are
    /// served by no one); `NotConnected` when no node runs.
    pub fn wait_agreed(&self) -> io::Result<Topology> {
        self.wait_agreed_and("an agreed map", |_| true)
    }

    fn wait_agreed_and(
        &self,
        what: &str,
        mut also: impl FnMut(&Topology) -> bool,
    ) -> io::Result<Topology> {
        self.any_running()?;
        let views = self.wait_until(
            &format!("cluster_state:ok and one slot map on every running node, and {what}"),
            |views| {
                let Some(first) = views.first() else {
                    return false;
                };
                let map = first.map();
                views.iter().all(|v| v.state_ok && v.map() == map) && also(first)
            },
        )?;
        Ok(views.into_iter().next().expect("a running node"))
    }

    /// The view of a running node, without waiting for agreement.
    pub fn topology(&self) -> io::Result<Topology> {
        self.view_of(self.any_running()?)
    }

    /// The slot of `key`, as a running node computes it (`CLUSTER KEYSLOT`). The same as
    /// [`key_slot`].
    pub fn slot_of(&self, key: &[u8]) -> io::Result<u16> {
        let i = self.any_running()?;
        match self.nodes[i].cmd(&[b"CLUSTER", b"KEYSLOT", key])? {
            AdminReply::Int(n) if (0..i64::from(CLUSTER_SLOTS)).contains(&n) => Ok(n as u16),
            r => Err(other(format!("CLUSTER KEYSLOT: unexpected reply {r:?}"))),
        }
    }

    /// The index of the primary that serves `slot` in a running node's view.
    ///
    /// # Errors
    ///
    /// When no running node answers, or the slot is not served in its view.
    pub fn primary_of_slot(&self, slot: u16) -> io::Result<usize> {
        let view = self.topology()?;
        view.primary_of(slot)
            .and_then(|n| n.index)
            .ok_or_else(|| other(format!("no node of the cluster serves slot {slot}: {view}")))
    }

    /// The index of the primary that serves `key`'s slot.
    pub fn primary_of_key(&self, key: &[u8]) -> io::Result<usize> {
        self.primary_of_slot(self.slot_of(key)?)
    }

    /// The indices of the primaries serving slots, in a running node's view, ascending.
    pub fn primaries(&self) -> io::Result<Vec<usize>> {
        Ok(self
            .topology()?
            .primaries()
            .filter_map(|n| n.index)
            .collect())
    }

    /// The indices of the replicas of the node `primary`, in a running node's view.
    pub fn replicas_of(&self, primary: usize) -> io::Result<Vec<usize>> {
        let id = self
            .ids
            .get(primary)
            .ok_or_else(|| invalid_input(format!("no node {primary}")))?;
        Ok(self
            .topology()?
            .replicas_of(id)
            .filter_map(|n| n.index)
            .collect())
    }

    /// SIGKILL to node `index`, reaped; no wait for the others to notice (see
    /// [`wait_failed`](Self::wait_failed)).
    pub fn kill(&mut self, index: usize) -> io::Result<()> {
        self.checked(index)?.kill()
    }

    /// Stops node `index` (SIGTERM, then SIGKILL after 5 s); no wait for the others to
    /// notice.
    pub fn stop(&mut self, index: usize) -> io::Result<()> {
        self.checked(index)?.stop()
    }

    /// Starts node `index` again on its port, with its `nodes.conf` (same ID, same
    /// view of the cluster as when it stopped), then waits for [`wait_agreed`](Self::wait_agreed)
    /// and for the replication links to be up.
    pub fn restart(&mut self, index: usize) -> io::Result<Topology> {
        self.checked(index)?.restart()?;
        let map = self.wait_agreed()?;
        self.wait_replication_links()?;
        Ok(map)
    }

    fn checked(&mut self, index: usize) -> io::Result<&mut LocalMaster> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(index)
            .ok_or_else(|| invalid_input(format!("no node {index} in a cluster of {n}")))
    }

    /// Waits until every running node flags node `index` `fail` (down by the agreement of
    /// a majority of the primaries that serve slots, after the node timeout: with two
    /// primaries, one alone is no majority, and a stopped one is only ever `pfail`).
    pub fn wait_failed(&self, index: usize) -> io::Result<()> {
        let id = self
            .ids
            .get(index)
            .ok_or_else(|| invalid_input(format!("no node {index}")))?
            .clone();
        self.any_running()?;
        self.wait_until(
            &format!("every running node to flag node {index} fail"),
            |views| {
                views
                    .iter()
                    .all(|v| v.nodes.iter().any(|n| n.id == id && n.failed))
            },
        )?;
        Ok(())
    }

    /// Promotes the replica `replica` (`CLUSTER FAILOVER`, with `FORCE` or `TAKEOVER` per
    /// `mode`) and waits until every running node agrees that it serves the slots its
    /// primary served.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `replica` is not a replica of a primary serving slots; the
    /// server's refusal; `TimedOut` (with every node's view) when the new map is not agreed
    /// within the wait bound (a [`Coordinated`](FailoverMode::Coordinated) failover whose
    /// primary is down never happens).
    pub fn failover(&mut self, replica: usize, mode: FailoverMode) -> io::Result<Topology> {
        let view = self.view_of(replica)?;
        let Some(Role::Replica { primary }) = view.node(replica).map(|n| n.role.clone()) else {
            return Err(invalid_input(format!(
                "node {replica} is not a replica: {view}"
            )));
        };
        let slots = view
            .nodes
            .iter()
            .find(|n| n.id == primary)
            .map(|n| n.slots.clone())
            .unwrap_or_default();
        if slots.is_empty() {
            return Err(invalid_input(format!(
                "the primary of node {replica} serves no slot: {view}"
            )));
        }
        let mut args: Vec<&[u8]> = vec![b"CLUSTER", b"FAILOVER"];
        match mode {
            FailoverMode::Coordinated => {}
            FailoverMode::Force => args.push(b"FORCE"),
            FailoverMode::Takeover => args.push(b"TAKEOVER"),
        }
        expect_ok(
            self.nodes[replica].cmd(&args)?,
            &format!("CLUSTER FAILOVER {mode:?} on node {replica}"),
        )?;
        self.wait_agreed_and(&format!("node {replica} to serve {slots:?}"), |v| {
            v.node(replica)
                .is_some_and(|n| n.is_primary() && n.slots == slots)
        })
    }

    /// First step of moving `slot` to the primary `to`: `CLUSTER SETSLOT slot IMPORTING`
    /// on `to`, then `MIGRATING` on the primary serving it. From then on, the old primary
    /// answers a command for a key of the slot it does not hold with `-ASK slot
    /// 127.0.0.1:<port of to>`, and `to` serves such a command after `ASKING`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `to` is not a primary or already serves the slot, or for a slot
    /// above 16,383; the servers' refusals.
    pub fn begin_slot_migration(&mut self, slot: u16, to: usize) -> io::Result<SlotMigration> {
        if slot >= CLUSTER_SLOTS {
            return Err(invalid_input(format!("no slot {slot}: slots are 0-16383")));
        }
        let view = self.wait_agreed()?;
        let from = view
            .primary_of(slot)
            .and_then(|n| n.index)
            .ok_or_else(|| other(format!("no node serves slot {slot}: {view}")))?;
        if !view.node(to).is_some_and(ClusterNode::is_primary) || from == to {
            return Err(invalid_input(format!(
                "cannot move slot {slot} from node {from} to node {to}: {view}"
            )));
        }
        let s = slot.to_string();
        expect_ok(
            self.nodes[to].cmd(&[
                b"CLUSTER",
                b"SETSLOT",
                s.as_bytes(),
                b"IMPORTING",
                self.ids[from].as_bytes(),
            ])?,
            &format!("CLUSTER SETSLOT {slot} IMPORTING on node {to}"),
        )?;
        expect_ok(
            self.nodes[from].cmd(&[
                b"CLUSTER",
                b"SETSLOT",
                s.as_bytes(),
                b"MIGRATING",
                self.ids[to].as_bytes(),
            ])?,
            &format!("CLUSTER SETSLOT {slot} MIGRATING on node {from}"),
        )?;
        Ok(SlotMigration { slot, from, to })
    }

    /// Second step: moves every key of the slot still on the old primary to the new one
    /// (`CLUSTER GETKEYSINSLOT`, `MIGRATE ... KEYS`, in batches, TTLs kept), and returns
    /// how many. May be called more than once.
    pub fn migrate_slot_keys(&mut self, migration: &SlotMigration) -> io::Result<usize> {
        let (from, to) = (&self.nodes[migration.from], &self.nodes[migration.to]);
        let slot = migration.slot.to_string();
        let batch = MIGRATE_BATCH.to_string();
        let port = to.port().to_string();
        let mut moved = 0;
        // Each round moves at least one key or finds every key it listed gone, and no new
        // key of the slot lands on the old primary while it is MIGRATING: bounded by the
        // keys there at the start.
        loop {
            let keys = match from.cmd(&[
                b"CLUSTER",
                b"GETKEYSINSLOT",
                slot.as_bytes(),
                batch.as_bytes(),
            ])? {
                AdminReply::Array(keys) => keys,
                r => return Err(other(format!("CLUSTER GETKEYSINSLOT {slot}: {r:?}"))),
            };
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut args: Vec<&[u8]> = vec![
                b"MIGRATE",
                b"127.0.0.1",
                port.as_bytes(),
                b"",
                b"0",
                MIGRATE_TIMEOUT_MS.as_bytes(),
            ];
            if let Some(p) = to.password() {
                args.extend_from_slice(&[b"AUTH", p.as_bytes()]);
            }
            args.push(b"KEYS");
            for key in &keys {
                match key {
                    AdminReply::Bulk(Some(k)) => args.push(k),
                    r => return Err(other(format!("CLUSTER GETKEYSINSLOT {slot}: key {r:?}"))),
                }
            }
            match from.cmd(&args)? {
                // Every key listed was gone by then (deleted or expired meanwhile, as keys
                // under live traffic are): nothing moved, look again.
                AdminReply::Simple(s) if s == "NOKEY" => {}
                r => {
                    expect_ok(r, &format!("MIGRATE of {} keys of slot {slot}", keys.len()))?;
                    moved += keys.len();
                }
            }
        }
    }

    /// Last step: `CLUSTER SETSLOT slot NODE <to>` on the new primary, the old one and
    /// every other running primary, then waits until every running node agrees that the
    /// new primary serves the slot. From then on the old primary answers `-MOVED slot
    /// 127.0.0.1:<port of to>`. Keys left on the old primary (see
    /// [`migrate_slot_keys`](Self::migrate_slot_keys)) make it an error.
    pub fn finish_slot_migration(&mut self, migration: SlotMigration) -> io::Result<Topology> {
        let SlotMigration { slot, from, to } = migration;
        let s = slot.to_string();
        let set = |i: usize| -> io::Result<()> {
            expect_ok(
                self.nodes[i].cmd(&[
                    b"CLUSTER",
                    b"SETSLOT",
                    s.as_bytes(),
                    b"NODE",
                    self.ids[to].as_bytes(),
                ])?,
                &format!("CLUSTER SETSLOT {slot} NODE {} on node {i}", self.ids[to]),
            )
        };
        set(to)?;
        set(from)?;
        let view = self.topology()?;
        for n in view.primaries() {
            match n.index {
                Some(i) if i != to && i != from && self.nodes[i].pid().is_some() => set(i)?,
                _ => {}
            }
        }
        self.wait_agreed_and(&format!("node {to} to serve slot {slot}"), |v| {
            v.primary_of(slot).and_then(|n| n.index) == Some(to)
        })
    }

    /// The three steps at once: moves `slot` and its keys to the primary `to`.
    pub fn move_slot(&mut self, slot: u16, to: usize) -> io::Result<Topology> {
        let migration = self.begin_slot_migration(slot, to)?;
        self.migrate_slot_keys(&migration)?;
        self.finish_slot_migration(migration)
    }
}

/// `redis+cluster://` with the rest of the node's `redis://` URL.
fn cluster_url(node: &LocalMaster) -> String {
    let url = node.url();
    match url.strip_prefix("redis://") {
        Some(rest) => format!("redis+cluster://{rest}"),
        None => url,
    }
}

impl Drop for LocalCluster {
    /// Stops every node in parallel (each by PID, see [`LocalMaster`]'s drop) and removes
    /// their directories.
    fn drop(&mut self) {
        let nodes = std::mem::take(&mut self.nodes);
        thread::scope(|scope| {
            for node in nodes {
                scope.spawn(move || drop(node));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crate::slot::crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12_182);
        assert_eq!(key_slot(b"{foo}bar"), 12_182);
        assert_eq!(
            key_slot(b"{}foo"),
            crate::slot::crc16(b"{}foo") % CLUSTER_SLOTS
        );
        assert_eq!(
            key_slot(b"foo{"),
            crate::slot::crc16(b"foo{") % CLUSTER_SLOTS
        );
        assert_eq!(key_slot(b"a{b}{c}"), key_slot(b"b"));
    }
}
