//! The controller keeps the member slices it materialises (issue 30, item
//! 8): one deleted by hand, or edited by hand, is written again within a
//! few seconds, not only when its source next changes. A real API server,
//! the controller as a process, a `nodes` source over one Node.
//!
//! Needs the envtest binaries; skips with a message without them, fails
//! under `CI=true`.

use std::time::{Duration, Instant};

use ipsetmgr_api::{IPSetMemberSlice, IPSetPolicy};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[path = "common/controller_process.rs"]
mod controller_process;

const TEST: &str = "a_deleted_or_edited_materialised_slice_is_written_again";
const MANAGER: &str = "controller-slices-test";
const POLICY: &str = "slice-keeper";
/// `<policy>-src<index>-<i>-of-<n>` (crates/controller/src/materialise.rs).
const SLICE: &str = "slice-keeper-src0-0-of-1";
const ADDRESS: &str = "10.80.0.1";
/// How soon a slice must be back.
const WITHIN: Duration = Duration::from_secs(5);

/// The slice's members, `None` while it does not exist.
async fn members(slices: &Api<IPSetMemberSlice>) -> Option<Vec<String>> {
    slices.get_opt(SLICE).await.unwrap().map(|s| s.spec.members)
}

/// How long until the slice holds exactly the Node's address (looked at
/// for up to 30 s, so a failure says how late it was).
async fn back(slices: &Api<IPSetMemberSlice>) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let now = members(slices).await;
        if now.as_deref() == Some(&[ADDRESS.to_string()][..]) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("after 30 s the slice holds {now:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_deleted_or_edited_materialised_slice_is_written_again() {
    let Some(plane) = ipsetmgr_envtest::shared(TEST, ipsetmgr_envtest::Server::Newest).await else {
        return;
    };
    let client = plane.client().await.unwrap();
    controller_process::install_crds(&client, MANAGER).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "slice-keeper-node"},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "slice-keeper-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": ADDRESS}]}});
    nodes
        .patch_status(
            "slice-keeper-node",
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    let policy = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
        "metadata": {"name": POLICY},
        "spec": {"type": "hash:ip", "family": "IPv4", "membersFrom": [{"nodes": {}}]},
    });
    policies
        .patch(POLICY, &PatchParams::apply(MANAGER), &Patch::Apply(&policy))
        .await
        .unwrap();

    let log = plane.dir().join("controller-slices.log");
    let _controller = controller_process::start(plane.kubeconfig(), "default", "slices-test", &log);
    let slices: Api<IPSetMemberSlice> = Api::all(client.clone());
    let first = back(&slices).await.unwrap_or_else(|e| {
        panic!(
            "the controller never materialised {SLICE}: {e}\n--- controller log:\n{}",
            controller_process::log_tail(&log, 40)
        )
    });
    eprintln!("{TEST}: {SLICE} materialised in {first:.1?}");

    // 1. Deleted by hand, a moment after it was written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    slices
        .delete(SLICE, &DeleteParams::default())
        .await
        .unwrap();
    let took = back(&slices).await;
    eprintln!("{TEST}: after a delete, back in {took:.1?}");
    match took {
        Ok(t) if t <= WITHIN => {}
        other => panic!(
            "a deleted slice must be back within {WITHIN:?}: {other:?}\n--- controller log:\n{}",
            controller_process::log_tail(&log, 40)
        ),
    }

    // 2. Its members edited by hand (another field manager).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let edit = json!({"spec": {"members": ["192.0.2.99"]}});
    slices
        .patch(
            SLICE,
            &PatchParams {
                field_manager: Some("a-human".into()),
                ..Default::default()
            },
            &Patch::Merge(&edit),
        )
        .await
        .unwrap();
    assert_eq!(
        members(&slices).await.as_deref(),
        Some(&["192.0.2.99".to_string()][..]),
        "the edit took"
    );
    let took = back(&slices).await;
    eprintln!("{TEST}: after an edit, back in {took:.1?}");
    match took {
        Ok(t) if t <= WITHIN => {}
        other => panic!(
            "an edited slice must be back within {WITHIN:?}: {other:?}\n--- controller log:\n{}",
            controller_process::log_tail(&log, 40)
        ),
    }
}
