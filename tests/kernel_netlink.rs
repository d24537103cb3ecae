//! The netlink backend against the real kernel. Every test runs on its own
//! thread inside a fresh network namespace (only that thread moves; the
//! namespace and its sets vanish with it). Without root they skip, except
//! under `CI=true`, where they fail.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::Instant;

use ipsetmgr_dataplane::netlink::NetlinkDataplane;
use ipsetmgr_dataplane::{Dataplane, DataplaneError, Op};
use ipsetmgr_ipset::{Family, Member, MemberSet, Proto, SetHeader, SetKind, SetType};
#[path = "common/kernel_gate.rs"]
mod kernel_gate;

fn in_netns(f: impl FnOnce() + Send + 'static) {
    let h = std::thread::spawn(move || {
        if !kernel_gate::enter_fresh_netns("kernel_netlink") {
            return;
        }
        f()
    });
    if let Err(p) = h.join() {
        std::panic::resume_unwind(p);
    }
}

fn dp() -> NetlinkDataplane {
    NetlinkDataplane::new().expect("netlink backend available")
}

fn header(t: SetType, f: Option<Family>, max_elem: u32) -> SetHeader {
    SetHeader {
        kind: SetKind::new(t, f),
        max_elem,
        hash_size: if t.is_hash() { Some(1024) } else { None },
        options: Default::default(),
    }
}

fn ipset(args: &[&str]) -> String {
    let out = Command::new("ipset")
        .args(args)
        .output()
        .expect("run ipset");
    assert!(
        out.status.success(),
        "ipset {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Members of one set as `ipset save` prints them, parsed by our own parser.
fn saved_members(set: &str, t: SetType) -> Vec<String> {
    let out = ipset(&["save", set]);
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("add {set} ")))
        .map(|m| {
            Member::parse_kernel(t, m)
                .expect("parse ipset save")
                .to_string()
        })
        .collect();
    v.sort();
    v
}

fn v4(n: u32) -> Member {
    Member::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
}

fn parse(t: SetType, items: &[&str]) -> Vec<Member> {
    items
        .iter()
        .flat_map(|s| Member::parse_user(t, s).unwrap().members)
        .collect()
}

#[test]
fn protocol_and_type_probe() {
    in_netns(|| {
        let mut d = dp();
        let p = d.protocol();
        assert!(p.kernel_max >= 6 && (6..=7).contains(&p.used), "{p:?}");
        println!("kernel ipset protocol {}..={}", p.kernel_min, p.kernel_max);
        assert_eq!(d.supports(SetType::HashIp), Some(true));
        assert_eq!(d.supports(SetType::HashNet), Some(true));
        assert_eq!(d.supports(SetType::HashIpPort), Some(true));
        assert_eq!(d.supports(SetType::ListSet), Some(true));
        assert_eq!(d.supports(SetType::HashMac), Some(false));
        // The CI kernel's set of types (probed with ipset create in a
        // throwaway namespace): it has every new type but hash:ip,mark.
        for t in [
            SetType::HashNetPort,
            SetType::HashIpPortIp,
            SetType::HashIpPortNet,
            SetType::HashNetIface,
            SetType::BitmapIp,
            SetType::BitmapPort,
        ] {
            assert_eq!(d.supports(t), Some(true), "{t}");
        }
        assert_eq!(d.supports(SetType::HashIpMark), Some(false));
        let info = d.probe_type(SetType::HashIp, Some(Family::V6)).unwrap();
        assert!(info.is_some_and(|i| i.max_revision >= i.min_revision));
    });
}

#[test]
fn create_and_read_back_every_supported_type() {
    in_netns(|| {
        let mut d = dp();
        let cases: Vec<(SetType, Option<Family>, Vec<&str>)> = vec![
            (
                SetType::HashIp,
                Some(Family::V4),
                vec!["10.0.0.1", "192.168.1.255"],
            ),
            (
                SetType::HashIp,
                Some(Family::V6),
                vec!["2001:db8::1", "::1"],
            ),
            (
                SetType::HashNet,
                Some(Family::V4),
                vec![
                    "10.0.0.0/8",
                    "192.168.7.1",
                    "10.2.0.0/16 nomatch",
                    "0.0.0.0/0",
                ],
            ),
            (
                SetType::HashNet,
                Some(Family::V6),
                vec!["2001:db8::/32", "fe80::1", "2001:db9::/48 nomatch"],
            ),
            (
                SetType::HashIpPort,
                Some(Family::V4),
                vec![
                    "10.0.0.1,tcp:80",
                    "10.0.0.1,udp:53",
                    "10.0.0.2,sctp:9",
                    "10.0.0.3,icmp:echo-request",
                    "10.0.0.3,icmp:3/8",
                    "10.0.0.4,udplite:7",
                ],
            ),
            (
                SetType::HashIpPort,
                Some(Family::V6),
                vec!["::1,tcp:443", "2001:db8::2,ipv6-icmp:echo-request"],
            ),
        ];
        for (i, (t, f, items)) in cases.iter().enumerate() {
            let name = format!("ipm-t{i}");
            let h = header(*t, *f, 5000);
            let members = MemberSet::from_members(h.kind, parse(*t, items));
            d.apply(&[
                Op::Create {
                    set: &name,
                    header: &h,
                },
                Op::Add {
                    set: &name,
                    members: &members,
                },
            ])
            .unwrap();
            let ks = d.read_set(&name).unwrap().expect("set exists");
            let kh = ks.header.expect("managed header");
            assert!(h.compatible_with(&kh), "{h:?} vs {kh:?}");
            assert_eq!(kh.kind, h.kind);
            assert_eq!(kh.max_elem, 5000);
            assert_eq!(ks.unparsable_members, 0);
            assert_eq!(ks.members.as_ref(), Some(&members), "{name}");
            let mut want = members.sorted_strings();
            want.sort();
            assert_eq!(saved_members(&name, *t), want, "{name}");
        }
        // list:set over two of them; its size is max_elem.
        let h = header(SetType::ListSet, Some(Family::V4), 8);
        let members = MemberSet::from_members(
            h.kind,
            [Member::Set("ipm-t0".into()), Member::Set("ipm-t2".into())],
        );
        d.apply(&[
            Op::Create {
                set: "ipm-list",
                header: &h,
            },
            Op::Add {
                set: "ipm-list",
                members: &members,
            },
        ])
        .unwrap();
        let ks = d.read_set("ipm-list").unwrap().unwrap();
        let kh = ks.header.unwrap();
        assert!(h.compatible_with(&kh), "{h:?} vs {kh:?}");
        assert_eq!(kh.max_elem, 8);
        assert_eq!(ks.members.unwrap().sorted_strings(), ["ipm-t0", "ipm-t2"]);
        assert_eq!(
            saved_members("ipm-list", SetType::ListSet),
            ["ipm-t0", "ipm-t2"]
        );
        // The listed sets are referenced now.
        assert_eq!(d.read_set("ipm-t0").unwrap().unwrap().references, 1);
        // A missing set reads as None.
        assert_eq!(d.read_set("ipm-none").unwrap(), None);
    });
}

#[test]
fn foreign_sets_read_as_unmanaged() {
    in_netns(|| {
        let mut d = dp();
        ipset(&["create", "ipm-timeout", "hash:ip", "timeout", "300"]);
        ipset(&["add", "ipm-timeout", "10.0.0.1"]);
        // A type this project does not manage (bitmap:port now is one).
        ipset(&[
            "create",
            "ipm-bitmap",
            "bitmap:ip,mac",
            "range",
            "10.0.0.0/24",
        ]);
        ipset(&["add", "ipm-bitmap", "10.0.0.7"]);
        ipset(&["create", "ipm-netmask", "hash:ip", "netmask", "24"]);
        let ks = d.read_set("ipm-timeout").unwrap().unwrap();
        assert_eq!(ks.unparsable_members, 1);
        assert_eq!(ks.unmanaged_options, ["timeout 300"]);
        let ks = d.read_set("ipm-bitmap").unwrap().unwrap();
        assert_eq!(
            (ks.header, ks.members, ks.unparsable_members),
            (None, None, 1)
        );
        // hash:ip's netmask is managed now: in the header's options.
        let ks = d.read_set("ipm-netmask").unwrap().unwrap();
        let mask = ks.header.unwrap().options.mask;
        assert_eq!(mask.map(|m| m.to_string()).as_deref(), Some("netmask 24"));
        assert!(
            ks.unmanaged_options.is_empty(),
            "{:?}",
            ks.unmanaged_options
        );
    });
}

#[test]
fn add_and_del_100k() {
    in_netns(|| {
        let mut d = dp();
        let h = header(SetType::HashIp, Some(Family::V4), 1 << 20);
        let all = MemberSet::from_members(h.kind, (0..100_000).map(v4));
        let half = MemberSet::from_members(h.kind, (0..50_000).map(|n| v4(n * 2)));
        d.apply(&[
            Op::Create {
                set: "ipm4-big",
                header: &h,
            },
            Op::Add {
                set: "ipm4-big",
                members: &all,
            },
            // Adding present members again is fine (exist semantics).
            Op::Add {
                set: "ipm4-big",
                members: &half,
            },
            Op::Del {
                set: "ipm4-big",
                members: &half,
            },
            // So is deleting absent ones.
            Op::Del {
                set: "ipm4-big",
                members: &half,
            },
        ])
        .unwrap();
        let ks = d.read_set("ipm4-big").unwrap().unwrap();
        let got = ks.members.unwrap();
        assert_eq!(got.len(), 50_000);
        assert!(got.contains(&v4(1)) && !got.contains(&v4(0)));
        let saved = ipset(&["save", "ipm4-big"]);
        assert_eq!(
            saved.lines().filter(|l| l.starts_with("add ")).count(),
            50_000
        );
        // IPv6 and hash:net take the same path.
        let h6 = header(SetType::HashNet, Some(Family::V6), 1 << 20);
        let nets = MemberSet::from_members(
            h6.kind,
            (0..100_000u128).map(|n| Member::Net {
                addr: IpAddr::V6((0x2001_0db8u128 << 96 | n << 64).into()),
                prefix: 64,
                nomatch: n % 7 == 0,
            }),
        );
        d.apply(&[
            Op::Create {
                set: "ipm6-big",
                header: &h6,
            },
            Op::Add {
                set: "ipm6-big",
                members: &nets,
            },
        ])
        .unwrap();
        assert_eq!(d.read_set("ipm6-big").unwrap().unwrap().members, Some(nets));
    });
}

#[test]
fn add_1m_members() {
    in_netns(|| {
        let mut d = dp();
        let h = SetHeader {
            kind: SetKind::new(SetType::HashIp, Some(Family::V4)),
            max_elem: 2_000_000,
            hash_size: Some(1 << 20),
            options: Default::default(),
        };
        let all = MemberSet::from_members(h.kind, (0..1_000_000).map(v4));
        let t = Instant::now();
        d.apply(&[
            Op::Create {
                set: "ipm4-1m",
                header: &h,
            },
            Op::Add {
                set: "ipm4-1m",
                members: &all,
            },
        ])
        .unwrap();
        let add = t.elapsed();
        let t = Instant::now();
        let ks = d.read_set("ipm4-1m").unwrap().unwrap();
        let read = t.elapsed();
        println!("netlink: add 1M in {add:?}, read back in {read:?}");
        assert_eq!(ks.members.unwrap().len(), 1_000_000);
        // About 1 s alone on a 2-core machine; generous while other kernel
        // tests run in parallel (examples/netlink_bench.rs measures properly).
        assert!(add.as_secs_f64() < 30.0, "adding 1M took {add:?}");
    });
}

fn expect_err(d: &mut NetlinkDataplane, ops: &[Op<'_>]) -> (usize, Option<Member>, DataplaneError) {
    let e = d
        .apply(ops)
        .expect_err(&format!("batch must fail: {ops:?}"));
    (e.op_index, e.member, e.error)
}

#[test]
fn errors_are_typed() {
    in_netns(|| {
        let mut d = dp();
        let hip = header(SetType::HashIp, Some(Family::V4), 1000);
        let hnet = header(SetType::HashNet, Some(Family::V4), 1000);
        let hlist = header(SetType::ListSet, Some(Family::V4), 8);
        let hmac = header(SetType::HashMac, None, 1000);

        // exists; the batch stops at the failing op
        let (i, _, e) = expect_err(
            &mut d,
            &[
                Op::Create {
                    set: "ipm-a",
                    header: &hip,
                },
                Op::Create {
                    set: "ipm-a",
                    header: &hip,
                },
                Op::Create {
                    set: "ipm-b",
                    header: &hnet,
                },
            ],
        );
        assert_eq!((i, e), (1, DataplaneError::SetExists("ipm-a".into())));
        assert_eq!(d.read_set("ipm-b").unwrap(), None);

        // missing
        let none = MemberSet::from_members(hip.kind, [v4(1)]);
        for op in [
            Op::Flush { set: "ipm-x" },
            Op::Destroy { set: "ipm-x" },
            Op::Add {
                set: "ipm-x",
                members: &none,
            },
            Op::Del {
                set: "ipm-x",
                members: &none,
            },
            Op::Swap {
                a: "ipm-x",
                b: "ipm-a",
            },
        ] {
            let (i, _, e) = expect_err(&mut d, &[op]);
            assert_eq!((i, e), (0, DataplaneError::SetMissing("ipm-x".into())));
        }
        let (_, _, e) = expect_err(
            &mut d,
            &[Op::Swap {
                a: "ipm-a",
                b: "ipm-x",
            }],
        );
        assert_eq!(e, DataplaneError::SetMissing("ipm-x".into()));

        // type not supported (hash:mac on this kernel), before any message
        let (_, _, e) = expect_err(
            &mut d,
            &[Op::Create {
                set: "ipm-mac",
                header: &hmac,
            }],
        );
        assert_eq!(e, DataplaneError::TypeNotSupported("hash:mac".into()));

        // in use via a list:set reference
        let lm = MemberSet::from_members(hlist.kind, [Member::Set("ipm-a".into())]);
        d.apply(&[
            Op::Create {
                set: "ipm-b",
                header: &hnet,
            },
            Op::Create {
                set: "ipm-l",
                header: &hlist,
            },
            Op::Add {
                set: "ipm-l",
                members: &lm,
            },
        ])
        .unwrap();
        let (_, _, e) = expect_err(&mut d, &[Op::Destroy { set: "ipm-a" }]);
        assert_eq!(e, DataplaneError::InUse("ipm-a".into()));
        let e = d.rename("ipm-a", "ipm-a2").unwrap_err();
        assert_eq!(e, DataplaneError::InUse("ipm-a".into()));

        // nested list:set
        let (_, _, e) = expect_err(
            &mut d,
            &[
                Op::Create {
                    set: "ipm-l2",
                    header: &hlist,
                },
                Op::Add {
                    set: "ipm-l2",
                    members: &MemberSet::from_members(hlist.kind, [Member::Set("ipm-l".into())]),
                },
            ],
        );
        assert_eq!(e, DataplaneError::NestedListSet("ipm-l2".into()));

        // a list:set member naming a missing set is an invalid element
        let ghost = MemberSet::from_members(hlist.kind, [Member::Set("ipm-ghost".into())]);
        let (i, m, e) = expect_err(
            &mut d,
            &[Op::Add {
                set: "ipm-l",
                members: &ghost,
            }],
        );
        assert_eq!((i, m.clone()), (0, Some(Member::Set("ipm-ghost".into()))));
        assert!(
            matches!(&e, DataplaneError::InvalidElement { set, element, .. } if set == "ipm-l" && element == "ipm-ghost"),
            "{e:?}"
        );

        // type mismatch on swap
        let (_, _, e) = expect_err(
            &mut d,
            &[Op::Swap {
                a: "ipm-a",
                b: "ipm-b",
            }],
        );
        assert_eq!(
            e,
            DataplaneError::TypeMismatch("ipm-a".into(), "ipm-b".into())
        );

        // rename: taken name, then a plain rename
        assert_eq!(
            d.rename("ipm-b", "ipm-l").unwrap_err(),
            DataplaneError::SetExists("ipm-l".into())
        );
        d.rename("ipm-b", "ipm-b2").unwrap();
        assert!(d.read_set("ipm-b2").unwrap().is_some());

        // set full: the failing Add's index and the member the kernel named
        let small = header(SetType::HashIp, Some(Family::V4), 10);
        let many = MemberSet::from_members(small.kind, (0..5000).map(v4));
        let (i, m, e) = expect_err(
            &mut d,
            &[
                Op::Create {
                    set: "ipm-small",
                    header: &small,
                },
                Op::Add {
                    set: "ipm-small",
                    members: &many,
                },
            ],
        );
        assert_eq!((i, e), (1, DataplaneError::SetFull("ipm-small".into())));
        let m = m.expect("the kernel names the failing member");
        assert!(many.contains(&m));
        let got = d.read_set("ipm-small").unwrap().unwrap().members.unwrap();
        assert_eq!(got.len(), 10);
        assert!(!got.contains(&m));

        // an element of the wrong family is an invalid element, named
        let v6 = MemberSet::from_members(
            SetKind::new(SetType::HashIp, Some(Family::V6)),
            [Member::Ip("::1".parse().unwrap())],
        );
        let (_, m, e) = expect_err(
            &mut d,
            &[Op::Add {
                set: "ipm-a",
                members: &v6,
            }],
        );
        assert!(matches!(e, DataplaneError::InvalidElement { .. }), "{e:?}");
        assert_eq!(m, Some(Member::Ip("::1".parse().unwrap())));

        // the socket is still usable after all this
        assert!(d.read_set("ipm-a").unwrap().is_some());
    });
}

#[test]
fn names_only_listing_ignores_foreign_sets() {
    in_netns(|| {
        let mut d = dp();
        ipset(&["create", "KUBE-FOREIGN", "hash:ip", "timeout", "60"]);
        ipset(&["create", "cali-x", "bitmap:port", "range", "1-10"]);
        let h = header(SetType::HashIp, Some(Family::V4), 100);
        let hl = header(SetType::ListSet, None, 8);
        d.apply(&[
            Op::Create {
                set: "ipm4-a",
                header: &h,
            },
            Op::Create {
                set: "ipmt-x1",
                header: &h,
            },
            Op::Create {
                set: "ipm4-l",
                header: &hl,
            },
        ])
        .unwrap();
        let mut names = d.list_owned(&|n| n.starts_with("ipm")).unwrap();
        names.sort();
        assert_eq!(names, ["ipm4-a", "ipm4-l", "ipmt-x1"]);
        assert!(d.list_owned(&|_| false).unwrap().is_empty());
    });
}

#[test]
fn proto_members_round_trip_with_ipset_save() {
    in_netns(|| {
        let mut d = dp();
        // Created and filled by the ipset tool, read by us.
        ipset(&["create", "ipm-cli", "hash:ip,port"]);
        for m in ["10.1.1.1,tcp:22", "10.1.1.2,udp:53", "10.1.1.3,icmp:8/0"] {
            ipset(&["add", "ipm-cli", m]);
        }
        let ks = d.read_set("ipm-cli").unwrap().unwrap();
        let mut got = ks.members.unwrap().sorted_strings();
        got.sort();
        assert_eq!(got, saved_members("ipm-cli", SetType::HashIpPort));
        let m = Member::IpPort {
            addr: "10.1.1.3".parse().unwrap(),
            proto: Proto::Icmp,
            port: 8 << 8,
        };
        assert_eq!(m.to_string(), "10.1.1.3,icmp:echo-request");
    });
}
