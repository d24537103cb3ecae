//! Builds the XDP program (xdp/drop_from.bpf.c) with clang into OUT_DIR,
//! where src/xdp.rs embeds it (docs/bpf.md, "How the XDP object is built").
//!
//! clang comes from Debian's `clang` package (.ci/run installs it); the
//! source needs no other header or library. `CLANG` names another binary.
//! Without clang the crate still builds, without the program (its attach
//! fails saying why), except under `CI=true`, where the build fails.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "xdp/drop_from.bpf.c";

fn main() {
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rustc-check-cfg=cfg(xdp_object)");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("drop_from.o");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // -g: BTF, which the map-in-map definitions need. The prefix map keeps
    // the checkout's path out of the object, so it is the same everywhere.
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-fdebug-prefix-map={dir}=."))
        .args(["-c", SOURCE, "-o"])
        .arg(&out)
        .current_dir(&dir)
        .status();
    match status {
        Ok(s) if s.success() => println!("cargo::rustc-cfg=xdp_object"),
        Ok(s) => panic!("{clang} failed to compile {SOURCE} ({s})"),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{clang} is needed to build {SOURCE} ({e}); install Debian's clang package")
        }
        Err(e) => println!(
            "cargo::warning=building without the XDP program: {clang}: {e} (install Debian's clang package)"
        ),
    }
}
