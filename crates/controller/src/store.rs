//! What the controller knows: every policy (with its status, to tell
//! whether a write is needed at all), every member slice, every node state
//! and every Node's labels.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use ipsetmgr_api::{IPSetMemberSlice, IPSetNodeState, IPSetPolicy};
use ipsetmgr_cluster::listing::{Change, Listing};
use ipsetmgr_cluster::slices::{
    ClusterLimits, SliceEntry, by_policy, cluster_inputs, same_slice, slice_entry,
};
use ipsetmgr_cluster::tolerant::Tolerant;
use ipsetmgr_policy::compile::PolicyInput;
use ipsetmgr_policy::revision::members_revision;

use ipsetmgr_policy::sources::cluster::{
    Labels, NodeView, PodView, ServiceView, node_view, pod_view, service_view,
};

#[derive(Default)]
pub struct Store {
    pub policies: Listing<Tolerant<IPSetPolicy>>,
    pub slices: Listing<SliceEntry>,
    pub node_states: Listing<Tolerant<IPSetNodeState>>,
    /// When each node state was last seen to change (by this controller's
    /// clock: heartbeats are judged without trusting the nodes' clocks).
    pub seen: BTreeMap<String, Instant>,
    /// Every Node's labels and addresses.
    pub nodes: Listing<NodeView>,
    /// Watched only while a source needs them (see `inputs::Needs`); keyed
    /// `namespace/name`. A terminal Pod is kept as `None`.
    pub pods: Listing<Option<PodView>>,
    pub services: Listing<ServiceView>,
    pub namespaces: Listing<Labels>,
    /// This cluster's caps on policies (the agents' are the same).
    pub limits: ClusterLimits,
    /// The last error of each source kind's watch (`pods`, `services`,
    /// `namespaces`) until it delivers: why its sources are not in force.
    pub watch_errors: BTreeMap<&'static str, String>,
}

fn namespaced(m: &kube::core::ObjectMeta) -> String {
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or("")
    )
}

fn named<K>(t: Tolerant<K>) -> (String, Tolerant<K>) {
    (t.name.clone(), t)
}

/// Objects whose resourceVersion did not move did not change.
fn same_version<K>(a: &Tolerant<K>, b: &Tolerant<K>) -> bool {
    a.resource_version == b.resource_version && !a.resource_version.is_empty()
}

impl Store {
    pub fn on_policy(&mut self, ev: Event<Tolerant<IPSetPolicy>>) -> Change {
        self.policies.apply(ev, named, same_version)
    }

    pub fn on_slice(&mut self, ev: Event<Tolerant<IPSetMemberSlice>>) -> Change {
        self.slices.apply(ev, slice_entry, same_slice)
    }

    pub fn on_node_state(&mut self, ev: Event<Tolerant<IPSetNodeState>>) -> Change {
        let now = Instant::now();
        let touched = match &ev {
            Event::Apply(t) | Event::InitApply(t) => Some(t.name.clone()),
            _ => None,
        };
        let change = self.node_states.apply(ev, named, same_version);
        if let Some(name) = touched
            && (change.changed || !self.seen.contains_key(&name))
        {
            self.seen.insert(name, now);
        }
        let states = self.node_states.items();
        self.seen
            .retain(|n, _| states.contains_key(n) || !self.node_states.listed());
        change
    }

    /// Each policy's members revision (see `cluster::slices::members_revision`).
    pub fn revisions(&self) -> BTreeMap<&str, String> {
        let slices = by_policy(self.slices.items());
        self.policies
            .items()
            .iter()
            .map(|(name, t)| {
                let bound = slices.get(name.as_str()).map_or(&[][..], Vec::as_slice);
                let generation = t.generation.unwrap_or(0);
                (
                    name.as_str(),
                    members_revision(t.uid.as_deref(), generation, bound),
                )
            })
            .collect()
    }

    pub fn on_node(&mut self, ev: Event<Node>) -> Change {
        let view = |n: Node| (n.metadata.name.clone().unwrap_or_default(), node_view(&n));
        self.nodes.apply(ev, view, |a, b| a == b)
    }

    pub fn on_pod(&mut self, ev: Event<Pod>) -> Change {
        self.pods.apply(
            ev,
            |p: Pod| (namespaced(&p.metadata), pod_view(&p)),
            |a, b| a == b,
        )
    }

    pub fn on_service(&mut self, ev: Event<Service>) -> Change {
        let view = |s: Service| (namespaced(&s.metadata), service_view(&s));
        self.services.apply(ev, view, |a, b| a == b)
    }

    pub fn on_namespace(&mut self, ev: Event<Namespace>) -> Change {
        let labels = |n: Namespace| {
            let name = n.metadata.name.clone().unwrap_or_default();
            (name, n.metadata.labels.unwrap_or_default())
        };
        self.namespaces.apply(ev, labels, |a, b| a == b)
    }

    /// A watch that no source needs any more: forget its kind.
    pub fn unwatched(&mut self, resource: &str) -> Change {
        match resource {
            "pods" => self.pods = Listing::default(),
            "services" => self.services = Listing::default(),
            "namespaces" => self.namespaces = Listing::default(),
            _ => return Change::default(),
        }
        Change {
            changed: true,
            removed: false,
        }
    }

    /// Whether every initial list has arrived.
    pub fn listed(&self) -> bool {
        self.policies.listed()
            && self.slices.listed()
            && self.node_states.listed()
            && self.nodes.listed()
    }

    /// The compile inputs (readable policies with their slices) and the
    /// policies that could not be read.
    pub fn inputs(&self) -> (Vec<PolicyInput<'_>>, Vec<(&str, &str)>) {
        let policies = self
            .policies
            .items()
            .iter()
            .map(|(name, t)| (name.as_str(), t.value.as_ref().map_err(String::as_str)));
        cluster_inputs(policies, self.slices.items(), &self.limits)
    }
}
