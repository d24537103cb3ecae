//! The policies and member slices of a cluster, as the agent and the
//! controller both keep them: one store for both roles, so that the two
//! compile the same inputs and compute the same members revisions (an
//! agent reports the revision it applied; the controller compares it with
//! its own). Each role keeps its policies in its own form ([`StoredPolicy`])
//! and its own parts beside this store (`docs/architecture.md`).

use std::collections::BTreeMap;

use kube::runtime::watcher::Event;

use crate::listing::{Change, Listing};
use crate::slices::{
    ClusterLimits, SliceEntry, by_policy, cluster_inputs, same_slice, slice_entry,
};
use crate::tolerant::{Tolerant, Unreadable};
use ipsetmgr_api::{IPSetMemberSlice, IPSetPolicy};
use ipsetmgr_policy::compile::PolicyInput;
use ipsetmgr_policy::revision::members_revision;

/// What the store needs of a policy, however a role keeps it.
pub trait StoredPolicy {
    /// The generation its members revision is computed for (0 when unknown).
    fn generation(&self) -> i64;
    fn uid(&self) -> Option<&str>;
    /// The policy, or why it could not be read (held).
    fn policy(&self) -> Result<&IPSetPolicy, &Unreadable>;
}

/// The controller keeps each policy as it was read.
impl StoredPolicy for Tolerant<IPSetPolicy> {
    fn generation(&self) -> i64 {
        self.generation.unwrap_or(0)
    }

    fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    fn policy(&self) -> Result<&IPSetPolicy, &Unreadable> {
        self.value.as_ref()
    }
}

/// Every policy (kept as `P`), every member slice, and this cluster's caps
/// on policies: what the agent and the controller compile from.
#[derive(Debug)]
pub struct PolicyStore<P> {
    pub policies: Listing<P>,
    pub slices: Listing<SliceEntry>,
    /// This cluster's caps on policies (the agents' and the controller's
    /// are the same).
    pub limits: ClusterLimits,
}

impl<P> Default for PolicyStore<P> {
    fn default() -> Self {
        PolicyStore::new(ClusterLimits::default())
    }
}

impl<P> PolicyStore<P> {
    pub fn new(limits: ClusterLimits) -> PolicyStore<P> {
        PolicyStore {
            policies: Listing::default(),
            slices: Listing::default(),
            limits,
        }
    }

    pub fn on_slice(&mut self, ev: Event<Tolerant<IPSetMemberSlice>>) -> Change {
        self.slices.apply(ev, slice_entry, same_slice)
    }
}

impl<P: StoredPolicy> PolicyStore<P> {
    /// The compile inputs (readable policies, each with its slices) and
    /// the policies that could not be read, with why.
    pub fn inputs(&self) -> (Vec<PolicyInput<'_>>, Vec<(&str, &Unreadable)>) {
        let policies = self
            .policies
            .items()
            .iter()
            .map(|(name, p)| (name.as_str(), p.policy()));
        cluster_inputs(policies, self.slices.items(), &self.limits)
    }

    /// Each policy's members revision (`ipsetmgr_policy::revision`): what
    /// an agent reports it applied and the controller expects.
    pub fn revisions(&self) -> BTreeMap<&str, String> {
        let slices = by_policy(self.slices.items());
        self.policies
            .items()
            .iter()
            .map(|(name, p)| {
                let bound = slices.get(name.as_str()).map_or(&[][..], Vec::as_slice);
                (
                    name.as_str(),
                    members_revision(p.uid(), p.generation(), bound),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tolerant::decode;
    use serde_json::json;

    fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> Tolerant<K> {
        decode(serde_json::from_value(v).unwrap())
    }

    fn slice(name: &str, policy: &str, rv: &str) -> Tolerant<IPSetMemberSlice> {
        object(json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
            "metadata": {"name": name, "resourceVersion": rv,
                         "labels": {"ipsetmgr.io/policy": policy}},
            "spec": {"members": ["10.0.0.2"]}
        }))
    }

    /// A policy's revision moves with its own slices only; one that does
    /// not fit the types is unreadable, and still has a revision.
    #[test]
    fn revisions_follow_each_policys_own_slices() {
        let mut s: PolicyStore<Tolerant<IPSetPolicy>> = PolicyStore::default();
        for (name, spec) in [
            ("p", json!({"type": "hash:ip"})),
            ("q", json!({"type": "hash:ip"})),
            ("bad", json!({"type": "hash:ip", "maxElem": 8589934592u64})),
        ] {
            let p = object(json!({
                "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
                "metadata": {"name": name, "generation": 1, "uid": name},
                "spec": spec
            }));
            s.policies
                .apply(Event::Apply(p), |t| (t.name.clone(), t), |_, _| false);
        }
        s.on_slice(Event::Apply(slice("p-0", "p", "1")));
        let before: BTreeMap<String, String> = s
            .revisions()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(before.len(), 3);
        s.on_slice(Event::Apply(slice("p-0", "p", "2")));
        let after = s.revisions();
        assert_ne!(after["p"], before["p"]);
        assert_eq!(after["q"], before["q"]);
        assert_eq!(after["bad"], before["bad"]);
        let (inputs, unreadable) = s.inputs();
        assert_eq!(inputs.len(), 2);
        assert_eq!(unreadable.len(), 1);
        assert_eq!(unreadable[0].0, "bad");
    }
}
