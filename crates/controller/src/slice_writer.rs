//! The writes of materialised slices, in a task of their own (the event
//! loop never waits on the API server), by the Lease holder only. Plans
//! come as the latest value of a watch channel: a burst of changes that
//! arrives while a write is in flight costs one more write, not one per
//! change. Each slice is written at most once per `per_slice_interval`,
//! and a write the watch has not echoed back yet is not repeated.
//!
//! Which is which: with the plan comes, for each slice in it, the number
//! of the newest watch event the controller had seen of that slice
//! ([`SliceEvents`]). The same write planned on the same events is a write
//! not echoed yet; planned on newer ones, the slice changed since it was
//! written (deleted or edited by hand) and is written again at once, not
//! when the source next changes (issue 30, item 8).
//!
//! Slices are written by server-side apply (field manager
//! `ipsetmgr-controller`, forced: the controller owns these fields), which
//! creates a missing object; slices have no status subresource, so the
//! 404 of an apply to `/status` of a missing object does not arise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::leading::LeaderPlans;
use super::materialise::{SliceOp, SlicePlan};
use super::metrics::ControllerShared;
use super::writer::FIELD_MANAGER;
use ipsetmgr_api::IPSetMemberSlice;
use ipsetmgr_cluster::telemetry::labels::ResultLabel;
use ipsetmgr_cluster::tolerant::Tolerant;
use kube::runtime::watcher::Event;

/// What the slice writer is handed: the writes, and what the controller
/// had seen of each slice written ([`SliceEvents::seen`]) when it planned
/// them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceJobs {
    pub(crate) plan: SlicePlan,
    pub(crate) seen: BTreeMap<String, u64>,
}

impl SliceJobs {
    pub(crate) fn new(plan: SlicePlan, events: &SliceEvents) -> SliceJobs {
        let seen = plan.keys().map(|n| (n.clone(), events.seen(n))).collect();
        SliceJobs { plan, seen }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }
}

/// A number for every watch event of a slice, rising: the newest seen of
/// each slice by name, and of the last relist (which can delete slices
/// without an event of their own).
#[derive(Debug, Default)]
pub(crate) struct SliceEvents {
    next: u64,
    by_name: BTreeMap<String, u64>,
    relisted: u64,
}

impl SliceEvents {
    pub(crate) fn on(&mut self, ev: &Event<Tolerant<IPSetMemberSlice>>) {
        self.next += 1;
        match ev {
            Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                self.by_name.insert(o.name.clone(), self.next);
            }
            Event::Init | Event::InitDone => self.relisted = self.next,
        }
    }

    /// The newest event seen that may have changed slice `name`.
    pub(crate) fn seen(&self, name: &str) -> u64 {
        self.by_name
            .get(name)
            .copied()
            .unwrap_or(0)
            .max(self.relisted)
    }

    /// Forget the slices for which `keep` is false (gone and not planned):
    /// a forgotten one counts from the last relist, which is older than any
    /// event it had, so it never looks unchanged by mistake.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_name.retain(|n, _| keep(n));
    }
}

#[derive(Clone, Debug)]
pub struct SliceWriterSettings {
    /// At most one write per slice per this interval.
    pub per_slice_interval: Duration,
    pub request_timeout: Duration,
}

struct SliceWriter {
    api: Api<IPSetMemberSlice>,
    settings: SliceWriterSettings,
    shared: Arc<ControllerShared>,
    /// Per slice: what was last written, on which events, and when.
    written: BTreeMap<String, (SliceOp, u64, Instant)>,
}

impl SliceWriter {
    async fn write(&mut self, jobs: &SliceJobs) {
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        for (name, op) in &jobs.plan {
            let last = self.written.get(name);
            let seen = jobs.seen.get(name).copied().unwrap_or(0);
            // Written the same just now, planned on the same events: the
            // watch has yet to show it.
            if last.is_some_and(|(o, s, at)| {
                o == op && *s == seen && at.elapsed() < self.settings.per_slice_interval * 10
            }) {
                continue;
            }
            if let Some((_, _, at)) = last {
                tokio::time::sleep_until(*at + self.settings.per_slice_interval).await;
            }
            let result = match op {
                SliceOp::Apply(body) => tokio::time::timeout(
                    self.settings.request_timeout,
                    self.api.patch(name, &pp, &Patch::Apply(body)),
                )
                .await
                .map(|r| r.map(|_| ())),
                SliceOp::Delete => tokio::time::timeout(
                    self.settings.request_timeout,
                    self.api.delete(name, &DeleteParams::default()),
                )
                .await
                .map(|r| match r {
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    r => r.map(|_| ()),
                }),
            };
            let ok = matches!(result, Ok(Ok(())));
            self.shared
                .metrics
                .slice_writes
                .get_or_create(&ResultLabel::of(ok))
                .inc();
            if ok {
                self.written
                    .insert(name.clone(), (op.clone(), seen, Instant::now()));
            } else {
                let error = match result {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                tracing::warn!(slice = %name, error = %ipsetmgr_policy::text::bounded(&error, 1024), "member slice write failed; retried with the next plan");
            }
        }
        let keep = self.settings.per_slice_interval * 10;
        self.written.retain(|_, (_, _, at)| at.elapsed() < keep);
    }
}

/// Write slice plans while this replica leads.
pub async fn run_slice_writer(
    client: Client,
    settings: SliceWriterSettings,
    plans: watch::Receiver<Arc<SliceJobs>>,
    leader: watch::Receiver<bool>,
    shared: Arc<ControllerShared>,
) {
    let mut w = SliceWriter {
        api: Api::all(client),
        settings,
        shared,
        written: BTreeMap::new(),
    };
    let mut plans = LeaderPlans::new(plans, leader);
    while let Some(plan) = plans.next().await {
        w.write(&plan).await;
    }
}
