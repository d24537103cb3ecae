//! Property tests of parsing and rendering for the set types added after
//! the first five: hash:net,port, hash:ip,port,ip, hash:ip,port,net,
//! hash:net,iface, hash:ip,mark, bitmap:ip and bitmap:port.
//!
//! Each generated member is a typed value together with one of the many
//! ways a user may spell it (host bits set, a bare port for tcp, ICMP by
//! number, `/32` on a host, upper-case hex, a mark in decimal). Without a
//! kernel: the spelling parses to exactly that value, and its rendering
//! parses back to it. With one (root, a fresh network namespace per
//! backend): a set of those members created through each backend lists, in
//! `ipset list`, exactly the rendered members, every listed line parses
//! back to a member of the set, and the backend reads the same set back.
//! hash:ip,mark takes part in the kernel round trip only where the kernel
//! has it (the CI kernel does not; the conformance suite checks its error).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;

use ipsetmgr_dataplane::cli::CliDataplane;
use ipsetmgr_dataplane::netlink::NetlinkDataplane;
use ipsetmgr_dataplane::{Dataplane, Op};
use ipsetmgr_ipset::{
    Family, HeaderOptions, IfaceName, IpPortIp, IpPortNet, Member, MemberSet, NetIface, Proto,
    SetHeader, SetKind, SetRange, SetType, mask,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

#[path = "common/kernel_props.rs"]
mod kernel_props;

#[path = "common/kernel_gate.rs"]
mod kernel_gate;

/// One member: how a user wrote it, and the value it must mean.
#[derive(Clone, Debug)]
struct Spelled {
    text: String,
    member: Member,
}

/// Members of one kind, and the header of a set that can hold them.
#[derive(Clone, Debug)]
struct Case {
    kind: SetKind,
    header: SetHeader,
    members: Vec<Spelled>,
}

// ---- spellings of the parts ------------------------------------------------

fn family() -> impl Strategy<Value = Family> {
    prop_oneof![Just(Family::V4), Just(Family::V6)]
}

fn addr(f: Family) -> BoxedStrategy<IpAddr> {
    match f {
        Family::V4 => any::<u32>()
            .prop_map(|a| IpAddr::V4(Ipv4Addr::from(a)))
            .boxed(),
        Family::V6 => prop_oneof![
            any::<u128>(),
            // Mostly zero: the compressed and IPv4-compatible forms.
            any::<u32>().prop_map(u128::from),
            (any::<u16>(), any::<u16>()).prop_map(|(a, b)| (a as u128) << 112 | b as u128),
        ]
        .prop_map(|a| IpAddr::V6(Ipv6Addr::from(a)))
        .boxed(),
    }
}

/// An address as a user may write it: upper-case IPv6 now and then.
fn addr_text(a: &IpAddr, upper: bool) -> String {
    let s = a.to_string();
    if upper { s.to_uppercase() } else { s }
}

/// A host: bare, or with its host-length prefix.
fn host_text(a: &IpAddr, suffix: bool, upper: bool) -> String {
    let s = addr_text(a, upper);
    if suffix {
        format!("{s}/{}", Family::of(a).max_prefix())
    } else {
        s
    }
}

/// A network: (address with host bits cleared, prefix, a spelling with the
/// host bits of `raw` left in). `min` is the shortest prefix generated.
fn net(f: Family, min: u8) -> impl Strategy<Value = (IpAddr, u8, String)> {
    (addr(f), min..=f.max_prefix(), any::<bool>(), any::<bool>()).prop_map(
        move |(raw, prefix, bare_host, upper)| {
            let text = if prefix == f.max_prefix() && bare_host {
                addr_text(&raw, upper)
            } else {
                format!("{}/{prefix}", addr_text(&raw, upper))
            };
            (mask(raw, prefix), prefix, text)
        },
    )
}

/// A protocol and port (ICMP: type << 8 | code) for family `f`, spelled
/// with a bare port for tcp or upper-case protocol names now and then.
fn proto_port(f: Family) -> impl Strategy<Value = (Proto, u16, String)> {
    let icmp = match f {
        Family::V4 => (Proto::Icmp, "icmp"),
        Family::V6 => (Proto::Icmpv6, "icmpv6"),
    };
    let transport = prop::sample::select(vec![
        (Proto::Tcp, "tcp"),
        (Proto::Udp, "udp"),
        (Proto::Sctp, "sctp"),
        (Proto::Udplite, "udplite"),
    ]);
    prop_oneof![
        3 => (transport, any::<u16>(), 0u8..3).prop_map(|((p, name), port, style)| {
            let text = match style {
                0 if p == Proto::Tcp => port.to_string(),
                1 => format!("{}:{port}", name.to_uppercase()),
                _ => format!("{name}:{port}"),
            };
            (p, port, text)
        }),
        1 => (any::<u8>(), any::<u8>()).prop_map(move |(t, c)| {
            (icmp.0, (t as u16) << 8 | c as u16, format!("{}:{t}/{c}", icmp.1))
        }),
    ]
}

fn nomatch() -> impl Strategy<Value = bool> {
    prop::bool::weighted(0.25)
}

fn with_nomatch(text: String, nomatch: bool) -> String {
    if nomatch {
        format!("{text} nomatch")
    } else {
        text
    }
}

fn iface() -> impl Strategy<Value = String> {
    "[a-z0-9._@+=-]{1,15}".prop_filter("not . or ..", |n| n != "." && n != "..")
}

// ---- members of each type ----------------------------------------------

fn net_port(f: Family) -> impl Strategy<Value = Spelled> {
    (net(f, 1), proto_port(f), nomatch()).prop_map(
        |((addr, prefix, nt), (proto, port, pt), nomatch)| Spelled {
            text: with_nomatch(format!("{nt},{pt}"), nomatch),
            member: Member::NetPort {
                addr,
                prefix,
                proto,
                port,
                nomatch,
            },
        },
    )
}

fn ip_port_ip(f: Family) -> impl Strategy<Value = Spelled> {
    (addr(f), proto_port(f), addr(f), any::<[bool; 4]>()).prop_map(
        |(a, (proto, port, pt), b, [s1, s2, u1, u2])| Spelled {
            text: format!("{},{pt},{}", host_text(&a, s1, u1), host_text(&b, s2, u2)),
            member: Member::IpPortIp(Box::new(IpPortIp {
                addr: a,
                proto,
                port,
                addr2: b,
            })),
        },
    )
}

fn ip_port_net(f: Family) -> impl Strategy<Value = Spelled> {
    (
        addr(f),
        proto_port(f),
        net(f, 1),
        nomatch(),
        any::<[bool; 2]>(),
    )
        .prop_map(
            |(a, (proto, port, pt), (net, prefix, nt), nomatch, [s, u])| Spelled {
                text: with_nomatch(format!("{},{pt},{nt}", host_text(&a, s, u)), nomatch),
                member: Member::IpPortNet(Box::new(IpPortNet {
                    addr: a,
                    proto,
                    port,
                    net,
                    prefix,
                    nomatch,
                })),
            },
        )
}

fn net_iface(f: Family) -> impl Strategy<Value = Spelled> {
    // /0 is a member of its own here (the kernel holds it).
    (net(f, 0), any::<bool>(), iface(), nomatch()).prop_map(
        |((addr, prefix, nt), physdev, name, nomatch)| {
            let phys = if physdev { "physdev:" } else { "" };
            Spelled {
                text: with_nomatch(format!("{nt},{phys}{name}"), nomatch),
                member: Member::NetIface(Box::new(NetIface {
                    addr,
                    prefix,
                    physdev,
                    iface: IfaceName::parse(&name).expect("generated names are valid"),
                    nomatch,
                })),
            }
        },
    )
}

fn ip_mark(f: Family) -> impl Strategy<Value = Spelled> {
    (addr(f), any::<u32>(), 0u8..3, any::<bool>())
        .prop_filter("the all-zero address is refused", |(a, ..)| {
            !a.is_unspecified()
        })
        .prop_map(|(a, mark, style, upper)| {
            let m = match style {
                0 => mark.to_string(),
                1 => format!("0x{mark:X}"),
                _ => format!("0x{mark:08x}"),
            };
            Spelled {
                text: format!("{},{m}", addr_text(&a, upper)),
                member: Member::IpMark { addr: a, mark },
            }
        })
}

/// A bitmap:ip range of 1 to 65536 addresses, and members within it.
fn bitmap_ip() -> impl Strategy<Value = Case> {
    (any::<u32>(), any::<u16>()).prop_flat_map(|(start, width)| {
        let from = start.min(u32::MAX - width as u32);
        let to = from + width as u32;
        let range = SetRange::Ipv4 {
            from: Ipv4Addr::from(from),
            to: Ipv4Addr::from(to),
        };
        let member = (from..=to, any::<bool>()).prop_map(|(a, suffix)| {
            let a = IpAddr::V4(Ipv4Addr::from(a));
            Spelled {
                text: host_text(&a, suffix, false),
                member: Member::Ip(a),
            }
        });
        prop::collection::vec(member, 0..24)
            .prop_map(move |members| bitmap_case(SetType::BitmapIp, range, members))
    })
}

/// A bitmap:port range, and port numbers within it.
fn bitmap_port() -> impl Strategy<Value = Case> {
    (any::<u16>(), any::<u16>()).prop_flat_map(|(a, b)| {
        let (from, to) = (a.min(b), a.max(b));
        let range = SetRange::Port { from, to };
        let member = (from..=to).prop_map(|p| Spelled {
            text: p.to_string(),
            member: Member::Port(p),
        });
        prop::collection::vec(member, 0..24)
            .prop_map(move |members| bitmap_case(SetType::BitmapPort, range, members))
    })
}

fn bitmap_case(t: SetType, range: SetRange, members: Vec<Spelled>) -> Case {
    let kind = SetKind::new(t, t.only_family());
    Case {
        kind,
        header: SetHeader {
            kind,
            max_elem: range.len() as u32,
            hash_size: None,
            options: HeaderOptions {
                range: Some(range),
                comment: false,
                mask: None,
            },
        },
        members,
    }
}

/// A comment as a user writes it: printable ASCII without `"` or `\`, no
/// space at either end.
fn comment_text() -> impl Strategy<Value = String> {
    "[!#-\\[\\]-~]([ !#-\\[\\]-~]{0,60}[!#-\\[\\]-~])?"
}

/// Now and then a comment on some members; the set then has the extension.
fn with_comments(case: impl Strategy<Value = Case>) -> impl Strategy<Value = Case> {
    (case, prop::bool::weighted(0.3)).prop_flat_map(|(case, on)| {
        let n = case.members.len();
        let comments = prop::collection::vec(prop::option::weighted(0.5, comment_text()), n);
        (Just(case), Just(on), comments).prop_map(|(mut case, on, comments)| {
            if on {
                for (s, c) in case.members.iter_mut().zip(comments) {
                    if let Some(c) = c {
                        s.text = format!("{} comment:{c}", s.text);
                        let comment = ipsetmgr_ipset::Comment::parse(&c).expect("generated");
                        s.member = s.member.clone().with_comment(comment);
                    }
                }
                case.header.options.comment = true;
            }
            case
        })
    })
}

fn hash_case<S>(t: SetType, member: fn(Family) -> S) -> impl Strategy<Value = Case>
where
    S: Strategy<Value = Spelled> + 'static,
{
    family().prop_flat_map(move |f| {
        prop::collection::vec(member(f), 0..24).prop_map(move |members| {
            let kind = SetKind::new(t, Some(f));
            Case {
                kind,
                header: SetHeader {
                    kind,
                    max_elem: 1024,
                    hash_size: None,
                    options: HeaderOptions::default(),
                },
                members,
            }
        })
    })
}

/// A case of any new type; `with_mark` adds hash:ip,mark.
fn any_case(with_mark: bool) -> BoxedStrategy<Case> {
    let mut cases = vec![
        hash_case(SetType::HashNetPort, net_port).boxed(),
        hash_case(SetType::HashIpPortIp, ip_port_ip).boxed(),
        hash_case(SetType::HashIpPortNet, ip_port_net).boxed(),
        hash_case(SetType::HashNetIface, net_iface).boxed(),
        bitmap_ip().boxed(),
        bitmap_port().boxed(),
    ];
    if with_mark {
        cases.push(hash_case(SetType::HashIpMark, ip_mark).boxed());
    }
    with_comments(prop::strategy::Union::new(cases)).boxed()
}

// ---- checks ----------------------------------------------------------------

/// Each spelling means its member, and each rendering reads back as it.
fn check_parsing(case: &Case) -> Result<(), String> {
    let t = case.kind.set_type;
    for s in &case.members {
        let parsed = Member::parse_user(t, &s.text).map_err(|e| format!("{:?}: {e}", s.text))?;
        let got: Vec<&Member> = parsed.members.iter().collect();
        if got != [&s.member] || parsed.family != case.kind.family {
            return Err(format!(
                "{:?} parsed as {got:?}, not {:?}",
                s.text, s.member
            ));
        }
        let shown = s.member.to_string();
        let back = Member::parse_kernel(t, &shown).map_err(|e| format!("{shown:?}: {e}"))?;
        if back != s.member {
            return Err(format!("{shown:?} read back as {back:?}"));
        }
    }
    Ok(())
}

/// The members the kernel will hold: one per key (a later member with
/// the same key, another nomatch flag or comment, replaces an earlier
/// one, as `add -exist` does).
fn expected(case: &Case) -> MemberSet {
    let mut by_key = std::collections::HashMap::new();
    for s in &case.members {
        by_key.insert(s.member.key(), s.member.clone());
    }
    MemberSet::from_members(case.kind, by_key.into_values())
}

/// `ipset list NAME`'s member lines, sorted.
fn listed(name: &str) -> Result<Vec<String>, String> {
    let out = Command::new("ipset")
        .args(["list", name])
        .output()
        .map_err(|e| format!("ipset: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).map_err(|e| e.to_string())?;
    Ok(kernel_props::listed_members(&text))
}

fn check_kernel(dp: &mut dyn Dataplane, case: &Case, name: &str) -> Result<(), String> {
    let want = expected(case);
    dp.apply(&[
        Op::Create {
            set: name,
            header: &case.header,
        },
        Op::Add {
            set: name,
            members: &want,
        },
    ])
    .map_err(|e| format!("{} backend: {e}", dp.name()))?;
    let result = (|| {
        let mut rendered: Vec<String> = want.iter().map(|m| m.to_string()).collect();
        rendered.sort();
        let lines = listed(name)?;
        if lines != rendered {
            return Err(format!("ipset lists {lines:?}, we render {rendered:?}"));
        }
        for line in &lines {
            let m = Member::parse_kernel(case.kind.set_type, line)
                .map_err(|e| format!("listed {line:?}: {e}"))?;
            if !want.contains(&m) {
                return Err(format!("listed {line:?} reads as {m:?}, not a member"));
            }
        }
        let read = dp
            .read_set(name)
            .map_err(|e| e.to_string())?
            .ok_or("the set is gone")?;
        let header = read.header.ok_or("no header read back")?;
        if !case.header.compatible_with(&header) || read.unparsable_members != 0 {
            return Err(format!(
                "read back {header:?}, {} unparsable",
                read.unparsable_members
            ));
        }
        if read.members.as_ref() != Some(&want) {
            return Err(format!(
                "read back {:?}",
                read.members.map(|m| m.sorted_strings())
            ));
        }
        Ok(())
    })();
    dp.apply(&[Op::Destroy { set: name }])
        .map_err(|e| format!("destroy: {e}"))?;
    result
}

// ---- running ---------------------------------------------------------------

/// 64 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> Config {
    kernel_props::config(64)
}

fn run(label: &str, strategy: BoxedStrategy<Case>, test: impl Fn(&Case) -> Result<(), String>) {
    let config = config();
    let seed = config.rng_seed;
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, |c| test(&c).map_err(TestCaseError::fail)) {
        Ok(()) => {}
        Err(TestError::Fail(why, minimal)) => panic!(
            "{label}: {why}\nminimal failing input:\n{minimal:?}\n(rerun with PROPTEST_RNG_SEED={seed})"
        ),
        Err(e) => panic!("{label}: {e}"),
    }
}

#[test]
fn spellings_parse_to_their_members_and_renderings_read_back() {
    run("parsing", any_case(true), check_parsing);
}

/// The kernel round trip for one backend, in a fresh namespace.
fn kernel_round_trip(test: &'static str, backend: fn() -> Box<dyn Dataplane>) {
    let handle = std::thread::spawn(move || {
        if !kernel_gate::enter_fresh_netns(test) {
            return;
        }
        // The runner takes a `Fn`: the backend and the set counter are
        // borrowed per case.
        let dp = std::cell::RefCell::new(backend());
        let with_mark = dp.borrow_mut().supports(SetType::HashIpMark) == Some(true);
        let counter = std::cell::Cell::new(0u32);
        run(test, any_case(with_mark), |case| {
            check_parsing(case)?;
            counter.set(counter.get() + 1);
            let name = format!("ipm-prop{}", counter.get());
            check_kernel(&mut **dp.borrow_mut(), case, &name)
        });
    });
    if let Err(p) = handle.join() {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn cli_backend_round_trips_through_the_kernels_listing() {
    kernel_round_trip(
        "cli_backend_round_trips_through_the_kernels_listing",
        || Box::new(CliDataplane::new()),
    );
}

#[test]
fn netlink_backend_round_trips_through_the_kernels_listing() {
    kernel_round_trip(
        "netlink_backend_round_trips_through_the_kernels_listing",
        || Box::new(NetlinkDataplane::new().expect("netlink backend")),
    );
}
