//! The reconciler over nft sets (NftKernel) against the real kernel, over the netlink and the `nft -j`
//! backends: each test in its own fresh network namespace (the conformance
//! suite's runner; without root a test skips, under `CI=true` it fails),
//! with `nft` itself as the oracle.

#[macro_use]
mod conformance;

use conformance::{desired, expected};

use std::process::Command;

use ipsetmgr_ipset::{Family, SetType};
use ipsetmgr_nft::NftDataplane;
use ipsetmgr_nft::backend::{NftReconciler, default_table, reconciler};
use ipsetmgr_nft::cli::CliNft;
use ipsetmgr_sets::{
    DesiredSet, ErrorKind, ReconcilerConfig, SetError, SetRef, SetsBackend, WriteKind,
};

type Backend = NftReconciler<Box<dyn NftDataplane>>;

/// Instantiate each body for the netlink and the cli backend.
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod netlink {
            $(
                #[test]
                fn $name() {
                    $crate::conformance::run(
                        concat!("netlink::", stringify!($name)),
                        $crate::conformance::Mode::Kernel,
                        $crate::conformance::netlink,
                        $crate::$name,
                    );
                }
            )*
        }
        mod cli {
            $(
                #[test]
                fn $name() {
                    $crate::conformance::run(
                        concat!("cli::", stringify!($name)),
                        $crate::conformance::Mode::Kernel,
                        $crate::conformance::nft_cli,
                        $crate::$name,
                    );
                }
            )*
        }
    };
}

backend_tests!(
    every_type_holds_exactly_the_declared_elements,
    a_rule_keeps_its_set_across_update_and_replacement,
    out_of_band_changes_are_repaired_and_counted,
    a_growing_set_takes_its_new_members,
    a_table_another_process_owns_is_named_as_such,
    an_iface_set_holds_more_ranges_than_members,
);

/// A backend of the same kind as the runner's (opened inside the netns).
fn backend_like(dp: &dyn NftDataplane) -> Backend {
    let inner: Box<dyn NftDataplane> = match dp.name() {
        "netlink" => conformance::netlink(),
        "cli" => conformance::nft_cli(),
        other => panic!("no kernel backend {other}"),
    };
    let b = reconciler(inner, default_table(), ReconcilerConfig::default()).with_sleep(|_| {});
    // The names the metrics are labelled with.
    let want = if dp.name() == "netlink" {
        "nft"
    } else {
        "nft-cli"
    };
    assert_eq!(b.name(), want);
    b
}

fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().expect("run nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nft -j list table inet ipsetmgr`: each set's name and element count,
/// and the number of rules.
fn listed_table() -> (Vec<(String, usize)>, usize) {
    let text = nft(&["-j", "list", "table", "inet", "ipsetmgr"]);
    let v: serde_json::Value = serde_json::from_str(&text).expect("nft -j output");
    let mut sets = Vec::new();
    let mut rules = 0;
    for obj in v["nftables"].as_array().expect("nftables array") {
        if let Some(s) = obj.get("set") {
            let n = s.get("elem").and_then(|e| e.as_array()).map_or(0, Vec::len);
            sets.push((s["name"].as_str().unwrap().to_string(), n));
        }
        if obj.get("rule").is_some() {
            rules += 1;
        }
    }
    sets.sort();
    (sets, rules)
}

/// The set's elements per `nft -j list set`, as nft prints them.
fn kernel_elements(set: &str) -> Option<Vec<String>> {
    let k = CliNft::new().read_set(&default_table(), set).unwrap()?;
    Some(k.elements?.iter().map(|e| e.to_string()).collect())
}

/// The names of a list of sets.
fn names(sets: &[SetRef]) -> Vec<&str> {
    sets.iter().map(|s| s.name.as_str()).collect()
}

/// The sets an apply wrote, by name, and how.
fn written(o: &ipsetmgr_sets::ApplyOutcome) -> Vec<(&str, WriteKind)> {
    o.written
        .iter()
        .map(|(s, k)| (s.name.as_str(), *k))
        .collect()
}

fn apply(b: &mut Backend) -> ipsetmgr_sets::ApplyOutcome {
    let o = b.apply_updates();
    assert!(o.applied, "{} backend: {:?}", b.name(), o.error);
    o
}

fn every_type() -> Vec<DesiredSet> {
    use Family::*;
    use SetType::*;
    vec![
        desired("blocklist", HashIp, V4, &["10.0.0.1", "192.168.1.255"]),
        desired("blocklist", HashIp, V6, &["2001:db8::1", "fe80::1"]),
        desired(
            "nets",
            HashNet,
            V4,
            &["10.0.0.0/8", "10.1.0.0/16 nomatch", "172.16.0.0/12"],
        ),
        desired(
            "ports",
            HashIpPort,
            V4,
            &["10.0.0.1,tcp:80", "10.0.0.2,udp:53"],
        ),
        desired(
            "netports",
            HashNetPort,
            V4,
            &["10.0.0.0/24,tcp:443", "10.0.1.0/24,tcp:443 nomatch"],
        ),
        desired(
            "ifaces",
            HashNetIface,
            V4,
            &["10.0.0.0/8,eth0", "192.168.0.0/16,lo"],
        ),
    ]
}

pub fn every_type_holds_exactly_the_declared_elements(
    dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let mut b = backend_like(dp);
    let want = every_type();
    b.set_desired(want.clone(), vec![]);
    let o = apply(&mut b);
    assert_eq!(o.written.len(), want.len());
    assert!(o.written.iter().all(|(_, p)| *p == WriteKind::Create));
    let (sets, rules) = listed_table();
    let mut declared: Vec<(String, usize)> = want
        .iter()
        .map(|d| (b.kernel().set_name(d), expected(d).len()))
        .collect();
    declared.sort();
    assert_eq!(sets, declared, "nft -j list table inet ipsetmgr");
    assert_eq!(rules, 0);
    for d in &want {
        let name = b.kernel().set_name(d);
        assert_eq!(kernel_elements(&name), Some(expected(d)), "{name}");
    }
    // 10.1.0.0/16 nomatch is cut out of 10.0.0.0/8.
    assert_eq!(
        kernel_elements("ipm4-nets").unwrap(),
        vec!["10.0.0.0/16", "10.2.0.0-10.255.255.255", "172.16.0.0/12"]
    );
    // A second apply, and a resync, write nothing.
    let o = apply(&mut b);
    assert!(o.written.is_empty(), "{:?}", o.written);
    b.queue_resync();
    let o = apply(&mut b);
    assert!(o.written.is_empty(), "{:?}", o.written);
    assert!(
        b.report().iter().all(|r| r.synced && r.problems == 0),
        "{:?}",
        b.report()
    );
    let listed = b.list().unwrap();
    assert_eq!(listed.len(), want.len());
    assert!(
        listed
            .iter()
            .all(|l| l.set.name.starts_with("inet ipsetmgr ipm"))
    );
}

/// An input chain `c` in the table with a rule that matches on `set`.
fn add_rule_on(set: &str) {
    nft(&[
        "add",
        "chain",
        "inet",
        "ipsetmgr",
        "c",
        "{ type filter hook input priority 0; }",
    ]);
    let set = format!("@{set}");
    nft(&[
        "add", "rule", "inet", "ipsetmgr", "c", "ip", "saddr", &set, "drop",
    ]);
}

fn rule_text() -> String {
    nft(&["list", "chain", "inet", "ipsetmgr", "c"])
}

pub fn a_rule_keeps_its_set_across_update_and_replacement(
    dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    use SetType::*;
    let mut b = backend_like(dp);
    let v4 = Family::V4;
    let other = desired("other", HashIp, v4, &["10.0.0.7"]);
    b.set_desired(
        vec![
            desired("blocklist", HashIp, v4, &["10.0.0.1"]),
            other.clone(),
        ],
        vec![],
    );
    apply(&mut b);
    add_rule_on("ipm4-blocklist");
    assert!(rule_text().contains("@ipm4-blocklist"));
    // A member update: a delta under the rule.
    let updated = desired("blocklist", HashIp, v4, &["10.0.0.2", "10.0.0.3"]);
    b.set_desired(vec![updated.clone(), other.clone()], vec![]);
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-blocklist", WriteKind::Delta)]);
    assert_eq!(kernel_elements("ipm4-blocklist"), Some(expected(&updated)));
    assert!(rule_text().contains("ip saddr @ipm4-blocklist drop"));
    // A replacement of all members in one transaction.
    let replaced = desired("blocklist", HashIp, v4, &["192.0.2.1"]);
    b.set_desired(vec![replaced.clone(), other.clone()], vec![]);
    apply(&mut b);
    assert_eq!(kernel_elements("ipm4-blocklist"), Some(expected(&replaced)));
    assert!(rule_text().contains("ip saddr @ipm4-blocklist drop"));
    // A type change is refused while the rule references the set. Over
    // `nft -j` first by the kernel (the backend has not read the rule's
    // reference yet, so it tries a recreate, which the kernel refuses with
    // EBUSY and which leaves the transaction unapplied), then by the
    // backend itself once a resync has counted the reference. Over netlink
    // the rule's commit moved the ruleset generation: the first write after
    // it was refused for that and every set read again, so the backend
    // knows the reference already and refuses itself at once.
    b.set_desired(
        vec![
            desired("blocklist", HashNet, v4, &["10.0.0.0/8"]),
            other.clone(),
        ],
        vec![],
    );
    let o = b.apply_updates();
    assert!(o.written.is_empty(), "{:?}", o.written);
    let r = &b.report()[0];
    assert_eq!(r.set.name, "ipm4-blocklist");
    if dp.name() == "netlink" {
        assert!(
            matches!(&r.error, Some(SetError::NotReplaced(n)) if n.references >= 1),
            "{:?}",
            r.error
        );
    } else {
        assert!(
            matches!(&r.error, Some(SetError::Kernel(e)) if e.kind() == ErrorKind::InUse),
            "{:?}",
            r.error
        );
    }
    assert_eq!(kernel_elements("ipm4-blocklist"), Some(expected(&replaced)));
    assert!(rule_text().contains("ip saddr @ipm4-blocklist drop"));
    b.queue_resync();
    // New content: retried now, whatever the backoff said.
    b.set_desired(
        vec![
            desired("blocklist", HashNet, v4, &["10.0.0.0/9"]),
            other.clone(),
        ],
        vec![],
    );
    let o = b.apply_updates();
    assert!(o.written.is_empty(), "{:?}", o.written);
    let r = &b.report()[0];
    assert_eq!(r.set.name, "ipm4-blocklist");
    assert!(
        matches!(&r.error, Some(SetError::NotReplaced(n)) if n.references >= 1),
        "{:?}",
        r.error
    );
    assert_eq!(kernel_elements("ipm4-blocklist"), Some(expected(&replaced)));
    assert!(rule_text().contains("ip saddr @ipm4-blocklist drop"));
    // Deleting the policy while the rule exists: in use, the set stays,
    // and it is retried at the next resync; the other set deleted in the
    // same apply goes.
    b.set_desired(vec![], vec![]);
    let o = b.apply_updates();
    assert_eq!(names(&o.deleted), ["ipm4-other"]);
    assert_eq!(kernel_elements("ipm4-other"), None);
    let d = b.deletion_report();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].error.kind(), ErrorKind::InUse, "{d:?}");
    assert!(kernel_elements("ipm4-blocklist").is_some());
    b.queue_resync();
    let o = b.apply_updates();
    assert!(o.deleted.is_empty());
    assert_eq!(b.deletion_report().len(), 1);
    // The rule goes: the retry deletes the set; the chain and the table stay.
    nft(&["flush", "chain", "inet", "ipsetmgr", "c"]);
    b.queue_resync();
    let o = apply(&mut b);
    assert_eq!(names(&o.deleted), ["ipm4-blocklist"]);
    assert!(b.deletion_report().is_empty());
    assert!(rule_text().contains("chain c"));
}

pub fn out_of_band_changes_are_repaired_and_counted(
    dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    use SetType::*;
    let v4 = Family::V4;
    let mut b = backend_like(dp);
    let a = desired("a", HashIp, v4, &["10.0.0.1", "10.0.0.2"]);
    let n = desired("n", HashNet, v4, &["10.0.0.0/8", "10.1.0.0/16 nomatch"]);
    b.set_desired(vec![a.clone(), n.clone()], vec![]);
    apply(&mut b);
    let report = |b: &Backend, name: &str| {
        b.report()
            .into_iter()
            .find(|r| r.set.name == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let check = |b: &mut Backend| {
        b.queue_resync();
        let o = b.apply_updates();
        assert!(o.applied, "{:?}", o.error);
        assert_eq!(kernel_elements("ipm4-a"), Some(expected(&a)));
        assert_eq!(kernel_elements("ipm4-n"), Some(expected(&n)));
    };
    // An element added by hand.
    nft(&[
        "add",
        "element",
        "inet",
        "ipsetmgr",
        "ipm4-a",
        "{ 10.9.9.9 }",
    ]);
    check(&mut b);
    assert_eq!(report(&b, "ipm4-a").drift.extra, 1);
    assert_eq!(report(&b, "ipm4-n").problems, 0);
    // Flushed.
    nft(&["flush", "set", "inet", "ipsetmgr", "ipm4-n"]);
    check(&mut b);
    assert_eq!(report(&b, "ipm4-n").drift.missing, 2);
    assert_eq!(report(&b, "ipm4-a").problems, 0);
    // Deleted.
    nft(&["delete", "set", "inet", "ipsetmgr", "ipm4-a"]);
    check(&mut b);
    assert!(report(&b, "ipm4-a").drift.rewritten);
    assert_eq!(report(&b, "ipm4-a").problems, 1);
    // The whole table deleted.
    nft(&["delete", "table", "inet", "ipsetmgr"]);
    check(&mut b);
    assert!(
        b.report()
            .iter()
            .all(|r| r.drift.rewritten && r.problems == 1)
    );
    // Repaired: the next resync finds nothing.
    check(&mut b);
    assert!(b.report().iter().all(|r| r.problems == 0 && r.synced));
}

/// `--backend netlink,nft`: one policy becomes an ipset and an nft set in
/// the same namespace, reported once per backend.
#[test]
fn both_backends_hold_one_policy_as_an_ipset_and_an_nft_set() {
    conformance::run(
        "both_backends_hold_one_policy_as_an_ipset_and_an_nft_set",
        conformance::Mode::Kernel,
        conformance::netlink,
        |dp, _env| {
            let ipset = ipsetmgr_dataplane::adapter::reconciler(
                ipsetmgr_dataplane::netlink::NetlinkDataplane::new().expect("ipset netlink"),
                ReconcilerConfig::default(),
            );
            let mut both =
                ipsetmgr_sets::Backends::new(vec![Box::new(ipset), Box::new(backend_like(dp))]);
            let d = desired("blocklist", SetType::HashIp, Family::V4, &["10.0.0.1"]);
            both.set_desired(vec![d.clone()], vec![]);
            let o = both.apply_updates();
            assert!(o.applied, "{:?}", o.error);
            let sets: Vec<SetRef> = both.report().into_iter().map(|r| r.set).collect();
            let by_backend: Vec<(&str, &str)> = sets
                .iter()
                .map(|s| (s.backend.name, s.name.as_str()))
                .collect();
            assert_eq!(
                by_backend,
                [("netlink", "ipm4-blocklist"), ("nft", "ipm4-blocklist")]
            );
            assert!(both.report().iter().all(|r| r.synced));
            let out = Command::new("ipset")
                .args(["list", "ipm4-blocklist"])
                .output()
                .expect("run ipset");
            assert!(out.status.success());
            assert!(String::from_utf8_lossy(&out.stdout).contains("10.0.0.1"));
            assert_eq!(kernel_elements("ipm4-blocklist"), Some(expected(&d)));
            let listed: Vec<String> = both
                .list()
                .unwrap()
                .into_iter()
                .map(|l| l.set.name)
                .collect();
            assert_eq!(listed, ["ipm4-blocklist", "inet ipsetmgr ipm4-blocklist"]);
            // `apply` shows the reports' sets as `sets` lists them.
            let shown: Vec<String> = sets.iter().map(|s| both.shown_name(s)).collect();
            assert_eq!(shown, listed);
            both.set_desired(vec![], vec![]);
            let o = both.apply_updates();
            let deleted: Vec<(&str, &str)> = o
                .deleted
                .iter()
                .map(|s| (s.backend.name, s.name.as_str()))
                .collect();
            assert_eq!(
                deleted,
                [("netlink", "ipm4-blocklist"), ("nft", "ipm4-blocklist")]
            );
        },
    );
}

/// `size` of an owned set, as `nft` lists it.
fn kernel_size(set: &str) -> Option<u32> {
    nft(&["list", "set", "inet", "ipsetmgr", set])
        .lines()
        .find_map(|l| l.trim().strip_prefix("size ")?.parse().ok())
}

/// `n` distinct IPv4 addresses.
fn addresses(n: u32) -> Vec<String> {
    (0..n)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect()
}

fn growing(n: u32, max_elem: u32) -> DesiredSet {
    let items = addresses(n);
    let items: Vec<&str> = items.iter().map(String::as_str).collect();
    let mut d = desired("grow", SetType::HashIp, Family::V4, &items);
    d.header.max_elem = max_elem;
    d
}

/// hash:net,iface's ranges can outnumber its members (each interface loses
/// the networks only other interfaces have): members that fit `maxElem`
/// fit the nft set, whose size follows the ranges when they are more, up
/// and down.
pub fn an_iface_set_holds_more_ranges_than_members(
    dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    let mut b = backend_like(dp);
    let iface = |items: &[&str]| {
        let mut d = desired("up", SetType::HashNetIface, Family::V4, items);
        d.header.max_elem = 3;
        d
    };
    for (items, ranges) in [
        (
            &["0.0.0.0/0,eth0", "10.1.0.0/16,vlan0", "10.3.0.0/16,vlan0"][..],
            5,
        ),
        (&["0.0.0.0/0,eth0", "10.1.0.0/16,vlan0"][..], 3),
        (
            &["10.0.0.0/8,eth0", "10.2.0.0/16,vlan0", "0.0.0.0/0,lo"][..],
            5,
        ),
    ] {
        let d = iface(items);
        b.set_desired(vec![d.clone()], vec![]);
        apply(&mut b);
        let r = b.report();
        assert!(r.iter().all(|r| r.synced), "{items:?}: {r:?}");
        let held = kernel_elements("ipm4-up").expect("the set");
        assert_eq!(held.len(), ranges, "{items:?}: {held:?}");
        assert_eq!(held, expected(&d));
        assert_eq!(kernel_size("ipm4-up"), Some(ranges.max(3) as u32));
    }
}

/// A blocklist that grows with its limit raised each time is recreated in
/// one transaction (the kernel sizes a hash once, at creation); a set
/// shrunk by hand is grown back; one a rule references is grown in place,
/// its new size committed before its new members (the kernel applies a
/// size at commit).
pub fn a_growing_set_takes_its_new_members(dp: &mut dyn NftDataplane, _env: &conformance::Env) {
    let mut b = backend_like(dp);
    for (n, max_elem) in [(5, 5), (20, 2048), (200_000, 262_144)] {
        let d = growing(n, max_elem);
        b.set_desired(vec![d.clone()], vec![]);
        let o = apply(&mut b);
        if n > 5 {
            // Recreated, so the kernel sizes its hash for the new limit.
            assert_eq!(written(&o), [("ipm4-grow", WriteKind::Recreate)]);
        }
        let r = b.report();
        assert!(r.iter().all(|r| r.synced), "{n} members: {r:?}");
        assert_eq!(kernel_size("ipm4-grow"), Some(max_elem), "{n} members");
        let held = kernel_elements("ipm4-grow").expect("the set");
        assert_eq!(held.len(), n as usize);
        if n <= 20 {
            assert_eq!(held, expected(&d));
        }
    }
    // Shrunk by hand below what it holds, then one more member: the
    // resync sees the size and grows it back before the insert.
    let d = growing(20, 64);
    b.set_desired(vec![d], vec![]);
    apply(&mut b);
    nft(&[
        "add",
        "set",
        "inet",
        "ipsetmgr",
        "ipm4-grow",
        "{ type ipv4_addr; size 3; }",
    ]);
    assert_eq!(kernel_size("ipm4-grow"), Some(3));
    let d = growing(21, 64);
    b.set_desired(vec![d.clone()], vec![]);
    b.queue_resync();
    apply(&mut b);
    assert_eq!(kernel_size("ipm4-grow"), Some(64));
    assert_eq!(kernel_elements("ipm4-grow"), Some(expected(&d)));
    assert!(b.report().iter().all(|r| r.synced && r.error.is_none()));
    // Referenced by a rule, it cannot be recreated: grown in place (its
    // new size committed before the new members), the rule kept.
    add_rule_on("ipm4-grow");
    b.queue_resync();
    apply(&mut b);
    let d = growing(100, 128);
    b.set_desired(vec![d.clone()], vec![]);
    let o = apply(&mut b);
    assert_eq!(written(&o), [("ipm4-grow", WriteKind::Delta)]);
    assert_eq!(kernel_size("ipm4-grow"), Some(128));
    assert_eq!(kernel_elements("ipm4-grow"), Some(expected(&d)));
    assert!(rule_text().contains("@ipm4-grow"));
}

/// Another process makes the table first, with nf_tables' `owner` flag
/// (an `nft -i` session kept open: the table lives as long as its socket).
/// The kernel then refuses every change by anyone else with EPERM; the
/// backend must say the table is owned, not that a capability is missing
/// (netlink) or that nft printed something unreadable (cli).
pub fn a_table_another_process_owns_is_named_as_such(
    dp: &mut dyn NftDataplane,
    _env: &conformance::Env,
) {
    use std::io::Write;
    let mut owner = Command::new("nft")
        .arg("-i")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run nft -i");
    let mut stdin = owner.stdin.take().expect("piped");
    writeln!(stdin, "add table inet ipsetmgr {{ flags owner; }}").unwrap();
    stdin.flush().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !nft(&["list", "tables"]).contains("inet ipsetmgr") {
        assert!(std::time::Instant::now() < deadline, "nft -i made no table");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut b = backend_like(dp);
    b.set_desired(
        vec![desired("a", SetType::HashIp, Family::V4, &["10.0.0.1"])],
        vec![],
    );
    let o = b.apply_updates();
    let why = o
        .error
        .map(|e| e.to_string())
        .or_else(|| {
            b.report()
                .into_iter()
                .find_map(|r| r.error.map(|e| e.to_string()))
        })
        .expect("an error");
    assert!(
        why.contains("table inet ipsetmgr is owned by another process"),
        "{} backend: {why}",
        b.name()
    );
    assert!(!why.contains("CAP_NET_ADMIN"), "{why}");
    drop(stdin);
    let _ = owner.wait();
}
