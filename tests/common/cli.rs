//! Running the binary as a user would: arguments, standard input, and what
//! it printed. Included with `#[path]` by the CLI tests (tests/slice.rs,
//! tests/slice_output.rs).

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Run `ipsetmgr ARGS` with `stdin` (none: empty) and wait for it.
pub fn ipsetmgr(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ipsetmgr"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ipsetmgr");
    let mut input = child.stdin.take().unwrap();
    // A command refused at once may exit before reading: ignore EPIPE.
    let _ = input.write_all(stdin.unwrap_or("").as_bytes());
    drop(input);
    child.wait_with_output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
