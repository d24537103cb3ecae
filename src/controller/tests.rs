//! Controller tests against a mock API server (tower-test), on tokio's
//! paused clock. Inputs are fed directly, as the watches would deliver them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use super::event_loop::{Controller, Settings};
use super::inputs::Input;
use super::metrics::ControllerShared;
use super::writer::{WriterSettings, run_writer};
use crate::cluster::mock_api::{Req, eventually, mock_client};
use crate::cluster::tolerant::decode;
use crate::ipset::Naming;

fn mock_api(log: Arc<Mutex<Vec<Req>>>) -> Client {
    mock_client(move |r| {
        let answer = match r.method.as_str() {
            "PATCH" | "POST" => (200, r.body.clone()),
            "DELETE" => (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
            _ => (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "code": 404, "reason": "NotFound"}),
            ),
        };
        log.lock().unwrap().push(r);
        answer
    })
}

struct Harness {
    inputs: UnboundedSender<Input>,
    leader: watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    log: Arc<Mutex<Vec<Req>>>,
}

const TICK: Duration = Duration::from_secs(10);

impl Harness {
    fn start(leading: bool) -> Harness {
        let log = Arc::new(Mutex::new(Vec::new()));
        let client = mock_api(log.clone());
        let mut settings = Settings::new(Naming::default());
        settings.debounce = Duration::from_millis(10);
        settings.tick = TICK;
        let shared = ControllerShared::new(TICK);
        let (leader_tx, leader) = watch::channel(leading);
        let (plans_tx, plans_rx) = watch::channel(Default::default());
        let (jobs_tx, jobs_rx) = mpsc::channel(64);
        tokio::spawn(run_writer(
            client,
            WriterSettings {
                identity: "c-0".into(),
                per_policy_interval: Duration::from_millis(100),
                pacing: Duration::from_millis(1),
                request_timeout: Duration::from_secs(2),
            },
            plans_rx,
            jobs_rx,
            leader.clone(),
            shared.clone(),
        ));
        let controller = Controller::new(settings, plans_tx, jobs_tx, leader, shared);
        let (tx, rx) = unbounded();
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(controller.run(rx, async move {
            let _ = stop_rx.await;
        }));
        Harness {
            inputs: tx,
            leader: leader_tx,
            stop: Some(stop),
            task,
            log,
        }
    }

    fn send(&self, input: Input) {
        self.inputs.unbounded_send(input).unwrap();
    }

    /// Initial lists of all four kinds.
    fn list(
        &self,
        policies: Vec<Value>,
        slices: Vec<Value>,
        states: Vec<Value>,
        nodes: &[(&str, &[(&str, &str)])],
    ) {
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
        self.send(Input::NodeState(Event::Init));
        for s in states {
            self.send(Input::NodeState(Event::InitApply(decode(
                serde_json::from_value(s).unwrap(),
            ))));
        }
        self.send(Input::NodeState(Event::InitDone));
        self.send(Input::Node(Event::Init));
        for (name, labels) in nodes {
            self.send(Input::Node(Event::InitApply(node(name, labels))));
        }
        self.send(Input::Node(Event::InitDone));
    }

    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    fn status_writes(&self, policy: &str) -> Vec<Req> {
        let path = format!("/apis/ipsetmgr.io/v1alpha1/ipsetpolicies/{policy}/status");
        self.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path == path)
            .collect()
    }

    fn last_status(&self, policy: &str) -> Value {
        self.status_writes(policy)
            .last()
            .map_or(Value::Null, |r| r.body["status"].clone())
    }

    fn events(&self) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .collect()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("controller stops")
            .unwrap();
    }
}

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let labels: std::collections::BTreeMap<&str, &str> = labels.iter().copied().collect();
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn policy(name: &str, generation: i64, spec: Value) -> Value {
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
        "metadata": {"name": name, "generation": generation, "uid": format!("uid-{name}"),
                     "resourceVersion": format!("{generation}")},
        "spec": spec,
    })
}

/// A heartbeat this many seconds before now.
fn beat(ago: i64) -> String {
    let t = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(ago);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn state(node: &str, rv: &str, ago: i64, entries: Value) -> Value {
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": node, "resourceVersion": rv},
        "spec": {},
        "status": {"heartbeatTime": beat(ago), "heartbeatIntervalSeconds": 60, "policies": entries},
    })
}

/// A node state entry for a policy without slices at `generation`.
fn entry(policy: &str, generation: i64, synced: bool) -> Value {
    let uid = format!("uid-{policy}");
    let revision = crate::cluster::slices::members_revision(Some(&uid), generation, &[]);
    json!({"name": policy, "observedGeneration": generation, "revision": revision,
           "synced": synced, "problems": 1})
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[tokio::test(start_paused = true)]
async fn ready_follows_the_nodes_at_the_current_generation() {
    let h = Harness::start(true);
    h.list(
        vec![policy(
            "p",
            3,
            json!({"type": "hash:ip", "members": ["10.0.0.1", "10.0.0.2"]}),
        )],
        vec![],
        vec![
            state("a", "1", 5, json!([entry("p", 3, true)])),
            state("b", "1", 5, json!([entry("p", 2, true)])),
        ],
        &[("a", &[]), ("b", &[])],
    );
    eventually("status written", || !h.status_writes("p").is_empty()).await;
    let w = &h.status_writes("p")[0];
    assert_eq!(w.content_type, "application/apply-patch+yaml");
    assert!(
        w.query.contains("fieldManager=ipsetmgr-controller"),
        "{}",
        w.query
    );
    assert!(w.query.contains("force=true"), "{}", w.query);
    assert_eq!(w.body["metadata"], json!({"name": "p"}));
    assert_eq!(
        w.body.as_object().unwrap().len(),
        4,
        "only status: {}",
        w.body
    );
    let s = h.last_status("p");
    assert_eq!(s["observedGeneration"], 3);
    assert_eq!(condition(&s, "Valid")["status"], "True");
    assert_eq!(condition(&s, "Ready")["status"], "False");
    assert_eq!(condition(&s, "Ready")["observedGeneration"], 3);
    assert_eq!(s["summary"]["syncedText"], "1/2");
    assert_eq!(s["summary"]["failingNodes"], json!(["b"]));
    assert_eq!(s["summary"]["members"], 2);
    assert_eq!(s["summary"]["problems"], 2);

    // b catches up: Ready.
    h.send(Input::NodeState(Event::Apply(decode(
        serde_json::from_value(state("b", "2", 1, json!([entry("p", 3, true)]))).unwrap(),
    ))));
    eventually("ready", || {
        condition(&h.last_status("p"), "Ready")["status"] == "True"
    })
    .await;
    assert_eq!(h.last_status("p")["summary"]["syncedText"], "2/2");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_agent_is_not_synced_and_nothing_is_rewritten_while_nothing_changes() {
    let h = Harness::start(true);
    let p = policy("p", 1, json!({"type": "hash:ip"}));
    h.list(
        vec![p.clone()],
        vec![],
        vec![state("a", "1", 0, json!([entry("p", 1, true)]))],
        &[("a", &[])],
    );
    eventually("ready", || {
        condition(&h.last_status("p"), "Ready")["status"] == "True"
    })
    .await;
    // The server shows that status: ticks go by, nothing is written.
    let mut shown = p.clone();
    shown["status"] = h.last_status("p");
    shown["metadata"]["resourceVersion"] = json!("2");
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(shown).unwrap(),
    ))));
    let before = h.status_writes("p").len();
    tokio::time::sleep(TICK * 5).await;
    assert_eq!(
        h.status_writes("p").len(),
        before,
        "no write without a change"
    );
    // The agent stops refreshing its node state: after three heartbeat
    // intervals (60 s each) by the controller's clock, it is not synced.
    tokio::time::sleep(Duration::from_secs(180)).await;
    eventually("stale", || {
        condition(&h.last_status("p"), "Ready")["status"] == "False"
    })
    .await;
    let ready = condition(&h.last_status("p"), "Ready").clone();
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("a (heartbeat stale)"),
        "{ready}"
    );
    // The watch brings the written status back, as the API server would.
    let mut shown = p.clone();
    shown["status"] = h.last_status("p");
    shown["metadata"]["resourceVersion"] = json!("3");
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(shown).unwrap(),
    ))));
    // A heartbeat: synced again.
    h.send(Input::NodeState(Event::Apply(decode(
        serde_json::from_value(state("a", "3", 0, json!([entry("p", 1, true)]))).unwrap(),
    ))));
    eventually("fresh again", || {
        condition(&h.last_status("p"), "Ready")["status"] == "True"
    })
    .await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slice_change_is_waited_for_like_a_spec_change() {
    let h = Harness::start(true);
    let slice = |rv: &str, members: &[&str]| {
        json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
            "metadata": {"name": "p-0", "resourceVersion": rv, "labels": {"ipsetmgr.io/policy": "p"}},
            "spec": {"members": members}
        })
    };
    let revision = |rv: &str| {
        let s = crate::policy::compile::SliceInput {
            name: "p-0",
            version: rv,
            members: Err(""),
        };
        crate::cluster::slices::members_revision(Some("uid-p"), 1, &[s])
    };
    let node_entry = |rv: &str| json!([{"name": "p", "observedGeneration": 1, "revision": revision(rv), "synced": true}]);
    h.list(
        vec![policy("p", 1, json!({"type": "hash:ip"}))],
        vec![slice("10", &["10.0.0.1"])],
        vec![state("a", "1", 0, node_entry("10"))],
        &[("a", &[])],
    );
    eventually("ready", || {
        condition(&h.last_status("p"), "Ready")["status"] == "True"
    })
    .await;
    assert_eq!(h.last_status("p")["summary"]["members"], 1);
    // The slice changes; the policy's generation does not.
    h.send(Input::Slice(Event::Apply(decode(
        serde_json::from_value(slice("11", &["10.0.0.1", "10.0.0.2"])).unwrap(),
    ))));
    eventually("not ready until the node has it", || {
        condition(&h.last_status("p"), "Ready")["status"] == "False"
    })
    .await;
    assert!(
        condition(&h.last_status("p"), "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("older members")
    );
    h.send(Input::NodeState(Event::Apply(decode(
        serde_json::from_value(state("a", "2", 0, node_entry("11"))).unwrap(),
    ))));
    eventually("ready again", || {
        condition(&h.last_status("p"), "Ready")["status"] == "True"
    })
    .await;
    assert_eq!(h.last_status("p")["summary"]["members"], 2);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_invalid_policy_gets_one_warning_event() {
    let h = Harness::start(true);
    h.list(
        vec![policy("bad", 1, json!({"type": "hash:ip", "members": ["10.0.0.1"]}))],
        vec![json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
            "metadata": {"name": "bad-0", "resourceVersion": "4", "labels": {"ipsetmgr.io/policy": "bad"}},
            "spec": {"members": ["10.0.0.2", "example.com"]}
        })],
        vec![],
        &[("a", &[])],
    );
    eventually("status written", || !h.status_writes("bad").is_empty()).await;
    let s = h.last_status("bad");
    let valid = condition(&s, "Valid");
    assert_eq!(valid["status"], "False");
    assert_eq!(valid["reason"], "InvalidPolicy");
    let msg = valid["message"].as_str().unwrap();
    assert!(
        msg.contains("slice \"bad-0\": member \"example.com\" rejected"),
        "{msg}"
    );
    assert_eq!(condition(&s, "Ready")["status"], "False");
    eventually("event", || h.events().len() == 1).await;
    let ev = &h.events()[0].body;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["reason"], "InvalidPolicy");
    assert_eq!(ev["regarding"]["name"], "bad");
    assert_eq!(ev["reportingController"], "ipsetmgr-controller");
    // Re-evaluations do not repeat it.
    tokio::time::sleep(TICK * 3).await;
    assert_eq!(h.events().len(), 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn node_states_of_nodes_that_are_gone_are_deleted() {
    let h = Harness::start(true);
    h.list(
        vec![],
        vec![],
        vec![
            state("a", "1", 5, json!([])),
            state("ghost", "1", 5, json!([])),
        ],
        &[("a", &[])],
    );
    let deleted = |h: &Harness| {
        h.requests()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .map(|r| r.path)
            .collect::<Vec<_>>()
    };
    eventually("deleted", || !deleted(&h).is_empty()).await;
    assert_eq!(
        deleted(&h),
        ["/apis/ipsetmgr.io/v1alpha1/ipsetnodestates/ghost"]
    );
    // The Node was looked up first (the mock server says 404).
    let asked = h
        .requests()
        .iter()
        .any(|r| r.method == "GET" && r.path == "/api/v1/nodes/ghost");
    assert!(asked, "the Node is checked before its state is deleted");
    tokio::time::sleep(TICK * 2).await;
    assert_eq!(deleted(&h).len(), 1, "asked once");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn only_the_leader_writes() {
    let h = Harness::start(false);
    h.list(
        vec![policy("p", 1, json!({"type": "hash:ip"}))],
        vec![],
        vec![],
        &[],
    );
    tokio::time::sleep(TICK * 2).await;
    assert!(h.requests().is_empty(), "a standby writes nothing");
    h.leader.send(true).unwrap();
    eventually("written by the new leader", || {
        !h.status_writes("p").is_empty()
    })
    .await;
    let s = h.last_status("p");
    assert_eq!(condition(&s, "Ready")["reason"], "NoNodesSelected");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn selectors_decide_which_nodes_count() {
    let h = Harness::start(true);
    h.list(
        vec![policy(
            "edge",
            1,
            json!({"type": "hash:ip", "nodeSelector": {"matchLabels": {"role": "edge"}}}),
        )],
        vec![],
        vec![state("e1", "1", 5, json!([entry("edge", 1, true)]))],
        &[("e1", &[("role", "edge")]), ("c1", &[("role", "core")])],
    );
    eventually("ready", || {
        condition(&h.last_status("edge"), "Ready")["status"] == "True"
    })
    .await;
    assert_eq!(h.last_status("edge")["summary"]["syncedText"], "1/1");
    h.stop().await;
}
