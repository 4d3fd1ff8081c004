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
}

impl Script {
    pub fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Every script cached (what the connection handshake's `SCRIPT LOAD`s leave behind).
pub const ALL_SCRIPTS: u8 = 0x7f;

/// What a client asks one master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// One key: `SET key token NX PX ttl`. Several: the all-or-nothing acquire script.
    Set { keys: Keys, token: u64, ttl_ms: u64 },
    /// OLD fenced acquire: set every key only if none exists, then return
    /// `INCR(counter of the first resource)` (0 when taken).
    OldFencedAcquire { keys: Keys, token: u64, ttl_ms: u64 },
    /// Compare-and-delete every key.
    Release { keys: Keys, token: u64 },
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
            | Msg::WriteBack { token, .. } => Some(token),
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
            Msg::Release { keys, token } => write!(f, "{how}release {keys} token {token}"),
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

/// What a master answers (the client encodes it to RESP and parses it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Null,
    Int(i64),
    NoScript,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Ok => f.write_str("+OK"),
            Answer::Null => f.write_str("(nil)"),
            Answer::Int(n) => write!(f, ":{n}"),
            Answer::NoScript => f.write_str("-NOSCRIPT"),
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

    /// Crash: connections die; without persistence keys and counters are gone.
    pub fn crash(&mut self) {
        self.up = false;
        self.inc += 1;
        if !self.persistent {
            self.store.iter_mut().for_each(|k| *k = None);
            self.counters.iter_mut().for_each(|c| *c = 0);
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
            Msg::Release { keys, token } => {
                let mut held = 1;
                for r in keys.iter() {
                    if self.get(r, now_ms) == Some(token) {
                        self.store[r] = None;
                    } else {
                        held = 0;
                    }
                }
                (Answer::Int(held), Effect::Released(token))
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
