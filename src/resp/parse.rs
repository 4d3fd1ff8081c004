//! RESP parser: one scanner for a single item (a leaf value or an aggregate header), an
//! iterative validator for aggregates, and a lazy walker over validated aggregates.
//!
//! Every decision is taken at the first byte that makes it: a prefix of the input is
//! either `Partial` or fails with the very error the whole input fails with. That is what
//! lets [`Parser`] resume and still agree with [`parse`] on any split.
use super::{AggregateKind, Error, Frame, Limits, Status};

const CR: u8 = b'\r';
const LF: u8 = b'\n';

/// Smallest encoding of one value (`_\r\n`): the lower bound used for elements not yet seen.
const MIN_ITEM: usize = 3;

/// Defaults, chosen to bound what a hostile or broken server can make us buffer:
/// bulk 512 MiB (Redis' own `proto-max-bulk-len` default), 1 Mi elements per aggregate,
/// depth 32 (Redis replies nest a few levels; `HELLO`/`XINFO` stay far below) and 64 KiB
/// for a header or simple line (Redis' inline-protocol buffer is the same size).
pub(super) const DEFAULT_LIMITS: Limits = Limits {
    max_bulk_len: 512 * 1024 * 1024,
    max_elements: 1024 * 1024,
    max_depth: 32,
    max_line_len: 64 * 1024,
};

/// Limits used to re-walk bytes that were already validated: nothing can be over them.
const TRUSTED: Limits = Limits {
    max_bulk_len: usize::MAX,
    max_elements: usize::MAX,
    max_depth: Limits::HARD_MAX_DEPTH,
    max_line_len: usize::MAX,
};

pub(super) fn describe(e: &Error) -> &'static str {
    match e {
        Error::UnknownType(_) => "unknown RESP type byte",
        Error::BadLineEnding => "line not terminated by CRLF, or bare CR/LF inside a line",
        Error::BadInteger => "malformed decimal integer or length",
        Error::IntegerOverflow => "integer does not fit in i64",
        Error::BadLength => "length below -1, or a null length where null is not allowed",
        Error::MissingBulkTerminator => "missing CRLF after bulk data",
        Error::BadBoolean => "boolean is not #t or #f",
        Error::BadDouble => "malformed double",
        Error::BadBigNumber => "malformed big number",
        Error::BadNull => "null is not exactly _ followed by CRLF",
        Error::BadVerbatim => "verbatim string without a 3-byte format and ':'",
        Error::BulkTooLong => "bulk length over the limit",
        Error::TooManyElements => "aggregate element count over the limit",
        Error::TooDeep => "aggregates nested deeper than the limit",
        Error::LineTooLong => "line longer than the limit",
        Error::Unsupported => "RESP3 streamed strings and aggregates are not supported",
        Error::DanglingAttribute => "attribute not followed by a value",
    }
}

/// A validated aggregate: walk it with [`Aggregate::iter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate<'a> {
    kind: AggregateKind,
    len: usize,
    body: &'a [u8],
}

impl<'a> Aggregate<'a> {
    /// Which aggregate this is.
    pub fn kind(&self) -> AggregateKind {
        self.kind
    }
    /// Number of elements (for maps and attributes: number of pairs).
    pub fn len(&self) -> usize {
        self.len
    }
    /// `true` when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The encoded elements, exactly as received (attributes inside included).
    pub fn raw(&self) -> &'a [u8] {
        self.body
    }
    /// Walk the elements (maps and attributes: key, value, key, value...). Attributes
    /// attached to elements are skipped. The walk re-reads the validated bytes; it never
    /// allocates and never recurses (a nested aggregate is yielded as one
    /// [`Frame::Aggregate`], to be walked in turn).
    pub fn iter(&self) -> Elements<'a> {
        Elements {
            rest: self.body,
            left: items(self.kind, self.len),
        }
    }
}

impl<'a> IntoIterator for &Aggregate<'a> {
    type Item = Frame<'a>;
    type IntoIter = Elements<'a>;
    fn into_iter(self) -> Elements<'a> {
        self.iter()
    }
}

/// Iterator over an aggregate's elements.
#[derive(Debug, Clone)]
pub struct Elements<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = Frame<'a>;
    fn next(&mut self) -> Option<Frame<'a>> {
        while self.left > 0 {
            match item(self.rest, 0, &TRUSTED, 0) {
                Ok(Scan::Done(Item::Leaf(f), end)) => {
                    self.rest = self.rest.get(end..).unwrap_or_default();
                    self.left -= 1;
                    return Some(f);
                }
                Ok(Scan::Done(Item::Agg(kind, len), end)) => {
                    let Some(body_end) = skip(self.rest, end, items(kind, len)) else {
                        break;
                    };
                    let body = self.rest.get(end..body_end).unwrap_or_default();
                    self.rest = self.rest.get(body_end..).unwrap_or_default();
                    if kind != AggregateKind::Attribute {
                        self.left -= 1;
                        return Some(Frame::Aggregate(Aggregate { kind, len, body }));
                    }
                }
                // Only reachable when a `Parser` was fed a buffer that changed under it.
                _ => break,
            }
        }
        self.left = 0;
        None
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// Elements that follow an aggregate header: maps and attributes hold pairs.
#[inline]
fn items(kind: AggregateKind, len: usize) -> usize {
    match kind {
        AggregateKind::Map | AggregateKind::Attribute => len.saturating_mul(2),
        _ => len,
    }
}

/// Skip `pending` validated values starting at `pos`; returns the end position. A counter
/// is enough (no stack): a header adds its elements, a value takes one slot, an attribute
/// takes none.
fn skip(buf: &[u8], mut pos: usize, mut pending: usize) -> Option<usize> {
    while pending > 0 {
        match item(buf, pos, &TRUSTED, 0) {
            Ok(Scan::Done(Item::Leaf(_), end)) => {
                pending -= 1;
                pos = end;
            }
            Ok(Scan::Done(Item::Agg(kind, len), end)) => {
                if kind != AggregateKind::Attribute {
                    pending -= 1;
                }
                pending = pending.saturating_add(items(kind, len));
                pos = end;
            }
            _ => return None,
        }
    }
    Some(pos)
}

// ---------------------------------------------------------------------------------------
// Single-item scanner.

/// Progress of a scan. `Need` holds the smallest total buffer length that can complete it
/// (always greater than the current length).
enum Scan<T> {
    Done(T, usize),
    Need(usize),
}

type Res<T> = Result<Scan<T>, Error>;

/// One thing read at a position: a complete leaf value, or an aggregate header.
enum Item<'a> {
    Leaf(Frame<'a>),
    /// Kind and declared length (pairs for maps and attributes).
    Agg(AggregateKind, usize),
}

enum Len {
    Null,
    N(usize),
}

/// `true` when a line whose content bytes must lie below `cap` has gone past it by index
/// `q`, the byte that decides the line: a content byte (anything but CR and LF) at or
/// after `cap` exists. Checked once per decision rather than once per byte; the outcome
/// is the same as checking every byte in order.
#[inline(always)]
fn over_cap(buf: &[u8], q: usize, cap: usize) -> bool {
    q > cap || (q == cap && matches!(buf.get(q), Some(&b) if b != CR && b != LF))
}

/// `buf[p]` is CR: the line ends there if LF follows.
#[inline(always)]
fn crlf<T>(buf: &[u8], p: usize, v: T) -> Res<T> {
    match buf.get(p + 1) {
        Some(&LF) => Ok(Scan::Done(v, p + 2)),
        Some(_) => Err(Error::BadLineEnding),
        None => Ok(Scan::Need(p + 2)),
    }
}

/// Index of the first CR or LF in `buf[p..stop]`, or `stop` when there is none.
///
/// Eight bytes at a time (SWAR): one has-less-than test per word flags the bytes below
/// 14, CR (13) and LF (10) among them. The lowest flagged byte is exact (a borrow can only
/// spoil the flags above a byte that really is below 14), so it is the first such byte;
/// when it is some other control byte (a tab, say) it is content and the scan goes on
/// right after it. Fewer than eight bytes before `stop`: the last word up to `stop` is
/// read again with the bytes already scanned shifted out (0xFF comes in, never flagged).
/// Only a line shorter than a word (or what follows a control byte in that last word)
/// is read one byte at a time.
#[inline(always)]
fn line_end(buf: &[u8], p: usize, stop: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Bytes below 14 flagged in their high bit: exact up to the first such byte.
    let flag = |w: u64| w.wrapping_sub(ONES * 14) & !w & HIGH;
    let hay = buf.get(..stop).unwrap_or(buf);
    let mut rest = hay.get(p..).unwrap_or_default();
    let at = |rest: &[u8]| hay.len() - rest.len();
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        let w = u64::from_le_bytes(*word);
        let low = flag(w);
        if low == 0 {
            rest = tail;
            continue;
        }
        let k = low.trailing_zeros() / 8;
        if matches!((w >> (8 * k)) as u8, CR | LF) {
            return at(rest) + k as usize;
        }
        rest = &rest[k as usize + 1..];
    }
    if let (Some(last), false) = (hay.last_chunk::<8>(), rest.is_empty()) {
        // 1 to 7 bytes left (the shift is 8 to 56 bits): the last word, with the bytes
        // already scanned shifted out and 0xFF (never flagged) shifted in.
        let gone = 8 * (8 - rest.len()) as u32;
        let w = (u64::from_le_bytes(*last) >> gone) | !(u64::MAX >> gone);
        let low = flag(w);
        if low == 0 {
            return hay.len();
        }
        let k = low.trailing_zeros() / 8;
        if matches!((w >> (8 * k)) as u8, CR | LF) {
            return at(rest) + k as usize;
        }
        // A control byte that is content: the few bytes after it, one at a time.
        rest = rest.get(k as usize + 1..).unwrap_or_default();
    }
    rest.iter()
        .position(|&b| b <= CR && (b == CR || b == LF))
        .map_or(hay.len(), |k| at(rest) + k)
}

/// A text line whose content starts at `start`, scanning from `from` (bytes in
/// `start..from` are already known to be content). Returns the index of the ending CR.
#[inline(always)]
fn line(buf: &[u8], start: usize, from: usize, max_len: usize) -> Res<usize> {
    let cap = start.saturating_add(max_len);
    let stop = buf.len().min(cap);
    // Never resume past the limit: the byte there still has to be looked at.
    let p = line_end(buf, from.max(start).min(stop), stop);
    // `p` is at CR, LF, the end of the input, or the first byte past the limit.
    match buf.get(p) {
        Some(&CR) => crlf(buf, p, p),
        Some(&LF) => Err(Error::BadLineEnding),
        Some(_) => Err(Error::LineTooLong),
        None => Ok(Scan::Need(p + 2)),
    }
}

/// Decimal digits from `p` while the value stays within `max`: the value, the index of
/// the first byte that is not a digit (or whose digit would pass `max`), and whether it
/// stopped because of `max`.
#[inline(always)]
fn digits(buf: &[u8], p: usize, max: u64) -> (u64, usize, bool) {
    let mut n = 0u64;
    let mut q = p;
    // 18 digits cannot overflow a u64: plain arithmetic, one compare against `max`.
    let fast_end = buf.len().min(p + 18);
    while q < fast_end {
        let d = buf[q].wrapping_sub(b'0');
        if d > 9 {
            return (n, q, false);
        }
        let v = n * 10 + u64::from(d);
        if v > max {
            return (n, q, true);
        }
        n = v;
        q += 1;
    }
    while let Some(&b) = buf.get(q) {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return (n, q, false);
        }
        match n.checked_mul(10).and_then(|n| n.checked_add(u64::from(d))) {
            Some(v) if v <= max => n = v,
            _ => return (n, q, true),
        }
        q += 1;
    }
    (n, q, false)
}

/// The line of a number ends at `q` (the first byte after the digits): CRLF, or an error.
/// `need` is the lower bound when the input stops at `q`.
#[inline(always)]
fn number_end<T>(buf: &[u8], q: usize, cap: usize, any: bool, need: usize, v: T) -> Res<T> {
    if over_cap(buf, q, cap) {
        return Err(Error::LineTooLong);
    }
    match buf.get(q) {
        Some(&CR) if any => crlf(buf, q, v),
        Some(&LF) => Err(Error::BadLineEnding),
        Some(_) => Err(Error::BadInteger),
        None => Ok(Scan::Need(need)),
    }
}

/// A length line starting at `i`: `-1`, `0` or `[1-9][0-9]*`, then CRLF. A value over
/// `max` fails with `too_big` at the digit that passes it; `?` (streamed) is unsupported.
#[inline(always)]
fn length(buf: &[u8], i: usize, cap: usize, max: usize, too_big: Error) -> Res<Len> {
    match buf.get(i) {
        Some(&b'-') => {
            let one = buf.get(i + 1) == Some(&b'1');
            let q = i + 1 + usize::from(one);
            if over_cap(buf, q, cap) {
                return Err(Error::LineTooLong);
            }
            return match buf.get(q) {
                None => Ok(Scan::Need(i + 4)),
                Some(&CR) if one => crlf(buf, q, Len::Null),
                Some(&LF) => Err(Error::BadLineEnding),
                // `-1` followed by a digit, or `-2`..`-9`: below -1.
                Some(b'0'..=b'9') if one => Err(Error::BadLength),
                Some(b'2'..=b'9') => Err(Error::BadLength),
                Some(_) => Err(Error::BadInteger),
            };
        }
        Some(&b'?') if !over_cap(buf, i, cap) => return Err(Error::Unsupported),
        _ => {}
    }
    let (n, q, over) = digits(buf, i, max as u64);
    if q > i + 1 && buf[i] == b'0' {
        // A leading zero, decided at the digit after it.
        return Err(if over_cap(buf, i + 1, cap) {
            Error::LineTooLong
        } else {
            Error::BadInteger
        });
    }
    if over && !over_cap(buf, q, cap) {
        return Err(too_big);
    }
    let need = if q == i { i + 3 } else { q + 2 };
    // `n <= max`, so it fits in usize.
    number_end(buf, q, cap, q > i, need, Len::N(n as usize))
}

/// A `:` integer line starting at `i`: optional `-`, then `0` or `[1-9][0-9]*` (no `+`,
/// no leading zeros, no `-0`), within i64.
#[inline(always)]
fn integer(buf: &[u8], i: usize, cap: usize) -> Res<i64> {
    let neg = buf.get(i) == Some(&b'-');
    let s = i + usize::from(neg);
    let limit = if neg {
        i64::MIN.unsigned_abs()
    } else {
        i64::MAX as u64
    };
    let (n, q, over) = digits(buf, s, limit);
    if q > s && buf[s] == b'0' && (neg || q > s + 1) {
        // `-0`, decided at the `0`, or a leading zero, decided at the digit after it.
        let at = if neg { s } else { s + 1 };
        return Err(if over_cap(buf, at, cap) {
            Error::LineTooLong
        } else {
            Error::BadInteger
        });
    }
    if over && !over_cap(buf, q, cap) {
        return Err(Error::IntegerOverflow);
    }
    // n <= 2^63; for 2^63 the cast gives i64::MIN and negation keeps it.
    let v = if neg {
        (n as i64).wrapping_neg()
    } else {
        n as i64
    };
    let need = if q == s { s + 3 } else { q + 2 };
    number_end(buf, q, cap, q > s, need, v)
}

/// `-?inf` or `-?nan` (any case: Redis before 7.2 printed doubles with the C library,
/// which can spell them `-nan` or `NAN`), or `-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn valid_double(s: &[u8]) -> bool {
    let unsigned = s.strip_prefix(b"-").unwrap_or(s);
    if unsigned.eq_ignore_ascii_case(b"inf") || unsigned.eq_ignore_ascii_case(b"nan") {
        return true;
    }
    let digits = |s: &[u8], mut i: usize| {
        let from = i;
        while s.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        (i > from).then_some(i)
    };
    let i = usize::from(s.first() == Some(&b'-'));
    let Some(mut i) = digits(s, i) else {
        return false;
    };
    if s.get(i) == Some(&b'.') {
        match digits(s, i + 1) {
            Some(j) => i = j,
            None => return false,
        }
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        match digits(s, i) {
            Some(j) => i = j,
            None => return false,
        }
    }
    i == s.len()
}

/// `-?[0-9]+`.
fn valid_big_number(s: &[u8]) -> bool {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

/// Read one item at `pos`. `hint` (>= the line start, or 0) is how far a text line at
/// `pos` was already scanned by an earlier call on a prefix of the same bytes.
#[inline(always)]
fn item<'a>(buf: &'a [u8], pos: usize, lim: &Limits, hint: usize) -> Res<Item<'a>> {
    let Some(&t) = buf.get(pos) else {
        return Ok(Scan::Need(pos + MIN_ITEM));
    };
    let i = pos + 1;
    let cap = i.saturating_add(lim.max_line_len);
    let kind = match t {
        b'+' | b'-' | b',' | b'(' => return text_line(buf, t, i, hint, lim.max_line_len),
        b':' => return int_item(buf, i, cap),
        b'$' | b'!' | b'=' => return text_blob(buf, t, i, cap, lim),
        b'_' => return null_item(buf, i),
        b'#' => {
            let v = match buf.get(i) {
                None => return Ok(Scan::Need(i + 3)),
                Some(b't') => true,
                Some(b'f') => false,
                Some(_) => return Err(Error::BadBoolean),
            };
            return match (buf.get(i + 1), buf.get(i + 2)) {
                (Some(&CR), Some(&LF)) => Ok(Scan::Done(Item::Leaf(Frame::Boolean(v)), i + 3)),
                (Some(&CR), None) | (None, _) => Ok(Scan::Need(i + 3)),
                _ => Err(Error::BadBoolean),
            };
        }
        b'*' => AggregateKind::Array,
        b'%' => AggregateKind::Map,
        b'~' => AggregateKind::Set,
        b'>' => AggregateKind::Push,
        b'|' => AggregateKind::Attribute,
        b';' | b'.' => return Err(Error::Unsupported),
        _ => return Err(Error::UnknownType(t)),
    };
    let max = match kind {
        AggregateKind::Map | AggregateKind::Attribute => lim.max_elements / 2,
        _ => lim.max_elements,
    };
    Ok(match length(buf, i, cap, max, Error::TooManyElements)? {
        Scan::Done(Len::N(n), e) => Scan::Done(Item::Agg(kind, n), e),
        Scan::Done(Len::Null, e) if kind == AggregateKind::Array => {
            Scan::Done(Item::Leaf(Frame::NullArray), e)
        }
        Scan::Done(Len::Null, _) => return Err(Error::BadLength),
        Scan::Need(k) => Scan::Need(k),
    })
}

/// `+`, `-`, `,` and `(`: a text line, validated for its type.
#[inline(always)]
fn text_line(buf: &[u8], t: u8, i: usize, hint: usize, max_len: usize) -> Res<Item<'_>> {
    let (e, end) = match line(buf, i, hint, max_len)? {
        Scan::Done(e, end) => (e, end),
        Scan::Need(k) => return Ok(Scan::Need(k)),
    };
    let s = &buf[i..e];
    let f = match t {
        b'+' => Frame::Simple(s),
        b'-' => Frame::Error(s),
        b',' if valid_double(s) => Frame::Double(s),
        b',' => return Err(Error::BadDouble),
        _ if valid_big_number(s) => Frame::BigNumber(s),
        _ => return Err(Error::BadBigNumber),
    };
    Ok(Scan::Done(Item::Leaf(f), end))
}

#[inline(always)]
fn int_item(buf: &[u8], i: usize, cap: usize) -> Res<Item<'_>> {
    Ok(match integer(buf, i, cap)? {
        Scan::Done(v, e) => Scan::Done(Item::Leaf(Frame::Integer(v)), e),
        Scan::Need(k) => Scan::Need(k),
    })
}

#[inline(always)]
fn null_item(buf: &[u8], i: usize) -> Res<Item<'_>> {
    match (buf.get(i), buf.get(i + 1)) {
        (Some(&CR), Some(&LF)) => Ok(Scan::Done(Item::Leaf(Frame::Null), i + 2)),
        (Some(&CR), None) | (None, _) => Ok(Scan::Need(i + 2)),
        _ => Err(Error::BadNull),
    }
}

/// `$` bulk, `!` bulk error and `=` verbatim: a length line, the payload, CRLF.
#[inline(always)]
fn text_blob<'a>(buf: &'a [u8], t: u8, i: usize, cap: usize, lim: &Limits) -> Res<Item<'a>> {
    let (n, p) = match length(buf, i, cap, lim.max_bulk_len, Error::BulkTooLong)? {
        Scan::Need(k) => return Ok(Scan::Need(k)),
        Scan::Done(Len::Null, p) if t == b'$' => {
            return Ok(Scan::Done(Item::Leaf(Frame::NullBulk), p))
        }
        Scan::Done(Len::Null, _) => return Err(Error::BadLength),
        // A verbatim length must leave room for `fmt:`; decided as soon as it is read.
        Scan::Done(Len::N(n), _) if t == b'=' && n < 4 => return Err(Error::BadVerbatim),
        Scan::Done(Len::N(n), p) => (n, p),
    };
    let e = p.checked_add(n).ok_or(Error::BulkTooLong)?;
    let end = e.checked_add(2).ok_or(Error::BulkTooLong)?;
    match (buf.get(e), buf.get(e + 1)) {
        (Some(&CR), Some(&LF)) => {}
        (Some(&CR), None) | (None, _) => return Ok(Scan::Need(end)),
        _ => return Err(Error::MissingBulkTerminator),
    }
    let s = &buf[p..e];
    let f = match t {
        b'$' => Frame::Bulk(s),
        b'!' => Frame::BulkError(s),
        _ if s[3] == b':' => Frame::Verbatim {
            format: &s[..3],
            text: &s[4..],
        },
        _ => return Err(Error::BadVerbatim),
    };
    Ok(Scan::Done(Item::Leaf(f), end))
}

// ---------------------------------------------------------------------------------------
// Aggregate validation: an explicit stack of per-level remaining counts, no recursion.

/// Everything needed to resume validating after `Partial`. Positions are absolute offsets
/// into the buffer; the per-level counts live in a separate slice (`stack`).
#[derive(Debug, Clone, Copy)]
struct Walk {
    /// Start of the next item to read (everything before it is validated).
    pos: usize,
    /// Open aggregate levels; level `d` has `stack[d]` elements left.
    depth: usize,
    /// Bit `d` set: level `d` is an attribute.
    attrs: u128,
    /// The last thing completed was an attribute: the next item must be a value.
    after_attr: bool,
    /// How far the text line at `pos` was scanned (0: not at all).
    hint: usize,
    /// The top-level aggregate has started: its kind, length and body start.
    has_top: bool,
    top_kind: AggregateKind,
    top_len: usize,
    top_start: usize,
    /// A top-level attribute: its length, body start and body end (set when it closes).
    has_attr: bool,
    attr_len: usize,
    attr_start: usize,
    attr_end: usize,
}

enum Run<'a> {
    Done(Option<Aggregate<'a>>, Frame<'a>, usize),
    Partial(usize),
    /// The stack slice is full: continue with a larger one.
    Grow,
}

impl Walk {
    const NEW: Walk = Walk {
        pos: 0,
        depth: 0,
        attrs: 0,
        after_attr: false,
        hint: 0,
        has_top: false,
        top_kind: AggregateKind::Array,
        top_len: 0,
        top_start: 0,
        has_attr: false,
        attr_len: 0,
        attr_start: 0,
        attr_end: 0,
    };

    fn attribute<'a>(&self, buf: &'a [u8]) -> Option<Aggregate<'a>> {
        self.has_attr.then(|| Aggregate {
            kind: AggregateKind::Attribute,
            len: self.attr_len,
            body: &buf[self.attr_start..self.attr_end],
        })
    }

    /// Validate from `self.pos` until the top-level value is complete.
    fn run<'a>(
        &mut self,
        buf: &'a [u8],
        stack: &mut [usize],
        lim: &Limits,
    ) -> Result<Run<'a>, Error> {
        let max_depth = lim.max_depth.min(Limits::HARD_MAX_DEPTH);
        loop {
            while self.depth > 0 && stack[self.depth - 1] == 0 {
                self.depth -= 1;
                let bit = 1u128 << self.depth;
                if self.attrs & bit != 0 {
                    self.attrs &= !bit;
                    self.after_attr = true;
                    if self.depth == 0 {
                        self.attr_end = self.pos;
                    }
                } else if self.depth == 0 {
                    let agg = Aggregate {
                        kind: self.top_kind,
                        len: self.top_len,
                        body: &buf[self.top_start..self.pos],
                    };
                    return Ok(Run::Done(
                        self.attribute(buf),
                        Frame::Aggregate(agg),
                        self.pos,
                    ));
                }
            }
            match item(buf, self.pos, lim, self.hint)? {
                Scan::Need(k) => {
                    self.hint = buf.len().saturating_sub(1);
                    // Elements still owed after the one being read, each at least 3 bytes.
                    let owed = stack[..self.depth]
                        .iter()
                        .fold(usize::from(!self.has_top), |a, &n| a.saturating_add(n))
                        .saturating_sub(1);
                    let more = k.saturating_sub(buf.len()).max(1);
                    return Ok(Run::Partial(
                        more.saturating_add(owed.saturating_mul(MIN_ITEM)),
                    ));
                }
                Scan::Done(Item::Leaf(f), end) => {
                    self.after_attr = false;
                    self.pos = end;
                    self.hint = 0;
                    if self.depth == 0 {
                        return Ok(Run::Done(self.attribute(buf), f, end));
                    }
                    stack[self.depth - 1] -= 1;
                }
                Scan::Done(Item::Agg(kind, len), end) => {
                    let is_attr = kind == AggregateKind::Attribute;
                    if is_attr && self.after_attr {
                        return Err(Error::DanglingAttribute);
                    }
                    if self.depth >= max_depth {
                        return Err(Error::TooDeep);
                    }
                    if self.depth >= stack.len() {
                        return Ok(Run::Grow);
                    }
                    if self.depth == 0 {
                        if is_attr {
                            self.has_attr = true;
                            self.attr_len = len;
                            self.attr_start = end;
                        } else {
                            self.has_top = true;
                            self.top_kind = kind;
                            self.top_len = len;
                            self.top_start = end;
                        }
                    } else if !is_attr {
                        stack[self.depth - 1] -= 1;
                    }
                    if is_attr {
                        self.attrs |= 1u128 << self.depth;
                    } else {
                        self.after_attr = false;
                    }
                    stack[self.depth] = items(kind, len);
                    self.depth += 1;
                    self.pos = end;
                    self.hint = 0;
                }
            }
        }
    }
}

type Parsed<'a> = Result<Status<(Option<Aggregate<'a>>, Frame<'a>, usize)>, Error>;

/// Stack entries tried first by the stateless parser: most replies nest far less, and a
/// small array is cheaper to set up. Deeper input moves to a full-size stack mid-way.
const SMALL_STACK: usize = 8;

#[inline(never)]
fn parse_aggregate<'a>(buf: &'a [u8], lim: &Limits) -> Parsed<'a> {
    let mut walk = Walk::NEW;
    let mut small = [0usize; SMALL_STACK];
    let run = match walk.run(buf, &mut small, lim)? {
        Run::Grow => {
            let mut big = [0usize; Limits::HARD_MAX_DEPTH];
            big[..SMALL_STACK].copy_from_slice(&small);
            walk.run(buf, &mut big, lim)?
        }
        run => run,
    };
    Ok(match run {
        Run::Done(a, f, n) => Status::Complete((a, f, n)),
        Run::Partial(n) => Status::Partial(n),
        Run::Grow => unreachable!("a full-size stack never grows"),
    })
}

/// Parse one frame from the start of `buf`. Attributes before the value are validated and
/// skipped (they are part of `consumed`).
///
/// `Ok(Status::Partial(n))` means `buf` is a strict prefix of a valid frame and at least
/// `n` more bytes are needed; calling again with more bytes re-reads the whole frame (use
/// [`Parser`] to resume instead when replies can be large).
#[inline]
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Result<Status<(Frame<'a>, usize)>, Error> {
    // The five whole replies a lock client lives on (`+OK`, `$-1`, `:0`, `:1`, `_`) are
    // compared as literals, inline in the caller, each in the arm of its type byte, so no
    // other reply pays for them. A line limit under 2 (the longest of their lines) sends
    // them the general way, which rejects what it must. Other replies of those types get
    // their own small functions (each with its own minimal prologue); everything else goes
    // through the general path.
    let lit = limits.max_line_len >= 2;
    match buf.first() {
        Some(b'+') if lit && line5(buf, OK_CR) => {
            Ok(Status::Complete((Frame::Simple(&buf[1..3]), 5)))
        }
        Some(b'+') => parse_simple(buf, limits),
        Some(b'$') if lit && line5(buf, NULL_BULK_CR) => Ok(Status::Complete((Frame::NullBulk, 5))),
        Some(b'$') => parse_bulk(buf, limits),
        Some(b':') => match zero_or_one(buf) {
            Some(v) if lit => Ok(Status::Complete((Frame::Integer(v), 4))),
            _ => parse_integer(buf, limits),
        },
        Some(b'_') if buf.get(1..3) == Some(b"\r\n") => Ok(Status::Complete((Frame::Null, 3))),
        Some(b'_') => parse_null(buf),
        Some(b'-') => parse_error(buf, limits),
        _ => parse_general(buf, limits),
    }
}

type Parsed1<'a> = Result<Status<(Frame<'a>, usize)>, Error>;

/// The first four bytes of a reply as one little-endian word.
const fn word(b: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*b)
}
const OK_CR: u32 = word(b"+OK\r");
const NULL_BULK_CR: u32 = word(b"$-1\r");
const ZERO: u32 = word(b":0\r\n");

/// `buf` starts with the 5-byte line `w` (its first 4 bytes as one word), then LF.
#[inline(always)]
fn line5(buf: &[u8], w: u32) -> bool {
    buf.first_chunk::<4>()
        .is_some_and(|h| u32::from_le_bytes(*h) == w)
        && buf.get(4) == Some(&LF)
}

/// `:0\r\n` or `:1\r\n` (they differ in one bit): the value.
#[inline(always)]
fn zero_or_one(buf: &[u8]) -> Option<i64> {
    let d = u32::from_le_bytes(*buf.first_chunk::<4>()?) ^ ZERO;
    (d & !(1 << 8) == 0).then_some(i64::from(d >> 8))
}

#[inline(always)]
fn leaf_status<'a>(r: Res<Item<'a>>, buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    match r? {
        Scan::Done(Item::Leaf(f), n) => Ok(Status::Complete((f, n))),
        Scan::Need(k) => Ok(Status::Partial(k - buf.len())),
        // Leaf types never open an aggregate.
        Scan::Done(Item::Agg(..), _) => parse_general(buf, limits),
    }
}

/// Fast path: 1 to 18 canonical digits (no overflow possible) at `s`, then CRLF. Returns
/// the value and the end of the line; `None` sends the caller to the general path, which
/// decides every other case (and agrees with this one where both apply).
#[inline(always)]
fn short_number(buf: &[u8], s: usize) -> Option<(u64, usize)> {
    let end = buf.len().min(s + 18);
    let mut n = 0u64;
    let mut q = s;
    while q < end {
        let d = buf[q].wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        n = n * 10 + u64::from(d);
        q += 1;
    }
    let canonical = q == s + 1 || (q > s + 1 && buf[s] != b'0');
    (canonical && buf.get(q) == Some(&CR) && buf.get(q + 1) == Some(&LF)).then_some((n, q + 2))
}

/// A `+` or `-` line: the SWAR scan from the first content byte.
#[inline(always)]
fn simple_line<'a>(buf: &'a [u8], limits: &Limits) -> Result<Status<(&'a [u8], usize)>, Error> {
    match line(buf, 1, 1, limits.max_line_len)? {
        Scan::Done(e, end) => Ok(Status::Complete((&buf[1..e], end))),
        Scan::Need(k) => Ok(Status::Partial(k - buf.len())),
    }
}

#[inline(never)]
fn parse_simple<'a>(buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    Ok(match simple_line(buf, limits)? {
        Status::Complete((s, n)) => Status::Complete((Frame::Simple(s), n)),
        Status::Partial(n) => Status::Partial(n),
    })
}

#[inline(never)]
fn parse_error<'a>(buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    Ok(match simple_line(buf, limits)? {
        Status::Complete((s, n)) => Status::Complete((Frame::Error(s), n)),
        Status::Partial(n) => Status::Partial(n),
    })
}

#[inline(never)]
fn parse_integer<'a>(buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    let neg = buf.get(1) == Some(&b'-');
    let s = 1 + usize::from(neg);
    if let Some((n, end)) = short_number(buf, s) {
        // Content is everything between ':' and CRLF.
        if end - 3 <= limits.max_line_len && !(neg && n == 0) {
            let v = if neg { -(n as i64) } else { n as i64 };
            return Ok(Status::Complete((Frame::Integer(v), end)));
        }
    }
    integer_general(buf, limits)
}

#[inline(never)]
fn integer_general<'a>(buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    let cap = 1usize.saturating_add(limits.max_line_len);
    leaf_status(int_item(buf, 1, cap), buf, limits)
}

#[inline(never)]
fn parse_bulk<'a>(buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    if limits.max_line_len >= 18 {
        if buf.get(1) == Some(&b'-') {
            if buf.get(2..5) == Some(b"1\r\n") {
                return Ok(Status::Complete((Frame::NullBulk, 5)));
            }
        } else if let Some((n, p)) = short_number(buf, 1) {
            if n <= limits.max_bulk_len as u64 {
                // `n <= max_bulk_len` fits in usize; the sum may not on 32-bit targets.
                if let Some(e) = p.checked_add(n as usize) {
                    if e + 1 < buf.len() && buf[e] == CR && buf[e + 1] == LF {
                        return Ok(Status::Complete((Frame::Bulk(&buf[p..e]), e + 2)));
                    }
                }
            }
        }
    }
    bulk_general(buf, limits)
}

#[inline(never)]
fn bulk_general<'a>(buf: &'a [u8], limits: &Limits) -> Parsed1<'a> {
    let cap = 1usize.saturating_add(limits.max_line_len);
    leaf_status(text_blob(buf, b'$', 1, cap, limits), buf, limits)
}

#[inline(never)]
fn parse_null(buf: &[u8]) -> Parsed1<'_> {
    leaf_status(null_item(buf, 1), buf, &DEFAULT_LIMITS)
}

#[inline(never)]
fn parse_general<'a>(buf: &'a [u8], limits: &Limits) -> Result<Status<(Frame<'a>, usize)>, Error> {
    Ok(match parse_with_attribute(buf, limits)? {
        Status::Complete((_, f, n)) => Status::Complete((f, n)),
        Status::Partial(n) => Status::Partial(n),
    })
}

/// Like [`parse`], also returning the attribute that preceded the value, if any.
#[allow(clippy::type_complexity)]
pub fn parse_with_attribute<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Status<(Option<Aggregate<'a>>, Frame<'a>, usize)>, Error> {
    match item(buf, 0, limits, 0)? {
        Scan::Done(Item::Leaf(f), n) => Ok(Status::Complete((None, f, n))),
        Scan::Need(k) => Ok(Status::Partial(k - buf.len())),
        Scan::Done(Item::Agg(..), _) => parse_aggregate(buf, limits),
    }
}

/// Resumable parser, for replies that arrive in pieces.
///
/// Contract: call [`Parser::parse`] with a buffer that starts with the same bytes as the
/// buffer of the previous call (more may have been appended). After `Partial` the parser
/// keeps the position it reached, the nesting stack (remaining elements per level) and the
/// pending attribute state, so it continues from there: every byte of a large reply is
/// validated once, however it is split. After `Complete` or an error it starts afresh on
/// the next call (so the caller drops the consumed bytes, or the connection, in between).
/// Call [`Parser::reset`] whenever the buffer is replaced by something else.
///
/// For any input and any sequence of growing prefixes, the results are exactly those of
/// the stateless [`parse`] on the same prefixes (`Partial` sizes included). If the
/// contract is broken the results are unspecified, but it never panics.
#[derive(Debug, Clone)]
pub struct Parser {
    limits: Limits,
    /// `true` while an aggregate (or top-level attribute) is half validated.
    active: bool,
    walk: Walk,
    /// How far a top-level text line was scanned (when not `active`).
    hint: usize,
    stack: [usize; Limits::HARD_MAX_DEPTH],
}

impl Parser {
    /// A parser with these limits.
    pub fn new(limits: Limits) -> Self {
        Parser {
            limits,
            active: false,
            walk: Walk::NEW,
            hint: 0,
            stack: [0; Limits::HARD_MAX_DEPTH],
        }
    }
    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// Forget any saved progress (call when the buffer is replaced).
    pub fn reset(&mut self) {
        self.active = false;
        self.hint = 0;
    }
    /// Parse one frame from the start of `buf`, resuming saved progress.
    #[inline]
    pub fn parse<'a>(&mut self, buf: &'a [u8]) -> Result<Status<(Frame<'a>, usize)>, Error> {
        Ok(match self.parse_with_attribute(buf)? {
            Status::Complete((_, f, n)) => Status::Complete((f, n)),
            Status::Partial(n) => Status::Partial(n),
        })
    }
    /// Like [`Parser::parse`], also returning the top-level attribute, if any.
    #[allow(clippy::type_complexity)]
    pub fn parse_with_attribute<'a>(
        &mut self,
        buf: &'a [u8],
    ) -> Result<Status<(Option<Aggregate<'a>>, Frame<'a>, usize)>, Error> {
        if self.active && buf.len() < self.walk.pos {
            self.reset();
        }
        if !self.active {
            if self.hint == 0 && matches!(buf.first(), Some(b'+' | b'-' | b':' | b'$' | b'_')) {
                // A fresh leaf: the fast paths of `parse`. Only a text line has progress
                // worth keeping (how far it was scanned); other leaves re-check in O(1).
                let r = parse(buf, &self.limits)?;
                if r.is_partial() {
                    self.hint = buf.len().saturating_sub(1);
                }
                return Ok(match r {
                    Status::Complete((f, n)) => Status::Complete((None, f, n)),
                    Status::Partial(n) => Status::Partial(n),
                });
            }
            if self.hint > buf.len() {
                self.hint = 0;
            }
            match item(buf, 0, &self.limits, self.hint) {
                Ok(Scan::Done(Item::Leaf(f), n)) => {
                    self.hint = 0;
                    return Ok(Status::Complete((None, f, n)));
                }
                Ok(Scan::Need(k)) => {
                    self.hint = buf.len().saturating_sub(1);
                    return Ok(Status::Partial(k - buf.len()));
                }
                Ok(Scan::Done(Item::Agg(..), _)) => {
                    self.walk = Walk::NEW;
                    self.active = true;
                }
                Err(e) => {
                    self.hint = 0;
                    return Err(e);
                }
            }
        }
        match self.walk.run(buf, &mut self.stack, &self.limits) {
            Ok(Run::Partial(n)) => Ok(Status::Partial(n)),
            Ok(Run::Done(a, f, n)) => {
                self.reset();
                Ok(Status::Complete((a, f, n)))
            }
            Ok(Run::Grow) => unreachable!("a full-size stack never grows"),
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new(Limits::default())
    }
}
