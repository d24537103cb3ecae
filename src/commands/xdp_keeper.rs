//! The agent's `--xdp-interface`: a thread in the target network namespace
//! that checks every [`CHECK_INTERVAL`] that ipsetmgr's XDP program is
//! attached to the interface and attaches it when it is not (at start, or
//! after someone detached it), counting each attachment in
//! `ipsetmgr_xdp_attaches_total`. A missing interface or a policy without
//! a set yet is logged and tried again; it never stops the agent. On the
//! way out the program stays attached (fail static; docs/bpf.md, "The XDP
//! program in the agent").

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use ipsetmgr_agent::metrics::Shared;
use ipsetmgr_bpf::{Bpffs, Kept, XdpKeeper};

/// Between checks: a look at one pin, cheap enough to be prompt.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The running keeper; [`Running::stop`] ends its thread (the program
/// stays attached).
pub(crate) struct Running {
    stop: mpsc::Sender<()>,
    join: JoinHandle<Result<(), ipsetmgr_dataplane::netns::NetnsError>>,
}

impl Running {
    pub(crate) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.join.join();
    }
}

/// Start the keeper's thread in `netns`.
pub(crate) fn start(
    netns: Option<String>,
    bpf_path: PathBuf,
    keeper: XdpKeeper,
    shared: Arc<Shared>,
) -> std::io::Result<Running> {
    let (stop, stopped) = mpsc::channel();
    let join = ipsetmgr_dataplane::netns::spawn_in(netns, "xdp-keeper", move || {
        let mut last_error: Option<String> = None;
        loop {
            check_once(&bpf_path, &keeper, &shared, &mut last_error);
            match stopped.recv_timeout(CHECK_INTERVAL) {
                Err(RecvTimeoutError::Timeout) => continue,
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    })?;
    Ok(Running { stop, join })
}

/// One check, logged: an error once when it first appears or changes (the
/// same error every 10 s would drown the log), attachments always.
fn check_once(bpf_path: &Path, keeper: &XdpKeeper, shared: &Shared, last: &mut Option<String>) {
    let interface = keeper.interface();
    let outcome = Bpffs::open(bpf_path).and_then(|fs| keeper.check(&fs));
    match outcome {
        Ok(Kept::Unchanged) => {}
        Ok(Kept::Attached) => {
            let first = shared.metrics.xdp_attaches.get() == 0;
            shared.metrics.xdp_attaches.inc();
            if first {
                tracing::info!(interface, "XDP program attached");
            } else {
                tracing::warn!(interface, "XDP program was detached; attached it again");
            }
        }
        Err(e) => {
            let message = e.to_string();
            if last.as_deref() != Some(message.as_str()) {
                tracing::warn!(
                    interface,
                    error = %message,
                    retry_in = ?CHECK_INTERVAL,
                    "XDP program not attached"
                );
            }
            *last = Some(message);
            return;
        }
    }
    if last.take().is_some() {
        tracing::info!(interface, "XDP program attached again after an error");
    }
}
