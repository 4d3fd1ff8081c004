//! [`Builder`]: the configuration of a client, checked once, for either front-end.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{Engine, NetConfig, Node};
use crate::error::Error;
use crate::machine::{Machine, Settings};
use crate::single::Redlock;
use crate::token::TokenSource;
use crate::url::MasterSpec;
use crate::MAX_TTL;

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
    /// Fencing tokens (default off): [`Lock::fencing_token`](crate::Lock::fencing_token) then strictly increases from
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

    /// Check the configuration and build the single-owner client. Connections are opened
    /// lazily, by the first operation.
    pub fn build(self) -> Result<Redlock, Error> {
        Ok(Redlock::from_machine(self.machine()?))
    }

    /// Check the configuration and make the engine and the lock logic.
    pub(crate) fn machine(self) -> Result<Machine, Error> {
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
        let settings = Settings {
            retry_count: self.retry_count,
            retry_delay: self.retry_delay,
            retry_jitter: self.retry_jitter,
            drift_factor: self.drift_factor,
            node_timeout: self.node_timeout,
            min_validity: self.min_validity,
            fencing: self.fencing,
            amnesia_guard: self.amnesia_guard,
        };
        Ok(Machine::new(
            engine,
            settings,
            TokenSource::new()?,
            self.seed,
        )?)
    }
}
