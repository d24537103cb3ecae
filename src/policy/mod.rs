//! Policies as the kernel side needs them: loading them (and plain member
//! lists) from files, and compiling them (with their member slices) into
//! the desired kernel sets of one node. The resource types themselves are
//! in `ipsetmgr_api`.

pub mod compile;
pub(crate) mod k8s_names;
pub mod load;
pub(crate) mod member_list;
pub(crate) mod selector;
pub(crate) mod slicing;
pub(crate) mod yaml_lift;

pub use compile::{Compiled, DesiredSet, PolicyError, PolicyErrorKind, compile};
pub use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec};
pub use load::{LoadError, LoadedPolicy, load_policies};
