//! Dropping the last handle of the shared client (and its last guard) stops the loop:
//! its thread exits, the locks still held are released, the connections are closed. A
//! file of its own: it counts the process's threads, which other tests would disturb.

mod support;

use std::time::Duration;

use support::{get, masters, settle_shared, wait_until, LocalMaster};

use redlock_mux::{HoldOptions, Redlock};

/// Threads of this process named like the loop's.
fn loop_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        panic!("cannot read /proc/self/task");
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.trim_end() == "redlock-mux")
        })
        .count()
}

/// Clients connected to `m`, not counting the connection that asks.
fn clients(m: &LocalMaster) -> usize {
    let list = m.cmd(&[b"CLIENT", b"LIST"]).unwrap();
    list.as_str().unwrap().lines().count() - 1
}

#[test]
fn dropping_the_last_handle_stops_the_loop_releases_and_disconnects() {
    let m = masters(3);
    assert_eq!(loop_threads(), 0);
    let c = Redlock::builder().masters(m.urls()).build_shared().unwrap();
    // (The thread names itself once it runs.)
    wait_until("the loop's thread to start", Duration::from_secs(5), || {
        loop_threads() == 1
    });
    let worker = c.clone();
    let held = c.lock("held", Duration::from_secs(30)).wait().unwrap();
    held.auto_extend(HoldOptions::default());
    let kept = worker.lock("kept", Duration::from_secs(30)).wait().unwrap();
    // The lock returned at a quorum: on every master once settled (checked below).
    settle_shared(&c, 3);
    assert!(
        m.iter().all(|x| clients(x) == 1),
        "one connection per master"
    );

    // Handles gone; the guards keep the client alive (and their locks held).
    drop(c);
    drop(worker);
    assert!(kept.is_valid() && !held.is_lost());
    assert_eq!(loop_threads(), 1);
    assert!((0..3).all(|i| get(&m, i, "kept").is_some()));

    // The last guards gone: their releases go out, the loop stops, connections close.
    drop(kept);
    drop(held);
    wait_until("the loop's thread to exit", Duration::from_secs(5), || {
        loop_threads() == 0
    });
    for (i, master) in m.iter().enumerate() {
        assert!(get(&m, i, "held").is_none() && get(&m, i, "kept").is_none());
        wait_until("the connection to close", Duration::from_secs(5), || {
            clients(master) == 0
        });
    }

    // Masters that never answer (two of three frozen: the release cannot reach a quorum)
    // do not keep the loop alive: with releases owed there, the thread still ends within
    // its 2 s bound.
    let mut m = m;
    let c = Redlock::builder().masters(m.urls()).build_shared().unwrap();
    let g = c.lock("frozen", Duration::from_secs(30)).wait().unwrap();
    m[1].freeze().unwrap();
    m[2].freeze().unwrap();
    let dropped = std::time::Instant::now();
    drop(g);
    drop(c);
    wait_until("the loop's thread to exit", Duration::from_secs(5), || {
        loop_threads() == 0
    });
    let took = dropped.elapsed();
    m[1].thaw().unwrap();
    m[2].thaw().unwrap();
    assert!(
        took < Duration::from_millis(2500),
        "the loop took {took:?} to stop with a master frozen (bound: 2 s)"
    );
}
