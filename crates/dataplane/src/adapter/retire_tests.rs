//! A backend switch over the ipset model: the retired kernel's sets go once
//! the active one holds their policies.

use std::sync::Arc;

use ipsetmgr_ipset::{Family, Member, MemberSet, Naming, SetHeader, SetKind, SetType};
use ipsetmgr_sets::{DesiredSet, ReconcilerConfig, Retiring, SetsBackend};

use super::{IpsetReconciler, reconciler};
use crate::model::ModelDataplane;

/// A hash:ip IPv4 policy's set.
fn desired(policy: &str, ips: &[&str]) -> DesiredSet {
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

fn manager(k: &ModelDataplane) -> IpsetReconciler<ModelDataplane> {
    // Isolated sets are retried at the next apply.
    let config = ReconcilerConfig {
        set_retry_base: std::time::Duration::ZERO,
        ..ReconcilerConfig::default()
    };
    reconciler(k.clone(), config).with_sleep(|_| {})
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
        vec!["held".into()],
    );
    let o = r.apply_updates();
    let mut deleted: Vec<String> = o.deleted.iter().map(|s| s.name.clone()).collect();
    deleted.sort();
    // `a` is held by the new backend: its old set goes; so does `gone`,
    // which nobody wants. `b` stays until the new backend holds it,
    // `held` (its policy failed) stays as it is, `used` is reported.
    assert_eq!(deleted, ["ipm4-a", "ipm4-gone"]);
    assert_eq!(old.set_names(), ["ipm4-b", "ipm4-held", "ipm4-used"]);
    let undeleted: Vec<String> = r
        .deletion_report()
        .into_iter()
        .map(|d| d.set.name)
        .collect();
    assert_eq!(undeleted, ["ipm4-used"]);
    // The way cleared: the new backend holds `b`, the old one goes.
    new.set_external_refs("ipm4-b", 0);
    r.queue_resync();
    let o = r.apply_updates();
    let deleted: Vec<&str> = o.deleted.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(deleted, ["ipm4-b"]);
    assert_eq!(old.set_names(), ["ipm4-held", "ipm4-used"]);
}
