//! The controller's metrics and health.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub struct Metrics {
    registry: Registry,
    pub policies: Gauge,
    pub invalid_policies: Gauge,
    pub leader: Gauge,
    pub status_writes_ok: Counter,
    pub status_writes_failed: Counter,
    pub events: Counter,
    pub node_states_deleted: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            policies: Gauge::default(),
            invalid_policies: Gauge::default(),
            leader: Gauge::default(),
            status_writes_ok: Counter::default(),
            status_writes_failed: Counter::default(),
            events: Counter::default(),
            node_states_deleted: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "ipsetmgr_controller_policies",
            "IPSetPolicies known",
            m.policies.clone(),
        );
        registry.register(
            "ipsetmgr_controller_invalid_policies",
            "IPSetPolicies whose Valid condition is False",
            m.invalid_policies.clone(),
        );
        registry.register(
            "ipsetmgr_controller_leader",
            "1 while this replica holds the Lease",
            m.leader.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "ipsetmgr_controller_status_writes",
            "Policy status writes accepted by the API server",
            m.status_writes_ok.clone(),
        );
        registry.register(
            "ipsetmgr_controller_status_write_failures",
            "Policy status writes that failed",
            m.status_writes_failed.clone(),
        );
        registry.register(
            "ipsetmgr_controller_events",
            "Warning events published",
            m.events.clone(),
        );
        registry.register(
            "ipsetmgr_controller_node_states_deleted",
            "Node states deleted because their Node is gone",
            m.node_states_deleted.clone(),
        );
        Metrics { registry, ..m }
    }
}

/// State shared between the loop, the writer and the health server.
pub struct ControllerShared {
    pub metrics: Metrics,
    /// Unix milliseconds of the event loop's last turn.
    loop_ms: AtomicU64,
    listed: AtomicBool,
    /// The loop turns at least this often (its re-evaluation tick).
    tick: Duration,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ControllerShared {
    pub fn new(tick: Duration) -> Arc<ControllerShared> {
        Arc::new(ControllerShared {
            metrics: Metrics::default(),
            loop_ms: AtomicU64::new(now_ms()),
            listed: AtomicBool::new(false),
            tick,
        })
    }

    pub fn heartbeat(&self) {
        self.loop_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn set_listed(&self, listed: bool) {
        self.listed.store(listed, Ordering::Relaxed);
    }
}

impl crate::server::Health for ControllerShared {
    fn live(&self) -> Result<(), String> {
        let age = now_ms().saturating_sub(self.loop_ms.load(Ordering::Relaxed));
        if age <= 5 * self.tick.as_millis() as u64 {
            Ok(())
        } else {
            Err(format!(
                "the event loop has not turned for {} s",
                age / 1000
            ))
        }
    }

    fn ready(&self) -> Result<(), String> {
        if self.listed.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("waiting for the initial lists of policies, slices, node states and Nodes".into())
        }
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.metrics.registry);
        out
    }
}
