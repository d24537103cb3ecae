//! Pure tests of the netlink framing and the ipset message layer: element
//! and header round trips, the 64 KiB ADT split, error lineno extraction,
//! and "no panic on arbitrary bytes".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::codec::{self, AdtEncoder, ListAccumulator};
use super::consts::*;
use super::element;
use super::wire;
use ipsetmgr_ipset::mask;
use ipsetmgr_ipset::{
    AddrMask, Family, HeaderOptions, IfaceName, IpPortIp, IpPortNet, Member, MemberSet, NetIface,
    Proto, SetHeader, SetKind, SetRange, SetType,
};

fn addr(family: Family) -> impl Strategy<Value = IpAddr> {
    match family {
        Family::V4 => any::<u32>()
            .prop_map(|a| IpAddr::V4(Ipv4Addr::from(a)))
            .boxed(),
        Family::V6 => any::<u128>()
            .prop_map(|a| IpAddr::V6(Ipv6Addr::from(a)))
            .boxed(),
    }
}

fn proto() -> impl Strategy<Value = Proto> {
    prop::sample::select(Proto::ALL.to_vec())
}

/// A kind and a member of that kind, now and then with a comment.
fn kind_and_member() -> impl Strategy<Value = (SetKind, Member)> {
    (
        bare_kind_and_member(),
        prop::option::weighted(0.2, "[!#-\\[\\]-~]([ !#-\\[\\]-~]{0,253}[!#-\\[\\]-~])?"),
    )
        .prop_map(|((kind, m), comment)| match comment {
            Some(c) if kind.set_type != SetType::ListSet => (
                kind,
                m.with_comment(ipsetmgr_ipset::Comment::parse(&c).unwrap()),
            ),
            _ => (kind, m),
        })
}

fn bare_kind_and_member() -> impl Strategy<Value = (SetKind, Member)> {
    let fam = prop::sample::select(vec![Family::V4, Family::V6]);
    prop_oneof![
        fam.clone()
            .prop_flat_map(|f| addr(f)
                .prop_map(move |a| (SetKind::new(SetType::HashIp, Some(f)), Member::Ip(a)))),
        fam.clone()
            .prop_flat_map(|f| (addr(f), 0..=f.max_prefix(), any::<bool>()).prop_map(
                move |(a, p, nm)| (
                    SetKind::new(SetType::HashNet, Some(f)),
                    Member::Net {
                        addr: mask(a, p),
                        prefix: p,
                        nomatch: nm
                    }
                )
            )),
        fam.clone()
            .prop_flat_map(
                |f| (addr(f), proto(), any::<u16>()).prop_map(move |(a, pr, port)| (
                    SetKind::new(SetType::HashIpPort, Some(f)),
                    Member::IpPort {
                        addr: a,
                        proto: pr,
                        port
                    }
                ))
            ),
        fam.clone().prop_flat_map(|f| (
            addr(f),
            0..=f.max_prefix(),
            proto(),
            any::<u16>(),
            any::<bool>()
        )
            .prop_map(move |(a, p, pr, port, nm)| (
                SetKind::new(SetType::HashNetPort, Some(f)),
                Member::NetPort {
                    addr: mask(a, p),
                    prefix: p,
                    proto: pr,
                    port,
                    nomatch: nm
                }
            ))),
        fam.clone()
            .prop_flat_map(|f| (addr(f), proto(), any::<u16>(), addr(f)).prop_map(
                move |(a, pr, port, b)| (
                    SetKind::new(SetType::HashIpPortIp, Some(f)),
                    Member::IpPortIp(Box::new(IpPortIp {
                        addr: a,
                        proto: pr,
                        port,
                        addr2: b
                    }))
                )
            )),
        fam.clone().prop_flat_map(|f| (
            addr(f),
            proto(),
            any::<u16>(),
            addr(f),
            0..=f.max_prefix(),
            any::<bool>()
        )
            .prop_map(move |(a, pr, port, n, p, nm)| (
                SetKind::new(SetType::HashIpPortNet, Some(f)),
                Member::IpPortNet(Box::new(IpPortNet {
                    addr: a,
                    proto: pr,
                    port,
                    net: mask(n, p),
                    prefix: p,
                    nomatch: nm
                }))
            ))),
        any::<u32>().prop_map(|a| (
            SetKind::new(SetType::BitmapIp, Some(Family::V4)),
            Member::Ip(IpAddr::V4(Ipv4Addr::from(a)))
        )),
        any::<u16>().prop_map(|p| (SetKind::new(SetType::BitmapPort, None), Member::Port(p))),
        fam.clone().prop_flat_map(|f| (
            addr(f),
            0..=f.max_prefix(),
            any::<bool>(),
            "[a-z0-9._@+=-]{1,15}",
            any::<bool>()
        )
            .prop_filter("not . or ..", |(.., name, _)| name != "." && name != "..")
            .prop_map(move |(a, p, physdev, name, nm)| (
                SetKind::new(SetType::HashNetIface, Some(f)),
                Member::NetIface(Box::new(NetIface {
                    addr: mask(a, p),
                    prefix: p,
                    physdev,
                    iface: IfaceName::parse(&name).unwrap(),
                    nomatch: nm
                }))
            ))),
        fam.clone()
            .prop_flat_map(|f| (addr(f), any::<u32>()).prop_map(move |(a, mark)| (
                SetKind::new(SetType::HashIpMark, Some(f)),
                Member::IpMark { addr: a, mark }
            ))),
        any::<[u8; 6]>().prop_map(|m| (SetKind::new(SetType::HashMac, None), Member::Mac(m))),
        "[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,30}"
            .prop_map(|n| (SetKind::new(SetType::ListSet, None), Member::Set(n.into()))),
    ]
}

fn header() -> impl Strategy<Value = SetHeader> {
    (
        prop::sample::select(SetType::ALL.to_vec()),
        prop::sample::select(vec![Family::V4, Family::V6]),
        any::<u32>(),
        prop::option::of(any::<u32>()),
        any::<u32>(),
        any::<u16>(),
        any::<bool>(),
        prop::option::weighted(0.3, any::<u8>()),
    )
        .prop_map(|(t, f, max_elem, hs, start, width, comment, mask)| {
            // A bitmap's range: at most 65536 elements, within the space.
            let range = match t {
                SetType::BitmapIp => {
                    let from = start.min(u32::MAX - width as u32);
                    Some(SetRange::Ipv4 {
                        from: Ipv4Addr::from(from),
                        to: Ipv4Addr::from(from + width as u32),
                    })
                }
                SetType::BitmapPort => {
                    let from = (start as u16).min(u16::MAX - width);
                    Some(SetRange::Port {
                        from,
                        to: from + width,
                    })
                }
                _ => None,
            };
            let family = t.only_family().or(Some(f)).filter(|_| t.has_family());
            // hash:ip's netmask (a shorter prefix than the host's) or
            // bitmask (any bits but none or all).
            let mask = mask.filter(|_| t == SetType::HashIp).map(|n| {
                let max = f.max_prefix();
                if n % 2 == 0 {
                    AddrMask::Prefix(n % (max - 1) + 1)
                } else {
                    let bits = match f {
                        Family::V4 => IpAddr::V4(Ipv4Addr::from(0xffff_0000u32 | n as u32)),
                        Family::V6 => IpAddr::V6(Ipv6Addr::from(u128::MAX << 64 | n as u128)),
                    };
                    AddrMask::Bits(bits)
                }
            });
            SetHeader {
                kind: SetKind::new(t, family),
                max_elem: range.map_or(max_elem, |r| r.len() as u32),
                hash_size: if t.is_hash() { hs } else { None },
                options: HeaderOptions {
                    range,
                    comment: comment && t != SetType::ListSet,
                    mask,
                },
            }
        })
}

/// The single attribute in `buf`.
fn only_attr(buf: &[u8]) -> wire::Attr<'_> {
    let mut it = wire::attrs(buf);
    let a = it.next().expect("one attribute").expect("well formed");
    assert!(it.next().is_none());
    a
}

/// A LIST message as the kernel sends it: header in the first part only.
fn kernel_list_msg(
    name: &str,
    header: Option<&SetHeader>,
    elements: &[Member],
    seq: u32,
) -> Vec<u8> {
    let mut b = Vec::new();
    let start = wire::begin_msg(
        &mut b,
        msg_type(IPSET_CMD_LIST),
        NLM_F_MULTI,
        seq,
        NFPROTO_IPV4,
    );
    wire::put_u8(&mut b, IPSET_ATTR_PROTOCOL, 7);
    wire::put_str(&mut b, IPSET_ATTR_SETNAME, name);
    if let Some(h) = header {
        wire::put_str(&mut b, IPSET_ATTR_TYPENAME, h.kind.set_type.as_str());
        wire::put_u8(&mut b, IPSET_ATTR_FAMILY, codec::kernel_family(h.kind));
        wire::put_u8(&mut b, IPSET_ATTR_REVISION, 6);
        let n = wire::begin_nest(&mut b, IPSET_ATTR_DATA);
        if let Some(range) = h.options.range {
            // As the kernel lists a bitmap: its range, no maxelem.
            match range {
                SetRange::Ipv4 { from, to } => {
                    for (ty, a) in [(IPSET_ATTR_IP, from), (IPSET_ATTR_IP_TO, to)] {
                        let ip = wire::begin_nest(&mut b, ty);
                        wire::put_attr(
                            &mut b,
                            IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER,
                            &a.octets(),
                        );
                        wire::end_nest(&mut b, ip).unwrap();
                    }
                }
                SetRange::Port { from, to } => {
                    wire::put_be16(&mut b, IPSET_ATTR_PORT, from);
                    wire::put_be16(&mut b, IPSET_ATTR_PORT_TO, to);
                }
            }
        } else if h.kind.set_type == SetType::ListSet {
            wire::put_be32(&mut b, IPSET_ATTR_SIZE, h.max_elem);
        } else {
            wire::put_be32(&mut b, IPSET_ATTR_HASHSIZE, h.hash_size.unwrap_or(1024));
            wire::put_be32(&mut b, IPSET_ATTR_MAXELEM, h.max_elem);
        }
        wire::put_be32(&mut b, IPSET_ATTR_REFERENCES, 3);
        wire::put_be32(&mut b, IPSET_ATTR_MEMSIZE, 4096);
        wire::put_be32(&mut b, IPSET_ATTR_ELEMENTS, elements.len() as u32);
        wire::end_nest(&mut b, n).unwrap();
    }
    let adt = wire::begin_nest(&mut b, IPSET_ATTR_ADT);
    for e in elements {
        codec::encode_element(&mut b, e, 0);
    }
    wire::end_nest(&mut b, adt).unwrap();
    wire::end_msg(&mut b, start);
    b
}

proptest! {
    #[test]
    fn element_round_trip((kind, m) in kind_and_member(), lineno in any::<u32>()) {
        let mut buf = Vec::new();
        codec::encode_element(&mut buf, &m, lineno);
        let a = only_attr(&buf);
        prop_assert_eq!(a.ty, IPSET_ATTR_DATA);
        prop_assert!(a.nested);
        prop_assert_eq!(element::decode_element(kind, a.data), Ok(m));
    }

    #[test]
    fn header_round_trip(h in header()) {
        let mut buf = Vec::new();
        codec::encode_create_data(&mut buf, &h);
        let a = only_attr(&buf);
        prop_assert!(a.nested);
        let back = codec::decode_create_data(
            h.kind.set_type.as_str(),
            codec::kernel_family(h.kind),
            a.data,
        );
        prop_assert_eq!(back, Ok(Some(h)));
    }

    #[test]
    fn list_dump_round_trip(
        (kind, first) in kind_and_member(),
        max_elem in any::<u32>(),
        split in 0usize..4,
    ) {
        // A few members of the same kind, listed over two messages.
        let mut members = vec![first];
        if let Member::Ip(IpAddr::V4(a)) = &members[0] {
            let a = u32::from(*a);
            members.extend((1..5u32).map(|i| Member::Ip(IpAddr::V4(a.wrapping_add(i).into()))));
        }
        // The codec does not check a bitmap's members against its range.
        let range = match kind.set_type {
            SetType::BitmapIp => Some(SetRange::Ipv4 {
                from: Ipv4Addr::new(10, 0, 0, 0),
                to: Ipv4Addr::new(10, 0, 255, 255),
            }),
            SetType::BitmapPort => Some(SetRange::Port { from: 0, to: 65535 }),
            _ => None,
        };
        let h = SetHeader {
            kind,
            max_elem: range.map_or(max_elem, |r| r.len() as u32),
            hash_size: if kind.set_type.is_hash() { Some(64) } else { None },
            options: HeaderOptions {
                range,
                comment: false,
                mask: None,
            },
        };
        let split = split.min(members.len());
        let mut acc = ListAccumulator::default();
        let m1 = kernel_list_msg("s", Some(&h), &members[..split], 1);
        let m2 = kernel_list_msg("s", None, &members[split..], 1);
        for buf in [m1, m2] {
            for msg in wire::messages(&buf) {
                acc.feed(msg.unwrap().payload).unwrap();
            }
        }
        let raw = acc.header.take().unwrap();
        prop_assert_eq!(raw.references, 3);
        prop_assert_eq!(raw.typed(), Some(h));
        let (got, unparsable) = acc.into_members();
        prop_assert_eq!(unparsable, 0);
        prop_assert_eq!(got, Some(MemberSet::from_members(kind, members)));
    }

    /// Arbitrary bytes never make any decoder panic.
    #[test]
    fn decoders_never_panic(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        codec::fuzz_decode(&data);
    }

    /// Nor do valid dumps with bytes flipped (reaches deeper than random bytes).
    #[test]
    fn mutated_dumps_never_panic(
        (kind, m) in kind_and_member(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let h = SetHeader { kind, max_elem: 10, hash_size: Some(64), options: Default::default(), };
        let mut buf = kernel_list_msg("s", Some(&h), &[m.clone(), m], 9);
        for (i, v) in flips {
            let i = i.index(buf.len());
            buf[i] ^= v;
        }
        let cut = cut.index(buf.len() + 1);
        codec::fuzz_decode(&buf[..cut]);
        codec::fuzz_decode(&buf);
    }
}

fn decode_adt_messages(buf: &[u8], kind: SetKind) -> (Vec<(u32, Member)>, usize) {
    let mut out = Vec::new();
    let mut adt_len = 0;
    for msg in wire::messages(buf) {
        let msg = msg.unwrap();
        assert_eq!(
            msg.flags,
            NLM_F_REQUEST | NLM_F_ACK,
            "no NLM_F_EXCL: exist semantics"
        );
        let mut saw_lineno = false;
        for a in wire::nf_attrs(msg.payload).unwrap() {
            let a = a.unwrap();
            match a.ty {
                IPSET_ATTR_LINENO => saw_lineno = true,
                IPSET_ATTR_ADT => {
                    assert!(a.nested);
                    adt_len = adt_len.max(a.data.len() + NLA_HDRLEN);
                    for e in a.attrs() {
                        let e = e.unwrap();
                        let lineno = e
                            .attrs()
                            .map(|x| x.unwrap())
                            .find(|x| x.ty == IPSET_ATTR_CADT_LINENO)
                            .unwrap()
                            .u32_host()
                            .unwrap();
                        out.push((lineno, element::decode_element(kind, e.data).unwrap()));
                    }
                }
                _ => {}
            }
        }
        assert!(saw_lineno, "batch mode needs a command-level LINENO");
    }
    (out, adt_len)
}

fn check_split(members: &MemberSet, max_adt: usize) -> usize {
    let mut enc = AdtEncoder::new(IPSET_CMD_ADD, "set", 7, members.iter(), max_adt);
    let mut all = Vec::new();
    let mut messages = 0;
    let mut buf = Vec::new();
    while let Some(chunk) = enc.next_message(&mut buf, messages as u32 + 1) {
        messages += 1;
        let (elems, adt_len) = decode_adt_messages(&buf, members.kind());
        assert!(
            adt_len <= max_adt.max(256),
            "ADT nest of {adt_len} > {max_adt}"
        );
        assert!(adt_len <= u16::MAX as usize);
        assert_eq!(elems.len() as u32, chunk.count);
        assert!(chunk.count > 0);
        for (i, (lineno, _)) in elems.iter().enumerate() {
            assert_eq!(*lineno, chunk.first_lineno + i as u32);
        }
        all.extend(elems);
        buf.clear();
    }
    // Line numbers are 1-based positions in iteration order.
    let order: Vec<Member> = members.iter().collect();
    for (i, (lineno, m)) in all.iter().enumerate() {
        assert_eq!(*lineno as usize, i + 1);
        assert_eq!(&order[i], m);
    }
    let back = MemberSet::from_members(members.kind(), all.into_iter().map(|(_, m)| m));
    assert_eq!(&back, members);
    messages
}

#[test]
fn adt_split_respects_the_64k_attribute_limit() {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let members = MemberSet::from_members(
        kind,
        (0..100_000u32).map(|i| Member::Ip(IpAddr::V4(i.into()))),
    );
    let n = check_split(&members, codec::MAX_ADT_LEN);
    // 24 bytes per IPv4 element: about 2730 per message.
    assert!((36..=40).contains(&n), "{n} messages");

    let kind6 = SetKind::new(SetType::HashNet, Some(Family::V6));
    let nets = MemberSet::from_members(
        kind6,
        (0..20_000u128).map(|i| Member::Net {
            addr: IpAddr::V6((i << 64).into()),
            prefix: 64,
            nomatch: i % 3 == 0,
        }),
    );
    check_split(&nets, codec::MAX_ADT_LEN);
    // A tiny limit still makes progress, one or a few elements a message.
    check_split(&nets, 300);
}

#[test]
fn empty_member_set_sends_nothing() {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let empty = MemberSet::new(kind);
    let mut enc = AdtEncoder::new(IPSET_CMD_DEL, "s", 7, empty.iter(), codec::MAX_ADT_LEN);
    let mut buf = Vec::new();
    assert!(enc.next_message(&mut buf, 1).is_none());
    assert!(buf.is_empty());
}

#[test]
fn error_reply_names_the_failing_element() {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let members =
        MemberSet::from_members(kind, (0..10u32).map(|i| Member::Ip(IpAddr::V4(i.into()))));
    let mut req = Vec::new();
    AdtEncoder::new(IPSET_CMD_ADD, "s", 7, members.iter(), codec::MAX_ADT_LEN)
        .next_message(&mut req, 42)
        .unwrap();
    // What call_ad() sends back: nlmsgerr + the request, LINENO overwritten.
    let mut echoed = req.clone();
    let off = {
        let mut at = NLMSG_HDRLEN + NFGENMSG_LEN;
        loop {
            let len = u16::from_ne_bytes([echoed[at], echoed[at + 1]]) as usize;
            let ty = u16::from_ne_bytes([echoed[at + 2], echoed[at + 3]]) & NLA_TYPE_MASK;
            if ty == IPSET_ATTR_LINENO {
                break at + NLA_HDRLEN;
            }
            at += wire::align4(len);
        }
    };
    echoed[off..off + 4].copy_from_slice(&7u32.to_ne_bytes());
    let mut reply = Vec::new();
    let start = wire::begin_msg(&mut reply, NLMSG_ERROR, 0, 42, 0);
    reply.truncate(start + NLMSG_HDRLEN);
    reply.extend_from_slice(&(-IPSET_ERR_HASH_FULL).to_ne_bytes());
    reply.extend_from_slice(&echoed);
    wire::end_msg(&mut reply, start);

    let msg = wire::messages(&reply).next().unwrap().unwrap();
    assert_eq!((msg.ty, msg.seq), (NLMSG_ERROR, 42));
    let (code, echo) = wire::parse_error(msg.payload).unwrap();
    assert_eq!(code, -IPSET_ERR_HASH_FULL);
    assert_eq!(codec::decode_error_lineno(&echo.unwrap()), Some(7));
    // A capped ack (header only) names nothing.
    let (_, capped) = wire::parse_error(&msg.payload[..4 + NLMSG_HDRLEN]).unwrap();
    assert!(capped.is_none());
}

#[test]
fn requests_always_carry_protocol_and_set_name() {
    let h = SetHeader {
        kind: SetKind::new(SetType::ListSet, None),
        max_elem: 8,
        hash_size: None,
        options: Default::default(),
    };
    let mut b = Vec::new();
    codec::create_request(&mut b, 5, 7, "ipm-l", &h, 3);
    let msg = wire::messages(&b).next().unwrap().unwrap();
    assert_eq!(msg.ty, msg_type(IPSET_CMD_CREATE));
    assert_eq!(msg.flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL);
    let attrs: Vec<_> = wire::nf_attrs(msg.payload)
        .unwrap()
        .map(|a| a.unwrap())
        .collect();
    let get = |t| attrs.iter().find(|a| a.ty == t).unwrap();
    assert_eq!(get(IPSET_ATTR_PROTOCOL).u8(), Ok(7));
    assert_eq!(get(IPSET_ATTR_SETNAME).str(), Ok("ipm-l"));
    assert_eq!(get(IPSET_ATTR_TYPENAME).str(), Ok("list:set"));
    assert_eq!(get(IPSET_ATTR_REVISION).u8(), Ok(3));
    assert_eq!(get(IPSET_ATTR_FAMILY).u8(), Ok(NFPROTO_UNSPEC));
    let data = get(IPSET_ATTR_DATA);
    assert!(data.nested);
    let size = data.attrs().map(|a| a.unwrap()).next().unwrap();
    assert_eq!(
        (size.ty, size.net_order, size.be32()),
        (IPSET_ATTR_SIZE, true, Ok(8))
    );
}

#[test]
fn foreign_elements_are_unparsable_not_errors() {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let mut data = Vec::new();
    codec::encode_element(&mut data, &Member::Ip("10.0.0.1".parse().unwrap()), 0);
    // Append a timeout extension inside the element.
    let a = only_attr(&data);
    let mut inner = a.data.to_vec();
    wire::put_be32(&mut inner, IPSET_ATTR_TIMEOUT, 300);
    assert!(element::decode_element(kind, &inner).is_err());
    // Wrong family is refused rather than stored.
    let k6 = SetKind::new(SetType::HashIp, Some(Family::V6));
    assert!(element::decode_element(k6, a.data).is_err());
}
