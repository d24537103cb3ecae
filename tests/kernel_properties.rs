//! Property tests against the real kernel: random policies of every type and
//! family the kernel supports (hash:ip, hash:net, hash:ip,port, list:set;
//! IPv4, IPv6 and Dual), compiled and applied twice with each backend
//! exactly as a one-shot `ipsetmgr apply` does.
//!
//! Per case, in a fresh (checked empty) network namespace:
//! 1. compile accepts every conflict-free policy, with as many members per
//!    set as the generator's own model of the input counts distinct;
//! 2. after the first apply the namespace holds exactly the compiled sets,
//!    each with exactly the tool's canonical members
//!    (`MemberSet::sorted_strings`) per `ipset save`;
//! 3. a second apply with a new manager and dataplane writes nothing and
//!    finds every set synced without problems, and the kernel is unchanged.
//!
//! Also asserted (kernel or not): a hash:net policy holding one network both
//! with and without `nomatch` is rejected by compile, naming both members.
//! The kernel keys hash:net entries by network alone, so it can hold only
//! one of them and every apply would flip the flag.
//!
//! Inputs are only spellings the tool accepts by design (IPv6 in any case,
//! with or without leading zeros in groups and `::`, dotted tails; `/32` and
//! `/128` on hosts; host bits set; bare ports; protocol and ICMP names in
//! any case), so rejecting a conflict-free policy is a failure too. Leading
//! zeros in ports, prefixes and ICMP codes are left out: `ipset` itself
//! reads `tcp:010` as port 8, so they are ambiguous rather than valid.
//!
//! Root is needed (the namespaces); without it the kernel tests print a skip
//! message, except under `CI=true`, where they fail. Cases:
//! `PROPTEST_CASES` (default 24); a failure prints the seed to rerun it with
//! `PROPTEST_RNG_SEED`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;

use ipsetmgr_dataplane::Dataplane;
use ipsetmgr_dataplane::cli::CliDataplane;
use ipsetmgr_dataplane::netlink::NetlinkDataplane;
use ipsetmgr_ipset::icmp::{ICMP_NAMES, ICMPV6_NAMES};
use ipsetmgr_ipset::{Family, Naming, SetType};
use ipsetmgr_policy::{
    Compiled, DesiredSet, FamilySpec, IPSetPolicy, IPSetPolicySpec, PolicyError, compile,
};
use ipsetmgr_sets::{ApplyOutcome, ReconcilerConfig, SetReport};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

#[path = "common/kernel_props.rs"]
mod kernel_props;

const SKIP: &str = "skipped: needs root (kernel tests run in a fresh network namespace)";

// ---- the model -------------------------------------------------------------

/// What one kernel entry is, computed by the generator from the numbers it
/// spelled (never by the parser under test). `extra` is the prefix for
/// hash:net, `proto << 16 | port` for hash:ip,port, 0 for hash:ip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    v6: bool,
    addr: u128,
    extra: u32,
}

/// One member as a user writes it, with the kernel entries it stands for
/// (two for a `/0`, which is stored as two `/1` halves).
#[derive(Clone, Debug)]
struct GenMember {
    text: String,
    keys: Vec<Key>,
    nomatch: bool,
}

#[derive(Clone)]
struct GenPolicy {
    set_type: SetType,
    family: FamilySpec,
    members: Vec<GenMember>,
    max_elem: Option<u32>,
    hash_size: Option<u32>,
}

/// The list:set of a case: its family and which of the case's policies it
/// would like to list (only those that can be listed are).
#[derive(Clone, Debug)]
struct GenList {
    family: FamilySpec,
    wants: Vec<bool>,
}

#[derive(Clone)]
struct Case {
    policies: Vec<GenPolicy>,
    list: Option<GenList>,
}

fn policy_name(i: usize) -> String {
    format!("p{i}")
}

const LIST_NAME: &str = "lst";

impl GenPolicy {
    /// Networks held both with and without nomatch: (plain spelling,
    /// nomatch spelling) of each, as the user wrote them.
    fn nomatch_conflicts(&self) -> Vec<(Key, Vec<String>, Vec<String>)> {
        if self.set_type != SetType::HashNet {
            return Vec::new();
        }
        let mut by_key: BTreeMap<Key, (Vec<String>, Vec<String>)> = BTreeMap::new();
        for m in &self.members {
            for k in &m.keys {
                let e = by_key.entry(*k).or_default();
                let side = if m.nomatch { &mut e.1 } else { &mut e.0 };
                if !side.contains(&m.text) {
                    side.push(m.text.clone());
                }
            }
        }
        by_key
            .into_iter()
            .filter(|(_, (plain, nm))| !plain.is_empty() && !nm.is_empty())
            .map(|(k, (plain, nm))| (k, plain, nm))
            .collect()
    }

    /// Distinct kernel entries of the set for `family`.
    fn expected_len(&self, family: Option<Family>) -> usize {
        let v6 = family == Some(Family::V6);
        let distinct: BTreeSet<(Key, bool)> = self
            .members
            .iter()
            .flat_map(|m| m.keys.iter().map(|k| (*k, m.nomatch)))
            .filter(|(k, _)| k.v6 == v6)
            .collect();
        distinct.len()
    }

    fn families(&self) -> Vec<Family> {
        match self.family {
            FamilySpec::IPv4 => vec![Family::V4],
            FamilySpec::IPv6 => vec![Family::V6],
            FamilySpec::Dual => vec![Family::V4, Family::V6],
        }
    }

    fn to_policy(&self, name: &str) -> IPSetPolicy {
        IPSetPolicy::new(
            name,
            IPSetPolicySpec {
                max_elem: self.max_elem,
                hash_size: self.hash_size,
                ..IPSetPolicySpec::new(
                    self.set_type,
                    self.family,
                    self.members.iter().map(|m| m.text.clone()).collect(),
                )
            },
        )
    }
}

impl Case {
    /// The policies the list:set lists: conflict-free ones (a rejected
    /// policy has no kernel set to list) whose families cover the list's.
    fn listed(&self) -> Vec<String> {
        let Some(list) = &self.list else {
            return Vec::new();
        };
        let needs: &[FamilySpec] = match list.family {
            FamilySpec::IPv4 => &[FamilySpec::IPv4, FamilySpec::Dual],
            FamilySpec::IPv6 => &[FamilySpec::IPv6, FamilySpec::Dual],
            FamilySpec::Dual => &[FamilySpec::Dual],
        };
        self.policies
            .iter()
            .enumerate()
            .filter(|(i, p)| {
                list.wants.get(*i).copied().unwrap_or(false)
                    && needs.contains(&p.family)
                    && p.nomatch_conflicts().is_empty()
            })
            .map(|(i, _)| policy_name(i))
            .collect()
    }

    fn to_policies(&self) -> Vec<IPSetPolicy> {
        let mut out: Vec<IPSetPolicy> = self
            .policies
            .iter()
            .enumerate()
            .map(|(i, p)| p.to_policy(&policy_name(i)))
            .collect();
        if let Some(list) = &self.list {
            out.push(IPSetPolicy::new(
                LIST_NAME,
                IPSetPolicySpec::new(SetType::ListSet, list.family, self.listed()),
            ));
        }
        out
    }
}

/// Failing inputs are printed like policy files, not as nested structs.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for p in self.to_policies() {
            let s = &p.spec;
            writeln!(
                f,
                "{}: {} {:?} maxElem {:?} hashSize {:?} members {:?}",
                p.metadata.name.as_deref().unwrap_or(""),
                s.set_type,
                s.family,
                s.max_elem,
                s.hash_size,
                s.members
            )?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for GenPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let texts: Vec<&str> = self.members.iter().map(|m| m.text.as_str()).collect();
        write!(f, "{} {:?} {texts:?}", self.set_type, self.family)
    }
}

// ---- spellings -------------------------------------------------------------

fn mask(addr: u128, prefix: u8, v6: bool) -> u128 {
    let width = if v6 { 128 } else { 32 };
    if prefix == 0 {
        0
    } else {
        let all = if v6 { u128::MAX } else { u32::MAX as u128 };
        addr & (all << (width - prefix as u32)) & all
    }
}

fn addr_text(v6: bool, addr: u128, style: u32) -> String {
    let text = if v6 {
        v6_text(addr, style)
    } else {
        Ipv4Addr::from(addr as u32).to_string()
    };
    // The reference for what a valid spelling is: the standard parser.
    if v6 {
        assert_eq!(text.parse::<Ipv6Addr>().map(u128::from), Ok(addr), "{text}");
    }
    text
}

/// An IPv6 spelling chosen by the bits of `style` (0: lower case, no
/// padding, the longest zero run compressed, no dotted tail): upper case,
/// leading zeros in all or some groups, no `::` or `::` over the first or
/// last zero run (even a single zero group), an IPv4 dotted tail.
fn v6_text(addr: u128, style: u32) -> String {
    let g = Ipv6Addr::from(addr).segments();
    let upper = style & 1 != 0;
    let pad = (style >> 1) & 3;
    let compress = (style >> 3) & 3;
    let want_dotted = style & (1 << 5) != 0;
    let pad_groups = style >> 8;

    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < 8 {
        if g[i] == 0 {
            let start = i;
            while i < 8 && g[i] == 0 {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    let run = match compress {
        0 => runs
            .iter()
            .copied()
            .max_by_key(|&(start, len)| (len, std::cmp::Reverse(start))),
        1 => None,
        2 => runs.first().copied(),
        _ => runs.last().copied(),
    };
    // A dotted tail stands for the last two groups, so they must be spelled.
    let dotted = want_dotted && run.is_none_or(|(start, len)| start + len <= 6);
    let groups = if dotted { 6 } else { 8 };
    let group = |i: usize| -> String {
        let w = match pad {
            1 => 4,
            2 if pad_groups >> i & 1 == 1 => 4,
            _ => 0,
        };
        if upper {
            format!("{:0w$X}", g[i])
        } else {
            format!("{:0w$x}", g[i])
        }
    };
    let join = |r: std::ops::Range<usize>| r.map(group).collect::<Vec<_>>().join(":");
    let mut out = match run {
        Some((start, len)) => format!("{}::{}", join(0..start), join(start + len..groups)),
        None => join(0..groups),
    };
    if dotted {
        if !out.ends_with(':') {
            out.push(':');
        }
        out.push_str(&Ipv4Addr::from(addr as u32).to_string());
    }
    out
}

// ---- generators ------------------------------------------------------------
//
// No `prop_flat_map`: what depends on the family or the set type is drawn
// for every choice and picked afterwards, so that shrinking works on every
// part at once (a flat map re-draws its inner values whenever it simplifies
// the outer one) and failing inputs shrink to short, plain spellings.

fn v4_value() -> impl Strategy<Value = u128> {
    prop_oneof![
        4 => any::<u32>(),
        2 => (0u32..=0xff).prop_map(|x| 0x0a00_0000 | x),
        2 => (0u32..=0xffff).prop_map(|x| 0xc0a8_0000 | x),
        1 => Just(0u32),
        1 => Just(u32::MAX),
    ]
    .prop_map(u128::from)
}

fn v6_value() -> impl Strategy<Value = u128> {
    prop_oneof![
        2 => any::<u128>(),
        // Zero groups here and there: every kind of `::` placement.
        4 => prop::array::uniform8((any::<bool>(), any::<u16>())).prop_map(|gs| {
            let g = gs.map(|(zero, v)| if zero { 0 } else { v });
            u128::from(Ipv6Addr::from(g))
        }),
        // ::ffff:a.b.c.d (IPv4-mapped) and ::a.b.c.d (IPv4-compatible),
        // which inet_ntop prints dotted; ::ffff:0:a.b.c.d, which it does not.
        2 => any::<u32>().prop_map(|v| 0xffff_0000_0000 | v as u128),
        2 => any::<u32>().prop_map(|v| v as u128),
        2 => any::<u32>().prop_map(|v| 0xffff_0000_0000_0000 | v as u128),
        2 => 1u128..=0xffff,
        1 => any::<u32>().prop_map(|v| (0x64_ff9b_u128 << 96) | v as u128),
        1 => any::<u64>().prop_map(|v| (0xfe80_u128 << 112) | v as u128),
        1 => Just(0u128),
        1 => Just(u128::MAX),
    ]
}

/// An address of either family; [`Addr::pick`] chooses by the policy's.
#[derive(Clone, Copy, Debug)]
struct Addr {
    v4: u128,
    v6: u128,
    /// In a Dual policy: take the IPv6 one.
    dual_v6: bool,
}

impl Addr {
    /// (is IPv6, value) for a member of a policy of `family`.
    fn pick(self, family: FamilySpec) -> (bool, u128) {
        let v6 = match family {
            FamilySpec::IPv4 => false,
            FamilySpec::IPv6 => true,
            FamilySpec::Dual => self.dual_v6,
        };
        (v6, if v6 { self.v6 } else { self.v4 })
    }
}

fn addr() -> impl Strategy<Value = Addr> {
    (v4_value(), v6_value(), any::<bool>()).prop_map(|(v4, v6, dual_v6)| Addr { v4, v6, dual_v6 })
}

/// hash:ip and hash:ip,port cannot hold the all-zero address (documented).
fn non_null(a: u128) -> u128 {
    if a == 0 { 1 } else { a }
}

fn host_suffix(v6: bool) -> &'static str {
    if v6 { "/128" } else { "/32" }
}

/// A hash:ip member before its family is known.
#[derive(Clone, Debug)]
struct RawIp {
    addr: Addr,
    style: u32,
    suffix: bool,
}

impl RawIp {
    fn member(&self, family: FamilySpec) -> GenMember {
        let (v6, a) = self.addr.pick(family);
        let a = non_null(a);
        let mut text = addr_text(v6, a, self.style);
        if self.suffix {
            text.push_str(host_suffix(v6));
        }
        GenMember {
            text,
            keys: vec![Key {
                v6,
                addr: a,
                extra: 0,
            }],
            nomatch: false,
        }
    }
}

fn raw_ip() -> impl Strategy<Value = RawIp> {
    (addr(), any::<u32>(), any::<bool>()).prop_map(|(addr, style, suffix)| RawIp {
        addr,
        style,
        suffix,
    })
}

/// A prefix length before the family is known.
#[derive(Clone, Copy, Debug)]
enum PrefixSel {
    Zero,
    One,
    Host,
    Any(u8),
    NearHost(u8),
}

impl PrefixSel {
    fn prefix(self, v6: bool) -> u8 {
        let max = if v6 { 128u8 } else { 32 };
        match self {
            PrefixSel::Zero => 0,
            PrefixSel::One => 1,
            PrefixSel::Host => max,
            PrefixSel::Any(p) => p % (max + 1),
            PrefixSel::NearHost(d) => max - d % 9,
        }
    }
}

fn prefix_sel() -> impl Strategy<Value = PrefixSel> {
    prop_oneof![
        Just(PrefixSel::Zero),
        Just(PrefixSel::One),
        Just(PrefixSel::Host),
        any::<u8>().prop_map(PrefixSel::Any),
        any::<u8>().prop_map(PrefixSel::NearHost),
    ]
}

/// One network.
#[derive(Clone, Copy, Debug)]
struct Net {
    v6: bool,
    addr: u128,
    prefix: u8,
}

impl Net {
    fn new(addr: Addr, prefix: PrefixSel, family: FamilySpec) -> Net {
        let (v6, addr) = addr.pick(family);
        Net {
            v6,
            addr,
            prefix: prefix.prefix(v6),
        }
    }

    fn keys(self) -> Vec<Key> {
        let key = |addr, prefix: u8| Key {
            v6: self.v6,
            addr,
            extra: prefix as u32,
        };
        if self.prefix == 0 {
            let upper = if self.v6 { 1u128 << 127 } else { 1u128 << 31 };
            vec![key(0, 1), key(upper, 1)]
        } else {
            vec![key(mask(self.addr, self.prefix, self.v6), self.prefix)]
        }
    }

    /// A spelling of this network: `host` replaces the host bits (so two
    /// spellings of one network differ), `bare` drops a host prefix.
    fn spell(self, sp: &Spelling, nomatch: bool) -> GenMember {
        let max = if self.v6 { 128 } else { 32 };
        let all = if self.v6 { u128::MAX } else { u32::MAX as u128 };
        let host_bits = sp.host & all & !mask(all, self.prefix, self.v6);
        let addr = mask(self.addr, self.prefix, self.v6) | host_bits;
        let mut text = addr_text(self.v6, addr, sp.style);
        if !(sp.bare && self.prefix == max) {
            text.push_str(&format!("/{}", self.prefix));
        }
        if nomatch {
            text.push_str(" nomatch");
        }
        GenMember {
            text,
            keys: self.keys(),
            nomatch,
        }
    }
}

/// How one network is written: host bits, address style, bare host.
#[derive(Clone, Debug)]
struct Spelling {
    host: u128,
    style: u32,
    bare: bool,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (any::<u128>(), any::<u32>(), any::<bool>()).prop_map(|(host, style, bare)| Spelling {
        host,
        style,
        bare,
    })
}

/// One network in one to three spellings ("mixed forms of the same
/// network", e.g. `10.1.2.3/8` next to `10.0.0.0/8`), all with one nomatch
/// flag, unless `conflict`: then the last has the other flag, the
/// known-defective case.
#[derive(Clone, Debug)]
struct RawNetGroup {
    addr: Addr,
    prefix: PrefixSel,
    spellings: Vec<Spelling>,
    nomatch: bool,
    conflict: bool,
}

impl RawNetGroup {
    fn members(&self, family: FamilySpec) -> Vec<GenMember> {
        let net = Net::new(self.addr, self.prefix, family);
        let last = self.spellings.len() - 1;
        self.spellings
            .iter()
            .enumerate()
            .map(|(i, sp)| {
                let flip = self.conflict && i == last && last > 0;
                net.spell(sp, self.nomatch != flip)
            })
            .collect()
    }
}

/// `conflict_odds`: the probability that a group carries a conflict.
fn raw_net_group(conflict_odds: f64) -> impl Strategy<Value = RawNetGroup> {
    (
        addr(),
        prefix_sel(),
        prop::collection::vec(spelling(), 1..=3),
        prop::bool::weighted(0.25),
        prop::bool::weighted(conflict_odds),
    )
        .prop_map(|(addr, prefix, spellings, nomatch, conflict)| RawNetGroup {
            addr,
            prefix,
            spellings,
            nomatch,
            conflict,
        })
}

fn net_members(groups: &[RawNetGroup], family: FamilySpec) -> Vec<GenMember> {
    let mut all: Vec<GenMember> = groups.iter().flat_map(|g| g.members(family)).collect();
    all.truncate(40);
    all
}

/// The "PROTO:PORT" part of a hash:ip,port member before the family is
/// known (ICMP becomes ICMPv6 for IPv6 addresses).
#[derive(Clone, Debug)]
enum RawPort {
    Transport {
        proto: usize,
        port: u16,
        upper: bool,
    },
    /// A bare port is TCP.
    Bare(u16),
    IcmpName {
        spelling: usize,
        name: usize,
        upper: bool,
    },
    IcmpCode {
        spelling: usize,
        t: u8,
        c: u8,
    },
}

const TRANSPORTS: [(&str, u8); 4] = [("tcp", 6), ("udp", 17), ("sctp", 132), ("udplite", 136)];

impl RawPort {
    /// (protocol number, port or ICMP type << 8 | code, text).
    fn render(&self, v6: bool) -> (u8, u16, String) {
        let (table, spellings, num): (_, &[&str], u8) = if v6 {
            (ICMPV6_NAMES, &["icmpv6", "ipv6-icmp", "ICMPv6"], 58)
        } else {
            (ICMP_NAMES, &["icmp", "ICMP"], 1)
        };
        match *self {
            RawPort::Transport { proto, port, upper } => {
                let (name, n) = TRANSPORTS[proto % TRANSPORTS.len()];
                let name = if upper {
                    name.to_ascii_uppercase()
                } else {
                    name.to_string()
                };
                (n, port, format!("{name}:{port}"))
            }
            RawPort::Bare(port) => (6, port, port.to_string()),
            RawPort::IcmpName {
                spelling,
                name,
                upper,
            } => {
                let (n, t, c) = table[name % table.len()];
                let n = if upper {
                    n.to_ascii_uppercase()
                } else {
                    n.to_string()
                };
                let p = spellings[spelling % spellings.len()];
                (num, (t as u16) << 8 | c as u16, format!("{p}:{n}"))
            }
            RawPort::IcmpCode { spelling, t, c } => {
                let p = spellings[spelling % spellings.len()];
                (num, (t as u16) << 8 | c as u16, format!("{p}:{t}/{c}"))
            }
        }
    }
}

fn raw_port() -> impl Strategy<Value = RawPort> {
    let port = || prop_oneof![Just(0u16), Just(65535u16), 0u16..=1023, any::<u16>()];
    prop_oneof![
        3 => (any::<usize>(), port(), any::<bool>())
            .prop_map(|(proto, port, upper)| RawPort::Transport { proto, port, upper }),
        1 => port().prop_map(RawPort::Bare),
        1 => (any::<usize>(), any::<usize>(), any::<bool>())
            .prop_map(|(spelling, name, upper)| RawPort::IcmpName { spelling, name, upper }),
        1 => (any::<usize>(), any::<u8>(), any::<u8>())
            .prop_map(|(spelling, t, c)| RawPort::IcmpCode { spelling, t, c }),
    ]
}

/// A hash:ip,port member before its family is known.
#[derive(Clone, Debug)]
struct RawIpPort {
    ip: RawIp,
    port: RawPort,
}

impl RawIpPort {
    fn member(&self, family: FamilySpec) -> GenMember {
        let ip = self.ip.member(family);
        let key = ip.keys[0];
        let (proto, port, port_text) = self.port.render(key.v6);
        GenMember {
            text: format!("{},{port_text}", ip.text),
            keys: vec![Key {
                extra: (proto as u32) << 16 | port as u32,
                ..key
            }],
            nomatch: false,
        }
    }
}

fn raw_ip_port() -> impl Strategy<Value = RawIpPort> {
    (
        (addr(), any::<u32>(), prop::bool::weighted(0.2)).prop_map(|(addr, style, suffix)| RawIp {
            addr,
            style,
            suffix,
        }),
        raw_port(),
    )
        .prop_map(|(ip, port)| RawIpPort { ip, port })
}

fn family_spec() -> impl Strategy<Value = FamilySpec> {
    prop_oneof![
        Just(FamilySpec::IPv4),
        Just(FamilySpec::IPv6),
        Just(FamilySpec::Dual),
    ]
}

/// maxElem (never below what a policy can hold: 40 members, 80 entries
/// with /0 halves) and hashSize, mostly unset.
fn limits() -> impl Strategy<Value = (Option<u32>, Option<u32>)> {
    (
        prop_oneof![3 => Just(None), 1 => (128u32..=1_000_000).prop_map(Some)],
        prop_oneof![3 => Just(None), 1 => (64u32..=65536).prop_map(Some)],
    )
}

fn policy_of(
    set_type: SetType,
    family: FamilySpec,
    members: Vec<GenMember>,
    (max_elem, hash_size): (Option<u32>, Option<u32>),
) -> GenPolicy {
    GenPolicy {
        set_type,
        family,
        members,
        max_elem,
        hash_size,
    }
}

/// One hash policy of any type; `conflict_odds` per hash:net network group.
fn gen_policy(conflict_odds: f64) -> impl Strategy<Value = GenPolicy> {
    prop_oneof![
        (
            family_spec(),
            prop::collection::vec(raw_ip(), 0..=40),
            limits()
        )
            .prop_map(|(family, raw, limits)| {
                let members = raw.iter().map(|r| r.member(family)).collect();
                policy_of(SetType::HashIp, family, members, limits)
            }),
        (
            family_spec(),
            prop::collection::vec(raw_net_group(conflict_odds), 0..=16),
            limits()
        )
            .prop_map(|(family, groups, limits)| {
                let members = net_members(&groups, family);
                policy_of(SetType::HashNet, family, members, limits)
            }),
        (
            family_spec(),
            prop::collection::vec(raw_ip_port(), 0..=40),
            limits()
        )
            .prop_map(|(family, raw, limits)| {
                let members = raw.iter().map(|r| r.member(family)).collect();
                policy_of(SetType::HashIpPort, family, members, limits)
            }),
    ]
}

/// A few policies and, mostly, a list:set of some of them. About one
/// hash:net network group in 30 carries a nomatch conflict.
fn gen_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(gen_policy(1.0 / 30.0), 1..=4),
        prop::option::weighted(
            0.75,
            (family_spec(), prop::collection::vec(any::<bool>(), 4))
                .prop_map(|(family, wants)| GenList { family, wants }),
        ),
    )
        .prop_map(|(policies, list)| Case { policies, list })
}

// ---- checks ----------------------------------------------------------------

/// Whether `text` mentions the member `raw` as a whole token (not as part of
/// a longer address, and a plain member not as the head of its nomatch form).
fn names_member(text: &str, raw: &str) -> bool {
    let token = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '/');
    text.match_indices(raw).any(|(i, _)| {
        let before_ok = text[..i].chars().next_back().is_none_or(|c| !token(c));
        let after = &text[i + raw.len()..];
        let after_ok = after.chars().next().is_none_or(|c| !token(c))
            && (raw.ends_with(" nomatch") || !after.starts_with(" nomatch"));
        before_ok && after_ok
    })
}

/// The nomatch rule: a conflicting hash:net policy is rejected, and one of
/// its errors names a plain and a nomatch spelling of one network.
fn check_nomatch_rule(name: &str, p: &GenPolicy, compiled: &Compiled) -> Result<(), String> {
    let conflicts = p.nomatch_conflicts();
    if conflicts.is_empty() {
        return Ok(());
    }
    let mut pairs: Vec<String> = conflicts
        .iter()
        .map(|(_, plain, nm)| format!("{:?} / {:?}", plain[0], nm[0]))
        .collect();
    // The two /1 halves of a /0 conflict through the same pair of members.
    pairs.sort();
    pairs.dedup();
    let sets: Vec<&str> = compiled
        .sets
        .iter()
        .filter(|s| s.policy == name)
        .map(|s| s.name.as_str())
        .collect();
    let errors: Vec<String> = compiled
        .errors
        .iter()
        .filter(|e| e.policy == name)
        .map(PolicyError::to_string)
        .collect();
    if !sets.is_empty() || errors.is_empty() {
        return Err(format!(
            "hash:net policy {name} holds the same network with and without nomatch \
             ({}) but compile accepted it (sets {sets:?}); the kernel keeps one entry \
             per network, so every apply would flip its nomatch flag",
            pairs.join(", ")
        ));
    }
    let named = conflicts.iter().any(|(_, plain, nm)| {
        errors.iter().any(|e| {
            plain.iter().any(|a| names_member(e, a)) && nm.iter().any(|b| names_member(e, b))
        })
    });
    if !named {
        return Err(format!(
            "policy {name} was rejected for a nomatch conflict ({}), but no error \
             names both members as written: {errors:?}",
            pairs.join(", ")
        ));
    }
    Ok(())
}

/// Compile-time checks: the nomatch rule, every conflict-free policy
/// accepted, and as many members per set as the model counts.
fn check_compiled(case: &Case, compiled: &Compiled) -> Result<(), String> {
    for (i, p) in case.policies.iter().enumerate() {
        check_nomatch_rule(&policy_name(i), p, compiled)?;
    }
    let rejected: Vec<String> = compiled
        .errors
        .iter()
        .filter(|e| {
            let conflicted = case
                .policies
                .iter()
                .enumerate()
                .any(|(i, p)| policy_name(i) == e.policy && !p.nomatch_conflicts().is_empty());
            !conflicted
        })
        .map(PolicyError::to_string)
        .collect();
    if !rejected.is_empty() {
        return Err(format!("compile rejected valid input: {rejected:?}"));
    }
    for s in &compiled.sets {
        let expected = if s.policy == LIST_NAME {
            case.listed().len()
        } else {
            let i: usize = s.policy[1..].parse().expect("policy index");
            let p = &case.policies[i];
            if !p
                .families()
                .iter()
                .any(|f| s.header.kind.family == Some(*f))
            {
                return Err(format!("{}: unexpected family {:?}", s.name, s.header));
            }
            p.expected_len(s.header.kind.family)
        };
        if s.members.len() != expected {
            return Err(format!(
                "{}: compiled {} members, the input has {expected} distinct entries: {:?}",
                s.name,
                s.members.len(),
                s.members.sorted_strings()
            ));
        }
    }
    Ok(())
}

/// Run the `ipset` tool in the thread's namespace (children inherit it).
fn ipset(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ipset")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ipset: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ipset {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("ipset {}: {e}", args.join(" ")))
}

/// Members of `set` per `ipset save`, sorted as strings.
fn kernel_members(set: &str) -> Result<Vec<String>, String> {
    let prefix = format!("add {set} ");
    let mut members: Vec<String> = ipset(&["save", set])?
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
        .collect();
    members.sort();
    Ok(members)
}

/// Every set in the namespace, sorted.
fn kernel_set_names() -> Result<Vec<String>, String> {
    let mut names: Vec<String> = ipset(&["list", "-n"])?
        .lines()
        .map(str::to_string)
        .collect();
    names.sort();
    Ok(names)
}

/// The namespace holds exactly `sets` (no temp set left behind), each with
/// exactly its canonical members.
fn check_kernel(sets: &[DesiredSet], when: &str) -> Result<(), String> {
    let mut names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
    names.sort();
    let kernel = kernel_set_names()?;
    if kernel != names {
        return Err(format!(
            "{when}: the kernel holds sets {kernel:?}, not {names:?}"
        ));
    }
    for s in sets {
        let mut want = s.members.sorted_strings();
        want.sort();
        let got = kernel_members(&s.name)?;
        if got != want {
            let missing: Vec<&String> = want.iter().filter(|m| !got.contains(m)).collect();
            let extra: Vec<&String> = got.iter().filter(|m| !want.contains(m)).collect();
            return Err(format!(
                "{when}: kernel set {} differs from the canonical members: \
                 canonical but not in `ipset save`: {missing:?}; \
                 in `ipset save` but not canonical: {extra:?}",
                s.name
            ));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Cli,
    Netlink,
}

impl Backend {
    fn open(self) -> Result<Box<dyn Dataplane>, String> {
        Ok(match self {
            Backend::Cli => Box::new(CliDataplane::new()),
            Backend::Netlink => {
                Box::new(NetlinkDataplane::new().map_err(|e| format!("netlink backend: {e}"))?)
            }
        })
    }
}

/// One apply as `ipsetmgr apply` without `--prune` runs it: a new manager
/// on a new dataplane, one `apply_updates`.
fn apply(backend: Backend, compiled: &Compiled) -> Result<(ApplyOutcome, Vec<SetReport>), String> {
    let config = ReconcilerConfig {
        prune: false,
        ..ReconcilerConfig::default()
    };
    let mut mgr = ipsetmgr_dataplane::adapter::reconciler(backend.open()?, config);
    mgr.set_desired(compiled.sets.clone(), compiled.held.clone());
    let outcome = mgr.apply_updates();
    Ok((outcome, mgr.report()))
}

fn check_case(backend: Backend, case: &Case) -> Result<(), String> {
    let policies = case.to_policies();
    let compiled = compile(&policies, &Naming::default(), None);
    check_compiled(case, &compiled)?;

    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare(CLONE_NEWNET): {e}"))?;
    let leftovers = kernel_set_names()?;
    if !leftovers.is_empty() {
        return Err(format!("the new namespace is not empty: {leftovers:?}"));
    }

    let (first, report) = apply(backend, &compiled)?;
    if !first.applied {
        return Err(format!("first apply failed: {:?}", first.error));
    }
    if let Some(r) = report.iter().find(|r| r.error.is_some() || !r.synced) {
        return Err(format!(
            "first apply: set {} not synced: {:?}",
            r.set.name, r.error
        ));
    }
    check_kernel(&compiled.sets, "after the first apply")?;

    let (second, report) = apply(backend, &compiled)?;
    let unsynced: Vec<(&str, usize, Option<String>)> = report
        .iter()
        .filter(|r| !r.synced || r.problems > 0 || r.error.is_some())
        .map(|r| {
            (
                r.set.name.as_str(),
                r.problems,
                r.error.as_ref().map(|e| e.to_string()),
            )
        })
        .collect();
    if !second.applied
        || !second.written.is_empty()
        || !second.deleted.is_empty()
        || !second.temp_deleted.is_empty()
        || !unsynced.is_empty()
    {
        let written: Vec<&str> = second
            .written
            .iter()
            .map(|(n, _)| n.name.as_str())
            .collect();
        return Err(format!(
            "second apply was not a no-op: applied {}, written {written:?}, \
             deleted {:?}, temp sets removed {:?}, (set, problems, error) {unsynced:?}",
            second.applied, second.deleted, second.temp_deleted
        ));
    }
    check_kernel(&compiled.sets, "after the second apply")
}

// ---- running ---------------------------------------------------------------

/// Skip without root or namespaces, but never silently under CI.
fn skip(why: &str) {
    let msg = format!("{SKIP}{why}");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg}");
    }
    eprintln!("{msg}");
}

/// The shared configuration; shrink steps are bounded because each kernel
/// step costs a namespace and two applies.
fn config() -> Config {
    Config {
        max_shrink_iters: 2048,
        ..kernel_props::config(24)
    }
}

fn run_property<S: Strategy>(
    label: &str,
    strategy: S,
    test: impl Fn(&S::Value) -> Result<(), String>,
) where
    S::Value: std::fmt::Debug,
{
    let config = config();
    let seed = config.rng_seed;
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, |v| test(&v).map_err(TestCaseError::fail)) {
        Ok(()) => eprintln!("{label}: {cases} cases passed"),
        Err(TestError::Fail(why, minimal)) => panic!(
            "{label}: {why}\nminimal failing input:\n{minimal:?}\n\
             (rerun with PROPTEST_RNG_SEED={seed})"
        ),
        Err(e) => panic!("{label}: {e}"),
    }
}

/// Runs the kernel property for one backend on a thread of its own: each
/// case moves that thread into a fresh network namespace.
fn kernel_property(backend: Backend) {
    let handle = std::thread::spawn(move || {
        if !nix::unistd::geteuid().is_root() {
            return skip("");
        }
        if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
            return skip(&format!(" (unshare failed: {e})"));
        }
        run_property(&format!("{backend:?} backend"), gen_case(), |case| {
            check_case(backend, case)
        });
    });
    if let Err(p) = handle.join() {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn cli_backend_applies_random_policies_exactly_and_idempotently() {
    kernel_property(Backend::Cli);
}

#[test]
fn netlink_backend_applies_random_policies_exactly_and_idempotently() {
    kernel_property(Backend::Netlink);
}

/// A hash:net policy with at least one network both with and without
/// nomatch (in any spellings), among other members. Compile only: no root.
fn conflicting_policy() -> impl Strategy<Value = GenPolicy> {
    (
        family_spec(),
        prop::collection::vec(raw_net_group(0.0), 0..=12),
        (addr(), prefix_sel(), spelling(), spelling()),
        any::<bool>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(
            |(family, groups, (a, prefix, plain, nm), plain_first, at)| {
                let mut members = net_members(&groups, family);
                members.truncate(38);
                let net = Net::new(a, prefix, family);
                let (plain, nm) = (net.spell(&plain, false), net.spell(&nm, true));
                let pair = if plain_first {
                    [plain, nm]
                } else {
                    [nm, plain]
                };
                let at = at.index(members.len() + 1);
                members.splice(at..at, pair);
                policy_of(SetType::HashNet, family, members, (None, None))
            },
        )
}

#[test]
fn nomatch_conflicts_are_rejected_by_compile() {
    run_property(
        "nomatch conflicts",
        conflicting_policy(),
        |p: &GenPolicy| {
            let compiled = compile([&p.to_policy("p0")], &Naming::default(), None);
            check_nomatch_rule("p0", p, &compiled)
        },
    );
}

#[test]
fn the_generators_spell_what_they_mean() {
    // The helpers the properties rest on, on known answers.
    assert_eq!(v6_text(1, 0), "::1");
    assert_eq!(v6_text(0xffff_0102_0304, 1 << 5), "::ffff:1.2.3.4");
    assert_eq!(v6_text(0x0102_0304, 1 << 5), "::1.2.3.4");
    assert_eq!(v6_text(0x2001_0db8 << 96 | 1, 1 | 2), "2001:0DB8::0001");
    assert_eq!(
        v6_text(0x2001_0db8 << 96 | 1, 1 << 3),
        "2001:db8:0:0:0:0:0:1"
    );
    let two_runs = 1u128 << 96 | 1; // 0:1:0:0:0:0:0:1
    assert_eq!(v6_text(two_runs, 2 << 3), "::1:0:0:0:0:0:1");
    assert_eq!(v6_text(two_runs, 3 << 3), "0:1::1");
    let n = Net {
        v6: false,
        addr: 0x0a01_0203,
        prefix: 8,
    };
    let sp = |host| Spelling {
        host,
        style: 0,
        bare: false,
    };
    assert_eq!(n.spell(&sp(0), false).text, "10.0.0.0/8");
    assert_eq!(n.spell(&sp(0x0102_0304), true).text, "10.2.3.4/8 nomatch");
    let zero = Net {
        v6: false,
        addr: 5,
        prefix: 0,
    };
    assert_eq!(zero.spell(&sp(5), false).text, "0.0.0.5/0");
    assert_eq!(zero.keys().len(), 2);
    assert!(names_member(
        "member \"10.0.0.0/8\" conflicts",
        "10.0.0.0/8"
    ));
    assert!(!names_member("member \"110.0.0.0/8\"", "10.0.0.0/8"));
    assert!(!names_member("member \"10.0.0.0/8 nomatch\"", "10.0.0.0/8"));
    assert!(names_member(
        "member \"10.0.0.0/8 nomatch\"",
        "10.0.0.0/8 nomatch"
    ));
}
