//! Cluster mode: the per-node agent (see `docs/architecture.md`).
//!
//! - [`inputs`]: what it watches (policies, slices, its Node, the CRDs);
//! - [`store`]: what it keeps of them, compactly;
//! - [`event_loop`]: recompiles and hands desired states to the kernel side;
//! - [`node_state`]: this node's `IPSetNodeState` and the task writing it;
//! - [`worker`]: the kernel side's reports back into the loop;
//! - [`metrics`]: Prometheus metrics and health facts.
//!
//! The command that wires these together is `src/commands/agent.rs`; its
//! flags are in `src/args.rs` (this module never imports either).

pub mod event_loop;
pub mod inputs;
pub mod metrics;
pub mod node_state;
pub mod store;
pub mod worker;

#[cfg(test)]
mod tests;
