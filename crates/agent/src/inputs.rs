//! What the agent watches: every IPSetPolicy and IPSetMemberSlice (read
//! one by one, see `cluster::tolerant`), its own Node, and this project's
//! CRDs by name. Only the objects that decide this node's kernel: never
//! other nodes' states, never pods.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, CustomResourceExt};

use ipsetmgr_api::{IPSetMemberSlice, IPSetPolicy, POLICY_LABEL};
use ipsetmgr_cluster::kind_guard::is_kind_not_found;
use ipsetmgr_cluster::nodes::watch_slim_nodes;
use ipsetmgr_cluster::tolerant::{self, Tolerant};

/// Slices per page of the agent's slice list: `ipsetmgr slice` keeps a slice
/// near 2,000 members and 32 KB, so a page is about a megabyte of JSON.
const SLICE_LIST_PAGE: u32 = 32;

/// One change from the API server.
// Inputs are moved once from the watch into the store; boxing the larger
// variants would only add an allocation per event.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    Policy(Event<Tolerant<IPSetPolicy>>),
    Slice(Event<Tolerant<IPSetMemberSlice>>),
    Node(Event<Node>),
    /// The CRD of this name.
    Crd(String, Event<CustomResourceDefinition>),
    /// A watch of `resource` failed; it is retried with backoff. Nothing
    /// else changes.
    WatchError {
        resource: &'static str,
        error: String,
    },
    /// A list or watch of the kind of this CRD answered 404: it is gone.
    KindNotFound {
        crd: String,
        error: String,
    },
}

/// The CRDs whose kinds decide the kernel's content.
pub fn guarded_crds() -> Vec<String> {
    vec![
        IPSetPolicy::crd_name().to_string(),
        IPSetMemberSlice::crd_name().to_string(),
    ]
}

/// The resource names of the watches, as readiness and metrics name them.
pub mod resource {
    pub const POLICIES: &str = "ipsetpolicies";
    pub const SLICES: &str = "ipsetmemberslices";
    pub const NODES: &str = "nodes";
    pub const CRDS: &str = "customresourcedefinitions";
}

/// A tolerant watch of `K` (the kind of `resource`), as agent inputs.
fn tolerant_watch<K>(
    client: &Client,
    resource: &'static str,
    config: watcher::Config,
    wrap: fn(Event<Tolerant<K>>) -> Input,
) -> impl Stream<Item = Input> + Send + 'static
where
    K: kube::Resource<DynamicType = ()>
        + CustomResourceExt
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let crd = K::crd_name().to_string();
    let what = K::kind(&()).to_string();
    tolerant::watch::<K>(client, config).map(move |r| match r {
        Ok(ev) => wrap(ev),
        Err(e) if is_kind_not_found(&e) => Input::KindNotFound {
            crd: crd.clone(),
            error: format!(
                "{what} watch: {}",
                ipsetmgr_cluster::api_error::describe_watch(&e)
            ),
        },
        Err(e) => Input::WatchError {
            resource,
            error: format!(
                "{what} watch: {}",
                ipsetmgr_cluster::api_error::describe_watch(&e)
            ),
        },
    })
}

/// The production inputs of the agent of `node`.
pub fn watch_inputs(
    client: Client,
    node: &str,
) -> impl Stream<Item = Input> + Send + Unpin + 'static {
    // Metadata only, each policy read whole when its generation changes:
    // the controller's status writes (to every policy, at every change)
    // then cost each agent a kilobyte, not the policy (docs/scaling.md).
    let crd = IPSetPolicy::crd_name().to_string();
    let policies = tolerant::watch_by_generation::<IPSetPolicy>(
        &client,
        watcher::Config::default(),
    )
    .map(move |r| match r {
        Ok(ev) => Input::Policy(ev),
        Err(tolerant::SpecWatchError::Watch(e)) if is_kind_not_found(&e) => Input::KindNotFound {
            crd: crd.clone(),
            error: format!(
                "IPSetPolicy watch: {}",
                ipsetmgr_cluster::api_error::describe_watch(&e)
            ),
        },
        Err(e) => Input::WatchError {
            resource: resource::POLICIES,
            error: format!("IPSetPolicy watch: {e}"),
        },
    });
    // Only slices bound to some policy, listed a few at a time: a page is
    // read whole and decoded untyped before its slices are (a JSON value per
    // member), so kube's default page of 500 slices held ~1M members twice
    // over at once and put the agent's peak at 94 MiB (scripts/agent_rss.py).
    let slices = tolerant_watch::<IPSetMemberSlice>(
        &client,
        resource::SLICES,
        watcher::Config::default()
            .labels(POLICY_LABEL)
            .page_size(SLICE_LIST_PAGE),
        Input::Slice,
    );
    let nodes = watch_slim_nodes(
        client.clone(),
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    )
    .map(|r| match r {
        Ok(ev) => Input::Node(ev),
        Err(e) => Input::WatchError {
            resource: resource::NODES,
            error: format!(
                "node watch: {}",
                ipsetmgr_cluster::api_error::describe_watch(&e)
            ),
        },
    });
    let mut streams = vec![policies.boxed(), slices.boxed(), nodes.boxed()];
    for crd in guarded_crds() {
        let name = crd.clone();
        let s = watcher::watcher(
            Api::<CustomResourceDefinition>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={crd}")),
        )
        .modify(|c| {
            // Only its existence and deletion timestamp matter.
            c.metadata.managed_fields = None;
            c.spec.versions.clear();
            c.status = None;
        })
        .default_backoff()
        .map(move |r| match r {
            Ok(ev) => Input::Crd(name.clone(), ev),
            Err(e) => Input::WatchError {
                resource: resource::CRDS,
                error: format!(
                    "CRD {name} watch: {}",
                    ipsetmgr_cluster::api_error::describe_watch(&e)
                ),
            },
        });
        streams.push(s.boxed());
    }
    futures::stream::select_all(streams)
}
