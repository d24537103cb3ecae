//! The `ipsetmgr` command: parse the command line (see `args`), set up
//! logging, and run the command. Every command's kernel side runs in
//! `kernel` (inside `--netns`, holding the writer lock when it writes);
//! anyhow is used only here, at the edge.

use ipsetmgr_feeds::egress::Setting as EgressSetting;
use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crate::args::{Cli, Command};
use crate::commands::{self, apply, run, sets, slice};
use ipsetmgr_agent::kernel::{self, KernelOptions, KernelSide};
use ipsetmgr_cluster::logging;
use ipsetmgr_ipset::Naming;
use ipsetmgr_manager::ManagerConfig;
use ipsetmgr_manager::driver::DriverConfig;

/// Run the command line; exit 0 on success, 1 when something failed, 2 on
/// usage errors (and anything that stops a command before it starts).
pub fn main() -> ExitCode {
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
        Command::Run { .. } | Command::Agent(_) | Command::Controller(_) | Command::Hollow(_) => {
            "info"
        }
        _ => "warn",
    };
    logging::init(cli.log_format.into(), level);
    let naming = Naming::new(&cli.set_prefix)?;
    let opts = KernelOptions {
        netns: cli.netns.clone(),
        backend: cli.backend,
        nft_table: ipsetmgr_nft::Table::new(cli.nft_family, cli.nft_table.clone()),
        naming: naming.clone(),
        lock_wait: cli.lock_wait,
    };
    match cli.command {
        Command::Apply {
            paths,
            dry_run,
            prune,
            members,
            labels,
            egress,
        } => {
            let args = apply::ApplyArgs {
                paths,
                members,
                dry_run,
                prune,
                labels: labels.labels(),
                egress: egress.guard(EgressSetting::Files),
            };
            apply_command(&opts, naming, &args)
        }
        Command::Run {
            policy_dir,
            resync,
            labels,
            egress,
        } => {
            let args = run::RunArgs {
                policy_dir,
                resync_interval: resync.interval,
                labels: labels.labels(),
                egress: egress.guard(EgressSetting::Files),
            };
            run_command(opts, &naming, &args)
        }
        Command::Sets => sets_command(&opts, &naming),
        Command::Agent(config) => block_on(commands::agent::run_agent(config, opts)),
        Command::Hollow(config) => block_on(commands::hollow::run_hollow(config, naming)),
        Command::Controller(config) => {
            block_on(commands::controller::run_controller(config, naming))
        }
        Command::Crd => {
            std::io::stdout().write_all(ipsetmgr_api::crd_yaml().as_bytes())?;
            Ok(true)
        }
        // Files to objects: no kernel, no lock.
        Command::Slice {
            policy,
            input,
            max_members,
            set_type,
            family,
            output,
            output_format,
            format,
        } => {
            let check = match set_type {
                Some(set_type) => slice::Check::Typed {
                    set_type,
                    family: family.unwrap_or_default(),
                },
                None => slice::Check::Schema,
            };
            let args = slice::SliceArgs {
                policy,
                input,
                input_format: format,
                check,
                max_members: max_members as usize,
                output,
                output_format,
            };
            slice_command(&args)
        }
    }
}

/// `apply`: reconcile once (a dry run only reads, so it never waits for a
/// writer).
fn apply_command(opts: &KernelOptions, naming: Naming, args: &apply::ApplyArgs) -> Result<bool> {
    let lock_as = (!args.dry_run).then_some("apply");
    let files = apply::load_inputs(&naming, args);
    let ok = kernel::run_once(opts, lock_as, |opened| {
        apply::apply(opened, naming, files, args, &mut std::io::stdout().lock())
    })??;
    Ok(ok)
}

/// `run`: the kernel side, then the file watch until a signal.
fn run_command(opts: KernelOptions, naming: &Naming, args: &run::RunArgs) -> Result<bool> {
    let side = KernelSide::start(
        opts,
        "run",
        DriverConfig::new(args.resync_interval),
        Box::new(run::LogReports),
    )?;
    let result = run::run(&side, naming, args);
    side.shutdown();
    tracing::info!("stopped; kernel sets are left as they are");
    result?;
    Ok(true)
}

/// `sets`: list the owned sets (reads only: no lock).
fn sets_command(opts: &KernelOptions, naming: &Naming) -> Result<bool> {
    kernel::run_once(opts, None, |opened| {
        let config = ManagerConfig {
            naming: naming.clone(),
            ..ManagerConfig::default()
        };
        sets::sets(
            opened.into_backend(config),
            naming,
            &mut std::io::stdout().lock(),
        )
    })?
    .context("listing sets")?;
    Ok(true)
}

/// `slice`: a member list to IPSetMemberSlice objects.
fn slice_command(args: &slice::SliceArgs) -> Result<bool> {
    let ok = slice::slice(
        args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )?;
    Ok(ok)
}

/// The cluster roles are async: run one on a runtime of its own.
fn block_on(role: impl std::future::Future<Output = Result<()>>) -> Result<bool> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(role)?;
    Ok(true)
}
