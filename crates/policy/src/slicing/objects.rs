//! The IPSetMemberSlice objects `ipsetmgr slice` writes: their names and
//! labels, and their size as the API server and `kubectl apply` see it.

use std::collections::BTreeMap;
use std::io;

use ipsetmgr_api::{IPSetMemberSlice, IPSetMemberSliceSpec, POLICY_LABEL};

/// How many slices the policy's list was cut into when this slice was
/// made: slices of another count are stale, and this label finds them.
pub const SLICE_COUNT_LABEL: &str = "ipsetmgr.io/slice-count";
/// The standard label saying which tool made an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "ipsetmgr-slice";

/// `<policy>-<index>-of-<count>`, the index zero-padded to the width of the
/// last one, so that names sort in index order (`blocklist-007-of-128`).
pub(crate) fn slice_name(policy: &str, index: usize, count: usize) -> String {
    let width = (count - 1).to_string().len();
    format!("{policy}-{index:0width$}-of-{count}")
}

/// Slice `index` of `count` of `policy`'s members.
pub(crate) fn slice_object(
    policy: &str,
    index: usize,
    count: usize,
    members: &[&str],
) -> IPSetMemberSlice {
    let spec = IPSetMemberSliceSpec {
        members: members.iter().map(|m| m.to_string()).collect(),
    };
    let mut slice = IPSetMemberSlice::new(&slice_name(policy, index, count), spec);
    slice.metadata.labels = Some(BTreeMap::from([
        (POLICY_LABEL.to_string(), policy.to_string()),
        (SLICE_COUNT_LABEL.to_string(), count.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]));
    slice
}

/// The bytes of a slice as JSON the way Kubernetes clients write it: what
/// `kubectl apply` copies into its last-applied annotation, the first limit
/// a big object meets. Go's encoder writes compact JSON and escapes more
/// than serde_json (`<`, `>` and `&` as `\u003c`); this is the larger of
/// the two.
///
/// The object without its members is serialized; the members are counted,
/// not serialized, because serializing a million of them costs more than
/// the rest of slicing in a debug build.
pub fn json_bytes(slice: &IPSetMemberSlice) -> usize {
    let mut shell = IPSetMemberSlice::new(
        "",
        IPSetMemberSliceSpec {
            members: Vec::new(),
        },
    );
    shell.metadata = slice.metadata.clone();
    let mut counter = Counter::default();
    serde_json::to_writer(&mut counter, &shell).expect("a slice serializes");
    let members = &slice.spec.members;
    // `[]` is already counted: each member adds itself and a comma but one.
    let listed: usize = members.iter().map(|m| json_string_bytes(m)).sum();
    counter.bytes + 5 * counter.html + listed + members.len().saturating_sub(1)
}

/// The bytes of `s` as a JSON string, quotes included, by whichever of Go
/// and serde_json escapes more.
fn json_string_bytes(s: &str) -> usize {
    let escaped: usize = s
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' => 2,
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => 6,
            c if u32::from(c) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum();
    escaped + 2
}

/// Counts what is written instead of keeping it, and the bytes Go escapes.
#[derive(Default)]
struct Counter {
    bytes: usize,
    html: usize,
}

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes += buf.len();
        self.html += buf
            .iter()
            .filter(|b| matches!(b, b'<' | b'>' | b'&'))
            .count();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pad_the_index_to_the_last_ones_width() {
        assert_eq!(slice_name("blocklist", 7, 128), "blocklist-007-of-128");
        assert_eq!(slice_name("blocklist", 127, 128), "blocklist-127-of-128");
        assert_eq!(slice_name("b", 0, 1), "b-0-of-1");
        assert_eq!(slice_name("b", 9, 16), "b-09-of-16");
        assert_eq!(slice_name("b", 3, 1024), "b-0003-of-1024");
    }

    #[test]
    fn objects_carry_the_three_labels() {
        let s = slice_object("blocklist", 1, 4, &["10.0.0.1", "10.0.0.2"]);
        assert_eq!(s.metadata.name.as_deref(), Some("blocklist-1-of-4"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[POLICY_LABEL], "blocklist");
        assert_eq!(labels[SLICE_COUNT_LABEL], "4");
        assert_eq!(labels[MANAGED_BY_LABEL], "ipsetmgr-slice");
        assert_eq!(s.spec.members, ["10.0.0.1", "10.0.0.2"]);
    }

    /// Go's encoding/json output for a string: serde_json's, with the
    /// escapes Go adds.
    fn go_json(s: &str) -> String {
        serde_json::to_string(s)
            .unwrap()
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029")
    }

    #[test]
    fn json_bytes_are_the_compact_json_with_go_escapes() {
        for members in [
            &[][..],
            &["10.0.0.1"],
            &["10.0.0.1", "2001:db8::/32 nomatch", "AA:BB:CC:DD:EE:FF"],
        ] {
            let s = slice_object("p", 0, 1, members);
            assert_eq!(
                json_bytes(&s),
                serde_json::to_vec(&s).unwrap().len(),
                "{members:?}"
            );
        }
        let html = slice_object("p", 0, 1, &["<a>&", "x"]);
        assert_eq!(
            json_bytes(&html),
            serde_json::to_vec(&html).unwrap().len() + 15
        );
    }

    #[test]
    fn string_bytes_cover_both_encoders() {
        for s in [
            "",
            "a",
            "\"\\",
            "\n\r\t",
            "\u{1}\u{8}\u{c}\u{1f}",
            "<>&",
            "caf\u{e9}",
            "\u{2028}",
            "\u{7f}~",
        ] {
            let serde = serde_json::to_string(s).unwrap().len();
            let go = go_json(s).len();
            assert!(json_string_bytes(s) >= serde.max(go), "{s:?}");
        }
        // Exact for what members can hold (printable ASCII).
        let printable: String = (b'!'..=b'~').map(char::from).collect();
        assert_eq!(json_string_bytes(&printable), go_json(&printable).len());
    }
}
