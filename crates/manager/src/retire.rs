//! The kernel facility the agent no longer uses (`--backend` switched from
//! ipsets to nft sets or back): its owned sets are removed, each once the
//! selected backend holds that set's policy, so a switch never leaves a
//! node without a policy's set and never leaves sets owned by nobody
//! (docs/architecture.md, "Switching the backend"). Generic, so this crate
//! needs no nft code.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ipsetmgr_dataplane::DataplaneError;
use ipsetmgr_ipset::Naming;

use crate::{ApplyOutcome, DeletionReport, DesiredSet, ListedSet, SetReport, SetsBackend};

/// `active` holds the desired state; `retired` (built with pruning on) is
/// given none, and keeps only the sets of policies `active` does not hold
/// yet and of held (failed) policies. Reports are `active`'s, but for the
/// retired sets that could not be deleted (a firewall rule still uses
/// them): those are reported, never forced, named `<retired>:<set>`.
pub struct Retiring<A: SetsBackend, R: SetsBackend> {
    pub active: A,
    pub retired: R,
    /// The desired sets' (ipset) names by policy, from the last
    /// `set_desired`.
    desired: BTreeMap<String, Vec<String>>,
    held: Vec<String>,
}

impl<A: SetsBackend, R: SetsBackend> Retiring<A, R> {
    pub fn new(active: A, retired: R) -> Self {
        Retiring {
            active,
            retired,
            desired: BTreeMap::new(),
            held: Vec::new(),
        }
    }

    fn tag(&self, name: &str) -> String {
        format!("{}:{name}", self.retired.name())
    }

    /// What the retired backend must keep: held sets, and the sets of every
    /// policy the active backend does not hold in full yet.
    fn still_needed(&self) -> Vec<String> {
        let mut synced: BTreeMap<&str, bool> = BTreeMap::new();
        let reports = self.active.report();
        for r in &reports {
            *synced.entry(r.policy.as_str()).or_insert(true) &= r.synced;
        }
        let mut keep: BTreeSet<String> = self.held.iter().cloned().collect();
        for (policy, names) in &self.desired {
            if !synced.get(policy.as_str()).copied().unwrap_or(false) {
                keep.extend(names.iter().cloned());
            }
        }
        keep.into_iter().collect()
    }
}

impl<A: SetsBackend, R: SetsBackend> SetsBackend for Retiring<A, R> {
    fn name(&self) -> &'static str {
        self.active.name()
    }

    fn naming(&self) -> &Naming {
        self.active.naming()
    }

    fn set_desired(&mut self, desired: Vec<DesiredSet>, held: Vec<String>) {
        self.desired.clear();
        for d in &desired {
            self.desired
                .entry(d.policy.clone())
                .or_default()
                .push(d.name.clone());
        }
        self.held = held.clone();
        self.active.set_desired(desired, held);
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
    /// active one now holds. Its failures never fail the apply: they are
    /// in [`SetsBackend::deletion_report`] and retried at the next resync.
    fn apply_updates(&mut self) -> ApplyOutcome {
        let mut out = self.active.apply_updates();
        let keep = self.still_needed();
        self.retired.set_desired(Vec::new(), keep);
        let r = self.retired.apply_updates();
        if let Some(e) = &r.error {
            tracing::warn!(backend = self.retired.name(), error = %e, "sets of the backend no longer selected not removed; retried at the next resync");
        }
        for name in &r.deleted {
            tracing::info!(backend = self.retired.name(), set = %name, "removed a set of the backend no longer selected");
        }
        out.deleted.extend(r.deleted.iter().map(|n| self.tag(n)));
        out.duration += r.duration;
        out
    }

    fn report(&self) -> Vec<SetReport> {
        self.active.report()
    }

    fn unwanted(&self) -> Vec<String> {
        self.active.unwanted()
    }

    fn deletion_report(&self) -> Vec<DeletionReport> {
        let mut d = self.active.deletion_report();
        d.extend(self.retired.deletion_report().into_iter().map(|mut r| {
            r.name = self.tag(&r.name);
            r
        }));
        d
    }

    fn plan(&mut self) -> Result<Vec<String>, DataplaneError> {
        self.active.plan()
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, DataplaneError> {
        self.active.list()
    }

    fn shown_name(&self, set: &str) -> String {
        self.active.shown_name(set)
    }
}

#[cfg(test)]
mod tests {
    use ipsetmgr_dataplane::model::ModelDataplane;
    use ipsetmgr_ipset::{Family, SetKind, SetType};

    use super::*;
    use crate::both::tests::desired;
    use crate::{Manager, ManagerConfig};

    fn manager(k: &ModelDataplane) -> Manager<ModelDataplane> {
        // Isolated sets are retried at the next apply.
        let config = ManagerConfig {
            set_retry_base: std::time::Duration::ZERO,
            ..ManagerConfig::default()
        };
        Manager::new(k.clone(), config).with_sleep(|_| {})
    }

    #[test]
    fn the_old_backends_sets_go_once_the_new_one_holds_their_policy() {
        // The sets an earlier agent made with the other backend.
        let (old, new) = (ModelDataplane::new(), ModelDataplane::new());
        let mut before = manager(&old);
        before.set_desired(
            ["a", "b", "gone", "used", "held"]
                .iter()
                .map(|p| desired(p, &["10.0.0.1"]))
                .collect(),
            vec![],
        );
        assert!(before.apply_updates().applied);
        assert_eq!(old.set_names().len(), 5);
        // A rule still uses the old `used`.
        old.set_external_refs("ipm4-used", 1);
        // The new backend cannot hold `b` yet: a set of that name with
        // another type is in its way, and a rule uses it.
        let mut other = desired("b", &[]).header;
        other.kind = SetKind::new(SetType::HashNet, Some(Family::V4));
        new.create_raw("ipm4-b", other);
        new.set_external_refs("ipm4-b", 1);
        let mut r = Retiring::new(manager(&new), manager(&old));
        r.set_desired(
            vec![desired("a", &["10.0.0.1"]), desired("b", &["10.0.0.1"])],
            vec!["ipm4-held".into()],
        );
        let o = r.apply_updates();
        let mut deleted = o.deleted.clone();
        deleted.sort();
        // `a` is held by the new backend: its old set goes; so does `gone`,
        // which nobody wants. `b` stays until the new backend holds it,
        // `held` (its policy failed) stays as it is, `used` is reported.
        assert_eq!(deleted, ["model:ipm4-a", "model:ipm4-gone"]);
        assert_eq!(old.set_names(), ["ipm4-b", "ipm4-held", "ipm4-used"]);
        let undeleted: Vec<String> = r.deletion_report().into_iter().map(|d| d.name).collect();
        assert_eq!(undeleted, ["model:ipm4-used"]);
        // The way cleared: the new backend holds `b`, the old one goes.
        new.set_external_refs("ipm4-b", 0);
        r.queue_resync();
        let o = r.apply_updates();
        assert_eq!(o.deleted, ["model:ipm4-b"]);
        assert_eq!(old.set_names(), ["ipm4-held", "ipm4-used"]);
    }
}
