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

/// Decimal width of `v`.
#[inline(always)]
fn width(v: u64) -> usize {
    // Lengths and integers in commands are mostly small: compare before the general log.
    if v < 10 {
        1
    } else if v < 100 {
        2
    } else if v < 1000 {
        3
    } else {
        wide(v)
    }
}

#[inline(never)]
fn wide(v: u64) -> usize {
    v.ilog10() as usize + 1
}

/// Bytes taken by `<t><n>\r\n`.
#[inline]
fn header_len(n: usize) -> usize {
    1 + width(n as u64) + 2
}

/// Small pieces (headers, CRLFs, formatted integers) gathered on the stack and appended
/// to the output in one `extend_from_slice`, instead of many tiny pushes.
struct Head {
    buf: [u8; Head::CAP],
    len: usize,
}

impl Head {
    const CAP: usize = 64;
    /// Flush before adding a piece when past this: one piece (`\r\n$<20>\r\n<20>\r\n`)
    /// never needs more than the rest.
    const FLUSH_AT: usize = Head::CAP - 32;

    #[inline]
    fn new() -> Head {
        Head {
            buf: [0; Head::CAP],
            len: 0,
        }
    }
    #[inline(always)]
    fn byte(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }
    #[inline(always)]
    fn crlf(&mut self) {
        self.byte(b'\r');
        self.byte(b'\n');
    }
    /// `v` in decimal, without allocating (two digits at a time for the common small case).
    #[inline(always)]
    fn unsigned(&mut self, v: u64) {
        if v < 10 {
            self.byte(b'0' + v as u8);
        } else if v < 100 {
            self.byte(b'0' + (v / 10) as u8);
            self.byte(b'0' + (v % 10) as u8);
        } else {
            self.long(v);
        }
    }
    #[inline(never)]
    fn long(&mut self, mut v: u64) {
        let w = width(v);
        let end = self.len + w;
        let mut p = end;
        while p > self.len {
            p -= 1;
            self.buf[p] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        self.len = end;
    }
    #[inline(always)]
    fn signed(&mut self, v: i64) {
        if v < 0 {
            self.byte(b'-');
        }
        self.unsigned(v.unsigned_abs());
    }
    /// `<t><n>\r\n`.
    #[inline(always)]
    fn header(&mut self, t: u8, n: usize) {
        self.byte(t);
        self.unsigned(n as u64);
        self.crlf();
    }
    #[inline(always)]
    fn flush(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.buf[..self.len]);
        self.len = 0;
    }
    #[inline(always)]
    fn room(&mut self, out: &mut Vec<u8>) {
        if self.len > Head::FLUSH_AT {
            self.flush(out);
        }
    }
}

/// Append `args` as one RESP command (an array of bulk strings) to `out`.
/// Never allocates once `out` has the capacity: the exact size is computed first and
/// reserved once.
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
    let mut head = Head::new();
    head.header(b'*', args.len());
    for a in args {
        head.room(out);
        match *a {
            Arg::Bytes(b) => {
                head.header(b'$', b.len());
                head.flush(out);
                out.extend_from_slice(b);
            }
            Arg::Int(v) => {
                head.header(b'$', usize::from(v < 0) + width(v.unsigned_abs()));
                head.signed(v);
            }
            Arg::Uint(v) => {
                head.header(b'$', width(v));
                head.unsigned(v);
            }
        }
        head.crlf();
    }
    head.flush(out);
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
    let mut head = Head::new();
    let line = |out: &mut Vec<u8>, t: u8, s: &[u8]| {
        out.push(t);
        out.extend_from_slice(s);
        out.extend_from_slice(b"\r\n");
    };
    match *frame {
        Frame::Simple(s) => line(out, b'+', s),
        Frame::Error(s) => line(out, b'-', s),
        Frame::Double(s) => line(out, b',', s),
        Frame::BigNumber(s) => line(out, b'(', s),
        Frame::Integer(v) => {
            head.byte(b':');
            head.signed(v);
            head.crlf();
            head.flush(out);
        }
        Frame::Bulk(b) | Frame::BulkError(b) => {
            let t = if matches!(frame, Frame::Bulk(_)) {
                b'$'
            } else {
                b'!'
            };
            head.header(t, b.len());
            head.flush(out);
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Frame::NullBulk => out.extend_from_slice(b"$-1\r\n"),
        Frame::NullArray => out.extend_from_slice(b"*-1\r\n"),
        Frame::Null => out.extend_from_slice(b"_\r\n"),
        Frame::Boolean(true) => out.extend_from_slice(b"#t\r\n"),
        Frame::Boolean(false) => out.extend_from_slice(b"#f\r\n"),
        Frame::Verbatim { format, text } => {
            head.header(b'=', format.len() + 1 + text.len());
            head.flush(out);
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
            head.header(t, a.len());
            head.flush(out);
            for e in a.iter() {
                write_frame(out, &e);
            }
        }
    }
}
