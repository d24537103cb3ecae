//! Kernel error codes (standard errnos and ipset's private ones) mapped to
//! typed [`DataplaneError`]s. ipset's type-specific codes overlap between
//! set types (4352 is "hash full" for hash types but "set does not exist"
//! for list:set), so the mapping takes the set type of the operation.

use super::consts::*;
use crate::DataplaneError;
use ipsetmgr_ipset::{Member, SetType};

/// Which command failed, for the parts of the mapping that depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    Create,
    Destroy,
    Flush,
    Rename,
    Swap,
    Add,
    Del,
    List,
    Type,
    Protocol,
}

/// Context of a failed command.
#[derive(Clone, Copy, Debug)]
pub struct ErrCtx<'a> {
    pub cmd: Cmd,
    pub set: &'a str,
    /// The second set of swap and rename.
    pub set2: Option<&'a str>,
    pub set_type: Option<SetType>,
    /// The element the kernel named (batch lineno), if any.
    pub member: Option<&'a Member>,
}

impl<'a> ErrCtx<'a> {
    /// The context of `cmd` on `set` ("" for commands on no set).
    pub fn new(cmd: Cmd, set: &'a str) -> ErrCtx<'a> {
        ErrCtx {
            cmd,
            set,
            set2: None,
            set_type: None,
            member: None,
        }
    }

    pub fn with_set2(self, set2: Option<&'a str>) -> ErrCtx<'a> {
        ErrCtx { set2, ..self }
    }

    pub fn with_set_type(self, set_type: Option<SetType>) -> ErrCtx<'a> {
        ErrCtx { set_type, ..self }
    }

    pub fn with_member(self, member: Option<&'a Member>) -> ErrCtx<'a> {
        ErrCtx { member, ..self }
    }
}

/// The kernel's own wording for a code, as close to the `ipset` tool's
/// messages as is useful.
pub fn describe(errno: i32, set_type: Option<SetType>) -> String {
    let s = match errno {
        IPSET_ERR_PROTOCOL => "kernel error received: ipset protocol error",
        IPSET_ERR_FIND_TYPE => "kernel error received: set type not supported",
        IPSET_ERR_MAX_SETS => "kernel error received: maximal number of sets reached",
        IPSET_ERR_BUSY => "set cannot be destroyed: it is in use by a kernel component",
        IPSET_ERR_EXIST_SETNAME2 => "the second set does not exist or the new name is taken",
        IPSET_ERR_TYPE_MISMATCH => "the sets have different type or family",
        IPSET_ERR_EXIST => "element already added or missing",
        IPSET_ERR_INVALID_CIDR => "invalid CIDR prefix length",
        IPSET_ERR_INVALID_NETMASK => "invalid netmask",
        IPSET_ERR_INVALID_FAMILY => "invalid family",
        IPSET_ERR_TIMEOUT => "timeout cannot be used: set was created without timeout support",
        IPSET_ERR_REFERENCED => "set is referenced by a kernel component",
        IPSET_ERR_IPADDR_IPV4 => "an IPv4 address is expected",
        IPSET_ERR_IPADDR_IPV6 => "an IPv6 address is expected",
        IPSET_ERR_COUNTER => "packet/byte counters cannot be used",
        IPSET_ERR_COMMENT => "comment cannot be used",
        IPSET_ERR_INVALID_MARKMASK => "invalid markmask",
        IPSET_ERR_SKBINFO => "skbinfo cannot be used",
        e if e >= IPSET_ERR_TYPE_SPECIFIC => match (set_type, e) {
            (Some(SetType::ListSet), IPSET_ERR_NAME) => {
                "the set to be added/deleted as element does not exist"
            }
            (Some(SetType::ListSet), IPSET_ERR_LOOP) => "a list:set cannot be added to a list:set",
            (Some(SetType::ListSet), IPSET_ERR_BEFORE) => "the reference set is missing",
            (Some(SetType::ListSet), IPSET_ERR_NAMEREF) => "the reference set does not exist",
            (Some(SetType::ListSet), IPSET_ERR_LIST_FULL) => "the list:set is full",
            (Some(SetType::ListSet), IPSET_ERR_REF_EXIST) => {
                "the reference set is not in the list:set"
            }
            (Some(t), IPSET_ERR_BITMAP_RANGE) if t.is_bitmap() => {
                "element is out of the range of the set"
            }
            (Some(t), IPSET_ERR_BITMAP_RANGE_SIZE) if t.is_bitmap() => {
                "the range exceeds the size limit of the set type"
            }
            (Some(_), IPSET_ERR_HASH_FULL) => "hash is full, cannot add more elements",
            (Some(_), IPSET_ERR_HASH_ELEM) => "null-valued element, cannot be stored",
            (Some(_), IPSET_ERR_INVALID_PROTO) => "invalid protocol",
            (Some(_), IPSET_ERR_MISSING_PROTO) => "protocol missing but must be specified",
            (Some(_), IPSET_ERR_HASH_RANGE_UNSUPPORTED) => "range is not supported",
            (Some(_), IPSET_ERR_HASH_RANGE) => "invalid range",
            _ => return format!("set type specific kernel error {e}"),
        },
        e => return std::io::Error::from_raw_os_error(e).to_string(),
    };
    s.to_string()
}

/// Map a (positive) kernel error code of a failed command.
pub fn map_errno(errno: i32, ctx: &ErrCtx<'_>) -> DataplaneError {
    let set = || ctx.set.to_string();
    let set2 = || ctx.set2.unwrap_or("").to_string();
    let type_name = || ctx.set_type.map_or_else(String::new, |t| t.to_string());
    let element = |reason: String| match ctx.member {
        Some(m) => DataplaneError::InvalidElement {
            set: set(),
            element: m.to_string(),
            reason,
        },
        None => DataplaneError::Other(format!("set {}: {reason}", ctx.set)),
    };
    let is_list = ctx.set_type == Some(SetType::ListSet);
    match errno {
        libc::ENOENT => DataplaneError::SetMissing(set()),
        libc::EEXIST => DataplaneError::SetExists(set()),
        IPSET_ERR_EXIST_SETNAME2 => match ctx.cmd {
            Cmd::Rename => DataplaneError::SetExists(set2()),
            _ => DataplaneError::SetMissing(set2()),
        },
        IPSET_ERR_BUSY | IPSET_ERR_REFERENCED | libc::EBUSY => DataplaneError::InUse(set()),
        IPSET_ERR_TYPE_MISMATCH => match ctx.cmd {
            Cmd::Swap => DataplaneError::TypeMismatch(set(), set2()),
            _ => element(describe(errno, ctx.set_type)),
        },
        IPSET_ERR_FIND_TYPE => DataplaneError::TypeNotSupported(type_name()),
        IPSET_ERR_PROTOCOL if ctx.member.is_none() => {
            DataplaneError::Protocol(describe(errno, ctx.set_type))
        }
        IPSET_ERR_HASH_FULL if ctx.set_type.is_some_and(SetType::is_hash) => {
            DataplaneError::SetFull(set())
        }
        IPSET_ERR_LIST_FULL if is_list => DataplaneError::SetFull(set()),
        IPSET_ERR_LOOP if is_list => DataplaneError::NestedListSet(set()),
        libc::EPERM | libc::EACCES => DataplaneError::Unavailable(
            "permission denied: ipset needs CAP_NET_ADMIN in this network namespace".into(),
        ),
        libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR => {
            DataplaneError::Unavailable(describe(errno, ctx.set_type))
        }
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => {
            DataplaneError::Unavailable(format!(
                "the kernel has no ipset netlink subsystem: {}",
                describe(errno, ctx.set_type)
            ))
        }
        IPSET_ERR_BITMAP_RANGE_SIZE
            if ctx.cmd == Cmd::Create && ctx.set_type.is_some_and(SetType::is_bitmap) =>
        {
            DataplaneError::Other(format!(
                "cannot create set {}: {}",
                ctx.set,
                describe(errno, ctx.set_type)
            ))
        }
        IPSET_ERR_MAX_SETS | IPSET_ERR_INVALID_NETMASK | IPSET_ERR_INVALID_FAMILY
            if ctx.cmd == Cmd::Create =>
        {
            DataplaneError::Other(format!(
                "cannot create set {}: {}",
                ctx.set,
                describe(errno, ctx.set_type)
            ))
        }
        e if (IPSET_ERR_PROTOCOL..IPSET_ERR_TYPE_SPECIFIC + 256).contains(&e)
            && matches!(ctx.cmd, Cmd::Add | Cmd::Del) =>
        {
            element(describe(errno, ctx.set_type))
        }
        libc::EINVAL | libc::ERANGE | libc::EMSGSIZE if matches!(ctx.cmd, Cmd::Add | Cmd::Del) => {
            element(describe(errno, ctx.set_type))
        }
        libc::EINVAL | libc::ERANGE | libc::EMSGSIZE => DataplaneError::Protocol(format!(
            "the kernel rejected the request for set {}: {}",
            ctx.set,
            describe(errno, ctx.set_type)
        )),
        e => DataplaneError::Other(format!("set {}: {}", ctx.set, describe(e, ctx.set_type))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(cmd: Cmd, t: Option<SetType>) -> ErrCtx<'static> {
        ErrCtx {
            cmd,
            set: "a",
            set2: Some("b"),
            set_type: t,
            member: None,
        }
    }

    #[test]
    fn bitmap_codes_name_the_range() {
        let bitmap = ErrCtx {
            member: Some(&Member::Port(80)),
            ..ctx(Cmd::Add, Some(SetType::BitmapPort))
        };
        assert_eq!(
            map_errno(IPSET_ERR_BITMAP_RANGE, &bitmap),
            DataplaneError::InvalidElement {
                set: "a".into(),
                element: "80".into(),
                reason: "element is out of the range of the set".into()
            }
        );
    }

    #[test]
    fn overlapping_type_specific_codes_follow_the_set_type() {
        let hash = ctx(Cmd::Add, Some(SetType::HashIp));
        let list = ctx(Cmd::Add, Some(SetType::ListSet));
        assert_eq!(map_errno(4352, &hash), DataplaneError::SetFull("a".into()));
        assert!(matches!(map_errno(4352, &list), DataplaneError::Other(_)));
        assert_eq!(
            map_errno(IPSET_ERR_LOOP, &list),
            DataplaneError::NestedListSet("a".into())
        );
        assert_eq!(
            map_errno(IPSET_ERR_LIST_FULL, &list),
            DataplaneError::SetFull("a".into())
        );
    }

    #[test]
    fn command_dependent_codes() {
        assert_eq!(
            map_errno(IPSET_ERR_EXIST_SETNAME2, &ctx(Cmd::Swap, None)),
            DataplaneError::SetMissing("b".into())
        );
        assert_eq!(
            map_errno(IPSET_ERR_EXIST_SETNAME2, &ctx(Cmd::Rename, None)),
            DataplaneError::SetExists("b".into())
        );
        assert_eq!(
            map_errno(IPSET_ERR_TYPE_MISMATCH, &ctx(Cmd::Swap, None)),
            DataplaneError::TypeMismatch("a".into(), "b".into())
        );
        assert_eq!(
            map_errno(IPSET_ERR_BUSY, &ctx(Cmd::Destroy, None)),
            DataplaneError::InUse("a".into())
        );
        assert_eq!(
            map_errno(
                IPSET_ERR_FIND_TYPE,
                &ctx(Cmd::Create, Some(SetType::HashMac))
            ),
            DataplaneError::TypeNotSupported("hash:mac".into())
        );
        let m = Member::Ip("10.0.0.1".parse().unwrap());
        let c = ErrCtx {
            member: Some(&m),
            ..ctx(Cmd::Add, Some(SetType::HashIp))
        };
        assert!(matches!(
            map_errno(IPSET_ERR_IPADDR_IPV4, &c),
            DataplaneError::InvalidElement { .. }
        ));
    }
}
