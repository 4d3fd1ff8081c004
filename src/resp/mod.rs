//! A strict, bounded, zero-allocation RESP2/RESP3 codec.
//!
//! * [`parse`] is stateless and `httparse`-like: it parses one frame from the start of a
//!   buffer and returns `Ok(Status::Complete((frame, consumed)))`, `Ok(Status::Partial(n))`
//!   (a strict prefix of a valid frame; at least `n` more bytes are needed) or a small
//!   `Copy` [`Error`]. Frames borrow from the buffer; nothing is ever allocated.
//! * [`Parser`] is the resumable form: after `Partial` it keeps the position, the nesting
//!   stack and the attribute state, so a large reply arriving in small pieces is validated
//!   once (no O(n^2)). It returns exactly what [`parse`] returns on the same bytes.
//! * Aggregates are validated once, iteratively (an explicit stack of at most
//!   [`Limits::HARD_MAX_DEPTH`] levels, never recursion), then walked lazily through
//!   [`Aggregate::iter`].
//! * [`encode_command`] writes a command (array of bulk strings) into a caller-owned,
//!   reused `Vec<u8>`; [`encode_frame`] writes any frame back in canonical form.
//!
//! ```
//! use redlock_mux::resp::{encode_command, parse, Arg, Frame, Limits, Status};
//!
//! let limits = Limits::default();
//! let mut out = Vec::with_capacity(64);
//! encode_command(&mut out, &["SET".into(), "lock".into(), "token".into(), "NX".into(),
//!     "PX".into(), Arg::Uint(30_000)]);
//! assert!(out.starts_with(b"*6\r\n$3\r\nSET\r\n"));
//!
//! let reply = b"+OK\r\n$-1\r\n";
//! assert_eq!(parse(reply, &limits), Ok(Status::Complete((Frame::Simple(b"OK"), 5))));
//! assert_eq!(parse(&reply[5..], &limits), Ok(Status::Complete((Frame::NullBulk, 5))));
//! assert_eq!(parse(b"$100\r\nab", &limits), Ok(Status::Partial(100)));
//!
//! let Ok(Status::Complete((Frame::Aggregate(a), _))) = parse(b"*2\r\n:1\r\n:-1\r\n", &limits)
//! else { unreachable!() };
//! let items: Vec<Frame> = a.iter().collect();
//! assert_eq!(items, [Frame::Integer(1), Frame::Integer(-1)]);
//! ```
//!
//! # What it accepts and rejects
//!
//! Each decision is a row of `tests/resp_conformance.rs`. Every error is decided at the
//! first byte that makes the input invalid, so a prefix of a bad input is either `Partial`
//! or fails with the same error.
//!
//! | Input | Result |
//! |---|---|
//! | `+OK`, `-ERR x` (any bytes but CR/LF) | `Simple`, `Error`; a CR or LF inside: `BadLineEnding` |
//! | `:0`, `:42`, `:-1` | `Integer`; `:+1`, `:007`, `:-0`, `:`, `: 1`: `BadInteger`; past i64: `IntegerOverflow` |
//! | lengths (`$ * % ~ > \| ! =`) | only `-1` or canonical digits; `$03`, `$+3`, `$ 3`, `$-0`: `BadInteger`; `$-2`: `BadLength` |
//! | `$3\r\nfoo\r\n` | `Bulk`; anything but CRLF after the data: `MissingBulkTerminator` |
//! | `$-1`, `*-1`, `_` | `NullBulk`, `NullArray`, `Null`; `_x`: `BadNull` |
//! | `%-1`, `~-1`, `>-1`, `\|-1`, `!-1`, `=-1` | `BadLength` |
//! | `$?`, `*?` (any `?` length), `;`, `.` | streamed RESP3: `Unsupported` |
//! | `#t`, `#f` | `Boolean`; anything else: `BadBoolean` |
//! | `,1.5`, `,-3`, `,1e10`, `,inf`, `,-inf`, `,nan` | `Double`; empty, `.5`, `1.`, `+1`, `Inf`: `BadDouble` |
//! | `(-123` | `BigNumber` (`-?[0-9]+`, leading zeros kept as sent); else `BadBigNumber` |
//! | `!<len>`, `=<len>` | `BulkError`; `Verbatim` needs len >= 4 and `:` as 4th byte, else `BadVerbatim` |
//! | `\|<n>` attribute | validated, attached to the next value, never an element or a reply; two in a row: `DanglingAttribute` |
//! | an over-limit header | `BulkTooLong`, `TooManyElements`, `TooDeep`, `LineTooLong`, at once |
//! | any other type byte | `UnknownType` |
//!
//! # Limits
//!
//! [`Limits`] are checked as soon as a header (or the digit that passes the limit) is
//! read: `$9223372036854775807` fails at once, never waits for data. The defaults:
//! bulk 512 MiB (Redis' `proto-max-bulk-len`), 1 Mi elements per aggregate (maps count
//! pairs x 2), depth 32 (real replies nest a few levels), line 64 KiB (Redis' inline
//! buffer). An attribute is one nesting level for its own keys and values.

mod encode;
mod parse;

pub use encode::{encode_command, encode_frame, Arg};
pub use parse::{parse, parse_with_attribute, Aggregate, Elements, Parser};

/// Result of a parse that may need more input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status<T> {
    /// A whole frame: the value and how many bytes of the input it used.
    Complete(T),
    /// The input is a strict prefix of a valid frame. The payload is a lower bound (>= 1)
    /// on how many more bytes are needed before parsing can make progress.
    Partial(usize),
}

impl<T> Status<T> {
    /// `true` for `Complete`.
    pub fn is_complete(&self) -> bool {
        matches!(self, Status::Complete(_))
    }
    /// `true` for `Partial`.
    pub fn is_partial(&self) -> bool {
        matches!(self, Status::Partial(_))
    }
    /// The completed value, if any.
    pub fn complete(self) -> Option<T> {
        match self {
            Status::Complete(v) => Some(v),
            Status::Partial(_) => None,
        }
    }
}

/// Which aggregate a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggregateKind {
    /// `*` array.
    Array,
    /// `%` map: `len()` counts pairs, the walk yields key, value, key, value...
    Map,
    /// `~` set.
    Set,
    /// `>` push (out-of-band data).
    Push,
    /// `|` attribute (map-shaped metadata about the next value).
    Attribute,
}

/// One RESP value, borrowing from the input buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Frame<'a> {
    /// `+` simple string (no CR or LF inside).
    Simple(&'a [u8]),
    /// `-` simple error, e.g. `NOSCRIPT No matching script`.
    Error(&'a [u8]),
    /// `:` signed 64-bit integer.
    Integer(i64),
    /// `$` bulk string (binary-safe).
    Bulk(&'a [u8]),
    /// `$-1` RESP2 null bulk string.
    NullBulk,
    /// `*-1` RESP2 null array.
    NullArray,
    /// `_` RESP3 null.
    Null,
    /// `#t` / `#f` RESP3 boolean.
    Boolean(bool),
    /// `,` RESP3 double, as validated text (`1.5`, `-3`, `inf`, `-inf`, `nan`, `1e10`).
    Double(&'a [u8]),
    /// `(` RESP3 big number, as validated text (optional `-`, then digits).
    BigNumber(&'a [u8]),
    /// `!` RESP3 bulk error.
    BulkError(&'a [u8]),
    /// `=` RESP3 verbatim string: a 3-byte format (e.g. `txt`) and the text.
    Verbatim {
        /// The 3-byte format, e.g. `b"txt"` or `b"mkd"`.
        format: &'a [u8],
        /// The text after `fmt:`.
        text: &'a [u8],
    },
    /// `*`, `%`, `~`, `>` aggregates (attributes are never returned as a frame by
    /// [`parse`]; see [`parse_with_attribute`]).
    Aggregate(Aggregate<'a>),
}

impl<'a> Frame<'a> {
    /// `true` for every null form: `$-1`, `*-1`, `_`.
    pub fn is_null(&self) -> bool {
        matches!(self, Frame::NullBulk | Frame::NullArray | Frame::Null)
    }
    /// `true` for `-` and `!` errors.
    pub fn is_error(&self) -> bool {
        matches!(self, Frame::Error(_) | Frame::BulkError(_))
    }
}

/// Why input was rejected. Small and `Copy`; no allocation, ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// The first byte of a frame is not a known RESP type byte.
    UnknownType(u8),
    /// A line (header or simple value) is not terminated by CRLF, or contains a bare CR/LF.
    BadLineEnding,
    /// A length or integer is not a valid decimal for its type (empty, spaces, sign rules,
    /// leading zeros where refused).
    BadInteger,
    /// A `:` integer does not fit in i64. (A length past its limit, or past usize, is
    /// [`Error::BulkTooLong`] or [`Error::TooManyElements`].)
    IntegerOverflow,
    /// A length below -1 (`$-2`, `*-2`), or -1 where null is not allowed (`%-1`, `~-1`,
    /// `>-1`, `|-1`, `!-1`, `=-1`).
    BadLength,
    /// The CRLF after bulk data is missing.
    MissingBulkTerminator,
    /// `#` not followed by exactly `t` or `f`.
    BadBoolean,
    /// `,` payload is not a valid double.
    BadDouble,
    /// `(` payload is not a valid big number.
    BadBigNumber,
    /// `_` not followed directly by CRLF.
    BadNull,
    /// `=` payload without a 3-byte format and `:`.
    BadVerbatim,
    /// A bulk length over [`Limits::max_bulk_len`].
    BulkTooLong,
    /// An aggregate count over [`Limits::max_elements`].
    TooManyElements,
    /// Nesting deeper than [`Limits::max_depth`].
    TooDeep,
    /// A header or text line longer than [`Limits::max_line_len`]; reported as soon as the
    /// byte past the limit arrives, without waiting for the CRLF.
    LineTooLong,
    /// RESP3 streamed strings or aggregates (a `?` length such as `$?` or `*?`, and the
    /// `;` and `.` types): not supported.
    Unsupported,
    /// An attribute followed directly by another attribute: an attribute must be followed
    /// by the value it describes. (Counts make an attribute with nothing after it in an
    /// aggregate impossible: the aggregate still waits for its element.)
    DanglingAttribute,
}

impl Error {
    /// A short static description.
    pub fn description(&self) -> &'static str {
        parse::describe(self)
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.description())
    }
}

impl std::error::Error for Error {}

/// Bounds enforced while parsing, as soon as a header is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk/verbatim/bulk-error payload, in bytes.
    pub max_bulk_len: usize,
    /// Largest element count of one aggregate (for maps: pairs x 2).
    pub max_elements: usize,
    /// Deepest nesting of aggregates (a top-level array is depth 1). Capped at
    /// [`Limits::HARD_MAX_DEPTH`].
    pub max_depth: usize,
    /// Longest header or simple line, CRLF excluded.
    pub max_line_len: usize,
}

impl Limits {
    /// The parser keeps its nesting stack in a fixed array of this size.
    pub const HARD_MAX_DEPTH: usize = 128;
}

impl Default for Limits {
    fn default() -> Self {
        parse::DEFAULT_LIMITS
    }
}
