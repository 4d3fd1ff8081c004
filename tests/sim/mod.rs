//! A deterministic discrete-event simulation of Redlock over N simulated masters.
//!
//! Everything the clients decide goes through `redlock_mux::rules` (the same sans-IO core
//! the real client uses): `Tally` (record / decision / expire), `judge_acquire`,
//! `classify` (on reply bytes parsed by `resp::parse`), `may_hold`, `validity` and
//! `retry_delay`. The NEW draw and write-back replies are read by `wire::classify`, a helper
//! kept here because `rules::Request` has no variant for them yet.
//!
//! What is simulated around it:
//!
//! * **Time**: a virtual clock in microseconds; nothing sleeps. The clients' clocks are the
//!   reference ("true") clock. Each master has its own clock `offset + rate * t` (rate
//!   `1 + skew`), on which it evaluates `PX` expiry with Redis' millisecond precision.
//! * **Masters** (`master.rs`): keys with `PX` expiry, fencing counters without TTL, a script
//!   cache. Requests: `SET NX PX`, the all-or-nothing multi-key acquire, compare-and-delete
//!   release, extend, the fencing draw and write-back; the OLD variants behind toggles.
//!   A master is persistent (`appendonly yes` + `appendfsync always`: a restart keeps keys
//!   and counters) or not (a restart loses both). A restart or a `SCRIPT FLUSH` empties the
//!   script cache; after a restart the clients' reconnect handshakes load every script
//!   again, after a flush the next `EVALSHA` of each script gets `-NOSCRIPT`. The amnesia
//!   guard (delayed restart) makes a restarted master refuse to vote until it has been up
//!   for `max_ttl` on its own clock.
//! * **Network**: per-message delays (sometimes slower than a round), drops, partitions of
//!   single client-master links or of a whole master, FIFO order per connection and
//!   direction, free reordering across connections. A request that reaches a master whose
//!   connection died with a restart is answered by a reset; a request to a master that is
//!   down is refused. A link reset (the client's connection to one master dies, e.g. its
//!   stall timeout closed it) fails the client's outstanding request there at once; what
//!   was in flight on it is lost (RST) or, with `close_delivers_in_flight`, still executed
//!   (a graceful close) while the next connection's requests may overtake it.
//! * **Clients**: acquire (t1, fan-out, tally until decided or the round timeout); with
//!   fencing two more rounds (draw, write-back); hold for a random work time, extending by
//!   quorum with random TTLs when validity runs low; release. On failure release (where
//!   `may_hold`, or everywhere after a failed fencing round) and retry after
//!   `retry_delay`. `-NOSCRIPT` is answered by re-sending the request with `EVAL` on that
//!   master (NEW rule: a grant request only while its round is undecided; a release always).
//!   Process pauses (GC) defer everything a client would do until it resumes.
//!
//! The checker (`check.rs`) records hold intervals (from the grant to the earlier of "work
//! done" and the lock's validity end; `honest_holders = false` models a holder that keeps
//! using it after a long pause), fenced grants, extends that failed, and per lock attempt
//! which masters got its keys and where its release ran. It checks properties (i)-(iv).
#![allow(dead_code)]

pub mod check;
pub mod hot;
pub mod master;
pub mod server;
pub mod wire;

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::Duration;

use redlock_mux::resp::Limits;
use redlock_mux::rules::{
    self, AcquireVerdict, Decision, ErrorText, Fault, Outcome, Request, Tally,
};

pub use check::{check_intervals, check_tokens, Call, Grant, Held, Property, Violation};
pub use hot::Hot;
use hot::Mode;
use master::{Answer, Effect, Master, Msg, Publish, Req, Semantics, ALL_SCRIPTS};

/// Simulated time, in microseconds.
pub type Us = u64;
/// One millisecond of simulated time.
pub const MS: Us = 1000;
/// The most resources one lock covers.
pub const MAX_KEYS: usize = 3;

/// The resources of one lock, in the order the caller listed them (`lock_many([b, a])`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Keys {
    len: u8,
    r: [u8; MAX_KEYS],
}

impl Keys {
    pub fn one(r: usize) -> Keys {
        Keys::of(&[r])
    }
    pub fn of(rs: &[usize]) -> Keys {
        assert!(!rs.is_empty() && rs.len() <= MAX_KEYS);
        let mut r = [0u8; MAX_KEYS];
        for (i, &x) in rs.iter().enumerate() {
            r[i] = x as u8;
        }
        Keys {
            len: rs.len() as u8,
            r,
        }
    }
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn first(&self) -> usize {
        self.r[0] as usize
    }
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..self.len as usize).map(move |i| self.r[i] as usize)
    }
    pub fn contains(&self, res: usize) -> bool {
        self.iter().any(|r| r == res)
    }
    pub fn overlaps(&self, o: &Keys) -> bool {
        self.iter().any(|r| o.contains(r))
    }
}

impl fmt::Display for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<String> = self.iter().map(|r| format!("r{r}")).collect();
        write!(f, "[{}]", v.join(","))
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The OLD behaviours, each of which the NEW protocol replaced. All `false`: the NEW
/// protocol. A hazard test turns one on and must find the property it breaks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Old {
    /// Fencing by `INCR` inside the acquire script (the first resource's counter), token =
    /// max of the quorum's answers, unconditional raise-to-at-least write-back to a quorum.
    pub fencing_incr_in_acquire: bool,
    /// Fencing votes of masters without persistence are counted.
    pub no_persistence_refusal: bool,
    /// Draw and write-back use the first listed resource's counter only.
    pub fence_first_resource_only: bool,
    /// Extend is an unconditional `PEXPIRE` with the new (possibly shorter) TTL.
    pub extend_plain_pexpire: bool,
    /// `-NOSCRIPT` is retried with `EVAL` even after the round was decided.
    pub noscript_retry_after_decision: bool,
}

/// One simulation's parameters. A test family derives one from each seed.
#[derive(Clone, Debug)]
pub struct Config {
    pub masters: usize,
    pub clients: usize,
    /// Resources (at most `MAX_KEYS`); a lock takes one, or with `multi_prob` several.
    pub resources: usize,
    /// Probability that a lock covers 2..=resources resources, in random order.
    pub multi_prob: f64,
    /// Probability that a lock attempt uses fencing tokens.
    pub fence_prob: f64,
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
    /// Holders extend (on all masters, judged like an acquire) when their validity runs
    /// low, at most `max_extends` times per hold.
    pub max_extends: u32,
    /// An extend's TTL is `ttl * f`, `f` uniform in this range (whole ms, at least 1 ms).
    pub extend_ttl: (f64, f64),
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
    /// Probability that a client pauses right after it was granted a lock (a GC pause).
    pub pause_after_acquire: f64,
    /// Probability that a client pauses right after writing a round of a lock attempt
    /// (acquire, draw, write-back), before it reads the replies (the attempt's elapsed time
    /// then includes the pause).
    pub pause_in_round: f64,
    pub downtime: (Us, Us),
    /// How many masters (the last ones) run without persistence: a restart loses their
    /// keys and counters. The others keep both.
    pub non_persistent: usize,
    pub amnesia_guard: bool,
    pub max_ttl: Us,
    /// Fencing counters start uniform in `[0, initial_counters]` per master and resource.
    pub initial_counters: u64,
    /// Hazard: a master's clock jumps forward by an amount in this range.
    pub clock_jump: (Us, Us),
    /// An honest holder stops using the lock when its validity runs out, whatever pauses.
    pub honest_holders: bool,
    /// A link reset is a graceful close: requests in flight on the old connection still
    /// run on the master, and the new connection's requests may overtake them.
    pub close_delivers_in_flight: bool,
    /// Checker self-test, not a protocol variant: after a failed acquire, release only on
    /// the masters that said OK (not where the `SET` may have landed late).
    pub cleanup_only_where_ok: bool,
    /// Probability that the caller cancels a lock attempt (a dropped future, a
    /// `CancelHandle`, a deadline) at a random moment of its acquire round: the attempt
    /// fails and is cleaned up like a failed one.
    pub cancel_prob: f64,
    /// The literal reading of the NEW NOSCRIPT rule: a cancelled round never reached a
    /// decision, so it still counts as undecided and its late `-NOSCRIPT` is retried.
    pub cancelled_counts_as_undecided: bool,
    pub old: Old,
    /// Hot resources: clients whose lock calls wait (`ACQUIRE_WAIT`, lines, announcements).
    /// Default: none (every client the polling try-lock loop above).
    pub hot: Hot,
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
    /// One master's script cache is flushed (`SCRIPT FLUSH`).
    pub script_flush: u32,
    /// One client's connection to one master dies.
    pub link_reset: u32,
    /// One client-master link is slow for a while (congestion, TCP retransmission
    /// backoff): every message on it takes `[latency.1, slow_max]`, still in order.
    pub slow_link: u32,
}

impl FaultMix {
    fn total(&self) -> u32 {
        self.partition
            + self.isolate
            + self.pause
            + self.restart
            + self.clock_jump
            + self.script_flush
            + self.link_reset
            + self.slow_link
    }
}

macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// What one run covered.
        #[derive(Clone, Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }
        impl Stats {
            pub fn add(&mut self, o: &Stats) {
                let max_wait = self.max_wait.max(o.max_wait);
                $(self.$name += o.$name;)*
                self.max_wait = max_wait;
            }
        }
    };
}

stats! {
    events,
    messages,
    acquire_rounds,
    /// Locks granted (fenced or not).
    acquired,
    taken,
    no_quorum,
    validity_used_up,
    /// Fenced grants (a draw and a write-back reached a quorum, validity left).
    fenced_grants,
    /// Grants of locks over several resources.
    multi_grants,
    fenced_multi_grants,
    /// Fenced attempts that failed after their acquire reached a quorum.
    draws_failed,
    write_backs_failed,
    fence_validity_used_up,
    /// Fencing votes not asked of a master without persistence.
    refused_not_persistent,
    extends_ok,
    extends_failed,
    /// Extends that failed with a TTL shorter than the acquire's.
    extends_failed_shorter,
    extends_ok_shorter,
    extends_longer,
    releases_after_failure,
    late_replies,
    drops,
    partitions,
    pauses,
    restarts,
    /// Restarts of masters without persistence (keys and counters lost).
    restarts_lost,
    clock_jumps,
    amnesiac_votes,
    holds_clipped,
    script_flushes,
    noscript_replies,
    noscript_retries,
    /// NOSCRIPT retries of a release.
    noscript_release_retries,
    /// Grant requests whose NOSCRIPT came after their round was decided (NEW: not retried).
    noscript_after_decision,
    /// OLD rule: grant requests retried with EVAL after their round was decided.
    noscript_retries_after_decision,
    link_resets,
    slow_links,
    /// Attempts the caller cancelled mid-round.
    cancels,
    /// Requests of a closed connection that still ran on the master (graceful close).
    ran_after_close,
    /// Hot resources: lock calls that waited (one or more refused attempts).
    calls,
    calls_granted,
    /// Attempts made on an announcement (woken before the timed retry).
    woken_by_notice,
    /// Attempts made because a subscription confirmed after an uncovered refusal.
    woken_by_subscribe,
    /// Timed attempts whose wake-up was the holder's expiry (`rules::free_in`), not the
    /// retry delay.
    woken_at_expiry,
    timed_wakes,
    /// Announcements published / delivered / lost (drops, partitions, restarts).
    notices_sent,
    notices_heard,
    notices_lost,
    /// Announcements naming a waiter (`Turn`) / to every waiter of a key (`Released`).
    notices_turn,
    notices_released,
    /// `ACQUIRE_WAIT` refusals of a free key by politeness (`{-1, ''}`).
    polite_refusals,
    /// Subscriptions confirmed / lost with their master.
    subscribed,
    subscriptions_lost,
    /// Calls ended by the caller (cancel), leaving the line.
    calls_cancelled,
    /// The longest wait of a granted call (µs; summed over runs: see `max_wait`).
    max_wait,
}

/// `t` in milliseconds with microsecond digits.
pub fn ms(t: Us) -> String {
    format!("{}.{:03}", t / MS, t % MS)
}

/// What reaches a client from a master.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// A reply, encoded to bytes and parsed by the client.
    Wire(Answer),
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
        req: Req,
        inc: u32,
        link: u32,
    },
    ToClient {
        c: usize,
        m: usize,
        op: u64,
        req: Req,
        reply: Reply,
        inc: u32,
        link: u32,
    },
    RoundTimeout {
        c: usize,
        op: u64,
    },
    /// The caller gives up the attempt whose round is `op`.
    Cancel {
        c: usize,
        op: u64,
    },
    /// The client's connection to `m` died while round `op` waited for it.
    LinkClosed {
        c: usize,
        m: usize,
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
    /// An announcement from master `m` (incarnation `inc`) on `c`'s subscription connection.
    Notice {
        c: usize,
        m: usize,
        p: Publish,
        inc: u32,
    },
    /// A waiting client's timed retry (`gen`: stale once it was woken otherwise).
    Wake {
        c: usize,
        gen: u64,
    },
    /// `c`'s SUBSCRIBE reaches master `m`.
    SubReq {
        c: usize,
        m: usize,
        inc: u32,
        gen: u64,
    },
    /// The master's confirmation reaches `c`.
    SubAck {
        c: usize,
        m: usize,
        inc: u32,
        gen: u64,
    },
    /// `c` sees its subscription connection to `m` die (restart), or it was refused.
    SubLost {
        c: usize,
        m: usize,
        gen: u64,
    },
    /// `c` tries to (re)subscribe to `m` after a backoff.
    SubRetry {
        c: usize,
        m: usize,
        gen: u64,
    },
}

impl Ev {
    /// The client this event is processed by (deferred while that client is paused).
    fn client(&self) -> Option<usize> {
        match *self {
            Ev::ToClient { c, .. }
            | Ev::RoundTimeout { c, .. }
            | Ev::Cancel { c, .. }
            | Ev::LinkClosed { c, .. }
            | Ev::Start { c }
            | Ev::WorkDone { c, .. }
            | Ev::ExtendDue { c, .. }
            | Ev::Notice { c, .. }
            | Ev::Wake { c, .. }
            | Ev::SubAck { c, .. }
            | Ev::SubLost { c, .. }
            | Ev::SubRetry { c, .. } => Some(c),
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Acquire, then (fenced) draw and write-back rounds.
    Acquiring,
    Holding,
    /// A waiting call between attempts (hot resources).
    Sleep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Acquire,
    Draw,
    WriteBack,
    Extend,
}

struct Client {
    phase: Phase,
    round: Option<Round>,
    paused_until: Us,
    op: u64,
    /// The current round's t1.
    t1: Us,
    tally: Tally,
    /// Per master, the integer answered in this round (draw, OLD fenced acquire).
    vals: Vec<i64>,
    keys: Keys,
    token: u64,
    fenced: bool,
    /// The acquire round's t1 and votes (validity of a fenced grant is from this t1).
    acq_t1: Us,
    acq_votes: String,
    /// The fencing token being drawn / written back / held.
    fence: u64,
    fence_votes: String,
    /// The TTL of the current (or last) extend.
    ext_ttl: Us,
    hold: u64,
    held_from: Us,
    held_t1: Us,
    held_votes: String,
    valid_until: Us,
    extends_left: u32,
    /// The last failed extend of this hold: (when, its TTL).
    ext_failed: Option<(Us, Us)>,
    /// The round of the last attempt the caller cancelled.
    cancelled_op: u64,
    /// Hot resources: how this client's lock calls wait, and their state.
    mode: Mode,
    w: hot::Waiter,
}

/// What the checker knows of one lock attempt (indexed by its token).
#[derive(Default)]
struct Attempt {
    client: usize,
    t1: Us,
    failed: bool,
    /// Masters the cleanup release was sent to (bit per master).
    targeted: u16,
    /// Masters where a key with this token was created.
    created: u16,
    /// Per master: when a release of this token first ran there.
    released_at: Vec<Option<Us>>,
    /// Per master: the outcome of the round that failed the attempt.
    report: Vec<Outcome>,
    /// Per master: the cleanup release's reply.
    cleanup: Vec<Outcome>,
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
    sem: Semantics,
    rng: fastrand::Rng,
    now: Us,
    seq: u64,
    queue: BinaryHeap<Item>,
    masters: Vec<Master>,
    clients: Vec<Client>,
    /// Per link (c * masters + m): partitioned until.
    cut_until: Vec<Us>,
    /// Per link: slow until.
    slow_until: Vec<Us>,
    /// Per link: last delivery time client -> master and master -> client (FIFO).
    last_c2m: Vec<Us>,
    last_m2c: Vec<Us>,
    /// Per link: connection number (bumped by a link reset).
    link_inc: Vec<u32>,
    next_token: u64,
    next_op: u64,
    quorum: usize,
    limits: Limits,
    attempts: Vec<Attempt>,
    pub held: Vec<Held>,
    pub grants: Vec<Grant>,
    /// Hot resources: every lock call of a waiting client.
    pub calls: Vec<Call>,
    /// Per link: last delivery time on the subscription connection (FIFO).
    last_sub: Vec<Us>,
    /// The first violation of each property found during the run.
    found: Vec<Violation>,
    pub stats: Stats,
    trace: Option<Vec<TraceLine>>,
}

fn not_persistent() -> Outcome {
    Outcome::Failed(Fault::Handshake(ErrorText::new(
        b"not persistent (appendonly/appendfsync): no fencing vote",
    )))
}

impl Sim {
    pub fn new(cfg: Config, seed: u64, trace: bool) -> Sim {
        assert!(cfg.masters >= 1 && cfg.masters <= 16 && cfg.clients >= 1);
        assert!(cfg.resources >= 1 && cfg.resources <= MAX_KEYS);
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
                let counters = (0..cfg.resources)
                    .map(|_| rng.u64(0..=cfg.initial_counters))
                    .collect();
                Master {
                    rate,
                    offset,
                    up: true,
                    persistent: i + cfg.non_persistent < n,
                    inc: 0,
                    up_since: offset - 10.0 * cfg.max_ttl as f64,
                    store: vec![None; cfg.resources],
                    counters,
                    scripts: ALL_SCRIPTS,
                    lines: vec![None; cfg.resources],
                    waiters: Vec::new(),
                    subs: 0,
                    outbox: Vec::new(),
                }
            })
            .collect();
        // Drawn from their own generator: families without hot clients keep their schedules.
        let mut mode_rng = fastrand::Rng::with_seed(seed ^ 0x4f7c_2d1e_aa55_0f0f);
        let clients = (0..cfg.clients)
            .map(|_| Client {
                mode: cfg.hot.mode(&mut mode_rng),
                w: hot::Waiter::new(n),
                phase: Phase::Idle,
                round: None,
                paused_until: 0,
                op: 0,
                t1: 0,
                tally: Tally::new(n, rules::quorum(n)),
                vals: vec![0; n],
                keys: Keys::one(0),
                token: 0,
                fenced: false,
                acq_t1: 0,
                acq_votes: String::new(),
                fence: 0,
                fence_votes: String::new(),
                ext_ttl: 0,
                hold: 0,
                held_from: 0,
                held_t1: 0,
                held_votes: String::new(),
                valid_until: 0,
                extends_left: 0,
                ext_failed: None,
                cancelled_op: 0,
            })
            .collect();
        let links = cfg.clients * n;
        let sem = Semantics {
            extend_never_shortens: !cfg.old.extend_plain_pexpire,
            fence_all_resources: !cfg.old.fence_first_resource_only,
            line_by_master_arrival: cfg.hot.line_by_master_arrival,
            polite_refuses_first: cfg.hot.polite_refuses_first,
            grant_skips_refresh: cfg.hot.grant_skips_refresh,
        };
        let mut sim = Sim {
            quorum: rules::quorum(n),
            sem,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            masters,
            clients,
            cut_until: vec![0; links],
            slow_until: vec![0; links],
            last_c2m: vec![0; links],
            last_m2c: vec![0; links],
            link_inc: vec![0; links],
            next_token: 1,
            next_op: 1,
            limits: Limits::default(),
            attempts: Vec::new(),
            held: Vec::new(),
            grants: Vec::new(),
            calls: Vec::new(),
            last_sub: vec![0; links],
            found: Vec::new(),
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
            let persistent: Vec<bool> = sim.masters.iter().map(|m| m.persistent).collect();
            let modes: Vec<Mode> = sim.clients.iter().map(|c| c.mode).collect();
            sim.tr(None, true, || format!("client modes {modes:?}"));
            let counters: Vec<Vec<u64>> = sim.masters.iter().map(|m| m.counters.clone()).collect();
            sim.tr(None, true, || {
                format!(
                    "master clock skews {rates:?}, persistent {persistent:?}, counters {counters:?}"
                )
            });
        }
        sim
    }

    /// Run to the horizon (or the event budget); returns the first violation of each
    /// property found, in the order (i), (ii), (iii), (iv).
    pub fn run(&mut self) -> Vec<Violation> {
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
        self.check_reports();
        self.check_calls();
        let mut all = Vec::new();
        if let Some(o) = check_intervals(&self.held) {
            all.push(Violation::Overlap(o));
        }
        if let Some(v) = check_tokens(&self.grants, self.cfg.resources) {
            all.push(v);
        }
        all.append(&mut self.found);
        all
    }

    /// The trace recorded (if enabled).
    pub fn trace(&self) -> &[TraceLine] {
        self.trace.as_deref().unwrap_or(&[])
    }

    pub fn config(&self) -> &Config {
        &self.cfg
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

    /// Record a violation found during the run (the first of each property).
    fn found(&mut self, v: Violation) {
        if self.found.iter().any(|f| f.property() == v.property()) {
            return;
        }
        let text = v.to_string();
        self.tr(None, true, || format!("VIOLATION {text}"));
        self.found.push(v);
    }

    fn link(&self, c: usize, m: usize) -> usize {
        c * self.cfg.masters + m
    }

    fn cut(&self, c: usize, m: usize) -> bool {
        self.cut_until[self.link(c, m)] > self.now
    }

    fn delay(&mut self, l: usize) -> Us {
        let (lo, hi) = self.cfg.latency;
        if self.slow_until[l] > self.now || self.rng.f64() < self.cfg.slow_prob {
            self.rng.u64(hi..=self.cfg.slow_max.max(hi))
        } else {
            self.rng.u64(lo..=hi)
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_micros(self.cfg.ttl)
    }

    fn all_masters(&self) -> u16 {
        ((1u32 << self.cfg.masters) - 1) as u16
    }

    fn attempt(&mut self, token: u64) -> &mut Attempt {
        &mut self.attempts[(token - 1) as usize]
    }

    // ----------------------------------------------------------------------------------
    // Network
    // ----------------------------------------------------------------------------------

    fn send(&mut self, c: usize, m: usize, op: u64, req: Req) {
        self.stats.messages += 1;
        let l = self.link(c, m);
        let link = self.link_inc[l];
        if !self.masters[m].up {
            // No connection: the (re)connect is refused, quickly.
            let d = self.rng.u64(self.cfg.latency.0..=self.cfg.latency.1);
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
                    reply: Reply::Refused,
                    inc,
                    link,
                },
            );
            return;
        }
        if self.cut(c, m) || self.rng.f64() < self.cfg.drop_prob {
            self.stats.drops += 1;
            self.tr(Some(c), false, || {
                format!("c{c} -> m{m} op{op} {req} DROPPED")
            });
            return;
        }
        let d = self.delay(l);
        let at = (self.now + d).max(self.last_c2m[l]);
        self.last_c2m[l] = at;
        let inc = self.masters[m].inc;
        self.push(
            at,
            Ev::ToMaster {
                c,
                m,
                op,
                req,
                inc,
                link,
            },
        );
    }

    fn reply(&mut self, c: usize, m: usize, op: u64, req: Req, reply: Reply, link: u32) {
        let l = self.link(c, m);
        let lossy = matches!(reply, Reply::Wire(_) | Reply::Amnesiac);
        if lossy && (self.cut(c, m) || self.rng.f64() < self.cfg.drop_prob) {
            self.stats.drops += 1;
            self.tr(Some(c), false, || {
                format!("m{m} -> c{c} op{op} reply DROPPED")
            });
            return;
        }
        let d = self.delay(l);
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
                link,
            },
        );
    }

    // ----------------------------------------------------------------------------------
    // Dispatch
    // ----------------------------------------------------------------------------------

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::ToMaster {
                c,
                m,
                op,
                req,
                inc,
                link,
            } => self.on_master(c, m, op, req, inc, link),
            Ev::ToClient {
                c,
                m,
                op,
                req,
                reply,
                inc,
                link,
            } => self.on_reply(c, m, op, req, reply, inc, link),
            Ev::RoundTimeout { c, op } => {
                let cl = &mut self.clients[c];
                if cl.round.is_some() && cl.op == op {
                    cl.tally.expire();
                    self.tr(Some(c), false, || format!("c{c} op{op} round timeout"));
                    self.decide(c);
                }
            }
            Ev::LinkClosed { c, m, op } => {
                let cl = &mut self.clients[c];
                if cl.round.is_some() && cl.op == op && cl.tally.outcomes()[m] == Outcome::Pending {
                    let closed =
                        Outcome::Failed(Fault::Closed(std::io::ErrorKind::ConnectionReset));
                    cl.tally.record(m, closed);
                    let decision = cl.tally.decision();
                    self.tr(Some(c), false, || {
                        format!("c{c} op{op}: connection to m{m} closed => {decision:?}")
                    });
                    if decision != Decision::Open {
                        self.decide(c);
                    }
                }
            }
            Ev::Cancel { c, op } => self.cancel(c, op),
            Ev::Start { c } => self.start_acquire(c),
            Ev::WorkDone { c, hold } => self.work_done(c, hold),
            Ev::ExtendDue { c, hold } => self.extend_due(c, hold),
            Ev::Fault => self.inject_fault(),
            Ev::MasterUp { m } => {
                self.masters[m].come_up(self.now);
                self.tr(None, true, || format!("m{m} back up"));
            }
            Ev::Notice { c, m, p, inc } => self.on_notice(c, m, p, inc),
            Ev::Wake { c, gen } => self.on_wake(c, gen),
            Ev::SubReq { c, m, inc, gen } => self.on_sub_req(c, m, inc, gen),
            Ev::SubAck { c, m, inc, gen } => self.on_sub_ack(c, m, inc, gen),
            Ev::SubLost { c, m, gen } => self.on_sub_lost(c, m, gen),
            Ev::SubRetry { c, m, gen } => self.on_sub_retry(c, m, gen),
        }
    }

    fn on_master(&mut self, c: usize, m: usize, op: u64, req: Req, inc: u32, link: u32) {
        if self.cut(c, m) {
            // The partition started while the message was in flight.
            self.stats.drops += 1;
            self.tr(Some(c), false, || {
                format!("c{c} -> m{m} op{op} lost in partition")
            });
            return;
        }
        let l = self.link(c, m);
        let closed = self.link_inc[l] != link;
        if closed && !self.cfg.close_delivers_in_flight {
            // Reset: what was in flight on the dead connection is gone.
            self.tr(Some(c), false, || {
                format!("c{c} -> m{m} op{op} {req} lost with its connection")
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
            self.reply(c, m, op, req, Reply::Closed, link);
            return;
        }
        if self.cfg.amnesia_guard && uptime < self.cfg.max_ttl as f64 {
            self.tr(Some(c), false, || {
                format!("m{m} refuses c{c} op{op}: restarted less than max_ttl ago")
            });
            self.reply(c, m, op, req, Reply::Amnesiac, link);
            return;
        }
        let (answer, effect) = self.masters[m].execute(req, now, self.sem);
        if matches!(
            answer,
            Answer::Waiting {
                left: -1,
                holder: 0
            }
        ) {
            self.stats.polite_refusals += 1;
        }
        let outbox = std::mem::take(&mut self.masters[m].outbox);
        for p in outbox {
            self.publish(m, p);
        }
        match effect {
            Effect::Created(token) => self.key_created(token, m),
            Effect::Released(token) => {
                let a = self.attempt(token);
                if a.released_at[m].is_none() {
                    a.released_at[m] = Some(now);
                }
            }
            Effect::None => {}
        }
        if closed {
            self.stats.ran_after_close += 1;
        }
        self.tr(Some(c), closed, || {
            format!(
                "m{m} {req} from c{c} op{op} -> {answer}{}",
                if closed {
                    " (ran after its connection was closed; reply lost)"
                } else {
                    ""
                }
            )
        });
        if !closed {
            self.reply(c, m, op, req, Reply::Wire(answer), link);
        }
    }

    fn outcome(&mut self, msg: &Msg, reply: Reply) -> (Outcome, i64, Option<u64>) {
        match reply {
            Reply::Wire(a) => wire::read(msg, a, self.cfg.resp3, &self.limits),
            Reply::Closed => (
                Outcome::Failed(Fault::Closed(std::io::ErrorKind::ConnectionReset)),
                0,
                None,
            ),
            Reply::Refused => (
                Outcome::Failed(Fault::Connect(std::io::ErrorKind::ConnectionRefused)),
                0,
                None,
            ),
            Reply::Amnesiac => {
                self.stats.amnesiac_votes += 1;
                (Outcome::Failed(Fault::Amnesiac), 0, None)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_reply(
        &mut self,
        c: usize,
        m: usize,
        op: u64,
        req: Req,
        reply: Reply,
        inc: u32,
        link: u32,
    ) {
        if self.link_inc[self.link(c, m)] != link {
            // The client closed or lost that connection; its requests there already failed.
            return;
        }
        // The master crashed after writing this reply: it may not have made it out.
        let reply = match reply {
            Reply::Wire(_) if self.masters[m].inc != inc && self.rng.bool() => Reply::Closed,
            r => r,
        };
        let (outcome, value, holder) = self.outcome(&req.msg, reply);
        let noscript = wire::is_noscript(outcome);
        if noscript {
            self.stats.noscript_replies += 1;
        }
        if let Msg::Release { token, .. } = req.msg {
            if noscript {
                // A release is always retried.
                self.stats.noscript_retries += 1;
                self.stats.noscript_release_retries += 1;
                self.tr(Some(c), false, || {
                    format!("c{c} <- m{m} op{op} NOSCRIPT for {req}: retry with EVAL")
                });
                self.send(c, m, op, Req { eval: true, ..req });
                return;
            }
            let a = self.attempt(token);
            if a.failed && a.cleanup[m] == Outcome::Pending {
                a.cleanup[m] = outcome;
            }
            self.tr(Some(c), false, || {
                format!("c{c} <- m{m} op{op} {req}: {outcome}")
            });
            return;
        }
        let current = self.clients[c].round.is_some() && self.clients[c].op == op;
        if noscript {
            let undecided = current
                || (self.cfg.cancelled_counts_as_undecided && self.clients[c].cancelled_op == op);
            if undecided || self.cfg.old.noscript_retry_after_decision {
                self.stats.noscript_retries += 1;
                if !current {
                    self.stats.noscript_after_decision += 1;
                    self.stats.noscript_retries_after_decision += 1;
                }
                self.tr(Some(c), !current, || {
                    format!(
                        "c{c} <- m{m} op{op} NOSCRIPT for {req}: retry with EVAL{}",
                        if current {
                            ""
                        } else if undecided {
                            " (cancelled round counted as undecided)"
                        } else {
                            " (round already decided: OLD rule)"
                        }
                    )
                });
                self.send(c, m, op, Req { eval: true, ..req });
            } else {
                self.stats.noscript_after_decision += 1;
                self.tr(Some(c), false, || {
                    format!("c{c} <- m{m} op{op} NOSCRIPT for {req}: round decided, not retried")
                });
            }
            return;
        }
        if !current {
            self.stats.late_replies += 1;
            self.tr(Some(c), false, || {
                format!("c{c} <- m{m} op{op} {req}: {outcome} (late, ignored)")
            });
            return;
        }
        let cl = &mut self.clients[c];
        let counted = cl.tally.record(m, outcome);
        assert!(counted, "a master answered twice in one round");
        cl.vals[m] = value;
        if matches!(req.msg, Msg::AcquireWait { .. }) && outcome == Outcome::Taken {
            // What `Engine::op_reply` keeps of an `AcquireWait` refusal.
            cl.w.left[m] = value;
            cl.w.holder[m] = holder;
        }
        let decision = cl.tally.decision();
        self.tr(Some(c), false, || {
            format!("c{c} <- m{m} op{op} {req}: {outcome} => {decision:?}")
        });
        if decision != Decision::Open {
            self.decide(c);
        }
    }

    // ----------------------------------------------------------------------------------
    // Checker hooks
    // ----------------------------------------------------------------------------------

    /// (iv): a key holding `token` was just created on `m`.
    fn key_created(&mut self, token: u64, m: usize) {
        let now = self.now;
        let a = self.attempt(token);
        a.created |= 1 << m;
        if let Some(at) = a.released_at[m] {
            let (client, t1) = (a.client, a.t1);
            self.found(Violation::Orphan {
                token,
                client,
                master: m,
                t1,
                at: now,
                what: format!(
                    "created after the attempt's release ran there (at {} ms); nobody owns it \
                     until it expires",
                    ms(at)
                ),
            });
        }
    }

    /// (iv), after the run: a failed attempt's key that no release removed may only be on
    /// a master the cleanup release was sent to and could not reach (its reply, the report's
    /// last word on that master, is missing or a failure). A key on a master the cleanup
    /// never went to means the acquire's report was wrong about it (`may_hold` said our key
    /// could not be there).
    fn check_reports(&mut self) {
        let mut bad = None;
        for (i, a) in self.attempts.iter().enumerate() {
            if !a.failed {
                continue;
            }
            for m in 0..self.cfg.masters {
                if a.created & (1 << m) == 0 || a.released_at[m].is_some() {
                    continue;
                }
                let targeted = a.targeted & (1 << m) != 0;
                let said = if targeted { a.cleanup[m] } else { a.report[m] };
                let excused = targeted
                    && matches!(
                        said,
                        Outcome::Pending | Outcome::TimedOut | Outcome::Failed(_)
                    );
                if !excused {
                    bad = Some(Violation::Orphan {
                        token: i as u64 + 1,
                        client: a.client,
                        master: m,
                        t1: a.t1,
                        at: self.now,
                        what: if targeted {
                            format!("no release ran there, yet the cleanup's reply says \"{said}\"")
                        } else {
                            format!(
                                "the key landed but the cleanup never went there: the acquire's \
                                 report says \"{said}\""
                            )
                        },
                    });
                    break;
                }
            }
            if bad.is_some() {
                break;
            }
        }
        if let Some(v) = bad {
            self.found(v);
        }
    }

    // ----------------------------------------------------------------------------------
    // Client
    // ----------------------------------------------------------------------------------

    /// Whether this round's vote of master `m` is refused (fencing on a master without
    /// persistence).
    fn refused(&self, c: usize, kind: Round, m: usize) -> bool {
        self.clients[c].fenced
            && kind != Round::Extend
            && !self.cfg.old.no_persistence_refusal
            && !self.masters[m].persistent
    }

    fn start_round(&mut self, c: usize, kind: Round) {
        let n = self.cfg.masters;
        let op = self.next_op;
        self.next_op += 1;
        let now = self.now;
        let old_fencing = self.cfg.old.fencing_incr_in_acquire;
        let cl = &mut self.clients[c];
        cl.round = Some(kind);
        cl.op = op;
        cl.t1 = now;
        cl.tally.reset(n, rules::quorum(n));
        cl.vals.iter_mut().for_each(|v| *v = 0);
        if kind == Round::Acquire {
            cl.w.left.iter_mut().for_each(|v| *v = 0);
            cl.w.holder.iter_mut().for_each(|h| *h = None);
            cl.w.t1 = now;
        }
        let (keys, token, fence, fenced) = (cl.keys, cl.token, cl.fence, cl.fenced);
        let ttl_ms = match kind {
            Round::Extend => cl.ext_ttl / MS,
            _ => self.cfg.ttl / MS,
        };
        let msg = match kind {
            Round::Acquire if cl.mode != Mode::Try => Msg::AcquireWait {
                keys,
                token,
                ttl_ms,
                line: cl.w.line(cl.mode, keys),
            },
            Round::Acquire if fenced && old_fencing => Msg::OldFencedAcquire {
                keys,
                token,
                ttl_ms,
            },
            Round::Acquire => Msg::Set {
                keys,
                token,
                ttl_ms,
            },
            Round::Draw => Msg::Draw { keys, token },
            Round::WriteBack if old_fencing => Msg::OldFenceMax {
                res: keys.first() as u8,
                value: fence,
            },
            Round::WriteBack => Msg::WriteBack {
                keys,
                token,
                value: fence,
            },
            Round::Extend => Msg::Extend {
                keys,
                token,
                ttl_ms,
            },
        };
        for m in 0..n {
            if self.refused(c, kind, m) {
                self.stats.refused_not_persistent += 1;
                self.clients[c].tally.record(m, not_persistent());
                continue;
            }
            self.send(c, m, op, Req { msg, eval: false });
        }
        let at = now + self.cfg.round_timeout;
        self.push(at, Ev::RoundTimeout { c, op });
        if self.clients[c].tally.decision() != Decision::Open {
            // Too many votes refused up front.
            self.decide(c);
            return;
        }
        if kind != Round::Extend && self.rng.f64() < self.cfg.pause_in_round {
            // A pause between writing a round of a lock attempt and reading its replies:
            // the attempt's elapsed time (validity) includes it.
            let len = self.rng.u64(self.cfg.pause_len.0..=self.cfg.pause_len.1);
            self.pause(c, len);
        }
    }

    /// A new lock call's resources (several with `multi_prob`) and whether it is fenced.
    pub(super) fn draw_call(&mut self) -> (Keys, bool) {
        let r = self.cfg.resources;
        let keys = if r >= 2 && self.rng.f64() < self.cfg.multi_prob {
            let mut all: Vec<usize> = (0..r).collect();
            self.rng.shuffle(&mut all);
            let k = self.rng.usize(2..=r);
            Keys::of(&all[..k])
        } else {
            Keys::one(self.rng.usize(..r))
        };
        (keys, self.rng.f64() < self.cfg.fence_prob)
    }

    fn start_acquire(&mut self, c: usize) {
        if self.clients[c].phase != Phase::Idle {
            return;
        }
        if self.clients[c].mode != Mode::Try {
            self.start_call(c);
            return;
        }
        let (keys, fenced) = self.draw_call();
        let token = self.next_token;
        self.next_token += 1;
        let n = self.cfg.masters;
        self.attempts.push(Attempt {
            client: c,
            t1: self.now,
            released_at: vec![None; n],
            ..Attempt::default()
        });
        let cl = &mut self.clients[c];
        cl.phase = Phase::Acquiring;
        cl.keys = keys;
        cl.token = token;
        cl.fenced = fenced;
        self.stats.acquire_rounds += 1;
        self.tr(Some(c), false, || {
            format!(
                "c{c} acquire {keys} token {token}{}",
                if fenced { " (fenced)" } else { "" }
            )
        });
        self.start_round(c, Round::Acquire);
        if self.clients[c].round.is_some() && self.rng.f64() < self.cfg.cancel_prob {
            let op = self.clients[c].op;
            let at = self.now + self.rng.u64(..self.cfg.round_timeout);
            self.push(at, Ev::Cancel { c, op });
        }
    }

    fn votes(&self, c: usize) -> String {
        let cl = &self.clients[c];
        // Rounds whose yes votes carry a number: the draw, the OLD fenced acquire.
        let valued = match cl.round {
            Some(Round::Draw) => true,
            Some(Round::Acquire) => cl.fenced && self.cfg.old.fencing_incr_in_acquire,
            _ => false,
        };
        let v: Vec<String> = cl
            .tally
            .outcomes()
            .iter()
            .zip(&cl.vals)
            .map(|(o, &x)| match o {
                Outcome::Ok if valued => format!("ok {x}"),
                o => o.to_string(),
            })
            .collect();
        format!("[{}]", v.join(", "))
    }

    /// The largest integer among the yes votes of this round.
    fn max_yes_value(&self, c: usize) -> u64 {
        let cl = &self.clients[c];
        cl.tally
            .outcomes()
            .iter()
            .zip(&cl.vals)
            .filter(|(o, _)| o.is_ok())
            .map(|(_, &v)| v.max(0) as u64)
            .max()
            .unwrap_or(0)
    }

    /// The round of client `c` is decided (or expired): judge it with `rules`.
    fn decide(&mut self, c: usize) {
        let kind = self.clients[c].round.expect("a round");
        // Votes are rendered while the round is still set (draw values show).
        let votes = self.votes(c);
        self.clients[c].round = None;
        match kind {
            Round::Acquire => self.decide_acquire(c, votes),
            Round::Draw => self.decide_draw(c, votes),
            Round::WriteBack => self.decide_write_back(c, votes),
            Round::Extend => self.decide_extend(c, votes),
        }
    }

    fn judge(&self, c: usize, ttl: Us, t1: Us) -> AcquireVerdict {
        let verdict = rules::judge_acquire(
            &self.clients[c].tally,
            Duration::from_micros(ttl),
            Duration::from_micros(self.now - t1),
            self.cfg.drift_factor,
            Duration::from_micros(self.cfg.min_validity),
        );
        if let AcquireVerdict::Acquired(v) = verdict {
            assert!(self.clients[c].tally.yes() >= self.quorum);
            assert!(v.as_micros() as u64 <= ttl);
        }
        verdict
    }

    /// The library's request for client `c`'s acquire round (what `rules::may_hold` needs:
    /// a plain `SET` refuses whole, a script may have written before an error).
    fn acquire_request(&self, c: usize) -> Request {
        let cl = &self.clients[c];
        if cl.mode != Mode::Try {
            Request::AcquireWait
        } else if cl.keys.len() == 1 && !(cl.fenced && self.cfg.old.fencing_incr_in_acquire) {
            Request::Acquire
        } else {
            Request::AcquireMany
        }
    }

    fn decide_acquire(&mut self, c: usize, votes: String) {
        let now = self.now;
        let (keys, op, t1, fenced) = {
            let cl = &self.clients[c];
            (cl.keys, cl.op, cl.t1, cl.fenced)
        };
        let verdict = self.judge(c, self.cfg.ttl, t1);
        if self.clients[c].mode != Mode::Try {
            self.read_hint(c);
        }
        match verdict {
            AcquireVerdict::Acquired(v) => {
                if !fenced {
                    let t1 = self.clients[c].t1;
                    self.grant(c, now + v.as_micros() as u64, t1, votes);
                    return;
                }
                let cl = &mut self.clients[c];
                cl.acq_t1 = t1;
                cl.acq_votes = votes.clone();
                if self.cfg.old.fencing_incr_in_acquire {
                    // OLD: the token is the largest counter the quorum's acquires returned.
                    let fence = self.max_yes_value(c);
                    let cl = &mut self.clients[c];
                    cl.fence = fence;
                    cl.fence_votes = format!("acquire {votes}");
                    self.tr(Some(c), false, || {
                        format!("c{c} op{op} acquired {keys}, votes {votes}: writing back fencing token {fence}")
                    });
                    self.start_round(c, Round::WriteBack);
                } else {
                    self.tr(Some(c), false, || {
                        format!(
                            "c{c} op{op} acquired {keys}, votes {votes}: drawing a fencing token"
                        )
                    });
                    self.start_round(c, Round::Draw);
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
                // Release wherever our keys may have landed.
                let mut targets = 0u16;
                let only_ok = self.cfg.cleanup_only_where_ok;
                for (m, &o) in self.clients[c].tally.outcomes().iter().enumerate() {
                    if if only_ok {
                        o.is_ok()
                    } else {
                        rules::may_hold(self.acquire_request(c), o)
                    } {
                        targets |= 1 << m;
                    }
                }
                self.fail_attempt(c, targets);
            }
        }
    }

    fn decide_draw(&mut self, c: usize, votes: String) {
        let op = self.clients[c].op;
        if self.clients[c].tally.yes() >= self.quorum {
            let fence = self.max_yes_value(c);
            let cl = &mut self.clients[c];
            cl.fence = fence;
            cl.fence_votes = format!("draw {votes}");
            self.tr(Some(c), false, || {
                format!("c{c} op{op} drew fencing token {fence}, votes {votes}: writing it back")
            });
            self.start_round(c, Round::WriteBack);
        } else {
            self.stats.draws_failed += 1;
            self.tr(Some(c), true, || {
                format!("c{c} op{op} draw failed, votes {votes}: releasing everywhere")
            });
            let all = self.all_masters();
            self.fail_attempt(c, all);
        }
    }

    fn decide_write_back(&mut self, c: usize, votes: String) {
        let now = self.now;
        let (op, acq_t1, fence) = {
            let cl = &self.clients[c];
            (cl.op, cl.acq_t1, cl.fence)
        };
        // Validity from the acquire's t1, at the write-back's decision.
        let verdict = self.judge(c, self.cfg.ttl, acq_t1);
        match verdict {
            AcquireVerdict::Acquired(v) => {
                let cl = &mut self.clients[c];
                let fv = std::mem::take(&mut cl.fence_votes);
                cl.fence_votes = format!("{fv} write-back {votes}");
                let grant_votes = format!("{}, token {fence}", cl.acq_votes);
                self.grant(c, now + v.as_micros() as u64, acq_t1, grant_votes);
            }
            _ => {
                if verdict == AcquireVerdict::ValidityUsedUp {
                    self.stats.fence_validity_used_up += 1;
                } else {
                    self.stats.write_backs_failed += 1;
                }
                self.tr(Some(c), true, || {
                    format!(
                        "c{c} op{op} write-back of {fence} failed: {verdict:?} votes {votes}: \
                         releasing everywhere"
                    )
                });
                let all = self.all_masters();
                self.fail_attempt(c, all);
            }
        }
    }

    /// The caller cancels the attempt whose round `op` is still open (acquire, draw or
    /// write-back): clean up as for a failed attempt.
    fn cancel(&mut self, c: usize, op: u64) {
        let cl = &self.clients[c];
        let Some(kind) = cl.round else { return };
        if cl.op != op || kind == Round::Extend {
            return;
        }
        self.stats.cancels += 1;
        let votes = self.votes(c);
        let cl = &mut self.clients[c];
        cl.round = None;
        cl.cancelled_op = op;
        // A waiting call ends with its cancel (`Error::Cancelled`: the last cleanup).
        cl.w.cancelled = cl.mode != Mode::Try;
        self.tr(Some(c), true, || {
            format!("c{c} op{op} CANCELLED by the caller ({kind:?} round, votes {votes})")
        });
        let targets = if kind == Round::Acquire {
            let mut t = 0u16;
            for (m, &o) in self.clients[c].tally.outcomes().iter().enumerate() {
                if rules::may_hold(self.acquire_request(c), o) {
                    t |= 1 << m;
                }
            }
            t
        } else {
            self.all_masters()
        };
        self.fail_attempt(c, targets);
    }

    /// The attempt failed: release on `targets`, retry later.
    fn fail_attempt(&mut self, c: usize, targets: u16) {
        let now = self.now;
        let (keys, token) = (self.clients[c].keys, self.clients[c].token);
        let report = self.clients[c].tally.outcomes().to_vec();
        let n = self.cfg.masters;
        // A waiting call's last cleanup takes it out of its key's lines, on every master
        // (`Machine::cleanup` with `last`).
        let leave = if self.clients[c].w.cancelled {
            self.clients[c].w.wait_id
        } else {
            None
        };
        let targets = if leave.is_some() {
            (1u16 << n) - 1
        } else {
            targets
        };
        let a = self.attempt(token);
        a.failed = true;
        a.targeted = targets;
        a.report = report;
        a.cleanup = vec![Outcome::Pending; n];
        if targets != 0 {
            self.stats.releases_after_failure += 1;
            let rop = self.next_op;
            self.next_op += 1;
            for m in 0..n {
                if targets & (1 << m) != 0 {
                    let msg = Msg::Release { keys, token, leave };
                    self.send(c, m, rop, Req { msg, eval: false });
                }
            }
            if matches!(self.clients[c].mode, Mode::Notify { .. }) {
                // `Machine::cleanup`: the cleanup's own announcements are no news.
                self.clients[c].w.own = Some(token);
            }
        }
        if self.clients[c].mode != Mode::Try {
            self.wait_after_failure(c);
            return;
        }
        self.clients[c].phase = Phase::Idle;
        let d = rules::retry_delay(
            Duration::from_micros(self.cfg.retry_base),
            Duration::from_micros(self.cfg.retry_jitter),
            &mut self.rng,
        );
        self.push(now + d.as_micros() as u64, Ev::Start { c });
    }

    /// Client `c` now holds its lock until `valid_until`.
    fn grant(&mut self, c: usize, valid_until: Us, t1: Us, votes: String) {
        let now = self.now;
        let (keys, token, fenced, fence) = {
            let cl = &self.clients[c];
            (cl.keys, cl.token, cl.fenced, cl.fence)
        };
        // (iii): nobody else's lock on these resources may still report valid after a
        // failed extend.
        for h in 0..self.clients.len() {
            let hc = &self.clients[h];
            if h == c || hc.phase != Phase::Holding || !hc.keys.overlaps(&keys) {
                continue;
            }
            if let Some((failed_at, failed_ttl)) = hc.ext_failed {
                if now < hc.valid_until {
                    let res = hc.keys.iter().find(|&r| keys.contains(r)).expect("overlap");
                    let v = Violation::AfterFailedExtend {
                        res,
                        holder: h,
                        holder_token: hc.token,
                        held_t1: hc.held_t1,
                        failed_at,
                        failed_ttl,
                        deadline: hc.valid_until,
                        grantee: c,
                        grantee_token: token,
                        granted_at: now,
                        votes: votes.clone(),
                    };
                    self.found(v);
                }
            }
        }
        self.stats.acquired += 1;
        if keys.len() > 1 {
            self.stats.multi_grants += 1;
        }
        if fenced {
            self.stats.fenced_grants += 1;
            if keys.len() > 1 {
                self.stats.fenced_multi_grants += 1;
            }
            let fence_votes = self.clients[c].fence_votes.clone();
            self.grants.push(Grant {
                at: now,
                client: c,
                keys,
                token,
                fence,
                t1,
                votes: fence_votes,
            });
        }
        if self.clients[c].mode != Mode::Try {
            self.call_granted(c);
        }
        let extends = self.cfg.max_extends;
        let cl = &mut self.clients[c];
        cl.phase = Phase::Holding;
        cl.hold += 1;
        cl.held_from = now;
        cl.held_t1 = t1;
        cl.held_votes = votes.clone();
        cl.valid_until = valid_until;
        cl.extends_left = extends;
        cl.ext_failed = None;
        let hold = cl.hold;
        self.tr(Some(c), true, || {
            format!(
                "c{c} GRANTED {keys} token {token}{} (t1 {}) valid until {} votes {votes}",
                if fenced {
                    format!(" FENCING TOKEN {fence}")
                } else {
                    String::new()
                },
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
        let (lo, hi) = self.cfg.extend_ttl;
        let f = lo + self.rng.f64() * (hi - lo);
        let ttl = ((self.cfg.ttl as f64 * f / MS as f64).round() as u64).max(1) * MS;
        let cl = &mut self.clients[c];
        cl.extends_left -= 1;
        cl.ext_ttl = ttl;
        self.start_round(c, Round::Extend);
        let op = self.clients[c].op;
        self.tr(Some(c), false, || {
            format!("c{c} extend op{op} px {} ms", ttl / MS)
        });
    }

    fn decide_extend(&mut self, c: usize, votes: String) {
        let now = self.now;
        let (t1, ext_ttl) = (self.clients[c].t1, self.clients[c].ext_ttl);
        let verdict = self.judge(c, ext_ttl, t1);
        let shorter = ext_ttl < self.cfg.ttl;
        if ext_ttl > self.cfg.ttl {
            self.stats.extends_longer += 1;
        }
        match verdict {
            AcquireVerdict::Acquired(v) => {
                self.stats.extends_ok += 1;
                if shorter {
                    self.stats.extends_ok_shorter += 1;
                }
                let ext_until = now + v.as_micros() as u64;
                let old_until = self.clients[c].valid_until;
                let new_until = if self.cfg.old.extend_plain_pexpire {
                    ext_until
                } else {
                    old_until.max(ext_until)
                };
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
                        "c{c} EXTENDED px {} ms (t1 {}) valid until {} votes {votes}",
                        ext_ttl / MS,
                        ms(t1),
                        ms(new_until)
                    )
                });
                self.schedule_extend(c);
            }
            _ => {
                self.stats.extends_failed += 1;
                if shorter {
                    self.stats.extends_failed_shorter += 1;
                }
                self.clients[c].ext_failed = Some((now, ext_ttl));
                let until = self.clients[c].valid_until;
                self.tr(Some(c), true, || {
                    format!(
                        "c{c} extend px {} ms failed: {verdict:?} votes {votes}; still valid until {}",
                        ext_ttl / MS,
                        ms(until)
                    )
                });
            }
        }
    }

    fn close_interval(&mut self, c: usize, end: Us) {
        let cl = &self.clients[c];
        if end <= cl.held_from {
            return;
        }
        for res in cl.keys.iter() {
            self.held.push(Held {
                res,
                client: c,
                token: cl.token,
                t1: cl.held_t1,
                start: cl.held_from,
                end,
                votes: cl.held_votes.clone(),
            });
        }
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
        let (keys, token) = (cl.keys, cl.token);
        self.close_interval(c, end);
        self.tr(Some(c), true, || {
            format!(
                "c{c} done with {keys} token {token} (used it until {}), releasing",
                ms(end)
            )
        });
        let op = self.next_op;
        self.next_op += 1;
        let leave = self.clients[c].w.lock_line.take();
        for m in 0..self.cfg.masters {
            let msg = Msg::Release { keys, token, leave };
            self.send(c, m, op, Req { msg, eval: false });
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
            let keep = self.masters[m].persistent;
            self.masters[m].crash();
            self.subscriptions_die(m);
            self.stats.restarts += 1;
            if !keep {
                self.stats.restarts_lost += 1;
            }
            self.push(now + down, Ev::MasterUp { m });
            self.tr(None, true, || {
                format!(
                    "m{m} CRASHED ({}), restarts at {}",
                    if keep {
                        "persistent: keys and counters kept"
                    } else {
                        "no persistence: keys and counters lost"
                    },
                    ms(now + down)
                )
            });
            return;
        }
        pick -= mix.restart;
        if pick < mix.clock_jump {
            let m = self.rng.usize(..n);
            let by = self.rng.u64(self.cfg.clock_jump.0..=self.cfg.clock_jump.1);
            self.masters[m].offset += by as f64;
            self.stats.clock_jumps += 1;
            self.tr(None, true, || {
                format!("m{m} CLOCK JUMPS forward {} ms", ms(by))
            });
            return;
        }
        pick -= mix.clock_jump;
        if pick < mix.slow_link {
            let (c, m) = (self.rng.usize(..self.cfg.clients), self.rng.usize(..n));
            let len = self
                .rng
                .u64(self.cfg.partition_len.0..=self.cfg.partition_len.1);
            let l = self.link(c, m);
            self.slow_until[l] = self.slow_until[l].max(now + len);
            self.stats.slow_links += 1;
            self.tr(None, true, || {
                format!("link c{c} <-> m{m} SLOW until {}", ms(now + len))
            });
            return;
        }
        pick -= mix.slow_link;
        if pick < mix.script_flush {
            let m = self.rng.usize(..n);
            self.masters[m].scripts = 0;
            self.stats.script_flushes += 1;
            self.tr(None, true, || format!("m{m} SCRIPT FLUSH"));
            return;
        }
        // Link reset: the client's connection to one master dies. Its request there (if
        // its round waits for one) fails at once; the next request opens a new connection.
        let (c, m) = (self.rng.usize(..self.cfg.clients), self.rng.usize(..n));
        let l = self.link(c, m);
        self.link_inc[l] += 1;
        self.last_c2m[l] = now;
        self.last_m2c[l] = now;
        self.stats.link_resets += 1;
        let op = self.clients[c].op;
        self.push(now, Ev::LinkClosed { c, m, op });
        self.tr(Some(c), true, || {
            format!("c{c}'s connection to m{m} CLOSED")
        });
    }
}
