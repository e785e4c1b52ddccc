//! Owned, reusable attribute buffers for front ends: every name and value of
//! a request in one string, so converting a request from another language
//! costs one buffer (reused from call to call on the same thread) instead of
//! two strings per attribute.

use std::cell::Cell;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::key::Attributes;

/// A request's attributes, owned: names and values in one text buffer.
///
/// ```
/// use throttlegate::{AttributeBuf, Attributes};
/// let mut a = AttributeBuf::take();
/// a.push("ip", "203.0.113.7").unwrap();
/// assert_eq!(a.get_attr("ip"), Some("203.0.113.7"));
/// a.recycle(); // the next take() on this thread reuses the buffer
/// ```
#[derive(Debug, Default, Clone)]
pub struct AttributeBuf {
    text: String,
    /// For each attribute: where its name starts and ends, where its value
    /// starts and ends.
    spans: SmallVec<[[u32; 4]; 4]>,
}

thread_local! {
    /// The last recycled buffer (text and spans), reused by the next take.
    static SPARE: Cell<AttributeBuf> = Cell::new(AttributeBuf::default());
}

fn offset(x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::invalid_argument("attributes: too long (4 GiB at most in all)"))
}

impl AttributeBuf {
    /// An empty buffer, reusing this thread's last recycled one.
    pub fn take() -> AttributeBuf {
        let mut buf = SPARE.with(Cell::take);
        if buf.text.capacity() == 0 {
            // Room for the usual handful of short attributes in one go.
            buf.text.reserve(96);
        }
        buf
    }

    /// Give the buffer back for the next [`AttributeBuf::take`] on this
    /// thread (buffers over 4 KiB or 64 attributes are dropped instead).
    pub fn recycle(mut self) {
        if self.text.capacity() <= 4096 && self.spans.capacity() <= 64 {
            self.text.clear();
            self.spans.clear();
            SPARE.with(|s| s.set(self));
        }
    }

    /// Add an attribute (a name given twice: the first one counts).
    pub fn push(&mut self, name: &str, value: &str) -> Result<()> {
        let start = self.text.len();
        self.text.push_str(name);
        let mid = self.text.len();
        self.text.push_str(value);
        self.end_attribute(start, mid)
    }

    /// The text buffer, for front ends that write names and values straight
    /// into it; then [`AttributeBuf::end_attribute`] marks what was written.
    pub fn text_mut(&mut self) -> &mut String {
        &mut self.text
    }

    /// Mark `text[start..mid]` as an attribute's name and `text[mid..]` as its value.
    pub fn end_attribute(&mut self, start: usize, mid: usize) -> Result<()> {
        debug_assert!(start <= mid && mid <= self.text.len());
        let (start, mid) = (offset(start)?, offset(mid)?);
        self.spans.push([start, mid, mid, offset(self.text.len())?]);
        Ok(())
    }

    /// Attributes packed as `name \0 value \0 ...` (the last `\0` may be
    /// left out), names and values holding no `\0`: one string from another
    /// language, split here once.
    pub fn from_packed(text: String) -> Result<AttributeBuf> {
        let mut buf = AttributeBuf::take();
        buf.text = text;
        buf.read_packed()?;
        Ok(buf)
    }

    /// Read the buffer's own text (written through [`AttributeBuf::text_mut`])
    /// as packed attributes, as [`AttributeBuf::from_packed`] does.
    pub fn read_packed(&mut self) -> Result<()> {
        self.spans.clear();
        let bytes = self.text.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let field_end = |from: usize| from + bytes[from..].iter().position(|&b| b == 0).unwrap_or(bytes.len() - from);
            let name_end = field_end(at);
            let value_start = (name_end + 1).min(bytes.len());
            let end = field_end(value_start);
            self.spans.push([offset(at)?, offset(name_end)?, offset(value_start)?, offset(end)?]);
            at = end + 1;
        }
        Ok(())
    }

    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there is no attribute.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

impl Attributes for AttributeBuf {
    fn get_attr(&self, name: &str) -> Option<&str> {
        let bytes = self.text.as_bytes();
        self.spans
            .iter()
            .find(|&&[s, n, ..]| &bytes[s as usize..n as usize] == name.as_bytes())
            .map(|&[_, _, v, e]| &self.text[v as usize..e as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushed_and_packed_attributes_read_alike() {
        let mut a = AttributeBuf::take();
        a.push("ip", "203.0.113.7").unwrap();
        a.push("route", "").unwrap();
        let p = AttributeBuf::from_packed("ip\u{0}203.0.113.7\u{0}route\u{0}\u{0}".into()).unwrap();
        for attrs in [&a, &p] {
            assert_eq!(attrs.len(), 2);
            assert_eq!(attrs.get_attr("ip"), Some("203.0.113.7"));
            assert_eq!(attrs.get_attr("route"), Some(""));
            assert_eq!(attrs.get_attr("i"), None);
            assert_eq!(attrs.get_attr("ip\u{0}"), None);
        }
        let q = AttributeBuf::from_packed("a\u{0}1\u{0}b\u{0}2".into()).unwrap();
        assert_eq!((q.get_attr("a"), q.get_attr("b")), (Some("1"), Some("2")));
        assert!(AttributeBuf::from_packed(String::new()).unwrap().is_empty());
        a.recycle();
        let b = AttributeBuf::take();
        assert!(b.is_empty() && b.text.capacity() > 0);
    }
}
