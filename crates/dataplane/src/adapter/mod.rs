//! The ipset adapter: ipsets as one kernel of the neutral reconciler
//! ([`ipsetmgr_sets::Reconciler`]). What only ipsets need lives here: sets
//! are filled under a temp name and renamed or swapped into place (the
//! kernel has no transaction), a list:set is taken out of and put back
//! into around a recreate of a set it lists, types the kernel lacks are
//! learned, and the believed content of a set is its desired members minus
//! pending adds plus pending deletes (one copy of a million members).

mod batch;
#[cfg(test)]
mod driver_tests;
mod read;
#[cfg(test)]
mod retire_tests;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use ipsetmgr_ipset::{Member, MemberSet, Naming, SetType};
use ipsetmgr_sets::{
    BackendId, BatchFailure, Context, DesiredSet, Drift, ErrorKind, Kernel, KernelError, ListedSet,
    Owned, Planned, Reconciler, ReconcilerConfig, SetError, SetRef, Sets, WriteKind,
};

pub use batch::{LARGE_CHANGE_OPS, SMALL_CHANGE_OPS};
use state::Belief;
pub use state::SetState;

use crate::{Dataplane, DataplaneError, KernelSet, Op};

/// The reconciler over ipsets.
pub type IpsetReconciler<D> = Reconciler<IpsetKernel<D>>;

/// The reconciler over the ipsets of `dp`, owning the sets of
/// `config.naming`.
pub fn reconciler<D: Dataplane>(dp: D, config: ReconcilerConfig) -> IpsetReconciler<D> {
    let naming = config.naming.clone();
    Reconciler::new(IpsetKernel::new(dp, naming), config)
}

impl From<DataplaneError> for KernelError {
    fn from(e: DataplaneError) -> KernelError {
        let kind = match &e {
            DataplaneError::SetExists(_) => ErrorKind::SetExists,
            DataplaneError::SetMissing(_) => ErrorKind::SetMissing,
            DataplaneError::InUse(_) => ErrorKind::InUse,
            DataplaneError::TypeNotSupported(_) => ErrorKind::NotSupported,
            DataplaneError::SetFull(_) => ErrorKind::SetFull,
            DataplaneError::InvalidElement { .. } => ErrorKind::ElementRefused,
            DataplaneError::TypeMismatch(..) | DataplaneError::NestedListSet(_) => {
                ErrorKind::Refused
            }
            DataplaneError::Unavailable(_) => ErrorKind::Unavailable,
            DataplaneError::Protocol(_) => ErrorKind::Protocol,
            DataplaneError::Other(_) => ErrorKind::Other,
        };
        KernelError::new(kind, e)
    }
}

/// ipsets through a [`Dataplane`] (netlink, the `ipset` tool, the model).
pub struct IpsetKernel<D: Dataplane> {
    dp: D,
    naming: Naming,
    /// Set types learned unsupported from a failed batch (forgotten at
    /// each full resync: a kernel module may have been loaded).
    unsupported: HashSet<SetType>,
    temp_counter: u64,
    /// From [`Kernel::plan`] to [`Kernel::write`]: per recreated set, this
    /// adapter's list:sets holding it, each with a member set of just its
    /// name (see [`batch::push_ops`]).
    unlinks: Unlinks,
}

type Unlinks = BTreeMap<String, Vec<(String, MemberSet)>>;

impl<D: Dataplane> IpsetKernel<D> {
    pub fn new(dp: D, naming: Naming) -> IpsetKernel<D> {
        // Temp names only need to be unique among live temp sets; seeding
        // from the clock keeps restarts from colliding with leftovers
        // before the first resync cleans them.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64 & 0xffff_ffff);
        IpsetKernel {
            dp,
            naming,
            unsupported: HashSet::new(),
            temp_counter: seed,
            unlinks: Unlinks::new(),
        }
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    fn blocked(&mut self, t: SetType) -> bool {
        self.unsupported.contains(&t) || self.dp.supports(t) == Some(false)
    }

    /// A fresh temp set name for each set filled before it is put in place
    /// ("" for deltas).
    fn temp_names(&mut self, writes: &[(String, WriteKind)]) -> Vec<String> {
        writes
            .iter()
            .map(|(_, kind)| match kind {
                WriteKind::Replace | WriteKind::Create | WriteKind::Recreate => {
                    self.temp_counter = self.temp_counter.wrapping_add(1);
                    self.naming.temp_set_name(self.temp_counter)
                }
                WriteKind::Delta => String::new(),
            })
            .collect()
    }
}

/// This adapter's list:sets that the kernel is believed to hold `name` in
/// (only lists whose kernel content is known: not being rewritten).
fn lists_holding(sets: &Sets<SetState>, name: &str) -> Vec<String> {
    let member = Member::Set(name.into());
    sets.iter()
        .filter(|(_, e)| {
            let l = &e.set;
            l.header.kind.set_type == SetType::ListSet
                && !l.replace
                && matches!(l.kernel, Belief::Present { .. })
                && ((l.members.contains(&member) && !l.pending_adds.contains(&member))
                    || l.pending_dels.contains(&member))
        })
        .map(|(n, _)| n.clone())
        .collect()
}

/// `name` is recreated after being taken out of `lists`: each list that
/// still wants it adds it back, in the same batch (lists come last).
fn relink_after_recreate(
    sets: &mut Sets<SetState>,
    name: &str,
    lists: &[String],
    writes: &mut Vec<(String, WriteKind)>,
) {
    let member = Member::Set(name.into());
    for list in lists {
        let Some(l) = sets.get_mut(list).map(|e| &mut e.set) else {
            continue;
        };
        l.pending_dels.remove(&member);
        if l.members.contains(&member) {
            l.pending_adds.insert(member.clone());
        }
        l.dirty = true;
        if !writes.iter().any(|(n, _)| n == list) {
            writes.push((list.clone(), WriteKind::Delta));
        }
    }
}

impl<D: Dataplane> Kernel for IpsetKernel<D> {
    type Set = SetState;
    type Read = KernelSet;

    fn id(&self) -> BackendId {
        BackendId {
            name: self.dp.name(),
            kind: "ipset",
        }
    }

    fn naming(&self) -> &Naming {
        &self.naming
    }

    fn list_owned(&mut self) -> Result<Vec<Owned>, KernelError> {
        let naming = &self.naming;
        let names = self.dp.list_owned(&|n| naming.owns(n))?;
        Ok(names
            .into_iter()
            .filter(|n| naming.owns(n))
            .map(|name| Owned {
                leftover: naming.is_temp(&name),
                name,
            })
            .collect())
    }

    fn read(&mut self, name: &str) -> Result<Option<KernelSet>, KernelError> {
        Ok(self.dp.read_set(name)?)
    }

    fn forget_learned(&mut self) {
        self.unsupported.clear();
    }

    fn new_set(&mut self, _name: &str, d: &DesiredSet, _cx: &Context<'_>) -> SetState {
        SetState::new(d.header.clone(), d.members.clone())
    }

    fn update_set(
        &mut self,
        set: &mut SetState,
        _name: &str,
        d: &DesiredSet,
        _cx: &Context<'_>,
    ) -> bool {
        set.update(d.header.clone(), d.members.clone())
    }

    fn believe_absent(&self, set: &mut SetState) {
        set.kernel = Belief::Absent;
    }

    fn absorb(&self, name: &str, set: &mut SetState, read: Option<KernelSet>) -> Drift {
        read::absorb(name, set, read)
    }

    fn in_sync(&self, set: &SetState) -> bool {
        set.in_sync()
    }

    fn member_count(&self, set: &SetState) -> usize {
        set.members.len()
    }

    /// A list:set member naming a held set (its policy failed) stays
    /// listed while that set exists in the kernel: a failure to load never
    /// changes the kernel. While the set does not exist (its policy never
    /// applied) it is left out, since a list:set cannot list a missing set;
    /// it is listed once its policy applies. Known only after a resync, so
    /// decided here and not by the compiler.
    fn before_writes(
        &mut self,
        sets: &mut Sets<SetState>,
        held: &HashSet<String>,
        existing: &BTreeSet<String>,
    ) {
        let missing = |m: &Member| {
            matches!(m.without_comment(), Member::Set(n)
                if held.contains(&**n) && !existing.contains(&**n))
        };
        for s in sets.values_mut().map(|e| &mut e.set) {
            if s.header.kind.set_type != SetType::ListSet || !s.members.iter().any(|m| missing(&m))
            {
                continue;
            }
            let kept: Vec<Member> = s.members.iter().filter(|m| !missing(m)).collect();
            let kept = Arc::new(MemberSet::from_members(s.header.kind, kept));
            let header = s.header.clone();
            s.update(header, kept);
        }
    }

    /// Referenced sets before the list:sets that list them; sets of types
    /// known to be unsupported refused without a round trip to the kernel;
    /// for each set recreated under our own list:sets, the lists to take it
    /// out of and back into.
    fn plan(&mut self, sets: &mut Sets<SetState>, due: Vec<String>) -> Planned {
        let mut planned = Planned::default();
        let mut order = Vec::with_capacity(due.len());
        for list_pass in [false, true] {
            for name in &due {
                let t = sets[name].set.header.kind.set_type;
                if (t == SetType::ListSet) != list_pass {
                    continue;
                }
                if self.blocked(t) {
                    self.unsupported.insert(t);
                    let error = DataplaneError::TypeNotSupported(t.to_string());
                    planned
                        .refused
                        .push((name.clone(), SetError::Kernel(error.into())));
                } else {
                    order.push(name.clone());
                }
            }
        }
        self.unlinks.clear();
        for name in order {
            if planned.writes.iter().any(|(n, _)| *n == name) {
                // A list already planned to relink a recreated set.
                continue;
            }
            let lists = lists_holding(sets, &name);
            match batch::plan_for(&sets[&name].set, lists.len() as u32) {
                Ok(kind) => {
                    if kind == WriteKind::Recreate && !lists.is_empty() {
                        relink_after_recreate(sets, &name, &lists, &mut planned.writes);
                        let list_kind = sets[&lists[0]].set.header.kind;
                        let this =
                            MemberSet::from_members(list_kind, [Member::Set(name.as_str().into())]);
                        self.unlinks.insert(
                            name.clone(),
                            lists.into_iter().map(|l| (l, this.clone())).collect(),
                        );
                    }
                    planned.writes.push((name, kind));
                }
                Err(why) => planned.refused.push((name, why.into())),
            }
        }
        // The lists relinked above were appended with their own writes;
        // keep every list after every set it may list.
        planned
            .writes
            .sort_by_key(|(name, _)| sets[name].set.header.kind.set_type == SetType::ListSet);
        planned
    }

    fn write(
        &mut self,
        sets: &mut Sets<SetState>,
        writes: &[(String, WriteKind)],
    ) -> Result<(), Box<BatchFailure>> {
        let temps = self.temp_names(writes);
        let unlinks = std::mem::take(&mut self.unlinks);
        let mut ops: Vec<Op<'_>> = Vec::new();
        let mut spans = Vec::with_capacity(writes.len());
        for ((name, kind), temp) in writes.iter().zip(&temps) {
            let start = ops.len();
            let unlink = unlinks.get(name).map_or(&[][..], Vec::as_slice);
            batch::push_ops(&mut ops, name, &sets[name].set, *kind, temp, unlink);
            spans.push(batch::OpSpan {
                set: name.clone(),
                plan: *kind,
                ops: start..ops.len(),
                temp: (!temp.is_empty()).then(|| temp.clone()),
                also_touched: unlink.iter().map(|(l, _)| l.clone()).collect(),
            });
        }
        let result = self.dp.apply(&ops);
        drop(ops);
        let Err(error) = result else {
            return Ok(());
        };
        if let DataplaneError::TypeNotSupported(_) = error.error
            && let Some(span) = batch::span_of(&spans, error.op_index)
        {
            self.unsupported
                .insert(sets[&span.set].set.header.kind.set_type);
        }
        Err(Box::new(batch::failure(error, &spans)))
    }

    fn committed(&self, set: &mut SetState) {
        set.committed();
    }

    fn delete(&mut self, names: &[String]) -> Vec<Result<(), KernelError>> {
        names
            .iter()
            .map(|set| {
                self.dp
                    .apply(&[Op::Destroy { set }])
                    .map_err(|e| e.error.into())
            })
            .collect()
    }

    fn describe(&mut self, sets: &Sets<SetState>, name: &str) -> String {
        let s = &sets[name].set;
        let t = s.header.kind.set_type;
        if self.blocked(t) {
            return format!("skip {name}: set type {t} is not supported by this kernel");
        }
        match batch::plan_for(s, lists_holding(sets, name).len() as u32) {
            Ok(WriteKind::Delta) => format!(
                "update {name}: add {}, delete {}",
                s.pending_adds.len(),
                s.pending_dels.len()
            ),
            Ok(WriteKind::Create) => {
                format!("create {name} {t} with {} members", s.members.len())
            }
            Ok(WriteKind::Replace) => format!(
                "replace {name} atomically (temp set + swap) with {} members",
                s.members.len()
            ),
            Ok(WriteKind::Recreate) => format!(
                "recreate {name} as {t} with {} members (type changed, not referenced)",
                s.members.len()
            ),
            Err(why) => format!("cannot update {name}: {why}"),
        }
    }

    fn deletion_verb(&self) -> &'static str {
        "destroy"
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        let id = self.id();
        let owned = self.list_owned()?;
        let mut listed = Vec::with_capacity(owned.len());
        for o in owned {
            let Some(k) = self.dp.read_set(&o.name)? else {
                continue;
            };
            listed.push(ListedSet {
                kind: k
                    .header
                    .as_ref()
                    .map_or("(unmanaged type)".into(), |h| h.kind.to_string()),
                members: k.members.as_ref().map_or(0, |m| m.len()),
                max_elem: k.header.as_ref().map(|h| h.max_elem),
                references: k.references,
                role: if o.leftover { "temp" } else { "main" },
                set: SetRef {
                    backend: id,
                    name: o.name,
                },
            });
        }
        Ok(listed)
    }

    fn after_apply(&mut self) {
        crate::memory::release_free_memory();
    }
}
