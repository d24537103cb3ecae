//! Quiet resyncs against the real kernel (issue 34; docs/architecture.md,
//! "Quiet resyncs"): over the netlink backend a full resync reads no set
//! while the ruleset generation has not moved since our own last read or
//! write, and any change by anyone else (an element added by `nft` to one
//! of our sets, a table of its own) still makes it read and repair; a
//! batch made against a generation that moved is refused and retried after
//! a read. Each test in its own fresh network namespace (the conformance
//! suite's runner: without root a test skips, under `CI=true` it fails),
//! with `nft` as the one who changes things behind our back.

#[macro_use]
mod conformance;

use conformance::expected;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ipsetmgr_ipset::{Family, SetType};
use ipsetmgr_nft::backend::{NftReconciler, default_table, reconciler};
use ipsetmgr_nft::cli::CliNft;
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{NftBatchError, NftDataplane, NftError, NftKernelSet, NftOp, SetShape, Table};
use ipsetmgr_sets::{ApplyOutcome, DesiredSet, ReconcilerConfig};

macro_rules! netlink_tests {
    ($($name:ident),* $(,)?) => {
        mod netlink {
            $(
                #[test]
                fn $name() {
                    $crate::conformance::run(
                        concat!("netlink::", stringify!($name)),
                        $crate::conformance::Mode::Kernel,
                        $crate::conformance::netlink,
                        $crate::$name,
                    );
                }
            )*
        }
    };
}

netlink_tests!(
    an_idle_resync_after_our_own_write_reads_nothing,
    an_element_added_out_of_band_is_still_found_and_repaired,
    a_change_in_another_table_makes_the_resync_read,
    a_batch_against_a_moved_generation_is_refused_and_retried,
    the_kernel_refuses_a_stale_generation_and_commits_a_current_one,
);

/// The netlink backend, counting the listings and reads it does.
struct Counting {
    inner: NetlinkNft,
    reads: Arc<AtomicUsize>,
}

impl NftDataplane for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn apply(
        &mut self,
        table: &Table,
        ops: &[NftOp<'_>],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<(), NftBatchError> {
        self.inner.apply(table, ops, owned)
    }
    fn list_sets(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, NftError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.list_sets(table, owned)
    }
    fn read_set(&mut self, table: &Table, name: &str) -> Result<Option<NftKernelSet>, NftError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_set(table, name)
    }
    fn table_has_foreign_objects(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<bool, NftError> {
        self.inner.table_has_foreign_objects(table, owned)
    }
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.inner.generation()
    }
    fn expect_generation(&mut self, generation: Option<u32>) {
        self.inner.expect_generation(generation)
    }
    fn expected_generation(&self) -> Option<u32> {
        self.inner.expected_generation()
    }
}

type Backend = NftReconciler<Counting>;

/// A reconciler over the netlink backend (opened in the test's netns), and
/// its count of listings and reads.
fn backend() -> (Backend, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let dp = Counting {
        inner: NetlinkNft::new().expect("a NETLINK_NETFILTER socket"),
        reads: reads.clone(),
    };
    let b = reconciler(dp, default_table(), ReconcilerConfig::default()).with_sleep(|_| {});
    (b, reads)
}

fn desired(p: &str, items: &[&str]) -> DesiredSet {
    conformance::desired(p, SetType::HashIp, Family::V4, items)
}

/// The set's elements per `nft -j list set`.
fn kernel_elements(set: &str) -> Option<Vec<String>> {
    let k = CliNft::new().read_set(&default_table(), set).unwrap()?;
    Some(k.elements?.iter().map(|e| e.to_string()).collect())
}

fn nft(args: &[&str]) {
    let out = Command::new("nft").args(args).output().expect("run nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn apply(b: &mut Backend) -> ApplyOutcome {
    let o = b.apply_updates();
    assert!(o.applied, "{:?}", o.error);
    o
}

/// A periodic resync: whether it read nothing, and how many listings and
/// reads it did.
fn resync(b: &mut Backend, reads: &AtomicUsize) -> (bool, usize, ApplyOutcome) {
    let before = reads.load(Ordering::Relaxed);
    b.queue_resync();
    let o = apply(b);
    let skipped = match o.resyncs_skipped.as_slice() {
        [] => false,
        [id] => {
            assert_eq!(id.name, "nft");
            true
        }
        more => panic!("one backend, {} skips", more.len()),
    };
    (skipped, reads.load(Ordering::Relaxed) - before, o)
}

/// Two policies applied: the first resync reads (it knows nothing), the
/// write that follows is ours, and the resyncs after it read nothing.
fn synced_pair() -> (Backend, Arc<AtomicUsize>, DesiredSet, DesiredSet) {
    let (mut b, reads) = backend();
    let a = desired("a", &["10.0.0.1", "10.0.0.2"]);
    let z = desired("z", &["10.1.0.1"]);
    b.set_desired(vec![a.clone(), z.clone()], vec![]);
    let o = apply(&mut b);
    assert_eq!(o.written.len(), 2);
    assert!(o.resyncs_skipped.is_empty(), "the first resync must read");
    assert!(reads.load(Ordering::Relaxed) > 0);
    (b, reads, a, z)
}

pub fn an_idle_resync_after_our_own_write_reads_nothing(
    _dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let (mut b, reads, _a, z) = synced_pair();
    for _ in 0..3 {
        let (skipped, n, o) = resync(&mut b, &reads);
        assert!(
            skipped,
            "an idle resync after our own write must read nothing"
        );
        assert_eq!(n, 0, "listings and reads of a quiet resync");
        assert!(o.written.is_empty(), "{:?}", o.written);
    }
    assert!(
        b.report().iter().all(|r| r.synced && r.problems == 0),
        "{:?}",
        b.report()
    );
    // A change of ours (an add, a new set) keeps the next resync quiet.
    let a2 = desired("a", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let c = desired("c", &["10.2.0.1"]);
    b.set_desired(vec![a2.clone(), z.clone(), c.clone()], vec![]);
    let o = apply(&mut b);
    assert_eq!(o.written.len(), 2, "{:?}", o.written);
    let (skipped, n, _) = resync(&mut b, &reads);
    assert!(skipped && n == 0, "skipped {skipped}, {n} reads");
    assert_eq!(kernel_elements("ipm4-a"), Some(expected(&a2)));
    assert_eq!(kernel_elements("ipm4-c"), Some(expected(&c)));
    // A deletion of ours too.
    b.set_desired(vec![a2.clone(), c.clone()], vec![]);
    let o = apply(&mut b);
    assert_eq!(o.deleted.len(), 1, "{:?}", o.deleted);
    let (skipped, n, _) = resync(&mut b, &reads);
    assert!(skipped && n == 0, "skipped {skipped}, {n} reads");
    assert_eq!(kernel_elements("ipm4-z"), None);
}

pub fn an_element_added_out_of_band_is_still_found_and_repaired(
    _dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let (mut b, reads, a, z) = synced_pair();
    let (skipped, _, _) = resync(&mut b, &reads);
    assert!(skipped);
    nft(&[
        "add",
        "element",
        "inet",
        "ipsetmgr",
        "ipm4-a",
        "{ 10.9.9.9 }",
    ]);
    let (skipped, n, o) = resync(&mut b, &reads);
    assert!(!skipped, "a foreign element must make the resync read");
    assert!(n > 0);
    let r = b
        .report()
        .into_iter()
        .find(|r| r.set.name == "ipm4-a")
        .unwrap();
    assert_eq!(r.drift.extra, 1, "{r:?}");
    assert!(r.synced, "{r:?}");
    assert_eq!(o.written.len(), 1, "{:?}", o.written);
    assert_eq!(kernel_elements("ipm4-a"), Some(expected(&a)));
    assert_eq!(kernel_elements("ipm4-z"), Some(expected(&z)));
    // The repair was ours: quiet again.
    let (skipped, n, _) = resync(&mut b, &reads);
    assert!(skipped && n == 0, "skipped {skipped}, {n} reads");
    assert!(b.report().iter().all(|r| r.problems == 0));
    // An element deleted out of band is found as well.
    nft(&[
        "delete",
        "element",
        "inet",
        "ipsetmgr",
        "ipm4-z",
        "{ 10.1.0.1 }",
    ]);
    let (skipped, _, _) = resync(&mut b, &reads);
    assert!(!skipped);
    let r = b
        .report()
        .into_iter()
        .find(|r| r.set.name == "ipm4-z")
        .unwrap();
    assert_eq!(r.drift.missing, 1, "{r:?}");
    assert_eq!(kernel_elements("ipm4-z"), Some(expected(&z)));
}

pub fn a_change_in_another_table_makes_the_resync_read(
    _dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let (mut b, reads, a, z) = synced_pair();
    nft(&["add", "table", "ip", "someone-else"]);
    let (skipped, n, o) = resync(&mut b, &reads);
    assert!(!skipped, "any foreign commit must make the resync read");
    assert!(n > 0);
    assert!(o.written.is_empty(), "{:?}", o.written);
    assert!(
        b.report().iter().all(|r| r.synced && r.problems == 0),
        "{:?}",
        b.report()
    );
    let (skipped, n, _) = resync(&mut b, &reads);
    assert!(skipped && n == 0, "skipped {skipped}, {n} reads");
    assert_eq!(kernel_elements("ipm4-a"), Some(expected(&a)));
    assert_eq!(kernel_elements("ipm4-z"), Some(expected(&z)));
}

pub fn a_batch_against_a_moved_generation_is_refused_and_retried(
    _dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let (mut b, reads, _a, z) = synced_pair();
    // Someone adds an element behind our back, and before any resync we
    // change the same set: the batch, made against the generation we knew,
    // is refused; every set is read again and the retry writes what is
    // needed, the foreign element included.
    nft(&[
        "add",
        "element",
        "inet",
        "ipsetmgr",
        "ipm4-a",
        "{ 10.9.9.9 }",
    ]);
    let a2 = desired("a", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    b.set_desired(vec![a2.clone(), z.clone()], vec![]);
    let o = apply(&mut b);
    assert_eq!(o.attempts, 2, "refused once, then written: {o:?}");
    assert_eq!(kernel_elements("ipm4-a"), Some(expected(&a2)));
    assert_eq!(kernel_elements("ipm4-z"), Some(expected(&z)));
    assert!(b.report().iter().all(|r| r.synced), "{:?}", b.report());
    // The retry went unchecked: the next resync reads, then it is quiet.
    let (skipped, n, _) = resync(&mut b, &reads);
    assert!(!skipped && n > 0, "skipped {skipped}, {n} reads");
    let (skipped, n, _) = resync(&mut b, &reads);
    assert!(skipped && n == 0, "skipped {skipped}, {n} reads");
}

pub fn the_kernel_refuses_a_stale_generation_and_commits_a_current_one(
    _dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let mut dp = NetlinkNft::new().expect("a NETLINK_NETFILTER socket");
    let t = default_table();
    let owned = |_: &str| true;
    let spec = SetShape::from_header(&desired("a", &[]).header)
        .unwrap()
        .spec;
    let g = dp
        .generation()
        .unwrap()
        .expect("netlink reads the generation");
    dp.expect_generation(Some(g));
    nft(&["add", "table", "ip", "someone-else"]);
    let create = [
        NftOp::EnsureTable,
        NftOp::CreateSet {
            name: "ipm4-a",
            spec: &spec,
        },
    ];
    let e = dp.apply(&t, &create, &owned).unwrap_err();
    assert_eq!(e.error, NftError::GenerationMoved { expected: g }, "{e:?}");
    assert_eq!(e.op_index, None);
    assert_eq!(kernel_elements("ipm4-a"), None, "nothing applied");
    assert_eq!(dp.expected_generation(), None);
    // Against the current generation it commits, and moves it by one.
    let now = dp.generation().unwrap().unwrap();
    assert_ne!(now, g);
    dp.expect_generation(Some(now));
    dp.apply(&t, &create, &owned).unwrap();
    let after = dp.generation().unwrap().unwrap();
    assert_eq!(after, now.wrapping_add(1));
    assert_eq!(dp.expected_generation(), Some(after));
    assert_eq!(kernel_elements("ipm4-a"), Some(vec![]));
}
