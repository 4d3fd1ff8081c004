//! Request encoding: the RESP bytes of each request of an op, the hot ones from constant
//! pieces.

use smallvec::SmallVec;

use super::ops::OpArgs;
use super::wait::Expect;
use crate::resp::{self, Arg};
use crate::rules::Request;
use crate::scripts::{self, Script};
use crate::token::TOKEN_LEN;

/// Encode one request of an op. Single-key acquire is `SET key token NX PX ttl`; the rest
/// are scripts, by `EVALSHA` (or `EVAL` after `-NOSCRIPT`).
pub(super) fn encode_request(out: &mut Vec<u8>, req: Request, args: &OpArgs, eval: bool) {
    let token: &[u8] = args.token.as_ref().map_or(&[], |t| t.as_bytes());
    let nkeys = args.keys.len();
    // The hot requests of a lock cycle, written from constant pieces: same bytes as the
    // general path below (a unit test checks), a fraction of the instructions.
    if nkeys == 1 && token.len() == TOKEN_LEN && !eval && args.leave.is_none() && !args.put {
        let key = args.keys.iter().next().unwrap_or(&[]);
        match req {
            Request::Acquire => {
                out.extend_from_slice(b"*6\r\n$3\r\nSET\r\n");
                push_bulk(out, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n$2\r\nNX\r\n$2\r\nPX\r\n");
                push_bulk_uint(out, args.ttl_ms);
                return;
            }
            Request::Release | Request::Extend => {
                let (head, sha) = if req == Request::Release {
                    (&b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n"[..], scripts::RELEASE.sha)
                } else {
                    (&b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n"[..], scripts::EXTEND.sha)
                };
                out.extend_from_slice(head);
                out.extend_from_slice(sha.as_bytes());
                out.extend_from_slice(b"\r\n$1\r\n1\r\n");
                push_bulk(out, key);
                out.extend_from_slice(b"$32\r\n");
                out.extend_from_slice(token);
                out.extend_from_slice(b"\r\n");
                if req == Request::Extend {
                    push_bulk_uint(out, args.ttl_ms);
                }
                return;
            }
            _ => {}
        }
    }
    encode_request_general(out, req, args, eval, token, nkeys);
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
    out.extend_from_slice(&buf[i..]);
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
    let mut v: SmallVec<[Arg<'_>; 16]> = SmallVec::new();
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
        Request::Release => scripts::RELEASE,
        Request::Extend => scripts::EXTEND,
        Request::FenceDraw => scripts::FENCE_DRAW,
        Request::FenceWriteBack => scripts::FENCE_RAISE,
        Request::Inspect => scripts::INSPECT,
        Request::ForceRelease => scripts::FORCE_RELEASE,
    };
    if eval {
        v.push(Arg::Bytes(b"EVAL"));
        v.push(Arg::Bytes(script.src.as_bytes()));
    } else {
        v.push(Arg::Bytes(b"EVALSHA"));
        v.push(Arg::Bytes(script.sha.as_bytes()));
    }
    v.push(Arg::Uint(nkeys as u64));
    v.extend(args.keys.iter().map(Arg::Bytes));
    match req {
        Request::FenceWriteBack => {
            v.push(Arg::Bytes(token));
            v.push(Arg::Uint(args.value));
        }
        Request::AcquireWait => {
            v.push(Arg::Bytes(token));
            v.push(Arg::Uint(args.ttl_ms));
            if let Some(line) = &args.line {
                v.push(Arg::Bytes(&line.id));
                v.push(Arg::Uint(line.alive_ms));
                v.push(Arg::Bytes(if line.polite { b"p" } else { b"" }));
                v.push(Arg::Uint(line.score));
                match (line.out, line.expect) {
                    (true, _) => v.push(Arg::Bytes(b"o")),
                    (false, Expect::Held) => v.push(Arg::Bytes(b"h")),
                    (false, Expect::InLine) => v.push(Arg::Bytes(b"l")),
                    (false, Expect::Free) => {}
                }
            }
        }
        Request::Release if args.leave.is_some() => {
            v.push(Arg::Bytes(token));
            if let Some(id) = &args.leave {
                v.push(Arg::Bytes(id));
            }
        }
        Request::Release | Request::FenceDraw => v.push(Arg::Bytes(token)),
        // `KEYS`: the resource, its line, its fencing counter; `ARGV[1]`: waiters to name.
        Request::Inspect => v.push(Arg::Uint(args.value)),
        // `KEYS`: the resource, its line.
        Request::ForceRelease => {}
        Request::Extend if args.put => {
            v.push(Arg::Bytes(token));
            v.push(Arg::Uint(args.ttl_ms));
            v.push(Arg::Bytes(b"put"));
        }
        _ => {
            v.push(Arg::Bytes(token));
            v.push(Arg::Uint(args.ttl_ms));
        }
    }
    resp::encode_command(out, &v);
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
            &[b'y'; 10][..],
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
        let want = format!(
            "*5\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n1\r\n$1\r\nk\r\n$32\r\n{}\r\n",
            scripts::RELEASE.sha,
            tok.as_str()
        );
        assert_eq!(String::from_utf8(out.clone()).unwrap(), want);
        out.clear();
        encode_request(&mut out, Request::Extend, &a, true);
        assert!(out.starts_with(b"*6\r\n$4\r\nEVAL\r\n"));
        assert!(out.ends_with(b"$4\r\n1500\r\n"));
    }
}
