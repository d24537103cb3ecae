//! Spreading members over a power-of-two number of slices by a hash of each
//! member, so that the slices stay stable as the list changes: a member's
//! slice depends only on the member and the slice count B, never on its
//! neighbours. Adding or removing k members changes at most k slices, as
//! long as B stays the same; B is chosen from the list's size and only
//! doubles, so it changes rarely.

use sha2::block_api::compress256;

/// Slices are sized for this fill (percent of the member limit) on
/// average, leaving room for the hash's unevenness and for growth.
const TARGET_FILL_PERCENT: usize = 70;
/// The most slices made; past this the limits are unreasonable for the list.
pub(crate) const MAX_SLICES: usize = 1 << 16;

/// What one slice may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_members: usize,
    pub max_bytes: usize,
}

/// Which limit made the count larger than the expected fill asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raised {
    /// A slice would have held more than the member limit.
    Members,
    /// A slice would have been larger than the byte limit.
    Bytes,
}

/// The slices, by index; there are as many as the chosen count, empty ones
/// included, so that every name of that count exists.
#[derive(Debug)]
pub struct Partitioned<T> {
    pub slices: Vec<T>,
    /// The count the expected fill alone asks for.
    pub minimum: usize,
    /// Why the count is larger than `minimum`, if it is.
    pub raised: Option<Raised>,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "{members} members do not fit in {MAX_SLICES} slices of at most {} members and {} bytes; raise --max-members",
    limits.max_members,
    limits.max_bytes
)]
pub struct TooMany {
    pub members: usize,
    pub limits: Limits,
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const SHA256_INIT: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// The hash a member is placed by: the first 8 bytes of the SHA-256 of its
/// text, big-endian. A cryptographic hash, so that no list (however it was
/// made) piles up in one slice.
///
/// This pads the message itself and calls sha2's block function (built
/// optimised even in debug builds, see Cargo.toml) instead of
/// `Sha256::digest`, whose generic buffering is compiled into this crate:
/// in a debug build that costs over a second for a million members,
/// against 0.1 s for the hashing, and the tests slice millions. A test
/// checks it against `Sha256::digest`.
pub(crate) fn member_hash(member: &str) -> u64 {
    let bytes = member.as_bytes();
    let mut state = SHA256_INIT;
    let full = bytes.len() / 64 * 64;
    for block in bytes[..full].chunks_exact(64) {
        compress256(&mut state, &[block.try_into().expect("64 bytes")]);
    }
    // The rest, the 0x80 marker and the bit length: one block or two.
    let rest = &bytes[full..];
    let mut tail = [[0u8; 64]; 2];
    let blocks = if rest.len() < 56 { 1 } else { 2 };
    let flat = tail.as_flattened_mut();
    flat[..rest.len()].copy_from_slice(rest);
    flat[rest.len()] = 0x80;
    let bits = (bytes.len() as u64) * 8;
    flat[blocks * 64 - 8..blocks * 64].copy_from_slice(&bits.to_be_bytes());
    compress256(&mut state, &tail[..blocks]);
    (u64::from(state[0]) << 32) | u64::from(state[1])
}

/// The slice of a member's hash among `count` slices.
pub(crate) fn slice_of(hash: u64, count: usize) -> usize {
    (hash % count as u64) as usize
}

/// The smallest power of two B with an expected fill (members / B) of at
/// most [`TARGET_FILL_PERCENT`] of the member limit.
pub(crate) fn minimum_count(members: usize, max_members: usize) -> usize {
    let per_slice = (max_members * TARGET_FILL_PERCENT).max(1);
    let mut count = 1;
    while count < MAX_SLICES && members * 100 > per_slice * count {
        count *= 2;
    }
    count
}

/// Partition `members` (in the order each slice should list them) into
/// slices: `build` makes slice `index` of `count` from its members, `size`
/// measures what was built. Starting at [`minimum_count`], the count doubles
/// until every slice is within `limits`.
pub fn partition<T>(
    members: &[String],
    limits: Limits,
    mut build: impl FnMut(usize, usize, &[&str]) -> T,
    size: impl Fn(&T) -> usize,
) -> Result<Partitioned<T>, TooMany> {
    let hashes: Vec<u64> = members.iter().map(|m| member_hash(m)).collect();
    let minimum = minimum_count(members.len(), limits.max_members);
    let mut raised = None;
    let mut count = minimum;
    while count <= MAX_SLICES {
        let buckets = assign(members, &hashes, count);
        if buckets.iter().any(|b| b.len() > limits.max_members) {
            raised = Some(Raised::Members);
        } else if let Some(slices) = build_within(&buckets, limits.max_bytes, &mut build, &size) {
            return Ok(Partitioned {
                slices,
                minimum,
                raised,
            });
        } else {
            raised = Some(Raised::Bytes);
        }
        count *= 2;
    }
    Err(TooMany {
        members: members.len(),
        limits,
    })
}

/// Members by slice, each slice keeping the input's order.
fn assign<'a>(members: &'a [String], hashes: &[u64], count: usize) -> Vec<Vec<&'a str>> {
    let mut buckets = vec![Vec::new(); count];
    for (member, &hash) in members.iter().zip(hashes) {
        buckets[slice_of(hash, count)].push(member.as_str());
    }
    buckets
}

/// Every slice built, or `None` as soon as one is over `max_bytes`.
fn build_within<T>(
    buckets: &[Vec<&str>],
    max_bytes: usize,
    build: &mut impl FnMut(usize, usize, &[&str]) -> T,
    size: &impl Fn(&T) -> usize,
) -> Option<Vec<T>> {
    let count = buckets.len();
    let mut slices = Vec::with_capacity(count);
    for (index, bucket) in buckets.iter().enumerate() {
        let slice = build(count, index, bucket);
        if size(&slice) > max_bytes {
            return None;
        }
        slices.push(slice);
    }
    Some(slices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Slices as plain member lists, sized by their JSON-ish length.
    fn plain(members: &[String], limits: Limits) -> Partitioned<Vec<String>> {
        partition(
            members,
            limits,
            |_, _, ms| ms.iter().map(|m| m.to_string()).collect(),
            |s: &Vec<String>| s.iter().map(|m| m.len() + 3).sum(),
        )
        .unwrap()
    }

    fn limits(max_members: usize) -> Limits {
        Limits {
            max_members,
            max_bytes: 200_000,
        }
    }

    #[test]
    fn the_minimum_count_is_the_smallest_power_of_two_at_70_percent() {
        assert_eq!(minimum_count(0, 5000), 1);
        assert_eq!(minimum_count(3500, 5000), 1);
        assert_eq!(minimum_count(3501, 5000), 2);
        assert_eq!(minimum_count(7000, 5000), 2);
        assert_eq!(minimum_count(1_000_000, 5000), 512);
        assert_eq!(minimum_count(usize::MAX / 200, 1), MAX_SLICES);
    }

    #[test]
    fn the_hash_is_the_first_eight_bytes_of_sha256_big_endian() {
        // SHA-256("abc") = ba7816bf8f01cfea 414140de5dae2223 ...
        assert_eq!(member_hash("abc"), 0xba78_16bf_8f01_cfea);
        assert_eq!(slice_of(0xba78_16bf_8f01_cfea, 16), 0xa);
        // Every length around the block and padding boundaries, and past
        // the longest member.
        for len in 0..=300 {
            let text: String = (0..len)
                .map(|i| char::from(b'!' + (i % 90) as u8))
                .collect();
            let digest = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes());
            let want = u64::from_be_bytes(digest[..8].try_into().unwrap());
            assert_eq!(member_hash(&text), want, "length {len}");
        }
    }

    #[test]
    fn every_slice_is_emitted_in_order_and_keeps_the_input_order() {
        let members: Vec<String> = (0..10_000)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect();
        let p = plain(&members, limits(5000));
        assert_eq!(p.slices.len(), 4);
        assert_eq!(p.raised, None);
        for slice in &p.slices {
            let positions: Vec<usize> = slice
                .iter()
                .map(|m| members.iter().position(|x| x == m).unwrap())
                .collect();
            assert!(positions.is_sorted(), "slice keeps the input order");
        }
        let empty = plain(&[], limits(5000));
        assert_eq!(empty.slices, [Vec::<String>::new()]);
    }

    #[test]
    fn the_count_doubles_for_the_member_limit_and_for_the_byte_limit() {
        let members: Vec<String> = (0..70).map(|i| format!("m{i}")).collect();
        // 70 members at 70% of 100: one slice.
        assert_eq!(plain(&members, limits(100)).slices.len(), 1);
        // One member per slice: 100 members in the minimum of 256 slices
        // surely collide somewhere, so the count grows.
        let hundred: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
        let p = plain(&hundred, limits(1));
        assert_eq!((p.minimum, p.raised), (256, Some(Raised::Members)));
        assert!(p.slices.len() > 256);
        assert!(p.slices.iter().all(|s| s.len() <= 1));
        assert_eq!(p.slices.iter().map(Vec::len).sum::<usize>(), 100);
        let small_bytes = Limits {
            max_members: 100,
            max_bytes: 60,
        };
        let p = plain(&members, small_bytes);
        assert_eq!((p.minimum, p.raised), (1, Some(Raised::Bytes)));
        assert!(
            p.slices
                .iter()
                .all(|s| s.iter().map(|m| m.len() + 3).sum::<usize>() <= 60)
        );
    }

    #[test]
    fn impossible_limits_are_an_error_not_a_hang() {
        let members: Vec<String> = (0..5000).map(|i| format!("m{i}")).collect();
        let e = partition(&members, limits(1), |_, _, ms| ms.len(), |_| 0).unwrap_err();
        assert!(e.to_string().contains("do not fit in 65536 slices"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any list: every member in exactly one slice, within the limits;
        /// removing and adding k members in all, with the count unchanged,
        /// changes at most k slices.
        #[test]
        fn every_member_once_and_k_changes_touch_at_most_k_slices(
            members in proptest::collection::btree_set(any::<u32>(), 1..3000),
            max_members in 20usize..2000,
            removed in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
            added in proptest::collection::btree_set(any::<u32>(), 0..10),
        ) {
            let mut members: Vec<String> = members.iter().map(|m| format!("m{m}")).collect();
            members.sort();
            // Spelled apart from the members, so new.
            let added: Vec<String> = added.iter().map(|m| format!("new{m}")).collect();
            let before = plain(&members, limits(max_members));
            let mut out: Vec<&String> = before.slices.iter().flatten().collect();
            prop_assert!(before.slices.iter().all(|s| s.len() <= max_members));
            out.sort();
            prop_assert_eq!(out, members.iter().collect::<Vec<_>>());

            let gone: BTreeSet<usize> = removed.iter().map(|i| i.index(members.len())).collect();
            let mut changed: Vec<String> = members
                .iter()
                .enumerate()
                .filter(|(i, _)| !gone.contains(i))
                .map(|(_, m)| m.clone())
                .chain(added.iter().cloned())
                .collect();
            changed.sort();
            let after = plain(&changed, limits(max_members));
            if after.slices.len() == before.slices.len() {
                let differing = before.slices.iter().zip(&after.slices).filter(|(a, b)| a != b).count();
                prop_assert!(differing <= gone.len() + added.len(), "{} slices changed", differing);
            }
        }
    }
}
