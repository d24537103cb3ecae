//! Logging setup: text or JSON on stderr, colour only at a terminal, and a
//! filter that keeps API response bodies out of the logs.
//!
//! kube's client logs the whole response body at WARN when it cannot
//! deserialize it; a list of policies can be megabytes (one object that an
//! older, looser schema let in was enough to write 48 MB of log in two
//! minutes). Those events are turned off unless `RUST_LOG` names the
//! client's target explicitly; the typed error still reaches our own logs,
//! bounded. The same for kube's watcher, whose WARN on a failed list or
//! watch is the Rust debug dump of the API's Status: our own line says it
//! as a sentence (`api_error.rs`).

use tracing_subscriber::EnvFilter;

/// Log formats on stderr.
/// (`--log-format` is `src/args.rs`'s `LogFormatArg`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// kube's targets whose WARN events carry bodies (the client) or debug
/// dumps (the watcher), and the crate name that, in `RUST_LOG`, asks for
/// them anyway.
const QUIETED: &[(&str, &str)] = &[
    ("kube_client::client", "kube_client"),
    ("kube_runtime::watcher", "kube_runtime"),
];

/// The filter for `RUST_LOG` (`env`) or the default level.
pub fn filter(env: Option<&str>, default_level: &str) -> EnvFilter {
    let spec = env
        .filter(|s| !s.trim().is_empty())
        .unwrap_or(default_level);
    let mut base = EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(default_level));
    for (target, asked_by) in QUIETED {
        // Named explicitly: the user wants to see it.
        if !spec.contains(asked_by) {
            base = base.add_directive(
                format!("{target}=error")
                    .parse()
                    .expect("a valid directive"),
            );
        }
    }
    base
}

/// Install the global subscriber.
pub fn init(format: LogFormat, default_level: &str) {
    let env = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    // Colour codes only for a person at a terminal, never in files or
    // container logs.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(env.as_deref(), default_level))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Log lines kept in memory, for tests that check what was logged: a
/// writer for a tracing subscriber whose clones share one buffer.
#[cfg(any(test, feature = "mock"))]
#[derive(Clone, Default)]
pub struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(any(test, feature = "mock"))]
impl LogBuffer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(any(test, feature = "mock"))]
impl std::io::Write for LogBuffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_policy::text::bounded;

    fn logged(env: Option<&str>, emit: impl FnOnce()) -> String {
        let buf = LogBuffer::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(env, "info"))
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        buf.text()
    }

    #[test]
    fn bounded_messages_fit_their_bound_note_included() {
        assert_eq!(bounded("short", 10), "short");
        for len in [1025, 5000, 123_456] {
            let long = "é".repeat(len);
            let b = bounded(&long, 1024);
            assert!(b.len() <= 1024, "{len}: {} bytes", b.len());
            assert!(b.ends_with(" bytes cut)"), "{b}");
        }
    }

    #[test]
    fn response_bodies_logged_by_the_kube_client_are_dropped() {
        let body = "x".repeat(100_000);
        for env in [
            None,
            Some("info"),
            Some("debug"),
            Some("warn,ipsetmgr=debug"),
        ] {
            let text = logged(env, || {
                tracing::warn!(target: "kube_client::client", "{body}, invalid value");
                tracing::warn!(target: "kube_runtime::watcher", "Api(Status {{ {body} }})");
                tracing::warn!(target: "ipsetmgr::agent", "policy watch failed");
            });
            assert!(!text.contains("xxxx"), "{env:?}: body logged");
            assert!(text.contains("policy watch failed"), "{env:?}: {text}");
        }
        // Errors of the client still show, and asking for it explicitly works.
        let text = logged(
            None,
            || tracing::error!(target: "kube_client::client", "broken"),
        );
        assert!(text.contains("broken"));
        let text = logged(
            Some("kube_client=warn"),
            || tracing::warn!(target: "kube_client::client", "{body}"),
        );
        assert!(text.contains("xxxx"));
    }

    #[test]
    fn bounded_messages() {
        assert_eq!(bounded("short", 10), "short");
        let long = "é".repeat(100);
        let b = bounded(&long, 40);
        assert!(
            b.starts_with("éééééééééé...") && b.ends_with("bytes cut)") && b.len() <= 40,
            "{b}"
        );
    }
}
