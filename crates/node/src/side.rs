//! The kernel side of every command: one thread inside the target network
//! namespace (`--netns`) that takes the writer lock, opens the kernels of
//! the backend list (a [`SetsBackend`]: ipsets, nft sets, or several) and
//! then either does one job (`apply`, `sets`) or runs the driver loop over
//! it (`run`, `agent`) fed through a channel. The rest of the process (file
//! watcher, API client, health listener) stays in its own namespace.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use ipsetmgr_dataplane::netns::{self, NetnsError};
use ipsetmgr_ipset::Naming;
use ipsetmgr_nft::{Table, TableFamily};
use ipsetmgr_sets::driver::{self, Command, DriverConfig, Observer};
use ipsetmgr_sets::{ReconcilerConfig, SetsBackend};

use crate::KernelError;
use crate::lock::{self, LockGuard};
use crate::registry::{BackendList, Opened};

/// `--nft-family`: the table family, as `nft` spells it.
pub fn parse_table_family(s: &str) -> Result<TableFamily, String> {
    TableFamily::from_nft_name(s).ok_or_else(|| {
        let all: Vec<&str> = TableFamily::ALL.iter().map(|f| f.nft_name()).collect();
        format!(
            "unknown nft table family {s:?}: use one of {}",
            all.join(", ")
        )
    })
}

/// `--nft-table`: a table name nft accepts.
pub fn parse_table_name(s: &str) -> Result<String, String> {
    if ipsetmgr_nft::is_valid_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid nft table name {s:?}: 1 to {} characters, a letter first, then letters, digits, '_', '-' or '.'",
            ipsetmgr_nft::MAX_NAME_LEN
        ))
    }
}

/// Where and how the kernel side runs.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    pub netns: Option<String>,
    pub backend: BackendList,
    /// The table whose sets the nft backends own (`--nft-family`, `--nft-table`).
    pub nft_table: Table,
    /// The bpffs whose `ipsetmgr/` pins the bpf backend owns (`--bpf-path`).
    pub bpf_path: std::path::PathBuf,
    pub naming: Naming,
    /// How long to wait for another writer's lock.
    pub lock_wait: Duration,
    /// Remove the owned sets of the kinds `backend` does not use (ipsets
    /// under `nft`, nft sets under `netlink`), each once its policy is held
    /// by the ones it uses: the agent's, after a backend switch.
    pub retire_other_backend: bool,
}

/// Open what `opts.backend` needs (on the calling thread: in the namespace).
fn open_kernel(opts: &KernelOptions) -> Result<Opened, KernelError> {
    let mut opened = Opened::open(&opts.backend, opts.nft_table.clone(), &opts.bpf_path)?;
    if opts.retire_other_backend {
        opened.retire_others(&opts.backend);
    }
    Ok(opened)
}

/// Take the writer lock (when `lock_as` names the command) and open the
/// kernel, on the calling thread (already in the namespace).
fn prepare(
    opts: &KernelOptions,
    lock_as: Option<&str>,
) -> Result<(Option<LockGuard>, Opened), KernelError> {
    let guard = match lock_as {
        Some(command) => Some(lock::acquire(&opts.naming, command, opts.lock_wait)?),
        None => None,
    };
    Ok((guard, open_kernel(opts)?))
}

/// Run one job against the kernel inside the namespace, holding the writer
/// lock for it when `lock_as` is given (readers take none).
pub fn run_once<T: Send>(
    opts: &KernelOptions,
    lock_as: Option<&str>,
    job: impl FnOnce(Opened) -> T + Send,
) -> Result<T, KernelError> {
    netns::run_in(opts.netns.as_deref(), || {
        let (_guard, opened) = prepare(opts, lock_as)?;
        Ok(job(opened))
    })?
}

/// The driver loop on its own thread; commands go in through [`KernelSide::send`].
pub struct KernelSide {
    commands: mpsc::Sender<Command>,
    join: Option<JoinHandle<Result<(), NetnsError>>>,
}

impl KernelSide {
    /// Enter the namespace, take the lock as `command`, open the backend
    /// and start the driver; returns once all of that succeeded (or why not).
    pub fn start(
        opts: KernelOptions,
        command: &'static str,
        driver: DriverConfig,
        observer: Box<dyn Observer + Send>,
    ) -> Result<KernelSide, KernelError> {
        let ns = opts.netns.clone();
        Self::start_with(ns, driver, observer, move || {
            let (guard, opened) = prepare(&opts, Some(command))?;
            let config = ReconcilerConfig {
                naming: opts.naming,
                ..ReconcilerConfig::default()
            };
            Ok((guard, opened.into_backend(config)))
        })
    }

    /// [`KernelSide::start`] with the lock and backend made by `make` (the
    /// hollow agents pass the ipset reconciler over the in-memory model).
    pub fn start_with<B: SetsBackend + 'static>(
        ns: Option<String>,
        driver: DriverConfig,
        mut observer: Box<dyn Observer + Send>,
        make: impl FnOnce() -> Result<(Option<LockGuard>, B), KernelError> + Send + 'static,
    ) -> Result<KernelSide, KernelError> {
        let (commands, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let join = netns::spawn_in(ns, "ipset-manager", move || {
            let (guard, mut backend) = match make() {
                Ok(parts) => parts,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            driver::run(&mut backend, &driver, &rx, observer.as_mut());
            tracing::info!("manager thread stopped; kernel left as it is");
            drop(guard);
        })
        .map_err(KernelError::Thread)?;
        match ready.recv() {
            Ok(Ok(())) => Ok(KernelSide {
                commands,
                join: Some(join),
            }),
            Ok(Err(e)) => {
                let _ = join.join();
                Err(e)
            }
            // The thread ended without a word: it could not enter the namespace.
            Err(_) => match join.join() {
                Ok(Err(e)) => Err(e.into()),
                _ => Err(KernelError::Died),
            },
        }
    }

    /// Hand a command to the driver. A send error means the thread died,
    /// which health checks report.
    pub fn send(&self, cmd: Command) {
        if self.commands.send(cmd).is_err() {
            tracing::error!("the manager thread is gone");
        }
    }

    /// Ask the driver to stop and wait for its current apply to finish.
    pub fn shutdown(mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(join) = self.join.take() {
            let _ = join.join();
        }
    }
}
