//! Desired sets into BPF sets: the family, the trie's size and the entries
//! each set holds, or why a prefix map cannot hold it exactly.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipsetmgr_ipset::{Family, SetKind, SetType};
use ipsetmgr_sets::{DesiredSet, SetError};

use crate::entry::{self, Entry};

/// The entries of a set by network (address, prefix length); the value is
/// the `nomatch` flag. One value per network, as the trie holds it.
pub(crate) type Entries = BTreeMap<(IpAddr, u8), bool>;

/// What the kernel holds, or is to hold, for one set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub family: Family,
    /// The trie's `max_entries`: the policy's `maxElem` (at least 1, which
    /// the kernel requires of any map).
    pub max_entries: u32,
    /// Shared with the belief once written: a million entries are held
    /// once per set, not once per copy.
    pub entries: Arc<Entries>,
}

/// The entries a dump gave, by network.
pub(crate) fn entries_of(dumped: Vec<Entry>) -> Entries {
    dumped
        .into_iter()
        .map(|e| ((e.addr(), e.prefix()), e.nomatch()))
        .collect()
}

/// An entry of [`Entries`] as the crate writes it.
pub(crate) fn entry(addr: IpAddr, prefix: u8, nomatch: bool) -> Entry {
    entry::from_key(addr, u32::from(prefix), u8::from(!nomatch))
}

/// Not "not supported by this kernel": no BPF prefix map can hold it.
fn unrepresentable(kind: SetKind, why: impl std::fmt::Display) -> SetError {
    SetError::Unrepresentable(format!("{kind} cannot be a BPF set: {why}"))
}

/// The shape of `d` under the pin name `name`.
pub(crate) fn shape(name: &str, d: &DesiredSet) -> Result<Shape, SetError> {
    let kind = d.header.kind;
    if !matches!(kind.set_type, SetType::HashIp | SetType::HashNet) {
        return Err(unrepresentable(
            kind,
            "a longest-prefix-match map holds address prefixes only (hash:ip, hash:net)",
        ));
    }
    let Some(family) = kind.family else {
        return Err(unrepresentable(kind, "the set has no address family"));
    };
    // `options.comment` is no reason to refuse: comments are left out of
    // the map (they change no lookup's answer; crate::entry).
    if d.header.options.mask.is_some() {
        return Err(unrepresentable(
            kind,
            "hash:ip's netmask/bitmask (addresses stored masked) is not kept by a prefix map",
        ));
    }
    if crate::store::validate_name(name).is_err() {
        return Err(SetError::Unrepresentable(format!(
            "{name} is not a BPF set name (a pin name: letters, digits, '-', '_', '.', not starting with '.')"
        )));
    }
    let mut entries = Entries::new();
    for m in d.members.iter() {
        let e = Entry::try_from(&m).map_err(|e| {
            SetError::Unrepresentable(format!("BPF set {name} cannot hold member {m}: {e}"))
        })?;
        if e.family() != family {
            return Err(SetError::Unrepresentable(format!(
                "BPF set {name} is of family {family:?}; member {m} is not"
            )));
        }
        entries.insert((e.addr(), e.prefix()), e.nomatch());
    }
    Ok(Shape {
        family,
        max_entries: d.header.max_elem.max(1),
        entries: Arc::new(entries),
    })
}

/// What turns `have` into `want` in place: networks to remove, and
/// entries to add or overwrite (a changed `nomatch` flag is one update of
/// the value, never a removal and an add).
pub(crate) fn diff(want: &Entries, have: &Entries) -> (Vec<Entry>, Vec<Entry>) {
    // One merge walk of the two sorted maps: a 10-member change to a 1M set
    // is planned in linear, sequential time rather than 2M tree lookups
    // (docs/performance.md, "BPF sets").
    let (mut del, mut add) = (Vec::new(), Vec::new());
    let (mut w, mut h) = (want.iter().peekable(), have.iter().peekable());
    loop {
        let order = match (w.peek(), h.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((wk, _)), Some((hk, _))) => wk.cmp(hk),
        };
        match order {
            Ordering::Less => {
                let ((a, p), n) = w.next().expect("peeked");
                add.push(entry(*a, *p, *n));
            }
            Ordering::Greater => {
                let ((a, p), n) = h.next().expect("peeked");
                del.push(entry(*a, *p, *n));
            }
            Ordering::Equal => {
                let (((a, p), n), (_, old)) =
                    (w.next().expect("peeked"), h.next().expect("peeked"));
                if n != old {
                    add.push(entry(*a, *p, *n));
                }
            }
        }
    }
    (del, add)
}

/// Entries in `a` (network and flag) that `b` does not hold alike.
pub(crate) fn missing_from(a: &Entries, b: &Entries) -> usize {
    a.iter().filter(|(k, v)| b.get(k) != Some(v)).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_ipset::{HeaderOptions, Member, MemberSet, SetHeader};

    fn desired(kind: SetKind, members: Vec<Member>) -> DesiredSet {
        DesiredSet {
            name: "ipm4-p".into(),
            policy: "p".into(),
            header: SetHeader {
                kind,
                max_elem: 16,
                hash_size: None,
                options: HeaderOptions::default(),
            },
            members: Arc::new(MemberSet::from_members(kind, members)),
        }
    }

    fn net(s: &str, nomatch: bool) -> Member {
        let (a, p) = s.split_once('/').unwrap();
        Member::Net {
            addr: a.parse().unwrap(),
            prefix: p.parse().unwrap(),
            nomatch,
        }
    }

    #[test]
    fn only_address_prefixes_are_held_and_others_say_why() {
        let kind = SetKind {
            set_type: SetType::HashNet,
            family: Some(Family::V4),
        };
        let d = desired(
            kind,
            vec![net("10.0.0.0/8", false), net("10.1.0.0/16", true)],
        );
        let s = shape("ipm4-p", &d).unwrap();
        assert_eq!(s.max_entries, 16);
        assert_eq!(s.entries.len(), 2);
        let port = SetKind {
            set_type: SetType::HashIpPort,
            family: Some(Family::V4),
        };
        let err = shape("ipm4-p", &desired(port, vec![])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "hash:ip,port inet cannot be a BPF set: a longest-prefix-match map holds address prefixes only (hash:ip, hash:net)"
        );
        assert!(matches!(err, SetError::Unrepresentable(_)));
    }

    #[test]
    fn a_flag_change_is_an_overwrite_not_a_removal() {
        let a: Entries = [(("10.0.0.0".parse().unwrap(), 8), false)].into();
        let b: Entries = [(("10.0.0.0".parse().unwrap(), 8), true)].into();
        let (del, add) = diff(&b, &a);
        assert!(del.is_empty());
        assert_eq!(add.len(), 1);
        assert!(add[0].nomatch());
        assert_eq!(missing_from(&a, &b), 1);
    }

    proptest::proptest! {
        /// The merge walk gives what the definition says: removed are the
        /// networks `want` lacks, added the entries `have` lacks or holds
        /// with another flag.
        #[test]
        fn the_merge_walk_is_the_definition(
            want in proptest::collection::btree_map((0u8..64, 24u8..=32), proptest::bool::ANY, 0..40),
            have in proptest::collection::btree_map((0u8..64, 24u8..=32), proptest::bool::ANY, 0..40),
        ) {
            let net = |m: std::collections::BTreeMap<(u8, u8), bool>| -> Entries {
                m.into_iter()
                    .map(|((last, p), n)| ((IpAddr::from([10, 0, 0, last]), p), n))
                    .collect()
            };
            let (want, have) = (net(want), net(have));
            let (del, add) = diff(&want, &have);
            let del_def: Vec<Entry> = have
                .iter()
                .filter(|(k, _)| !want.contains_key(k))
                .map(|((a, p), n)| entry(*a, *p, *n))
                .collect();
            let add_def: Vec<Entry> = want
                .iter()
                .filter(|(k, v)| have.get(k) != Some(v))
                .map(|((a, p), n)| entry(*a, *p, *n))
                .collect();
            proptest::prop_assert_eq!(del, del_def);
            proptest::prop_assert_eq!(add, add_def);
        }
    }
}
