//! A fast path for the one shape that makes policy files big: a block
//! sequence of plain members under a `members:` key.
//!
//! The YAML parser costs about 0.5 µs per member (tokens, events, spans),
//! which for a million members is more than the kernel takes to store them.
//! Such lists are almost always generated, one plain scalar per line, so
//! before the parser runs, each such block is lifted out of the text: its
//! items are taken as they are written and the block is replaced by a
//! one-item flow list holding a marker. The lines after it move up, but no
//! message of that parse is ever shown: when it fails, the text as written
//! is parsed instead, and its messages name the lines as written.
//! After parsing, each marker's list is taken back, as one text of lines:
//! a million members are one allocation then, not a million strings.
//!
//! It is only ever an optimisation, never a second YAML dialect: a block is
//! lifted only when every line of it is something whose value the parser
//! would give verbatim (see [`plain_member`]); anything else (quotes,
//! comments after a key, tabs, continuation lines, anchors, `null`) leaves
//! the block to the parser. The caller parses the original text whenever
//! the lifted one fails to parse or a marker is not found exactly where it
//! was put, so errors always come from the parser reading what was written.
//! A differential test checks that both paths agree.

use crate::lines::line_at;

/// Blocks shorter than this are left to the parser: lifting them saves
/// nothing measurable.
pub(crate) const MIN_LIFTED: usize = 256;

/// The markers' common prefix. A text whose parts left to the parser
/// already contain it is never lifted, so a marker cannot be confused with
/// anything the author wrote.
const MARKER_PREFIX: &str = "ipsetmgr-lifted-members-";

/// A text with its member blocks lifted out.
pub(crate) struct Lifted {
    /// What the parser reads.
    pub text: String,
    /// The lifted lists, in order, one member per line: list `i` is behind
    /// marker `i`.
    lists: Vec<String>,
}

impl Lifted {
    /// Take each lifted list back for the member list its marker is in
    /// (which is left empty). `members` are all the member lists the parsed
    /// documents hold; the answer has one entry for each: its lines, or
    /// `None` for a list that held no marker. `None` in all when a marker is
    /// not exactly one list's only item, is found twice, or is missing: the
    /// caller then parses the original text.
    pub fn take_back<'m>(
        self,
        members: impl IntoIterator<Item = &'m mut Vec<String>>,
    ) -> Option<Vec<Option<String>>> {
        let mut members: Vec<&mut Vec<String>> = members.into_iter().collect();
        let mut used = vec![false; self.lists.len()];
        let mut found = Vec::with_capacity(members.len());
        for list in &members {
            let index = match list.as_slice() {
                [only] => marker_index(only),
                other if other.iter().any(|m| m.starts_with(MARKER_PREFIX)) => return None,
                _ => None,
            };
            if let Some(i) = index {
                if i >= used.len() || used[i] {
                    return None;
                }
                used[i] = true;
            }
            found.push(index);
        }
        if !used.into_iter().all(|u| u) {
            return None;
        }
        let mut lists: Vec<Option<String>> = self.lists.into_iter().map(Some).collect();
        Some(
            members
                .iter_mut()
                .zip(found)
                .map(|(list, index)| {
                    let i = index?;
                    list.clear();
                    lists[i].take()
                })
                .collect(),
        )
    }
}

fn marker(i: usize) -> String {
    format!("{MARKER_PREFIX}{i}")
}

fn marker_index(s: &str) -> Option<usize> {
    s.strip_prefix(MARKER_PREFIX)?.parse().ok()
}

/// Lift every member block of at least `min` items; `None` when there is
/// none (or a part left to the parser contains the marker prefix, or more
/// than `max_items` members would be lifted: the parser's own budget then
/// decides).
pub(crate) fn lift(text: &str, min: usize, max_items: usize) -> Option<Lifted> {
    lift_with(text, min, max_items, PARALLEL_LIFT_MIN)
}

/// [`lift`], reading blocks of at least `parallel_min` bytes on two threads.
fn lift_with(text: &str, min: usize, max_items: usize, parallel_min: usize) -> Option<Lifted> {
    let mut out = String::new();
    let mut lists: Vec<String> = Vec::new();
    let mut copied = 0;
    let mut total = 0usize;
    // Byte offset of the line looked at.
    let mut at = 0;
    while at < text.len() {
        let (line, next) = line_at(text, at);
        let block = members_key(line)
            .and_then(|indent| Some((indent, scan_block(text, next, indent, parallel_min)?)));
        let Some((key_indent, block)) = block else {
            at = next;
            continue;
        };
        if block.items >= min {
            total += block.items;
            if total > max_items {
                return None;
            }
            if out.is_empty() {
                out.reserve(text.len());
            }
            push_unmarked(&mut out, &text[copied..at])?;
            out.push_str(&" ".repeat(key_indent));
            out.push_str("members: [");
            out.push_str(&marker(lists.len()));
            out.push(']');
            out.push('\n');
            copied = block.end;
            lists.push(block.lines);
        }
        at = block.end;
    }
    if lists.is_empty() {
        return None;
    }
    push_unmarked(&mut out, &text[copied..])?;
    Some(Lifted { text: out, lists })
}

/// Push a part of the text the parser will read; `None` when it holds the
/// markers' prefix, so that a marker the parser finds is always one put
/// there. (The lifted blocks are not searched: the parser never sees them,
/// and searching a million members for it took milliseconds.)
fn push_unmarked(out: &mut String, part: &str) -> Option<()> {
    if part.contains(MARKER_PREFIX) {
        return None;
    }
    out.push_str(part);
    Some(())
}

/// The indentation of a line that is exactly `members:` (spaces before,
/// spaces after): the key of a block to lift.
fn members_key(line: &str) -> Option<usize> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    (line[indent..].trim_end_matches(' ') == "members:").then_some(indent)
}

#[derive(Debug, PartialEq, Eq)]
struct Block {
    /// The items, one per line.
    lines: String,
    items: usize,
    /// Byte offset of the line after the last item.
    end: usize,
}

/// Below this many bytes after its key, a block is read on one thread.
const PARALLEL_LIFT_MIN: usize = 4 << 20;

/// The block sequence after a `members:` key at `key_indent`, starting at
/// byte `from`, if every line of it is a plain item, blank or a comment.
/// A big one is read in two halves at once: the second half on a thread of
/// its own, as if the block went on there. When the first half reaches it,
/// the two are one block, if the second's items are at the first's indent
/// (reading on, one thread would have refused otherwise); when the block
/// ends in the first half, what the second thread read is not used.
fn scan_block(text: &str, from: usize, key_indent: usize, parallel_min: usize) -> Option<Block> {
    let mid = (text.len() - from >= parallel_min)
        .then(|| {
            let half = from + (text.len() - from) / 2;
            let i = text.as_bytes()[half..].iter().position(|b| *b == b'\n')?;
            Some(half + i + 1).filter(|m| *m < text.len())
        })
        .flatten();
    match mid {
        Some(mid) => scan_halves(text, from, mid, key_indent),
        None => scan_lines(text, from, text.len(), key_indent)?.into_block(),
    }
}

/// [`scan_block`] in two halves, the second from byte `mid` (a line's
/// start) on.
fn scan_halves(text: &str, from: usize, mid: usize, key_indent: usize) -> Option<Block> {
    let (first, second) = std::thread::scope(|scope| {
        let second = scope.spawn(|| scan_lines(text, mid, text.len(), key_indent));
        let first = scan_lines(text, from, mid, key_indent);
        let second = second
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        (first, second)
    });
    let mut first = first?;
    if !first.reached_limit {
        return first.into_block();
    }
    let second = second?;
    if second.items == 0 {
        return first.into_block();
    }
    if first
        .item_indent
        .is_some_and(|w| second.item_indent != Some(w))
    {
        return None;
    }
    if first.items > 0 {
        first.lines.push('\n');
    }
    first.lines.push_str(&second.lines);
    Some(Block {
        lines: first.lines,
        items: first.items + second.items,
        end: second.end,
    })
}

/// What [`scan_lines`] read of a block.
struct Scan {
    lines: String,
    items: usize,
    item_indent: Option<usize>,
    /// Byte offset of the line after the last item.
    end: usize,
    /// The block went on up to the limit.
    reached_limit: bool,
}

impl Scan {
    fn into_block(self) -> Option<Block> {
        (self.items > 0).then_some(Block {
            lines: self.lines,
            items: self.items,
            end: self.end,
        })
    }
}

/// Read the lines of a block after a key at `key_indent` from byte `from`
/// (a line's start) up to the block's end or byte `limit` (a line's start),
/// whichever comes first; `None` as soon as a line is not a plain item,
/// blank or a comment.
fn scan_lines(text: &str, from: usize, limit: usize, key_indent: usize) -> Option<Scan> {
    let bytes = text.as_bytes();
    let mut scan = Scan {
        lines: String::new(),
        items: 0,
        item_indent: None,
        end: from,
        reached_limit: false,
    };
    let mut at = from;
    loop {
        if at >= limit {
            scan.reached_limit = true;
            break;
        }
        // Almost every line of a big block is an item at the indent of the
        // first: that case is read in one pass over its bytes, which finds
        // the line's end and checks the value at once.
        if let Some(want) = scan.item_indent
            && let Some((value, next)) = item_at(bytes, at, want)?
        {
            scan.push(&text[value], next);
            at = next;
            continue;
        }
        let (line, next) = line_at(text, at);
        at = next;
        let body = line.trim_start_matches(' ');
        let indent = line.len() - body.len();
        if body.bytes().any(|b| b == b'\t' || b == b'\r') {
            return None;
        }
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let is_item = body.starts_with("- ");
        // The block ends at the first line left of its items, or at the
        // key's own indentation with anything but an indentless item.
        if indent < key_indent || (indent == key_indent && !is_item) {
            break;
        }
        let want = *scan.item_indent.get_or_insert(indent);
        if indent != want || !is_item {
            // Deeper lines continue or nest an item; shallower ones between
            // the key and the items are not a sequence the parser would
            // read as plain items either.
            return None;
        }
        let value = body[2..].trim_matches(' ');
        if !plain_member(value) {
            return None;
        }
        scan.push(value, next);
    }
    Some(scan)
}

impl Scan {
    /// One more item, whose line ends before byte `next`.
    fn push(&mut self, value: &str, next: usize) {
        if self.items > 0 {
            self.lines.push('\n');
        }
        self.lines.push_str(value);
        self.items += 1;
        self.end = next;
    }
}

/// The line at byte `at` read as an item at `indent` (`indent` spaces,
/// `- `, a plain member, spaces): the value's byte range and the offset of
/// the next line. `Ok(None)` when the line does not start as such an item
/// (the caller looks at it closely then); `None` when it does but its value
/// is not a plain member, and the block is not lifted, as
/// [`plain_member`] would decide.
fn item_at(
    bytes: &[u8],
    at: usize,
    indent: usize,
) -> Option<Option<(std::ops::Range<usize>, usize)>> {
    let dash = at + indent;
    let starts_as_item = bytes.len() > dash + 1
        && bytes[dash] == b'-'
        && bytes[dash + 1] == b' '
        && bytes[at..dash].iter().all(|b| *b == b' ');
    if !starts_as_item {
        return Some(None);
    }
    let mut start = dash + 2;
    while start < bytes.len() && bytes[start] == b' ' {
        start += 1;
    }
    let mut i = start;
    let mut prev = 0u8;
    let mut last = start; // one past the last byte that is not a space
    while i < bytes.len() && bytes[i] != b'\n' {
        let b = bytes[i];
        if !PLAIN[usize::from(b)] || (prev == b':' && b == b' ') {
            return None;
        }
        if b != b' ' {
            last = i + 1;
        }
        prev = b;
        i += 1;
    }
    let value = &bytes[start..last];
    let plain = !value.is_empty()
        && value.len() <= MAX_PLAIN_LEN
        && value[0].is_ascii_alphanumeric()
        && value[value.len() - 1] != b':'
        && !matches!(value, b"null" | b"Null" | b"NULL");
    if !plain {
        // An empty value is `-` and spaces: a null item, or a nested block;
        // the close look decides. Anything else is no plain member.
        return if value.is_empty() { Some(None) } else { None };
    }
    Some(Some((start..last, (i + 1).min(bytes.len()))))
}

/// The longest member lifted: longer ones are left to the parser.
const MAX_PLAIN_LEN: usize = 256;

/// Whether the YAML parser reads `s`, a plain scalar on one line of a block
/// sequence, as exactly the string `s`: letters, digits and `. : / _ , -`
/// and inner spaces (`10.0.0.0/8 nomatch`, `1.2.3.4,tcp:80`), starting with
/// a letter or digit, with no `: ` (a mapping) or trailing `:`, and not a
/// null (the parser refuses null where a string is wanted). Numbers and
/// booleans are fine: a string target takes their text as written.
fn plain_member(s: &str) -> bool {
    let bytes = s.as_bytes();
    if s.is_empty() || s.len() > MAX_PLAIN_LEN || !bytes[0].is_ascii_alphanumeric() {
        return false;
    }
    // One pass over the bytes (this runs for every line of a big list):
    // each byte allowed, and no `: ` anywhere.
    let mut prev = 0u8;
    for &b in bytes {
        if !PLAIN[usize::from(b)] || (prev == b':' && b == b' ') {
            return false;
        }
        prev = b;
    }
    prev != b':' && !matches!(s, "null" | "Null" | "NULL")
}

/// The bytes a lifted member may hold: letters, digits and `. : / _ , -`
/// and space.
const PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(c, b'.' | b':' | b'/' | b'_' | b',' | b'-' | b' ');
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn lifted(text: &str) -> Option<(String, Vec<Vec<String>>)> {
        lift(text, 1, usize::MAX).map(|l| {
            let lists = l
                .lists
                .iter()
                .map(|v| v.split('\n').map(str::to_string).collect())
                .collect();
            (l.text, lists)
        })
    }

    #[test]
    fn a_plain_block_is_lifted_with_its_blank_and_comment_lines() {
        let text = "spec:\n  type: hash:ip\n  members:\n  - 10.0.0.1\n\n  # c\n  - 10.0.0.2\n  maxElem: 5\n";
        let (out, lists) = lifted(text).expect("lifted");
        assert_eq!(lists, [vec!["10.0.0.1", "10.0.0.2"]]);
        assert_eq!(
            out,
            format!("spec:\n  type: hash:ip\n  members: [{MARKER_PREFIX}0]\n  maxElem: 5\n")
        );
    }

    #[test]
    fn indented_and_indentless_items_and_a_last_line_without_break() {
        let (_, lists) = lifted("members:\n    - a.b\n    - c:d").expect("lifted");
        assert_eq!(lists, [vec!["a.b", "c:d"]]);
        let (out, lists) =
            lifted("  members:\n  - 1.2.3.4,tcp:80\n  - 10.0.0.0/8 nomatch\n---\nx: 1\n")
                .expect("lifted");
        assert_eq!(lists, [vec!["1.2.3.4,tcp:80", "10.0.0.0/8 nomatch"]]);
        assert!(out.ends_with("0]\n---\nx: 1\n"), "{out:?}");
    }

    #[test]
    fn anything_the_parser_might_read_otherwise_is_left_to_it() {
        for text in [
            "members:\n- \"10.0.0.1\"\n",
            "members:\n- 10.0.0.1 # comment\n",
            "members:\n- a: b\n",
            "members:\n- a:\n",
            "members:\n- null\n",
            "members:\n- ~\n",
            "members:\n- *alias\n",
            "members:\n- &a 10.0.0.1\n",
            "members:\n- !!str 1\n",
            "members:\n- 10.0.0.1\n  continued\n",
            "members:\n- 10.0.0.1\r\n",
            "members:\n-\t10.0.0.1\n",
            "members:\n  - a\n - b\n",
            "members:\n- - a\n",
            "members:\n-\n",
            "members: &x\n- a\n",
            "members: # c\n- a\n",
            "members: [a, b]\n",
        ] {
            assert!(lifted(text).is_none(), "{text:?} was lifted");
            // The same item after a first one, where a line is read in one
            // pass.
            if let Some(rest) = text
                .strip_prefix("members:\n")
                .filter(|r| r.starts_with("- "))
            {
                let text = format!("members:\n- first\n{rest}");
                assert!(lifted(&text).is_none(), "{text:?} was lifted");
            }
        }
    }

    #[test]
    fn a_text_with_the_marker_prefix_or_too_many_members_is_never_lifted() {
        let text = format!("members:\n- a\nother: {MARKER_PREFIX}0\n");
        assert!(lifted(&text).is_none());
        assert!(lift("members:\n- a\n- b\n", 1, 1).is_none());
        assert!(
            lift("members:\n- a\n- b\n", 3, 10).is_none(),
            "shorter than min"
        );
    }

    fn line() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec![
            "members:",
            "  members:",
            "- 10.0.0.1",
            "- 10.0.0.2",
            "  - a.b",
            "  - c:d",
            "    - x",
            "",
            "# c",
            "  # c",
            "x: 1",
            "  y: 2",
            "- \"q\"",
            "-",
            "- a ",
            "  - 1.2.3.4,tcp:80",
            "\t- a",
            "- a\r",
            "---",
            "  - 10.0.0.0/8 nomatch",
        ])
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
        /// A block read in two halves is the block read on one thread,
        /// wherever the second half starts.
        #[test]
        fn a_block_in_two_halves_is_the_block(
            lines in proptest::collection::vec(line(), 0..24),
        ) {
            let text = format!("{}\n", lines.join("\n"));
            let whole = scan_lines(&text, 0, text.len(), 0).and_then(Scan::into_block);
            let starts = text.match_indices('\n').map(|(i, _)| i + 1).filter(|m| *m < text.len());
            for mid in starts {
                proptest::prop_assert_eq!(
                    scan_halves(&text, 0, mid, 0),
                    whole.as_ref().map(|b| Block { lines: b.lines.clone(), ..*b }),
                    "{:?} split at {}", text, mid
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        /// Blocks read in two halves on two threads are lifted exactly as
        /// read on one: every block of these texts is split (at its middle,
        /// which falls anywhere in it).
        #[test]
        fn two_halves_lift_as_one_thread_does(
            lines in proptest::collection::vec(line(), 0..30),
            last_break in proptest::bool::ANY,
        ) {
            let mut text = lines.join("\n");
            if last_break {
                text.push('\n');
            }
            let as_parts = |l: Option<Lifted>| l.map(|l| (l.text, l.lists));
            proptest::prop_assert_eq!(
                as_parts(lift_with(&text, 1, usize::MAX, 1)),
                as_parts(lift_with(&text, 1, usize::MAX, usize::MAX)),
                "{:?}", text
            );
        }
    }

    #[test]
    fn a_member_that_looks_like_a_marker_is_only_a_member() {
        let text = format!("members:\n- {MARKER_PREFIX}0\n- b\n");
        let l = lift(&text, 1, 10).expect("lifted");
        assert_eq!(l.text.matches(MARKER_PREFIX).count(), 1, "{:?}", l.text);
        let mut parsed = vec![marker(0)];
        let taken = l.take_back([&mut parsed]);
        assert_eq!(taken, Some(vec![Some(format!("{MARKER_PREFIX}0\nb"))]));
    }

    #[test]
    fn take_back_needs_every_marker_exactly_once_alone_in_its_list() {
        let text = "a:\n  members:\n  - x\n  - w\nb:\n  members:\n  - y\n";
        let l = || lift(text, 1, 10).unwrap();
        let mut first = vec![marker(0)];
        let mut second = vec![marker(1)];
        let mut other = vec!["z".to_string()];
        let taken = l().take_back([&mut first, &mut other, &mut second]);
        assert_eq!(
            taken,
            Some(vec![Some("x\nw".to_string()), None, Some("y".to_string())])
        );
        assert_eq!(
            (first, second, other),
            (vec![], vec![], vec!["z".to_string()])
        );

        let mut only_first = vec![marker(0)];
        assert_eq!(l().take_back([&mut only_first]), None, "marker 1 missing");
        let (mut a, mut b) = (vec![marker(0)], vec![marker(0)]);
        assert_eq!(l().take_back([&mut a, &mut b]), None, "marker 0 twice");
        let (mut a, mut b) = (vec![marker(0), "q".into()], vec![marker(1)]);
        assert_eq!(l().take_back([&mut a, &mut b]), None, "marker not alone");
    }
}
