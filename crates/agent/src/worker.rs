//! The agent's end of the manager's driver loop, which runs on its own OS
//! thread (see `crate::kernel`): the driver may block on the kernel and
//! keeps resyncing and repairing drift even while the API server is
//! unreachable. Its reports come back into the async event loop here, and
//! every wake-up is a liveness heartbeat.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Shared;
use ipsetmgr_sets::driver::Observer;
use ipsetmgr_sets::driver::Report;

/// Forwards the driver's reports to the event loop.
pub struct Forward {
    shared: Arc<Shared>,
    reports: UnboundedSender<Report>,
}

impl Forward {
    pub fn new(shared: Arc<Shared>, reports: UnboundedSender<Report>) -> Forward {
        Forward { shared, reports }
    }
}

impl Observer for Forward {
    fn tick(&mut self) {
        self.shared.heartbeat();
    }

    fn report(&mut self, report: Report) -> bool {
        // The event loop is gone (shutting down): stop.
        self.reports.send(report).is_ok()
    }
}
