//! From each policy's `membersFrom` to the IPSetMemberSlices that carry its
//! members to the agents. Pure: what the store holds in, the slices to
//! apply and delete out.
//!
//! Each source has its own slices, named `<policy>-src<index>-<i>-of-<n>`
//! and cut by a hash of each member (`commands/slice/partition.rs`, the
//! same partitioning `ipsetmgr slice` uses), so one pod's change rewrites
//! one slice, and one source's failure leaves the others' slices alone.
//! Slices are labelled for their policy (`ipsetmgr.io/policy`), marked as
//! the controller's (`app.kubernetes.io/managed-by: ipsetmgr-controller`,
//! `ipsetmgr.io/source: <index>`), and owned by the policy (both are
//! cluster-scoped, as an owner must be), so the garbage collector removes
//! them with it. A slice without the controller's mark is a user's: it is
//! never written nor deleted, and a name clash is reported instead.
//!
//! A source with no members has one empty slice: a source without any
//! slice has not delivered, and the agents hold its policy.
//!
//! Nothing is deleted for a source that is not known to be good now: an
//! invalid policy, a source whose inputs are not listed yet or a url that
//! has not been fetched keep their slices as they are. Only a source that
//! is gone from the spec (or a policy that is gone) loses them.

use std::collections::{BTreeMap, BTreeSet};

use kube::Resource;
use serde_json::Value;

use ipsetmgr_api::{IPSetMemberSlice, IPSetPolicy, POLICY_LABEL};
use ipsetmgr_cluster::slices::{MANAGED_BY, MANAGED_BY_LABEL, SOURCE_LABEL, SliceEntry};
use ipsetmgr_policy::compile::OwnedMembers;
use ipsetmgr_policy::slicing::objects::json_bytes;
use ipsetmgr_policy::slicing::partition::{Limits, TooMany, partition};

/// One slice holds at most this many members and bytes of JSON: far under
/// etcd's 1.5 MB request limit and the 256 KB of a client-side apply; as
/// `ipsetmgr slice`'s default, so a 10-member change of a million-member
/// feed sends each node under 100 kB (docs/scaling.md, "Slice size").
const LIMITS: Limits = Limits {
    max_members: 500,
    max_bytes: 200_000,
};

/// One write the slice writer makes.
#[derive(Clone, Debug, PartialEq)]
pub enum SliceOp {
    /// A server-side apply of this body (the whole slice).
    Apply(Value),
    Delete,
}

/// Slice name → what to do with it.
pub(crate) type SlicePlan = BTreeMap<String, SliceOp>;

/// What a source wants now.
pub(crate) enum Wanted<'a> {
    /// These members (sorted, distinct, canonical).
    Members(&'a [String]),
    /// Unknown now (not listed, not fetched, failing): keep its slices.
    Keep,
}

fn slice_name(policy: &str, index: usize, i: usize, count: usize) -> String {
    let width = (count - 1).to_string().len();
    format!("{policy}-src{index}-{i:0width$}-of-{count}")
}

/// The body of a slice's server-side apply: everything this manager owns.
fn slice_body(
    policy: &IPSetPolicy,
    index: usize,
    name: &str,
    members: &[&str],
) -> IPSetMemberSlice {
    let policy_name = policy.metadata.name.clone().unwrap_or_default();
    let mut slice = IPSetMemberSlice::new(
        name,
        ipsetmgr_api::IPSetMemberSliceSpec {
            members: members.iter().map(|m| m.to_string()).collect(),
        },
    );
    slice.metadata.labels = Some(BTreeMap::from([
        (POLICY_LABEL.to_string(), policy_name),
        (SOURCE_LABEL.to_string(), index.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]));
    // Without a uid (never so for a policy from the API server) there is
    // nothing to own it by; it is then removed only by the controller.
    slice.metadata.owner_references = policy.controller_owner_ref(&()).map(|mut o| {
        // No blockOwnerDeletion: that would need update on the policies'
        // finalizers (OwnerReferencesPermissionEnforcement) for nothing.
        o.block_owner_deletion = None;
        vec![o]
    });
    slice
}

/// Whether the server's slice already says exactly this.
fn same_members(existing: &SliceEntry, members: &[&str]) -> bool {
    match &existing.members {
        Ok(OwnedMembers::Lines(text)) => {
            let mut lines = text.lines();
            members.iter().all(|m| lines.next() == Some(m)) && lines.next().is_none()
        }
        Ok(OwnedMembers::Strings(v)) => v.iter().map(String::as_str).eq(members.iter().copied()),
        Err(_) => false,
    }
}

/// Why a source's slices are not written (the source's status says it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceSliceError {
    /// More members than the slices may carry.
    #[error(transparent)]
    TooMany(#[from] TooMany),
    /// A user's slice already has the name this source's slice needs.
    #[error(
        "the IPSetMemberSlice {slice:?} exists and is not this source's (no {MANAGED_BY_LABEL}={MANAGED_BY} and {SOURCE_LABEL}={index} labels); it is left alone and this source is not written"
    )]
    NotOurs { slice: String, index: usize },
}

/// Add to `plan` what brings source `index` of `policy` in line; returns an
/// error to report for the source (a clash with a user's slice, too many
/// members), in which case nothing of it is deleted.
pub(crate) fn plan_source(
    policy: &IPSetPolicy,
    index: usize,
    wanted: Wanted<'_>,
    slices: &BTreeMap<String, SliceEntry>,
    plan: &mut SlicePlan,
) -> Result<(), SourceSliceError> {
    let name = policy.metadata.name.as_deref().unwrap_or("");
    let Wanted::Members(members) = wanted else {
        return Ok(());
    };
    let ours = |s: &SliceEntry| s.policy.as_deref() == Some(name) && s.source == Some(index);
    let mut desired: BTreeSet<String> = BTreeSet::new();
    // No members is still a slice: an empty one, so the agents can tell a
    // source that delivered nothing (no pods match) from one that has not
    // delivered (they hold the policy until every source has a slice).
    {
        let built = partition(
            members,
            LIMITS,
            |count, i, part| slice_body(policy, index, &slice_name(name, index, i, count), part),
            json_bytes,
        )?;
        let mut writes = Vec::new();
        for slice in built.slices {
            let slice_name = slice.metadata.name.clone().unwrap_or_default();
            let part: Vec<&str> = slice.spec.members.iter().map(String::as_str).collect();
            match slices.get(&slice_name) {
                Some(s) if !ours(s) => {
                    return Err(SourceSliceError::NotOurs {
                        slice: slice_name,
                        index,
                    });
                }
                Some(s) if same_members(s, &part) => {}
                _ => writes.push((slice_name.clone(), slice)),
            }
            desired.insert(slice_name);
        }
        for (slice_name, slice) in writes {
            let body = serde_json::to_value(&slice).expect("a slice serializes");
            plan.insert(slice_name, SliceOp::Apply(body));
        }
    }
    for (slice_name, s) in slices {
        if ours(s) && !desired.contains(slice_name) {
            plan.insert(slice_name.clone(), SliceOp::Delete);
        }
    }
    Ok(())
}

/// The controller's slices whose policy or source is gone. `policies` maps
/// every policy to its number of sources, `None` for one that could not be
/// read (what it wants is unknown: its slices stay).
pub(crate) fn plan_orphans(
    slices: &BTreeMap<String, SliceEntry>,
    policies: &BTreeMap<&str, Option<usize>>,
    plan: &mut SlicePlan,
) {
    for (slice_name, s) in slices {
        let (Some(policy), Some(index)) = (s.policy.as_deref(), s.source) else {
            continue;
        };
        let gone = match policies.get(policy) {
            None => true,
            // Unreadable: what it wants is unknown; keep.
            Some(None) => false,
            Some(Some(count)) => index >= *count,
        };
        if gone {
            plan.insert(slice_name.clone(), SliceOp::Delete);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user's slice under the name this source needs: the source's
    /// status says which slice and which labels, word for word.
    #[test]
    fn a_clash_with_a_users_slice_names_the_slice_and_the_labels() {
        let policy = IPSetPolicy::new(
            "bl",
            serde_json::from_value(serde_json::json!({"type": "hash:ip"})).unwrap(),
        );
        let users = SliceEntry {
            policy: Some("bl".into()),
            source: None,
            version: "3".into(),
            members: Ok(OwnedMembers::Strings(vec!["10.0.0.9".into()])),
        };
        let slices = BTreeMap::from([("bl-src0-0-of-1".to_string(), users)]);
        let members = ["10.0.0.1".to_string()];
        let mut plan = SlicePlan::new();
        let e = plan_source(&policy, 0, Wanted::Members(&members), &slices, &mut plan).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the IPSetMemberSlice \"bl-src0-0-of-1\" exists and is not this source's (no \
             app.kubernetes.io/managed-by=ipsetmgr-controller and ipsetmgr.io/source=0 \
             labels); it is left alone and this source is not written"
        );
        assert!(plan.is_empty(), "{plan:?}");
    }
}
