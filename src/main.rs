//! The `ipsetmgr` binary; everything is in the library (`ipsetmgr::main`).

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    ipsetmgr::main()
}
