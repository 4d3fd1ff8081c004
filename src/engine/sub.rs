//! Release notifications: a second connection per master, in subscriber mode, opened only
//! while some lock task waits (and for [`LINGER`] after the last one stopped waiting).
//!
//! The release script announces each key it deleted: on `redlock-mux:next:<client>` when a
//! waiter stands in the key's line (the first live one's client: [`crate::scripts::NEXT_PREFIX`]),
//! else on `redlock-mux:released:<key>` ([`crate::scripts::RELEASED_PREFIX`]). A waiting task
//! *subscribes* to its keys ([`Engine::subscribe`]) and, if it stands in line, to its
//! client's own channel ([`Engine::subscribe_direct`]): each is a [`Channel`] with a
//! reference count, subscribed with one `SUBSCRIBE` per master on that master's
//! subscription connection, and dropped (`UNSUBSCRIBE`) once nobody waited on it for
//! [`LINGER`] (so a hot resource's waiters, coming and going, keep one subscription). The
//! connection closes when no channel is left.
//!
//! What arrives becomes a [`Notice`] for the layer above: a release was announced (with the
//! first bytes of the released token, which name the release, and the waiter whose turn it
//! is, if one was named), or a master confirmed a
//! subscription (a waiter that was refused before it could hear of releases then tries
//! once more: a release in between would have gone unheard). A notice only makes a waiter
//! try earlier; every grant still comes from a quorum round. A lost notice (a connection cut,
//! a master restarted, a key that expired: nobody announces an expiry) costs the waiter its
//! timed fallback, never the lock.
//!
//! RESP2 subscriber connections receive `*3 message <channel> <payload>` arrays at any
//! time, between the `*3 subscribe <channel> <count>` confirmations; errors (`-NOPERM`:
//! an ACL user without the right to the channel) answer the oldest command, and make that
//! channel unheard on that master until the next connection.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::time::{Duration, Instant};

use mio::Token as MioToken;
use smallvec::SmallVec;

use super::encode::encode_auth;
use super::transport::{connect_unix, read_some, write_some, Conn, Stream, Target};
use super::Engine;
use crate::resp::{self, Frame};
use crate::rules::{ErrorText, Fault, TlsFault};
use crate::scripts::{NEXT_PREFIX, NOTICE_LEN, RELEASED_PREFIX, WAITER_ID_LEN};

/// How long a channel stays subscribed after its last waiter left.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Input buffer of a subscription connection (notices are small).
const SUB_INBUF: usize = 4096;

/// The first bytes of a released token, as published: they name one release.
pub(crate) type Fingerprint = [u8; NOTICE_LEN];

/// The fingerprint a release of `token` publishes.
pub(crate) fn fingerprint(token: &[u8]) -> Fingerprint {
    let mut fp = [0u8; NOTICE_LEN];
    let n = token.len().min(NOTICE_LEN);
    fp[..n].copy_from_slice(&token[..n]);
    fp
}

/// A channel's handle: slot plus generation (a stale handle never aliases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ChanId {
    slot: u32,
    gen: u32,
}

impl ChanId {
    /// The slot, for the layer above's per-channel tables (unique among live channels).
    pub(crate) fn slot(self) -> usize {
        self.slot as usize
    }
}

/// What the subscription connections heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Master `master` announced a release of the channel's key (nobody stood in its
    /// line there), with the first bytes of the token released.
    Released {
        chan: ChanId,
        master: usize,
        fp: Fingerprint,
    },
    /// Master `master` announced a release that makes it the turn of this client's waiter
    /// `id` (the first live waiter in the key's line there), with the released token's
    /// fingerprint.
    Turn {
        master: usize,
        fp: Fingerprint,
        id: Fingerprint,
    },
    /// A master confirmed the subscription: releases there are heard from now on.
    Subscribed { chan: ChanId },
}

/// Where one channel's subscription stands on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Off,
    /// `SUBSCRIBE` sent, not confirmed.
    Asked,
    /// Confirmed at this instant.
    Since(Instant),
    /// The master refused it (e.g. `NOPERM`): not asked again on this connection.
    Refused,
}

struct Channel {
    gen: u32,
    live: bool,
    /// The client's own channel ([`NEXT_PREFIX`]`<client id>`), not a resource's.
    direct: bool,
    key: Vec<u8>,
    /// Waiters holding it.
    refs: u32,
    /// No waiter since then (lingering).
    idle_since: Option<Instant>,
    on: SmallVec<[On; 8]>,
}

/// The table of channels.
#[derive(Default)]
pub(super) struct Channels {
    chans: Vec<Channel>,
    free: Vec<u32>,
    by_key: HashMap<Vec<u8>, u32>,
    /// The client's own channel, while held or lingering.
    direct: Option<u32>,
    /// Channels in the table (waited on, or lingering).
    pub(super) live: usize,
    /// Lingering channels (no waiter).
    pub(super) idle: usize,
    notices: VecDeque<Notice>,
    /// Some subscription connection has bytes queued.
    pub(super) dirty: bool,
}

/// What a pending command of a subscription connection was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubTag {
    Auth,
    Subscribe(ChanId),
    Unsubscribe,
}

/// One master's subscription connection.
pub(super) struct SubConn {
    conn: Conn,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    parser: resp::Parser,
    resuming: bool,
    pending: VecDeque<SubTag>,
    failures: u32,
    answered: bool,
    retry_at: Option<Instant>,
    connect_deadline: Instant,
    last_progress: Instant,
}

impl Channel {
    fn prefix(&self) -> &'static [u8] {
        if self.direct {
            NEXT_PREFIX
        } else {
            RELEASED_PREFIX
        }
    }
}

impl SubConn {
    pub(super) fn new(limits: resp::Limits, now: Instant) -> SubConn {
        SubConn {
            conn: Conn::Down,
            out: Vec::new(),
            out_pos: 0,
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            parser: resp::Parser::new(limits),
            resuming: false,
            pending: VecDeque::new(),
            failures: 0,
            answered: false,
            retry_at: None,
            connect_deadline: now,
            last_progress: now,
        }
    }

    fn clear_streams(&mut self) {
        self.out.clear();
        self.out_pos = 0;
        self.in_start = 0;
        self.in_end = 0;
        self.parser.reset();
        self.resuming = false;
        self.pending.clear();
    }

    /// Shift its clocks by an idle gap of the client's (see `Engine::shift_stall_clocks`).
    pub(super) fn shift(&mut self, idle: Duration, entered: Instant) {
        self.last_progress = (self.last_progress + idle).min(entered);
        let connecting = match &self.conn {
            Conn::Connecting(_) | Conn::Resolving => true,
            Conn::Up(s) => s.tls_handshaking(),
            Conn::Down => false,
        };
        if connecting {
            self.connect_deadline += idle;
        }
    }
}

/// `SUBSCRIBE <prefix><key>` (or `UNSUBSCRIBE`).
fn encode_channel_command(out: &mut Vec<u8>, command: &[u8], prefix: &[u8], key: &[u8]) {
    let mut channel: SmallVec<[u8; 128]> = SmallVec::from_slice(prefix);
    channel.extend_from_slice(key);
    resp::encode_command(
        out,
        &[resp::Arg::Bytes(command), resp::Arg::Bytes(&channel)],
    );
}

impl Engine {
    /// A lock task waits for `key` to be released: hold its channel (subscribing on every
    /// master if it is new). Pair with [`Engine::unsubscribe`].
    pub(crate) fn subscribe(&mut self, key: &[u8], now: Instant) -> ChanId {
        let found = self.chans.by_key.get(key).copied();
        let (slot, new) = match found {
            Some(s) => (s, false),
            None => {
                let slot = self.new_channel(key, false);
                self.chans.by_key.insert(key.to_vec(), slot);
                (slot, true)
            }
        };
        self.hold_channel(slot, new, now)
    }

    /// A lock task of this client waits in some key's line: hold the client's own channel
    /// ([`NEXT_PREFIX`]`<client_id>`), where releases name the waiter whose turn it is.
    pub(crate) fn subscribe_direct(&mut self, client_id: &[u8], now: Instant) -> ChanId {
        let (slot, new) = match self.chans.direct {
            Some(s) => (s, false),
            None => {
                let slot = self.new_channel(client_id, true);
                self.chans.direct = Some(slot);
                (slot, true)
            }
        };
        self.hold_channel(slot, new, now)
    }

    fn new_channel(&mut self, key: &[u8], direct: bool) -> u32 {
        let n = self.nodes.len();
        let slot = match self.chans.free.pop() {
            Some(s) => s,
            None => {
                self.chans.chans.push(Channel {
                    gen: 0,
                    live: false,
                    direct: false,
                    key: Vec::new(),
                    refs: 0,
                    idle_since: None,
                    on: SmallVec::new(),
                });
                (self.chans.chans.len() - 1) as u32
            }
        };
        let c = &mut self.chans.chans[slot as usize];
        c.gen = c.gen.wrapping_add(1);
        c.live = true;
        c.direct = direct;
        c.key.clear();
        c.key.extend_from_slice(key);
        c.refs = 0;
        c.idle_since = None;
        c.on.clear();
        c.on.resize(n, On::Off);
        self.chans.live += 1;
        slot
    }

    fn hold_channel(&mut self, slot: u32, new: bool, now: Instant) -> ChanId {
        let n = self.nodes.len();
        let c = &mut self.chans.chans[slot as usize];
        if c.idle_since.take().is_some() {
            self.chans.idle -= 1;
        }
        c.refs += 1;
        let id = ChanId { slot, gen: c.gen };
        if new {
            for i in 0..n {
                self.sub_ask(i, id, now);
            }
        }
        id
    }

    /// A waiter of the channel stopped waiting. The channel lingers for [`LINGER`].
    pub(crate) fn unsubscribe(&mut self, id: ChanId, now: Instant) {
        let Some(c) = self.chans.chans.get_mut(id.slot as usize) else {
            return;
        };
        if !c.live || c.gen != id.gen || c.refs == 0 {
            return;
        }
        c.refs -= 1;
        if c.refs == 0 {
            c.idle_since = Some(now);
            self.chans.idle += 1;
            self.due_by(now + LINGER);
        }
    }

    /// Some channel is held or lingers: the subscription connections want the loop run
    /// (to read them, and to close them when the linger ends).
    pub(crate) fn listening(&self) -> bool {
        self.chans.live > 0
    }

    /// The channel of `key`, if some task waits on it (or did lately).
    pub(crate) fn channel(&self, key: &[u8]) -> Option<ChanId> {
        if self.chans.live == 0 {
            return None;
        }
        let &slot = self.chans.by_key.get(key)?;
        Some(ChanId {
            slot,
            gen: self.chans.chans[slot as usize].gen,
        })
    }

    /// Since when master `i` has confirmed the channel's subscription (releases there are
    /// announced to us), if it has.
    pub(crate) fn subscribed_since(&self, id: ChanId, i: usize) -> Option<Instant> {
        let c = self.chans.chans.get(id.slot as usize)?;
        if !c.live || c.gen != id.gen {
            return None;
        }
        match c.on.get(i) {
            Some(On::Since(t)) => Some(*t),
            _ => None,
        }
    }

    /// The next notice, oldest first.
    #[inline]
    pub(crate) fn take_notice(&mut self) -> Option<Notice> {
        if self.chans.notices.is_empty() {
            return None;
        }
        self.chans.notices.pop_front()
    }

    /// Ask master `i` for channel `id`: on its subscription connection if it has one (or is
    /// opening one), else by opening one, unless it is backing off (then the reconnect
    /// subscribes every channel).
    fn sub_ask(&mut self, i: usize, id: ChanId, now: Instant) {
        match self.nodes[i].sub.conn {
            Conn::Up(_) | Conn::Connecting(_) => {
                self.sub_write_subscribe(i, id);
                self.chans.dirty = true;
            }
            Conn::Resolving => {}
            Conn::Down => {
                if self.nodes[i].sub.retry_at.is_none_or(|t| now >= t) {
                    self.sub_connect(i, now);
                } else if let Some(t) = self.nodes[i].sub.retry_at {
                    self.due_by(t);
                }
            }
        }
    }

    fn sub_write_subscribe(&mut self, i: usize, id: ChanId) {
        let c = &mut self.chans.chans[id.slot as usize];
        let sub = &mut self.nodes[i].sub;
        encode_channel_command(&mut sub.out, b"SUBSCRIBE", c.prefix(), &c.key);
        if sub.pending.is_empty() {
            sub.last_progress = Instant::now();
        }
        sub.pending.push_back(SubTag::Subscribe(id));
        c.on[i] = On::Asked;
    }

    /// Open master `i`'s subscription connection (to the address its lock connection
    /// uses), queue AUTH and a `SUBSCRIBE` of every channel. A failure backs off.
    fn sub_connect(&mut self, i: usize, now: Instant) {
        let node = &self.nodes[i];
        let stream = match &node.target {
            &Target::Addr(addr) => self.open_tcp(i, addr),
            Target::Host { .. } => match node.addr {
                Some(addr) => self.open_tcp(i, addr),
                // The lock connection has not resolved the name yet: try again later.
                None => Err(Fault::Down),
            },
            Target::Unix(path) => connect_unix(path)
                .map(Stream::Unix)
                .map_err(|e| Fault::Connect(e.kind())),
        };
        let n = self.nodes.len();
        let registered = stream.and_then(|mut s| {
            s.register(self.poll.registry(), MioToken(n + i))
                .map(|()| s)
                .map_err(|e| Fault::Connect(e.kind()))
        });
        let stream = match registered {
            Ok(s) => s,
            Err(f) => {
                self.sub_backoff(i, f, now);
                return;
            }
        };
        let node = &mut self.nodes[i];
        node.stats.sub_connects += 1;
        let sub = &mut node.sub;
        sub.clear_streams();
        if sub.inbuf.is_empty() {
            sub.inbuf.resize(SUB_INBUF, 0);
        }
        sub.answered = false;
        sub.connect_deadline = now + self.cfg.connect_timeout;
        sub.last_progress = now;
        sub.conn = Conn::Connecting(stream);
        if encode_auth(&mut sub.out, node.user.as_deref(), node.password.as_deref()) {
            sub.pending.push_back(SubTag::Auth);
        }
        for slot in 0..self.chans.chans.len() {
            let c = &self.chans.chans[slot];
            if c.live {
                let id = ChanId {
                    slot: slot as u32,
                    gen: c.gen,
                };
                self.sub_write_subscribe(i, id);
            }
        }
        self.due_by(now + self.cfg.connect_timeout.min(self.cfg.stall_timeout));
    }

    /// A subscription connection could not be opened, or broke before answering: back off
    /// as the lock connection does.
    fn sub_backoff(&mut self, i: usize, fault: Fault, now: Instant) {
        let sub = &mut self.nodes[i].sub;
        sub.failures = sub.failures.saturating_add(1);
        let shift = (sub.failures - 1).min(16);
        let backoff = self
            .cfg
            .backoff_min
            .saturating_mul(1 << shift)
            .min(self.cfg.backoff_max);
        sub.retry_at = Some(now + backoff);
        self.nodes[i].stats.last_sub_fault = Some(fault);
        self.due_by(now + backoff);
    }

    /// Close master `i`'s subscription connection: every channel is unheard there until the
    /// next connection (reopened at once if it had worked, else after a backoff).
    #[cold]
    fn sub_fail(&mut self, i: usize, fault: Fault, now: Instant) {
        let sub = &mut self.nodes[i].sub;
        let conn = std::mem::replace(&mut sub.conn, Conn::Down);
        if let Conn::Up(s) | Conn::Connecting(s) = conn {
            s.close(self.poll.registry(), false);
        }
        sub.clear_streams();
        let answered = sub.answered;
        for c in self.chans.chans.iter_mut().filter(|c| c.live) {
            c.on[i] = On::Off;
        }
        if self.chans.live == 0 {
            return;
        }
        if answered {
            let sub = &mut self.nodes[i].sub;
            sub.failures = 0;
            sub.retry_at = None;
            self.nodes[i].stats.last_sub_fault = Some(fault);
            // Reopened by the next tick.
            self.due_by(now);
        } else {
            self.sub_backoff(i, fault, now);
        }
    }

    /// Close every subscription connection: no channel is left.
    fn sub_close_all(&mut self) {
        for i in 0..self.nodes.len() {
            let sub = &mut self.nodes[i].sub;
            let conn = std::mem::replace(&mut sub.conn, Conn::Down);
            if let Conn::Up(s) | Conn::Connecting(s) = conn {
                s.close(self.poll.registry(), false);
            }
            sub.clear_streams();
            sub.retry_at = None;
            sub.failures = 0;
        }
    }

    /// Write what the subscription connections have queued (from [`Engine::flush`]).
    #[cold]
    pub(super) fn sub_flush_all(&mut self) {
        self.chans.dirty = false;
        for i in 0..self.nodes.len() {
            self.sub_flush(i);
        }
    }

    fn sub_flush(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let sub = &mut node.sub;
        let Conn::Up(stream) = &mut sub.conn else {
            return;
        };
        while sub.out_pos < sub.out.len() {
            match write_some(stream, &sub.out[sub.out_pos..], &mut node.stats) {
                Ok(0) => break,
                Ok(n) => sub.out_pos += n,
                Err(f) => {
                    self.sub_fail(i, f, Instant::now());
                    return;
                }
            }
        }
        if sub.out_pos == sub.out.len() {
            sub.out.clear();
            sub.out_pos = 0;
        }
        #[cfg(feature = "tls")]
        if let Stream::Tls(t) = stream {
            if let Err(f) = t.flush(&mut node.stats) {
                self.sub_fail(i, f, Instant::now());
            }
        }
    }

    /// A readiness event of master `i`'s subscription connection.
    pub(super) fn sub_event(&mut self, i: usize, ev: &mio::event::Event, now: Instant) {
        let error = ev.is_error();
        let closed = ev.is_read_closed() || error;
        let readable = ev.is_readable() || closed;
        let writable = ev.is_writable() || ev.is_write_closed() || error;
        let sub = &mut self.nodes[i].sub;
        if let Conn::Connecting(stream) = &mut sub.conn {
            if !writable && !readable {
                return;
            }
            match stream.connected() {
                Ok(true) => {
                    let Conn::Connecting(s) = std::mem::replace(&mut sub.conn, Conn::Down) else {
                        unreachable!()
                    };
                    sub.conn = Conn::Up(s);
                    self.sub_flush(i);
                }
                Ok(false) => return,
                Err(f) => {
                    self.sub_fail(i, f, now);
                    return;
                }
            }
        } else if writable && (sub.out_pos < sub.out.len() || sub.conn.tls_wants_write()) {
            self.sub_flush(i);
        }
        if readable && matches!(self.nodes[i].sub.conn, Conn::Up(_)) {
            self.sub_read(i, closed, now);
            #[cfg(feature = "tls")]
            if self.nodes[i].sub.conn.tls_wants_write() {
                self.sub_flush(i);
            }
        }
    }

    fn sub_read(&mut self, i: usize, closed: bool, now: Instant) {
        loop {
            let node = &mut self.nodes[i];
            let sub = &mut node.sub;
            if sub.in_end == sub.inbuf.len() {
                if sub.in_start > 0 {
                    sub.inbuf.copy_within(sub.in_start..sub.in_end, 0);
                    sub.in_end -= sub.in_start;
                    sub.in_start = 0;
                } else {
                    let cap = sub.parser.limits().max_bulk_len + 64 * 1024;
                    if sub.inbuf.len() >= cap {
                        let f = Fault::Protocol(resp::Error::BulkTooLong);
                        self.sub_fail(i, f, now);
                        return;
                    }
                    let new_len = (sub.inbuf.len() * 2).clamp(SUB_INBUF, cap);
                    sub.inbuf.resize(new_len, 0);
                }
            }
            let Conn::Up(stream) = &mut sub.conn else {
                return;
            };
            let space = sub.inbuf.len() - sub.in_end;
            let drains = stream.short_read_drains();
            match read_some(stream, &mut sub.inbuf[sub.in_end..], &mut node.stats) {
                Ok(0) => return,
                Ok(n) => {
                    sub.in_end += n;
                    sub.last_progress = now;
                    if !self.sub_process(i, now) {
                        return;
                    }
                    if n < space && !closed && drains {
                        return;
                    }
                }
                Err(f) => {
                    self.sub_fail(i, f, now);
                    return;
                }
            }
        }
    }

    /// Handle every complete frame; `false` if the connection was closed.
    fn sub_process(&mut self, i: usize, now: Instant) -> bool {
        loop {
            let sub = &mut self.nodes[i].sub;
            if sub.in_start == sub.in_end {
                sub.in_start = 0;
                sub.in_end = 0;
                return true;
            }
            let buf = &sub.inbuf[sub.in_start..sub.in_end];
            let parsed = if sub.resuming {
                sub.parser.parse(buf)
            } else {
                match resp::parse(buf, sub.parser.limits()) {
                    Ok(resp::Status::Partial(_)) => sub.parser.parse(buf),
                    other => other,
                }
            };
            sub.resuming = matches!(parsed, Ok(resp::Status::Partial(_)));
            let (frame, used) = match parsed {
                Ok(resp::Status::Complete(c)) => c,
                Ok(resp::Status::Partial(_)) => return true,
                Err(e) => {
                    self.sub_fail(i, Fault::Protocol(e), now);
                    return false;
                }
            };
            let what = classify_sub(&frame);
            let sub = &mut self.nodes[i].sub;
            sub.in_start += used;
            let ok = match what {
                SubFrame::Message { key, fp } => {
                    self.nodes[i].stats.notices += 1;
                    if let Some(chan) = self.channel(&key) {
                        let master = i;
                        self.chans
                            .notices
                            .push_back(Notice::Released { chan, master, fp });
                    }
                    true
                }
                SubFrame::Turn { fp, id } => {
                    self.nodes[i].stats.notices += 1;
                    if self.chans.direct.is_some() {
                        let master = i;
                        self.chans
                            .notices
                            .push_back(Notice::Turn { master, fp, id });
                    }
                    true
                }
                SubFrame::Subscribed => match sub.pending.pop_front() {
                    Some(SubTag::Subscribe(id)) => {
                        sub.answered = true;
                        sub.failures = 0;
                        sub.retry_at = None;
                        if let Some(c) = self.chans.chans.get_mut(id.slot as usize) {
                            if c.live && c.gen == id.gen && c.on[i] == On::Asked {
                                c.on[i] = On::Since(now);
                                self.chans
                                    .notices
                                    .push_back(Notice::Subscribed { chan: id });
                            }
                        }
                        true
                    }
                    _ => false,
                },
                SubFrame::Unsubscribed => {
                    matches!(sub.pending.pop_front(), Some(SubTag::Unsubscribe))
                }
                SubFrame::Ok => matches!(sub.pending.pop_front(), Some(SubTag::Auth)),
                SubFrame::Error(text) => match sub.pending.pop_front() {
                    Some(SubTag::Auth) => {
                        let f = Fault::Handshake(text);
                        // Refused: back off as for a connection that never answered.
                        sub.answered = false;
                        self.sub_fail(i, f, now);
                        return false;
                    }
                    Some(SubTag::Subscribe(id)) => {
                        if let Some(c) = self.chans.chans.get_mut(id.slot as usize) {
                            if c.live && c.gen == id.gen {
                                c.on[i] = On::Refused;
                            }
                        }
                        self.nodes[i].stats.last_sub_fault = Some(Fault::Redis(text));
                        true
                    }
                    Some(SubTag::Unsubscribe) => true,
                    None => false,
                },
                SubFrame::Other => false,
            };
            if !ok {
                self.sub_fail(i, Fault::Unexpected, now);
                return false;
            }
        }
    }

    /// The subscription connections' timers: connects and stalls, reconnects, channels
    /// whose linger ran out. `due` learns the next instant each needs the loop.
    #[cold]
    pub(super) fn sub_tick(&mut self, now: Instant, due: &mut impl FnMut(Instant)) {
        if self.chans.idle > 0 {
            if let Some(t) = self.expire_idle_channels(now) {
                due(t);
            }
        }
        for i in 0..self.nodes.len() {
            let sub = &self.nodes[i].sub;
            match &sub.conn {
                Conn::Connecting(_) if now >= sub.connect_deadline => {
                    let f = Fault::Connect(io::ErrorKind::TimedOut);
                    self.sub_fail(i, f, now);
                }
                Conn::Connecting(_) => due(sub.connect_deadline),
                Conn::Up(s) if s.tls_handshaking() && now >= sub.connect_deadline => {
                    let f = Fault::Tls(TlsFault::Other(ErrorText::new(b"handshake timed out")));
                    self.sub_fail(i, f, now);
                }
                Conn::Up(s) if s.tls_handshaking() => due(sub.connect_deadline),
                Conn::Up(_) if !sub.pending.is_empty() => {
                    let stall = sub.last_progress + self.cfg.stall_timeout;
                    if now >= stall {
                        self.sub_fail(i, Fault::Closed(io::ErrorKind::TimedOut), now);
                    } else {
                        due(stall);
                    }
                }
                _ => {}
            }
            // Wanted but down: reconnect once the backoff is over.
            let sub = &self.nodes[i].sub;
            if self.chans.live > 0 && matches!(sub.conn, Conn::Down) {
                match sub.retry_at {
                    Some(t) if now < t => due(t),
                    _ => {
                        self.sub_connect(i, now);
                        if let Some(t) = self.nodes[i].sub.retry_at.filter(|t| *t > now) {
                            due(t);
                        }
                    }
                }
            }
        }
        if self.chans.dirty {
            self.sub_flush_all();
        }
    }

    /// Drop the channels nobody waited on for [`LINGER`] (`UNSUBSCRIBE`; the connections
    /// close when no channel is left); returns when the next one's linger ends.
    pub(super) fn expire_idle_channels(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for slot in 0..self.chans.chans.len() {
            let c = &self.chans.chans[slot];
            let Some(since) = c.idle_since.filter(|_| c.live) else {
                continue;
            };
            let end = since + LINGER;
            if now < end {
                next = Some(next.map_or(end, |n| n.min(end)));
                continue;
            }
            let key = std::mem::take(&mut self.chans.chans[slot].key);
            for i in 0..self.nodes.len() {
                let asked = matches!(self.chans.chans[slot].on[i], On::Asked | On::Since(_));
                let sub = &mut self.nodes[i].sub;
                if asked && matches!(sub.conn, Conn::Up(_) | Conn::Connecting(_)) {
                    let prefix = self.chans.chans[slot].prefix();
                    encode_channel_command(&mut sub.out, b"UNSUBSCRIBE", prefix, &key);
                    if sub.pending.is_empty() {
                        sub.last_progress = now;
                    }
                    sub.pending.push_back(SubTag::Unsubscribe);
                    self.chans.dirty = true;
                }
            }
            if self.chans.chans[slot].direct {
                self.chans.direct = None;
            } else {
                self.chans.by_key.remove(&key);
            }
            let c = &mut self.chans.chans[slot];
            c.key = key;
            c.live = false;
            c.idle_since = None;
            c.gen = c.gen.wrapping_add(1);
            self.chans.free.push(slot as u32);
            self.chans.live -= 1;
            self.chans.idle -= 1;
        }
        if self.chans.live == 0 {
            self.sub_close_all();
            self.chans.dirty = false;
        }
        next
    }
}

/// What a frame on a subscription connection is (copied out of the input buffer).
enum SubFrame {
    /// A release of `key` announced (nobody in line), with the released token's
    /// fingerprint.
    Message {
        key: SmallVec<[u8; 64]>,
        fp: Fingerprint,
    },
    /// A release announced on this client's own channel: waiter `id`'s turn.
    Turn {
        fp: Fingerprint,
        id: Fingerprint,
    },
    Subscribed,
    Unsubscribed,
    Ok,
    Error(ErrorText),
    Other,
}

fn classify_sub(frame: &Frame<'_>) -> SubFrame {
    match frame {
        Frame::Simple(b"OK") => SubFrame::Ok,
        Frame::Error(m) | Frame::BulkError(m) => SubFrame::Error(ErrorText::new(m)),
        Frame::Aggregate(a) if a.len() == 3 => {
            let mut it = a.iter();
            let (Some(Frame::Bulk(kind)), Some(second), Some(third)) =
                (it.next(), it.next(), it.next())
            else {
                return SubFrame::Other;
            };
            match (kind, second, third) {
                (b"message", Frame::Bulk(ch), Frame::Bulk(payload)) => {
                    if let Some(key) = ch.strip_prefix(RELEASED_PREFIX) {
                        SubFrame::Message {
                            key: SmallVec::from_slice(key),
                            fp: fingerprint(payload),
                        }
                    } else if ch.starts_with(NEXT_PREFIX) {
                        // The payload: the released token's fingerprint, then the id of the
                        // waiter whose turn it is.
                        let next = payload
                            .get(NOTICE_LEN..NOTICE_LEN + WAITER_ID_LEN)
                            .map(fingerprint);
                        match next {
                            Some(id) => SubFrame::Turn {
                                fp: fingerprint(payload),
                                id,
                            },
                            None => SubFrame::Other,
                        }
                    } else {
                        SubFrame::Other
                    }
                }
                (b"subscribe", Frame::Bulk(_), Frame::Integer(_)) => SubFrame::Subscribed,
                (b"unsubscribe", _, Frame::Integer(_)) => SubFrame::Unsubscribed,
                _ => SubFrame::Other,
            }
        }
        _ => SubFrame::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_commands_encode_as_resp() {
        let mut out = Vec::new();
        encode_channel_command(&mut out, b"SUBSCRIBE", RELEASED_PREFIX, b"sku:1");
        assert_eq!(
            out,
            b"*2\r\n$9\r\nSUBSCRIBE\r\n$26\r\nredlock-mux:released:sku:1\r\n".to_vec()
        );
        let limits = resp::Limits::default();
        let Ok(resp::Status::Complete((Frame::Aggregate(a), used))) = resp::parse(&out, &limits)
        else {
            panic!("not an array")
        };
        assert_eq!(used, out.len());
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn subscriber_frames_are_told_apart() {
        let limits = resp::Limits::default();
        let parse = |b: &'static [u8]| match resp::parse(b, &limits) {
            Ok(resp::Status::Complete((f, _))) => f,
            other => panic!("{other:?}"),
        };
        let f = parse(b"*3\r\n$7\r\nmessage\r\n$23\r\nredlock-mux:released:ab\r\n$3\r\nxyz\r\n");
        let SubFrame::Message { key, fp } = classify_sub(&f) else {
            panic!("not a message")
        };
        assert_eq!(&key[..], b"ab");
        assert_eq!(&fp[..4], b"xyz\0");
        // A turn: on a client channel, the fingerprint and then the waiter's id.
        let f = parse(b"*3\r\n$7\r\nmessage\r\n$25\r\nredlock-mux:next:client01\r\n$32\r\n0123456789abcdefwaiter0123456789\r\n");
        let SubFrame::Turn { fp, id } = classify_sub(&f) else {
            panic!("not a turn")
        };
        assert_eq!(&fp, b"0123456789abcdef");
        assert_eq!(&id[..], b"waiter0123456789");
        let f = parse(b"*3\r\n$9\r\nsubscribe\r\n$23\r\nredlock-mux:released:ab\r\n:1\r\n");
        assert!(matches!(classify_sub(&f), SubFrame::Subscribed));
        let f = parse(b"*3\r\n$11\r\nunsubscribe\r\n$23\r\nredlock-mux:released:ab\r\n:0\r\n");
        assert!(matches!(classify_sub(&f), SubFrame::Unsubscribed));
        // A message on a channel that is not ours, a pattern message, a bare integer.
        let f = parse(b"*3\r\n$7\r\nmessage\r\n$5\r\nother\r\n$0\r\n\r\n");
        assert!(matches!(classify_sub(&f), SubFrame::Other));
        let f = parse(b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$1\r\nx\r\n$0\r\n\r\n");
        assert!(matches!(classify_sub(&f), SubFrame::Other));
        assert!(matches!(classify_sub(&parse(b":1\r\n")), SubFrame::Other));
        assert!(matches!(classify_sub(&parse(b"+OK\r\n")), SubFrame::Ok));
        assert!(matches!(
            classify_sub(&parse(b"-NOPERM no\r\n")),
            SubFrame::Error(_)
        ));
    }

    #[test]
    fn fingerprints_take_the_token_prefix() {
        let fp = fingerprint(b"0123456789abcdef0123456789abcdef");
        assert_eq!(&fp, b"0123456789abcdef");
        let short = fingerprint(b"ab");
        assert_eq!(&short[..3], b"ab\0");
    }
}
