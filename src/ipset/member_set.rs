//! Compact storage for the members of one set.
//!
//! A million IPv4 members must fit in a few megabytes, so members of kinds
//! that fit in 64 bits (every IPv4 kind and MAC) are packed into a `u64`
//! and stored in a hash set of integers; other kinds are stored as
//! [`Member`] values. Packing is private: callers only see [`Member`].

use std::net::{IpAddr, Ipv4Addr};

use rustc_hash::FxHashSet;

use super::member::{Member, Proto};
use super::types::{Family, SetKind, SetType};

#[derive(Clone, Debug)]
enum Store {
    Packed(FxHashSet<u64>),
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
        SetType::HashMac => true,
        SetType::ListSet => false,
        _ => kind.family == Some(Family::V4),
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
        SetType::HashIp => Member::Ip(v4(v)),
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
        SetType::ListSet => Member::Set("".into()),
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
            Store::Full(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Insert; returns whether it was new. A member of another kind is
    /// refused (returns false): callers validate members against the kind.
    pub fn insert(&mut self, m: Member) -> bool {
        match &mut self.store {
            Store::Packed(s) => pack(self.kind, &m).is_some_and(|v| s.insert(v)),
            Store::Full(s) => s.insert(m),
        }
    }

    pub fn remove(&mut self, m: &Member) -> bool {
        match &mut self.store {
            Store::Packed(s) => pack(self.kind, m).is_some_and(|v| s.remove(&v)),
            Store::Full(s) => s.remove(m),
        }
    }

    pub fn contains(&self, m: &Member) -> bool {
        match &self.store {
            Store::Packed(s) => pack(self.kind, m).is_some_and(|v| s.contains(&v)),
            Store::Full(s) => s.contains(m),
        }
    }

    pub fn clear(&mut self) {
        match &mut self.store {
            Store::Packed(s) => s.clear(),
            Store::Full(s) => s.clear(),
        }
    }

    /// Members in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = Member> + '_ {
        let kind = self.kind;
        let (packed, full) = match &self.store {
            Store::Packed(s) => (Some(s.iter().map(move |v| unpack(kind, *v))), None),
            Store::Full(s) => (None, Some(s.iter().cloned())),
        };
        packed
            .into_iter()
            .flatten()
            .chain(full.into_iter().flatten())
    }

    /// Members of `self` that are not in `other`, without unpacking when both
    /// sides are packed (the hot path of resync).
    pub fn difference<'a>(&'a self, other: &'a MemberSet) -> Vec<Member> {
        match (&self.store, &other.store) {
            (Store::Packed(a), Store::Packed(b)) if self.kind == other.kind => a
                .iter()
                .filter(|v| !b.contains(v))
                .map(|v| unpack(self.kind, *v))
                .collect(),
            _ => self.iter().filter(|m| !other.contains(m)).collect(),
        }
    }

    /// Sorted canonical strings: for stable output and tests.
    pub fn sorted_strings(&self) -> Vec<String> {
        let mut v: Vec<Member> = self.iter().collect();
        v.sort();
        v.iter().map(|m| m.to_string()).collect()
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
                (v4(SetType::HashNet), Member::Net { addr: super::super::member::mask(addr, prefix), prefix, nomatch }),
                (v4(SetType::HashIpPort), Member::IpPort { addr, proto: Proto::Udp, port }),
                (SetKind::new(SetType::HashMac, None), Member::Mac(mac)),
            ];
            for (kind, m) in cases {
                let v = pack(kind, &m).expect("packable");
                prop_assert_eq!(unpack(kind, v), m);
            }
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
    fn ipv6_members_use_full_storage() {
        let k = SetKind::new(SetType::HashIp, Some(Family::V6));
        let mut s = MemberSet::new(k);
        assert!(s.insert(Member::Ip("::1".parse().unwrap())));
        assert!(!s.insert(Member::Ip("::1".parse().unwrap())));
        assert_eq!(s.sorted_strings(), ["::1"]);
    }
}
