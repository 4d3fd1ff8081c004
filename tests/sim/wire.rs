//! Replies on the wire: a master's [`Answer`] encoded to RESP bytes, parsed back by the
//! client with `resp::parse`, and read with `rules::classify`, as the real client does.
//!
//! The library's `rules::classify` reads every reply of the protocol; the OLD scripts the
//! hazard tests bring back (the fenced acquire with `INCR`, the unconditional `FENCE_MAX`)
//! are no longer in the library, so [`classify`] reads those two itself.

use redlock_mux::resp::{self, Frame, Limits, Status};
use redlock_mux::rules::{self, ErrorText, Fault, Outcome, Request};

use super::master::{Answer, Msg};

/// What Redis 7 sends for `EVALSHA` of a script it does not have.
pub const NOSCRIPT: &[u8] = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";

/// Encode `a` into `buf`; returns the length.
pub fn encode(a: Answer, resp3: bool, buf: &mut [u8; 64]) -> usize {
    let put = |buf: &mut [u8; 64], s: &[u8]| {
        buf[..s.len()].copy_from_slice(s);
        s.len()
    };
    match a {
        Answer::Ok => put(buf, b"+OK\r\n"),
        Answer::Null if resp3 => put(buf, b"_\r\n"),
        Answer::Null => put(buf, b"$-1\r\n"),
        Answer::NoScript => put(buf, NOSCRIPT),
        Answer::Waiting { left, holder } => {
            let mut len = put(buf, b"*2\r\n");
            let mut int = [0u8; 64];
            let n = encode(Answer::Int(left), resp3, &mut int);
            buf[len..len + n].copy_from_slice(&int[..n]);
            len += n;
            let value = if holder == 0 {
                String::new()
            } else {
                format!("{holder:016x}")
            };
            let bulk = format!("${}\r\n{value}\r\n", value.len());
            buf[len..len + bulk.len()].copy_from_slice(bulk.as_bytes());
            len + bulk.len()
        }
        Answer::Int(n) => {
            let mut digits = [0u8; 24];
            let mut i = digits.len();
            let mut v = n.unsigned_abs();
            loop {
                i -= 1;
                digits[i] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            if n < 0 {
                i -= 1;
                digits[i] = b'-';
            }
            let mut len = put(buf, b":");
            len += {
                let d = &digits[i..];
                buf[len..len + d.len()].copy_from_slice(d);
                d.len()
            };
            buf[len..len + 2].copy_from_slice(b"\r\n");
            len + 2
        }
    }
}

/// The library's name for a request, where it has one (the OLD scripts have none).
pub fn request(msg: &Msg) -> Option<Request> {
    match msg {
        Msg::Set { keys, .. } if keys.len() == 1 => Some(Request::Acquire),
        Msg::Set { .. } => Some(Request::AcquireMany),
        Msg::Release { .. } => Some(Request::Release),
        Msg::AcquireWait { .. } => Some(Request::AcquireWait),
        Msg::Extend { .. } => Some(Request::Extend),
        Msg::Draw { .. } => Some(Request::FenceDraw),
        Msg::WriteBack { .. } => Some(Request::FenceWriteBack),
        Msg::OldFencedAcquire { .. } | Msg::OldFenceMax { .. } => None,
    }
}

/// What a reply to `msg` means, and its integer (0 when it is not one). `Err(())` for a
/// frame that can not be an answer to it. OLD fenced acquire: `n > 0` is yes with value
/// `n`, 0 is taken; OLD write-back: 1 is yes.
#[allow(clippy::result_unit_err)]
pub fn classify(msg: &Msg, frame: &Frame<'_>) -> Result<(Outcome, i64), ()> {
    let value = match frame {
        Frame::Integer(n) => *n,
        _ => 0,
    };
    let outcome = match request(msg) {
        Some(req) => rules::classify(req, frame)?,
        None => match (msg, frame) {
            (_, Frame::Error(e)) | (_, Frame::BulkError(e)) => {
                Outcome::Failed(Fault::Redis(ErrorText::new(e)))
            }
            (Msg::OldFencedAcquire { .. }, Frame::Integer(n)) if *n > 0 => Outcome::Ok,
            (Msg::OldFencedAcquire { .. }, Frame::Integer(0)) => Outcome::Taken,
            (Msg::OldFenceMax { .. }, Frame::Integer(1)) => Outcome::Ok,
            _ => return Err(()),
        },
    };
    Ok((outcome, value))
}

/// Encode, parse and classify: the client's view of `a` as a reply to `msg`; with an
/// `ACQUIRE_WAIT` refusal of one key, the holder's TTL left (as the integer) and its
/// fingerprint (the token its value starts with; 0 for `''`), read by `rules::holder_left`
/// as the engine does.
pub fn read(msg: &Msg, a: Answer, resp3: bool, limits: &Limits) -> (Outcome, i64, Option<u64>) {
    let mut buf = [0u8; 64];
    let len = encode(a, resp3, &mut buf);
    let bytes = &buf[..len];
    match resp::parse(bytes, limits) {
        Ok(Status::Complete((frame, used))) => {
            assert_eq!(used, bytes.len(), "one frame per reply");
            let holder = match &frame {
                Frame::Aggregate(agg) => {
                    let (left, h) = rules::holder_left(agg)
                        .unwrap_or_else(|| panic!("holder_left rejected {frame:?}"));
                    let h = std::str::from_utf8(h).expect("hex");
                    let fp = if h.is_empty() {
                        0
                    } else {
                        u64::from_str_radix(h, 16).expect("hex")
                    };
                    Some((left, fp))
                }
                _ => None,
            };
            match classify(msg, &frame) {
                Ok((o, v)) => match holder {
                    Some((left, fp)) => (o, left, Some(fp)),
                    None => (o, v, None),
                },
                Err(()) => {
                    panic!("classify({msg:?}) rejected a reply a real master sends: {frame:?}")
                }
            }
        }
        other => panic!("resp::parse on {bytes:?}: {other:?}"),
    }
}

/// `true` for the `-NOSCRIPT` error (the shell then re-sends the request with `EVAL`).
pub fn is_noscript(o: Outcome) -> bool {
    matches!(o, Outcome::Failed(Fault::Redis(t)) if t.starts_with(b"NOSCRIPT"))
}
