//! The one loop that drives a [`SetsBackend`] (one kernel's reconciler or several): used by `ipsetmgr run` and by the
//! cluster agent alike, each feeding it complete desired states through a
//! channel from its own source (a policy directory, the API server).
//!
//! The loop owns the backend's clock: a full resync every
//! `resync_interval`, retries of isolated sets when their backoff ends, a
//! quick retry after an apply that did not reach the kernel, coalescing of
//! desired states that arrive while it is busy (only the newest complete
//! state matters); each apply returns freed memory (a
//! million-member policy leaves parser garbage behind). It never touches the
//! kernel before the first desired state arrives, so a source that has not
//! loaded yet can never make it delete anything.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::{ApplyOutcome, DeletionReport, DesiredSet, SetRef, SetReport, SetsBackend};

/// What a source tells the driver.
pub enum Command {
    /// The complete desired state (never a partial one). `seq` identifies
    /// it in the reports that follow.
    Desired {
        seq: u64,
        sets: Vec<DesiredSet>,
        /// Policies that failed to load: their sets are left exactly as
        /// they are.
        held: Vec<String>,
    },
    /// Resync with the kernel now (SIGHUP; a source that reloaded).
    Resync,
    /// Finish the current apply and stop, leaving the kernel as it is.
    Shutdown,
}

/// What the driver reports after each apply.
#[derive(Clone, Debug)]
pub struct Report {
    /// The `seq` of the desired state this report describes.
    pub seq: u64,
    pub outcome: ApplyOutcome,
    pub sets: Vec<SetReport>,
    pub deletions: Vec<DeletionReport>,
    /// Owned sets no desired state wants, kept because pruning is off.
    pub unwanted: Vec<SetRef>,
    /// The apply started with a full resync: problem counts are fresh.
    pub full_resync: bool,
}

/// Timing of the loop.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub resync_interval: Duration,
    /// Wait before trying again after an apply that did not reach the kernel.
    pub retry_after_failure: Duration,
}

impl DriverConfig {
    pub fn new(resync_interval: Duration) -> DriverConfig {
        DriverConfig {
            resync_interval,
            retry_after_failure: Duration::from_secs(1),
        }
    }
}

/// Whoever consumes the driver's reports.
pub trait Observer {
    /// Called every time the loop wakes up (liveness heartbeats).
    fn tick(&mut self) {}
    /// After each apply; returning `false` stops the loop (nobody listens).
    fn report(&mut self, report: Report) -> bool;
}

/// Run the loop until [`Command::Shutdown`], the command channel closes, or
/// the observer stops listening. The kernel is left as it is on the way out.
pub fn run<B: SetsBackend + ?Sized>(
    manager: &mut B,
    config: &DriverConfig,
    commands: &Receiver<Command>,
    observer: &mut dyn Observer,
) {
    let mut seq: Option<u64> = None;
    let mut first = true;
    let mut next_resync = Instant::now() + config.resync_interval;
    let mut retry_at: Option<Instant> = None;
    loop {
        observer.tick();
        let mut deadline = next_resync;
        if seq.is_some() {
            for t in [manager.next_retry(), retry_at].into_iter().flatten() {
                deadline = deadline.min(t);
            }
        }
        let mut periodic = false;
        let wait = deadline.saturating_duration_since(Instant::now());
        match commands.recv_timeout(wait) {
            Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(Command::Resync) => manager.queue_resync(),
            Ok(Command::Desired { seq: s, sets, held }) => {
                let Some((s, sets, held)) = newest(s, sets, held, commands, manager) else {
                    break;
                };
                seq = Some(s);
                // The heap is trimmed after the apply that follows.
                manager.set_desired(sets, held);
            }
            Err(RecvTimeoutError::Timeout) => {
                if Instant::now() >= next_resync {
                    next_resync = Instant::now() + config.resync_interval;
                    periodic = true;
                }
                if seq.is_none() {
                    // Nothing declared yet: never touch the kernel.
                    continue;
                }
                let retry_due = retry_at.is_some_and(|t| t <= Instant::now());
                if periodic {
                    manager.queue_resync();
                } else if !manager.retry_due() && !retry_due {
                    continue;
                }
            }
        }
        let Some(s) = seq else { continue };
        let outcome = manager.apply_updates();
        // Kernel listings read during the apply are freed by now.
        retry_at = (!outcome.applied).then(|| Instant::now() + config.retry_after_failure);
        let report = Report {
            seq: s,
            sets: manager.report(),
            deletions: manager.deletion_report(),
            unwanted: manager.unwanted(),
            full_resync: first || periodic,
            outcome,
        };
        first = false;
        if !observer.report(report) {
            break;
        }
    }
}

/// The newest desired state among `first` and whatever else is queued
/// (resync requests in between are honoured). `None` when a shutdown is
/// queued behind it.
fn newest<B: SetsBackend + ?Sized>(
    seq: u64,
    sets: Vec<DesiredSet>,
    held: Vec<String>,
    commands: &Receiver<Command>,
    manager: &mut B,
) -> Option<(u64, Vec<DesiredSet>, Vec<String>)> {
    let mut latest = (seq, sets, held);
    while let Ok(cmd) = commands.try_recv() {
        match cmd {
            Command::Desired { seq, sets, held } => latest = (seq, sets, held),
            Command::Resync => manager.queue_resync(),
            Command::Shutdown => return None,
        }
    }
    Some(latest)
}
