//! The host-side manager: owns a prefix-named family of kernel sets,
//! applies changes in one batch with backoff, resyncs against the kernel to
//! repair drift, deletes what nobody wants, isolates sets that keep failing,
//! and reports per set; and the one loop that drives it ([`driver`]). It
//! knows nothing of Kubernetes or of policy files: it is given complete
//! desired states. The algorithm is described in `docs/architecture.md`.
//! [`BothBackends`] runs two [`SetsBackend`]s (ipset and nft) as one.

#![forbid(unsafe_code)]

mod backend;
mod batch;
mod both;
mod desired;
pub mod driver;
mod report;
mod resync;
mod retire;
mod state;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use backend::{ListedSet, SetsBackend};
pub use batch::Plan;
pub use both::{BothBackends, SECOND_PREFIX as BOTH_SECOND_PREFIX};
pub use desired::DesiredSet;
use ipsetmgr_dataplane::{BatchError, Dataplane, DataplaneError, Op};
use ipsetmgr_ipset::{Member, MemberSet, Naming, SetType};
pub use report::{
    ApplyError, ApplyOutcome, DeletionReport, Drift, NotReplaced, SetError, SetReport,
};
pub use retire::Retiring;
pub use state::Failure;
use state::SetState;

/// Tunables; the defaults are the design's.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub naming: Naming,
    /// Attempts per `apply_updates` (the seed's 10).
    pub max_attempts: u32,
    /// First retry delay, doubled after each failed attempt.
    pub initial_backoff: Duration,
    /// First retry delay of an isolated set, doubled per failure.
    pub set_retry_base: Duration,
    pub set_retry_max: Duration,
    /// Delete owned sets that no policy wants. Off for a one-shot apply of
    /// some policy files without `--prune`; temp sets are always removed.
    pub prune: bool,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            naming: Naming::default(),
            max_attempts: 10,
            initial_backoff: Duration::from_millis(1),
            set_retry_base: Duration::from_secs(1),
            set_retry_max: Duration::from_secs(300),
            prune: true,
        }
    }
}

/// Which sets the next resync must read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ResyncNeed {
    None,
    /// Re-read these sets (touched by a failed batch); not drift.
    Sets(BTreeSet<String>),
    /// List and read every owned set; discrepancies count as problems.
    Full,
}

/// A set-level failure counter: errors that are not clearly set-specific
/// isolate a set only when they repeat.
const ISOLATE_AFTER_REPEATS: u32 = 3;

pub struct Manager<D: Dataplane> {
    dp: D,
    config: ManagerConfig,
    /// Desired sets by kernel name.
    sets: BTreeMap<String, SetState>,
    /// Names of failed policies' sets: never modified nor deleted.
    held: HashSet<String>,
    /// Owned set names seen in the kernel (last listing, plus our own creates).
    existing: BTreeSet<String>,
    pending_deletions: BTreeSet<String>,
    pending_temp_deletions: BTreeSet<String>,
    /// Sets that could not be deleted, with the reason (retried at resync).
    deletion_errors: BTreeMap<String, DataplaneError>,
    resync: ResyncNeed,
    /// Unsupported set types learned from the backend or a failed batch.
    unsupported: HashSet<SetType>,
    temp_counter: u64,
    /// Sets isolated during the current `apply_updates`: not retried in it,
    /// whatever their backoff says.
    isolated_now: HashSet<String>,
    sleep: Box<dyn FnMut(Duration) + Send>,
}

impl<D: Dataplane> Manager<D> {
    pub fn new(dp: D, config: ManagerConfig) -> Manager<D> {
        // Temp names only need to be unique among this manager's live temp
        // sets; seeding from the clock keeps restarts from colliding with
        // leftovers before the first resync cleans them.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64 & 0xffff_ffff);
        Manager {
            dp,
            config,
            sets: BTreeMap::new(),
            held: HashSet::new(),
            existing: BTreeSet::new(),
            pending_deletions: BTreeSet::new(),
            pending_temp_deletions: BTreeSet::new(),
            deletion_errors: BTreeMap::new(),
            resync: ResyncNeed::Full,
            unsupported: HashSet::new(),
            temp_counter: seed,
            isolated_now: HashSet::new(),
            sleep: Box::new(std::thread::sleep),
        }
    }

    /// Replace the sleep used for backoff (tests count instead of sleeping).
    pub fn with_sleep(mut self, sleep: impl FnMut(Duration) + Send + 'static) -> Self {
        self.sleep = Box::new(sleep);
        self
    }

    pub fn naming(&self) -> &Naming {
        &self.config.naming
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    /// Declare the complete desired state. `held` names sets of failed
    /// policies, which are left exactly as they are in the kernel.
    pub fn set_desired(
        &mut self,
        desired: Vec<DesiredSet>,
        held: impl IntoIterator<Item = String>,
    ) {
        self.held = held.into_iter().collect();
        let mut wanted = BTreeSet::new();
        for d in desired {
            wanted.insert(d.name.clone());
            self.pending_deletions.remove(&d.name);
            match self.sets.get_mut(&d.name) {
                Some(s) => {
                    s.update(d.policy, d.header, d.members);
                }
                None => {
                    let mut s = SetState::new(d.policy, d.header, d.members);
                    if self.resync == ResyncNeed::Full {
                        // The coming full resync reads it.
                    } else if !self.existing.contains(&d.name) {
                        s.kernel = state::Belief::Absent;
                    } else {
                        self.queue_set_read(&d.name);
                    }
                    self.sets.insert(d.name, s);
                }
            }
        }
        let gone: Vec<String> = self
            .sets
            .keys()
            .filter(|n| !wanted.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.sets.remove(&name);
            if !self.held.contains(&name) && self.existing.contains(&name) {
                self.pending_deletions.insert(name);
            }
        }
        self.pending_deletions.retain(|n| !self.held.contains(n));
    }

    fn queue_set_read(&mut self, name: &str) {
        match &mut self.resync {
            ResyncNeed::Full => {}
            ResyncNeed::Sets(s) => {
                s.insert(name.to_string());
            }
            ResyncNeed::None => self.resync = ResyncNeed::Sets([name.to_string()].into()),
        }
    }

    /// Ask for a full resync before the next update (periodic, or on demand).
    pub fn queue_resync(&mut self) {
        self.resync = ResyncNeed::Full;
    }

    /// Whether an isolated set's retry time has come.
    pub fn retry_due(&self) -> bool {
        let now = Instant::now();
        self.sets
            .values()
            .any(|s| s.failure.as_ref().is_some_and(|f| f.retry_at <= now))
    }

    /// The earliest retry time of an isolated set.
    pub fn next_retry(&self) -> Option<Instant> {
        self.sets
            .values()
            .filter_map(|s| s.failure.as_ref().map(|f| f.retry_at))
            .min()
    }

    /// Bring the kernel in line: resync when required, remove leftover temp
    /// sets, send every dirty set in one batch, retrying with exponential
    /// backoff; then delete sets nobody wants.
    pub fn apply_updates(&mut self) -> ApplyOutcome {
        let started = Instant::now();
        let mut outcome = ApplyOutcome::default();
        let mut delay = self.config.initial_backoff;
        let mut repeats: BTreeMap<String, u32> = BTreeMap::new();
        // How each set was first written in this call: a set created by a
        // batch that failed later and finished by a retry's delta still
        // reports "created".
        let mut first_plans: BTreeMap<String, Plan> = BTreeMap::new();
        self.isolated_now.clear();
        for attempt in 1..=self.config.max_attempts {
            outcome.attempts = attempt;
            if let Err(e) = self.resync_if_needed() {
                outcome.error = Some(ApplyError::Resync(e));
                (self.sleep)(delay);
                delay *= 2;
                continue;
            }
            self.leave_out_missing_held();
            outcome.temp_deleted.extend(self.delete_temp_sets());
            match self.try_updates() {
                Ok(written) => {
                    for (name, plan) in written {
                        first_plans.entry(name).or_insert(plan);
                    }
                    outcome.written = first_plans
                        .into_iter()
                        .filter(|(name, _)| self.sets.get(name).is_some_and(|s| s.synced()))
                        .collect();
                    outcome.applied = true;
                    outcome.error = None;
                    break;
                }
                Err(e) => {
                    outcome.error = Some(e.summary());
                    for (name, plan) in &e.touched {
                        first_plans.entry(name.clone()).or_insert(*plan);
                    }
                    self.handle_batch_failure(e, &mut repeats);
                    (self.sleep)(delay);
                    delay *= 2;
                }
            }
        }
        outcome.deleted = self.apply_deletions();
        outcome.duration = started.elapsed();
        outcome
    }

    /// A list:set member naming a held set (its policy failed) stays
    /// listed while that set exists in the kernel: a failure to load never
    /// changes the kernel. While the set does not exist (its policy never
    /// applied) it is left out, since a list:set cannot list a missing set;
    /// it is listed once its policy applies. Known only after a resync, so
    /// decided here and not by the compiler.
    fn leave_out_missing_held(&mut self) {
        let (held, existing) = (&self.held, &self.existing);
        let missing = |m: &Member| {
            matches!(m.without_comment(), Member::Set(n)
                if held.contains(&**n) && !existing.contains(&**n))
        };
        for s in self.sets.values_mut() {
            if s.header.kind.set_type != SetType::ListSet || !s.members.iter().any(|m| missing(&m))
            {
                continue;
            }
            let kept: Vec<Member> = s.members.iter().filter(|m| !missing(m)).collect();
            let kept = Arc::new(MemberSet::from_members(s.header.kind, kept));
            let (policy, header) = (s.policy.clone(), s.header.clone());
            s.update(policy, header, kept);
        }
    }

    fn resync_if_needed(&mut self) -> Result<(), DataplaneError> {
        match std::mem::replace(&mut self.resync, ResyncNeed::None) {
            ResyncNeed::None => Ok(()),
            ResyncNeed::Full => self
                .full_resync()
                .inspect_err(|_| self.resync = ResyncNeed::Full),
            ResyncNeed::Sets(names) => {
                let result = self.read_sets(&names, false);
                if result.is_err() {
                    self.resync = ResyncNeed::Sets(names);
                }
                result
            }
        }
    }

    /// Isolate the set that made the batch fail when the error is about it;
    /// re-read every set the batch touched.
    fn handle_batch_failure(&mut self, e: UpdateError, repeats: &mut BTreeMap<String, u32>) {
        let UpdateError {
            error,
            failed_set,
            touched,
            temps,
        } = e;
        self.pending_temp_deletions.extend(temps);
        for (name, _) in touched {
            self.queue_set_read(&name);
        }
        let Some(set) = failed_set else {
            return;
        };
        let count = repeats.entry(set.clone()).or_default();
        *count += 1;
        let about_this_set = error.error.is_set_specific()
            || matches!(
                (&error.error, &error.member),
                (
                    DataplaneError::SetMissing(_),
                    Some(ipsetmgr_ipset::Member::Set(_))
                )
            );
        if let DataplaneError::TypeNotSupported(_) = error.error
            && let Some(s) = self.sets.get(&set)
        {
            self.unsupported.insert(s.header.kind.set_type);
        }
        if about_this_set || *count >= ISOLATE_AFTER_REPEATS {
            let detail = match error.member {
                Some(element) => SetError::Element {
                    error: error.error,
                    element,
                },
                None => SetError::Kernel(error.error),
            };
            self.isolate(&set, detail);
        }
    }

    fn isolate(&mut self, name: &str, error: SetError) {
        let Some(s) = self.sets.get_mut(name) else {
            return;
        };
        let (failure, backoff) = Failure::after(s.failure.as_ref(), error, &self.config);
        tracing::warn!(set = name, policy = %s.policy, error = %failure.error, retry_in = ?backoff, "set isolated");
        self.isolated_now.insert(name.to_string());
        s.failure = Some(failure);
    }

    /// Send every dirty, non-waiting set in one batch.
    #[allow(clippy::result_large_err)] // built once per failed batch; not hot
    fn try_updates(&mut self) -> Result<Vec<(String, Plan)>, UpdateError> {
        let order = self.sets_to_write();
        let (plans, unlinks) = self.plan_writes(order);
        if plans.is_empty() {
            return Ok(Vec::new());
        }
        let temps = self.temp_names(&plans);
        let mut ops: Vec<Op<'_>> = Vec::new();
        let mut spans = Vec::with_capacity(plans.len());
        for ((name, plan), temp) in plans.iter().zip(&temps) {
            let start = ops.len();
            let unlink = unlinks.get(name).map_or(&[][..], Vec::as_slice);
            batch::push_ops(&mut ops, name, &self.sets[name], *plan, temp, unlink);
            spans.push(batch::OpSpan {
                set: name.clone(),
                plan: *plan,
                ops: start..ops.len(),
                temp: (!temp.is_empty()).then(|| temp.clone()),
                also_touched: unlink.iter().map(|(l, _)| l.clone()).collect(),
            });
        }
        let result = self.dp.apply(&ops);
        drop(ops);
        match result {
            Ok(()) => {
                for (name, _) in &plans {
                    self.existing.insert(name.clone());
                    if let Some(s) = self.sets.get_mut(name) {
                        s.committed();
                    }
                }
                Ok(plans)
            }
            Err(error) => Err(batch::failure(error, &spans)),
        }
    }

    /// The dirty sets due for a write, referenced sets before the list:sets
    /// that list them. Sets of types known to be unsupported are isolated
    /// here, without a round trip to the kernel.
    fn sets_to_write(&mut self) -> Vec<String> {
        let now = Instant::now();
        let mut order: Vec<String> = Vec::new();
        let mut blocked: Vec<(String, SetType)> = Vec::new();
        for list_pass in [false, true] {
            for (name, s) in &self.sets {
                let t = s.header.kind.set_type;
                let due = s.dirty && !s.waiting(now) && !self.isolated_now.contains(name);
                if (t == SetType::ListSet) != list_pass || !due {
                    continue;
                }
                if self.unsupported.contains(&t) || self.dp.supports(t) == Some(false) {
                    blocked.push((name.clone(), t));
                } else {
                    order.push(name.clone());
                }
            }
        }
        for (name, t) in blocked {
            self.unsupported.insert(t);
            let error = DataplaneError::TypeNotSupported(t.to_string());
            self.isolate(&name, SetError::Kernel(error));
        }
        order
    }

    /// How to write each set (in batch order), and for each set recreated
    /// under our own list:sets the lists to take it out of and back into.
    /// Sets that cannot be written safely are isolated instead.
    fn plan_writes(&mut self, order: Vec<String>) -> (Vec<(String, Plan)>, Unlinks) {
        let mut plans = Vec::with_capacity(order.len());
        let mut unlinks = Unlinks::new();
        for name in order {
            if plans.iter().any(|(n, _)| *n == name) {
                // A list already planned to relink a recreated set.
                continue;
            }
            let lists = self.lists_holding(&name);
            match batch::plan_for(&self.sets[&name], lists.len() as u32) {
                Ok(plan) => {
                    if plan == Plan::Recreate && !lists.is_empty() {
                        self.relink_after_recreate(&name, &lists, &mut plans);
                        let kind = self.sets[&lists[0]].header.kind;
                        let this =
                            MemberSet::from_members(kind, [Member::Set(name.as_str().into())]);
                        unlinks.insert(
                            name.clone(),
                            lists.into_iter().map(|l| (l, this.clone())).collect(),
                        );
                    }
                    plans.push((name, plan));
                }
                Err(why) => self.isolate(&name, why.into()),
            }
        }
        // The lists relinked above were appended with their own plans; keep
        // every list after every set it may list.
        plans.sort_by_key(|(name, _)| self.sets[name].header.kind.set_type == SetType::ListSet);
        (plans, unlinks)
    }

    /// A fresh temp set name for each set filled before it is put in place
    /// ("" for deltas).
    fn temp_names(&mut self, plans: &[(String, Plan)]) -> Vec<String> {
        plans
            .iter()
            .map(|(_, plan)| match plan {
                Plan::TempSwap | Plan::Create | Plan::Recreate => {
                    self.temp_counter = self.temp_counter.wrapping_add(1);
                    self.config.naming.temp_set_name(self.temp_counter)
                }
                _ => String::new(),
            })
            .collect()
    }

    /// This manager's list:sets that the kernel is believed to hold `name`
    /// in (only lists whose kernel content is known: not being rewritten).
    fn lists_holding(&self, name: &str) -> Vec<String> {
        let member = Member::Set(name.into());
        self.sets
            .iter()
            .filter(|(_, l)| {
                l.header.kind.set_type == SetType::ListSet
                    && !l.replace
                    && matches!(l.kernel, state::Belief::Present { .. })
                    && ((l.members.contains(&member) && !l.pending_adds.contains(&member))
                        || l.pending_dels.contains(&member))
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// `name` is recreated after being taken out of `lists`: each list that
    /// still wants it adds it back, in the same batch (lists come last).
    fn relink_after_recreate(
        &mut self,
        name: &str,
        lists: &[String],
        plans: &mut Vec<(String, Plan)>,
    ) {
        let member = Member::Set(name.into());
        for list in lists {
            let Some(l) = self.sets.get_mut(list) else {
                continue;
            };
            l.pending_dels.remove(&member);
            if l.members.contains(&member) {
                l.pending_adds.insert(member.clone());
            }
            l.dirty = true;
            if !plans.iter().any(|(n, _)| n == list) {
                plans.push((list.clone(), Plan::Delta));
            }
        }
    }

    /// Destroy leftover temp sets (found by resync or left by a failed batch).
    fn delete_temp_sets(&mut self) -> Vec<String> {
        let mut deleted = Vec::new();
        for name in std::mem::take(&mut self.pending_temp_deletions) {
            match self.dp.apply(&[Op::Destroy { set: &name }]) {
                Ok(()) => deleted.push(name.clone()),
                Err(e) if matches!(e.error, DataplaneError::SetMissing(_)) => {}
                Err(e) => {
                    tracing::warn!(set = %name, error = %e.error, "could not remove temp set");
                    self.deletion_errors.insert(name.clone(), e.error);
                }
            }
            self.existing.remove(&name);
        }
        deleted
    }

    /// Destroy owned sets nobody wants. A set still referenced is reported
    /// and retried at the next resync; never fatal. Sets that a list:set
    /// references go after the list:set, so destroys repeat while progress is
    /// made.
    fn apply_deletions(&mut self) -> Vec<String> {
        let mut deleted = Vec::new();
        if !self.config.prune {
            return deleted;
        }
        let mut todo: Vec<String> = std::mem::take(&mut self.pending_deletions)
            .into_iter()
            .collect();
        loop {
            let mut in_use = Vec::new();
            let before = todo.len();
            for name in todo {
                if self.held.contains(&name) || self.sets.contains_key(&name) {
                    continue;
                }
                match self.dp.apply(&[Op::Destroy { set: &name }]) {
                    Ok(()) => {
                        self.existing.remove(&name);
                        self.deletion_errors.remove(&name);
                        deleted.push(name);
                    }
                    Err(e) => match e.error {
                        DataplaneError::SetMissing(_) => {
                            self.existing.remove(&name);
                            self.deletion_errors.remove(&name);
                        }
                        DataplaneError::InUse(_) => in_use.push((name, e.error)),
                        other => {
                            self.deletion_errors.insert(name, other);
                        }
                    },
                }
            }
            if in_use.is_empty() || in_use.len() == before {
                for (name, why) in in_use {
                    tracing::warn!(set = %name, "{why}; retried at the next resync");
                    self.deletion_errors.insert(name, why);
                }
                break;
            }
            todo = in_use.into_iter().map(|(n, _)| n).collect();
        }
        deleted
    }

    /// Per desired set: synced, members, problems, error.
    pub fn report(&self) -> Vec<SetReport> {
        self.sets
            .iter()
            .map(|(name, s)| SetReport {
                name: name.clone(),
                policy: s.policy.clone(),
                synced: s.synced(),
                members: s.members.len(),
                problems: s.drift.total(),
                drift: s.drift,
                error: s.failure.as_ref().map(|f| f.error.clone()),
                last_sync: s.last_sync,
            })
            .collect()
    }

    /// Owned sets no policy wants, left in place because pruning is off.
    pub fn unwanted(&self) -> Vec<String> {
        if self.config.prune {
            Vec::new()
        } else {
            self.pending_deletions.iter().cloned().collect()
        }
    }

    /// Owned sets that should be gone but could not be deleted.
    pub fn deletion_report(&self) -> Vec<DeletionReport> {
        self.deletion_errors
            .iter()
            .map(|(name, error)| DeletionReport {
                name: name.clone(),
                error: error.clone(),
            })
            .collect()
    }

    /// Human-readable planned operations for `--dry-run`, after a read-only
    /// resync. Nothing is sent to the kernel.
    pub fn plan(&mut self) -> Result<Vec<String>, DataplaneError> {
        self.resync_if_needed()?;
        let mut lines = Vec::new();
        for name in &self.pending_temp_deletions {
            lines.push(format!("destroy {name} (leftover temp set)"));
        }
        for (name, s) in &self.sets {
            if !s.dirty {
                continue;
            }
            let t = s.header.kind.set_type;
            if self.unsupported.contains(&t) || self.dp.supports(t) == Some(false) {
                lines.push(format!(
                    "skip {name}: set type {t} is not supported by this kernel"
                ));
                continue;
            }
            match batch::plan_for(s, self.lists_holding(name).len() as u32) {
                Ok(Plan::Delta) => lines.push(format!(
                    "update {name}: add {}, delete {}",
                    s.pending_adds.len(),
                    s.pending_dels.len()
                )),
                Ok(Plan::Create) => lines.push(format!(
                    "create {name} {t} with {} members",
                    s.members.len()
                )),
                Ok(Plan::TempSwap) => lines.push(format!(
                    "replace {name} atomically (temp set + swap) with {} members",
                    s.members.len()
                )),
                Ok(Plan::Recreate) => lines.push(format!(
                    "recreate {name} as {t} with {} members (type changed, not referenced)",
                    s.members.len()
                )),
                Err(why) => lines.push(format!("cannot update {name}: {why}")),
            }
        }
        for name in &self.pending_deletions {
            if self.config.prune {
                lines.push(format!("destroy {name} (no policy wants it)"));
            } else {
                lines.push(format!(
                    "keep {name}: no policy wants it (use --prune to delete)"
                ));
            }
        }
        Ok(lines)
    }
}

/// The ipset manager is the first sets backend; the trait's methods are its
/// inherent ones.
impl<D: Dataplane> SetsBackend for Manager<D> {
    fn name(&self) -> &'static str {
        self.dp.name()
    }
    fn naming(&self) -> &Naming {
        Manager::naming(self)
    }
    fn set_desired(&mut self, desired: Vec<DesiredSet>, held: Vec<String>) {
        Manager::set_desired(self, desired, held)
    }
    fn queue_resync(&mut self) {
        Manager::queue_resync(self)
    }
    fn retry_due(&self) -> bool {
        Manager::retry_due(self)
    }
    fn next_retry(&self) -> Option<Instant> {
        Manager::next_retry(self)
    }
    fn apply_updates(&mut self) -> ApplyOutcome {
        Manager::apply_updates(self)
    }
    fn report(&self) -> Vec<SetReport> {
        Manager::report(self)
    }
    fn unwanted(&self) -> Vec<String> {
        Manager::unwanted(self)
    }
    fn deletion_report(&self) -> Vec<DeletionReport> {
        Manager::deletion_report(self)
    }
    fn plan(&mut self) -> Result<Vec<String>, DataplaneError> {
        Manager::plan(self)
    }
    fn list(&mut self) -> Result<Vec<ListedSet>, DataplaneError> {
        let naming = self.config.naming.clone();
        let names = self.dp.list_owned(&|n| naming.owns(n))?;
        let mut listed = Vec::with_capacity(names.len());
        for name in names {
            let Some(k) = self.dp.read_set(&name)? else {
                continue;
            };
            listed.push(ListedSet {
                kind: k
                    .header
                    .as_ref()
                    .map_or("(unmanaged type)".into(), |h| h.kind.to_string()),
                members: k.members.as_ref().map_or(0, |m| m.len()),
                max_elem: k.header.as_ref().map(|h| h.max_elem),
                references: k.references,
                role: if naming.is_temp(&name) {
                    "temp"
                } else {
                    "main"
                },
                name,
            });
        }
        Ok(listed)
    }
}

/// Per recreated set: this manager's list:sets holding it, each with a
/// member set of just its name (see [`batch::push_ops`]).
type Unlinks = BTreeMap<String, Vec<(String, MemberSet)>>;

/// A failed batch, mapped to sets.
pub(crate) struct UpdateError {
    error: BatchError,
    failed_set: Option<String>,
    /// Sets the failed batch may have changed, with how they were written.
    touched: Vec<(String, Plan)>,
    temps: Vec<String>,
}

impl UpdateError {
    /// What callers are told (the rest is the manager's own bookkeeping).
    fn summary(&self) -> ApplyError {
        let error = self.error.error.clone();
        match &self.failed_set {
            Some(set) => ApplyError::BatchAtSet {
                set: set.clone(),
                error,
            },
            None => ApplyError::Batch(error),
        }
    }
}

#[cfg(test)]
mod tests;
