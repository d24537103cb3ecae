//! Deleting what nobody wants: leftovers always, unwanted sets when
//! pruning. A set still referenced is reported and retried at the next
//! resync; never fatal, and never a reason to keep the others.

use super::Reconciler;
use crate::ErrorKind;
use crate::kernel::Kernel;

impl<K: Kernel> Reconciler<K> {
    /// Delete leftovers of interrupted writes (found by resync or left by
    /// a failed batch).
    pub(super) fn delete_leftovers(&mut self) -> Vec<String> {
        let todo: Vec<String> = std::mem::take(&mut self.pending_leftovers)
            .into_iter()
            .collect();
        if todo.is_empty() {
            return todo;
        }
        let results = self.kernel.delete(&todo);
        let mut deleted = Vec::new();
        for (name, result) in todo.into_iter().zip(results) {
            self.existing.remove(&name);
            match result {
                Ok(()) => deleted.push(name),
                Err(e) if e.kind() == ErrorKind::SetMissing => {}
                Err(e) => {
                    tracing::warn!(set = %name, error = %e, "could not remove a leftover set");
                    self.deletion_errors.insert(name, e);
                }
            }
        }
        deleted
    }

    /// Delete owned sets nobody wants. Sets that another owned set
    /// references (a list:set) go after it, so deletions repeat while
    /// progress is made.
    pub(super) fn apply_deletions(&mut self) -> Vec<String> {
        let mut deleted = Vec::new();
        if !self.config.prune {
            return deleted;
        }
        let mut todo: Vec<String> = std::mem::take(&mut self.pending_deletions)
            .into_iter()
            .filter(|n| !self.held.contains(n) && !self.sets.contains_key(n))
            .collect();
        while !todo.is_empty() {
            let before = todo.len();
            let results = self.kernel.delete(&todo);
            let mut in_use = Vec::new();
            for (name, result) in todo.into_iter().zip(results) {
                match result {
                    Ok(()) => {
                        self.existing.remove(&name);
                        self.deletion_errors.remove(&name);
                        deleted.push(name);
                    }
                    Err(e) => match e.kind() {
                        ErrorKind::SetMissing => {
                            self.existing.remove(&name);
                            self.deletion_errors.remove(&name);
                        }
                        ErrorKind::InUse => in_use.push((name, e)),
                        _ => {
                            tracing::warn!(set = %name, error = %e, "set not deleted; retried at the next resync");
                            self.deletion_errors.insert(name, e);
                        }
                    },
                }
            }
            if in_use.is_empty() || in_use.len() == before {
                for (name, why) in in_use {
                    tracing::warn!(set = %name, "{why}; retried at the next resync");
                    self.deletion_errors.insert(name, why);
                }
                break;
            }
            todo = in_use.into_iter().map(|(n, _)| n).collect();
        }
        deleted
    }
}
