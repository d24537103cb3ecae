//! The url sources, fetched by the Lease holder: one task per source, on
//! its own interval, that sends each outcome to the event loop. A failure
//! (unreachable, HTTP error, too big, malformed lines) keeps the last good
//! content in force and is retried with backoff (from 10 s, doubling, up to
//! the interval); the outcome carries the error for the status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use futures::channel::mpsc::Sender;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::inputs::Input;
use crate::api::FamilySpec;
use crate::ipset::SetType;
use crate::sources::content::parse_content;
use crate::sources::feed::{Fetched, Fetcher, Validators};
use crate::sources::spec::UrlSpec;

/// The first retry after a failure; it doubles up to the interval.
const FIRST_RETRY: Duration = Duration::from_secs(10);

/// One url source to keep fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FeedJob {
    pub spec: UrlSpec,
    pub set_type: SetType,
    pub family: FamilySpec,
}

pub(crate) type FeedKey = (String, usize);
pub(crate) type FeedJobs = BTreeMap<FeedKey, FeedJob>;

/// What the last fetch of one source came to.
#[derive(Clone, Debug)]
pub(crate) struct FeedResult {
    /// The spec it was fetched for.
    pub spec: UrlSpec,
    /// The last good members.
    pub good: Option<Arc<Vec<String>>>,
    /// Why the last fetch failed, if it did.
    pub error: Option<String>,
}

pub(crate) type FeedResults = BTreeMap<FeedKey, FeedResult>;

/// Where request headers come from (a Secret in the controller's namespace).
#[derive(Clone)]
pub(crate) struct HeaderSource {
    pub client: Option<Client>,
    pub namespace: String,
}

impl HeaderSource {
    async fn headers(&self, secret: &str) -> Result<HeaderMap, String> {
        let Some(client) = &self.client else {
            return Err("no API client to read the Secret".into());
        };
        let api: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let s = api
            .get_opt(secret)
            .await
            .map_err(|e| format!("reading Secret {}/{secret}: {e}", self.namespace))?
            .ok_or_else(|| format!("Secret {}/{secret} not found", self.namespace))?;
        let mut out = HeaderMap::new();
        for (k, v) in s.data.unwrap_or_default() {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("Secret {secret}: key {k:?} is not a header name"))?;
            let value = HeaderValue::from_bytes(&v.0).map_err(|_| {
                format!("Secret {secret}: the value of {k:?} is not a header value")
            })?;
            out.insert(name, value);
        }
        Ok(out)
    }
}

/// Fetch one source forever, sending each outcome.
async fn feed_loop(
    key: FeedKey,
    job: FeedJob,
    fetcher: Fetcher,
    headers: HeaderSource,
    mut out: Sender<Input>,
) {
    let origin = job.spec.url.to_string();
    let mut validators = Validators::default();
    let mut good: Option<Arc<Vec<String>>> = None;
    let mut retry = FIRST_RETRY;
    loop {
        let outcome: Result<(), String> = async {
            let h = match &job.spec.headers_secret {
                Some(s) => headers.headers(s).await?,
                None => HeaderMap::new(),
            };
            match fetcher
                .fetch(&job.spec.url, &h, &validators)
                .await
                .map_err(|e| format!("{origin}: {e}"))?
            {
                Fetched::NotModified if good.is_some() => Ok(()),
                // A 304 without content of ours (a restart): fetch it whole.
                Fetched::NotModified => {
                    validators = Validators::default();
                    Err(format!(
                        "{origin}: 304 Not Modified to an unconditional request"
                    ))
                }
                Fetched::Content {
                    text,
                    validators: v,
                } => {
                    let c = parse_content(
                        &text,
                        job.spec.format,
                        &origin,
                        job.set_type,
                        job.family,
                        job.spec.max_members,
                    )
                    .map_err(|e| e.to_string())?;
                    good = Some(Arc::new(c.members));
                    validators = v;
                    Ok(())
                }
            }
        }
        .await;
        let error = outcome.as_ref().err().cloned();
        if let Some(e) = &error {
            tracing::warn!(policy = %key.0, source = key.1, error = %crate::logging::bounded(e, 1024), "url source failed; its last good members stay in force");
        }
        let result = FeedResult {
            spec: job.spec.clone(),
            good: good.clone(),
            error,
        };
        if out.send(Input::Feed(key.clone(), result)).await.is_err() {
            return;
        }
        let wait = if outcome.is_ok() {
            retry = FIRST_RETRY;
            job.spec.interval
        } else {
            let w = retry.min(job.spec.interval);
            retry = (retry * 2).min(job.spec.interval);
            w
        };
        tokio::time::sleep(wait).await;
    }
}

/// Keep one fetch task per wanted source while this replica leads.
pub(crate) async fn run_feeds(
    mut jobs: watch::Receiver<Arc<FeedJobs>>,
    mut leader: watch::Receiver<bool>,
    fetcher: Fetcher,
    headers: HeaderSource,
    out: Sender<Input>,
) {
    let mut running: BTreeMap<FeedKey, (FeedJob, JoinHandle<()>)> = BTreeMap::new();
    loop {
        let wanted = if *leader.borrow() {
            jobs.borrow().clone()
        } else {
            Arc::new(FeedJobs::new())
        };
        running.retain(|k, (job, task)| {
            let keep = wanted.get(k) == Some(job);
            if !keep {
                task.abort();
            }
            keep
        });
        for (k, job) in wanted.iter() {
            if !running.contains_key(k) {
                let task = tokio::spawn(feed_loop(
                    k.clone(),
                    job.clone(),
                    fetcher.clone(),
                    headers.clone(),
                    out.clone(),
                ));
                running.insert(k.clone(), (job.clone(), task));
            }
        }
        tokio::select! {
            r = jobs.changed() => if r.is_err() { break },
            r = leader.changed() => if r.is_err() { break },
        }
    }
    for (_, (_, task)) in running {
        task.abort();
    }
}
