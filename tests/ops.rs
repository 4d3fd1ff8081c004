//! Tools to see and break locks (issue 20, item 6), on real masters: `inspect` and
//! `force_release` on both clients, the contention a lock tells (how long its call waited,
//! refusals, woken by a release), and the CLI's `redlock list`, `redlock release --force`
//! and `redlock status` (with the `cli` feature).
//!
//! Every wait is a bounded poll; nothing hopes a sleep was long enough.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::{Error, Outcome, Redlock};
use support::{masters, masters_with, wait_until, AdminReply, LocalMasters};

/// The fingerprint of a lock's token, as an inspection shows it.
fn fp(lock: &redlock_mux::Lock) -> String {
    lock.token().as_str()[..16].to_string()
}

#[test]
fn inspect_a_held_lock_a_free_one_and_one_with_a_master_down() {
    let mut m = masters(3);
    let mut holder = Redlock::new(m.urls()).expect("holder");
    let lock = holder
        .try_lock("ops:held", Duration::from_secs(30))
        .expect("the holder takes the lock");
    let mut operator = Redlock::new(m.urls()).expect("operator");

    let seen = operator.inspect("ops:held").expect("inspect");
    assert_eq!(seen.resource(), b"ops:held");
    assert_eq!((seen.answered(), seen.quorum()), (3, 2), "{seen}");
    assert!(seen.is_held() && !seen.is_free(), "{seen}");
    assert_eq!(seen.holder(), Some(fp(&lock).as_str()), "{seen}");
    assert_eq!(seen.held_on(), 3, "{seen}");
    assert_eq!(
        (seen.waiters(), seen.fencing_counter()),
        (0, None),
        "{seen}"
    );
    for v in seen.masters() {
        assert_eq!(v.outcome(), Outcome::Ok, "{v:?}");
        assert!(v.exists() && v.is_lock() && !v.is_contended(), "{v:?}");
        let ttl = v.ttl().expect("a lock key expires");
        assert!(
            ttl <= Duration::from_secs(30) && ttl > Duration::from_secs(20),
            "{v:?}"
        );
        assert!(!v.never_expires() && v.first_waiters().is_empty(), "{v:?}");
    }
    let text = seen.to_string();
    assert!(
        text.starts_with("held by ") && text.contains("3 of 3"),
        "{text}"
    );
    // The whole token (the capability to release) is never shown.
    let debug = format!("{seen:?} {text}");
    assert!(!debug.contains(lock.token().as_str()), "{debug}");

    let free = operator.inspect("ops:free").expect("inspect");
    assert!(free.is_free() && !free.is_held(), "{free}");
    assert_eq!((free.holder(), free.held_on()), (None, 0), "{free}");
    assert!(free.masters().iter().all(|v| v.answered() && !v.exists()));

    // A master down: its fault is in the inspection, and a quorum still holds the lock.
    m[2].kill().expect("kill master 2");
    let seen = operator.inspect("ops:held").expect("inspect");
    assert_eq!(seen.answered(), 2, "{seen}");
    let down = &seen.masters()[2];
    assert!(
        !down.answered() && matches!(down.outcome(), Outcome::Failed(_)),
        "{down:?}"
    );
    assert!(down.holder().is_none() && down.ttl().is_none(), "{down:?}");
    assert!(seen.is_held(), "2 of 3 hold it: {seen}");
    assert_eq!(seen.held_on(), 2, "{seen}");

    // The shared client reads the same.
    let shared = Redlock::builder()
        .masters(m.urls())
        .build_shared()
        .expect("shared");
    let seen = shared.inspect("ops:held").wait().expect("inspect");
    assert!(seen.is_held(), "{seen}");
    assert_eq!(seen.holder(), Some(fp(&lock).as_str()), "{seen}");
    let free = shared.inspect("ops:free").wait().expect("inspect");
    assert!(free.is_free(), "{free}");

    // Bad names are refused before anything is sent, by both clients.
    for bad in ["", "redlock-mux:queue:ops:held"] {
        assert!(
            matches!(operator.inspect(bad), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
        assert!(
            matches!(shared.inspect(bad).wait(), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
        assert!(matches!(
            operator.force_release(bad),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            shared.force_release(bad).wait(),
            Err(Error::InvalidArgument(_))
        ));
    }
    drop(holder);
}

/// A client whose waiters try again only on a release (or after 5 s): an attempt started
/// before that was started by a release's announcement.
fn slow_poller(urls: &[String]) -> redlock_mux::Builder {
    Redlock::builder()
        .masters(urls)
        .retry_delay(Duration::from_secs(5))
        .retry_jitter(Duration::ZERO)
        .node_timeout(Duration::from_millis(500))
}

/// What a waiter's lock told: attempts, refusals, woken by a release, waited; the call's
/// length; when it was granted.
type Told = (u32, u32, bool, Duration, Duration, Instant);

/// A thread waiting for `resource` through `shared` (at most 30 s), that releases the lock
/// once granted.
fn waiter(
    shared: &redlock_mux::SharedRedlock,
    resource: &'static str,
) -> thread::JoinHandle<Result<Told, Error>> {
    let w = shared.clone();
    thread::spawn(move || {
        let called = Instant::now();
        let deadline = called + Duration::from_secs(30);
        let guard = w
            .lock_with_deadline(resource, Duration::from_secs(30), deadline)
            .wait()?;
        let got = Instant::now();
        let told = (
            guard.attempts(),
            guard.refusals(),
            guard.woken_by_release(),
            guard.waited(),
            got.duration_since(called),
            got,
        );
        guard.release().wait()?;
        Ok(told)
    })
}

fn zcard(m: &LocalMasters, i: usize, key: &str) -> i64 {
    match m[i].cmd(&[b"ZCARD", key.as_bytes()]).expect("ZCARD") {
        AdminReply::Int(n) => n,
        other => panic!("ZCARD {key}: {other:?}"),
    }
}

/// Two waiters of one client (a slow poller) in `resource`'s line on every master, held
/// by another client, each of them listening for releases: the first one's subscriptions
/// (the key's channel and the client's own) are in place on every master before the
/// second asks, so that the second's first refusal comes after the client heard them
/// confirmed, and the first's check after its confirmations ran before that refusal. Then
/// only an announced release (or their timed retry, 5 s later) starts another attempt.
/// Gated on the masters (ZCARD, PUBSUB NUMSUB), never on the clients' own reports.
fn two_waiters_in_line(
    m: &LocalMasters,
    shared: &redlock_mux::SharedRedlock,
    resource: &'static str,
) -> Vec<thread::JoinHandle<Result<Told, Error>>> {
    let line = format!("redlock-mux:queue:{resource}");
    let first = waiter(shared, resource);
    wait_until("the first waiter in line", Duration::from_secs(20), || {
        (0..m.len()).all(|i| zcard(m, i, &line) == 1)
    });
    let id = match m[0]
        .cmd(&[b"ZRANGE", line.as_bytes(), b"0", b"0"])
        .expect("ZRANGE")
    {
        AdminReply::Array(ids) => ids[0].as_str().expect("an id").to_string(),
        other => panic!("ZRANGE {line}: {other:?}"),
    };
    let channels = [
        format!("redlock-mux:released:{resource}"),
        format!("redlock-mux:next:{}", &id[..8]),
    ];
    wait_until(
        "the first waiter subscribed",
        Duration::from_secs(20),
        || {
            (0..m.len()).all(|i| {
                let reply = m[i]
                    .cmd(&[
                        b"PUBSUB",
                        b"NUMSUB",
                        channels[0].as_bytes(),
                        channels[1].as_bytes(),
                    ])
                    .expect("PUBSUB NUMSUB");
                matches!(reply, AdminReply::Array(a) if a.len() == 4
                && a[1] == AdminReply::Int(1) && a[3] == AdminReply::Int(1))
            })
        },
    );
    let second = waiter(shared, resource);
    wait_until("both waiters in line", Duration::from_secs(20), || {
        (0..m.len()).all(|i| zcard(m, i, &line) == 2)
    });
    vec![first, second]
}

#[test]
fn inspect_shows_the_line_and_a_lock_tells_its_contention() {
    let m = masters(3);
    let mut holder = Redlock::new(m.urls()).expect("holder");
    let lock = holder
        .try_lock("ops:line", Duration::from_secs(30))
        .expect("the holder takes the lock");
    let shared = slow_poller(&m.urls()).build_shared().expect("shared");
    let waiters = two_waiters_in_line(&m, &shared, "ops:line");
    let lined_at = Instant::now();
    let mut operator = Redlock::new(m.urls()).expect("operator");
    let seen = operator.inspect("ops:line").expect("inspect");
    assert!(seen.is_held() && seen.waiters() == 2, "{seen}");
    assert!(seen.to_string().contains("2 waiters in line"), "{seen}");
    for v in seen.masters() {
        // A refused waiter marked the holder's key; its release will look for waiters.
        assert!(v.is_contended() && v.is_lock(), "{v:?}");
        let first = v.first_waiters();
        assert_eq!(first.len(), 2, "{v:?}");
        assert!(first.iter().all(|w| w.is_alive()), "{v:?}");
        // Both are the shared client's: one client part, 8 hex digits.
        assert_eq!(first[0].client(), first[1].client(), "{v:?}");
        assert_eq!(first[0].client().len(), 8, "{v:?}");
        assert!(first[0].client().bytes().all(|b| b.is_ascii_hexdigit()));
    }
    let released = Instant::now();
    holder.release(lock).expect("release");
    for w in waiters {
        let (attempts, refusals, woken, waited, call, got) =
            w.join().expect("waiter").expect("lock");
        assert!(
            refusals >= 1 && attempts > refusals,
            "{attempts} {refusals}"
        );
        // The holder's release (announced by the masters) or the other waiter's (made by
        // the same client) started the attempt that got it: not the timed retry.
        assert!(woken, "granted {:?} after the release", got - released);
        assert!(
            got - released < Duration::from_secs(4),
            "{:?}",
            got - released
        );
        // The call began before the test saw it in line, and was granted after the release.
        assert!(waited >= released.duration_since(lined_at), "{waited:?}");
        assert!(waited <= call, "{waited:?} > the call's {call:?}");
    }
    let after = operator.inspect("ops:line").expect("inspect");
    assert!(after.is_free() && after.waiters() == 0, "{after}");
    // An uncontended lock: one attempt, no refusal, not woken, about a round trip.
    let lock = holder
        .lock("ops:line", Duration::from_secs(5))
        .expect("free again");
    assert_eq!(
        (lock.attempts(), lock.refusals(), lock.woken_by_release()),
        (1, 0, false)
    );
    assert!(
        lock.waited() < Duration::from_secs(2),
        "{:?}",
        lock.waited()
    );
    holder.release(lock).expect("release");
    // A lock that waited out a timed retry only: refusals counted, not woken.
    let lock = holder
        .try_lock("ops:line", Duration::from_millis(300))
        .expect("lock");
    std::mem::forget(lock); // expires by itself, announced by nobody
    let mut poller = Redlock::builder()
        .masters(m.urls())
        .wait_mode(redlock_mux::WaitMode::Poll)
        .retry_delay(Duration::from_millis(100))
        .retry_jitter(Duration::ZERO)
        .build()
        .expect("poller");
    let lock = poller
        .lock_with_deadline(
            "ops:line",
            Duration::from_secs(5),
            Instant::now() + Duration::from_secs(10),
        )
        .expect("granted once the forgotten lock expired");
    assert!(lock.refusals() >= 1 && !lock.woken_by_release(), "{lock:?}");
    assert!(lock.waited() >= Duration::from_millis(100), "{lock:?}");
    poller.release(lock).expect("release");
}

#[test]
fn inspect_shows_the_fencing_counter() {
    let m = masters_with(3, &["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = Redlock::builder()
        .masters(m.urls())
        .fencing(true)
        // An fsync per write on a loaded machine: patient rounds, and retries.
        .node_timeout(Duration::from_secs(1))
        .build()
        .expect("fencing client");
    let lock = c.lock("ops:fenced", Duration::from_secs(10)).expect("lock");
    let token = lock.fencing_token().expect("a fencing token");
    c.release(lock).expect("release");
    let seen = c.inspect("ops:fenced").expect("inspect");
    assert_eq!(seen.fencing_counter(), Some(token), "{seen}");
    assert!(seen.is_free(), "{seen}");
    // Written back to a quorum, at least.
    let with = seen
        .masters()
        .iter()
        .filter(|v| v.fencing_counter() == Some(token))
        .count();
    assert!(with >= 2, "{seen}");
    assert!(seen
        .to_string()
        .contains(&format!("fencing counter {token}")));
}

#[test]
fn force_release_frees_a_lock_held_by_another_client() {
    let m = masters(3);
    let mut holder = Redlock::new(m.urls()).expect("holder");
    let mut lock = holder
        .try_lock("ops:forced", Duration::from_secs(30))
        .expect("the holder takes the lock");
    let mut operator = Redlock::new(m.urls()).expect("operator");
    let forced = operator.force_release("ops:forced").expect("force");
    assert!(forced.is_free(), "{forced}");
    assert_eq!(forced.holder(), Some(fp(&lock).as_str()), "{forced}");
    assert_eq!(forced.removed_on(), 3, "{forced}");
    for r in forced.masters() {
        assert_eq!(r.outcome(), Outcome::Ok, "{r:?}");
        assert_eq!(r.removed(), Some(fp(&lock).as_str()), "{r:?}");
        assert!(
            r.ttl().is_some_and(|t| t <= Duration::from_secs(30)),
            "{r:?}"
        );
        assert_eq!(r.woke(), None, "nobody was in line: {r:?}");
    }
    assert!(forced.to_string().contains("on 3 of 3 masters"), "{forced}");
    // The key is gone everywhere; the holder learns it at its next extension.
    for i in 0..3 {
        assert_eq!(support::get(&m, i, "ops:forced"), None);
    }
    match holder.extend(&mut lock, Duration::from_secs(30)) {
        Err(Error::NotHeld(r)) => assert_eq!(r.ok(), 0, "{r}"),
        other => panic!("the holder's extend after a forced release: {other:?}"),
    }
    let again = operator
        .try_lock("ops:forced", Duration::from_secs(5))
        .expect("free for the next caller");
    // Nothing left to force: said so, and still free on a quorum.
    operator.release(again).expect("release");
    let nothing = operator.force_release("ops:forced").expect("force");
    assert!(nothing.is_free() && nothing.holder().is_none(), "{nothing}");
    assert!(nothing
        .masters()
        .iter()
        .all(|r| r.outcome() == Outcome::NotHeld));
    assert!(
        nothing.to_string().starts_with("no master had the key"),
        "{nothing}"
    );

    // The shared client, the same; a key of another type under the name is refused.
    let shared = Redlock::builder()
        .masters(m.urls())
        .build_shared()
        .expect("shared");
    let lock = holder
        .try_lock("ops:forced", Duration::from_secs(30))
        .expect("lock");
    let forced = shared.force_release("ops:forced").wait().expect("force");
    assert_eq!(forced.holder(), Some(fp(&lock).as_str()), "{forced}");
    assert!(forced.is_free());
    std::mem::forget(lock);
    assert!(m[0].cmd(&[b"HSET", b"ops:hash", b"f", b"v"]).is_ok());
    let refused = shared.force_release("ops:hash").wait().expect("force");
    let r0 = &refused.masters()[0];
    assert!(
        matches!(r0.outcome(), Outcome::Failed(redlock_mux::Fault::Redis(t)) if t.starts_with(b"WRONGTYPE")),
        "{r0:?}"
    );
    assert!(!r0.is_free() && r0.removed().is_none(), "{r0:?}");
    assert!(refused.is_free(), "the two others have no key: {refused}");
    let seen = shared.inspect("ops:hash").wait().expect("inspect");
    assert!(seen.masters()[0].exists() && seen.masters()[0].holder().is_none());
    assert!(seen.to_string().contains("another type"), "{seen}");
}

#[test]
fn force_release_wakes_the_waiters() {
    let m = masters(3);
    let mut holder = Redlock::new(m.urls()).expect("holder");
    let lock = holder
        .try_lock("ops:wake", Duration::from_secs(60))
        .expect("the holder takes the lock");
    let shared = slow_poller(&m.urls()).build_shared().expect("shared");
    let waiters = two_waiters_in_line(&m, &shared, "ops:wake");
    let mut operator = Redlock::new(m.urls()).expect("operator");
    let forced_at = Instant::now();
    let forced = operator.force_release("ops:wake").expect("force");
    assert_eq!(forced.holder(), Some(fp(&lock).as_str()), "{forced}");
    // The first live waiter in line was named (by every master where the force ran before
    // the waiters, woken by the others, took the lock and left the line).
    let named: Vec<&str> = forced.masters().iter().filter_map(|r| r.woke()).collect();
    assert!(!named.is_empty(), "no waiter named: {forced:?}");
    assert!(named.iter().all(|w| *w == named[0]), "{forced:?}");
    for w in waiters {
        let (_, refusals, woken, _, _, got) = w.join().expect("waiter").expect("granted");
        assert!(woken && refusals >= 1, "woken {woken}, refusals {refusals}");
        // Their next timed attempt was 5 s away.
        let after = got.duration_since(forced_at);
        assert!(
            after < Duration::from_secs(4),
            "granted {after:?} after the force"
        );
    }
    std::mem::forget(lock);
}
