//! The shared client's loop over masters scripted in memory: no socket, no poll, no clock
//! read, so that the instructions the loop's code costs per cycle can be counted exactly
//! (`examples/shared_loop_cycles.rs`, the `shared_cycle` budget of `.ci/budget.sh`).
//!
//! It moves bytes as the [`Driver`](super::Driver) does, with the kernel's part played by
//! memory: every write is taken whole and handed to the [`Script`], which appends the
//! master's answers to the link's input; [`LoopIo::wait`] moves the clock on by one round
//! trip and reads every link's input into the core. A connect succeeds at once.

use std::io;
use std::time::{Duration, Instant};

use super::LoopIo;
use crate::core::{Action, Core, LinkId};
use crate::stats::MasterStats;

/// The masters: `script(link, written, answers)` appends to `answers` what the master of
/// `link` (`0..n` lock links, `n..2n` sub links) answers to the bytes `written` to it.
pub(crate) trait Script: FnMut(usize, &[u8], &mut Vec<u8>) + Send + 'static {}

impl<S: FnMut(usize, &[u8], &mut Vec<u8>) + Send + 'static> Script for S {}

/// Masters in memory, answering as `S` says, one `round_trip` after the write.
pub(crate) struct InMemory<S> {
    script: S,
    /// The clock: moved on only by [`LoopIo::wait`].
    now: Instant,
    round_trip: Duration,
    /// What each link's master answered and the core has not read yet.
    input: Vec<Vec<u8>>,
    /// The links whose master answered since they were read last, one bit each (the
    /// readiness events of a poll).
    ready: Vec<u64>,
}

impl<S: Script> InMemory<S> {
    pub(crate) fn new(links: usize, script: S, now: Instant, round_trip: Duration) -> Self {
        InMemory {
            script,
            now,
            round_trip,
            input: (0..links).map(|_| Vec::with_capacity(256)).collect(),
            ready: vec![0; links.div_ceil(64)],
        }
    }

    /// Write what link `l` may write (all of it: memory never blocks).
    fn write_link(&mut self, core: &mut Core, l: LinkId, now: Instant) {
        let (script, input, ready) = (&mut self.script, &mut self.input, &mut self.ready);
        core.write_with(l, now, |l, bytes| {
            answer(script, input, ready, l, bytes);
            Ok(bytes.len())
        });
    }
}

/// Hand `bytes` written to link `l` to the script; the link is read at the next wait.
#[inline(always)]
fn answer<S: Script>(
    script: &mut S,
    input: &mut [Vec<u8>],
    ready: &mut [u64],
    l: LinkId,
    bytes: &[u8],
) {
    script(l.0, bytes, &mut input[l.0]);
    ready[l.0 / 64] |= 1 << (l.0 % 64);
}

/// The waker of a loop that never blocks in [`LoopIo::wait`]: it does nothing.
pub(crate) struct NoWaker;

impl<S: Script> LoopIo for InMemory<S> {
    type Waker = NoWaker;

    fn waker(&self) -> NoWaker {
        NoWaker
    }

    fn wake(_: &NoWaker) {}

    fn catch_up(&mut self, _core: &mut Core) -> io::Result<Instant> {
        Ok(self.now)
    }

    #[inline]
    fn apply_actions(&mut self, core: &mut Core, now: Instant) {
        while let Some(a) = core.take_action() {
            match a {
                Action::Connect(l) => {
                    core.handle_connected(l);
                    self.write_link(core, l, now);
                }
                // What the master answered on the closed connection is not read.
                Action::Close { link, .. } => self.input[link.0].clear(),
            }
        }
    }

    #[inline]
    fn flush(&mut self, core: &mut Core, now: Instant) {
        let (lock, sub) = core.flush_wanted();
        if lock || sub {
            let (script, input, ready) = (&mut self.script, &mut self.input, &mut self.ready);
            core.flush_with(now, |l, bytes| {
                answer(script, input, ready, l, bytes);
                Ok(bytes.len())
            });
            self.apply_actions(core, now);
        }
    }

    #[inline]
    fn next_wake(&self, core: &Core, until: Option<Instant>) -> Option<Instant> {
        if core.has_news() {
            return Some(self.now);
        }
        core.next_timer(until)
    }

    /// One round trip later (or at `wake`, when nothing was answered): read every link's
    /// answers, as the driver reads a readable socket, and write what they let out.
    fn wait(
        &mut self,
        core: &mut Core,
        now: Instant,
        wake: Option<Instant>,
    ) -> io::Result<Instant> {
        let answered = self.ready.iter().any(|&w| w != 0);
        self.now = match (answered, wake) {
            (true, _) => now + self.round_trip,
            (false, Some(w)) => w.max(now),
            (false, None) => {
                return Err(io::Error::other(
                    "nothing to wait for: no answer is coming and no timer is set",
                ))
            }
        };
        let now = self.now;
        for w in 0..self.ready.len() {
            // Links that get answers meanwhile (to what the reads let out) are read next
            // time.
            let mut bits = std::mem::take(&mut self.ready[w]);
            while bits != 0 {
                let l = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let input = &self.input[l];
                let mut from = 0;
                let kick = core.read_with(LinkId(l), now, |buf| {
                    let k = buf.len().min(input.len() - from);
                    buf[..k].copy_from_slice(&input[from..from + k]);
                    from += k;
                    Ok((k, from < input.len()))
                });
                self.input[l].clear();
                if kick {
                    self.write_link(core, LinkId(l), now);
                }
                self.apply_actions(core, now);
            }
        }
        Ok(now)
    }

    fn stats(&self, core: &Core) -> Vec<MasterStats> {
        core.stats()
    }
}
