//! ipsetmgr keeps Linux kernel ipsets equal to declared `IPSetPolicy`
//! resources: from policy files on one host (`apply`, `run`), or on every
//! node of a cluster (`agent`). This crate is the binary's: the command
//! line, policies and their compilation, the file commands and the agent.
//! The kernel side lives in the workspace's other crates, re-exported here;
//! `docs/architecture.md` describes how the pieces fit.
//!
//! The public API is what the integration tests and benchmarks use: the
//! policy types and compiler, the CRD, and the re-exported crates.

#![forbid(unsafe_code)]

mod args;
#[doc(hidden)]
pub mod bench_support;
mod cli;
mod commands;
mod metric_names;

/// The kernel behind one trait (its own crate).
pub use ipsetmgr_dataplane as dataplane;
/// The ipset vocabulary (its own crate).
pub use ipsetmgr_ipset as ipset;
/// The manager and its driver loop (its own crate).
pub use ipsetmgr_manager as manager;

pub use cli::main;
/// Every metric name the agent and the controller expose (for checks of
/// alert rules).
#[doc(hidden)]
pub use metric_names::all_metric_names;
