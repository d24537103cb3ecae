//! One apply: resync when needed, one batch of every due write, retried
//! with backoff and without the sets that make it fail; then deletions.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use super::{ISOLATE_AFTER_REPEATS, Reconciler};
use crate::kernel::{BatchFailure, Kernel};
use crate::{ApplyError, ApplyOutcome, SetError, WriteKind};

impl<K: Kernel> Reconciler<K> {
    /// Bring the kernel in line: resync when required, remove leftovers,
    /// send every due set in one batch, retrying with exponential backoff
    /// (at once when a failing set was isolated: that is progress); then
    /// delete sets nobody wants.
    pub fn apply_updates(&mut self) -> ApplyOutcome {
        let started = Instant::now();
        let mut outcome = ApplyOutcome::default();
        let mut delay = self.config.initial_backoff;
        let mut repeats: BTreeMap<String, u32> = BTreeMap::new();
        // How each set was first written in this call: a set created by a
        // batch that failed later and finished by a retry's delta still
        // reports "created".
        let mut first: BTreeMap<String, WriteKind> = BTreeMap::new();
        self.isolated_now.clear();
        self.resync_skipped = false;
        for attempt in 1..=self.config.max_attempts {
            outcome.attempts = attempt;
            if let Err(e) = self.resync_if_needed() {
                outcome.error = Some(ApplyError::Resync(e));
                (self.sleep)(delay);
                delay *= 2;
                continue;
            }
            self.kernel
                .before_writes(&mut self.sets, &self.held, &self.existing);
            let leftovers = self.delete_leftovers();
            outcome
                .temp_deleted
                .extend(leftovers.iter().map(|n| self.set_ref(n)));
            match self.try_writes() {
                Ok(written) => {
                    for (name, kind) in written {
                        first.entry(name).or_insert(kind);
                    }
                    outcome.written = std::mem::take(&mut first)
                        .into_iter()
                        .filter(|(name, _)| self.sets.get(name).is_some_and(|e| self.synced(e)))
                        .map(|(name, kind)| (self.set_ref(&name), kind))
                        .collect();
                    outcome.applied = true;
                    outcome.error = None;
                    break;
                }
                Err(f) => {
                    outcome.error = Some(match &f.set {
                        Some(set) => ApplyError::BatchAtSet {
                            set: self.set_ref(set),
                            error: f.error.clone(),
                        },
                        None => ApplyError::Batch(f.error.clone()),
                    });
                    for (name, kind) in &f.partly_written {
                        first.entry(name.clone()).or_insert(*kind);
                    }
                    if !self.handle_failure(*f, &mut repeats) {
                        (self.sleep)(delay);
                        delay *= 2;
                    }
                }
            }
        }
        outcome.deleted = self
            .apply_deletions()
            .iter()
            .map(|n| self.set_ref(n))
            .collect();
        self.kernel.after_apply();
        if self.resync_skipped {
            outcome.resyncs_skipped.push(self.kernel.id());
        }
        outcome.duration = started.elapsed();
        outcome
    }

    /// Plan the due sets, isolate the ones that cannot be written, send the
    /// rest in one batch. `Ok` names the sets written.
    fn try_writes(&mut self) -> Result<Vec<(String, WriteKind)>, Box<BatchFailure>> {
        let now = Instant::now();
        let due: Vec<String> = self
            .sets
            .iter()
            .filter(|(name, e)| {
                !self.kernel.in_sync(&e.set)
                    && e.failure.as_ref().is_none_or(|f| f.retry_at <= now)
                    && !self.isolated_now.contains(*name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let planned = self.kernel.plan(&mut self.sets, due);
        for (name, why) in planned.refused {
            self.isolate(&name, why);
        }
        if planned.writes.is_empty() {
            return Ok(Vec::new());
        }
        self.kernel.write(&mut self.sets, &planned.writes)?;
        for (name, _) in &planned.writes {
            self.existing.insert(name.clone());
            if let Some(e) = self.sets.get_mut(name) {
                self.kernel.committed(&mut e.set);
                e.failure = None;
                e.last_sync = Some(SystemTime::now());
            }
        }
        Ok(planned.writes)
    }

    /// Isolate the set that made the batch fail when the error is about it
    /// (or keeps coming back); re-read the sets the adapter no longer knows.
    /// Returns whether a set was isolated.
    fn handle_failure(&mut self, f: BatchFailure, repeats: &mut BTreeMap<String, u32>) -> bool {
        self.pending_leftovers.extend(f.leftovers);
        for name in &f.reread {
            self.queue_read(name);
        }
        let Some(set) = f.set else {
            return false;
        };
        let count = repeats.entry(set.clone()).or_default();
        *count += 1;
        if !f.about_set && *count < ISOLATE_AFTER_REPEATS {
            return false;
        }
        let detail = match f.element {
            Some(element) => SetError::Element {
                error: f.error,
                element,
            },
            None => SetError::Kernel(f.error),
        };
        self.isolate(&set, detail);
        true
    }
}
