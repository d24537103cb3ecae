//! Test support: a mock API server (tower-test) that records each request
//! and answers with what the test's handler says, and polling on tokio's
//! paused clock. The agent's and the controller's tests both use it.

use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::Value;
use tower_test::mock;

/// One request as the mock server saw it.
#[derive(Clone, Debug)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

/// A client whose every request goes to `answer`, which returns the HTTP
/// status and JSON body of the response.
pub fn mock_client(mut answer: impl FnMut(Req) -> (u16, Value) + Send + 'static) -> Client {
    let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let r = Req {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, resp) = answer(r);
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&resp).unwrap()))
                    .unwrap(),
            );
        }
    });
    Client::new(svc, "default")
}

/// Poll (on the paused clock) until `f` holds.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}
