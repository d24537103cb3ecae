//! `spec.except`: addresses a policy's sets never match, whatever its
//! members say (docs/member-sources.md, "Except"). Exact on every type with
//! an address part:
//!
//! - a member whose address part lies inside the except ranges (inside
//!   their union: two /25s cover a /24) drops out;
//! - a network part that holds an except range keeps its member, and the
//!   range is added as a `nomatch` entry with the member's other parts (its
//!   port, interface, or first address). The kernel looks a packet up from
//!   the most specific prefix down, per the entry's other parts, and the
//!   first entry found decides: every address of the range finds the
//!   nomatch entry first, since every entry more specific than it lies
//!   inside it and has dropped. The nft backend turns nomatch entries into
//!   the same intervals, and the bpf backend's LPM trie holds them as they
//!   are, so every backend matches the same addresses;
//! - single-address parts (hash:ip, the ports and mark types, bitmap:ip)
//!   can only be inside or outside, and drop or stay.
//!
//! CIDRs either nest or are disjoint, so after nested except ranges are
//! removed, those overlapping a member are all inside it or one holds it.
//! Types without nomatch cannot hold part of a network: hash:ip with a
//! netmask refuses a range that cuts one of its entries (cutting it into
//! exact CIDRs is impossible, since the set stores /netmask entries only),
//! and bitmask is refused outright (its entries are no ranges).

use std::net::IpAddr;
use std::sync::Arc;

use super::errors::{ExceptEntryError, PolicyError, PolicyErrorKind};
use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy, MAX_EXCEPT};
use ipsetmgr_ipset::{
    AddrMask, Family, IpPortNet, Member, MemberSet, MemberSetBuilder, NetIface, SetType,
};

/// One except range: host bits cleared; `lo..=hi` as numbers of its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    addr: IpAddr,
    prefix: u8,
    lo: u128,
    hi: u128,
}

impl Range {
    fn new(addr: IpAddr, prefix: u8) -> Range {
        let (lo, hi) = span(addr, prefix);
        Range {
            addr: ipsetmgr_ipset::mask(addr, prefix),
            prefix,
            lo,
            hi,
        }
    }
}

/// The first and last address of `addr/prefix`, as numbers.
fn span(addr: IpAddr, prefix: u8) -> (u128, u128) {
    let bits = u32::from(Family::of(&addr).max_prefix());
    let host = ipsetmgr_ipset::host_mask(bits, prefix);
    let value = ipsetmgr_ipset::to_u128(addr);
    (value & !host, value | host)
}

/// A policy's except ranges of one family: sorted, nested ones removed, so
/// disjoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ranges(Vec<Range>);

/// What the except ranges do to one address part.
#[derive(Debug, PartialEq, Eq)]
enum Verdict<'r> {
    Keep,
    Drop,
    /// The part holds these ranges (each strictly inside it), and is not
    /// covered by them.
    Cut(&'r [Range]),
}

impl Ranges {
    fn from(mut v: Vec<Range>) -> Ranges {
        // Outer ranges first among those that start together.
        v.sort_by_key(|r| (r.lo, r.prefix));
        let mut out: Vec<Range> = Vec::with_capacity(v.len());
        for r in v {
            match out.last() {
                Some(last) if r.hi <= last.hi => {} // nested in (or equal to) last
                _ => out.push(r),
            }
        }
        Ranges(out)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn verdict(&self, addr: IpAddr, prefix: u8) -> Verdict<'_> {
        let (lo, hi) = span(addr, prefix);
        let v = &self.0;
        // A range starting before the part holds it, or ends before it.
        let first = v.partition_point(|r| r.lo < lo);
        if first > 0 && v[first - 1].hi >= hi {
            return Verdict::Drop;
        }
        let end = first + v[first..].partition_point(|r| r.lo <= hi);
        let inside = &v[first..end];
        let Some(head) = inside.first() else {
            return Verdict::Keep;
        };
        // One starting with the part and at least as wide holds it.
        if head.lo == lo && head.hi >= hi {
            return Verdict::Drop;
        }
        // Covered by the union: contiguous from lo to hi.
        let contiguous = head.lo == lo
            && inside.windows(2).all(|w| w[1].lo == w[0].hi + 1)
            && inside.last().is_some_and(|r| r.hi == hi);
        if contiguous {
            Verdict::Drop
        } else {
            Verdict::Cut(inside)
        }
    }
}

/// A policy's except ranges, per family slot of its sets (the order of
/// `checks::families`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExceptList {
    pub per_family: Vec<Ranges>,
}

impl ExceptList {
    pub(crate) fn is_empty(&self) -> bool {
        self.per_family.iter().all(Ranges::is_empty)
    }
}

/// Parse `spec.except` and `extra` (the except ranges a caller adds, e.g.
/// the cluster's own networks) for the policy's families.
pub(crate) fn parse(
    name: &str,
    p: &IPSetPolicy,
    extra: &[String],
    families: &[Option<Family>],
) -> Result<ExceptList, Vec<PolicyError>> {
    let entries: Vec<&String> = p.spec.except.iter().chain(extra).collect();
    let mut out = ExceptList {
        per_family: vec![Ranges::default(); families.len()],
    };
    if entries.is_empty() {
        return Ok(out);
    }
    let fail = |kind| Err(vec![PolicyError::of_policy(name, kind)]);
    let t = p.spec.set_type;
    if matches!(t, SetType::ListSet | SetType::HashMac | SetType::BitmapPort) {
        return fail(PolicyErrorKind::ExceptUnsupported(t));
    }
    if p.spec.except.len() > MAX_EXCEPT {
        return fail(PolicyErrorKind::ExceptTooMany {
            count: p.spec.except.len(),
            max: MAX_EXCEPT,
        });
    }
    if p.spec.bitmask.is_some() {
        return fail(PolicyErrorKind::ExceptWithBitmask);
    }
    let mut errors = Vec::new();
    let mut per_family: Vec<Vec<Range>> = vec![Vec::new(); families.len()];
    for entry in entries {
        match parse_entry(entry) {
            Err(why) => errors.push(PolicyError::of_policy(
                name,
                PolicyErrorKind::ExceptBad {
                    entry: entry.clone(),
                    why,
                },
            )),
            Ok(ranges) => {
                for r in ranges {
                    let found = Family::of(&r.addr);
                    match families.iter().position(|f| *f == Some(found)) {
                        Some(i) => per_family[i].push(r),
                        None => errors.push(PolicyError::of_policy(
                            name,
                            PolicyErrorKind::ExceptWrongFamily {
                                entry: entry.clone(),
                                found,
                                expected: family_text(p),
                            },
                        )),
                    }
                }
            }
        }
    }
    if !errors.is_empty() {
        errors.dedup();
        return Err(errors);
    }
    out.per_family = per_family.into_iter().map(Ranges::from).collect();
    Ok(out)
}

fn family_text(p: &IPSetPolicy) -> String {
    match (p.spec.set_type.only_family(), p.spec.family) {
        (Some(f), _) => f.to_string(),
        (None, FamilySpec::IPv4) => Family::V4.to_string(),
        (None, FamilySpec::IPv6) => Family::V6.to_string(),
        (None, FamilySpec::Dual) => "Dual".to_string(),
    }
}

/// One except entry: a CIDR or an address (its host bits cleared; `/0` is
/// two halves, as hash:net members are).
fn parse_entry(entry: &str) -> Result<Vec<Range>, ExceptEntryError> {
    let parsed = Member::parse_user(SetType::HashNet, entry)?;
    parsed
        .members
        .into_iter()
        .map(|m| match m {
            Member::Net {
                addr,
                prefix,
                nomatch: false,
            } => Ok(Range::new(addr, prefix)),
            _ => Err(ExceptEntryError::NotPlain),
        })
        .collect()
}

/// A set's members with the except ranges applied, and how many members
/// dropped or were cut. `set` itself (no copy) when nothing changes.
pub(crate) struct Applied {
    pub set: Arc<MemberSet>,
    pub excepted: u64,
    /// nomatch entries added.
    pub added: usize,
}

/// Apply `ranges` to one family's set. `netmask`: hash:ip's, under which
/// each entry stands for its /netmask network.
pub(crate) fn apply(
    name: &str,
    set: &Arc<MemberSet>,
    ranges: &Ranges,
    netmask: Option<AddrMask>,
) -> Result<Applied, Box<PolicyError>> {
    let unchanged = || Applied {
        set: set.clone(),
        excepted: 0,
        added: 0,
    };
    if ranges.is_empty() || set.is_empty() {
        return Ok(unchanged());
    }
    let mut out = MemberSetBuilder::with_capacity(set.kind(), set.len());
    let (mut excepted, mut kept) = (0u64, 0usize);
    for member in set.iter() {
        let bare = member.without_comment();
        let nomatch = bare.is_nomatch();
        match verdict(ranges, bare, netmask) {
            Verdict::Keep => {
                kept += 1;
                out.push(member);
            }
            Verdict::Drop => excepted += u64::from(!nomatch),
            // A nomatch entry that holds a range: nothing to add.
            Verdict::Cut(_) if nomatch => {
                kept += 1;
                out.push(member);
            }
            Verdict::Cut(inside) => {
                let Some(twin) = nomatch_at(bare, inside[0]) else {
                    // A type without nomatch: hash:ip under a netmask.
                    let prefix = match netmask {
                        Some(AddrMask::Prefix(n)) => n,
                        _ => 0,
                    };
                    return Err(Box::new(PolicyError::of_policy(
                        name,
                        PolicyErrorKind::ExceptCutsEntry {
                            entry: format!("{}/{}", inside[0].addr, inside[0].prefix),
                            member: bare.to_string(),
                            prefix,
                        },
                    )));
                };
                out.push(twin);
                for r in &inside[1..] {
                    out.push(nomatch_at(bare, *r).expect("same member, same type"));
                }
                excepted += 1;
                kept += 1;
                out.push(member);
            }
        }
    }
    if excepted == 0 {
        return Ok(unchanged());
    }
    let (set, _duplicates) = out.finish();
    // Kept members are distinct, and no added entry equals one (every
    // entry inside a range dropped); an entry added for several members
    // counts once.
    let added = set.len().saturating_sub(kept);
    Ok(Applied {
        set: Arc::new(set),
        excepted,
        added,
    })
}

/// The verdict on a member: the strictest over its address parts.
fn verdict<'r>(ranges: &'r Ranges, m: &Member, netmask: Option<AddrMask>) -> Verdict<'r> {
    let host = |a: &IpAddr| Family::of(a).max_prefix();
    match m {
        Member::Ip(a) => {
            let prefix = match netmask {
                Some(AddrMask::Prefix(n)) => n,
                _ => host(a),
            };
            ranges.verdict(*a, prefix)
        }
        Member::IpPort { addr, .. } | Member::IpMark { addr, .. } => {
            ranges.verdict(*addr, host(addr))
        }
        Member::Net { addr, prefix, .. } | Member::NetPort { addr, prefix, .. } => {
            ranges.verdict(*addr, *prefix)
        }
        Member::NetIface(e) => ranges.verdict(e.addr, e.prefix),
        Member::IpPortIp(e) => match ranges.verdict(e.addr, host(&e.addr)) {
            Verdict::Drop => Verdict::Drop,
            _ => ranges.verdict(e.addr2, host(&e.addr2)),
        },
        Member::IpPortNet(e) => match ranges.verdict(e.addr, host(&e.addr)) {
            Verdict::Drop => Verdict::Drop,
            _ => ranges.verdict(e.net, e.prefix),
        },
        Member::Commented(c) => verdict(ranges, &c.member, netmask),
        Member::Mac(_) | Member::Set(_) | Member::Port(_) => Verdict::Keep,
    }
}

/// `m` with its network part replaced by `r`, as a nomatch entry without
/// comment; `None` for types without nomatch.
fn nomatch_at(m: &Member, r: Range) -> Option<Member> {
    let (addr, prefix) = (r.addr, r.prefix);
    Some(match m {
        Member::Net { .. } => Member::Net {
            addr,
            prefix,
            nomatch: true,
        },
        Member::NetPort { proto, port, .. } => Member::NetPort {
            addr,
            prefix,
            proto: *proto,
            port: *port,
            nomatch: true,
        },
        Member::NetIface(e) => Member::NetIface(Box::new(NetIface {
            addr,
            prefix,
            physdev: e.physdev,
            iface: e.iface.clone(),
            nomatch: true,
        })),
        Member::IpPortNet(e) => Member::IpPortNet(Box::new(IpPortNet {
            addr: e.addr,
            proto: e.proto,
            port: e.port,
            net: addr,
            prefix,
            nomatch: true,
        })),
        _ => return None,
    })
}
