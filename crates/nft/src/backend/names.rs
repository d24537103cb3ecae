//! nft set names for desired sets, and which nft sets the backend owns.
//!
//! nft names are not limited to ipset's 31 bytes, so a policy's set is
//! `<prefix><letter>-<policy>` in full (`ipm4-blocklist`), with the prefix
//! and family letter the ipset side uses. The ipset name of a long policy
//! is shortened with a hash; the nft name is derived again from the policy
//! and the family letter (which the shortened name keeps). Only when the
//! full name would pass nf_tables' 255 bytes is the ipset name used as it
//! is (it is owned too). list:set members name the sets they list by
//! their project names, which the compiler maps to desired sets.

use ipsetmgr_ipset::{Family, Naming};

use crate::{MAX_NAME_LEN, is_valid_name};

/// The family letters of owned names (no temp sets: nft needs no swap).
const LETTERS: [(char, Option<Family>); 3] = [
    ('4', Some(Family::V4)),
    ('6', Some(Family::V6)),
    ('x', None),
];

/// The nft name of the desired set whose ipset name is `ipset_name`.
pub(crate) fn nft_set_name(naming: &Naming, ipset_name: &str, policy: &str) -> String {
    let letter = ipset_name[..]
        .strip_prefix(naming.prefix())
        .and_then(|rest| rest.chars().next())
        .filter(|c| LETTERS.iter().any(|(l, _)| l == c));
    let Some(letter) = letter else {
        return ipset_name.to_string();
    };
    let full = format!("{}{letter}-{policy}", naming.prefix());
    if full.len() <= MAX_NAME_LEN && is_valid_name(&full) {
        full
    } else {
        ipset_name.to_string()
    }
}

/// Whether the backend owns the nft set `name`: the prefix, a family
/// letter, `-` and at least one byte, and a name nf_tables takes.
pub(crate) fn owns(naming: &Naming, name: &str) -> bool {
    is_valid_name(name)
        && name
            .strip_prefix(naming.prefix())
            .and_then(|rest| rest.get(..2))
            .is_some_and(|tag| matches!(tag, "4-" | "6-" | "x-"))
        && name.len() > naming.prefix().len() + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_policy_names_and_ownership() {
        let n = Naming::default();
        assert_eq!(
            nft_set_name(&n, "ipm4-blocklist", "blocklist"),
            "ipm4-blocklist"
        );
        let long = "a-very-long-policy-name-for-the-edge-nodes";
        let short = n.main_set_name(long, Some(Family::V6));
        assert!(short.len() <= 31);
        let full = nft_set_name(&n, &short, long);
        assert_eq!(full, format!("ipm6-{long}"));
        assert!(owns(&n, &full) && owns(&n, &short));
        // Past nf_tables' limit the ipset name serves.
        let huge = "p".repeat(253);
        let short = n.main_set_name(&huge, Some(Family::V4));
        assert_eq!(nft_set_name(&n, &short, &huge), short);
        for foreign in ["ipmt-1", "ipm4-", "other", "ipmz-x", "KUBE-X", "ipm4x"] {
            assert!(!owns(&n, foreign), "{foreign}");
        }
    }
}
