//! The `ipsetmgr` command line: file mode (`apply`, `run`, `sets`), the
//! cluster agent (`agent`) and the CRD (`crd`). Commands that write to the
//! kernel hold the per-namespace lock of [`ipsetmgr::lock`] while they run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use ipsetmgr::agent::AgentConfig;
use ipsetmgr::commands::{apply, run, sets};
use ipsetmgr::dataplane::{Backend, open};
use ipsetmgr::duration;
use ipsetmgr::ipset::Naming;
use ipsetmgr::lock::{self, LockGuard};
use ipsetmgr::logging::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "ipsetmgr",
    version,
    about = "Keeps Linux ipsets equal to declared IPSetPolicies"
)]
struct Cli {
    /// Run inside this named network namespace (created when missing), so the
    /// host's own firewall is never touched.
    #[arg(long, global = true, value_name = "NAME")]
    netns: Option<String>,
    /// Prefix of the kernel sets this tool owns (1-8 letters or digits).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_SET_PREFIX",
        default_value = "ipm"
    )]
    set_prefix: String,
    /// Dataplane backend: `netlink` (native, the default; falls back to cli
    /// when the kernel lacks it) or `cli` (the `ipset` binary).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_BACKEND",
        default_value = "netlink"
    )]
    backend: Backend,
    /// Log format on stderr.
    #[arg(long, global = true, env = "IPSETMGR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// How long a command that writes to the kernel waits for another
    /// ipsetmgr writing the same prefix in this network namespace (0: fail at
    /// once).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_LOCK_WAIT",
        value_name = "DURATION",
        default_value = "30s",
        value_parser = duration::parse_duration
    )]
    lock_wait: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        /// Evaluate nodeSelectors against this label (repeatable, KEY=VALUE);
        /// without any, selectors are ignored.
        #[arg(long = "node-label", value_name = "KEY=VALUE", value_parser = parse_label)]
        node_labels: Vec<(String, String)>,
    },
    /// Keep the kernel in line with a policy directory: react to file
    /// changes, resync periodically.
    Run {
        #[arg(long, value_name = "DIR")]
        policy_dir: PathBuf,
        /// Time between full resyncs against the kernel (60, 60s, 5m, ...).
        #[arg(long, env = "IPSETMGR_RESYNC_INTERVAL", default_value = "60s", value_parser = duration::parse_positive)]
        resync_interval: Duration,
        #[arg(long = "node-label", value_name = "KEY=VALUE", value_parser = parse_label)]
        node_labels: Vec<(String, String)>,
    },
    /// List the owned sets in this kernel with their counts.
    Sets,
    /// Run the per-node Kubernetes agent (normally as a DaemonSet).
    Agent(AgentConfig),
    /// Print the IPSetPolicy CustomResourceDefinition.
    Crd,
}

type BoxedDataplane = Box<dyn ipsetmgr::dataplane::Dataplane>;

/// Take the writer lock, then open the dataplane, from a thread inside `ns`:
/// a netlink socket binds to that namespace and the lock is keyed by it,
/// while the calling thread stays where it is.
fn open_in_netns(
    ns: &str,
    backend: Backend,
    naming: &Naming,
    lock_wait: Duration,
) -> Result<(LockGuard, BoxedDataplane)> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<(LockGuard, BoxedDataplane)> {
                if ipsetmgr::dataplane::netns::enter(ns)? {
                    eprintln!("created network namespace {ns}");
                }
                // After `enter`: the lock key is this thread's namespace.
                let guard = lock::acquire(naming, "agent", lock_wait)?;
                Ok((guard, open(backend)?))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("opening the dataplane in {ns} panicked"))?
    })
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

fn labels(pairs: Vec<(String, String)>) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| pairs.into_iter().collect())
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<bool> {
    let cli = Cli::parse();
    let level = match cli.command {
        Command::Run { .. } | Command::Agent(_) => "info",
        _ => "warn",
    };
    logging::init(cli.log_format, level);
    // Before any other thread exists: setns moves only the calling thread.
    // The agent is the exception: only its kernel side goes into the
    // namespace, so it can still reach the API server.
    let is_agent = matches!(cli.command, Command::Agent(_));
    if let Some(ns) = cli.netns.as_deref().filter(|_| !is_agent) {
        let created = ipsetmgr::dataplane::netns::enter(ns)?;
        if created {
            eprintln!("created network namespace {ns}");
        }
    }
    let naming = Naming::new(&cli.set_prefix)?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Apply {
            paths,
            dry_run,
            prune,
            node_labels,
        } => {
            // A dry run only reads, so it never waits for a writer.
            let _lock = if dry_run {
                None
            } else {
                Some(lock::acquire(&naming, "apply", cli.lock_wait)?)
            };
            let dp = open(cli.backend)?;
            let args = apply::ApplyArgs {
                paths,
                dry_run,
                prune,
                labels: labels(node_labels),
            };
            Ok(apply::apply(dp, naming, &args, &mut out)?)
        }
        Command::Run {
            policy_dir,
            resync_interval,
            node_labels,
        } => {
            // Held until `run` returns: the whole lifetime of the process.
            let _lock = lock::acquire(&naming, "run", cli.lock_wait)?;
            let dp = open(cli.backend)?;
            let args = run::RunArgs {
                policy_dir,
                resync_interval,
                labels: labels(node_labels),
            };
            run::run(dp, naming, &args)?;
            Ok(true)
        }
        Command::Sets => {
            let dp = open(cli.backend)?;
            sets::sets(dp, &naming, &mut out).context("listing sets")?;
            Ok(true)
        }
        Command::Agent(mut config) => {
            config.set_prefix = naming.prefix().to_string();
            config.dataplane_netns = cli.netns.clone();
            // The guard lives until `run_agent` returns.
            let (_lock, dp) = match &cli.netns {
                Some(ns) => open_in_netns(ns, cli.backend, &naming, cli.lock_wait)?,
                None => (
                    lock::acquire(&naming, "agent", cli.lock_wait)?,
                    open(cli.backend)?,
                ),
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(ipsetmgr::run_agent(config, dp))?;
            Ok(true)
        }
        Command::Crd => {
            use std::io::Write;
            out.write_all(ipsetmgr::crd_yaml().as_bytes())?;
            Ok(true)
        }
    }
}
