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

/// What a `CLUSTER SHARDS` node entry says of an online primary.
struct Primary<'a> {
    /// Its endpoint, else its ip, else `?` (unknown: the asked node's host).
    host: &'a [u8],
    /// Its port (`tls-port` where the client speaks TLS and the node has one).
    port: Option<i64>,
    id: Option<&'a [u8]>,
}

/// A node entry of a `CLUSTER SHARDS` shard: `Some` for an online primary, `None` for a
/// replica or a node that is not online, `Err` for an entry that is not a map.
fn online_primary<'a>(node: &Frame<'a>, tls: bool) -> Result<Option<Primary<'a>>, ()> {
    let fields = pairs(node).ok_or(())?;
    let (mut role, mut health, mut endpoint, mut ip, mut id) = (None, None, None, None, None);
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
        return Ok(None);
    }
    Ok(Some(Primary {
        host: endpoint.or(ip).unwrap_or(b"?"),
        port: if tls { tls_port.or(port) } else { port },
        id,
    }))
}

/// A cluster map reply read by [`each_shard`] or [`each_slot_range`]: not its shape (what
/// is wrong), or the caller's own error.
enum Walk<E> {
    Shape(&'static str),
    Caller(E),
}

/// The shards of a `CLUSTER SHARDS` reply (RESP2 or RESP3), one call of `f` each: its slot
/// ranges as given (unchecked) and its online primary (`None`: none online, a failover
/// under way; the last where a reply names two). `tls`: a node's `tls-port` where it has
/// one. Shared by discovery ([`parse_shards`]) and refresh (`ShardMux`, no allocation).
fn each_shard<'a, E>(
    reply: &Frame<'a>,
    tls: bool,
    mut f: impl FnMut(&[(i64, i64)], Option<Primary<'a>>) -> Result<(), E>,
) -> Result<(), Walk<E>> {
    let Frame::Aggregate(shards) = reply else {
        return Err(Walk::Shape("CLUSTER SHARDS is not an array"));
    };
    let mut ranges: smallvec::SmallVec<[(i64, i64); 8]> = smallvec::SmallVec::new();
    for shard in shards.iter() {
        let fields = pairs(&shard).ok_or(Walk::Shape("a shard is not a map"))?;
        ranges.clear();
        let mut primary = None;
        for (k, v) in fields {
            match text(&k) {
                Some(b"slots") => {
                    let Frame::Aggregate(a) = v else {
                        return Err(Walk::Shape("slots is not an array"));
                    };
                    let mut it = a.iter();
                    while let Some(s) = it.next() {
                        let e = it.next().ok_or(Walk::Shape("an odd slot list"))?;
                        let (Some(s), Some(e)) = (int(&s), int(&e)) else {
                            return Err(Walk::Shape("a slot that is not a number"));
                        };
                        ranges.push((s, e));
                    }
                }
                Some(b"nodes") => {
                    let Frame::Aggregate(nodes) = v else {
                        return Err(Walk::Shape("nodes is not an array"));
                    };
                    for node in nodes.iter() {
                        if let Some(p) = online_primary(&node, tls)
                            .map_err(|()| Walk::Shape("a node is not a map"))?
                        {
                            primary = Some(p);
                        }
                    }
                }
                _ => {}
            }
        }
        f(&ranges, primary).map_err(Walk::Caller)?;
    }
    Ok(())
}

/// The ranges of a `CLUSTER SLOTS` reply, one call of `f` each: start and end (unchecked),
/// and its primary's host (`?` when the reply has none), port (if a number) and id.
fn each_slot_range<'a, E>(
    reply: &Frame<'a>,
    mut f: impl FnMut(i64, i64, &'a [u8], Option<i64>, Option<&'a [u8]>) -> Result<(), E>,
) -> Result<(), Walk<E>> {
    let Frame::Aggregate(entries) = reply else {
        return Err(Walk::Shape("CLUSTER SLOTS is not an array"));
    };
    for entry in entries.iter() {
        let Frame::Aggregate(e) = entry else {
            return Err(Walk::Shape("a slot range is not an array"));
        };
        let mut it = e.iter();
        let (Some(s), Some(end), Some(Frame::Aggregate(node))) = (
            it.next().as_ref().and_then(int),
            it.next().as_ref().and_then(int),
            it.next(),
        ) else {
            return Err(Walk::Shape("a slot range without its primary"));
        };
        let mut n = node.iter();
        let host = n.next().as_ref().and_then(text).unwrap_or(b"?");
        let port = n.next().as_ref().and_then(int);
        let id = n.next().as_ref().and_then(text);
        f(s, end, host, port, id).map_err(Walk::Caller)?;
    }
    Ok(())
}

impl From<Walk<MapError>> for MapError {
    fn from(w: Walk<MapError>) -> MapError {
        match w {
            Walk::Shape(what) => MapError::Shape(what),
            Walk::Caller(e) => e,
        }
    }
}

/// A primary's port as a map holds it: a nonzero `u16`.
fn primary_port(port: Option<i64>) -> Result<u16, MapError> {
    port.and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or(MapError::Shape("a primary without a port"))
}

/// Parse a `CLUSTER SHARDS` reply (RESP2 or RESP3): every shard with slots and an
/// online primary. `tls`: take a node's `tls-port` where it has one.
pub(crate) fn parse_shards(reply: &Frame<'_>, tls: bool) -> Result<Vec<ShardInfo>, MapError> {
    let mut out = Vec::new();
    each_shard(reply, tls, |ranges, primary| {
        let ranges = ranges
            .iter()
            .map(|&(s, e)| range(s, e))
            .collect::<Result<Vec<_>, _>>()?;
        // A shard without slots (a new, empty primary) or without an online primary (a
        // failover under way) serves nothing now: its slots, if any, stay unmapped and
        // their requests fail until the next refresh.
        let Some(p) = primary.filter(|_| !ranges.is_empty()) else {
            return Ok(());
        };
        out.push(ShardInfo {
            primary: NodeAddr {
                host: endpoint_host(p.host)?,
                port: primary_port(p.port)?,
            },
            node_id: p.id.and_then(node_id),
            ranges,
        });
        Ok(())
    })?;
    Ok(out)
}

/// Parse a `CLUSTER SLOTS` reply: `[start, end, [host, port, id, ...], replicas...]` per
/// range, merged by primary.
pub(crate) fn parse_slots(reply: &Frame<'_>) -> Result<Vec<ShardInfo>, MapError> {
    let mut out: Vec<ShardInfo> = Vec::new();
    each_slot_range(reply, |s, end, host, port, id| {
        let r = range(s, end)?;
        let primary = NodeAddr {
            host: endpoint_host(if host.is_empty() { b"?" } else { host })?,
            port: primary_port(port)?,
        };
        match out.iter_mut().find(|sh| sh.primary == primary) {
            Some(sh) => sh.ranges.push(r),
            None => out.push(ShardInfo {
                primary,
                node_id: id.and_then(node_id),
                ranges: vec![r],
            }),
        }
        Ok(())
    })?;
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
    #[cfg(test)]
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

// ---- One ordered stream over the shards --------------------------------------------------

/// Why a refreshed map was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refresh {
    /// It names a primary this layer has no connection to: connect again.
    Unknown,
    /// It does not make sense (a bad range, a slot claimed twice): the map stays.
    Bad,
}

impl From<Walk<Refresh>> for Refresh {
    fn from(w: Walk<Refresh>) -> Refresh {
        match w {
            Walk::Shape(_) => Refresh::Bad,
            Walk::Caller(r) => r,
        }
    }
}

/// A cluster master's lock connection as the rounds see it: one ordered stream of
/// requests and replies, carried over one connection per shard primary.
///
/// Design (issue 22): the rounds, the tally, the amnesia guard and every rule stay as they
/// are for a standalone master; this layer sits between a cluster master's lock link and
/// its shard sockets. It reads the requests the rounds queued (their own bytes, whole
/// RESP commands), sends each keyed request to the shard serving its slot, keyless ones
/// (`AUTH`, `SCRIPT LOAD`, `INFO`, `CONFIG GET`, `HELLO`, `CLIENT TRACKING`) to every shard,
/// and hands the replies back **in request order** (a reply from a quick shard waits for
/// the replies to the requests sent before it): the rounds read one master's answers as
/// they always do. What it decides itself:
///
/// - a keyed request whose keys lie in several slots is answered `-CROSSSLOT` at once (the
///   master votes no: multi-resource locks group their names by slot before this layer),
///   one whose slot no shard serves `-CLUSTERDOWN`;
/// - a `-MOVED` to a shard it knows: the slot's owner is updated and the request resent
///   there once (its second answer stands); a `-ASK`: `ASKING` and the request to that
///   shard, once, the map unchanged. A redirection to a node it does not know is passed on
///   (a no vote) and [`ShardMux::stale`] says the connection should be made again (a new
///   map, and a handshake on every shard);
/// - replies of a request sent to every shard are merged: the first error, else the first
///   reply; `INFO` as the smallest uptime and a `run_id` that changes when any shard's
///   does (so the amnesia guard treats a failover as the restart it is: a promoted replica
///   may lack the latest grants); `CONFIG GET append*` durable only if every shard is;
/// - `CLIENT CACHING YES` goes to the shard of the request after it (tracking arms the
///   next read on the same connection);
/// - pushes (client-side tracking's invalidations) are passed on as they come, between
///   replies.
///
/// No allocation once warm: the buffers of finished requests are reused.
pub(crate) struct ShardMux {
    map: SlotMap,
    shards: Vec<ShardLink>,
    /// Requests in flight, in the order the rounds sent them; `entries[0]` has number
    /// `first_seq`.
    entries: std::collections::VecDeque<Entry>,
    first_seq: u64,
    /// Buffers of finished entries, for the next ones: requests', answers'.
    spare: Vec<Vec<u8>>,
    spare_replies: Vec<Vec<u8>>,
    /// Replies in order, for the lock link's input.
    ready: Vec<u8>,
    /// A `CLIENT CACHING` waiting for the request it goes with: its entry's number.
    sticky: Option<u64>,
    /// A request rewritten without the old fencing counters (reused).
    scratch: Vec<u8>,
    /// The owner table a refresh reads into (reused).
    spare_owner: Box<[u16]>,
    /// A redirection named a node outside the map.
    stale: bool,
    /// Per slot: requests in flight that were sent to the shard `value >> 16` (count in
    /// the low 16 bits). While some are, the slot's next requests go there too, whatever
    /// the map says since ([`ShardMux::shard_for`]).
    inflight: Box<[u32]>,
    limits: crate::resp::Limits,
    /// A refresh of the map is on its way; it asks `CLUSTER SLOTS` (the server knew no
    /// `CLUSTER SHARDS`); `tls`: a node's `tls-port` is its port.
    refreshing: bool,
    slots_only: bool,
    tls: bool,
}

/// Requests in flight a cluster master's stream has room and buffers for from the start
/// (about 300 KiB): as many as a master lagging behind the quorum's rounds keeps unanswered
/// before the tables grow (a loaded machine reached 150 in a test). Past it, a warm
/// operation may allocate, once per new high.
const SPARE_ENTRIES: usize = 512;
/// Bytes each request buffer holds from the start (a release declares its key's line and
/// liveness set: some 150 bytes with a short key; a longer one grows its buffer once), and
/// each answer buffer.
const SPARE_BYTES: usize = 512;
const SPARE_REPLY_BYTES: usize = 64;

/// One shard primary's connection, as far as this layer goes: what to write, and which
/// entries its replies answer, in order.
pub(crate) struct ShardLink {
    pub addr: NodeAddr,
    /// Bytes to write to the shard.
    pub out: Vec<u8>,
    expect: std::collections::VecDeque<Expect>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Entry(u64),
    /// The answer of group `group` of a request split by slot.
    Part {
        seq: u64,
        group: u16,
    },
    /// The `+OK` to an `ASKING` sent ahead of a redirected request.
    Asking,
    /// The answer to a refresh of the map ([`ShardMux::refresh`]).
    Refresh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Merge {
    /// Sent to one shard.
    One,
    /// Every shard: the first error, else the first reply.
    First { error: bool },
    /// Every shard's `INFO server`, merged.
    Info {
        uptime: u64,
        run_id: [u8; 20],
        ok: bool,
    },
    /// Every shard's `CONFIG GET append*`: a reply that is not durable wins.
    Durable { durable: bool },
    /// A request whose keys lie in several slots, sent as one request per slot group.
    Split(Split),
}

/// How the answers of a request split by slot make one (see [`ShardMux`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SplitKind {
    /// The all-or-nothing acquire (`ACQUIRE_MANY`): 1 when every group set its keys, 0
    /// when none did, an error when some did (the master may hold keys: the rounds release
    /// there, as after any script error).
    AllOrNothing,
    /// `RELEASE`: 1 when every group answered 1, else 0.
    AllOnes,
    /// `FENCE_RAISE`: as `AllOnes`; its `ARGV[3]` is the group's number of lock keys.
    Raise,
    /// `EXTEND`: 0 when a group answered 0 (not held), else 2 when one answered 2 (a key
    /// missing), else 1.
    Extend,
    /// The waiting acquire (`ACQUIRE_WAIT`): 0 when every group set its keys; the longest
    /// TTL left (-1: one never expires) when none did; an error when some did.
    Wait,
    /// `FENCE_DRAW`: 0 when a group answered 0 (not held), else the largest; its `ARGV[2]`
    /// is the group's number of lock keys.
    Draw,
    /// `MGET`: the values, in the order of the keys.
    Mget,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    kind: SplitKind,
    /// Groups that answered 0 (or, `Wait`: a TTL), 1 (`Wait`: 0, set), 2.
    zeros: u16,
    ones: u16,
    twos: u16,
    /// The largest answer (`Wait`: TTL left; -1 wins), and whether one was -1.
    max: i64,
    forever: bool,
    /// A group answered with an error or an answer that fits no group: the first is the
    /// answer.
    error: bool,
}

struct Entry {
    /// Shard replies still expected.
    parts: u16,
    merge: Merge,
    /// A keyed request's bytes (resent after a redirection).
    req: Vec<u8>,
    /// The answer, once every part is in.
    reply: Vec<u8>,
    redirected: bool,
    /// A split request's groups.
    groups: Vec<Group>,
    /// The slot of a keyed request counted in flight ([`ShardMux::shard_for`]) until its
    /// answer.
    slot: Option<u16>,
}

/// One slot group of a split request.
struct Group {
    /// `MGET`: the positions of the group's keys in the whole request.
    keys: Vec<usize>,
    /// `MGET`: the group's answer.
    reply: Vec<u8>,
    /// The group's request (sent again after a redirection).
    req: Vec<u8>,
    redirected: bool,
    /// Sent again with `EVAL` after its shard answered `-NOSCRIPT` ([`ShardMux::reload`]).
    evaled: bool,
    /// The group's slot, counted in flight until its answer (`None` once answered).
    slot: Option<u16>,
}

/// What the shards sent that this layer can not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MuxError {
    /// A reply that does not parse.
    Protocol(crate::resp::Error),
    /// A reply no request was waiting for.
    Unexpected,
}

const CROSSSLOT: &[u8] =
    b"-CROSSSLOT Keys in request don't hash to the same slot (redlock-mux)\r\n";
const UNSERVED: &[u8] = b"-CLUSTERDOWN Hash slot not served (redlock-mux: no shard in the map)\r\n";

/// Where a request goes.
enum Route {
    Slot(u16),
    All(Merge),
    Sticky,
    Local(&'static [u8]),
    /// Keys in several slots: one request per slot group ([`ShardMux::push_split`]).
    Cross,
}

/// The route of one request (the rounds' own bytes: an array of bulk strings).
fn route(req: &crate::resp::Aggregate<'_>) -> Route {
    let mut it = req.iter();
    let name = it.next().as_ref().and_then(text).unwrap_or_default();
    let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
    let mut keys = SlotOf::default();
    if is(b"SET") || is(b"GET") || is(b"PTTL") {
        keys.add(it.next().as_ref().and_then(text));
    } else if is(b"MGET") || is(b"DEL") || is(b"EXISTS") {
        for k in it {
            keys.add(text(&k));
        }
    } else if is(b"EVALSHA") || is(b"EVAL") {
        let _script = it.next();
        let n = it.next().as_ref().and_then(int).unwrap_or(0);
        for _ in 0..n.max(0) {
            keys.add(it.next().as_ref().and_then(text));
        }
    } else if is(b"CLIENT") {
        let sub = it.next().as_ref().and_then(text).unwrap_or_default();
        if sub.eq_ignore_ascii_case(b"CACHING") {
            return Route::Sticky;
        }
        return Route::All(Merge::First { error: false });
    } else if is(b"INFO") {
        return Route::All(Merge::Info {
            uptime: u64::MAX,
            run_id: [0; 20],
            ok: true,
        });
    } else if is(b"CONFIG") {
        return Route::All(Merge::Durable { durable: true });
    } else {
        return Route::All(Merge::First { error: false });
    }
    match keys {
        SlotOf {
            slot: Some(s),
            cross: false,
        } => Route::Slot(s),
        SlotOf { cross: true, .. } if is(b"EVALSHA") || is(b"EVAL") || is(b"MGET") => Route::Cross,
        SlotOf { cross: true, .. } => Route::Local(CROSSSLOT),
        // No key: any shard answers alike.
        SlotOf { slot: None, .. } => Route::Slot(0),
    }
}

/// A script request declaring old fencing counters (`EVALSHA`/`EVAL` with a key of
/// [`crate::scripts::OLD_FENCE_PREFIX`]).
fn has_old_counters(cmd: &crate::resp::Aggregate<'_>) -> bool {
    let mut it = cmd.iter();
    let name = it.next().as_ref().and_then(text).unwrap_or_default();
    if !(name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")) {
        return false;
    }
    let _script = it.next();
    let n = it.next().as_ref().and_then(int).unwrap_or(0).max(0);
    it.take(n as usize)
        .any(|k| text(&k).is_some_and(|k| k.starts_with(crate::scripts::OLD_FENCE_PREFIX)))
}

/// `cmd` (a script request) into `out` without its keys of the old fencing counters.
fn without_old_counters(cmd: &crate::resp::Aggregate<'_>, out: &mut Vec<u8>) {
    let args: smallvec::SmallVec<[&[u8]; 16]> =
        cmd.iter().map(|f| text(&f).unwrap_or_default()).collect();
    let n = args
        .get(2)
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0)
        .min(args.len().saturating_sub(3));
    let keys = &args[3..3 + n];
    let kept = keys
        .iter()
        .filter(|k| !k.starts_with(crate::scripts::OLD_FENCE_PREFIX))
        .count();
    let mut v: smallvec::SmallVec<[crate::resp::Arg<'_>; 16]> = smallvec::SmallVec::new();
    v.push(crate::resp::Arg::Bytes(args[0]));
    v.push(crate::resp::Arg::Bytes(args[1]));
    v.push(crate::resp::Arg::Uint(kept as u64));
    v.extend(
        keys.iter()
            .filter(|k| !k.starts_with(crate::scripts::OLD_FENCE_PREFIX))
            .map(|k| crate::resp::Arg::Bytes(k)),
    );
    v.extend(args[3 + n..].iter().map(|a| crate::resp::Arg::Bytes(a)));
    crate::resp::encode_command(out, &v);
}

#[derive(Default)]
struct SlotOf {
    slot: Option<u16>,
    cross: bool,
}

impl SlotOf {
    fn add(&mut self, key: Option<&[u8]>) {
        let Some(k) = key else { return };
        let s = crate::slot::key_slot(k);
        match self.slot {
            None => self.slot = Some(s),
            Some(t) if t != s => self.cross = true,
            _ => {}
        }
    }
}

/// Hex digit's value (the `run_id` is 40 lowercase hex digits).
fn nibble(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

impl ShardMux {
    pub(crate) fn new(map: SlotMap, limits: crate::resp::Limits) -> ShardMux {
        let shards = map
            .shards()
            .iter()
            .map(|s| ShardLink {
                addr: s.primary.clone(),
                out: Vec::with_capacity(4096),
                expect: std::collections::VecDeque::with_capacity(SPARE_ENTRIES),
            })
            .collect();
        ShardMux {
            map,
            shards,
            entries: std::collections::VecDeque::with_capacity(SPARE_ENTRIES),
            first_seq: 0,
            // Buffers for the requests in flight and their answers, made here: how many are
            // in flight depends on when the replies come (a round decided before a late
            // master answered), and a warm operation must not allocate.
            spare_replies: (0..SPARE_ENTRIES)
                .map(|_| Vec::with_capacity(SPARE_REPLY_BYTES))
                .collect(),
            spare: (0..SPARE_ENTRIES)
                .map(|_| Vec::with_capacity(SPARE_BYTES))
                .collect(),
            ready: Vec::with_capacity(4096),
            sticky: None,
            scratch: Vec::new(),
            // Made here: a refresh allocates nothing.
            spare_owner: vec![SlotMap::NONE; SLOTS].into_boxed_slice(),
            stale: false,
            inflight: vec![0; SLOTS].into_boxed_slice(),
            limits,
            refreshing: false,
            slots_only: false,
            tls: false,
        }
    }

    /// How the map is asked for again ([`ShardMux::refresh`]): `CLUSTER SLOTS` where the
    /// discovery had to, and the TLS ports where the client speaks TLS.
    pub(crate) fn set_refresh(&mut self, slots_only: bool, tls: bool) {
        self.slots_only = slots_only;
        self.tls = tls;
    }

    /// Ask the first shard for the map again, unless a refresh is on its way. Its answer
    /// moves slots between the shards this layer knows (the slots a migration the client
    /// never heard of moved: no `-MOVED` round trip for them any more); a map naming a
    /// primary it does not know makes the connection [`stale`](ShardMux::stale).
    pub(crate) fn refresh(&mut self) {
        if self.refreshing || self.shards.is_empty() {
            return;
        }
        self.refreshing = true;
        let sub: &[u8] = if self.slots_only { b"SLOTS" } else { b"SHARDS" };
        let sh = &mut self.shards[0];
        crate::resp::encode_command(
            &mut sh.out,
            &[
                crate::resp::Arg::Bytes(b"CLUSTER"),
                crate::resp::Arg::Bytes(sub),
            ],
        );
        sh.expect.push_back(Expect::Refresh);
    }

    /// The first shard's answer to a refresh: read into a second owner table (kept for
    /// the next refresh: no allocation once warm), swapped in when the whole answer made
    /// sense.
    fn refreshed(&mut self, frame: &Frame<'_>) {
        self.refreshing = false;
        // Refused (an ACL without CLUSTER, a node loading): the map stays.
        if !matches!(frame, Frame::Aggregate(_)) {
            return;
        }
        let mut owner = std::mem::take(&mut self.spare_owner);
        if owner.len() == SLOTS {
            owner.fill(SlotMap::NONE);
        } else {
            owner = vec![SlotMap::NONE; SLOTS].into_boxed_slice();
        }
        let read = if self.slots_only {
            self.owner_from_slots(frame, &mut owner)
        } else {
            self.owner_from_shards(frame, &mut owner)
        };
        match read {
            Ok(()) => std::mem::swap(&mut self.map.owner, &mut owner),
            Err(Refresh::Unknown) => self.stale = true,
            Err(Refresh::Bad) => {}
        }
        self.spare_owner = owner;
    }

    /// Which known shard is the primary at `host` (empty or `?`: the first shard's host)
    /// and `port`.
    fn known(&self, host: &[u8], port: i64) -> Option<usize> {
        let host = if host.is_empty() || host == b"?" {
            self.shards.first()?.addr.host.as_bytes()
        } else {
            host
        };
        self.shards
            .iter()
            .position(|s| s.addr.host.as_bytes() == host && i64::from(s.addr.port) == port)
    }

    fn claim(owner: &mut [u16], start: i64, end: i64, k: usize) -> Result<(), Refresh> {
        let (s, e) = range(start, end).map_err(|_| Refresh::Bad)?;
        for o in &mut owner[s as usize..=e as usize] {
            if *o != SlotMap::NONE {
                return Err(Refresh::Bad);
            }
            *o = k as u16;
        }
        Ok(())
    }

    /// A `CLUSTER SHARDS` answer into `owner`, by the shards this layer knows.
    fn owner_from_shards(&self, reply: &Frame<'_>, owner: &mut [u16]) -> Result<(), Refresh> {
        each_shard(reply, self.tls, |ranges, primary| {
            // A shard without an online primary serves nothing now (as at discovery).
            let Some(p) = primary else { return Ok(()) };
            let k = self
                .known(p.host, p.port.ok_or(Refresh::Bad)?)
                .ok_or(Refresh::Unknown)?;
            ranges
                .iter()
                .try_for_each(|&(s, e)| Self::claim(owner, s, e, k))
        })
        .map_err(Refresh::from)
    }

    /// A `CLUSTER SLOTS` answer into `owner`, by the shards this layer knows.
    fn owner_from_slots(&self, reply: &Frame<'_>, owner: &mut [u16]) -> Result<(), Refresh> {
        each_slot_range(reply, |s, end, host, port, _| {
            let k = self
                .known(host, port.ok_or(Refresh::Bad)?)
                .ok_or(Refresh::Unknown)?;
            Self::claim(owner, s, end, k)
        })
        .map_err(Refresh::from)
    }

    pub(crate) fn shards(&mut self) -> &mut [ShardLink] {
        &mut self.shards
    }

    /// A redirection named a node the map does not have: make the connection again.
    pub(crate) fn stale(&self) -> bool {
        self.stale
    }

    /// Replies in request order, for the lock link's input (the caller takes them).
    pub(crate) fn ready(&mut self) -> &mut Vec<u8> {
        &mut self.ready
    }

    /// Requests still unanswered.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.entries.len()
    }

    fn buf(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    fn reply_buf(&mut self) -> Vec<u8> {
        self.spare_replies.pop().unwrap_or_default()
    }

    fn entry_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let i = seq.checked_sub(self.first_seq)?;
        self.entries.get_mut(i as usize)
    }

    /// Take the rounds' requests (whole commands, as the lock link queued them) and queue
    /// each on its shard. Returns how many bytes were taken (a command cut short waits).
    pub(crate) fn submit(&mut self, bytes: &[u8]) -> usize {
        let mut used = 0;
        while used < bytes.len() {
            let rest = &bytes[used..];
            let Ok(crate::resp::Status::Complete((Frame::Aggregate(cmd), len))) =
                crate::resp::parse(rest, &self.limits)
            else {
                break;
            };
            let one = &rest[..len];
            used += len;
            if has_old_counters(&cmd) {
                // The old fencing counters (`scripts::OLD_FENCE_PREFIX`) a script declares
                // for the masters upgraded from the layout before: in another slot, and never
                // on a cluster (fencing never ran on one then). The request without them.
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                without_old_counters(&cmd, &mut scratch);
                if let Ok(crate::resp::Status::Complete((Frame::Aggregate(cmd), _))) =
                    crate::resp::parse(&scratch, &self.limits)
                {
                    self.route_one(&cmd, &scratch);
                }
                self.scratch = scratch;
                continue;
            }
            self.route_one(&cmd, one);
        }
        used
    }

    fn route_one(&mut self, cmd: &crate::resp::Aggregate<'_>, req: &[u8]) {
        let route = route(cmd);
        if let Route::Cross = route {
            self.push_split(cmd, req);
        } else {
            self.push(route, req);
        }
    }

    fn push(&mut self, route: Route, req: &[u8]) {
        let seq = self.first_seq + self.entries.len() as u64;
        // A `CLIENT CACHING` goes with the next keyed request; before anything else (never
        // sent so by the rounds), to the first shard, so that it never holds the line.
        let keyed = matches!(route, Route::Slot(s) if self.map.shard_of(s).is_some());
        if !keyed && !matches!(route, Route::Sticky) && !self.shards.is_empty() {
            self.place_sticky(0);
        }
        let mut entry = Entry {
            parts: 0,
            merge: Merge::One,
            req: self.buf(),
            reply: self.reply_buf(),
            redirected: false,
            groups: Vec::new(),
            slot: None,
        };
        match route {
            Route::Local(reply) => entry.reply.extend_from_slice(reply),
            // Split in `push_split`, never here.
            Route::Cross => entry.reply.extend_from_slice(CROSSSLOT),
            Route::Sticky => {
                // Sent with the next keyed request, to its shard.
                entry.parts = 1;
                entry.req.extend_from_slice(req);
                self.sticky = Some(seq);
            }
            Route::All(merge) => {
                entry.merge = merge;
                entry.parts = self.shards.len() as u16;
                for sh in &mut self.shards {
                    sh.out.extend_from_slice(req);
                    sh.expect.push_back(Expect::Entry(seq));
                }
                if self.shards.is_empty() {
                    entry.reply.extend_from_slice(UNSERVED);
                }
            }
            Route::Slot(slot) => match self.shard_for(slot) {
                Some(k) => {
                    entry.parts = 1;
                    entry.req.extend_from_slice(req);
                    entry.slot = Some(slot);
                    self.count_in(slot, k);
                    self.place_sticky(k);
                    self.shards[k].out.extend_from_slice(req);
                    self.shards[k].expect.push_back(Expect::Entry(seq));
                }
                None => entry.reply.extend_from_slice(UNSERVED),
            },
        }
        self.entries.push_back(entry);
        self.drain();
    }

    /// Shard `k` sent `input`: take every complete reply; returns the bytes taken.
    pub(crate) fn received(&mut self, k: usize, input: &[u8]) -> Result<usize, MuxError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            if rest.is_empty() {
                break;
            }
            let (frame, len) = match crate::resp::parse(rest, &self.limits) {
                Ok(crate::resp::Status::Complete(c)) => c,
                Ok(crate::resp::Status::Partial(_)) => break,
                Err(e) => return Err(MuxError::Protocol(e)),
            };
            let raw = &rest[..len];
            used += len;
            if let Frame::Aggregate(a) = &frame {
                if a.kind() == crate::resp::AggregateKind::Push {
                    // Out of band (tracking's invalidations): on to the rounds as it came.
                    self.ready.extend_from_slice(raw);
                    continue;
                }
            }
            let Some(expect) = self.shards.get_mut(k).and_then(|s| s.expect.pop_front()) else {
                return Err(MuxError::Unexpected);
            };
            match expect {
                Expect::Entry(seq) => self.answer(k, seq, &frame, raw),
                Expect::Part { seq, group } => self.answer_part(k, seq, group, &frame, raw),
                // ASKING's answer: the request behind it answers for itself.
                Expect::Asking => {}
                Expect::Refresh => self.refreshed(&frame),
            }
        }
        self.drain();
        Ok(used)
    }

    /// A redirection (`-MOVED`, `-ASK`) shard `k` answered to request `seq` (`group`: one
    /// slot group of a split request): sent again where it now lives, once. Whether it was;
    /// if not, the answer stands (a second redirection; a node outside the map, which also
    /// makes the connection [`stale`](ShardMux::stale)).
    fn follow(&mut self, k: usize, seq: u64, group: Option<u16>, frame: &Frame<'_>) -> bool {
        let Frame::Error(e) = frame else { return false };
        let Some(redirect) = parse_redirect(e) else {
            return false;
        };
        let asked = self.shards[k].addr.host.clone();
        let (ask, slot, to) = match redirect {
            Redirect::Moved { slot, to } => (false, slot, to.or_host(&asked)),
            Redirect::Ask { slot, to } => (true, slot, to.or_host(&asked)),
        };
        let target = self.shards.iter().position(|s| s.addr == to);
        let first = self.entry_mut(seq).is_some_and(|e| match group {
            None => e.merge == Merge::One && !e.redirected,
            Some(g) => e.groups.get(g as usize).is_some_and(|g| !g.redirected),
        });
        let j = match (first, target) {
            (true, Some(j)) => j,
            (true, None) => {
                self.stale = true;
                return false;
            }
            _ => return false,
        };
        if !ask {
            self.map.moved(slot, &to);
        }
        let Some(e) = self.entry_mut(seq) else {
            return false;
        };
        let req = match group {
            None => {
                e.redirected = true;
                std::mem::take(&mut e.req)
            }
            Some(g) => {
                let g = &mut e.groups[g as usize];
                g.redirected = true;
                std::mem::take(&mut g.req)
            }
        };
        let sh = &mut self.shards[j];
        if ask {
            crate::resp::encode_command(&mut sh.out, &[crate::resp::Arg::Bytes(b"ASKING")]);
            sh.expect.push_back(Expect::Asking);
        }
        sh.out.extend_from_slice(&req);
        sh.expect.push_back(match group {
            None => Expect::Entry(seq),
            Some(group) => Expect::Part { seq, group },
        });
        if let Some(e) = self.entry_mut(seq) {
            match group {
                None => e.req = req,
                Some(g) => e.groups[g as usize].req = req,
            }
        }
        true
    }

    fn answer(&mut self, k: usize, seq: u64, frame: &Frame<'_>, raw: &[u8]) {
        // A redirection of a keyed request, the first time: resend it where it now lives.
        if self.follow(k, seq, None, frame) {
            return;
        }
        if let Some(slot) = self.entry_mut(seq).and_then(|e| e.slot.take()) {
            self.count_out(slot);
        }
        let n_shards = self.shards.len();
        let Some(entry) = self.entry_mut(seq) else {
            return;
        };
        entry.parts = entry.parts.saturating_sub(1);
        match &mut entry.merge {
            // A split request's groups answer as parts (`answer_part`).
            Merge::One | Merge::Split(_) => {
                entry.reply.clear();
                entry.reply.extend_from_slice(raw);
            }
            Merge::First { error } => {
                let is_error = frame.is_error();
                if entry.reply.is_empty() || (is_error && !*error) {
                    entry.reply.clear();
                    entry.reply.extend_from_slice(raw);
                    *error |= is_error;
                }
            }
            Merge::Durable { durable } => {
                let this = match frame {
                    Frame::Aggregate(a) => super::link::config_is_durable(a),
                    _ => false,
                };
                if entry.reply.is_empty() || (*durable && !this) {
                    entry.reply.clear();
                    entry.reply.extend_from_slice(raw);
                    *durable = this;
                }
            }
            Merge::Info { uptime, run_id, ok } => {
                let info = match frame {
                    Frame::Bulk(t) | Frame::Verbatim { text: t, .. } => super::link::parse_info(t),
                    _ => None,
                };
                match info {
                    // The merged text has no `valkey_version`: a cluster master is sent
                    // no `DELIFEQ` (its releases keep the script).
                    Some(info) if *ok => {
                        *uptime = (*uptime).min(info.uptime);
                        for (acc, pair) in run_id.iter_mut().zip(info.run_id.chunks(2)) {
                            *acc ^= nibble(pair[0]) << 4 | nibble(pair[1]);
                        }
                    }
                    _ => {
                        if *ok {
                            // The first reply that is no INFO answers for all.
                            *ok = false;
                            entry.reply.clear();
                            entry.reply.extend_from_slice(raw);
                        }
                    }
                }
                if entry.parts == 0 && *ok {
                    let mut hex = [0u8; 40];
                    const DIGITS: &[u8; 16] = b"0123456789abcdef";
                    for (i, b) in run_id.iter().enumerate() {
                        hex[2 * i] = DIGITS[(b >> 4) as usize];
                        hex[2 * i + 1] = DIGITS[(b & 15) as usize];
                    }
                    let body = format!(
                        "# Server (redlock-mux: {} shards merged)\r\nrun_id:{}\r\nuptime_in_seconds:{}\r\n",
                        n_shards,
                        std::str::from_utf8(&hex).unwrap_or_default(),
                        uptime
                    );
                    entry.reply.clear();
                    crate::resp::encode_frame(&mut entry.reply, &Frame::Bulk(body.as_bytes()));
                }
            }
        }
    }

    /// A request whose keys lie in several slots (a multi-resource lock on a cluster): one
    /// request per slot group, each to its shard, their answers made one by the script's
    /// rule ([`SplitKind`]). A script this layer does not know is answered `-CROSSSLOT`.
    /// What is atomic: each group, on its shard; not the whole (docs/production.md).
    /// Redirections of a group are not followed: its answer is the error (a no vote).
    fn push_split(&mut self, cmd: &crate::resp::Aggregate<'_>, req: &[u8]) {
        let args: Vec<&[u8]> = cmd.iter().map(|f| text(&f).unwrap_or_default()).collect();
        let name = args.first().copied().unwrap_or_default();
        let mget = name.eq_ignore_ascii_case(b"MGET");
        let (first_key, nkeys) = if mget {
            (1, args.len().saturating_sub(1))
        } else {
            let n = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok())
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            (3, n.min(args.len().saturating_sub(3)))
        };
        // The script, and how many blocks its `KEYS` are made of: the fencing scripts take
        // the lock keys, then as many counters, the counter of the i-th key at `n + i` (a
        // group must hold both, or the script reads another block: found by the simulation
        // too, issue22_cluster_masters seed 0, fencing tokens that never rose). The fencing
        // scripts also take n, the number of lock keys, as an argument: each group's
        // request says its own.
        let kind = if mget {
            Some((SplitKind::Mget, 1))
        } else {
            let script = args.get(1).copied().unwrap_or_default();
            let is = |s: crate::scripts::Script| {
                if name.eq_ignore_ascii_case(b"EVALSHA") {
                    script.eq_ignore_ascii_case(s.sha.as_bytes())
                } else {
                    script == s.src.as_bytes()
                }
            };
            use crate::scripts::{
                ACQUIRE_MANY, ACQUIRE_WAIT, EXTEND, FENCE_DRAW, FENCE_RAISE, RELEASE, RELEASE_LEAN,
                RELEASE_PLAIN,
            };
            if is(ACQUIRE_MANY) {
                Some((SplitKind::AllOrNothing, 1))
            } else if is(RELEASE) {
                // The lock keys, their lines, their liveness sets.
                Some((SplitKind::AllOnes, 3))
            } else if is(RELEASE_PLAIN) || is(RELEASE_LEAN) {
                Some((SplitKind::AllOnes, 1))
            } else if is(FENCE_RAISE) {
                Some((SplitKind::Raise, 2))
            } else if is(EXTEND) {
                Some((SplitKind::Extend, 1))
            } else if is(ACQUIRE_WAIT) {
                Some((SplitKind::Wait, 1))
            } else if is(FENCE_DRAW) {
                Some((SplitKind::Draw, 2))
            } else {
                None
            }
        };
        // Slot groups in the order of their first key; within one, the keys' order.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, key) in args.iter().enumerate().skip(first_key).take(nkeys) {
            let slot = crate::slot::key_slot(key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        // Every group holds whole blocks: the keys at one position of every block.
        let whole = kind.is_some_and(|(_, blocks)| {
            let n = nkeys / blocks;
            nkeys % blocks == 0
                && groups.iter().all(|(_, g)| {
                    g.iter().all(|&i| {
                        (0..blocks).all(|b| g.contains(&(first_key + (i - first_key) % n + b * n)))
                    })
                })
        });
        let shards: Option<Vec<usize>> = groups.iter().map(|(s, _)| self.shard_for(*s)).collect();
        let (Some((kind, _)), Some(shards), true) = (kind, shards, whole) else {
            let reply = if kind.is_none() || !whole {
                CROSSSLOT
            } else {
                UNSERVED
            };
            return self.push(Route::Local(reply), req);
        };
        let seq = self.first_seq + self.entries.len() as u64;
        // A `CLIENT CACHING` before a split read goes to every group's shard.
        if let Some(c) = self.sticky.take() {
            let i = (c - self.first_seq) as usize;
            let mut to: Vec<usize> = shards.clone();
            to.sort_unstable();
            to.dedup();
            self.entries[i].parts = to.len() as u16;
            self.entries[i].merge = Merge::First { error: false };
            for &k in &to {
                let sh = &mut self.shards[k];
                sh.out.extend_from_slice(&self.entries[i].req);
                sh.expect.push_back(Expect::Entry(c));
            }
        }
        let mut entry = Entry {
            parts: groups.len() as u16,
            merge: Merge::Split(Split {
                kind,
                zeros: 0,
                ones: 0,
                twos: 0,
                max: 0,
                forever: false,
                error: false,
            }),
            req: self.buf(),
            reply: self.reply_buf(),
            redirected: true,
            groups: Vec::new(),
            slot: None,
        };
        for (g, ((_, keys), &k)) in groups.iter().zip(&shards).enumerate() {
            let count = keys.len().to_string();
            let mut line: Vec<crate::resp::Arg<'_>> = Vec::with_capacity(args.len());
            line.push(crate::resp::Arg::Bytes(name));
            if !mget {
                line.push(crate::resp::Arg::Bytes(args[1]));
                line.push(crate::resp::Arg::Bytes(count.as_bytes()));
            }
            line.extend(keys.iter().map(|&i| crate::resp::Arg::Bytes(args[i])));
            let n_at = match kind {
                SplitKind::Draw => Some(1),
                SplitKind::Raise => Some(2),
                _ => None,
            };
            let locks = (keys.len() / 2).to_string();
            for (j, a) in args[first_key + nkeys..].iter().enumerate() {
                if Some(j) == n_at {
                    line.push(crate::resp::Arg::Bytes(locks.as_bytes()));
                } else {
                    line.push(crate::resp::Arg::Bytes(a));
                }
            }
            let mut req = Vec::new();
            crate::resp::encode_command(&mut req, &line);
            let sh = &mut self.shards[k];
            sh.out.extend_from_slice(&req);
            sh.expect.push_back(Expect::Part {
                seq,
                group: g as u16,
            });
            entry.groups.push(Group {
                keys: if mget {
                    keys.iter().map(|i| i - first_key).collect()
                } else {
                    Vec::new()
                },
                reply: Vec::new(),
                req,
                redirected: false,
                evaled: false,
                slot: Some(groups[g].0),
            });
            self.count_in(groups[g].0, k);
        }
        self.entries.push_back(entry);
        self.drain();
    }

    /// A group of a split request that shard `k` answered `-NOSCRIPT` (its script cache
    /// was flushed) is sent again there with `EVAL` and the script's source, once; whether
    /// it was. The whole request must not be: the rounds would send every group again
    /// with `EVAL`, and a group that had already set its keys would then answer that they
    /// exist, a refusal, and the master would be left holding keys the client never knew
    /// of (found by the simulation: issue22_cluster_failover_amnesia_is_guarded seed 12, an
    /// `ACQUIRE_MANY` across two slots, a key left after every client shut down).
    fn reload(&mut self, k: usize, seq: u64, group: u16, frame: &Frame<'_>) -> bool {
        let Frame::Error(e) = frame else { return false };
        if !e.starts_with(b"NOSCRIPT") {
            return false;
        }
        let Some(g) = self
            .entry_mut(seq)
            .and_then(|e| e.groups.get_mut(group as usize))
        else {
            return false;
        };
        if g.evaled {
            return false;
        }
        // (Rare: a copy keeps the borrows simple.)
        let sent = g.req.clone();
        let Ok(crate::resp::Status::Complete((Frame::Aggregate(a), _))) =
            crate::resp::parse(&sent, &crate::resp::Limits::default())
        else {
            return false;
        };
        let args: Vec<&[u8]> = a
            .iter()
            .map(|f| match f {
                Frame::Bulk(b) => b,
                _ => &[][..],
            })
            .collect();
        let (Some(name), Some(sha)) = (args.first(), args.get(1)) else {
            return false;
        };
        let script = crate::scripts::ALL
            .iter()
            .chain(crate::scripts::ADMIN.iter())
            .find(|s| sha.eq_ignore_ascii_case(s.sha.as_bytes()));
        let (true, Some(script)) = (name.eq_ignore_ascii_case(b"EVALSHA"), script) else {
            return false;
        };
        let mut line: Vec<crate::resp::Arg<'_>> = Vec::with_capacity(args.len());
        line.push(crate::resp::Arg::Bytes(b"EVAL"));
        line.push(crate::resp::Arg::Bytes(script.src.as_bytes()));
        line.extend(args[2..].iter().map(|a| crate::resp::Arg::Bytes(a)));
        let mut req = Vec::new();
        crate::resp::encode_command(&mut req, &line);
        let sh = &mut self.shards[k];
        sh.out.extend_from_slice(&req);
        sh.expect.push_back(Expect::Part { seq, group });
        if let Some(g) = self
            .entry_mut(seq)
            .and_then(|e| e.groups.get_mut(group as usize))
        {
            g.evaled = true;
            g.req = req;
        }
        true
    }

    /// Group `group` of split request `seq` answered (from shard `k`). A redirection is
    /// followed once, as for a whole request (found by the simulation: a release group's
    /// `-MOVED` taken for its answer left the key until its TTL, issue22_cluster_masters
    /// seed 450).
    fn answer_part(&mut self, k: usize, seq: u64, group: u16, frame: &Frame<'_>, raw: &[u8]) {
        if self.follow(k, seq, Some(group), frame) || self.reload(k, seq, group, frame) {
            return;
        }
        if let Some(slot) = self
            .entry_mut(seq)
            .and_then(|e| e.groups.get_mut(group as usize))
            .and_then(|g| g.slot.take())
        {
            self.count_out(slot);
        }
        let Some(entry) = self.entry_mut(seq) else {
            return;
        };
        entry.parts = entry.parts.saturating_sub(1);
        let Merge::Split(sp) = &mut entry.merge else {
            return;
        };
        let fail = |sp: &mut Split, reply: &mut Vec<u8>, raw: &[u8]| {
            if !sp.error {
                sp.error = true;
                reply.clear();
                reply.extend_from_slice(raw);
            }
        };
        match sp.kind {
            SplitKind::Mget => match frame {
                Frame::Aggregate(_) => {
                    if let Some(g) = entry.groups.get_mut(group as usize) {
                        g.reply.extend_from_slice(raw);
                    }
                }
                _ => fail(sp, &mut entry.reply, raw),
            },
            kind => {
                // A waiting acquire's group of one key answers `[ttl, holder]`.
                let value = match frame {
                    Frame::Integer(v) => Some(*v),
                    Frame::Aggregate(a) if kind == SplitKind::Wait => {
                        a.iter().next().as_ref().and_then(int)
                    }
                    _ => None,
                };
                match value {
                    None => fail(sp, &mut entry.reply, raw),
                    Some(v) => {
                        match (kind, v) {
                            (SplitKind::Wait, 0) => sp.ones += 1,
                            (SplitKind::Wait, -1) => {
                                sp.zeros += 1;
                                sp.forever = true;
                            }
                            (SplitKind::Wait, v) => {
                                sp.zeros += 1;
                                sp.max = sp.max.max(v);
                            }
                            (_, 0) => sp.zeros += 1,
                            (_, 1) => sp.ones += 1,
                            (_, 2) => sp.twos += 1,
                            _ => {}
                        }
                        if v > sp.max && kind != SplitKind::Wait {
                            sp.max = v;
                        }
                    }
                }
            }
        }
        if entry.parts > 0 {
            return;
        }
        let Merge::Split(sp) = entry.merge else {
            return;
        };
        if sp.error {
            return; // the first error is the answer
        }
        const PARTIAL: &[u8] =
            b"-PARTIAL redlock-mux: some slot groups of a multi-resource lock were granted, others refused\r\n";
        let n = entry.groups.len().max(1) as u16;
        let int_reply = |v: i64| format!(":{v}\r\n");
        let reply: Option<String> = match sp.kind {
            SplitKind::AllOrNothing | SplitKind::Wait if sp.ones > 0 && sp.zeros > 0 => None,
            SplitKind::AllOrNothing => Some(int_reply(i64::from(sp.zeros == 0))),
            SplitKind::Wait if sp.zeros == 0 => Some(int_reply(0)),
            SplitKind::Wait => Some(int_reply(if sp.forever { -1 } else { sp.max.max(1) })),
            SplitKind::AllOnes | SplitKind::Raise => {
                Some(int_reply(i64::from(sp.zeros == 0 && sp.twos == 0)))
            }
            SplitKind::Extend if sp.zeros > 0 => Some(int_reply(0)),
            SplitKind::Extend => Some(int_reply(if sp.twos > 0 { 2 } else { 1 })),
            SplitKind::Draw if sp.zeros > 0 => Some(int_reply(0)),
            SplitKind::Draw => Some(int_reply(sp.max)),
            SplitKind::Mget => {
                let _ = n;
                let total: usize = entry.groups.iter().map(|g| g.keys.len()).sum();
                let mut values: Vec<Vec<u8>> = vec![b"$-1\r\n".to_vec(); total];
                for Group {
                    keys, reply: raw, ..
                } in &entry.groups
                {
                    let Ok(crate::resp::Status::Complete((Frame::Aggregate(a), _))) =
                        crate::resp::parse(raw, &crate::resp::Limits::default())
                    else {
                        continue;
                    };
                    for (pos, f) in keys.iter().zip(a.iter()) {
                        if let Some(v) = values.get_mut(*pos) {
                            v.clear();
                            crate::resp::encode_frame(v, &f);
                        }
                    }
                }
                entry.reply.clear();
                entry
                    .reply
                    .extend_from_slice(format!("*{total}\r\n").as_bytes());
                for v in values {
                    entry.reply.extend_from_slice(&v);
                }
                return;
            }
        };
        entry.reply.clear();
        match reply {
            Some(r) => entry.reply.extend_from_slice(r.as_bytes()),
            None => entry.reply.extend_from_slice(PARTIAL),
        }
    }

    /// Hand every entry whose answer is complete, from the oldest, to the rounds.
    fn drain(&mut self) {
        while self.entries.front().is_some_and(|e| e.parts == 0) {
            let mut e = self.entries.pop_front().expect("front checked");
            self.first_seq += 1;
            self.ready.extend_from_slice(&e.reply);
            e.req.clear();
            e.reply.clear();
            e.groups.clear();
            self.spare.push(e.req);
            self.spare_replies.push(e.reply);
        }
    }

    /// The shard a request for `slot` goes to: where the slot's requests still in flight
    /// went, else where the map says. Requests for one key are then answered in the order
    /// they were sent, across a move of their slot: an earlier one redirected (`-MOVED`,
    /// `-ASK`) is sent again before a later one goes to the new shard, which it would
    /// otherwise overtake (found by the simulation: a waiting acquire redirected after the
    /// map had changed landed behind its own release, and left its key until the TTL,
    /// issue22_cluster_masters_hot_resources_progress seed 497).
    fn shard_for(&self, slot: u16) -> Option<usize> {
        let f = self.inflight[slot as usize];
        if f & 0xffff != 0 {
            return Some((f >> 16) as usize);
        }
        self.map.shard_of(slot)
    }

    fn count_in(&mut self, slot: u16, k: usize) {
        let f = &mut self.inflight[slot as usize];
        let count = (*f & 0xffff).saturating_add(1).min(0xffff);
        *f = (k as u32) << 16 | count;
    }

    fn count_out(&mut self, slot: u16) {
        let f = &mut self.inflight[slot as usize];
        if *f & 0xffff != 0 {
            *f -= 1;
        }
    }

    /// A `CLIENT CACHING` still waiting for its request goes out now, to shard `k`.
    fn place_sticky(&mut self, k: usize) {
        let Some(c) = self.sticky.take() else { return };
        let i = (c - self.first_seq) as usize;
        let sh = &mut self.shards[k];
        sh.out.extend_from_slice(&self.entries[i].req);
        sh.expect.push_back(Expect::Entry(c));
    }
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

    // ---- ShardMux: three shards scripted in memory --------------------------------------

    fn addr(port: u16) -> NodeAddr {
        NodeAddr {
            host: "127.0.0.1".into(),
            port,
        }
    }

    fn three() -> ShardMux {
        let shard = |port, a, b| ShardInfo {
            primary: addr(port),
            node_id: None,
            ranges: vec![(a, b)],
        };
        let map = SlotMap::new(vec![
            shard(7000, 0, 5460),
            shard(7001, 5461, 10922),
            shard(7002, 10923, 16383),
        ])
        .unwrap();
        ShardMux::new(map, crate::resp::Limits::default())
    }

    /// A key served by shard `k` of [`three`], named `prefix` + a number.
    fn key_on(k: usize, prefix: &str) -> String {
        let range = [0..=5460u16, 5461..=10922, 10923..=16383][k].clone();
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|n| range.contains(&crate::slot::key_slot(n.as_bytes())))
            .unwrap()
    }

    fn cmd(args: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        let args: Vec<crate::resp::Arg<'_>> = args
            .iter()
            .map(|a| crate::resp::Arg::Bytes(a.as_bytes()))
            .collect();
        crate::resp::encode_command(&mut out, &args);
        out
    }

    fn take_out(m: &mut ShardMux, k: usize) -> Vec<u8> {
        std::mem::take(&mut m.shards()[k].out)
    }

    fn take_ready(m: &mut ShardMux) -> Vec<u8> {
        std::mem::take(m.ready())
    }

    fn reply(m: &mut ShardMux, k: usize, bytes: &[u8]) {
        assert_eq!(m.received(k, bytes), Ok(bytes.len()));
    }

    #[test]
    fn requests_go_to_their_shards_and_replies_come_back_in_order() {
        let mut m = three();
        let (a, b, c) = (key_on(0, "a"), key_on(1, "b"), key_on(2, "c"));
        let mut batch = cmd(&["SET", &a, "t", "NX", "PX", "100"]);
        batch.extend(cmd(&["SET", &b, "t", "NX", "PX", "100"]));
        batch.extend(cmd(&["EVALSHA", "sha", "1", &c, "t"]));
        // A command cut short waits for the rest.
        let cut = cmd(&["SET", &a, "u", "NX", "PX", "100"]);
        batch.extend_from_slice(&cut[..5]);
        assert_eq!(m.submit(&batch), batch.len() - 5);
        assert_eq!(
            take_out(&mut m, 0),
            cmd(&["SET", &a, "t", "NX", "PX", "100"])
        );
        assert_eq!(
            take_out(&mut m, 1),
            cmd(&["SET", &b, "t", "NX", "PX", "100"])
        );
        assert_eq!(take_out(&mut m, 2), cmd(&["EVALSHA", "sha", "1", &c, "t"]));
        // The third shard answers first: held until the first two have.
        reply(&mut m, 2, b":1\r\n");
        reply(&mut m, 1, b"$-1\r\n");
        assert!(take_ready(&mut m).is_empty());
        // A reply in two reads.
        assert_eq!(m.received(0, b"+O"), Ok(0));
        reply(&mut m, 0, b"+OK\r\n");
        assert_eq!(take_ready(&mut m), b"+OK\r\n$-1\r\n:1\r\n");
        assert_eq!(m.in_flight(), 0);
        // More replies than requests: the stream can not be trusted.
        assert_eq!(m.received(1, b"+OK\r\n"), Err(MuxError::Unexpected));
    }

    #[test]
    fn keyless_requests_go_to_every_shard_and_their_replies_merge() {
        let mut m = three();
        let mut batch = cmd(&["AUTH", "pw"]);
        batch.extend(cmd(&["SCRIPT", "LOAD", "return 1"]));
        batch.extend(cmd(&["INFO", "server"]));
        batch.extend(cmd(&["CONFIG", "GET", "append*"]));
        m.submit(&batch);
        for k in 0..3 {
            assert_eq!(take_out(&mut m, k), batch);
        }
        let info = |id: char, up: u32| {
            let body = format!(
                "# Server\r\nrun_id:{}\r\nuptime_in_seconds:{up}\r\n",
                std::iter::repeat_n(id, 40).collect::<String>()
            );
            format!("${}\r\n{body}\r\n", body.len())
        };
        let durable =
            b"*4\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n$11\r\nappendfsync\r\n$6\r\nalways\r\n";
        let not_durable =
            b"*4\r\n$10\r\nappendonly\r\n$2\r\nno\r\n$11\r\nappendfsync\r\n$8\r\neverysec\r\n";
        for (k, (auth, script, up, conf)) in [
            (&b"+OK\r\n"[..], &b"$3\r\nabc\r\n"[..], 100, &durable[..]),
            (b"+OK\r\n", b"-ERR no scripts here\r\n", 5, not_durable),
            (b"+OK\r\n", b"$3\r\nabc\r\n", 50, durable),
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = auth.to_vec();
            r.extend_from_slice(script);
            r.extend(info(['1', '2', '4'][k], up).as_bytes());
            r.extend_from_slice(conf);
            reply(&mut m, k, &r);
        }
        let ready = take_ready(&mut m);
        let mut want = b"+OK\r\n-ERR no scripts here\r\n".to_vec();
        // 0x11 ^ 0x22 ^ 0x44 = 0x77 per byte; the smallest uptime.
        let body = format!(
            "# Server (redlock-mux: 3 shards merged)\r\nrun_id:{}\r\nuptime_in_seconds:5\r\n",
            "7".repeat(40)
        );
        want.extend(format!("${}\r\n{body}\r\n", body.len()).as_bytes());
        want.extend_from_slice(not_durable);
        assert_eq!(
            String::from_utf8_lossy(&ready),
            String::from_utf8_lossy(&want)
        );
        // What the rounds read of it.
        let Ok(crate::resp::Status::Complete((Frame::Bulk(text), _))) =
            crate::resp::parse(&want[27..], &crate::resp::Limits::default())
        else {
            panic!()
        };
        let info = super::super::link::parse_info(text).unwrap();
        assert_eq!(
            (info.uptime, &info.run_id[..]),
            (5, "7".repeat(40).as_bytes())
        );
        assert!(!info.delifeq);
    }

    #[test]
    fn moved_updates_the_map_and_resends_once() {
        let mut m = three();
        let a = key_on(0, "a");
        let slot = crate::slot::key_slot(a.as_bytes());
        let set = cmd(&["SET", &a, "t", "NX", "PX", "100"]);
        m.submit(&set);
        take_out(&mut m, 0);
        reply(
            &mut m,
            0,
            format!("-MOVED {slot} 127.0.0.1:7001\r\n").as_bytes(),
        );
        assert!(take_ready(&mut m).is_empty());
        assert_eq!(take_out(&mut m, 1), set);
        reply(&mut m, 1, b"+OK\r\n");
        assert_eq!(take_ready(&mut m), b"+OK\r\n");
        // The slot now lives on the second shard.
        m.submit(&set);
        assert!(take_out(&mut m, 0).is_empty());
        assert_eq!(take_out(&mut m, 1), set);
        // A second redirection of one request stands as its answer (a no vote).
        reply(
            &mut m,
            1,
            format!("-MOVED {slot} 127.0.0.1:7002\r\n").as_bytes(),
        );
        assert_eq!(take_out(&mut m, 2), set);
        let again = format!("-MOVED {slot} 127.0.0.1:7000\r\n");
        reply(&mut m, 2, again.as_bytes());
        assert_eq!(take_ready(&mut m), again.as_bytes());
        assert!(!m.stale());
        // To a node outside the map: passed on, and the connection is to be made again.
        m.submit(&set);
        let k = (0..3).find(|&k| !take_out(&mut m, k).is_empty()).unwrap();
        let unknown = format!("-MOVED {slot} 10.0.0.9:7000\r\n");
        reply(&mut m, k, unknown.as_bytes());
        assert_eq!(take_ready(&mut m), unknown.as_bytes());
        assert!(m.stale());
    }

    #[test]
    fn ask_sends_asking_and_the_request_once_without_moving_the_slot() {
        let mut m = three();
        let a = key_on(0, "a");
        let slot = crate::slot::key_slot(a.as_bytes());
        let set = cmd(&["SET", &a, "t", "NX", "PX", "100"]);
        m.submit(&set);
        take_out(&mut m, 0);
        reply(&mut m, 0, format!("-ASK {slot} :7002\r\n").as_bytes());
        let mut want = cmd(&["ASKING"]);
        want.extend_from_slice(&set);
        assert_eq!(take_out(&mut m, 2), want);
        reply(&mut m, 2, b"+OK\r\n");
        assert!(take_ready(&mut m).is_empty());
        reply(&mut m, 2, b"+OK\r\n");
        assert_eq!(take_ready(&mut m), b"+OK\r\n");
        m.submit(&set);
        assert_eq!(take_out(&mut m, 0), set, "the map is unchanged");
    }

    #[test]
    fn cross_slot_and_unserved_requests_are_answered_at_once_in_order() {
        let mut m = three();
        let (a, b) = (key_on(0, "a"), key_on(1, "b"));
        let set = cmd(&["SET", &a, "t", "NX", "PX", "100"]);
        m.submit(&set);
        m.submit(&cmd(&["EVALSHA", "sha", "2", &a, &b, "t"]));
        assert_eq!(take_out(&mut m, 0), set);
        assert!(take_ready(&mut m).is_empty(), "behind the SET");
        reply(&mut m, 0, b"+OK\r\n");
        let ready = take_ready(&mut m);
        assert!(
            ready.starts_with(b"+OK\r\n-CROSSSLOT "),
            "{}",
            String::from_utf8_lossy(&ready)
        );
        let mut empty = ShardMux::new(
            SlotMap::new(vec![]).unwrap(),
            crate::resp::Limits::default(),
        );
        empty.submit(&set);
        assert!(empty.ready().starts_with(b"-CLUSTERDOWN "));
    }

    #[test]
    fn caching_goes_with_the_next_read_and_pushes_pass_at_once() {
        let mut m = three();
        let c = key_on(2, "c");
        let mut batch = cmd(&["CLIENT", "CACHING", "YES"]);
        batch.extend(cmd(&["MGET", &c]));
        m.submit(&batch);
        assert!(take_out(&mut m, 0).is_empty());
        assert_eq!(take_out(&mut m, 2), batch);
        let push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nx\r\n";
        reply(&mut m, 1, push);
        assert_eq!(take_ready(&mut m), push);
        reply(&mut m, 2, b"+OK\r\n*1\r\n$1\r\nt\r\n");
        assert_eq!(take_ready(&mut m), b"+OK\r\n*1\r\n$1\r\nt\r\n");
    }

    #[test]
    fn a_slot_moved_under_requests_in_flight_keeps_their_order() {
        let mut m = three();
        let a = key_on(0, "a");
        let slot = crate::slot::key_slot(a.as_bytes());
        let (set, del) = (cmd(&["SET", &a, "t", "NX"]), cmd(&["DEL", &a]));
        m.submit(&set);
        assert_eq!(take_out(&mut m, 0), set);
        // The map learns that the slot moved (another request's -MOVED, a refresh) while
        // the SET is on its way to the old shard.
        m.map.moved(slot, &addr(7001));
        m.submit(&del);
        assert_eq!(take_out(&mut m, 0), del, "behind the SET, on the old shard");
        assert!(take_out(&mut m, 1).is_empty(), "not ahead of the SET");
        let moved = format!("-MOVED {slot} 127.0.0.1:7001\r\n");
        reply(&mut m, 0, moved.as_bytes());
        reply(&mut m, 0, moved.as_bytes());
        let mut both = set.clone();
        both.extend_from_slice(&del);
        assert_eq!(take_out(&mut m, 1), both, "sent again in order");
        reply(&mut m, 1, b"+OK\r\n:1\r\n");
        assert_eq!(take_ready(&mut m), b"+OK\r\n:1\r\n");
        // Nothing in flight for the slot: the map rules again.
        m.submit(&set);
        assert_eq!(take_out(&mut m, 1), set);
        assert!(take_out(&mut m, 0).is_empty());
    }

    #[test]
    fn a_group_refused_for_a_flushed_script_is_sent_again_alone_with_eval() {
        use crate::scripts::ACQUIRE_MANY;
        let mut m = three();
        let (a, b) = (key_on(0, "a"), key_on(1, "b"));
        let noscript: &[u8] = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
        // a's group sets its key; b's shard lost its scripts.
        let start = |m: &mut ShardMux| {
            m.submit(&cmd(&[
                "EVALSHA",
                ACQUIRE_MANY.sha,
                "2",
                &a,
                &b,
                "tok",
                "100",
            ]));
            take_out(m, 0);
            take_out(m, 1);
            reply(m, 0, b":1\r\n");
            reply(m, 1, noscript);
        };
        start(&mut m);
        assert!(m.ready().is_empty(), "not answered before b's group is");
        assert!(
            take_out(&mut m, 0).is_empty(),
            "a's group is not sent again"
        );
        assert_eq!(
            take_out(&mut m, 1),
            cmd(&["EVAL", ACQUIRE_MANY.src, "1", &b, "tok", "100"])
        );
        reply(&mut m, 1, b":1\r\n");
        assert_eq!(take_ready(&mut m), b":1\r\n");
        // Once only: a second -NOSCRIPT is the group's answer (an error: some group set
        // its keys, the rounds release there).
        start(&mut m);
        take_out(&mut m, 1);
        reply(&mut m, 1, noscript);
        assert!(take_ready(&mut m).starts_with(b"-NOSCRIPT"));
    }

    #[test]
    fn requests_across_slots_split_by_group_and_their_answers_merge() {
        use crate::scripts::{ACQUIRE_MANY, ACQUIRE_WAIT, EXTEND, RELEASE};
        let mut m = three();
        let (a, b) = (key_on(0, "a"), key_on(1, "b"));
        let a2 = format!("{{{a}}}2"); // a's slot: one group of two keys
        let run = |m: &mut ShardMux, sha: &str, answers: [&[u8]; 2]| {
            m.submit(&cmd(&["EVALSHA", sha, "3", &a, &b, &a2, "tok", "100"]));
            assert_eq!(
                take_out(m, 0),
                cmd(&["EVALSHA", sha, "2", &a, &a2, "tok", "100"])
            );
            assert_eq!(
                take_out(m, 1),
                cmd(&["EVALSHA", sha, "1", &b, "tok", "100"])
            );
            reply(m, 1, answers[1]);
            assert!(m.ready().is_empty());
            reply(m, 0, answers[0]);
            String::from_utf8(take_ready(m)).unwrap()
        };
        assert_eq!(
            run(&mut m, ACQUIRE_MANY.sha, [b":1\r\n", b":1\r\n"]),
            ":1\r\n"
        );
        assert_eq!(
            run(&mut m, ACQUIRE_MANY.sha, [b":0\r\n", b":0\r\n"]),
            ":0\r\n"
        );
        assert!(run(&mut m, ACQUIRE_MANY.sha, [b":1\r\n", b":0\r\n"]).starts_with("-PARTIAL "));
        // RELEASE: the lock keys, then their lines, then their liveness sets.
        let (qa, qb, la, lb) = (
            format!("{{{a}}}:q"),
            format!("{{{b}}}:q"),
            format!("{{{a}}}:l"),
            format!("{{{b}}}:l"),
        );
        let release = |m: &mut ShardMux, answers: [&[u8]; 2]| {
            m.submit(&cmd(&[
                "EVALSHA",
                RELEASE.sha,
                "6",
                &a,
                &b,
                &qa,
                &qb,
                &la,
                &lb,
                "tok",
            ]));
            assert_eq!(
                take_out(m, 0),
                cmd(&["EVALSHA", RELEASE.sha, "3", &a, &qa, &la, "tok"])
            );
            assert_eq!(
                take_out(m, 1),
                cmd(&["EVALSHA", RELEASE.sha, "3", &b, &qb, &lb, "tok"])
            );
            reply(m, 0, answers[0]);
            reply(m, 1, answers[1]);
            String::from_utf8(take_ready(m)).unwrap()
        };
        assert_eq!(release(&mut m, [b":1\r\n", b":0\r\n"]), ":0\r\n");
        assert_eq!(release(&mut m, [b":1\r\n", b":1\r\n"]), ":1\r\n");
        assert_eq!(run(&mut m, EXTEND.sha, [b":2\r\n", b":1\r\n"]), ":2\r\n");
        assert_eq!(run(&mut m, EXTEND.sha, [b":2\r\n", b":0\r\n"]), ":0\r\n");
        // The waiting acquire: 0 is set; a group of one key answers [ttl, holder].
        assert_eq!(
            run(&mut m, ACQUIRE_WAIT.sha, [b":0\r\n", b":0\r\n"]),
            ":0\r\n"
        );
        let held = b"*2\r\n:700\r\n$2\r\nfp\r\n";
        assert_eq!(
            run(&mut m, ACQUIRE_WAIT.sha, [b":300\r\n", held]),
            ":700\r\n"
        );
        assert_eq!(run(&mut m, ACQUIRE_WAIT.sha, [b":-1\r\n", held]), ":-1\r\n");
        assert!(run(&mut m, ACQUIRE_WAIT.sha, [b":0\r\n", held]).starts_with("-PARTIAL "));
        // An error of one group is the answer (a script error: the rounds release there).
        let e = release(&mut m, [b"-BUSY script\r\n", b":1\r\n"]);
        assert_eq!(e, "-BUSY script\r\n");
        // A group redirected is sent again where it now lives, once.
        let mut r = three();
        let slot_a = crate::slot::key_slot(a.as_bytes());
        r.submit(&cmd(&[
            "EVALSHA",
            ACQUIRE_MANY.sha,
            "3",
            &a,
            &b,
            &a2,
            "tok",
            "100",
        ]));
        let group_a = cmd(&["EVALSHA", ACQUIRE_MANY.sha, "2", &a, &a2, "tok", "100"]);
        assert_eq!(take_out(&mut r, 0), group_a);
        take_out(&mut r, 1);
        reply(
            &mut r,
            0,
            format!("-MOVED {slot_a} 127.0.0.1:7002\r\n").as_bytes(),
        );
        assert_eq!(take_out(&mut r, 2), group_a);
        reply(&mut r, 1, b":1\r\n");
        assert!(take_ready(&mut r).is_empty());
        reply(&mut r, 2, b":1\r\n");
        assert_eq!(take_ready(&mut r), b":1\r\n");
        // A script this layer does not know is not split.
        m.submit(&cmd(&["EVALSHA", "unknown", "2", &a, &b, "t"]));
        assert!(take_ready(&mut m).starts_with(b"-CROSSSLOT "));
        // The fencing scripts: each group holds its lock keys and their counters.
        use crate::scripts::FENCE_DRAW;
        let (fa, fb) = (format!("{{{a}}}:fence"), format!("{{{b}}}:fence"));
        // The old counters a standalone master may still hold are left out on a cluster; each
        // group's request says its own number of lock keys (ARGV[2]).
        let (oa, ob) = ("redlock-mux:fence:x", "redlock-mux:fence:y");
        let draw = [
            "EVALSHA",
            FENCE_DRAW.sha,
            "6",
            &a,
            &b,
            &fa,
            &fb,
            oa,
            ob,
            "tok",
            "2",
        ];
        m.submit(&cmd(&draw));
        let want_a = ["EVALSHA", FENCE_DRAW.sha, "2", &a, &fa, "tok", "1"];
        let want_b = ["EVALSHA", FENCE_DRAW.sha, "2", &b, &fb, "tok", "1"];
        assert_eq!(take_out(&mut m, 0), cmd(&want_a));
        assert_eq!(take_out(&mut m, 1), cmd(&want_b));
        reply(&mut m, 0, b":7\r\n");
        reply(&mut m, 1, b":9\r\n");
        assert_eq!(take_ready(&mut m), b":9\r\n");
        // A counter outside its lock key's slot: not split (the script would read a
        // counter as a lock key).
        let stray = key_on(2, "stray");
        m.submit(&cmd(&[
            "EVALSHA",
            FENCE_DRAW.sha,
            "2",
            &a,
            &stray,
            "tok",
            "1",
        ]));
        assert!(take_ready(&mut m).starts_with(b"-CROSSSLOT "));
    }

    #[test]
    fn fencing_scripts_split_only_with_each_lock_key_beside_its_counter() {
        use crate::scripts::{FENCE_DRAW, FENCE_RAISE};
        let mut m = three();
        let (a, b) = (key_on(0, "a"), key_on(1, "b"));
        let (ca, cb) = (format!("{{{a}}}c"), format!("{{{b}}}c"));
        // Pairs in one slot each: a group per lock key, with its counter.
        m.submit(&cmd(&[
            "EVALSHA",
            FENCE_DRAW.sha,
            "4",
            &a,
            &b,
            &ca,
            &cb,
            "t",
        ]));
        assert_eq!(
            take_out(&mut m, 0),
            cmd(&["EVALSHA", FENCE_DRAW.sha, "2", &a, &ca, "t"])
        );
        assert_eq!(
            take_out(&mut m, 1),
            cmd(&["EVALSHA", FENCE_DRAW.sha, "2", &b, &cb, "t"])
        );
        reply(&mut m, 0, b":3\r\n");
        reply(&mut m, 1, b":5\r\n");
        assert_eq!(take_ready(&mut m), b":5\r\n");
        // A counter in another slot than its lock key: refused, never split in halves.
        for sha in [FENCE_DRAW.sha, FENCE_RAISE.sha] {
            m.submit(&cmd(&["EVALSHA", sha, "2", &a, &b, "t", "9"]));
            assert!(take_out(&mut m, 0).is_empty() && take_out(&mut m, 1).is_empty());
            assert!(take_ready(&mut m).starts_with(b"-CROSSSLOT "));
        }
    }

    #[test]
    fn a_read_across_slots_is_reassembled_in_key_order() {
        let mut m = three();
        let (a, b, c) = (key_on(0, "a"), key_on(1, "b"), key_on(2, "c"));
        let mut batch = cmd(&["CLIENT", "CACHING", "YES"]);
        batch.extend(cmd(&["MGET", &b, &a, &c, &format!("{{{b}}}x")]));
        m.submit(&batch);
        let caching = cmd(&["CLIENT", "CACHING", "YES"]);
        let with = |keys: &[&str]| {
            let mut v = caching.clone();
            let mut args = vec!["MGET"];
            args.extend_from_slice(keys);
            v.extend(cmd(&args));
            v
        };
        let bx = format!("{{{b}}}x");
        assert_eq!(take_out(&mut m, 1), with(&[&b, &bx]));
        assert_eq!(take_out(&mut m, 0), with(&[&a]));
        assert_eq!(take_out(&mut m, 2), with(&[&c]));
        reply(&mut m, 2, b"+OK\r\n*1\r\n$2\r\nvc\r\n");
        reply(&mut m, 0, b"+OK\r\n*1\r\n$-1\r\n");
        assert!(take_ready(&mut m).is_empty());
        reply(&mut m, 1, b"+OK\r\n*2\r\n$2\r\nvb\r\n$3\r\nvbx\r\n");
        assert_eq!(
            String::from_utf8(take_ready(&mut m)).unwrap(),
            "+OK\r\n*4\r\n$2\r\nvb\r\n$-1\r\n$2\r\nvc\r\n$3\r\nvbx\r\n"
        );
    }

    #[test]
    fn a_refresh_moves_slots_between_known_shards_and_a_new_primary_makes_it_stale() {
        let mut m = three();
        let a = key_on(0, "a");
        let slot = crate::slot::key_slot(a.as_bytes());
        m.refresh();
        m.refresh(); // one at a time
        assert_eq!(take_out(&mut m, 0), cmd(&["CLUSTER", "SHARDS"]));
        // The map now has the key's slot on the second shard.
        let map = |ranges: [&[(u16, u16)]; 3], ports: [u16; 3]| {
            let mut out = "*3\r\n".to_string();
            for (r, port) in ranges.iter().zip(ports) {
                let fields = [
                    ("id", bulk(&id('x'))),
                    ("port", format!(":{port}\r\n")),
                    ("ip", bulk("127.0.0.1")),
                    ("endpoint", bulk("127.0.0.1")),
                    ("role", bulk("master")),
                    ("health", bulk("online")),
                ];
                let mut node = format!("*{}\r\n", 2 * fields.len());
                for (k, v) in fields {
                    node += &bulk(k);
                    node += &v;
                }
                out += &shard(r, &[node], false);
            }
            out
        };
        let before = (0, slot - 1);
        let after = (slot + 1, 5460);
        let moved = map(
            [
                &[before, after],
                &[(slot, slot), (5461, 10922)],
                &[(10923, 16383)],
            ],
            [7000, 7001, 7002],
        );
        reply(&mut m, 0, moved.as_bytes());
        assert!(
            take_ready(&mut m).is_empty(),
            "a refresh answers no request"
        );
        let set = cmd(&["SET", &a, "t", "NX", "PX", "100"]);
        m.submit(&set);
        assert!(take_out(&mut m, 0).is_empty());
        assert_eq!(
            take_out(&mut m, 1),
            set,
            "sent where the refreshed map says"
        );
        assert!(!m.stale());
        // A primary the map did not have: the connection is made again.
        m.refresh();
        take_out(&mut m, 0);
        let new = map(
            [&[(0, 5460)], &[(5461, 10922)], &[(10923, 16383)]],
            [7000, 7001, 7009],
        );
        reply(&mut m, 0, new.as_bytes());
        assert!(m.stale());
    }

    #[test]
    fn a_refresh_with_the_same_map_changes_nothing() {
        for (bytes, slots_only) in [
            (
                &include_bytes!("../../tests/data/cluster-shards-redis7-resp2.bin")[..],
                false,
            ),
            (
                include_bytes!("../../tests/data/cluster-shards-redis7-resp3.bin"),
                false,
            ),
            (
                include_bytes!("../../tests/data/cluster-slots-redis7-resp3.bin"),
                true,
            ),
        ] {
            let mut shards = None;
            frame(bytes, |f| {
                shards = Some(if slots_only {
                    parse_slots(f)
                } else {
                    parse_shards(f, false)
                })
            });
            let map = SlotMap::new(shards.unwrap().unwrap()).unwrap();
            let before: Vec<Option<usize>> = (0..16384).map(|s| map.shard_of(s)).collect();
            let mut m = ShardMux::new(map, crate::resp::Limits::default());
            m.set_refresh(slots_only, false);
            m.refresh();
            take_out(&mut m, 0);
            reply(&mut m, 0, bytes);
            assert!(!m.stale());
            let after: Vec<Option<usize>> = (0..16384).map(|s| m.map.shard_of(s)).collect();
            assert!(
                before == after,
                "the map changed (slots only: {slots_only})"
            );
        }
    }
}
