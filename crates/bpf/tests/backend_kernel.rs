//! The BPF adapter under the neutral reconciler, on the real kernel: each
//! test in its own network and mount namespace with a bpffs of its own
//! (tests/support). What is applied is what `bpftool` dumps, exactly; the
//! write kinds (create, delta in place, replacement by a slot swap);
//! policies a prefix map cannot hold refused per set; drift repaired and
//! counted; foreign pins left alone; a full trie isolated as SetFull.
//! Without root the tests print a skip message, except under `CI=true`,
//! where they fail.

mod support;

use std::sync::Arc;

use ipsetmgr_bpf::Entry;
use ipsetmgr_bpf::backend::{self, BpfReconciler};
use ipsetmgr_ipset::{Family, HeaderOptions, Member, MemberSet, SetHeader, SetKind, SetType};
use ipsetmgr_sets::{
    DesiredSet, ErrorKind, ReconcilerConfig, SetError, SetReport, SetsBackend, WriteKind,
};
use support::{bpftool, bpftool_entries, fresh_bpffs};

fn member(s: &str) -> Member {
    let (text, nomatch) = match s.strip_suffix(" nomatch") {
        Some(t) => (t, true),
        None => (s, false),
    };
    match text.split_once('/') {
        Some((a, p)) => Member::Net {
            addr: a.parse().unwrap(),
            prefix: p.parse().unwrap(),
            nomatch,
        },
        None => Member::Ip(text.parse().unwrap()),
    }
}

fn desired(policy: &str, set_type: SetType, family: Family, max: u32, m: &[&str]) -> DesiredSet {
    let kind = SetKind {
        set_type,
        family: Some(family),
    };
    let letter = if family == Family::V4 { '4' } else { '6' };
    DesiredSet {
        name: format!("ipm{letter}-{policy}"),
        policy: policy.into(),
        header: SetHeader {
            kind,
            max_elem: max,
            hash_size: None,
            options: HeaderOptions::default(),
        },
        members: Arc::new(MemberSet::from_members(kind, m.iter().map(|s| member(s)))),
    }
}

fn entries(list: &[&str]) -> Vec<Entry> {
    let mut v: Vec<Entry> = list
        .iter()
        .map(|s| match member(s) {
            Member::Ip(a) => Entry::host(a),
            Member::Net {
                addr,
                prefix,
                nomatch,
            } => Entry::new(addr, prefix, nomatch).unwrap(),
            _ => unreachable!(),
        })
        .collect();
    v.sort();
    v
}

fn reconciler(fs: ipsetmgr_bpf::Bpffs) -> BpfReconciler {
    backend::reconciler(fs, ReconcilerConfig::default()).with_sleep(|_| {})
}

fn report<'a>(r: &'a [SetReport], name: &str) -> &'a SetReport {
    r.iter()
        .find(|s| s.set.name == name)
        .unwrap_or_else(|| panic!("no report for {name}: {r:?}"))
}

/// The id of the trie in a set's slot: a delta keeps it, a replacement
/// changes it.
fn trie_id(pin: &std::path::Path) -> serde_json::Value {
    bpftool(&[
        "map",
        "lookup",
        "pinned",
        pin.to_str().unwrap(),
        "key",
        "0",
        "0",
        "0",
        "0",
    ])["value"]
        .clone()
}

#[test]
fn applies_creates_deltas_and_replacements_exactly() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("applies_creates_deltas_and_replacements_exactly") else {
            return;
        };
        let pin = |n: &str| fs.mount_point().join("ipsetmgr").join(n);
        let mut r = reconciler(fs.clone());
        let v4 = [
            "10.0.0.0/8",
            "10.1.0.0/16 nomatch",
            "10.1.2.0/24",
            "192.0.2.7/32",
        ];
        let ips = ["198.51.100.1", "198.51.100.2"];
        let v6 = ["2001:db8::/32", "2001:db8:1::/48 nomatch"];
        r.set_desired(
            vec![
                desired("nets", SetType::HashNet, Family::V4, 16, &v4),
                desired("hosts", SetType::HashIp, Family::V4, 16, &ips),
                desired("nets", SetType::HashNet, Family::V6, 16, &v6),
            ],
            [],
        );
        let out = r.apply_updates();
        assert!(out.applied, "{out:?}");
        let mut kinds: Vec<(String, WriteKind)> = out
            .written
            .iter()
            .map(|(s, k)| (s.name.clone(), *k))
            .collect();
        kinds.sort();
        assert_eq!(
            kinds,
            [
                ("ipm4-hosts".to_string(), WriteKind::Create),
                ("ipm4-nets".to_string(), WriteKind::Create),
                ("ipm6-nets".to_string(), WriteKind::Create),
            ]
        );
        assert_eq!(bpftool_entries(&pin("ipm4-nets")), entries(&v4));
        assert_eq!(bpftool_entries(&pin("ipm4-hosts")), entries(&ips));
        assert_eq!(bpftool_entries(&pin("ipm6-nets")), entries(&v6));
        for s in r.report() {
            assert!(s.synced && s.error.is_none() && s.problems == 0, "{s:?}");
            assert_eq!(s.set.backend.name, "bpf");
        }
        let set = fs.open_set("ipm4-nets").unwrap();
        assert_eq!(
            set.lookup("10.1.9.9".parse().unwrap()).unwrap(),
            Some(false)
        );
        assert_eq!(set.lookup("10.1.2.3".parse().unwrap()).unwrap(), Some(true));

        // A small change: deltas in place, the same trie.
        let before = trie_id(&pin("ipm4-nets"));
        let v4b = [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "10.1.2.0/24",
            "192.0.2.7/32",
            "203.0.113.0/24",
        ];
        r.set_desired(
            vec![
                desired("nets", SetType::HashNet, Family::V4, 16, &v4b),
                desired("hosts", SetType::HashIp, Family::V4, 16, &ips),
                desired("nets", SetType::HashNet, Family::V6, 16, &v6),
            ],
            [],
        );
        let out = r.apply_updates();
        assert!(out.applied, "{out:?}");
        assert_eq!(out.written.len(), 1, "{out:?}");
        assert_eq!(out.written[0].1, WriteKind::Delta);
        assert_eq!(bpftool_entries(&pin("ipm4-nets")), entries(&v4b));
        assert_eq!(trie_id(&pin("ipm4-nets")), before, "a delta keeps the trie");

        // A new maxElem: a fresh trie of that size, swapped in.
        r.set_desired(
            vec![
                desired("nets", SetType::HashNet, Family::V4, 64, &v4b),
                desired("hosts", SetType::HashIp, Family::V4, 16, &ips),
                desired("nets", SetType::HashNet, Family::V6, 16, &v6),
            ],
            [],
        );
        let out = r.apply_updates();
        assert_eq!(out.written[0].1, WriteKind::Replace, "{out:?}");
        assert_ne!(trie_id(&pin("ipm4-nets")), before, "a replacement swaps");
        assert_eq!(fs.open_set("ipm4-nets").unwrap().max_entries().unwrap(), 64);
        assert_eq!(bpftool_entries(&pin("ipm4-nets")), entries(&v4b));

        // A change larger than the set: replaced whole, not entry by entry.
        let before = trie_id(&pin("ipm4-hosts"));
        let ips2 = ["198.51.100.9", "198.51.100.10", "198.51.100.11"];
        r.set_desired(
            vec![
                desired("nets", SetType::HashNet, Family::V4, 64, &v4b),
                desired("hosts", SetType::HashIp, Family::V4, 16, &ips2),
                desired("nets", SetType::HashNet, Family::V6, 16, &v6),
            ],
            [],
        );
        let out = r.apply_updates();
        assert_eq!(out.written[0].1, WriteKind::Replace, "{out:?}");
        assert_ne!(trie_id(&pin("ipm4-hosts")), before);
        assert_eq!(bpftool_entries(&pin("ipm4-hosts")), entries(&ips2));

        // A policy no longer wanted: its pin goes.
        r.set_desired(
            vec![desired("nets", SetType::HashNet, Family::V4, 64, &v4b)],
            [],
        );
        let out = r.apply_updates();
        let mut deleted: Vec<&str> = out.deleted.iter().map(|s| s.name.as_str()).collect();
        deleted.sort();
        assert_eq!(deleted, ["ipm4-hosts", "ipm6-nets"]);
        assert_eq!(fs.list("ipm").unwrap(), ["ipm4-nets"]);
    })
    .join()
    .unwrap();
}

#[test]
fn other_types_fail_per_policy_and_the_rest_apply() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("other_types_fail_per_policy_and_the_rest_apply") else {
            return;
        };
        let mut r = reconciler(fs.clone());
        let port = SetKind {
            set_type: SetType::HashIpPort,
            family: Some(Family::V4),
        };
        let ports = DesiredSet {
            name: "ipm4-ports".into(),
            policy: "ports".into(),
            header: SetHeader {
                kind: port,
                max_elem: 16,
                hash_size: None,
                options: HeaderOptions::default(),
            },
            members: Arc::new(MemberSet::new(port)),
        };
        r.set_desired(
            vec![
                ports,
                desired("ok", SetType::HashIp, Family::V4, 16, &["192.0.2.1"]),
            ],
            [],
        );
        let out = r.apply_updates();
        assert!(out.applied, "{out:?}");
        let reports = r.report();
        let bad = report(&reports, "ipm4-ports");
        match &bad.error {
            Some(SetError::Unrepresentable(why)) => assert_eq!(
                why,
                "hash:ip,port inet cannot be a BPF set: a longest-prefix-match map holds address prefixes only (hash:ip, hash:net)"
            ),
            other => panic!("{other:?}"),
        }
        assert!(report(&reports, "ipm4-ok").synced);
        assert_eq!(fs.list("ipm").unwrap(), ["ipm4-ok"]);
    })
    .join()
    .unwrap();
}

#[test]
fn drift_is_found_by_resync_repaired_and_counted() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("drift_is_found_by_resync_repaired_and_counted") else {
            return;
        };
        let pin = fs.mount_point().join("ipsetmgr/ipm4-block");
        let mut r = reconciler(fs.clone());
        let want = ["10.0.0.0/8", "10.1.0.0/16 nomatch"];
        r.set_desired(
            vec![desired("block", SetType::HashNet, Family::V4, 16, &want)],
            [],
        );
        assert!(r.apply_updates().applied);
        // Out of band: 192.0.2.0/24 added to the trie with bpftool.
        let id = u32::from_le_bytes(
            trie_id(&pin)
                .as_array()
                .unwrap()
                .iter()
                .map(|b| {
                    u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
                })
                .collect::<Vec<u8>>()
                .try_into()
                .unwrap(),
        );
        let id = id.to_string();
        bpftool(&[
            "map", "update", "id", &id, "key", "24", "0", "0", "0", "192", "0", "2", "0", "value",
            "1",
        ]);
        assert_eq!(bpftool_entries(&pin).len(), 3);
        r.queue_resync();
        let out = r.apply_updates();
        assert!(out.applied, "{out:?}");
        let reports = r.report();
        let s = report(&reports, "ipm4-block");
        assert_eq!(s.problems, 1, "{s:?}");
        assert_eq!(s.drift.extra, 1);
        assert_eq!(bpftool_entries(&pin), entries(&want), "repaired");
        // And the pin removed out of band is written whole again.
        std::fs::remove_file(&pin).unwrap();
        r.queue_resync();
        assert!(r.apply_updates().applied);
        let reports = r.report();
        let s = report(&reports, "ipm4-block");
        assert!(s.drift.rewritten && s.problems == 1, "{s:?}");
        assert_eq!(bpftool_entries(&pin), entries(&want));
    })
    .join()
    .unwrap();
}

#[test]
fn foreign_pins_are_left_alone_and_a_full_trie_is_isolated() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("foreign_pins_are_left_alone_and_a_full_trie_is_isolated")
        else {
            return;
        };
        let dir = fs.mount_point().join("ipsetmgr");
        bpftool(&[
            "map",
            "create",
            dir.join("foreign-map").to_str().unwrap(),
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
            fs.create("other-set", Family::V4, 4, &entries(&["10.0.0.0/8"]))
                .unwrap(),
        );
        let mut r = reconciler(fs.clone());
        r.set_desired(
            vec![
                desired(
                    "full",
                    SetType::HashNet,
                    Family::V4,
                    2,
                    &["10.0.0.0/8", "10.1.0.0/16", "10.2.0.0/16"],
                ),
                desired("fine", SetType::HashIp, Family::V4, 4, &["192.0.2.1"]),
            ],
            [],
        );
        let out = r.apply_updates();
        assert!(out.applied, "{out:?}");
        let reports = r.report();
        let full = report(&reports, "ipm4-full");
        let e = full
            .error
            .as_ref()
            .and_then(SetError::kernel_error)
            .expect("a kernel error");
        assert_eq!(e.kind(), ErrorKind::SetFull, "{e}");
        assert!(e.to_string().contains("ENOSPC"), "{e}");
        assert!(report(&reports, "ipm4-fine").synced);
        let mut pins: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        pins.sort();
        assert_eq!(pins, ["foreign-map", "ipm4-fine", "other-set"]);
        assert_eq!(
            bpftool_entries(&dir.join("other-set")),
            entries(&["10.0.0.0/8"])
        );
        let listed: Vec<String> = SetsBackend::list(&mut r)
            .unwrap()
            .into_iter()
            .map(|s| s.set.name)
            .collect();
        assert_eq!(listed, ["ipm4-fine"]);
    })
    .join()
    .unwrap();
}
