//! Resync: read the owned kernel sets and let the adapter take the
//! kernel's word for each, counting every discrepancy as a problem.

use std::collections::BTreeSet;
use std::time::SystemTime;

use super::{Reconciler, ResyncNeed};
use crate::KernelError;
use crate::kernel::Kernel;

impl<K: Kernel> Reconciler<K> {
    pub(super) fn resync_if_needed(&mut self) -> Result<(), KernelError> {
        match std::mem::replace(&mut self.resync, ResyncNeed::None) {
            ResyncNeed::None => Ok(()),
            ResyncNeed::Full => self
                .full_resync()
                .inspect_err(|_| self.resync = ResyncNeed::Full),
            ResyncNeed::Sets(names) => {
                let result = self.read_sets(&names, false);
                if result.is_err() {
                    self.resync = ResyncNeed::Sets(names);
                }
                result
            }
        }
    }

    /// List every owned set, read each desired one, queue deletions of the
    /// rest (leftovers separately). Foreign sets are never read. When the
    /// adapter knows the kernel unchanged since its own last read or write,
    /// nothing is listed: see [`Self::quiet_resync`].
    fn full_resync(&mut self) -> Result<(), KernelError> {
        if self.kernel.unchanged_since_last_read() {
            return self.quiet_resync();
        }
        let listed = self.kernel.list_owned()?;
        self.kernel.forget_learned();
        self.existing = listed.iter().map(|o| o.name.clone()).collect();
        let desired: BTreeSet<String> = self.sets.keys().cloned().collect();
        self.read_sets(&desired, true)?;
        self.pending_deletions.clear();
        self.pending_leftovers.clear();
        for owned in listed {
            if self.sets.contains_key(&owned.name) || self.held.contains(&owned.name) {
                continue;
            }
            if owned.leftover {
                self.pending_leftovers.insert(owned.name);
            } else {
                self.pending_deletions.insert(owned.name);
            }
        }
        // Sets that vanished need no deletion any more.
        let existing = &self.existing;
        self.deletion_errors.retain(|n, _| existing.contains(n));
        self.kernel.full_read_done();
        Ok(())
    }

    /// A full resync of a kernel that has not changed since the last one
    /// (or since our own writes after it): what is believed stands, so no
    /// drift is found; only sets whose content was never read are read,
    /// and deletions that failed are tried again, as a listing would.
    fn quiet_resync(&mut self) -> Result<(), KernelError> {
        self.kernel.forget_learned();
        self.resync_skipped = true;
        let unread: BTreeSet<String> = self
            .sets
            .iter()
            .filter(|(_, e)| e.needs_read)
            .map(|(n, _)| n.clone())
            .collect();
        for e in self.sets.values_mut() {
            e.drift = Default::default();
        }
        self.read_sets(&unread, true)?;
        for e in self.sets.values_mut() {
            if e.failure.is_none() && self.kernel.in_sync(&e.set) {
                e.last_sync = Some(SystemTime::now());
            }
        }
        for name in self.deletion_errors.keys() {
            if !self.sets.contains_key(name) && !self.held.contains(name) {
                self.pending_deletions.insert(name.clone());
            }
        }
        Ok(())
    }

    /// Read `names` (desired sets) and take the kernel's word for each.
    /// `count` is false when re-reading after our own failed batch: those
    /// differences are not drift. Every desired set is read, also one the
    /// listing did not show: the read, not the listing, says what is there.
    fn read_sets(&mut self, names: &BTreeSet<String>, count: bool) -> Result<(), KernelError> {
        for name in names {
            if !self.sets.contains_key(name) {
                continue;
            }
            let read = self.kernel.read(name)?;
            match &read {
                Some(_) => self.existing.insert(name.clone()),
                None => self.existing.remove(name),
            };
            let Some(e) = self.sets.get_mut(name) else {
                continue;
            };
            e.needs_read = false;
            let drift = self.kernel.absorb(name, &mut e.set, read);
            if count {
                e.drift = drift;
            }
            if e.failure.is_none() && self.kernel.in_sync(&e.set) {
                e.last_sync = Some(SystemTime::now());
            }
        }
        Ok(())
    }
}
