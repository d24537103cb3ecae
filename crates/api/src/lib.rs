//! The Kubernetes API of ipsetmgr: three cluster-scoped custom resources in
//! `ipsetmgr.io/v1alpha1`, generated from these Rust types (the YAML in
//! `crds/` is what `ipsetmgr crd` prints, and a test fails when they differ).
//!
//! Types, their schemas and constructors only: this crate must never talk
//! to a cluster (no kube client, no async runtime; `tests/crate_graph.rs`
//! checks it) nor decide what a policy means (that is `ipsetmgr-policy`).
//! How the crates fit: `docs/architecture.md`.
//!
//! - [`IPSetPolicy`]: what users declare (written by users; its status by
//!   the controller).
//! - [`IPSetMemberSlice`]: more members for one policy.
//! - [`IPSetNodeState`]: what one node holds (written by that node's agent).

#![forbid(unsafe_code)]

pub mod de;
pub mod member_slice;
pub mod member_source;
pub mod node_state;
pub mod policy;

use kube::CustomResourceExt;

pub use member_slice::{IPSetMemberSlice, IPSetMemberSliceSpec, POLICY_LABEL};
pub use member_source::{MemberSource, SourceStatus};
pub use node_state::{IPSetNodeState, IPSetNodeStateSpec, IPSetNodeStateStatus, PolicyState};
pub use policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec, IPSetPolicyStatus, StatusSummary};

/// The CRDs as one YAML stream: what `ipsetmgr crd` prints and `crds/` holds.
pub fn crd_yaml() -> String {
    let crds = [
        IPSetPolicy::crd(),
        IPSetMemberSlice::crd(),
        IPSetNodeState::crd(),
    ];
    let docs: Vec<String> = crds
        .iter()
        .map(|c| serde_saphyr::to_string(c).expect("a CRD serializes"))
        .collect();
    docs.join("---\n")
}

/// The names of this project's CRDs (`<plural>.<group>`).
pub fn crd_names() -> [String; 3] {
    [
        IPSetPolicy::crd_name().to_string(),
        IPSetMemberSlice::crd_name().to_string(),
        IPSetNodeState::crd_name().to_string(),
    ]
}

/// A list-map schema (`x-kubernetes-list-type: map`, keyed by `key`) of
/// `T` items, the item schema inlined: CRD schemas cannot use `$ref`, and
/// the key must be required.
pub(crate) fn list_map_schema<T: schemars::JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
    key: &str,
    description: &str,
) -> schemars::Schema {
    let mut items = generator.subschema_for::<T>();
    if items.get("$ref").is_some() {
        items = T::json_schema(generator);
    }
    schemars::json_schema!({
        "description": description,
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": [key],
        "items": items
    })
}
