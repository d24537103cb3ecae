//! What the manager tells its callers after an apply: per set and per deletion.

use std::time::{Duration, SystemTime};

/// The state of one desired set after the last apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetReport {
    pub name: String,
    pub policy: String,
    pub synced: bool,
    pub members: usize,
    /// Discrepancies found (and queued for repair) by the last resync.
    pub problems: usize,
    pub error: Option<String>,
    pub last_sync: Option<SystemTime>,
}

/// A set that should be gone but is not (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletionReport {
    pub name: String,
    pub error: String,
}

/// The result of one `apply_updates` call.
#[derive(Clone, Debug, Default)]
pub struct ApplyOutcome {
    /// The batch (minus isolated sets) reached the kernel.
    pub applied: bool,
    pub attempts: u32,
    /// Why the last attempt failed, when `applied` is false.
    pub error: Option<String>,
    /// Sets written by this call and how.
    pub written: Vec<(String, super::Plan)>,
    /// Sets deleted by this call.
    pub deleted: Vec<String>,
    /// Owned temp sets removed by this call.
    pub temp_deleted: Vec<String>,
    pub duration: Duration,
}
