//! hash:net,iface against the kernel (issue 30.2): for random member lists
//! of nested and overlapping networks over two or three interfaces, some
//! `nomatch`, the nft interval set this crate makes from the members
//! matches exactly the (address, interface) pairs the kernel's ipset
//! matches.
//!
//! The kernel's rule for this type (docs/nftables.md, "nomatch and
//! overlaps"): the most specific network holding the address decides,
//! whatever its interface; the pair matches only when that network is
//! there for this interface too, without `nomatch`. So `10.2.0.1,eth0` is
//! out with `10.0.0.0/8,eth0` and `10.2.0.0/16,vlan0`.
//!
//! Modelled on `nomatch_kernel.rs`. Per case, in a fresh network namespace
//! (the test's thread calls `unshare(CLONE_NEWNET)` again for every case):
//! 1. `ipset create s hash:net,iface` and `ipset -! restore` of `add s
//!    MEMBER` lines, each member as the project writes it
//!    (`10.1.0.0/16,eth0 nomatch`; this type holds a `/0` as it is);
//! 2. the nft set `inet T S` through [`NetlinkNft`], its elements made by
//!    [`SetShape::elements`] from the same members, as the backend does;
//! 3. for every probe address (each network's first and last address, the
//!    address below and above each, and random addresses) with each of the
//!    interface names `eth0`, `vlan0` and `lo` (about 250 probes), the
//!    kernel answers both: `ipset test s ADDR,IFACE` and
//!    `nft get element inet T S { ADDR . "IFACE" }` must succeed or fail
//!    together.
//!
//! Both sides are asked in one process per case, each probe its own
//! command: `ipset -` (one answer a line) and `nft -i` (goes on after an
//! error), as in `nomatch_kernel.rs`.
//!
//! One (network, interface) never appears both with and without `nomatch`
//! (compile rejects that). A failure prints the member list, the elements
//! sent, the disagreeing probes with both answers and what the kernel's rule
//! above says, and the seed (`PROPTEST_RNG_SEED`). Cases: 24 (IPv4) and 8
//! (IPv6) unless `PROPTEST_CASES` says otherwise. Needs root; without it the
//! tests print a skip message, except under `CI=true`, where they fail.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use ipsetmgr_ipset::{Family, Member, SetType};
use proptest::prelude::*;

mod oracle;
use oracle::{
    Probe, addr_of, bits, element_range, host_mask, ipset_answers, load_both, nft_answers, num,
    run, yes,
};

/// The interface names of every case; each probe address is asked with
/// each (so one name may have no member at all).
const IFACES: [&str; 3] = ["eth0", "vlan0", "lo"];

/// One case: members as a policy writes them, and random probe addresses
/// (numbers of the case's family).
#[derive(Clone)]
struct Case {
    family: Family,
    members: Vec<String>,
    random: Vec<u128>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let random: Vec<String> = self
            .random
            .iter()
            .map(|&a| addr_of(self.family, a).to_string())
            .collect();
        write!(
            f,
            "members {:?}, random probes [{}]",
            self.members,
            random.join(", ")
        )
    }
}

/// A network of a case: start, prefix, interface (index in [`IFACES`]),
/// nomatch.
type Net = (u128, u8, usize, bool);

fn member_text(family: Family, (addr, prefix, iface, nomatch): Net) -> String {
    let flag = if nomatch { " nomatch" } else { "" };
    format!("{}/{prefix},{}{flag}", addr_of(family, addr), IFACES[iface])
}

/// Networks at addresses of a small region (so that they nest all the
/// time), on two or three interfaces; some of them again on another
/// interface (the same network with both decides per interface); up to two
/// wider ones there, up to one anywhere (`/0` among them); and random
/// probes, mostly in the region. Host bits are left set at random: the
/// parser masks them.
fn case(
    family: Family,
    base: u128,
    region_bits: u32,
    region_prefixes: std::ops::RangeInclusive<u8>,
    covering_prefixes: std::ops::RangeInclusive<u8>,
    anywhere_prefixes: std::ops::RangeInclusive<u8>,
) -> impl Strategy<Value = Case> {
    let region = 1u128 << region_bits;
    let all = host_mask(bits(family), 0);
    let nomatch = || prop::bool::weighted(0.3);
    (
        2usize..=3,
        prop::collection::vec((0..region, region_prefixes, 0usize..3, nomatch()), 1..20),
        prop::collection::vec((any::<prop::sample::Index>(), 0usize..3, nomatch()), 0..5),
        prop::collection::vec((0..region, covering_prefixes, 0usize..3, nomatch()), 0..3),
        prop::collection::vec((0..=all, anywhere_prefixes, 0usize..3, nomatch()), 0..2),
        prop::collection::vec(0..region, 40),
        prop::collection::vec(0..=all, 12),
    )
        .prop_map(
            move |(ifaces, small, twins, covering, anywhere, near, far)| {
                let mut nets: Vec<Net> = small
                    .into_iter()
                    .chain(covering)
                    .map(|(a, p, i, n)| (base + a, p, i % ifaces, n))
                    .collect();
                let region_nets = nets.len();
                let twins: Vec<Net> = twins
                    .into_iter()
                    .map(|(at, i, n)| {
                        let (a, p, _, _) = nets[at.index(region_nets)];
                        (a, p, i % ifaces, n)
                    })
                    .collect();
                nets.extend(twins);
                nets.extend(
                    anywhere
                        .into_iter()
                        .map(|(a, p, i, n)| (a, p, i % ifaces, n)),
                );
                let members = nets.into_iter().map(|n| member_text(family, n)).collect();
                let random = near.into_iter().map(|a| base + a).chain(far).collect();
                Case {
                    family,
                    members,
                    random,
                }
            },
        )
}

/// The members of a case as the project's parser makes them, without a
/// member whose (network, interface) an earlier one already has with the
/// other flag.
fn parse_members(c: &Case) -> Vec<Member> {
    let mut flags: HashMap<(u128, u8, String), bool> = HashMap::new();
    let mut out = Vec::new();
    for text in &c.members {
        let parsed = Member::parse_user(SetType::HashNetIface, text)
            .unwrap_or_else(|e| panic!("the generator wrote {text:?}: {e}"));
        for m in parsed.members {
            let Member::NetIface(e) = &m else {
                panic!("{text:?} parsed to {m:?}");
            };
            let key = (num(&e.addr), e.prefix, e.iface.to_string());
            if *flags.entry(key).or_insert(e.nomatch) == e.nomatch {
                out.push(m);
            }
        }
    }
    out
}

/// Each member as a [`Net`].
fn networks(members: &[Member]) -> Vec<Net> {
    members
        .iter()
        .map(|m| match m {
            Member::NetIface(e) => {
                let name = e.iface.to_string();
                let i = IFACES
                    .iter()
                    .position(|n| *n == name)
                    .expect("a generated name");
                (num(&e.addr), e.prefix, i, e.nomatch)
            }
            _ => unreachable!("hash:net,iface members only"),
        })
        .collect()
}

/// A probe: an address and an interface (index in [`IFACES`]).
#[derive(Clone, Copy)]
struct IfaceProbe(IpAddr, usize);

impl Probe for IfaceProbe {
    fn ipset_text(&self) -> String {
        format!("{},{}", self.0, IFACES[self.1])
    }
    fn is_named_by(&self, answer: &str) -> bool {
        answer
            .rsplit_once(',')
            .is_some_and(|(a, i)| a.parse::<IpAddr>().ok() == Some(self.0) && i == IFACES[self.1])
    }
    fn nft_key(&self) -> String {
        format!("{} . \"{}\"", self.0, IFACES[self.1])
    }
    /// An element as nft prints it: `A . "I"`, `A/N . "I"`, `A-B . "I"`.
    fn held_by(&self, family: Family, element: &str) -> Option<bool> {
        let (net, name) = element.split_once(" . ")?;
        let name = name.strip_prefix('"')?.strip_suffix('"')?;
        let (first, last) = element_range(family, net)?;
        Some(name == IFACES[self.1] && (first..=last).contains(&num(&self.0)))
    }
}

/// Every network's ends and their neighbours and the random addresses,
/// each with every interface name.
fn probes(c: &Case, nets: &[Net]) -> Vec<IfaceProbe> {
    let b = bits(c.family);
    let max = host_mask(b, 0);
    let mut set: BTreeSet<u128> = c.random.iter().copied().collect();
    for &(start, prefix, _, _) in nets {
        let end = start | host_mask(b, prefix);
        set.extend(
            [
                Some(start),
                Some(end),
                start.checked_sub(1),
                end.checked_add(1),
            ]
            .into_iter()
            .flatten()
            .filter(|&a| a <= max),
        );
    }
    set.into_iter()
        .flat_map(|a| (0..IFACES.len()).map(move |i| IfaceProbe(addr_of(c.family, a), i)))
        .collect()
}

/// The kernel's rule, for the failure message: the most specific network
/// holding `a` decides, whatever its interface; the pair matches when that
/// network is there for `iface` without nomatch.
fn kernel_rule_matches(b: u32, nets: &[Net], a: u128, iface: usize) -> bool {
    let holding = |&&(start, prefix, _, _): &&Net| a & !host_mask(b, prefix) == start;
    let Some(longest) = nets.iter().filter(holding).map(|n| n.1).max() else {
        return false;
    };
    nets.iter()
        .filter(holding)
        .any(|&(_, prefix, i, nomatch)| prefix == longest && i == iface && !nomatch)
}

/// One case in the namespace the thread is in (fresh for each case): the
/// number of probes and how many of them both sides found.
fn check(c: &Case) -> Result<(usize, usize), String> {
    let members = parse_members(c);
    let nets = networks(&members);
    let elements = load_both(SetType::HashNetIface, c.family, &members)?;
    // Both kernels answer every probe.
    let probes = probes(c, &nets);
    let from_ipset = ipset_answers(&probes)?;
    let from_nft = nft_answers(c.family, &probes)?;
    let b = bits(c.family);
    let differ: Vec<String> = probes
        .iter()
        .zip(from_ipset.iter().zip(&from_nft))
        .filter(|(_, (i, n))| i != n)
        .map(|(IfaceProbe(a, iface), (&i, &n))| {
            let rule = kernel_rule_matches(b, &nets, num(a), *iface);
            let name = IFACES[*iface];
            format!(
                "  {a},{name}: `ipset test s {a},{name}` says {}, `nft get element inet T S {{ {a} . \"{name}\" }}` says {} (the most-specific-network rule: {})",
                yes(i),
                yes(n),
                yes(rule)
            )
        })
        .collect();
    if differ.is_empty() {
        let found = from_ipset.iter().filter(|f| **f).count();
        return Ok((probes.len(), found));
    }
    let listed: Vec<String> = members.iter().map(|m| format!("  add s {m}")).collect();
    let sent: Vec<String> = elements.iter().map(|e| format!("  {e}")).collect();
    // The first few: one wrong range is often many probes.
    const SHOWN: usize = 16;
    let more = differ.len().saturating_sub(SHOWN);
    let mut shown = differ[..differ.len().min(SHOWN)].join("\n");
    if more > 0 {
        shown += &format!("\n  ... and {more} more");
    }
    Err(format!(
        "ipset and nft disagree on {} of {} probes:\n{}\nmembers (ipset -! restore):\n{}\nnft elements sent:\n{}",
        differ.len(),
        probes.len(),
        shown,
        listed.join("\n"),
        sent.join("\n"),
    ))
}

#[test]
fn ipv4_iface_matches_ipset_in_the_kernel() {
    // /18 to /32 networks at addresses of 10.0.0.0/20, up to two /4 to /19
    // ones there too, up to one /0 to /8 anywhere.
    run(
        "ipv4_iface_matches_ipset_in_the_kernel",
        24,
        case(Family::V4, 0x0a00_0000, 12, 18..=32, 4..=19, 0..=8),
        check,
    );
}

#[test]
fn ipv6_iface_matches_ipset_in_the_kernel() {
    // /100 to /128 networks at addresses of 2001:db8::/112, up to two /16
    // to /111 ones there too, up to one /0 to /16 anywhere.
    run(
        "ipv6_iface_matches_ipset_in_the_kernel",
        8,
        case(
            Family::V6,
            0x2001_0db8 << 96,
            16,
            100..=128,
            16..=111,
            0..=16,
        ),
        check,
    );
}
