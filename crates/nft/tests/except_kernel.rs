//! `spec.except` against the kernel (issue 32, Must show 1): for random
//! member lists with random except ranges, the sets the policy compiler
//! makes match an address exactly when the members match it and no except
//! range holds it, in every kernel: `ipset test` (ipset), `nft get element`
//! (the nft set the backend makes of the same members) and the bpf
//! backend's prefix map.
//!
//! Per case, in a fresh network namespace (the oracle's runner, shared
//! with `nomatch_kernel.rs`):
//! 1. a policy of the case's type (hash:net with nomatch members, or
//!    hash:ip) with the members and `spec.except`, compiled by
//!    `ipsetmgr_policy::compile` (host bits set at random: it masks them);
//! 2. its set loaded into ipset, nft and a BPF map ([`oracle::load_both`],
//!    [`oracle::bpf_answers`]);
//! 3. every probe (each member's and each except range's first and last
//!    address and their neighbours, and random addresses, mostly in the
//!    region) asked of the three kernels, and compared with the model: the
//!    same policy compiled without `except` (the most specific member
//!    holding the address decides, as ipset says), and no except range
//!    holding it.
//!
//! The model is ipset's own rule on the members as written; what is tested
//! is that the except ranges, cut out by the compiler (dropped members,
//! nomatch entries), leave exactly that in all three kernels. Cases: 64
//! hash:net IPv4, 24 hash:net IPv6, 32 hash:ip IPv4 (`PROPTEST_CASES`
//! overrides). Needs root; without it the tests print a skip message,
//! except under `CI=true`, where they fail.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec};
use ipsetmgr_ipset::{Family, Member, Naming, SetType};
use proptest::prelude::*;

mod oracle;
use oracle::{
    addr_of, bits, bpf_answers, host_mask, ipset_answers, load_both, nft_answers, num, run, yes,
};

#[derive(Clone, Debug)]
struct Case {
    set_type: SetType,
    family: Family,
    members: Vec<String>,
    except: Vec<String>,
    random: Vec<u128>,
}

fn net_text(family: Family, addr: u128, prefix: u8) -> String {
    format!("{}/{prefix}", addr_of(family, addr))
}

/// Members and except ranges in a small region (so that they nest and
/// overlap all the time), one wider member or except range at times, and
/// probes mostly in the region.
fn case(
    set_type: SetType,
    family: Family,
    base: u128,
    region_bits: u32,
    prefixes: std::ops::RangeInclusive<u8>,
    wide: std::ops::RangeInclusive<u8>,
) -> impl Strategy<Value = Case> {
    let region = 1u128 << region_bits;
    let all = host_mask(bits(family), 0);
    let host = family.max_prefix();
    let member_prefix = if set_type == SetType::HashNet {
        prefixes.clone()
    } else {
        host..=host
    };
    (
        prop::collection::vec(
            (0..region, member_prefix, prop::bool::weighted(0.25)),
            1..20,
        ),
        prop::collection::vec((0..region, prefixes), 0..6),
        prop::collection::vec((0..region, wide), 0..2),
        any::<bool>(),
        prop::collection::vec(0..region, 48),
        prop::collection::vec(0..=all, 8),
    )
        .prop_map(move |(members, except, wide, wide_is_member, near, far)| {
            let nomatch = |n: bool| {
                if n && set_type == SetType::HashNet {
                    " nomatch"
                } else {
                    ""
                }
            };
            let mut member_texts: Vec<String> = members
                .into_iter()
                .map(|(a, p, n)| {
                    if set_type == SetType::HashNet {
                        format!("{}{}", net_text(family, base + a, p), nomatch(n))
                    } else {
                        addr_of(family, base + a).to_string()
                    }
                })
                .collect();
            let mut except: Vec<String> = except
                .into_iter()
                .map(|(a, p)| net_text(family, base + a, p))
                .collect();
            let wide = wide.into_iter().map(|(a, p)| net_text(family, base + a, p));
            if wide_is_member && set_type == SetType::HashNet {
                member_texts.extend(wide);
            } else {
                except.extend(wide);
            }
            Case {
                set_type,
                family,
                members: member_texts,
                except,
                random: near.into_iter().map(|a| base + a).chain(far).collect(),
            }
        })
}

fn policy(c: &Case, except: &[String]) -> IPSetPolicy {
    let fam = match c.family {
        Family::V4 => FamilySpec::IPv4,
        Family::V6 => FamilySpec::IPv6,
    };
    let mut spec = IPSetPolicySpec::new(c.set_type, fam, c.members.clone());
    spec.except = except.to_vec();
    IPSetPolicy::new("p", spec)
}

/// The policy's one set, compiled; `None` when the members alone are
/// refused (a network written with and without nomatch).
fn compiled(c: &Case, except: &[String]) -> Result<Option<Vec<Member>>, String> {
    let p = policy(c, except);
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

/// `(first, last, nomatch)` of a member of hash:net or hash:ip.
fn span(family: Family, m: &Member) -> (u128, u128, u8, bool) {
    let (addr, prefix, nomatch) = match m {
        Member::Net {
            addr,
            prefix,
            nomatch,
        } => (*addr, *prefix, *nomatch),
        Member::Ip(a) => (*a, family.max_prefix(), false),
        other => unreachable!("hash:net or hash:ip members only: {other:?}"),
    };
    let first = num(&addr);
    (
        first,
        first | host_mask(bits(family), prefix),
        prefix,
        nomatch,
    )
}

/// ipset's rule: the most specific entry holding `a` decides.
fn matches(family: Family, members: &[Member], a: u128) -> bool {
    members
        .iter()
        .map(|m| span(family, m))
        .filter(|&(first, last, _, _)| (first..=last).contains(&a))
        .max_by_key(|&(_, _, prefix, _)| prefix)
        .is_some_and(|(_, _, _, nomatch)| !nomatch)
}

fn except_ranges(family: Family, except: &[String]) -> Vec<(u128, u128)> {
    except
        .iter()
        .map(|e| {
            let (a, p) = e.split_once('/').expect("the generator writes CIDRs");
            let addr: IpAddr = a.parse().expect("an address");
            let p: u8 = p.parse().expect("a prefix");
            let first = num(&addr) & !host_mask(bits(family), p);
            (first, first | host_mask(bits(family), p))
        })
        .collect()
}

fn probes(c: &Case, spans: &[(u128, u128)]) -> Vec<IpAddr> {
    let max = host_mask(bits(c.family), 0);
    let mut set: BTreeSet<u128> = c.random.iter().copied().collect();
    for &(first, last) in spans {
        set.extend(
            [
                Some(first),
                Some(last),
                first.checked_sub(1),
                last.checked_add(1),
            ]
            .into_iter()
            .flatten()
            .filter(|&a| a <= max),
        );
    }
    set.into_iter().map(|a| addr_of(c.family, a)).collect()
}

fn check(c: &Case) -> Result<(usize, usize), String> {
    let Some(plain) = compiled(c, &[])? else {
        // Refused without except too: nothing to compare.
        return Ok((0, 0));
    };
    let members = compiled(c, &c.except)?.expect("compiled");
    let excepted = except_ranges(c.family, &c.except);
    let mut spans: Vec<(u128, u128)> = plain
        .iter()
        .map(|m| span(c.family, m))
        .map(|(f, l, _, _)| (f, l))
        .collect();
    spans.extend(&excepted);
    let probes = probes(c, &spans);
    load_both(c.set_type, c.family, &members)?;
    let from_ipset = ipset_answers(&probes)?;
    let from_nft = nft_answers(c.family, &probes)?;
    let from_bpf = bpf_answers(c.set_type, c.family, &members, &probes)?;
    let mut differ = Vec::new();
    for (i, probe) in probes.iter().enumerate() {
        let a = num(probe);
        let inside = excepted.iter().any(|&(f, l)| (f..=l).contains(&a));
        let want = matches(c.family, &plain, a) && !inside;
        let got = [from_ipset[i], from_nft[i], from_bpf[i]];
        if got.iter().any(|g| *g != want) {
            differ.push(format!(
                "  {probe}: the model says {} ({}excepted); ipset says {}, nft says {}, the BPF map says {}",
                yes(want),
                if inside { "" } else { "not " },
                yes(got[0]),
                yes(got[1]),
                yes(got[2]),
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
fn ipv4_hash_net_except_matches_the_model_in_every_kernel() {
    // /20 to /32 networks and except ranges in 10.0.0.0/20; a wide one /8
    // to /19 at times.
    run(
        "ipv4_hash_net_except_matches_the_model_in_every_kernel",
        64,
        case(
            SetType::HashNet,
            Family::V4,
            0x0a00_0000,
            12,
            20..=32,
            8..=19,
        ),
        check,
    );
}

#[test]
fn ipv6_hash_net_except_matches_the_model_in_every_kernel() {
    run(
        "ipv6_hash_net_except_matches_the_model_in_every_kernel",
        24,
        case(
            SetType::HashNet,
            Family::V6,
            0x2001_0db8 << 96,
            16,
            112..=128,
            32..=111,
        ),
        check,
    );
}

#[test]
fn ipv4_hash_ip_except_matches_the_model_in_every_kernel() {
    run(
        "ipv4_hash_ip_except_matches_the_model_in_every_kernel",
        32,
        case(
            SetType::HashIp,
            Family::V4,
            0x0a00_0000,
            8,
            24..=32,
            16..=23,
        ),
        check,
    );
}
