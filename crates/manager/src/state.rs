//! What the manager knows and wants for one kernel set.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use ipsetmgr_ipset::{MemberSet, SetHeader, SetKind};

use crate::report::SetError;

/// What the manager believes about a set in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Belief {
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

/// A set isolated after a set-specific failure; retried on its own backoff.
/// Every sets backend isolates this way (the nft one too).
#[derive(Clone, Debug)]
pub struct Failure {
    pub error: SetError,
    pub attempts: u32,
    pub retry_at: Instant,
}

impl Failure {
    /// The failure that follows `previous` (`None`: the first): one attempt
    /// more, retried after `set_retry_base` doubled per attempt, at most
    /// `set_retry_max`. Returns the wait too, for the log line.
    pub fn after(
        previous: Option<&Failure>,
        error: SetError,
        config: &crate::ManagerConfig,
    ) -> (Failure, std::time::Duration) {
        let attempts = previous.map_or(0, |f| f.attempts) + 1;
        let backoff = config
            .set_retry_base
            .saturating_mul(1u32 << (attempts - 1).min(16))
            .min(config.set_retry_max);
        let failure = Failure {
            error,
            attempts,
            retry_at: Instant::now() + backoff,
        };
        (failure, backoff)
    }
}

/// One desired set: desired header and members, what the kernel is believed
/// to hold, and the pending work that closes the gap. The believed kernel
/// content is `members - pending_adds + pending_dels` (only one full copy of
/// the members is kept).
#[derive(Clone, Debug)]
pub struct SetState {
    pub policy: String,
    pub header: SetHeader,
    pub members: Arc<MemberSet>,
    pub kernel: Belief,
    pub pending_adds: MemberSet,
    pub pending_dels: MemberSet,
    /// The whole set must be (re)written: created, or filled into a temp set
    /// and swapped in.
    pub replace: bool,
    pub dirty: bool,
    /// Discrepancies found by the last resync.
    pub drift: crate::report::Drift,
    pub failure: Option<Failure>,
    pub last_sync: Option<SystemTime>,
}

impl SetState {
    pub fn new(policy: String, header: SetHeader, members: Arc<MemberSet>) -> SetState {
        let kind = header.kind;
        let header = header.sized_for(members.len());
        SetState {
            policy,
            header,
            members,
            kernel: Belief::Unknown,
            pending_adds: MemberSet::new(kind),
            pending_dels: MemberSet::new(kind),
            replace: true,
            dirty: true,
            drift: Default::default(),
            failure: None,
            last_sync: None,
        }
    }

    /// Take a new desired state: a delta when only members changed, a full
    /// rewrite when the header changed. Returns whether anything changed.
    pub fn update(&mut self, policy: String, header: SetHeader, members: Arc<MemberSet>) -> bool {
        self.policy = policy;
        // Only a creation hint, so never a reason to rewrite a set.
        let header = header.sized_for(members.len());
        // Any difference that matters on resync (type, family, size, the
        // options: a bitmap's range, the comment extension) is a rewrite.
        if !header.compatible_with(&self.header) {
            self.header = header;
            self.pending_adds = MemberSet::new(self.header.kind);
            self.pending_dels = MemberSet::new(self.header.kind);
            self.members = members;
            self.mark_changed();
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
        self.mark_changed();
        true
    }

    fn mark_changed(&mut self) {
        self.dirty = true;
        // New content deserves a new try now, whatever failed before.
        if let Some(f) = &mut self.failure {
            f.retry_at = Instant::now();
        }
    }

    /// Whether the set is skipped by batches because it is isolated and its
    /// retry time has not come.
    pub fn waiting(&self, now: Instant) -> bool {
        self.failure.as_ref().is_some_and(|f| f.retry_at > now)
    }

    /// The batch carrying this set succeeded: the kernel now holds it.
    pub fn committed(&mut self) {
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
        self.failure = None;
        self.last_sync = Some(SystemTime::now());
    }

    pub fn synced(&self) -> bool {
        !self.dirty && self.failure.is_none() && matches!(self.kernel, Belief::Present { .. })
    }
}
