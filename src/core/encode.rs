//! Request encoding: the RESP bytes of each request of an op, the hot ones from constant
//! pieces.
//!
//! An op's arguments name the lock's keys only; the keys a script keeps beside each of
//! them (its line, its waiters' liveness, its fencing counters: `scripts::aux_key`, in the
//! lock key's cluster slot) are named here, as the request is written, and declared in its
//! `KEYS` (see `scripts`): no allocation, one slot lookup per lock key.

use smallvec::SmallVec;

use super::ops::{KeyList, OpArgs};
use super::wait::Expect;
use crate::resp::{self, Arg};
use crate::rules::Request;
use crate::scripts::{self, Script, ALIVE, FENCE, OLD_FENCE_PREFIX, QUEUE};
use crate::slot::tag_of;
use crate::token::TOKEN_LEN;

/// Encode one request of an op. Single-key acquire is `SET key token NX PX ttl`; the rest
/// are scripts, by `EVALSHA` (or `EVAL` after `-NOSCRIPT`).
/// `EVAL` of [`scripts::RELEASE_PLAIN`] for a release's lock keys and token: the fallback
/// of a release the full script could not run (see there).
pub(super) fn encode_plain_release(out: &mut Vec<u8>, args: &OpArgs) {
    let token: &[u8] = args.token.as_ref().map_or(&[], |t| t.as_bytes());
    let mut v: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
    v.push(Arg::Bytes(b"EVAL"));
    v.push(Arg::Bytes(scripts::RELEASE_PLAIN.src.as_bytes()));
    v.push(Arg::Uint(args.keys.len() as u64));
    v.extend(args.keys.iter().map(Arg::Bytes));
    v.push(Arg::Bytes(token));
    resp::encode_command(out, &v);
}

/// Whether a release may be sent as `DELIFEQ key token` to a master that offers it
/// (Valkey 9: see `link::ServerInfo::delifeq`): the release of a granted one-key lock
/// that did not wait (no line to leave) and that no waiter of this client waits for
/// (`OpArgs::waiters_here`). Everything else keeps its script: a release of several keys
/// (all or nothing, in one script), a release that leaves its lock's place in the lines
/// (`leave`), a failed attempt's cleanup (contended: its key is likely someone else's or
/// marked, where `DELIFEQ` would only add a request), a release a waiter of this client
/// is started right behind (on a marked key the waiter's attempt would run between
/// `DELIFEQ` and the script, and be refused), an extend (never shorter than the key lives
/// already, and a marked value: Lua), the acquires and fencing.
#[inline]
pub(super) fn delifeq_fits(args: &OpArgs) -> bool {
    args.of_lock
        && !args.waiters_here
        && args.leave.is_none()
        && args.keys.len() == 1
        && args.token.is_some()
}

/// `DELIFEQ key token` (see [`delifeq_fits`]).
pub(super) fn encode_delifeq(out: &mut Vec<u8>, args: &OpArgs) {
    let token: &[u8] = args.token.as_ref().map_or(&[], |t| t.as_bytes());
    let key = args.keys.iter().next().unwrap_or(&[]);
    out.extend_from_slice(b"*3\r\n$7\r\nDELIFEQ\r\n");
    push_key_bulk(out, &args.keys, key);
    push_bulk(out, token);
}

pub(super) fn encode_request(out: &mut Vec<u8>, req: Request, args: &OpArgs, eval: bool) {
    encode_request_memo(out, req, args, eval, &mut BulkUint::new(args.ttl_ms));
}

/// [`encode_request`], with the TTL's bulk string kept in `memo` for the next request
/// (a round's caller: a client's locks nearly always share one TTL).
pub(super) fn encode_request_memo(
    out: &mut Vec<u8>,
    req: Request,
    args: &OpArgs,
    eval: bool,
    memo: &mut BulkUint,
) {
    let token: &[u8] = args.token.as_ref().map_or(&[], |t| t.as_bytes());
    let nkeys = args.keys.len();
    // The hot requests of a lock cycle, written from constant pieces: same bytes as the
    // general path below (a unit test checks), a fraction of the instructions.
    if nkeys == 1 && token.len() == TOKEN_LEN && !eval && args.leave.is_none() && !args.put {
        let key = args.keys.iter().next().unwrap_or(&[]);
        match req {
            Request::Acquire => {
                out.extend_from_slice(b"*6\r\n$3\r\nSET\r\n");
                push_key_bulk(out, &args.keys, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n$2\r\nNX\r\n$2\r\nPX\r\n");
                memo.push(out, args.ttl_ms);
                return;
            }
            Request::Release if scripts::lines_named_by_key(key) => {
                // `RELEASE_LEAN`: `KEYS` the key alone (the Redis page's release, to the
                // master), `ARGV` the token.
                out.extend_from_slice(b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n");
                out.extend_from_slice(scripts::RELEASE_LEAN.sha.as_bytes());
                out.extend_from_slice(b"\r\n$1\r\n1\r\n");
                push_key_bulk(out, &args.keys, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Request::Extend => {
                out.extend_from_slice(b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n");
                out.extend_from_slice(scripts::EXTEND.sha.as_bytes());
                out.extend_from_slice(b"\r\n$1\r\n1\r\n");
                push_key_bulk(out, &args.keys, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n");
                memo.push(out, args.ttl_ms);
                return;
            }
            _ => {}
        }
    }
    encode_request_general(out, req, args, eval, token, nkeys);
}

/// The name of the key of `kind` kept beside lock key `key` (slot tag `tag`) as a bulk
/// string: `$<len>\r\nredlock-mux:{tag}:<kind>:<key>\r\n`.
fn push_aux_bulk(out: &mut Vec<u8>, kind: &[u8], tag: &[u8; 3], key: &[u8]) {
    out.push(b'$');
    push_decimal(out, scripts::aux_key_len(kind, key) as u64);
    out.extend_from_slice(b"\r\n");
    scripts::push_aux_key(out, kind, tag, key);
    out.extend_from_slice(b"\r\n");
}

/// `$<len>\r\n<key>\r\n` for `key`, the one key of `keys`: while it is kept inline,
/// its bytes are appended as a copy of the whole inline array (a fixed size: no
/// length-dependent copy), then cut to its length.
#[inline]
fn push_key_bulk(out: &mut Vec<u8>, keys: &KeyList, key: &[u8]) {
    match keys.inline_bytes() {
        Some((inline, len)) if len == key.len() && len < 100 => {
            if len < 10 {
                out.extend_from_slice(&[b'$', b'0' + len as u8, b'\r', b'\n']);
            } else {
                let (tens, ones) = (b'0' + (len / 10) as u8, b'0' + (len % 10) as u8);
                out.extend_from_slice(&[b'$', tens, ones, b'\r', b'\n']);
            }
            let at = out.len();
            out.extend_from_slice(inline);
            out.truncate(at + len);
            out.extend_from_slice(b"\r\n");
        }
        _ => push_bulk(out, key),
    }
}

/// `$<len>\r\n<bytes>\r\n`.
fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    push_decimal(out, bytes.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// An integer argument as a bulk string: `$<n>\r\n<digits>\r\n`, built on the stack and
/// appended in one copy.
fn push_bulk_uint(out: &mut Vec<u8>, v: u64) {
    let (buf, i) = bulk_uint(v);
    out.extend_from_slice(&buf[i..]);
}

/// The bulk string of an integer, kept for the last integer asked: appended as a copy of
/// a fixed size (no length-dependent copy), then cut to its length.
pub(super) struct BulkUint {
    v: u64,
    len: usize,
    bytes: [u8; BULK_UINT_MAX],
}

/// The longest bulk string of a `u64`: `$20\r\n`, 20 digits, `\r\n`.
const BULK_UINT_MAX: usize = 27;

impl BulkUint {
    pub(super) fn new(v: u64) -> BulkUint {
        let (buf, i) = bulk_uint(v);
        let mut bytes = [0u8; BULK_UINT_MAX];
        bytes[..buf.len() - i].copy_from_slice(&buf[i..]);
        BulkUint {
            v,
            len: buf.len() - i,
            bytes,
        }
    }

    /// Append `v` as a bulk string.
    #[inline]
    fn push(&mut self, out: &mut Vec<u8>, v: u64) {
        if v != self.v {
            *self = BulkUint::new(v);
        }
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        out.truncate(at + self.len);
    }
}

/// `v` as a bulk string, at `buf[i..]` of the pair returned.
fn bulk_uint(v: u64) -> ([u8; 29], usize) {
    // 20 digits at most, so a one- or two-digit length; the digits end at `END`.
    const END: usize = 27;
    let mut buf = [0u8; END + 2];
    // Two digits per step (a TTL in ms has four to ten).
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut i = END;
    let mut v = v;
    while v >= 100 {
        let r = (v % 100) as usize;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[2 * r..2 * r + 2]);
    }
    if v >= 10 {
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[2 * v as usize..2 * v as usize + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    let n = END - i;
    buf[END..].copy_from_slice(b"\r\n");
    i -= 2;
    buf[i..i + 2].copy_from_slice(b"\r\n");
    if n < 10 {
        i -= 1;
        buf[i] = b'0' + n as u8;
    } else {
        i -= 2;
        buf[i] = b'0' + (n / 10) as u8;
        buf[i + 1] = b'0' + (n % 10) as u8;
    }
    i -= 1;
    buf[i] = b'$';
    (buf, i)
}

fn push_decimal(out: &mut Vec<u8>, v: u64) {
    // Lengths of keys and numbers: nearly always one or two digits.
    if v < 10 {
        out.push(b'0' + v as u8);
        return;
    }
    if v < 100 {
        out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]);
        return;
    }
    let mut digits = [0u8; 20];
    let n = decimal(v, &mut digits);
    out.extend_from_slice(&digits[20 - n..]);
}

/// Write `v` right-aligned into `buf`; returns the digit count.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> usize {
    let mut i = 20;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return 20 - i;
        }
    }
}

fn encode_request_general(
    out: &mut Vec<u8>,
    req: Request,
    args: &OpArgs,
    eval: bool,
    token: &[u8],
    nkeys: usize,
) {
    let script: Script = match req {
        Request::Acquire if nkeys == 1 => {
            let key = args.keys.iter().next().unwrap_or(&[]);
            resp::encode_command(
                out,
                &[
                    Arg::Bytes(b"SET"),
                    Arg::Bytes(key),
                    Arg::Bytes(token),
                    Arg::Bytes(b"NX"),
                    Arg::Bytes(b"PX"),
                    Arg::Uint(args.ttl_ms),
                ],
            );
            return;
        }
        Request::Acquire | Request::AcquireMany => scripts::ACQUIRE_MANY,
        Request::AcquireWait => scripts::ACQUIRE_WAIT,
        Request::Release if lean_release(args) => scripts::RELEASE_LEAN,
        Request::Release => scripts::RELEASE,
        Request::Extend => scripts::EXTEND,
        Request::FenceDraw => scripts::FENCE_DRAW,
        Request::FenceWriteBack => scripts::FENCE_RAISE,
        Request::Inspect => scripts::INSPECT,
        Request::ForceRelease => scripts::FORCE_RELEASE,
    };
    // The keys kept beside each lock key that the script declares after the lock keys, by
    // kind, in this order (`KEYS` = the lock keys, then every lock key's first kind, ...).
    let aux: &[Aux] = match req {
        Request::AcquireWait if args.line.is_some() => &[Aux::Kind(QUEUE), Aux::Kind(ALIVE)],
        Request::Release if lean_release(args) => &[],
        Request::Release => &[Aux::Kind(QUEUE), Aux::Kind(ALIVE)],
        // The old counters: see `scripts`, fencing continuity.
        Request::FenceDraw | Request::FenceWriteBack => {
            &[Aux::Kind(FENCE), Aux::Old(OLD_FENCE_PREFIX)]
        }
        Request::Inspect => &[
            Aux::Kind(QUEUE),
            Aux::Kind(ALIVE),
            Aux::Kind(FENCE),
            Aux::Old(OLD_FENCE_PREFIX),
        ],
        Request::ForceRelease => &[Aux::Kind(QUEUE), Aux::Kind(ALIVE)],
        _ => &[],
    };
    let mut v: SmallVec<[Argv<'_>; 8]> = SmallVec::new();
    match req {
        Request::FenceDraw => {
            v.push(Argv::Bytes(token));
            v.push(Argv::Uint(nkeys as u64));
        }
        Request::FenceWriteBack => {
            v.push(Argv::Bytes(token));
            v.push(Argv::Uint(args.value));
            v.push(Argv::Uint(nkeys as u64));
        }
        Request::AcquireWait => {
            v.push(Argv::Bytes(token));
            v.push(Argv::Uint(args.ttl_ms));
            if let Some(line) = &args.line {
                v.push(Argv::Bytes(&line.id));
                v.push(Argv::Uint(line.alive_ms));
                v.push(Argv::Bytes(if line.polite { b"p" } else { b"" }));
                v.push(Argv::Uint(line.score));
                match (line.out, line.expect) {
                    (true, _) => v.push(Argv::Bytes(b"o")),
                    (false, Expect::Held) => v.push(Argv::Bytes(b"h")),
                    (false, Expect::InLine) => v.push(Argv::Bytes(b"l")),
                    (false, Expect::Free) => {}
                }
            }
        }
        Request::Release if args.leave.is_some() => {
            v.push(Argv::Bytes(token));
            if let Some(id) = &args.leave {
                v.push(Argv::Bytes(id));
            }
        }
        Request::Release => v.push(Argv::Bytes(token)),
        // `ARGV[1]`: waiters to name.
        Request::Inspect => v.push(Argv::Uint(args.value)),
        Request::ForceRelease => {}
        Request::Extend if args.put => {
            v.push(Argv::Bytes(token));
            v.push(Argv::Uint(args.ttl_ms));
            v.push(Argv::Bytes(b"put"));
        }
        _ => {
            v.push(Argv::Bytes(token));
            v.push(Argv::Uint(args.ttl_ms));
        }
    }
    let declared = nkeys * (1 + aux.len());
    out.push(b'*');
    push_decimal(out, (3 + declared + v.len()) as u64);
    out.extend_from_slice(b"\r\n");
    if eval {
        push_bulk(out, b"EVAL");
        push_bulk(out, script.src.as_bytes());
    } else {
        push_bulk(out, b"EVALSHA");
        push_bulk(out, script.sha.as_bytes());
    }
    push_bulk_uint(out, declared as u64);
    for k in args.keys.iter() {
        push_bulk(out, k);
    }
    if !aux.is_empty() {
        // One slot lookup for a one-key lock; several keys look theirs up per kind (no
        // storage: a lock on many keys never allocates here).
        let first = tag_of(args.keys.iter().next().unwrap_or(&[]));
        for a in aux {
            for k in args.keys.iter() {
                match *a {
                    Aux::Kind(kind) => {
                        let tag = if nkeys == 1 { first } else { tag_of(k) };
                        push_aux_bulk(out, kind, tag, k)
                    }
                    Aux::Old(prefix) => {
                        out.push(b'$');
                        push_decimal(out, (prefix.len() + k.len()) as u64);
                        out.extend_from_slice(b"\r\n");
                        out.extend_from_slice(prefix);
                        out.extend_from_slice(k);
                        out.extend_from_slice(b"\r\n");
                    }
                }
            }
        }
    }
    for a in &v {
        match *a {
            Argv::Bytes(b) => push_bulk(out, b),
            Argv::Uint(n) => push_bulk_uint(out, n),
        }
    }
}

/// Whether a release goes as [`scripts::RELEASE_LEAN`] (the lock keys alone): it leaves no
/// line, and every key's line is named after the key ([`scripts::lines_named_by_key`]).
/// Else [`scripts::RELEASE`], the lines declared.
fn lean_release(args: &OpArgs) -> bool {
    args.leave.is_none() && args.keys.iter().all(scripts::lines_named_by_key)
}

/// A script argument (`ARGV`).
#[derive(Clone, Copy)]
enum Argv<'a> {
    Bytes(&'a [u8]),
    Uint(u64),
}

/// A key a script declares beside each lock key.
#[derive(Clone, Copy)]
enum Aux {
    /// `scripts::aux_key(kind, key)`, in the key's slot.
    Kind(&'static [u8]),
    /// The layout before: prefix and key (standalone masters only; see `scripts`).
    Old(&'static [u8]),
}

/// `AUTH [user] password` when the master URL has a password; whether it was queued.
/// (The lock connection's handshake and the subscription connection's both start so.)
pub(super) fn encode_auth(out: &mut Vec<u8>, user: Option<&str>, password: Option<&str>) -> bool {
    let Some(pw) = password else {
        return false;
    };
    match user {
        Some(u) => resp::encode_command(
            out,
            &[
                Arg::Bytes(b"AUTH"),
                Arg::Bytes(u.as_bytes()),
                Arg::Bytes(pw.as_bytes()),
            ],
        ),
        None => resp::encode_command(out, &[Arg::Bytes(b"AUTH"), Arg::Bytes(pw.as_bytes())]),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_encoder_matches_the_general_encoder() {
        let mut src = crate::token::TokenSource::new().unwrap();
        for key in [
            &b"k"[..],
            b"orders:42",
            &[0u8, 13, 10, 255][..],
            &b"{a}b"[..],
            &b"a}"[..],
            &[b'y'; 10][..],
            &[b'v'; 64][..],
            &[b'u'; 65][..],
            &[b'z'; 99][..],
            &[b'w'; 100][..],
            &[b'x'; 300][..],
        ] {
            for ttl in [
                0u64,
                1,
                9,
                10,
                99,
                100,
                101,
                999,
                1000,
                10_000,
                30_000,
                123_456_789,
                (1 << 31) - 1,
                u64::MAX,
            ] {
                let mut a = OpArgs::default();
                a.set([key], src.next().unwrap(), ttl);
                for req in [Request::Acquire, Request::Release, Request::Extend] {
                    let (mut fast, mut general) = (Vec::new(), Vec::new());
                    encode_request(&mut fast, req, &a, false);
                    // With a memo of another value (replaced), then of this one (kept).
                    let mut memo = BulkUint::new(7);
                    for _ in 0..2 {
                        let mut kept = vec![b'x'];
                        encode_request_memo(&mut kept, req, &a, false, &mut memo);
                        assert_eq!(kept[1..], fast[..], "{req:?} key {key:?} ttl {ttl}");
                    }
                    let token = a.token.as_ref().unwrap().as_bytes();
                    encode_request_general(&mut general, req, &a, false, token, 1);
                    assert_eq!(fast, general, "{req:?} key {key:?} ttl {ttl}");
                }
            }
        }
    }

    #[test]
    fn requests_encode_as_documented() {
        let mut a = OpArgs::default();
        let tok = crate::token::TokenSource::new().unwrap().next().unwrap();
        a.set([&b"k"[..]], tok, 1500);
        let mut out = Vec::new();
        encode_request(&mut out, Request::Acquire, &a, false);
        let want = format!(
            "*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$32\r\n{}\r\n$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n1500\r\n",
            tok.as_str()
        );
        assert_eq!(String::from_utf8(out.clone()).unwrap(), want);
        out.clear();
        encode_request(&mut out, Request::Release, &a, false);
        // A key without `}`: its lines are named after it, the release takes it alone.
        assert_eq!(scripts::aux_key(QUEUE, b"k"), b"redlock-mux:{k}:queue");
        let want = format!(
            "*5\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n1\r\n$1\r\nk\r\n$32\r\n{}\r\n",
            scripts::RELEASE_LEAN.sha,
            tok.as_str()
        );
        assert_eq!(String::from_utf8(out.clone()).unwrap(), want);
        out.clear();
        // A key with `}`: lines named by the slot's tag, declared after the key.
        a.set([&b"{u}k"[..]], tok, 1500);
        encode_request(&mut out, Request::Release, &a, false);
        let (q, alive) = (
            scripts::aux_key(QUEUE, b"{u}k"),
            scripts::aux_key(ALIVE, b"{u}k"),
        );
        let tag = crate::slot::tag_of(b"u");
        assert_eq!(
            q,
            [b"redlock-mux:{".as_slice(), tag, b"}:queue:{u}k"].concat(),
            "the tag of the slot of \"{{u}}k\""
        );
        let want = format!(
            "*7\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n3\r\n$4\r\n{{u}}k\r\n$28\r\n{}\r\n$28\r\n{}\r\n$32\r\n{}\r\n",
            scripts::RELEASE.sha,
            String::from_utf8(q).unwrap(),
            String::from_utf8(alive).unwrap(),
            tok.as_str()
        );
        assert_eq!(String::from_utf8(out.clone()).unwrap(), want);
        out.clear();
        a.set([&b"k"[..]], tok, 1500);
        encode_request(&mut out, Request::Extend, &a, true);
        assert!(out.starts_with(b"*6\r\n$4\r\nEVAL\r\n"));
        assert!(out.ends_with(b"$4\r\n1500\r\n"));
    }

    #[test]
    fn delifeq_is_for_one_key_releases_that_leave_no_line() {
        let tok = crate::token::TokenSource::new().unwrap().next().unwrap();
        for key in [&b"k"[..], b"{u}k", &[b'x'; 300][..]] {
            let mut a = OpArgs::default();
            a.set([key], tok, 1500);
            assert!(!delifeq_fits(&a), "a failed attempt's cleanup: the script");
            a.of_lock = true;
            assert!(delifeq_fits(&a));
            a.waiters_here = true;
            assert!(
                !delifeq_fits(&a),
                "a waiter of this client right behind: the script"
            );
            a.waiters_here = false;
            let mut out = Vec::new();
            encode_delifeq(&mut out, &a);
            let mut want = format!("*3\r\n$7\r\nDELIFEQ\r\n${}\r\n", key.len()).into_bytes();
            want.extend_from_slice(key);
            want.extend_from_slice(format!("\r\n$32\r\n{}\r\n", tok.as_str()).as_bytes());
            assert_eq!(out, want);
            a.leave = Some([b'0'; scripts::NOTICE_LEN]);
            assert!(
                !delifeq_fits(&a),
                "a lock that waited leaves its line: the script"
            );
        }
        let mut a = OpArgs::default();
        a.set([&b"a"[..], b"b"], tok, 1500);
        a.of_lock = true;
        assert!(
            !delifeq_fits(&a),
            "several keys: all or nothing, the script"
        );
    }
}
