//! Prometheus metrics and the liveness/readiness facts the HTTP server reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The agent's metrics. Handles are cheap clones sharing the same values.
pub struct Metrics {
    registry: Registry,
    pub sets: Gauge,
    pub members: Gauge,
    pub apply_duration: Histogram,
    pub problems: Counter,
    pub dataplane_errors: Counter,
    pub status_writes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let sets = Gauge::default();
        let members = Gauge::default();
        // 1 ms .. ~32 s
        let apply_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let problems = Counter::default();
        let dataplane_errors = Counter::default();
        let status_writes = Counter::default();
        registry.register(
            "ipsetmgr_sets",
            "Kernel sets this node should hold",
            sets.clone(),
        );
        registry.register(
            "ipsetmgr_members",
            "Members across this node's desired sets",
            members.clone(),
        );
        registry.register(
            "ipsetmgr_apply_duration_seconds",
            "Duration of one manager apply (resync, batch, deletions)",
            apply_duration.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "ipsetmgr_problems",
            "Discrepancies between kernel and desired state found by full resyncs",
            problems.clone(),
        );
        registry.register(
            "ipsetmgr_dataplane_errors",
            "Failed dataplane attempts and set-level errors",
            dataplane_errors.clone(),
        );
        registry.register(
            "ipsetmgr_status_writes",
            "Status patches accepted by the API server",
            status_writes.clone(),
        );
        Metrics {
            registry,
            sets,
            members,
            apply_duration,
            problems,
            dataplane_errors,
            status_writes,
        }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// State shared between the controller, the manager thread and the server.
pub struct Shared {
    pub metrics: Metrics,
    resync_interval: Duration,
    /// Unix milliseconds of the manager thread's last loop.
    heartbeat_ms: AtomicU64,
    policies_listed: AtomicBool,
    first_sync: AtomicBool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    pub fn new(resync_interval: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            metrics: Metrics::default(),
            resync_interval,
            heartbeat_ms: AtomicU64::new(0),
            policies_listed: AtomicBool::new(false),
            first_sync: AtomicBool::new(false),
        })
    }

    pub fn heartbeat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn set_policies_listed(&self) {
        self.policies_listed.store(true, Ordering::Relaxed);
    }

    pub fn set_first_sync(&self) {
        self.first_sync.store(true, Ordering::Relaxed);
    }

    /// Live: the manager thread looped within 3x the resync interval.
    pub fn healthy(&self) -> bool {
        let last = self.heartbeat_ms.load(Ordering::Relaxed);
        let limit = 3 * self.resync_interval.as_millis() as u64;
        last != 0 && now_ms().saturating_sub(last) <= limit
    }

    /// Ready: the initial list of policies completed and the kernel was synced once.
    pub fn ready(&self) -> bool {
        self.policies_listed.load(Ordering::Relaxed) && self.first_sync.load(Ordering::Relaxed)
    }
}

impl crate::server::Health for Shared {
    fn live(&self) -> Result<(), String> {
        if self.healthy() {
            Ok(())
        } else {
            Err("manager thread stalled".into())
        }
    }

    fn ready(&self) -> Result<(), String> {
        if Shared::ready(self) {
            Ok(())
        } else {
            Err("waiting for the initial policy list and first kernel sync".into())
        }
    }

    fn metrics(&self) -> String {
        self.metrics.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Health;

    #[test]
    fn health_and_exposition() {
        let shared = Shared::new(Duration::from_secs(60));
        assert!(shared.live().is_err(), "no heartbeat yet");
        assert!(Health::ready(&*shared).is_err());
        shared.heartbeat();
        shared.set_policies_listed();
        shared.set_first_sync();
        assert!(shared.live().is_ok());
        assert!(Health::ready(&*shared).is_ok());
        shared.metrics.status_writes.inc();
        shared.metrics.apply_duration.observe(0.01);
        let m = Health::metrics(&*shared);
        for name in [
            "ipsetmgr_sets ",
            "ipsetmgr_members ",
            "ipsetmgr_apply_duration_seconds_bucket",
            "ipsetmgr_problems_total ",
            "ipsetmgr_dataplane_errors_total ",
            "ipsetmgr_status_writes_total 1",
        ] {
            assert!(m.contains(name), "{name} missing in {m}");
        }
    }
}
