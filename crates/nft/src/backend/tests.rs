//! The reconciler over nft sets on the in-memory nf_tables model (which the conformance suite
//! holds to the kernel's behaviour), with faults and out-of-band changes.

use std::sync::Arc;
use std::time::Duration;

use ipsetmgr_ipset::{
    DEFAULT_MAX_ELEM, Family, HeaderOptions, Member, MemberSet, Naming, SetHeader, SetKind, SetType,
};
use ipsetmgr_sets::{
    ApplyOutcome, DesiredSet, ErrorKind, ReconcilerConfig, SetError, SetRef, SetsBackend, WriteKind,
};

use super::{NftReconciler, default_table, reconciler};
use crate::model::{Fault, ModelNft};
use crate::{NftBatchError, NftError, SetShape, TableFamily};

fn members(t: SetType, items: &[&str]) -> Vec<Member> {
    items
        .iter()
        .flat_map(|i| Member::parse_user(t, i).unwrap().members)
        .collect()
}

/// What a policy compiler hands a backend: policy `p` of type `t`, IPv4
/// (or family-less), members in user syntax; a list:set lists policies.
fn desired(p: &str, t: SetType, items: &[&str]) -> DesiredSet {
    desired_fam(p, t, Some(Family::V4), items)
}

fn desired_fam(p: &str, t: SetType, f: Option<Family>, items: &[&str]) -> DesiredSet {
    let naming = Naming::default();
    let family = f.filter(|_| t.has_family() || t == SetType::ListSet);
    let kind = SetKind::new(t, family);
    let ms: Vec<Member> = if t == SetType::ListSet {
        items
            .iter()
            .map(|m| Member::Set(naming.main_set_name(m, family).into()))
            .collect()
    } else {
        members(t, items)
    };
    DesiredSet {
        name: naming.main_set_name(p, family),
        policy: p.into(),
        header: SetHeader {
            kind,
            max_elem: if t == SetType::ListSet {
                8
            } else {
                DEFAULT_MAX_ELEM
            },
            hash_size: None,
            options: HeaderOptions::default(),
        },
        members: Arc::new(MemberSet::from_members(kind, ms)),
    }
}

fn backend() -> (NftReconciler<ModelNft>, ModelNft) {
    let m = ModelNft::new();
    let config = ReconcilerConfig {
        set_retry_base: Duration::from_secs(60),
        ..ReconcilerConfig::default()
    };
    let b = reconciler(m.clone(), default_table(), config).with_sleep(|_| {});
    (b, m)
}

/// The model's elements of `set` as `nft` prints them.
fn shown(m: &ModelNft, set: &str) -> Option<Vec<String>> {
    let mut dp = m.clone();
    let k = crate::NftDataplane::read_set(&mut dp, &default_table(), set).unwrap()?;
    Some(k.elements.unwrap().iter().map(|e| e.to_string()).collect())
}

/// What nft should hold for `items` of type `t` (the shape's own mapping).
fn expected(t: SetType, f: Option<Family>, items: &[&str]) -> Vec<String> {
    let shape = SetShape::new(t, f, &HeaderOptions::default(), DEFAULT_MAX_ELEM).unwrap();
    shape
        .elements(members(t, items))
        .unwrap()
        .iter()
        .map(|e| e.to_string())
        .collect()
}

/// The names of a list of sets.
fn names(sets: &[SetRef]) -> Vec<&str> {
    sets.iter().map(|s| s.name.as_str()).collect()
}

/// The sets an apply wrote, by name, and how.
fn written(o: &ApplyOutcome) -> Vec<(&str, WriteKind)> {
    o.written
        .iter()
        .map(|(s, k)| (s.name.as_str(), *k))
        .collect()
}

fn apply(b: &mut NftReconciler<ModelNft>) -> ipsetmgr_sets::ApplyOutcome {
    let o = b.apply_updates();
    assert!(o.applied, "{:?}", o.error);
    o
}

fn report_of(b: &NftReconciler<ModelNft>, name: &str) -> ipsetmgr_sets::SetReport {
    b.report()
        .into_iter()
        .find(|r| r.set.name == name)
        .unwrap_or_else(|| panic!("no report for {name}"))
}

#[test]
fn creates_in_one_transaction_then_writes_nothing() {
    let (mut b, m) = backend();
    assert_eq!(b.name(), "nft-model");
    b.set_desired(
        vec![
            desired("a", SetType::HashIp, &["10.0.0.1", "10.0.0.2"]),
            desired_fam("a", SetType::HashIp, Some(Family::V6), &["2001:db8::1"]),
            desired("p", SetType::HashIpPort, &["10.0.0.1,tcp:80"]),
        ],
        vec![],
    );
    let o = apply(&mut b);
    assert_eq!(m.stats().transactions, 1);
    let mut written = written(&o);
    written.sort();
    assert_eq!(
        written,
        [
            ("ipm4-a", WriteKind::Create),
            ("ipm4-p", WriteKind::Create),
            ("ipm6-a", WriteKind::Create),
        ]
    );
    assert_eq!(
        shown(&m, "ipm4-a").unwrap(),
        expected(SetType::HashIp, Some(Family::V4), &["10.0.0.1", "10.0.0.2"])
    );
    assert!(b.report().iter().all(|r| r.synced && r.problems == 0));
    let o = apply(&mut b);
    assert!(o.written.is_empty());
    b.queue_resync();
    let o = apply(&mut b);
    assert!(o.written.is_empty(), "{:?}", o.written);
    assert_eq!(m.stats().transactions, 1, "nothing more sent");
    assert!(b.report().iter().all(|r| r.problems == 0));
}

#[test]
fn member_change_is_a_delta() {
    let (mut b, m) = backend();
    b.set_desired(
        vec![desired("a", SetType::HashIp, &["10.0.0.1", "10.0.0.2"])],
        vec![],
    );
    apply(&mut b);
    b.set_desired(
        vec![desired("a", SetType::HashIp, &["10.0.0.2", "10.0.0.3"])],
        vec![],
    );
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-a", WriteKind::Delta)]);
    assert_eq!(
        shown(&m, "ipm4-a").unwrap(),
        expected(SetType::HashIp, Some(Family::V4), &["10.0.0.2", "10.0.0.3"])
    );
    assert_eq!(m.stats().transactions, 2);
    assert_eq!(
        report_of(&b, "ipm4-a").problems,
        0,
        "our own change is no drift"
    );
    // Every element replaced: a flush and the new ones, still one delta.
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.9"])], vec![]);
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-a", WriteKind::Delta)]);
    assert_eq!(shown(&m, "ipm4-a").unwrap(), vec!["10.0.0.9".to_string()]);
}

#[test]
fn held_sets_are_left_exactly_as_they_are() {
    let (mut b, m) = backend();
    b.set_desired(
        vec![
            desired("a", SetType::HashIp, &["10.0.0.1"]),
            desired("h", SetType::HashIp, &["10.0.0.9"]),
        ],
        vec![],
    );
    apply(&mut b);
    // The policy of h fails: it is held, not deleted nor changed.
    b.set_desired(
        vec![desired("a", SetType::HashIp, &["10.0.0.1"])],
        vec!["h".to_string()],
    );
    let o = apply(&mut b);
    assert!(o.deleted.is_empty());
    b.queue_resync();
    let o = apply(&mut b);
    assert!(o.deleted.is_empty(), "{:?}", o.deleted);
    assert_eq!(shown(&m, "ipm4-h").unwrap(), vec!["10.0.0.9".to_string()]);
    // A long policy's nft set (named in full, unlike its shortened ipset
    // name) is held by its policy's name too.
    let long = "a-policy-with-a-name-too-long-for-ipset";
    b.set_desired(vec![desired(long, SetType::HashIp, &["1.1.1.1"])], vec![]);
    apply(&mut b);
    let full = format!("ipm4-{long}");
    assert!(shown(&m, &full).is_some(), "the full policy name in nft");
    let short = Naming::default().main_set_name(long, Some(Family::V4));
    assert_ne!(short, full);
    b.set_desired(vec![], vec![long.to_string(), "h".to_string()]);
    let o = apply(&mut b);
    assert!(o.deleted.is_empty(), "{:?}", o.deleted);
    assert!(shown(&m, &full).is_some());
}

#[test]
fn one_bad_set_is_isolated_and_the_others_applied() {
    let (mut b, m) = backend();
    let mut full = desired(
        "full",
        SetType::HashIp,
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
    );
    full.header.max_elem = 2;
    b.set_desired(
        vec![
            desired("a", SetType::HashIp, &["10.0.0.1"]),
            full,
            // nft holds no ICMP type/code in a port field.
            desired("icmp", SetType::HashIpPort, &["10.0.0.1,icmp:ping"]),
            desired("z", SetType::HashNet, &["10.0.0.0/8"]),
        ],
        vec![],
    );
    let o = b.apply_updates();
    assert!(o.applied, "{:?}", o.error);
    assert!(shown(&m, "ipm4-a").is_some() && shown(&m, "ipm4-z").is_some());
    assert!(shown(&m, "ipm4-full").is_none());
    assert!(shown(&m, "ipm4-icmp").is_none());
    let r = report_of(&b, "ipm4-full");
    assert!(!r.synced);
    assert!(
        matches!(&r.error, Some(SetError::Kernel(e)) if e.kind() == ErrorKind::SetFull),
        "{:?}",
        r.error
    );
    let r = report_of(&b, "ipm4-icmp");
    let why = r.error.expect("an error").to_string();
    assert!(why.contains("ICMP"), "{why}");
    assert!(b.next_retry().is_some() && !b.retry_due());
    // A whole-transaction failure isolates nothing: retried with backoff.
    b.set_desired(
        vec![desired("a", SetType::HashIp, &["10.0.0.1", "10.0.0.5"])],
        vec![],
    );
    m.inject(Fault::FailNextApply(NftBatchError {
        op_index: None,
        element_index: None,
        error: NftError::Unavailable("busy".into()),
    }));
    let o = apply(&mut b);
    assert_eq!(o.attempts, 2);
    assert!(report_of(&b, "ipm4-a").synced);
}

#[test]
fn type_change_recreates_unless_a_rule_references_the_set() {
    let (mut b, m) = backend();
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.1"])], vec![]);
    apply(&mut b);
    b.set_desired(
        vec![desired("a", SetType::HashNet, &["10.0.0.0/8"])],
        vec![],
    );
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-a", WriteKind::Recreate)]);
    let t = m.table(&default_table()).unwrap();
    assert!(t.sets["ipm4-a"].spec.interval);
    assert!(m.add_rule_referencing(&default_table(), "ipm4-a"));
    b.queue_resync();
    apply(&mut b);
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.1"])], vec![]);
    let o = b.apply_updates();
    assert!(o.written.is_empty());
    let r = report_of(&b, "ipm4-a");
    assert!(
        matches!(r.error, Some(SetError::NotReplaced(ref n)) if n.references == 1),
        "{:?}",
        r.error
    );
    let t = m.table(&default_table()).unwrap();
    assert!(t.sets["ipm4-a"].spec.interval, "left as it was");
    assert_eq!(t.sets["ipm4-a"].references, 1);
    // Members of the same type still change under the rule.
    b.set_desired(
        vec![desired("a", SetType::HashNet, &["10.0.0.0/9"])],
        vec![],
    );
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-a", WriteKind::Delta)]);
}

#[test]
fn drift_is_repaired_and_counted() {
    let (mut b, m) = backend();
    let t = default_table();
    b.set_desired(
        vec![
            desired("a", SetType::HashIp, &["10.0.0.1", "10.0.0.2"]),
            desired("b", SetType::HashIp, &["10.0.0.3"]),
            desired("c", SetType::HashIp, &["10.0.0.4"]),
        ],
        vec![],
    );
    apply(&mut b);
    let snapshot = m.table(&t).unwrap();
    let extra = snapshot.sets["ipm4-b"]
        .elements
        .keys()
        .next()
        .unwrap()
        .clone();
    m.tamper(&t, |tt| {
        let a = tt.sets.get_mut("ipm4-a").unwrap();
        let first = a.elements.keys().next().unwrap().clone();
        a.elements.remove(&first); // one missing
        // ... and one extra (10.0.0.3's bytes), in a.
        a.elements.insert(extra.clone(), None);
        tt.sets.get_mut("ipm4-b").unwrap().elements.clear(); // flushed
        tt.sets.remove("ipm4-c"); // deleted
    });
    b.queue_resync();
    apply(&mut b);
    let r = report_of(&b, "ipm4-a");
    assert_eq!((r.drift.missing, r.drift.extra, r.problems), (1, 1, 2));
    assert_eq!(report_of(&b, "ipm4-b").drift.missing, 1);
    let c = report_of(&b, "ipm4-c");
    assert!(c.drift.rewritten && c.problems == 1);
    let without_handles = |mut tt: crate::model::ModelTable| {
        for s in tt.sets.values_mut() {
            s.handle = 0;
        }
        tt
    };
    assert_eq!(
        without_handles(m.table(&t).unwrap()),
        without_handles(snapshot.clone()),
        "all repaired"
    );
    // The table deleted out of band (`nft delete table`) is created again.
    assert!(m.delete_table(&t));
    b.queue_resync();
    apply(&mut b);
    assert!(
        b.report().iter().all(|r| r.drift.rewritten && r.synced),
        "{:?}",
        b.report()
    );
    assert_eq!(
        without_handles(m.table(&t).unwrap()),
        without_handles(snapshot)
    );
    b.queue_resync();
    apply(&mut b);
    assert!(b.report().iter().all(|r| r.problems == 0), "repaired");
}

#[test]
fn deletions_in_use_are_reported_and_retried() {
    let (mut b, m) = backend();
    let t = default_table();
    b.set_desired(
        vec![
            desired("a", SetType::HashIp, &["10.0.0.1"]),
            desired("b", SetType::HashIp, &["10.0.0.2"]),
        ],
        vec![],
    );
    apply(&mut b);
    assert!(m.add_rule_referencing(&t, "ipm4-b"));
    b.set_desired(vec![], vec![]);
    let o = apply(&mut b);
    assert_eq!(names(&o.deleted), ["ipm4-a"]);
    let d = b.deletion_report();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].set.name, "ipm4-b");
    assert_eq!(d[0].error.kind(), ErrorKind::InUse, "{:?}", d[0]);
    assert!(shown(&m, "ipm4-b").is_some(), "the set stays");
    // The rule is removed: the next resync deletes the set.
    m.tamper(&t, |tt| {
        tt.sets.get_mut("ipm4-b").unwrap().references = 0;
        tt.chains.clear();
    });
    b.queue_resync();
    let o = apply(&mut b);
    assert_eq!(names(&o.deleted), ["ipm4-b"]);
    assert!(b.deletion_report().is_empty());
    assert!(m.table(&t).is_some(), "the table is never deleted");
    // Without pruning, unwanted sets are only reported.
    let mut keep = reconciler(
        m.clone(),
        t.clone(),
        ReconcilerConfig {
            prune: false,
            ..ReconcilerConfig::default()
        },
    );
    b.set_desired(vec![desired("k", SetType::HashIp, &["10.0.0.7"])], vec![]);
    apply(&mut b);
    keep.set_desired(vec![], vec![]);
    let o = keep.apply_updates();
    assert!(o.deleted.is_empty());
    assert_eq!(names(&keep.unwanted()), ["ipm4-k"]);
}

#[test]
fn foreign_sets_and_chains_are_never_touched() {
    let (mut b, m) = backend();
    let t = default_table();
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.1"])], vec![]);
    apply(&mut b);
    let spec = m.table(&t).unwrap().sets["ipm4-a"].clone();
    m.tamper(&t, |tt| {
        tt.sets.insert("theirs".into(), spec.clone());
        tt.sets.insert("ipmt-1".into(), spec.clone());
        tt.chains.insert("input".into());
        tt.others.insert("amap".into());
    });
    let before = m.table(&t).unwrap();
    b.set_desired(vec![], vec![]);
    b.queue_resync();
    apply(&mut b);
    let after = m.table(&t).unwrap();
    assert!(!after.sets.contains_key("ipm4-a"));
    assert_eq!(after.sets["theirs"], before.sets["theirs"]);
    assert_eq!(after.sets["ipmt-1"], before.sets["ipmt-1"]);
    assert_eq!(after.chains, before.chains);
    assert_eq!(after.others, before.others);
    let listed = b.list().unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

#[test]
fn nomatch_becomes_intervals() {
    let (mut b, m) = backend();
    let items = ["10.0.0.0/8", "10.1.0.0/16 nomatch"];
    b.set_desired(vec![desired("n", SetType::HashNet, &items)], vec![]);
    apply(&mut b);
    let t = m.table(&default_table()).unwrap();
    assert!(t.sets["ipm4-n"].spec.interval);
    assert_eq!(
        shown(&m, "ipm4-n").unwrap(),
        vec!["10.0.0.0/16", "10.2.0.0-10.255.255.255"]
    );
    let listed = b.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].set.name, "inet ipsetmgr ipm4-n");
    let reported = &b.report()[0].set;
    assert_eq!(reported.name, "ipm4-n");
    assert_eq!(
        b.shown_name(reported),
        listed[0].set.name,
        "as apply shows it"
    );
    assert_eq!(listed[0].role, "main");
    assert_eq!(listed[0].members, 2);
}

/// `sets`, `apply` and the plan name a set after the table it is in, so
/// that a configured table is named too.
#[test]
fn sets_are_shown_after_their_table() {
    let m = ModelNft::new();
    let filter = crate::Table::new(TableFamily::Ip, "filter");
    let mut b = reconciler(m.clone(), filter.clone(), ReconcilerConfig::default());
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.1"])], vec![]);
    assert_eq!(
        b.plan().unwrap(),
        ["create ip filter ipm4-a with 1 elements"]
    );
    apply(&mut b);
    assert!(m.table(&filter).unwrap().sets.contains_key("ipm4-a"));
    assert!(m.table(&default_table()).is_none());
    let listed = b.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].set.name, "ip filter ipm4-a");
    let reported: Vec<String> = b.report().iter().map(|r| b.shown_name(&r.set)).collect();
    assert_eq!(reported, ["ip filter ipm4-a"]);
}

#[test]
fn list_set_is_flattened_or_refused() {
    let (mut b, m) = backend();
    let x = desired(
        "x",
        SetType::HashNet,
        &["10.0.0.0/8", "10.1.0.0/16 nomatch"],
    );
    let y = desired("y", SetType::HashNet, &["10.1.2.0/24", "192.168.0.0/16"]);
    let l = desired("l", SetType::ListSet, &["x", "y"]);
    b.set_desired(vec![x.clone(), y.clone(), l], vec![]);
    apply(&mut b);
    // 10.1.2.0/24 matches through y although x cuts 10.1.0.0/16 out.
    assert_eq!(
        shown(&m, "ipm4-l").unwrap(),
        vec![
            "10.0.0.0/16",
            "10.1.2.0/24",
            "10.2.0.0-10.255.255.255",
            "192.168.0.0/16"
        ]
    );
    assert!(report_of(&b, "ipm4-l").synced);
    // A member change of a listed set reaches the flattened list.
    let y2 = desired("y", SetType::HashNet, &["192.168.0.0/16"]);
    let l = desired("l", SetType::ListSet, &["x", "y"]);
    b.set_desired(vec![x.clone(), y2, l], vec![]);
    let o = apply(&mut b);
    assert!(
        written(&o).contains(&("ipm4-l", WriteKind::Delta)),
        "{:?}",
        o.written
    );
    // Mixed element types: a per-set error; the others go through.
    let ip = desired("ip", SetType::HashIp, &["10.9.9.9"]);
    let mixed = desired("m", SetType::ListSet, &["x", "ip"]);
    b.set_desired(vec![x, ip, mixed], vec![]);
    let o = b.apply_updates();
    assert!(o.applied);
    assert!(shown(&m, "ipm4-ip").is_some());
    assert!(shown(&m, "ipm4-m").is_none());
    let why = report_of(&b, "ipm4-m").error.unwrap().to_string();
    assert!(why.contains("different element types"), "{why}");
}

#[test]
fn plan_is_read_only_and_stale_beliefs_are_reread() {
    let (mut b, m) = backend();
    b.set_desired(
        vec![desired("a", SetType::HashIp, &["10.0.0.1", "10.0.0.3"])],
        vec![],
    );
    let lines = b.plan().unwrap();
    assert_eq!(lines, vec!["create inet ipsetmgr ipm4-a with 2 elements"]);
    assert_eq!(m.stats().transactions, 0);
    assert!(m.table(&default_table()).is_none(), "plan creates nothing");
    apply(&mut b);
    // Someone deletes the element we are about to delete: the transaction
    // fails, the set is read again and the retry succeeds.
    m.tamper(&default_table(), |t| {
        t.sets.get_mut("ipm4-a").unwrap().elements.clear();
    });
    b.set_desired(
        vec![desired("a", SetType::HashIp, &["10.0.0.2", "10.0.0.3"])],
        vec![],
    );
    assert_eq!(
        b.plan().unwrap(),
        vec!["update inet ipsetmgr ipm4-a: add 1, delete 1 elements"]
    );
    let o = apply(&mut b);
    assert!(o.attempts >= 2);
    assert_eq!(
        shown(&m, "ipm4-a").unwrap(),
        vec!["10.0.0.2".to_string(), "10.0.0.3".to_string()]
    );
    assert_eq!(report_of(&b, "ipm4-a").problems, 0, "a re-read is no drift");
    assert!(report_of(&b, "ipm4-a").error.is_none());
    // Another table family and name work the same.
    let other = crate::Table::new(TableFamily::Ip, "filter");
    let mut b2 = reconciler(m.clone(), other.clone(), ReconcilerConfig::default());
    b2.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.1"])], vec![]);
    assert!(b2.apply_updates().applied);
    assert!(m.table(&other).unwrap().sets.contains_key("ipm4-a"));
}

#[test]
fn a_failed_resync_changes_nothing_and_is_retried() {
    let (mut b, m) = backend();
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.1"])], vec![]);
    apply(&mut b);
    b.set_desired(vec![desired("a", SetType::HashIp, &["10.0.0.2"])], vec![]);
    b.queue_resync();
    for _ in 0..10 {
        m.inject(Fault::FailNextList(NftError::Unavailable("down".into())));
    }
    let o = b.apply_updates();
    assert!(!o.applied);
    assert!(
        matches!(
            o.error,
            Some(ipsetmgr_sets::ApplyError::Resync(ref e)) if e.kind() == ErrorKind::Unavailable
        ),
        "{:?}",
        o.error
    );
    assert_eq!(
        shown(&m, "ipm4-a").unwrap(),
        vec!["10.0.0.1".to_string()],
        "fail static"
    );
    // The kernel answers again: the resync and the change go through.
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-a", WriteKind::Delta)]);
    assert_eq!(shown(&m, "ipm4-a").unwrap(), vec!["10.0.0.2".to_string()]);
}

#[test]
fn comments_and_size_changes_are_deltas() {
    let (mut b, m) = backend();
    let mut d = desired("c", SetType::HashIp, &["10.0.0.1 comment:one"]);
    d.header.options.comment = true;
    b.set_desired(vec![d.clone()], vec![]);
    apply(&mut b);
    let mut d2 = desired("c", SetType::HashIp, &["10.0.0.1 comment:two"]);
    d2.header.options.comment = true;
    d2.header.max_elem = 10;
    b.set_desired(vec![d2], vec![]);
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-c", WriteKind::Delta)]);
    let t = m.table(&default_table()).unwrap();
    let s = &t.sets["ipm4-c"];
    assert_eq!(s.spec.size, Some(10));
    let comments: Vec<String> = s
        .elements
        .values()
        .map(|c| c.as_ref().unwrap().as_str().to_string())
        .collect();
    assert_eq!(comments, ["two"]);
    b.queue_resync();
    let o = apply(&mut b);
    assert!(o.written.is_empty());
    assert_eq!(report_of(&b, "ipm4-c").problems, 0);
}

#[test]
fn a_prefix_nft_cannot_name_is_a_per_set_error() {
    let m = ModelNft::new();
    let naming = Naming::new("1pm").unwrap();
    let config = ReconcilerConfig {
        naming: naming.clone(),
        ..ReconcilerConfig::default()
    };
    let mut b = reconciler(m.clone(), default_table(), config).with_sleep(|_| {});
    let mut d = desired("a", SetType::HashIp, &["10.0.0.1"]);
    d.name = naming.main_set_name("a", Some(Family::V4));
    b.set_desired(vec![d], vec![]);
    let o = b.apply_updates();
    assert!(o.applied);
    assert_eq!(o.attempts, 1, "no transaction tried and failed");
    assert_eq!(m.stats().transactions, 0);
    let why = b.report()[0].error.clone().unwrap().to_string();
    assert!(why.contains("not a set name nf_tables takes"), "{why}");
}

#[test]
fn a_set_at_its_limit_grows_and_shrinks_with_its_members() {
    let (mut b, m) = backend();
    let sized = |items: &[&str], max_elem| {
        let mut d = desired("grow", SetType::HashIp, items);
        d.header.max_elem = max_elem;
        d
    };
    let five = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"];
    b.set_desired(vec![sized(&five, 5)], vec![]);
    apply(&mut b);
    let eight = [&five[..], &["10.0.0.6", "10.0.0.7", "10.0.0.8"]].concat();
    b.set_desired(vec![sized(&eight, 16)], vec![]);
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-grow", WriteKind::Recreate)]);
    assert!(report_of(&b, "ipm4-grow").synced);
    assert_eq!(
        shown(&m, "ipm4-grow"),
        Some(expected(SetType::HashIp, Some(Family::V4), &eight))
    );
    // Down again, below what it held: the deletions make room first.
    b.set_desired(vec![sized(&five[..2], 2)], vec![]);
    apply(&mut b);
    assert!(report_of(&b, "ipm4-grow").synced);
    assert_eq!(
        shown(&m, "ipm4-grow"),
        Some(expected(SetType::HashIp, Some(Family::V4), &five[..2]))
    );
    let mut dp = m.clone();
    let k = crate::NftDataplane::read_set(&mut dp, &default_table(), "ipm4-grow")
        .unwrap()
        .unwrap();
    assert_eq!(k.spec.and_then(|s| s.size), Some(2));
    // Referenced by a rule: grown in place, its size committed first.
    assert!(m.add_rule_referencing(&default_table(), "ipm4-grow"));
    b.queue_resync();
    b.set_desired(vec![sized(&eight, 16)], vec![]);
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-grow", WriteKind::Delta)]);
    assert!(report_of(&b, "ipm4-grow").synced);
    assert_eq!(
        shown(&m, "ipm4-grow"),
        Some(expected(SetType::HashIp, Some(Family::V4), &eight))
    );
}

#[test]
fn a_list_set_over_a_held_policy_is_kept_as_the_kernel_holds_it() {
    let (mut b, m) = backend();
    let feed = desired("feed", SetType::HashNet, &["192.0.2.0/24"]);
    let local = desired("local", SetType::HashNet, &["10.0.0.0/8"]);
    let all = desired("all", SetType::ListSet, &["feed", "local"]);
    b.set_desired(vec![feed, local.clone(), all.clone()], vec![]);
    apply(&mut b);
    let before = shown(&m, "ipm4-all").expect("the list");
    assert_eq!(before.len(), 2, "{before:?}");
    // The feed fails: its policy is held, the list still names it.
    b.set_desired(vec![local, all], vec!["feed".into()]);
    apply(&mut b);
    assert_eq!(shown(&m, "ipm4-all"), Some(before));
    assert!(shown(&m, "ipm4-feed").is_some(), "a held set stays");
    let why = report_of(&b, "ipm4-all")
        .error
        .expect("an error")
        .to_string();
    assert!(why.contains("whose policy is held"), "{why}");
}

/// hash:net,iface can need more ranges than it has members: each interface
/// loses the networks only other interfaces have (docs/nftables.md), so
/// `0.0.0.0/0,eth0` with two networks on vlan0 is three ranges for eth0
/// and two for vlan0. A policy whose members fit `maxElem` fits the nft
/// set too: its size is the ranges when they are more.
#[test]
fn an_iface_set_holds_more_ranges_than_members() {
    let (mut b, m) = backend();
    let items = ["0.0.0.0/0,eth0", "10.1.0.0/16,vlan0", "10.3.0.0/16,vlan0"];
    let mut d = desired("up", SetType::HashNetIface, &items);
    d.header.max_elem = 3;
    b.set_desired(vec![d], vec![]);
    apply(&mut b);
    let r = report_of(&b, "ipm4-up");
    assert!(r.synced, "{:?}", r.error);
    let want = expected(SetType::HashNetIface, Some(Family::V4), &items);
    assert_eq!(want.len(), 5, "{want:?}");
    assert_eq!(shown(&m, "ipm4-up"), Some(want));
}

/// A list:set matches what any set it lists matches (the kernel tests them
/// one by one), so hash:net,iface's rule (the most specific network decides
/// whatever its interface) holds within each listed set, not across them:
/// 10.2.0.1 on eth0 is in x, so in the list, although y's vlan0 network is
/// more specific.
#[test]
fn a_list_of_iface_sets_applies_the_iface_rule_per_listed_set() {
    let (mut b, m) = backend();
    let x = desired("x", SetType::HashNetIface, &["10.0.0.0/8,eth0"]);
    let y = desired(
        "y",
        SetType::HashNetIface,
        &["10.2.0.0/16,vlan0", "10.0.0.0/8,lo", "10.1.0.0/16,eth0"],
    );
    let l = desired("l", SetType::ListSet, &["x", "y"]);
    b.set_desired(vec![x, y, l], vec![]);
    apply(&mut b);
    assert!(report_of(&b, "ipm4-l").synced);
    // Within y, lo loses 10.1.0.0/16 (eth0's) and 10.2.0.0/16 (vlan0's).
    assert_eq!(
        shown(&m, "ipm4-l").unwrap(),
        vec![
            "10.0.0.0/8 . \"eth0\"",
            "10.0.0.0/16 . \"lo\"",
            "10.2.0.0/16 . \"vlan0\"",
            "10.3.0.0-10.255.255.255 . \"lo\"",
        ]
    );
}
