//! Whether each watch of the API server works, for readiness.
//!
//! A watch is failing from its error until an event of its kind arrives,
//! or until `window` passes without another error. The second rule is
//! needed because a watch that resumes after a transient error delivers
//! nothing until something changes; a watch that keeps failing reports an
//! error at least every 30 s (kube's backoff caps there), well inside the
//! default window of 90 s.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The default window after an error during which a quiet watch counts as
/// failing.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(90);

/// A watch failing, as readiness reports it (both roles).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("watch of {resource} failing: {error}")]
pub struct WatchFailing {
    pub resource: String,
    /// The last error's text, bounded (kept from the watch's own error).
    pub error: String,
}

#[derive(Debug)]
pub struct WatchHealth {
    window: Duration,
    failures: Mutex<BTreeMap<String, (Instant, String)>>,
}

impl Default for WatchHealth {
    fn default() -> Self {
        WatchHealth::new(DEFAULT_WINDOW)
    }
}

impl WatchHealth {
    pub fn new(window: Duration) -> WatchHealth {
        WatchHealth {
            window,
            failures: Mutex::default(),
        }
    }

    /// The watch of `resource` failed with `error`.
    pub fn failed(&self, resource: &str, error: &str) {
        let error = ipsetmgr_policy::text::bounded(error, 300).into_owned();
        self.lock()
            .insert(resource.to_string(), (Instant::now(), error));
    }

    /// An event of `resource` arrived: its watch works.
    pub fn delivered(&self, resource: &str) {
        self.lock().remove(resource);
    }

    /// The failing watches and their last errors.
    pub fn failing(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(_, (at, _))| now.duration_since(*at) <= self.window)
            .map(|(r, (_, e))| (r.clone(), e.clone()))
            .collect()
    }

    /// The failing watches, as reasons not to be ready.
    pub fn problems(&self) -> Vec<WatchFailing> {
        self.failing()
            .into_iter()
            .map(|(resource, error)| WatchFailing { resource, error })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Instant, String)>> {
        // A panic while holding it leaves plain data: keep using it.
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failing_until_an_event_or_the_window_passes() {
        let h = WatchHealth::new(Duration::from_secs(90));
        assert!(h.failing().is_empty());
        h.failed("nodes", "connection refused");
        assert_eq!(h.failing(), [("nodes".into(), "connection refused".into())]);
        h.delivered("nodes");
        assert!(h.failing().is_empty());
        h.failed("ipsetpolicies", "500");
        tokio::time::advance(Duration::from_secs(89)).await;
        assert_eq!(h.failing().len(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(h.failing().is_empty(), "quiet and no new error: it works");
    }
}
