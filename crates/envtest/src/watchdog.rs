//! The control plane's watchdog: a small `sh` process that stops etcd and
//! the API server and removes their directory when the test process is gone
//! without having stopped them itself.
//!
//! Why a process: the shared control planes live in statics, which are
//! never dropped, so nothing inside the test process runs when it exits
//! (short of an `atexit` handler, which is `unsafe` and does not run when
//! the process is killed). The watchdog reads commands from a pipe whose
//! only write end this process holds (std opens it close-on-exec, so no
//! other child inherits it). When this process ends in any way (libtest
//! returning or calling `exit` after a failed test, a panic, a signal, a
//! SIGKILL) the kernel closes that end and the watchdog reads end-of-file:
//! it sends SIGTERM to every process still watched, SIGKILL after a grace
//! period, and removes the directory. A control plane stopped by the test
//! says `done` first, and the watchdog exits without touching anything.
//!
//! The watchdog runs in a process group of its own, so a Ctrl-C at the
//! terminal, which ends the test process, does not end it before it has
//! cleaned up.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

/// `$1`: the directory to remove. Commands on stdin, one per line:
/// `watch PID`, `forget PID`, `done`.
const SCRIPT: &str = r#"
pids=
while read -r verb arg; do
  case $verb in
    watch) pids="$pids $arg" ;;
    forget) keep=; for p in $pids; do [ "$p" = "$arg" ] || keep="$keep $p"; done; pids=$keep ;;
    done) exit 0 ;;
  esac
done
for p in $pids; do kill -TERM "$p" 2>/dev/null; done
# Up to 5 s for them to exit (a zombie, not yet reaped by init, has exited).
i=0
while [ $i -lt 50 ]; do
  alive=
  for p in $pids; do
    state=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)
    [ -n "$state" ] && [ "$state" != Z ] && alive=1
  done
  [ -z "$alive" ] && break
  sleep 0.1
  i=$((i+1))
done
for p in $pids; do kill -KILL "$p" 2>/dev/null; done
sleep 0.2
rm -rf "$1"
"#;

pub(crate) struct Watchdog {
    child: Child,
    /// The pipe's write end; closing it (by exiting) is the signal.
    commands: ChildStdin,
}

impl Watchdog {
    /// Start a watchdog that removes `dir` when this process is gone.
    pub fn start(dir: &Path) -> std::io::Result<Watchdog> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("ipsetmgr-envtest-watchdog")
            .arg(dir)
            .stdin(Stdio::piped())
            // Never hold a pipe of the test's output open after the test
            // process has exited: `cargo test | …` would wait for it.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let commands = child.stdin.take().expect("stdin was piped");
        Ok(Watchdog { child, commands })
    }

    fn send(&mut self, line: &str) {
        // A watchdog that is gone cannot be told anything; the test's own
        // stop still runs.
        let _ = writeln!(self.commands, "{line}");
    }

    /// Stop `pid` if this process is gone first.
    pub fn watch(&mut self, pid: u32) {
        self.send(&format!("watch {pid}"));
    }

    /// `pid` was stopped (and reaped) by the test: leave it alone.
    pub fn forget(&mut self, pid: u32) {
        self.send(&format!("forget {pid}"));
    }

    /// Everything was stopped by the test: exit without cleaning up.
    pub fn done(&mut self) {
        self.send("done");
        let _ = self.child.wait();
    }
}
