//! The BPF kernel's errors as the reconciler needs them: a neutral
//! [`ErrorKind`] with the crate's [`BpfError`] kept as the source, and
//! which errors only say that the adapter's belief is stale.

use ipsetmgr_sets::{ErrorKind, KernelError};
use nix::errno::Errno;

use crate::error::BpfError;

impl From<BpfError> for KernelError {
    fn from(e: BpfError) -> KernelError {
        let kind = kind_of(&e);
        KernelError::new(kind, e)
    }
}

fn kind_of(e: &BpfError) -> ErrorKind {
    match e {
        BpfError::NotFound { .. } => ErrorKind::SetMissing,
        BpfError::Exists { .. } => ErrorKind::SetExists,
        BpfError::Kernel { errno, .. } | BpfError::Entry { errno, .. } => match *errno {
            // A trie at its max_entries (ENOSPC); a key or value of the
            // wrong size (E2BIG) cannot happen with our own keys.
            Errno::ENOSPC | Errno::E2BIG => ErrorKind::SetFull,
            // An entry operation the kernel refused for this entry.
            Errno::ENOENT | Errno::EEXIST | Errno::EINVAL
                if matches!(e, BpfError::Entry { .. }) =>
            {
                ErrorKind::ElementRefused
            }
            // The kernel lacks LPM tries or map-in-map (before 4.11/4.12).
            Errno::EOPNOTSUPP => ErrorKind::NotSupported,
            Errno::EINVAL => ErrorKind::Refused,
            _ => ErrorKind::Other,
        },
        BpfError::NotASet { .. } | BpfError::WrongFamily { .. } | BpfError::BadName(_) => {
            ErrorKind::Refused
        }
        BpfError::CannotHold { .. } | BpfError::BadPrefix { .. } => ErrorKind::ElementRefused,
        BpfError::Bpffs { .. } => ErrorKind::Unavailable,
        BpfError::Map { .. } => ErrorKind::Protocol,
        BpfError::Xdp(_) => ErrorKind::Other,
    }
}

/// Whether the error says the set changed under us (a pin appeared or
/// went, an entry we believed there is not): re-read, not isolate.
pub(crate) fn is_stale_belief(e: &BpfError) -> bool {
    match e {
        BpfError::NotFound { .. } | BpfError::Exists { .. } => true,
        BpfError::Entry { op, errno, .. } => *op == "del" && *errno == Errno::ENOENT,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_trie_is_set_full_and_a_missing_entry_is_stale() {
        let full = BpfError::Entry {
            set: "ipm4-a".into(),
            op: "add",
            entry: "10.0.0.0/8".into(),
            errno: Errno::ENOSPC,
        };
        let k = KernelError::from(full);
        assert_eq!(k.kind(), ErrorKind::SetFull);
        assert!(k.to_string().contains("ENOSPC"), "{k}");
        assert!(k.downcast_ref::<BpfError>().is_some());
        let gone = BpfError::Entry {
            set: "ipm4-a".into(),
            op: "del",
            entry: "10.0.0.0/8".into(),
            errno: Errno::ENOENT,
        };
        assert!(is_stale_belief(&gone));
        assert_eq!(KernelError::from(gone).kind(), ErrorKind::ElementRefused);
        let missing = BpfError::NotFound {
            set: "ipm4-a".into(),
            path: "/sys/fs/bpf/ipsetmgr/ipm4-a".into(),
        };
        assert_eq!(KernelError::from(missing).kind(), ErrorKind::SetMissing);
    }
}
