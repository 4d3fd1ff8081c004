//! Release notifications: a second connection per master, in subscriber mode, opened only
//! while some lock task waits (and for [`LINGER`] after the last one stopped waiting).
//!
//! The release script announces each key it deleted: on `redlock-mux:next:<client>` when a
//! waiter stands in the key's line (the first live one's client: [`crate::scripts::NEXT_PREFIX`]),
//! else on `redlock-mux:released:<key>` ([`crate::scripts::RELEASED_PREFIX`]). A waiting task
//! *subscribes* to its keys ([`Rounds::subscribe`]) and, if it stands in line, to its
//! client's own channel ([`Rounds::subscribe_direct`]): each is a [`Channel`] with a
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

use smallvec::SmallVec;

use super::encode::encode_auth;
use super::link::{Action, ConnectPhase, LinkId, State, Tag};
use super::rounds::Rounds;
use crate::resp::{self, Frame};
use crate::rules::{ErrorText, Fault};
use crate::scripts::{NEXT_PREFIX, NOTICE_LEN, RELEASED_PREFIX, WAITER_ID_LEN};

/// How long a channel stays subscribed after its last waiter left.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Input buffer of a subscription connection (notices are small).
pub(super) const SUB_INBUF: usize = 4096;

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
    Subscribed { chan: ChanId, master: usize },
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

impl Channels {
    /// Announcements or confirmations wait for the task layer.
    #[inline]
    pub(super) fn has_notices(&self) -> bool {
        !self.notices.is_empty()
    }
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

/// `SUBSCRIBE <prefix><key>` (or `UNSUBSCRIBE`).
fn encode_channel_command(out: &mut Vec<u8>, command: &[u8], prefix: &[u8], key: &[u8]) {
    let mut channel: SmallVec<[u8; 128]> = SmallVec::from_slice(prefix);
    channel.extend_from_slice(key);
    resp::encode_command(
        out,
        &[resp::Arg::Bytes(command), resp::Arg::Bytes(&channel)],
    );
}

impl Rounds {
    /// A lock task waits for `key` to be released: hold its channel (subscribing on every
    /// master if it is new). Pair with [`Rounds::unsubscribe`].
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
        let n = self.n();
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
        let n = self.n();
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
    #[inline]
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

    /// Ask master `i` for channel `id`: on its sub link if it has a connection (or is
    /// opening one), else by opening one, unless it is backing off (then the reconnect
    /// subscribes every channel).
    fn sub_ask(&mut self, i: usize, id: ChanId, now: Instant) {
        let l = self.n() + i;
        match self.links[l].state {
            State::Up | State::Connecting(_) => {
                self.sub_write_subscribe(i, id, now);
                self.chans.dirty = true;
            }
            State::Down => {
                if self.links[l].retry_at.is_none_or(|t| now >= t) {
                    self.sub_connect(i, now);
                } else if let Some(t) = self.links[l].retry_at {
                    self.due_by(t);
                }
            }
        }
    }

    fn sub_write_subscribe(&mut self, i: usize, id: ChanId, now: Instant) {
        let l = self.n() + i;
        let c = &mut self.chans.chans[id.slot as usize];
        let sub = &mut self.links[l];
        encode_channel_command(&mut sub.out, b"SUBSCRIBE", c.prefix(), &c.key);
        if sub.pending.is_empty() {
            sub.last_progress = now;
        }
        sub.pending.push_back(Tag::Subscribe(id));
        c.on[i] = On::Asked;
        self.echo_to_listeners(i, b"SUBSCRIBE", id.slot as usize);
    }

    /// The channel command just written to master `i`'s sub link, to its listeners too (a
    /// cluster master's: see `Rounds::listeners_tick`).
    fn echo_to_listeners(&mut self, i: usize, command: &[u8], slot: usize) {
        if !self.clusters {
            return;
        }
        for l in self.listeners_of(i) {
            let c = &self.chans.chans[slot];
            encode_channel_command(&mut self.links[l].out, command, c.prefix(), &c.key);
        }
    }

    /// A `SUBSCRIBE` of every channel, into link `l`'s output (a listener's, opening).
    pub(super) fn subscribe_all(&mut self, l: usize) {
        for c in self.chans.chans.iter().filter(|c| c.live) {
            encode_channel_command(&mut self.links[l].out, b"SUBSCRIBE", c.prefix(), &c.key);
        }
        self.chans.dirty = true;
    }

    /// Handle every complete frame of listener `l` of master `i`: its messages are heard as
    /// the sub link's, the rest is not read (see `Rounds::listeners_tick`). `false` if it
    /// was closed.
    pub(super) fn listener_received(&mut self, l: usize, i: usize, now: Instant) -> bool {
        loop {
            let link = &mut self.links[l];
            let (frame, used) = match link.input.next_frame() {
                Ok(resp::Status::Complete(c)) => c,
                Ok(resp::Status::Partial(_)) => {
                    if link.input.in_start == link.input.in_end {
                        link.input.in_start = 0;
                        link.input.in_end = 0;
                    }
                    return true;
                }
                Err(_) => {
                    self.listener_closed(l, now);
                    return false;
                }
            };
            let what = classify_sub(&frame);
            link.input.in_start += used;
            match what {
                SubFrame::Message { key, fp } => {
                    if let Some(chan) = self.channel(&key) {
                        let master = i;
                        self.chans
                            .notices
                            .push_back(Notice::Released { chan, master, fp });
                    }
                }
                SubFrame::Turn { fp, id } => {
                    if self.chans.direct.is_some() {
                        let master = i;
                        self.chans
                            .notices
                            .push_back(Notice::Turn { master, fp, id });
                    }
                }
                SubFrame::Subscribed | SubFrame::Unsubscribed | SubFrame::Ok => {}
                SubFrame::Error(_) | SubFrame::Other => {
                    // Refused (an ACL without the channel, no AUTH) or not a subscriber's
                    // frame: this listener helps nobody.
                    self.listener_closed(l, now);
                    return false;
                }
            }
        }
    }

    /// Open master `i`'s sub link (the driver connects it to the address its lock link
    /// uses), queue AUTH and a `SUBSCRIBE` of every channel. A failure backs off.
    fn sub_connect(&mut self, i: usize, now: Instant) {
        let l = self.n() + i;
        let master = &mut self.masters[i];
        master.stats.sub_connects += 1;
        let sub = &mut self.links[l];
        sub.clear_streams();
        if sub.input.inbuf.is_empty() {
            sub.input.inbuf.resize(SUB_INBUF, 0);
        }
        sub.pending.clear();
        sub.answered = false;
        sub.connect_deadline = now + self.cfg.connect_timeout;
        sub.last_progress = now;
        sub.state = State::Connecting(ConnectPhase::Connecting);
        if encode_auth(
            &mut sub.out,
            master.user.as_deref(),
            master.password.as_deref(),
        ) {
            sub.pending.push_back(Tag::Setup(super::link::Setup::Auth));
        }
        for slot in 0..self.chans.chans.len() {
            let c = &self.chans.chans[slot];
            if c.live {
                let id = ChanId {
                    slot: slot as u32,
                    gen: c.gen,
                };
                self.sub_write_subscribe(i, id, now);
            }
        }
        self.actions_push(Action::Connect(LinkId(l)));
        self.chans.dirty = true;
        self.due_by(now + self.cfg.connect_timeout.min(self.cfg.stall_timeout));
        if self.clusters && self.masters[i].cluster.is_some() {
            // Its listeners open at the next tick (`Rounds::listeners_tick`): now.
            self.due_by(now);
        }
    }

    /// A sub link could not be opened, or broke before answering: back off as the lock
    /// link does.
    fn sub_backoff(&mut self, i: usize, fault: Fault, now: Instant) {
        let l = self.n() + i;
        self.backoff(l, fault, now);
        self.masters[i].stats.last_sub_fault = Some(fault);
        if let Some(t) = self.links[l].retry_at {
            self.due_by(t);
        }
    }

    /// Close master `i`'s sub link: every channel is unheard there until the next
    /// connection (reopened at once if it had worked, else after a backoff).
    #[cold]
    pub(super) fn sub_fail(&mut self, i: usize, fault: Fault, now: Instant) {
        let l = self.n() + i;
        self.drop_connection_quietly(l);
        if self.clusters {
            self.listeners_close(i);
        }
        let sub = &mut self.links[l];
        sub.clear_streams();
        sub.pending.clear();
        let answered = sub.answered;
        for c in self.chans.chans.iter_mut().filter(|c| c.live) {
            c.on[i] = On::Off;
        }
        if self.chans.live == 0 {
            return;
        }
        if answered {
            let sub = &mut self.links[l];
            sub.failures = 0;
            sub.retry_at = None;
            self.masters[i].stats.last_sub_fault = Some(fault);
            // Reopened by the next tick.
            self.due_by(now);
        } else {
            self.sub_backoff(i, fault, now);
        }
    }

    /// Close every sub link: no channel is left.
    fn sub_close_all(&mut self) {
        let n = self.n();
        for i in 0..n {
            self.drop_connection_quietly(n + i);
            let sub = &mut self.links[n + i];
            sub.clear_streams();
            sub.pending.clear();
            sub.retry_at = None;
            sub.failures = 0;
            if self.clusters {
                self.listeners_close(i);
            }
        }
    }

    /// Handle every complete frame of master `i`'s sub link; `false` if the connection
    /// was closed.
    pub(super) fn sub_process(&mut self, i: usize, now: Instant) -> bool {
        let l = self.n() + i;
        loop {
            let sub = &mut self.links[l];
            let (frame, used) = match sub.input.next_frame() {
                Ok(resp::Status::Complete(c)) => c,
                Ok(resp::Status::Partial(_)) => return true,
                Err(e) => {
                    self.sub_fail(i, Fault::Protocol(e), now);
                    return false;
                }
            };
            let what = classify_sub(&frame);
            sub.input.in_start += used;
            let ok = match what {
                SubFrame::Message { key, fp } => {
                    self.masters[i].stats.notices += 1;
                    if let Some(chan) = self.channel(&key) {
                        let master = i;
                        self.chans
                            .notices
                            .push_back(Notice::Released { chan, master, fp });
                    }
                    true
                }
                SubFrame::Turn { fp, id } => {
                    self.masters[i].stats.notices += 1;
                    if self.chans.direct.is_some() {
                        let master = i;
                        self.chans
                            .notices
                            .push_back(Notice::Turn { master, fp, id });
                    }
                    true
                }
                SubFrame::Subscribed => match sub.pending.pop_front() {
                    Some(Tag::Subscribe(id)) => {
                        sub.answered = true;
                        sub.failures = 0;
                        sub.retry_at = None;
                        if let Some(c) = self.chans.chans.get_mut(id.slot as usize) {
                            if c.live && c.gen == id.gen && c.on[i] == On::Asked {
                                c.on[i] = On::Since(now);
                                self.chans.notices.push_back(Notice::Subscribed {
                                    chan: id,
                                    master: i,
                                });
                            }
                        }
                        true
                    }
                    _ => false,
                },
                SubFrame::Unsubscribed => matches!(sub.pending.pop_front(), Some(Tag::Unsubscribe)),
                SubFrame::Ok => matches!(
                    sub.pending.pop_front(),
                    Some(Tag::Setup(super::link::Setup::Auth))
                ),
                SubFrame::Error(text) => match sub.pending.pop_front() {
                    Some(Tag::Setup(_)) => {
                        let f = Fault::Handshake(text);
                        // Refused: back off as for a connection that never answered.
                        sub.answered = false;
                        self.sub_fail(i, f, now);
                        return false;
                    }
                    Some(Tag::Subscribe(id)) => {
                        if let Some(c) = self.chans.chans.get_mut(id.slot as usize) {
                            if c.live && c.gen == id.gen {
                                c.on[i] = On::Refused;
                            }
                        }
                        self.masters[i].stats.last_sub_fault = Some(Fault::Redis(text));
                        true
                    }
                    Some(Tag::Unsubscribe) => true,
                    Some(
                        Tag::Op { .. }
                        | Tag::DelIfEq(_)
                        | Tag::Owed
                        | Tag::Track(_)
                        | Tag::Caching
                        | Tag::Watch(_),
                    )
                    | None => false,
                },
                SubFrame::Other => false,
            };
            if !ok {
                self.sub_fail(i, Fault::Unexpected, now);
                return false;
            }
        }
    }

    /// The sub links' timers: connects and stalls, reconnects, channels whose linger ran
    /// out. `due` learns the next instant each needs the loop.
    #[cold]
    pub(super) fn sub_tick(&mut self, now: Instant, due: &mut impl FnMut(Instant)) {
        if self.chans.idle > 0 {
            if let Some(t) = self.expire_idle_channels(now) {
                due(t);
            }
        }
        let n = self.n();
        for i in 0..n {
            let sub = &self.links[n + i];
            match sub.state {
                State::Connecting(phase) if now >= sub.connect_deadline => {
                    let f = match phase {
                        ConnectPhase::Tls => Fault::Tls(crate::rules::TlsFault::Other(
                            ErrorText::new(b"handshake timed out"),
                        )),
                        _ => Fault::Connect(io::ErrorKind::TimedOut),
                    };
                    self.sub_fail(i, f, now);
                }
                State::Connecting(_) => due(sub.connect_deadline),
                State::Up if !sub.pending.is_empty() => {
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
            let sub = &self.links[n + i];
            if self.chans.live > 0 && sub.state == State::Down {
                match sub.retry_at {
                    Some(t) if now < t => due(t),
                    _ => {
                        self.sub_connect(i, now);
                        if let Some(t) = self.links[n + i].retry_at.filter(|t| *t > now) {
                            due(t);
                        }
                    }
                }
            }
        }
        if self.clusters {
            self.listeners_tick(now, due);
        }
    }

    /// Drop the channels nobody waited on for [`LINGER`] (`UNSUBSCRIBE`; the connections
    /// close when no channel is left); returns when the next one's linger ends.
    pub(super) fn expire_idle_channels(&mut self, now: Instant) -> Option<Instant> {
        let n = self.n();
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
            for i in 0..n {
                let asked = matches!(self.chans.chans[slot].on[i], On::Asked | On::Since(_));
                let sub = &mut self.links[n + i];
                if asked && sub.state != State::Down {
                    let prefix = self.chans.chans[slot].prefix();
                    encode_channel_command(&mut sub.out, b"UNSUBSCRIBE", prefix, &key);
                    if sub.pending.is_empty() {
                        sub.last_progress = now;
                    }
                    sub.pending.push_back(Tag::Unsubscribe);
                    self.chans.dirty = true;
                    if self.clusters {
                        for l in self.listeners_of(i) {
                            encode_channel_command(
                                &mut self.links[l].out,
                                b"UNSUBSCRIBE",
                                prefix,
                                &key,
                            );
                        }
                    }
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
