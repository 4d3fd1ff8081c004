//! Hot resources: lock calls that wait (`lock()`), as `src/machine/wait.rs` and
//! `src/machine/task.rs` run them, over the masters' lines (`master.rs`: `ACQUIRE_WAIT`,
//! `RELEASE`) and announcements on subscription connections.
//!
//! A waiting client makes one lock call at a time (one task per client: the library's
//! per-client wait lists then hold one task, so `eligible` is always true and
//! `released_here` wakes nobody). A call keeps its resources, fencing choice, arrival score
//! (the client's clock when it started) and waiter id (the client, then the call's first
//! token) over its attempts; each attempt has a fresh token and is one `ACQUIRE_WAIT`
//! round judged by `rules` as any acquire.
//!
//! After a refused attempt (`Task::conclude` / `next_attempt`): the cleanup release (last
//! one with `leave` when the caller cancelled, which ends the call); a timed attempt sets
//! the next timed retry `rules::retry_delay` ahead; the wake-up is never later than the
//! holder's expiry (`rules::free_in` over the `PTTL`s, + 1 ms + up to a tenth of the
//! jitter). Notify mode: subscribe (once per client and master, kept: the library's
//! channels linger 2 s after the last waiter), replay what was heard during the attempt
//! (`hear`), try again at once when that frees room for a quorum or when the refusal was
//! not covered by a confirmed subscription but one confirmed since; else sleep.
//! While asleep: an announcement (the key's channel, or this client's channel naming its
//! waiter) wakes it when `hear` says the masters still blocked leave room for a quorum;
//! a subscription confirmed while it is not covered wakes it; else the timer does.

use std::time::Duration;

use redlock_mux::rules::{self, Outcome};

use super::check::{Call, Violation};
use super::master::{waiter_name, Line, Publish};
use super::{ms, Ev, Keys, Phase, Round, Sim, Us, MS};

/// Which clients wait, how, and what the checker demands of them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hot {
    /// Probability that a client's lock calls wait (`lock()`: `ACQUIRE_WAIT`) instead of
    /// the try-lock loop (`SET NX`, retry after the delay).
    pub waiting: f64,
    /// Given it waits: probability of notify mode (lines, announcements) over poll mode.
    pub notify: f64,
    /// Given notify mode: probability of fairness (polite attempts).
    pub fair: f64,
    /// (v): every call of a fair client that keeps asking is granted within this bound.
    pub starvation_bound: Option<Us>,
    /// (vi): a fair call granted while a fair call that arrived earlier already stood in
    /// line on a quorum is a violation.
    pub check_order: bool,
    /// Hazard: masters order a line by their own arrival order (see `Semantics`).
    pub line_by_master_arrival: bool,
    /// Hazard: politeness refuses the first live waiter too.
    pub polite_refuses_first: bool,
    /// OLD: a grant does not refresh the waiter's place in line (see `Semantics`).
    pub grant_skips_refresh: bool,
}

impl Hot {
    /// A client's mode (no draw at all when no client waits).
    pub fn mode(&self, rng: &mut fastrand::Rng) -> Mode {
        if self.waiting <= 0.0 || rng.f64() >= self.waiting {
            return Mode::Try;
        }
        if rng.f64() < self.notify {
            Mode::Notify {
                fair: rng.f64() < self.fair,
            }
        } else {
            Mode::Poll
        }
    }
}

/// How a client's lock calls run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The try-lock loop of the rest of the simulation (`SET NX`, fixed retry delay).
    Try,
    /// `WaitMode::Poll`: `ACQUIRE_WAIT` without a line; timed retries, at the latest at the
    /// holder's expiry.
    Poll,
    /// `WaitMode::Notify`, with or without fairness.
    Notify { fair: bool },
}

/// A client's subscription connection to one master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Off,
    Asked,
    /// Confirmed at this time.
    Since(Us),
}

/// What an acquire round tells its call about waiting (`wait::Hint`).
#[derive(Clone, Debug, Default)]
pub struct Hint {
    pub free_in: Option<Us>,
    pub taken: u16,
    pub holders: Vec<Option<u64>>,
}

/// A client's waiting state (the library's `Task` fields of a lock task that waits).
pub struct Waiter {
    /// The current call (index in `Sim::calls`).
    pub call: Option<usize>,
    pub score: Us,
    pub wait_id: Option<u64>,
    /// The held lock's line id: its release leaves the lines.
    pub lock_line: Option<u64>,
    pub alive_ms: u64,
    pub timed: bool,
    pub next_poll: Us,
    pub wake_gen: u64,
    /// The current attempt's acquire t1.
    pub t1: Us,
    /// Per master, this acquire round's `AcquireWait` refusal: TTL left, holder.
    pub left: Vec<i64>,
    pub holder: Vec<Option<u64>>,
    pub hint: Hint,
    pub taken: u16,
    pub blocked: u16,
    pub holders: Vec<Option<u64>>,
    pub woken_by: Option<u64>,
    pub own: Option<u64>,
    /// Announcements heard while an attempt ran: (master, fingerprint, turn).
    pub heard: Vec<(usize, u64, bool)>,
    pub watching: bool,
    /// The caller cancelled the running attempt: the call ends.
    pub cancelled: bool,
    pub sub: Vec<Sub>,
    pub sub_gen: Vec<u64>,
    /// The next timed wake-up is the holder's expiry (statistics).
    pub at_expiry: bool,
}

impl Waiter {
    pub fn new(n: usize) -> Waiter {
        Waiter {
            call: None,
            score: 0,
            wait_id: None,
            lock_line: None,
            alive_ms: 0,
            timed: true,
            next_poll: 0,
            wake_gen: 0,
            t1: 0,
            left: vec![0; n],
            holder: vec![None; n],
            hint: Hint::default(),
            taken: 0,
            blocked: 0,
            holders: vec![None; n],
            woken_by: None,
            own: None,
            heard: Vec::new(),
            watching: false,
            cancelled: false,
            sub: vec![Sub::Off; n],
            sub_gen: vec![0; n],
            at_expiry: false,
        }
    }

    /// `ACQUIRE_WAIT`'s line arguments: notify mode, one key.
    pub fn line(&self, mode: Mode, keys: Keys) -> Option<Line> {
        match mode {
            Mode::Notify { fair } if keys.len() == 1 => Some(Line {
                id: self.wait_id.expect("a waiter id"),
                alive_ms: self.alive_ms,
                polite: fair,
                score: self.score,
            }),
            _ => None,
        }
    }
}

impl Sim {
    fn notify_mode(&self, c: usize) -> bool {
        matches!(self.clients[c].mode, super::Mode::Notify { .. })
    }

    /// A waiting client's new lock call.
    pub(super) fn start_call(&mut self, c: usize) {
        let now = self.now;
        let (keys, fenced) = self.draw_call();
        let fair = matches!(self.clients[c].mode, super::Mode::Notify { fair: true });
        // `Task::start_attempt`: retry delay + jitter + 2 round timeouts + 100 ms.
        let alive = Duration::from_micros(
            self.cfg.retry_base + self.cfg.retry_jitter + 2 * self.cfg.round_timeout + 100 * MS,
        );
        let idx = self.calls.len();
        self.calls.push(Call {
            client: c,
            keys,
            fair,
            score: now,
            start: now,
            inline_at: None,
            granted: None,
            ended: None,
            attempts: 0,
        });
        self.stats.calls += 1;
        let cl = &mut self.clients[c];
        cl.keys = keys;
        cl.fenced = fenced;
        let w = &mut cl.w;
        w.call = Some(idx);
        w.score = now;
        w.wait_id = None;
        w.alive_ms = alive.as_millis() as u64;
        w.timed = true;
        w.next_poll = now;
        w.woken_by = None;
        w.own = None;
        w.heard.clear();
        w.watching = false;
        w.cancelled = false;
        self.tr(Some(c), false, || {
            format!(
                "c{c} lock call {keys}{} (waits, score {})",
                if fenced { " fenced" } else { "" },
                ms(now)
            )
        });
        self.next_try(c);
    }

    /// The call's next attempt: a fresh token, one `ACQUIRE_WAIT` round.
    fn next_try(&mut self, c: usize) {
        let now = self.now;
        let token = self.next_token;
        self.next_token += 1;
        let n = self.cfg.masters;
        self.attempts.push(super::Attempt {
            client: c,
            t1: now,
            released_at: vec![None; n],
            ..super::Attempt::default()
        });
        let notify = self.notify_mode(c);
        let cl = &mut self.clients[c];
        if notify && cl.keys.len() == 1 && cl.w.wait_id.is_none() {
            cl.w.wait_id = Some(((c as u64) << 48) | token);
        }
        cl.phase = Phase::Acquiring;
        cl.token = token;
        cl.w.wake_gen += 1;
        cl.w.heard.clear();
        let (keys, idx) = (cl.keys, cl.w.call.expect("a call"));
        self.calls[idx].attempts += 1;
        self.stats.acquire_rounds += 1;
        self.tr(Some(c), false, || {
            format!("c{c} attempt {keys} token {token}")
        });
        self.start_round(c, Round::Acquire);
        if self.clients[c].round.is_some() && self.rng.f64() < self.cfg.cancel_prob {
            let op = self.clients[c].op;
            let at = self.now + self.rng.u64(..self.cfg.round_timeout);
            self.push(at, Ev::Cancel { c, op });
        }
    }

    /// The acquire round is decided: what it tells the call about waiting
    /// (`Machine::wait_hint`), and (vi)'s bookkeeping: the call stands in line on a quorum
    /// once more than `n - quorum` masters refused it.
    pub(super) fn read_hint(&mut self, c: usize) {
        let n = self.cfg.masters;
        let cl = &mut self.clients[c];
        let mut taken = 0u16;
        for (i, x) in cl.tally.outcomes().iter().enumerate() {
            if *x == Outcome::Taken {
                taken |= 1 << i;
            }
        }
        let (yes, need) = (cl.tally.yes(), cl.tally.need());
        let free_in = if taken != 0 && yes < need {
            let left = cl
                .tally
                .outcomes()
                .iter()
                .zip(cl.w.left.iter())
                .filter(|(x, _)| **x == Outcome::Taken)
                .map(|(_, v)| *v);
            rules::free_in(left, yes, need).map(|d| d.as_micros() as u64)
        } else {
            None
        };
        cl.w.hint = Hint {
            free_in,
            taken,
            holders: cl.w.holder.clone(),
        };
        let in_line = taken.count_ones() as usize > n - self.quorum
            && matches!(cl.mode, super::Mode::Notify { .. })
            && cl.keys.len() == 1;
        if in_line {
            let idx = cl.w.call.expect("a call");
            let now = self.now;
            self.calls[idx].inline_at.get_or_insert(now);
        }
    }

    /// A refused (or failed) attempt's cleanup was sent: end the call (cancelled) or wait.
    pub(super) fn wait_after_failure(&mut self, c: usize) {
        let now = self.now;
        if self.clients[c].w.cancelled {
            let idx = self.clients[c].w.call.take().expect("a call");
            self.calls[idx].ended = Some(now);
            self.stats.calls_cancelled += 1;
            let cl = &mut self.clients[c];
            cl.w.cancelled = false;
            cl.w.watching = false;
            cl.phase = Phase::Idle;
            let think = self.rng.u64(0..=self.cfg.think_max);
            self.push(now + think, Ev::Start { c });
            return;
        }
        if self.clients[c].w.timed {
            let d = rules::retry_delay(
                Duration::from_micros(self.cfg.retry_base),
                Duration::from_micros(self.cfg.retry_jitter),
                &mut self.rng,
            );
            let w = &mut self.clients[c].w;
            w.next_poll = now + d.as_micros() as u64;
            w.at_expiry = false;
        }
        if let Some(left) = self.clients[c].w.hint.free_in {
            // `Machine::expiry_jitter`: 1 ms + up to a tenth of the retry jitter.
            let spread = self.cfg.retry_jitter / 10;
            let j = MS
                + rules::retry_delay(
                    Duration::from_micros(spread / 2),
                    Duration::from_micros(spread / 2),
                    &mut self.rng,
                )
                .as_micros() as u64;
            let w = &mut self.clients[c].w;
            if now + left + j < w.next_poll {
                w.next_poll = now + left + j;
                w.at_expiry = true;
            }
        }
        let cl = &mut self.clients[c];
        let wake = cl.w.next_poll.max(now);
        cl.w.taken = cl.w.hint.taken;
        cl.w.blocked = cl.w.hint.taken;
        cl.w.holders = cl.w.hint.holders.clone();
        cl.phase = Phase::Sleep;
        if self.notify_mode(c) {
            self.watch(c);
            let heard = std::mem::take(&mut self.clients[c].w.heard);
            let mut news = None;
            for &(m, fp, turn) in &heard {
                if self.hear(c, m, fp) && turn {
                    news = Some(fp);
                }
            }
            let recheck = !self.covered(c) && self.confirmed_after(c);
            if news.is_some() || recheck {
                self.tr(Some(c), false, || {
                    format!(
                        "c{c} tries again at once ({})",
                        if news.is_some() {
                            "heard a release during the attempt"
                        } else {
                            "not covered, subscription confirmed since"
                        }
                    )
                });
                if news.is_some() {
                    self.stats.woken_by_notice += 1;
                } else {
                    self.stats.woken_by_subscribe += 1;
                }
                self.wake_now(c, news);
                return;
            }
        }
        let w = &mut self.clients[c].w;
        w.wake_gen += 1;
        let gen = w.wake_gen;
        let expiry = w.at_expiry;
        self.push(wake, Ev::Wake { c, gen });
        self.tr(Some(c), false, || {
            format!(
                "c{c} sleeps until {}{}",
                ms(wake),
                if expiry { " (holder's expiry)" } else { "" }
            )
        });
    }

    /// The timed retry is due.
    pub(super) fn on_wake(&mut self, c: usize, gen: u64) {
        let cl = &mut self.clients[c];
        if cl.phase != Phase::Sleep || cl.w.wake_gen != gen {
            return;
        }
        cl.w.timed = true;
        self.stats.timed_wakes += 1;
        if cl.w.at_expiry {
            self.stats.woken_at_expiry += 1;
        }
        self.next_try(c);
    }

    /// `Machine::wake_now`: an attempt now, not a timed one.
    fn wake_now(&mut self, c: usize, fp: Option<u64>) {
        let w = &mut self.clients[c].w;
        if fp.is_some() {
            w.woken_by = fp;
        }
        w.timed = false;
        self.next_try(c);
    }

    /// The call got its lock: (vi), then it stops waiting.
    pub(super) fn call_granted(&mut self, c: usize) {
        let now = self.now;
        let idx = self.clients[c].w.call.take().expect("a call");
        self.calls[idx].granted = Some(now);
        self.stats.calls_granted += 1;
        let waited = now - self.calls[idx].start;
        self.stats.max_wait = self.stats.max_wait.max(waited);
        let t1 = self.clients[c].w.t1;
        if self.cfg.hot.check_order && self.calls[idx].fair {
            let me = self.calls[idx].clone();
            let first = self.calls.iter().find(|a| {
                a.client != c
                    && a.fair
                    && a.granted.is_none()
                    && a.ended.is_none()
                    && a.keys.overlaps(&me.keys)
                    && a.score < me.score
                    && a.inline_at.is_some_and(|at| at <= t1)
            });
            if let Some(a) = first.cloned() {
                self.found(Violation::OutOfOrder {
                    first: a,
                    second: me,
                    granted_at: now,
                    t1,
                });
            }
        }
        let w = &mut self.clients[c].w;
        w.lock_line = w.wait_id;
        w.watching = false;
    }

    /// Notify mode: subscribe on every master (once; the subscriptions stay).
    fn watch(&mut self, c: usize) {
        if self.clients[c].w.watching {
            return;
        }
        self.clients[c].w.watching = true;
        for m in 0..self.cfg.masters {
            if self.clients[c].w.sub[m] == Sub::Off {
                self.subscribe(c, m);
            }
        }
    }

    /// `Machine::hear`: master `m` announced release `fp`; whether the call should try.
    fn hear(&mut self, c: usize, m: usize, fp: u64) -> bool {
        let n = self.cfg.masters;
        let w = &mut self.clients[c].w;
        let fresh = w.woken_by != Some(fp) && w.own != Some(fp);
        let holder_gone = w.holders[m] == Some(fp);
        if !holder_gone && !fresh {
            return false;
        }
        w.blocked &= !(1 << m);
        n - (w.blocked.count_ones() as usize).min(n) >= self.quorum
    }

    /// `Machine::covered`: some master that refused the last attempt had confirmed the
    /// subscription before the attempt was sent.
    fn covered(&self, c: usize) -> bool {
        let w = &self.clients[c].w;
        (0..self.cfg.masters)
            .any(|m| w.taken & (1 << m) != 0 && matches!(w.sub[m], Sub::Since(s) if s <= w.t1))
    }

    /// `Machine::confirmed_after`: some master confirmed after the last attempt was sent.
    fn confirmed_after(&self, c: usize) -> bool {
        let w = &self.clients[c].w;
        w.sub
            .iter()
            .any(|s| matches!(s, Sub::Since(s) if *s > w.t1))
    }

    // ----------------------------------------------------------------------------------
    // Announcements and subscriptions
    // ----------------------------------------------------------------------------------

    /// Master `m` published `p`: to its subscribers, on the subscription connections.
    pub(super) fn publish(&mut self, m: usize, p: Publish) {
        self.stats.notices_sent += 1;
        let subs = self.masters[m].subs;
        let targets: Vec<usize> = match p {
            Publish::Turn { id, .. } => {
                self.stats.notices_turn += 1;
                vec![Line::client(id)]
            }
            Publish::Released { .. } => {
                self.stats.notices_released += 1;
                (0..self.cfg.clients).collect()
            }
        };
        let inc = self.masters[m].inc;
        for c in targets {
            if subs & (1 << c) == 0 {
                continue;
            }
            let l = self.link(c, m);
            if self.cut(c, m) || self.rng.f64() < self.cfg.drop_prob {
                self.stats.notices_lost += 1;
                self.tr(Some(c), false, || {
                    format!("m{m} -> c{c} announcement {} LOST", show(p))
                });
                continue;
            }
            let d = self.delay(l);
            let at = (self.now + d).max(self.last_sub[l]);
            self.last_sub[l] = at;
            self.push(at, Ev::Notice { c, m, p, inc });
        }
    }

    pub(super) fn on_notice(&mut self, c: usize, m: usize, p: Publish, inc: u32) {
        if self.masters[m].inc != inc || !matches!(self.clients[c].w.sub[m], Sub::Since(_)) {
            // The subscription connection died with a restart: what it carried is lost.
            self.stats.notices_lost += 1;
            return;
        }
        self.stats.notices_heard += 1;
        let cl = &self.clients[c];
        let Some(_) = cl.w.call else { return };
        let running =
            cl.phase == Phase::Acquiring && (cl.w.watching || cl.round == Some(Round::Acquire));
        if cl.phase != Phase::Sleep && !running {
            return;
        }
        let (fp, turn) = match p {
            Publish::Released { res, fp } if cl.keys.contains(res) => (fp, true),
            Publish::Turn { fp, id, .. } if cl.w.wait_id == Some(id) => (fp, true),
            _ => return,
        };
        self.tr(Some(c), false, || {
            format!("c{c} <- m{m} announcement {}", show(p))
        });
        // `Machine::notify_task`.
        if self.clients[c].phase == Phase::Sleep {
            if self.hear(c, m, fp) && turn {
                self.stats.woken_by_notice += 1;
                self.wake_now(c, Some(fp));
            }
        } else {
            let heard = &mut self.clients[c].w.heard;
            if heard.len() < 16 && !heard.contains(&(m, fp, turn)) {
                heard.push((m, fp, turn));
            }
        }
    }

    /// Open (or reopen) `c`'s subscription connection to `m`.
    pub(super) fn subscribe(&mut self, c: usize, m: usize) {
        let w = &mut self.clients[c].w;
        w.sub[m] = Sub::Asked;
        w.sub_gen[m] += 1;
        let gen = w.sub_gen[m];
        if !self.masters[m].up || self.cut(c, m) {
            let at = self.now + self.cfg.retry_base.max(MS);
            self.push(at, Ev::SubRetry { c, m, gen });
            return;
        }
        let l = self.link(c, m);
        let d = self.delay(l);
        let at = (self.now + d).max(self.last_sub[l]);
        self.last_sub[l] = at;
        let inc = self.masters[m].inc;
        self.push(at, Ev::SubReq { c, m, inc, gen });
    }

    pub(super) fn on_sub_retry(&mut self, c: usize, m: usize, gen: u64) {
        if self.clients[c].w.sub_gen[m] == gen {
            self.subscribe(c, m);
        }
    }

    pub(super) fn on_sub_req(&mut self, c: usize, m: usize, inc: u32, gen: u64) {
        let l = self.link(c, m);
        if !self.masters[m].up || self.masters[m].inc != inc || self.cut(c, m) {
            let at = self.now + self.cfg.latency.0;
            self.push(at, Ev::SubLost { c, m, gen });
            return;
        }
        self.masters[m].subs |= 1 << c;
        let d = self.delay(l);
        let at = (self.now + d).max(self.last_sub[l]);
        self.last_sub[l] = at;
        self.push(at, Ev::SubAck { c, m, inc, gen });
    }

    pub(super) fn on_sub_ack(&mut self, c: usize, m: usize, inc: u32, gen: u64) {
        let now = self.now;
        let w = &mut self.clients[c].w;
        if self.masters[m].inc != inc || w.sub_gen[m] != gen || w.sub[m] != Sub::Asked {
            return;
        }
        w.sub[m] = Sub::Since(now);
        self.stats.subscribed += 1;
        self.tr(Some(c), false, || format!("c{c} subscribed on m{m}"));
        // `Machine::on_subscribed`: an uncovered waiter tries once more.
        let cl = &self.clients[c];
        if cl.phase == Phase::Sleep && cl.w.call.is_some() && !self.covered(c) {
            self.stats.woken_by_subscribe += 1;
            self.wake_now(c, None);
        }
    }

    pub(super) fn on_sub_lost(&mut self, c: usize, m: usize, gen: u64) {
        if self.clients[c].w.sub_gen[m] != gen {
            return;
        }
        self.clients[c].w.sub[m] = Sub::Off;
        self.stats.subscriptions_lost += 1;
        self.subscribe(c, m);
    }

    /// Master `m` crashed: its subscription connections die (the clients see it soon).
    pub(super) fn subscriptions_die(&mut self, m: usize) {
        for c in 0..self.cfg.clients {
            if self.clients[c].w.sub[m] != Sub::Off {
                let gen = self.clients[c].w.sub_gen[m];
                let at = self.now + self.cfg.latency.0;
                self.push(at, Ev::SubLost { c, m, gen });
            }
        }
    }

    // ----------------------------------------------------------------------------------
    // (v)
    // ----------------------------------------------------------------------------------

    /// (v), after the run: every fair call that kept asking (not cancelled) was granted
    /// within the bound, or started less than the bound before the run ended.
    pub(super) fn check_calls(&mut self) {
        let Some(bound) = self.cfg.hot.starvation_bound else {
            return;
        };
        let end = self.now;
        let starved = self
            .calls
            .iter()
            .find(|a| a.fair && a.ended.is_none() && a.granted.unwrap_or(end) - a.start > bound);
        if let Some(a) = starved.cloned() {
            let waited = a.granted.unwrap_or(end) - a.start;
            self.found(Violation::Starved {
                call: a,
                waited,
                bound,
            });
        }
    }
}

fn show(p: Publish) -> String {
    match p {
        Publish::Released { res, fp } => format!("released r{res} token {fp}"),
        Publish::Turn { res, fp, id } => {
            format!("r{res} token {fp} released: {}'s turn", waiter_name(id))
        }
    }
}
