//! The controller's writes, in a task of their own so the event loop never
//! waits on the API server: policy statuses (server-side apply of
//! `/status`, field manager `ipsetmgr-controller`), Warning events, and the
//! deletion of node states whose Node is gone. Only the Lease holder
//! writes. Statuses come as the latest plan (a watch channel: a burst of
//! changes costs one write per policy), paced per policy and overall.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::leading::LeaderPlans;
use super::metrics::ControllerShared;
use ipsetmgr_api::{IPSetNodeState, IPSetPolicy, IPSetPolicyStatus};
use ipsetmgr_cluster::telemetry::labels::ResultLabel;

/// The field manager of the controller's status writes.
pub const FIELD_MANAGER: &str = "ipsetmgr-controller";

/// Statuses that differ from what the server shows, by policy.
pub type Plan = BTreeMap<String, IPSetPolicyStatus>;

/// One-off writes.
#[derive(Clone, Debug)]
pub enum Job {
    /// A Warning event about a policy.
    Warn {
        regarding: ObjectReference,
        reason: String,
        note: String,
    },
    /// Delete the node state of a Node that no longer exists.
    DeleteNodeState(String),
}

#[derive(Clone, Debug)]
pub struct WriterSettings {
    /// Identity, for the events' reporting instance.
    pub identity: String,
    /// At most one status write per policy per this interval.
    pub per_policy_interval: Duration,
    /// A change of counts and messages only (nodes converging: 3/6, 4/6,
    /// ...) is written at most once per this interval; a change of what the
    /// conditions say (a new generation, Ready flipping) is written at once.
    /// Every status write goes to every watcher of the policies (all the
    /// agents), so a change costs at most three: not ready, a count, ready.
    pub summary_interval: Duration,
    /// At least this long between any two writes.
    pub pacing: Duration,
    pub request_timeout: Duration,
}

/// The body of a status apply: only what this field manager owns.
pub fn apply_body(policy: &str, status: &IPSetPolicyStatus) -> serde_json::Value {
    json!({
        "apiVersion": IPSetPolicy::api_version(&()),
        "kind": IPSetPolicy::kind(&()),
        "metadata": {"name": policy},
        "status": status,
    })
}

struct Writer {
    client: Client,
    settings: WriterSettings,
    shared: Arc<ControllerShared>,
    /// Per policy: what was last written, and when.
    written: BTreeMap<String, Written>,
    /// When a deferred count-only change falls due (the earliest).
    deferred_until: Option<Instant>,
}

/// The last status write of one policy.
struct Written {
    status: IPSetPolicyStatus,
    at: Instant,
    /// Count-only writes since the conditions last changed.
    counts: u32,
}

/// After the first count-only write of a change, the next come this many
/// summary intervals apart: a change that takes minutes to converge (or a
/// node that never does) still costs about three writes, and the counts
/// are still refreshed now and then.
const COUNT_REFRESH_INTERVALS: u32 = 30;

/// What makes a status change worth writing at once: the generation
/// observed and each condition's status and reason (not messages or
/// counts, which move while nodes converge).
type Shape<'a> = (
    Option<i64>,
    Vec<(&'a str, &'a str, &'a str, Option<i64>)>,
    usize,
);

fn shape(s: &IPSetPolicyStatus) -> Shape<'_> {
    let conditions = s
        .conditions
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.observed_generation,
            )
        })
        .collect();
    let failing_sources = s.sources.iter().filter(|x| x.error.is_some()).count();
    (s.observed_generation, conditions, failing_sources)
}

/// Why one write failed. Logged as the API server's own reason and
/// message (`api_error::describe`).
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("{}", ipsetmgr_cluster::api_error::describe(.0))]
    Api(kube::Error),
    #[error("timed out")]
    TimedOut,
}

impl WriteError {
    /// A delete that failed because the object is already gone: the API
    /// server's 404, nothing else.
    fn already_gone(&self) -> bool {
        matches!(self, WriteError::Api(kube::Error::Api(s)) if s.code == 404)
    }
}

impl Writer {
    async fn timed<T>(
        &self,
        f: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, WriteError> {
        match tokio::time::timeout(self.settings.request_timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(WriteError::Api(e)),
            Err(_) => Err(WriteError::TimedOut),
        }
    }

    /// Write what the plan holds, except what was just written the same.
    async fn write_plan(&mut self, plan: &Plan) {
        let api: Api<IPSetPolicy> = Api::all(self.client.clone());
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.deferred_until = None;
        for (policy, status) in plan {
            let recent = self.written.get(policy).is_some_and(|w| {
                w.status == *status && w.at.elapsed() < self.settings.per_policy_interval * 10
            });
            if recent {
                continue;
            }
            // Counts only: one write a summary interval after the conditions
            // changed, then one now and then (latest wins).
            let counts_only = self
                .written
                .get(policy)
                .is_some_and(|w| shape(&w.status) == shape(status));
            if let Some(w) = self.written.get(policy)
                && counts_only
            {
                let wait = match w.counts {
                    0 => self.settings.summary_interval,
                    _ => self.settings.summary_interval * COUNT_REFRESH_INTERVALS,
                };
                if w.at.elapsed() < wait {
                    let due = w.at + wait;
                    self.deferred_until = Some(self.deferred_until.map_or(due, |d| d.min(due)));
                    continue;
                }
            }
            if let Some(w) = self.written.get(policy) {
                tokio::time::sleep_until(w.at + self.settings.per_policy_interval).await;
            }
            let body = apply_body(policy, status);
            let result = self
                .timed(api.patch_status(policy, &pp, &Patch::Apply(&body)))
                .await;
            match result {
                Ok(_) => {
                    self.shared
                        .metrics
                        .status_writes
                        .get_or_create(&ResultLabel::of(true))
                        .inc();
                    let counts = match self.written.get(policy) {
                        Some(w) if counts_only => w.counts + 1,
                        _ => 0,
                    };
                    self.written.insert(
                        policy.clone(),
                        Written {
                            status: status.clone(),
                            at: Instant::now(),
                            counts,
                        },
                    );
                }
                Err(e) => {
                    self.shared
                        .metrics
                        .status_writes
                        .get_or_create(&ResultLabel::of(false))
                        .inc();
                    tracing::warn!(%policy, error = %e, "policy status write failed; retried with the next plan");
                }
            }
            tokio::time::sleep(self.settings.pacing).await;
        }
        // Only what can still suppress a repeat (or defer a count) is worth
        // remembering.
        let keep = (self.settings.per_policy_interval * 10)
            .max(self.settings.summary_interval * COUNT_REFRESH_INTERVALS);
        self.written.retain(|_, w| w.at.elapsed() < keep);
    }

    async fn run_job(&mut self, job: Job) {
        match job {
            Job::Warn {
                regarding,
                reason,
                note,
            } => {
                let ev = warning_event(&regarding, reason, note, &self.settings.identity);
                let ns = regarding
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let events: Api<k8s_openapi::api::events::v1::Event> =
                    Api::namespaced(self.client.clone(), &ns);
                match self.timed(events.create(&Default::default(), &ev)).await {
                    Ok(_) => {
                        self.shared
                            .metrics
                            .event_writes
                            .get_or_create(&ResultLabel::of(true))
                            .inc();
                    }
                    Err(e) => {
                        self.shared
                            .metrics
                            .event_writes
                            .get_or_create(&ResultLabel::of(false))
                            .inc();
                        tracing::warn!(error = %e, "could not publish an event")
                    }
                }
            }
            Job::DeleteNodeState(name) => {
                // The Node watch may lag behind a Node that just joined:
                // ask the API server itself before deleting.
                let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
                match self.timed(nodes.get_opt(&name)).await {
                    Ok(None) => {}
                    Ok(Some(_)) => return,
                    Err(e) => {
                        tracing::warn!(node = %name, error = %e, "cannot tell whether the Node exists; its node state is kept");
                        return;
                    }
                }
                let api: Api<IPSetNodeState> = Api::all(self.client.clone());
                match self
                    .timed(api.delete(&name, &DeleteParams::default()))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(node = %name, "deleted the node state of a Node that is gone");
                        self.shared.metrics.node_states_deleted.inc();
                    }
                    Err(e) if e.already_gone() => {}
                    Err(e) => {
                        tracing::warn!(node = %name, error = %e, "could not delete a node state")
                    }
                }
            }
        }
    }
}

/// Write plans and jobs while this replica leads; drop them otherwise (the
/// leader does the same work).
pub async fn run_writer(
    client: Client,
    settings: WriterSettings,
    plans: watch::Receiver<Arc<Plan>>,
    mut jobs: mpsc::Receiver<Job>,
    leader: watch::Receiver<bool>,
    shared: Arc<ControllerShared>,
) {
    let mut w = Writer {
        client,
        settings,
        shared,
        written: BTreeMap::new(),
        deferred_until: None,
    };
    let mut plans = LeaderPlans::new(plans, leader);
    let mut latest: Option<Arc<Plan>> = None;
    let far = || Instant::now() + Duration::from_secs(86400 * 365);
    loop {
        let deferred = w.deferred_until.unwrap_or_else(far);
        tokio::select! {
            plan = plans.next() => match plan {
                Some(plan) => {
                    w.write_plan(&plan).await;
                    latest = Some(plan);
                }
                None => break,
            },
            _ = tokio::time::sleep_until(deferred) => {
                w.deferred_until = None;
                if let Some(plan) = latest.clone().filter(|_| plans.leads()) {
                    w.write_plan(&plan).await;
                }
            }
            job = jobs.recv() => match job {
                Some(job) if plans.leads() => w.run_job(job).await,
                Some(_) => {}
                None => break,
            },
        }
    }
}

/// An event's name: the name of the object it is about, cut so that the
/// whole stays a valid object name (at most 253 characters; a 253-character
/// policy name plus a suffix was refused with 422, and its Warning lost),
/// then a unique suffix. The full name is in `regarding`.
fn event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let room = 253 - suffix.len();
    let mut head = &object[..object.len().min(room)];
    head = head.trim_end_matches(['.', '-']);
    if head.is_empty() {
        head = FIELD_MANAGER;
    }
    format!("{head}{suffix}")
}

/// A Warning event (events.k8s.io/v1) about `regarding`, by this replica.
/// Written here rather than by kube's Recorder, which names events after
/// the object in full; repeats are already suppressed by the caller.
fn warning_event(
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    reason: String,
    note: String,
    identity: &str,
) -> k8s_openapi::api::events::v1::Event {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let now = jiff::Timestamp::now();
    let object = regarding.name.as_deref().unwrap_or(FIELD_MANAGER);
    k8s_openapi::api::events::v1::Event {
        metadata: ObjectMeta {
            name: Some(event_name(object, now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..Default::default()
        },
        action: Some("Validate".into()),
        reason: Some(reason),
        note: Some(note),
        type_: Some("Warning".into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        reporting_controller: Some(FIELD_MANAGER.into()),
        reporting_instance: Some(identity.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod event_name_tests {
    use super::*;

    #[test]
    fn event_names_stay_valid_object_names() {
        let long = format!("{}-x", "a".repeat(250));
        for object in [
            "blocklist",
            long.as_str(),
            &format!("{}.b", "a".repeat(235)),
        ] {
            let name = event_name(object, 0x18d2_f0aa_bb00_1234);
            assert!(name.len() <= 253, "{} > 253", name.len());
            assert_eq!(
                ipsetmgr_policy::k8s_names::dns1123_subdomain(&name),
                Ok(()),
                "{name}"
            );
        }
        assert_eq!(event_name("blocklist", 255), "blocklist.ff");
    }
}

#[cfg(test)]
mod already_gone_tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut status = kube::core::Status::failure(message, reason);
        status.code = code;
        kube::Error::Api(status.boxed())
    }

    /// Only the API server's 404 means the node state is already gone; a
    /// failure whose text merely mentions 404 or NotFound (a node named
    /// `rack-404`, a webhook's message) is a failed delete, logged.
    #[test]
    fn only_a_404_status_is_already_gone() {
        let gone = WriteError::Api(api_error(
            404,
            "NotFound",
            "ipsetnodestates \"n1\" not found",
        ));
        assert!(gone.already_gone());
        for e in [
            api_error(
                500,
                "InternalError",
                "etcd: deleting ipsetnodestates/rack-404: timeout",
            ),
            api_error(
                403,
                "Forbidden",
                "admission webhook: NotFound is not a reason to delete",
            ),
        ] {
            let e = WriteError::Api(e);
            assert!(!e.already_gone(), "{e}");
        }
        assert!(!WriteError::TimedOut.already_gone());
        // What the log says is the API server's reason and message.
        assert_eq!(
            gone.to_string(),
            "NotFound (HTTP 404): ipsetnodestates \"n1\" not found"
        );
    }
}
