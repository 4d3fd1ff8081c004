//! A deterministic discrete-event simulation of Redlock over N simulated masters.
//!
//! Everything the clients decide goes through `redlock_mux::rules` (the same sans-IO core
//! the real client uses): `Tally` (record / decision / expire), `judge_acquire`,
//! `classify` (on reply bytes parsed by `resp::parse`), `may_hold` and `retry_delay`.
//! What is simulated around it:
//!
//! * **Time**: a virtual clock in microseconds; nothing sleeps. The clients' clocks are the
//!   reference ("true") clock. Each master has its own clock `offset + rate * t` (rate
//!   `1 + skew`), on which it evaluates `PX` expiry with Redis' millisecond precision.
//! * **Masters**: a key-value store per master with `SET NX PX`, the compare-and-delete
//!   release script and the compare-and-pexpire extend script. Restarts keep the data
//!   (persistence) or lose it; the amnesia guard (delayed restart) makes a restarted master
//!   refuse to vote until it has been up for `max_ttl` on its own clock.
//! * **Network**: per-message delays (occasionally longer than the round timeout), drops,
//!   partitions of single client-master links or of a whole master, FIFO order per link
//!   and direction (one TCP connection each way). A request that reaches a master whose
//!   connection died with a restart is answered by a reset; a request to a master that is
//!   down is refused.
//! * **Clients**: acquire (t1, fan-out, tally until decided or the round timeout), hold
//!   for a random work time (extending by quorum when validity runs low, if enabled),
//!   release; on failure release where `may_hold` and retry after `retry_delay`. Process
//!   pauses (GC) defer everything a client would do until it resumes.
//!
//! The checker records, per client and resource, the interval during which the client
//! believes it holds the lock: from the decision to the earlier of "work done" and the
//! lock's validity end (an honest holder stops using the lock when validity runs out;
//! `honest_holders = false` models a holder that keeps using it after a long pause).
//! Intervals of different holders of the same resource must never overlap.
#![allow(dead_code)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

use redlock_mux::resp::{self, Limits, Status};
use redlock_mux::rules::{self, AcquireVerdict, Decision, Fault, Outcome, Request, Tally};

/// Simulated time, in microseconds.
pub type Us = u64;
/// One millisecond of simulated time.
pub const MS: Us = 1000;

/// One simulation's parameters. A test family derives one from each seed.
#[derive(Clone, Debug)]
pub struct Config {
    pub masters: usize,
    pub clients: usize,
    pub resources: usize,
    /// Lock TTL, whole milliseconds (PX has millisecond resolution).
    pub ttl: Us,
    pub drift_factor: f64,
    pub min_validity: Us,
    pub round_timeout: Us,
    pub retry_base: Us,
    pub retry_jitter: Us,
    /// Pause between a release and the next acquire, uniform in `[0, think_max]`.
    pub think_max: Us,
    /// A holder's work time, uniform in `[0, work_max]` (may exceed the validity).
    pub work_max: Us,
    /// Holders extend (compare-and-pexpire on all masters, judged like an acquire) when
    /// their validity runs low, at most `max_extends` times per hold.
    pub max_extends: u32,
    pub horizon: Us,
    pub max_events: u64,
    /// One-way delay of a normal message, uniform in this range.
    pub latency: (Us, Us),
    /// Probability that a message is slow instead: delay uniform in `[latency.1, slow_max]`.
    pub slow_prob: f64,
    pub slow_max: Us,
    pub drop_prob: f64,
    /// Masters answer "taken" with the RESP3 null `_` instead of `$-1`.
    pub resp3: bool,
    /// Each master's clock runs at `1 + skew`, skew uniform in `[-skew_bound, skew_bound]`.
    pub skew_bound: f64,
    /// Hazard: the first `fast_masters` masters' clocks run at `fast_rate` instead.
    pub fast_masters: usize,
    pub fast_rate: f64,
    /// How many faults are injected, at uniformly random times over the horizon.
    pub faults: usize,
    pub mix: FaultMix,
    pub partition_len: (Us, Us),
    pub pause_len: (Us, Us),
    /// Probability that a client pauses right after it acquired (a GC pause).
    pub pause_after_acquire: f64,
    /// Probability that a client pauses right after writing an acquire round, before it
    /// reads the replies (the round's elapsed time then includes the pause).
    pub pause_in_round: f64,
    pub downtime: (Us, Us),
    pub persistence: bool,
    pub amnesia_guard: bool,
    pub max_ttl: Us,
    /// Hazard: a master's clock jumps forward by an amount in this range.
    pub clock_jump: (Us, Us),
    /// An honest holder stops using the lock when its validity runs out, whatever pauses.
    pub honest_holders: bool,
}

/// Relative weights of the injected faults.
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultMix {
    /// One client-master link drops everything, both ways, for a while.
    pub partition: u32,
    /// One master is cut off from every client for a while.
    pub isolate: u32,
    /// One client stops (GC, swapping) for a while.
    pub pause: u32,
    /// One master crashes and restarts (keeping or losing its data).
    pub restart: u32,
    /// One master's clock jumps forward.
    pub clock_jump: u32,
}

impl FaultMix {
    fn total(&self) -> u32 {
        self.partition + self.isolate + self.pause + self.restart + self.clock_jump
    }
}

/// An interval during which `client` believed it held `res`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub res: usize,
    pub client: usize,
    pub token: u64,
    /// The client's clock when it sent the acquire (or the extend that opened this interval).
    pub t1: Us,
    pub start: Us,
    pub end: Us,
    /// The round's votes, e.g. `[ok, ok, timed out]`.
    pub votes: String,
}

/// What one run covered.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub events: u64,
    pub messages: u64,
    pub acquire_rounds: u64,
    pub acquired: u64,
    pub taken: u64,
    pub no_quorum: u64,
    pub validity_used_up: u64,
    pub extends_ok: u64,
    pub extends_failed: u64,
    pub releases_after_failure: u64,
    pub late_replies: u64,
    pub drops: u64,
    pub partitions: u64,
    pub pauses: u64,
    pub restarts: u64,
    pub clock_jumps: u64,
    pub amnesiac_votes: u64,
    pub holds_clipped: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.events += o.events;
        self.messages += o.messages;
        self.acquire_rounds += o.acquire_rounds;
        self.acquired += o.acquired;
        self.taken += o.taken;
        self.no_quorum += o.no_quorum;
        self.validity_used_up += o.validity_used_up;
        self.extends_ok += o.extends_ok;
        self.extends_failed += o.extends_failed;
        self.releases_after_failure += o.releases_after_failure;
        self.late_replies += o.late_replies;
        self.drops += o.drops;
        self.partitions += o.partitions;
        self.pauses += o.pauses;
        self.restarts += o.restarts;
        self.clock_jumps += o.clock_jumps;
        self.amnesiac_votes += o.amnesiac_votes;
        self.holds_clipped += o.holds_clipped;
    }
}

/// Two holders of the same resource whose intervals overlap.
#[derive(Clone, Debug)]
pub struct Violation {
    pub first: Held,
    pub second: Held,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b) = (&self.first, &self.second);
        write!(
            f,
            "double grant of r{}: c{} (token {}) believed it held it {}..{} ms, c{} (token {}) \
             from {} ms (until {} ms), votes {} / {}",
            a.res,
            a.client,
            a.token,
            ms(a.start),
            ms(a.end),
            b.client,
            b.token,
            ms(b.start),
            ms(b.end),
            a.votes,
            b.votes
        )
    }
}

/// `t` in milliseconds with microsecond digits.
pub fn ms(t: Us) -> String {
    format!("{}.{:03}", t / MS, t % MS)
}

#[derive(Clone, Copy, Debug)]
enum Msg {
    Set { res: usize, token: u64, ttl_ms: u64 },
    Release { res: usize, token: u64 },
    Extend { res: usize, token: u64, ttl_ms: u64 },
}

impl Msg {
    fn request(&self) -> Request {
        match self {
            Msg::Set { .. } => Request::Acquire,
            Msg::Release { .. } => Request::Release,
            Msg::Extend { .. } => Request::Extend,
        }
    }
}

/// What reaches a client from a master.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// Reply bytes, parsed by the client with `resp::parse`.
    Wire(&'static [u8]),
    /// The connection was reset (the master restarted since the request was written).
    Closed,
    /// The master is down: connecting was refused.
    Refused,
    /// The master restarted less than `max_ttl` ago (amnesia guard): its vote is not counted.
    Amnesiac,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    ToMaster {
        c: usize,
        m: usize,
        op: u64,
        msg: Msg,
        inc: u32,
    },
    ToClient {
        c: usize,
        m: usize,
        op: u64,
        req: Request,
        reply: Reply,
        inc: u32,
    },
    RoundTimeout {
        c: usize,
        op: u64,
    },
    Start {
        c: usize,
    },
    WorkDone {
        c: usize,
        hold: u64,
    },
    ExtendDue {
        c: usize,
        hold: u64,
    },
    Fault,
    MasterUp {
        m: usize,
    },
}

impl Ev {
    /// The client this event is processed by (deferred while that client is paused).
    fn client(&self) -> Option<usize> {
        match *self {
            Ev::ToClient { c, .. }
            | Ev::RoundTimeout { c, .. }
            | Ev::Start { c }
            | Ev::WorkDone { c, .. }
            | Ev::ExtendDue { c, .. } => Some(c),
            _ => None,
        }
    }
}

struct Item {
    at: Us,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    // Reversed: BinaryHeap is a max-heap, we want the earliest (then first-queued) event.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

struct Master {
    rate: f64,
    offset: f64,
    up: bool,
    /// Incarnation: bumped at every crash; connections of an older incarnation are dead.
    inc: u32,
    /// The master's clock (µs) when it last came up.
    up_since: f64,
    /// Per resource: (token, expiry in the master's milliseconds).
    store: Vec<Option<(u64, u64)>>,
}

impl Master {
    fn clock(&self, t: Us) -> f64 {
        self.offset + self.rate * t as f64
    }
    /// Redis' `mstime()`.
    fn now_ms(&self, t: Us) -> u64 {
        (self.clock(t) / 1000.0) as u64
    }
    /// The token stored for `res`, if the key exists (Redis: expired when `now > when`).
    fn get(&mut self, res: usize, now_ms: u64) -> Option<u64> {
        match self.store[res] {
            Some((token, when)) if now_ms <= when => Some(token),
            Some(_) => {
                self.store[res] = None;
                None
            }
            None => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Acquiring,
    Holding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Acquire,
    Extend,
}

struct Client {
    phase: Phase,
    round: Option<Round>,
    paused_until: Us,
    op: u64,
    t1: Us,
    tally: Tally,
    res: usize,
    token: u64,
    hold: u64,
    held_from: Us,
    held_t1: Us,
    held_votes: String,
    valid_until: Us,
    extends_left: u32,
}

/// One trace line: when, which client (if any), whether it is a headline event.
pub struct TraceLine {
    pub at: Us,
    pub client: Option<usize>,
    pub notable: bool,
    pub text: String,
}

/// The simulated world.
pub struct Sim {
    cfg: Config,
    rng: fastrand::Rng,
    now: Us,
    seq: u64,
    queue: BinaryHeap<Item>,
    masters: Vec<Master>,
    clients: Vec<Client>,
    /// Per link (c * masters + m): partitioned until.
    cut_until: Vec<Us>,
    /// Per link: last delivery time client -> master and master -> client (FIFO).
    last_c2m: Vec<Us>,
    last_m2c: Vec<Us>,
    next_token: u64,
    next_op: u64,
    quorum: usize,
    limits: Limits,
    pub held: Vec<Held>,
    pub stats: Stats,
    trace: Option<Vec<TraceLine>>,
}

const OK: &[u8] = b"+OK\r\n";
const NULL2: &[u8] = b"$-1\r\n";
const NULL3: &[u8] = b"_\r\n";
const ONE: &[u8] = b":1\r\n";
const ZERO: &[u8] = b":0\r\n";

impl Sim {
    pub fn new(cfg: Config, seed: u64, trace: bool) -> Sim {
        assert!(cfg.masters >= 1 && cfg.clients >= 1 && cfg.resources >= 1);
        assert!(cfg.ttl % MS == 0, "PX takes whole milliseconds");
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = cfg.masters;
        let masters = (0..n)
            .map(|i| {
                let rate = if i < cfg.fast_masters {
                    cfg.fast_rate
                } else if rng.u8(..8) == 0 {
                    // Sit exactly on the bound now and then.
                    1.0 + if rng.bool() {
                        cfg.skew_bound
                    } else {
                        -cfg.skew_bound
                    }
                } else {
                    1.0 + (rng.f64() * 2.0 - 1.0) * cfg.skew_bound
                };
                // Wall clocks far from zero, and not aligned on a millisecond.
                let offset = 1.7e12 + rng.u64(..1_000_000_000) as f64 + rng.f64();
                Master {
                    rate,
                    offset,
                    up: true,
                    inc: 0,
                    up_since: offset - 10.0 * cfg.max_ttl as f64,
                    store: vec![None; cfg.resources],
                }
            })
            .collect();
        let clients = (0..cfg.clients)
            .map(|_| Client {
                phase: Phase::Idle,
                round: None,
                paused_until: 0,
                op: 0,
                t1: 0,
                tally: Tally::new(n, rules::quorum(n)),
                res: 0,
                token: 0,
                hold: 0,
                held_from: 0,
                held_t1: 0,
                held_votes: String::new(),
                valid_until: 0,
                extends_left: 0,
            })
            .collect();
        let links = cfg.clients * n;
        let mut sim = Sim {
            quorum: rules::quorum(n),
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            masters,
            clients,
            cut_until: vec![0; links],
            last_c2m: vec![0; links],
            last_m2c: vec![0; links],
            next_token: 1,
            next_op: 1,
            limits: Limits::default(),
            held: Vec::new(),
            stats: Stats::default(),
            trace: trace.then(Vec::new),
            cfg,
        };
        for c in 0..sim.cfg.clients {
            let at = sim.rng.u64(0..=sim.cfg.think_max);
            sim.push(at, Ev::Start { c });
        }
        if sim.cfg.mix.total() > 0 {
            for _ in 0..sim.cfg.faults {
                let at = sim.rng.u64(0..sim.cfg.horizon);
                sim.push(at, Ev::Fault);
            }
        }
        if sim.trace.is_some() {
            let rates: Vec<String> = sim
                .masters
                .iter()
                .map(|m| format!("{:+.4}", m.rate - 1.0))
                .collect();
            sim.tr(None, true, || format!("master clock skews {rates:?}"));
        }
        sim
    }

    /// Run to the horizon (or the event budget); returns the first violation, if any.
    pub fn run(&mut self) -> Option<Violation> {
        while let Some(item) = self.queue.pop() {
            if item.at > self.cfg.horizon || self.stats.events >= self.cfg.max_events {
                break;
            }
            self.now = item.at;
            if let Some(c) = item.ev.client() {
                let until = self.clients[c].paused_until;
                if until > self.now {
                    // Paused: the event waits (in order) until the client resumes.
                    self.push(until, item.ev);
                    continue;
                }
            }
            self.stats.events += 1;
            self.dispatch(item.ev);
        }
        // Holders at the end believe they hold until their validity ends.
        for c in 0..self.clients.len() {
            if self.clients[c].phase == Phase::Holding {
                let end = self.clients[c].valid_until;
                self.close_interval(c, end);
            }
        }
        self.check()
    }

    /// The trace recorded (if enabled).
    pub fn trace(&self) -> &[TraceLine] {
        self.trace.as_deref().unwrap_or(&[])
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The first pair of overlapping intervals of different holders, by start time.
    pub fn check(&self) -> Option<Violation> {
        check_intervals(&self.held)
    }

    fn push(&mut self, at: Us, ev: Ev) {
        self.seq += 1;
        self.queue.push(Item {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn tr(&mut self, client: Option<usize>, notable: bool, text: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            t.push(TraceLine {
                at: self.now,
                client,
                notable,
                text: text(),
            });
        }
    }

    fn link(&self, c: usize, m: usize) -> usize {
        c * self.cfg.masters + m
    }

    fn cut(&self, c: usize, m: usize) -> bool {
        self.cut_until[self.link(c, m)] > self.now
    }

    fn delay(&mut self) -> Us {
        let (lo, hi) = self.cfg.latency;
        if self.rng.f64() < self.cfg.slow_prob {
            self.rng.u64(hi..=self.cfg.slow_max.max(hi))
        } else {
            self.rng.u64(lo..=hi)
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_micros(self.cfg.ttl)
    }

    // ----------------------------------------------------------------------------------
    // Network
    // ----------------------------------------------------------------------------------

    fn send(&mut self, c: usize, m: usize, op: u64, msg: Msg) {
        self.stats.messages += 1;
        let l = self.link(c, m);
        if !self.masters[m].up {
            // No connection: the (re)connect is refused, quickly.
            let d = self.rng.u64(self.cfg.latency.0..=self.cfg.latency.1);
            let at = (self.now + d).max(self.last_m2c[l]);
            self.last_m2c[l] = at;
            let inc = self.masters[m].inc;
            let req = msg.request();
            self.push(
                at,
                Ev::ToClient {
                    c,
                    m,
                    op,
                    req,
                    reply: Reply::Refused,
                    inc,
                },
            );
            return;
        }
        if self.cut(c, m) || self.rng.f64() < self.cfg.drop_prob {
            self.stats.drops += 1;
            self.tr(Some(c), false, || {
                format!("c{c} -> m{m} {msg:?} op{op} DROPPED")
            });
            return;
        }
        let d = self.delay();
        let at = (self.now + d).max(self.last_c2m[l]);
        self.last_c2m[l] = at;
        let inc = self.masters[m].inc;
        self.push(at, Ev::ToMaster { c, m, op, msg, inc });
    }

    fn reply(&mut self, c: usize, m: usize, op: u64, req: Request, reply: Reply) {
        let l = self.link(c, m);
        let lossy = matches!(reply, Reply::Wire(_) | Reply::Amnesiac);
        if lossy && (self.cut(c, m) || self.rng.f64() < self.cfg.drop_prob) {
            self.stats.drops += 1;
            self.tr(Some(c), false, || {
                format!("m{m} -> c{c} op{op} reply DROPPED")
            });
            return;
        }
        let d = self.delay();
        let at = (self.now + d).max(self.last_m2c[l]);
        self.last_m2c[l] = at;
        let inc = self.masters[m].inc;
        self.push(
            at,
            Ev::ToClient {
                c,
                m,
                op,
                req,
                reply,
                inc,
            },
        );
    }

    // ----------------------------------------------------------------------------------
    // Dispatch
    // ----------------------------------------------------------------------------------

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::ToMaster { c, m, op, msg, inc } => self.on_master(c, m, op, msg, inc),
            Ev::ToClient {
                c,
                m,
                op,
                req,
                reply,
                inc,
            } => self.on_reply(c, m, op, req, reply, inc),
            Ev::RoundTimeout { c, op } => {
                let cl = &mut self.clients[c];
                if cl.round.is_some() && cl.op == op {
                    cl.tally.expire();
                    self.tr(Some(c), false, || format!("c{c} op{op} round timeout"));
                    self.decide(c);
                }
            }
            Ev::Start { c } => self.start_acquire(c),
            Ev::WorkDone { c, hold } => self.work_done(c, hold),
            Ev::ExtendDue { c, hold } => self.extend_due(c, hold),
            Ev::Fault => self.inject_fault(),
            Ev::MasterUp { m } => {
                let mm = &mut self.masters[m];
                mm.up = true;
                mm.up_since = mm.clock(self.now);
                self.tr(None, true, || format!("m{m} back up"));
            }
        }
    }

    fn on_master(&mut self, c: usize, m: usize, op: u64, msg: Msg, inc: u32) {
        let req = msg.request();
        if self.cut(c, m) {
            // The partition started while the message was in flight.
            self.stats.drops += 1;
            self.tr(Some(c), false, || {
                format!("c{c} -> m{m} op{op} lost in partition")
            });
            return;
        }
        let now = self.now;
        let (up, cur_inc, uptime) = {
            let mm = &self.masters[m];
            (mm.up, mm.inc, mm.clock(now) - mm.up_since)
        };
        if !up || cur_inc != inc {
            self.tr(Some(c), false, || {
                format!("m{m} resets c{c}'s connection (op{op})")
            });
            self.reply(c, m, op, req, Reply::Closed);
            return;
        }
        if self.cfg.amnesia_guard && uptime < self.cfg.max_ttl as f64 {
            self.tr(Some(c), false, || {
                format!("m{m} refuses c{c} op{op}: restarted less than max_ttl ago")
            });
            self.reply(c, m, op, req, Reply::Amnesiac);
            return;
        }
        let resp3 = self.cfg.resp3;
        let master = &mut self.masters[m];
        let now_ms = master.now_ms(now);
        let wire: &'static [u8] = match msg {
            Msg::Set { res, token, ttl_ms } => {
                if master.get(res, now_ms).is_some() {
                    if resp3 {
                        NULL3
                    } else {
                        NULL2
                    }
                } else {
                    master.store[res] = Some((token, now_ms + ttl_ms));
                    OK
                }
            }
            Msg::Release { res, token } => {
                if master.get(res, now_ms) == Some(token) {
                    master.store[res] = None;
                    ONE
                } else {
                    ZERO
                }
            }
            Msg::Extend { res, token, ttl_ms } => {
                if master.get(res, now_ms) == Some(token) {
                    master.store[res] = Some((token, now_ms + ttl_ms));
                    ONE
                } else {
                    ZERO
                }
            }
        };
        self.tr(Some(c), false, || {
            format!(
                "m{m} {msg:?} from c{c} op{op} -> {}",
                String::from_utf8_lossy(wire).trim_end()
            )
        });
        self.reply(c, m, op, req, Reply::Wire(wire));
    }

    fn outcome(&mut self, req: Request, reply: Reply) -> Outcome {
        match reply {
            Reply::Wire(bytes) => match resp::parse(bytes, &self.limits) {
                Ok(Status::Complete((frame, used))) => {
                    assert_eq!(used, bytes.len(), "one frame per reply");
                    match rules::classify(req, &frame) {
                        Ok(o) => o,
                        Err(()) => panic!(
                            "rules::classify({req:?}) rejected a reply a real master sends: {frame:?}"
                        ),
                    }
                }
                other => panic!("resp::parse on {bytes:?}: {other:?}"),
            },
            Reply::Closed => Outcome::Failed(Fault::Closed(std::io::ErrorKind::ConnectionReset)),
            Reply::Refused => {
                Outcome::Failed(Fault::Connect(std::io::ErrorKind::ConnectionRefused))
            }
            Reply::Amnesiac => {
                self.stats.amnesiac_votes += 1;
                Outcome::Failed(Fault::Amnesiac)
            }
        }
    }

    fn on_reply(&mut self, c: usize, m: usize, op: u64, req: Request, reply: Reply, inc: u32) {
        // The master crashed after writing this reply: it may not have made it out.
        let reply = match reply {
            Reply::Wire(_) if self.masters[m].inc != inc && self.rng.bool() => Reply::Closed,
            r => r,
        };
        let outcome = self.outcome(req, reply);
        let cl = &self.clients[c];
        if cl.round.is_none() || cl.op != op {
            self.stats.late_replies += 1;
            self.tr(Some(c), false, || {
                format!("c{c} <- m{m} op{op} {req:?} {outcome} (late, ignored)")
            });
            return;
        }
        let cl = &mut self.clients[c];
        let counted = cl.tally.record(m, outcome);
        assert!(counted, "a master answered twice in one round");
        let decision = cl.tally.decision();
        self.tr(Some(c), false, || {
            format!("c{c} <- m{m} op{op} {req:?} {outcome} => {decision:?}")
        });
        if decision != Decision::Open {
            self.decide(c);
        }
    }

    // ----------------------------------------------------------------------------------
    // Client
    // ----------------------------------------------------------------------------------

    fn start_round(&mut self, c: usize, kind: Round) {
        let n = self.cfg.masters;
        let op = self.next_op;
        self.next_op += 1;
        let ttl_ms = self.cfg.ttl / MS;
        let now = self.now;
        let cl = &mut self.clients[c];
        cl.round = Some(kind);
        cl.op = op;
        cl.t1 = now;
        cl.tally.reset(n, rules::quorum(n));
        let (res, token) = (cl.res, cl.token);
        for m in 0..n {
            let msg = match kind {
                Round::Acquire => Msg::Set { res, token, ttl_ms },
                Round::Extend => Msg::Extend { res, token, ttl_ms },
            };
            self.send(c, m, op, msg);
        }
        let at = now + self.cfg.round_timeout;
        self.push(at, Ev::RoundTimeout { c, op });
    }

    fn start_acquire(&mut self, c: usize) {
        if self.clients[c].phase != Phase::Idle {
            return;
        }
        let res = self.rng.usize(..self.cfg.resources);
        let token = self.next_token;
        self.next_token += 1;
        let cl = &mut self.clients[c];
        cl.phase = Phase::Acquiring;
        cl.res = res;
        cl.token = token;
        self.stats.acquire_rounds += 1;
        self.start_round(c, Round::Acquire);
        let op = self.clients[c].op;
        self.tr(Some(c), false, || {
            format!("c{c} acquire r{res} token {token} op{op}")
        });
        if self.rng.f64() < self.cfg.pause_in_round {
            let len = self.rng.u64(self.cfg.pause_len.0..=self.cfg.pause_len.1);
            self.pause(c, len);
        }
    }

    fn votes(&self, c: usize) -> String {
        let v: Vec<String> = self.clients[c]
            .tally
            .outcomes()
            .iter()
            .map(|o| o.to_string())
            .collect();
        format!("[{}]", v.join(", "))
    }

    /// The round of client `c` is decided (or expired): judge it with `rules`.
    fn decide(&mut self, c: usize) {
        let now = self.now;
        let (kind, t1) = (
            self.clients[c].round.take().expect("a round"),
            self.clients[c].t1,
        );
        let verdict = rules::judge_acquire(
            &self.clients[c].tally,
            self.ttl(),
            Duration::from_micros(now - t1),
            self.cfg.drift_factor,
            Duration::from_micros(self.cfg.min_validity),
        );
        if let AcquireVerdict::Acquired(v) = verdict {
            assert!(self.clients[c].tally.yes() >= self.quorum);
            assert!(v <= self.ttl());
        }
        match kind {
            Round::Acquire => self.decide_acquire(c, verdict),
            Round::Extend => self.decide_extend(c, verdict),
        }
    }

    fn decide_acquire(&mut self, c: usize, verdict: AcquireVerdict) {
        let now = self.now;
        let votes = self.votes(c);
        let (res, op, t1) = {
            let cl = &self.clients[c];
            (cl.res, cl.op, cl.t1)
        };
        match verdict {
            AcquireVerdict::Acquired(v) => {
                self.stats.acquired += 1;
                // As the client does (`Lock::valid_until = decided_at + validity`): the
                // validity is what is left of the TTL after the round's elapsed time.
                let valid_until = now + v.as_micros() as u64;
                let extends = self.cfg.max_extends;
                let cl = &mut self.clients[c];
                cl.phase = Phase::Holding;
                cl.hold += 1;
                cl.held_from = now;
                cl.held_t1 = t1;
                cl.held_votes = votes.clone();
                cl.valid_until = valid_until;
                cl.extends_left = extends;
                let hold = cl.hold;
                let token = cl.token;
                self.tr(Some(c), true, || {
                    format!(
                        "c{c} ACQUIRED r{res} token {token} op{op} (t1 {}) valid until {} votes {votes}",
                        ms(t1),
                        ms(valid_until)
                    )
                });
                let work = self.rng.u64(0..=self.cfg.work_max);
                self.push(now + work, Ev::WorkDone { c, hold });
                self.schedule_extend(c);
                if self.rng.f64() < self.cfg.pause_after_acquire {
                    let len = self.rng.u64(self.cfg.pause_len.0..=self.cfg.pause_len.1);
                    self.pause(c, len);
                }
            }
            _ => {
                match verdict {
                    AcquireVerdict::Taken => self.stats.taken += 1,
                    AcquireVerdict::NoQuorum => self.stats.no_quorum += 1,
                    _ => self.stats.validity_used_up += 1,
                }
                self.tr(Some(c), false, || {
                    format!("c{c} op{op} failed: {verdict:?} votes {votes}")
                });
                // Release wherever our SET may have landed.
                let targets: Vec<usize> = (0..self.cfg.masters)
                    .filter(|&m| {
                        rules::may_hold(Request::Acquire, self.clients[c].tally.outcomes()[m])
                    })
                    .collect();
                let token = self.clients[c].token;
                if !targets.is_empty() {
                    self.stats.releases_after_failure += 1;
                    let rop = self.next_op;
                    self.next_op += 1;
                    for m in targets {
                        self.send(c, m, rop, Msg::Release { res, token });
                    }
                }
                self.clients[c].phase = Phase::Idle;
                let d = rules::retry_delay(
                    Duration::from_micros(self.cfg.retry_base),
                    Duration::from_micros(self.cfg.retry_jitter),
                    &mut self.rng,
                );
                self.push(now + d.as_micros() as u64, Ev::Start { c });
            }
        }
    }

    fn schedule_extend(&mut self, c: usize) {
        let cl = &self.clients[c];
        if cl.extends_left == 0 {
            return;
        }
        // Extend when a quarter of the TTL (at least two round timeouts) is left.
        let margin = (self.cfg.ttl / 4).max(2 * self.cfg.round_timeout);
        let at = cl.valid_until.saturating_sub(margin).max(self.now);
        let hold = cl.hold;
        self.push(at, Ev::ExtendDue { c, hold });
    }

    fn extend_due(&mut self, c: usize, hold: u64) {
        let cl = &self.clients[c];
        if cl.phase != Phase::Holding || cl.hold != hold || cl.round.is_some() {
            return;
        }
        if self.now >= cl.valid_until {
            // Like `Redlock::extend`: an expired lock is not extended.
            self.tr(Some(c), false, || {
                format!("c{c} too late to extend (validity over)")
            });
            return;
        }
        self.clients[c].extends_left -= 1;
        self.start_round(c, Round::Extend);
        let op = self.clients[c].op;
        self.tr(Some(c), false, || format!("c{c} extend op{op}"));
    }

    fn decide_extend(&mut self, c: usize, verdict: AcquireVerdict) {
        let now = self.now;
        let votes = self.votes(c);
        match verdict {
            AcquireVerdict::Acquired(v) => {
                self.stats.extends_ok += 1;
                let new_until = now + v.as_micros() as u64;
                let (old_until, t1) = (self.clients[c].valid_until, self.clients[c].t1);
                if now > old_until {
                    // The lock lapsed while the extend round ran: the old interval ended
                    // at its validity end, a new one starts now.
                    self.close_interval(c, old_until);
                    let cl = &mut self.clients[c];
                    cl.held_from = now;
                    cl.held_t1 = t1;
                    cl.held_votes = votes.clone();
                }
                self.clients[c].valid_until = new_until;
                self.tr(Some(c), true, || {
                    format!(
                        "c{c} EXTENDED (t1 {}) valid until {} votes {votes}",
                        ms(t1),
                        ms(new_until)
                    )
                });
                self.schedule_extend(c);
            }
            _ => {
                self.stats.extends_failed += 1;
                self.tr(Some(c), true, || {
                    format!("c{c} extend failed: {verdict:?} votes {votes}")
                });
            }
        }
    }

    fn close_interval(&mut self, c: usize, end: Us) {
        let cl = &self.clients[c];
        if end <= cl.held_from {
            return;
        }
        self.held.push(Held {
            res: cl.res,
            client: c,
            token: cl.token,
            t1: cl.held_t1,
            start: cl.held_from,
            end,
            votes: cl.held_votes.clone(),
        });
    }

    fn work_done(&mut self, c: usize, hold: u64) {
        let now = self.now;
        let cl = &self.clients[c];
        if cl.phase != Phase::Holding || cl.hold != hold {
            return;
        }
        let end = if self.cfg.honest_holders {
            now.min(cl.valid_until)
        } else {
            now
        };
        if now > cl.valid_until {
            self.stats.holds_clipped += 1;
        }
        let (res, token) = (cl.res, cl.token);
        self.close_interval(c, end);
        self.tr(Some(c), true, || {
            format!(
                "c{c} done with r{res} token {token} (used it until {}), releasing",
                ms(end)
            )
        });
        let op = self.next_op;
        self.next_op += 1;
        for m in 0..self.cfg.masters {
            self.send(c, m, op, Msg::Release { res, token });
        }
        let cl = &mut self.clients[c];
        cl.phase = Phase::Idle;
        cl.round = None;
        let think = self.rng.u64(0..=self.cfg.think_max);
        self.push(now + think, Ev::Start { c });
    }

    fn pause(&mut self, c: usize, len: Us) {
        self.stats.pauses += 1;
        let until = self.now + len;
        let cl = &mut self.clients[c];
        cl.paused_until = cl.paused_until.max(until);
        self.tr(Some(c), true, || format!("c{c} PAUSED until {}", ms(until)));
    }

    // ----------------------------------------------------------------------------------
    // Faults
    // ----------------------------------------------------------------------------------

    fn inject_fault(&mut self) {
        let mix = self.cfg.mix;
        let mut pick = self.rng.u32(..mix.total());
        let now = self.now;
        let n = self.cfg.masters;
        if pick < mix.partition {
            let (c, m) = (self.rng.usize(..self.cfg.clients), self.rng.usize(..n));
            let len = self
                .rng
                .u64(self.cfg.partition_len.0..=self.cfg.partition_len.1);
            let l = self.link(c, m);
            self.cut_until[l] = self.cut_until[l].max(now + len);
            self.stats.partitions += 1;
            self.tr(None, true, || {
                format!("partition c{c} <-> m{m} until {}", ms(now + len))
            });
            return;
        }
        pick -= mix.partition;
        if pick < mix.isolate {
            let m = self.rng.usize(..n);
            let len = self
                .rng
                .u64(self.cfg.partition_len.0..=self.cfg.partition_len.1);
            for c in 0..self.cfg.clients {
                let l = self.link(c, m);
                self.cut_until[l] = self.cut_until[l].max(now + len);
            }
            self.stats.partitions += 1;
            self.tr(None, true, || {
                format!("m{m} isolated until {}", ms(now + len))
            });
            return;
        }
        pick -= mix.isolate;
        if pick < mix.pause {
            let c = self.rng.usize(..self.cfg.clients);
            let len = self.rng.u64(self.cfg.pause_len.0..=self.cfg.pause_len.1);
            self.pause(c, len);
            return;
        }
        pick -= mix.pause;
        if pick < mix.restart {
            let m = self.rng.usize(..n);
            if !self.masters[m].up {
                return;
            }
            let down = self.rng.u64(self.cfg.downtime.0..=self.cfg.downtime.1);
            let keep = self.cfg.persistence;
            let mm = &mut self.masters[m];
            mm.up = false;
            mm.inc += 1;
            if !keep {
                mm.store.iter_mut().for_each(|k| *k = None);
            }
            self.stats.restarts += 1;
            self.push(now + down, Ev::MasterUp { m });
            self.tr(None, true, || {
                format!(
                    "m{m} CRASHED ({}), restarts at {}",
                    if keep { "data kept" } else { "data lost" },
                    ms(now + down)
                )
            });
            return;
        }
        let m = self.rng.usize(..n);
        let by = self.rng.u64(self.cfg.clock_jump.0..=self.cfg.clock_jump.1);
        self.masters[m].offset += by as f64;
        self.stats.clock_jumps += 1;
        self.tr(None, true, || {
            format!("m{m} CLOCK JUMPS forward {} ms", ms(by))
        });
    }
}

/// The first pair of overlapping intervals (same resource, different holders), by start.
pub fn check_intervals(held: &[Held]) -> Option<Violation> {
    let mut sorted: Vec<&Held> = held.iter().collect();
    sorted.sort_by_key(|h| (h.res, h.start, h.end));
    let mut reach: Option<&Held> = None;
    for h in sorted {
        if let Some(p) = reach {
            if p.res == h.res && h.start < p.end {
                return Some(Violation {
                    first: p.clone(),
                    second: h.clone(),
                });
            }
            if p.res == h.res && p.end >= h.end {
                continue;
            }
        }
        reach = Some(h);
    }
    None
}
