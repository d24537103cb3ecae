//! What the kernel tests of this crate share: a fresh network namespace and
//! a fresh mount namespace whose `/sys/fs/bpf` is a bpffs of the test's own
//! (so no test sees another's pins or the host's), and `bpftool` as the
//! oracle of what the kernel holds.

#![allow(dead_code)]

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use ipsetmgr_bpf::{Bpffs, DEFAULT_MOUNT, Entry};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

#[path = "../../../../tests/common/kernel_gate.rs"]
pub mod kernel_gate;

/// Move the calling thread into fresh network and mount namespaces and
/// open a bpffs of its own at the default path: a tmpfs first hides
/// whatever the host has there, then [`Bpffs::open`] finds no bpffs and
/// mounts one (the "mounted when missing" path). `None` (after
/// `cannot_run`) where that is not possible.
pub fn fresh_bpffs(test: &str) -> Option<Bpffs> {
    if !kernel_gate::enter_fresh_netns(test) {
        return None;
    }
    if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
        kernel_gate::cannot_run(test, &format!(" (unshare(CLONE_NEWNS) failed: {e})"));
        return None;
    }
    // Nothing mounted from here on reaches the host's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("making / private in the test's mount namespace");
    mount(
        Some("tmpfs"),
        DEFAULT_MOUNT,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .expect("hiding the host's /sys/fs/bpf");
    Some(Bpffs::open(Path::new(DEFAULT_MOUNT)).expect("mounting a bpffs"))
}

/// `bpftool`, failing the test with its stderr when it fails.
pub fn bpftool(args: &[&str]) -> serde_json::Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("running bpftool (Debian package bpftool; .ci/run installs it)");
    assert!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bpftool -j prints JSON")
}

fn bytes(v: &serde_json::Value) -> Vec<u8> {
    v.as_array()
        .expect("bpftool prints bytes as an array")
        .iter()
        .map(|b| {
            let s = b.as_str().expect("a byte as \"0x..\"");
            u8::from_str_radix(s.trim_start_matches("0x"), 16).expect("a hex byte")
        })
        .collect()
}

/// The entries of the set pinned at `pin`, as bpftool reads them: slot 0
/// of the outer map gives the trie's id, the trie's dump its keys and
/// values, decoded here by the layout docs/bpf.md gives (not the crate's).
pub fn bpftool_entries(pin: &Path) -> Vec<Entry> {
    let pin = pin.to_str().unwrap();
    let slot = bpftool(&["map", "lookup", "pinned", pin, "key", "0", "0", "0", "0"]);
    let id = u32::from_le_bytes(bytes(&slot["value"]).try_into().expect("a 4-byte map id"));
    let dump = bpftool(&["map", "dump", "id", &id.to_string()]);
    let mut out: Vec<Entry> = dump
        .as_array()
        .expect("a dump is an array")
        .iter()
        .map(|kv| {
            let key = bytes(&kv["key"]);
            let value = bytes(&kv["value"]);
            assert_eq!(value.len(), 1, "one value byte");
            let prefix = u32::from_ne_bytes(key[..4].try_into().unwrap());
            let addr: IpAddr = match key.len() - 4 {
                4 => <[u8; 4]>::try_from(&key[4..]).unwrap().into(),
                16 => <[u8; 16]>::try_from(&key[4..]).unwrap().into(),
                n => panic!("a {n}-byte address"),
            };
            assert!(
                value[0] <= 1,
                "value {} is neither match nor nomatch",
                value[0]
            );
            Entry::new(addr, prefix as u8, value[0] == 0).unwrap()
        })
        .collect();
    out.sort();
    out
}
