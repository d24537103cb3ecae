//! The agent's event loop: keeps a store of policies (status stripped) and
//! this node's labels, recompiles the whole desired state on changes
//! (debounced), hands it to the manager thread, and turns the manager's
//! reports into status patches, Warning events and metrics.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, predicates};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::kind_guard::{self, KindGuard};
use super::metrics::Shared;
use super::status::{self, Decision, Snapshot, StatusTracker};
use super::worker::{Command, Report};
use crate::ipset::Naming;
use crate::kernel::KernelSide;
use crate::policy::compile::{MemberCache, compile_cached};
use crate::policy::{IPSetPolicy, NodeStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// One change from the API server.
// Inputs are moved once from the watch into the store; boxing the larger
// Node variant would only add an allocation per event.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    Policy(Event<IPSetPolicy>),
    Node(Event<Node>),
    /// The IPSetPolicy CRD itself (see [`KindGuard`]).
    Crd(Event<CustomResourceDefinition>),
    /// A watch failed; it is retried with backoff. Nothing else changes.
    WatchError(String),
    /// A list or watch of IPSetPolicies answered 404: the kind is gone.
    KindNotFound(String),
}

/// This node's status entry per policy, as last seen on the server (filled
/// while stripping status from watched policies).
pub type Observed = Arc<Mutex<HashMap<String, Option<NodeStatus>>>>;

/// Drop what the agent does not need to keep (managedFields, status),
/// remembering this node's own status entry.
pub fn strip_policy(p: &mut IPSetPolicy, node: &str, observed: &Observed) {
    let mine = p
        .status
        .as_ref()
        .and_then(|s| s.nodes.iter().find(|n| n.node_name == node).cloned());
    observed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p.name_any(), mine);
    p.status = None;
    p.metadata.managed_fields = None;
}

/// The production input: a watcher on IPSetPolicies and one on this node.
pub fn watch_inputs(
    client: Client,
    node: &str,
    observed: Observed,
) -> impl Stream<Item = Input> + Send + Unpin + 'static {
    let me = node.to_string();
    let policies = watcher::watcher(
        Api::<IPSetPolicy>::all(client.clone()),
        watcher::Config::default(),
    )
    .modify(move |p| strip_policy(p, &me, &observed))
    .default_backoff()
    .map(|r| match r {
        Ok(ev) => Input::Policy(ev),
        Err(e) if kind_guard::is_kind_not_found(&e) => {
            Input::KindNotFound(format!("policy watch: {e}"))
        }
        Err(e) => Input::WatchError(format!("policy watch: {e}")),
    });
    let crds = watcher::watcher(
        Api::<CustomResourceDefinition>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", kind_guard::crd_name())),
    )
    .modify(|c| {
        // Only its existence and deletion timestamp matter.
        c.metadata.managed_fields = None;
        c.spec.versions.clear();
        c.status = None;
    })
    .default_backoff()
    .map(|r| match r {
        Ok(ev) => Input::Crd(ev),
        Err(e) => Input::WatchError(format!("CRD watch: {e}")),
    });
    let nodes = watcher::watcher(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    )
    .modify(|n| {
        n.metadata.managed_fields = None;
        n.status = None;
        n.spec = None;
    })
    .default_backoff()
    .map(|r| match r {
        Ok(ev) => Input::Node(ev),
        Err(e) => Input::WatchError(format!("node watch: {e}")),
    });
    futures::stream::select_all([policies.boxed(), nodes.boxed(), crds.boxed()])
}

/// Timing and identity of one agent.
#[derive(Clone, Debug)]
pub struct Settings {
    pub node_name: String,
    pub naming: Naming,
    /// Quiet time before recompiling after a change.
    pub debounce: Duration,
    /// At most one status write per policy per this interval.
    pub min_write_interval: Duration,
    /// Deadline of each API request the loop makes.
    pub request_timeout: Duration,
    /// Wait before retrying a failed status write.
    pub write_retry: Duration,
    /// Extra quiet time before applying a change that deleted policies: a
    /// CRD being deleted first deletes every policy, and its own watch event
    /// may arrive a moment after theirs (see [`KindGuard`]).
    pub deletion_grace: Duration,
}

impl Settings {
    pub fn new(node_name: &str, naming: Naming) -> Settings {
        Settings {
            node_name: node_name.to_string(),
            naming,
            debounce: Duration::from_millis(100),
            min_write_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(10),
            write_retry: Duration::from_secs(5),
            deletion_grace: Duration::from_secs(2),
        }
    }
}

pub struct Agent {
    settings: Settings,
    client: Client,
    api: Api<IPSetPolicy>,
    shared: Arc<Shared>,
    observed: Observed,

    store: BTreeMap<String, IPSetPolicy>,
    /// Policies received since the last watcher Init, swapped in at InitDone.
    init_buf: Option<BTreeMap<String, IPSetPolicy>>,
    policies_listed: bool,
    labels: Option<BTreeMap<String, String>>,
    node_init: Option<Option<BTreeMap<String, String>>>,
    kind: KindGuard,

    recompile_at: Option<Instant>,
    /// Parsed members per policy generation (see `MemberCache`).
    member_cache: MemberCache,
    seq: u64,
    snapshot: Option<Snapshot>,
    last_report: Option<Report>,
    tracker: StatusTracker,
    flush_at: Option<Instant>,
    /// Last Warning message published per policy (not repeated).
    warned: HashMap<String, String>,

    /// The manager's driver loop on its own thread.
    kernel: Option<KernelSide>,
    reports: mpsc::UnboundedReceiver<Report>,
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

impl Agent {
    /// The loop starts with [`Agent::run`]; `kernel` is the started kernel
    /// side, whose reports arrive on `reports`.
    pub fn new(
        client: Client,
        settings: Settings,
        kernel: KernelSide,
        reports: mpsc::UnboundedReceiver<Report>,
        shared: Arc<Shared>,
        observed: Observed,
    ) -> Agent {
        Agent {
            api: Api::all(client.clone()),
            client,
            tracker: StatusTracker::new(settings.min_write_interval),
            settings,
            shared,
            observed,
            store: BTreeMap::new(),
            init_buf: None,
            policies_listed: false,
            labels: None,
            node_init: None,
            kind: KindGuard::default(),
            recompile_at: None,
            member_cache: MemberCache::default(),
            seq: 0,
            snapshot: None,
            last_report: None,
            flush_at: None,
            warned: HashMap::new(),
            kernel: Some(kernel),
            reports,
        }
    }

    /// Run until `shutdown` completes or the input ends; then stop the
    /// manager thread after its current apply. The kernel is left as it is.
    pub async fn run(
        mut self,
        inputs: impl Stream<Item = Input> + Unpin,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut inputs = inputs;
        let mut inputs_open = true;
        tokio::pin!(shutdown);
        loop {
            let recompile = sleep_until(self.recompile_at.unwrap_or_else(far_future));
            let flush = sleep_until(self.flush_at.unwrap_or_else(far_future));
            tokio::select! {
                _ = &mut shutdown => break,
                input = inputs.next(), if inputs_open => match input {
                    Some(input) => self.on_input(input),
                    None => inputs_open = false,
                },
                Some(report) = self.reports.recv() => self.on_report(report).await,
                _ = recompile, if self.recompile_at.is_some() => {
                    self.recompile_at = None;
                    self.recompile();
                }
                _ = flush, if self.flush_at.is_some() => {
                    self.flush_at = None;
                    self.write_statuses().await;
                }
            }
        }
        tracing::info!("shutting down: stopping the manager after its current apply");
        if let Some(kernel) = self.kernel.take() {
            // Joining the thread blocks: off the async workers.
            let _ = tokio::task::spawn_blocking(move || kernel.shutdown()).await;
        }
    }

    fn changed(&mut self) {
        self.changed_after(self.settings.debounce);
    }

    /// Recompile after `quiet`, or earlier if already due; a longer wait
    /// asked for later pushes the time out.
    fn changed_after(&mut self, quiet: Duration) {
        let at = Instant::now() + quiet;
        self.recompile_at = Some(self.recompile_at.map_or(at, |t| t.max(at)));
    }

    fn on_input(&mut self, input: Input) {
        match input {
            Input::WatchError(e) => {
                // Fail static: the store and the kernel stay as they are.
                let e = crate::logging::bounded(&e, 1024);
                tracing::warn!(error = %e, "watch failed; retrying, kernel left as it is");
            }
            Input::KindNotFound(e) => {
                let e = crate::logging::bounded(&e, 1024);
                tracing::warn!(error = %e, "the IPSetPolicy kind is not found");
                self.kind.kind_not_found();
            }
            Input::Crd(ev) => {
                if self.kind.on_event(ev) && self.kind.may_apply() {
                    self.changed();
                }
            }
            Input::Policy(ev) => self.on_policy(ev),
            Input::Node(ev) => self.on_node(ev),
        }
    }

    fn on_policy(&mut self, ev: Event<IPSetPolicy>) {
        match ev {
            Event::Init => self.init_buf = Some(BTreeMap::new()),
            Event::InitApply(p) => {
                self.init_buf
                    .get_or_insert_with(BTreeMap::new)
                    .insert(p.name_any(), p);
            }
            Event::InitDone => {
                let listed = self.init_buf.take().unwrap_or_default();
                let lost_some = self.store.keys().any(|k| !listed.contains_key(k));
                self.store = listed;
                let names: Vec<String> = self.store.keys().cloned().collect();
                self.observed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|k, _| names.contains(k));
                if !self.policies_listed {
                    tracing::info!(policies = self.store.len(), "initial list of policies done");
                }
                self.policies_listed = true;
                self.shared.set_policies_listed();
                if lost_some {
                    self.changed_after(self.settings.deletion_grace);
                } else {
                    self.changed();
                }
            }
            Event::Apply(p) => {
                let name = p.name_any();
                // Only spec changes (generation) wake the reconciler; status
                // writes of other nodes do not.
                let same = self
                    .store
                    .get(&name)
                    .is_some_and(|old| predicates::generation(old) == predicates::generation(&p));
                if same {
                    return;
                }
                self.store.insert(name, p);
                self.changed();
            }
            Event::Delete(p) => {
                let name = p.name_any();
                if self.store.remove(&name).is_some() {
                    self.changed_after(self.settings.deletion_grace);
                }
                self.observed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&name);
                self.tracker.forget(&name);
                self.warned.remove(&name);
            }
        }
    }

    fn on_node(&mut self, ev: Event<Node>) {
        let labels = |n: &Node| n.metadata.labels.clone().unwrap_or_default();
        let new = match ev {
            Event::Init => {
                self.node_init = Some(None);
                return;
            }
            Event::InitApply(n) => {
                self.node_init = Some(Some(labels(&n)));
                return;
            }
            Event::InitDone => match self.node_init.take().flatten() {
                Some(l) => l,
                // Not found (yet): keep what we had; without a node nothing is applied.
                None => return,
            },
            Event::Apply(n) => labels(&n),
            // The node object is gone: keep the last labels (fail static).
            Event::Delete(_) => return,
        };
        if self.labels.as_ref() != Some(&new) {
            tracing::info!(labels = ?new, "node labels");
            self.labels = Some(new);
            self.changed();
        }
    }

    /// Compile the complete desired state and hand it to the manager. Never
    /// before the initial list of policies completed and the node was seen:
    /// a partial state would delete sets.
    fn recompile(&mut self) {
        let Some(labels) = &self.labels else {
            tracing::debug!("node not seen yet; not applying");
            return;
        };
        if !self.policies_listed {
            tracing::debug!("initial list of policies not done; not applying");
            return;
        }
        if !self.kind.may_apply() {
            tracing::warn!(kind = ?self.kind.state(), "IPSetPolicy kind not in place; kernel left as it is");
            return;
        }
        let compiled = compile_cached(
            self.store.values(),
            &self.settings.naming,
            Some(labels),
            &mut self.member_cache,
        );
        for e in &compiled.errors {
            tracing::warn!("{e}");
        }
        self.seq += 1;
        self.snapshot = Some(Snapshot::new(self.seq, self.store.values(), &compiled));
        // Parsed members now live in the cache (shared with the manager);
        // the strings would only double the footprint of big policies.
        for p in self.store.values_mut() {
            if !p.spec.members.is_empty() && self.member_cache.is_cached(p) {
                p.spec.members = Vec::new();
            }
        }
        let Some(kernel) = &self.kernel else { return };
        kernel.send(Command::Desired {
            seq: self.seq,
            sets: compiled.sets,
            held: compiled.held,
        });
    }

    async fn on_report(&mut self, report: Report) {
        let m = &self.shared.metrics;
        m.sets.set(report.sets.len() as i64);
        m.members
            .set(report.sets.iter().map(|s| s.members as i64).sum::<i64>());
        m.apply_duration
            .observe(report.outcome.duration.as_secs_f64());
        if report.full_resync {
            m.problems
                .inc_by(report.sets.iter().map(|s| s.problems as u64).sum::<u64>());
        }
        let failed_attempts = report.outcome.attempts - u32::from(report.outcome.applied);
        let set_errors = report.sets.iter().filter(|s| s.error.is_some()).count();
        m.dataplane_errors
            .inc_by(u64::from(failed_attempts) + set_errors as u64);
        if let Some(e) = &report.outcome.error {
            tracing::warn!(error = %e, "apply did not complete");
        }
        for d in &report.deletions {
            tracing::warn!(set = %d.name, error = %d.error, "set not deleted");
        }
        self.shared.set_first_sync();
        self.last_report = Some(report);
        self.publish_events().await;
        self.write_statuses().await;
    }

    /// The report describing the current snapshot, if it has arrived.
    fn current(&self) -> Option<(&Snapshot, &Report)> {
        let snap = self.snapshot.as_ref()?;
        let report = self.last_report.as_ref()?;
        (report.seq == snap.seq).then_some((snap, report))
    }

    async fn publish_events(&mut self) {
        let Some((snap, report)) = self.current() else {
            return;
        };
        let mut todo = Vec::new();
        let mut cleared = Vec::new();
        for policy in &snap.selected {
            match status::policy_error(policy, snap, report) {
                Some(msg) => {
                    if self.warned.get(policy) != Some(&msg) {
                        let reason = if snap.errors.contains_key(policy) {
                            "InvalidPolicy"
                        } else {
                            "SyncFailed"
                        };
                        todo.push((policy.clone(), reason, msg));
                    }
                }
                None => cleared.push(policy.clone()),
            }
        }
        for policy in cleared {
            self.warned.remove(&policy);
        }
        for (policy, reason, msg) in todo {
            let Some(obj) = self.store.get(&policy) else {
                continue;
            };
            let reference = obj.object_ref(&());
            // A fresh recorder per message: the recorder's own cache would
            // turn a new message with the same reason into a series patch of
            // the old one. Repeats are suppressed by `warned` instead.
            let recorder = Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "ipsetmgr-agent".into(),
                    instance: Some(self.settings.node_name.clone()),
                },
            );
            let mut note = format!("node {}: {msg}", self.settings.node_name);
            if note.len() > 1000 {
                let mut cut = 997;
                while !note.is_char_boundary(cut) {
                    cut -= 1;
                }
                note.truncate(cut);
                note.push_str("...");
            }
            let ev = KubeEvent {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(note),
                action: "Sync".into(),
                secondary: None,
            };
            let sent = tokio::time::timeout(
                self.settings.request_timeout,
                recorder.publish(&ev, &reference),
            )
            .await;
            match sent {
                Ok(Ok(())) => {
                    self.warned.insert(policy, msg);
                }
                Ok(Err(e)) => tracing::warn!(%policy, error = %e, "could not publish event"),
                Err(_) => tracing::warn!(%policy, "publishing event timed out"),
            }
        }
    }

    /// Write every entry whose content changed (rate-limited).
    async fn write_statuses(&mut self) {
        let Some((snap, report)) = self.current() else {
            return;
        };
        let now = Instant::now();
        let mut writes = Vec::new();
        let mut next: Option<Instant> = None;
        {
            let observed = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            for policy in snap.generations.keys() {
                let Some(entry) =
                    status::node_entry(&self.settings.node_name, policy, snap, report)
                else {
                    continue;
                };
                match self
                    .tracker
                    .decide(policy, &entry, observed.get(policy), now.into_std())
                {
                    Decision::Skip => {}
                    Decision::Write => writes.push((policy.clone(), entry)),
                    Decision::DeferUntil(t) => {
                        let t = Instant::from_std(t);
                        next = Some(next.map_or(t, |n| n.min(t)));
                    }
                }
            }
        }
        let pp = PatchParams::apply(&status::field_manager(&self.settings.node_name)).force();
        for (policy, entry) in writes {
            let body = status::apply_body(&policy, entry.as_ref());
            let res = tokio::time::timeout(
                self.settings.request_timeout,
                self.api.patch_status(&policy, &pp, &Patch::Apply(&body)),
            )
            .await;
            match res {
                Ok(Ok(_)) => {
                    self.shared.metrics.status_writes.inc();
                    self.tracker
                        .record(&policy, &entry, Instant::now().into_std());
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                    // Deleted meanwhile; the watch will tell.
                }
                other => {
                    let why = match other {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".into(),
                    };
                    tracing::warn!(%policy, error = %why, "status write failed; retrying later");
                    let t = Instant::now() + self.settings.write_retry;
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
        }
        if let Some(t) = next {
            self.flush_at = Some(self.flush_at.map_or(t, |f| f.min(t)));
        }
    }
}
