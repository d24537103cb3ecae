//! What the ipset adapter knows and wants for one kernel set.

use std::sync::Arc;

use ipsetmgr_ipset::{MemberSet, SetHeader, SetKind};

/// What the adapter believes about a set in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Belief {
    /// Never read: the first resync decides.
    Unknown,
    Absent,
    /// Present with this kind (`None`: a type we do not manage) and this many
    /// references (iptables rules, list:sets) at the last read.
    Present {
        kind: Option<SetKind>,
        references: u32,
    },
}

/// One desired ipset (opaque outside this crate): desired header and members, what the kernel is believed
/// to hold, and the pending work that closes the gap. The believed kernel
/// content is `members - pending_adds + pending_dels` (only one full copy of
/// the members is kept).
#[derive(Clone, Debug)]
pub struct SetState {
    pub(crate) header: SetHeader,
    pub(crate) members: Arc<MemberSet>,
    pub(crate) kernel: Belief,
    pub(crate) pending_adds: MemberSet,
    pub(crate) pending_dels: MemberSet,
    /// The whole set must be (re)written: created, or filled into a temp set
    /// and swapped in.
    pub(crate) replace: bool,
    pub(crate) dirty: bool,
    /// The kernel has held the set as desired (a write or a read said so):
    /// its disappearance is drift.
    pub(crate) held_once: bool,
}

impl SetState {
    pub(crate) fn new(header: SetHeader, members: Arc<MemberSet>) -> SetState {
        let kind = header.kind;
        let header = header.sized_for(members.len());
        SetState {
            header,
            members,
            kernel: Belief::Unknown,
            pending_adds: MemberSet::new(kind),
            pending_dels: MemberSet::new(kind),
            replace: true,
            dirty: true,
            held_once: false,
        }
    }

    /// Take a new desired state: a delta when only members changed, a full
    /// rewrite when the header changed. Returns whether anything changed.
    pub(crate) fn update(&mut self, header: SetHeader, members: Arc<MemberSet>) -> bool {
        // Only a creation hint, so never a reason to rewrite a set.
        let header = header.sized_for(members.len());
        // Any difference that matters on resync (type, family, size, the
        // options: a bitmap's range, the comment extension) is a rewrite.
        if !header.compatible_with(&self.header) {
            self.header = header;
            self.pending_adds = MemberSet::new(self.header.kind);
            self.pending_dels = MemberSet::new(self.header.kind);
            self.members = members;
            self.dirty = true;
            self.replace = true;
            return true;
        }
        self.header.hash_size = header.hash_size;
        if Arc::ptr_eq(&members, &self.members) {
            // The same compiled set (a cached policy): nothing to diff.
            return false;
        }
        let (adds, dels) = members.diff_both(&self.members);
        if adds.is_empty() && dels.is_empty() {
            return false;
        }
        if !self.replace {
            for m in adds {
                if !self.pending_dels.remove(&m) {
                    self.pending_adds.insert(m);
                }
            }
            for m in dels {
                if !self.pending_adds.remove(&m) {
                    self.pending_dels.insert(m);
                }
            }
        }
        self.members = members;
        self.dirty = true;
        true
    }

    /// The batch carrying this set succeeded: the kernel now holds it.
    pub(crate) fn committed(&mut self) {
        let references = match self.kernel {
            Belief::Present { references, .. } => references,
            _ => 0,
        };
        self.kernel = Belief::Present {
            kind: Some(self.header.kind),
            references,
        };
        self.pending_adds.clear();
        self.pending_dels.clear();
        self.replace = false;
        self.dirty = false;
        self.held_once = true;
    }

    /// The kernel is believed to hold the set as desired.
    pub(crate) fn in_sync(&self) -> bool {
        !self.dirty && matches!(self.kernel, Belief::Present { .. })
    }
}
