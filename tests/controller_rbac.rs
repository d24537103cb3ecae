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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipsetmgr_api::{IPSetMemberSlice, IPSetNodeState, IPSetPolicy};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};

const MANAGER: &str = "controller-rbac-test";
/// config/rbac's namespace and the controller's ServiceAccount there.
const NAMESPACE: &str = "ipsetmgr-system";
const ACCOUNT: &str = "ipsetmgr-controller";

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn controller(kubeconfig: &Path, log: &Path, extra: &[&str]) -> Controller {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_ipsetmgr"))
        .args(["controller", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--listen", &listen, "--health-listen", &listen])
        .args(["--namespace", NAMESPACE, "--identity", "controller-rbac-test"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("starting the controller");
    Controller(child)
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
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(doc))
        .await
        .unwrap_or_else(|e| panic!("the server refused {kind} {name}: {e}"));
}

async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        IPSetPolicy::crd(),
        IPSetMemberSlice::crd(),
        IPSetNodeState::crd(),
    ] {
        let name = crd.name_any();
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd))
            .await
            .unwrap();
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap()
        .unwrap();
    }
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
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
            .unwrap();
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
    install_crds(&client).await;
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
        assert!(!e.contains(debug), "a debug dump ({debug:?}) in the status: {e}");
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
