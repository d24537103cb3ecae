//! Watching Nodes for what this project needs of them (name, uid, labels,
//! and the addresses a `nodes` member source reads): everything else a Node
//! carries (the rest of its status, images and conditions, managedFields,
//! annotations) is dropped as it arrives, so a large cluster's Nodes do not
//! sit in memory, and a kubelet's status heartbeat changes nothing kept.

use futures::Stream;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

/// A watch of the Nodes `config` selects, slimmed, retried with backoff.
pub fn watch_slim_nodes(
    client: Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<Node>, watcher::Error>> + Send + 'static {
    watcher::watcher(Api::<Node>::all(client), config)
        .modify(|n| {
            n.metadata.managed_fields = None;
            n.metadata.annotations = None;
            let addresses = n.status.take().and_then(|s| s.addresses);
            n.status = addresses.map(|a| k8s_openapi::api::core::v1::NodeStatus {
                addresses: Some(a),
                ..Default::default()
            });
            n.spec = None;
        })
        .default_backoff()
}
