//! The reconciler's tunables.

use std::time::Duration;

use ipsetmgr_ipset::Naming;

/// Tunables; the defaults are the design's.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    pub naming: Naming,
    /// Attempts per `apply_updates` (the seed's 10).
    pub max_attempts: u32,
    /// First retry delay, doubled after each failed attempt.
    pub initial_backoff: Duration,
    /// First retry delay of an isolated set, doubled per failure.
    pub set_retry_base: Duration,
    pub set_retry_max: Duration,
    /// Delete owned sets that no policy wants. Off for a one-shot apply of
    /// some policy files without `--prune`; leftovers are always removed.
    pub prune: bool,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            naming: Naming::default(),
            max_attempts: 10,
            initial_backoff: Duration::from_millis(1),
            set_retry_base: Duration::from_secs(1),
            set_retry_max: Duration::from_secs(300),
            prune: true,
        }
    }
}
