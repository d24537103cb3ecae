//! The agent's Prometheus metrics and the liveness/readiness facts the
//! HTTP server reads.
//!
//! Per-policy series are labelled by policy only (bounded by the number of
//! policies selecting this node; a node is told apart by the scrape
//! target), and disappear with the policy.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use ipsetmgr_api::IPSetNodeStateStatus;
use ipsetmgr_cluster::server::{LoopStalled, Unhealthy};
use ipsetmgr_cluster::telemetry::ApiMetrics;
use ipsetmgr_cluster::telemetry::labels::{BackendLabel, OutcomeLabel, PolicyLabel, ResultLabel};
use ipsetmgr_cluster::telemetry::watch_health::WatchHealth;

type FloatGauge = Gauge<f64, AtomicU64>;

fn apply_histogram() -> Histogram {
    // 1 ms .. ~32 s
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The agent's metrics. Handles are cheap clones sharing the same values.
pub struct Metrics {
    registry: Registry,
    /// By kind of kernel set (`ipset`, `nft`): see [`BackendLabel`].
    pub sets: Family<BackendLabel, Gauge>,
    /// Members of this node's sets that are in sync (in the kernel).
    pub members: Family<BackendLabel, Gauge>,
    pub apply_duration: Family<OutcomeLabel, Histogram, fn() -> Histogram>,
    pub problems: Family<BackendLabel, Counter>,
    /// Full resyncs that read nothing: the kernel had not changed.
    pub resyncs_skipped: Family<BackendLabel, Counter>,
    pub dataplane_errors: Counter,
    pub status_writes: Family<ResultLabel, Counter>,
    pub api: ApiMetrics,
    pub policy_synced: Family<PolicyLabel, Gauge>,
    pub policy_kernel_members: Family<PolicyLabel, Gauge>,
    pub policy_problems: Family<PolicyLabel, Gauge>,
    /// Members the policy's except ranges dropped or cut on this node.
    pub policy_excepted: Family<PolicyLabel, Gauge>,
    pub policy_last_sync: Family<PolicyLabel, FloatGauge>,
    pub drift_repaired: Family<PolicyLabel, Counter>,
    /// Attachments of the XDP program the agent made (`--xdp-interface`):
    /// the first, and each repair of one that had been detached.
    pub xdp_attaches: Counter,
    /// The policies that have series, to remove those of policies gone.
    labelled: Mutex<BTreeSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            sets: Family::default(),
            members: Family::default(),
            apply_duration: Family::new_with_constructor(apply_histogram),
            problems: Family::default(),
            resyncs_skipped: Family::default(),
            dataplane_errors: Counter::default(),
            status_writes: Family::default(),
            api: ApiMetrics::default(),
            policy_synced: Family::default(),
            policy_kernel_members: Family::default(),
            policy_problems: Family::default(),
            policy_excepted: Family::default(),
            policy_last_sync: Family::default(),
            drift_repaired: Family::default(),
            xdp_attaches: Counter::default(),
            labelled: Mutex::default(),
        };
        // prometheus-client appends `_total` to counters.
        ipsetmgr_cluster::telemetry::register_common(&mut registry, &m.api);
        let r = &mut registry;
        r.register(
            "ipsetmgr_sets",
            "Kernel sets this node should hold, by kind of set (ipset, nft)",
            m.sets.clone(),
        );
        r.register(
            "ipsetmgr_members",
            "Members of this node's sets that are in sync with the kernel, by kind of set",
            m.members.clone(),
        );
        r.register(
            "ipsetmgr_apply_duration_seconds",
            "Duration of one kernel apply (resync, batch, deletions), by outcome",
            m.apply_duration.clone(),
        );
        r.register(
            "ipsetmgr_problems",
            "Discrepancies between kernel and desired state found by full resyncs, by kind of set",
            m.problems.clone(),
        );
        r.register(
            "ipsetmgr_resyncs_skipped",
            "Full resyncs that read no set because the kernel had not changed since our own last read or write, by kind of set",
            m.resyncs_skipped.clone(),
        );
        r.register(
            "ipsetmgr_dataplane_errors",
            "Failed dataplane attempts and set-level errors",
            m.dataplane_errors.clone(),
        );
        r.register(
            "ipsetmgr_status_writes",
            "Writes of this node's IPSetNodeState, by result",
            m.status_writes.clone(),
        );
        r.register(
            "ipsetmgr_policy_synced",
            "1 when this node's kernel holds the policy's current sets exactly",
            m.policy_synced.clone(),
        );
        r.register(
            "ipsetmgr_policy_kernel_members",
            "Members of the policy's sets that are in sync with the kernel",
            m.policy_kernel_members.clone(),
        );
        r.register(
            "ipsetmgr_policy_problems",
            "Discrepancies the last full resync found in the policy's sets",
            m.policy_problems.clone(),
        );
        r.register(
            "ipsetmgr_policy_excepted_members",
            "Members of the policy that its spec.except dropped, or kept and cut with a nomatch entry",
            m.policy_excepted.clone(),
        );
        r.register(
            "ipsetmgr_policy_last_sync_timestamp_seconds",
            "When all of the policy's sets were last confirmed in sync (Unix time)",
            m.policy_last_sync.clone(),
        );
        r.register(
            "ipsetmgr_drift_repaired",
            "Discrepancies found in the kernel and repaired, by policy",
            m.drift_repaired.clone(),
        );
        r.register(
            "ipsetmgr_xdp_attaches",
            "Attachments of the XDP program by the agent (--xdp-interface): the first and each one after it had been detached",
            m.xdp_attaches.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        ipsetmgr_cluster::telemetry::encode(&self.registry)
    }

    /// The per-policy series from this node's state (what it reports in
    /// its IPSetNodeState), the members of each policy's sets in sync and
    /// the members its except ranges dropped or cut (as compiled for this
    /// node); series of policies no longer in it go.
    pub fn set_policies(
        &self,
        status: &IPSetNodeStateStatus,
        kernel_members: &std::collections::BTreeMap<&str, i64>,
        excepted: &std::collections::BTreeMap<&str, i64>,
    ) {
        let mut now = BTreeSet::new();
        for p in &status.policies {
            let label = PolicyLabel {
                policy: p.name.clone(),
            };
            self.policy_synced
                .get_or_create(&label)
                .set(i64::from(p.synced));
            self.policy_problems.get_or_create(&label).set(p.problems);
            self.policy_kernel_members
                .get_or_create(&label)
                .set(kernel_members.get(p.name.as_str()).copied().unwrap_or(0));
            self.policy_excepted
                .get_or_create(&label)
                .set(excepted.get(p.name.as_str()).copied().unwrap_or(0));
            if let Some(t) = p.last_sync_time.as_deref().and_then(unix_seconds) {
                self.policy_last_sync.get_or_create(&label).set(t);
            }
            now.insert(p.name.clone());
        }
        let mut labelled = self.labelled.lock().unwrap_or_else(|e| e.into_inner());
        for gone in labelled.difference(&now) {
            let label = PolicyLabel {
                policy: gone.clone(),
            };
            self.policy_synced.remove(&label);
            self.policy_kernel_members.remove(&label);
            self.policy_problems.remove(&label);
            self.policy_excepted.remove(&label);
            self.policy_last_sync.remove(&label);
            self.drift_repaired.remove(&label);
        }
        *labelled = now;
    }
}

impl Metrics {
    /// Metrics with one series in every family, so that an exposition
    /// names them all (a family without series prints nothing).
    pub fn with_every_family() -> Metrics {
        let m = Metrics::default();
        let status = IPSetNodeStateStatus {
            policies: vec![ipsetmgr_api::PolicyState {
                name: "example".into(),
                last_sync_time: Some("2026-01-01T00:00:00Z".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        m.set_policies(&status, &Default::default(), &Default::default());
        let policy = PolicyLabel {
            policy: "example".into(),
        };
        let _ = m.drift_repaired.get_or_create(&policy);
        m.api.touch_every_family();
        let _ = m.status_writes.get_or_create(&ResultLabel::of(true));
        let _ = m.apply_duration.get_or_create(&OutcomeLabel::of(true));
        let ipset = BackendLabel::of("ipset");
        let _ = m.sets.get_or_create(&ipset);
        let _ = m.members.get_or_create(&ipset);
        let _ = m.problems.get_or_create(&ipset);
        let _ = m.resyncs_skipped.get_or_create(&BackendLabel::of("nft"));
        m
    }
}

fn unix_seconds(rfc3339: &str) -> Option<f64> {
    let ts: jiff::Timestamp = rfc3339.parse().ok()?;
    Some(ts.as_millisecond() as f64 / 1000.0)
}

/// State shared between the event loop, the kernel thread and the server.
pub struct Shared {
    pub metrics: Metrics,
    pub watches: WatchHealth,
    resync_interval: Duration,
    /// Unix milliseconds of the kernel thread's last loop.
    heartbeat_ms: AtomicU64,
    /// The event loop's last turn (tokio's clock, so tests can pause it).
    loop_turn: Mutex<tokio::time::Instant>,
    /// What the store still waits for before anything is applied.
    waiting_for: Mutex<Option<String>>,
    first_sync: AtomicBool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The event loop turns at least this often (see `event_loop`).
pub const LOOP_TICK: Duration = Duration::from_secs(10);
/// Live while the event loop turned within this.
const LOOP_STALL: Duration = Duration::from_secs(60);

impl Shared {
    pub fn new(resync_interval: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            metrics: Metrics::default(),
            watches: WatchHealth::default(),
            resync_interval,
            heartbeat_ms: AtomicU64::new(0),
            loop_turn: Mutex::new(tokio::time::Instant::now()),
            waiting_for: Mutex::new(Some("the initial lists".into())),
            first_sync: AtomicBool::new(false),
        })
    }

    /// The kernel thread looped.
    pub fn heartbeat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// The event loop turned.
    pub fn loop_turned(&self) {
        *self.loop_turn.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
    }

    pub fn set_waiting_for(&self, what: Option<String>) {
        *self.waiting_for.lock().unwrap_or_else(|e| e.into_inner()) = what;
    }

    pub fn set_first_sync(&self) {
        self.first_sync.store(true, Ordering::Relaxed);
    }

    /// Live: the kernel thread looped within 3x the resync interval, and
    /// the event loop within a minute.
    pub fn live(&self) -> Result<(), Unhealthy> {
        let last = self.heartbeat_ms.load(Ordering::Relaxed);
        let limit = 3 * self.resync_interval.as_millis() as u64;
        if last == 0 || now_ms().saturating_sub(last) > limit {
            return Err(Unhealthy::of(KernelStalled));
        }
        let turned = *self.loop_turn.lock().unwrap_or_else(|e| e.into_inner());
        if turned.elapsed() > LOOP_STALL {
            return Err(Unhealthy::of(LoopStalled {
                secs: turned.elapsed().as_secs(),
            }));
        }
        Ok(())
    }

    /// Ready: everything was seen once, the kernel was synced once, and
    /// every watch works now. `Err` names each thing missing.
    pub fn ready(&self) -> Result<(), Unhealthy> {
        let mut why = Unhealthy::default();
        if let Some(what) = self
            .waiting_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            why.push(NotReady::WaitingFor(what));
        } else if !self.first_sync.load(Ordering::Relaxed) {
            why.push(NotReady::FirstKernelSync);
        }
        for failing in self.watches.problems() {
            why.push(failing);
        }
        why.into_result()
    }
}

/// The kernel thread has not looped within 3x the resync interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the kernel thread has stalled")]
pub struct KernelStalled;

/// What the agent still waits for before it counts as ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The store's inputs (`Store::waiting_for`: the CRDs, an initial
    /// list, this node's Node), as it names them.
    #[error("waiting for {0}")]
    WaitingFor(String),
    #[error("waiting for the first kernel sync")]
    FirstKernelSync,
}

impl ipsetmgr_cluster::server::Health for Shared {
    fn live(&self) -> Result<(), Unhealthy> {
        Shared::live(self)
    }

    fn ready(&self) -> Result<(), Unhealthy> {
        Shared::ready(self)
    }

    fn metrics(&self) -> String {
        self.metrics
            .api
            .ready
            .set(i64::from(Shared::ready(self).is_ok()));
        self.metrics.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_api::PolicyState;
    use ipsetmgr_cluster::server::Health;

    fn state(policies: &[(&str, bool)]) -> IPSetNodeStateStatus {
        IPSetNodeStateStatus {
            policies: policies
                .iter()
                .map(|(name, synced)| PolicyState {
                    name: name.to_string(),
                    synced: *synced,
                    problems: 2,
                    last_sync_time: Some("2026-01-02T03:04:05Z".into()),
                    ..PolicyState::default()
                })
                .collect(),
            ..IPSetNodeStateStatus::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn health_names_what_is_missing_and_follows_the_watches() {
        let shared = Shared::new(Duration::from_secs(60));
        assert!(shared.live().is_err(), "no kernel heartbeat yet");
        shared.heartbeat();
        assert!(shared.live().is_ok());
        let e = Health::ready(&*shared).unwrap_err().to_string();
        assert!(e.contains("initial lists"), "{e}");
        shared.set_waiting_for(Some("this node's Node object".into()));
        let e = Health::ready(&*shared).unwrap_err().to_string();
        assert!(e.contains("Node object"), "{e}");
        shared.set_waiting_for(None);
        let e = Health::ready(&*shared).unwrap_err().to_string();
        assert!(e.contains("first kernel sync"), "{e}");
        shared.set_first_sync();
        assert!(Health::ready(&*shared).is_ok());
        shared.watches.failed("ipsetpolicies", "HTTP 500");
        let e = Health::ready(&*shared).unwrap_err().to_string();
        assert_eq!(e, "watch of ipsetpolicies failing: HTTP 500");
        assert!(Health::metrics(&*shared).contains("ipsetmgr_ready 0"));
        shared.watches.delivered("ipsetpolicies");
        assert!(Health::ready(&*shared).is_ok());
        assert!(Health::metrics(&*shared).contains("ipsetmgr_ready 1"));

        tokio::time::advance(LOOP_STALL + Duration::from_secs(1)).await;
        let e = shared.live().unwrap_err().to_string();
        assert!(e.contains("event loop"), "{e}");
        shared.loop_turned();
        assert!(shared.live().is_ok());
    }

    #[test]
    fn per_policy_series_follow_the_node_state() {
        let m = Metrics::default();
        let kernel = std::collections::BTreeMap::from([("a", 7)]);
        let excepted = std::collections::BTreeMap::from([("a", 3)]);
        m.set_policies(&state(&[("a", true), ("b", false)]), &kernel, &excepted);
        let text = m.encode();
        for line in [
            "ipsetmgr_policy_synced{policy=\"a\"} 1",
            "ipsetmgr_policy_synced{policy=\"b\"} 0",
            "ipsetmgr_policy_problems{policy=\"a\"} 2",
            "ipsetmgr_policy_kernel_members{policy=\"a\"} 7",
            "ipsetmgr_policy_kernel_members{policy=\"b\"} 0",
            "ipsetmgr_policy_excepted_members{policy=\"a\"} 3",
            "ipsetmgr_policy_excepted_members{policy=\"b\"} 0",
            "ipsetmgr_policy_last_sync_timestamp_seconds{policy=\"a\"} 1767323045.0",
            "ipsetmgr_build_info{version=",
            "process_resident_memory_bytes ",
            "process_cpu_seconds_total ",
        ] {
            assert!(text.contains(line), "{line} missing in {text}");
        }
        m.set_policies(&state(&[("a", true)]), &kernel, &excepted);
        let text = m.encode();
        assert!(
            !text.contains("policy=\"b\""),
            "b's series are gone: {text}"
        );
    }
}
