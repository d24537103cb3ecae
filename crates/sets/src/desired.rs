//! What a node is asked to hold.

use std::sync::Arc;

use ipsetmgr_ipset::{MemberSet, SetHeader};

/// One set this node should hold, as a policy compiler produces it, in no
/// kernel's words: each kernel adapter derives its own name and form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredSet {
    /// The set's name in the project's naming scheme (`ipm4-blocklist`):
    /// what list:set members and reports call it. A kernel whose names
    /// differ maps it (see [`Kernel::kernel_name`](crate::Kernel::kernel_name)).
    pub name: String,
    /// The policy it comes from, for reports.
    pub policy: String,
    pub header: SetHeader,
    /// Shared with the compiler's cache: a million members are held once,
    /// and an unchanged policy is recognised without a diff.
    pub members: Arc<MemberSet>,
}
