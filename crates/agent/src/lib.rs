//! Cluster mode: the per-node agent (see `docs/architecture.md`). Its
//! kernel side (the driver thread inside `--netns` holding the writer
//! lock) is the node crate's, shared with file mode.
//!
//! - [`inputs`]: what it watches (policies, slices, its Node, the CRDs);
//! - [`store`]: what it keeps of them, compactly;
//! - [`event_loop`]: recompiles and hands desired states to the kernel side;
//! - [`node_state`]: this node's `IPSetNodeState` and the task writing it;
//! - [`worker`]: the kernel side's reports back into the loop;
//! - [`metrics`]: Prometheus metrics and health facts.
//!
//! The command that wires these together is `src/commands/agent.rs`; its
//! flags are in `src/args.rs`. This crate must never depend on the
//! controller, the binary or anything that decides a policy's status; it
//! never writes an IPSetPolicy (`tests/crate_graph.rs` checks the first).

#![forbid(unsafe_code)]

pub mod api_side;
pub mod event_loop;
pub mod inputs;
pub mod metrics;
pub mod node_state;
pub mod store;
pub mod worker;

#[cfg(test)]
mod tests;
