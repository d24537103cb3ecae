//! Turning policies (with their member slices) into the desired kernel sets
//! of one node, with every rejection rule listed in `docs/architecture.md`
//! ("Members"). A policy with any bad input, in its own members or in any of
//! its slices, yields no sets at all (never a partial apply); its existing
//! kernel sets are held as they are.
//!
//! - [`parse`]: one source of members into a set per family;
//! - [`cache`]: sources and results remembered between compiles;
//! - [`checks`]: the rules that look at a policy as a whole;
//! - [`list_set`]: list:set members, resolved against the other policies.

mod bitmap;
mod cache;
mod checks;
mod errors;
mod except;
mod input;
mod limits;
mod list_set;
mod mask;
mod parse;

#[cfg(test)]
mod except_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use self::cache::{PolicyKey, SourceKey};
pub use self::checks::check_name;
use self::checks::{
    check_header_fields, families, name_collisions, nomatch_conflict_errors, set_size,
};
use self::parse::{ParsedSource, parse_source};
use super::selector;
use ipsetmgr_api::policy::IPSetPolicy;
use ipsetmgr_ipset::{
    HeaderOptions, MemberSet, MemberSetBuilder, Naming, SetHeader, SetKind, SetType,
};

pub use self::cache::MemberCache;
pub use self::checks::{MAX_HASH_SIZE, MIN_HASH_SIZE};
pub use self::errors::{ExceptEntryError, PolicyError, PolicyErrorKind};
pub use self::input::{MemberList, NoMembers, OwnedMembers, PolicyInput, SliceInput};
pub use self::limits::DEFAULT_LIST_SIZE;
pub use self::limits::MAX_MAX_ELEM;
use self::limits::{MAX_MEMBER_ERRORS, MIN_LIST_SIZE};
pub use ipsetmgr_sets::DesiredSet;

/// What one node should hold, and what went wrong.
#[derive(Debug, Default)]
pub struct Compiled {
    pub sets: Vec<DesiredSet>,
    /// Policies with errors; their kernel sets are held untouched.
    pub errors: Vec<PolicyError>,
    /// Policies with errors: their kernel sets (every family, in every
    /// kernel) are never modified nor deleted.
    pub held: Vec<String>,
    /// Policies whose nodeSelector does not select this node.
    pub not_selected: Vec<String>,
    /// What was left out without failing a policy: list:set members that
    /// name a held policy.
    pub warnings: Vec<PolicyError>,
    /// Policy name → members its except ranges dropped or cut (policies
    /// that compiled, with at least one).
    pub excepted: BTreeMap<String, u64>,
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

/// Compile `policies` (without slices) for one node. `node_labels`: `None`
/// ignores node selectors (file mode without labels; the controller, which
/// validates for every node), `Some` evaluates them.
pub fn compile<'a>(
    policies: impl IntoIterator<Item = &'a IPSetPolicy>,
    naming: &Naming,
    node_labels: Option<&BTreeMap<String, String>>,
) -> Compiled {
    let inputs: Vec<PolicyInput<'a>> = policies
        .into_iter()
        .map(|policy| PolicyInput::new(policy, Vec::new()))
        .collect();
    compile_inputs(&inputs, naming, node_labels, &mut MemberCache::default())
}

/// Compile policies with their slices for one node, reusing and filling
/// `cache`; what this compile does not use is dropped from it.
pub fn compile_inputs(
    inputs: &[PolicyInput<'_>],
    naming: &Naming,
    node_labels: Option<&BTreeMap<String, String>>,
    cache: &mut MemberCache,
) -> Compiled {
    cache.begin();
    let mut out = Compiled::default();
    let (selected, candidates) = select(inputs, node_labels, &mut out);
    let collisions = name_collisions(&candidates, naming);
    // list:sets last: a member naming a policy that is held stays in the
    // list (and said so), rather than failing the whole list: the backend
    // keeps it listed while its set exists.
    let (lists, others): (Vec<_>, Vec<_>) = candidates
        .into_iter()
        .partition(|i| i.policy.spec.set_type == SetType::ListSet);
    let mut failed: std::collections::HashSet<String> = std::collections::HashSet::new();
    for input in others.into_iter().chain(lists) {
        let p = input.policy;
        let name = p.metadata.name.as_deref().unwrap_or("");
        if let Some(errs) = collisions.get(name) {
            out.errors.extend(errs.iter().cloned());
            out.held.push(name.to_string());
            failed.insert(name.to_string());
            continue;
        }
        let result = if p.spec.set_type == SetType::ListSet && input.held_by.is_empty() {
            // Resolved against the other policies: never cached.
            compile_list_set(input, naming, &selected, &failed, &mut out.warnings).map(|s| (s, 0))
        } else {
            compile_policy(input, naming, cache)
        };
        match result {
            Ok((sets, excepted)) => {
                if excepted > 0 {
                    out.excepted.insert(name.to_string(), excepted);
                }
                out.sets.extend(sets);
            }
            Err(errs) => {
                out.errors.extend(errs);
                out.held.push(name.to_string());
                failed.insert(name.to_string());
            }
        }
    }
    cache.finish();
    out
}

/// The policies this node holds, by name (list:set references resolve
/// against them), in input order. Bad names, duplicates and bad selectors
/// fail here; unselected policies are noted.
fn select<'i, 'a>(
    inputs: &'i [PolicyInput<'a>],
    node_labels: Option<&BTreeMap<String, String>>,
    out: &mut Compiled,
) -> (HashMap<&'a str, &'a IPSetPolicy>, Vec<&'i PolicyInput<'a>>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for i in inputs {
        *seen
            .entry(i.policy.metadata.name.as_deref().unwrap_or(""))
            .or_default() += 1;
    }
    let mut selected = HashMap::new();
    let mut candidates = Vec::new();
    for input in inputs {
        let p = input.policy;
        let name = p.metadata.name.as_deref().unwrap_or("");
        let mut fail = |kind, held: bool| {
            out.errors.push(PolicyError::of_policy(name, kind));
            if held {
                out.held.push(name.to_string());
            }
        };
        if let Err(why) = check_name(name) {
            fail(PolicyErrorKind::BadName(why), false);
            continue;
        }
        if seen[name] > 1 {
            // Reported once, however often it is defined.
            seen.insert(name, 0);
            fail(PolicyErrorKind::Duplicate, true);
            continue;
        }
        if seen[name] == 0 {
            continue;
        }
        // A bad selector is an error everywhere, also where it is not
        // evaluated (file mode without labels, the controller).
        let labels = node_labels.cloned().unwrap_or_default();
        match selector::matches(p.spec.node_selector.as_ref(), &labels) {
            Err(e) => {
                fail(e.into(), true);
                continue;
            }
            Ok(false) if node_labels.is_some() => {
                out.not_selected.push(name.to_string());
                continue;
            }
            Ok(_) => {}
        }
        selected.insert(name, p);
        candidates.push(input);
    }
    (selected, candidates)
}

/// One policy's sets and how many members its except ranges dropped or
/// cut, from the cache when none of its sources changed.
fn compile_policy(
    input: &PolicyInput<'_>,
    naming: &Naming,
    cache: &mut MemberCache,
) -> Result<(Vec<DesiredSet>, u64), Vec<PolicyError>> {
    let p = input.policy;
    let name = p.metadata.name.as_deref().unwrap_or("");
    if !input.held_by.is_empty() {
        return Err(input.held_by.clone());
    }
    let key = policy_key(input);
    if let Some((result, excepted)) = cache.result(name, &key) {
        return result.map(|sets| (sets, excepted));
    }
    let mut excepted = 0;
    let result = compile_hash(input, naming, cache, &mut excepted);
    cache.keep_result(name, key, &result, excepted);
    result.map(|sets| (sets, excepted))
}

/// The key of a policy's result: all its sources have versions.
fn policy_key(input: &PolicyInput<'_>) -> Option<PolicyKey> {
    let p = input.policy;
    let mut sources = vec![SourceKey::inline(p)?];
    for s in &input.slices {
        s.members.ok()?;
        sources.push(SourceKey::slice(s.name, s.version, p)?);
    }
    Some(PolicyKey {
        sources,
        extra_except: input.extra_except.to_vec(),
    })
}

/// A parsed source, from the cache or parsed now (and remembered).
fn parsed(
    cache: &mut MemberCache,
    key: Option<SourceKey>,
    p: &IPSetPolicy,
    members: MemberList<'_>,
) -> Arc<ParsedSource> {
    if let Some(hit) = cache.source(&key) {
        return hit;
    }
    let parsed = Arc::new(parse_source(p.spec.set_type, p.spec.family, members));
    cache.keep_source(key, &parsed);
    parsed
}

/// A hash-type policy: every source parsed (or from the cache), merged per
/// family, then the except ranges and the rules that look at the whole.
/// `excepted`: how many members the except ranges dropped or cut.
fn compile_hash(
    input: &PolicyInput<'_>,
    naming: &Naming,
    cache: &mut MemberCache,
    excepted: &mut u64,
) -> Result<Vec<DesiredSet>, Vec<PolicyError>> {
    let p = input.policy;
    let name = p.metadata.name.as_deref().unwrap_or("");
    let mut errors = Vec::new();
    let mut bad = 0usize;
    let mut sources: Vec<Arc<ParsedSource>> = Vec::with_capacity(1 + input.slices.len());
    sources.push(parsed(cache, SourceKey::inline(p), p, input.own_members()));
    let mut origins: Vec<Option<&str>> = vec![None];
    for s in &input.slices {
        match s.members {
            Ok(members) => {
                sources.push(parsed(
                    cache,
                    SourceKey::slice(s.name, s.version, p),
                    p,
                    members,
                ));
                origins.push(Some(s.name));
            }
            Err(why) => errors.push(s.no_members_error(name, why)),
        }
    }
    for (source, origin) in sources.iter().zip(&origins) {
        bad += source.bad;
        for (member, kind) in &source.rejected {
            if errors.len() < MAX_MEMBER_ERRORS {
                errors.push(PolicyError {
                    policy: name.to_string(),
                    slice: origin.map(str::to_string),
                    member: Some(member.clone()),
                    kind: kind.clone(),
                });
            }
        }
    }
    close_errors(&mut errors, bad, name, p);
    let fams = families(p.spec.family, p.spec.set_type);
    let sets: Vec<Arc<MemberSet>> = (0..fams.len())
        .map(|i| merge(SetKind::new(p.spec.set_type, fams[i]), &sources, i))
        .collect();
    // Under a netmask or bitmask, members are the entries the kernel stores.
    let sets: Vec<Arc<MemberSet>> = if bad == 0 && errors.is_empty() {
        sets.into_iter()
            .zip(&fams)
            .map(|(s, f)| match mask::mask(p, *f) {
                Some(m) => mask::masked(name, m, &s, &mut errors),
                None => s,
            })
            .collect()
    } else {
        sets
    };
    let except = match except::parse(name, p, input.extra_except, &fams) {
        Ok(except) => except,
        Err(errs) => {
            errors.extend(errs);
            except::ExceptList::default()
        }
    };
    let sets = if bad == 0 && errors.is_empty() && !except.is_empty() {
        apply_except(name, p, &fams, sets, &except, excepted, &mut errors)
    } else {
        sets
    };
    let comments = sets.iter().any(|s| s.has_comments());
    if bad == 0 && (p.spec.set_type.has_nomatch() || comments) {
        let raw = || input_strings(input);
        errors.extend(nomatch_conflict_errors(name, p.spec.set_type, &sets, raw));
    }
    if bad == 0
        && let Some(range) = bitmap::range(p)
    {
        errors.extend(bitmap::outside_range(name, range, &sets));
    }
    // Said once: the except error names the added entries.
    if !errors
        .iter()
        .any(|e| matches!(e.kind, PolicyErrorKind::ExceptOverMaxElem { .. }))
    {
        errors.extend(too_many(name, p, &sets, input.size_cap));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(desired_sets(
        name,
        p,
        naming,
        sets,
        comments,
        input.size_cap,
    ))
}

/// Each family's set with the except ranges applied; a set whose added
/// nomatch entries pass maxElem fails here, saying so.
fn apply_except(
    name: &str,
    p: &IPSetPolicy,
    fams: &[Option<ipsetmgr_ipset::Family>],
    sets: Vec<Arc<MemberSet>>,
    except: &except::ExceptList,
    excepted: &mut u64,
    errors: &mut Vec<PolicyError>,
) -> Vec<Arc<MemberSet>> {
    let mut out = Vec::with_capacity(sets.len());
    for ((set, ranges), f) in sets.iter().zip(&except.per_family).zip(fams) {
        match except::apply(name, set, ranges, mask::mask(p, *f)) {
            Ok(applied) => {
                *excepted += applied.excepted;
                let members = applied.set.len() - applied.added;
                // A given maxElem is a hard cap; without one the set grows
                // to hold the added entries too.
                if let Some(max) = p.spec.max_elem
                    && applied.set.len() > max as usize
                    && members <= max as usize
                {
                    errors.push(PolicyError::of_policy(
                        name,
                        PolicyErrorKind::ExceptOverMaxElem {
                            members,
                            added: applied.added,
                            max,
                        },
                    ));
                }
                out.push(applied.set);
            }
            Err(e) => {
                errors.push(*e);
                out.push(set.clone());
            }
        }
    }
    out
}

/// The members of family slot `i` over all sources: the source's own set
/// when there is just one (no copy), their union otherwise.
/// After the members: say how many bad ones were not listed one by one,
/// and add the header fields' errors.
fn close_errors(errors: &mut Vec<PolicyError>, bad: usize, name: &str, p: &IPSetPolicy) {
    let shown = errors.iter().filter(|e| e.member.is_some()).count();
    if bad > shown {
        errors.push(PolicyError::of_policy(
            name,
            PolicyErrorKind::More(bad - shown),
        ));
    }
    errors.extend(check_header_fields(name, p));
}

fn merge(kind: SetKind, sources: &[Arc<ParsedSource>], i: usize) -> Arc<MemberSet> {
    let parts: Vec<&MemberSet> = sources
        .iter()
        .map(|s| &*s.sets[i])
        .filter(|s| !s.is_empty())
        .collect();
    match parts.as_slice() {
        [] => Arc::new(MemberSet::new(kind)),
        [_] => sources
            .iter()
            .map(|s| s.sets[i].clone())
            .find(|s| !s.is_empty())
            .expect("one non-empty part"),
        many => Arc::new(MemberSet::union(kind, many).0),
    }
}

/// The member strings still at hand (for error messages that quote the
/// user's spelling); slices kept as text count too.
fn input_strings<'a>(input: &PolicyInput<'a>) -> Vec<&'a str> {
    let mut v = input.own_members().strs();
    for s in &input.slices {
        if let Ok(m) = s.members {
            v.extend(m.strs());
        }
    }
    v
}

/// More members than any family's set may hold: its `maxElem`, or without
/// one the largest size a set may grow to (`cap`).
fn too_many(name: &str, p: &IPSetPolicy, sets: &[Arc<MemberSet>], cap: u32) -> Option<PolicyError> {
    sets.iter().find_map(|s| {
        let max = set_size(p, s.len(), cap);
        let kind = match p.spec.max_elem {
            _ if s.len() <= max as usize => return None,
            Some(_) => PolicyErrorKind::TooManyMembers {
                count: s.len(),
                max,
            },
            None => PolicyErrorKind::TooManyToGrow {
                count: s.len(),
                max,
            },
        };
        Some(PolicyError::of_policy(name, kind))
    })
}

/// The kernel sets of a valid policy, one per family.
fn desired_sets(
    name: &str,
    p: &IPSetPolicy,
    naming: &Naming,
    sets: Vec<Arc<MemberSet>>,
    comments: bool,
    cap: u32,
) -> Vec<DesiredSet> {
    let set_type = p.spec.set_type;
    families(p.spec.family, set_type)
        .into_iter()
        .zip(sets)
        .map(|(f, members)| DesiredSet {
            name: naming.main_set_name(name, f),
            policy: name.to_string(),
            header: SetHeader {
                kind: SetKind::new(set_type, f),
                max_elem: match set_size(p, members.len(), cap) {
                    max if set_type == SetType::ListSet => max.max(MIN_LIST_SIZE),
                    max => max,
                },
                hash_size: p.spec.hash_size.filter(|_| set_type.is_hash()),
                // The comment extension only for policies that use it.
                options: HeaderOptions {
                    range: bitmap::range(p),
                    comment: comments,
                    mask: mask::mask(p, f),
                },
            },
            members,
        })
        .collect()
}

/// A list:set policy: its members (inline and in slices) name other
/// policies.
fn compile_list_set(
    input: &PolicyInput<'_>,
    naming: &Naming,
    selected: &HashMap<&str, &IPSetPolicy>,
    failed: &std::collections::HashSet<String>,
    warnings: &mut Vec<PolicyError>,
) -> Result<Vec<DesiredSet>, Vec<PolicyError>> {
    let p = input.policy;
    let name = p.metadata.name.as_deref().unwrap_or("");
    let fams = families(p.spec.family, p.spec.set_type);
    let mut builders: Vec<MemberSetBuilder> = fams
        .iter()
        .map(|f| MemberSetBuilder::with_capacity(SetKind::new(SetType::ListSet, *f), 8))
        .collect();
    let mut errors = Vec::new();
    let mut bad = 0usize;
    let mut lists: Vec<(Option<&str>, Vec<&str>)> = vec![(None, input.own_members().strs())];
    for s in &input.slices {
        match s.members {
            Ok(m) => lists.push((Some(s.name), m.strs())),
            Err(why) => errors.push(s.no_members_error(name, why)),
        }
    }
    for (origin, members) in lists {
        for raw in members {
            if failed.contains(raw) {
                warnings.push(PolicyError {
                    policy: name.to_string(),
                    slice: origin.map(str::to_string),
                    member: None,
                    kind: PolicyErrorKind::ListSetHeld(raw.to_string()),
                });
                // Still listed: the backend keeps it while its set exists
                // and leaves it out while it does not (which only the
                // kernel knows).
            }
            match list_set::list_member(name, raw, naming, selected, &fams) {
                Ok(per_family) => {
                    for (b, m) in builders.iter_mut().zip(per_family) {
                        b.push(m);
                    }
                }
                Err(kind) => {
                    bad += 1;
                    if errors.len() < MAX_MEMBER_ERRORS {
                        errors.push(PolicyError {
                            policy: name.to_string(),
                            slice: origin.map(str::to_string),
                            member: Some(raw.to_string()),
                            kind,
                        });
                    }
                }
            }
        }
    }
    close_errors(&mut errors, bad, name, p);
    if let Err(errs) = except::parse(name, p, input.extra_except, &fams) {
        errors.extend(errs);
    }
    let sets: Vec<Arc<MemberSet>> = builders
        .into_iter()
        .map(|b| Arc::new(b.finish().0))
        .collect();
    errors.extend(too_many(name, p, &sets, input.size_cap));
    if !errors.is_empty() {
        return Err(errors);
    }
    // list:set members (policy names) have no comments.
    Ok(desired_sets(name, p, naming, sets, false, input.size_cap))
}
