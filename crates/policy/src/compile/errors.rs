//! Why a policy was rejected: typed, and rendered to name the policy, the
//! slice (when a member came from one), the member and the reason.

use std::fmt;

use crate::selector::SelectorError;
use ipsetmgr_ipset::{AddrMask, Family, MaskError, MemberError, RangeError, SetRange, SetType};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyErrorKind {
    #[error("invalid policy name: {0}")]
    BadName(&'static str),
    #[error("{0}")]
    Member(#[from] MemberError),
    #[error("is an {found} member but the policy family is {expected}")]
    WrongFamily { found: Family, expected: Family },
    #[error("{count} members exceed maxElem {max}")]
    TooManyMembers { count: usize, max: u32 },
    /// A set without `maxElem` grows with its members up to this size.
    #[error(
        "{count} members exceed {max}, the most a set without maxElem grows to (16777216, or the cluster's --max-set-elements)"
    )]
    TooManyToGrow { count: usize, max: u32 },
    #[error("list:set refers to policy {0:?}, which does not exist on this node")]
    ListSetMissing(String),
    /// Not an error of the list: the member stays as the kernel holds it,
    /// the rest applied.
    #[error(
        "list:set member {0:?}: policy {0:?} is held (it failed); its set stays listed as long as the kernel holds it, and is listed once the policy applies"
    )]
    ListSetHeld(String),
    #[error("list:set cannot contain itself")]
    ListSetSelf,
    #[error("list:set cannot contain another list:set ({0:?}): the kernel forbids nesting")]
    ListSetNested(String),
    #[error("list:set refers to policy {0:?}, which has no {1} set")]
    ListSetFamily(String, Family),
    #[error("{0}")]
    Selector(#[from] SelectorError),
    #[error("is defined more than once")]
    Duplicate,
    #[error(
        "its kernel set name {set} is also the name of policy {other:?}'s set (the shortened names share their hash); rename one of the two policies"
    )]
    NameCollision { set: String, other: String },
    #[error(
        "conflicts with member {other:?}: both are the network {network}, which the kernel holds as one entry, either matching or excluded (nomatch); keep only one of them"
    )]
    NomatchConflict { other: String, network: String },
    #[error(
        "conflicts with member {other:?}: both are the entry {entry}, which the kernel holds once, with one comment; keep only one of them"
    )]
    CommentConflict { other: String, entry: String },
    #[error("{field} must be {range} (got {value})")]
    OutOfRange {
        field: &'static str,
        range: String,
        value: u32,
    },
    /// Held by what loading it found (a member list that did not load, a
    /// slice name given twice): its sets are left as they are.
    #[error("is held, its kernel sets left as they are: {0}")]
    Held(String),
    /// A member slice that could not be read at all.
    #[error("could not be read: {0}")]
    UnreadableSlice(String),
    /// A `membersFrom` source this setting cannot use (`name` is
    /// `membersFrom[i] (kind)`; `file` the policy file naming it).
    #[error("{name} in {file} is refused: {reason}")]
    RefusedSource {
        name: String,
        file: String,
        reason: String,
    },
    /// The policy object itself could not be read (an older, looser schema).
    #[error("could not be read: {0}")]
    Unreadable(String),
    /// A `membersFrom` source refused in a cluster (`membersFrom[i] (kind):
    /// reason`): the controller says Valid=False, and every agent holds it.
    #[error("{0}")]
    SourceRefused(String),
    /// A `membersFrom` source (`membersFrom[i] (kind)`) whose members the
    /// controller has not written yet: not invalid, but held until they are
    /// there, so that it never becomes an empty set.
    #[error(
        "{0} has not delivered members yet; its sets are held until the controller has written them"
    )]
    SourcePending(String),
    #[error("and {0} more bad members")]
    More(usize),
    #[error("{0} needs a range (for example 10.0.0.0/24 for bitmap:ip, 0-1023 for bitmap:port)")]
    RangeRequired(SetType),
    #[error("range: {0}")]
    BadRange(#[from] RangeError),
    #[error("{field} does not apply to {set_type}")]
    NotApplicable {
        field: &'static str,
        set_type: SetType,
    },
    #[error("{0} holds IPv4 addresses only; set family: IPv4")]
    Ipv4Only(SetType),
    #[error("is outside the set's range {0}")]
    OutsideRange(SetRange),
    #[error("netmask and bitmask exclude each other; keep one")]
    MasksExclusive,
    #[error("bitmask is an address of one family; use family IPv4 or IPv6, not Dual")]
    BitmaskDual,
    #[error("{0}")]
    BadMask(#[from] MaskError),
    #[error("is the all-zero address under {0}, which the kernel cannot store")]
    MaskedToNull(AddrMask),
    #[error("spec.except applies to types with an address part; {0} has none")]
    ExceptUnsupported(SetType),
    #[error("spec.except has {count} entries; at most {max}")]
    ExceptTooMany { count: usize, max: usize },
    #[error("spec.except entry \"{}\" is not a CIDR or address: {why}", entry.escape_debug())]
    ExceptBad {
        entry: String,
        why: ExceptEntryError,
    },
    #[error("spec.except entry {entry:?} is an {found} range but the policy family is {expected}")]
    ExceptWrongFamily {
        entry: String,
        found: Family,
        expected: String,
    },
    #[error(
        "spec.except cannot be used with bitmask: a bitmask entry stands for addresses that are no range, so no except range can be cut out of it exactly"
    )]
    ExceptWithBitmask,
    #[error(
        "spec.except entry {entry:?} cuts the entry {member} (netmask /{prefix}) in part; hash:ip has no nomatch, so that cannot be exact: except the whole /{prefix} or none of it"
    )]
    ExceptCutsEntry {
        entry: String,
        member: String,
        prefix: u8,
    },
    #[error(
        "spec.except adds {added} nomatch entries to {members} members, which exceeds maxElem {max}"
    )]
    ExceptOverMaxElem {
        members: usize,
        added: usize,
        max: u32,
    },
}

/// Why a `spec.except` entry is not an except range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExceptEntryError {
    #[error("{0}")]
    Member(#[from] MemberError),
    #[error("only a CIDR or an address, without nomatch or comment")]
    NotPlain,
}

/// A rejection, naming the policy, the slice and member (when there are
/// ones) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub policy: String,
    /// The member slice the member (or the error) comes from.
    pub slice: Option<String>,
    pub member: Option<String>,
    pub kind: PolicyErrorKind,
}

impl PolicyError {
    /// An error about the policy as a whole.
    pub fn of_policy(policy: &str, kind: PolicyErrorKind) -> PolicyError {
        PolicyError {
            policy: policy.to_string(),
            slice: None,
            member: None,
            kind,
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy {:?}: ", self.policy)?;
        if let Some(slice) = &self.slice {
            write!(f, "slice {slice:?}: ")?;
        }
        match &self.member {
            // escape_debug shows control characters (an injected newline) as text.
            Some(m) => write!(f, "member \"{}\" rejected: {}", m.escape_debug(), self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl std::error::Error for PolicyError {}
