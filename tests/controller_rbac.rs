//! The controller as a process under its own ServiceAccount, with exactly
//! the roles of config/rbac (the source of truth the chart renders), against
//! a real API server:
//!
//! - a pods source the controller may not list (no `memberSources.pods`):
//!   the policy's status says why in a sentence (reason, HTTP code, the
//!   server's message and the chart value to set), never a Rust debug dump
//!   of the API's Status;
//! - the url egress guard knows the API server's endpoint addresses (the
//!   EndpointSlices of Service `default/kubernetes`, which the controller
//!   may read in `default` only) and follows them when they change: an
//!   allowed range holding such an address does not open it.
//!
//! Needs the envtest binaries (and root for the guard's network
//! namespace); skips with a message without them, fails under `CI=true`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ipsetmgr_api::IPSetPolicy;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use serde_json::{Value, json};

#[path = "common/controller_process.rs"]
mod controller_process;

const MANAGER: &str = "controller-rbac-test";
/// config/rbac's namespace and the controller's ServiceAccount there.
const NAMESPACE: &str = "ipsetmgr-system";
const ACCOUNT: &str = "ipsetmgr-controller";

fn controller(kubeconfig: &Path, log: &Path, extra: &[&str]) -> controller_process::Controller {
    controller_process::start_with(kubeconfig, NAMESPACE, "controller-rbac-test", log, extra)
}

async fn apply_one(client: &Client, doc: &Value) {
    let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", doc["apiVersion"].as_str().unwrap()),
    };
    let kind = doc["kind"].as_str().unwrap();
    let name = doc["metadata"]["name"].as_str().unwrap();
    let (resource, caps) = pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
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
    .unwrap_or_else(|e| panic!("the server refused {kind} {name}: {e}"));
}

/// The controller's ServiceAccount with config/rbac's roles and bindings as
/// they are, and a kubeconfig with a token of it.
async fn controller_account(client: &Client, plane: &ipsetmgr_envtest::ControlPlane) -> PathBuf {
    apply_one(
        client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )
    .await;
    apply_one(
        client,
        &json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}}),
    )
    .await;
    for file in ["config/rbac/role.yaml", "config/rbac/role_binding.yaml"] {
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for d in docs.iter().filter(|d| !d.is_null()) {
            apply_one(client, d).await;
        }
    }
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request(ACCOUNT, &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let path = plane.dir().join("controller.kubeconfig");
    plane.write_kubeconfig(&path, ACCOUNT, &token).unwrap();
    path
}

async fn apply_policy(client: &Client, name: &str, spec: Value) {
    let body = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
        "metadata": {"name": name}, "spec": spec,
    });
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    policies
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(&body))
        .await
        .unwrap();
}

/// The first source's error of policy `name`, once `done` holds for it.
async fn source_error(
    client: &Client,
    name: &str,
    what: &str,
    done: impl Fn(&str) -> bool,
    log: &Path,
) -> String {
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let e = policies
            .get(name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.sources.first().and_then(|s| s.error.clone()))
            .unwrap_or_default();
        if done(&e) {
            return e;
        }
        if start.elapsed() > Duration::from_secs(60) {
            panic!(
                "{name}: no {what} after 60 s; the source's error: {e:?}\n--- controller log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn a_forbidden_source_says_so_in_a_sentence() {
    const TEST: &str = "a_forbidden_source_says_so_in_a_sentence";
    let Some(plane) = ipsetmgr_envtest::own(TEST, ipsetmgr_envtest::Server::Newest).await else {
        return;
    };
    let client = plane.client().await.unwrap();
    controller_process::install_crds(&client, MANAGER).await;
    let kubeconfig = controller_account(&client, &plane).await;
    apply_policy(
        &client,
        "web",
        json!({"type": "hash:ip",
            "membersFrom": [{"pods": {"podSelector": {"matchLabels": {"app": "web"}}}}]}),
    )
    .await;
    let log = plane.dir().join("controller.log");
    let _c = controller(&kubeconfig, &log, &[]);
    let e = source_error(
        &client,
        "web",
        "error naming memberSources.pods",
        |e| e.contains("memberSources.pods"),
        &log,
    )
    .await;
    for debug in ["Status {", "Some(", "ListMeta", "None"] {
        assert!(
            !e.contains(debug),
            "a debug dump ({debug:?}) in the status: {e}"
        );
    }
    assert!(e.contains("403"), "{e}");
    assert!(e.contains("Forbidden"), "{e}");
    assert!(e.contains("cannot list resource \"pods\""), "{e}");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log_text.contains("Status {"),
        "the controller's log has a debug dump:\n{log_text}"
    );
    plane.stop();
}

/// A decoy feed server on `addr` that counts its requests and answers with
/// a body that is no member list.
fn decoy(addr: &str) -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let body = "not-a-member\n";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, hits)
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An EndpointSlice of Service `default/kubernetes` (beside the one the API
/// server keeps itself, which it would rewrite) holding `address`.
async fn api_endpoint(client: &Client, address: &str) {
    apply_one(
        client,
        &json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes-test", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address]}],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        }),
    )
    .await;
}

/// Two url sources, to the two decoys; `round` makes a new URL, so that the
/// controller fetches at once instead of after its backoff.
async fn point_policies(client: &Client, ports: (u16, u16), round: u32) {
    for (name, addr, port) in [
        ("endpoint-one", "10.244.0.1", ports.0),
        ("endpoint-two", "10.244.0.2", ports.1),
    ] {
        let url = format!("http://{addr}:{port}/list?round={round}");
        apply_policy(
            client,
            name,
            json!({"type": "hash:net", "membersFrom": [{"url": {"url": url}}]}),
        )
        .await;
    }
}

const API_SERVER: &str = "an address of the API server";

#[test]
fn the_guard_follows_the_api_servers_endpoints() {
    const TEST: &str = "the_guard_follows_the_api_servers_endpoints";
    if !nix::unistd::geteuid().is_root() {
        ipsetmgr_envtest::cannot_run(TEST, &"needs root (a fresh network namespace)");
        return;
    }
    if let Err(missing) = ipsetmgr_envtest::Binaries::find(ipsetmgr_envtest::Server::Newest) {
        ipsetmgr_envtest::cannot_run(TEST, &missing);
        return;
    }
    // This thread's own namespace: the decoys, the API server and the
    // controller are all in it.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    sh(&["ip", "link", "set", "lo", "up"]);
    sh(&["ip", "addr", "add", "10.244.0.1/32", "dev", "lo"]);
    sh(&["ip", "addr", "add", "10.244.0.2/32", "dev", "lo"]);
    let (one, one_hits) = decoy("10.244.0.1:0");
    let (two, two_hits) = decoy("10.244.0.2:0");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let plane = ipsetmgr_envtest::ControlPlane::start(ipsetmgr_envtest::Server::Newest)
            .await
            .expect("the API server");
        let client = plane.client().await.unwrap();
        controller_process::install_crds(&client, MANAGER).await;
        let kubeconfig = controller_account(&client, &plane).await;
        api_endpoint(&client, "10.244.0.1").await;
        point_policies(&client, (one, two), 1).await;
        let log = plane.dir().join("controller.log");
        // The range holds both decoys, and the API server's endpoint.
        let _c = controller(&kubeconfig, &log, &["--feed-allow-cidr", "10.244.0.0/16"]);

        // The endpoint is refused; the other address of the range fetched.
        let e = source_error(
            &client,
            "endpoint-one",
            "refusal",
            |e| e.contains(API_SERVER),
            &log,
        )
        .await;
        assert!(e.contains("10.244.0.1"), "{e}");
        source_error(
            &client,
            "endpoint-two",
            "fetch",
            |e| e.contains("line 1: "),
            &log,
        )
        .await;
        assert_eq!(
            one_hits.load(Ordering::SeqCst),
            0,
            "the endpoint was reached"
        );
        assert!(
            two_hits.load(Ordering::SeqCst) > 0,
            "the other decoy was not fetched"
        );

        // The API server moves: the guard follows.
        api_endpoint(&client, "10.244.0.2").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = two_hits.load(Ordering::SeqCst);
        point_policies(&client, (one, two), 2).await;
        let e = source_error(
            &client,
            "endpoint-two",
            "refusal",
            |e| e.contains(API_SERVER),
            &log,
        )
        .await;
        assert!(e.contains("10.244.0.2"), "{e}");
        source_error(
            &client,
            "endpoint-one",
            "fetch",
            |e| e.contains("line 1: "),
            &log,
        )
        .await;
        assert!(
            one_hits.load(Ordering::SeqCst) > 0,
            "the old endpoint was not fetched"
        );
        assert_eq!(
            two_hits.load(Ordering::SeqCst),
            before,
            "the new endpoint was reached"
        );
        let log_text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !log_text.contains("cannot read the API server's EndpointSlices"),
            "config/rbac does not let the controller read them:\n{log_text}"
        );
        plane.stop();
    });
}
