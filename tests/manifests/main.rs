//! Checks of everything that ships ipsetmgr to a cluster: the CRD copies, the
//! Helm chart, the kustomize base (agent, controller, RBAC) and the optional
//! admission policy, the sample policies and the e2e runner. The Dockerfile
//! has its own parsed checks in tests/dockerfile.rs. One module per artefact:
//! [`crds`], [`chart`] (with [`render`] and [`alerts`]), [`kustomize`],
//! [`rbac`], [`admission`], [`workloads`], [`samples`]; the helpers they
//! share are here.
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

#[path = "../support/mod.rs"]
mod support;

/// Whether Helm is here for `test` (after a skip message when not; under
/// `CI=true` its absence fails the test).
macro_rules! needs_helm {
    ($test:literal) => {
        if crate::support::helm::available($test).is_none() {
            return;
        }
    };
}

mod admission;
mod alerts;
mod chart;
mod crds;
mod kustomize;
mod rbac;
mod render;
mod samples;
mod workloads;

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

// Each artefact's helpers, for the others' tests.
use admission::*;
use chart::*;
use crds::*;
use kustomize::*;
use rbac::*;
use render::*;
use workloads::*;
