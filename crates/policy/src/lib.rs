//! What a policy means: compiling policies (with their member slices)
//! into the desired kernel sets of one node, member lists, the pure parts
//! of member sources, slicing member lists into IPSetMemberSlices, and
//! reading policy files. The resource types themselves are in
//! `ipsetmgr_api`; how the crates fit is in `docs/architecture.md`.
//!
//! It must never talk to a cluster or need an async runtime (no kube
//! client, no tokio; `tests/crate_graph.rs` checks it): the agent, the
//! controller and file mode all call it with what they have read.

#![forbid(unsafe_code)]

pub mod compile;
pub mod duration;
pub mod k8s_names;
mod lines;
pub mod load;
pub mod member_list;
pub mod revision;
pub mod selector;
pub mod slicing;
pub mod sources;
/// Message helpers, kept in the set crate so every layer shares them.
pub use ipsetmgr_ipset::text;
pub mod yaml_lift;

pub use compile::{Compiled, DesiredSet, PolicyError, PolicyErrorKind, compile};
pub use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec};
pub use load::{LoadError, LoadedPolicy, load_policies};
