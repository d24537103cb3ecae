//! What a reconciler tells its callers after an apply: per set, per
//! deletion, and for the apply as a whole. Every set is named with the
//! backend that holds it ([`SetRef`]), so several kernels' reports can be
//! told apart without reading names. Errors stay typed until the edges
//! (tables, logs, status) render them.

use std::fmt;
use std::time::{Duration, SystemTime};

use ipsetmgr_ipset::{Member, SetKind};

use crate::KernelError;

/// Which backend: its `--backend` word and the kind of kernel set it holds
/// (the `backend` label of metrics: `ipset`, `nft`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId {
    /// "netlink", "cli", "nft", "nft-cli", or a model's name.
    pub name: &'static str,
    /// "ipset", "nft".
    pub kind: &'static str,
}

/// One set in one backend, by the name that backend's kernel knows it by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetRef {
    pub backend: BackendId,
    pub name: String,
}

impl fmt::Display for SetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Why a desired set is not in the kernel as desired.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The kernel refused the set (type not supported, set full, ...).
    #[error("{0}")]
    Kernel(KernelError),
    /// The kernel refused one element of the set.
    #[error("{error} (element {element})")]
    Element { error: KernelError, element: Member },
    /// Replacing the set would break what references it.
    #[error(transparent)]
    NotReplaced(#[from] NotReplaced),
    /// The backend cannot hold the set exactly (an nft set has no ICMP
    /// ports, no physdev: interfaces, no list:set of mixed types): a
    /// property of the policy and the backend, not of this kernel.
    #[error("{0}")]
    Unrepresentable(String),
}

impl SetError {
    /// The kernel's error, when the kernel refused.
    pub fn kernel_error(&self) -> Option<&KernelError> {
        match self {
            SetError::Kernel(e) | SetError::Element { error: e, .. } => Some(e),
            _ => None,
        }
    }
}

/// A set whose type or family must change is still referenced from outside
/// this reconciler, so it is left as it is.
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
    Resync(KernelError),
    #[error("batch failed at set {set}: {error}")]
    BatchAtSet { set: SetRef, error: KernelError },
    #[error("batch failed: {0}")]
    Batch(KernelError),
}

/// How one set was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriteKind {
    /// Deletes and adds against known kernel content.
    Delta,
    /// A new set, complete when it appears.
    Create,
    /// The whole content replaced at once (atomic for anything matching on
    /// it): a header change, or a change too large to make in place.
    Replace,
    /// The kernel set had another type and nothing outside held it: made
    /// again.
    Recreate,
}

/// The state of one desired set after the last apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetReport {
    /// The backend and the kernel's name for the set.
    pub set: SetRef,
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
/// reconciler believed it held; each is queued for repair in the same apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Members the kernel lacked: added back.
    pub missing: usize,
    /// Members the kernel held that it should not: removed.
    pub extra: usize,
    /// The set was gone, or had another type, family, size or options
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
    pub set: SetRef,
    pub error: KernelError,
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
    pub written: Vec<(SetRef, WriteKind)>,
    /// Sets deleted by this call.
    pub deleted: Vec<SetRef>,
    /// Leftovers of interrupted writes (an ipset swap's temp set) removed
    /// by this call.
    pub temp_deleted: Vec<SetRef>,
    /// Backends whose full resync read nothing: their kernel said nothing
    /// changed since their own last read or write (docs/architecture.md,
    /// "Quiet resyncs").
    pub resyncs_skipped: Vec<BackendId>,
    pub duration: Duration,
}

impl ApplyOutcome {
    /// Fold in another backend's outcome of the same apply: applied only
    /// when both were, the first error kept.
    pub fn merge(&mut self, other: ApplyOutcome) {
        self.applied &= other.applied;
        self.attempts = self.attempts.max(other.attempts);
        if self.error.is_none() {
            self.error = other.error;
        }
        self.written.extend(other.written);
        self.deleted.extend(other.deleted);
        self.temp_deleted.extend(other.temp_deleted);
        self.resyncs_skipped.extend(other.resyncs_skipped);
        self.duration += other.duration;
    }
}

/// One owned kernel set as `ipsetmgr sets` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedSet {
    /// The backend, and the name as the kernel shows it (an nft set's
    /// after its table).
    pub set: SetRef,
    /// The set type and family, as the backend spells it.
    pub kind: String,
    pub members: usize,
    /// The set's size limit, when it has one.
    pub max_elem: Option<u32>,
    /// Kernel references (iptables rules, list:sets, nft rules).
    pub references: u32,
    /// "main", or "temp" for an interrupted write's leftover.
    pub role: &'static str,
}
