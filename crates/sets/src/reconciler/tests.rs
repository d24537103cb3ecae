//! The reconciler's own rules, over a small in-memory kernel whose writes
//! and deletions can be made to fail (each kernel adapter's tests run it
//! over that kernel's model and the real kernel too).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ipsetmgr_ipset::{Family, Member, MemberSet, SetHeader, SetKind, SetType};

use super::*;
use crate::kernel::{BatchFailure, Owned, Planned};
use crate::{BackendId, ErrorKind, ListedSet, WriteKind};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct FakeError(String);

fn error(kind: ErrorKind, text: &str) -> KernelError {
    KernelError::new(kind, FakeError(text.into()))
}

/// What the fake kernel holds and how it misbehaves, shared with the test.
#[derive(Default)]
struct World {
    sets: BTreeMap<String, BTreeSet<String>>,
    /// A write of this set fails with this error (about the set or not).
    fail_write: Option<(String, ErrorKind, bool)>,
    /// Deleting these sets fails with this kind.
    fail_delete: BTreeMap<String, ErrorKind>,
    batches: usize,
    /// The kernel says nothing changed since our last read or write.
    quiet: bool,
    /// Listings and set reads, in order.
    reads: Vec<String>,
}

struct Fake {
    world: Arc<Mutex<World>>,
    naming: ipsetmgr_ipset::Naming,
}

struct FakeSet {
    want: BTreeSet<String>,
    have: Option<BTreeSet<String>>,
}

impl Kernel for Fake {
    type Set = FakeSet;
    type Read = BTreeSet<String>;

    fn id(&self) -> BackendId {
        BackendId {
            name: "fake",
            kind: "fake",
        }
    }
    fn naming(&self) -> &ipsetmgr_ipset::Naming {
        &self.naming
    }
    fn kernel_name(&self, d: &DesiredSet) -> String {
        d.name.clone()
    }
    fn policy_names(&self, policy: &str) -> Vec<String> {
        vec![self.naming.main_set_name(policy, Some(Family::V4))]
    }
    fn list_owned(&mut self) -> Result<Vec<Owned>, KernelError> {
        let mut w = self.world.lock().unwrap();
        w.reads.push("(list)".into());
        Ok(w.sets
            .keys()
            .map(|n| Owned {
                name: n.clone(),
                leftover: n.starts_with("ipmt-"),
            })
            .collect())
    }
    fn read(&mut self, name: &str) -> Result<Option<BTreeSet<String>>, KernelError> {
        let mut w = self.world.lock().unwrap();
        w.reads.push(name.into());
        Ok(w.sets.get(name).cloned())
    }
    fn unchanged_since_last_read(&mut self) -> bool {
        self.world.lock().unwrap().quiet
    }
    fn new_set(&mut self, _: &str, d: &DesiredSet, _: &Context<'_>) -> FakeSet {
        FakeSet {
            want: d.members.iter().map(|m| m.to_string()).collect(),
            have: None,
        }
    }
    fn update_set(&mut self, s: &mut FakeSet, _: &str, d: &DesiredSet, _: &Context<'_>) -> bool {
        let want: BTreeSet<String> = d.members.iter().map(|m| m.to_string()).collect();
        let changed = want != s.want;
        s.want = want;
        changed
    }
    fn believe_absent(&self, s: &mut FakeSet) {
        s.have = None;
    }
    fn absorb(&self, _: &str, s: &mut FakeSet, read: Option<BTreeSet<String>>) -> Drift {
        let before = s.have.take().unwrap_or_else(|| s.want.clone());
        let drift = match &read {
            Some(r) => Drift {
                missing: before.difference(r).count(),
                extra: r.difference(&before).count(),
                rewritten: false,
            },
            None => Drift::default(),
        };
        s.have = read;
        drift
    }
    fn in_sync(&self, s: &FakeSet) -> bool {
        s.have.as_ref() == Some(&s.want)
    }
    fn member_count(&self, s: &FakeSet) -> usize {
        s.want.len()
    }
    fn plan(&mut self, sets: &mut Sets<FakeSet>, due: Vec<String>) -> Planned {
        Planned {
            writes: due
                .into_iter()
                .map(|n| {
                    let kind = match sets[&n].set.have {
                        None => WriteKind::Create,
                        Some(_) => WriteKind::Delta,
                    };
                    (n, kind)
                })
                .collect(),
            refused: Vec::new(),
        }
    }
    fn write(
        &mut self,
        sets: &mut Sets<FakeSet>,
        writes: &[(String, WriteKind)],
    ) -> Result<(), Box<BatchFailure>> {
        let mut w = self.world.lock().unwrap();
        w.batches += 1;
        if let Some((set, kind, about)) = w.fail_write.clone()
            && writes.iter().any(|(n, _)| *n == set)
        {
            return Err(Box::new(BatchFailure {
                error: error(kind, &format!("{set} refused")),
                set: Some(set),
                element: None,
                about_set: about,
                reread: Vec::new(),
                partly_written: Vec::new(),
                leftovers: Vec::new(),
            }));
        }
        for (name, _) in writes {
            w.sets.insert(name.clone(), sets[name].set.want.clone());
        }
        Ok(())
    }
    fn committed(&self, s: &mut FakeSet) {
        s.have = Some(s.want.clone());
    }
    fn delete(&mut self, names: &[String]) -> Vec<Result<(), KernelError>> {
        let mut guard = self.world.lock().unwrap();
        let w = &mut *guard;
        names
            .iter()
            .map(|n| match w.fail_delete.get(n) {
                Some(kind) => Err(error(*kind, &format!("{n} not deleted"))),
                None if w.sets.remove(n).is_some() => Ok(()),
                None => Err(error(ErrorKind::SetMissing, n)),
            })
            .collect()
    }
    fn describe(&mut self, _: &Sets<FakeSet>, name: &str) -> String {
        format!("write {name}")
    }
    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        Ok(Vec::new())
    }
}

fn desired(policy: &str, ips: &[&str]) -> DesiredSet {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let members = ips.iter().map(|s| Member::Ip(s.parse().unwrap()));
    DesiredSet {
        name: format!("ipm4-{policy}"),
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

fn reconciler(config: ReconcilerConfig) -> (Reconciler<Fake>, Arc<Mutex<World>>) {
    let world = Arc::new(Mutex::new(World::default()));
    let fake = Fake {
        world: world.clone(),
        naming: config.naming.clone(),
    };
    (Reconciler::new(fake, config).with_sleep(|_| {}), world)
}

fn report<'a>(r: &'a [SetReport], name: &str) -> &'a SetReport {
    r.iter().find(|s| s.set.name == name).expect(name)
}

#[test]
fn a_set_specific_failure_isolates_that_set_at_once_and_the_rest_is_applied() {
    let (mut r, world) = reconciler(ReconcilerConfig::default());
    world.lock().unwrap().fail_write = Some(("ipm4-b".into(), ErrorKind::SetFull, true));
    r.set_desired(
        vec![desired("a", &["10.0.0.1"]), desired("b", &["10.0.0.2"])],
        [],
    );
    let out = r.apply_updates();
    assert!(out.applied, "{:?}", out.error);
    assert_eq!(
        out.attempts, 2,
        "isolating is progress: the next try at once"
    );
    let reports = r.report();
    assert!(report(&reports, "ipm4-a").synced);
    let b = report(&reports, "ipm4-b");
    assert!(!b.synced);
    assert_eq!(b.error.as_ref().unwrap().to_string(), "ipm4-b refused");
    assert!(
        r.next_retry().is_some() && !r.retry_due(),
        "retried on its own backoff"
    );
    // New content is tried at once, whatever the backoff says.
    world.lock().unwrap().fail_write = None;
    r.set_desired(
        vec![desired("a", &["10.0.0.1"]), desired("b", &["10.0.0.3"])],
        [],
    );
    assert!(r.retry_due());
    assert!(r.apply_updates().applied);
    assert!(r.report().iter().all(|s| s.synced && s.error.is_none()));
    assert_eq!(
        world.lock().unwrap().sets["ipm4-b"],
        BTreeSet::from(["10.0.0.3".into()])
    );
}

#[test]
fn an_error_not_about_the_set_isolates_it_only_when_it_repeats() {
    let (mut r, world) = reconciler(ReconcilerConfig::default());
    world.lock().unwrap().fail_write = Some(("ipm4-b".into(), ErrorKind::Other, false));
    r.set_desired(
        vec![desired("a", &["10.0.0.1"]), desired("b", &["10.0.0.2"])],
        [],
    );
    let out = r.apply_updates();
    assert!(out.applied);
    assert_eq!(out.attempts, ISOLATE_AFTER_REPEATS + 1);
    assert!(report(&r.report(), "ipm4-a").synced);
    assert!(report(&r.report(), "ipm4-b").error.is_some());
}

#[test]
fn held_policies_sets_are_neither_written_nor_deleted() {
    let (mut r, world) = reconciler(ReconcilerConfig::default());
    world
        .lock()
        .unwrap()
        .sets
        .insert("ipm4-held".into(), BTreeSet::from(["192.0.2.1".into()]));
    world
        .lock()
        .unwrap()
        .sets
        .insert("ipm4-gone".into(), BTreeSet::new());
    r.set_desired(vec![desired("a", &["10.0.0.1"])], ["held".to_string()]);
    let out = r.apply_updates();
    let deleted: Vec<&str> = out.deleted.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(deleted, ["ipm4-gone"]);
    assert!(world.lock().unwrap().sets.contains_key("ipm4-held"));
}

#[test]
fn deletions_retry_what_is_in_use_while_others_go_and_leftovers_always_go() {
    let config = ReconcilerConfig {
        prune: false,
        ..ReconcilerConfig::default()
    };
    let (mut r, world) = reconciler(config);
    for n in ["ipm4-old", "ipmt-1"] {
        world.lock().unwrap().sets.insert(n.into(), BTreeSet::new());
    }
    r.set_desired(vec![], []);
    let out = r.apply_updates();
    let names = |v: &[crate::SetRef]| v.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&out.temp_deleted),
        ["ipmt-1"],
        "leftovers go without --prune"
    );
    assert!(out.deleted.is_empty());
    assert_eq!(names(&r.unwanted()), ["ipm4-old"]);

    let (mut r, world) = reconciler(ReconcilerConfig::default());
    for n in ["ipm4-a", "ipm4-b"] {
        world.lock().unwrap().sets.insert(n.into(), BTreeSet::new());
    }
    world
        .lock()
        .unwrap()
        .fail_delete
        .insert("ipm4-b".into(), ErrorKind::InUse);
    r.set_desired(vec![], []);
    let out = r.apply_updates();
    assert_eq!(names(&out.deleted), ["ipm4-a"]);
    let d = r.deletion_report();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].set.name.as_str(), d[0].error.kind()),
        ("ipm4-b", ErrorKind::InUse)
    );
    // Freed: the next resync deletes it and forgets the error.
    world.lock().unwrap().fail_delete.clear();
    r.queue_resync();
    assert_eq!(names(&r.apply_updates().deleted), ["ipm4-b"]);
    assert!(r.deletion_report().is_empty());
}

#[test]
fn a_full_resync_counts_and_repairs_drift() {
    let (mut r, world) = reconciler(ReconcilerConfig::default());
    r.set_desired(vec![desired("a", &["10.0.0.1", "10.0.0.2"])], []);
    assert!(r.apply_updates().applied);
    let batches = world.lock().unwrap().batches;
    // Nothing changed: no batch at all.
    r.queue_resync();
    assert!(r.apply_updates().applied);
    assert_eq!(world.lock().unwrap().batches, batches);
    assert_eq!(r.report()[0].problems, 0);
    // Out of band: one member gone, one added.
    world.lock().unwrap().sets.insert(
        "ipm4-a".into(),
        BTreeSet::from(["10.0.0.1".into(), "192.0.2.9".into()]),
    );
    r.queue_resync();
    assert!(r.apply_updates().applied);
    let rep = &r.report()[0];
    assert_eq!(
        (rep.drift.missing, rep.drift.extra, rep.problems),
        (1, 1, 2)
    );
    assert!(rep.synced && rep.last_sync.is_some());
    assert_eq!(
        world.lock().unwrap().sets["ipm4-a"],
        BTreeSet::from(["10.0.0.1".into(), "10.0.0.2".into()])
    );
}

#[test]
fn a_quiet_resync_keeps_what_it_believes_and_reads_only_sets_never_read() {
    let (mut r, world) = reconciler(ReconcilerConfig::default());
    world
        .lock()
        .unwrap()
        .sets
        .insert("ipm4-x".into(), BTreeSet::from(["10.9.9.9".into()]));
    r.set_desired(vec![desired("a", &["10.0.0.1"])], []);
    let out = r.apply_updates();
    assert!(out.applied && out.resyncs_skipped.is_empty(), "{out:?}");
    // The kernel has not changed: a resync lists and reads nothing.
    world.lock().unwrap().quiet = true;
    world.lock().unwrap().reads.clear();
    r.queue_resync();
    let out = r.apply_updates();
    assert_eq!(out.resyncs_skipped.len(), 1, "{out:?}");
    assert_eq!(out.resyncs_skipped[0].name, "fake");
    assert!(world.lock().unwrap().reads.is_empty());
    assert!(r.report().iter().all(|s| s.synced && s.problems == 0));
    // A set newly desired that the kernel may hold is read all the same
    // (its content was never read), and only it.
    r.queue_resync();
    r.set_desired(
        vec![desired("a", &["10.0.0.1"]), desired("x", &["10.0.0.2"])],
        [],
    );
    let out = r.apply_updates();
    assert!(out.applied, "{out:?}");
    assert_eq!(out.resyncs_skipped.len(), 1);
    assert_eq!(world.lock().unwrap().reads, ["ipm4-x"]);
    assert_eq!(
        world.lock().unwrap().sets["ipm4-x"],
        BTreeSet::from(["10.0.0.2".into()])
    );
    // A kernel that changed is listed and read in full.
    world.lock().unwrap().quiet = false;
    world.lock().unwrap().reads.clear();
    r.queue_resync();
    let out = r.apply_updates();
    assert!(out.resyncs_skipped.is_empty());
    assert_eq!(world.lock().unwrap().reads, ["(list)", "ipm4-a", "ipm4-x"]);
}
