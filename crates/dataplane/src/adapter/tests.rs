//! The reconciler over ipsets, on the in-memory kernel model with faults
//! injected.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::BatchError;
use crate::model::{Fault, ModelDataplane};
use ipsetmgr_ipset::MemberSet;
use ipsetmgr_ipset::{Family, Member, SetHeader, SetKind};
use ipsetmgr_sets::{ApplyError, NotReplaced, SetReport};

/// A policy as the tests declare it: one IPv4 set (hash:mac: family-less),
/// members in user syntax; a list:set lists other test policies by name.
struct Policy {
    name: &'static str,
    set_type: SetType,
    members: Vec<&'static str>,
}

fn policy(name: &'static str, t: SetType, members: &[&'static str]) -> Policy {
    Policy {
        name,
        set_type: t,
        members: members.to_vec(),
    }
}

/// What a policy compiler would hand the manager for `policies` (every
/// member valid: the tests of rejections live with the compiler).
fn compile(policies: &[Policy]) -> Vec<DesiredSet> {
    let naming = Naming::default();
    policies
        .iter()
        .map(|p| {
            let family = (p.set_type != SetType::HashMac).then_some(Family::V4);
            let kind = SetKind::new(p.set_type, family);
            let members: Vec<Member> = p
                .members
                .iter()
                .flat_map(|m| match p.set_type {
                    SetType::ListSet => {
                        vec![Member::Set(
                            naming.main_set_name(m, Some(Family::V4)).into(),
                        )]
                    }
                    t => Member::parse_user(t, m)
                        .unwrap()
                        .members
                        .into_iter()
                        .collect(),
                })
                .collect();
            let max_elem = if p.set_type == SetType::ListSet {
                8
            } else {
                65536
            };
            DesiredSet {
                name: naming.main_set_name(p.name, family),
                policy: p.name.to_string(),
                header: SetHeader {
                    kind,
                    max_elem,
                    hash_size: None,
                    options: Default::default(),
                },
                members: std::sync::Arc::new(MemberSet::from_members(kind, members)),
            }
        })
        .collect()
}

/// The names of a list of sets (one backend: the model).
fn names(sets: &[SetRef]) -> Vec<&str> {
    sets.iter().map(|s| s.name.as_str()).collect()
}

struct Harness {
    kernel: ModelDataplane,
    mgr: IpsetReconciler<ModelDataplane>,
    sleeps: Arc<Mutex<Vec<Duration>>>,
}

impl Harness {
    fn new() -> Harness {
        let kernel = ModelDataplane::new();
        let sleeps = Arc::new(Mutex::new(Vec::new()));
        let log = sleeps.clone();
        let config = ReconcilerConfig {
            set_retry_base: Duration::ZERO,
            ..ReconcilerConfig::default()
        };
        let mgr =
            reconciler(kernel.clone(), config).with_sleep(move |d| log.lock().unwrap().push(d));
        Harness {
            kernel,
            mgr,
            sleeps,
        }
    }

    fn desire(&mut self, policies: &[Policy]) {
        self.mgr.set_desired(compile(policies), Vec::new());
    }

    fn report(&self, name: &str) -> SetReport {
        self.mgr
            .report()
            .into_iter()
            .find(|r| r.set.name == name)
            .expect("set reported")
    }
}

fn ip(s: &str) -> Member {
    Member::Ip(s.parse().unwrap())
}

fn v4(t: SetType) -> SetKind {
    SetKind::new(t, Some(Family::V4))
}

#[test]
fn creates_then_sends_only_deltas() {
    let mut h = Harness::new();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1", "10.0.0.2"])]);
    let out = h.mgr.apply_updates();
    assert!(out.applied, "{:?}", out.error);
    assert_eq!(
        h.kernel.members("ipm4-a").unwrap(),
        ["10.0.0.1", "10.0.0.2"]
    );
    assert!(h.report("ipm4-a").synced);

    let before = h.kernel.stats();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.2", "10.0.0.3"])]);
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(
        h.kernel.members("ipm4-a").unwrap(),
        ["10.0.0.2", "10.0.0.3"]
    );
    let after = h.kernel.stats();
    assert_eq!(
        after.member_ops - before.member_ops,
        2,
        "one del and one add"
    );
    assert_eq!(after.reads, before.reads, "no resync needed for a delta");

    // Nothing changed: nothing is sent.
    let before = h.kernel.stats();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.2", "10.0.0.3"])]);
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.kernel.stats().batches, before.batches);
}

#[test]
fn resync_repairs_drift_and_counts_problems() {
    let mut h = Harness::new();
    h.desire(&[policy(
        "a",
        SetType::HashIp,
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
    )]);
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.report("ipm4-a").problems, 0);

    // Out of band: two foreign members added, one member removed.
    h.kernel.tamper(|sets| {
        let s = sets.get_mut("ipm4-a").unwrap();
        s.members.insert(ip("192.0.2.1"));
        s.members.insert(ip("192.0.2.2"));
        s.members.remove(&ip("10.0.0.1"));
    });
    h.mgr.queue_resync();
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(
        h.kernel.members("ipm4-a").unwrap(),
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    );
    assert_eq!(h.report("ipm4-a").problems, 3);
    assert_eq!(
        h.report("ipm4-a").drift,
        Drift {
            missing: 1,
            extra: 2,
            rewritten: false
        }
    );

    // Flushed: three missing members.
    h.kernel
        .tamper(|sets| sets.get_mut("ipm4-a").unwrap().members.clear());
    h.mgr.queue_resync();
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.report("ipm4-a").problems, 3);
    assert_eq!(h.kernel.members("ipm4-a").unwrap().len(), 3);

    // Destroyed: one problem, recreated.
    h.kernel.tamper(|sets| {
        sets.remove("ipm4-a");
    });
    h.mgr.queue_resync();
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.report("ipm4-a").problems, 1);
    assert!(h.report("ipm4-a").drift.rewritten);
    assert_eq!(h.kernel.members("ipm4-a").unwrap().len(), 3);

    // Recreated with another type: one problem, replaced with the right type.
    h.kernel.tamper(|sets| {
        sets.remove("ipm4-a");
    });
    h.kernel.create_raw(
        "ipm4-a",
        SetHeader {
            kind: v4(SetType::HashNet),
            max_elem: 65536,
            hash_size: None,
            options: Default::default(),
        },
    );
    h.mgr.queue_resync();
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.report("ipm4-a").problems, 1);
    let s = h.kernel.get("ipm4-a").unwrap();
    assert_eq!(s.header.kind.set_type, SetType::HashIp);
    assert_eq!(s.members.len(), 3);

    // Other maxelem: replaced atomically through a temp set and swap.
    h.kernel
        .tamper(|sets| sets.get_mut("ipm4-a").unwrap().header.max_elem = 1024);
    h.mgr.queue_resync();
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.report("ipm4-a").problems, 1);
    assert_eq!(h.kernel.get("ipm4-a").unwrap().header.max_elem, 65536);
    assert_eq!(h.kernel.set_names(), ["ipm4-a"], "temp set cleaned up");
}

#[test]
fn foreign_sets_untouched_and_leftovers_removed() {
    let mut h = Harness::new();
    let hdr = SetHeader {
        kind: v4(SetType::HashIp),
        max_elem: 65536,
        hash_size: None,
        options: Default::default(),
    };
    h.kernel.create_raw("KUBE-SRC-X", hdr.clone());
    h.kernel.create_raw("ipm", hdr.clone());
    h.kernel.create_raw("ipmt-deadbeef", hdr.clone());
    h.kernel.create_raw("ipm4-old", hdr.clone());
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    let out = h.mgr.apply_updates();
    assert!(out.applied);
    assert_eq!(names(&out.temp_deleted), ["ipmt-deadbeef"]);
    assert_eq!(names(&out.deleted), ["ipm4-old"]);
    assert_eq!(h.kernel.set_names(), ["KUBE-SRC-X", "ipm", "ipm4-a"]);
}

#[test]
fn transient_batch_failure_succeeds_after_retry() {
    let mut h = Harness::new();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    h.kernel
        .inject(Fault::FailNextBatch(DataplaneError::Unavailable(
            "restore crashed".into(),
        )));
    let out = h.mgr.apply_updates();
    assert!(out.applied, "{:?}", out.error);
    assert_eq!(out.attempts, 2);
    assert_eq!(*h.sleeps.lock().unwrap(), [Duration::from_millis(1)]);
    assert!(h.report("ipm4-a").synced);
}

#[test]
fn backoff_doubles_and_gives_up_after_ten_attempts() {
    let mut h = Harness::new();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    for _ in 0..10 {
        h.kernel
            .inject(Fault::FailNextList(DataplaneError::Unavailable(
                "no kernel".into(),
            )));
    }
    let out = h.mgr.apply_updates();
    assert!(!out.applied);
    assert_eq!(out.attempts, 10);
    let sleeps = h.sleeps.lock().unwrap().clone();
    assert_eq!(sleeps.len(), 10);
    assert_eq!(sleeps[0], Duration::from_millis(1));
    assert_eq!(sleeps[9], Duration::from_millis(512));
    assert!(matches!(
        out.error.unwrap(),
        ApplyError::Resync(e) | ApplyError::Batch(e)
            if e.kind() == ErrorKind::Unavailable && e.to_string().contains("no kernel")
    ));
    assert!(h.kernel.set_names().is_empty());
}

#[test]
fn a_persistently_failing_set_does_not_block_the_others() {
    let mut h = Harness::new();
    h.kernel.inject(Fault::FailSet(
        "ipm4-b".into(),
        DataplaneError::InvalidElement {
            set: "ipm4-b".into(),
            element: "10.0.0.9".into(),
            reason: "kernel says no".into(),
        },
    ));
    h.desire(&[
        policy("a", SetType::HashIp, &["10.0.0.1"]),
        policy("b", SetType::HashIp, &["10.0.0.9"]),
        policy("c", SetType::HashIp, &["10.0.0.3"]),
    ]);
    let out = h.mgr.apply_updates();
    assert!(out.applied, "{:?}", out.error);
    assert!(h.report("ipm4-a").synced && h.report("ipm4-c").synced);
    let b = h.report("ipm4-b");
    assert!(!b.synced);
    assert!(b.error.unwrap().to_string().contains("kernel says no"));
    assert_eq!(h.kernel.members("ipm4-c").unwrap(), ["10.0.0.3"]);

    // Once the kernel accepts it, the retry succeeds.
    h.kernel.clear_faults();
    assert!(h.mgr.retry_due());
    assert!(h.mgr.apply_updates().applied);
    assert!(h.report("ipm4-b").synced);
}

#[test]
fn repeated_generic_failures_isolate_the_set() {
    let mut h = Harness::new();
    h.kernel.inject(Fault::FailSet(
        "ipm4-b".into(),
        DataplaneError::Other("mystery".into()),
    ));
    h.desire(&[
        policy("a", SetType::HashIp, &["10.0.0.1"]),
        policy("b", SetType::HashIp, &["10.0.0.2"]),
    ]);
    let out = h.mgr.apply_updates();
    assert!(out.applied);
    // Isolated at its third failure; the next try applies the rest.
    assert_eq!(out.attempts, 4);
    assert!(h.report("ipm4-a").synced);
    assert!(
        h.report("ipm4-b")
            .error
            .unwrap()
            .to_string()
            .contains("mystery")
    );
}

#[test]
fn unsupported_type_is_isolated_before_sending() {
    let mut h = Harness::new();
    h.desire(&[
        policy("macs", SetType::HashMac, &["aa:bb:cc:dd:ee:ff"]),
        policy("a", SetType::HashIp, &["10.0.0.1"]),
    ]);
    let out = h.mgr.apply_updates();
    assert!(out.applied);
    assert_eq!(out.attempts, 1);
    let r = h.report("ipmx-macs");
    assert!(!r.synced);
    assert_eq!(
        r.error,
        Some(SetError::Kernel(
            DataplaneError::TypeNotSupported("hash:mac".into()).into()
        ))
    );
    assert!(h.report("ipm4-a").synced);
}

#[test]
fn unsupported_type_learned_from_a_failed_batch() {
    // A backend that cannot probe types learns from the kernel's answer.
    struct NoProbe(ModelDataplane);
    impl Dataplane for NoProbe {
        fn name(&self) -> &'static str {
            "noprobe"
        }
        fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError> {
            self.0.apply(ops)
        }
        fn list_owned(
            &mut self,
            owned: &dyn Fn(&str) -> bool,
        ) -> Result<Vec<String>, DataplaneError> {
            self.0.list_owned(owned)
        }
        fn read_set(&mut self, name: &str) -> Result<Option<crate::KernelSet>, DataplaneError> {
            self.0.read_set(name)
        }
    }
    let kernel = ModelDataplane::new();
    let mut mgr =
        reconciler(NoProbe(kernel.clone()), ReconcilerConfig::default()).with_sleep(|_| {});
    mgr.set_desired(
        compile(&[
            policy("a", SetType::HashIp, &["10.0.0.1"]),
            policy("macs", SetType::HashMac, &["aa:bb:cc:dd:ee:ff"]),
        ]),
        Vec::new(),
    );
    let out = mgr.apply_updates();
    assert!(out.applied);
    assert_eq!(out.attempts, 2);
    assert_eq!(kernel.members("ipm4-a").unwrap(), ["10.0.0.1"]);
    let mac = mgr
        .report()
        .into_iter()
        .find(|r| r.set.name == "ipmx-macs")
        .unwrap();
    assert!(matches!(
        mac.error.unwrap(),
        SetError::Kernel(e) if e.kind() == ErrorKind::NotSupported
    ));
}

#[test]
fn corrupt_listing_leads_to_a_resync_not_a_panic() {
    let mut h = Harness::new();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    assert!(h.mgr.apply_updates().applied);
    h.kernel.inject(Fault::CorruptNextRead);
    h.mgr.queue_resync();
    let out = h.mgr.apply_updates();
    assert!(out.applied);
    assert_eq!(out.attempts, 2);
    assert!(h.report("ipm4-a").synced);
}

#[test]
fn in_use_deletion_is_reported_and_retried() {
    let mut h = Harness::new();
    h.desire(&[
        policy("a", SetType::HashIp, &["10.0.0.1"]),
        policy("b", SetType::HashIp, &[]),
    ]);
    assert!(h.mgr.apply_updates().applied);
    h.kernel.set_external_refs("ipm4-b", 1); // an iptables rule
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    let out = h.mgr.apply_updates();
    assert!(out.applied);
    assert!(out.deleted.is_empty());
    let del = h.mgr.deletion_report();
    assert_eq!(del.len(), 1);
    assert!(del[0].error.kind() == ErrorKind::InUse, "{}", del[0].error);
    assert!(h.kernel.get("ipm4-b").is_some());

    // The rule goes away; the next resync deletes the set.
    h.kernel.set_external_refs("ipm4-b", 0);
    h.mgr.queue_resync();
    let out = h.mgr.apply_updates();
    assert_eq!(names(&out.deleted), ["ipm4-b"]);
    assert!(h.mgr.deletion_report().is_empty());
}

#[test]
fn list_set_is_emptied_before_its_members_are_destroyed() {
    let mut h = Harness::new();
    h.desire(&[
        policy("a", SetType::HashIp, &["10.0.0.1"]),
        policy("b", SetType::HashIp, &["10.0.0.2"]),
        policy("l", SetType::ListSet, &["a", "b"]),
    ]);
    assert!(h.mgr.apply_updates().applied, "{:?}", h.mgr.report());
    assert_eq!(h.kernel.members("ipm4-l").unwrap(), ["ipm4-a", "ipm4-b"]);
    // b is dropped from the list and deleted in the same run.
    h.desire(&[
        policy("a", SetType::HashIp, &["10.0.0.1"]),
        policy("l", SetType::ListSet, &["a"]),
    ]);
    let out = h.mgr.apply_updates();
    assert_eq!(names(&out.deleted), ["ipm4-b"]);
    // Whole list gone: the list is destroyed before the set it lists.
    h.desire(&[]);
    let out = h.mgr.apply_updates();
    assert_eq!(out.deleted.len(), 2, "{:?}", h.mgr.deletion_report());
    assert!(h.kernel.set_names().is_empty());
}

#[test]
fn type_change_of_a_referenced_set_is_reported_not_forced() {
    let mut h = Harness::new();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    assert!(h.mgr.apply_updates().applied);
    h.kernel.set_external_refs("ipm4-a", 1);
    h.mgr.queue_resync();
    h.desire(&[policy("a", SetType::HashNet, &["10.0.0.0/8"])]);
    let out = h.mgr.apply_updates();
    assert!(out.applied);
    let r = h.report("ipm4-a");
    assert!(!r.synced);
    assert!(matches!(
        r.error.unwrap(),
        SetError::NotReplaced(NotReplaced { references: 1, .. })
    ));
    assert_eq!(
        h.kernel.get("ipm4-a").unwrap().header.kind.set_type,
        SetType::HashIp
    );
    // Unreferenced: recreated with the new type.
    h.kernel.set_external_refs("ipm4-a", 0);
    h.mgr.queue_resync();
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.kernel.members("ipm4-a").unwrap(), ["10.0.0.0/8"]);
}

#[test]
fn type_change_of_a_set_listed_only_by_our_own_list_set_is_reordered() {
    let mut h = Harness::new();
    let both = |t: SetType, m: &'static str| {
        vec![policy("a", t, &[m]), policy("l", SetType::ListSet, &["a"])]
    };
    h.desire(&both(SetType::HashIp, "10.0.0.1"));
    assert!(h.mgr.apply_updates().applied);
    h.mgr.queue_resync();
    h.desire(&both(SetType::HashNet, "10.0.0.0/8"));
    let out = h.mgr.apply_updates();
    assert!(out.applied, "{:?}", out.error);
    let a = h.report("ipm4-a");
    assert!(a.synced && a.error.is_none(), "{a:?}");
    assert!(h.report("ipm4-l").synced);
    assert_eq!(
        h.kernel.get("ipm4-a").unwrap().header.kind.set_type,
        SetType::HashNet
    );
    assert_eq!(h.kernel.members("ipm4-a").unwrap(), ["10.0.0.0/8"]);
    assert_eq!(h.kernel.members("ipm4-l").unwrap(), ["ipm4-a"], "relinked");
    assert!(
        out.written
            .iter()
            .any(|(set, kind)| set.name == "ipm4-a" && *kind == WriteKind::Recreate)
    );
    // Nothing left over: the next resync finds nothing to do.
    h.mgr.queue_resync();
    let again = h.mgr.apply_updates();
    assert!(again.written.is_empty(), "{:?}", again.written);
    assert_eq!(h.report("ipm4-a").problems, 0);

    // A reference from outside (an iptables rule) still blocks it.
    h.kernel.set_external_refs("ipm4-a", 1);
    h.mgr.queue_resync();
    h.desire(&both(SetType::HashIp, "10.0.0.1"));
    h.mgr.apply_updates();
    let a = h.report("ipm4-a");
    assert!(matches!(
        a.error.unwrap(),
        SetError::NotReplaced(NotReplaced { references: 2, .. })
    ));
    assert_eq!(
        h.kernel.members("ipm4-l").unwrap(),
        ["ipm4-a"],
        "left alone"
    );
}

#[test]
fn held_sets_of_failed_policies_are_neither_changed_nor_deleted() {
    let mut h = Harness::new();
    h.desire(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    assert!(h.mgr.apply_updates().applied);
    // The policy now has a bad member: the compiler holds it.
    h.mgr.set_desired(Vec::new(), ["a".to_string()]);
    h.mgr.queue_resync();
    let out = h.mgr.apply_updates();
    assert!(out.deleted.is_empty());
    assert_eq!(h.kernel.members("ipm4-a").unwrap(), ["10.0.0.1"]);
}

#[test]
fn an_unchanged_shared_member_set_is_not_diffed() {
    let mut h = Harness::new();
    let sets = compile(&[policy("a", SetType::HashIp, &["10.0.0.1"])]);
    h.mgr.set_desired(sets.clone(), Vec::new());
    assert!(h.mgr.apply_updates().applied);
    let batches = h.kernel.stats().batches;
    // The same Arc again (a cached policy): nothing to send.
    h.mgr.set_desired(sets, Vec::new());
    assert!(h.mgr.apply_updates().applied);
    assert_eq!(h.kernel.stats().batches, batches);
}
