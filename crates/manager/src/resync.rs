//! Resync: read the owned kernel sets and queue whatever closes the gap to
//! the desired state, counting every discrepancy as a problem.

use std::collections::BTreeSet;

use ipsetmgr_dataplane::{Dataplane, DataplaneError, KernelSet};

use super::Manager;
use super::report::Drift;
use super::state::{Belief, SetState};

impl<D: Dataplane> Manager<D> {
    /// List every owned set, compare each desired one, queue deletions of the
    /// rest (temp sets separately). Foreign sets are never read.
    pub(super) fn full_resync(&mut self) -> Result<(), DataplaneError> {
        let naming = self.config.naming.clone();
        let names = self.dp.list_owned(&|n| naming.owns(n))?;
        // A set type learned unsupported from a failed batch is tried again
        // after each full resync (a kernel module may have been loaded).
        self.unsupported.clear();
        self.existing = names.into_iter().filter(|n| naming.owns(n)).collect();
        let desired: BTreeSet<String> = self.sets.keys().cloned().collect();
        self.read_sets(&desired, true)?;
        self.pending_deletions.clear();
        self.pending_temp_deletions.clear();
        for name in &self.existing {
            if self.sets.contains_key(name) || self.held.contains(name) {
                continue;
            }
            if naming.is_temp(name) {
                self.pending_temp_deletions.insert(name.clone());
            } else {
                self.pending_deletions.insert(name.clone());
            }
        }
        // Sets that vanished need no deletion any more.
        self.deletion_errors
            .retain(|n, _| self.existing.contains(n));
        Ok(())
    }

    /// Read `names` (desired sets) and reconcile each. `count_problems` is
    /// false when re-reading after our own failed batch: those differences
    /// are not drift.
    pub(super) fn read_sets(
        &mut self,
        names: &BTreeSet<String>,
        count_problems: bool,
    ) -> Result<(), DataplaneError> {
        for name in names {
            if !self.sets.contains_key(name) {
                continue;
            }
            let kernel = self.dp.read_set(name)?;
            match &kernel {
                Some(_) => self.existing.insert(name.clone()),
                None => self.existing.remove(name),
            };
            let Some(s) = self.sets.get_mut(name) else {
                continue;
            };
            let drift = reconcile(name, s, kernel);
            if count_problems {
                s.drift = drift;
            }
        }
        Ok(())
    }
}

/// Compare one set with what the kernel holds and queue the repair.
/// Returns the discrepancies against what we believed.
fn reconcile(name: &str, s: &mut SetState, kernel: Option<KernelSet>) -> Drift {
    let believed_present = matches!(s.kernel, Belief::Present { .. });
    // A rewrite we queued ourselves (header change) is not drift.
    let rewrite_queued = s.replace && believed_present;
    let Some(k) = kernel else {
        s.kernel = Belief::Absent;
        s.replace = true;
        s.dirty = true;
        s.pending_adds.clear();
        s.pending_dels.clear();
        // A set we had written is gone (destroyed out of band).
        return Drift {
            rewritten: believed_present && s.last_sync.is_some(),
            ..Drift::default()
        };
    };
    let kind = k.header.as_ref().map(|h| h.kind);
    s.kernel = Belief::Present {
        kind,
        references: k.references,
    };
    let header_ok = k
        .header
        .as_ref()
        .is_some_and(|h| s.header.compatible_with(h))
        && k.unmanaged_options.is_empty()
        && k.unparsable_members == 0;
    if !k.unmanaged_options.is_empty() {
        tracing::info!(
            set = name,
            options = ?k.unmanaged_options,
            "kernel set has header options this tool never sets; replacing it"
        );
    }
    let members = match (header_ok, k.members) {
        (true, Some(m)) if m.kind() == s.header.kind => m,
        _ => {
            // Wrong type, family, maxelem or unreadable entries: rewrite whole.
            s.replace = true;
            s.dirty = true;
            s.pending_adds.clear();
            s.pending_dels.clear();
            return Drift {
                rewritten: !rewrite_queued,
                ..Drift::default()
            };
        }
    };
    let (missing, extra) = s.members.diff_both(&members);
    // Differences we had not already queued are drift.
    let drift = if rewrite_queued {
        Drift::default()
    } else {
        Drift {
            missing: missing
                .iter()
                .filter(|m| !s.pending_adds.contains(m))
                .count(),
            extra: extra.iter().filter(|m| !s.pending_dels.contains(m)).count(),
            rewritten: false,
        }
    };
    s.pending_adds.clear();
    s.pending_dels.clear();
    for m in missing {
        s.pending_adds.insert(m);
    }
    for m in extra {
        s.pending_dels.insert(m);
    }
    s.replace = false;
    s.dirty = !s.pending_adds.is_empty() || !s.pending_dels.is_empty();
    if !s.dirty && s.failure.is_none() {
        s.last_sync = Some(std::time::SystemTime::now());
    }
    drift
}
