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
use support::{masters, masters_with, settle, settle_shared, wait_until, AdminReply, LocalMasters};

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
    // The lock returned at a quorum: its last SET may land after the operator looks.
    settle(&mut holder, 3);
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
    let line = String::from_utf8(redlock_mux::scripts::aux_key(
        redlock_mux::scripts::QUEUE,
        resource.as_bytes(),
    ))
    .unwrap();
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
    // The waiters' last calls returned at a quorum: settle their client before looking.
    settle_shared(&shared, 3);
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
    // On every master before the force (a late SET would land after it).
    settle(&mut holder, 3);
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

/// The CLI's operators' commands: `redlock list`, `redlock release --force`, `redlock
/// status` with the line.
#[cfg(feature = "cli")]
mod cli {
    use std::path::PathBuf;
    use std::process::{Child, Command, ExitStatus, Output, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::thread;
    use std::time::{Duration, Instant};

    use redlock_mux::Redlock;

    use super::support::{self, masters, wait_until, AdminReply, LocalMasters};

    const BIN: &str = env!("CARGO_BIN_EXE_redlock");

    fn redlock(m: &LocalMasters, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env("REDLOCK_MASTERS", m.urls().join(","));
        cmd
    }

    /// Run to completion (bounded).
    fn output(mut cmd: Command) -> Output {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn redlock");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("redlock finished within 20 s")
            .expect("wait for redlock")
    }

    fn code(out: &Output) -> i32 {
        out.status.code().expect("redlock exited (no signal)")
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    fn json(out: &Output) -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\n{}",
                text(&out.stdout),
                text(&out.stderr)
            )
        })
    }

    fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("process {} did not exit within {within:?}", child.id());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// A scratch directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "redlock-ops-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Scratch(dir)
        }
        fn file(&self, name: &str) -> String {
            self.0.join(name).to_string_lossy().into_owned()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Kills a process when dropped during a panic (a `redlock run` left behind).
    struct KillOnDrop(u32);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if thread::panicking() {
                let _ = Command::new("kill")
                    .args(["-9", &self.0.to_string()])
                    .status();
            }
        }
    }

    fn alive(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(')')
                .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
            Err(_) => false,
        }
    }

    /// The holder's fingerprint on master `i` (its token's first 16 hex digits).
    fn holder(m: &LocalMasters, i: usize, key: &str) -> Option<String> {
        support::get(m, i, key).map(|v| text(&v[..16.min(v.len())]))
    }

    #[test]
    fn list_shows_a_lock_held_by_run_and_release_force_frees_it() {
        let m = masters(3);
        let s = Scratch::new();
        let key = "ops:cli";
        let pid_file = s.file("pid");
        // The command runs until the lock is lost (SIGTERM) or 60 s pass.
        let script = format!(
            "echo $$ > '{pid_file}'; trap 'exit 0' TERM; i=0; while [ $i -lt 1200 ]; do \
             sleep 0.05; i=$((i+1)); done"
        );
        let mut run = redlock(
            &m,
            &["run", "--ttl", "3s", "--lost-exit-code", "42", key, "--"],
        )
        .args(["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlock run");
        let _kill = KillOnDrop(run.id());
        wait_until("the command started", Duration::from_secs(15), || {
            std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim().parse::<u32>().is_ok())
        });
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_until("every master holds it", Duration::from_secs(10), || {
            (0..3).all(|i| holder(&m, i, key).is_some())
        });
        let fp = holder(&m, 0, key).unwrap();
        // Other keys are not locks: a plain value, a hash, the crate's own keys.
        assert!(m[0].cmd(&[b"SET", b"ops:plain", b"hello"]).unwrap().is_ok());
        assert!(m[0]
            .cmd(&[b"HSET", b"ops:hash", b"f", b"v"])
            .is_ok_and(|r| r == AdminReply::Int(1)));
        assert!(m[1]
            .cmd(&[
                b"SET",
                &redlock_mux::scripts::aux_key(redlock_mux::scripts::FENCE, key.as_bytes()),
                b"7",
            ])
            .unwrap()
            .is_ok());

        let out = output(redlock(&m, &["list"]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let table = text(&out.stdout);
        let row = table
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no row for {key}: {table}"));
        assert!(
            row.contains(&fp) && row.contains("3/3") && row.contains(" yes "),
            "{row}"
        );
        assert!(
            row.contains(" 7 ") || row.contains(" 7  "),
            "the fencing counter: {row}"
        );
        assert!(
            !table.contains("ops:plain") && !table.contains("ops:hash"),
            "{table}"
        );
        assert!(table.contains("1 lock ("), "{table}");
        let j = json(&output(redlock(&m, &["list", "--json", "ops:*"])));
        assert_eq!(j["complete"], true, "{j}");
        let locks = j["locks"].as_array().unwrap();
        assert_eq!(locks.len(), 1, "{j}");
        assert_eq!(locks[0]["resource"], key, "{j}");
        assert_eq!(locks[0]["holder"], fp.as_str(), "{j}");
        assert_eq!(
            (locks[0]["held_on"].as_u64(), locks[0]["locked"].as_bool()),
            (Some(3), Some(true))
        );
        let ttls = locks[0]["ttl_ms"].as_array().unwrap();
        assert!(
            ttls.iter().all(|t| t.as_u64().is_some_and(|t| t <= 3000)),
            "{j}"
        );
        // A pattern that matches nothing.
        let out = output(redlock(&m, &["list", "nothing:*"]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).starts_with("no locks"),
            "{}",
            text(&out.stdout)
        );

        // A live holder: refused without --yes, nothing deleted.
        let out = output(redlock(&m, &["release", "--force", key]));
        assert_eq!(code(&out), 1, "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains(&fp) && err.contains("--yes"), "{err}");
        assert!((0..3).all(|i| holder(&m, i, key).as_deref() == Some(fp.as_str())));
        // Usage: --force is required, and so is the resource.
        for args in [&["release", key][..], &["release", "--force"]] {
            let out = output(redlock(&m, args));
            assert_eq!(code(&out), 64, "{args:?}: {}", text(&out.stderr));
            assert!(
                text(&out.stderr).starts_with("redlock: "),
                "{}",
                text(&out.stderr)
            );
        }

        // With --yes: deleted everywhere, who held it said; the run loses it at its next
        // extension and stops the command with its lost exit code.
        let forced = Instant::now();
        let out = output(redlock(&m, &["release", "--force", "--yes", key]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let said = text(&out.stdout);
        assert!(said.contains(&format!("deleted {fp}'s key")), "{said}");
        assert!(said.contains("free"), "{said}");
        assert!((0..3).all(|i| support::get(&m, i, key).is_none()));
        let status = wait_exit(&mut run, Duration::from_secs(15));
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err);
        assert_eq!(status.code(), Some(42), "{err}");
        assert!(err.contains("LOST THE LOCK"), "{err}");
        // Its next extension is at most a third of the 3 s TTL away, then SIGTERM.
        assert!(
            forced.elapsed() < Duration::from_secs(10),
            "{:?}",
            forced.elapsed()
        );
        assert!(!alive(pid), "the command outlived the lost lock");
        let st = json(&output(redlock(&m, &["status", "--json", key])));
        assert_eq!(
            (st["locked"].as_bool(), st["free"].as_bool()),
            (Some(false), Some(true))
        );

        // A leftover on one master (no quorum holds it): no --yes needed.
        assert!(m[2]
            .cmd(&[
                b"SET",
                key.as_bytes(),
                b"0123456789abcdef0123456789abcdef",
                b"PX",
                b"60000"
            ])
            .unwrap()
            .is_ok());
        let out = output(redlock(&m, &["release", "--force", key]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("deleted 0123456789abcdef's key"));
        assert_eq!(support::get(&m, 2, key), None);
        // Nothing anywhere: said so, exit 0.
        let out = output(redlock(&m, &["release", "--force", key]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("nothing to release"),
            "{}",
            text(&out.stderr)
        );
    }

    /// `release --force` as a client the masters refuse (an ACL user without the lock's
    /// keys, a wrong password) is a configuration error, 64, with the refusals and what to
    /// fix, with or without --yes: no quorum can answer it whatever the operator passes.
    /// (It said "cannot tell who holds it ... pass --yes" and exited 1, then 69 with --yes.)
    #[test]
    fn release_force_refused_by_the_masters_is_a_configuration_error() {
        let m = masters(3);
        let key = "ops:acl";
        let mut owner = Redlock::new(m.urls()).expect("holder");
        let lock = owner
            .try_lock(key, Duration::from_secs(30))
            .expect("the holder takes it");
        for i in 0..3 {
            let r = m[i].cmd(&[
                b"ACL", b"SETUSER", b"app", b"on", b">app-pw", b"~app:*", b"&*", b"+@all",
            ]);
            assert!(r.unwrap().is_ok());
        }
        let urls = |user: &str| -> String {
            m.addrs()
                .iter()
                .map(|a| format!("redis://{user}@{a}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        for (user, says) in [("app:app-pw", "ACL SETUSER"), ("app:wrong", "password")] {
            for yes in [false, true] {
                let mut args = vec!["release", "--force", "--masters"];
                let masters = urls(user);
                args.push(&masters);
                if yes {
                    args.push("--yes");
                }
                args.push(key);
                let out = output(redlock(&m, &args));
                let err = text(&out.stderr);
                assert_eq!(code(&out), 64, "{user} --yes {yes}: {err}");
                assert!(
                    err.starts_with("redlock: cannot release ops:acl: 3 of 3 masters refuse")
                        && err.contains(says)
                        && !err.contains("pass --yes"),
                    "{user} --yes {yes}: {err}"
                );
                for a in m.addrs() {
                    assert!(err.contains(&a.to_string()), "{a} not named: {err}");
                }
                assert!(!err.contains("app-pw"), "{err}");
            }
        }
        // Nothing was deleted.
        assert!((0..3).all(|i| holder(&m, i, key).is_some()));
        owner.release(lock).expect("release");
    }

    #[test]
    fn status_shows_the_line_and_list_is_bounded() {
        let m = masters(3);
        let key = "ops:queue";
        let mut holder = Redlock::new(m.urls()).expect("holder");
        let lock = holder
            .try_lock(key, Duration::from_secs(30))
            .expect("the holder takes it");
        let mut waiter = redlock(&m, &["run", "-w", "20", key, "--", "true"])
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redlock run");
        let _kill = KillOnDrop(waiter.id());
        let line = String::from_utf8(redlock_mux::scripts::aux_key(
            redlock_mux::scripts::QUEUE,
            key.as_bytes(),
        ))
        .unwrap();
        wait_until("run waiting in line", Duration::from_secs(15), || {
            (0..3).all(|i| m[i].cmd(&[b"ZCARD", line.as_bytes()]).unwrap() == AdminReply::Int(1))
        });
        let out = output(redlock(&m, &["status", key]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let table = text(&out.stdout);
        assert!(
            table.contains("LINE") && table.contains("1 waiter in line"),
            "{table}"
        );
        assert_eq!(
            table.matches("(asking)").count(),
            3,
            "one line per master: {table}"
        );
        let st = json(&output(redlock(&m, &["status", "--json", key])));
        assert_eq!(st["waiters"], 1, "{st}");
        let first = &st["masters"][0]["first_waiters"][0];
        assert_eq!(first["alive"], true, "{st}");
        assert_eq!(first["client"].as_str().map(str::len), Some(8), "{st}");
        assert_eq!(st["masters"][0]["contended"], true, "{st}");
        // The lock's fingerprint, whole (16 hex digits, no ellipsis), never the token.
        let fp = &lock.token().as_str()[..16];
        assert_eq!(st["holder"], fp, "{st}");
        assert!(!text(&out.stdout).contains(lock.token().as_str()));
        holder.release(lock).expect("release");
        let status = wait_exit(&mut waiter, Duration::from_secs(15));
        assert!(status.success(), "{status:?}");

        // SCAN's bounds: a scan cut short says so (exit 1), never runs KEYS.
        for k in 0..20 {
            let name = format!("ops:many:{k}");
            assert!(m[0].cmd(&[b"SET", name.as_bytes(), b"x"]).unwrap().is_ok());
        }
        let out = output(redlock(&m, &["list", "--count", "5", "--max-keys", "5"]));
        assert_eq!(code(&out), 1, "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("--max-keys 5"),
            "{}",
            text(&out.stderr)
        );
        // The summary says the scan did not reach the end of every master.
        let said = text(&out.stdout);
        assert!(
            said.contains("of 3 masters scanned to the end: the list may be incomplete")
                && !said.contains("on 3 masters"),
            "{said}"
        );
        let out = output(redlock(&m, &["list", "--count", "0"]));
        assert_eq!(code(&out), 64, "{}", text(&out.stderr));
        // A master down: the others are listed, the exit says incomplete.
        let mut m = m;
        m[1].kill().unwrap();
        let out = output(redlock(&m, &["list"]));
        assert_eq!(code(&out), 1, "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&m[1].addr().to_string()),
            "{}",
            text(&out.stderr)
        );
        // Not "no locks (... scanned on 3 masters)": one master was not scanned at all.
        // (The table's summary said so while stderr named the master that was down.)
        let said = text(&out.stdout);
        assert!(
            said.starts_with("no locks found (")
                && said.contains("2 of 3 masters scanned to the end")
                && !said.contains("on 3 masters"),
            "{said}"
        );
    }
}
