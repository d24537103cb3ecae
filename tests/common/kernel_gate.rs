//! Whether a kernel test can run here, shared by every kernel test file
//! (included with `#[path]`). Kernel tests need root and a fresh network
//! namespace. Without them they skip with a message saying so, except under
//! `CI=true`: there a test that cannot run fails instead, so CI never
//! reports success for tests that did not run.

#![allow(dead_code)]

/// The message of a test that could not run.
pub const SKIP: &str = "skipped: needs root (kernel tests run in a fresh network namespace)";

/// Say that the test cannot run (`why`: the detail); under `CI=true` this
/// panics, failing the test.
pub fn cannot_run(test: &str, why: &str) {
    let msg = format!("{test}: {SKIP}{why}");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg} — under CI=true every kernel test must run");
    }
    eprintln!("{msg}");
}

/// Move the calling thread into a fresh, empty network namespace. `false`
/// (after [`cannot_run`]) when that is not possible here.
pub fn enter_fresh_netns(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        cannot_run(test, "");
        return false;
    }
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        cannot_run(test, &format!(" (unshare failed: {e})"));
        return false;
    }
    true
}
