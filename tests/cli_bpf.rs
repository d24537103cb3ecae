//! End-to-end tests of the `ipsetmgr` binary with the BPF backend beside
//! the ipset one (`--backend netlink,bpf`), against the real kernel: each
//! test creates its own named network namespace (the binary's `--netns`
//! enters it) and its own bpffs (`--bpf-path` at a fresh directory, which
//! the binary mounts because nothing is mounted there; unmounted after).
//! Without root they skip; under `CI=true` they fail instead.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use ipsetmgr_bpf::Entry;
use ipsetmgr_ipset::{Member, Naming, SetType};
use ipsetmgr_policy::{compile, load_policies};

const BIN: &str = env!("CARGO_BIN_EXE_ipsetmgr");

#[path = "../crates/bpf/tests/support/mod.rs"]
mod support;
use support::kernel_gate;

/// A named network namespace and a bpffs directory of the test's own,
/// both removed on drop.
struct Place {
    netns: String,
    dir: tempfile::TempDir,
}

impl Place {
    fn new(tag: &str) -> Option<Place> {
        if !nix::unistd::geteuid().is_root() {
            kernel_gate::cannot_run(tag, "");
            return None;
        }
        let netns = format!("ipsetmgr-bpf-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &netns]).output();
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            kernel_gate::cannot_run(tag, " (`ip netns add` failed)");
            return None;
        }
        Some(Place {
            netns,
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn bpffs(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    /// `ipsetmgr --netns NS --bpf-path DIR --backend B ARGS`: (exit code,
    /// stdout, stderr).
    fn ipsetmgr(&self, backend: &str, args: &[&str]) -> (Option<i32>, String, String) {
        let out = Command::new(BIN)
            .args(["--netns", &self.netns, "--backend", backend, "--bpf-path"])
            .arg(self.bpffs())
            .args(args)
            .output()
            .expect("run ipsetmgr");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn pin(&self, set: &str) -> PathBuf {
        self.bpffs().join("ipsetmgr").join(set)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.bpffs(), nix::mount::MntFlags::MNT_DETACH);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
    }
}

/// The result table's rows as (policy, backend, set, result), cells cut
/// where the header's words start.
fn rows(output: &str) -> Vec<[String; 4]> {
    let mut lines = output.lines().skip_while(|l| !l.starts_with("POLICY "));
    let header = lines.next().expect("a result table");
    let words: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        words,
        [
            "POLICY", "BACKEND", "SET", "TYPE", "MEMBERS", "PROBLEMS", "RESULT"
        ],
        "{header}"
    );
    let starts: Vec<usize> = words.iter().map(|w| header.find(w).unwrap()).collect();
    let cell = |l: &str, i: usize| -> String {
        let end = starts.get(i + 1).copied().unwrap_or(l.len()).min(l.len());
        l.get(starts[i]..end).unwrap_or("").trim().to_string()
    };
    lines
        .take_while(|l| l.len() > starts[6] && l.get(starts[6] - 2..starts[6]) == Some("  "))
        .map(|l| [cell(l, 0), cell(l, 1), cell(l, 2), cell(l, 6)])
        .collect()
}

fn result(rows: &[[String; 4]], backend: &str, set: &str) -> String {
    rows.iter()
        .find(|r| r[1] == backend && r[2] == set)
        .unwrap_or_else(|| panic!("no {backend} row for {set}: {rows:?}"))[3]
        .clone()
}

fn samples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples")
}

/// The trie entries a set's members stand for (comments left out).
fn expected_entries(members: impl Iterator<Item = Member>) -> Vec<Entry> {
    let mut v: Vec<Entry> = members
        .map(|m| match m.without_comment() {
            Member::Ip(a) => Entry::host(*a),
            Member::Net {
                addr,
                prefix,
                nomatch,
            } => Entry::new(*addr, *prefix, *nomatch).unwrap(),
            other => panic!("not an address member: {other:?}"),
        })
        .collect();
    v.sort();
    v
}

#[test]
fn netlink_and_bpf_apply_every_address_policy_in_both_kernels() {
    let Some(place) = Place::new("samples") else {
        return;
    };
    let dir = samples();
    let (code, out, err) = place.ipsetmgr("netlink,bpf", &["apply", "-f", dir.to_str().unwrap()]);
    assert_eq!(code, Some(1), "the others fail on bpf\n{out}{err}");
    let rows = rows(&out);

    let policies: Vec<_> = load_policies(&dir)
        .unwrap()
        .into_iter()
        .map(|l| l.policy)
        .collect();
    let compiled = compile(&policies, &Naming::default(), None);
    assert!(compiled.errors.is_empty(), "{:?}", compiled.errors);
    let mut address = Vec::new();
    for s in &compiled.sets {
        let is_address = matches!(s.header.kind.set_type, SetType::HashIp | SetType::HashNet);
        let bpf = result(&rows, "bpf", &s.name);
        if !is_address {
            assert!(
                bpf.starts_with("FAILED: ") && bpf.contains("cannot be a BPF set"),
                "{}: {bpf}",
                s.name
            );
            assert!(!place.pin(&s.name).exists(), "{} pinned", s.name);
            continue;
        }
        address.push(s.name.clone());
        assert_eq!(bpf, "created", "{}\n{out}", s.name);
        assert_eq!(result(&rows, "netlink", &s.name), "created", "{}", s.name);
        assert_eq!(
            support::bpftool_entries(&place.pin(&s.name)),
            expected_entries(s.members.iter()),
            "{}",
            s.name
        );
    }
    address.sort();
    assert_eq!(
        address,
        [
            "ipm4-blocklist",
            "ipm4-trusted-networks",
            "ipm6-trusted-networks"
        ],
        "the samples' address policies"
    );
    // Only those are pinned.
    let mut pins: Vec<String> = std::fs::read_dir(place.bpffs().join("ipsetmgr"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pins.sort();
    assert_eq!(pins, address);
    let summary = format!(", bpf: {} of {}, ", address.len(), compiled.sets.len());
    assert!(
        out.contains("(netlink,bpf backends: netlink: ") && out.contains(&summary),
        "{summary:?} not in\n{out}"
    );
    // A lookup answers as the ipset does: a nomatch entry carves its
    // addresses out of the wider one.
    let fs = ipsetmgr_bpf::Bpffs::open(&place.bpffs()).unwrap();
    let trusted = fs.open_set("ipm4-trusted-networks").unwrap();
    let addr = |s: &str| -> IpAddr { s.parse().unwrap() };
    assert_eq!(trusted.lookup(addr("203.0.113.5")).unwrap(), Some(true));
    assert_eq!(trusted.lookup(addr("203.0.113.200")).unwrap(), Some(false));
    assert_eq!(trusted.lookup(addr("192.0.2.1")).unwrap(), None);

    // Again: the address sets unchanged in both kernels.
    let (code, again, err) = place.ipsetmgr("netlink,bpf", &["apply", "-f", dir.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{again}{err}");
    let rows = self::rows(&again);
    for name in &address {
        assert_eq!(result(&rows, "bpf", name), "unchanged", "{again}");
        assert_eq!(result(&rows, "netlink", name), "unchanged", "{again}");
    }
}
