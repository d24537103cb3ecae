//! The controller's event loop: keeps the store, and on changes (debounced)
//! and on a regular tick (heartbeats age without any event) re-evaluates
//! every policy: validates it once for the whole cluster, computes the
//! status it should have, and hands the writer only the statuses that
//! differ from what the server shows, one Warning event per invalid
//! policy, and the node states of Nodes that are gone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use kube::Resource;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};

use super::evaluate::{NodeView, Validity, status_for};
use super::feeds::{FeedJobs, FeedResults};
use super::inputs::{Input, Needs};
use super::metrics::ControllerShared;
use super::slice_writer::{SliceEvents, SliceJobs};
use super::sources::{Memory, Outcome, evaluate_sources, sources_message};
use super::store::Store;
use super::writer::{Job, Plan};
use ipsetmgr_api::IPSetPolicy;
use ipsetmgr_cluster::policy_store::PolicyStore;
use ipsetmgr_cluster::tolerant::Tolerant;
use ipsetmgr_ipset::Naming;
use ipsetmgr_policy::compile::{MemberCache, PolicyError, PolicyErrorKind, compile_inputs};

/// The kinds watched only for member sources.
const SOURCE_KINDS: [&str; 3] = ["pods", "services", "namespaces"];

#[derive(Clone, Debug)]
pub struct Settings {
    pub naming: Naming,
    /// Quiet time before re-evaluating after a change.
    pub debounce: Duration,
    /// Re-evaluate at least this often (stale heartbeats).
    pub tick: Duration,
    /// Quiet time after a Pod, Service or Namespace change: their churn is
    /// coalesced into at most one materialisation per this interval.
    pub sources_debounce: Duration,
    /// This cluster's caps on policies.
    pub limits: ipsetmgr_cluster::slices::ClusterLimits,
}

/// Where the materialised sources go: the slice writer's plans, the
/// kinds to watch, the url sources to fetch.
pub struct SourceChannels {
    pub slices: watch::Sender<Arc<SliceJobs>>,
    pub needs: watch::Sender<Needs>,
    pub feeds: watch::Sender<Arc<FeedJobs>>,
}

impl Settings {
    pub fn new(naming: Naming) -> Settings {
        Settings {
            naming,
            debounce: Duration::from_millis(200),
            tick: Duration::from_secs(10),
            sources_debounce: Duration::from_secs(1),
            limits: Default::default(),
        }
    }
}

pub struct Controller {
    settings: Settings,
    store: Store,
    cache: MemberCache,
    shared: Arc<ControllerShared>,
    plans: watch::Sender<Arc<Plan>>,
    jobs: mpsc::Sender<Job>,
    leader: watch::Receiver<bool>,
    /// The invalid version of each policy already warned about.
    warned: HashMap<String, (Option<String>, i64, String)>,
    /// Node states asked to be deleted.
    deleting: HashSet<String>,
    evaluate_at: Option<Instant>,
    channels: SourceChannels,
    /// The last outcome of each url source's fetch.
    fetched: FeedResults,
    memory: Memory,
    sources: Outcome,
    /// Whether anything the sources read changed since they were evaluated.
    sources_dirty: bool,
    /// The watch events of slices seen, for the slice writer.
    slice_events: SliceEvents,
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

impl Controller {
    pub fn new(
        settings: Settings,
        plans: watch::Sender<Arc<Plan>>,
        jobs: mpsc::Sender<Job>,
        leader: watch::Receiver<bool>,
        shared: Arc<ControllerShared>,
        channels: SourceChannels,
    ) -> Controller {
        let limits = settings.limits;
        Controller {
            settings,
            store: Store {
                policy_store: PolicyStore::new(limits),
                ..Store::default()
            },
            cache: MemberCache::default(),
            shared,
            plans,
            jobs,
            leader,
            warned: HashMap::new(),
            deleting: HashSet::new(),
            evaluate_at: None,
            channels,
            fetched: FeedResults::new(),
            memory: Memory::new(),
            sources: Outcome::default(),
            sources_dirty: true,
            slice_events: SliceEvents::default(),
        }
    }

    pub async fn run(
        mut self,
        inputs: impl Stream<Item = Input> + Unpin,
        shutdown: impl Future<Output = ()>,
    ) {
        // Fused: once the inputs end, their branch stays off.
        let mut inputs = inputs.fuse();
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(self.settings.tick);
        loop {
            self.shared.heartbeat();
            let evaluate = sleep_until(self.evaluate_at.unwrap_or_else(far_future));
            tokio::select! {
                _ = &mut shutdown => break,
                Some(input) = inputs.next() => self.on_input(input),
                changed = self.leader.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let leading = *self.leader.borrow_and_update();
                    tracing::info!(leading, "leadership changed");
                    self.shared.metrics.leader.set(i64::from(leading));
                    // A new leader redoes what the last one may not have done.
                    self.warned.clear();
                    self.deleting.clear();
                    self.evaluate();
                }
                _ = tick.tick() => {
                    // Slice writes that failed are retried with the plan.
                    self.sources_dirty = true;
                    self.evaluate();
                    if !self.channels.slices.borrow().is_empty() {
                        self.channels.slices.send_modify(|_| {});
                    }
                }
                _ = evaluate, if self.evaluate_at.is_some() => {
                    self.evaluate_at = None;
                    self.evaluate();
                }
            }
        }
        tracing::info!("controller stopped");
    }

    fn on_input(&mut self, input: Input) {
        let change = match input {
            Input::WatchError { resource, error } => {
                let e = ipsetmgr_policy::text::bounded(&error, 1024);
                tracing::warn!(%resource, error = %e, "watch failed; retrying");
                self.shared
                    .metrics
                    .api
                    .watch_failed(&self.shared.watches, resource, &e);
                // A source kind that cannot be listed (RBAC: the chart grants
                // Pods and Services only with memberSources.*) says so in
                // the status of the sources that need it.
                if SOURCE_KINDS.contains(&resource) {
                    let first = self
                        .store
                        .watch_errors
                        .insert(resource, e.into_owned())
                        .is_none();
                    self.source_changed(first);
                }
                return;
            }
            Input::Policy(ev) => {
                self.shared.watches.delivered("ipsetpolicies");
                self.store.on_policy(ev)
            }
            Input::Slice(ev) => {
                self.shared.watches.delivered("ipsetmemberslices");
                self.slice_events.on(&ev);
                self.store.policy_store.on_slice(ev)
            }
            Input::NodeState(ev) => {
                self.shared.watches.delivered("ipsetnodestates");
                self.store.on_node_state(ev)
            }
            Input::Node(ev) => {
                self.shared.watches.delivered("nodes");
                self.store.on_node(ev)
            }
            Input::Pod(ev) => {
                self.shared.watches.delivered("pods");
                self.store.watch_errors.remove("pods");
                let c = self.store.on_pod(ev);
                self.source_changed(c.changed);
                return;
            }
            Input::Service(ev) => {
                self.shared.watches.delivered("services");
                self.store.watch_errors.remove("services");
                let c = self.store.on_service(ev);
                self.source_changed(c.changed);
                return;
            }
            Input::Namespace(ev) => {
                self.shared.watches.delivered("namespaces");
                self.store.watch_errors.remove("namespaces");
                let c = self.store.on_namespace(ev);
                self.source_changed(c.changed);
                return;
            }
            Input::Unwatched(resource) => {
                self.store.watch_errors.remove(resource);
                let c = self.store.unwatched(resource);
                self.source_changed(c.changed);
                return;
            }
            Input::Feed(key, result) => {
                self.fetched.insert(key, result);
                self.source_changed(true);
                return;
            }
        };
        if change.changed {
            self.sources_dirty = true;
        }
        if change.changed && self.evaluate_at.is_none() {
            self.evaluate_at = Some(Instant::now() + self.settings.debounce);
        }
    }

    /// A change only the sources read: coalesced over a longer interval.
    fn source_changed(&mut self, changed: bool) {
        if !changed {
            return;
        }
        self.sources_dirty = true;
        if self.evaluate_at.is_none() {
            self.evaluate_at = Some(Instant::now() + self.settings.sources_debounce);
        }
    }

    /// Evaluate the sources if anything they read changed; hand the writer
    /// the slices, the inputs the kinds to watch, the fetcher its jobs.
    fn evaluate_sources(&mut self, now: Timestamp) {
        if !self.sources_dirty {
            return;
        }
        self.sources_dirty = false;
        let mut out = evaluate_sources(&self.store, &self.fetched, &mut self.memory, now);
        self.fetched.retain(|k, _| out.feeds.contains_key(k));
        // The plan (every slice's body) and the feed jobs go to the writers;
        // only the statuses and refusals are kept here.
        let plan = std::mem::take(&mut out.plan);
        let slices = self.store.policy_store.slices.items();
        self.slice_events
            .retain(|n| slices.contains_key(n) || plan.contains_key(n));
        let jobs = SliceJobs::new(plan, &self.slice_events);
        self.channels.slices.send_if_modified(|current| {
            if **current == jobs {
                return false;
            }
            *current = Arc::new(jobs);
            true
        });
        self.channels.needs.send_if_modified(|n| {
            let changed = *n != out.needs;
            *n = out.needs;
            changed
        });
        let feeds = std::mem::take(&mut out.feeds);
        self.channels.feeds.send_if_modified(|current| {
            if **current == feeds {
                return false;
            }
            *current = Arc::new(feeds);
            true
        });
        self.sources = out;
    }

    /// Validate every policy and plan the writes that bring the server's
    /// statuses in line: validity first, then each policy's status, the
    /// Warning events of invalid policies, and the node states to collect.
    fn evaluate(&mut self) {
        if !self.store.listed() {
            return;
        }
        self.shared.set_listed(true);
        let now = Timestamp::now();
        self.evaluate_sources(now);
        let validity = self.validate();
        let plan = self.statuses(&validity, now);
        let mut jobs = self.warnings(&validity);
        jobs.extend(self.collect_node_states());
        self.count_policies(&validity);
        self.plans.send_if_modified(|current| {
            if **current == plan {
                return false;
            }
            *current = Arc::new(plan);
            true
        });
        for job in jobs {
            if self.jobs.try_send(job).is_err() {
                tracing::warn!("the writer is behind; a write was dropped and is redone later");
            }
        }
    }

    /// Each node as a status sees it: its labels, its state, how long ago
    /// the controller saw it change.
    fn node_views(&self) -> BTreeMap<&str, NodeView<'_>> {
        let clock = Instant::now();
        self.store
            .nodes
            .items()
            .iter()
            .map(|(name, labels)| {
                let state = self
                    .store
                    .node_states
                    .get(name)
                    .and_then(|t| t.value.as_ref().ok())
                    .and_then(|s| s.status.as_ref());
                let seen_ago = self.store.seen.get(name).map(|t| clock.duration_since(*t));
                (
                    name.as_str(),
                    NodeView {
                        labels: &labels.labels,
                        state,
                        seen_ago,
                    },
                )
            })
            .collect()
    }

    /// The status each policy should have, for those whose status on the
    /// server differs.
    fn statuses(&self, validity: &HashMap<String, Validity>, now: Timestamp) -> Plan {
        let revisions = self.store.policy_store.revisions();
        let nodes = self.node_views();
        let mut plan = Plan::new();
        for (name, t) in self.store.policy_store.policies.items() {
            let policy = readable_or_placeholder(name, t);
            let previous = t.value.as_ref().ok().and_then(|p| p.status.as_ref());
            let v = &validity[name.as_str()];
            let revision = revisions.get(name.as_str()).map_or("", String::as_str);
            let mut status = status_for(&policy, v, revision, &nodes, previous, now);
            if let Some(entries) = self.sources.statuses.get(name.as_str()) {
                status.conditions.push(super::evaluate::sources_condition(
                    sources_message(entries),
                    policy.metadata.generation.unwrap_or(0),
                    previous,
                    now,
                ));
                status.sources = entries.clone();
            }
            if previous != Some(&status) {
                plan.insert(name.clone(), status);
            }
        }
        plan
    }

    /// One Warning event per invalid policy, uid, generation and message:
    /// not repeated while they stay the same, forgotten once valid.
    fn warnings(&mut self, validity: &HashMap<String, Validity>) -> Vec<Job> {
        let mut jobs = Vec::new();
        for (name, t) in self.store.policy_store.policies.items() {
            let Validity::Invalid { message } = &validity[name.as_str()] else {
                continue;
            };
            let key = (t.uid.clone(), t.generation.unwrap_or(0), message.clone());
            if self.warned.get(name) != Some(&key) {
                jobs.push(Job::Warn {
                    regarding: readable_or_placeholder(name, t).object_ref(&()),
                    reason: "InvalidPolicy".into(),
                    note: ipsetmgr_policy::text::bounded(message, 1000).into_owned(),
                });
                self.warned.insert(name.clone(), key);
            }
        }
        self.warned.retain(|n, _| {
            validity
                .get(n.as_str())
                .is_some_and(|v| matches!(v, Validity::Invalid { .. }))
        });
        jobs
    }

    /// Node states of Nodes that are gone (their ownerReference normally
    /// takes care of it; this covers states created before the Node was
    /// known), each deleted once.
    fn collect_node_states(&mut self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for name in self.store.node_states.items().keys() {
            if self.store.nodes.get(name).is_none() && self.deleting.insert(name.clone()) {
                jobs.push(Job::DeleteNodeState(name.clone()));
            }
        }
        self.deleting
            .retain(|n| self.store.node_states.get(n).is_some());
        jobs
    }

    fn count_policies(&self, validity: &HashMap<String, Validity>) {
        let invalid = validity
            .values()
            .filter(|v| matches!(v, Validity::Invalid { .. }))
            .count();
        self.shared.metrics.policies.set(validity.len() as i64);
        self.shared.metrics.invalid_policies.set(invalid as i64);
    }

    /// Compile every policy with its slices, for no node in particular.
    fn validate(&mut self) -> HashMap<String, Validity> {
        let (inputs, unreadable) = self.store.policy_store.inputs();
        let compiled = compile_inputs(&inputs, &self.settings.naming, None, &mut self.cache);
        let errors = compiled.errors_by_policy();
        let mut members: HashMap<&str, i64> = HashMap::new();
        let mut sets: HashMap<&str, Vec<String>> = HashMap::new();
        for s in &compiled.sets {
            *members.entry(s.policy.as_str()).or_default() += s.members.len() as i64;
            sets.entry(s.policy.as_str())
                .or_default()
                .push(s.name.clone());
        }
        let mut out = HashMap::new();
        for input in &inputs {
            let name = input.policy.metadata.name.clone().unwrap_or_default();
            // A source that has not delivered holds the policy on the
            // nodes, but does not make it invalid.
            let (pending, errs): (Vec<&PolicyError>, Vec<&PolicyError>) = errors
                .get(name.as_str())
                .map(|e| e.as_slice())
                .unwrap_or_default()
                .iter()
                .partition(|e| matches!(e.kind, PolicyErrorKind::SourcePending(_)));
            let v = match (!errs.is_empty()).then_some(errs) {
                Some(errs) => {
                    let shown: Vec<String> = errs.iter().take(3).map(|e| e.to_string()).collect();
                    let more = errs.len().saturating_sub(shown.len());
                    let mut message = shown.join("; ");
                    if more > 0 {
                        message.push_str(&format!(" (and {more} more errors)"));
                    }
                    Validity::Invalid { message }
                }
                None => Validity::Valid {
                    pending: pending
                        .iter()
                        .filter_map(|e| match &e.kind {
                            PolicyErrorKind::SourcePending(s) => Some(s.clone()),
                            _ => None,
                        })
                        .collect(),
                    members: members.get(name.as_str()).copied().unwrap_or(0),
                    excepted: compiled
                        .excepted
                        .get(name.as_str())
                        .map_or(0, |n| *n as i64),
                    sets: {
                        let mut v = sets.remove(name.as_str()).unwrap_or_default();
                        v.sort();
                        v
                    },
                },
            };
            out.insert(name, v);
        }
        for (name, why) in unreadable {
            out.insert(
                name.to_string(),
                Validity::Invalid {
                    message: format!("policy {name:?} could not be read: {why}"),
                },
            );
        }
        out
    }
}

/// The policy, or for one that does not deserialize a stand-in with its
/// name, uid and generation that selects no node: its status and events
/// are still written (a status write needs no spec).
fn readable_or_placeholder<'a>(
    name: &str,
    t: &'a Tolerant<IPSetPolicy>,
) -> std::borrow::Cow<'a, IPSetPolicy> {
    if let Ok(p) = &t.value {
        return std::borrow::Cow::Borrowed(p);
    }
    let spec = ipsetmgr_api::IPSetPolicySpec {
        // Selects nothing: what it would select is unknown.
        node_selector: Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([(String::new(), String::new())].into()),
                match_expressions: None,
            },
        ),
        ..ipsetmgr_api::IPSetPolicySpec::new(
            ipsetmgr_ipset::SetType::HashIp,
            Default::default(),
            Vec::new(),
        )
    };
    let mut p = IPSetPolicy::new(name, spec);
    p.metadata.generation = t.generation;
    p.metadata.uid = t.uid.clone();
    std::borrow::Cow::Owned(p)
}
