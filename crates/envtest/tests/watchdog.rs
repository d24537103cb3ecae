//! The shared control plane (a static, never dropped) is stopped and its
//! directory removed when the test process ends, however it ends: libtest
//! returning after passing tests, libtest exiting after a failed
//! (panicking) test, and the process killed with SIGKILL
//! (`src/watchdog.rs`).
//!
//! This binary runs itself as the test process: `child_process` starts the
//! shared plane only when `CHILD` is set.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipsetmgr_envtest::{Server, cannot_run, shared};

const CHILD: &str = "IPSETMGR_ENVTEST_WATCHDOG_CHILD";

/// The test process of the test below (this binary, running only this
/// test, with `CHILD` set): it starts the shared plane, prints its pids and
/// directory, and ends as `CHILD` says. Without `CHILD` it does nothing.
#[tokio::test]
async fn child_process() {
    let Ok(how) = std::env::var(CHILD) else {
        return;
    };
    let Some(plane) = shared("watchdog child", Server::Newest).await else {
        println!("skip");
        return;
    };
    let (etcd, apiserver) = plane.pids();
    println!(
        "plane {} {} {}",
        etcd.unwrap(),
        apiserver.unwrap(),
        plane.dir().display()
    );
    match how.as_str() {
        "exit" => {}
        "panic" => panic!("a failing test"),
        // Until the parent kills it.
        _ => std::thread::sleep(Duration::from_secs(600)),
    }
}

/// Is `pid` a live process (not gone, not a zombie waiting to be reaped)?
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.to_string()))
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// Run the child, ending as `how` says; `None` if it could not start a
/// plane here.
fn run_child(how: &str) -> Option<(u32, u32, PathBuf)> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process", "--nocapture"])
        .env(CHILD, how)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("running this test binary again");
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut plane = None;
    // Read to the end: a child whose stdout is closed fails its next print.
    for line in out.lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("plane ") {
            let mut f = rest.splitn(3, ' ');
            let etcd: u32 = f.next().unwrap().parse().unwrap();
            let apiserver: u32 = f.next().unwrap().parse().unwrap();
            plane = Some((etcd, apiserver, PathBuf::from(f.next().unwrap())));
            if how == "kill" {
                child.kill().unwrap();
            }
        }
    }
    let status = child.wait().unwrap();
    let plane = plane?;
    match how {
        "exit" => assert!(status.success(), "{how}: {status}"),
        "panic" => assert_eq!(status.code(), Some(101), "{how}: {status}"),
        _ => assert_eq!(status.code(), None, "{how}: {status}"),
    }
    Some(plane)
}

fn stopped(etcd: u32, apiserver: u32, dir: &Path) -> bool {
    !alive(etcd) && !alive(apiserver) && !dir.exists()
}

#[test]
fn the_shared_plane_is_stopped_however_the_test_process_ends() {
    for how in ["exit", "panic", "kill"] {
        let Some((etcd, apiserver, dir)) = run_child(how) else {
            cannot_run(
                "the_shared_plane_is_stopped_however_the_test_process_ends",
                &"the child could not start a control plane (see above)",
            );
            return;
        };
        // The watchdog needs up to about 5 s for processes that ignore
        // SIGTERM.
        let start = Instant::now();
        while !stopped(etcd, apiserver, &dir) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            stopped(etcd, apiserver, &dir),
            "after the test process ended ({how}): etcd {etcd} alive: {}, kube-apiserver \
             {apiserver} alive: {}, {} exists: {}",
            alive(etcd),
            alive(apiserver),
            dir.display(),
            dir.exists()
        );
    }
}
