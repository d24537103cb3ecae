//! hash:ip in three kernels (issue 35): for random address lists, the
//! ipset, the nft set this crate makes of them and the BPF prefix map the
//! bpf backend makes of them hold exactly the same addresses.
//!
//! Per case, in a fresh network namespace (tests/oracle): `ipset create s
//! hash:ip` filled with `ipset -! restore`, the nft set `inet T S` through
//! netlink, the BPF map `ipm4-p` / `ipm6-p` through the bpf backend's
//! reconciler; then every probe (each member, the addresses next to it,
//! random addresses) is asked of all three: `ipset test s ADDR`,
//! `nft get element inet T S { ADDR }` and a lookup in the map. Cases: 16
//! (IPv4) and 8 (IPv6) unless `PROPTEST_CASES` says otherwise. Needs root;
//! without it the tests print a skip message, except under `CI=true`, where
//! they fail.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipsetmgr_ipset::{Family, Member, SetType};
use proptest::prelude::*;

mod oracle;
use oracle::{
    addr_of, bits, bpf_answers, host_mask, ipset_answers, load_both, nft_answers, run, yes,
};

#[derive(Clone)]
struct Case {
    family: Family,
    members: Vec<u128>,
    random: Vec<u128>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &[u128]| -> Vec<String> {
            v.iter()
                .map(|&a| addr_of(self.family, a).to_string())
                .collect()
        };
        write!(
            f,
            "members {:?}, random probes {:?}",
            show(&self.members),
            show(&self.random)
        )
    }
}

/// Addresses of a small region at `base` (so that neighbours are members
/// too), a few anywhere, and random probes, mostly in the region.
fn case(family: Family, base: u128) -> impl Strategy<Value = Case> {
    let all = host_mask(bits(family), 0);
    (
        prop::collection::vec(0..256u128, 1..40),
        prop::collection::vec(0..=all, 0..4),
        prop::collection::vec(0..256u128, 32),
        prop::collection::vec(0..=all, 8),
    )
        .prop_map(move |(near, anywhere, probes_near, probes_far)| Case {
            family,
            members: near.into_iter().map(|a| base + a).chain(anywhere).collect(),
            random: probes_near
                .into_iter()
                .map(|a| base + a)
                .chain(probes_far)
                .collect(),
        })
}

fn check(c: &Case) -> Result<(usize, usize), String> {
    let members: Vec<Member> = c
        .members
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|&a| Member::Ip(addr_of(c.family, a)))
        .collect();
    load_both(SetType::HashIp, c.family, &members)?;
    let max = host_mask(bits(c.family), 0);
    let mut at: BTreeSet<u128> = c.random.iter().copied().collect();
    for &a in &c.members {
        at.extend(
            [a.checked_sub(1), Some(a), a.checked_add(1)]
                .into_iter()
                .flatten(),
        );
    }
    let probes: Vec<IpAddr> = at
        .into_iter()
        .filter(|&a| a <= max)
        .map(|a| addr_of(c.family, a))
        .collect();
    let from_ipset = ipset_answers(&probes)?;
    let from_nft = nft_answers(c.family, &probes)?;
    let from_bpf = bpf_answers(SetType::HashIp, c.family, &members, &probes)?;
    let differ: Vec<String> = probes
        .iter()
        .zip(from_ipset.iter().zip(from_nft.iter().zip(&from_bpf)))
        .filter(|(_, (i, (n, p)))| i != n || i != p)
        .map(|(a, (&i, (&n, &p)))| {
            format!(
                "  {a}: ipset says {}, nft {}, the BPF map {}",
                yes(i),
                yes(n),
                yes(p)
            )
        })
        .collect();
    if !differ.is_empty() {
        return Err(format!(
            "the kernels disagree on {} of {} probes:\n{}",
            differ.len(),
            probes.len(),
            differ.join("\n")
        ));
    }
    // Every member is in all three.
    if from_ipset.iter().filter(|f| **f).count() != members.len() {
        return Err(format!(
            "{} probes found, {} members",
            from_ipset.iter().filter(|f| **f).count(),
            members.len()
        ));
    }
    Ok((probes.len(), members.len()))
}

#[test]
fn ipv4_hash_ip_is_the_same_in_ipset_nft_and_bpf() {
    run(
        "ipv4_hash_ip_is_the_same_in_ipset_nft_and_bpf",
        16,
        case(Family::V4, 0xc000_0200),
        check,
    );
}

#[test]
fn ipv6_hash_ip_is_the_same_in_ipset_nft_and_bpf() {
    run(
        "ipv6_hash_ip_is_the_same_in_ipset_nft_and_bpf",
        8,
        case(Family::V6, 0x2001_0db8 << 96),
        check,
    );
}
