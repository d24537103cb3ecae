//! Which kernels hold the sets (`--backend`): every backend registered in
//! one place, with its word, the kind of kernel set it holds (the metrics'
//! `backend` label), and how it is opened. Adding a kernel is one variant
//! here and its adapter crate (docs/architecture.md, "Adding a kernel").

use std::fmt;
use std::path::{Path, PathBuf};

use ipsetmgr_bpf::Bpffs;
use ipsetmgr_dataplane::{Backend, Dataplane, open};
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{Table, backend as nft};
use ipsetmgr_sets::{Backends, ReconcilerConfig, Retiring, SetsBackend};

use crate::KernelError;

/// One way to hold the sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelBackend {
    /// ipsets over native netlink (falls back to `cli` when the kernel
    /// lacks the ipset netlink protocol).
    Netlink,
    /// ipsets through the `ipset` binary.
    Cli,
    /// nf_tables named sets over native netlink (no `nft` binary).
    Nft,
    /// nf_tables named sets through `nft -j` (JSON).
    NftCli,
    /// BPF LPM tries pinned under `<bpffs>/ipsetmgr/` (docs/bpf.md).
    Bpf,
}

impl KernelBackend {
    pub const ALL: [KernelBackend; 5] = [
        KernelBackend::Netlink,
        KernelBackend::Cli,
        KernelBackend::Nft,
        KernelBackend::NftCli,
        KernelBackend::Bpf,
    ];

    /// The word `--backend` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelBackend::Netlink => "netlink",
            KernelBackend::Cli => "cli",
            KernelBackend::Nft => "nft",
            KernelBackend::NftCli => "nft-cli",
            KernelBackend::Bpf => "bpf",
        }
    }

    /// The kind of kernel set it holds: two backends of one kind would own
    /// the same sets, and a backend switch removes the other kinds' sets.
    pub fn kind(self) -> &'static str {
        match self {
            KernelBackend::Netlink | KernelBackend::Cli => "ipset",
            KernelBackend::Nft | KernelBackend::NftCli => "nft",
            KernelBackend::Bpf => "bpf",
        }
    }

    /// The backend that removes a kind's sets after a switch away from it.
    /// BPF sets are not retired: opening a bpffs may mount one, which a
    /// node that never chose `bpf` must not get.
    fn retiring(kind: &str) -> Option<KernelBackend> {
        match kind {
            "ipset" => Some(KernelBackend::Netlink),
            "nft" => Some(KernelBackend::Nft),
            _ => None,
        }
    }

    /// Open what the backend needs, on the calling thread (already in the
    /// namespace); BPF sets in the bpffs at `bpf_path`.
    fn open(self, bpf_path: &Path) -> Result<OpenedKernel, KernelError> {
        Ok(match self {
            KernelBackend::Netlink => OpenedKernel::Ipset(open(Backend::Netlink)?),
            KernelBackend::Cli => OpenedKernel::Ipset(open(Backend::Cli)?),
            KernelBackend::Nft => OpenedKernel::Nft(NetlinkNft::new()?),
            // `nft` is run per apply; a missing binary is that apply's error.
            KernelBackend::NftCli => OpenedKernel::NftCli,
            KernelBackend::Bpf => OpenedKernel::Bpf(Bpffs::open(bpf_path)?),
        })
    }
}

impl fmt::Display for KernelBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a `--backend` list is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendListError {
    #[error("unknown backend {word:?}: use one or more of {all}, comma-separated (or both)")]
    Unknown { word: String, all: String },
    #[error("backend {0} is listed twice")]
    Twice(KernelBackend),
    #[error(
        "backends {0} and {1} both hold {kind}s: they would own the same sets; choose one",
        kind = .0.kind()
    )]
    SameKind(KernelBackend, KernelBackend),
    #[error("no backend given")]
    Empty,
}

/// The backends a node uses, in order (the first names the node state's
/// sets plainly; see docs/architecture.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendList(Vec<KernelBackend>);

impl BackendList {
    pub fn one(backend: KernelBackend) -> BackendList {
        BackendList(vec![backend])
    }

    pub fn as_slice(&self) -> &[KernelBackend] {
        &self.0
    }

    /// The kinds of kernel set it holds, in order.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.0.iter().map(|b| b.kind()).collect()
    }
}

impl fmt::Display for BackendList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<&str> = self.0.iter().map(|b| b.as_str()).collect();
        f.write_str(&words.join(","))
    }
}

impl std::str::FromStr for BackendList {
    type Err = BackendListError;

    /// `netlink`, `nft`, `netlink,nft`, ...; `both` stays the alias of
    /// `netlink,nft` it was.
    fn from_str(s: &str) -> Result<BackendList, BackendListError> {
        let mut list: Vec<KernelBackend> = Vec::new();
        for word in s.split(',').map(str::trim) {
            let found: &[KernelBackend] = match word {
                "both" => &[KernelBackend::Netlink, KernelBackend::Nft],
                _ => &[],
            };
            let found = if found.is_empty() {
                let b = KernelBackend::ALL
                    .into_iter()
                    .find(|b| b.as_str() == word)
                    .ok_or_else(|| BackendListError::Unknown {
                        word: word.to_string(),
                        all: KernelBackend::ALL.map(KernelBackend::as_str).join(", "),
                    })?;
                vec![b]
            } else {
                found.to_vec()
            };
            for b in found {
                if list.contains(&b) {
                    return Err(BackendListError::Twice(b));
                }
                if let Some(other) = list.iter().find(|o| o.kind() == b.kind()) {
                    return Err(BackendListError::SameKind(*other, b));
                }
                list.push(b);
            }
        }
        if list.is_empty() {
            return Err(BackendListError::Empty);
        }
        Ok(BackendList(list))
    }
}

/// A kernel opened (a socket, a tool found), not yet a reconciler:
/// opening can fail, choosing the reconciler's tunables cannot.
pub(crate) enum OpenedKernel {
    Ipset(Box<dyn Dataplane>),
    Nft(NetlinkNft),
    NftCli,
    Bpf(Bpffs),
}

impl OpenedKernel {
    fn into_backend(self, table: Table, config: ReconcilerConfig) -> Box<dyn SetsBackend> {
        match self {
            OpenedKernel::Ipset(dp) => {
                Box::new(ipsetmgr_dataplane::adapter::reconciler(dp, config))
            }
            OpenedKernel::Nft(nl) => Box::new(nft::reconciler(nl, table, config)),
            OpenedKernel::NftCli => Box::new(nft::cli_reconciler(table, config)),
            OpenedKernel::Bpf(fs) => Box::new(ipsetmgr_bpf::backend::reconciler(fs, config)),
        }
    }
}

/// The opened kernels of a backend list, and of the kinds it no longer
/// selects when asked to remove their sets.
pub struct Opened {
    kernels: Vec<OpenedKernel>,
    nft_table: Table,
    bpf_path: PathBuf,
    retired: Vec<OpenedKernel>,
}

impl Opened {
    /// Open every backend of `list`, its nft sets in `nft_table`, its BPF
    /// sets in the bpffs at `bpf_path`, on the calling thread (already in
    /// the namespace), without the writer lock.
    pub fn open(
        list: &BackendList,
        nft_table: Table,
        bpf_path: &Path,
    ) -> Result<Opened, KernelError> {
        let kernels = list
            .as_slice()
            .iter()
            .map(|b| b.open(bpf_path))
            .collect::<Result<_, _>>()?;
        Ok(Opened {
            kernels,
            nft_table,
            bpf_path: bpf_path.to_path_buf(),
            retired: Vec::new(),
        })
    }

    /// Also open the kinds `list` does not select, where this kernel has
    /// them (a kernel without nf_tables has no nft sets to remove, and the
    /// reverse), so that their owned sets are removed.
    pub(crate) fn retire_others(&mut self, list: &BackendList) {
        let selected = list.kinds();
        for kind in ["ipset", "nft"] {
            if selected.contains(&kind) {
                continue;
            }
            let Some(b) = KernelBackend::retiring(kind) else {
                continue;
            };
            match b.open(&self.bpf_path) {
                Ok(k) => self.retired.push(k),
                Err(e) => tracing::info!(
                    backend = %b,
                    error = %e,
                    "the backend not selected cannot be opened; none of its sets are removed"
                ),
            }
        }
    }

    /// The backend over these kernels. `config.naming` says which sets it
    /// owns.
    pub fn into_backend(self, config: ReconcilerConfig) -> Box<dyn SetsBackend> {
        let table = self.nft_table;
        let all = |kernels: Vec<OpenedKernel>, config: &ReconcilerConfig| {
            let mut list: Vec<Box<dyn SetsBackend>> = kernels
                .into_iter()
                .map(|k| k.into_backend(table.clone(), config.clone()))
                .collect();
            match list.len() {
                1 => list.pop(),
                0 => None,
                _ => Some(Box::new(Backends::new(list)) as Box<dyn SetsBackend>),
            }
        };
        let retired_config = ReconcilerConfig {
            prune: true,
            ..config.clone()
        };
        let retired = all(self.retired, &retired_config);
        let active = all(self.kernels, &config).expect("a backend list is never empty");
        match retired {
            None => active,
            Some(retired) => Box::new(Retiring::new(active, retired)),
        }
    }
}
