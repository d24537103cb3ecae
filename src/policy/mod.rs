//! The `IPSetPolicy` resource, loading it from files, and compiling it into
//! the desired kernel sets of one node.

pub mod compile;
pub mod load;
pub(crate) mod selector;
pub mod spec;

pub use compile::{Compiled, DesiredSet, PolicyError, PolicyErrorKind, compile};
pub use load::{LoadError, LoadedPolicy, load_policies};
pub use spec::{
    FamilySpec, IPSetPolicy, IPSetPolicySpec, IPSetPolicyStatus, NodeStatus, StatusSummary,
};
