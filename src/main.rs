//! The `ipsetmgr` binary; everything is in the library (`ipsetmgr::main`).

fn main() -> std::process::ExitCode {
    ipsetmgr::main()
}
