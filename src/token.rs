//! Lock tokens: 128 random bits from the operating system, hex-encoded.
//!
//! The Redis page asks for a value unique across all clients and all acquisitions, from a
//! generator seeded by the OS. We read `/dev/urandom` directly (it never blocks once the
//! kernel's pool is initialised) in 4 KiB batches, so a token costs one `read` syscall per
//! 256 acquisitions and no allocation. Tokens are hex so `redis-cli GET` shows them
//! readably.

use std::fs::File;
use std::io::{self, Read};

/// Random bytes per token.
pub const TOKEN_BYTES: usize = 16;
/// Encoded (hex) length of a token.
pub const TOKEN_LEN: usize = TOKEN_BYTES * 2;

const BATCH: usize = 4096;

/// A lock token: 32 lowercase hex characters (128 random bits).
///
/// **It is a capability**: whoever has it can release or extend the lock (the release and
/// extend scripts compare it, nothing else). Its two text forms say so:
///
/// * `Display` (`token.to_string()`, `{}`) writes the **whole** token, as [`Token::as_str`]
///   does: it is what you store, hand to the process that will release the lock, or
///   compare with `redis-cli GET`. An abbreviated `Display` would make strings that look
///   like tokens and match no key.
/// * `Debug` (`{:?}`, and so every `Debug` of a lock or a guard) shows only the first 8
///   characters, `Token(0b7afbad..)`: what belongs in logs. [`Token::short`] gives them
///   alone.
///
/// ```
/// # #[cfg(feature = "local")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let local = redlock_mux::local::LocalMasters::start(3)?;
/// # let urls = local.urls();
/// let redlock = redlock_mux::Redlock::builder().masters(&urls).build_shared()?;
/// let guard = redlock.lock("orders:42", std::time::Duration::from_secs(10)).wait()?;
/// let whole = guard.token().to_string(); // the capability: keep it out of logs
/// assert_eq!(whole.len(), 32);
/// assert_eq!(whole, guard.token().as_str());
/// let logged = format!("{:?}", guard.token()); // Token(0b7afbad..)
/// assert!(!logged.contains(&whole));
/// # Ok(()) }
/// # #[cfg(not(feature = "local"))] fn main() {}
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token([u8; TOKEN_LEN]);

impl Token {
    /// A placeholder (all `'0'`) for storage that holds no lock yet; never sent.
    pub(crate) const ZERO: Token = Token([b'0'; TOKEN_LEN]);

    /// A token of one repeated byte (unit tests).
    #[cfg(test)]
    pub(crate) const fn filled(b: u8) -> Token {
        Token([b; TOKEN_LEN])
    }

    /// The token's bytes, as stored in Redis.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The token as text.
    pub fn as_str(&self) -> &str {
        // Always ASCII hex.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
    /// The first 8 characters, for logs.
    pub fn short(&self) -> &str {
        &self.as_str()[..8]
    }
}

/// The whole token (see [`Token`]: it is the capability to release the lock).
impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a whole token: it is the capability to release someone's lock.
        write!(f, "Token({}..)", self.short())
    }
}

/// Buffered OS randomness (or, for the simulation and the fuzzer, a seeded generator).
pub(crate) struct TokenSource {
    /// `None`: tokens come from `seeded` (deterministic: never for real locks).
    file: Option<File>,
    seeded: fastrand::Rng,
    buf: Box<[u8; BATCH]>,
    pos: usize,
}

impl TokenSource {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(TokenSource {
            file: Some(File::open("/dev/urandom")?),
            seeded: fastrand::Rng::with_seed(0),
            buf: Box::new([0u8; BATCH]),
            pos: BATCH,
        })
    }

    /// Tokens from a generator seeded with `seed`: the same sequence every time. For the
    /// deterministic simulation and the fuzz targets only (they are guessable).
    pub(crate) fn seeded(seed: u64) -> Self {
        TokenSource {
            file: None,
            seeded: fastrand::Rng::with_seed(seed),
            buf: Box::new([0u8; BATCH]),
            pos: BATCH,
        }
    }

    pub(crate) fn next(&mut self) -> io::Result<Token> {
        if self.pos + TOKEN_BYTES > BATCH {
            match &mut self.file {
                Some(f) => f.read_exact(&mut self.buf[..])?,
                None => self.seeded.fill(&mut self.buf[..]),
            }
            self.pos = 0;
        }
        let raw = self.buf[self.pos..]
            .first_chunk::<TOKEN_BYTES>()
            .expect("a whole token is left in the batch");
        self.pos += TOKEN_BYTES;
        let out = hex(raw);
        // Consumed randomness is wiped so a later memory dump cannot replay it.
        self.buf[self.pos - TOKEN_BYTES..self.pos].fill(0);
        Ok(Token(out))
    }

    /// 64 random bits, for seeding the jitter generator.
    pub(crate) fn seed(&mut self) -> io::Result<u64> {
        let t = self.next()?;
        Ok(u64::from_str_radix(&t.as_str()[..16], 16).unwrap_or(0))
    }
}

/// Every byte's two lowercase hex digits, high nibble first.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [DIGITS[b >> 4], DIGITS[b & 15]];
        b += 1;
    }
    t
};

/// The token's random bytes as hex: one lookup and one two-byte store per byte (the word
/// operations of `hex8` took about twice the instructions).
#[inline]
fn hex(raw: &[u8; TOKEN_BYTES]) -> [u8; TOKEN_LEN] {
    let mut out = [0u8; TOKEN_LEN];
    for (dst, &b) in out.chunks_exact_mut(2).zip(raw.iter()) {
        dst.copy_from_slice(&HEX_PAIRS[b as usize]);
    }
    out
}

/// Four bytes (little-endian in `word`) as eight lowercase hex digits, in byte order, high
/// nibble first: the same as a table lookup per nibble, a few word operations instead.
#[cfg(test)]
fn hex8(word: u32) -> u64 {
    // Spread byte k to bits 16k..16k+8, then put its high nibble in the low byte of that
    // 16-bit lane and its low nibble in the high byte (the output is little-endian).
    let mut x = word as u64;
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    let nibbles = ((x >> 4) & 0x000f_000f_000f_000f) | ((x & 0x000f_000f_000f_000f) << 8);
    // Every byte is 0..=15: add '0', and 'a' - '0' - 10 more where it is above 9. No byte
    // overflows into the next (at most 15 + 6 before the shift, 15 + 48 + 39 after).
    let above9 = ((nibbles + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    nibbles + 0x3030_3030_3030_3030 + above9 * (b'a' - b'0' - 10) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_unique_hex_and_span_batches() {
        let mut src = TokenSource::new().unwrap();
        let mut seen = HashSet::new();
        for _ in 0..2000 {
            let t = src.next().unwrap();
            assert!(t.as_bytes().iter().all(|b| b.is_ascii_hexdigit()));
            assert!(seen.insert(t), "duplicate token");
        }
    }

    #[test]
    fn hex8_matches_a_table_lookup_for_every_byte_value_in_every_position() {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let table = |bytes: [u8; 4]| {
            let mut out = [0u8; 8];
            for (i, b) in bytes.iter().enumerate() {
                out[2 * i] = HEX[(b >> 4) as usize];
                out[2 * i + 1] = HEX[(b & 15) as usize];
            }
            out
        };
        for b in 0..=255u8 {
            for pos in 0..4 {
                let mut bytes = [0x5au8; 4];
                bytes[pos] = b;
                assert_eq!(
                    hex8(u32::from_le_bytes(bytes)).to_le_bytes(),
                    table(bytes),
                    "byte {b:#04x} at {pos}"
                );
            }
        }
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..10_000 {
            let bytes = rng.u32(..).to_le_bytes();
            assert_eq!(hex8(u32::from_le_bytes(bytes)).to_le_bytes(), table(bytes));
        }
    }

    #[test]
    fn hex_is_every_byte_as_two_lowercase_digits() {
        let mut rng = fastrand::Rng::with_seed(11);
        let mut cases: Vec<[u8; TOKEN_BYTES]> = (0..=255u8).map(|b| [b; TOKEN_BYTES]).collect();
        for _ in 0..1000 {
            let mut raw = [0u8; TOKEN_BYTES];
            rng.fill(&mut raw);
            cases.push(raw);
        }
        for raw in cases {
            let want: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(&hex(&raw)[..], want.as_bytes());
            // The same as the word operations it replaced.
            let words: Vec<u8> = raw
                .chunks_exact(4)
                .flat_map(|w| hex8(u32::from_le_bytes([w[0], w[1], w[2], w[3]])).to_le_bytes())
                .collect();
            assert_eq!(&hex(&raw)[..], &words[..]);
        }
    }

    #[test]
    fn debug_does_not_leak_the_token() {
        let t = TokenSource::new().unwrap().next().unwrap();
        let dbg = format!("{t:?}");
        assert!(!dbg.contains(t.as_str()));
    }
}
