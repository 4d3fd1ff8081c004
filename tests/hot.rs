//! Hot resources against real masters: waiters woken by the release (pub/sub on every
//! master), waits sized by the holder's remaining TTL, local hand-off and fairness in the
//! shared client, and waiters whose notification is lost (a subscription connection cut, a
//! master restarted, a holder that crashed) acquiring within their fallback.
//!
//! The retry delays here are long (10-30 s) and jitter-free, so that a waiter that acquires
//! within a few seconds can only have been woken by what the test is about; every wait is
//! bounded.

mod support;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{
    command_calls, get, masters, settle, settle_shared, wait_until, AdminReply, LocalMasters,
};

use redlock_mux::{Error, Lock, Redlock, SharedRedlock, WaitMode};

/// A fallback no test waits for: whatever acquires well before it was woken otherwise.
const FALLBACK: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(30);
/// How long a woken waiter may take, at most (a loaded machine included).
const PROMPT: Duration = Duration::from_secs(3);

fn builder(urls: Vec<String>) -> redlock_mux::Builder {
    Redlock::builder()
        .masters(urls)
        .node_timeout(Duration::from_secs(1))
        .retry_delay(FALLBACK)
        .retry_jitter(Duration::ZERO)
        .retry_count(3)
}

fn channel(key: &str) -> String {
    format!("redlock-mux:released:{key}")
}

/// Subscribers of the key's channel on master `i`.
fn subscribers(m: &LocalMasters, i: usize, key: &str) -> i64 {
    let ch = channel(key);
    match m[i].cmd(&[b"PUBSUB", b"NUMSUB", ch.as_bytes()]) {
        Ok(AdminReply::Array(a)) => match a.get(1) {
            Some(AdminReply::Int(n)) => *n,
            other => panic!("PUBSUB NUMSUB: {other:?}"),
        },
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

fn wait_subscribed(m: &LocalMasters, key: &str, at_least: i64) {
    wait_until("the waiter's subscription", Duration::from_secs(5), || {
        (0..m.len()).all(|i| subscribers(m, i, key) >= at_least)
    });
}

/// Run `lock` on a thread of its own; the receiver gets its result and how long it took.
fn in_thread(
    mut c: Redlock,
    key: &'static str,
) -> mpsc::Receiver<(Result<Lock, Error>, Duration, Redlock)> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        let r = c.lock(key, TTL);
        let _ = tx.send((r, t.elapsed(), c));
    });
    rx
}

/// The basic promise: a waiter is woken by the release, not by its retry delay.
#[test]
fn a_waiter_is_woken_by_the_release() {
    let m = masters(3);
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("hot", TTL).unwrap();
    let waiter = builder(m.urls()).build().unwrap();
    let rx = in_thread(waiter, "hot");
    wait_subscribed(&m, "hot", 1);
    let released = Instant::now();
    holder.release(held).unwrap();
    let (r, took, waiter) = rx.recv_timeout(FALLBACK / 2).expect("woken by the release");
    let lock = r.unwrap();
    assert!(released.elapsed() < PROMPT, "took {took:?}");
    // Refused, maybe again at the subscriptions' confirmations, then woken.
    assert!((2..=5).contains(&lock.attempts()), "{}", lock.attempts());
    let heard: u64 = waiter.stats().iter().map(|s| s.notifications()).sum();
    assert!(heard >= 1, "no notification counted");
    drop(lock);
}

/// Polling waits its retry delay: no subscription, no early wake-up.
#[test]
fn poll_mode_has_no_subscription() {
    let m = masters(3);
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("polled", TTL).unwrap();
    let mut waiter = builder(m.urls())
        .wait_mode(WaitMode::Poll)
        .retry_delay(Duration::from_millis(300))
        .retry_count(1)
        .build()
        .unwrap();
    let r = waiter.lock("polled", TTL);
    assert!(matches!(r, Err(Error::Taken(_))), "{r:?}");
    for s in waiter.stats() {
        assert_eq!(s.subscription_connects(), 0);
    }
    assert_eq!(subscribers(&m, 0, "polled"), 0);
    holder.release(held).unwrap();
}

/// A holder that crashed: nobody announces its keys' expiry, and the waiter follows at
/// the expiry (learnt from the acquire's answer), not at its retry delay. In both modes.
#[test]
fn a_crashed_holder_is_followed_at_its_expiry() {
    let m = masters(3);
    for mode in [WaitMode::Notify, WaitMode::Poll] {
        let key = if mode == WaitMode::Poll {
            "crashed-poll"
        } else {
            "crashed-notify"
        };
        let mut holder = builder(m.urls()).build().unwrap();
        let ttl = Duration::from_millis(600);
        let held = holder.try_lock(key, ttl).unwrap();
        let expires = held.valid_until() + Duration::from_millis(20);
        std::mem::forget(held);
        drop(holder);
        let mut waiter = builder(m.urls()).wait_mode(mode).build().unwrap();
        let t = Instant::now();
        let lock = waiter.lock(key, TTL).unwrap();
        let now = Instant::now();
        assert!(
            now + Duration::from_millis(30) >= expires,
            "{mode:?}: granted before the holder's keys expired"
        );
        assert!(t.elapsed() < PROMPT, "{mode:?}: took {:?}", t.elapsed());
        waiter.release(lock).unwrap();
    }
}

/// Several resources: the wait is sized by the holder whose keys live longest.
#[test]
fn lock_many_waits_for_the_longest_holder() {
    let m = masters(3);
    let mut holder = builder(m.urls()).build().unwrap();
    let short = holder
        .try_lock("many-a", Duration::from_millis(200))
        .unwrap();
    let long = holder
        .try_lock("many-b", Duration::from_millis(700))
        .unwrap();
    let until = long.valid_until();
    std::mem::forget(short);
    std::mem::forget(long);
    let mut waiter = builder(m.urls()).build().unwrap();
    let t = Instant::now();
    let lock = waiter.lock_many(["many-a", "many-b"], TTL).unwrap();
    assert!(Instant::now() + Duration::from_millis(30) >= until);
    assert!(t.elapsed() < PROMPT, "took {:?}", t.elapsed());
    waiter.release(lock).unwrap();
}

/// The subscription connections are cut right after a release was announced (the
/// announcement lost on the way): the waiter reconnects, resubscribes, and tries once at
/// the confirmation, acquiring long before its retry delay.
#[test]
fn a_cut_subscription_does_not_lose_the_release() {
    let m = masters(3);
    let proxies: Vec<Proxy> = (0..3).map(|i| Proxy::start(m[i].addr()).unwrap()).collect();
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("cut", TTL).unwrap();
    let waiter = builder(proxies.iter().map(|p| p.url()).collect())
        .build()
        .unwrap();
    let rx = in_thread(waiter, "cut");
    wait_subscribed(&m, "cut", 1);
    for p in &proxies {
        p.set_mode(Mode::Blackhole);
    }
    holder.release(held).unwrap();
    // The release returned at a quorum. On Valkey 9 a master that answers its `DELIFEQ`
    // later (0: the waiter marked the key) gets the script, which announces, at the
    // single-owner holder's next call: this one (every master answers it).
    settle(&mut holder, 3);
    // The announcements went into the black hole.
    wait_until("the announcements dropped", PROMPT, || {
        proxies.iter().all(|p| p.dropped_bytes() > 0)
    });
    for p in &proxies {
        p.set_mode(Mode::PassThrough);
        p.reset_all();
    }
    let cut = Instant::now();
    let (r, took, waiter) = rx
        .recv_timeout(FALLBACK / 2)
        .expect("acquired after the cut");
    let lock = r.unwrap_or_else(|e| panic!("{e} after {took:?}"));
    assert!(cut.elapsed() < PROMPT, "{:?} after the cut", cut.elapsed());
    let reconnects: u64 = waiter
        .stats()
        .iter()
        .map(|s| s.subscription_connects())
        .sum();
    assert!(reconnects >= 4, "subscription connections: {reconnects}");
    drop(lock);
}

/// A master restarted without persistence forgets the holder's key: no release, no
/// announcement. The waiter's subscription connection comes back with the master, and the
/// confirmation makes it try at once.
#[test]
fn a_restarted_master_does_not_strand_the_waiter() {
    let mut m = masters(1);
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("amnesia", TTL).unwrap();
    let waiter = builder(m.urls()).build().unwrap();
    let rx = in_thread(waiter, "amnesia");
    wait_subscribed(&m, "amnesia", 1);
    m[0].restart().unwrap();
    let restarted = Instant::now();
    let (r, took, _waiter) = rx
        .recv_timeout(FALLBACK / 2)
        .expect("acquired after the restart");
    let lock = r.unwrap_or_else(|e| panic!("{e} after {took:?}"));
    assert!(restarted.elapsed() < PROMPT, "{:?}", restarted.elapsed());
    std::mem::forget(held);
    drop(lock);
}

/// The shared client hands a released lock to its own waiter in the same write as the
/// release: the waiter's attempt runs right behind the release on every master.
#[test]
fn the_shared_client_hands_off_to_its_own_waiter() {
    let m = masters(3);
    let c = builder(m.urls()).build_shared().unwrap();
    let first = c.lock("handoff", TTL).wait().unwrap();
    let (tx, rx) = mpsc::channel();
    let c2 = c.clone();
    thread::spawn(move || {
        let r = c2.lock("handoff", TTL).wait();
        let _ = tx.send((r, Instant::now()));
    });
    wait_subscribed(&m, "handoff", 1);
    let released = Instant::now();
    first.release().wait().unwrap();
    let (r, at) = rx.recv_timeout(FALLBACK / 2).expect("handed off");
    let g = r.unwrap();
    assert!(at.duration_since(released) < PROMPT);
    drop(g);
}

/// The value of a key set by hand: its announcement names it, as a release names its token.
const FOREIGN: &str = "foreign-holder";

/// A key set by hand (a foreign holder that announces nothing by itself) on every master.
fn hold_by_hand(m: &LocalMasters, key: &str) {
    for i in 0..m.len() {
        let set = m[i].cmd(&[b"SET", key.as_bytes(), FOREIGN.as_bytes()]);
        assert!(set.unwrap().is_ok());
    }
}

fn free_by_hand(m: &LocalMasters, key: &str) {
    for i in 0..m.len() {
        m[i].cmd(&[b"DEL", key.as_bytes()]).unwrap();
    }
}

/// Announce a release of `key` by `payload`'s holder on every master, as the release
/// script does when nobody is in line.
fn announce_by_hand(m: &LocalMasters, key: &str, payload: &str) {
    let ch = channel(key);
    for i in 0..m.len() {
        m[i].cmd(&[b"PUBLISH", ch.as_bytes(), payload.as_bytes()])
            .unwrap();
    }
}

fn refused(c: &SharedRedlock) -> u64 {
    c.stats().wait().unwrap().iter().map(|s| s.refused()).sum()
}

/// Everything queued to the loop before this has been handled, and every request it sent
/// has been answered by a quorum of masters (Redis answers one connection's requests in
/// order; the sync's own round returns at a quorum: a late master may still be working
/// through them, see `support::settle_shared`).
fn sync(c: &SharedRedlock) {
    let g = c.try_lock("sync", Duration::from_secs(5)).wait().unwrap();
    g.release().wait().unwrap();
}

/// With fairness, a waiter that arrives while an earlier one waits joins the queue: it
/// does not take a lock the earlier waiter has not been told is free. (Without fairness its
/// first attempt would take it.)
#[test]
fn a_newcomer_does_not_overtake_a_fair_waiter() {
    let m = masters(3);
    let c = builder(m.urls()).fairness(true).build_shared().unwrap();
    hold_by_hand(&m, "fair-new");
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |who: usize| {
        let (c, order) = (c.clone(), order.clone());
        let pending = c.lock("fair-new", TTL);
        thread::spawn(move || {
            let g = pending.wait().unwrap();
            order.lock().unwrap().push(who);
            g.release().wait().unwrap();
        })
    };
    let first = spawn(1);
    wait_subscribed(&m, "fair-new", 1);
    sync(&c);
    // The lock comes free without an announcement (as after an expiry), then a newcomer.
    free_by_hand(&m, "fair-new");
    let freed = Instant::now();
    let second = spawn(2);
    // The newcomer is refused politely (the head of the line is alive), and its refusal
    // tells the head that the key is free: the head takes it at once (not at its 10 s
    // retry), then its release hands over to the newcomer.
    first.join().unwrap();
    assert!(
        freed.elapsed() < PROMPT,
        "the head was told by nobody: {:?}",
        freed.elapsed()
    );
    second.join().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        vec![1, 2],
        "the newcomer took it first"
    );
}

/// With fairness, a release wakes the oldest waiter only; without, every waiter tries.
/// (One master: each attempt is one refusal, and a refused round leaves no cleanup.)
#[test]
fn a_release_wakes_one_fair_waiter() {
    let m = masters(1);
    for fair in [true, false] {
        let key = if fair { "fair-one" } else { "unfair-one" };
        let c = builder(m.urls()).fairness(fair).build_shared().unwrap();
        // A first wait sets the channel up, so that the waiters below are covered from
        // their first attempt (no check at the confirmation).
        hold_by_hand(&m, key);
        let warm = c.lock(key, TTL);
        sync(&c);
        wait_subscribed(&m, key, 1);
        free_by_hand(&m, key);
        announce_by_hand(&m, key, FOREIGN);
        warm.wait().unwrap().release().wait().unwrap();
        hold_by_hand(&m, key);
        let waiters: Vec<_> = (0..3).map(|_| c.lock(key, TTL)).collect();
        sync(&c);
        let before = refused(&c);
        announce_by_hand(&m, key, FOREIGN);
        wait_until("the woken attempt", PROMPT, || refused(&c) > before);
        sync(&c);
        let woken = refused(&c) - before;
        assert_eq!(woken, if fair { 1 } else { 3 }, "fair: {fair}");
        free_by_hand(&m, key);
        announce_by_hand(&m, key, FOREIGN);
        for w in waiters {
            w.wait().unwrap().release().wait().unwrap();
        }
    }
}

/// Fair waiters of one shared client are granted in the order they asked, and a hot
/// resource moves at hand-off speed: many grants in well under one retry delay.
#[test]
fn fair_waiters_are_granted_in_arrival_order() {
    let m = masters(3);
    let c = builder(m.urls()).fairness(true).build_shared().unwrap();
    hold_by_hand(&m, "fifo");
    let order = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..6)
        .map(|who| {
            let (c2, order) = (c.clone(), order.clone());
            let pending = c.lock("fifo", TTL);
            sync(&c);
            thread::spawn(move || {
                let g = pending.wait().unwrap();
                order.lock().unwrap().push(who);
                g.release().wait().unwrap();
                drop(c2);
            })
        })
        .collect();
    let t = Instant::now();
    free_by_hand(&m, "fifo");
    announce_by_hand(&m, "fifo", FOREIGN);
    for th in threads {
        th.join().unwrap();
    }
    assert!(t.elapsed() < PROMPT, "{:?}", t.elapsed());
    assert_eq!(*order.lock().unwrap(), (0..6).collect::<Vec<_>>());
    // The last release returned at a quorum: the last master's may still be on its way.
    settle_shared(&c, 3);
    assert!((0..3).all(|i| get(&m, i, "fifo").is_none()));
}

/// The subscription connection closes once nobody waited for its linger (2 s).
#[test]
fn subscriptions_end_after_the_last_wait() {
    let m = masters(3);
    let c = builder(m.urls()).build_shared().unwrap();
    let first = c.lock("linger", TTL).wait().unwrap();
    let second = c.lock("linger", TTL);
    sync(&c);
    wait_subscribed(&m, "linger", 1);
    first.release().wait().unwrap();
    second.wait().unwrap().release().wait().unwrap();
    wait_until("the subscription to end", Duration::from_secs(6), || {
        (0..3).all(|i| subscribers(&m, i, "linger") == 0)
    });
}

/// How long the one waiter of `key` has left to live on master `i` (ms on the master's
/// clock: its moment in the key's liveness set, `scripts::ALIVE`, minus `TIME`), or -1
/// when the set names nobody.
fn alive_left(m: &LocalMasters, i: usize, key: &str) -> i64 {
    let a = redlock_mux::scripts::aux_key(redlock_mux::scripts::ALIVE, key.as_bytes());
    let until = match m[i]
        .cmd(&[b"ZRANGE", &a, b"0", b"-1", b"WITHSCORES"])
        .unwrap()
    {
        AdminReply::Array(a) if a.is_empty() => return -1,
        AdminReply::Array(a) if a.len() == 2 => a[1].as_str().unwrap().parse::<f64>().unwrap(),
        other => panic!("one waiter expected in {key}'s liveness set on master {i}: {other:?}"),
    };
    let now = match m[i].cmd(&[b"TIME"]).unwrap() {
        AdminReply::Array(t) => {
            let s: f64 = t[0].as_str().unwrap().parse().unwrap();
            let us: f64 = t[1].as_str().unwrap().parse().unwrap();
            s * 1000.0 + (us / 1000.0).floor()
        }
        other => panic!("TIME: {other:?}"),
    };
    (until - now) as i64
}

/// Waiters in line on a key, by hand-counted entries of its line on master `i`.
fn in_line(m: &LocalMasters, i: usize, key: &str) -> i64 {
    let q = redlock_mux::scripts::aux_key(redlock_mux::scripts::QUEUE, key.as_bytes());
    match m[i].cmd(&[b"ZCARD", &q]) {
        Ok(AdminReply::Int(n)) => n,
        other => panic!("ZCARD: {other:?}"),
    }
}

/// Fair clients that share nothing but the masters are served in the order they came: the
/// line on the masters orders them, and each release names the first of them. (With
/// fairness in one client only, independent clients would race.)
#[test]
fn independent_fair_clients_are_served_in_arrival_order() {
    let m = masters(3);
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("line", TTL).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for who in 0..4 {
        let mut c = builder(m.urls()).fairness(true).build().unwrap();
        let order = order.clone();
        threads.push(thread::spawn(move || {
            let lock = c.lock("line", TTL).unwrap();
            order.lock().unwrap().push(who);
            c.release(lock).unwrap();
            // The release returned at a quorum: it has left the line on every master once
            // the client settled (checked below).
            settle(&mut c, 3);
        }));
        // The next one comes once this one stands in line on every master.
        wait_until("the waiter in line", PROMPT, || {
            (0..3).all(|i| in_line(&m, i, "line") == who as i64 + 1)
        });
    }
    let t = Instant::now();
    holder.release(held).unwrap();
    for th in threads {
        th.join().unwrap();
    }
    assert!(t.elapsed() < PROMPT, "{:?}", t.elapsed());
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    // Each left the line with its release.
    assert!((0..3).all(|i| in_line(&m, i, "line") == 0));
}

/// A release wakes the first waiter in line only, whatever its client: the others' clients
/// hear nothing (their retry delay is 10 s), and each release hands over to the next.
/// (Fair clients: without fairness, a waiter's own attempt, e.g. the one it makes when its
/// subscription is confirmed, may still come first.)
#[test]
fn a_release_names_one_client_not_all() {
    let m = masters(3);
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("named", TTL).unwrap();
    let mut rxs = Vec::new();
    for who in 0..3 {
        let c = builder(m.urls()).fairness(true).build().unwrap();
        rxs.push(in_thread(c, "named"));
        wait_until("the waiter in line", PROMPT, || {
            (0..3).all(|i| in_line(&m, i, "named") == who + 1)
        });
    }
    holder.release(held).unwrap();
    // The first in line is granted; the two others are still waiting (their retry delay is
    // 10 s), having made no attempt on the release.
    let (first, _, mut c0) = rxs[0]
        .recv_timeout(FALLBACK / 2)
        .expect("the first in line");
    let first = first.unwrap();
    for rx in &rxs[1..] {
        assert!(
            rx.try_recv().is_err(),
            "a waiter not first in line was granted"
        );
    }
    // The next release names the second, and so on.
    c0.release(first).unwrap();
    let (second, _, mut c1) = rxs[1]
        .recv_timeout(FALLBACK / 2)
        .expect("the second in line");
    let second = second.unwrap();
    assert!(rxs[2].try_recv().is_err());
    c1.release(second).unwrap();
    let (third, _, mut c2) = rxs[2]
        .recv_timeout(FALLBACK / 2)
        .expect("the third in line");
    c2.release(third.unwrap()).unwrap();
}

/// The first in line died (a client that stopped asking): it drops out of line when its
/// liveness runs out, and the next waiter, fair or not, takes the lock within its
/// fallback. (Without the expiry a fair waiter would stand behind it for ever.)
#[test]
fn a_dead_first_in_line_drops_out() {
    let m = masters(3);
    for fair in [true, false] {
        let key = if fair { "dead-fair" } else { "dead" };
        let mut holder = builder(m.urls()).build().unwrap();
        let held = holder.try_lock(key, TTL).unwrap();
        // A waiter in line at score 0 (first), alive for 600 ms, that never asks again.
        let q = redlock_mux::scripts::aux_key(redlock_mux::scripts::QUEUE, key.as_bytes());
        let a = redlock_mux::scripts::aux_key(redlock_mux::scripts::ALIVE, key.as_bytes());
        for i in 0..3 {
            m[i].cmd(&[b"ZADD", &q, b"0", b"deadbeefdeadbeef"]).unwrap();
            // Alive for 600 ms from now on the master's clock.
            let until = match m[i].cmd(&[b"TIME"]).unwrap() {
                AdminReply::Array(t) => {
                    let s: u64 = t[0].as_str().unwrap().parse().unwrap();
                    let us: u64 = t[1].as_str().unwrap().parse().unwrap();
                    s * 1000 + us / 1000 + 600
                }
                other => panic!("TIME: {other:?}"),
            };
            m[i].cmd(&[
                b"ZADD",
                &a,
                until.to_string().as_bytes(),
                b"deadbeefdeadbeef",
            ])
            .unwrap();
        }
        let waiter = builder(m.urls())
            .fairness(fair)
            .retry_delay(Duration::from_millis(400))
            .build()
            .unwrap();
        let rx = in_thread(waiter, key);
        wait_until("the waiter in line", PROMPT, || {
            (0..3).all(|i| in_line(&m, i, key) == 2)
        });
        let released = Instant::now();
        holder.release(held).unwrap();
        let (r, _, mut c) = rx.recv_timeout(FALLBACK / 2).expect("acquired");
        let took = released.elapsed();
        c.release(r.unwrap()).unwrap();
        assert!(took < Duration::from_secs(2), "fair {fair}: {took:?}");
    }
}

/// A waiter whose attempts win on some masters but not a quorum (the key freed on one
/// master only) keeps asking, so it keeps its place in line there: each of its attempts
/// refreshes its liveness key, the ones that take the key included. (Found by the
/// simulation: the first version refreshed it only at refusals, so after the liveness TTL
/// the waiter dropped out of line on the masters where it kept winning, and a later
/// waiter could be granted first.)
#[test]
fn a_waiter_winning_a_minority_keeps_its_place_in_line() {
    let m = masters(3);
    let key = "fair-minority";
    hold_by_hand(&m, key);
    // Liveness TTL: retry delay 50 ms + no jitter + 2 round timeouts of 50 ms + 100 ms.
    let alive = Duration::from_millis(250);
    let waiter = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(50))
        .retry_jitter(Duration::ZERO)
        .retry_count(400)
        .fairness(true)
        .build()
        .unwrap();
    let rx = in_thread(waiter, key);
    wait_until(
        "the waiter in line on every master",
        Duration::from_secs(5),
        || (0..3).all(|i| in_line(&m, i, key) == 1),
    );
    // Master 0 frees the key: from now on every attempt of the waiter wins there (and its
    // cleanup deletes the key again), while masters 1 and 2 refuse it.
    m[0].cmd(&[b"DEL", key.as_bytes()]).unwrap();
    // Well past the liveness TTL (a waiter key not refreshed would be gone by then), the
    // waiter still stands in line on master 0, alive.
    thread::sleep(4 * alive);
    wait_until("the waiter alive in line on master 0", PROMPT, || {
        alive_left(&m, 0, key) > 0 && in_line(&m, 0, key) == 1
    });
    assert!(
        rx.try_recv().is_err(),
        "the waiter got a lock held on 2 of 3 masters"
    );
    free_by_hand(&m, key);
    let (r, _, mut c) = rx
        .recv_timeout(PROMPT + FALLBACK)
        .expect("the waiter's call");
    c.release(r.expect("the waiter gets the freed lock"))
        .unwrap();
}

/// A waiting call that ends without the lock (here: its deadline passed while the key was
/// held) leaves the key's line on every master, so the next release names a waiter that is
/// still there: one that came later is woken by it, not by its 10 s retry delay. (Before,
/// the call left the line only where its last attempt may have set the key, that is
/// nowhere when every master said taken: the release named the one that had gone, and
/// the others slept on.)
#[test]
fn a_waiter_that_gives_up_leaves_the_line() {
    for (fair, key) in [(false, "quit"), (true, "quit-fair")] {
        let m = masters(3);
        let mut holder = builder(m.urls()).build().unwrap();
        let held = holder.try_lock(key, TTL).unwrap();
        let mut quitter = builder(m.urls()).fairness(fair).build().unwrap();
        let r = quitter.lock_with_deadline(key, TTL, Instant::now() + Duration::from_millis(300));
        assert!(matches!(r, Err(Error::DeadlineExceeded(_))), "{r:?}");
        wait_until("the call that gave up out of line", PROMPT, || {
            (0..3).all(|i| in_line(&m, i, key) == 0)
        });
        let waiter = builder(m.urls()).fairness(fair).build().unwrap();
        let rx = in_thread(waiter, key);
        wait_until("the next waiter in line", PROMPT, || {
            (0..3).all(|i| in_line(&m, i, key) == 1)
        });
        holder.release(held).unwrap();
        let (r, _, mut c) = rx
            .recv_timeout(PROMPT)
            .unwrap_or_else(|_| panic!("fair {fair}: the waiter was not woken by the release"));
        c.release(r.expect("the waiter gets the lock")).unwrap();
        drop(quitter);
    }
}

/// `retry_count` counts the timed retries only: attempts made on an announcement come on
/// top, so a call woken three times still makes its one timed retry, a retry delay after
/// it began, before it gives up.
#[test]
fn announced_attempts_do_not_use_up_the_retries() {
    let m = masters(1);
    let key = "budget";
    let retry_delay = Duration::from_secs(2);
    let c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_secs(1))
        .retry_delay(retry_delay)
        .retry_jitter(Duration::ZERO)
        .retry_count(1)
        .build_shared()
        .unwrap();
    hold_by_hand(&m, key);
    let started = Instant::now();
    let pending = c.lock(key, TTL);
    sync(&c);
    wait_subscribed(&m, key, 1);
    for _ in 0..3 {
        let before = refused(&c);
        announce_by_hand(&m, key, FOREIGN);
        wait_until("the announced attempt", PROMPT, || refused(&c) > before);
    }
    match pending.wait() {
        Err(Error::Taken(report)) => assert!(
            report.attempts() >= 5,
            "1 first + 3 announced + 1 timed: {report}"
        ),
        other => panic!("expected Taken after the timed retry: {other:?}"),
    }
    assert!(
        started.elapsed() >= retry_delay,
        "gave up after {:?}, before its timed retry",
        started.elapsed()
    );
    free_by_hand(&m, key);
}

/// A waiter stays in line while it sleeps between timed attempts: its liveness key lives
/// its retry delay plus jitter, two round timeouts and 100 ms (here 1000 + 0 + 2 x 50 +
/// 100 = 1200 ms), longer than any sleep, and each attempt sets it again.
#[test]
fn a_sleeping_waiter_stays_in_line() {
    let m = masters(3);
    let key = "alive";
    hold_by_hand(&m, key);
    let waiter = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(50))
        .retry_delay(Duration::from_secs(1))
        .retry_jitter(Duration::ZERO)
        .retry_count(3)
        .fairness(true)
        .build()
        .unwrap();
    let rx = in_thread(waiter, key);
    wait_until("the waiter in line", PROMPT, || {
        (0..3).all(|i| in_line(&m, i, key) == 1)
    });
    let pttl = |i: usize| alive_left(&m, i, key);
    let first = pttl(0);
    assert!((1000..=1200).contains(&first), "liveness PTTL {first} ms");
    // Through two whole sleeps (2.4 s), it never drops out of line on any master.
    let until = Instant::now() + Duration::from_millis(2400);
    while Instant::now() < until {
        for i in 0..3 {
            assert!(pttl(i) > 0, "the waiter's key lapsed on master {i}");
            assert_eq!(
                in_line(&m, i, key),
                1,
                "the waiter left the line on master {i}"
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    free_by_hand(&m, key);
    let (r, _, mut c) = rx
        .recv_timeout(PROMPT + FALLBACK)
        .expect("the waiter's call");
    c.release(r.expect("the waiter gets the freed lock"))
        .unwrap();
}

/// An ACL user without the right to any channel (`resetchannels`): locks and releases
/// still work (the scripts publish through `pcall`), the refused subscription is reported
/// (`last_subscription_fault`), and a waiter of the same shared client is still handed the
/// lock by its client's release at once: the waiter's attempt goes out behind the release,
/// without any announcement (its retry delay is 10 s).
#[test]
fn without_channel_rights_the_shared_client_hands_off_to_its_own_waiter() {
    let m = masters(3);
    for i in 0..3 {
        let r = m[i].cmd(&[
            b"ACL",
            b"SETUSER",
            b"nochan",
            b"on",
            b">pw",
            b"~*",
            b"resetchannels",
            b"+@all",
        ]);
        assert!(r.unwrap().is_ok());
    }
    let urls: Vec<String> = m
        .addrs()
        .iter()
        .map(|a| format!("redis://nochan:pw@{a}"))
        .collect();
    let c = builder(urls).build_shared().unwrap();
    let key = "no-channels";
    let g = c.try_lock(key, TTL).wait().unwrap();
    let waiter = c.lock(key, TTL);
    sync(&c);
    wait_until("the refused subscription reported", PROMPT, || {
        c.stats().wait().unwrap().iter().any(|s| {
            matches!(s.last_subscription_fault(), Some(f) if format!("{f:?}").contains("NOPERM"))
        })
    });
    let released = Instant::now();
    g.release().wait().unwrap();
    let g = waiter.wait().expect("the waiter gets the lock");
    assert!(
        released.elapsed() < PROMPT,
        "handed over after {:?} (its retry delay is {FALLBACK:?})",
        released.elapsed()
    );
    g.release().wait().unwrap();
}

/// Dropping a waiting `lock()` future (asleep in line, subscribed) ends the call: it leaves
/// the line on every master, nothing is left behind, and its channel is given up.
#[test]
fn a_dropped_waiting_lock_leaves_the_line() {
    let m = masters(3);
    let key = "dropped-waiter";
    let c = builder(m.urls()).fairness(true).build_shared().unwrap();
    hold_by_hand(&m, key);
    let waiting = c.lock(key, TTL);
    sync(&c);
    wait_until("the waiter in line", PROMPT, || {
        (0..3).all(|i| in_line(&m, i, key) == 1)
    });
    drop(waiting);
    wait_until("the dropped call out of line", PROMPT, || {
        (0..3).all(|i| in_line(&m, i, key) == 0)
    });
    // The key is still the hand-made holder's: the call took nothing.
    assert!((0..3).all(|i| get(&m, i, key).as_deref() == Some(FOREIGN.as_bytes())));
    wait_until("the channel given up", Duration::from_secs(6), || {
        (0..3).all(|i| subscribers(&m, i, key) == 0)
    });
    free_by_hand(&m, key);
}

/// A multi-resource wait does not stand in any line, and is woken by a release of one of
/// its keys once the announcements leave room for a quorum (its retry delay is 10 s).
#[test]
fn lock_many_is_woken_by_the_release_without_a_line() {
    let m = masters(3);
    let mut holder = builder(m.urls()).build().unwrap();
    let held = holder.try_lock("many-a", TTL).unwrap();
    let c = builder(m.urls()).build_shared().unwrap();
    let waiting = c.lock_many(["many-a", "many-b"], TTL);
    sync(&c);
    wait_subscribed(&m, "many-a", 1);
    assert!((0..3).all(|i| in_line(&m, i, "many-a") == 0 && in_line(&m, i, "many-b") == 0));
    let released = Instant::now();
    holder.release(held).unwrap();
    let g = waiting.wait().expect("the multi-resource lock");
    assert!(
        released.elapsed() < PROMPT,
        "woken {:?} after the release (retry delay {FALLBACK:?})",
        released.elapsed()
    );
    g.release().wait().unwrap();
}

/// An ACL user with the right to its own keys only (`~app:*`, not the crate's
/// `~redlock-mux:*`): the release script, which declares the keys' lines and liveness sets
/// beside them, is refused (`-NOPERM`); the client releases with the compare-and-delete
/// alone (`scripts::RELEASE_PLAIN`), so the lock is free at once, not at the end of its TTL.
/// A waiting `lock()` is likewise sent again out of any line.
#[test]
fn a_user_without_rights_to_the_lines_still_releases() {
    let m = masters(3);
    for i in 0..3 {
        let r = m[i].cmd(&[
            b"ACL", b"SETUSER", b"app", b"on", b">pw", b"~app:*", b"&*", b"+@all",
        ]);
        assert!(r.unwrap().is_ok());
    }
    let urls: Vec<String> = m
        .addrs()
        .iter()
        .map(|a| format!("redis://app:pw@{a}"))
        .collect();
    let mut c = builder(urls).retry_count(0).build().unwrap();
    // A release returns at a quorum; a late master's refusal is answered (the plain release
    // sent) at the client's next call: drive it until every master let the key go.
    let released_everywhere = |c: &mut Redlock| {
        wait_until("the key gone from every master", PROMPT, || {
            let l = c.try_lock("app:drive", TTL).unwrap();
            c.release(l).unwrap();
            (0..3).all(|i| get(&m, i, "app:res").is_none())
        });
    };
    let lock = c.try_lock("app:res", TTL).unwrap();
    c.release(lock).unwrap();
    released_everywhere(&mut c);
    // The waiting acquire declares the line's keys too: refused, it is sent again out of
    // any line, and the lock is taken.
    let lock = c.lock("app:res", TTL).unwrap();
    c.release(lock).unwrap();
    released_everywhere(&mut c);
}

/// Whether master `i` offers `DELIFEQ`: its `INFO server` reports `valkey_version` 9 or
/// later (what the client's handshake reads).
fn offers_delifeq(m: &LocalMasters, i: usize) -> bool {
    let text = match m[i].cmd(&[b"INFO", b"server"]).expect("INFO server") {
        AdminReply::Bulk(Some(t)) => String::from_utf8(t).unwrap(),
        other => panic!("INFO server: {other:?}"),
    };
    text.lines()
        .find_map(|l| l.strip_prefix("valkey_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 9)
}

/// What master `i` ran since `before` (`INFO` aside: the reads of the counts).
fn ran_since(m: &LocalMasters, i: usize, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    command_calls(m, i)
        .into_iter()
        .map(|(k, v)| {
            let was = before.get(&k).copied().unwrap_or(0);
            (k, v - was)
        })
        .filter(|(k, n)| *n > 0 && k != "info")
        .collect()
}

/// Issue 23, `DELIFEQ`: where the masters offer it (Valkey 9, told by `valkey_version` in
/// the handshake's `INFO server`), the release of a one-key lock that did not wait is
/// `DELIFEQ key token`: no script runs (no `EVALSHA`, `GET`, `DEL`). Where a waiter marked
/// the key (its refusal appended `+`), `DELIFEQ` answers 0 and the release's script
/// follows: it deletes the key and announces the release, and the waiter is woken and
/// granted within moments (its retry delay is 10 s). On masters without `DELIFEQ` (Redis
/// 7.0) the release is the script, unchanged. The same assertions run against either
/// server (`REDIS_SERVER`): CI's Valkey pass takes the `DELIFEQ` branch.
///
/// Fails without the follow-up (`:0` counted as "not held"): the marked key stays, the
/// holder's release reports that no master held the lock, and the waiter hears nothing.
#[test]
fn a_release_is_delifeq_where_the_master_offers_it_and_a_marked_key_still_hands_over() {
    let m = masters(3);
    let delifeq = offers_delifeq(&m, 0);
    assert!((1..3).all(|i| offers_delifeq(&m, i) == delifeq));
    let mut holder = builder(m.urls()).build().unwrap();
    // Connections and handshakes first: what is counted below is cycles only.
    let warm = holder.try_lock("delifeq-warm", TTL).unwrap();
    holder.release(warm).unwrap();
    settle(&mut holder, 3);

    // Uncontended: per cycle, SET then DELIFEQ (or the script: EVALSHA, GET, DEL).
    let before: Vec<_> = (0..m.len()).map(|i| command_calls(&m, i)).collect();
    const CYCLES: u64 = 20;
    for _ in 0..CYCLES {
        let lock = holder.try_lock("delifeq", TTL).unwrap();
        holder.release(lock).unwrap();
    }
    let expected: BTreeMap<String, u64> = if delifeq {
        [("delifeq", CYCLES), ("set", CYCLES)].as_slice()
    } else {
        [
            ("del", CYCLES),
            ("evalsha", CYCLES),
            ("get", CYCLES),
            ("set", CYCLES),
        ]
        .as_slice()
    }
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect();
    for (i, before) in before.iter().enumerate() {
        // The last release returned at a quorum: a late master may still run it.
        let mut seen = ran_since(&m, i, before);
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen != expected && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
            seen = ran_since(&m, i, before);
        }
        assert_eq!(
            seen, expected,
            "master {i} (DELIFEQ offered: {delifeq}): commands of {CYCLES} uncontended cycles"
        );
    }

    // Contended: a waiter refused while the lock is held marks the key on every master.
    let held = holder.try_lock("delifeq-hot", TTL).unwrap();
    let rx = in_thread(builder(m.urls()).build().unwrap(), "delifeq-hot");
    wait_subscribed(&m, "delifeq-hot", 1);
    wait_until("the waiter's mark", Duration::from_secs(5), || {
        (0..m.len()).all(|i| get(&m, i, "delifeq-hot").is_some_and(|v| v.ends_with(b"+")))
    });
    let before: Vec<_> = (0..m.len()).map(|i| command_calls(&m, i)).collect();
    let released = Instant::now();
    holder
        .release(held)
        .expect("the release of a marked key (DELIFEQ's 0, then the script)");
    let (r, took, mut waiter) = rx
        .recv_timeout(FALLBACK / 2)
        .expect("the waiter woken by the release");
    let lock = r.unwrap();
    assert!(released.elapsed() < PROMPT, "took {took:?}");
    waiter.release(lock).unwrap();
    settle(&mut waiter, 3);
    // The holder's release returned at a quorum: a late master's DELIFEQ may not have run
    // yet, and the script after its 0 goes out with the holder's next call. The first
    // inspection carries it (behind itself), the second answers only after it ran.
    settle(&mut holder, 3);
    settle(&mut holder, 3);
    for (i, before) in before.iter().enumerate() {
        let seen = ran_since(&m, i, before);
        let count = |c: &str| seen.get(c).copied().unwrap_or(0);
        // One DELIFEQ (answered 0) where offered; the script announced the release.
        assert_eq!(count("delifeq"), u64::from(delifeq), "master {i}: {seen:?}");
        assert!(count("publish") >= 1, "master {i}: {seen:?}");
    }
}

/// Issue 23, `DELIFEQ` refused: a master whose ACL denies `DELIFEQ` to the client's user
/// (`-NOPERM`) still has every release run (the script follows the refusal), and is not
/// sent `DELIFEQ` again for the client's life (docs/production.md, "Releases without Lua
/// on Valkey 9"). On servers without `DELIFEQ` (Redis 7.0) it checks that the release is
/// the script throughout (no ACL rule there: Redis 7.0 refuses a rule naming a command it
/// does not know).
#[test]
fn a_master_that_refuses_delifeq_gets_the_script_from_then_on() {
    let valkey = {
        let probe = masters(1);
        offers_delifeq(&probe, 0)
    };
    let deny = [
        "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-delifeq",
    ];
    let m = if valkey {
        support::masters_with(3, &deny)
    } else {
        masters(3)
    };
    let mut c = builder(m.urls()).build().unwrap();
    let before: Vec<_> = (0..m.len()).map(|i| command_calls(&m, i)).collect();
    const CYCLES: u64 = 5;
    for _ in 0..CYCLES {
        let lock = c.try_lock("delifeq-denied", TTL).unwrap();
        c.release(lock).expect("released, DELIFEQ refused or not");
    }
    settle(&mut c, 3);
    settle(&mut c, 3);
    for (i, before) in before.iter().enumerate() {
        let seen = ran_since(&m, i, before);
        let count = |c: &str| seen.get(c).copied().unwrap_or(0);
        // Every release ran the script (the inspections of `settle` are scripts too). A
        // release may find its key gone there: the script after the first refusal goes
        // with the client's next call when the release returned at a quorum without
        // this master (docs/production.md).
        assert!(
            count("evalsha") >= CYCLES,
            "master {i}: every release ran the script: {seen:?}"
        );
        assert_eq!(count("delifeq"), 0, "master {i}: {seen:?}");
        assert_eq!(
            get(&m, i, "delifeq-denied"),
            None,
            "master {i}: the key is released"
        );
        if valkey {
            // Refused once (the first release), never asked again.
            assert_eq!(rejected_calls(&m, i, "delifeq"), 1, "master {i}");
        }
    }
}

/// `INFO commandstats`' `rejected_calls` of `command` on master `i` (commands refused
/// before they ran: unknown, denied by an ACL...).
fn rejected_calls(m: &LocalMasters, i: usize, command: &str) -> u64 {
    let text = match m[i].cmd(&[b"INFO", b"commandstats"]).expect("INFO") {
        AdminReply::Bulk(Some(t)) => String::from_utf8(t).unwrap(),
        other => panic!("INFO commandstats: {other:?}"),
    };
    let prefix = format!("cmdstat_{command}:");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| {
            rest.split("rejected_calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}
