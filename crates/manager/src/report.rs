//! What the manager tells its callers after an apply: per set, per
//! deletion, and for the apply as a whole. Errors stay typed until the
//! edges (tables, logs, status) render them.

use std::time::{Duration, SystemTime};

use ipsetmgr_dataplane::DataplaneError;
use ipsetmgr_ipset::{Member, SetKind};

use super::Plan;

/// Why a desired set is not in the kernel as desired.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The kernel refused the set (type not supported, set full, ...).
    #[error("{0}")]
    Kernel(DataplaneError),
    /// The kernel refused one element of the set.
    #[error("{error} (element {element})")]
    Element {
        error: DataplaneError,
        element: Member,
    },
    /// Replacing the set would break what references it.
    #[error(transparent)]
    NotReplaced(#[from] NotReplaced),
    /// The backend cannot hold the set exactly (an nft set has no ICMP
    /// ports, no physdev: interfaces, no list:set of mixed types): a
    /// property of the policy and the backend, not of this kernel.
    #[error("{0}")]
    Unrepresentable(String),
}

/// A set whose type or family must change is still referenced from outside
/// this manager, so it is left as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the kernel set has type {} but the policy wants {wanted}; it is referenced {references} \
     time(s) (an iptables or nft rule, or a list:set), so it is not replaced: remove the references or \
     recreate the policy under another name",
    kernel.map_or("(unmanaged)".to_string(), |k| k.to_string())
)]
pub struct NotReplaced {
    /// `None`: a type this project does not manage.
    pub kernel: Option<SetKind>,
    pub wanted: SetKind,
    pub references: u32,
}

/// Why an apply did not reach the kernel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("resync failed: {0}")]
    Resync(DataplaneError),
    #[error("batch failed at set {set}: {error}")]
    BatchAtSet { set: String, error: DataplaneError },
    #[error("batch failed: {0}")]
    Batch(DataplaneError),
}

/// The state of one desired set after the last apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetReport {
    pub name: String,
    pub policy: String,
    pub synced: bool,
    pub members: usize,
    /// Discrepancies found (and queued for repair) by the last resync:
    /// `drift.total()`.
    pub problems: usize,
    /// What those discrepancies were.
    pub drift: Drift,
    pub error: Option<SetError>,
    pub last_sync: Option<SystemTime>,
}

/// The discrepancies a resync found between a kernel set and what the
/// manager believed it held; each is queued for repair in the same apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Members the kernel lacked: added back.
    pub missing: usize,
    /// Members the kernel held that it should not: removed.
    pub extra: usize,
    /// The set was gone, or had another type, family, maxelem or options
    /// (one discrepancy): written whole again.
    pub rewritten: bool,
}

impl Drift {
    /// The problem count: one per member, one for a rewrite.
    pub fn total(&self) -> usize {
        self.missing + self.extra + usize::from(self.rewritten)
    }
}

/// A set that should be gone but is not (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletionReport {
    pub name: String,
    pub error: DataplaneError,
}

/// The result of one `apply_updates` call.
#[derive(Clone, Debug, Default)]
pub struct ApplyOutcome {
    /// The batch (minus isolated sets) reached the kernel.
    pub applied: bool,
    pub attempts: u32,
    /// Why the last attempt failed, when `applied` is false.
    pub error: Option<ApplyError>,
    /// Sets written by this call and how.
    pub written: Vec<(String, Plan)>,
    /// Sets deleted by this call.
    pub deleted: Vec<String>,
    /// Owned temp sets removed by this call.
    pub temp_deleted: Vec<String>,
    pub duration: Duration,
}
