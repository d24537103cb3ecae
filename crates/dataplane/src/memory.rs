//! Returning freed memory to the kernel.
//!
//! Loading a policy of a million members allocates far more transiently
//! (YAML events, member strings) than the compact sets the manager keeps.
//! glibc keeps freed heap pages mapped, so without a trim a long-running
//! agent would keep its peak footprint forever.

/// Ask the allocator to release free heap pages (a no-op off glibc).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only inspects and unmaps the allocator's own free
    // pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
