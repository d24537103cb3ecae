//! Member slices as the agent and the controller keep them: compactly,
//! one text of lines per slice, from which they can be parsed again when
//! their policy's type changes (a `Vec<String>` of a million members would
//! take about three times the memory).

use std::collections::{BTreeMap, BTreeSet};

use crate::tolerant::{Tolerant, Unreadable};
use ipsetmgr_api::{IPSetMemberSlice, IPSetPolicy, POLICY_LABEL};
use ipsetmgr_policy::compile::{
    MAX_HASH_SIZE, MAX_MAX_ELEM, MemberList, NoMembers, OwnedMembers, PolicyError, PolicyErrorKind,
    PolicyInput, SliceInput,
};
use ipsetmgr_policy::sources::spec::{Setting, parse_sources};

/// The label that marks a slice as one of a policy's `membersFrom`
/// sources (its index), written by the controller.
pub const SOURCE_LABEL: &str = "ipsetmgr.io/source";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The managed-by value of the controller's slices.
pub const MANAGED_BY: &str = "ipsetmgr-controller";

/// The source a slice belongs to, when the controller made it (both labels
/// say so); any other slice is a user's and the controller never touches it.
pub fn managed_source(labels: &BTreeMap<String, String>) -> Option<usize> {
    if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
        return None;
    }
    labels.get(SOURCE_LABEL)?.parse().ok()
}

/// One slice as the agent keeps it.
#[derive(Clone, Debug)]
pub struct SliceEntry {
    /// The policy it is labelled for.
    pub policy: Option<String>,
    /// The `membersFrom` source it materialises, for the controller's own.
    pub source: Option<usize>,
    pub version: String,
    pub members: Result<OwnedMembers, Unreadable>,
}

impl SliceEntry {
    /// The members for the compiler, or why the slice could not be read.
    pub fn member_list(&self) -> Result<MemberList<'_>, NoMembers<'_>> {
        match &self.members {
            Ok(m) => Ok(m.list()),
            Err(why) => Err(NoMembers::Unreadable(why.as_str())),
        }
    }
}

pub fn slice_entry(t: Tolerant<IPSetMemberSlice>) -> (String, SliceEntry) {
    let policy = t.labels.get(POLICY_LABEL).cloned();
    let entry = SliceEntry {
        policy,
        source: managed_source(&t.labels),
        version: t.resource_version,
        members: t.value.map(|s| OwnedMembers::of(s.spec.members)),
    };
    (t.name, entry)
}

/// A slice changed only when its resourceVersion did.
pub fn same_slice(a: &SliceEntry, b: &SliceEntry) -> bool {
    a.version == b.version && !a.version.is_empty()
}

/// The slices of each policy, as compile inputs (slices without a policy
/// label are not anyone's).
pub fn by_policy(slices: &BTreeMap<String, SliceEntry>) -> BTreeMap<&str, Vec<SliceInput<'_>>> {
    let mut out: BTreeMap<&str, Vec<SliceInput<'_>>> = BTreeMap::new();
    for (name, s) in slices {
        if let Some(policy) = s.policy.as_deref() {
            out.entry(policy).or_default().push(SliceInput {
                name,
                version: &s.version,
                members: s.member_list(),
            });
        }
    }
    out
}

/// This cluster's own caps on what a policy may ask of every node's kernel
/// (`--max-set-elements`, `--max-hash-size`; the agents and the controller
/// take the same values, from the chart's `limits`). The CRD's schema and
/// the compiler bound them everywhere; these may bound them lower. (The
/// flags are `src/args.rs`'s `Limits`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterLimits {
    /// The largest `maxElem` a policy may have in this cluster.
    pub max_elem: u32,
    /// The largest `hashSize` a policy may have in this cluster.
    pub hash_size: u32,
}

impl Default for ClusterLimits {
    fn default() -> Self {
        ClusterLimits {
            max_elem: MAX_MAX_ELEM,
            hash_size: MAX_HASH_SIZE,
        }
    }
}

impl ClusterLimits {
    /// The errors of a policy over these caps.
    fn errors(&self, name: &str, policy: &IPSetPolicy) -> Vec<PolicyError> {
        let over = |field: &'static str, value: Option<u32>, cap: u32, flag: &str| {
            value.filter(|v| *v > cap).map(|value| {
                PolicyError::of_policy(
                    name,
                    PolicyErrorKind::OutOfRange {
                        field,
                        range: format!("at most {cap} in this cluster ({flag})"),
                        value,
                    },
                )
            })
        };
        let spec = &policy.spec;
        over(
            "maxElem",
            spec.max_elem,
            self.max_elem,
            "--max-set-elements",
        )
        .into_iter()
        .chain(over(
            "hashSize",
            spec.hash_size,
            self.hash_size,
            "--max-hash-size",
        ))
        .collect()
    }
}

/// The compile inputs of a cluster, the same for every agent and the
/// controller: each readable policy with its slices, and what holds it
/// before its members count (`held_by`): a `membersFrom` source the
/// cluster refuses (a `file` source, say: Valid=False must never become an
/// empty set on the nodes), or one the controller has not written slices
/// for yet (never delivered: held, not invalid). Policies that could not be
/// read come back by name, with why. A policy over `limits` is held too.
pub fn cluster_inputs<'a>(
    policies: impl IntoIterator<Item = (&'a str, Result<&'a IPSetPolicy, &'a Unreadable>)>,
    slices: &'a BTreeMap<String, SliceEntry>,
    limits: &ClusterLimits,
) -> (Vec<PolicyInput<'a>>, Vec<(&'a str, &'a Unreadable)>) {
    let mut by_policy = by_policy(slices);
    let mut delivered: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for s in slices.values() {
        if let (Some(p), Some(i)) = (s.policy.as_deref(), s.source) {
            delivered.entry(p).or_default().insert(i);
        }
    }
    let mut inputs = Vec::new();
    let mut unreadable = Vec::new();
    for (name, policy) in policies {
        let policy = match policy {
            Ok(p) => p,
            Err(why) => {
                unreadable.push((name, why));
                continue;
            }
        };
        let mut input = PolicyInput::new(policy, by_policy.remove(name).unwrap_or_default());
        input.held_by = limits.errors(name, policy);
        input.size_cap = limits.max_elem;
        input
            .held_by
            .extend(source_holds(name, policy, delivered.get(name)));
        inputs.push(input);
    }
    (inputs, unreadable)
}

/// Why `policy`'s sources hold it, if they do.
fn source_holds(
    name: &str,
    policy: &IPSetPolicy,
    delivered: Option<&BTreeSet<usize>>,
) -> Vec<PolicyError> {
    if policy.spec.members_from.is_empty() {
        return Vec::new();
    }
    let error = |kind| PolicyError::of_policy(name, kind);
    match parse_sources(policy, Setting::Cluster) {
        Err(errors) => errors
            .iter()
            .map(|e| {
                error(PolicyErrorKind::SourceRefused(format!(
                    "membersFrom[{}] ({}): {}",
                    e.index, e.kind, e.problem
                )))
            })
            .collect(),
        Ok(sources) => sources
            .iter()
            .enumerate()
            .filter(|(i, _)| delivered.is_none_or(|d| !d.contains(i)))
            .map(|(i, s)| {
                error(PolicyErrorKind::SourcePending(format!(
                    "membersFrom[{i}] ({})",
                    s.kind()
                )))
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_ipset::Naming;
    use ipsetmgr_policy::compile::{MemberCache, compile_inputs};

    fn policy(name: &str, spec: serde_json::Value) -> IPSetPolicy {
        let mut p = IPSetPolicy::new(name, serde_json::from_value(spec).unwrap());
        p.metadata.generation = Some(1);
        p
    }

    fn source_slice(policy: &str, source: Option<usize>, members: &str) -> SliceEntry {
        SliceEntry {
            policy: Some(policy.into()),
            source,
            version: "1".into(),
            members: Ok(OwnedMembers::Lines(members.into())),
        }
    }

    /// A policy over this cluster's caps is held on every node, naming the
    /// cap and its flag; under them it compiles.
    #[test]
    fn the_clusters_own_caps_hold_a_policy_above_them() {
        let big = policy(
            "big",
            serde_json::json!({"type": "hash:ip", "maxElem": 2000, "hashSize": 4096, "members": ["10.0.0.1"]}),
        );
        let none = BTreeMap::new();
        let limits = ClusterLimits {
            max_elem: 1000,
            hash_size: 1024,
        };
        let (inputs, _) = cluster_inputs([("big", Ok(&big))], &none, &limits);
        let c = compile_inputs(
            &inputs,
            &Naming::default(),
            None,
            &mut MemberCache::default(),
        );
        assert!(c.sets.is_empty());
        let messages: Vec<String> = c.errors.iter().map(ToString::to_string).collect();
        assert!(
            messages
                .iter()
                .any(|m| m
                    .contains("maxElem must be at most 1000 in this cluster (--max-set-elements)")),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m
                    .contains("hashSize must be at most 1024 in this cluster (--max-hash-size)")),
            "{messages:?}"
        );
        let (inputs, _) = cluster_inputs([("big", Ok(&big))], &none, &ClusterLimits::default());
        let c = compile_inputs(
            &inputs,
            &Naming::default(),
            None,
            &mut MemberCache::default(),
        );
        assert_eq!(c.sets.len(), 1, "{:?}", c.errors);
    }

    /// What every agent and the controller compile: a policy whose source
    /// has no slice of the controller's yet is held (no set, never an empty
    /// one); once the slice is there it is applied; a source the cluster
    /// refuses holds it for good. A user's slice does not count as the
    /// source's delivery.
    #[test]
    fn sources_hold_their_policy_until_delivered_and_refused_ones_always() {
        let url = policy(
            "bl",
            serde_json::json!({"type": "hash:net", "membersFrom": [{"url": {"url": "https://x.example/l"}}]}),
        );
        let file = policy(
            "local",
            serde_json::json!({"type": "hash:net", "membersFrom": [{"file": {"path": "/etc/l.txt"}}]}),
        );
        let naming = Naming::default();
        let compile = |slices: &BTreeMap<String, SliceEntry>| {
            let (inputs, _) = cluster_inputs(
                [("bl", Ok(&url)), ("local", Ok(&file))],
                slices,
                &ClusterLimits::default(),
            );
            compile_inputs(&inputs, &naming, None, &mut MemberCache::default())
        };
        let mut slices = BTreeMap::from([(
            "users".to_string(),
            source_slice("bl", None, "192.0.2.0/24"),
        )]);
        let c = compile(&slices);
        assert!(c.sets.is_empty(), "{:?}", c.sets);
        assert!(c.held.contains(&"bl".to_string()), "{:?}", c.held);
        let messages: Vec<String> = c.errors.iter().map(ToString::to_string).collect();
        assert!(
            messages
                .iter()
                .any(|m| m.contains("membersFrom[0] (url) has not delivered")),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m
                    .contains("membersFrom[0] (file): a file source works only in policy files")),
            "{messages:?}"
        );
        slices.insert(
            "bl-src0-0-of-1".into(),
            source_slice("bl", Some(0), "10.0.0.0/8"),
        );
        let c = compile(&slices);
        assert_eq!(c.sets.len(), 1, "{:?}", c.errors);
        assert_eq!(c.sets[0].name, "ipm4-bl");
        assert_eq!(
            c.sets[0].members.len(),
            2,
            "the source's and the user's slice"
        );
        assert!(c.held.contains(&"local".to_string()), "{:?}", c.held);
    }
}
