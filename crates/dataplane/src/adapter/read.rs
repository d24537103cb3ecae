//! Taking the kernel's word for one ipset: what closes the gap to the
//! desired state is queued, and every discrepancy is counted.

use ipsetmgr_sets::Drift;

use super::state::{Belief, SetState};
use crate::KernelSet;

/// Compare one set with what the kernel holds and queue the repair.
/// Returns the discrepancies against what we believed.
pub(crate) fn absorb(name: &str, s: &mut SetState, kernel: Option<KernelSet>) -> Drift {
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
            rewritten: believed_present && s.held_once,
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
    s.held_once |= !s.dirty;
    drift
}
