//! The compiler's numeric limits, in a module of their own because the
//! compiler and its parts (`parse`, `checks`, `bitmap`, `mask`) all read
//! them (a child reading its parent's constants while the parent calls the
//! child would be an import circle: docs/architecture.md, "Crates").

/// The largest `maxElem` accepted (the CRD's schema says the same): 16
/// million members, far above the lists this project is built for; also
/// how far a set without `maxElem` may grow.
pub const MAX_MAX_ELEM: u32 = 1 << 24;
/// Default size of a list:set (the kernel's default).
pub const DEFAULT_LIST_SIZE: u32 = 8;
/// The kernel rounds a list:set's size up to this (IP_SET_LIST_MIN_SIZE);
/// the header says what the kernel will report, or every resync would see a
/// mismatch.
pub(super) const MIN_LIST_SIZE: u32 = 4;
/// At most this many member errors are reported per policy.
pub(super) const MAX_MEMBER_ERRORS: usize = 10;
