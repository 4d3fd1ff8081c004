//! The public API: [`Redlock`], its [`Builder`], and [`Lock`].

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::engine::{Engine, KeyList, NetConfig, Node, OpId};
use crate::error::{Error, Operation, Report};
use crate::rules::{self, AcquireVerdict, Decision, Outcome, Request};
use crate::scripts;
use crate::token::{Token, TokenSource};
use crate::url::MasterSpec;

/// Longest resource name accepted, in bytes.
pub const MAX_RESOURCE_LEN: usize = 4096;
/// Longest TTL accepted: 2^31 - 1 ms (about 24.8 days), like most timer APIs.
pub const MAX_TTL: Duration = Duration::from_millis((1 << 31) - 1);

/// A held lock. Release it with [`Redlock::release`]; dropping it releases nothing (the
/// keys then expire after the TTL).
#[must_use = "a lock that is dropped stays held on the masters until its TTL runs out"]
#[derive(Clone)]
pub struct Lock {
    pub(crate) keys: KeyList,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) fence: Option<u64>,
}

impl Lock {
    /// The (first) resource name.
    pub fn resource(&self) -> &[u8] {
        self.keys.iter().next().unwrap_or(&[])
    }
    /// The resource name as text, if it is UTF-8.
    pub fn resource_str(&self) -> Option<&str> {
        std::str::from_utf8(self.resource()).ok()
    }
    /// Every resource of a multi-resource lock (one for a plain lock).
    pub fn resources(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.keys.iter()
    }
    /// The random token stored as the keys' value.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// The TTL the lock was last set (or extended) with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
    /// When the acquiring round started, on the monotonic clock.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }
    /// Until when the lock can be trusted, on the monotonic clock:
    /// round start + TTL - drift allowance.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
    /// Validity left now (zero once it ran out).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
    /// `true` while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
    /// `true` when less than `margin` of validity is left: time to [`Redlock::extend`].
    /// The building block for a hand-written keep-alive loop.
    pub fn should_extend(&self, margin: Duration) -> bool {
        self.remaining() < margin
    }
    /// The fencing token, when the client was built with [`Builder::fencing`]: strictly
    /// greater than the token of every earlier holder of any of this lock's resources,
    /// under the conditions of mutual exclusion plus masters that keep their data (see
    /// [`Builder::fencing`]). Send it with every write to the protected resource, which
    /// should refuse a token lower than the highest it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: SmallVec<[String; 2]> = self
            .keys
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        f.debug_struct("Lock")
            .field("resources", &names)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .field("fence", &self.fence)
            .finish()
    }
}

/// Cancels the lock attempt running on the client it came from, from any thread.
///
/// A cancel that arrives while no attempt runs cancels the next one.
#[derive(Clone)]
pub struct CancelHandle {
    flag: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
}

impl CancelHandle {
    /// End the current attempt promptly with [`Error::Cancelled`]; partial locks are
    /// released.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

impl fmt::Debug for CancelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CancelHandle")
    }
}

/// Configures and builds a [`Redlock`].
#[derive(Clone)]
pub struct Builder {
    masters: Vec<String>,
    retry_count: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    drift_factor: f64,
    node_timeout: Option<Duration>,
    connect_timeout: Duration,
    stall_timeout: Duration,
    min_validity: Duration,
    busy_poll: bool,
    seed: Option<u64>,
    fencing: bool,
    assume_durable: bool,
    amnesia_guard: Option<Duration>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            masters: Vec::new(),
            retry_count: 10,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(100),
            drift_factor: 0.01,
            node_timeout: None,
            connect_timeout: Duration::from_secs(1),
            stall_timeout: Duration::from_secs(2),
            min_validity: Duration::ZERO,
            busy_poll: false,
            seed: None,
            fencing: false,
            assume_durable: false,
            amnesia_guard: None,
        }
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masters: Vec<String> = self
            .masters
            .iter()
            .map(|m| MasterSpec::parse(m).map_or_else(|_| "<invalid>".into(), |s| s.to_string()))
            .collect();
        f.debug_struct("Builder")
            .field("masters", &masters)
            .field("retry_count", &self.retry_count)
            .field("retry_delay", &self.retry_delay)
            .field("retry_jitter", &self.retry_jitter)
            .field("drift_factor", &self.drift_factor)
            .field("node_timeout", &self.node_timeout)
            .field("min_validity", &self.min_validity)
            .field("busy_poll", &self.busy_poll)
            .field("fencing", &self.fencing)
            .field("amnesia_guard", &self.amnesia_guard)
            .finish()
    }
}

impl Builder {
    /// Add masters (`redis://[user:password@]host:port[/db]` or `host:port`).
    pub fn masters<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.masters
            .extend(urls.into_iter().map(|u| u.as_ref().to_string()));
        self
    }
    /// Retries after the first attempt in [`Redlock::lock`] (default 10).
    pub fn retry_count(mut self, n: u32) -> Self {
        self.retry_count = n;
        self
    }
    /// Base delay between attempts (default 200 ms).
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }
    /// The delay is uniform in `[delay - jitter, delay + jitter]` (default 100 ms).
    pub fn retry_jitter(mut self, d: Duration) -> Self {
        self.retry_jitter = d;
        self
    }
    /// Clock drift allowance as a fraction of the TTL (default 0.01; 2 ms are added).
    pub fn drift_factor(mut self, f: f64) -> Self {
        self.drift_factor = f;
        self
    }
    /// How long a round waits for the masters' answers. All masters are asked at once, so
    /// this is the per-master and the per-round timeout. Default: TTL / 100, clamped to
    /// 10..=50 ms (50 ms for a 10 s TTL).
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = Some(d);
        self
    }
    /// How long a TCP connect may take (default 1 s). Rounds do not wait for it beyond
    /// their own timeout.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    /// A connection with requests outstanding and no byte received for this long is
    /// closed and reconnected (default 2 s).
    pub fn stall_timeout(mut self, d: Duration) -> Self {
        self.stall_timeout = d;
        self
    }
    /// A lock is granted only if more validity than this is left (default 0).
    pub fn min_validity(mut self, d: Duration) -> Self {
        self.min_validity = d;
        self
    }
    /// Poll without sleeping in the kernel: lower latency for a whole core (default off).
    pub fn busy_poll(mut self, on: bool) -> Self {
        self.busy_poll = on;
        self
    }
    /// Fencing tokens (default off): [`Lock::fencing_token`] then strictly increases from
    /// one holder of a resource to the next, for as long as the masters keep their data.
    ///
    /// How: once the lock is held, a second round draws the token (1 + the largest counter
    /// of the lock's resources on a quorum, only where our key still holds our token), and
    /// a third writes it back (each counter raised to at least the token on a quorum, again
    /// only while our key is held) before the lock is returned. Counters are the keys
    /// `redlock-mux:fence:<resource>`, one per fenced resource on every master, kept
    /// forever (no TTL: no wait could restore a lost counter); lock names starting with
    /// `redlock-mux:fence:` are refused. A multi-resource lock's token exceeds every
    /// earlier token of each of its resources.
    ///
    /// Fencing needs masters that persist every write (`appendonly yes` and `appendfsync
    /// always`): the client reads `CONFIG GET append*` at every connect, and a master that
    /// does not persist (or refuses `CONFIG`) gets no vote (reported as
    /// [`Fault::NotDurable`](crate::Fault::NotDurable)); see
    /// [`Builder::fencing_assume_durable`]. Cost: two more round trips per acquire.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }
    /// Skip fencing's durability check (default off): for masters that do persist every
    /// write but refuse `CONFIG GET` (some managed services). Your promise, not checked: a
    /// master that loses its counters in a restart can make tokens go backwards.
    pub fn fencing_assume_durable(mut self, on: bool) -> Self {
        self.assume_durable = on;
        self
    }
    /// The amnesia guard (enforced delayed restart), with `max_ttl` the largest TTL in
    /// use (default off). At every connect the client reads the master's
    /// `uptime_in_seconds` (`INFO server`); a master up for less than `max_ttl` may have
    /// restarted without persistence and forgotten locks that are still held, so its yes
    /// votes do not count toward any quorum until it has been up for `max_ttl`. Cost: a
    /// freshly started cluster grants no lock for `max_ttl`; TTLs above `max_ttl` are
    /// refused.
    pub fn amnesia_guard(mut self, max_ttl: Duration) -> Self {
        self.amnesia_guard = Some(max_ttl);
        self
    }
    /// Seed the retry-jitter generator (tests). Tokens always come from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Check the configuration and build the client. Connections are opened lazily, by the
    /// first operation.
    pub fn build(self) -> Result<Redlock, Error> {
        if self.masters.is_empty() {
            return Err(Error::Config("no masters given".into()));
        }
        if !(0.0..0.5).contains(&self.drift_factor) || self.drift_factor.is_nan() {
            return Err(Error::Config(format!(
                "drift factor {} must be in [0, 0.5)",
                self.drift_factor
            )));
        }
        let hour = Duration::from_secs(3600);
        if self.retry_delay > hour || self.retry_jitter > hour {
            return Err(Error::Config(format!(
                "retry delay {:?} and jitter {:?} must each be at most an hour",
                self.retry_delay, self.retry_jitter
            )));
        }
        // Every duration is bounded: a timer past the largest TTL means nothing, and
        // `Instant + Duration::MAX` would overflow.
        for (name, t, zero_ok) in [
            ("node timeout (node_timeout)", self.node_timeout, false),
            (
                "connect timeout (connect_timeout)",
                Some(self.connect_timeout),
                false,
            ),
            (
                "stall timeout (stall_timeout)",
                Some(self.stall_timeout),
                false,
            ),
            (
                "amnesia guard max_ttl (amnesia_guard)",
                self.amnesia_guard,
                false,
            ),
            (
                "minimum validity (min_validity)",
                Some(self.min_validity),
                true,
            ),
        ] {
            match t {
                Some(t) if t.is_zero() && !zero_ok => {
                    return Err(Error::Config(format!("{name} must be above zero")));
                }
                Some(t) if t > MAX_TTL => {
                    return Err(Error::Config(format!(
                        "{name} {t:?} is above the maximum {MAX_TTL:?} (the largest TTL)"
                    )));
                }
                _ => {}
            }
        }
        let now = Instant::now();
        let mut specs: Vec<(MasterSpec, std::net::SocketAddr)> = Vec::new();
        for url in &self.masters {
            let spec = MasterSpec::parse(url).map_err(Error::Config)?;
            let addr = spec.resolve().map_err(Error::Config)?;
            // Two databases of one server are one master: they fail and restart together.
            if let Some((dup, _)) = specs.iter().find(|(_, a)| *a == addr) {
                return Err(Error::Config(format!(
                    "master {spec} is given twice (as {dup}; both are the server {addr}): \
                     each master must be an independent server, or the quorum is meaningless"
                )));
            }
            specs.push((spec, addr));
        }
        let net = NetConfig {
            connect_timeout: self.connect_timeout,
            stall_timeout: self.stall_timeout,
            busy_poll: self.busy_poll,
            amnesia_guard: self.amnesia_guard,
            require_durable: self.fencing && !self.assume_durable,
            ..NetConfig::default()
        };
        let nodes = specs
            .into_iter()
            .map(|(s, addr)| {
                Node::new(
                    Arc::from(s.to_string()),
                    addr,
                    s.user,
                    s.password,
                    s.db,
                    net.limits,
                    now,
                )
            })
            .collect();
        let engine = Engine::new(nodes, net)?;
        let mut tokens = TokenSource::new()?;
        let seed = match self.seed {
            Some(s) => s,
            None => tokens.seed()?,
        };
        Ok(Redlock {
            cancel: CancelHandle {
                flag: Arc::new(AtomicBool::new(false)),
                waker: engine.waker(),
            },
            engine,
            tokens,
            rng: fastrand::Rng::with_seed(seed),
            cfg: self,
            scratch_keys: KeyList::default(),
            fence_keys: KeyList::default(),
            batch: Vec::with_capacity(64),
        })
    }
}

/// A Redlock client over N independent Redis masters.
///
/// One client owns one connection per master and one event loop, and its methods block
/// the calling thread (`&mut self`): use one client per thread. Every operation writes its
/// request to all masters at once, then reads the answers as they come.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_mux::Redlock;
///
/// let mut redlock = Redlock::new([
///     "redis://127.0.0.1:7000",
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
/// ])?;
/// let lock = redlock.lock("orders:42", Duration::from_secs(10))?;
/// // ... work while lock.is_valid() ...
/// redlock.release(lock)?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
pub struct Redlock {
    engine: Engine,
    tokens: TokenSource,
    rng: fastrand::Rng,
    cfg: Builder,
    cancel: CancelHandle,
    scratch_keys: KeyList,
    fence_keys: KeyList,
    batch: Vec<(OpId, Token)>,
}

/// The state of a decided acquire, handed to `Redlock::conclude`.
struct Concluded<'k> {
    id: OpId,
    failed_op: OpId,
    keys: &'k KeyList,
    token: Token,
    ttl: Duration,
    t1: Instant,
    decided_at: Instant,
    verdict: AcquireVerdict,
    cancelled: bool,
    fence: Option<u64>,
    attempts: u32,
    deadline: Option<Instant>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("masters", &self.masters().collect::<Vec<_>>())
            .field("quorum", &self.quorum())
            .finish()
    }
}

impl Redlock {
    /// A client with default settings over these masters.
    pub fn new<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder::default().masters(urls).build()
    }

    /// Start configuring a client.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The masters, as `host:port[/db]`.
    pub fn masters(&self) -> impl Iterator<Item = &str> + '_ {
        self.engine.nodes.iter().map(|n| &*n.name)
    }

    /// OK answers needed: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.engine.quorum()
    }

    /// A handle that cancels this client's current lock attempt from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// The round timeout used for a TTL.
    pub fn round_timeout(&self, ttl: Duration) -> Duration {
        let t = self.cfg.node_timeout.unwrap_or_else(|| {
            (ttl / 100).clamp(Duration::from_millis(10), Duration::from_millis(50))
        });
        // A round that outlives the TTL minus drift can never yield validity.
        t.min(ttl.saturating_sub(rules::drift(ttl, self.cfg.drift_factor)))
            .max(Duration::from_millis(1))
    }

    /// One attempt to take `resource` for `ttl`: write `SET resource token NX PX ttl` to
    /// every master, decide as soon as a quorum said OK (or can no longer), and on failure
    /// release wherever the key may have been set.
    pub fn try_lock(&mut self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.with_key(resource.as_ref(), |this, keys| {
            let ttl = this.check_call(keys, ttl)?;
            this.attempt(keys, ttl, 1, None)
        })
    }

    /// Run `f` with `resource` as a one-key list, in reused storage (no allocation).
    fn with_key<T>(&mut self, resource: &[u8], f: impl FnOnce(&mut Self, &KeyList) -> T) -> T {
        let mut keys = std::mem::take(&mut self.scratch_keys);
        keys.clear();
        keys.push(resource);
        let r = f(self, &keys);
        self.scratch_keys = keys;
        r
    }

    /// The checks every lock call makes first: resources, TTL, a pending cancel. Returns
    /// the TTL in whole milliseconds.
    fn check_call(&self, keys: &KeyList, ttl: Duration) -> Result<Duration, Error> {
        if keys.len() == 0 {
            return Err(Error::InvalidArgument("no resource given".into()));
        }
        check_resources(keys.iter())?;
        let ttl = self.check_ttl(ttl)?;
        self.take_cancel()?;
        Ok(ttl)
    }

    /// Take `resource` for `ttl`, retrying after a random delay while it is taken or no
    /// quorum answers, up to the configured retry count.
    pub fn lock(&mut self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.lock_until(resource, ttl, None)
    }

    /// Like [`Redlock::lock`], but never past `deadline`: the retry loop does not sleep
    /// beyond it and a round does not outlive it.
    pub fn lock_with_deadline(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        self.lock_until(resource, ttl, Some(deadline))
    }

    fn lock_until(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Lock, Error> {
        self.with_key(resource.as_ref(), |this, keys| {
            this.lock_keys(keys, ttl, deadline)
        })
    }

    /// Take several resources as one lock: on each master all keys are set only if none
    /// exists (one script), and the lock needs a quorum of masters where that worked.
    pub fn lock_many<I, R>(&mut self, resources: I, ttl: Duration) -> Result<Lock, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<[u8]>,
    {
        let mut keys = KeyList::default();
        for r in resources {
            keys.push(r.as_ref());
        }
        let mut sorted: Vec<&[u8]> = keys.iter().collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::InvalidArgument(
                "the same resource is listed twice".into(),
            ));
        }
        self.lock_keys(&keys, ttl, None)
    }

    fn lock_keys(
        &mut self,
        keys: &KeyList,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Lock, Error> {
        let ttl = self.check_call(keys, ttl)?;
        let mut attempt = 1u32;
        let mut last: Option<Box<Report>> = None;
        loop {
            let err = match self.attempt(keys, ttl, attempt, deadline) {
                Ok(lock) => return Ok(lock),
                Err(e @ (Error::Taken(_) | Error::NoQuorum(_) | Error::ValidityUsedUp(_))) => e,
                // The deadline cut the round short: its report says nothing; the previous
                // attempt's does (e.g. "taken", not "timed out").
                Err(Error::DeadlineExceeded(None)) => return Err(Error::DeadlineExceeded(last)),
                Err(e) => return Err(e),
            };
            last = err.report().cloned().map(Box::new);
            if attempt > self.cfg.retry_count {
                return Err(err);
            }
            let delay =
                rules::retry_delay(self.cfg.retry_delay, self.cfg.retry_jitter, &mut self.rng);
            let wake = Instant::now() + delay;
            if let Some(d) = deadline {
                if wake >= d {
                    // Sleeping would pass the deadline: give up now rather than late.
                    return Err(Error::DeadlineExceeded(err.report().cloned().map(Box::new)));
                }
            }
            // Wait on the event loop, not in `sleep`: late replies are read meanwhile.
            let flag = &self.cancel.flag;
            self.engine
                .drive(Some(wake), |_| false, || flag.load(Ordering::Relaxed))?;
            self.take_cancel()?;
            attempt += 1;
        }
    }

    /// Check a TTL; returns it in whole milliseconds, as `PX` and `PEXPIRE` take it (the
    /// validity is computed from what the masters were sent, not from more).
    fn check_ttl(&self, ttl: Duration) -> Result<Duration, Error> {
        if ttl < Duration::from_millis(1) {
            return Err(Error::InvalidArgument(format!(
                "ttl {ttl:?} is below the 1 ms resolution of PX"
            )));
        }
        if ttl > MAX_TTL {
            return Err(Error::InvalidArgument(format!(
                "ttl {ttl:?} is above the maximum {MAX_TTL:?}"
            )));
        }
        if let Some(max) = self.cfg.amnesia_guard {
            if ttl > max {
                return Err(Error::InvalidArgument(format!(
                    "ttl {ttl:?} is above the amnesia guard's max_ttl {max:?}"
                )));
            }
        }
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        let drift = rules::drift(ttl, self.cfg.drift_factor);
        if ttl <= drift.saturating_add(self.cfg.min_validity) {
            return Err(Error::InvalidArgument(format!(
                "ttl {ttl:?} leaves no validity after the drift allowance {drift:?} \
                 and minimum validity {:?}",
                self.cfg.min_validity
            )));
        }
        Ok(ttl)
    }

    fn take_cancel(&self) -> Result<(), Error> {
        if self.cancel.flag.swap(false, Ordering::SeqCst) {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    fn report(&self, op: Operation, id: OpId, started: Instant, attempts: u32) -> Box<Report> {
        let o = self.engine.op(id);
        Box::new(Report::new(
            op,
            self.engine.nodes.iter().map(|n| n.name.clone()),
            &o.tally,
            o.decided_at.saturating_duration_since(started),
            attempts,
        ))
    }

    /// Run one round of `req` for `keys` and wait for its decision (or the deadline, or a
    /// cancel). Returns the op (to be `finish`ed by the caller) and when it started.
    fn round(
        &mut self,
        req: Request,
        keys: &KeyList,
        token: Token,
        ttl: Duration,
        value: u64,
        deadline: Option<Instant>,
    ) -> Result<(OpId, Instant), Error> {
        self.engine.catch_up()?;
        let t1 = Instant::now();
        let mut timeout = self.round_timeout(ttl);
        if let Some(d) = deadline {
            timeout = timeout.min(d.saturating_duration_since(t1));
        }
        let ttl_ms = ttl.as_millis() as u64;
        let id = self.engine.start(
            req,
            |a| {
                a.set(keys.iter(), token, ttl_ms);
                a.value = value;
            },
            timeout,
            t1,
            |_| true,
            false,
        );
        self.engine.flush();
        // Only lock attempts are cancellable: a release or an extend always runs to its
        // decision (or its timeout), whatever the cancel flag says.
        let cancellable = matches!(req, Request::Acquire | Request::AcquireMany);
        let flag = &self.cancel.flag;
        let engine = &mut self.engine;
        let decided = engine.drive(
            None,
            |e| e.op(id).is_decided(),
            || cancellable && flag.load(Ordering::Relaxed),
        );
        if let Err(e) = decided {
            self.engine.finish(id);
            return Err(e.into());
        }
        Ok((id, t1))
    }

    fn attempt(
        &mut self,
        keys: &KeyList,
        ttl: Duration,
        attempts: u32,
        deadline: Option<Instant>,
    ) -> Result<Lock, Error> {
        if let Some(d) = deadline {
            if Instant::now() >= d {
                return Err(Error::DeadlineExceeded(None));
            }
        }
        let token = self.tokens.next()?;
        let req = if keys.len() == 1 {
            Request::Acquire
        } else {
            Request::AcquireMany
        };
        let (id, t1) = self.round(req, keys, token, ttl, 0, deadline)?;
        let op = self.engine.op(id);
        let mut c = Concluded {
            id,
            failed_op: id,
            keys,
            token,
            ttl,
            t1,
            decided_at: op.decided_at,
            verdict: rules::judge_acquire(
                &op.tally,
                ttl,
                op.decided_at.saturating_duration_since(t1),
                self.cfg.drift_factor,
                self.cfg.min_validity,
            ),
            cancelled: !op.is_decided(),
            fence: None,
            attempts,
            deadline,
        };
        if self.cfg.fencing && !c.cancelled && matches!(c.verdict, AcquireVerdict::Acquired(_)) {
            self.fence(&mut c)?;
        }
        let r = self.conclude(c);
        self.engine.flush();
        r
    }

    /// Fencing, once the lock is held: draw a token (1 + the largest counter of any of the
    /// lock's resources, over a quorum, while each master still holds our key), then write
    /// it back (every counter of the lock raised to at least the token on a quorum, still
    /// only while our key is held). A later holder's draw meets that quorum, after this
    /// lock ended, so its token is larger. Validity counts all three rounds. On failure
    /// `c` says why, and `conclude` releases the lock.
    fn fence(&mut self, c: &mut Concluded<'_>) -> Result<(), Error> {
        let mut fk = std::mem::take(&mut self.fence_keys);
        fk.assign(c.keys);
        let mut counter: SmallVec<[u8; 64]> = SmallVec::new();
        for k in c.keys.iter() {
            counter.clear();
            counter.extend_from_slice(scripts::FENCE_PREFIX);
            counter.extend_from_slice(k);
            fk.push(&counter);
        }
        let r = self.fence_rounds(c, &fk);
        self.fence_keys = fk;
        r
    }

    fn fence_rounds(&mut self, c: &mut Concluded<'_>, fk: &KeyList) -> Result<(), Error> {
        for req in [Request::FenceDraw, Request::FenceWriteBack] {
            let value = c.fence.unwrap_or(0);
            let (rid, _) = self.round(req, fk, c.token, c.ttl, value, c.deadline)?;
            let op = self.engine.op(rid);
            c.decided_at = op.decided_at;
            if op.tally.decision() != Decision::Reached {
                c.verdict = AcquireVerdict::NoQuorum;
                c.failed_op = rid;
                return Ok(());
            }
            if req == Request::FenceDraw {
                // The largest answer so far: at least every answer of the deciding quorum.
                c.fence = Some(op.max_value.max(1) as u64);
            }
            self.engine.finish(rid);
        }
        c.verdict = match rules::validity(
            c.ttl,
            c.decided_at.saturating_duration_since(c.t1),
            self.cfg.drift_factor,
        ) {
            Some(v) if v > self.cfg.min_validity => AcquireVerdict::Acquired(v),
            _ => AcquireVerdict::ValidityUsedUp,
        };
        Ok(())
    }

    /// Turn a decided acquire into a lock, or into an error after queueing the cleanup
    /// release (the caller flushes).
    fn conclude(&mut self, c: Concluded<'_>) -> Result<Lock, Error> {
        let Concluded {
            id,
            failed_op,
            keys,
            token,
            ttl,
            t1,
            decided_at,
            verdict,
            cancelled,
            fence,
            attempts,
            deadline,
        } = c;
        if let (false, AcquireVerdict::Acquired(v)) = (cancelled, verdict) {
            let mut lock_keys = KeyList::default();
            lock_keys.assign(keys);
            let lock = Lock {
                keys: lock_keys,
                token,
                ttl,
                acquired_at: t1,
                valid_until: decided_at + v,
                fence,
            };
            self.engine.finish(id);
            return Ok(lock);
        }
        let report = self.report(Operation::Acquire, failed_op, t1, attempts);
        if failed_op != id {
            self.engine.finish(failed_op);
        }
        let op = self.engine.op(id);
        // Release wherever our request may have set the key (`rules::may_hold`): masters
        // that said OK, have not answered, lost the connection after it was sent...
        let may_hold: SmallVec<[bool; 8]> = op
            .tally
            .outcomes()
            .iter()
            .map(|o| rules::may_hold(op.req, *o))
            .collect();
        self.engine.finish(id);
        if may_hold.iter().any(|b| *b) {
            let now = Instant::now();
            let timeout = self.round_timeout(ttl);
            let ttl_ms = ttl.as_millis() as u64;
            self.engine.start(
                Request::Release,
                |a| a.set(keys.iter(), token, ttl_ms),
                timeout,
                now,
                |i| may_hold[i],
                true,
            );
        }
        if cancelled {
            self.cancel.flag.store(false, Ordering::SeqCst);
            return Err(Error::Cancelled);
        }
        if let Some(d) = deadline {
            if Instant::now() >= d {
                // A round whose timeout the deadline clipped reports masters as timed out
                // that may simply not have had time to answer: no report then.
                let clipped = d.saturating_duration_since(t1) < self.round_timeout(ttl);
                return Err(Error::DeadlineExceeded((!clipped).then_some(report)));
            }
        }
        Err(match verdict {
            AcquireVerdict::Acquired(_) | AcquireVerdict::ValidityUsedUp => {
                Error::ValidityUsedUp(report)
            }
            AcquireVerdict::Taken => Error::Taken(report),
            AcquireVerdict::NoQuorum => Error::NoQuorum(report),
        })
    }

    /// One attempt on each of many resources at once, pipelined: every master gets all
    /// `SET NX PX` requests in one write, and the replies are matched in order. Results
    /// go to `out` (cleared first) in the order of `resources`; failed attempts are
    /// released like [`Redlock::try_lock`]'s. Reuse `out` and no allocation happens once
    /// warm. With [`Builder::fencing`] the attempts run one after another.
    pub fn try_lock_batch<R: AsRef<[u8]>>(
        &mut self,
        resources: &[R],
        ttl: Duration,
        out: &mut Vec<Result<Lock, Error>>,
    ) -> Result<(), Error> {
        out.clear();
        check_resources(resources.iter().map(AsRef::as_ref))?;
        let ttl = self.check_ttl(ttl)?;
        self.take_cancel()?;
        if self.cfg.fencing {
            for r in resources {
                let r = self.try_lock(r, ttl);
                out.push(r);
            }
            return Ok(());
        }
        self.engine.catch_up()?;
        let t1 = Instant::now();
        let timeout = self.round_timeout(ttl);
        let ttl_ms = ttl.as_millis() as u64;
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        for r in resources {
            let token = self.tokens.next()?;
            let id = self.engine.start(
                Request::Acquire,
                |a| a.set([r.as_ref()], token, ttl_ms),
                timeout,
                t1,
                |_| true,
                false,
            );
            batch.push((id, token));
        }
        self.engine.flush();
        let flag = &self.cancel.flag;
        let driven = self.engine.drive(
            None,
            |e| batch.iter().all(|(id, _)| e.op(*id).is_decided()),
            || flag.load(Ordering::Relaxed),
        );
        let mut keys = std::mem::take(&mut self.scratch_keys);
        for (k, (id, token)) in batch.iter().enumerate() {
            let op = self.engine.op(*id);
            let cancelled = driven.is_err() || !op.is_decided();
            let verdict = rules::judge_acquire(
                &op.tally,
                ttl,
                op.decided_at.saturating_duration_since(t1),
                self.cfg.drift_factor,
                self.cfg.min_validity,
            );
            let decided_at = op.decided_at;
            keys.clear();
            keys.push(resources[k].as_ref());
            let r = self.conclude(Concluded {
                id: *id,
                failed_op: *id,
                keys: &keys,
                token: *token,
                ttl,
                t1,
                decided_at,
                verdict,
                cancelled,
                fence: None,
                attempts: 1,
                deadline: None,
            });
            out.push(r);
        }
        self.scratch_keys = keys;
        self.batch = batch;
        self.engine.flush();
        driven?;
        Ok(())
    }

    /// Release many locks at once, pipelined (one write per master for all of them).
    /// `out` gets one result per lock, in order.
    pub fn release_batch(
        &mut self,
        locks: impl IntoIterator<Item = Lock>,
        out: &mut Vec<Result<(), Error>>,
    ) -> Result<(), Error> {
        out.clear();
        self.engine.catch_up()?;
        let t1 = Instant::now();
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        for lock in locks {
            let timeout = self.round_timeout(lock.ttl);
            let ttl_ms = lock.ttl.as_millis() as u64;
            let id = self.engine.start(
                Request::Release,
                |a| a.set(lock.keys.iter(), lock.token, ttl_ms),
                timeout,
                t1,
                |_| true,
                false,
            );
            batch.push((id, lock.token));
        }
        self.engine.flush();
        let driven = self.engine.drive(
            None,
            |e| batch.iter().all(|(id, _)| e.op(*id).is_decided()),
            || false,
        );
        for (id, _) in batch.iter() {
            out.push(self.release_result(*id, t1));
        }
        self.batch = batch;
        driven?;
        Ok(())
    }

    fn release_result(&mut self, id: OpId, t1: Instant) -> Result<(), Error> {
        let op = self.engine.op(id);
        let result = if op.tally.decision() == Decision::Reached {
            Ok(())
        } else if op.tally.count(Outcome::NotHeld) > 0 {
            Err(Error::NotHeld(self.report(Operation::Release, id, t1, 1)))
        } else {
            Err(Error::NoQuorum(self.report(Operation::Release, id, t1, 1)))
        };
        self.engine.finish(id);
        result
    }

    /// Release the lock on every master at once (compare-and-delete: only keys that still
    /// hold this lock's token are deleted). `Ok` when a quorum confirmed.
    pub fn release(&mut self, lock: Lock) -> Result<(), Error> {
        let (id, t1) = self.round(Request::Release, &lock.keys, lock.token, lock.ttl, 0, None)?;
        self.release_result(id, t1)
    }

    /// Extend the lock to live at least `ttl` from now (compare-and-extend on every
    /// master: where a key still holds this lock's token, its expiry becomes `now + ttl`
    /// unless it already lives longer; an extend never shortens a lock). Succeeds when a
    /// quorum confirmed and validity is left, computed exactly like acquire; the lock's
    /// deadline then becomes the later of the old one and the new one. On failure the lock
    /// keeps its old deadline, which still holds: no master's key was cut short.
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let ttl = self.check_ttl(ttl)?;
        if !lock.is_valid() {
            return Err(Error::Expired);
        }
        let (id, t1) = self.round(Request::Extend, &lock.keys, lock.token, ttl, 0, None)?;
        let op = self.engine.op(id);
        let verdict = rules::judge_acquire(
            &op.tally,
            ttl,
            op.decided_at.saturating_duration_since(t1),
            self.cfg.drift_factor,
            self.cfg.min_validity,
        );
        let result = match verdict {
            AcquireVerdict::Acquired(v) => {
                // The script never shortens a key's life, so the old deadline still holds
                // when this extend asked for less.
                lock.valid_until = lock.valid_until.max(op.decided_at + v);
                lock.ttl = ttl;
                Ok(())
            }
            AcquireVerdict::ValidityUsedUp => Err(Error::ValidityUsedUp(self.report(
                Operation::Extend,
                id,
                t1,
                1,
            ))),
            _ if op.tally.count(Outcome::NotHeld) > 0 => {
                Err(Error::NotHeld(self.report(Operation::Extend, id, t1, 1)))
            }
            _ => Err(Error::NoQuorum(self.report(Operation::Extend, id, t1, 1))),
        };
        self.engine.finish(id);
        result
    }

    /// Per-master I/O counters (connects, writes, reads, NOSCRIPT retries).
    pub fn stats(&self) -> Vec<crate::engine::NodeStats> {
        self.engine.stats().collect()
    }
}

fn check_resources<'k>(keys: impl IntoIterator<Item = &'k [u8]>) -> Result<(), Error> {
    for k in keys {
        if k.is_empty() {
            return Err(Error::InvalidArgument("resource name is empty".into()));
        }
        if k.len() > MAX_RESOURCE_LEN {
            return Err(Error::InvalidArgument(format!(
                "resource name is {} bytes, above the maximum {MAX_RESOURCE_LEN}",
                k.len()
            )));
        }
        if k.starts_with(scripts::FENCE_PREFIX) {
            return Err(Error::InvalidArgument(format!(
                "resource names starting with {:?} are reserved for fencing counters",
                String::from_utf8_lossy(scripts::FENCE_PREFIX)
            )));
        }
    }
    Ok(())
}

impl Drop for Redlock {
    fn drop(&mut self) {
        // Push out queued releases (cleanup after a failed attempt) before closing.
        self.engine.flush();
    }
}
