//! The trie answers as ipset's hash:net does (issue 35): for random member
//! lists with `nomatch` entries and nesting networks, the kernel's own
//! longest-prefix lookup of every probe address (a /32 or /128 key, as the
//! XDP program looks up a packet's source) equals a pure model of hash:net
//! semantics: the most specific entry that covers the address decides,
//! `nomatch` meaning "not in the set", no entry meaning not in the set
//! either. The dump, read by `bpftool` and by the crate, is exactly the
//! entries written.
//!
//! Probes: each network's first and last address, the addresses just below
//! and above it, and random ones. Networks sit in a small region (a /16 of
//! IPv4, a /112 of IPv6) with up to two wider ones around it, so they nest
//! and nomatch falls inside nomatch all the time. One network appears once
//! (a compiled policy never holds it both with and without `nomatch`).
//!
//! All cases run in one fresh network and mount namespace (tests/support),
//! each case its own set, deleted after it. Cases: 32 (IPv4) and 12 (IPv6)
//! unless `PROPTEST_CASES` says otherwise. Needs root and bpftool.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipsetmgr_bpf::{Bpffs, Entry};
use ipsetmgr_ipset::Family;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::{bpftool_entries, fresh_bpffs};

fn bits(family: Family) -> u32 {
    u32::from(family.max_prefix())
}

fn addr_of(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::from(std::net::Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::from(std::net::Ipv6Addr::from(n)),
    }
}

fn num(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn host_mask(family: Family, prefix: u8) -> u128 {
    let host = bits(family) - u32::from(prefix);
    if host == 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    }
}

/// The pure model: ipset hash:net's answer for `addr`.
fn model(entries: &[Entry], family: Family, addr: u128) -> Option<bool> {
    entries
        .iter()
        .filter(|e| addr & !host_mask(family, e.prefix()) == num(e.addr()))
        .max_by_key(|e| e.prefix())
        .map(|e| !e.nomatch())
}

/// A case: entries (one per network) and random probe addresses.
fn case(family: Family) -> impl Strategy<Value = (Vec<Entry>, Vec<u128>)> {
    let (region, region_len, all) = match family {
        Family::V4 => (0x0a14_0000u128, 16u8, u128::from(u32::MAX)),
        Family::V6 => (0x2001_0db8u128 << 96, 112u8, u128::MAX),
    };
    let width = bits(family) as u8;
    let inner = (
        0..=host_mask(family, region_len),
        region_len..=width,
        any::<bool>(),
    );
    let outer = (0..=all, 1u8..region_len, any::<bool>());
    (
        proptest::collection::vec(inner, 1..40),
        proptest::collection::vec(outer, 0..3),
        proptest::collection::vec(0..=host_mask(family, region_len), 0..24),
    )
        .prop_map(move |(inner, outer, random)| {
            let mut by_net = BTreeMap::new();
            let inner = inner.into_iter().map(|(off, p, nm)| (region | off, p, nm));
            // A wider network around the region: the region's own address.
            let outer = outer.into_iter().map(|(_, p, nm)| (region, p, nm));
            for (a, p, nm) in inner.chain(outer) {
                let e = Entry::new(addr_of(family, a), p, nm).unwrap();
                by_net.entry((e.addr(), e.prefix())).or_insert(e);
            }
            let random = random.into_iter().map(|r| region | r).collect();
            (by_net.into_values().collect(), random)
        })
}

fn probes(family: Family, entries: &[Entry], random: &[u128]) -> Vec<u128> {
    let max = if family == Family::V4 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    let mut out: Vec<u128> = random.to_vec();
    for e in entries {
        let first = num(e.addr());
        let last = first | host_mask(family, e.prefix());
        out.extend([
            first,
            last,
            first.saturating_sub(1),
            last.saturating_add(1).min(max),
        ]);
    }
    out.sort();
    out.dedup();
    out
}

fn run(fs: &Bpffs, family: Family, cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(cases),
        ..Config::default()
    });
    let n = std::cell::Cell::new(0);
    runner
        .run(&case(family), |(entries, random)| {
            n.set(n.get() + 1);
            let name = format!("ipm-case{}", n.get());
            let set = fs
                .create(&name, family, entries.len() as u32, &entries)
                .unwrap();
            let mut sorted = entries.clone();
            sorted.sort();
            prop_assert_eq!(&set.read().unwrap(), &sorted, "the crate's dump");
            prop_assert_eq!(&bpftool_entries(set.path()), &sorted, "bpftool's dump");
            for a in probes(family, &entries, &random) {
                let addr = addr_of(family, a);
                let kernel = set.lookup(addr).unwrap().unwrap_or(false);
                let want = model(&entries, family, a).unwrap_or(false);
                prop_assert_eq!(kernel, want, "probe {} of entries {:?}", addr, sorted);
            }
            fs.delete(&name).unwrap();
            Ok(())
        })
        .unwrap();
}

#[test]
fn longest_prefix_lookup_is_hash_net_nomatch_semantics() {
    std::thread::spawn(|| {
        let Some(fs) = fresh_bpffs("longest_prefix_lookup_is_hash_net_nomatch_semantics") else {
            return;
        };
        run(&fs, Family::V4, 32);
        run(&fs, Family::V6, 12);
    })
    .join()
    .unwrap();
}
