//! The rules that look at a policy as a whole (its name, its header
//! fields, its kernel names next to the other policies', its merged
//! members), and the small facts they share.

use std::collections::HashMap;
use std::sync::Arc;

use super::errors::{PolicyError, PolicyErrorKind};
use super::limits::MAX_MAX_ELEM;
use super::{DEFAULT_LIST_SIZE, MAX_MEMBER_ERRORS, PolicyInput};
use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy};
use ipsetmgr_ipset::{DEFAULT_MAX_ELEM, Family, Member, MemberSet, Naming, SetType};

/// The largest `hashSize` accepted. The kernel allocates the whole table at
/// creation (8 bytes per bucket: 8 MiB here, on every node) and grows it by
/// itself as members are added, so a larger initial size only lets a
/// policy author take kernel memory from every node (2^26 was 512 MiB per
/// set). The CRD's schema says the same.
pub const MAX_HASH_SIZE: u32 = 1 << 20;
/// The smallest `hashSize` the kernel accepts (IPSET_MIMINAL_HASHSIZE).
pub const MIN_HASH_SIZE: u32 = 64;

/// A policy name is a Kubernetes object name: a lowercase DNS subdomain.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    crate::k8s_names::dns1123_subdomain(name)
}

/// The families of a policy's kernel sets, in order (`None`: family-less).
pub(crate) fn families(spec_family: FamilySpec, set_type: SetType) -> Vec<Option<Family>> {
    if !set_type.has_family() && set_type != SetType::ListSet {
        return vec![None];
    }
    match spec_family {
        FamilySpec::IPv4 => vec![Some(Family::V4)],
        FamilySpec::IPv6 => vec![Some(Family::V6)],
        FamilySpec::Dual => vec![Some(Family::V4), Some(Family::V6)],
    }
}

/// The size of one family's kernel set (ipset's `maxelem`, nft's `size`,
/// the BPF trie's `max_entries`) for `count` members: a bitmap's range; a
/// given `maxElem`, a hard cap; list:set's default; otherwise the size
/// follows the members ([`grown_size`]).
pub(crate) fn set_size(policy: &IPSetPolicy, count: usize, cap: u32) -> u32 {
    if let Some(range) = super::bitmap::range(policy) {
        // At most 65536: a bigger range does not parse.
        return range.len() as u32;
    }
    match (policy.spec.max_elem, policy.spec.set_type) {
        (Some(max), _) => max,
        (None, SetType::ListSet) => DEFAULT_LIST_SIZE,
        (None, _) => grown_size(count, cap),
    }
}

/// The size of a set without `maxElem` (README, "Sets that grow"): the
/// kernel's default (65,536) while the members fit it with a quarter to
/// spare, else the next power of two at or above the members and a
/// quarter. Powers of two, so a list that grows a little at a time is
/// replaced (atomically, by every backend) once per doubling, not at every
/// change. At most `cap` (this cluster's `--max-set-elements`), never below
/// the default; members beyond the cap fail as too many.
pub(crate) fn grown_size(count: usize, cap: u32) -> u32 {
    let ceiling = cap.clamp(DEFAULT_MAX_ELEM, MAX_MAX_ELEM) as usize;
    let wanted = count
        .saturating_add(count / 4)
        .max(DEFAULT_MAX_ELEM as usize);
    wanted
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .min(ceiling) as u32
}

/// Policies whose kernel set names coincide with another policy's: the
/// shortened form of a long name keeps only a hash of the rest, so two
/// names can meet. Both policies fail (neither may silently take the other's
/// set).
pub(crate) fn name_collisions(
    candidates: &[&PolicyInput<'_>],
    naming: &Naming,
) -> HashMap<String, Vec<PolicyError>> {
    let mut owners: HashMap<String, Vec<&str>> = HashMap::new();
    for input in candidates {
        let p = input.policy;
        let name = p.metadata.name.as_deref().unwrap_or("");
        for f in families(p.spec.family, p.spec.set_type) {
            let list = owners.entry(naming.main_set_name(name, f)).or_default();
            if !list.contains(&name) {
                list.push(name);
            }
        }
    }
    let mut errors: HashMap<String, Vec<PolicyError>> = HashMap::new();
    let mut clashing: Vec<(&String, &Vec<&str>)> =
        owners.iter().filter(|(_, o)| o.len() > 1).collect();
    clashing.sort();
    for (set, policies) in clashing {
        for &policy in policies {
            let other = policies.iter().find(|o| **o != policy).copied();
            let kind = PolicyErrorKind::NameCollision {
                set: set.clone(),
                other: other.unwrap_or_default().to_string(),
            };
            errors
                .entry(policy.to_string())
                .or_default()
                .push(PolicyError::of_policy(policy, kind));
        }
    }
    errors
}

/// `maxElem` and `hashSize` within what the kernel can hold.
pub(crate) fn check_header_fields(name: &str, p: &IPSetPolicy) -> Vec<PolicyError> {
    let mut errors = Vec::new();
    let mut check = |field: &'static str, value: Option<u32>, min: u32, max: u32| {
        if let Some(v) = value
            && !(min..=max).contains(&v)
        {
            let kind = PolicyErrorKind::OutOfRange {
                field,
                range: format!("between {min} and {max}"),
                value: v,
            };
            errors.push(PolicyError::of_policy(name, kind));
        }
    };
    check("maxElem", p.spec.max_elem, 1, MAX_MAX_ELEM);
    check("hashSize", p.spec.hash_size, MIN_HASH_SIZE, MAX_HASH_SIZE);
    errors.extend(super::bitmap::header_errors(name, p));
    errors.extend(super::mask::header_errors(name, p));
    errors
}

/// Errors for members that the kernel would merge into one entry (the same
/// network with and without `nomatch`, the same entry with two comments or
/// with and without one), naming both as the user wrote them when the
/// spelling is still at hand (`raw`).
pub(crate) fn nomatch_conflict_errors<'a>(
    name: &str,
    set_type: SetType,
    sets: &[Arc<MemberSet>],
    raw: impl FnOnce() -> Vec<&'a str>,
) -> Vec<PolicyError> {
    let mut errors = Vec::new();
    let conflicts: Vec<(Member, Member)> = sets
        .iter()
        .flat_map(|set| set.nomatch_conflicts(MAX_MEMBER_ERRORS))
        .collect();
    if conflicts.is_empty() {
        return errors;
    }
    // Only on this error path: the members as written, to quote them.
    let raw = raw();
    for (plain, flagged) in conflicts {
        let network = plain.to_string();
        // The user's spelling of each side.
        let spelling = |want: &Member| {
            raw.iter()
                .find(|r| {
                    Member::parse_user(set_type, r)
                        .is_ok_and(|p| p.members.iter().any(|m| m == want))
                })
                .map_or_else(|| want.to_string(), |r| r.to_string())
        };
        let other = spelling(&flagged);
        let kind = if plain.is_nomatch() != flagged.is_nomatch() {
            PolicyErrorKind::NomatchConflict { other, network }
        } else {
            PolicyErrorKind::CommentConflict {
                other,
                entry: plain.key().to_string(),
            }
        };
        errors.push(PolicyError {
            policy: name.to_string(),
            slice: None,
            member: Some(spelling(&plain)),
            kind,
        });
    }
    errors.truncate(MAX_MEMBER_ERRORS);
    errors
}
