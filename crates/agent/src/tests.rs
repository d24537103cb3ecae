//! Agent tests against a mock API server (tower-test) that keeps the node
//! state objects it is sent, with the in-memory kernel model driven inline
//! (no OS thread), all on tokio's paused clock: timings are exact and no
//! test sleeps in real time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use super::event_loop::{Agent, KernelPort, Settings};
use super::inputs::{Input, guarded_crds};
use super::metrics::Shared;
use super::node_state::{WriterSettings, run_writer};
use ipsetmgr_cluster::kind_guard::test_crd as crd;
use ipsetmgr_cluster::logging::LogBuffer;
use ipsetmgr_cluster::mock_api::{Req, eventually, mock_client};
use ipsetmgr_cluster::tolerant::decode;
use ipsetmgr_dataplane::model::ModelDataplane;
use ipsetmgr_ipset::{Family, Naming, SetHeader, SetKind, SetType};
use ipsetmgr_nft::backend::{NftReconciler, default_table};
use ipsetmgr_nft::model::ModelNft;
use ipsetmgr_sets::driver::{Command, Report};
use ipsetmgr_sets::{Backends, ReconcilerConfig, SetsBackend};

const NODE: &str = "node-a";
const STATE_PATH: &str = "/apis/ipsetmgr.io/v1alpha1/ipsetnodestates";

/// A tiny API server for node states: GET, POST (create), PATCH of
/// `/status`; `fail_writes` makes status patches fail with 500.
#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    log: Vec<Req>,
    fail_writes: bool,
}

fn status(code: u16, reason: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": reason, "reason": reason, "code": code}),
    )
}

impl Server {
    fn answer(&mut self, r: &Req) -> (u16, Value) {
        let name = r
            .path
            .strip_prefix(&format!("{STATE_PATH}/"))
            .map(|rest| rest.trim_end_matches("/status").to_string());
        match (r.method.as_str(), name) {
            ("GET", Some(name)) => match self.objects.get(&name) {
                Some(o) => (200, o.clone()),
                None => status(404, "NotFound"),
            },
            ("POST", None) if r.path == STATE_PATH => {
                let name = r.body["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                if self.objects.contains_key(&name) {
                    return status(409, "AlreadyExists");
                }
                self.objects.insert(name, r.body.clone());
                (201, r.body.clone())
            }
            ("PATCH", Some(name)) if r.path.ends_with("/status") => {
                if self.fail_writes {
                    return status(500, "InternalError");
                }
                match self.objects.get_mut(&name) {
                    Some(o) => {
                        o["status"] = r.body["status"].clone();
                        (200, o.clone())
                    }
                    None => status(404, "NotFound"),
                }
            }
            _ => status(404, "NotFound"),
        }
    }
}

fn mock_api(server: Arc<Mutex<Server>>) -> Client {
    mock_client(move |r| {
        let mut s = server.lock().unwrap();
        let answer = s.answer(&r);
        s.log.push(r);
        answer
    })
}

/// The kernel side, inline: each desired state is applied at once by the
/// backend (over a model) and reported, in the test's own task.
struct InlineKernel {
    manager: Mutex<Box<dyn SetsBackend>>,
    reports: mpsc::UnboundedSender<Report>,
}

impl KernelPort for InlineKernel {
    fn send(&self, cmd: Command) {
        let mut m = self.manager.lock().unwrap();
        let seq = match cmd {
            Command::Desired { seq, sets, held } => {
                m.set_desired(sets, held);
                seq
            }
            Command::Resync => {
                m.queue_resync();
                return;
            }
            Command::Shutdown => return,
        };
        let outcome = m.apply_updates();
        let _ = self.reports.send(Report {
            seq,
            sets: m.report(),
            deletions: m.deletion_report(),
            unwanted: m.unwanted(),
            full_resync: false,
            outcome,
        });
    }
    fn shutdown(self: Box<Self>) {}
}

struct Harness {
    inputs: UnboundedSender<Input>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    server: Arc<Mutex<Server>>,
    model: ModelDataplane,
    shared: Arc<Shared>,
}

const HEARTBEAT: Duration = Duration::from_secs(30);

/// The backends' configuration: the default naming, as the agent's.
fn config() -> ReconcilerConfig {
    ReconcilerConfig {
        naming: Naming::default(),
        ..ReconcilerConfig::default()
    }
}

/// `--backend nft` over the nf_tables model.
fn nft_backend(nft: &ModelNft) -> NftReconciler<ModelNft> {
    ipsetmgr_nft::backend::reconciler(nft.clone(), default_table(), config()).with_sleep(|_| {})
}

impl Harness {
    fn start() -> Harness {
        Harness::start_with(ModelDataplane::new())
    }

    fn start_with(model: ModelDataplane) -> Harness {
        let manager =
            ipsetmgr_dataplane::adapter::reconciler(model.clone(), config()).with_sleep(|_| {});
        Harness::start_backend(model, Box::new(manager), "ipset")
    }

    /// The agent over `backend`, whose reports describe sets of
    /// `sets_kind` (as `--backend` sets it); `model` is the ipset model
    /// the backend uses, if any.
    fn start_backend(
        model: ModelDataplane,
        backend: Box<dyn SetsBackend>,
        sets_kind: &'static str,
    ) -> Harness {
        let server = Arc::new(Mutex::new(Server::default()));
        let client = mock_api(server.clone());
        let mut settings = Settings::new(Naming::default(), HEARTBEAT);
        settings.debounce = Duration::from_millis(10);
        settings.deletion_grace = Duration::from_millis(300);
        settings.sets_kinds = vec![sets_kind];
        let shared = Shared::new(Duration::from_secs(60));
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let kernel = InlineKernel {
            manager: Mutex::new(backend),
            reports: reports_tx,
        };
        let (status_tx, status_rx) = watch::channel(None);
        tokio::spawn(run_writer(
            client,
            WriterSettings {
                node: NODE.into(),
                heartbeat: HEARTBEAT,
                min_interval: Duration::from_millis(50),
                settle: Duration::from_millis(10),
                burst: Duration::from_millis(300),
                retry: Duration::from_millis(100),
                request_timeout: Duration::from_secs(2),
            },
            status_rx,
            shared.clone(),
        ));
        let crds = guarded_crds();
        let agent = Agent::new(
            settings,
            &crds,
            Box::new(kernel),
            reports,
            status_tx,
            shared.clone(),
        );
        let (tx, rx) = unbounded();
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(agent.run(rx, async move {
            let _ = stop_rx.await;
        }));
        let h = Harness {
            inputs: tx,
            stop: Some(stop),
            task,
            server,
            model,
            shared,
        };
        for name in crds {
            h.send(Input::Crd(name.clone(), Event::Apply(crd(&name, false))));
        }
        h
    }

    fn send(&self, input: Input) {
        self.inputs.unbounded_send(input).unwrap();
    }

    fn node_seen(&self, labels: &[(&str, &str)]) {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": NODE, "uid": "uid-node-a", "labels": labels}}),
        )
        .unwrap();
        self.send(Input::Node(Event::Init));
        self.send(Input::Node(Event::InitApply(node)));
        self.send(Input::Node(Event::InitDone));
    }

    fn list(&self, policies: Vec<Value>, slices: Vec<Value>) {
        self.send(Input::Policy(Event::Init));
        for p in policies {
            self.send(Input::Policy(Event::InitApply(decode(
                serde_json::from_value(p).unwrap(),
            ))));
        }
        self.send(Input::Policy(Event::InitDone));
        self.send(Input::Slice(Event::Init));
        for s in slices {
            self.send(Input::Slice(Event::InitApply(decode(
                serde_json::from_value(s).unwrap(),
            ))));
        }
        self.send(Input::Slice(Event::InitDone));
    }

    fn requests(&self) -> Vec<Req> {
        self.server.lock().unwrap().log.clone()
    }

    fn status_patches(&self) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .collect()
    }

    fn stored_status(&self) -> Value {
        self.server
            .lock()
            .unwrap()
            .objects
            .get(NODE)
            .map_or(Value::Null, |o| o["status"].clone())
    }

    fn policy_state(&self, policy: &str) -> Option<Value> {
        self.stored_status()["policies"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == policy)
            .cloned()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("agent stops")
            .unwrap();
    }
}

fn policy(name: &str, generation: i64, spec: Value) -> Value {
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
        "metadata": {"name": name, "generation": generation, "uid": format!("uid-{name}")},
        "spec": spec,
    })
}

fn slice(name: &str, policy: &str, version: &str, members: &[&str]) -> Value {
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
        "metadata": {"name": name, "resourceVersion": version,
                     "labels": {"ipsetmgr.io/policy": policy}},
        "spec": {"members": members},
    })
}

fn hash_ip(members: &[&str]) -> Value {
    json!({"type": "hash:ip", "members": members})
}

#[tokio::test(start_paused = true)]
async fn node_state_is_created_owned_by_the_node_then_its_status_applied() {
    let h = Harness::start();
    h.node_seen(&[("role", "edge")]);
    h.list(
        vec![policy("p1", 3, hash_ip(&["10.0.0.1", "10.0.0.2"]))],
        vec![],
    );
    eventually("status written", || h.policy_state("p1").is_some()).await;
    assert_eq!(
        h.model.members("ipm4-p1").unwrap(),
        ["10.0.0.1", "10.0.0.2"]
    );

    let reqs = h.requests();
    let create = reqs.iter().find(|r| r.method == "POST").expect("created");
    assert_eq!(create.path, STATE_PATH);
    assert_eq!(create.body["metadata"]["name"], NODE);
    let owner = &create.body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["uid"], "uid-node-a");
    let patch = &h.status_patches()[0];
    assert_eq!(patch.path, format!("{STATE_PATH}/{NODE}/status"));
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    assert!(
        patch.query.contains("fieldManager=ipsetmgr-agent"),
        "{}",
        patch.query
    );
    assert!(patch.query.contains("force=true"), "{}", patch.query);
    let b = &patch.body;
    assert_eq!(b["apiVersion"], "ipsetmgr.io/v1alpha1");
    assert_eq!(b["kind"], "IPSetNodeState");
    assert_eq!(b["metadata"], json!({"name": NODE}));
    assert_eq!(
        b.as_object().unwrap().len(),
        4,
        "only status is applied: {b}"
    );
    let s = &b["status"];
    assert_eq!(s["syncedText"], "1/1");
    assert_eq!(s["heartbeatIntervalSeconds"], 30);
    assert!(s["heartbeatTime"].as_str().unwrap().ends_with('Z'));
    let e = &s["policies"][0];
    assert_eq!(e["name"], "p1");
    assert_eq!(e["observedGeneration"], 3);
    assert_eq!(e["synced"], true);
    assert_eq!(e["setNames"], json!(["ipm4-p1"]));
    assert_eq!(e["members"], 2);
    assert!(e.get("error").is_none());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_latest_status_is_repeated_every_heartbeat_and_status_writes_do_not_wake_it() {
    let h = Harness::start();
    h.node_seen(&[]);
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1"]))], vec![]);
    eventually("first write", || h.status_patches().len() == 1).await;
    // The controller writes the policy's status: same generation, nothing to do.
    let mut with_status = policy("p1", 1, hash_ip(&["10.0.0.1"]));
    with_status["status"] = json!({"observedGeneration": 1});
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(with_status).unwrap(),
    ))));
    tokio::time::sleep(HEARTBEAT / 2).await;
    assert_eq!(h.status_patches().len(), 1, "no write before the heartbeat");
    tokio::time::sleep(HEARTBEAT).await;
    let patches = h.status_patches();
    assert_eq!(patches.len(), 2, "one heartbeat write");
    assert!(patches[1].body["status"]["heartbeatTime"].is_string());
    assert_eq!(
        patches[1].body["status"]["policies"],
        patches[0].body["status"]["policies"]
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn slices_are_merged_and_re_merged_on_change() {
    let h = Harness::start();
    h.node_seen(&[]);
    h.list(
        vec![policy("big", 1, hash_ip(&["10.0.0.1"]))],
        vec![
            slice("big-0", "big", "5", &["10.0.1.1", "10.0.1.2"]),
            slice("big-1", "big", "6", &["10.0.2.1"]),
            // Labelled for a policy that does not exist: ignored.
            slice("x-0", "nope", "7", &["10.9.9.9"]),
        ],
    );
    eventually("union applied", || {
        h.model.members("ipm4-big")
            == Some(vec![
                "10.0.0.1".into(),
                "10.0.1.1".into(),
                "10.0.1.2".into(),
                "10.0.2.1".into(),
            ])
    })
    .await;
    eventually("reported", || {
        h.policy_state("big").is_some_and(|e| e["members"] == 4)
    })
    .await;
    // One slice changes: the kernel follows.
    h.send(Input::Slice(Event::Apply(decode(
        serde_json::from_value(slice("big-1", "big", "8", &["10.0.2.2"])).unwrap(),
    ))));
    eventually("slice change applied", || {
        h.model.members("ipm4-big")
            == Some(vec![
                "10.0.0.1".into(),
                "10.0.1.1".into(),
                "10.0.1.2".into(),
                "10.0.2.2".into(),
            ])
    })
    .await;
    // A slice deleted: its members go (after the deletion grace).
    h.send(Input::Slice(Event::Delete(decode(
        serde_json::from_value(slice("big-0", "big", "5", &[])).unwrap(),
    ))));
    eventually("slice removal applied", || {
        h.model.members("ipm4-big") == Some(vec!["10.0.0.1".into(), "10.0.2.2".into()])
    })
    .await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_object_is_held_alone_and_reported() {
    let model = ModelDataplane::new();
    // The old policy's set from before: it must stay as it is.
    model.create_raw(
        "ipm4-old",
        SetHeader {
            kind: SetKind::new(SetType::HashIp, Some(Family::V4)),
            max_elem: 65536,
            hash_size: None,
            options: Default::default(),
        },
    );
    let h = Harness::start_with(model);
    h.node_seen(&[]);
    h.list(
        vec![
            policy("old", 1, json!({"type": "hash:ip", "maxElem": 8589934592u64})),
            policy("good", 1, hash_ip(&["10.0.0.1"])),
        ],
        vec![json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
            "metadata": {"name": "good-0", "resourceVersion": "1", "labels": {"ipsetmgr.io/policy": "good"}},
            "spec": {"members": "not-a-list"}
        })],
    );
    eventually("reported", || {
        h.policy_state("old").is_some() && h.policy_state("good").is_some()
    })
    .await;
    let old = h.policy_state("old").unwrap();
    assert_eq!(old["synced"], false);
    assert!(
        old["error"].as_str().unwrap().contains("could not be read"),
        "{old}"
    );
    assert!(
        old["error"].as_str().unwrap().contains("8589934592"),
        "{old}"
    );
    assert!(
        h.model.set_names().contains(&"ipm4-old".to_string()),
        "held, not pruned"
    );
    // The good policy's unreadable slice holds it too (it has no set yet).
    let good = h.policy_state("good").unwrap();
    assert!(
        good["error"]
            .as_str()
            .unwrap()
            .contains("slice \"good-0\": could not be read"),
        "{good}"
    );
    assert!(h.model.get("ipm4-good").is_none());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_vanished_kind_leaves_the_kernel_as_it_is() {
    let h = Harness::start();
    h.node_seen(&[]);
    h.list(
        vec![
            policy("p1", 1, hash_ip(&["10.0.0.1"])),
            policy("p2", 1, hash_ip(&["10.0.0.2"])),
        ],
        vec![],
    );
    eventually("sets created", || h.model.set_names().len() == 2).await;
    // The watch answers 404 for the kind, then the objects are gone.
    h.send(Input::KindNotFound {
        crd: "ipsetpolicies.ipsetmgr.io".into(),
        error: "IPSetPolicy watch: 404".into(),
    });
    h.send(Input::Policy(Event::Init));
    h.send(Input::Policy(Event::InitDone));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.model.set_names(),
        ["ipm4-p1", "ipm4-p2"],
        "nothing pruned"
    );
    // The CRD deleted the usual way: its objects first, the CRD event after.
    h.send(Input::Crd(
        "ipsetpolicies.ipsetmgr.io".into(),
        Event::Apply(crd("ipsetpolicies.ipsetmgr.io", false)),
    ));
    h.list(
        vec![
            policy("p1", 1, hash_ip(&["10.0.0.1"])),
            policy("p2", 1, hash_ip(&["10.0.0.2"])),
        ],
        vec![],
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.send(Input::Policy(Event::Delete(decode(
        serde_json::from_value(policy("p2", 1, hash_ip(&[]))).unwrap(),
    ))));
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.send(Input::Crd(
        "ipsetpolicies.ipsetmgr.io".into(),
        Event::Apply(crd("ipsetpolicies.ipsetmgr.io", true)),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.model.set_names(),
        ["ipm4-p1", "ipm4-p2"],
        "nothing pruned"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_api_server_never_delays_kernel_work() {
    let h = Harness::start();
    h.server.lock().unwrap().fail_writes = true;
    h.node_seen(&[]);
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1"]))], vec![]);
    eventually("applied", || h.model.members("ipm4-p1").is_some()).await;
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy("p1", 2, hash_ip(&["10.0.0.9"]))).unwrap(),
    ))));
    eventually("second generation applied", || {
        h.model.members("ipm4-p1") == Some(vec!["10.0.0.9".into()])
    })
    .await;
    eventually("the writer keeps trying", || h.status_patches().len() >= 2).await;
    // The server recovers: the latest status lands.
    h.server.lock().unwrap().fail_writes = false;
    eventually("status landed", || {
        h.policy_state("p1")
            .is_some_and(|e| e["observedGeneration"] == 2)
    })
    .await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_node_state_is_created_again() {
    let h = Harness::start();
    h.node_seen(&[]);
    h.list(vec![policy("p1", 1, hash_ip(&["10.0.0.1"]))], vec![]);
    eventually("written", || h.policy_state("p1").is_some()).await;
    h.server.lock().unwrap().objects.clear();
    tokio::time::sleep(HEARTBEAT + Duration::from_secs(1)).await;
    eventually("recreated", || h.policy_state("p1").is_some()).await;
    let creates = h.requests().iter().filter(|r| r.method == "POST").count();
    assert_eq!(creates, 2);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn only_selected_policies_are_held_and_reported() {
    let h = Harness::start();
    h.node_seen(&[("role", "core")]);
    let edge = json!({"type": "hash:net", "members": ["10.0.0.0/8"],
                      "nodeSelector": {"matchLabels": {"role": "edge"}}});
    h.list(
        vec![
            policy("edge", 1, edge),
            policy("all", 1, hash_ip(&["10.0.0.1"])),
        ],
        vec![],
    );
    eventually("reported", || h.policy_state("all").is_some()).await;
    assert!(h.policy_state("edge").is_none());
    assert!(h.model.get("ipm4-edge").is_none());
    assert_eq!(h.stored_status()["syncedText"], "1/1");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_applied_before_the_node_is_seen() {
    let model = ModelDataplane::new();
    model.create_raw(
        "ipm4-left",
        SetHeader {
            kind: SetKind::new(SetType::HashIp, Some(Family::V4)),
            max_elem: 65536,
            hash_size: None,
            options: Default::default(),
        },
    );
    let h = Harness::start_with(model);
    h.list(vec![], vec![]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.model.set_names(), ["ipm4-left"]);
    assert!(h.requests().is_empty());
    h.node_seen(&[]);
    eventually("pruned once everything is known", || {
        h.model.set_names().is_empty()
    })
    .await;
    h.stop().await;
}

/// GET `path` from the agent's health and metrics routes.
async fn get(shared: &Arc<Shared>, path: &str) -> (u16, String) {
    use tower::ServiceExt;
    let app =
        ipsetmgr_cluster::server::router(shared.clone(), ipsetmgr_cluster::server::Routes::All);
    let request = http::Request::get(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let code = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (code, String::from_utf8(body.to_vec()).unwrap())
}

/// Poll /readyz until its answer satisfies `f`.
async fn readyz_until(h: &Harness, what: &str, f: impl Fn(u16, &str) -> bool) -> String {
    for _ in 0..500 {
        let (code, body) = get(&h.shared, "/readyz").await;
        if f(code, &body) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, body) = get(&h.shared, "/readyz").await;
    panic!("timed out waiting for /readyz: {what}; it says {code} {body}");
}

#[tokio::test(start_paused = true)]
async fn readiness_names_what_it_waits_for_and_follows_the_watches() {
    let h = Harness::start();
    readyz_until(&h, "the policy list", |c, b| {
        c == 503 && b.contains("initial list of IPSetPolicies")
    })
    .await;
    h.list(vec![policy("p", 1, hash_ip(&["10.0.0.1"]))], vec![]);
    // The lists are done, the Node was never seen: readiness says so
    // (and not "waiting for the policy list").
    let body = readyz_until(&h, "the Node", |c, b| c == 503 && b.contains("Node object")).await;
    assert!(!body.contains("IPSetPolicies"), "{body}");
    h.node_seen(&[]);
    readyz_until(&h, "ready", |c, _| c == 200).await;

    // A watch fails: 503 naming it, counted by resource.
    h.send(Input::WatchError {
        resource: super::inputs::resource::POLICIES,
        error: "ipsetpolicies watch: ApiError: Internal error (500)".into(),
    });
    let body = readyz_until(&h, "not ready", |c, _| c == 503).await;
    assert!(
        body.contains("watch of ipsetpolicies failing: ipsetpolicies watch: ApiError"),
        "{body}"
    );
    let (_, metrics) = get(&h.shared, "/metrics").await;
    assert!(metrics.contains("ipsetmgr_ready 0"), "{metrics}");
    assert!(
        metrics.contains("ipsetmgr_watch_errors_total{resource=\"ipsetpolicies\"} 1"),
        "{metrics}"
    );
    // It recovers (the watcher relists): 200 again.
    h.send(Input::Policy(Event::Init));
    // A new generation where 10.0.0.2 is excepted: one member in the
    // kernel, one excepted.
    let mut spec = hash_ip(&["10.0.0.1", "10.0.0.2"]);
    spec["except"] = json!(["10.0.0.2"]);
    h.send(Input::Policy(Event::InitApply(decode(
        serde_json::from_value(policy("p", 2, spec)).unwrap(),
    ))));
    h.send(Input::Policy(Event::InitDone));
    readyz_until(&h, "ready again", |c, _| c == 200).await;

    // A watch that resumes quietly after an error: ready once the window
    // passes without another error.
    h.send(Input::WatchError {
        resource: super::inputs::resource::NODES,
        error: "nodes watch: connection reset".into(),
    });
    readyz_until(&h, "not ready", |c, _| c == 503).await;
    tokio::time::sleep(ipsetmgr_cluster::telemetry::watch_health::DEFAULT_WINDOW).await;
    readyz_until(&h, "ready after the window", |c, _| c == 200).await;
    let (_, metrics) = get(&h.shared, "/metrics").await;
    for line in [
        "ipsetmgr_ready 1",
        "ipsetmgr_policy_synced{policy=\"p\"} 1",
        "ipsetmgr_policy_kernel_members{policy=\"p\"} 1",
        "ipsetmgr_policy_excepted_members{policy=\"p\"} 1",
        "ipsetmgr_status_writes_total{result=\"success\"}",
        "ipsetmgr_apply_duration_seconds_count{outcome=\"success\"}",
        "ipsetmgr_build_info{version=",
    ] {
        assert!(metrics.contains(line), "{line} missing in {metrics}");
    }
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_api_server_is_reported_as_watch_errors_by_resource() {
    use futures::StreamExt;
    // Every list and watch answers 500.
    let client = mock_client(|_| {
        (
            500,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "etcd unavailable", "reason": "InternalError", "code": 500}),
        )
    });
    let mut inputs = super::inputs::watch_inputs(client, NODE);
    let mut failing = std::collections::BTreeSet::new();
    while failing.len() < 4 {
        let input = tokio::time::timeout(Duration::from_secs(300), inputs.next())
            .await
            .expect("an input")
            .expect("the stream goes on");
        match input {
            Input::WatchError { resource, error } => {
                assert!(error.contains("etcd unavailable"), "{error}");
                failing.insert(resource);
            }
            Input::KindNotFound { .. } => panic!("a 500 is not a missing kind"),
            _ => {}
        }
    }
    assert_eq!(
        failing.into_iter().collect::<Vec<_>>(),
        [
            "customresourcedefinitions",
            "ipsetmemberslices",
            "ipsetpolicies",
            "nodes"
        ]
    );
}

/// Log lines written while the returned guard lives (this test's thread:
/// the paused-clock runtime runs every task on it).
fn capture_logs() -> (LogBuffer, tracing::subscriber::DefaultGuard) {
    let buf = LogBuffer::default();
    let out = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || out.clone())
        .finish();
    (buf, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(start_paused = true)]
async fn a_rejection_is_logged_once_per_generation_with_its_fields() {
    let (logs, _guard) = capture_logs();
    let rejections = || -> Vec<Value> {
        logs.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"] == "policy rejected; its kernel sets are held as they are"
            })
            .collect()
    };
    let h = Harness::start();
    h.node_seen(&[]);
    h.list(vec![policy("bad", 1, hash_ip(&["10.0.0.300"]))], vec![]);
    eventually("reported", || h.policy_state("bad").is_some()).await;
    let first = rejections();
    assert_eq!(first.len(), 1, "{first:?}");
    let f = &first[0]["fields"];
    assert_eq!(f["policy"], "bad");
    assert_eq!(f["generation"], 1);
    assert_eq!(f["member"], "10.0.0.300");
    assert_eq!(f["reason"], "not a valid IP address");

    // Another recompile (a label change of the Node) of the same
    // generation: not logged again.
    h.node_seen(&[("role", "edge")]);
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy("ok", 1, hash_ip(&["10.0.0.1"]))).unwrap(),
    ))));
    eventually("recompiled", || h.policy_state("ok").is_some()).await;
    assert_eq!(rejections().len(), 1);

    // A new generation, still bad: logged once more.
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy("bad", 2, hash_ip(&["10.0.0.301"]))).unwrap(),
    ))));
    eventually("the new generation logged", || rejections().len() == 2).await;
    assert_eq!(rejections()[1]["fields"]["generation"], 2);
    h.stop().await;
}

/// A policy whose ipset name would pass ipset's 31 bytes: the ipset name is
/// shortened with a hash, the nft set carries the policy's name in full.
const LONG: &str = "a-very-long-policy-name-for-the-edge-nodes";

/// `--backend nft`: the node state names the nft set the kernel holds
/// (`ipm4-<policy>` in full), not the shortened ipset name.
#[tokio::test(start_paused = true)]
async fn with_nft_the_node_state_names_the_nft_sets() {
    let nft = ModelNft::new();
    let h = Harness::start_backend(ModelDataplane::new(), Box::new(nft_backend(&nft)), "nft");
    h.node_seen(&[]);
    h.list(
        vec![
            policy(LONG, 1, hash_ip(&["10.0.0.1", "10.0.0.2"])),
            policy("short", 1, hash_ip(&["10.0.0.3"])),
        ],
        vec![],
    );
    eventually("reported", || {
        h.policy_state(LONG).is_some_and(|p| p["synced"] == true)
    })
    .await;
    let full = format!("ipm4-{LONG}");
    let held: Vec<String> = nft
        .table(&default_table())
        .expect("the table")
        .sets
        .into_keys()
        .collect();
    assert_eq!(held, [full.clone(), "ipm4-short".to_string()]);
    let long = h.policy_state(LONG).unwrap();
    assert_eq!(long["setNames"], json!([full]), "{long}");
    assert_eq!(long["members"], 2);
    let short = h.policy_state("short").unwrap();
    assert_eq!(short["setNames"], json!(["ipm4-short"]), "{short}");
    assert!(h.model.set_names().is_empty(), "no ipset was made");
    h.stop().await;
}

/// `--backend netlink,nft`: each backend's set under its own name (the shortened
/// ipset, then the nft set in full as `nft:…`), the members counted once,
/// and a set only one backend fails to hold makes the policy unsynced,
/// naming that backend's set.
#[tokio::test(start_paused = true)]
async fn with_both_the_node_state_names_each_backends_sets() {
    let (ipsets, nft) = (ModelDataplane::new(), ModelNft::new());
    let both = Backends::new(vec![
        Box::new(
            ipsetmgr_dataplane::adapter::reconciler(ipsets.clone(), config()).with_sleep(|_| {}),
        ),
        Box::new(nft_backend(&nft)),
    ]);
    let h = Harness::start_backend(ipsets, Box::new(both), "ipset");
    h.node_seen(&[]);
    let short = Naming::default().main_set_name(LONG, Some(Family::V4));
    assert!(short.len() <= 31 && short != format!("ipm4-{LONG}"));
    // ICMP members: an ipset holds them, an nft set of ports cannot.
    let icmp = json!({"type": "hash:ip,port", "members": ["10.0.0.1,icmp:echo-request"]});
    h.list(
        vec![
            policy(LONG, 1, hash_ip(&["10.0.0.1", "10.0.0.2"])),
            policy("pings", 1, icmp),
        ],
        vec![],
    );
    eventually("reported", || {
        h.policy_state(LONG).is_some() && h.policy_state("pings").is_some()
    })
    .await;
    let long = h.policy_state(LONG).unwrap();
    assert_eq!(
        long["setNames"],
        json!([short, format!("nft:ipm4-{LONG}")]),
        "{long}"
    );
    assert_eq!(long["synced"], true, "{long}");
    assert_eq!(long["members"], 2, "not counted twice: {long}");
    let (_, metrics) = get(&h.shared, "/metrics").await;
    let line = format!("ipsetmgr_policy_kernel_members{{policy=\"{LONG}\"}} 2\n");
    assert!(metrics.contains(&line), "counted once: {metrics}");
    assert_eq!(h.model.members(&short).unwrap(), ["10.0.0.1", "10.0.0.2"]);
    let nft_sets = nft.table(&default_table()).expect("the table").sets;
    assert!(
        nft_sets.contains_key(&format!("ipm4-{LONG}")),
        "{nft_sets:?}"
    );

    let pings = h.policy_state("pings").unwrap();
    assert_eq!(
        pings["setNames"],
        json!(["ipm4-pings", "nft:ipm4-pings"]),
        "{pings}"
    );
    assert_eq!(pings["synced"], false, "{pings}");
    let error = pings["error"].as_str().unwrap();
    assert!(error.starts_with("nft:ipm4-pings: "), "{error}");
    assert!(h.model.members("ipm4-pings").is_some(), "the ipset is held");
    assert_eq!(h.stored_status()["syncedText"], "1/2");
    h.stop().await;
}
