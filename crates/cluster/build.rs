//! Records the source revision for `ipsetmgr_build_info` and the roles'
//! start-up logs: `IPSETMGR_REVISION` from the environment (the image build
//! passes it, as its context has no `.git`), else `git rev-parse HEAD`, else
//! "unknown". Here, with the telemetry that reports it (this crate is at
//! `crates/cluster`, two levels below the repository's root).

#![forbid(unsafe_code)]

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=IPSETMGR_REVISION");
    if std::path::Path::new("../../.git/HEAD").exists() {
        println!("cargo:rerun-if-changed=../../.git/HEAD");
        println!("cargo:rerun-if-changed=../../.git/refs");
    }
    let revision = std::env::var("IPSETMGR_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(git_head)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=IPSETMGR_REVISION={revision}");
}

fn git_head() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    let rev = String::from_utf8(out.stdout).ok()?.trim().to_string();
    // Only a plain hex object name: nothing else reaches the binary.
    (out.status.success() && !rev.is_empty() && rev.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(rev)
}
