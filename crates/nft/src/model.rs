//! An in-memory nf_tables with the kernel's semantics for what this crate
//! does (one atomic transaction per apply, `add set` that keeps a set of the
//! same key and flags, overlap refusal in interval sets, the size limit,
//! EBUSY for a set a rule references) and injectable faults, for the tests
//! of the manager built on this crate. `Clone` shares the state, so a test
//! keeps a handle to inspect and tamper with "the kernel".
//!
//! The conformance suite (crates/nft/tests) runs the same bodies against
//! the model and the real kernel, so the model cannot drift from it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use ipsetmgr_ipset::Comment;

use crate::element::{ElementRef, Elements};
use crate::spec::{KeyType, NftSetSpec};
use crate::{
    NftBatchError, NftDataplane, NftError, NftKernelSet, NftOp, Table, TableFamily, precheck,
};

/// A set as the model holds it: elements by their bytes (key, then the
/// range end), which is the order `read_set` returns them in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSet {
    pub spec: NftSetSpec,
    pub elements: BTreeMap<Vec<u8>, Option<Comment>>,
    pub handle: u64,
    /// Rules that reference the set (the test hook's, not the project's).
    pub references: u32,
    /// A size set on the existing set in the open transaction: like the
    /// kernel, it holds from the commit on, so the transaction's own
    /// inserts still count against `spec.size`.
    pub size_at_commit: Option<Option<u32>>,
}

/// A table as the model holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelTable {
    pub sets: BTreeMap<String, ModelSet>,
    /// Chains (with their rules) someone else created.
    pub chains: BTreeSet<String>,
    /// Maps and stateful objects someone else created.
    pub others: BTreeSet<String>,
}

/// A fault to inject.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The next apply fails with this (nothing applied).
    FailNextApply(NftBatchError),
    /// The next `read_set` fails with this.
    FailNextRead(NftError),
    /// The next `list_sets` fails with this.
    FailNextList(NftError),
}

/// Counters of the work that reached "the kernel".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub transactions: usize,
    pub reads: usize,
    pub lists: usize,
}

#[derive(Debug, Default)]
struct State {
    tables: BTreeMap<(TableFamily, String), ModelTable>,
    faults: VecDeque<Fault>,
    next_handle: u64,
    stats: Stats,
}

#[derive(Clone, Debug, Default)]
pub struct ModelNft {
    state: Arc<Mutex<State>>,
}

fn key_of(t: &Table) -> (TableFamily, String) {
    (t.family, t.name.clone())
}

impl ModelNft {
    pub fn new() -> ModelNft {
        ModelNft::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another test thread must not poison every later call.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    pub fn table(&self, t: &Table) -> Option<ModelTable> {
        self.lock().tables.get(&key_of(t)).cloned()
    }

    /// "A rule in the table references the set": what `nft add rule … @set`
    /// does (the table gets a chain, the set a reference).
    pub fn add_rule_referencing(&self, t: &Table, set: &str) -> bool {
        let mut s = self.lock();
        let Some(table) = s.tables.get_mut(&key_of(t)) else {
            return false;
        };
        let Some(m) = table.sets.get_mut(set) else {
            return false;
        };
        m.references += 1;
        table.chains.insert("c".into());
        true
    }

    /// `nft delete table` out of band (with everything in it); whether the
    /// table was there.
    pub fn delete_table(&self, t: &Table) -> bool {
        self.lock().tables.remove(&key_of(t)).is_some()
    }

    /// Out-of-band objects ("someone ran nft by hand").
    pub fn tamper(&self, t: &Table, f: impl FnOnce(&mut ModelTable)) {
        let mut s = self.lock();
        f(s.tables.entry(key_of(t)).or_default());
    }

    fn fault(&self, pick: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let mut s = self.lock();
        let i = s.faults.iter().position(pick)?;
        s.faults.remove(i)
    }
}

/// A range's bytes as numbers per field (a mark is host order).
fn field_cmp(key: KeyType, a: &[u8], b: &[u8], i: usize) -> std::cmp::Ordering {
    let f = key.fields()[i];
    let at = key.offset(i);
    let (x, y) = (&a[at..at + f.len()], &b[at..at + f.len()]);
    if f.host_order() {
        x.iter().rev().cmp(y.iter().rev())
    } else {
        x.cmp(y)
    }
}

/// Whether ranges `a` and `b` (key ++ key end) share a value in every field.
fn overlaps(key: KeyType, a: &[u8], b: &[u8]) -> bool {
    let n = key.len();
    let (a0, a1) = a.split_at(n);
    let (b0, b1) = b.split_at(n);
    (0..key.fields().len())
        .all(|i| field_cmp(key, a0, b1, i).is_le() && field_cmp(key, b0, a1, i).is_le())
}

fn stored(e: &ElementRef<'_>) -> Vec<u8> {
    let mut v = e.key.to_vec();
    if let Some(end) = e.key_end {
        v.extend_from_slice(end);
    }
    v
}

impl ModelSet {
    fn add(&mut self, set: &str, e: &ElementRef<'_>) -> Result<(), NftError> {
        let bytes = stored(e);
        if self.elements.contains_key(&bytes) {
            return Ok(()); // the kernel keeps it (and its comment)
        }
        if self.spec.interval {
            let key = self.spec.key;
            let clash = if key.is_concat() {
                self.elements.keys().any(|k| overlaps(key, k, &bytes))
            } else {
                // Disjoint ranges in order: only the neighbours can overlap.
                let before = self.elements.range(..bytes.clone()).next_back();
                let after = self.elements.range(bytes.clone()..).next();
                [before, after]
                    .into_iter()
                    .flatten()
                    .any(|(k, _)| overlaps(key, k, &bytes))
            };
            if clash {
                return Err(NftError::ElementExists {
                    set: set.into(),
                    element: e.to_string(),
                });
            }
        }
        if self
            .spec
            .size
            .is_some_and(|s| self.elements.len() >= s as usize)
        {
            return Err(NftError::SetFull(set.into()));
        }
        self.elements.insert(bytes, e.comment.cloned());
        Ok(())
    }

    fn elements(&self) -> Elements {
        let mut out =
            Elements::with_capacity(self.spec.key, self.spec.interval, self.elements.len());
        let n = self.spec.key.len();
        for (k, c) in &self.elements {
            let (key, end) = if self.spec.interval {
                (&k[..n], Some(&k[n..]))
            } else {
                (&k[..], None)
            };
            let _ = out.push_raw(key, end, c.clone());
        }
        out
    }
}

/// One op on the working copy of the tables.
fn apply_op(
    tables: &mut BTreeMap<(TableFamily, String), ModelTable>,
    next_handle: &mut u64,
    t: &Table,
    op: &NftOp<'_>,
) -> Result<(), (Option<usize>, NftError)> {
    if let NftOp::EnsureTable = op {
        tables.entry(key_of(t)).or_default();
        return Ok(());
    }
    let table = tables
        .get_mut(&key_of(t))
        .ok_or((None, NftError::TableMissing(t.to_string())))?;
    match op {
        NftOp::EnsureTable => Ok(()),
        NftOp::CreateSet { name, spec } => {
            if table.others.contains(*name) {
                return Err((None, NftError::SetExists(name.to_string())));
            }
            match table.sets.get_mut(*name) {
                Some(s) if s.spec.key == spec.key && s.spec.interval == spec.interval => {
                    s.size_at_commit = Some(spec.size);
                    Ok(())
                }
                Some(_) => Err((None, NftError::SetExists(name.to_string()))),
                None => {
                    *next_handle += 1;
                    table.sets.insert(
                        name.to_string(),
                        ModelSet {
                            spec: **spec,
                            elements: BTreeMap::new(),
                            handle: *next_handle,
                            references: 0,
                            size_at_commit: None,
                        },
                    );
                    Ok(())
                }
            }
        }
        NftOp::AddElements { set, elements } | NftOp::DelElements { set, elements } => {
            let s = table
                .sets
                .get_mut(*set)
                .ok_or((None, NftError::SetMissing(set.to_string())))?;
            if elements.key_type() != s.spec.key || elements.has_ranges() != s.spec.interval {
                let first = elements.get(0).map(|e| e.to_string()).unwrap_or_default();
                return Err((
                    Some(0),
                    NftError::InvalidElement {
                        set: set.to_string(),
                        element: first,
                        reason: "Invalid argument".into(),
                    },
                ));
            }
            let add = matches!(op, NftOp::AddElements { .. });
            for (i, e) in elements.iter().enumerate() {
                if add {
                    s.add(set, &e).map_err(|err| (Some(i), err))?;
                } else if s.elements.remove(&stored(&e)).is_none() {
                    return Err((
                        Some(i),
                        NftError::ElementMissing {
                            set: set.to_string(),
                            element: e.to_string(),
                        },
                    ));
                }
            }
            Ok(())
        }
        NftOp::FlushSet { set } => {
            let s = table
                .sets
                .get_mut(*set)
                .ok_or((None, NftError::SetMissing(set.to_string())))?;
            s.elements.clear();
            Ok(())
        }
        NftOp::DeleteSet { set } => match table.sets.get(*set) {
            None => Err((None, NftError::SetMissing(set.to_string()))),
            Some(s) if s.references > 0 => Err((None, NftError::InUse(set.to_string()))),
            Some(_) => {
                table.sets.remove(*set);
                Ok(())
            }
        },
    }
}

impl NftDataplane for ModelNft {
    fn name(&self) -> &'static str {
        "model"
    }

    fn apply(
        &mut self,
        t: &Table,
        ops: &[NftOp<'_>],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<(), NftBatchError> {
        precheck(t, ops, owned)?;
        if let Some(Fault::FailNextApply(e)) = self.fault(|f| matches!(f, Fault::FailNextApply(_)))
        {
            return Err(e);
        }
        let mut s = self.lock();
        let changes = ops.iter().any(|op| match op {
            NftOp::AddElements { elements, .. } | NftOp::DelElements { elements, .. } => {
                !elements.is_empty()
            }
            _ => true,
        });
        if !changes {
            return Ok(());
        }
        s.stats.transactions += 1;
        // All or nothing: the ops run on a copy that replaces the state
        // only when every one of them succeeded.
        let mut work = s.tables.clone();
        let mut handle = s.next_handle;
        for (i, op) in ops.iter().enumerate() {
            apply_op(&mut work, &mut handle, t, op).map_err(|(element_index, error)| {
                NftBatchError {
                    op_index: Some(i),
                    element_index,
                    error,
                }
            })?;
        }
        for set in work.values_mut().flat_map(|t| t.sets.values_mut()) {
            if let Some(size) = set.size_at_commit.take() {
                set.spec.size = size;
            }
        }
        s.tables = work;
        s.next_handle = handle;
        Ok(())
    }

    fn list_sets(
        &mut self,
        t: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, NftError> {
        if let Some(Fault::FailNextList(e)) = self.fault(|f| matches!(f, Fault::FailNextList(_))) {
            return Err(e);
        }
        let mut s = self.lock();
        s.stats.lists += 1;
        Ok(s.tables
            .get(&key_of(t))
            .map(|table| table.sets.keys().filter(|n| owned(n)).cloned().collect()))
    }

    fn read_set(&mut self, t: &Table, name: &str) -> Result<Option<NftKernelSet>, NftError> {
        if let Some(Fault::FailNextRead(e)) = self.fault(|f| matches!(f, Fault::FailNextRead(_))) {
            return Err(e);
        }
        let mut s = self.lock();
        s.stats.reads += 1;
        let Some(set) = s
            .tables
            .get(&key_of(t))
            .and_then(|table| table.sets.get(name))
        else {
            return Ok(None);
        };
        Ok(Some(NftKernelSet {
            name: name.to_string(),
            handle: set.handle,
            spec: Some(set.spec),
            unmanaged: Vec::new(),
            elements: Some(set.elements()),
            unreadable_elements: 0,
            references: set.references,
        }))
    }

    fn table_has_foreign_objects(
        &mut self,
        t: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<bool, NftError> {
        let s = self.lock();
        Ok(s.tables.get(&key_of(t)).is_some_and(|table| {
            !table.chains.is_empty()
                || !table.others.is_empty()
                || table.sets.keys().any(|n| !owned(n))
        }))
    }
}
