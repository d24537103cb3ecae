//! Running the kernel side of a command inside a named network namespace
//! (`--netns NAME`, created when missing), so a run never touches the host's
//! own firewall.
//!
//! `setns` moves only the calling thread, and every thread and child process
//! it creates afterwards inherits the namespace. So the kernel side of every
//! command (the netlink socket, `ipset` child processes, the writer lock)
//! runs on a thread of its own that entered the namespace first
//! ([`run_in`], [`spawn_in`]), while the rest of the process (the API
//! client, the health listener, the file watcher) stays where it was.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use nix::sched::{CloneFlags, setns};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "invalid network namespace name {0:?}: use 1-64 letters, digits, '-', '_' or '.', not starting with '.'"
    )]
    BadName(String),
    #[error("could not create network namespace {name}: {reason}")]
    Create { name: String, reason: String },
    #[error("could not open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "could not enter network namespace {name}: {source} (entering a namespace needs root or CAP_SYS_ADMIN)"
    )]
    Enter { name: String, source: nix::Error },
}

/// A namespace name as `ip netns` accepts it; it also becomes a path, so no
/// `/` and no leading dot.
pub fn validate_name(name: &str) -> Result<(), NetnsError> {
    if ipsetmgr_ipset::is_path_component(name, 64) {
        Ok(())
    } else {
        Err(NetnsError::BadName(name.to_string()))
    }
}

/// Enter the named namespace, creating it with `ip netns add` when missing.
/// Returns whether it was created.
pub fn enter(name: &str) -> Result<bool, NetnsError> {
    validate_name(name)?;
    let path = PathBuf::from(NETNS_DIR).join(name);
    let mut created = false;
    if !path.exists() {
        // The name was validated above; it is passed as one argv entry, no shell.
        let out = Command::new("ip")
            .args(["netns", "add", name])
            .output()
            .map_err(|e| NetnsError::Create {
                name: name.to_string(),
                reason: format!("running `ip netns add`: {e} (is iproute2 installed?)"),
            })?;
        if !out.status.success() {
            return Err(NetnsError::Create {
                name: name.to_string(),
                reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        created = true;
    }
    let file = File::open(&path).map_err(|source| NetnsError::Open {
        path: path.clone(),
        source,
    })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
        name: name.to_string(),
        source,
    })?;
    Ok(created)
}

/// Run `f` on a new thread inside namespace `ns` (`None`: the caller's own)
/// and return its result; the caller's thread never moves.
pub fn run_in<T: Send>(ns: Option<&str>, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<T, NetnsError> {
                enter_announced(ns)?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Start `f` on a named thread inside namespace `ns` (`None`: the caller's
/// own); the thread ends when `f` returns.
pub fn spawn_in<T: Send + 'static>(
    ns: Option<String>,
    thread_name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<Result<T, NetnsError>>> {
    std::thread::Builder::new()
        .name(thread_name.to_string())
        .spawn(move || {
            enter_announced(ns.as_deref())?;
            Ok(f())
        })
}

/// [`enter`] the namespace if there is one, saying so when it was created.
fn enter_announced(ns: Option<&str>) -> Result<(), NetnsError> {
    if let Some(ns) = ns
        && enter(ns)?
    {
        eprintln!("created network namespace {ns}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_are_rejected() {
        for bad in [
            "",
            "../etc",
            "a/b",
            ".hidden",
            "a b",
            "x\n",
            &"n".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        for good in ["demo", "ipsetmgr-test_1", "ns.2"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
    }
}
