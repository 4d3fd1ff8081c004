//! RESP command and frame encoder. Sizes are computed first, the buffer is reserved once,
//! then extended; integers are formatted into a stack buffer.
use super::{AggregateKind, Frame};

/// One command argument: bytes, or an integer formatted in decimal without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// Raw bytes (binary-safe).
    Bytes(&'a [u8]),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    Uint(u64),
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(b: &'a [u8]) -> Self {
        Arg::Bytes(b)
    }
}
impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Bytes(s.as_bytes())
    }
}
impl<'a, const N: usize> From<&'a [u8; N]> for Arg<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        Arg::Bytes(b)
    }
}
impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}
impl From<u64> for Arg<'_> {
    fn from(v: u64) -> Self {
        Arg::Uint(v)
    }
}

/// A decimal number formatted on the stack (at most 20 bytes: `u64::MAX`, or `-` and the
/// 19 digits of `i64::MIN`).
struct Dec {
    buf: [u8; 20],
    start: usize,
}

impl Dec {
    #[inline]
    fn unsigned(mut v: u64) -> Dec {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        Dec { buf, start }
    }
    #[inline]
    fn signed(v: i64) -> Dec {
        let mut d = Dec::unsigned(v.unsigned_abs());
        if v < 0 {
            d.start -= 1;
            d.buf[d.start] = b'-';
        }
        d
    }
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Decimal width of `v`.
#[inline]
fn width(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// `<t><n>\r\n`.
#[inline]
fn header(out: &mut Vec<u8>, t: u8, n: usize) {
    out.push(t);
    out.extend_from_slice(Dec::unsigned(n as u64).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Bytes taken by `<t><n>\r\n`.
#[inline]
fn header_len(n: usize) -> usize {
    1 + width(n as u64) + 2
}

/// Append `args` as one RESP command (an array of bulk strings) to `out`.
/// Never allocates once `out` has the capacity.
///
/// ```
/// use redlock_mux::resp::{encode_command, Arg};
/// let mut out = Vec::new();
/// encode_command(&mut out, &[Arg::from("SET"), "k".into(), "v".into(), "PX".into(), Arg::Uint(30000)]);
/// assert_eq!(out, b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$5\r\n30000\r\n");
/// ```
pub fn encode_command(out: &mut Vec<u8>, args: &[Arg<'_>]) {
    let mut total = header_len(args.len());
    for a in args {
        let n = match *a {
            Arg::Bytes(b) => b.len(),
            Arg::Int(v) => usize::from(v < 0) + width(v.unsigned_abs()),
            Arg::Uint(v) => width(v),
        };
        total = total.saturating_add(header_len(n) + n + 2);
    }
    out.reserve(total);
    header(out, b'*', args.len());
    for a in args {
        match *a {
            Arg::Bytes(b) => {
                header(out, b'$', b.len());
                out.extend_from_slice(b);
            }
            Arg::Int(v) => {
                let d = Dec::signed(v);
                header(out, b'$', d.as_bytes().len());
                out.extend_from_slice(d.as_bytes());
            }
            Arg::Uint(v) => {
                let d = Dec::unsigned(v);
                header(out, b'$', d.as_bytes().len());
                out.extend_from_slice(d.as_bytes());
            }
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Append any frame (aggregates included) to `out`, in canonical form.
///
/// Aggregates are written by walking their elements, so attributes attached to nested
/// elements are dropped; everything the parser accepts is already canonical, so a parsed
/// frame is otherwise written back byte for byte. The recursion is bounded by the nesting
/// the parser allowed ([`Limits::HARD_MAX_DEPTH`](super::Limits::HARD_MAX_DEPTH) at most).
/// Frames built by hand are written as given: a `Simple` or `Error` holding CR or LF, or a
/// `Verbatim` format that is not 3 bytes, produces bytes the parser will reject.
pub fn encode_frame(out: &mut Vec<u8>, frame: &Frame<'_>) {
    out.reserve(frame_len(frame));
    write_frame(out, frame);
}

/// Exact size of a leaf; for an aggregate an upper bound (its header plus its raw body).
fn frame_len(frame: &Frame<'_>) -> usize {
    match *frame {
        Frame::Simple(s) | Frame::Error(s) | Frame::Double(s) | Frame::BigNumber(s) => s.len() + 3,
        Frame::Integer(v) => 3 + usize::from(v < 0) + width(v.unsigned_abs()),
        Frame::Bulk(b) | Frame::BulkError(b) => header_len(b.len()) + b.len() + 2,
        Frame::NullBulk | Frame::NullArray => 5,
        Frame::Null => 3,
        Frame::Boolean(_) => 4,
        Frame::Verbatim { format, text } => {
            let n = format.len() + 1 + text.len();
            header_len(n) + n + 2
        }
        Frame::Aggregate(a) => header_len(a.len()) + a.raw().len(),
    }
}

fn write_frame(out: &mut Vec<u8>, frame: &Frame<'_>) {
    let line = |out: &mut Vec<u8>, t: u8, s: &[u8]| {
        out.push(t);
        out.extend_from_slice(s);
        out.extend_from_slice(b"\r\n");
    };
    let blob = |out: &mut Vec<u8>, t: u8, b: &[u8]| {
        header(out, t, b.len());
        out.extend_from_slice(b);
        out.extend_from_slice(b"\r\n");
    };
    match *frame {
        Frame::Simple(s) => line(out, b'+', s),
        Frame::Error(s) => line(out, b'-', s),
        Frame::Integer(v) => line(out, b':', Dec::signed(v).as_bytes()),
        Frame::Bulk(b) => blob(out, b'$', b),
        Frame::NullBulk => out.extend_from_slice(b"$-1\r\n"),
        Frame::NullArray => out.extend_from_slice(b"*-1\r\n"),
        Frame::Null => out.extend_from_slice(b"_\r\n"),
        Frame::Boolean(true) => out.extend_from_slice(b"#t\r\n"),
        Frame::Boolean(false) => out.extend_from_slice(b"#f\r\n"),
        Frame::Double(s) => line(out, b',', s),
        Frame::BigNumber(s) => line(out, b'(', s),
        Frame::BulkError(b) => blob(out, b'!', b),
        Frame::Verbatim { format, text } => {
            header(out, b'=', format.len() + 1 + text.len());
            out.extend_from_slice(format);
            out.push(b':');
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
        Frame::Aggregate(a) => {
            let t = match a.kind() {
                AggregateKind::Array => b'*',
                AggregateKind::Map => b'%',
                AggregateKind::Set => b'~',
                AggregateKind::Push => b'>',
                AggregateKind::Attribute => b'|',
            };
            header(out, t, a.len());
            for e in a.iter() {
                write_frame(out, &e);
            }
        }
    }
}
