//! The controller's metrics and health.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use ipsetmgr_cluster::server::{LoopStalled, Unhealthy};
use ipsetmgr_cluster::telemetry::ApiMetrics;
use ipsetmgr_cluster::telemetry::labels::ResultLabel;
use ipsetmgr_cluster::telemetry::watch_health::WatchHealth;

pub struct Metrics {
    registry: Registry,
    pub policies: Gauge,
    pub invalid_policies: Gauge,
    pub leader: Gauge,
    pub status_writes: Family<ResultLabel, Counter>,
    pub event_writes: Family<ResultLabel, Counter>,
    /// Applies and deletions of the controller's member slices.
    pub slice_writes: Family<ResultLabel, Counter>,
    pub node_states_deleted: Counter,
    pub api: ApiMetrics,
}

impl Metrics {
    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        ipsetmgr_cluster::telemetry::encode(&self.registry)
    }
}

impl Metrics {
    /// Metrics with one series in every family (see the agent's).
    pub fn with_every_family() -> Metrics {
        let m = Metrics::default();
        let _ = m.status_writes.get_or_create(&ResultLabel::of(true));
        let _ = m.event_writes.get_or_create(&ResultLabel::of(true));
        let _ = m.slice_writes.get_or_create(&ResultLabel::of(true));
        m.api.touch_every_family();
        m
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            policies: Gauge::default(),
            invalid_policies: Gauge::default(),
            leader: Gauge::default(),
            status_writes: Family::default(),
            event_writes: Family::default(),
            slice_writes: Family::default(),
            node_states_deleted: Counter::default(),
            api: ApiMetrics::default(),
            registry: Registry::default(),
        };
        ipsetmgr_cluster::telemetry::register_common(&mut registry, &m.api);
        let r = &mut registry;
        r.register(
            "ipsetmgr_controller_policies",
            "IPSetPolicies known",
            m.policies.clone(),
        );
        r.register(
            "ipsetmgr_controller_invalid_policies",
            "IPSetPolicies whose Valid condition is False",
            m.invalid_policies.clone(),
        );
        r.register(
            "ipsetmgr_controller_leader",
            "1 while this replica holds the Lease",
            m.leader.clone(),
        );
        // prometheus-client appends `_total` to counters.
        r.register(
            "ipsetmgr_controller_status_writes",
            "Policy status writes, by result",
            m.status_writes.clone(),
        );
        r.register(
            "ipsetmgr_controller_slice_writes",
            "Applies and deletions of the member slices the controller materialises from membersFrom, by result",
            m.slice_writes.clone(),
        );
        r.register(
            "ipsetmgr_controller_event_writes",
            "Warning events published, by result",
            m.event_writes.clone(),
        );
        r.register(
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
    pub watches: WatchHealth,
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
            watches: WatchHealth::default(),
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

    fn readiness(&self) -> Result<(), Unhealthy> {
        let mut why = Unhealthy::default();
        if !self.listed.load(Ordering::Relaxed) {
            why.push(InitialLists);
        }
        for failing in self.watches.problems() {
            why.push(failing);
        }
        why.into_result()
    }
}

/// Not ready before every kind the controller compiles from was listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("waiting for the initial lists of policies, slices, node states and Nodes")]
pub struct InitialLists;

impl ipsetmgr_cluster::server::Health for ControllerShared {
    fn live(&self) -> Result<(), Unhealthy> {
        let age = now_ms().saturating_sub(self.loop_ms.load(Ordering::Relaxed));
        if age <= 5 * self.tick.as_millis() as u64 {
            Ok(())
        } else {
            Err(Unhealthy::of(LoopStalled { secs: age / 1000 }))
        }
    }

    fn ready(&self) -> Result<(), Unhealthy> {
        self.readiness()
    }

    fn metrics(&self) -> String {
        self.metrics
            .api
            .ready
            .set(i64::from(self.readiness().is_ok()));
        self.metrics.encode()
    }
}
