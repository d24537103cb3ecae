//! hash:ip's `netmask` and `bitmask`: which policies may set them, the mask
//! each family's set gets, and the members as the kernel stores them (each
//! address masked, so that the compiled members equal the kernel's listing).

use std::sync::Arc;

use super::MAX_MEMBER_ERRORS;
use super::errors::{PolicyError, PolicyErrorKind};
use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy};
use ipsetmgr_ipset::{AddrMask, Family, Member, MemberSet, SetType};

/// The mask of the policy's set of `family` (`None`: none, or invalid,
/// which [`header_errors`] reports).
pub(crate) fn mask(p: &IPSetPolicy, family: Option<Family>) -> Option<AddrMask> {
    let family = family?;
    if let Some(n) = p.spec.netmask {
        return AddrMask::prefix(n, family).ok().flatten();
    }
    let bits = p.spec.bitmask.as_deref()?;
    AddrMask::bits(bits, family).ok().flatten()
}

/// What is wrong with a policy's netmask or bitmask.
pub(crate) fn header_errors(name: &str, p: &IPSetPolicy) -> Vec<PolicyError> {
    let t = p.spec.set_type;
    let mut errors = Vec::new();
    let mut fail = |kind| errors.push(PolicyError::of_policy(name, kind));
    let (netmask, bitmask) = (p.spec.netmask, p.spec.bitmask.as_deref());
    if netmask.is_none() && bitmask.is_none() {
        return errors;
    }
    if t != SetType::HashIp {
        let field = if netmask.is_some() {
            "netmask"
        } else {
            "bitmask"
        };
        fail(PolicyErrorKind::NotApplicable { field, set_type: t });
        return errors;
    }
    if netmask.is_some() && bitmask.is_some() {
        fail(PolicyErrorKind::MasksExclusive);
        return errors;
    }
    let families = match p.spec.family {
        FamilySpec::IPv4 => vec![Family::V4],
        FamilySpec::IPv6 => vec![Family::V6],
        FamilySpec::Dual if bitmask.is_some() => {
            fail(PolicyErrorKind::BitmaskDual);
            return errors;
        }
        FamilySpec::Dual => vec![Family::V4, Family::V6],
    };
    for f in families {
        let checked = match (netmask, bitmask) {
            (Some(n), _) => AddrMask::prefix(n, f),
            (_, Some(b)) => AddrMask::bits(b, f),
            _ => Ok(None),
        };
        if let Err(e) = checked {
            fail(PolicyErrorKind::BadMask(e));
            break;
        }
    }
    errors
}

/// The members as the kernel stores them under `mask`; a member that
/// masks to the all-zero address is an error (the kernel refuses it).
pub(crate) fn masked(
    name: &str,
    mask: AddrMask,
    set: &MemberSet,
    errors: &mut Vec<PolicyError>,
) -> Arc<MemberSet> {
    let mut out = MemberSet::with_capacity(set.kind(), set.len());
    for m in set.iter() {
        let stored = match m.without_comment() {
            Member::Ip(a) => {
                let bare = Member::Ip(mask.apply(*a));
                match m.comment() {
                    Some(c) => bare.with_comment(c.clone()),
                    None => bare,
                }
            }
            _ => m.clone(),
        };
        if matches!(stored.without_comment(), Member::Ip(a) if a.is_unspecified()) {
            if errors.len() < MAX_MEMBER_ERRORS {
                errors.push(PolicyError {
                    policy: name.to_string(),
                    slice: None,
                    member: Some(m.to_string()),
                    kind: PolicyErrorKind::MaskedToNull(mask),
                });
            }
            continue;
        }
        out.insert(stored);
    }
    Arc::new(out)
}
