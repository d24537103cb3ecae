//! ipsetmgr: keeps Linux kernel ipsets equal to declared `IPSetPolicy` resources.

pub mod agent;
pub mod args;
pub mod commands;
pub mod duration;
pub mod kernel;
pub mod lock;
pub mod logging;
pub mod policy;
pub mod server;

/// The kernel behind one trait (its own crate).
pub use ipsetmgr_dataplane as dataplane;
/// The ipset vocabulary (its own crate, re-exported for the modules here).
pub use ipsetmgr_ipset as ipset;
/// The manager and its driver loop (its own crate).
pub use ipsetmgr_manager as manager;

pub use agent::{AgentConfig, crd_yaml, run_agent};
