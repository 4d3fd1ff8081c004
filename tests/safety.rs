//! The safety promises, one test per counterexample a review found (issue 12), each against
//! real `redis-server` masters: fencing tokens that never go backwards, failed extends that
//! never leave two holders, cleanup that never leaves a key behind, a lost-lock signal that
//! reads the clock, TTLs as sent, one server never counted twice, counters in their own
//! namespace, extensions that survive masters restarting.
//!
//! Every wait is a bounded poll; faults are placed with SIGSTOP, restarts and the fault
//! proxy, never with sleeps that happen to be long enough.

mod support;

use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{
    get, masters, masters_with, poll_until, settle, wait_until, AdminReply, LocalMasters,
};

use redlock_mux::{Error, HoldOptions, Redlock};

/// `redis-server` arguments for masters that persist every write (what fencing needs).
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn builder(urls: Vec<String>) -> redlock_mux::Builder {
    Redlock::builder()
        .masters(urls)
        .node_timeout(Duration::from_millis(150))
        .retry_count(0)
}

fn set(m: &LocalMasters, i: usize, key: &str, value: &str) {
    let r = m[i]
        .cmd(&[b"SET", key.as_bytes(), value.as_bytes()])
        .unwrap();
    assert!(r.is_ok(), "SET {key} on master {i}: {r:?}");
}

// ---------------------------------------------------------------------------------------
// 1. Fencing tokens never go backwards
// ---------------------------------------------------------------------------------------

/// (1a) B's acquire reaches master 3 first and master 1 late; meanwhile A takes the lock
/// on masters 1 and 2 (master 2's counter is ahead) and A's second write to master 1 is
/// lost. With the counter drawn inside the acquire, B was granted after A with a smaller
/// token (2 after 11). Drawn once the lock is held, no grant can follow with a smaller one.
#[test]
fn fencing_tokens_never_go_backwards_when_an_acquire_races_a_lost_write() {
    let m = masters_with(3, DURABLE);
    // Master 2's counter is ahead (under both the old and the new counter names).
    for key in ["r:fence", "redlock-mux:fence:r"] {
        set(&m, 1, key, "10");
    }
    // B: master 1 through a proxy that holds B's bytes, master 2 unreachable (a proxy that
    // discards everything), master 3 direct.
    let b_m1 = Proxy::start(m[0].addr()).unwrap();
    let b_m2 = Proxy::start(m[1].addr()).unwrap();
    let b_urls = vec![b_m1.url(), b_m2.url(), m[2].url()];
    let mut b = Redlock::builder()
        .masters(b_urls)
        .node_timeout(Duration::from_secs(3))
        .fencing(true)
        .retry_count(0)
        .build()
        .unwrap();
    // A: master 1 through a proxy that loses A's second write on its connection, with the
    // connection (reset as it is sent).
    let a_m1 = Proxy::start(m[0].addr()).unwrap();
    let a_urls = vec![a_m1.url(), m[1].url(), m[2].url()];
    let mut a = builder(a_urls).fencing(true).build().unwrap();

    b_m1.set_mode(Mode::Hold);
    b_m2.set_mode(Mode::Blackhole);
    let b_thread = std::thread::spawn(move || {
        let r = b.try_lock("r", Duration::from_secs(10));
        (b, r)
    });
    // B's SET is on master 3 (and waiting in the proxy for master 1).
    wait_until("B's key on master 3", Duration::from_secs(5), || {
        get(&m, 2, "r").is_some()
    });
    a_m1.set_mode(Mode::ResetOnUpChunk(2));
    let mut granted: Vec<(&str, u64)> = Vec::new();
    let r = a.try_lock("r", Duration::from_secs(10));
    a_m1.set_mode(Mode::PassThrough);
    // The reset is done (the proxy closes both sides within a few ms).
    wait_until(
        "the reset of A's connection",
        Duration::from_secs(5),
        || a_m1.connections() < a_m1.accepted(),
    );
    // A's next operation reads the reset, reconnects, and sends anything still queued for
    // master 1 (a failed attempt's cleanup release, say).
    let sync = a.try_lock("sync", Duration::from_secs(5)).unwrap();
    a.release(sync).unwrap();
    match r {
        Ok(lock) => {
            granted.push(("A", lock.fencing_token().expect("fencing on")));
            a.release(lock).unwrap();
        }
        Err(e) => eprintln!("A was not granted: {e}"),
    }
    wait_until(
        "A's key on master 1 released",
        Duration::from_secs(5),
        || get(&m, 0, "r").is_none(),
    );
    // B's delayed SET reaches master 1 now.
    b_m1.set_mode(Mode::PassThrough);
    let (mut b, r) = b_thread.join().unwrap();
    if let Ok(lock) = r {
        granted.push(("B", lock.fencing_token().expect("fencing on")));
        b.release(lock).unwrap();
    }
    assert!(!granted.is_empty(), "someone must have been granted");
    for w in granted.windows(2) {
        assert!(
            w[1].1 > w[0].1,
            "fencing token went backwards in grant order: {granted:?}"
        );
    }
}

/// (1b) Fencing counters have no TTL: a master that restarts without persistence loses
/// them for good, and no wait restores them. Fencing therefore refuses the votes of
/// masters that do not persist every write.
#[test]
fn fencing_refuses_masters_that_do_not_persist_every_write() {
    let m = masters(3);
    let mut c = builder(m.urls()).fencing(true).build().unwrap();
    match c.try_lock("nd", Duration::from_secs(5)) {
        Ok(lock) => panic!(
            "granted a fencing token {:?} on masters that lose counters in a restart",
            lock.fencing_token()
        ),
        Err(Error::NoQuorum(report)) => {
            let text = report.to_string();
            assert!(text.contains("not durable"), "{text}");
        }
        Err(e) => panic!("expected NoQuorum naming the durability check, got {e}"),
    }
    // The refusal was decided at a quorum; the cleanup releases go out behind it.
    settle(&mut c, 3);
    for i in 0..3 {
        assert_eq!(get(&m, i, "nd"), None, "the refused attempt is cleaned up");
    }
}

/// (1b) With durable masters, restarting a majority (each keeping its data) and freezing
/// the rest never makes a token go backwards.
#[test]
fn fencing_tokens_survive_restarts_of_durable_masters() {
    let mut m = masters_with(5, DURABLE);
    let mut c = builder(m.urls()).fencing(true).build().unwrap();
    let mut last = 0;
    for _ in 0..5 {
        let lock = c.try_lock("dur", Duration::from_secs(5)).unwrap();
        last = lock.fencing_token().unwrap();
        c.release(lock).unwrap();
    }
    for i in 0..3 {
        m[i].restart().unwrap();
    }
    m[3].freeze().unwrap();
    m[4].freeze().unwrap();
    let lock = c.try_lock("dur", Duration::from_secs(5)).unwrap();
    let token = lock.fencing_token().unwrap();
    c.release(lock).unwrap();
    m[3].thaw().unwrap();
    m[4].thaw().unwrap();
    assert!(token > last, "token {token} after {last} across restarts");
}

/// (1c) A multi-resource lock's token covers each of its resources: successive holders of
/// `b` through `lock_many([a, b])`, `try_lock(b)` and `lock_many([b, a])` see increasing
/// tokens (with one counter, the first resource's, they went 1, 2, 3, 4, 5, then 1).
#[test]
fn fencing_tokens_of_multi_resource_locks_cover_every_resource() {
    let m = masters_with(3, DURABLE);
    let mut c = builder(m.urls()).fencing(true).build().unwrap();
    let mut tokens = Vec::new();
    for round in 0..3 {
        for how in 0..3 {
            let lock = match how {
                0 => c.lock_many(["a", "b"], Duration::from_secs(5)),
                1 => c.try_lock("b", Duration::from_secs(5)),
                _ => c.lock_many(["b", "a"], Duration::from_secs(5)),
            }
            .unwrap_or_else(|e| panic!("round {round}, way {how}: {e}"));
            tokens.push(lock.fencing_token().unwrap());
            c.release(lock).unwrap();
        }
    }
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens of successive holders of b: {tokens:?}"
    );
}

/// (10) Counters live in their own namespace: locking `x` with fencing does not make a
/// resource named `x:fence` unlockable, and the namespace itself cannot be locked.
#[test]
fn fencing_counters_do_not_share_the_lock_keyspace() {
    let m = masters_with(3, DURABLE);
    let mut c = builder(m.urls()).fencing(true).build().unwrap();
    let lock = c.try_lock("x", Duration::from_secs(5)).unwrap();
    c.release(lock).unwrap();
    let lock = c
        .try_lock("x:fence", Duration::from_secs(5))
        .expect("x:fence is an ordinary resource");
    c.release(lock).unwrap();
    assert!(matches!(
        c.try_lock("redlock-mux:fence:x", Duration::from_secs(5)),
        Err(Error::InvalidArgument(_))
    ));
}

// ---------------------------------------------------------------------------------------
// 2. A failed extend never leaves two holders
// ---------------------------------------------------------------------------------------

/// A 3 s lock; two of three masters frozen during `extend(300 ms)`, which fails; they
/// thaw and run the late extend. It must not cut the keys short: while the first holder's
/// lock still reports valid, nobody else may get it.
#[test]
fn a_failed_shorter_extend_never_lets_another_client_in_while_the_lock_is_valid() {
    let mut m = masters(3);
    let mut a = builder(m.urls()).build().unwrap();
    let mut other = builder(m.urls()).build().unwrap();
    let mut lock = a.try_lock("ext", Duration::from_secs(3)).unwrap();
    m[1].freeze().unwrap();
    m[2].freeze().unwrap();
    let r = a.extend(&mut lock, Duration::from_millis(300));
    assert!(matches!(r, Err(Error::NoQuorum(_))), "{r:?}");
    m[1].thaw().unwrap();
    m[2].thaw().unwrap();
    let until = lock.valid_until();
    let start = Instant::now();
    let mut tries = 0;
    // Past the 300 ms the late extend asked for, well within the lock's validity.
    while start.elapsed() < Duration::from_millis(900) && Instant::now() < until {
        tries += 1;
        if let Ok(second) = other.try_lock("ext", Duration::from_secs(1)) {
            let left = until.saturating_duration_since(Instant::now());
            panic!(
                "a second holder ({second:?}) while the first lock reports {left:?} of validity"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(tries > 10);
    assert!(lock.is_valid());
    a.release(lock).unwrap();
}

/// An extend that asks for less than the keys have left succeeds without shortening
/// them, and the lock keeps the later deadline.
#[test]
fn an_extend_never_shortens_a_lock() {
    let m = masters(3);
    let mut a = builder(m.urls()).build().unwrap();
    let mut lock = a.try_lock("short", Duration::from_secs(10)).unwrap();
    let before = lock.valid_until();
    a.extend(&mut lock, Duration::from_millis(100)).unwrap();
    assert_eq!(
        lock.valid_until(),
        before,
        "the earlier, later deadline stands"
    );
    // The lock and the extend returned at a quorum: the last master's SET may be late.
    settle(&mut a, 3);
    for i in 0..3 {
        let AdminReply::Int(pttl) = m[i].cmd(&[b"PTTL", b"short"]).unwrap() else {
            panic!("PTTL");
        };
        assert!(
            pttl > 9000,
            "master {i}: PTTL {pttl} ms after a shorter extend"
        );
    }
    a.release(lock).unwrap();
}

// ---------------------------------------------------------------------------------------
// 4, 5. No key outlives a failed attempt's cleanup
// ---------------------------------------------------------------------------------------

/// (4) A multi-key acquire answered `-NOSCRIPT` late, after the attempt had failed and its
/// cleanup release had gone out. Retrying it with `EVAL` then would take the keys again,
/// behind the release, for the whole TTL, for nobody.
#[test]
fn a_late_noscript_never_retakes_a_failed_attempts_keys() {
    let m = masters(1);
    let proxy = Proxy::start(m[0].addr()).unwrap();
    let mut c = Redlock::builder()
        .masters([proxy.url()])
        .node_timeout(Duration::from_millis(50))
        .retry_count(0)
        .build()
        .unwrap();
    // Connected, scripts loaded.
    let warm = c.try_lock("warm", Duration::from_secs(5)).unwrap();
    c.release(warm).unwrap();
    // The script cache is flushed, then only the release script is cached again (as when
    // another client's release fell back to EVAL).
    assert!(m[0].cmd(&[b"SCRIPT", b"FLUSH"]).unwrap().is_ok());
    let release_src = redlock_mux::scripts::RELEASE.src.as_bytes();
    m[0].cmd(&[b"EVAL", release_src, b"1", b"nokey", b"x"])
        .unwrap();
    // The attempt's request is held until its round timed out and the cleanup release
    // queued up behind it.
    proxy.set_mode(Mode::Hold);
    let r = c.lock_many(["a", "b"], Duration::from_secs(30));
    assert!(r.is_err(), "{r:?}");
    proxy.set_mode(Mode::PassThrough);
    // The next operations read the late replies; the release is answered after anything
    // the client sent before it on this connection.
    let u = c.try_lock("u", Duration::from_secs(5)).unwrap();
    c.release(u).unwrap();
    assert_eq!(get(&m, 0, "a"), None, "the failed attempt's key came back");
    assert_eq!(get(&m, 0, "b"), None, "the failed attempt's key came back");
}

/// (4, cancelled) The same late `-NOSCRIPT`, for an attempt the caller cancelled while its
/// round was undecided: the cleanup release went out, and an `EVAL` retry behind it would
/// take the keys again for nobody.
#[test]
fn a_late_noscript_never_retakes_a_cancelled_attempts_keys() {
    let m = masters(1);
    let proxy = Proxy::start(m[0].addr()).unwrap();
    let mut c = Redlock::builder()
        .masters([proxy.url()])
        .node_timeout(Duration::from_secs(5))
        .retry_count(0)
        .build()
        .unwrap();
    let warm = c.try_lock("warm", Duration::from_secs(5)).unwrap();
    c.release(warm).unwrap();
    assert!(m[0].cmd(&[b"SCRIPT", b"FLUSH"]).unwrap().is_ok());
    let release_src = redlock_mux::scripts::RELEASE.src.as_bytes();
    m[0].cmd(&[b"EVAL", release_src, b"1", b"nokey", b"x"])
        .unwrap();
    proxy.set_mode(Mode::Hold);
    let cancel = c.cancel_handle();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        cancel.cancel();
    });
    let r = c.lock_many(["a", "b"], Duration::from_secs(30));
    canceller.join().unwrap();
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    proxy.set_mode(Mode::PassThrough);
    let u = c.try_lock("u", Duration::from_secs(5)).unwrap();
    c.release(u).unwrap();
    assert_eq!(
        get(&m, 0, "a"),
        None,
        "the cancelled attempt's key came back"
    );
    assert_eq!(
        get(&m, 0, "b"),
        None,
        "the cancelled attempt's key came back"
    );
}

/// (5) A password sent to a master without one, or a database number it does not have:
/// the master refuses AUTH or SELECT, and a request pipelined behind them would still
/// run, as the default user or in database 0, and be reported as not done.
#[test]
fn a_refused_auth_or_select_never_leaves_a_key_behind() {
    let m = masters(1);
    let port = m[0].port();
    for url in [
        format!("redis://:secret@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}/99"),
    ] {
        let mut c = builder(vec![url.clone()]).build().unwrap();
        let r = c.try_lock("orphan", Duration::from_secs(30));
        assert!(r.is_err(), "{url}: {r:?}");
        // Anything pipelined behind the refused command ran before its refusal came back.
        assert_eq!(get(&m, 0, "orphan"), None, "{url}: a key was left behind");
    }
}

// ---------------------------------------------------------------------------------------
// 6. The lost-lock signal reads the clock
// ---------------------------------------------------------------------------------------

/// With no extension left, the signal fires a margin before the lock's validity ends,
/// not at the end (and not only when the keeper thread wakes).
#[test]
fn the_lost_signal_fires_a_margin_before_validity_ends() {
    let m = masters(3);
    let mut c = builder(m.urls()).build().unwrap();
    let ttl = Duration::from_millis(600);
    let lock = c.try_lock("sig", ttl).unwrap();
    let until = lock.valid_until();
    let opts = HoldOptions {
        max_extensions: Some(0),
        ..HoldOptions::default()
    };
    let held = c.hold(lock, ttl, opts, |signal| {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if signal.is_lost() {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    });
    let fired = held.value.expect("the signal never fired");
    // Default margin: a tenth of the TTL.
    let margin = ttl / 10;
    assert!(
        fired + margin <= until + Duration::from_millis(5),
        "fired {:?} before the end of validity, wanted at least {margin:?}",
        until.saturating_duration_since(fired)
    );
    assert!(!held.held_throughout);
}

// ---------------------------------------------------------------------------------------
// 7. Validity from the TTL as sent
// ---------------------------------------------------------------------------------------

/// `PX` takes whole milliseconds: the lock's TTL and validity come from what was sent.
#[test]
fn validity_is_computed_from_the_whole_milliseconds_sent() {
    let m = masters(1);
    let mut c = builder(m.urls()).build().unwrap();
    let ttl = Duration::from_micros(1_000_900);
    let lock = c.try_lock("ms", ttl).unwrap();
    assert_eq!(lock.ttl(), Duration::from_millis(1000));
    let sent = Duration::from_millis(1000);
    let drift = redlock_mux::rules::drift(sent, 0.01);
    assert!(
        lock.valid_until() <= lock.acquired_at() + sent - drift,
        "validity counts the truncated microseconds"
    );
    c.release(lock).unwrap();
}

// ---------------------------------------------------------------------------------------
// 9. One server listed twice
// ---------------------------------------------------------------------------------------

/// One server reached through two addresses must not vote twice: with the other master
/// frozen, an extend has one real server behind it and must fail.
#[test]
fn one_server_through_two_addresses_votes_once() {
    let mut m = masters(2);
    let alias = Proxy::start(m[0].addr()).unwrap();
    let urls = vec![m[0].url(), alias.url(), m[1].url()];
    let mut c = builder(urls).build().unwrap();
    let mut lock = c.try_lock("twice", Duration::from_secs(10)).unwrap();
    m[1].freeze().unwrap();
    let r = c.extend(&mut lock, Duration::from_secs(10));
    m[1].thaw().unwrap();
    match r {
        Err(Error::NoQuorum(report)) => {
            let text = report.to_string();
            assert!(text.contains("same server"), "{text}");
        }
        other => panic!("an extend counted one server twice: {other:?}"),
    }
    c.release(lock).unwrap();
}

// ---------------------------------------------------------------------------------------
// 11. Extensions after masters restart
// ---------------------------------------------------------------------------------------

/// Every master restarts (keeping its data) while a held lock waits for its next
/// extension: the extension goes out on fresh connections and the lock holds throughout.
#[test]
fn hold_keeps_the_lock_when_every_master_restarts_between_extensions() {
    let mut m = masters_with(3, DURABLE);
    let mut c = builder(m.urls()).build().unwrap();
    // The TTL must leave the extensions room for the restarts (one master down at a time,
    // the one before it reconnecting): scaled to how long a restart takes on this machine
    // now (on a loaded one, a durable restart took long enough to expire a 1.5 s lock in
    // a stress run), measured by restarting each master once before the lock.
    let mut slowest = Duration::ZERO;
    for i in 0..3 {
        let t = Instant::now();
        m[i].restart().unwrap();
        slowest = slowest.max(t.elapsed());
    }
    let ttl = Duration::from_millis(1500).max(slowest * 12);
    let held = c
        .run_locked("restarts", ttl, |signal| {
            for i in 0..3 {
                m[i].restart().unwrap();
            }
            // Two extension intervals after the restarts.
            let t = Instant::now();
            while t.elapsed() < ttl * 2 {
                if signal.wait_lost(Duration::from_millis(50)) {
                    return false;
                }
            }
            true
        })
        .unwrap();
    assert!(
        held.value && held.held_throughout,
        "lost after the restarts: {:?}",
        held.lost
    );
    assert!(held.extensions >= 2, "extensions: {}", held.extensions);
    assert!(poll_until(Duration::from_secs(2), || get(
        &m, 0, "restarts"
    )
    .is_none()));
}
