//! The rules of bitmap policies (bitmap:ip, bitmap:port): a `range` is
//! required and sizes the set; `maxElem` and `hashSize` do not apply;
//! bitmap:ip is IPv4 only; every member lies within the range.

use std::sync::Arc;

use super::MAX_MEMBER_ERRORS;
use super::errors::{PolicyError, PolicyErrorKind};
use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy};
use ipsetmgr_ipset::{MemberSet, SetRange, SetType};

/// The policy's range, when it has a valid one (errors come from
/// [`header_errors`]).
pub(crate) fn range(p: &IPSetPolicy) -> Option<SetRange> {
    let text = p.spec.range.as_deref()?;
    SetRange::parse(p.spec.set_type, text).ok()
}

/// What is wrong with a policy's bitmap fields (its range, and the fields
/// that do not apply to its type).
pub(crate) fn header_errors(name: &str, p: &IPSetPolicy) -> Vec<PolicyError> {
    let t = p.spec.set_type;
    let mut errors = Vec::new();
    let mut fail = |kind| errors.push(PolicyError::of_policy(name, kind));
    match (&p.spec.range, t.is_bitmap()) {
        (None, true) => fail(PolicyErrorKind::RangeRequired(t)),
        (Some(_), false) => fail(PolicyErrorKind::NotApplicable {
            field: "range",
            set_type: t,
        }),
        (Some(text), true) => {
            if let Err(e) = SetRange::parse(t, text) {
                fail(PolicyErrorKind::BadRange(e));
            }
        }
        (None, false) => {}
    }
    if t.is_bitmap() {
        if p.spec.max_elem.is_some() {
            fail(PolicyErrorKind::NotApplicable {
                field: "maxElem",
                set_type: t,
            });
        }
        if p.spec.hash_size.is_some() {
            fail(PolicyErrorKind::NotApplicable {
                field: "hashSize",
                set_type: t,
            });
        }
    }
    if t == SetType::BitmapIp && p.spec.family != FamilySpec::IPv4 {
        fail(PolicyErrorKind::Ipv4Only(t));
    }
    errors
}

/// Members outside the policy's range (the kernel would refuse them).
pub fn outside_range(name: &str, range: SetRange, sets: &[Arc<MemberSet>]) -> Vec<PolicyError> {
    let mut outside: Vec<String> = sets
        .iter()
        .flat_map(|s| s.iter())
        .filter(|m| !range.contains(m))
        .map(|m| m.to_string())
        .collect();
    // Stable messages: the first members in canonical order.
    outside.sort();
    outside
        .into_iter()
        .take(MAX_MEMBER_ERRORS)
        .map(|member| PolicyError {
            policy: name.to_string(),
            slice: None,
            member: Some(member),
            kind: PolicyErrorKind::OutsideRange(range),
        })
        .collect()
}
