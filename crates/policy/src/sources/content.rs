//! The content of a `url` or `file` source, read with the one member-list
//! reader (`policy/member_list.rs`: text one per line with comments, or
//! JSON) and checked member by member as `ipsetmgr slice` checks lists
//! (`commands/slice/validate.rs`): any malformed line refuses the whole
//! content, naming the lines, so that a half-broken download never replaces
//! a good one. Members of the other family are left out (an IPv4 policy
//! takes the IPv4 half of a mixed feed).

use std::path::PathBuf;

use crate::member_list::{ListFormat, MemberList, MemberListError, parse_member_list};
use crate::slicing::validate::validate_typed;
use ipsetmgr_api::FamilySpec;
use ipsetmgr_api::member_source::FeedFormat;
use ipsetmgr_ipset::{Family, Member, SetType};

/// Good content: canonical members, sorted and distinct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    pub members: Vec<String>,
    /// Members of the other family, left out.
    pub other_family: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error(transparent)]
    List(#[from] MemberListError),
    /// The malformed lines, with their numbers.
    #[error("{0}")]
    Malformed(crate::slicing::validate::Invalid),
    #[error("{origin}: {found} members, more than maxMembers ({max})")]
    TooMany {
        origin: String,
        found: usize,
        max: usize,
    },
    /// Members, but none of the policy's family: refused as an empty list
    /// is (a feed that turned IPv6-only must not empty an IPv4 blocklist).
    #[error(
        "{origin}: no {family:?} members ({other} of the other family were left out); refused like an empty list"
    )]
    NoneOfFamily {
        origin: String,
        family: FamilySpec,
        other: usize,
    },
}

impl ContentError {
    /// The error without anything of the content: line numbers and
    /// reasons. What a url source's status may say (the feed is someone
    /// else's file, and the status is readable by others).
    pub fn public(&self) -> String {
        match self {
            ContentError::List(e) => e.public(),
            ContentError::Malformed(invalid) => invalid.public(),
            ContentError::TooMany { .. } | ContentError::NoneOfFamily { .. } => self.to_string(),
        }
    }
}

/// Parse `text` (from `origin`, for messages) as members of a policy of
/// `set_type` and `family`, at most `max_members` of them.
pub fn parse_content(
    text: &str,
    format: FeedFormat,
    origin: &str,
    set_type: SetType,
    family: FamilySpec,
    max_members: usize,
) -> Result<Content, ContentError> {
    let source = PathBuf::from(origin);
    let format = match format {
        FeedFormat::Text => ListFormat::Text,
        FeedFormat::Json => ListFormat::Json,
    };
    let members = parse_member_list(text, format, &source)?;
    check_list(
        MemberList { source, members },
        set_type,
        family,
        max_members,
    )
}

/// Check a member list already read (a `file` source, through
/// `read_member_list`), as [`parse_content`] checks fetched text.
pub fn check_list(
    list: MemberList,
    set_type: SetType,
    family: FamilySpec,
    max_members: usize,
) -> Result<Content, ContentError> {
    if list.members.len() > max_members {
        return Err(ContentError::TooMany {
            origin: list.source.display().to_string(),
            found: list.members.len(),
            max: max_members,
        });
    }
    // Both families are accepted here; the policy's is picked below, on
    // the typed members, and only the kept ones are rendered.
    let typed =
        validate_typed(&list, set_type, FamilySpec::Dual).map_err(ContentError::Malformed)?;
    let origin = list.source.display().to_string();
    // The listed text is no longer needed: free it before rendering.
    drop(list);
    let before = typed.len();
    let members: Vec<String> = typed
        .iter()
        .filter(|m| keeps(family, m))
        .map(Member::spec_string)
        .collect();
    let other_family = before - members.len();
    if members.is_empty() {
        return Err(ContentError::NoneOfFamily {
            origin,
            family,
            other: other_family,
        });
    }
    Ok(Content {
        other_family,
        members,
    })
}

/// A digest of a member list, to tell whether it changed.
pub fn digest<'a>(members: impl IntoIterator<Item = &'a str>) -> [u8; 8] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for m in members {
        h.update(m.as_bytes());
        h.update(b"\n");
    }
    h.finalize()[..8].try_into().expect("8 bytes")
}

fn keeps(family: FamilySpec, member: &Member) -> bool {
    !matches!(
        (member.family(), family),
        (Some(Family::V6), FamilySpec::IPv4) | (Some(Family::V4), FamilySpec::IPv6)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` as the content of an IPv4 `set_type` feed named `origin`.
    fn v4(
        text: &str,
        format: FeedFormat,
        origin: &str,
        set_type: SetType,
        max: usize,
    ) -> Result<Content, ContentError> {
        parse_content(text, format, origin, set_type, FamilySpec::IPv4, max)
    }

    /// Why `text`, a text feed of hash:ip, was refused.
    fn refused(text: &str, origin: &str, max: usize) -> String {
        v4(text, FeedFormat::Text, origin, SetType::HashIp, max)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn text_feeds_become_canonical_members_of_the_policy_family() {
        let text =
            "# FireHOL level1\n10.0.0.0/8\n192.168.1.7/24 # host bits\n2001:db8::/32\n10.0.0.0/8\n";
        let c = v4(text, FeedFormat::Text, "https://x/l1", SetType::HashNet, 10).unwrap();
        assert_eq!(c.members, ["10.0.0.0/8", "192.168.1.0/24"]);
        assert_eq!(c.other_family, 1);
        let c = parse_content(
            text,
            FeedFormat::Text,
            "https://x/l1",
            SetType::HashNet,
            FamilySpec::Dual,
            10,
        )
        .unwrap();
        assert_eq!(c.members.len(), 3);
    }

    #[test]
    fn content_with_none_of_the_policys_family_is_refused_like_an_empty_list() {
        let e = refused("2001:db8::1\n2001:db8::2\n", "https://x/f", 10);
        assert!(
            e.contains("no IPv4 members (2 of the other family were left out)"),
            "{e}"
        );
    }

    #[test]
    fn malformed_lines_are_named_by_number_and_refuse_the_content() {
        let e = refused(
            "10.0.0.1\nexample.com\n10.0.0.2\n10.0.0.300\n",
            "https://x/f",
            10,
        );
        assert!(e.contains("https://x/f: line 2: \"example.com\""), "{e}");
        assert!(e.contains("line 4: not a valid IP address"), "{e}");
        assert!(
            !e.contains("10.0.0.300"),
            "only the first bad line is quoted: {e}"
        );
        let e = refused("", "https://x/f", 10);
        assert!(e.contains("contains no members"), "{e}");
        let e = refused("1.1.1.1\n1.1.1.2\n1.1.1.3\n", "u", 2);
        assert_eq!(e, "u: 3 members, more than maxMembers (2)");
        let c = v4(
            r#"["10.0.0.2","10.0.0.1"]"#,
            FeedFormat::Json,
            "u",
            SetType::HashIp,
            2,
        )
        .unwrap();
        assert_eq!(c.members, ["10.0.0.1", "10.0.0.2"]);
    }
}
