//! The kernel side of every command: one thread inside the target network
//! namespace (`--netns`) that takes the writer lock, opens the kernel backend
//! (a [`SetsBackend`]: ipsets, nft sets or both) and then either does one job
//! (`apply`, `sets`) or runs the driver loop over it (`run`, `agent`) fed
//! through a channel. The rest of the process
//! (file watcher, API client, health listener) stays in its own namespace.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use ipsetmgr_dataplane::netns::{self, NetnsError};
use ipsetmgr_dataplane::{Backend, Dataplane, OpenError, open};
use ipsetmgr_ipset::Naming;
use ipsetmgr_manager::driver::{self, Command, DriverConfig, Observer};
use ipsetmgr_manager::{BothBackends, Manager, ManagerConfig, Retiring, SetsBackend};
use ipsetmgr_nft::backend::NftBackend;
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{NftError, Table, TableFamily};

use crate::lock::{self, LockError, LockGuard};

/// What `--backend` chooses: which kernel facility holds the sets, and how
/// this process talks to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelBackend {
    /// ipsets over native netlink (falls back to `cli` when the kernel
    /// lacks the ipset netlink protocol).
    Netlink,
    /// ipsets through the `ipset` binary.
    Cli,
    /// nf_tables named sets over native netlink (no `nft` binary).
    Nft,
    /// nf_tables named sets through `nft -j` (JSON).
    NftCli,
    /// The same sets as ipsets (netlink) and as nft sets (netlink).
    Both,
}

impl KernelBackend {
    pub const ALL: [KernelBackend; 5] = [
        KernelBackend::Netlink,
        KernelBackend::Cli,
        KernelBackend::Nft,
        KernelBackend::NftCli,
        KernelBackend::Both,
    ];

    /// The word `--backend` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelBackend::Netlink => "netlink",
            KernelBackend::Cli => "cli",
            KernelBackend::Nft => "nft",
            KernelBackend::NftCli => "nft-cli",
            KernelBackend::Both => "both",
        }
    }

    /// The kind of kernel set its reports describe, for metrics: `ipset`
    /// or `nft` (with `Both`, the ipset side's; the nft side's set names
    /// say `nft:`).
    pub fn sets_kind(self) -> &'static str {
        match self {
            KernelBackend::Netlink | KernelBackend::Cli | KernelBackend::Both => "ipset",
            KernelBackend::Nft | KernelBackend::NftCli => "nft",
        }
    }
}

impl std::str::FromStr for KernelBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<KernelBackend, String> {
        KernelBackend::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = KernelBackend::ALL.iter().map(|b| b.as_str()).collect();
                format!("unknown backend {s:?}: use one of {}", all.join(", "))
            })
    }
}

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
    pub backend: KernelBackend,
    /// The table whose sets the nft backends own (`--nft-family`, `--nft-table`).
    pub nft_table: Table,
    pub naming: Naming,
    /// How long to wait for another writer's lock.
    pub lock_wait: Duration,
    /// Remove the owned sets of the kernel facility `backend` does not use
    /// (ipsets under `nft`, nft sets under `netlink`), each once its policy
    /// is held by the one it uses: the agent's, after a backend switch.
    pub retire_other_backend: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("cannot open nf_tables netlink: {0}")]
    Nft(#[from] NftError),
    #[error("cannot start the manager thread: {0}")]
    Thread(std::io::Error),
    #[error("the manager thread stopped before it was ready")]
    Died,
}

/// An opened kernel, not yet a backend: opening can fail (no netlink, no
/// tool), choosing the manager's tunables cannot.
pub struct Opened {
    kernel: OpenedKernel,
    nft_table: Table,
    /// The other facility's backend, opened when asked for and available.
    retired: Option<RetiredKernel>,
}

/// The kernel facility `--backend` no longer selects.
enum RetiredKernel {
    Ipset(Box<dyn Dataplane>),
    Nft(NetlinkNft),
}

enum OpenedKernel {
    Ipset(Box<dyn Dataplane>),
    Nft(NetlinkNft),
    NftCli,
    Both(Box<dyn Dataplane>, NetlinkNft),
}

impl Opened {
    /// The backend over this kernel. `config.naming` says which sets it owns.
    pub fn into_backend(self, config: ManagerConfig) -> Box<dyn SetsBackend> {
        let table = self.nft_table;
        let active = Self::active(self.kernel, table.clone(), config.clone());
        match self.retired {
            None => active,
            Some(RetiredKernel::Ipset(dp)) => {
                Box::new(Retiring::new(active, Manager::new(dp, config)))
            }
            Some(RetiredKernel::Nft(nl)) => {
                Box::new(Retiring::new(active, NftBackend::new(nl, table, config)))
            }
        }
    }

    fn active(kernel: OpenedKernel, table: Table, config: ManagerConfig) -> Box<dyn SetsBackend> {
        match kernel {
            OpenedKernel::Ipset(dp) => Box::new(Manager::new(dp, config)),
            OpenedKernel::Nft(nl) => Box::new(NftBackend::new(nl, table, config)),
            OpenedKernel::NftCli => Box::new(NftBackend::cli(table, config)),
            OpenedKernel::Both(dp, nl) => Box::new(BothBackends::new(
                Manager::new(dp, config.clone()),
                NftBackend::new(nl, table, config),
            )),
        }
    }
}

/// Open what `opts.backend` needs (on the calling thread: in the namespace).
fn open_kernel(opts: &KernelOptions) -> Result<Opened, KernelError> {
    let mut opened = open_for(opts.backend, opts.nft_table.clone())?;
    if opts.retire_other_backend {
        opened.retired = open_retired(opts.backend);
    }
    Ok(opened)
}

/// The facility `backend` does not use, when this kernel has it (a kernel
/// without nf_tables has no nft sets to remove, and the reverse).
fn open_retired(backend: KernelBackend) -> Option<RetiredKernel> {
    let retired = match backend {
        KernelBackend::Netlink | KernelBackend::Cli => NetlinkNft::new()
            .map(RetiredKernel::Nft)
            .map_err(|e| e.to_string()),
        KernelBackend::Nft | KernelBackend::NftCli => open(Backend::Netlink)
            .map(RetiredKernel::Ipset)
            .map_err(|e| e.to_string()),
        KernelBackend::Both => return None,
    };
    retired
        .inspect_err(|e| {
            tracing::info!(error = %e, "the backend not selected cannot be opened; none of its sets are removed")
        })
        .ok()
}

/// Open what `backend` needs, its nft sets in `nft_table`, on the calling
/// thread (already in the namespace), without the writer lock: for
/// benchmarks and tests that drive a backend themselves.
pub fn open_for(backend: KernelBackend, nft_table: Table) -> Result<Opened, KernelError> {
    let kernel = match backend {
        KernelBackend::Netlink => OpenedKernel::Ipset(open(Backend::Netlink)?),
        KernelBackend::Cli => OpenedKernel::Ipset(open(Backend::Cli)?),
        KernelBackend::Nft => OpenedKernel::Nft(NetlinkNft::new()?),
        // `nft` is run per apply; a missing binary is that apply's error.
        KernelBackend::NftCli => OpenedKernel::NftCli,
        KernelBackend::Both => OpenedKernel::Both(open(Backend::Netlink)?, NetlinkNft::new()?),
    };
    Ok(Opened {
        kernel,
        nft_table,
        retired: None,
    })
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
            let config = ManagerConfig {
                naming: opts.naming,
                ..ManagerConfig::default()
            };
            Ok((guard, opened.into_backend(config)))
        })
    }

    /// [`KernelSide::start`] with the lock and backend made by `make` (the
    /// hollow agents pass the ipset manager over the in-memory model).
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
