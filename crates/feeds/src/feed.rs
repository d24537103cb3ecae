//! Fetching a `url` source: one GET with the validators of the last good
//! response (`If-None-Match` from its ETag, `If-Modified-Since` from its
//! Last-Modified), a timeout over the whole exchange, and a cap on the
//! body (checked against Content-Length first, then while reading, so an
//! endless body is cut off, never buffered). Redirects are not followed: a
//! feed that moved is an error to fix in the policy, not a hop to wherever
//! the server says.
//!
//! Every connection goes through the egress guard (`egress.rs`): on the
//! resolved addresses, and on IP literals before the request. A gzip body
//! (asked for with `Accept-Encoding: gzip`) is decoded within the same
//! byte cap; any other encoding is refused by name.
//!
//! The client is hyper's (hyper-util's pooled client with hyper-rustls,
//! which kube already brings: no second HTTP stack); gzip is flate2's.

use std::time::Duration;

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, ETAG, HeaderMap, HeaderValue,
    IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED, USER_AGENT,
};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use std::sync::Arc;

use super::egress::{EgressGuard, GuardedResolver, NameRefused, Refused, literal_ip};
use super::request_error::{Classified, RequestFailure, classify};
use ipsetmgr_api::FamilySpec;
use ipsetmgr_ipset::SetType;
use ipsetmgr_policy::sources::content::parse_content;
use ipsetmgr_policy::sources::spec::{FeedUrl, UrlSpec};

/// The most bytes of one feed: FireHOL's largest lists are a few MB.
pub const MAX_FEED_BYTES: usize = 32 << 20;
/// The whole exchange, connection to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// The first retry after a failure; it doubles up to the interval.
pub const FIRST_RETRY: Duration = Duration::from_secs(10);

/// What makes the next request conditional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validators {
    pub etag: Option<HeaderValue>,
    pub last_modified: Option<HeaderValue>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Fetched {
    /// 304: the last good content still holds.
    NotModified,
    /// New content, and the validators to send next time.
    Content {
        text: String,
        validators: Validators,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FetchError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A fixed reason (`request_error.rs`): never hyper's or rustls's
    /// words, which quote the peer.
    #[error("request failed: {0}")]
    Request(RequestFailure),
    #[error("the system's CA roots cannot be loaded: {0}")]
    Roots(String),
    #[error("HTTP {0} (redirects are not followed)")]
    Redirect(u16),
    #[error("HTTP {0}")]
    Status(u16),
    #[error("the body is larger than {limit} bytes; refused")]
    TooLarge { limit: usize },
    #[error("reading the body failed: {0}")]
    Body(RequestFailure),
    #[error("the body is not UTF-8 (byte {0})")]
    NotUtf8(usize),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    NameRefused(NameRefused),
    /// Named only when it is one of [`KNOWN_ENCODINGS`]: the header is the
    /// server's text.
    #[error("the body's Content-Encoding {} is not supported (only gzip or none)", .0.map_or("(another)".to_string(), |e| format!("{e:?}")))]
    Encoding(Option<&'static str>),
    #[error("the gzip body does not decode")]
    Gzip,
}

/// The encodings a refusal names (RFC 9110's registry, as servers send
/// them); any other is "(another)".
const KNOWN_ENCODINGS: &[&str] = &[
    "br",
    "compress",
    "deflate",
    "zstd",
    "x-compress",
    "dcb",
    "dcz",
];

/// A failed request or body read as [`FetchError`].
fn request_failed(e: &(dyn std::error::Error + 'static), body: bool) -> FetchError {
    match classify(e) {
        Classified::Refused(r) => FetchError::NameRefused(r),
        Classified::Failure(f) if body => FetchError::Body(f),
        Classified::Failure(f) => FetchError::Request(f),
    }
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>;

/// A pooled HTTP(S) client for feeds.
#[derive(Clone)]
pub struct Fetcher {
    client: Client<Connector, Empty<Bytes>>,
    guard: Arc<EgressGuard>,
    timeout: Duration,
    max_bytes: usize,
}

impl Fetcher {
    /// A client trusting the system's roots (the image carries them), that
    /// connects only where `guard` allows.
    pub fn new(
        timeout: Duration,
        max_bytes: usize,
        guard: EgressGuard,
    ) -> Result<Fetcher, FetchError> {
        let tls = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| FetchError::Roots(e.to_string()))?;
        Ok(Fetcher::with_tls(timeout, max_bytes, guard, tls))
    }

    /// A client trusting only `roots` (tests' own CAs).
    #[cfg(test)]
    pub(crate) fn trusting(
        timeout: Duration,
        max_bytes: usize,
        guard: EgressGuard,
        roots: rustls::RootCertStore,
    ) -> Fetcher {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring's protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config);
        Fetcher::with_tls(timeout, max_bytes, guard, tls)
    }

    fn with_tls(
        timeout: Duration,
        max_bytes: usize,
        guard: EgressGuard,
        tls: hyper_rustls::HttpsConnectorBuilder<hyper_rustls::builderstates::WantsSchemes>,
    ) -> Fetcher {
        let guard = Arc::new(guard);
        let mut http = HttpConnector::new_with_resolver(GuardedResolver::new(guard.clone()));
        // https URLs pass through to the TLS layer around it.
        http.enforce_http(false);
        let https = tls.https_or_http().enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Fetcher {
            client,
            guard,
            timeout,
            max_bytes,
        }
    }

    /// GET `url` with `headers` (from a Secret, already typed) and the
    /// validators of the last good content.
    pub async fn fetch(
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
        // The client connects to an IP literal without resolving it.
        if let Some(ip) = url.uri().host().and_then(literal_ip) {
            self.guard.check(ip)?;
        }
        let mut req = Request::get(url.uri().clone())
            .body(Empty::<Bytes>::new())
            .map_err(|_| FetchError::Request(RequestFailure::Other))?;
        let h = req.headers_mut();
        h.extend(headers.clone());
        h.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("ipsetmgr/", env!("CARGO_PKG_VERSION"))),
        );
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        if let Some(etag) = &validators.etag {
            h.insert(IF_NONE_MATCH, etag.clone());
        }
        if let Some(lm) = &validators.last_modified {
            h.insert(IF_MODIFIED_SINCE, lm.clone());
        }
        let resp = self.client.request(req).await.map_err(|e| {
            // The whole chain for the one debugging it; it may quote the
            // peer, so never beyond debug and never in a status.
            tracing::debug!(url = %url, error = %error_chain(&e), "url source request failed");
            request_failed(&e, false)
        })?;
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
        let gzip = match resp.headers().get(CONTENT_ENCODING).map(|v| v.as_bytes()) {
            None | Some(b"identity") => false,
            Some(b"gzip" | b"x-gzip") => true,
            Some(other) => {
                let known = KNOWN_ENCODINGS
                    .iter()
                    .find(|k| k.as_bytes().eq_ignore_ascii_case(other))
                    .copied();
                return Err(FetchError::Encoding(known));
            }
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
                    request_failed(&*e, true)
                }
            })?
            .to_bytes();
        let body = if gzip {
            gunzip(&body, self.max_bytes)?
        } else {
            body.to_vec()
        };
        let text = String::from_utf8(body)
            .map_err(|e| FetchError::NotUtf8(e.utf8_error().valid_up_to()))?;
        Ok(Fetched::Content { text, validators })
    }
}

/// Decode a gzip body, refusing what decodes to more than `limit` bytes (a
/// small download can be a large file).
fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, FetchError> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| FetchError::Gzip)?;
    if out.len() > limit {
        return Err(FetchError::TooLarge { limit });
    }
    Ok(out)
}

/// What one url source keeps between fetches (the controller's tasks and
/// `ipsetmgr run` alike).
#[derive(Default)]
pub struct FeedState {
    pub validators: Validators,
    pub good: Option<Arc<Vec<String>>>,
}

/// Why a fetch gave no new members, said twice: `public` has nothing of
/// what the server sent (line numbers and reasons only), for API objects
/// and events; `detail` may quote one line, cut short, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedFailure {
    pub public: String,
    pub detail: String,
}

impl FeedFailure {
    fn same(message: String) -> FeedFailure {
        FeedFailure {
            public: message.clone(),
            detail: message,
        }
    }
}

impl std::fmt::Display for FeedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// One url source as it is run, the same by the controller's feed tasks
/// and by file mode (`ipsetmgr run`, `apply`): what it keeps between
/// fetches, and the backoff of its failures (the first retry after
/// [`FIRST_RETRY`], doubling up to the interval; the interval again after
/// a success).
pub struct UrlFeed {
    pub state: FeedState,
    /// The wait after the next failure.
    retry: Duration,
}

impl Default for UrlFeed {
    fn default() -> Self {
        UrlFeed {
            state: FeedState::default(),
            retry: FIRST_RETRY,
        }
    }
}

/// What one refresh of a [`UrlFeed`] came to.
#[derive(Debug)]
pub struct Refreshed {
    /// `Ok(true)` when new content was taken, `Ok(false)` when it was not
    /// modified; a failure leaves the last good content in force.
    pub outcome: Result<bool, FeedFailure>,
    /// How long until the next fetch.
    pub next: Duration,
}

impl UrlFeed {
    /// Fetch once (`refresh_feed`: new content is taken only when all of
    /// it parses), and say when to fetch next.
    pub async fn refresh(
        &mut self,
        spec: &UrlSpec,
        set_type: SetType,
        family: FamilySpec,
        fetcher: &Fetcher,
        headers: &HeaderMap,
    ) -> Refreshed {
        let outcome = refresh_feed(&mut self.state, spec, set_type, family, fetcher, headers).await;
        self.settle(outcome, spec.interval)
    }

    /// When to fetch next after `outcome`: the backoff step, also for a
    /// failure before any request (the controller's header Secret that
    /// cannot be read counts as a failed fetch).
    pub fn settle(&mut self, outcome: Result<bool, FeedFailure>, interval: Duration) -> Refreshed {
        let next = if outcome.is_ok() {
            self.retry = FIRST_RETRY;
            interval
        } else {
            let wait = self.retry.min(interval);
            self.retry = (self.retry * 2).min(interval);
            wait
        };
        Refreshed { outcome, next }
    }
}

/// One fetch: new content replaces the last good only when all of it
/// parses, and is not empty for the policy's family (a feed that turns
/// into IPv6 lines only would empty an IPv4 blocklist as surely as an
/// empty file); anything else leaves it in force and says why (naming the
/// URL). `Ok(true)` when new content was taken, `Ok(false)` when it was
/// not modified.
async fn refresh_feed(
    state: &mut FeedState,
    spec: &UrlSpec,
    set_type: SetType,
    family: FamilySpec,
    fetcher: &Fetcher,
    headers: &HeaderMap,
) -> Result<bool, FeedFailure> {
    let origin = spec.url.to_string();
    match fetcher
        .fetch(&spec.url, headers, &state.validators)
        .await
        .map_err(|e| FeedFailure::same(format!("{origin}: {e}")))?
    {
        Fetched::NotModified if state.good.is_some() => Ok(false),
        // A 304 to a request without validators: fetch it whole next time.
        Fetched::NotModified => {
            state.validators = Validators::default();
            Err(FeedFailure::same(format!(
                "{origin}: 304 Not Modified to an unconditional request"
            )))
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
            .map_err(|e| FeedFailure {
                public: e.public(),
                detail: e.to_string(),
            })?;
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

#[cfg(test)]
mod tests {
    //! Encodings, against a real HTTP server on loopback.
    use super::*;
    use crate::egress::{EgressGuard, Setting};

    async fn serve(encoding: &'static str, body: Vec<u8>) -> FeedUrl {
        let app = axum::Router::new().route(
            "/l",
            axum::routing::get(move || {
                let body = body.clone();
                async move { ([("content-encoding", encoding)], body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FeedUrl::parse(&format!("http://{addr}/l")).unwrap()
    }

    fn gzip(text: &str) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    }

    fn fetcher(max: usize) -> Fetcher {
        Fetcher::new(
            Duration::from_secs(5),
            max,
            EgressGuard::new(Setting::Files, &[], &[]),
        )
        .unwrap()
    }

    fn failure() -> Result<bool, FeedFailure> {
        Err(FeedFailure::same("down".into()))
    }

    /// The backoff: 10 s after the first failure, doubling up to the
    /// interval and staying there; back to the interval after a success,
    /// and 10 s after the next failure.
    #[test]
    fn failures_back_off_from_ten_seconds_doubling_up_to_the_interval() {
        let secs = Duration::from_secs;
        let interval = secs(100);
        let mut feed = UrlFeed::default();
        let waits: Vec<Duration> = (0..6)
            .map(|_| feed.settle(failure(), interval).next)
            .collect();
        assert_eq!(
            waits,
            [secs(10), secs(20), secs(40), secs(80), secs(100), secs(100)]
        );
        assert_eq!(feed.settle(Ok(false), interval).next, interval);
        assert_eq!(feed.settle(failure(), interval).next, secs(10));
        assert_eq!(feed.settle(failure(), interval).next, secs(20));
        assert_eq!(feed.settle(Ok(true), interval).next, interval);
        // An interval shorter than the first retry caps it too.
        let mut feed = UrlFeed::default();
        assert_eq!(feed.settle(failure(), secs(4)).next, secs(4));
        assert_eq!(feed.settle(failure(), secs(4)).next, secs(4));
    }

    /// The same through real fetches: a server that fails its first three
    /// requests, then serves a list.
    #[tokio::test]
    async fn a_refresh_says_when_to_fetch_next() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/l",
            axum::routing::get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 3 {
                        (http::StatusCode::INTERNAL_SERVER_ERROR, "")
                    } else {
                        (http::StatusCode::OK, "10.0.0.0/8\n")
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let spec = UrlSpec {
            url: FeedUrl::parse(&format!("http://{addr}/l")).unwrap(),
            interval: Duration::from_secs(3600),
            format: ipsetmgr_api::member_source::FeedFormat::Text,
            max_members: 10,
            headers_secret: None,
        };
        let fetcher = fetcher(1000);
        let mut feed = UrlFeed::default();
        let mut next = Vec::new();
        for _ in 0..4 {
            let r = feed
                .refresh(
                    &spec,
                    SetType::HashNet,
                    FamilySpec::IPv4,
                    &fetcher,
                    &HeaderMap::new(),
                )
                .await;
            next.push((r.outcome.is_ok(), r.next.as_secs()));
        }
        assert_eq!(next, [(false, 10), (false, 20), (false, 40), (true, 3600)]);
        assert_eq!(hits.load(Ordering::SeqCst), 4);
        assert_eq!(
            feed.state.good.as_deref().map(Vec::as_slice),
            Some(&["10.0.0.0/8".to_string()][..])
        );
    }

    /// `http://0.0.0.0:port/` reaches a server on 127.0.0.1 (Linux connects
    /// the unspecified address to loopback): a broad allow range holding
    /// 0.0.0.0 must not let it through.
    #[tokio::test]
    async fn the_unspecified_address_does_not_reach_loopback() {
        let served = serve("identity", b"10.0.0.0/8\n".to_vec()).await;
        let port = served.uri().port_u16().unwrap();
        let allow = crate::egress::Cidr::parse("0.0.0.0/0").unwrap();
        let fetcher = Fetcher::new(
            Duration::from_secs(5),
            1000,
            EgressGuard::new(Setting::Cluster, &allow, &[]),
        )
        .unwrap();
        let url = FeedUrl::parse(&format!("http://0.0.0.0:{port}/l")).unwrap();
        let r = fetcher
            .fetch(&url, &HeaderMap::new(), &Validators::default())
            .await;
        match r {
            Err(FetchError::Refused(e)) => {
                assert!(e.to_string().contains("0.0.0.0 is an unspecified"), "{e}")
            }
            other => panic!("0.0.0.0 with allow 0.0.0.0/0: {other:?}"),
        }
    }

    /// A unique name in the test server's certificate: it must not reach
    /// any error a status may show (docs/member-sources.md, "Egress").
    const NEEDLE: &str = "adv3needle-san.internal";

    /// A TLS server on 127.0.0.1 whose self-signed certificate names only
    /// NEEDLE; the certificate, to trust it.
    async fn tls_server() -> (u16, rustls::pki_types::CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![NEEDLE.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = acceptor.accept(conn).await;
                });
            }
        });
        (port, der)
    }

    /// The public failure (what a status shows) of one refresh of `url`.
    async fn public_failure(fetcher: &Fetcher, url: &str) -> String {
        let spec = UrlSpec {
            url: FeedUrl::parse(url).unwrap(),
            interval: Duration::from_secs(3600),
            format: ipsetmgr_api::member_source::FeedFormat::Text,
            max_members: 10,
            headers_secret: None,
        };
        let r = UrlFeed::default()
            .refresh(
                &spec,
                SetType::HashNet,
                FamilySpec::IPv4,
                fetcher,
                &HeaderMap::new(),
            )
            .await;
        r.outcome.expect_err(url).public
    }

    /// Fetch errors are fixed reasons chosen by the error's kind: nothing
    /// the peer sent (here its certificate's names) reaches them.
    #[tokio::test]
    async fn fetch_errors_name_reasons_not_what_the_peer_sent() {
        let (port, cert) = tls_server().await;
        let url = format!("https://127.0.0.1:{port}/l");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let guard = || EgressGuard::new(Setting::Files, &[], &[]);
        let trusting = Fetcher::trusting(Duration::from_secs(5), 1000, guard(), roots);
        let e = public_failure(&trusting, &url).await;
        assert!(!e.contains(NEEDLE) && !e.contains("adv3needle"), "{e}");
        assert!(
            e.contains("TLS handshake failed: the server's certificate does not match the host"),
            "{e}"
        );
        let empty = Fetcher::trusting(
            Duration::from_secs(5),
            1000,
            guard(),
            rustls::RootCertStore::empty(),
        );
        let e = public_failure(&empty, &url).await;
        assert!(
            e.contains("TLS handshake failed: the server's certificate is not signed by a trusted authority"),
            "{e}"
        );
        // Nothing listens here any more.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let e = public_failure(&empty, &format!("http://127.0.0.1:{port}/l")).await;
        assert!(e.ends_with(": connection refused"), "{e}");
    }

    #[tokio::test]
    async fn gzip_is_decoded_within_the_cap_and_other_encodings_refused_by_name() {
        let url = serve("gzip", gzip("10.0.0.0/8\n192.0.2.0/24\n")).await;
        match fetcher(1000)
            .fetch(&url, &HeaderMap::new(), &Validators::default())
            .await
        {
            Ok(Fetched::Content { text, .. }) => assert_eq!(text, "10.0.0.0/8\n192.0.2.0/24\n"),
            other => panic!("{other:?}"),
        }
        // A small download that decodes to more than the cap.
        let bomb = serve("gzip", gzip(&"10.0.0.0/8\n".repeat(10_000))).await;
        let e = fetcher(1000)
            .fetch(&bomb, &HeaderMap::new(), &Validators::default())
            .await
            .unwrap_err();
        assert_eq!(e, FetchError::TooLarge { limit: 1000 });
        let br = serve("br", b"whatever".to_vec()).await;
        let e = fetcher(1000)
            .fetch(&br, &HeaderMap::new(), &Validators::default())
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("Content-Encoding \"br\" is not supported"),
            "{e}"
        );
    }
}
