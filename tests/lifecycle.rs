//! Production lock lifecycle against real masters: auto-extension and the lost-lock
//! signal, deadlines and cancellation, multi-resource locks, fencing tokens, amnesia guard.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use support::{get, masters, settle, wait_until};

use redlock_mux::local::LocalMasters;
use redlock_mux::{Error, Fault, HoldOptions, Outcome, Redlock};

fn builder(m: &LocalMasters) -> redlock_mux::Builder {
    Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(150))
        .retry_count(0)
}

#[test]
fn run_locked_keeps_the_lock_alive_past_its_ttl() {
    let m = masters(3);
    // The keeper extends with a third of the TTL left, and the lock counts as lost with a
    // tenth left: 350 ms for its extension rounds. With the 150 ms round timeout of the
    // other tests, an extension answered later than that (a loaded machine) failed, and
    // its retry, a round timeout later, had 50 ms before the lock counted as lost. How
    // fast the masters answer is not what this test is about: its client's rounds may
    // take 1 s (a late answer still extends while validity is left; so does the first
    // round, which also makes the connections).
    let mut c = builder(&m)
        .node_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    // Long enough that a loaded machine's scheduling delays (hundreds of ms) do not eat a
    // TTL: the test is about extensions keeping the lock, not about their speed.
    let ttl = Duration::from_millis(1500);
    let mut other = builder(&m).build().unwrap();
    let held = c
        .run_locked("long-job", ttl, |signal| {
            let start = Instant::now();
            let first_until = signal.valid_until();
            assert!(first_until > start && first_until <= start + ttl);
            // Work for 4 TTLs; the lock must stay ours throughout, its validity ahead.
            while start.elapsed() < ttl * 4 {
                let at = start.elapsed();
                assert!(!signal.is_lost(), "lost after {at:?} of work");
                assert!(
                    signal.valid_until() > Instant::now(),
                    "validity ran out after {at:?} of work"
                );
                assert!(
                    other.try_lock("long-job", Duration::from_secs(5)).is_err(),
                    "another client got the lock after {at:?} of work"
                );
                signal.wait_lost(Duration::from_millis(100));
            }
            // Extensions moved the validity forward.
            assert!(signal.valid_until() > first_until + ttl * 2);
            42
        })
        .unwrap();
    assert_eq!(held.value, 42);
    assert!(held.held_throughout, "{:?}", held.lost);
    assert!(held.extensions >= 4, "extensions: {}", held.extensions);
    // The release at the end returned at a quorum: the last master's may still be running.
    settle(&mut c, 3);
    for i in 0..3 {
        assert_eq!(get(&m, i, "long-job"), None, "released at the end");
    }
}

#[test]
fn lost_signal_fires_within_one_extension_interval_of_losing_quorum() {
    let mut m = masters(3);
    let mut c = builder(&m).build().unwrap();
    let ttl = Duration::from_millis(900);
    let opts = HoldOptions::default();
    let interval = ttl.mul_f64(1.0 - opts.extend_at);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Duration>();
    let controller = {
        thread::spawn(move || {
            rx.recv().unwrap();
            // Freeze a majority while the work runs.
            m[0].freeze().unwrap();
            m[1].freeze().unwrap();
            let t = Instant::now();
            let waited = back_rx.recv().unwrap();
            let _ = waited;
            m[0].thaw().unwrap();
            m[1].thaw().unwrap();
            (m, t)
        })
    };
    let held = c
        .run_locked_with("fragile", ttl, opts, |signal| {
            tx.send(()).unwrap();
            let t = Instant::now();
            let lost = signal.wait_lost(Duration::from_secs(10));
            let waited = t.elapsed();
            back_tx.send(waited).unwrap();
            (lost, waited)
        })
        .unwrap();
    let (_m, _) = controller.join().unwrap();
    let (lost, waited) = held.value;
    assert!(lost, "the signal never fired");
    let bound = interval + Duration::from_millis(150) + Duration::from_millis(200);
    assert!(waited <= bound, "fired after {waited:?}, bound {bound:?}");
    assert!(!held.held_throughout);
    assert!(
        matches!(held.lost, Some(Error::NoQuorum(_)) | Some(Error::Expired)),
        "{:?}",
        held.lost
    );
}

#[test]
fn extensions_are_bounded() {
    let m = masters(3);
    let mut c = builder(&m).build().unwrap();
    // As above: long enough for a loaded machine.
    let ttl = Duration::from_millis(1500);
    let opts = HoldOptions {
        max_extensions: Some(2),
        ..HoldOptions::default()
    };
    let t = Instant::now();
    let held = c
        .run_locked_with("bounded", ttl, opts, |signal| {
            signal.wait_lost(Duration::from_secs(10))
        })
        .unwrap();
    assert!(held.value, "validity must run out after the last extension");
    assert_eq!(held.extensions, 2);
    assert!(matches!(held.lost, Some(Error::Expired)), "{:?}", held.lost);
    // Two extensions and the last validity: about three TTLs, never the 10 s wait.
    assert!(t.elapsed() < ttl * 5, "{:?}", t.elapsed());
}

/// A hand-written keep-alive loop (`should_extend` + `extend`) keeps a lock valid for 3
/// TTLs: it never lapses, and since an extension gives at most one TTL from its round's
/// start, that takes at least 3 extensions. The margin (a third of the TTL) must cover
/// the loop's sleep, the thread's scheduling and an extend round: with a 300 ms TTL it was
/// 100 ms, less than a loaded 2-core machine can take to run a thread again. The TTL is
/// 1.5 s, as in the tests above: the loop is what is tested, not its speed.
#[test]
fn manual_keep_alive_building_block() {
    let m = masters(3);
    let mut c = builder(&m).build().unwrap();
    let ttl = Duration::from_millis(1500);
    let mut lock = c.lock("manual", ttl).unwrap();
    let mut extended = 0;
    let start = Instant::now();
    while start.elapsed() < ttl * 3 {
        assert!(lock.is_valid(), "lapsed after {extended} extensions");
        if lock.should_extend(ttl / 3) {
            c.extend(&mut lock, ttl)
                .unwrap_or_else(|e| panic!("extension {}: {e}", extended + 1));
            extended += 1;
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert!(lock.is_valid(), "lapsed after {extended} extensions");
    assert!(extended >= 3, "{extended}");
    c.release(lock).unwrap();
}

#[test]
fn deadline_bounds_the_retry_loop() {
    let m = masters(3);
    let mut a = builder(&m).build().unwrap();
    let held = a.lock("busy", Duration::from_secs(10)).unwrap();
    let mut b = builder(&m)
        .retry_count(1000)
        .retry_delay(Duration::from_millis(80))
        .retry_jitter(Duration::from_millis(40))
        .build()
        .unwrap();
    for budget in [0u64, 50, 300] {
        let t = Instant::now();
        let deadline = t + Duration::from_millis(budget);
        let err = b
            .lock_with_deadline("busy", Duration::from_secs(5), deadline)
            .unwrap_err();
        assert!(matches!(err, Error::DeadlineExceeded(_)), "{err}");
        if budget > 0 {
            // The report is the last informative round's: "taken", never masters that
            // merely ran out of time in a round the deadline cut short.
            // Unless the deadline cut the first round itself short (a loaded machine: the
            // masters' "taken" came later than the 50 ms budget): then that round is all
            // there is to report.
            let r = err.report().unwrap_or_else(|| panic!("no report: {err}"));
            if r.attempts() > 1 || r.masters_with(Outcome::TimedOut).count() == 0 {
                assert!(r.masters_with(Outcome::Taken).count() >= 2, "{err}");
            }
        }
        let late = Instant::now().saturating_duration_since(deadline);
        assert!(
            late < Duration::from_millis(60),
            "returned {late:?} after the deadline"
        );
    }
    a.release(held).unwrap();
}

/// A cancel ends a waiting `lock` at once, not at its next timed retry: the retry delay
/// is 5 s (± half), so the next retry is at least 2.35 s away when the cancel comes, and
/// the call must return well within that. (The bound was 100 ms against a 200 ms delay:
/// a loaded machine took 107 ms to schedule the waiter's thread.)
#[test]
fn cancel_ends_a_waiting_lock_promptly() {
    const RETRY_DELAY: Duration = Duration::from_secs(5);
    let m = masters(3);
    let mut a = builder(&m).build().unwrap();
    let held = a.lock("wanted", Duration::from_secs(10)).unwrap();
    let mut b = builder(&m)
        .retry_count(10_000)
        .retry_delay(RETRY_DELAY)
        .build()
        .unwrap();
    let handle = b.cancel_handle();
    let waiter = thread::spawn(move || {
        let r = b.lock("wanted", Duration::from_secs(5));
        (r.map(|_| ()), Instant::now())
    });
    thread::sleep(Duration::from_millis(150));
    let cancelled_at = Instant::now();
    handle.cancel();
    let (r, returned_at) = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    let lag = returned_at.saturating_duration_since(cancelled_at);
    assert!(
        lag < RETRY_DELAY / 5,
        "cancel took {lag:?}: the waiter slept on towards its next timed retry"
    );
    a.release(held).unwrap();
}

#[test]
fn a_pending_cancel_never_aborts_release_or_extend() {
    let m = masters(3);
    let mut c = builder(&m).build().unwrap();
    let mut lock = c.lock("steady", Duration::from_secs(5)).unwrap();
    c.cancel_handle().cancel();
    c.extend(&mut lock, Duration::from_secs(5)).unwrap();
    c.release(lock).unwrap();
    // A cancel sent while no attempt runs cancels nothing later: the next, unrelated call
    // goes through.
    let l = c.lock("steady", Duration::from_secs(5)).unwrap();
    c.release(l).unwrap();
}

#[test]
fn cancel_mid_round_releases_the_partial_lock() {
    let mut m = masters(3);
    let mut c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_secs(5))
        .retry_count(0)
        .build()
        .unwrap();
    let l = c.try_lock("warm", Duration::from_secs(1)).unwrap();
    c.release(l).unwrap();
    m[1].freeze().unwrap();
    m[2].freeze().unwrap();
    let handle = c.cancel_handle();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        handle.cancel();
    });
    let t = Instant::now();
    let r = c.try_lock("partial", Duration::from_secs(30));
    canceller.join().unwrap();
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    // Master 0 said OK before the cancel; the cleanup release removes it.
    wait_until(
        "partial lock released on master 0",
        Duration::from_secs(3),
        || get(&m, 0, "partial").is_none(),
    );
    m[1].thaw().unwrap();
    m[2].thaw().unwrap();
    // The frozen masters run the queued SET then the queued release, in order.
    for i in [1, 2] {
        wait_until(
            "no partial lock on a thawed master",
            Duration::from_secs(3),
            || get(&m, i, "partial").is_none(),
        );
    }
}

#[test]
fn multi_resource_overlapping_sets_exclude_disjoint_sets_share() {
    let m = masters(3);
    let mut a = builder(&m).build().unwrap();
    let mut b = builder(&m).build().unwrap();
    let ttl = Duration::from_secs(10);
    let mut ab = a.lock_many(["r:a", "r:b"], ttl).unwrap();
    assert_eq!(ab.resources().count(), 2);
    let err = b.lock_many(["r:b", "r:c"], ttl).unwrap_err();
    assert!(err.is_taken(), "{err}");
    // All-or-nothing: the refused set left no key behind (once its cleanup, sent to the
    // masters that had not answered when the refusal was decided, has run there).
    settle(&mut b, 3);
    for i in 0..3 {
        assert_eq!(get(&m, i, "r:c"), None);
    }
    let cd = b.lock_many(["r:c", "r:d"], ttl).unwrap();
    a.extend(&mut ab, Duration::from_secs(20)).unwrap();
    a.release(ab).unwrap();
    b.release(cd).unwrap();
    let bc = b.lock_many(["r:b", "r:c"], ttl).unwrap();
    b.release(bc).unwrap();
    assert!(matches!(
        b.lock_many(["x", "x"], ttl),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn multi_resource_contention_never_double_grants() {
    let m = masters(3);
    let urls = m.urls();
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..4).map(|_| AtomicBool::new(false)).collect());
    let sets: [&[usize]; 4] = [&[0, 1], &[1, 2], &[2, 3], &[3, 0]];
    let stop = Instant::now() + Duration::from_millis(1500);
    let threads: Vec<_> = sets
        .iter()
        .map(|set| {
            let urls = urls.clone();
            let held = held.clone();
            let set: Vec<usize> = set.to_vec();
            thread::spawn(move || {
                let mut c = Redlock::builder()
                    .masters(urls)
                    .node_timeout(Duration::from_millis(200))
                    .retry_count(0)
                    .build()
                    .unwrap();
                let names: Vec<String> = set.iter().map(|k| format!("mr:{k}")).collect();
                let mut grants = 0u32;
                while Instant::now() < stop {
                    let Ok(lock) = c.lock_many(&names, Duration::from_secs(5)) else {
                        continue;
                    };
                    for &k in &set {
                        assert!(
                            !held[k].swap(true, Ordering::SeqCst),
                            "resource {k} double-granted"
                        );
                    }
                    thread::yield_now();
                    for &k in &set {
                        held[k].store(false, Ordering::SeqCst);
                    }
                    c.release(lock).unwrap();
                    grants += 1;
                }
                grants
            })
        })
        .collect();
    let grants: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        grants.iter().sum::<u32>() > 10,
        "too little contention exercised: {grants:?}"
    );
}

/// Masters that persist every write, as fencing requires.
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

#[test]
fn fencing_tokens_strictly_increase_while_minorities_freeze() {
    let mut m = support::masters_with(5, DURABLE);
    let mut c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(100))
        .fencing(true)
        .retry_count(0)
        .build()
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(0xfe);
    let mut last = 0u64;
    let mut tokens = Vec::new();
    for round in 0..16 {
        let k = rng.usize(0..=2);
        let mut frozen = Vec::new();
        while frozen.len() < k {
            let i = rng.usize(0..5);
            if !frozen.contains(&i) {
                frozen.push(i);
            }
        }
        for &i in &frozen {
            m[i].freeze().unwrap();
        }
        let lock = c.try_lock("fenced", Duration::from_secs(10)).unwrap();
        let token = lock.fencing_token().expect("fencing on");
        assert!(
            token > last,
            "round {round}: token {token} after {last} (frozen {frozen:?})"
        );
        last = token;
        tokens.push(token);
        c.release(lock).unwrap();
        for &i in &frozen {
            m[i].thaw().unwrap();
        }
    }
    // A second client sees the same order.
    let mut d = Redlock::builder()
        .masters(m.urls())
        .fencing(true)
        .retry_count(0)
        .build()
        .unwrap();
    let lock = d.try_lock("fenced", Duration::from_secs(10)).unwrap();
    assert!(lock.fencing_token().unwrap() > last, "{tokens:?}");
    d.release(lock).unwrap();
}

/// The write-back is what carries a token to a quorum: master 0's counter is ahead, the
/// first holder's quorum includes it (token 11), the next holder's quorum misses it and
/// still gets a larger token, from the master the write-back raised.
#[test]
fn fencing_write_back_carries_the_token_to_a_quorum() {
    let mut m = support::masters_with(3, DURABLE);
    // Master 0's counter under the names before the keys moved into their lock key's slot
    // (read by the draw until a write-back retires it); written back under the new one.
    let counter = b"redlock-mux:fence:wb";
    let new_counter = redlock_mux::scripts::aux_key(redlock_mux::scripts::FENCE, b"wb");
    assert!(m[0].cmd(&[b"SET", counter, b"10"]).unwrap().is_ok());
    let mut c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(100))
        .fencing(true)
        .retry_count(0)
        .build()
        .unwrap();
    // The first holder's quorum is masters 0 and 1 (master 2 is frozen).
    m[2].freeze().unwrap();
    let first = c.try_lock("wb", Duration::from_secs(10)).unwrap();
    let t1 = first.fencing_token().unwrap();
    assert_eq!(t1, 11, "1 + the largest counter of the quorum");
    c.release(first).unwrap();
    m[2].thaw().unwrap();
    assert_eq!(
        m[1].cmd(&[b"GET", &new_counter]).unwrap().as_str(),
        Some("11"),
        "written back"
    );
    // The next holder's quorum misses master 0.
    m[0].freeze().unwrap();
    let second = c.try_lock("wb", Duration::from_secs(10)).unwrap();
    let t2 = second.fencing_token().unwrap();
    c.release(second).unwrap();
    m[0].thaw().unwrap();
    assert_eq!(t2, 12, "{t2} after {t1}");
}

/// The amnesia hazard (REDLOCK.md): A locks while master 2 is down, so A holds masters 0
/// and 1; master 1 restarts empty and master 2 comes back.
fn amnesia_setup() -> (LocalMasters, Redlock, redlock_mux::Lock) {
    let mut m = masters(3);
    m[2].kill().unwrap();
    let mut a = builder(&m).build().unwrap();
    let lock = a.try_lock("amnesia", Duration::from_secs(3)).unwrap();
    m[1].kill().unwrap();
    m[1].restart().unwrap();
    m[2].restart().unwrap();
    assert_eq!(
        get(&m, 1, "amnesia"),
        None,
        "restart without persistence forgets"
    );
    (m, a, lock)
}

#[test]
fn amnesia_hazard_is_real_without_the_guard() {
    let (m, _a, lock) = amnesia_setup();
    let mut b = builder(&m).build().unwrap();
    let stolen = b.try_lock("amnesia", Duration::from_secs(3));
    assert!(lock.is_valid(), "A still believes it holds the lock");
    assert!(
        stolen.is_ok(),
        "without the guard B is granted A's lock (the hazard): {:?}",
        stolen.err()
    );
}

#[test]
fn amnesia_guard_refuses_until_max_ttl_has_passed() {
    let (m, _a, lock) = amnesia_setup();
    let max_ttl = Duration::from_secs(3);
    let mut b = builder(&m).amnesia_guard(max_ttl).build().unwrap();
    let restarted = Instant::now();
    let err = b.try_lock("amnesia", Duration::from_secs(3)).unwrap_err();
    assert!(lock.is_valid());
    let report = err.report().expect("report");
    let amnesiac = report
        .outcomes()
        .filter(|(_, o)| *o == Outcome::Failed(Fault::Amnesiac))
        .count();
    // Decided as soon as a quorum was impossible: master 0 said taken (A's key) and a
    // restarted master's OK was not counted.
    assert!(amnesiac >= 1, "{err}");
    assert_eq!(report.ok(), 0, "{err}");
    // Refused for as long as the restarted masters are younger than max_ttl; then granted.
    let granted = loop {
        match b.try_lock("amnesia", Duration::from_secs(3)) {
            Ok(l) => break l,
            Err(e) => {
                assert!(
                    restarted.elapsed() < max_ttl + Duration::from_secs(3),
                    "{e}"
                );
                thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let waited = restarted.elapsed();
    assert!(
        waited >= max_ttl - Duration::from_secs(1),
        "granted after {waited:?}, before max_ttl ({max_ttl:?}) minus uptime rounding"
    );
    assert!(!lock.is_valid(), "A's lock had run out by then");
    b.release(granted).unwrap();
    // TTLs above max_ttl are refused while the guard is on.
    assert!(matches!(
        b.try_lock("x", Duration::from_secs(4)),
        Err(Error::InvalidArgument(_))
    ));
}

/// A `Lock` dropped unreleased (alone, or inside a collection) is released by its
/// client's next call; one still held when the client is dropped is released then.
#[test]
fn dropped_locks_are_released_by_the_clients_next_call() {
    let m = masters(3);
    let mut c = builder(&m).build().unwrap();
    let lock = c.try_lock("dropped", Duration::from_secs(30)).unwrap();
    let many: Vec<_> = (0..4)
        .map(|i| {
            c.try_lock(format!("in-vec:{i}"), Duration::from_secs(30))
                .unwrap()
        })
        .collect();
    // Every master has the keys (the calls returned at a quorum), before the drops.
    settle(&mut c, 3);
    drop(lock);
    drop(many);
    assert!(
        get(&m, 0, "dropped").is_some(),
        "nothing runs until the next call"
    );
    let other = c.try_lock("other", Duration::from_secs(30)).unwrap();
    wait_until("the dropped locks' release", Duration::from_secs(5), || {
        (0..3).all(|i| {
            get(&m, i, "dropped").is_none()
                && (0..4).all(|k| get(&m, i, &format!("in-vec:{k}")).is_none())
        })
    });
    drop(other);
    drop(c);
    wait_until(
        "the release at the client's drop",
        Duration::from_secs(5),
        || (0..3).all(|i| get(&m, i, "other").is_none()),
    );
}

/// `lock_with_deadline` waits its whole deadline, whatever `retry_count` says (as `flock -w`
/// waits its whole time): the deadline bounds the retries, and the last attempt starts just
/// before it rather than giving up a retry delay early. The error reports every attempt.
#[test]
fn lock_with_deadline_waits_until_the_deadline() {
    let m = masters(3);
    let mut holder = builder(&m).build().unwrap();
    let held = holder.try_lock("busy", Duration::from_secs(30)).unwrap();
    let mut c = Redlock::builder()
        .masters(m.urls())
        .retry_count(1)
        .retry_delay(Duration::from_millis(120))
        .retry_jitter(Duration::from_millis(60))
        .build()
        .unwrap();
    let wait = Duration::from_millis(700);
    let t = Instant::now();
    let r = c.lock_with_deadline("busy", Duration::from_secs(5), t + wait);
    let took = t.elapsed();
    match r {
        Err(Error::DeadlineExceeded(Some(report))) => {
            assert!(report.attempts() > 2, "{report}");
            assert!(
                report.total() >= wait - Duration::from_millis(30),
                "{report}"
            );
        }
        other => panic!("expected DeadlineExceeded with a report, got {other:?}"),
    }
    assert!(
        took >= wait - Duration::from_millis(10) && took < wait + Duration::from_millis(300),
        "gave up after {took:?} of {wait:?}"
    );
    holder.release(held).unwrap();
}
