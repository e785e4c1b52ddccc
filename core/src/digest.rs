//! The 128-bit digest the embedded backend stores a key under.
//!
//! The digest is a function of the key's bytes alone, computed as a stream:
//! writing a key in parts gives the digest of the whole key, so a rule can
//! keep the state after its key's fixed leading text and a check only feeds
//! in its attribute values, without rendering the key. Two 64-bit lanes, each
//! a folded multiply over 8-byte words with its own multiplier, both seeded
//! at random once per process; the key's length closes the stream, so keys
//! that differ only by trailing zero bytes differ.

use std::sync::OnceLock;

/// A key's digest: what the embedded backend's maps are keyed by.
pub(crate) type Digest = u128;

/// The process's random seeds: each lane's starting value and multiplier.
#[derive(Clone, Copy, Debug)]
struct Seeds {
    a: u64,
    b: u64,
    ka: u64,
    kb: u64,
}

fn seeds() -> Seeds {
    static SEEDS: OnceLock<Seeds> = OnceLock::new();
    *SEEDS.get_or_init(|| {
        let mut bytes = [0u8; 32];
        if getrandom::fill(&mut bytes).is_err() {
            // No system randomness: fall back to the standard library's
            // per-process random hasher keys.
            use std::hash::{BuildHasher, Hasher};
            for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_usize(i);
                chunk.copy_from_slice(&h.finish().to_le_bytes());
            }
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        // Odd multipliers with both halves well populated.
        Seeds { a: word(0), b: word(1), ka: word(2) | 0x8000_0000_0000_0001, kb: word(3) | 0x8000_0000_0000_0001 }
    })
}

#[inline(always)]
fn fold(x: u64, y: u64) -> u64 {
    let p = (x as u128).wrapping_mul(y as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The little-endian word of up to 8 bytes (zero above them).
#[inline(always)]
fn load_partial(s: &[u8]) -> u64 {
    let n = s.len();
    if n >= 4 {
        let lo = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as u64;
        let hi = u32::from_le_bytes([s[n - 4], s[n - 3], s[n - 2], s[n - 1]]) as u64;
        lo | (hi << (8 * (n - 4)))
    } else if n > 0 {
        s[0] as u64 | (s[n / 2] as u64) << (8 * (n / 2)) | (s[n - 1] as u64) << (8 * (n - 1))
    } else {
        0
    }
}

/// A key's digest being computed: write its bytes in any number of parts,
/// then [`KeyDigest::finish`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyDigest {
    a: u64,
    b: u64,
    ka: u64,
    kb: u64,
    /// The bytes written since the last whole word (`len % 8` of them).
    buf: u64,
    len: u64,
}

impl KeyDigest {
    /// The digest of nothing yet.
    pub fn new() -> KeyDigest {
        let s = seeds();
        KeyDigest { a: s.a, b: s.b, ka: s.ka, kb: s.kb, buf: 0, len: 0 }
    }

    /// The digest of `key` in one call.
    pub fn of(key: &str) -> Digest {
        let mut d = KeyDigest::new();
        d.write(key.as_bytes());
        d.finish()
    }

    #[inline(always)]
    fn absorb(&mut self, w: u64) {
        self.a = fold(self.a ^ w, self.ka);
        self.b = fold(self.b ^ w, self.kb);
    }

    /// Append `bytes` to the key.
    #[inline(always)]
    pub fn write(&mut self, bytes: &[u8]) {
        let mut s = bytes;
        let off = (self.len & 7) as usize;
        self.len += s.len() as u64;
        if off != 0 {
            let take = (8 - off).min(s.len());
            self.buf |= load_partial(&s[..take]) << (8 * off);
            if off + take < 8 {
                return;
            }
            s = &s[take..];
            let w = self.buf;
            self.absorb(w);
            self.buf = 0;
        }
        while let Some((w, rest)) = s.split_first_chunk::<8>() {
            self.absorb(u64::from_le_bytes(*w));
            s = rest;
        }
        self.buf = load_partial(s);
    }

    /// The digest of the bytes written.
    #[inline]
    pub fn finish(mut self) -> Digest {
        if self.len & 7 != 0 {
            let w = self.buf;
            self.absorb(w);
        }
        let len = self.len;
        // The length closes the stream; a last round mixes each lane's high
        // bits into its low ones.
        let a = fold(self.a ^ len, self.ka ^ self.b);
        let b = fold(self.b ^ len.rotate_left(32), self.kb ^ self.a);
        ((b as u128) << 64) | a as u128
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_give_the_digest_of_the_whole() {
        let key = "tg:r:per-ip:ip:10.0.0.1:route:/v1/things/0123456789";
        let whole = KeyDigest::of(key);
        for a in 0..=key.len() {
            for b in a..=key.len() {
                let mut d = KeyDigest::new();
                d.write(&key.as_bytes()[..a]);
                d.write(&key.as_bytes()[a..b]);
                d.write(&key.as_bytes()[b..]);
                assert_eq!(d.finish(), whole, "{a} {b}");
            }
        }
    }

    #[test]
    fn nearby_keys_differ() {
        let mut seen = std::collections::HashSet::new();
        let mut lows = std::collections::HashSet::new();
        for i in 0..20_000u32 {
            let key = format!("tg:r:per-ip:ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
            let d = KeyDigest::of(&key);
            assert!(seen.insert(d), "{key}");
            lows.insert(d as u64);
        }
        assert_eq!(lows.len(), 20_000);
        for k in ["", "\0", "\0\0", "a", "a\0", "a\0\0\0\0\0\0\0", "a\0\0\0\0\0\0\0\0"] {
            assert!(seen.insert(KeyDigest::of(k)), "{k:?}");
        }
    }
}
