//! The health and metrics listeners: `/healthz` (and `/livez`), `/readyz`
//! on one address, `/metrics` on another (or all on one when both
//! addresses are the same), served by axum. What each endpoint says comes
//! from a [`Health`] (the agent's or the controller's).
//!
//! Two addresses because they have different audiences: the probes come
//! from the kubelet on the node (the agent's health defaults to localhost,
//! which a hostNetwork pod shares with the kubelet), the scrapes from
//! Prometheus elsewhere in the cluster.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The facts the endpoints report.
pub trait Health: Send + Sync + 'static {
    /// `Err(why)` when the process should be restarted.
    fn live(&self) -> Result<(), Unhealthy>;
    /// `Err(what it waits for)` while it should not count as ready.
    fn ready(&self) -> Result<(), Unhealthy>;
    /// The OpenMetrics text exposition.
    fn metrics(&self) -> String;
}

/// Why an endpoint answers 503: every reason the role found, in the order
/// found, each its role's own typed error (this crate holds no role's
/// logic); the body joins them with "; ".
#[derive(Debug, Default, thiserror::Error)]
#[error("{}", join(.reasons))]
pub struct Unhealthy {
    reasons: Vec<Box<dyn std::error::Error + Send + Sync>>,
}

fn join(reasons: &[Box<dyn std::error::Error + Send + Sync>]) -> String {
    let texts: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

impl Unhealthy {
    /// One more reason (a typed error: no free text).
    pub fn push<E: std::error::Error + Send + Sync + 'static>(&mut self, reason: E) {
        self.reasons.push(Box::new(reason));
    }

    /// A single reason.
    pub fn of<E: std::error::Error + Send + Sync + 'static>(reason: E) -> Unhealthy {
        let mut u = Unhealthy::default();
        u.push(reason);
        u
    }

    /// `Ok` when no reason was found.
    pub fn into_result(self) -> Result<(), Unhealthy> {
        if self.reasons.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }

    pub fn reasons(&self) -> &[Box<dyn std::error::Error + Send + Sync>] {
        &self.reasons
    }
}

/// A role's event loop has not turned for too long (both roles' liveness).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the event loop has not turned for {secs} s")]
pub struct LoopStalled {
    pub secs: u64,
}

fn text(result: Result<(), Unhealthy>) -> Response {
    let (code, body) = match result {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    };
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn live(State(h): State<Arc<dyn Health>>) -> Response {
    text(h.live())
}

async fn ready(State(h): State<Arc<dyn Health>>) -> Response {
    text(h.ready())
}

async fn metrics(State(h): State<Arc<dyn Health>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics(),
    )
        .into_response()
}

/// Which endpoints one listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    Health,
    Metrics,
    All,
}

/// The routes (GET and HEAD; other methods get 405, other paths 404).
pub fn router(health: Arc<dyn Health>, routes: Routes) -> Router {
    let mut r = Router::new();
    if routes != Routes::Metrics {
        r = r
            .route("/healthz", get(live))
            .route("/livez", get(live))
            .route("/readyz", get(ready));
    }
    if routes != Routes::Health {
        r = r.route("/metrics", get(metrics));
    }
    r.with_state(health)
}

/// The listeners for a health and a metrics address: one serving all when
/// the addresses are the same.
async fn bind(
    health: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
) -> std::io::Result<Vec<(TcpListener, Routes)>> {
    let bind = |addr: std::net::SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("listening on {addr}: {e}")))
    };
    if health == metrics {
        return Ok(vec![(bind(health).await?, Routes::All)]);
    }
    Ok(vec![
        (bind(health).await?, Routes::Health),
        (bind(metrics).await?, Routes::Metrics),
    ])
}

/// The health and metrics server of a role, running on its own task until
/// [`Server::stop`].
pub struct Server {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Bind the health and metrics addresses (one listener when they are
    /// the same) and serve `health` on them.
    pub async fn start(
        health_addr: std::net::SocketAddr,
        metrics_addr: std::net::SocketAddr,
        health: Arc<dyn Health>,
    ) -> std::io::Result<Server> {
        let listeners = bind(health_addr, metrics_addr).await?;
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(serve_all(listeners, health, stop_rx));
        Ok(Server { stop, task })
    }

    /// Stop serving and wait for the listeners to close.
    pub async fn stop(self) -> std::io::Result<()> {
        let _ = self.stop.send(true);
        self.task.await.map_err(std::io::Error::other)?
    }
}

/// Serve every listener until `stop` turns true.
async fn serve_all(
    listeners: Vec<(TcpListener, Routes)>,
    health: Arc<dyn Health>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let servers: Vec<_> = listeners
        .into_iter()
        .map(|(l, routes)| tokio::spawn(serve(l, health.clone(), routes, stop.clone())))
        .collect();
    for s in servers {
        s.await.map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// Serve until `stop` turns true.
async fn serve(
    listener: TcpListener,
    health: Arc<dyn Health>,
    routes: Routes,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(health, routes))
        .with_graceful_shutdown(async move {
            while !*stop.borrow_and_update() {
                if stop.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// A reason as the fake role states it.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Why(&'static str);

    struct Fake {
        live: Mutex<Result<(), &'static str>>,
        ready: Mutex<Result<(), &'static str>>,
    }

    impl Health for Fake {
        fn live(&self) -> Result<(), Unhealthy> {
            self.live.lock().unwrap().map_err(|w| Unhealthy::of(Why(w)))
        }
        fn ready(&self) -> Result<(), Unhealthy> {
            self.ready
                .lock()
                .unwrap()
                .map_err(|w| Unhealthy::of(Why(w)))
        }
        fn metrics(&self) -> String {
            "# EOF\n".into()
        }
    }

    async fn request(addr: std::net::SocketAddr, line: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("{line} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn endpoints_say_what_health_says() {
        let fake = Arc::new(Fake {
            live: Mutex::new(Err("manager thread stalled")),
            ready: Mutex::new(Err("waiting for the initial policy list")),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(serve(listener, fake.clone(), Routes::All, stop_rx));
        let r = request(addr, "GET /healthz").await;
        assert!(
            r.starts_with("HTTP/1.1 503") && r.ends_with("manager thread stalled\n"),
            "{r}"
        );
        let r = request(addr, "GET /readyz").await;
        assert!(r.contains("waiting for the initial policy list"), "{r}");
        *fake.live.lock().unwrap() = Ok(());
        *fake.ready.lock().unwrap() = Ok(());
        assert!(
            request(addr, "GET /livez")
                .await
                .starts_with("HTTP/1.1 200")
        );
        assert!(
            request(addr, "GET /readyz")
                .await
                .starts_with("HTTP/1.1 200")
        );
        let r = request(addr, "GET /metrics").await;
        assert!(
            r.contains("application/openmetrics-text") && r.ends_with("# EOF\n"),
            "{r}"
        );
        let head = request(addr, "HEAD /readyz").await;
        assert!(
            head.starts_with("HTTP/1.1 200") && !head.ends_with("ok\n"),
            "{head}"
        );
        assert!(
            request(addr, "POST /readyz")
                .await
                .starts_with("HTTP/1.1 405")
        );
        assert!(request(addr, "GET /nope").await.starts_with("HTTP/1.1 404"));
        stop_tx.send(true).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn health_and_metrics_apart_or_together() {
        let fake = Arc::new(Fake {
            live: Mutex::new(Ok(())),
            ready: Mutex::new(Ok(())),
        });
        let lo = |port| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        // Two free ports.
        let (a, b) = {
            let x = std::net::TcpListener::bind(lo(0)).unwrap();
            let y = std::net::TcpListener::bind(lo(0)).unwrap();
            (x.local_addr().unwrap(), y.local_addr().unwrap())
        };
        let server = Server::start(a, b, fake.clone()).await.unwrap();
        assert!(request(a, "GET /readyz").await.starts_with("HTTP/1.1 200"));
        assert!(request(a, "GET /metrics").await.starts_with("HTTP/1.1 404"));
        assert!(request(b, "GET /metrics").await.starts_with("HTTP/1.1 200"));
        assert!(request(b, "GET /livez").await.starts_with("HTTP/1.1 404"));
        server.stop().await.unwrap();

        assert_eq!(bind(a, a).await.unwrap().len(), 1);
        let server = Server::start(a, a, fake).await.unwrap();
        assert!(request(a, "GET /readyz").await.starts_with("HTTP/1.1 200"));
        assert!(request(a, "GET /metrics").await.starts_with("HTTP/1.1 200"));
        server.stop().await.unwrap();
    }
}
