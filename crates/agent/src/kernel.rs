//! The kernel side of every command: one thread inside the target network
//! namespace (`--netns`) that takes the writer lock, opens the dataplane and
//! then either does one job (`apply`, `sets`) or runs the manager's driver
//! loop (`run`, `agent`) fed through a channel. The rest of the process
//! (file watcher, API client, health listener) stays in its own namespace.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::lock::{self, LockError, LockGuard};
use ipsetmgr_dataplane::netns::{self, NetnsError};
use ipsetmgr_dataplane::{Backend, Dataplane, OpenError, open};
use ipsetmgr_ipset::Naming;
use ipsetmgr_manager::driver::{self, Command, DriverConfig, Observer};
use ipsetmgr_manager::{Manager, ManagerConfig, SetsBackend};

/// Where and how the kernel side runs.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    pub netns: Option<String>,
    pub backend: Backend,
    pub naming: Naming,
    /// How long to wait for another writer's lock.
    pub lock_wait: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("cannot start the manager thread: {0}")]
    Thread(std::io::Error),
    #[error("the manager thread stopped before it was ready")]
    Died,
}

/// An opened kernel, not yet a backend: opening can fail (no netlink, no
/// tool), choosing the manager's tunables cannot.
pub struct Opened {
    dataplane: Box<dyn Dataplane>,
}

impl Opened {
    /// The backend over this kernel. `config.naming` says which sets it owns.
    pub fn into_backend(self, config: ManagerConfig) -> Box<dyn SetsBackend> {
        Box::new(Manager::new(self.dataplane, config))
    }
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
    let dataplane = open(opts.backend)?;
    Ok((guard, Opened { dataplane }))
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
