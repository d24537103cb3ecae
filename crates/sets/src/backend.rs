//! The sets backend: what the driver, file mode and the agent need from
//! the kernel side, whatever kernels it holds the sets in. One
//! [`Reconciler`] is a backend; [`Backends`](crate::Backends) runs any
//! number of them as one.

use std::time::Instant;

use ipsetmgr_ipset::Naming;

use crate::kernel::Kernel;
use crate::{
    ApplyOutcome, BackendId, DeletionReport, DesiredSet, KernelError, ListedSet, Reconciler,
    SetRef, SetReport,
};

/// A node's kernel side. `Send` because the driver runs it on the kernel
/// thread, inside the target network namespace.
pub trait SetsBackend: Send {
    /// The kernels it holds sets in, in order.
    fn ids(&self) -> Vec<BackendId>;

    /// For logs and tables: the backends' names, comma-separated as
    /// `--backend` takes them.
    fn name(&self) -> String {
        let names: Vec<&str> = self.ids().iter().map(|id| id.name).collect();
        names.join(",")
    }

    fn naming(&self) -> &Naming;

    /// Declare the complete desired state. The sets of `held_policies`
    /// (policies that failed to load) are left exactly as they are.
    fn set_desired(&mut self, desired: Vec<DesiredSet>, held_policies: Vec<String>);

    /// Ask for a full resync before the next update.
    fn queue_resync(&mut self);

    /// Whether an isolated set's retry time has come.
    fn retry_due(&self) -> bool;

    /// The earliest retry time of an isolated set.
    fn next_retry(&self) -> Option<Instant>;

    /// Bring the kernel in line with the desired state.
    fn apply_updates(&mut self) -> ApplyOutcome;

    /// Per desired set and kernel, after the last apply.
    fn report(&self) -> Vec<SetReport>;

    /// Owned sets no desired state wants, kept because pruning is off.
    fn unwanted(&self) -> Vec<SetRef>;

    /// Owned sets that should be gone but could not be deleted.
    fn deletion_report(&self) -> Vec<DeletionReport>;

    /// The planned operations, after a read-only resync (`--dry-run`).
    fn plan(&mut self) -> Result<Vec<String>, KernelError>;

    /// Every owned set in the kernel (`ipsetmgr sets`), read only.
    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError>;

    /// How a command shows a user `set`: the name [`list`](SetsBackend::list)
    /// gives it (an nft set after its table: `inet ipsetmgr ipm4-a`).
    fn shown_name(&self, set: &SetRef) -> String;
}

impl<K: Kernel> SetsBackend for Reconciler<K> {
    fn ids(&self) -> Vec<BackendId> {
        vec![self.kernel().id()]
    }
    fn naming(&self) -> &Naming {
        &self.config().naming
    }
    fn set_desired(&mut self, desired: Vec<DesiredSet>, held_policies: Vec<String>) {
        Reconciler::set_desired(self, desired, held_policies)
    }
    fn queue_resync(&mut self) {
        Reconciler::queue_resync(self)
    }
    fn retry_due(&self) -> bool {
        Reconciler::retry_due(self)
    }
    fn next_retry(&self) -> Option<Instant> {
        Reconciler::next_retry(self)
    }
    fn apply_updates(&mut self) -> ApplyOutcome {
        Reconciler::apply_updates(self)
    }
    fn report(&self) -> Vec<SetReport> {
        Reconciler::report(self)
    }
    fn unwanted(&self) -> Vec<SetRef> {
        Reconciler::unwanted(self)
    }
    fn deletion_report(&self) -> Vec<DeletionReport> {
        Reconciler::deletion_report(self)
    }
    fn plan(&mut self) -> Result<Vec<String>, KernelError> {
        Reconciler::plan(self)
    }
    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        Reconciler::list(self)
    }
    fn shown_name(&self, set: &SetRef) -> String {
        self.kernel().shown_name(&set.name)
    }
}

impl<B: SetsBackend + ?Sized> SetsBackend for Box<B> {
    fn ids(&self) -> Vec<BackendId> {
        (**self).ids()
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn naming(&self) -> &Naming {
        (**self).naming()
    }
    fn set_desired(&mut self, desired: Vec<DesiredSet>, held_policies: Vec<String>) {
        (**self).set_desired(desired, held_policies)
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
    fn unwanted(&self) -> Vec<SetRef> {
        (**self).unwanted()
    }
    fn deletion_report(&self) -> Vec<DeletionReport> {
        (**self).deletion_report()
    }
    fn plan(&mut self) -> Result<Vec<String>, KernelError> {
        (**self).plan()
    }
    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        (**self).list()
    }
    fn shown_name(&self, set: &SetRef) -> String {
        (**self).shown_name(set)
    }
}
