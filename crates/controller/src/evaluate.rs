//! What each policy's status should say, from what the controller knows:
//! the policy (and its compile result), the Nodes it selects, and their
//! node states. Pure: no API calls, the clock is an argument.
//!
//! - `Valid`: the policy and all its slices compile (a message naming the
//!   member and the reason otherwise).
//! - `Ready`: valid, and every selected node reports the current revision
//!   (the policy's uid and generation and its slices' versions) synced,
//!   and its node state was refreshed within three heartbeat intervals as
//!   the controller saw it (a dead agent is not synced, whatever it last
//!   said; the controller's own clock, so clock skew between nodes does not
//!   matter). True when no node is selected: there is nothing to wait for.
//! - `summary`: counts over the selected nodes; a handful of failing node
//!   names at most, so the object does not grow with the cluster.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use ipsetmgr_api::{
    IPSetNodeStateStatus, IPSetPolicy, IPSetPolicyStatus, PolicyState, StatusSummary,
};
use ipsetmgr_policy::selector;

/// At most this many failing node names in a summary.
pub const MAX_FAILING_NODES: usize = 5;
/// A node whose heartbeat is older than this many of its intervals is not
/// counted as synced.
pub const STALE_AFTER_HEARTBEATS: i64 = 3;
/// Condition messages are cut to this many bytes.
const MAX_MESSAGE_LEN: usize = 1024;

/// What the compile said of one policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validity {
    /// Valid, with this many members (over all families).
    Valid {
        members: i64,
        /// Members its except ranges dropped or cut (over all families).
        excepted: i64,
        /// Its kernel set names.
        sets: Vec<String>,
        /// Its `membersFrom` sources that have not delivered yet
        /// (`membersFrom[i] (kind)`): the nodes hold its sets until they
        /// have, and it is not Ready.
        pending: Vec<String>,
    },
    /// Invalid: the first errors, joined.
    Invalid { message: String },
}

/// One node as the controller sees it.
pub struct NodeView<'a> {
    pub labels: &'a BTreeMap<String, String>,
    /// The node's IPSetNodeState status, if it has one.
    pub state: Option<&'a IPSetNodeStateStatus>,
    /// How long ago the controller last saw that node state change.
    pub seen_ago: Option<std::time::Duration>,
}

/// Whether `entry`'s node holds `revision` of generation `generation` and
/// is alive (its state refreshed `seen_ago`).
fn synced_at(
    entry: Option<&PolicyState>,
    state: &IPSetNodeStateStatus,
    seen_ago: Option<std::time::Duration>,
    generation: i64,
    revision: &str,
) -> Result<(), &'static str> {
    let entry = entry.ok_or("no entry")?;
    if entry.observed_generation != generation {
        return Err("older generation");
    }
    if entry.revision != revision {
        return Err("older members");
    }
    if !entry.synced {
        return Err("not synced");
    }
    let interval = state.heartbeat_interval_seconds.max(1) as u64;
    let age = seen_ago.ok_or("no heartbeat")?.as_secs();
    if age > STALE_AFTER_HEARTBEATS as u64 * interval {
        return Err("heartbeat stale");
    }
    Ok(())
}

/// The status `policy` should have. `previous` is its current status, so
/// that conditions keep their transition time while their status holds.
pub fn status_for(
    policy: &IPSetPolicy,
    validity: &Validity,
    revision: &str,
    nodes: &BTreeMap<&str, NodeView<'_>>,
    previous: Option<&IPSetPolicyStatus>,
    now: Timestamp,
) -> IPSetPolicyStatus {
    let name = policy.metadata.name.as_deref().unwrap_or("");
    let generation = policy.metadata.generation.unwrap_or(0);
    let mut selected = 0i64;
    let mut synced = 0i64;
    let mut problems = 0i64;
    let mut failing: Vec<(&str, &'static str)> = Vec::new();
    for (node, view) in nodes {
        // An invalid selector selects nothing (and the policy is invalid).
        if !selector::matches(policy.spec.node_selector.as_ref(), view.labels).unwrap_or(false) {
            continue;
        }
        selected += 1;
        let state = view.state;
        let entry = state.and_then(|s| s.policies.iter().find(|p| p.name == name));
        problems += entry.map_or(0, |e| e.problems);
        let verdict = match state {
            Some(s) => synced_at(entry, s, view.seen_ago, generation, revision),
            None => Err("no node state"),
        };
        match verdict {
            Ok(()) => synced += 1,
            Err(why) => failing.push((node, why)),
        }
    }
    let excepted = match validity {
        Validity::Valid { excepted, .. } => *excepted,
        Validity::Invalid { .. } => 0,
    };
    let (valid, members, sets) = match validity {
        Validity::Valid { members, sets, .. } => (
            condition(
                "Valid",
                true,
                "Compiled",
                format!("{members} members"),
                generation,
            ),
            *members,
            sets.join(","),
        ),
        Validity::Invalid { message } => (
            condition("Valid", false, "InvalidPolicy", message.clone(), generation),
            0,
            String::new(),
        ),
    };
    let family = if policy.spec.set_type.has_family() {
        policy.spec.family.to_string()
    } else {
        "-".to_string()
    };
    let ready = ready_condition(validity, selected, synced, &failing, generation);
    let conditions = [valid, ready]
        .into_iter()
        .map(|c| keep_transition_time(c, previous, now))
        .collect();
    IPSetPolicyStatus {
        observed_generation: Some(generation),
        conditions,
        summary: Some(StatusSummary {
            nodes: selected,
            synced,
            synced_text: format!("{synced}/{selected}"),
            problems,
            members,
            excepted,
            family,
            sets,
            failing_nodes: failing
                .iter()
                .take(MAX_FAILING_NODES)
                .map(|(n, _)| n.to_string())
                .collect(),
        }),
        sources: Vec::new(),
    }
}

fn ready_condition(
    validity: &Validity,
    selected: i64,
    synced: i64,
    failing: &[(&str, &str)],
    generation: i64,
) -> Condition {
    if let Validity::Invalid { .. } = validity {
        return condition(
            "Ready",
            false,
            "Invalid",
            "the policy is not valid (see the Valid condition); its existing sets are held as they are".into(),
            generation,
        );
    }
    if let Validity::Valid { pending, .. } = validity
        && !pending.is_empty()
    {
        return condition(
            "Ready",
            false,
            "SourcesNotDelivered",
            format!(
                "{} not delivered members yet (see SourcesSynced); the nodes hold the policy's sets until then",
                match pending.as_slice() {
                    [one] => format!("{one} has"),
                    many => format!("{} have", many.join(", ")),
                }
            ),
            generation,
        );
    }
    if selected == 0 {
        return condition(
            "Ready",
            true,
            "NoNodesSelected",
            "no node is selected".into(),
            generation,
        );
    }
    if synced == selected {
        let msg = format!("{synced} of {selected} selected nodes hold generation {generation}");
        return condition("Ready", true, "AllNodesSynced", msg, generation);
    }
    let shown: Vec<String> = failing
        .iter()
        .take(3)
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    let more = failing.len().saturating_sub(shown.len());
    let mut msg = format!(
        "{synced} of {selected} selected nodes hold generation {generation}; not yet: {}",
        shown.join(", ")
    );
    if more > 0 {
        msg.push_str(&format!(" and {more} more"));
    }
    condition("Ready", false, "NodesNotSynced", msg, generation)
}

/// `SourcesSynced`, for a policy with `membersFrom`: whether every source
/// is in force now (`failing` says which are not, and why; their last good
/// members stay).
pub fn sources_condition(
    failing: Option<String>,
    generation: i64,
    previous: Option<&IPSetPolicyStatus>,
    now: Timestamp,
) -> Condition {
    let c = match failing {
        None => condition(
            "SourcesSynced",
            true,
            "AllSourcesInForce",
            "every membersFrom source is in force".into(),
            generation,
        ),
        Some(msg) => condition(
            "SourcesSynced",
            false,
            "SourceFailing",
            format!("{msg} (the last good members stay in force)"),
            generation,
        ),
    };
    keep_transition_time(c, previous, now)
}

fn condition(type_: &str, ok: bool, reason: &str, message: String, generation: i64) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: ipsetmgr_policy::text::bounded(&message, MAX_MESSAGE_LEN).into_owned(),
        observed_generation: Some(generation),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// A condition whose status did not change keeps its transition time.
fn keep_transition_time(
    mut c: Condition,
    previous: Option<&IPSetPolicyStatus>,
    now: Timestamp,
) -> Condition {
    let before = previous.and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_));
    c.last_transition_time = match before {
        Some(o) if o.status == c.status => o.last_transition_time.clone(),
        _ => Time(now.round(jiff::Unit::Second).unwrap_or(now)),
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn policy(generation: i64, selector: serde_json::Value) -> IPSetPolicy {
        serde_json::from_value(json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": "p", "generation": generation},
            "spec": {"type": "hash:ip", "nodeSelector": selector}
        }))
        .unwrap()
    }

    fn state(generation: i64, revision: &str) -> IPSetNodeStateStatus {
        IPSetNodeStateStatus {
            heartbeat_interval_seconds: 60,
            policies: vec![PolicyState {
                name: "p".into(),
                observed_generation: generation,
                revision: revision.into(),
                synced: true,
                problems: 2,
                ..PolicyState::default()
            }],
            ..IPSetNodeStateStatus::default()
        }
    }

    fn now() -> Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    #[test]
    fn ready_only_when_every_selected_node_holds_the_current_revision() {
        let edge: BTreeMap<String, String> = [("role".to_string(), "edge".to_string())].into();
        let core: BTreeMap<String, String> = [("role".to_string(), "core".to_string())].into();
        let fresh = state(3, "rev3");
        let old_gen = state(2, "rev2");
        let old_members = state(3, "rev3-before-a-slice-change");
        let p = policy(3, json!({"matchLabels": {"role": "edge"}}));
        let valid = Validity::Valid {
            pending: Vec::new(),
            members: 10,
            excepted: 2,
            sets: vec!["ipm4-p".into()],
        };
        let view = |state, seen_ago| NodeView {
            labels: &edge,
            state,
            seen_ago,
        };
        let mut nodes = BTreeMap::new();
        nodes.insert("a", view(Some(&fresh), secs(30)));
        nodes.insert("b", view(Some(&old_gen), secs(30)));
        // Synced, but not refreshed for four heartbeat intervals: dead.
        nodes.insert("c", view(Some(&fresh), secs(240)));
        nodes.insert("d", view(None, None));
        nodes.insert("e", view(Some(&old_members), secs(30)));
        let core_view = NodeView {
            labels: &core,
            state: None,
            seen_ago: None,
        };
        nodes.insert("z", core_view);
        let s = status_for(&p, &valid, "rev3", &nodes, None, now());
        let sum = s.summary.as_ref().unwrap();
        assert_eq!(
            (sum.nodes, sum.synced, sum.synced_text.as_str()),
            (5, 1, "1/5")
        );
        assert_eq!(sum.failing_nodes, ["b", "c", "d", "e"]);
        assert_eq!(sum.excepted, 2);
        assert_eq!(sum.problems, 8, "summed over entries");
        assert_eq!(sum.members, 10);
        let ready = &s.conditions[1];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "False")
        );
        assert!(
            ready.message.contains("b (older generation)"),
            "{}",
            ready.message
        );
        assert!(
            ready.message.contains("c (heartbeat stale)"),
            "{}",
            ready.message
        );
        assert!(ready.message.ends_with("and 1 more"), "{}", ready.message);
        assert_eq!(s.observed_generation, Some(3));

        // Only the fresh node left: ready.
        nodes.retain(|n, _| *n == "a" || *n == "z");
        let s2 = status_for(&p, &valid, "rev3", &nodes, Some(&s), now());
        let ready = &s2.conditions[1];
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason, "AllNodesSynced");
        assert_eq!(ready.message, "1 of 1 selected nodes hold generation 3");
        // Valid did not change: its transition time is kept.
        assert_eq!(
            s2.conditions[0].last_transition_time,
            s.conditions[0].last_transition_time
        );
        assert_eq!(ready.last_transition_time.0, now());
    }

    #[test]
    fn invalid_policies_and_empty_selections() {
        let none: BTreeMap<&str, NodeView<'_>> = BTreeMap::new();
        let p = policy(1, json!(null));
        let bad = Validity::Invalid {
            message: "policy \"p\": member \"x\" rejected".into(),
        };
        let s = status_for(&p, &bad, "", &none, None, now());
        assert_eq!(s.conditions[0].status, "False");
        assert_eq!(s.conditions[0].reason, "InvalidPolicy");
        assert!(s.conditions[0].message.contains("member \"x\""));
        assert_eq!(s.conditions[1].status, "False");
        let valid = Validity::Valid {
            pending: Vec::new(),
            members: 0,
            excepted: 0,
            sets: vec![],
        };
        let s = status_for(&p, &valid, "", &none, None, now());
        assert_eq!(s.conditions[1].status, "True");
        assert_eq!(s.conditions[1].reason, "NoNodesSelected");
        assert_eq!(s.summary.unwrap().synced_text, "0/0");
    }

    #[test]
    fn failing_names_are_bounded() {
        let labels = BTreeMap::new();
        let names: Vec<String> = (0..50).map(|i| format!("n{i:02}")).collect();
        let nodes: BTreeMap<&str, NodeView<'_>> = names
            .iter()
            .map(|n| {
                let v = NodeView {
                    labels: &labels,
                    state: None,
                    seen_ago: None,
                };
                (n.as_str(), v)
            })
            .collect();
        let valid = Validity::Valid {
            pending: Vec::new(),
            members: 1,
            excepted: 0,
            sets: vec![],
        };
        let s = status_for(&policy(1, json!(null)), &valid, "", &nodes, None, now());
        assert_eq!(
            s.summary.as_ref().unwrap().failing_nodes.len(),
            MAX_FAILING_NODES
        );
        assert!(
            s.conditions[1].message.ends_with("and 47 more"),
            "{}",
            s.conditions[1].message
        );
    }
}
