//! The `ipsetmgr` binary: parse the command line (see `args`), set up
//! logging, and run the command. Every command's kernel side runs in
//! `ipsetmgr::kernel` (inside `--netns`, holding the writer lock when it
//! writes); anyhow is used only here, at the edge.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use ipsetmgr::args::{Cli, Command};
use ipsetmgr::commands::{apply, run, sets};
use ipsetmgr::ipset::Naming;
use ipsetmgr::kernel::{self, KernelOptions, KernelSide};
use ipsetmgr::logging;
use ipsetmgr::manager::driver::DriverConfig;

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
    let naming = Naming::new(&cli.set_prefix)?;
    let opts = KernelOptions {
        netns: cli.netns.clone(),
        backend: cli.backend,
        naming: naming.clone(),
        lock_wait: cli.lock_wait,
    };
    match cli.command {
        Command::Apply {
            paths,
            dry_run,
            prune,
            labels,
        } => {
            let args = apply::ApplyArgs {
                paths,
                dry_run,
                prune,
                labels: labels.labels(),
            };
            // A dry run only reads, so it never waits for a writer.
            let lock_as = (!dry_run).then_some("apply");
            let ok = kernel::run_once(&opts, lock_as, |dp| {
                apply::apply(dp, naming, &args, &mut std::io::stdout().lock())
            })??;
            Ok(ok)
        }
        Command::Run {
            policy_dir,
            resync,
            labels,
        } => {
            let args = run::RunArgs {
                policy_dir,
                resync_interval: resync.interval,
                labels: labels.labels(),
            };
            let side = KernelSide::start(
                opts,
                "run",
                DriverConfig::new(resync.interval),
                Box::new(run::LogReports),
            )?;
            let result = run::run(&side, &naming, &args);
            side.shutdown();
            result?;
            Ok(true)
        }
        Command::Sets => {
            kernel::run_once(&opts, None, |dp| {
                sets::sets(dp, &naming, &mut std::io::stdout().lock())
            })?
            .context("listing sets")?;
            Ok(true)
        }
        Command::Agent(config) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(ipsetmgr::agent::run_agent(config, opts))?;
            Ok(true)
        }
        Command::Crd => {
            std::io::stdout().write_all(ipsetmgr::crd_yaml().as_bytes())?;
            Ok(true)
        }
    }
}
