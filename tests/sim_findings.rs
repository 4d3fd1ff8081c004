//! The bugs of the core the deterministic simulation found (`tests/simulation.rs`), each
//! shown against real `redis-server` masters: every test here failed on the code before
//! its fix (commits 6e3d7d1 and 7bad1c4; the failure messages are in each test's doc).
//!
//! 1. A failed attempt's cleanup sent to some masters only was freed before its requests
//!    were counted: a `-NOSCRIPT` to it was never retried with `EVAL`.
//! 2. A release started while a master's connection was backing off was forgotten.
//! 3. A fair waiter lost the wake-up of its turn after announcements it read during its
//!    first attempt.
//! 4. A fair waiter whose attempt stood out of line stayed out of it for a retry delay.
//!
//! The order of events each bug needs is forced with the fault proxy (a held connection
//! decides when a master answers) and checked on the masters (keys, lines, command
//! counts); no sleep makes it happen. Where a step depends on the machine's speed (a
//! release within a reconnect backoff, a call within the subscriptions' linger), the test
//! checks that it happened and says so if not. Every wait is bounded by what it proves:
//! long retry delays and TTLs (10 s, 30 s and more) that nothing here waits for, against a
//! few seconds for what must happen at once.

mod support;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{get, masters, poll_until, wait_until, AdminReply, LocalMasters};

use redlock_mux::{Error, Lock, LockGuard, Pending, Redlock, SharedRedlock};

/// A lock TTL no test waits for.
const TTL: Duration = Duration::from_secs(30);
/// A retry delay no test waits for: whatever happens well before it was caused otherwise.
const FALLBACK: Duration = Duration::from_secs(10);
/// How long what must happen at once may take, at most (a loaded machine included).
const PROMPT: Duration = Duration::from_secs(3);
/// The value of a key set by hand (a foreign holder).
const FOREIGN: &str = "foreign-holder";

fn set_by_hand(m: &LocalMasters, i: usize, key: &str, value: &str) {
    let r = m[i].cmd(&[b"SET", key.as_bytes(), value.as_bytes()]);
    assert!(r.unwrap().is_ok());
}

/// Whether a lock call of the shared client is still waiting (polled once, not awaited:
/// the loop's thread runs it from then on).
fn still_waiting(p: &mut Pending<LockGuard>) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(p).poll(&mut cx), Poll::Pending)
}

fn stats(c: &SharedRedlock) -> Vec<redlock_mux::MasterStats> {
    c.stats().wait().unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. A cleanup release sent to some masters only, and -NOSCRIPT
// ---------------------------------------------------------------------------------------

/// (1, commit 6e3d7d1; the simulation's seed 363 of `safe_under_model_assumptions`.) Two
/// masters; a foreign holder has the key on master 0; master 1's script cache was flushed
/// after the waiter connected. The waiter's attempt gets `-NOSCRIPT` from master 1 and
/// takes the key there with `EVAL` while master 0 has not answered yet (its connection is
/// held by the proxy); then master 0 refuses. The attempt's cleanup release goes to
/// master 1 only, by `EVALSHA`, and gets `-NOSCRIPT` too: it must be retried with `EVAL`,
/// so that the failed attempt's key is gone from master 1 at once, not at its TTL.
///
/// Before the fix, `Rounds::start` decided the cleanup on master 0 (not asked: a no, which
/// left no quorum possible) and freed it, owner-less and owed nothing yet, before its
/// request to master 1 was counted; master 1's `-NOSCRIPT` then found it gone. Failed with:
/// "the failed attempt's key (token ...) is still on master 1 3s after master 0 refused
/// the attempt (its TTL is 30s): its cleanup's -NOSCRIPT was not retried with EVAL
/// (EVAL retries on master 1: 1)".
#[test]
fn a_cleanup_sent_to_some_masters_is_retried_with_eval_after_noscript() {
    let key = "cleanup-noscript";
    let m = masters(2);
    let p0 = Proxy::start(m[0].addr()).unwrap();
    set_by_hand(&m, 0, key, FOREIGN);
    let w = Redlock::builder()
        .masters([p0.url(), m[1].url()])
        // Nothing times out while the proxy holds master 0's answers.
        .node_timeout(Duration::from_secs(10))
        .stall_timeout(Duration::from_secs(60))
        .retry_delay(FALLBACK)
        .retry_jitter(Duration::ZERO)
        .retry_count(3)
        .build_shared()
        .unwrap();
    // Connected, the scripts loaded by the handshake: then master 1 forgets them.
    let g = w.try_lock("cleanup-warm", TTL).wait().unwrap();
    g.release().wait().unwrap();
    assert!(m[1].cmd(&[b"SCRIPT", b"FLUSH"]).unwrap().is_ok());
    p0.set_mode(Mode::Hold);

    let mut waiting = w.lock(key, TTL);
    // Polled once: the loop's thread runs it (nobody waits for it in a thread).
    assert!(still_waiting(&mut waiting));
    // The attempt's key on master 1 (its EVALSHA got -NOSCRIPT, its EVAL took the key),
    // while master 0 has not answered: the round is undecided.
    let mut token = None;
    wait_until("the attempt's key on master 1", PROMPT, || {
        token = get(&m, 1, key);
        token.is_some()
    });
    p0.set_mode(Mode::PassThrough);
    wait_until("master 0's refusal", PROMPT, || stats(&w)[0].refused() >= 1);
    // The attempt's token (a key's value is a token, or a token and a mark).
    let mut token = token.unwrap();
    token.truncate(32);
    // Gone, or another attempt's (a refused waiter marks a key it finds taken: `+`).
    let gone = poll_until(PROMPT, || {
        get(&m, 1, key).is_none_or(|v| !v.starts_with(&token))
    });
    let evals = stats(&w)[1].noscript();
    drop(waiting);
    assert!(
        gone,
        "the failed attempt's key (token {}) is still on master 1 {PROMPT:?} after master 0 \
         refused the attempt (its TTL is {TTL:?}): its cleanup's -NOSCRIPT was not retried \
         with EVAL (EVAL retries on master 1: {evals})",
        String::from_utf8_lossy(&token)
    );
}

// ---------------------------------------------------------------------------------------
// 2. A release while a master's connection backs off
// ---------------------------------------------------------------------------------------

/// The longest reconnect backoff (`NetConfig::backoff_max`): 25 ms doubled per failed
/// connect, at most 1 s.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Failed connects in a row after which the backoff is `BACKOFF_MAX` (25 ms x 2^6 > 1 s).
const FAILS_TO_MAX: usize = 7;

/// A key held by hand on masters 0 and 1: a `try_lock` of it is refused.
const PROBE: &str = "backoff-probe";

/// The pause between two probes while master 2 backs off. Each probe refused then owes
/// master 2 its cleanup (the fault a backing-off master reports is its last connection's,
/// which may have run a request), and the queue of releases owed to a master is bounded
/// (2048, oldest kept): unpaced (thousands of probes), they fill it before the release
/// under test, which is then left to its TTL.
const PROBE_PACE: Duration = Duration::from_millis(10);

/// An address where nothing listens: a bound socket that does not listen (connects to it
/// are refused; the socket keeps the port taken). Keep the socket alive.
fn dead_addr() -> (socket2::Socket, SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    (s, addr)
}

/// One client (shared or single owner) for the backoff scenario: what the test does with
/// it, whatever its kind.
trait Client {
    /// One `try_lock` of [`PROBE`]: it asks every master (so it connects a master that is
    /// down once its backoff has passed) and is refused by masters 0 and 1, taking no lock
    /// to release (see `PROBE_PACE` on why that matters). Runs the single owner's loop.
    fn probe(&mut self);
    fn disconnects(&mut self, i: usize) -> u64;
    fn take(&mut self, key: &str) -> usize;
    fn release(&mut self, lock: usize);
    /// What makes the client deliver what it owes: nothing for the shared client (its loop
    /// runs), a call for the single owner.
    fn settle(&mut self);
}

struct Shared {
    c: SharedRedlock,
    guards: Vec<Option<redlock_mux::LockGuard>>,
}

impl Client for Shared {
    fn probe(&mut self) {
        let r = self.c.try_lock(PROBE, TTL).wait();
        assert!(matches!(r, Err(Error::Taken(_))), "{r:?}");
    }
    fn disconnects(&mut self, i: usize) -> u64 {
        stats(&self.c)[i].disconnects()
    }
    fn take(&mut self, key: &str) -> usize {
        self.guards
            .push(Some(self.c.try_lock(key, 2 * TTL).wait().unwrap()));
        self.guards.len() - 1
    }
    fn release(&mut self, lock: usize) {
        let g = self.guards[lock].take().unwrap();
        g.release().wait().unwrap();
    }
    fn settle(&mut self) {}
}

struct Single {
    c: Redlock,
    locks: Vec<Option<Lock>>,
}

impl Client for Single {
    fn probe(&mut self) {
        let r = self.c.try_lock(PROBE, TTL);
        assert!(matches!(r, Err(Error::Taken(_))), "{r:?}");
    }
    fn disconnects(&mut self, i: usize) -> u64 {
        self.c.stats()[i].disconnects()
    }
    fn take(&mut self, key: &str) -> usize {
        self.locks
            .push(Some(self.c.try_lock(key, 2 * TTL).unwrap()));
        self.locks.len() - 1
    }
    fn release(&mut self, lock: usize) {
        let l = self.locks[lock].take().unwrap();
        self.c.release(l).unwrap();
    }
    fn settle(&mut self) {
        self.probe();
    }
}

/// Master 2 (behind `p`) holds the client's locks; its connection is reset and every
/// reconnect fails (the proxy's upstream refuses) until the backoff is at its longest;
/// then a lock is released right after a failed connect, within that backoff (checked:
/// the release returned less than `BACKOFF_MAX` after a moment before that connect was
/// accepted). The master is reachable again; the released key must be deleted there
/// within the backoff and `PROMPT`, well before its TTL (60 s). `None`: fine; or what
/// went wrong.
fn release_while_backing_off(
    m: &LocalMasters,
    p: &Proxy,
    c: &mut dyn Client,
    kind: &str,
) -> Option<String> {
    let on_2 = |key: &str| get(m, 2, key).is_some();
    // Three locks: one is released per backoff until one release lands within it.
    let keys: Vec<String> = (0..3).map(|k| format!("backoff-{kind}-{k}")).collect();
    let locks: Vec<usize> = keys.iter().map(|k| c.take(k)).collect();
    for k in &keys {
        // Its SET there is answered within the next calls.
        wait_until("the key on master 2", PROMPT, || {
            c.settle();
            on_2(k)
        });
    }
    set_by_hand(m, 0, PROBE, FOREIGN);
    set_by_hand(m, 1, PROBE, FOREIGN);
    let (_dead, dead) = dead_addr();
    let d0 = c.disconnects(2);
    p.set_upstream(dead);
    p.reset_all();
    wait_until("the reset seen", PROMPT, || {
        c.probe();
        c.disconnects(2) > d0
    });
    let t0 = Instant::now();
    let (a0, d1) = (p.accepted(), c.disconnects(2));
    let mut released = None;
    let (mut seen, mut t_seen) = (a0, t0);
    let escalation = Instant::now() + Duration::from_secs(30);
    'locks: for (lock, key) in locks.iter().zip(&keys) {
        // Until a connect at the longest backoff has been accepted (and refused).
        let t_before = loop {
            assert!(
                Instant::now() < escalation,
                "{kind}: no reconnect in 30 s ({} accepted)",
                p.accepted() - a0
            );
            thread::sleep(PROBE_PACE);
            c.probe();
            let t = Instant::now();
            let a = p.accepted();
            if a > seen {
                // The a-th connect was accepted after `t_seen` (`seen` was read then).
                let before = t_seen;
                (seen, t_seen) = (a, t);
                if a - a0 >= FAILS_TO_MAX {
                    break before;
                }
            } else {
                t_seen = t;
            }
        };
        // The client saw that connect fail: it backs off until at least `t_before +
        // BACKOFF_MAX`.
        let failed = d1 + (seen - a0) as u64;
        wait_until("the failed connect seen", PROMPT, || {
            c.probe();
            c.disconnects(2) >= failed
        });
        c.release(*lock);
        // Within the backoff: nothing reconnected since that connect.
        if Instant::now() < t_before + BACKOFF_MAX && p.accepted() == seen {
            released = Some(key.clone());
            break 'locks;
        }
        // Too late (a slow machine): the release may have reconnected. The next lock.
    }
    let Some(key) = released else {
        return Some(format!(
            "{kind}: no release landed within a backoff (the machine was too slow)"
        ));
    };
    assert!(
        on_2(&key),
        "{kind}: the key left master 2 while it was cut off"
    );
    // Master 2 is reachable again; the client is not asked anything (the shared client)
    // or only for other locks (the single owner).
    p.set_upstream(m[2].addr());
    let gone = poll_until(BACKOFF_MAX + PROMPT, || {
        c.settle();
        !on_2(&key)
    });
    (!gone).then(|| {
        format!(
            "{kind}: the key released while master 2's connection backed off is still there \
             {:?} after it was reachable again (TTL {:?})",
            BACKOFF_MAX + PROMPT,
            2 * TTL
        )
    })
}

/// (2, commit 6e3d7d1; the simulation's seed 53: a shared client's release during a 40 ms
/// restart left the key for its TTL after shutdown.) A client holds locks on 3 masters;
/// master 2's connection breaks and every reconnect fails (the proxy before it cannot
/// reach it) while the master keeps the keys; a lock is released while the client backs
/// off before its next reconnect. Once master 2 is reachable again, the release must take
/// effect there within the TTL: the shared client's loop reconnects for it by itself, the
/// single owner with its next calls.
///
/// Before the fix the release failed there at once ("down") and was forgotten: the key
/// stayed for its whole TTL. Failed with: "shared client: the key released while master
/// 2's connection backed off is still there 4s after it was reachable again (TTL 60s)"
/// and "single owner: ..." (the same).
#[test]
fn a_release_while_a_master_backs_off_is_owed_to_its_next_connection() {
    let m = masters(3);
    let mut problems = Vec::new();
    let builder = |p: &Proxy| {
        Redlock::builder()
            .masters([m[0].url(), m[1].url(), p.url()])
            .node_timeout(Duration::from_secs(1))
            .retry_count(0)
    };

    let p = Proxy::start(m[2].addr()).unwrap();
    let mut shared = Shared {
        c: builder(&p).build_shared().unwrap(),
        guards: Vec::new(),
    };
    problems.extend(release_while_backing_off(
        &m,
        &p,
        &mut shared,
        "shared client",
    ));

    let p = Proxy::start(m[2].addr()).unwrap();
    let mut single = Single {
        c: builder(&p).build().unwrap(),
        locks: Vec::new(),
    };
    problems.extend(release_while_backing_off(
        &m,
        &p,
        &mut single,
        "single owner",
    ));
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------
// 3. A fair waiter's turn after announcements read during its first attempt
// ---------------------------------------------------------------------------------------

fn del_by_hand(m: &LocalMasters, i: usize, key: &str) {
    m[i].cmd(&[b"DEL", key.as_bytes()]).unwrap();
}

/// Waiters in the line of `key` on master `i` (see `scripts::QUEUE`).
fn in_line(m: &LocalMasters, i: usize, key: &str) -> i64 {
    let q = redlock_mux::scripts::aux_key(redlock_mux::scripts::QUEUE, key.as_bytes());
    match m[i].cmd(&[b"ZCARD", &q]) {
        Ok(AdminReply::Int(n)) => n,
        other => panic!("ZCARD: {other:?}"),
    }
}

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

/// The channels matching `pattern` on master `i` that have subscribers.
fn channels(m: &LocalMasters, i: usize, pattern: &str) -> usize {
    match m[i].cmd(&[b"PUBSUB", b"CHANNELS", pattern.as_bytes()]) {
        Ok(AdminReply::Array(a)) => a.len(),
        other => panic!("PUBSUB CHANNELS: {other:?}"),
    }
}

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

/// The linger of a channel nobody waits on (`chans::LINGER`).
const LINGER: Duration = Duration::from_secs(2);

/// (3, commit 7bad1c4; the simulation's seed 148 of `live_hot_fair_without_faults`.) A
/// fair single-owner waiter W (retry delay 10 s) waited for the key and gave up; its
/// channels linger (2 s) and its loop runs only in its calls. While W is idle, the holder
/// it waited for releases: the release is announced on the key's channel (W's refusals
/// marked the key; nobody stands in line now) and waits unread in W's subscription
/// connections. W calls `lock` again while H has the key on masters 0 and 1 (H's key on
/// master 2 deleted, so that W's attempt wins there and its cleanup shows when the attempt
/// is over). W reads the old announcement while its first attempt runs (it stands in no
/// local wait list yet: not its turn); the attempt is refused. Then H releases, and the
/// release names W, first in line: W must be granted at once, not at its retry delay.
///
/// Before the fix the old announcement, weighed when the attempt ended, freed the masters
/// where H had refused W but started nothing (not its turn), and H's release, which named
/// W, found no master left to free: W slept through its retry delay. Failed with: "W was
/// not granted within 3s of the holder's release, which named it (its retry delay is
/// 10s): a lost wake-up".
#[test]
fn a_fair_waiter_is_woken_by_its_turn_after_announcements_read_during_its_first_attempt() {
    let key = "turn-after-stale";
    let warm_for = Duration::from_secs(2);
    let m = masters(3);
    let mut other = Redlock::builder().masters(m.urls()).build().unwrap();
    let held = other.try_lock(key, TTL).unwrap();

    let mut w = Redlock::builder()
        .masters(m.urls())
        .node_timeout(Duration::from_secs(1))
        .retry_delay(FALLBACK)
        .retry_jitter(Duration::ZERO)
        .retry_count(3)
        .fairness(true)
        .build()
        .unwrap();
    let (warm_tx, warm_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (idle_tx, idle_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        // A wait in line that gives up: the key's channel and the client's own linger.
        let warm = w.lock_with_deadline(key, TTL, Instant::now() + warm_for);
        let ended = Instant::now();
        let _ = warm_tx.send(warm.map(drop));
        if go_rx.recv().is_err() {
            return;
        }
        let _ = idle_tx.send(ended.elapsed());
        let _ = tx.send(w.lock(key, TTL).map(|l| l.attempts()));
    });
    wait_until("W in line and subscribed", warm_for, || {
        (0..3).all(|i| {
            in_line(&m, i, key) == 1
                && subscribers(&m, i, &format!("redlock-mux:released:{key}")) == 1
                && channels(&m, i, "redlock-mux:next:*") == 1
        })
    });
    let r = warm_rx
        .recv_timeout(warm_for + PROMPT)
        .expect("W's first call");
    assert!(matches!(r, Err(Error::DeadlineExceeded(_))), "{r:?}");
    wait_until("W out of line", PROMPT, || {
        (0..3).all(|i| in_line(&m, i, key) == 0)
    });
    // While W is idle: the release, announced to W's lingering subscriptions.
    other.release(held).unwrap();
    // H holds the key on masters 0 and 1.
    let held = other.try_lock(key, TTL).unwrap();
    del_by_hand(&m, 2, key);
    let evals = command_calls(&m, 2, "evalsha");
    go_tx.send(()).unwrap();
    // The scenario needs W's subscriptions alive at its call: they linger 2 s from the end
    // of its last wait (a little before its call returned).
    let idle = idle_rx.recv_timeout(PROMPT).expect("W's call");
    assert!(
        idle < LINGER - Duration::from_millis(500),
        "W called {idle:?} after its last wait: its channels may no longer linger (the \
         machine was too slow for this test)"
    );
    // W's attempt and its cleanup on master 2: the attempt is over.
    wait_until("W's first attempt over (its cleanup)", PROMPT, || {
        command_calls(&m, 2, "evalsha") >= evals + 2
    });
    let released = Instant::now();
    other.release(held).unwrap();
    let r = rx.recv_timeout(PROMPT).unwrap_or_else(|_| {
        panic!(
            "W was not granted within {PROMPT:?} of the holder's release, which named it \
             (its retry delay is {FALLBACK:?}): a lost wake-up"
        )
    });
    let attempts = r.expect("W gets the lock");
    assert!(
        released.elapsed() < PROMPT,
        "granted {:?} after the release ({attempts} attempts)",
        released.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 4. A fair waiter out of line takes its place back
// ---------------------------------------------------------------------------------------

/// (4, commit 7bad1c4; the simulation's seed 1905 of `live_hot_fair_without_faults`.) H
/// holds the key. A fair waiter A (retry delay 10 s) reaches masters 1 and 2 through
/// proxies that hold its bytes: its first attempt is refused by master 0 and times out on
/// the others (no quorum for lack of masters), so its next attempt stands out of line
/// (issue 19, item 1). That attempt starts when master 0 confirms A's subscriptions; the
/// proxies then pass A's bytes, and it is refused by H everywhere: A reaches the masters
/// again, and must take its place back in line at once (at its arrival). B, a fair waiter
/// that asks after A, stands in line; H releases: A must be granted before B.
///
/// Before the fix A stayed out of line for its whole retry delay: the release named B,
/// who was granted first. Failed with: "granted out of arrival order (A back in line
/// before the release: false); left: [\"B\", \"A\"], right: [\"A\", \"B\"]".
#[test]
fn a_fair_waiter_whose_attempt_stood_out_of_line_takes_its_place_back() {
    let key = "out-and-back";
    let m = masters(3);
    let p1 = Proxy::start(m[1].addr()).unwrap();
    let p2 = Proxy::start(m[2].addr()).unwrap();
    let mut holder = Redlock::builder().masters(m.urls()).build().unwrap();
    let held = holder.try_lock(key, TTL).unwrap();
    let node_timeout = Duration::from_secs(2);
    let fair = |urls: Vec<String>| {
        Redlock::builder()
            .masters(urls)
            .node_timeout(node_timeout)
            .connect_timeout(Duration::from_secs(10))
            .stall_timeout(Duration::from_secs(60))
            .retry_delay(FALLBACK)
            .retry_jitter(Duration::ZERO)
            .retry_count(3)
            .fairness(true)
            .build_shared()
            .unwrap()
    };
    let a = fair(vec![m[0].url(), p1.url(), p2.url()]);
    // Its lock connections are up (no handshake held below).
    let g = a.try_lock("out-warm", TTL).wait().unwrap();
    g.release().wait().unwrap();

    let order = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let spawn = |c: &SharedRedlock, who: &'static str| {
        let pending = c.lock(key, TTL);
        let (order, tx) = (order.clone(), tx.clone());
        thread::spawn(move || {
            let r = pending.wait();
            if let Ok(g) = r {
                order.lock().unwrap().push(who);
                let _ = tx.send((who, g.release().wait()));
            } else {
                let _ = tx.send((who, r.map(drop)));
            }
        });
    };

    p1.set_mode(Mode::Hold);
    p2.set_mode(Mode::Hold);
    spawn(&a, "A");
    // The first attempt: refused by master 0, timed out on masters 1 and 2 (2 s), then
    // the next one (out of line) at master 0's confirmation, refused there.
    wait_until(
        "A's first attempt timed out, its second refused by master 0",
        node_timeout + PROMPT,
        || {
            let s = stats(&a);
            s[1].timed_out() >= 1 && s[2].timed_out() >= 1 && s[0].refused() >= 2
        },
    );
    // Masters 1 and 2 answer (the second attempt's round is still open): refused by H.
    p1.set_mode(Mode::PassThrough);
    p2.set_mode(Mode::PassThrough);
    wait_until(
        "A's second attempt refused by masters 1 and 2",
        PROMPT,
        || {
            let s = stats(&a);
            s[1].refused() >= 1 && s[2].refused() >= 1
        },
    );

    // B asks after A, and stands in line.
    let b = fair(m.urls());
    spawn(&b, "B");
    wait_until("B refused by every master", PROMPT, || {
        stats(&b).iter().all(|s| s.refused() >= 1)
    });
    // A takes its place back: two in line (A and B) on every master. Bounded: where it
    // does not, the grant order below says what that costs.
    let back = poll_until(PROMPT, || (0..3).all(|i| in_line(&m, i, key) == 2));
    let timed_out: Vec<u64> = stats(&a)[1..].iter().map(|s| s.timed_out()).collect();

    holder.release(held).unwrap();
    for _ in 0..2 {
        let (who, r) = rx
            .recv_timeout(FALLBACK + PROMPT)
            .expect("both waiters granted");
        r.unwrap_or_else(|e| panic!("{who}: {e}"));
    }
    // The scenario: only A's first attempt timed out (its second reached every master).
    assert_eq!(
        timed_out,
        vec![1, 1],
        "A's second attempt timed out too (the machine was too slow for this test)"
    );
    assert_eq!(
        *order.lock().unwrap(),
        vec!["A", "B"],
        "granted out of arrival order (A back in line before the release: {back})"
    );
}
