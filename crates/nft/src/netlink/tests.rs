//! The codec without a socket: what is encoded decodes back to the same
//! typed values, and no bytes make the decoder panic.

use ipsetmgr_dataplane::netlink::wire;
use ipsetmgr_ipset::{Comment, Family, HeaderOptions, Member, SetType};
use proptest::prelude::*;

use super::consts::*;
use super::decode::{self, Blamed, ElementReader};
use super::encode;
use crate::{Elements, NftOp, SetShape, Table, TableFamily};

fn table() -> Table {
    Table::new(TableFamily::Inet, "t")
}

fn shape(t: SetType, f: Option<Family>, comments: bool) -> SetShape {
    let opts = HeaderOptions {
        comment: comments,
        ..Default::default()
    };
    SetShape::new(t, f, &opts, 1000).unwrap()
}

fn elements(s: &SetShape, items: &[&str]) -> Elements {
    let members: Vec<Member> = items
        .iter()
        .flat_map(|i| Member::parse_user(s.kind.set_type, i).unwrap().members)
        .collect();
    s.elements(&members).unwrap()
}

/// The messages of a batch, without its begin and end markers.
fn messages(buf: &[u8]) -> Vec<wire::NlMsg<'_>> {
    wire::messages(buf).map(|m| m.unwrap()).collect()
}

#[test]
fn a_batch_is_framed_for_nf_tables() {
    let s = shape(SetType::HashIp, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.1", "10.0.0.2"]);
    let ops = [
        NftOp::EnsureTable,
        NftOp::CreateSet {
            name: "a",
            spec: &s.spec,
        },
        NftOp::AddElements {
            set: "a",
            elements: &e,
        },
    ];
    let mut buf = Vec::new();
    let plan = encode::batch(&mut buf, &table(), &ops, 100);
    let msgs = messages(&buf);
    assert_eq!(msgs.len(), 5);
    assert_eq!(msgs[0].ty, NFNL_MSG_BATCH_BEGIN);
    assert_eq!(msgs[4].ty, NFNL_MSG_BATCH_END);
    // res_id: the subsystem, in network order.
    assert_eq!(&msgs[0].payload[2..4], &10u16.to_be_bytes());
    assert_eq!(msgs[1].ty, msg_type(NFT_MSG_NEWTABLE));
    assert_eq!(msgs[2].ty, msg_type(NFT_MSG_NEWSET));
    assert_eq!(msgs[3].ty, msg_type(NFT_MSG_NEWSETELEM));
    // Only the last message asks for an ack; none is EXCL.
    assert!(msgs[1..3].iter().all(|m| m.flags & wire::NLM_F_ACK == 0));
    assert_ne!(msgs[3].flags & wire::NLM_F_ACK, 0);
    assert!(msgs[1..4].iter().all(|m| m.flags & wire::NLM_F_EXCL == 0));
    assert_eq!(plan.begin_seq, 100);
    assert_eq!(
        plan.msgs.iter().map(|m| (m.seq, m.op)).collect::<Vec<_>>(),
        [(101, 0), (102, 1), (103, 2)]
    );
    assert_eq!(plan.msg(102).map(|m| m.op), Some(1));
    assert!(plan.msg(99).is_none() && plan.msg(104).is_none());
}

#[test]
fn sets_decode_back_to_their_spec_and_nfts_userdata() {
    for (t, f) in [
        (SetType::HashIp, Some(Family::V6)),
        (SetType::HashNet, Some(Family::V4)),
        (SetType::HashIpPort, Some(Family::V4)),
        (SetType::HashIpPortNet, Some(Family::V6)),
        (SetType::HashIpMark, Some(Family::V4)),
        (SetType::HashMac, None),
    ] {
        let s = shape(t, f, false);
        let mut buf = Vec::new();
        encode::batch(
            &mut buf,
            &table(),
            &[NftOp::CreateSet {
                name: "x",
                spec: &s.spec,
            }],
            1,
        );
        let msgs = messages(&buf);
        // The kernel reports a set in the attributes it was created with.
        let raw = decode::set(msgs[1].payload).unwrap();
        assert_eq!(raw.spec(), Some(s.spec), "{t}");
        assert_eq!((raw.table.as_str(), raw.name.as_str()), ("t", "x"));
        assert!(raw.unmanaged().is_empty(), "{t}: {:?}", raw.unmanaged());
    }
    // What nft 1.0.6 sends (nft --debug=mnl) for these keys.
    let ip = shape(SetType::HashIp, Some(Family::V4), false);
    assert_eq!(encode::set_userdata(&ip.spec.key), [0, 4, 2, 0, 0, 0]);
    let ipport = shape(SetType::HashIpPort, Some(Family::V4), false);
    assert_eq!(
        encode::set_userdata(&ipport.spec.key),
        [0, 4, 0, 0, 0, 0, 3, 8, 0, 4, 13, 0, 0, 0, 1, 0]
    );
    assert_eq!(
        encode::set_flags(&shape(SetType::HashNetPort, Some(Family::V4), false).spec),
        0x84
    );
    assert_eq!(encode::set_flags(&ipport.spec), 0);
}

/// Encode `e` as NEWSETELEM messages and read them back as a dump would.
fn round_trip(s: &SetShape, e: &Elements) -> (Elements, usize, usize) {
    let mut buf = Vec::new();
    let plan = encode::batch(
        &mut buf,
        &table(),
        &[NftOp::AddElements {
            set: "x",
            elements: e,
        }],
        1,
    );
    let mut r = ElementReader::new(&s.spec);
    for m in messages(&buf) {
        if m.ty == msg_type(NFT_MSG_NEWSETELEM) {
            assert!(
                m.payload.len() < 70_000,
                "one message holds at most 64 KiB of elements"
            );
            r.feed(m.payload).unwrap();
        }
    }
    let (back, bad) = r.finish();
    (back, bad, plan.msgs.len())
}

#[test]
fn elements_decode_back_for_every_layout() {
    let cases: [(SetType, Option<Family>, &[&str]); 6] = [
        (
            SetType::HashIp,
            Some(Family::V4),
            &["10.0.0.1", "10.0.0.2 comment:x y"],
        ),
        (
            SetType::HashNet,
            Some(Family::V4),
            &["10.0.0.0/8", "10.1.0.0/16 nomatch", "0.0.0.0/1 comment:low"],
        ),
        // Runs to the last address: no interval-end element.
        (SetType::HashNet, Some(Family::V6), &["8000::/1", "::1"]),
        (
            SetType::HashNetPort,
            Some(Family::V4),
            &["10.0.0.0/8,80 comment:web", "10.0.0.0/9,80 nomatch"],
        ),
        (
            SetType::HashNetIface,
            Some(Family::V6),
            &["::/0,eth0", "2001:db8::/32,eth0 nomatch"],
        ),
        (SetType::HashMac, None, &["aa:bb:cc:dd:ee:ff"]),
    ];
    for (t, f, items) in cases {
        let s = shape(t, f, true);
        let e = elements(&s, items);
        let (back, bad, _) = round_trip(&s, &e);
        assert_eq!(bad, 0, "{t}");
        assert_eq!(back, e, "{t}");
    }
}

#[test]
fn nfts_null_interval_end_is_no_element() {
    let s = shape(SetType::HashNet, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.0/8"]);
    let mut buf = Vec::new();
    encode::batch(
        &mut buf,
        &table(),
        &[NftOp::AddElements {
            set: "x",
            elements: &e,
        }],
        1,
    );
    let msgs = messages(&buf);
    // A message with one element: 0.0.0.0 flagged interval end, as nft
    // puts at the bottom of every interval set.
    let mut extra = Vec::new();
    wire::begin_msg(&mut extra, msg_type(NFT_MSG_NEWSETELEM), 0, 9, 1);
    let l = wire::begin_nest(&mut extra, NFTA_SET_ELEM_LIST_ELEMENTS);
    let n = wire::begin_nest(&mut extra, NFTA_LIST_ELEM);
    wire::put_attr(
        &mut extra,
        NFTA_SET_ELEM_FLAGS,
        &NFT_SET_ELEM_INTERVAL_END.to_be_bytes(),
    );
    let k = wire::begin_nest(&mut extra, NFTA_SET_ELEM_KEY);
    wire::put_attr(&mut extra, NFTA_DATA_VALUE, &[0, 0, 0, 0]);
    wire::end_nest(&mut extra, k).unwrap();
    wire::end_nest(&mut extra, n).unwrap();
    wire::end_nest(&mut extra, l).unwrap();
    wire::end_msg(&mut extra, 0);
    let mut r = ElementReader::new(&s.spec);
    r.feed(messages(&extra)[0].payload).unwrap();
    r.feed(msgs[1].payload).unwrap();
    let (back, bad) = r.finish();
    assert_eq!((back, bad), (e, 0));
}

#[test]
fn a_million_elements_split_into_messages_under_64k() {
    let s = shape(SetType::HashIp, Some(Family::V4), false);
    let mut e = Elements::with_capacity(s.spec.key, false, 1 << 20);
    for i in 0u32..1 << 20 {
        e.push_raw(&(0x0a00_0000 + i).to_be_bytes(), None, None)
            .unwrap();
    }
    let (back, bad, msgs) = round_trip(&s, &e);
    assert_eq!(bad, 0);
    assert_eq!(back.len(), 1 << 20);
    assert!(msgs > 200, "{msgs} messages");
}

/// Elements of `t` from random members (as many as the kind takes).
fn random_elements(t: SetType, f: Option<Family>, comments: bool, seeds: &[u32]) -> Elements {
    let items: Vec<String> = seeds
        .iter()
        .map(|s| {
            let a = std::net::Ipv4Addr::from(*s);
            let port = s % 65536;
            let c = if comments && s % 3 == 0 {
                format!(" comment:c{s}")
            } else {
                String::new()
            };
            match (t, f) {
                (SetType::HashIpPort, _) => format!("{a},tcp:{port}{c}"),
                (SetType::HashIp, Some(Family::V6)) => format!("2001:db8::{:x}{c}", s & 0xffff),
                (SetType::HashMac, _) => format!(
                    "02:00:{:02x}:{:02x}:{:02x}:{:02x}{c}",
                    s >> 24,
                    (s >> 16) & 0xff,
                    (s >> 8) & 0xff,
                    s & 0xff
                ),
                _ => format!("{a}{c}"),
            }
        })
        .collect();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    elements(&shape(t, f, comments), &refs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// The template of a plain element writes each element exactly as it
    /// is encoded one by one; elements with comments or ranges get none.
    #[test]
    fn plain_elements_are_written_as_one_by_one(
        kind in prop::sample::select(vec![
            (SetType::HashIp, Some(Family::V4)),
            (SetType::HashIp, Some(Family::V6)),
            (SetType::HashIpPort, Some(Family::V4)),
            (SetType::HashMac, None),
            (SetType::HashNet, Some(Family::V4)),
        ]),
        comments in any::<bool>(),
        seeds in prop::collection::vec(any::<u32>(), 1..40),
    ) {
        let e = random_elements(kind.0, kind.1, comments, &seeds);
        let layout = encode::layout(&e);
        let plain = encode::PlainElement::of(&e, layout);
        let expect_plain = kind.0 != SetType::HashNet && !e.has_comments();
        prop_assert_eq!(plain.is_some(), expect_plain);
        if let Some(p) = plain {
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            for el in e.iter() {
                p.put(&mut fast, el.key);
                encode::put_element(&mut slow, layout, &el, true);
            }
            prop_assert_eq!(fast, slow);
        }
    }
}

#[test]
fn an_offset_names_the_element_the_kernel_blamed() {
    let s = shape(SetType::HashNet, Some(Family::V4), false);
    // Two ranges: four kernel elements (start, end, start, end).
    let e = elements(&s, &["10.0.0.0/8", "12.0.0.0/8"]);
    let mut buf = Vec::new();
    let plan = encode::batch(
        &mut buf,
        &table(),
        &[NftOp::AddElements {
            set: "x",
            elements: &e,
        }],
        1,
    );
    let at = plan.msgs[0].at;
    let msg = &buf[at..];
    let len = u32::from_ne_bytes(msg[..4].try_into().unwrap()) as usize;
    let msg = &msg[..len];
    // Find the third element's attribute by walking the message.
    let payload = &msg[16..];
    let mut offset = 16 + 4;
    let mut third = None;
    for a in wire::nf_attrs(payload).unwrap() {
        let a = a.unwrap();
        if a.ty == NFTA_SET_ELEM_LIST_ELEMENTS {
            let mut eo = offset + 4;
            for (i, el) in wire::attrs(a.data).enumerate() {
                let el = el.unwrap();
                if i == 2 {
                    third = Some(eo);
                }
                eo += wire::align4(4 + el.data.len());
            }
        }
        offset += wire::align4(4 + a.data.len());
    }
    assert_eq!(
        decode::blamed(msg, third.unwrap() as u32),
        Blamed::Element(2)
    );
    assert_eq!(
        decode::blamed(msg, 20),
        Blamed::Attr(NFTA_SET_ELEM_LIST_TABLE)
    );
    assert_eq!(decode::blamed(msg, 9999), Blamed::Unknown);
    // Kernel element 2 is the start of our second range.
    let layout = encode::layout(&e);
    assert_eq!(encode::kernel_elems(layout, &e.get(0).unwrap()), 2);
}

#[test]
fn extended_acks_decode() {
    // errno, the capped request header, then NLMSGERR_ATTR_OFFS and _MSG.
    let mut p = Vec::new();
    p.extend_from_slice(&(-libc::EEXIST).to_ne_bytes());
    p.extend_from_slice(&[0u8; 16]);
    wire::put_attr(&mut p, NLMSGERR_ATTR_OFFS, &44u32.to_ne_bytes());
    wire::put_str(&mut p, NLMSGERR_ATTR_MSG, "overlap");
    let a = decode::ack(&p, NLM_F_CAPPED | NLM_F_ACK_TLVS).unwrap();
    assert_eq!(a.errno, libc::EEXIST);
    assert_eq!(a.offset, Some(44));
    assert_eq!(a.message.as_deref(), Some("overlap"));
    assert_eq!(decode::ack(&p, 0).unwrap().offset, None);
    assert!(decode::ack(&p[..2], 0).is_err());
}

#[test]
fn rules_name_the_sets_they_look_up() {
    let mut b = Vec::new();
    wire::begin_msg(&mut b, msg_type(NFT_MSG_NEWRULE), 0, 1, 1);
    wire::put_str(&mut b, NFTA_RULE_TABLE, "t");
    let exprs = wire::begin_nest(&mut b, NFTA_RULE_EXPRESSIONS);
    for (name, attr, set) in [
        ("payload", 0, ""),
        ("lookup", NFTA_LOOKUP_SET, "ipm4-x"),
        ("dynset", NFTA_DYNSET_SET_NAME, "d"),
    ] {
        let e = wire::begin_nest(&mut b, NFTA_LIST_ELEM);
        wire::put_str(&mut b, NFTA_EXPR_NAME, name);
        let d = wire::begin_nest(&mut b, NFTA_EXPR_DATA);
        if attr != 0 {
            wire::put_str(&mut b, attr, set);
        }
        wire::end_nest(&mut b, d).unwrap();
        wire::end_nest(&mut b, e).unwrap();
    }
    wire::end_nest(&mut b, exprs).unwrap();
    wire::end_msg(&mut b, 0);
    let m = messages(&b);
    assert_eq!(
        decode::rule_set_refs(m[0].payload).unwrap(),
        ["ipm4-x", "d"]
    );
    assert_eq!(decode::object_table(m[0].payload).unwrap(), "t");
}

#[test]
fn comments_are_written_as_nft_writes_them() {
    let s = shape(SetType::HashIp, Some(Family::V4), true);
    let e = elements(&s, &["10.0.0.1 comment:hi"]);
    let mut buf = Vec::new();
    encode::batch(
        &mut buf,
        &table(),
        &[NftOp::AddElements {
            set: "x",
            elements: &e,
        }],
        1,
    );
    // type 0 (comment), length 3, "hi" and its NUL: nft's bytes.
    let needle = [0u8, 3, b'h', b'i', 0];
    assert!(buf.windows(needle.len()).any(|w| w == needle));
    let (back, _, _) = round_trip(&s, &e);
    assert_eq!(
        back.get(0).unwrap().comment,
        Some(&Comment::parse("hi").unwrap())
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode::fuzz_decode(&bytes);
    }

    /// Valid replies with bytes flipped: closer to what a decoder meets.
    #[test]
    fn mutated_replies_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let s = shape(SetType::HashNetIface, Some(Family::V6), true);
        let e = elements(&s, &["::/0,eth0 comment:x", "2001:db8::/32,eth0 nomatch"]);
        let mut buf = Vec::new();
        encode::batch(&mut buf, &table(), &[
            NftOp::CreateSet { name: "x", spec: &s.spec },
            NftOp::AddElements { set: "x", elements: &e },
        ], 1);
        for (at, b) in flips {
            let n = buf.len();
            buf[at % n] ^= b;
        }
        decode::fuzz_decode(&buf);
    }
}
