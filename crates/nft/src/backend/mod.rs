//! The nf_tables adapter: [`NftKernel`] holds the owned nft sets of one
//! table for the neutral reconciler ([`ipsetmgr_sets::Reconciler`]), as the
//! ipset adapter holds ipsets.
//!
//! What only nf_tables needs lives here:
//! - One nf_tables transaction per apply (all or nothing), so no temp set
//!   and no swap: a new set is created and filled in the transaction, a
//!   changed one gets its deletes and adds, a set whose key or flags must
//!   change is deleted and created again in it (only while no rule
//!   references it: the kernel refuses, and a rule must never lose its set).
//! - The adapter keeps what it believes each kernel set holds as packed
//!   elements; a write is the difference between those and the desired
//!   elements. A read replaces the belief with what the kernel reports and
//!   counts the differences as drift.
//! - A failed transaction applied nothing: the operation it names maps to
//!   one set; an error that says the table changed under us asks for a
//!   re-read rather than isolation.
//! - list:sets have no nft equivalent: they are flattened into the union of
//!   the sets they list (see `compile`).

mod compile;
mod names;
#[cfg(all(test, feature = "model"))]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;

use ipsetmgr_ipset::{MemberSet, Naming, SetHeader};
use ipsetmgr_sets::{
    BackendId, BatchFailure, Context, DesiredSet, Drift, Kernel, KernelError, ListedSet,
    NotReplaced, Owned, Planned, Reconciler, ReconcilerConfig, SetError, SetRef, Sets, WriteKind,
};

use self::compile::{Compiled, compile, is_stale_belief, kind_of};
use crate::{Elements, NftDataplane, NftError, NftOp, NftSetSpec, Table};

/// The table the sets live in unless configured otherwise: `inet
/// ipsetmgr` (an inet table's rules see IPv4 and IPv6 packets).
pub fn default_table() -> Table {
    Table::new(crate::TableFamily::Inet, "ipsetmgr")
}

/// The reconciler over the nft sets of one table.
pub type NftReconciler<D> = Reconciler<NftKernel<D>>;

/// The reconciler over the owned sets (by `config.naming`) of `table` (see
/// [`default_table`]) through `dp`.
pub fn reconciler<D: NftDataplane>(
    dp: D,
    table: Table,
    config: ReconcilerConfig,
) -> NftReconciler<D> {
    let naming = config.naming.clone();
    Reconciler::new(NftKernel::new(dp, table, naming), config)
}

/// Over native nf_tables netlink (`--backend nft`).
pub fn netlink_reconciler(
    table: Table,
    config: ReconcilerConfig,
) -> Result<NftReconciler<crate::netlink::NetlinkNft>, NftError> {
    Ok(reconciler(
        crate::netlink::NetlinkNft::new()?,
        table,
        config,
    ))
}

/// Over `nft -j` (`--backend nft-cli`).
pub fn cli_reconciler(table: Table, config: ReconcilerConfig) -> NftReconciler<crate::cli::CliNft> {
    reconciler(crate::cli::CliNft::new(), table, config)
}

/// What the adapter believes the kernel holds for one set.
#[derive(Clone, Debug)]
enum Belief {
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

/// One desired set (opaque outside this crate).
#[derive(Clone, Debug)]
pub struct NftSet {
    header: SetHeader,
    members_src: Arc<MemberSet>,
    desired: Result<Compiled, SetError>,
    kernel: Belief,
    /// The kernel has held the set as desired: its disappearance is drift.
    held_once: bool,
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
            Belief::Unknown | Belief::Absent => Ok(Some(Write::Create)),
            Belief::Present {
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
            Belief::Present { references: 0, .. } => Ok(Some(Write::Recreate)),
            Belief::Present {
                spec, references, ..
            } => Err(SetError::NotReplaced(NotReplaced {
                kernel: spec.as_ref().and_then(kind_of),
                wanted: self.header.kind,
                references: *references,
            })),
        }
    }

    fn in_sync(&self) -> bool {
        matches!(self.write(), Ok(None))
    }
}

/// Take the kernel's word for one set; the differences to what was
/// believed are the drift (against the desired set for a first read).
fn absorb(s: &mut NftSet, k: Option<crate::NftKernelSet>) -> Drift {
    let before = std::mem::replace(&mut s.kernel, Belief::Absent);
    let believed_present = matches!(before, Belief::Present { .. });
    let Some(k) = k else {
        return Drift {
            rewritten: believed_present && s.held_once,
            ..Drift::default()
        };
    };
    let clean = k.unmanaged.is_empty() && k.unreadable_elements == 0;
    let spec = k.spec.filter(|_| clean);
    s.kernel = Belief::Present {
        spec,
        references: k.references,
        elements: k.elements.filter(|_| spec.is_some()),
    };
    // Against what was believed; on a first read, against what is wanted.
    let expected: Option<(NftSetSpec, &Elements)> = match &before {
        Belief::Present {
            spec: Some(spec),
            elements: Some(e),
            ..
        } => Some((*spec, e)),
        Belief::Present { .. } => return Drift::default(), // known to be replaced
        _ => match &s.desired {
            Ok(c) => Some((c.shape.spec, &c.elements)),
            Err(_) => None,
        },
    };
    let (Some((want, want_elems)), Belief::Present { spec, elements, .. }) = (expected, &s.kernel)
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
    s.held_once |= s.in_sync();
    drift
}

/// The nf_tables sets of one table through an [`NftDataplane`].
pub struct NftKernel<D: NftDataplane> {
    dp: D,
    table: Table,
    naming: Naming,
    /// The ruleset generation when the current full resync started: what
    /// the adapter believes holds at it once every set is read.
    resync_generation: Option<u32>,
}

impl<D: NftDataplane> NftKernel<D> {
    /// The owned sets (by `naming`) of `table`. Nothing is read or written
    /// until the reconciler's first apply.
    pub fn new(dp: D, table: Table, naming: Naming) -> NftKernel<D> {
        NftKernel {
            dp,
            table,
            naming,
            resync_generation: None,
        }
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

    /// The nft name the adapter gives a desired set.
    pub fn set_name(&self, d: &DesiredSet) -> String {
        names::nft_set_name(&self.naming, &d.name, &d.policy)
    }

    /// The project names of held policies' sets (what list:set members
    /// name them by).
    fn held_names(&self, cx: &Context<'_>) -> BTreeSet<String> {
        cx.held_policies
            .iter()
            .flat_map(|p| self.naming.main_set_names(p))
            .collect()
    }

    fn apply_ops(&mut self, ops: &[NftOp<'_>]) -> Result<(), crate::NftBatchError> {
        let naming = &self.naming;
        self.dp.apply(&self.table, ops, &|n| names::owns(naming, n))
    }

    /// Commit the new size of every set in `writes` that must grow, in one
    /// transaction of its own, and believe it.
    fn grow_first(
        &mut self,
        sets: &mut Sets<NftSet>,
        writes: &[(String, Write)],
    ) -> Result<(), Box<BatchFailure>> {
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
                let c = sets[name].set.desired.as_ref().ok()?;
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
        if let Err(e) = self.apply_ops(&ops) {
            if matches!(e.error, NftError::GenerationMoved { .. }) {
                return Err(moved(e, sets));
            }
            let set = e
                .op_index
                .and_then(|i| grows.get(i))
                .map(|(n, _)| n.to_string());
            return Err(failure(e, set));
        }
        drop(ops);
        for (name, size) in grows.iter().map(|(n, spec)| (n.to_string(), spec.size)) {
            if let Some(Belief::Present {
                spec: Some(spec), ..
            }) = sets.get_mut(&name).map(|e| &mut e.set.kernel)
            {
                spec.size = size;
            }
        }
        Ok(())
    }
}

/// A transaction refused because someone changed the ruleset since we read
/// it: any of our sets may be other than believed, so all are read again
/// before the retry.
fn moved(e: crate::NftBatchError, sets: &Sets<NftSet>) -> Box<BatchFailure> {
    let mut f = failure(e, None);
    f.reread = sets.keys().cloned().collect();
    f
}

/// A failed transaction as the reconciler needs it: nothing of it was
/// applied. An error that says the table changed under us (a set or
/// element that is or is not there) asks for a re-read, not isolation; a
/// rule that appeared (in use) makes the belief about references stale too.
fn failure(e: crate::NftBatchError, set: Option<String>) -> Box<BatchFailure> {
    let stale = is_stale_belief(&e.error);
    let reread = match &set {
        Some(s) if stale || matches!(e.error, NftError::InUse(_)) => vec![s.clone()],
        _ => Vec::new(),
    };
    let error = KernelError::from(e.error);
    Box::new(BatchFailure {
        about_set: !stale && error.kind().is_set_specific(),
        error,
        set,
        element: None,
        reread,
        partly_written: Vec::new(),
        leftovers: Vec::new(),
    })
}

impl Write {
    fn kind(&self) -> WriteKind {
        match self {
            Write::Create => WriteKind::Create,
            Write::Delta { .. } => WriteKind::Delta,
            Write::Recreate => WriteKind::Recreate,
        }
    }
}

impl<D: NftDataplane> Kernel for NftKernel<D> {
    type Set = NftSet;
    type Read = crate::NftKernelSet;

    /// "nft" over netlink, "nft-cli" over `nft -j`, "nft-model" otherwise.
    fn id(&self) -> BackendId {
        let name = match self.dp.name() {
            "netlink" => "nft",
            "cli" => "nft-cli",
            _ => "nft-model",
        };
        BackendId { name, kind: "nft" }
    }

    fn naming(&self) -> &Naming {
        &self.naming
    }

    fn kernel_name(&self, desired: &DesiredSet) -> String {
        self.set_name(desired)
    }

    fn policy_names(&self, policy: &str) -> Vec<String> {
        self.naming
            .main_set_names(policy)
            .iter()
            .map(|canonical| names::nft_set_name(&self.naming, canonical, policy))
            .collect()
    }

    /// A missing table is no error: every set is then absent.
    fn list_owned(&mut self) -> Result<Vec<Owned>, KernelError> {
        let naming = &self.naming;
        let owned = |n: &str| names::owns(naming, n);
        let listed = self.dp.list_sets(&self.table, &owned)?.unwrap_or_default();
        Ok(listed
            .into_iter()
            .filter(|n| owned(n))
            .map(|name| Owned {
                name,
                leftover: false,
            })
            .collect())
    }

    fn read(&mut self, name: &str) -> Result<Option<crate::NftKernelSet>, KernelError> {
        Ok(self.dp.read_set(&self.table, name)?)
    }

    /// Any committed transaction moves the ruleset generation (an element
    /// added by `nft` to one of our sets as much as a rule in another
    /// table), and ours are made against the generation we know, so an
    /// unmoved generation means the kernel still holds what we believe.
    /// One small GETGEN instead of dumping every set (docs/architecture.md,
    /// "Quiet resyncs").
    fn unchanged_since_last_read(&mut self) -> bool {
        let expected = self.dp.expected_generation();
        // Unreadable: read everything, as without the check.
        let now = self.dp.generation().ok().flatten();
        self.resync_generation = now;
        if now.is_some() && now == expected {
            return true;
        }
        // Read again: batches go unchecked until the reads are done.
        self.dp.expect_generation(None);
        false
    }

    fn full_read_done(&mut self) {
        // A change during the reads moved the generation past this one: the
        // next resync reads again, and a batch made against it is refused.
        self.dp.expect_generation(self.resync_generation.take());
    }

    fn new_set(&mut self, name: &str, d: &DesiredSet, cx: &Context<'_>) -> NftSet {
        NftSet {
            header: d.header.clone(),
            members_src: d.members.clone(),
            desired: compile(name, d, cx.desired, &self.held_names(cx)),
            kernel: Belief::Unknown,
            held_once: false,
        }
    }

    /// An unchanged policy keeps its compiled elements (a million members
    /// are not compiled again); a list:set depends on the sets it lists, so
    /// it is always flattened again; a few members changed in a set of
    /// exact elements patch the elements rather than compile them all.
    fn update_set(&mut self, s: &mut NftSet, name: &str, d: &DesiredSet, cx: &Context<'_>) -> bool {
        let list = d.header.kind.set_type == ipsetmgr_ipset::SetType::ListSet;
        if !list && Arc::ptr_eq(&s.members_src, &d.members) && s.header == d.header {
            return false;
        }
        let patched = match &s.desired {
            Ok(c) if !list => compile::patch(c, &s.members_src, d).map(Ok),
            _ => None,
        };
        let desired = patched.unwrap_or_else(|| compile(name, d, cx.desired, &self.held_names(cx)));
        let changed = desired != s.desired;
        s.desired = desired;
        s.header = d.header.clone();
        s.members_src = d.members.clone();
        changed
    }

    fn believe_absent(&self, s: &mut NftSet) {
        s.kernel = Belief::Absent;
    }

    fn absorb(&self, _name: &str, s: &mut NftSet, read: Option<crate::NftKernelSet>) -> Drift {
        absorb(s, read)
    }

    fn in_sync(&self, s: &NftSet) -> bool {
        s.in_sync()
    }

    fn member_count(&self, s: &NftSet) -> usize {
        s.members_src.len()
    }

    /// What each due set needs; the ones that cannot be written (nft
    /// cannot hold them, a referenced set would have to be replaced) are
    /// refused, without a round trip to the kernel.
    fn plan(&mut self, sets: &mut Sets<NftSet>, due: Vec<String>) -> Planned {
        let mut planned = Planned::default();
        for name in due {
            match sets[&name].set.write() {
                Ok(Some(w)) => planned.writes.push((name, w.kind())),
                Ok(None) => {}
                Err(e) => planned.refused.push((name, e)),
            }
        }
        planned
    }

    /// One transaction of every write (after one that grows the sets that
    /// must: see [`Resize::Grow`]).
    fn write(
        &mut self,
        sets: &mut Sets<NftSet>,
        writes: &[(String, WriteKind)],
    ) -> Result<(), Box<BatchFailure>> {
        let writes: Vec<(String, Write)> = writes
            .iter()
            .filter_map(|(name, _)| Some((name.clone(), sets[name].set.write().ok()??)))
            .collect();
        self.grow_first(sets, &writes)?;
        let mut ops: Vec<NftOp<'_>> = vec![NftOp::EnsureTable];
        let mut spans: Vec<(std::ops::Range<usize>, &str)> = Vec::new();
        for (name, w) in &writes {
            let start = ops.len();
            let Ok(c) = &sets[name].set.desired else {
                continue; // write() refuses these
            };
            push_ops(&mut ops, name, c, w);
            spans.push((start..ops.len(), name));
        }
        let result = self.apply_ops(&ops);
        drop(ops);
        result.map_err(|e| {
            if matches!(e.error, NftError::GenerationMoved { .. }) {
                return moved(e, sets);
            }
            let set = e.op_index.and_then(|i| {
                spans
                    .iter()
                    .find(|(r, _)| r.contains(&i))
                    .map(|(_, n)| n.to_string())
            });
            failure(e, set)
        })
    }

    fn committed(&self, s: &mut NftSet) {
        let Ok(c) = &s.desired else {
            return;
        };
        let references = match s.kernel {
            Belief::Present { references, .. } => references,
            _ => 0,
        };
        s.kernel = Belief::Present {
            spec: Some(c.shape.spec),
            references,
            elements: Some(c.elements.clone()),
        };
        s.held_once = true;
    }

    /// Deletes in one transaction. A set the kernel refuses to delete (a
    /// rule references it: EBUSY) is reported and the rest go again without
    /// it, so one referenced set never keeps the others.
    fn delete(&mut self, names: &[String]) -> Vec<Result<(), KernelError>> {
        let mut results: Vec<Option<Result<(), KernelError>>> = vec![None; names.len()];
        let mut todo: Vec<usize> = (0..names.len()).collect();
        while !todo.is_empty() {
            let ops: Vec<NftOp<'_>> = todo
                .iter()
                .map(|&i| NftOp::DeleteSet { set: &names[i] })
                .collect();
            let result = self.apply_ops(&ops);
            drop(ops);
            let e = match result {
                Ok(()) => break,
                Err(e) => e,
            };
            let Some(at) = e.op_index.filter(|i| *i < todo.len()) else {
                // Refused as a whole: every one is retried at the next resync.
                let error = KernelError::from(e.error);
                for i in todo.drain(..) {
                    results[i] = Some(Err(error.clone()));
                }
                break;
            };
            let i = todo.remove(at);
            results[i] = Some(Err(KernelError::from(e.error)));
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }

    fn describe(&mut self, sets: &Sets<NftSet>, name: &str) -> String {
        let s = &sets[name].set;
        let at = self.shown_name(name);
        let elements = || s.desired.as_ref().map_or(0, |c| c.elements.len());
        match s.write() {
            Ok(None) => format!("keep {at}"),
            Ok(Some(Write::Create)) => format!("create {at} with {} elements", elements()),
            Ok(Some(Write::Delta { del, add, .. })) => format!(
                "update {at}: add {}, delete {} elements",
                add.len(),
                del.len()
            ),
            Ok(Some(Write::Recreate)) => format!(
                "recreate {at} (type changed, not referenced) with {} elements",
                elements()
            ),
            Err(why) => format!("cannot update {at}: {why}"),
        }
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        let id = self.id();
        let naming = &self.naming;
        let owned = |n: &str| names::owns(naming, n);
        let names = self.dp.list_sets(&self.table, &owned)?;
        let mut listed = Vec::new();
        for name in names.unwrap_or_default() {
            let Some(k) = self.dp.read_set(&self.table, &name)? else {
                continue;
            };
            listed.push(ListedSet {
                set: SetRef {
                    backend: id,
                    name: self.shown_name(&name),
                },
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
    fn shown_name(&self, name: &str) -> String {
        format!("{} {name}", self.table)
    }
}

/// The operations of one write, appended to `ops`.
fn push_ops<'a>(ops: &mut Vec<NftOp<'a>>, name: &'a str, c: &'a Compiled, w: &'a Write) {
    let create = NftOp::CreateSet {
        name,
        spec: &c.shape.spec,
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
                // `add set` on an existing set of the same key and flags
                // only takes the new size.
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
        ops.push(NftOp::AddElements {
            set: name,
            elements: &c.elements,
        });
    }
}
