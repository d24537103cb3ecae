//! Cluster mode: the controller (see `docs/architecture.md`). One small
//! Deployment, Lease-elected, that alone validates each policy (Valid, one
//! Warning event per invalid policy), aggregates the nodes' states into each
//! policy's status (Ready, a bounded summary), and removes node states of
//! Nodes that are gone. It never touches a kernel.
//!
//! - [`inputs`]: what it watches;
//! - [`store`]: what it keeps;
//! - [`evaluate`]: what each status should say (pure);
//! - [`event_loop`]: re-evaluates on changes and on a tick;
//! - [`writer`]: the writes, in a task of their own, by the leader only;
//! - [`sources`], [`materialise`], [`slice_writer`], [`feeds`]: the
//!   policies' `membersFrom`, computed and written as member slices;
//! - [`metrics`]: metrics and health;
//! - [`api_endpoints`]: the API server's endpoint addresses, followed for
//!   the url egress guard.
//!
//! The command that wires these together is `src/commands/controller.rs`;
//! its flags are in `src/args.rs`. This crate must never depend on the
//! agent or the binary (`tests/crate_graph.rs` checks it) and never
//! touches a kernel.

#![forbid(unsafe_code)]

pub mod api_endpoints;
pub mod evaluate;
pub mod event_loop;
pub mod feeds;
pub mod inputs;
pub mod leading;
pub mod lease_owner;
pub mod materialise;
pub mod metrics;
pub mod slice_writer;
pub mod sources;
pub mod store;
pub mod writer;

#[cfg(test)]
mod tests;
