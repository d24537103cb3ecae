//! The url sources' egress guard, end to end: a real API server, the
//! controller as a process, and decoys where an attacker would aim a feed
//! (a loopback admin page, the cloud metadata address 169.254.169.254 on
//! the namespace's loopback interface, the API server itself, a host name that resolves to
//! loopback). All of it runs in one fresh network namespace (this test's
//! thread enters it; the processes it starts inherit it).
//!
//! By default every fetch is refused before a connection is made (the
//! decoys see no request), each source's status says why, and the policy
//! is not Ready. With `--feed-allow-cidr` the fetches go through, the
//! bodies are refused as member lists, and in neither case does any byte
//! of a body reach a policy's status or an event.
//!
//! Needs root and the envtest binaries; skips with a message without them,
//! fails under `CI=true`.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ipsetmgr_api::{IPSetMemberSlice, IPSetNodeState, IPSetPolicy};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::json;

const TEST: &str = "url_sources_reach_no_internal_endpoint_and_reflect_nothing";
/// What the decoys serve; none of it may appear in any API object.
const SECRETS: [&str; 3] = [
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "admin-password-hunter2",
];

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("running ip");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A decoy HTTP server on `addr` (in this thread's namespace) that counts
/// its requests and answers every one with the secrets.
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
            let body = format!(
                "AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\npassword={}\n",
                SECRETS[0], SECRETS[1], SECRETS[2]
            );
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, hits)
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn controller(kubeconfig: &std::path::Path, log: &std::path::Path, extra: &[&str]) -> Controller {
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
        .args(["--namespace", "default", "--identity", "feed-guard-test"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("starting the controller");
    Controller(child)
}

async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        IPSetPolicy::crd(),
        IPSetMemberSlice::crd(),
        IPSetNodeState::crd(),
    ] {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply("feed-guard").force(),
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

/// Every policy and every event, as JSON: where no secret may appear.
async fn everything(client: &Client) -> String {
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    let events: Api<Event> = Api::all(client.clone());
    let p = policies.list(&ListParams::default()).await.unwrap();
    let e = events.list(&ListParams::default()).await.unwrap();
    format!(
        "{}\n{}",
        serde_json::to_string(&p.items).unwrap(),
        serde_json::to_string(&e.items).unwrap()
    )
}

fn assert_no_secrets(text: &str, phase: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{phase}: {s:?} reached the API:\n{text}");
    }
    assert!(
        !text.contains("AWS_SECRET"),
        "{phase}: body text reached the API:\n{text}"
    );
}

/// The first source's error of each policy, once every one has one that
/// contains `want`.
async fn source_errors(
    client: &Client,
    names: &[&str],
    want: &str,
    log: &std::path::Path,
) -> Vec<String> {
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let mut errors = Vec::new();
        for n in names {
            let p = policies.get(n).await.unwrap();
            let e = p
                .status
                .as_ref()
                .and_then(|s| s.sources.first())
                .and_then(|s| s.error.clone())
                .unwrap_or_default();
            errors.push(e);
        }
        if errors.iter().all(|e| e.contains(want)) {
            return errors;
        }
        if start.elapsed() > Duration::from_secs(60) {
            panic!(
                "no {want:?} in every source error after 60 s: {errors:#?}\n--- controller log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[test]
fn url_sources_reach_no_internal_endpoint_and_reflect_nothing() {
    if !nix::unistd::geteuid().is_root() {
        ipsetmgr_envtest::cannot_run(TEST, &"needs root (a fresh network namespace)");
        return;
    }
    if let Err(missing) = ipsetmgr_envtest::Binaries::find(ipsetmgr_envtest::Server::Newest) {
        ipsetmgr_envtest::cannot_run(TEST, &missing);
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    sh(&["ip", "link", "set", "lo", "up"]);
    // The metadata address on loopback (this kernel has no dummy
    // interfaces; any interface of the namespace can carry it).
    sh(&["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"]);
    let (meta_port, meta_hits) = decoy("169.254.169.254:0");
    // Not 127.0.0.1: that is the API server's address here.
    let (loop_port, loop_hits) = decoy("127.0.0.3:0");

    // One thread: the runtime's sockets, the API server and the controller
    // are all in this namespace.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let plane = ipsetmgr_envtest::ControlPlane::start(ipsetmgr_envtest::Server::Newest)
            .await
            .expect("the API server");
        let client = plane.client().await.unwrap();
        install_crds(&client).await;
        let api_port = plane.url().rsplit(':').next().unwrap().to_string();
        let feeds = [
            (
                "metadata",
                format!(
                    "http://169.254.169.254:{meta_port}/latest/meta-data/iam/security-credentials/"
                ),
            ),
            (
                "loopback",
                format!("http://127.0.0.3:{loop_port}/admin/secret"),
            ),
            (
                "by-name",
                format!("http://localhost:{loop_port}/admin/secret"),
            ),
            (
                "api-server",
                format!("https://127.0.0.1:{api_port}/api/v1/namespaces/kube-system/secrets"),
            ),
        ];
        let policies: Api<IPSetPolicy> = Api::all(client.clone());
        for (name, url) in &feeds {
            let body = json!({
                "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
                "metadata": {"name": name},
                "spec": {"type": "hash:net", "membersFrom": [{"url": {"url": url}}]},
            });
            policies
                .patch(
                    name,
                    &PatchParams::apply("feed-guard"),
                    &Patch::Apply(&body),
                )
                .await
                .unwrap();
        }
        let names: Vec<&str> = feeds.iter().map(|(n, _)| *n).collect();

        // 1. Defaults: refused before connecting, saying why.
        let log = plane.dir().join("controller-1.log");
        let c = controller(plane.kubeconfig(), &log, &[]);
        let errors = source_errors(&client, &names, "refused by the egress guard", &log).await;
        assert!(
            errors[0].contains("169.254.169.254 is link-local"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].contains("127.0.0.3 is a loopback address"),
            "{}",
            errors[1]
        );
        assert!(
            errors[2].contains("localhost resolves to")
                && (errors[2].contains("127.0.0.1") || errors[2].contains("::1")),
            "{}",
            errors[2]
        );
        assert!(
            errors[3].contains("an address of the API server"),
            "{}",
            errors[3]
        );
        assert_eq!(
            meta_hits.load(Ordering::SeqCst),
            0,
            "the metadata decoy was reached"
        );
        assert_eq!(
            loop_hits.load(Ordering::SeqCst),
            0,
            "the loopback decoy was reached"
        );
        for n in &names {
            let p = policies.get(n).await.unwrap();
            let ready = p
                .status
                .as_ref()
                .unwrap()
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned();
            let ready = ready.expect("a Ready condition");
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                ("False", "SourcesNotDelivered"),
                "{n}: {ready:?}"
            );
        }
        assert_no_secrets(&everything(&client).await, "refused by default");
        drop(c);

        // 2. Allowed by the flag: fetched, refused as member lists, and
        // still nothing of the bodies in the API. A range that contains the
        // API server's address does not open it: localhost and the API
        // server stay refused.
        let log = plane.dir().join("controller-2.log");
        let _c = controller(
            plane.kubeconfig(),
            &log,
            &["--feed-allow-cidr", "169.254.169.254/32,127.0.0.0/8"],
        );
        let errors = source_errors(&client, &names[..2], "line 1: ", &log).await;
        let still = source_errors(&client, &names[2..], "an address of the API server", &log).await;
        assert_eq!(still.len(), 2);
        for e in &errors {
            assert!(e.contains("not a valid") || e.contains("host name"), "{e}");
        }
        assert!(
            meta_hits.load(Ordering::SeqCst) > 0,
            "the metadata decoy was not fetched"
        );
        assert!(
            loop_hits.load(Ordering::SeqCst) > 0,
            "the loopback decoy was not fetched"
        );
        assert_no_secrets(&everything(&client).await, "allowed by --feed-allow-cidr");
        let log_text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !log_text.contains(SECRETS[2]),
            "the log quotes more than the first bad line"
        );
        plane.stop();
    });
}
