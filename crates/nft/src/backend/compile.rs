//! Desired sets into nft sets: the shape and elements of each, list:sets
//! flattened, and how nft errors are classified for the reconciler.

use std::collections::{BTreeSet, HashMap};

use ipsetmgr_ipset::{HeaderOptions, Member, MemberSet, SetHeader, SetKind, SetType};
use ipsetmgr_sets::{DesiredSet, ErrorKind, KernelError, SetError};

use crate::{Elements, NftError, NftSetSpec, SetShape, UnrepresentableMember};

/// What nft holds for one desired set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compiled {
    pub shape: SetShape,
    pub elements: Elements,
}

/// Why a list:set cannot become one nft set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FlattenError {
    #[error(
        "list:set {list} lists {member}, which is no desired set here (its policy failed or is missing)"
    )]
    Unknown { list: String, member: String },
    /// nft holds a list:set as a copy of what it lists, and a held set's
    /// members are known only to the kernel: the list stays as it is.
    #[error(
        "list:set {list} lists {member}, whose policy is held (it failed): the nft set is kept as the kernel holds it until that policy applies"
    )]
    Held { list: String, member: String },
    #[error(
        "list:set {list} lists sets of different element types ({first} and {other}): one nft set holds one type; use one lookup per listed set instead"
    )]
    Mixed {
        list: String,
        first: SetKind,
        other: SetKind,
    },
    #[error("list:set {0} lists no set: nft needs an element type to create it")]
    Empty(String),
}

/// Not "not supported by this kernel": no kernel's nf_tables can hold it.
fn unsupported(kind: SetKind, why: impl std::fmt::Display) -> SetError {
    SetError::Unrepresentable(format!("{kind} cannot be an nft set: {why}"))
}

fn bad_member(set: &str, e: UnrepresentableMember) -> SetError {
    SetError::Unrepresentable(format!(
        "nft set {set} cannot hold member {}: {}",
        e.member, e.reason
    ))
}

fn is_nomatch(m: &Member) -> bool {
    match m {
        Member::Net { nomatch, .. } | Member::NetPort { nomatch, .. } => *nomatch,
        Member::IpPortNet(e) => e.nomatch,
        Member::NetIface(e) => e.nomatch,
        _ => false,
    }
}

/// The shape and elements of `d`. `by_ipset_name` holds every desired set
/// of the same call, for the list:sets to flatten.
pub(crate) fn compile(
    nft_name: &str,
    d: &DesiredSet,
    by_ipset_name: &HashMap<&str, &DesiredSet>,
    held: &BTreeSet<String>,
) -> Result<Compiled, SetError> {
    if !crate::is_valid_name(nft_name) {
        // A prefix that starts with a digit, say: refused before it costs a
        // failed transaction per apply.
        return Err(SetError::Unrepresentable(format!(
            "{nft_name} is not a set name nf_tables takes (a letter first, then letters, digits, _ - . /)"
        )));
    }
    if d.header.kind.set_type == SetType::ListSet {
        return flatten(nft_name, d, by_ipset_name, held).map(room_for_ranges);
    }
    let shape = SetShape::from_header(&d.header).map_err(|e| unsupported(d.header.kind, e))?;
    let elements = shape
        .elements_of_set(&d.members)
        .map_err(|e| bad_member(nft_name, e))?;
    Ok(room_for_ranges(Compiled { shape, elements }))
}

/// An interval set's size is its ranges when they are more than its
/// `maxElem`: a policy whose members fit `maxElem` must fit its nft set
/// too, and hash:net,iface's ranges can outnumber its members (each
/// interface loses the networks only other interfaces have, which can cut
/// one of its ranges in two; docs/nftables.md). For the other types a
/// nomatch entry splits at most one range, so their ranges are never more
/// than their members.
fn room_for_ranges(mut c: Compiled) -> Compiled {
    let ranges = u32::try_from(c.elements.len()).unwrap_or(u32::MAX);
    if c.shape.spec.interval && c.shape.spec.size.is_some_and(|size| size < ranges) {
        c.shape.spec.size = Some(ranges);
    }
    c
}

/// The compile of `new` from `old`, the compile of `old_members`, when
/// that is cheap and certain to equal [`compile`]: the shape keeps its key
/// and has no interval part (every member is exactly one element), no
/// element carries a comment, and `old` has one element per member (no two
/// members share a key, so taking out the elements of the members that
/// went takes out nothing that stays). Only the members that changed are
/// encoded; the elements are then spliced (see [`Elements::splice`],
/// which refuses comments). `None` means: compile it.
pub(crate) fn patch(old: &Compiled, old_members: &MemberSet, new: &DesiredSet) -> Option<Compiled> {
    if new.header.kind.set_type == SetType::ListSet || new.members.kind() != old_members.kind() {
        return None;
    }
    let shape = SetShape::from_header(&new.header).ok()?;
    let same_shape = shape.kind == old.shape.kind
        && shape.spec.key == old.shape.spec.key
        && shape.comments == old.shape.comments
        && shape.netmask == old.shape.netmask;
    if !same_shape
        || shape.spec.interval
        || old.shape.spec.interval
        || shape.netmask.is_some()
        || old.elements.has_comments()
        || old.elements.len() != old_members.len()
    {
        return None;
    }
    let (adds, dels) = new.members.diff_both(old_members);
    // A member that cannot be an element: the full compile names it.
    let add = shape.elements(adds.iter()).ok()?;
    let del = shape.elements(dels.iter()).ok()?;
    let elements = old.elements.splice(&del, &add)?;
    Some(Compiled { shape, elements })
}

/// A list:set as one set holding what any set it lists matches: the union
/// of the listed sets' elements, when they are all of one type and family.
/// Each listed set is compiled on its own first, so a nomatch entry cuts
/// only its own set's networks (ipset tests the listed sets one by one),
/// and the union of the ranges is merged again.
fn flatten(
    nft_name: &str,
    d: &DesiredSet,
    by_ipset_name: &HashMap<&str, &DesiredSet>,
    held: &BTreeSet<String>,
) -> Result<Compiled, SetError> {
    let mut parts: Vec<&DesiredSet> = Vec::new();
    for m in d.members.iter() {
        let Member::Set(name) = m.without_comment() else {
            continue;
        };
        let listed = by_ipset_name
            .get(&**name)
            .filter(|l| l.header.kind.set_type != SetType::ListSet)
            .ok_or_else(|| {
                let (list, member) = (d.name.clone(), name.to_string());
                if held.contains(&member) {
                    FlattenError::Held { list, member }
                } else {
                    FlattenError::Unknown { list, member }
                }
            });
        parts.push(listed.map_err(|e| unsupported(d.header.kind, e))?);
    }
    let Some(first) = parts.first() else {
        return Err(unsupported(
            d.header.kind,
            FlattenError::Empty(d.name.clone()),
        ));
    };
    let kind = first.header.kind;
    let mut comments = false;
    let mut max_elem: u32 = 0;
    for p in &parts {
        // The options (a bitmap's range, a netmask) decide what the
        // elements mean, so they must agree too.
        let same = p.header.kind == kind && p.header.options.mask == first.header.options.mask;
        if !same {
            let e = FlattenError::Mixed {
                list: d.name.clone(),
                first: kind,
                other: p.header.kind,
            };
            return Err(unsupported(d.header.kind, e));
        }
        comments |= p.header.options.comment;
        max_elem = max_elem.saturating_add(p.header.max_elem);
    }
    let header = SetHeader {
        kind,
        max_elem,
        hash_size: None,
        options: HeaderOptions {
            comment: comments,
            ..first.header.options.clone()
        },
    };
    let shape = SetShape::from_header(&header).map_err(|e| unsupported(kind, e))?;
    // A nomatch entry, or hash:net,iface's rule (the most specific network
    // decides whatever its interface), holds within one listed set only.
    let each_alone = kind.set_type == SetType::HashNetIface
        || parts
            .iter()
            .any(|p| p.members.iter().any(|m| is_nomatch(&m)));
    let elements = if each_alone {
        // Per listed set: its matching ranges, as plain networks.
        let mut all = Vec::new();
        for p in &parts {
            let own = shape
                .elements(p.members.iter())
                .map_err(|e| bad_member(nft_name, e))?;
            all.extend(shape.members(&own).map_err(|e| bad_member(nft_name, e))?);
        }
        shape.union_elements(all.iter())
    } else {
        let sets: Vec<&MemberSet> = parts.iter().map(|p| &*p.members).collect();
        shape.elements(MemberSet::union(kind, &sets).0.iter())
    }
    .map_err(|e| bad_member(nft_name, e))?;
    Ok(Compiled { shape, elements })
}

/// What kind of refusal an nft error is, for the reconciler.
impl From<NftError> for KernelError {
    fn from(e: NftError) -> KernelError {
        let kind = match &e {
            // A table that is gone holds no set: deleting is done.
            NftError::SetMissing(_) | NftError::TableMissing(_) => ErrorKind::SetMissing,
            NftError::SetExists(_) => ErrorKind::SetExists,
            NftError::InUse(_) => ErrorKind::InUse,
            NftError::SetFull(_) => ErrorKind::SetFull,
            NftError::ElementExists { .. }
            | NftError::ElementMissing { .. }
            | NftError::InvalidElement { .. } => ErrorKind::ElementRefused,
            NftError::NotSupported(_) => ErrorKind::NotSupported,
            NftError::Unavailable(_) | NftError::GenerationMoved { .. } => ErrorKind::Unavailable,
            NftError::Protocol(_) => ErrorKind::Protocol,
            NftError::NotOwned(_)
            | NftError::ElementType { .. }
            | NftError::TableOwned { .. }
            | NftError::Other(_) => ErrorKind::Other,
        };
        KernelError::new(kind, e)
    }
}

/// Whether the error says the backend's belief about the kernel is stale
/// (someone changed the table since the last read): re-read, not isolate.
pub(crate) fn is_stale_belief(e: &NftError) -> bool {
    matches!(
        e,
        NftError::SetMissing(_)
            | NftError::SetExists(_)
            | NftError::TableMissing(_)
            | NftError::ElementMissing { .. }
            | NftError::ElementExists { .. }
    )
}

/// The ipset kind an nft set spec stands for, for messages (a bitmap:ip and
/// a hash:ip have the same key: the first one is named).
pub(crate) fn kind_of(spec: &NftSetSpec) -> Option<SetKind> {
    use ipsetmgr_ipset::Family;
    SetType::ALL.into_iter().find_map(|t| {
        [Some(Family::V4), Some(Family::V6), None]
            .into_iter()
            .find_map(|f| {
                let s = SetShape::new(t, f, &HeaderOptions::default(), 1).ok()?;
                (s.spec.key == spec.key && s.spec.interval == spec.interval).then_some(s.kind)
            })
    })
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use std::sync::Arc;

    use ipsetmgr_ipset::{Comment, Family, IpPortIp, Proto};
    use proptest::prelude::*;

    use super::*;

    fn desired(kind: SetKind, options: HeaderOptions, members: Vec<Member>) -> DesiredSet {
        DesiredSet {
            name: "s".into(),
            policy: "p".into(),
            header: SetHeader {
                kind,
                max_elem: 65536,
                hash_size: None,
                options,
            },
            members: Arc::new(MemberSet::from_members(kind, members)),
        }
    }

    fn full(d: &DesiredSet) -> Result<Compiled, SetError> {
        compile("s", d, &HashMap::new(), &BTreeSet::new())
    }

    /// A member of `kind` from a small number (small: changes collide).
    fn member(kind: SetKind, n: u16) -> Member {
        let v4 = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + u32::from(n)));
        let v6 = IpAddr::V6(Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(n)));
        let proto = [Proto::Tcp, Proto::Udp, Proto::Sctp][usize::from(n % 3)];
        match (kind.set_type, kind.family) {
            (SetType::HashIp, Some(Family::V6)) => Member::Ip(v6),
            (SetType::HashIp | SetType::BitmapIp, _) => Member::Ip(v4),
            (SetType::HashIpPort, _) => Member::IpPort {
                addr: v4,
                proto,
                port: n / 3,
            },
            (SetType::HashIpPortIp, _) => Member::IpPortIp(Box::new(IpPortIp {
                addr: v6,
                proto,
                port: n % 7,
                addr2: v6,
            })),
            (SetType::HashIpMark, _) => Member::IpMark {
                addr: v4,
                mark: u32::from(n % 5),
            },
            (SetType::HashMac, _) => Member::Mac([2, 0, 0, 0, (n >> 8) as u8, n as u8]),
            (SetType::BitmapPort, _) => Member::Port(n),
            _ => unreachable!("not an exact kind"),
        }
    }

    fn exact_kinds() -> Vec<SetKind> {
        vec![
            SetKind::new(SetType::HashIp, Some(Family::V4)),
            SetKind::new(SetType::HashIp, Some(Family::V6)),
            SetKind::new(SetType::BitmapIp, Some(Family::V4)),
            SetKind::new(SetType::HashIpPort, Some(Family::V4)),
            SetKind::new(SetType::HashIpPortIp, Some(Family::V6)),
            SetKind::new(SetType::HashIpMark, Some(Family::V4)),
            SetKind::new(SetType::HashMac, None),
            SetKind::new(SetType::BitmapPort, None),
        ]
    }

    proptest! {
        /// Patched elements are the full compile's, whatever changed.
        #[test]
        fn a_patch_is_the_full_compile(
            k in 0usize..8,
            old in proptest::collection::vec(0u16..3000, 0..1500),
            adds in proptest::collection::vec(0u16..3000, 0..40),
            dels in proptest::collection::vec(0u16..3000, 0..40),
            keep_old in any::<bool>(),
        ) {
            let kind = exact_kinds()[k];
            let old_members: Vec<Member> = old.iter().map(|n| member(kind, *n)).collect();
            let mut new_members: Vec<Member> = if keep_old {
                old_members.clone()
            } else {
                Vec::new()
            };
            new_members.retain(|m| !dels.iter().any(|n| member(kind, *n) == *m));
            new_members.extend(adds.iter().map(|n| member(kind, *n)));
            let old_d = desired(kind, HeaderOptions::default(), old_members);
            let new_d = desired(kind, HeaderOptions::default(), new_members);
            let old_c = full(&old_d).unwrap();
            let patched = patch(&old_c, &old_d.members, &new_d);
            let patched = patched.expect("an exact kind without comments is patched");
            prop_assert_eq!(Ok(patched), full(&new_d));
        }
    }

    #[test]
    fn a_member_nft_cannot_hold_is_left_to_the_full_compile() {
        let kind = SetKind::new(SetType::HashIpPort, Some(Family::V4));
        let old = desired(kind, HeaderOptions::default(), vec![member(kind, 1)]);
        let icmp = Member::IpPort {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)),
            proto: Proto::Icmp,
            port: 0,
        };
        let new = desired(kind, HeaderOptions::default(), vec![member(kind, 1), icmp]);
        let c = full(&old).unwrap();
        assert_eq!(patch(&c, &old.members, &new), None);
        assert!(full(&new).is_err());
        // A comment in a set created without comments.
        let wide = SetKind::new(SetType::HashIpPortIp, Some(Family::V6));
        let old = desired(wide, HeaderOptions::default(), vec![member(wide, 1)]);
        let with = member(wide, 2).with_comment(Comment::parse("x").unwrap());
        let new = desired(wide, HeaderOptions::default(), vec![member(wide, 1), with]);
        let c = full(&old).unwrap();
        assert_eq!(patch(&c, &old.members, &new), None);
        assert!(full(&new).is_err());
    }

    #[test]
    fn intervals_comments_and_new_shapes_are_compiled_again() {
        // hash:net: ranges merge, nomatch cuts: never patched.
        let net = SetKind::new(SetType::HashNet, Some(Family::V4));
        let n = |a: u8, nomatch| Member::Net {
            addr: IpAddr::V4(Ipv4Addr::new(10, a, 0, 0)),
            prefix: 16,
            nomatch,
        };
        let old = desired(net, HeaderOptions::default(), vec![n(1, false)]);
        let new = desired(net, HeaderOptions::default(), vec![n(1, false), n(2, true)]);
        let c = full(&old).unwrap();
        assert_eq!(patch(&c, &old.members, &new), None);
        // hash:ip with a netmask holds ranges.
        let ip = SetKind::new(SetType::HashIp, Some(Family::V4));
        let masked = HeaderOptions {
            mask: Some(ipsetmgr_ipset::AddrMask::Prefix(24)),
            ..HeaderOptions::default()
        };
        let old = desired(ip, masked.clone(), vec![member(ip, 1)]);
        let new = desired(ip, masked, vec![member(ip, 1), member(ip, 300)]);
        let c = full(&old).unwrap();
        assert_eq!(patch(&c, &old.members, &new), None);
        // Comments: which one an element keeps is the full compile's call.
        let commented = HeaderOptions {
            comment: true,
            ..HeaderOptions::default()
        };
        let old = desired(ip, commented.clone(), vec![member(ip, 1)]);
        let with = member(ip, 2).with_comment(Comment::parse("x").unwrap());
        let new = desired(ip, commented, vec![member(ip, 1), with]);
        let c = full(&old).unwrap();
        assert_eq!(patch(&c, &old.members, &new), None);
        // Another type: a new shape.
        let port = SetKind::new(SetType::HashIpPort, Some(Family::V4));
        let new = desired(port, HeaderOptions::default(), vec![member(port, 1)]);
        let old = desired(ip, HeaderOptions::default(), vec![member(ip, 1)]);
        let c = full(&old).unwrap();
        assert_eq!(patch(&c, &old.members, &new), None);
    }

    #[test]
    fn a_new_size_is_patched_with_the_new_spec() {
        let ip = SetKind::new(SetType::HashIp, Some(Family::V4));
        let old = desired(ip, HeaderOptions::default(), vec![member(ip, 1)]);
        let mut new = desired(ip, HeaderOptions::default(), vec![member(ip, 2)]);
        new.header.max_elem = 1 << 20;
        let c = full(&old).unwrap();
        let p = patch(&c, &old.members, &new).unwrap();
        assert_eq!(Ok(p), full(&new));
    }
}
