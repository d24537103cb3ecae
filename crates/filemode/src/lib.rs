//! File mode: policy files to kernel sets on one host, without a cluster
//! (docs/architecture.md, "Crates"). `apply` reconciles once and prints a
//! table, `run` keeps the kernel equal to a directory of policy files until
//! a signal, `sets` lists the owned sets; `files` reads the policy files and
//! `--members` lists with their file and url sources. The kernel side (the
//! backend list, the writer lock, the thread inside `--netns`) is the node
//! crate's, shared with the agent. Nothing here knows Kubernetes.

#![forbid(unsafe_code)]

pub mod apply;
pub mod files;
pub mod run;
pub mod sets;
mod table;
