//! Cluster mode: the per-node agent (see `docs/architecture.md`).
//!
//! - [`inputs`]: what it watches (policies, slices, its Node, the CRDs);
//! - [`store`]: what it keeps of them, compactly;
//! - [`event_loop`]: recompiles and hands desired states to the kernel side;
//! - [`node_state`]: this node's `IPSetNodeState` and the task writing it;
//! - [`worker`]: the kernel side's reports back into the loop;
//! - [`metrics`]: Prometheus metrics and health facts.

pub mod event_loop;
pub mod hollow;
pub mod inputs;
pub mod metrics;
pub mod node_state;
pub mod store;
pub mod worker;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::args::defaults;
use crate::cluster::client::{make_client, shutdown_signal};
use crate::kernel::{KernelOptions, KernelSide};
use crate::manager::driver::DriverConfig;

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
    /// Address of the /metrics listener.
    #[arg(long, env = "IPSETMGR_LISTEN", default_value = defaults::LISTEN)]
    pub listen: SocketAddr,
    /// Address of the /healthz, /livez and /readyz listener (the same as
    /// --listen: one listener serves all).
    #[arg(long, env = "IPSETMGR_HEALTH_LISTEN", default_value = defaults::HEALTH_LISTEN)]
    pub health_listen: SocketAddr,
    /// Time between heartbeats of this node's IPSetNodeState: the
    /// controller counts a node whose heartbeat is older than three of
    /// these as not synced.
    #[arg(long, env = "IPSETMGR_HEARTBEAT_INTERVAL", default_value = defaults::HEARTBEAT_INTERVAL, value_parser = crate::duration::parse_positive)]
    pub heartbeat_interval: Duration,
    #[command(flatten)]
    pub limits: crate::cluster::slices::ClusterLimits,
    #[command(flatten)]
    pub node_state: node_state::Pacing,
}

/// Run the agent until SIGTERM/SIGINT. The kernel is never touched on the
/// way out: watches stop, the current apply finishes, the process exits.
pub async fn run_agent(config: AgentConfig, kernel: KernelOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.node_name.is_empty(),
        "--node-name (NODE_NAME) is required"
    );
    tracing::info!(
        version = crate::telemetry::build_info::VERSION,
        revision = crate::telemetry::build_info::REVISION,
        node = %config.node_name,
        backend = ?kernel.backend,
        set_prefix = kernel.naming.prefix(),
        netns = kernel.netns.as_deref().unwrap_or("(own)"),
        resync_interval = ?config.resync.interval,
        heartbeat_interval = ?config.heartbeat_interval,
        listen = %config.listen,
        health_listen = %config.health_listen,
        "agent starting"
    );
    let naming = kernel.naming.clone();
    let resync_interval = config.resync.interval;
    let client = make_client(config.kubeconfig.as_deref()).await?;
    let shared = metrics::Shared::new(resync_interval);
    // The kernel side first: it takes the writer lock and opens the
    // dataplane, and either failing is a reason not to start at all.
    let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
    let observer = worker::Forward::new(shared.clone(), reports_tx);
    let sets_kind = kernel.backend.sets_kind();
    let kernel = tokio::task::block_in_place(|| {
        KernelSide::start(
            kernel,
            "agent",
            DriverConfig::new(resync_interval),
            Box::new(observer),
        )
    })?;

    let listeners = crate::server::bind(config.health_listen, config.listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(crate::server::serve_all(listeners, shared.clone(), stop_rx));

    let (status_tx, status_rx) = tokio::sync::watch::channel(None);
    let writer = tokio::spawn(node_state::run_writer(
        client.clone(),
        config
            .node_state
            .writer(&config.node_name, config.heartbeat_interval),
        status_rx,
        shared.clone(),
    ));

    let crds = inputs::guarded_crds();
    let inputs = inputs::watch_inputs(client, &config.node_name);
    let mut settings = event_loop::Settings::new(naming, config.heartbeat_interval);
    settings.limits = config.limits;
    settings.sets_kind = sets_kind;
    let agent = event_loop::Agent::new(
        settings,
        &crds,
        Box::new(kernel),
        reports,
        status_tx,
        shared,
    );
    agent.run(inputs, shutdown_signal()).await;

    // The loop dropped the status sender: the writer ends.
    let _ = writer.await;
    let _ = stop_tx.send(true);
    let _ = server.await;
    tracing::info!("agent stopped");
    Ok(())
}
