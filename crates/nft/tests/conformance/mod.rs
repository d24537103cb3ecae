//! The nf_tables conformance suite shared by every backend: the netlink
//! backend, the `nft` backend and the in-memory model run the same bodies.
//!
//! Each kernel test runs on its own thread moved into a fresh, empty
//! network namespace (`unshare(CLONE_NEWNET)`), so nothing touches the
//! host's ruleset; the backend is opened inside it. Without root the tests
//! print a skip message, except under `CI=true`, where they fail
//! (tests/common/kernel_gate.rs, shared with the ipset suites). The oracle
//! is `nft` itself in the same namespace: `nft -j list set` must show
//! exactly the elements the backend was told to hold.

#![allow(dead_code)]

use std::process::Command;

use std::sync::Arc;

use ipsetmgr_ipset::{
    DEFAULT_MAX_ELEM, Family, HeaderOptions, Member, MemberSet, Naming, SetHeader, SetKind, SetType,
};
use ipsetmgr_nft::cli::CliNft;
use ipsetmgr_nft::model::ModelNft;
use ipsetmgr_nft::{
    Elements, NftBatchError, NftDataplane, NftError, NftKernelSet, NftOp, SetShape, Table,
    TableFamily,
};
use ipsetmgr_sets::DesiredSet;

#[path = "../../../../tests/common/kernel_gate.rs"]
mod kernel_gate;

/// Instantiate every body for one backend: `conformance_tests!(kernel:
/// FACTORY)` or `conformance_tests!(model)`.
#[macro_export]
macro_rules! conformance_tests {
    (kernel: $factory:expr) => {
        $crate::conformance_tests!(@each Kernel, $factory;);
    };
    (model) => {
        $crate::conformance_tests!(@each Model, $crate::conformance::model_factory;);
    };
    (@each $mode:ident, $factory:expr;) => {
        $crate::conformance_tests!(@tests $mode, $factory;
            every_type_round_trips,
            second_apply_changes_nothing,
            comments_are_visible,
            nomatch_intervals_match_exactly,
            referenced_set_is_in_use_and_the_rule_survives,
            foreign_objects_are_never_listed_or_touched,
            failing_op_leaves_nothing_applied,
            overlap_and_size_are_refused,
            missing_table_and_sets,
            create_set_again,
            a_new_size_counts_from_the_commit,
            hash_mac_works,
            other_table_families,
            large_round_trip_100k,
        );
    };
    (@tests $mode:ident, $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::run(
                    stringify!($name),
                    $crate::conformance::Mode::$mode,
                    $factory,
                    $crate::conformance::$name,
                );
            }
        )*
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Kernel,
    Model,
}

pub type Factory = fn() -> Box<dyn NftDataplane>;

/// The native netlink backend, opened where it is called (a [`Factory`]).
pub fn netlink() -> Box<dyn NftDataplane> {
    Box::new(ipsetmgr_nft::netlink::NetlinkNft::new().expect("a NETLINK_NETFILTER socket"))
}

/// The `nft` backend (a [`Factory`]).
pub fn nft_cli() -> Box<dyn NftDataplane> {
    Box::new(CliNft::new())
}

/// What a body needs besides the backend: the way to set the kernel up as
/// someone else would (rules, foreign objects) and the oracle.
pub struct Env {
    pub mode: Mode,
    /// The model's own handle (the backend under test shares its state).
    pub model: Option<ModelNft>,
}

/// Run `body` on a new thread (for the kernel, in a fresh network
/// namespace); a panic in it fails the test.
pub fn run(name: &str, mode: Mode, factory: Factory, body: fn(&mut dyn NftDataplane, &Env)) {
    let name = name.to_string();
    let handle = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if mode == Mode::Kernel && !kernel_gate::enter_fresh_netns(&name) {
                return;
            }
            let mut dp = factory();
            // The model under test is reached through a shared handle.
            let model = (mode == Mode::Model).then(|| MODEL.with(|m| m.borrow().clone()));
            let env = Env { mode, model };
            body(&mut *dp, &env);
        })
        .expect("spawn test thread");
    if let Err(p) = handle.join() {
        std::panic::resume_unwind(p);
    }
}

thread_local! {
    /// The model of the current test thread: the model factory registers
    /// the instance it hands out.
    pub static MODEL: std::cell::RefCell<ModelNft> = std::cell::RefCell::new(ModelNft::new());
}

/// The model backend for the current thread, registered for [`Env`].
pub fn model_factory() -> Box<dyn NftDataplane> {
    let m = ModelNft::new();
    MODEL.with(|cell| *cell.borrow_mut() = m.clone());
    Box::new(m)
}

// ---- helpers ---------------------------------------------------------------

pub fn table() -> Table {
    Table::new(TableFamily::Inet, "T")
}

pub fn owned(name: &str) -> bool {
    name.starts_with("ipm")
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

fn nft_fails(args: &[&str]) -> bool {
    !Command::new("nft")
        .args(args)
        .output()
        .expect("run nft")
        .status
        .success()
}

impl Env {
    /// `nft add rule inet T c ip saddr @set drop` (with its chain), or the
    /// model's equivalent.
    pub fn add_rule_referencing(&self, set: &str, v6: bool) {
        match &self.model {
            Some(m) => assert!(m.add_rule_referencing(&table(), set)),
            None => {
                nft(&[
                    "add",
                    "chain",
                    "inet",
                    "T",
                    "c",
                    "{ type filter hook input priority 0; }",
                ]);
                let proto = if v6 { "ip6" } else { "ip" };
                nft(&[
                    "add",
                    "rule",
                    "inet",
                    "T",
                    "c",
                    proto,
                    "saddr",
                    &format!("@{set}"),
                    "drop",
                ]);
            }
        }
    }

    /// How many rules the table has (the kernel), or references (model).
    pub fn rules(&self) -> usize {
        match &self.model {
            Some(m) => m
                .table(&table())
                .map_or(0, |t| t.sets.values().map(|s| s.references as usize).sum()),
            None => {
                let text = nft(&["-j", "list", "table", "inet", "T"]);
                text.matches("\"rule\":").count()
            }
        }
    }

    /// A set and a chain that are not this project's.
    pub fn add_foreign_objects(&self) {
        match &self.model {
            Some(m) => {
                let spec = SetShape::new(
                    SetType::HashIp,
                    Some(Family::V4),
                    &HeaderOptions::default(),
                    10,
                )
                .unwrap()
                .spec;
                let mut dp = m.clone();
                let e = elements(
                    &shape(SetType::HashIp, Some(Family::V4), false),
                    &["9.9.9.9"],
                );
                ok(
                    &mut dp,
                    &[
                        NftOp::EnsureTable,
                        NftOp::CreateSet {
                            name: "other",
                            spec: &spec,
                        },
                        NftOp::AddElements {
                            set: "other",
                            elements: &e,
                        },
                    ],
                    &|_| true,
                );
                m.tamper(&table(), |t| {
                    t.chains.insert("theirs".into());
                });
            }
            None => {
                nft(&["add", "table", "inet", "T"]);
                nft(&[
                    "add",
                    "set",
                    "inet",
                    "T",
                    "other",
                    "{ type ipv4_addr; elements = { 9.9.9.9 }; }",
                ]);
                nft(&["add", "chain", "inet", "T", "theirs"]);
            }
        }
    }

    /// The set's elements as `nft -j list set` shows them (the kernel), or
    /// as the model holds them.
    pub fn oracle(&self, set: &str) -> Option<NftKernelSet> {
        match &self.model {
            Some(m) => m.clone().read_set(&table(), set).unwrap(),
            None => CliNft::new().read_set(&table(), set).unwrap(),
        }
    }

    /// `nft list set` as text (kernel only).
    pub fn listing(&self, set: &str) -> Option<String> {
        self.model
            .is_none()
            .then(|| nft(&["list", "set", "inet", "T", set]))
    }

    /// Whether the kernel's set holds `addr` (`nft get element`), or the
    /// model's elements do.
    pub fn holds(&self, set: &str, addr: &str) -> bool {
        match &self.model {
            Some(m) => {
                let k = m.clone().read_set(&table(), set).unwrap().unwrap();
                let a: std::net::IpAddr = addr.parse().unwrap();
                k.elements.unwrap().typed().unwrap().iter().any(|e| {
                    let (first, last) = (&e.key[0], &e.key_end.as_ref().unwrap()[0]);
                    let v = match a {
                        std::net::IpAddr::V4(x) => ipsetmgr_nft::Value::Ipv4(x),
                        std::net::IpAddr::V6(x) => ipsetmgr_nft::Value::Ipv6(x),
                    };
                    first <= &v && &v <= last
                })
            }
            None => !nft_fails(&["get", "element", "inet", "T", set, &format!("{{ {addr} }}")]),
        }
    }
}

pub fn shape(t: SetType, f: Option<Family>, comments: bool) -> SetShape {
    let opts = HeaderOptions {
        comment: comments,
        ..Default::default()
    };
    SetShape::new(t, f, &opts, 1000).unwrap()
}

pub fn members(t: SetType, items: &[&str]) -> Vec<Member> {
    items
        .iter()
        .flat_map(|i| {
            Member::parse_user(t, i)
                .unwrap_or_else(|e| panic!("{i}: {e}"))
                .members
        })
        .collect()
}

pub fn elements(s: &SetShape, items: &[&str]) -> Elements {
    s.elements(members(s.kind.set_type, items))
        .unwrap_or_else(|e| panic!("{e}"))
}

pub fn ok(dp: &mut dyn NftDataplane, ops: &[NftOp<'_>], owned: &dyn Fn(&str) -> bool) {
    if let Err(e) = dp.apply(&table(), ops, owned) {
        panic!("{} backend: transaction failed: {e} ({e:?})", dp.name());
    }
}

pub fn fails(dp: &mut dyn NftDataplane, ops: &[NftOp<'_>]) -> NftBatchError {
    match dp.apply(&table(), ops, &owned) {
        Ok(()) => panic!("{} backend: the transaction should have failed", dp.name()),
        Err(e) => e,
    }
}

pub fn read(dp: &mut dyn NftDataplane, set: &str) -> NftKernelSet {
    dp.read_set(&table(), set)
        .unwrap_or_else(|e| panic!("read_set {set}: {e}"))
        .unwrap_or_else(|| panic!("set {set} does not exist"))
}

fn shown(e: &Elements) -> Vec<String> {
    e.iter().map(|e| e.to_string()).collect()
}

/// The set holds exactly `want` with `shape`'s spec, through the backend
/// and through the oracle.
pub fn assert_holds(
    dp: &mut dyn NftDataplane,
    env: &Env,
    set: &str,
    s: &SetShape,
    want: &Elements,
) {
    let k = read(dp, set);
    assert_eq!(k.spec, Some(s.spec), "{set}: spec via {}", dp.name());
    assert_eq!(k.unmanaged, Vec::<String>::new(), "{set}: unmanaged");
    assert_eq!(k.unreadable_elements, 0, "{set}: unreadable elements");
    let got = k.elements.expect("elements");
    assert_eq!(
        shown(&got),
        shown(want),
        "{set}: elements via {}",
        dp.name()
    );
    assert_eq!(&got, want, "{set}: element bytes via {}", dp.name());
    let o = env.oracle(set).expect("the oracle sees the set");
    assert_eq!(
        o.spec.map(|s| s.key),
        Some(s.spec.key),
        "{set}: key per nft"
    );
    assert_eq!(
        o.spec.map(|s| s.interval),
        Some(s.spec.interval),
        "{set}: flags per nft"
    );
    assert_eq!(
        o.spec.and_then(|s| s.size),
        s.spec.size,
        "{set}: size per nft"
    );
    assert_eq!(
        o.unreadable_elements, 0,
        "{set}: elements nft prints that we cannot read"
    );
    assert_eq!(
        shown(&o.elements.expect("oracle elements")),
        shown(want),
        "{set}: elements per nft"
    );
}

/// Every type this crate maps, with members that exercise its fields.
pub fn every_type() -> Vec<(&'static str, SetType, Option<Family>, Vec<&'static str>)> {
    use Family::*;
    use SetType::*;
    vec![
        (
            "ipm4-ip",
            HashIp,
            Some(V4),
            vec!["10.0.0.1", "192.168.1.255", "1.2.3.4"],
        ),
        (
            "ipm6-ip",
            HashIp,
            Some(V6),
            vec!["2001:db8::1", "::ffff:1.2.3.4", "fe80::1"],
        ),
        (
            "ipm4-net",
            HashNet,
            Some(V4),
            vec![
                "10.0.0.0/8",
                "10.1.0.0/16 nomatch",
                "0.0.0.0/0",
                "1.2.3.4/32 nomatch",
                "172.16.0.0/12",
            ],
        ),
        (
            "ipm6-net",
            HashNet,
            Some(V6),
            vec!["2001:db8::/32", "2001:db8:1::/48 nomatch", "fd00::/8"],
        ),
        (
            "ipm4-port",
            HashIpPort,
            Some(V4),
            vec!["10.0.0.1,udp:53", "10.0.0.1,80", "10.0.0.2,sctp:0"],
        ),
        (
            "ipm6-port",
            HashIpPort,
            Some(V6),
            vec!["::1,udp:53", "2001:db8::5,udplite:65535"],
        ),
        (
            "ipm4-np",
            HashNetPort,
            Some(V4),
            vec![
                "10.0.0.0/8,80",
                "10.2.0.0/16,80 nomatch",
                "10.0.0.0/8,udp:80",
            ],
        ),
        (
            "ipm6-np",
            HashNetPort,
            Some(V6),
            vec!["2001:db8::/32,443", "2001:db8::1,443 nomatch"],
        ),
        (
            "ipm4-pip",
            HashIpPortIp,
            Some(V4),
            vec!["10.0.0.1,80,10.0.0.2", "10.0.0.1,udp:53,0.0.0.0"],
        ),
        ("ipm6-pip", HashIpPortIp, Some(V6), vec!["::1,80,::2"]),
        (
            "ipm4-pnet",
            HashIpPortNet,
            Some(V4),
            vec![
                "10.0.0.1,80,10.0.0.0/8",
                "10.0.0.1,80,10.9.0.0/16 nomatch",
                "10.0.0.2,80,10.9.0.0/16",
            ],
        ),
        (
            "ipm6-pnet",
            HashIpPortNet,
            Some(V6),
            vec!["::1,80,2001:db8::/32", "::1,80,2001:db8::/64 nomatch"],
        ),
        (
            "ipm4-if",
            HashNetIface,
            Some(V4),
            vec![
                "10.0.0.0/8,eth0",
                "10.1.0.0/16,eth0 nomatch",
                "0.0.0.0/0,lo",
                "192.168.0.0/16,wg_1",
            ],
        ),
        (
            "ipm6-if",
            HashNetIface,
            Some(V6),
            vec!["::/0,eth0", "fe80::/10,eth0 nomatch"],
        ),
        (
            "ipmx-mac",
            HashMac,
            None,
            vec!["aa:bb:cc:dd:ee:ff", "00:11:22:33:44:55"],
        ),
        (
            "ipm4-mark",
            HashIpMark,
            Some(V4),
            vec!["10.0.0.1,0x10", "10.0.0.1,0xffffffff", "10.0.0.2,0"],
        ),
        ("ipm6-mark", HashIpMark, Some(V6), vec!["::1,0x10"]),
        (
            "ipm4-bm",
            BitmapIp,
            Some(V4),
            vec!["10.0.0.0", "10.0.0.255"],
        ),
        ("ipmx-bp", BitmapPort, None, vec!["0", "22", "65535"]),
    ]
}

// ---- test bodies -----------------------------------------------------------

/// Create and fill every type; read back equal; `nft -j list set` shows
/// exactly the elements; delete some and add them back.
pub fn every_type_round_trips(dp: &mut dyn NftDataplane, env: &Env) {
    for (name, t, f, items) in every_type() {
        let s = shape(t, f, false);
        let e = elements(&s, &items);
        ok(
            dp,
            &[
                NftOp::EnsureTable,
                NftOp::CreateSet {
                    name,
                    spec: &s.spec,
                },
                NftOp::AddElements {
                    set: name,
                    elements: &e,
                },
            ],
            &owned,
        );
        assert_holds(dp, env, name, &s, &e);
        assert_eq!(read(dp, name).references, 0);
        // Delete the first element, then add it back.
        let mut first = Elements::new(s.spec.key, s.spec.interval);
        let e0 = e.get(0).unwrap();
        first
            .push_raw(e0.key, e0.key_end, e0.comment.cloned())
            .unwrap();
        ok(
            dp,
            &[NftOp::DelElements {
                set: name,
                elements: &first,
            }],
            &owned,
        );
        let (del, add) = e.diff(read(dp, name).elements.as_ref().unwrap());
        assert!(del.is_empty(), "{name}");
        assert_eq!(add, first, "{name}: exactly the deleted element is missing");
        ok(
            dp,
            &[NftOp::AddElements {
                set: name,
                elements: &first,
            }],
            &owned,
        );
        assert_holds(dp, env, name, &s, &e);
    }
    let sets = dp.list_sets(&table(), &owned).unwrap().unwrap();
    assert_eq!(sets.len(), every_type().len());
}

/// The same transaction twice: the second changes nothing.
pub fn second_apply_changes_nothing(dp: &mut dyn NftDataplane, env: &Env) {
    for (name, t, f, items) in every_type().into_iter().step_by(3) {
        let s = shape(t, f, false);
        let e = elements(&s, &items);
        let ops = [
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name,
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: name,
                elements: &e,
            },
        ];
        ok(dp, &ops, &owned);
        let before = read(dp, name);
        ok(dp, &ops, &owned);
        let after = read(dp, name);
        assert_eq!(before, after, "{name}: the second apply changed the set");
        assert_holds(dp, env, name, &s, &e);
    }
}

pub fn comments_are_visible(dp: &mut dyn NftDataplane, env: &Env) {
    for (name, t, f, items) in [
        (
            "ipm4-c",
            SetType::HashIp,
            Some(Family::V4),
            vec!["10.0.0.1 comment:office", "10.0.0.2"],
        ),
        (
            "ipm4-cn",
            SetType::HashNet,
            Some(Family::V4),
            vec![
                "10.0.0.0/8 comment:source: spamhaus 2026-11-30",
                "10.1.0.0/16 nomatch",
                "255.0.0.0/8 comment:top",
            ],
        ),
        (
            "ipm4-cp",
            SetType::HashNetPort,
            Some(Family::V4),
            vec!["10.0.0.0/8,80 comment:web"],
        ),
        (
            "ipmx-cm",
            SetType::HashMac,
            None,
            vec!["aa:bb:cc:dd:ee:ff comment:printer"],
        ),
    ] {
        let s = shape(t, f, true);
        let e = elements(&s, &items);
        ok(
            dp,
            &[
                NftOp::EnsureTable,
                NftOp::CreateSet {
                    name,
                    spec: &s.spec,
                },
                NftOp::AddElements {
                    set: name,
                    elements: &e,
                },
            ],
            &owned,
        );
        assert!(e.has_comments());
        assert_holds(dp, env, name, &s, &e);
        if let Some(text) = env.listing(name) {
            for item in &items {
                if let Some((_, c)) = item.split_once(" comment:") {
                    assert!(
                        text.contains(&format!("comment \"{c}\"")),
                        "{name}: {c} in\n{text}"
                    );
                }
            }
        }
    }
}

/// hash:net with nomatch nesting becomes intervals that match exactly what
/// ipset would: checked address by address in the kernel.
pub fn nomatch_intervals_match_exactly(dp: &mut dyn NftDataplane, env: &Env) {
    let s = shape(SetType::HashNet, Some(Family::V4), false);
    let e = elements(
        &s,
        &[
            "10.0.0.0/8",
            "10.1.0.0/16 nomatch",
            "10.1.2.0/24",
            "10.1.2.128/25 nomatch",
            "10.1.2.200/32",
            "11.0.0.0/8",
            "0.0.0.0/0 nomatch",
            "255.255.255.255/32",
        ],
    );
    let name = "ipm4-x";
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name,
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: name,
                elements: &e,
            },
        ],
        &owned,
    );
    assert_holds(dp, env, name, &s, &e);
    for (addr, want) in [
        ("10.0.0.1", true),
        ("10.0.255.255", true),
        ("10.1.0.0", false),
        ("10.1.1.255", false),
        ("10.1.2.0", true),
        ("10.1.2.127", true),
        ("10.1.2.128", false),
        ("10.1.2.200", true),
        ("10.1.2.255", false),
        ("10.1.3.0", false),
        ("10.2.0.0", true),
        ("11.255.255.255", true),
        ("12.0.0.0", false),
        ("9.255.255.255", false),
        ("255.255.255.255", true),
        ("255.255.255.254", false),
    ] {
        assert_eq!(env.holds(name, addr), want, "{addr}");
    }
    // The last range runs to the last address (no interval-end element in
    // the kernel): it deletes and comes back like any other.
    let mut top = Elements::new(s.spec.key, true);
    let last = e.get(e.len() - 1).unwrap();
    assert_eq!(last.to_string(), "255.255.255.255");
    top.push_raw(last.key, last.key_end, None).unwrap();
    ok(
        dp,
        &[NftOp::DelElements {
            set: name,
            elements: &top,
        }],
        &owned,
    );
    assert!(!env.holds(name, "255.255.255.255"));
    assert!(env.holds(name, "11.0.0.1"));
    ok(
        dp,
        &[NftOp::AddElements {
            set: name,
            elements: &top,
        }],
        &owned,
    );
    assert_holds(dp, env, name, &s, &e);
}

/// A rule references the set: deleting it is "in use"; the rule survives
/// element changes and a flush with refill in one transaction.
pub fn referenced_set_is_in_use_and_the_rule_survives(dp: &mut dyn NftDataplane, env: &Env) {
    let s = shape(SetType::HashNet, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.0/8", "10.1.0.0/16 nomatch"]);
    let name = "ipm4-x";
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name,
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: name,
                elements: &e,
            },
        ],
        &owned,
    );
    env.add_rule_referencing(name, false);
    assert_eq!(env.rules(), 1);
    assert_eq!(read(dp, name).references, 1);
    let err = fails(dp, &[NftOp::DeleteSet { set: name }]);
    assert_eq!(err.op_index, Some(0));
    assert_eq!(err.error, NftError::InUse(name.into()));
    // Add and delete elements.
    let more = elements(&s, &["192.168.0.0/16"]);
    ok(
        dp,
        &[NftOp::AddElements {
            set: name,
            elements: &more,
        }],
        &owned,
    );
    ok(
        dp,
        &[NftOp::DelElements {
            set: name,
            elements: &more,
        }],
        &owned,
    );
    // Flush and refill in one transaction.
    let refill = elements(&s, &["172.16.0.0/12", "172.16.1.0/24 nomatch"]);
    ok(
        dp,
        &[
            NftOp::FlushSet { set: name },
            NftOp::AddElements {
                set: name,
                elements: &refill,
            },
        ],
        &owned,
    );
    assert_holds(dp, env, name, &s, &refill);
    assert_eq!(env.rules(), 1, "the rule is never removed");
    assert_eq!(read(dp, name).references, 1);
    assert!(
        dp.table_has_foreign_objects(&table(), &owned).unwrap(),
        "the rule's chain"
    );
    // The lookup still matches through the new elements.
    assert!(env.holds(name, "172.16.0.1"));
    assert!(!env.holds(name, "172.16.1.1"));
}

pub fn foreign_objects_are_never_listed_or_touched(dp: &mut dyn NftDataplane, env: &Env) {
    assert!(
        !dp.table_has_foreign_objects(&table(), &owned).unwrap(),
        "no table: nothing foreign"
    );
    env.add_foreign_objects();
    let s = shape(SetType::HashIp, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.1"]);
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-a",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-a",
                elements: &e,
            },
        ],
        &owned,
    );
    assert_eq!(
        dp.list_sets(&table(), &owned).unwrap(),
        Some(vec!["ipm4-a".to_string()])
    );
    assert!(dp.table_has_foreign_objects(&table(), &owned).unwrap());
    // Ops on a set `owned` refuses are never sent.
    for op in [
        NftOp::DeleteSet { set: "other" },
        NftOp::FlushSet { set: "other" },
        NftOp::AddElements {
            set: "other",
            elements: &e,
        },
    ] {
        let err = dp
            .apply(&table(), &[NftOp::FlushSet { set: "ipm4-a" }, op], &owned)
            .unwrap_err();
        assert_eq!(err.op_index, Some(1));
        assert!(matches!(err.error, NftError::NotOwned(_)), "{err}");
    }
    assert_eq!(
        read(dp, "ipm4-a").elements.unwrap(),
        e,
        "nothing of the refused batch applied"
    );
    let other = env.oracle("other").expect("the foreign set is still there");
    assert_eq!(shown(&other.elements.unwrap()), ["9.9.9.9"]);
    // Only owned sets without foreign objects: nothing foreign.
    let only_ours = |n: &str| owned(n) || n == "other";
    assert!(
        dp.table_has_foreign_objects(&table(), &only_ours).unwrap(),
        "the chain is still foreign"
    );
}

/// A failing op in the middle: the whole transaction is undone, and the
/// error names the op.
pub fn failing_op_leaves_nothing_applied(dp: &mut dyn NftDataplane, env: &Env) {
    let s = shape(SetType::HashIp, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.1", "10.0.0.2"]);
    let err = fails(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-a",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-a",
                elements: &e,
            },
            NftOp::AddElements {
                set: "ipm4-missing",
                elements: &e,
            },
            NftOp::CreateSet {
                name: "ipm4-b",
                spec: &s.spec,
            },
        ],
    );
    assert_eq!(err.op_index, Some(3), "{err}");
    assert_eq!(err.error, NftError::SetMissing("ipm4-missing".into()));
    assert_eq!(
        dp.list_sets(&table(), &owned).unwrap(),
        None,
        "not even the table was created"
    );
    // With the table there: an element delete that fails undoes the flush.
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-a",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-a",
                elements: &e,
            },
        ],
        &owned,
    );
    let absent = elements(&s, &["10.0.0.1", "10.9.9.9"]);
    let err = fails(
        dp,
        &[
            NftOp::FlushSet { set: "ipm4-a" },
            NftOp::AddElements {
                set: "ipm4-a",
                elements: &elements(&s, &["10.0.0.3"]),
            },
            NftOp::DelElements {
                set: "ipm4-a",
                elements: &absent,
            },
        ],
    );
    // 10.0.0.1 is gone by then (the flush): the delete names it.
    assert_eq!(err.op_index, Some(2), "{err}");
    assert_eq!(err.element_index, Some(0), "{err:?}");
    assert_eq!(
        err.error,
        NftError::ElementMissing {
            set: "ipm4-a".into(),
            element: "10.0.0.1".into()
        }
    );
    assert_holds(dp, env, "ipm4-a", &s, &e);
}

pub fn overlap_and_size_are_refused(dp: &mut dyn NftDataplane, env: &Env) {
    let s = shape(SetType::HashNet, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.0/8"]);
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-n",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-n",
                elements: &e,
            },
        ],
        &owned,
    );
    let inner = elements(&s, &["10.1.0.0/16", "192.168.0.0/16"]);
    let err = fails(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-n",
            elements: &inner,
        }],
    );
    assert_eq!(err.op_index, Some(0));
    assert_eq!(err.element_index, Some(0), "{err:?}");
    assert_eq!(
        err.error,
        NftError::ElementExists {
            set: "ipm4-n".into(),
            element: "10.1.0.0/16".into()
        }
    );
    assert_holds(dp, env, "ipm4-n", &s, &e);
    // Concatenated ranges overlap per field.
    let c = shape(SetType::HashNetPort, Some(Family::V4), false);
    let ce = elements(&c, &["10.0.0.0/8,80"]);
    ok(
        dp,
        &[
            NftOp::CreateSet {
                name: "ipm4-c",
                spec: &c.spec,
            },
            NftOp::AddElements {
                set: "ipm4-c",
                elements: &ce,
            },
        ],
        &owned,
    );
    let clash = elements(&c, &["10.0.0.0/16,80"]);
    let err = fails(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-c",
            elements: &clash,
        }],
    );
    assert!(
        matches!(err.error, NftError::ElementExists { .. }),
        "{err:?}"
    );
    let fine = elements(&c, &["10.0.0.0/16,81"]);
    ok(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-c",
            elements: &fine,
        }],
        &owned,
    );
    // size: two elements fit, the third does not.
    let small = SetShape::new(
        SetType::HashIp,
        Some(Family::V4),
        &HeaderOptions::default(),
        2,
    )
    .unwrap();
    let three = elements(&small, &["1.1.1.1", "2.2.2.2", "3.3.3.3"]);
    ok(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-s",
            spec: &small.spec,
        }],
        &owned,
    );
    let err = fails(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-s",
            elements: &three,
        }],
    );
    assert_eq!(err.op_index, Some(0));
    assert_eq!(err.error, NftError::SetFull("ipm4-s".into()));
    assert_eq!(read(dp, "ipm4-s").elements.unwrap().len(), 0);
    // ... and intervals count one each.
    let nets = SetShape::new(
        SetType::HashNet,
        Some(Family::V4),
        &HeaderOptions::default(),
        2,
    )
    .unwrap();
    let two = elements(&nets, &["1.0.0.0/8", "3.0.0.0/8"]);
    ok(
        dp,
        &[
            NftOp::CreateSet {
                name: "ipm4-t",
                spec: &nets.spec,
            },
            NftOp::AddElements {
                set: "ipm4-t",
                elements: &two,
            },
        ],
        &owned,
    );
}

pub fn missing_table_and_sets(dp: &mut dyn NftDataplane, _env: &Env) {
    assert_eq!(dp.list_sets(&table(), &owned).unwrap(), None);
    assert_eq!(dp.read_set(&table(), "ipm4-a").unwrap(), None);
    let s = shape(SetType::HashIp, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.1"]);
    let err = fails(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-a",
            elements: &e,
        }],
    );
    assert_eq!(
        err.error,
        NftError::TableMissing(table().to_string()),
        "{err:?}"
    );
    let err = fails(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-a",
            spec: &s.spec,
        }],
    );
    assert_eq!(
        err.error,
        NftError::TableMissing(table().to_string()),
        "{err:?}"
    );
    ok(dp, &[NftOp::EnsureTable], &owned);
    assert_eq!(dp.list_sets(&table(), &owned).unwrap(), Some(vec![]));
    assert_eq!(dp.read_set(&table(), "ipm4-a").unwrap(), None);
    let err = fails(dp, &[NftOp::FlushSet { set: "ipm4-a" }]);
    assert_eq!(err.error, NftError::SetMissing("ipm4-a".into()), "{err:?}");
    let err = fails(dp, &[NftOp::DeleteSet { set: "ipm4-a" }]);
    assert_eq!(err.error, NftError::SetMissing("ipm4-a".into()), "{err:?}");
    // An empty transaction is no transaction.
    let none = Elements::new(s.spec.key, false);
    ok(dp, &[], &owned);
    ok(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-a",
            elements: &none,
        }],
        &owned,
    );
}

/// `add set` again: the same key and flags keep the set (and its
/// elements); another key is "exists".
pub fn create_set_again(dp: &mut dyn NftDataplane, env: &Env) {
    let s = shape(SetType::HashIp, Some(Family::V4), false);
    let e = elements(&s, &["10.0.0.1"]);
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-a",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-a",
                elements: &e,
            },
        ],
        &owned,
    );
    ok(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-a",
            spec: &s.spec,
        }],
        &owned,
    );
    assert_holds(dp, env, "ipm4-a", &s, &e);
    // The same key and flags with another size: the set stays, its size
    // follows (nft's `add set` on this kernel).
    let bigger = SetShape::new(
        SetType::HashIp,
        Some(Family::V4),
        &HeaderOptions::default(),
        5000,
    )
    .unwrap();
    ok(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-a",
            spec: &bigger.spec,
        }],
        &owned,
    );
    let k = read(dp, "ipm4-a");
    assert_eq!(k.spec.and_then(|s| s.size), Some(5000));
    assert_eq!(k.elements.as_ref(), Some(&e));
    // Elements of another type for an existing set: the kernel refuses
    // them, naming the element.
    let m = shape(SetType::HashIpMark, Some(Family::V4), false);
    let me = elements(&m, &["10.0.0.9,0x1"]);
    let err = fails(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-a",
            elements: &me,
        }],
    );
    assert_eq!(err.op_index, Some(0));
    assert!(
        matches!(&err.error, NftError::InvalidElement { set, element, .. } if set == "ipm4-a" && element == "10.0.0.9 . 0x00000001"),
        "{err:?}"
    );
    ok(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-a",
            spec: &s.spec,
        }],
        &owned,
    );
    let v6 = shape(SetType::HashIp, Some(Family::V6), false);
    let err = fails(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-a",
            spec: &v6.spec,
        }],
    );
    assert_eq!(err.error, NftError::SetExists("ipm4-a".into()), "{err:?}");
    let net = shape(SetType::HashNet, Some(Family::V4), false);
    let err = fails(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-a",
            spec: &net.spec,
        }],
    );
    assert_eq!(err.error, NftError::SetExists("ipm4-a".into()), "{err:?}");
    // Delete and create anew with another type, in one transaction.
    let ne = elements(&net, &["10.0.0.0/8", "10.0.0.0/9 nomatch"]);
    ok(
        dp,
        &[
            NftOp::DeleteSet { set: "ipm4-a" },
            NftOp::CreateSet {
                name: "ipm4-a",
                spec: &net.spec,
            },
            NftOp::AddElements {
                set: "ipm4-a",
                elements: &ne,
            },
        ],
        &owned,
    );
    assert_holds(dp, env, "ipm4-a", &net, &ne);
}

/// nft has ether_addr sets even where the kernel's ipset lacks hash:mac.
/// A set's new size takes effect when its transaction commits: elements
/// added in the same transaction still count against the old one (the
/// kernel checks each insert against the live set), so a set that must
/// grow is resized in a transaction of its own first.
pub fn a_new_size_counts_from_the_commit(dp: &mut dyn NftDataplane, env: &Env) {
    let sized = |n| {
        SetShape::new(
            SetType::HashIp,
            Some(Family::V4),
            &HeaderOptions::default(),
            n,
        )
        .unwrap()
    };
    let (small, big) = (sized(2), sized(5));
    let two = elements(&small, &["10.0.0.1", "10.0.0.2"]);
    let three = elements(&small, &["10.0.0.3", "10.0.0.4", "10.0.0.5"]);
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-g",
                spec: &small.spec,
            },
            NftOp::AddElements {
                set: "ipm4-g",
                elements: &two,
            },
        ],
        &owned,
    );
    let err = fails(
        dp,
        &[
            NftOp::CreateSet {
                name: "ipm4-g",
                spec: &big.spec,
            },
            NftOp::AddElements {
                set: "ipm4-g",
                elements: &three,
            },
        ],
    );
    assert_eq!(err.op_index, Some(1), "{err:?}");
    assert_eq!(err.error, NftError::SetFull("ipm4-g".into()));
    // Nothing of the failed transaction stays, its resize included.
    let k = read(dp, "ipm4-g");
    assert_eq!(k.spec.and_then(|s| s.size), Some(2));
    assert_eq!(k.elements.as_ref(), Some(&two));
    // Resized first, on its own: the same elements then fit.
    ok(
        dp,
        &[NftOp::CreateSet {
            name: "ipm4-g",
            spec: &big.spec,
        }],
        &owned,
    );
    ok(
        dp,
        &[NftOp::AddElements {
            set: "ipm4-g",
            elements: &three,
        }],
        &owned,
    );
    let all = elements(
        &big,
        &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"],
    );
    assert_holds(dp, env, "ipm4-g", &big, &all);
}

pub fn hash_mac_works(dp: &mut dyn NftDataplane, env: &Env) {
    let s = shape(SetType::HashMac, None, false);
    let e = elements(
        &s,
        &[
            "aa:bb:cc:dd:ee:ff",
            "AA-BB-CC-DD-EE-00",
            "02:00:00:00:00:01",
        ],
    );
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipmx-mac",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipmx-mac",
                elements: &e,
            },
        ],
        &owned,
    );
    assert_holds(dp, env, "ipmx-mac", &s, &e);
    let back = s.members(&read(dp, "ipmx-mac").elements.unwrap()).unwrap();
    let mut back: Vec<String> = back.iter().map(|m| m.to_string()).collect();
    back.sort();
    assert_eq!(
        back,
        [
            "02:00:00:00:00:01",
            "AA:BB:CC:DD:EE:00",
            "AA:BB:CC:DD:EE:FF"
        ]
    );
}

pub fn large_round_trip_100k(dp: &mut dyn NftDataplane, env: &Env) {
    let s = SetShape::new(
        SetType::HashIp,
        Some(Family::V4),
        &HeaderOptions::default(),
        200_000,
    )
    .unwrap();
    let members: Vec<Member> = (0u32..100_000)
        .map(|i| Member::Ip(std::net::IpAddr::V4((0x0a00_0000 + i * 3).into())))
        .collect();
    let e = s.elements(&members).unwrap();
    let t = std::time::Instant::now();
    ok(
        dp,
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-big",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-big",
                elements: &e,
            },
        ],
        &owned,
    );
    let filled = t.elapsed();
    let t = std::time::Instant::now();
    let k = read(dp, "ipm4-big");
    eprintln!(
        "{}: 100k elements: fill {:?}, read {:?}",
        dp.name(),
        filled,
        t.elapsed()
    );
    assert_eq!(k.elements.as_ref(), Some(&e));
    assert_holds(dp, env, "ipm4-big", &s, &e);
    // And 100k networks with nomatch holes.
    let n = SetShape::new(
        SetType::HashNet,
        Some(Family::V4),
        &HeaderOptions::default(),
        200_000,
    )
    .unwrap();
    let nets: Vec<Member> = (0u32..50_000)
        .flat_map(|i| {
            let base = 0x0b00_0000 + (i << 9);
            [
                Member::Net {
                    addr: std::net::IpAddr::V4(base.into()),
                    prefix: 24,
                    nomatch: false,
                },
                Member::Net {
                    addr: std::net::IpAddr::V4((base + 64).into()),
                    prefix: 26,
                    nomatch: true,
                },
            ]
        })
        .collect();
    let ne = n.elements(&nets).unwrap();
    assert_eq!(ne.len(), 100_000, "each /24 minus its /26 is two ranges");
    ok(
        dp,
        &[
            NftOp::CreateSet {
                name: "ipm4-bign",
                spec: &n.spec,
            },
            NftOp::AddElements {
                set: "ipm4-bign",
                elements: &ne,
            },
        ],
        &owned,
    );
    assert_holds(dp, env, "ipm4-bign", &n, &ne);
}

/// Tables of the other families hold the same sets; each table is its own.
pub fn other_table_families(dp: &mut dyn NftDataplane, _env: &Env) {
    let s = shape(SetType::HashNet, Some(Family::V4), true);
    let e = elements(&s, &["10.0.0.0/8 comment:x", "10.1.0.0/16 nomatch"]);
    for family in [
        TableFamily::Ip,
        TableFamily::Ip6,
        TableFamily::Bridge,
        TableFamily::Netdev,
    ] {
        let t = Table::new(family, "T");
        let ops = [
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "ipm4-n",
                spec: &s.spec,
            },
            NftOp::AddElements {
                set: "ipm4-n",
                elements: &e,
            },
        ];
        if let Err(err) = dp.apply(&t, &ops, &owned) {
            panic!("{family}: {err}");
        }
        let k = dp.read_set(&t, "ipm4-n").unwrap().expect("the set");
        assert_eq!(k.elements.as_ref(), Some(&e), "{family}");
        assert_eq!(
            dp.list_sets(&t, &owned).unwrap(),
            Some(vec!["ipm4-n".to_string()])
        );
    }
    assert_eq!(
        dp.list_sets(&table(), &owned).unwrap(),
        None,
        "inet T was never created"
    );
}

/// A desired set of policy `p`: type `t`, family `f`, and `items` as a
/// user writes them (the backend tests' input).
pub fn desired(p: &str, t: SetType, f: Family, items: &[&str]) -> DesiredSet {
    let kind = SetKind::new(t, Some(f));
    let members: Vec<Member> = items
        .iter()
        .flat_map(|i| Member::parse_user(t, i).unwrap().members)
        .collect();
    DesiredSet {
        name: Naming::default().main_set_name(p, Some(f)),
        policy: p.into(),
        header: SetHeader {
            kind,
            max_elem: DEFAULT_MAX_ELEM,
            hash_size: None,
            options: HeaderOptions::default(),
        },
        members: Arc::new(MemberSet::from_members(kind, members)),
    }
}

/// The elements nft should hold for `d`, as nft prints them.
pub fn expected(d: &DesiredSet) -> Vec<String> {
    let shape = SetShape::from_header(&d.header).unwrap();
    shape
        .elements(d.members.iter())
        .unwrap()
        .iter()
        .map(|e| e.to_string())
        .collect()
}
