//! Fetching a `url` source: one GET with the validators of the last good
//! response (`If-None-Match` from its ETag, `If-Modified-Since` from its
//! Last-Modified), a timeout over the whole exchange, and a cap on the
//! body (checked against Content-Length first, then while reading, so an
//! endless body is cut off, never buffered). Redirects are not followed: a
//! feed that moved is an error to fix in the policy, not a hop to wherever
//! the server says.
//!
//! The client is hyper's (hyper-util's pooled client with hyper-rustls,
//! which kube already brings: no second HTTP stack).

use std::time::Duration;

use bytes::Bytes;
use http::header::{
    CONTENT_LENGTH, ETAG, HeaderMap, HeaderValue, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED,
    USER_AGENT,
};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use std::sync::Arc;

use super::content::parse_content;
use super::spec::{FeedUrl, UrlSpec};
use crate::api::FamilySpec;
use crate::ipset::SetType;

/// The most bytes of one feed: FireHOL's largest lists are a few MB.
pub(crate) const MAX_FEED_BYTES: usize = 32 << 20;
/// The whole exchange, connection to last byte.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// The first retry after a failure; it doubles up to the interval.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(10);

/// What makes the next request conditional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Validators {
    pub etag: Option<HeaderValue>,
    pub last_modified: Option<HeaderValue>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// 304: the last good content still holds.
    NotModified,
    /// New content, and the validators to send next time.
    Content {
        text: String,
        validators: Validators,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum FetchError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request failed: {0}")]
    Request(String),
    #[error("HTTP {0} (redirects are not followed)")]
    Redirect(u16),
    #[error("HTTP {0}")]
    Status(u16),
    #[error("the body is larger than {limit} bytes; refused")]
    TooLarge { limit: usize },
    #[error("reading the body failed: {0}")]
    Body(String),
    #[error("the body is not UTF-8 (byte {0})")]
    NotUtf8(usize),
}

/// A pooled HTTP(S) client for feeds.
#[derive(Clone)]
pub(crate) struct Fetcher {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
    max_bytes: usize,
}

impl Fetcher {
    /// A client trusting the system's roots (the image carries them).
    pub(crate) fn new(timeout: Duration, max_bytes: usize) -> Result<Fetcher, FetchError> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| FetchError::Request(format!("loading the system's CA roots: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Fetcher {
            client,
            timeout,
            max_bytes,
        })
    }

    /// GET `url` with `headers` (from a Secret, already typed) and the
    /// validators of the last good content.
    pub(crate) async fn fetch(
        &self,
        url: &FeedUrl,
        headers: &HeaderMap,
        validators: &Validators,
    ) -> Result<Fetched, FetchError> {
        match tokio::time::timeout(self.timeout, self.exchange(url, headers, validators)).await {
            Ok(r) => r,
            Err(_) => Err(FetchError::Timeout(self.timeout)),
        }
    }

    async fn exchange(
        &self,
        url: &FeedUrl,
        headers: &HeaderMap,
        validators: &Validators,
    ) -> Result<Fetched, FetchError> {
        let mut req = Request::get(url.uri().clone())
            .body(Empty::<Bytes>::new())
            .map_err(|e| FetchError::Request(e.to_string()))?;
        let h = req.headers_mut();
        h.extend(headers.clone());
        h.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("ipsetmgr/", env!("CARGO_PKG_VERSION"))),
        );
        if let Some(etag) = &validators.etag {
            h.insert(IF_NONE_MATCH, etag.clone());
        }
        if let Some(lm) = &validators.last_modified {
            h.insert(IF_MODIFIED_SINCE, lm.clone());
        }
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| FetchError::Request(error_chain(&e)))?;
        let status = resp.status();
        if status == StatusCode::NOT_MODIFIED {
            return Ok(Fetched::NotModified);
        }
        if status.is_redirection() {
            return Err(FetchError::Redirect(status.as_u16()));
        }
        if !status.is_success() {
            return Err(FetchError::Status(status.as_u16()));
        }
        let declared = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_bytes as u64) {
            return Err(FetchError::TooLarge {
                limit: self.max_bytes,
            });
        }
        let validators = Validators {
            etag: resp.headers().get(ETAG).cloned(),
            last_modified: resp.headers().get(LAST_MODIFIED).cloned(),
        };
        let body = Limited::new(resp.into_body(), self.max_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    FetchError::TooLarge {
                        limit: self.max_bytes,
                    }
                } else {
                    FetchError::Body(e.to_string())
                }
            })?
            .to_bytes();
        let text = String::from_utf8(body.to_vec())
            .map_err(|e| FetchError::NotUtf8(e.utf8_error().valid_up_to()))?;
        Ok(Fetched::Content { text, validators })
    }
}

/// What one url source keeps between fetches (the controller's tasks and
/// `ipsetmgr run` alike).
#[derive(Default)]
pub(crate) struct FeedState {
    pub validators: Validators,
    pub good: Option<Arc<Vec<String>>>,
}

/// One fetch: new content replaces the last good only when all of it
/// parses; anything else leaves it in force and says why (naming the URL).
/// `Ok(true)` when new content was taken, `Ok(false)` when it was not
/// modified.
pub(crate) async fn refresh_feed(
    state: &mut FeedState,
    spec: &UrlSpec,
    set_type: SetType,
    family: FamilySpec,
    fetcher: &Fetcher,
    headers: &HeaderMap,
) -> Result<bool, String> {
    let origin = spec.url.to_string();
    match fetcher
        .fetch(&spec.url, headers, &state.validators)
        .await
        .map_err(|e| format!("{origin}: {e}"))?
    {
        Fetched::NotModified if state.good.is_some() => Ok(false),
        // A 304 to a request without validators: fetch it whole next time.
        Fetched::NotModified => {
            state.validators = Validators::default();
            Err(format!(
                "{origin}: 304 Not Modified to an unconditional request"
            ))
        }
        Fetched::Content { text, validators } => {
            let c = parse_content(
                &text,
                spec.format,
                &origin,
                set_type,
                family,
                spec.max_members,
            )
            .map_err(|e| e.to_string())?;
            state.good = Some(Arc::new(c.members));
            state.validators = validators;
            Ok(true)
        }
    }
}

/// An error with its causes: hyper's own message alone ("client error
/// (Connect)") does not say what went wrong.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
