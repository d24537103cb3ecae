//! list:set members: names of other policies, resolved to their kernel
//! sets of the list's family. They depend on which policies this node has,
//! so they are resolved on every compile and never cached.

use std::collections::HashMap;

use super::errors::PolicyErrorKind;
use super::{check_name, families};
use ipsetmgr_api::policy::IPSetPolicy;
use ipsetmgr_ipset::{Family, Member, MemberError, Naming, SetType};

/// Resolve a list:set member (a policy name) to the listed kernel set, one
/// per family of the list.
pub(crate) fn list_member(
    own: &str,
    raw: &str,
    naming: &Naming,
    selected: &HashMap<&str, &IPSetPolicy>,
    fams: &[Option<Family>],
) -> Result<Vec<Member>, PolicyErrorKind> {
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(MemberError::ForbiddenCharacters.into());
    }
    if check_name(raw).is_err() {
        return Err(MemberError::BadSetName.into());
    }
    if raw == own {
        return Err(PolicyErrorKind::ListSetSelf);
    }
    let target = selected
        .get(raw)
        .ok_or_else(|| PolicyErrorKind::ListSetMissing(raw.to_string()))?;
    if target.spec.set_type == SetType::ListSet {
        return Err(PolicyErrorKind::ListSetNested(raw.to_string()));
    }
    let target_fams = families(target.spec.family, target.spec.set_type);
    fams.iter()
        .map(|f| {
            let f = if !target.spec.set_type.has_family() {
                None
            } else {
                *f
            };
            if target_fams.contains(&f) {
                Ok(Member::Set(naming.main_set_name(raw, f).into()))
            } else {
                Err(PolicyErrorKind::ListSetFamily(
                    raw.to_string(),
                    f.unwrap_or(Family::V4),
                ))
            }
        })
        .collect()
}
