//! The one bpf(2) call aya 0.14 does not offer: creating an
//! `BPF_MAP_TYPE_ARRAY_OF_MAPS` outside an ELF object. aya creates
//! map-in-maps only while loading an object (`MapData::create` takes no
//! inner map; `create_with_inner_map_fd` is private to the crate), so the
//! outer map is created here and handed to aya (`MapData::from_fd`) for
//! everything after: slot updates, lookups, pins (docs/bpf.md, "Library").

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// include/uapi/linux/bpf.h: `BPF_MAP_CREATE`, `BPF_MAP_TYPE_ARRAY_OF_MAPS`.
const BPF_MAP_CREATE: libc::c_long = 0;
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
