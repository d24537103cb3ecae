//! Cluster mode: the per-node agent (see `docs/architecture.md`).
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

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};

use crate::args::defaults;
use crate::kernel::{KernelOptions, KernelSide};
use crate::manager::driver::DriverConfig;
use crate::policy::IPSetPolicy;

/// Flags of `ipsetmgr agent` (the global flags set the kernel side).
#[derive(Clone, Debug, clap::Args)]
pub struct AgentConfig {
    /// This node's name (from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Kubeconfig file; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub resync: crate::args::Resync,
    /// Address of the /healthz, /readyz and /metrics listener.
    #[arg(long, env = "IPSETMGR_LISTEN", default_value = defaults::LISTEN)]
    pub listen: SocketAddr,
    /// Namespace of the summary-writer Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = defaults::NAMESPACE)]
    pub lease_namespace: String,
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
pub async fn run_agent(config: AgentConfig, kernel: KernelOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.node_name.is_empty(),
        "--node-name (NODE_NAME) is required"
    );
    let naming = kernel.naming.clone();
    let resync_interval = config.resync.interval;
    let client = make_client(&config).await?;
    let shared = metrics::Shared::new(resync_interval);
    // The kernel side first: it takes the writer lock and opens the
    // dataplane, and either failing is a reason not to start at all.
    let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
    let observer = worker::Forward::new(shared.clone(), reports_tx);
    let kernel = tokio::task::block_in_place(|| {
        KernelSide::start(
            kernel,
            "agent",
            DriverConfig::new(resync_interval),
            Box::new(observer),
        )
    })?;

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

    let observed = controller::Observed::default();
    let inputs = controller::watch_inputs(client.clone(), &config.node_name, observed.clone());
    let settings = controller::Settings::new(&config.node_name, naming);
    tracing::info!(node = %config.node_name, listen = %config.listen, "agent starting");
    let agent = controller::Agent::new(client, settings, kernel, reports, shared, observed);
    agent.run(inputs, shutdown_signal()).await;

    let _ = stop_tx.send(true);
    let _ = leader.await;
    let _ = server.await;
    tracing::info!("agent stopped");
    Ok(())
}
