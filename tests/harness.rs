//! Tests of the test harness itself: local masters, the fault proxy, the fake server.
//! Each checks an observable effect against a real `redis-server` (or the fake).

mod support;

use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::process::Command as Process;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::fake::{Action, FakeServer};
use support::proxy::{Mode, Proxy};
use support::*;

const SHORT: Duration = Duration::from_millis(200);
const LONG: Duration = Duration::from_secs(5);

fn ping(addr: std::net::SocketAddr, timeout: Duration) -> std::io::Result<AdminReply> {
    command(addr, &[b"PING"], timeout)
}

fn pong() -> AdminReply {
    AdminReply::Simple("PONG".into())
}

fn client_count(m: &LocalMaster) -> usize {
    let list = m.cmd(&[b"CLIENT", b"LIST"]).unwrap();
    list.as_str().unwrap().lines().count()
}

fn bulk(b: &[u8]) -> AdminReply {
    AdminReply::Bulk(Some(b.to_vec()))
}

// ---------------------------------------------------------------------------------------
// Local masters
// ---------------------------------------------------------------------------------------

#[test]
fn master_starts_and_answers() {
    let mut m = master();
    assert!(m.is_running());
    assert_eq!(m.url(), format!("redis://127.0.0.1:{}", m.port()));
    assert_eq!(m.addr().to_string(), format!("127.0.0.1:{}", m.port()));
    assert!(m.dir().is_dir());
    assert_eq!(m.cmd(&[b"PING"]).unwrap(), pong());
    assert!(m.cmd(&[b"SET", b"k", b"v"]).unwrap().is_ok());
    assert_eq!(m.cmd(&[b"GET", b"k"]).unwrap(), bulk(b"v"));
    // It is the process we started, configured as asked.
    let info = m.cmd(&[b"INFO", b"server"]).unwrap();
    let pid = m.pid().unwrap();
    assert!(info
        .as_str()
        .unwrap()
        .contains(&format!("process_id:{pid}\r\n")));
    let save = m.cmd(&[b"CONFIG", b"GET", b"save"]).unwrap();
    assert_eq!(save, AdminReply::Array(vec![bulk(b"save"), bulk(b"")]));
    let aof = m.cmd(&[b"CONFIG", b"GET", b"appendonly"]).unwrap();
    assert_eq!(
        aof,
        AdminReply::Array(vec![bulk(b"appendonly"), bulk(b"no")])
    );
}

#[test]
fn freeze_makes_ping_time_out_and_thaw_resumes() {
    let mut m = master();
    m.freeze().unwrap();
    assert!(m.is_frozen());
    assert!(m.is_running(), "a frozen master is still running");
    let started = Instant::now();
    let err = ping(m.addr(), SHORT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(started.elapsed() < LONG);
    m.thaw().unwrap();
    assert!(!m.is_frozen());
    assert_eq!(ping(m.addr(), LONG).unwrap(), pong());
}

#[test]
fn kill_then_restart_on_the_same_port_loses_keys() {
    let mut m = master();
    let port = m.port();
    assert!(m.cmd(&[b"SET", b"k", b"v"]).unwrap().is_ok());
    let pid = m.pid().unwrap();
    m.kill().unwrap();
    assert!(!m.is_running());
    assert_eq!(m.pid(), None);
    assert!(
        !pid_exists(pid),
        "killed and reaped: /proc/{pid} must be gone"
    );
    assert!(ping(m.addr(), SHORT).is_err(), "nothing listens after kill");
    m.restart().unwrap();
    assert_eq!(m.port(), port);
    assert_ne!(m.pid(), Some(pid));
    assert_eq!(m.cmd(&[b"GET", b"k"]).unwrap(), AdminReply::Bulk(None));
}

#[test]
fn stop_then_restart_and_restart_while_running() {
    let mut m = master();
    let port = m.port();
    let pid = m.pid().unwrap();
    m.stop().unwrap();
    assert!(!m.is_running());
    assert!(!pid_exists(pid));
    m.stop().unwrap(); // no-op
    m.kill().unwrap(); // no-op
    assert!(m.freeze().is_err(), "nothing to freeze");
    m.restart().unwrap();
    let pid2 = m.pid().unwrap();
    m.restart().unwrap(); // stops the running one first
    assert!(!pid_exists(pid2));
    assert_eq!(m.port(), port);
    assert_eq!(m.cmd(&[b"PING"]).unwrap(), pong());
}

#[test]
fn stop_thaws_a_frozen_master() {
    let mut m = master();
    let pid = m.pid().unwrap();
    m.freeze().unwrap();
    m.stop().unwrap();
    assert!(!pid_exists(pid));
}

#[test]
fn restart_with_persistence_keeps_keys() {
    let mut m = master_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    assert!(m.cmd(&[b"SET", b"k", b"kept"]).unwrap().is_ok());
    m.kill().unwrap();
    m.restart().unwrap();
    assert_eq!(m.cmd(&[b"GET", b"k"]).unwrap(), bulk(b"kept"));
}

#[test]
fn requirepass_is_used_by_cmd() {
    let m = master_with(&["--requirepass", "s3cret"]);
    assert_eq!(m.password(), Some("s3cret"));
    assert_eq!(m.url(), format!("redis://:s3cret@127.0.0.1:{}", m.port()));
    assert_eq!(m.cmd(&[b"PING"]).unwrap(), pong());
    match ping(m.addr(), LONG).unwrap() {
        AdminReply::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("expected NOAUTH, got {other:?}"),
    }
}

#[test]
fn drop_leaves_no_process_and_no_directory() {
    let m = master();
    let (pid, dir) = (m.pid().unwrap(), m.dir().to_path_buf());
    drop(m);
    assert!(!pid_exists(pid));
    assert!(!dir.exists());

    let mut frozen = master();
    let (pid, dir) = (frozen.pid().unwrap(), frozen.dir().to_path_buf());
    frozen.freeze().unwrap();
    drop(frozen);
    assert!(!pid_exists(pid), "a frozen master is stopped on drop too");
    assert!(!dir.exists());
}

#[test]
fn panic_unwinding_stops_masters() {
    let seen: Arc<Mutex<Vec<(u32, PathBuf)>>> = Arc::default();
    let record = seen.clone();
    let result = std::panic::catch_unwind(move || {
        let mut ms = masters(2);
        ms[1].freeze().unwrap();
        for m in &ms {
            record
                .lock()
                .unwrap()
                .push((m.pid().unwrap(), m.dir().to_path_buf()));
        }
        panic!("test body fails while the masters run");
    });
    assert!(result.is_err());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (pid, dir) in seen.iter() {
        assert!(!pid_exists(*pid), "pid {pid} survived the panic");
        assert!(!dir.exists());
    }
}

#[test]
fn several_masters() {
    let mut ms = masters(3);
    assert_eq!(ms.len(), 3);
    let urls = ms.urls();
    let mut ports: Vec<u16> = ms.iter().map(LocalMaster::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "distinct ports");
    for (m, url) in ms.iter().zip(&urls) {
        assert_eq!(&m.url(), url);
        assert_eq!(m.cmd(&[b"PING"]).unwrap(), pong());
    }
    ms[0].kill().unwrap();
    assert!(ping(ms.addrs()[0], SHORT).is_err());
    assert_eq!(ms[1].cmd(&[b"PING"]).unwrap(), pong());
    let pids: Vec<u32> = ms.iter().filter_map(LocalMaster::pid).collect();
    drop(ms);
    assert!(pids.iter().all(|&p| !pid_exists(p)));
}

/// `Cpus_allowed_list` of every thread of process `pid`, parsed (`0-2,5` -> [0, 1, 2, 5]).
#[cfg(target_os = "linux")]
fn thread_cpus_of(pid: u32) -> Vec<Vec<usize>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .map(|t| {
            let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim();
            list.split(',')
                .flat_map(|part| match part.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
                    None => vec![part.parse::<usize>().unwrap()],
                })
                .collect()
        })
        .collect()
}

#[test]
#[cfg(target_os = "linux")]
fn masters_start_on_the_cpus_asked_for_and_the_caller_keeps_its_own() {
    use redlock_mux::local::{current_thread_cpus, pin_current_thread, set_current_thread_cpus};
    let mine = current_thread_cpus().unwrap();
    // As a bench does: the caller on its first CPU, the masters on the others (on a
    // one-CPU machine, the same one: the restore is still checked).
    let want: Vec<usize> = if mine.len() > 1 {
        mine[1..].to_vec()
    } else {
        mine.clone()
    };
    pin_current_thread(mine[0]).unwrap();
    let check = |ms: &LocalMasters| {
        for m in ms {
            assert_eq!(m.cpus(), Some(&want[..]));
            let pid = m.pid().unwrap();
            for cpus in thread_cpus_of(pid) {
                assert_eq!(cpus, want, "a thread of redis-server {pid}");
            }
        }
        assert_eq!(current_thread_cpus().unwrap(), [mine[0]], "caller restored");
    };
    let mut ms = LocalMasters::start_on_cpus(2, &want).unwrap();
    check(&ms);
    // A restart keeps the pinning; so does one started from another CPU set.
    let old = ms[0].pid().unwrap();
    ms[0].kill().unwrap();
    set_current_thread_cpus(&mine).unwrap();
    ms[0].restart().unwrap();
    assert_ne!(ms[0].pid(), Some(old));
    pin_current_thread(mine[0]).unwrap();
    check(&ms);
    assert_eq!(ms[0].cmd(&[b"PING"]).unwrap(), pong());
    drop(ms);
    // Unpinned masters inherit the caller's set, as before.
    let plain = master();
    assert_eq!(plain.cpus(), None);
    assert_eq!(thread_cpus_of(plain.pid().unwrap())[0], [mine[0]]);
    set_current_thread_cpus(&mine).unwrap();
}

#[test]
fn masters_on_cpus_that_do_not_exist_are_refused_before_starting() {
    for cpus in [&[][..], &[100_000][..]] {
        let err = LocalMasters::start_on_cpus(2, cpus).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let err = LocalMaster::start_on_cpus(cpus).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
    let err = LocalMaster::start_on_cpus(&[100_000]).unwrap_err();
    assert!(
        err.to_string().contains("CPU 100000 is not available"),
        "{err}"
    );
}

/// Runs one of the `child_*` tests below in a child process with `env`, so that changing
/// REDIS_SERVER or PATH cannot disturb the tests running in parallel in this process.
fn run_child(test: &str, env: &[(&str, &str)], remove: &[&str]) {
    let mut child = Process::new(std::env::current_exe().unwrap());
    child.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        child.env(k, v);
    }
    for k in remove {
        child.env_remove(k);
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {test} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn missing_binary_gives_the_install_message() {
    run_child(
        "child_redis_server_env_points_nowhere",
        &[("REDIS_SERVER", "/nonexistent")],
        &[],
    );
    run_child(
        "child_redis_server_not_on_path",
        &[("PATH", "/nonexistent-dir")],
        &["REDIS_SERVER"],
    );
}

#[test]
#[ignore = "run by missing_binary_gives_the_install_message in a child process"]
fn child_redis_server_env_points_nowhere() {
    assert_eq!(std::env::var("REDIS_SERVER").unwrap(), "/nonexistent");
    let err = LocalMaster::start().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let msg = err.to_string();
    assert!(msg.contains(INSTALL_HINT), "{msg}");
    assert!(msg.contains("sudo apt-get install redis-server"), "{msg}");
    assert!(msg.contains("/nonexistent"), "{msg}");
    let err = LocalMasters::start(3).unwrap_err();
    assert!(err.to_string().contains(INSTALL_HINT));
    let panic = std::panic::catch_unwind(|| masters(1)).unwrap_err();
    let text = panic.downcast_ref::<String>().unwrap();
    assert!(text.contains(INSTALL_HINT), "{text}");
}

#[test]
#[ignore = "run by missing_binary_gives_the_install_message in a child process"]
fn child_redis_server_not_on_path() {
    let err = redis_server_path().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.to_string(), INSTALL_HINT);
    assert!(LocalMaster::start()
        .unwrap_err()
        .to_string()
        .contains(INSTALL_HINT));
}

// ---------------------------------------------------------------------------------------
// Fault proxy (against a real master)
// ---------------------------------------------------------------------------------------

#[test]
fn proxy_passes_through() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    assert_eq!(p.upstream(), m.addr());
    assert_eq!(p.url(), format!("redis://127.0.0.1:{}", p.port()));
    assert!(command(p.addr(), &[b"SET", b"k", b"v"], LONG)
        .unwrap()
        .is_ok());
    assert_eq!(m.cmd(&[b"GET", b"k"]).unwrap(), bulk(b"v"));
    assert_eq!(
        command(p.addr(), &[b"GET", b"k"], LONG).unwrap(),
        bulk(b"v")
    );
    assert_eq!(p.accepted(), 2);
    assert!(p.forwarded_up() > 0 && p.forwarded_down() > 0);
    wait_until("proxy connections to close", LONG, || p.connections() == 0);
}

#[test]
fn proxy_adds_latency() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    let delay = Duration::from_millis(60);
    p.set_mode(Mode::Latency(delay));
    assert_eq!(p.mode(), Mode::Latency(delay));
    let mut s = connect(p.addr());
    let started = Instant::now();
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    let (got, _) = read_raw(&mut s, 7, LONG);
    assert_eq!(got, b"+PONG\r\n");
    // One chunk each way: at least twice the delay.
    assert!(started.elapsed() >= delay * 2, "{:?}", started.elapsed());
    p.set_mode(Mode::PassThrough);
    assert_eq!(ping(p.addr(), LONG).unwrap(), pong());
}

#[test]
fn proxy_blackhole_discards_both_directions() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    let mut s = connect(p.addr());
    // Warm the connection up through the proxy first.
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    assert_eq!(read_raw(&mut s, 7, LONG).0, b"+PONG\r\n");

    p.set_mode(Mode::Blackhole);
    let set = encode_command(&[b"SET", b"bh", b"1"]);
    s.write_all(&set).unwrap();
    wait_until("the proxy to swallow the SET", LONG, || {
        p.dropped_bytes() >= set.len() as u64
    });
    let (got, end) = read_raw(&mut s, 1, SHORT);
    assert!(got.is_empty());
    assert_eq!(end, ReadEnd::TimedOut);
    assert_eq!(
        m.cmd(&[b"GET", b"bh"]).unwrap(),
        AdminReply::Bulk(None),
        "never reached the master"
    );
    // A new connection is accepted, then hears nothing either.
    assert_eq!(
        ping(p.addr(), SHORT).unwrap_err().kind(),
        ErrorKind::TimedOut
    );

    p.set_mode(Mode::PassThrough);
    // Same connection: the swallowed SET has no reply; the next PING's reply is the first.
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    assert_eq!(read_raw(&mut s, 7, LONG).0, b"+PONG\r\n");
}

#[test]
fn proxy_blackhole_discards_server_to_client_bytes() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    let mut s = connect(p.addr());
    s.write_all(&encode_command(&[b"SUBSCRIBE", b"chan"]))
        .unwrap();
    let confirm = b"*3\r\n$9\r\nsubscribe\r\n$4\r\nchan\r\n:1\r\n";
    assert_eq!(read_raw(&mut s, confirm.len(), LONG).0, confirm);

    p.set_mode(Mode::Blackhole);
    // The master pushes a message to the proxy, which must swallow it.
    let published = m.cmd(&[b"PUBLISH", b"chan", b"lost"]).unwrap();
    assert_eq!(
        published,
        AdminReply::Int(1),
        "the proxied subscriber is connected"
    );
    wait_until("the proxy to swallow the message", LONG, || {
        p.dropped_bytes() > 0
    });
    assert_eq!(read_raw(&mut s, 1, SHORT), (vec![], ReadEnd::TimedOut));

    p.set_mode(Mode::PassThrough);
    assert_eq!(
        m.cmd(&[b"PUBLISH", b"chan", b"kept"]).unwrap(),
        AdminReply::Int(1)
    );
    let message = b"*3\r\n$7\r\nmessage\r\n$4\r\nchan\r\n$4\r\nkept\r\n";
    assert_eq!(read_raw(&mut s, message.len(), LONG).0, message);
}

#[test]
fn proxy_hold_delivers_late() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    let mut s = connect(p.addr());
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    assert_eq!(read_raw(&mut s, 7, LONG).0, b"+PONG\r\n");
    p.set_mode(Mode::Hold);
    s.write_all(&encode_command(&[b"ECHO", b"late"])).unwrap();
    let (got, end) = read_raw(&mut s, 1, SHORT);
    assert!(got.is_empty() && end == ReadEnd::TimedOut);
    p.set_mode(Mode::PassThrough);
    assert_eq!(read_raw(&mut s, 10, LONG).0, b"$4\r\nlate\r\n");
}

#[test]
fn proxy_reset_sends_rst_to_the_client() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    let mut s = connect(p.addr());
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    assert_eq!(read_raw(&mut s, 7, LONG).0, b"+PONG\r\n");
    assert_eq!(p.connections(), 1);
    // The proxied connection and the admin connection asking.
    wait_until("CLIENT LIST to settle at 2 clients", LONG, || {
        client_count(&m) == 2
    });
    p.reset_all();
    assert_eq!(p.connections(), 0);
    let (got, end) = read_raw(&mut s, 1, LONG);
    assert!(got.is_empty());
    assert_eq!(end, ReadEnd::Error(ErrorKind::ConnectionReset));
    // The master side was reset too: only the admin connection remains.
    wait_until("the master to drop the proxied connection", LONG, || {
        client_count(&m) == 1
    });
    // New connections work.
    assert_eq!(ping(p.addr(), LONG).unwrap(), pong());
}

#[test]
fn proxy_cuts_a_reply_in_the_middle() {
    let m = master();
    assert!(m.cmd(&[b"SET", b"k", b"0123456789"]).unwrap().is_ok());
    let p = Proxy::start(m.addr()).unwrap();
    let mut s = connect(p.addr());
    p.cut_next_reply(7);
    assert!(p.cut_pending());
    s.write_all(&encode_command(&[b"GET", b"k"])).unwrap();
    let (got, end) = read_raw(&mut s, 100, LONG);
    assert_eq!(
        got, b"$10\r\n01",
        "first 7 bytes of `$10\\r\\n0123456789\\r\\n`"
    );
    assert_eq!(end, ReadEnd::Eof);
    assert!(!p.cut_pending());
    // One shot: the next connection gets whole replies.
    assert_eq!(
        command(p.addr(), &[b"GET", b"k"], LONG).unwrap(),
        bulk(b"0123456789")
    );
}

#[test]
fn proxy_drips_replies() {
    let m = master();
    assert!(m.cmd(&[b"SET", b"k", b"0123456789"]).unwrap().is_ok());
    let p = Proxy::start(m.addr()).unwrap();
    let delay = Duration::from_millis(10);
    p.set_mode(Mode::Drip(delay));
    let mut s = connect(p.addr());
    let started = Instant::now();
    s.write_all(&encode_command(&[b"GET", b"k"])).unwrap();
    let (first, _) = read_raw(&mut s, 1, LONG);
    assert_eq!(first, b"$");
    // Still dripping: most of the reply has not been forwarded yet.
    assert!(p.forwarded_down() < 10, "{}", p.forwarded_down());
    let (rest, _) = read_raw(&mut s, 16, LONG);
    assert_eq!(rest, b"10\r\n0123456789\r\n");
    // 17 bytes, each after its own delay.
    assert!(started.elapsed() >= delay * 17, "{:?}", started.elapsed());
}

#[test]
fn proxy_drop_stops_its_threads_and_connections() {
    let m = master();
    let p = Proxy::start(m.addr()).unwrap();
    p.set_mode(Mode::Drip(Duration::from_secs(10)));
    let mut s = connect(p.addr());
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    wait_until("the reply to be in the drip", LONG, || p.forwarded_up() > 0);
    let started = Instant::now();
    drop(p);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "drop must not wait out the drip"
    );
    let (_, end) = read_raw(&mut s, 100, LONG);
    assert_eq!(end, ReadEnd::Eof);
}

// ---------------------------------------------------------------------------------------
// Scripted fake server
// ---------------------------------------------------------------------------------------

#[test]
fn fake_answers_the_handshake_like_redis() {
    let f = FakeServer::redis_like().unwrap();
    assert_eq!(f.url(), format!("redis://127.0.0.1:{}", f.port()));
    let t = LONG;
    assert!(command(f.addr(), &[b"AUTH", b"user", b"pw"], t)
        .unwrap()
        .is_ok());
    assert!(command(f.addr(), &[b"SELECT", b"2"], t).unwrap().is_ok());
    assert_eq!(command(f.addr(), &[b"PING"], t).unwrap(), pong());
    let sha = command(f.addr(), &[b"SCRIPT", b"LOAD", b"return 1"], t).unwrap();
    // What real Redis answers for this script.
    assert_eq!(sha, bulk(b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db"));
    let info = command(f.addr(), &[b"INFO", b"server"], t).unwrap();
    let info = info.as_str().unwrap();
    assert!(
        info.contains(&format!("run_id:{}\r\n", f.run_id())),
        "{info}"
    );
    assert!(info.contains("uptime_in_seconds:"), "{info}");
    match command(f.addr(), &[b"HELLO", b"2"], t).unwrap() {
        AdminReply::Array(items) => assert_eq!(items.len(), 14),
        other => panic!("{other:?}"),
    }
    match command(f.addr(), &[b"SET", b"k", b"v"], t).unwrap() {
        AdminReply::Error(e) => assert!(e.contains("no scripted reply for 'SET'"), "{e}"),
        other => panic!("{other:?}"),
    }
    let names: Vec<String> = f.commands().iter().map(|c| c.name()).collect();
    assert_eq!(
        names,
        ["AUTH", "SELECT", "PING", "SCRIPT", "INFO", "HELLO", "SET"]
    );
    assert_eq!(f.accepted(), 7);
}

#[test]
fn fake_replies_as_scripted() {
    let f = FakeServer::start(|cmd, n| match (cmd.name().as_str(), n) {
        ("SET", 0) => Action::reply(b"$9223372036854775807\r\n"),
        ("SET", _) => Action::reply(b"+OK\r\n+OK\r\n"),
        ("GET", _) => Action::NoReply,
        ("DEL", _) => Action::CloseAfter(b"$10\r\nabc".to_vec()),
        ("ECHO", _) => Action::ReplyDripped(b"+slow\r\n".to_vec(), Duration::from_millis(10)),
        ("QUIT", _) => Action::Close,
        _ => Action::Default,
    })
    .unwrap();
    let mut s = connect(f.addr());
    // Handshake answered by default, hostile reply to the first SET only.
    s.write_all(&encode_command(&[b"PING"])).unwrap();
    s.write_all(&encode_command(&[b"SET", b"k", b"v"])).unwrap();
    assert_eq!(
        read_raw(&mut s, 29, LONG).0,
        b"+PONG\r\n$9223372036854775807\r\n"
    );
    // More replies than requests.
    s.write_all(&encode_command(&[b"set", b"k", b"v"])).unwrap();
    assert_eq!(read_raw(&mut s, 10, LONG).0, b"+OK\r\n+OK\r\n");
    // No reply at all.
    s.write_all(&encode_command(&[b"GET", b"k"])).unwrap();
    assert_eq!(read_raw(&mut s, 1, SHORT), (vec![], ReadEnd::TimedOut));
    // Dripped: one byte at a time.
    let started = Instant::now();
    s.write_all(&encode_command(&[b"ECHO", b"x"])).unwrap();
    assert_eq!(read_raw(&mut s, 1, LONG).0, b"+");
    assert_eq!(read_raw(&mut s, 6, LONG).0, b"slow\r\n");
    assert!(started.elapsed() >= Duration::from_millis(70));
    // Cut by a close.
    s.write_all(&encode_command(&[b"DEL", b"k"])).unwrap();
    assert_eq!(
        read_raw(&mut s, 100, LONG),
        (b"$10\r\nabc".to_vec(), ReadEnd::Eof)
    );
    // Close without a reply, on another connection.
    let mut s2 = connect(f.addr());
    s2.write_all(&encode_command(&[b"QUIT"])).unwrap();
    assert_eq!(read_raw(&mut s2, 100, LONG), (vec![], ReadEnd::Eof));

    assert_eq!(f.count("SET"), 2);
    assert_eq!(f.count("get"), 1);
    let cmds = f.commands();
    assert_eq!(cmds.len(), 7);
    assert_eq!(
        cmds[1].args,
        [b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]
    );
    assert!(cmds[1].is("set") && cmds[2].is("SET"));
    assert_eq!(cmds[1].arg(2), b"v");
    assert_eq!(
        cmds.iter().map(|c| c.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5, 6]
    );
    assert!(cmds[..6].iter().all(|c| c.conn == 0));
    assert_eq!(cmds[6].conn, 1);
    wait_until("fake connections to close", LONG, || f.connections() == 0);
}

#[test]
fn fake_parses_pipelined_split_and_inline_commands() {
    let f = FakeServer::start(|cmd, _| {
        if cmd.is("SCRIPT LOAD") {
            Action::reply(b"+scripted\r\n")
        } else {
            Action::Default
        }
    })
    .unwrap();
    let mut s = connect(f.addr());
    let mut bytes = encode_command(&[b"PING", b"a\r\nb"]);
    bytes.extend(encode_command(&[b"SCRIPT", b"LOAD", b"return 1"]));
    bytes.extend_from_slice(b"PING\r\n");
    // Sent in small pieces: the server must reassemble.
    for piece in bytes.chunks(3) {
        s.write_all(piece).unwrap();
        s.flush().unwrap();
    }
    let expected = b"$4\r\na\r\nb\r\n+scripted\r\n+PONG\r\n";
    assert_eq!(read_raw(&mut s, expected.len(), LONG).0, expected);
    assert!(f.wait_for_count("PING", 2, LONG));
    assert_eq!(f.commands()[0].arg(1), b"a\r\nb");
    // Bytes Redis would reject get a protocol error and a close.
    s.write_all(b"*1\r\n+PING\r\n").unwrap();
    let (got, end) = read_raw(&mut s, 1000, LONG);
    assert!(
        got.starts_with(b"-ERR Protocol error"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(end, ReadEnd::Eof);
}
