//! `ipsetmgr agent`: the per-node agent's parts (`crate::agent`) wired
//! together with its kernel side, listeners and client.

use crate::args::AgentConfig;
use crate::commands::xdp_keeper;
use ipsetmgr_agent::api_side::ApiSide;
use ipsetmgr_agent::{event_loop, metrics, node_state, worker};
use ipsetmgr_bpf::XdpKeeper;
use ipsetmgr_cluster::client::{make_client, shutdown_signal};
use ipsetmgr_node::{KernelBackend, KernelOptions, KernelSide};
use ipsetmgr_sets::driver::DriverConfig;

/// Run the agent until SIGTERM/SIGINT. The kernel is never touched on the
/// way out: watches stop, the current apply finishes, the process exits.
pub async fn run_agent(config: AgentConfig, kernel: KernelOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.node_name.is_empty(),
        "--node-name (NODE_NAME) is required"
    );
    let xdp = xdp_keeper_of(&config, &kernel)?;
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
    let (kernel_netns, bpf_path) = (kernel.netns.clone(), kernel.bpf_path.clone());
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

    // After the kernel side: it has opened (or mounted) the bpffs.
    let xdp = match xdp {
        Some(keeper) => Some(xdp_keeper::start(
            kernel_netns.clone(),
            bpf_path.clone(),
            keeper,
            shared.clone(),
        )?),
        None => None,
    };

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
    // The program stays attached: fail static (docs/bpf.md).
    if let Some(xdp) = xdp {
        tokio::task::block_in_place(|| xdp.stop());
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// The XDP keeper `--xdp-interface` asks for, if any; refused unless
/// `--backend` lists `bpf` (the program reads the bpf backend's sets).
fn xdp_keeper_of(
    config: &AgentConfig,
    kernel: &KernelOptions,
) -> anyhow::Result<Option<XdpKeeper>> {
    let Some(interface) = config.xdp.xdp_interface.clone() else {
        return Ok(None);
    };
    anyhow::ensure!(
        kernel.backend.as_slice().contains(&KernelBackend::Bpf),
        "--xdp-interface {interface} needs the bpf backend (the program drops from the policies' BPF sets): --backend is {}; add bpf to it, e.g. --backend {},bpf",
        kernel.backend,
        kernel.backend
    );
    let keeper = XdpKeeper::new(
        interface,
        config.xdp.xdp_drop_from.clone(),
        kernel.naming.clone(),
    )
    .map_err(|e| anyhow::anyhow!("--xdp-interface/--xdp-drop-from: {e}"))?;
    Ok(Some(keeper))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn keeper(argv: &[&str]) -> anyhow::Result<Option<XdpKeeper>> {
        let cli = Cli::try_parse_from(argv).unwrap();
        let kernel = cli.kernel_options(ipsetmgr_ipset::Naming::default());
        let Command::Agent(config) = cli.command else {
            panic!("agent")
        };
        xdp_keeper_of(&config, &kernel)
    }

    #[test]
    fn xdp_needs_the_bpf_backend_and_a_valid_interface() {
        let agent = [
            "ipsetmgr",
            "--backend",
            "netlink",
            "agent",
            "--node-name",
            "n",
        ];
        assert!(keeper(&agent).unwrap().is_none());
        let xdp = ["--xdp-interface", "eth0", "--xdp-drop-from", "block"];
        let err = keeper(&[&agent[..], &xdp[..]].concat()).unwrap_err();
        assert!(
            err.to_string().contains("needs the bpf backend")
                && err.to_string().contains("netlink,bpf"),
            "{err}"
        );
        let mut with_bpf = agent;
        with_bpf[2] = "netlink,bpf";
        let kept = keeper(&[&with_bpf[..], &xdp[..]].concat()).unwrap();
        assert_eq!(kept.unwrap().interface(), "eth0");
        let bad = ["--xdp-interface", "a/b", "--xdp-drop-from", "block"];
        let err = keeper(&[&with_bpf[..], &bad[..]].concat()).unwrap_err();
        assert!(err.to_string().contains("invalid interface name"), "{err}");
    }
}
