//! Bad API input (issue 6, item 5): every mistake a caller can make with the builder or
//! the lock calls is a typed error (`Error::Config` from `build`, `Error::InvalidArgument`
//! from a call) whose message names the problem, and nothing is sent to any master.
//!
//! Decided here: an even number of masters is ALLOWED, with the usual quorum N/2 + 1
//! (4 masters -> 3): it tolerates no more failures than N - 1 masters would, but it is
//! not unsafe (two quorums of N/2 + 1 always intersect).

mod support;

use std::time::{Duration, Instant};

use redlock_mux::{
    Builder, Error, Fault, HoldOptions, Outcome, Redlock, MAX_RESOURCE_LEN, MAX_TTL,
};
use support::fake::{Action, FakeServer};
use support::{masters, AdminReply};

/// A master that grants everything: `SET` -> `+OK`, scripts -> `:1`.
fn granting_fake() -> FakeServer {
    FakeServer::start(|cmd, _| {
        if cmd.is("SET") {
            Action::reply("+OK\r\n")
        } else if cmd.is("EVALSHA") || cmd.is("EVAL") {
            Action::reply(":1\r\n")
        } else {
            Action::Default
        }
    })
    .expect("fake server")
}

fn builder(urls: &[String]) -> Builder {
    Redlock::builder()
        .masters(urls)
        .node_timeout(Duration::from_millis(200))
        .retry_count(0)
}

/// The `Error::Config` message of a build that must fail; checks the Display prefix too.
fn config_error(b: Builder) -> String {
    match b.build() {
        Err(e @ Error::Config(_)) => {
            let shown = e.to_string();
            assert!(shown.starts_with("bad configuration: "), "{shown}");
            match e {
                Error::Config(m) => m,
                _ => unreachable!(),
            }
        }
        Err(e) => panic!("expected Error::Config, got {e:?}"),
        Ok(c) => panic!("expected Error::Config, got a client {c:?}"),
    }
}

/// The `Error::InvalidArgument` message of a call that must fail.
fn invalid<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(e @ Error::InvalidArgument(_)) => {
            let shown = e.to_string();
            assert!(shown.starts_with("invalid argument: "), "{shown}");
            match e {
                Error::InvalidArgument(m) => m,
                _ => unreachable!(),
            }
        }
        other => panic!("expected Error::InvalidArgument, got {other:?}"),
    }
}

/// `msg` mentions every word (case-insensitive).
fn assert_names(msg: &str, words: &[&str]) {
    let lower = msg.to_lowercase();
    for w in words {
        assert!(
            lower.contains(&w.to_lowercase()),
            "message {msg:?} does not name {w:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The builder
// ---------------------------------------------------------------------------------------

#[test]
fn no_masters() {
    let m = config_error(Redlock::builder());
    assert_names(&m, &["no masters"]);
    match Redlock::new(Vec::<String>::new()) {
        Err(Error::Config(m)) => assert_names(&m, &["no masters"]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn duplicate_masters_are_refused() {
    // Nothing listens on these ports: `build` never connects, it only parses. It does not
    // resolve either: a name and an address of one server (`localhost:7001` and
    // `127.0.0.1:7001`) are caught at the handshake by their `run_id`
    // (tests/transports.rs, `a_name_and_an_address_of_one_server_vote_once`).
    let same: &[(&str, &str)] = &[
        ("redis://127.0.0.1:7001", "redis://127.0.0.1:7001"),
        ("redis://127.0.0.1:7001", "127.0.0.1:7001"),
        ("redis://[::1]:7001", "[0:0::1]:7001"),
        ("redis://localhost:7001", "LOCALHOST:7001"),
        (
            "redis://:pw@127.0.0.1:7001",
            "redis://user:other@127.0.0.1:7001/0",
        ),
        (
            "unix:///tmp/r7001.sock",
            "redis+unix:///tmp/r7001.sock?db=1",
        ),
    ];
    for (a, b) in same {
        let urls = [a.to_string(), "127.0.0.1:7002".into(), b.to_string()];
        let m = config_error(builder(&urls));
        assert_names(&m, &["given twice", "7001", "independent"]);
        assert!(
            !m.contains("pw") && !m.contains("other"),
            "password shown: {m}"
        );
        assert!(
            !m.contains("pw") && !m.contains("other"),
            "password shown: {m}"
        );
    }
    // Different ports are different masters.
    let urls = ["127.0.0.1:7001".to_string(), "127.0.0.1:7002".into()];
    let c = builder(&urls).build().expect("distinct masters");
    assert_eq!(c.quorum(), 2);
}

/// Was an engine bug (fixed): two databases of one `redis-server` are accepted as two masters
/// (`build` compares the address *and* the database number). They share one process, one
/// failure domain and one restart: with `host:P/0`, `host:P/1` and one other master, the
/// single server P is a quorum on its own, and its restart without persistence forgets
/// two votes at once. Expected: `Error::Config` like any duplicate ("each master must be
/// independent").
#[test]
fn two_databases_of_one_server_are_one_master() {
    let urls = [
        "redis://127.0.0.1:7001/0".to_string(),
        "redis://127.0.0.1:7001/1".into(),
        "redis://127.0.0.1:7002".into(),
    ];
    let m = config_error(builder(&urls));
    assert_names(&m, &["given twice", "7001"]);
}

#[test]
fn unparseable_urls() {
    let cases: &[(&str, &[&str])] = &[
        ("redis://", &["no host"]),
        ("", &["no host"]),
        ("host", &["no port", "host:port"]),
        ("host:99999", &["bad port", "99999"]),
        ("redis://host:0", &["bad port"]),
        ("redis://host:notaport", &["bad port", "notaport"]),
        (
            "http://h:1",
            &["unsupported scheme", "http://h:1", "unix://"],
        ),
        ("redis://h:1/x", &["bad database", "x"]),
        ("redis+cluster://h:1/2", &["database 2", "database 0 only"]),
        ("redis+cluster://h:1,", &["empty seed"]),
        ("redis://[::1:6379", &["unclosed"]),
        // A socket path is not a database number.
        ("/tmp/redis.sock", &["unix socket", "unix:///"]),
        ("redis:///tmp/redis.sock", &["unix socket", "unix:///"]),
        ("unix://tmp/redis.sock", &["absolute"]),
        ("unix:///tmp/r.sock?db=x", &["bad database", "x"]),
        (
            "unix:///tmp/r.sock?colour=blue",
            &["unknown parameter", "colour"],
        ),
    ];
    for (url, words) in cases {
        let m = config_error(builder(&[url.to_string()]));
        assert_names(&m, words);
    }
    // A password in a bad URL is never echoed.
    for url in [
        "http://app:s3cret@h:1",
        "unix:///r.sock?password=s3cret&db=x",
    ] {
        let m = config_error(builder(&[url.to_string()]));
        assert!(!m.contains("s3cret"), "password shown: {m}");
    }
}

/// `rediss://` without the `tls` feature is a configuration error that says so; with it,
/// TLS options without a `rediss://` master are one (a `redis://` typo would send the
/// password in clear).
#[test]
fn tls_needs_its_feature_and_a_rediss_master() {
    #[cfg(not(feature = "tls"))]
    {
        let m = config_error(builder(&["rediss://app:s3cret@h:1".to_string()]));
        assert_names(&m, &["rediss://", "tls", "feature"]);
        assert!(!m.contains("s3cret"), "password shown: {m}");
    }
    #[cfg(feature = "tls")]
    {
        let m = config_error(
            builder(&["redis://127.0.0.1:7001".to_string()]).tls_ca_file("/nonexistent/ca.pem"),
        );
        assert_names(&m, &["tls_ca_file", "rediss://"]);
        let m = config_error(
            builder(&["rediss://127.0.0.1:7001".to_string()]).tls_ca_file("/nonexistent/ca.pem"),
        );
        assert_names(&m, &["tls_ca_file", "/nonexistent/ca.pem"]);
        let m = config_error(
            builder(&["rediss://127.0.0.1:7001".to_string()])
                .tls_client_cert("/nonexistent/c.pem", "/nonexistent/k.pem"),
        );
        assert_names(&m, &["tls_client_cert", "/nonexistent/c.pem"]);
    }
}

/// A host name that does not resolve is not a build error: the master is down, reported
/// as such, while the others work (see tests/transports.rs for a quorum around one).
#[test]
fn unresolvable_host() {
    let t = Instant::now();
    let mut c = builder(&["redis://no-such-host.invalid:6379".to_string()])
        .build()
        .expect("a name is resolved at connect, not at build");
    let e = c.try_lock("x", Duration::from_secs(5)).unwrap_err();
    let report = e.report().expect("a report");
    let (name, outcome) = report.outcomes().next().unwrap();
    assert_eq!(name, "no-such-host.invalid:6379");
    assert!(
        matches!(
            outcome,
            Outcome::Failed(Fault::Resolve(_)) | Outcome::TimedOut
        ),
        "{report}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn drift_factor_out_of_range() {
    let urls = ["127.0.0.1:7001".to_string()];
    for f in [-0.01, 0.5, 1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let m = config_error(builder(&urls).drift_factor(f));
        assert_names(&m, &["drift factor", "[0, 0.5)"]);
    }
    for f in [0.0, 0.01, 0.49] {
        builder(&urls)
            .drift_factor(f)
            .build()
            .unwrap_or_else(|e| panic!("drift factor {f}: {e}"));
    }
}

#[test]
fn zero_timeouts() {
    let urls = ["127.0.0.1:7001".to_string()];
    let m = config_error(builder(&urls).node_timeout(Duration::ZERO));
    assert_names(&m, &["node timeout", "zero"]);
    let m = config_error(builder(&urls).connect_timeout(Duration::ZERO));
    assert_names(&m, &["timeout", "zero"]);
    let m = config_error(builder(&urls).stall_timeout(Duration::ZERO));
    assert_names(&m, &["timeout", "zero"]);
}

/// Was a minor finding (fixed): for a zero connect or stall timeout the message is "timeouts
/// must be above zero", which does not say which of the two is zero.
#[test]
fn zero_timeout_message_names_the_timeout() {
    let urls = ["127.0.0.1:7001".to_string()];
    let m = config_error(builder(&urls).connect_timeout(Duration::ZERO));
    assert_names(&m, &["connect"]);
    let m = config_error(builder(&urls).stall_timeout(Duration::ZERO));
    assert_names(&m, &["stall"]);
}

// ---------------------------------------------------------------------------------------
// An even number of masters: allowed, quorum N/2 + 1.
// ---------------------------------------------------------------------------------------

#[test]
fn even_number_of_masters_uses_a_strict_majority() {
    let urls = ["127.0.0.1:7001".to_string(), "127.0.0.1:7002".into()];
    assert_eq!(builder(&urls).build().unwrap().quorum(), 2);

    let mut m = masters(4);
    let mut c = builder(&m.urls()).build().expect("4 masters are allowed");
    assert_eq!(c.quorum(), 3);
    let lock = c.try_lock("even", Duration::from_secs(10)).expect("lock");
    let holders = (0..4)
        .filter(|&i| {
            m[i].cmd(&[b"GET", b"even"]).unwrap()
                == AdminReply::Bulk(Some(lock.token().as_bytes().to_vec()))
        })
        .count();
    assert!(holders >= 3, "held on {holders} of 4");
    c.release(lock).expect("release");

    // One of four frozen: three still make a quorum.
    m[3].freeze().unwrap();
    let lock = c
        .try_lock("even-1-down", Duration::from_secs(10))
        .expect("3 of 4");
    c.release(lock).expect("release");
    m[3].thaw().unwrap();

    // Two of four down: two OKs are not a quorum of four.
    m[2].kill().unwrap();
    m[3].kill().unwrap();
    let e = c
        .try_lock("even-2-down", Duration::from_secs(10))
        .expect_err("2 of 4 is no quorum");
    assert!(matches!(e, Error::NoQuorum(_)), "{e}");
    let r = e.report().unwrap();
    assert_eq!(r.quorum(), 3, "{e}");
    // Decided as soon as the two dead masters failed: the live ones are ok or had not
    // answered yet, never blamed.
    assert!(r.ok() <= 2, "{e}");
    assert_eq!(r.unavailable().count(), 2, "{e}");
    assert_eq!(
        r.outcomes()
            .filter(|(_, o)| matches!(o, redlock_mux::Outcome::Ok | redlock_mux::Outcome::Pending))
            .count(),
        2,
        "{e}"
    );
    for i in 0..2 {
        let got = m[i].cmd(&[b"GET", b"even-2-down"]).unwrap();
        let released = support::poll_until(Duration::from_secs(2), || {
            m[i].cmd(&[b"GET", b"even-2-down"]).unwrap() == AdminReply::Bulk(None)
        });
        assert!(released, "the partial lock stays on master {i}: {got:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Lock calls
// ---------------------------------------------------------------------------------------

#[test]
fn bad_ttls_are_refused_before_anything_is_sent() {
    let fake = granting_fake();
    let mut c = builder(&[fake.url()]).build().unwrap();
    let below = [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::from_nanos(999_999),
    ];
    for ttl in below {
        let m = invalid(c.try_lock("r", ttl));
        assert_names(&m, &["ttl", "below the 1 ms"]);
        let m = invalid(c.lock("r", ttl));
        assert_names(&m, &["ttl", "below the 1 ms"]);
        let m = invalid(c.lock_with_deadline("r", ttl, Instant::now() + Duration::from_secs(1)));
        assert_names(&m, &["ttl", "below the 1 ms"]);
        let m = invalid(c.lock_many(["a", "b"], ttl));
        assert_names(&m, &["ttl", "below the 1 ms"]);
        let m = invalid(c.run_locked("r", ttl, |_| ()));
        assert_names(&m, &["ttl", "below the 1 ms"]);
    }
    let above = [
        MAX_TTL + Duration::from_millis(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ];
    for ttl in above {
        let m = invalid(c.try_lock("r", ttl));
        assert_names(&m, &["ttl", "above the maximum"]);
        let m = invalid(c.lock_many(["a", "b"], ttl));
        assert_names(&m, &["ttl", "above the maximum"]);
    }
    // 2 ms: the drift allowance (2 ms + 1%) leaves nothing.
    for ttl in [Duration::from_millis(1), Duration::from_millis(2)] {
        let m = invalid(c.try_lock("r", ttl));
        assert_names(&m, &["leaves no validity", "drift"]);
    }
    assert_eq!(fake.count("SET"), 0, "a refused call must send nothing");
    assert_eq!(fake.count("EVALSHA"), 0, "a refused call must send nothing");

    // The largest TTL is expressed exactly: PX 2147483647.
    let lock = c.try_lock("max", MAX_TTL).expect("MAX_TTL is allowed");
    let set = fake
        .commands()
        .into_iter()
        .find(|cmd| cmd.is("SET"))
        .expect("a SET");
    assert_eq!(set.arg(5), b"2147483647", "{set:?}");
    // Extend checks its TTL the same way, before sending anything.
    let mut lock = lock;
    for ttl in [
        Duration::ZERO,
        MAX_TTL + Duration::from_millis(1),
        Duration::from_millis(2),
    ] {
        let m = invalid(c.extend(&mut lock, ttl));
        assert_names(&m, &["ttl"]);
    }
    assert_eq!(fake.count("EVALSHA"), 0);
    c.release(lock).unwrap();
}

#[test]
fn ttl_without_room_for_the_minimum_validity() {
    let fake = granting_fake();
    let mut c = builder(&[fake.url()])
        .min_validity(Duration::from_secs(5))
        .build()
        .unwrap();
    let m = invalid(c.try_lock("r", Duration::from_secs(5)));
    assert_names(&m, &["leaves no validity", "minimum validity"]);
    assert_eq!(fake.count("SET"), 0);
}

#[test]
fn ttl_above_the_amnesia_guards_max_ttl() {
    let fake = granting_fake();
    let mut c = builder(&[fake.url()])
        .amnesia_guard(Duration::from_secs(1))
        .build()
        .unwrap();
    let m = invalid(c.try_lock("r", Duration::from_secs(2)));
    assert_names(&m, &["ttl", "amnesia guard", "max_ttl"]);
    assert_eq!(fake.count("SET"), 0);
}

#[test]
fn empty_and_oversized_resource_names() {
    let fake = granting_fake();
    let mut c = builder(&[fake.url()]).build().unwrap();
    let ttl = Duration::from_secs(5);
    assert_names(&invalid(c.try_lock("", ttl)), &["resource", "empty"]);
    assert_names(&invalid(c.lock("", ttl)), &["resource", "empty"]);
    assert_names(
        &invalid(c.lock_many(["a", ""], ttl)),
        &["resource", "empty"],
    );
    let too_long = vec![b'x'; MAX_RESOURCE_LEN + 1];
    let m = invalid(c.try_lock(&too_long, ttl));
    assert_names(&m, &["resource", "4097 bytes", "maximum 4096"]);
    let m = invalid(c.lock_many([&b"a"[..], &too_long], ttl));
    assert_names(&m, &["4097 bytes"]);
    assert_names(
        &invalid(c.lock_many(Vec::<&str>::new(), ttl)),
        &["no resource"],
    );
    assert_names(
        &invalid(c.lock_many(["a", "b", "a"], ttl)),
        &["same resource", "twice"],
    );
    assert_eq!(fake.count("SET"), 0);
    assert_eq!(fake.count("EVALSHA"), 0);

    // Exactly the maximum is fine, and sent as it is.
    let longest = vec![b'y'; MAX_RESOURCE_LEN];
    let lock = c
        .try_lock(&longest, ttl)
        .expect("MAX_RESOURCE_LEN is allowed");
    assert_eq!(
        fake.commands().iter().find(|c| c.is("SET")).unwrap().arg(1),
        &longest[..]
    );
    c.release(lock).unwrap();
}

/// `retry_count(0)`: exactly one attempt, one round (one `SET`). With `retry_count(2)`,
/// three (a call that may wait asks with the script that answers the holder's remaining
/// TTL, `ACQUIRE_WAIT`, instead of `SET`).
#[test]
fn zero_retries_means_exactly_one_attempt() {
    let wait_sha = redlock_mux::scripts::ACQUIRE_WAIT.sha.as_bytes();
    for retries in [0u32, 2] {
        let fake = FakeServer::start(move |cmd, _| {
            if cmd.is("SET") {
                Action::reply("$-1\r\n") // taken
            } else if cmd.is("EVALSHA") && cmd.arg(1) == wait_sha {
                Action::reply(":5000\r\n") // taken, 5 s left
            } else {
                Action::Default
            }
        })
        .unwrap();
        let mut c = Redlock::builder()
            .masters([fake.url()])
            .retry_count(retries)
            .retry_delay(Duration::from_millis(2))
            .retry_jitter(Duration::from_millis(1))
            .build()
            .unwrap();
        let e = c
            .lock("busy", Duration::from_secs(5))
            .expect_err("always taken");
        assert!(matches!(e, Error::Taken(_)), "{e}");
        let r = e.report().unwrap();
        assert_eq!(r.attempts(), retries + 1, "{e}");
        assert_eq!(r.outcomes().next().unwrap().1, Outcome::Taken);
        let evalsha = |sha: &[u8]| {
            fake.commands()
                .iter()
                .filter(|c| c.is("EVALSHA") && c.arg(1) == sha)
                .count()
        };
        let acquires = if retries == 0 {
            fake.count("SET")
        } else {
            evalsha(wait_sha)
        };
        assert_eq!(acquires, retries as usize + 1, "retries {retries}");
        // A refused attempt set nothing: no cleanup release; a call that waited (stood in
        // the key's line) leaves the line with one release at its end.
        let release = redlock_mux::scripts::RELEASE.sha.as_bytes();
        let leaves = usize::from(retries > 0);
        // (Written as the call ends: allow the fake server to read it.)
        support::wait_until("the leave release", Duration::from_secs(5), || {
            evalsha(release) >= leaves
        });
        assert_eq!(evalsha(release), leaves, "retries {retries}");
        assert_eq!(
            fake.count("EVALSHA"),
            acquires * usize::from(retries > 0) + leaves
        );
        assert_eq!(c.stats()[0].connects(), 1);
    }
}

/// `amnesia_guard(0)` is accepted by `build` but then refuses every TTL; the error says
/// why. (A `Config` error at build time would be clearer; noted in the report.)
#[test]
fn zero_amnesia_guard_is_refused_at_build() {
    let urls = ["127.0.0.1:7001".to_string()];
    let m = config_error(builder(&urls).amnesia_guard(Duration::ZERO));
    assert_names(&m, &["amnesia guard", "max_ttl", "zero"]);
}

/// Against a master nobody listens on: `run_locked_with` still refuses a bad TTL first, and
/// a good call fails at once with a typed per-master fault, not a panic or a hang.
#[test]
fn unreachable_master_is_a_typed_fault() {
    // A port nothing listens on: bind, learn the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = builder(&[format!("127.0.0.1:{port}")]).build().unwrap();
    let m = invalid(c.run_locked_with("r", Duration::ZERO, HoldOptions::default(), |_| ()));
    assert_names(&m, &["ttl"]);
    let t = Instant::now();
    let e = c
        .try_lock("r", Duration::from_secs(5))
        .expect_err("nobody listens");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let (_, o) = e.report().expect("report").outcomes().next().unwrap();
    assert!(
        matches!(o, Outcome::Failed(Fault::Connect(_) | Fault::Down)),
        "{e}"
    );
}
