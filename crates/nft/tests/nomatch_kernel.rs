//! nomatch against the kernel (issue 22): for random hash:net member lists
//! with `nomatch` entries and overlapping networks, the nft interval set
//! this crate makes from the members, and the BPF prefix map the bpf
//! backend makes of them (issue 35), hold exactly the addresses the
//! kernel's ipset matches.
//!
//! Per case, in a fresh network namespace (the test's thread calls
//! `unshare(CLONE_NEWNET)` again for every case, so no case sees another's
//! sets and nothing needs flushing):
//! 1. `ipset create s hash:net` and `ipset -! restore` of `add s MEMBER`
//!    lines, each member as the project writes it (`10.1.0.0/16 nomatch`;
//!    a `/0`, which ipset refuses, as the two `/1` halves the parser makes);
//! 2. the nft set `inet T S` through [`NetlinkNft`], its elements made by
//!    [`SetShape::elements`] from the same members, as the backend does;
//! 3. the same members as a BPF map: the bpf backend's reconciler writes
//!    the set `ipm4-p` (`ipm6-p`) into a bpffs of the test thread's own
//!    (crates/bpf; docs/bpf.md);
//! 4. for every probe (each network's first and last address, the address
//!    below and above each, and random addresses; 64 to about 200) the
//!    kernel answers all three: `ipset test s ADDR`,
//!    `nft get element inet T S { ADDR }` and a lookup in the BPF map (a
//!    full-length key: the longest prefix decides, value 0 is `nomatch`)
//!    must agree.
//!
//! Both sides are asked in one process per case, each probe its own
//! command, so the kernel answers every probe: `ipset -` (interactive mode)
//! runs one `test` a line and prints one answer a line, and `nft -i` runs
//! one `get element` a line and goes on after an error. (`ipset restore`
//! stops at the first `test`; an nft `get element` of several elements
//! fails as a whole when any is absent; `nft -f` stops at the first error.)
//!
//! Members are generated as a compiled policy holds them: one network never
//! appears both with and without `nomatch` (compile rejects that, and the
//! two sides would resolve it differently: ipset keeps the flag of the last
//! add, [`ipsetmgr_nft::interval`] makes such a network nomatch).
//!
//! A failure prints the member list, the ranges the crate computed, the
//! disagreeing addresses with both answers (and what the longest-prefix
//! rule says), and the seed (`PROPTEST_RNG_SEED`). Cases: 24 (IPv4) and 8
//! (IPv6) unless `PROPTEST_CASES` says otherwise. Needs root; without it the
//! tests print a skip message, except under `CI=true`, where they fail.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use ipsetmgr_ipset::{Family, Member, SetType};
use ipsetmgr_nft::interval::{NetRule, matching_ranges};
use proptest::prelude::*;

mod oracle;
use oracle::{
    addr_of, bits, bpf_answers, host_mask, ipset_answers, load_both, nft_answers, num, run, yes,
};

/// One case: members as a policy writes them, and random probes (numbers
/// of the case's family).
#[derive(Clone)]
struct Case {
    family: Family,
    members: Vec<String>,
    random: Vec<u128>,
}

/// As the failure message shows the case: the members as written, the
/// random probes as addresses.
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

fn member_text(family: Family, addr: u128, prefix: u8, nomatch: bool) -> String {
    let flag = if nomatch { " nomatch" } else { "" };
    format!("{}/{prefix}{flag}", addr_of(family, addr))
}

/// Networks at addresses of a small region (so that they nest and nomatch
/// falls inside nomatch all the time), up to two wider ones there that hold
/// much of the region, up to one anywhere (`/0` among them), and random
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
    let anywhere = (0..=all, anywhere_prefixes, any::<bool>());
    (
        prop::collection::vec(
            (0..region, region_prefixes, prop::bool::weighted(0.4)),
            1..24,
        ),
        prop::collection::vec((0..region, covering_prefixes, any::<bool>()), 0..3),
        prop::collection::vec(anywhere, 0..2),
        prop::collection::vec(0..region, 48),
        prop::collection::vec(0..=all, 16),
    )
        .prop_map(move |(small, covering, anywhere, near, far)| {
            let mut members: Vec<String> = small
                .into_iter()
                .chain(covering)
                .map(|(a, p, n)| member_text(family, base + a, p, n))
                .collect();
            members.extend(
                anywhere
                    .into_iter()
                    .map(|(a, p, n)| member_text(family, a, p, n)),
            );
            let random = near.into_iter().map(|a| base + a).chain(far).collect();
            Case {
                family,
                members,
                random,
            }
        })
}

/// The members of a case as the project's parser makes them, without a
/// member whose network an earlier one already has with the other flag.
fn parse_members(c: &Case) -> Vec<Member> {
    let mut flags: HashMap<(u128, u8), bool> = HashMap::new();
    let mut out = Vec::new();
    for text in &c.members {
        let parsed = Member::parse_user(SetType::HashNet, text)
            .unwrap_or_else(|e| panic!("the generator wrote {text:?}: {e}"));
        for m in parsed.members {
            let Member::Net {
                addr,
                prefix,
                nomatch,
            } = m
            else {
                panic!("{text:?} parsed to {m:?}");
            };
            if *flags.entry((num(&addr), prefix)).or_insert(nomatch) == nomatch {
                out.push(m);
            }
        }
    }
    out
}

/// `(start, prefix, nomatch)` of each member.
fn networks(members: &[Member]) -> Vec<(u128, u8, bool)> {
    members
        .iter()
        .map(|m| match m {
            Member::Net {
                addr,
                prefix,
                nomatch,
            } => (num(addr), *prefix, *nomatch),
            _ => unreachable!("hash:net members only"),
        })
        .collect()
}

/// Every network's ends and their neighbours, and the random probes.
fn probes(c: &Case, nets: &[(u128, u8, bool)]) -> Vec<IpAddr> {
    let b = bits(c.family);
    let max = host_mask(b, 0);
    let mut set: BTreeSet<u128> = c.random.iter().copied().collect();
    for &(start, prefix, _) in nets {
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
    set.into_iter().map(|a| addr_of(c.family, a)).collect()
}

/// ipset's rule, for the failure message: the longest prefix containing
/// `a` decides.
fn longest_prefix_matches(b: u32, nets: &[(u128, u8, bool)], a: u128) -> bool {
    nets.iter()
        .filter(|&&(start, prefix, _)| a & !host_mask(b, prefix) == start)
        .max_by_key(|&&(_, prefix, _)| prefix)
        .is_some_and(|&(_, _, nomatch)| !nomatch)
}

/// One case in the namespace the thread is in (fresh for each case): the
/// number of probes and how many of them both sides found.
fn check(c: &Case) -> Result<(usize, usize), String> {
    let members = parse_members(c);
    let nets = networks(&members);
    let elements = load_both(SetType::HashNet, c.family, &members)?;
    // Both kernels answer every probe.
    let probes = probes(c, &nets);
    let from_ipset = ipset_answers(&probes)?;
    let from_nft = nft_answers(c.family, &probes)?;
    let from_bpf = bpf_answers(SetType::HashNet, c.family, &members, &probes)?;
    let b = bits(c.family);
    let differ: Vec<String> = probes
        .iter()
        .zip(from_ipset.iter().zip(from_nft.iter().zip(&from_bpf)))
        .filter(|(_, (i, (n, p)))| i != n || i != p)
        .map(|(a, (&i, (&n, &p)))| {
            let rule = longest_prefix_matches(b, &nets, num(a));
            format!(
                "  {a}: `ipset test s {a}` says {}, `nft get element inet T S {{ {a} }}` says {}, the BPF map's lookup says {} (the longest-prefix rule: {})",
                yes(i),
                yes(n),
                yes(p),
                yes(rule)
            )
        })
        .collect();
    if differ.is_empty() {
        let found = from_ipset.iter().filter(|f| **f).count();
        return Ok((probes.len(), found));
    }
    let rules: Vec<NetRule<'_>> = nets
        .iter()
        .map(|&(start, prefix, nomatch)| NetRule {
            addr: addr_of(c.family, start),
            prefix,
            nomatch,
            comment: None,
        })
        .collect();
    let ranges = matching_ranges(c.family, &rules)
        .map(|r| {
            r.iter()
                .map(|r| format!("  {}-{}", r.first, r.last))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|e| format!("  (matching_ranges: {e})"));
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
        "ipset, nft and the BPF map disagree on {} of {} probes:\n{}\nmembers (ipset -! restore):\n{}\nmatching_ranges:\n{}\nnft elements sent:\n{}",
        differ.len(),
        probes.len(),
        shown,
        listed.join("\n"),
        ranges,
        sent.join("\n"),
    ))
}

#[test]
fn ipv4_nomatch_matches_ipset_in_the_kernel() {
    // /18 to /32 networks at addresses of 10.0.0.0/20, up to two /4 to /19
    // ones there too, up to one /0 to /8 anywhere.
    run(
        "ipv4_nomatch_matches_ipset_in_the_kernel",
        24,
        case(Family::V4, 0x0a00_0000, 12, 18..=32, 4..=19, 0..=8),
        check,
    );
}

#[test]
fn ipv6_nomatch_matches_ipset_in_the_kernel() {
    // /100 to /128 networks at addresses of 2001:db8::/112, up to two /16
    // to /111 ones there too, up to one /0 to /16 anywhere.
    run(
        "ipv6_nomatch_matches_ipset_in_the_kernel",
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
