//! The one reconciler: keeps one kernel's owned sets equal to the desired
//! sets through its [`Kernel`] adapter. Resync, retries with backoff,
//! isolation, held sets, deletions and reports live here, once for every
//! kernel (docs/architecture.md, "The reconciler").

mod apply;
mod deletions;
mod resync;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::ReconcilerConfig;
use crate::failure::Failure;
use crate::kernel::{Context, Entry, Kernel, Sets};
use crate::{DeletionReport, DesiredSet, Drift, KernelError, SetError, SetRef, SetReport};

/// Which sets the next resync must read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ResyncNeed {
    None,
    /// Re-read these sets (a failed batch touched them); not drift.
    Sets(BTreeSet<String>),
    /// List and read every owned set; discrepancies count as problems.
    Full,
}

/// Errors that are not clearly about one set isolate it when they repeat
/// this often in one apply.
const ISOLATE_AFTER_REPEATS: u32 = 3;

/// One kernel's sets, kept equal to the desired state.
pub struct Reconciler<K: Kernel> {
    kernel: K,
    config: ReconcilerConfig,
    sets: Sets<K::Set>,
    /// Kernel names of held policies' sets: never modified nor deleted.
    held: HashSet<String>,
    /// Owned set names seen in the kernel (last listing, plus our writes).
    existing: BTreeSet<String>,
    pending_deletions: BTreeSet<String>,
    pending_leftovers: BTreeSet<String>,
    /// Sets that could not be deleted, with the reason (retried at resync).
    deletion_errors: BTreeMap<String, KernelError>,
    resync: ResyncNeed,
    /// Sets isolated during the current `apply_updates`: not retried in it,
    /// whatever their backoff says.
    isolated_now: HashSet<String>,
    /// The last full resync read nothing: the kernel had not changed.
    resync_skipped: bool,
    sleep: Box<dyn FnMut(Duration) + Send>,
}

impl<K: Kernel> Reconciler<K> {
    /// Nothing is read or written until the first apply, which resyncs.
    pub fn new(kernel: K, config: ReconcilerConfig) -> Reconciler<K> {
        Reconciler {
            kernel,
            config,
            sets: BTreeMap::new(),
            held: HashSet::new(),
            existing: BTreeSet::new(),
            pending_deletions: BTreeSet::new(),
            pending_leftovers: BTreeSet::new(),
            deletion_errors: BTreeMap::new(),
            resync: ResyncNeed::Full,
            isolated_now: HashSet::new(),
            resync_skipped: false,
            sleep: Box::new(std::thread::sleep),
        }
    }

    /// Replace the sleep used for backoff (tests count instead of sleeping).
    pub fn with_sleep(mut self, sleep: impl FnMut(Duration) + Send + 'static) -> Self {
        self.sleep = Box::new(sleep);
        self
    }

    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    pub fn config(&self) -> &ReconcilerConfig {
        &self.config
    }

    fn set_ref(&self, name: &str) -> SetRef {
        SetRef {
            backend: self.kernel.id(),
            name: name.to_string(),
        }
    }

    /// Declare the complete desired state. The sets of `held_policies`
    /// (policies that failed to load) are left exactly as they are.
    pub fn set_desired(
        &mut self,
        desired: Vec<DesiredSet>,
        held_policies: impl IntoIterator<Item = String>,
    ) {
        let held_policies: HashSet<String> = held_policies.into_iter().collect();
        self.held = held_policies
            .iter()
            .flat_map(|p| self.kernel.policy_names(p))
            .collect();
        let by_name: HashMap<&str, &DesiredSet> =
            desired.iter().map(|d| (d.name.as_str(), d)).collect();
        let cx = Context {
            desired: &by_name,
            held_policies: &held_policies,
        };
        let mut wanted = BTreeSet::new();
        for d in &desired {
            let name = self.kernel.kernel_name(d);
            wanted.insert(name.clone());
            self.pending_deletions.remove(&name);
            if let Some(e) = self.sets.get_mut(&name) {
                e.policy.clone_from(&d.policy);
                if self.kernel.update_set(&mut e.set, &name, d, &cx)
                    && let Some(f) = &mut e.failure
                {
                    // New content deserves a try now, whatever failed.
                    f.retry_at = Instant::now();
                }
                continue;
            }
            let mut set = self.kernel.new_set(&name, d, &cx);
            let mut needs_read = true;
            if self.resync == ResyncNeed::Full {
                // The coming full resync reads it.
            } else if self.existing.contains(&name) {
                self.queue_read(&name);
            } else {
                self.kernel.believe_absent(&mut set);
                needs_read = false;
            }
            let entry = Entry {
                set,
                policy: d.policy.clone(),
                drift: Drift::default(),
                failure: None,
                last_sync: None,
                needs_read,
            };
            self.sets.insert(name, entry);
        }
        let gone: Vec<String> = self
            .sets
            .keys()
            .filter(|n| !wanted.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.sets.remove(&name);
            if !self.held.contains(&name) && self.existing.contains(&name) {
                self.pending_deletions.insert(name);
            }
        }
        let held = &self.held;
        self.pending_deletions.retain(|n| !held.contains(n));
    }

    fn queue_read(&mut self, name: &str) {
        if let Some(e) = self.sets.get_mut(name) {
            e.needs_read = true;
        }
        match &mut self.resync {
            ResyncNeed::Full => {}
            ResyncNeed::Sets(s) => {
                s.insert(name.to_string());
            }
            ResyncNeed::None => self.resync = ResyncNeed::Sets([name.to_string()].into()),
        }
    }

    /// Ask for a full resync before the next update (periodic, or on demand).
    pub fn queue_resync(&mut self) {
        self.resync = ResyncNeed::Full;
    }

    /// Whether an isolated set's retry time has come.
    pub fn retry_due(&self) -> bool {
        let now = Instant::now();
        self.sets
            .values()
            .any(|e| e.failure.as_ref().is_some_and(|f| f.retry_at <= now))
    }

    /// The earliest retry time of an isolated set.
    pub fn next_retry(&self) -> Option<Instant> {
        self.sets
            .values()
            .filter_map(|e| e.failure.as_ref().map(|f| f.retry_at))
            .min()
    }

    fn synced(&self, e: &Entry<K::Set>) -> bool {
        e.failure.is_none() && self.kernel.in_sync(&e.set)
    }

    fn isolate(&mut self, name: &str, error: SetError) {
        let Some(e) = self.sets.get_mut(name) else {
            return;
        };
        let (failure, backoff) = Failure::after(e.failure.as_ref(), error, &self.config);
        tracing::warn!(
            backend = self.kernel.id().name,
            set = name,
            policy = %e.policy,
            error = %failure.error,
            retry_in = ?backoff,
            "set isolated"
        );
        self.isolated_now.insert(name.to_string());
        e.failure = Some(failure);
    }

    /// Per desired set: synced, members, problems, error.
    pub fn report(&self) -> Vec<SetReport> {
        self.sets
            .iter()
            .map(|(name, e)| SetReport {
                set: self.set_ref(name),
                policy: e.policy.clone(),
                synced: self.synced(e),
                members: self.kernel.member_count(&e.set),
                problems: e.drift.total(),
                drift: e.drift,
                error: e.failure.as_ref().map(|f| f.error.clone()),
                last_sync: e.last_sync,
            })
            .collect()
    }

    /// Owned sets no policy wants, left in place because pruning is off.
    pub fn unwanted(&self) -> Vec<SetRef> {
        if self.config.prune {
            Vec::new()
        } else {
            self.pending_deletions
                .iter()
                .map(|n| self.set_ref(n))
                .collect()
        }
    }

    /// Owned sets that should be gone but could not be deleted.
    pub fn deletion_report(&self) -> Vec<DeletionReport> {
        self.deletion_errors
            .iter()
            .map(|(name, error)| DeletionReport {
                set: self.set_ref(name),
                error: error.clone(),
            })
            .collect()
    }

    /// Human-readable planned operations for `--dry-run`, after a read-only
    /// resync. Nothing is sent to the kernel.
    pub fn plan(&mut self) -> Result<Vec<String>, KernelError> {
        self.resync_if_needed()?;
        let mut lines = Vec::new();
        for name in &self.pending_leftovers {
            lines.push(format!(
                "{} {} (leftover temp set)",
                self.kernel.deletion_verb(),
                self.kernel.shown_name(name)
            ));
        }
        for (name, e) in &self.sets {
            if !self.kernel.in_sync(&e.set) {
                lines.push(self.kernel.describe(&self.sets, name));
            }
        }
        for name in &self.pending_deletions {
            let at = self.kernel.shown_name(name);
            if self.config.prune {
                lines.push(format!(
                    "{} {at} (no policy wants it)",
                    self.kernel.deletion_verb()
                ));
            } else {
                lines.push(format!(
                    "keep {at}: no policy wants it (use --prune to delete)"
                ));
            }
        }
        Ok(lines)
    }

    /// Every owned set in the kernel, read only.
    pub fn list(&mut self) -> Result<Vec<crate::ListedSet>, KernelError> {
        self.kernel.list()
    }
}

#[cfg(test)]
mod tests;
