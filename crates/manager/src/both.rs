//! Two sets backends as one (`--backend both`): the same desired sets held
//! as ipsets and as nft sets. Generic, so this crate needs no nft code.

use std::time::Instant;

use ipsetmgr_dataplane::DataplaneError;
use ipsetmgr_ipset::Naming;

use crate::{
    ApplyError, ApplyOutcome, DeletionReport, DesiredSet, ListedSet, SetReport, SetsBackend,
};

/// What the second backend's set names carry in front in reports.
pub const SECOND_PREFIX: &str = "nft:";

/// `first` (the ipset backend) and `second` (the nft backend) given the
/// same desired state. Reports, deletions and written sets of `second` are
/// named with [`BothBackends::SECOND_PREFIX`] in front, so a status or table
/// can tell `ipm4-x` the ipset from `nft:ipm4-x` the nft set. Naming is
/// `first`'s (both are built with the same one).
pub struct BothBackends<A: SetsBackend, B: SetsBackend> {
    pub first: A,
    pub second: B,
}

impl<A: SetsBackend, B: SetsBackend> BothBackends<A, B> {
    pub const SECOND_PREFIX: &'static str = SECOND_PREFIX;

    pub fn new(first: A, second: B) -> Self {
        BothBackends { first, second }
    }

    fn tag(name: &str) -> String {
        format!("{}{name}", Self::SECOND_PREFIX)
    }
}

impl<A: SetsBackend, B: SetsBackend> SetsBackend for BothBackends<A, B> {
    fn name(&self) -> &'static str {
        "both"
    }

    fn naming(&self) -> &Naming {
        self.first.naming()
    }

    fn set_desired(&mut self, desired: Vec<DesiredSet>, held: Vec<String>) {
        self.second.set_desired(desired.clone(), held.clone());
        self.first.set_desired(desired, held);
    }

    fn queue_resync(&mut self) {
        self.first.queue_resync();
        self.second.queue_resync();
    }

    fn retry_due(&self) -> bool {
        self.first.retry_due() || self.second.retry_due()
    }

    fn next_retry(&self) -> Option<Instant> {
        match (self.first.next_retry(), self.second.next_retry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Both apply, whatever the other's result: one kernel failing must not
    /// keep the other stale.
    fn apply_updates(&mut self) -> ApplyOutcome {
        let mut out = self.first.apply_updates();
        let b = self.second.apply_updates();
        out.applied &= b.applied;
        out.attempts = out.attempts.max(b.attempts);
        if out.error.is_none() {
            out.error = b.error.map(|e| match e {
                ApplyError::BatchAtSet { set, error } => ApplyError::BatchAtSet {
                    set: Self::tag(&set),
                    error,
                },
                other => other,
            });
        }
        out.written.extend(
            b.written
                .into_iter()
                .map(|(name, plan)| (Self::tag(&name), plan)),
        );
        out.deleted.extend(b.deleted.iter().map(|n| Self::tag(n)));
        out.temp_deleted
            .extend(b.temp_deleted.iter().map(|n| Self::tag(n)));
        out.duration += b.duration;
        out
    }

    fn report(&self) -> Vec<SetReport> {
        let mut r = self.first.report();
        r.extend(self.second.report().into_iter().map(|mut s| {
            s.name = Self::tag(&s.name);
            s
        }));
        r
    }

    fn unwanted(&self) -> Vec<String> {
        let mut u = self.first.unwanted();
        u.extend(self.second.unwanted().iter().map(|n| Self::tag(n)));
        u
    }

    fn deletion_report(&self) -> Vec<DeletionReport> {
        let mut d = self.first.deletion_report();
        d.extend(self.second.deletion_report().into_iter().map(|mut r| {
            r.name = Self::tag(&r.name);
            r
        }));
        d
    }

    /// Both plans; the second's lines name each set as it shows it (an nft
    /// set after its table), which tells them from the first's.
    fn plan(&mut self) -> Result<Vec<String>, DataplaneError> {
        let mut lines = self.first.plan()?;
        lines.extend(self.second.plan()?);
        Ok(lines)
    }

    /// Both kernels' sets; nft names already carry their table.
    fn list(&mut self) -> Result<Vec<ListedSet>, DataplaneError> {
        let mut l = self.first.list()?;
        l.extend(self.second.list()?);
        Ok(l)
    }

    /// A tagged name is the second's set, shown as the second shows it.
    fn shown_name(&self, set: &str) -> String {
        match set.strip_prefix(Self::SECOND_PREFIX) {
            Some(name) => self.second.shown_name(name),
            None => self.first.shown_name(set),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use ipsetmgr_dataplane::model::ModelDataplane;
    use ipsetmgr_ipset::{Family, Member, MemberSet, SetHeader, SetKind, SetType};

    use super::*;
    use crate::{Manager, ManagerConfig};

    /// A hash:ip IPv4 policy's set (shared with retire.rs's tests).
    pub(crate) fn desired(policy: &str, ips: &[&str]) -> DesiredSet {
        let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
        let members = ips.iter().map(|s| Member::Ip(s.parse().unwrap()));
        DesiredSet {
            name: Naming::default().main_set_name(policy, Some(Family::V4)),
            policy: policy.into(),
            header: SetHeader {
                kind,
                max_elem: 65536,
                hash_size: None,
                options: Default::default(),
            },
            members: Arc::new(MemberSet::from_members(kind, members)),
        }
    }

    #[test]
    fn both_backends_get_the_same_state_and_the_second_is_named_nft() {
        let (k1, k2) = (ModelDataplane::new(), ModelDataplane::new());
        let m = |k: &ModelDataplane| {
            Manager::new(k.clone(), ManagerConfig::default()).with_sleep(|_| {})
        };
        let mut both = BothBackends::new(m(&k1), m(&k2));
        assert_eq!(both.name(), "both");
        both.set_desired(vec![desired("a", &["10.0.0.1"])], vec![]);
        let o = both.apply_updates();
        assert!(o.applied, "{:?}", o.error);
        let mut written: Vec<String> = o.written.iter().map(|(n, _)| n.clone()).collect();
        written.sort();
        assert_eq!(written, ["ipm4-a", "nft:ipm4-a"]);
        let names: Vec<String> = both.report().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["ipm4-a", "nft:ipm4-a"]);
        assert!(both.report().iter().all(|r| r.synced));
        assert_eq!(both.first.list().unwrap().len(), 1);
        assert_eq!(both.second.list().unwrap().len(), 1);
        assert_eq!(both.list().unwrap().len(), 2);
        both.set_desired(vec![], vec![]);
        let o = both.apply_updates();
        assert_eq!(o.deleted, ["ipm4-a", "nft:ipm4-a"]);
        assert!(both.next_retry().is_none() && !both.retry_due());
    }
}
