//! The simulated client processes: the crate's core driven as the mio driver drives it, and
//! the callers (users) that take, hold, extend, release and drop locks.

use std::collections::VecDeque;
use std::time::Duration;

use redlock_mux::core::{Core, Done, LinkId, TaskId, WaitMode};
use redlock_mux::{Error, Lock, Redlock};

use super::{ms, Call, Grant, Held, Item, Property, Us, World, MS};

/// How long the shared client's loop drains at its end (`shared::hub::DRAIN`).
const DRAIN: Us = 2_000 * MS;

pub struct Client {
    pub cfg: super::ClientCfg,
    pub core: Core,
    /// The connection of each link (`i < n`: master i's lock link, `n + i` its sub link).
    pub links: Vec<Option<usize>>,
    /// Whether the link's connection is up as far as the client knows.
    pub up: Vec<bool>,
    /// What reached the sockets and was not read yet.
    pub inbox: VecDeque<(usize, Item)>,
    pub paused_until: Option<Us>,
    /// The single owner runs its loop only during a call.
    pub in_loop: bool,
    pub left_loop: Us,
    pub callers: Vec<Caller>,
    /// Locks the single owner's user dropped: released at its next call.
    pub dropped: Vec<Lock>,
    /// The shared client's drain started.
    pub closing_since: Option<Us>,
    pub shut: bool,
    /// Turns at one instant (a core that never settles).
    pub same_instant: (Us, u32),
    /// The client still owed releases when it was dropped (single owner).
    pub owed_at_drop: bool,
}

pub struct Caller {
    pub state: State,
    /// Its call record (`World::calls`) while it calls.
    pub call: Option<usize>,
    /// Its hold record (`World::held`) while it holds.
    pub hold: Option<usize>,
    /// Its lock's watch record (`World::watches`) while it holds a watched lock.
    pub watch: Option<usize>,
    /// When its watched lock was reported lost (the hold ends there).
    pub lost_at: Option<Us>,
}

pub enum State {
    Idle,
    Think {
        until: Us,
    },
    Calling {
        task: TaskId,
        give_up: Option<Us>,
    },
    Holding {
        lock: Lock,
        work_end: Us,
        extends_left: u32,
    },
    Extending {
        lock: Lock,
        task: TaskId,
        work_end: Us,
        extends_left: u32,
    },
    Releasing {
        task: TaskId,
    },
}

impl Client {
    pub fn new(w: &World, c: usize) -> Client {
        let cfg = w.cfg.clients[c].clone();
        let n = w.listed.len();
        let urls: Vec<String> = (0..n).map(|i| w.master_url(i)).collect();
        let mut b = Redlock::builder()
            .masters(&urls)
            .retry_count(cfg.retry_count)
            .retry_delay(Duration::from_micros(cfg.retry_delay))
            .retry_jitter(Duration::from_micros(cfg.retry_jitter))
            .drift_factor(0.01)
            .connect_timeout(Duration::from_micros(w.cfg.connect_timeout))
            .stall_timeout(Duration::from_micros(w.cfg.stall_timeout))
            .wait_mode(if cfg.notify {
                WaitMode::Notify
            } else {
                WaitMode::Poll
            })
            .fairness(cfg.fairness)
            .fencing(cfg.fencing);
        if let Some(t) = cfg.node_timeout {
            b = b.node_timeout(Duration::from_micros(t));
        }
        if let Some(g) = w.cfg.amnesia_guard {
            b = b.amnesia_guard(Duration::from_micros(g));
        }
        // Every client's wall clock starts at the same instant: scores compare.
        let seed = 0x5151_0000 + c as u64 * 7919 + w.cfg.masters as u64;
        let core = b
            .build_core(
                w.instant(0),
                1_700_000_000_000_000,
                seed ^ w.rng_seed_hint(),
            )
            .expect("a core");
        let callers = if cfg.shared { cfg.callers.max(1) } else { 1 };
        Client {
            cfg,
            core,
            links: vec![None; 2 * n],
            up: vec![false; 2 * n],
            inbox: VecDeque::new(),
            paused_until: None,
            in_loop: false,
            left_loop: 0,
            callers: (0..callers)
                .map(|_| Caller {
                    state: State::Idle,
                    call: None,
                    hold: None,
                    watch: None,
                    lost_at: None,
                })
                .collect(),
            dropped: Vec::new(),
            closing_since: None,
            shut: false,
            same_instant: (0, 0),
            owed_at_drop: false,
        }
    }

    /// The loop runs (reads, steps, timers).
    pub fn reading(&self) -> bool {
        !self.shut && self.paused_until.is_none() && (self.cfg.shared || self.in_loop)
    }

    pub fn next_wake(&self, w: &World) -> Option<Us> {
        if self.shut || self.paused_until.is_some() {
            return None;
        }
        let mut next: Option<Us> = None;
        let mut min = |x: Us| next = Some(next.map_or(x, |n: Us| n.min(x)));
        if self.reading() {
            if self.core.has_news() {
                min(w.t);
            } else if let Some(t) = self.core.next_timer(None) {
                min(w.us(t).max(w.t));
            }
            if !self.inbox.is_empty() {
                min(w.t);
            }
        }
        if let Some(since) = self.closing_since {
            min(since + DRAIN);
        }
        for k in &self.callers {
            match &k.state {
                State::Think { until } => min(*until),
                State::Holding {
                    lock,
                    work_end,
                    extends_left,
                } => min(hold_next(w, lock, *work_end, *extends_left)),
                State::Calling {
                    give_up: Some(g), ..
                } => min(*g),
                _ => {}
            }
        }
        if w.stopping && !self.shut && self.idle_callers() && self.closing_since.is_none() {
            min(w.t);
        }
        next
    }

    fn idle_callers(&self) -> bool {
        self.callers.iter().all(|k| matches!(k.state, State::Idle))
    }

    fn busy(&self) -> bool {
        self.callers.iter().any(|k| {
            // A watched hold is the single owner's `hold`: its keeper reads the masters'
            // connections all along.
            k.watch.is_some()
                || matches!(
                    k.state,
                    State::Calling { .. } | State::Extending { .. } | State::Releasing { .. }
                )
        })
    }

    pub fn describe(&self) -> String {
        let states: Vec<&str> = self
            .callers
            .iter()
            .map(|k| match k.state {
                State::Idle => "idle",
                State::Think { .. } => "think",
                State::Calling { .. } => "calling",
                State::Holding { .. } => "holding",
                State::Extending { .. } => "extending",
                State::Releasing { .. } => "releasing",
            })
            .collect();
        format!(
            "callers {states:?}, idle core {}, owes releases {}, closing {:?}",
            self.core.is_idle(),
            self.core.owes_releases(),
            self.closing_since
        )
    }
}

/// The next thing a holder does: stop (work done, or validity over for an honest holder),
/// or extend (a third of the TTL before the end).
fn hold_next(w: &World, lock: &Lock, work_end: Us, extends_left: u32) -> Us {
    let valid = w.us(lock.valid_until());
    let mut next = work_end;
    if w.cfg.honest {
        next = next.min(valid);
    }
    if extends_left > 0 {
        let margin = lock.ttl().as_micros() as Us / 3;
        let at = valid.saturating_sub(margin).max(w.t);
        if at < work_end {
            next = next.min(at);
        }
    }
    next
}

impl World {
    pub(crate) fn rng_seed_hint(&self) -> u64 {
        // The tokens differ per run: the world's seed drew the servers' seeds.
        self.masters
            .iter()
            .map(|m| m.server.config().seed)
            .fold(0, |a, b| a.rotate_left(7) ^ b)
    }

    // ----- the driver's side ------------------------------------------------------------

    /// The client's loop wakes (its timer, news, or a caller's timer).
    pub(crate) fn wake_client(&mut self, c: usize) {
        let t = self.t;
        if self.clients[c].reading() {
            let cl = &self.clients[c];
            let due = cl.core.has_news()
                || !cl.inbox.is_empty()
                || cl.core.next_timer(None).is_some_and(|x| self.us(x) <= t);
            if due {
                self.client_reads(c);
                if !self.clients[c].inbox.is_empty() {
                    return;
                }
                self.turn(c);
                return;
            }
        }
        for k in 0..self.clients[c].callers.len() {
            let due = match &self.clients[c].callers[k].state {
                State::Think { until } => *until <= t,
                State::Holding {
                    lock,
                    work_end,
                    extends_left,
                } => hold_next(self, lock, *work_end, *extends_left) <= t,
                State::Calling {
                    give_up: Some(g), ..
                } => *g <= t,
                _ => false,
            };
            if due {
                self.caller_timer(c, k);
                return;
            }
        }
        if self.stopping {
            self.maybe_shut(c);
        }
    }

    /// One turn of the client's loop at the current time: step, socket actions, writes;
    /// again while the core has news or an overdue timer. Then hand out what is done.
    pub(crate) fn turn(&mut self, c: usize) {
        let t = self.t;
        let now = self.instant(t);
        {
            let cl = &mut self.clients[c];
            if cl.same_instant.0 == t {
                cl.same_instant.1 += 1;
            } else {
                cl.same_instant = (t, 1);
            }
            if cl.same_instant.1 > 5_000 {
                let what = format!("client {c}: 5,000 turns at one instant: {}", cl.describe());
                self.violation(Property::Stuck, t, what);
                return;
            }
        }
        let mut settled = false;
        for _ in 0..64 {
            self.clients[c].core.step(now);
            self.apply_actions(c);
            self.flush(c);
            let core = &self.clients[c].core;
            let overdue = !core.has_news() && core.next_timer(None).is_some_and(|x| x < now);
            if !core.has_news() && !overdue {
                settled = true;
                break;
            }
        }
        if !settled {
            self.violation(
                Property::Stuck,
                t,
                format!("client {c}: the core never settles at one instant"),
            );
            return;
        }
        self.collect_done(c);
        self.collect_lost(c);
        if self.stopping {
            self.maybe_shut(c);
        }
    }

    fn apply_actions(&mut self, c: usize) {
        for _ in 0..1024 {
            let Some(a) = self.clients[c].core.take_action() else {
                return;
            };
            match a {
                redlock_mux::core::Action::Connect(LinkId(l)) => {
                    // A cluster's links from `2 n` on, as the driver's `connect` makes room.
                    if self.clients[c].links.len() <= l {
                        self.clients[c].links.resize(l + 1, None);
                        self.clients[c].up.resize(l + 1, false);
                    }
                    if let Some(old) = self.clients[c].links[l].take() {
                        self.close_conn(old, false);
                    }
                    let conn = self.open_conn(c, l);
                    self.clients[c].links[l] = Some(conn);
                    self.clients[c].up[l] = false;
                }
                redlock_mux::core::Action::Close { link, reset } => {
                    if let Some(old) = self.clients[c].links.get_mut(link.0).and_then(Option::take)
                    {
                        self.close_conn(old, !reset);
                    }
                    if let Some(up) = self.clients[c].up.get_mut(link.0) {
                        *up = false;
                    }
                }
            }
        }
        let t = self.t;
        self.violation(
            Property::Stuck,
            t,
            format!("client {c}: the core asks for socket actions without end"),
        );
    }

    fn flush(&mut self, c: usize) {
        if self.clustered() {
            return self.flush_with(c);
        }
        let (lock, sub) = self.clients[c].core.flush_wanted();
        let links = super::link_count(&self.clients[c]);
        let n = links / 2;
        for l in 0..links {
            let (Some(conn), true) = (self.clients[c].links[l], self.clients[c].up[l]) else {
                continue;
            };
            let wanted = if l < n { lock } else { sub };
            if !wanted && !self.clients[c].core.has_output(LinkId(l)) {
                continue;
            }
            for _ in 0..64 {
                let out = self.clients[c].core.send_buf(LinkId(l)).to_vec();
                if out.is_empty() {
                    break;
                }
                self.send(conn, &out);
                if !self.clients[c].core.sent(LinkId(l), out.len()) {
                    break;
                }
            }
        }
        self.clients[c].core.flushed();
        self.apply_actions(c);
    }

    /// The driver's flush as it runs it (`Core::flush_with`): what a cluster master needs
    /// (its lock link's requests go to its shards' links on the way).
    fn flush_with(&mut self, c: usize) {
        let now = self.instant(self.t);
        let mut writes: Vec<(usize, Vec<u8>)> = Vec::new();
        let cl = &mut self.clients[c];
        let (links, up) = (&cl.links, &cl.up);
        cl.core.flush_with(now, |l, bytes| {
            match (links.get(l.0).copied().flatten(), up.get(l.0)) {
                (Some(conn), Some(true)) => {
                    writes.push((conn, bytes.to_vec()));
                    Ok(bytes.len())
                }
                _ => Ok(0),
            }
        });
        for (conn, bytes) in writes {
            self.send(conn, &bytes);
        }
        self.apply_actions(c);
    }

    /// The client reads what reached its sockets (if its loop runs), then turns.
    pub(crate) fn client_reads(&mut self, c: usize) {
        if !self.clients[c].reading() {
            return;
        }
        if self.read_inbox(c) {
            self.turn(c);
        }
    }

    /// Hand what reached the sockets to the core; whether anything was.
    fn read_inbox(&mut self, c: usize) -> bool {
        let now = self.instant(self.t);
        let mut any = false;
        while let Some((conn, item)) = self.clients[c].inbox.pop_front() {
            let l = self.conns[conn].link;
            if self.clients[c].links[l] != Some(conn) {
                continue; // a connection the client closed since
            }
            any = true;
            let core = &mut self.clients[c].core;
            match item {
                Item::Bytes(b) => {
                    let mut rest = &b[..];
                    while !rest.is_empty() {
                        let Some(buf) = core.recv_buf(LinkId(l), now) else {
                            break;
                        };
                        let k = buf.len().min(rest.len());
                        buf[..k].copy_from_slice(&rest[..k]);
                        rest = &rest[k..];
                        if !core.received(LinkId(l), k, now) {
                            break;
                        }
                    }
                }
                Item::Connected => {
                    core.handle_connected(LinkId(l));
                    self.clients[c].up[l] = true;
                }
                Item::Refused => {
                    self.clients[c].links[l] = None;
                    self.clients[c].up[l] = false;
                    self.conns[conn].client_open = false;
                    self.clients[c]
                        .core
                        .handle_closed(LinkId(l), super::connect_refused(), now);
                }
                Item::Closed(kind) => {
                    self.clients[c].links[l] = None;
                    self.clients[c].up[l] = false;
                    self.conns[conn].client_open = false;
                    self.clients[c]
                        .core
                        .handle_closed(LinkId(l), super::closed_fault(kind), now);
                }
            }
            self.apply_actions(c);
        }
        any
    }

    /// The single owner enters its loop for a call: the time away shifts the core's stall
    /// clocks, what arrived meanwhile is read, the locks its user dropped are released.
    fn enter(&mut self, c: usize) {
        if self.clients[c].cfg.shared {
            return;
        }
        let t = self.t;
        let now = self.instant(t);
        let cl = &mut self.clients[c];
        if !cl.in_loop && cl.paused_until.is_none() {
            let idle = t.saturating_sub(cl.left_loop);
            if idle >= super::idle_shift_min() {
                cl.core.shift_clocks(Duration::from_micros(idle), now);
            }
        }
        cl.in_loop = true;
        if self.clients[c].paused_until.is_none() {
            self.read_inbox(c);
        }
        let dropped = std::mem::take(&mut self.clients[c].dropped);
        for lock in dropped {
            self.clients[c].core.release_detached(&lock, now);
        }
    }

    /// The single owner leaves its loop once no call runs.
    fn maybe_leave(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        if !cl.cfg.shared && cl.in_loop && !cl.busy() {
            cl.in_loop = false;
            cl.left_loop = self.t;
        }
    }

    // ----- the callers ----------------------------------------------------------------------

    pub(crate) fn start_callers(&mut self, c: usize) {
        for k in 0..self.clients[c].callers.len() {
            let until = self.t + self.think();
            self.clients[c].callers[k].state = State::Think { until };
        }
    }

    fn think(&mut self) -> Us {
        let (a, b) = self.cfg.think;
        self.rng.u64(a..=b.max(a))
    }

    fn caller_timer(&mut self, c: usize, k: usize) {
        let t = self.t;
        let state = std::mem::replace(&mut self.clients[c].callers[k].state, State::Idle);
        match state {
            State::Think { .. } => {
                if self.stopping {
                    self.maybe_shut(c);
                } else {
                    self.start_call(c, k);
                }
            }
            State::Calling { task, .. } => {
                // The caller gives up (drops its future): the call is cancelled.
                self.clients[c].callers[k].state = State::Calling {
                    task,
                    give_up: None,
                };
                let now = self.instant(t);
                self.clients[c].core.cancel(task, now);
                self.log(|| format!("client {c} caller {k} gives up"));
                self.turn(c);
            }
            State::Holding {
                lock,
                work_end,
                extends_left,
            } => {
                let valid = self.us(lock.valid_until());
                if t >= work_end || (self.cfg.honest && t >= valid) {
                    self.end_hold(c, k, lock);
                } else {
                    self.extend(c, k, lock, work_end, extends_left);
                }
            }
            other => self.clients[c].callers[k].state = other,
        }
    }

    fn start_call(&mut self, c: usize, k: usize) {
        let cfg = self.clients[c].cfg.clone();
        let w = cfg.calls;
        let total: u32 = w.iter().sum();
        let mut pick = self.rng.u32(..total.max(1));
        let mut kind = 0;
        while kind < 3 && pick >= w[kind] {
            pick -= w[kind];
            kind += 1;
        }
        let pool: Vec<usize> = cfg
            .resources
            .clone()
            .unwrap_or_else(|| (0..self.cfg.resources).collect());
        if kind == 3 && pool.len() < 2 {
            kind = 1;
        }
        let mut res = vec![pool[self.rng.usize(..pool.len())]];
        if kind == 3 {
            let want = self.rng.usize(2..=pool.len().min(3));
            while res.len() < want {
                let r = pool[self.rng.usize(..pool.len())];
                if !res.contains(&r) {
                    res.push(r);
                }
            }
        }
        let ttl_ms = self.rng.u64(self.cfg.ttl.0 / MS..=self.cfg.ttl.1 / MS);
        let ttl = Duration::from_millis(ttl_ms);
        let t = self.t;
        let (retries, deadline) = match kind {
            0 => (0, None),
            2 => {
                let (a, b) = self.cfg.deadline;
                (cfg.retry_count, Some(t + self.rng.u64(a..=b.max(a))))
            }
            _ => (cfg.retry_count, None),
        };
        let give_up = if cfg.shared && kind != 0 {
            self.cfg
                .give_up
                .map(|(a, b)| t + self.rng.u64(a..=b.max(a)))
        } else {
            None
        };
        self.enter(c);
        let now = self.instant(t);
        let names: Vec<Vec<u8>> = res.iter().map(|&r| World::resource_name(r)).collect();
        let deadline_at = deadline.map(|d| self.instant(d));
        let task = self.clients[c].core.submit_lock(
            names.iter().map(|n| &n[..]),
            ttl,
            deadline_at,
            retries,
            now,
        );
        let call = self.calls.len();
        self.calls.push(Call {
            client: c,
            caller: k,
            res: res.clone(),
            kind: ["try_lock", "lock", "lock_with_deadline", "lock_many"][kind],
            fair: cfg.fairness,
            notify: cfg.notify,
            start: t,
            end: None,
            granted: false,
            attempts: 0,
            retries: deadline.is_none().then_some(retries),
            deadline,
            result: String::new(),
        });
        self.stats.calls += 1;
        self.log(|| {
            format!(
                "client {c} caller {k}: {} {res:?} ttl {ttl_ms} ms",
                ["try_lock", "lock", "lock_with_deadline", "lock_many"][kind]
            )
        });
        let caller = &mut self.clients[c].callers[k];
        caller.call = Some(call);
        caller.state = State::Calling { task, give_up };
        self.turn(c);
    }

    /// Hand what the core finished to the callers.
    fn collect_done(&mut self, c: usize) {
        for k in 0..self.clients[c].callers.len() {
            let task = match &self.clients[c].callers[k].state {
                State::Calling { task, .. }
                | State::Extending { task, .. }
                | State::Releasing { task } => *task,
                _ => continue,
            };
            if !self.clients[c].core.is_done(task) {
                continue;
            }
            let result = self.clients[c].core.take(task);
            let state = std::mem::replace(&mut self.clients[c].callers[k].state, State::Idle);
            match state {
                State::Calling { .. } => self.call_done(c, k, result),
                State::Extending {
                    mut lock,
                    work_end,
                    extends_left,
                    ..
                } => {
                    let hold = self.clients[c].callers[k].hold;
                    self.stats.extends += 1;
                    match result {
                        Ok(Done::Extended { valid_until, ttl }) => {
                            lock.extended(valid_until, ttl);
                            if let Some(h) = hold {
                                self.held[h].valid_until = self.us(valid_until);
                            }
                            let v = self.us(valid_until);
                            self.log(|| format!("client {c} caller {k}: extended to {:.3}", ms(v)));
                        }
                        Ok(other) => panic!("an extend ended with {other:?}"),
                        Err(e) => {
                            self.stats.failed_extends += 1;
                            if let Some(h) = hold {
                                self.held[h].failed_extend = true;
                            }
                            self.log(|| format!("client {c} caller {k}: extend failed: {e}"));
                        }
                    }
                    let lost_at = self.clients[c].callers[k].lost_at;
                    let work_end = if self.stopping { self.t } else { work_end };
                    self.clients[c].callers[k].state = State::Holding {
                        lock,
                        work_end: lost_at.map_or(work_end, |l| l.min(work_end)),
                        extends_left,
                    };
                }
                State::Releasing { .. } => {
                    self.stats.releases += 1;
                    self.log(|| format!("client {c} caller {k}: released: {:?}", result.is_ok()));
                    self.after_call(c, k);
                }
                _ => unreachable!(),
            }
        }
        self.maybe_leave(c);
    }

    /// The watched locks the core found lost: (xii) checked; the holder stops at once
    /// (the shared client marks the guard lost, `hold` tells the work), then releases.
    fn collect_lost(&mut self, c: usize) {
        while let Some(w) = self.clients[c].core.take_lost() {
            let t = self.t;
            let report = self.clients[c].core.watch_lost(w);
            let Some(r) = self
                .watches
                .iter()
                .rposition(|x| x.client == c && x.id == w && x.end.is_none())
            else {
                continue;
            };
            let mut failed = 0u64;
            if let Some(rep) = report.as_ref().and_then(|e| e.report()) {
                for (i, (_, o)) in rep.outcomes().enumerate() {
                    if matches!(o, redlock_mux::rules::Outcome::Failed(_)) {
                        failed |= 1 << i;
                    }
                }
            }
            self.stats.lost_reports += 1;
            self.watches[r].reported = Some(t);
            let k = self.watches[r].caller;
            let token = String::from_utf8_lossy(&self.watches[r].token[..16]).into_owned();
            self.log(|| format!("client {c} caller {k}: LOST {token} (failed votes {failed:b})"));
            self.check_report(r, failed);
            let caller = &mut self.clients[c].callers[k];
            if caller.watch != Some(r) {
                continue;
            }
            caller.lost_at = Some(t);
            if let State::Holding { work_end, .. } = &mut caller.state {
                *work_end = (*work_end).min(t);
            }
        }
    }

    fn after_call(&mut self, c: usize, k: usize) {
        if self.stopping {
            self.clients[c].callers[k].state = State::Idle;
        } else {
            let until = self.t + self.think();
            self.clients[c].callers[k].state = State::Think { until };
        }
    }

    fn call_done(&mut self, c: usize, k: usize, result: Result<Done, Error>) {
        let t = self.t;
        let call = self.clients[c].callers[k].call.take().expect("a call");
        self.calls[call].end = Some(t);
        match result {
            Ok(Done::Locked(lock)) => {
                self.stats.grants += 1;
                self.calls[call].granted = true;
                self.calls[call].attempts = lock.attempts();
                self.calls[call].result = "granted".into();
                self.stats.attempts += lock.attempts() as u64;
                self.stats.max_attempts = self.stats.max_attempts.max(lock.attempts());
                let res = self.calls[call].res.clone();
                let token = lock.token().as_str()[..16].to_string();
                let valid = self.us(lock.valid_until());
                self.log(|| {
                    format!(
                        "client {c} caller {k}: GRANTED {res:?} {token} valid until {:.3} \
                         (attempts {}, fence {:?})",
                        ms(valid),
                        lock.attempts(),
                        lock.fencing_token()
                    )
                });
                self.granted.insert(token.as_bytes().to_vec(), res.clone());
                self.on_grant(c, call, &lock);
                let hold = self.held.len();
                for &r in &res {
                    self.held.push(Held {
                        res: r,
                        client: c,
                        caller: k,
                        token: token.clone(),
                        start: t,
                        end: u64::MAX,
                        valid_until: valid,
                        failed_extend: false,
                    });
                }
                if let Some(f) = lock.fencing_token() {
                    self.stats.fenced += 1;
                    self.grants.push(Grant {
                        at: t,
                        client: c,
                        res: res.clone(),
                        token: token.clone(),
                        fence: f,
                    });
                }
                let (a, b) = self.cfg.work;
                let work_end = if self.stopping {
                    t
                } else {
                    t + self.rng.u64(a..=b.max(a))
                };
                let extends_left = self.rng.u32(0..=self.cfg.max_extends);
                let watch = self.clients[c].cfg.watch.then(|| {
                    let now = self.instant(t);
                    let id = self.clients[c].core.watch_lock(&lock, now);
                    self.add_watch(super::check::WatchRec {
                        client: c,
                        caller: k,
                        id,
                        token: lock.token().as_bytes().to_vec(),
                        keys: lock.resources().map(<[u8]>::to_vec).collect(),
                        hold: Some(hold),
                        start: t,
                        end: None,
                        reported: None,
                        hist: Vec::new(),
                        owe_since: None,
                        push_lost: false,
                        tampered: false,
                    })
                });
                let caller = &mut self.clients[c].callers[k];
                caller.hold = Some(hold);
                caller.watch = watch;
                caller.lost_at = None;
                caller.state = State::Holding {
                    lock,
                    work_end,
                    extends_left,
                };
                if watch.is_some() {
                    // The reads that arm the watch go out at once (the keeper's loop).
                    self.flush(c);
                }
            }
            Ok(other) => panic!("a lock call ended with {other:?}"),
            Err(e) => {
                self.stats.failed_calls += 1;
                let attempts = e.report().map_or(0, |r| r.attempts());
                self.calls[call].attempts = attempts;
                self.stats.attempts += attempts as u64;
                self.stats.max_attempts = self.stats.max_attempts.max(attempts);
                self.calls[call].result = format!("{e}");
                self.log(|| format!("client {c} caller {k}: lock call failed: {e}"));
                self.after_call(c, k);
            }
        }
        self.check_call(call);
    }

    /// The holder stops using the lock: it releases it, drops it, or vanishes.
    fn end_hold(&mut self, c: usize, k: usize, lock: Lock) {
        let t = self.t;
        let valid = self.us(lock.valid_until());
        if let Some(r) = self.clients[c].callers[k].watch.take() {
            // `hold` unwatches when the work is over; the shared loop on the release.
            let id = self.watches[r].id;
            self.clients[c].core.unwatch_lock(id);
            self.watches[r].end = Some(t);
        }
        let lost_at = self.clients[c].callers[k].lost_at.take();
        if let Some(h) = self.clients[c].callers[k].hold.take() {
            let n = lock.resources().count();
            let end = if self.cfg.honest { t.min(valid) } else { t };
            let end = lost_at.map_or(end, |l| l.min(end));
            for x in &mut self.held[h..h + n] {
                x.end = end;
                x.valid_until = valid;
            }
        }
        let p = self.rng.f64();
        let token = lock.token().as_bytes()[..16].to_vec();
        if !self.stopping && p < self.cfg.vanish_prob {
            self.log(|| format!("client {c} caller {k}: vanishes with its lock"));
            self.vanished.push(lock.token().as_bytes().to_vec());
            self.after_call(c, k);
            return;
        }
        let res: Vec<usize> = lock.resources().filter_map(World::resource_of).collect();
        if !self.stopping && p < self.cfg.vanish_prob + self.cfg.drop_prob {
            self.log(|| format!("client {c} caller {k}: drops its lock"));
            let now = self.instant(t);
            for r in res {
                self.releases.push((r, c, t, token.clone()));
            }
            if self.clients[c].cfg.shared {
                for r in lock.resources().filter_map(World::resource_of) {
                    self.expect_wakeup(r, valid);
                }
                self.clients[c].core.release_detached(&lock, now);
                self.after_call(c, k);
                self.turn(c);
            } else {
                self.clients[c].dropped.push(lock);
                self.after_call(c, k);
            }
            return;
        }
        for r in res {
            self.releases.push((r, c, t, token.clone()));
            self.expect_wakeup(r, valid);
        }
        self.enter(c);
        let now = self.instant(t);
        let task = self.clients[c].core.submit_release(&lock, now);
        self.clients[c].callers[k].state = State::Releasing { task };
        self.turn(c);
    }

    fn extend(&mut self, c: usize, k: usize, lock: Lock, work_end: Us, extends_left: u32) {
        let t = self.t;
        if t >= self.us(lock.valid_until()) {
            // `extend` of an invalid lock fails at once (`Error::Expired`).
            self.clients[c].callers[k].state = State::Holding {
                lock,
                work_end,
                extends_left: 0,
            };
            return;
        }
        let (a, b) = self.cfg.extend_ttl;
        let base = lock.ttl().as_millis() as f64;
        let f = a + self.rng.f64() * (b - a);
        let min_ms = (self.cfg.ttl.0 / MS).max(5);
        let ttl_ms = ((base * f) as u64).max(min_ms);
        self.enter(c);
        let now = self.instant(t);
        let task = self.clients[c]
            .core
            .submit_extend(&lock, Duration::from_millis(ttl_ms), now);
        self.clients[c].callers[k].state = State::Extending {
            lock,
            task,
            work_end,
            extends_left: extends_left - 1,
        };
        self.turn(c);
    }

    /// The faults healed: the callers stop (a waiting call is cancelled, a lock released).
    pub(crate) fn stop_callers(&mut self, c: usize) {
        let now = self.instant(self.t);
        for k in 0..self.clients[c].callers.len() {
            let state = std::mem::replace(&mut self.clients[c].callers[k].state, State::Idle);
            match state {
                State::Think { .. } | State::Idle => {}
                State::Calling { task, .. } => {
                    self.clients[c].callers[k].state = State::Calling {
                        task,
                        give_up: None,
                    };
                    self.clients[c].core.cancel(task, now);
                }
                State::Holding {
                    lock, extends_left, ..
                } => {
                    let t = self.t;
                    self.clients[c].callers[k].state = State::Holding {
                        lock,
                        work_end: t,
                        extends_left,
                    };
                }
                other => self.clients[c].callers[k].state = other,
            }
        }
        if self.clients[c].reading() {
            self.turn(c);
        }
    }

    /// Every caller stopped: the client shuts down as its front-end does.
    pub(crate) fn maybe_shut(&mut self, c: usize) {
        if self.clients[c].shut || !self.clients[c].idle_callers() {
            return;
        }
        let t = self.t;
        if self.clients[c].cfg.shared {
            let since = *self.clients[c].closing_since.get_or_insert(t);
            let core = &self.clients[c].core;
            let drained = core.is_idle() && !core.owes_releases();
            if !drained && t < since + DRAIN {
                return;
            }
            self.clients[c].owed_at_drop = !drained;
        } else {
            // `Drop for Redlock`: enter (release what its user dropped) and one turn.
            self.enter(c);
            let now = self.instant(t);
            self.clients[c].core.step(now);
            self.apply_actions(c);
            self.flush(c);
            let core = &self.clients[c].core;
            self.clients[c].owed_at_drop = !core.is_idle() || core.owes_releases();
        }
        let owed = self.clients[c].owed_at_drop;
        self.log(|| format!("client {c} shuts down (owes releases: {owed})"));
        self.clients[c].shut = true;
        for l in 0..self.clients[c].links.len() {
            if let Some(conn) = self.clients[c].links[l].take() {
                self.close_conn(conn, true);
            }
        }
    }
}

/// `Us` of a call's settings, for the bounds.
pub(crate) fn min_retry_gap(cfg: &super::ClientCfg) -> Us {
    cfg.retry_delay.saturating_sub(cfg.retry_jitter).max(MS)
}
