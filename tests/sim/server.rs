//! `SimRedis`: a byte-level simulated `redis-server` 7.0 for the deterministic simulation.
//!
//! One server: 16 databases of strings and sorted sets with `PX` expiry, a script cache, a
//! pub/sub registry and connections fed with raw RESP bytes. Nothing reads a clock or a
//! random source: every call that can observe time takes the server's own clock in
//! milliseconds (`now_ms`), and the run ids come from a seeded generator.
//!
//! What it answers is what a real `redis-server` 7.0 answers, byte for byte, to every
//! command the crate's client sends (the handshake, `SET NX PX`, `EVALSHA`/`EVAL` of the
//! scripts of `redlock_mux::scripts::ALL`, `SUBSCRIBE`/`UNSUBSCRIBE`), plus the commands a
//! test uses to look inside (`GET`, `PTTL`, `KEYS`, `ZRANGE`, ...). `tests/sim_table.rs`
//! proves it: each scripted case runs on a real server and here, and the replies must
//! agree frame by frame.
//!
//! The scripts are not interpreted: each is a native function (`lua_release`,
//! `lua_extend`, ...) that mirrors its Lua source step by step, every step under a
//! comment quoting the Lua line it mirrors (`// L6: ...`), and calling Redis commands
//! through [`SimRedis::call`] / [`SimRedis::pcall`] exactly as the Lua does (same
//! commands, same arguments, same error text with the same line number when a
//! `redis.call` raises). A script source that is not one of the crate's scripts is
//! refused with an `ERR simredis: ...` error (a real server would run it; the table test
//! notices the difference). When a script in `src/scripts.rs` changes, its native
//! function here must change with it; the table test fails until it does.
//!
//! With [`Config::valkey`] it answers as Valkey 9 where the client can tell: `INFO server`
//! names Valkey's version, and `DELIFEQ key value` exists (the client's release of a
//! one-key lock that did not wait, on such a master; the table test compares it with a real
//! `valkey-server` when `REDIS_SERVER` names one). Nothing else of Valkey is modelled.
//!
//! Known differences from a real server, none reachable by the crate's client (which
//! sends well-formed RESP2 arrays of the commands above) but the last:
//! * Only the commands listed in `COMMANDS` exist; any other gets Redis' "unknown command"
//!   error (`PSUBSCRIBE`, `MULTI`, ... included). `HELLO` takes no options; `CLIENT` has
//!   `TRACKING ON|OFF [OPTIN] [NOLOOP]` and `CACHING YES|NO` only (no `REDIRECT`, `BCAST`,
//!   `PREFIX`, `OPTOUT`); under RESP3 (`HELLO 3`) replies differ from RESP2 by their nulls
//!   only (`CONFIG GET`'s map and `INFO`'s verbatim string are not modelled: the client
//!   sends neither after `HELLO 3`). The tracking table is never full (evictions are the
//!   simulation's fault, `evict_tracked`); `ZADD`/`ZREM` do not invalidate.
//! * `INFO` answers the `server` section only (with a subset of its fields, in Redis'
//!   order); `CONFIG GET` knows `appendonly`, `appendfsync`, `appendfilename`,
//!   `appenddirname` and `databases` only.
//! * `DBSIZE` counts live keys (Redis also counts expired keys not yet evicted).
//! * `ZADD` supports `NX`/`XX`/`CH`, `ZRANGE` index ranges with `WITHSCORES`, `ZRANK`
//!   without `WITHSCORE` (7.0 has none), `PEXPIRE`
//!   no options; other options get `ERR simredis: unsupported ...`.
//! * `UNSUBSCRIBE` without arguments and `KEYS` list in subscription / key order (Redis:
//!   hash order).
//! * Protocol errors: the error texts of the multibulk and bulk headers are Redis'; a
//!   missing CRLF after bulk data (Redis skips two bytes unchecked) is an error here.
//!   Inline commands are split on whitespace (no quotes).
//! * No memory limits, no client output buffer limits, no replication, no keyspace events.
//! * No ACL beyond passwords: every user may run every command and use every channel (a
//!   real user without channel rights gets `-NOPERM` for `SUBSCRIBE`, and the scripts'
//!   `pcall('publish')` fails quietly; `tests/hot.rs` has that case on real servers).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;

use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::scripts::{self, Script};

/// The version `INFO server` reports (the table test accepts any real `7.0.x`).
pub const REDIS_VERSION: &str = "7.0.15";
/// What `INFO server` reports under [`Config::valkey`] (valkey-server 9.1.2's lines).
pub const VALKEY_VERSION_LINES: &str =
    "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\nvalkey_release_stage:ga\r\n";
/// Databases per server (`SELECT 0` .. `SELECT 15`).
pub const DATABASES: usize = 16;

/// One connection to the server. Ids are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u32);

/// How a server is set up (what `redis-server` is started with).
#[derive(Clone, Debug)]
pub struct Config {
    /// Seeds the run ids (a new one at every restart).
    pub seed: u64,
    /// `--requirepass`: the default user's password. `None`: the default user is `nopass`
    /// (and `AUTH <password>` is an error, as in Redis).
    pub requirepass: Option<Vec<u8>>,
    /// ACL users besides `default`, each `(name, password)`, with every right.
    pub users: Vec<(Vec<u8>, Vec<u8>)>,
    /// `CONFIG GET appendonly` (`yes`/`no`).
    pub appendonly: bool,
    /// `CONFIG GET appendfsync` (`always`, `everysec`, `no`).
    pub appendfsync: String,
    /// Null replies as RESP3 `_` instead of `$-1` (a RESP3 server's "taken").
    pub resp3_nulls: bool,
    /// `INFO server`'s `tcp_port`.
    pub tcp_port: u16,
    /// `INFO server`'s `process_id` (changes at each restart: + 1).
    pub process_id: u32,
    /// Keep every published message for [`SimRedis::take_published`] (off: nothing is
    /// kept, so a long run that never takes them does not grow).
    pub log_published: bool,
    /// Answer as a Valkey 9 server in the two ways the client tells: `INFO server` says
    /// `server_name:valkey` and `valkey_version:9.1.2` (with Valkey's `redis_version`,
    /// 7.2.4), and `DELIFEQ key value` exists (else it is an unknown command, as in Redis
    /// 7.0). Nothing else changes.
    pub valkey: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            seed: 1,
            requirepass: None,
            users: Vec::new(),
            appendonly: false,
            appendfsync: "everysec".into(),
            resp3_nulls: false,
            tcp_port: 6379,
            process_id: 4242,
            log_published: false,
            valkey: false,
        }
    }
}

/// A reply, as the server encodes it (and as a native script hands values around: a
/// `redis.call` result seen from Lua).
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Status(Vec<u8>),
    /// `-ERR ...` (the whole line after `-`).
    Error(Vec<u8>),
    /// `:n`.
    Int(i64),
    /// `$n\r\n...`.
    Bulk(Vec<u8>),
    /// `$-1` (or `_` with [`Config::resp3_nulls`]).
    Nil,
    /// `*n` and the elements.
    Array(Vec<Reply>),
}

fn err(text: &str) -> Reply {
    Reply::Error(text.as_bytes().to_vec())
}

fn ok() -> Reply {
    Reply::Status(b"OK".to_vec())
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const SYNTAX: &str = "ERR syntax error";
const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
const LUA_BAD_ARG: &str = "ERR Lua redis lib command arguments must be strings or integers";

/// A published message, kept for the simulation's checks ([`SimRedis::take_published`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub channel: Vec<u8>,
    pub payload: Vec<u8>,
    /// How many connections it was delivered to (`PUBLISH`'s answer).
    pub receivers: usize,
}

#[derive(Clone, Debug)]
enum Value {
    Str(Vec<u8>),
    /// Members sorted by (score, member), as Redis orders a sorted set.
    Zset(Vec<(f64, Vec<u8>)>),
}

#[derive(Clone, Debug)]
struct Entry {
    value: Value,
    /// Absolute expiry on the server's clock (ms); the key exists while `now <= at`.
    expire_at: Option<i64>,
}

type Db = BTreeMap<Vec<u8>, Entry>;

#[derive(Debug, Default)]
struct Conn {
    /// Bytes received and not yet parsed into a whole command.
    input: Vec<u8>,
    /// Bytes the server wrote and the caller has not taken yet.
    output: Vec<u8>,
    open: bool,
    db: usize,
    authed: bool,
    /// Subscribed channels, in subscription order.
    channels: Vec<Vec<u8>>,
    /// `HELLO 3`: RESP3 replies (nulls as `_`, maps, pushes).
    resp3: bool,
    /// `CLIENT TRACKING ON`: (OPTIN, NOLOOP).
    tracking: Option<(bool, bool)>,
    /// `CLIENT CACHING YES`: the next command's reads are tracked (OPTIN).
    caching: bool,
}

/// A cluster node's role (`tests/sim/cluster.rs`): asked before each command runs.
pub trait ClusterRole: std::fmt::Debug {
    /// What answers the command instead (a redirection, `CLUSTER ...`, `ASKING`'s `+OK`:
    /// RESP bytes), or `None`: it runs here. `has_key`: whether a key lives here.
    fn gate(
        &mut self,
        conn: u32,
        args: &[Vec<u8>],
        resp3: bool,
        has_key: &dyn Fn(&[u8]) -> bool,
    ) -> Option<Vec<u8>>;
    /// A script's `redis.call` of `key` (`here`: it lives on this node; `declared`: the
    /// script's first `KEYS`; `strict`: a script with a shebang, no cross-slot access):
    /// the error that refuses it.
    fn script_key(
        &self,
        key: &[u8],
        here: bool,
        declared: Option<&[u8]>,
        strict: bool,
    ) -> Option<&'static str>;
}

/// A simulated `redis-server`. See the module documentation.
#[derive(Debug)]
pub struct SimRedis {
    /// A cluster node's role (`None`: standalone).
    pub cluster: Option<Box<dyn ClusterRole>>,
    cfg: Config,
    dbs: Vec<Db>,
    /// `cached[i]`: `known_script(i)` is in the script cache.
    cached: Vec<bool>,
    conns: BTreeMap<u32, Conn>,
    next_conn: u32,
    /// Channel -> subscribed connections, in subscription order.
    subscribers: BTreeMap<Vec<u8>, Vec<u32>>,
    run_id: String,
    rng: u64,
    started_ms: u64,
    process_id: u32,
    published: Vec<Published>,
    commands: u64,
    /// Client-side caching: key -> the connections tracking it (Redis' tracking table is
    /// one for every database, keyed by name).
    tracked: BTreeMap<Vec<u8>, Vec<u32>>,
    /// The connection whose command runs (Redis' `server.current_client`; scripts run
    /// under their caller).
    current: Option<u32>,
    /// Invalidations for the running connection itself, sent after its reply (`None`: a
    /// flush).
    pending_self: Vec<Option<Vec<u8>>>,
    /// `DELIFEQ`s run, by answer (0, 1).
    delifeq_answers: [u64; 2],
}

/// The commands the server knows: name, Redis arity (n: exactly n arguments with the
/// name; -n: at least n), allowed before `AUTH`, allowed in subscriber mode.
struct Cmd {
    name: &'static str,
    arity: i32,
    no_auth: bool,
    pubsub: bool,
}

const fn cmd(name: &'static str, arity: i32) -> Cmd {
    Cmd {
        name,
        arity,
        no_auth: false,
        pubsub: false,
    }
}

const COMMANDS: &[Cmd] = &[
    Cmd {
        name: "auth",
        arity: -2,
        no_auth: true,
        pubsub: false,
    },
    Cmd {
        name: "ping",
        arity: -1,
        no_auth: false,
        pubsub: true,
    },
    Cmd {
        name: "subscribe",
        arity: -2,
        no_auth: false,
        pubsub: true,
    },
    Cmd {
        name: "unsubscribe",
        arity: -1,
        no_auth: false,
        pubsub: true,
    },
    cmd("select", 2),
    cmd("info", -1),
    cmd("config", -2),
    cmd("script", -2),
    cmd("eval", -3),
    cmd("evalsha", -3),
    cmd("publish", 3),
    cmd("get", 2),
    cmd("mget", -2),
    cmd("client", -2),
    Cmd {
        name: "hello",
        arity: -1,
        no_auth: true,
        pubsub: false,
    },
    cmd("append", 3),
    cmd("set", -3),
    cmd("del", -2),
    // Valkey 9 only (`Config::valkey`).
    cmd("delifeq", 3),
    cmd("exists", -2),
    cmd("pttl", 2),
    cmd("pexpire", -3),
    cmd("keys", 2),
    cmd("dbsize", 1),
    cmd("flushall", -1),
    cmd("zadd", -4),
    cmd("zrem", -3),
    cmd("zrange", -4),
    cmd("zscore", 3),
    cmd("zrank", 3),
    cmd("zcard", 2),
    cmd("time", 1),
];

/// Subcommands of the container commands: (container, name, arity).
const SUBCOMMANDS: &[(&str, &str, i32)] = &[
    ("config", "get", -3),
    ("script", "load", 3),
    ("script", "flush", -2),
    ("script", "exists", -3),
    ("client", "tracking", -3),
    ("client", "caching", 3),
];

/// `CONFIG GET`'s table, in the order Redis 7.0 lists `append*`.
fn config_table(cfg: &Config) -> Vec<(&'static str, String)> {
    vec![
        ("appenddirname", "appendonlydir".into()),
        (
            "appendonly",
            if cfg.appendonly { "yes" } else { "no" }.into(),
        ),
        ("appendfilename", "appendonly.aof".into()),
        ("appendfsync", cfg.appendfsync.clone()),
        ("databases", DATABASES.to_string()),
    ]
}

/// What the input buffer of a connection holds next.
enum Next {
    /// Not a whole command yet.
    Need,
    /// Bytes Redis consumes without a reply (`*0`, `*-1`, an empty inline line).
    Skip(usize),
    /// A command and the bytes it used.
    Command(Vec<Vec<u8>>, usize),
    /// A protocol error: the reply's text; the connection closes after it.
    Protocol(String),
}

/// A script run: which script (its SHA1 names it in error texts), the database and the
/// clock it runs on, `KEYS` and `ARGV`.
struct Run<'a> {
    sha: &'static str,
    db: usize,
    now: i64,
    keys: &'a [Vec<u8>],
    argv: &'a [Vec<u8>],
}

impl<'a> Run<'a> {
    /// `#KEYS`.
    fn nkeys(&self) -> usize {
        self.keys.len()
    }
    /// `KEYS[i]` (1-based; a non-integer or out-of-range index is Lua's nil).
    fn key(&self, i: f64) -> Option<&'a [u8]> {
        index(self.keys, i)
    }
    /// `ARGV[i]` (1-based; nil when absent).
    fn arg(&self, i: usize) -> Option<&'a [u8]> {
        index(self.argv, i as f64)
    }
}

fn index(list: &[Vec<u8>], i: f64) -> Option<&[u8]> {
    if i.fract() != 0.0 || i < 1.0 || i > list.len() as f64 {
        return None;
    }
    list.get(i as usize - 1).map(Vec::as_slice)
}

/// A Lua error that ends the script: the reply's text.
struct Raised(Vec<u8>);

impl SimRedis {
    /// A server started at `now_ms` on its own clock.
    pub fn new(cfg: Config, now_ms: u64) -> SimRedis {
        let mut rng = cfg.seed ^ 0x5eed_5eed_5eed_5eed;
        let run_id = new_run_id(&mut rng);
        let process_id = cfg.process_id;
        SimRedis {
            cluster: None,
            cfg,
            dbs: vec![Db::new(); DATABASES],
            cached: vec![false; known_scripts().count()],
            conns: BTreeMap::new(),
            next_conn: 0,
            subscribers: BTreeMap::new(),
            run_id,
            rng,
            started_ms: now_ms,
            process_id,
            published: Vec::new(),
            commands: 0,
            tracked: BTreeMap::new(),
            current: None,
            pending_self: Vec::new(),
            delifeq_answers: [0; 2],
        }
    }

    /// The configuration it was started with (durability flags as last set).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    // ----- connections -------------------------------------------------------------------

    /// A client connects.
    pub fn open(&mut self) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(
            id,
            Conn {
                open: true,
                authed: self.cfg.requirepass.is_none(),
                ..Conn::default()
            },
        );
        ConnId(id)
    }

    /// The client closes `conn` (or its connection breaks): its subscriptions end, its
    /// unparsed input and untaken output are dropped.
    pub fn close(&mut self, conn: ConnId) {
        self.drop_subscriptions(conn.0);
        self.conns.remove(&conn.0);
    }

    /// Whether `conn` is open (false once the server closed it: `QUIT`, a protocol error,
    /// a restart; or once the client closed it).
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.get(&conn.0).is_some_and(|c| c.open)
    }

    /// Bytes from the client on `conn`, at `now_ms` on the server's clock: every whole
    /// command they complete runs, in order; replies go to `conn`'s output, messages
    /// published meanwhile to the outputs of the subscribed connections. Bytes may be
    /// split anywhere (a partial command waits for the rest). Returns whether `conn` is
    /// still open afterwards (bytes on a closed connection are ignored).
    pub fn feed(&mut self, conn: ConnId, bytes: &[u8], now_ms: u64) -> bool {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return false;
        };
        if !c.open {
            return false;
        }
        c.input.extend_from_slice(bytes);
        let mut input = std::mem::take(&mut c.input);
        let mut used = 0;
        let mut open = true;
        while used < input.len() {
            let authed = self.conns.get(&conn.0).is_some_and(|c| c.authed);
            match next_command(&input[used..], authed) {
                Next::Need => break,
                Next::Skip(n) => used += n,
                Next::Command(args, n) => {
                    used += n;
                    self.commands += 1;
                    let client_cmd = args[0].eq_ignore_ascii_case(b"client");
                    self.current = Some(conn.0);
                    let still = self.execute(conn.0, args, now_ms as i64);
                    self.after_command(conn.0, client_cmd);
                    if !still {
                        open = false;
                        break;
                    }
                }
                Next::Protocol(text) => {
                    let reply = Reply::Error(format!("ERR Protocol error: {text}").into_bytes());
                    self.reply(conn.0, &reply);
                    open = false;
                    break;
                }
            }
        }
        if open {
            input.drain(..used);
            if let Some(c) = self.conns.get_mut(&conn.0) {
                c.input = input;
            }
        } else {
            self.server_close(conn.0);
        }
        open
    }

    /// What the server wrote to `conn` since the last call (replies and messages). A
    /// connection the server closed keeps its last output until it is taken.
    pub fn take_output(&mut self, conn: ConnId) -> Vec<u8> {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return Vec::new();
        };
        let out = std::mem::take(&mut c.output);
        if !c.open {
            self.conns.remove(&conn.0);
        }
        out
    }

    /// [`take_output`](Self::take_output), appended to `buf`.
    pub fn drain_output(&mut self, conn: ConnId, buf: &mut Vec<u8>) {
        let out = self.take_output(conn);
        buf.extend_from_slice(&out);
    }

    /// The connections with output waiting, by id.
    pub fn with_output(&self) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, c)| !c.output.is_empty())
            .map(|(&id, _)| ConnId(id))
            .collect()
    }

    /// The open connections, by id.
    pub fn open_conns(&self) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, c)| c.open)
            .map(|(&id, _)| ConnId(id))
            .collect()
    }

    // ----- faults and state ----------------------------------------------------------------

    /// The server restarts at `now_ms`: every connection is closed (output written before
    /// stays takeable), a new run id, the uptime starts again, the script cache is empty;
    /// without `persistent` (`appendonly yes` + `appendfsync always` on a real server)
    /// every key is lost, with it keys keep their absolute expiry times.
    pub fn restart(&mut self, persistent: bool, now_ms: u64) {
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        for id in ids {
            self.server_close(id);
        }
        self.run_id = new_run_id(&mut self.rng);
        self.started_ms = now_ms;
        self.process_id += 1;
        self.script_flush();
        if !persistent {
            for db in &mut self.dbs {
                db.clear();
            }
        }
    }

    /// `SCRIPT FLUSH`: the next `EVALSHA` of each script gets `-NOSCRIPT`.
    pub fn script_flush(&mut self) {
        self.cached.iter_mut().for_each(|c| *c = false);
    }

    /// What `CONFIG GET append*` answers from now on.
    pub fn set_durability(&mut self, appendonly: bool, appendfsync: &str) {
        self.cfg.appendonly = appendonly;
        self.cfg.appendfsync = appendfsync.to_owned();
    }

    /// `INFO server`'s `run_id` (40 hex digits; new at each restart).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// `INFO server`'s `uptime_in_seconds` at `now_ms`.
    pub fn uptime_s(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.started_ms) / 1000
    }

    /// How many commands ran (script calls inside them not counted).
    pub fn commands_run(&self) -> u64 {
        self.commands
    }

    /// How many `DELIFEQ`s answered 0 and 1 ([`Config::valkey`]).
    pub fn delifeq_answers(&self) -> [u64; 2] {
        self.delifeq_answers
    }

    /// Every message published since the last call (by scripts or `PUBLISH`), when
    /// [`Config::log_published`] is on.
    pub fn take_published(&mut self) -> Vec<Published> {
        std::mem::take(&mut self.published)
    }

    /// Whether `scripts::ALL[i]` (or past them, `scripts::ADMIN[i - ALL.len()]`) is cached.
    pub fn script_cached(&self, i: usize) -> bool {
        self.cached[i]
    }

    /// Live keys of database `db` at `now_ms`, sorted.
    pub fn keys(&self, db: usize, now_ms: u64) -> Vec<Vec<u8>> {
        let now = now_ms as i64;
        self.dbs[db]
            .iter()
            .filter(|(_, e)| alive(e, now))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// A live string key's value.
    pub fn get(&self, db: usize, key: &[u8], now_ms: u64) -> Option<Vec<u8>> {
        match self.dbs[db].get(key) {
            Some(e) if alive(e, now_ms as i64) => match &e.value {
                Value::Str(v) => Some(v.clone()),
                Value::Zset(_) => None,
            },
            _ => None,
        }
    }

    /// `PTTL key` (-2: no such key, -1: no expiry).
    pub fn pttl(&self, db: usize, key: &[u8], now_ms: u64) -> i64 {
        let now = now_ms as i64;
        match self.dbs[db].get(key) {
            Some(e) if alive(e, now) => e.expire_at.map_or(-1, |at| (at - now).max(0)),
            _ => -2,
        }
    }

    /// A live sorted set's members with their scores, in order (the line of waiters of
    /// `key` is `zset(db, b"redlock-mux:queue:<key>", now)`).
    pub fn zset(&self, db: usize, key: &[u8], now_ms: u64) -> Vec<(Vec<u8>, f64)> {
        match self.dbs[db].get(key) {
            Some(Entry {
                value: Value::Zset(z),
                expire_at,
            }) if expire_at.is_none_or(|at| now_ms as i64 <= at) => {
                z.iter().map(|(s, m)| (m.clone(), *s)).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Set a string key directly (test set-up), with an optional expiry `px` ms from now.
    pub fn set_key(&mut self, db: usize, key: &[u8], value: &[u8], px: Option<u64>, now_ms: u64) {
        let entry = Entry {
            value: Value::Str(value.to_vec()),
            expire_at: px.map(|ms| now_ms as i64 + ms as i64),
        };
        self.dbs[db].insert(key.to_vec(), entry);
    }

    /// A cluster's `MIGRATE` of one key of database 0 (`tests/sim/cluster.rs`): it leaves
    /// this server (trackers hear so) and lives on `to` with the TTL it had left. `false`:
    /// no such live key.
    pub fn migrate_key(&mut self, key: &[u8], now_ms: u64, to: &mut SimRedis, to_ms: u64) -> bool {
        let now = now_ms as i64;
        let Some(e) = self.dbs[0].remove(key) else {
            return false;
        };
        if !alive(&e, now) {
            return false;
        }
        self.signal_modified(key);
        let expire_at = e.expire_at.map(|at| to_ms as i64 + (at - now));
        to.dbs[0].insert(key.to_vec(), Entry { expire_at, ..e });
        to.signal_modified(key);
        true
    }

    // ----- connection plumbing ---------------------------------------------------------------

    fn server_close(&mut self, id: u32) {
        self.drop_subscriptions(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.open = false;
            c.input.clear();
            if c.output.is_empty() {
                self.conns.remove(&id);
            }
        }
    }

    fn drop_subscriptions(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        for ch in std::mem::take(&mut c.channels) {
            if let Some(subs) = self.subscribers.get_mut(&ch) {
                subs.retain(|&s| s != id);
                if subs.is_empty() {
                    self.subscribers.remove(&ch);
                }
            }
        }
    }

    fn reply(&mut self, id: u32, reply: &Reply) {
        if let Some(c) = self.conns.get_mut(&id) {
            let resp3 = self.cfg.resp3_nulls || c.resp3;
            encode(&mut c.output, reply, resp3);
        }
    }

    // ----- command dispatch -----------------------------------------------------------------

    /// Runs one command of connection `id`; false when the connection closes after it.
    fn execute(&mut self, id: u32, args: Vec<Vec<u8>>, now: i64) -> bool {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        // Redis answers QUIT before looking anything up (processCommand).
        if name == "quit" {
            self.reply(id, &ok());
            return false;
        }
        if let Some(mut role) = self.cluster.take() {
            let resp3 = self.conns.get(&id).is_some_and(|c| c.resp3);
            let out = role.gate(id, &args, resp3, &|k| self.pttl(0, k, now as u64) != -2);
            self.cluster = Some(role);
            if let (Some(out), Some(c)) = (out, self.conns.get_mut(&id)) {
                c.output.extend_from_slice(&out);
                return true;
            }
        }
        let known = COMMANDS
            .iter()
            .find(|c| c.name == name)
            .filter(|c| c.name != "delifeq" || self.cfg.valkey);
        let Some(command) = known else {
            let r = Reply::Error(unknown_command(&args));
            self.reply(id, &r);
            return true;
        };
        // Container commands: the subcommand decides the arity and the name in errors.
        let mut fullname = name.clone();
        let mut arity = command.arity;
        if (name == "config" || name == "script" || name == "client") && args.len() >= 2 {
            {
                let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
                match SUBCOMMANDS.iter().find(|(c, s, _)| *c == name && *s == sub) {
                    Some(&(_, s, a)) => {
                        fullname = format!("{name}|{s}");
                        arity = a;
                    }
                    None => {
                        let text = format!(
                            "ERR unknown subcommand '{}'. Try {} HELP.",
                            printable(&args[1], 128),
                            name.to_ascii_uppercase()
                        );
                        self.reply(id, &Reply::Error(text.into_bytes()));
                        return true;
                    }
                }
            }
        }
        let n = args.len() as i32;
        if (arity > 0 && n != arity) || n < -arity {
            let text = format!("ERR wrong number of arguments for '{fullname}' command");
            self.reply(id, &Reply::Error(text.into_bytes()));
            return true;
        }
        let (authed, subscribed) = match self.conns.get(&id) {
            Some(c) => (c.authed, !c.channels.is_empty()),
            None => return false,
        };
        if !authed && !command.no_auth {
            self.reply(id, &err("NOAUTH Authentication required."));
            return true;
        }
        if subscribed && !command.pubsub {
            let text = format!(
                "ERR Can't execute '{fullname}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / \
                 PING / QUIT / RESET are allowed in this context"
            );
            self.reply(id, &Reply::Error(text.into_bytes()));
            return true;
        }
        let reply = match fullname.as_str() {
            "auth" => self.cmd_auth(id, &args),
            "ping" if args.len() > 2 => err("ERR wrong number of arguments for 'ping' command"),
            "ping" if subscribed => Reply::Array(vec![
                Reply::Bulk(b"pong".to_vec()),
                Reply::Bulk(args.get(1).cloned().unwrap_or_default()),
            ]),
            "ping" => match args.get(1) {
                None => Reply::Status(b"PONG".to_vec()),
                Some(a) => Reply::Bulk(a.clone()),
            },
            "subscribe" => {
                for ch in &args[1..] {
                    let r = self.subscribe(id, ch);
                    self.reply(id, &r);
                }
                return true;
            }
            "unsubscribe" => {
                let channels = if args.len() > 1 {
                    args[1..].to_vec()
                } else {
                    self.conns[&id].channels.clone()
                };
                if channels.is_empty() {
                    let r = Reply::Array(vec![
                        Reply::Bulk(b"unsubscribe".to_vec()),
                        Reply::Nil,
                        Reply::Int(0),
                    ]);
                    self.reply(id, &r);
                }
                for ch in &channels {
                    let r = self.unsubscribe(id, ch);
                    self.reply(id, &r);
                }
                return true;
            }
            "select" => match parse_i64(&args[1]) {
                Some(n) if (0..DATABASES as i64).contains(&n) => {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.db = n as usize;
                    }
                    ok()
                }
                Some(n) if n >= i32::MIN as i64 && n <= i32::MAX as i64 => {
                    err("ERR DB index is out of range")
                }
                Some(_) => {
                    err("ERR value is out of range, value must between -2147483648 and 2147483647")
                }
                None => err(NOT_INT),
            },
            "hello" => return self.cmd_hello(id, &args),
            "client|tracking" => self.cmd_client_tracking(id, &args),
            "client|caching" => self.cmd_client_caching(id, &args),
            "info" => self.cmd_info(&args, now),
            "config|get" => self.cmd_config_get(&args),
            "script|load" => match script_index(&args[2]) {
                Some(i) => {
                    self.cached[i] = true;
                    Reply::Bulk(known_script(i).sha.as_bytes().to_vec())
                }
                None => unknown_script(),
            },
            "script|flush" => match args.get(2).map(|a| a.to_ascii_lowercase()) {
                None if args.len() == 2 => {
                    self.script_flush();
                    ok()
                }
                Some(m) if args.len() == 3 && (m == b"sync" || m == b"async") => {
                    self.script_flush();
                    ok()
                }
                _ => err("ERR SCRIPT FLUSH only support SYNC|ASYNC option"),
            },
            "script|exists" => Reply::Array(
                args[2..]
                    .iter()
                    .map(|sha| Reply::Int(self.cached_by_sha(sha).is_some() as i64))
                    .collect(),
            ),
            "eval" | "evalsha" => {
                let db = self.conns[&id].db;
                self.cmd_eval(fullname == "evalsha", &args, db, now)
            }
            _ => {
                let db = self.conns[&id].db;
                let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let r = self.data(db, &argv, now);
                self.remember_reads(&argv);
                r
            }
        };
        self.reply(id, &reply);
        true
    }

    fn cmd_auth(&mut self, id: u32, args: &[Vec<u8>]) -> Reply {
        if args.len() > 3 {
            return err(SYNTAX);
        }
        let (user, pass): (&[u8], &[u8]) = if args.len() == 2 {
            if self.cfg.requirepass.is_none() {
                return err(
                    "ERR AUTH <password> called without any password configured for the \
                     default user. Are you sure your configuration is correct?",
                );
            }
            (b"default", &args[1])
        } else {
            (&args[1], &args[2])
        };
        let good = if user == b"default" {
            // nopass (no requirepass) accepts any password.
            self.cfg.requirepass.as_deref().is_none_or(|p| p == pass)
        } else {
            self.cfg
                .users
                .iter()
                .any(|(u, p)| u.as_slice() == user && p.as_slice() == pass)
        };
        if good {
            if let Some(c) = self.conns.get_mut(&id) {
                c.authed = true;
            }
            ok()
        } else {
            err("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }

    fn cmd_info(&self, args: &[Vec<u8>], now: i64) -> Reply {
        let section = args.get(1).map(|s| s.to_ascii_lowercase());
        if args.len() > 2 || section.as_deref().is_some_and(|s| s != b"server") {
            return err("ERR simredis: INFO answers the server section only");
        }
        let uptime = self.uptime_s(now.max(0) as u64);
        let mut t = String::new();
        // The fields of Redis 7.0's server section that do not describe the build or the
        // host, in Redis' order.
        let version = if self.cfg.valkey {
            VALKEY_VERSION_LINES.to_string()
        } else {
            format!("redis_version:{REDIS_VERSION}\r\n")
        };
        let _ = write!(
            t,
            "# Server\r\n\
             {version}\
             redis_git_sha1:00000000\r\n\
             redis_git_dirty:0\r\n\
             redis_mode:standalone\r\n\
             arch_bits:64\r\n\
             multiplexing_api:epoll\r\n\
             atomicvar_api:c11-builtin\r\n\
             process_id:{}\r\n\
             process_supervised:no\r\n\
             run_id:{}\r\n\
             tcp_port:{}\r\n\
             server_time_usec:{}\r\n\
             uptime_in_seconds:{uptime}\r\n\
             uptime_in_days:{}\r\n\
             hz:10\r\n\
             configured_hz:10\r\n\
             io_threads_active:0\r\n",
            self.process_id,
            self.run_id,
            self.cfg.tcp_port,
            now.max(0) as u64 * 1000,
            uptime / 86400,
        );
        Reply::Bulk(t.into_bytes())
    }

    fn cmd_config_get(&self, args: &[Vec<u8>]) -> Reply {
        let mut out = Vec::new();
        for (name, value) in config_table(&self.cfg) {
            // A name without glob characters is looked up as given and echoed as given.
            let hit = args[2..].iter().find(|p| {
                if p.iter().any(|b| b"*?[".contains(b)) {
                    glob(p, name.as_bytes(), true)
                } else {
                    p.eq_ignore_ascii_case(name.as_bytes())
                }
            });
            if let Some(p) = hit {
                let shown = if p.iter().any(|b| b"*?[".contains(b)) {
                    name.as_bytes().to_vec()
                } else {
                    p.to_vec()
                };
                out.push(Reply::Bulk(shown));
                out.push(Reply::Bulk(value.into_bytes()));
            }
        }
        Reply::Array(out)
    }

    fn cached_by_sha(&self, sha: &[u8]) -> Option<usize> {
        known_scripts()
            .position(|s| s.sha.as_bytes().eq_ignore_ascii_case(sha))
            .filter(|&i| self.cached[i])
    }

    /// `EVAL src numkeys key.. arg..` / `EVALSHA sha numkeys key.. arg..` (the order of
    /// the checks is Redis 7.0's evalShaCommand / evalGenericCommand).
    fn cmd_eval(&mut self, by_sha: bool, args: &[Vec<u8>], db: usize, now: i64) -> Reply {
        if by_sha && args[1].len() != 40 {
            return err(NOSCRIPT);
        }
        let Some(numkeys) = parse_i64(&args[2]) else {
            return err(NOT_INT);
        };
        if numkeys > args.len() as i64 - 3 {
            return err("ERR Number of keys can't be greater than number of args");
        }
        if numkeys < 0 {
            return err("ERR Number of keys can't be negative");
        }
        let index = if by_sha {
            match self.cached_by_sha(&args[1]) {
                Some(i) => i,
                None => return err(NOSCRIPT),
            }
        } else {
            match script_index(&args[1]) {
                // EVAL caches what it runs.
                Some(i) => {
                    self.cached[i] = true;
                    i
                }
                None => return unknown_script(),
            }
        };
        let split = 3 + numkeys as usize;
        let run = Run {
            sha: known_script(index).sha,
            db,
            now,
            keys: &args[3..split],
            argv: &args[split..],
        };
        let s = known_script(index);
        let result = if s == scripts::RELEASE {
            self.lua_release(&run)
        } else if s == scripts::RELEASE_LEAN {
            self.lua_release_lean(&run)
        } else if s == scripts::RELEASE_PLAIN {
            self.lua_release_plain(&run)
        } else if s == scripts::EXTEND {
            self.lua_extend(&run)
        } else if s == scripts::ACQUIRE_MANY {
            self.lua_acquire_many(&run)
        } else if s == scripts::ACQUIRE_WAIT {
            self.lua_acquire_wait(&run)
        } else if s == scripts::FENCE_DRAW {
            self.lua_fence_draw(&run)
        } else if s == scripts::FENCE_RAISE {
            self.lua_fence_raise(&run)
        } else if s == scripts::INSPECT {
            self.lua_inspect(&run)
        } else if s == scripts::FORCE_RELEASE {
            self.lua_force_release(&run)
        } else {
            return err("ERR simredis: a script of scripts::ALL has no native implementation");
        };
        match result {
            Ok(r) => r,
            Err(Raised(text)) => Reply::Error(text),
        }
    }

    // ----- pub/sub ----------------------------------------------------------------------------

    fn subscribe(&mut self, id: u32, ch: &[u8]) -> Reply {
        let Some(c) = self.conns.get_mut(&id) else {
            return Reply::Nil;
        };
        if !c.channels.iter().any(|x| x == ch) {
            c.channels.push(ch.to_vec());
            self.subscribers.entry(ch.to_vec()).or_default().push(id);
        }
        let count = self.conns[&id].channels.len() as i64;
        Reply::Array(vec![
            Reply::Bulk(b"subscribe".to_vec()),
            Reply::Bulk(ch.to_vec()),
            Reply::Int(count),
        ])
    }

    fn unsubscribe(&mut self, id: u32, ch: &[u8]) -> Reply {
        let Some(c) = self.conns.get_mut(&id) else {
            return Reply::Nil;
        };
        if let Some(pos) = c.channels.iter().position(|x| x == ch) {
            c.channels.remove(pos);
            if let Some(subs) = self.subscribers.get_mut(ch) {
                subs.retain(|&s| s != id);
                if subs.is_empty() {
                    self.subscribers.remove(ch);
                }
            }
        }
        let count = self.conns[&id].channels.len() as i64;
        Reply::Array(vec![
            Reply::Bulk(b"unsubscribe".to_vec()),
            Reply::Bulk(ch.to_vec()),
            Reply::Int(count),
        ])
    }

    /// `PUBLISH`: the message goes to every subscribed connection's output at once.
    fn publish(&mut self, ch: &[u8], payload: &[u8]) -> i64 {
        let subs = self.subscribers.get(ch).cloned().unwrap_or_default();
        let message = Reply::Array(vec![
            Reply::Bulk(b"message".to_vec()),
            Reply::Bulk(ch.to_vec()),
            Reply::Bulk(payload.to_vec()),
        ]);
        for &id in &subs {
            self.reply(id, &message);
        }
        if self.cfg.log_published {
            self.published.push(Published {
                channel: ch.to_vec(),
                payload: payload.to_vec(),
                receivers: subs.len(),
            });
        }
        subs.len() as i64
    }

    // ----- the keyspace -----------------------------------------------------------------------

    /// The live entry of `key` (an expired one is deleted first, as Redis' lazy expiry).
    fn lookup(&mut self, db: usize, key: &[u8], now: i64) -> Option<&mut Entry> {
        if self.dbs[db].get(key).is_some_and(|e| !alive(e, now)) {
            self.dbs[db].remove(key);
            self.signal_modified(key);
        }
        self.dbs[db].get_mut(key)
    }

    /// The data commands, shared by connections and scripts (`redis.call`). `args[0]` is
    /// the command name; the arity was checked.
    fn data(&mut self, db: usize, args: &[&[u8]], now: i64) -> Reply {
        let name = String::from_utf8_lossy(args[0]).to_ascii_lowercase();
        match name.as_str() {
            "get" => match self.lookup(db, args[1], now) {
                None => Reply::Nil,
                Some(Entry {
                    value: Value::Str(v),
                    ..
                }) => Reply::Bulk(v.clone()),
                Some(_) => err(WRONGTYPE),
            },
            "mget" => {
                let mut out = Vec::new();
                for k in &args[1..] {
                    out.push(match self.lookup(db, k, now) {
                        Some(Entry {
                            value: Value::Str(v),
                            ..
                        }) => Reply::Bulk(v.clone()),
                        _ => Reply::Nil,
                    });
                }
                Reply::Array(out)
            }
            "append" => match self.lookup(db, args[1], now) {
                // Appends keep the key's expiry.
                Some(Entry {
                    value: Value::Str(v),
                    ..
                }) => {
                    v.extend_from_slice(args[2]);
                    let n = v.len() as i64;
                    self.signal_modified(args[1]);
                    Reply::Int(n)
                }
                Some(_) => err(WRONGTYPE),
                None => {
                    let entry = Entry {
                        value: Value::Str(args[2].to_vec()),
                        expire_at: None,
                    };
                    self.dbs[db].insert(args[1].to_vec(), entry);
                    self.signal_modified(args[1]);
                    Reply::Int(args[2].len() as i64)
                }
            },
            "set" => self.cmd_set(db, args, now),
            "del" => {
                let mut n = 0;
                for k in &args[1..] {
                    if self.lookup(db, k, now).is_some() {
                        self.dbs[db].remove(*k);
                        self.signal_modified(k);
                        n += 1;
                    }
                }
                Reply::Int(n)
            }
            // Valkey 9's `DELIFEQ key value` (delifeqCommand): 1 when the key held
            // `value` and was deleted, 0 when it is missing or holds another string.
            "delifeq" => match self.lookup(db, args[1], now) {
                None => {
                    self.delifeq_answers[0] += 1;
                    Reply::Int(0)
                }
                Some(Entry {
                    value: Value::Str(v),
                    ..
                }) => {
                    if v.as_slice() != args[2] {
                        self.delifeq_answers[0] += 1;
                        return Reply::Int(0);
                    }
                    self.dbs[db].remove(args[1]);
                    self.signal_modified(args[1]);
                    self.delifeq_answers[1] += 1;
                    Reply::Int(1)
                }
                Some(_) => err(WRONGTYPE),
            },
            "exists" => {
                let mut n = 0;
                for k in &args[1..] {
                    n += self.lookup(db, k, now).is_some() as i64;
                }
                Reply::Int(n)
            }
            "pttl" => Reply::Int(match self.lookup(db, args[1], now) {
                None => -2,
                Some(e) => e.expire_at.map_or(-1, |at| (at - now).max(0)),
            }),
            "pexpire" => {
                if args.len() > 3 {
                    return err("ERR simredis: PEXPIRE options are not supported");
                }
                let Some(ms) = parse_i64(args[2]) else {
                    return err(NOT_INT);
                };
                let Some(at) = ms.checked_add(now) else {
                    return err("ERR invalid expire time in 'pexpire' command");
                };
                match self.lookup(db, args[1], now) {
                    None => Reply::Int(0),
                    Some(e) => {
                        if at <= now {
                            self.dbs[db].remove(args[1]);
                        } else {
                            e.expire_at = Some(at);
                        }
                        self.signal_modified(args[1]);
                        Reply::Int(1)
                    }
                }
            }
            "keys" => {
                let mut out = Vec::new();
                for (k, e) in &self.dbs[db] {
                    if alive(e, now) && glob(args[1], k, false) {
                        out.push(Reply::Bulk(k.clone()));
                    }
                }
                Reply::Array(out)
            }
            "dbsize" => Reply::Int(self.dbs[db].values().filter(|e| alive(e, now)).count() as i64),
            "flushall" => {
                if args.len() > 2 {
                    return err(SYNTAX);
                }
                for d in &mut self.dbs {
                    d.clear();
                }
                self.signal_flush();
                ok()
            }
            "publish" => Reply::Int(self.publish(args[1], args[2])),
            "zadd" => self.cmd_zadd(db, args, now),
            "zrem" => {
                let Some(e) = self.lookup(db, args[1], now) else {
                    return Reply::Int(0);
                };
                let Value::Zset(z) = &mut e.value else {
                    return err(WRONGTYPE);
                };
                let before = z.len();
                z.retain(|(_, m)| !args[2..].contains(&m.as_slice()));
                let removed = (before - z.len()) as i64;
                if z.is_empty() {
                    self.dbs[db].remove(args[1]);
                }
                Reply::Int(removed)
            }
            "zrange" => {
                let withscores = match args.len() {
                    4 => false,
                    5 if args[4].eq_ignore_ascii_case(b"withscores") => true,
                    _ => {
                        return err("ERR simredis: ZRANGE supports index ranges [WITHSCORES] only")
                    }
                };
                let (Some(start), Some(stop)) = (parse_i64(args[2]), parse_i64(args[3])) else {
                    return err(NOT_INT);
                };
                let z = match self.lookup(db, args[1], now) {
                    None => return Reply::Array(Vec::new()),
                    Some(Entry {
                        value: Value::Zset(z),
                        ..
                    }) => z,
                    Some(_) => return err(WRONGTYPE),
                };
                let len = z.len() as i64;
                let start = if start < 0 {
                    (len + start).max(0)
                } else {
                    start
                };
                let stop = if stop < 0 {
                    len + stop
                } else {
                    stop.min(len - 1)
                };
                let mut out = Vec::new();
                if start <= stop && start < len {
                    for (s, m) in &z[start as usize..=stop as usize] {
                        out.push(Reply::Bulk(m.clone()));
                        if withscores {
                            out.push(Reply::Bulk(fmt_g17(*s).into_bytes()));
                        }
                    }
                }
                Reply::Array(out)
            }
            "zscore" => match self.lookup(db, args[1], now) {
                None => Reply::Nil,
                Some(Entry {
                    value: Value::Zset(z),
                    ..
                }) => z
                    .iter()
                    .find(|(_, m)| m.as_slice() == args[2])
                    .map_or(Reply::Nil, |(s, _)| Reply::Bulk(fmt_g17(*s).into_bytes())),
                Some(_) => err(WRONGTYPE),
            },
            "zrank" => match self.lookup(db, args[1], now) {
                None => Reply::Nil,
                Some(Entry {
                    value: Value::Zset(z),
                    ..
                }) => z
                    .iter()
                    .position(|(_, m)| m.as_slice() == args[2])
                    .map_or(Reply::Nil, |i| Reply::Int(i as i64)),
                Some(_) => err(WRONGTYPE),
            },
            "time" => Reply::Array(vec![
                Reply::Bulk(now.div_euclid(1000).to_string().into_bytes()),
                Reply::Bulk((now.rem_euclid(1000) * 1000).to_string().into_bytes()),
            ]),
            "zcard" => match self.lookup(db, args[1], now) {
                None => Reply::Int(0),
                Some(Entry {
                    value: Value::Zset(z),
                    ..
                }) => Reply::Int(z.len() as i64),
                Some(_) => err(WRONGTYPE),
            },
            _ => Reply::Error(unknown_command(
                &args.iter().map(|a| a.to_vec()).collect::<Vec<_>>(),
            )),
        }
    }

    /// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`, checked in Redis
    /// 7.0's order (parseExtendedStringArgumentsOrReply, getExpireMillisecondsOrReply,
    /// setGenericCommand).
    fn cmd_set(&mut self, db: usize, args: &[&[u8]], now: i64) -> Reply {
        #[derive(PartialEq, Clone, Copy)]
        enum Unit {
            Ex,
            Px,
            ExAt,
            PxAt,
        }
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut expire: Option<(Unit, &[u8])> = None;
        let mut j = 3;
        while j < args.len() {
            let opt = args[j].to_ascii_lowercase();
            let next = args.get(j + 1).copied();
            let unit = match opt.as_slice() {
                b"ex" => Some(Unit::Ex),
                b"px" => Some(Unit::Px),
                b"exat" => Some(Unit::ExAt),
                b"pxat" => Some(Unit::PxAt),
                _ => None,
            };
            if opt == b"nx" && !xx {
                nx = true;
            } else if opt == b"xx" && !nx {
                xx = true;
            } else if opt == b"get" {
                get = true;
            } else if opt == b"keepttl" && expire.is_none() {
                keepttl = true;
            } else if let (Some(u), Some(v)) = (unit, next) {
                // One kind of expiry only; the same kind twice: the last wins.
                if keepttl || expire.is_some_and(|(e, _)| e != u) {
                    return err(SYNTAX);
                }
                expire = Some((u, v));
                j += 1;
            } else {
                return err(SYNTAX);
            }
            j += 1;
        }
        let mut expire_at = None;
        if let Some((unit, v)) = expire {
            let Some(n) = parse_i64(v) else {
                return err(NOT_INT);
            };
            let secs = matches!(unit, Unit::Ex | Unit::ExAt);
            if n <= 0 || (secs && n > i64::MAX / 1000) {
                return err("ERR invalid expire time in 'set' command");
            }
            let ms = if secs { n * 1000 } else { n };
            let at = match unit {
                Unit::Ex | Unit::Px => ms.checked_add(now),
                Unit::ExAt | Unit::PxAt => Some(ms),
            };
            match at {
                Some(at) if at > 0 => expire_at = Some(at),
                _ => return err("ERR invalid expire time in 'set' command"),
            }
        }
        let old = self.lookup(db, args[1], now).map(|e| e.clone());
        let mut reply = ok();
        if get {
            reply = match &old {
                None => Reply::Nil,
                Some(Entry {
                    value: Value::Str(v),
                    ..
                }) => Reply::Bulk(v.clone()),
                Some(_) => return err(WRONGTYPE),
            };
        }
        if (nx && old.is_some()) || (xx && old.is_none()) {
            return if get { reply } else { Reply::Nil };
        }
        if keepttl {
            expire_at = old.and_then(|e| e.expire_at);
        }
        self.dbs[db].insert(
            args[1].to_vec(),
            Entry {
                value: Value::Str(args[2].to_vec()),
                expire_at,
            },
        );
        self.signal_modified(args[1]);
        reply
    }

    /// `ZADD key [NX|XX] [CH] score member [score member ...]`.
    fn cmd_zadd(&mut self, db: usize, args: &[&[u8]], now: i64) -> Reply {
        let (mut nx, mut xx, mut ch) = (false, false, false);
        let mut i = 2;
        while i < args.len() {
            match args[i].to_ascii_lowercase().as_slice() {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"ch" => ch = true,
                b"gt" | b"lt" | b"incr" => {
                    return err("ERR simredis: ZADD GT/LT/INCR are not supported")
                }
                _ => break,
            }
            i += 1;
        }
        let rest = &args[i..];
        if rest.is_empty() || rest.len() % 2 != 0 {
            return err(SYNTAX);
        }
        if nx && xx {
            return err("ERR XX and NX options at the same time are not compatible");
        }
        let mut pairs = Vec::new();
        for p in rest.chunks(2) {
            match redis_double(p[0]) {
                Some(s) => pairs.push((s, p[1].to_vec())),
                None => return err(NOT_FLOAT),
            }
        }
        match self.lookup(db, args[1], now) {
            Some(Entry {
                value: Value::Zset(_),
                ..
            }) => {}
            Some(_) => return err(WRONGTYPE),
            None if xx => return Reply::Int(0),
            None => {
                self.dbs[db].insert(
                    args[1].to_vec(),
                    Entry {
                        value: Value::Zset(Vec::new()),
                        expire_at: None,
                    },
                );
            }
        }
        let Some(Entry {
            value: Value::Zset(z),
            ..
        }) = self.dbs[db].get_mut(args[1])
        else {
            return err("ERR simredis: lost a sorted set");
        };
        let (mut added, mut changed) = (0, 0);
        for (score, member) in pairs {
            match z.iter().position(|(_, m)| *m == member) {
                Some(pos) => {
                    if nx {
                        continue;
                    }
                    if z[pos].0 != score {
                        z.remove(pos);
                        insert_sorted(z, score, member);
                        changed += 1;
                    }
                }
                None => {
                    if xx {
                        continue;
                    }
                    insert_sorted(z, score, member);
                    added += 1;
                }
            }
        }
        if z.is_empty() {
            self.dbs[db].remove(args[1]);
        }
        Reply::Int(if ch { added + changed } else { added })
    }

    // ----- redis.call / redis.pcall -----------------------------------------------------------

    /// `redis.pcall(...)` from a script: the reply, errors included as values. A nil
    /// argument is an error value too (Redis 7.0's argument conversion).
    fn pcall(&mut self, run: &Run<'_>, args: &[Option<&[u8]>]) -> Reply {
        let Some(args) = args.iter().copied().collect::<Option<Vec<&[u8]>>>() else {
            return err(LUA_BAD_ARG);
        };
        let Some(command) = COMMANDS
            .iter()
            .find(|c| args[0].eq_ignore_ascii_case(c.name.as_bytes()))
        else {
            return err("ERR Unknown Redis command called from script");
        };
        let n = args.len() as i32;
        if (command.arity > 0 && n != command.arity) || n < -command.arity {
            return err("ERR Wrong number of args calling Redis command from script");
        }
        if let (Some(role), Some(&key), true) =
            (&self.cluster, args.get(1), command_has_key(args[0]))
        {
            let here = self.pttl(0, key, run.now as u64) != -2;
            let first = run.keys.first().map(Vec::as_slice);
            let strict = known_scripts().any(|s| s.sha == run.sha && s.src.starts_with("#!"));
            if let Some(e) = role.script_key(key, here, first, strict) {
                return err(e);
            }
        }
        let r = self.data(run.db, &args, run.now);
        self.remember_reads(&args);
        r
    }

    /// `redis.call(...)` on Lua line `line`: an error ends the script with Redis 7.0's
    /// text (`<error> script: <sha>, on @user_script:<line>.`).
    fn call(&mut self, run: &Run<'_>, line: u32, args: &[Option<&[u8]>]) -> Result<Reply, Raised> {
        match self.pcall(run, args) {
            Reply::Error(e) => {
                let mut text = e;
                text.extend_from_slice(
                    format!(" script: {}, on @user_script:{line}.", run.sha).as_bytes(),
                );
                Err(Raised(text))
            }
            r => Ok(r),
        }
    }

    // ----- the scripts --------------------------------------------------------------------------
    //
    // One function per script of src/scripts.rs. `// Ln:` quotes line n of the Lua source.
    // Lua values: a Redis bulk reply is a string, a nil reply is `false`, an integer reply
    // a number, an array/status/error reply a table.

    /// `scripts::RELEASE`.
    /// `scripts::RELEASE_PLAIN`: the compare-and-delete alone.
    fn lua_release_plain(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local held = 1
        let mut held = 1;
        // L3: for i = 1, #KEYS do
        for i in 1..=x.nkeys() {
            let key = x.key(i as f64);
            // L4: local v = redis.call('get', KEYS[i])
            let v = self.call(x, 4, &[Some(b"get"), key])?;
            // L5: if v == ARGV[1] or v == ARGV[1] .. '+' then
            if lua_eq(&v, x.arg(1)) || lua_eq(&v, Some(&lua_concat(x, 5, x.arg(1), b"+")?)) {
                // L6: redis.call('del', KEYS[i])
                self.call(x, 6, &[Some(b"del"), key])?;
            } else {
                // L8: held = 0
                held = 0;
            }
        }
        // L11: return held
        Ok(Reply::Int(held))
    }

    fn lua_release(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local n = #KEYS / 3   (a Lua number: fractional unless #KEYS is a multiple of 3)
        let n = x.nkeys() as f64 / 3.0;
        // L3: local held = 1
        let mut held = 1;
        // L4: local now
        let mut now: Option<f64> = None;
        // L5: for i = 1, n do
        let mut i = 1.0;
        while i <= n {
            // L6: local k, q, a = KEYS[i], KEYS[n + i], KEYS[2 * n + i]
            let (key, q, a) = (x.key(i), x.key(n + i), x.key(2.0 * n + i));
            // L7: local v = redis.call('get', k)
            let v = self.call(x, 7, &[Some(b"get"), key])?;
            // L8: if ARGV[2] and v ~= ARGV[1] then
            if let Some(id) = x.arg(2) {
                if !lua_eq(&v, x.arg(1)) {
                    // L9: redis.pcall('zrem', q, ARGV[2])
                    self.pcall(x, &[Some(b"zrem"), q, Some(id)]);
                    // L10: redis.pcall('zrem', a, ARGV[2])
                    self.pcall(x, &[Some(b"zrem"), a, Some(id)]);
                }
            }
            // L12: if v == ARGV[1] then
            if lua_eq(&v, x.arg(1)) {
                // L13: redis.call('del', k)
                self.call(x, 13, &[Some(b"del"), key])?;
            // L14: elseif v == ARGV[1] .. '+' then
            } else if lua_eq(&v, Some(&lua_concat(x, 14, x.arg(1), b"+")?)) {
                // L15: redis.call('del', k)
                self.call(x, 15, &[Some(b"del"), key])?;
                // L16-L35: `announce_release!()`.
                self.lua_announce(x, key, q, a, &mut now, 16)?;
            } else {
                // L37: held = 0
                held = 0;
            }
            i += 1.0;
        }
        // L40: return held
        Ok(Reply::Int(held))
    }

    /// `scripts::RELEASE_LEAN`: `scripts::RELEASE` given the lock keys alone, the lines
    /// named after each key.
    fn lua_release_lean(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local held = 1
        let mut held = 1;
        // L3: local now
        let mut now: Option<f64> = None;
        // L4: for i = 1, #KEYS do
        for i in 1..=x.nkeys() {
            // L5: local k = KEYS[i]
            let key = x.key(i as f64);
            // L6: local v = redis.call('get', k)
            let v = self.call(x, 6, &[Some(b"get"), key])?;
            // L7: if v == ARGV[1] then
            if lua_eq(&v, x.arg(1)) {
                // L8: redis.call('del', k)
                self.call(x, 8, &[Some(b"del"), key])?;
            // L9: elseif v == ARGV[1] .. '+' then
            } else if lua_eq(&v, Some(&lua_concat(x, 9, x.arg(1), b"+")?)) {
                // L10: redis.call('del', k)
                self.call(x, 10, &[Some(b"del"), key])?;
                // L11: local q, a = 'redlock-mux:{' .. k .. '}:queue', 'redlock-mux:{' .. k .. '}:alive'
                // (k is a string: KEYS[i] with i <= #KEYS.)
                let k = key.unwrap_or_default();
                let q = [b"redlock-mux:{".as_slice(), k, b"}:queue"].concat();
                let a = [b"redlock-mux:{".as_slice(), k, b"}:alive"].concat();
                let (q, a) = (Some(q.as_slice()), Some(a.as_slice()));
                // L12-L31: `announce_release!()`.
                self.lua_announce(x, Some(k), q, a, &mut now, 12)?;
            } else {
                // L33: held = 0
                held = 0;
            }
        }
        // L36: return held
        Ok(Reply::Int(held))
    }

    /// `announce_release!()` of `scripts::RELEASE` and `scripts::RELEASE_LEAN`, from its
    /// first line `at` (`local turn`): the first live waiter in line `q` (liveness `a`) is
    /// named on its client's channel, else `k`'s channel hears the release.
    fn lua_announce(
        &mut self,
        x: &Run<'_>,
        key: Option<&[u8]>,
        q: Option<&[u8]>,
        a: Option<&[u8]>,
        now: &mut Option<f64>,
        at: u32,
    ) -> Result<(), Raised> {
        // +0: local turn
        let mut turn: Option<Vec<u8>> = None;
        // +1: for _ = 1, 8 do
        for _ in 1..=8 {
            // +2: local r = redis.pcall('zrange', q, 0, 0)
            let r = self.pcall(x, &[Some(b"zrange"), q, Some(b"0"), Some(b"0")]);
            // +3: local h = type(r) == 'table' and r[1]
            // +4: if not h then break end
            let Some(h) = first_string(&r) else {
                break;
            };
            // +5: if not now then local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000) end
            let t = match *now {
                Some(t) => t,
                None => *now.insert(self.lua_time(x, at + 5)?),
            };
            // +6: local d = tonumber(redis.pcall('zscore', a, h))
            let d = lua_tonumber_reply(&self.pcall(x, &[Some(b"zscore"), a, Some(&h)]));
            // +7: if d and d >= now then
            if d.is_some_and(|d| d >= t) {
                // +8: turn = h
                // +9: break
                turn = Some(h);
                break;
            }
            // +11: redis.pcall('zrem', q, h)
            self.pcall(x, &[Some(b"zrem"), q, Some(&h)]);
            // +12: redis.pcall('zrem', a, h)
            self.pcall(x, &[Some(b"zrem"), a, Some(&h)]);
        }
        // +14: local note = string.sub(ARGV[1], 1, 16)
        // (ARGV[1] is a string here: it equalled a value.)
        let note = lua_sub(x.arg(1).unwrap_or_default(), 1, 16);
        match turn {
            // +15: if turn then
            // +16: redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)
            Some(turn) => {
                let channel = cat(b"redlock-mux:next:", lua_sub(&turn, 1, 8));
                let payload = cat(note, &turn);
                self.pcall(x, &[Some(b"publish"), Some(&channel), Some(&payload)]);
            }
            // +18: redis.pcall('publish', 'redlock-mux:released:' .. k, note)
            None => {
                let Some(k) = key else {
                    return Err(lua_concat_nil(x, at + 18, "k"));
                };
                let channel = cat(b"redlock-mux:released:", k);
                self.pcall(x, &[Some(b"publish"), Some(&channel), Some(note)]);
            }
        }
        Ok(())
    }

    /// `local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000)` on Lua
    /// line `line`: the server's clock in ms.
    fn lua_time(&mut self, x: &Run<'_>, line: u32) -> Result<f64, Raised> {
        match self.call(x, line, &[Some(b"time")])? {
            Reply::Array(t) => match (t.first(), t.get(1)) {
                (Some(Reply::Bulk(s)), Some(Reply::Bulk(us))) => {
                    let (s, us) = (
                        lua_tonumber(s).unwrap_or_default(),
                        lua_tonumber(us).unwrap_or_default(),
                    );
                    Ok(s * 1000.0 + (us / 1000.0).floor())
                }
                _ => unreachable!("TIME answers two strings"),
            },
            _ => unreachable!("TIME answers an array"),
        }
    }

    /// `scripts::EXTEND`.
    fn lua_extend(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local gone = false
        let mut gone = false;
        // L3: for i = 1, #KEYS do
        for i in 1..=x.nkeys() {
            // L4: local v = redis.call('get', KEYS[i])
            let v = self.call(x, 4, &[Some(b"get"), x.key(i as f64)])?;
            // L5: if not v then gone = true
            if matches!(v, Reply::Nil) {
                gone = true;
            // L6: elseif v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end
            } else if !lua_holds(x, 6, &v)? {
                return Ok(Reply::Int(0));
            }
        }
        // L8: local ttl = tonumber(ARGV[2])
        let ttl = x.arg(2).and_then(lua_tonumber);
        // L9: for i = 1, #KEYS do
        for i in 1..=x.nkeys() {
            let key = x.key(i as f64);
            // L10: local left = redis.call('pttl', KEYS[i])
            let left = lua_number(&self.call(x, 10, &[Some(b"pttl"), key])?);
            // L11: if left == -2 then
            if left == Some(-2.0) {
                // L12: if ARGV[3] == 'put' then redis.call('set', KEYS[i], ARGV[1], 'PX', ttl) end
                if x.arg(3) == Some(&b"put"[..]) {
                    let ms = ttl.map(lua_num_arg);
                    self.call(
                        x,
                        12,
                        &[Some(b"set"), key, x.arg(1), Some(b"PX"), ms.as_deref()],
                    )?;
                }
            // L13: elseif left < ttl then redis.call('pexpire', KEYS[i], ttl) end
            } else if lua_lt(x, 13, left, ttl)? {
                let ms = lua_num_arg(ttl.unwrap_or_default());
                self.call(x, 13, &[Some(b"pexpire"), key, Some(&ms)])?;
            }
        }
        // L15: if gone then return 2 end
        if gone {
            return Ok(Reply::Int(2));
        }
        // L16: return 1
        Ok(Reply::Int(1))
    }

    /// ACQUIRE_WAIT's `alive()` (L29-L31): the waiter is alive until `ARGV[4]` ms from now
    /// (the server's clock) in the liveness set `a`.
    fn lua_alive(
        &mut self,
        x: &Run<'_>,
        a: Option<&[u8]>,
        id: &[u8],
        now: &mut Option<f64>,
    ) -> Result<(), Raised> {
        // L30: redis.pcall('zadd', a, clock() + tonumber(ARGV[4]), id)
        let t = self.lua_clock(x, now)?;
        let Some(ms) = x.arg(4).and_then(lua_tonumber) else {
            return Err(Raised(
                format!(
                    "ERR user_script:30: attempt to perform arithmetic on a nil value script: {}, on @user_script:30.",
                    x.sha
                )
                .into_bytes(),
            ));
        };
        let score = lua_num_arg(t + ms);
        self.pcall(x, &[Some(b"zadd"), a, Some(&score), Some(id)]);
        Ok(())
    }

    /// ACQUIRE_WAIT's `clock()` (L19-L22): `TIME` once per run, in ms.
    fn lua_clock(&mut self, x: &Run<'_>, now: &mut Option<f64>) -> Result<f64, Raised> {
        // L20: if not now then local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000) end
        // L21: return now
        match *now {
            Some(t) => Ok(t),
            None => Ok(*now.insert(self.lua_time(x, 20)?)),
        }
    }

    /// ACQUIRE_WAIT's `keep()` (L23-L28): lengthen the line's and the liveness set's expiry
    /// to this waiter's liveness, never shorten them.
    fn lua_keep(&mut self, x: &Run<'_>, q: Option<&[u8]>, a: Option<&[u8]>) -> Result<(), Raised> {
        // L24: if redis.pcall('pttl', q) < tonumber(ARGV[4]) then
        let pttl = self.pcall(x, &[Some(b"pttl"), q]);
        let limit = x.arg(4).and_then(lua_tonumber);
        let below = match pttl {
            Reply::Int(n) => lua_lt(x, 24, Some(n as f64), limit)?,
            // An error table compared with a number (or nil) raises.
            _ => {
                let ty = if limit.is_some() { "number" } else { "nil" };
                return Err(Raised(
                    format!(
                        "ERR user_script:24: attempt to compare table with {ty} script: {}, on @user_script:24.",
                        x.sha
                    )
                    .into_bytes(),
                ));
            }
        };
        if below {
            // L25: redis.pcall('pexpire', q, ARGV[4])
            self.pcall(x, &[Some(b"pexpire"), q, x.arg(4)]);
            // L26: redis.pcall('pexpire', a, ARGV[4])
            self.pcall(x, &[Some(b"pexpire"), a, x.arg(4)]);
        }
        Ok(())
    }

    /// `scripts::ACQUIRE_MANY`.
    fn lua_acquire_many(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: for i = 1, #KEYS do
        for i in 1..=x.nkeys() {
            // L3: if redis.call('exists', KEYS[i]) == 1 then return 0 end
            if self.call(x, 3, &[Some(b"exists"), x.key(i as f64)])? == Reply::Int(1) {
                return Ok(Reply::Int(0));
            }
        }
        // L5: for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
        for i in 1..=x.nkeys() {
            let args = [
                Some(&b"set"[..]),
                x.key(i as f64),
                x.arg(1),
                Some(b"PX"),
                x.arg(2),
            ];
            self.call(x, 5, &args)?;
        }
        // L6: return 1
        Ok(Reply::Int(1))
    }

    /// `scripts::ACQUIRE_WAIT`.
    fn lua_acquire_wait(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2-L8: local function mark(k) ... end   (see `lua_mark`)
        // L9: if ARGV[3] or #KEYS == 1 then
        if x.arg(3).is_some() || x.nkeys() == 1 {
            let key = x.key(1.0);
            // L10: local id = ARGV[3]
            let id = x.arg(3);
            // L11: local q, a = KEYS[2], KEYS[3]
            let (q, a) = (x.key(2.0), x.key(3.0));
            // L12: local how = ARGV[7]
            let how = x.arg(7);
            // L13: local out = how == 'o'
            let out = how == Some(b"o");
            // L14: if id and out then
            if let (Some(id), true) = (id, out) {
                // L15: redis.pcall('zrem', q, id)
                self.pcall(x, &[Some(b"zrem"), q, Some(id)]);
                // L16: redis.pcall('zrem', a, id)
                self.pcall(x, &[Some(b"zrem"), a, Some(id)]);
            }
            // L18: local now
            let mut now: Option<f64> = None;
            // L19-L22: local function clock() ... end   (see `lua_clock`)
            // L23-L28: local function keep() ... end   (see `lua_keep`)
            // L29-L31: local function alive() ... end   (see `lua_alive`)
            // L32: local v, inq = false, false
            // (`v`: `None` is Lua's `false`, the key not read; else what GET answered.)
            let mut v: Option<Reply> = None;
            let mut inq = false;
            // L33: if how == 'h' and ARGV[5] ~= 'p' then v = redis.pcall('get', KEYS[1]) end
            if how == Some(b"h") && x.arg(5) != Some(b"p") {
                // A nil reply is Lua's `false`: as if not read.
                v = Some(self.pcall(x, &[Some(b"get"), key])).filter(|r| *r != Reply::Nil);
            }
            // L34: if not v then
            if v.is_none() {
                // L35: if id and how == 'l' then inq = type(redis.pcall('zrank', q, id)) == 'number' end
                if let (Some(id), true) = (id, how == Some(b"l")) {
                    inq = matches!(self.pcall(x, &[Some(b"zrank"), q, Some(id)]), Reply::Int(_));
                }
                // L36: local lined = inq or (id and redis.pcall('exists', q) == 1)
                let lined =
                    inq || (id.is_some() && self.pcall(x, &[Some(b"exists"), q]) == Reply::Int(1));
                // L37: local behind = false
                let mut behind = false;
                // L38: if lined and ARGV[5] == 'p' then
                if lined && x.arg(5) == Some(b"p") {
                    // L39: for _ = 1, 8 do
                    for _ in 1..=8 {
                        // L40: local r = redis.pcall('zrange', q, 0, 0)
                        let r = self.pcall(x, &[Some(b"zrange"), q, Some(b"0"), Some(b"0")]);
                        // L41: local h = type(r) == 'table' and r[1]
                        // L42: if not h or h == id then break end
                        let h = match first_string(&r) {
                            Some(h) if Some(h.as_slice()) != id => h,
                            _ => break,
                        };
                        // L43: local d = tonumber(redis.pcall('zscore', a, h))
                        let d = lua_tonumber_reply(&self.pcall(x, &[Some(b"zscore"), a, Some(&h)]));
                        // L44: if d and d >= clock() then
                        let live = match d {
                            Some(d) => d >= self.lua_clock(x, &mut now)?,
                            None => false,
                        };
                        if live {
                            // L45: behind = true if redis.pcall('exists', KEYS[1]) == 0 then
                            //   redis.pcall('publish', 'redlock-mux:next:' .. string.sub(h, 1, 8),
                            //   string.sub(ARGV[1], 1, 16) .. h) end
                            behind = true;
                            if self.pcall(x, &[Some(b"exists"), key]) == Reply::Int(0) {
                                let channel = cat(b"redlock-mux:next:", lua_sub(&h, 1, 8));
                                let note = lua_sub(x.arg(1).unwrap_or_default(), 1, 16);
                                let payload = cat(note, &h);
                                self.pcall(x, &[Some(b"publish"), Some(&channel), Some(&payload)]);
                            }
                            // L46: break
                            break;
                        }
                        // L48: redis.pcall('zrem', q, h)
                        self.pcall(x, &[Some(b"zrem"), q, Some(&h)]);
                        // L49: redis.pcall('zrem', a, h)
                        self.pcall(x, &[Some(b"zrem"), a, Some(&h)]);
                    }
                }
                // L52: local val = ARGV[1]
                // L53: if lined then val = val .. '+' end
                let val: Option<Vec<u8>> = if lined {
                    match x.arg(1) {
                        Some(t) => Some(cat(t, b"+")),
                        None => {
                            return Err(Raised(
                                format!(
                                    "ERR user_script:53: attempt to concatenate local 'val' (a nil value) script: {}, on @user_script:53.",
                                    x.sha
                                )
                                .into_bytes(),
                            ))
                        }
                    }
                } else {
                    x.arg(1).map(<[u8]>::to_vec)
                };
                // L54: if not behind and redis.call('set', KEYS[1], val, 'NX', 'PX', ARGV[2]) then
                if !behind {
                    let args = [
                        Some(&b"set"[..]),
                        key,
                        val.as_deref(),
                        Some(b"NX"),
                        Some(b"PX"),
                        x.arg(2),
                    ];
                    if self.call(x, 54, &args)? != Reply::Nil {
                        // L55: if lined and not out then
                        if let (Some(id), true, false) = (id, lined, out) {
                            // L56: if not inq then redis.pcall('zadd', q, 'NX', ARGV[6], id) end
                            if !inq {
                                self.pcall(x, &[Some(b"zadd"), q, Some(b"NX"), x.arg(6), Some(id)]);
                            }
                            // L57: alive()
                            self.lua_alive(x, a, id, &mut now)?;
                            // L58: keep()
                            self.lua_keep(x, q, a)?;
                        }
                        // L60: return 0
                        return Ok(Reply::Int(0));
                    }
                }
            }
            // L63: if id and not out then
            if let (Some(id), false) = (id, out) {
                // L64: if not inq then redis.pcall('zadd', q, 'NX', ARGV[6], id) end
                if !inq {
                    self.pcall(x, &[Some(b"zadd"), q, Some(b"NX"), x.arg(6), Some(id)]);
                }
                // L65: alive()
                self.lua_alive(x, a, id, &mut now)?;
                // L66: keep()
                self.lua_keep(x, q, a)?;
            }
            // L68: local left = redis.call('pttl', KEYS[1])
            let mut left = match self.call(x, 68, &[Some(b"pttl"), key])? {
                Reply::Int(n) => n,
                _ => 0,
            };
            // L69: if left == -2 then left = -1 elseif left == 0 then left = 1 end
            if left == -2 {
                left = -1;
            } else if left == 0 {
                left = 1;
            }
            let v = match v {
                // L70: if not v then
                // L71: if id then v = mark(KEYS[1]) else v = redis.pcall('get', KEYS[1]) end
                None if id.is_some() => self.lua_mark(x, key),
                None => self.pcall(x, &[Some(b"get"), key]),
                // L72: elseif id and type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then
                Some(v) => {
                    if id.is_some() && is_token(&v) {
                        // L73: redis.pcall('append', KEYS[1], '+')
                        self.pcall(x, &[Some(b"append"), key, Some(b"+")]);
                    }
                    v
                }
            };
            // L75: if type(v) ~= 'string' then v = '' end
            let v = match v {
                Reply::Bulk(v) => v,
                _ => Vec::new(),
            };
            // L76: return {left, string.sub(v, 1, 16)}
            return Ok(Reply::Array(vec![
                Reply::Int(left),
                Reply::Bulk(lua_sub(&v, 1, 16).to_vec()),
            ]));
        }
        // L78: local left = 0
        let mut left: i64 = 0;
        // L79: for i = 1, #KEYS do
        for i in 1..=x.nkeys() {
            // L80: local t = redis.call('pttl', KEYS[i])
            let t = match self.call(x, 80, &[Some(b"pttl"), x.key(i as f64)])? {
                Reply::Int(n) => n,
                _ => 0,
            };
            // L81: if t == -1 then left = -1
            // L82: elseif t >= 0 and left >= 0 then left = math.max(left, t, 1) end
            if t == -1 {
                left = -1;
            } else if t >= 0 && left >= 0 {
                left = left.max(t).max(1);
            }
        }
        // L84: if left ~= 0 then
        if left != 0 {
            // L85: for i = 1, #KEYS do mark(KEYS[i]) end
            for i in 1..=x.nkeys() {
                self.lua_mark(x, x.key(i as f64));
            }
            // L86: return left
            return Ok(Reply::Int(left));
        }
        // L88: for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
        for i in 1..=x.nkeys() {
            let args = [
                Some(&b"set"[..]),
                x.key(i as f64),
                x.arg(1),
                Some(b"PX"),
                x.arg(2),
            ];
            self.call(x, 88, &args)?;
        }
        // L89: return 0
        Ok(Reply::Int(0))
    }

    /// ACQUIRE_WAIT's `mark(k)` (L2-L8): a key held with one of our tokens, unmarked, gets
    /// the waiter's mark; the value read is the answer.
    fn lua_mark(&mut self, x: &Run<'_>, k: Option<&[u8]>) -> Reply {
        // L3: local v = redis.pcall('get', k)
        let v = self.pcall(x, &[Some(b"get"), k]);
        // L4: if type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then
        if is_token(&v) {
            // L5: redis.pcall('append', k, '+')
            self.pcall(x, &[Some(b"append"), k, Some(b"+")]);
        }
        // L7: return v
        v
    }

    /// `for i = 1, n do` (line `line`): a limit that is not a number raises.
    fn lua_for_limit(x: &Run<'_>, line: u32, n: Option<f64>) -> Result<f64, Raised> {
        n.ok_or_else(|| {
            Raised(
                format!(
                    "ERR user_script:{line}: 'for' limit must be a number script: {}, on @user_script:{line}.",
                    x.sha
                )
                .into_bytes(),
            )
        })
    }

    /// `scripts::FENCE_DRAW`.
    fn lua_fence_draw(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local n = tonumber(ARGV[2])
        // L3: for i = 1, n do
        let n = Self::lua_for_limit(x, 3, x.arg(2).and_then(lua_tonumber))?;
        let mut i = 1.0;
        while i <= n {
            // L4: local v = redis.call('get', KEYS[i])
            let v = self.call(x, 4, &[Some(b"get"), x.key(i)])?;
            // L5: if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end
            if !lua_holds(x, 5, &v)? {
                return Ok(Reply::Int(0));
            }
            i += 1.0;
        }
        // L7: local top = 0
        let mut top = 0.0;
        // L8: for i = n + 1, #KEYS do
        let mut i = n + 1.0;
        while i <= x.nkeys() as f64 {
            // L9: local c = tonumber(redis.call('get', KEYS[i]) or '0')
            let c = match self.call(x, 9, &[Some(b"get"), x.key(i)])? {
                Reply::Bulk(v) => lua_tonumber(&v),
                _ => lua_tonumber(b"0"),
            };
            // L10: if c > top then top = c end   (Lua evaluates `top < c`)
            if lua_lt(x, 10, Some(top), c)? {
                top = c.unwrap_or_default();
            }
            i += 1.0;
        }
        // L12: return top + 1   (a Lua number; Redis replies with its integer part)
        Ok(Reply::Int((top + 1.0) as i64))
    }

    /// `scripts::FENCE_RAISE`.
    fn lua_fence_raise(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local n = tonumber(ARGV[3])
        // L3: for i = 1, n do
        let n = Self::lua_for_limit(x, 3, x.arg(3).and_then(lua_tonumber))?;
        let mut i = 1.0;
        while i <= n {
            // L4: local v = redis.call('get', KEYS[i])
            let v = self.call(x, 4, &[Some(b"get"), x.key(i)])?;
            // L5: if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end
            if !lua_holds(x, 5, &v)? {
                return Ok(Reply::Int(0));
            }
            i += 1.0;
        }
        // L7: for i = 1, n do
        let mut i = 1.0;
        while i <= n {
            // L8: local t, s = tonumber(ARGV[2]), ARGV[2]
            let (mut t, mut s) = (
                x.arg(2).and_then(lua_tonumber),
                x.arg(2).map(<[u8]>::to_vec),
            );
            // L9: local old = KEYS[2 * n + i]
            // L10: if old then
            if let Some(old) = x.key(2.0 * n + i) {
                // L11: local o = redis.call('get', old)
                // L12: if o then
                if let Reply::Bulk(o) = self.call(x, 11, &[Some(b"get"), Some(old)])? {
                    // L13: if tonumber(o) > t then t, s = tonumber(o), o end   (Lua: `t < o`)
                    let on = lua_tonumber(&o);
                    if lua_lt(x, 13, t, on)? {
                        (t, s) = (on, Some(o));
                    }
                    // L14: redis.call('del', old)
                    self.call(x, 14, &[Some(b"del"), Some(old)])?;
                }
            }
            // L17: if tonumber(redis.call('get', KEYS[n + i]) or '0') < t then redis.call('set', KEYS[n + i], s) end
            let c = match self.call(x, 17, &[Some(b"get"), x.key(n + i)])? {
                Reply::Bulk(v) => lua_tonumber(&v),
                _ => lua_tonumber(b"0"),
            };
            if lua_lt(x, 17, c, t)? {
                self.call(x, 17, &[Some(b"set"), x.key(n + i), s.as_deref()])?;
            }
            i += 1.0;
        }
        // L19: return 1
        Ok(Reply::Int(1))
    }

    /// `scripts::INSPECT`.
    fn lua_inspect(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        // L2: local v = redis.pcall('get', KEYS[1])
        let got = self.pcall(x, &[Some(b"get"), x.key(1.0)]);
        // L3: local kind = 'string'
        // L4: if not v then kind = 'none' v = ''
        // L5: elseif type(v) ~= 'string' then kind = 'other' v = '' end
        let (kind, v): (&[u8], Vec<u8>) = match got {
            Reply::Nil => (b"none", Vec::new()),
            Reply::Bulk(v) => (b"string", v),
            _ => (b"other", Vec::new()),
        };
        // L6: local lock, marked = 0, 0
        let (mut lock, mut marked) = (0, 0);
        // L7: local body = v
        let mut body: &[u8] = &v;
        // L8: if #v == 33 and string.sub(v, 33) == '+' then body = string.sub(v, 1, 32) marked = 1 end
        if v.len() == 33 && lua_sub(&v, 33, 33) == b"+" {
            body = lua_sub(&v, 1, 32);
            marked = 1;
        }
        // L9: if #body == 32 and not string.find(body, '[^0-9a-f]') then lock = 1 else marked = 0 end
        if body.len() == 32
            && body
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            lock = 1;
        } else {
            marked = 0;
        }
        // L10: local n = redis.pcall('zcard', KEYS[2])
        let n = self.pcall(x, &[Some(b"zcard"), x.key(2.0)]);
        // L11: local ids, alive = {}, {}
        let (mut ids, mut alive) = (Vec::new(), Vec::new());
        // L12: if type(n) ~= 'number' then n = 0 end
        let n = lua_number(&n).unwrap_or(0.0);
        // L13: if n > 0 then
        if n > 0.0 {
            // L14: ids = redis.call('zrange', KEYS[2], 0, tonumber(ARGV[1]) - 1)
            let Some(count) = x.arg(1).and_then(lua_tonumber) else {
                return Err(Raised(
                    format!(
                        "ERR user_script:14: attempt to perform arithmetic on a nil value script: {}, on @user_script:14.",
                        x.sha
                    )
                    .into_bytes(),
                ));
            };
            let stop = lua_num_arg(count - 1.0);
            let r = self.call(
                x,
                14,
                &[Some(b"zrange"), x.key(2.0), Some(b"0"), Some(&stop)],
            )?;
            if let Reply::Array(items) = r {
                ids = items;
            }
            // L15: local t = redis.call('time')
            // L16: local now = t[1] * 1000 + math.floor(t[2] / 1000)
            let now = self.lua_time(x, 15)?;
            // L17: for i = 1, #ids do
            for id in &ids {
                let Reply::Bulk(id) = id else { continue };
                // L18: local d = tonumber(redis.pcall('zscore', KEYS[3], ids[i]))
                let d =
                    lua_tonumber_reply(&self.pcall(x, &[Some(b"zscore"), x.key(3.0), Some(id)]));
                // L19: if d and d >= now then alive[i] = 1 else alive[i] = 0 end
                alive.push(Reply::Int(d.is_some_and(|d| d >= now) as i64));
            }
        }
        // L22: local f = redis.pcall('get', KEYS[4])
        let mut f = self.pcall(x, &[Some(b"get"), x.key(4.0)]);
        // L23: if type(f) ~= 'string' and KEYS[5] then f = redis.pcall('get', KEYS[5]) end
        if !matches!(f, Reply::Bulk(_)) && x.key(5.0).is_some() {
            f = self.pcall(x, &[Some(b"get"), x.key(5.0)]);
        }
        // L24: if type(f) ~= 'string' then f = '' end
        let f = match f {
            Reply::Bulk(f) => f,
            _ => Vec::new(),
        };
        // L25: return {kind, string.sub(v, 1, 16), lock, marked, redis.call('pttl', KEYS[1]), n, ids, alive, f}
        let pttl = self.call(x, 25, &[Some(b"pttl"), x.key(1.0)])?;
        Ok(Reply::Array(vec![
            Reply::Bulk(kind.to_vec()),
            Reply::Bulk(lua_sub(&v, 1, 16).to_vec()),
            Reply::Int(lock),
            Reply::Int(marked),
            pttl,
            Reply::Int(n as i64),
            Reply::Array(ids),
            Reply::Array(alive),
            Reply::Bulk(f),
        ]))
    }

    /// `scripts::FORCE_RELEASE`.
    fn lua_force_release(&mut self, x: &Run<'_>) -> Result<Reply, Raised> {
        let key = x.key(1.0);
        // L2: local v = redis.call('get', KEYS[1])
        // L3: if not v then return {'', -2, ''} end
        let v = match self.call(x, 2, &[Some(b"get"), key])? {
            Reply::Bulk(v) => v,
            _ => {
                return Ok(Reply::Array(vec![
                    Reply::Bulk(Vec::new()),
                    Reply::Int(-2),
                    Reply::Bulk(Vec::new()),
                ]))
            }
        };
        // L4: local left = redis.call('pttl', KEYS[1])
        let left = self.call(x, 4, &[Some(b"pttl"), key])?;
        // L5: redis.call('del', KEYS[1])
        self.call(x, 5, &[Some(b"del"), key])?;
        // L6: local note = string.sub(v, 1, 16)
        let note = lua_sub(&v, 1, 16).to_vec();
        // L7: local turn = ''
        let mut turn: Vec<u8> = Vec::new();
        // L8: local now
        let mut now: Option<f64> = None;
        // L9: for _ = 1, 8 do
        for _ in 1..=8 {
            // L10: local r = redis.pcall('zrange', KEYS[2], 0, 0)
            let r = self.pcall(x, &[Some(b"zrange"), x.key(2.0), Some(b"0"), Some(b"0")]);
            // L11: local h = type(r) == 'table' and r[1]
            // L12: if not h then break end
            let Some(h) = first_string(&r) else {
                break;
            };
            // L13: if not now then local t = redis.call('time') now = t[1] * 1000 + math.floor(t[2] / 1000) end
            let t = match now {
                Some(t) => t,
                None => *now.insert(self.lua_time(x, 13)?),
            };
            // L14: local d = tonumber(redis.pcall('zscore', KEYS[3], h))
            let d = lua_tonumber_reply(&self.pcall(x, &[Some(b"zscore"), x.key(3.0), Some(&h)]));
            // L15: if d and d >= now then
            if d.is_some_and(|d| d >= t) {
                // L16: turn = h
                // L17: break
                turn = h;
                break;
            }
            // L19: redis.pcall('zrem', KEYS[2], h)
            self.pcall(x, &[Some(b"zrem"), x.key(2.0), Some(&h)]);
            // L20: redis.pcall('zrem', KEYS[3], h)
            self.pcall(x, &[Some(b"zrem"), x.key(3.0), Some(&h)]);
        }
        // L22: if turn ~= '' and #note == 16 then
        if !turn.is_empty() && note.len() == 16 {
            // L23: redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)
            let channel = cat(b"redlock-mux:next:", lua_sub(&turn, 1, 8));
            let payload = cat(&note, &turn);
            self.pcall(x, &[Some(b"publish"), Some(&channel), Some(&payload)]);
        } else {
            // L25: turn = ''
            turn.clear();
            // L26: redis.pcall('publish', 'redlock-mux:released:' .. KEYS[1], note)
            let channel = cat(b"redlock-mux:released:", key.unwrap_or_default());
            self.pcall(x, &[Some(b"publish"), Some(&channel), Some(&note)]);
        }
        // L28: return {note, left, turn}
        Ok(Reply::Array(vec![
            Reply::Bulk(note),
            left,
            Reply::Bulk(turn),
        ]))
    }
}

// ----- client-side caching (RESP3 tracking) -------------------------------------------------
//
// Redis 7.0's `tracking.c`, for the default (non-broadcast) mode: `CLIENT TRACKING ON
// [OPTIN] [NOLOOP]` on a RESP3 connection; a read-only command with keys remembers them for
// the connection (under OPTIN only when `CLIENT CACHING YES` came just before; reads inside
// a script count for the script's caller); any change of a remembered key (a write by
// anyone, an expiry, a deletion, an eviction from the tracking table) pushes
// `>2 invalidate [key]` to every connection tracking it, except the one whose command made
// the change when it asked NOLOOP, and forgets the key (it must be read again to be
// tracked again). The running connection's own invalidations follow its reply. `FLUSHALL`
// pushes `invalidate` with a null to every tracking connection.

/// The read-only commands with keys, and where their keys are: (name, all the arguments
/// from the first are keys).
const READS: &[(&str, bool)] = &[
    ("get", false),
    ("mget", true),
    ("exists", true),
    ("pttl", false),
    ("zrange", false),
    ("zscore", false),
    ("zcard", false),
];

/// `>2 invalidate [key]`, or `>2 invalidate _` for a flush.
fn invalidate_push(out: &mut Vec<u8>, key: Option<&[u8]>) {
    out.extend_from_slice(b">2\r\n$10\r\ninvalidate\r\n");
    match key {
        Some(k) => {
            let _ = write!(Buf(out), "*1\r\n${}\r\n", k.len());
            out.extend_from_slice(k);
            out.extend_from_slice(b"\r\n");
        }
        None => out.extend_from_slice(b"_\r\n"),
    }
}

impl SimRedis {
    /// After each command of `id`: its own invalidations follow its reply; `CLIENT CACHING
    /// YES` lasts for one command (a `CLIENT` command does not use it up: Redis'
    /// `resetClient`).
    fn after_command(&mut self, id: u32, client_cmd: bool) {
        self.current = None;
        let pending = std::mem::take(&mut self.pending_self);
        if let Some(c) = self.conns.get_mut(&id) {
            for key in pending {
                if c.resp3 {
                    invalidate_push(&mut c.output, key.as_deref());
                }
            }
            if !client_cmd {
                c.caching = false;
            }
        }
    }

    /// Key `key` changed (written, deleted, expired, evicted from the tracking table):
    /// every connection tracking it hears so, but a NOLOOP one whose command changed it;
    /// the key is forgotten.
    fn signal_modified(&mut self, key: &[u8]) {
        let Some(ids) = self.tracked.remove(key) else {
            return;
        };
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            let Some((_, noloop)) = c.tracking else {
                continue;
            };
            if !c.open {
                continue;
            }
            if self.current == Some(id) {
                if !noloop {
                    self.pending_self.push(Some(key.to_vec()));
                }
            } else if c.resp3 {
                // RESP2 without a redirection: Redis has no way to tell it.
                invalidate_push(&mut c.output, Some(key));
            }
        }
    }

    /// `FLUSHALL`: every tracking connection hears a null invalidation (NOLOOP or not).
    fn signal_flush(&mut self) {
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        for id in ids {
            let current = self.current == Some(id);
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.tracking.is_none() || !c.open {
                continue;
            }
            if current {
                self.pending_self.push(None);
            } else if c.resp3 {
                invalidate_push(&mut c.output, None);
            }
        }
        self.tracked.clear();
    }

    /// A read-only command with keys ran for the current connection: its keys are
    /// remembered where it tracks (under OPTIN, only with `CLIENT CACHING YES`).
    fn remember_reads(&mut self, args: &[&[u8]]) {
        let Some(id) = self.current else {
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let Some((optin, _)) = c.tracking else {
            return;
        };
        if optin && !c.caching {
            return;
        }
        let name = String::from_utf8_lossy(args[0]).to_ascii_lowercase();
        let Some(&(_, all)) = READS.iter().find(|(n, _)| *n == name) else {
            return;
        };
        let keys = if all {
            &args[1..]
        } else {
            &args[1..2.min(args.len())]
        };
        for k in keys {
            let ids = self.tracked.entry(k.to_vec()).or_default();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }

    /// `HELLO [protover]`: switches the connection's protocol and answers the server's
    /// description (a map under RESP3). Options (`AUTH`, `SETNAME`) are not supported.
    fn cmd_hello(&mut self, id: u32, args: &[Vec<u8>]) -> bool {
        let resp3 = self.conns.get(&id).is_some_and(|c| c.resp3);
        let ver = match args.get(1) {
            None => Some(if resp3 { 3 } else { 2 }),
            Some(v) => match parse_i64(v) {
                Some(n) => Some(n),
                None => {
                    let r = err("ERR Protocol version is not an integer or out of range");
                    self.reply(id, &r);
                    return true;
                }
            },
        };
        if args.len() > 2 {
            let r = err("ERR simredis: HELLO options are not supported");
            self.reply(id, &r);
            return true;
        }
        let ver = ver.unwrap_or(2);
        if !(2..=3).contains(&ver) {
            self.reply(id, &err("NOPROTO unsupported protocol version"));
            return true;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        c.resp3 = ver == 3;
        let fields = [
            Reply::Bulk(b"server".to_vec()),
            Reply::Bulk(b"redis".to_vec()),
            Reply::Bulk(b"version".to_vec()),
            Reply::Bulk(REDIS_VERSION.as_bytes().to_vec()),
            Reply::Bulk(b"proto".to_vec()),
            Reply::Int(ver),
            Reply::Bulk(b"id".to_vec()),
            Reply::Int(id as i64 + 1),
            Reply::Bulk(b"mode".to_vec()),
            Reply::Bulk(b"standalone".to_vec()),
            Reply::Bulk(b"role".to_vec()),
            Reply::Bulk(b"master".to_vec()),
            Reply::Bulk(b"modules".to_vec()),
            Reply::Array(Vec::new()),
        ];
        if ver == 3 {
            let _ = write!(Buf(&mut c.output), "%{}\r\n", fields.len() / 2);
            for f in &fields {
                encode(&mut c.output, f, true);
            }
        } else {
            encode(&mut c.output, &Reply::Array(fields.to_vec()), false);
        }
        true
    }

    /// `CLIENT TRACKING ON|OFF [OPTIN] [NOLOOP]` (no `REDIRECT`, `BCAST`, `PREFIX`,
    /// `OPTOUT`).
    fn cmd_client_tracking(&mut self, id: u32, args: &[Vec<u8>]) -> Reply {
        let (mut optin, mut noloop) = (false, false);
        for a in &args[3..] {
            match a.to_ascii_lowercase().as_slice() {
                b"optin" => optin = true,
                b"noloop" => noloop = true,
                b"redirect" | b"bcast" | b"prefix" | b"optout" => {
                    return err("ERR simredis: CLIENT TRACKING supports OPTIN and NOLOOP only")
                }
                _ => return err(SYNTAX),
            }
        }
        let on = match args[2].to_ascii_lowercase().as_slice() {
            b"on" => true,
            b"off" => false,
            _ => return err(SYNTAX),
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.tracking = on.then_some((optin, noloop));
        }
        ok()
    }

    /// `CLIENT CACHING YES|NO`.
    fn cmd_client_caching(&mut self, id: u32, args: &[Vec<u8>]) -> Reply {
        let Some(c) = self.conns.get_mut(&id) else {
            return Reply::Nil;
        };
        let Some((optin, _)) = c.tracking else {
            return err(
                "ERR CLIENT CACHING can be called only when the client is in tracking mode \
                 with OPTIN or OPTOUT mode enabled",
            );
        };
        match args[2].to_ascii_lowercase().as_slice() {
            b"yes" if optin => {
                c.caching = true;
                ok()
            }
            b"yes" => {
                err("ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.")
            }
            b"no" => {
                err("ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.")
            }
            _ => err(SYNTAX),
        }
    }

    /// Redis' active expiry (`activeExpireCycle`), for the keys some connection tracks:
    /// those expired at `now_ms` are deleted and their trackers told.
    pub fn active_expire(&mut self, now_ms: u64) {
        let keys: Vec<Vec<u8>> = self.tracked.keys().cloned().collect();
        let now = now_ms as i64;
        for k in keys {
            let mut gone = false;
            for db in &mut self.dbs {
                if db.get(&k).is_some_and(|e| !alive(e, now)) {
                    db.remove(&k);
                    gone = true;
                }
            }
            if gone {
                self.signal_modified(&k);
            }
        }
    }

    /// The tracking table evicts `key` (`tracking-table-max-keys`): its trackers are told
    /// it changed, though it did not. Whether it was tracked.
    pub fn evict_tracked(&mut self, key: &[u8]) -> bool {
        let was = self.tracked.contains_key(key);
        self.signal_modified(key);
        was
    }

    /// The keys some connection tracks, sorted.
    pub fn tracked_keys(&self) -> Vec<Vec<u8>> {
        self.tracked.keys().cloned().collect()
    }

    /// Whether connection `conn` tracks `key`.
    pub fn tracks(&self, conn: ConnId, key: &[u8]) -> bool {
        self.tracked
            .get(key)
            .is_some_and(|ids| ids.contains(&conn.0))
    }
}

// ----- Lua helpers ------------------------------------------------------------------------------

/// `redis.call('get', k) == s` in Lua: a string reply equal to a string argument (`false`,
/// the nil reply, never equals; nor does anything equal a nil argument).
/// Whether a script's `redis.call` names a key in its second argument.
fn command_has_key(name: &[u8]) -> bool {
    ![
        "publish", "info", "config", "script", "client", "ping", "select", "keys", "dbsize",
    ]
    .iter()
    .any(|c| name.eq_ignore_ascii_case(c.as_bytes()))
}

fn lua_eq(v: &Reply, s: Option<&[u8]>) -> bool {
    matches!((v, s), (Reply::Bulk(a), Some(b)) if a.as_slice() == b)
}

/// `s .. suffix` in Lua: concatenating a nil raises.
fn lua_concat(x: &Run<'_>, line: u32, s: Option<&[u8]>, suffix: &[u8]) -> Result<Vec<u8>, Raised> {
    match s {
        Some(s) => Ok(cat(s, suffix)),
        None => Err(Raised(
            format!(
                "ERR user_script:{line}: attempt to concatenate field '?' (a nil value) script: {}, on @user_script:{line}.",
                x.sha
            )
            .into_bytes(),
        )),
    }
}

/// `v == ARGV[1] or v == ARGV[1] .. '+'` (the scripts' `v ~= ARGV[1] and v ~= ARGV[1] ..
/// '+'`, negated): the key holds the token, marked by a waiter or not.
fn lua_holds(x: &Run<'_>, line: u32, v: &Reply) -> Result<bool, Raised> {
    if lua_eq(v, x.arg(1)) {
        return Ok(true);
    }
    Ok(lua_eq(v, Some(&lua_concat(x, line, x.arg(1), b"+")?)))
}

/// `type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]')`: one of this
/// crate's tokens, unmarked.
fn is_token(v: &Reply) -> bool {
    matches!(v, Reply::Bulk(v) if v.len() == 32 && v.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)))
}

/// `type(r) == 'table' and r[1]`, as a string: the first element of an array reply (an
/// error or status table has no `[1]`).
fn first_string(r: &Reply) -> Option<Vec<u8>> {
    match r {
        Reply::Array(items) => match items.first() {
            Some(Reply::Bulk(s)) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// `tonumber(r)` of a reply: a string's number (a nil reply, `false`, or a table: nil).
fn lua_tonumber_reply(r: &Reply) -> Option<f64> {
    match r {
        Reply::Bulk(s) => lua_tonumber(s),
        _ => None,
    }
}

/// Concatenating a nil local `name` raises.
fn lua_concat_nil(x: &Run<'_>, line: u32, name: &str) -> Raised {
    Raised(
        format!(
            "ERR user_script:{line}: attempt to concatenate local '{name}' (a nil value) script: {}, on @user_script:{line}.",
            x.sha
        )
        .into_bytes(),
    )
}

/// An integer reply as a Lua number (other replies: not a number).
fn lua_number(r: &Reply) -> Option<f64> {
    match r {
        Reply::Int(n) => Some(*n as f64),
        _ => None,
    }
}

/// `a < b` in Lua 5.1, numbers or nil: comparing nil raises.
fn lua_lt(x: &Run<'_>, line: u32, a: Option<f64>, b: Option<f64>) -> Result<bool, Raised> {
    let what = match (a, b) {
        (Some(a), Some(b)) => return Ok(a < b),
        (None, None) => "attempt to compare two nil values".to_owned(),
        (a, b) => {
            let ty = |v: Option<f64>| if v.is_some() { "number" } else { "nil" };
            format!("attempt to compare {} with {}", ty(a), ty(b))
        }
    };
    Err(Raised(
        format!(
            "ERR user_script:{line}: {what} script: {}, on @user_script:{line}.",
            x.sha
        )
        .into_bytes(),
    ))
}

/// `string.sub(s, i, j)` for positive `i <= j`.
fn lua_sub(s: &[u8], i: usize, j: usize) -> &[u8] {
    let end = j.min(s.len());
    let start = (i - 1).min(end);
    &s[start..end]
}

fn cat(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    v
}

/// C `isspace`.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The longest prefix of `s` that C `strtod` reads as a decimal number, an `inf`/`nan`
/// word or a hex integer, with its value (no leading whitespace here).
fn strtod_prefix(s: &[u8]) -> Option<(f64, usize)> {
    let mut i = 0;
    let neg = match s.first() {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let sign = if neg { -1.0 } else { 1.0 };
    let rest = &s[i..];
    if rest.len() > 2 && rest[0] == b'0' && (rest[1] | 0x20) == b'x' && rest[2].is_ascii_hexdigit()
    {
        let digits = rest[2..]
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        let mut v = 0.0;
        for &d in &rest[2..2 + digits] {
            v = v * 16.0 + (d as char).to_digit(16).unwrap_or(0) as f64;
        }
        return Some((sign * v, i + 2 + digits));
    }
    let lower = rest.to_ascii_lowercase();
    for (word, v) in [
        ("infinity", f64::INFINITY),
        ("inf", f64::INFINITY),
        ("nan", f64::NAN),
    ] {
        if lower.starts_with(word.as_bytes()) {
            return Some((sign * v, i + word.len()));
        }
    }
    let mut j = 0;
    let int = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    j += int;
    let mut frac = 0;
    if rest.get(j) == Some(&b'.') {
        frac = rest[j + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if int + frac > 0 {
            j += 1 + frac;
        }
    }
    if int + frac == 0 {
        return None;
    }
    if matches!(rest.get(j), Some(b'e' | b'E')) {
        let mut k = j + 1;
        if matches!(rest.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        let exp = rest[k..].iter().take_while(|b| b.is_ascii_digit()).count();
        if exp > 0 {
            j = k + exp;
        }
    }
    let text = std::str::from_utf8(&rest[..j]).ok()?;
    let v: f64 = text.parse().ok()?;
    Some((sign * v, i + j))
}

/// Lua 5.1 `tonumber(s)` (luaO_str2d: `strtod`, hex, surrounding whitespace; the string
/// ends at a NUL byte, as a C string).
fn lua_tonumber(s: &[u8]) -> Option<f64> {
    let s = s.split(|&b| b == 0).next().unwrap_or_default();
    let start = s.iter().take_while(|&&b| is_space(b)).count();
    let s = &s[start..];
    let (v, used) = strtod_prefix(s)?;
    s[used..].iter().all(|&b| is_space(b)).then_some(v)
}

/// Redis' `getDoubleFromObject` (a `ZADD` score): `strtod` over the whole string, no
/// leading space, not NaN.
fn redis_double(s: &[u8]) -> Option<f64> {
    if s.first().is_none_or(|&b| is_space(b)) {
        return None;
    }
    let (v, used) = strtod_prefix(s)?;
    (used == s.len() && !v.is_nan()).then_some(v)
}

/// A Lua number as Redis 7.0 passes it to a command (`%.17g`).
fn lua_num_arg(v: f64) -> Vec<u8> {
    fmt_g17(v).into_bytes()
}

/// C's `%.17g` (what Redis 7.0 uses for Lua numbers in commands and for scores).
fn fmt_g17(v: f64) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let e = format!("{:.16e}", v);
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if !(-4..17).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let rest = rest.trim_end_matches('0');
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.abs());
    }
    let s = if exp >= 0 {
        let (int, frac) = digits.split_at(exp as usize + 1);
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            int.to_owned()
        } else {
            format!("{int}.{frac}")
        }
    } else {
        let zeros = "0".repeat((-exp - 1) as usize);
        format!("0.{zeros}{}", digits.trim_end_matches('0'))
    };
    format!("{sign}{s}")
}

// ----- small parsers and encoders ----------------------------------------------------------------

/// Redis' `string2ll`: an optional `-`, then `0` alone or digits without a leading zero.
fn parse_i64(s: &[u8]) -> Option<i64> {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    let canonical = match digits {
        [b'0'] => s.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn alive(e: &Entry, now: i64) -> bool {
    e.expire_at.is_none_or(|at| now <= at)
}

fn insert_sorted(z: &mut Vec<(f64, Vec<u8>)>, score: f64, member: Vec<u8>) {
    let pos = z
        .iter()
        .position(|(s, m)| (*s, m.as_slice()) > (score, member.as_slice()))
        .unwrap_or(z.len());
    z.insert(pos, (score, member));
}

/// Every script the server runs natively: the handshake's (`scripts::ALL`), then the
/// operators' (`scripts::ADMIN`, sent with `EVALSHA` and `EVAL` only).
fn known_scripts() -> impl Iterator<Item = Script> {
    scripts::ALL
        .into_iter()
        .chain(scripts::ADMIN)
        .chain([scripts::RELEASE_PLAIN])
}

/// The `i`th of [`known_scripts`].
fn known_script(i: usize) -> Script {
    known_scripts()
        .nth(i)
        .expect("a script index from known_scripts")
}

/// The index in [`known_scripts`] of a script source (byte-exact).
fn script_index(src: &[u8]) -> Option<usize> {
    known_scripts().position(|s: Script| s.src.as_bytes() == src)
}

fn unknown_script() -> Reply {
    err("ERR simredis: unknown script source (only redlock_mux::scripts::ALL and ADMIN can run)")
}

/// `%.{max}s` of an argument, with CR/LF shown as spaces (an error line has none).
fn printable(a: &[u8], max: usize) -> String {
    let cut = &a[..a.len().min(max)];
    String::from_utf8_lossy(cut).replace(['\r', '\n'], " ")
}

/// Redis 7.0's "unknown command" text (commandCheckExistence).
fn unknown_command(args: &[Vec<u8>]) -> Vec<u8> {
    let mut list = String::new();
    for a in &args[1..] {
        if list.len() >= 128 {
            break;
        }
        let room = 128 - list.len();
        let _ = write!(list, "'{}' ", printable(a, room));
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {list}",
        printable(&args[0], 128)
    )
    .into_bytes()
}

/// Redis' `stringmatchlen` glob (`*`, `?`, `[...]` with `^` and ranges, `\` escapes).
fn glob(pattern: &[u8], s: &[u8], nocase: bool) -> bool {
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let mut matched = false;
        let mut next_p = p;
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, i));
                    p += 1;
                    continue;
                }
                b'?' => {
                    matched = true;
                    next_p = p + 1;
                }
                b'[' => {
                    let mut k = p + 1;
                    let negate = pattern.get(k) == Some(&b'^');
                    if negate {
                        k += 1;
                    }
                    let mut hit = false;
                    while k < pattern.len() && pattern[k] != b']' {
                        if pattern[k] == b'\\' && k + 1 < pattern.len() {
                            k += 1;
                            hit |= eq(pattern[k], s[i]);
                        } else if k + 2 < pattern.len()
                            && pattern[k + 1] == b'-'
                            && pattern[k + 2] != b']'
                        {
                            let (mut lo, mut hi) = (pattern[k], pattern[k + 2]);
                            if lo > hi {
                                std::mem::swap(&mut lo, &mut hi);
                            }
                            let c = s[i];
                            hit |= (lo..=hi).contains(&c)
                                || (nocase
                                    && ((lo..=hi).contains(&c.to_ascii_lowercase())
                                        || (lo..=hi).contains(&c.to_ascii_uppercase())));
                            k += 2;
                        } else {
                            hit |= eq(pattern[k], s[i]);
                        }
                        k += 1;
                    }
                    matched = hit != negate;
                    next_p = (k + 1).min(pattern.len());
                }
                b'\\' if p + 1 < pattern.len() => {
                    matched = eq(pattern[p + 1], s[i]);
                    next_p = p + 2;
                }
                c => {
                    matched = eq(c, s[i]);
                    next_p = p + 1;
                }
            }
        }
        if matched {
            p = next_p;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// A fresh run id: 40 lowercase hex digits from a splitmix64 stream.
fn new_run_id(rng: &mut u64) -> String {
    let mut s = String::with_capacity(40);
    while s.len() < 40 {
        *rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let _ = write!(s, "{z:016x}");
    }
    s.truncate(40);
    s
}

/// Encodes a reply (RESP2; nulls as `_` with `resp3_nulls`).
fn encode(out: &mut Vec<u8>, r: &Reply, resp3_nulls: bool) {
    match r {
        Reply::Status(s) => {
            out.push(b'+');
            out.extend_from_slice(s);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Error(e) => {
            out.push(b'-');
            out.extend(
                e.iter()
                    .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
            );
            out.extend_from_slice(b"\r\n");
        }
        Reply::Int(n) => {
            let _ = write!(Buf(out), ":{n}\r\n");
        }
        Reply::Bulk(b) => {
            let _ = write!(Buf(out), "${}\r\n", b.len());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Nil if resp3_nulls => out.extend_from_slice(b"_\r\n"),
        Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
        Reply::Array(items) => {
            let _ = write!(Buf(out), "*{}\r\n", items.len());
            for i in items {
                encode(out, i, resp3_nulls);
            }
        }
    }
}

struct Buf<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Buf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

// ----- the request parser ------------------------------------------------------------------------

/// Redis' `PROTO_INLINE_MAX_SIZE`: the longest inline command or header line.
const INLINE_MAX: usize = 64 * 1024;
/// Redis' `proto-max-bulk-len` default.
const MAX_BULK: i64 = 512 * 1024 * 1024;

/// The next command in `input` (Redis 7.0's processMultibulkBuffer / processInlineBuffer,
/// with the frame itself read by `redlock_mux::resp::parse`).
fn next_command(input: &[u8], authed: bool) -> Next {
    if input.first() != Some(&b'*') {
        return next_inline(input);
    }
    // The checks Redis makes header by header, as the bytes arrive, with its texts.
    if let Some(verdict) = check_multibulk(input, authed) {
        return verdict;
    }
    let limits = Limits {
        max_bulk_len: MAX_BULK as usize,
        max_elements: i32::MAX as usize,
        max_depth: 2,
        max_line_len: INLINE_MAX,
    };
    match resp::parse(input, &limits) {
        Ok(Status::Partial(_)) => Next::Need,
        Ok(Status::Complete((Frame::Aggregate(a), used))) => {
            let mut args = Vec::with_capacity(a.len());
            for f in a.iter() {
                match f {
                    Frame::Bulk(b) => args.push(b.to_vec()),
                    _ => return Next::Protocol("expected '$'".into()),
                }
            }
            Next::Command(args, used)
        }
        Ok(Status::Complete(_)) => Next::Protocol("invalid multibulk length".into()),
        Err(e) => Next::Protocol(e.description().into()),
    }
}

/// Reads the headers of a multibulk command as far as `input` goes: `Some` with a
/// protocol error or a skip of an empty command, `None` when the frame may be fine.
fn check_multibulk(input: &[u8], authed: bool) -> Option<Next> {
    let line = |at: usize| -> Option<&[u8]> {
        let rest = input.get(at..)?;
        let end = rest.iter().position(|&b| b == b'\r')?;
        // Redis looks for '\r' and assumes '\n' follows.
        (rest.len() > end + 1).then_some(&rest[..end])
    };
    let Some(count) = line(1) else {
        return (input.len() > INLINE_MAX)
            .then(|| Next::Protocol("too big mbulk count string".into()));
    };
    let header_len = 1 + count.len() + 2;
    let n = match parse_i64(count) {
        Some(n) if n <= i32::MAX as i64 => n,
        _ => return Some(Next::Protocol("invalid multibulk length".into())),
    };
    if n > 10 && !authed {
        return Some(Next::Protocol("unauthenticated multibulk length".into()));
    }
    if n <= 0 {
        return Some(Next::Skip(header_len));
    }
    let mut at = header_len;
    for _ in 0..n {
        let &kind = input.get(at)?;
        if kind != b'$' {
            return Some(Next::Protocol(format!(
                "expected '$', got '{}'",
                kind as char
            )));
        }
        let Some(len) = line(at + 1) else {
            return (input.len() - at > INLINE_MAX)
                .then(|| Next::Protocol("too big bulk count string".into()));
        };
        let size = match parse_i64(len) {
            Some(s) if (0..=MAX_BULK).contains(&s) => s,
            _ => return Some(Next::Protocol("invalid bulk length".into())),
        };
        if size > 16384 && !authed {
            return Some(Next::Protocol("unauthenticated bulk length".into()));
        }
        at += 1 + len.len() + 2 + size as usize + 2;
    }
    None
}

/// An inline command: one line split on whitespace.
fn next_inline(input: &[u8]) -> Next {
    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
        return if input.len() > INLINE_MAX {
            Next::Protocol("too big inline request".into())
        } else {
            Next::Need
        };
    };
    let line = input[..nl].strip_suffix(b"\r").unwrap_or(&input[..nl]);
    let args: Vec<Vec<u8>> = line
        .split(|&b| is_space(b))
        .filter(|w| !w.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if args.is_empty() {
        Next::Skip(nl + 1)
    } else {
        Next::Command(args, nl + 1)
    }
}
