//! Kernel errnos of a failed nf_tables message, mapped to typed
//! [`NftError`]s by what the message was and which of its attributes the
//! kernel blamed (extended ack): ENOENT on the table attribute is a missing
//! table, on the set name a missing set, on an element a missing element.

use super::consts::*;
use super::decode::Blamed;
use crate::{NftError, NftOp, Table};

fn strerror(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

/// The error of operation `op` whose message failed with `errno`;
/// `element`: the element the kernel blamed, rendered.
pub fn map(
    errno: i32,
    table: &Table,
    op: &NftOp<'_>,
    blamed: Blamed,
    element: Option<String>,
    message: Option<&str>,
) -> NftError {
    let set = op.set().unwrap_or("").to_string();
    let reason = || match message {
        Some(m) => format!("{} ({m})", strerror(errno)),
        None => strerror(errno),
    };
    let table_blamed = matches!(
        blamed,
        // NFTA_SET_TABLE and NFTA_SET_ELEM_LIST_TABLE are both 1.
        Blamed::Attr(NFTA_SET_TABLE)
    ) && !matches!(op, NftOp::EnsureTable);
    match errno {
        libc::ENOENT if table_blamed => NftError::TableMissing(table.to_string()),
        libc::ENOENT => match (op, element) {
            (NftOp::DelElements { .. }, Some(element)) => NftError::ElementMissing { set, element },
            (NftOp::EnsureTable, _) => NftError::TableMissing(table.to_string()),
            _ => NftError::SetMissing(set),
        },
        libc::EEXIST | libc::ENOTEMPTY => match (op, element) {
            (NftOp::CreateSet { .. }, _) => NftError::SetExists(set),
            (_, Some(element)) => NftError::ElementExists { set, element },
            _ => NftError::ElementExists {
                set,
                element: "(not named by the kernel)".into(),
            },
        },
        libc::EBUSY => NftError::InUse(set),
        // nf_tables says a set is full with ENFILE.
        libc::ENFILE => NftError::SetFull(set),
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => {
            NftError::NotSupported(format!("{}: {}", describe(op, table), reason()))
        }
        libc::EPERM | libc::EACCES => NftError::Unavailable(PERMISSION_DENIED.into()),
        libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR => {
            NftError::Unavailable(format!("{}: {}", describe(op, table), reason()))
        }
        _ => match element {
            Some(element) => NftError::InvalidElement {
                set,
                element,
                reason: reason(),
            },
            None if matches!(op, NftOp::CreateSet { .. }) => {
                NftError::NotSupported(format!("{}: {}", describe(op, table), reason()))
            }
            None => NftError::Other(format!("{}: {}", describe(op, table), reason())),
        },
    }
}

/// What EPERM means unless the table is owned by another process (which
/// the netlink backend then asks the kernel).
pub(crate) const PERMISSION_DENIED: &str =
    "permission denied: nf_tables needs CAP_NET_ADMIN in this network namespace";

/// An error of the transaction as a whole (its begin, or its commit).
pub fn map_whole(errno: i32, message: Option<&str>) -> NftError {
    let text = match message {
        Some(m) => format!("{} ({m})", strerror(errno)),
        None => strerror(errno),
    };
    match errno {
        libc::EPERM | libc::EACCES => NftError::Unavailable(PERMISSION_DENIED.into()),
        libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR | libc::ERESTART => {
            NftError::Unavailable(format!("the kernel refused the transaction: {text}"))
        }
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => {
            NftError::NotSupported(format!("nf_tables transactions: {text}"))
        }
        _ => NftError::Other(format!("the kernel refused the transaction: {text}")),
    }
}

/// A dump or get that failed.
pub fn map_get(errno: i32, what: &str) -> NftError {
    match errno {
        libc::EPERM | libc::EACCES => NftError::Unavailable(PERMISSION_DENIED.into()),
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => NftError::Unavailable(
            format!("no nf_tables in this kernel: {what}: {}", strerror(errno)),
        ),
        libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR => {
            NftError::Unavailable(format!("{what}: {}", strerror(errno)))
        }
        _ => NftError::Other(format!("{what}: {}", strerror(errno))),
    }
}

fn describe(op: &NftOp<'_>, table: &Table) -> String {
    match op {
        NftOp::EnsureTable => format!("creating table {table}"),
        NftOp::CreateSet { name, spec } => format!("creating set {name} ({spec})"),
        NftOp::AddElements { set, .. } => format!("adding elements to set {set}"),
        NftOp::DelElements { set, .. } => format!("deleting elements of set {set}"),
        NftOp::FlushSet { set } => format!("flushing set {set}"),
        NftOp::DeleteSet { set } => format!("deleting set {set}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TableFamily;

    #[test]
    fn errnos_become_typed_errors_by_what_was_blamed() {
        let t = Table::new(TableFamily::Inet, "t");
        let flush = NftOp::FlushSet { set: "s" };
        assert_eq!(
            map(
                libc::ENOENT,
                &t,
                &flush,
                Blamed::Attr(NFTA_SET_ELEM_LIST_TABLE),
                None,
                None
            ),
            NftError::TableMissing("inet t".into())
        );
        assert_eq!(
            map(
                libc::ENOENT,
                &t,
                &flush,
                Blamed::Attr(NFTA_SET_ELEM_LIST_SET),
                None,
                None
            ),
            NftError::SetMissing("s".into())
        );
        assert_eq!(
            map(
                libc::EBUSY,
                &t,
                &NftOp::DeleteSet { set: "s" },
                Blamed::Unknown,
                None,
                None
            ),
            NftError::InUse("s".into())
        );
        assert_eq!(
            map(libc::ENFILE, &t, &flush, Blamed::Unknown, None, None),
            NftError::SetFull("s".into())
        );
        assert!(matches!(
            map(
                libc::EINVAL,
                &t,
                &flush,
                Blamed::Element(0),
                Some("1.2.3.4".into()),
                None
            ),
            NftError::InvalidElement { .. }
        ));
        assert!(matches!(
            map_whole(libc::EPERM, None),
            NftError::Unavailable(_)
        ));
    }
}
