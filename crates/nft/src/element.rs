//! The elements of one nft set, packed as the kernel's key bytes: a million
//! IPv4 addresses are 4 MB, one allocation. Desired state, kernel state and
//! the operations between them all use this one form, so comparing them is
//! comparing bytes, and an operation borrows it rather than copying.

use std::cmp::Ordering;
use std::fmt;

use ipsetmgr_ipset::Comment;

use crate::spec::KeyType;
use crate::value::{Value, ValueError};

/// The longest element comment nft takes (its NFTNL_UDATA_COMMENT_MAXLEN:
/// `nft` refuses longer ones in its syntax, and the kernel's 256-byte
/// element userdata leaves no room for ipset's 255). Longer ones are refused,
/// never cut.
pub const MAX_ELEMENT_COMMENT_LEN: usize = 128;

/// Elements of one key type. In an interval set every element is a range
/// (`key` to `key_end`, both inclusive; exact values are one-value ranges).
#[derive(Clone, PartialEq, Eq)]
pub struct Elements {
    key: KeyType,
    ranges: bool,
    /// Per element: the key, then (ranges) the key's end.
    data: Vec<u8>,
    /// Comments by element index, ascending.
    comments: Vec<(u32, Comment)>,
}

/// One element, borrowed from [`Elements`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ElementRef<'a> {
    key_type: KeyType,
    pub key: &'a [u8],
    /// The inclusive end of the range (interval sets only).
    pub key_end: Option<&'a [u8]>,
    pub comment: Option<&'a Comment>,
}

/// One element as typed values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Vec<Value>,
    /// The inclusive end of the range (interval sets only).
    pub key_end: Option<Vec<Value>>,
    pub comment: Option<Comment>,
}

/// An element that does not fit the set's key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ElementError {
    #[error("an element of {got} bytes for a key of {want}")]
    Length { got: usize, want: usize },
    #[error("an element of type {got} in a set of type {want}")]
    Type { got: String, want: KeyType },
    #[error("a range in a set without intervals, or a value without its range end")]
    Range,
    #[error("a range whose end is below its start")]
    Reversed,
    #[error("more than 2^32 elements")]
    TooMany,
    #[error("a comment of more than {MAX_ELEMENT_COMMENT_LEN} characters (nft's limit)")]
    CommentTooLong,
}

impl Elements {
    /// No elements, for a set with `key` (ranges: an interval set).
    pub fn new(key: KeyType, ranges: bool) -> Elements {
        Elements::with_capacity(key, ranges, 0)
    }

    pub fn with_capacity(key: KeyType, ranges: bool, n: usize) -> Elements {
        let stride = key.len() * if ranges { 2 } else { 1 };
        Elements {
            key,
            ranges,
            data: Vec::with_capacity(n.saturating_mul(stride)),
            comments: Vec::new(),
        }
    }

    pub fn key_type(&self) -> KeyType {
        self.key
    }

    /// Elements that are keys alone, from their bytes one after another,
    /// already sorted without duplicates (checked in debug builds).
    pub(crate) fn from_sorted_keys(key: KeyType, data: Vec<u8>) -> Elements {
        let e = Elements {
            key,
            ranges: false,
            data,
            comments: Vec::new(),
        };
        debug_assert!(e.data.len().is_multiple_of(key.len()) && e.is_canonical());
        e
    }

    /// Whether every element is a range (the set has `flags interval`).
    pub fn has_ranges(&self) -> bool {
        self.ranges
    }

    fn stride(&self) -> usize {
        self.key.len() * if self.ranges { 2 } else { 1 }
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.stride()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Whether any element carries a comment.
    pub fn has_comments(&self) -> bool {
        !self.comments.is_empty()
    }

    /// Append an element from its key bytes (and, in an interval set, its
    /// range end).
    pub fn push_raw(
        &mut self,
        key: &[u8],
        key_end: Option<&[u8]>,
        comment: Option<Comment>,
    ) -> Result<(), ElementError> {
        let want = self.key.len();
        if key.len() != want {
            return Err(ElementError::Length {
                got: key.len(),
                want,
            });
        }
        match (self.ranges, key_end) {
            (true, Some(end)) if end.len() != want => {
                return Err(ElementError::Length {
                    got: end.len(),
                    want,
                });
            }
            (true, Some(end)) if self.reversed(key, end) => return Err(ElementError::Reversed),
            (true, Some(_)) | (false, None) => {}
            _ => return Err(ElementError::Range),
        }
        if comment
            .as_ref()
            .is_some_and(|c| c.as_str().len() > MAX_ELEMENT_COMMENT_LEN)
        {
            return Err(ElementError::CommentTooLong);
        }
        let index = u32::try_from(self.len()).map_err(|_| ElementError::TooMany)?;
        self.data.extend_from_slice(key);
        if let Some(end) = key_end {
            self.data.extend_from_slice(end);
        }
        if let Some(c) = comment {
            self.comments.push((index, c));
        }
        Ok(())
    }

    /// Whether some field of the range ends below its start.
    fn reversed(&self, key: &[u8], end: &[u8]) -> bool {
        self.key.fields().iter().enumerate().any(|(i, f)| {
            let at = self.key.offset(i);
            let (a, b) = (&key[at..at + f.len()], &end[at..at + f.len()]);
            if f.host_order() {
                a.iter().rev().cmp(b.iter().rev()) == Ordering::Greater
            } else {
                a > b
            }
        })
    }

    /// Append a typed element.
    pub fn push(&mut self, e: &Element) -> Result<(), ElementError> {
        let mut key = Vec::with_capacity(self.key.len());
        self.encode_values(&e.key, &mut key)?;
        let end = match &e.key_end {
            Some(end) => {
                let mut b = Vec::with_capacity(self.key.len());
                self.encode_values(end, &mut b)?;
                Some(b)
            }
            None => None,
        };
        self.push_raw(&key, end.as_deref(), e.comment.clone())
    }

    fn encode_values(&self, values: &[Value], out: &mut Vec<u8>) -> Result<(), ElementError> {
        let types: Vec<_> = values.iter().map(Value::field_type).collect();
        if types != self.key.fields() {
            let got = types
                .iter()
                .map(|t| t.nft_name())
                .collect::<Vec<_>>()
                .join(" . ");
            return Err(ElementError::Type {
                got,
                want: self.key,
            });
        }
        for v in values {
            v.encode(out);
        }
        self.key.fit(out);
        Ok(())
    }

    pub fn get(&self, i: usize) -> Option<ElementRef<'_>> {
        let stride = self.stride();
        let at = i.checked_mul(stride)?;
        let bytes = self.data.get(at..at + stride)?;
        let klen = self.key.len();
        let comment = self
            .comments
            .binary_search_by_key(&(i as u64), |(j, _)| u64::from(*j))
            .ok()
            .map(|p| &self.comments[p].1);
        Some(ElementRef {
            key_type: self.key,
            key: &bytes[..klen],
            key_end: self.ranges.then(|| &bytes[klen..]),
            comment,
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = ElementRef<'_>> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Every element as typed values (for display and tests: allocates).
    pub fn typed(&self) -> Result<Vec<Element>, ValueError> {
        self.iter().map(|e| e.typed()).collect()
    }

    /// Sorted by bytes, exact duplicates (same key and range end) dropped;
    /// of duplicates the first one's comment is kept. Two canonical element
    /// lists of the same set contents are equal.
    pub fn canonicalize(&mut self) {
        // Members come sorted from a member set whose order is the bytes'
        // (IPv4 and IPv6 addresses first): one pass tells, and a million
        // are then neither sorted nor copied again.
        if self.is_canonical() {
            return;
        }
        let stride = self.stride();
        let n = self.len();
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (a as usize * stride, b as usize * stride);
            self.data[a..a + stride].cmp(&self.data[b..b + stride])
        });
        let mut out = Elements::with_capacity(self.key, self.ranges, n);
        let mut last: Option<usize> = None;
        for i in order {
            let i = i as usize;
            let bytes = &self.data[i * stride..(i + 1) * stride];
            if last.is_some_and(|l| &self.data[l * stride..(l + 1) * stride] == bytes) {
                continue;
            }
            let index = out.len() as u32;
            out.data.extend_from_slice(bytes);
            if let Some(c) = self.get(i).and_then(|e| e.comment) {
                out.comments.push((index, c.clone()));
            }
            last = Some(i);
        }
        *self = out;
    }

    /// Whether the elements are sorted by bytes without duplicates.
    pub fn is_canonical(&self) -> bool {
        let stride = self.stride();
        self.data
            .chunks_exact(stride)
            .zip(self.data.chunks_exact(stride).skip(1))
            .all(|(a, b)| a < b)
    }

    /// What to delete from and add to a set holding `kernel` so that it
    /// holds `self`: `(delete, add)`. Both must be canonical. An element
    /// whose comment differs is in both: the kernel keeps the comment of an
    /// element that is added again, so a new comment takes a delete and an
    /// add (in one transaction: the element never goes missing).
    pub fn diff(&self, kernel: &Elements) -> (Elements, Elements) {
        let mut del = Elements::new(self.key, self.ranges);
        let mut add = Elements::new(self.key, self.ranges);
        let (mut i, mut j) = (0, 0);
        let copy = |to: &mut Elements, e: ElementRef<'_>| {
            // Same key type and range shape: cannot fail.
            let _ = to.push_raw(e.key, e.key_end, e.comment.cloned());
        };
        // Without comments, equal elements are equal bytes: runs of them
        // are skipped a block at a time (a 10-element change of a million
        // elements compares 4 MB, not a million elements one by one).
        let plain = self.comments.is_empty() && kernel.comments.is_empty();
        let stride = self.stride();
        while i < self.len() || j < kernel.len() {
            if plain {
                let n = common_prefix(&self.data[i * stride..], &kernel.data[j * stride..], stride);
                i += n;
                j += n;
            }
            match (self.get(i), kernel.get(j)) {
                (Some(a), Some(b)) => match a.bytes_cmp(&b) {
                    Ordering::Less => {
                        copy(&mut add, a);
                        i += 1;
                    }
                    Ordering::Greater => {
                        copy(&mut del, b);
                        j += 1;
                    }
                    Ordering::Equal => {
                        if a.comment != b.comment {
                            copy(&mut del, b);
                            copy(&mut add, a);
                        }
                        i += 1;
                        j += 1;
                    }
                },
                (Some(a), None) => {
                    copy(&mut add, a);
                    i += 1;
                }
                (None, Some(b)) => {
                    copy(&mut del, b);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        (del, add)
    }

    /// `self` without `del` and with `add`, all three canonical and of one
    /// key type: what a fresh `canonicalize` of that content gives, copied
    /// in runs between the changed elements. `None` when an element carries
    /// a comment or the types differ (then build the elements anew).
    pub fn splice(&self, del: &Elements, add: &Elements) -> Option<Elements> {
        let same = |o: &Elements| o.key == self.key && o.ranges == self.ranges;
        let plain = self.comments.is_empty() && del.comments.is_empty() && add.comments.is_empty();
        if !same(del) || !same(add) || !plain {
            return None;
        }
        let stride = self.stride();
        let n = (self.len() + add.len()).saturating_sub(del.len());
        let mut out = Elements::with_capacity(self.key, self.ranges, n);
        let mut dels = del.data.chunks_exact(stride).peekable();
        let mut adds = add.data.chunks_exact(stride).peekable();
        // Elements of `self` before `at` are in `out` already.
        let mut at = 0;
        loop {
            let next = match (dels.peek(), adds.peek()) {
                (Some(d), Some(a)) => (*d).min(*a),
                (Some(d), None) => *d,
                (None, Some(a)) => *a,
                (None, None) => break,
            };
            // Copy what comes before the next change.
            let rest = &self.data[at * stride..];
            let k = lower_bound(rest, stride, next);
            out.data.extend_from_slice(&rest[..k * stride]);
            at += k;
            let here = self.data.get(at * stride..(at + 1) * stride) == Some(next);
            let deleted = dels.next_if(|d| *d == next).is_some();
            let added = adds.next_if(|a| *a == next).is_some();
            if added || (here && !deleted) {
                out.data.extend_from_slice(next);
            }
            if here {
                at += 1;
            }
        }
        out.data.extend_from_slice(&self.data[at * stride..]);
        u32::try_from(out.len()).ok()?;
        Some(out)
    }
}

/// How many elements of `stride` bytes at the start of sorted `data` are
/// below `key`.
fn lower_bound(data: &[u8], stride: usize, key: &[u8]) -> usize {
    let (mut lo, mut hi) = (0, data.len() / stride);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if &data[mid * stride..(mid + 1) * stride] < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// How many whole elements of `stride` bytes `a` and `b` begin with in
/// common.
fn common_prefix(a: &[u8], b: &[u8], stride: usize) -> usize {
    const BLOCK: usize = 4096;
    let max = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= max && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    let end = (at + BLOCK).min(max);
    at += a[at..end]
        .iter()
        .zip(&b[at..end])
        .take_while(|(x, y)| x == y)
        .count();
    at / stride
}

impl fmt::Debug for Elements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        write!(f, "Elements({}, {} [", self.key, self.len())?;
        for (i, e) in self.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{e}")?;
        }
        if self.len() > SHOWN {
            f.write_str(", ...")?;
        }
        f.write_str("])")
    }
}

impl<'a> ElementRef<'a> {
    fn bytes_cmp(&self, other: &ElementRef<'_>) -> Ordering {
        self.key
            .cmp(other.key)
            .then_with(|| self.key_end.cmp(&other.key_end))
    }

    pub fn key_type(&self) -> KeyType {
        self.key_type
    }

    /// The element as typed values; never panics, whatever the bytes.
    pub fn typed(&self) -> Result<Element, ValueError> {
        Ok(Element {
            key: decode_key(self.key_type, self.key)?,
            key_end: match self.key_end {
                Some(end) => Some(decode_key(self.key_type, end)?),
                None => None,
            },
            comment: self.comment.cloned(),
        })
    }
}

/// The typed fields of a key.
pub(crate) fn decode_key(key: KeyType, bytes: &[u8]) -> Result<Vec<Value>, ValueError> {
    key.fields()
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let at = key.offset(i);
            Value::decode(f, bytes.get(at..).unwrap_or(&[]))
        })
        .collect()
}

/// As `nft list` would print the element, ranges as prefixes where they are
/// one (`10.0.0.0/8 . tcp . 80`); bytes that are no value print as hex.
impl fmt::Display for ElementRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.typed() {
            Ok(e) => write!(f, "{e}"),
            Err(_) => {
                for b in self.key {
                    write!(f, "{b:02x}")?;
                }
                if let Some(end) = self.key_end {
                    f.write_str("-")?;
                    for b in end {
                        write!(f, "{b:02x}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.key.iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            match self.key_end.as_ref().and_then(|e| e.get(i)) {
                Some(end) if end != v => match crate::interval::prefix_of(v, end) {
                    Some(len) => write!(f, "{v}/{len}")?,
                    None => write!(f, "{v}-{end}")?,
                },
                _ => write!(f, "{v}")?,
            }
        }
        if let Some(c) = &self.comment {
            write!(f, " comment \"{c}\"")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::FieldType;

    fn ip(s: &str) -> Value {
        Value::Ipv4(s.parse().unwrap())
    }

    fn v4_elements(items: &[(&str, &str, Option<&str>)]) -> Elements {
        let mut e = Elements::new(KeyType::single(FieldType::Ipv4Addr), true);
        for (a, b, c) in items {
            e.push(&Element {
                key: vec![ip(a)],
                key_end: Some(vec![ip(b)]),
                comment: c.map(|c| Comment::parse(c).unwrap()),
            })
            .unwrap();
        }
        e
    }

    #[test]
    fn pushing_checks_the_shape() {
        let mut e = Elements::new(KeyType::single(FieldType::Ipv4Addr), false);
        assert_eq!(
            e.push_raw(&[1, 2, 3], None, None),
            Err(ElementError::Length { got: 3, want: 4 })
        );
        assert_eq!(
            e.push_raw(&[1, 2, 3, 4], Some(&[1, 2, 3, 4]), None),
            Err(ElementError::Range)
        );
        assert!(matches!(
            e.push(&Element {
                key: vec![Value::Service(1)],
                key_end: None,
                comment: None
            }),
            Err(ElementError::Type { .. })
        ));
        let mut r = Elements::new(KeyType::single(FieldType::Ipv4Addr), true);
        assert_eq!(
            r.push_raw(&[10, 0, 0, 2], Some(&[10, 0, 0, 1]), None),
            Err(ElementError::Reversed)
        );
        let mut m = Elements::new(KeyType::single(FieldType::Mark), true);
        // Host order: 256 > 1 although its first byte may be smaller.
        let (one, big) = (1u32.to_ne_bytes(), 256u32.to_ne_bytes());
        assert_eq!(m.push_raw(&one, Some(&big), None), Ok(()));
        assert_eq!(
            m.push_raw(&big, Some(&one), None),
            Err(ElementError::Reversed)
        );
    }

    #[test]
    fn canonical_lists_diff_by_bytes_and_comments() {
        let mut kernel = v4_elements(&[
            ("10.0.0.0", "10.255.255.255", Some("old")),
            ("1.1.1.1", "1.1.1.1", None),
            ("2.0.0.0", "2.0.0.255", None),
            ("1.1.1.1", "1.1.1.1", Some("dup dropped")),
        ]);
        kernel.canonicalize();
        assert!(kernel.is_canonical());
        assert_eq!(kernel.len(), 3);
        assert_eq!(kernel.get(0).unwrap().to_string(), "1.1.1.1");
        let mut want = v4_elements(&[
            ("10.0.0.0", "10.255.255.255", Some("new")),
            ("2.0.0.0", "2.0.0.255", None),
            ("3.0.0.0", "3.0.0.9", None),
        ]);
        want.canonicalize();
        let (del, add) = want.diff(&kernel);
        let show = |e: &Elements| e.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        assert_eq!(show(&del), ["1.1.1.1", "10.0.0.0/8 comment \"old\""]);
        assert_eq!(
            show(&add),
            ["3.0.0.0-3.0.0.9", "10.0.0.0/8 comment \"new\""]
        );
        let (del, add) = want.diff(&want);
        assert!(del.is_empty() && add.is_empty());
    }

    fn raw(values: &std::collections::BTreeSet<u32>) -> Elements {
        let mut e = Elements::new(KeyType::single(FieldType::Ipv4Addr), false);
        for v in values {
            e.push_raw(&v.to_be_bytes(), None, None).unwrap();
        }
        e
    }

    proptest::proptest! {
        /// Big enough for the block-wise skip (4 KiB): the diff and the
        /// splice agree with plain set arithmetic.
        #[test]
        fn diff_and_splice_are_set_arithmetic(
            have in proptest::collection::btree_set(0u32..6000, 0..3000),
            del in proptest::collection::btree_set(0u32..6000, 0..30),
            add in proptest::collection::btree_set(0u32..6000, 0..30),
        ) {
            let want: std::collections::BTreeSet<u32> =
                have.difference(&del).chain(&add).copied().collect();
            let spliced = raw(&have).splice(&raw(&del), &raw(&add)).unwrap();
            proptest::prop_assert!(spliced.is_canonical());
            proptest::prop_assert_eq!(&spliced, &raw(&want));
            let (d, a) = raw(&want).diff(&raw(&have));
            let gone: std::collections::BTreeSet<u32> = have.difference(&want).copied().collect();
            let new: std::collections::BTreeSet<u32> = want.difference(&have).copied().collect();
            proptest::prop_assert_eq!(d, raw(&gone));
            proptest::prop_assert_eq!(a, raw(&new));
        }
    }

    #[test]
    fn splice_refuses_comments() {
        let e = v4_elements(&[("1.1.1.1", "1.1.1.1", Some("c"))]);
        let none = Elements::new(e.key_type(), true);
        assert_eq!(e.splice(&none, &none), None);
        let exact = Elements::new(e.key_type(), false);
        assert_eq!(none.splice(&exact, &none), None);
    }

    #[test]
    fn bad_bytes_display_as_hex() {
        let mut e = Elements::new(KeyType::single(FieldType::Ifname), false);
        e.push_raw(&[0xff; 16], None, None).unwrap();
        assert!(e.get(0).unwrap().typed().is_err());
        assert_eq!(e.get(0).unwrap().to_string(), "ff".repeat(16));
        assert!(e.get(1).is_none());
    }
}
