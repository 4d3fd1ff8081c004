//! [`LockGuard`]: a lock held through the shared client, released when dropped; and the
//! state it shares with the loop (deadline, lost flag, who waits for a loss).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::pending::{Out, Pending};
use super::state::LockState;
use super::{Command, Inner};
use crate::error::Error;
use crate::keep::HoldOptions;
use crate::token::Token;

/// A lock held through the shared client ([`crate::SharedRedlock`]).
///
/// Dropping it releases the lock: the release is queued to the loop, and dropping never
/// blocks. [`LockGuard::release`] releases it and says how that went. Not `Clone`: one
/// guard, one release.
///
/// The lost-lock signal: [`LockGuard::is_lost`] (an atomic load and a clock read),
/// [`LockGuard::wait_lost`] (blocking) and [`LockGuard::lost`] (a future). A lock is lost
/// when its validity runs out (minus the [`HoldOptions::lost_at`] margin when it is
/// auto-extended), or when an extension finds it no longer held.
///
/// In async code: hold the lock while the work runs, extended from the client's loop, and
/// stop the work if the lock is lost:
///
/// ```
/// # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let local = redlock_mux::local::LocalMasters::start(3)?;
/// # let urls = local.urls();
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
/// # rt.block_on(async {
/// use std::time::Duration;
/// use redlock_mux::{HoldOptions, Redlock};
///
/// # async fn rebuild_the_index() {}
/// let redlock = Redlock::builder().masters(&urls).build_shared()?;
/// let guard = redlock.lock("index:rebuild", Duration::from_secs(10)).await?;
/// guard.auto_extend(HoldOptions::default()); // extended when a third of the TTL is left
/// tokio::select! {
///     _ = rebuild_the_index() => {}
///     _ = guard.lost() => {
///         // Lost (an extension found it taken, or no quorum until the margin): stop
///         // touching what the lock protects.
///     }
/// }
/// guard.release().await?; // or drop it: the release is queued and never blocks
/// # Ok::<(), redlock_mux::Error>(()) })?;
/// # Ok(()) }
/// # #[cfg(not(feature = "local"))] fn main() {}
/// ```
pub struct LockGuard {
    inner: Arc<Inner>,
    /// `None` only once handed to the loop (release, drop): the loop then holds the only
    /// reference and reuses the state for another lock.
    state: Option<Arc<LockState>>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self
            .st()
            .keys
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        f.debug_struct("LockGuard")
            .field("resources", &names)
            .field("token", &self.st().token)
            .field("remaining", &self.remaining())
            .field("fence", &self.st().fence)
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(inner: Arc<Inner>, state: Arc<LockState>) -> LockGuard {
        LockGuard {
            inner,
            state: Some(state),
        }
    }

    fn st(&self) -> &Arc<LockState> {
        match &self.state {
            Some(s) => s,
            None => unreachable!("a guard's state is only taken by release or drop"),
        }
    }

    /// The (first) resource name.
    pub fn resource(&self) -> &[u8] {
        self.st().keys.iter().next().unwrap_or(&[])
    }
    /// Every resource of a multi-resource lock (one for a plain lock).
    pub fn resources(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.st().keys.iter()
    }
    /// The random token stored as the keys' value.
    pub fn token(&self) -> &Token {
        &self.st().token
    }
    /// The fencing token, when the client was built with
    /// [`Builder::fencing`](crate::Builder::fencing) (see
    /// [`Lock::fencing_token`](crate::Lock::fencing_token)).
    pub fn fencing_token(&self) -> Option<u64> {
        self.st().fence
    }
    /// How many acquire attempts the lock call made to get this lock (see
    /// [`Lock::attempts`](crate::Lock::attempts)).
    pub fn attempts(&self) -> u32 {
        self.st().attempts
    }
    /// How long the lock call waited for this lock, from the call to the grant (see
    /// [`Lock::waited`](crate::Lock::waited)).
    pub fn waited(&self) -> Duration {
        self.st().waited
    }
    /// How many of the call's attempts were refused because the lock was held elsewhere
    /// (see [`Lock::refusals`](crate::Lock::refusals)).
    pub fn refusals(&self) -> u32 {
        self.st().refusals
    }
    /// Whether the attempt that got the lock was started by a release (see
    /// [`Lock::woken_by_release`](crate::Lock::woken_by_release)).
    pub fn woken_by_release(&self) -> bool {
        self.st().woken
    }
    /// When the acquiring round started, on the monotonic clock (see
    /// [`Lock::acquired_at`](crate::Lock::acquired_at)).
    pub fn acquired_at(&self) -> Instant {
        self.st().acquired_at
    }
    /// The TTL the lock was last set (or extended) with.
    pub fn ttl(&self) -> Duration {
        self.st().ttl()
    }
    /// Until when the lock can be trusted, on the monotonic clock (moved by extensions).
    pub fn valid_until(&self) -> Instant {
        self.st().valid_until()
    }
    /// Validity left now (zero once it ran out).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }
    /// `true` while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until()
    }

    /// `true` once the lock is lost: its validity ran out (less than the margin left when
    /// auto-extended), an extension found it no longer held, or (once watched: see
    /// [`LockGuard::lost`]) the masters' watch found fewer than a quorum that may still hold
    /// it. Stays true.
    pub fn is_lost(&self) -> bool {
        self.st().is_lost()
    }

    /// Block up to `timeout` for the lock to be lost; returns [`LockGuard::is_lost`]. An
    /// interruptible sleep for work done under the lock. Any timeout is fine
    /// (`Duration::MAX` waits until the loss).
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut w = self.st().watch();
        if !std::mem::replace(&mut w.timer, true) && !w.lost {
            // First wait: the loop watches the lock (its timers, and the masters).
            drop(w);
            self.inner.submit(Command::Watch(self.st().clone()));
            w = self.st().watch();
        }
        loop {
            if w.lost {
                return true;
            }
            let now = Instant::now();
            let stop = self.st().stop_at();
            if now >= stop {
                drop(w);
                self.st().mark_lost(None);
                return true;
            }
            let until = deadline.map_or(stop, |d| d.min(stop));
            if now >= until {
                return false;
            }
            w = self
                .st()
                .cv
                .wait_timeout(w, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A future that completes when the lock is lost (the loop's timers wake it when the
    /// validity runs out). For `select!` against the work done under the lock.
    ///
    /// From its first poll (or the first [`LockGuard::wait_lost`], or
    /// [`LockGuard::auto_extend`]) the masters watch the lock's keys: a quorum deleted by
    /// hand, overwritten or lost with restarted masters completes it within a round trip,
    /// not at the next extension (see docs/production.md, "Lost at once").
    pub fn lost(&self) -> Lost<'_> {
        Lost { guard: self }
    }

    /// Why the lock was lost, when an extension said (e.g. "not held"); `None` while it
    /// is not lost or when it simply ran out.
    pub fn lost_reason(&self) -> Option<String> {
        self.st().watch().why.clone()
    }

    /// Extend the lock to live at least `ttl` from now (as
    /// [`Redlock::extend`](crate::Redlock::extend): never shortens it). The guard's
    /// deadline moves when it succeeds.
    pub fn extend(&self, ttl: Duration) -> Pending<()> {
        let ttl = match self.inner.settings.check_ttl(ttl) {
            Ok(t) => t,
            Err(e) => return Pending::ready(self.inner.clone(), Err(e)),
        };
        let slot = self.inner.slots.take();
        self.inner.queue(Command::Extend {
            state: self.st().clone(),
            ttl,
            slot: slot.clone(),
        });
        Pending::new(self.inner.clone(), slot)
    }

    /// Keep the lock extended from the loop's timers (no thread per lock): extend when
    /// less than `opts.extend_at` of the TTL is left, retry extensions that get no quorum
    /// until less than `opts.lost_at` is left; the lock is lost then, or when an extension
    /// finds it no longer held. Extensions ask for the lock's current TTL.
    pub fn auto_extend(&self, opts: HoldOptions) {
        self.inner.submit(Command::KeepAlive {
            state: self.st().clone(),
            opts,
        });
    }

    /// Release the lock on every master and say how it went: `Ok` when a quorum
    /// confirmed, [`Error::NotHeld`] when the lock had already expired or been lost.
    pub fn release(mut self) -> Pending<()> {
        let slot = self.inner.slots.take();
        if let Some(state) = self.state.take() {
            self.inner.queue(Command::Release {
                state,
                slot: Some(slot.clone()),
            });
        }
        Pending::new(self.inner.clone(), slot)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            self.inner.submit(Command::Release { state, slot: None });
        }
    }
}

/// The future of [`LockGuard::lost`].
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct Lost<'g> {
    guard: &'g LockGuard,
}

impl Future for Lost<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let state = self.guard.st();
        if state.is_lost() {
            return Poll::Ready(());
        }
        let mut w = state.watch();
        if w.lost {
            return Poll::Ready(());
        }
        if !w.wakers.iter().any(|x| x.will_wake(cx.waker())) {
            w.wakers.push(cx.waker().clone());
        }
        let first = !std::mem::replace(&mut w.timer, true);
        drop(w);
        if first {
            // The loop wakes us when the lost instant passes.
            self.guard.inner.submit(Command::Watch(state.clone()));
        }
        Poll::Pending
    }
}

impl Pending<LockGuard> {
    /// Block the calling thread until the lock is granted or the attempt failed.
    pub fn wait(mut self) -> Result<LockGuard, Error> {
        let out = self.wait_out();
        self.guard(out)
    }

    fn guard(&self, out: Result<Out, Error>) -> Result<LockGuard, Error> {
        match out? {
            Out::Lock(state) => Ok(LockGuard::new(self.inner.clone(), state)),
            _ => unreachable!("a lock operation completes with a lock"),
        }
    }
}

impl Future for Pending<LockGuard> {
    type Output = Result<LockGuard, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.poll_out(cx) {
            Poll::Ready(out) => Poll::Ready(this.guard(out)),
            Poll::Pending => Poll::Pending,
        }
    }
}
