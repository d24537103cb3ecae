//! What the agent and the controller share on the Kubernetes side: the
//! client, watches that read objects one by one, listings that survive
//! relists, the guard against a kind that vanishes, the policies and
//! slices both keep (one store, `policy_store`), the metrics and health
//! server both run, and logging.
//!
//! It must never hold a role's logic (what to compile, what a status says)
//! nor touch a kernel: the agent (`ipsetmgr` for now) and the controller
//! build on it, it builds on neither. How the crates fit:
//! `docs/architecture.md`.

#![forbid(unsafe_code)]

pub mod api_error;
pub mod client;
pub mod kind_guard;
pub mod listing;
pub mod logging;
/// A mock API server for the roles' tests (feature `mock`).
#[cfg(any(test, feature = "mock"))]
pub mod mock_api;
pub mod nodes;
pub mod policy_store;
pub mod server;
pub mod slices;
pub mod telemetry;
pub mod tolerant;
