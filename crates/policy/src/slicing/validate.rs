//! Checking a member list before it is sliced. With a set type, every
//! member is parsed as the policy compiler will parse it, and written back
//! in its canonical form; without one, members get only the CRD's
//! per-member schema (what the API server itself would refuse). Either way
//! a single bad member refuses the whole list: slices are applied with
//! `kubectl`, after which the compiler would reject the policy anyway.

use std::fmt;
use std::path::PathBuf;

use crate::FamilySpec;
use crate::member_list::{ListedMember, MemberList};
use ipsetmgr_ipset::{Family, Member, SetType};

/// At most this many bad members are listed; the rest are counted.
const MAX_LISTED_ERRORS: usize = 10;
// Input quoted in messages is cut to this many bytes.
/// The CRD's `maxLength` of one member.
use ipsetmgr_api::policy::MAX_MEMBER_LEN;
use ipsetmgr_ipset::text::MAX_QUOTED_MEMBER as MAX_QUOTED;

/// How members are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Parsed as members of this type and family, written canonically.
    Typed {
        set_type: SetType,
        family: FamilySpec,
    },
    /// Only the CRD's pattern and length; written as given.
    Schema,
}

/// The members to slice: distinct, sorted (by address for typed members,
/// as strings otherwise), as they will be written.
#[derive(Debug)]
pub struct Validated {
    pub members: Vec<String>,
    /// Members dropped because an equal one came first.
    pub duplicates: usize,
}

/// One bad member.
#[derive(Debug)]
pub struct BadMember {
    pub line: usize,
    pub member: String,
    pub reason: String,
    /// The reason without anything of the member's text, for where the
    /// list is someone else's content and the message is shown to others
    /// (a url source's status).
    pub public_reason: String,
}

/// The bad members of one list: the first few, and how many in all.
#[derive(Debug)]
pub struct Invalid {
    pub source: PathBuf,
    pub first: Vec<BadMember>,
    pub total: usize,
}

/// The first bad member quoted (cut to [`MAX_QUOTED`] bytes), the others
/// by line and reason only: a file that is not a member list at all (one
/// with password hashes, say) must not end up in a log line by line.
impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.source.display();
        for (i, bad) in self.first.iter().enumerate() {
            if i == 0 {
                let quoted = crate::text::bounded(&bad.member, MAX_QUOTED);
                write!(f, "{path}: line {}: {quoted:?}: {}", bad.line, bad.reason)?;
            } else {
                write!(f, "\n{path}: line {}: {}", bad.line, bad.public_reason)?;
            }
        }
        if self.total > self.first.len() {
            write!(f, "\n... and {} more", self.total - self.first.len())?;
        }
        Ok(())
    }
}

impl Invalid {
    fn new(source: PathBuf) -> Invalid {
        Invalid {
            source,
            first: Vec::new(),
            total: 0,
        }
    }

    fn push(&mut self, member: &ListedMember, reason: String) {
        let public_reason = reason.clone();
        self.push_redacted(member, reason, public_reason);
    }

    fn push_redacted(&mut self, member: &ListedMember, reason: String, public_reason: String) {
        self.total += 1;
        if self.first.len() < MAX_LISTED_ERRORS {
            self.first.push(BadMember {
                line: member.line,
                member: member.text.clone(),
                reason,
                public_reason,
            });
        }
    }

    /// Line numbers and reasons, nothing of the content: what may go into
    /// an API object's status when the list is someone else's.
    pub fn public(&self) -> String {
        let mut out = format!("{}:", self.source.display());
        for (i, bad) in self.first.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            out += &format!("{sep}line {}: {}", bad.line, bad.public_reason);
        }
        if self.total > self.first.len() {
            out += &format!("; and {} more", self.total - self.first.len());
        }
        out
    }
}

/// A member's error without the member's own text (the one message that
/// quotes it names an unknown protocol).
fn public_reason(e: &ipsetmgr_ipset::MemberError) -> String {
    match e {
        ipsetmgr_ipset::MemberError::UnsupportedProtocol(_) => {
            "unsupported protocol (use tcp, udp, sctp, udplite, icmp or icmpv6)".into()
        }
        other => other.to_string(),
    }
}

/// Check every member of `list`; any bad one refuses them all.
pub fn validate(list: &MemberList, check: Check) -> Result<Validated, Invalid> {
    let mut bad = Invalid::new(list.source.clone());
    let validated = match check {
        Check::Typed { set_type, family } => {
            let (members, duplicates) = typed(&list.members, set_type, family, &mut bad);
            Validated {
                members: members.iter().map(Member::spec_string).collect(),
                duplicates,
            }
        }
        Check::Schema => schema_only(&list.members, &mut bad),
    };
    if bad.total > 0 {
        return Err(bad);
    }
    Ok(validated)
}

/// [`validate`] with a set type, the members left typed: for a caller that
/// picks among them before rendering (a member source keeps its policy's
/// family), so that no member is parsed twice or rendered for nothing.
pub fn validate_typed(
    list: &MemberList,
    set_type: SetType,
    family: FamilySpec,
) -> Result<Vec<Member>, Invalid> {
    let mut bad = Invalid::new(list.source.clone());
    let (members, _) = typed(&list.members, set_type, family, &mut bad);
    if bad.total > 0 {
        return Err(bad);
    }
    Ok(members)
}

/// Parse each member; sort and deduplicate the typed values (so that
/// `10.0.0.1/32` and `10.0.0.1` are one). Returns them, sorted, and how
/// many duplicates were dropped.
fn typed(
    members: &[ListedMember],
    set_type: SetType,
    family: FamilySpec,
    bad: &mut Invalid,
) -> (Vec<Member>, usize) {
    // Each typed member with the index of the listed one it came from.
    let mut parsed: Vec<(Member, usize)> = Vec::with_capacity(members.len());
    for (i, listed) in members.iter().enumerate() {
        match Member::parse_user(set_type, &listed.text) {
            Err(e) => bad.push_redacted(listed, e.to_string(), public_reason(&e)),
            Ok(p) => match wrong_family(p.family, family) {
                Some(reason) => bad.push(listed, reason),
                None => parsed.extend(p.members.into_iter().map(|m| (m, i))),
            },
        }
    }
    // By member, then by position: the first spelling of a duplicate stays.
    parsed.sort_unstable();
    let before = parsed.len();
    parsed.dedup_by(|later, earlier| later.0 == earlier.0);
    let duplicates = before - parsed.len();
    nomatch_conflicts(&parsed, members, bad);
    (parsed.into_iter().map(|(m, _)| m).collect(), duplicates)
}

/// Why a member of `found` family does not belong in a `wanted` list.
fn wrong_family(found: Option<Family>, wanted: FamilySpec) -> Option<String> {
    let (found, wanted) = match (found, wanted) {
        (Some(Family::V6), FamilySpec::IPv4) => ("IPv6", "IPv4"),
        (Some(Family::V4), FamilySpec::IPv6) => ("IPv4", "IPv6"),
        _ => return None,
    };
    Some(format!(
        "an {found} member, but --family is {wanted} (use --family Dual for both)"
    ))
}

/// The kernel holds one entry per key, matching or excluded (`nomatch`),
/// with one comment; two spellings of one key in one list would flip it on
/// every write. Only members with a flag or comment can be one side, so
/// only they are looked at: against the plain member of their key, found by
/// binary search (`parsed` is sorted and holds each member once), or else
/// against the first flagged member of that key. (Indexing every member by
/// key was 129 MB of the 218 MB peak of a 1M-line plain list.)
fn nomatch_conflicts(parsed: &[(Member, usize)], members: &[ListedMember], bad: &mut Invalid) {
    let mut first: std::collections::HashMap<Member, (&Member, usize)> = Default::default();
    for (m, i) in parsed {
        let Some(key) = m.key_only() else {
            continue;
        };
        let (held, j) = match parsed.binary_search_by(|(x, _)| x.cmp(&key)) {
            Ok(at) => (&parsed[at].0, parsed[at].1),
            Err(_) => *first.entry(key).or_insert((m, *i)),
        };
        if held == m {
            continue;
        }
        let (earlier, later) = (&members[j], &members[*i]);
        let why = if held.is_nomatch() != m.is_nomatch() {
            format!(
                "both are the network {}, which the kernel holds as one entry, either matching or excluded (nomatch)",
                m.key()
            )
        } else {
            format!(
                "both are the entry {}, which the kernel holds once, with one comment",
                m.key()
            )
        };
        bad.push_redacted(
            later,
            format!(
                "conflicts with {:?} on line {}: {why}; keep only one of them",
                earlier.text, earlier.line
            ),
            format!(
                "conflicts with line {}: both are one kernel entry; keep only one of them",
                earlier.line
            ),
        );
    }
}

/// The CRD's per-member schema only: deduplicated as strings.
fn schema_only(members: &[ListedMember], bad: &mut Invalid) -> Validated {
    for listed in members {
        if let Some(reason) = schema_problem(&listed.text) {
            bad.push(listed, reason.to_string());
        }
    }
    let mut out: Vec<String> = members.iter().map(|m| m.text.clone()).collect();
    out.sort_unstable();
    let before = out.len();
    out.dedup();
    Validated {
        duplicates: before - out.len(),
        members: out,
    }
}

/// What the CRD's schema says of a member (`MEMBER_PATTERN`): printable
/// ASCII without spaces, an optional " nomatch", an optional " comment:TEXT";
/// at most `MAX_MEMBER_LEN` characters.
fn schema_problem(member: &str) -> Option<&'static str> {
    let (member_part, comment) = match member.split_once(" comment:") {
        Some((m, c)) => (m, Some(c)),
        None => (member, None),
    };
    let body = member_part.strip_suffix(" nomatch").unwrap_or(member_part);
    if body.is_empty() || !body.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
        return Some(
            "not printable ASCII without spaces (only \" nomatch\" and \" comment:TEXT\" may follow a space), which the CRD refuses",
        );
    }
    if let Some(c) = comment {
        let ok_byte = |b: u8| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\';
        if c.is_empty() || c.starts_with(' ') || c.ends_with(' ') || !c.bytes().all(ok_byte) {
            return Some(
                "a comment of printable ASCII without \" or \\, not starting or ending with a space, is what the CRD accepts",
            );
        }
    }
    if member.len() > MAX_MEMBER_LEN {
        return Some("longer than 400 characters, which the CRD refuses");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(members: &[&str]) -> MemberList {
        MemberList {
            source: PathBuf::from("l.txt"),
            members: members
                .iter()
                .enumerate()
                .map(|(i, m)| ListedMember {
                    line: i + 1,
                    text: m.to_string(),
                })
                .collect(),
        }
    }

    fn typed_check(set_type: SetType, family: FamilySpec) -> Check {
        Check::Typed { set_type, family }
    }

    #[test]
    fn typed_members_are_canonical_sorted_and_distinct() {
        let l = list(&["10.0.0.10", "10.0.0.2/32", "10.0.0.2", "10.0.0.1"]);
        let v = validate(&l, typed_check(SetType::HashIp, FamilySpec::IPv4)).unwrap();
        assert_eq!(v.members, ["10.0.0.1", "10.0.0.2", "10.0.0.10"]);
        assert_eq!(v.duplicates, 1);
        let l = list(&["0.0.0.0/0", "10.1.2.3/8", "2001:DB8::1/32 nomatch"]);
        let v = validate(&l, typed_check(SetType::HashNet, FamilySpec::Dual)).unwrap();
        assert_eq!(
            v.members,
            [
                "0.0.0.0/1",
                "10.0.0.0/8",
                "128.0.0.0/1",
                "2001:db8::/32 nomatch"
            ]
        );
        let l = list(&["aa-bb-cc-dd-ee-ff", "AA:BB:CC:DD:EE:FF"]);
        let v = validate(&l, typed_check(SetType::HashMac, FamilySpec::IPv6)).unwrap();
        assert_eq!(
            (v.members.as_slice(), v.duplicates),
            (&["AA:BB:CC:DD:EE:FF".to_string()][..], 1)
        );
    }

    #[test]
    fn bad_members_and_wrong_families_name_the_file_line_and_reason() {
        let l = list(&["10.0.0.1", "example.com", "2001:db8::1", "10.0.0.0/24"]);
        let e = validate(&l, typed_check(SetType::HashIp, FamilySpec::IPv4)).unwrap_err();
        assert_eq!(e.total, 3);
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("l.txt: line 2: \"example.com\": looks like a host name"),
            "{text}"
        );
        // Only the first bad member is quoted: a file that is no member
        // list at all does not end up in a log line by line.
        assert!(
            lines[1].starts_with("l.txt: line 3: an IPv6 member, but --family is IPv4"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("l.txt: line 4: a CIDR wider"),
            "{text}"
        );
        // The public form quotes none.
        let public = e.public();
        assert!(
            public.starts_with("l.txt: line 2: looks like a host name"),
            "{public}"
        );
        assert!(public.contains("; line 3: an IPv6 member"), "{public}");
        for content in ["example.com", "2001:db8::1", "10.0.0.0/24"] {
            assert!(!public.contains(content), "{public}");
        }
        let l = list(&[
            "10.0.0.1,tcp:80",
            "10.0.0.1,icmp:echo-request",
            "10.0.0.1,80-90",
        ]);
        let e = validate(&l, typed_check(SetType::HashIpPort, FamilySpec::IPv6)).unwrap_err();
        assert_eq!(e.total, 3, "{e}");
    }

    #[test]
    fn at_most_ten_errors_are_listed_then_counted() {
        let members: Vec<String> = (0..25).map(|i| format!("bad{i}")).collect();
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        let e = validate(&list(&refs), typed_check(SetType::HashIp, FamilySpec::IPv4)).unwrap_err();
        let text = e.to_string();
        assert_eq!(text.lines().count(), 11, "{text}");
        assert!(text.ends_with("\n... and 15 more"), "{text}");
        assert!(text.contains("line 1: \"bad0\""), "{text}");
        assert!(text.contains("line 10: not a valid"), "{text}");
        assert!(!text.contains("bad9"), "{text}");
        // Long members are quoted cut.
        let long = "x".repeat(5000);
        let e = validate(&list(&[&long]), Check::Schema).unwrap_err();
        assert!(e.to_string().len() < 400, "{}", e.to_string().len());
    }

    #[test]
    fn a_network_with_and_without_nomatch_is_refused_naming_both_lines() {
        let l = list(&["10.0.0.0/8", "192.168.0.0/16", "10.1.0.0/8 nomatch"]);
        let e = validate(&l, typed_check(SetType::HashNet, FamilySpec::IPv4)).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("l.txt: line 3: \"10.1.0.0/8 nomatch\": conflicts with \"10.0.0.0/8\" on line 1: both are the network 10.0.0.0/8"), "{text}");
        // Different networks, one excluded from the other, are fine.
        let l = list(&["10.0.0.0/8", "10.1.0.0/16 nomatch"]);
        assert!(validate(&l, typed_check(SetType::HashNet, FamilySpec::IPv4)).is_ok());
        // Without the plain member, two flagged spellings of one key still
        // conflict, and a second comment on one entry too.
        let l = list(&[
            "10.2.0.0/16 nomatch comment:x",
            "10.3.0.0/16",
            "10.2.0.0/16 comment:y",
            "10.3.0.0/16 comment:z",
        ]);
        let e = validate(&l, typed_check(SetType::HashNet, FamilySpec::IPv4)).unwrap_err();
        assert_eq!(e.total, 2, "{e}");
        let text = e.to_string();
        assert!(text.contains("line 1: \"10.2.0.0/16 nomatch comment:x\": conflicts with \"10.2.0.0/16 comment:y\" on line 3: both are the network 10.2.0.0/16"), "{text}");
        assert!(
            text.contains("line 4: conflicts with line 2: both are one kernel entry"),
            "{text}"
        );
        assert!(!text.contains("comment:z"), "{text}");
    }

    #[test]
    fn without_a_type_only_the_crd_schema_applies() {
        let l = list(&[
            "b.example",
            "a.example",
            "10.0.0.0/8 nomatch",
            "b.example",
            "nomatch",
        ]);
        let v = validate(&l, Check::Schema).unwrap();
        assert_eq!(
            v.members,
            ["10.0.0.0/8 nomatch", "a.example", "b.example", "nomatch"]
        );
        assert_eq!(v.duplicates, 1);
        let long = "x".repeat(401);
        let ok = "x".repeat(400);
        for (member, ok_expected) in [
            ("1.2.3.4 5.6.7.8", false),
            (" nomatch", false),
            ("10.0.0.1  nomatch", false),
            ("caf\u{e9}", false),
            ("a\u{7f}", false),
            (long.as_str(), false),
            (ok.as_str(), true),
            ("~!", true),
            ("10.0.0.1 nomatch comment:a b, c", true),
            ("10.0.0.1 comment: a", false),
            ("10.0.0.1 comment:say \"hi\"", false),
            ("10.0.0.1 comment:", false),
        ] {
            let got = validate(&list(&[member]), Check::Schema);
            assert_eq!(got.is_ok(), ok_expected, "{member:?}: {got:?}");
        }
    }
}
