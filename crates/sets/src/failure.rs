//! An isolated set's failure and its backoff.

use std::time::{Duration, Instant};

use crate::{ReconcilerConfig, SetError};

/// A set isolated after a set-specific failure; retried on its own backoff.
#[derive(Clone, Debug)]
pub struct Failure {
    pub error: SetError,
    pub attempts: u32,
    pub retry_at: Instant,
}

impl Failure {
    /// The failure that follows `previous` (`None`: the first): one attempt
    /// more, retried after `set_retry_base` doubled per attempt, at most
    /// `set_retry_max`. Returns the wait too, for the log line.
    pub(crate) fn after(
        previous: Option<&Failure>,
        error: SetError,
        config: &ReconcilerConfig,
    ) -> (Failure, Duration) {
        let attempts = previous.map_or(0, |f| f.attempts) + 1;
        let backoff = config
            .set_retry_base
            .saturating_mul(1u32 << (attempts - 1).min(16))
            .min(config.set_retry_max);
        let failure = Failure {
            error,
            attempts,
            retry_at: Instant::now() + backoff,
        };
        (failure, backoff)
    }
}
