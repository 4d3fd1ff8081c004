//! Upgrading a running set of masters from the layout before issue 22 (the line
//! `redlock-mux:queue:<r>`, a key per waiter `redlock-mux:waiter:<id>`, the fencing
//! counter `redlock-mux:fence:<r>`, none of them in the lock key's cluster slot) to the
//! keys that live beside their lock key (`scripts::aux_key`).
//!
//! Today's state is put on real masters by the old scripts themselves (their sources are
//! kept below, as they were at ea768f6), run with `EVAL` as an old client runs them:
//! fenced locks whose write-backs left old counters (one master behind), a held key with
//! old waiters in an old line (and their waiter keys), an old waiter alive in line on a
//! resource the new client's fair waiters use. Then the new client: its fencing tokens
//! are strictly above every old counter and keep rising (the old counters are retired
//! by the write-back), its waiters wait and are woken in the new line, and nothing the
//! old clients left behind holds a new lock back.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlock_mux::local::{AdminReply, LocalMasters};
use redlock_mux::scripts::{self, aux_key};
use redlock_mux::Redlock;
use support::{masters_with, settle, wait_until};

const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// `scripts::RELEASE` before the keys moved (SHA1 135d170f8c306908611ebc0d06e429c22c0e59d4).
const OLD_RELEASE: &str = concat!(
    "local held = 1\n",
    "for i = 1, #KEYS do\n",
    "  local q = 'redlock-mux:queue:' .. KEYS[i]\n",
    "  local v = redis.call('get', KEYS[i])\n",
    "  if ARGV[2] and v ~= ARGV[1] then\n",
    "    redis.pcall('zrem', q, ARGV[2])\n",
    "  end\n",
    "  if v == ARGV[1] then\n",
    "    redis.call('del', KEYS[i])\n",
    "  elseif v == ARGV[1] .. '+' then\n",
    "    redis.call('del', KEYS[i])\n",
    "    local turn\n",
    "    for _ = 1, 8 do\n",
    "      local r = redis.pcall('zrange', q, 0, 0)\n",
    "      local h = type(r) == 'table' and r[1]\n",
    "      if not h then break end\n",
    "      if redis.pcall('exists', 'redlock-mux:waiter:' .. h) == 1 then\n",
    "        turn = h\n",
    "        break\n",
    "      end\n",
    "      redis.pcall('zrem', q, h)\n",
    "    end\n",
    "    local note = string.sub(ARGV[1], 1, 16)\n",
    "    if turn then\n",
    "      redis.pcall('publish', 'redlock-mux:next:' .. string.sub(turn, 1, 8), note .. turn)\n",
    "    else\n",
    "      redis.pcall('publish', 'redlock-mux:released:' .. KEYS[i], note)\n",
    "    end\n",
    "  else\n",
    "    held = 0\n",
    "  end\n",
    "end\n",
    "return held"
);

/// `scripts::ACQUIRE_WAIT` before the keys moved (SHA1 4ef795f7f5f557aecaf4d9137c6047c309ced2f6).
const OLD_ACQUIRE_WAIT: &str = concat!(
        "local function mark(k)\n",
        "  local v = redis.pcall('get', k)\n",
        "  if type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then\n",
        "    redis.pcall('append', k, '+')\n",
        "  end\n",
        "  return v\n",
        "end\n",
        "if #KEYS == 1 then\n",
        "  local id = ARGV[3]\n",
        "  local q = 'redlock-mux:queue:' .. KEYS[1]\n",
        "  local how = ARGV[7]\n",
        "  local out = how == 'o'\n",
        "  if id and out then\n",
        "    redis.pcall('zrem', q, id)\n",
        "    redis.pcall('del', 'redlock-mux:waiter:' .. id)\n",
        "  end\n",
        "  local function keep()\n",
        "    if redis.pcall('pttl', q) < tonumber(ARGV[4]) then redis.pcall('pexpire', q, ARGV[4]) end\n",
        "  end\n",
        "  local v, inq = false, false\n",
        "  local function alive()\n",
        "    local w = 'redlock-mux:waiter:' .. id\n",
        "    if not (inq and redis.pcall('pexpire', w, ARGV[4]) == 1) then redis.pcall('set', w, '1', 'PX', ARGV[4]) end\n",
        "  end\n",
        "  if how == 'h' and ARGV[5] ~= 'p' then v = redis.pcall('get', KEYS[1]) end\n",
        "  if not v then\n",
        "    if id and how == 'l' then inq = type(redis.pcall('zrank', q, id)) == 'number' end\n",
        "    local lined = inq or (id and redis.pcall('exists', q) == 1)\n",
        "    local behind = false\n",
        "    if lined and ARGV[5] == 'p' then\n",
        "      for _ = 1, 8 do\n",
        "        local r = redis.pcall('zrange', q, 0, 0)\n",
        "        local h = type(r) == 'table' and r[1]\n",
        "        if not h or h == id then break end\n",
        "        if redis.pcall('exists', 'redlock-mux:waiter:' .. h) == 1 then\n",
        "          behind = true if redis.pcall('exists', KEYS[1]) == 0 then redis.pcall('publish', 'redlock-mux:next:' .. string.sub(h, 1, 8), string.sub(ARGV[1], 1, 16) .. h) end\n",
        "          break\n",
        "        end\n",
        "        redis.pcall('zrem', q, h)\n",
        "      end\n",
        "    end\n",
        "    local val = ARGV[1]\n",
        "    if lined then val = val .. '+' end\n",
        "    if not behind and redis.call('set', KEYS[1], val, 'NX', 'PX', ARGV[2]) then\n",
        "      if lined and not out then\n",
        "        if not inq then redis.pcall('zadd', q, 'NX', ARGV[6], id) end\n",
        "        alive()\n",
        "        keep()\n",
        "      end\n",
        "      return 0\n",
        "    end\n",
        "  end\n",
        "  if id and not out then\n",
        "    if not inq then redis.pcall('zadd', q, 'NX', ARGV[6], id) end\n",
        "    keep()\n",
        "    alive()\n",
        "  end\n",
        "  local left = redis.call('pttl', KEYS[1])\n",
        "  if left == -2 then left = -1 elseif left == 0 then left = 1 end\n",
        "  if not v then\n",
        "    if id then v = mark(KEYS[1]) else v = redis.pcall('get', KEYS[1]) end\n",
        "  elseif id and type(v) == 'string' and #v == 32 and not string.find(v, '[^0-9a-f]') then\n",
        "    redis.pcall('append', KEYS[1], '+')\n",
        "  end\n",
        "  if type(v) ~= 'string' then v = '' end\n",
        "  return {left, string.sub(v, 1, 16)}\n",
        "end\n",
        "local left = 0\n",
        "for i = 1, #KEYS do\n",
        "  local t = redis.call('pttl', KEYS[i])\n",
        "  if t == -1 then left = -1\n",
        "  elseif t >= 0 and left >= 0 then left = math.max(left, t, 1) end\n",
        "end\n",
        "if left ~= 0 then\n",
        "  for i = 1, #KEYS do mark(KEYS[i]) end\n",
        "  return left\n",
        "end\n",
        "for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end\n",
        "return 0"
);

/// `scripts::FENCE_DRAW` before the keys moved (SHA1 275d0d082734ba1863507f86af15bf83ef7087fa).
const OLD_FENCE_DRAW: &str = concat!(
    "local n = #KEYS / 2\n",
    "for i = 1, n do\n",
    "  local v = redis.call('get', KEYS[i])\n",
    "  if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end\n",
    "end\n",
    "local top = 0\n",
    "for i = n + 1, #KEYS do\n",
    "  local c = tonumber(redis.call('get', KEYS[i]) or '0')\n",
    "  if c > top then top = c end\n",
    "end\n",
    "return top + 1"
);

/// `scripts::FENCE_RAISE` before the keys moved (SHA1 5ed1e2804f79de9ac51a20bca4f325c19326fa85).
const OLD_FENCE_RAISE: &str = concat!(
        "local n = #KEYS / 2\n",
        "for i = 1, n do\n",
        "  local v = redis.call('get', KEYS[i])\n",
        "  if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then return 0 end\n",
        "end\n",
        "local t = tonumber(ARGV[2])\n",
        "for i = n + 1, #KEYS do\n",
        "  if tonumber(redis.call('get', KEYS[i]) or '0') < t then redis.call('set', KEYS[i], ARGV[2]) end\n",
        "end\n",
        "return 1"
);

/// `EVAL src` on master `i`, as an old client sends it.
fn eval(m: &LocalMasters, i: usize, src: &str, keys: &[&str], argv: &[&str]) -> AdminReply {
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"EVAL", src.as_bytes(), n.as_bytes()];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    args.extend(argv.iter().map(|a| a.as_bytes()));
    m[i].cmd(&args).expect("EVAL")
}

fn cmd(m: &LocalMasters, i: usize, args: &[&[u8]]) -> AdminReply {
    m[i].cmd(args).expect("command")
}

fn int(r: AdminReply) -> i64 {
    match r {
        AdminReply::Int(n) => n,
        other => panic!("an integer expected: {other:?}"),
    }
}

/// An old client's token (32 lowercase hex digits).
fn token(n: u32) -> String {
    format!("{n:032x}")
}

/// One fenced lock of `key` by an old client on masters `on`: `SET NX PX`, the draw (the
/// largest answer), the write-back, the release. Its token.
fn old_fenced_lock(m: &LocalMasters, on: &[usize], key: &str, tok: &str) -> i64 {
    let counter = format!("redlock-mux:fence:{key}");
    for &i in on {
        assert!(cmd(
            m,
            i,
            &[
                b"SET",
                key.as_bytes(),
                tok.as_bytes(),
                b"NX",
                b"PX",
                b"10000"
            ]
        )
        .is_ok());
    }
    let drawn = on
        .iter()
        .map(|&i| int(eval(m, i, OLD_FENCE_DRAW, &[key, &counter], &[tok])))
        .max()
        .unwrap();
    let value = drawn.to_string();
    for &i in on {
        assert_eq!(
            int(eval(
                m,
                i,
                OLD_FENCE_RAISE,
                &[key, &counter],
                &[tok, &value]
            )),
            1
        );
        assert_eq!(int(eval(m, i, OLD_RELEASE, &[key], &[tok])), 1);
    }
    drawn
}

fn name(kind: &[u8], key: &str) -> Vec<u8> {
    aux_key(kind, key.as_bytes())
}

fn exists(m: &LocalMasters, i: usize, key: &[u8]) -> bool {
    int(cmd(m, i, &[b"EXISTS", key])) == 1
}

#[test]
fn an_upgrade_keeps_tokens_rising_and_leaves_nothing_in_a_new_locks_way() {
    let m = masters_with(3, DURABLE);
    let all = [0, 1, 2];

    // ---- today's state, by the old scripts ----------------------------------------------
    // Fenced locks of "up:fenced": three on every master, then two that reached masters 0
    // and 1 only (a quorum; master 2 was down): the counters are 5, 5 and 3.
    let mut last_old = 0;
    for n in 1..=5 {
        let on: &[usize] = if n <= 3 { &all } else { &[0, 1] };
        let t = old_fenced_lock(&m, on, "up:fenced", &token(n));
        assert_eq!(t, n as i64, "the old scripts' own tokens");
        last_old = t;
    }
    // "up:other": an old multi-resource history left it at 40 on a quorum.
    for i in [1, 2] {
        assert!(cmd(&m, i, &[b"SET", b"redlock-mux:fence:up:other", b"40"]).is_ok());
    }
    // "up:waited": held by an old client that is gone (its key lives 1.5 s), with two old
    // waiters in its old line (each refused once: the key marked, their waiter keys set).
    let old_holder = token(100);
    for i in all {
        assert!(cmd(
            &m,
            i,
            &[
                b"SET",
                b"up:waited",
                old_holder.as_bytes(),
                b"NX",
                b"PX",
                b"1500"
            ]
        )
        .is_ok());
        for (id, score, tok) in [
            ("oldcli01call0001", "1", token(101)),
            ("oldcli02call0002", "2", token(102)),
        ] {
            let r = eval(
                &m,
                i,
                OLD_ACQUIRE_WAIT,
                &["up:waited"],
                &[&tok, "10000", id, "60000", "", score],
            );
            assert!(matches!(r, AdminReply::Array(_)), "refused: {r:?}");
        }
        assert_eq!(
            int(cmd(&m, i, &[b"ZCARD", b"redlock-mux:queue:up:waited"])),
            2
        );
        assert!(exists(&m, i, b"redlock-mux:waiter:oldcli01call0001"));
        let v = support::get(&m, i, "up:waited").unwrap();
        assert_eq!(
            v,
            format!("{old_holder}+").into_bytes(),
            "marked by the old waiters"
        );
    }
    // "up:fair": an old polite waiter alive, first in its old line, the key free.
    for i in all {
        let tok = token(200);
        assert!(cmd(
            &m,
            i,
            &[b"SET", b"up:fair", tok.as_bytes(), b"PX", b"60000"]
        )
        .is_ok());
        eval(
            &m,
            i,
            OLD_ACQUIRE_WAIT,
            &["up:fair"],
            &[&token(201), "10000", "oldcli03call0003", "60000", "p", "1"],
        );
        assert_eq!(int(eval(&m, i, OLD_RELEASE, &["up:fair"], &[&tok])), 1);
        assert!(exists(&m, i, b"redlock-mux:waiter:oldcli03call0003"));
    }

    // ---- the new client: fencing --------------------------------------------------------
    let mut c = Redlock::builder()
        .masters(m.urls())
        .fencing(true)
        .build()
        .unwrap();
    let lock = c.lock("up:fenced", Duration::from_secs(10)).unwrap();
    let t1 = lock.fencing_token().unwrap();
    assert!(
        t1 > last_old as u64,
        "a token after the upgrade ({t1}) above the old ones ({last_old})"
    );
    c.release(lock).unwrap();
    // The lock and release returned at a quorum: settle before looking at every master.
    settle(&mut c, 3);
    // The write-back moved every counter it reached to the new name and retired the old.
    for i in all {
        let new = support::get(
            &m,
            i,
            std::str::from_utf8(&name(scripts::FENCE, "up:fenced")).unwrap(),
        );
        assert_eq!(new, Some(t1.to_string().into_bytes()), "master {i}");
        assert!(
            !exists(&m, i, b"redlock-mux:fence:up:fenced"),
            "master {i}: old counter left"
        );
    }
    let lock = c.lock("up:fenced", Duration::from_secs(10)).unwrap();
    let t2 = lock.fencing_token().unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    c.release(lock).unwrap();
    // Several resources: above the old counter of each.
    let lock = c
        .lock_many(["up:fenced", "up:other"], Duration::from_secs(10))
        .unwrap();
    let t3 = lock.fencing_token().unwrap();
    assert!(t3 > 40 && t3 > t2, "{t3}");
    c.release(lock).unwrap();
    settle(&mut c, 3);
    for i in all {
        assert!(
            !exists(&m, i, b"redlock-mux:fence:up:other"),
            "master {i}: old counter left"
        );
    }

    // ---- the new client: waiting behind an old holder -----------------------------------
    // The old holder never releases (its client is gone): the new waiter stands in the new
    // line and is granted once the old key expires, whatever the old line says.
    let waiter = Redlock::builder()
        .masters(m.urls())
        .retry_delay(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = Instant::now();
    let rx = in_thread(waiter, "up:waited");
    wait_until(
        "the new waiter in the new line",
        Duration::from_secs(5),
        || {
            all.iter()
                .all(|&i| int(cmd(&m, i, &[b"ZCARD", &name(scripts::QUEUE, "up:waited")])) == 1)
        },
    );
    let (r, mut w) = rx
        .recv_timeout(Duration::from_secs(8))
        .expect("the waiter's call");
    let lock = r.expect("granted once the old holder's key expired");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    w.release(lock).unwrap();
    // The old line and waiter keys were left alone (they expire by themselves).
    assert!(exists(&m, 0, b"redlock-mux:queue:up:waited"));

    // ---- the new client: fair waiters beside an old line --------------------------------
    // The old waiter first in the old line (alive) holds back no new waiter: a fair new
    // waiter is woken by the new holder's release, long before its 10 s retry.
    let mut holder = Redlock::new(m.urls()).unwrap();
    let held = holder.try_lock("up:fair", Duration::from_secs(30)).unwrap();
    let fair = Redlock::builder()
        .masters(m.urls())
        .fairness(true)
        .retry_delay(Duration::from_secs(10))
        .build()
        .unwrap();
    let rx = in_thread(fair, "up:fair");
    wait_until(
        "the fair waiter in the new line",
        Duration::from_secs(5),
        || {
            all.iter()
                .all(|&i| int(cmd(&m, i, &[b"ZCARD", &name(scripts::QUEUE, "up:fair")])) == 1)
        },
    );
    let released = Instant::now();
    holder.release(held).unwrap();
    let (r, mut w) = rx
        .recv_timeout(Duration::from_secs(8))
        .expect("the fair waiter's call");
    let lock = r.expect("the fair waiter gets the lock");
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "{:?}",
        released.elapsed()
    );
    w.release(lock).unwrap();
    // It left the new line and its liveness set at its release (returned at a quorum).
    settle(&mut w, 3);
    for i in all {
        assert_eq!(
            int(cmd(&m, i, &[b"ZCARD", &name(scripts::QUEUE, "up:fair")])),
            0
        );
        assert_eq!(
            int(cmd(&m, i, &[b"ZCARD", &name(scripts::ALIVE, "up:fair")])),
            0
        );
    }
}

/// `c.lock(key)` on a thread of its own: the result and the client back.
fn in_thread(
    mut c: Redlock,
    key: &'static str,
) -> mpsc::Receiver<(Result<redlock_mux::Lock, redlock_mux::Error>, Redlock)> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = c.lock(key, Duration::from_secs(30));
        let _ = tx.send((r, c));
    });
    rx
}
