//! `spec.except` on hash:net,iface against the kernel: the type whose
//! lookup is the odd one (the most specific network holding the address
//! decides whatever its interface; docs/nftables.md, "nomatch and
//! overlaps"). For random members over two interfaces, some `nomatch`, and
//! random except ranges, the set the policy compiler makes (members inside
//! the ranges dropped, nomatch entries with each cut member's interface)
//! matches a pair (address, interface) exactly when the members without
//! `except` match it and no except range holds the address: asked of
//! `ipset test s ADDR,IFACE` and `nft get element inet T S { ADDR . "IFACE" }`
//! (the nft set the backend makes of the same members), each case in a
//! fresh network namespace (the oracle's runner, as in `except_kernel.rs`
//! and `iface_kernel.rs`, whose probe and rule this repeats).
//!
//! Cases: 32 (IPv4) unless `PROPTEST_CASES` says otherwise. Needs root;
//! without it the test prints a skip message, except under `CI=true`, where
//! it fails.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec};
use ipsetmgr_ipset::{Family, Member, Naming, SetType};
use proptest::prelude::*;

mod oracle;
use oracle::{
    Probe, addr_of, bits, element_range, host_mask, ipset_answers, load_both, nft_answers, num,
    run, yes,
};

/// Members use the first two; `lo` is asked too, and has none.
const IFACES: [&str; 3] = ["eth0", "vlan0", "lo"];

#[derive(Clone, Debug)]
struct Case {
    members: Vec<String>,
    except: Vec<String>,
    random: Vec<u128>,
}

const FAMILY: Family = Family::V4;

fn net_text(addr: u128, prefix: u8) -> String {
    format!("{}/{prefix}", addr_of(FAMILY, addr))
}

/// Networks of 10.0.0.0/20 on eth0 or vlan0, some nomatch, at times a wide
/// one; except ranges there too.
fn case() -> impl Strategy<Value = Case> {
    let base = 0x0a00_0000u128;
    let region = 1u128 << 12;
    (
        prop::collection::vec(
            (0..region, 20u8..=32, 0..2usize, prop::bool::weighted(0.25)),
            1..16,
        ),
        prop::collection::vec((0..region, 8u8..=19, 0..2usize), 0..2),
        prop::collection::vec((0..region, 20u8..=32), 1..5),
        prop::collection::vec(0..region, 32),
    )
        .prop_map(move |(small, wide, except, near)| {
            let members = small
                .into_iter()
                .chain(wide.into_iter().map(|(a, p, i)| (a, p, i, false)))
                .map(|(a, p, i, n)| {
                    let flag = if n { " nomatch" } else { "" };
                    format!("{},{}{flag}", net_text(base + a, p), IFACES[i])
                })
                .collect();
            Case {
                members,
                except: except
                    .into_iter()
                    .map(|(a, p)| net_text(base + a, p))
                    .collect(),
                random: near.into_iter().map(|a| base + a).collect(),
            }
        })
}

/// The policy's one set, compiled; `None` when the members alone are
/// refused (a network on one interface with and without nomatch).
fn compiled(c: &Case, except: &[String]) -> Result<Option<Vec<Member>>, String> {
    let mut spec = IPSetPolicySpec::new(SetType::HashNetIface, FamilySpec::IPv4, c.members.clone());
    spec.except = except.to_vec();
    let p = IPSetPolicy::new("p", spec);
    let out = ipsetmgr_policy::compile::compile([&p], &Naming::default(), None);
    if !out.errors.is_empty() {
        return if except.is_empty() {
            Ok(None)
        } else {
            Err(format!("compile with except: {:?}", out.errors))
        };
    }
    Ok(Some(out.sets[0].members.iter().collect()))
}

/// `(start, prefix, iface index, nomatch)`.
type Net = (u128, u8, usize, bool);

fn networks(members: &[Member]) -> Vec<Net> {
    members
        .iter()
        .map(|m| match m {
            Member::NetIface(e) => {
                let i = IFACES
                    .iter()
                    .position(|n| *n == e.iface.as_str())
                    .expect("a case's interface");
                (num(&e.addr), e.prefix, i, e.nomatch)
            }
            other => unreachable!("hash:net,iface members only: {other:?}"),
        })
        .collect()
}

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
    fn held_by(&self, family: Family, element: &str) -> Option<bool> {
        let (net, name) = element.split_once(" . ")?;
        let name = name.strip_prefix('"')?.strip_suffix('"')?;
        let (first, last) = element_range(family, net)?;
        Some(name == IFACES[self.1] && (first..=last).contains(&num(&self.0)))
    }
}

/// The kernel's rule for this type: the most specific network holding `a`
/// decides, whatever its interface; the pair matches when that network is
/// there for `iface` without nomatch.
fn kernel_rule_matches(nets: &[Net], a: u128, iface: usize) -> bool {
    let b = bits(FAMILY);
    let holding = |&&(start, prefix, _, _): &&Net| a & !host_mask(b, prefix) == start;
    let Some(longest) = nets.iter().filter(holding).map(|n| n.1).max() else {
        return false;
    };
    nets.iter()
        .filter(holding)
        .any(|&(_, prefix, i, nomatch)| prefix == longest && i == iface && !nomatch)
}

fn span(start: u128, prefix: u8) -> (u128, u128) {
    (start, start | host_mask(bits(FAMILY), prefix))
}

fn check(c: &Case) -> Result<(usize, usize), String> {
    let Some(plain) = compiled(c, &[])? else {
        return Ok((0, 0));
    };
    let members = compiled(c, &c.except)?.expect("compiled");
    let plain_nets = networks(&plain);
    let excepted: Vec<(u128, u128)> = c
        .except
        .iter()
        .map(|e| {
            let (a, p) = e.split_once('/').expect("a CIDR");
            let p: u8 = p.parse().expect("a prefix");
            let start = num(&a.parse().expect("an address")) & !host_mask(bits(FAMILY), p);
            span(start, p)
        })
        .collect();
    let mut addrs: BTreeSet<u128> = c.random.iter().copied().collect();
    let spans = plain_nets
        .iter()
        .map(|&(s, p, _, _)| span(s, p))
        .chain(excepted.iter().copied());
    for (first, last) in spans {
        addrs.extend([first, last, first - 1, last + 1]);
    }
    let probes: Vec<IfaceProbe> = addrs
        .into_iter()
        .flat_map(|a| (0..IFACES.len()).map(move |i| IfaceProbe(addr_of(FAMILY, a), i)))
        .collect();
    load_both(SetType::HashNetIface, FAMILY, &members)?;
    let from_ipset = ipset_answers(&probes)?;
    let from_nft = nft_answers(FAMILY, &probes)?;
    let mut differ = Vec::new();
    for (k, p) in probes.iter().enumerate() {
        let a = num(&p.0);
        let inside = excepted.iter().any(|&(f, l)| (f..=l).contains(&a));
        let want = kernel_rule_matches(&plain_nets, a, p.1) && !inside;
        if from_ipset[k] != want || from_nft[k] != want {
            differ.push(format!(
                "  {}: the model says {} ({}excepted); ipset says {}, nft says {}",
                p.ipset_text(),
                yes(want),
                if inside { "" } else { "not " },
                yes(from_ipset[k]),
                yes(from_nft[k]),
            ));
        }
    }
    if differ.is_empty() {
        let found = from_ipset.iter().filter(|f| **f).count();
        return Ok((probes.len(), found));
    }
    let loaded: Vec<String> = members.iter().map(|m| format!("  add s {m}")).collect();
    differ.truncate(16);
    Err(format!(
        "the kernels and the model disagree:\n{}\ncompiled members (ipset -! restore):\n{}",
        differ.join("\n"),
        loaded.join("\n")
    ))
}

#[test]
fn ipv4_hash_net_iface_except_matches_the_model_in_the_kernel() {
    run(
        "ipv4_hash_net_iface_except_matches_the_model_in_the_kernel",
        32,
        case(),
        check,
    );
}
