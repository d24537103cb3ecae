//! Parsing one source of a policy's members (its `spec.members`, or one
//! member slice) into a member set per family of the policy, with the first
//! rejections. Big sources are parsed on several threads.

use std::sync::Arc;

use super::errors::PolicyErrorKind;
use super::{MAX_MEMBER_ERRORS, families};
use ipsetmgr_api::policy::FamilySpec;
use ipsetmgr_ipset::{Family, Member, MemberSet, MemberSetBuilder, SetKind, SetType};

/// The members of one source, parsed for one policy type and family.
#[derive(Debug)]
pub(crate) struct ParsedSource {
    /// One set per family of the policy, in [`families`] order.
    pub sets: Vec<Arc<MemberSet>>,
    /// The first rejections: the member as written, and why.
    pub rejected: Vec<(String, PolicyErrorKind)>,
    /// How many members were rejected in all.
    pub bad: usize,
}

/// Below this many members, parsing on one thread is fast enough.
pub(crate) const PARALLEL_PARSE_MIN: usize = 100_000;

/// Parse `raw` as members of a `set_type` policy of `family`.
pub(crate) fn parse_source(set_type: SetType, family: FamilySpec, raw: &[&str]) -> ParsedSource {
    let fams = families(family, set_type);
    let parsed = parse_members(set_type, &fams, raw);
    ParsedSource {
        sets: parsed
            .builders
            .into_iter()
            .map(|b| Arc::new(b.finish().0))
            .collect(),
        rejected: parsed
            .rejected
            .into_iter()
            .map(|(i, kind)| (raw[i].to_string(), kind))
            .collect(),
        bad: parsed.bad,
    }
}

/// Members routed to their family's builder.
struct ParsedMembers {
    builders: Vec<MemberSetBuilder>,
    /// The first rejections, by index into the member list.
    rejected: Vec<(usize, PolicyErrorKind)>,
    bad: usize,
}

/// Parse members, on several threads for big sources (parsing a million
/// members takes a noticeable fraction of a second per core).
fn parse_members(set_type: SetType, fams: &[Option<Family>], raw: &[&str]) -> ParsedMembers {
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
    raw: &[&str],
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
                    let (first, second) = parsed.members.into_parts();
                    out.builders[slot].push(first);
                    if let Some(m) = second {
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
    // Sorted here, on this chunk's thread: the chunks are then merged.
    out.builders.iter_mut().for_each(MemberSetBuilder::presort);
    out
}
