//! The kernel side of every command: one thread inside the target network
//! namespace (`--netns`) that takes the writer lock, opens the dataplane and
//! then either does one job (`apply`, `sets`) or runs the manager's driver
//! loop (`run`, `agent`) fed through a channel. The rest of the process
//! (file watcher, API client, health listener) stays in its own namespace.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::dataplane::netns::{self, NetnsError};
use crate::dataplane::{Backend, Dataplane, OpenError, open};
use crate::ipset::Naming;
use crate::lock::{self, LockError, LockGuard};
use crate::manager::driver::{self, Command, DriverConfig, Observer};
use crate::manager::{Manager, ManagerConfig};

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

/// Take the writer lock (when `lock_as` names the command) and open the
/// dataplane, on the calling thread (already in the namespace).
fn prepare(
    opts: &KernelOptions,
    lock_as: Option<&str>,
) -> Result<(Option<LockGuard>, Box<dyn Dataplane>), KernelError> {
    let guard = match lock_as {
        Some(command) => Some(lock::acquire(&opts.naming, command, opts.lock_wait)?),
        None => None,
    };
    Ok((guard, open(opts.backend)?))
}

/// Run one job against the dataplane inside the namespace, holding the
/// writer lock for it when `lock_as` is given (readers take none).
pub fn run_once<T: Send>(
    opts: &KernelOptions,
    lock_as: Option<&str>,
    job: impl FnOnce(Box<dyn Dataplane>) -> T + Send,
) -> Result<T, KernelError> {
    netns::run_in(opts.netns.as_deref(), || {
        let (_guard, dp) = prepare(opts, lock_as)?;
        Ok(job(dp))
    })?
}

/// The driver loop on its own thread; commands go in through [`KernelSide::send`].
pub struct KernelSide {
    commands: mpsc::Sender<Command>,
    join: Option<JoinHandle<Result<(), NetnsError>>>,
}

impl KernelSide {
    /// Enter the namespace, take the lock as `command`, open the dataplane
    /// and start the driver; returns once all of that succeeded (or why not).
    pub fn start(
        opts: KernelOptions,
        command: &'static str,
        driver: DriverConfig,
        observer: Box<dyn Observer + Send>,
    ) -> Result<KernelSide, KernelError> {
        let ns = opts.netns.clone();
        Self::start_with(ns, driver, observer, move || {
            let (guard, dp) = prepare(&opts, Some(command))?;
            Ok((guard, dp, opts.naming))
        })
    }

    /// [`KernelSide::start`] with the lock and dataplane made by `make`
    /// (tests pass the in-memory model).
    pub fn start_with<D: Dataplane + 'static>(
        ns: Option<String>,
        driver: DriverConfig,
        mut observer: Box<dyn Observer + Send>,
        make: impl FnOnce() -> Result<(Option<LockGuard>, D, Naming), KernelError> + Send + 'static,
    ) -> Result<KernelSide, KernelError> {
        let (commands, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let join = netns::spawn_in(ns, "ipset-manager", move || {
            let (guard, dp, naming) = match make() {
                Ok(parts) => parts,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let config = ManagerConfig {
                naming,
                ..ManagerConfig::default()
            };
            driver::run(Manager::new(dp, config), &driver, &rx, observer.as_mut());
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
