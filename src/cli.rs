//! The `ipsetmgr` command: parse the command line (see `args`), set up
//! logging, and run the command. Every command's kernel side runs in
//! `kernel` (inside `--netns`, holding the writer lock when it writes);
//! anyhow is used only here, at the edge.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crate::args::{Cli, Command, XdpAction};
use crate::commands::{self, slice, xdp};
use ipsetmgr_cluster::logging;
use ipsetmgr_filemode::{apply, run, sets};
use ipsetmgr_ipset::Naming;
use ipsetmgr_node::{self as kernel, KernelOptions, KernelSide};
use ipsetmgr_sets::ReconcilerConfig;
use ipsetmgr_sets::driver::DriverConfig;

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
    logging::init(cli.log_format.into(), log_level(&cli.command));
    let naming = Naming::new(&cli.set_prefix)?;
    let opts = cli.kernel_options(naming.clone());
    match cli.command {
        Command::Apply(flags) => apply_command(&opts, naming, &flags.into_args()),
        Command::Run(flags) => run_command(opts, &naming, &flags.into_args()),
        Command::Sets => sets_command(&opts, &naming),
        Command::Agent(config) => block_on(commands::agent::run_agent(config, opts)),
        Command::Hollow(config) => block_on(commands::hollow::run_hollow(config, naming)),
        Command::Controller(config) => {
            block_on(commands::controller::run_controller(config, naming))
        }
        Command::Crd => crd_command(),
        // Files to objects: no kernel, no lock.
        Command::Slice(flags) => slice_command(&flags.into_args()),
        Command::Xdp(action) => xdp_command(&opts, &naming, &action),
    }
}

/// `xdp attach|detach`: inside `--netns` (the interface is looked up
/// there), the sets in `--bpf-path`. No writer lock: no set is written.
fn xdp_command(opts: &KernelOptions, naming: &Naming, action: &XdpAction) -> Result<bool> {
    use ipsetmgr_dataplane::netns;
    // Written from the namespace's thread: the unlocked handle is Send.
    let out = &mut std::io::stdout();
    match action {
        XdpAction::Attach {
            interface,
            drop_from,
        } => netns::run_in(opts.netns.as_deref(), || {
            xdp::attach(&opts.bpf_path, naming, interface, drop_from, out)
        })??,
        XdpAction::Detach { interface } => netns::run_in(opts.netns.as_deref(), || {
            xdp::detach(&opts.bpf_path, interface, out)
        })??,
    }
    Ok(true)
}

/// The commands that keep running log what they do; the others only
/// warnings (their output is the report).
fn log_level(command: &Command) -> &'static str {
    match command {
        Command::Run(_) | Command::Agent(_) | Command::Controller(_) | Command::Hollow(_) => "info",
        _ => "warn",
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
        let config = ReconcilerConfig {
            naming: naming.clone(),
            ..ReconcilerConfig::default()
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

/// `crd`: print the CRDs.
fn crd_command() -> Result<bool> {
    std::io::stdout().write_all(ipsetmgr_api::crd_yaml().as_bytes())?;
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
