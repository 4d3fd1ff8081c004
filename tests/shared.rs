//! The shared client against real masters: one loop serving many threads and async tasks,
//! guards that release on drop, cancellation by dropping a future (no lock granted to
//! nobody), extension and auto-extension from the loop's timers, the lost-lock signal in
//! its three forms.
//!
//! Every wait is bounded; faults come from SIGSTOP and the fault proxy.

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{get, masters, patient_shared, settle_shared, wait_until, LocalMasters};

use redlock_mux::{Error, HoldOptions, Redlock, SharedRedlock};

fn shared(m: &LocalMasters) -> SharedRedlock {
    Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_millis(150))
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(5))
        .retry_count(1000)
        .build_shared()
        .unwrap()
}

fn gone(m: &LocalMasters, key: &str) -> bool {
    (0..m.len()).all(|i| get(m, i, key).is_none())
}

/// Threads share one handle; every hold of the one resource is alone (a counter that
/// would show an overlap), and the keys are gone at the end.
#[test]
fn threads_share_one_client_and_never_overlap() {
    let m = masters(3);
    let c = shared(&m);
    let inside = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (c, inside, grants) = (c.clone(), inside.clone(), grants.clone());
            thread::spawn(move || {
                for _ in 0..20 {
                    let g = c.lock("hot", Duration::from_secs(5)).wait().unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    grants.fetch_add(1, Ordering::SeqCst);
                    assert!(g.is_valid() && !g.is_lost());
                    inside.store(false, Ordering::SeqCst);
                    g.release().wait().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(grants.load(Ordering::SeqCst), 160);
    // The last release returned at a quorum: settle before looking at every master.
    settle_shared(&c, 3);
    assert!(gone(&m, "hot"));
}

/// 64 threads, each locking and releasing a resource of its own through one handle: the
/// loop wakes the first parked callers of a turn and they wake the rest (each woken caller
/// passes wake-ups on before it returns). Every cycle succeeds, nobody is left parked
/// (the test would hang), and no key is left on any master.
#[test]
fn sixty_four_threads_pass_their_wake_ups_on() {
    let m = masters(3);
    let c = shared(&m);
    let cycles = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..64)
        .map(|t| {
            let (c, cycles) = (c.clone(), cycles.clone());
            thread::spawn(move || {
                let key = format!("many-{t}");
                for _ in 0..50 {
                    let g = c.try_lock(&key, Duration::from_secs(5)).wait().unwrap();
                    g.release().wait().unwrap();
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(cycles.load(Ordering::Relaxed), 64 * 50);
    settle_shared(&c, 3);
    for t in 0..64 {
        assert!(gone(&m, &format!("many-{t}")), "many-{t} left behind");
    }
}

/// 64 tokio tasks on a current-thread runtime lock and release resources of their own
/// through one handle: nothing blocks the runtime, and all finish.
#[test]
fn async_tasks_share_one_client_on_a_current_thread_runtime() {
    let m = masters(3);
    let c = shared(&m);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let total = rt.block_on(async {
        let mut tasks = Vec::new();
        for k in 0..64 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("task:{k}");
                let mut n = 0;
                for _ in 0..10 {
                    let g = c.try_lock(&key, Duration::from_secs(5)).await.unwrap();
                    assert_eq!(g.resource(), key.as_bytes());
                    g.release().await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        total
    });
    assert_eq!(total, 640);
    settle_shared(&c, 3);
    for k in [0, 31, 63] {
        assert!(gone(&m, &format!("task:{k}")));
    }
}

/// A dropped guard releases its lock (queued to the loop; the drop does not block).
#[test]
fn dropping_a_guard_releases_the_lock() {
    let m = masters(3);
    let c = shared(&m);
    let g = c
        .try_lock("dropped", Duration::from_secs(30))
        .wait()
        .unwrap();
    assert!(!gone(&m, "dropped"));
    let t = Instant::now();
    drop(g);
    assert!(t.elapsed() < Duration::from_millis(50), "drop blocked");
    wait_until(
        "the dropped guard's release",
        Duration::from_secs(5),
        || gone(&m, "dropped"),
    );
    // Locks dropped inside a collection too.
    let v: Vec<_> = (0..5)
        .map(|i| {
            c.try_lock(format!("v{i}"), Duration::from_secs(30))
                .wait()
                .unwrap()
        })
        .collect();
    drop(v);
    wait_until("every release", Duration::from_secs(5), || {
        (0..5).all(|i| gone(&m, &format!("v{i}")))
    });
}

/// A future dropped under a timeout while its lock attempt is in flight: when the grant
/// arrives after the drop, the loop releases it. No lock is granted to nobody.
#[test]
fn a_future_dropped_by_a_timeout_never_leaves_a_lock_behind() {
    let m = masters(3);
    let proxies: Vec<Proxy> = (0..3).map(|i| Proxy::start(m[i].addr()).unwrap()).collect();
    let c = patient_shared(proxies.iter().map(|p| p.url()));
    // Connected first, so the slow part is the lock round itself.
    c.try_lock("warm", Duration::from_secs(5)).wait().unwrap();
    let sent: Vec<u64> = proxies.iter().map(|p| p.forwarded_up()).collect();
    for p in &proxies {
        p.set_mode(Mode::Latency(Duration::from_millis(100)));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let r = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(30),
            c.try_lock("late", Duration::from_secs(30)),
        )
        .await
    });
    assert!(r.is_err(), "the timeout fired first: {r:?}");
    // The attempt reaches every master (its SET, and the release the loop sends behind
    // it once the future is gone)...
    wait_until(
        "the requests through the proxies",
        Duration::from_secs(5),
        || {
            proxies
                .iter()
                .zip(&sent)
                .all(|(p, s)| p.forwarded_up() >= s + 2 * 60)
        },
    );
    wait_until(
        "the abandoned lock's release",
        Duration::from_secs(5),
        || gone(&m, "late"),
    );
    // ...and the key stays released: nothing re-takes it.
    thread::sleep(Duration::from_millis(300));
    assert!(gone(&m, "late"));
}

/// A `Pending` dropped after the lock was granted, never looked at: released too. (It
/// starts when another operation runs the loop.)
#[test]
fn a_pending_dropped_after_its_grant_releases_the_lock() {
    let m = masters(3);
    let c = shared(&m);
    let p = c.try_lock("unclaimed", Duration::from_secs(30));
    let other = c.try_lock("other", Duration::from_secs(30)).wait().unwrap();
    wait_until("the grant", Duration::from_secs(5), || {
        !gone(&m, "unclaimed")
    });
    drop(p);
    wait_until("the release", Duration::from_secs(5), || {
        gone(&m, "unclaimed")
    });
    other.release().wait().unwrap();
}

/// `release()` says how it went: `Ok`, or `NotHeld` once the lock expired.
#[test]
fn release_reports_a_lock_that_had_expired() {
    let m = masters(3);
    let c = shared(&m);
    let g = c
        .try_lock("short", Duration::from_millis(50))
        .wait()
        .unwrap();
    wait_until("expiry", Duration::from_secs(2), || gone(&m, "short"));
    assert!(!g.is_valid() && g.is_lost());
    match g.release().wait() {
        Err(Error::NotHeld(_)) => {}
        other => panic!("expected NotHeld, got {other:?}"),
    }
}

/// `extend` moves the guard's deadline; `auto_extend` keeps a lock past several TTLs from
/// the loop's timers, with no thread of ours.
#[test]
fn guards_extend_and_auto_extend() {
    let m = masters(3);
    let c = shared(&m);
    let ttl = Duration::from_millis(400);
    let g = c.try_lock("ext", ttl).wait().unwrap();
    let before = g.valid_until();
    g.extend(Duration::from_secs(2)).wait().unwrap();
    assert!(g.valid_until() > before + Duration::from_millis(1000));
    g.release().wait().unwrap();

    let g = c.try_lock("auto", ttl).wait().unwrap();
    g.auto_extend(HoldOptions::default());
    let other = shared(&m);
    let t = Instant::now();
    while t.elapsed() < ttl * 4 {
        assert!(
            !g.wait_lost(Duration::from_millis(50)),
            "lost while auto-extended"
        );
        assert!(other.try_lock("auto", ttl).wait().is_err());
    }
    assert!(g.is_valid());
    g.release().wait().unwrap();
    settle_shared(&c, 3);
    assert!(gone(&m, "auto"));
}

/// The lost signal, three ways: with a majority frozen, auto-extension fails and the
/// guard reports the loss (`is_lost`), a blocked thread wakes (`wait_lost`) and an async
/// task's `lost()` completes.
#[test]
fn the_lost_signal_fires_for_pollers_blocked_threads_and_futures() {
    let mut m = masters(3);
    let c = shared(&m);
    let ttl = Duration::from_millis(600);
    let g = Arc::new(c.try_lock("fragile", ttl).wait().unwrap());
    g.auto_extend(HoldOptions::default());
    let blocked = {
        let g = g.clone();
        thread::spawn(move || {
            let t = Instant::now();
            (g.wait_lost(Duration::from_secs(10)), t.elapsed())
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    m[0].freeze().unwrap();
    m[1].freeze().unwrap();
    let fired = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .is_ok()
    });
    m[0].thaw().unwrap();
    m[1].thaw().unwrap();
    assert!(fired, "lost() never completed");
    assert!(g.is_lost());
    let (lost, after) = blocked.join().unwrap();
    assert!(
        lost && after < Duration::from_secs(2),
        "{lost} after {after:?}"
    );
    // Lost a margin before the end of validity, not after it.
    assert!(g.is_valid() || g.remaining().is_zero());
}

/// Without auto-extension, `lost()` completes when the validity runs out.
#[test]
fn lost_completes_when_validity_runs_out() {
    let m = masters(1);
    let c = shared(&m);
    let g = c
        .try_lock("runs-out", Duration::from_millis(200))
        .wait()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let t = Instant::now();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), g.lost())
            .await
            .expect("lost() never completed")
    });
    assert!(t.elapsed() < Duration::from_millis(600));
    assert!(!g.is_valid());
}

/// Argument errors come back at once, without touching the loop.
#[test]
fn argument_errors_come_back_at_once() {
    let m = masters(1);
    let c = shared(&m);
    assert!(matches!(
        c.try_lock("", Duration::from_secs(1)).wait(),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        c.try_lock("x", Duration::ZERO).wait(),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        c.lock_many(["a", "a"], Duration::from_secs(1)).wait(),
        Err(Error::InvalidArgument(_))
    ));
}

/// Fencing and multi-resource locks through the shared client.
#[test]
fn fenced_and_multi_resource_locks() {
    let m = support::masters_with(3, &["--appendonly", "yes", "--appendfsync", "always"]);
    // Patient rounds: an fsync per write on a loaded machine outlasts the default 50 ms,
    // and this test is about tokens, not speed.
    let c = Redlock::builder()
        .masters(m.urls())
        .fencing(true)
        .retry_count(0)
        .node_timeout(Duration::from_secs(2))
        .build_shared()
        .unwrap();
    let mut last = 0;
    for _ in 0..5 {
        let g = c
            .lock_many(["fa", "fb"], Duration::from_secs(5))
            .wait()
            .unwrap();
        assert_eq!(g.resources().count(), 2);
        let t = g.fencing_token().unwrap();
        assert!(t > last);
        last = t;
        g.release().wait().unwrap();
    }
}

/// A `Pending` dropped before its request was ever written (never polled, never waited
/// for): once another operation has run the loop, no key is left.
#[test]
fn a_future_dropped_before_it_is_written_leaves_no_key() {
    let m = masters(3);
    let c = shared(&m);
    for i in 0..20 {
        let key = format!("unwritten:{i}");
        drop(c.try_lock(&key, Duration::from_secs(30)));
        // Runs the loop: the abandoned attempt is taken with it, and cancelled.
        c.try_lock(format!("driver:{i}"), Duration::from_secs(30))
            .wait()
            .unwrap()
            .release()
            .wait()
            .unwrap();
        wait_until(
            "the abandoned attempt to settle",
            Duration::from_secs(5),
            || gone(&m, &key),
        );
    }
}

/// Futures dropped at every stage of an attempt: never polled (before it is written),
/// polled once and dropped while the round is in flight, or dropped with the grant already
/// in (never taken). 300 attempts, the drop moved across the round trip; every key is gone
/// once the loop settles, and each stage was hit.
#[test]
fn futures_dropped_at_every_stage_leave_no_key() {
    let m = masters(3);
    let c = patient_shared(m.urls());
    c.try_lock("warm", Duration::from_secs(5)).wait().unwrap();
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let (mut unpolled, mut in_flight, mut granted) = (0, 0, 0);
    for i in 0..300u32 {
        let key = format!("stage:{i}");
        let mut p = c.try_lock(&key, Duration::from_secs(30));
        if i % 3 != 0 {
            // Polled once: the loop is told to run it (its thread does).
            // (The loop's thread may have run it already, busy with earlier drops: then
            // the guard comes out here, and dropping it releases the lock.)
            if let std::task::Poll::Ready(r) = std::pin::Pin::new(&mut p).poll(&mut cx) {
                drop(r.unwrap());
                granted += 1;
                continue;
            }
            // Drop somewhere across the round trip: 0 to ~600 µs later.
            let until = Instant::now() + Duration::from_micros(u64::from(i % 13) * 50);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            if format!("{p:?}").contains("ready: true") {
                granted += 1;
            } else {
                in_flight += 1;
            }
        } else {
            unpolled += 1;
        }
        drop(p);
    }
    // Runs the loop for the attempts nobody polled.
    c.try_lock("settle", Duration::from_secs(5)).wait().unwrap();
    wait_until(
        "every abandoned attempt to settle",
        Duration::from_secs(10),
        || (0..300).all(|i| gone(&m, &format!("stage:{i}"))),
    );
    assert!(
        unpolled > 0 && in_flight > 0 && granted > 0,
        "stages hit: {unpolled} unpolled, {in_flight} in flight, {granted} granted"
    );
}

/// A dropped guard is released within one round trip: its release goes out before the
/// next operation on every connection, so taking the same resource again at once, with no
/// retry, succeeds.
#[test]
fn a_dropped_guard_is_released_before_the_next_operation() {
    let m = masters(3);
    let c = patient_shared(m.urls());
    for i in 0..50 {
        let g = c.try_lock("again", Duration::from_secs(30)).wait().unwrap();
        let t = Instant::now();
        drop(g);
        let again = c.try_lock("again", Duration::from_secs(30)).wait();
        let took = t.elapsed();
        let again =
            again.unwrap_or_else(|e| panic!("cycle {i}: the dropped lock was still held: {e}"));
        assert!(took < Duration::from_secs(1), "cycle {i}: {took:?}");
        drop(again);
    }
    // The same from an async task (the loop's thread drives).
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..50 {
            let g = c.try_lock("again", Duration::from_secs(30)).await.unwrap();
            drop(g);
            if let Err(e) = c.try_lock("again", Duration::from_secs(30)).await {
                panic!("async cycle {i}: the dropped lock was still held: {e}");
            }
        }
    });
    wait_until("the last release", Duration::from_secs(5), || {
        gone(&m, "again")
    });
}

/// 1,000 tokio tasks contend for 10 resources through one handle, three grants each, while
/// one of three masters is killed and later restarted (empty: the amnesia guard covers
/// it): every hold of a resource is alone (and ends while its lock is valid), all 3,000
/// grants happen, the restarted master serves again, and no key is left.
///
/// A rival client (its own loop and connections) contends for the same resources with 100
/// tasks of its own: one client writes every request to every master in the same order,
/// so its contenders never split the masters between them, and a broken quorum rule would
/// go unseen; a rival's requests interleave differently on each master, and it does not.
#[test]
fn a_thousand_tasks_on_ten_resources_survive_a_master_restart() {
    const TASKS: usize = 1000;
    const RESOURCES: usize = 10;
    const EACH: u64 = 3;
    const TTL: Duration = Duration::from_secs(3);
    // No persistence: the amnesia guard (enforced delayed restart) keeps the restarted
    // master from voting until every lock it may have forgotten has expired.
    let mut m = masters(3);
    let client = || {
        Redlock::builder()
            .masters(m.urls())
            .amnesia_guard(TTL)
            .node_timeout(Duration::from_millis(200))
            .retry_delay(Duration::from_millis(2))
            .retry_jitter(Duration::from_millis(8))
            .build_shared()
            .unwrap()
    };
    let (c, rival) = (client(), client());
    let inside: Arc<Vec<AtomicBool>> =
        Arc::new((0..RESOURCES).map(|_| AtomicBool::new(false)).collect());
    let grants = Arc::new(AtomicU64::new(0));
    let failed_releases = Arc::new(AtomicU64::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    const RIVALS: usize = 100;
    let tasks: Vec<_> = (0..TASKS + RIVALS)
        .map(|t| {
            let c = if t < TASKS { c.clone() } else { rival.clone() };
            let (inside, grants) = (inside.clone(), grants.clone());
            let failed_releases = failed_releases.clone();
            rt.spawn(async move {
                let r = t % RESOURCES;
                let key = format!("contended:{r}");
                for _ in 0..EACH {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    let g = c
                        .lock_with_deadline(&key, TTL, deadline)
                        .await
                        .unwrap_or_else(|e| panic!("task {t}: {e}"));
                    assert!(
                        !inside[r].swap(true, Ordering::SeqCst),
                        "two holders of {key} at once"
                    );
                    grants.fetch_add(1, Ordering::SeqCst);
                    // Hold it a moment: an overlap, were there one, would be seen.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    assert!(g.is_valid(), "a hold of {key} outlived its validity");
                    inside[r].store(false, Ordering::SeqCst);
                    // A release may fail: on a stalled machine (no quorum answered in
                    // time), or when the lock stood on a bare quorum and one of its
                    // masters was the one killed (not held on a quorum any more). Its
                    // keys then expire with the TTL; exclusion is unaffected.
                    match g.release().await {
                        Ok(()) => {}
                        Err(Error::NoQuorum(_) | Error::NotHeld(_)) => {
                            failed_releases.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("task {t}: {e}"),
                    }
                }
            })
        })
        .collect();
    let total = (TASKS + RIVALS) as u64 * EACH;
    let limit = Duration::from_secs(180);
    wait_until("a third of the grants", limit, || {
        grants.load(Ordering::SeqCst) >= total / 3
    });
    m[1].kill().unwrap();
    let at_kill = grants.load(Ordering::SeqCst);
    wait_until("grants with a master down", limit, || {
        grants.load(Ordering::SeqCst) >= at_kill + 300
    });
    m[1].restart().unwrap();
    let ok_before = c.stats().wait().unwrap()[1].ok();
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    assert_eq!(grants.load(Ordering::SeqCst), total);
    // The restarted master serves again once the amnesia guard has passed (TTL) and its
    // reconnect backoff (up to 1 s): probes keep traffic going.
    wait_until("the restarted master to serve again", TTL * 5, || {
        if let Ok(g) = c.try_lock("probe", Duration::from_secs(5)).wait() {
            drop(g);
        }
        let s = c.stats().wait().unwrap();
        s[1].ok() > ok_before && s[1].connects() >= 2
    });
    // Released everywhere (a release that failed: its keys live out their TTL).
    let failed = failed_releases.load(Ordering::SeqCst);
    let limit = if failed == 0 {
        Duration::from_secs(5)
    } else {
        TTL * 3
    };
    wait_until("every key released", limit, || {
        (0..RESOURCES).all(|r| gone(&m, &format!("contended:{r}")))
    });
}

/// A caller that panics while holding a guard (its guard released as the panic unwinds),
/// and an executor whose waker panics when the loop wakes it: the loop goes on serving
/// everyone.
#[test]
fn panicking_callers_do_not_take_the_loop_down() {
    use std::task::{Context, Wake, Waker};
    let m = masters(3);
    let c = shared(&m);
    let c2 = c.clone();
    let crashed = thread::spawn(move || {
        let _g = c2.lock("panicky", Duration::from_secs(30)).wait().unwrap();
        panic!("a caller's bug while holding the lock");
    })
    .join();
    assert!(crashed.is_err());
    wait_until(
        "the unwound guard's release",
        Duration::from_secs(5),
        || gone(&m, "panicky"),
    );

    struct Bomb;
    impl Wake for Bomb {
        fn wake(self: Arc<Self>) {
            panic!("an executor's bug in its waker");
        }
    }
    let bomb = Waker::from(Arc::new(Bomb));
    let mut p = c.try_lock("bombed", Duration::from_secs(30));
    let _ = std::pin::Pin::new(&mut p).poll(&mut Context::from_waker(&bomb));
    // The loop's thread completes it and calls the panicking waker; it survives that.
    wait_until("the grant", Duration::from_secs(5), || {
        format!("{p:?}").contains("ready: true")
    });
    drop(p);
    wait_until(
        "the unclaimed grant's release",
        Duration::from_secs(5),
        || gone(&m, "bombed"),
    );
    // Still serving, threads and tasks.
    let g = c.lock("after", Duration::from_secs(5)).wait().unwrap();
    g.release().wait().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let g = c.lock("after", Duration::from_secs(5)).await.unwrap();
        g.release().await.unwrap();
    });
}

/// Dropping a guard never blocks, even when a release round takes long: behind proxies
/// adding 200 ms each way, the drop returns at once (the release is queued to the loop)
/// and the key is gone a round trip later.
#[test]
fn dropping_a_guard_never_blocks_on_a_slow_round() {
    let m = masters(3);
    let proxies: Vec<Proxy> = (0..3).map(|i| Proxy::start(m[i].addr()).unwrap()).collect();
    let c = Redlock::builder()
        .masters(proxies.iter().map(|p| p.url()))
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build_shared()
        .unwrap();
    let g = c
        .try_lock("slow-drop", Duration::from_secs(30))
        .wait()
        .unwrap();
    for p in &proxies {
        p.set_mode(Mode::Latency(Duration::from_millis(200)));
    }
    let t = Instant::now();
    drop(g);
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(50),
        "drop blocked for {took:?}"
    );
    wait_until(
        "the dropped guard's release",
        Duration::from_secs(5),
        || gone(&m, "slow-drop"),
    );
}

/// A master restarts while the shared client's loop is parked (nothing in flight, nobody
/// driving): the next call reads what came meanwhile before it writes (the closed
/// connection), as the single owner's calls do, so its request goes out on a fresh
/// connection instead of failing on the one the master closed. (The loop's entry read
/// the clock and then "caught up" with an idle gap it had already reset: it never
/// polled, and the first lock after the restart failed on that master.)
#[test]
fn a_parked_loop_reads_a_restart_before_the_next_request() {
    let mut m = masters(3);
    // A patient round (the reconnect and handshake on a loaded machine must not count as
    // a timeout: only a request written to the closed connection fails here).
    let ttl = Duration::from_secs(60);
    let c = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_secs(5))
        .build_shared()
        .unwrap();
    let g = c.try_lock("parked", ttl).wait().unwrap();
    g.release().wait().unwrap();
    // Parked: nothing in flight, nothing owed (the release returned at a quorum: settled,
    // it was answered by every master).
    settle_shared(&c, 3);
    let before = c.stats().wait().unwrap();
    m[1].restart().unwrap();
    let g = c.try_lock("parked", ttl).wait().unwrap();
    // Master 1's outcome (and its reconnect) may come after the quorum: settle first.
    settle_shared(&c, 3);
    let after = c.stats().wait().unwrap();
    g.release().wait().unwrap();
    assert_eq!(
        (after[1].failed(), after[1].timed_out()),
        (before[1].failed(), before[1].timed_out()),
        "the first request after the restart failed on the old connection: {:?}",
        after[1].last_fault()
    );
    assert!(after[1].connects() > before[1].connects());
}
