//! The crate's one error type. Every kernel failure names the set, the
//! operation and the kernel's errno (`E2BIG: Argument list too long`), and
//! an entry operation also the entry, as the other kernels' errors do.

use std::path::PathBuf;

use ipsetmgr_ipset::Family;
use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("bpffs at {path}: {op}: {errno}")]
    Bpffs {
        path: PathBuf,
        op: &'static str,
        errno: Errno,
    },
    #[error(
        "invalid BPF set name {0:?}: use 1-255 letters, digits, '-', '_' or '.', not starting with '.'"
    )]
    BadName(String),
    #[error("BPF set {set}: {op}: {errno}")]
    Kernel {
        set: String,
        op: &'static str,
        errno: Errno,
    },
    #[error("BPF set {set}: {op} {entry}: {errno}")]
    Entry {
        set: String,
        op: &'static str,
        entry: String,
        errno: Errno,
    },
    /// An aya failure that carries no errno (a size or type check of aya's).
    #[error("BPF set {set}: {op}: {source}")]
    Map {
        set: String,
        op: &'static str,
        source: aya::maps::MapError,
    },
    #[error("BPF set {set} does not exist (no pin at {path})")]
    NotFound { set: String, path: PathBuf },
    #[error("BPF set {set} already exists (pinned at {path})")]
    Exists { set: String, path: PathBuf },
    #[error("BPF set {set}: the map pinned at {path} is not one of ipsetmgr's sets ({why})")]
    NotASet {
        set: String,
        path: PathBuf,
        why: String,
    },
    #[error("BPF set {set} is an {set_family} set; {entry} is of the other family")]
    WrongFamily {
        set: String,
        set_family: &'static str,
        entry: String,
    },
    #[error("{member}: a BPF prefix set cannot hold it ({why})")]
    CannotHold { member: String, why: &'static str },
    #[error("invalid prefix {addr}/{prefix}: longer than the address")]
    BadPrefix { addr: std::net::IpAddr, prefix: u8 },
    #[error(transparent)]
    Xdp(#[from] XdpError),
}

/// What attaching or detaching the XDP program (crate::xdp) can fail with.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error(
        "this ipsetmgr was built without its XDP program (clang was missing at build time; docs/bpf.md, \"How the XDP object is built\")"
    )]
    ObjectMissing,
    #[error("at most {max} {family} sets per interface; {given} were named")]
    TooManySets {
        family: Family,
        max: usize,
        given: usize,
    },
    #[error("an XDP program of ipsetmgr is already attached to {interface} (pinned at {path})")]
    AlreadyAttached { interface: String, path: PathBuf },
    #[error("no XDP program of ipsetmgr is attached to {interface} (no pin at {path})")]
    NotAttached { interface: String, path: PathBuf },
    #[error("invalid interface name {0:?}")]
    BadInterface(String),
    #[error(
        "the XDP program on {interface} needs at least one policy to drop from, and no empty name"
    )]
    NoPolicies { interface: String },
    #[error(
        "policy {policy} has no BPF set in {dir} (neither {v4} nor {v6}): apply it with --backend bpf first (hash:ip and hash:net policies only)"
    )]
    NoSet {
        policy: String,
        dir: PathBuf,
        v4: String,
        v6: String,
    },
    #[error("loading the XDP program: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("attaching the XDP program to {interface}: {source}")]
    Attach {
        interface: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error(
        "the XDP program on {interface} was attached without a bpf_link (kernel older than 5.9?), which cannot be pinned"
    )]
    NoLink { interface: String },
    #[error("{op} {path}: {errno}")]
    Pin {
        op: &'static str,
        path: PathBuf,
        errno: nix::errno::Errno,
    },
}

/// The errno of an aya map error, when the kernel gave one.
pub(crate) fn errno_of(e: &aya::maps::MapError) -> Option<Errno> {
    use aya::maps::MapError;
    use aya::pin::PinError;
    let io = match e {
        MapError::SyscallError(s) => &s.io_error,
        MapError::CreateError { io_error, .. } => io_error,
        MapError::IoError(io) => io,
        MapError::PinError {
            error: PinError::SyscallError(s),
            ..
        } => &s.io_error,
        _ => return None,
    };
    io.raw_os_error().map(Errno::from_raw)
}

/// `e` as [`BpfError::Kernel`] when it carries an errno, else as
/// [`BpfError::Map`].
pub(crate) fn kernel(set: &str, op: &'static str, e: aya::maps::MapError) -> BpfError {
    match errno_of(&e) {
        Some(errno) => BpfError::Kernel {
            set: set.to_string(),
            op,
            errno,
        },
        None => BpfError::Map {
            set: set.to_string(),
            op,
            source: e,
        },
    }
}
