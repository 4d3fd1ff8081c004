//! The bugs of the core the deterministic simulation found (`tests/simulation.rs`), each
//! shown against real `redis-server` masters: every test here failed on the code before
//! its fix (commit 6e3d7d1; the failure messages are in each test's doc).
//!
//! 1. A failed attempt's cleanup sent to some masters only was freed before its requests
//!    were counted: a `-NOSCRIPT` to it was never retried with `EVAL`.
//!
//! The order of events each bug needs is forced with the fault proxy (a held connection
//! decides when a master answers) and checked on the masters (keys, lines, command
//! counts); no sleep makes it happen. Every wait is bounded by what it proves:
//! long retry delays and TTLs (10 s, 30 s and more) that nothing here waits for, against a
//! few seconds for what must happen at once.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use support::proxy::{Mode, Proxy};
use support::{get, masters, poll_until, wait_until, LocalMasters};

use redlock_mux::{LockGuard, Pending, Redlock, SharedRedlock};

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
