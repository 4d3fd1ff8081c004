//! Master addresses: `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS),
//! `host:port`, Unix sockets as `unix:///path/redis.sock[?db=N&password=P]` (or
//! `redis+unix://`), and clusters as `redis+cluster://[user:password@]host:port[,host:port...]`
//! (or `rediss+cluster://`).

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// Where a master listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// TCP (or TLS over TCP): a host name or IP literal, and a port.
    Tcp {
        /// Host name or IP literal as written (an IPv6 literal without its brackets).
        host: String,
        /// TCP port.
        port: u16,
    },
    /// A Unix domain socket (`unixsocket` in `redis.conf`).
    Unix(PathBuf),
}

/// One master, parsed from a URL. `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterSpec {
    /// Where it listens.
    pub endpoint: Endpoint,
    /// `rediss://`: speak TLS (needs the `tls` feature).
    pub tls: bool,
    /// ACL user name, if given.
    pub user: Option<String>,
    /// Password, if given.
    pub password: Option<String>,
    /// Database number for `SELECT` (0 when absent).
    pub db: u32,
    /// `redis+cluster://` / `rediss+cluster://`: the master is a Redis or Valkey Cluster,
    /// reached through its seed nodes ([`MasterSpec::endpoint`], then [`MasterSpec::seeds`]).
    pub cluster: bool,
    /// A cluster's seed nodes after the first (`redis+cluster://a:7000,b:7000`): any one
    /// that answers tells the client where every shard is. Empty for other masters.
    pub seeds: Vec<Endpoint>,
}

impl MasterSpec {
    /// Parse a master URL:
    ///
    /// * `redis://[user:password@]host[:port][/db]` (port 6379 when absent), or `host:port`;
    /// * `rediss://...`, the same with TLS (needs the `tls` feature to connect);
    /// * `unix:///path/redis.sock` or `redis+unix:///path/redis.sock` (an absolute path),
    ///   with an optional query string of `db=N`, `user=U` and `password=P` (values may be
    ///   percent-encoded, e.g. `%26` for `&`);
    /// * `redis+cluster://[user:password@]host:port[,host:port...]`, or `rediss+cluster://`
    ///   with TLS: a master that is a Redis or Valkey Cluster, named by one or more of its
    ///   nodes (seeds, comma-separated, the port required on each; `[v6]:port` for an IPv6
    ///   literal). A cluster has database 0 only: a `/db` other than `/0` is refused.
    ///
    /// Parsing never resolves a host name (see [`MasterSpec::resolve`]).
    ///
    /// ```
    /// use redlock_mux::{Endpoint, MasterSpec};
    /// let m = MasterSpec::parse("redis://app:s3cret@10.0.0.7:6380/2").unwrap();
    /// assert_eq!(m.endpoint, Endpoint::Tcp { host: "10.0.0.7".into(), port: 6380 });
    /// assert_eq!((m.db, m.user.as_deref(), m.tls), (2, Some("app"), false));
    /// assert!(!format!("{m:?}").contains("s3cret"));
    /// assert!(MasterSpec::parse("rediss://redis.internal:6380").unwrap().tls);
    /// let u = MasterSpec::parse("unix:///run/redis/redis.sock?db=3&password=pw").unwrap();
    /// assert_eq!(u.endpoint, Endpoint::Unix("/run/redis/redis.sock".into()));
    /// assert_eq!((u.db, u.password.as_deref()), (3, Some("pw")));
    /// assert!(MasterSpec::parse("redis://host:notaport").is_err());
    /// let c = MasterSpec::parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").unwrap();
    /// assert!(c.cluster);
    /// assert_eq!(c.endpoint, Endpoint::Tcp { host: "10.0.0.1".into(), port: 7000 });
    /// assert_eq!(c.seeds, [Endpoint::Tcp { host: "10.0.0.2".into(), port: 7000 }]);
    /// assert!(MasterSpec::parse("redis+cluster://10.0.0.1:7000/1").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        for scheme in ["unix://", "redis+unix://"] {
            if let Some(rest) = url.strip_prefix(scheme) {
                return parse_unix(url, rest);
            }
        }
        for (scheme, tls) in [("redis+cluster://", false), ("rediss+cluster://", true)] {
            if let Some(rest) = url.strip_prefix(scheme) {
                return parse_cluster(url, rest, tls);
            }
        }
        let (rest, tls) = if let Some(r) = url.strip_prefix("redis://") {
            (r, false)
        } else if let Some(r) = url.strip_prefix("rediss://") {
            (r, true)
        } else if url.contains("://") {
            return Err(format!(
                "unsupported scheme in {:?}: use redis://, rediss:// (TLS), unix:// or \
                 redis+cluster://",
                redact(url)
            ));
        } else {
            (url, false)
        };
        if rest.starts_with('/') || (rest.is_empty() && url.starts_with('/')) {
            return Err(format!(
                "{:?} looks like a Unix socket path: write unix:///path/to/redis.sock",
                redact(url)
            ));
        }
        let (auth, hostpart) = match rest.rfind('@') {
            Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
            None => (None, rest),
        };
        let (hostport, db) = match hostpart.split_once('/') {
            Some((hp, "")) => (hp, 0),
            Some((hp, db)) => (hp, parse_db(db, url)?),
            None => (hostpart, 0),
        };
        let endpoint = parse_hostport(hostport, url, url.contains("://"))?;
        let (user, password) = parse_auth(auth);
        Ok(MasterSpec {
            endpoint,
            tls,
            user,
            password,
            db,
            cluster: false,
            seeds: Vec::new(),
        })
    }

    /// The IP address of a TCP master given as an IP literal (never resolves).
    pub fn literal_addr(&self) -> Option<SocketAddr> {
        match &self.endpoint {
            Endpoint::Tcp { host, port } => host
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, *port)),
            Endpoint::Unix(_) => None,
        }
    }

    /// Resolve a TCP master to one socket address (first result; IPv4 preferred). This
    /// blocks for as long as the system resolver takes; the client itself resolves on a
    /// helper thread at every connect.
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        let Endpoint::Tcp { host, port } = &self.endpoint else {
            return Err(format!("{self} is a Unix socket: it has no IP address"));
        };
        let addrs: Vec<SocketAddr> = (host.as_str(), *port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self))?
            .collect();
        pick_addr(&addrs).ok_or_else(|| format!("cannot resolve {}: no addresses", self))
    }
}

/// The address to connect to among a resolver's answers: the first IPv4 one, else the first.
pub(crate) fn pick_addr(addrs: &[SocketAddr]) -> Option<SocketAddr> {
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
}

/// `host:port`, `[v6]:port`, or `host` alone (port 6379) when `default_port`.
fn parse_hostport(hostport: &str, url: &str, default_port: bool) -> Result<Endpoint, String> {
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        // [v6]:port
        let (h, p) = h
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in {:?}", redact(url)))?;
        (h, p.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host in {:?}", redact(url)));
    }
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port {p:?} in {:?}", redact(url)))?,
        None if default_port => 6379,
        None => return Err(format!("no port in {:?} (write host:port)", redact(url))),
    };
    Ok(Endpoint::Tcp {
        host: host.to_string(),
        port,
    })
}

/// `user:password`, `:password` or `password` before the `@`.
fn parse_auth(auth: Option<&str>) -> (Option<String>, Option<String>) {
    match auth {
        None => (None, None),
        Some(a) => match a.split_once(':') {
            Some(("", p)) => (None, Some(p.to_string())),
            Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
            None => (None, Some(a.to_string())),
        },
    }
}

/// `[user:password@]host:port[,host:port...][/0]` after `redis+cluster://`.
fn parse_cluster(url: &str, rest: &str, tls: bool) -> Result<MasterSpec, String> {
    let (auth, hostpart) = match rest.rfind('@') {
        Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
        None => (None, rest),
    };
    let hosts = match hostpart.split_once('/') {
        Some((hp, "")) => hp,
        Some((hp, db)) => match parse_db(db, url)? {
            0 => hp,
            n => {
                return Err(format!(
                    "database {n} in {:?}: a cluster has database 0 only",
                    redact(url)
                ))
            }
        },
        None => hostpart,
    };
    let mut endpoints = Vec::new();
    for seed in hosts.split(',') {
        if seed.is_empty() {
            return Err(format!("an empty seed in {:?}", redact(url)));
        }
        endpoints.push(parse_hostport(seed, url, false)?);
    }
    let endpoint = endpoints.remove(0);
    let (user, password) = parse_auth(auth);
    Ok(MasterSpec {
        endpoint,
        tls,
        user,
        password,
        db: 0,
        cluster: true,
        seeds: endpoints,
    })
}

fn parse_db(db: &str, url: &str) -> Result<u32, String> {
    db.parse::<u32>()
        .map_err(|_| format!("bad database number {db:?} in {:?}", redact(url)))
}

/// `unix:///path?db=N&user=U&password=P` after the scheme.
fn parse_unix(url: &str, rest: &str) -> Result<MasterSpec, String> {
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if path.is_empty() {
        return Err(format!("no socket path in {:?}", redact(url)));
    }
    if !path.starts_with('/') {
        return Err(format!(
            "the socket path in {:?} must be absolute: unix:///path/to/redis.sock",
            redact(url)
        ));
    }
    let mut spec = MasterSpec {
        endpoint: Endpoint::Unix(PathBuf::from(percent_decode(path, url)?)),
        tls: false,
        user: None,
        password: None,
        db: 0,
        cluster: false,
        seeds: Vec::new(),
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "db" => spec.db = parse_db(value, url)?,
            "user" | "username" => spec.user = Some(percent_decode(value, url)?),
            "password" | "pass" => spec.password = Some(percent_decode(value, url)?),
            other => {
                return Err(format!(
                    "unknown parameter {other:?} in {:?} (known: db, user, password)",
                    redact(url)
                ))
            }
        }
    }
    Ok(spec)
}

/// `%XX` escapes to bytes; the result must be UTF-8.
fn percent_decode(s: &str, url: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad %-escape in {:?}", redact(url)))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("%-escapes that are not UTF-8 in {:?}", redact(url)))
}

/// `url` with its password hidden (`user:password@` and `password=` in a query string).
fn redact(url: &str) -> String {
    // Every `password=` / `pass=` parameter of the query, however many.
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k == "password" || k == "pass" => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => url.to_string(),
    };
    if url.starts_with("unix://") || url.starts_with("redis+unix://") {
        return url;
    }
    // (`redis+cluster://`: `://` then `user:password@` as for `redis://`.)
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        (None, Some(at)) => format!("***@{}", &url[at + 1..]),
        _ => url,
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Endpoint::Tcp { host, port } => write!(f, "{host}:{port}"),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl fmt::Display for MasterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cluster {
            f.write_str("cluster ")?;
        }
        self.endpoint.fmt(f)?;
        for seed in &self.seeds {
            write!(f, ",{seed}")?;
        }
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl fmt::Debug for MasterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterSpec")
            .field("endpoint", &self.endpoint)
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("cluster", &self.cluster)
            .field("seeds", &self.seeds)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redact_hides_every_password_parameter() {
        let r = super::redact("unix:///r.sock?password=a1&password=b2&pass=c3&x=1");
        assert!(
            !r.contains("a1") && !r.contains("b2") && !r.contains("c3"),
            "{r}"
        );
        assert!(r.ends_with("x=1"), "{r}");
        let r = super::redact("redis://user:s3cret@h:6379/0?password=p4");
        assert!(!r.contains("s3cret") && !r.contains("p4"), "{r}");
    }

    use super::*;

    fn tcp(m: &MasterSpec) -> (&str, u16) {
        match &m.endpoint {
            Endpoint::Tcp { host, port } => (host, *port),
            Endpoint::Unix(p) => panic!("unix {p:?}"),
        }
    }

    #[test]
    fn parses_the_forms() {
        let m = MasterSpec::parse("redis://localhost").unwrap();
        assert_eq!((tcp(&m), m.db, m.tls), (("localhost", 6379), 0, false));
        let m = MasterSpec::parse("redis://:pw@h:1/").unwrap();
        assert_eq!((m.user, m.password.as_deref()), (None, Some("pw")));
        let m = MasterSpec::parse("redis://pw@h:1").unwrap();
        assert_eq!(m.password.as_deref(), Some("pw"));
        let m = MasterSpec::parse("redis://u:p@ss@h:1/3").unwrap();
        assert_eq!(
            (m.user.as_deref(), m.password.as_deref(), m.db),
            (Some("u"), Some("p@ss"), 3)
        );
        let m = MasterSpec::parse("[::1]:7000").unwrap();
        assert_eq!(tcp(&m), ("::1", 7000));
        assert_eq!(m.to_string(), "[::1]:7000");
        assert_eq!(m.literal_addr(), Some("[::1]:7000".parse().unwrap()));
        let m = MasterSpec::parse("rediss://u:p@redis.example:6380/1").unwrap();
        assert_eq!((tcp(&m), m.tls, m.db), (("redis.example", 6380), true, 1));
        assert_eq!(m.literal_addr(), None);
        assert_eq!(MasterSpec::parse("rediss://h").map(|m| tcp(&m).1), Ok(6379));
    }

    #[test]
    fn parses_unix_sockets() {
        for url in [
            "unix:///tmp/r.sock",
            "redis+unix:///tmp/r.sock",
            "unix:///tmp/r.sock?",
        ] {
            let m = MasterSpec::parse(url).unwrap();
            assert_eq!(m.endpoint, Endpoint::Unix("/tmp/r.sock".into()), "{url}");
            assert_eq!(
                (m.db, m.tls, &m.user, &m.password),
                (0, false, &None, &None)
            );
            assert_eq!(m.to_string(), "unix:/tmp/r.sock");
            assert_eq!(m.literal_addr(), None);
        }
        let m = MasterSpec::parse("unix:///a%20b/r.sock?db=2&user=app&password=p%26w").unwrap();
        assert_eq!(m.endpoint, Endpoint::Unix("/a b/r.sock".into()));
        assert_eq!(
            (m.db, m.user.as_deref(), m.password.as_deref()),
            (2, Some("app"), Some("p&w"))
        );
        assert_eq!(m.to_string(), "unix:/a b/r.sock/2");
        assert!(!format!("{m:?}").contains("p&w"));
    }

    #[test]
    fn rejects_bad_urls_without_leaking_passwords() {
        for bad in [
            "",
            "h",
            "h:",
            "h:0",
            "h:65536",
            ":6379",
            "http://h:1",
            "redis://h:1/x",
            "redis://u:pw@h:x",
            "rediss://u:pw@h:x",
            "unix://",
            "unix://relative/r.sock",
            "unix:///r.sock?db=x&password=pw",
            "unix:///r.sock?password=pw&color=blue",
            "unix:///r.sock?password=pw%zz",
            "/tmp/redis.sock",
            "redis:///tmp/redis.sock",
        ] {
            let e = MasterSpec::parse(bad).expect_err(bad);
            assert!(!e.contains("pw"), "{e}");
        }
    }

    #[test]
    fn parses_cluster_seeds() {
        let m = MasterSpec::parse("redis+cluster://127.0.0.1:7000").unwrap();
        assert_eq!(
            (tcp(&m), m.cluster, m.tls, m.db),
            (("127.0.0.1", 7000), true, false, 0)
        );
        assert!(m.seeds.is_empty());
        assert_eq!(m.to_string(), "cluster 127.0.0.1:7000");
        let m = MasterSpec::parse("rediss+cluster://app:pw@a:7000,[::1]:7001,b:7002/0").unwrap();
        assert_eq!((tcp(&m), m.cluster, m.tls), (("a", 7000), true, true));
        assert_eq!(
            (m.user.as_deref(), m.password.as_deref()),
            (Some("app"), Some("pw"))
        );
        assert_eq!(m.to_string(), "cluster a:7000,[::1]:7001,b:7002");
        assert!(!format!("{m:?}").contains("pw"));
        assert_eq!(
            m.seeds,
            [
                Endpoint::Tcp {
                    host: "::1".into(),
                    port: 7001
                },
                Endpoint::Tcp {
                    host: "b".into(),
                    port: 7002
                },
            ]
        );
        // Plain masters are not clusters.
        assert!(!MasterSpec::parse("redis://a:7000").unwrap().cluster);
        for bad in [
            "redis+cluster://",
            "redis+cluster://a",
            "redis+cluster://a:7000,",
            "redis+cluster://a:7000,,b:7001",
            "redis+cluster://u:pw@a:7000/1",
            "redis+cluster://u:pw@a:x",
            "redis+cluster:///tmp/r.sock",
        ] {
            let e = MasterSpec::parse(bad).expect_err(bad);
            assert!(!e.contains("pw"), "{e}");
        }
        let e = MasterSpec::parse("redis+cluster://a:7000/2").unwrap_err();
        assert!(e.contains("database 0 only"), "{e}");
    }

    #[test]
    fn a_socket_path_is_not_a_database_number() {
        for url in ["/tmp/redis.sock", "redis:///tmp/redis.sock"] {
            let e = MasterSpec::parse(url).unwrap_err();
            assert!(e.contains("unix:///"), "{e}");
            assert!(!e.contains("database"), "{e}");
        }
        let e = MasterSpec::parse("unix://tmp/r.sock").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
    }
}
