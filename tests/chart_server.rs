//! The chart and the kustomize base against the real thing: `helm lint
//! --strict`, the objects `helm template` (and `kubectl kustomize`) render
//! applied server-side to a real API server (not a dry run), and then what
//! the installation grants checked by the server itself:
//!
//! - each ServiceAccount's access, read back with SelfSubjectRulesReview and
//!   SelfSubjectAccessReview under a token of that ServiceAccount, is
//!   exactly what docs/install.md's permission tables claim;
//! - with the node-state admission policy, a token bound to a Pod on node A
//!   may write node A's IPSetNodeState and is forbidden to write node B's,
//!   and a token bound to no Pod (no node claim) may write none.
//!
//! One API server per version for this binary (`ipsetmgr_envtest::shared`);
//! the chart and kustomize installs use different release names and
//! namespaces so they do not meet. Without Helm or the API servers the tests
//! skip with a message; under `CI=true` they fail.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use ipsetmgr_envtest::{ControlPlane, Server};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const MANAGER: &str = "ipsetmgr-chart-test";

// --------------------------------------------------------------- applying ----

/// Server-side apply of every object, CRDs first (each awaited
/// Established), in the order given otherwise.
async fn apply_all(client: &Client, docs: &[Value], what: &str) {
    let (crds, rest): (Vec<&Value>, Vec<&Value>) = docs
        .iter()
        .partition(|d| d["kind"] == "CustomResourceDefinition");
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for d in crds {
        let crd: CustomResourceDefinition = serde_json::from_value(d.clone()).unwrap();
        let name = crd.name_any();
        crd_api
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: the server refused CRD {name}: {e}"));
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(crd_api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: CRD {name} not Established"))
        .unwrap();
    }
    for d in rest {
        apply_one(client, d, what).await;
    }
}

async fn apply_one(client: &Client, doc: &Value, what: &str) {
    let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", doc["apiVersion"].as_str().unwrap()),
    };
    let kind = doc["kind"].as_str().unwrap();
    let name = doc["metadata"]["name"].as_str().unwrap();
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("{what}: the server does not serve {kind}: {e}"));
    let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(doc),
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: the server refused {kind} {name}: {e}"));
}

async fn namespace(client: &Client, name: &str) {
    apply_one(
        client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        "namespace",
    )
    .await;
}

/// Minimal stand-ins for the Prometheus Operator's CRDs (none is installed
/// here), so the chart's ServiceMonitor and PrometheusRule can be applied.
fn monitoring_crds() -> Vec<Value> {
    [
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    ]
    .iter()
    .map(|(plural, kind)| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {
                "group": "monitoring.coreos.com",
                "names": {"plural": plural, "kind": kind},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        })
    })
    .collect()
}

// ------------------------------------------------------------ the docs ----

/// One access claim of docs/install.md: group, resource (with
/// `/subresource`), verb, the resourceName if limited to one, and where.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    group: String,
    resource: String,
    verb: String,
    name: Option<String>,
    /// `None`: cluster-wide (every namespace sees it too).
    namespace: Option<String>,
}

/// Backticked words of a cell.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The permission table after the paragraph starting `heading` in
/// docs/install.md, for an install in `release_namespace` with the values
/// in `enabled` on (rows that say "with `memberSources.pods`" hold only
/// then).
fn claims(heading: &str, release_namespace: &str, enabled: &[&str]) -> BTreeSet<Claim> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/install.md")).unwrap();
    let after = &doc[doc
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"))..];
    let mut out = BTreeSet::new();
    let rows = after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2);
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        // `` `a`, `b` (`group`) ``, `(core)`, `(`g` and core)`; then
        // optionally `, only `x` and `y`` (resourceNames).
        let (head, names_part) = match cells[0].split_once(", only") {
            Some((g, n)) => (g, Some(n)),
            None => (cells[0], None),
        };
        let (resources_part, groups_part) = head.split_once('(').expect("a (group)");
        let resources = ticked(resources_part);
        let mut groups: Vec<String> = ticked(groups_part);
        if groups_part.contains("core") {
            groups.push(String::new());
        }
        let names: Vec<Option<String>> = match names_part {
            Some(n) => ticked(n).into_iter().map(Some).collect(),
            None => vec![None],
        };
        let condition: Vec<String> = match cells.get(2) {
            Some(w) if cells.len() == 4 && w.contains(" with ") => ticked(w),
            _ => Vec::new(),
        };
        if !condition.is_empty() && !condition.iter().any(|c| enabled.contains(&c.as_str())) {
            continue;
        }
        let namespace = match cells.get(2) {
            Some(w) if cells.len() == 4 && !w.starts_with("cluster") => {
                Some(if w.contains("its namespace") {
                    release_namespace.to_string()
                } else {
                    ticked(w)[0].clone()
                })
            }
            _ => None,
        };
        for g in &groups {
            for resource in &resources {
                for v in cells[1].split(',').map(str::trim) {
                    for n in &names {
                        out.insert(Claim {
                            group: g.clone(),
                            resource: resource.clone(),
                            verb: v.to_string(),
                            name: n.clone(),
                            namespace: namespace.clone(),
                        });
                    }
                }
            }
        }
    }
    assert!(!out.is_empty(), "no rows under {heading:?}");
    out
}

// --------------------------------------------------------------- tokens ----

async fn token(client: &Client, ns: &str, sa: &str, pod: Option<&str>) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(p.into()),
                uid: None,
            }),
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    sas.create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{sa}: {e}"))
        .status
        .expect("a token")
        .token
        .expect("a token")
}

/// What the server says `client`'s user may do in `ns`, as claims, without
/// what every authenticated user may do (system:basic-user's self reviews).
async fn effective(
    client: &Client,
    ns: &str,
) -> BTreeSet<(String, String, String, Option<String>)> {
    let api: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(ns.into()),
        },
        ..Default::default()
    };
    let status = api
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectRulesReview in {ns}: {e}"))
        .status
        .expect("a status");
    assert!(
        !status.incomplete,
        "rules review in {ns} incomplete: {status:?}"
    );
    let mut out = BTreeSet::new();
    for r in status.resource_rules {
        let names = match r.resource_names.as_deref() {
            Some(n) if !n.is_empty() => n.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for g in r.api_groups.unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    for n in &names {
                        out.insert((g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out.retain(|(g, res, _, _)| {
        !matches!(
            (g.as_str(), res.as_str()),
            (
                "authorization.k8s.io",
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
            ) | ("authentication.k8s.io", "selfsubjectreviews")
        )
    });
    out
}

async fn allowed(client: &Client, c: &Claim) -> bool {
    let (resource, subresource) = match c.resource.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (c.resource.clone(), None),
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(c.group.clone()),
                resource: Some(resource),
                subresource,
                verb: Some(c.verb.clone()),
                name: c.name.clone(),
                namespace: c.namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectAccessReview {c:?}: {e}"))
        .status
        .is_some_and(|s| s.allowed)
}

/// The ServiceAccount `sa` in `ns` may do exactly what `claims` say, in each
/// of `namespaces` (cluster-wide claims hold in all of them).
async fn check_access(
    admin: &Client,
    plane: &ControlPlane,
    ns: &str,
    sa: &str,
    claims: &BTreeSet<Claim>,
    namespaces: &[&str],
) {
    let client = plane
        .client_with_token(&token(admin, ns, sa, None).await)
        .await
        .unwrap();
    for c in claims {
        assert!(
            allowed(&client, c).await,
            "{ns}/{sa}: docs claim {c:?}, the server denies it"
        );
    }
    for n in namespaces {
        let want: BTreeSet<_> = claims
            .iter()
            .filter(|c| c.namespace.as_deref().is_none_or(|x| x == *n))
            .map(|c| {
                (
                    c.group.clone(),
                    c.resource.clone(),
                    c.verb.clone(),
                    c.name.clone(),
                )
            })
            .collect();
        let got = effective(&client, n).await;
        assert_eq!(
            got, want,
            "{ns}/{sa} in namespace {n}: what the server grants (left) vs docs/install.md (right)"
        );
    }
}

// ------------------------------------------------------------ admission ----

async fn node(client: &Client, name: &str) {
    apply_one(
        client,
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        "node",
    )
    .await;
}

fn node_state(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": name}, "spec": {},
    }))
    .unwrap()
}

fn states(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("ipsetmgr.io", "v1alpha1", "IPSetNodeState");
    Api::all_with(client.clone(), &kube::core::ApiResource::from_gvk(&gvk))
}

/// The agent's writes as the admission policy allows them: its own node's
/// state with a token bound to a Pod on that node; never another node's, and
/// none without the node claim.
async fn check_own_node_only(admin: &Client, plane: &ControlPlane, ns: &str, sa: &str) {
    let (mine, other) = (format!("{ns}-node-a"), format!("{ns}-node-b"));
    node(admin, &mine).await;
    node(admin, &other).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent-on-a"},
        "spec": {"nodeName": mine, "serviceAccountName": sa,
                 "containers": [{"name": "agent", "image": "ipsetmgr:test"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating a Pod of {sa} on {mine}: {e}"));

    let bound = plane
        .client_with_token(&token(admin, ns, sa, Some("agent-on-a")).await)
        .await
        .unwrap();
    let api = states(&bound);
    api.create(&PostParams::default(), &node_state(&mine))
        .await
        .unwrap_or_else(|e| panic!("{sa} bound to a Pod on {mine} may create its state: {e}"));
    let status = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": mine},
        "status": {"heartbeatTime": "2026-12-01T00:00:00Z", "heartbeatIntervalSeconds": 30,
                   "agentVersion": "test", "policies": []},
    });
    api.patch_status(
        &mine,
        &PatchParams::apply("ipsetmgr-agent"),
        &Patch::Apply(&status),
    )
    .await
    .unwrap_or_else(|e| panic!("{sa} bound to a Pod on {mine} may apply its status: {e}"));
    // A new admission policy takes effect once the API server has loaded
    // it, a moment after it is created: until then the write goes through,
    // and is undone here.
    let start = std::time::Instant::now();
    let refused = loop {
        match api
            .create(&PostParams::default(), &node_state(&other))
            .await
        {
            Err(e) => break e,
            Ok(_) if start.elapsed() < Duration::from_secs(30) => {
                states(admin)
                    .delete(&other, &Default::default())
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(_) => {
                panic!("an agent on node A still created node B's state 30 s after the policy")
            }
        }
    };
    assert!(
        refused
            .to_string()
            .contains("only the IPSetNodeState named after its own node"),
        "refused, but not by the admission policy: {refused}"
    );
    // An admin writes node B's state; the agent must not overwrite it.
    states(admin)
        .create(&PostParams::default(), &node_state(&other))
        .await
        .unwrap();
    let status_b = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": other},
        "status": {"heartbeatIntervalSeconds": 30, "agentVersion": "forged", "policies": []},
    });
    api.patch_status(
        &other,
        &PatchParams::apply("ipsetmgr-agent"),
        &Patch::Apply(&status_b),
    )
    .await
    .expect_err("an agent on node A must not write node B's status");

    let unbound = plane
        .client_with_token(&token(admin, ns, sa, None).await)
        .await
        .unwrap();
    states(&unbound)
        .patch_status(
            &mine,
            &PatchParams::apply("ipsetmgr-agent"),
            &Patch::Apply(&status),
        )
        .await
        .expect_err("a token without the node claim must not write any node state");
}

// ---------------------------------------------------------------- tests ----

#[test]
fn chart_lints_strictly() {
    if support::helm::available("chart_lints_strictly").is_none() {
        return;
    }
    for overrides in [
        vec![],
        vec![
            ("serviceMonitor.enabled", json!(true)),
            ("serviceMonitor.force", json!(true)),
            ("prometheusRule.enabled", json!(true)),
            ("prometheusRule.force", json!(true)),
            ("nodeStateAdmissionPolicy.enabled", json!(true)),
        ],
    ] {
        if let Err(out) = support::helm::lint(&overrides) {
            panic!("helm lint --strict {overrides:?}:\n{out}");
        }
    }
}

/// Everything optional on: ServiceMonitors and the PrometheusRule forced,
/// the node-state admission policy.
fn everything_on() -> Vec<(&'static str, Value)> {
    vec![
        ("serviceMonitor.enabled", json!(true)),
        ("serviceMonitor.force", json!(true)),
        ("prometheusRule.enabled", json!(true)),
        ("prometheusRule.force", json!(true)),
        ("nodeStateAdmissionPolicy.enabled", json!(true)),
        ("memberSources.pods", json!(true)),
        ("memberSources.services", json!(true)),
        ("controller.networkPolicy.enabled", json!(true)),
        (
            "controller.networkPolicy.apiServerCIDRs",
            json!(["127.0.0.1/32"]),
        ),
    ]
}

/// What everything_on turns on of docs/install.md's conditional rows.
const ALL_SOURCES: &[&str] = &["memberSources.pods", "memberSources.services"];

fn render(release: &str, ns: &str, kube_version: &str, overrides: &[(&str, Value)]) -> Vec<Value> {
    support::helm::template(&support::helm::Render {
        release,
        namespace: ns,
        api_versions: &[],
        kube_version: Some(kube_version),
        overrides,
        include_crds: true,
    })
    .unwrap_or_else(|e| panic!("helm template {overrides:?}: {e}"))
    .docs
}

#[tokio::test]
async fn chart_installs_on_the_newest_server_and_grants_what_the_docs_say() {
    let test = "chart_installs_on_the_newest_server_and_grants_what_the_docs_say";
    if support::helm::available(test).is_none() {
        return;
    }
    let Some(plane) = ipsetmgr_envtest::shared(test, Server::Newest).await else {
        return;
    };
    let admin = plane.client().await.unwrap();
    let (release, ns) = ("chart", "chart-system");
    namespace(&admin, ns).await;
    apply_all(&admin, &monitoring_crds(), "stand-in CRDs").await;
    // Defaults first, then everything on over it (an upgrade).
    let kube_version = plane.version().split('+').next().unwrap().to_string();
    apply_all(
        &admin,
        &render(release, ns, &kube_version, &[]),
        "chart, default values",
    )
    .await;
    apply_all(
        &admin,
        &render(release, ns, &kube_version, &everything_on()),
        "chart, everything on",
    )
    .await;

    let others = [ns, "default", "kube-public"];
    check_access(
        &admin,
        plane,
        ns,
        "chart-agent",
        &claims("**Agent**", ns, ALL_SOURCES),
        &others,
    )
    .await;
    check_access(
        &admin,
        plane,
        ns,
        "chart-controller",
        &claims("**Controller**", ns, ALL_SOURCES),
        &others,
    )
    .await;
    check_own_node_only(&admin, plane, ns, "chart-agent").await;
}

#[tokio::test]
async fn chart_installs_on_the_oldest_server() {
    let test = "chart_installs_on_the_oldest_server";
    if support::helm::available(test).is_none() {
        return;
    }
    let Some(plane) = ipsetmgr_envtest::shared(test, Server::Oldest).await else {
        return;
    };
    let admin = plane.client().await.unwrap();
    let (release, ns) = ("chart", "chart-system");
    namespace(&admin, ns).await;
    let kube_version = plane.version().split('+').next().unwrap().to_string();
    apply_all(
        &admin,
        &render(release, ns, &kube_version, &[]),
        "chart on the oldest server",
    )
    .await;
    let others = [ns, "default"];
    check_access(
        &admin,
        plane,
        ns,
        "chart-agent",
        &claims("**Agent**", ns, &[]),
        &others,
    )
    .await;
    check_access(
        &admin,
        plane,
        ns,
        "chart-controller",
        &claims("**Controller**", ns, &[]),
        &others,
    )
    .await;
}

/// The node-state admission policy's objects in a render.
fn admission_objects(docs: &[Value]) -> usize {
    docs.iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding")
            )
        })
        .count()
}

/// An offline render (`helm template`, as GitOps tools make it) applied to
/// a 1.25 cluster (issue 30, item 9): with the chart's defaults and no
/// flags, and with `--kube-version` of the target, it holds no admission
/// policy and the server takes all of it; for 1.34 with the kind in
/// `--api-versions` (docs/install.md, "Rendering offline") it has the
/// policy and its binding.
#[tokio::test]
async fn an_offline_render_applies_to_the_oldest_server() {
    let test = "an_offline_render_applies_to_the_oldest_server";
    if support::helm::available(test).is_none() {
        return;
    }
    let Some(plane) = ipsetmgr_envtest::shared(test, Server::Oldest).await else {
        return;
    };
    let admin = plane.client().await.unwrap();
    let offline = |release: &str, ns: &str, kube_version: Option<&str>, api_versions: &[&str]| {
        support::helm::template(&support::helm::Render {
            release,
            namespace: ns,
            api_versions,
            kube_version,
            overrides: &[],
            include_crds: true,
        })
        .unwrap_or_else(|e| panic!("helm template: {e}"))
        .docs
    };
    const VAP: &[&str] = &["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"];

    // `helm template` with nothing but the release: Helm's own defaults.
    let (release, ns) = ("offline", "offline-system");
    let docs = offline(release, ns, None, &[]);
    namespace(&admin, ns).await;
    apply_all(&admin, &docs, "helm template, no flags, on 1.25").await;
    assert_eq!(admission_objects(&docs), 0, "no flags: no admission policy");

    // The target's version given.
    let kube_version = plane.version().split('+').next().unwrap().to_string();
    let (release, ns) = ("offline-kv", "offline-kv-system");
    let docs = offline(release, ns, Some(&kube_version), VAP);
    namespace(&admin, ns).await;
    apply_all(&admin, &docs, "helm template --kube-version 1.25, on 1.25").await;
    assert_eq!(admission_objects(&docs), 0, "1.25: no admission policy");

    // For a 1.34 cluster that serves the kind: the policy and its binding.
    let docs = offline(release, ns, Some("v1.34.0"), VAP);
    assert_eq!(
        admission_objects(&docs),
        2,
        "1.34: the policy and its binding"
    );
}

fn kustomize(dir: &str) -> Option<Vec<Value>> {
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/render-kustomize.sh"
        ))
        .arg(dir)
        .output()
        .expect("running bash");
    if out.status.code() == Some(127) {
        ipsetmgr_envtest::cannot_run(
            "kustomize",
            &String::from_utf8_lossy(&out.stderr).trim().to_string(),
        );
        return None;
    }
    assert!(
        out.status.success(),
        "kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    Some(docs.into_iter().filter(|d| !d.is_null()).collect())
}

#[tokio::test]
async fn kustomize_installs_and_grants_what_the_docs_say() {
    let test = "kustomize_installs_and_grants_what_the_docs_say";
    let Some(plane) = ipsetmgr_envtest::shared(test, Server::Newest).await else {
        return;
    };
    let (Some(base), Some(admission)) =
        (kustomize("config/default"), kustomize("config/admission"))
    else {
        return;
    };
    let admin = plane.client().await.unwrap();
    let ns = "ipsetmgr-system";
    apply_all(&admin, &base, "kustomize config/default").await;
    apply_all(&admin, &admission, "kustomize config/admission").await;
    let others = [ns, "default", "kube-public"];
    check_access(
        &admin,
        plane,
        ns,
        "ipsetmgr-agent",
        &claims("**Agent**", ns, &[]),
        &others,
    )
    .await;
    check_access(
        &admin,
        plane,
        ns,
        "ipsetmgr-controller",
        &claims("**Controller**", ns, &[]),
        &others,
    )
    .await;
    check_own_node_only(&admin, plane, ns, "ipsetmgr-agent").await;
    // The optional member-sources component adds exactly its rows.
    let Some(sources) = kustomize("config/member-sources") else {
        return;
    };
    apply_all(&admin, &sources, "kustomize config/member-sources").await;
    check_access(
        &admin,
        plane,
        ns,
        "ipsetmgr-controller",
        &claims("**Controller**", ns, ALL_SOURCES),
        &others,
    )
    .await;
}
