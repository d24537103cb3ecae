//! Parsing one source of a policy's members (its `spec.members`, or one
//! member slice) into a member set per family of the policy, with the first
//! rejections. Big sources are parsed on several threads.

use std::sync::Arc;

use super::errors::PolicyErrorKind;
use super::{MAX_MEMBER_ERRORS, MemberList, families};
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

/// Parse `members` as members of a `set_type` policy of `family`.
pub(crate) fn parse_source(
    set_type: SetType,
    family: FamilySpec,
    members: MemberList<'_>,
) -> ParsedSource {
    let fams = families(family, set_type);
    let parsed = parse_members(set_type, &fams, members);
    ParsedSource {
        sets: parsed
            .builders
            .into_iter()
            .map(|b| Arc::new(b.finish().0))
            .collect(),
        rejected: parsed.rejected,
        bad: parsed.bad,
    }
}

/// Members routed to their family's builder.
struct ParsedMembers {
    builders: Vec<MemberSetBuilder>,
    /// The first rejections, in member order.
    rejected: Vec<(String, PolicyErrorKind)>,
    bad: usize,
}

/// Parse members, on several threads for big sources (parsing a million
/// members takes a noticeable fraction of a second per core).
fn parse_members(
    set_type: SetType,
    fams: &[Option<Family>],
    members: MemberList<'_>,
) -> ParsedMembers {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if threads < 2 || members.len_estimate() < PARALLEL_PARSE_MIN {
        return parse_chunk(set_type, fams, members);
    }
    let parts: Vec<ParsedMembers> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .split(threads)
            .into_iter()
            .map(|c| scope.spawn(move || parse_chunk(set_type, fams, c)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut parts = parts.into_iter();
    let mut all = parts
        .next()
        .unwrap_or_else(|| parse_chunk(set_type, fams, MemberList::Strings(&[])));
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
    members: MemberList<'_>,
) -> ParsedMembers {
    // Counted here, on the chunk's own thread: a text of lines does not
    // say how many it holds.
    let n = members.count_hint();
    let mut out = ParsedMembers {
        builders: fams
            .iter()
            .map(|f| MemberSetBuilder::with_capacity(SetKind::new(set_type, *f), n / fams.len()))
            .collect(),
        rejected: Vec::new(),
        bad: 0,
    };
    members.for_each(|r| parse_one(set_type, fams, r, &mut out));
    // Sorted here, on this chunk's thread: the chunks are then merged.
    out.builders.iter_mut().for_each(MemberSetBuilder::presort);
    out
}

fn parse_one(set_type: SetType, fams: &[Option<Family>], r: &str, out: &mut ParsedMembers) {
    let kind = match Member::parse_user(set_type, r) {
        Ok(parsed) => match fams.iter().position(|x| *x == parsed.family) {
            Some(slot) => {
                let (first, second) = parsed.members.into_parts();
                out.builders[slot].push(first);
                if let Some(m) = second {
                    out.builders[slot].push(m);
                }
                return;
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
        out.rejected.push((r.to_string(), kind));
    }
}
