//! The sets-backend seam: what the driver, `apply`, `sets` and the agent
//! need from a kernel backend, one level above any one kernel's operations.
//!
//! A backend takes complete desired states and keeps the kernel equal to
//! them: it resyncs, retries with backoff, isolates sets that keep
//! failing, deletes what nobody wants (never a held set, never a set it
//! does not own), and reports per set. How it does that is its own
//! business: the ipset [`Manager`](crate::Manager) plans
//! create-temp-then-swap over a [`Dataplane`](ipsetmgr_dataplane::Dataplane);
//! an nf_tables backend sends one transaction and needs no swap. The shape
//! follows Calico felix, whose `ipsets` and `nftables` dataplanes implement
//! one sets interface (docs/architecture.md, "The backend seam").

use std::time::Instant;

use ipsetmgr_dataplane::DataplaneError;
use ipsetmgr_ipset::Naming;

use crate::{ApplyOutcome, DeletionReport, DesiredSet, SetReport};

/// One owned kernel set as `ipsetmgr sets` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedSet {
    /// The name the kernel knows it by (an nft set's with its table).
    pub name: String,
    /// The ipset type and family, or how the backend spells the set's type.
    pub kind: String,
    pub members: usize,
    /// The set's size limit, when it has one.
    pub max_elem: Option<u32>,
    /// Kernel references (iptables rules, list:sets, nft rules).
    pub references: u32,
    /// "main", or "temp" for an ipset swap's leftover.
    pub role: &'static str,
}

/// A kernel backend for desired sets. `Send` because the driver runs it on
/// the kernel thread, inside the target network namespace.
pub trait SetsBackend: Send {
    /// Short name for logs, tables and metrics ("netlink", "cli", "nft").
    fn name(&self) -> &'static str;

    fn naming(&self) -> &Naming;

    /// Declare the complete desired state. `held` names sets of failed
    /// policies, which are left exactly as they are in the kernel.
    fn set_desired(&mut self, desired: Vec<DesiredSet>, held: Vec<String>);

    /// Ask for a full resync before the next update.
    fn queue_resync(&mut self);

    /// Whether an isolated set's retry time has come.
    fn retry_due(&self) -> bool;

    /// The earliest retry time of an isolated set.
    fn next_retry(&self) -> Option<Instant>;

    /// Bring the kernel in line with the desired state.
    fn apply_updates(&mut self) -> ApplyOutcome;

    /// Per desired set, after the last apply.
    fn report(&self) -> Vec<SetReport>;

    /// Owned sets no desired state wants, kept because pruning is off.
    fn unwanted(&self) -> Vec<String>;

    /// Owned sets that should be gone but could not be deleted.
    fn deletion_report(&self) -> Vec<DeletionReport>;

    /// The planned operations, after a read-only resync (`--dry-run`).
    fn plan(&mut self) -> Result<Vec<String>, DataplaneError>;

    /// Every owned set in the kernel (`ipsetmgr sets`), read only.
    fn list(&mut self) -> Result<Vec<ListedSet>, DataplaneError>;

    /// How a command shows a user the set named `set` in this backend's
    /// reports and outcomes: the name [`list`](SetsBackend::list) gives it,
    /// so `apply` and `sets` name one set alike. An ipset is its name; an
    /// nft set is named as nft names it, after its table (`inet ipsetmgr
    /// ipm4-a`), which says where it is whatever table was configured.
    fn shown_name(&self, set: &str) -> String {
        set.to_string()
    }
}

impl<B: SetsBackend + ?Sized> SetsBackend for Box<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn naming(&self) -> &Naming {
        (**self).naming()
    }
    fn set_desired(&mut self, desired: Vec<DesiredSet>, held: Vec<String>) {
        (**self).set_desired(desired, held)
    }
    fn queue_resync(&mut self) {
        (**self).queue_resync()
    }
    fn retry_due(&self) -> bool {
        (**self).retry_due()
    }
    fn next_retry(&self) -> Option<Instant> {
        (**self).next_retry()
    }
    fn apply_updates(&mut self) -> ApplyOutcome {
        (**self).apply_updates()
    }
    fn report(&self) -> Vec<SetReport> {
        (**self).report()
    }
    fn unwanted(&self) -> Vec<String> {
        (**self).unwanted()
    }
    fn deletion_report(&self) -> Vec<DeletionReport> {
        (**self).deletion_report()
    }
    fn plan(&mut self) -> Result<Vec<String>, DataplaneError> {
        (**self).plan()
    }
    fn list(&mut self) -> Result<Vec<ListedSet>, DataplaneError> {
        (**self).list()
    }
    fn shown_name(&self, set: &str) -> String {
        (**self).shown_name(set)
    }
}
