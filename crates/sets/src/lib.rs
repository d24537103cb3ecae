//! Kernel-neutral sets: what a node is asked to hold ([`DesiredSet`]), what
//! it reports ([`SetReport`], [`ApplyOutcome`]), the seam every kernel
//! implements ([`Kernel`]) and the one [`Reconciler`] over it, which
//! resyncs, retries with backoff, isolates failing sets, keeps held sets
//! and deletes what nobody wants, once for every kernel. [`Backends`] runs
//! several kernels as one, [`Retiring`] removes a kernel no longer used, and
//! [`driver`] is the loop that feeds them. No I/O: the adapters (ipset,
//! nf_tables) talk to kernels (docs/architecture.md, "The reconciler").

#![forbid(unsafe_code)]

mod backend;
mod backends;
mod config;
mod desired;
mod drift_log;
pub mod driver;
mod error;
mod failure;
mod kernel;
mod reconciler;
mod report;
mod retire;

pub use backend::SetsBackend;
pub use backends::Backends;
pub use config::ReconcilerConfig;
pub use desired::DesiredSet;
pub use drift_log::log_drift;
pub use error::{ErrorKind, KernelError};
pub use failure::Failure;
pub use kernel::{BatchFailure, Context, Entry, Kernel, Owned, Planned, Sets};
pub use reconciler::Reconciler;
pub use report::{
    ApplyError, ApplyOutcome, BackendId, DeletionReport, Drift, ListedSet, NotReplaced, SetError,
    SetRef, SetReport, WriteKind,
};
pub use retire::Retiring;
