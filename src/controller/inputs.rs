//! What the controller watches: every policy, slice and node state (read
//! one by one), and every Node's labels.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::watcher::{self, Event};

use crate::api::{IPSetMemberSlice, IPSetNodeState, IPSetPolicy, POLICY_LABEL};
use crate::cluster::nodes::watch_slim_nodes;
use crate::cluster::tolerant::{self, Tolerant};

#[allow(clippy::large_enum_variant)] // moved once into the store
pub enum Input {
    Policy(Event<Tolerant<IPSetPolicy>>),
    Slice(Event<Tolerant<IPSetMemberSlice>>),
    NodeState(Event<Tolerant<IPSetNodeState>>),
    Node(Event<Node>),
    /// A watch of `resource` failed; it is retried with backoff.
    WatchError {
        resource: &'static str,
        error: String,
    },
}

pub fn watch_inputs(client: Client) -> impl Stream<Item = Input> + Send + Unpin + 'static {
    fn wrap<K: 'static>(
        s: impl Stream<Item = Result<Event<Tolerant<K>>, watcher::Error>> + Send + 'static,
        resource: &'static str,
        f: fn(Event<Tolerant<K>>) -> Input,
    ) -> futures::stream::BoxStream<'static, Input> {
        s.map(move |r| match r {
            Ok(ev) => f(ev),
            Err(e) => Input::WatchError {
                resource,
                error: format!("{resource} watch: {e}"),
            },
        })
        .boxed()
    }
    let all = watcher::Config::default;
    let policies = wrap(
        tolerant::watch::<IPSetPolicy>(&client, all()),
        "ipsetpolicies",
        Input::Policy,
    );
    let slices = wrap(
        tolerant::watch::<IPSetMemberSlice>(&client, all().labels(POLICY_LABEL)),
        "ipsetmemberslices",
        Input::Slice,
    );
    let states = wrap(
        tolerant::watch::<IPSetNodeState>(&client, all()),
        "ipsetnodestates",
        Input::NodeState,
    );
    let nodes = watch_slim_nodes(client, all())
        .map(|r| match r {
            Ok(ev) => Input::Node(ev),
            Err(e) => Input::WatchError {
                resource: "nodes",
                error: format!("nodes watch: {e}"),
            },
        })
        .boxed();
    futures::stream::select_all([policies, slices, states, nodes])
}
