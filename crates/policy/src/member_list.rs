//! Reading plain member lists: the files that big blocklists are published
//! as (FireHOL netsets, Spamhaus DROP: one member per line with comments),
//! and YAML or JSON lists of strings. `ipsetmgr slice` turns them into
//! IPSetMemberSlices; policy files point at them (`membersFrom: [{file: ...}]`).
//!
//! The reader only finds the members and the line each came from, so that
//! whoever validates them can name the line; it does not judge them. Files
//! are read like policy files: bounded, opened non-blocking, regular files
//! only, UTF-8 with an optional byte order mark. An empty list is an error,
//! never zero members: a truncated download must not empty a set.

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::load::{LoadError, bounded, read_bounded, read_limited, strip_bom, yaml_options};

/// The path that means standard input.
pub const STDIN: &str = "-";
/// How standard input is named in messages.
const STDIN_NAME: &str = "(stdin)";
// Input quoted in messages is cut to this many bytes.
use ipsetmgr_ipset::text::MAX_QUOTED_MEMBER as MAX_QUOTED;

/// The syntax of a member list.
/// (`--format` of `ipsetmgr slice` parses it in `src/args.rs`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFormat {
    /// One member per line; `#` and ` ;` start comments.
    Text,
    /// A YAML sequence of strings, or a mapping with a `members:` sequence.
    Yaml,
    /// A JSON array of strings, or an object with a `members` array.
    Json,
}

impl ListFormat {
    /// The format a file name implies: YAML for `*.yaml`/`*.yml`, JSON for
    /// `*.json`, text for anything else (`*.netset`, `*.txt`, no extension).
    pub fn of_path(path: &Path) -> ListFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => ListFormat::Yaml,
            Some("json") => ListFormat::Json,
            _ => ListFormat::Text,
        }
    }
}

/// One member as written, and the 1-based line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedMember {
    pub line: usize,
    pub text: String,
}

/// A member list and where it came from (for messages).
#[derive(Debug)]
pub struct MemberList {
    pub source: PathBuf,
    pub members: Vec<ListedMember>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemberListError {
    /// Missing, unreadable or too big.
    #[error(transparent)]
    Read(LoadError),
    #[error("{path}: not a regular file ({kind}); use - to read standard input")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: line {line}: not valid UTF-8")]
    NotUtf8 { path: PathBuf, line: usize },
    #[error("{path}: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: line {line}: members must be strings, found {found}")]
    NotAString {
        path: PathBuf,
        line: usize,
        found: String,
    },
    #[error(
        "{path}: contains no members (an empty or truncated list is an error, never zero members)"
    )]
    NoMembers { path: PathBuf },
}

impl MemberListError {
    /// The error without a parser's quotation of the text (YAML and JSON
    /// errors show the lines around the fault): for a list that is someone
    /// else's content, in a message others read.
    pub fn public(&self) -> String {
        match self {
            MemberListError::Yaml { path, .. } => {
                format!("{}: not a YAML list of members", path.display())
            }
            MemberListError::Json { path, .. } => {
                format!("{}: not a JSON list of members", path.display())
            }
            MemberListError::NotAString { path, line, .. } => {
                format!("{}: line {line}: members must be strings", path.display())
            }
            other => other.to_string(),
        }
    }

    fn read(e: LoadError) -> MemberListError {
        match e {
            LoadError::NotRegular { path, kind } => MemberListError::NotRegular { path, kind },
            other => MemberListError::Read(other),
        }
    }
}

/// Read the member list at `path` (`-`: standard input). `format`, when
/// given, overrides what the file name implies; standard input is text
/// unless told otherwise.
pub fn read_member_list(
    path: &Path,
    format: Option<ListFormat>,
) -> Result<MemberList, MemberListError> {
    let (source, bytes) = if path == Path::new(STDIN) {
        let source = PathBuf::from(STDIN_NAME);
        let bytes = read_limited(std::io::stdin().lock(), &source, 0);
        (source, bytes)
    } else {
        (path.to_path_buf(), read_bounded(path))
    };
    let bytes = bytes.map_err(MemberListError::read)?;
    let format = format.unwrap_or_else(|| {
        if path == Path::new(STDIN) {
            ListFormat::Text
        } else {
            ListFormat::of_path(path)
        }
    });
    let text = utf8(&bytes, &source)?;
    let members = parse_member_list(text, format, &source)?;
    Ok(MemberList { source, members })
}

/// The text of a file, or the line of its first invalid byte.
fn utf8<'a>(bytes: &'a [u8], path: &Path) -> Result<&'a str, MemberListError> {
    std::str::from_utf8(bytes).map_err(|e| MemberListError::NotUtf8 {
        path: path.to_path_buf(),
        line: line_at(&bytes[..e.valid_up_to()], 0, 1),
    })
}

/// The line of the byte after `bytes`, counting on from `line` at `from`.
fn line_at(bytes: &[u8], from: usize, line: usize) -> usize {
    line + bytes[from..].iter().filter(|&&b| b == b'\n').count()
}

/// Parse a member list of the given format; `path` names it in errors.
pub fn parse_member_list(
    text: &str,
    format: ListFormat,
    path: &Path,
) -> Result<Vec<ListedMember>, MemberListError> {
    let text = strip_bom(text);
    let members = match format {
        ListFormat::Text => parse_text(text),
        ListFormat::Yaml => parse_yaml(text, path)?,
        ListFormat::Json => parse_json(text, path)?,
    };
    if members.is_empty() {
        return Err(MemberListError::NoMembers {
            path: path.to_path_buf(),
        });
    }
    Ok(members)
}

/// One member per line. Comments and blank lines are skipped, and the
/// members are not judged here: `1.2.3.4 5.6.7.8` stays one (bad) member
/// rather than quietly becoming two.
fn parse_text(text: &str) -> Vec<ListedMember> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let member = strip_comment(line).trim();
            (!member.is_empty()).then(|| ListedMember {
                line: i + 1,
                text: member.to_string(),
            })
        })
        .collect()
}

/// A line without its comment: from `#` (FireHOL), from a `;` after
/// whitespace (Spamhaus DROP: `1.2.3.0/24 ; SBL123`), or the whole line
/// when it starts with `;` (Spamhaus's header). A `;` glued to a value
/// (`1.2.3.0/24;x`) is kept, so the member is refused instead of guessed.
fn strip_comment(line: &str) -> &str {
    let line = line.split_once('#').map_or(line, |(before, _)| before);
    if line.trim_start().starts_with(';') {
        return "";
    }
    let bytes = line.as_bytes();
    match (1..bytes.len()).find(|&i| bytes[i] == b';' && bytes[i - 1].is_ascii_whitespace()) {
        Some(i) => &line[..i],
        None => line,
    }
}

/// A YAML sequence of strings, or a mapping with a `members:` sequence
/// (other keys, such as a policy spec's `type:`, are ignored).
fn parse_yaml(text: &str, path: &Path) -> Result<Vec<ListedMember>, MemberListError> {
    let yaml_error = |e: serde_saphyr::Error| MemberListError::Yaml {
        path: path.to_path_buf(),
        message: bounded(e.to_string()),
    };
    let list: Option<Listed<serde_saphyr::Spanned<String>>> =
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(yaml_error)?;
    let items = list.map_or_else(Vec::new, |l| l.0);
    Ok(items
        .into_iter()
        .map(|s| ListedMember {
            line: s.referenced.line() as usize,
            text: s.value,
        })
        .collect())
}

/// A JSON array of strings, or an object with a `members` array (other
/// keys ignored). The elements are taken raw, borrowed from the text, so
/// that each one's position, hence its line, is known.
fn parse_json(text: &str, path: &Path) -> Result<Vec<ListedMember>, MemberListError> {
    let json_error = |e: serde_json::Error| MemberListError::Json {
        path: path.to_path_buf(),
        message: bounded(e.to_string()),
    };
    let list: Listed<&RawValue> = serde_json::from_str(text).map_err(json_error)?;
    let (mut offset, mut line) = (0, 1);
    let mut members = Vec::with_capacity(list.0.len());
    for raw in list.0 {
        let at = raw.get().as_ptr() as usize - text.as_ptr() as usize;
        line = line_at(&text.as_bytes()[..at], offset, line);
        offset = at;
        // The element is valid JSON, so this fails only for a non-string,
        // and the parser's own position would be within the element.
        let text =
            serde_json::from_str::<String>(raw.get()).map_err(|_| MemberListError::NotAString {
                path: path.to_path_buf(),
                line,
                found: crate::text::bounded(raw.get(), MAX_QUOTED).into_owned(),
            })?;
        members.push(ListedMember { line, text });
    }
    Ok(members)
}

/// The elements of a list given either bare or as the `members` of a
/// mapping. A hand-written visitor rather than an untagged enum: serde
/// buffers untagged input, which loses YAML spans and borrowed JSON.
struct Listed<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Listed<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListedVisitor(PhantomData))
    }
}

struct ListedVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ListedVisitor<T> {
    type Value = Listed<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of member strings, or a mapping with a `members` sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Listed(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "members" {
                map.next_value::<IgnoredAny>()?;
            } else if members.is_some() {
                return Err(de::Error::duplicate_field("members"));
            } else {
                members = Some(map.next_value::<Sequence<T>>()?.0);
            }
        }
        members
            .map(Listed)
            .ok_or_else(|| de::Error::missing_field("members"))
    }
}

/// `members:` itself must be a sequence, not another mapping.
struct Sequence<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Sequence<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SeqOnly<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for SeqOnly<T> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of member strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                ListedVisitor(PhantomData).visit_seq(seq).map(|l| l.0)
            }
        }
        d.deserialize_seq(SeqOnly(PhantomData)).map(Sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, format: ListFormat) -> Result<Vec<(usize, String)>, MemberListError> {
        parse_member_list(text, format, Path::new("l.txt"))
            .map(|ms| ms.into_iter().map(|m| (m.line, m.text)).collect())
    }

    fn lines(pairs: &[(usize, &str)]) -> Vec<(usize, String)> {
        pairs.iter().map(|&(l, s)| (l, s.to_string())).collect()
    }

    #[test]
    fn firehol_netsets_parse_with_comments_and_blank_lines() {
        let text = "#\n# firehol_level1\n#\n# ipv4 hash:net ipset\n#\n\n0.0.0.0/8\n1.10.16.0/20  # inline\n  5.134.128.0/19\t\n\n223.254.0.0/16";
        assert_eq!(
            parse(text, ListFormat::Text).unwrap(),
            lines(&[
                (7, "0.0.0.0/8"),
                (8, "1.10.16.0/20"),
                (9, "5.134.128.0/19"),
                (11, "223.254.0.0/16")
            ])
        );
    }

    #[test]
    fn spamhaus_drop_parses_with_semicolon_comments_crlf_and_bom() {
        let text = "\u{feff}; Spamhaus DROP List 2024/01/01 - (c) 2024 The Spamhaus Project\r\n; Last-Modified: Mon, 01 Jan 2024\r\n1.10.16.0/20 ; SBL256894\r\n1.19.0.0/16 ; SBL434604   \r\n\r\n  ;indented comment\r\n2.56.192.0/22\t; SBL459831\r\n";
        assert_eq!(
            parse(text, ListFormat::Text).unwrap(),
            lines(&[
                (3, "1.10.16.0/20"),
                (4, "1.19.0.0/16"),
                (7, "2.56.192.0/22")
            ])
        );
    }

    #[test]
    fn text_members_are_not_judged_or_split() {
        // Trailing spaces go; inner ones stay (nomatch, or a bad member
        // that validation must see); a glued `;` is not a comment.
        let text = "10.0.0.0/8 nomatch   \n1.2.3.4 5.6.7.8\n1.2.3.0/24;x\n";
        assert_eq!(
            parse(text, ListFormat::Text).unwrap(),
            lines(&[
                (1, "10.0.0.0/8 nomatch"),
                (2, "1.2.3.4 5.6.7.8"),
                (3, "1.2.3.0/24;x")
            ])
        );
    }

    #[test]
    fn empty_lists_are_errors_in_every_format() {
        for (text, format) in [
            ("", ListFormat::Text),
            ("# only comments\n; and these\n\n", ListFormat::Text),
            ("\u{feff}", ListFormat::Text),
            ("", ListFormat::Yaml),
            ("[]\n", ListFormat::Yaml),
            ("members: []\n", ListFormat::Yaml),
            ("[]", ListFormat::Json),
            ("{\"members\": []}", ListFormat::Json),
        ] {
            let e = parse(text, format).unwrap_err();
            assert!(
                matches!(e, MemberListError::NoMembers { .. }),
                "{text:?}: {e}"
            );
            assert!(
                e.to_string().starts_with("l.txt: contains no members"),
                "{e}"
            );
        }
    }

    #[test]
    fn yaml_sequences_and_members_mappings_parse_with_lines() {
        let seq = "# blocklist\n- 10.0.0.1\n- \"10.0.0.0/8 nomatch\"\n\n- ::1\n";
        assert_eq!(
            parse(seq, ListFormat::Yaml).unwrap(),
            lines(&[(2, "10.0.0.1"), (3, "10.0.0.0/8 nomatch"), (5, "::1")])
        );
        // A policy's spec: the other keys are ignored.
        let spec = "type: hash:net\nfamily: IPv4\nmembers:\n  - 10.0.0.0/8\n  - 192.168.0.0/16\nmaxElem: 65536\n";
        assert_eq!(
            parse(spec, ListFormat::Yaml).unwrap(),
            lines(&[(4, "10.0.0.0/8"), (5, "192.168.0.0/16")])
        );
        let flow = "\u{feff}{members: [10.0.0.1, 10.0.0.2]}\n";
        assert_eq!(parse(flow, ListFormat::Yaml).unwrap().len(), 2);
    }

    #[test]
    fn json_arrays_and_members_objects_parse_with_lines() {
        let arr = "[\n  \"10.0.0.1\",\n  \"10.0.0.2\", \"10.0.0.3\",\n\n  \"\\u0031.2.3.4\"\n]";
        assert_eq!(
            parse(arr, ListFormat::Json).unwrap(),
            lines(&[
                (2, "10.0.0.1"),
                (3, "10.0.0.2"),
                (3, "10.0.0.3"),
                (5, "1.2.3.4")
            ])
        );
        let obj = "\u{feff}{\"type\": \"hash:ip\", \"nested\": {\"members\": 1},\n \"members\": [\"10.0.0.1\"]}";
        assert_eq!(
            parse(obj, ListFormat::Json).unwrap(),
            lines(&[(2, "10.0.0.1")])
        );
    }

    #[test]
    fn structured_errors_name_the_file_and_line() {
        let cases = [
            ("- 10.0.0.1\n- {a: b}\n", ListFormat::Yaml, "line 2"),
            ("- 10.0.0.1\n- [x]\n", ListFormat::Yaml, "line 2"),
            ("type: hash:ip\n", ListFormat::Yaml, "members"),
            ("members: {a: b}\n", ListFormat::Yaml, "sequence"),
            ("10.0.0.1\n", ListFormat::Yaml, "sequence of member strings"),
            ("members: [a]\nmembers: [b]\n", ListFormat::Yaml, "members"),
            (
                "[\"10.0.0.1\",\n 42]",
                ListFormat::Json,
                "line 2: members must be strings, found 42",
            ),
            ("[\"10.0.0.1\",\n\n {\"a\": 1}]", ListFormat::Json, "line 3"),
            ("[\"10.0.0.1\",\n", ListFormat::Json, "line 2"),
            ("{\"type\": \"hash:ip\"}", ListFormat::Json, "members"),
            (
                "\"10.0.0.1\"",
                ListFormat::Json,
                "sequence of member strings",
            ),
        ];
        for (text, format, needle) in cases {
            let e = parse(text, format).unwrap_err().to_string();
            assert!(e.starts_with("l.txt: "), "{text:?}: {e}");
            assert!(e.contains(needle), "{text:?}: {e} lacks {needle:?}");
        }
    }

    #[test]
    fn formats_follow_the_extension_unless_told() {
        assert_eq!(ListFormat::of_path(Path::new("a.yaml")), ListFormat::Yaml);
        assert_eq!(ListFormat::of_path(Path::new("a.yml")), ListFormat::Yaml);
        assert_eq!(ListFormat::of_path(Path::new("a.json")), ListFormat::Json);
        assert_eq!(
            ListFormat::of_path(Path::new("firehol_level1.netset")),
            ListFormat::Text
        );
        assert_eq!(ListFormat::of_path(Path::new("drop")), ListFormat::Text);
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("list.txt");
        std::fs::write(&f, "[\"10.0.0.1\"]").unwrap();
        let as_text = read_member_list(&f, None).unwrap();
        assert_eq!(as_text.members[0].text, "[\"10.0.0.1\"]");
        let as_json = read_member_list(&f, Some(ListFormat::Json)).unwrap();
        assert_eq!(as_json.members[0].text, "10.0.0.1");
        assert_eq!(as_json.source, f);
    }

    #[test]
    fn bad_utf8_names_its_line() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("l.netset");
        std::fs::write(&f, b"10.0.0.1\n10.0.0.2\n10.0.\xff.3\n").unwrap();
        let e = read_member_list(&f, None).unwrap_err();
        assert!(matches!(e, MemberListError::NotUtf8 { line: 3, .. }), "{e}");
        assert!(
            e.to_string().ends_with("l.netset: line 3: not valid UTF-8"),
            "{e}"
        );
    }

    #[test]
    fn missing_files_fifos_and_devices_are_errors_never_opened_blocking() {
        let d = tempfile::tempdir().unwrap();
        let e = read_member_list(&d.path().join("nope.txt"), None).unwrap_err();
        assert!(
            matches!(e, MemberListError::Read(LoadError::Io { .. })),
            "{e}"
        );
        assert!(e.to_string().contains("nope.txt"), "{e}");
        let fifo = d.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read_member_list(&fifo, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("not a regular file (a FIFO); use - to read"),
            "{e}"
        );
        let e = read_member_list(Path::new("/dev/zero"), None).unwrap_err();
        assert!(matches!(e, MemberListError::NotRegular { .. }), "{e}");
    }

    #[test]
    fn reads_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("big.netset");
        // A sparse file one byte over the bound: nothing is written to disk.
        let file = std::fs::File::create(&f).unwrap();
        file.set_len(super::super::load::MAX_FILE_BYTES + 1)
            .unwrap();
        let e = read_member_list(&f, None).unwrap_err();
        assert!(
            matches!(e, MemberListError::Read(LoadError::TooLarge { .. })),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("big.netset: larger than 268435456 bytes"),
            "{e}"
        );
        // Refused by its size, before any of it is read: this thread read
        // next to nothing (a read up to the bound was 256 MiB).
        let rchar = || -> u64 {
            std::fs::read_to_string("/proc/thread-self/io")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("rchar: "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap()
        };
        let file = std::fs::File::create(&f).unwrap();
        file.set_len(300 << 20).unwrap();
        let before = rchar();
        assert!(read_member_list(&f, None).is_err());
        let read = rchar() - before;
        assert!(
            read < 1 << 20,
            "read {read} bytes of a file refused by its size"
        );
    }
}
