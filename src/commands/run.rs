//! `ipsetmgr run --policy-dir DIR`: the agent loop with a directory as the
//! source. Reacts to file changes, resyncs periodically, retries isolated
//! sets on their backoff, and keeps the kernel as it is while the files are
//! unreadable (fail static).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};

use super::load;
use crate::dataplane::Dataplane;
use crate::ipset::Naming;
use crate::manager::{Manager, ManagerConfig};

pub struct RunArgs {
    pub policy_dir: PathBuf,
    pub resync_interval: Duration,
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot watch {0}: {1}")]
    Watch(PathBuf, notify::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// File events are coalesced for this long before reloading.
const DEBOUNCE: Duration = Duration::from_millis(200);

pub fn run(dp: Box<dyn Dataplane>, naming: Naming, args: &RunArgs) -> Result<(), RunError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(RunError::Signals)?;
    }
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .map_err(|e| RunError::Watch(args.policy_dir.clone(), e))?;
    watcher
        .watch(&args.policy_dir, RecursiveMode::Recursive)
        .map_err(|e| RunError::Watch(args.policy_dir.clone(), e))?;

    let config = ManagerConfig {
        naming: naming.clone(),
        ..ManagerConfig::default()
    };
    let mut mgr = Manager::new(dp, config);
    let mut next_resync = Instant::now() + args.resync_interval;
    let mut reload = true;
    tracing::info!(dir = %args.policy_dir.display(), interval = ?args.resync_interval, "watching policy files");
    while !stop.load(Ordering::Relaxed) {
        if reload {
            reload = false;
            apply_files(&mut mgr, &naming, args);
            // The member strings and parser buffers are gone now.
            crate::memory::release_free_memory();
        }
        if Instant::now() >= next_resync {
            mgr.queue_resync();
            next_resync = Instant::now() + args.resync_interval;
        }
        let outcome = mgr.apply_updates();
        log_outcome(&mgr, &outcome);

        // Sleep until a file changes, the resync is due, a retry is due, or a
        // signal arrives (checked every second).
        let mut wake = next_resync.min(mgr.next_retry().unwrap_or(next_resync));
        if !outcome.applied {
            wake = wake.min(Instant::now() + Duration::from_secs(1));
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let now = Instant::now();
            if now >= wake {
                break;
            }
            match rx.recv_timeout((wake - now).min(Duration::from_secs(1))) {
                Ok(()) => {
                    std::thread::sleep(DEBOUNCE);
                    while rx.try_recv().is_ok() {}
                    reload = true;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }
    tracing::info!("stopping; kernel sets are left as they are");
    Ok(())
}

/// Load the policy directory and hand it to the manager, unless a file does
/// not load (then the kernel is kept as it is).
fn apply_files<D: Dataplane>(mgr: &mut Manager<D>, naming: &Naming, args: &RunArgs) {
    let files = load(
        std::slice::from_ref(&args.policy_dir),
        naming,
        args.labels.as_ref(),
        true,
    );
    if files.load_errors.is_empty() {
        for e in &files.compiled.errors {
            tracing::error!("{e}");
        }
        mgr.set_desired(files.compiled.sets, files.compiled.held);
    } else {
        for e in &files.load_errors {
            tracing::error!("{e}; keeping the kernel as it is until the files load again");
        }
    }
}

fn log_outcome<D: Dataplane>(mgr: &Manager<D>, outcome: &crate::manager::ApplyOutcome) {
    for (name, plan) in &outcome.written {
        tracing::info!(set = %name, ?plan, "written");
    }
    for name in outcome.deleted.iter().chain(&outcome.temp_deleted) {
        tracing::info!(set = %name, "deleted");
    }
    for r in mgr.report() {
        if let Some(e) = &r.error {
            tracing::warn!(set = %r.name, policy = %r.policy, "not synced: {e}");
        } else if r.problems > 0 && outcome.written.iter().any(|(n, _)| *n == r.name) {
            tracing::warn!(set = %r.name, problems = r.problems, "repaired drift");
        }
    }
    for d in mgr.deletion_report() {
        tracing::warn!(set = %d.name, "could not delete: {}", d.error);
    }
    if !outcome.applied {
        tracing::error!(
            attempts = outcome.attempts,
            "kernel update failed: {}",
            outcome.error.as_deref().unwrap_or("unknown")
        );
    }
}
