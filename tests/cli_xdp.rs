//! `ipsetmgr xdp attach` / `detach` end to end (issue 35), on a veth pair
//! between two named network namespaces: the receiver (`--netns`, where a
//! hash:net policy is applied with `--backend bpf` and the program is
//! attached) and the sender. Datagrams from a listed source are dropped,
//! from a source under a `nomatch` entry and from an unlisted one they
//! arrive; a policy change applied later takes effect without attaching
//! again; detach leaves no program on the interface and no link pin. The
//! bpffs is the test's own (`--bpf-path` at a fresh directory, mounted by
//! the binary, unmounted after). The agent's `--xdp-interface` is tested
//! here too, as a process. Needs root and iproute2; without root it
//! prints a skip message, except under `CI=true`, where it fails.

use std::collections::BTreeSet;
use std::net::{IpAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

const BIN: &str = env!("CARGO_BIN_EXE_ipsetmgr");

#[path = "common/kernel_gate.rs"]
mod kernel_gate;

const DST: &str = "10.200.0.1";
/// Listed (10.200.0.0/25), under a nomatch (10.200.0.16/28), unlisted.
const LISTED: &str = "10.200.0.2";
const NOMATCH: &str = "10.200.0.17";
const UNLISTED: &str = "10.200.0.200";

fn ok(cmd: &[&str]) -> String {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The receiver and sender namespaces and the bpffs directory, removed
/// on drop.
struct Place {
    recv: String,
    send: String,
    dir: tempfile::TempDir,
}

impl Place {
    /// `tag` tells apart the namespaces of the tests of this process.
    fn new(test: &str, tag: &str) -> Option<Place> {
        if !nix::unistd::geteuid().is_root() {
            kernel_gate::cannot_run(test, "");
            return None;
        }
        let id = std::process::id();
        let p = Place {
            recv: format!("ipsetmgr-xdp-r-{id}-{tag}"),
            send: format!("ipsetmgr-xdp-s-{id}-{tag}"),
            dir: tempfile::tempdir().unwrap(),
        };
        for ns in [&p.recv, &p.send] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            ok(&["ip", "netns", "add", ns]);
        }
        let (r, s) = (p.recv.as_str(), p.send.as_str());
        ok(&[
            "ip", "-n", r, "link", "add", "vrecv", "type", "veth", "peer", "name", "vsend",
            "netns", s,
        ]);
        ok(&[
            "ip",
            "-n",
            r,
            "addr",
            "add",
            "10.200.0.1/24",
            "dev",
            "vrecv",
        ]);
        ok(&["ip", "-n", r, "link", "set", "vrecv", "up"]);
        ok(&["ip", "-n", r, "link", "set", "lo", "up"]);
        for a in [LISTED, NOMATCH, UNLISTED] {
            ok(&[
                "ip",
                "-n",
                s,
                "addr",
                "add",
                &format!("{a}/24"),
                "dev",
                "vsend",
            ]);
        }
        ok(&["ip", "-n", s, "link", "set", "vsend", "up"]);
        ok(&["ip", "-n", s, "link", "set", "lo", "up"]);
        Some(p)
    }

    fn bpffs(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    /// `ipsetmgr --netns RECV --bpf-path DIR --backend bpf ARGS`: (exit
    /// code, stdout + stderr).
    fn ipsetmgr(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = Command::new(BIN)
            .args(["--netns", &self.recv, "--backend", "bpf", "--bpf-path"])
            .arg(self.bpffs())
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    fn apply(&self, members: &[&str]) {
        let yaml = format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: drop\nspec:\n  type: hash:net\n  family: IPv4\n  members:\n{}",
            members
                .iter()
                .map(|m| format!("    - {m}\n"))
                .collect::<String>()
        );
        let file = self.dir.path().join("drop.yaml");
        std::fs::write(&file, yaml).unwrap();
        let (code, out) = self.ipsetmgr(&["apply", "-f", file.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{out}");
    }

    /// Which of LISTED, NOMATCH, UNLISTED reach DST (in that order).
    fn passing(&self) -> Vec<&'static str> {
        let enter = |ns: &str| {
            let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            setns(&f, CloneFlags::CLONE_NEWNET).unwrap();
        };
        let (recv, send) = (self.recv.clone(), self.send.clone());
        let got = std::thread::spawn(move || {
            enter(&recv);
            let sock = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let port = sock.local_addr().unwrap().port();
            std::thread::spawn(move || {
                enter(&send);
                for src in [LISTED, NOMATCH, UNLISTED] {
                    let s = UdpSocket::bind((src.parse::<IpAddr>().unwrap(), 0)).unwrap();
                    for _ in 0..3 {
                        s.send_to(src.as_bytes(), (DST, port)).unwrap();
                    }
                }
            })
            .join()
            .unwrap();
            let mut got = BTreeSet::new();
            let mut buf = [0u8; 64];
            while let Ok((n, _)) = sock.recv_from(&mut buf) {
                got.insert(String::from_utf8_lossy(&buf[..n]).to_string());
            }
            got
        })
        .join()
        .unwrap();
        [LISTED, NOMATCH, UNLISTED]
            .into_iter()
            .filter(|s| got.contains(*s))
            .collect()
    }

    /// The id of the XDP program on vrecv, if any.
    fn prog_id(&self) -> Option<u64> {
        let out = ok(&[
            "ip", "-n", &self.recv, "-d", "-j", "link", "show", "dev", "vrecv",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["xdp"]["prog"]["id"].as_u64()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = self.ipsetmgr(&["xdp", "detach", "--interface", "vrecv"]);
        let _ = nix::mount::umount2(&self.bpffs(), nix::mount::MntFlags::MNT_DETACH);
        for ns in [&self.recv, &self.send] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn links_dir(bpffs: &Path) -> PathBuf {
    bpffs.join("ipsetmgr-xdp")
}

#[test]
fn xdp_attach_drops_a_policys_sources_follows_its_changes_and_detaches_cleanly() {
    let test = "xdp_attach_drops_a_policys_sources_follows_its_changes_and_detaches_cleanly";
    let Some(p) = Place::new(test, "cli") else {
        return;
    };
    let all = [LISTED, NOMATCH, UNLISTED];
    assert_eq!(p.passing(), all, "before attaching");
    p.apply(&["10.200.0.0/25", "10.200.0.16/28 nomatch"]);

    // A policy with no BPF set is refused, naming it.
    let (code, out) = p.ipsetmgr(&[
        "xdp",
        "attach",
        "--interface",
        "vrecv",
        "--drop-from",
        "nothere",
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("policy nothere has no BPF set"), "{out}");

    let (code, out) = p.ipsetmgr(&[
        "xdp",
        "attach",
        "--interface",
        "vrecv",
        "--drop-from",
        "drop",
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("attached to vrecv: drops packets from ipm4-drop"),
        "{out}"
    );
    let id = p.prog_id().expect("a program on vrecv");
    assert_eq!(p.passing(), [NOMATCH, UNLISTED]);

    // A policy change, applied: no attaching again.
    p.apply(&["10.200.0.0/25", "10.200.0.16/28 nomatch", "10.200.0.200"]);
    assert_eq!(p.passing(), [NOMATCH]);
    p.apply(&["10.200.0.17"]);
    assert_eq!(p.passing(), [LISTED, UNLISTED]);
    assert_eq!(p.prog_id(), Some(id), "the same program throughout");

    let (code, out) = p.ipsetmgr(&["xdp", "detach", "--interface", "vrecv"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(p.prog_id(), None, "no program on the interface");
    let status = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .unwrap()
        .status;
    assert!(!status.success(), "program {id} still exists");
    assert_eq!(
        std::fs::read_dir(links_dir(&p.bpffs())).unwrap().count(),
        0,
        "no link pin"
    );
    assert!(
        p.bpffs().join("ipsetmgr/ipm4-drop").exists(),
        "the set stays"
    );
    assert_eq!(p.passing(), all, "after detaching");
    let (code, out) = p.ipsetmgr(&["xdp", "detach", "--interface", "vrecv"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("no XDP program of ipsetmgr is attached"),
        "{out}"
    );
}

/// The agent process, killed if the test ends without stopping it.
struct Agent(std::process::Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ipsetmgr_xdp_attaches_total` from the agent's /metrics.
fn attaches(port: u16) -> Option<u64> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    conn.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("ipsetmgr_xdp_attaches_total "))
        .and_then(|v| v.trim().parse().ok())
}

/// Poll `f` every 200 ms for up to `limit`, until it is `Some`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The agent's `--xdp-interface` (docs/bpf.md, "The XDP program in the
/// agent"), as a process: its API server unreachable (the kernel side and
/// the keeper do not wait for it), the policy's set applied beforehand.
/// The agent attaches the program, attaches it again within its 10 s check
/// after a detach by hand, counts both in `ipsetmgr_xdp_attaches_total`,
/// and leaves it attached when it stops (fail static).
#[test]
fn agent_keeps_the_xdp_program_attached_and_leaves_it_on_exit() {
    let test = "agent_keeps_the_xdp_program_attached_and_leaves_it_on_exit";
    let Some(p) = Place::new(test, "agent") else {
        return;
    };
    p.apply(&["10.200.0.0/25", "10.200.0.16/28 nomatch"]);
    let kubeconfig = p.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let log = p.dir.path().join("agent.log");
    let mut agent = Agent(
        Command::new(BIN)
            .args(["--netns", &p.recv, "--backend", "bpf", "--bpf-path"])
            .arg(p.bpffs())
            .args(["agent", "--node-name", "xdp-node", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--listen", &listen, "--health-listen", &listen])
            .args(["--xdp-interface", "vrecv", "--xdp-drop-from", "drop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    let first = wait_for(Duration::from_secs(20), || p.prog_id())
        .unwrap_or_else(|| panic!("no program on vrecv; agent log:\n{}", log_text()));
    assert_eq!(p.passing(), [NOMATCH, UNLISTED]);
    assert_eq!(
        wait_for(Duration::from_secs(5), || attaches(port)),
        Some(1),
        "{}",
        log_text()
    );

    // Detached by hand: the keeper's next check (every 10 s) repairs it.
    let (code, out) = p.ipsetmgr(&["xdp", "detach", "--interface", "vrecv"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(p.prog_id(), None);
    let again = wait_for(Duration::from_secs(20), || p.prog_id())
        .unwrap_or_else(|| panic!("not attached again; agent log:\n{}", log_text()));
    assert_ne!(again, first, "a fresh program");
    assert_eq!(p.passing(), [NOMATCH, UNLISTED]);
    assert_eq!(attaches(port), Some(2), "{}", log_text());

    // Stopped, the agent leaves the program attached.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for(Duration::from_secs(30), || agent.0.try_wait().unwrap())
        .unwrap_or_else(|| panic!("the agent did not stop; log:\n{}", log_text()));
    assert!(status.success(), "{status:?}: {}", log_text());
    assert_eq!(p.prog_id(), Some(again), "fail static: still attached");
    assert_eq!(p.passing(), [NOMATCH, UNLISTED]);
}
