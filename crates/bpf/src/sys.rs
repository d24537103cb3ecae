//! The two bpf(2) calls aya 0.14 does not offer (docs/bpf.md, "Library"):
//!
//! - creating an `BPF_MAP_TYPE_ARRAY_OF_MAPS` outside an ELF object. aya
//!   creates map-in-maps only while loading an object (`MapData::create`
//!   takes no inner map; `create_with_inner_map_fd` is private to the
//!   crate), so the outer map is created here and handed to aya
//!   (`MapData::from_fd`) for everything after: slot updates, lookups, pins.
//! - `BPF_MAP_UPDATE_BATCH`: many entries in one call. aya has no batch
//!   API; filling a trie of 1M entries one update each spends most of its
//!   time in the syscall itself (docs/performance.md, "BPF sets").

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// include/uapi/linux/bpf.h: `BPF_MAP_CREATE`, `BPF_MAP_TYPE_ARRAY_OF_MAPS`.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;
/// `BPF_OBJ_NAME_LEN`: a map's name, NUL included.
const NAME_LEN: usize = 16;

/// The leading fields of `union bpf_attr` that `BPF_MAP_CREATE` reads, in
/// the kernel's layout. The kernel zero-fills the fields past the size it
/// is given, so the later ones (BTF, NUMA, map_extra) need not be here.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; NAME_LEN],
}

/// Create an array-of-maps of `slots` slots whose inner maps must look like
/// `inner` (type, key and value size, flags; the kernel checks every map
/// put in a slot against it). `name` is the kernel's name of the map: at
/// most 15 bytes of letters, digits, `_` and `.`.
pub(crate) fn create_array_of_maps(
    name: &CStr,
    inner: BorrowedFd<'_>,
    slots: u32,
) -> Result<OwnedFd, Errno> {
    let mut map_name = [0u8; NAME_LEN];
    let bytes = name.to_bytes();
    let len = bytes.len().min(NAME_LEN - 1);
    map_name[..len].copy_from_slice(&bytes[..len]);
    let attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY_OF_MAPS,
        key_size: 4,
        // A slot holds a map: an fd going in, the map's id coming out.
        value_size: 4,
        max_entries: slots,
        map_flags: 0,
        inner_map_fd: inner.as_raw_fd() as u32,
        numa_node: 0,
        map_name,
    };
    // SAFETY: `attr` is a live, initialised `repr(C)` value laid out as the
    // kernel's `bpf_attr` for BPF_MAP_CREATE, and the size passed is its
    // own, so the kernel reads only memory we own; it writes nothing back.
    // `inner` is borrowed for the whole call, so its fd stays open.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &attr as *const MapCreateAttr,
            std::mem::size_of::<MapCreateAttr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: on success BPF_MAP_CREATE returns a new file descriptor that
    // nothing else owns; it is wrapped exactly once, here.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

/// `union bpf_attr`'s `batch` member, which the `BPF_MAP_*_BATCH` commands
/// read, in the kernel's layout (all of it: the kernel refuses non-zero
/// bytes past its last field).
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    /// In: how many entries; out: how many were written.
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Why a batch update stopped: `written` entries went in before the one
/// that failed with `errno` (0 and `EINVAL` or `ENOTSUPP` when the kernel
/// has no batch update for the map: before 5.6 for any map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchStopped {
    pub(crate) written: usize,
    pub(crate) errno: Errno,
}

/// The kernel's `ENOTSUPP` (524, not `EOPNOTSUPP`): the map type has no
/// batch operations.
pub(crate) const ENOTSUPP: i32 = 524;

/// Insert or overwrite `values.len()` entries into `map` in one call:
/// `keys` holds their keys back to back, `key_size` bytes each, `values`
/// one byte each. The kernel writes them in order and stops at the first
/// that fails.
pub(crate) fn update_batch(
    map: BorrowedFd<'_>,
    keys: &[u8],
    key_size: usize,
    values: &[u8],
) -> Result<(), BatchStopped> {
    // The kernel reads key_size * count bytes of keys and count of values.
    assert_eq!(keys.len(), key_size * values.len(), "one key per value");
    if values.is_empty() {
        return Ok(());
    }
    let count = u32::try_from(values.len()).expect("callers send bounded chunks");
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: map.as_raw_fd() as u32,
        // BPF_ANY: insert or overwrite.
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `attr` is a live, initialised `repr(C)` value laid out as the
    // kernel's `bpf_attr.batch`, and the size passed is its own. The kernel
    // reads `count` keys of the map's key size from `keys` and `count`
    // values of its value size from `values`: the assert above makes both
    // buffers exactly that long for the key size the caller created the
    // map with, and the value size of our tries is 1. It writes back only
    // `attr.count`, which we own mutably. `map` is borrowed for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        let errno = Errno::last();
        return Err(BatchStopped {
            // The kernel sets count to the entries it wrote when it stops
            // inside the loop; when it refuses the call before, count is
            // untouched, and nothing was written.
            written: if attr.count < count {
                attr.count as usize
            } else {
                0
            },
            errno,
        });
    }
    Ok(())
}
