//! The BPF adapter: [`BpfKernel`] holds the owned sets of one bpffs for the
//! neutral reconciler ([`ipsetmgr_sets::Reconciler`]), as the ipset and nft
//! adapters hold theirs (docs/bpf.md, "As a backend").
//!
//! What only the BPF kernel needs lives here:
//! - A set's kernel name is its project name (`ipm4-blocklist`), its pin
//!   `<bpffs>/ipsetmgr/<name>`; only hash:ip and hash:net (IPv4, IPv6;
//!   `nomatch` as value 0) can be held, anything else is refused per
//!   policy as unrepresentable, never approximated.
//! - The belief per set is the family, the trie's size and the entries the
//!   map held at the last dump or write. A write is deltas in place, or a
//!   full replacement (a fresh trie filled, then one slot swap) for a new
//!   size or a change larger than the set; a new set is created filled
//!   and pinned last.
//! - Writes are one set at a time, not one transaction: a failed write
//!   stops the batch, the sets before it stay written (and believed), the
//!   failing one is read again.

mod errors;
mod shape;

use std::sync::Arc;

use ipsetmgr_ipset::{Family, MemberSet, Naming, SetHeader};
use ipsetmgr_sets::{
    BackendId, BatchFailure, Context, DesiredSet, Drift, Kernel, KernelError, ListedSet, Owned,
    Planned, Reconciler, ReconcilerConfig, SetError, SetRef, Sets, WriteKind,
};

use self::shape::{Shape, diff, entries_of, missing_from, shape};
use crate::error::BpfError;
use crate::store::Bpffs;

/// The backend's `--backend` word and kind of set (the metrics' label).
pub const ID: BackendId = BackendId {
    name: "bpf",
    kind: "bpf",
};

/// The reconciler over the BPF sets of one bpffs.
pub type BpfReconciler = Reconciler<BpfKernel>;

/// The reconciler over the owned sets (by `config.naming`) pinned in `fs`.
pub fn reconciler(fs: Bpffs, config: ReconcilerConfig) -> BpfReconciler {
    let naming = config.naming.clone();
    Reconciler::new(BpfKernel::new(fs, naming), config)
}

/// What the adapter believes the kernel holds for one set.
#[derive(Clone, Debug)]
enum Belief {
    /// Never read: the coming resync decides.
    Unknown,
    Absent,
    /// `Err`: the pin has our name but is not one of our sets (someone
    /// else's map): it is never written, removed or replaced.
    Present(Result<Shape, KernelError>),
}

/// One set as the kernel holds it (a dump).
#[derive(Debug)]
pub enum BpfRead {
    Set {
        family: Family,
        max_entries: u32,
        entries: Vec<crate::Entry>,
    },
    /// The pin is not an array-of-maps holding a trie.
    NotASet(KernelError),
}

/// One desired set (opaque outside this crate).
#[derive(Clone, Debug)]
pub struct BpfDesired {
    header: SetHeader,
    members_src: Arc<MemberSet>,
    desired: Result<Shape, SetError>,
    kernel: Belief,
    /// The kernel has held the set as desired: its disappearance is drift.
    held_once: bool,
}

/// The write one set needs.
enum Write {
    Create,
    Delta {
        del: Vec<crate::Entry>,
        add: Vec<crate::Entry>,
    },
    /// A fresh trie filled and swapped in: atomic for readers.
    Replace,
    /// The pin holds a set of the other family (a trie's key size cannot
    /// change): unpinned and created again.
    Recreate,
}

impl Write {
    fn kind(&self) -> WriteKind {
        match self {
            Write::Create => WriteKind::Create,
            Write::Delta { .. } => WriteKind::Delta,
            Write::Replace => WriteKind::Replace,
            Write::Recreate => WriteKind::Recreate,
        }
    }
}

impl BpfDesired {
    /// What the set needs, `Ok(None)` when the kernel holds it already.
    fn write(&self) -> Result<Option<Write>, SetError> {
        let want = self.desired.as_ref().map_err(Clone::clone)?;
        let have = match &self.kernel {
            Belief::Unknown | Belief::Absent => return Ok(Some(Write::Create)),
            Belief::Present(Err(e)) => return Err(SetError::Kernel(e.clone())),
            Belief::Present(Ok(have)) => have,
        };
        if have.family != want.family {
            return Ok(Some(Write::Recreate));
        }
        if have.max_entries != want.max_entries {
            return Ok(Some(Write::Replace));
        }
        if Arc::ptr_eq(&have.entries, &want.entries) {
            return Ok(None);
        }
        let (del, add) = diff(&want.entries, &have.entries);
        if del.is_empty() && add.is_empty() {
            return Ok(None);
        }
        // Writing the new set whole takes one update per entry it holds;
        // deltas one per change. More changes than entries: replace (and
        // readers see the change at once rather than entry by entry).
        if del.len() + add.len() > want.entries.len() {
            return Ok(Some(Write::Replace));
        }
        Ok(Some(Write::Delta { del, add }))
    }

    fn in_sync(&self) -> bool {
        matches!(self.write(), Ok(None))
    }
}

/// Take the kernel's word for one set; the differences to what was
/// believed are the drift (against the desired set for a first read).
fn absorb(s: &mut BpfDesired, read: Option<BpfRead>) -> Drift {
    let before = std::mem::replace(&mut s.kernel, Belief::Absent);
    let Some(read) = read else {
        return Drift {
            rewritten: matches!(before, Belief::Present(_)) && s.held_once,
            ..Drift::default()
        };
    };
    let have = match read {
        BpfRead::NotASet(e) => {
            s.kernel = Belief::Present(Err(e));
            return Drift::default();
        }
        BpfRead::Set {
            family,
            max_entries,
            entries,
        } => Shape {
            family,
            max_entries,
            entries: Arc::new(entries_of(entries)),
        },
    };
    let expected: Option<Shape> = match &before {
        Belief::Present(Ok(shape)) => Some(shape.clone()),
        Belief::Present(Err(_)) => None,
        Belief::Unknown | Belief::Absent => s.desired.as_ref().ok().cloned(),
    };
    let drift = match &expected {
        Some(want) if want.family == have.family && want.max_entries == have.max_entries => Drift {
            missing: missing_from(&want.entries, &have.entries),
            extra: missing_from(&have.entries, &want.entries),
            rewritten: false,
        },
        Some(_) => Drift {
            rewritten: true,
            ..Drift::default()
        },
        None => Drift::default(),
    };
    // Held exactly as desired: share the desired entries, so that every
    // later look (in_sync for each report, plan, write) is a pointer
    // compare, not a diff of the whole set.
    let have = match &s.desired {
        Ok(want)
            if want.family == have.family
                && want.max_entries == have.max_entries
                && want.entries == have.entries =>
        {
            want.clone()
        }
        _ => have,
    };
    s.kernel = Belief::Present(Ok(have));
    s.held_once |= s.in_sync();
    drift
}

/// The BPF sets pinned in one bpffs.
pub struct BpfKernel {
    fs: Bpffs,
    naming: Naming,
}

impl BpfKernel {
    /// The owned sets (by `naming`) pinned under `fs`. Nothing is read or
    /// written until the reconciler's first apply.
    pub fn new(fs: Bpffs, naming: Naming) -> BpfKernel {
        BpfKernel { fs, naming }
    }

    pub fn bpffs(&self) -> &Bpffs {
        &self.fs
    }

    /// One set's write, as [`BpfDesired::write`] decided it.
    fn write_one(&self, name: &str, want: &Shape, w: &Write) -> Result<(), BpfError> {
        let all = || -> Vec<crate::Entry> {
            want.entries
                .iter()
                .map(|((a, p), n)| shape::entry(*a, *p, *n))
                .collect()
        };
        match w {
            Write::Create => self
                .fs
                .create(name, want.family, want.max_entries, &all())
                .map(drop),
            Write::Recreate => {
                self.fs.delete(name)?;
                self.fs
                    .create(name, want.family, want.max_entries, &all())
                    .map(drop)
            }
            Write::Replace => self.fs.open_set(name)?.replace(&all(), want.max_entries),
            Write::Delta { del, add } => {
                // Deletes first: the trie never holds more than the larger
                // of the old and the new set.
                let mut set = self.fs.open_set(name)?;
                set.delete(del)?;
                set.add(add)
            }
        }
    }
}

fn committed(s: &mut BpfDesired) {
    if let Ok(want) = &s.desired {
        s.kernel = Belief::Present(Ok(want.clone()));
        s.held_once = true;
    }
}

impl Kernel for BpfKernel {
    type Set = BpfDesired;
    type Read = BpfRead;

    fn id(&self) -> BackendId {
        ID
    }

    fn naming(&self) -> &Naming {
        &self.naming
    }

    /// The pins under `<bpffs>/ipsetmgr/` with an owned name; nothing else
    /// is looked at.
    fn list_owned(&mut self) -> Result<Vec<Owned>, KernelError> {
        Ok(self
            .fs
            .list(self.naming.prefix())?
            .into_iter()
            .filter(|n| self.naming.owns(n))
            .map(|name| Owned {
                leftover: self.naming.is_temp(&name),
                name,
            })
            .collect())
    }

    fn read(&mut self, name: &str) -> Result<Option<BpfRead>, KernelError> {
        let set = match self.fs.open_set(name) {
            Ok(set) => set,
            Err(BpfError::NotFound { .. }) => return Ok(None),
            Err(e @ BpfError::NotASet { .. }) => return Ok(Some(BpfRead::NotASet(e.into()))),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(BpfRead::Set {
            family: set.family(),
            max_entries: set.max_entries()?,
            entries: set.read()?,
        }))
    }

    fn new_set(&mut self, name: &str, d: &DesiredSet, _cx: &Context<'_>) -> BpfDesired {
        BpfDesired {
            header: d.header.clone(),
            members_src: d.members.clone(),
            desired: shape(name, d),
            kernel: Belief::Unknown,
            held_once: false,
        }
    }

    /// An unchanged policy keeps its entries (a million members are not
    /// converted again).
    fn update_set(
        &mut self,
        s: &mut BpfDesired,
        name: &str,
        d: &DesiredSet,
        _cx: &Context<'_>,
    ) -> bool {
        if Arc::ptr_eq(&s.members_src, &d.members) && s.header == d.header {
            return false;
        }
        let desired = shape(name, d);
        let changed = desired != s.desired;
        s.desired = desired;
        s.header = d.header.clone();
        s.members_src = d.members.clone();
        changed
    }

    fn believe_absent(&self, s: &mut BpfDesired) {
        s.kernel = Belief::Absent;
    }

    fn absorb(&self, _name: &str, s: &mut BpfDesired, read: Option<BpfRead>) -> Drift {
        absorb(s, read)
    }

    fn in_sync(&self, s: &BpfDesired) -> bool {
        s.in_sync()
    }

    fn member_count(&self, s: &BpfDesired) -> usize {
        s.members_src.len()
    }

    /// What each due set needs; sets a prefix map cannot hold, and pins
    /// that are not our sets, are refused without a round trip.
    fn plan(&mut self, sets: &mut Sets<BpfDesired>, due: Vec<String>) -> Planned {
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

    /// Each set in turn. A set written is believed at once (the batch is
    /// no transaction: what went in stays in).
    fn write(
        &mut self,
        sets: &mut Sets<BpfDesired>,
        writes: &[(String, WriteKind)],
    ) -> Result<(), Box<BatchFailure>> {
        let mut done: Vec<(String, WriteKind)> = Vec::new();
        for (name, kind) in writes {
            let Some(entry) = sets.get_mut(name) else {
                continue;
            };
            let s = &mut entry.set;
            let (Ok(Some(w)), Ok(want)) = (s.write(), &s.desired) else {
                continue; // plan() refused it, or it is in sync by now
            };
            if let Err(e) = self.write_one(name, want, &w) {
                let stale = errors::is_stale_belief(&e);
                let error = KernelError::from(e);
                return Err(Box::new(BatchFailure {
                    about_set: !stale && error.kind().is_set_specific(),
                    error,
                    set: Some(name.clone()),
                    element: None,
                    reread: vec![name.clone()],
                    partly_written: done,
                    leftovers: Vec::new(),
                }));
            }
            committed(s);
            done.push((name.clone(), *kind));
        }
        Ok(())
    }

    fn committed(&self, s: &mut BpfDesired) {
        committed(s);
    }

    /// Each pin in turn; a pin that is not one of our sets is refused
    /// (never removed), a missing one is done.
    fn delete(&mut self, names: &[String]) -> Vec<Result<(), KernelError>> {
        names
            .iter()
            .map(|n| self.fs.delete(n).map_err(KernelError::from))
            .collect()
    }

    fn describe(&mut self, sets: &Sets<BpfDesired>, name: &str) -> String {
        let s = &sets[name].set;
        let entries = || s.desired.as_ref().map_or(0, |w| w.entries.len());
        match s.write() {
            Ok(None) => format!("keep {name}"),
            Ok(Some(Write::Create)) => format!("create {name} with {} entries", entries()),
            Ok(Some(Write::Delta { del, add })) => format!(
                "update {name}: add {}, delete {} entries",
                add.len(),
                del.len()
            ),
            Ok(Some(Write::Replace)) => {
                format!(
                    "replace {name} (fresh trie, one swap) with {} entries",
                    entries()
                )
            }
            Ok(Some(Write::Recreate)) => format!(
                "recreate {name} (family changed) with {} entries",
                entries()
            ),
            Err(why) => format!("cannot update {name}: {why}"),
        }
    }

    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError> {
        let mut listed = Vec::new();
        for owned in self.list_owned()? {
            let Some(read) = self.read(&owned.name)? else {
                continue;
            };
            let (kind, members, max_elem) = match read {
                BpfRead::Set {
                    family,
                    max_entries,
                    entries,
                } => (
                    format!("lpm_trie {}", family.ipset_name()),
                    entries.len(),
                    Some(max_entries),
                ),
                BpfRead::NotASet(_) => ("(not an ipsetmgr set)".to_string(), 0, None),
            };
            listed.push(ListedSet {
                set: SetRef {
                    backend: ID,
                    name: owned.name,
                },
                kind,
                members,
                max_elem,
                // A map's users (programs, other maps) are not countable
                // through the bpf(2) interface without walking them all.
                references: 0,
                role: "main",
            });
        }
        Ok(listed)
    }
}
