//! The manager on its own OS thread. The manager is synchronous and may
//! block on the kernel; it is fed complete desired states through a channel
//! and runs periodic resyncs and isolated-set retries on its own clock, so
//! it keeps repairing drift even when the API server is unreachable.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Shared;
use crate::dataplane::Dataplane;
use crate::manager::{ApplyOutcome, DeletionReport, Manager, SetReport};
use crate::policy::DesiredSet;

pub enum Command {
    /// The complete desired state of this node (never a partial one).
    Desired {
        seq: u64,
        sets: Vec<DesiredSet>,
        held: Vec<String>,
    },
    /// Finish the current apply and stop, leaving the kernel as it is.
    Shutdown,
}

/// What the manager reports after each apply.
#[derive(Clone, Debug)]
pub struct Report {
    /// The `seq` of the desired state this report describes.
    pub seq: u64,
    pub outcome: ApplyOutcome,
    pub sets: Vec<SetReport>,
    pub deletions: Vec<DeletionReport>,
    /// The apply started with a full resync (problem counts are fresh).
    pub full_resync: bool,
}

pub struct WorkerHandle {
    tx: mpsc::Sender<Command>,
    join: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    pub fn send(&self, cmd: Command) {
        // The worker only stops after Shutdown; a send error means it died,
        // which the health check reports.
        if self.tx.send(cmd).is_err() {
            tracing::error!("manager thread is gone");
        }
    }

    /// Ask the worker to stop and wait for its current apply to finish.
    pub async fn shutdown(mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(join) = self.join.take() {
            let _ = tokio::task::spawn_blocking(move || join.join()).await;
        }
    }
}

pub fn spawn<D: Dataplane + 'static>(
    mut manager: Manager<D>,
    resync_interval: Duration,
    netns: Option<String>,
    shared: Arc<Shared>,
    reports: UnboundedSender<Report>,
) -> WorkerHandle {
    let (tx, rx) = mpsc::channel::<Command>();
    let join = std::thread::Builder::new()
        .name("ipset-manager".into())
        .spawn(move || {
            // setns moves only this thread: the kernel work (and any `ipset`
            // process it starts) happens in the namespace, the API client
            // does not.
            if let Some(ns) = &netns
                && let Err(e) = crate::dataplane::netns::enter(ns)
            {
                tracing::error!(error = %e, "manager thread cannot enter its network namespace; not touching any kernel");
                return;
            }
            let mut seq: Option<u64> = None;
            let mut first = true;
            let mut next_resync = Instant::now() + resync_interval;
            loop {
                shared.heartbeat();
                let now = Instant::now();
                let mut deadline = next_resync;
                if seq.is_some()
                    && let Some(r) = manager.next_retry()
                {
                    deadline = deadline.min(r);
                }
                let mut periodic = false;
                match rx.recv_timeout(deadline.saturating_duration_since(now)) {
                    Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
                    Ok(Command::Desired {
                        seq: s,
                        mut sets,
                        mut held,
                    }) => {
                        // Coalesce: only the newest complete state matters.
                        let mut latest = s;
                        let mut stop = false;
                        while let Ok(cmd) = rx.try_recv() {
                            match cmd {
                                Command::Desired {
                                    seq: s2,
                                    sets: d2,
                                    held: h2,
                                } => {
                                    latest = s2;
                                    sets = d2;
                                    held = h2;
                                }
                                Command::Shutdown => stop = true,
                            }
                        }
                        if stop {
                            break;
                        }
                        seq = Some(latest);
                        manager.set_desired(sets, held);
                        crate::dataplane::memory::release_free_memory();
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        if Instant::now() >= next_resync {
                            next_resync = Instant::now() + resync_interval;
                            periodic = true;
                        }
                        if seq.is_none() {
                            // Nothing declared yet: never touch the kernel.
                            continue;
                        }
                        if periodic {
                            manager.queue_resync();
                        } else if !manager.retry_due() {
                            continue;
                        }
                    }
                }
                let Some(s) = seq else { continue };
                let outcome = manager.apply_updates();
                let report = Report {
                    seq: s,
                    outcome,
                    sets: manager.report(),
                    deletions: manager.deletion_report(),
                    full_resync: first || periodic,
                };
                first = false;
                if reports.send(report).is_err() {
                    // The controller is gone (shutting down).
                    break;
                }
            }
            tracing::info!("manager thread stopped; kernel left as it is");
        })
        .expect("spawn manager thread");
    WorkerHandle {
        tx,
        join: Some(join),
    }
}
