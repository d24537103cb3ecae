//! Building the one batch of operations that brings every due set in line.
//!
//! How each [`WriteKind`] is written to ipsets:
//! - `Delta`: deletes and adds against known kernel content (small ones:
//!   see [`LARGE_CHANGE_OPS`]).
//! - `Create`: create and fill the set under a temp name, then rename it,
//!   so that its real name appears complete or not at all (a kill during
//!   the fill leaves a temp set, which the next run removes).
//! - `Replace`: fill a temp set and swap it in (atomic for rules matching
//!   on it): header changes, and changes too large to make in place.
//! - `Recreate`: the kernel set has another type/family and nothing
//!   references it: fill a temp set, destroy the old one and rename the
//!   temp set.

use std::ops::Range;

use ipsetmgr_ipset::MemberSet;
use ipsetmgr_sets::{BatchFailure, KernelError, NotReplaced, WriteKind};

use super::state::{Belief, SetState};
use crate::{BatchError, DataplaneError, Op};

/// A change of more than this many members, or of more than a quarter of
/// the set (and more than [`SMALL_CHANGE_OPS`]), is written to a temp set
/// and swapped in rather than made in place: a process killed in the
/// middle of an in-place change leaves a set that is neither the old list
/// nor the new one (a blocklist half there), while a swap is atomic. Small
/// deltas stay in place: a 10-member change of a million-member set costs
/// 10 operations, not a million.
pub const LARGE_CHANGE_OPS: usize = 10_000;
/// Changes up to this many members always stay in place.
pub const SMALL_CHANGE_OPS: usize = 64;

fn large_change(s: &SetState) -> bool {
    let ops = s.pending_adds.len() + s.pending_dels.len();
    ops > LARGE_CHANGE_OPS || (ops > SMALL_CHANGE_OPS && ops * 4 > s.members.len())
}

/// Choose how to write `s`. `own_refs` counts the references held by this
/// manager's own list:sets, which the batch can drop and restore around a
/// recreate.
pub(crate) fn plan_for(s: &SetState, own_refs: u32) -> Result<WriteKind, NotReplaced> {
    if !s.replace {
        return Ok(if large_change(s) {
            WriteKind::Replace
        } else {
            WriteKind::Delta
        });
    }
    match &s.kernel {
        Belief::Unknown | Belief::Absent => Ok(WriteKind::Create),
        Belief::Present { kind, .. } if *kind == Some(s.header.kind) => Ok(WriteKind::Replace),
        Belief::Present { references, .. } if *references <= own_refs => Ok(WriteKind::Recreate),
        Belief::Present { kind, references } => Err(NotReplaced {
            kernel: *kind,
            wanted: s.header.kind,
            references: *references,
        }),
    }
}

/// The operations for one set, appended to `ops`. `temp` is the temp set
/// name every plan but [`WriteKind::Delta`] fills; `unlink` are this manager's list:sets
/// that hold the set, with a member set of just its name: a recreate takes
/// it out of them first (the kernel refuses to destroy a referenced set),
/// and the lists' own ops later in the batch put it back.
pub(crate) fn push_ops<'a>(
    ops: &mut Vec<Op<'a>>,
    name: &'a str,
    s: &'a SetState,
    plan: WriteKind,
    temp: &'a str,
    unlink: &'a [(String, MemberSet)],
) {
    match plan {
        WriteKind::Delta => {
            if !s.pending_dels.is_empty() {
                ops.push(Op::Del {
                    set: name,
                    members: &s.pending_dels,
                });
            }
            if !s.pending_adds.is_empty() {
                ops.push(Op::Add {
                    set: name,
                    members: &s.pending_adds,
                });
            }
        }
        WriteKind::Create | WriteKind::Recreate => {
            push_create_and_fill(ops, temp, s);
            if plan == WriteKind::Recreate {
                for (list, this) in unlink {
                    ops.push(Op::Del {
                        set: list,
                        members: this,
                    });
                }
                ops.push(Op::Destroy { set: name });
            }
            ops.push(Op::Rename {
                from: temp,
                to: name,
            });
        }
        WriteKind::Replace => {
            push_create_and_fill(ops, temp, s);
            ops.push(Op::Swap { a: name, b: temp });
            ops.push(Op::Destroy { set: temp });
        }
    }
}

/// Create `set` with the desired header and add every desired member.
fn push_create_and_fill<'a>(ops: &mut Vec<Op<'a>>, set: &'a str, s: &'a SetState) {
    ops.push(Op::Create {
        set,
        header: &s.header,
    });
    if !s.members.is_empty() {
        ops.push(Op::Add {
            set,
            members: &s.members,
        });
    }
}

/// Which set a range of operations belongs to.
#[derive(Clone, Debug)]
pub(crate) struct OpSpan {
    pub set: String,
    pub plan: WriteKind,
    pub ops: Range<usize>,
    pub temp: Option<String>,
    /// Other sets these ops change (list:sets the set was taken out of).
    pub also_touched: Vec<String>,
}

/// The set owning operation `index`.
pub(crate) fn span_of(spans: &[OpSpan], index: usize) -> Option<&OpSpan> {
    spans.iter().find(|s| s.ops.contains(&index))
}

/// Map a failed batch to its sets: the one whose operation failed, and
/// every set the batch may have changed before it (the `ipset restore`
/// tool buffers, so anything up to the failing set may be partly applied):
/// those are read again. The error is about the failing set when it is
/// set-specific, or a list:set names a missing set.
pub(crate) fn failure(error: BatchError, spans: &[OpSpan]) -> BatchFailure {
    let failed = span_of(spans, error.op_index);
    let set = failed.map(|s| s.set.clone());
    let upto = failed.map_or(spans.len(), |f| {
        spans.iter().position(|s| s.set == f.set).unwrap_or(0) + 1
    });
    let touched: Vec<(String, WriteKind)> = spans[..upto]
        .iter()
        .flat_map(|s| {
            let also = s.also_touched.iter().map(|l| (l.clone(), WriteKind::Delta));
            std::iter::once((s.set.clone(), s.plan)).chain(also)
        })
        .collect();
    let leftovers = spans[..upto]
        .iter()
        .filter_map(|s| s.temp.clone())
        .collect();
    let about_set = error.error.is_set_specific()
        || matches!(
            (&error.error, &error.member),
            (
                DataplaneError::SetMissing(_),
                Some(ipsetmgr_ipset::Member::Set(_))
            )
        );
    BatchFailure {
        error: KernelError::from(error.error),
        set,
        element: error.member,
        about_set,
        reread: touched.iter().map(|(n, _)| n.clone()).collect(),
        partly_written: touched,
        leftovers,
    }
}
