//! nomatch and overlapping networks as disjoint address ranges.
//!
//! ipset's hash:net matches an address when the most specific (longest
//! prefix) entry containing it is not `nomatch`. nft has no nomatch, and an
//! nft interval set refuses overlapping elements; but it can hold any set
//! of addresses as disjoint ranges. [`matching_ranges`] computes exactly the
//! addresses ipset would match, as sorted, disjoint, non-adjacent ranges
//! (adjacent ones are merged unless their comments differ), so two policies
//! that match the same addresses give the same ranges and a resync sees no
//! difference. [`cidrs`] goes back to networks, for display.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipsetmgr_ipset::{Comment, Family};

use crate::value::Value;

/// One entry of a hash:net-like set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetRule<'c> {
    pub addr: IpAddr,
    pub prefix: u8,
    pub nomatch: bool,
    pub comment: Option<&'c Comment>,
}

/// A range of addresses, both ends included, with the comment of the entry
/// that decides them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddrRange<'c> {
    pub first: IpAddr,
    pub last: IpAddr,
    pub comment: Option<&'c Comment>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    #[error("{addr}/{prefix} is not an {family} network")]
    Family {
        addr: IpAddr,
        prefix: u8,
        family: Family,
    },
}

/// The addresses ipset would match for `rules`, as sorted disjoint ranges.
///
/// The same network given twice is one entry (as in the kernel): it is
/// `nomatch` if any of them is (the entry that matches less), with the
/// first comment given. Host bits of a network are ignored.
pub fn matching_ranges<'c>(
    family: Family,
    rules: &[NetRule<'c>],
) -> Result<Vec<AddrRange<'c>>, IntervalError> {
    let bits = u32::from(family.max_prefix());
    let mut raw = Vec::with_capacity(rules.len());
    for r in rules {
        let bad = || IntervalError::Family {
            addr: r.addr,
            prefix: r.prefix,
            family,
        };
        if Family::of(&r.addr) != family || u32::from(r.prefix) > bits {
            return Err(bad());
        }
        let start = to_u128(r.addr) & !host_mask(bits, r.prefix);
        raw.push(Raw {
            start,
            end: start | host_mask(bits, r.prefix),
            prefix: r.prefix,
            nomatch: r.nomatch,
            comment: r.comment,
        });
    }
    Ok(ranges(bits, raw)
        .into_iter()
        .map(|(first, last, comment)| AddrRange {
            first: from_u128(family, first),
            last: from_u128(family, last),
            comment,
        })
        .collect())
}

/// An entry as numbers: `start..=end` is the network.
#[derive(Clone, Debug)]
pub(crate) struct Raw<C> {
    pub start: u128,
    pub end: u128,
    pub prefix: u8,
    pub nomatch: bool,
    pub comment: C,
}

pub(crate) use ipsetmgr_ipset::{host_mask, to_u128};

pub(crate) fn from_u128(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// The core of [`matching_ranges`] on numbers (`bits` wide addresses).
///
/// Networks are laminar: two are nested or disjoint. Sorted by start and
/// then widest first, a stack holds the chain of networks containing the
/// current point, the most specific on top. Between two consecutive
/// boundaries (a start or one past an end) that top does not change, so
/// each such segment matches or not as a whole: O(n log n).
pub(crate) fn ranges<C: Copy + PartialEq>(
    bits: u32,
    mut rules: Vec<Raw<C>>,
) -> Vec<(u128, u128, C)> {
    let max = host_mask(bits, 0);
    rules.sort_by(|a, b| a.start.cmp(&b.start).then(a.prefix.cmp(&b.prefix)));
    // One entry per network.
    rules.dedup_by(|later, first| {
        let same = later.start == first.start && later.prefix == first.prefix;
        if same {
            first.nomatch |= later.nomatch;
        }
        same
    });
    let mut bounds: Vec<u128> = Vec::with_capacity(rules.len() * 2);
    for r in &rules {
        bounds.push(r.start);
        if r.end < max {
            bounds.push(r.end + 1);
        }
    }
    bounds.sort_unstable();
    bounds.dedup();
    let mut out: Vec<(u128, u128, C)> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut next = 0;
    for (bi, &p) in bounds.iter().enumerate() {
        while stack.last().is_some_and(|&top| rules[top].end < p) {
            stack.pop();
        }
        while next < rules.len() && rules[next].start == p {
            stack.push(next);
            next += 1;
        }
        let Some(&top) = stack.last() else { continue };
        let owner = &rules[top];
        if owner.nomatch {
            continue;
        }
        let seg_end = bounds.get(bi + 1).map_or(max, |n| n - 1);
        match out.last_mut() {
            Some(last) if last.1.checked_add(1) == Some(p) && last.2 == owner.comment => {
                last.1 = seg_end;
            }
            _ => out.push((p, seg_end, owner.comment)),
        }
    }
    out
}

/// The fewest networks that cover exactly `first..=last` (empty when
/// `last < first` or the families differ), in order.
pub fn cidrs(first: IpAddr, last: IpAddr) -> Vec<(IpAddr, u8)> {
    let family = Family::of(&first);
    if Family::of(&last) != family {
        return Vec::new();
    }
    let bits = u32::from(family.max_prefix());
    cidrs_u128(bits, to_u128(first), to_u128(last))
        .into_iter()
        .map(|(a, p)| (from_u128(family, a), p))
        .collect()
}

pub(crate) fn cidrs_u128(bits: u32, mut first: u128, last: u128) -> Vec<(u128, u8)> {
    let mut out = Vec::new();
    while first <= last {
        // The widest network starting at `first` that ends by `last`.
        let mut host = first.trailing_zeros().min(bits);
        while host > 0 && first | host_mask(bits, (bits - host) as u8) > last {
            host -= 1;
        }
        let prefix = (bits - host) as u8;
        out.push((first, prefix));
        let end = first | host_mask(bits, prefix);
        match end.checked_add(1) {
            Some(n) if end < host_mask(bits, 0) => first = n,
            _ => break,
        }
    }
    out
}

/// The prefix length when `first..=last` (two addresses of one family) is
/// exactly one network.
pub(crate) fn prefix_of(first: &Value, last: &Value) -> Option<u8> {
    let (bits, a, b) = match (first, last) {
        (Value::Ipv4(a), Value::Ipv4(b)) => {
            (32, u128::from(u32::from(*a)), u128::from(u32::from(*b)))
        }
        (Value::Ipv6(a), Value::Ipv6(b)) => (128, u128::from(*a), u128::from(*b)),
        _ => return None,
    };
    match cidrs_u128(bits, a, b).as_slice() {
        [(_, p)] => Some(*p),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(s: &str, nomatch: bool) -> NetRule<'static> {
        let (a, p) = s.split_once('/').unwrap();
        NetRule {
            addr: a.parse().unwrap(),
            prefix: p.parse().unwrap(),
            nomatch,
            comment: None,
        }
    }

    fn show(r: &[AddrRange<'_>]) -> Vec<String> {
        r.iter()
            .map(|r| format!("{}-{}", r.first, r.last))
            .collect()
    }

    #[test]
    fn nomatch_holes_and_unions() {
        let got = matching_ranges(
            Family::V4,
            &[
                rule("10.0.0.0/8", false),
                rule("10.1.0.0/16", true),
                rule("10.1.2.0/24", false),
                rule("10.0.0.0/9", false),
                rule("11.0.0.0/8", false),
                rule("192.168.0.0/16", true),
            ],
        )
        .unwrap();
        assert_eq!(
            show(&got),
            [
                "10.0.0.0-10.0.255.255",
                "10.1.2.0-10.1.2.255",
                "10.2.0.0-11.255.255.255",
            ]
        );
        // /0 as two halves, the whole space; and a nomatch /32 at the top.
        let got = matching_ranges(
            Family::V4,
            &[
                rule("0.0.0.0/1", false),
                rule("128.0.0.0/1", false),
                rule("255.255.255.255/32", true),
            ],
        )
        .unwrap();
        assert_eq!(show(&got), ["0.0.0.0-255.255.255.254"]);
        let got = matching_ranges(Family::V6, &[rule("::/0", false)]).unwrap();
        assert_eq!(show(&got), [format!("::-{}", Ipv6Addr::from(u128::MAX))]);
        assert!(matching_ranges(Family::V6, &[rule("10.0.0.0/8", false)]).is_err());
        // The same network twice: nomatch wins.
        let got = matching_ranges(
            Family::V4,
            &[rule("10.0.0.0/8", false), rule("10.0.0.0/8", true)],
        )
        .unwrap();
        assert!(got.is_empty());
    }

    #[test]
    fn comments_split_ranges() {
        let a = Comment::parse("a").unwrap();
        let b = Comment::parse("b").unwrap();
        let rules = [
            NetRule {
                comment: Some(&a),
                ..rule("10.0.0.0/9", false)
            },
            NetRule {
                comment: Some(&b),
                ..rule("10.128.0.0/9", false)
            },
            NetRule {
                comment: Some(&a),
                ..rule("11.0.0.0/8", false)
            },
        ];
        let got = matching_ranges(Family::V4, &rules).unwrap();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[1].comment, Some(&b));
    }

    #[test]
    fn cidrs_of_ranges() {
        let c = |a: &str, b: &str| {
            cidrs(a.parse().unwrap(), b.parse().unwrap())
                .into_iter()
                .map(|(a, p)| format!("{a}/{p}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(c("10.0.0.0", "10.255.255.255"), ["10.0.0.0/8"]);
        assert_eq!(
            c("10.0.0.1", "10.0.0.6"),
            ["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"]
        );
        assert_eq!(c("0.0.0.0", "255.255.255.255"), ["0.0.0.0/0"]);
        assert_eq!(
            c("255.255.255.255", "255.255.255.255"),
            ["255.255.255.255/32"]
        );
        assert_eq!(c("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), ["::/0"]);
        assert!(c("10.0.0.2", "10.0.0.1").is_empty());
        assert!(c("10.0.0.2", "::1").is_empty());
    }

    /// ipset's rule, naively: the longest prefix containing `a` decides.
    fn ipset_matches(bits: u32, rules: &[(u128, u8, bool)], a: u128) -> bool {
        let mut best: Option<(u8, bool)> = None;
        for &(addr, prefix, nomatch) in rules {
            let m = host_mask(bits, prefix);
            if addr & !m == a & !m {
                best = match best {
                    Some((p, n)) if p == prefix => Some((p, n || nomatch)),
                    Some((p, _)) if p > prefix => best,
                    _ => Some((prefix, nomatch)),
                };
            }
        }
        best.is_some_and(|(_, nomatch)| !nomatch)
    }

    fn in_ranges(r: &[(u128, u128, ())], a: u128) -> bool {
        let i = r.partition_point(|&(_, last, _)| last < a);
        r.get(i).is_some_and(|&(first, _, _)| first <= a)
    }

    fn check(
        bits: u32,
        rules: Vec<(u128, u8, bool)>,
        probes: Vec<u128>,
    ) -> Result<(), TestCaseError> {
        let raw = rules
            .iter()
            .map(|&(a, p, n)| {
                let start = a & !host_mask(bits, p);
                Raw {
                    start,
                    end: start | host_mask(bits, p),
                    prefix: p,
                    nomatch: n,
                    comment: (),
                }
            })
            .collect();
        let r = ranges(bits, raw);
        // Sorted, disjoint, not adjacent (no comments here: all merge).
        for w in r.windows(2) {
            prop_assert!(w[0].1.checked_add(1).is_some_and(|n| n < w[1].0), "{r:?}");
        }
        for &(first, last, _) in &r {
            prop_assert!(first <= last);
            // The ends and their neighbours are where mistakes show.
            for a in [first, last, first.wrapping_sub(1), last.wrapping_add(1)] {
                let a = a & host_mask(bits, 0);
                prop_assert_eq!(in_ranges(&r, a), ipset_matches(bits, &rules, a), "{:#x}", a);
            }
            // Back to networks: they cover the range exactly.
            let nets = cidrs_u128(bits, first, last);
            prop_assert_eq!(nets.first().map(|n| n.0), Some(first));
            let end = nets.last().map(|&(a, p)| a | host_mask(bits, p));
            prop_assert_eq!(end, Some(last));
        }
        for a in probes {
            let a = a & host_mask(bits, 0);
            prop_assert_eq!(in_ranges(&r, a), ipset_matches(bits, &rules, a), "{:#x}", a);
        }
        // Every rule's own network start and end.
        for &(addr, p, _) in &rules {
            let s = addr & !host_mask(bits, p);
            for a in [s, s | host_mask(bits, p)] {
                prop_assert_eq!(in_ranges(&r, a), ipset_matches(bits, &rules, a));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// IPv4 in a small space (10.0.0.0/20 and short prefixes), so that
        /// nesting and nomatch inside nomatch happen all the time.
        #[test]
        fn ipv4_ranges_match_ipset(
            rules in prop::collection::vec((0u32..4096, 18u8..=32, any::<bool>()), 0..24),
            wide in prop::collection::vec((any::<u32>(), 0u8..=8, any::<bool>()), 0..3),
            probes in prop::collection::vec(0u32..4096, 64),
        ) {
            let base = 0x0a00_0000u128;
            let mut all: Vec<(u128, u8, bool)> =
                rules.into_iter().map(|(a, p, n)| (base + u128::from(a), p, n)).collect();
            all.extend(wide.into_iter().map(|(a, p, n)| (u128::from(a), p, n)));
            let probes = probes.into_iter().map(|a| base + u128::from(a)).collect();
            check(32, all, probes)?;
        }

        #[test]
        fn ipv6_ranges_match_ipset(
            rules in prop::collection::vec((0u128..1 << 16, 112u8..=128, any::<bool>()), 0..24),
            wide in prop::collection::vec((any::<u128>(), 0u8..=16, any::<bool>()), 0..3),
            probes in prop::collection::vec(0u128..1 << 16, 64),
        ) {
            let base = 0x2001_0db8u128 << 96;
            let mut all: Vec<(u128, u8, bool)> =
                rules.into_iter().map(|(a, p, n)| (base + a, p, n)).collect();
            all.extend(wide);
            let probes = probes.into_iter().map(|a| base + a).collect();
            check(128, all, probes)?;
        }

        #[test]
        fn cidrs_are_minimal_and_exact(a in any::<u32>(), b in any::<u32>()) {
            let (first, last) = (a.min(b), a.max(b));
            let nets = cidrs_u128(32, u128::from(first), u128::from(last));
            let mut at = u128::from(first);
            for &(n, p) in &nets {
                prop_assert_eq!(n, at);
                prop_assert_eq!(n & host_mask(32, p), 0, "aligned");
                at = (n | host_mask(32, p)) + 1;
            }
            prop_assert_eq!(at, u128::from(last) + 1);
            // Minimal: no two neighbours merge into one network.
            for w in nets.windows(2) {
                let merged = w[0].1 == w[1].1 && w[0].1 > 0
                    && w[0].0 & host_mask(32, w[0].1 - 1) == 0;
                prop_assert!(!merged, "{:?}", nets);
            }
        }
    }
}
