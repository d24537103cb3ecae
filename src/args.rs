//! The command line: every flag, its environment variable and its default,
//! each defined once (the chart and the docs use the same names).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::agent::AgentConfig;
use crate::dataplane::Backend;
use crate::duration;
use crate::logging::LogFormat;

/// Defaults shared by several flags, the chart and the docs.
pub mod defaults {
    /// Between full resyncs against the kernel.
    pub const RESYNC_INTERVAL: &str = "60s";
    /// The agent's /healthz, /readyz and /metrics listener.
    pub const LISTEN: &str = "0.0.0.0:9477";
    /// The controller's.
    pub const CONTROLLER_LISTEN: &str = "0.0.0.0:9478";
    /// The namespace the agent and controller run in (their Lease, Events).
    pub const NAMESPACE: &str = "ipsetmgr-system";
    /// How long a writer waits for another writer's lock.
    pub const LOCK_WAIT: &str = "30s";
    /// Between heartbeats of a node's IPSetNodeState.
    pub const HEARTBEAT_INTERVAL: &str = "60s";
}

#[derive(Parser)]
#[command(
    name = "ipsetmgr",
    version,
    about = "Keeps Linux ipsets equal to declared IPSetPolicies"
)]
pub struct Cli {
    /// Run the kernel side inside this named network namespace (created
    /// when missing), so the host's own firewall is never touched. Only the
    /// kernel side moves: the API client and listeners stay where they are.
    #[arg(long, global = true, value_name = "NAME")]
    pub netns: Option<String>,
    /// Prefix of the kernel sets this tool owns (1-8 letters or digits).
    #[arg(long, global = true, env = "IPSETMGR_SET_PREFIX", default_value = crate::ipset::Naming::DEFAULT_PREFIX)]
    pub set_prefix: String,
    /// Dataplane backend: `netlink` (native, the default; falls back to cli
    /// when the kernel lacks it) or `cli` (the `ipset` binary).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_BACKEND",
        default_value = "netlink"
    )]
    pub backend: Backend,
    /// Log format on stderr.
    #[arg(long, global = true, env = "IPSETMGR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// How long a command that writes to the kernel waits for another
    /// ipsetmgr writing the same prefix in this network namespace (0: fail at
    /// once).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_LOCK_WAIT",
        value_name = "DURATION",
        default_value = defaults::LOCK_WAIT,
        value_parser = duration::parse_duration
    )]
    pub lock_wait: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Reconcile the kernel once with the policies in files or directories.
    Apply {
        /// Policy file or directory (repeatable).
        #[arg(
            short = 'f',
            long = "filename",
            required = true,
            value_name = "FILE|DIR"
        )]
        paths: Vec<PathBuf>,
        /// Print the planned operations without changing the kernel.
        #[arg(long)]
        dry_run: bool,
        /// Also delete owned sets that no given policy wants.
        #[arg(long)]
        prune: bool,
        #[command(flatten)]
        labels: NodeLabels,
    },
    /// Keep the kernel in line with a policy directory: react to file
    /// changes and SIGHUP, resync periodically.
    Run {
        #[arg(long, value_name = "DIR")]
        policy_dir: PathBuf,
        #[command(flatten)]
        resync: Resync,
        #[command(flatten)]
        labels: NodeLabels,
    },
    /// List the owned sets in this kernel with their counts.
    Sets,
    /// Run the per-node Kubernetes agent (normally as a DaemonSet).
    Agent(AgentConfig),
    /// Run the cluster's controller (normally a small Deployment): policy
    /// validation and status, from the nodes' states.
    Controller(crate::controller::ControllerConfig),
    /// Print the IPSetPolicy CustomResourceDefinition.
    Crd,
}

/// `--resync-interval`, for every command with a driver loop.
#[derive(Clone, Debug, clap::Args)]
pub struct Resync {
    /// Time between full resyncs against the kernel (60, 60s, 5m, 1h30m).
    #[arg(long = "resync-interval", env = "IPSETMGR_RESYNC_INTERVAL", default_value = defaults::RESYNC_INTERVAL, value_parser = duration::parse_positive)]
    pub interval: Duration,
}

/// `--node-label` for file mode: the labels nodeSelectors are matched to.
#[derive(Clone, Debug, clap::Args)]
pub struct NodeLabels {
    /// Evaluate nodeSelectors against this label (repeatable, KEY=VALUE);
    /// without any, selectors are ignored.
    #[arg(long = "node-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub pairs: Vec<(String, String)>,
}

impl NodeLabels {
    /// `None` without labels: selectors are ignored.
    pub fn labels(&self) -> Option<BTreeMap<String, String>> {
        (!self.pairs.is_empty()).then(|| self.pairs.iter().cloned().collect())
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err("label key is empty".into());
    }
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let cli = Cli::try_parse_from(["ipsetmgr", "run", "--policy-dir", "/d"]).unwrap();
        assert_eq!(cli.set_prefix, "ipm");
        assert_eq!(cli.lock_wait, Duration::from_secs(30));
        let Command::Run { resync, labels, .. } = cli.command else {
            panic!("run")
        };
        assert_eq!(resync.interval, Duration::from_secs(60));
        assert_eq!(labels.labels(), None);
        assert!(Cli::try_parse_from(["ipsetmgr", "--lock-wait", "0", "sets"]).is_ok());
        assert!(Cli::try_parse_from(["ipsetmgr", "--backend", "iptables", "sets"]).is_err());
        assert!(
            Cli::try_parse_from(["ipsetmgr", "apply", "-f", "x", "--node-label", "=v"]).is_err()
        );
    }
}
