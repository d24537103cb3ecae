//! This node's `status.nodes[]` entries: what they should say, when they
//! need writing, and the server-side apply bodies that write them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use kube::ResourceExt;
use serde_json::{Value, json};

use super::worker::Report;
use crate::policy::{Compiled, IPSetPolicy, NodeStatus};

/// The per-node field manager; SSA ownership of `status.nodes[nodeName=<node>]`.
pub fn field_manager(node: &str) -> String {
    format!("ipsetmgr-agent-{node}")
}

/// What one desired state (one `seq`) meant for each policy.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub seq: u64,
    /// Every policy in the store, with its generation.
    pub generations: BTreeMap<String, i64>,
    /// Policies that apply to this node (including ones that failed to compile).
    pub selected: BTreeSet<String>,
    /// Compile errors by policy, joined.
    pub errors: BTreeMap<String, String>,
    /// Kernel set names by policy.
    pub set_names: BTreeMap<String, Vec<String>>,
}

impl Snapshot {
    pub fn new<'a>(
        seq: u64,
        policies: impl IntoIterator<Item = &'a IPSetPolicy>,
        compiled: &Compiled,
    ) -> Snapshot {
        let mut snap = Snapshot {
            seq,
            ..Snapshot::default()
        };
        let not_selected: BTreeSet<&str> =
            compiled.not_selected.iter().map(String::as_str).collect();
        for p in policies {
            let name = p.name_any();
            snap.generations
                .insert(name.clone(), p.metadata.generation.unwrap_or(0));
            if !not_selected.contains(name.as_str()) {
                snap.selected.insert(name);
            }
        }
        for (policy, errs) in compiled.errors_by_policy() {
            let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
            snap.errors.insert(policy.to_string(), text.join("; "));
        }
        for s in &compiled.sets {
            snap.set_names
                .entry(s.policy.clone())
                .or_default()
                .push(s.name.clone());
        }
        snap
    }
}

/// RFC 3339 in whole seconds, as Kubernetes prints times.
pub fn rfc3339(t: SystemTime) -> String {
    use k8s_openapi::jiff::Timestamp;
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Timestamp::from_second(secs).map_or_else(|_| String::new(), |ts| ts.to_string())
}

/// The error text of a policy on this node, if any: compile errors, then
/// the manager's per-set errors.
pub fn policy_error(policy: &str, snap: &Snapshot, report: &Report) -> Option<String> {
    if let Some(e) = snap.errors.get(policy) {
        return Some(e.clone());
    }
    let errs: Vec<String> = report
        .sets
        .iter()
        .filter(|s| s.policy == policy)
        .filter_map(|s| s.error.as_ref().map(|e| format!("set {}: {e}", s.name)))
        .collect();
    (!errs.is_empty()).then(|| errs.join("; "))
}

/// This node's entry for `policy`: `None` when the policy is not in the
/// snapshot (nothing to write), `Some(None)` to withdraw the entry (the
/// policy does not select this node), `Some(Some(entry))` otherwise.
pub fn node_entry(
    node: &str,
    policy: &str,
    snap: &Snapshot,
    report: &Report,
) -> Option<Option<NodeStatus>> {
    let generation = *snap.generations.get(policy)?;
    if !snap.selected.contains(policy) {
        return Some(None);
    }
    let sets: Vec<_> = report.sets.iter().filter(|s| s.policy == policy).collect();
    let wanted = snap.set_names.get(policy).map_or(0, Vec::len);
    let error = policy_error(policy, snap, report).unwrap_or_default();
    let synced = error.is_empty() && sets.len() == wanted && sets.iter().all(|s| s.synced);
    let set_names = match snap.set_names.get(policy) {
        Some(names) => names.clone(),
        None => sets.iter().map(|s| s.name.clone()).collect(),
    };
    Some(Some(NodeStatus {
        node_name: node.to_string(),
        observed_generation: generation,
        synced,
        set_names,
        members: sets.iter().map(|s| s.members as i64).sum(),
        problems: sets.iter().map(|s| s.problems as i64).sum(),
        last_sync_time: sets.iter().filter_map(|s| s.last_sync).max().map(rfc3339),
        error,
    }))
}

/// The server-side apply body for this node's entry: only apiVersion, kind,
/// name and `status.nodes` with at most this node's entry. An empty list
/// withdraws the entry this field manager owns.
pub fn apply_body(policy: &str, entry: Option<&NodeStatus>) -> Value {
    let nodes: Vec<&NodeStatus> = entry.into_iter().collect();
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1",
        "kind": "IPSetPolicy",
        "metadata": { "name": policy },
        "status": { "nodes": nodes },
    })
}

fn without_time(e: &Option<NodeStatus>) -> Option<NodeStatus> {
    e.clone().map(|mut e| {
        e.last_sync_time = None;
        e
    })
}

#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Skip,
    Write,
    /// Changed, but written too recently: write at this time (coalesced).
    DeferUntil(Instant),
}

struct Written {
    entry: Option<NodeStatus>,
    at: Instant,
}

/// Decides which entries need writing: only on content change (the sync
/// time alone is not a change), at most one write per policy per
/// `min_interval`.
pub struct StatusTracker {
    written: HashMap<String, Written>,
    min_interval: Duration,
    /// How long after our own write the watch may still show older content.
    drift_grace: Duration,
}

impl StatusTracker {
    pub fn new(min_interval: Duration) -> StatusTracker {
        StatusTracker {
            written: HashMap::new(),
            min_interval,
            drift_grace: Duration::from_secs(5).max(min_interval),
        }
    }

    /// `observed`: this node's entry as the watch last showed it on the
    /// server (`None` when unknown).
    pub fn decide(
        &self,
        policy: &str,
        desired: &Option<NodeStatus>,
        observed: Option<&Option<NodeStatus>>,
        now: Instant,
    ) -> Decision {
        let want = without_time(desired);
        let changed = match self.written.get(policy) {
            Some(w) => {
                // Someone else changed or removed our entry since we wrote it
                // (and the watch has had time to show our write): rewrite.
                let drifted = observed.is_some_and(|o| without_time(o) != w.entry)
                    && now.saturating_duration_since(w.at) >= self.drift_grace;
                w.entry != want || drifted
            }
            None => observed.map(without_time).unwrap_or(None) != want,
        };
        if !changed {
            return Decision::Skip;
        }
        match self.written.get(policy) {
            Some(w) if now.saturating_duration_since(w.at) < self.min_interval => {
                Decision::DeferUntil(w.at + self.min_interval)
            }
            _ => Decision::Write,
        }
    }

    pub fn record(&mut self, policy: &str, written: &Option<NodeStatus>, now: Instant) {
        self.written.insert(
            policy.to_string(),
            Written {
                entry: without_time(written),
                at: now,
            },
        );
    }

    pub fn forget(&mut self, policy: &str) {
        self.written.remove(policy);
    }
}
