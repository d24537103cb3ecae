//! An in-memory kernel with the kernel's ipset semantics and injectable
//! faults, for manager tests. It is shared (`Clone` shares state) so a test
//! can keep a handle to inspect and tamper with "the kernel" while the
//! manager owns another.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{BatchError, Dataplane, DataplaneError, KernelSet, Op};
use ipsetmgr_ipset::{MAX_BITMAP_ELEMENTS, Member, MemberSet, SetHeader, SetType};

/// A set as the model kernel holds it.
#[derive(Clone, Debug)]
pub struct ModelSet {
    pub header: SetHeader,
    pub members: MemberSet,
    /// References from outside the project (an iptables rule).
    pub external_refs: u32,
    /// Header options set out of band (`netmask 24`), reported as unmanaged.
    pub options: Vec<String>,
}

/// A fault to inject.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The next batch fails at its first operation with this error.
    FailNextBatch(DataplaneError),
    /// Every operation on this set fails with this error until cleared.
    FailSet(String, DataplaneError),
    /// The next `read_set` returns a protocol error (truncated listing).
    CorruptNextRead,
    /// The next `list_owned` fails.
    FailNextList(DataplaneError),
}

#[derive(Debug, Default)]
struct State {
    sets: BTreeMap<String, ModelSet>,
    unsupported: BTreeSet<SetType>,
    faults: VecDeque<Fault>,
    sticky: Vec<(String, DataplaneError)>,
    stats: Stats,
}

/// Counters tests use to check how much work reached "the kernel".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub batches: usize,
    pub member_ops: usize,
    pub reads: usize,
    pub lists: usize,
}

#[derive(Clone, Debug, Default)]
pub struct ModelDataplane {
    state: Arc<Mutex<State>>,
}

impl ModelDataplane {
    /// A model kernel that, like this project's CI kernel, lacks hash:mac
    /// and hash:ip,mark.
    pub fn new() -> ModelDataplane {
        let m = ModelDataplane::default();
        m.lock().unsupported.insert(SetType::HashMac);
        m.lock().unsupported.insert(SetType::HashIpMark);
        m
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another test thread must not poison every later call.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_supported(&self, t: SetType, supported: bool) {
        let mut s = self.lock();
        if supported {
            s.unsupported.remove(&t);
        } else {
            s.unsupported.insert(t);
        }
    }

    pub fn inject(&self, fault: Fault) {
        let mut s = self.lock();
        match fault {
            Fault::FailSet(name, e) => s.sticky.push((name, e)),
            f => s.faults.push_back(f),
        }
    }

    pub fn clear_faults(&self) {
        let mut s = self.lock();
        s.faults.clear();
        s.sticky.clear();
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    pub fn set_names(&self) -> Vec<String> {
        self.lock().sets.keys().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Option<ModelSet> {
        self.lock().sets.get(name).cloned()
    }

    /// Sorted canonical members of a set, as `ipset list` would show them.
    pub fn members(&self, name: &str) -> Option<Vec<String>> {
        self.get(name).map(|s| s.members.sorted_strings())
    }

    /// Out-of-band changes ("someone ran ipset by hand").
    pub fn tamper(&self, f: impl FnOnce(&mut BTreeMap<String, ModelSet>)) {
        f(&mut self.lock().sets)
    }

    /// Create a set directly, bypassing faults (a foreign or leftover set).
    pub fn create_raw(&self, name: &str, header: SetHeader) {
        let members = MemberSet::new(header.kind);
        self.lock().sets.insert(
            name.to_string(),
            ModelSet {
                header,
                members,
                external_refs: 0,
                options: Vec::new(),
            },
        );
    }

    /// Mark a set as referenced by an iptables rule (or release it).
    pub fn set_external_refs(&self, name: &str, refs: u32) {
        if let Some(s) = self.lock().sets.get_mut(name) {
            s.external_refs = refs;
        }
    }
}

/// The entry the kernel stores for `m`: a hash:ip address with the bits
/// outside the set's netmask or bitmask cleared.
fn stored(header: &SetHeader, m: Member) -> Member {
    let Some(mask) = header.options.mask else {
        return m;
    };
    match m {
        Member::Ip(a) => Member::Ip(mask.apply(a)),
        Member::Commented(c) => match &c.member {
            Member::Ip(a) => Member::Ip(mask.apply(*a)).with_comment(c.comment.clone()),
            _ => Member::Commented(c),
        },
        m => m,
    }
}

/// The member held for `m`'s kernel key, if any: the key itself, its
/// nomatch twin, or (in a set with comments) any of those with a comment.
fn same_entry(members: &MemberSet, m: &Member, comments: bool) -> Option<Member> {
    let key = m.key();
    let twin = key.nomatch_twin();
    if members.contains(&key) {
        return Some(key);
    }
    if let Some(t) = twin.filter(|t| members.contains(t)) {
        return Some(t);
    }
    // Only sets with the comment extension hold commented members; their
    // entries are looked through (the model's sets with comments are small).
    if !comments {
        return None;
    }
    members.iter().find(|held| held.key() == key)
}

impl State {
    fn references(&self, name: &str) -> u32 {
        let from_lists = self
            .sets
            .values()
            .filter(|s| s.header.kind.set_type == SetType::ListSet)
            .filter(|s| s.members.contains(&Member::Set(name.into())))
            .count() as u32;
        from_lists + self.sets.get(name).map_or(0, |s| s.external_refs)
    }

    fn exists(&self, name: &str) -> Result<(), DataplaneError> {
        if self.sets.contains_key(name) {
            Ok(())
        } else {
            Err(DataplaneError::SetMissing(name.to_string()))
        }
    }

    /// Apply one op; on failure, return the failing member if any.
    fn apply_op(&mut self, op: &Op<'_>) -> Result<(), (Option<Member>, DataplaneError)> {
        if let Some((_, e)) = self.sticky.iter().find(|(n, _)| op.sets().any(|s| s == n)) {
            return Err((None, e.clone()));
        }
        match *op {
            Op::Create { set, header } => {
                if self.unsupported.contains(&header.kind.set_type) {
                    return Err((
                        None,
                        DataplaneError::TypeNotSupported(header.kind.set_type.to_string()),
                    ));
                }
                if self.sets.contains_key(set) {
                    return Err((None, DataplaneError::SetExists(set.to_string())));
                }
                if header
                    .options
                    .range
                    .is_some_and(|r| r.len() > MAX_BITMAP_ELEMENTS)
                {
                    return Err((
                        None,
                        DataplaneError::Other(format!(
                            "cannot create set {set}: the range exceeds the size limit of the set type"
                        )),
                    ));
                }
                self.sets.insert(
                    set.to_string(),
                    ModelSet {
                        header: header.clone(),
                        members: MemberSet::new(header.kind),
                        external_refs: 0,
                        options: Vec::new(),
                    },
                );
            }
            Op::Add { set, members } => {
                self.exists(set).map_err(|e| (None, e))?;
                for m in members.iter() {
                    self.stats.member_ops += 1;
                    if let Member::Set(listed) = &m {
                        match self.sets.get(&**listed) {
                            None => {
                                return Err((
                                    Some(m.clone()),
                                    DataplaneError::SetMissing(listed.to_string()),
                                ));
                            }
                            Some(s) if s.header.kind.set_type == SetType::ListSet => {
                                return Err((
                                    Some(m.clone()),
                                    DataplaneError::NestedListSet(set.to_string()),
                                ));
                            }
                            Some(_) => {}
                        }
                    }
                    let target = self.sets.get_mut(set).expect("checked above");
                    let m = stored(&target.header, m);
                    if matches!(m.without_comment(), Member::Ip(a) if a.is_unspecified())
                        && target.header.kind.set_type == SetType::HashIp
                    {
                        return Err((
                            Some(m.clone()),
                            DataplaneError::InvalidElement {
                                set: set.to_string(),
                                element: m.to_string(),
                                reason: "null-valued element, cannot be stored".into(),
                            },
                        ));
                    }
                    if target.members.contains(&m) {
                        continue;
                    }
                    if m.comment().is_some() && !target.header.options.comment {
                        return Err((
                            Some(m.clone()),
                            DataplaneError::InvalidElement {
                                set: set.to_string(),
                                element: m.to_string(),
                                reason: "comment cannot be used: the set has no comment extension"
                                    .into(),
                            },
                        ));
                    }
                    // Like the kernel: neither the nomatch flag nor the
                    // comment is part of the key, and `add -exist`
                    // overwrites both.
                    let comments = target.header.options.comment;
                    let held = same_entry(&target.members, &m, comments);
                    if let Some(held) = held {
                        target.members.remove(&held);
                        target.members.insert(m.clone());
                        continue;
                    }
                    if let Some(range) = target.header.options.range
                        && !range.contains(&m)
                    {
                        return Err((
                            Some(m.clone()),
                            DataplaneError::InvalidElement {
                                set: set.to_string(),
                                element: m.to_string(),
                                reason: "element is out of the range of the set".into(),
                            },
                        ));
                    }
                    if target.members.len() >= target.header.max_elem as usize {
                        return Err((Some(m), DataplaneError::SetFull(set.to_string())));
                    }
                    if !target.members.insert(m.clone()) {
                        return Err((
                            Some(m.clone()),
                            DataplaneError::InvalidElement {
                                set: set.to_string(),
                                element: m.to_string(),
                                reason: "element does not match the set type".into(),
                            },
                        ));
                    }
                }
            }
            Op::Del { set, members } => {
                self.exists(set).map_err(|e| (None, e))?;
                let target = self.sets.get_mut(set).expect("checked above");
                let comments = target.header.options.comment;
                for m in members.iter() {
                    self.stats.member_ops += 1;
                    let m = stored(&target.header, m);
                    // The kernel deletes by key, whatever the entry's flag
                    // and comment.
                    if !target.members.remove(&m)
                        && let Some(held) = same_entry(&target.members, &m, comments)
                    {
                        target.members.remove(&held);
                    }
                }
            }
            Op::Flush { set } => {
                self.exists(set).map_err(|e| (None, e))?;
                self.sets.get_mut(set).expect("checked").members.clear();
            }
            Op::Swap { a, b } => {
                self.exists(a).map_err(|e| (None, e))?;
                self.exists(b).map_err(|e| (None, e))?;
                let (ka, kb) = (self.sets[a].header.kind, self.sets[b].header.kind);
                if ka != kb {
                    return Err((
                        None,
                        DataplaneError::TypeMismatch(a.to_string(), b.to_string()),
                    ));
                }
                let sa = self.sets.remove(a).expect("checked");
                let sb = self.sets.remove(b).expect("checked");
                // Contents and headers move; references stay with the name.
                self.sets.insert(
                    a.to_string(),
                    ModelSet {
                        external_refs: sa.external_refs,
                        ..sb
                    },
                );
                self.sets.insert(
                    b.to_string(),
                    ModelSet {
                        external_refs: sb.external_refs,
                        ..sa
                    },
                );
            }
            Op::Rename { from, to } => {
                self.exists(from).map_err(|e| (None, e))?;
                if self.sets.contains_key(to) {
                    return Err((None, DataplaneError::SetExists(to.to_string())));
                }
                if self.references(from) > 0 {
                    return Err((None, DataplaneError::InUse(from.to_string())));
                }
                let s = self.sets.remove(from).expect("checked");
                self.sets.insert(to.to_string(), s);
            }
            Op::Destroy { set } => {
                self.exists(set).map_err(|e| (None, e))?;
                if self.references(set) > 0 {
                    return Err((None, DataplaneError::InUse(set.to_string())));
                }
                self.sets.remove(set);
            }
        }
        Ok(())
    }
}

impl Dataplane for ModelDataplane {
    fn name(&self) -> &'static str {
        "model"
    }

    fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError> {
        let mut s = self.lock();
        s.stats.batches += 1;
        if matches!(s.faults.front(), Some(Fault::FailNextBatch(_)))
            && let Some(Fault::FailNextBatch(error)) = s.faults.pop_front()
        {
            return Err(BatchError {
                op_index: 0,
                member: None,
                error,
            });
        }
        for (i, op) in ops.iter().enumerate() {
            s.apply_op(op).map_err(|(member, error)| BatchError {
                op_index: i,
                member,
                error,
            })?;
        }
        Ok(())
    }

    fn list_owned(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<Vec<String>, DataplaneError> {
        let mut s = self.lock();
        s.stats.lists += 1;
        if matches!(s.faults.front(), Some(Fault::FailNextList(_)))
            && let Some(Fault::FailNextList(e)) = s.faults.pop_front()
        {
            return Err(e);
        }
        Ok(s.sets.keys().filter(|n| owned(n)).cloned().collect())
    }

    fn read_set(&mut self, name: &str) -> Result<Option<KernelSet>, DataplaneError> {
        let mut s = self.lock();
        s.stats.reads += 1;
        if matches!(s.faults.front(), Some(Fault::CorruptNextRead)) {
            s.faults.pop_front();
            return Err(DataplaneError::Protocol(format!(
                "listing of {name} ended before its Members: line"
            )));
        }
        let refs = s.references(name);
        Ok(s.sets.get(name).map(|set| KernelSet {
            header: Some(set.header.clone()),
            members: Some(set.members.clone()),
            unparsable_members: 0,
            unmanaged_options: set.options.clone(),
            references: refs,
        }))
    }

    fn supports(&mut self, set_type: SetType) -> Option<bool> {
        Some(!self.lock().unsupported.contains(&set_type))
    }
}
