//! RESP parser (skeleton: bodies to be written).
use super::{AggregateKind, Error, Frame, Limits, Status};

pub(super) const DEFAULT_LIMITS: Limits = Limits {
    max_bulk_len: 512 * 1024 * 1024,
    max_elements: 1024 * 1024,
    max_depth: 32,
    max_line_len: 64 * 1024,
};

pub(super) fn describe(e: &Error) -> &'static str {
    let _ = e;
    "resp error"
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
    /// The encoded elements, exactly as received.
    pub fn raw(&self) -> &'a [u8] {
        self.body
    }
    /// Walk the elements (maps: key, value, key, value...). Attributes inside are skipped.
    pub fn iter(&self) -> Elements<'a> {
        todo!()
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
        todo!()
    }
}

/// Parse one frame from the start of `buf`. Attributes before the value are validated and
/// skipped (they are part of `consumed`).
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Result<Status<(Frame<'a>, usize)>, Error> {
    let _ = (buf, limits);
    todo!()
}

/// Like [`parse`], also returning the attribute that preceded the value, if any.
#[allow(clippy::type_complexity)]
pub fn parse_with_attribute<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Status<(Option<Aggregate<'a>>, Frame<'a>, usize)>, Error> {
    let _ = (buf, limits);
    todo!()
}

/// Resumable parser: call [`Parser::parse`] with a buffer that starts with the same bytes as
/// the last call (more may be appended). After `Partial` it resumes where it stopped; after
/// `Complete` or an error it starts afresh on the next call.
#[derive(Debug, Clone)]
pub struct Parser {
    limits: Limits,
}

impl Parser {
    /// A parser with these limits.
    pub fn new(limits: Limits) -> Self {
        Parser { limits }
    }
    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// Forget any saved progress (call when the buffer is replaced).
    pub fn reset(&mut self) {}
    /// Parse one frame from the start of `buf`, resuming saved progress.
    pub fn parse<'a>(&mut self, buf: &'a [u8]) -> Result<Status<(Frame<'a>, usize)>, Error> {
        parse(buf, &self.limits)
    }
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new(Limits::default())
    }
}
