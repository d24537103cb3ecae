//! Any number of kernels as one backend (`--backend netlink,nft`): each
//! keeps its own reconciler and gets the same desired state. One
//! reconciler per kernel rather than one over several: a kernel that
//! fails, or is slow, never holds the others back, and every kernel's
//! retries, isolation and backoff stay its own. Reports name their
//! backend ([`SetRef`]), so nothing is told apart by its name.

use std::time::Instant;

use ipsetmgr_ipset::Naming;

use crate::{
    ApplyOutcome, BackendId, DeletionReport, DesiredSet, KernelError, ListedSet, SetRef, SetReport,
    SetsBackend,
};

/// Several backends given one desired state, in the order given.
pub struct Backends {
    list: Vec<Box<dyn SetsBackend>>,
}

impl Backends {
    /// `list` must not be empty (the naming is the first's: every backend
    /// of one node is built with the same).
    pub fn new(list: Vec<Box<dyn SetsBackend>>) -> Backends {
        assert!(!list.is_empty(), "Backends needs at least one backend");
        Backends { list }
    }

    fn of(&self, id: &BackendId) -> Option<&dyn SetsBackend> {
        self.list
            .iter()
            .find(|b| b.ids().contains(id))
            .map(|b| &**b)
    }
}

impl SetsBackend for Backends {
    fn ids(&self) -> Vec<BackendId> {
        self.list.iter().flat_map(|b| b.ids()).collect()
    }

    fn naming(&self) -> &Naming {
        self.list[0].naming()
    }

    fn set_desired(&mut self, desired: Vec<DesiredSet>, held_policies: Vec<String>) {
        let (last, rest) = self.list.split_last_mut().expect("not empty");
        for b in rest {
            b.set_desired(desired.clone(), held_policies.clone());
        }
        last.set_desired(desired, held_policies);
    }

    fn queue_resync(&mut self) {
        self.list.iter_mut().for_each(|b| b.queue_resync());
    }

    fn retry_due(&self) -> bool {
        self.list.iter().any(|b| b.retry_due())
    }

    fn next_retry(&self) -> Option<Instant> {
        self.list.iter().filter_map(|b| b.next_retry()).min()
    }

    /// Every backend applies, whatever the others' results: one kernel
    /// failing must not keep another stale.
    fn apply_updates(&mut self) -> ApplyOutcome {
        let mut outcomes = self.list.iter_mut().map(|b| b.apply_updates());
        let mut out = outcomes.next().unwrap_or_default();
        for o in outcomes {
            out.merge(o);
        }
        out
    }

    fn report(&self) -> Vec<SetReport> {
        self.list.iter().flat_map(|b| b.report()).collect()
    }

    fn unwanted(&self) -> Vec<SetRef> {
        self.list.iter().flat_map(|b| b.unwanted()).collect()
    }

    fn deletion_report(&self) -> Vec<DeletionReport> {
        self.list.iter().flat_map(|b| b.deletion_report()).collect()
    }

    /// Every backend's plan; each line names its set as its backend shows it.
    fn plan(&mut self) -> Result<Vec<String>, KernelError> {
        let mut lines = Vec::new();
        for b in &mut self.list {
            lines.extend(b.plan()?);
        }
        Ok(lines)
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        let mut listed = Vec::new();
        for b in &mut self.list {
            listed.extend(b.list()?);
        }
        Ok(listed)
    }

    fn shown_name(&self, set: &SetRef) -> String {
        self.of(&set.backend)
            .map_or_else(|| set.name.clone(), |b| b.shown_name(set))
    }
}
