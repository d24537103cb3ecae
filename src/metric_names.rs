//! Every metric name the agent and the controller expose, for checks of
//! alert rules and dashboards. Here, above both roles, rather than in
//! `telemetry` (which both roles import): the shared layer must not list
//! the roles' metrics.

use ipsetmgr_cluster::telemetry::exposed_names;

/// Every metric name the agent and the controller expose (see
/// [`exposed_names`]), for checks of alert rules and dashboards.
pub fn all_metric_names() -> Vec<String> {
    let agent = ipsetmgr_agent::metrics::Metrics::with_every_family().encode();
    let controller = ipsetmgr_controller::metrics::Metrics::with_every_family();
    let mut names = exposed_names(&agent);
    names.extend(exposed_names(&controller.encode()));
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_family_is_named_with_its_sample_suffixes() {
        let names = super::all_metric_names();
        for name in [
            "ipsetmgr_build_info",
            "ipsetmgr_ready",
            "ipsetmgr_policy_synced",
            "ipsetmgr_policy_last_sync_timestamp_seconds",
            "ipsetmgr_drift_repaired_total",
            "ipsetmgr_xdp_attaches_total",
            "ipsetmgr_watch_errors_total",
            "ipsetmgr_apply_duration_seconds_bucket",
            "ipsetmgr_controller_status_writes_total",
            "ipsetmgr_controller_slice_writes_total",
            "ipsetmgr_controller_event_writes_total",
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n == "ipsetmgr_drift_repaired"));
    }

    /// Every ipsetmgr metric the roles expose is in docs/observability.md's
    /// tables (by its family name: without `_total`, `_bucket`, ...).
    #[test]
    fn every_metric_is_documented() {
        let doc = include_str!("../docs/observability.md");
        let mut missing: Vec<String> = Vec::new();
        for name in super::all_metric_names() {
            if !name.starts_with("ipsetmgr_") {
                continue;
            }
            let family = ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            // `name` in a table, or `name{labels} ...` in the text.
            let named =
                |n: &str| doc.contains(&format!("`{n}`")) || doc.contains(&format!("`{n}{{"));
            if !named(family) && !named(&name) {
                missing.push(name.clone());
            }
        }
        assert!(
            missing.is_empty(),
            "not in docs/observability.md: {missing:?}"
        );
    }
}
