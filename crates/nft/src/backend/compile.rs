//! Desired sets into nft sets: the shape and elements of each, list:sets
//! flattened, and nft errors in the manager's vocabulary so that every
//! caller renders them as it renders the ipset side's.

use std::collections::HashMap;

use ipsetmgr_dataplane::DataplaneError;
use ipsetmgr_ipset::{HeaderOptions, Member, MemberSet, SetHeader, SetKind, SetType};
use ipsetmgr_manager::{DesiredSet, SetError};

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
) -> Result<Compiled, SetError> {
    if !crate::is_valid_name(nft_name) {
        // A prefix that starts with a digit, say: refused before it costs a
        // failed transaction per apply.
        return Err(SetError::Kernel(DataplaneError::Other(format!(
            "{nft_name} is not a set name nf_tables takes (a letter first, then letters, digits, _ - . /)"
        ))));
    }
    if d.header.kind.set_type == SetType::ListSet {
        return flatten(nft_name, d, by_ipset_name);
    }
    let shape = SetShape::from_header(&d.header).map_err(|e| unsupported(d.header.kind, e))?;
    let elements = shape
        .elements(d.members.iter())
        .map_err(|e| bad_member(nft_name, e))?;
    Ok(Compiled { shape, elements })
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
) -> Result<Compiled, SetError> {
    let mut parts: Vec<&DesiredSet> = Vec::new();
    for m in d.members.iter() {
        let Member::Set(name) = m.without_comment() else {
            continue;
        };
        let listed = by_ipset_name
            .get(&**name)
            .filter(|l| l.header.kind.set_type != SetType::ListSet)
            .ok_or_else(|| FlattenError::Unknown {
                list: d.name.clone(),
                member: name.to_string(),
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
    let nomatch = parts
        .iter()
        .any(|p| p.members.iter().any(|m| is_nomatch(&m)));
    let members: Vec<Member> = if nomatch {
        // Per listed set: its matching ranges, as plain networks.
        let mut all = Vec::new();
        for p in &parts {
            let own = shape
                .elements(p.members.iter())
                .map_err(|e| bad_member(nft_name, e))?;
            all.extend(shape.members(&own).map_err(|e| bad_member(nft_name, e))?);
        }
        all
    } else {
        let sets: Vec<&MemberSet> = parts.iter().map(|p| &*p.members).collect();
        MemberSet::union(kind, &sets).0.iter().collect()
    };
    let elements = shape
        .elements(members.iter())
        .map_err(|e| bad_member(nft_name, e))?;
    Ok(Compiled { shape, elements })
}

/// An nft error as the manager's callers know errors.
pub(crate) fn to_dataplane(e: &NftError) -> DataplaneError {
    match e.clone() {
        NftError::SetMissing(s) => DataplaneError::SetMissing(s),
        NftError::SetExists(s) => DataplaneError::SetExists(s),
        NftError::InUse(s) => DataplaneError::InUse(s),
        NftError::SetFull(s) => DataplaneError::SetFull(s),
        NftError::ElementExists { set, element } => DataplaneError::InvalidElement {
            set,
            element,
            reason: "overlaps another element of the interval set".into(),
        },
        NftError::ElementMissing { set, element } => DataplaneError::InvalidElement {
            set,
            element,
            reason: "no such element to delete".into(),
        },
        NftError::InvalidElement {
            set,
            element,
            reason,
        } => DataplaneError::InvalidElement {
            set,
            element,
            reason,
        },
        NftError::NotSupported(s) => DataplaneError::TypeNotSupported(s),
        NftError::Unavailable(s) => DataplaneError::Unavailable(s),
        NftError::Protocol(s) => DataplaneError::Protocol(s),
        other @ (NftError::TableMissing(_)
        | NftError::NotOwned(_)
        | NftError::ElementType { .. }
        | NftError::Other(_)) => DataplaneError::Other(other.to_string()),
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
