//! Cluster hash slots: which of the 16,384 slots of a Redis or Valkey Cluster a key lives
//! in, and a short hash tag per slot, so that the keys this crate keeps beside a lock key
//! (its line of waiters, its fencing counter) live in the lock key's own slot, whatever
//! the lock's name (braces included).
//!
//! The rules are the cluster specification's: a key's slot is `CRC16(k) mod 16384` (CRC16
//! as XMODEM: polynomial 0x1021, initial value 0), where `k` is the whole key unless the
//! key has a *hash tag*: a `{` followed later by a `}` with at least one byte between the
//! first `{` and the first `}` after it; then only those bytes are hashed.
//!
//! [`tag`] gives, for each slot, three bytes of `[0-9A-Za-z_-]` that hash to it: a key
//! `redlock-mux:{TAG}:…` lives in that slot (its first `{` opens the tag). The table is
//! built at compile time (the first such string in the alphabet's order for each slot;
//! every slot has one) and is fixed: the names it gives are part of the keys a master
//! holds, so changing it would be a change of layout.

/// Slots of a cluster.
pub const SLOTS: usize = 16_384;

/// CRC16/XMODEM's table, one entry per byte value.
const CRC_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16/XMODEM of `bytes` (the cluster's key hash).
pub const fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    let mut i = 0;
    while i < bytes.len() {
        crc = (crc << 8) ^ CRC_TABLE[((crc >> 8) as u8 ^ bytes[i]) as usize];
        i += 1;
    }
    crc
}

/// The part of `key` a cluster hashes: the bytes of its hash tag, or the whole key.
pub fn hashed_part(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// The slot `key` lives in on a cluster.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) & (SLOTS as u16 - 1)
}

/// The tags' alphabet: no brace, nothing a shell or a log would mangle.
const ALPHABET: &[u8; 64] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";

/// For each slot, the first three-byte string of [`ALPHABET`] (in its order) hashing to it.
static TAGS: [[u8; 3]; SLOTS] = {
    let mut tags = [[0u8; 3]; SLOTS];
    let mut found = [false; SLOTS];
    let mut left = SLOTS;
    let mut a = 0;
    while a < 64 && left > 0 {
        let mut b = 0;
        while b < 64 && left > 0 {
            let mut c = 0;
            while c < 64 && left > 0 {
                let s = [ALPHABET[a], ALPHABET[b], ALPHABET[c]];
                let slot = (crc16(&s) as usize) & (SLOTS - 1);
                if !found[slot] {
                    found[slot] = true;
                    tags[slot] = s;
                    left -= 1;
                }
                c += 1;
            }
            b += 1;
        }
        a += 1;
    }
    // A slot without a tag would be a build error, not a run-time surprise.
    assert!(left == 0, "a cluster slot has no three-byte tag");
    tags
};

/// Three bytes that hash to `slot` (taken modulo [`SLOTS`]) as a hash tag.
pub fn tag(slot: u16) -> &'static [u8; 3] {
    &TAGS[slot as usize & (SLOTS - 1)]
}

/// The tag of the slot `key` lives in: `{tag}` in another key puts it beside `key`.
pub fn tag_of(key: &[u8]) -> &'static [u8; 3] {
    tag(key_slot(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        // The check value of CRC-16/XMODEM, and the cluster specification's example.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 0x31C3 & 16383);
    }

    #[test]
    fn hash_tags_follow_the_cluster_rules() {
        // Examples of the cluster specification.
        assert_eq!(hashed_part(b"{user1000}.following"), b"user1000");
        assert_eq!(hashed_part(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hashed_part(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashed_part(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hashed_part(b"no tag"), b"no tag");
        assert_eq!(hashed_part(b"open{only"), b"open{only");
        assert_eq!(hashed_part(b"close}first{x}"), b"x");
        assert_eq!(hashed_part(b""), b"");
        assert_eq!(key_slot(b"{user1000}.a"), key_slot(b"{user1000}.b"));
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in 0..SLOTS as u16 {
            let t = tag(slot);
            assert!(t.iter().all(|b| ALPHABET.contains(b)), "{t:?}");
            assert_eq!(key_slot(t), slot);
            // As the tag of a longer key, braces and all.
            let mut key = b"redlock-mux:{".to_vec();
            key.extend_from_slice(t);
            key.extend_from_slice(b"}:queue:{user}name");
            assert_eq!(key_slot(&key), slot);
        }
    }

    #[test]
    fn the_tag_of_a_key_puts_another_key_in_its_slot() {
        for name in [
            &b"sku:42"[..],
            b"{user1000}.lock",
            b"a{}b",
            b"}{",
            b"\xff\x00{\x01}",
        ] {
            let mut aux = b"redlock-mux:{".to_vec();
            aux.extend_from_slice(tag_of(name));
            aux.extend_from_slice(b"}:fence:");
            aux.extend_from_slice(name);
            assert_eq!(key_slot(&aux), key_slot(name), "{name:?}");
        }
    }

    #[test]
    fn the_table_is_fixed() {
        // The tags are part of the keys masters hold: a change is a change of layout.
        assert_eq!(tag(0), b"06S");
        assert_eq!(tag(16383), b"6ZJ");
    }
}
