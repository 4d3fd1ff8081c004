//! A deterministic discrete-event simulation of the real client against simulated masters.
//!
//! The clients are the crate's own sans-IO core (`redlock_mux::core::Core`, built with
//! `Redlock::builder()...build_core`), driven in the order the mio driver drives it
//! (`src/driver/mod.rs`): step, the socket actions, one write per link, reads as bytes
//! arrive, the time with every call. The single-owner front-end runs its loop only while a
//! call runs (it enters with `shift_clocks` and reads what arrived meanwhile, releases the
//! locks its user dropped, and its `Drop` pushes out what is queued); the shared client's
//! loop runs all the time, several callers submit to one core at once, a dropped guard goes
//! out through `release_detached`. Nothing here decides anything about locks: what is
//! checked is the code users run.
//!
//! The masters are `SimRedis` (`server.rs`): a byte-level simulated `redis-server` 7.0
//! that runs the crate's scripts as natives mirrored line by line (`tests/sim_table.rs`
//! compares it with a real server, case by case). Each master has its own clock (`offset +
//! rate * t`, the rate within `skew` of 1) on which its keys expire.
//!
//! The network: one TCP connection per link, FIFO each way, a random delay per write
//! (sometimes slower than a round), reordering across connections; partitions of one
//! client-master pair, of a master from every client or of a client from every master hold
//! the bytes (and the connects) until they end; a link reset drops what is in flight and
//! closes both ends; a master crash closes every connection and refuses connects until it
//! restarts, with or without its keys; a swap puts another server (new `run_id`, long
//! uptime, no keys) behind an address; a script flush; client pauses (GC) that freeze a
//! client's loop while time runs on. A client's close (RST) drops its bytes in flight.
//!
//! Issue 21 (`watch.rs`): clients may watch the locks they hold (RESP3 client-side
//! tracking on their lock links, as `hold` and `auto_extend` do); the network may lose an
//! `invalidate` push or the master write it late (behind replies written meanwhile), the
//! masters evict tracked keys (spurious invalidations) and expire keys actively, and an
//! operator may take a watched lock's keys away (`DEL`, an overwrite, `FLUSHALL`). The
//! world keeps the ground truth (which masters hold each watched token, over time) that
//! (xii) and (xiii) of `check.rs` are checked against.
//!
//! After `horizon` the faults heal (every master up, every partition over), the callers
//! stop (lock calls cancelled, locks released), each client shuts down as its front-end
//! does, the network runs until it is quiet, and the properties of `check.rs` are checked.
#![allow(dead_code)]

pub mod check;
mod client;
pub mod cluster;
pub mod server;
mod watch;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::io::ErrorKind;
use std::time::{Duration, Instant};

use redlock_mux::core::{Action, LinkId, IDLE_SHIFT_MIN};
use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::rules::Fault;
use redlock_mux::scripts;

pub use check::{Call, Grant, Held, Property, Violation};
use client::Client;
use server::{ConnId, SimRedis};

/// Simulated time, in microseconds.
pub type Us = u64;
/// One millisecond of simulated time.
pub const MS: Us = 1000;

pub fn ms(us: Us) -> f64 {
    us as f64 / 1000.0
}

/// One client's settings.
#[derive(Clone, Debug)]
pub struct ClientCfg {
    /// The shared client's front-end (its loop always runs, several callers); else the
    /// single owner (one caller, the loop runs while a call does).
    pub shared: bool,
    pub callers: usize,
    /// `WaitMode::Notify` (else Poll).
    pub notify: bool,
    pub fairness: bool,
    pub fencing: bool,
    pub retry_count: u32,
    pub retry_delay: Us,
    pub retry_jitter: Us,
    /// The round timeout (`node_timeout`); `None`: the builder's default for the TTL.
    pub node_timeout: Option<Us>,
    /// Weights of `try_lock`, `lock`, `lock_with_deadline`, `lock_many`.
    pub calls: [u32; 4],
    /// Masters (bit i of the listed masters) this client never reaches until the faults
    /// heal: a partition that lasts the whole run.
    pub cut_off: u64,
    /// Resources this client's callers use (`None`: any).
    pub resources: Option<Vec<usize>>,
    /// Every lock it is granted is watched by the masters while held (`Core::watch_lock`,
    /// as the single owner's `hold` and the shared client's `auto_extend` do): the single
    /// owner's loop then runs for the whole hold, and a lock reported lost (`take_lost`)
    /// ends its hold at once and is released.
    pub watch: bool,
}

impl ClientCfg {
    pub fn new(retry_delay: Us) -> ClientCfg {
        ClientCfg {
            shared: false,
            callers: 1,
            notify: true,
            fairness: false,
            fencing: false,
            retry_count: 3,
            retry_delay,
            retry_jitter: retry_delay / 2,
            node_timeout: None,
            calls: [1, 3, 2, 1],
            cut_off: 0,
            resources: None,
            watch: false,
        }
    }
}

/// Fault weights.
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultMix {
    /// One client-master pair cut for a while.
    pub partition: u32,
    /// A master cut from every client.
    pub isolate: u32,
    /// A client cut from every master.
    pub isolate_client: u32,
    /// A client's loop frozen (GC).
    pub pause: u32,
    /// A master crashes and restarts (keys kept iff `persistent`).
    pub restart: u32,
    /// Another server behind a master's address (new run id, long uptime, no keys).
    pub swap: u32,
    pub script_flush: u32,
    /// One client-master connection reset.
    pub link_reset: u32,
    /// A master's clock jumps (hazard).
    pub clock_jump: u32,
    /// Issue 21: another client (an operator) takes a watched lock's keys away on some
    /// masters: `DEL`, or an overwrite with its own value.
    pub steal: u32,
    /// Issue 21: a master's tracking table evicts a tracked key: a spurious invalidation.
    pub evict: u32,
    /// Issue 21: `FLUSHALL` on a master (an invalidation with a null).
    pub flush: u32,
    /// Issue 22 (`cluster.rs`): a slot of a cluster master migrates to another node.
    pub migrate: u32,
    /// Issue 22: a cluster node fails over to a replica (see `Config::failover_loss`).
    pub failover: u32,
}

/// A run's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Servers.
    pub masters: usize,
    /// The servers behind the masters the clients list, in order (`None`: each once). One
    /// server listed twice is one server under two names.
    pub listed: Option<Vec<usize>>,
    pub clients: Vec<ClientCfg>,
    pub resources: usize,
    /// Lock TTLs, whole milliseconds.
    pub ttl: (Us, Us),
    pub max_extends: u32,
    /// Extension TTLs as fractions of the lock's TTL.
    pub extend_ttl: (f64, f64),
    pub think: (Us, Us),
    pub work: (Us, Us),
    /// `lock_with_deadline`: the deadline after the call.
    pub deadline: (Us, Us),
    /// A holder drops its lock instead of releasing it.
    pub drop_prob: f64,
    /// A holder vanishes (never releases: its keys live their TTL).
    pub vanish_prob: f64,
    /// A shared client's caller gives up on a waiting call (drops its future) after this.
    pub give_up: Option<(Us, Us)>,
    pub latency: (Us, Us),
    pub slow_prob: f64,
    pub slow_max: Us,
    /// Master clock rates within `1 +- skew`.
    pub skew: f64,
    /// Masters that run fast by this rate (hazard): the first `fast_masters`.
    pub fast_masters: usize,
    pub fast_rate: f64,
    /// A restart keeps the keys (`appendonly yes` + `appendfsync always`).
    pub persistent: bool,
    /// `CONFIG GET` says durable (what fencing needs).
    pub durable: bool,
    pub amnesia_guard: Option<Us>,
    pub connect_timeout: Us,
    pub stall_timeout: Us,
    pub faults: usize,
    pub mix: FaultMix,
    pub partition_len: (Us, Us),
    pub pause_len: (Us, Us),
    pub downtime: (Us, Us),
    pub clock_jump: (i64, i64),
    /// Holders stop at their lock's validity (else they work on: hazard).
    pub honest: bool,
    pub horizon: Us,
    /// A bound on the simulation's steps (a run that reaches it says so).
    pub max_steps: u64,
    /// Check (viii) with this bound.
    pub progress_bound: Option<Us>,
    /// Check (x) with this bound.
    pub wakeup_bound: Option<Us>,
    /// Check (vii).
    pub check_attempts: bool,
    /// Check (ix).
    pub check_place: bool,
    /// Check (xi).
    pub check_orphans: bool,
    /// Check that every `try_lock` is granted (a family with one caller and no fault: the
    /// resource is always free when it asks).
    pub check_uncontended: bool,
    /// Issue 21: the share of invalidation pushes (on lock links) the network loses, and
    /// of those it delivers late (the master writes them up to `late_max` later, behind
    /// replies written meanwhile).
    pub push_lost: f64,
    pub push_late: f64,
    pub late_max: Us,
    /// The masters' active expiry runs this often (Redis: `hz 10`); 0: keys expire lazily
    /// only.
    pub cron_every: Us,
    /// Check (xii) no spurious loss and (xiii) a loss reported within this bound.
    pub watch_bound: Option<Us>,
    /// Issue 22 (`cluster.rs`): server i (i < `masters`) is a cluster of this many nodes
    /// (0 or absent: a standalone master).
    pub cluster_shards: Vec<usize>,
    /// How long a slot migration takes (its ASK phase).
    pub migrate_len: (Us, Us),
    /// The share of a node's keys its replica lacks when it takes over (amnesia).
    pub failover_loss: f64,
    /// Server i answers as Valkey 9 (`DELIFEQ`, `valkey_version` in `INFO`: see
    /// `server::Config::valkey`) when bit i is set. A server swapped in behind an address
    /// (`FaultMix::swap`) is of the other kind.
    pub valkey: u64,
}

impl Config {
    pub fn listed(&self) -> Vec<usize> {
        self.listed
            .clone()
            .unwrap_or_else(|| (0..self.masters).collect())
    }
}

/// What happens, ordered by time then by scheduling order.
#[derive(Debug)]
enum Ev {
    /// Bytes the client wrote reach the server.
    ToServer {
        conn: usize,
        bytes: Vec<u8>,
        seq: u64,
    },
    /// A cluster's own event (a migration's steps).
    Cluster(cluster::ClusterEv),
    /// The client's connect reaches the server (SYN).
    Syn { conn: usize, seq: u64 },
    /// The client's close reaches the server.
    Fin { conn: usize, seq: u64 },
    /// Something reaches the client on a connection.
    ToClient { conn: usize, item: Item, seq: u64 },
    /// A fault starts.
    Fault(FaultEv),
    /// A master comes back after a crash.
    Up { server: usize },
    /// A client's pause ends.
    Resume { client: usize },
    /// Look at the world for the progress property.
    Monitor,
    /// A push the master writes late on a connection.
    LatePush { conn: usize, bytes: Vec<u8> },
    /// A master's active expiry.
    Cron { server: usize },
    /// (xiii): watch `rec` has owed a report since `since`.
    WatchDue { rec: usize, since: Us },
}

#[derive(Debug, Clone)]
pub enum Item {
    Bytes(Vec<u8>),
    Connected,
    Refused,
    Closed(ErrorKind),
}

#[derive(Debug, Clone, Copy)]
enum FaultEv {
    Partition {
        client: usize,
        server: usize,
        len: Us,
    },
    Isolate {
        server: usize,
        len: Us,
    },
    IsolateClient {
        client: usize,
        len: Us,
    },
    Pause {
        client: usize,
        len: Us,
    },
    Restart {
        server: usize,
        down: Us,
    },
    Swap {
        server: usize,
    },
    ScriptFlush {
        server: usize,
    },
    LinkReset {
        client: usize,
        server: usize,
    },
    ClockJump {
        server: usize,
        ms: i64,
    },
    Steal {
        overwrite: bool,
    },
    Evict {
        server: usize,
    },
    Flush {
        server: usize,
    },
    Migrate,
    Failover {
        server: usize,
    },
}

/// A cut: the bytes between `client` (or every client) and `server` (or every server) wait
/// until `to`.
#[derive(Debug, Clone, Copy)]
struct Cut {
    client: Option<usize>,
    server: Option<usize>,
    from: Us,
    to: Us,
}

struct Master {
    server: SimRedis,
    rate: f64,
    offset_ms: f64,
    down_until: Option<Us>,
}

impl Master {
    fn clock_ms(&self, t: Us) -> u64 {
        (self.offset_ms + t as f64 * self.rate / 1000.0).max(0.0) as u64
    }
}

/// One connection of a client's link.
struct Conn {
    client: usize,
    link: usize,
    server: usize,
    /// The server's side, once the connect arrived.
    sconn: Option<ConnId>,
    /// The client has not closed it.
    client_open: bool,
    /// The server has not closed it.
    server_open: bool,
    /// FIFO: the last delivery scheduled each way, the next sequence number to give out
    /// and the next to deliver (a message held by a cut holds the ones behind it).
    c2s_at: Us,
    s2c_at: Us,
    c2s_seq: u64,
    c2s_next: u64,
    s2c_seq: u64,
    s2c_next: u64,
    /// A reset: what the server sent before it (below this number) is lost.
    s2c_lost_below: u64,
    /// What the client wrote, and how much of it was parsed.
    wire: Vec<u8>,
    wire_at: usize,
    /// What reached the client, and how much of it was parsed (sub links).
    heard: Vec<u8>,
    heard_at: usize,
}

/// What a run found.
pub struct RunResult {
    pub violations: Vec<Violation>,
    pub stats: Stats,
    pub trace: Vec<String>,
}

/// Counts of a run (to tell that the families exercise what they claim).
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub grants: u64,
    pub calls: u64,
    pub failed_calls: u64,
    pub releases: u64,
    pub extends: u64,
    pub failed_extends: u64,
    pub attempts: u64,
    pub faults: u64,
    pub announcements: u64,
    pub steps: u64,
    pub keys_left_ttl: u64,
    pub fenced: u64,
    pub max_attempts: u32,
    /// Issue 21: locks watched, reported lost, invalidation pushes (lost, late), evictions
    /// that hit a tracked key, operator steals and flushes, losses owed a report (and
    /// reported in time, or excused by a fault of the push path).
    pub watched: u64,
    pub lost_reports: u64,
    pub pushes: u64,
    pub pushes_lost: u64,
    pub pushes_late: u64,
    pub evictions: u64,
    pub steals: u64,
    pub owed: u64,
    pub owed_met: u64,
    pub owed_excused: u64,
    /// Issue 22: slot migrations, keys moved, failovers; redirections the nodes answered
    /// (MOVED, ASK, TRYAGAIN, CROSSSLOT) and script calls they refused.
    pub migrations: u64,
    pub keys_migrated: u64,
    pub failovers: u64,
    pub moved: u64,
    pub asked: u64,
    pub tryagain: u64,
    pub crossslot: u64,
    pub script_refused: u64,
    /// Issue 23: `DELIFEQ`s the (Valkey) servers ran, and those that answered 0 (the
    /// client then sends the release's script: a marked key, or one not held).
    pub delifeq: u64,
    pub delifeq_zero: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.grants += o.grants;
        self.calls += o.calls;
        self.failed_calls += o.failed_calls;
        self.releases += o.releases;
        self.extends += o.extends;
        self.failed_extends += o.failed_extends;
        self.attempts += o.attempts;
        self.faults += o.faults;
        self.announcements += o.announcements;
        self.steps += o.steps;
        self.keys_left_ttl += o.keys_left_ttl;
        self.fenced += o.fenced;
        self.max_attempts = self.max_attempts.max(o.max_attempts);
        self.watched += o.watched;
        self.lost_reports += o.lost_reports;
        self.pushes += o.pushes;
        self.pushes_lost += o.pushes_lost;
        self.pushes_late += o.pushes_late;
        self.evictions += o.evictions;
        self.steals += o.steals;
        self.owed += o.owed;
        self.owed_met += o.owed_met;
        self.owed_excused += o.owed_excused;
        self.migrations += o.migrations;
        self.keys_migrated += o.keys_migrated;
        self.failovers += o.failovers;
        self.moved += o.moved;
        self.asked += o.asked;
        self.tryagain += o.tryagain;
        self.crossslot += o.crossslot;
        self.script_refused += o.script_refused;
        self.delifeq += o.delifeq;
        self.delifeq_zero += o.delifeq_zero;
    }
}

/// What the clients wrote that the checks need: an acquire attempt.
#[derive(Clone, Debug)]
struct Attempt {
    client: usize,
    keys: Vec<Vec<u8>>,
    token: Vec<u8>,
    at: Us,
    /// Waiter id in the line (`ACQUIRE_WAIT` with a line).
    waiter: Option<Vec<u8>>,
}

/// A release announced to a client, a subscription confirmed.
#[derive(Clone, Debug)]
struct Heard {
    client: usize,
    at: Us,
    /// The channel's key (resource name) or `None` for the client's own channel.
    key: Option<Vec<u8>>,
    /// Fingerprint of the token released; `None`: a subscription confirmation.
    fp: Option<Vec<u8>>,
    /// When it arrived, few enough masters held the key for another client that a
    /// release could leave room for a quorum.
    could_free: bool,
}

/// A release a client wrote (its first copy).
#[derive(Clone, Debug)]
struct Release {
    client: usize,
    at: Us,
    keys: Vec<Vec<u8>>,
    /// As for [`Heard::could_free`], for the client's own other waiters.
    could_free: bool,
}

pub struct World {
    pub cfg: Config,
    rng: fastrand::Rng,
    pub t: Us,
    base: Instant,
    masters: Vec<Master>,
    listed: Vec<usize>,
    conns: Vec<Conn>,
    clients: Vec<Client>,
    events: BinaryHeap<Reverse<(Us, u64)>>,
    pending: BTreeMap<u64, Ev>,
    seq: u64,
    cuts: Vec<Cut>,
    healed: bool,
    stopping: bool,
    pub violations: Vec<Violation>,
    pub stats: Stats,
    trace: Option<Vec<String>>,
    // What the checks read.
    held: Vec<Held>,
    grants: Vec<Grant>,
    calls: Vec<Call>,
    attempts: Vec<Attempt>,
    heard: Vec<Heard>,
    /// Tokens of granted locks (first 16 bytes) -> resources.
    granted: BTreeMap<Vec<u8>, Vec<usize>>,
    /// Tokens of locks whose holder vanished.
    vanished: Vec<Vec<u8>>,
    /// Token -> client, of every acquire written; and by fingerprint (first 16 bytes).
    token_client: BTreeMap<Vec<u8>, usize>,
    fp_client: BTreeMap<Vec<u8>, usize>,
    /// Releases written (first copies), and their tokens.
    written_releases: Vec<Release>,
    release_tokens: std::collections::BTreeSet<Vec<u8>>,
    /// Releases of granted locks: (resource, client that released, when, token's first
    /// 16 bytes).
    releases: Vec<(usize, usize, Us, Vec<u8>)>,
    /// (client, server): the client's lock link had an answer from the server.
    seen: std::collections::BTreeSet<(usize, usize)>,
    /// (viii): since when each resource is free with a capable waiter.
    stuck_since: Vec<Option<Us>>,
    /// (x): a release of the resource awaits a waiter's attempt by this time.
    wake_due: Vec<Option<(Us, Us)>>,
    /// Issue 21: the watched locks, what the masters held of them, and the client pauses
    /// (for (xiii)).
    watches: Vec<check::WatchRec>,
    pauses: Vec<(usize, Us, Us)>,
    /// Masters down (a restart): from, to.
    downs: Vec<(Us, Us)>,
    /// Tokens whose keys an operator took from a quorum: the hold counts as ended then
    /// ((i) is about the client's rules, not an operator's `DEL`).
    stolen: BTreeMap<Vec<u8>, Us>,
    /// Issue 22: the cluster masters.
    cl: cluster::Clusters,
}

/// What the clients write: arrays of bulk strings (the scripts are a few KiB).
const WIRE_LIMITS: Limits = Limits {
    max_bulk_len: 1024 * 1024,
    max_elements: 1024,
    max_depth: 1,
    max_line_len: 4096,
};

const READ_LIMITS: Limits = Limits {
    max_bulk_len: 1024 * 1024,
    max_elements: 1024,
    max_depth: 4,
    max_line_len: 64 * 1024,
};

/// Run `cfg` from `seed`.
pub fn run(cfg: &Config, seed: u64, trace: bool) -> RunResult {
    let mut w = World::new(cfg.clone(), seed, trace);
    w.run();
    // (A server swapped in starts its counts afresh.)
    for m in &w.masters {
        let [zero, one] = m.server.delifeq_answers();
        w.stats.delifeq += zero + one;
        w.stats.delifeq_zero += zero;
    }
    RunResult {
        violations: std::mem::take(&mut w.violations),
        stats: w.stats.clone(),
        trace: w.trace.take().unwrap_or_default(),
    }
}

impl World {
    fn new(cfg: Config, seed: u64, trace: bool) -> World {
        let mut rng = fastrand::Rng::with_seed(seed);
        let base = Instant::now();
        let masters: Vec<Master> = (0..cfg.masters)
            .map(|i| {
                let rate = if i < cfg.fast_masters {
                    cfg.fast_rate
                } else {
                    1.0 + (rng.f64() * 2.0 - 1.0) * cfg.skew
                };
                let offset_ms = 1_000_000.0 + rng.f64() * 1_000_000.0;
                let scfg = server::Config {
                    seed: rng.u64(..),
                    appendonly: cfg.durable,
                    appendfsync: if cfg.durable { "always" } else { "everysec" }.into(),
                    tcp_port: 7000 + i as u16,
                    process_id: 1000 + i as u32 * 100,
                    valkey: i < 64 && cfg.valkey & (1 << i) != 0,
                    ..server::Config::default()
                };
                // Started long ago: the amnesia guard trusts its uptime.
                let server = SimRedis::new(scfg, 0);
                Master {
                    server,
                    rate,
                    offset_ms,
                    down_until: None,
                }
            })
            .collect();
        let listed = cfg.listed();
        let mut w = World {
            rng,
            t: 0,
            base,
            masters,
            listed,
            conns: Vec::new(),
            clients: Vec::new(),
            events: BinaryHeap::new(),
            pending: BTreeMap::new(),
            seq: 0,
            cuts: Vec::new(),
            healed: false,
            stopping: false,
            violations: Vec::new(),
            stats: Stats::default(),
            trace: trace.then(Vec::new),
            held: Vec::new(),
            grants: Vec::new(),
            calls: Vec::new(),
            attempts: Vec::new(),
            heard: Vec::new(),
            granted: BTreeMap::new(),
            vanished: Vec::new(),
            token_client: BTreeMap::new(),
            fp_client: BTreeMap::new(),
            written_releases: Vec::new(),
            release_tokens: Default::default(),
            releases: Vec::new(),
            seen: Default::default(),
            stuck_since: vec![None; cfg.resources],
            wake_due: vec![None; cfg.resources],
            watches: Vec::new(),
            pauses: Vec::new(),
            downs: Vec::new(),
            stolen: BTreeMap::new(),
            cl: Default::default(),
            cfg,
        };
        w.build_clusters();
        for c in 0..w.cfg.clients.len() {
            let client = Client::new(&w, c);
            w.clients.push(client);
        }
        w.plan_faults();
        if w.cfg.progress_bound.is_some() {
            let at = w.monitor_every();
            w.schedule(at, Ev::Monitor);
        }
        if w.cfg.cron_every > 0 {
            for server in 0..w.masters.len() {
                let at = w.rng.u64(1..=w.cfg.cron_every);
                w.schedule(at, Ev::Cron { server });
            }
        }
        w
    }

    pub(crate) fn instant(&self, t: Us) -> Instant {
        self.base + Duration::from_micros(t)
    }

    pub(crate) fn us(&self, i: Instant) -> Us {
        i.saturating_duration_since(self.base).as_micros() as Us
    }

    pub(crate) fn log(&mut self, f: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            let line = format!("{:>12.3} {}", ms(self.t), f());
            t.push(line);
        }
    }

    fn schedule(&mut self, at: Us, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, ev);
    }

    fn delay(&mut self) -> Us {
        let (lo, hi) = self.cfg.latency;
        if self.cfg.slow_prob > 0.0 && self.rng.f64() < self.cfg.slow_prob {
            return self.rng.u64(hi..=hi.max(self.cfg.slow_max));
        }
        self.rng.u64(lo..=hi)
    }

    /// When the bytes between `client` and `server` may pass at `t`: `None` now, else
    /// when the cut ends.
    fn cut_until(&self, client: usize, server: usize, t: Us) -> Option<Us> {
        let mut until: Option<Us> = None;
        if !self.healed {
            let listed = &self.listed;
            let cut_off = self.cfg.clients[client].cut_off;
            if (0..listed.len()).any(|i| listed[i] == server && cut_off >> i & 1 != 0) {
                until = Some(self.cfg.horizon.max(t + 1));
            }
        }
        for c in &self.cuts {
            if c.from <= t
                && t < c.to
                && c.client.is_none_or(|x| x == client)
                && c.server.is_none_or(|x| x == server)
            {
                until = Some(until.map_or(c.to, |u| u.max(c.to)));
            }
        }
        until
    }

    fn monitor_every(&self) -> Us {
        (self.cfg.ttl.0 / 10).max(MS / 2)
    }

    // ----- the run ---------------------------------------------------------------------

    fn run(&mut self) {
        for c in 0..self.clients.len() {
            self.start_callers(c);
        }
        let mut steps = 0u64;
        let end_drain = loop {
            steps += 1;
            if steps > self.cfg.max_steps {
                let t = self.t;
                self.violation(Property::Stuck, t, "the simulation ran out of steps".into());
                break false;
            }
            if !self.healed && self.t >= self.cfg.horizon {
                self.heal();
            }
            if self.stopping && self.all_stopped() {
                break true;
            }
            let Some(next) = self.next_time() else {
                break true;
            };
            if self.stopping && next > self.cfg.horizon + self.drain_bound() {
                let t = self.t;
                let what = self.undone();
                self.violation(
                    Property::Stuck,
                    t,
                    format!(
                        "not done {} ms after the faults healed: {what}",
                        ms(self.drain_bound())
                    ),
                );
                break false;
            }
            if !self.healed && next >= self.cfg.horizon {
                self.t = self.cfg.horizon;
                continue;
            }
            self.t = next.max(self.t);
            self.step_once();
            if self
                .violations
                .iter()
                .any(|v| v.property == Property::Stuck)
            {
                break false;
            }
            // A search stops at the first violation (a trace runs to the end).
            if self.trace.is_none() && !self.violations.is_empty() {
                break false;
            }
        };
        self.stats.steps = steps;
        if end_drain {
            self.quiet_network();
            self.final_checks();
        }
        self.cluster_stats();
    }

    fn drain_bound(&self) -> Us {
        // Every lock call is cancelled at the heal, releases are one round, a shared
        // client drains for up to 2 s; a reconnect backs off up to 1 s.
        let ttl = self.cfg.ttl.1;
        4 * ttl + 10_000 * MS
    }

    /// The earliest thing to do.
    fn next_time(&self) -> Option<Us> {
        let mut next = self.events.peek().map(|Reverse((t, _))| *t);
        let mut min = |x: Option<Us>| {
            if let Some(x) = x {
                next = Some(next.map_or(x, |n| n.min(x)));
            }
        };
        for c in &self.clients {
            min(c.next_wake(self));
        }
        next
    }

    fn step_once(&mut self) {
        let t = self.t;
        if let Some(Reverse((at, seq))) = self.events.peek().copied() {
            if at <= t {
                self.events.pop();
                let ev = self.pending.remove(&seq).expect("an event");
                self.handle(ev);
                return;
            }
        }
        for c in 0..self.clients.len() {
            if self.clients[c].next_wake(self).is_some_and(|w| w <= t) {
                self.wake_client(c);
                return;
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ToServer { conn, seq, .. } | Ev::Syn { conn, seq }
                if seq < self.conns[conn].c2s_next =>
            {
                // Lost to the client's reset.
            }
            Ev::ToServer { conn, bytes, seq } => {
                if self.held_back(conn, true, seq) {
                    let at = self.t.max(self.conns[conn].c2s_at) + 1;
                    self.schedule(at, Ev::ToServer { conn, bytes, seq });
                } else if self.deliver_to_server(conn, bytes, seq) {
                    self.conns[conn].c2s_next = self.conns[conn].c2s_next.max(seq + 1);
                }
            }
            Ev::Syn { conn, seq } => {
                if self.held_back(conn, true, seq) {
                    let at = self.t.max(self.conns[conn].c2s_at) + 1;
                    self.schedule(at, Ev::Syn { conn, seq });
                } else if self.syn(conn, seq) {
                    self.conns[conn].c2s_next = self.conns[conn].c2s_next.max(seq + 1);
                }
            }
            Ev::Fin { conn, seq } => {
                if self.held_back(conn, true, seq) {
                    let at = self.t.max(self.conns[conn].c2s_at) + 1;
                    self.schedule(at, Ev::Fin { conn, seq });
                    return;
                }
                self.conns[conn].c2s_next = self.conns[conn].c2s_next.max(seq + 1);
                let c = &mut self.conns[conn];
                c.server_open = false;
                if let Some(s) = c.sconn.take() {
                    self.masters[c.server].server.close(s);
                }
            }
            Ev::ToClient { conn, item, seq } => {
                if self.held_back(conn, false, seq) {
                    let at = self.t.max(self.conns[conn].s2c_at) + 1;
                    self.schedule(at, Ev::ToClient { conn, item, seq });
                } else if self.deliver_to_client(conn, item, seq) {
                    self.conns[conn].s2c_next = self.conns[conn].s2c_next.max(seq + 1);
                }
            }
            Ev::Fault(f) => self.fault(f),
            Ev::Up { server } => self.master_up(server),
            Ev::Resume { client } => {
                if self.clients[client]
                    .paused_until
                    .is_some_and(|u| u <= self.t)
                {
                    self.clients[client].paused_until = None;
                    self.log(|| format!("client {client} resumes"));
                    self.client_reads(client);
                }
            }
            Ev::Monitor => {
                self.monitor();
                if !self.stopping {
                    let at = self.t + self.monitor_every();
                    self.schedule(at, Ev::Monitor);
                }
            }
            Ev::LatePush { conn, bytes } => {
                let c = &self.conns[conn];
                if c.server_open && c.client_open {
                    self.reply(conn, Item::Bytes(bytes));
                }
            }
            Ev::Cron { server } => {
                if self.masters[server].down_until.is_none() {
                    let now_ms = self.masters[server].clock_ms(self.t);
                    self.masters[server].server.active_expire(now_ms);
                    self.flush_server(server);
                    self.update_truth(false);
                }
                if !self.stopping {
                    let at = self.t + self.cfg.cron_every;
                    self.schedule(at, Ev::Cron { server });
                }
            }
            Ev::WatchDue { rec, since } => self.watch_due(rec, since),
            Ev::Cluster(e) => self.cluster_event(e),
        }
    }

    // ----- the network -----------------------------------------------------------------

    /// Client `c` opens link `l`'s connection.
    pub(crate) fn open_conn(&mut self, c: usize, l: usize) -> usize {
        let server = self.link_server(c, l);
        if self.clustered() {
            let m = self.clients[c].core.link_master(LinkId(l));
            self.log(|| format!("  client {c} link {l} (master {m}) connects to server {server}"));
        }
        let id = self.conns.len();
        self.conns.push(Conn {
            client: c,
            link: l,
            server,
            sconn: None,
            client_open: true,
            server_open: false,
            c2s_at: self.t,
            s2c_at: self.t,
            c2s_seq: 0,
            c2s_next: 0,
            s2c_seq: 0,
            s2c_next: 0,
            s2c_lost_below: 0,
            wire: Vec::new(),
            wire_at: 0,
            heard: Vec::new(),
            heard_at: 0,
        });
        let at = self.t + self.delay();
        self.conns[id].c2s_at = at;
        let seq = self.up_seq(id);
        self.schedule(at, Ev::Syn { conn: id, seq });
        id
    }

    /// The next sequence number of a message from the client on `conn`.
    fn up_seq(&mut self, conn: usize) -> u64 {
        let c = &mut self.conns[conn];
        c.c2s_seq += 1;
        c.c2s_seq - 1
    }

    /// A message of `conn` (`up`: to the server) that must wait for one sent before it.
    fn held_back(&self, conn: usize, up: bool, seq: u64) -> bool {
        let c = &self.conns[conn];
        if up {
            seq > c.c2s_next
        } else {
            seq > c.s2c_next.max(c.s2c_lost_below)
        }
    }

    /// Client `c` closes connection `conn` (RST: what is in flight is lost).
    pub(crate) fn close_conn(&mut self, conn: usize, graceful: bool) {
        let c = &mut self.conns[conn];
        if !c.client_open {
            return;
        }
        c.client_open = false;
        if graceful {
            let at = c.c2s_at.max(self.t);
            let seq = self.up_seq(conn);
            self.schedule(at, Ev::Fin { conn, seq });
        } else {
            // What was in flight is dropped: the server sees the reset next.
            let at = self.t + self.delay();
            let c = &mut self.conns[conn];
            c.c2s_at = at;
            c.c2s_next = c.c2s_seq;
            let seq = self.up_seq(conn);
            self.schedule(at, Ev::Fin { conn, seq });
        }
    }

    /// Client bytes on `conn` (scheduled in order; parsed for the checks).
    pub(crate) fn send(&mut self, conn: usize, bytes: &[u8]) {
        let d = self.delay();
        let c = &mut self.conns[conn];
        c.wire.extend_from_slice(bytes);
        let at = (self.t + d).max(c.c2s_at);
        c.c2s_at = at;
        let seq = self.up_seq(conn);
        self.schedule(
            at,
            Ev::ToServer {
                conn,
                bytes: bytes.to_vec(),
                seq,
            },
        );
        self.parse_wire(conn);
    }

    /// The connect reaches the server; `false` when a cut holds it.
    fn syn(&mut self, conn: usize, seq: u64) -> bool {
        let (client, server) = (self.conns[conn].client, self.conns[conn].server);
        if !self.conns[conn].client_open {
            return true;
        }
        if let Some(until) = self.cut_until(client, server, self.t) {
            let at = (until + self.delay()).max(self.conns[conn].c2s_at);
            self.conns[conn].c2s_at = at;
            self.schedule(at, Ev::Syn { conn, seq });
            return false;
        }
        if self.masters[server].down_until.is_some() {
            self.reply(conn, Item::Refused);
            return true;
        }
        let s = self.masters[server].server.open();
        let c = &mut self.conns[conn];
        c.sconn = Some(s);
        c.server_open = true;
        self.reply(conn, Item::Connected);
        true
    }

    /// Client bytes reach the server; `false` when a cut holds them.
    fn deliver_to_server(&mut self, conn: usize, bytes: Vec<u8>, seq: u64) -> bool {
        let (client, server) = (self.conns[conn].client, self.conns[conn].server);
        if let Some(until) = self.cut_until(client, server, self.t) {
            let at = (until + self.delay()).max(self.conns[conn].c2s_at);
            self.conns[conn].c2s_at = at;
            self.schedule(at, Ev::ToServer { conn, bytes, seq });
            return false;
        }
        let Some(s) = self.conns[conn].sconn else {
            return true;
        };
        if !self.conns[conn].server_open {
            return true;
        }
        let now_ms = self.masters[server].clock_ms(self.t);
        let open = self.masters[server].server.feed(s, &bytes, now_ms);
        self.flush_server(server);
        self.update_truth(false);
        if !open {
            let c = &mut self.conns[conn];
            c.server_open = false;
            c.sconn = None;
            self.reply(conn, Item::Closed(ErrorKind::UnexpectedEof));
        }
        true
    }

    /// Send what server `server` wrote to its connections.
    fn flush_server(&mut self, server: usize) {
        self.cluster_bus(server);
        let with = self.masters[server].server.with_output();
        for s in with {
            let out = self.masters[server].server.take_output(s);
            if out.is_empty() {
                continue;
            }
            let Some(conn) = self
                .conns
                .iter()
                .rposition(|c| c.server == server && c.sconn == Some(s))
            else {
                continue;
            };
            let out = self.push_faults(conn, out);
            if out.is_empty() {
                continue;
            }
            self.reply(conn, Item::Bytes(out));
        }
    }

    /// Something for the client on `conn`, in order after what the server sent before.
    fn reply(&mut self, conn: usize, item: Item) {
        let d = self.delay();
        let c = &mut self.conns[conn];
        let at = (self.t + d).max(c.s2c_at);
        c.s2c_at = at;
        let seq = c.s2c_seq;
        c.s2c_seq += 1;
        self.schedule(at, Ev::ToClient { conn, item, seq });
    }

    /// Something reaches the client; `false` when a cut holds it.
    fn deliver_to_client(&mut self, conn: usize, item: Item, seq: u64) -> bool {
        let (client, server) = (self.conns[conn].client, self.conns[conn].server);
        if !self.conns[conn].client_open || seq < self.conns[conn].s2c_lost_below {
            return true;
        }
        if let Some(until) = self.cut_until(client, server, self.t) {
            let at = (until + self.delay()).max(self.conns[conn].s2c_at);
            self.conns[conn].s2c_at = at;
            self.schedule(at, Ev::ToClient { conn, item, seq });
            return false;
        }
        if self.trace.is_some() {
            let link = self.conns[conn].link;
            let shown = match &item {
                Item::Bytes(b) => {
                    String::from_utf8_lossy(&b[..b.len().min(120)]).replace("\r\n", " ")
                }
                other => format!("{other:?}"),
            };
            self.log(|| format!("  client {client} <- link {link}: {shown}"));
        }
        if matches!(item, Item::Bytes(_)) && self.conns[conn].link < self.listed.len() {
            self.seen.insert((client, server));
        }
        if let Item::Bytes(b) = &item {
            // A cluster node's run id, heard on a shard link (the merged INFO).
            if self.conns[conn].link >= 2 * self.listed.len()
                && b.windows(7).any(|w| w == b"run_id:")
            {
                self.seen.insert((client, server));
            }
        }
        if let Item::Bytes(b) = &item {
            if self.is_sub_link(conn) {
                self.conns[conn].heard.extend_from_slice(b);
                self.parse_heard(conn);
            }
        }
        self.clients[client].inbox.push_back((conn, item));
        self.client_reads(client);
        true
    }

    /// Reset one connection: both ends learn it.
    fn reset_conn(&mut self, conn: usize) {
        let (client, server, t) = (self.conns[conn].client, self.conns[conn].server, self.t);
        self.cl.resets.push((client, server, t));
        let c = &mut self.conns[conn];
        if let Some(s) = c.sconn.take() {
            self.masters[c.server].server.close(s);
        }
        let c = &mut self.conns[conn];
        c.server_open = false;
        if c.client_open {
            // Nothing more comes but the reset: what was in flight is lost.
            let at = self.t + 1;
            c.s2c_at = at;
            c.s2c_lost_below = c.s2c_seq;
            let seq = c.s2c_seq;
            c.s2c_seq += 1;
            self.schedule(
                at,
                Ev::ToClient {
                    conn,
                    item: Item::Closed(ErrorKind::ConnectionReset),
                    seq,
                },
            );
        }
    }

    /// Deliver everything in flight (after the run), bounded.
    fn quiet_network(&mut self) {
        for _ in 0..1_000_000 {
            let Some(Reverse((at, seq))) = self.events.pop() else {
                return;
            };
            let ev = self.pending.remove(&seq).expect("an event");
            if matches!(
                ev,
                Ev::Monitor | Ev::Fault(_) | Ev::Cron { .. } | Ev::WatchDue { .. } | Ev::Cluster(_)
            ) {
                continue;
            }
            self.t = self.t.max(at);
            self.handle(ev);
        }
    }

    // ----- faults ------------------------------------------------------------------------

    fn plan_faults(&mut self) {
        let m = self.cfg.mix;
        let weights = [
            m.partition,
            m.isolate,
            m.isolate_client,
            m.pause,
            m.restart,
            m.swap,
            m.script_flush,
            m.link_reset,
            m.clock_jump,
            m.steal,
            m.evict,
            m.flush,
            m.migrate,
            m.failover,
        ];
        let total: u32 = weights.iter().sum();
        if total == 0 {
            return;
        }
        // Every server: a cluster's nodes too.
        let (ns, nc) = (self.masters.len(), self.cfg.clients.len());
        for _ in 0..self.cfg.faults {
            let at = self.rng.u64(..self.cfg.horizon.max(1));
            let mut pick = self.rng.u32(..total);
            let mut kind = 0;
            while pick >= weights[kind] {
                pick -= weights[kind];
                kind += 1;
            }
            let server = self.rng.usize(..ns);
            let client = self.rng.usize(..nc);
            let rng = &mut self.rng;
            let span = |rng: &mut fastrand::Rng, (a, b): (Us, Us)| rng.u64(a..=b.max(a));
            let f = match kind {
                0 => FaultEv::Partition {
                    client,
                    server,
                    len: span(rng, self.cfg.partition_len),
                },
                1 => FaultEv::Isolate {
                    server,
                    len: span(rng, self.cfg.partition_len),
                },
                2 => FaultEv::IsolateClient {
                    client,
                    len: span(rng, self.cfg.partition_len),
                },
                3 => FaultEv::Pause {
                    client,
                    len: span(rng, self.cfg.pause_len),
                },
                4 => FaultEv::Restart {
                    server,
                    down: span(rng, self.cfg.downtime),
                },
                5 => FaultEv::Swap { server },
                6 => FaultEv::ScriptFlush { server },
                7 => FaultEv::LinkReset { client, server },
                9 => FaultEv::Steal {
                    overwrite: rng.bool(),
                },
                10 => FaultEv::Evict { server },
                11 => FaultEv::Flush { server },
                12 => FaultEv::Migrate,
                13 => FaultEv::Failover { server },
                _ => {
                    let (a, b) = self.cfg.clock_jump;
                    FaultEv::ClockJump {
                        server,
                        ms: rng.i64(a..=b.max(a)),
                    }
                }
            };
            self.schedule(at, Ev::Fault(f));
        }
    }

    fn fault(&mut self, f: FaultEv) {
        if self.healed {
            return;
        }
        self.fault_inner(f);
        // A crash, a swap: what the masters hold of the watched locks changed.
        self.update_truth(false);
    }

    fn fault_inner(&mut self, f: FaultEv) {
        self.stats.faults += 1;
        let t = self.t;
        self.log(|| format!("FAULT {f:?}"));
        match f {
            FaultEv::Partition {
                client,
                server,
                len,
            } => self.cuts.push(Cut {
                client: Some(client),
                server: Some(server),
                from: t,
                to: t + len,
            }),
            FaultEv::Isolate { server, len } => self.cuts.push(Cut {
                client: None,
                server: Some(server),
                from: t,
                to: t + len,
            }),
            FaultEv::IsolateClient { client, len } => self.cuts.push(Cut {
                client: Some(client),
                server: None,
                from: t,
                to: t + len,
            }),
            FaultEv::Pause { client, len } => {
                let until = t + len;
                let c = &mut self.clients[client];
                c.paused_until = Some(c.paused_until.map_or(until, |u| u.max(until)));
                let at = c.paused_until.unwrap();
                self.pauses.push((client, t, at));
                self.schedule(at, Ev::Resume { client });
            }
            FaultEv::Restart { server, down } => {
                if self.masters[server].down_until.is_some() {
                    return;
                }
                self.crash(server);
                self.masters[server].down_until = Some(t + down);
                self.downs.push((t, t + down));
                self.schedule(t + down, Ev::Up { server });
            }
            FaultEv::Swap { server } => {
                // The amnesia guard knows a swapped-in server by its new run id only where
                // a client saw the one before: a client whose first answer from the address
                // is the new server's cannot tell it from a master that has run for long
                // (the documented assumption). So a swap comes once every client has
                // heard from the server it replaces.
                let seen = (0..self.clients.len()).all(|c| self.seen.contains(&(c, server)));
                if self.masters[server].down_until.is_some() || !seen {
                    return;
                }
                self.crash(server);
                let old = self.masters[server].server.config().clone();
                let scfg = server::Config {
                    seed: self.rng.u64(..),
                    process_id: old.process_id + 7,
                    // Redis where Valkey was, and the other way round.
                    valkey: !old.valkey,
                    ..old
                };
                // A server that has run for long elsewhere and never saw a lock key.
                let now_ms = self.masters[server].clock_ms(t);
                let role = self.masters[server].server.cluster.take();
                self.masters[server].server =
                    SimRedis::new(scfg, now_ms.saturating_sub(36_000_000));
                self.masters[server].server.cluster = role;
            }
            FaultEv::ScriptFlush { server } => self.masters[server].server.script_flush(),
            FaultEv::LinkReset { client, server } => {
                let conns: Vec<usize> = (0..self.conns.len())
                    .filter(|&i| {
                        let c = &self.conns[i];
                        c.client == client && c.server == server && c.client_open
                    })
                    .collect();
                if let Some(&conn) = conns.first() {
                    self.reset_conn(conn);
                }
            }
            FaultEv::ClockJump { server, ms } => {
                self.masters[server].offset_ms += ms as f64;
            }
            FaultEv::Steal { overwrite } => self.steal(overwrite),
            FaultEv::Evict { server } => self.evict(server),
            FaultEv::Migrate => self.start_migration(),
            FaultEv::Failover { server } => self.failover(server),
            FaultEv::Flush { server } => {
                if self.masters[server].down_until.is_none() {
                    self.operator(server, &[b"FLUSHALL"]);
                    self.update_truth(true);
                }
            }
        }
    }

    /// Master `server` crashes: every connection resets.
    fn crash(&mut self, server: usize) {
        let conns: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].server == server && self.conns[i].sconn.is_some())
            .collect();
        for conn in conns {
            self.reset_conn(conn);
        }
    }

    fn master_up(&mut self, server: usize) {
        if self.masters[server].down_until.take().is_none() {
            return;
        }
        let now_ms = self.masters[server].clock_ms(self.t);
        let persistent = self.cfg.persistent;
        self.masters[server].server.restart(persistent, now_ms);
        self.log(|| format!("master {server} is up (keys kept: {persistent})"));
        self.update_truth(false);
    }

    /// The faults end: every master up, every cut over, every client running; the callers
    /// stop.
    fn heal(&mut self) {
        self.healed = true;
        let t = self.t;
        self.log(|| "HEAL".into());
        for c in &mut self.cuts {
            c.to = c.to.min(t);
        }
        for s in 0..self.masters.len() {
            if self.masters[s].down_until.is_some() {
                self.master_up(s);
            }
        }
        self.cluster_heal();
        // Bytes held by a cut go now.
        let held: Vec<u64> = self.pending.keys().copied().collect();
        let _ = held;
        for c in 0..self.clients.len() {
            if self.clients[c].paused_until.is_some() {
                self.clients[c].paused_until = None;
                self.client_reads(c);
            }
        }
        self.stopping = true;
        for c in 0..self.clients.len() {
            self.stop_callers(c);
        }
    }

    fn all_stopped(&self) -> bool {
        self.clients.iter().all(|c| c.shut)
    }

    fn undone(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.clients.iter().enumerate() {
            if !c.shut {
                out.push_str(&format!("client {i}: {}; ", c.describe()));
            }
        }
        out
    }

    pub(crate) fn violation(&mut self, property: Property, at: Us, what: String) {
        self.log(|| format!("VIOLATION {property:?}: {what}"));
        if self.violations.len() < 20 {
            self.violations.push(Violation { property, at, what });
        }
    }

    // ----- what the clients wrote and heard ----------------------------------------------

    fn parse_wire(&mut self, conn: usize) {
        let n = self.listed.len();
        loop {
            let c = &self.conns[conn];
            let buf = &c.wire[c.wire_at..];
            let (args, used) = match resp::parse(buf, &WIRE_LIMITS) {
                Ok(Status::Complete((Frame::Aggregate(a), used))) => {
                    let args: Vec<Vec<u8>> = a
                        .iter()
                        .map(|f| match f {
                            Frame::Bulk(b) => b.to_vec(),
                            _ => Vec::new(),
                        })
                        .collect();
                    (args, used)
                }
                Ok(Status::Partial(_)) => return,
                other => panic!("a client wrote bytes that are not a command: {other:?}"),
            };
            self.conns[conn].wire_at += used;
            let (client, link) = (self.conns[conn].client, self.conns[conn].link);
            // Lock links, and a cluster's links (its shards carry its lock link).
            if link < n || link >= 2 * n {
                self.note_command(client, link, &args);
            }
        }
    }

    fn note_command(&mut self, client: usize, link: usize, args: &[Vec<u8>]) {
        let name = args[0].to_ascii_uppercase();
        if self.trace.is_some() {
            let shown: Vec<String> = args
                .iter()
                .map(|a| {
                    let a = if a.len() > 40 { &a[..16] } else { &a[..] };
                    String::from_utf8_lossy(a).into_owned()
                })
                .collect();
            self.log(|| format!("  client {client} -> master {link}: {}", shown.join(" ")));
        }
        let script = |a: &[Vec<u8>]| -> Option<scripts::Script> {
            let n = a[0].to_ascii_uppercase();
            let s = a.get(1)?;
            scripts::ALL.iter().copied().find(|x| {
                if n == b"EVALSHA" {
                    x.sha.as_bytes() == s.as_slice()
                } else {
                    x.src.as_bytes() == s.as_slice()
                }
            })
        };
        let at = self.t;
        let attempt = if name == b"SET" && args.len() >= 3 {
            Some((vec![args[1].clone()], args[2].clone(), None))
        } else if name == b"EVALSHA" || name == b"EVAL" {
            let s = script(args);
            let nkeys: usize = args
                .get(2)
                .and_then(|x| std::str::from_utf8(x).ok())
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            let keys: Vec<Vec<u8>> = args.iter().skip(3).take(nkeys).cloned().collect();
            let argv: Vec<Vec<u8>> = args.iter().skip(3 + nkeys).cloned().collect();
            match s {
                Some(s) if s == scripts::RELEASE => {
                    let token = argv.first().cloned().unwrap_or_default();
                    if self.release_tokens.insert(token) {
                        let could_free = keys.iter().all(|k| self.could_free(client, k));
                        self.written_releases.push(Release {
                            client,
                            at,
                            keys,
                            could_free,
                        });
                    }
                    None
                }
                Some(s) if s == scripts::ACQUIRE_WAIT || s == scripts::ACQUIRE_MANY => {
                    let waiter = if s == scripts::ACQUIRE_WAIT && keys.len() == 1 {
                        argv.get(2).cloned()
                    } else {
                        None
                    };
                    Some((keys, argv.first().cloned().unwrap_or_default(), waiter))
                }
                _ => None,
            }
        } else {
            None
        };
        let Some((keys, token, waiter)) = attempt else {
            return;
        };
        if token.is_empty() {
            return;
        }
        let _ = link;
        // The same token goes to every master: one attempt per token.
        let fresh = self.token_client.insert(token.clone(), client).is_none();
        self.fp_client.insert(
            token[..token.len().min(scripts::NOTICE_LEN)].to_vec(),
            client,
        );
        if fresh {
            self.attempts.push(Attempt {
                client,
                keys,
                token,
                at,
                waiter,
            });
            let keys = self.attempts.last().expect("pushed").keys.clone();
            self.on_attempt(client, &keys);
        }
    }

    fn parse_heard(&mut self, conn: usize) {
        loop {
            let c = &self.conns[conn];
            let buf = &c.heard[c.heard_at..];
            let (parts, used) = match resp::parse(buf, &READ_LIMITS) {
                Ok(Status::Complete((Frame::Aggregate(a), used))) => {
                    let parts: Vec<Vec<u8>> = a
                        .iter()
                        .map(|f| match f {
                            Frame::Bulk(b) => b.to_vec(),
                            _ => Vec::new(),
                        })
                        .collect();
                    (parts, used)
                }
                Ok(Status::Complete((_, used))) => (Vec::new(), used),
                _ => return,
            };
            self.conns[conn].heard_at += used;
            let client = self.conns[conn].client;
            let at = self.t;
            if parts.len() == 3 && parts[0] == b"message" {
                let ch = &parts[1];
                let key = ch
                    .strip_prefix(scripts::RELEASED_PREFIX)
                    .map(<[u8]>::to_vec);
                let fp = parts[2][..parts[2].len().min(scripts::NOTICE_LEN)].to_vec();
                self.stats.announcements += 1;
                let could_free = key.as_ref().is_none_or(|k| self.could_free(client, k));
                self.heard.push(Heard {
                    client,
                    at,
                    key,
                    fp: Some(fp),
                    could_free,
                });
            } else if parts.len() == 3 && parts[0] == b"subscribe" {
                let key = parts[1]
                    .strip_prefix(scripts::RELEASED_PREFIX)
                    .map(<[u8]>::to_vec);
                self.heard.push(Heard {
                    client,
                    at,
                    key,
                    fp: None,
                    could_free: true,
                });
            }
        }
    }

    /// Whether few enough masters hold `key` for other clients (or for nobody known) that
    /// a release could leave room for a quorum for `client`.
    fn could_free(&self, client: usize, key: &[u8]) -> bool {
        let t = self.t;
        let n = self.listed.len();
        let others = self
            .listed
            .iter()
            .filter(|&&s| {
                // A master the client cannot reach now is in its way too.
                if self.master_down(s) || self.master_cut(client, s, t) {
                    return true;
                }
                match self.master_get(s, key) {
                    Some(v) => {
                        let v = v.strip_suffix(b"+").unwrap_or(&v);
                        self.token_client.get(v) != Some(&client)
                    }
                    None => false,
                }
            })
            .count();
        n - others.min(n) > n / 2
    }

    pub(crate) fn resource_name(r: usize) -> Vec<u8> {
        format!("res:{r}").into_bytes()
    }

    pub(crate) fn resource_of(key: &[u8]) -> Option<usize> {
        std::str::from_utf8(key.strip_prefix(b"res:")?)
            .ok()?
            .parse()
            .ok()
    }
}

/// The links a client's core has: `2 n`, and a cluster's links from `2 n` on as the core
/// asked to connect them.
pub(crate) fn link_count(c: &client::Client) -> usize {
    c.links.len().max(2 * c.core.masters())
}

/// The fault a link's close carries to the core.
pub(crate) fn closed_fault(kind: ErrorKind) -> Fault {
    Fault::Closed(kind)
}

pub(crate) fn connect_refused() -> Fault {
    Fault::Connect(ErrorKind::ConnectionRefused)
}

pub(crate) fn idle_shift_min() -> Us {
    IDLE_SHIFT_MIN.as_micros() as Us
}

pub(crate) type Actions = VecDeque<Action>;
pub(crate) type Link = LinkId;
