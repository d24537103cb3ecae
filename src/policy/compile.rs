//! Turning policies into the desired kernel sets of one node, with every
//! rejection rule listed in `docs/architecture.md` ("Members"). A policy
//! with any bad input yields no sets at all (never a partial apply); its
//! existing kernel sets are held as they are.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use super::selector::{self, SelectorError};
use crate::api::policy::{FamilySpec, IPSetPolicy};
use crate::ipset::{
    DEFAULT_MAX_ELEM, Family, Member, MemberError, MemberSet, MemberSetBuilder, Naming, SetHeader,
    SetKind, SetType,
};
pub use crate::manager::DesiredSet;

/// Default size of a list:set (the kernel's default).
pub const DEFAULT_LIST_SIZE: u32 = 8;
/// The kernel rounds a list:set's size up to this (IP_SET_LIST_MIN_SIZE);
/// the header says what the kernel will report, or every resync would see a
/// mismatch.
const MIN_LIST_SIZE: u32 = 4;
/// At most this many member errors are reported per policy.
const MAX_MEMBER_ERRORS: usize = 10;
/// The largest `hashSize` accepted. The kernel allocates the whole table at
/// creation (8 bytes per bucket: 512 MiB here) and grows it by itself as
/// members are added, so a larger initial size only fails with ENOMEM.
pub const MAX_HASH_SIZE: u32 = 1 << 26;
/// The smallest `hashSize` the kernel accepts (IPSET_MIMINAL_HASHSIZE).
pub const MIN_HASH_SIZE: u32 = 64;

/// Compiled results of hash-type policies, keyed by policy identity and
/// generation. With it an agent parses a policy's members once per
/// generation, and may then drop the member strings from its copy of the
/// policy (see [`MemberCache::is_cached`]).
#[derive(Debug, Default)]
pub struct MemberCache {
    entries: HashMap<String, CacheEntry>,
}

#[derive(Debug)]
struct CacheEntry {
    key: CacheKey,
    result: Result<Vec<DesiredSet>, Vec<PolicyError>>,
}

/// Every spec change bumps the generation; the uid tells a recreated policy
/// of the same name apart.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CacheKey {
    uid: Option<String>,
    generation: i64,
}

impl CacheKey {
    /// Only server objects (with a generation) and hash types are cached:
    /// list:set members resolve against other policies on every compile.
    fn of(p: &IPSetPolicy) -> Option<CacheKey> {
        let generation = p.metadata.generation?;
        (p.spec.set_type != SetType::ListSet).then(|| CacheKey {
            uid: p.metadata.uid.clone(),
            generation,
        })
    }
}

impl MemberCache {
    /// Whether `p`'s compiled result is cached for its current generation:
    /// its member strings are then no longer needed by [`compile_cached`].
    pub fn is_cached(&self, p: &IPSetPolicy) -> bool {
        let name = p.metadata.name.as_deref().unwrap_or("");
        CacheKey::of(p).is_some_and(|k| self.entries.get(name).is_some_and(|e| e.key == k))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyErrorKind {
    #[error("invalid policy name: {0}")]
    BadName(&'static str),
    #[error("{0}")]
    Member(#[from] MemberError),
    #[error("is an {found} member but the policy family is {expected}")]
    WrongFamily { found: Family, expected: Family },
    #[error("{count} members exceed maxElem {max}")]
    TooManyMembers { count: usize, max: u32 },
    #[error("list:set refers to policy {0:?}, which does not exist on this node")]
    ListSetMissing(String),
    #[error("list:set cannot contain itself")]
    ListSetSelf,
    #[error("list:set cannot contain another list:set ({0:?}): the kernel forbids nesting")]
    ListSetNested(String),
    #[error("list:set refers to policy {0:?}, which has no {1} set")]
    ListSetFamily(String, Family),
    #[error("{0}")]
    Selector(#[from] SelectorError),
    #[error("is defined more than once")]
    Duplicate,
    #[error(
        "its kernel set name {set} is also the name of policy {other:?}'s set (the shortened names share their hash); rename one of the two policies"
    )]
    NameCollision { set: String, other: String },
    #[error(
        "conflicts with member {other:?}: both are the network {network}, which the kernel holds as one entry, either matching or excluded (nomatch); keep only one of them"
    )]
    NomatchConflict { other: String, network: String },
    #[error("{field} must be {range} (got {value})")]
    OutOfRange {
        field: &'static str,
        range: String,
        value: u32,
    },
    #[error("and {0} more bad members")]
    More(usize),
}

/// A rejection, naming the policy, the member (when there is one) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub policy: String,
    pub member: Option<String>,
    pub kind: PolicyErrorKind,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.member {
            // escape_debug shows control characters (an injected newline) as text.
            Some(m) => write!(
                f,
                "policy {:?}: member \"{}\" rejected: {}",
                self.policy,
                m.escape_debug(),
                self.kind
            ),
            None => write!(f, "policy {:?}: {}", self.policy, self.kind),
        }
    }
}

impl std::error::Error for PolicyError {}

/// What one node should hold, and what went wrong.
#[derive(Debug, Default)]
pub struct Compiled {
    pub sets: Vec<DesiredSet>,
    /// Policies with errors; their kernel sets are held untouched.
    pub errors: Vec<PolicyError>,
    /// Kernel names of failed policies' sets: never modified nor deleted.
    pub held: Vec<String>,
    /// Policies whose nodeSelector does not select this node.
    pub not_selected: Vec<String>,
}

impl Compiled {
    /// Policy name → its errors, for reports.
    pub fn errors_by_policy(&self) -> BTreeMap<&str, Vec<&PolicyError>> {
        let mut m: BTreeMap<&str, Vec<&PolicyError>> = BTreeMap::new();
        for e in &self.errors {
            m.entry(e.policy.as_str()).or_default().push(e);
        }
        m
    }
}

pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters");
    }
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ends_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !ok_chars || !ends_ok(name.as_bytes()[0]) || !ends_ok(name.as_bytes()[name.len() - 1]) {
        return Err("must be a lowercase DNS subdomain (a-z, 0-9, '-', '.')");
    }
    Ok(())
}

fn families(spec_family: FamilySpec, set_type: SetType) -> Vec<Option<Family>> {
    if set_type == SetType::HashMac {
        return vec![None];
    }
    match spec_family {
        FamilySpec::IPv4 => vec![Some(Family::V4)],
        FamilySpec::IPv6 => vec![Some(Family::V6)],
        FamilySpec::Dual => vec![Some(Family::V4), Some(Family::V6)],
    }
}

fn max_elem(policy: &IPSetPolicy) -> u32 {
    match policy.spec.set_type {
        SetType::ListSet => policy.spec.max_elem.unwrap_or(DEFAULT_LIST_SIZE),
        _ => policy.spec.max_elem.unwrap_or(DEFAULT_MAX_ELEM),
    }
}

/// Compile `policies` for one node. `node_labels`: `None` ignores node
/// selectors (file mode without labels), `Some` evaluates them.
pub fn compile<'a>(
    policies: impl IntoIterator<Item = &'a IPSetPolicy>,
    naming: &Naming,
    node_labels: Option<&BTreeMap<String, String>>,
) -> Compiled {
    compile_cached(policies, naming, node_labels, &mut MemberCache::default())
}

/// [`compile`], reusing and filling `cache`. Entries of policies absent from
/// `policies`, or present with another generation, are dropped.
pub fn compile_cached<'a>(
    policies: impl IntoIterator<Item = &'a IPSetPolicy>,
    naming: &Naming,
    node_labels: Option<&BTreeMap<String, String>>,
    cache: &mut MemberCache,
) -> Compiled {
    let policies: Vec<&IPSetPolicy> = policies.into_iter().collect();
    cache.entries.retain(|name, entry| {
        policies.iter().any(|p| {
            p.metadata.name.as_deref() == Some(name) && CacheKey::of(p).as_ref() == Some(&entry.key)
        })
    });
    let mut out = Compiled::default();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for p in &policies {
        *seen
            .entry(p.metadata.name.as_deref().unwrap_or(""))
            .or_default() += 1;
    }

    // Selection first: list:set references resolve against selected policies.
    let mut selected: HashMap<&str, &IPSetPolicy> = HashMap::new();
    let mut candidates = Vec::new();
    for &p in &policies {
        let name = p.metadata.name.as_deref().unwrap_or("");
        let fail = |kind| PolicyError {
            policy: name.to_string(),
            member: None,
            kind,
        };
        if let Err(why) = check_name(name) {
            out.errors.push(fail(PolicyErrorKind::BadName(why)));
            continue;
        }
        if seen[name] > 1 {
            if !out.errors.iter().any(|e| e.policy == name) {
                out.errors.push(fail(PolicyErrorKind::Duplicate));
                hold(&mut out.held, naming, p);
            }
            continue;
        }
        if let Some(labels) = node_labels {
            match selector::matches(p.spec.node_selector.as_ref(), labels) {
                Ok(true) => {}
                Ok(false) => {
                    out.not_selected.push(name.to_string());
                    continue;
                }
                Err(e) => {
                    out.errors.push(fail(e.into()));
                    hold(&mut out.held, naming, p);
                    continue;
                }
            }
        }
        selected.insert(name, p);
        candidates.push((name, p));
    }

    let collisions = name_collisions(&candidates, naming);
    for (name, p) in candidates {
        if let Some(errs) = collisions.get(name) {
            out.errors.extend(errs.iter().cloned());
            hold(&mut out.held, naming, p);
            continue;
        }
        let result = match (CacheKey::of(p), cache.entries.get(name)) {
            (Some(key), Some(entry)) if entry.key == key => entry.result.clone(),
            (key, _) => {
                let result = compile_one(name, p, naming, &selected);
                if let Some(key) = key {
                    let entry = CacheEntry {
                        key,
                        result: result.clone(),
                    };
                    cache.entries.insert(name.to_string(), entry);
                }
                result
            }
        };
        match result {
            Ok(sets) => out.sets.extend(sets),
            Err(errs) => {
                out.errors.extend(errs);
                hold(&mut out.held, naming, p);
            }
        }
    }
    out
}

/// Policies whose kernel set names coincide with another policy's: the
/// shortened form of a long name keeps only a hash of the rest, so two
/// names can meet. Both policies fail (neither may silently take the other's
/// set).
fn name_collisions(
    candidates: &[(&str, &IPSetPolicy)],
    naming: &Naming,
) -> HashMap<String, Vec<PolicyError>> {
    let mut owners: HashMap<String, Vec<&str>> = HashMap::new();
    for (name, p) in candidates {
        for f in families(p.spec.family, p.spec.set_type) {
            let set = naming.main_set_name(name, f);
            let list = owners.entry(set).or_default();
            if !list.contains(name) {
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
            let other = policies
                .iter()
                .find(|o| **o != policy)
                .copied()
                .unwrap_or("");
            errors
                .entry(policy.to_string())
                .or_default()
                .push(PolicyError {
                    policy: policy.to_string(),
                    member: None,
                    kind: PolicyErrorKind::NameCollision {
                        set: set.clone(),
                        other: other.to_string(),
                    },
                });
        }
    }
    errors
}

/// `maxElem` and `hashSize` within what the kernel can hold.
fn check_header_fields(name: &str, p: &IPSetPolicy) -> Vec<PolicyError> {
    let mut errors = Vec::new();
    let mut check = |field: &'static str, value: Option<u32>, min: u32, max: u32| {
        if let Some(v) = value
            && !(min..=max).contains(&v)
        {
            errors.push(PolicyError {
                policy: name.to_string(),
                member: None,
                kind: PolicyErrorKind::OutOfRange {
                    field,
                    range: format!("between {min} and {max}"),
                    value: v,
                },
            });
        }
    };
    check("maxElem", p.spec.max_elem, 1, u32::MAX);
    check("hashSize", p.spec.hash_size, MIN_HASH_SIZE, MAX_HASH_SIZE);
    errors
}

/// Errors for members that the kernel would merge into one entry (the same
/// network with and without `nomatch`), naming both as the user wrote them.
fn nomatch_conflict_errors(name: &str, sets: &[MemberSet], raw: &[String]) -> Vec<PolicyError> {
    let mut errors = Vec::new();
    for set in sets {
        for (plain, flagged) in set.nomatch_conflicts(MAX_MEMBER_ERRORS) {
            let network = plain.to_string();
            // Only on this error path: find the user's spelling of each side.
            let spelling = |want: &crate::ipset::Member| {
                raw.iter()
                    .find(|r| {
                        Member::parse_user(SetType::HashNet, r)
                            .is_ok_and(|p| p.members.iter().any(|m| m == want))
                    })
                    .cloned()
                    .unwrap_or_else(|| want.to_string())
            };
            errors.push(PolicyError {
                policy: name.to_string(),
                member: Some(spelling(&plain)),
                kind: PolicyErrorKind::NomatchConflict {
                    other: spelling(&flagged),
                    network,
                },
            });
        }
    }
    errors.truncate(MAX_MEMBER_ERRORS);
    errors
}

fn hold(held: &mut Vec<String>, naming: &Naming, p: &IPSetPolicy) {
    let name = p.metadata.name.as_deref().unwrap_or("");
    for fam in [Some(Family::V4), Some(Family::V6), None] {
        held.push(naming.main_set_name(name, fam));
    }
}

fn compile_one(
    name: &str,
    p: &IPSetPolicy,
    naming: &Naming,
    selected: &HashMap<&str, &IPSetPolicy>,
) -> Result<Vec<DesiredSet>, Vec<PolicyError>> {
    let set_type = p.spec.set_type;
    let fams = families(p.spec.family, set_type);
    let mut errors = Vec::new();
    let mut bad_members = 0usize;
    let mut reject = |member: &str, kind: PolicyErrorKind, errors: &mut Vec<PolicyError>| {
        bad_members += 1;
        if errors.len() < MAX_MEMBER_ERRORS {
            errors.push(PolicyError {
                policy: name.to_string(),
                member: Some(member.to_string()),
                kind,
            });
        }
    };

    let builders = if set_type == SetType::ListSet {
        let mut builders: Vec<MemberSetBuilder> = fams
            .iter()
            .map(|f| {
                MemberSetBuilder::with_capacity(SetKind::new(set_type, *f), p.spec.members.len())
            })
            .collect();
        for raw in &p.spec.members {
            match list_member(name, raw, naming, selected, &fams) {
                Ok(per_family) => {
                    for (i, m) in per_family.into_iter().enumerate() {
                        builders[i].push(m);
                    }
                }
                Err(kind) => reject(raw, kind, &mut errors),
            }
        }
        builders
    } else {
        let parsed = parse_members(set_type, &fams, &p.spec.members);
        let shown = parsed.rejected.len();
        for (index, kind) in parsed.rejected {
            reject(&p.spec.members[index], kind, &mut errors);
        }
        // Only the first rejections are kept; count the others too.
        bad_members += parsed.bad - shown;
        parsed.builders
    };
    let sets: Vec<MemberSet> = builders.into_iter().map(|b| b.finish().0).collect();
    if bad_members > errors.len() {
        errors.push(PolicyError {
            policy: name.to_string(),
            member: None,
            kind: PolicyErrorKind::More(bad_members - errors.len()),
        });
    }
    errors.extend(check_header_fields(name, p));
    if bad_members == 0 && set_type == SetType::HashNet {
        errors.extend(nomatch_conflict_errors(name, &sets, &p.spec.members));
    }
    let max = max_elem(p);
    for s in &sets {
        if s.len() > max as usize {
            errors.push(PolicyError {
                policy: name.to_string(),
                member: None,
                kind: PolicyErrorKind::TooManyMembers {
                    count: s.len(),
                    max,
                },
            });
            break;
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(fams
        .iter()
        .zip(sets)
        .map(|(f, members)| DesiredSet {
            name: naming.main_set_name(name, *f),
            policy: name.to_string(),
            header: SetHeader {
                kind: SetKind::new(set_type, *f),
                max_elem: if set_type == SetType::ListSet {
                    max.max(MIN_LIST_SIZE)
                } else {
                    max
                },
                hash_size: p.spec.hash_size.filter(|_| set_type.is_hash()),
            },
            members: Arc::new(members),
        })
        .collect())
}

/// Members of a hash-type policy, parsed and routed to their family's set.
struct ParsedMembers {
    builders: Vec<MemberSetBuilder>,
    /// The first rejections, by index into the member list.
    rejected: Vec<(usize, PolicyErrorKind)>,
    /// How many members were rejected in all.
    bad: usize,
}

/// Below this many members, parsing on one thread is fast enough.
const PARALLEL_PARSE_MIN: usize = 100_000;

/// Parse members, on several threads for big policies (parsing a million
/// members takes a noticeable fraction of a second per core).
fn parse_members(set_type: SetType, fams: &[Option<Family>], raw: &[String]) -> ParsedMembers {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if threads < 2 || raw.len() < PARALLEL_PARSE_MIN {
        return parse_chunk(set_type, fams, raw, 0);
    }
    let chunk = raw.len().div_ceil(threads);
    let parts: Vec<ParsedMembers> = std::thread::scope(|scope| {
        let handles: Vec<_> = raw
            .chunks(chunk)
            .enumerate()
            .map(|(i, c)| scope.spawn(move || parse_chunk(set_type, fams, c, i * chunk)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut parts = parts.into_iter();
    let mut all = parts
        .next()
        .unwrap_or_else(|| parse_chunk(set_type, fams, &[], 0));
    for part in parts {
        for (b, other) in all.builders.iter_mut().zip(part.builders) {
            b.absorb(other);
        }
        all.rejected.extend(part.rejected);
        all.bad += part.bad;
    }
    all.rejected.truncate(MAX_MEMBER_ERRORS);
    all
}

fn parse_chunk(
    set_type: SetType,
    fams: &[Option<Family>],
    raw: &[String],
    offset: usize,
) -> ParsedMembers {
    let mut out = ParsedMembers {
        builders: fams
            .iter()
            .map(|f| {
                MemberSetBuilder::with_capacity(SetKind::new(set_type, *f), raw.len() / fams.len())
            })
            .collect(),
        rejected: Vec::new(),
        bad: 0,
    };
    for (i, r) in raw.iter().enumerate() {
        let kind = match Member::parse_user(set_type, r) {
            Ok(parsed) => match fams.iter().position(|x| *x == parsed.family) {
                Some(slot) => {
                    for m in parsed.members {
                        out.builders[slot].push(m);
                    }
                    continue;
                }
                None => PolicyErrorKind::WrongFamily {
                    found: parsed.family.unwrap_or(Family::V4),
                    expected: fams[0].unwrap_or(Family::V4),
                },
            },
            Err(e) => e.into(),
        };
        out.bad += 1;
        if out.rejected.len() < MAX_MEMBER_ERRORS {
            out.rejected.push((offset + i, kind));
        }
    }
    out
}

/// Resolve a list:set member (a policy name) to the listed kernel set, one
/// per family of the list.
fn list_member(
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
            let f = if target.spec.set_type == SetType::HashMac {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::IPSetPolicySpec;

    fn policy(name: &str, t: SetType, fam: FamilySpec, members: &[&str]) -> IPSetPolicy {
        IPSetPolicy::new(
            name,
            IPSetPolicySpec {
                set_type: t,
                family: fam,
                members: members.iter().map(|s| s.to_string()).collect(),
                node_selector: None,
                max_elem: None,
                hash_size: None,
            },
        )
    }

    #[test]
    fn dual_splits_and_dedupes() {
        let p = policy(
            "mix",
            SetType::HashNet,
            FamilySpec::Dual,
            &["10.0.0.1/8", "10.9.9.9/8", "2001:db8::/32", "0.0.0.0/0"],
        );
        let c = compile(&[p], &Naming::default(), None);
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(c.sets.len(), 2);
        assert_eq!(c.sets[0].name, "ipm4-mix");
        assert_eq!(
            c.sets[0].members.sorted_strings(),
            ["0.0.0.0/1", "10.0.0.0/8", "128.0.0.0/1"]
        );
        assert_eq!(c.sets[1].members.sorted_strings(), ["2001:db8::/32"]);
    }

    #[test]
    fn a_bad_member_fails_the_whole_policy_only() {
        let bad = policy(
            "bad",
            SetType::HashIp,
            FamilySpec::IPv4,
            &["10.0.0.1", "1.2.3.4\ndestroy KUBE-X", "::1", "example.com"],
        );
        let good = policy("good", SetType::HashIp, FamilySpec::IPv4, &["10.0.0.2"]);
        let c = compile(&[bad, good], &Naming::default(), None);
        assert_eq!(c.sets.len(), 1);
        assert_eq!(c.sets[0].policy, "good");
        let msgs: Vec<String> = c.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs[0].contains(r#"member "1.2.3.4\ndestroy KUBE-X" rejected: contains whitespace"#),
            "{}",
            msgs[0]
        );
        assert!(
            msgs[1].contains("IPv6 member but the policy family is IPv4"),
            "{}",
            msgs[1]
        );
        assert!(msgs[2].contains("host name"), "{}", msgs[2]);
        assert!(c.held.contains(&"ipm4-bad".to_string()));
    }

    #[test]
    fn max_elem_is_enforced_after_dedup() {
        let mut p = policy(
            "small",
            SetType::HashIp,
            FamilySpec::IPv4,
            &["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"],
        );
        p.spec.max_elem = Some(2);
        let c = compile(&[p], &Naming::default(), None);
        assert_eq!(
            c.errors[0].kind,
            PolicyErrorKind::TooManyMembers { count: 3, max: 2 }
        );
    }

    #[test]
    fn list_set_references() {
        let a = policy("a", SetType::HashIp, FamilySpec::IPv4, &[]);
        let l = policy("l", SetType::ListSet, FamilySpec::IPv4, &["a"]);
        let nested = policy("n", SetType::ListSet, FamilySpec::IPv4, &["l"]);
        let selfref = policy("s", SetType::ListSet, FamilySpec::IPv4, &["s"]);
        let missing = policy("m", SetType::ListSet, FamilySpec::IPv4, &["nope"]);
        let v6 = policy("v6", SetType::ListSet, FamilySpec::IPv6, &["a"]);
        let c = compile(
            &[a, l, nested, selfref, missing, v6],
            &Naming::default(),
            None,
        );
        let l_set = c.sets.iter().find(|s| s.policy == "l").unwrap();
        assert_eq!(l_set.members.sorted_strings(), ["ipm4-a"]);
        let kinds: Vec<_> = c
            .errors
            .iter()
            .map(|e| (e.policy.as_str(), e.kind.clone()))
            .collect();
        assert!(kinds.contains(&("n", PolicyErrorKind::ListSetNested("l".into()))));
        assert!(kinds.contains(&("s", PolicyErrorKind::ListSetSelf)));
        assert!(kinds.contains(&("m", PolicyErrorKind::ListSetMissing("nope".into()))));
        assert!(kinds.contains(&("v6", PolicyErrorKind::ListSetFamily("a".into(), Family::V6))));
    }

    #[test]
    fn a_network_with_and_without_nomatch_is_rejected_naming_both() {
        for (plain, flagged, network) in [
            ("10.0.0.0/8", "10.0.0.0/8 nomatch", "10.0.0.0/8"),
            ("10.1.2.3/8", "10.0.0.0/8 nomatch", "10.0.0.0/8"),
            ("2001:db8::1/32", "2001:db8::/32 nomatch", "2001:db8::/32"),
        ] {
            let p = policy(
                "flip",
                SetType::HashNet,
                FamilySpec::Dual,
                &[plain, "192.168.0.0/16", flagged],
            );
            let c = compile(&[p], &Naming::default(), None);
            assert!(c.sets.is_empty(), "{:?}", c.sets);
            assert_eq!(c.errors.len(), 1, "{:?}", c.errors);
            let msg = c.errors[0].to_string();
            assert!(msg.contains(&format!("member \"{plain}\"")), "{msg}");
            assert!(msg.contains(&format!("{flagged:?}")), "{msg}");
            assert!(msg.contains(&format!("network {network}")), "{msg}");
            assert!(c.held.contains(&"ipm4-flip".to_string()));
        }
        // Different networks, one excluded from the other, are the point of nomatch.
        let ok = policy(
            "carve",
            SetType::HashNet,
            FamilySpec::IPv4,
            &["10.0.0.0/8", "10.1.0.0/16 nomatch"],
        );
        assert!(compile(&[ok], &Naming::default(), None).errors.is_empty());
    }

    #[test]
    fn policies_sharing_a_kernel_set_name_both_fail() {
        let naming = Naming::default();
        let long = "a-very-long-policy-name-for-the-edge-nodes";
        let shortened = naming.main_set_name(long, Some(Family::V4));
        // A short policy named exactly like the long one's shortened set.
        let short = shortened.strip_prefix("ipm4-").unwrap();
        let a = policy(long, SetType::HashIp, FamilySpec::IPv4, &["10.0.0.1"]);
        let b = policy(short, SetType::HashIp, FamilySpec::IPv4, &["10.0.0.2"]);
        let other = policy("other", SetType::HashIp, FamilySpec::IPv4, &["10.0.0.3"]);
        let c = compile(&[a, b, other], &naming, None);
        assert_eq!(c.sets.len(), 1);
        assert_eq!(c.sets[0].policy, "other");
        let failed: Vec<&str> = c.errors.iter().map(|e| e.policy.as_str()).collect();
        assert_eq!(failed.len(), 2, "{:?}", c.errors);
        assert!(failed.contains(&long) && failed.contains(&short));
        for e in &c.errors {
            assert!(e.to_string().contains(&shortened), "{e}");
        }
        assert!(c.held.contains(&shortened));
    }

    #[test]
    fn header_fields_out_of_the_kernels_range_are_rejected() {
        for (max_elem, hash_size, field) in [
            (Some(0), None, "maxElem"),
            (None, Some(4_294_967_295), "hashSize"),
            (None, Some(16), "hashSize"),
        ] {
            let mut p = policy("f", SetType::HashIp, FamilySpec::IPv4, &[]);
            p.spec.max_elem = max_elem;
            p.spec.hash_size = hash_size;
            let c = compile(&[p], &Naming::default(), None);
            assert!(c.sets.is_empty());
            let msg = c.errors[0].to_string();
            assert!(msg.contains(&format!("{field} must be between")), "{msg}");
        }
        let mut p = policy("f", SetType::HashIp, FamilySpec::IPv4, &[]);
        p.spec.hash_size = Some(MAX_HASH_SIZE);
        assert!(compile(&[p], &Naming::default(), None).errors.is_empty());
    }

    #[test]
    fn big_policies_parse_on_several_threads_with_the_same_result() {
        let n = PARALLEL_PARSE_MIN + 50_000;
        let mut members: Vec<String> = (0..n as u32)
            .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())
            .collect();
        members.push("10.0.0.1".into()); // duplicate: silently merged
        // 15 bad members spread over every chunk.
        let bad: Vec<usize> = (0..15).map(|k| k * n / 15 + 7).collect();
        for &i in &bad {
            members[i] = format!("bad-{i}");
        }
        let strs: Vec<&str> = members.iter().map(String::as_str).collect();
        let mut p = policy("big", SetType::HashIp, FamilySpec::IPv4, &strs);
        p.spec.max_elem = Some(1_000_000);
        let c = compile(&[p.clone()], &Naming::default(), None);
        assert_eq!(c.errors.len(), MAX_MEMBER_ERRORS + 1);
        for (e, i) in c.errors[..MAX_MEMBER_ERRORS].iter().zip(&bad) {
            assert_eq!(
                e.member.as_deref(),
                Some(format!("bad-{i}").as_str()),
                "in member order"
            );
            assert_eq!(e.kind, PolicyErrorKind::Member(MemberError::HostName));
        }
        assert_eq!(c.errors[MAX_MEMBER_ERRORS].kind, PolicyErrorKind::More(5));

        for &i in &bad {
            members[i] = format!("192.168.0.{}", i % 250);
        }
        let strs: Vec<&str> = members.iter().map(String::as_str).collect();
        p.spec.members = strs.iter().map(|s| s.to_string()).collect();
        let c = compile(&[p], &Naming::default(), None);
        assert!(c.errors.is_empty());
        let serial: std::collections::HashSet<String> = strs
            .iter()
            .map(|s| {
                Member::parse_user(SetType::HashIp, s)
                    .unwrap()
                    .members
                    .iter()
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(c.sets[0].members.len(), serial.len());
        assert!(
            c.sets[0]
                .members
                .iter()
                .all(|m| serial.contains(&m.to_string()))
        );
    }

    #[test]
    fn cache_reuses_parsed_members_per_generation() {
        let mut p = policy(
            "big",
            SetType::HashIp,
            FamilySpec::IPv4,
            &["10.0.0.1", "10.0.0.2"],
        );
        p.metadata.generation = Some(1);
        p.metadata.uid = Some("u1".into());
        let naming = Naming::default();
        let mut cache = MemberCache::default();
        let first = compile_cached([&p], &naming, None, &mut cache);
        assert!(cache.is_cached(&p));

        // The agent drops the strings; the cached result is still complete
        // and shares the same member set.
        let mut stripped = p.clone();
        stripped.spec.members.clear();
        let again = compile_cached([&stripped], &naming, None, &mut cache);
        assert_eq!(again.sets[0].members.len(), 2);
        assert!(Arc::ptr_eq(&first.sets[0].members, &again.sets[0].members));

        // A new generation is parsed again; a vanished policy is evicted.
        let mut next = p.clone();
        next.metadata.generation = Some(2);
        next.spec.members = vec!["10.0.0.3".into()];
        let third = compile_cached([&next], &naming, None, &mut cache);
        assert_eq!(third.sets[0].members.sorted_strings(), ["10.0.0.3"]);
        assert!(!cache.is_cached(&p));
        compile_cached(std::iter::empty(), &naming, None, &mut cache);
        assert!(!cache.is_cached(&next));

        // File-mode policies (no generation) and list:sets are never cached.
        let file = policy("file", SetType::HashIp, FamilySpec::IPv4, &["10.0.0.1"]);
        compile_cached([&file], &naming, None, &mut cache);
        assert!(!cache.is_cached(&file));
    }

    #[test]
    fn selectors_and_names() {
        let mut edge = policy("edge", SetType::HashIp, FamilySpec::IPv4, &[]);
        edge.spec.node_selector = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("role".to_string(), "edge".to_string())].into()),
                match_expressions: None,
            },
        );
        let upper = policy("Upper", SetType::HashIp, FamilySpec::IPv4, &[]);
        let labels = BTreeMap::new();
        let c = compile(&[edge.clone(), upper], &Naming::default(), Some(&labels));
        assert_eq!(c.not_selected, ["edge"]);
        assert!(matches!(c.errors[0].kind, PolicyErrorKind::BadName(_)));
        let c = compile(&[edge], &Naming::default(), None);
        assert_eq!(c.sets.len(), 1);
    }
}
