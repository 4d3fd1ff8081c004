//! Deterministic simulation of the Redlock core (`redlock_mux::rules`) over N simulated
//! masters with skewed clocks, a lossy network, partitions, client pauses and master
//! restarts. The model is in `tests/sim/mod.rs`.
//!
//! * Under the model's assumptions (clock rates within the drift bound, restarts that keep
//!   their data or are guarded, holders that stop at validity end) no seed may find a
//!   double grant.
//! * Outside them (restart without persistence and immediate rejoin, a master clock running
//!   fast or jumping, a holder that keeps using the lock after a long pause) a bounded
//!   search must find one: the checker can fail.
//!
//! Environment:
//! * `SIM_SEEDS=<n>`: seeds per safety test / search bound per hazard test (soak).
//! * `SIM_SEED=<n>`: run only that seed, print its trace.
//!
//! Replay a seed: `SIM_SEED=123 cargo test --test simulation <test name> -- --nocapture`.

mod sim;

use std::time::Instant;

use sim::{check_intervals, ms, Config, FaultMix, Held, Sim, Stats, Violation, MS};

const DRIFT: f64 = 0.01;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

/// The common base: a config drawn from `seed` that stays within the model's assumptions.
fn base(seed: u64) -> Config {
    let mut r = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
    let masters = [1, 2, 3, 3, 3, 4, 5, 5, 5, 7][r.usize(..10)];
    // Short TTLs, where the fixed 2 ms of the drift allowance dominates, and long ones,
    // where the clock-rate part (ttl * drift_factor) must do the work.
    let ttl = if r.bool() {
        r.u64(20..=200)
    } else {
        r.u64(200..=3000)
    } * MS;
    let round_timeout = (ttl * r.u64(2..=20) / 100).max(MS);
    let slow = r.u8(..3) == 0;
    Config {
        masters,
        clients: r.usize(2..=5),
        resources: if r.u8(..4) == 0 { 2 } else { 1 },
        ttl,
        drift_factor: DRIFT,
        min_validity: 0,
        round_timeout,
        retry_base: ttl / 8,
        retry_jitter: ttl / 16,
        think_max: ttl / 4,
        work_max: ttl * 3 / 2,
        max_extends: r.u32(0..=3),
        horizon: ttl * 25,
        max_events: 20_000,
        latency: (20, r.u64(100..=1500)),
        // Sometimes a message is slower than the whole round.
        slow_prob: if slow { r.f64() * 0.1 } else { 0.0 },
        slow_max: round_timeout * 2,
        drop_prob: if r.bool() { r.f64() * 0.1 } else { 0.0 },
        resp3: r.bool(),
        // Within the drift bound, close to it: a master may run 0.9 % fast or slow.
        skew_bound: 0.9 * DRIFT,
        fast_masters: 0,
        fast_rate: 1.0,
        faults: r.usize(0..=16),
        mix: FaultMix {
            partition: 3,
            isolate: 1,
            pause: 3,
            restart: 2,
            clock_jump: 0,
        },
        partition_len: (MS, ttl),
        pause_len: (MS, ttl * 2),
        pause_after_acquire: r.f64() * 0.3,
        pause_in_round: r.f64() * 0.02,
        downtime: (0, ttl),
        persistence: true,
        amnesia_guard: false,
        max_ttl: ttl,
        clock_jump: (0, 0),
        honest_holders: true,
    }
}

/// (a) Within the model: persistence on, skew within the bound, honest holders.
fn within_model(seed: u64) -> Config {
    base(seed)
}

/// (c) Restarts lose their data and rejoin at once, but the amnesia guard keeps a restarted
/// master out of every quorum for `max_ttl` on its own clock.
fn guarded_amnesia(seed: u64) -> Config {
    let mut c = base(seed);
    c.persistence = false;
    c.amnesia_guard = true;
    c.mix.restart = 6;
    c.downtime = (0, 2 * MS);
    c.faults = c.faults.max(4);
    c
}

/// A config that makes bare quorums common (a minority of masters unreachable for a while)
/// so that the hazards have something to break.
fn hazard_base(seed: u64) -> Config {
    let mut c = base(seed);
    c.masters = if seed % 3 == 0 { 5 } else { 3 };
    c.clients = c.clients.max(3);
    c.drop_prob = 0.05;
    c.faults = 12;
    c.mix = FaultMix {
        partition: 2,
        isolate: 2,
        pause: 0,
        restart: 0,
        clock_jump: 0,
    };
    c.max_extends = 0;
    c.work_max = c.ttl;
    c
}

/// (b) Restart without persistence and immediate rejoin, no guard.
fn amnesia_unguarded(seed: u64) -> Config {
    let mut c = hazard_base(seed);
    c.persistence = false;
    c.amnesia_guard = false;
    c.mix.restart = 6;
    c.downtime = (0, 2 * MS);
    c
}

/// (b) The guard is there but too short: a restarted master votes again after a quarter
/// of the TTL, while locks it forgot are still held.
fn amnesia_guard_too_short(seed: u64) -> Config {
    let mut c = amnesia_unguarded(seed);
    c.amnesia_guard = true;
    c.max_ttl = c.ttl / 4;
    c
}

/// (b) One master's clock runs twice as fast: its keys expire after half the TTL.
fn fast_clock(seed: u64) -> Config {
    let mut c = hazard_base(seed);
    c.fast_masters = if c.masters == 5 { 2 } else { 1 };
    c.fast_rate = 2.0;
    c
}

/// (b) A master's wall clock jumps forward (NTP step, operator): its keys expire at once.
fn clock_jumps(seed: u64) -> Config {
    let mut c = hazard_base(seed);
    c.mix.clock_jump = 6;
    c.clock_jump = (c.ttl / 2, c.ttl * 2);
    c
}

/// (b) A holder paused past its validity keeps using the lock when it resumes (no fencing).
fn pause_past_validity(seed: u64) -> Config {
    let mut c = hazard_base(seed);
    c.honest_holders = false;
    c.pause_after_acquire = 0.5;
    c.pause_len = (c.ttl, c.ttl * 3);
    c
}

struct RunResult {
    violation: Option<Violation>,
    stats: Stats,
}

fn run_seed(family: fn(u64) -> Config, seed: u64) -> RunResult {
    let mut sim = Sim::new(family(seed), seed, false);
    let violation = sim.run();
    RunResult {
        violation,
        stats: sim.stats,
    }
}

/// Re-run `seed` with tracing on and print what led to the violation (or the whole
/// headline trace when there is none).
fn print_trace(test: &str, family: fn(u64) -> Config, seed: u64) -> Option<Violation> {
    let cfg = family(seed);
    println!("seed {seed}: {cfg:?}");
    let mut sim = Sim::new(cfg, seed, true);
    let violation = sim.run();
    let (from, to, who) = match &violation {
        Some(v) => (
            v.first.t1.min(v.second.t1).saturating_sub(sim.config().ttl),
            v.second.start,
            vec![v.first.client, v.second.client],
        ),
        None => (0, u64::MAX, Vec::new()),
    };
    let lines: Vec<String> = sim
        .trace()
        .iter()
        .filter(|l| l.at >= from && l.at <= to)
        .filter(|l| l.notable || l.client.is_some_and(|c| who.contains(&c)))
        .map(|l| format!("{:>12} ms  {}", ms(l.at), l.text))
        .collect();
    let skip = lines.len().saturating_sub(150);
    if skip > 0 {
        println!("  ... {skip} earlier lines");
    }
    for l in &lines[skip..] {
        println!("  {l}");
    }
    match &violation {
        Some(v) => println!("VIOLATION: {v}"),
        None => println!("no violation; {:?}", sim.stats),
    }
    println!("replay: SIM_SEED={seed} cargo test --test simulation {test} -- --nocapture --exact");
    violation
}

/// Every seed must be free of double grants.
fn expect_safe(test: &str, family: fn(u64) -> Config, default_seeds: u64) -> Stats {
    if let Some(seed) = env_u64("SIM_SEED") {
        let v = print_trace(test, family, seed);
        assert!(v.is_none(), "{test}: seed {seed} found a double grant");
        return Stats::default();
    }
    let seeds = env_u64("SIM_SEEDS").unwrap_or(default_seeds);
    let started = Instant::now();
    let mut total = Stats::default();
    for seed in 0..seeds {
        let r = run_seed(family, seed);
        if let Some(v) = r.violation {
            println!("{test}: seed {seed} FAILED: {v}");
            print_trace(test, family, seed);
            panic!(
                "{test}: double grant at seed {seed}; replay with \
                 SIM_SEED={seed} cargo test --test simulation {test} -- --nocapture --exact"
            );
        }
        total.add(&r.stats);
    }
    println!(
        "{test}: {seeds} seeds, no double grant, {:.1?}; {total:?}",
        started.elapsed()
    );
    total
}

/// A bounded search must find a double grant. Returns the first seed that does.
fn expect_hazard(test: &str, family: fn(u64) -> Config, default_bound: u64) -> u64 {
    if let Some(seed) = env_u64("SIM_SEED") {
        let v = print_trace(test, family, seed);
        assert!(v.is_some(), "{test}: seed {seed} found no double grant");
        return seed;
    }
    let bound = env_u64("SIM_SEEDS").unwrap_or(default_bound);
    let started = Instant::now();
    let mut total = Stats::default();
    for seed in 0..bound {
        let r = run_seed(family, seed);
        total.add(&r.stats);
        if let Some(v) = r.violation {
            println!(
                "{test}: the hazard is real: seed {seed} (after {} seeds, {:.1?}) found {v}",
                seed + 1,
                started.elapsed()
            );
            println!(
                "replay: SIM_SEED={seed} cargo test --test simulation {test} -- --nocapture --exact"
            );
            return seed;
        }
    }
    panic!(
        "{test}: no double grant in {bound} seeds: the simulation did not show the hazard \
         (checker or fault model too weak); {total:?}"
    );
}

#[test]
fn safe_under_model_assumptions() {
    let s = expect_safe("safe_under_model_assumptions", within_model, 500);
    if env_u64("SIM_SEED").is_none() {
        // The run must not be vacuous: contention, every fault kind, every verdict.
        assert!(s.acquired > 1000, "{s:?}");
        assert!(
            s.taken > 0 && s.no_quorum > 0 && s.validity_used_up > 0,
            "{s:?}"
        );
        assert!(s.extends_ok > 0 && s.extends_failed > 0, "{s:?}");
        assert!(s.restarts > 0 && s.partitions > 0 && s.pauses > 0, "{s:?}");
        assert!(
            s.drops > 0 && s.late_replies > 0 && s.holds_clipped > 0,
            "{s:?}"
        );
        assert!(s.releases_after_failure > 0, "{s:?}");
    }
}

#[test]
fn safe_with_amnesia_guard_after_restart_without_persistence() {
    let s = expect_safe(
        "safe_with_amnesia_guard_after_restart_without_persistence",
        guarded_amnesia,
        300,
    );
    if env_u64("SIM_SEED").is_none() {
        assert!(s.restarts > 100 && s.amnesiac_votes > 0, "{s:?}");
        assert!(s.acquired > 500, "{s:?}");
    }
}

#[test]
fn hazard_restart_without_persistence_breaks_mutual_exclusion() {
    expect_hazard(
        "hazard_restart_without_persistence_breaks_mutual_exclusion",
        amnesia_unguarded,
        2000,
    );
}

#[test]
fn hazard_amnesia_guard_shorter_than_ttl_breaks_mutual_exclusion() {
    expect_hazard(
        "hazard_amnesia_guard_shorter_than_ttl_breaks_mutual_exclusion",
        amnesia_guard_too_short,
        2000,
    );
}

#[test]
fn hazard_master_clock_running_fast_breaks_mutual_exclusion() {
    expect_hazard(
        "hazard_master_clock_running_fast_breaks_mutual_exclusion",
        fast_clock,
        2000,
    );
}

#[test]
fn hazard_master_clock_jump_breaks_mutual_exclusion() {
    expect_hazard(
        "hazard_master_clock_jump_breaks_mutual_exclusion",
        clock_jumps,
        2000,
    );
}

#[test]
fn hazard_holder_paused_past_validity_breaks_mutual_exclusion() {
    expect_hazard(
        "hazard_holder_paused_past_validity_breaks_mutual_exclusion",
        pause_past_validity,
        2000,
    );
}

/// The checker itself: overlapping intervals are caught, touching or disjoint ones are not.
#[test]
fn checker_catches_overlap() {
    let h = |client, res, start, end| Held {
        res,
        client,
        token: client as u64,
        t1: start,
        start,
        end,
        votes: String::new(),
    };
    assert!(check_intervals(&[h(0, 0, 0, 10), h(1, 0, 10, 20)]).is_none());
    assert!(check_intervals(&[h(0, 0, 0, 10), h(1, 1, 5, 20)]).is_none());
    let v = check_intervals(&[h(1, 0, 9, 20), h(0, 0, 0, 10)]).expect("overlap");
    assert_eq!((v.first.client, v.second.client), (0, 1));
    // A long interval overlapping a later one past a short one in between.
    assert!(check_intervals(&[h(0, 0, 0, 100), h(1, 0, 10, 20), h(2, 0, 50, 60)]).is_some());
    assert!(check_intervals(&[h(0, 0, 0, 100), h(1, 1, 10, 20), h(2, 0, 100, 160)]).is_none());
}

/// The same seed gives the same run.
#[test]
fn deterministic() {
    for seed in [1, 42, 977] {
        let a = run_seed(within_model, seed);
        let b = run_seed(within_model, seed);
        assert_eq!(format!("{:?}", a.stats), format!("{:?}", b.stats));
    }
}
