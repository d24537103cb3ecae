//! The agent's event loop: keeps the store (policies, slices, the Node, the
//! kinds), recompiles this node's complete desired state on changes
//! (debounced, and never before everything was seen once), hands it to the
//! kernel side, and turns the kernel side's reports into this node's
//! `IPSetNodeState` (through the writer task) and metrics.
//!
//! It never waits on the API server: the only requests are the writer's,
//! in its own task.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};

use super::inputs::{Input, resource};
use super::metrics::{LOOP_TICK, Shared};
use super::node_state::{Pending, PolicyFacts, Snapshot, status_of};
use super::store::Store;
use ipsetmgr_cluster::telemetry::labels::{BackendLabel, OutcomeLabel};
use ipsetmgr_ipset::Naming;
use ipsetmgr_node::KernelSide;
use ipsetmgr_policy::compile::{Compiled, MemberCache};
use ipsetmgr_sets::driver::{Command, Report};
use kube::runtime::watcher::Event;

/// Where desired states go: the kernel side (tests use an inline one).
pub trait KernelPort: Send {
    fn send(&self, cmd: Command);
    /// Stop after the current apply, leaving the kernel as it is.
    fn shutdown(self: Box<Self>);
}

impl KernelPort for KernelSide {
    fn send(&self, cmd: Command) {
        KernelSide::send(self, cmd)
    }
    fn shutdown(self: Box<Self>) {
        KernelSide::shutdown(*self)
    }
}

/// Identity and timing of one agent.
#[derive(Clone, Debug)]
pub struct Settings {
    pub naming: Naming,
    /// Quiet time before recompiling after a change.
    pub debounce: Duration,
    /// Extra quiet time before applying a change that removed policies or
    /// slices: deleting a CRD first deletes all its objects, and the CRD's
    /// own watch event may arrive a moment after theirs (see
    /// `cluster::kind_guard`).
    pub deletion_grace: Duration,
    /// Between node state heartbeats.
    pub heartbeat: Duration,
    /// This cluster's caps on policies (the controller's are the same).
    pub limits: ipsetmgr_cluster::slices::ClusterLimits,
    /// The kinds of kernel set this node holds (`ipset`, `nft`), in
    /// `--backend` order: each gets its metrics, zero until reported.
    pub sets_kinds: Vec<&'static str>,
}

impl Settings {
    pub fn new(naming: Naming, heartbeat: Duration) -> Settings {
        Settings {
            naming,
            debounce: Duration::from_millis(100),
            deletion_grace: Duration::from_secs(2),
            heartbeat,
            limits: Default::default(),
            sets_kinds: vec!["ipset"],
        }
    }
}

pub struct Agent {
    settings: Settings,
    store: Store,
    shared: Arc<Shared>,
    cache: MemberCache,
    recompile_at: Option<Instant>,
    seq: u64,
    snapshot: Option<Snapshot>,
    /// The rejection last logged per policy (logged once per change).
    logged: std::collections::BTreeMap<String, String>,
    kernel: Option<Box<dyn KernelPort>>,
    reports: mpsc::UnboundedReceiver<Report>,
    status: watch::Sender<Option<Pending>>,
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

impl Agent {
    /// `kernel` is the started kernel side, whose reports arrive on
    /// `reports`; statuses go out on `status` (to the writer task).
    pub fn new(
        settings: Settings,
        crds: &[String],
        kernel: Box<dyn KernelPort>,
        reports: mpsc::UnboundedReceiver<Report>,
        status: watch::Sender<Option<Pending>>,
        shared: Arc<Shared>,
    ) -> Agent {
        let limits = settings.limits;
        Agent {
            settings,
            store: Store::new(crds, limits),
            shared,
            cache: MemberCache::default(),
            recompile_at: None,
            seq: 0,
            snapshot: None,
            logged: Default::default(),
            kernel: Some(kernel),
            reports,
            status,
        }
    }

    /// Run until `shutdown` completes or the inputs end; then stop the
    /// kernel side after its current apply. The kernel is left as it is.
    pub async fn run(
        mut self,
        inputs: impl Stream<Item = Input> + Unpin,
        shutdown: impl Future<Output = ()>,
    ) {
        // Fused: once the inputs end, their branch stays off.
        let mut inputs = inputs.fuse();
        tokio::pin!(shutdown);
        // Turns the loop even when nothing happens: liveness watches it.
        let mut tick = tokio::time::interval(LOOP_TICK);
        loop {
            self.shared.loop_turned();
            let recompile = sleep_until(self.recompile_at.unwrap_or_else(far_future));
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => {}
                Some(input) = inputs.next() => self.on_input(input),
                Some(report) = self.reports.recv() => self.on_report(report),
                _ = recompile, if self.recompile_at.is_some() => {
                    self.recompile_at = None;
                    self.recompile();
                }
            }
        }
        tracing::info!("shutting down: stopping the kernel side after its current apply");
        if let Some(kernel) = self.kernel.take() {
            // Joining the thread blocks: off the async workers.
            let _ = tokio::task::spawn_blocking(move || kernel.shutdown()).await;
        }
    }

    /// Recompile after `quiet`; a longer wait asked for later pushes it out.
    fn changed_after(&mut self, quiet: Duration) {
        let at = Instant::now() + quiet;
        self.recompile_at = Some(self.recompile_at.map_or(at, |t| t.max(at)));
    }

    fn on_input(&mut self, input: Input) {
        let change = match input {
            Input::WatchError { resource, error } => {
                // Fail static: the store and the kernel stay as they are.
                let e = ipsetmgr_policy::text::bounded(&error, 1024);
                tracing::warn!(%resource, error = %e, "watch failed; retrying, kernel left as it is");
                self.watch_failed(resource, &e);
                return;
            }
            Input::KindNotFound { crd, error } => {
                let e = ipsetmgr_policy::text::bounded(&error, 1024);
                tracing::warn!(%crd, error = %e, "kind not found");
                self.store.kinds.kind_not_found(&crd);
                let resource = crd.split('.').next().unwrap_or_default().to_string();
                self.watch_failed(&resource, &e);
                self.publish_waiting();
                return;
            }
            Input::Crd(name, ev) => {
                self.shared.watches.delivered(resource::CRDS);
                if self.store.kinds.on_event(&name, ev) && self.store.kinds.may_apply() {
                    self.changed_after(self.settings.debounce);
                }
                self.publish_waiting();
                return;
            }
            Input::Node(ev) => {
                self.shared.watches.delivered(resource::NODES);
                let listed = matches!(ev, Event::InitDone);
                if self.store.on_node(ev) {
                    self.changed_after(self.settings.debounce);
                }
                if listed && self.store.node.is_none() {
                    tracing::warn!(
                        "this node's Node object does not exist (is NODE_NAME right?); nothing is applied until it does"
                    );
                }
                self.publish_waiting();
                // The writer creates the node state only for a Node that exists.
                let uid = self.store.node.as_ref().and_then(|n| n.uid.clone());
                self.status.send_if_modified(|p| match p {
                    Some(p) if p.node_uid != uid => {
                        p.node_uid = uid;
                        true
                    }
                    _ => false,
                });
                return;
            }
            Input::Policy(ev) => {
                self.shared.watches.delivered(resource::POLICIES);
                let listed = self.store.policy_store.policies.listed();
                let c = self.store.on_policy(ev);
                if !listed && self.store.policy_store.policies.listed() {
                    tracing::info!(
                        policies = self.store.policy_store.policies.items().len(),
                        "initial list of policies done"
                    );
                }
                c
            }
            Input::Slice(ev) => {
                self.shared.watches.delivered(resource::SLICES);
                self.store.policy_store.on_slice(ev)
            }
        };
        self.publish_waiting();
        if change.removed {
            self.changed_after(self.settings.deletion_grace);
        } else if change.changed {
            self.changed_after(self.settings.debounce);
        }
    }

    /// Readiness names what the store still waits for.
    fn publish_waiting(&self) {
        self.shared.set_waiting_for(self.store.waiting_for());
    }

    fn watch_failed(&self, resource: &str, error: &str) {
        self.shared
            .metrics
            .api
            .watch_failed(&self.shared.watches, resource, error);
    }

    /// Compile the complete desired state of this node and hand it to the
    /// kernel side. Never before the kinds, the initial lists and the Node
    /// were all seen: a partial state would delete sets.
    fn recompile(&mut self) {
        if let Some(what) = self.store.waiting_for() {
            tracing::info!(waiting_for = %what, "not applying yet; kernel left as it is");
            return;
        }
        let compiled = self.store.compile(&self.settings.naming, &mut self.cache);
        self.log_rejections(&compiled);
        self.seq += 1;
        self.snapshot = Some(self.snapshot_of(&compiled));
        if let Some(kernel) = &self.kernel {
            kernel.send(Command::Desired {
                seq: self.seq,
                sets: compiled.sets,
                held: compiled.held,
            });
        }
    }

    /// Each rejection once per change of its text, as structured fields.
    fn log_rejections(&mut self, compiled: &Compiled) {
        for w in &compiled.warnings {
            tracing::debug!("{w}");
        }
        let mut now = std::collections::BTreeMap::new();
        let revisions = self.store.policy_store.revisions();
        for (policy, errors) in compiled.errors_by_policy() {
            let generation = self
                .store
                .policy_store
                .policies
                .get(policy)
                .map_or(0, |e| e.generation);
            // Once per generation and members revision (a slice change),
            // or when the rejection itself changes.
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            let key = format!(
                "{generation}/{}/{}",
                revisions.get(policy).map_or("", |r| r.as_str()),
                text.join("; ")
            );
            if self.logged.get(policy) != Some(&key) {
                let first = &errors[0];
                tracing::warn!(
                    %policy,
                    generation,
                    errors = errors.len(),
                    slice = first.slice.as_deref().unwrap_or(""),
                    member = first.member.as_deref().unwrap_or(""),
                    reason = %first.kind,
                    "policy rejected; its kernel sets are held as they are"
                );
            }
            now.insert(policy.to_string(), key);
        }
        self.logged = now;
    }

    /// Per policy selecting this node: its generation, revision and error.
    fn snapshot_of(&self, compiled: &Compiled) -> Snapshot {
        let errors = compiled.errors_by_policy();
        let revisions = self.store.policy_store.revisions();
        let mut policies = std::collections::BTreeMap::new();
        for (name, entry) in self.store.policy_store.policies.items() {
            if compiled.not_selected.iter().any(|n| n == name) {
                continue;
            }
            let error = errors.get(name.as_str()).map(|errs| {
                let shown: Vec<String> = errs.iter().take(3).map(|e| e.to_string()).collect();
                shown.join("; ")
            });
            policies.insert(
                name.clone(),
                PolicyFacts {
                    generation: entry.generation,
                    revision: revisions.get(name.as_str()).cloned().unwrap_or_default(),
                    error,
                    excepted: compiled
                        .excepted
                        .get(name.as_str())
                        .map_or(0, |n| *n as i64),
                },
            );
        }
        Snapshot {
            seq: self.seq,
            policies,
        }
    }

    fn on_report(&mut self, report: Report) {
        let m = &self.shared.metrics;
        let mut kinds: BTreeMap<&str, (i64, i64)> = self
            .settings
            .sets_kinds
            .iter()
            .map(|k| (*k, (0, 0)))
            .collect();
        for s in &report.sets {
            let (sets, members) = kinds.entry(s.set.backend.kind).or_default();
            *sets += 1;
            // Only sets in sync are known to hold their members.
            if s.synced {
                *members += s.members as i64;
            }
        }
        for (kind, (sets, members)) in kinds {
            let label = BackendLabel::of(kind);
            m.sets.get_or_create(&label).set(sets);
            m.members.get_or_create(&label).set(members);
        }
        m.apply_duration
            .get_or_create(&OutcomeLabel::of(report.outcome.applied))
            .observe(report.outcome.duration.as_secs_f64());
        for id in &report.outcome.resyncs_skipped {
            m.resyncs_skipped
                .get_or_create(&BackendLabel::of(id.kind))
                .inc();
        }
        if report.full_resync {
            for s in report.sets.iter().filter(|s| s.problems > 0) {
                m.problems
                    .get_or_create(&BackendLabel::of(s.set.backend.kind))
                    .inc_by(s.problems as u64);
            }
            for s in report.sets.iter().filter(|s| s.synced && s.problems > 0) {
                m.drift_repaired
                    .get_or_create(&ipsetmgr_cluster::telemetry::labels::PolicyLabel {
                        policy: s.policy.clone(),
                    })
                    .inc_by(s.problems as u64);
            }
            ipsetmgr_sets::log_drift(&report.sets);
        }
        let failed_attempts = report.outcome.attempts - u32::from(report.outcome.applied);
        let set_errors = report.sets.iter().filter(|s| s.error.is_some()).count();
        m.dataplane_errors
            .inc_by(u64::from(failed_attempts) + set_errors as u64);
        if let Some(e) = report
            .outcome
            .error
            .as_ref()
            .filter(|_| !report.outcome.applied)
        {
            tracing::warn!(error = %e, "apply did not complete");
        }
        self.shared.set_first_sync();
        let Some(snapshot) = &self.snapshot else {
            return;
        };
        // A report of an older desired state says nothing of the current one.
        if report.seq != snapshot.seq {
            return;
        }
        let status = status_of(snapshot, &report, self.settings.heartbeat);
        // Members counted once, as the node state counts them: with
        // several backends each holds the same members again.
        let primary = crate::node_state::primary_backend(&report);
        let mut kernel_members = std::collections::BTreeMap::new();
        for s in report
            .sets
            .iter()
            .filter(|s| s.synced && Some(s.set.backend) == primary)
        {
            *kernel_members.entry(s.policy.as_str()).or_insert(0) += s.members as i64;
        }
        let excepted = snapshot
            .policies
            .iter()
            .map(|(name, facts)| (name.as_str(), facts.excepted))
            .collect();
        m.set_policies(&status, &kernel_members, &excepted);
        let node_uid = self.store.node.as_ref().and_then(|n| n.uid.clone());
        self.status.send_replace(Some(Pending { status, node_uid }));
    }
}
