//! The node's kernel side, shared by the agent and file mode (`apply`,
//! `run`, `sets`): which kernels hold the sets ([`registry`]: the
//! `--backend` list and how each kernel is opened), the writer lock of one
//! prefix in one network namespace ([`lock`]), and the thread inside
//! `--netns` that runs one job or the driver loop ([`side`]). It knows
//! nothing of Kubernetes or of policy files (docs/architecture.md).

#![forbid(unsafe_code)]

mod error;
pub mod lock;
pub mod registry;
pub mod side;

pub use error::KernelError;
pub use registry::{BackendList, BackendListError, KernelBackend, Opened};
pub use side::{KernelOptions, KernelSide, parse_table_family, parse_table_name, run_once};
