//! ipsetmgr: keeps Linux kernel ipsets equal to declared `IPSetPolicy` resources.

pub mod commands;
pub mod dataplane;
pub mod ipset;
pub mod manager;
pub mod netns;
pub mod policy;
