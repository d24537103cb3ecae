//! One agent's API side: its watches, event loop and node-state writer,
//! wired to a kernel side that is already running. `ipsetmgr agent` runs
//! one; the hollow agents of the scale harness run many in one process
//! (docs/scaling.md), so both wire an agent the same way.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::Client;
use tokio::sync::mpsc;

use crate::event_loop::{Agent, KernelPort, Settings};
use crate::inputs::{self, Input};
use crate::metrics::Shared;
use crate::node_state::{self, Pacing};
use ipsetmgr_sets::driver::Report;

/// An agent ready to run: its loop, its inputs and its writer's task.
pub struct ApiSide {
    agent: Agent,
    inputs: BoxStream<'static, Input>,
    writer: tokio::task::JoinHandle<()>,
}

impl ApiSide {
    /// Start the node-state writer of `node` and build its loop over the
    /// node's watches and the kernel side's `reports`.
    pub fn start(
        client: &Client,
        node: &str,
        pacing: Pacing,
        settings: Settings,
        kernel: Box<dyn KernelPort>,
        reports: mpsc::UnboundedReceiver<Report>,
        shared: Arc<Shared>,
    ) -> ApiSide {
        let (status_tx, status_rx) = tokio::sync::watch::channel(None);
        let writer = tokio::spawn(node_state::run_writer(
            client.clone(),
            pacing.writer(node, settings.heartbeat),
            status_rx,
            shared.clone(),
        ));
        let crds = inputs::guarded_crds();
        let agent = Agent::new(settings, &crds, kernel, reports, status_tx, shared);
        let inputs = inputs::watch_inputs(client.clone(), node).boxed();
        ApiSide {
            agent,
            inputs,
            writer,
        }
    }

    /// Run until `shutdown`; the loop drops the status sender on its way
    /// out, which ends the writer after its last write.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        self.agent.run(self.inputs, shutdown).await;
        let _ = self.writer.await;
    }
}
