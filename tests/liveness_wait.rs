//! Liveness of the waiting machinery against real masters (issue 19, items 1, 2, 3, 4 and
//! 9): a waiter that cannot reach a quorum must not hold a fair line up; a waiter must not
//! spin on announcements that cannot free a quorum (its own cleanups', its sibling
//! callers', those of masters whose votes it cannot get); a waiter that keeps asking keeps
//! its place whatever the other waiters' settings.
//!
//! Every assertion is about counts and order, not speed: attempts are bounded by what the
//! settings allow (timed retries, plus one per announcement that could free a quorum, plus
//! the attempts a subscription's confirmation may add, plus one); a grant is checked against
//! who still waits, or bounded by a limit derived from the settings with seconds to spare.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{masters, masters_with, poll_until, wait_until, AdminReply, LocalMasters};

use redlock_mux::{Error, LockGuard, MasterStats, Pending, Redlock, Report};

/// A lock TTL no test waits for.
const TTL: Duration = Duration::from_secs(30);
/// A retry delay no test waits for: whatever happens well before it was caused otherwise.
const FALLBACK: Duration = Duration::from_secs(10);
/// Slack for a loaded machine on top of a bound derived from the settings.
const PROMPT: Duration = Duration::from_secs(3);
/// The value of a key set by hand (a foreign holder): its announcement names it.
const FOREIGN: &str = "foreign-holder";
/// The default retry delay and jitter (`Builder`): the shortest sleep between two timed
/// attempts is their difference.
const DEFAULT_MIN_DELAY: Duration = Duration::from_millis(100);

/// The line of waiters of `key` (see `scripts::QUEUE`).
fn queue(key: &str) -> String {
    String::from_utf8(redlock_mux::scripts::aux_key(
        redlock_mux::scripts::QUEUE,
        key.as_bytes(),
    ))
    .unwrap()
}

/// Waiters in the line of `key` on master `i`.
fn in_line(m: &LocalMasters, i: usize, key: &str) -> i64 {
    match m[i].cmd(&[b"ZCARD", queue(key).as_bytes()]) {
        Ok(AdminReply::Int(n)) => n,
        other => panic!("ZCARD: {other:?}"),
    }
}

/// The waiters of `key` in its liveness set on master `i` (`scripts::ALIVE`), each with
/// the time it has left (ms on the master's clock: its moment minus `TIME`).
fn waiters(m: &LocalMasters, i: usize, key: &str) -> Vec<(String, i64)> {
    let a = redlock_mux::scripts::aux_key(redlock_mux::scripts::ALIVE, key.as_bytes());
    let now = match m[i].cmd(&[b"TIME"]).unwrap() {
        AdminReply::Array(t) => {
            let s: i64 = t[0].as_str().unwrap().parse().unwrap();
            let us: i64 = t[1].as_str().unwrap().parse().unwrap();
            s * 1000 + us / 1000
        }
        other => panic!("TIME: {other:?}"),
    };
    match m[i]
        .cmd(&[b"ZRANGE", &a, b"0", b"-1", b"WITHSCORES"])
        .unwrap()
    {
        AdminReply::Array(a) => a
            .chunks(2)
            .map(|w| {
                let until: f64 = w[1].as_str().unwrap().parse().unwrap();
                (w[0].as_str().unwrap().to_string(), until as i64 - now)
            })
            .collect(),
        other => panic!("ZRANGE on master {i}: {other:?}"),
    }
}

/// `PTTL key` on master `i`.
fn pttl(m: &LocalMasters, i: usize, key: &str) -> i64 {
    match m[i].cmd(&[b"PTTL", key.as_bytes()]).unwrap() {
        AdminReply::Int(ms) => ms,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

fn set_by_hand(m: &LocalMasters, i: usize, key: &str) {
    let r = m[i].cmd(&[b"SET", key.as_bytes(), FOREIGN.as_bytes()]);
    assert!(r.unwrap().is_ok());
}

/// Announce a release of `key` by the foreign holder on master `i`, as the release script
/// does when nobody stands in line there.
fn announce_by_hand(m: &LocalMasters, i: usize, key: &str) {
    let ch = format!("redlock-mux:released:{key}");
    m[i].cmd(&[b"PUBLISH", ch.as_bytes(), FOREIGN.as_bytes()])
        .unwrap();
}

/// URLs that reach master `reach` directly and every other master through a proxy that is
/// a black hole (a partition of this client from them); keep the proxies alive.
fn partitioned(m: &LocalMasters, reach: usize) -> (Vec<String>, Vec<Proxy>) {
    let mut urls = Vec::new();
    let mut proxies = Vec::new();
    for i in 0..m.len() {
        if i == reach {
            urls.push(m[i].url());
        } else {
            let p = Proxy::start(m[i].addr()).unwrap();
            p.set_mode(Mode::Blackhole);
            urls.push(p.url());
            proxies.push(p);
        }
    }
    (urls, proxies)
}

/// Timed attempts a call can make in `window` when consecutive timed attempts are at least
/// `min_delay` apart: the first, the retries, and the last one just before a deadline.
fn timed_attempts(window: Duration, min_delay: Duration) -> u64 {
    (window.as_millis() / min_delay.as_millis()) as u64 + 2
}

/// Attempts a waiter may add at subscription confirmations: a call refused before some
/// master confirmed its subscriptions tries once more at each confirmation (at the
/// notice, or when its running attempt ends: either way the next attempt starts after
/// it). Two channels (the key's and the client's own), each confirmed once per
/// subscription connection to a master it `reaches`.
fn confirmation_attempts(stats: &[MasterStats], reaches: &[usize]) -> u64 {
    2 * reaches
        .iter()
        .map(|&i| stats[i].subscription_connects())
        .sum::<u64>()
}

fn deadline_report(r: Result<impl std::fmt::Debug, Error>) -> Box<Report> {
    match r {
        Err(Error::DeadlineExceeded(Some(report))) => report,
        other => panic!("expected the deadline to pass: {other:?}"),
    }
}

/// Whether a lock call of the shared client is still waiting (polled once, not awaited).
fn still_waiting(p: &mut Pending<LockGuard>) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(p).poll(&mut cx), Poll::Pending)
}

/// Item 1. Fair clients; H holds the lock. W1 reaches only master 0 and W2 only master 1
/// (their links to the others are black holes); both wait (20 s deadline). W3 reaches every
/// master and comes after them. Once H releases, W3 is the only waiter that can reach a
/// quorum: it must be granted within a bound derived from the settings (its own and the
/// cut-off waiters' timed retries and round timeouts), while W1 and W2 still wait. (Before:
/// every attempt of W1 and W2 refreshed their place, first in line on masters 0 and 1, so
/// W3's polite attempts won master 2 only, and nobody was granted until W1 and W2 gave up.)
#[test]
fn waiters_that_cannot_reach_a_quorum_do_not_block_the_fair_line() {
    let m = masters(3);
    let key = "cut-off";
    let retry_delay = Duration::from_millis(300);
    let node_timeout = Duration::from_millis(100);
    let fair = |urls: Vec<String>| {
        Redlock::builder()
            .masters(urls)
            .node_timeout(node_timeout)
            .retry_delay(retry_delay)
            .retry_jitter(Duration::ZERO)
            .retry_count(1000)
            .fairness(true)
            .build_shared()
            .unwrap()
    };
    let mut holder = Redlock::builder().masters(m.urls()).build().unwrap();
    let held = holder.try_lock(key, TTL).unwrap();

    let (urls1, _proxies1) = partitioned(&m, 0);
    let (urls2, _proxies2) = partitioned(&m, 1);
    let (w1, w2) = (fair(urls1), fair(urls2));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut p1 = w1.lock_with_deadline(key, TTL, deadline);
    wait_until("W1 refused by master 0", PROMPT, || {
        w1.stats().wait().unwrap()[0].refused() >= 1
    });
    let mut p2 = w2.lock_with_deadline(key, TTL, deadline);
    wait_until("W2 refused by master 1", PROMPT, || {
        w2.stats().wait().unwrap()[1].refused() >= 1
    });
    let w3 = fair(m.urls());
    let p3 = w3.lock(key, TTL);
    wait_until("W3 refused by every master (in line)", PROMPT, || {
        w3.stats().wait().unwrap().iter().all(|s| s.refused() >= 1)
    });

    holder.release(held).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(p3.wait());
    });
    // A cut-off waiter steps out of line by its next timed attempt; W3 then wins every
    // master by its next timed attempt at the latest.
    let bound = 2 * retry_delay + 4 * node_timeout + PROMPT;
    let g = rx
        .recv_timeout(bound)
        .unwrap_or_else(|_| {
            panic!(
                "the free lock was granted to nobody within {bound:?} of the release \
                 (lines: {:?})",
                (0..3).map(|i| in_line(&m, i, key)).collect::<Vec<_>>()
            )
        })
        .expect("W3 gets the lock");
    assert!(
        still_waiting(&mut p1) && still_waiting(&mut p2),
        "W3 was granted only after the cut-off waiters gave up"
    );
    g.release().wait().unwrap();
    drop((p1, p2));
}

/// Item 2. A waiter (default settings, no jitter) reaches master 0 only (a partition) while
/// another client takes and releases the lock again and again. Its attempts are bounded:
/// its timed retries, one per release of the other client (generously: each could have
/// been news), the confirmations, one. (Before: every cleanup's announcement woke the
/// next attempt, whose cleanup fed the one after: hundreds of attempts.)
#[test]
fn a_partitioned_waiter_does_not_spin_on_its_own_cleanups() {
    let m = masters(3);
    let key = "partitioned";
    let (urls, _proxies) = partitioned(&m, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let releases = Arc::new(AtomicU64::new(0));
    let other = {
        let (urls, stop, releases) = (m.urls(), stop.clone(), releases.clone());
        thread::spawn(move || {
            let mut c = Redlock::builder()
                .masters(urls)
                .retry_count(0)
                .build()
                .unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                if let Ok(lock) = c.try_lock(key, Duration::from_secs(1)) {
                    thread::sleep(Duration::from_millis(20));
                    releases.fetch_add(1, Ordering::SeqCst);
                    let _ = c.release(lock);
                }
                thread::sleep(Duration::from_millis(117));
            }
        })
    };

    // Default settings, but no jitter: timed attempts come a retry delay apart.
    let retry_delay = Duration::from_millis(200);
    let waiter = |urls: Vec<String>| {
        Redlock::builder()
            .masters(urls)
            .retry_delay(retry_delay)
            .retry_jitter(Duration::ZERO)
    };
    // With a deadline.
    let mut w = waiter(urls.clone()).build().unwrap();
    let window = Duration::from_secs(4);
    let before = releases.load(Ordering::SeqCst);
    let report = deadline_report(w.lock_with_deadline(key, TTL, Instant::now() + window));
    let heard = releases.load(Ordering::SeqCst) - before + 1;
    let bound =
        timed_attempts(window, retry_delay) + heard + confirmation_attempts(&w.stats(), &[0]) + 1;
    let attempts = u64::from(report.attempts());
    assert!(
        attempts <= bound,
        "lock_with_deadline: {attempts} attempts in {window:?}, bound {bound} \
         ({heard} releases by the other client): {report}"
    );

    // Without a deadline: retry_count bounds the timed retries.
    let mut w = waiter(urls).retry_count(3).build().unwrap();
    let before = releases.load(Ordering::SeqCst);
    let r = w.lock(key, TTL);
    let heard = releases.load(Ordering::SeqCst) - before + 1;
    stop.store(true, Ordering::SeqCst);
    other.join().unwrap();
    let report = match r {
        Err(e) => e.report().cloned().expect("a report"),
        Ok(lock) => panic!("granted with one master of three: {lock:?}"),
    };
    let bound = 1 + 3 + heard + confirmation_attempts(&w.stats(), &[0]) + 1;
    let attempts = u64::from(report.attempts());
    assert!(
        attempts <= bound,
        "lock with retry_count(3): {attempts} attempts, bound {bound}: {report}"
    );
}

/// Item 3. A (fair, retry delay 10 s: it stays in line 12.1 s between attempts) waits
/// first; B (retry delay and round timeout 50 ms: 250 ms) queues behind it and gives up.
/// The line must not expire with A's place in it: C, who comes after that, is granted
/// after A, and on every master the line lives at least as long as A's liveness key.
/// (Before: B's attempts cut the line's TTL to 250 ms; the line expired, C stood alone in
/// a new one and was granted before A, who was alive and asking.)
#[test]
fn a_waiter_with_a_short_liveness_does_not_expire_the_line() {
    let m = masters(3);
    let key = "short-lived";
    let fair = |node_timeout: Duration, retry_delay: Duration| {
        Redlock::builder()
            .masters(m.urls())
            .node_timeout(node_timeout)
            .retry_delay(retry_delay)
            .retry_jitter(Duration::ZERO)
            .fairness(true)
    };
    let mut holder = Redlock::builder().masters(m.urls()).build().unwrap();
    let held = holder.try_lock(key, TTL).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |mut c: Redlock, who: &'static str| {
        let order = order.clone();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let r = c.lock(key, TTL);
            if let Ok(lock) = r {
                order.lock().unwrap().push(who);
                let _ = c.release(lock);
                let _ = tx.send(Ok(()));
            } else {
                let _ = tx.send(r.map(drop));
            }
        });
        rx
    };

    let a = fair(Duration::from_secs(1), FALLBACK).build().unwrap();
    let rx_a = spawn(a, "A");
    wait_until("A in line on every master", PROMPT, || {
        (0..3).all(|i| in_line(&m, i, key) == 1)
    });
    let a_id = waiters(&m, 0, key).pop().expect("A's liveness").0;

    let mut b = fair(Duration::from_millis(50), Duration::from_millis(50))
        .retry_count(1)
        .build()
        .unwrap();
    let r = b.lock(key, TTL);
    assert!(matches!(r, Err(Error::Taken(_))), "{r:?}");
    // The line's TTL against what A's liveness has left, on every master, right after B
    // gave up.
    let ttls: Vec<(i64, i64)> = (0..3)
        .map(|i| {
            let left = waiters(&m, i, key)
                .into_iter()
                .find(|(id, _)| *id == a_id)
                .map_or(-2, |(_, left)| left);
            (pttl(&m, i, &queue(key)), left)
        })
        .collect();
    // B's 250 ms pass (bounded: where the line lives on, this only waits).
    poll_until(Duration::from_secs(1), || {
        (0..3).all(|i| in_line(&m, i, key) == 0)
    });

    let c = fair(Duration::from_secs(1), FALLBACK).build().unwrap();
    let rx_c = spawn(c, "C");
    wait_until("C in line (A's and C's liveness)", PROMPT, || {
        (0..3).all(|i| waiters(&m, i, key).len() == 2)
    });
    holder.release(held).unwrap();
    for (who, rx) in [("A", rx_a), ("C", rx_c)] {
        rx.recv_timeout(FALLBACK + PROMPT)
            .unwrap_or_else(|_| panic!("{who} was not granted"))
            .unwrap_or_else(|e| panic!("{who}: {e}"));
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec!["A", "C"],
        "granted out of arrival order (line and A's liveness PTTL per master, right after \
         B gave up: {ttls:?})"
    );
    // A's moment in the liveness set comes from `TIME` read while its script ran, the
    // line's expiry from the time the script started (Redis keeps one per command): they
    // may be a millisecond or two apart, which no waiter's liveness depends on.
    for (i, (line, alive)) in ttls.iter().enumerate() {
        assert!(
            line + 3 >= *alive,
            "master {i}: the line expires in {line} ms, A's place in it lives {alive} ms"
        );
    }
}

/// Item 4. X holds the lock on masters 1 and 2 (master 0 missed its acquire), and keeps
/// it. Two callers of one shared client wait for it: nothing X does can free a quorum,
/// so each caller makes its timed attempts (plus the confirmations', plus one). (Before:
/// each attempt won master 0 and failed, its cleanup counted as "our keys were in their
/// way", and the other caller started at once: they alternated at round-trip speed.)
#[test]
fn two_callers_do_not_ping_pong_while_the_lock_is_held_elsewhere() {
    let m = masters(3);
    let key = "held-elsewhere";
    set_by_hand(&m, 1, key);
    set_by_hand(&m, 2, key);
    let retry_delay = Duration::from_millis(200);
    let c = Redlock::builder()
        .masters(m.urls())
        .retry_delay(retry_delay)
        .retry_jitter(Duration::ZERO)
        .build_shared()
        .unwrap();
    let window = Duration::from_secs(3);
    let deadline = Instant::now() + window;
    let a = c.lock_with_deadline(key, TTL, deadline);
    let b = c.lock_with_deadline(key, TTL, deadline);
    let (ra, rb) = (deadline_report(a.wait()), deadline_report(b.wait()));
    let stats = c.stats().wait().unwrap();
    let bound = timed_attempts(window, retry_delay) + confirmation_attempts(&stats, &[0, 1, 2]) + 1;
    for (who, r) in [("A", &ra), ("B", &rb)] {
        let attempts = u64::from(r.attempts());
        assert!(
            attempts <= bound,
            "caller {who}: {attempts} attempts in {window:?}, bound {bound}: {r}"
        );
    }
}

/// Item 9. One client, 2 live masters of 5 (3 closed ports): nothing announced can free
/// a quorum, so a waiting call makes its timed attempts only (plus the confirmations',
/// plus one), with `retry_count` or with a deadline; two calls in a row on one client (the
/// second hears the first one's last cleanup). (Before: a failed attempt's cleanup
/// announcement woke the next attempt at once, whose cleanup woke the one after: tens of
/// thousands of attempts and `PUBLISH` on the masters that were left.)
#[test]
fn an_outage_does_not_make_a_waiter_hammer_the_masters_left() {
    let mut m = masters(5);
    for i in 2..5 {
        m[i].stop().unwrap();
    }
    let key = "outage";
    let mut w = Redlock::builder()
        .masters(m.urls())
        .retry_count(3)
        .build()
        .unwrap();
    let report = match w.lock(key, TTL) {
        Err(e) => e.report().cloned().expect("a report"),
        Ok(lock) => panic!("granted with 2 masters of 5: {lock:?}"),
    };
    let bound = 1 + 3 + confirmation_attempts(&w.stats(), &[0, 1]) + 1;
    let attempts = u64::from(report.attempts());
    assert!(
        attempts <= bound,
        "lock with retry_count(3): {attempts} attempts, bound {bound}: {report}"
    );

    let window = Duration::from_secs(2);
    let report = deadline_report(w.lock_with_deadline(key, TTL, Instant::now() + window));
    let bound =
        timed_attempts(window, DEFAULT_MIN_DELAY) + confirmation_attempts(&w.stats(), &[0, 1]) + 1;
    let attempts = u64::from(report.attempts());
    assert!(
        attempts <= bound,
        "lock_with_deadline: {attempts} attempts in {window:?}, bound {bound}: {report}"
    );
}

/// Item 9, votes refused. Fencing on 2 durable masters and 3 that are not (their yes never
/// counts): no waiter can reach a quorum. A foreign holder on durable master 0 is
/// announced released again and again (its key stays): none of these announcements can
/// free a quorum, so none may start an attempt. (Before: each one did.)
#[test]
fn announcements_do_not_wake_a_waiter_whose_votes_are_refused() {
    let durable = masters_with(2, &["--appendonly", "yes", "--appendfsync", "always"]);
    let plain = masters(3);
    let key = "not-durable";
    set_by_hand(&durable, 0, key);
    let urls: Vec<String> = durable.urls().into_iter().chain(plain.urls()).collect();
    let (tx, rx) = mpsc::channel();
    let window = Duration::from_secs(2);
    thread::spawn(move || {
        let mut w = Redlock::builder()
            .masters(urls)
            .fencing(true)
            .build()
            .unwrap();
        let r = w.lock_with_deadline(key, TTL, Instant::now() + window);
        let _ = tx.send((r, w.stats()));
    });
    let mut announced = 0u64;
    let (r, stats) = loop {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(done) => break done,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                announce_by_hand(&durable, 0, key);
                announced += 1;
                assert!(announced < 20_000, "the waiting call never ended");
            }
            Err(e) => panic!("{e}"),
        }
    };
    let report = deadline_report(r);
    let bound = timed_attempts(window, DEFAULT_MIN_DELAY)
        + confirmation_attempts(&stats, &[0, 1, 2, 3, 4])
        + 1;
    let attempts = u64::from(report.attempts());
    assert!(
        attempts <= bound,
        "{attempts} attempts in {window:?} ({announced} announcements that could free no \
         quorum), bound {bound}: {report}"
    );
}

/// Item 9, a partition. A waiter (default settings, no jitter) reaches master 0 only: its
/// rounds wait for the other two to time out, so each hears master 0's answer, "taken" by
/// a foreign holder. That holder is announced released again and again on master 0 (its
/// key stays): none of these announcements can free a quorum for this waiter (two masters
/// of three do not answer it), so none may start an attempt: only the timed retries (plus
/// the confirmations', plus one). (Before: each one did; freeing master 0 was taken for
/// room for a quorum, the masters that failed it counting as free.)
#[test]
fn announcements_do_not_wake_a_partitioned_waiter() {
    let m = masters(3);
    let key = "partitioned-announced";
    set_by_hand(&m, 0, key);
    let (urls, _proxies) = partitioned(&m, 0);
    let retry_delay = Duration::from_millis(200);
    let window = Duration::from_secs(3);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut w = Redlock::builder()
            .masters(urls)
            .retry_delay(retry_delay)
            .retry_jitter(Duration::ZERO)
            .build()
            .unwrap();
        let r = w.lock_with_deadline(key, TTL, Instant::now() + window);
        let _ = tx.send((r, w.stats()));
    });
    let mut announced = 0u64;
    let (r, stats) = loop {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(done) => break done,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                announce_by_hand(&m, 0, key);
                announced += 1;
                assert!(announced < 20_000, "the waiting call never ended");
            }
            Err(e) => panic!("{e}"),
        }
    };
    let report = deadline_report(r);
    let bound = timed_attempts(window, retry_delay) + confirmation_attempts(&stats, &[0]) + 1;
    let attempts = u64::from(report.attempts());
    assert!(
        attempts <= bound,
        "{attempts} attempts in {window:?} ({announced} announcements that could free no \
         quorum), bound {bound}: {report}"
    );
}
