//! Tests of `spec.except`: what drops, what is cut with a nomatch entry,
//! what is refused, and a model of the kernel's lookup (most specific
//! prefix first, per the entry's other parts) over random members.

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;

use super::*;
use crate::IPSetPolicySpec;
use ipsetmgr_api::policy::FamilySpec;
use ipsetmgr_ipset::Member;

fn naming() -> Naming {
    Naming::new("ipm").unwrap()
}

fn with_except(t: SetType, fam: FamilySpec, members: &[&str], except: &[&str]) -> IPSetPolicy {
    let mut spec = IPSetPolicySpec::new(t, fam, members.iter().map(|s| s.to_string()).collect());
    spec.except = except.iter().map(|s| s.to_string()).collect();
    IPSetPolicy::new("p", spec)
}

/// The one set's members as strings, and the excepted count.
fn compiled(p: &IPSetPolicy) -> (Vec<String>, u64) {
    let c = compile([p], &naming(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.sets.len(), 1);
    let excepted = c.excepted.get("p").copied().unwrap_or(0);
    (c.sets[0].members.sorted_strings(), excepted)
}

fn errors(p: &IPSetPolicy) -> Vec<String> {
    let c = compile([p], &naming(), None);
    assert!(c.sets.is_empty());
    assert_eq!(c.held, vec!["p".to_string()]);
    c.errors.iter().map(|e| e.to_string()).collect()
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn hash_net_drops_inside_and_cuts_around() {
    let p = with_except(
        SetType::HashNet,
        FamilySpec::IPv4,
        &["10.0.0.0/8", "10.1.2.0/24", "192.168.1.5", "172.16.0.0/12"],
        &["10.1.0.0/16", "192.168.0.0/16"],
    );
    let (members, excepted) = compiled(&p);
    assert_eq!(
        members,
        sorted(&["10.0.0.0/8", "10.1.0.0/16 nomatch", "172.16.0.0/12"])
    );
    // 10.0.0.0/8 cut, 10.1.2.0/24 and 192.168.1.5 dropped.
    assert_eq!(excepted, 3);
}

#[test]
fn a_member_covered_by_two_ranges_drops() {
    let p = with_except(
        SetType::HashNet,
        FamilySpec::IPv4,
        &["10.0.0.0/24"],
        &["10.0.0.0/25", "10.0.0.128/25"],
    );
    assert_eq!(compiled(&p), (vec![], 1));
}

#[test]
fn nested_and_host_bits_ranges_collapse() {
    let p = with_except(
        SetType::HashNet,
        FamilySpec::IPv4,
        &["10.0.0.0/8"],
        &["10.1.2.3/16", "10.1.2.0/24"],
    );
    assert_eq!(
        compiled(&p).0,
        sorted(&["10.0.0.0/8", "10.1.0.0/16 nomatch"])
    );
}

#[test]
fn no_except_keeps_the_same_members() {
    let p = with_except(
        SetType::HashNet,
        FamilySpec::IPv4,
        &["10.0.0.0/8"],
        &["192.168.0.0/16"],
    );
    assert_eq!(compiled(&p), (vec!["10.0.0.0/8".to_string()], 0));
}

#[test]
fn hash_ip_and_single_address_types_drop() {
    let p = with_except(
        SetType::HashIp,
        FamilySpec::Dual,
        &["10.0.0.1", "10.0.0.2", "2001:db8::1", "2001:db8:1::1"],
        &["10.0.0.2", "2001:db8::/48"],
    );
    let c = compile([&p], &naming(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let all: Vec<String> = c
        .sets
        .iter()
        .flat_map(|s| s.members.sorted_strings())
        .collect();
    assert_eq!(all, vec!["10.0.0.1", "2001:db8:1::1"]);
    assert_eq!(c.excepted["p"], 2);

    let p = with_except(
        SetType::HashIpPortIp,
        FamilySpec::IPv4,
        &["10.0.0.1,udp:53,10.0.0.2", "10.0.0.3,udp:53,192.0.2.1"],
        &["192.0.2.0/24"],
    );
    assert_eq!(
        compiled(&p),
        (vec!["10.0.0.1,udp:53,10.0.0.2".to_string()], 1)
    );
}

#[test]
fn multi_part_types_keep_their_other_parts_in_the_nomatch_entry() {
    let p = with_except(
        SetType::HashNetPort,
        FamilySpec::IPv4,
        &["10.0.0.0/8,tcp:80", "10.0.0.0/8,udp:53"],
        &["10.1.0.0/16"],
    );
    assert_eq!(
        compiled(&p),
        (
            sorted(&[
                "10.0.0.0/8,tcp:80",
                "10.0.0.0/8,udp:53",
                "10.1.0.0/16,tcp:80 nomatch",
                "10.1.0.0/16,udp:53 nomatch",
            ]),
            2
        )
    );
    let p = with_except(
        SetType::HashNetIface,
        FamilySpec::IPv4,
        &["0.0.0.0/0,eth0", "10.0.0.0/8,physdev:eth1"],
        &["10.1.2.3"],
    );
    assert_eq!(
        compiled(&p).0,
        sorted(&[
            "0.0.0.0/0,eth0",
            "10.0.0.0/8,physdev:eth1",
            "10.1.2.3,eth0 nomatch",
            "10.1.2.3,physdev:eth1 nomatch",
        ])
    );
    // The first address drops its member; the network is cut.
    let p = with_except(
        SetType::HashIpPortNet,
        FamilySpec::IPv4,
        &["10.9.9.9,tcp:22,10.0.0.0/8", "192.0.2.1,tcp:22,10.0.0.0/8"],
        &["10.9.0.0/16"],
    );
    assert_eq!(
        compiled(&p),
        (
            sorted(&[
                "192.0.2.1,tcp:22,10.0.0.0/8",
                "192.0.2.1,tcp:22,10.9.0.0/16 nomatch",
            ]),
            2
        )
    );
}

#[test]
fn netmask_entries_drop_whole_or_refuse_a_cut() {
    let mut p = with_except(
        SetType::HashIp,
        FamilySpec::IPv4,
        &["10.0.0.5", "10.0.1.5"],
        &["10.0.1.0/24"],
    );
    p.spec.netmask = Some(24);
    assert_eq!(compiled(&p), (vec!["10.0.0.0".to_string()], 1));
    p.spec.except = vec!["10.0.0.128/25".into()];
    let errs = errors(&p);
    assert!(
        errs[0].contains("\"10.0.0.128/25\" cuts the entry 10.0.0.0 (netmask /24)"),
        "{errs:?}"
    );
}

#[test]
fn refusals_name_the_policy_the_entry_and_the_reason() {
    let mut cases: Vec<(IPSetPolicy, &str)> = vec![
        (
            with_except(SetType::HashNet, FamilySpec::IPv4, &[], &["2001:db8::/32"]),
            "policy \"p\": spec.except entry \"2001:db8::/32\" is an IPv6 range but the policy family is IPv4",
        ),
        (
            with_except(SetType::HashNet, FamilySpec::IPv4, &[], &["example.com"]),
            "spec.except entry \"example.com\" is not a CIDR or address",
        ),
        (
            with_except(
                SetType::HashNet,
                FamilySpec::IPv4,
                &[],
                &["10.0.0.0/8 nomatch"],
            ),
            "without nomatch or comment",
        ),
        (
            with_except(SetType::HashMac, FamilySpec::IPv4, &[], &["10.0.0.0/8"]),
            "spec.except applies to types with an address part; hash:mac has none",
        ),
        (
            with_except(SetType::ListSet, FamilySpec::IPv4, &[], &["10.0.0.0/8"]),
            "list:set has none",
        ),
    ];
    let mut bitmap = with_except(SetType::BitmapPort, FamilySpec::IPv4, &[], &["10.0.0.0/8"]);
    bitmap.spec.range = Some("0-1023".into());
    cases.push((bitmap, "bitmap:port has none"));
    let mut bitmask = with_except(SetType::HashIp, FamilySpec::IPv4, &[], &["10.0.0.0/8"]);
    bitmask.spec.bitmask = Some("255.0.255.0".into());
    cases.push((bitmask, "cannot be used with bitmask"));
    let many: Vec<String> = (0..1025u32)
        .map(|i| Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect();
    let mut too_many = with_except(SetType::HashNet, FamilySpec::IPv4, &[], &[]);
    too_many.spec.except = many;
    cases.push((too_many, "spec.except has 1025 entries; at most 1024"));
    let mut full = with_except(
        SetType::HashNet,
        FamilySpec::IPv4,
        &["10.0.0.0/8", "11.0.0.0/8"],
        &["10.1.0.0/16", "11.1.0.0/16"],
    );
    full.spec.max_elem = Some(3);
    cases.push((
        full,
        "spec.except adds 2 nomatch entries to 2 members, which exceeds maxElem 3",
    ));
    for (p, want) in cases {
        let errs = errors(&p);
        assert!(errs.iter().any(|e| e.contains(want)), "{want}: {errs:?}");
    }
}

#[test]
fn extra_except_applies_and_keys_the_cache() {
    let p = with_except(SetType::HashNet, FamilySpec::IPv4, &["10.0.0.0/8"], &[]);
    let mut p = p;
    p.metadata.generation = Some(1);
    p.metadata.uid = Some("u".into());
    let extra = vec!["10.0.0.0/9".to_string()];
    let mut cache = MemberCache::default();
    let run = |extra: &[String], cache: &mut MemberCache| {
        let mut input = PolicyInput::new(&p, Vec::new());
        input.extra_except = extra;
        let c = compile_inputs(&[input], &naming(), None, cache);
        (
            c.sets[0].members.sorted_strings(),
            c.excepted.get("p").copied(),
        )
    };
    assert_eq!(run(&[], &mut cache), (vec!["10.0.0.0/8".to_string()], None));
    let cut = (sorted(&["10.0.0.0/8", "10.0.0.0/9 nomatch"]), Some(1));
    assert_eq!(run(&extra, &mut cache), cut);
    // From the cache: the same, count included.
    assert_eq!(run(&extra, &mut cache), cut);
}

/// A small model: members and except ranges within 10.0.0.0/24 (every
/// address can be tried), the kernel's hash:net lookup over the compiled
/// set, against "matched by the members and not excepted".
fn net(addr: u8, prefix: u8) -> String {
    let a = ipsetmgr_ipset::mask(IpAddr::V4(Ipv4Addr::new(10, 0, 0, addr)), prefix);
    format!("{a}/{prefix}")
}

fn inside(a: u32, addr: IpAddr, prefix: u8) -> bool {
    let IpAddr::V4(n) = addr else { return false };
    let m = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    a & m == u32::from(n) & m
}

/// The kernel's hash:net test: the most specific entry holding `a`
/// decides.
fn kernel_matches(set: &MemberSet, a: u32) -> bool {
    let mut best: Option<(u8, bool)> = None;
    for m in set.iter() {
        if let Member::Net {
            addr,
            prefix,
            nomatch,
        } = m
            && inside(a, addr, prefix)
            && best.is_none_or(|(p, _)| prefix > p)
        {
            best = Some((prefix, !nomatch));
        }
    }
    best.is_some_and(|(_, matched)| matched)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn hash_net_matches_exactly_the_members_outside_except(
        members in prop::collection::vec((any::<u8>(), 24u8..=32, prop::bool::weighted(0.2)), 0..12),
        except in prop::collection::vec((any::<u8>(), 24u8..=32), 0..5),
    ) {
        let member_strs: Vec<String> = members
            .iter()
            .map(|(a, p, nm)| format!("{}{}", net(*a, *p), if *nm { " nomatch" } else { "" }))
            .collect();
        let except_strs: Vec<String> = except.iter().map(|(a, p)| net(*a, *p)).collect();
        let mut spec = IPSetPolicySpec::new(SetType::HashNet, FamilySpec::IPv4, member_strs.clone());
        spec.except = except_strs;
        let p = IPSetPolicy::new("p", spec);
        let without = IPSetPolicy::new(
            "p",
            IPSetPolicySpec::new(SetType::HashNet, FamilySpec::IPv4, member_strs),
        );
        let c = compile([&p], &naming(), None);
        let plain = compile([&without], &naming(), None);
        // Members that are both nomatch and not: refused alike.
        prop_assume!(plain.errors.is_empty());
        prop_assert!(c.errors.is_empty(), "{:?}", c.errors);
        for host in 0..=255u8 {
            let a = u32::from(Ipv4Addr::new(10, 0, 0, host));
            let excepted = except.iter().any(|(e, ep)| {
                inside(a, IpAddr::V4(Ipv4Addr::new(10, 0, 0, *e)), *ep)
            });
            let want = kernel_matches(&plain.sets[0].members, a) && !excepted;
            prop_assert_eq!(kernel_matches(&c.sets[0].members, a), want, "10.0.0.{}", host);
        }
    }
}
