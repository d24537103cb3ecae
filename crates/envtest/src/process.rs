//! One child process of the control plane: its output in a log file, and a
//! stop that always ends it (SIGTERM, then SIGKILL after a grace period).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::watchdog::Watchdog;

pub(crate) struct Proc {
    pub log: PathBuf,
    child: Child,
    /// Stops it should this process end first; told when it is stopped.
    watchdog: Arc<Mutex<Watchdog>>,
}

impl Proc {
    pub fn spawn(
        program: &Path,
        args: &[String],
        log: PathBuf,
        watchdog: Arc<Mutex<Watchdog>>,
    ) -> std::io::Result<Proc> {
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()?;
        crate::lock(&watchdog).watch(child.id());
        Ok(Proc {
            log,
            child,
            watchdog,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of its log, for failure messages.
    pub fn tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// End it: SIGTERM, up to `grace` to exit, then SIGKILL; once it is
    /// reaped, the watchdog forgets its pid.
    pub fn stop(&mut self, grace: Duration) {
        self.end(grace);
        crate::lock(&self.watchdog).forget(self.child.id());
    }

    fn end(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < grace {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
