//! Liveness and safety holes of the network layer (issue 19, items 5 to 8), each against
//! real `redis-server` masters: a lost wake-up of a multi-resource waiter, one server
//! under two names, a different server swapped in behind an address, and releases owed
//! to a master that fell behind.
//!
//! Faults are placed with the fault proxy (hold, blackhole, a switched upstream) and
//! SIGSTOP; every wait is a bounded poll, and what is asserted is a count or a state.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{masters, poll_until, wait_until, AdminReply, LocalMasters};

use redlock_mux::{Error, LockGuard, Redlock};

/// Subscribers of `channel` on master `i`.
fn subscribers(m: &LocalMasters, i: usize, channel: &str) -> i64 {
    match m[i].cmd(&[b"PUBSUB", b"NUMSUB", channel.as_bytes()]) {
        Ok(AdminReply::Array(a)) => match a.get(1) {
            Some(AdminReply::Int(n)) => *n,
            other => panic!("PUBSUB NUMSUB: {other:?}"),
        },
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// 5. A lost wake-up
// ---------------------------------------------------------------------------------------

/// (5) A multi-resource waiter (no line: every waiter hears the key's channel) is woken by
/// the first copy of a release from one master while the release has not reached the
/// others yet. That attempt finds the key still held on the other masters and is refused;
/// the copies of the same release from those masters then arrive, and must wake the waiter
/// again: they free the masters its last attempt found taken. On the old code they were
/// ignored ("the release that woke the task is no news"; for one key the holder's
/// fingerprint said otherwise, for several keys nothing did), and the waiter slept until
/// its retry delay (the flaky `hot.rs lock_many_is_woken_by_the_release_without_a_line`).
///
/// Made deterministic: the waiter's connections to master 1 go through a proxy that holds
/// its bytes while the first attempts run (so they are decided without master 1), and the
/// holder (a key set by hand) is released by hand, master by master, as the release script
/// does it (`DEL`, then `PUBLISH` of the token's first 16 bytes).
#[test]
fn a_waiter_woken_too_early_hears_the_rest_of_the_release() {
    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    const KEY: &str = "early-a";
    let fallback = Duration::from_secs(60);
    let m = masters(3);
    let p1 = Proxy::start(m[1].addr()).unwrap();
    for i in 0..3 {
        let set = m[i].cmd(&[b"SET", KEY.as_bytes(), TOKEN.as_bytes(), b"PX", b"60000"]);
        assert!(set.unwrap().is_ok());
    }
    p1.set_mode(Mode::Hold);
    let c = Redlock::builder()
        .masters([m[0].url(), p1.url(), m[2].url()])
        .node_timeout(Duration::from_secs(5))
        .stall_timeout(Duration::from_secs(60))
        .retry_delay(fallback)
        .retry_jitter(Duration::ZERO)
        .retry_count(3)
        .build_shared()
        .unwrap();
    let waiting = c.lock_many([KEY, "early-b"], Duration::from_secs(30));
    let (tx, rx) = mpsc::channel::<Result<LockGuard, Error>>();
    thread::spawn(move || {
        let _ = tx.send(waiting.wait());
    });
    let refused = |c: &redlock_mux::SharedRedlock, i: usize| c.stats().wait().unwrap()[i].refused();
    // Its first attempt (refused by masters 0 and 2, decided without master 1), then the
    // one its first confirmed subscription starts (the same): two refusals on each.
    let channel = format!("redlock-mux:released:{KEY}");
    wait_until(
        "the waiter's subscriptions",
        Duration::from_secs(10),
        || subscribers(&m, 0, &channel) == 1 && subscribers(&m, 2, &channel) == 1,
    );
    wait_until("two refused attempts", Duration::from_secs(10), || {
        refused(&c, 0) >= 2 && refused(&c, 2) >= 2
    });
    // Master 1's bytes flow again: its late answers ("taken") and its subscription.
    p1.set_mode(Mode::PassThrough);
    wait_until(
        "the subscription on master 1",
        Duration::from_secs(10),
        || subscribers(&m, 1, &channel) == 1 && refused(&c, 1) >= 2,
    );
    assert_eq!(
        (refused(&c, 0), refused(&c, 2)),
        (2, 2),
        "no other attempt ran"
    );
    let release = |i: usize| {
        m[i].cmd(&[b"DEL", KEY.as_bytes()]).unwrap();
        m[i].cmd(&[b"PUBLISH", channel.as_bytes(), &TOKEN.as_bytes()[..16]])
            .unwrap();
    };
    // The release reaches master 0 first. The waiter's last attempt left masters 0 and 2
    // blocked and master 1 unknown (counted as blocked: issue 19 item 4), so one copy
    // frees too little to try: it must hear the rest of the same release, not sleep
    // until its timed retry.
    release(0);
    let notices =
        |c: &redlock_mux::SharedRedlock, i: usize| c.stats().wait().unwrap()[i].notifications();
    wait_until(
        "the announcement from master 0",
        Duration::from_secs(10),
        || notices(&c, 0) >= 1,
    );
    assert!(
        rx.try_recv().is_err(),
        "granted before the release reached a quorum"
    );
    // The rest of the same release: masters 1 and 2.
    let released = Instant::now();
    release(1);
    release(2);
    let got = rx.recv_timeout(Duration::from_secs(20));
    let stats = c.stats().wait().unwrap();
    match got {
        Ok(Ok(g)) => {
            assert!(released.elapsed() < fallback);
            g.release().wait().unwrap();
        }
        Ok(Err(e)) => panic!("the waiter failed: {e}"),
        Err(_) => panic!(
            "the waiter was not woken by the rest of the release (still asleep {:?} later; \
             its retry delay is {fallback:?}): {:?}",
            released.elapsed(),
            stats.iter().map(|s| s.refused()).collect::<Vec<_>>()
        ),
    }
}

// ---------------------------------------------------------------------------------------
// 6. One server under two names
// ---------------------------------------------------------------------------------------

/// `cmdstat_<name>:calls` of `INFO commandstats` on master `i` (0 before the first call).
fn command_calls(m: &LocalMasters, i: usize, name: &str) -> u64 {
    let info = m[i].cmd(&[b"INFO", b"commandstats"]).unwrap();
    let text = info.as_str().expect("INFO text").to_string();
    let prefix = format!("cmdstat_{name}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap_or("0").parse().unwrap()
        })
}

/// (6) `localhost:P` and `127.0.0.1:P` are one server. Its vote counts once: `try_lock` on a
/// free resource is granted (by it and the third master), once the client knows the
/// second name is the same server it sends it no grant (one `SET` per attempt reaches the
/// server, not two), and the client says so (stats, reports).
///
/// On the old code the second name's connection still sent its `SET`; when it ran first,
/// the first name found the key taken (by ourselves) and the second name's yes was refused:
/// "held by another client".
#[test]
fn one_server_under_two_names_grants_a_free_lock_and_is_sent_one_set() {
    const N: u64 = 8;
    let m = masters(2);
    let (p, q) = (m[0].port(), m[1].port());
    let mut problems = Vec::new();
    let try_locks = |c: &mut Redlock, prefix: &str| {
        let mut failures = Vec::new();
        for k in 0..N {
            match c.try_lock(format!("{prefix}-{k}"), Duration::from_secs(10)) {
                Ok(lock) => c.release(lock).unwrap(),
                Err(e) => failures.push(e.to_string()),
            }
        }
        failures
    };
    let client = |urls: [String; 3]| {
        Redlock::builder()
            .masters(urls)
            .node_timeout(Duration::from_secs(2))
            .retry_count(0)
            .build()
            .unwrap()
    };

    // The list: a host name and its address.
    let mut c = client([
        format!("localhost:{p}"),
        format!("127.0.0.1:{p}"),
        format!("127.0.0.1:{q}"),
    ]);
    // Until both names have answered (their handshakes told the client who they are):
    // the first attempts may go out before.
    let answered = |c: &Redlock| c.stats().iter().all(|s| s.ok() + s.refused() > 0);
    wait_until("both names' answers", Duration::from_secs(10), || {
        if let Ok(lock) = c.try_lock("dup-warm", Duration::from_secs(10)) {
            c.release(lock).unwrap();
        }
        answered(&c)
    });
    let sets_before = command_calls(&m, 0, "set");
    let failures = try_locks(&mut c, "dup");
    let sets = command_calls(&m, 0, "set") - sets_before;
    if !failures.is_empty() {
        problems.push(format!(
            "{} of {N} try_lock on free resources failed: {failures:?}",
            failures.len()
        ));
    }
    if sets > N {
        problems.push(format!(
            "{sets} SETs reached the server for {N} attempts: the second name was sent grants"
        ));
    }
    let stats = c.stats();
    if stats[1].same_server_as() != Some(0) || !stats[1].to_string().contains("same server") {
        problems.push(format!("the stats do not say so: {}", stats[1]));
    }

    // The first name answers later than the second (as a host name resolved first, or a
    // longer path, does): the second name's `SET` runs first every time.
    let slow = Proxy::start(m[0].addr()).unwrap();
    slow.set_mode(Mode::Latency(Duration::from_millis(20)));
    let mut c = client([slow.url(), m[0].url(), m[1].url()]);
    // Until the first name has answered (its handshake told the client who it is).
    wait_until("the first name's answers", Duration::from_secs(10), || {
        if let Ok(lock) = c.try_lock("dup-warm", Duration::from_secs(10)) {
            c.release(lock).unwrap();
        }
        answered(&c)
    });
    let failures = try_locks(&mut c, "dup-slow");
    if !failures.is_empty() {
        problems.push(format!(
            "with the first name slower, {} of {N} try_lock on free resources failed: \
             {failures:?}",
            failures.len()
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------
// 7. A different server behind the same address
// ---------------------------------------------------------------------------------------

/// `uptime_in_seconds` of a master (from `INFO server`).
fn uptime(m: &support::LocalMaster) -> u64 {
    let info = m.cmd(&[b"INFO", b"server"]).unwrap();
    let text = info.as_str().expect("INFO text").to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .expect("uptime_in_seconds")
        .trim()
        .parse()
        .unwrap()
}

/// (7) Another server takes over a master's address (a promoted replica behind a VIP or a
/// DNS name that flips): it never saw the keys the old one held, yet it has been up for
/// long. A client that saw the old server's `run_id` there must treat the change as a
/// restart whatever the uptime: the amnesia guard holds the new server's votes back for
/// `max_ttl` from the moment the change was seen, across reconnects.
///
/// X holds `k` on A (behind the proxy) and on `m[0]` (its request to `m[1]` was lost). The
/// proxy then sends new connections to B, up as long as the others. Y (amnesia guard) had
/// seen A there. On the old code Y was granted `k` by B and `m[1]` while X's lock was still
/// valid: two holders.
#[test]
fn a_server_swapped_behind_an_address_is_held_back_by_the_amnesia_guard() {
    use redlock_mux::{Fault, Outcome};
    let guard = Duration::from_secs(5);
    let m = masters(2);
    let a = support::master();
    let b = support::master();
    // Every server up for longer than the guard: only the swap can hold one back.
    let up_for = guard.as_secs() + 2;
    wait_until(
        "every server up for the guard",
        Duration::from_secs(30),
        || m.iter().chain([&a, &b]).all(|s| uptime(s) >= up_for),
    );
    let p = Proxy::start(a.addr()).unwrap();
    let lost = Proxy::start(m[1].addr()).unwrap();
    let client = |urls: [String; 3]| {
        Redlock::builder()
            .masters(urls)
            .node_timeout(Duration::from_secs(1))
            .retry_count(0)
            .amnesia_guard(guard)
    };
    let mut y = client([p.url(), m[0].url(), m[1].url()]).build().unwrap();
    // Y meets A behind the proxy: until A's answers (after its handshake's) were read. (A
    // round is decided at a quorum: its last answers are read by the next calls.)
    wait_until("A's answers to Y", Duration::from_secs(10), || {
        if let Ok(warm) = y.try_lock("swap-warm", guard) {
            y.release(warm).unwrap();
        }
        let s = &y.stats()[0];
        s.ok() + s.refused() > 0
    });

    // X's lock: granted by A and m[0]; its request to m[1] is lost.
    lost.set_mode(Mode::Blackhole);
    let mut x = client([p.url(), m[0].url(), lost.url()]).build().unwrap();
    let held: Vec<_> = (0..2)
        .map(|r| x.try_lock(format!("swap-k{r}"), guard).unwrap())
        .collect();
    assert!(support::get(&m, 1, "swap-k0").is_none());

    // B takes over the address: new connections go there, the old ones are cut.
    p.set_upstream(b.addr());
    p.reset_all();
    let swapped = Instant::now();
    let mut problems = Vec::new();
    for (round, x_lock) in held.iter().enumerate() {
        // A round whose answer from the proxied master was lost to the cut (the client
        // had not seen the reset yet) or to a slow machine says nothing: again, once the
        // client's reconnect backoff (25 ms, doubling) has passed, while the guard lasts.
        for attempt in 0.. {
            if attempt > 0 {
                thread::sleep(Duration::from_millis(100));
            }
            let r = y.try_lock(format!("swap-k{round}"), guard);
            let x_valid = x_lock.valid_until() > Instant::now();
            let e = match r {
                Ok(lock) => {
                    problems.push(format!(
                        "round {round}: granted to a second client (X's lock still valid: \
                         {x_valid})"
                    ));
                    y.release(lock).unwrap();
                    break;
                }
                Err(e) => e,
            };
            let report = e.report().expect("a report");
            let (name, outcome) = report.outcomes().next().unwrap();
            let silent = matches!(
                outcome,
                Outcome::Pending
                    | Outcome::TimedOut
                    | Outcome::Failed(Fault::Closed(_) | Fault::Connect(_) | Fault::Down)
            );
            if silent && swapped.elapsed() < guard - Duration::from_secs(2) {
                continue;
            }
            if outcome != Outcome::Failed(Fault::Amnesiac) {
                problems.push(format!(
                    "round {round}: the swapped-in server {name} voted: {outcome} ({e})"
                ));
            }
            break;
        }
        // The guard holds across reconnects to the same new server.
        p.reset_all();
    }
    drop(x);
    assert!(
        problems.is_empty(),
        "{problems:#?}\n{} (the proxy accepted {} connections)",
        y.stats()[0],
        p.accepted()
    );
}

// ---------------------------------------------------------------------------------------
// 8. Releases owed to a master that fell behind
// ---------------------------------------------------------------------------------------

/// Keys matching `pattern` on master `i` (`KEYS`, through the admin connection).
fn keys(m: &LocalMasters, i: usize, pattern: &str) -> usize {
    match m[i].cmd(&[b"KEYS", pattern.as_bytes()]).unwrap() {
        AdminReply::Array(a) => a.len(),
        other => panic!("KEYS: {other:?}"),
    }
}

/// (8) A release a quorum confirmed while one master was cut off (the proxy discarded it
/// and reset the connection) must take effect there once the master is reachable again,
/// within the lock's TTL: it is sent again on the next connection. A client opens it with
/// its next calls, or when it shuts down (the shared client's loop delivers what is owed
/// before it ends, within its bound). On the old code the release was dropped with the
/// connection and the key stayed for its whole TTL, voting "taken" against everyone.
#[test]
fn a_release_owed_to_a_master_that_was_cut_off_takes_effect_when_it_is_back() {
    let ttl = Duration::from_secs(30);
    let m = masters(3);
    let p = Proxy::start(m[2].addr()).unwrap();
    let urls = [m[0].url(), m[1].url(), p.url()];
    let mut problems = Vec::new();
    let on_2 = |key: &str| support::get(&m, 2, key).is_some();
    let cut_off_during = |release: &mut dyn FnMut()| {
        p.set_mode(Mode::Blackhole);
        let dropped = p.dropped_bytes();
        release();
        wait_until(
            "the release to reach the proxy",
            Duration::from_secs(10),
            || p.dropped_bytes() > dropped,
        );
        p.set_mode(Mode::PassThrough);
        // The connection that lost the release breaks.
        p.reset_all();
    };
    let shared = || {
        Redlock::builder()
            .masters(urls.clone())
            .node_timeout(Duration::from_secs(1))
            .retry_count(0)
            .build_shared()
            .unwrap()
    };
    let take = |c: &redlock_mux::SharedRedlock, key: &str| {
        let g = c.try_lock(key, ttl).wait().unwrap();
        wait_until("the key on master 2", Duration::from_secs(10), || on_2(key));
        Some(g)
    };

    // The shared client, shut down right after.
    let c = shared();
    let mut g = take(&c, "owed-shutdown");
    cut_off_during(&mut || g.take().unwrap().release().wait().unwrap());
    drop(c);
    if !poll_until(Duration::from_secs(10), || !on_2("owed-shutdown")) {
        problems.push("shared client, shut down: the released key is still on master 2");
    }

    // The shared client, with its next calls.
    let c = shared();
    let mut g = take(&c, "owed-shared");
    cut_off_during(&mut || g.take().unwrap().release().wait().unwrap());
    let gone = poll_until(Duration::from_secs(10), || {
        if let Ok(g) = c.try_lock("owed-next", ttl).wait() {
            g.release().wait().unwrap();
        }
        !on_2("owed-shared")
    });
    if !gone {
        problems.push("shared client: the released key is still on master 2 after its next calls");
    }

    // The single-owner client, with its next calls (it runs its loop only inside them).
    let mut c = Redlock::builder()
        .masters(urls.clone())
        .node_timeout(Duration::from_secs(1))
        .retry_count(0)
        .build()
        .unwrap();
    let lock = c.try_lock("owed-single", ttl).unwrap();
    while !on_2("owed-single") {
        // Its SET there is answered within the next call.
        let l = c.try_lock("owed-sync", ttl).unwrap();
        c.release(l).unwrap();
    }
    let mut lock = Some(lock);
    cut_off_during(&mut || c.release(lock.take().unwrap()).unwrap());
    let gone = poll_until(Duration::from_secs(10), || {
        if let Ok(l) = c.try_lock("owed-next", ttl) {
            c.release(l).unwrap();
        }
        !on_2("owed-single")
    });
    if !gone {
        problems.push("single owner: the released key is still on master 2 after its next calls");
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// (8) The run: 64 threads share one client (`retry_count(0)`), each taking and
/// releasing its own resource in a loop; master 4 is paused (SIGSTOP) near the end and
/// resumed before the threads stop; then the handle is dropped. Every release a quorum
/// confirmed must take effect on master 4 too, and the client that released everything
/// and shut down must leave no key. On the old code the loop stopped as soon as no round
/// was undecided, with master 4 still catching up: the releases still queued for it were
/// lost with the connection, and their keys stayed until their TTL.
///
/// It also counts the calls that failed and why (issue 19 asks to explain them).
#[test]
fn a_client_that_released_everything_and_shut_down_leaves_no_key() {
    const THREADS: usize = 64;
    let run = Duration::from_secs(2);
    let ttl = Duration::from_secs(30);
    let mut m = masters(5);
    let c = Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .build_shared()
        .unwrap();
    let start = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let c = c.clone();
            thread::spawn(move || {
                let (mut calls, mut failed) = (0u64, Vec::new());
                let key = format!("owed-r{t}");
                while start.elapsed() < run {
                    calls += 1;
                    match c.try_lock(&key, ttl).wait() {
                        Ok(g) => {
                            calls += 1;
                            if let Err(e) = g.release().wait() {
                                failed.push(format!("release: {e}"));
                            }
                        }
                        Err(e) => failed.push(format!("try_lock: {e}")),
                    }
                }
                (calls, failed)
            })
        })
        .collect();
    // Master 4 falls behind near the end of the run, and comes back before it ends.
    thread::sleep(run * 3 / 4);
    m[4].freeze().unwrap();
    thread::sleep(run / 5);
    m[4].thaw().unwrap();
    let (mut calls, mut failed) = (0u64, Vec::new());
    for w in workers {
        let (n, f) = w.join().unwrap();
        calls += n;
        failed.extend(f);
    }
    let stats = c.stats().wait().unwrap();
    let behind = &stats[4];
    drop(c);
    // The loop drains for at most 2 s after the last handle is gone; the keys' TTL is 30 s.
    let left = |m: &LocalMasters| (0..5).map(|i| keys(m, i, "owed-r*")).collect::<Vec<_>>();
    let clean = poll_until(Duration::from_secs(6), || left(&m).iter().all(|n| *n == 0));
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for f in &failed {
        let kind = f.split(" (").next().unwrap_or(f).to_string();
        *kinds.entry(kind).or_default() += 1;
    }
    eprintln!(
        "{calls} calls, {} failed: {kinds:#?} (e.g. {:?}); keys left per master: {:?}; \
         master 4: {behind}, last fault {:?}",
        failed.len(),
        failed.first(),
        left(&m),
        behind.last_fault()
    );
    for s in &stats[..4] {
        eprintln!("{s}, last fault {:?}", s.last_fault());
    }
    assert!(
        clean,
        "keys left per master after the client released everything and shut down: {:?} \
         ({calls} calls, {} failed: {kinds:?}; an example: {:?})",
        left(&m),
        failed.len(),
        failed.first()
    );
}
