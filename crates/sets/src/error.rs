//! The neutral kernel error: what the reconciler must know about a kernel's
//! refusal (its [`ErrorKind`]) with the adapter's own typed error kept as
//! the source, so messages and `downcast_ref` stay exact.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// What kind of refusal an error is, in no kernel's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A set of that name exists already.
    SetExists,
    /// No set of that name exists.
    SetMissing,
    /// A firewall rule or another set references the set.
    InUse,
    /// This kernel lacks the set type (a module not built or loaded).
    NotSupported,
    /// The set is at its size limit.
    SetFull,
    /// The kernel refused one element.
    ElementRefused,
    /// The kernel refused the set for a reason of its own content or type
    /// (a swap of unequal types, a nested list).
    Refused,
    /// Could not talk to the kernel at all: transient.
    Unavailable,
    /// The kernel's or the tool's answer could not be understood.
    Protocol,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Errors that are a property of one set's content or type: retrying the
    /// same batch cannot fix them, so the set is isolated and the rest applied.
    pub fn is_set_specific(self) -> bool {
        matches!(
            self,
            ErrorKind::NotSupported
                | ErrorKind::SetFull
                | ErrorKind::ElementRefused
                | ErrorKind::Refused
                | ErrorKind::InUse
        )
    }
}

/// A kernel's error, classified. Displays as the adapter's error does.
#[derive(Clone)]
pub struct KernelError {
    kind: ErrorKind,
    source: Arc<dyn Error + Send + Sync + 'static>,
}

impl KernelError {
    pub fn new(kind: ErrorKind, source: impl Error + Send + Sync + 'static) -> KernelError {
        KernelError {
            kind,
            source: Arc::new(source),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The adapter's own error, when it is an `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.source.downcast_ref()
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

impl fmt::Debug for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {:?}", self.kind, self.source)
    }
}

impl Error for KernelError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.source()
    }
}

/// Equal when of one kind and saying the same (reports compare).
impl PartialEq for KernelError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.to_string() == other.to_string()
    }
}

impl Eq for KernelError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error, PartialEq)]
    #[error("set {0} is full")]
    struct Full(String);

    #[test]
    fn keeps_the_adapters_message_and_type() {
        let e = KernelError::new(ErrorKind::SetFull, Full("ipm4-a".into()));
        assert_eq!(e.to_string(), "set ipm4-a is full");
        assert_eq!(e.downcast_ref::<Full>(), Some(&Full("ipm4-a".into())));
        assert!(e.kind().is_set_specific());
        assert_eq!(e, e.clone());
        assert_ne!(e, KernelError::new(ErrorKind::Other, Full("ipm4-a".into())));
    }
}
