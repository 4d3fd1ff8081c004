//! A cluster master's connections (issue 22): the glue between the rounds and
//! [`ShardMux`]. The rounds keep one lock link per master and treat a cluster like any
//! master: its lock link `i` carries no socket but one ordered stream, which the mux
//! spreads over one connection per shard primary and gathers back in order.
//!
//! Links: `i < n` and `n + i` as for every master (the sub link is a real connection to the
//! node that answered the last discovery: `PUBLISH` reaches every node of a cluster, so one
//! subscription connection hears every release, and its confirmations are what the waiters
//! count on); links from `2 n` on belong to cluster masters: one *discovery* link each (to
//! the first seed: `AUTH` and `CLUSTER SHARDS`, or `CLUSTER SLOTS` where that is unknown),
//! one link per shard primary, kept for reuse across connections, and while the sub link is
//! open one *listener* per shard primary ([`Rounds::listeners_tick`]).
//!
//! A connection of the lock link `i` is: discovery, then a connection to every shard
//! primary of the map it gave; once every one is up, link `i` is up and the rounds'
//! handshake (`AUTH`, `SCRIPT LOAD`, `INFO`...) goes to every shard through the mux. Any of
//! those connections failing is link `i`'s connection failing (every request in flight
//! there fails, as for a standalone master), and so is a redirection to a node outside the
//! map: the next connection discovers the map again. The connect timeout covers the whole
//! (discovery and every shard).
//!
//! A discovery that cannot reach its node tries the next candidate at once (the other seeds
//! given as IP addresses, then the primaries of the last map); a connected cluster reads
//! its map again every [`CLUSTER_REFRESH`]. Left for later: shard endpoints given as host
//! names (refused with a clear error: only IP literals, the cluster's default
//! `cluster-preferred-endpoint-type ip`), `SPUBLISH` (see [`Rounds::listeners_tick`]).

use std::net::{IpAddr, SocketAddr};

use super::cluster::{parse_shards, parse_slots, ShardMux, SlotMap};
use super::encode::encode_auth;
use smallvec::SmallVec;

use super::link::{Action, ConnectPhase, Link, LinkId, State, INBUF_START};
use super::rounds::Rounds;
use crate::resp::{self, Arg, Frame};
use crate::rules::{ErrorText, Fault};

/// What a discovery link's next reply answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disc {
    Auth,
    Shards,
    Slots,
}

/// A cluster master's connections.
pub(crate) struct ClusterConn {
    /// The first seed's host (an endpoint the cluster leaves unknown, `?`, is this host).
    seed_host: String,
    tls: bool,
    /// The discovery link, once allocated.
    disc: Option<usize>,
    steps: std::collections::VecDeque<Disc>,
    /// One link per shard of the current map (reused across connections).
    shard_links: Vec<usize>,
    /// One listener per shard of the current map, while the master's sub link is open
    /// ([`Rounds::listeners_tick`]).
    listeners: Vec<usize>,
    /// Shard links up on this connection.
    up: usize,
    mux: Option<ShardMux>,
    /// Shards of the last map (for the statistics).
    pub(super) shards: usize,
    /// Where a discovery may ask: `None` is the master's own endpoint (its URL's first
    /// seed, resolved by the driver), then the other seeds given as IP addresses, then the
    /// shard primaries of the last map. A discovery that cannot connect tries the next one
    /// at once, within the connect timeout; the next connection starts with the one that
    /// answered last.
    candidates: Vec<Option<SocketAddr>>,
    /// The candidate the discovery under way asks, and how many it tried.
    at: usize,
    tried: usize,
    /// The discovery fell back to `CLUSTER SLOTS` (so does a refresh).
    slots_only: bool,
    /// When the map is read again ([`CLUSTER_REFRESH`]).
    next_refresh: Option<std::time::Instant>,
}

/// How often a connected cluster master reads its map again (besides at each connection
/// and on a redirection): slots moved by a migration the client never ran into are then
/// sent to their new shard without a `-MOVED` round trip; a new primary makes a new
/// connection.
pub(crate) const CLUSTER_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

impl ClusterConn {
    pub(crate) fn new(seed_host: String, tls: bool, seeds: Vec<SocketAddr>) -> ClusterConn {
        let mut candidates = vec![None];
        candidates.extend(seeds.into_iter().map(Some));
        ClusterConn {
            candidates,
            at: 0,
            tried: 0,
            slots_only: false,
            next_refresh: None,
            seed_host,
            tls,
            disc: None,
            steps: std::collections::VecDeque::new(),
            shard_links: Vec::new(),
            listeners: Vec::new(),
            up: 0,
            mux: None,
            shards: 0,
        }
    }
}

/// The master and role of a link from `2 n` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Extra {
    pub master: usize,
    /// `None`: the discovery link; `Some(k)`: shard `k`'s (its lock-side link, or with
    /// `listen` its listener).
    pub shard: Option<usize>,
    /// The shard's address (shard links, listeners).
    pub addr: Option<SocketAddr>,
    /// A listener: a subscription connection to shard `shard`'s primary (see
    /// [`Rounds::listeners_tick`]).
    pub listen: bool,
}

impl Rounds {
    /// The master a link belongs to.
    pub(crate) fn link_master(&self, l: LinkId) -> usize {
        let n = self.n();
        if l.0 < n {
            l.0
        } else if l.0 < 2 * n {
            l.0 - n
        } else {
            self.extra[l.0 - 2 * n].master
        }
    }

    /// Where the driver connects link `l`: `Some` for a cluster's shard link (an IP literal
    /// the map gave), discovery link or sub link (the node that answered the last
    /// discovery), unless that is the master's own endpoint; `None` for every other link
    /// (its master's own endpoint).
    pub(crate) fn link_addr(&self, l: LinkId) -> Option<SocketAddr> {
        let n = self.n();
        if l.0 < n {
            return None;
        }
        if l.0 < 2 * n {
            // A cluster's sub link goes where the last discovery found an answer (`PUBLISH`
            // reaches every node: any one hears every release): not to a dead first seed.
            let c = self.masters[l.0 - n].cluster.as_ref()?;
            return c.candidates.get(c.at).copied().flatten();
        }
        self.extra[l.0 - 2 * n].addr
    }

    fn new_extra_link(&mut self, master: usize, shard: Option<usize>) -> usize {
        let now = self.links[master].last_progress;
        let reserved = self.cfg.max_pending.min(1024);
        self.links
            .push(Link::new(self.cfg.limits, INBUF_START, reserved, now));
        self.extra.push(Extra {
            master,
            shard,
            addr: None,
            listen: false,
        });
        self.links.len() - 1
    }

    /// Start (or restart) link `l` for a new connection of master `i`'s cluster.
    fn reset_extra(&mut self, l: usize, i: usize) {
        let (deadline, progress) = (self.links[i].connect_deadline, self.links[i].last_progress);
        let link = &mut self.links[l];
        link.clear_streams();
        link.pending.clear();
        link.answered = false;
        link.state = State::Connecting(ConnectPhase::Connecting);
        link.connect_deadline = deadline;
        link.last_progress = progress;
    }

    /// An action of the rounds, seen through the clusters: the lock link of a cluster has
    /// no socket, its connect is a discovery and its close closes every shard's. `None`:
    /// nothing for the driver (what it stands for was queued).
    pub(super) fn cluster_action(&mut self, a: Action) -> Option<Action> {
        let n = self.n();
        match a {
            Action::Connect(LinkId(i)) if i < n && self.masters[i].cluster.is_some() => {
                self.start_discovery(i)
            }
            Action::Close {
                link: LinkId(i),
                reset,
            } if i < n && self.masters[i].cluster.is_some() => {
                self.close_cluster(i, reset);
                None
            }
            a => Some(a),
        }
    }

    fn start_discovery(&mut self, i: usize) -> Option<Action> {
        self.close_cluster(i, false);
        let d = match self.masters[i].cluster.as_ref().and_then(|c| c.disc) {
            Some(d) => d,
            None => {
                let d = self.new_extra_link(i, None);
                self.masters[i].cluster.as_mut()?.disc = Some(d);
                d
            }
        };
        let c = self.masters[i].cluster.as_mut()?;
        c.tried = 0;
        self.ask_for_map(i, d)
    }

    /// Start the discovery link `d` of master `i` towards its current candidate.
    fn ask_for_map(&mut self, i: usize, d: usize) -> Option<Action> {
        self.reset_extra(d, i);
        let c = self.masters[i].cluster.as_ref()?;
        let addr = c.candidates.get(c.at).copied().flatten();
        let n = self.n();
        self.extra[d - 2 * n].addr = addr;
        let master = &self.masters[i];
        let link = &mut self.links[d];
        let auth = encode_auth(
            &mut link.out,
            master.user.as_deref(),
            master.password.as_deref(),
        );
        resp::encode_command(
            &mut link.out,
            &[Arg::Bytes(b"CLUSTER"), Arg::Bytes(b"SHARDS")],
        );
        let c = self.masters[i].cluster.as_mut()?;
        c.steps.clear();
        if auth {
            c.steps.push_back(Disc::Auth);
        }
        c.steps.push_back(Disc::Shards);
        c.up = 0;
        c.mux = None;
        Some(Action::Connect(LinkId(d)))
    }

    /// Close every connection of master `i`'s cluster (its lock link's connection ended).
    fn close_cluster(&mut self, i: usize, reset: bool) {
        let Some(c) = self.masters[i].cluster.as_mut() else {
            return;
        };
        c.mux = None;
        c.up = 0;
        c.steps.clear();
        let links: Vec<usize> = c.disc.iter().chain(c.shard_links.iter()).copied().collect();
        for l in links {
            let link = &mut self.links[l];
            let was = std::mem::replace(&mut link.state, State::Down);
            link.clear_streams();
            link.pending.clear();
            if was != State::Down {
                self.actions_push(Action::Close {
                    link: LinkId(l),
                    reset,
                });
            }
        }
    }

    /// A link from `2 n` on is connected.
    pub(super) fn cluster_connected(&mut self, l: usize) {
        let e = self.extra[l - 2 * self.n()];
        if e.shard.is_none() || e.listen {
            return;
        }
        let i = e.master;
        let Some(c) = self.masters[i].cluster.as_mut() else {
            return;
        };
        c.up += 1;
        if c.mux.is_some() && c.up == c.shard_links.len() && self.links[i].is_connecting() {
            // Every shard is up: so is the cluster's lock link, and its handshake goes out.
            self.links[i].state = State::Up;
            self.masters[i].stats.connects += 1;
            self.mark_lock_dirty();
        }
    }

    /// A link from `2 n` on failed: so did its cluster's lock link's connection.
    pub(super) fn cluster_closed(&mut self, l: usize, fault: Fault, now: std::time::Instant) {
        let e = self.extra[l - 2 * self.n()];
        let i = e.master;
        if e.listen {
            self.listener_closed(l, now);
            return;
        }
        self.links[l].state = State::Down;
        // A discovery that could not reach its node: the next candidate, at once.
        if let (None, true, Some(c)) = (
            e.shard,
            self.links[i].is_connecting(),
            self.masters[i].cluster.as_mut(),
        ) {
            c.tried += 1;
            if c.mux.is_none() && c.tried < c.candidates.len() {
                c.at = (c.at + 1) % c.candidates.len();
                if let Some(a) = self.ask_for_map(i, l) {
                    self.actions_push(a);
                }
                return;
            }
        }
        if self.links[i].state != State::Down {
            self.handle_closed(LinkId(i), fault, now);
        }
    }

    /// Link `l` (from `2 n` on) read bytes: the discovery's answers, or a shard's replies,
    /// which go on to the cluster's lock link in order. `false`: the link was closed.
    pub(super) fn cluster_received(&mut self, l: usize, now: std::time::Instant) -> bool {
        let e = self.extra[l - 2 * self.n()];
        let i = e.master;
        if e.listen {
            return self.listener_received(l, i, now);
        }
        match e.shard {
            None => self.discovery_replies(l, i, now),
            Some(k) => {
                let Some(mux) = self.masters[i]
                    .cluster
                    .as_mut()
                    .and_then(|c| c.mux.as_mut())
                else {
                    return false;
                };
                let input = &mut self.links[l].input;
                let got = mux.received(k, &input.inbuf[input.in_start..input.in_end]);
                let used = match got {
                    Ok(used) => used,
                    Err(err) => {
                        let fault = match err {
                            super::cluster::MuxError::Protocol(e) => Fault::Protocol(e),
                            super::cluster::MuxError::Unexpected => Fault::Unexpected,
                        };
                        self.handle_closed(LinkId(i), fault, now);
                        return false;
                    }
                };
                input.in_start += used;
                if input.in_start == input.in_end {
                    input.in_start = 0;
                    input.in_end = 0;
                }
                let stale = mux.stale();
                self.cluster_move_out(i);
                if !self.deliver(i, now) {
                    return false;
                }
                if stale {
                    let f = Fault::Redis(ErrorText::new(
                        b"the cluster's map changed (a node outside the one known): connecting again",
                    ));
                    self.handle_closed(LinkId(i), f, now);
                    return false;
                }
                true
            }
        }
    }

    /// The mux's replies, in order, into the cluster's lock link's input, read there as
    /// any master's. `false`: the lock link was closed.
    fn deliver(&mut self, i: usize, now: std::time::Instant) -> bool {
        let Some(mux) = self.masters[i]
            .cluster
            .as_mut()
            .and_then(|c| c.mux.as_mut())
        else {
            return false;
        };
        let ready = mux.ready();
        if ready.is_empty() {
            return true;
        }
        let len = ready.len();
        let input = &mut self.links[i].input;
        if input.inbuf.len() - input.in_end < len {
            // Compact (the resumable parser reads from `in_start` on), then grow.
            if input.in_start > 0 {
                input.inbuf.copy_within(input.in_start..input.in_end, 0);
                input.in_end -= input.in_start;
                input.in_start = 0;
            }
            let want = input.in_end + len;
            if input.inbuf.len() < want {
                if want > input.parser.limits().max_bulk_len + 64 * 1024 {
                    ready.clear();
                    let f = Fault::Protocol(resp::Error::BulkTooLong);
                    self.handle_closed(LinkId(i), f, now);
                    return false;
                }
                input.inbuf.resize(want.max(2 * input.inbuf.len()), 0);
            }
        }
        input.inbuf[input.in_end..input.in_end + len].copy_from_slice(ready);
        ready.clear();
        if !self.received(LinkId(i), len, now) {
            return false;
        }
        // Requests behind a confirmed AUTH may go out now: the next flush takes them.
        if std::mem::take(&mut self.links[i].kick) {
            self.mark_lock_dirty();
        }
        true
    }

    /// What the mux queued for each shard goes to its link's output.
    fn cluster_move_out(&mut self, i: usize) {
        let Some(c) = self.masters[i].cluster.as_mut() else {
            return;
        };
        let Some(mux) = c.mux.as_mut() else { return };
        let mut any = false;
        for (k, sh) in mux.shards().iter_mut().enumerate() {
            if sh.out.is_empty() {
                continue;
            }
            if let Some(&l) = c.shard_links.get(k) {
                self.links[l].out.extend_from_slice(&sh.out);
                any = true;
            }
            sh.out.clear();
        }
        if any {
            self.mark_lock_dirty();
        }
    }

    fn discovery_replies(&mut self, d: usize, i: usize, now: std::time::Instant) -> bool {
        loop {
            let link = &mut self.links[d];
            let (frame, used) = match link.input.next_frame() {
                Ok(resp::Status::Complete(c)) => c,
                Ok(resp::Status::Partial(_)) => return true,
                Err(e) => {
                    self.handle_closed(LinkId(i), Fault::Protocol(e), now);
                    return false;
                }
            };
            let Some(c) = self.masters[i].cluster.as_mut() else {
                return false;
            };
            let step = c.steps.pop_front();
            let tls = c.tls;
            let refused = |what: &[u8], f: &Frame<'_>| {
                let mut text = what.to_vec();
                if let Frame::Error(m) | Frame::BulkError(m) = f {
                    text.extend_from_slice(m);
                }
                Fault::Handshake(ErrorText::new(&text))
            };
            let map = match (step, &frame) {
                (Some(Disc::Auth), Frame::Simple(b"OK")) => None,
                (Some(Disc::Shards), Frame::Error(m)) if contains(m, b"nknown subcommand") => {
                    // Before Redis 7: ask for CLUSTER SLOTS instead.
                    resp::encode_command(
                        &mut self.links[d].out,
                        &[Arg::Bytes(b"CLUSTER"), Arg::Bytes(b"SLOTS")],
                    );
                    if let Some(c) = self.masters[i].cluster.as_mut() {
                        c.steps.push_back(Disc::Slots);
                        c.slots_only = true;
                    }
                    self.links[d].input.in_start += used;
                    self.mark_lock_dirty();
                    continue;
                }
                (Some(Disc::Shards), f @ Frame::Aggregate(_)) => Some(parse_shards(f, tls)),
                (Some(Disc::Slots), f @ Frame::Aggregate(_)) => Some(parse_slots(f)),
                (Some(Disc::Auth), f) => {
                    let fault = refused(b"cluster discovery: AUTH: ", f);
                    self.links[i].answered = false;
                    self.handle_closed(LinkId(i), fault, now);
                    return false;
                }
                (Some(Disc::Shards | Disc::Slots), f) => {
                    let fault = refused(b"cluster discovery (is it a cluster?): ", f);
                    self.links[i].answered = false;
                    self.handle_closed(LinkId(i), fault, now);
                    return false;
                }
                (None, _) => {
                    self.handle_closed(LinkId(i), Fault::Unexpected, now);
                    return false;
                }
            };
            self.links[d].input.in_start += used;
            let Some(map) = map else { continue };
            let built = map
                .and_then(SlotMap::new)
                .map_err(|e| Fault::Handshake(ErrorText::new(e.to_string().as_bytes())));
            return match built {
                Ok(map) => self.connect_shards(i, d, map, now),
                Err(f) => {
                    self.links[i].answered = false;
                    self.handle_closed(LinkId(i), f, now);
                    false
                }
            };
        }
    }

    /// The map is known: connect every shard primary (the discovery link closes).
    fn connect_shards(
        &mut self,
        i: usize,
        d: usize,
        map: SlotMap,
        now: std::time::Instant,
    ) -> bool {
        let Some(c) = self.masters[i].cluster.as_ref() else {
            return false;
        };
        let mut addrs = Vec::with_capacity(map.shards().len());
        for sh in map.shards() {
            let a = sh.primary.clone().or_host(&c.seed_host);
            match a.host.parse::<IpAddr>() {
                Ok(ip) => addrs.push(SocketAddr::new(ip, a.port)),
                Err(_) => {
                    let f = Fault::Handshake(ErrorText::new(
                        format!(
                            "cluster node {a} is named by a host name: only IP addresses are \
                             supported for now (cluster-preferred-endpoint-type ip)"
                        )
                        .as_bytes(),
                    ));
                    self.links[i].answered = false;
                    self.handle_closed(LinkId(i), f, now);
                    return false;
                }
            }
        }
        if addrs.is_empty() {
            let f = Fault::Handshake(ErrorText::new(b"the cluster has no shard serving slots"));
            self.links[i].answered = false;
            self.handle_closed(LinkId(i), f, now);
            return false;
        }
        self.drop_connection_quietly(d);
        let mut mux = ShardMux::new(map, self.cfg.limits);
        if let Some(c) = self.masters[i].cluster.as_mut() {
            mux.set_refresh(c.slots_only, c.tls);
            c.next_refresh = Some(now + CLUSTER_REFRESH);
        }
        self.due_by(now + CLUSTER_REFRESH);
        for (k, addr) in addrs.iter().enumerate() {
            let have = self.masters[i]
                .cluster
                .as_ref()
                .map_or(0, |c| c.shard_links.len());
            let l = if k < have {
                self.masters[i]
                    .cluster
                    .as_ref()
                    .map_or(0, |c| c.shard_links[k])
            } else {
                let l = self.new_extra_link(i, Some(k));
                if let Some(c) = self.masters[i].cluster.as_mut() {
                    c.shard_links.push(l);
                }
                l
            };
            let n = self.n();
            self.extra[l - 2 * n].addr = Some(*addr);
            self.reset_extra(l, i);
            self.actions_push(Action::Connect(LinkId(l)));
        }
        if let Some(c) = self.masters[i].cluster.as_mut() {
            c.shard_links.truncate(addrs.len());
            c.shards = addrs.len();
            c.up = 0;
            c.mux = Some(mux);
            // The primaries of this map become candidates for the next discoveries (the
            // first seed may be the one that fails next).
            let answered = c.candidates.get(c.at).copied().flatten();
            for a in &addrs {
                if c.candidates.len() < 32 && !c.candidates.contains(&Some(*a)) {
                    c.candidates.push(Some(*a));
                }
            }
            c.at = c
                .candidates
                .iter()
                .position(|x| x.is_some() && *x == answered)
                .unwrap_or(c.at);
        }
        true
    }

    /// Hand the lock link's queued requests of every cluster master that is up to its mux
    /// (the flush writes the shard links next).
    pub(super) fn cluster_flush(&mut self, now: std::time::Instant) {
        for i in 0..self.n() {
            if self.masters[i].cluster.is_none() || !self.links[i].is_up() {
                continue;
            }
            let link = &mut self.links[i];
            let Some(mux) = self.masters[i]
                .cluster
                .as_mut()
                .and_then(|c| c.mux.as_mut())
            else {
                continue;
            };
            if let Some(from) = link.shared_from {
                if link.gate.is_none() {
                    let bytes = &self.shared[from..];
                    let used = mux.submit(bytes);
                    link.shared_from = None;
                    if used < bytes.len() {
                        link.out.extend_from_slice(&bytes[used..]);
                    }
                } else {
                    link.shared_from = None;
                    link.out.extend_from_slice(&self.shared[from..]);
                }
            }
            let end = link.writable_end();
            if link.out_pos < end {
                let used = mux.submit(&link.out[link.out_pos..end]);
                link.out_pos += used;
                if link.out_pos == link.out.len() {
                    link.out.clear();
                    link.out_pos = 0;
                    if let Some(g) = link.gate.as_mut() {
                        *g = 0;
                    }
                }
            }
            self.cluster_move_out(i);
            // Replies the mux answered itself (CROSSSLOT, an unserved slot).
            let _ = self.deliver(i, now);
        }
    }
}

impl Rounds {
    /// Timers of the clusters: a connected cluster master reads its map again every
    /// [`CLUSTER_REFRESH`].
    pub(super) fn cluster_tick(
        &mut self,
        now: std::time::Instant,
        due: &mut impl FnMut(std::time::Instant),
    ) {
        for i in 0..self.n() {
            let up = self.links[i].is_up();
            let Some(c) = self.masters[i].cluster.as_mut() else {
                continue;
            };
            let (Some(mux), true) = (c.mux.as_mut(), up) else {
                continue;
            };
            match c.next_refresh {
                Some(t) if now < t => due(t),
                _ => {
                    mux.refresh();
                    let next = now + CLUSTER_REFRESH;
                    c.next_refresh = Some(next);
                    due(next);
                    self.cluster_move_out(i);
                }
            }
        }
    }
}

/// How long a listener that closed (or could not connect) waits before it is opened again.
const LISTENER_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl Rounds {
    /// A cluster master's *listeners*: while its sub link is open, one more subscription
    /// connection per shard primary, subscribed to the same channels, whose messages are
    /// heard as the sub link's. Why: a release publishes on the shard of its key, and
    /// `PUBLISH` reaches the other nodes over the cluster bus, where a message can wait
    /// about 40 ms behind the one before it (measured on loopback: with the hot key's shard
    /// elsewhere than the sub link's node, 8 fair waiters on one resource made 79-104
    /// hand-offs a second, 2,560 where it was the same node). A listener on the key's
    /// shard hears the release at once. Listeners only make a waiter try sooner: their
    /// confirmations and errors are not read (the sub link's confirmations say when a
    /// release cannot go unheard, as without them), a copy of a message already heard
    /// frees nothing twice (`Core::hear`), and a listener that fails is opened again after
    /// [`LISTENER_RETRY`], to the shard's current primary. (`SPUBLISH`, which the cluster
    /// keeps within the key's shard, would need a subscription per key on that shard.)
    pub(super) fn listeners_tick(
        &mut self,
        now: std::time::Instant,
        due: &mut impl FnMut(std::time::Instant),
    ) {
        let n = self.n();
        for i in 0..n {
            let Some(c) = self.masters[i].cluster.as_ref() else {
                continue;
            };
            let wanted = self.links[n + i].state != State::Down && self.chans.live > 0;
            let shards = if wanted { c.shard_links.len() } else { 0 };
            for k in 0..shards.max(c.listeners.len()) {
                let Some(c) = self.masters[i].cluster.as_ref() else {
                    break;
                };
                let target = c
                    .shard_links
                    .get(k)
                    .filter(|_| k < shards)
                    .and_then(|&sl| self.extra[sl - 2 * n].addr);
                let l = match c.listeners.get(k) {
                    Some(&l) => l,
                    None if target.is_some() => {
                        let l = self.new_extra_link(i, Some(k));
                        self.extra[l - 2 * n].listen = true;
                        if let Some(c) = self.masters[i].cluster.as_mut() {
                            c.listeners.push(l);
                        }
                        l
                    }
                    None => continue,
                };
                let link = &self.links[l];
                let Some(addr) = target else {
                    // Not wanted any more (the sub link closed, or the map has fewer
                    // shards).
                    self.drop_connection_quietly(l);
                    continue;
                };
                match link.state {
                    State::Connecting(_) if now >= link.connect_deadline => {
                        self.listener_closed(l, now);
                        due(now + LISTENER_RETRY);
                    }
                    State::Connecting(_) => due(link.connect_deadline),
                    State::Up if self.extra[l - 2 * n].addr != Some(addr) => {
                        // The shard has another primary now.
                        self.open_listener(l, addr, now);
                    }
                    State::Up => {}
                    State::Down => match link.retry_at {
                        Some(t) if now < t => due(t),
                        _ => {
                            self.open_listener(l, addr, now);
                            due(self.links[l].connect_deadline);
                        }
                    },
                }
            }
        }
    }

    /// Connect listener `l` to `addr`: `AUTH` (if any) and a `SUBSCRIBE` of every channel.
    fn open_listener(&mut self, l: usize, addr: SocketAddr, now: std::time::Instant) {
        self.drop_connection_quietly(l);
        let n = self.n();
        let i = self.extra[l - 2 * n].master;
        self.extra[l - 2 * n].addr = Some(addr);
        let master = &self.masters[i];
        let link = &mut self.links[l];
        link.clear_streams();
        link.pending.clear();
        link.retry_at = None;
        link.state = State::Connecting(ConnectPhase::Connecting);
        link.connect_deadline = now + self.cfg.connect_timeout;
        link.last_progress = now;
        encode_auth(
            &mut link.out,
            master.user.as_deref(),
            master.password.as_deref(),
        );
        self.subscribe_all(l);
        self.actions_push(Action::Connect(LinkId(l)));
    }

    /// Listener `l` closed or failed: opened again after [`LISTENER_RETRY`] if still
    /// wanted.
    pub(super) fn listener_closed(&mut self, l: usize, now: std::time::Instant) {
        self.drop_connection_quietly(l);
        let link = &mut self.links[l];
        link.clear_streams();
        link.pending.clear();
        link.retry_at = Some(now + LISTENER_RETRY);
        self.due_by(now + LISTENER_RETRY);
    }

    /// Master `i`'s listeners that are open, for the channel commands written to its sub
    /// link (the same bytes go to each).
    pub(super) fn listeners_of(&self, i: usize) -> SmallVec<[usize; 8]> {
        let Some(c) = self.masters[i].cluster.as_ref() else {
            return SmallVec::new();
        };
        c.listeners
            .iter()
            .copied()
            .filter(|&l| self.links[l].state != State::Down)
            .collect()
    }

    /// Close master `i`'s listeners (its sub link closed).
    pub(super) fn listeners_close(&mut self, i: usize) {
        let Some(c) = self.masters[i].cluster.as_ref() else {
            return;
        };
        let ls: SmallVec<[usize; 8]> = c.listeners.iter().copied().collect();
        for l in ls {
            self.drop_connection_quietly(l);
            let link = &mut self.links[l];
            link.clear_streams();
            link.retry_at = None;
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
