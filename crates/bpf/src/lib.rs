//! ipsetmgr's BPF kernel: address sets (hash:ip, hash:net with `nomatch`;
//! IPv4 or IPv6) as pinned `BPF_MAP_TYPE_LPM_TRIE` maps, each behind a
//! one-slot `BPF_MAP_TYPE_ARRAY_OF_MAPS` so that a full replacement is one
//! atomic swap for readers; and an XDP program that drops packets from the
//! addresses such sets match. docs/bpf.md describes the maps, pins, the
//! program and what the agent needs.
//!
//! - [`Bpffs`]: the bpffs (mounted when missing), the sets' pins under
//!   `<bpffs>/ipsetmgr/`, listing by prefix (foreign pins are never
//!   touched), create, open, delete.
//! - [`BpfSet`]: one set: replace (fresh trie, one swap), add and delete in
//!   place, read (a dump of the trie), lookup.
//! - [`Entry`]: one prefix and its `nomatch` flag; from hash:ip and
//!   hash:net members, anything else a typed "cannot hold".
//! - [`xdp`]: attach the program to an interface for named sets, detach;
//!   [`XdpKeeper`]: keep it attached (the agent's `--xdp-interface`).
//! - [`backend`]: the adapter on the neutral sets seam
//!   ([`ipsetmgr_sets::Kernel`]), `--backend bpf`.
//!
//! Maps, pins and the program go through aya; the two calls aya lacks
//! (creating an array-of-maps outside an ELF object, and batch updates)
//! are in `sys.rs`, the crate's only `unsafe`. This crate must never depend on kube or tokio (it
//! runs on the agent's kernel thread).

// Only sys.rs may use unsafe (two bpf(2) calls), and says so itself.
#![deny(unsafe_code)]

pub mod backend;
mod entry;
mod error;
mod set;
mod store;
mod sys;
mod trie;
pub mod xdp;
mod xdp_keeper;

pub use entry::{Entry, MATCH, NOMATCH};
pub use error::{BpfError, XdpError};
pub use set::BpfSet;
pub use store::{Bpffs, DEFAULT_MOUNT, SETS_DIR};
pub use xdp_keeper::{Kept, XdpKeeper};
