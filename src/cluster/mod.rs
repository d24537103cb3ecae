//! What the agent and the controller share on the Kubernetes side.

pub mod kind_guard;
