//! One writer at a time per kernel network namespace and set prefix.
//!
//! Two ipsetmgr processes writing the same owned sets undo each other: one
//! destroys the other's in-flight temp set, two `--prune` runs delete each
//! other's sets, replacements race. [`acquire`] takes an exclusive lock that
//! every command writing to the kernel holds until it exits.
//!
//! The lock is a listening unix socket bound to the *abstract* name
//! `ipsetmgr/lock/<prefix>`. Abstract socket names belong to a network
//! namespace, so the lock is per namespace by construction, and the socket
//! must be created by the thread that talks to the kernel (after it entered
//! `--netns`; `setns` moves one thread only). Managers with different
//! prefixes own disjoint sets and do not exclude each other.
//!
//! Why not a lock file: the agent runs in a container with a read-only root
//! file system and no host directories, so a file under `/run` would neither
//! be writable nor shared with an `ipsetmgr apply` run on the node itself;
//! the abstract name is shared by everything in the host network namespace.
//! The kernel frees the name when the socket's last descriptor closes, so a
//! process that crashes or is killed never leaves a stale lock, and std opens
//! sockets close-on-exec, so child processes (`ip`, `ipset`) cannot keep it.
//!
//! Abstract names have no permissions: any process in the namespace could
//! bind the name first. A waiter therefore asks the kernel who holds it
//! (`SO_PEERCRED` of a connection to the listener): a holder that is neither
//! root nor running as our own user cannot be an ipsetmgr writing ipsets, and
//! is ignored with a warning rather than allowed to block the agent forever.

use std::fmt;
use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use ipsetmgr_ipset::Naming;

/// How often a waiting process retries the lock.
const POLL: Duration = Duration::from_millis(100);

/// At most this much of the holder's command line is read to name it.
const CMDLINE_READ_LIMIT: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot take the writer lock {name:?}: {source}")]
    Socket {
        name: String,
        source: std::io::Error,
    },
    #[error(
        "another ipsetmgr is writing the ipsets with prefix {prefix:?} in this network namespace \
         (held by {holder}); gave up {}; wait longer with --lock-wait DURATION \
         (or IPSETMGR_LOCK_WAIT), or stop that process",
        gave_up(.wait)
    )]
    Busy {
        prefix: String,
        holder: Holder,
        wait: Duration,
    },
}

fn gave_up(wait: &Duration) -> String {
    if wait.is_zero() {
        "at once (--lock-wait 0)".to_string()
    } else {
        format!("after waiting {wait:?}")
    }
}

/// Who holds a busy lock, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    /// 0 when the holder is in a PID namespace we cannot see.
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    /// The ipsetmgr subcommand (`apply`, `run`, `agent`) on its command line.
    pub command: Option<String>,
}

impl Holder {
    /// The subcommand on a NUL-separated command line, if it is one of ours.
    fn command_of(cmdline: &[u8]) -> Option<String> {
        cmdline
            .split(|b| *b == 0)
            .skip(1)
            .find_map(|arg| match arg {
                b"apply" | b"run" | b"agent" | b"controller" => {
                    Some(String::from_utf8_lossy(arg).into_owned())
                }
                _ => None,
            })
    }

    /// Whether this holder can be a process that writes ipsets: root, or our
    /// own user (a non-root user given CAP_NET_ADMIN).
    fn may_write_ipsets(&self) -> bool {
        self.uid
            .is_none_or(|uid| uid == 0 || uid == nix::unistd::geteuid().as_raw())
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.pid.filter(|p| *p != 0), &self.command) {
            (Some(pid), Some(cmd)) => write!(f, "pid {pid}, ipsetmgr {cmd}")?,
            (Some(pid), None) => write!(f, "pid {pid}")?,
            (None, _) => f.write_str("a process in another PID namespace")?,
        }
        if let Some(uid) = self.uid.filter(|u| *u != 0) {
            write!(f, ", uid {uid}")?;
        }
        Ok(())
    }
}

/// Holds the lock; dropping it (or the process exiting) releases it.
#[derive(Debug)]
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    /// `None` when a squatter that cannot write ipsets held the name.
    _listener: Option<UnixListener>,
}

/// The abstract socket name of the lock for `prefix`.
pub fn lock_name(prefix: &str) -> String {
    format!("ipsetmgr/lock/{prefix}")
}

/// Take the lock for `naming`'s sets in the calling thread's network
/// namespace. While another process holds it, say so once on stderr and
/// retry every 100 ms for up to `wait` (`Duration::ZERO`: fail at once).
pub fn acquire(naming: &Naming, command: &str, wait: Duration) -> Result<LockGuard, LockError> {
    acquire_named(&lock_name(naming.prefix()), naming.prefix(), command, wait)
}

/// [`acquire`] under an explicit socket name (tests use their own).
fn acquire_named(
    name: &str,
    prefix: &str,
    command: &str,
    wait: Duration,
) -> Result<LockGuard, LockError> {
    let socket_error = |source| LockError::Socket {
        name: name.to_string(),
        source,
    };
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(socket_error)?;
    let start = Instant::now();
    let mut announced = false;
    loop {
        match UnixListener::bind_addr(&addr) {
            Ok(listener) => {
                if announced {
                    tracing::info!(lock = name, waited = ?start.elapsed(), "acquired the lock");
                }
                tracing::debug!(lock = name, command, "holding the writer lock");
                return Ok(LockGuard {
                    _listener: Some(listener),
                });
            }
            Err(e) if e.kind() == ErrorKind::AddrInUse => {}
            Err(e) => return Err(socket_error(e)),
        }
        let holder = holder_of(&addr);
        if !holder.may_write_ipsets() {
            tracing::warn!(
                lock = name,
                %holder,
                "the writer lock is held by a process that cannot write ipsets; ignoring it"
            );
            return Ok(LockGuard { _listener: None });
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(LockError::Busy {
                prefix: prefix.to_string(),
                holder,
                wait,
            });
        }
        if !announced {
            announced = true;
            eprintln!(
                "waiting for the lock on ipsets with prefix {prefix:?} in this network namespace (held by {holder})"
            );
        }
        std::thread::sleep(POLL.min(wait - waited));
    }
}

/// Ask the kernel who listens on `addr`: a connection's `SO_PEERCRED` names
/// the process that called `listen`. The connection is never accepted; it
/// only waits in the backlog until we close it. Unknown parts stay `None`.
fn holder_of(addr: &SocketAddr) -> Holder {
    let Ok(stream) = UnixStream::connect_addr(addr) else {
        return Holder::default();
    };
    let Ok(cred) =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
    else {
        return Holder::default();
    };
    let pid = u32::try_from(cred.pid()).ok();
    let command = pid
        .filter(|p| *p != 0)
        .and_then(|p| read_bounded(&format!("/proc/{p}/cmdline")))
        .and_then(|c: Vec<u8>| Holder::command_of(&c));
    Holder {
        pid,
        uid: Some(cred.uid()),
        command,
    }
}

fn read_bounded(path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(CMDLINE_READ_LIMIT as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket name no other test (or real ipsetmgr) uses.
    fn unique(tag: &str) -> String {
        format!("ipsetmgr/lock-test/{}/{tag}", std::process::id())
    }

    #[test]
    fn a_second_taker_is_refused_and_told_who_holds_it() {
        let name = unique("refused");
        let _held = acquire_named(&name, "ipm", "run", Duration::ZERO).expect("first");
        let start = Instant::now();
        let err = acquire_named(&name, "ipm", "apply", Duration::ZERO).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "wait 0 fails at once"
        );
        let LockError::Busy { ref holder, .. } = err else {
            panic!("expected Busy, got {err:?}");
        };
        assert_eq!(holder.pid, Some(std::process::id()));
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("held by pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("--lock-wait"), "{msg}");
        assert!(msg.contains("prefix \"ipm\""), "{msg}");
    }

    #[test]
    fn a_waiting_taker_gets_the_lock_when_the_holder_lets_go() {
        let name = unique("wait");
        let held = acquire_named(&name, "ipm", "run", Duration::ZERO).expect("first");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let start = Instant::now();
        let _got = acquire_named(&name, "ipm", "apply", Duration::from_secs(10))
            .expect("acquired after the holder dropped its guard");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        release.join().expect("release thread");
    }

    #[test]
    fn a_wait_that_runs_out_says_how_long() {
        let name = unique("timeout");
        let _held = acquire_named(&name, "ipm", "agent", Duration::ZERO).expect("first");
        let start = Instant::now();
        let err = acquire_named(&name, "ipm", "apply", Duration::from_millis(300)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert!(err.to_string().contains("after waiting 300ms"), "{err}");
    }

    #[test]
    fn other_prefixes_do_not_conflict() {
        let _a = acquire_named(&unique("p-ipm"), "ipm", "run", Duration::ZERO).expect("ipm");
        let _b = acquire_named(&unique("p-other"), "other", "run", Duration::ZERO).expect("other");
        assert_ne!(lock_name("ipm"), lock_name("other"));
    }

    #[test]
    fn the_lock_belongs_to_the_network_namespace() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "needs root to create a network namespace (CI=true: this test must run)"
            );
            eprintln!("skipped: needs root to create a network namespace");
            return;
        }
        let name = unique("netns");
        let _here = acquire_named(&name, "ipm", "run", Duration::ZERO).expect("here");
        let name2 = name.clone();
        let there = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            acquire_named(&name2, "ipm", "run", Duration::ZERO).map(|_| ())
        })
        .join()
        .expect("thread");
        assert!(
            there.is_ok(),
            "another namespace has its own lock: {there:?}"
        );
    }

    #[test]
    fn holder_command_lines_are_read_defensively() {
        assert_eq!(
            Holder::command_of(b"/usr/bin/ipsetmgr\0--netns\0x\0run\0--policy-dir\0d\0"),
            Some("run".into())
        );
        assert_eq!(
            Holder::command_of(b"run\0"),
            None,
            "the program name is skipped"
        );
        assert_eq!(Holder::command_of(b"evil\0\x1b[2J\0"), None);
        let h = Holder {
            pid: Some(0),
            uid: Some(1000),
            command: None,
        };
        assert_eq!(
            h.to_string(),
            "a process in another PID namespace, uid 1000"
        );
    }

    #[test]
    fn a_squatter_that_cannot_write_ipsets_does_not_block() {
        let squatter = Holder {
            pid: Some(1),
            uid: Some(nix::unistd::geteuid().as_raw().wrapping_add(4242)),
            command: None,
        };
        let own = Holder {
            uid: Some(nix::unistd::geteuid().as_raw()),
            ..squatter.clone()
        };
        assert!(!squatter.may_write_ipsets());
        assert!(own.may_write_ipsets());
        assert!(
            Holder::default().may_write_ipsets(),
            "unknown: assume a writer"
        );
    }
}
