//! The shared client against real masters: one loop serving many threads and async tasks,
//! guards that release on drop, cancellation by dropping a future (no lock granted to
//! nobody), extension and auto-extension from the loop's timers, the lost-lock signal in
//! its three forms.
//!
//! Every wait is bounded; faults come from SIGSTOP and the fault proxy.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{get, masters, wait_until, LocalMasters};

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
    assert!(gone(&m, "hot"));
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
    let c = Redlock::builder()
        .masters(proxies.iter().map(|p| p.url()))
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build_shared()
        .unwrap();
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
    let c = Redlock::builder()
        .masters(m.urls())
        .fencing(true)
        .retry_count(0)
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
