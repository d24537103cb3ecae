//! What the controller watches: every policy, slice and node state (read
//! one by one), every Node's labels and addresses; and, only while some
//! policy's `membersFrom` needs them (`Needs`), Pods, Services and
//! Namespaces. Those watches start when a source needs them and stop when
//! none does: a controller without such sources never lists a Pod.

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use ipsetmgr_api::{IPSetMemberSlice, IPSetNodeState, IPSetPolicy, POLICY_LABEL};
use ipsetmgr_cluster::nodes::watch_slim_nodes;
use ipsetmgr_cluster::tolerant::{self, Tolerant};

#[allow(clippy::large_enum_variant)] // moved once into the store
pub enum Input {
    Policy(Event<Tolerant<IPSetPolicy>>),
    Slice(Event<Tolerant<IPSetMemberSlice>>),
    NodeState(Event<Tolerant<IPSetNodeState>>),
    Node(Event<Node>),
    Pod(Event<Pod>),
    Service(Event<Service>),
    Namespace(Event<Namespace>),
    /// A watch of `resource` was stopped: no source needs it any more.
    Unwatched(&'static str),
    /// The outcome of fetching a url source.
    Feed(super::feeds::FeedKey, super::feeds::FeedResult),
    /// A watch of `resource` failed; it is retried with backoff.
    WatchError {
        resource: &'static str,
        error: String,
    },
}

/// Which optional kinds the sources need watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    pub pods: bool,
    pub services: bool,
    pub namespaces: bool,
}

/// A watch that runs while `wanted` says so; each stop is announced, so
/// the store forgets that kind (a later start lists it afresh).
fn gated(
    needs: watch::Receiver<Needs>,
    wanted: fn(&Needs) -> bool,
    resource: &'static str,
    start: impl Fn() -> BoxStream<'static, Input> + Send + 'static,
) -> BoxStream<'static, Input> {
    type State<F> = (watch::Receiver<Needs>, Option<BoxStream<'static, Input>>, F);
    futures::stream::unfold(
        (needs, None, start),
        move |(mut needs, mut running, start): State<_>| async move {
            loop {
                let want = wanted(&needs.borrow_and_update());
                match (&mut running, want) {
                    (None, true) => running = Some(start()),
                    (Some(_), false) => {
                        running = None;
                        return Some((Input::Unwatched(resource), (needs, running, start)));
                    }
                    (Some(s), true) => {
                        tokio::select! {
                            item = s.next() => match item {
                                Some(i) => return Some((i, (needs, running, start))),
                                None => running = None,
                            },
                            r = needs.changed() => if r.is_err() { return None },
                        }
                    }
                    (None, false) => {
                        if needs.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            }
        },
    )
    .boxed()
}

fn kube_watch<K>(
    client: &Client,
    resource: &'static str,
    f: fn(Event<K>) -> Input,
    slim: fn(&mut K),
) -> BoxStream<'static, Input>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .modify(slim)
        .default_backoff()
        .map(move |r| input_of(r, resource, f))
        .boxed()
}

/// A watch's item as the loop's input: an event through `f`, an error as
/// a `WatchError` naming the resource.
fn input_of<E>(
    r: Result<E, watcher::Error>,
    resource: &'static str,
    f: impl FnOnce(E) -> Input,
) -> Input {
    match r {
        Ok(ev) => f(ev),
        Err(e) => Input::WatchError {
            resource,
            error: format!(
                "{resource} watch: {}",
                ipsetmgr_cluster::api_error::describe_watch(&e)
            ),
        },
    }
}

/// Drop what no source reads, as it arrives.
fn slim_meta(m: &mut kube::core::ObjectMeta) {
    m.managed_fields = None;
    m.annotations = None;
    m.owner_references = None;
}

pub fn watch_inputs(
    client: Client,
    needs: watch::Receiver<Needs>,
) -> impl Stream<Item = Input> + Send + Unpin + 'static {
    fn wrap<K: 'static>(
        s: impl Stream<Item = Result<Event<Tolerant<K>>, watcher::Error>> + Send + 'static,
        resource: &'static str,
        f: fn(Event<Tolerant<K>>) -> Input,
    ) -> futures::stream::BoxStream<'static, Input> {
        s.map(move |r| input_of(r, resource, f)).boxed()
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
    let client_for_gates = client.clone();
    let nodes = watch_slim_nodes(client, all())
        .map(|r| input_of(r, "nodes", Input::Node))
        .boxed();
    let c = client_for_gates.clone();
    let pods = gated(
        needs.clone(),
        |n| n.pods,
        "pods",
        move || {
            kube_watch::<Pod>(&c, "pods", Input::Pod, |p| {
                slim_meta(&mut p.metadata);
                // Only hostNetwork of the spec is read.
                let host = p.spec.as_ref().and_then(|s| s.host_network);
                p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                    host_network: host,
                    containers: Vec::new(),
                    ..Default::default()
                });
                if let Some(st) = p.status.as_mut() {
                    *st = k8s_openapi::api::core::v1::PodStatus {
                        phase: st.phase.take(),
                        pod_ips: st.pod_ips.take(),
                        ..Default::default()
                    };
                }
            })
        },
    );
    let c = client_for_gates.clone();
    let services = gated(
        needs.clone(),
        |n| n.services,
        "services",
        move || {
            kube_watch::<Service>(&c, "services", Input::Service, |s| {
                slim_meta(&mut s.metadata)
            })
        },
    );
    let c = client_for_gates;
    let namespaces = gated(
        needs,
        |n| n.namespaces,
        "namespaces",
        move || {
            watcher::watcher(Api::<Namespace>::all(c.clone()), watcher::Config::default())
                .modify(|n| {
                    slim_meta(&mut n.metadata);
                    n.spec = None;
                    n.status = None;
                })
                .default_backoff()
                .map(|r| input_of(r, "namespaces", Input::Namespace))
                .boxed()
        },
    );
    futures::stream::select_all([policies, slices, states, nodes, pods, services, namespaces])
}
