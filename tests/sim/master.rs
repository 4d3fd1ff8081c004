//! A simulated Redis master: lock keys with `PX` expiry on the master's own clock, fencing
//! counters (no TTL), a script cache, and the requests the client sends, with the NEW
//! protocol's semantics and, behind [`Semantics`] toggles, the OLD ones.

use std::fmt;

use super::{Keys, Us};

/// The scripts a master may or may not have cached (`EVALSHA` needs them cached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    Release,
    Extend,
    AcquireMany,
    Draw,
    WriteBack,
    /// OLD: set the keys, then `INCR` the first resource's counter.
    OldFencedAcquire,
    /// OLD: raise one counter to at least a value, unconditionally.
    OldFenceMax,
    /// `ACQUIRE_WAIT`: the acquire of a call that may wait (one key: `SET NX PX`, the line).
    AcquireWait,
}

impl Script {
    pub fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Every script cached (what the connection handshake's `SCRIPT LOAD`s leave behind).
pub const ALL_SCRIPTS: u8 = 0xff;

/// A waiting call's place in a key's line (`ACQUIRE_WAIT`'s `ARGV[3..6]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line {
    /// The waiter id: the client in the top 16 bits (the real id's first 8 bytes name the
    /// client), the call's first token below.
    pub id: u64,
    /// How long the waiter stays in line without asking again (its liveness key's PX).
    pub alive_ms: u64,
    /// Fairness: do not take a free key while a live waiter stands ahead in line.
    pub polite: bool,
    /// Its arrival on the client's clock (µs): its place in line on every master.
    pub score: u64,
}

impl Line {
    /// The client whose waiter this is (the channel `redlock-mux:next:<client id>`).
    pub fn client(id: u64) -> usize {
        (id >> 48) as usize
    }
}

/// What a client asks one master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// One key: `SET key token NX PX ttl`. Several: the all-or-nothing acquire script.
    Set { keys: Keys, token: u64, ttl_ms: u64 },
    /// OLD fenced acquire: set every key only if none exists, then return
    /// `INCR(counter of the first resource)` (0 when taken).
    OldFencedAcquire { keys: Keys, token: u64, ttl_ms: u64 },
    /// `ACQUIRE_WAIT`: the acquire of a call that may wait. One key: `SET NX PX` (unless
    /// polite and behind a live waiter); refused, it stands in the key's line (with `line`)
    /// and answers `{pttl, holder}`. Several keys: all-or-nothing, refused with the largest
    /// `PTTL`.
    AcquireWait {
        keys: Keys,
        token: u64,
        ttl_ms: u64,
        line: Option<Line>,
    },
    /// Compare-and-delete every key (`RELEASE`); `leave`: the releasing call's waiter id,
    /// which leaves the keys' lines. Each key it deletes is announced: to the first live
    /// waiter in line, else on the key's channel.
    Release {
        keys: Keys,
        token: u64,
        leave: Option<u64>,
    },
    /// Compare-and-pexpire (NEW: never shortens; OLD: plain `PEXPIRE`).
    Extend { keys: Keys, token: u64, ttl_ms: u64 },
    /// NEW draw: if every key holds `token`, `1 + max(counters of the lock's resources)`,
    /// else 0. Read-only.
    Draw { keys: Keys, token: u64 },
    /// NEW write-back: if every key holds `token`, raise the counters to at least `value`
    /// and answer 1, else 0.
    WriteBack { keys: Keys, token: u64, value: u64 },
    /// OLD write-back: raise the counter of `res` to at least `value`; always 1.
    OldFenceMax { res: u8, value: u64 },
}

impl Msg {
    /// The script this request runs (`None`: a plain command, no `NOSCRIPT` possible).
    pub fn script(&self) -> Option<Script> {
        match self {
            Msg::Set { keys, .. } if keys.len() == 1 => None,
            Msg::Set { .. } => Some(Script::AcquireMany),
            Msg::OldFencedAcquire { .. } => Some(Script::OldFencedAcquire),
            Msg::Release { .. } => Some(Script::Release),
            Msg::Extend { .. } => Some(Script::Extend),
            Msg::Draw { .. } => Some(Script::Draw),
            Msg::WriteBack { .. } => Some(Script::WriteBack),
            Msg::OldFenceMax { .. } => Some(Script::OldFenceMax),
            Msg::AcquireWait { .. } => Some(Script::AcquireWait),
        }
    }

    pub fn is_release(&self) -> bool {
        matches!(self, Msg::Release { .. })
    }

    /// The lock attempt's token, for requests that carry one.
    pub fn token(&self) -> Option<u64> {
        match *self {
            Msg::Set { token, .. }
            | Msg::OldFencedAcquire { token, .. }
            | Msg::Release { token, .. }
            | Msg::Extend { token, .. }
            | Msg::Draw { token, .. }
            | Msg::WriteBack { token, .. }
            | Msg::AcquireWait { token, .. } => Some(token),
            Msg::OldFenceMax { .. } => None,
        }
    }
}

/// A request as written on one connection: by `EVALSHA` (`eval == false`) or `EVAL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req {
    pub msg: Msg,
    pub eval: bool,
}

impl fmt::Display for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match (self.msg.script(), self.eval) {
            (None, _) => "",
            (Some(_), false) => "EVALSHA ",
            (Some(_), true) => "EVAL ",
        };
        match self.msg {
            Msg::Set {
                keys,
                token,
                ttl_ms,
            } => write!(f, "{how}acquire {keys} token {token} px {ttl_ms}"),
            Msg::OldFencedAcquire {
                keys,
                token,
                ttl_ms,
            } => write!(
                f,
                "{how}fenced-acquire(old) {keys} token {token} px {ttl_ms}"
            ),
            Msg::Release {
                keys,
                token,
                leave: None,
            } => write!(f, "{how}release {keys} token {token}"),
            Msg::Release {
                keys,
                token,
                leave: Some(id),
            } => write!(
                f,
                "{how}release {keys} token {token} leave {}",
                waiter_name(id)
            ),
            Msg::AcquireWait {
                keys,
                token,
                ttl_ms,
                line,
            } => {
                write!(f, "{how}acquire-wait {keys} token {token} px {ttl_ms}")?;
                match line {
                    Some(l) => write!(
                        f,
                        " line {} score {} alive {}{}",
                        waiter_name(l.id),
                        super::ms(l.score),
                        l.alive_ms,
                        if l.polite { " polite" } else { "" }
                    ),
                    None => Ok(()),
                }
            }
            Msg::Extend {
                keys,
                token,
                ttl_ms,
            } => write!(f, "{how}extend {keys} token {token} px {ttl_ms}"),
            Msg::Draw { keys, token } => write!(f, "{how}draw {keys} token {token}"),
            Msg::WriteBack { keys, token, value } => {
                write!(f, "{how}write-back {keys} token {token} value {value}")
            }
            Msg::OldFenceMax { res, value } => {
                write!(f, "{how}fence-max(old) r{res} value {value}")
            }
        }
    }
}

/// A waiter id for traces: `w<client>.<first token>`.
pub fn waiter_name(id: u64) -> String {
    format!("w{}.{}", id >> 48, id & 0xffff_ffff_ffff)
}

/// What a master answers (the client encodes it to RESP and parses it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Null,
    Int(i64),
    NoScript,
    /// `ACQUIRE_WAIT` refused, one key: `{pttl (or -1), first 16 bytes of the holder's
    /// value}`; `holder` 0 is `''` (refused by politeness, the key is free).
    Waiting {
        left: i64,
        holder: u64,
    },
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Ok => f.write_str("+OK"),
            Answer::Null => f.write_str("(nil)"),
            Answer::Int(n) => write!(f, ":{n}"),
            Answer::NoScript => f.write_str("-NOSCRIPT"),
            Answer::Waiting { left, holder: 0 } => write!(f, "{{{left}, ''}}"),
            Answer::Waiting { left, holder } => write!(f, "{{{left}, token {holder}}}"),
        }
    }
}

/// What executing a request did that the checker must know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    None,
    /// Keys holding this token were created.
    Created(u64),
    /// A release of this token ran (whether or not it deleted anything).
    Released(u64),
}

/// Which version of the scripts the masters run.
#[derive(Clone, Copy, Debug)]
pub struct Semantics {
    /// NEW: extend sets `max(current expiry, now + ttl)`. OLD: plain `PEXPIRE now + ttl`.
    pub extend_never_shortens: bool,
    /// NEW: draw and write-back cover every resource's counter. OLD: the first one only.
    pub fence_all_resources: bool,
    /// Hazard: a line is ordered by each master's own arrival order (its clock when the
    /// waiter first joined there), not by the score the client chose.
    pub line_by_master_arrival: bool,
    /// Hazard: politeness refuses the first live waiter too (a polite attempt takes a free
    /// key only while nobody live stands in line).
    pub polite_refuses_first: bool,
    /// OLD: `ACQUIRE_WAIT` refreshes a waiter's liveness key (and the line's expiry) only
    /// when it refuses it. NEW: also when it takes the key for a waiter already in line.
    pub grant_skips_refresh: bool,
}

/// A key's line: waiter ids by score (ties by id, as a sorted set orders them), expiring
/// as a whole (`PEXPIRE` at each refusal).
#[derive(Clone, Debug, Default)]
pub struct Queue {
    pub members: Vec<(u64, u64)>,
    /// Expiry in the master's milliseconds.
    pub until: u64,
}

/// An announcement a release publishes (drained by the simulation after each request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// On `redlock-mux:released:<res>`: to every subscriber (nobody in line).
    Released { res: usize, fp: u64 },
    /// On `redlock-mux:next:<client of id>`: waiter `id`'s turn.
    Turn { res: usize, fp: u64, id: u64 },
}

pub struct Master {
    pub rate: f64,
    pub offset: f64,
    pub up: bool,
    /// `appendonly yes` + `appendfsync always`: a restart keeps keys and counters.
    pub persistent: bool,
    /// Incarnation: bumped at every crash; connections of an older incarnation are dead.
    pub inc: u32,
    /// The master's clock (µs) when it last came up.
    pub up_since: f64,
    /// Per resource: (token, expiry in the master's milliseconds).
    pub store: Vec<Option<(u64, u64)>>,
    /// Per resource: the fencing counter (no TTL).
    pub counters: Vec<u64>,
    /// Cached scripts, one bit per [`Script`].
    pub scripts: u8,
    /// Per resource: its line of waiters, if the key exists.
    pub lines: Vec<Option<Queue>>,
    /// Waiter liveness keys: (id, expiry in the master's milliseconds).
    pub waiters: Vec<(u64, u64)>,
    /// Clients with a subscription connection here (bit per client): lost at a crash.
    pub subs: u64,
    /// Announcements made by the last request.
    pub outbox: Vec<Publish>,
}

impl Master {
    pub fn clock(&self, t: Us) -> f64 {
        self.offset + self.rate * t as f64
    }

    /// Redis' `mstime()`.
    pub fn now_ms(&self, t: Us) -> u64 {
        (self.clock(t) / 1000.0) as u64
    }

    /// The token stored for `res`, if the key exists (Redis: expired when `now > when`).
    pub fn get(&mut self, res: usize, now_ms: u64) -> Option<u64> {
        match self.store[res] {
            Some((token, when)) if now_ms <= when => Some(token),
            Some(_) => {
                self.store[res] = None;
                None
            }
            None => None,
        }
    }

    fn all_hold(&mut self, keys: Keys, token: u64, now_ms: u64) -> bool {
        keys.iter().all(|r| self.get(r, now_ms) == Some(token))
    }

    fn none_exists(&mut self, keys: Keys, now_ms: u64) -> bool {
        keys.iter().all(|r| self.get(r, now_ms).is_none())
    }

    /// Whether waiter `id`'s liveness key exists.
    fn waiter_live(&mut self, id: u64, now_ms: u64) -> bool {
        self.waiters.retain(|&(_, until)| now_ms <= until);
        self.waiters.iter().any(|&(w, _)| w == id)
    }

    /// The line of `res`, if its key exists.
    fn queue(&mut self, res: usize, now_ms: u64) -> Option<&mut Queue> {
        if self.lines[res]
            .as_ref()
            .is_some_and(|q| now_ms > q.until || q.members.is_empty())
        {
            self.lines[res] = None;
        }
        self.lines[res].as_mut()
    }

    fn zrem(&mut self, res: usize, id: u64, now_ms: u64) {
        if let Some(q) = self.queue(res, now_ms) {
            q.members.retain(|&(_, w)| w != id);
        }
        self.queue(res, now_ms);
    }

    /// The scripts' loop: the first live waiter of `res`'s line, dropping up to 8 dead
    /// ones first. `stop_at`: `ACQUIRE_WAIT`'s loop stops (nobody ahead) at its own id.
    fn first_live(&mut self, res: usize, stop_at: Option<u64>, now_ms: u64) -> Option<u64> {
        for _ in 0..8 {
            let head = self.queue(res, now_ms)?.members.first().map(|&(_, w)| w)?;
            if Some(head) == stop_at {
                return None;
            }
            if self.waiter_live(head, now_ms) {
                return Some(head);
            }
            self.zrem(res, head, now_ms);
        }
        None
    }

    /// Crash: connections die; without persistence keys and counters are gone.
    pub fn crash(&mut self) {
        self.up = false;
        self.inc += 1;
        self.subs = 0;
        self.outbox.clear();
        if !self.persistent {
            self.store.iter_mut().for_each(|k| *k = None);
            self.counters.iter_mut().for_each(|c| *c = 0);
            self.lines.iter_mut().for_each(|q| *q = None);
            self.waiters.clear();
        }
    }

    /// Back up: every client reconnects and its handshake loads every script.
    pub fn come_up(&mut self, now: Us) {
        self.up = true;
        self.up_since = self.clock(now);
        self.scripts = ALL_SCRIPTS;
    }

    /// Run one request at time `now` (true time), as Redis would, atomically.
    pub fn execute(&mut self, req: Req, now: Us, sem: Semantics) -> (Answer, Effect) {
        if let Some(s) = req.msg.script() {
            if req.eval {
                self.scripts |= s.bit();
            } else if self.scripts & s.bit() == 0 {
                return (Answer::NoScript, Effect::None);
            }
        }
        let now_ms = self.now_ms(now);
        match req.msg {
            Msg::Set {
                keys,
                token,
                ttl_ms,
            } => {
                let free = self.none_exists(keys, now_ms);
                if free {
                    for r in keys.iter() {
                        self.store[r] = Some((token, now_ms + ttl_ms));
                    }
                }
                match (keys.len() == 1, free) {
                    (true, true) => (Answer::Ok, Effect::Created(token)),
                    (true, false) => (Answer::Null, Effect::None),
                    (false, true) => (Answer::Int(1), Effect::Created(token)),
                    (false, false) => (Answer::Int(0), Effect::None),
                }
            }
            Msg::OldFencedAcquire {
                keys,
                token,
                ttl_ms,
            } => {
                if !self.none_exists(keys, now_ms) {
                    return (Answer::Int(0), Effect::None);
                }
                for r in keys.iter() {
                    self.store[r] = Some((token, now_ms + ttl_ms));
                }
                let c = &mut self.counters[keys.first()];
                *c += 1;
                (Answer::Int(*c as i64), Effect::Created(token))
            }
            Msg::Release { keys, token, leave } => {
                let mut held = 1;
                if let Some(id) = leave {
                    self.waiters.retain(|&(w, _)| w != id);
                }
                for r in keys.iter() {
                    if let Some(id) = leave {
                        self.zrem(r, id, now_ms);
                    }
                    if self.get(r, now_ms) == Some(token) {
                        self.store[r] = None;
                        let p = match self.first_live(r, None, now_ms) {
                            Some(id) => Publish::Turn {
                                res: r,
                                fp: token,
                                id,
                            },
                            None => Publish::Released { res: r, fp: token },
                        };
                        self.outbox.push(p);
                    } else {
                        held = 0;
                    }
                }
                (Answer::Int(held), Effect::Released(token))
            }
            Msg::AcquireWait {
                keys,
                token,
                ttl_ms,
                line,
            } if keys.len() == 1 => {
                let r = keys.first();
                let mut behind = false;
                if let Some(l) = line.filter(|l| l.polite) {
                    behind = if sem.polite_refuses_first {
                        self.first_live(r, None, now_ms).is_some()
                    } else {
                        self.first_live(r, Some(l.id), now_ms).is_some()
                    };
                }
                if !behind && self.get(r, now_ms).is_none() {
                    self.store[r] = Some((token, now_ms + ttl_ms));
                    if let Some(l) = line.filter(|_| !sem.grant_skips_refresh) {
                        if self.waiter_live(l.id, now_ms) {
                            self.waiters.retain(|&(w, _)| w != l.id);
                            self.waiters.push((l.id, now_ms + l.alive_ms));
                            if let Some(q) = self.queue(r, now_ms) {
                                q.until = now_ms + l.alive_ms;
                            }
                        }
                    }
                    return (Answer::Int(0), Effect::Created(token));
                }
                if let Some(l) = line {
                    let score = if sem.line_by_master_arrival {
                        self.clock(now) as u64
                    } else {
                        l.score
                    };
                    let q = match self.queue(r, now_ms) {
                        Some(q) => q,
                        None => self.lines[r].insert(Queue::default()),
                    };
                    if !q.members.iter().any(|&(_, w)| w == l.id) {
                        let at = q
                            .members
                            .iter()
                            .position(|&m| m > (score, l.id))
                            .unwrap_or(q.members.len());
                        q.members.insert(at, (score, l.id));
                    }
                    q.until = now_ms + l.alive_ms;
                    self.waiters.retain(|&(w, _)| w != l.id);
                    self.waiters.push((l.id, now_ms + l.alive_ms));
                }
                match self.get(r, now_ms) {
                    Some(holder) => {
                        let (_, when) = self.store[r].expect("exists");
                        let left = (when - now_ms).max(1) as i64;
                        (Answer::Waiting { left, holder }, Effect::None)
                    }
                    None => (
                        Answer::Waiting {
                            left: -1,
                            holder: 0,
                        },
                        Effect::None,
                    ),
                }
            }
            Msg::AcquireWait {
                keys,
                token,
                ttl_ms,
                ..
            } => {
                let mut left = 0;
                for r in keys.iter() {
                    if self.get(r, now_ms).is_some() {
                        let (_, when) = self.store[r].expect("exists");
                        left = left.max(when - now_ms).max(1);
                    }
                }
                if left != 0 {
                    return (Answer::Int(left as i64), Effect::None);
                }
                for r in keys.iter() {
                    self.store[r] = Some((token, now_ms + ttl_ms));
                }
                (Answer::Int(0), Effect::Created(token))
            }
            Msg::Extend {
                keys,
                token,
                ttl_ms,
            } => {
                if !self.all_hold(keys, token, now_ms) {
                    return (Answer::Int(0), Effect::None);
                }
                for r in keys.iter() {
                    let (_, when) = self.store[r].expect("held");
                    let new = now_ms + ttl_ms;
                    let when = if sem.extend_never_shortens {
                        when.max(new)
                    } else {
                        new
                    };
                    self.store[r] = Some((token, when));
                }
                (Answer::Int(1), Effect::None)
            }
            Msg::Draw { keys, token } => {
                if !self.all_hold(keys, token, now_ms) {
                    return (Answer::Int(0), Effect::None);
                }
                let max = if sem.fence_all_resources {
                    keys.iter().map(|r| self.counters[r]).max().unwrap_or(0)
                } else {
                    self.counters[keys.first()]
                };
                (Answer::Int(max as i64 + 1), Effect::None)
            }
            Msg::WriteBack { keys, token, value } => {
                if !self.all_hold(keys, token, now_ms) {
                    return (Answer::Int(0), Effect::None);
                }
                if sem.fence_all_resources {
                    for r in keys.iter() {
                        self.counters[r] = self.counters[r].max(value);
                    }
                } else {
                    let r = keys.first();
                    self.counters[r] = self.counters[r].max(value);
                }
                (Answer::Int(1), Effect::None)
            }
            Msg::OldFenceMax { res, value } => {
                let c = &mut self.counters[res as usize];
                *c = (*c).max(value);
                (Answer::Int(1), Effect::None)
            }
        }
    }
}
