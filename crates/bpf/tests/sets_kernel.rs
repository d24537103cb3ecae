//! The set operations against the kernel, each test in its own network and
//! mount namespace with a bpffs of its own (tests/support): what is written
//! is what `bpftool` dumps, exactly; deltas, full replacement, listing by
//! prefix with foreign pins left alone, deletion, and errors that name the
//! kernel's errno. Needs root and bpftool; without root the tests print a
//! skip message, except under `CI=true`, where they fail.

mod support;

use std::net::IpAddr;

use ipsetmgr_bpf::{BpfError, Entry};
use ipsetmgr_ipset::Family;
use support::{bpftool, bpftool_entries, fresh_bpffs};

fn net(s: &str) -> Entry {
    let (text, nomatch) = match s.strip_suffix(" nomatch") {
        Some(t) => (t, true),
        None => (s, false),
    };
    let (addr, prefix) = text.split_once('/').unwrap();
    Entry::new(addr.parse().unwrap(), prefix.parse().unwrap(), nomatch).unwrap()
}

fn nets(list: &[&str]) -> Vec<Entry> {
    let mut v: Vec<Entry> = list.iter().map(|s| net(s)).collect();
    v.sort();
    v
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn writes_deltas_and_replacement_read_back_exactly() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("writes_deltas_and_replacement_read_back_exactly") else {
            return;
        };
        let first = nets(&["10.0.0.0/8", "10.1.0.0/16 nomatch", "192.0.2.7/32"]);
        let mut set = fs.create("ipm4-block", Family::V4, 16, &first).unwrap();
        assert_eq!(set.path(), fs.mount_point().join("ipsetmgr/ipm4-block"));
        assert_eq!(set.read().unwrap(), first);
        assert_eq!(bpftool_entries(set.path()), first);
        assert_eq!(set.lookup(ip("10.9.9.9")).unwrap(), Some(true));
        assert_eq!(set.lookup(ip("10.1.2.3")).unwrap(), Some(false));
        assert_eq!(set.lookup(ip("11.0.0.1")).unwrap(), None);

        // Deltas in place: the same trie, so its id in slot 0 stays.
        let slot = |p: &std::path::Path| {
            bpftool(&[
                "map",
                "lookup",
                "pinned",
                p.to_str().unwrap(),
                "key",
                "0",
                "0",
                "0",
                "0",
            ])["value"]
                .clone()
        };
        let before = slot(set.path());
        set.add(&nets(&["10.1.2.0/24", "10.0.0.0/8 nomatch"]))
            .unwrap();
        set.delete(&nets(&["192.0.2.7/32"])).unwrap();
        let now = nets(&["10.0.0.0/8 nomatch", "10.1.0.0/16 nomatch", "10.1.2.0/24"]);
        assert_eq!(set.read().unwrap(), now);
        assert_eq!(bpftool_entries(set.path()), now);
        assert_eq!(slot(set.path()), before, "a delta must not swap the trie");

        // A replacement swaps in a new trie holding exactly the new entries.
        let second = nets(&["198.51.100.0/24", "198.51.100.128/25 nomatch"]);
        set.replace(&second, 8).unwrap();
        assert_ne!(slot(set.path()), before, "a replacement swaps the trie");
        assert_eq!(bpftool_entries(set.path()), second);
        assert_eq!(fs.open_set("ipm4-block").unwrap().read().unwrap(), second);

        // IPv6, opened again from its pin.
        let v6 = nets(&["2001:db8::/32", "2001:db8:1::/48 nomatch", "::1/128"]);
        drop(fs.create("ipm6-block", Family::V6, 4, &v6).unwrap());
        let set6 = fs.open_set("ipm6-block").unwrap();
        assert_eq!(set6.family(), Family::V6);
        assert_eq!(set6.read().unwrap(), v6);
        assert_eq!(bpftool_entries(set6.path()), v6);

        assert_eq!(fs.list("ipm").unwrap(), ["ipm4-block", "ipm6-block"]);
        fs.delete("ipm4-block").unwrap();
        assert!(!fs.mount_point().join("ipsetmgr/ipm4-block").exists());
        assert_eq!(fs.list("ipm").unwrap(), ["ipm6-block"]);
    })
    .join()
    .unwrap();
}

#[test]
fn foreign_pins_are_never_listed_opened_or_removed() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("foreign_pins_are_never_listed_opened_or_removed") else {
            return;
        };
        drop(fs.create("ipm4-mine", Family::V4, 4, &[]).unwrap());
        // Someone else's map in our directory, and someone else's set that
        // only lacks our prefix.
        let foreign = fs.mount_point().join("ipsetmgr/foreign-map");
        bpftool(&[
            "map",
            "create",
            foreign.to_str().unwrap(),
            "type",
            "hash",
            "key",
            "4",
            "value",
            "4",
            "entries",
            "1",
            "name",
            "foreign",
        ]);
        drop(
            fs.create("other-set", Family::V4, 4, &nets(&["10.0.0.0/8"]))
                .unwrap(),
        );

        assert_eq!(fs.list("ipm").unwrap(), ["ipm4-mine"]);
        let err = fs.delete("foreign-map").unwrap_err();
        assert!(matches!(err, BpfError::NotASet { .. }), "{err}");
        assert!(foreign.exists(), "a foreign pin must stay");
        assert_eq!(
            bpftool_entries(&fs.mount_point().join("ipsetmgr/other-set")),
            nets(&["10.0.0.0/8"])
        );
    })
    .join()
    .unwrap();
}

#[test]
fn kernel_errors_name_the_errno_and_the_entry() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("kernel_errors_name_the_errno_and_the_entry") else {
            return;
        };
        let mut set = fs.create("ipm4-small", Family::V4, 2, &[]).unwrap();
        set.add(&nets(&["10.0.0.0/8", "10.1.0.0/16"])).unwrap();
        // Full: the trie holds max_entries (maxElem) entries.
        let err = set.add(&nets(&["10.2.0.0/16"])).unwrap_err().to_string();
        assert!(
            err.contains("add 10.2.0.0/16") && err.contains("ENOSPC"),
            "{err}"
        );
        let err = set
            .delete(&nets(&["192.0.2.0/24"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("del 192.0.2.0/24") && err.contains("ENOENT"),
            "{err}"
        );
        let err = set.add(&nets(&["2001:db8::/32"])).unwrap_err();
        assert!(matches!(err, BpfError::WrongFamily { .. }), "{err}");
        let err = fs.create("ipm4-small", Family::V4, 2, &[]).unwrap_err();
        assert!(matches!(err, BpfError::Exists { .. }), "{err}");
        let err = fs.open_set("ipm4-none").unwrap_err();
        assert!(matches!(err, BpfError::NotFound { .. }), "{err}");
        // A failed replacement leaves the set as it was.
        let too_many = nets(&["10.0.0.0/8", "10.1.0.0/16", "10.2.0.0/16"]);
        assert!(set.replace(&too_many, 2).is_err());
        assert_eq!(set.read().unwrap(), nets(&["10.0.0.0/8", "10.1.0.0/16"]));
    })
    .join()
    .unwrap();
}

/// Fills go in batches (`BPF_MAP_UPDATE_BATCH`, 8192 entries per call):
/// entries past the first batch are all written, and an entry that does not
/// fit, in a later batch, is the one the error names, the ones before it
/// written.
#[test]
fn fills_across_batches_write_all_and_name_the_entry_that_failed() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("fills_across_batches_write_all_and_name_the_entry_that_failed")
        else {
            return;
        };
        let hosts = |n: u32| -> Vec<Entry> {
            (0..n)
                .map(|i| Entry::host(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()))
                .collect()
        };
        let all = hosts(20_000);
        let mut set = fs
            .create("ipm4-batches", Family::V4, 20_000, &all[..10_000])
            .unwrap();
        assert_eq!(set.read().unwrap(), all[..10_000]);
        // 10,000 more, across two batches: all written, exactly.
        set.add(&all[10_000..]).unwrap();
        assert_eq!(set.read().unwrap(), all);
        assert_eq!(bpftool_entries(set.path()), all);

        // A fresh trie of 16,000: entry 16,000 (10.0.62.128), in the second
        // batch, is the first that does not fit.
        let err = set.replace(&hosts(20_001), 16_000).unwrap_err().to_string();
        assert!(
            err.contains("add 10.0.62.128/32") && err.contains("ENOSPC"),
            "{err}"
        );
        // The failed replacement left the set as it was.
        assert_eq!(set.read().unwrap(), all);
    })
    .join()
    .unwrap();
}
