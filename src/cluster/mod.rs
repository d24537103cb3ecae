//! What the agent and the controller share on the Kubernetes side: the
//! client, watches that read objects one by one, listings that survive
//! relists, and the guard against a kind that vanishes.

pub mod client;
pub mod kind_guard;
pub mod listing;
#[cfg(test)]
pub mod mock_api;
pub mod nodes;
pub mod slices;
pub mod tolerant;
