//! Master addresses: `redis://[user:password@]host:port[/db]` or `host:port`.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// One master, parsed from a URL. `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterSpec {
    /// Host name or IP literal as written.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// ACL user name, if given.
    pub user: Option<String>,
    /// Password, if given.
    pub password: Option<String>,
    /// Database number for `SELECT` (0 when absent).
    pub db: u32,
}

impl MasterSpec {
    /// Parse `redis://[user:password@]host:port[/db]`, `redis://host` (port 6379) or
    /// `host:port`.
    ///
    /// ```
    /// use redlock_mux::MasterSpec;
    /// let m = MasterSpec::parse("redis://app:s3cret@10.0.0.7:6380/2").unwrap();
    /// assert_eq!((m.host.as_str(), m.port, m.db), ("10.0.0.7", 6380, 2));
    /// assert_eq!(m.user.as_deref(), Some("app"));
    /// assert!(!format!("{m:?}").contains("s3cret"));
    /// assert_eq!(MasterSpec::parse("127.0.0.1:7000").unwrap().port, 7000);
    /// assert!(MasterSpec::parse("redis://host:notaport").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let rest = if let Some(r) = url.strip_prefix("redis://") {
            r
        } else if url.contains("://") {
            return Err(format!(
                "unsupported scheme in {:?}: only redis:// is supported (no TLS)",
                redact(url)
            ));
        } else {
            url
        };
        let (auth, hostpart) = match rest.rfind('@') {
            Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
            None => (None, rest),
        };
        let (hostport, db) = match hostpart.split_once('/') {
            Some((hp, "")) => (hp, 0),
            Some((hp, db)) => (
                hp,
                db.parse::<u32>()
                    .map_err(|_| format!("bad database number {db:?} in {:?}", redact(url)))?,
            ),
            None => (hostpart, 0),
        };
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
            None if url.starts_with("redis://") => 6379,
            None => return Err(format!("no port in {:?} (write host:port)", redact(url))),
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some(("", p)) => (None, Some(p.to_string())),
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (None, Some(a.to_string())),
            },
        };
        Ok(MasterSpec {
            host: host.to_string(),
            port,
            user,
            password,
            db,
        })
    }

    /// Resolve to one socket address (first result; IPv4 preferred).
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self))?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| format!("cannot resolve {}: no addresses", self))
    }
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        (None, Some(at)) => format!("***@{}", &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl fmt::Display for MasterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{}:{}", self.host, self.port)?;
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
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms() {
        let m = MasterSpec::parse("redis://localhost").unwrap();
        assert_eq!((m.host.as_str(), m.port, m.db), ("localhost", 6379, 0));
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
        assert_eq!((m.host.as_str(), m.port), ("::1", 7000));
        assert_eq!(m.to_string(), "[::1]:7000");
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
            "rediss://h:1",
            "http://h:1",
            "redis://h:1/x",
            "redis://u:pw@h:x",
        ] {
            let e = MasterSpec::parse(bad).expect_err(bad);
            assert!(!e.contains("pw"), "{e}");
        }
    }
}
