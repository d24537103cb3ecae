//! What the compiler is given: policies, their member slices and member
//! lists, as callers hold them. A module of its own because the compiler
//! and its parts (`parse`, `checks`) both read these types.

use ipsetmgr_api::policy::IPSetPolicy;

use super::errors::{PolicyError, PolicyErrorKind};

/// Members as a caller holds them: strings, or one text of lines (how the
/// agent keeps slices compactly once it has parsed them).
#[derive(Clone, Copy, Debug)]
pub enum MemberList<'a> {
    Strings(&'a [String]),
    Lines(&'a str),
}

impl<'a> MemberList<'a> {
    pub(crate) fn strs(self) -> Vec<&'a str> {
        let mut v = Vec::new();
        self.for_each(|m| v.push(m));
        v
    }

    /// Call `f` with each member, in order.
    pub(crate) fn for_each(self, f: impl FnMut(&'a str)) {
        match self {
            MemberList::Strings(v) => v.iter().map(String::as_str).for_each(f),
            MemberList::Lines(text) => crate::lines::each_line(text, f),
        }
    }

    /// How many members, or for a text of lines, one more than its line
    /// breaks (a capacity: a last line break or a blank line is counted).
    pub(crate) fn count_hint(self) -> usize {
        match self {
            MemberList::Strings(v) => v.len(),
            // Counted in runs of at most 255 bytes as u8s: a loop the
            // compiler makes vector code of (megabytes a millisecond).
            MemberList::Lines(text) => {
                let breaks: usize = text
                    .as_bytes()
                    .chunks(255)
                    .map(|run| usize::from(run.iter().fold(0u8, |n, b| n + u8::from(*b == b'\n'))))
                    .sum();
                breaks + 1
            }
        }
    }

    /// About how many members, without reading a text of lines: a member
    /// and its line break are rarely shorter than 8 bytes.
    pub(crate) fn len_estimate(self) -> usize {
        match self {
            MemberList::Strings(v) => v.len(),
            MemberList::Lines(text) => text.len() / 8,
        }
    }

    /// At most `n` lists of about equal size that hold these members, in
    /// order. A text of lines is cut after a line break, so each part's
    /// lines are the whole text's (`lines()` takes `\r\n` as one break).
    pub(crate) fn split(self, n: usize) -> Vec<MemberList<'a>> {
        let n = n.max(1);
        match self {
            MemberList::Strings(v) => v
                .chunks(v.len().div_ceil(n).max(1))
                .map(MemberList::Strings)
                .collect(),
            MemberList::Lines(mut text) => {
                let mut parts = Vec::with_capacity(n);
                for left in (1..=n).rev() {
                    let want = text.len().div_ceil(left);
                    let cut = match text.as_bytes()[want.min(text.len())..]
                        .iter()
                        .position(|b| *b == b'\n')
                    {
                        Some(i) if left > 1 => want + i + 1,
                        _ => text.len(),
                    };
                    let (part, rest) = text.split_at(cut);
                    if !part.is_empty() {
                        parts.push(MemberList::Lines(part));
                    }
                    text = rest;
                }
                parts
            }
        }
    }
}

/// Members a caller owns, compactly: one text of lines (a million members
/// in one allocation rather than one each), or strings (members with line
/// breaks in them, kept exactly so that errors name them as written, and
/// short lists as a parser gave them). The agent's and the controller's
/// slices and a file's members alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedMembers {
    /// One member per line.
    Lines(String),
    Strings(Vec<String>),
}

impl OwnedMembers {
    /// As lines, unless a member has a line break in it.
    pub fn of(members: Vec<String>) -> OwnedMembers {
        if members.iter().any(|m| m.contains(['\n', '\r'])) {
            return OwnedMembers::Strings(members);
        }
        OwnedMembers::Lines(members.join("\n"))
    }

    pub fn list(&self) -> MemberList<'_> {
        match self {
            OwnedMembers::Lines(text) => MemberList::Lines(text),
            OwnedMembers::Strings(v) => MemberList::Strings(v),
        }
    }
}

/// One member slice of a policy.
#[derive(Clone, Copy, Debug)]
pub struct SliceInput<'a> {
    pub name: &'a str,
    /// The slice's resourceVersion ("" for slices from files: not cached).
    pub version: &'a str,
    /// `Err` for a slice that gives no members: its policy is held.
    pub members: Result<MemberList<'a>, NoMembers<'a>>,
}

/// Why a slice gives no members; either way its policy is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoMembers<'a> {
    /// It could not be read at all: why.
    Unreadable(&'a str),
    /// A `membersFrom` source this setting refuses (a Kubernetes source in a
    /// policy file): the file it is written in, and why. Not "could not be
    /// read": nothing was read, and the user has to change the spec.
    Refused { file: &'a str, reason: &'a str },
}

impl SliceInput<'_> {
    /// The error of a slice that gives no members, for policy `policy`.
    pub(super) fn no_members_error(&self, policy: &str, why: NoMembers<'_>) -> PolicyError {
        let (slice, kind) = match why {
            NoMembers::Unreadable(why) => (
                Some(self.name.to_string()),
                PolicyErrorKind::UnreadableSlice(why.to_string()),
            ),
            // The source's name (`membersFrom[i] (kind)`) is in the message.
            NoMembers::Refused { file, reason } => (
                None,
                PolicyErrorKind::RefusedSource {
                    name: self.name.to_string(),
                    file: file.to_string(),
                    reason: reason.to_string(),
                },
            ),
        };
        PolicyError {
            policy: policy.to_string(),
            slice,
            member: None,
            kind,
        }
    }
}

/// One policy and the member slices labelled for it.
#[derive(Clone, Debug)]
pub struct PolicyInput<'a> {
    pub policy: &'a IPSetPolicy,
    /// The policy's own members when the caller keeps them apart from its
    /// `spec.members` (a file's big block, as lines); `None`: those.
    pub members: Option<MemberList<'a>>,
    pub slices: Vec<SliceInput<'a>>,
    /// What holds the policy before its members are looked at (a refused
    /// or not yet delivered source): it yields no sets, with these errors.
    pub held_by: Vec<PolicyError>,
    /// The largest size a set without `maxElem` grows to (this cluster's
    /// `--max-set-elements`; the CRD's maximum by default).
    pub size_cap: u32,
    /// Except ranges the caller adds to the policy's `spec.except` (the
    /// hook for the cluster's own networks): parsed and applied the same
    /// way, and part of the cached result's key.
    pub extra_except: &'a [String],
}

impl<'a> PolicyInput<'a> {
    /// The policy's own members, wherever the caller keeps them.
    pub(super) fn own_members(&self) -> MemberList<'a> {
        self.members
            .unwrap_or(MemberList::Strings(&self.policy.spec.members))
    }

    pub fn new(policy: &'a IPSetPolicy, slices: Vec<SliceInput<'a>>) -> PolicyInput<'a> {
        PolicyInput {
            policy,
            members: None,
            slices,
            held_by: Vec::new(),
            size_cap: super::limits::MAX_MAX_ELEM,
            extra_except: &[],
        }
    }
}
