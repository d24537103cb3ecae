//! Logging what a full resync found and repaired.

use crate::SetReport;

/// One line per set with problems: INFO when the set is in sync again
/// (drift is what a security team wants to see), WARN when the repair did
/// not complete.
pub fn log_drift(sets: &[SetReport]) {
    for s in sets.iter().filter(|s| s.problems > 0) {
        let d = s.drift;
        if s.synced {
            tracing::info!(
                target: "ipsetmgr::drift",
                backend = s.set.backend.name,
                set = %s.set.name,
                policy = %s.policy,
                added = d.missing,
                removed = d.extra,
                rewritten = d.rewritten,
                "repaired drift"
            );
        } else {
            tracing::warn!(
                target: "ipsetmgr::drift",
                backend = s.set.backend.name,
                set = %s.set.name,
                policy = %s.policy,
                missing = d.missing,
                extra = d.extra,
                rewrite = d.rewritten,
                "found drift; the repair did not complete"
            );
        }
    }
}
