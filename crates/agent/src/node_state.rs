//! This node's `IPSetNodeState`: what goes in it, and the task that writes
//! it.
//!
//! The writer is a task of its own fed through a watch channel (latest
//! value wins, so the queue is bounded at one): a slow or unreachable API
//! server never delays the event loop or the kernel work, and a burst of
//! reports costs one write. It creates the object when missing (a
//! server-side apply to `/status` of an object that does not exist is a
//! 404), owned by the Node so it goes when the Node goes, then applies the
//! status with its own field manager; it repeats the latest status every
//! heartbeat interval, so the controller can tell a dead agent from a
//! synced one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::metrics::Shared;
use ipsetmgr_api::{IPSetNodeState, IPSetNodeStateSpec, IPSetNodeStateStatus, PolicyState};
use ipsetmgr_cluster::telemetry::labels::ResultLabel;
use ipsetmgr_sets::driver::Report;
use ipsetmgr_sets::{BackendId, SetRef};

/// The field manager of the agents' status writes.
pub const FIELD_MANAGER: &str = "ipsetmgr-agent";
/// The schema's maxLength of `error` and `message` (characters; a byte is
/// at most one).
const MAX_ERROR_LEN: usize = 1024;

/// Cut `text` to fit the schema: an over-long string would make the API
/// server refuse the whole status.
fn fit(text: &str) -> String {
    ipsetmgr_policy::text::bounded(text, MAX_ERROR_LEN).into_owned()
}

/// What the agent asked the kernel to hold, per policy selecting this node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub seq: u64,
    pub policies: BTreeMap<String, PolicyFacts>,
}

/// A policy as compiled. Its sets' names are not here: the backend names
/// them, and the report says how (see [`status_of`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyFacts {
    pub generation: i64,
    /// See `ipsetmgr_policy::revision::members_revision`.
    pub revision: String,
    /// Why it was not compiled (its sets are held as they are).
    pub error: Option<String>,
    /// Members its except ranges dropped or cut.
    pub excepted: i64,
}

fn rfc3339(t: SystemTime) -> Option<String> {
    let ts = jiff::Timestamp::try_from(t).ok()?;
    Some(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// With milliseconds: when the kernel took a change is read to the
/// millisecond (scripts/scale.py's change-to-kernel latency).
fn rfc3339_millis(t: SystemTime) -> Option<String> {
    let ts = jiff::Timestamp::try_from(t).ok()?;
    Some(ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

/// The backend this node lists first (`--backend`): its sets are named
/// plainly and its members counted.
pub(crate) fn primary_backend(report: &Report) -> Option<BackendId> {
    report.sets.first().map(|s| s.set.backend)
}

/// A set as the node state names it: by name in the first backend, as
/// `<kind>:<name>` in any other.
fn shown(set: &SetRef, primary: Option<BackendId>) -> String {
    if Some(set.backend) == primary {
        set.name.clone()
    } else {
        format!("{}:{}", set.backend.kind, set.name)
    }
}

/// The status for `report`, which describes `snapshot` (same seq).
pub fn status_of(
    snapshot: &Snapshot,
    report: &Report,
    heartbeat: Duration,
) -> IPSetNodeStateStatus {
    let primary = primary_backend(report);
    let mut policies = Vec::with_capacity(snapshot.policies.len());
    for (name, facts) in &snapshot.policies {
        let sets: Vec<_> = report.sets.iter().filter(|s| s.policy == *name).collect();
        let set_error = sets.iter().find_map(|s| {
            let e = s.error.as_ref()?;
            Some(format!("{}: {e}", shown(&s.set, primary)))
        });
        let error = facts.error.clone().or(set_error).unwrap_or_default();
        let synced = facts.error.is_none()
            && !sets.is_empty()
            && sets.iter().all(|s| s.synced)
            && report.seq == snapshot.seq;
        let last_sync = sets
            .iter()
            .map(|s| s.last_sync)
            .collect::<Option<Vec<_>>>()
            .and_then(|times| times.into_iter().min());
        // The names the sets have in the kernel are the backend's: the
        // compiled names are shortened past ipset's 31 bytes, while an nft
        // set carries the policy's name in full (docs/architecture.md,
        // "Names and ownership"). So they come from the report: the first
        // backend's sets by name, every other backend's as `<kind>:<set>`
        // (`nft:ipm4-a`), whose members are not counted again.
        let set_names = sets.iter().map(|s| shown(&s.set, primary)).collect();
        let members = sets
            .iter()
            .filter(|s| Some(s.set.backend) == primary)
            .map(|s| s.members as i64)
            .sum();
        policies.push(PolicyState {
            name: name.clone(),
            observed_generation: facts.generation,
            revision: facts.revision.clone(),
            synced,
            set_names,
            members,
            problems: sets.iter().map(|s| s.problems as i64).sum(),
            last_sync_time: last_sync.and_then(rfc3339_millis),
            error: fit(&error),
        });
    }
    let synced = policies.iter().filter(|p| p.synced).count();
    let unsynced: Vec<&PolicyState> = policies.iter().filter(|p| !p.synced).collect();
    let message = match unsynced.first() {
        // Every policy synced, but owned sets that should be gone are not
        // (a firewall rule still uses them; after a backend switch, the
        // other facility's sets): said, never forced.
        None => match report.deletions.first() {
            None => String::new(),
            Some(d) => {
                let more = match report.deletions.len() - 1 {
                    0 => String::new(),
                    n => format!(" (and {n} more sets)"),
                };
                // A set of a backend no longer selected is named with it.
                let set = if Some(d.set.backend) == primary {
                    d.set.name.clone()
                } else {
                    format!("{}:{}", d.set.backend.name, d.set.name)
                };
                fit(&format!(
                    "set {set} should be gone but is not: {}{more}",
                    d.error
                ))
            }
        },
        Some(p) => {
            let why = if p.error.is_empty() {
                "not synced"
            } else {
                p.error.as_str()
            };
            let more = match unsynced.len() - 1 {
                0 => String::new(),
                n => format!(" (and {n} more policies not synced)"),
            };
            fit(&format!("{}: {why}{more}", p.name))
        }
    };
    IPSetNodeStateStatus {
        message,
        heartbeat_time: None,
        heartbeat_interval_seconds: heartbeat.as_secs() as i64,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        synced_text: format!("{synced}/{}", policies.len()),
        problems: policies.iter().map(|p| p.problems).sum(),
        policies,
    }
}

/// What the writer is given: the status and the Node's uid (its owner).
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    pub status: IPSetNodeStateStatus,
    pub node_uid: Option<String>,
}

/// How often the node state may be written (`--node-state-interval`): a
/// change that arrives as many slice updates (each its own compile and
/// apply) must cost the API server a write or two, not one per slice: at
/// 5,000 nodes each write of every node is 5,000 writes to etcd.
/// (The flag is `src/args.rs`'s `NodeStatePacing`.)
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// At most one node-state write per this interval.
    pub interval: Duration,
}

impl Pacing {
    pub fn writer(&self, node: &str, heartbeat: Duration) -> WriterSettings {
        WriterSettings {
            node: node.to_string(),
            heartbeat,
            min_interval: self.interval,
            settle: self.interval,
            burst: self.interval * BURST_INTERVALS,
            retry: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// How many intervals a change that keeps arriving may be held back: a
/// change's slices that `kubectl apply` sends one by one over up to 30 s
/// (at the default 5 s interval) cost at most two writes (docs/scaling.md,
/// "A change that trickles in").
const BURST_INTERVALS: u32 = 8;

/// Timing of the writer.
#[derive(Clone, Debug)]
pub struct WriterSettings {
    pub node: String,
    pub heartbeat: Duration,
    /// At most one write per this interval.
    pub min_interval: Duration,
    /// A change waits for quiet this long before it is written: the next
    /// slice of a change that trickles in comes sooner, and the node's
    /// state is written once, when the whole change is held.
    pub settle: Duration,
    /// ... but at most this long after the first change not yet written.
    pub burst: Duration,
    /// Wait before retrying a failed write.
    pub retry: Duration,
    pub request_timeout: Duration,
}

/// The body of the status apply: only what this field manager owns.
pub fn apply_body(node: &str, status: &IPSetNodeStateStatus) -> serde_json::Value {
    json!({
        "apiVersion": IPSetNodeState::api_version(&()),
        "kind": IPSetNodeState::kind(&()),
        "metadata": {"name": node},
        "status": status,
    })
}

/// The object to create: empty spec, owned by the Node (when its uid is
/// known), so that it is garbage-collected with it.
fn new_object(node: &str, node_uid: Option<&str>) -> IPSetNodeState {
    let mut obj = IPSetNodeState::new(node, IPSetNodeStateSpec {});
    obj.metadata.owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.to_string(),
            uid: uid.to_string(),
            ..OwnerReference::default()
        }]
    });
    obj
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// The object vanished (deleted, or never created): create it again.
    #[error("the node state is gone (it is created again)")]
    Gone,
    /// Its Node is not known to exist: no node state is created for it.
    #[error("the Node is not known (or gone): its node state is not created")]
    NoNode,
    #[error("{0}")]
    Other(String),
}

/// Create the object unless it exists.
async fn ensure_exists(
    api: &Api<IPSetNodeState>,
    node: &str,
    uid: Option<&str>,
) -> Result<(), WriteError> {
    match api.get_opt(node).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(e) => return Err(WriteError::Other(ipsetmgr_cluster::api_error::describe(&e))),
    }
    // Never for a Node that is gone: the controller (or the garbage
    // collector) would delete it again, and the two would fight.
    let Some(uid) = uid else {
        return Err(WriteError::NoNode);
    };
    match api
        .create(&PostParams::default(), &new_object(node, Some(uid)))
        .await
    {
        Ok(_) => Ok(()),
        // Someone (an earlier run of this agent) was quicker: fine.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(WriteError::Other(ipsetmgr_cluster::api_error::describe(&e))),
    }
}

async fn write(
    api: &Api<IPSetNodeState>,
    settings: &WriterSettings,
    pending: &Pending,
    created: &mut bool,
) -> Result<(), WriteError> {
    if !*created {
        ensure_exists(api, &settings.node, pending.node_uid.as_deref()).await?;
        *created = true;
    }
    let mut status = pending.status.clone();
    status.heartbeat_time = rfc3339(SystemTime::now());
    let body = apply_body(&settings.node, &status);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    match api
        .patch_status(&settings.node, &pp, &Patch::Apply(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(WriteError::Gone),
        Err(e) => Err(WriteError::Other(ipsetmgr_cluster::api_error::describe(&e))),
    }
}

/// Write every new status (at most one per `min_interval`) and repeat the
/// latest one every `heartbeat`, until the sender is dropped.
pub async fn run_writer(
    client: Client,
    settings: WriterSettings,
    mut latest: watch::Receiver<Option<Pending>>,
    shared: Arc<Shared>,
) {
    let api: Api<IPSetNodeState> = Api::all(client);
    let mut created = false;
    let mut last_write: Option<Instant> = None;
    let far = || Instant::now() + Duration::from_secs(86400 * 365);
    let mut next_at = far();
    loop {
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { break },
            _ = sleep_until(next_at) => {}
        }
        let Some(pending) = latest.borrow_and_update().clone() else {
            continue;
        };
        // Let a burst settle (a change of twenty slices is twenty reports,
        // and `kubectl apply` sends them one by one over seconds): while
        // they arrive the state written last still says the old revision,
        // so the policy stays Ready=False until every node holds the
        // whole change, instead of turning True and False again at each
        // slice. A stream of changes that never settles is still written,
        // by `cap`. The kernel is never waited for: each slice is applied
        // as it arrives.
        let start = Instant::now();
        let allowed = last_write.map_or(start, |t| (t + settings.min_interval).max(start));
        let cap = allowed.max(start + settings.burst);
        let mut quiet_until = start + settings.settle;
        loop {
            let until = quiet_until.max(allowed).min(cap);
            tokio::select! {
                changed = latest.changed() => {
                    if changed.is_err() { break }
                    quiet_until = Instant::now() + settings.settle;
                }
                _ = sleep_until(until) => break,
            }
        }
        // Whatever arrived while waiting is included.
        let pending = latest.borrow_and_update().clone().unwrap_or(pending);
        let result = tokio::time::timeout(
            settings.request_timeout,
            write(&api, &settings, &pending, &mut created),
        )
        .await
        .unwrap_or_else(|_| Err(WriteError::Other("timed out".into())));
        match result {
            Ok(()) => {
                shared
                    .metrics
                    .status_writes
                    .get_or_create(&ResultLabel::of(true))
                    .inc();
                last_write = Some(Instant::now());
                next_at = Instant::now() + settings.heartbeat;
            }
            Err(e) => {
                match e {
                    WriteError::Gone => created = false,
                    WriteError::NoNode => {
                        tracing::debug!(node = %settings.node, "{e}");
                        next_at = Instant::now() + settings.retry;
                        continue;
                    }
                    WriteError::Other(_) => {}
                }
                shared
                    .metrics
                    .status_writes
                    .get_or_create(&ResultLabel::of(false))
                    .inc();
                tracing::warn!(node = %settings.node, error = %e, "node state write failed; retrying");
                next_at = Instant::now() + settings.retry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_sets::{ApplyOutcome, BackendId, ErrorKind, KernelError, SetReport};

    #[test]
    fn the_sync_time_has_milliseconds_the_heartbeat_seconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_323_045_250);
        assert_eq!(
            rfc3339_millis(t).as_deref(),
            Some("2026-01-02T03:04:05.250Z")
        );
        assert_eq!(rfc3339(t).as_deref(), Some("2026-01-02T03:04:05Z"));
    }

    fn report(seq: u64, sets: Vec<SetReport>) -> Report {
        Report {
            seq,
            outcome: ApplyOutcome::default(),
            sets,
            deletions: Vec::new(),
            unwanted: Vec::new(),
            full_resync: false,
        }
    }

    #[test]
    fn a_set_that_could_not_be_deleted_is_in_the_message() {
        let mut snapshot = Snapshot {
            seq: 1,
            ..Snapshot::default()
        };
        snapshot.policies.insert("a".into(), PolicyFacts::default());
        let mut r = report(1, vec![set("ipm4-a", "a", true)]);
        assert_eq!(
            status_of(&snapshot, &r, Duration::from_secs(60)).message,
            ""
        );
        // A set of another backend (one no longer selected) is named with it.
        r.deletions.push(ipsetmgr_sets::DeletionReport {
            set: SetRef {
                backend: NETLINK,
                name: "ipm4-old".into(),
            },
            error: KernelError::new(
                ErrorKind::InUse,
                ipsetmgr_dataplane::DataplaneError::InUse("ipm4-old".into()),
            ),
        });
        let m = status_of(&snapshot, &r, Duration::from_secs(60)).message;
        assert!(
            m.starts_with("set netlink:ipm4-old should be gone but is not: "),
            "{m}"
        );
    }

    /// The backend the test's sets are in, and one no longer selected.
    const MODEL: BackendId = BackendId {
        name: "model",
        kind: "ipset",
    };
    const NETLINK: BackendId = BackendId {
        name: "netlink",
        kind: "ipset",
    };

    fn set(name: &str, policy: &str, synced: bool) -> SetReport {
        SetReport {
            set: SetRef {
                backend: MODEL,
                name: name.into(),
            },
            policy: policy.into(),
            synced,
            members: 3,
            problems: 0,
            drift: Default::default(),
            error: None,
            last_sync: None,
        }
    }

    #[test]
    fn errors_and_the_message_fit_the_schema_and_name_the_first_unsynced_policy() {
        let long = "x".repeat(5000);
        let mut policies = BTreeMap::new();
        for (name, error) in [
            ("a", None),
            ("b", Some(long.clone())),
            ("c", Some("bad".into())),
        ] {
            policies.insert(
                name.to_string(),
                PolicyFacts {
                    generation: 1,
                    revision: String::new(),
                    error,
                    excepted: 0,
                },
            );
        }
        let snapshot = Snapshot { seq: 7, policies };
        let r = report(7, vec![set("ipm4-a", "a", true)]);
        let s = status_of(&snapshot, &r, Duration::from_secs(60));
        assert_eq!(s.synced_text, "1/3");
        let b = s.policies.iter().find(|p| p.name == "b").unwrap();
        assert!(
            b.error.chars().count() <= MAX_ERROR_LEN,
            "{}",
            b.error.len()
        );
        assert!(b.error.contains("bytes cut"));
        assert!(s.message.starts_with("b: xxx"), "{}", s.message);
        assert!(s.message.chars().count() <= MAX_ERROR_LEN);
        assert!(
            s.message.ends_with("bytes cut)"),
            "{}",
            &s.message[s.message.len() - 40..]
        );

        let all = report(7, vec![set("ipm4-a", "a", true)]);
        let snapshot = Snapshot {
            seq: 7,
            policies: BTreeMap::from([(
                "a".to_string(),
                PolicyFacts {
                    generation: 1,
                    revision: String::new(),
                    error: None,
                    excepted: 0,
                },
            )]),
        };
        assert_eq!(
            status_of(&snapshot, &all, Duration::from_secs(60)).message,
            ""
        );
    }
}

#[cfg(test)]
mod pacing_tests {
    //! The writer against a mock API server, on tokio's paused clock.
    use super::*;
    use ipsetmgr_cluster::mock_api::mock_client;
    use std::sync::Mutex;

    /// A writer at the default pacing (5 s) against a mock API server that
    /// records each status patch.
    fn recorded_writer() -> (
        watch::Sender<Option<Pending>>,
        Arc<Mutex<Vec<serde_json::Value>>>,
    ) {
        let patches = Arc::new(Mutex::new(Vec::<serde_json::Value>::new()));
        let seen = patches.clone();
        let client = mock_client(move |r| match r.method.as_str() {
            "GET" => (
                200,
                json!({"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetNodeState",
                       "metadata": {"name": "n"}, "spec": {}}),
            ),
            _ => {
                let mut body = r.body.clone();
                seen.lock().unwrap().push(body.clone());
                body["spec"] = json!({});
                (200, body)
            }
        });
        let (tx, rx) = watch::channel(None);
        let pacing = Pacing {
            interval: Duration::from_secs(5),
        };
        tokio::spawn(run_writer(
            client,
            pacing.writer("n", Duration::from_secs(3600)),
            rx,
            Shared::new(Duration::from_secs(60)),
        ));
        (tx, patches)
    }

    fn report(tx: &watch::Sender<Option<Pending>>, i: usize) {
        let status = IPSetNodeStateStatus {
            message: format!("report {i}"),
            ..Default::default()
        };
        tx.send_replace(Some(Pending {
            status,
            node_uid: Some("uid".into()),
        }));
    }

    /// `count` reports `gap` apart, then quiet: how many writes, and the
    /// last one's message.
    async fn writes_for(count: usize, gap: Duration) -> (usize, String) {
        let (tx, patches) = recorded_writer();
        for i in 0..count {
            report(&tx, i);
            tokio::time::sleep(gap).await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        let writes = patches.lock().unwrap().clone();
        let last = writes.last().map_or(String::new(), |w| {
            w["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        (writes.len(), last)
    }

    /// Twenty statuses 100 ms apart (a change arriving as twenty slice
    /// updates, each compiled and applied on its own): one write, the last
    /// state, not twenty.
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_reports_costs_at_most_two_writes() {
        let (writes, last) = writes_for(20, Duration::from_millis(100)).await;
        assert!((1..=2).contains(&writes), "{writes} writes");
        assert_eq!(last, "report 19", "the latest state wins");
    }

    /// A change that trickles in: twenty reports 1.5 s apart, over 30 s (a
    /// client-side `kubectl apply` of many slices). At most two writes, the
    /// last state last; it wrote one per 5 s interval before (seven).
    #[tokio::test(start_paused = true)]
    async fn a_change_that_trickles_in_over_30_seconds_costs_at_most_two_writes() {
        let (writes, last) = writes_for(20, Duration::from_millis(1500)).await;
        assert!((1..=2).contains(&writes), "{writes} writes");
        assert_eq!(last, "report 19");
    }

    /// A lone change is written once it has been quiet for the interval.
    #[tokio::test(start_paused = true)]
    async fn a_lone_change_is_written_after_the_interval() {
        let (tx, patches) = recorded_writer();
        report(&tx, 0);
        tokio::time::sleep(Duration::from_millis(4900)).await;
        assert_eq!(patches.lock().unwrap().len(), 0);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(patches.lock().unwrap().len(), 1);
    }
}
