//! ipsetmgr: keeps Linux kernel ipsets equal to declared `IPSetPolicy` resources.

pub mod agent;
pub mod commands;
pub mod dataplane;
pub mod duration;
pub mod lock;
pub mod logging;
pub mod manager;
pub mod memory;
pub mod netns;
pub mod policy;
pub mod server;

/// The ipset vocabulary (its own crate, re-exported for the modules here).
pub use ipsetmgr_ipset as ipset;

pub use agent::{AgentConfig, crd_yaml, run_agent};
