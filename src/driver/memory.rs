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

    /// [`LoopIo::flush`] when some link may have bytes to write.
    #[inline(never)]
    fn flush_wanted(&mut self, core: &mut Core, now: Instant) {
        let (script, input, ready) = (&mut self.script, &mut self.input, &mut self.ready);
        core.flush_with(now, |l, bytes| {
            answer(script, input, ready, l, bytes);
            Ok(bytes.len())
        });
        self.apply_actions(core, now);
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

    /// As [`Driver::flush`](super::Driver::flush): a test here, the flush out of line.
    #[inline(always)]
    fn flush(&mut self, core: &mut Core, now: Instant) {
        let (lock, sub) = core.flush_wanted();
        if lock || sub {
            self.flush_wanted(core, now);
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

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use crate::resp::{self, Frame, Limits, Status};
    use crate::{scripts, Builder};

    /// What a master answers: the handshake, `+OK` to a `SET`, `:1` to a release.
    fn answer(mut written: &[u8], master: usize, out: &mut Vec<u8>) -> Vec<String> {
        let mut asked = Vec::new();
        while let Ok(Status::Complete((Frame::Aggregate(a), used))) =
            resp::parse(written, &Limits::default())
        {
            let args: Vec<&[u8]> = a
                .iter()
                .map(|f| match f {
                    Frame::Bulk(b) => b,
                    _ => &[][..],
                })
                .collect();
            written = &written[used..];
            let name = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
            match name.as_str() {
                "SCRIPT" => {
                    let s = scripts::ALL.iter().find(|s| s.src.as_bytes() == args[2]);
                    out.extend_from_slice(format!("$40\r\n{}\r\n", s.unwrap().sha).as_bytes());
                }
                "INFO" => {
                    let text = format!("# Server\r\nrun_id:{master:040x}\r\n");
                    out.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
                }
                "SET" => out.extend_from_slice(b"+OK\r\n"),
                "EVALSHA"
                    if args[1] == scripts::RELEASE_LEAN.sha.as_bytes()
                        || args[1] == scripts::RELEASE.sha.as_bytes() =>
                {
                    out.extend_from_slice(b":1\r\n");
                }
                other => panic!("master {master} was asked {other}"),
            }
            asked.push(name);
        }
        assert!(written.is_empty());
        asked
    }

    /// The shared client's loop over scripted masters: after the handshakes (which go
    /// with the first `SET`), every cycle is one `SET` and one release per master, one
    /// write each.
    #[test]
    fn the_shared_loop_runs_over_masters_in_memory() {
        let urls: Vec<String> = (0..3)
            .map(|i| format!("redis://127.0.0.1:{}", 7000 + i))
            .collect();
        // What each write asked, by link.
        let asked = Arc::new(Mutex::new(Vec::<(usize, Vec<String>)>::new()));
        let log = asked.clone();
        let now = Instant::now();
        let rt = Duration::from_micros(50);
        let client = Builder::default()
            .masters(&urls)
            .build_shared_in_memory(now, 0, 7, rt, move |link, written, out| {
                let names = answer(written, link % 3, out);
                log.lock().unwrap().push((link, names));
            })
            .unwrap();
        for _ in 0..3 {
            let lock = client.try_lock(b"k", Duration::from_secs(10)).unwrap();
            client.release(lock).unwrap();
        }
        let asked = asked.lock().unwrap();
        // The handshakes went with the first SET; then one write per master per round.
        let rounds: Vec<_> = asked.iter().filter(|(l, _)| *l < 3).collect();
        assert_eq!(rounds.len(), 3 * 6, "{asked:?}");
        for (l, names) in &rounds[3..] {
            assert!(names == &["EVALSHA"] || names == &["SET"], "{l}: {names:?}");
        }
    }
}
