//! Key templates, attribute escaping and key rendering.
//!
//! A key is `<prefix><rule name>:<rendered template>`. Attribute values are
//! percent-escaped so that no value can forge another key: the delimiter `:`,
//! braces (which would pick a Redis Cluster slot), `#`, `%`, control bytes and
//! every byte outside a small safe set are written as `%XX`. Templates must
//! separate placeholders with a `:`, so every key has exactly one reading.
//! A key longer than [`MAX_KEY_LEN`] is replaced by a hash of its rendered
//! part (`<prefix><rule name>:#<32 hex digits>`, keeping a `{hash tag}` when
//! the template has one), so keys stay bounded whatever a client sends.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};

use crate::digest::{Digest, KeyDigest};

/// Longest key written as is; longer ones are hashed.
pub const MAX_KEY_LEN: usize = 128;

/// Longest rule name and attribute name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// A character allowed in rule and attribute names.
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'
}

/// Check a rule or attribute name; the error completes "name ...".
pub(crate) fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("is longer than {MAX_NAME_LEN} bytes"));
    }
    if let Some(c) = name.chars().find(|&c| !is_name_char(c)) {
        return Err(format!(
            "{name:?} contains {c:?}; use letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

/// Read access to a request's attributes (`ip`, `api_key`, `route`, ...).
///
/// Implemented for the usual maps and for slices and arrays of pairs.
pub trait Attributes {
    /// The value of `name`, if the request has it.
    fn get_attr(&self, name: &str) -> Option<&str>;
}

/// `a == b` for names, which are short: compared byte by byte in line
/// rather than through a call to `memcmp`.
#[inline]
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

impl<K: AsRef<str>, V: AsRef<str>> Attributes for [(K, V)] {
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| same_name(k.as_ref(), name))
            .map(|(_, v)| v.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> Attributes for [(K, V); N] {
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.as_slice().get_attr(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Attributes for Vec<(K, V)> {
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.as_slice().get_attr(name)
    }
}

impl<K, V, S> Attributes for HashMap<K, V, S>
where
    K: std::borrow::Borrow<str> + std::hash::Hash + Eq,
    V: AsRef<str>,
    S: std::hash::BuildHasher,
{
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.get(name).map(|v| v.as_ref())
    }
}

impl<K, V> Attributes for BTreeMap<K, V>
where
    K: std::borrow::Borrow<str> + Ord,
    V: AsRef<str>,
{
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.get(name).map(|v| v.as_ref())
    }
}

impl<T: Attributes + ?Sized> Attributes for &T {
    fn get_attr(&self, name: &str) -> Option<&str> {
        (**self).get_attr(name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Attr(String),
}

/// A parsed key template such as `"ip:{ip}"` or `"{{tenant:{tenant}}}:user:{user}"`.
///
/// `{name}` is an attribute; `{{` and `}}` are literal braces, for a Redis
/// Cluster hash tag chosen on purpose by the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    segments: Vec<Segment>,
}

fn literal_ok(c: char) -> bool {
    c.is_ascii_graphic() && c != '#' && c != '%'
}

impl KeyTemplate {
    /// Parse a template; the error says what is wrong with it.
    pub fn parse(src: &str) -> Result<KeyTemplate, String> {
        if src.is_empty() {
            return Err("must not be empty".into());
        }
        let mut segments = Vec::new();
        let mut lit = String::new();
        let mut chars = src.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(ch) => name.push(ch),
                            None => {
                                return Err(format!(
                                    "{src:?} has an unclosed '{{'; write {{{{ for a literal brace"
                                ))
                            }
                        }
                    }
                    validate_name(&name)
                        .map_err(|m| format!("{src:?}: attribute name {m}"))?;
                    if !lit.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut lit)));
                    }
                    segments.push(Segment::Attr(name));
                }
                '}' => {
                    return Err(format!(
                        "{src:?} has an unmatched '}}'; write }}}} for a literal brace"
                    ))
                }
                c if literal_ok(c) => lit.push(c),
                c => {
                    return Err(format!(
                        "{src:?} contains {c:?}; literal text is printable ASCII without spaces, '#' or '%'"
                    ))
                }
            }
        }
        if !lit.is_empty() {
            segments.push(Segment::Literal(lit));
        }
        // Two placeholders must be separated by a ':' so that no pair of
        // values can render to the same key as another pair.
        for (i, s) in segments.iter().enumerate() {
            if let Segment::Attr(_) = s {
                match (segments.get(i + 1), segments.get(i + 2)) {
                    (Some(Segment::Attr(next)), _) => {
                        return Err(format!(
                            "{src:?}: separate {{{next}}} from the attribute before it with a ':'"
                        ))
                    }
                    (Some(Segment::Literal(l)), Some(Segment::Attr(_))) if !l.contains(':') => {
                        return Err(format!(
                            "{src:?}: the text {l:?} between two attributes must contain a ':'"
                        ))
                    }
                    _ => {}
                }
            }
        }
        let open = segments
            .iter()
            .filter_map(|s| match s {
                Segment::Literal(l) => Some(l.matches('{').count() as i64 - l.matches('}').count() as i64),
                _ => None,
            })
            .sum::<i64>();
        if open != 0 {
            return Err(format!("{src:?}: literal braces {{{{ and }}}} must pair up"));
        }
        Ok(KeyTemplate { segments })
    }

    /// The attributes the template needs, in order.
    pub fn attributes(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Attr(a) => Some(a.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The literal text the template starts with ("" when it starts with an attribute).
    pub(crate) fn lead(&self) -> &str {
        match self.segments.first() {
            Some(Segment::Literal(l)) => l,
            _ => "",
        }
    }

    /// [`KeyTemplate::render`] without its [`KeyTemplate::lead`], which the
    /// caller has written.
    pub(crate) fn render_after_lead(&self, attrs: &dyn Attributes, secret: Option<&KeySecret>, out: &mut String) -> bool {
        let rest = match self.segments.first() {
            Some(Segment::Literal(_)) => &self.segments[1..],
            _ => &self.segments[..],
        };
        Self::render_segments(rest, attrs, secret, out)
    }

    /// Render the template for `attrs` onto `out`; `false` (with `out`
    /// unspecified) when an attribute is missing, so the rule does not apply.
    pub(crate) fn render(
        &self,
        attrs: &dyn Attributes,
        secret: Option<&KeySecret>,
        out: &mut String,
    ) -> bool {
        Self::render_segments(&self.segments, attrs, secret, out)
    }

    /// The template's only attribute and the text after it, when it is one
    /// attribute after its [`KeyTemplate::lead`] (`"ip:{ip}"`, `"{user}:x"`).
    pub(crate) fn single(&self) -> Option<(&str, &str)> {
        let rest = match self.segments.first() {
            Some(Segment::Literal(_)) => &self.segments[1..],
            _ => &self.segments[..],
        };
        match rest {
            [Segment::Attr(a)] => Some((a, "")),
            [Segment::Attr(a), Segment::Literal(tail)] => Some((a, tail)),
            _ => None,
        }
    }

    /// The digest of the key [`KeyTemplate::render_after_lead`] would
    /// write after a lead whose digest so far is `digest` and whose length
    /// is `len`, fed straight from the attribute values, without writing
    /// the key: [`Direct::Render`] when a value needs an escape or the key
    /// would be hashed for its length, so the caller renders it instead.
    pub(crate) fn digest_after_lead(&self, attrs: &dyn Attributes, mut digest: KeyDigest, mut len: usize) -> Direct {
        let rest = match self.segments.first() {
            Some(Segment::Literal(_)) => &self.segments[1..],
            _ => &self.segments[..],
        };
        for s in rest {
            let part = match s {
                Segment::Literal(l) => l.as_str(),
                Segment::Attr(a) => match attrs.get_attr(a) {
                    Some(v) if all_kept(v.as_bytes()) => v,
                    Some(_) => return Direct::Render,
                    None => return Direct::Missing,
                },
            };
            digest.write(part.as_bytes());
            len += part.len();
        }
        if len > MAX_KEY_LEN {
            return Direct::Render;
        }
        Direct::Digest(digest.finish())
    }

    fn render_segments(segments: &[Segment], attrs: &dyn Attributes, secret: Option<&KeySecret>, out: &mut String) -> bool {
        for s in segments {
            match s {
                Segment::Literal(l) => out.push_str(l),
                Segment::Attr(a) => match attrs.get_attr(a) {
                    Some(v) => match secret {
                        Some(secret) => secret.write_hashed(v, out),
                        None => escape_into(v, out),
                    },
                    None => return false,
                },
            }
        }
        true
    }
}

/// A key's digest taken from its parts ([`KeyTemplate::digest_after_lead`]).
pub(crate) enum Direct {
    /// The key's digest, as [`KeyDigest::of`] the rendered key.
    Digest(Digest),
    /// An attribute of the template is missing: the rule does not apply.
    Missing,
    /// The key must be rendered to be digested.
    Render,
}

/// The bytes a key keeps as they are: `A-Z a-z 0-9 - . _ ~ / @`.
static KEPT: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'/' | b'@');
        b += 1;
    }
    t
};

/// `b` in every byte of a word.
const fn splat(b: u8) -> u64 {
    b as u64 * 0x0101_0101_0101_0101
}

/// Whether every byte of the word `w` is kept as it is ([`KEPT`]), eight
/// bytes at a time: for bytes below 0x80, adding `0x80 - lo` sets a byte's
/// high bit exactly when it is at least `lo`, without a carry into the next.
#[inline(always)]
fn word_kept(w: u64) -> bool {
    const HIGH: u64 = splat(0x80);
    if w & HIGH != 0 {
        return false;
    }
    let at_least = |lo: u8| w.wrapping_add(splat(0x80 - lo));
    let within = |lo: u8, end: u8| at_least(lo) & !at_least(end);
    // `- . / 0-9`, `@ A-Z`, `_`, `a-z`, `~`.
    let kept = within(b'-', b':') | within(b'@', b'[') | within(b'_', b'`') | within(b'a', b'{') | within(b'~', 0x7f);
    kept & HIGH == HIGH
}

/// Whether every byte of `bytes` is kept as it is ([`KEPT`]), a word at a
/// time (the last one padded with a kept byte).
#[inline]
pub(crate) fn all_kept(bytes: &[u8]) -> bool {
    let mut s = bytes;
    while let Some((w, rest)) = s.split_first_chunk::<8>() {
        if !word_kept(u64::from_le_bytes(*w)) {
            return false;
        }
        s = rest;
    }
    if s.is_empty() {
        return true;
    }
    let mut w = [b'a'; 8];
    w[..s.len()].copy_from_slice(s);
    word_kept(u64::from_le_bytes(w))
}

/// Percent-escape `value` onto `out`: bytes outside `A-Z a-z 0-9 - . _ ~ / @`
/// become `%XX`.
pub fn escape_into(value: &str, out: &mut String) {
    let bytes = value.as_bytes();
    // The usual value needs no escape: one test per byte, one copy.
    if all_kept(bytes) {
        out.push_str(value);
        return;
    }
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !KEPT[b as usize] {
            // The run before `b` is ASCII, so a whole string of its own.
            out.push_str(std::str::from_utf8(&bytes[run..i]).unwrap_or_default());
            let _ = write!(out, "%{b:02X}");
            run = i + 1;
        }
    }
    if run == 0 {
        out.push_str(value);
    } else {
        out.push_str(std::str::from_utf8(&bytes[run..]).unwrap_or_default());
    }
}

/// A secret that turns attribute values into keyed hashes (HMAC-SHA-256), so
/// raw values such as API keys never appear in keys.
#[derive(Clone)]
pub struct KeySecret(Hmac<Sha256>);

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

impl KeySecret {
    /// A secret from bytes (at least 16 are recommended).
    pub fn new(secret: &[u8]) -> KeySecret {
        KeySecret(Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size"))
    }

    fn write_hashed(&self, value: &str, out: &mut String) {
        let mut mac = self.0.clone();
        mac.update(value.as_bytes());
        let digest = mac.finalize().into_bytes();
        hex_into(&digest[..16], out);
    }
}

fn hex_into(bytes: &[u8], out: &mut String) {
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
}

/// Turn `head + rendered` into the final key, hashing the rendered part when
/// the key would be longer than [`MAX_KEY_LEN`]. `head` is `<prefix><rule>:`.
pub(crate) fn finish_key(head: &str, rendered: &str) -> String {
    if head.len() + rendered.len() <= MAX_KEY_LEN {
        let mut key = String::with_capacity(head.len() + rendered.len());
        key.push_str(head);
        key.push_str(rendered);
        return key;
    }
    let mut key = String::with_capacity(head.len() + 64);
    key.push_str(head);
    // Keep a hash tag, so a co-located rule stays co-located when hashed.
    if let Some(open) = rendered.find('{') {
        if let Some(len) = rendered[open + 1..].find('}') {
            let tag = &rendered[open + 1..open + 1 + len];
            key.push('{');
            if tag.len() <= 32 {
                key.push_str(tag);
            } else {
                key.push('#');
                hex_into(&Sha256::digest(tag.as_bytes())[..8], &mut key);
            }
            key.push('}');
        }
    }
    key.push('#');
    hex_into(&Sha256::digest(rendered.as_bytes())[..16], &mut key);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(t: &str, attrs: &[(&str, &str)]) -> Option<String> {
        let t = KeyTemplate::parse(t).unwrap();
        let mut out = String::new();
        t.render(&attrs, None, &mut out).then_some(out)
    }

    #[test]
    fn kept_bytes_are_found_a_word_at_a_time() {
        for b in 0..=255u8 {
            for len in 1..=17 {
                for at in 0..len {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert_eq!(all_kept(&v), KEPT[b as usize], "{b} {len} {at}");
                }
            }
        }
        assert!(all_kept(b""));
    }

    #[test]
    fn renders_and_escapes() {
        assert_eq!(render("ip:{ip}", &[("ip", "1.2.3.4")]).unwrap(), "ip:1.2.3.4");
        assert_eq!(render("ip:{ip}", &[("ip", "::1")]).unwrap(), "ip:%3A%3A1");
        assert_eq!(render("ip:{ip}", &[("ip", "{x}")]).unwrap(), "ip:%7Bx%7D");
        assert_eq!(render("ip:{ip}", &[("ip", "a\nb\0")]).unwrap(), "ip:a%0Ab%00");
        assert_eq!(render("ip:{ip}", &[("ip", "50%")]).unwrap(), "ip:50%25");
        assert_eq!(render("ip:{ip}", &[("other", "x")]), None);
        assert_eq!(
            render("{{t:{tenant}}}:u:{user}", &[("tenant", "acme"), ("user", "bob")]).unwrap(),
            "{t:acme}:u:bob"
        );
        assert_eq!(render("global", &[]).unwrap(), "global");
    }

    #[test]
    fn rejects_bad_templates() {
        for bad in ["", "ip:{ip", "ip:}", "{a}{b}", "{a}-{b}", "a b", "ip:{}", "x#{a}", "{{a"] {
            assert!(KeyTemplate::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        for good in ["{a}:{b}", "{a}:x:{b}", "{a}x", "x{a}", "{{t}}:{a}"] {
            assert!(KeyTemplate::parse(good).is_ok(), "{good:?} should be accepted");
        }
    }

    #[test]
    fn no_value_forges_another_key() {
        let pairs = [
            (("a:b", "c"), ("a", "b:c")),
            (("a%3Ab", "c"), ("a:b", "c")),
            (("a", ""), ("a:", "")),
        ];
        for ((a1, b1), (a2, b2)) in pairs {
            let k1 = render("{x}:{y}", &[("x", a1), ("y", b1)]).unwrap();
            let k2 = render("{x}:{y}", &[("x", a2), ("y", b2)]).unwrap();
            assert_ne!(k1, k2);
        }
    }

    #[test]
    fn long_keys_are_hashed_and_bounded() {
        let head = "throttlegate:per-ip:";
        let long = "x".repeat(1 << 20);
        let k = finish_key(head, &long);
        assert!(k.len() <= MAX_KEY_LEN, "{k}");
        assert!(k.starts_with(head));
        assert_ne!(finish_key(head, &format!("{long}y")), k);
        let tagged = format!("{{t:acme}}:u:{long}");
        let k = finish_key(head, &tagged);
        assert!(k.starts_with("throttlegate:per-ip:{t:acme}#"), "{k}");
        let head64 = format!("throttlegate:{}:", "n".repeat(64));
        assert!(finish_key(&head64, &tagged).len() <= MAX_KEY_LEN);
    }

    #[test]
    fn secret_hides_values() {
        let t = KeyTemplate::parse("key:{api_key}").unwrap();
        let s = KeySecret::new(b"0123456789abcdef");
        let mut out = String::new();
        assert!(t.render(&[("api_key", "sk_live_123")], Some(&s), &mut out));
        assert!(!out.contains("sk_live"));
        assert_eq!(out.len(), "key:".len() + 32);
    }
}
