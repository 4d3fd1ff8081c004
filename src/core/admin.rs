//! Operators' tasks: look at a resource on every master (`Request::Inspect`, a read-only
//! script) and delete it there whatever its value (`Request::ForceRelease`), for both
//! front-ends and the CLI.
//!
//! Each is one round, started like any other (`Rounds::start`: the same links, handshakes,
//! `EVALSHA` with the `EVAL` fallback, timeouts, faults), with two differences: its round
//! is decided once every master answered or failed, or at its timeout, not at a quorum
//! (an operator wants to see every master: `Rounds::check_decided` asks
//! `Request::is_admin`); and each master's answer is kept whole in the op (`Op::views`,
//! filled by [`keep_view`] as the replies are read), to be handed out per master.

use std::time::{Duration, Instant};

use super::ops::{Op, OpId, OpState};
use super::task::{Done, Kind};
use super::{Core, Phase, TaskId};
use crate::inspect::{ForcedRelease, Inspection, View, NAMED_WAITERS};
use crate::resp::Frame;
use crate::rules::Request;

/// How long an operator's round waits for the masters beyond the connect timeout (its
/// connection may have to be opened first, its handshake answered, and the script sent
/// again with `EVAL`, on a machine that may be loaded): the node timeout when it is longer.
const ADMIN_ANSWER: Duration = Duration::from_secs(1);

/// Master `i` answered operator's round `id` with `frame`: keep the answer (while the
/// round waits for it; a late one is not counted by the round either).
pub(super) fn keep_view(ops: &mut [Op], i: usize, id: OpId, req: Request, frame: &Frame<'_>) {
    let Some(op) = ops.get_mut(id.slot as usize) else {
        return;
    };
    if op.gen != id.gen || op.state != OpState::Active {
        return;
    }
    if let Some(slot) = op.views.get_mut(i) {
        *slot = View::of(req, frame);
    }
}

impl Core {
    /// Look at `resource` on every master: its holder's fingerprint, TTL, line of waiters
    /// and fencing counter (`Done::Inspected`). The round waits for every master, up to
    /// the connect timeout and a second (or the node timeout, if longer).
    pub fn submit_inspect(&mut self, resource: &[u8], now: Instant) -> TaskId {
        self.submit_admin(Kind::Inspect, resource, now)
    }

    /// Delete `resource`'s key on every master whatever its value, and wake its waiters
    /// (`Done::ForceReleased`: who held it where). Its holder's next extension fails with
    /// "not held".
    pub fn submit_force_release(&mut self, resource: &[u8], now: Instant) -> TaskId {
        self.submit_admin(Kind::ForceRelease, resource, now)
    }

    /// The round timeout of an operator's request.
    pub(super) fn admin_timeout(&self) -> Duration {
        let answer = ADMIN_ANSWER.max(self.cfg.node_timeout.unwrap_or_default());
        self.rounds.cfg.connect_timeout + answer
    }

    fn submit_admin(&mut self, kind: Kind, resource: &[u8], now: Instant) -> TaskId {
        let id = self.alloc(now);
        let t = &mut self.tasks[id.slot as usize];
        t.begin(kind, Duration::ZERO, now);
        t.keys.clear();
        t.keys.push(resource);
        #[cfg(feature = "tracing")]
        {
            t.span = tracing::debug_span!(
                "redlock_mux::admin",
                op = ?kind,
                resource = %String::from_utf8_lossy(resource)
            );
        }
        let req = if kind == Kind::Inspect {
            Request::Inspect
        } else {
            Request::ForceRelease
        };
        // Its line, liveness and counters are named where the request is encoded.
        let timeout = self.admin_timeout();
        let op = self.rounds.start(
            req,
            |a| {
                a.keys.clear();
                a.keys.push(resource);
                a.token = None;
                a.ttl_ms = 0;
                a.value = NAMED_WAITERS as u64;
                a.line = None;
                a.leave = None;
            },
            timeout,
            now,
            |_| true,
            Some(id.owner()),
        );
        // No reply can have come yet: the table of answers starts empty (the slot may
        // hold an older round's).
        let n = self.rounds.n();
        let o = self.rounds.op_mut(op);
        o.views.clear();
        o.views.resize(n, None);
        let t = &mut self.tasks[id.slot as usize];
        t.t1 = now;
        t.op = Some(op);
        t.phase = Phase::OnLock;
        id
    }

    /// Operator's round `op` of task `id` is decided (every master answered, failed or
    /// timed out): hand out what each did.
    pub(super) fn conclude_admin(&mut self, id: TaskId, op: OpId, now: Instant) {
        let t = &self.tasks[id.slot as usize];
        let (kind, t1) = (t.kind, t.t1);
        let resource = t.keys.iter().next().unwrap_or_default();
        let o = self.rounds.op(op);
        let quorum = self.rounds.quorum();
        let names = self.rounds.masters.iter().map(|m| m.name.clone());
        let answers = names.zip(o.tally.outcomes().iter().copied()).enumerate();
        let done = if kind == Kind::Inspect {
            let masters = answers
                .map(|(i, (name, outcome))| {
                    Inspection::master(name, outcome, o.views.get(i).and_then(Option::as_ref))
                })
                .collect();
            let elapsed = o.decided_at.saturating_duration_since(t1);
            Done::Inspected(Inspection::new(resource, quorum, masters, elapsed))
        } else {
            let mut forced = ForcedRelease::new(resource, quorum);
            for (i, (name, outcome)) in answers {
                forced.push(name, outcome, o.views.get(i).and_then(Option::as_ref));
            }
            Done::ForceReleased(forced)
        };
        self.rounds.finish(op);
        self.tasks[id.slot as usize].op = None;
        self.finish(id, Ok(done), now);
    }
}
