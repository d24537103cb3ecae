//! Logging what a full resync found and repaired.

use crate::SetReport;

/// One drift event: the set's names and the three counts under the names
/// the level's message gives them (a level must be a constant in tracing's
/// macros, so the two lines share this one body).
macro_rules! drift_event {
    ($level:expr, $s:expr, $message:literal, $missing:ident, $extra:ident, $rewritten:ident) => {
        tracing::event!(
            target: "ipsetmgr::drift",
            $level,
            backend = $s.set.backend.name,
            set = %$s.set.name,
            policy = %$s.policy,
            $missing = $s.drift.missing,
            $extra = $s.drift.extra,
            $rewritten = $s.drift.rewritten,
            $message
        )
    };
}

/// One line per set with problems: INFO when the set is in sync again
/// (drift is what a security team wants to see), WARN when the repair did
/// not complete.
pub fn log_drift(sets: &[SetReport]) {
    for s in sets.iter().filter(|s| s.problems > 0) {
        if s.synced {
            drift_event!(
                tracing::Level::INFO,
                s,
                "repaired drift",
                added,
                removed,
                rewritten
            );
        } else {
            drift_event!(
                tracing::Level::WARN,
                s,
                "found drift; the repair did not complete",
                missing,
                extra,
                rewrite
            );
        }
    }
}
