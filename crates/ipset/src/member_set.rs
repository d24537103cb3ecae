//! Compact storage for the members of one set.
//!
//! A million IPv4 members must fit in a few megabytes, so members of kinds
//! that fit in 64 bits (every IPv4 kind and MAC) are packed into a `u64`
//! and stored in a hash set of integers; other kinds are stored as
//! [`Member`] values. Packing is private: callers only see [`Member`].
//!
//! Sets built in bulk (compiled policies, sets read back from the kernel) go
//! through [`MemberSetBuilder`] into a sorted vector instead: appending and
//! sorting a million integers is several times cheaper than a million
//! random-access hash inserts, and such sets are only ever looked up,
//! iterated and diffed. Any mutation turns one into a hash set.

use std::net::{IpAddr, Ipv4Addr};

use rustc_hash::FxHashSet;

use crate::member::{Member, Proto};
use crate::types::{Family, SetKind, SetType};

#[derive(Clone, Debug)]
enum Store {
    Packed(FxHashSet<u64>),
    /// Packed, sorted and without duplicates (a kernel snapshot).
    Sorted(Vec<u64>),
    Full(FxHashSet<Member>),
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
            Store::Packed(FxHashSet::with_capacity_and_hasher(n, Default::default()))
        } else {
            Store::Full(FxHashSet::with_capacity_and_hasher(n, Default::default()))
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
        }
    }

    /// Commented members do not pack: the first one moves the set to the
    /// full store (comments are rare; most sets never pay for them).
    fn spill(&mut self) {
        let kind = self.kind;
        let values: Vec<u64> = match &mut self.store {
            Store::Full(_) => return,
            Store::Packed(s) => s.drain().collect(),
            Store::Sorted(v) => std::mem::take(v),
        };
        self.store = Store::Full(values.into_iter().map(|v| unpack(kind, v)).collect());
    }

    /// A sorted snapshot becomes a hash set before its first mutation.
    fn thaw(&mut self) {
        if let Store::Sorted(v) = &mut self.store {
            let set: FxHashSet<u64> = std::mem::take(v).into_iter().collect();
            self.store = Store::Packed(set);
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
            Store::Sorted(v) => pack(self.kind, &m).is_some_and(|x| match v.binary_search(&x) {
                Ok(_) => false,
                Err(i) => {
                    v.insert(i, x);
                    true
                }
            }),
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
        }
    }

    pub fn contains(&self, m: &Member) -> bool {
        match &self.store {
            Store::Packed(s) => pack(self.kind, m).is_some_and(|v| s.contains(&v)),
            Store::Sorted(v) => pack(self.kind, m).is_some_and(|x| v.binary_search(&x).is_ok()),
            Store::Full(s) => s.contains(m),
        }
    }

    /// Whether the packed value `v` is present (packed stores only).
    fn contains_packed(&self, v: u64) -> bool {
        match &self.store {
            Store::Packed(s) => s.contains(&v),
            Store::Sorted(sorted) => sorted.binary_search(&v).is_ok(),
            Store::Full(_) => false,
        }
    }

    pub fn clear(&mut self) {
        match &mut self.store {
            Store::Packed(s) => s.clear(),
            Store::Sorted(v) => v.clear(),
            Store::Full(s) => s.clear(),
        }
    }

    /// Members in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = Member> + '_ {
        let kind = self.kind;
        let (packed, sorted, full) = match &self.store {
            Store::Packed(s) => (Some(s.iter().map(move |v| unpack(kind, *v))), None, None),
            Store::Sorted(v) => (None, Some(v.iter().map(move |v| unpack(kind, *v))), None),
            Store::Full(s) => (None, None, Some(s.iter().cloned())),
        };
        packed
            .into_iter()
            .flatten()
            .chain(sorted.into_iter().flatten())
            .chain(full.into_iter().flatten())
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
        let any_sorted =
            matches!(self.store, Store::Sorted(_)) || matches!(other.store, Store::Sorted(_));
        let (Some(a), Some(b)) = (self.sorted_packed(), other.sorted_packed()) else {
            return (self.difference(other), other.difference(self));
        };
        if !any_sorted || self.kind != other.kind {
            return (self.difference(other), other.difference(self));
        }
        let kind = self.kind;
        let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        // A change to a big set leaves long equal runs: skip them a block at
        // a time (a memcmp), so a 10-member change of a million-member set
        // costs a scan at memory speed rather than a million comparisons.
        const BLOCK: usize = 64;
        while i < a.len() && j < b.len() {
            if let (Some(x), Some(y)) = (a.get(i..i + BLOCK), b.get(j..j + BLOCK))
                && x == y
            {
                i += BLOCK;
                j += BLOCK;
                continue;
            }
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Less => {
                    only_a.push(unpack(kind, a[i]));
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    only_b.push(unpack(kind, b[j]));
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    i += 1;
                    j += 1;
                }
            }
        }
        only_a.extend(a[i..].iter().map(|v| unpack(kind, *v)));
        only_b.extend(b[j..].iter().map(|v| unpack(kind, *v)));
        (only_a, only_b)
    }

    /// The packed values in ascending order (borrowed for snapshots).
    fn sorted_packed(&self) -> Option<std::borrow::Cow<'_, [u64]>> {
        match &self.store {
            Store::Sorted(v) => Some(std::borrow::Cow::Borrowed(v)),
            Store::Packed(s) => {
                let mut v: Vec<u64> = s.iter().copied().collect();
                v.sort_unstable();
                Some(std::borrow::Cow::Owned(v))
            }
            Store::Full(_) => None,
        }
    }

    /// Pairs of members that the kernel would store as ONE entry: the same
    /// hash:net network once with and once without `nomatch` (the flag is
    /// not part of the kernel's key). Such a set cannot be held faithfully:
    /// every write would flip the flag. At most `limit` pairs, each as
    /// (without nomatch, with nomatch).
    pub fn nomatch_conflicts(&self, limit: usize) -> Vec<(Member, Member)> {
        if let Store::Full(set) = &self.store {
            return key_conflicts(set, limit);
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
            Store::Full(_) => {}
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
            .all(|p| p.kind == kind && !matches!(p.store, Store::Full(_)));
        if packable(kind) && all_packed {
            let mut v: Vec<u64> = Vec::with_capacity(total);
            for p in parts {
                match &p.store {
                    Store::Sorted(s) => v.extend_from_slice(s),
                    Store::Packed(s) => v.extend(s.iter().copied()),
                    Store::Full(_) => {}
                }
            }
            v.sort_unstable();
            v.dedup();
            let dups = total - v.len();
            return (
                MemberSet {
                    kind,
                    store: Store::Sorted(v),
                },
                dups,
            );
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
fn key_conflicts(set: &FxHashSet<Member>, limit: usize) -> Vec<(Member, Member)> {
    let mut out = Vec::new();
    let mut seen: rustc_hash::FxHashMap<Member, &Member> = Default::default();
    let mut attributed: Vec<&Member> = set.iter().filter(|m| m.key_only().is_some()).collect();
    // Stable pairs whatever the hash order.
    attributed.sort();
    for m in attributed {
        if out.len() == limit {
            break;
        }
        let key = m.key();
        if set.contains(&key) {
            out.push((key, m.clone()));
        } else if let Some(first) = seen.get(&key) {
            out.push(((*first).clone(), m.clone()));
        } else {
            seen.insert(key, m);
        }
    }
    out
}

/// Builds a [`MemberSet`] in bulk (a compiled policy, a kernel listing).
#[derive(Debug)]
pub struct MemberSetBuilder {
    kind: SetKind,
    packed: Vec<u64>,
    full: FxHashSet<Member>,
    refused: usize,
    /// A commented member arrived: everything is in `full` from then on.
    spilled: bool,
}

impl MemberSetBuilder {
    /// `n` is a capacity hint (the kernel's announced entry count).
    pub fn with_capacity(kind: SetKind, n: usize) -> MemberSetBuilder {
        let (packed, full) = if packable(kind) {
            (Vec::with_capacity(n), FxHashSet::default())
        } else {
            (
                Vec::new(),
                FxHashSet::with_capacity_and_hasher(n, Default::default()),
            )
        };
        MemberSetBuilder {
            kind,
            packed,
            full,
            refused: 0,
            spilled: false,
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
        } else if !self.full.insert(m) {
            self.refused += 1;
        }
    }

    /// Move what is packed to the full store (see [`MemberSet::spill`]).
    fn spill(&mut self) {
        if self.spilled || !packable(self.kind) {
            return;
        }
        self.spilled = true;
        let kind = self.kind;
        for v in std::mem::take(&mut self.packed) {
            if !self.full.insert(unpack(kind, v)) {
                self.refused += 1;
            }
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
        self.packed.extend(other.packed);
        self.refused += other.refused;
        for m in other.full {
            self.push(m);
        }
    }

    /// The set, and how many members were refused (wrong kind or duplicate).
    pub fn finish(mut self) -> (MemberSet, usize) {
        if !packable(self.kind) || self.spilled {
            let store = Store::Full(self.full);
            return (
                MemberSet {
                    kind: self.kind,
                    store,
                },
                self.refused,
            );
        }
        self.packed.sort_unstable();
        let before = self.packed.len();
        self.packed.dedup();
        let refused = self.refused + before - self.packed.len();
        let store = Store::Sorted(self.packed);
        (
            MemberSet {
                kind: self.kind,
                store,
            },
            refused,
        )
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

    proptest! {
        #[test]
        fn packed_round_trip(a in any::<u32>(), prefix in 1u8..=32, nomatch in any::<bool>(), port in any::<u16>(), mac in any::<[u8; 6]>()) {
            let addr = IpAddr::V4(Ipv4Addr::from(a));
            let cases = [
                (v4(SetType::HashIp), Member::Ip(addr)),
                (v4(SetType::HashNet), Member::Net { addr: crate::member::mask(addr, prefix), prefix, nomatch }),
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
        let parse = |s: &str| {
            Member::parse_user(SetType::HashIp, s)
                .unwrap()
                .members
                .into_iter()
                .next()
                .unwrap()
        };
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
