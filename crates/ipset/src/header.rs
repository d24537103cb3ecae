//! The header a kernel set is created with (type, size, options); compared
//! on resync. Apart from `types.rs` because its options name ranges and
//! masks, which themselves need the set types.

use crate::addr_mask::AddrMask;
use crate::range::SetRange;
use crate::types::SetKind;

/// Default `maxelem` of a kernel set (the kernel's own default).
pub const DEFAULT_MAX_ELEM: u32 = 65536;

/// The header a kernel set is created with; compared on resync.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetHeader {
    pub kind: SetKind,
    /// maxelem; a list:set's `size`; a bitmap's number of elements (its
    /// range decides it: the kernel reports no maxelem for bitmaps).
    pub max_elem: u32,
    /// Only a creation hint: the kernel rounds it and grows tables, so it is
    /// never compared on resync.
    pub hash_size: Option<u32>,
    /// The options that change what the set holds; compared on resync.
    pub options: HeaderOptions,
}

/// Header options beyond type, family and size. Each changes what a set
/// holds or matches, so a kernel set whose options differ is replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeaderOptions {
    /// The range of a bitmap set (always present for bitmaps, never else).
    pub range: Option<SetRange>,
    /// Created with the `comment` extension: only sets of policies whose
    /// members have comments (the extension costs memory per entry).
    pub comment: bool,
    /// hash:ip's `netmask` or `bitmask` (never the default).
    pub mask: Option<AddrMask>,
}

/// Sets up to this many members are created with the kernel's default
/// hashsize (1024 buckets): it never resizes them more than a few times.
const DEFAULT_SIZED_UP_TO: usize = 2048;
/// The largest hashsize chosen from a member count (the policy may still say
/// a bigger one): 2^25 buckets serve 64 million members.
const MAX_SIZED_HASH_SIZE: u32 = 1 << 25;

impl SetHeader {
    /// This header with a hashsize for `members` entries when none is set.
    ///
    /// A hash set grows by doubling its table and rehashing every entry
    /// whenever one bucket fills (12 entries). Filling a new million-member
    /// set from the default 1024 buckets rehashes it nine times; created
    /// with the table it ends at (about two members per bucket, the size
    /// the kernel itself grows to), it never rehashes, and holds the same
    /// memory. Measured with `ipset restore` of 1M hash:ip members: 3.48 s
    /// from 1024 buckets, 2.92 s from 524288 (see docs/performance.md).
    pub fn sized_for(mut self, members: usize) -> SetHeader {
        if self.hash_size.is_none() && self.kind.set_type.is_hash() && members > DEFAULT_SIZED_UP_TO
        {
            let buckets = (members / 2)
                .checked_next_power_of_two()
                .and_then(|b| u32::try_from(b).ok())
                .unwrap_or(MAX_SIZED_HASH_SIZE);
            self.hash_size = Some(buckets.min(MAX_SIZED_HASH_SIZE));
        }
        self
    }

    /// Whether a kernel set with header `kernel` can stay in place for `self`.
    /// Only what changes behaviour counts: type, family, maxelem (list:set's
    /// `size` is likewise compared through `max_elem`) and the options.
    pub fn compatible_with(&self, kernel: &SetHeader) -> bool {
        let family_matches =
            !self.kind.set_type.has_family() || self.kind.family == kernel.kind.family;
        self.kind.set_type == kernel.kind.set_type
            && family_matches
            && self.max_elem == kernel.max_elem
            && self.options == kernel.options
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Family, SetType};

    fn header(set_type: SetType, hash_size: Option<u32>) -> SetHeader {
        SetHeader {
            kind: SetKind::new(set_type, Some(Family::V4)),
            max_elem: DEFAULT_MAX_ELEM,
            hash_size,
            options: HeaderOptions::default(),
        }
    }

    #[test]
    fn big_hash_sets_are_created_at_the_size_the_kernel_grows_them_to() {
        let h = header(SetType::HashIp, None);
        assert_eq!(
            h.clone().sized_for(10).hash_size,
            None,
            "small: the kernel default"
        );
        assert_eq!(h.clone().sized_for(DEFAULT_SIZED_UP_TO).hash_size, None);
        assert_eq!(h.clone().sized_for(1_000_000).hash_size, Some(1 << 19));
        assert_eq!(h.clone().sized_for(100_000).hash_size, Some(1 << 16));
        assert_eq!(
            h.sized_for(usize::MAX / 2).hash_size,
            Some(MAX_SIZED_HASH_SIZE)
        );
        // The policy's own hashSize wins; list:set has no hash table.
        assert_eq!(
            header(SetType::HashIp, Some(64))
                .sized_for(1_000_000)
                .hash_size,
            Some(64)
        );
        assert_eq!(
            header(SetType::ListSet, None)
                .sized_for(1_000_000)
                .hash_size,
            None
        );
    }
}
