//! ipsetmgr keeps Linux kernel ipsets equal to declared `IPSetPolicy`
//! resources: from policy files on one host (`apply`, `run`), or on every
//! node of a cluster (`agent`, `controller`). This crate is the binary's:
//! the command line (every flag in `args`), the commands, and the wiring of
//! each role; what they run is in the workspace's crates
//! (`docs/architecture.md`, "Crates"). Nothing depends on this crate.
//!
//! Its public API is only what the integration tests and benchmarks need
//! of the binary itself (`main`, the metric names, bench support); they
//! import the other crates directly.

#![forbid(unsafe_code)]

mod args;
#[doc(hidden)]
pub mod bench_support;
mod cli;
mod commands;
mod metric_names;

pub use cli::main;
/// Every metric name the agent and the controller expose (for checks of
/// alert rules).
#[doc(hidden)]
pub use metric_names::all_metric_names;
