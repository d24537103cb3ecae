//! The JSON both ways without `nft`: commands from typed values, and
//! listings (as nft 1.0.6 prints them) into the same typed values.

use std::collections::BTreeSet;

use ipsetmgr_ipset::{Family, HeaderOptions, Member, SetType};

use super::json::{self, Listing};
use super::text;
use super::{errno_error, errno_of};
use crate::{Elements, NftError, NftOp, SetShape, Table, TableFamily};

fn shape(t: SetType, f: Option<Family>) -> SetShape {
    let opts = HeaderOptions {
        comment: true,
        ..Default::default()
    };
    SetShape::new(t, f, &opts, 10).unwrap()
}

fn elements(s: &SetShape, items: &[&str]) -> Elements {
    let members: Vec<Member> = items
        .iter()
        .flat_map(|i| Member::parse_user(s.kind.set_type, i).unwrap().members)
        .collect();
    s.elements(&members).unwrap()
}

#[test]
fn commands_are_nfts_json() {
    let t = Table::new(TableFamily::Inet, "t");
    let s = shape(SetType::HashNetPort, Some(Family::V4));
    let e = elements(
        &s,
        &[
            "10.0.0.0/8,80 comment:web",
            "10.0.0.0/9,80 nomatch",
            "1.1.1.1,udp:53",
        ],
    );
    let ops = [
        NftOp::EnsureTable,
        NftOp::CreateSet {
            name: "s",
            spec: &s.spec,
        },
        NftOp::AddElements {
            set: "s",
            elements: &e,
        },
        NftOp::FlushSet { set: "s" },
    ];
    let got = serde_json::to_value(json::script(&t, &ops, None, &BTreeSet::new())).unwrap();
    let want = serde_json::json!({"nftables": [
        {"add": {"table": {"family": "inet", "name": "t"}}},
        {"add": {"set": {"family": "inet", "table": "t", "name": "s",
            "type": ["ipv4_addr", "inet_proto", "inet_service"], "flags": ["interval"], "size": 10}}},
        {"add": {"element": {"family": "inet", "table": "t", "name": "s", "elem": [
            {"concat": ["1.1.1.1", 17, 53]},
            {"elem": {"val": {"concat": [{"prefix": {"addr": "10.128.0.0", "len": 9}}, 6, 80]}, "comment": "web"}},
        ]}}},
        {"flush": {"set": {"family": "inet", "table": "t", "name": "s"}}},
    ]});
    assert_eq!(got, want);
    // A range that is no prefix, a MAC, an interface.
    let s = shape(SetType::HashNet, Some(Family::V4));
    let e = elements(&s, &["10.0.0.0/8", "10.0.0.0/24 nomatch"]);
    let got = serde_json::to_value(json::script(
        &t,
        &[NftOp::DelElements {
            set: "s",
            elements: &e,
        }],
        None,
        &BTreeSet::new(),
    ))
    .unwrap();
    assert_eq!(
        got["nftables"][0]["delete"]["element"]["elem"],
        serde_json::json!([{"range": ["10.0.1.0", "10.255.255.255"]}])
    );
    let s = shape(SetType::HashMac, None);
    let e = elements(&s, &["AA:bb:cc:dd:ee:01"]);
    let got = serde_json::to_value(json::script(
        &t,
        &[NftOp::AddElements {
            set: "s",
            elements: &e,
        }],
        None,
        &BTreeSet::new(),
    ))
    .unwrap();
    assert_eq!(
        got["nftables"][0]["add"]["element"]["elem"],
        serde_json::json!(["aa:bb:cc:dd:ee:01"])
    );
}

#[test]
fn listings_parse_into_elements() {
    // Printed by nft 1.0.6 (`nft -j list set`) for sets made by hand.
    let text = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
        {"set": {"family": "inet", "name": "i", "table": "t", "type": ["ipv4_addr", "ifname"], "handle": 6, "flags": ["interval"],
         "elem": [{"concat": [{"prefix": {"addr": "10.0.0.0", "len": 8}}, "eth0"]}]}}]}"#;
    let l: Listing = serde_json::from_str(text).unwrap();
    let set = l.nftables.into_iter().find_map(|i| i.set).unwrap();
    let spec = set.spec().unwrap();
    assert_eq!(
        spec,
        shape(SetType::HashNetIface, Some(Family::V4))
            .spec
            .clone_without_size()
    );
    let (e, bad) = set.elements(&spec);
    assert_eq!(bad, 0);
    assert_eq!(e.get(0).unwrap().to_string(), "10.0.0.0/8 . \"eth0\"");

    let text = r#"{"nftables": [{"set": {"family": "inet", "name": "p", "table": "t", "type": ["ipv4_addr", "inet_proto", "inet_service"],
        "handle": 2, "flags": ["interval"], "elem": [{"concat": [{"prefix": {"addr": "10.0.0.0", "len": 8}}, "tcp", 80]},
        {"elem": {"val": {"concat": [{"range": ["10.0.0.0", "10.0.0.5"]}, "udp", 80]}, "comment": "c"}},
        {"elem": {"val": {"concat": ["10.0.0.0", "tcp", 1]}, "timeout": 5}}]}}]}"#;
    let l: Listing = serde_json::from_str(text).unwrap();
    let set = l.nftables.into_iter().find_map(|i| i.set).unwrap();
    let (e, bad) = set.elements(&set.spec().unwrap());
    assert_eq!(bad, 1, "an element with a timeout is not ours");
    let shown: Vec<String> = e.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        shown,
        [
            "10.0.0.0/8 . tcp . 80",
            "10.0.0.0-10.0.0.5 . udp . 80 comment \"c\""
        ]
    );

    let text = r#"{"nftables": [{"set": {"family": "inet", "name": "m", "table": "t", "type": ["ipv4_addr", "mark"], "handle": 7,
        "elem": [{"concat": ["10.0.0.1", 16]}]}}, {"chain": {"family": "inet", "table": "t", "name": "c"}},
        {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 3, "expr": [{"match": {"op": "==",
         "left": {"concat": [{"payload": {"protocol": "ip", "field": "saddr"}}, {"meta": {"key": "mark"}}]}, "right": "@m"}}, {"drop": null}]}}]}"#;
    let l: Listing = serde_json::from_str(text).unwrap();
    assert!(!l.nftables[1].other.is_empty(), "a chain is something else");
    let rule = l.nftables[2].rule.as_ref().unwrap();
    assert!(json::references(&rule.expr, "m"));
    assert!(!json::references(&rule.expr, "mm"));
    let set = l.nftables.into_iter().find_map(|i| i.set).unwrap();
    let (e, _) = set.elements(&set.spec().unwrap());
    assert_eq!(e.get(0).unwrap().to_string(), "10.0.0.1 . 0x00000010");
}

/// Printed by nft 1.0.6 (`nft -j -t list table`): a map of an owned name
/// is a `map` item, never a `set` one, whatever its key.
#[test]
fn maps_are_read_from_the_listing() {
    let text = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
        {"table": {"family": "inet", "name": "ipsetmgr", "handle": 1}},
        {"map": {"family": "inet", "name": "ipm4-blocklist", "table": "ipsetmgr", "type": "ipv4_addr", "handle": 1, "map": "verdict"}},
        {"map": {"family": "inet", "name": "ipm4-m2", "table": "ipsetmgr", "type": ["ipv4_addr", "inet_service"], "handle": 4,
         "map": "ipv4_addr . inet_service", "flags": ["interval"]}},
        {"map": {"family": "inet", "name": "ipm4-m3", "table": "ipsetmgr", "type": "ipv4_addr", "handle": 5, "map": "counter"}},
        {"map": {"family": "inet", "name": "odd", "table": "ipsetmgr", "type": {"some": "future form"}, "flags": "constant"}},
        {"set": {"family": "inet", "name": "ipm4-dyn", "table": "ipsetmgr", "type": "ipv4_addr", "handle": 2}}]}"#;
    let l: Listing = serde_json::from_str(text).unwrap();
    let maps: Vec<&json::JMap> = l.nftables.iter().filter_map(|i| i.map.as_ref()).collect();
    assert_eq!(maps.len(), 4);
    assert!(l.nftables.iter().filter(|i| i.set.is_some()).count() == 1);
    let spec = maps[0].spec().unwrap();
    assert_eq!(
        spec,
        shape(SetType::HashIp, Some(Family::V4))
            .spec
            .clone_without_size()
    );
    assert_eq!(maps[0].unmanaged(), ["map"]);
    assert_eq!(maps[0].handle, 1);
    assert!(maps[1].spec().unwrap().interval);
    assert_eq!(maps[1].unmanaged(), ["map"], "interval is no foreign flag");
    assert_eq!(maps[2].unmanaged(), ["map"]);
    // A map this crate cannot read does not make the listing unreadable.
    assert_eq!(maps[3].spec(), None);
    assert_eq!(maps[3].unmanaged(), ["map", "flags constant"]);
}

#[test]
fn deleting_a_map_is_delete_map() {
    let t = Table::new(TableFamily::Inet, "t");
    let ops = [
        NftOp::DeleteSet { set: "ipm4-m" },
        NftOp::DeleteSet { set: "ipm4-s" },
    ];
    let maps = BTreeSet::from(["ipm4-m".to_string()]);
    let got = serde_json::to_value(json::script(&t, &ops, None, &maps)).unwrap();
    assert_eq!(
        got,
        serde_json::json!({"nftables": [
            {"delete": {"map": {"family": "inet", "table": "t", "name": "ipm4-m"}}},
            {"delete": {"set": {"family": "inet", "table": "t", "name": "ipm4-s"}}},
        ]})
    );
}

/// Printed by nft 1.0.6 (`nft -t list set`), whose JSON of the same sets
/// has no `dynamic`.
#[test]
fn text_listing_gives_every_flag() {
    let t = Table::new(TableFamily::Inet, "ipsetmgr");
    let flags = |text: &str, comment: Option<&str>| text::set_flags(text, &t, "ipm4-s", comment);
    let plain =
        "table inet ipsetmgr {\n\tset ipm4-s {\n\t\ttype ipv4_addr\n\t\tsize 65536\n\t}\n}\n";
    assert_eq!(flags(plain, None), Ok(vec![]));
    let dynamic = "table inet ipsetmgr {\n\tset ipm4-s {\n\t\ttype ipv4_addr\n\t\tsize 65536\n\t\tflags dynamic\n\t}\n}\n";
    assert_eq!(flags(dynamic, None), Ok(vec!["dynamic".to_string()]));
    let two = "table inet ipsetmgr {\n\tset ipm4-s {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\tflags dynamic,timeout\n\t\ttimeout 1h\n\t\tcounter\n\t}\n}\n";
    assert_eq!(
        flags(two, None),
        Ok(vec!["dynamic".to_string(), "timeout".to_string()])
    );
    // nft prints a comment as it is: one that says `flags` is taken out by
    // the text the JSON gave for it, and never read as flags.
    let c = "x\n\t\tflags interval";
    let commented = "table inet ipsetmgr {\n\tset ipm4-s {\n\t\ttype ipv4_addr\n\t\tcomment \"x\n\t\tflags interval\"\n\t}\n}\n";
    assert_eq!(flags(commented, Some(c)), Ok(vec![]));
    assert!(
        flags(commented, None).is_err(),
        "without the comment's text the line is no flags line"
    );
    // Anything not in the shape nft prints is an error, not a guess.
    for bad in [
        "",
        "table inet other {\n\tset ipm4-s {\n\t}\n}\n",
        "table inet ipsetmgr {\n\tset ipm4-other {\n\t}\n}\n",
        "table inet ipsetmgr {\n\tset ipm4-s {\n\t\ttype ipv4_addr\n",
        "table inet ipsetmgr {\n\tset ipm4-s {\n\t\tflags dynamic\n\t\tflags interval\n\t}\n}\n",
        "table inet ipsetmgr {\n\tset ipm4-s {\n\t\tflags dynamic,\n\t}\n}\n",
        "table inet ipsetmgr {\n\tset ipm4-s {\n\t\tflags Dynamic\n\t}\n}\n",
        "table inet ipsetmgr {\n\tset ipm4-s {\ntype ipv4_addr\n\t}\n}\n",
    ] {
        assert!(flags(bad, None).is_err(), "{bad:?}");
    }
}

#[test]
fn nft_error_text_becomes_typed_errors() {
    let full = "internal:0:0-0: Error: Could not process rule: Too many open files in system\n";
    assert_eq!(errno_of(full), Some(libc::ENFILE));
    let op = NftOp::DeleteSet { set: "s" };
    let busy = "Error: Could not process rule: Device or resource busy";
    assert_eq!(
        errno_error(busy, Some(&op), None),
        NftError::InUse("s".into())
    );
    assert_eq!(
        errno_error(full, Some(&op), None),
        NftError::SetFull("s".into())
    );
    let overlap = "Error: interval overlaps with an existing one";
    assert!(matches!(
        errno_error(overlap, Some(&op), None),
        NftError::ElementExists { .. }
    ));
}

impl crate::NftSetSpec {
    fn clone_without_size(&self) -> crate::NftSetSpec {
        crate::NftSetSpec {
            size: None,
            ..*self
        }
    }
}
