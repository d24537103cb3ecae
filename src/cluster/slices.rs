//! Member slices as the agent and the controller keep them: compactly,
//! one text of lines per slice, from which they can be parsed again when
//! their policy's type changes (a `Vec<String>` of a million members would
//! take about three times the memory).

use std::collections::BTreeMap;

use crate::api::{IPSetMemberSlice, POLICY_LABEL};
use crate::cluster::tolerant::Tolerant;
use crate::policy::compile::{MemberList, NoMembers, SliceInput};

/// The label that marks a slice as one of a policy's `membersFrom`
/// sources (its index), written by the controller.
pub const SOURCE_LABEL: &str = "ipsetmgr.io/source";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The managed-by value of the controller's slices.
pub const MANAGED_BY: &str = "ipsetmgr-controller";

/// The source a slice belongs to, when the controller made it (both labels
/// say so); any other slice is a user's and the controller never touches it.
pub fn managed_source(labels: &BTreeMap<String, String>) -> Option<usize> {
    if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
        return None;
    }
    labels.get(SOURCE_LABEL)?.parse().ok()
}

/// One slice as the agent keeps it.
#[derive(Clone, Debug)]
pub struct SliceEntry {
    /// The policy it is labelled for.
    pub policy: Option<String>,
    /// The `membersFrom` source it materialises, for the controller's own.
    pub source: Option<usize>,
    pub version: String,
    pub members: Result<SliceMembers, String>,
}

/// A slice's members, compactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceMembers {
    /// One member per line.
    Lines(String),
    /// Members with line breaks in them (invalid, but kept exactly so the
    /// error names them as written).
    Strings(Vec<String>),
}

impl SliceMembers {
    pub fn of(members: Vec<String>) -> SliceMembers {
        if members.iter().any(|m| m.contains(['\n', '\r'])) {
            return SliceMembers::Strings(members);
        }
        SliceMembers::Lines(members.join("\n"))
    }

    pub fn list(&self) -> MemberList<'_> {
        match self {
            SliceMembers::Lines(text) => MemberList::Lines(text),
            SliceMembers::Strings(v) => MemberList::Strings(v),
        }
    }
}

impl SliceEntry {
    /// The members for the compiler, or why the slice could not be read.
    pub fn member_list(&self) -> Result<MemberList<'_>, NoMembers<'_>> {
        match &self.members {
            Ok(m) => Ok(m.list()),
            Err(why) => Err(NoMembers::Unreadable(why)),
        }
    }
}

pub fn slice_entry(t: Tolerant<IPSetMemberSlice>) -> (String, SliceEntry) {
    let policy = t.labels.get(POLICY_LABEL).cloned();
    let entry = SliceEntry {
        policy,
        source: managed_source(&t.labels),
        version: t.resource_version,
        members: t.value.map(|s| SliceMembers::of(s.spec.members)),
    };
    (t.name, entry)
}

/// A slice changed only when its resourceVersion did.
pub fn same_slice(a: &SliceEntry, b: &SliceEntry) -> bool {
    a.version == b.version && !a.version.is_empty()
}

/// The slices of each policy, as compile inputs (slices without a policy
/// label are not anyone's).
pub fn by_policy(slices: &BTreeMap<String, SliceEntry>) -> BTreeMap<&str, Vec<SliceInput<'_>>> {
    let mut out: BTreeMap<&str, Vec<SliceInput<'_>>> = BTreeMap::new();
    for (name, s) in slices {
        if let Some(policy) = s.policy.as_deref() {
            out.entry(policy).or_default().push(SliceInput {
                name,
                version: &s.version,
                members: s.member_list(),
            });
        }
    }
    out
}

/// What a node must have applied for a policy to count as synced: its uid
/// and generation (a spec change, or a policy deleted and created again)
/// and the versions of its slices (a slice change does not bump the
/// policy's generation). The agent and the controller compute it the same
/// way from what they watch, so the controller can tell that a node holds
/// the current members, not just the current spec.
pub fn members_revision(uid: Option<&str>, generation: i64, slices: &[SliceInput<'_>]) -> String {
    use sha2::{Digest, Sha256};
    let mut parts: Vec<(&str, &str)> = slices.iter().map(|s| (s.name, s.version)).collect();
    parts.sort_unstable();
    let mut h = Sha256::new();
    h.update(uid.unwrap_or_default());
    h.update(format!("\n{generation}\n"));
    for (name, version) in parts {
        h.update(format!("{name}={version}\n"));
    }
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s<'a>(name: &'a str, version: &'a str) -> SliceInput<'a> {
        SliceInput {
            name,
            version,
            members: Err(NoMembers::Unreadable("")),
        }
    }

    #[test]
    fn the_revision_follows_uid_generation_and_slice_versions() {
        let base = members_revision(Some("u"), 1, &[s("a", "1"), s("b", "2")]);
        assert_eq!(base.len(), 16);
        assert_eq!(
            base,
            members_revision(Some("u"), 1, &[s("b", "2"), s("a", "1")]),
            "order-free"
        );
        assert_ne!(
            base,
            members_revision(Some("u2"), 1, &[s("a", "1"), s("b", "2")])
        );
        assert_ne!(
            base,
            members_revision(Some("u"), 2, &[s("a", "1"), s("b", "2")])
        );
        assert_ne!(
            base,
            members_revision(Some("u"), 1, &[s("a", "1"), s("b", "3")])
        );
        assert_ne!(base, members_revision(Some("u"), 1, &[s("a", "1")]));
    }
}
