//! Controller tests against a mock API server (tower-test), with the
//! in-memory kernel model as the dataplane.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedSender, unbounded};
use http::{Request, Response};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::client::Body;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tower_test::mock;

use super::controller::{Agent, Input, Observed, Settings, strip_policy};
use super::leader::{self, LeaderSettings, plan_summary};
use super::metrics::Shared;
use super::worker::Forward;
use crate::dataplane::model::ModelDataplane;
use crate::ipset::{Family, Naming, SetHeader, SetKind, SetType};
use crate::kernel::KernelSide;
use crate::manager::driver::DriverConfig;
use crate::policy::IPSetPolicy;

const NODE: &str = "node-a";

#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

impl Req {
    fn is_status_patch(&self, policy: &str) -> bool {
        self.method == "PATCH"
            && self.path == format!("/apis/ipsetmgr.io/v1alpha1/ipsetpolicies/{policy}/status")
    }
    fn is_event(&self) -> bool {
        self.method == "POST" && self.path.ends_with("/events")
    }
}

type Log = Arc<Mutex<Vec<Req>>>;
type Responder = Arc<dyn Fn(&Req) -> (u16, Value) + Send + Sync>;

fn status_err(code: u16, msg: &str) -> (u16, Value) {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": msg, "reason": reason, "code": code}),
    )
}

/// The API server's answers for the agent's own requests.
fn ok_responder() -> Responder {
    Arc::new(|r: &Req| {
        if r.method == "PATCH" && r.path.ends_with("/status") {
            let name = r.path.split('/').rev().nth(1).unwrap_or("x").to_string();
            return (
                200,
                json!({"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
                       "metadata": {"name": name, "generation": 1},
                       "spec": {"type": "hash:ip"}}),
            );
        }
        if r.is_event() {
            return (201, r.body.clone());
        }
        status_err(404, "not found")
    })
}

fn mock_api(responder: Arc<Mutex<Responder>>) -> (Client, Log) {
    let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let log: Log = Arc::default();
    let log2 = log.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let r = Req {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let f = responder.lock().unwrap().clone();
            let (code, resp) = f(&r);
            log2.lock().unwrap().push(r);
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&resp).unwrap()))
                    .unwrap(),
            );
        }
    });
    (Client::new(svc, "default"), log)
}

fn policy(name: &str, generation: i64, spec: Value) -> IPSetPolicy {
    serde_json::from_value(json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
        "metadata": {"name": name, "generation": generation, "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .unwrap()
}

fn crd(deleting: bool) -> CustomResourceDefinition {
    let mut meta = json!({"name": "ipsetpolicies.ipsetmgr.io"});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"group": "ipsetmgr.io", "scope": "Cluster", "versions": [],
                 "names": {"kind": "IPSetPolicy", "plural": "ipsetpolicies"}}
    }))
    .unwrap()
}

fn node(labels: &[(&str, &str)]) -> Node {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": NODE, "labels": labels}})).unwrap()
}

struct Harness {
    inputs: UnboundedSender<Input>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    log: Log,
    responder: Arc<Mutex<Responder>>,
    model: ModelDataplane,
    observed: Observed,
}

impl Harness {
    fn start(resync: Duration) -> Harness {
        Harness::start_with(resync, ModelDataplane::new())
    }

    fn start_with(resync: Duration, model: ModelDataplane) -> Harness {
        let responder = Arc::new(Mutex::new(ok_responder()));
        let (client, log) = mock_api(responder.clone());
        let naming = Naming::default();
        let mut settings = Settings::new(NODE, naming.clone());
        settings.debounce = Duration::from_millis(10);
        settings.min_write_interval = Duration::from_millis(50);
        settings.write_retry = Duration::from_millis(100);
        settings.request_timeout = Duration::from_secs(2);
        settings.deletion_grace = Duration::from_millis(300);
        let shared = Shared::new(resync);
        let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
        let kernel_model = model.clone();
        let kernel = KernelSide::start_with(
            None,
            DriverConfig::new(resync),
            Box::new(Forward::new(shared.clone(), reports_tx)),
            move || Ok((None, kernel_model, naming)),
        )
        .expect("the model kernel starts");
        let observed = Observed::default();
        let agent = Agent::new(client, settings, kernel, reports, shared, observed.clone());
        let (tx, rx) = unbounded();
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(agent.run(rx, async move {
            let _ = stop_rx.await;
        }));
        // The IPSetPolicy kind is installed (see kind_guard).
        tx.unbounded_send(Input::Crd(Event::Init)).unwrap();
        tx.unbounded_send(Input::Crd(Event::InitApply(crd(false))))
            .unwrap();
        tx.unbounded_send(Input::Crd(Event::InitDone)).unwrap();
        Harness {
            inputs: tx,
            stop: Some(stop),
            task,
            log,
            responder,
            model,
            observed,
        }
    }

    fn send(&self, input: Input) {
        self.inputs.unbounded_send(input).unwrap();
    }

    /// A policy as the production watch delivers it: status stripped.
    fn stripped(&self, mut p: IPSetPolicy) -> IPSetPolicy {
        strip_policy(&mut p, NODE, &self.observed);
        p
    }

    fn node_seen(&self, labels: &[(&str, &str)]) {
        self.send(Input::Node(Event::Init));
        self.send(Input::Node(Event::InitApply(node(labels))));
        self.send(Input::Node(Event::InitDone));
    }

    fn list(&self, policies: Vec<IPSetPolicy>) {
        self.send(Input::Policy(Event::Init));
        for p in policies {
            let p = self.stripped(p);
            self.send(Input::Policy(Event::InitApply(p)));
        }
        self.send(Input::Policy(Event::InitDone));
    }

    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    fn status_patches(&self, policy: &str) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| r.is_status_patch(policy))
            .collect()
    }

    fn set_responder(&self, f: Responder) {
        *self.responder.lock().unwrap() = f;
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("agent stops")
            .unwrap();
    }
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..250 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn hash_ip(members: &[&str]) -> Value {
    json!({"type": "hash:ip", "members": members})
}

#[tokio::test]
async fn status_is_server_side_apply_of_own_entry_only() {
    let h = Harness::start(Duration::from_millis(100));
    h.node_seen(&[("role", "edge")]);
    h.list(vec![policy("p1", 3, hash_ip(&["10.0.0.1", "10.0.0.2"]))]);

    eventually("status patch of p1", || !h.status_patches("p1").is_empty()).await;
    assert_eq!(
        h.model.members("ipm4-p1").unwrap(),
        ["10.0.0.1", "10.0.0.2"]
    );
    let r = &h.status_patches("p1")[0];
    assert_eq!(r.content_type, "application/apply-patch+yaml");
    assert!(
        r.query.contains("fieldManager=ipsetmgr-agent-node-a"),
        "{}",
        r.query
    );
    assert!(r.query.contains("force=true"), "{}", r.query);
    let b = &r.body;
    assert_eq!(b["apiVersion"], "ipsetmgr.io/v1alpha1");
    assert_eq!(b["kind"], "IPSetPolicy");
    assert_eq!(b["metadata"], json!({"name": "p1"}));
    // Only status.nodes, with only this node's entry.
    assert_eq!(b.as_object().unwrap().len(), 4);
    assert_eq!(b["status"].as_object().unwrap().len(), 1);
    let nodes = b["status"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    let e = &nodes[0];
    assert_eq!(e["nodeName"], NODE);
    assert_eq!(e["observedGeneration"], 3);
    assert_eq!(e["synced"], true);
    assert_eq!(e["setNames"], json!(["ipm4-p1"]));
    assert_eq!(e["members"], 2);
    assert!(e["lastSyncTime"].as_str().unwrap().ends_with('Z'));
    assert!(e.get("error").is_none());

    // Periodic resyncs (every 100 ms) with nothing changed: no more requests.
    // Another node's status write arrives through the watch with the same
    // generation: it does not wake the reconciler either.
    let mut other = policy("p1", 3, hash_ip(&["10.0.0.1", "10.0.0.2"]));
    other.status = Some(crate::policy::IPSetPolicyStatus {
        nodes: vec![crate::policy::NodeStatus {
            node_name: "node-b".into(),
            synced: true,
            ..Default::default()
        }],
        summary: None,
    });
    let other = h.stripped(other);
    h.send(Input::Policy(Event::Apply(other)));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(h.status_patches("p1").len(), 1, "{:#?}", h.requests());
    assert_eq!(h.requests().len(), 1, "{:#?}", h.requests());

    // A spec change (new generation) is applied and reported.
    h.send(Input::Policy(Event::Apply(h.stripped(policy(
        "p1",
        4,
        hash_ip(&["10.0.0.3"]),
    )))));
    eventually("second status patch", || h.status_patches("p1").len() == 2).await;
    assert_eq!(h.model.members("ipm4-p1").unwrap(), ["10.0.0.3"]);
    let e = &h.status_patches("p1")[1].body["status"]["nodes"][0];
    assert_eq!(e["observedGeneration"], 4);
    assert_eq!(e["members"], 1);
    h.stop().await;
}

#[tokio::test]
async fn unselected_policy_removes_sets_and_withdraws_entry() {
    let h = Harness::start(Duration::from_secs(60));
    h.node_seen(&[("role", "edge")]);
    let spec = json!({"type": "hash:net", "members": ["10.0.0.0/8"],
                      "nodeSelector": {"matchLabels": {"role": "edge"}}});
    h.list(vec![
        policy("edge-only", 1, spec),
        policy("all", 1, hash_ip(&["10.1.1.1"])),
    ]);
    eventually("both entries", || {
        !h.status_patches("edge-only").is_empty() && !h.status_patches("all").is_empty()
    })
    .await;
    assert!(h.model.set_names().contains(&"ipm4-edge-only".to_string()));

    // The node is relabelled: the policy no longer selects it.
    h.send(Input::Node(Event::Apply(node(&[("role", "core")]))));
    eventually("withdrawal", || h.status_patches("edge-only").len() == 2).await;
    assert_eq!(h.model.set_names(), ["ipm4-all"]);
    let r = &h.status_patches("edge-only")[1];
    assert_eq!(r.content_type, "application/apply-patch+yaml");
    assert!(r.query.contains("fieldManager=ipsetmgr-agent-node-a"));
    assert_eq!(r.body["status"], json!({"nodes": []}));
    // The other policy's entry did not change: not rewritten.
    assert_eq!(h.status_patches("all").len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn policy_withdrawn_after_restart_when_server_shows_an_entry() {
    // The server still has this node's entry from before a restart, but the
    // policy no longer selects the node: one withdrawal, no other write.
    let h = Harness::start(Duration::from_secs(60));
    h.node_seen(&[("role", "core")]);
    let mut p = policy(
        "edge-only",
        2,
        json!({"type": "hash:ip", "nodeSelector": {"matchLabels": {"role": "edge"}}}),
    );
    p.status = Some(crate::policy::IPSetPolicyStatus {
        nodes: vec![crate::policy::NodeStatus {
            node_name: NODE.into(),
            ..Default::default()
        }],
        summary: None,
    });
    h.list(vec![
        p,
        policy(
            "never-mine",
            1,
            json!({"type": "hash:ip", "nodeSelector": {"matchLabels": {"role": "edge"}}}),
        ),
    ]);
    eventually("withdrawal", || !h.status_patches("edge-only").is_empty()).await;
    assert_eq!(
        h.status_patches("edge-only")[0].body["status"],
        json!({"nodes": []})
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.status_patches("never-mine").is_empty());
    h.stop().await;
}

#[tokio::test]
async fn nothing_is_deleted_before_the_initial_list_completes() {
    let model = ModelDataplane::new();
    // An owned set from an earlier run, that no policy wants any more.
    model.create_raw(
        "ipm4-old",
        SetHeader {
            kind: SetKind::new(SetType::HashIp, Some(Family::V4)),
            max_elem: 65536,
            hash_size: None,
        },
    );
    let h = Harness::start_with(Duration::from_millis(50), model);
    // Node seen, policies still being listed (paged list in progress).
    h.node_seen(&[]);
    h.send(Input::Policy(Event::Init));
    h.send(Input::Policy(Event::InitApply(h.stripped(policy(
        "p1",
        1,
        hash_ip(&["10.0.0.1"]),
    )))));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(h.model.set_names(), ["ipm4-old"], "kernel untouched");
    assert!(h.requests().is_empty());

    h.send(Input::Policy(Event::InitDone));
    eventually("p1 created, old deleted", || {
        h.model.set_names() == ["ipm4-p1"]
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn nothing_is_applied_before_the_node_is_seen() {
    let model = ModelDataplane::new();
    model.create_raw(
        "ipm4-old",
        SetHeader {
            kind: SetKind::new(SetType::HashIp, Some(Family::V4)),
            max_elem: 65536,
            hash_size: None,
        },
    );
    let h = Harness::start_with(Duration::from_millis(50), model);
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1"]))]);
    // The node watch listed nothing (node object not there yet).
    h.send(Input::Node(Event::Init));
    h.send(Input::Node(Event::InitDone));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.model.set_names(), ["ipm4-old"]);
    h.send(Input::Node(Event::Apply(node(&[]))));
    eventually("applied once the node is seen", || {
        h.model.set_names() == ["ipm4-p1"]
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn set_error_publishes_one_warning_event() {
    let h = Harness::start(Duration::from_millis(100));
    h.node_seen(&[]);
    h.list(vec![
        policy(
            "macs",
            1,
            json!({"type": "hash:mac", "members": ["aa:bb:cc:dd:ee:ff"]}),
        ),
        policy("ok", 1, hash_ip(&["10.0.0.1"])),
    ]);
    eventually("warning event", || h.requests().iter().any(Req::is_event)).await;
    let ev = h.requests().into_iter().find(Req::is_event).unwrap();
    assert_eq!(ev.path, "/apis/events.k8s.io/v1/namespaces/default/events");
    assert_eq!(ev.body["type"], "Warning");
    assert_eq!(ev.body["reason"], "SyncFailed");
    assert_eq!(ev.body["regarding"]["kind"], "IPSetPolicy");
    assert_eq!(ev.body["regarding"]["name"], "macs");
    let note = ev.body["note"].as_str().unwrap();
    assert!(note.contains("not supported"), "{note}");
    assert!(note.contains("node-a"), "{note}");

    // The healthy policy still got its set: one bad set does not block others.
    assert!(h.model.set_names().contains(&"ipm4-ok".to_string()));
    eventually("status of macs", || !h.status_patches("macs").is_empty()).await;
    let e = &h.status_patches("macs")[0].body["status"]["nodes"][0];
    assert_eq!(e["synced"], false);
    assert!(e["error"].as_str().unwrap().contains("not supported"));

    // Several resyncs later the same message is not repeated.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = h.requests().into_iter().filter(Req::is_event).count();
    assert_eq!(events, 1);
    h.stop().await;
}

#[tokio::test]
async fn invalid_member_is_reported_in_status_and_event() {
    let h = Harness::start(Duration::from_secs(60));
    h.node_seen(&[]);
    h.list(vec![policy("bad", 1, hash_ip(&["example.com"]))]);
    eventually("event", || h.requests().iter().any(Req::is_event)).await;
    let ev = h.requests().into_iter().find(Req::is_event).unwrap();
    assert_eq!(ev.body["reason"], "InvalidPolicy");
    eventually("status", || !h.status_patches("bad").is_empty()).await;
    let e = &h.status_patches("bad")[0].body["status"]["nodes"][0];
    assert_eq!(e["synced"], false);
    assert!(e["error"].as_str().unwrap().contains("example.com"));
    h.stop().await;
}

#[tokio::test]
async fn api_server_errors_leave_the_kernel_alone() {
    let h = Harness::start(Duration::from_millis(100));
    h.node_seen(&[]);
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1", "10.0.0.2"]))]);
    eventually("synced", || !h.status_patches("p1").is_empty()).await;

    // The API server fails every request from now on; the watches error
    // and restart (Init without InitDone: the relist never completes).
    h.set_responder(Arc::new(|_| status_err(500, "etcd is sad")));
    h.send(Input::WatchError("policy watch: 500".into()));
    h.send(Input::Policy(Event::Init));
    h.send(Input::WatchError("policy watch: 500".into()));
    h.send(Input::Node(Event::Init));
    h.send(Input::WatchError("node watch: connection refused".into()));

    // Meanwhile someone removes a member by hand: the periodic resync
    // (which keeps running) repairs it; nothing is deleted.
    h.model.tamper(|sets| {
        let s = sets.get_mut("ipm4-p1").unwrap();
        let m = crate::ipset::Member::parse_user(SetType::HashIp, "10.0.0.2")
            .unwrap()
            .members;
        for m in m {
            s.members.remove(&m);
        }
    });
    eventually("drift repaired", || {
        h.model.members("ipm4-p1").unwrap() == ["10.0.0.1", "10.0.0.2"]
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(h.model.set_names(), ["ipm4-p1"]);
    assert_eq!(
        h.model.members("ipm4-p1").unwrap(),
        ["10.0.0.1", "10.0.0.2"]
    );

    // The problem count changed, so status writes were attempted (and
    // failed with 500) and are retried.
    eventually("status write retried", || h.status_patches("p1").len() >= 3).await;

    // The API server comes back with a complete list: back to normal.
    h.set_responder(ok_responder());
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1", "10.0.0.2"]))]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.model.set_names(), ["ipm4-p1"]);
    h.stop().await;
}

#[tokio::test]
async fn shutdown_leaves_kernel_as_is() {
    let h = Harness::start(Duration::from_secs(60));
    h.node_seen(&[]);
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1"]))]);
    eventually("synced", || !h.status_patches("p1").is_empty()).await;
    let model = h.model.clone();
    h.stop().await;
    assert_eq!(model.set_names(), ["ipm4-p1"]);
}

// ---- summary writer and garbage collection ----

fn leader_responder(policies: Value, nodes: Value, lease: Option<Value>) -> Responder {
    // The lease is stateful: what is created or updated is read back.
    let lease = Arc::new(Mutex::new(lease));
    Arc::new(move |r: &Req| {
        let lease_path = "/apis/coordination.k8s.io/v1/namespaces/ipsetmgr-system/leases";
        let one = format!("{lease_path}/ipsetmgr-summary");
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", p) if p == one => match &*lease.lock().unwrap() {
                Some(l) => (200, l.clone()),
                None => status_err(404, "not found"),
            },
            ("POST", p) if p == lease_path => {
                *lease.lock().unwrap() = Some(r.body.clone());
                (201, r.body.clone())
            }
            ("PUT", p) if p == one => {
                *lease.lock().unwrap() = Some(r.body.clone());
                (200, r.body.clone())
            }
            ("GET", "/apis/ipsetmgr.io/v1alpha1/ipsetpolicies") => (200, policies.clone()),
            ("GET", "/api/v1/nodes") => (200, nodes.clone()),
            ("PATCH", p) if p.ends_with("/status") => (
                200,
                json!({"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
                       "metadata": {"name": "p1"}, "spec": {"type": "hash:ip"}}),
            ),
            _ => status_err(404, "not found"),
        }
    })
}

fn cluster_policies() -> Value {
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicyList", "metadata": {},
        "items": [{
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": "p1", "generation": 2},
            "spec": {"type": "hash:ip", "nodeSelector": {"matchLabels": {"role": "edge"}}},
            "status": {"nodes": [
                {"nodeName": "node-a", "observedGeneration": 2, "synced": true, "problems": 1},
                {"nodeName": "node-gone", "observedGeneration": 2, "synced": true},
                {"nodeName": "node-b", "observedGeneration": 2, "synced": true},
                {"nodeName": "node-c", "observedGeneration": 1, "synced": true, "problems": 2},
            ]},
        }],
    })
}

fn cluster_nodes() -> Value {
    let n = |name: &str, role: &str| {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
               "metadata": {"name": name, "labels": {"role": role}}})
    };
    json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {},
        "items": [n("node-a", "edge"), n("node-b", "core"), n("node-c", "edge"), n("node-d", "edge")],
    })
}

#[test]
fn summary_counts_selected_nodes_and_collects_departed_entries() {
    let list: kube::core::ObjectList<IPSetPolicy> =
        serde_json::from_value(cluster_policies()).unwrap();
    let p = &list.items[0];
    let mut nodes = BTreeMap::new();
    for (n, role) in [
        ("node-a", "edge"),
        ("node-b", "core"),
        ("node-c", "edge"),
        ("node-d", "edge"),
    ] {
        nodes.insert(
            n.to_string(),
            BTreeMap::from([("role".to_string(), role.to_string())]),
        );
    }
    let plan = plan_summary(p, &nodes);
    // Selected: a, c, d. Synced for generation 2: a only (c is behind).
    assert_eq!(plan.summary.nodes, 3);
    assert_eq!(plan.summary.synced, 1);
    assert_eq!(plan.summary.synced_text, "1/3");
    assert_eq!(plan.summary.problems, 3);
    assert_eq!(plan.summary.observed_generation, 2);
    // node-gone no longer exists; node-b is no longer selected.
    assert_eq!(
        plan.remove,
        [(1, "node-gone".to_string()), (2, "node-b".to_string())]
    );
    assert_eq!(
        leader::removal_patch(&plan.remove),
        json!([
            {"op": "test", "path": "/status/nodes/2/nodeName", "value": "node-b"},
            {"op": "remove", "path": "/status/nodes/2"},
            {"op": "test", "path": "/status/nodes/1/nodeName", "value": "node-gone"},
            {"op": "remove", "path": "/status/nodes/1"},
        ])
    );
}

async fn run_leader(responder: Responder) -> Vec<Req> {
    let (client, log) = mock_api(Arc::new(Mutex::new(responder)));
    let mut s = LeaderSettings::new(NODE, "ipsetmgr-system");
    s.renew_every = Duration::from_millis(50);
    s.summary_every = Duration::from_secs(60);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(leader::run(
        client,
        s,
        Shared::new(Duration::from_secs(60)),
        stop_rx,
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop_tx.send(true).unwrap();
    task.await.unwrap();
    log.lock().unwrap().clone()
}

#[tokio::test]
async fn leader_writes_summary_and_removes_departed_entries() {
    let log = run_leader(leader_responder(cluster_policies(), cluster_nodes(), None)).await;
    // Lease created (it did not exist), so this agent leads.
    let create = log
        .iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/leases"))
        .unwrap_or_else(|| panic!("lease created: {log:#?}"));
    assert_eq!(create.body["spec"]["holderIdentity"], NODE);
    assert_eq!(create.body["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(log.iter().filter(|r| r.method == "POST").count(), 1);
    // Renewals are updates of the same lease.
    assert!(log.iter().any(|r| r.method == "PUT"));

    let patches: Vec<&Req> = log.iter().filter(|r| r.is_status_patch("p1")).collect();
    // Exactly one removal and one summary: later renewals do not re-summarise
    // before summary_every.
    assert_eq!(patches.len(), 2, "{patches:#?}");
    let gc = patches
        .iter()
        .find(|r| r.content_type == "application/json-patch+json")
        .expect("json patch");
    assert_eq!(
        gc.body,
        json!([
            {"op": "test", "path": "/status/nodes/2/nodeName", "value": "node-b"},
            {"op": "remove", "path": "/status/nodes/2"},
            {"op": "test", "path": "/status/nodes/1/nodeName", "value": "node-gone"},
            {"op": "remove", "path": "/status/nodes/1"},
        ])
    );
    let sum = patches
        .iter()
        .find(|r| r.content_type == "application/apply-patch+yaml")
        .expect("summary apply");
    assert!(sum.query.contains("fieldManager=ipsetmgr-summary"));
    assert!(sum.query.contains("force=true"));
    assert_eq!(
        sum.body,
        json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": "p1"},
            "status": {"summary": {"nodes": 3, "synced": 1, "syncedText": "1/3",
                                   "problems": 3, "observedGeneration": 2}},
        })
    );
}

#[tokio::test]
async fn follower_writes_nothing_while_the_lease_is_held() {
    let now = k8s_openapi::jiff::Timestamp::now();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ipsetmgr-summary", "namespace": "ipsetmgr-system", "resourceVersion": "7"},
        "spec": {"holderIdentity": "node-z", "leaseDurationSeconds": 15,
                 "renewTime": now.to_string()},
    });
    let log = run_leader(leader_responder(
        cluster_policies(),
        cluster_nodes(),
        Some(lease),
    ))
    .await;
    assert!(log.iter().all(|r| r.method == "GET"), "{log:#?}");
    assert!(log.iter().all(|r| r.path.contains("/leases/")));
}

#[tokio::test]
async fn expired_lease_is_taken_over_with_an_update() {
    let old =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60);
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ipsetmgr-summary", "namespace": "ipsetmgr-system", "resourceVersion": "7"},
        "spec": {"holderIdentity": "node-z", "leaseDurationSeconds": 15,
                 "renewTime": old.to_string(), "leaseTransitions": 4},
    });
    let log = run_leader(leader_responder(
        cluster_policies(),
        cluster_nodes(),
        Some(lease),
    ))
    .await;
    let put = log.iter().find(|r| r.method == "PUT").expect("takeover");
    assert_eq!(put.body["spec"]["holderIdentity"], NODE);
    assert_eq!(put.body["spec"]["leaseTransitions"], 5);
    assert_eq!(put.body["metadata"]["resourceVersion"], "7");
    assert!(log.iter().any(|r| r.is_status_patch("p1")));
}

#[tokio::test]
async fn deleting_the_crd_leaves_the_kernel_as_it_is() {
    let h = Harness::start(Duration::from_secs(60));
    h.node_seen(&[]);
    h.list(vec![
        policy("p1", 1, hash_ip(&["10.0.0.1"])),
        policy("p2", 1, hash_ip(&["10.0.0.2"])),
    ]);
    eventually("sets created", || h.model.set_names().len() == 2).await;

    // What the API server does on `kubectl delete crd`: every policy is
    // deleted (their watch events may come first), then the CRD goes.
    h.send(Input::Policy(Event::Delete(policy("p1", 1, hash_ip(&[])))));
    h.send(Input::Policy(Event::Delete(policy("p2", 1, hash_ip(&[])))));
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.send(Input::Crd(Event::Apply(crd(true))));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        h.model.set_names(),
        ["ipm4-p1", "ipm4-p2"],
        "nothing pruned"
    );
    h.send(Input::Crd(Event::Delete(crd(true))));
    h.send(Input::KindNotFound("policy watch: 404".into()));
    // A relist that finds nothing (the kind is gone) changes nothing either.
    h.list(vec![]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(h.model.set_names(), ["ipm4-p1", "ipm4-p2"]);

    // Reinstalled with one policy: the agent follows the API again.
    h.send(Input::Crd(Event::Apply(crd(false))));
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1"]))]);
    eventually("p2 pruned once the kind is back", || {
        h.model.set_names() == ["ipm4-p1"]
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn deleting_a_policy_still_removes_its_sets() {
    let h = Harness::start(Duration::from_secs(60));
    h.node_seen(&[]);
    h.list(vec![
        policy("p1", 1, hash_ip(&["10.0.0.1"])),
        policy("p2", 1, hash_ip(&["10.0.0.2"])),
    ]);
    eventually("sets created", || h.model.set_names().len() == 2).await;
    h.send(Input::Policy(Event::Delete(policy("p2", 1, hash_ip(&[])))));
    eventually("p2 removed after the grace period", || {
        h.model.set_names() == ["ipm4-p1"]
    })
    .await;
    h.stop().await;
}
