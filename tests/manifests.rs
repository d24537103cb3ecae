//! Checks of everything that ships ipsetmgr to a cluster: the CRD copies, the
//! Helm chart, the kustomize base (agent, controller, RBAC) and the optional
//! admission policy, the sample policies and the e2e runner. The Dockerfile
//! has its own parsed checks in tests/dockerfile.rs.
//!
//! RBAC is checked as effective access: every binding is followed to its
//! role, and each ServiceAccount's grants must equal the API calls of its
//! component, no more and no less.
//!
//! No cluster or docker is needed (tests/chart_server.rs applies what is
//! checked here to a real API server):
//! - The chart is rendered by real Helm (`support/helm.rs`), which also
//!   checks the values against `values.schema.json` first
//!   (tests/chart_schema.rs tests the schema itself). Without Helm the chart
//!   tests skip with a message naming the package; under `CI=true` they fail.
//! - The kustomize base is checked twice: loaded directly by this file (which
//!   understands only `resources` and `namespace`, and fails on any other
//!   kustomization field), and rendered by the real kustomize through
//!   `scripts/render-kustomize.sh` (`kubectl kustomize`). When no kustomize is
//!   installed that test skips with a message, except under CI (`CI` set),
//!   where it fails.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    Container, Namespace, PodSpec, PodTemplateSpec, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const NAMESPACE: &str = "ipsetmgr-system";
/// Where the controller's Events go: they are about IPSetPolicy objects, which
/// are cluster-scoped, and the API server accepts Events about cluster-scoped
/// objects only in `default` (kube-runtime's Recorder creates them there).
const EVENTS_NAMESPACE: &str = "default";
const RELEASE: &str = "ipsetmgr";
/// The agent's metrics listener (hostNetwork: a port on every node).
const AGENT_PORT: i32 = 9477;
/// The agent's health listener: the node's loopback (the kubelet probes from
/// the node's network namespace, which the agent shares).
const AGENT_HEALTH: (&str, i32) = ("127.0.0.1", 9476);
/// The controller's metrics listener (its own pod network namespace).
const CONTROLLER_PORT: i32 = 9478;
/// The controller's health listener: not loopback, which the kubelet, outside
/// the pod's network namespace, could not reach.
const CONTROLLER_HEALTH: (&str, i32) = ("0.0.0.0", 9479);

/// Where a component listens: metrics (IPSETMGR_LISTEN) and health
/// (IPSETMGR_HEALTH_LISTEN), each an IPv4 address and a port.
#[derive(Clone, Debug)]
struct Listeners {
    metrics: (String, i32),
    health: (String, i32),
}

impl Listeners {
    fn new(metrics: (&str, i32), health: (&str, i32)) -> Listeners {
        Listeners {
            metrics: (metrics.0.into(), metrics.1),
            health: (health.0.into(), health.1),
        }
    }
    fn agent() -> Listeners {
        Listeners::new(("0.0.0.0", AGENT_PORT), AGENT_HEALTH)
    }
    fn controller() -> Listeners {
        Listeners::new(("0.0.0.0", CONTROLLER_PORT), CONTROLLER_HEALTH)
    }
    fn with_metrics_port(mut self, port: i32) -> Listeners {
        self.metrics.1 = port;
        self
    }
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every non-empty document of a multi-document YAML text, numbers normalised.
fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{what}: bad YAML: {e}"));
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(normalize)
        .collect()
}

/// Whole floats become integers, so `64`, `64.0` and `6.4e1` compare equal
/// (kustomize and the typed serialisers spell them differently).
fn normalize(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, normalize(v))).collect()),
        other => other,
    }
}

/// The first place where two JSON values differ, as a path, or None.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, &format!("{path}.{k}")),
                (p, q) => Some(format!("{path}.{k}: {p:?} vs {q:?}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path}: {a} vs {b}")),
    }
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

/// Parse `doc` into a typed object and check that nothing was lost: a
/// misspelt field would be ignored by the typed parser, so the typed object is
/// serialised again and compared with the input.
fn typed<T: DeserializeOwned + serde::Serialize>(doc: &Value, what: &str) -> T {
    let obj: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: {} {}: {e}", kind_of(doc), name_of(doc)));
    let back = normalize(serde_json::to_value(&obj).unwrap());
    if let Some(diff) = first_difference(doc, &back, "") {
        panic!(
            "{what}: {} {}: a field the Kubernetes type does not know (typo?) \
             or cannot hold: {diff} (input vs typed)",
            kind_of(doc),
            name_of(doc)
        );
    }
    obj
}

/// All objects of one kind, typed.
fn all_of<T: DeserializeOwned + serde::Serialize>(
    docs: &[Value],
    kind: &str,
    what: &str,
) -> Vec<T> {
    docs.iter()
        .filter(|d| kind_of(d) == kind)
        .map(|d| typed(d, what))
        .collect()
}

fn one_of<T: DeserializeOwned + serde::Serialize>(docs: &[Value], kind: &str, what: &str) -> T {
    let mut v = all_of::<T>(docs, kind, what);
    assert_eq!(v.len(), 1, "{what}: expected exactly one {kind}");
    v.pop().unwrap()
}

/// Parse every document into its typed Kubernetes object; fail on unknown kinds.
fn check_all_typed(docs: &[Value], what: &str) {
    for d in docs {
        match (d["apiVersion"].as_str().unwrap_or(""), kind_of(d)) {
            ("v1", "Namespace") => drop(typed::<Namespace>(d, what)),
            ("v1", "ServiceAccount") => drop(typed::<ServiceAccount>(d, what)),
            ("v1", "Service") => drop(typed::<Service>(d, what)),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                drop(typed::<CustomResourceDefinition>(d, what))
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => drop(typed::<ClusterRole>(d, what)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                drop(typed::<ClusterRoleBinding>(d, what))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => drop(typed::<Role>(d, what)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => drop(typed::<RoleBinding>(d, what)),
            ("apps/v1", "DaemonSet") => drop(typed::<DaemonSet>(d, what)),
            ("apps/v1", "Deployment") => drop(typed::<Deployment>(d, what)),
            ("networking.k8s.io/v1", "NetworkPolicy") => drop(typed::<
                k8s_openapi::api::networking::v1::NetworkPolicy,
            >(d, what)),
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
                drop(typed::<ValidatingAdmissionPolicy>(d, what))
            }
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                drop(typed::<ValidatingAdmissionPolicyBinding>(d, what))
            }
            // Not in k8s-openapi: checked field by field in their own tests.
            ("monitoring.coreos.com/v1", "ServiceMonitor" | "PrometheusRule") => {}
            (api, kind) => panic!("{what}: unexpected object {api} {kind} {}", name_of(d)),
        }
    }
}

// ---------------------------------------------------------------- chart ----

use support::helm::Rendered;

/// What `.Capabilities.APIVersions` holds on a cluster without the
/// Prometheus Operator (and for `helm template` without `--api-versions`):
/// the built-in API groups the chart's objects use.
const BUILTIN_API_VERSIONS: &[&str] = &[
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
const MONITORING_API_VERSIONS: &[&str] = &[
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
];

/// Render the chart like `helm template ipsetmgr charts/ipsetmgr -n
/// ipsetmgr-system --set …` (without CRDs, which Helm installs from crds/
/// unrendered), for a cluster without the Prometheus Operator.
fn render_chart(overrides: &[(&str, Value)]) -> Rendered {
    render_chart_on(BUILTIN_API_VERSIONS, overrides)
}

/// `render_chart` for a cluster serving these API versions.
fn render_chart_on(api_versions: &[&str], overrides: &[(&str, Value)]) -> Rendered {
    try_render_chart_on(api_versions, overrides).unwrap_or_else(|e| panic!("{e}"))
}

/// `render_chart`, or the first template's error (a `fail`, say).
fn try_render_chart(overrides: &[(&str, Value)]) -> Result<Rendered, String> {
    try_render_chart_on(BUILTIN_API_VERSIONS, overrides)
}

fn try_render_chart_on(
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

/// Whether Helm is here for `test` (after a skip message when not; under
/// `CI=true` its absence fails the test).
macro_rules! needs_helm {
    ($test:literal) => {
        if support::helm::available($test).is_none() {
            return;
        }
    };
}

// ------------------------------------------------------------ kustomize ----

const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Load a kustomization directly: `resources` (files or directories) and
/// `namespace` only. Any other field fails the test rather than being ignored:
/// extend this loader, or rely on `kustomize_renders_with_the_real_tool`.
fn load_kustomization(dir: &Path) -> Vec<Value> {
    let k: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("kustomization.yaml"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
    )
    .unwrap();
    for key in k.as_object().unwrap().keys() {
        assert!(
            ["apiVersion", "kind", "resources", "namespace"].contains(&key.as_str()),
            "{}/kustomization.yaml: field {key:?} is not understood by the test loader",
            dir.display()
        );
    }
    let mut docs = Vec::new();
    for r in k["resources"].as_array().cloned().unwrap_or_default() {
        let p = dir.join(r.as_str().unwrap());
        let p = p
            .canonicalize()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if p.is_dir() {
            docs.extend(load_kustomization(&p));
        } else {
            assert!(
                p.starts_with(dir.canonicalize().unwrap()),
                "{} is outside its kustomization root (kustomize would refuse it)",
                p.display()
            );
            docs.extend(yaml_docs(
                &std::fs::read_to_string(&p).unwrap(),
                &p.display().to_string(),
            ));
        }
    }
    if let Some(ns) = k["namespace"].as_str() {
        for d in &mut docs {
            if !CLUSTER_SCOPED.contains(&kind_of(d)) {
                d["metadata"]["namespace"] = json!(ns);
            }
            if let Some(subjects) = d.get_mut("subjects").and_then(Value::as_array_mut) {
                for s in subjects {
                    let unset = matches!(
                        s.get("namespace").and_then(Value::as_str),
                        None | Some("default")
                    );
                    if s["kind"] == "ServiceAccount" && unset {
                        s["namespace"] = json!(ns);
                    }
                }
            }
        }
    }
    docs
}

fn kustomize_default() -> Vec<Value> {
    load_kustomization(&repo("config/default"))
}

/// `Kind namespace/name` (namespace empty for cluster-scoped objects).
fn identity(d: &Value) -> String {
    format!(
        "{} {}/{}",
        kind_of(d),
        d["metadata"]["namespace"].as_str().unwrap_or(""),
        name_of(d)
    )
}

/// Key for comparing object lists regardless of order.
fn by_identity(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter().map(|d| (identity(d), d.clone())).collect()
}

// ----------------------------------------------------------------- RBAC ----

type Grant = (String, String, String); // (apiGroup, resource, verb)

fn grants(rules: &[PolicyRule], what: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in rules {
        assert!(
            r.non_resource_urls
                .as_deref()
                .unwrap_or_default()
                .is_empty(),
            "{what}: nonResourceURLs are not needed"
        );
        // A rule naming objects grants `resource#name` only.
        let names = r.resource_names.clone().unwrap_or_default();
        let groups = r.api_groups.clone().unwrap_or_default();
        let mut resources = r.resources.clone().unwrap_or_default();
        if !names.is_empty() {
            resources = resources
                .iter()
                .flat_map(|res| names.iter().map(move |n| format!("{res}#{n}")))
                .collect();
        }
        for g in &groups {
            for res in &resources {
                for v in &r.verbs {
                    for x in [g, res, v] {
                        assert!(!x.contains('*'), "{what}: wildcard in {r:?}");
                    }
                    assert!(res != "secrets", "{what}: no component needs secrets");
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn expect(list: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    list.iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect()
}

/// The names of a rendering's objects, from its fullname (the release name,
/// or fullnameOverride).
struct Names(String);

impl Names {
    fn release() -> Names {
        Names(RELEASE.to_string())
    }
    /// The DaemonSet: the plain fullname, as in 0.1 (its selector cannot
    /// change, and a new name would run old and new agents side by side).
    fn daemonset(&self) -> String {
        self.0.clone()
    }
    /// The agent's ServiceAccount, ClusterRole and ClusterRoleBinding.
    fn agent(&self) -> String {
        format!("{}-agent", self.0)
    }
    /// The controller's Deployment, ServiceAccount, roles and bindings.
    fn controller(&self) -> String {
        format!("{}-controller", self.0)
    }
}

/// The API calls the agent makes (the interface it is written to). All
/// cluster-wide; nothing namespaced: no Lease, no Events.
fn agent_grants() -> BTreeSet<Grant> {
    use kube::CustomResourceExt;
    let crd = |name: &str| format!("customresourcedefinitions#{name}");
    let policies = crd(ipsetmgr_api::IPSetPolicy::crd_name());
    let slices = crd(ipsetmgr_api::IPSetMemberSlice::crd_name());
    expect(&[
        ("ipsetmgr.io", "ipsetpolicies", &["get", "list", "watch"]),
        (
            "ipsetmgr.io",
            "ipsetmemberslices",
            &["get", "list", "watch"],
        ),
        // Its own IPSetNodeState: read it, create it when missing,
        // server-side apply its status. No list, no update, no delete.
        ("ipsetmgr.io", "ipsetnodestates", &["get", "create"]),
        ("ipsetmgr.io", "ipsetnodestates/status", &["get", "patch"]),
        ("", "nodes", &["get", "list", "watch"]),
        // By name only, the CRDs whose deletion (which deletes all their
        // objects first) must not read as "every policy or member removed".
        ("apiextensions.k8s.io", &policies, &["get", "list", "watch"]),
        ("apiextensions.k8s.io", &slices, &["get", "list", "watch"]),
    ])
}

/// The controller's cluster-wide API calls.
fn controller_grants() -> BTreeSet<Grant> {
    expect(&[
        ("ipsetmgr.io", "ipsetpolicies", &["get", "list", "watch"]),
        ("ipsetmgr.io", "ipsetpolicies/status", &["get", "patch"]),
        (
            "ipsetmgr.io",
            "ipsetmemberslices",
            &["get", "list", "watch"],
        ),
        // The slices it materialises from membersFrom: server-side apply
        // (create and patch), deleted when their source is gone.
        (
            "ipsetmgr.io",
            "ipsetmemberslices",
            &["create", "patch", "delete"],
        ),
        // Aggregated into policy status; deleted when their node is gone.
        (
            "ipsetmgr.io",
            "ipsetnodestates",
            &["get", "list", "watch", "delete"],
        ),
        ("", "nodes", &["get", "list", "watch"]),
    ])
}

/// Which member sources a rendering grants the controller's reads for
/// (the chart's memberSources, kustomize's config/member-sources).
#[derive(Clone, Copy, Default)]
struct Sources {
    pods: bool,
    services: bool,
}

/// The pods and services member sources (watched only while a policy has
/// one; Namespaces for their namespaceSelectors), when granted.
fn controller_source_grants(s: Sources) -> BTreeSet<Grant> {
    let mut list: Vec<(&str, &str, &[&str])> = Vec::new();
    if s.pods {
        list.push(("", "pods", &["list", "watch"]));
    }
    if s.services {
        list.push(("", "services", &["list", "watch"]));
    }
    if s.pods || s.services {
        list.push(("", "namespaces", &["list", "watch"]));
    }
    expect(&list)
}

/// In the controller's own namespace: its leader Lease only, with the
/// verbs kube-lease-manager uses (it creates, reads and patches the Lease;
/// it never updates or deletes it).
fn controller_lease_grants() -> BTreeSet<Grant> {
    expect(&[("coordination.k8s.io", "leases", &["get", "create", "patch"])])
}

/// In `default` (EVENTS_NAMESPACE): Events only. The controller creates
/// events.k8s.io/v1 Events (repeats are suppressed before any write).
fn controller_events_grants() -> BTreeSet<Grant> {
    expect(&[("events.k8s.io", "events", &["create"])])
}

/// Where a grant holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Cluster,
    Namespace(String),
}

/// What each ServiceAccount (by name; all live in NAMESPACE) may do, where.
type Access = BTreeMap<(String, Scope), BTreeSet<Grant>>;

fn expected_access(names: &Names, controller: bool, sources: Sources) -> Access {
    let mut want = Access::new();
    want.insert((names.agent(), Scope::Cluster), agent_grants());
    if controller {
        let c = names.controller();
        let mut cluster = controller_grants();
        cluster.extend(controller_source_grants(sources));
        want.insert((c.clone(), Scope::Cluster), cluster);
        want.insert(
            (c.clone(), Scope::Namespace(NAMESPACE.into())),
            controller_lease_grants(),
        );
        want.insert(
            (c, Scope::Namespace(EVENTS_NAMESPACE.into())),
            controller_events_grants(),
        );
    }
    want
}

/// The RBAC objects of a rendering, by identity (the docs name them).
fn expected_rbac_objects(names: &Names, controller: bool, sources: Sources) -> BTreeSet<String> {
    let (a, c) = (names.agent(), names.controller());
    let mut ids = vec![
        format!("ServiceAccount {NAMESPACE}/{a}"),
        format!("ClusterRole /{a}"),
        format!("ClusterRoleBinding /{a}"),
    ];
    if controller {
        ids.extend([
            format!("ServiceAccount {NAMESPACE}/{c}"),
            format!("ClusterRole /{c}"),
            format!("ClusterRoleBinding /{c}"),
            format!("Role {NAMESPACE}/{c}"),
            format!("RoleBinding {NAMESPACE}/{c}"),
            format!("Role {EVENTS_NAMESPACE}/{c}-events"),
            format!("RoleBinding {EVENTS_NAMESPACE}/{c}-events"),
        ]);
        if sources.pods || sources.services {
            ids.extend([
                format!("ClusterRole /{c}-member-sources"),
                format!("ClusterRoleBinding /{c}-member-sources"),
            ]);
        }
    }
    ids.into_iter().collect()
}

/// Every namespaced object is in NAMESPACE, except Roles and RoleBindings,
/// which may also be in `default` (the events Role); which ones are there is
/// checked by name in `check_rbac`.
fn check_namespaces(docs: &[Value], what: &str) {
    for d in docs {
        let kind = kind_of(d);
        if CLUSTER_SCOPED.contains(&kind) {
            assert!(
                d["metadata"].get("namespace").is_none(),
                "{what}: {kind} {} is cluster-scoped: no namespace",
                name_of(d)
            );
            continue;
        }
        let ns = d["metadata"]["namespace"].as_str().unwrap_or("");
        let allowed: &[&str] = if matches!(kind, "Role" | "RoleBinding") {
            &[NAMESPACE, EVENTS_NAMESPACE]
        } else {
            &[NAMESPACE]
        };
        assert!(
            allowed.contains(&ns),
            "{what}: {kind} {} in namespace {ns:?}, expected one of {allowed:?}",
            name_of(d)
        );
    }
}

/// The effective permissions of a rendering, found by following every binding
/// to its role. Checks the wiring on the way: each binding has one subject, a
/// ServiceAccount of NAMESPACE that the rendering creates; each roleRef names
/// a role of the rendering (a RoleBinding only a Role of its own namespace);
/// every role is bound by something.
fn access(docs: &[Value], what: &str) -> Access {
    check_namespaces(docs, what);
    let cluster_roles: BTreeMap<String, ClusterRole> =
        all_of::<ClusterRole>(docs, "ClusterRole", what)
            .into_iter()
            .map(|r| (r.metadata.name.clone().unwrap(), r))
            .collect();
    let roles: BTreeMap<(String, String), Role> = all_of::<Role>(docs, "Role", what)
        .into_iter()
        .map(|r| {
            let key = (
                r.metadata.namespace.clone().unwrap(),
                r.metadata.name.clone().unwrap(),
            );
            (key, r)
        })
        .collect();
    let accounts: BTreeSet<String> = all_of::<ServiceAccount>(docs, "ServiceAccount", what)
        .into_iter()
        .map(|sa| sa.metadata.name.unwrap())
        .collect();
    let subject = |subjects: Option<Vec<Subject>>, binding: &str| -> String {
        let s = subjects.unwrap_or_default();
        assert_eq!(s.len(), 1, "{what}: {binding}: one subject per binding");
        assert_eq!(s[0].kind, "ServiceAccount", "{what}: {binding}: subject");
        assert_eq!(
            s[0].namespace.as_deref(),
            Some(NAMESPACE),
            "{what}: {binding}: subject namespace (the ServiceAccount's, also for \
             a binding in {EVENTS_NAMESPACE})"
        );
        assert!(
            accounts.contains(&s[0].name),
            "{what}: {binding} binds ServiceAccount {}, which is not rendered",
            s[0].name
        );
        s[0].name.clone()
    };
    let mut bound = BTreeSet::new();
    let mut out = Access::new();
    for crb in all_of::<ClusterRoleBinding>(docs, "ClusterRoleBinding", what) {
        let b = format!(
            "ClusterRoleBinding {}",
            crb.metadata.name.unwrap_or_default()
        );
        let r = &crb.role_ref;
        assert_eq!(
            r.api_group.as_deref(),
            Some("rbac.authorization.k8s.io"),
            "{what}: {b}"
        );
        assert_eq!(r.kind, "ClusterRole", "{what}: {b}");
        let role = cluster_roles
            .get(&r.name)
            .unwrap_or_else(|| panic!("{what}: {b}: no ClusterRole {}", r.name));
        bound.insert(format!("ClusterRole {}", r.name));
        let sa = subject(crb.subjects, &b);
        out.entry((sa, Scope::Cluster))
            .or_default()
            .extend(grants(role.rules.as_deref().unwrap_or_default(), what));
    }
    for rb in all_of::<RoleBinding>(docs, "RoleBinding", what) {
        let ns = rb.metadata.namespace.clone().unwrap();
        let b = format!("RoleBinding {ns}/{}", rb.metadata.name.unwrap_or_default());
        let r = &rb.role_ref;
        assert_eq!(
            r.api_group.as_deref(),
            Some("rbac.authorization.k8s.io"),
            "{what}: {b}"
        );
        assert_eq!(r.kind, "Role", "{what}: {b}");
        let role = roles.get(&(ns.clone(), r.name.clone())).unwrap_or_else(|| {
            panic!(
                "{what}: {b}: no Role {} in {ns} (a RoleBinding can only bind a Role \
                 of its own namespace)",
                r.name
            )
        });
        bound.insert(format!("Role {ns}/{}", r.name));
        let sa = subject(rb.subjects, &b);
        out.entry((sa, Scope::Namespace(ns)))
            .or_default()
            .extend(grants(role.rules.as_deref().unwrap_or_default(), what));
    }
    for name in cluster_roles.keys() {
        let id = format!("ClusterRole {name}");
        assert!(bound.contains(&id), "{what}: {id} is not bound");
    }
    for (ns, name) in roles.keys() {
        let id = format!("Role {ns}/{name}");
        assert!(bound.contains(&id), "{what}: {id} is not bound");
    }
    out
}

/// The RBAC of a rendering: every component's ServiceAccount has exactly the
/// grants its API calls need, where it needs them; the objects have the names
/// the docs use; each workload runs as its own ServiceAccount.
fn check_rbac(docs: &[Value], names: &Names, controller: bool, what: &str) {
    check_rbac_with(docs, names, controller, Sources::default(), what)
}

/// [`check_rbac`] of a rendering that grants the reads of `sources`.
fn check_rbac_with(docs: &[Value], names: &Names, controller: bool, sources: Sources, what: &str) {
    let got = access(docs, what);
    // The agent's token is on every node: nothing namespaced, and in
    // particular no Events and no Leases, anywhere.
    for ((sa, scope), granted) in &got {
        if *sa != names.agent() {
            continue;
        }
        assert_eq!(
            *scope,
            Scope::Cluster,
            "{what}: the agent has no namespaced role"
        );
        for (group, res, verb) in granted {
            assert!(
                !res.starts_with("events") && !res.starts_with("leases"),
                "{what}: the agent may {verb} {group}/{res}: it publishes no Events \
                 and takes no Lease"
            );
        }
    }
    let want = expected_access(names, controller, sources);
    for key in got.keys().chain(want.keys()).collect::<BTreeSet<_>>() {
        let (g, w) = (
            got.get(key).cloned().unwrap_or_default(),
            want.get(key).cloned().unwrap_or_default(),
        );
        assert!(
            g == w,
            "{what}: ServiceAccount {} {:?}: granted but not needed: {:?}; needed but \
             not granted: {:?}",
            key.0,
            key.1,
            g.difference(&w).collect::<Vec<_>>(),
            w.difference(&g).collect::<Vec<_>>()
        );
    }
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let ids: BTreeSet<String> = docs
        .iter()
        .filter(|d| rbac_kinds.contains(&kind_of(d)))
        .map(identity)
        .collect();
    assert_eq!(
        ids,
        expected_rbac_objects(names, controller, sources),
        "{what}: RBAC objects"
    );

    let ds: DaemonSet = one_of(docs, "DaemonSet", what);
    assert_eq!(
        ds.metadata.name,
        Some(names.daemonset()),
        "{what}: DaemonSet name"
    );
    assert_eq!(
        pod_of(&ds.spec.template).service_account_name,
        Some(names.agent()),
        "{what}: the agent's ServiceAccount"
    );
    let deployments: Vec<Deployment> = all_of(docs, "Deployment", what);
    if controller {
        assert_eq!(deployments.len(), 1, "{what}: one controller Deployment");
        let d = &deployments[0];
        assert_eq!(
            d.metadata.name,
            Some(names.controller()),
            "{what}: Deployment name"
        );
        assert_eq!(
            pod_of(&d.spec.clone().template).service_account_name,
            Some(names.controller()),
            "{what}: the controller's ServiceAccount"
        );
    } else {
        assert!(deployments.is_empty(), "{what}: no controller");
    }
}

// ------------------------------------------------------------ workloads ----

fn pod_of(template: &PodTemplateSpec) -> PodSpec {
    template.spec.clone().expect("pod spec")
}

/// The pod's only container, which has this name; no init containers.
fn only_container(pod: &PodSpec, name: &str, what: &str) -> Container {
    assert_eq!(pod.containers.len(), 1, "{what}: one container");
    assert!(pod.init_containers.is_none(), "{what}: no init containers");
    assert_eq!(pod.containers[0].name, name, "{what}: container name");
    pod.containers[0].clone()
}

fn agent_container(ds: &DaemonSet) -> Container {
    let pod = pod_of(&ds.spec.clone().template);
    only_container(&pod, "agent", "agent")
}

fn controller_container(d: &Deployment) -> Container {
    let pod = pod_of(&d.spec.clone().template);
    only_container(&pod, "controller", "controller")
}

fn env_map(c: &Container) -> BTreeMap<String, Value> {
    c.env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name.clone(), serde_json::to_value(&e).unwrap()))
        .collect()
}

fn env_value(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn field_ref(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == name)?
        .value_from
        .as_ref()?
        .field_ref
        .as_ref()
        .map(|f| f.field_path.clone())
}

/// Only these variables, each a setting of the component.
fn check_env_names(c: &Container, known: &[&str], what: &str) {
    for name in env_map(c).keys() {
        assert!(
            known.contains(&name.as_str()),
            "{what}: env {name} is not a setting of this component"
        );
    }
}

/// A duration as the flags parse it (src/duration.rs): a bare number of
/// seconds, or jiff's friendly format (60s, 5m, 1h30m); more than zero and at
/// most a year.
fn positive_duration(s: &str) -> bool {
    const YEAR: u64 = 365 * 24 * 3600;
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<u64>().is_ok_and(|n| n > 0 && n <= YEAR);
    }
    s.parse::<jiff::SignedDuration>()
        .is_ok_and(|d| d.is_positive() && d <= jiff::SignedDuration::from_secs(YEAR as i64))
}

/// The settings both components read: listeners, log format, set prefix.
fn check_common_env(c: &Container, listen: &Listeners, what: &str) {
    let addr = |(a, p): &(String, i32)| format!("{a}:{p}");
    assert_eq!(
        env_value(c, "IPSETMGR_LISTEN"),
        Some(addr(&listen.metrics)),
        "{what}: the metrics listener"
    );
    assert_eq!(
        env_value(c, "IPSETMGR_HEALTH_LISTEN"),
        Some(addr(&listen.health)),
        "{what}: the health listener"
    );
    for var in ["IPSETMGR_LISTEN", "IPSETMGR_HEALTH_LISTEN"] {
        let v = env_value(c, var).unwrap_or_default();
        assert!(
            v.parse::<std::net::SocketAddr>().is_ok(),
            "{what}: {var}={v:?} is not an address the binary parses"
        );
    }
    let log = env_value(c, "IPSETMGR_LOG_FORMAT").unwrap_or_default();
    assert!(
        ["text", "json"].contains(&log.as_str()),
        "{what}: log format {log:?}"
    );
    let prefix = env_value(c, "IPSETMGR_SET_PREFIX").unwrap_or_default();
    assert!(
        ipsetmgr_ipset::Naming::new(&prefix).is_ok(),
        "{what}: set prefix {prefix:?} is not valid"
    );
}

/// Port `metrics`; liveness (/livez) and readiness (/readyz) probes on the
/// health listener, where the kubelet can reach it; requests and a memory
/// limit. `host_network`: the pod is in the node's network namespace, where
/// the kubelet probes from, so a specific health address (loopback) is
/// probed as the probe's `host`; otherwise the kubelet probes the pod's IP
/// from outside, and only a wildcard health address answers there.
fn check_served(c: &Container, listen: &Listeners, host_network: bool, what: &str) {
    let ports = c.ports.clone().unwrap_or_default();
    let metrics = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap_or_else(|| panic!("{what}: no port named metrics"));
    assert_eq!(
        metrics.container_port, listen.metrics.1,
        "{what}: metrics port"
    );
    let (health_addr, health_port) = &listen.health;
    let probe_target = |probe: Option<k8s_openapi::api::core::v1::Probe>, kind: &str| {
        let get = probe
            .unwrap_or_else(|| panic!("{what}: no {kind}"))
            .http_get
            .unwrap_or_else(|| panic!("{what}: {kind} is not httpGet"));
        let port = match &get.port {
            IntOrString::Int(p) => *p,
            IntOrString::String(name) => {
                ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name))
                    .unwrap_or_else(|| panic!("{what}: {kind}: no port named {name}"))
                    .container_port
            }
        };
        assert_eq!(
            port, *health_port,
            "{what}: {kind} must probe the health port"
        );
        let wildcard = health_addr == "0.0.0.0";
        if host_network && !wildcard {
            assert_eq!(
                get.host.as_deref(),
                Some(health_addr.as_str()),
                "{what}: {kind} must probe the health address {health_addr}"
            );
        } else {
            assert_eq!(get.host, None, "{what}: {kind}: no host (the pod's IP)");
            assert!(
                wildcard,
                "{what}: the kubelet cannot reach a health listener on {health_addr} \
                 from outside the pod's network namespace"
            );
        }
        assert_eq!(
            get.scheme.as_deref().unwrap_or("HTTP"),
            "HTTP",
            "{what}: {kind} scheme"
        );
        get.path.unwrap_or_default()
    };
    assert_eq!(
        probe_target(c.liveness_probe.clone(), "livenessProbe"),
        "/livez"
    );
    assert_eq!(
        probe_target(c.readiness_probe.clone(), "readinessProbe"),
        "/readyz"
    );
    let res = c
        .resources
        .clone()
        .unwrap_or_else(|| panic!("{what}: no resources"));
    assert!(
        res.requests
            .is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")),
        "{what}: cpu and memory requests"
    );
    assert!(
        res.limits.is_some_and(|l| l.contains_key("memory")),
        "{what}: memory limit"
    );
}

/// The selector matches the pod template, and names the component, so the
/// agent's and the controller's selectors never match each other's pods.
fn check_selector(
    selector: &LabelSelector,
    template: &PodTemplateSpec,
    component: &str,
    what: &str,
) {
    let labels = template
        .metadata
        .clone()
        .and_then(|m| m.labels)
        .unwrap_or_default();
    let match_labels = selector.match_labels.clone().unwrap_or_default();
    for (k, v) in &match_labels {
        assert_eq!(labels.get(k), Some(v), "{what}: selector label {k}");
    }
    assert_eq!(
        match_labels
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some(component),
        "{what}: the selector names the component"
    );
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("ipsetmgr")
    );
}

/// A DaemonSet's selector is immutable: the agent's must stay exactly what
/// 0.1 shipped, or `helm upgrade` and `kubectl apply -k` of an upgrade fail.
fn check_agent_selector_is_0_1s(ds: &DaemonSet, with_instance: bool, what: &str) {
    let mut want = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "ipsetmgr".to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            "agent".to_string(),
        ),
    ]);
    if with_instance {
        want.insert("app.kubernetes.io/instance".into(), RELEASE.into());
    }
    assert_eq!(
        ds.spec.selector.match_labels,
        Some(want),
        "{what}: the DaemonSet selector of 0.1"
    );
    assert!(ds.spec.selector.match_expressions.is_none());
}

/// The security and wiring contract of the agent DaemonSet.
fn check_daemonset(ds: &DaemonSet, listen: &Listeners, what: &str) {
    let spec = ds.spec.clone();
    let pod = pod_of(&spec.template);
    assert_eq!(
        ds.metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "{what}: namespace"
    );
    assert_eq!(pod.host_network, Some(true), "{what}: hostNetwork");
    assert_eq!(
        pod.dns_policy.as_deref(),
        Some("ClusterFirstWithHostNet"),
        "{what}: dnsPolicy"
    );
    for (field, v) in [("hostPID", pod.host_pid), ("hostIPC", pod.host_ipc)] {
        assert_ne!(v, Some(true), "{what}: {field}");
    }
    assert_ne!(
        pod.automount_service_account_token,
        Some(false),
        "{what}: the agent needs its token"
    );
    assert!(
        pod.volumes.as_deref().unwrap_or_default().is_empty(),
        "{what}: the agent needs no volumes (hostPath in particular)"
    );
    // Runs on every node, control plane included.
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "{what}: tolerates every taint"
    );
    let strategy = spec.update_strategy.clone().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.unwrap().max_unavailable,
        Some(IntOrString::Int(1)),
        "{what}: maxUnavailable"
    );
    check_selector(&spec.selector, &spec.template, "agent", what);

    let c = only_container(&pod, "agent", what);
    assert!(
        c.command.is_none(),
        "{what}: keep the image ENTRYPOINT (ipsetmgr agent)"
    );
    assert!(
        c.args.as_deref().unwrap_or_default().is_empty(),
        "{what}: flags come from env"
    );
    let sc = c
        .security_context
        .clone()
        .expect("container securityContext");
    let caps = sc.capabilities.clone().expect("capabilities");
    assert_eq!(
        caps.add,
        Some(vec!["NET_ADMIN".to_string()]),
        "{what}: adds only NET_ADMIN"
    );
    assert_eq!(
        caps.drop,
        Some(vec!["ALL".to_string()]),
        "{what}: drops ALL"
    );
    assert_eq!(sc.privileged, Some(false), "{what}: not privileged");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    if let Some(psc) = &pod.security_context {
        assert!(psc.sysctls.is_none(), "{what}: no sysctls");
    }

    assert_eq!(
        field_ref(&c, "NODE_NAME").as_deref(),
        Some("spec.nodeName"),
        "{what}: NODE_NAME"
    );
    for gone in ["POD_NAMESPACE", "POD_NAME"] {
        assert!(
            !env_map(&c).contains_key(gone),
            "{what}: {gone}: the agent takes no Lease and publishes no Events"
        );
    }
    check_env_names(
        &c,
        &[
            "NODE_NAME",
            "IPSETMGR_SET_PREFIX",
            "IPSETMGR_MAX_SET_ELEMENTS",
            "IPSETMGR_MAX_HASH_SIZE",
            "IPSETMGR_NODE_STATE_INTERVAL",
            "IPSETMGR_BACKEND",
            "IPSETMGR_RESYNC_INTERVAL",
            "IPSETMGR_HEARTBEAT_INTERVAL",
            "IPSETMGR_LISTEN",
            "IPSETMGR_HEALTH_LISTEN",
            "IPSETMGR_LOG_FORMAT",
        ],
        what,
    );
    check_common_env(&c, listen, what);
    let backend = env_value(&c, "IPSETMGR_BACKEND").unwrap_or_default();
    assert!(
        ["netlink", "cli"].contains(&backend.as_str()),
        "{what}: backend {backend}"
    );
    let resync = env_value(&c, "IPSETMGR_RESYNC_INTERVAL").unwrap_or_default();
    assert!(
        positive_duration(&resync),
        "{what}: resync interval {resync:?}"
    );
    let heartbeat = env_value(&c, "IPSETMGR_HEARTBEAT_INTERVAL").unwrap_or_default();
    assert!(
        positive_duration(&heartbeat),
        "{what}: heartbeat interval {heartbeat:?}"
    );
    check_served(&c, listen, true, what);
}

/// The security and wiring contract of the controller Deployment: no host
/// access of any kind, an unprivileged uid, its own token.
fn check_controller(d: &Deployment, listen: &Listeners, what: &str) {
    assert_eq!(
        d.metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "{what}: namespace"
    );
    let spec = d.spec.clone();
    assert!(spec.replicas.is_some_and(|r| r >= 1), "{what}: replicas");
    // Not maxUnavailable 0: a new controller may have to wait for the old
    // one's Lease before it is ready, and the rollout would never finish.
    let strategy = spec.strategy.clone().unwrap_or_default();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.unwrap_or_default();
    assert_eq!(
        rolling.max_unavailable,
        Some(IntOrString::Int(1)),
        "{what}: maxUnavailable"
    );
    assert_eq!(
        rolling.max_surge,
        Some(IntOrString::Int(1)),
        "{what}: maxSurge"
    );
    check_selector(&spec.selector, &spec.template, "controller", what);

    let pod = pod_of(&spec.template);
    assert_ne!(pod.host_network, Some(true), "{what}: no hostNetwork");
    for (field, v) in [("hostPID", pod.host_pid), ("hostIPC", pod.host_ipc)] {
        assert_ne!(v, Some(true), "{what}: {field}");
    }
    assert!(
        pod.volumes.as_deref().unwrap_or_default().is_empty(),
        "{what}: the controller needs no volumes"
    );
    assert_eq!(
        pod.automount_service_account_token,
        Some(true),
        "{what}: the controller needs its token"
    );
    let c = only_container(&pod, "controller", what);
    // The image's ENTRYPOINT is `ipsetmgr agent`.
    assert_eq!(
        c.command,
        Some(vec!["/usr/local/bin/ipsetmgr".to_string()]),
        "{what}: command"
    );
    assert_eq!(c.args, Some(vec!["controller".to_string()]), "{what}: args");

    let psc = pod.security_context.clone().unwrap_or_default();
    let sc = c
        .security_context
        .clone()
        .expect("container securityContext");
    assert_eq!(
        sc.run_as_non_root.or(psc.run_as_non_root),
        Some(true),
        "{what}: runAsNonRoot"
    );
    // The image's USER is root: without a uid, runAsNonRoot would stop the
    // kubelet from starting it.
    let uid = sc.run_as_user.or(psc.run_as_user);
    assert!(
        uid.is_some_and(|u| u != 0),
        "{what}: a non-zero runAsUser, got {uid:?}"
    );
    let seccomp = sc.seccomp_profile.clone().or(psc.seccomp_profile.clone());
    assert_eq!(
        seccomp.map(|s| s.type_).as_deref(),
        Some("RuntimeDefault"),
        "{what}: seccompProfile"
    );
    let caps = sc.capabilities.clone().expect("capabilities");
    assert!(
        caps.add.unwrap_or_default().is_empty(),
        "{what}: adds no capability"
    );
    assert_eq!(
        caps.drop,
        Some(vec!["ALL".to_string()]),
        "{what}: drops ALL"
    );
    assert_ne!(sc.privileged, Some(true), "{what}: not privileged");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    assert!(psc.sysctls.is_none(), "{what}: no sysctls");

    assert_eq!(
        field_ref(&c, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace"),
        "{what}: POD_NAMESPACE (where its Lease lives)"
    );
    assert_eq!(
        field_ref(&c, "POD_NAME").as_deref(),
        Some("metadata.name"),
        "{what}: POD_NAME (the Lease holder)"
    );
    check_env_names(
        &c,
        &[
            "POD_NAMESPACE",
            "POD_NAME",
            "IPSETMGR_SET_PREFIX",
            "IPSETMGR_MAX_SET_ELEMENTS",
            "IPSETMGR_MAX_HASH_SIZE",
            "IPSETMGR_NODE_STATE_INTERVAL",
            "IPSETMGR_LISTEN",
            "IPSETMGR_HEALTH_LISTEN",
            "IPSETMGR_LOG_FORMAT",
            "IPSETMGR_FEED_ALLOW_CIDRS",
            "IPSETMGR_FEED_DENY_CIDRS",
        ],
        what,
    );
    check_common_env(&c, listen, what);
    check_served(&c, listen, false, what);
    for p in c.ports.clone().unwrap_or_default() {
        assert!(p.host_port.is_none(), "{what}: no hostPort");
    }
}

/// Two serialisable values are equal, or the first difference is shown.
fn assert_same<T: serde::Serialize>(a: &T, b: &T, what: &str) {
    let (a, b) = (
        serde_json::to_value(a).unwrap(),
        serde_json::to_value(b).unwrap(),
    );
    if let Some(diff) = first_difference(&a, &b, "") {
        panic!("{what}: {diff}");
    }
}

// ---------------------------------------------------------------- tests ----

/// The three CRDs of `crds/ipsetmgr.yaml`, typed, by kind.
fn crds_by_kind(docs: &[Value], what: &str) -> BTreeMap<String, CustomResourceDefinition> {
    let crds: Vec<CustomResourceDefinition> = all_of(docs, "CustomResourceDefinition", what);
    let by_kind: BTreeMap<String, CustomResourceDefinition> = crds
        .into_iter()
        .map(|c| (c.spec.names.kind.clone(), c))
        .collect();
    assert_eq!(
        by_kind.keys().map(String::as_str).collect::<Vec<_>>(),
        ["IPSetMemberSlice", "IPSetNodeState", "IPSetPolicy"],
        "{what}: the CRDs, one per kind"
    );
    let names: BTreeSet<String> = by_kind
        .values()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(ipsetmgr_api::crd_names()),
        "{what}: CRD names"
    );
    by_kind
}

#[test]
fn crd_copies_are_identical() {
    let root = read("crds/ipsetmgr.yaml");
    for copy in [
        "charts/ipsetmgr/crds/ipsetmgr.yaml",
        "config/crd/ipsetmgr.yaml",
    ] {
        assert!(
            read(copy) == root,
            "{copy} differs from crds/ipsetmgr.yaml: run scripts/sync-crds.sh"
        );
    }
    // The chart's crds/ holds only this file: Helm installs every file there.
    let chart_crds: BTreeSet<String> = std::fs::read_dir(repo("charts/ipsetmgr/crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        chart_crds,
        BTreeSet::from(["ipsetmgr.yaml".to_string()]),
        "charts/ipsetmgr/crds/"
    );
    // Only the generic facts of the resources (the content is `ipsetmgr
    // crd`'s, checked by tests/crd.rs).
    let docs = yaml_docs(&root, "crds/ipsetmgr.yaml");
    check_all_typed(&docs, "crds/ipsetmgr.yaml");
    let crds = crds_by_kind(&docs, "crds/ipsetmgr.yaml");
    for (kind, plural, short, status) in [
        ("IPSetPolicy", "ipsetpolicies", "ipsp", true),
        ("IPSetMemberSlice", "ipsetmemberslices", "ipsms", false),
        ("IPSetNodeState", "ipsetnodestates", "ipsns", true),
    ] {
        let crd = &crds[kind];
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.ipsetmgr.io").as_str())
        );
        assert_eq!(crd.spec.group, "ipsetmgr.io");
        assert_eq!(crd.spec.scope, "Cluster", "{kind} is cluster-scoped");
        assert_eq!(crd.spec.names.plural, plural);
        assert!(
            crd.spec
                .names
                .short_names
                .clone()
                .unwrap_or_default()
                .contains(&short.to_string()),
            "{kind}: short name {short}"
        );
        let v = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == "v1alpha1")
            .unwrap_or_else(|| panic!("{kind}: version v1alpha1"));
        assert!(v.served && v.storage);
        // The RBAC grants `<plural>/status`: it must exist where granted.
        assert_eq!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            status,
            "{kind}: status subresource"
        );
    }
    let v = &crds["IPSetPolicy"].spec.versions[0];
    let schema = v
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    let spec = &schema.properties.as_ref().unwrap()["spec"];
    let props = spec.properties.as_ref().unwrap();
    for field in [
        "type",
        "family",
        "members",
        "nodeSelector",
        "maxElem",
        "hashSize",
    ] {
        assert!(
            props.contains_key(field),
            "spec.{field} missing from the CRD schema"
        );
    }
}

/// kubeVersion, the icon and Artifact Hub's annotations.
fn check_chart_yaml_extras(chart: &Value) {
    use base64::Engine;
    // The minimum docs/install.md states, with "-0" so that vendor builds
    // (v1.27.3-gke.100, pre-releases to semver) match.
    let kube = chart["kubeVersion"].as_str().expect("kubeVersion");
    let min = kube
        .strip_prefix(">=")
        .and_then(|v| v.strip_suffix(".0-0"))
        .unwrap_or_else(|| panic!("kubeVersion {kube:?}: expected >=X.Y.0-0"));
    assert_eq!(kube, ">=1.25.0-0");
    let docs = read("docs/install.md");
    assert!(
        docs.contains(&format!("Kubernetes {min} or newer")),
        "docs/install.md must state the minimum of Chart.yaml's kubeVersion, {min}"
    );

    // The icon is icon.svg, inline.
    let icon = chart["icon"].as_str().expect("icon");
    let b64 = icon
        .strip_prefix("data:image/svg+xml;base64,")
        .expect("icon: a data:image/svg+xml;base64 URL");
    let svg = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("icon: base64");
    assert_eq!(
        svg,
        read("charts/ipsetmgr/icon.svg").into_bytes(),
        "Chart.yaml's icon is not charts/ipsetmgr/icon.svg: base64 -w0 it again"
    );
    // Helm repeats it for every version in a repository's index.yaml.
    assert!(svg.len() < 2048, "icon.svg: keep it small");
    let text = String::from_utf8(svg).unwrap();
    assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(text.trim_end().ends_with("</svg>"));
    assert!(
        read("charts/ipsetmgr/.helmignore")
            .lines()
            .any(|l| l == "icon.svg"),
        "the packaged chart needs no second copy of the icon"
    );

    // Artifact Hub reads its annotations as YAML inside strings.
    let ann = chart["annotations"].as_object().expect("annotations");
    let parse = |key: &str| -> Value {
        let text = ann[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: a string"));
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    let image = format!(
        "{}:{}",
        values["image"]["repository"].as_str().unwrap(),
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        parse("artifacthub.io/images"),
        json!([{"name": "ipsetmgr", "image": image}]),
        "artifacthub.io/images: the image the chart deploys by default"
    );
    let changes = parse("artifacthub.io/changes");
    for c in changes.as_array().expect("artifacthub.io/changes: a list") {
        let kind = c["kind"].as_str().unwrap_or_default();
        assert!(
            [
                "added",
                "changed",
                "deprecated",
                "removed",
                "fixed",
                "security"
            ]
            .contains(&kind),
            "artifacthub.io/changes: kind {kind:?}"
        );
        assert!(c["description"].is_string(), "artifacthub.io/changes: {c}");
    }
    for key in ann.keys() {
        assert!(key.starts_with("artifacthub.io/"), "annotation {key}");
    }
}

#[test]
fn chart_metadata_matches_the_crate() {
    let chart: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/Chart.yaml")).unwrap();
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["name"], "ipsetmgr");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "Chart.yaml appVersion must follow Cargo.toml's version (the image tag)"
    );
    check_chart_yaml_extras(&chart);
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    assert_eq!(values["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(values["priorityClassName"], "system-node-critical");
    // The binary's defaults (--listen, --health-listen), so that the chart
    // and a bare `ipsetmgr agent`/`controller` listen alike.
    assert_eq!(
        values["metrics"],
        json!({"address": "0.0.0.0", "port": AGENT_PORT})
    );
    assert_eq!(
        values["health"],
        json!({"address": AGENT_HEALTH.0, "port": AGENT_HEALTH.1})
    );
    assert_eq!(values["serviceMonitor"]["enabled"], false);
    assert_eq!(values["backend"], "netlink");
    assert_eq!(values["heartbeatInterval"], "60s");
    let c = &values["controller"];
    assert_eq!(c["enabled"], true);
    assert_eq!(c["replicas"], 1);
    assert_eq!(
        c["metrics"],
        json!({"address": "0.0.0.0", "port": CONTROLLER_PORT})
    );
    assert_eq!(
        c["health"],
        json!({"address": CONTROLLER_HEALTH.0, "port": CONTROLLER_HEALTH.1})
    );
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
}

#[test]
fn chart_renders_with_default_values() {
    needs_helm!("chart_renders_with_default_values");
    let r = render_chart(&[]);
    check_all_typed(&r.docs, "chart");
    let kinds: BTreeSet<&str> = r.docs.iter().map(kind_of).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
            "Deployment",
            // Helm's own default cluster version is 1.30 or newer.
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]),
        "objects rendered with default values (no ServiceMonitor; the admission \
         policy, where the cluster is 1.30 or newer)"
    );
    check_rbac(&r.docs, &Names::release(), true, "chart");
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart");
    check_daemonset(&ds, &Listeners::agent(), "chart");
    check_agent_selector_is_0_1s(&ds, true, "chart");
    let c = agent_container(&ds);
    assert_eq!(
        c.image.as_deref(),
        Some("ipsetmgr:0.1.0"),
        "image tag defaults to appVersion"
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_BACKEND").as_deref(),
        Some("netlink")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_HEARTBEAT_INTERVAL").as_deref(),
        Some("60s")
    );
    let pod = pod_of(&ds.spec.template);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let d: Deployment = one_of(&r.docs, "Deployment", "chart");
    check_controller(&d, &Listeners::controller(), "chart");
    assert_eq!(d.spec.clone().replicas, Some(1));
    let cc = controller_container(&d);
    assert_eq!(cc.image, c.image, "one image for both components");
    assert_eq!(
        pod_of(&d.spec.template).priority_class_name,
        None,
        "the controller is not node-critical"
    );
    assert!(r.notes.contains("kubectl get ipsp"), "NOTES.txt renders");
    assert!(r.notes.contains("ipm4-blocklist"));
    assert!(r.notes.contains("deployment/ipsetmgr-controller"));
    assert!(r.notes.contains("kubectl get ipsns"));
}

#[test]
fn chart_values_reach_the_agent() {
    needs_helm!("chart_values_reach_the_agent");
    let r = render_chart(&[
        ("image.repository", json!("registry.example/ipsetmgr")),
        ("image.tag", json!("dev")),
        ("setPrefix", json!("fw")),
        ("backend", json!("cli")),
        ("resyncInterval", json!(15)),
        ("heartbeatInterval", json!("2m")),
        ("logFormat", json!("json")),
        ("metrics.port", json!(9555)),
        ("priorityClassName", json!("")),
        ("fullnameOverride", json!("ipsm")),
        ("podLabels", json!({"team": "net"})),
        ("podAnnotations", json!({"example.com/note": "x"})),
        ("imagePullSecrets", json!([{"name": "regcred"}])),
        (
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}),
        ),
    ]);
    let what = "chart with overrides";
    check_all_typed(&r.docs, what);
    check_rbac(&r.docs, &Names("ipsm".into()), true, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    assert_eq!(ds.metadata.name.as_deref(), Some("ipsm"));
    check_daemonset(&ds, &Listeners::agent().with_metrics_port(9555), what);
    let c = agent_container(&ds);
    assert_eq!(c.image.as_deref(), Some("registry.example/ipsetmgr:dev"));
    assert_eq!(env_value(&c, "IPSETMGR_SET_PREFIX").as_deref(), Some("fw"));
    assert_eq!(env_value(&c, "IPSETMGR_BACKEND").as_deref(), Some("cli"));
    assert_eq!(
        env_value(&c, "IPSETMGR_RESYNC_INTERVAL").as_deref(),
        Some("15")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_HEARTBEAT_INTERVAL").as_deref(),
        Some("2m")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_LOG_FORMAT").as_deref(),
        Some("json")
    );
    let template = ds.spec.template;
    let labels = template.metadata.clone().unwrap().labels.unwrap();
    assert_eq!(labels.get("team").map(String::as_str), Some("net"));
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("ipsetmgr")
    );
    let annotations = template.metadata.unwrap().annotations.unwrap();
    assert_eq!(
        annotations.get("example.com/note").map(String::as_str),
        Some("x")
    );
    let pod = template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name, None,
        "empty priorityClassName is left out"
    );
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
    assert!(pod.affinity.unwrap().node_affinity.is_some());

    // The settings both components share reach the controller too; the
    // agent's own do not.
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    check_controller(&d, &Listeners::controller(), what);
    let cc = controller_container(&d);
    assert_eq!(cc.image.as_deref(), Some("registry.example/ipsetmgr:dev"));
    assert_eq!(env_value(&cc, "IPSETMGR_SET_PREFIX").as_deref(), Some("fw"));
    assert_eq!(
        env_value(&cc, "IPSETMGR_LOG_FORMAT").as_deref(),
        Some("json")
    );
    let cpod = pod_of(&d.spec.template);
    assert_eq!(cpod.image_pull_secrets.unwrap()[0].name, "regcred");
    assert!(cpod.affinity.is_none(), "affinity is the agent's");
}

#[test]
fn chart_values_reach_the_controller() {
    needs_helm!("chart_values_reach_the_controller");
    let r = render_chart(&[
        ("controller.replicas", json!(2)),
        ("controller.metrics.port", json!(9600)),
        (
            "controller.resources",
            json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}),
        ),
        (
            "controller.nodeSelector",
            json!({"node-role.example/infra": "true"}),
        ),
        (
            "controller.tolerations",
            json!([{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]),
        ),
        (
            "controller.priorityClassName",
            json!("system-cluster-critical"),
        ),
        (
            "controller.feedAllowCIDRs",
            json!(["10.20.0.0/16", "192.0.2.7"]),
        ),
        ("controller.feedDenyCIDRs", json!(["10.20.30.0/24"])),
        ("policyLimits.maxSetElements", json!(1_000_000)),
    ]);
    let what = "chart with controller overrides";
    check_all_typed(&r.docs, what);
    check_rbac(&r.docs, &Names::release(), true, what);
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    check_controller(&d, &Listeners::controller().with_metrics_port(9600), what);
    let cc = controller_container(&d);
    assert_eq!(
        env_value(&cc, "IPSETMGR_FEED_ALLOW_CIDRS").as_deref(),
        Some("10.20.0.0/16,192.0.2.7")
    );
    assert_eq!(
        env_value(&cc, "IPSETMGR_FEED_DENY_CIDRS").as_deref(),
        Some("10.20.30.0/24")
    );
    // One cap for the agents and the controller, as an integer (Helm holds
    // numbers as floats; 1e+06 would not parse).
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    for c in [&cc, &agent_container(&ds)] {
        assert_eq!(
            env_value(c, "IPSETMGR_MAX_SET_ELEMENTS").as_deref(),
            Some("1000000")
        );
        assert_eq!(
            env_value(c, "IPSETMGR_MAX_HASH_SIZE").as_deref(),
            Some("1048576")
        );
    }
    let spec = d.spec.clone();
    assert_eq!(spec.replicas, Some(2));
    let pod = pod_of(&spec.template);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    // Helm merges a map given in values into the default map (to drop a
    // default key, set it to null).
    assert_eq!(
        pod.node_selector,
        Some(BTreeMap::from([
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("node-role.example/infra".to_string(), "true".to_string())
        ]))
    );
    assert_eq!(pod.tolerations.unwrap()[0].key.as_deref(), Some("infra"));
    let c = controller_container(&d);
    let res = c.resources.unwrap();
    assert_eq!(
        res.limits.unwrap()["memory"],
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into())
    );
    // The agent keeps its own port.
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
}

/// The controller may read Pods, Services and Namespaces only when the
/// values say the cluster uses those member sources; the chart's objects
/// for that are config/member-sources's.
#[test]
fn member_source_rights_follow_the_values() {
    needs_helm!("member_source_rights_follow_the_values");
    for (pods, services) in [(false, false), (true, false), (false, true), (true, true)] {
        let r = render_chart(&[
            ("memberSources.pods", json!(pods)),
            ("memberSources.services", json!(services)),
        ]);
        let what = format!("memberSources pods={pods} services={services}");
        check_all_typed(&r.docs, &what);
        check_rbac_with(
            &r.docs,
            &Names::release(),
            true,
            Sources { pods, services },
            &what,
        );
    }
    let chart = render_chart(&[
        ("memberSources.pods", json!(true)),
        ("memberSources.services", json!(true)),
    ]);
    let chart = by_identity(&chart.docs);
    let kust = load_kustomization(&repo("config/member-sources"));
    check_all_typed(&kust, "config/member-sources");
    for (id, obj) in by_identity(&kust) {
        let other = chart
            .get(&id)
            .unwrap_or_else(|| panic!("{id} is not in the chart"));
        for field in ["rules", "roleRef", "subjects"] {
            if let Some(diff) = first_difference(&obj[field], &other[field], "") {
                panic!("{id}: config/member-sources vs chart: {field}{diff}");
            }
        }
    }
}

/// The optional NetworkPolicy: the controller's pods only, egress only, to
/// DNS, the API server's given addresses and public feeds; without the API
/// server's addresses it refuses to render.
#[test]
fn chart_network_policy_limits_the_controllers_egress() {
    needs_helm!("chart_network_policy_limits_the_controllers_egress");
    let e = try_render_chart(&[("controller.networkPolicy.enabled", json!(true))])
        .err()
        .expect("rendered without the API server's addresses");
    assert!(e.contains("controller.networkPolicy.apiServerCIDRs"), "{e}");
    let r = render_chart(&[
        ("controller.networkPolicy.enabled", json!(true)),
        (
            "controller.networkPolicy.apiServerCIDRs",
            json!(["10.96.0.1/32", "192.168.10.5/32"]),
        ),
    ]);
    let what = "chart with controller.networkPolicy";
    check_all_typed(&r.docs, what);
    let np: k8s_openapi::api::networking::v1::NetworkPolicy =
        one_of(&r.docs, "NetworkPolicy", what);
    let spec = np.spec.unwrap();
    assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    let pod_labels = d.spec.template.metadata.unwrap().labels.unwrap();
    let sel = spec.pod_selector.unwrap().match_labels.unwrap();
    assert!(
        sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "selects the controller's pods"
    );
    assert!(
        sel.get("app.kubernetes.io/component")
            .is_some_and(|c| c == "controller")
    );
    let egress = spec.egress.unwrap();
    assert_eq!(egress.len(), 3, "DNS, the API server, feeds");
    let cidrs = |i: usize| -> Vec<String> {
        egress[i]
            .to
            .clone()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.ip_block.as_ref().map(|b| b.cidr.clone()))
            .collect()
    };
    assert_eq!(cidrs(1), ["10.96.0.1/32", "192.168.10.5/32"]);
    let feeds = egress[2].to.clone().unwrap();
    let except = feeds[0].ip_block.as_ref().unwrap().except.clone().unwrap();
    for private in ["10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8"] {
        assert!(
            except.iter().any(|e| e == private),
            "{private} is excepted from feeds"
        );
    }
    assert!(
        render_chart(&[])
            .docs
            .iter()
            .all(|d| kind_of(d) != "NetworkPolicy"),
        "off by default"
    );
}

#[test]
fn chart_controller_can_be_disabled() {
    needs_helm!("chart_controller_can_be_disabled");
    let r = render_chart(&[("controller.enabled", json!(false))]);
    let what = "chart without controller";
    check_all_typed(&r.docs, what);
    check_rbac(&r.docs, &Names::release(), false, what);
    for d in &r.docs {
        assert_ne!(
            d["metadata"]["labels"]["app.kubernetes.io/component"],
            "controller",
            "{what}: {} rendered",
            identity(d)
        );
    }
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
}

fn probe(p: Option<k8s_openapi::api::core::v1::Probe>) -> Value {
    serde_json::to_value(p.expect("a probe")).unwrap()
}

#[test]
fn chart_listeners_and_probe_timings_are_values() {
    needs_helm!("chart_listeners_and_probe_timings_are_values");
    // Health on the metrics listener (one listener serves every path), and
    // probe timings changed one field at a time (Helm merges the rest).
    let r = render_chart(&[
        ("health.address", json!("0.0.0.0")),
        ("health.port", json!(AGENT_PORT)),
        ("livenessProbe.periodSeconds", json!(20)),
        ("readinessProbe.failureThreshold", json!(5)),
        ("controller.metrics.port", json!(9600)),
        ("controller.health.port", json!(9601)),
        ("controller.livenessProbe.timeoutSeconds", json!(2)),
        ("controller.readinessProbe.initialDelaySeconds", json!(3)),
    ]);
    let what = "chart with listener and probe values";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let one = Listeners::new(("0.0.0.0", AGENT_PORT), ("0.0.0.0", AGENT_PORT));
    check_daemonset(&ds, &one, what);
    let c = agent_container(&ds);
    let (live, ready) = (probe(c.liveness_probe), probe(c.readiness_probe));
    assert_eq!(
        live["httpGet"],
        json!({"path": "/livez", "port": AGENT_PORT})
    );
    assert_eq!(
        (&live["periodSeconds"], &live["initialDelaySeconds"]),
        (&json!(20), &json!(10)),
        "{what}: liveness period set, the rest from the defaults"
    );
    assert_eq!(ready["failureThreshold"], 5);
    assert_eq!(ready["periodSeconds"], 5);

    let d: Deployment = one_of(&r.docs, "Deployment", what);
    check_controller(
        &d,
        &Listeners::new(("0.0.0.0", 9600), ("0.0.0.0", 9601)),
        what,
    );
    let cc = controller_container(&d);
    let (live, ready) = (probe(cc.liveness_probe), probe(cc.readiness_probe));
    assert_eq!(live["timeoutSeconds"], 2);
    assert_eq!(live["failureThreshold"], 6);
    assert_eq!(ready["initialDelaySeconds"], 3);

    // A health address other than the wildcard is probed there (the agent
    // shares the node's network namespace with the kubelet).
    let r = render_chart(&[("metrics.address", json!("127.0.0.1"))]);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart, loopback metrics");
    check_daemonset(
        &ds,
        &Listeners::new(("127.0.0.1", AGENT_PORT), AGENT_HEALTH),
        "chart, loopback metrics",
    );
}

#[test]
fn chart_refuses_one_port_on_two_addresses() {
    needs_helm!("chart_refuses_one_port_on_two_addresses");
    // The same port on two addresses: the second bind would fail at start.
    for (port, addr, other) in [
        ("health.port", "health.address", "9477"),
        (
            "controller.health.port",
            "controller.health.address",
            "9478",
        ),
    ] {
        let other: i64 = other.parse().unwrap();
        let e = try_render_chart(&[(port, json!(other)), (addr, json!("10.1.2.3"))])
            .err()
            .unwrap_or_else(|| panic!("{port}={other}, {addr}=10.1.2.3 rendered"));
        assert!(
            e.contains("metrics.port and health.port are equal but their addresses differ"),
            "{e}"
        );
    }
}

#[test]
fn chart_extra_args_and_env_are_appended_and_change_nothing_else() {
    needs_helm!("chart_extra_args_and_env_are_appended_and_change_nothing_else");
    let agent_env = json!([
        {"name": "RUST_LOG", "value": "info,ipsetmgr=debug"},
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]);
    let controller_env = json!([{"name": "RUST_LOG", "value": "debug"}]);
    let r = render_chart(&[
        ("extraArgs", json!(["--lock-wait", "1m"])),
        ("extraEnv", agent_env.clone()),
        ("controller.extraArgs", json!(["--namespace", "elsewhere"])),
        ("controller.extraEnv", controller_env.clone()),
    ]);
    let what = "chart with extraArgs and extraEnv";
    check_all_typed(&r.docs, what);
    let base = render_chart(&[]);
    let pod = |docs: &[Value], kind: &str| -> Value {
        let d = docs.iter().find(|d| kind_of(d) == kind).unwrap();
        d["spec"]["template"]["spec"].clone()
    };
    for (kind, args, env) in [
        ("DaemonSet", json!(["--lock-wait", "1m"]), &agent_env),
        (
            "Deployment",
            json!(["controller", "--namespace", "elsewhere"]),
            &controller_env,
        ),
    ] {
        let (mut got, want) = (pod(&r.docs, kind), pod(&base.docs, kind));
        let c = &mut got["containers"][0];
        assert_eq!(c["args"], args, "{what}: {kind} args");
        // After the chart's own variables, in order.
        let base_env = want["containers"][0]["env"].as_array().unwrap().clone();
        let mut full = base_env.clone();
        full.extend(env.as_array().unwrap().iter().cloned());
        assert_eq!(c["env"], Value::Array(full), "{what}: {kind} env");
        // Nothing else changed.
        c["env"] = Value::Array(base_env);
        match kind {
            "DaemonSet" => drop(c.as_object_mut().unwrap().remove("args")),
            _ => c["args"] = json!(["controller"]),
        }
        if let Some(diff) = first_difference(&got, &want, "") {
            panic!("{what}: {kind} pod changed beyond args and env: {diff}");
        }
    }
}

#[test]
fn chart_update_strategies_are_values() {
    needs_helm!("chart_update_strategies_are_values");
    let r = render_chart(&[
        ("updateStrategy.rollingUpdate.maxUnavailable", json!("10%")),
        ("controller.updateStrategy.type", json!("Recreate")),
        // Kubernetes refuses rollingUpdate with Recreate; Helm merged the
        // default's in, so it must be deleted.
        ("controller.updateStrategy.rollingUpdate", Value::Null),
    ]);
    let what = "chart with update strategies";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let s = ds.spec.update_strategy.unwrap();
    assert_eq!(s.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        s.rolling_update.unwrap().max_unavailable,
        Some(IntOrString::String("10%".into()))
    );
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    let s = d.spec.strategy.unwrap();
    assert_eq!(s.type_.as_deref(), Some("Recreate"));
    assert!(s.rolling_update.is_none(), "{what}: no rollingUpdate");
}

/// Whether a label selector (plain labels) selects these labels.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

#[test]
fn chart_service_monitors_are_optional_and_select_their_component() {
    needs_helm!("chart_service_monitors_are_optional_and_select_their_component");
    assert!(
        !render_chart(&[])
            .docs
            .iter()
            .any(|d| matches!(kind_of(d), "Service" | "ServiceMonitor")),
        "no Service or ServiceMonitor by default"
    );
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("serviceMonitor.labels", json!({"release": "prometheus"})),
        ],
    );
    let what = "chart with serviceMonitor";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    let pod_labels = |t: &PodTemplateSpec| t.metadata.clone().unwrap().labels.unwrap();
    let pods = [
        ("agent", pod_labels(&ds.spec.template), AGENT_PORT),
        ("controller", pod_labels(&d.spec.template), CONTROLLER_PORT),
    ];
    let services: Vec<Value> = r
        .docs
        .iter()
        .filter(|d| kind_of(d) == "Service")
        .cloned()
        .collect();
    let monitors: Vec<Value> = r
        .docs
        .iter()
        .filter(|d| kind_of(d) == "ServiceMonitor")
        .cloned()
        .collect();
    assert_eq!(services.len(), 2, "{what}: one Service per component");
    assert_eq!(
        monitors.len(),
        2,
        "{what}: one ServiceMonitor per component"
    );
    for (component, labels, port) in &pods {
        // Exactly one Service selects this component's pods, and no other's.
        let svc: Vec<Service> = services
            .iter()
            .filter(|s| selects(&labels_of(&s["spec"]["selector"]), labels))
            .map(|s| typed(s, what))
            .collect();
        assert_eq!(
            svc.len(),
            1,
            "{what}: Services selecting the {component} pods"
        );
        let svc = &svc[0];
        let spec = svc.spec.clone().unwrap();
        for (other, other_labels, _) in &pods {
            if other != component {
                assert!(
                    !selects(&spec.selector.clone().unwrap(), other_labels),
                    "{what}: the {component} Service also selects the {other} pods"
                );
            }
        }
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
        let p = &spec.ports.unwrap()[0];
        assert_eq!(p.name.as_deref(), Some("metrics"));
        assert_eq!(p.port, *port, "{what}: {component} Service port");
        assert_eq!(
            p.target_port,
            Some(IntOrString::String("metrics".into())),
            "{what}: {component} Service targetPort"
        );
        // Exactly one ServiceMonitor selects this Service.
        let svc_labels = svc.metadata.labels.clone().unwrap();
        let sm: Vec<&Value> = monitors
            .iter()
            .filter(|m| {
                selects(
                    &labels_of(&m["spec"]["selector"]["matchLabels"]),
                    &svc_labels,
                )
            })
            .collect();
        assert_eq!(
            sm.len(),
            1,
            "{what}: ServiceMonitors selecting the {component} Service"
        );
        let sm = sm[0];
        assert_eq!(sm["metadata"]["namespace"], NAMESPACE);
        assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
        assert_eq!(
            sm["spec"]["namespaceSelector"]["matchNames"],
            json!([NAMESPACE])
        );
        assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    }

    // Without the controller, only the agents' pair.
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("controller.enabled", json!(false)),
        ],
    );
    let kinds: Vec<String> = r
        .docs
        .iter()
        .filter(|d| matches!(kind_of(d), "Service" | "ServiceMonitor"))
        .map(identity)
        .collect();
    assert_eq!(
        kinds,
        [
            format!("Service {NAMESPACE}/{RELEASE}-metrics"),
            format!("ServiceMonitor {NAMESPACE}/{RELEASE}"),
        ],
        "serviceMonitor without the controller"
    );
}

/// A cluster with the Prometheus Operator's CRDs.
fn with_monitoring() -> Vec<&'static str> {
    BUILTIN_API_VERSIONS
        .iter()
        .chain(MONITORING_API_VERSIONS)
        .copied()
        .collect()
}

#[test]
fn chart_monitoring_objects_need_their_crd_or_force() {
    needs_helm!("chart_monitoring_objects_need_their_crd_or_force");
    // (value prefix, the kinds it renders, the API version it needs)
    let cases = [
        (
            "serviceMonitor",
            &["Service", "ServiceMonitor"][..],
            "monitoring.coreos.com/v1/ServiceMonitor",
        ),
        (
            "prometheusRule",
            &["PrometheusRule"][..],
            "monitoring.coreos.com/v1/PrometheusRule",
        ),
    ];
    for (value, kinds, api) in cases {
        let (enabled, force) = (format!("{value}.enabled"), format!("{value}.force"));
        let only_this_crd: Vec<&str> = BUILTIN_API_VERSIONS
            .iter()
            .copied()
            .chain(["monitoring.coreos.com/v1", api])
            .collect();
        let warning = format!("WARNING: {value}.enabled=true, but this cluster does not serve");
        for (on, crd, forced, rendered) in [
            (false, false, false, false),
            (false, true, false, false),
            (false, true, true, false),
            (true, false, false, false),
            (true, true, false, true),
            (true, false, true, true),
            (true, true, true, true),
        ] {
            let api_versions = if crd {
                only_this_crd.clone()
            } else {
                BUILTIN_API_VERSIONS.to_vec()
            };
            let r = render_chart_on(
                &api_versions,
                &[
                    (enabled.as_str(), json!(on)),
                    (force.as_str(), json!(forced)),
                ],
            );
            let what = format!("{value}: enabled={on} CRD served={crd} force={forced}");
            check_all_typed(&r.docs, &what);
            let got: BTreeSet<&str> = r
                .docs
                .iter()
                .map(kind_of)
                .filter(|k| kinds.contains(k))
                .collect();
            let want: BTreeSet<&str> = if rendered {
                kinds.iter().copied().collect()
            } else {
                BTreeSet::new()
            };
            assert_eq!(got, want, "{what}: rendered kinds");
            // Asked for but left out: NOTES.txt says so, and how to fix it.
            assert_eq!(
                r.notes.contains(&warning),
                on && !rendered,
                "{what}: NOTES.txt warning\n{}",
                r.notes
            );
            if on && !rendered {
                assert!(r.notes.contains(&format!("{value}.force=true")));
            }
        }
    }
    // Each kind is gated on its own CRD, not the other's.
    let r = render_chart_on(
        &[
            BUILTIN_API_VERSIONS,
            &["monitoring.coreos.com/v1/ServiceMonitor"],
        ]
        .concat(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("prometheusRule.enabled", json!(true)),
        ],
    );
    let kinds: BTreeSet<&str> = r.docs.iter().map(kind_of).collect();
    assert!(kinds.contains("ServiceMonitor") && !kinds.contains("PrometheusRule"));
}

/// Every metric name the agent and the controller export, with the
/// suffixes their samples carry (`_total`, `_bucket`...), from the library
/// itself: an alert naming a metric the binary does not export fails here
/// instead of never firing.
fn exported_metrics() -> Vec<String> {
    ipsetmgr::all_metric_names()
}

/// The metric names a PromQL expression mentions: identifiers (runs of
/// letters, digits, `_` and `:`) that start with `ipsetmgr_` or `process_`.
/// Label names and functions never start so; each such identifier must be
/// all lower-case letters and `_` (the names the binary uses).
fn metric_names(expr: &str) -> Vec<String> {
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
fn prometheus_duration(s: &str) -> bool {
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
fn alerts(docs: &[Value], what: &str) -> BTreeMap<String, Value> {
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
fn chart_prometheus_rule_alerts_on_the_binarys_metrics() {
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
fn metric_name_tokenizer_finds_names_and_refuses_odd_ones() {
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

/// `cargo test --test manifests -- --ignored --nocapture print_rendered_chart`
/// shows what the test renderer makes of the chart (there is no helm here).
#[test]
#[ignore = "prints the rendered chart; run by hand"]
fn print_rendered_chart() {
    needs_helm!("print_rendered_chart");
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("prometheusRule.enabled", json!(true)),
        ],
    );
    for d in &r.docs {
        println!("---\n{}", serde_saphyr::to_string(d).unwrap());
    }
    println!("--- NOTES.txt\n{}", r.notes);
}

#[test]
fn kustomize_base_is_complete_and_hardened() {
    let docs = kustomize_default();
    let what = "config/default";
    check_all_typed(&docs, what);
    let ns: Namespace = one_of(&docs, "Namespace", what);
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    crds_by_kind(&docs, what);
    let ds: DaemonSet = one_of(&docs, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
    check_agent_selector_is_0_1s(&ds, false, what);
    let d: Deployment = one_of(&docs, "Deployment", what);
    check_controller(&d, &Listeners::controller(), what);
    check_rbac(&docs, &Names::release(), true, what);
}

#[test]
fn rbac_has_one_source_and_the_chart_renders_it() {
    needs_helm!("rbac_has_one_source_and_the_chart_renders_it");
    // config/rbac/role.yaml is the source of truth.
    let what = "config/rbac/role.yaml";
    let source = yaml_docs(&read(what), what);
    check_all_typed(&source, what);
    let names = Names::release();
    let (a, c) = (names.agent(), names.controller());
    let source_ids: BTreeSet<String> = source.iter().map(identity).collect();
    assert_eq!(
        source_ids,
        BTreeSet::from([
            format!("ClusterRole /{a}"),
            format!("ClusterRole /{c}"),
            format!("Role {NAMESPACE}/{c}"),
            format!("Role {EVENTS_NAMESPACE}/{c}-events"),
        ]),
        "{what} holds the agent's ClusterRole and the controller's ClusterRole, \
         Lease Role in {NAMESPACE} and events Role in {EVENTS_NAMESPACE}"
    );
    let source = by_identity(&source);

    // The chart renders exactly these rules.
    let chart = render_chart(&[]).docs;
    check_rbac(&chart, &names, true, "chart");
    let chart_roles: BTreeMap<String, Value> = by_identity(&chart)
        .into_iter()
        .filter(|(_, d)| matches!(kind_of(d), "ClusterRole" | "Role"))
        .collect();
    assert_eq!(
        chart_roles.keys().collect::<Vec<_>>(),
        source.keys().collect::<Vec<_>>(),
        "chart roles == {what}"
    );
    for (id, role) in &source {
        if let Some(diff) = first_difference(&role["rules"], &chart_roles[id]["rules"], "") {
            panic!("{id}: {what} vs chart: rules{diff}");
        }
    }

    // kustomize uses the file itself: no other file under config/ defines
    // roles, and no transformer moved or changed them (config/default must
    // not set `namespace:`).
    let kust = kustomize_default();
    check_rbac(&kust, &names, true, "config/default");
    let kust_roles: BTreeMap<String, Value> = by_identity(&kust)
        .into_iter()
        .filter(|(_, d)| matches!(kind_of(d), "ClusterRole" | "Role"))
        .collect();
    assert_eq!(kust_roles, source, "config/default roles == {what}");
}

#[test]
fn chart_and_kustomize_deploy_the_same_agent() {
    needs_helm!("chart_and_kustomize_deploy_the_same_agent");
    let chart: DaemonSet = one_of(&render_chart(&[]).docs, "DaemonSet", "chart");
    let kust: DaemonSet = one_of(&kustomize_default(), "DaemonSet", "config/default");
    let (a, b) = (chart.spec, kust.spec);
    // The whole pod (the chart's labels and selector add Helm's own).
    assert_same(
        &a.template.spec,
        &b.template.spec,
        "agent pod, chart vs config/default",
    );
    assert_same(&a.update_strategy, &b.update_strategy, "updateStrategy");
}

#[test]
fn chart_and_kustomize_deploy_the_same_controller() {
    needs_helm!("chart_and_kustomize_deploy_the_same_controller");
    let chart: Deployment = one_of(&render_chart(&[]).docs, "Deployment", "chart");
    let kust: Deployment = one_of(&kustomize_default(), "Deployment", "config/default");
    let (a, b) = (chart.spec, kust.spec);
    assert_same(
        &a.template.spec,
        &b.template.spec,
        "controller pod, chart vs config/default",
    );
    assert_same(&a.strategy, &b.strategy, "strategy");
    assert_eq!(a.replicas, b.replicas, "replicas");
}

/// `dir` rendered by the real kustomize (scripts/render-kustomize.sh), or
/// None when none is installed (allowed outside CI only).
fn render_with_kustomize(dir: &str) -> Option<Vec<Value>> {
    let out = Command::new("bash")
        .arg(repo("scripts/render-kustomize.sh"))
        .arg(dir)
        .output()
        .expect("run bash");
    if out.status.code() == Some(127) {
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install kubectl or kustomize: {msg}"
        );
        eprintln!("SKIPPED rendering {dir} with kustomize: {msg}");
        return None;
    }
    assert!(
        out.status.success(),
        "render-kustomize.sh {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = yaml_docs(
        &String::from_utf8(out.stdout).unwrap(),
        &format!("kustomize {dir}"),
    );
    // The test loader sees exactly what kustomize produces.
    let (real, ours) = (
        by_identity(&rendered),
        by_identity(&load_kustomization(&repo(dir))),
    );
    assert_eq!(
        real.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "{dir}: objects"
    );
    for (key, obj) in &real {
        if let Some(diff) = first_difference(obj, &ours[key], "") {
            panic!("{dir}: {key}: kustomize vs the test's loader: {diff}");
        }
    }
    Some(rendered)
}

#[test]
fn kustomize_renders_with_the_real_tool() {
    let Some(rendered) = render_with_kustomize("config/default") else {
        return;
    };
    let what = "kustomize output";
    check_all_typed(&rendered, what);
    let ds: DaemonSet = one_of(&rendered, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
    let d: Deployment = one_of(&rendered, "Deployment", what);
    check_controller(&d, &Listeners::controller(), what);
    check_rbac(&rendered, &Names::release(), true, what);
    let Some(admission) = render_with_kustomize("config/admission") else {
        return;
    };
    check_all_typed(&admission, "kustomize config/admission");
    check_node_state_policy(&admission, &Names::release(), "kustomize config/admission");
}

// ------------------------------------------------------------ admission ----

/// The rule of the optional admission policy: the node-name claim of the
/// agent's token names the node state written. Spelt out here because it is
/// the whole point of the policy: change it deliberately, in both places.
const OWN_NODE_RULE: &str = "'authentication.kubernetes.io/node-name' in request.userInfo.extra \
     && request.userInfo.extra['authentication.kubernetes.io/node-name'] == [object.metadata.name]";

/// The optional ValidatingAdmissionPolicy and its binding: it holds the
/// agent ServiceAccount, and only it, to its own node's IPSetNodeState, for
/// every resource that ServiceAccount may write, in every served version.
fn check_node_state_policy(docs: &[Value], names: &Names, what: &str) {
    let vap: ValidatingAdmissionPolicy = one_of(docs, "ValidatingAdmissionPolicy", what);
    let binding: ValidatingAdmissionPolicyBinding =
        one_of(docs, "ValidatingAdmissionPolicyBinding", what);
    let name = vap.metadata.name.clone().unwrap();
    assert_eq!(name, format!("{}-own-node-state", names.agent()));
    let spec = vap.spec.unwrap();
    assert_eq!(
        spec.failure_policy.as_deref(),
        Some("Fail"),
        "{what}: fails closed"
    );
    assert!(spec.param_kind.is_none(), "{what}: no parameters");

    // Every resource the agent may write (per its grants), every operation
    // that writes it, every served version of the CRD.
    let writable: BTreeSet<String> = agent_grants()
        .into_iter()
        .filter(|(g, _, v)| {
            g == "ipsetmgr.io" && ["create", "update", "patch"].contains(&v.as_str())
        })
        .map(|(_, r, _)| r)
        .collect();
    assert!(writable.contains("ipsetnodestates") && writable.contains("ipsetnodestates/status"));
    let crds = crds_by_kind(&yaml_docs(&read("crds/ipsetmgr.yaml"), "crds"), "crds");
    let versions: Vec<String> = crds["IPSetNodeState"]
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.clone())
        .collect();
    let mc = spec.match_constraints.clone().expect("matchConstraints");
    assert_eq!(mc.match_policy.as_deref(), Some("Equivalent"));
    let rules = mc.resource_rules.unwrap_or_default();
    for res in &writable {
        for op in ["CREATE", "UPDATE"] {
            for version in &versions {
                let covered = rules.iter().any(|r| {
                    let has = |l: &Option<Vec<String>>, x: &str| {
                        l.as_deref().unwrap_or_default().iter().any(|y| y == x)
                    };
                    has(&r.api_groups, "ipsetmgr.io")
                        && has(&r.api_versions, version)
                        && has(&r.operations, op)
                        && has(&r.resources, res)
                });
                assert!(covered, "{what}: {op} of {res} ({version}) is not matched");
            }
        }
    }

    // Only the agents' requests, and the rule itself.
    let conditions = spec.match_conditions.unwrap_or_default();
    assert_eq!(conditions.len(), 1, "{what}: matchConditions");
    assert_eq!(
        conditions[0].expression,
        format!(
            "request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{}'",
            names.agent()
        ),
        "{what}: matches the agent ServiceAccount's requests only"
    );
    let validations = spec.validations.unwrap_or_default();
    assert_eq!(validations.len(), 1, "{what}: validations");
    assert_eq!(validations[0].expression, OWN_NODE_RULE, "{what}: the rule");
    assert!(validations[0].message.is_some(), "{what}: a message");

    let b = binding.spec;
    assert_eq!(b.policy_name, name, "{what}: binding");
    assert_eq!(
        b.validation_actions,
        vec!["Deny".to_string()],
        "{what}: the binding denies"
    );
    assert!(
        b.param_ref.is_none() && b.match_resources.is_none(),
        "{what}: the binding applies the policy as it is"
    );
}

#[test]
fn node_state_admission_policy_is_optional_and_holds_agents_to_their_node() {
    needs_helm!("node_state_admission_policy_is_optional_and_holds_agents_to_their_node");
    let what = "chart with nodeStateAdmissionPolicy";
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    assert_eq!(
        values["nodeStateAdmissionPolicy"]["enabled"], "auto",
        "on by default where the cluster is 1.30 or newer"
    );
    // auto follows the cluster's version; true and false say it outright.
    let vaps = |kube: &str, enabled: Value| {
        let r = support::helm::template(&support::helm::Render {
            release: RELEASE,
            namespace: NAMESPACE,
            api_versions: &[],
            kube_version: Some(kube),
            overrides: &[("nodeStateAdmissionPolicy.enabled", enabled)],
            include_crds: false,
        })
        .unwrap();
        r.docs
            .iter()
            .filter(|d| kind_of(d) == "ValidatingAdmissionPolicy")
            .count()
    };
    for (kube, enabled, want) in [
        ("v1.30.0", json!("auto"), 1),
        ("v1.34.9", json!("auto"), 1),
        ("v1.29.9", json!("auto"), 0),
        ("v1.25.2", json!("auto"), 0),
        ("v1.25.2", json!(true), 1),
        ("v1.34.9", json!(false), 0),
    ] {
        assert_eq!(
            vaps(kube, enabled.clone()),
            want,
            "{kube} enabled={enabled}"
        );
    }
    let r = render_chart(&[("nodeStateAdmissionPolicy.enabled", json!(true))]);
    check_all_typed(&r.docs, what);
    check_node_state_policy(&r.docs, &Names::release(), what);
    check_rbac(&r.docs, &Names::release(), true, what);

    // With another name, the policy follows the agent's ServiceAccount.
    let r = render_chart(&[
        ("nodeStateAdmissionPolicy.enabled", json!(true)),
        ("fullnameOverride", json!("ipsm")),
    ]);
    check_node_state_policy(&r.docs, &Names("ipsm".into()), "chart, fullnameOverride");

    // kustomize users get the same objects from config/admission.
    let kust = load_kustomization(&repo("config/admission"));
    let what = "config/admission";
    check_all_typed(&kust, what);
    check_node_state_policy(&kust, &Names::release(), what);
    let chart =
        by_identity(&render_chart(&[("nodeStateAdmissionPolicy.enabled", json!(true))]).docs);
    let kust = by_identity(&kust);
    for (id, obj) in &kust {
        let other = chart
            .get(id)
            .unwrap_or_else(|| panic!("{what}: {id} is not in the chart"));
        if let Some(diff) = first_difference(&obj["spec"], &other["spec"], "") {
            panic!("{id}: {what} vs chart: spec{diff}");
        }
    }
    assert_eq!(kust.len(), 2, "{what}: the policy and its binding");
}

#[test]
fn samples_are_valid_policies_one_per_type() {
    use ipsetmgr_ipset::{Naming, SetType};
    use ipsetmgr_policy::{compile, load_policies};

    let dir = repo("config/samples");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.starts_with('#'),
            "{}: samples start with an explaining comment",
            p.display()
        );
    }
    let loaded = load_policies(&dir).unwrap_or_else(|e| panic!("{e}"));
    let policies: Vec<_> = loaded.iter().map(|l| l.policy.clone()).collect();
    let types: BTreeSet<String> = policies
        .iter()
        .map(|p| format!("{:?}", p.spec.set_type))
        .collect();
    for t in SetType::ALL {
        assert!(types.contains(&format!("{t:?}")), "no sample of type {t:?}");
    }
    assert!(
        policies.iter().any(|p| p.spec.set_type == SetType::HashNet
            && p.spec.family == ipsetmgr_policy::FamilySpec::Dual
            && p.spec.members.iter().any(|m| m.ends_with(" nomatch"))
            && p.spec.members.iter().any(|m| m.contains(':'))),
        "a Dual hash:net sample with IPv6 and nomatch"
    );

    let naming = Naming::default();
    let edge = BTreeMap::from([("ipsetmgr.io/role".to_string(), "edge".to_string())]);
    let plain = BTreeMap::new();
    for labels in [None, Some(&edge), Some(&plain)] {
        let compiled = compile(&policies, &naming, labels);
        let errors: Vec<String> = compiled.errors.iter().map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "samples rejected (labels {labels:?}): {errors:#?}"
        );
        assert!(!compiled.sets.is_empty());
    }
    let all = compile(&policies, &naming, None);
    assert!(all.sets.iter().any(|s| s.name == "ipm4-blocklist"));
    assert!(all.sets.iter().any(|s| s.name == "ipm6-trusted-networks"));
}

#[test]
fn e2e_kind_cluster_has_an_edge_worker() {
    let cfg: Value = serde_saphyr::from_str(&read("e2e/kind-config.yaml")).unwrap();
    assert_eq!(cfg["kind"], "Cluster");
    let nodes = cfg["nodes"].as_array().unwrap();
    let roles: Vec<&str> = nodes.iter().map(|n| n["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["control-plane", "worker", "worker"]);
    let edge = nodes
        .iter()
        .filter(|n| n["labels"]["ipsetmgr.io/role"] == "edge")
        .count();
    assert_eq!(edge, 1, "exactly one worker labelled ipsetmgr.io/role=edge");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(repo("e2e/run.sh"))
        .status()
        .unwrap();
    assert!(syntax.success(), "e2e/run.sh has a bash syntax error");
    // It waits for both components, under the names the chart gives them.
    let run = read("e2e/run.sh");
    let names = Names::release();
    assert!(run.contains(&format!("RELEASE=\"{RELEASE}\"")));
    assert_eq!(names.controller(), format!("{RELEASE}-controller"));
    for wait in [
        "rollout status \"daemonset/$RELEASE\"",
        "rollout status \"deployment/$CONTROLLER\"",
        "wait --for=condition=Available \"deployment/$CONTROLLER\"",
    ] {
        assert!(run.contains(wait), "e2e/run.sh does not {wait}");
    }
    assert!(run.contains("CONTROLLER=\"$RELEASE-controller\""));
}

/// The samples of `membersFrom` (cluster sources and a url): apart from
/// `config/samples`, which `ipsetmgr apply` takes whole in file mode. Each
/// shows the iptables rule that matches its set, under the real kernel name.
#[test]
fn source_samples_show_the_rule_for_their_real_kernel_set() {
    use ipsetmgr_ipset::{Naming, SetType};
    use ipsetmgr_policy::compile;
    use ipsetmgr_policy::load::load_file;

    let dir = repo("config/samples-sources");
    let mut kinds = BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.starts_with('#'),
            "{}: starts with a comment",
            p.display()
        );
        let loaded = load_file(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.policies.len(), 1, "{}", p.display());
        let policy = &loaded.policies[0].policy;
        assert_eq!(policy.spec.members_from.len(), 1, "{}", p.display());
        kinds.insert(policy.spec.members_from[0].kind());
        let compiled = compile([policy], &Naming::default(), None);
        assert!(compiled.errors.is_empty(), "{:?}", compiled.errors);
        let names: Vec<&str> = compiled.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 1, "{}: one IPv4 set", p.display());
        let rule = text
            .lines()
            .find(|l| l.starts_with("#   iptables -I INPUT "))
            .unwrap_or_else(|| panic!("{}: no iptables rule", p.display()));
        assert!(
            rule.contains(&format!(" -m set --match-set {} src -j ", names[0])),
            "{}: {rule} does not match set {}",
            p.display(),
            names[0]
        );
        if policy.spec.members_from[0].kind() == "url" {
            let url = policy.spec.members_from[0].url.as_ref().unwrap();
            assert_eq!(
                url.url,
                "https://iplists.firehol.org/files/firehol_level1.netset"
            );
            assert_eq!(policy.spec.set_type, SetType::HashNet);
        }
    }
    assert_eq!(kinds, BTreeSet::from(["nodes", "pods", "url"]));
}
