//! What the controller knows: every policy (with its status, to tell
//! whether a write is needed at all) and every member slice (in the store
//! the agents keep too, `cluster::policy_store`), every node state and
//! every Node's labels.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use ipsetmgr_api::{IPSetNodeState, IPSetPolicy};
use ipsetmgr_cluster::listing::{Change, Listing};
use ipsetmgr_cluster::policy_store::PolicyStore;
use ipsetmgr_cluster::tolerant::Tolerant;

use ipsetmgr_policy::sources::cluster::{
    Labels, NodeView, PodView, ServiceView, node_view, pod_view, service_view,
};

#[derive(Default)]
pub struct Store {
    /// The policies (with their status) and slices, as the agents keep
    /// them too.
    pub policy_store: PolicyStore<Tolerant<IPSetPolicy>>,
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
        self.policy_store.policies.apply(ev, named, same_version)
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
        self.policy_store.policies.listed()
            && self.policy_store.slices.listed()
            && self.node_states.listed()
            && self.nodes.listed()
    }
}
