//! Rendering the Helm chart (real Helm, `support/helm.rs`), with the API
//! versions a cluster would offer.

use super::*;

pub(crate) use crate::support::helm::Rendered;

/// What `.Capabilities.APIVersions` holds on a cluster without the
/// Prometheus Operator (and for `helm template` without `--api-versions`):
/// the built-in API groups the chart's objects use.
pub(crate) const BUILTIN_API_VERSIONS: &[&str] = &[
    "v1",
    "apps/v1",
    "rbac.authorization.k8s.io/v1",
    "admissionregistration.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "coordination.k8s.io/v1",
    "events.k8s.io/v1",
];

/// What the Prometheus Operator's CRDs add (Helm lists group/version and
/// group/version/Kind).
pub(crate) const MONITORING_API_VERSIONS: &[&str] = &[
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
];

/// Render the chart like `helm template ipsetmgr charts/ipsetmgr -n
/// ipsetmgr-system --set …` (without CRDs, which Helm installs from crds/
/// unrendered), for a cluster without the Prometheus Operator.
pub(crate) fn render_chart(overrides: &[(&str, Value)]) -> Rendered {
    render_chart_on(BUILTIN_API_VERSIONS, overrides)
}

/// `render_chart` for a cluster serving these API versions.
pub(crate) fn render_chart_on(api_versions: &[&str], overrides: &[(&str, Value)]) -> Rendered {
    try_render_chart_on(api_versions, overrides).unwrap_or_else(|e| panic!("{e}"))
}

/// `render_chart`, or the first template's error (a `fail`, say).
pub(crate) fn try_render_chart(overrides: &[(&str, Value)]) -> Result<Rendered, String> {
    try_render_chart_on(BUILTIN_API_VERSIONS, overrides)
}

pub(crate) fn try_render_chart_on(
    api_versions: &[&str],
    overrides: &[(&str, Value)],
) -> Result<Rendered, String> {
    support::helm::template(&support::helm::Render {
        release: RELEASE,
        namespace: NAMESPACE,
        api_versions,
        kube_version: None,
        overrides,
        include_crds: false,
    })
}
