//! What the agent and the controller both expose besides their own
//! metrics: build information, the process's resource use, and whether
//! each of their watches of the API server works.

pub mod build_info;
pub mod labels;
pub mod process;
pub mod watch_health;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use labels::ResourceLabel;
use watch_health::WatchHealth;

/// What the agent and the controller both say about their link to the API
/// server. Handles are cheap clones sharing the same values.
#[derive(Clone, Debug, Default)]
pub struct ApiMetrics {
    pub watch_errors: Family<ResourceLabel, Counter>,
    /// 1 while /readyz answers 200.
    pub ready: Gauge,
}

impl ApiMetrics {
    /// The watch of `resource` failed: counted, and remembered for
    /// readiness.
    pub fn watch_failed(&self, health: &WatchHealth, resource: &str, error: &str) {
        health.failed(resource, error);
        self.watch_errors
            .get_or_create(&ResourceLabel {
                resource: resource.to_string(),
            })
            .inc();
    }

    /// One series in the family, for a complete exposition in tests.
    pub fn touch_every_family(&self) {
        let _ = self.watch_errors.get_or_create(&ResourceLabel {
            resource: "nodes".into(),
        });
    }
}

/// Register what every component exposes: `ipsetmgr_build_info`, the
/// `process_*` metrics, the watch errors and readiness.
pub fn register_common(registry: &mut Registry, api: &ApiMetrics) {
    build_info::register(registry);
    registry.register_collector(Box::new(process::ProcessCollector));
    registry.register(
        "ipsetmgr_watch_errors",
        "Failed lists and watches of the API server, by resource",
        api.watch_errors.clone(),
    );
    registry.register(
        "ipsetmgr_ready",
        "1 while /readyz answers 200",
        api.ready.clone(),
    );
}

/// The OpenMetrics text exposition of a registry.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The names of the metric families an OpenMetrics text exposes, with the
/// suffixes their samples carry (`_total` for counters; `_bucket`, `_sum`
/// and `_count` for histograms): what an alert expression may name.
pub fn exposed_names(exposition: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" => names.push(format!("{name}_total")),
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.push(format!("{name}{suffix}"));
                }
            }
            _ => names.push(name.to_string()),
        }
    }
    names
}
