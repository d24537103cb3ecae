//! The CRDs on real API servers, the newest and the oldest supported
//! (`crates/envtest`): `ipsetmgr crd` applied server-side must become
//! Established on both (the oldest checks CEL rules against its own, older
//! cost estimates), objects the schema must refuse are refused by the server
//! itself, naming the field, and the samples and the objects the agents and
//! the controller write are admitted.
//!
//! Without the binaries the tests skip with a message; under `CI=true` they
//! fail (scripts/envtest-assets.sh installs them).

use std::time::Duration;

use ipsetmgr_envtest::{ControlPlane, Server};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const MANAGER: &str = "ipsetmgr-crd-test";

fn crds() -> Vec<CustomResourceDefinition> {
    serde_saphyr::from_multiple(&ipsetmgr_api::crd_yaml()).expect("the CRD stream parses")
}

/// Apply every CRD server-side and wait until each is Established.
async fn install(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("the server refused CRD {name}: {e}"));
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not Established within 30 s"))
        .unwrap_or_else(|e| panic!("watching CRD {name}: {e}"));
    }
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("ipsetmgr.io", "v1alpha1", kind))
}

fn api(client: &Client, kind: &str) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource(kind))
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "ipsetmgr.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "labels": {"ipsetmgr.io/policy": "p"}},
        "spec": spec,
    }))
    .expect("a DynamicObject")
}

/// Create (dry run: nothing is stored, so names can repeat) and return the
/// server's answer.
async fn create(client: &Client, kind: &str, name: &str, spec: Value) -> Result<(), String> {
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api(client, kind)
        .create(&pp, &object(kind, name, spec))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The server refuses `spec`, and its message contains every one of `says`.
async fn refused(client: &Client, kind: &str, spec: Value, says: &[&str]) {
    match create(client, kind, "refused", spec.clone()).await {
        Ok(()) => panic!("the server admitted {kind} {spec}"),
        Err(e) => {
            for s in says {
                assert!(
                    e.contains(s),
                    "{kind} {spec}: refused, but not for {s:?}: {e}"
                );
            }
        }
    }
}

async fn admitted(client: &Client, kind: &str, name: &str, spec: Value) {
    if let Err(e) = create(client, kind, name, spec.clone()).await {
        panic!("the server refused {kind} {name} {spec}: {e}");
    }
}

/// Every sample policy of config/samples, as a user applies it.
fn samples() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/samples");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        for doc in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
            if doc["kind"] == "IPSetPolicy" {
                out.push((
                    doc["metadata"]["name"].as_str().unwrap().to_string(),
                    doc["spec"].clone(),
                ));
            }
        }
    }
    out
}

async fn check(plane: &ControlPlane) {
    let client = plane.client().await.expect("a client");
    eprintln!("crd_server: checking the CRDs on {}", plane.version());
    install(&client).await;
    // Applying the same CRDs again changes nothing and is admitted.
    install(&client).await;

    // What the schema itself refuses (enums, bounds, patterns, CEL).
    let p = "IPSetPolicy";
    refused(
        &client,
        p,
        json!({"type": "hash:foo"}),
        &["spec.type", "Unsupported value"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:ip", "family": "IPv5"}),
        &["spec.family"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:ip", "hashSize": 1048577_u64}),
        &["spec.hashSize"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:ip", "maxElem": 16777217_u64}),
        &["spec.maxElem"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:ip", "members": ["10.0.0.1\ndestroy KUBE-X"]}),
        &["spec.members[0]"],
    )
    .await;
    // The CEL rules, one case each.
    refused(
        &client,
        p,
        json!({"type": "bitmap:port", "range": "0-1023", "hashSize": 1024}),
        &["hashSize applies to hash:* types only"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "bitmap:ip"}),
        &["range is required for bitmap:* types"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "bitmap:ip", "range": "10.0.0.0/24", "maxElem": 10}),
        &["maxElem does not apply to bitmap:* types"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "bitmap:ip", "range": "10.0.0.0/24", "family": "IPv6"}),
        &["bitmap:ip holds IPv4 addresses only"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:net", "netmask": 24}),
        &["netmask and bitmask apply to hash:ip only"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:ip", "netmask": 24, "bitmask": "255.255.0.0"}),
        &["netmask and bitmask exclude each other"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:mac", "except": ["10.0.0.0/8"]}),
        &["except applies to types with an address part"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:net", "except": ["10.0.0.0/8; rm"]}),
        &["spec.except[0]"],
    )
    .await;
    let too_many: Vec<String> = (0..1025)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    refused(
        &client,
        p,
        json!({"type": "hash:net", "except": too_many}),
        &["spec.except"],
    )
    .await;
    refused(
        &client,
        p,
        json!({"type": "hash:net", "membersFrom": [{}]}),
        &["spec.membersFrom[0]"],
    )
    .await;
    refused(
        &client,
        "IPSetMemberSlice",
        json!({"members": ["10.0.0.1 ; rm"]}),
        &["spec.members[0]"],
    )
    .await;

    // What it must admit: every sample, and the edges of the bounds.
    for (name, spec) in samples() {
        admitted(&client, p, &name, spec).await;
    }
    admitted(
        &client,
        p,
        "bounds",
        json!({"type": "hash:net", "family": "Dual", "maxElem": 16777216_u64,
               "hashSize": 1048576,
               "members": ["10.0.0.0/8", "2001:db8::/32 nomatch comment:a b"]}),
    )
    .await;
    let most: Vec<String> = (0..1024)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    admitted(
        &client,
        p,
        "except-bounds",
        json!({"type": "hash:net", "except": most}),
    )
    .await;
    admitted(
        &client,
        p,
        "except",
        json!({"type": "hash:net,port", "family": "Dual", "members": ["10.0.0.0/8,tcp:80"],
               "except": ["10.1.0.0/16", "192.168.0.1", "2001:db8:ffff:ffff:ffff:ffff:ffff:0/128"]}),
    )
    .await;
    admitted(
        &client,
        "IPSetMemberSlice",
        "slice",
        json!({"members": ["10.0.0.1", "10.0.0.2 comment:x"]}),
    )
    .await;
    // The node state as an agent writes it (status subresource, so the
    // object itself has no spec to check beyond being admitted).
    let states = api(&client, "IPSetNodeState");
    let state: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": "node-a"}, "spec": {},
    }))
    .unwrap();
    states
        .create(&PostParams::default(), &state)
        .await
        .unwrap_or_else(|e| panic!("creating an IPSetNodeState: {e}"));
    let status = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": "node-a"},
        "status": {"heartbeatTime": "2026-12-01T00:00:00Z", "heartbeatIntervalSeconds": 30,
                   "agentVersion": "0.1.0",
                   "policies": [{"name": "p", "observedGeneration": 1, "synced": true,
                                 "setNames": ["ipm4-p"], "members": 3, "problems": 0}]},
    });
    states
        .patch_status(
            "node-a",
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&status),
        )
        .await
        .unwrap_or_else(|e| panic!("server-side apply of an IPSetNodeState's status: {e}"));
    let back = states.get_status("node-a").await.unwrap();
    assert_eq!(
        back.data["status"]["policies"][0]["members"], 3,
        "{:?}",
        back.data
    );
}

#[tokio::test]
async fn crds_on_the_newest_server() {
    let Some(plane) = ipsetmgr_envtest::shared("crds_on_the_newest_server", Server::Newest).await
    else {
        return;
    };
    check(plane).await;
}

#[tokio::test]
async fn crds_on_the_oldest_server() {
    let Some(plane) = ipsetmgr_envtest::shared("crds_on_the_oldest_server", Server::Oldest).await
    else {
        return;
    };
    assert_eq!(
        plane.minor(),
        25,
        "the oldest supported server is 1.25: {}",
        plane.version()
    );
    check(plane).await;
}
