//! End-to-end tests of ipsetmgr against a real API server: one controller,
//! two agents, two kernels, checked through the Kubernetes API and through
//! the kernels themselves. The scenarios are listed in e2e/README.md.
//!
//! Gated by environment; without `IPSETMGR_E2E_KUBECONFIG` the suite is
//! skipped (and passes), saying so on stderr:
//!
//! - `IPSETMGR_E2E_KUBECONFIG`: kubeconfig of the cluster (required).
//! - `IPSETMGR_E2E_MODE`: `local` (default) creates two Node objects and runs
//!   one `ipsetmgr controller` and two `ipsetmgr agent` processes, each
//!   agent in its own network namespace as its own node (needs root, `ip`,
//!   `ipset`); `kind` expects the controller and the agents deployed
//!   (e2e/run.sh) and reads kernels with `docker exec <node> ipset save`.
//! - `IPSETMGR_E2E_NODES`: the two node names, comma-separated; default
//!   `ipsetmgr-e2e-a,ipsetmgr-e2e-b` (local) or `kind-worker,kind-worker2`.
//! - `IPSETMGR_E2E_NAMESPACE`: the controller's namespace (its Lease);
//!   default `ipsetmgr-e2e` (local, created when missing) or
//!   `ipsetmgr-system` (kind).
//! - `IPSETMGR_BIN`: the binary for local mode; default the one Cargo built
//!   for this test.
//! - `IPSETMGR_E2E_TIMEOUT`: seconds each bounded wait may take (default 300).
//!
//! Written against documented API semantics only: the CRDs are applied
//! server-side and awaited Established; statuses are read from the objects
//! (status subresource); every expectation is polled until a deadline, all
//! of one step's facts together in each round (policy status, node states
//! and kernels come through different watches, in no guaranteed order), and
//! the last observation is printed when the deadline passes. A 404 is only
//! ever read as "gone" for one named object, never as "no objects".

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipsetmgr_api::{
    IPSetMemberSlice, IPSetMemberSliceSpec, IPSetNodeState, IPSetNodeStateStatus, IPSetPolicy,
    IPSetPolicySpec, POLICY_LABEL, PolicyState, StatusSummary,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::json;

/// The field manager of everything this suite writes.
const MANAGER: &str = "ipsetmgr-e2e";
/// On every object the suite creates, so leftovers of an aborted run can be
/// found and removed.
const OWNED: &str = "ipsetmgr-e2e/owned";
/// Node labels the policies select on.
const MEMBER: &str = "ipsetmgr-e2e/member";
const ROLE: &str = "ipsetmgr-e2e/role";
const GHOST: &str = "ipsetmgr-e2e/ghost";
/// A Node without an agent (local mode), for node-state clean-up.
const GHOST_NODE: &str = "ipsetmgr-e2e-ghost";
/// What the controller's Lease and Events are called (the contract).
const CONTROLLER: &str = "ipsetmgr-controller";
const CONTROLLER_IDENTITY: &str = "ipsetmgr-e2e-controller";
/// Agent intervals in local mode: short, so that waits stay short.
const RESYNC: &str = "2s";
const HEARTBEAT_SECONDS: i64 = 5;
/// Policies of this suite are named `e2e-*`; their kernel sets `ipm?-e2e-*`.
const POLICY_PREFIX: &str = "e2e-";
/// A set outside ipsetmgr's names (not `ipm*`), used to pin one of its sets.
const HOLD_SET: &str = "e2ehold";
/// Where the url scenario serves its feed: a loopback address that is not
/// the API server's, allowed to the controller by `--feed-allow-cidr`.
const FEED_ADDRESS: &str = "127.0.0.2";

// --- environment ------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Local,
    Kind,
}

#[derive(Clone, Debug)]
struct Env {
    kubeconfig: String,
    mode: Mode,
    nodes: [String; 2],
    namespace: String,
    bin: String,
    timeout: Duration,
    log_dir: PathBuf,
}

impl Env {
    /// From the environment, for the cluster of `kubeconfig`.
    fn from_env(kubeconfig: String) -> Env {
        let mode = match std::env::var("IPSETMGR_E2E_MODE").as_deref() {
            Ok("kind") => Mode::Kind,
            Ok("local") | Err(_) => Mode::Local,
            Ok(other) => panic!("IPSETMGR_E2E_MODE={other}: use local or kind"),
        };
        let (nodes, namespace) = match mode {
            Mode::Local => ("ipsetmgr-e2e-a,ipsetmgr-e2e-b", "ipsetmgr-e2e"),
            Mode::Kind => ("kind-worker,kind-worker2", "ipsetmgr-system"),
        };
        let nodes = std::env::var("IPSETMGR_E2E_NODES").unwrap_or_else(|_| nodes.into());
        let v: Vec<String> = nodes.split(',').map(|s| s.trim().to_string()).collect();
        assert!(
            v.len() == 2 && v[0] != v[1] && v.iter().all(|n| !n.is_empty()),
            "IPSETMGR_E2E_NODES={nodes}: give two different node names"
        );
        let timeout = match std::env::var("IPSETMGR_E2E_TIMEOUT") {
            Ok(s) => s
                .parse()
                .unwrap_or_else(|_| panic!("IPSETMGR_E2E_TIMEOUT={s}: seconds")),
            // Generous: a passing run waits only as long as it needs, and on
            // a loaded 2-core machine (CI beside other builds) a million
            // members took more than 90 s to reach both nodes.
            Err(_) => 300,
        };
        Env {
            kubeconfig,
            mode,
            nodes: [v[0].clone(), v[1].clone()],
            namespace: std::env::var("IPSETMGR_E2E_NAMESPACE").unwrap_or_else(|_| namespace.into()),
            // Cargo builds the package's binary for its integration tests.
            bin: std::env::var("IPSETMGR_BIN")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ipsetmgr").into()),
            timeout: Duration::from_secs(timeout),
            log_dir: Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-logs"),
        }
    }
}

/// Progress and skip messages straight to the process's stderr: libtest
/// captures `print!`/`eprint!` of passing tests, and a skip, or a wait that
/// takes a minute, should be visible while it happens.
fn say(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "e2e: {msg}");
}

async fn client(kubeconfig: &str) -> Result<Client, String> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| format!("{kubeconfig}: {e}"))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{kubeconfig}: {e}"))?;
    Client::try_from(cfg).map_err(|e| e.to_string())
}

fn apply() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Whether `e` is the API saying that the object `name` does not exist (not
/// that the resource type is unknown, which is also a 404).
fn is_gone(e: &kube::Error, name: &str) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found()
        && s.details.as_ref().is_some_and(|d| d.name == name))
}

// --- kernels ----------------------------------------------------------------

fn netns(node: &str) -> String {
    // Network namespace names are file names: keep them short and simple.
    // The process id keeps two runs on one machine (two checkouts) out of
    // each other's kernels: one's start-up clean-up deleted the other's.
    format!(
        "ipme2e-{}-{}",
        std::process::id(),
        node.trim_start_matches("ipsetmgr-e2e-")
    )
}

/// `ipset ARGS` in the node's kernel.
fn ipset_command(env: &Env, node: &str, args: &[&str]) -> Command {
    let mut c = match env.mode {
        Mode::Local => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &netns(node), "ipset"]);
            c
        }
        Mode::Kind => {
            let mut c = Command::new("docker");
            c.args(["exec", node, "ipset"]);
            c
        }
    };
    c.args(args).stdin(Stdio::null());
    c
}

async fn ipset(env: &Env, node: &str, args: &[&str]) -> Result<std::process::Output, String> {
    tokio::process::Command::from(ipset_command(env, node, args))
        .output()
        .await
        .map_err(|e| format!("{node}: running ipset {}: {e}", args.join(" ")))
}

/// One kernel set as `ipset save` prints it.
#[derive(Debug, PartialEq, Eq)]
struct KernelSet {
    set_type: String,
    members: BTreeSet<String>,
}

fn parse_save(text: &str, set: &str) -> Result<KernelSet, String> {
    let mut set_type = None;
    let mut members = BTreeSet::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next()) {
            (Some("create"), Some(name)) if name == set => {
                set_type = w.next().map(str::to_string);
            }
            (Some("add"), Some(name)) if name == set => {
                // The rest of the line is the member: "10.0.0.0/8 nomatch".
                members.insert(w.collect::<Vec<_>>().join(" "));
            }
            _ => {}
        }
    }
    let set_type = set_type.ok_or_else(|| format!("no `create {set}` line in ipset save"))?;
    Ok(KernelSet { set_type, members })
}

/// "n members", and when they differ from `want`, a few of the differences.
fn diff(have: &BTreeSet<String>, want: &BTreeSet<String>) -> String {
    let missing: Vec<_> = want.difference(have).take(5).collect();
    let extra: Vec<_> = have.difference(want).take(5).collect();
    format!(
        "{} members, want {} (missing {} e.g. {missing:?}; unexpected {} e.g. {extra:?})",
        have.len(),
        want.len(),
        want.difference(have).count(),
        have.difference(want).count()
    )
}

fn strings<S: AsRef<str>>(v: impl IntoIterator<Item = S>) -> BTreeSet<String> {
    v.into_iter().map(|s| s.as_ref().to_string()).collect()
}

/// `n` distinct IPv4 addresses `10.<second>.x.y`, from index `from`.
fn addresses(second: u8, from: u32, n: u32) -> Vec<String> {
    (from..from + n)
        .map(|i| format!("10.{second}.{}.{}", i / 250, i % 250 + 1))
        .collect()
}

// --- processes and clean-up --------------------------------------------------

/// A process the suite started, its output in a log file.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(f) = File::open(path) else {
        return format!("({} unreadable)", path.display());
    };
    let all: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn stop(mut procs: Vec<Proc>) {
    // SIGTERM: each process shuts down cleanly (the agents leave the kernel
    // as it is, the controller may hand its Lease back).
    for p in &procs {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline
        && procs
            .iter_mut()
            .any(|p| matches!(p.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in &mut procs {
        if matches!(p.child.try_wait(), Ok(None)) {
            say(format!("{} ignored SIGTERM for 10s: killing it", p.name));
            let _ = p.child.kill();
        }
        let _ = p.child.wait();
    }
}

/// Everything the suite must undo, on every path: its Drop removes the test
/// objects, destroys the hold sets, stops the processes and deletes the
/// network namespaces. It runs on a thread of its own with its own runtime
/// and client, because it may run while the test's runtime is unwinding.
struct Guard {
    env: Env,
    procs: Mutex<Vec<Proc>>,
    /// (node, set) of outside references the suite created in a kernel.
    holds: Mutex<Vec<(String, String)>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let env = self.env.clone();
        let procs = std::mem::take(self.procs.get_mut().unwrap_or_else(|e| e.into_inner()));
        let holds = std::mem::take(self.holds.get_mut().unwrap_or_else(|e| e.into_inner()));
        let cleanup = std::thread::spawn(move || cleanup(&env, procs, &holds));
        if cleanup.join().is_err() {
            say(
                "clean-up panicked; some test objects may be left (they carry the label ipsetmgr-e2e/owned)",
            );
        }
    }
}

/// One clean-up step: bounded, and reported rather than fatal; "already
/// gone" is fine.
async fn step<T>(what: &str, name: &str, f: impl Future<Output = kube::Result<T>>) {
    match tokio::time::timeout(Duration::from_secs(15), f).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if is_gone(&e, name) => {}
        Ok(Err(e)) => say(format!("clean-up: {what}: {e}")),
        Err(_) => say(format!("clean-up: {what}: timed out")),
    }
}

fn cleanup(env: &Env, procs: Vec<Proc>, holds: &[(String, String)]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for clean-up");
    let client = rt.block_on(async {
        match tokio::time::timeout(Duration::from_secs(15), client(&env.kubeconfig)).await {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => {
                say(format!("clean-up: no client: {e}"));
                None
            }
            Err(_) => {
                say("clean-up: no client within 15s");
                None
            }
        }
    });
    // 1. Policies and slices first, while the agents still run: in kind mode
    // they then remove the kernel sets themselves.
    if let Some(c) = &client {
        rt.block_on(async {
            let owned = ListParams::default().labels(&format!("{OWNED}=true"));
            let dp = DeleteParams::default();
            let p: Api<IPSetPolicy> = Api::all(c.clone());
            let s: Api<IPSetMemberSlice> = Api::all(c.clone());
            step(
                "deleting test policies",
                "",
                p.delete_collection(&dp, &owned),
            )
            .await;
            step("deleting test slices", "", s.delete_collection(&dp, &owned)).await;
            delete_pods(c).await;
        });
    }
    // 2. Outside references to this suite's sets: without them the agents
    // can destroy the sets.
    for (node, set) in holds {
        let _ = ipset_command(env, node, &["destroy", set])
            .stderr(Stdio::null())
            .status();
    }
    if env.mode == Mode::Kind {
        // The kind nodes outlive the suite: give the agents a moment to
        // remove the sets of the deleted policies, and say if they did not.
        let left = || -> Vec<String> {
            let mut left = Vec::new();
            for n in &env.nodes {
                if let Ok(o) = ipset_command(env, n, &["list", "-n"]).output() {
                    let names = String::from_utf8_lossy(&o.stdout).into_owned();
                    left.extend(
                        names
                            .lines()
                            .filter(|s| is_suite_set(s))
                            .map(|s| format!("{n}:{s}")),
                    );
                }
            }
            left
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !left().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        if !left().is_empty() {
            say(format!(
                "clean-up: kernel sets still present after 30s: {:?}",
                left()
            ));
        }
    }
    // 3. The processes (local mode).
    stop(procs);
    // 4. Nodes: local mode deletes its fake ones and their node states (the
    // controller is stopped by now, and a bare API server has no garbage
    // collector); kind mode takes its labels back from the real ones.
    if let Some(c) = &client {
        rt.block_on(async {
            let nodes: Api<Node> = Api::all(c.clone());
            let states: Api<IPSetNodeState> = Api::all(c.clone());
            let dp = DeleteParams::default();
            match env.mode {
                Mode::Local => {
                    for n in env.nodes.iter().map(String::as_str).chain([GHOST_NODE]) {
                        step(&format!("deleting Node {n}"), n, nodes.delete(n, &dp)).await;
                        step(
                            &format!("deleting IPSetNodeState {n}"),
                            n,
                            states.delete(n, &dp),
                        )
                        .await;
                    }
                }
                Mode::Kind => {
                    for n in &env.nodes {
                        // Applying nothing gives up every field this manager
                        // owned: the suite's labels go, the node's others stay.
                        let body =
                            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}});
                        let what = format!("removing the suite's labels from {n}");
                        step(&what, n, nodes.patch(n, &apply(), &Patch::Apply(&body))).await;
                    }
                }
            }
        });
    }
    // 5. Network namespaces (local mode): everything in their kernels goes.
    if env.mode == Mode::Local {
        for n in &env.nodes {
            let _ = Command::new("ip")
                .args(["netns", "del", &netns(n)])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn is_suite_set(name: &str) -> bool {
    // ipm4-e2e-x, ipm6-e2e-x, ipmx-e2e-x
    name.starts_with("ipm") && name.get(4..).is_some_and(|s| s.starts_with("-e2e-"))
}

// --- the harness ------------------------------------------------------------

struct Harness {
    env: Env,
    client: Client,
    policies: Api<IPSetPolicy>,
    slices: Api<IPSetMemberSlice>,
    states: Api<IPSetNodeState>,
    nodes: Api<Node>,
    guard: Guard,
    /// The suite's own API server (local mode without a kubeconfig), which
    /// the restart scenario stops and starts. Declared after `guard`: fields
    /// drop in order, and the clean-up needs the server.
    plane: Option<ipsetmgr_envtest::ControlPlane>,
}

impl Harness {
    async fn new(env: Env, plane: Option<ipsetmgr_envtest::ControlPlane>) -> Harness {
        let client = client(&env.kubeconfig)
            .await
            .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
        Harness {
            plane,
            policies: Api::all(client.clone()),
            slices: Api::all(client.clone()),
            states: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            guard: Guard {
                env: env.clone(),
                procs: Mutex::new(Vec::new()),
                holds: Mutex::new(Vec::new()),
            },
            client,
            env,
        }
    }

    fn node(&self, i: usize) -> &str {
        &self.env.nodes[i]
    }

    /// Fail the test: the message, then the tail of every process's log.
    fn fail(&self, msg: impl std::fmt::Display) -> ! {
        let procs = self.guard.procs.lock().unwrap_or_else(|e| e.into_inner());
        let mut logs = String::new();
        for p in procs.iter() {
            logs += &format!(
                "\n--- last lines of {} ({}):\n{}",
                p.name,
                p.log.display(),
                tail(&p.log, 40)
            );
        }
        drop(procs);
        panic!("{msg}{logs}");
    }

    /// A process that died is a failure now, not a timeout later.
    fn check_processes(&self) {
        let mut dead = Vec::new();
        for p in self
            .guard
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
        {
            if let Ok(Some(status)) = p.child.try_wait() {
                dead.push(format!("{} exited ({status})", p.name));
            }
        }
        if !dead.is_empty() {
            self.fail(dead.join("; "));
        }
    }

    /// Poll `check` until it holds; fail with its last answer at the deadline.
    async fn eventually(
        &self,
        what: &str,
        mut check: impl AsyncFnMut() -> Result<(), String>,
    ) -> Duration {
        let start = Instant::now();
        loop {
            self.check_processes();
            let last = match check().await {
                Ok(()) => return start.elapsed(),
                Err(e) => e,
            };
            if start.elapsed() > self.env.timeout {
                self.fail(format!(
                    "timed out after {:?} waiting for {what}\nlast observed: {last}",
                    self.env.timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// `check` holds at every poll for `how_long`.
    async fn steadily(
        &self,
        what: &str,
        how_long: Duration,
        mut check: impl AsyncFnMut() -> Result<(), String>,
    ) {
        let start = Instant::now();
        while start.elapsed() < how_long {
            self.check_processes();
            if let Err(e) = check().await {
                self.fail(format!(
                    "{what}: stopped holding after {:?}: {e}",
                    start.elapsed()
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn scenario(&self, id: &str, title: &str, body: impl Future<Output = ()>) {
        say(format!("{id}. {title}"));
        let start = Instant::now();
        body.await;
        say(format!("{id}. ok ({:.1}s)", start.elapsed().as_secs_f64()));
    }

    // --- setup ---------------------------------------------------------------

    async fn install_crds(&self) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for crd in [
            IPSetPolicy::crd(),
            IPSetMemberSlice::crd(),
            IPSetNodeState::crd(),
        ] {
            let name = crd.name_any();
            crds.patch(&name, &apply(), &Patch::Apply(&crd))
                .await
                .unwrap_or_else(|e| self.fail(format!("applying CRD {name}: {e}")));
            match tokio::time::timeout(
                self.env.timeout,
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => self.fail(format!("watching CRD {name}: {e}")),
                Err(_) => self.fail(format!("CRD {name} not Established in time")),
            }
        }
    }

    /// Leftovers of an aborted run would make this run's checks ambiguous
    /// (node-state entries are keyed by policy name only).
    async fn remove_leftovers(&self) {
        let owned = ListParams::default().labels(&format!("{OWNED}=true"));
        let dp = DeleteParams::default();
        if let Err(e) = self.policies.delete_collection(&dp, &owned).await {
            self.fail(format!("deleting leftover policies: {e}"));
        }
        if let Err(e) = self.slices.delete_collection(&dp, &owned).await {
            self.fail(format!("deleting leftover slices: {e}"));
        }
        delete_pods(&self.client).await;
        if self.env.mode == Mode::Local {
            for n in self
                .env
                .nodes
                .iter()
                .map(String::as_str)
                .chain([GHOST_NODE])
            {
                match self.states.delete(n, &dp).await {
                    Ok(_) => {}
                    Err(e) if is_gone(&e, n) => {}
                    Err(e) => self.fail(format!("deleting leftover IPSetNodeState {n}: {e}")),
                }
            }
            match self.nodes.delete(GHOST_NODE, &dp).await {
                Ok(_) => {}
                Err(e) if is_gone(&e, GHOST_NODE) => {}
                Err(e) => self.fail(format!("deleting leftover Node {GHOST_NODE}: {e}")),
            }
            for n in &self.env.nodes {
                let _ = Command::new("ip")
                    .args(["netns", "del", &netns(n)])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        self.eventually("no leftover test policies or slices", async || {
            let p = self.policies.list_metadata(&owned).await;
            let s = self.slices.list_metadata(&owned).await;
            match (p, s) {
                (Ok(p), Ok(s)) if p.items.is_empty() && s.items.is_empty() => Ok(()),
                (Ok(p), Ok(s)) => Err(format!(
                    "{} policies and {} slices still listed",
                    p.items.len(),
                    s.items.len()
                )),
                (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
            }
        })
        .await;
    }

    async fn label_node(&self, name: &str, role: &str) {
        let mut labels = BTreeMap::from([(MEMBER, "yes"), (ROLE, role)]);
        if self.env.mode == Mode::Local {
            labels.insert(OWNED, "true");
        }
        let body = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
        });
        self.nodes
            .patch(name, &apply(), &Patch::Apply(&body))
            .await
            .unwrap_or_else(|e| self.fail(format!("applying Node {name}: {e}")));
    }

    fn spawn(&self, name: &str, args: &[&str]) {
        let log = self.env.log_dir.join(format!("{name}.log"));
        let out = File::create(&log)
            .unwrap_or_else(|e| self.fail(format!("creating {}: {e}", log.display())));
        let err = out.try_clone().expect("a second handle of the log");
        let mut cmd = Command::new(&self.env.bin);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| self.fail(format!("starting {name} ({}): {e}", self.env.bin)));
        say(format!(
            "started {name} (pid {}), log {}",
            child.id(),
            log.display()
        ));
        self.guard
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Proc {
                name: name.to_string(),
                child,
                log,
            });
    }

    /// Local mode: the controller's namespace, two Nodes, one controller and
    /// one agent per node in its own network namespace.
    async fn start_local(&self) {
        if !Path::new(&self.env.bin).exists() {
            self.fail(format!(
                "{} not found: build it or set IPSETMGR_BIN",
                self.env.bin
            ));
        }
        std::fs::create_dir_all(&self.env.log_dir).expect("the log directory");
        let ns: Api<Namespace> = Api::all(self.client.clone());
        let body = json!({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": self.env.namespace}});
        // Applied, never deleted: on an API server without the namespace
        // controller a deleted namespace stays Terminating for good.
        ns.patch(&self.env.namespace, &apply(), &Patch::Apply(&body))
            .await
            .unwrap_or_else(|e| self.fail(format!("applying Namespace: {e}")));
        self.label_node(self.node(0), "edge").await;
        self.label_node(self.node(1), "core").await;

        let port = || {
            // Free now; the listeners share the host's network namespace
            // (only the kernel side enters --netns), so each needs its own.
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.to_string())
                .expect("a free port")
        };
        let kubeconfig = self.env.kubeconfig.as_str();
        let listen = port();
        self.spawn(
            "controller",
            &[
                "controller",
                "--kubeconfig",
                kubeconfig,
                "--listen",
                &listen,
                // One listener for metrics and health (several processes
                // share this network namespace: no default port).
                "--health-listen",
                &listen,
                "--namespace",
                &self.env.namespace,
                "--identity",
                CONTROLLER_IDENTITY,
                // The url scenario's feed: this one loopback address only
                // (the API server listens on 127.0.0.1).
                "--feed-allow-cidr",
                FEED_ADDRESS,
            ],
        );
        let heartbeat = format!("{HEARTBEAT_SECONDS}s");
        for n in [self.node(0), self.node(1)] {
            let listen = port();
            let ns = netns(n);
            self.spawn(
                &format!("agent-{n}"),
                &[
                    "--netns",
                    &ns,
                    "agent",
                    "--node-name",
                    n,
                    "--kubeconfig",
                    kubeconfig,
                    "--listen",
                    &listen,
                    "--health-listen",
                    &listen,
                    "--resync-interval",
                    RESYNC,
                    "--heartbeat-interval",
                    &heartbeat,
                    // Short waits for the suite (the default paces writes
                    // for 5,000 nodes).
                    "--node-state-interval",
                    "1s",
                ],
            );
        }
    }

    /// The controller holds its Lease, each agent reports its node state
    /// (owned by its Node, with a heartbeat), and no kernel or node state
    /// still has anything of a previous run.
    async fn wait_ready(&self) {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.env.namespace);
        self.eventually("the controller's Lease", async || {
            let l = leases
                .get(CONTROLLER)
                .await
                .map_err(|e| format!("Lease {}/{CONTROLLER}: {e}", self.env.namespace))?;
            let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            match self.env.mode {
                Mode::Local if holder != CONTROLLER_IDENTITY => {
                    Err(format!("held by {holder:?}, want {CONTROLLER_IDENTITY}"))
                }
                _ if holder.is_empty() => Err("no holder".into()),
                _ => Ok(()),
            }
        })
        .await;
        for node in [self.node(0), self.node(1)] {
            self.eventually(&format!("the IPSetNodeState of {node}"), async || {
                let n = self.nodes.get(node).await.map_err(|e| e.to_string())?;
                let s = self
                    .states
                    .get(node)
                    .await
                    .map_err(|e| format!("IPSetNodeState {node}: {e}"))?;
                let owned = s.owner_references().iter().any(|o| {
                    o.kind == "Node" && o.name == node && Some(&o.uid) == n.metadata.uid.as_ref()
                });
                if !owned {
                    return Err(format!(
                        "no ownerReference to Node {node} (uid {:?}): {:?}",
                        n.metadata.uid,
                        s.owner_references()
                    ));
                }
                let st = s.status.ok_or("no status")?;
                if st.heartbeat_time.is_none() || st.agent_version.is_empty() {
                    return Err(format!("no heartbeat or agent version: {st:?}"));
                }
                if self.env.mode == Mode::Local
                    && st.heartbeat_interval_seconds != HEARTBEAT_SECONDS
                {
                    return Err(format!(
                        "heartbeatIntervalSeconds {}, want {HEARTBEAT_SECONDS}",
                        st.heartbeat_interval_seconds
                    ));
                }
                let stale: Vec<_> = st
                    .policies
                    .iter()
                    .filter(|p| p.name.starts_with(POLICY_PREFIX))
                    .map(|p| &p.name)
                    .collect();
                let sets: Vec<_> = self
                    .kernel_names(node)
                    .await?
                    .into_iter()
                    .filter(|s| is_suite_set(s))
                    .collect();
                if stale.is_empty() && sets.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "leftovers of a previous run: entries {stale:?}, sets {sets:?}"
                    ))
                }
            })
            .await;
        }
    }

    // --- objects ---------------------------------------------------------------

    async fn apply_policy(&self, name: &str, spec: serde_json::Value) -> IPSetPolicy {
        let spec: IPSetPolicySpec = serde_json::from_value(spec.clone())
            .unwrap_or_else(|e| panic!("test bug: {spec} is not an IPSetPolicySpec: {e}"));
        let mut p = IPSetPolicy::new(name, spec);
        p.metadata.labels = Some(BTreeMap::from([(OWNED.into(), "true".into())]));
        self.policies
            .patch(name, &apply(), &Patch::Apply(&p))
            .await
            .unwrap_or_else(|e| self.fail(format!("applying policy {name}: {e}")))
    }

    async fn apply_slice(&self, policy: &str, name: &str, members: &[String]) -> IPSetMemberSlice {
        let mut s = IPSetMemberSlice::new(
            name,
            IPSetMemberSliceSpec {
                members: members.to_vec(),
            },
        );
        s.metadata.labels = Some(BTreeMap::from([
            (POLICY_LABEL.into(), policy.into()),
            (OWNED.into(), "true".into()),
        ]));
        self.slices
            .patch(name, &apply(), &Patch::Apply(&s))
            .await
            .unwrap_or_else(|e| self.fail(format!("applying slice {name}: {e}")))
    }

    /// Server-side apply of slice objects, a few at a time (as `kubectl
    /// apply` of a file of them would, one request each).
    async fn apply_slices(&self, slices: &[&IPSetMemberSlice]) {
        use futures::StreamExt;
        let results: Vec<_> = futures::stream::iter(slices.iter().map(|s| async move {
            let name = s.name_any();
            self.slices
                .patch(&name, &apply(), &Patch::Apply(*s))
                .await
                .map_err(|e| format!("applying slice {name}: {e}"))
        }))
        .buffer_unordered(8)
        .collect()
        .await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            self.fail(e);
        }
    }

    async fn policy(&self, name: &str) -> Result<IPSetPolicy, String> {
        self.policies
            .get(name)
            .await
            .map_err(|e| format!("policy {name}: {e}"))
    }

    async fn node_status(&self, node: &str) -> Result<IPSetNodeStateStatus, String> {
        self.states
            .get(node)
            .await
            .map_err(|e| format!("IPSetNodeState {node}: {e}"))?
            .status
            .ok_or_else(|| format!("IPSetNodeState {node}: no status yet"))
    }

    async fn entry(&self, node: &str, policy: &str) -> Result<Option<PolicyState>, String> {
        Ok(self
            .node_status(node)
            .await?
            .policies
            .into_iter()
            .find(|p| p.name == policy))
    }

    /// The node reports `policy` synced at `generation`, with `set` and
    /// `members` members.
    async fn expect_entry(
        &self,
        node: &str,
        policy: &str,
        generation: i64,
        set: &str,
        members: usize,
    ) -> Result<(), String> {
        let e = self
            .entry(node, policy)
            .await?
            .ok_or_else(|| format!("{node}: node state does not list {policy}"))?;
        let ok = e.synced
            && e.observed_generation == generation
            && e.members == members as i64
            && e.set_names.iter().any(|s| s == set);
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{node}: {policy} is {e:?}, want synced at generation {generation} with {members} members in {set}"
            ))
        }
    }

    async fn expect_no_entry(&self, node: &str, policy: &str) -> Result<(), String> {
        match self.entry(node, policy).await? {
            None => Ok(()),
            Some(e) => Err(format!("{node}: node state still lists {policy}: {e:?}")),
        }
    }

    async fn kernel_names(&self, node: &str) -> Result<BTreeSet<String>, String> {
        let out = ipset(&self.env, node, &["list", "-n"]).await?;
        if !out.status.success() {
            return Err(format!(
                "{node}: ipset list -n: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// The set in the node's kernel, `None` when it does not exist.
    async fn kernel_set(&self, node: &str, set: &str) -> Result<Option<KernelSet>, String> {
        let out = ipset(&self.env, node, &["save", set]).await?;
        if out.status.success() {
            return parse_save(&String::from_utf8_lossy(&out.stdout), set)
                .map(Some)
                .map_err(|e| format!("{node}: {e}"));
        }
        // Absent, or a real error: the listing tells.
        if self.kernel_names(node).await?.contains(set) {
            Err(format!(
                "{node}: ipset save {set}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        } else {
            Ok(None)
        }
    }

    async fn expect_set(
        &self,
        node: &str,
        set: &str,
        set_type: &str,
        members: &BTreeSet<String>,
    ) -> Result<(), String> {
        match self.kernel_set(node, set).await? {
            Some(k) if k.set_type == set_type && &k.members == members => Ok(()),
            Some(k) => Err(format!(
                "{node}: {set} is {} with {}, want {set_type}",
                k.set_type,
                diff(&k.members, members)
            )),
            None => Err(format!("{node}: no set {set}")),
        }
    }

    async fn expect_no_set(&self, node: &str, set: &str) -> Result<(), String> {
        match self.kernel_set(node, set).await? {
            None => Ok(()),
            Some(k) => Err(format!(
                "{node}: {set} should not exist, holds {} members",
                k.members.len()
            )),
        }
    }

    /// Delete a policy and its slices; its sets leave both kernels and its
    /// entries both node states.
    async fn remove_policy(&self, name: &str, sets: &[&str]) {
        match self.policies.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_gone(&e, name) => {}
            Err(e) => self.fail(format!("deleting policy {name}: {e}")),
        }
        // A label value holds at most 63 characters, so a longer policy has no
        // slices and its name is not even a valid selector.
        if name.len() <= 63 {
            let mine = ListParams::default().labels(&format!("{POLICY_LABEL}={name}"));
            if let Err(e) = self
                .slices
                .delete_collection(&DeleteParams::default(), &mine)
                .await
            {
                self.fail(format!("deleting the slices of {name}: {e}"));
            }
        }
        self.eventually(
            &format!("{name} gone from kernels and node states"),
            async || {
                match self.policies.get(name).await {
                    Err(e) if is_gone(&e, name) => {}
                    Err(e) => return Err(e.to_string()),
                    Ok(_) => return Err(format!("policy {name} still exists")),
                }
                for node in [self.node(0), self.node(1)] {
                    for set in sets {
                        self.expect_no_set(node, set).await?;
                    }
                    self.expect_no_entry(node, name).await?;
                }
                Ok(())
            },
        )
        .await;
    }

    /// Outside reference to `set` in the node's kernel: a list:set not named
    /// like ipsetmgr's, listing it. The manager must then leave `set` alone
    /// rather than destroy it (docs/architecture.md, "type or family change").
    async fn hold(&self, node: &str, set: &str) {
        self.guard
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((node.to_string(), HOLD_SET.to_string()));
        for args in [
            vec!["create", HOLD_SET, "list:set"],
            vec!["add", HOLD_SET, set],
        ] {
            let out = ipset(&self.env, node, &args)
                .await
                .unwrap_or_else(|e| self.fail(e));
            if !out.status.success() {
                self.fail(format!(
                    "{node}: ipset {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }

    async fn release(&self, node: &str) {
        let out = ipset(&self.env, node, &["destroy", HOLD_SET])
            .await
            .unwrap_or_else(|e| self.fail(e));
        if !out.status.success() {
            self.fail(format!(
                "{node}: ipset destroy {HOLD_SET}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        self.guard
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _)| n != node);
    }
}

// --- policy status ----------------------------------------------------------

fn generation(p: &IPSetPolicy) -> i64 {
    p.metadata.generation.unwrap_or(0)
}

fn condition<'a>(p: &'a IPSetPolicy, type_: &str) -> Option<&'a Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

fn describe(p: &IPSetPolicy) -> String {
    format!(
        "{} at generation {}: status {}",
        p.name_any(),
        generation(p),
        serde_json::to_string(&p.status).unwrap_or_default()
    )
}

/// The condition `type_` has `status` for the current generation: its
/// observedGeneration (a metav1.Condition may omit it; then, as for
/// `kubectl wait`, the status's) and `status.observedGeneration` are
/// `metadata.generation`.
fn expect_condition<'a>(
    p: &'a IPSetPolicy,
    type_: &str,
    status: &str,
) -> Result<&'a Condition, String> {
    let g = generation(p);
    let observed = p.status.as_ref().and_then(|s| s.observed_generation);
    match condition(p, type_) {
        Some(c)
            if c.status == status
                && c.observed_generation.or(observed) == Some(g)
                && observed == Some(g) =>
        {
            Ok(c)
        }
        _ => Err(format!(
            "want {type_}={status} at generation {g}; {}",
            describe(p)
        )),
    }
}

/// What `kubectl wait --for=condition=Ready` accepts: the first condition of
/// type Ready (case-insensitively) has status True (case-insensitively), and
/// its observedGeneration (else status.observedGeneration), when present, is
/// not behind metadata.generation. This suite wants it present and equal.
fn expect_kubectl_ready(p: &IPSetPolicy) -> Result<(), String> {
    let g = generation(p);
    let status = p.status.as_ref();
    let c = status
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_.eq_ignore_ascii_case("Ready"))
        })
        .ok_or_else(|| format!("no Ready condition; {}", describe(p)))?;
    let observed = c
        .observed_generation
        .or(status.and_then(|s| s.observed_generation));
    if c.status.eq_ignore_ascii_case("True") && observed == Some(g) {
        Ok(())
    } else {
        Err(format!(
            "Ready is {} at generation {observed:?}, want True at {g}; {}",
            c.status,
            describe(p)
        ))
    }
}

fn expect_summary(
    p: &IPSetPolicy,
    nodes: i64,
    synced: i64,
    members: Option<usize>,
) -> Result<&StatusSummary, String> {
    let s = p
        .status
        .as_ref()
        .and_then(|s| s.summary.as_ref())
        .ok_or_else(|| format!("no summary; {}", describe(p)))?;
    let ok = s.nodes == nodes
        && s.synced == synced
        && s.synced_text == format!("{synced}/{nodes}")
        && members.is_none_or(|m| s.members == m as i64)
        && (synced < nodes || s.failing_nodes.is_empty());
    if ok {
        Ok(s)
    } else {
        Err(format!(
            "want summary {synced}/{nodes}{}; {}",
            members
                .map(|m| format!(" with {m} members"))
                .unwrap_or_default(),
            describe(p)
        ))
    }
}

fn selects(label: &str, value: &str) -> serde_json::Value {
    json!({"matchLabels": {label: value}})
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

// --- scenarios ----------------------------------------------------------------

/// a. A valid policy selected by both nodes.
async fn valid_policy_on_both_nodes(h: &Harness) {
    let (name, set) = ("e2e-all", "ipm4-e2e-all");
    let members = strings(["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "members": members, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g = generation(&p);
    h.eventually(
        "both kernels, both node states, Ready and 2/2",
        async || {
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:ip", &members).await?;
                h.expect_entry(node, name, g, set, members.len()).await?;
            }
            let p = h.policy(name).await?;
            expect_condition(&p, "Valid", "True")?;
            expect_condition(&p, "Ready", "True")?;
            expect_kubectl_ready(&p)?;
            expect_summary(&p, 2, 2, Some(members.len())).map(|_| ())
        },
    )
    .await;

    match find_on_path("kubectl") {
        Some(kubectl) => {
            let out = tokio::process::Command::new(&kubectl)
                .args(["--kubeconfig", &h.env.kubeconfig, "wait"])
                .args([
                    "--for=condition=Ready",
                    &format!("ipsp/{name}"),
                    "--timeout=60s",
                ])
                .stdin(Stdio::null())
                .output()
                .await
                .unwrap_or_else(|e| h.fail(format!("running {}: {e}", kubectl.display())));
            if !out.status.success() {
                h.fail(format!(
                    "kubectl wait --for=condition=Ready ipsp/{name}: {}: {}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            say(format!(
                "kubectl wait: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        }
        None => say(
            "kubectl not on PATH: checked what `kubectl wait --for=condition=Ready` checks \
             through the API only (Ready True, observedGeneration == metadata.generation)",
        ),
    }
    h.remove_policy(name, &[set]).await;
}

/// b. A nodeSelector selecting one node; then the label moves to the other.
async fn selector_selects_one_node(h: &Harness) {
    let (name, set) = ("e2e-edge", "ipm4-e2e-edge");
    let members = strings(["10.1.0.0/16"]);
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:net", "members": members, "nodeSelector": selects(ROLE, "edge")}),
        )
        .await;
    let g = generation(&p);
    for (edge, core) in [(h.node(0), h.node(1)), (h.node(1), h.node(0))] {
        h.eventually(
            &format!("{name} on {edge} only, Ready and 1/1"),
            async || {
                h.expect_set(edge, set, "hash:net", &members).await?;
                h.expect_entry(edge, name, g, set, members.len()).await?;
                h.expect_no_set(core, set).await?;
                h.expect_no_entry(core, name).await?;
                let p = h.policy(name).await?;
                expect_condition(&p, "Ready", "True")?;
                expect_summary(&p, 1, 1, Some(members.len())).map(|_| ())
            },
        )
        .await;
        // "Not yet" is no proof: the unselected node stays without it.
        h.steadily(
            &format!("{core} without {name}"),
            Duration::from_secs(HEARTBEAT_SECONDS as u64),
            async || {
                h.expect_no_set(core, set).await?;
                h.expect_no_entry(core, name).await
            },
        )
        .await;
        if edge == h.node(0) {
            say(format!("moving the edge label from {edge} to {core}"));
            h.label_node(edge, "core").await;
            h.label_node(core, "edge").await;
        }
    }
    h.remove_policy(name, &[set]).await;
}

/// c. Members in slices: a big union, then a small change touching few
/// slices, and only those.
async fn members_in_slices(h: &Harness) {
    let (name, set) = ("e2e-slices", "ipm4-e2e-slices");
    let inline = addresses(49, 0, 3);
    let mut slices: Vec<Vec<String>> = (0..3).map(|i| addresses(50 + i, 0, 1000)).collect();
    let slice_name = |i: usize| format!("{name}-{i}");
    let union = |slices: &[Vec<String>]| -> BTreeSet<String> {
        inline
            .iter()
            .chain(slices.iter().flatten())
            .cloned()
            .collect()
    };

    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "members": inline, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g = generation(&p);
    let mut versions = Vec::new();
    for (i, m) in slices.iter().enumerate() {
        let s = h.apply_slice(name, &slice_name(i), m).await;
        versions.push(s.resource_version().unwrap_or_default());
    }
    let want = union(&slices);
    assert_eq!(want.len(), 3003, "test bug: members overlap");
    let took = h
        .eventually(
            "the union of inline members and 3 slices on both nodes",
            async || {
                for node in [h.node(0), h.node(1)] {
                    h.expect_set(node, set, "hash:ip", &want).await?;
                    h.expect_entry(node, name, g, set, want.len()).await?;
                }
                let p = h.policy(name).await?;
                expect_condition(&p, "Ready", "True")?;
                expect_summary(&p, 2, 2, Some(want.len())).map(|_| ())
            },
        )
        .await;
    say(format!(
        "{} members converged on both nodes in {took:.1?}",
        want.len()
    ));

    // Ten member changes over two of the three slices: slices 0 and 1 each
    // lose three members and gain two.
    for (i, s) in slices.iter_mut().take(2).enumerate() {
        s.drain(0..3);
        s.extend(addresses(50 + i as u8, 10_000, 2));
    }
    let start = Instant::now();
    for (i, m) in slices.iter().enumerate().take(2) {
        let s = h.apply_slice(name, &slice_name(i), m).await;
        if s.resource_version().unwrap_or_default() == versions[i] {
            h.fail(format!("slice {} did not change: test bug", slice_name(i)));
        }
    }
    let want = union(&slices);
    h.eventually("the 10-member change on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &want).await?;
            // A slice is no spec change: the generation stays.
            h.expect_entry(node, name, g, set, want.len()).await?;
        }
        let p = h.policy(name).await?;
        expect_summary(&p, 2, 2, Some(want.len())).map(|_| ())
    })
    .await;
    say(format!(
        "the 10-member change converged on both nodes in {:.1?}",
        start.elapsed()
    ));
    let unchanged = h
        .slices
        .get(&slice_name(2))
        .await
        .unwrap_or_else(|e| h.fail(format!("slice {}: {e}", slice_name(2))));
    if unchanged.resource_version().unwrap_or_default() != versions[2] {
        h.fail(format!(
            "slice {} changed (resourceVersion {} -> {:?}) though the suite did not write it",
            slice_name(2),
            versions[2],
            unchanged.resource_version()
        ));
    }
    h.remove_policy(name, &[set]).await;
}

/// Warning events `InvalidPolicy` about this very policy (its uid; an event
/// without one counts when it is not older than the policy, so that events
/// of an earlier policy of the same name are not counted).
async fn invalid_events(h: &Harness, p: &IPSetPolicy) -> Result<Vec<Event>, String> {
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    // core/v1 Events' involvedObject is what events.k8s.io/v1 calls
    // `regarding`; the API server fills both, and supports this selector.
    let lp = ListParams::default().fields(&format!("involvedObject.name={}", p.name_any()));
    let list = events.list(&lp).await.map_err(|e| format!("events: {e}"))?;
    let created = p.metadata.creation_timestamp.as_ref();
    Ok(list
        .items
        .into_iter()
        .filter(|e| {
            let o = &e.involved_object;
            let about = match (&o.uid, &p.metadata.uid) {
                (Some(a), Some(b)) => a == b,
                _ => e.metadata.creation_timestamp.as_ref() >= created,
            };
            about
                && o.kind.as_deref() == Some("IPSetPolicy")
                && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("InvalidPolicy")
        })
        .collect())
}

/// d. An invalid member in a slice: Valid=False naming it, one Warning
/// event, and the kernels held as they were.
async fn invalid_member_in_slice(h: &Harness) {
    let (name, set) = ("e2e-invalid", "ipm4-e2e-invalid");
    let slice = "e2e-invalid-0";
    let inline = strings(["10.30.0.1", "10.30.0.2"]);
    let good = vec!["10.30.1.1".to_string(), "10.30.1.2".to_string()];
    let bad_member = "10.30.1.999";
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "members": inline, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g = generation(&p);
    h.apply_slice(name, slice, &good).await;
    let before: BTreeSet<String> = inline.iter().chain(&good).cloned().collect();
    h.eventually("the valid policy on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &before).await?;
        }
        let p = h.policy(name).await?;
        expect_condition(&p, "Valid", "True")?;
        expect_condition(&p, "Ready", "True").map(|_| ())
    })
    .await;

    let mut bad = good.clone();
    bad.push(bad_member.to_string());
    h.apply_slice(name, slice, &bad).await;
    h.eventually(
        "Valid=False naming the member, and one Warning event",
        async || {
            let p = h.policy(name).await?;
            let c = expect_condition(&p, "Valid", "False")?;
            if !c.message.contains(bad_member) {
                return Err(format!("Valid's message does not name {bad_member}: {c:?}"));
            }
            if condition(&p, "Ready").is_some_and(|c| c.status == "True") {
                return Err(format!("Ready while invalid; {}", describe(&p)));
            }
            let n = invalid_events(h, &p).await?.len();
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} InvalidPolicy events"))
            }
        },
    )
    .await;
    // A touched slice makes the controller look again without anything new
    // to say: still one event. Meanwhile the kernels keep what they had.
    let mut touched = IPSetMemberSlice::new(slice, IPSetMemberSliceSpec { members: bad });
    touched.metadata.labels = Some(BTreeMap::from([
        (POLICY_LABEL.into(), name.into()),
        (OWNED.into(), "true".into()),
    ]));
    touched.metadata.annotations = Some(BTreeMap::from([(
        "ipsetmgr-e2e/touched".into(),
        "1".into(),
    )]));
    h.slices
        .patch(slice, &apply(), &Patch::Apply(&touched))
        .await
        .unwrap_or_else(|e| h.fail(format!("touching slice {slice}: {e}")));
    let p = h.policy(name).await.unwrap_or_else(|e| h.fail(e));
    h.steadily(
        "kernels held, one event",
        Duration::from_secs(2 * HEARTBEAT_SECONDS as u64),
        async || {
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:ip", &before).await?;
            }
            let events = invalid_events(h, &p).await?;
            if events.len() != 1 {
                return Err(format!("{} InvalidPolicy events: {events:?}", events.len()));
            }
            let e = &events[0];
            let by = e
                .reporting_component
                .as_deref()
                .filter(|s| !s.is_empty())
                .or(e.source.as_ref().and_then(|s| s.component.as_deref()));
            if by != Some(CONTROLLER) {
                return Err(format!(
                    "event reported by {by:?}, want {CONTROLLER}: {e:?}"
                ));
            }
            Ok(())
        },
    )
    .await;
    for node in [h.node(0), h.node(1)] {
        if let Ok(Some(e)) = h.entry(node, name).await {
            say(format!("{node} reports the invalid policy as {e:?}"));
        }
    }

    // Fixed: valid again, and the kernels follow.
    let fixed = vec!["10.30.1.1".to_string(), "10.30.1.3".to_string()];
    h.apply_slice(name, slice, &fixed).await;
    let after: BTreeSet<String> = inline.iter().chain(&fixed).cloned().collect();
    h.eventually("valid again, on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &after).await?;
            h.expect_entry(node, name, g, set, after.len()).await?;
        }
        let p = h.policy(name).await?;
        expect_condition(&p, "Valid", "True")?;
        expect_condition(&p, "Ready", "True")?;
        expect_summary(&p, 2, 2, Some(after.len())).map(|_| ())
    })
    .await;
    h.remove_policy(name, &[set]).await;

    // An invalid policy with a name of the longest kind (253 characters)
    // gets its Warning too: the event's own name must stay a valid name.
    let long = format!("e2e-{}", "l".repeat(249));
    let p = h
        .apply_policy(
            &long,
            json!({"type": "hash:ip", "members": ["10.30.9.999"]}),
        )
        .await;
    h.eventually(
        "one Warning event about the 253-character policy",
        async || {
            let n = invalid_events(h, &p).await?.len();
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} InvalidPolicy events"))
            }
        },
    )
    .await;
    h.remove_policy(&long, &[]).await;
}

/// e. The node state of a deleted Node goes (local mode: a fake Node
/// without an agent, whose state the suite writes the way an agent would).
async fn node_state_of_deleted_node(h: &Harness) {
    if h.env.mode == Mode::Kind {
        say("e. skipped in kind mode: it deletes a Node object");
        return;
    }
    let body = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": GHOST_NODE, "labels": {GHOST: "yes", OWNED: "true"}}});
    let node = h
        .nodes
        .patch(GHOST_NODE, &apply(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying Node {GHOST_NODE}: {e}")));
    let mut state = IPSetNodeState::new(GHOST_NODE, Default::default());
    state.metadata.labels = Some(BTreeMap::from([(OWNED.into(), "true".into())]));
    state.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: GHOST_NODE.into(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    }]);
    h.states
        .patch(GHOST_NODE, &apply(), &Patch::Apply(&state))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying IPSetNodeState {GHOST_NODE}: {e}")));
    let heartbeat = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
        "metadata": {"name": GHOST_NODE},
        "status": {"heartbeatTime": heartbeat, "heartbeatIntervalSeconds": HEARTBEAT_SECONDS,
                   "agentVersion": "e2e-fake", "syncedText": "0/0", "problems": 0},
    });
    h.states
        .patch_status(GHOST_NODE, &apply(), &Patch::Apply(&status))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying the status of {GHOST_NODE}: {e}")));

    // A policy selecting only the ghost: not Ready, the ghost failing.
    let (name, set) = ("e2e-ghost", "ipm4-e2e-ghost");
    h.apply_policy(
        name,
        json!({"type": "hash:ip", "members": ["10.60.0.1"], "nodeSelector": selects(GHOST, "yes")}),
    )
    .await;
    h.eventually("the ghost counted as selected and failing", async || {
        let p = h.policy(name).await?;
        expect_condition(&p, "Ready", "False")?;
        let s = expect_summary(&p, 1, 0, None)?;
        if s.failing_nodes != [GHOST_NODE] {
            return Err(format!(
                "failingNodes {:?}, want [{GHOST_NODE}]",
                s.failing_nodes
            ));
        }
        // The controller must not take a state for an orphan while its Node
        // exists (a cache that has not seen the Node yet is no proof).
        match h.states.get(GHOST_NODE).await {
            Ok(_) => Ok(()),
            Err(e) if is_gone(&e, GHOST_NODE) => h.fail(format!(
                "IPSetNodeState {GHOST_NODE} was deleted while its Node exists"
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;

    h.nodes
        .delete(GHOST_NODE, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| h.fail(format!("deleting Node {GHOST_NODE}: {e}")));
    let took = h
        .eventually(
            &format!("IPSetNodeState {GHOST_NODE} deleted"),
            async || match h.states.get(GHOST_NODE).await {
                Err(e) if is_gone(&e, GHOST_NODE) => Ok(()),
                Err(e) => Err(e.to_string()),
                Ok(s) => Err(format!(
                    "still there (deletionTimestamp {:?})",
                    s.metadata.deletion_timestamp
                )),
            },
        )
        .await;
    say(format!(
        "the node state of the deleted Node went in {took:.1?}"
    ));
    h.eventually(
        "no node selected: Ready (NoNodesSelected) and 0/0",
        async || {
            let p = h.policy(name).await?;
            let c = expect_condition(&p, "Ready", "True")?;
            if c.reason != "NoNodesSelected" {
                return Err(format!("Ready's reason {}, want NoNodesSelected", c.reason));
            }
            expect_summary(&p, 0, 0, None).map(|_| ())
        },
    )
    .await;
    h.remove_policy(name, &[set]).await;
}

/// f. A new generation: Ready goes False until both nodes report it, then
/// True again. One node is kept from reaching it by an outside reference to
/// its set (the new generation changes the set's type, which needs the set
/// destroyed), so the False phase is certain, not a race with fast agents.
async fn new_generation(h: &Harness) {
    let (name, set) = ("e2e-gen", "ipm4-e2e-gen");
    let (fast, held) = (h.node(0), h.node(1));
    let old = strings(["10.40.0.1", "10.40.0.2"]);
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "members": old, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g1 = generation(&p);
    h.eventually("the first generation on both nodes", async || {
        for node in [fast, held] {
            h.expect_set(node, set, "hash:ip", &old).await?;
            h.expect_entry(node, name, g1, set, old.len()).await?;
        }
        let p = h.policy(name).await?;
        expect_condition(&p, "Ready", "True")?;
        expect_summary(&p, 2, 2, None).map(|_| ())
    })
    .await;

    h.hold(held, set).await;
    let new = strings(["10.41.0.0/24"]);
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:net", "members": new, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g2 = generation(&p);
    if g2 <= g1 {
        h.fail(format!("a spec change left generation {g1} -> {g2}"));
    }
    let mut went_false = None;
    h.eventually(
        &format!("Ready=False at generation {g2} while {held} lags"),
        async || {
            h.expect_set(fast, set, "hash:net", &new).await?;
            h.expect_entry(fast, name, g2, set, new.len()).await?;
            // The held node keeps the old set as it was, and does not claim
            // the new generation.
            h.expect_set(held, set, "hash:ip", &old).await?;
            if let Some(e) = h.entry(held, name).await?
                && e.synced
                && e.observed_generation == g2
            {
                return Err(format!("{held} claims generation {g2} synced: {e:?}"));
            }
            let p = h.policy(name).await?;
            let c = expect_condition(&p, "Ready", "False")?;
            let s = expect_summary(&p, 2, 1, None)?;
            if !s.failing_nodes.iter().any(|n| n == held) {
                return Err(format!("failingNodes {:?} lacks {held}", s.failing_nodes));
            }
            went_false = Some(c.last_transition_time.clone());
            say(format!("Ready=False: {}: {}", c.reason, c.message));
            Ok(())
        },
    )
    .await;

    h.release(held).await;
    h.eventually(
        &format!("Ready=True at generation {g2} on both"),
        async || {
            for node in [fast, held] {
                h.expect_set(node, set, "hash:net", &new).await?;
                h.expect_entry(node, name, g2, set, new.len()).await?;
            }
            let p = h.policy(name).await?;
            let c = expect_condition(&p, "Ready", "True")?;
            expect_kubectl_ready(&p)?;
            expect_summary(&p, 2, 2, None)?;
            if went_false
                .as_ref()
                .is_some_and(|t| &c.last_transition_time < t)
            {
                return Err(format!("Ready's lastTransitionTime went back: {c:?}"));
            }
            Ok(())
        },
    )
    .await;
    h.remove_policy(name, &[set]).await;
}

/// The labels the controller puts on the slices it makes for a source
/// (docs/member-sources.md).
const SOURCE_LABEL: &str = "ipsetmgr.io/source";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const CONTROLLER_MANAGER: &str = "ipsetmgr-controller";

/// Write a Node's `status.addresses` through the status subresource, by
/// server-side apply (the suite's field manager owns the entries it lists;
/// one address per type, as the list is keyed by type for apply).
async fn apply_node_addresses(h: &Harness, node: &str, addresses: &[(&str, &str)]) {
    let addresses: Vec<_> = addresses
        .iter()
        .map(|(t, a)| json!({"type": t, "address": a}))
        .collect();
    let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                      "status": {"addresses": addresses}});
    h.nodes
        .patch_status(node, &apply(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying the status of Node {node}: {e}")));
}

/// The IPv4 InternalIPs a Node's status lists.
async fn internal_ipv4(h: &Harness, node: &str) -> Result<BTreeSet<String>, String> {
    let n = h
        .nodes
        .get(node)
        .await
        .map_err(|e| format!("Node {node}: {e}"))?;
    Ok(n.status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter(|a| a.address.parse::<std::net::Ipv4Addr>().is_ok())
        .map(|a| a.address)
        .collect())
}

/// The slices the controller made for `policy`: each labelled as its, and
/// owned by the policy (its uid, as garbage collection needs).
async fn expect_source_slices(h: &Harness, policy: &IPSetPolicy) -> Result<usize, String> {
    let name = policy.name_any();
    let mine = ListParams::default().labels(&format!("{POLICY_LABEL}={name},{SOURCE_LABEL}=0"));
    let slices = h.slices.list(&mine).await.map_err(|e| e.to_string())?;
    if slices.items.is_empty() {
        return Err(format!(
            "no slices labelled {POLICY_LABEL}={name},{SOURCE_LABEL}=0"
        ));
    }
    for s in &slices.items {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(CONTROLLER_MANAGER) {
            return Err(format!("slice {}: labels {labels:?}", s.name_any()));
        }
        let owners = s.metadata.owner_references.clone().unwrap_or_default();
        let owned = owners.iter().any(|o| {
            o.kind == "IPSetPolicy"
                && o.name == name
                && Some(&o.uid) == policy.metadata.uid.as_ref()
        });
        if !owned {
            return Err(format!(
                "slice {}: ownerReferences {owners:?}",
                s.name_any()
            ));
        }
    }
    Ok(slices.items.len())
}

/// g. A `nodes` source: the controller turns the selected Nodes' InternalIPs
/// into slices owned by the policy, and both agents hold them; a Node's new
/// address reaches both kernels. In local mode the suite's own Node objects
/// get addresses through the status subresource (and one changes); in kind
/// mode the workers' real addresses are used and none is changed (the
/// kubelet owns them).
async fn nodes_source(h: &Harness) {
    let (name, set) = ("e2e-nodes", "ipm4-e2e-nodes");
    if h.env.mode == Mode::Local {
        // An ExternalIP too: the source takes InternalIP only by default.
        apply_node_addresses(
            h,
            h.node(0),
            &[("InternalIP", "10.70.0.1"), ("ExternalIP", "203.0.113.70")],
        )
        .await;
        apply_node_addresses(h, h.node(1), &[("InternalIP", "10.70.0.2")]).await;
    }
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "family": "IPv4", "nodeSelector": selects(MEMBER, "yes"),
                   "membersFrom": [{"nodes": {"selector": selects(MEMBER, "yes")}}]}),
        )
        .await;
    let converged = async |what: &str| {
        h.eventually(what, async || {
            let mut want = BTreeSet::new();
            for node in [h.node(0), h.node(1)] {
                want.extend(internal_ipv4(h, node).await?);
            }
            if want.len() < 2 {
                return Err(format!("the two Nodes list {want:?} as IPv4 InternalIPs"));
            }
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:ip", &want).await?;
            }
            let p = h.policy(name).await?;
            expect_condition(&p, "Valid", "True")?;
            expect_condition(&p, "SourcesSynced", "True")?;
            expect_condition(&p, "Ready", "True")?;
            let sources = p
                .status
                .as_ref()
                .map(|s| s.sources.clone())
                .unwrap_or_default();
            match sources.as_slice() {
                [s] if s.index == 0 && s.kind == "nodes" && s.members == want.len() as i64 => {}
                other => {
                    return Err(format!(
                        "status.sources {other:?}, want one nodes entry of {}",
                        want.len()
                    ));
                }
            }
            expect_source_slices(h, &p).await?;
            Ok(())
        })
        .await
    };
    let took = converged("both kernels hold the Nodes' InternalIPs, Ready").await;
    say(format!("{name}: converged on both nodes in {took:.1?}"));

    if h.env.mode == Mode::Local {
        apply_node_addresses(h, h.node(1), &[("InternalIP", "10.70.0.3")]).await;
        let took = h
            .eventually("the new address in both kernels", async || {
                let want = strings(["10.70.0.1", "10.70.0.3"]);
                for node in [h.node(0), h.node(1)] {
                    h.expect_set(node, set, "hash:ip", &want).await?;
                }
                Ok(())
            })
            .await;
        say(format!(
            "a Node's new address reached both kernels in {took:.1?}"
        ));
    } else {
        say(
            "g. kind mode: the address change is skipped (the kubelet owns a real Node's addresses)",
        );
    }
    drop(p);
    h.remove_policy(name, &[set]).await;
    // The controller may have written a slice after remove_policy deleted
    // them; it deletes those of a policy that is gone (and in a cluster the
    // garbage collector does too, by the ownerReference).
    h.eventually(&format!("no slices of {name} left"), async || {
        let mine = ListParams::default().labels(&format!("{POLICY_LABEL}={name}"));
        let left = h
            .slices
            .list_metadata(&mine)
            .await
            .map_err(|e| e.to_string())?;
        match left.items.len() {
            0 => Ok(()),
            n => Err(format!("{n} slices still listed")),
        }
    })
    .await;
}

// --- scenarios on the suite's own control plane -----------------------------

/// The number of entries of a kernel set (`ipset list -t`), `None` when it
/// does not exist.
async fn kernel_count(h: &Harness, node: &str, set: &str) -> Result<Option<usize>, String> {
    let out = ipset(&h.env, node, &["list", "-t", set]).await?;
    if !out.status.success() {
        return if h.kernel_names(node).await?.contains(set) {
            Err(format!(
                "{node}: ipset list -t {set}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        } else {
            Ok(None)
        };
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Number of entries: "))
        .and_then(|n| n.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| format!("{node}: ipset list -t {set}: no entry count"))
}

/// `ipset test` of one member in a node's kernel.
async fn kernel_has(h: &Harness, node: &str, set: &str, member: &str) -> Result<bool, String> {
    Ok(ipset(&h.env, node, &["test", set, member])
        .await?
        .status
        .success())
}

/// `ipsetmgr slice` of a member list, as a user runs it: the slice objects
/// it prints, labelled as this suite's.
fn slice_objects(h: &Harness, policy: &str, members: &[String]) -> Vec<IPSetMemberSlice> {
    let list = h.env.log_dir.join(format!("{policy}.list"));
    std::fs::write(&list, members.join("\n") + "\n").expect("writing the member list");
    let out = Command::new(&h.env.bin)
        .args([
            "slice",
            "--policy",
            policy,
            "--type",
            "hash:ip",
            "--output-format",
            "json",
            "-f",
        ])
        .arg(&list)
        .output()
        .unwrap_or_else(|e| h.fail(format!("running ipsetmgr slice: {e}")));
    if !out.status.success() {
        h.fail(format!(
            "ipsetmgr slice: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // One JSON List (a YAML stream of a million members is more than the
    // suite's YAML parser's budget allows).
    let list: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| h.fail(format!("ipsetmgr slice printed what does not parse: {e}")));
    let mut slices: Vec<IPSetMemberSlice> = serde_json::from_value(list["items"].clone())
        .unwrap_or_else(|e| h.fail(format!("ipsetmgr slice printed no slices: {e}")));
    for s in &mut slices {
        s.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(OWNED.into(), "true".into());
    }
    slices
}

/// h. A million members, cut into slices by `ipsetmgr slice` and applied as
/// a user would: both kernels hold all of them; then a 10-member change of
/// the list touches few slices, and only those are applied again.
async fn a_million_members_in_slices(h: &Harness) {
    let (name, set) = ("e2e-million", "ipm4-e2e-million");
    let n = 1_000_000u32;
    let base = u32::from(std::net::Ipv4Addr::new(10, 128, 0, 0));
    let mut members: Vec<String> = (0..n)
        .map(|i| std::net::Ipv4Addr::from(base + i).to_string())
        .collect();
    let start = Instant::now();
    let first = slice_objects(h, name, &members);
    say(format!(
        "{name}: ipsetmgr slice cut {n} members into {} slices in {:.1?}",
        first.len(),
        start.elapsed()
    ));
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "maxElem": 2_000_000, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g = generation(&p);
    let start = Instant::now();
    h.apply_slices(&first.iter().collect::<Vec<_>>()).await;
    say(format!(
        "applied {} slices in {:.1?}",
        first.len(),
        start.elapsed()
    ));
    let converged = async |what: &str, count: usize, present: &str, absent: Option<&str>| {
        h.eventually(what, async || {
            for node in [h.node(0), h.node(1)] {
                match kernel_count(h, node, set).await? {
                    Some(c) if c == count => {}
                    other => return Err(format!("{node}: {set} holds {other:?}, want {count}")),
                }
                if !kernel_has(h, node, set, present).await? {
                    return Err(format!("{node}: {set} lacks {present}"));
                }
                if let Some(a) = absent
                    && kernel_has(h, node, set, a).await?
                {
                    return Err(format!("{node}: {set} still has {a}"));
                }
                h.expect_entry(node, name, g, set, count).await?;
            }
            let p = h.policy(name).await?;
            expect_condition(&p, "Ready", "True")?;
            expect_summary(&p, 2, 2, Some(count)).map(|_| ())
        })
        .await
    };
    let last = members.last().cloned().expect("members");
    let took = converged("a million members on both nodes", n as usize, &last, None).await;
    say(format!("{n} members converged on both nodes in {took:.1?}"));

    // Ten changes: five members go, five new ones come.
    let gone = members.drain(0..5).collect::<Vec<_>>();
    members.extend((0..5).map(|i| format!("10.200.0.{i}")));
    let second = slice_objects(h, name, &members);
    let changed: Vec<&IPSetMemberSlice> = second
        .iter()
        .filter(|s| {
            first
                .iter()
                .find(|f| f.name_any() == s.name_any())
                .is_none_or(|f| f.spec != s.spec)
        })
        .collect();
    if changed.is_empty() || changed.len() > 10 {
        h.fail(format!(
            "a 10-member change changed {} of {} slices",
            changed.len(),
            second.len()
        ));
    }
    let start = Instant::now();
    h.apply_slices(&changed).await;
    converged(
        "the 10-member change on both nodes",
        n as usize,
        "10.200.0.4",
        Some(&gone[0]),
    )
    .await;
    say(format!(
        "the 10-member change ({} slices applied) converged on both nodes in {:.1?}",
        changed.len(),
        start.elapsed()
    ));
    h.remove_policy(name, &[set]).await;
}

const PODS_NAMESPACE: &str = "ipsetmgr-e2e-pods";
const PODS_LABEL: &str = "ipsetmgr-e2e/pods";

/// A Pod as the scheduler and the kubelet would leave it: on a node, Running,
/// with an address (written through the status subresource: no kubelet here).
async fn running_pod(h: &Harness, name: &str, app: &str, node: &str, ip: &str) {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), PODS_NAMESPACE);
    let body = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app, OWNED: "true"}},
        "spec": {"nodeName": node, "serviceAccountName": "e2e", "automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "ipsetmgr-e2e:none"}]},
    });
    pods.patch(name, &apply(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying Pod {name}: {e}")));
    let status = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    });
    pods.patch_status(name, &apply(), &Patch::Apply(&status))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying the status of Pod {name}: {e}")));
}

/// i. A `pods` source: the addresses of the selected Running pods reach both
/// kernels; a pod relabelled out of the selector leaves them.
async fn pods_source(h: &Harness) {
    let (name, set) = ("e2e-pods", "ipm4-e2e-pods");
    // Applied, never deleted (no namespace controller here); the Pods'
    // ServiceAccount must exist (no controller creates "default" either).
    let ns: Api<Namespace> = Api::all(h.client.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": PODS_NAMESPACE, "labels": {PODS_LABEL: "yes"}}});
    ns.patch(PODS_NAMESPACE, &apply(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying Namespace {PODS_NAMESPACE}: {e}")));
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(h.client.clone(), PODS_NAMESPACE);
    let body = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "e2e"}});
    sas.patch("e2e", &apply(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| h.fail(format!("applying ServiceAccount e2e: {e}")));
    running_pod(h, "web-1", "web", h.node(0), "10.90.0.1").await;
    running_pod(h, "web-2", "web", h.node(1), "10.90.0.2").await;
    running_pod(h, "db-1", "db", h.node(1), "10.90.0.3").await;
    h.apply_policy(
        name,
        json!({"type": "hash:ip", "nodeSelector": selects(MEMBER, "yes"),
               "membersFrom": [{"pods": {"namespaceSelector": selects(PODS_LABEL, "yes"),
                                         "podSelector": {"matchLabels": {"app": "web"}}}}]}),
    )
    .await;
    for (what, want) in [
        (
            "the web pods' addresses on both nodes",
            strings(["10.90.0.1", "10.90.0.2"]),
        ),
        ("web-2 relabelled out", strings(["10.90.0.1"])),
    ] {
        let took = h
            .eventually(what, async || {
                for node in [h.node(0), h.node(1)] {
                    h.expect_set(node, set, "hash:ip", &want).await?;
                }
                let p = h.policy(name).await?;
                expect_condition(&p, "SourcesSynced", "True")?;
                expect_condition(&p, "Ready", "True").map(|_| ())
            })
            .await;
        say(format!("{what}: {took:.1?}"));
        running_pod(h, "web-2", "db", h.node(1), "10.90.0.2").await;
    }
    h.remove_policy(name, &[set]).await;
    delete_pods(&h.client).await;
}

/// Pods go at once (grace period 0): without a kubelet a graceful delete of
/// a scheduled pod never completes.
async fn delete_pods(client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), PODS_NAMESPACE);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let owned = ListParams::default().labels(&format!("{OWNED}=true"));
    step(
        "deleting test pods",
        "",
        pods.delete_collection(&dp, &owned),
    )
    .await;
}

/// A one-file HTTP server on loopback: every GET gets `body` as it is now.
fn serve(body: std::sync::Arc<Mutex<String>>) -> String {
    use std::io::Read;
    let listener = std::net::TcpListener::bind((FEED_ADDRESS, 0)).expect("a loopback port");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let text = body.lock().unwrap().clone();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    format!("http://{addr}/list.netset")
}

/// j. A `url` source: the controller fetches the list and both kernels hold
/// it (the controller is allowed this one loopback address, see
/// start_local; tests/feed_guard.rs shows what it refuses).
async fn url_source(h: &Harness) {
    let (name, set) = ("e2e-url", "ipm4-e2e-url");
    let body = std::sync::Arc::new(Mutex::new(
        "# a feed\n10.80.0.0/16\n10.81.0.1 ; one\n".to_string(),
    ));
    let url = serve(body.clone());
    h.apply_policy(
        name,
        json!({"type": "hash:net", "nodeSelector": selects(MEMBER, "yes"),
               "membersFrom": [{"url": {"url": url}}]}),
    )
    .await;
    let want = strings(["10.80.0.0/16", "10.81.0.1"]);
    let took = h
        .eventually("the feed's members on both nodes", async || {
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:net", &want).await?;
            }
            let p = h.policy(name).await?;
            expect_condition(&p, "SourcesSynced", "True")?;
            expect_condition(&p, "Ready", "True").map(|_| ())
        })
        .await;
    say(format!("{name}: converged in {took:.1?}"));
    h.remove_policy(name, &[set]).await;
}

/// The IPSetPolicy CRD with a schema that admits anything under `spec`, so
/// that an object can be stored which today's types cannot read (as one
/// stored under an older, looser schema would be).
fn loose_policy_crd() -> CustomResourceDefinition {
    let mut crd = IPSetPolicy::crd();
    let v = &mut crd.spec.versions[0];
    let schema = v
        .schema
        .as_mut()
        .unwrap()
        .open_api_v3_schema
        .as_mut()
        .unwrap();
    let props = schema.properties.as_mut().unwrap();
    props.insert(
        "spec".into(),
        serde_json::from_value(
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        )
        .unwrap(),
    );
    crd
}

/// k. A stored policy the agents cannot decode is held (its sets stay as
/// they were) and does not stop the others: a neighbour's change still
/// reaches both kernels; fixing it brings it back.
async fn undecodable_policy_is_held(h: &Harness) {
    let (name, set) = ("e2e-undecodable", "ipm4-e2e-undecodable");
    let (other, other_set) = ("e2e-neighbour", "ipm4-e2e-neighbour");
    let held = strings(["10.95.0.1", "10.95.0.2"]);
    h.apply_policy(
        name,
        json!({"type": "hash:ip", "members": held, "nodeSelector": selects(MEMBER, "yes")}),
    )
    .await;
    h.apply_policy(other, json!({"type": "hash:ip", "members": ["10.96.0.1"], "nodeSelector": selects(MEMBER, "yes")}))
        .await;
    h.eventually("both policies on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &held).await?;
            h.expect_set(node, other_set, "hash:ip", &strings(["10.96.0.1"]))
                .await?;
        }
        Ok(())
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(h.client.clone());
    let crd_name = IPSetPolicy::crd_name();
    crds.patch(crd_name, &apply(), &Patch::Apply(&loose_policy_crd()))
        .await
        .unwrap_or_else(|e| h.fail(format!("loosening the CRD: {e}")));
    // members as one string: no IPSetPolicySpec reads that.
    let bad = json!({"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
                     "metadata": {"name": name, "labels": {OWNED: "true"}},
                     "spec": {"type": "hash:ip", "members": "10.95.0.9"}});
    let dynamic: Api<kube::api::DynamicObject> = Api::all_with(
        h.client.clone(),
        &kube::api::ApiResource::erase::<IPSetPolicy>(&()),
    );
    h.eventually("the undecodable policy stored", async || {
        dynamic
            .patch(name, &apply(), &Patch::Apply(&bad))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    h.install_crds().await;
    h.apply_policy(other, json!({"type": "hash:ip", "members": ["10.96.0.2"], "nodeSelector": selects(MEMBER, "yes")}))
        .await;
    h.eventually("the neighbour's change on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, other_set, "hash:ip", &strings(["10.96.0.2"]))
                .await?;
        }
        Ok(())
    })
    .await;
    h.steadily(
        "the undecodable policy's sets held",
        Duration::from_secs(2 * HEARTBEAT_SECONDS as u64),
        async || {
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:ip", &held).await?;
            }
            Ok(())
        },
    )
    .await;
    // Fixed the way `kubectl apply` (client-side) or `kubectl edit` would:
    // a merge patch. Server-side apply cannot start from a stored object
    // that does not fit the schema ("failed to create typed live object").
    let fixed = strings(["10.95.0.3"]);
    h.policies
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"members": fixed}})),
        )
        .await
        .unwrap_or_else(|e| h.fail(format!("fixing {name}: {e}")));
    h.eventually("the fixed policy on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &fixed).await?;
        }
        let p = h.policy(name).await?;
        expect_condition(&p, "Ready", "True").map(|_| ())
    })
    .await;
    h.remove_policy(name, &[set]).await;
    h.remove_policy(other, &[other_set]).await;
}

/// l. The API server stops and starts again: the kernels keep their sets
/// while it is away, and a change made after its return converges.
async fn apiserver_restart(h: &Harness) {
    let Some(plane) = &h.plane else {
        say("l. skipped: the API server is not the suite's own (IPSETMGR_E2E_KUBECONFIG)");
        return;
    };
    let (name, set) = ("e2e-restart", "ipm4-e2e-restart");
    let before = strings(["10.97.0.1", "10.97.0.2"]);
    h.apply_policy(
        name,
        json!({"type": "hash:ip", "members": before, "nodeSelector": selects(MEMBER, "yes")}),
    )
    .await;
    h.eventually("the policy on both nodes, Ready", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &before).await?;
        }
        let p = h.policy(name).await?;
        expect_condition(&p, "Ready", "True").map(|_| ())
    })
    .await;
    plane.stop_apiserver();
    say("the API server is stopped");
    h.steadily(
        "the kernels unchanged while the API server is away",
        Duration::from_secs(2 * HEARTBEAT_SECONDS as u64),
        async || {
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:ip", &before).await?;
            }
            Ok(())
        },
    )
    .await;
    plane
        .start_apiserver()
        .await
        .unwrap_or_else(|e| h.fail(format!("restarting the API server: {e}")));
    say("the API server is back");
    let after = strings(["10.97.0.3"]);
    let p = h
        .apply_policy(
            name,
            json!({"type": "hash:ip", "members": after, "nodeSelector": selects(MEMBER, "yes")}),
        )
        .await;
    let g = generation(&p);
    let took = h
        .eventually(
            "the change after the restart on both nodes, Ready",
            async || {
                for node in [h.node(0), h.node(1)] {
                    h.expect_set(node, set, "hash:ip", &after).await?;
                    h.expect_entry(node, name, g, set, after.len()).await?;
                }
                let p = h.policy(name).await?;
                expect_condition(&p, "Ready", "True").map(|_| ())
            },
        )
        .await;
    say(format!("converged after the restart in {took:.1?}"));
    h.remove_policy(name, &[set]).await;
}

/// m. The IPSetPolicy CRD is deleted (which deletes every policy first): the
/// agents read that as fail static and leave the kernels as they are; with
/// the CRD back, a policy applied again converges.
async fn crd_deletion_is_fail_static(h: &Harness) {
    let (name, set) = ("e2e-crd", "ipm4-e2e-crd");
    let members = strings(["10.98.0.1", "10.98.0.2"]);
    let spec =
        json!({"type": "hash:ip", "members": members, "nodeSelector": selects(MEMBER, "yes")});
    h.apply_policy(name, spec.clone()).await;
    h.eventually("the policy on both nodes", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &members).await?;
        }
        Ok(())
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(h.client.clone());
    let crd_name = IPSetPolicy::crd_name();
    crds.delete(crd_name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| h.fail(format!("deleting CRD {crd_name}: {e}")));
    h.eventually("the CRD gone", async || {
        match crds.get_opt(crd_name).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err(format!("CRD {crd_name} still there")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    h.steadily(
        "the kernels unchanged without the CRD",
        Duration::from_secs(2 * HEARTBEAT_SECONDS as u64),
        async || {
            for node in [h.node(0), h.node(1)] {
                h.expect_set(node, set, "hash:ip", &members).await?;
            }
            Ok(())
        },
    )
    .await;
    h.install_crds().await;
    let p = h.apply_policy(name, spec).await;
    let g = generation(&p);
    h.eventually("the policy again, Ready", async || {
        for node in [h.node(0), h.node(1)] {
            h.expect_set(node, set, "hash:ip", &members).await?;
            h.expect_entry(node, name, g, set, members.len()).await?;
        }
        let p = h.policy(name).await?;
        expect_condition(&p, "Ready", "True").map(|_| ())
    })
    .await;
    h.remove_policy(name, &[set]).await;
}

#[tokio::test]
async fn e2e_controller_and_agents() {
    const TEST: &str = "e2e_controller_and_agents";
    // A cluster of the caller's, or the suite's own API server (local mode).
    let (env, plane) = match std::env::var("IPSETMGR_E2E_KUBECONFIG") {
        Ok(kubeconfig) => (Env::from_env(kubeconfig), None),
        Err(_) => {
            if !nix::unistd::geteuid().is_root() {
                ipsetmgr_envtest::cannot_run(
                    TEST,
                    &"local mode needs root (network namespaces); or set \
                      IPSETMGR_E2E_KUBECONFIG (e2e/README.md)",
                );
                return;
            }
            let Some(plane) = ipsetmgr_envtest::own(TEST, ipsetmgr_envtest::Server::Newest).await
            else {
                return;
            };
            say(format!(
                "own API server {} at {}",
                plane.version(),
                plane.url()
            ));
            let env = Env::from_env(plane.kubeconfig().display().to_string());
            assert_eq!(
                env.mode,
                Mode::Local,
                "the suite's own API server runs in local mode"
            );
            (env, Some(plane))
        }
    };
    say(format!(
        "{:?} mode, nodes {:?}, controller namespace {}, waits up to {:?}",
        env.mode, env.nodes, env.namespace, env.timeout
    ));
    let h = Harness::new(env, plane).await;
    h.install_crds().await;
    h.remove_leftovers().await;
    match h.env.mode {
        Mode::Local => h.start_local().await,
        Mode::Kind => {
            h.label_node(h.node(0), "edge").await;
            h.label_node(h.node(1), "core").await;
        }
    }
    h.wait_ready().await;

    h.scenario(
        "a",
        "a valid policy selected by both nodes",
        valid_policy_on_both_nodes(&h),
    )
    .await;
    h.scenario(
        "b",
        "a nodeSelector selecting one node",
        selector_selects_one_node(&h),
    )
    .await;
    h.scenario(
        "c",
        "members in slices, and a 10-member change",
        members_in_slices(&h),
    )
    .await;
    h.scenario(
        "d",
        "an invalid member in a slice",
        invalid_member_in_slice(&h),
    )
    .await;
    h.scenario(
        "e",
        "the node state of a deleted Node",
        node_state_of_deleted_node(&h),
    )
    .await;
    h.scenario(
        "f",
        "a new generation: Ready False until both nodes have it",
        new_generation(&h),
    )
    .await;
    h.scenario(
        "g",
        "a nodes source follows a Node's address",
        nodes_source(&h),
    )
    .await;
    h.scenario(
        "h",
        "a million members cut by ipsetmgr slice, and a 10-member change",
        a_million_members_in_slices(&h),
    )
    .await;
    if h.env.mode == Mode::Local {
        h.scenario("i", "a pods source", pods_source(&h)).await;
        h.scenario("j", "a url source", url_source(&h)).await;
        h.scenario(
            "k",
            "a stored policy the agents cannot decode is held",
            undecodable_policy_is_held(&h),
        )
        .await;
        h.scenario("l", "the API server restarts", apiserver_restart(&h))
            .await;
        h.scenario(
            "m",
            "the CRD deleted: fail static",
            crd_deletion_is_fail_static(&h),
        )
        .await;
    } else {
        say(
            "i-m. kind mode: skipped (they write Pods, CRDs and the API server of a cluster the suite does not own)",
        );
    }
    say("all scenarios passed; cleaning up");
}

// The suite's own readers, checked without a cluster.

#[test]
fn parse_save_reads_one_set() {
    let save = "create ipm4-e2e-x hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x902cda58\n\
                add ipm4-e2e-x 10.41.0.0/24\n\
                add ipm4-e2e-x 10.42.0.0/16 nomatch\n\
                create ipm4-e2e-xy hash:ip family inet hashsize 1024 maxelem 65536\n\
                add ipm4-e2e-xy 10.0.0.1\n";
    let k = parse_save(save, "ipm4-e2e-x").unwrap();
    assert_eq!(k.set_type, "hash:net");
    assert_eq!(k.members, strings(["10.41.0.0/24", "10.42.0.0/16 nomatch"]));
    assert!(parse_save(save, "ipm4-e2e").is_err());
}

#[test]
fn suite_sets_and_addresses() {
    assert!(is_suite_set("ipm4-e2e-all") && is_suite_set("ipmx-e2e-macs"));
    assert!(!is_suite_set("ipm4-web") && !is_suite_set("e2ehold") && !is_suite_set("ipmt-3"));
    let a = addresses(50, 0, 1000);
    assert_eq!(strings(&a).len(), 1000);
    assert_eq!(
        (a[0].as_str(), a[999].as_str()),
        ("10.50.0.1", "10.50.3.250")
    );
}
