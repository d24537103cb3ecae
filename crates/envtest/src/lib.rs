//! A real Kubernetes control plane for the tests (the envtest pattern of
//! controller-runtime): etcd and kube-apiserver on loopback, in a temporary
//! directory, with a CA and serving certificate, token authentication, RBAC
//! and service-account token signing, so that server-side apply, the status
//! subresource, CEL cost budgets, admission policies and bound tokens are the
//! server's own, not a mock's. No kubelet, scheduler or controller-manager
//! runs: no garbage collection, no namespace deletion, Pods stay as written.
//!
//! What it must never do: leave processes or files behind. An owned
//! [`ControlPlane`] stops both processes and removes its directory when
//! dropped (also when a test panics); the per-binary [`shared`] one is
//! stopped when the test process exits, however it exits, by a watchdog
//! process (`watchdog.rs`), which also stops an owned one
//! whose test process was killed.
//!
//! Binaries are found as [`assets`] says; when they are absent a test
//! skips with a message, except under `CI=true`, where it fails
//! ([`cannot_run`]). See docs/architecture.md (Tests).

#![forbid(unsafe_code)]

pub mod assets;
mod pki;
mod process;
mod watchdog;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use assets::{Binaries, Missing, Server};
use process::Proc;
use watchdog::Watchdog;

/// How long the API server may take to become ready (about 3 s here; the
/// first start after boot reads its binary from disk).
const READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Missing(#[from] Missing),
    #[error("envtest: {0}")]
    Io(String),
    #[error("envtest: {what} did not become ready: {why}\n--- last lines of its log:\n{log}")]
    NotReady {
        what: &'static str,
        why: String,
        log: String,
    },
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Io(format!("{what}: {e}"))
}

/// One etcd and one kube-apiserver.
pub struct ControlPlane {
    server: Server,
    binaries: Binaries,
    /// Removed on stop.
    dir: Mutex<Option<tempfile::TempDir>>,
    path: PathBuf,
    etcd: Mutex<Option<Proc>>,
    apiserver: Mutex<Option<Proc>>,
    /// Stops both and removes the directory if this process ends without
    /// [`ControlPlane::stop`] (the shared planes, a killed test).
    watchdog: Arc<Mutex<Watchdog>>,
    etcd_url: String,
    port: u16,
    token: String,
    kubeconfig: PathBuf,
    version: String,
}

fn free_port() -> Result<u16, Error> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io("picking a free port"))
}

fn random_token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(io("/dev/urandom"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ControlPlane {
    /// Start etcd and the API server and wait until `/readyz` answers.
    pub async fn start(server: Server) -> Result<ControlPlane, Error> {
        let binaries = Binaries::find(server)?;
        let dir = tempfile::Builder::new()
            .prefix("ipsetmgr-envtest-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let path = dir.path().to_path_buf();
        let watchdog = Watchdog::start(&path).map_err(io("starting the watchdog (sh)"))?;
        let pki = pki::make().map_err(|e| Error::Io(format!("making certificates: {e}")))?;
        let token = random_token()?;
        let write = |name: &str, text: &str| {
            std::fs::write(path.join(name), text).map_err(io(format!("writing {name}")))
        };
        write("ca.crt", &pki.ca_pem)?;
        write("serving.crt", &pki.serving_cert_pem)?;
        write("serving.key", &pki.serving_key_pem)?;
        write("sa.key", &pki.service_account_key_pem)?;
        write("sa.pub", &pki.service_account_pub_pem)?;
        write(
            "tokens.csv",
            &format!("{token},admin,admin,\"system:masters\"\n"),
        )?;

        let (client_port, peer_port, port) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let mut plane = ControlPlane {
            server,
            kubeconfig: path.join("kubeconfig"),
            dir: Mutex::new(Some(dir)),
            etcd: Mutex::new(None),
            apiserver: Mutex::new(None),
            watchdog: Arc::new(Mutex::new(watchdog)),
            etcd_url,
            port,
            token,
            binaries,
            version: String::new(),
            path,
        };
        plane.write_kubeconfig(&plane.kubeconfig, "admin", &plane.token)?;
        plane.start_etcd(peer_port)?;
        plane.start_apiserver().await?;
        plane.version = plane.fetch_version().await?;
        Ok(plane)
    }

    fn start_etcd(&self, peer_port: u16) -> Result<(), Error> {
        let peer = format!("http://127.0.0.1:{peer_port}");
        let args = [
            "--name=envtest".to_string(),
            format!("--data-dir={}", self.path.join("etcd").display()),
            format!("--listen-client-urls={}", self.etcd_url),
            format!("--advertise-client-urls={}", self.etcd_url),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=envtest={peer}"),
            // A test's data need not survive a power cut.
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let mut p = Proc::spawn(
            &self.binaries.etcd,
            &args,
            self.path.join("etcd.log"),
            self.watchdog.clone(),
        )
        .map_err(io(format!("starting {}", self.binaries.etcd.display())))?;
        let addr = self.etcd_url.trim_start_matches("http://").to_string();
        let start = Instant::now();
        loop {
            if std::net::TcpStream::connect(&addr).is_ok() {
                break;
            }
            if let Some(status) = p.exited() {
                return Err(self.not_ready("etcd", format!("exited ({status})"), &p));
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.not_ready("etcd", format!("no listener on {addr}"), &p));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        *lock(&self.etcd) = Some(p);
        Ok(())
    }

    fn not_ready(&self, what: &'static str, why: String, p: &Proc) -> Error {
        Error::NotReady {
            what,
            why,
            log: p.tail(30),
        }
    }

    fn apiserver_args(&self) -> Vec<String> {
        let f = |name: &str| self.path.join(name).display().to_string();
        vec![
            format!("--etcd-servers={}", self.etcd_url),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", self.port),
            format!("--cert-dir={}", f("certs")),
            format!("--tls-cert-file={}", f("serving.crt")),
            format!("--tls-private-key-file={}", f("serving.key")),
            format!("--client-ca-file={}", f("ca.crt")),
            format!("--token-auth-file={}", f("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", f("sa.pub")),
            format!("--service-account-signing-key-file={}", f("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--profiling=false".into(),
        ]
    }

    /// Start (or start again) the API server on its port, against the same
    /// etcd, and wait until it is ready.
    pub async fn start_apiserver(&self) -> Result<(), Error> {
        self.stop_apiserver();
        let mut p = Proc::spawn(
            &self.binaries.apiserver,
            &self.apiserver_args(),
            self.path
                .join(format!("kube-apiserver-{}.log", free_port()?)),
            self.watchdog.clone(),
        )
        .map_err(io(format!(
            "starting {}",
            self.binaries.apiserver.display()
        )))?;
        let client = self.client().await?;
        let start = Instant::now();
        let mut last;
        loop {
            if let Some(status) = p.exited() {
                return Err(self.not_ready("kube-apiserver", format!("exited ({status})"), &p));
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request");
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => break,
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.not_ready("kube-apiserver", format!("/readyz: {last}"), &p));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        *lock(&self.apiserver) = Some(p);
        Ok(())
    }

    /// Stop the API server (etcd keeps the data): what a control-plane
    /// restart or outage looks like to clients.
    pub fn stop_apiserver(&self) {
        if let Some(mut p) = lock(&self.apiserver).take() {
            p.stop(Duration::from_secs(10));
        }
    }

    async fn fetch_version(&self) -> Result<String, Error> {
        let client = self.client().await?;
        let v = client
            .apiserver_version()
            .await
            .map_err(|e| Error::Io(format!("GET /version: {e}")))?;
        Ok(v.git_version)
    }

    /// Which server this is.
    pub fn server(&self) -> Server {
        self.server
    }

    /// The server's `gitVersion`, e.g. `v1.34.9+ba6535cbb871`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The server's minor version (34 for v1.34.9).
    pub fn minor(&self) -> u32 {
        self.version
            .trim_start_matches('v')
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig file for the admin user (group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A scratch directory inside the control plane's (removed with it).
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// Write a kubeconfig at `path` that authenticates with `token` (a
    /// service-account token from a TokenRequest, say).
    pub fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) -> Result<(), Error> {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "envtest", "cluster": {
                "server": self.url(),
                "certificate-authority": self.path.join("ca.crt"),
            }}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
            "current-context": "envtest",
        });
        std::fs::write(path, config.to_string()).map_err(io(format!("writing {}", path.display())))
    }

    /// A client of the admin user. Make one per tokio runtime: a client's
    /// connections live on the runtime that made them.
    pub async fn client(&self) -> Result<Client, Error> {
        client_from(&self.kubeconfig).await
    }

    /// A client that authenticates with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<Client, Error> {
        let path = self.path.join(format!("kubeconfig-{}", free_port()?));
        self.write_kubeconfig(&path, "token", token)?;
        let client = client_from(&path).await;
        let _ = std::fs::remove_file(&path);
        client
    }

    /// The pids of etcd and the API server, for resource measurements.
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (
            lock(&self.etcd).as_ref().map(Proc::pid),
            lock(&self.apiserver).as_ref().map(Proc::pid),
        )
    }

    /// The last lines of the API server's log.
    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        lock(&self.apiserver)
            .as_ref()
            .map(|p| p.tail(lines))
            .unwrap_or_default()
    }

    /// Stop both processes and remove the directory. Idempotent.
    pub fn stop(&self) {
        self.stop_apiserver();
        if let Some(mut p) = lock(&self.etcd).take() {
            p.stop(Duration::from_secs(5));
        }
        lock(&self.watchdog).done();
        drop(lock(&self.dir).take());
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn client_from(path: &Path) -> Result<Client, Error> {
    let kc =
        Kubeconfig::read_from(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    Client::try_from(cfg).map_err(|e| Error::Io(e.to_string()))
}

/// Say that `test` cannot run here and why; under `CI=true` this panics, so
/// CI never reports success for a test that did not run.
pub fn cannot_run(test: &str, why: &dyn std::fmt::Display) {
    let msg = format!("{test}: skipped: {why}");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg} — under CI=true every real-API test must run");
    }
    eprintln!("{msg}");
}

static NEWEST: tokio::sync::OnceCell<Result<ControlPlane, Error>> =
    tokio::sync::OnceCell::const_new();
static OLDEST: tokio::sync::OnceCell<Result<ControlPlane, Error>> =
    tokio::sync::OnceCell::const_new();

/// The control plane shared by every test of this test binary (one per
/// [`Server`]), started on first use. `None` (after [`cannot_run`]) when its
/// binaries are not installed; a server that is installed but does not
/// start fails the test. Tests sharing it keep to their own objects
/// (unique names or namespaces).
pub async fn shared(test: &str, server: Server) -> Option<&'static ControlPlane> {
    if let Err(missing) = Binaries::find(server) {
        cannot_run(test, &missing);
        return None;
    }
    let cell = match server {
        Server::Newest => &NEWEST,
        Server::Oldest => &OLDEST,
    };
    let started = cell
        .get_or_init(|| async {
            let started = ControlPlane::start(server).await;
            if let Ok(p) = &started {
                eprintln!(
                    "envtest: {} API server {} at {} (shared by this test binary)",
                    server.name(),
                    p.version(),
                    p.url()
                );
            }
            started
        })
        .await;
    match started {
        Ok(plane) => Some(plane),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// A control plane of the test's own (stopped when dropped), or `None` after
/// [`cannot_run`] when the binaries are not installed.
pub async fn own(test: &str, server: Server) -> Option<ControlPlane> {
    if let Err(missing) = Binaries::find(server) {
        cannot_run(test, &missing);
        return None;
    }
    match ControlPlane::start(server).await {
        Ok(plane) => Some(plane),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// `helm`, for the chart's tests: `HELM`, the assets directory, or `PATH`.
pub fn helm() -> Result<PathBuf, Missing> {
    assets::tool("HELM", "helm", true)
}

/// `kubectl`: `KUBECTL`, the assets directory, or `PATH`.
pub fn kubectl() -> Result<PathBuf, Missing> {
    assets::tool("KUBECTL", "kubectl", true)
}
