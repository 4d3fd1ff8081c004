//! Masters over other transports than plain TCP to an IP literal (issue 13): TLS
//! (`rediss://`, feature `tls`) against real `redis-server --tls-port` with certificates
//! the harness makes (`local::TestCerts`, the `openssl` command); Unix sockets
//! (`unix://`, `redis+unix://`); and host names, resolved at every connect on a helper
//! thread, so that one that does not resolve is a master down, not a build error.

mod support;

use std::time::Duration;

use redlock_mux::local::{AdminReply, LocalMaster, LocalMasters};
use redlock_mux::{Builder, Error, Fault, Outcome, Redlock};
use support::{masters, poll_until};

const TTL: Duration = Duration::from_secs(10);

/// One lock and release, so that every master is connected: the single-owner client runs
/// its loop only inside its calls, so a master still connecting (resolving, shaking hands)
/// when a round is decided gets that round's request at the client's next call.
fn warm_up(c: &mut Redlock) {
    let lock = c.try_lock("warm-up", TTL).unwrap();
    c.release(lock).unwrap();
    assert!(
        poll_until(Duration::from_secs(5), || {
            let lock = c.try_lock("warm-up", TTL).unwrap();
            c.release(lock).unwrap();
            // Connected is not enough (TLS shakes hands after the TCP connect): every master
            // has answered a request.
            c.stats().iter().all(|s| s.connects() == 1 && s.ok() > 0)
        }),
        "{:?}",
        c.stats()
    );
}

fn builder<S: AsRef<str>>(urls: &[S]) -> Builder {
    Redlock::builder()
        .masters(urls)
        .retry_count(0)
        // Generous: a first round connects (and shakes hands) on a loaded test machine.
        .node_timeout(Duration::from_secs(2))
}

/// The key `resource` holds `token` on master `m`, at once or within a second: a round
/// is decided at the quorum-th answer, and the last master may still be on its way.
fn holds(m: &LocalMaster, resource: &str, token: &[u8]) -> bool {
    let want = AdminReply::Bulk(Some(token.to_vec()));
    poll_until(Duration::from_secs(1), || {
        m.cmd(&[b"GET", resource.as_bytes()]).unwrap() == want
    })
}

/// No key `resource` on master `m` (within a second, as for [`holds`]).
fn absent(m: &LocalMaster, resource: &str) -> bool {
    poll_until(Duration::from_secs(1), || {
        m.cmd(&[b"EXISTS", resource.as_bytes()]).unwrap() == AdminReply::Int(0)
    })
}

/// Database `db` of master `m` holds one key (within a second).
fn one_key_in(m: &LocalMaster, db: u32) -> bool {
    let want = format!("db{db}:keys=1");
    poll_until(Duration::from_secs(1), || {
        let info = m.cmd(&[b"INFO", b"keyspace"]).unwrap();
        info.as_str().unwrap_or("").contains(&want)
    })
}

// ---------------------------------------------------------------------------------------
// Unix sockets
// ---------------------------------------------------------------------------------------

#[test]
fn lock_and_release_over_unix_sockets() {
    let m = LocalMasters::start_unix(3, &[]).expect("unix-socket masters");
    let mut urls = m.urls();
    assert!(urls.iter().all(|u| u.starts_with("unix:///")), "{urls:?}");
    // Both spellings of the scheme.
    urls[1] = urls[1].replacen("unix://", "redis+unix://", 1);
    let mut c = builder(&urls).build().unwrap();
    let names: Vec<&str> = c.masters().collect();
    assert!(
        names[0].starts_with("unix:/") && names[0].ends_with("/redis.sock"),
        "{names:?}"
    );
    let lock = c.try_lock("unix-lock", TTL).unwrap();
    for master in &m {
        assert!(holds(master, "unix-lock", lock.token().as_bytes()));
    }
    c.release(lock).unwrap();
    for master in &m {
        assert!(absent(master, "unix-lock"));
    }
}

/// `?db=N&password=P`: AUTH and SELECT on a Unix socket, like on TCP.
#[test]
fn unix_socket_with_database_and_password() {
    let m = LocalMasters::start_unix(3, &["--requirepass", "s3cr&t"]).unwrap();
    let urls: Vec<String> = m
        .iter()
        .map(|x| {
            format!(
                "unix://{}?db=2&password=s3cr%26t",
                x.socket_path().display()
            )
        })
        .collect();
    let mut c = builder(&urls).build().unwrap();
    warm_up(&mut c);
    let lock = c.try_lock("unix-db", TTL).unwrap();
    for master in &m {
        assert!(one_key_in(master, 2), "no key in db 2");
        assert!(absent(master, "unix-db"), "the key went to db 0");
    }
    c.release(lock).unwrap();
    // A wrong password is a refused handshake, reported per master.
    let urls: Vec<String> = m
        .iter()
        .map(|x| format!("unix://{}?password=wrong", x.socket_path().display()))
        .collect();
    let mut c = builder(&urls).build().unwrap();
    let e = c.try_lock("unix-db", TTL).unwrap_err();
    let report = e.report().expect("report").to_string();
    assert!(report.contains("handshake refused"), "{report}");
}

/// A master whose socket is gone is down (connect failed, backoff), and comes back after a
/// restart.
#[test]
fn unix_socket_master_down_and_back() {
    let mut m = LocalMasters::start_unix(3, &[]).unwrap();
    let mut c = builder(&m.urls()).build().unwrap();
    warm_up(&mut c);
    let lock = c.try_lock("unix-down", TTL).unwrap();
    c.release(lock).unwrap();
    m[0].kill().unwrap();
    let _ = std::fs::remove_file(m[0].socket_path());
    // The old connection is found reset, then reconnects find no socket.
    assert!(
        poll_until(Duration::from_secs(5), || {
            let lock = c.try_lock("unix-down", TTL).unwrap();
            c.release(lock).unwrap();
            c.stats()[0].last_fault() == Some(Fault::Connect(std::io::ErrorKind::NotFound))
        }),
        "{:?}",
        c.stats()[0]
    );
    let e = {
        m[1].freeze().unwrap();
        let e = c.try_lock("unix-down", Duration::from_secs(1)).unwrap_err();
        m[1].thaw().unwrap();
        e
    };
    let report = e.report().expect("report");
    let (name, outcome) = report.outcomes().next().unwrap();
    assert!(name.starts_with("unix:/"), "{name}");
    assert!(
        matches!(outcome, Outcome::Failed(Fault::Connect(_) | Fault::Down)),
        "{report}"
    );
    m[0].restart().unwrap();
    assert!(
        poll_until(Duration::from_secs(5), || c
            .try_lock("unix-back", TTL)
            .map(|l| c.release(l).is_ok())
            .unwrap_or(false)
            && c.stats()[0].connects() >= 2),
        "master 0 never came back: {:?}",
        c.stats()[0]
    );
}

// ---------------------------------------------------------------------------------------
// Host names
// ---------------------------------------------------------------------------------------

#[test]
fn masters_given_by_host_name() {
    let m = masters(3);
    let urls: Vec<String> = m
        .iter()
        .map(|x| format!("localhost:{}", x.port()))
        .collect();
    let mut c = builder(&urls).build().unwrap();
    warm_up(&mut c);
    let lock = c.try_lock("by-name", TTL).unwrap();
    for master in &m {
        assert!(holds(master, "by-name", lock.token().as_bytes()));
    }
    c.release(lock).unwrap();
    // Reconnects resolve again.
    let mut m = m;
    m[0].restart().unwrap();
    assert!(poll_until(Duration::from_secs(5), || {
        c.try_lock("by-name", TTL)
            .map(|l| c.release(l).is_ok())
            .unwrap_or(false)
            && c.stats()[0].connects() >= 2
    }));
}

/// A master whose host does not resolve is down: locks go through on the other two
/// (quorum 2 of 3), and a report names it with the resolver's reason.
#[test]
fn an_unresolvable_master_is_down_not_a_build_error() {
    let m = masters(2);
    let urls = vec![
        m[0].url(),
        "redis://does-not-exist.invalid:6379".to_string(),
        m[1].url(),
    ];
    let mut c = builder(&urls)
        .build()
        .expect("resolved at connect, not at build");
    // Rounds are decided by the other two, whether or not the resolver answered yet.
    assert!(
        poll_until(Duration::from_secs(10), || {
            let lock = c.try_lock("unresolved", TTL).unwrap();
            c.release(lock).unwrap();
            matches!(c.stats()[1].last_fault(), Some(Fault::Resolve(_)))
        }),
        "{:?}",
        c.stats()[1]
    );
    assert_eq!(c.stats()[1].connects(), 0);
    // A round that waits for every master (one frozen) reports the unresolvable one.
    let mut m = m;
    m[1].freeze().unwrap();
    let mut short = Redlock::builder()
        .masters(&urls)
        .retry_count(0)
        .node_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let e = short.try_lock("unresolved", TTL).unwrap_err();
    m[1].thaw().unwrap();
    let report = e.report().unwrap();
    let (name, outcome) = report.outcomes().nth(1).unwrap();
    assert_eq!(name, "does-not-exist.invalid:6379");
    assert!(
        matches!(outcome, Outcome::Failed(Fault::Resolve(_))),
        "{report}"
    );
    assert!(
        report.to_string().contains("cannot resolve host"),
        "{report}"
    );
}

/// One server as `localhost:P` and as `127.0.0.1:P` is not refused by `build` (it does not
/// resolve), but the handshake's `run_id` check refuses its second vote: with the third
/// master frozen, an extend has one real server behind it and fails.
#[test]
fn a_name_and_an_address_of_one_server_vote_once() {
    let mut m = masters(2);
    let urls = vec![m[0].url(), format!("localhost:{}", m[0].port()), m[1].url()];
    let mut c = builder(&urls).build().unwrap();
    let mut lock = c.try_lock("aliased", TTL).unwrap();
    m[1].freeze().unwrap();
    let r = c.extend(&mut lock, TTL);
    m[1].thaw().unwrap();
    match r {
        Err(Error::NoQuorum(report)) => {
            assert!(report.to_string().contains("same server"), "{report}");
        }
        other => panic!("one server voted twice: {other:?}"),
    }
    c.release(lock).unwrap();
}

// ---------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use redlock_mux::local::TestCerts;
    use redlock_mux::TlsFault;

    fn certs() -> TestCerts {
        TestCerts::generate().unwrap_or_else(|e| panic!("test certificates: {e}"))
    }

    fn tls_masters(n: usize, certs: &TestCerts, extra: &[&str]) -> LocalMasters {
        LocalMasters::start_tls(n, certs, extra)
            .unwrap_or_else(|e| panic!("cannot start {n} TLS masters: {e}"))
    }

    /// The TLS faults of a failed round: every master that answered failed with one, and
    /// enough did to make the quorum impossible (the round is decided then, so the last
    /// master may not have answered yet).
    fn tls_faults(e: &Error) -> Vec<TlsFault> {
        let report = e.report().unwrap_or_else(|| panic!("no report: {e}"));
        let faults: Vec<TlsFault> = report
            .outcomes()
            .filter(|(_, o)| *o != Outcome::Pending)
            .map(|(name, o)| match o {
                Outcome::Failed(Fault::Tls(t)) => t,
                other => panic!("{name}: expected a TLS fault, got {other} ({report})"),
            })
            .collect();
        assert!(faults.len() >= 2, "{report}");
        faults
    }

    /// Every fault is `want`.
    fn all(faults: &[TlsFault], want: TlsFault) -> bool {
        faults.iter().all(|f| *f == want)
    }

    #[test]
    fn lock_and_release_over_tls() {
        let certs = certs();
        let mut m = tls_masters(3, &certs, &[]);
        let mut urls = m.urls();
        assert!(urls.iter().all(|u| u.starts_with("rediss://127.0.0.1:")));
        // By name too: SNI and a DNS SAN instead of an IP SAN.
        urls[2] = format!("rediss://localhost:{}", m[2].port());
        let mut c = builder(&urls).tls_ca_file(certs.ca_cert()).build().unwrap();
        warm_up(&mut c);
        let lock = c.try_lock("tls-lock", TTL).unwrap();
        for master in &m {
            assert!(
                holds(master, "tls-lock", lock.token().as_bytes()),
                "{master:?} {:?}",
                c.stats()
            );
        }
        c.release(lock).unwrap();
        for master in &m {
            assert!(absent(master, "tls-lock"));
        }
        // Many rounds in flight on one TLS connection each.
        let names: Vec<String> = (0..64).map(|i| format!("tls:{i}")).collect();
        let mut results = Vec::new();
        c.try_lock_batch(&names, TTL, &mut results).unwrap();
        let locks: Vec<_> = results.drain(..).map(Result::unwrap).collect();
        let mut released = Vec::new();
        c.release_batch(locks, &mut released).unwrap();
        assert!(released.iter().all(Result::is_ok));
        // Every master restarts: new TLS sessions (resumed where rustls can).
        for master in m.iter_mut() {
            master.restart().unwrap();
        }
        assert!(
            poll_until(Duration::from_secs(5), || c
                .try_lock("tls-lock", TTL)
                .map(|l| c.release(l).is_ok())
                .unwrap_or(false)),
            "no lock after the restarts: {:?}",
            c.stats()
        );
    }

    /// AUTH and SELECT over TLS: requests wait for their confirmation as on TCP.
    #[test]
    fn tls_with_password_and_database() {
        let certs = certs();
        let m = tls_masters(3, &certs, &["--requirepass", "pw"]);
        let urls: Vec<String> = m.urls().iter().map(|u| format!("{u}/3")).collect();
        assert!(urls[0].starts_with("rediss://:pw@"), "{urls:?}");
        let mut c = builder(&urls).tls_ca_file(certs.ca_cert()).build().unwrap();
        warm_up(&mut c);
        let lock = c.try_lock("tls-db", TTL).unwrap();
        // Decided at the quorum-th answer: the last master's SET was sent and may still be
        // on its way.
        for master in &m {
            assert!(
                poll_until(Duration::from_secs(2), || one_key_in(master, 3)),
                "no key in db 3: {:?}",
                c.stats()
            );
        }
        c.release(lock).unwrap();
    }

    #[test]
    fn the_shared_client_over_tls() {
        let certs = certs();
        let m = tls_masters(3, &certs, &[]);
        let c = builder(&m.urls())
            .tls_ca_file(certs.ca_cert())
            .build_shared()
            .unwrap();
        let guard = c.try_lock("tls-shared", TTL).wait().unwrap();
        assert!(holds(&m[0], "tls-shared", guard.token().as_bytes()));
        guard.release().wait().unwrap();
        assert!(absent(&m[0], "tls-shared"));
    }

    /// A CA that did not sign the masters' certificates: a certificate error that says so,
    /// for every master, round after round (backing off), and no panic.
    #[test]
    fn a_wrong_ca_is_a_certificate_error() {
        let certs = certs();
        let other = TestCerts::generate().unwrap();
        let m = tls_masters(3, &certs, &[]);
        let mut c = builder(&m.urls())
            .tls_ca_file(other.ca_cert())
            .build()
            .unwrap();
        for _ in 0..3 {
            let e = c.try_lock("tls-wrong-ca", TTL).unwrap_err();
            // Waiting cannot change a certificate: refused at once, not retried.
            assert!(matches!(e, Error::Refused(_)), "{e}");
            assert!(all(&tls_faults(&e), TlsFault::UnknownIssuer), "{e}");
            let text = e.to_string();
            assert!(
                text.contains("TLS: certificate verification failed: not signed by a trusted CA"),
                "{text}"
            );
        }
        for master in &m {
            assert!(absent(master, "tls-wrong-ca"));
        }
        // The system's roots do not know the test CA either.
        let mut c = builder(&m.urls()).build().unwrap();
        let e = c.try_lock("tls-wrong-ca", TTL).unwrap_err();
        assert!(all(&tls_faults(&e), TlsFault::UnknownIssuer), "{e}");
    }

    /// A certificate for another name than the URL's host: refused, by name and by IP.
    #[test]
    fn a_hostname_mismatch_fails() {
        let certs = TestCerts::generate_for(&["redis.test"]).unwrap();
        let m = tls_masters(3, &certs, &[]);
        let mut urls = m.urls(); // 127.0.0.1: no such IP SAN
        urls[1] = format!("rediss://localhost:{}", m[1].port()); // no such DNS SAN
        let mut c = builder(&urls).tls_ca_file(certs.ca_cert()).build().unwrap();
        let e = c.try_lock("tls-name", TTL).unwrap_err();
        assert!(all(&tls_faults(&e), TlsFault::NameMismatch), "{e}");
        // Later rounds report every master (backing off: its last fault at once). The
        // client runs the loop only inside its calls: a handshake still going when a round
        // was decided goes on in the next call.
        assert!(poll_until(Duration::from_secs(5), || {
            let e = c.try_lock("tls-name", TTL).unwrap_err();
            tls_faults(&e) == vec![TlsFault::NameMismatch; 3]
        }));
        assert!(
            e.to_string()
                .contains("not valid for the master's host name"),
            "{e}"
        );
    }

    /// `--tls-auth-clients yes`: a client certificate signed by the masters' CA is taken;
    /// none, or one from another CA, is refused, with a TLS fault.
    #[test]
    fn mutual_tls() {
        let certs = certs();
        let m = tls_masters(3, &certs, &["--tls-auth-clients", "yes"]);
        let mut c = builder(&m.urls())
            .tls_ca_file(certs.ca_cert())
            .tls_client_cert(certs.client_cert(), certs.client_key())
            .build()
            .unwrap();
        warm_up(&mut c);
        let lock = c.try_lock("mtls", TTL).unwrap();
        assert!(holds(&m[0], "mtls", lock.token().as_bytes()));
        c.release(lock).unwrap();

        let mut anonymous = builder(&m.urls())
            .tls_ca_file(certs.ca_cert())
            .build()
            .unwrap();
        let e = anonymous.try_lock("mtls", TTL).unwrap_err();
        let faults = tls_faults(&e);
        assert!(
            faults.iter().all(|f| matches!(f, TlsFault::Alert(_))),
            "{faults:?}"
        );
        assert!(e.to_string().contains("client certificate"), "{e}");

        let stranger = TestCerts::generate().unwrap();
        let mut wrong = builder(&m.urls())
            .tls_ca_file(certs.ca_cert())
            .tls_client_cert(stranger.client_cert(), stranger.client_key())
            .build()
            .unwrap();
        let e = wrong.try_lock("mtls", TTL).unwrap_err();
        let faults = tls_faults(&e);
        assert!(
            faults.iter().all(|f| matches!(f, TlsFault::Alert(_))),
            "{faults:?}"
        );
        for master in &m {
            assert!(absent(master, "mtls"));
        }
    }

    /// A plain-TCP master given as `rediss://` (it does not speak TLS, and does not answer
    /// a ClientHello) fails with a TLS fault once the connect timeout, which covers the
    /// handshake, runs out: not a hang, not a protocol error.
    #[test]
    fn tls_to_a_plain_master() {
        let certs = certs();
        let plain = LocalMaster::start().unwrap();
        let url = format!("rediss://127.0.0.1:{}", plain.port());
        let mut c = builder(&[url])
            .tls_ca_file(certs.ca_cert())
            .connect_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let e = c.try_lock("tls-plain", TTL).unwrap_err();
        let report = e.report().unwrap();
        let (_, outcome) = report.outcomes().next().unwrap();
        assert!(
            matches!(outcome, Outcome::Failed(Fault::Tls(_))),
            "{report}"
        );
    }
}

/// A connect the client started but did not watch over (its round was decided without
/// that master, and the client went idle) is not timed out for the idle time: at the next
/// call it completes, and the master takes part. (Its timeout used to count the idle gap:
/// a host name resolved while the client was idle always "timed out".)
#[test]
fn a_connect_left_in_flight_while_idle_is_not_timed_out_for_the_idle_time() {
    let m = masters(3);
    let urls = vec![
        m[0].url(),
        m[1].url(),
        format!("redis://localhost:{}", m[2].port()),
    ];
    let mut c = Redlock::builder()
        .masters(&urls)
        .connect_timeout(Duration::from_millis(100))
        .retry_count(0)
        .build()
        .unwrap();
    for round in 0..3 {
        // Decided by the two masters given by address while the third one's name is still
        // being resolved; then the client is idle for longer than the connect timeout.
        let lock = c.try_lock(format!("idle-connect-{round}"), TTL).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        c.release(lock).unwrap();
        let s = &c.stats()[2];
        assert!(
            !matches!(
                s.last_fault(),
                Some(Fault::Connect(std::io::ErrorKind::TimedOut))
            ),
            "round {round}: {s}"
        );
        if s.connects() == 1 {
            return;
        }
    }
    panic!("the master given by name never connected: {}", c.stats()[2]);
}
