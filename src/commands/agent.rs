//! `ipsetmgr agent`: the per-node agent's parts (`crate::agent`) wired
//! together with its kernel side, listeners and client.

use crate::args::AgentConfig;
use ipsetmgr_agent::api_side::ApiSide;
use ipsetmgr_agent::{event_loop, metrics, node_state, worker};
use ipsetmgr_cluster::client::{make_client, shutdown_signal};
use ipsetmgr_node::{KernelOptions, KernelSide};
use ipsetmgr_sets::driver::DriverConfig;

/// Run the agent until SIGTERM/SIGINT. The kernel is never touched on the
/// way out: watches stop, the current apply finishes, the process exits.
pub async fn run_agent(config: AgentConfig, kernel: KernelOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.node_name.is_empty(),
        "--node-name (NODE_NAME) is required"
    );
    tracing::info!(
        version = ipsetmgr_cluster::telemetry::build_info::VERSION,
        revision = ipsetmgr_cluster::telemetry::build_info::REVISION,
        node = %config.node_name,
        backend = %kernel.backend,
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
    let sets_kinds = kernel.backend.kinds();
    // An agent is the only writer of its node's owned sets: after a backend
    // switch, the other facility's sets are its to remove.
    let kernel = KernelOptions {
        retire_other_backend: true,
        ..kernel
    };
    let kernel = tokio::task::block_in_place(|| {
        KernelSide::start(
            kernel,
            "agent",
            DriverConfig::new(resync_interval),
            Box::new(observer),
        )
    })?;

    let server = ipsetmgr_cluster::server::Server::start(
        config.health_listen,
        config.listen,
        shared.clone(),
    )
    .await?;

    let mut settings = event_loop::Settings::new(naming, config.heartbeat_interval);
    settings.limits = config.limits.into();
    settings.sets_kinds = sets_kinds;
    ApiSide::start(
        &client,
        &config.node_name,
        node_state::Pacing::from(config.node_state),
        settings,
        Box::new(kernel),
        reports,
        shared,
    )
    .run(shutdown_signal())
    .await;

    let _ = server.stop().await;
    tracing::info!("agent stopped");
    Ok(())
}
