//! `ipsetmgr run --policy-dir DIR`: a policy directory as the source of the
//! manager's driver loop (the same loop the cluster agent runs). Reacts to
//! file changes and SIGHUP, follows a directory that is removed and
//! recreated, and keeps the kernel as it is while the files do not load
//! (fail static). Resyncs and retries are the driver's.
//!
//! `membersFrom` sources are kept across reloads (`crates/filemode/src/files/sources.rs`): a
//! `file` is read again when it changes (watched, and stat'ed at every
//! resync and every `interval`), a `url` on its own interval. A url that
//! fails keeps its last good members in force; a file that fails holds its
//! policy.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use crate::files::read_files;
use crate::files::sources::LocalSources;
use ipsetmgr_ipset::Naming;
use ipsetmgr_node::KernelSide;
use ipsetmgr_policy::load::policy_files;
use ipsetmgr_sets::driver::{Command, Observer, Report};

pub struct RunArgs {
    pub policy_dir: PathBuf,
    pub resync_interval: Duration,
    pub labels: Option<BTreeMap<String, String>>,
    /// Where url sources may connect.
    pub egress: ipsetmgr_feeds::egress::EgressGuard,
    /// The build's version and revision, for the first log line (the
    /// binary's, recorded by the cluster crate's build script).
    pub build: (&'static str, &'static str),
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

/// The inotify watch on the member list files of `file` sources: their
/// directories (a file replaced by a rename keeps being followed), with
/// events for other files of those directories ignored.
struct ListWatch {
    tx: mpsc::Sender<()>,
    files: BTreeSet<PathBuf>,
    watcher: Option<RecommendedWatcher>,
}

impl ListWatch {
    fn new(tx: mpsc::Sender<()>) -> ListWatch {
        ListWatch {
            tx,
            files: BTreeSet::new(),
            watcher: None,
        }
    }

    /// Watch exactly `files` (a new watcher when the set changed).
    fn follow(&mut self, files: BTreeSet<PathBuf>) {
        if files == self.files {
            return;
        }
        self.watcher = None;
        self.files = files;
        if self.files.is_empty() {
            return;
        }
        let wanted = Arc::new(self.files.clone());
        let tx = self.tx.clone();
        let filter = wanted.clone();
        let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            let ours = ev.as_ref().map_or(true, |e| {
                !e.kind.is_access() && e.paths.iter().any(|p| filter.contains(p))
            });
            if ours {
                let _ = tx.send(());
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch member list files; they are read again at every resync");
                return;
            }
        };
        let dirs: BTreeSet<&Path> = wanted
            .iter()
            .map(|f| {
                f.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
            })
            .collect();
        for d in dirs {
            if let Err(e) = watcher.watch(d, RecursiveMode::NonRecursive) {
                tracing::warn!(dir = %d.display(), error = %e, "cannot watch a member list directory; its files are read again at every resync");
            }
        }
        self.watcher = Some(watcher);
    }
}

/// One file's name, inode, size and modification time.
type FileStamp = (PathBuf, u64, u64, i64, i64);

/// What the policy files look like from outside (names, identities, sizes,
/// modification times): a resync reloads only when this changed, so a
/// change the watch missed is still picked up, without parsing big files
/// every interval.
fn fingerprint(dir: &Path) -> Vec<FileStamp> {
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

/// Watch the directory and feed each complete, loadable state of it to the
/// kernel side, until SIGTERM or SIGINT. The kernel side (started by the
/// caller) resyncs on its own clock.
pub fn run(kernel: &KernelSide, naming: &Naming, args: &RunArgs) -> Result<(), RunError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(RunError::Signals)?;
    }
    // SIGHUP, the usual "reload your configuration": reload and resync now.
    let hangup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hangup.clone())
        .map_err(RunError::Signals)?;
    let (tx, rx) = mpsc::channel();
    let mut watch = DirWatch::new(&args.policy_dir, tx.clone())?;
    let mut source = Source {
        naming,
        args,
        seq: 0,
        loaded: Vec::new(),
        // url fetches run in the background and wake this loop when done.
        sources: LocalSources::background(args.egress.clone(), tx.clone()),
        lists: ListWatch::new(tx),
    };
    let mut next_check = Instant::now() + args.resync_interval;
    let mut reload = true;
    tracing::info!(
        version = args.build.0,
        revision = args.build.1,
        dir = %args.policy_dir.display(),
        interval = ?args.resync_interval,
        "running"
    );
    while !stop.load(Ordering::Relaxed) {
        if hangup.swap(false, Ordering::Relaxed) {
            tracing::info!("SIGHUP: reloading the policy files and resyncing");
            kernel.send(Command::Resync);
            reload = true;
        }
        // With every resync, look again: a change the watch missed (it dies
        // with the directory) is still picked up.
        if Instant::now() >= next_check {
            next_check = Instant::now() + args.resync_interval;
            watch.ensure();
            reload |= source.changed();
        }
        if reload {
            // Whatever woke us (a file event, SIGHUP, a change seen at a
            // resync), the member list files are read again too.
            source.reload(kernel, true);
        } else if source
            .sources
            .next_due()
            .is_some_and(|d| d <= Instant::now())
            && source.sources.refresh(Instant::now(), false)
        {
            source.reload(kernel, false);
        }
        let until = source
            .sources
            .next_due()
            .map_or(next_check, |d| d.min(next_check));
        reload = wait_for_change(&rx, &mut watch, until, &stop, &hangup);
    }
    // The kernel side finishes the apply in progress (if any) and stops;
    // the caller says when it has.
    tracing::info!("stopping");
    Ok(())
}

/// Sleep until a file changes (then `true`), the next check is due, or a
/// signal arrives (checked every second). A missing directory is looked for
/// every second, so one that comes back is followed at once.
fn wait_for_change(
    rx: &mpsc::Receiver<()>,
    watch: &mut DirWatch,
    until: Instant,
    stop: &AtomicBool,
    hangup: &AtomicBool,
) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) || hangup.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        match rx.recv_timeout((until - now).min(Duration::from_secs(1))) {
            Ok(()) => {
                settle(rx);
                watch.ensure();
                return true;
            }
            Err(mpsc::RecvTimeoutError::Timeout) if watch.watching.is_none() => {
                watch.ensure();
                if watch.watching.is_some() {
                    // Let a `mkdir && cp` finish before reading.
                    settle(rx);
                    return true;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return false,
        }
    }
}

/// Coalesce a burst of file events.
fn settle(rx: &mpsc::Receiver<()>) {
    std::thread::sleep(DEBOUNCE);
    while rx.try_recv().is_ok() {}
}

/// The policy directory as a source of desired states.
struct Source<'a> {
    naming: &'a Naming,
    args: &'a RunArgs,
    seq: u64,
    /// The fingerprint of what was last loaded.
    loaded: Vec<FileStamp>,
    /// The policies' `membersFrom`, with their last good members.
    sources: LocalSources,
    lists: ListWatch,
}

impl Source<'_> {
    fn changed(&self) -> bool {
        fingerprint(&self.args.policy_dir) != self.loaded || self.sources.files_changed()
    }

    /// Load the directory and hand it to the kernel side, unless a file does
    /// not load (then the kernel is kept as it is, and so are the sources:
    /// the policies of the file that failed are unknown, not gone).
    /// `refresh`: read the changed member list files and fetch due urls too.
    fn reload(&mut self, kernel: &KernelSide, refresh: bool) {
        self.loaded = fingerprint(&self.args.policy_dir);
        let inputs = read_files(std::slice::from_ref(&self.args.policy_dir), &[], true);
        if !inputs.load_errors.is_empty() {
            for e in &inputs.load_errors {
                tracing::error!("{e}; keeping the kernel as it is until the files load again");
            }
            return;
        }
        self.sources.want(&inputs.policies);
        if refresh {
            self.sources.refresh(Instant::now(), true);
        }
        self.sources.load_file_texts();
        self.lists.follow(self.sources.files());
        let files = inputs.compile(self.naming, self.args.labels.as_ref(), &self.sources);
        self.sources.forget_file_texts();
        for e in &files.compiled.errors {
            tracing::error!("{e}");
        }
        for w in &files.compiled.warnings {
            tracing::warn!("{w}");
        }
        self.seq += 1;
        let (sets, held) = (files.compiled.sets, files.compiled.held);
        // The texts and member strings go before the kernel side trims the
        // heap after taking the sets (a million members are tens of MB).
        drop(files.policies);
        kernel.send(Command::Desired {
            seq: self.seq,
            sets,
            held,
        });
    }
}

/// Logs what each apply did: `run` has no other audience.
pub struct LogReports;

impl Observer for LogReports {
    fn report(&mut self, report: Report) -> bool {
        log_outcome(&report);
        true
    }
}

fn log_outcome(report: &Report) {
    let outcome = &report.outcome;
    if report.full_resync {
        ipsetmgr_sets::log_drift(&report.sets);
    }
    for id in &outcome.resyncs_skipped {
        tracing::debug!(
            backend = id.name,
            "full resync read nothing: the kernel had not changed since our own last read or write"
        );
    }
    for (set, kind) in &outcome.written {
        tracing::info!(backend = set.backend.name, set = %set, ?kind, "written");
    }
    for set in outcome.deleted.iter().chain(&outcome.temp_deleted) {
        tracing::info!(backend = set.backend.name, set = %set, "deleted");
    }
    for r in &report.sets {
        if let Some(e) = &r.error {
            tracing::warn!(backend = r.set.backend.name, set = %r.set, policy = %r.policy, error = %e, "not synced");
        }
    }
    for d in &report.deletions {
        tracing::warn!(backend = d.set.backend.name, set = %d.set, error = %d.error, "could not delete");
    }
    if let Some(e) = outcome.error.as_ref().filter(|_| !outcome.applied) {
        tracing::error!(attempts = outcome.attempts, error = %e, "kernel update failed");
    }
}
