//! [`Builder`]: the configuration of a client, checked once, for either front-end.

use std::fmt;
#[cfg(feature = "tls")]
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::{Core, Master, NetConfig, Rounds, Settings, WaitMode};
use crate::driver::{Driver, Peer, Target};
use crate::error::Error;
use crate::lock::MAX_TTL;
use crate::token::TokenSource;
use crate::url::{Endpoint, MasterSpec};

/// The blocking client's retry count when none is set (see [`Builder::retry_count`]).
const DEFAULT_RETRY_COUNT: u32 = 10;

/// Configures and builds a [`Redlock`](crate::Redlock) ([`Builder::build`]) or a
/// [`SharedRedlock`](crate::SharedRedlock) ([`Builder::build_shared`]).
#[derive(Clone)]
pub struct Builder {
    masters: Vec<String>,
    /// `None`: the default of each client (see [`Builder::retry_count`]).
    retry_count: Option<u32>,
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
    wait_mode: WaitMode,
    fairness: bool,
    #[cfg(feature = "tls")]
    tls_ca_file: Option<PathBuf>,
    #[cfg(feature = "tls")]
    tls_client_cert: Option<(PathBuf, PathBuf)>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            masters: Vec::new(),
            retry_count: None,
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
            wait_mode: WaitMode::Notify,
            fairness: false,
            #[cfg(feature = "tls")]
            tls_ca_file: None,
            #[cfg(feature = "tls")]
            tls_client_cert: None,
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
        let mut f = f.debug_struct("Builder");
        f.field("masters", &masters)
            .field("retry_count", &self.retry_count)
            .field("retry_delay", &self.retry_delay)
            .field("retry_jitter", &self.retry_jitter)
            .field("drift_factor", &self.drift_factor)
            .field("node_timeout", &self.node_timeout)
            .field("min_validity", &self.min_validity)
            .field("busy_poll", &self.busy_poll)
            .field("fencing", &self.fencing)
            .field("amnesia_guard", &self.amnesia_guard)
            .field("wait_mode", &self.wait_mode)
            .field("fairness", &self.fairness);
        #[cfg(feature = "tls")]
        f.field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert", &self.tls_client_cert);
        f.finish()
    }
}

impl Builder {
    /// Add masters, as URLs:
    ///
    /// * `redis://[user:password@]host[:port][/db]` (port 6379 by default), or `host:port`;
    /// * `rediss://...` for TLS (feature `tls`: see `Builder::tls_ca_file`);
    /// * `unix:///path/redis.sock` or `redis+unix:///path/redis.sock`, with `?db=N`,
    ///   `user=U`, `password=P` in the query string, for a Unix socket.
    ///
    /// User names and passwords may be %-escaped. `AUTH` and `SELECT` run on every
    /// (re)connect. A URL that does not parse, or one master given twice, is an
    /// [`Error::Config`] at [`Builder::build`].
    ///
    /// Host names are resolved at every connect, on a helper thread (never in `build()`,
    /// never blocking the loop); one that does not resolve makes its master down
    /// ([`Fault::Resolve`](crate::Fault::Resolve)), not the build fail. IP literals are
    /// never resolved.
    pub fn masters<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.masters
            .extend(urls.into_iter().map(|u| u.as_ref().to_string()));
        self
    }
    /// Retries after the first attempt of a waiting lock call without a deadline (`lock`,
    /// `lock_many`). These are the timed retries (one per retry delay, or at the holder's
    /// expiry when that comes first); with [`WaitMode::Notify`] the attempts made when a
    /// release is announced come on top (see [`Builder::wait_mode`]).
    ///
    /// Unset, each client has its own default, because they are bounded differently:
    ///
    /// * the blocking [`Redlock::lock`](crate::Redlock::lock) makes up to **10** retries
    ///   (about 2 s of waiting with the default delay, 200 ms ± 100 ms). A blocking call has
    ///   no other way to be bounded: nothing can drop it. For a bound in time, use
    ///   [`Redlock::lock_with_deadline`](crate::Redlock::lock_with_deadline), which retries
    ///   until its deadline whatever this count says;
    /// * the shared client's [`SharedRedlock::lock`](crate::SharedRedlock::lock) has **no**
    ///   count: it waits until it gets the lock, like `Mutex::lock`, and its caller bounds
    ///   the wait: by dropping the [`Pending`](crate::Pending) (`tokio::time::timeout`,
    ///   `select!`, an aborted task), or with `lock_with_deadline`.
    ///
    /// Set, the count bounds both clients. Whatever the count, a refusal that waiting
    /// cannot change (a wrong password, an ACL without the right to the keys, a
    /// certificate the client does not trust: [`Fault::is_configuration`](crate::Fault::is_configuration))
    /// on too many masters for a quorum ends the call at once with
    /// [`Error::Refused`](crate::Error::Refused).
    pub fn retry_count(mut self, n: u32) -> Self {
        self.retry_count = Some(n);
        self
    }

    /// The retries of the shared client's `lock` and `lock_many`: the count set, or none
    /// (`u32::MAX`: years of timed retries; the caller's drop or deadline ends it first).
    pub(crate) fn shared_lock_retries(&self) -> u32 {
        self.retry_count.unwrap_or(u32::MAX)
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
    /// Fencing tokens (default off): [`Lock::fencing_token`](crate::Lock::fencing_token) then strictly increases from
    /// one holder of a resource to the next, for as long as the masters keep their data.
    ///
    /// How: once the lock is held, a second round draws the token (1 + the largest counter
    /// of the lock's resources on a quorum, only where our key still holds our token), and
    /// a third writes it back (each counter raised to at least the token on a quorum, again
    /// only while our key is held) before the lock is returned. Counters are the keys
    /// `redlock-mux:{T}:fence:<resource>` (`T`: three characters that put the counter in
    /// the resource's cluster slot), one per fenced resource on every master, kept
    /// forever (no TTL: no wait could restore a lost counter); lock names starting with
    /// `redlock-mux:` are refused. A counter of the earlier layout
    /// (`redlock-mux:fence:<resource>`) is read too, and retired by the next write-back:
    /// tokens keep increasing across the upgrade. A multi-resource lock's token exceeds every
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
    /// How lock calls wait while the lock is held elsewhere (default
    /// [`WaitMode::Notify`]). Safety does not depend on it: a notice only makes a waiter try
    /// earlier (or later), and every grant comes from a quorum round judged as always.
    ///
    /// **Waits sized by the holder** (both modes): the acquire of a call that may wait is a
    /// script (`SET NX` first, so an uncontended lock costs one round as before) that
    /// answers, when the key is taken, how long the holder's key still lives and who holds
    /// it. The call never sleeps past the moment a quorum of those keys expires (plus 1 ms
    /// and up to a tenth of [`Builder::retry_jitter`]), whatever the retry delay: a holder
    /// that crashed is followed within its TTL.
    ///
    /// **Woken on release** ([`WaitMode::Notify`]): a refused call of one resource takes its
    /// place in the resource's *line* on each master (`redlock-mux:{<resource>}:queue`,
    /// beside its waiters' liveness, `redlock-mux:{<resource>}:alive`, both in the
    /// resource's cluster slot; a name with a `}` has them as
    /// `redlock-mux:{T}:queue:<resource>`, `T` three characters of its slot: see
    /// the crate's `scripts::aux_key`;
    /// ordered by the call's arrival on its client's clock, so every master orders it
    /// alike; a waiter stays in line while it keeps asking, and leaves with its release, or
    /// on every master when the call ends without the lock).
    /// The release script names the first live waiter in line and announces the release on
    /// that waiter's client's channel only (`redlock-mux:next:<client>`): one waiter is
    /// woken, not every client with a waiter. With nobody in line (several resources), it
    /// announces on
    /// `redlock-mux:released:<resource>` to every waiter, which tries once the
    /// announcements leave room for a quorum. The client listens on one more connection per
    /// master, in the same event loop, opened when a call first waits and closed 2 s after
    /// the last wait (a single-owner client closes it at its next call after that). A
    /// waiter of this same client is started right behind a release made by this client,
    /// in the same write to each master.
    ///
    /// A lost announcement (a connection cut, a master restarted, a key that expired:
    /// nobody announces an expiry) costs the waiter at most its timed retry; a refusal that
    /// came before its subscriptions were confirmed is followed by one more attempt at the
    /// confirmation. Without [`Builder::fairness`], a call that is not first in line still
    /// makes its timed retries, and a new call tries at once: it may come before the waiter
    /// a release named.
    ///
    /// The retry budget means the same in both modes: `retry_count` counts the timed
    /// attempts (one per retry delay), so a call waits about as long as it would while
    /// polling; attempts made on an announcement come on top.
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.wait_mode = mode;
        self
    }
    /// First come, first served across every client of the masters (default off; needs
    /// [`WaitMode::Notify`]).
    ///
    /// Every attempt of a waiting call is *polite*: it does not take a free resource while
    /// a live waiter stands ahead of it in the resource's line (see
    /// [`Builder::wait_mode`]); it takes its place in line instead. A new call therefore
    /// queues behind the waiters already there, a release wakes the first in line only,
    /// and the calls are granted in the order they arrived (the line orders them by their
    /// arrival on their clients' clocks, so clients with skewed clocks are ordered by those).
    /// Within one client, the waiters woken by its own releases are its oldest first.
    ///
    /// Why it cannot deadlock: the first live waiter in line is first on every master where
    /// it stands (every master orders the line alike), so politeness never refuses it, and
    /// each of its attempts puts it in line where it was missing; only the holder (or a
    /// client without fairness) can refuse it. A waiter that stops asking (crashed,
    /// cancelled, a stopped process) drops out of line when its waiter key expires (its
    /// retry delay plus jitter, two round timeouts and 100 ms), so it holds the others up
    /// at most that long. Multi-resource calls do not stand in line.
    ///
    /// Cost: a new call on a resource with waiters is refused once (it queues) even when
    /// the resource happens to be free; a release of a resource with a line costs the
    /// masters a few more script steps. Use it when waiters must not be starved (an
    /// inventory item, an order book); leave it off when throughput matters more than
    /// order: a client that just released may then take the lock again at once.
    pub fn fairness(mut self, on: bool) -> Self {
        self.fairness = on;
        self
    }
    /// TLS (`rediss://` masters): trust only the CA certificates in this PEM file, instead
    /// of the system's trust roots (default). Read at [`Builder::build`]; an unreadable or
    /// empty file is a `Config` error.
    #[cfg(feature = "tls")]
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls_ca_file = Some(path.as_ref().to_path_buf());
        self
    }
    /// TLS: present this client certificate (PEM, the chain leaf first) with its private
    /// key (PEM: PKCS#8, PKCS#1 or SEC1), for masters that require one
    /// (`tls-auth-clients yes`). Read at [`Builder::build`].
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.tls_client_cert = Some((cert.as_ref().to_path_buf(), key.as_ref().to_path_buf()));
        self
    }
    /// Seed the retry-jitter generator (tests). Tokens always come from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Check the configuration; the core and its driver, for either front-end.
    pub(crate) fn parts_with_driver(self) -> Result<(Core, Driver), Error> {
        let now = Instant::now();
        let (rounds, settings, peers) = self.parts(now)?;
        let driver = Driver::new(peers, self.busy_poll, now)?;
        let wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let core = Core::new(
            rounds,
            settings,
            TokenSource::new()?,
            self.seed,
            now,
            wall_us,
        )?;
        Ok((core, driver))
    }

    /// The core alone, for the deterministic simulation and the fuzz targets: its clock
    /// starts at `now` (with the wall clock at `wall_us` µs since the epoch), its tokens
    /// and jitter come from `seed` (guessable: never for real locks), and nothing opens a
    /// socket; whoever holds it moves the bytes.
    #[doc(hidden)]
    pub fn build_core(self, now: Instant, wall_us: u64, seed: u64) -> Result<Core, Error> {
        let (rounds, settings, _) = self.parts(now)?;
        let tokens = TokenSource::seeded(seed);
        Ok(Core::new(
            rounds,
            settings,
            tokens,
            Some(seed),
            now,
            wall_us,
        )?)
    }

    /// Check the configuration; the rounds over the masters, the Redlock settings, and
    /// where the driver finds each master.
    fn parts(&self, now: Instant) -> Result<(Rounds, Settings, Vec<Peer>), Error> {
        if self.masters.is_empty() {
            return Err(Error::Config("no masters given".into()));
        }
        if !(0.0..0.5).contains(&self.drift_factor) || self.drift_factor.is_nan() {
            return Err(Error::Config(format!(
                "drift factor {} must be in [0, 0.5)",
                self.drift_factor
            )));
        }
        if self.fairness && self.wait_mode != WaitMode::Notify {
            return Err(Error::Config(
                "fairness needs wait_mode(WaitMode::Notify): a queue of waiters is served \
                 when a release is announced"
                    .into(),
            ));
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
        let mut specs: Vec<MasterSpec> = Vec::new();
        for url in &self.masters {
            let spec = MasterSpec::parse(url).map_err(Error::Config)?;
            // Two databases of one server are one master: they fail and restart together.
            // Literal addresses, socket paths and host names as written are compared here;
            // names that resolve to one server are caught by the handshake's `run_id`.
            if let Some(dup) = specs.iter().find(|s| same_place(s, &spec)) {
                return Err(Error::Config(format!(
                    "master {spec} is given twice (as {dup}; both are the server {}): \
                     each master must be an independent server, or the quorum is meaningless",
                    spec.endpoint
                )));
            }
            specs.push(spec);
        }
        let tls = self.tls_setup(&specs)?;
        let net = NetConfig {
            connect_timeout: self.connect_timeout,
            stall_timeout: self.stall_timeout,
            busy_poll: self.busy_poll,
            amnesia_guard: self.amnesia_guard,
            require_durable: self.fencing && !self.assume_durable,
            ..NetConfig::default()
        };
        let mut masters = Vec::with_capacity(specs.len());
        let mut ends = Vec::with_capacity(specs.len());
        for s in specs {
            let target = match (&s.endpoint, s.literal_addr()) {
                (_, Some(addr)) => Target::Addr(addr),
                (Endpoint::Tcp { host, port }, None) => Target::Host {
                    host: Arc::from(host.as_str()),
                    port: *port,
                },
                (Endpoint::Unix(path), None) => Target::Unix(path.clone()),
            };
            let mut master = Master::new(
                Arc::from(s.to_string()),
                s.user.clone(),
                s.password.clone(),
                s.db,
            );
            if let (true, Endpoint::Tcp { host, .. }) = (s.cluster, &s.endpoint) {
                // The other seeds, where given as IP addresses (a host name among them is
                // left out: the first seed and the shards of the last map are tried too).
                let seeds = s
                    .seeds
                    .iter()
                    .filter_map(|e| match e {
                        Endpoint::Tcp { host, port } => host
                            .parse::<std::net::IpAddr>()
                            .ok()
                            .map(|ip| std::net::SocketAddr::new(ip, *port)),
                        Endpoint::Unix(_) => None,
                    })
                    .collect();
                master = master.into_cluster(host.clone(), s.tls, seeds);
            }
            masters.push(master);
            #[allow(unused_mut)]
            let mut end = Peer::new(target);
            #[cfg(feature = "tls")]
            if let (true, Some(config), Endpoint::Tcp { host, .. }) = (s.tls, &tls, &s.endpoint) {
                let target = crate::driver::TlsTarget::new(config.clone(), host)
                    .map_err(|e| Error::Config(format!("master {s}: {e}")))?;
                end.tls = Some(target);
            }
            ends.push(end);
        }
        let _ = &tls;
        let rounds = Rounds::new(masters, net, now);
        let settings = Settings {
            retry_count: self.retry_count.unwrap_or(DEFAULT_RETRY_COUNT),
            retry_delay: self.retry_delay,
            retry_jitter: self.retry_jitter,
            drift_factor: self.drift_factor,
            node_timeout: self.node_timeout,
            min_validity: self.min_validity,
            fencing: self.fencing,
            amnesia_guard: self.amnesia_guard,
            wait_mode: self.wait_mode,
            fairness: self.fairness,
        };
        Ok((rounds, settings, ends))
    }

    /// The TLS configuration the `rediss://` masters share, if any master is one. Without
    /// the `tls` feature a `rediss://` master is a `Config` error; with it, TLS options
    /// given for no `rediss://` master are one too (a `redis://` typo would send the
    /// password in clear).
    #[cfg(not(feature = "tls"))]
    fn tls_setup(&self, specs: &[MasterSpec]) -> Result<Option<()>, Error> {
        match specs.iter().find(|s| s.tls) {
            Some(s) => Err(Error::Config(format!(
                "master {s} is rediss:// (TLS): build redlock-mux with the `tls` feature"
            ))),
            None => Ok(None),
        }
    }

    #[cfg(feature = "tls")]
    fn tls_setup(&self, specs: &[MasterSpec]) -> Result<Option<Arc<rustls::ClientConfig>>, Error> {
        if !specs.iter().any(|s| s.tls) {
            if self.tls_ca_file.is_some() || self.tls_client_cert.is_some() {
                return Err(Error::Config(
                    "TLS options (tls_ca_file, tls_client_cert) are set but no master is \
                     rediss://"
                        .into(),
                ));
            }
            return Ok(None);
        }
        let cert = self
            .tls_client_cert
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()));
        crate::driver::client_config(self.tls_ca_file.as_deref(), cert)
            .map(Some)
            .map_err(Error::Config)
    }
}

/// One server written twice: the same IP literal and port, the same socket path, or the
/// same host name (any case) and port.
fn same_place(a: &MasterSpec, b: &MasterSpec) -> bool {
    match (&a.endpoint, &b.endpoint) {
        (Endpoint::Tcp { host: ha, port: pa }, Endpoint::Tcp { host: hb, port: pb }) => {
            match (a.literal_addr(), b.literal_addr()) {
                (Some(x), Some(y)) => x == y,
                (None, None) => pa == pb && ha.eq_ignore_ascii_case(hb),
                _ => false,
            }
        }
        (Endpoint::Unix(x), Endpoint::Unix(y)) => {
            x == y || matches!((x.canonicalize(), y.canonicalize()), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
}
