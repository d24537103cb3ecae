//! The agent's keeper of the XDP program (`XdpKeeper`, docs/bpf.md, "The
//! XDP program in the agent") on the real kernel, in a fresh network
//! namespace with a bpffs of its own: while the policy has no set, or the
//! interface does not exist, a check fails naming which (and attaches
//! nothing); once both exist it attaches; a second check leaves the same
//! program; detached by hand, the next check attaches it again.
//!
//! Needs root, iproute2 and an ipsetmgr built with its XDP program
//! (clang); without root it prints a skip message, except under `CI=true`,
//! where it fails.

mod support;

use std::process::{Command, Output};

use ipsetmgr_bpf::{Bpffs, Entry, Kept, XdpKeeper, xdp};
use ipsetmgr_ipset::{Family, Naming};
use support::fresh_bpffs;

fn run(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// The id of the XDP program on `dev`, if any (`ip -d -j link`).
fn xdp_prog_id(dev: &str) -> Option<u64> {
    let out = run(&["ip", "-d", "-j", "link", "show", "dev", dev]);
    assert!(
        out.status.success(),
        "{dev}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["xdp"]["prog"]["id"].as_u64()
}

fn scenario(fs: &Bpffs) {
    let keeper = XdpKeeper::new(
        "vkeep0".into(),
        vec!["drop".into()],
        Naming::new("ipm").unwrap(),
    )
    .unwrap();

    // No set yet: the error names the policy; nothing is attached.
    let err = keeper.check(fs).unwrap_err().to_string();
    assert!(err.contains("policy drop has no BPF set"), "{err}");
    assert!(!xdp::is_attached(fs, "vkeep0").unwrap());

    let entry = Entry::new("10.201.0.0".parse().unwrap(), 24, false).unwrap();
    drop(fs.create("ipm4-drop", Family::V4, 8, &[entry]).unwrap());

    // No interface yet: the error names it; no pin is left behind.
    let err = keeper.check(fs).unwrap_err().to_string();
    assert!(err.contains("vkeep0"), "{err}");
    assert!(!xdp::is_attached(fs, "vkeep0").unwrap());

    let out = run(&[
        "ip", "link", "add", "vkeep0", "type", "veth", "peer", "name", "vkeep1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(xdp_prog_id("vkeep0"), None);

    assert_eq!(keeper.check(fs).unwrap(), Kept::Attached);
    let first = xdp_prog_id("vkeep0").expect("a program on vkeep0 after the first check");
    assert_eq!(keeper.check(fs).unwrap(), Kept::Unchanged);
    assert_eq!(xdp_prog_id("vkeep0"), Some(first), "the same program");

    // Someone detaches it: the next check attaches it again.
    xdp::detach(fs, "vkeep0").unwrap();
    assert_eq!(xdp_prog_id("vkeep0"), None);
    assert_eq!(keeper.check(fs).unwrap(), Kept::Attached);
    let again = xdp_prog_id("vkeep0").expect("a program on vkeep0 after the repair");
    assert_ne!(again, first, "a fresh program");
    assert_eq!(keeper.check(fs).unwrap(), Kept::Unchanged);
}

#[test]
fn keeper_attaches_when_it_can_and_again_after_a_detach() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("keeper_attaches_when_it_can_and_again_after_a_detach") else {
            return;
        };
        scenario(&fs);
    })
    .join()
    .unwrap();
}

#[test]
fn keeper_refuses_what_cannot_be_an_interface_or_a_policy_list() {
    let naming = Naming::new("ipm").unwrap();
    for bad in ["", "a/b", "../x", "sixteen-chars-xx"] {
        let err = XdpKeeper::new(bad.into(), vec!["p".into()], naming.clone()).unwrap_err();
        assert!(
            err.to_string().contains("invalid interface name"),
            "{bad}: {err}"
        );
    }
    for policies in [vec![], vec!["a".to_string(), String::new()]] {
        let err = XdpKeeper::new("eth0".into(), policies.clone(), naming.clone()).unwrap_err();
        assert!(err.to_string().contains("eth0"), "{policies:?}: {err}");
    }
}
