//! Errors of the API server as sentences, for what users read: a policy's
//! status, a node state, the logs. kube's own Display of an API error
//! appends the Rust debug form of the whole `Status` (`ApiError: … (Status {
//! status: Some(Failure), code: 403, … })`); here it is the reason, the HTTP
//! code and the server's message, nothing else.

use kube::runtime::watcher;

/// One error of a request to the API server.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => status(s),
        other => other.to_string(),
    }
}

/// One error of a watch (its list, its start, or its stream).
pub fn describe_watch(e: &watcher::Error) -> String {
    use watcher::Error as W;
    match e {
        W::InitialListFailed(e) => format!("the initial list failed: {}", describe(e)),
        W::WatchStartFailed(e) => format!("the watch could not start: {}", describe(e)),
        W::WatchError(s) => format!("the API server ended the watch: {}", status(s)),
        W::WatchFailed(e) => format!("the watch stream failed: {}", describe(e)),
        W::NoResourceVersion => {
            "the watch result has no resourceVersion (does the resource support watch?)".into()
        }
    }
}

/// `Forbidden (HTTP 403): pods is forbidden: …`.
fn status(s: &kube::core::Status) -> String {
    let reason = if s.reason.is_empty() {
        "Failure"
    } else {
        s.reason.as_str()
    };
    match s.message.trim() {
        "" => format!("{reason} (HTTP {})", s.code),
        message => format!("{reason} (HTTP {}): {message}", s.code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code: 403,
            message: "pods is forbidden: User \"x\" cannot list resource \"pods\"".into(),
            metadata: Some(Default::default()),
            reason: "Forbidden".into(),
            details: None,
        }))
    }

    #[test]
    fn an_api_error_is_reason_code_and_message() {
        let e = forbidden();
        // What kube itself says, and why this module exists.
        assert!(e.to_string().contains("Status {"), "{e}");
        assert_eq!(
            describe(&e),
            "Forbidden (HTTP 403): pods is forbidden: User \"x\" cannot list resource \"pods\""
        );
    }

    #[test]
    fn a_watch_error_says_which_step_failed() {
        let d = describe_watch(&watcher::Error::InitialListFailed(forbidden()));
        assert!(
            d.starts_with("the initial list failed: Forbidden (HTTP 403): pods"),
            "{d}"
        );
        for debug in ["Status {", "Some(", "ListMeta"] {
            assert!(!d.contains(debug), "{d}");
        }
        let gone = kube::core::Status {
            code: 410,
            reason: "Expired".into(),
            ..Default::default()
        };
        assert_eq!(
            describe_watch(&watcher::Error::WatchError(Box::new(gone))),
            "the API server ended the watch: Expired (HTTP 410)"
        );
        let unnamed = kube::core::Status {
            code: 500,
            ..Default::default()
        };
        assert_eq!(
            describe(&kube::Error::Api(Box::new(unnamed))),
            "Failure (HTTP 500)"
        );
    }
}
