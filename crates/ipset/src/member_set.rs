//! Compact storage for the members of one set.
//!
//! A million IPv4 members must fit in a few megabytes, so members of kinds
//! that fit in 64 bits (every IPv4 kind and MAC) are packed into a `u64`
//! and stored in a hash set of integers; other kinds are stored as
//! [`Member`] values. Packing is private: callers only see [`Member`].
//!
//! Sets built in bulk (compiled policies, sets read back from the kernel) go
//! through [`MemberSetBuilder`] into a sorted vector instead, packed or not:
//! appending and sorting a million values (on the threads that parsed them,
//! then merged) is several times cheaper than a million random-access hash
//! inserts, such sets are only ever looked up, iterated and diffed, and two
//! sorted sets diff in one merge. Any mutation turns one into a hash set.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr};

/// The hasher of every member hash set. foldhash, seeded per process:
/// FxHash (used before) hashes an IPv6 address through its byte-slice path
/// so badly that 2^20 sequential /64 networks share one 7-bit tag and 16,384
/// of 2^20 bucket indexes, and every insert compared against dozens of
/// members (a sixth of a 1M IPv6 hash:net apply went to `Member::eq`). A per-process seed also keeps a crafted
/// list (a url source is someone else's file) from choosing its collisions.
type MemberHasher = foldhash::fast::RandomState;
type HashSet<T> = std::collections::HashSet<T, MemberHasher>;
type HashMap<K, V> = std::collections::HashMap<K, V, MemberHasher>;

use crate::member::{Member, Proto};
use crate::types::{Family, SetKind, SetType};

#[derive(Clone, Debug)]
enum Store {
    Packed(HashSet<u64>),
    /// Packed, sorted and without duplicates (a kernel snapshot).
    Sorted(Vec<u64>),
    Full(HashSet<Member>),
    /// Full, sorted and without duplicates (a snapshot of a wide kind).
    SortedFull(Vec<Member>),
}

/// The members of one set of a known [`SetKind`].
#[derive(Clone, Debug)]
pub struct MemberSet {
    kind: SetKind,
    store: Store,
}

fn packable(kind: SetKind) -> bool {
    match kind.set_type {
        SetType::HashMac | SetType::BitmapIp | SetType::BitmapPort => true,
        SetType::HashIp | SetType::HashNet | SetType::HashIpPort | SetType::HashIpMark => {
            kind.family == Some(Family::V4)
        }
        // Wider keys (two addresses, interface names) use the full store.
        SetType::ListSet
        | SetType::HashNetPort
        | SetType::HashIpPortIp
        | SetType::HashIpPortNet
        | SetType::HashNetIface => false,
    }
}

/// Pack a member of a packable kind. Returns `None` for members that do not
/// belong to this kind (which callers treat as "not present").
fn pack(kind: SetKind, m: &Member) -> Option<u64> {
    match (kind.set_type, m) {
        (SetType::HashIp, Member::Ip(IpAddr::V4(a))) => Some(u32::from(*a) as u64),
        (
            SetType::HashNet,
            Member::Net {
                addr: IpAddr::V4(a),
                prefix,
                nomatch,
            },
        ) => Some((u32::from(*a) as u64) << 9 | (*prefix as u64) << 1 | *nomatch as u64),
        (
            SetType::HashIpPort,
            Member::IpPort {
                addr: IpAddr::V4(a),
                proto,
                port,
            },
        ) => Some((u32::from(*a) as u64) << 24 | (proto.number() as u64) << 16 | *port as u64),
        (
            SetType::HashIpMark,
            Member::IpMark {
                addr: IpAddr::V4(a),
                mark,
            },
        ) => Some((u32::from(*a) as u64) << 32 | *mark as u64),
        (SetType::BitmapIp, Member::Ip(IpAddr::V4(a))) => Some(u32::from(*a) as u64),
        (SetType::BitmapPort, Member::Port(p)) => Some(*p as u64),
        (SetType::HashMac, Member::Mac(b)) => {
            let mut v = [0u8; 8];
            v[2..].copy_from_slice(b);
            Some(u64::from_be_bytes(v))
        }
        _ => None,
    }
}

fn unpack(kind: SetKind, v: u64) -> Member {
    let v4 = |bits: u64| IpAddr::V4(Ipv4Addr::from(bits as u32));
    match kind.set_type {
        SetType::HashIp | SetType::BitmapIp => Member::Ip(v4(v)),
        SetType::BitmapPort => Member::Port(v as u16),
        SetType::HashIpMark => Member::IpMark {
            addr: v4(v >> 32),
            mark: v as u32,
        },
        SetType::HashNet => Member::Net {
            addr: v4(v >> 9),
            prefix: ((v >> 1) & 0xff) as u8,
            nomatch: v & 1 == 1,
        },
        SetType::HashIpPort => Member::IpPort {
            addr: v4(v >> 24),
            // Only valid protocol numbers are ever packed.
            proto: Proto::from_number(((v >> 16) & 0xff) as u8).unwrap_or(Proto::Tcp),
            port: (v & 0xffff) as u16,
        },
        SetType::HashMac => {
            let b = v.to_be_bytes();
            Member::Mac([b[2], b[3], b[4], b[5], b[6], b[7]])
        }
        // Never packed (see `packable`); a harmless value rather than a panic.
        SetType::ListSet
        | SetType::HashNetPort
        | SetType::HashIpPortIp
        | SetType::HashIpPortNet
        | SetType::HashNetIface => Member::Set("".into()),
    }
}

impl MemberSet {
    pub fn new(kind: SetKind) -> MemberSet {
        MemberSet::with_capacity(kind, 0)
    }

    pub fn with_capacity(kind: SetKind, n: usize) -> MemberSet {
        let store = if packable(kind) {
            Store::Packed(HashSet::with_capacity_and_hasher(n, Default::default()))
        } else {
            Store::Full(HashSet::with_capacity_and_hasher(n, Default::default()))
        };
        MemberSet { kind, store }
    }

    pub fn from_members(kind: SetKind, members: impl IntoIterator<Item = Member>) -> MemberSet {
        let mut s = MemberSet::new(kind);
        for m in members {
            s.insert(m);
        }
        s
    }

    pub fn kind(&self) -> SetKind {
        self.kind
    }

    pub fn len(&self) -> usize {
        match &self.store {
            Store::Packed(s) => s.len(),
            Store::Sorted(v) => v.len(),
            Store::Full(s) => s.len(),
            Store::SortedFull(v) => v.len(),
        }
    }

    /// Commented members do not pack: the first one moves the set to the
    /// full store (comments are rare; most sets never pay for them).
    fn spill(&mut self) {
        let kind = self.kind;
        let values: Vec<u64> = match &mut self.store {
            Store::Full(_) | Store::SortedFull(_) => return,
            Store::Packed(s) => s.drain().collect(),
            Store::Sorted(v) => std::mem::take(v),
        };
        self.store = Store::Full(values.into_iter().map(|v| unpack(kind, v)).collect());
    }

    /// A sorted snapshot becomes a hash set before its first mutation.
    fn thaw(&mut self) {
        match &mut self.store {
            Store::Sorted(v) => {
                let set: HashSet<u64> = std::mem::take(v).into_iter().collect();
                self.store = Store::Packed(set);
            }
            Store::SortedFull(v) => {
                let set: HashSet<Member> = std::mem::take(v).into_iter().collect();
                self.store = Store::Full(set);
            }
            Store::Packed(_) | Store::Full(_) => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Insert; returns whether it was new. A member of another kind is
    /// refused (returns false): callers validate members against the kind.
    pub fn insert(&mut self, m: Member) -> bool {
        self.thaw();
        if m.comment().is_some() {
            self.spill();
        }
        match &mut self.store {
            Store::Packed(s) => pack(self.kind, &m).is_some_and(|v| s.insert(v)),
            Store::Full(s) => s.insert(m),
            // Not reached after thaw(); kept correct rather than panicking.
            Store::Sorted(v) => pack(self.kind, &m).is_some_and(|x| sorted_insert(v, x)),
            Store::SortedFull(v) => sorted_insert(v, m),
        }
    }

    pub fn remove(&mut self, m: &Member) -> bool {
        self.thaw();
        match &mut self.store {
            Store::Packed(s) => pack(self.kind, m).is_some_and(|v| s.remove(&v)),
            Store::Full(s) => s.remove(m),
            // Not reached after thaw(); kept correct rather than panicking.
            Store::Sorted(v) => pack(self.kind, m)
                .and_then(|x| v.binary_search(&x).ok())
                .map(|i| v.remove(i))
                .is_some(),
            Store::SortedFull(v) => find(v, m).map(|i| v.remove(i)).is_ok(),
        }
    }

    pub fn contains(&self, m: &Member) -> bool {
        match &self.store {
            Store::Packed(s) => pack(self.kind, m).is_some_and(|v| s.contains(&v)),
            Store::Sorted(v) => pack(self.kind, m).is_some_and(|x| v.binary_search(&x).is_ok()),
            Store::Full(s) => s.contains(m),
            Store::SortedFull(v) => find(v, m).is_ok(),
        }
    }

    /// Whether the packed value `v` is present (packed stores only).
    fn contains_packed(&self, v: u64) -> bool {
        match &self.store {
            Store::Packed(s) => s.contains(&v),
            Store::Sorted(sorted) => sorted.binary_search(&v).is_ok(),
            Store::Full(_) | Store::SortedFull(_) => false,
        }
    }

    pub fn clear(&mut self) {
        match &mut self.store {
            Store::Packed(s) => s.clear(),
            Store::Sorted(v) => v.clear(),
            Store::Full(s) => s.clear(),
            Store::SortedFull(v) => v.clear(),
        }
    }

    /// The addresses of a hash:ip IPv4 set, ascending, when it holds them
    /// packed and sorted (as a compiled set does): a million are then read
    /// without making a [`Member`] of each. `None` for any other set.
    pub fn sorted_ipv4_hosts(&self) -> Option<impl ExactSizeIterator<Item = Ipv4Addr> + '_> {
        match (&self.store, self.kind.set_type, self.kind.family) {
            (Store::Sorted(v), SetType::HashIp, Some(Family::V4)) => {
                Some(v.iter().map(|a| Ipv4Addr::from(*a as u32)))
            }
            _ => None,
        }
    }

    /// Members in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = Member> + '_ {
        let kind = self.kind;
        let (packed, sorted, full, sorted_full) = match &self.store {
            Store::Packed(s) => (
                Some(s.iter().map(move |v| unpack(kind, *v))),
                None,
                None,
                None,
            ),
            Store::Sorted(v) => (
                None,
                Some(v.iter().map(move |v| unpack(kind, *v))),
                None,
                None,
            ),
            Store::Full(s) => (None, None, Some(s.iter().cloned()), None),
            Store::SortedFull(v) => (None, None, None, Some(v.iter().cloned())),
        };
        packed
            .into_iter()
            .flatten()
            .chain(sorted.into_iter().flatten())
            .chain(full.into_iter().flatten())
            .chain(sorted_full.into_iter().flatten())
    }

    /// Members of `self` that are not in `other`, without unpacking when both
    /// sides are packed (the hot path of resync).
    pub fn difference<'a>(&'a self, other: &'a MemberSet) -> Vec<Member> {
        let kind = self.kind;
        let packed_other = matches!(other.store, Store::Packed(_) | Store::Sorted(_));
        match &self.store {
            Store::Packed(a) if packed_other && kind == other.kind => a
                .iter()
                .filter(|v| !other.contains_packed(**v))
                .map(|v| unpack(kind, *v))
                .collect(),
            Store::Sorted(a) if packed_other && kind == other.kind => a
                .iter()
                .filter(|v| !other.contains_packed(**v))
                .map(|v| unpack(kind, *v))
                .collect(),
            _ => self.iter().filter(|m| !other.contains(m)).collect(),
        }
    }

    /// `(self - other, other - self)`. When one side is a kernel snapshot
    /// (sorted), the other is sorted once and both are merged in one pass:
    /// far cheaper for a million members than a million lookups each way.
    pub fn diff_both(&self, other: &MemberSet) -> (Vec<Member>, Vec<Member>) {
        let sorted = |s: &MemberSet| matches!(s.store, Store::Sorted(_) | Store::SortedFull(_));
        if self.kind == other.kind && (sorted(self) || sorted(other)) {
            let kind = self.kind;
            if let (Some(a), Some(b)) = (self.sorted_packed(), other.sorted_packed()) {
                return merge_diff(&a, &b, |v| unpack(kind, *v));
            }
            if let (Some(a), Some(b)) = (self.sorted_full(), other.sorted_full()) {
                return merge_diff(&a, &b, Member::clone);
            }
        }
        (self.difference(other), other.difference(self))
    }

    /// The packed values in ascending order (borrowed for snapshots).
    fn sorted_packed(&self) -> Option<Cow<'_, [u64]>> {
        match &self.store {
            Store::Sorted(v) => Some(Cow::Borrowed(v)),
            Store::Packed(s) => Some(sorted_copy(s)),
            Store::Full(_) | Store::SortedFull(_) => None,
        }
    }

    /// The members of a full store in ascending order (borrowed for
    /// snapshots).
    fn sorted_full(&self) -> Option<Cow<'_, [Member]>> {
        match &self.store {
            Store::SortedFull(v) => Some(Cow::Borrowed(v)),
            Store::Full(s) => Some(sorted_copy(s)),
            Store::Packed(_) | Store::Sorted(_) => None,
        }
    }

    /// Pairs of members that the kernel would store as ONE entry: the same
    /// hash:net network once with and once without `nomatch` (the flag is
    /// not part of the kernel's key). Such a set cannot be held faithfully:
    /// every write would flip the flag. At most `limit` pairs, each as
    /// (without nomatch, with nomatch).
    pub fn nomatch_conflicts(&self, limit: usize) -> Vec<(Member, Member)> {
        match &self.store {
            Store::Full(set) => return key_conflicts(set.iter(), |k| set.contains(k), limit),
            Store::SortedFull(v) => {
                return key_conflicts(v.iter(), |k| find(v, k).is_ok(), limit);
            }
            Store::Packed(_) | Store::Sorted(_) => {}
        }
        if !self.kind.set_type.has_nomatch() {
            return Vec::new();
        }
        let mut out = Vec::new();
        match &self.store {
            Store::Sorted(v) => {
                // The flag is the lowest bit of the packed value, so a
                // conflicting pair is adjacent once sorted.
                for w in v.windows(2) {
                    if out.len() == limit {
                        break;
                    }
                    if w[0] >> 1 == w[1] >> 1 {
                        out.push((unpack(self.kind, w[0]), unpack(self.kind, w[1])));
                    }
                }
            }
            Store::Packed(set) => {
                for &x in set {
                    if out.len() == limit {
                        break;
                    }
                    if x & 1 == 0 && set.contains(&(x | 1)) {
                        out.push((unpack(self.kind, x), unpack(self.kind, x | 1)));
                    }
                }
            }
            Store::Full(_) | Store::SortedFull(_) => {}
        }
        out
    }

    /// The union of `parts` (all of `kind`), and how many members were in
    /// more than one part. Packed parts are merged as integers: the union of
    /// a policy's member slices costs one sort of the packed values, not a
    /// hash insert per member.
    pub fn union(kind: SetKind, parts: &[&MemberSet]) -> (MemberSet, usize) {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let all_packed = parts
            .iter()
            .all(|p| p.kind == kind && matches!(p.store, Store::Packed(_) | Store::Sorted(_)));
        if packable(kind) && all_packed {
            let mut v: Vec<u64> = Vec::with_capacity(total);
            for p in parts {
                match &p.store {
                    Store::Sorted(s) => v.extend_from_slice(s),
                    Store::Packed(s) => v.extend(s.iter().copied()),
                    Store::Full(_) | Store::SortedFull(_) => {}
                }
            }
            let dups = sort_dedup(&mut v);
            return (
                MemberSet {
                    kind,
                    store: Store::Sorted(v),
                },
                dups,
            );
        }
        if !packable(kind) && parts.iter().all(|p| p.kind == kind) {
            // Wide members are merged the same way, as values.
            let mut v: Vec<Member> = Vec::with_capacity(total);
            for p in parts {
                v.extend(p.iter());
            }
            let dups = sort_dedup(&mut v);
            let store = Store::SortedFull(v);
            return (MemberSet { kind, store }, dups);
        }
        let mut out = MemberSet::with_capacity(kind, total);
        for p in parts {
            for m in p.iter() {
                out.insert(m);
            }
        }
        let dups = total - out.len();
        (out, dups)
    }

    /// Whether any member has a comment (only the full store can hold one).
    pub fn has_comments(&self) -> bool {
        match &self.store {
            Store::Full(s) => s.iter().any(|m| m.comment().is_some()),
            Store::SortedFull(v) => v.iter().any(|m| m.comment().is_some()),
            Store::Packed(_) | Store::Sorted(_) => false,
        }
    }

    /// Sorted canonical strings: for stable output and tests.
    pub fn sorted_strings(&self) -> Vec<String> {
        let mut v: Vec<Member> = self.iter().collect();
        v.sort();
        v.iter().map(|m| m.to_string()).collect()
    }
}

/// Pairs of members that are one kernel entry (the same key with another
/// nomatch flag or comment), at most `limit`: only members with such an
/// attribute can be one side of a pair, so only they are looked at.
/// `contains` is membership in the set `members` come from.
fn key_conflicts<'a>(
    members: impl Iterator<Item = &'a Member>,
    contains: impl Fn(&Member) -> bool,
    limit: usize,
) -> Vec<(Member, Member)> {
    let mut out = Vec::new();
    let mut seen: HashMap<Member, &Member> = Default::default();
    let mut attributed: Vec<(Member, &Member)> =
        members.filter_map(|m| Some((m.key_only()?, m))).collect();
    // Stable pairs whatever the hash order.
    attributed.sort_by(|a, b| a.1.cmp(b.1));
    for (key, m) in attributed {
        if out.len() == limit {
            break;
        }
        if contains(&key) {
            out.push((key, m.clone()));
        } else if let Some(first) = seen.get(&key) {
            out.push(((*first).clone(), m.clone()));
        } else {
            seen.insert(key, m);
        }
    }
    out
}

/// The order of sorted stores: exactly [`Ord`], computed faster where the
/// derived comparison is slow. Sorting a million IPv6 members (a kernel
/// snapshot arrives in hash order) through the derived `Member` order,
/// which goes through `IpAddr` and the variant's fields one call at a time,
/// took longer than the kernel's dump of them.
trait SortOrder: Ord {
    fn order(&self, other: &Self) -> std::cmp::Ordering {
        self.cmp(other)
    }
}

impl SortOrder for u64 {}

impl SortOrder for Member {
    fn order(&self, other: &Member) -> std::cmp::Ordering {
        use std::net::IpAddr::V6;
        // The derived order compares the variant, then the fields in
        // order; an IPv6 address compares as its 128-bit number. The fast
        // paths are those same comparisons on integers (a property test
        // checks them against `Ord`).
        match (self, other) {
            (Member::Ip(V6(a)), Member::Ip(V6(b))) => u128::from(*a).cmp(&u128::from(*b)),
            (
                Member::Net {
                    addr: V6(a),
                    prefix: pa,
                    nomatch: na,
                },
                Member::Net {
                    addr: V6(b),
                    prefix: pb,
                    nomatch: nb,
                },
            ) => (u128::from(*a), pa, na).cmp(&(u128::from(*b), pb, nb)),
            _ => self.cmp(other),
        }
    }
}

/// Where `x` is (or would go) in the sorted `v`.
fn find<T: SortOrder>(v: &[T], x: &T) -> Result<usize, usize> {
    v.binary_search_by(|y| y.order(x))
}

/// The values of a hash set, sorted.
fn sorted_copy<'a, T: SortOrder + Clone + 'a>(set: &HashSet<T>) -> Cow<'a, [T]> {
    let mut v: Vec<T> = set.iter().cloned().collect();
    v.sort_unstable_by(T::order);
    Cow::Owned(v)
}

/// Insert `x` into the sorted, duplicate-free `v`; whether it was new.
fn sorted_insert<T: SortOrder>(v: &mut Vec<T>, x: T) -> bool {
    match find(v, &x) {
        Ok(_) => false,
        Err(i) => {
            v.insert(i, x);
            true
        }
    }
}

/// `(a - b, b - a)` of two sorted, duplicate-free slices in one merge.
fn merge_diff<T: SortOrder>(
    a: &[T],
    b: &[T],
    member: impl Fn(&T) -> Member,
) -> (Vec<Member>, Vec<Member>) {
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    // A change to a big set leaves long equal runs: skip them a block at a
    // time (a memcmp for packed values), so a 10-member change of a
    // million-member set costs a scan at memory speed rather than a million
    // comparisons.
    const BLOCK: usize = 64;
    while i < a.len() && j < b.len() {
        if let (Some(x), Some(y)) = (a.get(i..i + BLOCK), b.get(j..j + BLOCK))
            && x == y
        {
            i += BLOCK;
            j += BLOCK;
            continue;
        }
        match a[i].order(&b[j]) {
            std::cmp::Ordering::Less => {
                only_a.push(member(&a[i]));
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                only_b.push(member(&b[j]));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    only_a.extend(a[i..].iter().map(&member));
    only_b.extend(b[j..].iter().map(&member));
    (only_a, only_b)
}

/// Sort `v` and drop its duplicates; how many were dropped.
fn sort_dedup<T: SortOrder>(v: &mut Vec<T>) -> usize {
    let before = v.len();
    v.sort_unstable_by(T::order);
    v.dedup();
    before - v.len()
}

/// Merge two sorted, duplicate-free vectors into one; how many values were
/// in both.
fn merge_sorted<T: SortOrder>(a: Vec<T>, b: Vec<T>) -> (Vec<T>, usize) {
    if a.is_empty() || b.is_empty() {
        return (if a.is_empty() { b } else { a }, 0);
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let mut dups = 0;
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        match x.order(y) {
            std::cmp::Ordering::Less => out.extend(a.next()),
            std::cmp::Ordering::Greater => out.extend(b.next()),
            std::cmp::Ordering::Equal => {
                dups += 1;
                b.next();
                out.extend(a.next());
            }
        }
    }
    out.extend(a);
    out.extend(b);
    (out, dups)
}

/// Builds a [`MemberSet`] in bulk (a compiled policy, a kernel listing).
///
/// Members are appended, then sorted and deduplicated once, by
/// [`MemberSetBuilder::finish`]. Wide (unpacked) members, which are slow to
/// sort, can be sorted earlier by [`MemberSetBuilder::presort`] on the
/// thread that pushed them (the policy compiler parses big lists on several
/// threads), so that [`MemberSetBuilder::absorb`] only merges sorted runs.
/// Packed values are always sorted by `finish`: a million of them sort in
/// tens of milliseconds, and merging presorted packed runs was measured to
/// leave `ipsetmgr run` 4 MiB more resident with 1M IPv4 members.
#[derive(Debug)]
pub struct MemberSetBuilder {
    kind: SetKind,
    packed: Vec<u64>,
    full: Vec<Member>,
    refused: usize,
    /// A commented member arrived: everything is in `full` from then on.
    spilled: bool,
    /// `full` is sorted and without duplicates.
    full_sorted: bool,
}

impl MemberSetBuilder {
    /// `n` is a capacity hint (the kernel's announced entry count).
    pub fn with_capacity(kind: SetKind, n: usize) -> MemberSetBuilder {
        let (packed, full) = if packable(kind) {
            (Vec::with_capacity(n), Vec::new())
        } else {
            (Vec::new(), Vec::with_capacity(n))
        };
        MemberSetBuilder {
            kind,
            packed,
            full,
            refused: 0,
            spilled: false,
            full_sorted: true,
        }
    }

    pub fn kind(&self) -> SetKind {
        self.kind
    }

    /// Add one member; members of another kind and duplicates are counted
    /// (see [`MemberSetBuilder::finish`]) instead of stored.
    pub fn push(&mut self, m: Member) {
        if m.comment().is_some() {
            self.spill();
        }
        if packable(self.kind) && !self.spilled {
            match pack(self.kind, &m) {
                Some(v) => self.packed.push(v),
                None => self.refused += 1,
            }
        } else {
            self.full.push(m);
            self.full_sorted = false;
        }
    }

    /// Move what is packed to the full store (see [`MemberSet::spill`]).
    fn spill(&mut self) {
        if self.spilled || !packable(self.kind) {
            return;
        }
        self.spilled = true;
        let kind = self.kind;
        let packed = std::mem::take(&mut self.packed);
        self.full
            .extend(packed.into_iter().map(|v| unpack(kind, v)));
        self.full_sorted = false;
    }

    /// Sort and deduplicate the wide members pushed so far (duplicates are
    /// counted as refused). Cheap to call again.
    pub fn presort(&mut self) {
        if !self.full_sorted {
            self.refused += sort_dedup(&mut self.full);
            self.full_sorted = true;
        }
    }

    /// Take over the members pushed into `other` (same kind), e.g. from
    /// another thread.
    pub fn absorb(&mut self, mut other: MemberSetBuilder) {
        if other.spilled {
            self.spill();
        }
        if self.spilled {
            other.spill();
        }
        self.refused += other.refused;
        self.packed.extend(other.packed);
        if self.full_sorted && other.full_sorted {
            let (full, dups) = merge_sorted(std::mem::take(&mut self.full), other.full);
            self.full = full;
            self.refused += dups;
        } else {
            self.full.extend(other.full);
            self.full_sorted = false;
        }
    }

    /// The set, and how many members were refused (wrong kind or duplicate).
    pub fn finish(mut self) -> (MemberSet, usize) {
        self.presort();
        self.refused += sort_dedup(&mut self.packed);
        let store = if !packable(self.kind) || self.spilled {
            Store::SortedFull(self.full)
        } else {
            Store::Sorted(self.packed)
        };
        let set = MemberSet {
            kind: self.kind,
            store,
        };
        (set, self.refused)
    }
}

impl PartialEq for MemberSet {
    fn eq(&self, other: &MemberSet) -> bool {
        self.kind == other.kind
            && self.len() == other.len()
            && self.iter().all(|m| other.contains(&m))
    }
}

impl Eq for MemberSet {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(t: SetType) -> SetKind {
        SetKind::new(t, Some(Family::V4))
    }

    /// The (first) member `text` parses to.
    fn first(set_type: SetType, text: &str) -> Member {
        let parsed = Member::parse_user(set_type, text).unwrap();
        parsed.members.into_iter().next().unwrap()
    }

    /// The member hasher must spread members that differ in a few middle
    /// bytes of an IPv6 address (sequential /64 networks, a common shape of
    /// generated lists) over buckets and tags: FxHash put these 65,536
    /// networks on 1 tag and 64 bucket indexes.
    #[test]
    fn member_hashes_spread_sequential_ipv6_networks() {
        use std::hash::BuildHasher;
        let hasher = MemberHasher::default();
        let n: u64 = 1 << 16;
        let base = u128::from(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0));
        let mut buckets = HashSet::default();
        let mut tags = HashSet::default();
        for i in 0..n {
            let m = Member::Net {
                addr: IpAddr::V6(std::net::Ipv6Addr::from(base + (u128::from(i) << 64))),
                prefix: 64,
                nomatch: false,
            };
            let h = hasher.hash_one(&m);
            buckets.insert(h & (n - 1));
            // hashbrown's tag: the top seven bits.
            tags.insert(h >> 57);
        }
        // A random function fills about 63% of n buckets with n keys.
        assert!(
            buckets.len() as u64 > n / 2,
            "{} buckets of {n}",
            buckets.len()
        );
        assert_eq!(tags.len(), 128, "{} tags of 128", tags.len());
    }

    proptest! {
        #[test]
        fn packed_round_trip(a in any::<u32>(), prefix in 1u8..=32, nomatch in any::<bool>(), port in any::<u16>(), mac in any::<[u8; 6]>()) {
            let addr = IpAddr::V4(Ipv4Addr::from(a));
            let cases = [
                (v4(SetType::HashIp), Member::Ip(addr)),
                (v4(SetType::HashNet), Member::Net { addr: crate::num::mask(addr, prefix), prefix, nomatch }),
                (v4(SetType::HashIpPort), Member::IpPort { addr, proto: Proto::Udp, port }),
                (SetKind::new(SetType::HashMac, None), Member::Mac(mac)),
                (v4(SetType::BitmapIp), Member::Ip(addr)),
                (SetKind::new(SetType::BitmapPort, None), Member::Port(port)),
                (v4(SetType::HashIpMark), Member::IpMark { addr, mark: a.rotate_left(7) }),
            ];
            for (kind, m) in cases {
                let v = pack(kind, &m).expect("packable");
                prop_assert_eq!(unpack(kind, v), m);
            }
        }
    }

    proptest! {
        /// The merge of two snapshots, with its block skips, against plain
        /// set differences: big sets with a few members changed, removed
        /// and added anywhere (runs longer and shorter than a block).
        #[test]
        fn merged_diffs_equal_set_differences(
            base in prop::collection::btree_set(0u32..20_000, 0..3_000),
            removed in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
            added in prop::collection::vec(0u32..20_000, 0..20),
        ) {
            let k = v4(SetType::HashIp);
            let ip = |v: u32| Member::Ip(IpAddr::V4(Ipv4Addr::from(v)));
            let old: Vec<u32> = base.iter().copied().collect();
            let mut new = base.clone();
            for r in &removed {
                if !old.is_empty() {
                    new.remove(&old[r.index(old.len())]);
                }
            }
            new.extend(added.iter().copied());
            let snapshot = |vals: &std::collections::BTreeSet<u32>| {
                let mut b = MemberSetBuilder::with_capacity(k, vals.len());
                vals.iter().for_each(|v| b.push(ip(*v)));
                b.finish().0
            };
            let (a, b) = (snapshot(&new), snapshot(&base));
            let (mut only_new, mut only_old) = a.diff_both(&b);
            only_new.sort();
            only_old.sort();
            let want_new: Vec<Member> = new.difference(&base).map(|v| ip(*v)).collect();
            let want_old: Vec<Member> = base.difference(&new).map(|v| ip(*v)).collect();
            prop_assert_eq!(only_new, want_new);
            prop_assert_eq!(only_old, want_old);
        }
    }

    proptest! {
        /// Builders split across "threads" (presorted or not, absorbed in
        /// either state) and finished equal the set of what was pushed, with
        /// every duplicate counted; snapshots of wide members diff by merge
        /// exactly like hash sets; for IPv4 and IPv6, with comments (which
        /// spill packed kinds to the full store).
        #[test]
        fn built_snapshots_equal_their_model(
            v6 in any::<bool>(),
            values in prop::collection::vec((0u16..400, any::<bool>()), 0..600),
            other in prop::collection::vec((0u16..400, any::<bool>()), 0..600),
            split in any::<prop::sample::Index>(),
            presort in any::<(bool, bool)>(),
        ) {
            let kind = SetKind::new(SetType::HashNet, Some(if v6 { Family::V6 } else { Family::V4 }));
            let member = |&(v, commented): &(u16, bool)| {
                let text = if v6 { format!("2001:db8:{v:x}::/48") } else { format!("10.{}.{}.0/24", v >> 8, v & 0xff) };
                let text = if commented { format!("{text} comment:c{}", v % 3) } else { text };
                first(SetType::HashNet, &text)
            };
            let build = |vals: &[(u16, bool)]| {
                let cut = if vals.is_empty() { 0 } else { split.index(vals.len()) };
                let (mut a, mut b) = (MemberSetBuilder::with_capacity(kind, 0), MemberSetBuilder::with_capacity(kind, 0));
                vals[..cut].iter().for_each(|v| a.push(member(v)));
                vals[cut..].iter().for_each(|v| b.push(member(v)));
                if presort.0 { a.presort(); }
                if presort.1 { b.presort(); }
                a.absorb(b);
                a.finish()
            };
            let model = |vals: &[(u16, bool)]| vals.iter().map(member).collect::<std::collections::BTreeSet<Member>>();
            let (set, refused) = build(&values);
            let want = model(&values);
            prop_assert_eq!(refused, values.len() - want.len());
            prop_assert_eq!(set.iter().collect::<std::collections::BTreeSet<Member>>(), want.clone());
            prop_assert!(want.iter().all(|m| set.contains(m)));

            let (snap, _) = build(&other);
            let hashed = MemberSet::from_members(kind, other.iter().map(member));
            let want_other = model(&other);
            let expect_a: Vec<Member> = want.difference(&want_other).cloned().collect();
            let expect_b: Vec<Member> = want_other.difference(&want).cloned().collect();
            for b in [&snap, &hashed] {
                let (mut only_a, mut only_b) = set.diff_both(b);
                only_a.sort();
                only_b.sort();
                prop_assert_eq!(&only_a, &expect_a);
                prop_assert_eq!(&only_b, &expect_b);
            }
            let (u, dups) = MemberSet::union(kind, &[&set, &snap]);
            prop_assert_eq!(u.len() + dups, set.len() + snap.len());
            prop_assert_eq!(u.iter().collect::<std::collections::BTreeSet<Member>>(), want.union(&want_other).cloned().collect());
        }
    }

    proptest! {
        /// The sorted stores' fast order is exactly `Ord`, across variants,
        /// families, prefixes, nomatch and comments.
        #[test]
        fn the_fast_order_is_ord(
            a in (any::<u8>(), any::<u128>(), 0u8..4, any::<bool>(), any::<bool>()),
            b in (any::<u8>(), any::<u128>(), 0u8..4, any::<bool>(), any::<bool>()),
            same in any::<(bool, bool)>(),
        ) {
            let member = |(shape, addr, prefix, nomatch, commented): (u8, u128, u8, bool, bool)| {
                let v6 = IpAddr::V6(std::net::Ipv6Addr::from(addr));
                let v4 = IpAddr::V4(Ipv4Addr::from(addr as u32));
                let m = match shape % 5 {
                    0 => Member::Ip(v6),
                    1 => Member::Net { addr: v6, prefix: prefix % 129, nomatch },
                    2 => Member::Ip(v4),
                    3 => Member::Net { addr: v4, prefix: prefix % 33, nomatch },
                    _ => Member::Port(addr as u16),
                };
                if commented { m.with_comment(crate::Comment::parse("c").unwrap()) } else { m }
            };
            // Often the same variant and address, so that the later fields
            // decide.
            let b = (if same.0 { a.0 } else { b.0 }, if same.1 { a.1 } else { b.1 }, b.2, b.3, b.4);
            let (x, y) = (member(a), member(b));
            prop_assert_eq!(x.order(&y), x.cmp(&y));
            prop_assert_eq!(y.order(&x), y.cmp(&x));
            prop_assert_eq!(x.order(&x), std::cmp::Ordering::Equal);
        }
    }

    #[test]
    fn wide_snapshots_find_conflicts_and_thaw_on_mutation() {
        let v6 = SetKind::new(SetType::HashNet, Some(Family::V6));
        let net = |s: &str| first(SetType::HashNet, s);
        let mut b = MemberSetBuilder::with_capacity(v6, 3);
        for m in ["2001:db8::/32 nomatch", "2001:db8::/32", "2001:db9::/32"] {
            b.push(net(m));
        }
        let (mut snap, refused) = b.finish();
        assert_eq!(refused, 0);
        let found = snap.nomatch_conflicts(10);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0.to_string(), "2001:db8::/32");
        assert!(snap.contains(&net("2001:db9::/32")));
        assert!(snap.insert(net("2001:dba::/32")));
        assert!(!snap.insert(net("2001:dba::/32")));
        assert!(snap.remove(&net("2001:db8::/32")));
        assert_eq!(
            snap.sorted_strings(),
            ["2001:db8::/32 nomatch", "2001:db9::/32", "2001:dba::/32"]
        );
    }

    #[test]
    fn difference_and_membership() {
        let k = v4(SetType::HashIp);
        let ip = |s: &str| Member::Ip(s.parse().unwrap());
        let a = MemberSet::from_members(k, [ip("10.0.0.1"), ip("10.0.0.2")]);
        let b = MemberSet::from_members(k, [ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(a.difference(&b), vec![ip("10.0.0.1")]);
        assert!(a.contains(&ip("10.0.0.2")));
        assert!(!a.contains(&Member::Ip("::1".parse().unwrap())));
        assert_ne!(a, b);
    }

    #[test]
    fn snapshots_behave_like_hash_sets() {
        let k = v4(SetType::HashIp);
        let ip = |s: &str| Member::Ip(s.parse().unwrap());
        let mut b = MemberSetBuilder::with_capacity(k, 4);
        for m in ["10.0.0.3", "10.0.0.1", "10.0.0.3", "10.0.0.2"] {
            b.push(ip(m));
        }
        b.push(Member::Ip("::1".parse().unwrap()));
        let (mut snap, refused) = b.finish();
        assert_eq!(refused, 2, "one duplicate, one of the wrong family");
        let hashed = MemberSet::from_members(k, [ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(snap, hashed);
        assert!(snap.contains(&ip("10.0.0.2")) && !snap.contains(&ip("10.0.0.9")));
        let desired = MemberSet::from_members(k, [ip("10.0.0.1"), ip("10.0.0.9")]);
        assert_eq!(desired.difference(&snap), vec![ip("10.0.0.9")]);
        let (missing, mut surplus) = desired.diff_both(&snap);
        surplus.sort();
        assert_eq!(missing, vec![ip("10.0.0.9")]);
        assert_eq!(surplus, vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        let mut extra = snap.difference(&desired);
        extra.sort();
        assert_eq!(extra, vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        // Mutation turns the snapshot into a hash set, keeping its content.
        assert!(snap.insert(ip("10.0.0.4")));
        assert!(snap.remove(&ip("10.0.0.1")));
        assert_eq!(snap.sorted_strings(), ["10.0.0.2", "10.0.0.3", "10.0.0.4"]);
    }

    #[test]
    fn a_million_distinct_ipv4_members_stay_distinct() {
        let kind = v4(SetType::HashIp);
        let mut s = MemberSet::with_capacity(kind, 1_000_000);
        for i in 0..1_000_000u32 {
            s.insert(Member::Ip(Ipv4Addr::from(0x0a00_0000 + i).into()));
        }
        assert_eq!(s.len(), 1_000_000);
    }

    #[test]
    fn nomatch_conflicts_are_found_in_every_store() {
        let net = |s: &str| Member::parse_user(SetType::HashNet, s).unwrap().members;
        let items = [
            "10.0.0.0/8",
            "10.0.0.0/8 nomatch",
            "10.9.0.0/16 nomatch",
            "10.8.0.0/16",
        ];
        let want = (
            net("10.0.0.0/8").into_iter().next().unwrap(),
            net("10.0.0.0/8 nomatch").into_iter().next().unwrap(),
        );
        let kind = v4(SetType::HashNet);
        let mut b = MemberSetBuilder::with_capacity(kind, 4);
        for i in items {
            net(i).into_iter().for_each(|m| b.push(m));
        }
        let (sorted, _) = b.finish();
        assert_eq!(sorted.nomatch_conflicts(10), vec![want.clone()]);
        let hashed = MemberSet::from_members(kind, items.iter().flat_map(|i| net(i)));
        assert_eq!(hashed.nomatch_conflicts(10), vec![want]);

        let v6 = SetKind::new(SetType::HashNet, Some(Family::V6));
        let full = MemberSet::from_members(
            v6,
            [
                "2001:db8::/32",
                "2001:db8::/32 nomatch",
                "2001:db9::/32 nomatch",
            ]
            .iter()
            .flat_map(|i| net(i)),
        );
        let found = full.nomatch_conflicts(10);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0.to_string(), "2001:db8::/32");
        assert_eq!(found[0].1.to_string(), "2001:db8::/32 nomatch");
        assert!(full.nomatch_conflicts(0).is_empty());
    }

    #[test]
    fn unions_merge_packed_and_full_parts() {
        let k = v4(SetType::HashIp);
        let ip = |s: &str| Member::Ip(s.parse().unwrap());
        let mut b = MemberSetBuilder::with_capacity(k, 2);
        b.push(ip("10.0.0.2"));
        b.push(ip("10.0.0.1"));
        let (sorted, _) = b.finish();
        let hashed = MemberSet::from_members(k, [ip("10.0.0.2"), ip("10.0.0.3")]);
        let (u, dups) = MemberSet::union(k, &[&sorted, &hashed]);
        assert_eq!(dups, 1);
        assert_eq!(u.sorted_strings(), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let k6 = SetKind::new(SetType::HashIp, Some(Family::V6));
        let a = MemberSet::from_members(k6, [Member::Ip("::1".parse().unwrap())]);
        let b = MemberSet::from_members(
            k6,
            [
                Member::Ip("::1".parse().unwrap()),
                Member::Ip("::2".parse().unwrap()),
            ],
        );
        let (u, dups) = MemberSet::union(k6, &[&a, &b]);
        assert_eq!((u.len(), dups), (2, 1));
        assert!(MemberSet::union(k, &[]).0.is_empty());
    }

    #[test]
    fn ipv6_members_use_full_storage() {
        let k = SetKind::new(SetType::HashIp, Some(Family::V6));
        let mut s = MemberSet::new(k);
        assert!(s.insert(Member::Ip("::1".parse().unwrap())));
        assert!(!s.insert(Member::Ip("::1".parse().unwrap())));
        assert_eq!(s.sorted_strings(), ["::1"]);
    }

    #[test]
    fn a_commented_member_moves_a_packed_set_to_the_full_store() {
        let k = v4(SetType::HashIp);
        let parse = |s: &str| first(SetType::HashIp, s);
        let mut b = MemberSetBuilder::with_capacity(k, 3);
        b.push(parse("10.0.0.1"));
        b.push(parse("10.0.0.2 comment:two"));
        b.push(parse("10.0.0.3"));
        let (set, refused) = b.finish();
        assert_eq!(refused, 0);
        assert_eq!(
            set.sorted_strings(),
            ["10.0.0.1", "10.0.0.3", "10.0.0.2 comment \"two\""]
        );
        let mut hashed = MemberSet::from_members(k, [parse("10.0.0.1")]);
        assert!(hashed.insert(parse("10.0.0.1 comment:one")));
        assert_eq!(hashed.len(), 2);
        // One key, twice: a conflict the compiler reports.
        assert_eq!(
            hashed.nomatch_conflicts(10),
            vec![(parse("10.0.0.1"), parse("10.0.0.1 comment:one"))]
        );
        let (u, _) = MemberSet::union(k, &[&set, &hashed]);
        assert_eq!(u.len(), 4);
    }
}
