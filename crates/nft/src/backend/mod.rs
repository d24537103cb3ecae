//! The nf_tables sets backend: [`NftBackend`] keeps the owned nft sets of
//! one table equal to the desired sets, as the ipset
//! [`Manager`](ipsetmgr_manager::Manager) does for ipsets, behind the same
//! [`SetsBackend`] seam.
//!
//! What differs from the ipset side, and why:
//! - One nf_tables transaction per apply (all or nothing), so no temp set
//!   and no swap: a new set is created and filled in the transaction, a
//!   changed one gets its deletes and adds, a set whose key or flags must
//!   change is deleted and created again in it (only while no rule
//!   references it: the kernel refuses, and a rule must never lose its set).
//! - The backend keeps what it believes each kernel set holds as packed
//!   elements; a write is the difference between those and the desired
//!   elements. A resync replaces the belief with what the kernel reports and
//!   counts the differences as drift.
//! - A failed transaction applied nothing: the operation it names maps to
//!   one set, which is isolated with backoff when the error is about it;
//!   the others go again in a new transaction.
//! - list:sets have no nft equivalent: they are flattened into the union of
//!   the sets they list (see `compile`).

mod compile;
mod names;
#[cfg(all(test, feature = "model"))]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ipsetmgr_dataplane::DataplaneError;
use ipsetmgr_ipset::{MemberSet, Naming, SetHeader};
use ipsetmgr_manager::{
    ApplyError, ApplyOutcome, DeletionReport, DesiredSet, Drift, Failure, ListedSet, ManagerConfig,
    NotReplaced, Plan, SetError, SetReport, SetsBackend,
};

use self::compile::{Compiled, compile, is_stale_belief, kind_of, to_dataplane};
use crate::{Elements, NftBatchError, NftDataplane, NftError, NftOp, NftSetSpec, Table};

/// The table the sets live in unless configured otherwise: `inet
/// ipsetmgr` (an inet table's rules see IPv4 and IPv6 packets).
pub fn default_table() -> Table {
    Table::new(crate::TableFamily::Inet, "ipsetmgr")
}

/// Errors that are not clearly about one set isolate it when they repeat
/// this often in one apply (as on the ipset side).
const ISOLATE_AFTER_REPEATS: u32 = 3;

/// What the backend believes the kernel holds for one set.
#[derive(Clone, Debug)]
enum Kernel {
    /// Never read: the coming resync decides.
    Unknown,
    Absent,
    Present {
        /// `None`: a key this crate does not create, or options it never
        /// sets: the set must be replaced.
        spec: Option<NftSetSpec>,
        references: u32,
        /// `None` when `spec` is.
        elements: Option<Elements>,
    },
}

/// One desired set.
#[derive(Clone, Debug)]
struct NftSet {
    policy: String,
    header: SetHeader,
    members_src: Arc<MemberSet>,
    desired: Result<Compiled, SetError>,
    kernel: Kernel,
    drift: Drift,
    failure: Option<Failure>,
    last_sync: Option<SystemTime>,
}

/// The write one set needs.
enum Write {
    Create,
    /// `size` changed too when `resize`; `flush` when every element the
    /// kernel holds goes (one op instead of naming each: a replaced
    /// million-element set sends only its new elements).
    Delta {
        del: Elements,
        add: Elements,
        resize: Resize,
        flush: bool,
    },
    Recreate,
}

/// How a kept set's `size` changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resize {
    Keep,
    /// Sent in a transaction of its own before the elements: the kernel
    /// applies a new size at commit, so elements added in the same
    /// transaction would still count against the old one (a set at its
    /// old limit could never take them). A bigger limit changes no match,
    /// so committing it first is safe. Only for a set that cannot be
    /// recreated (a rule references it) or an interval set (whose tree
    /// has no buckets sized at creation).
    Grow,
    /// Sent with the elements: deleted ones make room under the old
    /// limit, and the smaller one holds from the commit on.
    Shrink,
}

impl Resize {
    fn between(kernel: Option<u32>, wanted: Option<u32>) -> Resize {
        match (kernel, wanted) {
            (k, w) if k == w => Resize::Keep,
            // `None` is unbounded.
            (Some(_), None) => Resize::Grow,
            (None, Some(_)) => Resize::Shrink,
            (Some(k), Some(w)) if w > k => Resize::Grow,
            _ => Resize::Shrink,
        }
    }
}

impl NftSet {
    /// What the set needs, `Ok(None)` when the kernel holds it already.
    fn write(&self) -> Result<Option<Write>, SetError> {
        let c = self.desired.as_ref().map_err(Clone::clone)?;
        match &self.kernel {
            Kernel::Unknown | Kernel::Absent => Ok(Some(Write::Create)),
            Kernel::Present {
                spec: Some(spec),
                elements: Some(have),
                references,
            } if spec.key == c.shape.spec.key && spec.interval == c.shape.spec.interval => {
                let resize = Resize::between(spec.size, c.shape.spec.size);
                if resize == Resize::Grow && !spec.interval && *references == 0 {
                    // The kernel sizes a hash set's buckets once, from the
                    // size it is created with, and never rehashes: grown in
                    // place from 5 to 262,144, its 200,000 inserts took 176 s
                    // of kernel time (and every lookup walks those chains).
                    // Created anew in one transaction, it is sized for the
                    // new limit.
                    return Ok(Some(Write::Recreate));
                }
                let (del, add) = c.elements.diff(have);
                let flush = !del.is_empty() && del.len() == have.len();
                Ok(
                    (resize != Resize::Keep || !del.is_empty() || !add.is_empty()).then_some(
                        Write::Delta {
                            del,
                            add,
                            resize,
                            flush,
                        },
                    ),
                )
            }
            Kernel::Present { references: 0, .. } => Ok(Some(Write::Recreate)),
            Kernel::Present {
                spec, references, ..
            } => Err(SetError::NotReplaced(NotReplaced {
                kernel: spec.as_ref().and_then(kind_of),
                wanted: self.header.kind,
                references: *references,
            })),
        }
    }

    fn synced(&self) -> bool {
        self.failure.is_none() && matches!(self.write(), Ok(None))
    }

    fn waiting(&self, now: Instant) -> bool {
        self.failure.as_ref().is_some_and(|f| f.retry_at > now)
    }
}

/// A failed transaction and the set whose operation it names.
struct TxFailure {
    error: NftBatchError,
    set: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Resync {
    None,
    /// Re-read these sets (a transaction found them changed); not drift.
    Sets(BTreeSet<String>),
    Full,
}

/// The nf_tables sets backend over one table. See the module doc.
pub struct NftBackend<D: NftDataplane> {
    dp: D,
    table: Table,
    config: ManagerConfig,
    /// Desired sets by nft name.
    sets: BTreeMap<String, NftSet>,
    /// ipset names of failed policies' sets: their nft sets are left alone.
    held: BTreeSet<String>,
    /// Owned nft sets seen in the table (last listing plus our creates).
    existing: BTreeSet<String>,
    pending_deletions: BTreeSet<String>,
    deletion_errors: BTreeMap<String, DataplaneError>,
    resync: Resync,
    isolated_now: BTreeSet<String>,
    sleep: Box<dyn FnMut(Duration) + Send>,
}

impl NftBackend<crate::netlink::NetlinkNft> {
    /// Over native nf_tables netlink (`--backend nft`).
    pub fn netlink(table: Table, config: ManagerConfig) -> Result<Self, NftError> {
        Ok(NftBackend::new(
            crate::netlink::NetlinkNft::new()?,
            table,
            config,
        ))
    }
}

impl NftBackend<crate::cli::CliNft> {
    /// Over `nft -j` (`--backend nft-cli`).
    pub fn cli(table: Table, config: ManagerConfig) -> Self {
        NftBackend::new(crate::cli::CliNft::new(), table, config)
    }
}

impl<D: NftDataplane> NftBackend<D> {
    /// A backend for the owned sets (by `config.naming`) of `table` (see
    /// [`default_table`]). Nothing is read or written until the first apply.
    pub fn new(dp: D, table: Table, config: ManagerConfig) -> NftBackend<D> {
        NftBackend {
            dp,
            table,
            config,
            sets: BTreeMap::new(),
            held: BTreeSet::new(),
            existing: BTreeSet::new(),
            pending_deletions: BTreeSet::new(),
            deletion_errors: BTreeMap::new(),
            resync: Resync::Full,
            isolated_now: BTreeSet::new(),
            sleep: Box::new(std::thread::sleep),
        }
    }

    /// Replace the sleep used for backoff (tests count instead of sleeping).
    pub fn with_sleep(mut self, sleep: impl FnMut(Duration) + Send + 'static) -> Self {
        self.sleep = Box::new(sleep);
        self
    }

    pub fn table(&self) -> &Table {
        &self.table
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    /// The nft name the backend gives a desired set.
    pub fn set_name(&self, d: &DesiredSet) -> String {
        names::nft_set_name(&self.config.naming, &d.name, &d.policy)
    }

    fn is_held(&self, nft_name: &str) -> bool {
        self.held
            .contains(&names::ipset_name_of(&self.config.naming, nft_name))
    }

    fn queue_read(&mut self, name: &str) {
        match &mut self.resync {
            Resync::Full => {}
            Resync::Sets(s) => {
                s.insert(name.to_string());
            }
            Resync::None => self.resync = Resync::Sets([name.to_string()].into()),
        }
    }

    fn resync_if_needed(&mut self) -> Result<(), NftError> {
        match std::mem::replace(&mut self.resync, Resync::None) {
            Resync::None => Ok(()),
            Resync::Full => self
                .full_resync()
                .inspect_err(|_| self.resync = Resync::Full),
            Resync::Sets(names) => {
                let r = self.read_sets(&names, false);
                if r.is_err() {
                    self.resync = Resync::Sets(names);
                }
                r
            }
        }
    }

    /// List the owned sets, read the desired ones, queue deletions of the
    /// rest. A missing table is no error: every set is then absent.
    fn full_resync(&mut self) -> Result<(), NftError> {
        let naming = self.config.naming.clone();
        let owned = |n: &str| names::owns(&naming, n);
        let listed = self.dp.list_sets(&self.table, &owned)?.unwrap_or_default();
        self.existing = listed.into_iter().filter(|n| owned(n)).collect();
        let desired: BTreeSet<String> = self.sets.keys().cloned().collect();
        self.read_sets(&desired, true)?;
        self.pending_deletions = self
            .existing
            .iter()
            .filter(|n| !self.sets.contains_key(*n) && !self.is_held(n))
            .cloned()
            .collect();
        self.deletion_errors
            .retain(|n, _| self.existing.contains(n));
        Ok(())
    }

    /// Read `names` and take the kernel's word for them; `count` says
    /// whether the differences to what was believed are drift.
    fn read_sets(&mut self, names: &BTreeSet<String>, count: bool) -> Result<(), NftError> {
        for name in names {
            if !self.sets.contains_key(name) {
                continue;
            }
            // After a full listing, sets it did not show need no read; a
            // re-read after a failed transaction asks the kernel.
            let k = if !count || self.existing.contains(name) {
                self.dp.read_set(&self.table, name)?
            } else {
                None
            };
            match &k {
                Some(_) => self.existing.insert(name.clone()),
                None => self.existing.remove(name),
            };
            let Some(s) = self.sets.get_mut(name) else {
                continue;
            };
            let drift = reconcile(s, k);
            if count {
                s.drift = drift;
            }
        }
        Ok(())
    }

    fn isolate(&mut self, name: &str, error: SetError) {
        let Some(s) = self.sets.get_mut(name) else {
            return;
        };
        let (failure, backoff) = Failure::after(s.failure.as_ref(), error, &self.config);
        tracing::warn!(set = name, policy = %s.policy, error = %failure.error, retry_in = ?backoff, "nft set isolated");
        self.isolated_now.insert(name.to_string());
        s.failure = Some(failure);
    }

    /// The sets to write now with what each needs; the ones that cannot be
    /// written (nft cannot hold them, a referenced set would have to be
    /// replaced) are isolated here, without a round trip to the kernel.
    fn due_writes(&mut self) -> Vec<(String, Write)> {
        let now = Instant::now();
        let mut writes = Vec::new();
        let mut refused = Vec::new();
        for (name, s) in &self.sets {
            if s.waiting(now) || self.isolated_now.contains(name) {
                continue;
            }
            match s.write() {
                Ok(Some(w)) => writes.push((name.clone(), w)),
                Ok(None) => {}
                Err(e) => refused.push((name.clone(), e)),
            }
        }
        for (name, e) in refused {
            self.isolate(&name, e);
        }
        writes
    }

    /// One transaction of every due write (after one that grows the sets
    /// that must: see [`Resize::Grow`]). `Ok` names the sets written.
    fn try_updates(&mut self) -> Result<Vec<(String, Plan)>, Box<TxFailure>> {
        let writes = self.due_writes();
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        self.grow_first(&writes)?;
        let mut ops: Vec<NftOp<'_>> = vec![NftOp::EnsureTable];
        let mut spans: Vec<(std::ops::Range<usize>, &str)> = Vec::new();
        for (name, w) in &writes {
            let start = ops.len();
            let Ok(c) = &self.sets[name].desired else {
                continue; // write() refuses these
            };
            let create = NftOp::CreateSet {
                name,
                spec: &c.shape.spec,
            };
            let fill = NftOp::AddElements {
                set: name,
                elements: &c.elements,
            };
            match w {
                Write::Create => ops.push(create),
                Write::Recreate => ops.extend([NftOp::DeleteSet { set: name }, create]),
                Write::Delta {
                    del,
                    add,
                    resize,
                    flush,
                } => {
                    if *resize == Resize::Shrink {
                        // `add set` on an existing set of the same key and
                        // flags only takes the new size.
                        ops.push(create);
                    }
                    if *flush {
                        ops.push(NftOp::FlushSet { set: name });
                    } else if !del.is_empty() {
                        ops.push(NftOp::DelElements {
                            set: name,
                            elements: del,
                        });
                    }
                    if !add.is_empty() {
                        ops.push(NftOp::AddElements {
                            set: name,
                            elements: add,
                        });
                    }
                }
            }
            if matches!(w, Write::Create | Write::Recreate) && !c.elements.is_empty() {
                ops.push(fill);
            }
            spans.push((start..ops.len(), name));
        }
        let naming = &self.config.naming;
        let result = self
            .dp
            .apply(&self.table, &ops, &|n| names::owns(naming, n));
        match result {
            Ok(()) => {
                drop(ops);
                let written: Vec<(String, Plan)> = writes
                    .iter()
                    .map(|(name, w)| {
                        let plan = match w {
                            Write::Create => Plan::Create,
                            Write::Delta { .. } => Plan::Delta,
                            Write::Recreate => Plan::Recreate,
                        };
                        (name.clone(), plan)
                    })
                    .collect();
                for (name, _) in &written {
                    self.committed(name);
                }
                Ok(written)
            }
            Err(e) => {
                let set = e.op_index.and_then(|i| {
                    spans
                        .iter()
                        .find(|(r, _)| r.contains(&i))
                        .map(|(_, n)| n.to_string())
                });
                Err(Box::new(TxFailure { error: e, set }))
            }
        }
    }

    /// Commit the new size of every set in `writes` that must grow, in one
    /// transaction of its own, and believe it.
    fn grow_first(&mut self, writes: &[(String, Write)]) -> Result<(), Box<TxFailure>> {
        let grows: Vec<(&str, NftSetSpec)> = writes
            .iter()
            .filter(|(_, w)| {
                matches!(
                    w,
                    Write::Delta {
                        resize: Resize::Grow,
                        ..
                    }
                )
            })
            .filter_map(|(name, _)| {
                let c = self.sets[name].desired.as_ref().ok()?;
                Some((name.as_str(), c.shape.spec))
            })
            .collect();
        if grows.is_empty() {
            return Ok(());
        }
        let ops: Vec<NftOp<'_>> = grows
            .iter()
            .map(|(name, spec)| NftOp::CreateSet { name, spec })
            .collect();
        let naming = &self.config.naming;
        if let Err(e) = self
            .dp
            .apply(&self.table, &ops, &|n| names::owns(naming, n))
        {
            let set = e
                .op_index
                .and_then(|i| grows.get(i))
                .map(|(n, _)| n.to_string());
            return Err(Box::new(TxFailure { error: e, set }));
        }
        drop(ops);
        let grown: Vec<(String, Option<u32>)> = grows
            .iter()
            .map(|(n, spec)| (n.to_string(), spec.size))
            .collect();
        for (name, size) in grown {
            if let Some(Kernel::Present {
                spec: Some(spec), ..
            }) = self.sets.get_mut(&name).map(|s| &mut s.kernel)
            {
                spec.size = size;
            }
        }
        Ok(())
    }

    /// The transaction holding `name` succeeded: the kernel holds it.
    fn committed(&mut self, name: &str) {
        self.existing.insert(name.to_string());
        let Some(s) = self.sets.get_mut(name) else {
            return;
        };
        let Ok(c) = &s.desired else {
            return;
        };
        let references = match s.kernel {
            Kernel::Present { references, .. } => references,
            _ => 0,
        };
        s.kernel = Kernel::Present {
            spec: Some(c.shape.spec),
            references,
            elements: Some(c.elements.clone()),
        };
        s.failure = None;
        s.last_sync = Some(SystemTime::now());
    }

    /// A failed transaction: isolate the set it names when the error is
    /// about that set (or keeps coming back), re-read it when the error says
    /// the table changed under us. Returns whether a set was isolated.
    fn handle_failure(
        &mut self,
        e: &NftBatchError,
        set: Option<String>,
        repeats: &mut BTreeMap<String, u32>,
    ) -> bool {
        let Some(set) = set else {
            return false;
        };
        let count = repeats.entry(set.clone()).or_default();
        *count += 1;
        let stale = is_stale_belief(&e.error);
        if stale {
            self.queue_read(&set);
        }
        let error = to_dataplane(&e.error);
        if (!stale && error.is_set_specific()) || *count >= ISOLATE_AFTER_REPEATS {
            if matches!(e.error, NftError::InUse(_)) {
                // A rule appeared since the last read: the belief about
                // references is wrong too.
                self.queue_read(&set);
            }
            self.isolate(&set, SetError::Kernel(error));
            return true;
        }
        false
    }

    /// Delete owned sets nobody wants, in one transaction. A set the
    /// kernel refuses to delete (a rule references it: EBUSY) is reported
    /// and left for the next resync; the rest go again without it, so one
    /// referenced set never keeps the others.
    fn apply_deletions(&mut self) -> Vec<String> {
        if !self.config.prune {
            return Vec::new();
        }
        let mut todo: Vec<String> = std::mem::take(&mut self.pending_deletions)
            .into_iter()
            .filter(|n| !self.sets.contains_key(n) && !self.is_held(n))
            .collect();
        let naming = self.config.naming.clone();
        while !todo.is_empty() {
            let ops: Vec<NftOp<'_>> = todo.iter().map(|set| NftOp::DeleteSet { set }).collect();
            let result = self
                .dp
                .apply(&self.table, &ops, &|n| names::owns(&naming, n));
            drop(ops);
            let e = match result {
                Ok(()) => break,
                Err(e) => e,
            };
            let Some(i) = e.op_index.filter(|i| *i < todo.len()) else {
                // Refused as a whole: every one is retried at the next resync.
                let error = to_dataplane(&e.error);
                tracing::warn!(%error, "nft sets not deleted; retried at the next resync");
                for name in todo {
                    self.deletion_errors.insert(name, error.clone());
                }
                return Vec::new();
            };
            let name = todo.remove(i);
            if matches!(e.error, NftError::SetMissing(_) | NftError::TableMissing(_)) {
                // Gone already: nothing to report.
                self.existing.remove(&name);
                self.deletion_errors.remove(&name);
            } else {
                let error = to_dataplane(&e.error);
                tracing::warn!(set = %name, %error, "nft set not deleted; retried at the next resync");
                self.deletion_errors.insert(name, error);
            }
        }
        for name in &todo {
            self.existing.remove(name);
            self.deletion_errors.remove(name);
        }
        todo
    }
}

/// Take the kernel's word for one set; the differences to what was
/// believed are the drift (against the desired set for a first read).
fn reconcile(s: &mut NftSet, k: Option<crate::NftKernelSet>) -> Drift {
    let before = std::mem::replace(&mut s.kernel, Kernel::Absent);
    let believed_present = matches!(before, Kernel::Present { .. });
    let Some(k) = k else {
        return Drift {
            rewritten: believed_present && s.last_sync.is_some(),
            ..Drift::default()
        };
    };
    let clean = k.unmanaged.is_empty() && k.unreadable_elements == 0;
    let spec = k.spec.filter(|_| clean);
    s.kernel = Kernel::Present {
        spec,
        references: k.references,
        elements: k.elements.filter(|_| spec.is_some()),
    };
    // Against what was believed; on a first read, against what is wanted.
    let expected: Option<(NftSetSpec, &Elements)> = match &before {
        Kernel::Present {
            spec: Some(spec),
            elements: Some(e),
            ..
        } => Some((*spec, e)),
        Kernel::Present { .. } => return Drift::default(), // known to be replaced
        _ => match &s.desired {
            Ok(c) => Some((c.shape.spec, &c.elements)),
            Err(_) => None,
        },
    };
    let (Some((want, want_elems)), Kernel::Present { spec, elements, .. }) = (expected, &s.kernel)
    else {
        return Drift::default();
    };
    let drift = match (spec, elements) {
        (Some(have), Some(have_elems))
            if have.key == want.key && have.interval == want.interval =>
        {
            let (extra, missing) = want_elems.diff(have_elems);
            Drift {
                missing: missing.len(),
                extra: extra.len(),
                rewritten: false,
            }
        }
        _ => Drift {
            rewritten: true,
            ..Drift::default()
        },
    };
    if s.failure.is_none() && matches!(s.write(), Ok(None)) {
        s.last_sync = Some(SystemTime::now());
    }
    drift
}

impl<D: NftDataplane> SetsBackend for NftBackend<D> {
    /// "nft" over netlink, "nft-cli" over `nft -j`, "nft-" and the
    /// dataplane's name otherwise (the model).
    fn name(&self) -> &'static str {
        match self.dp.name() {
            "netlink" => "nft",
            "cli" => "nft-cli",
            _ => "nft-model",
        }
    }

    fn naming(&self) -> &Naming {
        &self.config.naming
    }

    fn set_desired(&mut self, desired: Vec<DesiredSet>, held: Vec<String>) {
        self.held = held.into_iter().collect();
        let by_ipset_name: HashMap<&str, &DesiredSet> =
            desired.iter().map(|d| (d.name.as_str(), d)).collect();
        let mut wanted = BTreeSet::new();
        for d in &desired {
            let name = self.set_name(d);
            wanted.insert(name.clone());
            self.pending_deletions.remove(&name);
            let list = d.header.kind.set_type == ipsetmgr_ipset::SetType::ListSet;
            if let Some(s) = self.sets.get_mut(&name) {
                // An unchanged policy keeps its compiled elements (a million
                // members are not compiled again); a list:set depends on the
                // sets it lists, so it is always flattened again.
                let same = !list && Arc::ptr_eq(&s.members_src, &d.members) && s.header == d.header;
                s.policy = d.policy.clone();
                if !same {
                    // A few members changed in a set of exact elements:
                    // patch the elements rather than compile them all.
                    let patched = match &s.desired {
                        Ok(c) if !list => compile::patch(c, &s.members_src, d).map(Ok),
                        _ => None,
                    };
                    let desired =
                        patched.unwrap_or_else(|| compile(&name, d, &by_ipset_name, &self.held));
                    if desired != s.desired {
                        // New content deserves a try now, whatever failed.
                        if let Some(f) = &mut s.failure {
                            f.retry_at = Instant::now();
                        }
                    }
                    s.desired = desired;
                    s.header = d.header.clone();
                    s.members_src = d.members.clone();
                }
                continue;
            }
            let kernel = if self.resync == Resync::Full {
                Kernel::Unknown
            } else if self.existing.contains(&name) {
                self.queue_read(&name);
                Kernel::Unknown
            } else {
                Kernel::Absent
            };
            let s = NftSet {
                policy: d.policy.clone(),
                header: d.header.clone(),
                members_src: d.members.clone(),
                desired: compile(&name, d, &by_ipset_name, &self.held),
                kernel,
                drift: Drift::default(),
                failure: None,
                last_sync: None,
            };
            self.sets.insert(name, s);
        }
        let gone: Vec<String> = self
            .sets
            .keys()
            .filter(|n| !wanted.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.sets.remove(&name);
            if !self.is_held(&name) && self.existing.contains(&name) {
                self.pending_deletions.insert(name);
            }
        }
        let held: Vec<String> = self
            .pending_deletions
            .iter()
            .filter(|n| self.is_held(n))
            .cloned()
            .collect();
        for n in held {
            self.pending_deletions.remove(&n);
        }
    }

    fn queue_resync(&mut self) {
        self.resync = Resync::Full;
    }

    fn retry_due(&self) -> bool {
        let now = Instant::now();
        self.sets
            .values()
            .any(|s| s.failure.as_ref().is_some_and(|f| f.retry_at <= now))
    }

    fn next_retry(&self) -> Option<Instant> {
        self.sets
            .values()
            .filter_map(|s| s.failure.as_ref().map(|f| f.retry_at))
            .min()
    }

    /// Resync when required, then one transaction of every due write,
    /// again without the set a failed one names; then the deletions.
    fn apply_updates(&mut self) -> ApplyOutcome {
        let started = Instant::now();
        let mut outcome = ApplyOutcome::default();
        let mut delay = self.config.initial_backoff;
        let mut repeats = BTreeMap::new();
        self.isolated_now.clear();
        for attempt in 1..=self.config.max_attempts {
            outcome.attempts = attempt;
            if let Err(e) = self.resync_if_needed() {
                outcome.error = Some(ApplyError::Resync(to_dataplane(&e)));
                (self.sleep)(delay);
                delay *= 2;
                continue;
            }
            match self.try_updates() {
                Ok(written) => {
                    outcome.written = written;
                    outcome.applied = true;
                    outcome.error = None;
                    break;
                }
                Err(f) => {
                    let TxFailure { error: e, set } = *f;
                    let error = to_dataplane(&e.error);
                    outcome.error = Some(match &set {
                        Some(set) => ApplyError::BatchAtSet {
                            set: set.clone(),
                            error,
                        },
                        None => ApplyError::Batch(error),
                    });
                    // Isolating a set is progress: the rest go again at
                    // once. Anything else waits a little first.
                    if !self.handle_failure(&e, set, &mut repeats) {
                        (self.sleep)(delay);
                        delay *= 2;
                    }
                }
            }
        }
        outcome.deleted = self.apply_deletions();
        outcome.duration = started.elapsed();
        outcome
    }

    fn report(&self) -> Vec<SetReport> {
        self.sets
            .iter()
            .map(|(name, s)| SetReport {
                name: name.clone(),
                policy: s.policy.clone(),
                synced: s.synced(),
                members: s.members_src.len(),
                problems: s.drift.total(),
                drift: s.drift,
                error: s.failure.as_ref().map(|f| f.error.clone()),
                last_sync: s.last_sync,
            })
            .collect()
    }

    fn unwanted(&self) -> Vec<String> {
        if self.config.prune {
            Vec::new()
        } else {
            self.pending_deletions.iter().cloned().collect()
        }
    }

    fn deletion_report(&self) -> Vec<DeletionReport> {
        self.deletion_errors
            .iter()
            .map(|(name, error)| DeletionReport {
                name: name.clone(),
                error: error.clone(),
            })
            .collect()
    }

    /// A read-only resync, then what the next apply would send.
    fn plan(&mut self) -> Result<Vec<String>, DataplaneError> {
        self.resync_if_needed().map_err(|e| to_dataplane(&e))?;
        let mut lines = Vec::new();
        for (name, s) in &self.sets {
            let at = self.shown_name(name);
            match s.write() {
                Ok(None) => {}
                Ok(Some(Write::Create)) => lines.push(format!(
                    "create {at} with {} elements",
                    s.desired.as_ref().map_or(0, |c| c.elements.len())
                )),
                Ok(Some(Write::Delta { del, add, .. })) => lines.push(format!(
                    "update {at}: add {}, delete {} elements",
                    add.len(),
                    del.len()
                )),
                Ok(Some(Write::Recreate)) => lines.push(format!(
                    "recreate {at} (type changed, not referenced) with {} elements",
                    s.desired.as_ref().map_or(0, |c| c.elements.len())
                )),
                Err(why) => lines.push(format!("cannot update {at}: {why}")),
            }
        }
        for name in &self.pending_deletions {
            let at = self.shown_name(name);
            if self.config.prune {
                lines.push(format!("delete {at} (no policy wants it)"));
            } else {
                lines.push(format!(
                    "keep {at}: no policy wants it (use --prune to delete)"
                ));
            }
        }
        Ok(lines)
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, DataplaneError> {
        let naming = self.config.naming.clone();
        let owned = |n: &str| names::owns(&naming, n);
        let err = |e: NftError| to_dataplane(&e);
        let names = self.dp.list_sets(&self.table, &owned).map_err(err)?;
        let mut listed = Vec::new();
        for name in names.unwrap_or_default() {
            let Some(k) = self.dp.read_set(&self.table, &name).map_err(err)? else {
                continue;
            };
            listed.push(ListedSet {
                name: self.shown_name(&name),
                kind: match (&k.spec, k.unmanaged.is_empty()) {
                    (Some(spec), true) => spec.to_string(),
                    _ => "(unmanaged type)".into(),
                },
                members: k.elements.as_ref().map_or(0, Elements::len),
                max_elem: k.spec.and_then(|s| s.size),
                references: k.references,
                role: "main",
            });
        }
        Ok(listed)
    }

    /// A set as nft names it (`inet ipsetmgr ipm4-a`): how `sets`, `apply`
    /// and the plan show it.
    fn shown_name(&self, set: &str) -> String {
        format!("{} {set}", self.table)
    }
}
