//! Body of the `engine` fuzz target, shared by `fuzz/fuzz_targets/engine.rs` (libFuzzer)
//! and `tests/fuzz_engine_corpus.rs` (replays `fuzz/seeds/engine/` on every `cargo test`).
//!
//! Structure-aware: the input is one fan-out round over N masters, driven through the
//! sans-IO core exactly as the shell (`net.rs`) and the client (`client.rs`) drive it:
//! `rules::classify` on each reply frame (or `resp::parse` on raw reply bytes), a
//! `-NOSCRIPT` retried once with `EVAL`, `Tally::record`, `Tally::expire` when the round
//! times out, `judge_acquire` at the decision, `may_hold` for the cleanup release.
//!
//! Layout (missing bytes read as zero):
//!
//! | bytes | meaning |
//! | --- | --- |
//! | 0 | N = 1 + b % 7 masters |
//! | 1 | request: b % 4 = 0/3 acquire, 1 extend, 2 release |
//! | 2..10 | TTL in ns (u64 LE) modulo `MAX_TTL` + 1 (the client refuses more) |
//! | 10..18 | elapsed time before the first event, ns (u64 LE, any value) |
//! | 18 | drift factor = b / 256 * 0.5 (the client accepts `[0, 0.5)`) |
//! | 19..23 | minimum validity, µs (u32 LE) |
//! | 23.. | events: a master byte (b % 8: may be out of range), a kind byte, a payload |
//!
//! Kinds (`k % 16`): OK, null, integer (1 payload byte), error, NOSCRIPT, garbage frame
//! (1 payload byte), timeout (the round expires), disconnect, late duplicate of the
//! master's first answer, raw reply bytes (1 length byte + bytes, parsed by `resp::parse`),
//! connect failure, down, amnesiac, a `Pending` outcome, time passes (4 payload bytes),
//! protocol error.
//!
//! Properties: never panics; only `+OK` / `:1` (acquire) or a positive integer (release,
//! extend) classify as OK, and error replies as `Failed(Redis)`; `Acquired` only with at least a quorum of recorded OK
//! replies and a validity equal to `rules::validity`, above the minimum and never above
//! the TTL; every other verdict matches the tally; a master is counted at most once (the
//! first recorded outcome never changes, later ones are refused); yes + no + pending = N;
//! after `expire` nothing is pending and the round is decided; `may_hold` is true for every
//! master that answered OK (and every one that never answered).
#![allow(dead_code)]

use std::io::ErrorKind;
use std::time::Duration;

use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::rules::{
    self, judge_acquire, AcquireVerdict, Decision, ErrorText, Fault, Outcome, Request, Tally,
};
use redlock_mux::MAX_TTL;

/// Inputs beyond this are not more interesting.
const MAX_INPUT: usize = 4096;

struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.at += n;
        &self.data[start..end]
    }
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
}

const GARBAGE: &[Frame<'static>] = &[
    Frame::Simple(b"QUEUED"),
    Frame::Simple(b"ok"),
    Frame::Simple(b""),
    Frame::Bulk(b"OK"),
    Frame::Bulk(b""),
    Frame::Boolean(true),
    Frame::Boolean(false),
    Frame::Double(b"1"),
    Frame::BigNumber(b"1"),
    Frame::Verbatim {
        format: b"txt",
        text: b"OK",
    },
    Frame::Integer(2),
    Frame::Integer(-1),
];

/// What one event yields for the tally: `None` when nothing is recorded (a `-NOSCRIPT`
/// retried with `EVAL`, or raw bytes that are only a prefix of a frame).
fn frame_outcome(req: Request, frame: &Frame<'_>, eval: &mut bool) -> Option<Outcome> {
    let outcome = match rules::classify(req, frame) {
        Ok(o) => o,
        // Not a possible answer: the shell closes that connection.
        Err(()) => Outcome::Failed(Fault::Unexpected),
    };
    // Only a real yes may count as one: `+OK` or `:1` to SET / the acquire script, a
    // positive integer to the release and extend scripts.
    if outcome == Outcome::Ok {
        let yes = match (req, frame) {
            (Request::Acquire, Frame::Simple(s)) => *s == b"OK",
            (Request::Acquire, Frame::Integer(i)) => *i == 1,
            (Request::Release | Request::Extend, Frame::Integer(i)) => *i > 0,
            _ => false,
        };
        assert!(yes, "{frame:?} to {req:?} counted as OK");
    }
    if frame.is_error() {
        assert!(
            matches!(outcome, Outcome::Failed(Fault::Redis(_))),
            "error reply {frame:?} -> {outcome:?}"
        );
    }
    if let Outcome::Failed(Fault::Redis(t)) = outcome {
        if t.starts_with(b"NOSCRIPT") && !*eval {
            *eval = true;
            return None;
        }
    }
    Some(outcome)
}

/// The verdict must agree with the tally it was computed from.
fn check_verdict(
    tally: &Tally,
    first: &[Option<Outcome>],
    verdict: AcquireVerdict,
    ttl: Duration,
    elapsed: Duration,
    drift_factor: f64,
    min_validity: Duration,
) {
    let n = first.len();
    let oks = first.iter().filter(|o| **o == Some(Outcome::Ok)).count();
    assert_eq!(tally.yes(), oks, "yes votes vs recorded OK replies");
    match verdict {
        AcquireVerdict::Acquired(v) => {
            assert!(
                oks >= rules::quorum(n),
                "Acquired with {oks} OK replies of {n} (quorum {})",
                rules::quorum(n)
            );
            assert!(v <= ttl, "validity {v:?} above the TTL {ttl:?}");
            assert!(
                v > min_validity,
                "validity {v:?} not above {min_validity:?}"
            );
            assert_eq!(Some(v), rules::validity(ttl, elapsed, drift_factor));
        }
        AcquireVerdict::ValidityUsedUp => {
            assert!(oks >= rules::quorum(n));
            if let Some(v) = rules::validity(ttl, elapsed, drift_factor) {
                assert!(v <= min_validity);
            }
        }
        AcquireVerdict::Taken => {
            assert!(oks < rules::quorum(n));
            assert!(first.contains(&Some(Outcome::Taken)));
        }
        AcquireVerdict::NoQuorum => {
            assert!(oks < rules::quorum(n));
            assert!(!first.contains(&Some(Outcome::Taken)));
        }
    }
}

fn check_tally(tally: &Tally, first: &[Option<Outcome>]) {
    let n = first.len();
    assert_eq!(tally.outcomes().len(), n);
    let pending = first.iter().filter(|o| o.is_none()).count();
    assert_eq!(tally.pending(), pending);
    assert_eq!(tally.count(Outcome::Pending), pending);
    for (i, o) in first.iter().enumerate() {
        assert_eq!(
            tally.outcomes()[i],
            o.unwrap_or(Outcome::Pending),
            "master {i}"
        );
    }
    let need = tally.need();
    let expect = if tally.yes() >= need {
        Decision::Reached
    } else if tally.yes() + pending < need {
        Decision::Impossible
    } else {
        Decision::Open
    };
    assert_eq!(tally.decision(), expect);
}

/// The fuzz target body. Panics on a property violation.
pub fn engine_body(data: &[u8]) {
    if data.is_empty() || data.len() > MAX_INPUT {
        return;
    }
    let mut b = Bytes { data, at: 0 };
    let n = 1 + (b.u8() % 7) as usize;
    let req = match b.u8() % 4 {
        1 => Request::Extend,
        2 => Request::Release,
        _ => Request::Acquire,
    };
    let max_ttl = MAX_TTL.as_nanos() as u64;
    let ttl = Duration::from_nanos(b.u64() % (max_ttl + 1));
    let mut elapsed = Duration::from_nanos(b.u64());
    let drift_factor = b.u8() as f64 / 256.0 * 0.5;
    let min_validity = Duration::from_micros(b.u32() as u64);

    let quorum = rules::quorum(n);
    assert!(quorum <= n && 2 * quorum > n);
    let mut tally = Tally::new(n, quorum);
    // The first outcome recorded per master: our own bookkeeping, not the tally's.
    let mut first: Vec<Option<Outcome>> = vec![None; n];
    let mut eval = vec![false; n];
    let mut judged = false;
    let mut expired = false;
    let limits = Limits::default();

    let judge = |tally: &Tally, first: &[Option<Outcome>], elapsed: Duration| {
        let verdict = judge_acquire(tally, ttl, elapsed, drift_factor, min_validity);
        check_verdict(
            tally,
            first,
            verdict,
            ttl,
            elapsed,
            drift_factor,
            min_validity,
        );
        if !matches!(verdict, AcquireVerdict::Acquired(_)) {
            // The cleanup release goes to every master our SET may have reached.
            for (i, o) in tally.outcomes().iter().enumerate() {
                let hold = rules::may_hold(req, *o);
                match o {
                    Outcome::Ok | Outcome::Pending | Outcome::TimedOut => {
                        assert!(hold, "master {i} ({o:?}) must get the cleanup release")
                    }
                    Outcome::Taken | Outcome::NotHeld => assert!(!hold, "master {i} ({o:?})"),
                    _ => {}
                }
            }
        }
        verdict
    };

    while !b.done() {
        let m = (b.u8() % 8) as usize;
        let kind = b.u8();
        let outcome: Option<Outcome> = match kind % 16 {
            0 => {
                let f = match req {
                    Request::Acquire if kind & 0x10 == 0 => Frame::Simple(b"OK"),
                    _ => Frame::Integer(1),
                };
                frame_outcome(req, &f, eval.get_mut(m).unwrap_or(&mut true))
            }
            1 => {
                let f = [Frame::NullBulk, Frame::NullArray, Frame::Null][(kind as usize >> 4) % 3];
                frame_outcome(req, &f, eval.get_mut(m).unwrap_or(&mut true))
            }
            2 => {
                let v = match b.u8() {
                    250 => i64::MAX,
                    251 => i64::MIN,
                    252 => -1,
                    x => (x % 4) as i64,
                };
                frame_outcome(
                    req,
                    &Frame::Integer(v),
                    eval.get_mut(m).unwrap_or(&mut true),
                )
            }
            3 => {
                let f = if kind & 0x10 == 0 {
                    Frame::Error(b"ERR something went wrong")
                } else {
                    Frame::BulkError(b"WRONGTYPE Operation against a key")
                };
                frame_outcome(req, &f, eval.get_mut(m).unwrap_or(&mut true))
            }
            4 => frame_outcome(
                req,
                &Frame::Error(b"NOSCRIPT No matching script. Please use EVAL."),
                eval.get_mut(m).unwrap_or(&mut true),
            ),
            5 => {
                let f = GARBAGE[b.u8() as usize % GARBAGE.len()];
                frame_outcome(req, &f, eval.get_mut(m).unwrap_or(&mut true))
            }
            6 => {
                tally.expire();
                expired = true;
                for o in first.iter_mut() {
                    if o.is_none() {
                        *o = Some(Outcome::TimedOut);
                    }
                }
                assert_eq!(tally.pending(), 0, "nothing pending after expire");
                assert_ne!(tally.decision(), Decision::Open, "expired but open");
                None
            }
            7 => Some(Outcome::Failed(Fault::Closed(ErrorKind::ConnectionReset))),
            8 => {
                // A late duplicate: the master's first answer again.
                first.get(m).copied().flatten()
            }
            9 => {
                let len = b.u8() as usize % 64;
                let raw = b.take(len);
                match resp::parse(raw, &limits) {
                    Ok(Status::Complete((f, used))) => {
                        assert!(used > 0 && used <= raw.len());
                        frame_outcome(req, &f, eval.get_mut(m).unwrap_or(&mut true))
                    }
                    Ok(Status::Partial(_)) => None,
                    Err(e) => Some(Outcome::Failed(Fault::Protocol(e))),
                }
            }
            10 => Some(Outcome::Failed(Fault::Connect(
                ErrorKind::ConnectionRefused,
            ))),
            11 => Some(Outcome::Failed(Fault::Down)),
            12 => Some(Outcome::Failed(Fault::Amnesiac)),
            13 => Some(Outcome::Pending),
            14 => {
                elapsed = elapsed.saturating_add(Duration::from_micros(b.u32() as u64));
                None
            }
            _ => Some(Outcome::Failed(Fault::Redis(ErrorText::new(
                b"LOADING Redis is loading the dataset in memory",
            )))),
        };
        if let Some(o) = outcome {
            let fresh = m < n && first[m].is_none() && o != Outcome::Pending;
            let recorded = tally.record(m, o);
            assert_eq!(
                recorded,
                fresh,
                "record(master {m} of {n}, {o:?}) after {:?}",
                first.get(m)
            );
            if recorded {
                assert!(!expired, "recorded after expire");
                first[m] = Some(o);
            }
        }
        check_tally(&tally, &first);
        if !judged && tally.decision() != Decision::Open {
            // The client judges at the decision, like `Redlock::attempt`.
            judged = true;
            judge(&tally, &first, elapsed);
        }
    }
    // The round ends: whatever is still pending times out, and it is judged (again).
    tally.expire();
    for o in first.iter_mut() {
        if o.is_none() {
            *o = Some(Outcome::TimedOut);
        }
    }
    check_tally(&tally, &first);
    assert_ne!(tally.decision(), Decision::Open);
    judge(&tally, &first, elapsed);
}
