//! The XDP program on a real interface (issue 35): a veth pair between the
//! test's fresh network namespace (the receiver, where the program is
//! attached) and a second fresh one (the sender). Datagrams from an address
//! the sets list are dropped; from an address under a `nomatch` entry, and
//! from an unlisted one, they arrive; a delta and a full replacement of a set
//! take effect without attaching again; detach leaves no program, no link
//! and no pin of its own (the sets stay). IPv4 and IPv6.
//!
//! The sender is a thread inside the sender's namespace that sends UDP
//! datagrams from each source address (each three times, its address as
//! the payload); the receiver's socket, in the test's namespace, says which
//! arrived. No ping: nothing needs a reply or a route back.
//!
//! Needs root, iproute2, bpftool and an ipsetmgr built with its XDP
//! program (clang); without root it prints a skip message, except under
//! `CI=true`, where it fails.

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, UdpSocket};
use std::process::{Command, Output};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

use ipsetmgr_bpf::{Bpffs, Entry, xdp};
use ipsetmgr_ipset::Family;
use support::{bpftool, fresh_bpffs};

fn run(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn ok(cmd: &[&str]) {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sender's namespace, removed when the test ends.
struct Sender(String);

impl Sender {
    fn new() -> Sender {
        let name = format!("ipsetmgr-bpf-xdp-{}", std::process::id());
        ok(&["ip", "netns", "add", &name]);
        Sender(name)
    }

    fn ip(&self, args: &[&str]) {
        let mut cmd = vec!["ip", "-n", &self.0];
        cmd.extend_from_slice(args);
        ok(&cmd);
    }

    /// Send three datagrams from each of `sources` to `dst`:`port`, from a
    /// thread inside this namespace.
    fn send(&self, sources: &[&str], dst: &str, port: u16) {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap();
        let sources: Vec<IpAddr> = sources.iter().map(|s| s.parse().unwrap()).collect();
        let dst: IpAddr = dst.parse().unwrap();
        std::thread::spawn(move || {
            setns(&ns, CloneFlags::CLONE_NEWNET).expect("entering the sender's namespace");
            for src in sources {
                let sock = UdpSocket::bind((src, 0)).expect("binding a source address");
                for _ in 0..3 {
                    sock.send_to(src.to_string().as_bytes(), (dst, port))
                        .unwrap();
                }
            }
        })
        .join()
        .unwrap();
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.0]);
    }
}

fn net(s: &str, prefix: u8, nomatch: bool) -> Entry {
    Entry::new(s.parse().unwrap(), prefix, nomatch).unwrap()
}

const DST4: &str = "10.200.0.1";
const DST6: &str = "fd00:200::1";
/// Listed (10.200.0.0/25), under a nomatch (10.200.0.16/28), unlisted.
const LISTED4: &str = "10.200.0.2";
const NOMATCH4: &str = "10.200.0.17";
const UNLISTED4: &str = "10.200.0.200";
/// Listed (fd00:200::/120), under a nomatch (fd00:200::10/124), unlisted.
const LISTED6: &str = "fd00:200::2";
const NOMATCH6: &str = "fd00:200::11";
const UNLISTED6: &str = "fd00:200::1:2";

fn wire(sender: &Sender) {
    ok(&["ip", "link", "set", "lo", "up"]);
    ok(&[
        "ip", "link", "add", "vrecv", "type", "veth", "peer", "name", "vsend", "netns", &sender.0,
    ]);
    ok(&["ip", "addr", "add", "10.200.0.1/24", "dev", "vrecv"]);
    ok(&[
        "ip",
        "addr",
        "add",
        "fd00:200::1/64",
        "dev",
        "vrecv",
        "nodad",
    ]);
    ok(&["ip", "link", "set", "vrecv", "up"]);
    for a in [LISTED4, NOMATCH4, UNLISTED4] {
        sender.ip(&["addr", "add", &format!("{a}/24"), "dev", "vsend"]);
    }
    for a in [LISTED6, NOMATCH6, UNLISTED6] {
        sender.ip(&["addr", "add", &format!("{a}/64"), "dev", "vsend", "nodad"]);
    }
    sender.ip(&["link", "set", "lo", "up"]);
    sender.ip(&["link", "set", "vsend", "up"]);
}

/// Which of `sources` reach `dst` (in `sources`' order).
fn passing(sender: &Sender, dst: &str, sources: &[&str]) -> Vec<String> {
    let any: IpAddr = if dst.contains(':') {
        "::".parse().unwrap()
    } else {
        "0.0.0.0".parse().unwrap()
    };
    let sock = UdpSocket::bind((any, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    sender.send(sources, dst, sock.local_addr().unwrap().port());
    let mut got = BTreeSet::new();
    let mut buf = [0u8; 64];
    // Until half a second passes without a datagram.
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        got.insert(String::from_utf8_lossy(&buf[..n]).to_string());
    }
    sources
        .iter()
        .filter(|s| got.contains(**s))
        .map(|s| s.to_string())
        .collect()
}

/// The id of the XDP program on `vrecv`, if any (`ip -d -j link`).
fn xdp_prog_id() -> Option<u64> {
    let out = run(&["ip", "-d", "-j", "link", "show", "dev", "vrecv"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["xdp"]["prog"]["id"].as_u64()
}

fn scenario(fs: &Bpffs) {
    let sender = Sender::new();
    wire(&sender);
    let all4 = [LISTED4, NOMATCH4, UNLISTED4];
    let all6 = [LISTED6, NOMATCH6, UNLISTED6];
    assert_eq!(passing(&sender, DST4, &all4), all4, "before attaching");
    assert_eq!(passing(&sender, DST6, &all6), all6, "before attaching");

    let mut v4 = fs
        .create(
            "ipm4-drop",
            Family::V4,
            8,
            &[net("10.200.0.0", 25, false), net("10.200.0.16", 28, true)],
        )
        .unwrap();
    drop(
        fs.create(
            "ipm6-drop",
            Family::V6,
            8,
            &[
                net("fd00:200::", 120, false),
                net("fd00:200::10", 124, true),
            ],
        )
        .unwrap(),
    );
    let link = xdp::attach(fs, "vrecv", &["ipm4-drop", "ipm6-drop"]).unwrap();
    assert!(link.exists());
    let id = xdp_prog_id().expect("a program on vrecv");
    assert_eq!(passing(&sender, DST4, &all4), [NOMATCH4, UNLISTED4]);
    assert_eq!(passing(&sender, DST6, &all6), [NOMATCH6, UNLISTED6]);

    // A delta, in place: the unlisted address becomes listed, then not.
    v4.add(&[net(UNLISTED4, 32, false)]).unwrap();
    assert_eq!(passing(&sender, DST4, &all4), [NOMATCH4]);
    v4.delete(&[net(UNLISTED4, 32, false)]).unwrap();
    assert_eq!(passing(&sender, DST4, &all4), [NOMATCH4, UNLISTED4]);

    // A full replacement: only the formerly nomatch address is listed now.
    v4.replace(&[net(NOMATCH4, 32, false)], 4).unwrap();
    assert_eq!(passing(&sender, DST4, &all4), [LISTED4, UNLISTED4]);
    assert_eq!(xdp_prog_id(), Some(id), "the same program throughout");

    let err = xdp::attach(fs, "vrecv", &["ipm4-drop"]).unwrap_err();
    assert!(err.to_string().contains("already attached"), "{err}");

    xdp::detach(fs, "vrecv").unwrap();
    assert_eq!(xdp_prog_id(), None, "no program on the interface");
    assert!(!link.exists(), "no link pin");
    let out = run(&["bpftool", "prog", "show", "id", &id.to_string()]);
    assert!(!out.status.success(), "program {id} still exists");
    assert_eq!(
        std::fs::read_dir(link.parent().unwrap()).unwrap().count(),
        0,
        "nothing left in the links' directory"
    );
    assert_eq!(fs.list("ipm").unwrap(), ["ipm4-drop", "ipm6-drop"]);
    assert!(bpftool(&["link", "show"]).as_array().unwrap().is_empty());
    assert_eq!(passing(&sender, DST4, &all4), all4, "after detaching");
}

#[test]
fn xdp_drops_listed_sources_follows_set_changes_and_detaches_cleanly() {
    std::thread::spawn(|| {
        let test = "xdp_drops_listed_sources_follows_set_changes_and_detaches_cleanly";
        let Some(fs) = fresh_bpffs(test) else {
            return;
        };
        scenario(&fs);
    })
    .join()
    .unwrap();
}
