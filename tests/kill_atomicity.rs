//! kill -9 at random moments of `ipsetmgr apply`, against the real kernel:
//! the real set name must never hold a partial list. A new set appears
//! complete or not at all (filled under a temp name, then renamed), and a
//! full replacement leaves the old members or the new ones (temp set and
//! swap), never a mix; the next apply removes the temp sets a kill left.
//!
//! Sizes: `IPSETMGR_KILL_MEMBERS` members (default 100,000) and
//! `IPSETMGR_KILLS` kills per case and backend (default 4); the binary is
//! `IPSETMGR_BIN` (default the one Cargo built for this test). For the full
//! run of docs/performance.md: `IPSETMGR_KILL_MEMBERS=1000000
//! IPSETMGR_KILLS=20 IPSETMGR_BIN=target/release/ipsetmgr`.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/kernel_gate.rs"]
mod kernel_gate;

const SET: &str = "ipm4-big";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bin() -> String {
    std::env::var("IPSETMGR_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ipsetmgr").into())
}

/// A policy of `n` addresses from `base` (disjoint lists for old and new).
fn write_policy(path: &Path, base: Ipv4Addr, n: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(
        f,
        "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {{name: big}}\nspec:\n  type: hash:ip\n  maxElem: 2000000\n  members:"
    )
    .unwrap();
    let base = u32::from(base);
    for i in 0..n as u32 {
        writeln!(f, "    - {}", Ipv4Addr::from(base + i)).unwrap();
    }
}

fn addr(base: Ipv4Addr, i: usize) -> String {
    Ipv4Addr::from(u32::from(base) + i as u32).to_string()
}

/// A small deterministic generator: the kill moments, reproducible from the
/// printed seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

impl Netns {
    fn ipset(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0, "ipset"])
            .args(args)
            .output()
            .unwrap()
    }

    /// The set's entry count, `None` when it does not exist.
    fn count(&self) -> Option<usize> {
        let out = self.ipset(&["list", "-t", SET]);
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("Number of entries: "))
            .and_then(|n| n.trim().parse().ok())
    }

    fn has(&self, member: &str) -> bool {
        self.ipset(&["test", SET, member]).status.success()
    }

    fn temp_sets(&self) -> Vec<String> {
        let out = self.ipset(&["list", "-n"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("ipmt-"))
            .map(String::from)
            .collect()
    }

    fn apply(&self, backend: &str, policy: &Path) -> std::process::Child {
        Command::new(bin())
            .args(["--netns", &self.0, "--backend", backend, "apply", "-f"])
            .arg(policy)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn apply_to_end(&self, backend: &str, policy: &Path) -> Duration {
        let start = Instant::now();
        let status = self.apply(backend, policy).wait().unwrap();
        assert!(status.success(), "apply {} failed", policy.display());
        start.elapsed()
    }
}

/// Which list the set holds: `Some(true)` the new one, `Some(false)` the
/// old one, `None` no set; anything else (a count or sample of neither
/// list, or both) fails.
fn holds(ns: &Netns, n: usize, old: Ipv4Addr, new: Ipv4Addr, what: &str) -> Option<bool> {
    let count = ns.count()?;
    let samples = [0, n / 2, n - 1];
    let old_in = samples.iter().filter(|i| ns.has(&addr(old, **i))).count();
    let new_in = samples.iter().filter(|i| ns.has(&addr(new, **i))).count();
    match (count == n, old_in, new_in) {
        (true, 3, 0) => Some(false),
        (true, 0, 3) => Some(true),
        _ => panic!(
            "{what}: {SET} holds a partial list: {count} of {n} entries, {old_in}/3 old and {new_in}/3 new samples"
        ),
    }
}

#[test]
fn kill_9_never_leaves_a_partial_set_under_its_real_name() {
    let test = "kill_9_never_leaves_a_partial_set_under_its_real_name";
    if !nix::unistd::geteuid().is_root() {
        kernel_gate::cannot_run(test, "");
        return;
    }
    let n = env_usize("IPSETMGR_KILL_MEMBERS", 100_000);
    let kills = env_usize("IPSETMGR_KILLS", 4);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (Ipv4Addr::new(10, 0, 0, 0), Ipv4Addr::new(10, 128, 0, 0));
    let (old_file, new_file) = (dir.path().join("old.yaml"), dir.path().join("new.yaml"));
    write_policy(&old_file, old, n);
    write_policy(&new_file, new, n);
    eprintln!("{test}: {n} members, {kills} kills per case and backend, seed {seed}");
    for backend in ["netlink", "cli"] {
        let ns = Netns(format!("ipsetmgr-kill-{backend}-{}", std::process::id()));
        let _ = Command::new("ip").args(["netns", "add", &ns.0]).output();
        // How long a whole create and a whole replacement take here: the
        // kills fall anywhere within them.
        let create = ns.apply_to_end(backend, &old_file);
        let replace = ns.apply_to_end(backend, &new_file);
        let mut outcomes = [[0usize; 2]; 2];
        for (case, (from, to, took)) in [
            (None, &old_file, create),
            (Some(&new_file), &old_file, replace),
        ]
        .into_iter()
        .enumerate()
        {
            for k in 0..kills {
                // The starting point: no set (create), or the other list.
                let _ = ns.ipset(&["destroy", SET]);
                for t in ns.temp_sets() {
                    let _ = ns.ipset(&["destroy", &t]);
                }
                if let Some(first) = from {
                    ns.apply_to_end(backend, first);
                }
                let delay = Duration::from_micros(rng.next() % (took.as_micros() as u64 + 1));
                let mut child = ns.apply(backend, to);
                std::thread::sleep(delay);
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                let what = format!("{backend}, case {case}, kill {k} after {delay:?}");
                let state = holds(&ns, n, old, new, &what);
                match (case, state) {
                    // Create: absent, or the whole old list.
                    (0, None) => outcomes[case][0] += 1,
                    (0, Some(false)) => outcomes[case][1] += 1,
                    // Replacement (of the new list by the old one): the
                    // whole list it had, or the whole list it gets.
                    (1, Some(true)) => outcomes[case][0] += 1,
                    (1, Some(false)) => outcomes[case][1] += 1,
                    (_, s) => panic!("{what}: unexpected state {s:?}"),
                }
                // The next apply finishes the job and leaves no temp set.
                ns.apply_to_end(backend, to);
                assert_eq!(holds(&ns, n, old, new, &what), Some(to == &new_file));
                assert!(
                    ns.temp_sets().is_empty(),
                    "{what}: temp sets left: {:?}",
                    ns.temp_sets()
                );
            }
        }
        eprintln!(
            "{test}: {backend}: create {create:?}, replacement {replace:?}; after kills: create absent {} / complete {}, replacement still before {} / after {}",
            outcomes[0][0], outcomes[0][1], outcomes[1][0], outcomes[1][1]
        );
    }
}
