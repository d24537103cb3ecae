//! What the agent knows of the cluster: the policies and the member slices
//! (in the store the controller keeps too, `cluster::policy_store`), its
//! own Node, and whether the kinds are in place; and from that, the
//! compile inputs of one node.
//!
//! Memory matters here (a million members on every node): a policy's own
//! member strings are dropped once the compiler has parsed them for the
//! policy's generation, and a slice's members are kept as one text of lines
//! (about a third of a `Vec<String>`), from which they can be parsed again
//! if the policy's type changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;

use ipsetmgr_api::IPSetPolicy;
use ipsetmgr_cluster::kind_guard::KindGuard;
use ipsetmgr_cluster::listing::Change;
use ipsetmgr_cluster::policy_store::{PolicyStore, StoredPolicy};
use ipsetmgr_cluster::slices::ClusterLimits;
use ipsetmgr_cluster::tolerant::{Tolerant, Unreadable};
use ipsetmgr_ipset::Naming;
use ipsetmgr_policy::compile::{
    Compiled, MemberCache, PolicyError, PolicyErrorKind, compile_inputs,
};

/// One policy as the agent keeps it.
#[derive(Clone, Debug)]
pub struct PolicyEntry {
    pub generation: i64,
    pub uid: Option<String>,
    /// `Err(why)` for an object that does not fit the types: held.
    pub policy: Result<IPSetPolicy, Unreadable>,
}

impl StoredPolicy for PolicyEntry {
    fn generation(&self) -> i64 {
        self.generation
    }

    fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    fn policy(&self) -> Result<&IPSetPolicy, &Unreadable> {
        self.policy.as_ref()
    }
}

/// The agent's store.
pub struct Store {
    /// The policies and slices, as the controller keeps them too.
    pub policy_store: PolicyStore<PolicyEntry>,
    /// This node's labels and uid, once seen.
    pub node: Option<NodeFacts>,
    node_init: Option<Option<NodeFacts>>,
    pub kinds: KindGuard,
}

/// What the agent needs of its Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, String>,
    pub uid: Option<String>,
}

fn policy_entry(t: Tolerant<IPSetPolicy>) -> (String, PolicyEntry) {
    let (generation, uid) = match &t.value {
        Ok(p) => (p.metadata.generation.unwrap_or(0), p.metadata.uid.clone()),
        Err(_) => (0, t.uid.clone()),
    };
    let entry = PolicyEntry {
        generation,
        uid,
        policy: t.value.map(|mut p| {
            p.status = None;
            p
        }),
    };
    (t.name, entry)
}

/// Only spec changes (generation) matter to the agent; status writes by
/// the controller do not wake it.
fn same_policy(a: &PolicyEntry, b: &PolicyEntry) -> bool {
    a.generation == b.generation
        && a.uid == b.uid
        && a.policy.is_ok() == b.policy.is_ok()
        && a.generation != 0
}

impl Store {
    pub fn new(crds: &[String], limits: ClusterLimits) -> Store {
        Store {
            policy_store: PolicyStore::new(limits),
            node: None,
            node_init: None,
            kinds: KindGuard::new(crds),
        }
    }

    pub fn on_policy(&mut self, ev: Event<Tolerant<IPSetPolicy>>) -> Change {
        self.policy_store
            .policies
            .apply(ev, policy_entry, same_policy)
    }

    /// Feed the watch of this node; returns whether its facts changed. A
    /// deleted Node keeps the last facts (fail static).
    pub fn on_node(&mut self, ev: Event<Node>) -> bool {
        let facts = |n: &Node| NodeFacts {
            labels: n.metadata.labels.clone().unwrap_or_default(),
            uid: n.metadata.uid.clone(),
        };
        let new = match ev {
            Event::Init => {
                self.node_init = Some(None);
                return false;
            }
            Event::InitApply(n) => {
                self.node_init = Some(Some(facts(&n)));
                return false;
            }
            Event::InitDone => match self.node_init.take().flatten() {
                Some(f) => f,
                None => return false,
            },
            Event::Apply(n) => facts(&n),
            // The Node is gone: keep its labels (fail static for the
            // kernel), but forget its uid, so that no node state is
            // created for a Node that does not exist.
            Event::Delete(_) => {
                if let Some(n) = &mut self.node {
                    n.uid = None;
                }
                return false;
            }
        };
        let changed = self.node.as_ref() != Some(&new);
        self.node = Some(new);
        changed
    }

    /// What still keeps the agent from applying anything, if anything.
    pub fn waiting_for(&self) -> Option<String> {
        if !self.kinds.may_apply() {
            let missing: Vec<String> = self
                .kinds
                .missing()
                .into_iter()
                .map(|(n, s)| format!("{n} ({s:?})"))
                .collect();
            return Some(format!("the CRDs {}", missing.join(", ")));
        }
        if !self.policy_store.policies.listed() {
            return Some("the initial list of IPSetPolicies".into());
        }
        if !self.policy_store.slices.listed() {
            return Some("the initial list of IPSetMemberSlices".into());
        }
        if self.node.is_none() {
            return Some("this node's Node object".into());
        }
        None
    }

    /// This node's complete desired state, from everything seen (the
    /// caller checks `waiting_for` first). Policies that could not be read
    /// are rejected and their sets held. Afterwards the policies' own
    /// member strings are dropped: parsed members live in the cache
    /// (shared with the manager), and the strings would only double the
    /// footprint of big policies.
    pub fn compile(&mut self, naming: &Naming, cache: &mut MemberCache) -> Compiled {
        let labels = self
            .node
            .as_ref()
            .map(|n| n.labels.clone())
            .unwrap_or_default();
        let (inputs, unreadable) = self.policy_store.inputs();
        let mut compiled = compile_inputs(&inputs, naming, Some(&labels), cache);
        for (name, why) in unreadable {
            compiled.errors.push(PolicyError::of_policy(
                name,
                PolicyErrorKind::Unreadable(why.to_string()),
            ));
            compiled.held.push(name.to_string());
        }
        self.shed_parsed_members(cache);
        compiled
    }

    /// After a compile: drop the member strings the cache no longer needs.
    fn shed_parsed_members(&mut self, cache: &MemberCache) {
        for entry in self.policy_store.policies.items_mut().values_mut() {
            if let Ok(p) = &mut entry.policy
                && !p.spec.members.is_empty()
                && cache.has_inline(p)
            {
                p.spec.members = Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_api::IPSetMemberSlice;
    use ipsetmgr_cluster::tolerant::decode;
    use ipsetmgr_policy::compile::OwnedMembers;
    use serde_json::json;

    fn slice(name: &str, policy: &str, rv: &str, members: &[&str]) -> Tolerant<IPSetMemberSlice> {
        decode(
            serde_json::from_value(json!({
                "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
                "metadata": {"name": name, "resourceVersion": rv,
                             "labels": {"ipsetmgr.io/policy": policy}},
                "spec": {"members": members}
            }))
            .unwrap(),
        )
    }

    fn policy(name: &str, generation: i64) -> Tolerant<IPSetPolicy> {
        decode(
            serde_json::from_value(json!({
                "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
                "metadata": {"name": name, "generation": generation, "uid": "u"},
                "spec": {"type": "hash:ip", "members": ["10.0.0.1"]},
                "status": {"observedGeneration": 1}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn slices_join_their_policy_as_text_and_status_writes_are_ignored() {
        let mut s = Store::new(&[], ClusterLimits::default());
        s.on_policy(Event::Init);
        s.on_policy(Event::InitApply(policy("p", 1)));
        s.on_policy(Event::InitDone);
        s.policy_store.on_slice(Event::Init);
        s.policy_store.on_slice(Event::InitApply(slice(
            "p-0",
            "p",
            "5",
            &["10.0.0.2", "10.0.0.3"],
        )));
        s.policy_store
            .on_slice(Event::InitApply(slice("q-0", "other", "6", &["10.0.0.9"])));
        s.policy_store.on_slice(Event::InitDone);
        assert_eq!(
            s.policy_store.slices.get("p-0").unwrap().members,
            Ok(OwnedMembers::Lines("10.0.0.2\n10.0.0.3".into()))
        );
        let (inputs, unreadable) = s.policy_store.inputs();
        assert!(unreadable.is_empty());
        assert_eq!(inputs.len(), 1);
        assert_eq!(inputs[0].slices.len(), 1);
        assert_eq!(inputs[0].slices[0].name, "p-0");
        assert!(inputs[0].policy.status.is_none(), "status is not kept");
        // The controller's status write: same generation, no change.
        assert!(!s.on_policy(Event::Apply(policy("p", 1))).changed);
        assert!(s.on_policy(Event::Apply(policy("p", 2))).changed);
    }

    #[test]
    fn nothing_is_applied_before_everything_was_seen() {
        let crd = "ipsetpolicies.ipsetmgr.io".to_string();
        let mut s = Store::new(std::slice::from_ref(&crd), ClusterLimits::default());
        assert!(s.waiting_for().unwrap().contains("CRDs"));
        s.kinds.on_event(
            &crd,
            Event::Apply(ipsetmgr_cluster::kind_guard::test_crd(&crd, false)),
        );
        assert!(s.waiting_for().unwrap().contains("IPSetPolicies"));
        s.on_policy(Event::Init);
        s.on_policy(Event::InitDone);
        assert!(s.waiting_for().unwrap().contains("IPSetMemberSlices"));
        s.policy_store.on_slice(Event::Init);
        s.policy_store.on_slice(Event::InitDone);
        assert!(s.waiting_for().unwrap().contains("Node"));
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": "n", "uid": "nu"}})).unwrap();
        assert!(s.on_node(Event::Apply(node)));
        assert_eq!(s.waiting_for(), None);
    }
}
