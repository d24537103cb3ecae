//! What the manager is asked to hold.

use std::sync::Arc;

use ipsetmgr_ipset::{MemberSet, SetHeader};

/// One kernel set this node should hold, as a policy compiler produces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredSet {
    /// The kernel name (owned by the manager's naming scheme).
    pub name: String,
    /// The policy it comes from, for reports.
    pub policy: String,
    pub header: SetHeader,
    /// Shared with the compiler's cache: a million members are held once,
    /// and an unchanged policy is recognised without a diff.
    pub members: Arc<MemberSet>,
}
