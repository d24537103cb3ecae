//! What a kernel ipset is: types, typed members, compact member storage, names.

pub mod icmp;
pub mod member;
pub mod member_set;
pub mod names;
pub mod types;

pub use member::{Member, MemberError, OneOrTwo, Parsed, Proto};
pub use member_set::{MemberSet, MemberSetBuilder};
pub use names::{MAX_SET_NAME_LEN, Naming};
pub use types::{DEFAULT_MAX_ELEM, Family, SetHeader, SetKind, SetType};
