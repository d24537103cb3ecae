//! Kernels the agent no longer uses (`--backend` switched from ipsets to
//! nft sets or back): their owned sets are removed, each once the selected
//! backend holds that set's policy, so a switch never leaves a node without
//! a policy's set and never leaves sets owned by nobody
//! (docs/architecture.md, "Switching the backend").

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ipsetmgr_ipset::Naming;

use crate::{
    ApplyOutcome, BackendId, DeletionReport, DesiredSet, KernelError, ListedSet, SetRef, SetReport,
    SetsBackend,
};

/// `active` holds the desired state; `retired` (built with pruning on) is
/// given none, and keeps only the sets of policies `active` does not hold
/// yet and of held (failed) policies, which it is told are held. Reports
/// are `active`'s, but for the retired sets that could not be deleted (a
/// firewall rule still uses them): those are reported, never forced, named
/// with their backend.
pub struct Retiring<A: SetsBackend, R: SetsBackend> {
    pub active: A,
    pub retired: R,
    /// The policies of the last `set_desired`.
    desired: BTreeSet<String>,
    held: Vec<String>,
}

impl<A: SetsBackend, R: SetsBackend> Retiring<A, R> {
    pub fn new(active: A, retired: R) -> Self {
        Retiring {
            active,
            retired,
            desired: BTreeSet::new(),
            held: Vec::new(),
        }
    }

    /// Policies whose retired sets must stay: held ones, and desired ones
    /// `active` does not hold in sync yet (every set of the policy).
    fn still_needed(&self) -> Vec<String> {
        let mut synced: BTreeMap<&str, bool> = BTreeMap::new();
        let reports = self.active.report();
        for r in &reports {
            *synced.entry(r.policy.as_str()).or_insert(true) &= r.synced;
        }
        let mut keep: BTreeSet<String> = self.held.iter().cloned().collect();
        for policy in &self.desired {
            if !synced.get(policy.as_str()).copied().unwrap_or(false) {
                keep.insert(policy.clone());
            }
        }
        keep.into_iter().collect()
    }
}

impl<A: SetsBackend, R: SetsBackend> SetsBackend for Retiring<A, R> {
    fn ids(&self) -> Vec<BackendId> {
        self.active.ids()
    }

    fn naming(&self) -> &Naming {
        self.active.naming()
    }

    fn set_desired(&mut self, desired: Vec<DesiredSet>, held_policies: Vec<String>) {
        self.desired = desired.iter().map(|d| d.policy.clone()).collect();
        self.held = held_policies.clone();
        self.active.set_desired(desired, held_policies);
    }

    fn queue_resync(&mut self) {
        self.active.queue_resync();
        self.retired.queue_resync();
    }

    fn retry_due(&self) -> bool {
        self.active.retry_due()
    }

    fn next_retry(&self) -> Option<Instant> {
        self.active.next_retry()
    }

    /// The active backend first; then the retired one deletes what the
    /// active one now holds. Its failures are logged, never the apply's.
    fn apply_updates(&mut self) -> ApplyOutcome {
        let mut out = self.active.apply_updates();
        let keep = self.still_needed();
        self.retired.set_desired(Vec::new(), keep);
        let r = self.retired.apply_updates();
        let retired = self.retired.name();
        if let Some(e) = &r.error {
            tracing::warn!(backend = %retired, error = %e, "sets of the backend no longer selected not removed; retried at the next resync");
        }
        for set in &r.deleted {
            tracing::info!(backend = %retired, set = %set, "removed a set of the backend no longer selected");
        }
        out.deleted.extend(r.deleted);
        out.duration += r.duration;
        out
    }

    fn report(&self) -> Vec<SetReport> {
        self.active.report()
    }

    fn unwanted(&self) -> Vec<SetRef> {
        self.active.unwanted()
    }

    fn deletion_report(&self) -> Vec<DeletionReport> {
        let mut d = self.active.deletion_report();
        d.extend(self.retired.deletion_report());
        d
    }

    fn plan(&mut self) -> Result<Vec<String>, KernelError> {
        self.active.plan()
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        self.active.list()
    }

    fn shown_name(&self, set: &SetRef) -> String {
        if self.retired.ids().contains(&set.backend) {
            self.retired.shown_name(set)
        } else {
            self.active.shown_name(set)
        }
    }
}
