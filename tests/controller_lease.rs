//! The controller gives its Lease up on SIGTERM (issue 29, item 4): within
//! a few seconds of the signal the Lease names no holder, so another
//! replica, or the next install, takes it at once instead of waiting out
//! its duration, even while the controller is busy writing: the signal
//! comes while it writes the first statuses of 400 policies (paced, 20 ms
//! apart). A real API server, the controller as a process.
//!
//! Needs the envtest binaries; skips with a message without them, fails
//! under `CI=true`.

use std::time::{Duration, Instant};

use ipsetmgr_api::IPSetPolicy;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams};
use nix::sys::signal::{Signal, kill};
use serde_json::json;

#[path = "common/controller_process.rs"]
mod controller_process;

const TEST: &str = "sigterm_releases_the_lease_within_seconds";
const MANAGER: &str = "controller-lease-test";
const LEASE: &str = "ipsetmgr-controller";
const IDENTITY: &str = "lease-test";
const WITHIN: Duration = Duration::from_secs(5);
/// Enough policies that writing their first statuses takes the writer
/// well over `WITHIN`.
const POLICIES: usize = 400;

/// The Lease's holder; `None` when it names none or is gone.
async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

#[tokio::test]
async fn sigterm_releases_the_lease_within_seconds() {
    let Some(plane) = ipsetmgr_envtest::shared(TEST, ipsetmgr_envtest::Server::Newest).await else {
        return;
    };
    let client = plane.client().await.unwrap();
    controller_process::install_crds(&client, MANAGER).await;
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    for i in 0..POLICIES {
        let name = format!("lease-busy-{i}");
        let body = json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": name},
            "spec": {"type": "hash:ip", "members": [format!("10.81.{}.{}", i / 250, i % 250 + 1)]},
        });
        policies
            .patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&body))
            .await
            .unwrap();
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let log = plane.dir().join("controller-lease.log");
    let mut controller = controller_process::start(plane.kubeconfig(), "default", IDENTITY, &log);

    let start = Instant::now();
    while holder(&leases).await.as_deref() != Some(IDENTITY) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the controller never held the Lease\n--- controller log:\n{}",
            controller_process::log_tail(&log, 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Leading and writing: the first statuses are on the server.
    while !policies
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|p| p.status.is_some())
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the controller wrote no status\n--- controller log:\n{}",
            controller_process::log_tail(&log, 40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    kill(controller.pid(), Signal::SIGTERM).unwrap();
    let signalled = Instant::now();
    let released = loop {
        if holder(&leases).await.is_none() {
            break Ok(signalled.elapsed());
        }
        if signalled.elapsed() > Duration::from_secs(40) {
            break Err(format!(
                "after 40 s the Lease still names {:?}",
                holder(&leases).await
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exited = loop {
        if let Some(status) = controller.0.try_wait().unwrap() {
            break Ok((signalled.elapsed(), status));
        }
        if signalled.elapsed() > Duration::from_secs(40) {
            break Err("still running 40 s after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("{TEST}: Lease released {released:.2?} after SIGTERM; exited {exited:.2?}");
    match released {
        Ok(t) if t <= WITHIN => {}
        other => panic!(
            "the Lease must name no holder within {WITHIN:?} of SIGTERM: {other:?}\n--- controller log:\n{}",
            controller_process::log_tail(&log, 40)
        ),
    }
    let (_, status) = exited.unwrap();
    assert!(
        status.success(),
        "the controller exits 0 on SIGTERM: {status}"
    );
}
