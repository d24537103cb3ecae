//! Feed arbitrary bytes to every netlink reply decoder of the ipset backend.
//! Run with `cargo +nightly fuzz run decode` from the repository root.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ipsetmgr_dataplane::netlink::fuzz_decode(data);
});
