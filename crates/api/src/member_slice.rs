//! `IPSetMemberSlice`: a chunk of members for one policy, bound to it by
//! the label `ipsetmgr.io/policy: <policy name>` (as EndpointSlices are bound
//! to their Service). A policy's members are its `spec.members` plus every
//! slice labelled for it, validated under the same rules; lists too big for
//! one object (etcd refuses requests over about 1.5 MB, client-side
//! `kubectl apply` objects over about 256 KB) are split over many slices,
//! and a small change to the list touches few of them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label binding a slice to its policy. Label values are at most 63
/// characters, so a policy that takes slices has a name of at most 63.
pub const POLICY_LABEL: &str = "ipsetmgr.io/policy";

/// Members of the policy named by the slice's `ipsetmgr.io/policy` label.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipsetmgr.io",
    version = "v1alpha1",
    kind = "IPSetMemberSlice",
    plural = "ipsetmemberslices",
    shortname = "ipsms",
    category = "ipsetmgr",
    doc = "A chunk of members of the IPSetPolicy named by the label ipsetmgr.io/policy, validated under that policy's rules.",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".metadata.labels.ipsetmgr\\.io/policy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IPSetMemberSliceSpec {
    /// Members in the policy's syntax (see IPSetPolicy spec.members).
    #[serde(default)]
    #[schemars(schema_with = "crate::policy::members_schema")]
    pub members: Vec<String>,
}
