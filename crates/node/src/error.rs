//! Why the kernel side could not start.

use ipsetmgr_dataplane::OpenError;
use ipsetmgr_dataplane::netns::NetnsError;
use ipsetmgr_nft::NftError;

use crate::lock::LockError;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("cannot open nf_tables netlink: {0}")]
    Nft(#[from] NftError),
    #[error("cannot open the bpffs: {0}")]
    Bpf(#[from] ipsetmgr_bpf::BpfError),
    #[error("cannot start the kernel thread: {0}")]
    Thread(std::io::Error),
    #[error("the kernel thread stopped before it was ready")]
    Died,
}
