//! RESP command and frame encoder (skeleton: bodies to be written).
use super::Frame;

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

/// Append `args` as one RESP command (an array of bulk strings) to `out`.
/// Never allocates once `out` has the capacity.
pub fn encode_command(out: &mut Vec<u8>, args: &[Arg<'_>]) {
    let _ = (out, args);
    todo!()
}

/// Append any frame (aggregates included) to `out`, in canonical form.
pub fn encode_frame(out: &mut Vec<u8>, frame: &Frame<'_>) {
    let _ = (out, frame);
    todo!()
}
