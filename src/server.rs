//! The health and metrics listener: `/healthz`, `/readyz`, `/metrics`.
//! A deliberately tiny HTTP/1.1 responder (GET only, one request per
//! connection): three read-only endpoints need no web framework.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::agent::metrics::Shared;

/// Status line, content type and body for a request path.
pub fn respond(path: &str, shared: &Shared) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/healthz" | "/livez" => {
            if shared.healthy() {
                ("200 OK", TEXT, "ok\n".into())
            } else {
                (
                    "503 Service Unavailable",
                    TEXT,
                    "manager thread stalled\n".into(),
                )
            }
        }
        "/readyz" => {
            if shared.ready() {
                ("200 OK", TEXT, "ok\n".into())
            } else {
                (
                    "503 Service Unavailable",
                    TEXT,
                    "waiting for the initial policy list and first kernel sync\n".into(),
                )
            }
        }
        "/metrics" => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            shared.metrics.encode(),
        ),
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}

async fn handle(mut stream: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the request head (bounded size and time).
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = if method == "GET" || method == "HEAD" {
        respond(path, &shared)
    } else {
        (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".into(),
        )
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        out.push_str(&body);
    }
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

/// Serve until `stop` turns true.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, shared).await {
                            tracing::debug!(error = %e, "http connection");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let shared = Shared::new(Duration::from_secs(60));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(serve(listener, shared.clone(), stop_rx));
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 503"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        shared.heartbeat();
        shared.set_policies_listed();
        shared.set_first_sync();
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        shared.metrics.status_writes.inc();
        shared.metrics.apply_duration.observe(0.01);
        let m = get("/metrics").await;
        for name in [
            "ipsetmgr_sets ",
            "ipsetmgr_members ",
            "ipsetmgr_apply_duration_seconds_bucket",
            "ipsetmgr_problems_total ",
            "ipsetmgr_dataplane_errors_total ",
            "ipsetmgr_status_writes_total 1",
        ] {
            assert!(m.contains(name), "{name} missing in {m}");
        }
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        stop_tx.send(true).unwrap();
        server.await.unwrap();
    }
}
