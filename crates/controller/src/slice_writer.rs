//! The writes of materialised slices, in a task of their own (the event
//! loop never waits on the API server), by the Lease holder only. Plans
//! come as the latest value of a watch channel: a burst of changes that
//! arrives while a write is in flight costs one more write, not one per
//! change. Each slice is written at most once per `per_slice_interval`,
//! and a write the watch has not echoed back yet is not repeated.
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
    /// Per slice: what was last written, and when.
    written: BTreeMap<String, (SliceOp, Instant)>,
}

impl SliceWriter {
    async fn write(&mut self, plan: &SlicePlan) {
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        for (name, op) in plan {
            let last = self.written.get(name);
            // Written the same just now: the watch has yet to show it.
            if last.is_some_and(|(o, at)| {
                o == op && at.elapsed() < self.settings.per_slice_interval * 10
            }) {
                continue;
            }
            if let Some((_, at)) = last {
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
                    .insert(name.clone(), (op.clone(), Instant::now()));
            } else {
                let error = match result {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                tracing::warn!(slice = %name, error = %ipsetmgr_policy::text::bounded(&error, 1024), "member slice write failed; retried with the next plan");
            }
        }
        let keep = self.settings.per_slice_interval * 10;
        self.written.retain(|_, (_, at)| at.elapsed() < keep);
    }
}

/// Write slice plans while this replica leads.
pub async fn run_slice_writer(
    client: Client,
    settings: SliceWriterSettings,
    plans: watch::Receiver<Arc<SlicePlan>>,
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
