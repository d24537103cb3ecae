//! The url sources, fetched by the Lease holder: one task per source, on
//! its own interval, that sends each outcome to the event loop. A failure
//! (unreachable, HTTP error, too big, malformed lines) keeps the last good
//! content in force and is retried with backoff (from 10 s, doubling, up to
//! the interval: `ipsetmgr_feeds::feed::UrlFeed`, which file mode runs
//! too); the outcome carries the error for the status.

use futures::SinkExt;
use futures::channel::mpsc::Sender;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use ipsetmgr_api::FamilySpec;
use ipsetmgr_feeds::feed::{FeedFailure, Fetcher, Refreshed, UrlFeed};
use ipsetmgr_ipset::SetType;
use ipsetmgr_policy::sources::spec::UrlSpec;

/// One url source to keep fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedJob {
    pub spec: UrlSpec,
    pub set_type: SetType,
    pub family: FamilySpec,
}

pub(crate) type FeedKey = (String, usize);
pub(crate) type FeedJobs = BTreeMap<FeedKey, FeedJob>;

/// What the last fetch of one source came to.
#[derive(Clone, Debug)]
pub struct FeedResult {
    /// The spec it was fetched for.
    pub spec: UrlSpec,
    /// The last good members.
    pub good: Option<Arc<Vec<String>>>,
    /// Why the last fetch failed, if it did.
    pub error: Option<String>,
}

pub(crate) type FeedResults = BTreeMap<FeedKey, FeedResult>;
/// What the runner yields: one fetch's outcome for its source. Its own
/// item, not the controller's `Input`, so this module does not import the
/// watches' (`inputs` wraps it as `Input::Feed`).
pub type FeedOutcome = (FeedKey, FeedResult);

/// Where request headers come from (a Secret in the controller's namespace).
#[derive(Clone)]
pub struct HeaderSource {
    pub client: Option<Client>,
    pub namespace: String,
}

/// Why a url source's request headers could not be read from its Secret
/// (a failed fetch: its text is the source's error in the status).
#[derive(Debug, thiserror::Error)]
enum HeadersError {
    #[error("no API client to read the Secret")]
    NoClient,
    #[error("reading Secret {namespace}/{secret}: {}", ipsetmgr_cluster::api_error::describe(.error))]
    Read {
        namespace: String,
        secret: String,
        error: kube::Error,
    },
    #[error("Secret {namespace}/{secret} not found")]
    NotFound { namespace: String, secret: String },
    #[error("Secret {secret}: key {key:?} is not a header name")]
    Name { secret: String, key: String },
    #[error("Secret {secret}: the value of {key:?} is not a header value")]
    Value { secret: String, key: String },
}

impl HeaderSource {
    async fn headers(&self, secret: &str) -> Result<HeaderMap, HeadersError> {
        let Some(client) = &self.client else {
            return Err(HeadersError::NoClient);
        };
        let api: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let s = api
            .get_opt(secret)
            .await
            .map_err(|error| HeadersError::Read {
                namespace: self.namespace.clone(),
                secret: secret.to_string(),
                error,
            })?
            .ok_or_else(|| HeadersError::NotFound {
                namespace: self.namespace.clone(),
                secret: secret.to_string(),
            })?;
        let mut out = HeaderMap::new();
        for (k, v) in s.data.unwrap_or_default() {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| HeadersError::Name {
                secret: secret.to_string(),
                key: k.clone(),
            })?;
            let value = HeaderValue::from_bytes(&v.0).map_err(|_| HeadersError::Value {
                secret: secret.to_string(),
                key: k.clone(),
            })?;
            out.insert(name, value);
        }
        Ok(out)
    }
}

/// One fetch of a job, with the request headers of its Secret (a Secret
/// that cannot be read is a failed fetch, backed off as any).
async fn refresh(
    feed: &mut UrlFeed,
    job: &FeedJob,
    fetcher: &Fetcher,
    headers: &HeaderSource,
) -> Refreshed {
    let h = match &job.spec.headers_secret {
        Some(s) => match headers.headers(s).await {
            Ok(h) => h,
            Err(e) => {
                let failure = FeedFailure {
                    public: e.to_string(),
                    detail: e.to_string(),
                };
                return feed.settle(Err(failure), job.spec.interval);
            }
        },
        None => HeaderMap::new(),
    };
    feed.refresh(&job.spec, job.set_type, job.family, fetcher, &h)
        .await
}

/// Fetch one source forever, sending each outcome.
async fn feed_loop(
    key: FeedKey,
    job: FeedJob,
    fetcher: Fetcher,
    headers: HeaderSource,
    mut out: Sender<FeedOutcome>,
) {
    let mut feed = UrlFeed::default();
    loop {
        let Refreshed { outcome, next } = refresh(&mut feed, &job, &fetcher, &headers).await;
        // The status gets the public message only: nothing a feed served
        // may reach an API object (docs/member-sources.md, "Egress").
        let error = outcome.as_ref().err().map(|e| e.public.clone());
        if let Err(e) = &outcome {
            tracing::warn!(policy = %key.0, source = key.1, error = %ipsetmgr_policy::text::bounded(&e.detail, 1024), "url source failed; its last good members stay in force");
        }
        let result = FeedResult {
            spec: job.spec.clone(),
            good: feed.state.good.clone(),
            error,
        };
        if out.send((key.clone(), result)).await.is_err() {
            return;
        }
        tokio::time::sleep(next).await;
    }
}

/// Keep one fetch task per wanted source while this replica leads.
pub async fn run_feeds(
    mut jobs: watch::Receiver<Arc<FeedJobs>>,
    mut leader: watch::Receiver<bool>,
    fetcher: Fetcher,
    headers: HeaderSource,
    out: Sender<FeedOutcome>,
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

#[cfg(test)]
mod tests {
    //! The url source against a real HTTP server on loopback.
    use super::*;
    use axum::http::{HeaderMap as AxumHeaders, StatusCode};
    use ipsetmgr_policy::sources::spec::{FeedUrl, UrlSpec};
    use std::sync::Mutex;
    use std::time::Duration;

    #[derive(Default)]
    struct Served {
        body: String,
        etag: String,
        requests: Vec<Option<String>>,
    }

    async fn serve(
        state: Arc<Mutex<Served>>,
    ) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let app = axum::Router::new().route(
            "/list",
            axum::routing::get(move |h: AxumHeaders| {
                let state = state.clone();
                async move {
                    let mut s = state.lock().unwrap();
                    let inm = h
                        .get("if-none-match")
                        .and_then(|v| v.to_str().ok())
                        .map(String::from);
                    s.requests.push(inm.clone());
                    if inm.as_deref() == Some(s.etag.as_str()) {
                        return (
                            StatusCode::NOT_MODIFIED,
                            [("etag", s.etag.clone())],
                            String::new(),
                        );
                    }
                    (StatusCode::OK, [("etag", s.etag.clone())], s.body.clone())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        (addr, task)
    }

    /// A fetcher that may reach the tests' servers on loopback (as file
    /// mode may), and headers with no API client behind them.
    fn loopback_fetcher() -> (Fetcher, HeaderSource) {
        let guard = ipsetmgr_feeds::egress::EgressGuard::new(
            ipsetmgr_feeds::egress::Setting::Files,
            &[],
            &[],
        );
        let headers = HeaderSource {
            client: None,
            namespace: "ipsetmgr-system".into(),
        };
        (
            Fetcher::new(Duration::from_secs(5), 1000, guard).unwrap(),
            headers,
        )
    }

    fn job(addr: std::net::SocketAddr, max_members: usize) -> FeedJob {
        FeedJob {
            spec: UrlSpec {
                url: FeedUrl::parse(&format!("http://{addr}/list")).unwrap(),
                interval: Duration::from_secs(3600),
                format: ipsetmgr_api::member_source::FeedFormat::Text,
                max_members,
                headers_secret: None,
            },
            set_type: SetType::HashNet,
            family: FamilySpec::IPv4,
        }
    }

    fn members(feed: &UrlFeed) -> Vec<String> {
        feed.state.good.as_deref().cloned().unwrap_or_default()
    }

    #[tokio::test]
    async fn fetch_304_change_oversize_malformed_and_server_down() {
        let served = Arc::new(Mutex::new(Served {
            body: "# level1\n10.0.0.0/8\n192.0.2.0/24\n".into(),
            etag: "\"v1\"".into(),
            ..Served::default()
        }));
        let (addr, server) = serve(served.clone()).await;
        let (fetcher, headers) = loopback_fetcher();
        let job = job(addr, 5);
        let mut feed = UrlFeed::default();

        // First fetch: the content, and its ETag kept.
        refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap();
        assert_eq!(members(&feed), ["10.0.0.0/8", "192.0.2.0/24"]);
        // Unchanged: the server answers 304 to If-None-Match.
        refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap();
        assert_eq!(
            served.lock().unwrap().requests,
            [None, Some("\"v1\"".into())]
        );
        assert_eq!(members(&feed), ["10.0.0.0/8", "192.0.2.0/24"]);
        // Changed content.
        {
            let mut s = served.lock().unwrap();
            s.body = "198.51.100.0/24\n".into();
            s.etag = "\"v2\"".into();
        }
        refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap();
        assert_eq!(members(&feed), ["198.51.100.0/24"]);
        // Malformed lines: refused with their numbers; the last good stays.
        {
            let mut s = served.lock().unwrap();
            s.body = "10.0.0.0/8\nnot-an-address\n10.0.0.0/33\n".into();
            s.etag = "\"v3\"".into();
        }
        let e = refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap_err();
        // The log may quote the first bad line; the status quotes none.
        assert!(e.detail.contains("line 2: \"not-an-address\""), "{e}");
        assert!(
            e.detail.contains("line 3: ") && !e.detail.contains("/33"),
            "{e}"
        );
        for line in ["line 2: ", "line 3: "] {
            assert!(e.public.contains(line), "{e:?}");
        }
        for content in ["not-an-address", "10.0.0.0/33"] {
            assert!(!e.public.contains(content), "{e:?}");
        }
        assert_eq!(members(&feed), ["198.51.100.0/24"]);
        // Too many members for maxMembers.
        {
            let mut s = served.lock().unwrap();
            s.body = (1..=6).map(|i| format!("10.0.{i}.0/24\n")).collect();
            s.etag = "\"v4\"".into();
        }
        let e = refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap_err();
        assert!(
            e.public.contains("6 members, more than maxMembers (5)"),
            "{e}"
        );
        // An oversized body is refused (the cap here is 1000 bytes).
        {
            let mut s = served.lock().unwrap();
            s.body = "10.0.0.0/8\n".repeat(200);
            s.etag = "\"v5\"".into();
        }
        let e = refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap_err();
        assert!(e.public.contains("larger than 1000 bytes"), "{e}");
        assert_eq!(members(&feed), ["198.51.100.0/24"]);
        // The server goes away: the last good members stay in force.
        server.abort();
        let _ = server.await;
        let e = refresh(&mut feed, &job, &fetcher, &headers)
            .await
            .outcome
            .unwrap_err();
        assert!(
            e.public
                .contains(&format!("http://{addr}/list: request failed")),
            "{e}"
        );
        assert_eq!(members(&feed), ["198.51.100.0/24"]);
    }

    /// A header Secret that cannot be read fails the fetch (no request is
    /// made) and is retried with the same backoff as any failure.
    #[tokio::test]
    async fn an_unreadable_header_secret_is_a_failed_fetch_with_backoff() {
        let (fetcher, headers) = loopback_fetcher();
        let mut job = job("127.0.0.1:1".parse().unwrap(), 5);
        job.spec.headers_secret = Some("feed-token".into());
        let mut feed = UrlFeed::default();
        let first = refresh(&mut feed, &job, &fetcher, &headers).await;
        let e = first.outcome.unwrap_err();
        assert!(e.public.contains("no API client to read the Secret"), "{e}");
        assert_eq!(first.next, Duration::from_secs(10));
        let second = refresh(&mut feed, &job, &fetcher, &headers).await;
        assert_eq!(second.next, Duration::from_secs(20));
    }
}
