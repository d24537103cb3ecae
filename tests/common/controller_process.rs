//! The controller as a process next to a real API server, as the chart runs
//! it: the binary, a kubeconfig, its own namespace and identity. Included
//! with `#[path]` by the controller's envtest tests
//! (tests/controller_slices.rs, tests/controller_lease.rs,
//! tests/controller_rbac.rs).

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ipsetmgr_api::{IPSetMemberSlice, IPSetNodeState, IPSetPolicy};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};

/// A running controller, killed when dropped (a test that failed midway
/// leaves nothing behind).
pub struct Controller(pub Child);

impl Controller {
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id() as i32)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ipsetmgr controller` against `kubeconfig`, its Lease in `namespace`,
/// logging to `log`.
pub fn start(kubeconfig: &Path, namespace: &str, identity: &str, log: &Path) -> Controller {
    start_with(kubeconfig, namespace, identity, log, &[])
}

/// [`start`] with more flags.
pub fn start_with(
    kubeconfig: &Path,
    namespace: &str,
    identity: &str,
    log: &Path,
    extra: &[&str],
) -> Controller {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string()
    };
    let child = Command::new(env!("CARGO_BIN_EXE_ipsetmgr"))
        .args(["controller", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--listen", &free(), "--health-listen", &free()])
        .args(["--namespace", namespace, "--identity", identity])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("starting the controller");
    Controller(child)
}

/// The project's CRDs, applied and Established.
pub async fn install_crds(client: &Client, manager: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        IPSetPolicy::crd(),
        IPSetMemberSlice::crd(),
        IPSetNodeState::crd(),
    ] {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&crd),
        )
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

/// The end of the controller's log, for a failure message.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
