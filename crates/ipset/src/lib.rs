//! What a kernel ipset is: set types and families, typed members with their
//! canonical rendering, compact member storage, and the kernel names this
//! project owns. Pure data: no I/O, no Kubernetes, no async runtime, no
//! unsafe code. The architecture is described in `docs/architecture.md`.

#![forbid(unsafe_code)]

mod addr_mask;
mod comment;
mod error;
mod header;
pub mod icmp;
mod iface;
mod member;
mod member_set;
mod names;
mod num;
mod range;
pub mod text;
mod types;

pub use addr_mask::{AddrMask, MaskError};
pub use comment::{Comment, MAX_COMMENT_LEN};
pub use error::MemberError;
pub use header::{DEFAULT_MAX_ELEM, HeaderOptions, SetHeader};
pub use iface::{IfaceName, MAX_IFACE_LEN};
pub use member::{Commented, IpPortIp, IpPortNet, Member, NetIface, OneOrTwo, Parsed, Proto};
pub use member_set::{MemberSet, MemberSetBuilder};
pub use names::{BadPrefix, MAX_SET_NAME_LEN, Naming, is_path_component, is_valid_set_name};
pub use num::{host_mask, mask, to_u128};
pub use range::{MAX_BITMAP_ELEMENTS, RangeError, SetRange};
pub use types::{Family, SetKind, SetType, UnknownSetType};
