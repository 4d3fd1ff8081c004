//! Cluster masters (issue 22), the parts without I/O: a Redlock master may be a Redis or
//! Valkey Cluster, whose keys are spread over shards by slot (`crate::slot`). The client
//! learns which shard primary serves which slots from `CLUSTER SHARDS` (Redis 7+, Valkey;
//! `CLUSTER SLOTS` where that is refused), keeps them in a [`SlotMap`], and follows the
//! redirections a node answers when the map is stale ([`Redirect`]: `-MOVED` for a slot
//! that has moved for good, `-ASK` for one key during a migration).
//!
//! Everything here reads a reply the client already parsed (a [`Frame`]) and never
//! allocates per request: maps are rebuilt only when the cluster tells the client they
//! changed.

use crate::resp::Frame;
use crate::slot::SLOTS;

/// Where a node listens, as the cluster names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct NodeAddr {
    /// Host name or IP literal (an IPv6 literal without brackets). Empty: the cluster does
    /// not know it (an endpoint of `?`, or empty): the host of the node that answered.
    pub host: String,
    pub port: u16,
}

impl NodeAddr {
    /// This address, with an unknown host replaced by `asked` (the node that answered).
    pub(crate) fn or_host(mut self, asked: &str) -> NodeAddr {
        if self.host.is_empty() {
            self.host = asked.to_string();
        }
        self
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One shard as the cluster describes it: its primary and the slot ranges it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardInfo {
    pub primary: NodeAddr,
    /// The primary's cluster node id (40 hex digits), when given.
    pub node_id: Option<[u8; 40]>,
    /// Inclusive slot ranges.
    pub ranges: Vec<(u16, u16)>,
}

/// Why a cluster's description of its shards was not understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapError {
    /// Not the shape `CLUSTER SHARDS` / `CLUSTER SLOTS` answers.
    Shape(&'static str),
    /// A slot outside 0..16383, or a range whose end is before its start.
    BadRange,
    /// Two shards claim one slot.
    Overlap(u16),
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapError::Shape(what) => write!(f, "unexpected cluster map: {what}"),
            MapError::BadRange => f.write_str("a slot range outside 0..16383"),
            MapError::Overlap(s) => write!(f, "slot {s} claimed by two shards"),
        }
    }
}

fn text<'a>(f: &Frame<'a>) -> Option<&'a [u8]> {
    match *f {
        Frame::Bulk(b) | Frame::Simple(b) => Some(b),
        Frame::Verbatim { text, .. } => Some(text),
        _ => None,
    }
}

fn int(f: &Frame<'_>) -> Option<i64> {
    match *f {
        Frame::Integer(i) => Some(i),
        _ => text(f)
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.parse().ok()),
    }
}

fn slot(v: i64) -> Result<u16, MapError> {
    if (0..SLOTS as i64).contains(&v) {
        Ok(v as u16)
    } else {
        Err(MapError::BadRange)
    }
}

fn range(start: i64, end: i64) -> Result<(u16, u16), MapError> {
    let (s, e) = (slot(start)?, slot(end)?);
    if e < s {
        return Err(MapError::BadRange);
    }
    Ok((s, e))
}

/// An endpoint as the cluster writes it: `?` or empty is unknown (the asked node's host).
fn endpoint_host(b: &[u8]) -> Result<String, MapError> {
    if b == b"?" {
        return Ok(String::new());
    }
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| MapError::Shape("an endpoint that is not UTF-8"))
}

fn node_id(b: &[u8]) -> Option<[u8; 40]> {
    <[u8; 40]>::try_from(b).ok()
}

/// A map's or a RESP2 flat array's key/value pairs.
fn pairs<'a>(f: &Frame<'a>) -> Option<impl Iterator<Item = (Frame<'a>, Frame<'a>)>> {
    let Frame::Aggregate(a) = f else { return None };
    let mut it = a.iter();
    Some(std::iter::from_fn(move || Some((it.next()?, it.next()?))))
}

/// Parse a `CLUSTER SHARDS` reply (RESP2 or RESP3): every shard with slots and an
/// online primary. `tls`: take a node's `tls-port` where it has one.
pub(crate) fn parse_shards(reply: &Frame<'_>, tls: bool) -> Result<Vec<ShardInfo>, MapError> {
    let Frame::Aggregate(shards) = reply else {
        return Err(MapError::Shape("CLUSTER SHARDS is not an array"));
    };
    let mut out = Vec::with_capacity(shards.len());
    for shard in shards.iter() {
        let fields = pairs(&shard).ok_or(MapError::Shape("a shard is not a map"))?;
        let mut ranges = Vec::new();
        let mut primary = None;
        for (k, v) in fields {
            match text(&k) {
                Some(b"slots") => {
                    let Frame::Aggregate(a) = v else {
                        return Err(MapError::Shape("slots is not an array"));
                    };
                    let mut it = a.iter();
                    while let Some(s) = it.next() {
                        let e = it.next().ok_or(MapError::Shape("an odd slot list"))?;
                        let (s, e) = (int(&s), int(&e));
                        let (Some(s), Some(e)) = (s, e) else {
                            return Err(MapError::Shape("a slot that is not a number"));
                        };
                        ranges.push(range(s, e)?);
                    }
                }
                Some(b"nodes") => {
                    let Frame::Aggregate(nodes) = v else {
                        return Err(MapError::Shape("nodes is not an array"));
                    };
                    for node in nodes.iter() {
                        let fields = pairs(&node).ok_or(MapError::Shape("a node is not a map"))?;
                        let (mut role, mut health) = (None, None);
                        let (mut endpoint, mut ip, mut id) = (None, None, None);
                        let (mut port, mut tls_port) = (None, None);
                        for (k, v) in fields {
                            match text(&k) {
                                Some(b"role") => role = text(&v),
                                Some(b"health") => health = text(&v),
                                Some(b"endpoint") => endpoint = text(&v),
                                Some(b"ip") => ip = text(&v),
                                Some(b"id") => id = text(&v),
                                Some(b"port") => port = int(&v),
                                Some(b"tls-port") => tls_port = int(&v),
                                _ => {}
                            }
                        }
                        if role != Some(b"master") || health.is_some_and(|h| h != b"online") {
                            continue;
                        }
                        let port = if tls { tls_port.or(port) } else { port };
                        let port = port
                            .and_then(|p| u16::try_from(p).ok())
                            .filter(|p| *p != 0)
                            .ok_or(MapError::Shape("a primary without a port"))?;
                        let host = endpoint.or(ip).unwrap_or(b"?");
                        primary = Some(ShardInfo {
                            primary: NodeAddr {
                                host: endpoint_host(host)?,
                                port,
                            },
                            node_id: id.and_then(node_id),
                            ranges: Vec::new(),
                        });
                    }
                }
                _ => {}
            }
        }
        // A shard without slots (a new, empty primary) or without an online primary (a
        // failover under way) serves nothing now: its slots, if any, stay unmapped and
        // their requests fail until the next refresh.
        if let (Some(mut p), false) = (primary, ranges.is_empty()) {
            p.ranges = ranges;
            out.push(p);
        }
    }
    Ok(out)
}

/// Parse a `CLUSTER SLOTS` reply: `[start, end, [host, port, id, ...], replicas...]` per
/// range, merged by primary.
pub(crate) fn parse_slots(reply: &Frame<'_>) -> Result<Vec<ShardInfo>, MapError> {
    let Frame::Aggregate(entries) = reply else {
        return Err(MapError::Shape("CLUSTER SLOTS is not an array"));
    };
    let mut out: Vec<ShardInfo> = Vec::new();
    for entry in entries.iter() {
        let Frame::Aggregate(e) = entry else {
            return Err(MapError::Shape("a slot range is not an array"));
        };
        let mut it = e.iter();
        let (Some(s), Some(end), Some(Frame::Aggregate(node))) = (
            it.next().as_ref().and_then(int),
            it.next().as_ref().and_then(int),
            it.next(),
        ) else {
            return Err(MapError::Shape("a slot range without its primary"));
        };
        let r = range(s, end)?;
        let mut n = node.iter();
        let host = n.next().as_ref().and_then(text).unwrap_or(b"?");
        let port = n
            .next()
            .as_ref()
            .and_then(int)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or(MapError::Shape("a primary without a port"))?;
        let id = n.next().as_ref().and_then(text).and_then(node_id);
        let primary = NodeAddr {
            host: endpoint_host(if host.is_empty() { b"?" } else { host })?,
            port,
        };
        match out.iter_mut().find(|sh| sh.primary == primary) {
            Some(sh) => sh.ranges.push(r),
            None => out.push(ShardInfo {
                primary,
                node_id: id,
                ranges: vec![r],
            }),
        }
    }
    Ok(out)
}

/// Which shard serves each slot.
#[derive(Debug, Clone)]
pub(crate) struct SlotMap {
    /// Shard index per slot; [`SlotMap::NONE`] where no shard serves it.
    owner: Box<[u16]>,
    shards: Vec<ShardInfo>,
}

impl SlotMap {
    const NONE: u16 = u16::MAX;

    /// A map of `shards`, checked: every range inside the slots, no slot claimed twice.
    pub(crate) fn new(shards: Vec<ShardInfo>) -> Result<SlotMap, MapError> {
        let mut owner = vec![Self::NONE; SLOTS].into_boxed_slice();
        for (i, sh) in shards.iter().enumerate() {
            for &(s, e) in &sh.ranges {
                for slot in s..=e {
                    let o = &mut owner[slot as usize];
                    if *o != Self::NONE {
                        return Err(MapError::Overlap(slot));
                    }
                    *o = i as u16;
                }
            }
        }
        Ok(SlotMap { owner, shards })
    }

    /// The shard that serves `slot`, if any.
    #[inline]
    pub(crate) fn shard_of(&self, slot: u16) -> Option<usize> {
        match self.owner.get(slot as usize) {
            Some(&o) if o != Self::NONE => Some(o as usize),
            _ => None,
        }
    }

    pub(crate) fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    /// Slots no shard serves.
    pub(crate) fn unserved(&self) -> usize {
        self.owner.iter().filter(|&&o| o == Self::NONE).count()
    }

    /// A `-MOVED slot addr`: the slot is now served by `addr`. Returns its shard index,
    /// and whether that shard is new to the map (a connection to open).
    pub(crate) fn moved(&mut self, slot: u16, addr: &NodeAddr) -> (usize, bool) {
        let (i, new) = match self.shards.iter().position(|s| &s.primary == addr) {
            Some(i) => (i, false),
            None => {
                self.shards.push(ShardInfo {
                    primary: addr.clone(),
                    node_id: None,
                    ranges: Vec::new(),
                });
                (self.shards.len() - 1, true)
            }
        };
        if let Some(o) = self.owner.get_mut(slot as usize) {
            *o = i as u16;
        }
        (i, new)
    }
}

/// A node's answer that the key lives elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// `-MOVED slot host:port`: the slot moved for good; update the map, resend there.
    Moved { slot: u16, to: NodeAddr },
    /// `-ASK slot host:port`: this one key is being migrated; send `ASKING` and the
    /// request to that node, once, without changing the map.
    Ask { slot: u16, to: NodeAddr },
}

/// Parse an error reply's text as a redirection (`MOVED 3999 127.0.0.1:6381`, `ASK 3999
/// :6381` with an unknown host, `MOVED 3999 ::1:6381` for IPv6: the last colon parts the
/// port). Anything else: `None`.
pub(crate) fn parse_redirect(err: &[u8]) -> Option<Redirect> {
    let (kind, rest) = if let Some(r) = err.strip_prefix(b"MOVED ") {
        (true, r)
    } else if let Some(r) = err.strip_prefix(b"ASK ") {
        (false, r)
    } else {
        return None;
    };
    let rest = std::str::from_utf8(rest).ok()?;
    let mut words = rest.split(' ');
    let slot = words
        .next()?
        .parse::<u16>()
        .ok()
        .filter(|s| (*s as usize) < SLOTS)?;
    let addr = words.next()?;
    if words.next().is_some() {
        return None;
    }
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let to = NodeAddr {
        host: if host == "?" {
            String::new()
        } else {
            host.to_string()
        },
        port,
    };
    Some(if kind {
        Redirect::Moved { slot, to }
    } else {
        Redirect::Ask { slot, to }
    })
}

/// Errors after which a cluster's node votes no for this request and nothing more is
/// done: the slot is unavailable for now (`TRYAGAIN` during a multi-key migration,
/// `CLUSTERDOWN`, a `LOADING` replica just promoted).
pub(crate) fn is_unavailable(err: &[u8]) -> bool {
    [&b"TRYAGAIN"[..], b"CLUSTERDOWN", b"LOADING"]
        .iter()
        .any(|p| err.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{parse, Limits, Status};

    fn frame(bytes: &[u8], f: impl FnOnce(&Frame<'_>)) {
        let Ok(Status::Complete((fr, used))) = parse(bytes, &Limits::default()) else {
            panic!("bad test bytes");
        };
        assert_eq!(used, bytes.len());
        f(&fr)
    }

    /// RESP bytes of a bulk string.
    fn bulk(s: &str) -> String {
        format!("${}\r\n{s}\r\n", s.len())
    }

    fn node(id: &str, port: u16, endpoint: &str, role: &str, health: &str, map: bool) -> String {
        let fields = [
            (bulk("id"), bulk(id)),
            (bulk("port"), format!(":{port}\r\n")),
            (bulk("ip"), bulk("127.0.0.1")),
            (bulk("endpoint"), bulk(endpoint)),
            (bulk("role"), bulk(role)),
            (bulk("replication-offset"), ":42\r\n".to_string()),
            (bulk("health"), bulk(health)),
        ];
        let mut s = if map {
            format!("%{}\r\n", fields.len())
        } else {
            format!("*{}\r\n", 2 * fields.len())
        };
        for (k, v) in fields {
            s += &k;
            s += &v;
        }
        s
    }

    fn shard(slots: &[(u16, u16)], nodes: &[String], map: bool) -> String {
        let mut s = if map {
            "%2\r\n".to_string()
        } else {
            "*4\r\n".to_string()
        };
        s += &bulk("slots");
        s += &format!("*{}\r\n", 2 * slots.len());
        for (a, b) in slots {
            s += &format!(":{a}\r\n:{b}\r\n");
        }
        s += &bulk("nodes");
        s += &format!("*{}\r\n", nodes.len());
        for n in nodes {
            s += n;
        }
        s
    }

    fn id(c: char) -> String {
        std::iter::repeat_n(c, 40).collect()
    }

    #[test]
    fn parses_cluster_shards_in_both_protocols() {
        for map in [false, true] {
            let shards = [
                shard(
                    &[(0, 5460)],
                    &[
                        node(&id('a'), 7000, "127.0.0.1", "master", "online", map),
                        node(&id('d'), 7003, "127.0.0.1", "replica", "online", map),
                    ],
                    map,
                ),
                shard(
                    &[(5461, 10922), (16000, 16000)],
                    &[node(&id('b'), 7001, "?", "master", "online", map)],
                    map,
                ),
                // A failed primary: not a shard to send to.
                shard(
                    &[(10923, 15999)],
                    &[node(&id('c'), 7002, "127.0.0.1", "master", "failed", map)],
                    map,
                ),
                // A new primary without slots.
                shard(
                    &[],
                    &[node(&id('e'), 7004, "127.0.0.1", "master", "online", map)],
                    map,
                ),
            ];
            let bytes = format!("*{}\r\n{}", shards.len(), shards.concat());
            frame(bytes.as_bytes(), |f| {
                let got = parse_shards(f, false).unwrap();
                assert_eq!(got.len(), 2, "{got:?}");
                assert_eq!(got[0].primary.to_string(), "127.0.0.1:7000");
                assert_eq!(got[0].ranges, [(0, 5460)]);
                assert_eq!(got[0].node_id.map(|i| i[0]), Some(b'a'));
                assert_eq!(
                    got[1].primary.host, "",
                    "an endpoint of ? is the asked host"
                );
                assert_eq!(
                    got[1].primary.clone().or_host("10.1.1.1").to_string(),
                    "10.1.1.1:7001"
                );
                assert_eq!(got[1].ranges, [(5461, 10922), (16000, 16000)]);
                let m = SlotMap::new(got).unwrap();
                assert_eq!(m.shard_of(0), Some(0));
                assert_eq!(m.shard_of(5461), Some(1));
                assert_eq!(m.shard_of(16000), Some(1));
                assert_eq!(m.shard_of(10923), None);
                assert_eq!(m.unserved(), 16384 - 5461 - 5462 - 1);
            });
        }
    }

    #[test]
    fn parses_what_redis_7_answers() {
        // Captured from a 3-primary redis-server 7.0 cluster on loopback.
        let ports = |shards: Vec<ShardInfo>| {
            let m = SlotMap::new(shards).unwrap();
            assert_eq!(m.unserved(), 0);
            [0u16, 5461, 10923, 16383].map(|s| m.shards()[m.shard_of(s).unwrap()].primary.port)
        };
        let want = [17100, 17101, 17102, 17102];
        for bytes in [
            &include_bytes!("../../tests/data/cluster-shards-redis7-resp2.bin")[..],
            include_bytes!("../../tests/data/cluster-shards-redis7-resp3.bin"),
        ] {
            frame(bytes, |f| {
                assert_eq!(ports(parse_shards(f, false).unwrap()), want)
            });
        }
        frame(
            include_bytes!("../../tests/data/cluster-slots-redis7-resp3.bin"),
            |f| assert_eq!(ports(parse_slots(f).unwrap()), want),
        );
    }

    #[test]
    fn parses_cluster_slots() {
        let entry = |a: u16, b: u16, host: &str, port: u16, c: char| {
            format!(
                "*4\r\n:{a}\r\n:{b}\r\n*3\r\n{}:{port}\r\n{}*3\r\n{}:{}\r\n{}",
                bulk(host),
                bulk(&id(c)),
                bulk(host),
                port + 3,
                bulk(&id('r'))
            )
        };
        let bytes = format!(
            "*3\r\n{}{}{}",
            entry(0, 100, "127.0.0.1", 7000, 'a'),
            entry(101, 16383, "", 7001, 'b'),
            entry(200, 300, "127.0.0.1", 7000, 'a'),
        );
        frame(bytes.as_bytes(), |f| {
            let got = parse_slots(f).unwrap();
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].ranges, [(0, 100), (200, 300)]);
            assert_eq!(got[1].primary.host, "");
            // Overlapping claims are refused, not silently resolved.
            assert_eq!(SlotMap::new(got).unwrap_err(), MapError::Overlap(200));
        });
    }

    #[test]
    fn hostile_maps_are_errors() {
        for bad in [
            &b":1\r\n"[..],
            b"*1\r\n:1\r\n",
            b"*1\r\n*4\r\n$5\r\nslots\r\n*1\r\n:1\r\n$5\r\nnodes\r\n*0\r\n",
            b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:5\r\n:3\r\n$5\r\nnodes\r\n*0\r\n",
            b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16384\r\n$5\r\nnodes\r\n*0\r\n",
            b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:-1\r\n:3\r\n$5\r\nnodes\r\n*0\r\n",
        ] {
            frame(bad, |f| assert!(parse_shards(f, false).is_err(), "{:?}", f));
        }
        for bad in [
            &b"*1\r\n*2\r\n:0\r\n:1\r\n"[..],
            b"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:0\r\n",
            b"*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        ] {
            frame(bad, |f| assert!(parse_slots(f).is_err(), "{:?}", f));
        }
    }

    #[test]
    fn parses_redirects() {
        let a = |h: &str, p| NodeAddr {
            host: h.into(),
            port: p,
        };
        assert_eq!(
            parse_redirect(b"MOVED 3999 127.0.0.1:6381"),
            Some(Redirect::Moved {
                slot: 3999,
                to: a("127.0.0.1", 6381)
            })
        );
        assert_eq!(
            parse_redirect(b"ASK 0 :6381"),
            Some(Redirect::Ask {
                slot: 0,
                to: a("", 6381)
            })
        );
        assert_eq!(
            parse_redirect(b"MOVED 16383 ::1:7000"),
            Some(Redirect::Moved {
                slot: 16383,
                to: a("::1", 7000)
            })
        );
        for bad in [
            &b"MOVED"[..],
            b"MOVED 16384 h:1",
            b"MOVED x h:1",
            b"MOVED 1 h",
            b"MOVED 1 h:0",
            b"MOVED 1 h:1 extra",
            b"ERR MOVED 1 h:1",
            b"NOSCRIPT No matching script",
        ] {
            assert_eq!(
                parse_redirect(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(is_unavailable(
            b"TRYAGAIN Multiple keys request during rehashing of slot"
        ));
        assert!(is_unavailable(b"CLUSTERDOWN The cluster is down"));
        assert!(!is_unavailable(b"ERR unknown command"));
    }

    #[test]
    fn a_moved_slot_changes_owner() {
        let mut m = SlotMap::new(vec![ShardInfo {
            primary: NodeAddr {
                host: "h".into(),
                port: 1,
            },
            node_id: None,
            ranges: vec![(0, 16383)],
        }])
        .unwrap();
        let to = NodeAddr {
            host: "h".into(),
            port: 2,
        };
        assert_eq!(m.moved(7, &to), (1, true));
        assert_eq!(m.moved(8, &to), (1, false));
        assert_eq!(
            (m.shard_of(6), m.shard_of(7), m.shard_of(8)),
            (Some(0), Some(1), Some(1))
        );
        assert_eq!(m.shards().len(), 2);
    }
}
