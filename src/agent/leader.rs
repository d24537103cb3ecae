//! One elected agent (coordination.k8s.io Lease) writes `status.summary`
//! and removes `status.nodes[]` entries of nodes that are gone or no longer
//! selected. kube 5 has no leader-election helper, so the Lease is handled
//! here: get, create when missing, update (optimistic concurrency through
//! resourceVersion) to renew or to take over an expired lease.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::policy::selector;
use crate::policy::{IPSetPolicy, StatusSummary};

pub const LEASE_NAME: &str = "ipsetmgr-summary";
pub const SUMMARY_MANAGER: &str = "ipsetmgr-summary";

#[derive(Clone, Debug)]
pub struct LeaderSettings {
    pub identity: String,
    pub namespace: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
    /// How often the leader recomputes summaries and collects entries.
    pub summary_every: Duration,
    pub request_timeout: Duration,
}

impl LeaderSettings {
    pub fn new(identity: &str, namespace: &str) -> LeaderSettings {
        LeaderSettings {
            identity: identity.to_string(),
            namespace: namespace.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            summary_every: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
        }
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Acquire or renew the lease; `Ok(true)` while this agent leads.
pub async fn try_acquire(leases: &Api<Lease>, s: &LeaderSettings) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let secs = s.lease_duration.as_secs() as i32;
    let Some(mut lease) = leases.get_opt(LEASE_NAME).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.into()),
                namespace: Some(s.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(s.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match leases.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let mine = spec.holder_identity.as_deref() == Some(s.identity.as_str());
    if !mine {
        let duration = SignedDuration::from_secs(i64::from(
            spec.lease_duration_seconds.unwrap_or(secs).max(1),
        ));
        let expired = match (&spec.holder_identity, &spec.renew_time) {
            (Some(h), Some(t)) if !h.is_empty() => t.0 + duration < now,
            _ => true,
        };
        if !expired {
            return Ok(false);
        }
        spec.holder_identity = Some(s.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(secs);
    // `replace` carries the resourceVersion we read: a concurrent taker
    // makes this fail with 409 instead of two leaders.
    match leases
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What the leader writes for one policy.
#[derive(Debug, PartialEq)]
pub struct SummaryPlan {
    pub summary: StatusSummary,
    /// Entries to remove: (index in status.nodes, nodeName).
    pub remove: Vec<(usize, String)>,
}

/// Summarise `policy` over the cluster's nodes (name → labels).
pub fn plan_summary(
    policy: &IPSetPolicy,
    nodes: &BTreeMap<String, BTreeMap<String, String>>,
) -> SummaryPlan {
    let generation = policy.metadata.generation.unwrap_or(0);
    let sel = policy.spec.node_selector.as_ref();
    let selects = |labels: &BTreeMap<String, String>| selector::matches(sel, labels) == Ok(true);
    let selected = nodes.values().filter(|l| selects(l)).count() as i64;
    let mut synced = 0;
    let mut problems = 0;
    let mut remove = Vec::new();
    let entries = policy.status.as_ref().map_or(&[][..], |s| &s.nodes[..]);
    for (i, e) in entries.iter().enumerate() {
        match nodes.get(&e.node_name) {
            Some(labels) if selects(labels) => {
                if e.synced && e.observed_generation == generation {
                    synced += 1;
                }
                problems += e.problems;
            }
            _ => remove.push((i, e.node_name.clone())),
        }
    }
    SummaryPlan {
        summary: StatusSummary {
            nodes: selected,
            synced,
            synced_text: format!("{synced}/{selected}"),
            problems,
            observed_generation: generation,
        },
        remove,
    }
}

/// The JSON patch removing departed nodes' entries.
///
/// Why JSON patch: each entry is owned by its node's field manager, and a
/// server-side apply by another manager cannot remove fields it does not
/// own. A merge patch would have to rewrite the whole `status.nodes` list
/// and could drop an entry another agent wrote in between. A JSON patch
/// with a `test` of each entry's nodeName before its `remove` fails (422)
/// instead when the list moved under us; the next round retries on fresh
/// data. Removals go from the highest index down so indices stay valid.
pub fn removal_patch(remove: &[(usize, String)]) -> serde_json::Value {
    let mut sorted: Vec<&(usize, String)> = remove.iter().collect();
    sorted.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut ops = Vec::new();
    for (i, name) in sorted {
        ops.push(
            json!({"op": "test", "path": format!("/status/nodes/{i}/nodeName"), "value": name}),
        );
        ops.push(json!({"op": "remove", "path": format!("/status/nodes/{i}")}));
    }
    serde_json::Value::Array(ops)
}

/// The server-side apply body for the summary (field manager `ipsetmgr-summary`).
pub fn summary_body(policy: &str, summary: &StatusSummary) -> serde_json::Value {
    json!({
        "apiVersion": "ipsetmgr.io/v1alpha1",
        "kind": "IPSetPolicy",
        "metadata": { "name": policy },
        "status": { "summary": summary },
    })
}

/// One summary round: list policies (with status) and nodes, write changed
/// summaries, collect departed entries. Returns the number of writes.
pub async fn summary_round(client: &Client) -> Result<usize, kube::Error> {
    let policies: Api<IPSetPolicy> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let node_labels: BTreeMap<String, BTreeMap<String, String>> = nodes
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let name = n.name_any();
            (name, n.metadata.labels.unwrap_or_default())
        })
        .collect();
    let mut writes = 0;
    let apply = PatchParams::apply(SUMMARY_MANAGER).force();
    for p in policies.list(&ListParams::default()).await?.items {
        let name = p.name_any();
        let plan = plan_summary(&p, &node_labels);
        if !plan.remove.is_empty() {
            let patch: json_patch::Patch = serde_json::from_value(removal_patch(&plan.remove))
                .expect("removal patch is a valid JSON patch");
            match policies
                .patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
            {
                Ok(_) => {
                    writes += 1;
                    tracing::info!(policy = %name, removed = ?plan.remove, "removed departed nodes' entries");
                }
                // The list changed under us (test op failed): next round.
                Err(e) => tracing::info!(policy = %name, error = %e, "entry removal skipped"),
            }
        }
        let current = p.status.as_ref().and_then(|s| s.summary.as_ref());
        if current != Some(&plan.summary) {
            policies
                .patch_status(
                    &name,
                    &apply,
                    &Patch::Apply(summary_body(&name, &plan.summary)),
                )
                .await?;
            writes += 1;
        }
    }
    Ok(writes)
}

/// Campaign for the lease; while leading, summarise every `summary_every`.
pub async fn run(
    client: Client,
    s: LeaderSettings,
    shared: std::sync::Arc<super::metrics::Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &s.namespace);
    let mut leading = false;
    let mut last_summary: Option<tokio::time::Instant> = None;
    loop {
        let acquired = tokio::time::timeout(s.request_timeout, try_acquire(&leases, &s)).await;
        let now_leading = match acquired {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "lease");
                false
            }
            Err(_) => false,
        };
        if now_leading != leading {
            tracing::info!(leading = now_leading, "summary leadership");
            leading = now_leading;
            last_summary = None;
        }
        if leading && last_summary.is_none_or(|t| t.elapsed() >= s.summary_every) {
            last_summary = Some(tokio::time::Instant::now());
            match tokio::time::timeout(s.request_timeout * 6, summary_round(&client)).await {
                Ok(Ok(n)) => {
                    shared.metrics.status_writes.inc_by(n as u64);
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "summary round failed"),
                Err(_) => tracing::warn!("summary round timed out"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(s.renew_every) => {}
            _ = shutdown.changed() => break,
        }
    }
}
