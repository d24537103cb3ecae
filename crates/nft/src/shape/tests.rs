use super::*;
use proptest::prelude::*;

fn members(t: SetType, items: &[&str]) -> Vec<Member> {
    items
        .iter()
        .flat_map(|s| {
            Member::parse_user(t, s)
                .unwrap_or_else(|e| panic!("{s}: {e}"))
                .members
        })
        .collect()
}

fn shape(t: SetType, f: Option<Family>) -> SetShape {
    SetShape::new(t, f, &HeaderOptions::default(), 65536).unwrap()
}

fn shown(e: &Elements) -> Vec<String> {
    e.iter().map(|e| e.to_string()).collect()
}

#[test]
fn every_type_maps_to_its_nft_set() {
    use Family::*;
    use SetType::*;
    let cases = [
        (HashIp, Some(V4), "type ipv4_addr; size 65536"),
        (HashIp, Some(V6), "type ipv6_addr; size 65536"),
        (
            HashNet,
            Some(V4),
            "type ipv4_addr; flags interval; size 65536",
        ),
        (
            HashNet,
            Some(V6),
            "type ipv6_addr; flags interval; size 65536",
        ),
        (
            HashIpPort,
            Some(V4),
            "type ipv4_addr . inet_proto . inet_service; size 65536",
        ),
        (
            HashIpPort,
            Some(V6),
            "type ipv6_addr . inet_proto . inet_service; size 65536",
        ),
        (
            HashNetPort,
            Some(V4),
            "type ipv4_addr . inet_proto . inet_service; flags interval; size 65536",
        ),
        (
            HashIpPortIp,
            Some(V4),
            "type ipv4_addr . inet_proto . inet_service . ipv4_addr; size 65536",
        ),
        (
            HashIpPortNet,
            Some(V6),
            "type ipv6_addr . inet_proto . inet_service . ipv6_addr; flags interval; size 65536",
        ),
        (
            HashNetIface,
            Some(V4),
            "type ipv4_addr . ifname; flags interval; size 65536",
        ),
        (HashMac, None, "type ether_addr; size 65536"),
        (HashIpMark, Some(V4), "type ipv4_addr . mark; size 65536"),
        (BitmapIp, Some(V4), "type ipv4_addr; size 65536"),
        (BitmapPort, None, "type inet_service; size 65536"),
    ];
    for (t, f, want) in cases {
        assert_eq!(shape(t, f).spec.to_string(), want, "{t} {f:?}");
    }
    let none = HeaderOptions::default();
    assert_eq!(
        SetShape::new(ListSet, Some(V4), &none, 8),
        Err(ShapeError::ListSet)
    );
    assert_eq!(
        SetShape::new(HashIp, None, &none, 8),
        Err(ShapeError::NoFamily(HashIp))
    );
    assert_eq!(
        SetShape::new(BitmapIp, Some(V6), &none, 8),
        Err(ShapeError::BitmapFamily)
    );
    // A hash:ip netmask is an interval set of /N networks; a bitmask that
    // is a prefix is the same; any other bitmask cannot be expressed.
    let nm = HeaderOptions {
        mask: AddrMask::prefix(24, V4).unwrap(),
        ..Default::default()
    };
    let s = SetShape::new(HashIp, Some(V4), &nm, 8).unwrap();
    assert!(s.spec.interval);
    assert_eq!(s.netmask, Some(24));
    let bm = |m: &str| HeaderOptions {
        mask: AddrMask::bits(m, V4).unwrap(),
        ..Default::default()
    };
    assert_eq!(
        SetShape::new(HashIp, Some(V4), &bm("255.255.0.0"), 8)
            .unwrap()
            .netmask,
        Some(16)
    );
    assert!(matches!(
        SetShape::new(HashIp, Some(V4), &bm("255.0.255.0"), 8),
        Err(ShapeError::Bitmask(_))
    ));
}

#[test]
fn exact_members_round_trip() {
    use Family::*;
    use SetType::*;
    let cases: [(SetType, Option<Family>, &[&str]); 8] = [
        (HashIp, Some(V4), &["10.0.0.1", "1.2.3.4"]),
        (HashIp, Some(V6), &["2001:db8::1", "::1"]),
        (
            HashIpPort,
            Some(V4),
            &["10.0.0.1,tcp:80", "10.0.0.1,udp:53", "10.0.0.2,sctp:9"],
        ),
        (
            HashIpPortIp,
            Some(V6),
            &["::1,tcp:80,::2", "::1,udplite:7,::3"],
        ),
        (HashMac, None, &["aa:bb:cc:dd:ee:ff", "00:00:00:00:00:01"]),
        (
            HashIpMark,
            Some(V4),
            &["10.0.0.1,0x10", "10.0.0.1,0xffffffff"],
        ),
        (BitmapIp, Some(V4), &["0.0.0.0", "10.0.0.9"]),
        (BitmapPort, None, &["0", "80", "65535"]),
    ];
    for (t, f, items) in cases {
        let s = shape(t, f);
        let m = members(t, items);
        let e = s.elements(&m).unwrap();
        assert_eq!(e.len(), m.len(), "{t}");
        assert!(e.is_canonical());
        let mut back = s.members(&e).unwrap();
        let mut want = m.clone();
        back.sort();
        want.sort();
        assert_eq!(back, want, "{t}");
    }
    let s = shape(HashIpPort, Some(V4));
    let e = s
        .elements(members(HashIpPort, &["10.0.0.1,tcp:80"]))
        .unwrap();
    assert_eq!(shown(&e), ["10.0.0.1 . tcp . 80"]);
    let e = shape(HashIpMark, Some(V4))
        .elements(members(HashIpMark, &["10.0.0.1,16"]))
        .unwrap();
    assert_eq!(shown(&e), ["10.0.0.1 . 0x00000010"]);
}

#[test]
fn what_nft_cannot_hold_is_refused_naming_the_member() {
    let s = shape(SetType::HashIpPort, Some(Family::V4));
    let e = s.elements(members(
        SetType::HashIpPort,
        &["10.0.0.1,tcp:80", "10.0.0.1,icmp:8/0"],
    ));
    assert_eq!(
        e,
        Err(UnrepresentableMember {
            member: "10.0.0.1,icmp:echo-request".into(),
            reason: Unrepresentable::Icmp
        })
    );
    let s = shape(SetType::HashNetIface, Some(Family::V4));
    let e = s.elements(members(SetType::HashNetIface, &["10.0.0.0/8,physdev:eth0"]));
    assert_eq!(e.unwrap_err().reason, Unrepresentable::Physdev);
    // Members of another family or type.
    let s = shape(SetType::HashIp, Some(Family::V6));
    let e = s.elements(members(SetType::HashIp, &["10.0.0.1"]));
    assert!(matches!(
        e.unwrap_err().reason,
        Unrepresentable::WrongKind(_)
    ));
    let e = s.elements(members(SetType::HashNet, &["::/64"]));
    assert!(matches!(
        e.unwrap_err().reason,
        Unrepresentable::WrongKind(_)
    ));
    // Longer than nft holds (ipset takes 255).
    let with = SetShape::new(
        SetType::HashIp,
        Some(Family::V6),
        &HeaderOptions {
            comment: true,
            ..Default::default()
        },
        8,
    )
    .unwrap();
    let long = format!("::1 comment:{}", "x".repeat(129));
    assert_eq!(
        with.elements(members(SetType::HashIp, &[&long]))
            .unwrap_err()
            .reason,
        Unrepresentable::CommentTooLong
    );
    let ok = format!("::1 comment:{}", "x".repeat(128));
    assert!(with.elements(members(SetType::HashIp, &[&ok])).is_ok());
    // A comment where the policy has none.
    let e = s.elements(members(SetType::HashIp, &["::1 comment:x"]));
    assert_eq!(e.unwrap_err().reason, Unrepresentable::Comment);
}

#[test]
fn nomatch_becomes_holes_per_exact_part() {
    let t = SetType::HashNet;
    let s = shape(t, Some(Family::V4));
    let e = s
        .elements(members(
            t,
            &[
                "10.0.0.0/8",
                "10.1.0.0/16 nomatch",
                "10.0.0.0/9",
                "0.0.0.0/0 nomatch",
                "1.2.3.4",
            ],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        ["1.2.3.4", "10.0.0.0/16", "10.2.0.0-10.255.255.255"]
    );
    let back: Vec<String> = s
        .members(&e)
        .unwrap()
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(back[..3], ["1.2.3.4", "10.0.0.0/16", "10.2.0.0/15"]);
    // Per port: the nomatch of tcp:80 leaves tcp:81 whole.
    let t = SetType::HashNetPort;
    let s = shape(t, Some(Family::V4));
    let e = s
        .elements(members(
            t,
            &["10.0.0.0/8,80", "10.0.0.0/8,81", "10.128.0.0/9,80 nomatch"],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        ["10.0.0.0/9 . tcp . 80", "10.0.0.0/8 . tcp . 81"]
    );
    let t = SetType::HashIpPortNet;
    let s = shape(t, Some(Family::V4));
    let e = s
        .elements(members(
            t,
            &[
                "1.1.1.1,80,10.0.0.0/8",
                "1.1.1.1,80,10.0.0.0/9 nomatch",
                "2.2.2.2,80,10.0.0.0/9",
            ],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "1.1.1.1 . tcp . 80 . 10.128.0.0/9",
            "2.2.2.2 . tcp . 80 . 10.0.0.0/9"
        ]
    );
    let t = SetType::HashNetIface;
    let s = shape(t, Some(Family::V4));
    let e = s
        .elements(members(
            t,
            &["0.0.0.0/0,eth0", "10.0.0.0/8,eth0 nomatch", "10.0.0.0/8,lo"],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "0.0.0.0-9.255.255.255 . \"eth0\"",
            "10.0.0.0/8 . \"lo\"",
            "11.0.0.0-255.255.255.255 . \"eth0\""
        ]
    );
    let back: Vec<String> = s
        .members(&e)
        .unwrap()
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert!(back.contains(&"128.0.0.0/1,eth0".to_string()), "{back:?}");
}

/// hash:net,iface: the most specific network holding the address decides,
/// whatever its interface (issue 30.2; the kernel's rule, docs/nftables.md).
/// An address whose most specific network is another interface's is out
/// for this one, even inside this interface's wider network.
#[test]
fn iface_most_specific_network_decides_whatever_its_interface() {
    let t = SetType::HashNetIface;
    let s = shape(t, Some(Family::V4));
    // The example.
    let e = s
        .elements(members(
            t,
            &["10.0.0.0/8,eth0", "10.2.0.0/16,vlan0", "0.0.0.0/0,lo"],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "0.0.0.0-9.255.255.255 . \"lo\"",
            "10.0.0.0/15 . \"eth0\"",
            "10.2.0.0/16 . \"vlan0\"",
            "10.3.0.0-10.255.255.255 . \"eth0\"",
            "11.0.0.0-255.255.255.255 . \"lo\"",
        ]
    );
    // The members checked by hand against `ipset test` on a kernel: eth0
    // loses 10.2.0.0/16 and 10.3.0.0/16, lo loses 10.0.0.0/8.
    let e = s
        .elements(members(
            t,
            &[
                "10.0.0.0/8,eth0",
                "10.2.0.0/16,vlan0",
                "0.0.0.0/1,lo",
                "128.0.0.0/1,lo",
                "10.3.0.0/16,eth1",
            ],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "0.0.0.0-9.255.255.255 . \"lo\"",
            "10.0.0.0/15 . \"eth0\"",
            "10.2.0.0/16 . \"vlan0\"",
            "10.3.0.0/16 . \"eth1\"",
            "10.4.0.0-10.255.255.255 . \"eth0\"",
            "11.0.0.0-255.255.255.255 . \"lo\"",
        ]
    );
    // Another interface's nomatch network decides too (it is out for every
    // interface that lacks that network); the same network on two
    // interfaces decides for each by its own flag.
    let e = s
        .elements(members(
            t,
            &[
                "10.0.0.0/8,eth0",
                "10.1.0.0/16,lo nomatch",
                "10.0.0.0/8,lo nomatch",
                "10.2.0.0/16,lo",
                "10.2.0.0/16,eth0 nomatch",
            ],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "10.0.0.0/16 . \"eth0\"",
            "10.2.0.0/16 . \"lo\"",
            "10.3.0.0-10.255.255.255 . \"eth0\"",
        ]
    );
    // One interface alone: nothing added, as before.
    let e = s
        .elements(members(t, &["10.0.0.0/8,eth0", "10.1.0.0/16,eth0 nomatch"]))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "10.0.0.0/16 . \"eth0\"",
            "10.2.0.0-10.255.255.255 . \"eth0\"",
        ]
    );
}

#[test]
fn comments_ride_on_the_ranges_they_decide() {
    let t = SetType::HashNet;
    let opts = HeaderOptions {
        comment: true,
        ..Default::default()
    };
    let s = SetShape::new(t, Some(Family::V4), &opts, 10).unwrap();
    let e = s
        .elements(members(
            t,
            &[
                "10.0.0.0/8 comment:office",
                "10.1.0.0/16 comment:lab",
                "11.0.0.0/8 comment:office",
            ],
        ))
        .unwrap();
    assert_eq!(
        shown(&e),
        [
            "10.0.0.0/16 comment \"office\"",
            "10.1.0.0/16 comment \"lab\"",
            "10.2.0.0-11.255.255.255 comment \"office\""
        ]
    );
    let back = s.members(&e).unwrap();
    assert_eq!(back[0].to_string(), "10.0.0.0/16 comment \"office\"");
}

#[test]
fn netmask_sets_hold_networks() {
    let opts = HeaderOptions {
        mask: AddrMask::prefix(24, Family::V4).unwrap(),
        ..Default::default()
    };
    let s = SetShape::new(SetType::HashIp, Some(Family::V4), &opts, 10).unwrap();
    let e = s
        .elements(members(
            SetType::HashIp,
            &["10.0.0.0", "10.0.1.0", "10.0.3.0"],
        ))
        .unwrap();
    assert_eq!(shown(&e), ["10.0.0.0/23", "10.0.3.0/24"]);
    let back: Vec<String> = s
        .members(&e)
        .unwrap()
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(back, ["10.0.0.0", "10.0.1.0", "10.0.3.0"]);
}

proptest! {
    /// hash:net,port: per (proto, port), an address is in an element iff
    /// ipset's longest-prefix rule matches it.
    #[test]
    fn concatenated_nomatch_matches_ipset(
        items in prop::collection::vec((0u32..1024, 22u8..=32, 0u16..3, any::<bool>()), 0..20),
        probes in prop::collection::vec((0u32..1024, 0u16..3), 48),
    ) {
        let base = 0x0a00_0000u32;
        let ms: Vec<Member> = items.iter().map(|&(a, p, port, n)| {
            let addr = IpAddr::V4((base + a).into());
            Member::NetPort { addr: ipsetmgr_ipset::mask(addr, p), prefix: p, proto: Proto::Udp, port, nomatch: n }
        }).collect();
        let s = shape(SetType::HashNetPort, Some(Family::V4));
        let e = s.elements(&ms).unwrap();
        prop_assert!(e.is_canonical());
        let typed = e.typed().unwrap();
        for (a, port) in probes {
            let addr = base + a;
            let mut best: Option<(u8, bool)> = None;
            for &(ma, p, mport, n) in &items {
                let m = u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0);
                if mport == port && (base + ma) & m == addr & m {
                    best = match best {
                        Some((bp, bn)) if bp == p => Some((bp, bn || n)),
                        Some((bp, _)) if bp > p => best,
                        _ => Some((p, n)),
                    };
                }
            }
            let want = best.is_some_and(|(_, n)| !n);
            let a4 = std::net::Ipv4Addr::from(addr);
            let got = typed.iter().any(|el| {
                let end = el.key_end.as_ref().unwrap();
                matches!((&el.key[0], &end[0]), (Value::Ipv4(f), Value::Ipv4(l)) if *f <= a4 && a4 <= *l)
                    && el.key[2] == Value::Service(port)
            });
            prop_assert_eq!(got, want, "{} udp:{}", a4, port);
        }
        // Elements -> networks -> elements: the same ranges.
        let again = s.elements(s.members(&e).unwrap()).unwrap();
        prop_assert_eq!(again, e);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    /// The hash:ip IPv4 shortcut gives the elements of the general path, for
    /// a set as compiled (packed and sorted) and as grown one by one; other
    /// kinds take the general path.
    #[test]
    fn elements_of_a_set_are_the_elements_of_its_members(
        addrs in prop::collection::vec(any::<u32>(), 0..200),
        netmask in any::<bool>(),
    ) {
        use ipsetmgr_ipset::MemberSetBuilder;
        let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
        let options = HeaderOptions {
            mask: netmask.then_some(AddrMask::Prefix(24)),
            ..Default::default()
        };
        let s = SetShape::new(SetType::HashIp, Some(Family::V4), &options, 65536).unwrap();
        let members: Vec<Member> = addrs
            .iter()
            .map(|a| Member::Ip(std::net::Ipv4Addr::from(*a).into()))
            .collect();
        let mut b = MemberSetBuilder::with_capacity(kind, members.len());
        members.iter().cloned().for_each(|m| b.push(m));
        let compiled = b.finish().0;
        prop_assert_eq!(compiled.sorted_ipv4_hosts().is_some(), true);
        let grown = MemberSet::from_members(kind, members.clone());
        let general = s.elements(&members).unwrap();
        prop_assert_eq!(s.elements_of_set(&compiled).unwrap(), general.clone());
        prop_assert_eq!(s.elements_of_set(&grown).unwrap(), general);
    }
}

#[test]
fn a_refused_member_is_quoted_cut_to_the_documented_bound() {
    let options = HeaderOptions {
        comment: true,
        ..HeaderOptions::default()
    };
    let s = SetShape::new(SetType::HashIpPort, Some(Family::V4), &options, 1024).unwrap();
    // nft holds element comments of up to 128 bytes; ipset up to 255.
    let long = format!("10.0.0.1,tcp:80 comment:{}", "x".repeat(200));
    let e = s
        .elements(members(SetType::HashIpPort, &[&long]))
        .unwrap_err();
    assert_eq!(e.reason, Unrepresentable::CommentTooLong);
    assert!(e.member.len() <= MAX_QUOTED_MEMBER, "{}", e.member);
    assert!(
        e.member.starts_with("10.0.0.1,tcp:80 comment \"xxx"),
        "{}",
        e.member
    );
    assert!(e.member.ends_with("bytes cut)"), "{}", e.member);
}
