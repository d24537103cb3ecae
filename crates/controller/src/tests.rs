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

use super::event_loop::{Controller, Settings, SourceChannels};
use super::inputs::{Input, Needs};
use super::metrics::ControllerShared;
use super::slice_writer::{SliceWriterSettings, run_slice_writer};
use super::writer::{WriterSettings, run_writer};
use ipsetmgr_cluster::mock_api::{Req, eventually, mock_client};
use ipsetmgr_cluster::tolerant::decode;
use ipsetmgr_ipset::Naming;

fn mock_api(log: Arc<Mutex<Vec<Req>>>) -> Client {
    mock_client(move |r| {
        let answer = match r.method.as_str() {
            // A status apply carries no spec; the server's answer (the whole
            // object) does, and the client decodes it.
            "PATCH" if r.path.ends_with("/status") && r.path.contains("/ipsetpolicies/") => {
                let mut body = r.body.clone();
                body["spec"] = json!({"type": "hash:ip"});
                (200, body)
            }
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
    needs: watch::Receiver<Needs>,
    /// The url sources the fetcher is asked for (it is not run here: feed
    /// outcomes are sent as inputs).
    feeds: watch::Receiver<Arc<super::feeds::FeedJobs>>,
}

const TICK: Duration = Duration::from_secs(10);

impl Harness {
    fn start(leading: bool) -> Harness {
        Harness::start_paced(leading, Duration::ZERO)
    }

    /// With count-only status changes paced at `summary_interval`.
    fn start_paced(leading: bool, summary_interval: Duration) -> Harness {
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
            client.clone(),
            WriterSettings {
                identity: "c-0".into(),
                per_policy_interval: Duration::from_millis(100),
                summary_interval,
                pacing: Duration::from_millis(1),
                request_timeout: Duration::from_secs(2),
            },
            plans_rx,
            jobs_rx,
            leader.clone(),
            shared.clone(),
        ));
        let (slices_tx, slices_rx) = watch::channel(Default::default());
        let (needs_tx, needs) = watch::channel(Needs::default());
        let (feeds_tx, feeds) = watch::channel(Default::default());
        tokio::spawn(run_slice_writer(
            client.clone(),
            SliceWriterSettings {
                per_slice_interval: Duration::from_secs(1),
                request_timeout: Duration::from_secs(2),
            },
            slices_rx,
            leader.clone(),
            shared.clone(),
        ));
        let channels = SourceChannels {
            slices: slices_tx,
            needs: needs_tx,
            feeds: feeds_tx,
        };
        let controller = Controller::new(settings, plans_tx, jobs_tx, leader, shared, channels);
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
            needs,
            feeds,
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
    let revision = ipsetmgr_policy::revision::members_revision(Some(&uid), generation, &[]);
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
async fn the_summary_counts_the_members_except_dropped_or_cut() {
    let h = Harness::start(true);
    h.list(
        vec![policy(
            "p",
            1,
            json!({"type": "hash:net", "members": ["10.0.0.0/8", "10.1.2.0/24", "192.0.2.1"],
                   "except": ["10.1.0.0/16"]}),
        )],
        vec![],
        vec![state("a", "1", 5, json!([entry("p", 1, true)]))],
        &[("a", &[])],
    );
    eventually("status written", || !h.status_writes("p").is_empty()).await;
    let s = h.last_status("p");
    // 10.1.2.0/24 dropped, 10.0.0.0/8 cut: 10.1.0.0/16 nomatch added.
    assert_eq!(s["summary"]["excepted"], 2, "{s}");
    assert_eq!(s["summary"]["members"], 3, "{s}");
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
        let s = ipsetmgr_policy::compile::SliceInput {
            name: "p-0",
            version: rv,
            members: Err(ipsetmgr_policy::compile::NoMembers::Unreadable("")),
        };
        ipsetmgr_policy::revision::members_revision(Some("uid-p"), 1, &[s])
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

// ---- membersFrom: sources materialised into slices ----

const SLICES: &str = "/apis/ipsetmgr.io/v1alpha1/ipsetmemberslices";

fn addressed_node(name: &str, labels: &[(&str, &str)], addrs: &[(&str, &str)]) -> Node {
    let labels: std::collections::BTreeMap<&str, &str> = labels.iter().copied().collect();
    let addresses: Vec<Value> = addrs
        .iter()
        .map(|(t, a)| json!({"type": t, "address": a}))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
                                  "status": {"addresses": addresses}}))
    .unwrap()
}

fn pod(name: &str, ns: &str, labels: Value, ip: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": []},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}]}
    }))
    .unwrap()
}

impl Harness {
    fn slice_writes(&self) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with(SLICES) && (r.method == "PATCH" || r.method == "DELETE"))
            .collect()
    }

    fn applied(&self, name: &str) -> Vec<Req> {
        let path = format!("{SLICES}/{name}");
        self.slice_writes()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path == path)
            .collect()
    }

    fn last_members(&self, name: &str) -> Vec<String> {
        let w = self.applied(name);
        let body = &w.last().expect("applied").body;
        serde_json::from_value(body["spec"]["members"].clone()).unwrap()
    }

    /// The watch brings an applied slice back, as the API server would.
    fn echo(&self, name: &str, rv: u32) {
        let mut body = self.applied(name).last().unwrap().body.clone();
        body["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.send(Input::Slice(Event::Apply(decode(
            serde_json::from_value(body).unwrap(),
        ))));
    }

    fn pods_listed(&self, pods: Vec<k8s_openapi::api::core::v1::Pod>) {
        self.send(Input::Pod(Event::Init));
        for p in pods {
            self.send(Input::Pod(Event::InitApply(p)));
        }
        self.send(Input::Pod(Event::InitDone));
    }
}

fn list_with_nodes(h: &Harness, policies: Vec<Value>, slices: Vec<Value>, nodes: Vec<Node>) {
    h.list(policies, slices, vec![], &[]);
    // Replace the empty Node list with addressed Nodes.
    h.send(Input::Node(Event::Init));
    for n in nodes {
        h.send(Input::Node(Event::InitApply(n)));
    }
    h.send(Input::Node(Event::InitDone));
}

#[tokio::test(start_paused = true)]
async fn a_nodes_source_is_written_as_an_owned_slice_and_follows_address_changes() {
    let h = Harness::start(true);
    let p = policy(
        "nodes",
        1,
        json!({"type": "hash:ip", "family": "Dual", "membersFrom": [{"nodes": {"selector": {"matchLabels": {"pool": "a"}}}}]}),
    );
    list_with_nodes(
        &h,
        vec![p],
        vec![],
        vec![
            addressed_node(
                "a",
                &[("pool", "a")],
                &[
                    ("InternalIP", "10.0.0.2"),
                    ("InternalIP", "fd00::2"),
                    ("Hostname", "a"),
                ],
            ),
            addressed_node(
                "b",
                &[("pool", "a")],
                &[("InternalIP", "10.0.0.1"), ("ExternalIP", "203.0.113.1")],
            ),
            addressed_node("c", &[("pool", "b")], &[("InternalIP", "10.0.0.3")]),
        ],
    );
    let name = "nodes-src0-0-of-1";
    // (The harness lists no Nodes first: that is an empty slice, then this.)
    eventually("slice applied", || {
        !h.applied(name).is_empty() && h.last_members(name).len() == 3
    })
    .await;
    let w = h.applied(name).last().cloned().unwrap();
    let w = &w;
    assert_eq!(w.content_type, "application/apply-patch+yaml");
    assert!(
        w.query.contains("fieldManager=ipsetmgr-controller") && w.query.contains("force=true"),
        "{}",
        w.query
    );
    assert_eq!(h.last_members(name), ["10.0.0.1", "10.0.0.2", "fd00::2"]);
    let meta = &w.body["metadata"];
    assert_eq!(meta["labels"]["ipsetmgr.io/policy"], "nodes");
    assert_eq!(meta["labels"]["ipsetmgr.io/source"], "0");
    assert_eq!(
        meta["labels"]["app.kubernetes.io/managed-by"],
        "ipsetmgr-controller"
    );
    let owner = &meta["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["name"].as_str(),
            owner["uid"].as_str()
        ),
        (Some("IPSetPolicy"), Some("nodes"), Some("uid-nodes"))
    );
    assert_eq!(owner["controller"], true);
    assert!(
        owner.get("blockOwnerDeletion").is_none_or(Value::is_null),
        "{owner}"
    );
    h.echo(name, 100);
    // Unchanged sources write nothing, tick after tick.
    tokio::time::sleep(TICK * 3).await;
    assert_eq!(
        h.applied(name).len(),
        1,
        "nothing rewritten while nothing changes"
    );
    let s = h.last_status("nodes");
    assert_eq!(s["sources"][0]["kind"], "nodes");
    assert_eq!(s["sources"][0]["members"], 3);
    assert_eq!(condition(&s, "SourcesSynced")["status"], "True");
    // A node's address changes: the slice follows.
    h.send(Input::Node(Event::Apply(addressed_node(
        "b",
        &[("pool", "a")],
        &[("InternalIP", "10.0.0.9")],
    ))));
    eventually("rewritten", || h.applied(name).len() == 2).await;
    assert_eq!(h.last_members(name), ["10.0.0.2", "10.0.0.9", "fd00::2"]);
    h.echo(name, 101);
    // The source is removed from the spec: its slice is deleted.
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy("nodes", 2, json!({"type": "hash:ip"}))).unwrap(),
    ))));
    eventually("deleted", || {
        h.slice_writes().iter().any(|r| r.method == "DELETE")
    })
    .await;
    let deletes: Vec<String> = h
        .slice_writes()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.path)
        .collect();
    assert_eq!(deletes, [format!("{SLICES}/{name}")]);
    assert!(!h.needs.borrow().pods, "no Pod watch for a nodes source");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn pods_are_watched_only_when_needed_and_add_delete_relabel_update_the_slice() {
    let h = Harness::start(true);
    let spec = json!({"type": "hash:ip", "membersFrom": [{"pods": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "payments"}},
        "podSelector": {"matchLabels": {"app": "db"}}}}]});
    h.list(vec![], vec![], vec![], &[]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        *h.needs.borrow(),
        Needs::default(),
        "nothing watched without a source"
    );
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy("db", 1, spec)).unwrap(),
    ))));
    eventually("pods and namespaces needed", || {
        let n = *h.needs.borrow();
        n.pods && n.namespaces && !n.services
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        h.slice_writes().is_empty(),
        "nothing written before the Pods are listed"
    );
    h.send(Input::Namespace(Event::Init));
    let ns = |name: &str| -> k8s_openapi::api::core::v1::Namespace {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}),
        )
        .unwrap()
    };
    h.send(Input::Namespace(Event::InitApply(ns("payments"))));
    h.send(Input::Namespace(Event::InitApply(ns("shop"))));
    h.send(Input::Namespace(Event::InitDone));
    h.pods_listed(vec![
        pod("db-0", "payments", json!({"app": "db"}), "10.1.0.1"),
        pod("web-0", "payments", json!({"app": "web"}), "10.1.0.2"),
        pod("db-0", "shop", json!({"app": "db"}), "10.2.0.1"),
    ]);
    let name = "db-src0-0-of-1";
    eventually("applied", || !h.applied(name).is_empty()).await;
    assert_eq!(h.last_members(name), ["10.1.0.1"]);
    h.echo(name, 10);
    // Add.
    h.send(Input::Pod(Event::Apply(pod(
        "db-1",
        "payments",
        json!({"app": "db"}),
        "10.1.0.3",
    ))));
    eventually("added", || h.applied(name).len() == 2).await;
    assert_eq!(h.last_members(name), ["10.1.0.1", "10.1.0.3"]);
    h.echo(name, 11);
    // Relabel: web-0 becomes a db.
    h.send(Input::Pod(Event::Apply(pod(
        "web-0",
        "payments",
        json!({"app": "db"}),
        "10.1.0.2",
    ))));
    eventually("relabelled", || h.applied(name).len() == 3).await;
    assert_eq!(h.last_members(name), ["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    h.echo(name, 12);
    // Delete.
    h.send(Input::Pod(Event::Delete(pod(
        "db-0",
        "payments",
        json!({"app": "db"}),
        "10.1.0.1",
    ))));
    eventually("deleted pod", || h.applied(name).len() == 4).await;
    assert_eq!(h.last_members(name), ["10.1.0.2", "10.1.0.3"]);
    h.echo(name, 13);
    // A status-only change of a pod (same IPs, labels): nothing written.
    tokio::time::sleep(TICK * 2).await;
    assert_eq!(h.applied(name).len(), 4);
    // The policy is deleted: the Pod watch stops.
    h.send(Input::Policy(Event::Delete(decode(
        serde_json::from_value(policy("db", 1, json!({"type": "hash:ip"}))).unwrap(),
    ))));
    eventually("pods no longer needed", || !h.needs.borrow().pods).await;
    eventually("its slice deleted", || {
        h.slice_writes().iter().any(|r| r.method == "DELETE")
    })
    .await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_a_thousand_pod_events_costs_a_bounded_number_of_slice_writes() {
    let h = Harness::start(true);
    let spec = json!({"type": "hash:ip", "membersFrom": [{"pods": {"podSelector": {"matchLabels": {"app": "web"}}}}]});
    h.list(vec![policy("web", 1, spec)], vec![], vec![], &[]);
    h.pods_listed(vec![]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // No pods: one empty slice, which tells the agents the source delivered.
    assert_eq!(h.slice_writes().len(), 1, "no pods: one empty slice");
    // 1,000 pod events over 5 seconds: 500 pods come up, half of them are
    // relabelled away again.
    for i in 0..1000u32 {
        let n = i % 500;
        let ip = format!("10.3.{}.{}", n / 250, n % 250 + 1);
        let app = if i >= 500 && n % 2 == 1 {
            "other"
        } else {
            "web"
        };
        h.send(Input::Pod(Event::Apply(pod(
            &format!("web-{n}"),
            "default",
            json!({"app": app}),
            &ip,
        ))));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = h.slice_writes().len();
    // One slice, at most one materialisation per second of debounce and one
    // write per slice per second: about 6 for 5 s of churn, never 1,000.
    assert!((1..=8).contains(&writes), "{writes} slice writes");
    let name = "web-src0-0-of-1";
    let members = h.last_members(name);
    assert_eq!(members.len(), 250, "the final state is written");
    assert!(
        members.contains(&"10.3.0.1".to_string()) && !members.contains(&"10.3.0.2".to_string())
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_users_slice_is_never_touched_and_a_failing_feed_keeps_its_slices() {
    let h = Harness::start(true);
    let spec = json!({"type": "hash:net", "membersFrom": [{"url": {"url": "https://feeds.example/level1.netset", "interval": "1h"}}]});
    let user_slice = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
        "metadata": {"name": "mine", "resourceVersion": "3", "labels": {"ipsetmgr.io/policy": "bl"}},
        "spec": {"members": ["192.0.2.0/24"]}
    });
    h.list(vec![policy("bl", 1, spec)], vec![user_slice], vec![], &[]);
    eventually("the feed is asked for", || h.feeds.borrow().len() == 1).await;
    let (key, job) = h
        .feeds
        .borrow()
        .iter()
        .next()
        .map(|(k, j)| (k.clone(), j.clone()))
        .unwrap();
    assert_eq!(key, ("bl".to_string(), 0));
    // Never delivered: valid, but not Ready, naming the source (the nodes
    // hold the policy; an empty set must not pass `kubectl wait`).
    eventually("a status", || !h.status_writes("bl").is_empty()).await;
    let s = h.last_status("bl");
    assert_eq!(condition(&s, "Valid")["status"], "True", "{s}");
    let ready = condition(&s, "Ready");
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(ready["reason"], "SourcesNotDelivered", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("membersFrom[0] (url) has not delivered"),
        "{ready}"
    );
    let good = super::feeds::FeedResult {
        spec: job.spec.clone(),
        good: Some(Arc::new(vec![
            "10.0.0.0/8".into(),
            "198.51.100.0/24".into(),
        ])),
        error: None,
    };
    h.send(Input::Feed(key.clone(), good.clone()));
    let name = "bl-src0-0-of-1";
    eventually("applied", || !h.applied(name).is_empty()).await;
    assert_eq!(h.last_members(name), ["10.0.0.0/8", "198.51.100.0/24"]);
    h.echo(name, 20);
    // Delivered: Ready (no node is selected here).
    eventually("Ready once delivered", || {
        condition(&h.last_status("bl"), "Ready")["status"] == "True"
    })
    .await;
    // The next fetch fails: the slice stays, the condition says why.
    let failed = super::feeds::FeedResult {
        error: Some(
            "https://feeds.example/level1.netset: request failed: connection refused".into(),
        ),
        ..good
    };
    h.send(Input::Feed(key, failed));
    eventually("condition", || {
        condition(&h.last_status("bl"), "SourcesSynced")["status"] == "False"
    })
    .await;
    let s = h.last_status("bl");
    let msg = condition(&s, "SourcesSynced")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("membersFrom[0] (url): https://feeds.example/level1.netset: request failed"),
        "{msg}"
    );
    assert_eq!(s["sources"][0]["members"], 2, "the last good members");
    assert!(
        s["sources"][0]["error"]
            .as_str()
            .unwrap()
            .contains("connection refused")
    );
    tokio::time::sleep(TICK * 2).await;
    let writes = h.slice_writes();
    assert!(
        writes
            .iter()
            .all(|r| r.method == "PATCH" && r.path.ends_with(name)),
        "{writes:?}"
    );
    assert_eq!(writes.len(), 1, "nothing deleted or rewritten");
    assert_eq!(condition(&s, "Valid")["status"], "True");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn invalid_sources_make_the_policy_invalid_naming_the_source() {
    let h = Harness::start(true);
    let spec =
        json!({"type": "hash:ip", "membersFrom": [{"nodes": {}}, {"file": {"path": "/etc/x"}}]});
    h.list(vec![policy("bad", 1, spec)], vec![], vec![], &[]);
    eventually("status", || !h.status_writes("bad").is_empty()).await;
    let valid = condition(&h.last_status("bad"), "Valid").clone();
    assert_eq!(valid["status"], "False");
    let msg = valid["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "policy \"bad\": membersFrom[1] (file): a file source works only in policy files"
        ),
        "{msg}"
    );
    tokio::time::sleep(TICK).await;
    assert!(
        h.slice_writes().is_empty(),
        "an invalid policy writes no slices"
    );
    h.stop().await;
}

/// Sources that become invalid: the status still has one entry per source
/// of the spec as it is now (none left over from before), the refused one
/// naming why, the others their last members (their slices are kept); and
/// SourcesSynced says so.
#[tokio::test(start_paused = true)]
async fn sources_that_become_invalid_leave_no_stale_status_entries() {
    let h = Harness::start(true);
    let url = json!({"url": {"url": "https://feeds.example/l1.netset", "interval": "1h"}});
    let other = json!({"url": {"url": "https://feeds.example/l2.netset", "interval": "1h"}});
    let third = json!({"url": {"url": "https://feeds.example/l3.netset", "interval": "1h"}});
    let spec = json!({"type": "hash:net", "membersFrom": [url, other, third]});
    h.list(vec![policy("bl", 1, spec)], vec![], vec![], &[]);
    eventually("the feeds are asked for", || h.feeds.borrow().len() == 3).await;
    let jobs: Vec<_> = h
        .feeds
        .borrow()
        .iter()
        .map(|(k, j)| (k.clone(), j.clone()))
        .collect();
    for (i, (key, job)) in jobs.into_iter().enumerate() {
        h.send(Input::Feed(
            key,
            super::feeds::FeedResult {
                spec: job.spec,
                good: Some(Arc::new(vec![format!("10.{i}.0.0/16")])),
                error: None,
            },
        ));
    }
    eventually("three entries of one member each", || {
        h.last_status("bl")["sources"]
            .as_array()
            .is_some_and(|a| a.len() == 3 && a.iter().all(|e| e["members"] == 1))
    })
    .await;

    // Now two sources, the second refused in a cluster.
    let spec = json!({"type": "hash:net", "membersFrom": [url, {"file": {"path": "/etc/l.txt"}}]});
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy("bl", 2, spec)).unwrap(),
    ))));
    eventually("Valid False", || {
        condition(&h.last_status("bl"), "Valid")["status"] == "False"
    })
    .await;
    tokio::time::sleep(TICK * 2).await;
    let s = h.last_status("bl");
    let sources = s["sources"].as_array().cloned().unwrap_or_default();
    assert_eq!(sources.len(), 2, "one entry per source now: {sources:#?}");
    assert_eq!(sources[0]["kind"], "url");
    assert_eq!(sources[0]["members"], 1, "its slices are kept");
    assert!(sources[0]["error"].is_null(), "{:?}", sources[0]);
    assert_eq!(sources[1]["kind"], "file");
    assert!(
        sources[1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("a file source works only in policy files")),
        "{:?}",
        sources[1]
    );
    let c = condition(&s, "SourcesSynced");
    assert_eq!(c["status"], "False", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("membersFrom[1] (file)"),
        "{c}"
    );
    h.stop().await;
}

/// A pods source where the controller may not list Pods (the chart grants
/// it only with memberSources.pods): the watch's 403 is in the source's
/// status, naming the value, and the policy is not Ready.
#[tokio::test(start_paused = true)]
async fn a_forbidden_source_kind_says_so_in_the_status() {
    let h = Harness::start(true);
    let spec = json!({"type": "hash:ip", "membersFrom": [{"pods": {"podSelector": {"matchLabels": {"app": "web"}}}}]});
    h.list(vec![policy("web", 1, spec)], vec![], vec![], &[]);
    eventually("pods needed", || h.needs.borrow().pods).await;
    h.send(Input::WatchError {
        resource: "pods",
        error: "pods watch: ApiError: pods is forbidden: User \"system:serviceaccount:ipsetmgr-system:ipsetmgr-controller\" cannot list resource \"pods\": Forbidden (403)".into(),
    });
    eventually("the source's error", || {
        h.last_status("web")["sources"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("memberSources.pods"))
    })
    .await;
    let s = h.last_status("web");
    assert!(
        s["sources"][0]["error"].as_str().unwrap().contains("403"),
        "{s}"
    );
    assert_eq!(condition(&s, "Ready")["status"], "False", "{s}");
    assert_eq!(
        condition(&s, "Ready")["reason"],
        "SourcesNotDelivered",
        "{s}"
    );
    assert_eq!(condition(&s, "SourcesSynced")["status"], "False", "{s}");
    h.stop().await;
}

/// Nodes converging one by one on a new revision: the policy's status is
/// written when it stops being Ready, and when it is Ready again; the counts
/// in between are paced (every write goes to every agent).
#[tokio::test(start_paused = true)]
async fn nodes_converging_cost_at_most_three_status_writes() {
    for slow in [false, true] {
        nodes_converging(slow).await;
    }
}

async fn nodes_converging(slow: bool) {
    let h = Harness::start_paced(true, Duration::from_secs(10));
    let revision = |g: i64| ipsetmgr_policy::revision::members_revision(Some("uid-p"), g, &[]);
    let entry = |g: i64| json!([{"name": "p", "observedGeneration": g, "revision": revision(g), "synced": true}]);
    let nodes = ["a", "b", "c", "d", "e", "f"];
    h.list(
        vec![policy("p", 1, json!({"type": "hash:ip"}))],
        vec![],
        nodes.iter().map(|n| state(n, "1", 0, entry(1))).collect(),
        &nodes.iter().map(|n| (*n, &[][..])).collect::<Vec<_>>(),
    );
    eventually("ready", || {
        condition(&h.last_status("p"), "Ready")["status"] == "True"
    })
    .await;
    let before = h.status_writes("p").len();
    // A new generation; then the nodes take it one by one, 200 ms apart
    // (converging within the summary interval), or 10 s apart (over a
    // minute: the counts are written once in between, not every time).
    h.send(Input::Policy(Event::Apply(decode(
        serde_json::from_value(policy(
            "p",
            2,
            json!({"type": "hash:ip", "members": ["10.0.0.1"]}),
        ))
        .unwrap(),
    ))));
    for (i, n) in nodes.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(if slow { 10_000 } else { 200 })).await;
        h.send(Input::NodeState(Event::Apply(decode(
            serde_json::from_value(state(n, &format!("{}", 10 + i), 0, entry(2))).unwrap(),
        ))));
    }
    eventually("ready at generation 2", || {
        let s = h.last_status("p");
        condition(&s, "Ready")["status"] == "True" && s["observedGeneration"] == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let writes = h.status_writes("p").len() - before;
    assert!(
        (2..=3).contains(&writes),
        "slow={slow}: {writes} status writes for one change"
    );
    assert_eq!(h.last_status("p")["summary"]["synced"], 6);
    h.stop().await;
}
