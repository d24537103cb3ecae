//! Slicing: cutting one policy's members into IPSetMemberSlice objects by
//! a hash of each member (so a small change to the list changes few
//! slices), within the API server's and `kubectl apply`'s size limits; and
//! checking a member list before it is sliced. Pure: the `slice` command
//! (files) and the controller's `membersFrom` (the cluster) both use it.

pub mod objects;
pub mod partition;
pub mod validate;

use ipsetmgr_api::IPSetMemberSlice;
use objects::{json_bytes, slice_object};
use partition::{Limits, Raised, TooMany, partition};

/// The most bytes of one slice as JSON: under the 262,144 bytes of
/// `kubectl apply`'s last-applied annotation with room to spare, and far
/// under etcd's request limit even with that annotation added.
pub const MAX_SLICE_BYTES: usize = 200_000;
/// The slices of one policy's members, with their sizes in bytes.
#[derive(Debug)]
pub struct Sliced {
    pub slices: Vec<IPSetMemberSlice>,
    pub bytes: Vec<usize>,
    /// The count the expected fill alone asks for.
    pub minimum: usize,
    /// Why the count is larger than that.
    pub raised: Option<Raised>,
}

/// Cut `members` (sorted, distinct) into the slices of `policy`.
pub fn slice_members(
    policy: &str,
    members: &[String],
    max_members: usize,
) -> Result<Sliced, TooMany> {
    let limits = Limits {
        max_members,
        max_bytes: MAX_SLICE_BYTES,
    };
    let built = partition(
        members,
        limits,
        |count, index, ms| {
            let slice = slice_object(policy, index, count, ms);
            let bytes = json_bytes(&slice);
            (slice, bytes)
        },
        |(_, bytes)| *bytes,
    )?;
    let (slices, bytes) = built.slices.into_iter().unzip();
    Ok(Sliced {
        slices,
        bytes,
        minimum: built.minimum,
        raised: built.raised,
    })
}
