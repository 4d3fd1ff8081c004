//! No public API input panics: the builder, the lock calls, `HoldOptions` and the lost-lock
//! signal swept with extreme values (zero, one nanosecond, the largest TTL and just past
//! it, `Duration::MAX`, NaN and infinite fractions). Each case must return (a value or a
//! typed error); a panic names the case.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use redlock_mux::{Error, HoldOptions, Redlock, MAX_TTL};
use support::masters;

const DURATIONS: [Duration; 8] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_micros(999),
    Duration::from_millis(1),
    Duration::from_millis(1001),
    MAX_TTL,
    MAX_TTL.saturating_add(Duration::from_millis(1)),
    Duration::MAX,
];

const FRACTIONS: [f64; 9] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -1.0,
    -0.0,
    0.0,
    0.5,
    1.0,
    1e300,
];

/// Runs `f`, turning a panic into a test failure that names `case`.
fn no_panic<T>(case: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{case} panicked: {msg}");
        }
    }
}

#[test]
fn the_builder_takes_any_value_without_panicking() {
    let m = masters(1);
    let base = || Redlock::builder().masters(m.urls()).retry_count(0);
    type Set = fn(redlock_mux::Builder, Duration) -> redlock_mux::Builder;
    let setters: [(&str, Set); 7] = [
        ("node_timeout", |b, d| b.node_timeout(d)),
        ("connect_timeout", |b, d| b.connect_timeout(d)),
        ("stall_timeout", |b, d| b.stall_timeout(d)),
        ("min_validity", |b, d| b.min_validity(d)),
        ("retry_delay", |b, d| b.retry_delay(d)),
        ("retry_jitter", |b, d| b.retry_jitter(d)),
        ("amnesia_guard", |b, d| b.amnesia_guard(d)),
    ];
    let mut built = 0;
    for (name, set) in setters {
        for d in DURATIONS {
            let case = format!("{name}({d:?})");
            let r = no_panic(&case, || set(base(), d).build());
            match r {
                Ok(mut c) => {
                    built += 1;
                    // And the client works, or says why not.
                    no_panic(&format!("{case} then try_lock"), || {
                        match c.try_lock("api", Duration::from_secs(1)) {
                            Ok(lock) => {
                                let _ = c.release(lock);
                            }
                            Err(e) => assert!(!e.to_string().is_empty()),
                        }
                    });
                }
                Err(Error::Config(_)) => {}
                Err(e) => panic!("{case}: not a configuration error: {e:?}"),
            }
        }
    }
    assert!(built > 20, "most values are fine: {built}");
    for f in FRACTIONS {
        let case = format!("drift_factor({f})");
        let r = no_panic(&case, || base().drift_factor(f).build());
        assert!(
            r.is_ok() == (0.0..0.5).contains(&f),
            "{case}: {:?}",
            r.err()
        );
    }
    for n in [0, 1, u32::MAX] {
        no_panic(&format!("retry_count({n})"), || {
            base().retry_count(n).build()
        })
        .unwrap();
    }
}

#[test]
fn lock_calls_take_any_ttl_and_deadline_without_panicking() {
    let m = masters(1);
    let mut c = Redlock::builder()
        .masters(m.urls())
        .retry_count(1)
        .retry_delay(Duration::from_millis(1))
        .build()
        .unwrap();
    let now = Instant::now();
    let deadlines = [
        now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
        now,
        now + Duration::from_millis(50),
        now + Duration::from_secs(100 * 365 * 24 * 3600),
    ];
    for ttl in DURATIONS {
        let ok = ttl >= Duration::from_millis(3) && ttl <= MAX_TTL;
        let r = no_panic(&format!("try_lock({ttl:?})"), || c.try_lock("t", ttl));
        match r {
            Ok(mut lock) => {
                assert!(ok, "{ttl:?} accepted");
                for ext in DURATIONS {
                    let case = format!("extend({ext:?}) of a {ttl:?} lock");
                    let r = no_panic(&case, || c.extend(&mut lock, ext));
                    if let Err(e) = r {
                        assert!(
                            matches!(e, Error::InvalidArgument(_) | Error::Expired),
                            "{case}: {e:?}"
                        );
                    }
                }
                c.release(lock).unwrap();
            }
            Err(e) => assert!(
                !ok && matches!(e, Error::InvalidArgument(_)),
                "{ttl:?}: {e:?}"
            ),
        }
        for d in deadlines {
            let case = format!("lock_with_deadline({ttl:?}, now{:+?})", signed(d, now));
            let r = no_panic(&case, || c.lock_with_deadline("d", ttl, d));
            if let Ok(lock) = r {
                c.release(lock).unwrap();
            }
        }
        no_panic(&format!("lock_many({ttl:?})"), || {
            if let Ok(lock) = c.lock_many(["a", "b"], ttl) {
                c.release(lock).unwrap();
            }
        });
        let mut out = Vec::new();
        no_panic(&format!("try_lock_batch({ttl:?})"), || {
            let _ = c.try_lock_batch(&["x", "y"], ttl, &mut out);
        });
        let locks: Vec<_> = out.drain(..).filter_map(Result::ok).collect();
        let mut released = Vec::new();
        c.release_batch(locks, &mut released).unwrap();
    }
}

fn signed(t: Instant, now: Instant) -> f64 {
    if t >= now {
        (t - now).as_secs_f64()
    } else {
        -(now - t).as_secs_f64()
    }
}

#[test]
fn hold_options_and_the_signal_take_any_value_without_panicking() {
    let m = masters(1);
    // Rounds as patient as the 200 ms TTL allows (its default, 10 ms, times out on a loaded
    // machine): the test is about inputs, not speed.
    let mut c = Redlock::builder()
        .masters(m.urls())
        .retry_count(0)
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let ttl = Duration::from_millis(200);
    let mut cases = 0;
    for extend_at in FRACTIONS {
        for lost_at in FRACTIONS {
            let opts = HoldOptions {
                extend_at,
                lost_at,
                ..HoldOptions::default()
            };
            let case = format!("extend_at {extend_at}, lost_at {lost_at}");
            let lock = c.try_lock("h", ttl).unwrap();
            let held = no_panic(&case, || {
                c.hold(lock, ttl, opts, |signal| {
                    let _ = signal.is_lost();
                    signal.wait_lost(Duration::ZERO)
                })
            });
            assert!(!held.value, "{case}: lost at once");
            cases += 1;
        }
    }
    for (max_extensions, max_hold) in [
        (Some(0), Some(Duration::ZERO)),
        (Some(u32::MAX), Some(Duration::MAX)),
        (None, Some(Duration::from_nanos(1))),
    ] {
        let opts = HoldOptions {
            max_extensions,
            max_hold,
            ..HoldOptions::default()
        };
        let case = format!("max_extensions {max_extensions:?}, max_hold {max_hold:?}");
        let lock = c.try_lock("h", ttl).unwrap();
        no_panic(&case, || c.hold(lock, ttl, opts, |_| ()));
        cases += 1;
    }
    // `wait_lost(Duration::MAX)` returns when the lock is lost: no extension allowed, so
    // the signal fires the margin before validity ends.
    let opts = HoldOptions {
        max_extensions: Some(0),
        ..HoldOptions::default()
    };
    let lock = c.try_lock("h", ttl).unwrap();
    let t = Instant::now();
    let held = no_panic("wait_lost(Duration::MAX)", || {
        c.hold(lock, ttl, opts, |signal| signal.wait_lost(Duration::MAX))
    });
    assert!(held.value);
    assert!(t.elapsed() < ttl + Duration::from_secs(1));
    // Any TTL given to `hold` itself.
    for d in DURATIONS {
        let lock = c.try_lock("h", ttl).unwrap();
        let case = format!("hold(ttl {d:?})");
        no_panic(&case, || c.hold(lock, d, HoldOptions::default(), |_| ()));
        cases += 1;
    }
    assert!(cases > 90);
}
