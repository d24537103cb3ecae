//! `ipsetmgr run --policy-dir DIR`: the agent loop with a directory as the
//! source. Reacts to file changes, resyncs periodically, retries isolated
//! sets on their backoff, and keeps the kernel as it is while the files are
//! unreadable (fail static).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use super::load;
use crate::dataplane::Dataplane;
use crate::ipset::Naming;
use crate::manager::{Manager, ManagerConfig};
use crate::policy::load::policy_files;

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

/// The inotify watch on the policy directory. It dies with the directory
/// (removed, or replaced by a rename), so every resync checks the
/// directory's identity and watches it again when it changed or came back.
struct DirWatch {
    watcher: RecommendedWatcher,
    dir: PathBuf,
    /// (device, inode) of the directory being watched; `None` while unwatched.
    watching: Option<(u64, u64)>,
}

impl DirWatch {
    fn new(dir: &Path, tx: mpsc::Sender<()>) -> Result<DirWatch, RunError> {
        let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            // Errors are events too: the watch may have died with the directory.
            if ev.as_ref().map_or(true, |e| !e.kind.is_access()) {
                let _ = tx.send(());
            }
        })
        .map_err(|e| RunError::Watch(dir.to_path_buf(), e))?;
        let mut w = DirWatch {
            watcher,
            dir: dir.to_path_buf(),
            watching: None,
        };
        w.ensure();
        Ok(w)
    }

    /// Watch the directory again if it is not the one being watched (it was
    /// removed and recreated) or the watch was never set up.
    fn ensure(&mut self) {
        let now = std::fs::metadata(&self.dir)
            .ok()
            .filter(|m| m.is_dir())
            .map(|m| (m.dev(), m.ino()));
        if now == self.watching {
            return;
        }
        if self.watching.take().is_some() {
            let _ = self.watcher.unwatch(&self.dir);
        }
        let Some(id) = now else {
            tracing::warn!(dir = %self.dir.display(), "policy directory is missing; kernel left as it is until it is back");
            return;
        };
        match self.watcher.watch(&self.dir, RecursiveMode::Recursive) {
            Ok(()) => {
                tracing::info!(dir = %self.dir.display(), "watching policy files");
                self.watching = Some(id);
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the policy directory; retrying at the next resync");
            }
        }
    }
}

/// What the policy files look like from outside (names, identities, sizes,
/// modification times): a resync reloads only when this changed, so a
/// change the watch missed is still picked up, without parsing big files
/// every interval.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, u64, i64, i64)> {
    let found = policy_files(dir);
    let mut v: Vec<_> = found
        .files
        .into_iter()
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok()?;
            Some((p, m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        })
        .collect();
    // Unloadable entries count too: their disappearance must reload.
    for e in found.errors {
        v.push((PathBuf::from(e.to_string()), 0, 0, 0, 0));
    }
    v
}

pub fn run(dp: Box<dyn Dataplane>, naming: Naming, args: &RunArgs) -> Result<(), RunError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(RunError::Signals)?;
    }
    // SIGHUP, the usual "reload your configuration": reload and resync now.
    let hangup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hangup.clone())
        .map_err(RunError::Signals)?;
    let (tx, rx) = mpsc::channel();
    let mut watch = DirWatch::new(&args.policy_dir, tx)?;

    let config = ManagerConfig {
        naming: naming.clone(),
        ..ManagerConfig::default()
    };
    let mut mgr = Manager::new(dp, config);
    let mut next_resync = Instant::now() + args.resync_interval;
    let mut reload = true;
    let mut loaded = Vec::new();
    tracing::info!(dir = %args.policy_dir.display(), interval = ?args.resync_interval, "running");
    while !stop.load(Ordering::Relaxed) {
        if hangup.swap(false, Ordering::Relaxed) {
            tracing::info!("SIGHUP: reloading the policy files and resyncing");
            reload = true;
            next_resync = Instant::now();
        }
        if Instant::now() >= next_resync {
            mgr.queue_resync();
            next_resync = Instant::now() + args.resync_interval;
            watch.ensure();
            if fingerprint(&args.policy_dir) != loaded {
                reload = true;
            }
        }
        if reload {
            reload = false;
            loaded = fingerprint(&args.policy_dir);
            apply_files(&mut mgr, &naming, args);
            // The member strings and parser buffers are gone now.
            crate::dataplane::memory::release_free_memory();
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
            if stop.load(Ordering::Relaxed) || hangup.load(Ordering::Relaxed) {
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
                    watch.ensure();
                    reload = true;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // A missing directory is looked for every second, so
                    // one that comes back is followed without waiting for
                    // the next resync.
                    if watch.watching.is_none() {
                        watch.ensure();
                        if watch.watching.is_some() {
                            // Let a `mkdir && cp` finish before reading.
                            std::thread::sleep(DEBOUNCE);
                            while rx.try_recv().is_ok() {}
                            reload = true;
                            break;
                        }
                    }
                }
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
