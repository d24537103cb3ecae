//! The members revision: one short hash that says which members of a
//! policy a node must hold. Pure, so that the agent (which reports it) and
//! the controller (which compares it) compute it from the same code.

use crate::compile::SliceInput;

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
    use crate::compile::NoMembers;

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
