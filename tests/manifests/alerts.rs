//! The chart's PrometheusRule alerts on metrics the binary exposes.

use super::*;

/// Every metric name the agent and the controller export, with the
/// suffixes their samples carry (`_total`, `_bucket`...), from the library
/// itself: an alert naming a metric the binary does not export fails here
/// instead of never firing.
pub(crate) fn exported_metrics() -> Vec<String> {
    ipsetmgr::all_metric_names()
}

/// The metric names a PromQL expression mentions: identifiers (runs of
/// letters, digits, `_` and `:`) that start with `ipsetmgr_` or `process_`.
/// Label names and functions never start so; each such identifier must be
/// all lower-case letters and `_` (the names the binary uses).
pub(crate) fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut cur = String::new();
    for c in expr.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            cur.push(c);
            continue;
        }
        let word = std::mem::take(&mut cur);
        if word.starts_with("ipsetmgr_") || word.starts_with("process_") {
            assert!(
                word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{expr}: {word} is not a metric name of the form ipsetmgr_[a-z_]+"
            );
            names.push(word);
        }
    }
    names
}

/// A duration as Prometheus reads `for:` (units y, w, d, h, m, s, ms).
pub(crate) fn prometheus_duration(s: &str) -> bool {
    let mut rest = s;
    let mut any = false;
    for unit in ["y", "w", "d", "h", "m", "s", "ms"] {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(unit) {
            let after = &rest[digits + unit.len()..];
            // "m" must not be the start of "ms".
            if unit == "m" && after.starts_with('s') {
                continue;
            }
            rest = after;
            any = true;
        }
    }
    any && rest.is_empty()
}

/// The PrometheusRule's alerts, by name: (expr, for, labels, annotations).
pub(crate) fn alerts(docs: &[Value], what: &str) -> BTreeMap<String, Value> {
    let rules: Vec<&Value> = docs
        .iter()
        .filter(|d| kind_of(d) == "PrometheusRule")
        .collect();
    assert_eq!(rules.len(), 1, "{what}: one PrometheusRule");
    let rule = rules[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    let spec = rule["spec"].as_object().unwrap();
    assert_eq!(spec.keys().collect::<Vec<_>>(), ["groups"], "{what}: spec");
    let mut out = BTreeMap::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        assert!(group["name"].is_string(), "{what}: group name");
        for r in group["rules"].as_array().unwrap() {
            let r = r.as_object().unwrap();
            for key in r.keys() {
                assert!(
                    ["alert", "expr", "for", "labels", "annotations"].contains(&key.as_str()),
                    "{what}: rule field {key} (a PrometheusRule alert has no such field)"
                );
            }
            let name = r["alert"]
                .as_str()
                .expect("alerting rules only")
                .to_string();
            assert!(r["expr"].is_string(), "{what}: {name}: expr");
            if let Some(f) = r.get("for") {
                let ok = f.as_str().is_some_and(prometheus_duration);
                assert!(ok, "{what}: {name}: for: {f} is not a Prometheus duration");
            }
            for (k, v) in r["labels"].as_object().unwrap() {
                assert!(v.is_string(), "{what}: {name}: label {k} must be a string");
            }
            let ann = r["annotations"].as_object().unwrap();
            assert!(
                ann["summary"].is_string() && ann["description"].is_string(),
                "{what}: {name}: summary and description"
            );
            assert!(
                out.insert(name.clone(), Value::Object(r.clone())).is_none(),
                "{what}: alert {name} twice"
            );
        }
    }
    out
}

#[test]
pub(crate) fn chart_prometheus_rule_alerts_on_the_binarys_metrics() {
    needs_helm!("chart_prometheus_rule_alerts_on_the_binarys_metrics");
    let what = "chart with prometheusRule";
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("prometheusRule.enabled", json!(true)),
            ("prometheusRule.labels", json!({"release": "prometheus"})),
        ],
    );
    check_all_typed(&r.docs, what);
    check_namespaces(&r.docs, what);
    let rule = r
        .docs
        .iter()
        .find(|d| kind_of(d) == "PrometheusRule")
        .unwrap();
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(
        rule["metadata"]["labels"]["app.kubernetes.io/name"],
        "ipsetmgr"
    );
    let alerts = alerts(&r.docs, what);
    assert_eq!(
        alerts.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "IPSetMgrAgentCannotList",
            "IPSetMgrDriftRepairedRepeatedly",
            "IPSetMgrNoRecentSync",
            "IPSetPolicyNotSynced",
        ],
        "{what}: the alerts"
    );
    // Every metric an alert names is one the binary exports.
    let exported = exported_metrics();
    let mut used = BTreeSet::new();
    for (name, a) in &alerts {
        let names = metric_names(a["expr"].as_str().unwrap());
        assert!(!names.is_empty(), "{what}: {name} names no metric");
        for m in names {
            assert!(
                exported.contains(&m),
                "{what}: {name} uses {m}, which the binary does not export"
            );
            used.insert(m);
        }
    }
    assert_eq!(
        used.into_iter().collect::<Vec<_>>(),
        [
            "ipsetmgr_drift_repaired_total",
            "ipsetmgr_policy_last_sync_timestamp_seconds",
            "ipsetmgr_policy_synced",
            "ipsetmgr_ready",
            "ipsetmgr_watch_errors_total",
        ]
    );
    // The expressions and their defaults, exactly.
    let expr = |a: &str| alerts[a]["expr"].as_str().unwrap().to_string();
    let for_ = |a: &str| alerts[a].get("for").cloned();
    assert_eq!(expr("IPSetPolicyNotSynced"), "ipsetmgr_policy_synced == 0");
    assert_eq!(for_("IPSetPolicyNotSynced"), Some(json!("15m")));
    assert_eq!(
        expr("IPSetMgrNoRecentSync"),
        "time() - ipsetmgr_policy_last_sync_timestamp_seconds > 900"
    );
    assert_eq!(
        expr("IPSetMgrAgentCannotList"),
        "ipsetmgr_ready == 0 or rate(ipsetmgr_watch_errors_total[5m]) > 0"
    );
    assert_eq!(for_("IPSetMgrAgentCannotList"), Some(json!("10m")));
    assert_eq!(
        expr("IPSetMgrDriftRepairedRepeatedly"),
        "increase(ipsetmgr_drift_repaired_total[1h]) > 3"
    );
    // Prometheus' templates reach it verbatim (not eaten by Helm's).
    let description = |a: &str| {
        alerts[a]["annotations"]["description"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for a in [
        "IPSetPolicyNotSynced",
        "IPSetMgrNoRecentSync",
        "IPSetMgrDriftRepairedRepeatedly",
    ] {
        assert!(
            description(a).contains("{{ $labels.policy }}"),
            "{what}: {a}: {}",
            description(a)
        );
    }
    assert!(description("IPSetMgrAgentCannotList").contains("{{ $labels.resource }}"));

    // The thresholds are values.
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("prometheusRule.enabled", json!(true)),
            ("prometheusRule.notSyncedFor", json!("1h")),
            ("prometheusRule.noRecentSyncSeconds", json!(3600)),
            ("prometheusRule.cannotListFor", json!("30m")),
            ("prometheusRule.driftRepairedThreshold", json!(10)),
        ],
    );
    let alerts = self::alerts(&r.docs, "prometheusRule with thresholds");
    assert_eq!(alerts["IPSetPolicyNotSynced"]["for"], "1h");
    assert!(
        alerts["IPSetMgrNoRecentSync"]["expr"]
            .as_str()
            .unwrap()
            .ends_with("> 3600")
    );
    assert_eq!(alerts["IPSetMgrAgentCannotList"]["for"], "30m");
    assert!(
        alerts["IPSetMgrDriftRepairedRepeatedly"]["expr"]
            .as_str()
            .unwrap()
            .ends_with("> 10")
    );
}

#[test]
pub(crate) fn metric_name_tokenizer_finds_names_and_refuses_odd_ones() {
    assert_eq!(
        metric_names(
            "sum by (policy) (rate(ipsetmgr_watch_errors_total{resource=\"nodes\"}[5m])) / process_open_fds"
        ),
        ["ipsetmgr_watch_errors_total", "process_open_fds"]
    );
    assert!(metric_names("time() - up").is_empty());
    assert!(std::panic::catch_unwind(|| metric_names("ipsetmgr_Ready == 0")).is_err());
    assert!(
        prometheus_duration("15m") && prometheus_duration("1h30m") && prometheus_duration("500ms")
    );
    assert!(!prometheus_duration("") && !prometheus_duration("15") && !prometheus_duration("m5"));
}
