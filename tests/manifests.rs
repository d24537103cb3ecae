//! Checks of everything that ships ipsetmgr to a cluster: the CRD copies, the
//! Helm chart, the kustomize base, the sample policies, the Dockerfile and the
//! e2e kind config.
//!
//! No cluster, helm or docker is needed:
//! - The chart is rendered by a small Go-template evaluator
//!   (`support/gotmpl.rs`) that supports only the subset the chart uses and
//!   fails on anything else. It is not Helm; it checks the chart's data and
//!   structure, not every Helm nuance (see the limitations in that file).
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

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use support::gotmpl::Templates;

const NAMESPACE: &str = "ipsetmgr-system";
/// Where the agent's Events go: they are about IPSetPolicy objects, which are
/// cluster-scoped, and the API server accepts Events about cluster-scoped
/// objects only in `default` (kube-runtime's Recorder creates them there).
const EVENTS_NAMESPACE: &str = "default";
const RELEASE: &str = "ipsetmgr";
const METRICS_PORT: i32 = 9477;

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
            // Not in k8s-openapi: checked field by field in its own test.
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {}
            (api, kind) => panic!("{what}: unexpected object {api} {kind} {}", name_of(d)),
        }
    }
}

// ---------------------------------------------------------------- chart ----

/// Values as `helm --set a.b=v` would give them.
fn set_path(values: &mut Value, path: &str, v: Value) {
    let mut cur = values;
    let keys: Vec<&str> = path.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        cur = cur
            .as_object_mut()
            .unwrap()
            .entry(k.to_string())
            .or_insert_with(|| json!({}));
    }
    cur[keys[keys.len() - 1]] = v;
}

struct Rendered {
    docs: Vec<Value>,
    notes: String,
}

/// Render the chart like `helm template ipsetmgr charts/ipsetmgr -n
/// ipsetmgr-system --set …` (without CRDs, which Helm installs from crds/
/// unrendered).
fn render_chart(overrides: &[(&str, Value)]) -> Rendered {
    let chart: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/Chart.yaml")).unwrap();
    let mut values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    for (path, v) in overrides {
        set_path(&mut values, path, v.clone());
    }
    let root = json!({
        "Values": values,
        "Release": {"Name": RELEASE, "Namespace": NAMESPACE, "Service": "Helm"},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
    });
    let dir = repo("charts/ipsetmgr/templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let helpers: Vec<String> = files
        .iter()
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with('_'))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let helper_refs: Vec<&str> = helpers.iter().map(String::as_str).collect();
    let mut t = Templates::new(&helper_refs).unwrap_or_else(|e| panic!("_helpers.tpl: {e}"));
    let mut docs = Vec::new();
    let mut notes = String::new();
    for p in &files {
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.starts_with('_') {
            continue;
        }
        let src = std::fs::read_to_string(p).unwrap();
        let out = t
            .render(&src, &root)
            .unwrap_or_else(|e| panic!("templates/{name}: {e}"));
        if name == "NOTES.txt" {
            notes = out;
        } else if name.ends_with(".yaml") {
            docs.extend(yaml_docs(
                &out,
                &format!("rendered templates/{name}:\n{out}"),
            ));
        } else {
            panic!("unexpected file templates/{name}");
        }
    }
    Rendered { docs, notes }
}

// ------------------------------------------------------------ kustomize ----

const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
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

/// Key for comparing object lists regardless of order.
fn by_identity(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter()
        .map(|d| {
            let key = format!(
                "{} {}/{}",
                kind_of(d),
                d["metadata"]["namespace"].as_str().unwrap_or(""),
                name_of(d)
            );
            (key, d.clone())
        })
        .collect()
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
                    assert!(res != "secrets", "{what}: the agent never needs secrets");
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

/// The API calls the agent makes (the interface it was written to).
fn expected_cluster_grants() -> BTreeSet<Grant> {
    expect(&[
        ("ipsetmgr.io", "ipsetpolicies", &["get", "list", "watch"]),
        ("ipsetmgr.io", "ipsetpolicies/status", &["get", "patch"]),
        ("", "nodes", &["get", "list", "watch"]),
        // Its own CRD only: a terminating CRD must not read as "every
        // policy deleted".
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions#ipsetpolicies.ipsetmgr.io",
            &["get", "list", "watch"],
        ),
    ])
}

/// In the agent's own namespace: the leader Lease only.
fn expected_namespace_grants() -> BTreeSet<Grant> {
    expect(&[(
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    )])
}

/// In `default` (EVENTS_NAMESPACE): Events only. The Recorder writes
/// events.k8s.io/v1 (create, patch for a repeat); core/v1 is kept in case a
/// Recorder falls back to it.
fn expected_events_grants() -> BTreeSet<Grant> {
    expect(&[
        ("events.k8s.io", "events", &["create", "patch"]),
        ("", "events", &["create", "patch"]),
    ])
}

/// The agent's roles in a rendering.
struct Rbac {
    cluster_role: ClusterRole,
    /// In the agent's namespace (NAMESPACE).
    role: Role,
    /// In EVENTS_NAMESPACE.
    events_role: Role,
}

/// The only object of `kind` in namespace `ns`.
fn one_in<T: DeserializeOwned + serde::Serialize>(
    docs: &[Value],
    kind: &str,
    ns: &str,
    what: &str,
) -> T {
    let in_ns: Vec<Value> = docs
        .iter()
        .filter(|d| kind_of(d) == kind && d["metadata"]["namespace"] == ns)
        .cloned()
        .collect();
    one_of(&in_ns, kind, &format!("{what} (namespace {ns})"))
}

/// Every namespaced object is in the agent's namespace, except the events
/// Role and its RoleBinding, which are in `default`, and nothing else is.
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

/// RBAC objects of a rendering: exactly one ClusterRole, one Role in the
/// agent's namespace (the Lease) and one Role in `default` (Events), each with
/// the expected grants and bound by exactly one binding to the DaemonSet's
/// service account; no other namespaced object outside the agent's namespace.
fn check_rbac(docs: &[Value], what: &str) -> Rbac {
    check_namespaces(docs, what);
    let cr: ClusterRole = one_of(docs, "ClusterRole", what);
    assert_eq!(
        grants(cr.rules.as_deref().unwrap_or_default(), what),
        expected_cluster_grants(),
        "{what}: ClusterRole rules"
    );
    let roles: Vec<Role> = all_of(docs, "Role", what);
    assert_eq!(
        roles.len(),
        2,
        "{what}: one Role in {NAMESPACE} and one in {EVENTS_NAMESPACE}"
    );
    let role: Role = one_in(docs, "Role", NAMESPACE, what);
    assert_eq!(
        grants(role.rules.as_deref().unwrap_or_default(), what),
        expected_namespace_grants(),
        "{what}: Role rules in {NAMESPACE} (the Lease only)"
    );
    let events_role: Role = one_in(docs, "Role", EVENTS_NAMESPACE, what);
    assert_eq!(
        grants(events_role.rules.as_deref().unwrap_or_default(), what),
        expected_events_grants(),
        "{what}: Role rules in {EVENTS_NAMESPACE} (Events only)"
    );
    let role_name = role.metadata.name.clone().unwrap();
    assert_eq!(
        events_role.metadata.name.as_deref(),
        Some(format!("{role_name}-events").as_str()),
        "{what}: events Role name"
    );

    let ds: DaemonSet = one_of(docs, "DaemonSet", what);
    let sa_name = ds.spec.template.spec.unwrap().service_account_name.unwrap();
    let sa: ServiceAccount = one_of(docs, "ServiceAccount", what);
    assert_eq!(
        sa.metadata.name.as_deref(),
        Some(sa_name.as_str()),
        "{what}: service account"
    );
    assert_eq!(sa.metadata.namespace.as_deref(), Some(NAMESPACE));

    let crb: ClusterRoleBinding = one_of(docs, "ClusterRoleBinding", what);
    assert_eq!(
        crb.role_ref.api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );
    assert_eq!(crb.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(&crb.role_ref.name),
        cr.metadata.name.as_ref(),
        "{what}: ClusterRoleBinding roleRef"
    );
    let bindings: Vec<RoleBinding> = all_of(docs, "RoleBinding", what);
    assert_eq!(
        bindings.len(),
        2,
        "{what}: one RoleBinding per Role ({NAMESPACE} and {EVENTS_NAMESPACE})"
    );
    let mut subjects = vec![crb.subjects.unwrap_or_default()];
    for r in [&role, &events_role] {
        let ns = r.metadata.namespace.as_deref().unwrap();
        let rb: RoleBinding = one_in(docs, "RoleBinding", ns, what);
        assert_eq!(
            rb.role_ref.api_group.as_deref(),
            Some("rbac.authorization.k8s.io")
        );
        assert_eq!(rb.role_ref.kind, "Role");
        assert_eq!(
            Some(&rb.role_ref.name),
            r.metadata.name.as_ref(),
            "{what}: RoleBinding roleRef in {ns} (a RoleBinding can only bind a Role \
             of its own namespace)"
        );
        subjects.push(rb.subjects.unwrap_or_default());
    }
    for subjects in subjects {
        assert_eq!(subjects.len(), 1, "{what}: one subject per binding");
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, sa_name, "{what}: binding subject");
        assert_eq!(
            subjects[0].namespace.as_deref(),
            Some(NAMESPACE),
            "{what}: subject namespace (the ServiceAccount's, also for the \
             binding in {EVENTS_NAMESPACE})"
        );
    }
    Rbac {
        cluster_role: cr,
        role,
        events_role,
    }
}

// ------------------------------------------------------------ DaemonSet ----

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

fn agent_container(ds: &DaemonSet) -> Container {
    let pod = ds.spec.clone().template.spec.unwrap();
    assert_eq!(pod.containers.len(), 1, "one container");
    assert!(pod.init_containers.is_none(), "no init containers");
    pod.containers[0].clone()
}

/// The security and wiring contract of the agent DaemonSet.
fn check_daemonset(ds: &DaemonSet, port: i32, what: &str) {
    let spec = ds.spec.clone();
    let pod = spec.template.spec.clone().unwrap();
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
    let strategy = spec.update_strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.unwrap().max_unavailable,
        Some(IntOrString::Int(1)),
        "{what}: maxUnavailable"
    );
    // The selector matches the pod template.
    let labels = spec.template.metadata.unwrap().labels.unwrap_or_default();
    for (k, v) in spec.selector.match_labels.unwrap_or_default() {
        assert_eq!(labels.get(&k), Some(&v), "{what}: selector label {k}");
    }
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("ipsetmgr")
    );

    let c = agent_container(ds);
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
    assert_eq!(
        field_ref(&c, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace"),
        "{what}: POD_NAMESPACE"
    );
    let known = [
        "NODE_NAME",
        "POD_NAMESPACE",
        "IPSETMGR_SET_PREFIX",
        "IPSETMGR_BACKEND",
        "IPSETMGR_RESYNC_INTERVAL",
        "IPSETMGR_LISTEN",
        "IPSETMGR_LOG_FORMAT",
    ];
    for name in env_map(&c).keys() {
        assert!(
            known.contains(&name.as_str()),
            "{what}: env {name} is not an agent setting"
        );
    }
    assert_eq!(
        env_value(&c, "IPSETMGR_LISTEN"),
        Some(format!("0.0.0.0:{port}")),
        "{what}: the agent listens on the metrics port"
    );
    let backend = env_value(&c, "IPSETMGR_BACKEND").unwrap();
    assert!(
        ["netlink", "cli"].contains(&backend.as_str()),
        "{what}: backend {backend}"
    );
    let log = env_value(&c, "IPSETMGR_LOG_FORMAT").unwrap();
    assert!(
        ["text", "json"].contains(&log.as_str()),
        "{what}: log format {log}"
    );
    let resync = env_value(&c, "IPSETMGR_RESYNC_INTERVAL").unwrap();
    assert!(
        resync.parse::<u64>().is_ok_and(|s| s > 0),
        "{what}: resync interval {resync}"
    );
    let prefix = env_value(&c, "IPSETMGR_SET_PREFIX").unwrap();
    assert!(
        ipsetmgr::ipset::Naming::new(&prefix).is_ok(),
        "{what}: set prefix {prefix:?} is not valid"
    );

    let ports = c.ports.clone().unwrap_or_default();
    let metrics = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap_or_else(|| panic!("{what}: no port named metrics"));
    assert_eq!(metrics.container_port, port, "{what}: metrics port");
    let probe_target = |probe: Option<k8s_openapi::api::core::v1::Probe>, kind: &str| {
        let get = probe
            .unwrap_or_else(|| panic!("{what}: no {kind}"))
            .http_get
            .unwrap_or_else(|| panic!("{what}: {kind} is not httpGet"));
        let on_metrics = match &get.port {
            IntOrString::String(s) => s == "metrics",
            IntOrString::Int(p) => *p == port,
        };
        assert!(
            on_metrics,
            "{what}: {kind} must use the metrics port, got {:?}",
            get.port
        );
        get.path.unwrap_or_default()
    };
    assert_eq!(
        probe_target(c.liveness_probe.clone(), "livenessProbe"),
        "/healthz"
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
            .is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory"))
    );
    assert!(
        res.limits.is_some_and(|l| l.contains_key("memory")),
        "{what}: memory limit"
    );
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
        BTreeSet::from(ipsetmgr::api::crd_names()),
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
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    assert_eq!(values["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(values["priorityClassName"], "system-node-critical");
    assert_eq!(values["metrics"]["port"], METRICS_PORT);
    assert_eq!(values["serviceMonitor"]["enabled"], false);
    assert_eq!(values["backend"], "netlink");
}

#[test]
fn chart_renders_with_default_values() {
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
            "DaemonSet"
        ]),
        "objects rendered with default values (no ServiceMonitor by default)"
    );
    // Everything in the release namespace, but the events Role/RoleBinding.
    check_rbac(&r.docs, "chart");
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart");
    check_daemonset(&ds, METRICS_PORT, "chart");
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
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(r.notes.contains("kubectl get ipsp"), "NOTES.txt renders");
    assert!(r.notes.contains("ipm4-blocklist"));
}

#[test]
fn chart_values_reach_the_agent() {
    let r = render_chart(&[
        ("image.repository", json!("registry.example/ipsetmgr")),
        ("image.tag", json!("dev")),
        ("setPrefix", json!("fw")),
        ("backend", json!("cli")),
        ("resyncInterval", json!(15)),
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
    check_all_typed(&r.docs, "chart with overrides");
    check_rbac(&r.docs, "chart with overrides");
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart with overrides");
    assert_eq!(ds.metadata.name.as_deref(), Some("ipsm"));
    check_daemonset(&ds, 9555, "chart with overrides");
    let c = agent_container(&ds);
    assert_eq!(c.image.as_deref(), Some("registry.example/ipsetmgr:dev"));
    assert_eq!(env_value(&c, "IPSETMGR_SET_PREFIX").as_deref(), Some("fw"));
    assert_eq!(env_value(&c, "IPSETMGR_BACKEND").as_deref(), Some("cli"));
    assert_eq!(
        env_value(&c, "IPSETMGR_RESYNC_INTERVAL").as_deref(),
        Some("15")
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
}

#[test]
fn chart_service_monitor_is_optional_and_selects_the_agents() {
    let r = render_chart(&[
        ("serviceMonitor.enabled", json!(true)),
        ("serviceMonitor.labels", json!({"release": "prometheus"})),
    ]);
    check_all_typed(&r.docs, "chart with serviceMonitor");
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart");
    let pod_labels = ds.spec.template.metadata.unwrap().labels.unwrap();
    let svc: Service = one_of(&r.docs, "Service", "chart");
    let svc_spec = svc.spec.clone().unwrap();
    assert_eq!(svc_spec.cluster_ip.as_deref(), Some("None"), "headless");
    for (k, v) in svc_spec.selector.unwrap() {
        assert_eq!(
            pod_labels.get(&k),
            Some(&v),
            "Service selects the agent pods ({k})"
        );
    }
    let port = &svc_spec.ports.unwrap()[0];
    assert_eq!(port.name.as_deref(), Some("metrics"));
    assert_eq!(port.port, METRICS_PORT);

    let sm = r
        .docs
        .iter()
        .find(|d| kind_of(d) == "ServiceMonitor")
        .expect("ServiceMonitor rendered");
    assert_eq!(sm["metadata"]["namespace"], NAMESPACE);
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    let svc_labels = svc.metadata.labels.unwrap();
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            svc_labels.get(k).map(String::as_str),
            v.as_str(),
            "ServiceMonitor selects the Service ({k})"
        );
    }
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"],
        json!([NAMESPACE])
    );
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
}

/// `cargo test --test manifests -- --ignored --nocapture print_rendered_chart`
/// shows what the test renderer makes of the chart (there is no helm here).
#[test]
#[ignore = "prints the rendered chart; run by hand"]
fn print_rendered_chart() {
    let r = render_chart(&[("serviceMonitor.enabled", json!(true))]);
    for d in &r.docs {
        println!("---\n{}", serde_saphyr::to_string(d).unwrap());
    }
    println!("--- NOTES.txt\n{}", r.notes);
}

#[test]
fn kustomize_base_is_complete_and_hardened() {
    let docs = kustomize_default();
    check_all_typed(&docs, "config/default");
    let ns: Namespace = one_of(&docs, "Namespace", "config/default");
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    crds_by_kind(&docs, "config/default");
    let ds: DaemonSet = one_of(&docs, "DaemonSet", "config/default");
    check_daemonset(&ds, METRICS_PORT, "config/default");
    check_rbac(&docs, "config/default");
}

#[test]
fn rbac_has_one_source_and_the_chart_renders_it() {
    // config/rbac/role.yaml is the source of truth.
    let source = yaml_docs(&read("config/rbac/role.yaml"), "config/rbac/role.yaml");
    assert_eq!(
        source.len(),
        3,
        "config/rbac/role.yaml holds the ClusterRole, the Role in {NAMESPACE} \
         and the events Role in {EVENTS_NAMESPACE}"
    );
    check_all_typed(&source, "config/rbac/role.yaml");
    let cr: ClusterRole = one_of(&source, "ClusterRole", "config/rbac/role.yaml");
    let role: Role = one_in(&source, "Role", NAMESPACE, "config/rbac/role.yaml");
    let events_role: Role = one_in(&source, "Role", EVENTS_NAMESPACE, "config/rbac/role.yaml");

    let chart = check_rbac(&render_chart(&[]).docs, "chart");
    assert_eq!(
        chart.cluster_role.rules, cr.rules,
        "chart ClusterRole rules == config/rbac/role.yaml"
    );
    assert_eq!(
        chart.role.rules, role.rules,
        "chart Role rules in {NAMESPACE} == config/rbac/role.yaml"
    );
    assert_eq!(
        chart.events_role.rules, events_role.rules,
        "chart Role rules in {EVENTS_NAMESPACE} == config/rbac/role.yaml"
    );

    // No other file under config/ defines roles, and no kustomize transformer
    // moved them (config/default must not set `namespace:`).
    let kust = check_rbac(&kustomize_default(), "config/default");
    assert_eq!(kust.cluster_role, cr, "config/default ClusterRole");
    assert_eq!(kust.role, role, "config/default Role in {NAMESPACE}");
    assert_eq!(
        kust.events_role, events_role,
        "config/default Role in {EVENTS_NAMESPACE}"
    );
}

#[test]
fn chart_and_kustomize_deploy_the_same_agent() {
    let chart: DaemonSet = one_of(&render_chart(&[]).docs, "DaemonSet", "chart");
    let kust: DaemonSet = one_of(&kustomize_default(), "DaemonSet", "config/default");
    let (a, b) = (agent_container(&chart), agent_container(&kust));
    assert_eq!(env_map(&a), env_map(&b), "env");
    assert_eq!(
        a.security_context, b.security_context,
        "container securityContext"
    );
    assert_eq!(a.ports, b.ports, "ports");
    assert_eq!(a.liveness_probe, b.liveness_probe, "livenessProbe");
    assert_eq!(a.readiness_probe, b.readiness_probe, "readinessProbe");
    assert_eq!(a.resources, b.resources, "resources");
    let (pa, pb) = (
        chart.spec.clone().template.spec.unwrap(),
        kust.spec.clone().template.spec.unwrap(),
    );
    assert_eq!(pa.host_network, pb.host_network);
    assert_eq!(pa.dns_policy, pb.dns_policy);
    assert_eq!(pa.tolerations, pb.tolerations);
    assert_eq!(pa.node_selector, pb.node_selector);
    assert_eq!(pa.priority_class_name, pb.priority_class_name);
    assert_eq!(pa.security_context, pb.security_context);
    assert_eq!(chart.spec.update_strategy, kust.spec.update_strategy);
}

#[test]
fn kustomize_renders_with_the_real_tool() {
    let out = Command::new("bash")
        .arg(repo("scripts/render-kustomize.sh"))
        .arg("config/default")
        .output()
        .expect("run bash");
    if out.status.code() == Some(127) {
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install kubectl or kustomize: {msg}"
        );
        eprintln!("SKIPPED kustomize_renders_with_the_real_tool: {msg}");
        return;
    }
    assert!(
        out.status.success(),
        "render-kustomize.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = yaml_docs(&String::from_utf8(out.stdout).unwrap(), "kustomize output");
    check_all_typed(&rendered, "kustomize output");
    let ds: DaemonSet = one_of(&rendered, "DaemonSet", "kustomize output");
    check_daemonset(&ds, METRICS_PORT, "kustomize output");
    check_rbac(&rendered, "kustomize output");
    // The test loader sees exactly what kustomize produces.
    let (real, ours) = (by_identity(&rendered), by_identity(&kustomize_default()));
    assert_eq!(
        real.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "objects"
    );
    for (key, obj) in &real {
        if let Some(diff) = first_difference(obj, &ours[key], "") {
            panic!("{key}: kustomize vs the test's loader: {diff}");
        }
    }
}

#[test]
fn samples_are_valid_policies_one_per_type() {
    use ipsetmgr::ipset::{Naming, SetType};
    use ipsetmgr::policy::{compile, load_policies};

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
    for t in [
        SetType::HashIp,
        SetType::HashNet,
        SetType::HashIpPort,
        SetType::HashMac,
        SetType::ListSet,
    ] {
        assert!(types.contains(&format!("{t:?}")), "no sample of type {t:?}");
    }
    assert!(
        policies.iter().any(|p| p.spec.set_type == SetType::HashNet
            && p.spec.family == ipsetmgr::policy::FamilySpec::Dual
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
fn dockerfile_builds_the_agent_image() {
    let d = read("Dockerfile");
    assert!(d.contains("FROM rust:1-bookworm AS chef"));
    assert!(d.contains("FROM debian:bookworm-slim"));
    assert!(d.contains("cargo build --release --locked --bin ipsetmgr"));
    // The dependency layer: cargo-chef's recipe, cooked before the sources come in.
    let cook = d.find("cargo chef cook --release --locked").expect("cook");
    let sources = d.rfind("COPY . .").expect("sources");
    assert!(d.contains("cargo chef prepare --recipe-path recipe.json"));
    assert!(
        cook < sources,
        "dependencies are built before the sources are copied"
    );
    assert!(d.contains("ipset ca-certificates"));
    assert!(d.contains("USER root"));
    assert!(
        d.trim_end()
            .ends_with(r#"ENTRYPOINT ["/usr/local/bin/ipsetmgr", "agent"]"#)
    );
    let ignore: Vec<String> = read(".dockerignore").lines().map(str::to_string).collect();
    assert!(ignore.contains(&"target".to_string()) && ignore.contains(&".git".to_string()));
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
}
