use super::*;
use ipsetmgr_ipset::MemberSet;
use std::net::Ipv4Addr;

fn v4(t: SetType) -> SetKind {
    SetKind::new(t, Some(Family::V4))
}

fn ms(t: SetType, fam: Option<Family>, items: &[&str]) -> MemberSet {
    let kind = SetKind::new(t, fam);
    MemberSet::from_members(
        kind,
        items.iter().map(|s| Member::parse_kernel(t, s).unwrap()),
    )
}

const LISTING: &str = "Name: ipm4-a\nType: hash:net\nRevision: 7\nHeader: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xcb80224c\nSize in memory: 648\nReferences: 2\nNumber of entries: 4\nMembers:\n1.2.3.4\n10.1.0.0/16 nomatch\n0.0.0.0/1\n10.0.0.0/8\n";

#[test]
fn parses_a_listing() {
    let k = parse_listing(LISTING.as_bytes(), Some("ipm4-a")).unwrap();
    let h = k.header.unwrap();
    assert_eq!(h.kind, v4(SetType::HashNet));
    assert_eq!(h.max_elem, 65536);
    assert_eq!(h.hash_size, Some(1024));
    assert_eq!(k.references, 2);
    assert_eq!(k.unparsable_members, 0);
    assert_eq!(
        k.members.unwrap(),
        ms(
            SetType::HashNet,
            Some(Family::V4),
            &["1.2.3.4", "10.1.0.0/16 nomatch", "0.0.0.0/1", "10.0.0.0/8"]
        )
    );
}

#[test]
fn parses_list_set_and_ipv6_and_ports() {
    let l = "Name: l\nType: list:set\nRevision: 3\nHeader: size 8\nSize in memory: 128\nReferences: 0\nNumber of entries: 1\nMembers:\na\n";
    let k = parse_listing(l.as_bytes(), Some("l")).unwrap();
    let h = k.header.unwrap();
    assert_eq!(h.kind, SetKind::new(SetType::ListSet, None));
    assert_eq!(h.max_elem, 8);
    assert_eq!(k.members.unwrap().sorted_strings(), ["a"]);

    let p = "Name: c\nType: hash:ip,port\nRevision: 7\nHeader: family inet6 hashsize 1024 maxelem 65536 bucketsize 12 initval 0x23ff2d15\nSize in memory: 448\nReferences: 0\nNumber of entries: 3\nMembers:\n::1,udplite:5\n::1,ipv6-icmp:echo-request\n::1,ipv6-icmp:no-route\n";
    let k = parse_listing(p.as_bytes(), None).unwrap();
    assert_eq!(
        k.header.unwrap().kind,
        SetKind::new(SetType::HashIpPort, Some(Family::V6))
    );
    assert_eq!(k.members.unwrap().len(), 3);
    assert_eq!(k.unparsable_members, 0);
}

#[test]
fn parses_bitmap_listings() {
    let l = "Name: b\nType: bitmap:ip\nRevision: 3\nHeader: range 10.0.0.0-10.0.0.255\nSize in memory: 120\nReferences: 0\nNumber of entries: 2\nMembers:\n10.0.0.0\n10.0.0.5\n";
    let k = parse_listing(l.as_bytes(), Some("b")).unwrap();
    let h = k.header.unwrap();
    assert_eq!(h.kind, SetKind::new(SetType::BitmapIp, Some(Family::V4)));
    assert_eq!(h.max_elem, 256);
    assert_eq!(h.options.range.unwrap().to_string(), "10.0.0.0-10.0.0.255");
    assert_eq!(
        k.members.unwrap().sorted_strings(),
        ["10.0.0.0", "10.0.0.5"]
    );
    let l = "Name: p\nType: bitmap:port\nRevision: 3\nHeader: range 0-1024\nSize in memory: 208\nReferences: 0\nNumber of entries: 1\nMembers:\n80\n";
    let k = parse_listing(l.as_bytes(), Some("p")).unwrap();
    let h = k.header.unwrap();
    assert_eq!((h.kind.family, h.max_elem), (None, 1025));
    assert_eq!(k.members.unwrap().sorted_strings(), ["80"]);
    assert!(k.unmanaged_options.is_empty());
    let mut out = Vec::new();
    write_create(&mut out, "p", &h).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "create p bitmap:port range 0-1024\n"
    );
    // A bitmap without its range is not a listing this parser can trust.
    let l = "Name: p\nType: bitmap:port\nRevision: 3\nHeader: \nReferences: 0\nMembers:\n";
    assert!(matches!(
        parse_listing(l.as_bytes(), Some("p")),
        Err(DataplaneError::Protocol(_))
    ));
}

#[test]
fn unknown_type_has_no_header() {
    let l = "Name: x\nType: hash:netnet\nRevision: 3\nHeader: family inet hashsize 1024 maxelem 65536\nSize in memory: 128\nReferences: 0\nNumber of entries: 1\nMembers:\n10.0.0.0/8,10.0.0.0/8\n";
    let k = parse_listing(l.as_bytes(), Some("x")).unwrap();
    assert_eq!(k.header, None);
    assert_eq!(k.members, None);
    assert_eq!(k.unparsable_members, 0);
}

#[test]
fn options_make_members_unparsable() {
    let l = "Name: t\nType: hash:ip\nRevision: 6\nHeader: family inet hashsize 1024 maxelem 65536 timeout 100 bucketsize 12 initval 0x1\nSize in memory: 128\nReferences: 0\nNumber of entries: 3\nMembers:\n1.2.3.4 timeout 98\n1.2.3.5 timeout 97\n";
    let k = parse_listing(l.as_bytes(), Some("t")).unwrap();
    assert_eq!(k.unparsable_members, 2);
    assert!(k.members.unwrap().is_empty());
}

#[test]
fn truncated_output_is_a_protocol_error() {
    for cut in 0..=LISTING.len() {
        let prefix = &LISTING[..cut];
        let r = parse_listing(prefix.as_bytes(), Some("ipm4-a"));
        // Cut inside the members section: the count says it is short,
        // and a last line without its newline is incomplete.
        let complete = cut == LISTING.len();
        assert_eq!(r.is_ok(), complete, "cut at {cut}: {r:?}");
        if let Err(e) = r {
            assert!(matches!(e, DataplaneError::Protocol(_)), "{e:?}");
        }
    }
}

#[test]
fn garbage_is_a_protocol_error() {
    let cases: &[&[u8]] = &[
        b"",
        b"hello\n",
        b"Members:\n1.2.3.4\n",
        b"Name: a\nType: hash:ip\nHeader: family bogus\nReferences: 0\nMembers:\n",
        b"Name: a\nType: hash:ip\nHeader: maxelem 5\nReferences: 0\nMembers:\n",
        b"Name: a\nType: hash:ip\nHeader: family inet maxelem x\nReferences: 0\nMembers:\n",
        b"Name: a\nType: hash:ip\nHeader: family inet maxelem 5\nReferences: -1\nMembers:\n",
        b"Name: a\nName: b\nMembers:\n",
        b"Name: \xff\xfe\nMembers:\n",
        b"Name: b\nType: hash:ip\nHeader: family inet maxelem 5\nReferences: 0\nMembers:\n",
    ];
    for c in cases {
        let r = parse_listing(*c, Some("a"));
        assert!(
            matches!(r, Err(DataplaneError::Protocol(_))),
            "{c:?}: {r:?}"
        );
    }
}

#[test]
fn garbage_members_are_counted() {
    let l = b"Name: a\nType: hash:ip\nRevision: 6\nHeader: family inet hashsize 64 maxelem 5\nReferences: 0\nNumber of entries: 4\nMembers:\n1.2.3.4\nnot-an-ip\n\xff\xff\n::1\n";
    let k = parse_listing(&l[..], Some("a")).unwrap();
    assert_eq!(k.unparsable_members, 3);
    assert_eq!(k.members.unwrap().len(), 1);
}

#[test]
fn huge_listing_streams() {
    let n = 200_000u32;
    let head = format!(
        "Name: big\nType: hash:ip\nRevision: 6\nHeader: family inet hashsize 65536 maxelem 1000000 bucketsize 12 initval 0x1\nSize in memory: 1\nReferences: 0\nNumber of entries: {n}\nMembers:\n"
    );
    let body: String = (0..n)
        .map(|i| format!("{}\n", Ipv4Addr::from(0x0a00_0000 + i)))
        .collect();
    let text = head + &body;
    let k = parse_listing(text.as_bytes(), Some("big")).unwrap();
    assert_eq!(k.members.unwrap().len(), n as usize);
    assert_eq!(k.unparsable_members, 0);
}

#[test]
fn fast_member_parse_agrees_with_parse_kernel() {
    let cases = [
        (SetType::HashIp, "1.2.3.4"),
        (SetType::HashIp, "::ffff:1.2.3.4"),
        (SetType::HashIp, "::1.2.3.4"),
        (SetType::HashNet, "10.0.0.0/8"),
        (SetType::HashNet, "10.0.0.0/8 nomatch"),
        (SetType::HashNet, "1.2.3.4"),
        (SetType::HashNet, "2001:db8::/32"),
        (SetType::HashNet, "0.0.0.0/1"),
        (SetType::HashNet, "10.0.0.0/33"),
        (SetType::HashNet, "10.0.0.0/"),
        (SetType::HashNet, "10.0.0.0/0"),
        (SetType::HashNet, "10.0.0.1/8"),
    ];
    for (t, s) in cases {
        assert_eq!(
            parse_member(t, s),
            Member::parse_kernel(t, s).ok(),
            "{t} {s}"
        );
    }
}

#[test]
fn stderr_splitting() {
    assert_eq!(
        split_stderr(
            "ipset v7.17: Error in line 3: Kernel error received: set type not supported\n"
        ),
        (Some(3), "Kernel error received: set type not supported")
    );
    assert_eq!(
        split_stderr("ipset v7.17: The set with the given name does not exist\n"),
        (None, "The set with the given name does not exist")
    );
    assert_eq!(split_stderr(""), (None, ""));
    assert_eq!(split_stderr("garbage"), (None, "garbage"));
}

#[test]
fn stderr_mapping() {
    let hdr = SetHeader {
        kind: SetKind::new(SetType::HashMac, None),
        max_elem: 10,
        hash_size: None,
        options: Default::default(),
    };
    let create = Op::Create {
        set: "m",
        header: &hdr,
    };
    let members = ms(SetType::HashIp, Some(Family::V4), &["1.1.1.1"]);
    let add = Op::Add {
        set: "a",
        members: &members,
    };
    let swap = Op::Swap { a: "a", b: "b" };
    let destroy = Op::Destroy { set: "a" };
    let m = Member::parse_kernel(SetType::HashIp, "1.1.1.1").unwrap();
    let cases: Vec<(&str, &Op<'_>, DataplaneError)> = vec![
        (
            "Kernel error received: set type not supported",
            &create,
            DataplaneError::TypeNotSupported("hash:mac".into()),
        ),
        (
            "Set cannot be created: set with the same name already exists",
            &create,
            DataplaneError::SetExists("m".into()),
        ),
        (
            "Hash is full, cannot add more elements",
            &add,
            DataplaneError::SetFull("a".into()),
        ),
        (
            "The set with the given name does not exist",
            &add,
            DataplaneError::SetMissing("a".into()),
        ),
        (
            "Set cannot be destroyed: it is in use by a kernel component",
            &destroy,
            DataplaneError::InUse("a".into()),
        ),
        (
            "The sets cannot be swapped: their type does not match",
            &swap,
            DataplaneError::TypeMismatch("a".into(), "b".into()),
        ),
        (
            "Sets cannot be swapped: the second set does not exist",
            &swap,
            DataplaneError::SetMissing("b".into()),
        ),
        (
            "Sets with list:set type cannot be added to the set.",
            &add,
            DataplaneError::NestedListSet("a".into()),
        ),
        (
            "Set to be added/deleted/tested as element does not exist.",
            &add,
            DataplaneError::SetMissing("1.1.1.1".into()),
        ),
        (
            "Syntax error: '24x' is invalid as number",
            &add,
            DataplaneError::InvalidElement {
                set: "a".into(),
                element: "1.1.1.1".into(),
                reason: "Syntax error: '24x' is invalid as number".into(),
            },
        ),
        (
            "Null-valued element, cannot be stored in a hash type of set",
            &add,
            DataplaneError::InvalidElement {
                set: "a".into(),
                element: "1.1.1.1".into(),
                reason: "Null-valued element, cannot be stored in a hash type of set".into(),
            },
        ),
        (
            "The value of the CIDR parameter of the IP address is invalid",
            &add,
            DataplaneError::InvalidElement {
                set: "a".into(),
                element: "1.1.1.1".into(),
                reason: "The value of the CIDR parameter of the IP address is invalid".into(),
            },
        ),
        (
            "Kernel error received: Operation not permitted",
            &add,
            DataplaneError::Unavailable("Kernel error received: Operation not permitted".into()),
        ),
        (
            "Something new",
            &add,
            DataplaneError::Other("Something new".into()),
        ),
    ];
    for (msg, op, want) in cases {
        assert_eq!(classify(msg, Some(op), Some(&m)), want, "{msg}");
    }
}

#[test]
fn batch_errors_map_lines_to_ops_and_members() {
    let k = v4(SetType::HashIp);
    let hdr = SetHeader {
        kind: k,
        max_elem: 2,
        hash_size: None,
        options: Default::default(),
    };
    let a = ms(
        SetType::HashIp,
        Some(Family::V4),
        &["1.1.1.1", "1.1.1.2", "1.1.1.3"],
    );
    let empty = MemberSet::new(k);
    let ops = [
        Op::Create {
            set: "s",
            header: &hdr,
        },
        Op::Add {
            set: "s",
            members: &empty,
        },
        Op::Add {
            set: "s",
            members: &a,
        },
        Op::Destroy { set: "s" },
    ];
    let mut out = Vec::new();
    let mut map = LineMap::default();
    write_script(&mut out, &ops, &mut map).unwrap().unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0], "create s hash:ip family inet maxelem 2");
    assert_eq!(lines[4], "destroy s");
    for (i, l) in lines.iter().enumerate().skip(1).take(3) {
        let stderr = format!(
            "ipset v7.17: Error in line {}: Hash is full, cannot add more elements\n",
            i + 1
        );
        let be = batch_error(&stderr, &ops, &map);
        assert_eq!(be.op_index, 2);
        assert_eq!(be.error, DataplaneError::SetFull("s".into()));
        assert_eq!(format!("add -exist s {}", be.member.unwrap()), *l);
    }
    let be = batch_error(
        "ipset v7.17: Error in line 5: Set cannot be destroyed: it is in use by a kernel component",
        &ops,
        &map,
    );
    assert_eq!(
        (be.op_index, be.error),
        (3, DataplaneError::InUse("s".into()))
    );
    let be = batch_error("weird", &ops, &map);
    assert_eq!(be.op_index, 3);
    assert!(matches!(be.error, DataplaneError::Protocol(_)));
    let be = batch_error("ipset v7.17: Error in line 99: x", &ops, &map);
    assert!(be.member.is_none());
}

#[test]
fn create_lines() {
    let mut out = Vec::new();
    let h = |t, f, m, hs| SetHeader {
        kind: SetKind::new(t, f),
        max_elem: m,
        hash_size: hs,
        options: Default::default(),
    };
    write_create(
        &mut out,
        "a",
        &h(SetType::HashIp, Some(Family::V6), 5, Some(64)),
    )
    .unwrap();
    write_create(&mut out, "b", &h(SetType::HashMac, None, 7, None)).unwrap();
    write_create(
        &mut out,
        "c",
        &h(SetType::ListSet, Some(Family::V4), 8, Some(64)),
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "create a hash:ip family inet6 maxelem 5 hashsize 64\ncreate b hash:mac maxelem 7\ncreate c list:set size 8\n"
    );
}

#[test]
fn bad_names_are_refused_before_running() {
    let mut dp = CliDataplane::with_binary("/nonexistent/ipset");
    let e = dp
        .apply(&[Op::Flush {
            set: "a\ndestroy b",
        }])
        .unwrap_err();
    assert_eq!(e.op_index, 0);
    assert!(matches!(e.error, DataplaneError::Other(_)));
}

#[test]
fn missing_binary_is_unavailable() {
    let mut dp = CliDataplane::with_binary("/nonexistent/ipset");
    let e = dp.apply(&[Op::Flush { set: "a" }]).unwrap_err();
    assert!(matches!(e.error, DataplaneError::Unavailable(_)));
    assert!(matches!(
        dp.list_owned(&|_| true),
        Err(DataplaneError::Unavailable(_))
    ));
    assert!(matches!(
        dp.read_set("a"),
        Err(DataplaneError::Unavailable(_))
    ));
}

proptest::proptest! {
    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = parse_listing(&bytes[..], Some("a"));
    }

    #[test]
    fn parser_never_panics_on_mutated_listing(cut in 0usize..400, junk in "[ -~\n]{0,40}") {
        let mut s = LISTING.to_string();
        let cut = cut.min(s.len());
        s.insert_str(cut, &junk);
        let _ = parse_listing(s.as_bytes(), Some("ipm4-a"));
    }
}
