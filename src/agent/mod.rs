//! Cluster mode (DESIGN.md §5): the per-node agent.
//!
//! - [`controller`]: the event loop (policy and node watches, debounced
//!   recompiles, status entries, Warning events).
//! - [`worker`]: the manager on a dedicated thread, with periodic resyncs.
//! - [`status`]: this node's `status.nodes[]` entries and their SSA bodies.
//! - [`leader`]: the Lease-elected summary writer and entry collector.
//! - [`metrics`]: Prometheus metrics and health/readiness facts.

pub mod controller;
pub mod kind_guard;
pub mod leader;
pub mod metrics;
pub mod status;
pub mod worker;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};

use crate::dataplane::Dataplane;
use crate::ipset::Naming;
use crate::manager::{Manager, ManagerConfig};
use crate::policy::IPSetPolicy;

/// Flags of `ipsetmgr agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct AgentConfig {
    /// This node's name (from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Kubeconfig file; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Prefix of owned kernel set names; filled from the global
    /// `--set-prefix` flag.
    #[arg(skip = String::from("ipm"))]
    pub set_prefix: String,
    /// Full resync against the kernel every this often (e.g. 60s, 5m).
    #[arg(long, env = "IPSETMGR_RESYNC_INTERVAL", default_value = "60s", value_parser = crate::duration::parse_positive)]
    pub resync_interval: Duration,
    /// Address of the /healthz, /readyz and /metrics listener.
    #[arg(long, env = "IPSETMGR_LISTEN", default_value = "0.0.0.0:9477")]
    pub listen: SocketAddr,
    /// Network namespace for the kernel side only; filled from the global
    /// `--netns` flag.
    #[arg(skip)]
    pub dataplane_netns: Option<String>,
    /// Namespace of the summary-writer Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ipsetmgr-system")]
    pub lease_namespace: String,
}

impl AgentConfig {
    pub fn new(node_name: &str) -> AgentConfig {
        AgentConfig {
            node_name: node_name.to_string(),
            kubeconfig: None,
            set_prefix: "ipm".into(),
            resync_interval: Duration::from_secs(60),
            listen: ([0, 0, 0, 0], 9477).into(),
            dataplane_netns: None,
            lease_namespace: "ipsetmgr-system".into(),
        }
    }
}

/// The CRD as YAML (what `ipsetmgr crd` prints and `crds/` holds).
pub fn crd_yaml() -> String {
    let crd = IPSetPolicy::crd();
    serde_saphyr::to_string(&crd).expect("the CRD serializes")
}

async fn make_client(config: &AgentConfig) -> anyhow::Result<Client> {
    match &config.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")?;
            Ok(Client::try_from(cfg)?)
        }
        None => Ok(Client::try_default()
            .await
            .context("no in-cluster config or kubeconfig")?),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}

/// Run the agent until SIGTERM/SIGINT. The kernel is never touched on the
/// way out: watchers stop, the current apply finishes, the process exits.
pub async fn run_agent(config: AgentConfig, dataplane: Box<dyn Dataplane>) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.node_name.is_empty(),
        "--node-name (NODE_NAME) is required"
    );
    let naming = Naming::new(&config.set_prefix)?;
    let client = make_client(&config).await?;
    let shared = metrics::Shared::new(config.resync_interval);

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(crate::server::serve(
        listener,
        shared.clone(),
        stop_rx.clone(),
    ));

    let leader = tokio::spawn(leader::run(
        client.clone(),
        leader::LeaderSettings::new(&config.node_name, &config.lease_namespace),
        shared.clone(),
        stop_rx,
    ));

    let manager = Manager::new(
        dataplane,
        ManagerConfig {
            naming: naming.clone(),
            ..ManagerConfig::default()
        },
    );
    let observed = controller::Observed::default();
    let inputs = controller::watch_inputs(client.clone(), &config.node_name, observed.clone());
    let mut settings = controller::Settings::new(&config.node_name, naming, config.resync_interval);
    settings.dataplane_netns = config.dataplane_netns.clone();
    tracing::info!(node = %config.node_name, listen = %config.listen, "agent starting");
    let agent = controller::Agent::new(client, settings, manager, shared, observed);
    agent.run(inputs, shutdown_signal()).await;

    let _ = stop_tx.send(true);
    let _ = leader.await;
    let _ = server.await;
    tracing::info!("agent stopped");
    Ok(())
}
