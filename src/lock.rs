//! One writer at a time per kernel network namespace and set prefix.
//!
//! Two ipsetmgr processes writing the same owned sets undo each other: one
//! destroys the other's in-flight temp set, two `--prune` runs delete each
//! other's sets, replacements race. [`acquire`] takes an exclusive lock that
//! every command writing to the kernel holds until it exits.
//!
//! The key is the network namespace as seen by the *calling thread*
//! (`/proc/thread-self/ns/net`: `setns` moves one thread only, so the thread
//! that talks to the kernel must take the lock after entering the namespace)
//! plus the set prefix: managers with different prefixes own disjoint sets and
//! do not exclude each other.
//!
//! The lock is `flock(2)` (through [`File::try_lock`]) on
//! `<dir>/<prefix>-netns-<dev>-<ino>.lock`, where `<dir>` is `/run/ipsetmgr`
//! or the absolute path in the environment variable `IPSETMGR_LOCK_DIR`
//! (tests point it at a temporary directory). The kernel drops an flock when
//! the last descriptor of its open file goes away, so a process that crashes
//! or is killed never leaves a stale lock behind; the file itself is never
//! deleted (a waiter could otherwise lock an unlinked file while a newcomer
//! locks a fresh one). The holder writes `<pid> <command>` into it, which a
//! waiting process reads only to say who it is waiting for.

use std::fmt;
use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ipset::Naming;

/// Where the lock files live unless `IPSETMGR_LOCK_DIR` says otherwise.
pub const DEFAULT_LOCK_DIR: &str = "/run/ipsetmgr";

/// The environment variable that overrides [`DEFAULT_LOCK_DIR`].
pub const LOCK_DIR_ENV: &str = "IPSETMGR_LOCK_DIR";

/// How often a waiting process retries the lock.
const POLL: Duration = Duration::from_millis(100);

/// At most this much of a lock file is read to name its holder: the file is
/// one short line, and a waiter should not read whatever else was put there.
const HOLDER_READ_LIMIT: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot identify this thread's network namespace (/proc/thread-self/ns/net): {0}")]
    Netns(std::io::Error),
    #[error("{LOCK_DIR_ENV} must be an absolute path, got {0:?}")]
    RelativeDir(PathBuf),
    #[error("cannot create the lock directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the lock file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "another ipsetmgr is writing the ipsets with prefix {prefix:?} in this network namespace \
         (held by {holder}; lock file {path}); gave up {}; wait longer with --lock-wait DURATION \
         (or IPSETMGR_LOCK_WAIT), or stop that process",
        gave_up(.wait)
    )]
    Busy {
        prefix: String,
        holder: Holder,
        wait: Duration,
        path: PathBuf,
    },
}

fn gave_up(wait: &Duration) -> String {
    if wait.is_zero() {
        "at once (--lock-wait 0)".to_string()
    } else {
        format!("after waiting {wait:?}")
    }
}

/// The identity of a network namespace: the device and inode of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

/// The network namespace of the calling thread (not of the process: after
/// `setns` on one thread the two differ).
pub fn current_netns() -> Result<NetnsId, LockError> {
    let meta = std::fs::metadata("/proc/thread-self/ns/net").map_err(LockError::Netns)?;
    Ok(NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// Who holds a busy lock, as it recorded itself in the lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: Option<u32>,
    pub command: Option<String>,
}

impl Holder {
    /// Parse `<pid> <command>`; anything else yields unknown parts. The
    /// command is cut to a short word of safe characters, since it is printed.
    fn parse(bytes: &[u8]) -> Holder {
        let text = String::from_utf8_lossy(bytes);
        let line = text.lines().next().unwrap_or_default();
        let (pid, command) = line.split_once(' ').unwrap_or((line, ""));
        let command: String = command
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
            .take(32)
            .collect();
        Holder {
            pid: pid.parse().ok(),
            command: (!command.is_empty()).then_some(command),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.pid, &self.command) {
            (Some(pid), Some(cmd)) => write!(f, "pid {pid}, ipsetmgr {cmd}"),
            (Some(pid), None) => write!(f, "pid {pid}"),
            // The holder has not written its line yet (or the file was altered).
            (None, _) => write!(f, "a process that did not record its pid"),
        }
    }
}

/// Holds the lock; dropping it (or the process exiting) releases it.
#[derive(Debug)]
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    // Never read: owning the open file is what holds the flock.
    _file: File,
    path: PathBuf,
}

impl LockGuard {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The lock directory: `IPSETMGR_LOCK_DIR` when set and not empty, else
/// [`DEFAULT_LOCK_DIR`].
pub fn lock_dir() -> PathBuf {
    std::env::var_os(LOCK_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LOCK_DIR))
}

/// Take the lock for `naming`'s sets in the calling thread's network
/// namespace, recording `command` as the holder. While another process holds
/// it, say so once on stderr and retry every 100 ms for up to `wait`
/// (`Duration::ZERO`: fail at once).
pub fn acquire(naming: &Naming, command: &str, wait: Duration) -> Result<LockGuard, LockError> {
    let netns = current_netns()?;
    acquire_in(&lock_dir(), netns, naming.prefix(), command, wait)
}

/// [`acquire`] with the directory and namespace given, so tests need not
/// touch the process-wide environment.
fn acquire_in(
    dir: &Path,
    netns: NetnsId,
    prefix: &str,
    command: &str,
    wait: Duration,
) -> Result<LockGuard, LockError> {
    // Two processes started from different directories must meet on one file.
    if !dir.is_absolute() {
        return Err(LockError::RelativeDir(dir.to_path_buf()));
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|source| LockError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    let path = dir.join(format!("{prefix}-netns-{}-{}.lock", netns.dev, netns.ino));
    let file = open_lock_file(&path)?;

    let start = Instant::now();
    let mut announced = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(source)) => return Err(LockError::Lock { path, source }),
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(LockError::Busy {
                prefix: prefix.to_string(),
                holder: read_holder(&file),
                wait,
                path,
            });
        }
        if !announced {
            announced = true;
            let holder = read_holder(&file);
            eprintln!(
                "waiting for the lock on ipsets with prefix {prefix:?} in this network namespace (held by {holder})"
            );
            tracing::info!(lock = %path.display(), %holder, ?wait, "waiting for the lock");
        }
        std::thread::sleep(POLL.min(wait - waited));
    }
    if announced {
        tracing::info!(lock = %path.display(), waited = ?start.elapsed(), "acquired the lock");
    }
    record_holder(&file, &path, command);
    Ok(LockGuard { _file: file, path })
}

/// Open (or create) the lock file without truncating it: the current
/// holder's line must survive until the lock is ours.
fn open_lock_file(path: &Path) -> Result<File, LockError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        // A symlink planted in the directory must not make us truncate its
        // target. std opens with O_CLOEXEC, so child processes (`ip`,
        // `ipset`) never inherit the descriptor and keep the lock alive.
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| LockError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// Replace the file's content with `<pid> <command>`. Only waiters' messages
/// depend on it, so a failure is logged, not fatal.
fn record_holder(file: &File, path: &Path, command: &str) {
    let line = format!("{} {command}\n", std::process::id());
    let written = file
        .set_len(0)
        .and_then(|()| file.write_all_at(line.as_bytes(), 0));
    if let Err(e) = written {
        tracing::warn!(lock = %path.display(), "could not record this process as the lock holder: {e}");
    }
}

/// The holder's line, read from the start of the file up to
/// [`HOLDER_READ_LIMIT`] bytes; unreadable means unknown.
fn read_holder(file: &File) -> Holder {
    let mut buf = [0u8; HOLDER_READ_LIMIT];
    let mut len = 0;
    while len < buf.len() {
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
    }
    Holder::parse(&buf[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: NetnsId = NetnsId { dev: 4, ino: 42 };

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    #[test]
    fn a_second_taker_is_refused_and_told_who_holds_it() {
        let d = dir();
        let held = acquire_in(d.path(), NS, "ipm", "run", Duration::ZERO).expect("first");
        let content = std::fs::read_to_string(held.path()).expect("lock file");
        assert_eq!(content, format!("{} run\n", std::process::id()));

        // A second open file: flock locks belong to the open file description,
        // so this conflicts even inside one process.
        let start = Instant::now();
        let err = acquire_in(d.path(), NS, "ipm", "apply", Duration::ZERO).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "wait 0 fails at once"
        );
        let LockError::Busy { ref holder, .. } = err else {
            panic!("expected Busy, got {err:?}");
        };
        assert_eq!(holder.pid, Some(std::process::id()));
        assert_eq!(holder.command.as_deref(), Some("run"));
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("held by pid {}, ipsetmgr run", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("--lock-wait"), "{msg}");
        assert!(msg.contains("prefix \"ipm\""), "{msg}");
        // The refused taker did not overwrite the holder's line.
        assert_eq!(std::fs::read_to_string(held.path()).unwrap(), content);
    }

    #[test]
    fn a_waiting_taker_gets_the_lock_when_the_holder_lets_go() {
        let d = dir();
        let held = acquire_in(d.path(), NS, "ipm", "run", Duration::ZERO).expect("first");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let start = Instant::now();
        let got = acquire_in(d.path(), NS, "ipm", "apply", Duration::from_secs(10))
            .expect("acquired after the holder dropped its guard");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        release.join().expect("release thread");
        assert_eq!(
            std::fs::read_to_string(got.path()).unwrap(),
            format!("{} apply\n", std::process::id())
        );
    }

    #[test]
    fn a_wait_that_runs_out_names_the_holder() {
        let d = dir();
        let _held = acquire_in(d.path(), NS, "ipm", "agent", Duration::ZERO).expect("first");
        let start = Instant::now();
        let err = acquire_in(d.path(), NS, "ipm", "apply", Duration::from_millis(300)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(300));
        let msg = err.to_string();
        assert!(msg.contains("ipsetmgr agent"), "{msg}");
        assert!(msg.contains("after waiting 300ms"), "{msg}");
    }

    #[test]
    fn other_prefixes_and_namespaces_do_not_conflict() {
        let d = dir();
        let _a = acquire_in(d.path(), NS, "ipm", "run", Duration::ZERO).expect("ipm");
        let _b = acquire_in(d.path(), NS, "other", "run", Duration::ZERO).expect("other prefix");
        let ns2 = NetnsId { ino: 43, ..NS };
        let _c = acquire_in(d.path(), ns2, "ipm", "run", Duration::ZERO).expect("other netns");
        let mut files: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(
            files,
            [
                "ipm-netns-4-42.lock",
                "ipm-netns-4-43.lock",
                "other-netns-4-42.lock"
            ]
        );
    }

    #[test]
    fn the_directory_is_created_and_must_be_absolute() {
        let d = dir();
        let nested = d.path().join("a/b");
        let g = acquire_in(&nested, NS, "ipm", "run", Duration::ZERO).expect("nested dir");
        assert!(g.path().starts_with(&nested));
        let err = acquire_in(Path::new("relative"), NS, "ipm", "run", Duration::ZERO).unwrap_err();
        assert!(matches!(err, LockError::RelativeDir(_)), "{err:?}");
    }

    #[test]
    fn a_symlinked_lock_file_is_not_followed() {
        let d = dir();
        let target = d.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        std::os::unix::fs::symlink(&target, d.path().join("ipm-netns-4-42.lock")).unwrap();
        let err = acquire_in(d.path(), NS, "ipm", "run", Duration::ZERO).unwrap_err();
        assert!(matches!(err, LockError::Open { .. }), "{err:?}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn holder_lines_are_parsed_defensively() {
        assert_eq!(
            Holder::parse(b"1234 apply\n"),
            Holder {
                pid: Some(1234),
                command: Some("apply".into())
            }
        );
        assert_eq!(
            Holder::parse(b"").to_string(),
            "a process that did not record its pid"
        );
        assert_eq!(Holder::parse(b"77").to_string(), "pid 77");
        let odd = Holder::parse(b"5 run\x1b[2J; rm -rf /\n");
        assert_eq!(odd.command.as_deref(), Some("run"));
    }

    #[test]
    fn the_calling_threads_namespace_is_stable() {
        let a = current_netns().expect("own netns");
        let b = std::thread::spawn(current_netns)
            .join()
            .unwrap()
            .expect("thread netns");
        assert_eq!(a, b, "a new thread starts in its creator's namespace");
    }
}
