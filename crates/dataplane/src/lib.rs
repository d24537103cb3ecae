//! The kernel behind one trait: typed operations on ipsets ([`Dataplane`]),
//! their typed errors, and the backends that implement them: native netlink
//! (the default), the `ipset` binary, and an in-memory model of the kernel
//! for tests (feature `model`). Also what else touches the operating system
//! directly: entering a network namespace, returning freed memory.
//!
//! This is the only crate of the workspace with `unsafe` code: one call,
//! `malloc_trim` in [`memory`], which no safe crate offers; sockets and
//! namespaces go through `nix` and `netlink-sys`. See `docs/architecture.md`.

pub mod adapter;
pub mod cli;
pub mod memory;
#[cfg(any(test, feature = "model"))]
pub mod model;
pub mod netlink;
pub mod netns;
mod select;

pub use select::{Backend, OpenError, open};

use std::fmt;

use ipsetmgr_ipset::{Member, MemberSet, SetHeader, SetType};

/// One typed operation on kernel sets. Operations borrow the manager's state,
/// so a batch of a million members is never copied.
#[derive(Clone, Copy, Debug)]
pub enum Op<'a> {
    /// Create a set; fails with [`DataplaneError::SetExists`] if it exists.
    Create { set: &'a str, header: &'a SetHeader },
    /// Add members; members already present are not an error (`-exist`).
    Add {
        set: &'a str,
        members: &'a MemberSet,
    },
    /// Delete members; members already absent are not an error (`-exist`).
    Del {
        set: &'a str,
        members: &'a MemberSet,
    },
    /// Remove every member.
    Flush { set: &'a str },
    /// Exchange the contents and headers of two sets of the same type and family.
    Swap { a: &'a str, b: &'a str },
    /// Give a set another name, atomically: a set filled under a temporary
    /// name appears under its real one complete or not at all. Fails with
    /// [`DataplaneError::SetExists`] if `to` exists, and
    /// [`DataplaneError::InUse`] while `from` is referenced.
    Rename { from: &'a str, to: &'a str },
    /// Destroy a set; fails with [`DataplaneError::InUse`] while referenced.
    Destroy { set: &'a str },
}

impl Op<'_> {
    /// The set this operation changes (the first one, for swap).
    pub fn set(&self) -> &str {
        match self {
            Op::Create { set, .. }
            | Op::Add { set, .. }
            | Op::Del { set, .. }
            | Op::Flush { set }
            | Op::Destroy { set } => set,
            Op::Swap { a, .. } => a,
            Op::Rename { from, .. } => from,
        }
    }

    /// Every set this operation touches.
    pub fn sets(&self) -> impl Iterator<Item = &str> {
        let (a, b) = match self {
            Op::Swap { a, b } => (*a, Some(*b)),
            Op::Rename { from, to } => (*from, Some(*to)),
            _ => (self.set(), None),
        };
        std::iter::once(a).chain(b)
    }
}

/// Every failure a backend can report, typed so the manager can react
/// (retry, isolate a set, report "in use") without parsing text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DataplaneError {
    #[error("set {0} already exists")]
    SetExists(String),
    #[error("set {0} does not exist")]
    SetMissing(String),
    #[error(
        "set {0} is in use by a kernel component (a firewall rule, iptables or nft, or a list:set still references it)"
    )]
    InUse(String),
    #[error("set type {0} is not supported by this kernel")]
    TypeNotSupported(String),
    #[error("set {0} is full (maxelem reached)")]
    SetFull(String),
    #[error("sets {0} and {1} cannot be swapped: their type or family differ")]
    TypeMismatch(String, String),
    #[error("the kernel rejected element {element} of set {set}: {reason}")]
    InvalidElement {
        set: String,
        element: String,
        reason: String,
    },
    #[error("list:set {0} cannot hold another list:set")]
    NestedListSet(String),
    /// Could not talk to the kernel at all (spawn failure, socket error).
    /// Transient: retried with backoff.
    #[error("dataplane unavailable: {0}")]
    Unavailable(String),
    /// The kernel's or the tool's answer could not be understood.
    #[error("unexpected dataplane output: {0}")]
    Protocol(String),
    #[error("{0}")]
    Other(String),
}

impl DataplaneError {
    /// Errors that are a property of one set's content or type: retrying the
    /// same batch cannot fix them, so the set is isolated and the rest applied.
    pub fn is_set_specific(&self) -> bool {
        matches!(
            self,
            DataplaneError::TypeNotSupported(_)
                | DataplaneError::SetFull(_)
                | DataplaneError::TypeMismatch(..)
                | DataplaneError::InvalidElement { .. }
                | DataplaneError::NestedListSet(_)
                | DataplaneError::InUse(_)
        )
    }
}

/// A batch stopped at `op_index`. Operations after it were not applied;
/// operations up to and including it may have been applied in part (the
/// `ipset restore` tool buffers), so the manager re-reads every set they touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchError {
    pub op_index: usize,
    /// The element that failed, when the backend can tell.
    pub member: Option<Member>,
    pub error: DataplaneError,
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "operation {} failed: {}", self.op_index, self.error)
    }
}

impl std::error::Error for BatchError {}

/// One kernel set as read back from the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSet {
    /// `None` when the kernel set has a type this project does not manage
    /// (someone created an owned name by hand): it will be replaced.
    pub header: Option<SetHeader>,
    pub members: Option<MemberSet>,
    /// Member lines that could not be parsed for the header's type (for
    /// example entries with options such as timeouts). Any forces a rewrite.
    pub unparsable_members: usize,
    /// Header options this project never sets (`netmask 24`, `bitmask ..`,
    /// `timeout`, `counters`, `skbinfo`, a `markmask` other than all bits,
    /// ...; `comment` is managed, in the header's options), as the
    /// kernel reports them. Each changes what the set matches or holds, so
    /// any forces a replacement, just as a wrong type or maxelem does.
    pub unmanaged_options: Vec<String>,
    /// Kernel reference count (iptables rules, list:sets).
    pub references: u32,
}

/// The typed interface to a kernel's ipsets. Implementations never see
/// foreign sets' contents: callers list names through `owned` and read only
/// those sets.
pub trait Dataplane: Send {
    /// Short name for logs and reports ("cli", "netlink", "model").
    fn name(&self) -> &'static str;

    /// Apply `ops` in order, stopping at the first failure.
    fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError>;

    /// Names of the kernel sets for which `owned` returns true.
    fn list_owned(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<Vec<String>, DataplaneError>;

    /// Read one set's header and members; `Ok(None)` when it does not exist.
    fn read_set(&mut self, name: &str) -> Result<Option<KernelSet>, DataplaneError>;

    /// Whether the kernel supports `set_type`, when the backend can tell
    /// without side effects; `None` means "unknown: try and see".
    fn supports(&mut self, _set_type: SetType) -> Option<bool> {
        None
    }
}

impl<D: Dataplane + ?Sized> Dataplane for Box<D> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError> {
        (**self).apply(ops)
    }
    fn list_owned(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<Vec<String>, DataplaneError> {
        (**self).list_owned(owned)
    }
    fn read_set(&mut self, name: &str) -> Result<Option<KernelSet>, DataplaneError> {
        (**self).read_set(name)
    }
    fn supports(&mut self, set_type: SetType) -> Option<bool> {
        (**self).supports(set_type)
    }
}
