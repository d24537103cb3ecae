//! The kernel conformance suite against the `ipset` CLI backend, plus
//! CLI-specific checks. Needs root; each test runs in a fresh netns.

#[macro_use]
mod conformance;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use ipsetmgr_dataplane::cli::CliDataplane;
use ipsetmgr_dataplane::{Dataplane, DataplaneError, Op};
use ipsetmgr_ipset::{Family, Member, MemberSet, SetKind, SetType};

conformance_tests!(|| Box::new(CliDataplane::new()));

#[test]
fn missing_binary_is_unavailable() {
    let mut dp = CliDataplane::with_binary("/nonexistent/ipset");
    let e = dp.apply(&[Op::Flush { set: "ipm4-a" }]).unwrap_err();
    assert!(matches!(e.error, DataplaneError::Unavailable(_)), "{e:?}");
}

fn raw_restore(script: &[u8]) -> std::time::Duration {
    let t = Instant::now();
    let mut child = Command::new("ipset")
        .arg("restore")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(script).unwrap();
    assert!(child.wait().unwrap().success());
    t.elapsed()
}

fn perf_body(dp: &mut dyn Dataplane) {
    let n: u32 = std::env::var("IPSETMGR_PERF_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let mut m = MemberSet::with_capacity(kind, n as usize);
    for i in 0..n {
        m.insert(Member::Ip(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()));
    }
    let h = conformance::header(SetType::HashIp, Some(Family::V4), n * 2);
    // The equivalent script, in the same member order.
    let mut script =
        format!("create ipm4-raw hash:ip family inet maxelem {}\n", n * 2).into_bytes();
    for x in m.iter() {
        writeln!(script, "add -exist ipm4-raw {x}").unwrap();
    }
    let raw = raw_restore(&script);
    let t = Instant::now();
    conformance::ok(
        dp,
        &[
            Op::Create {
                set: "ipm4-perf",
                header: &h,
            },
            Op::Add {
                set: "ipm4-perf",
                members: &m,
            },
        ],
    );
    let ours = t.elapsed();
    let t = Instant::now();
    let out = Command::new("ipset")
        .args(["list", "ipm4-raw"])
        .output()
        .unwrap();
    let raw_list = t.elapsed();
    assert!(out.status.success());
    let t = Instant::now();
    let k = dp.read_set("ipm4-perf").unwrap().unwrap();
    let read = t.elapsed();
    assert_eq!(k.members.unwrap().len(), n as usize);
    eprintln!(
        "perf {n} members: raw restore {raw:?}, cli apply {ours:?} ({:.2}x); raw list {raw_list:?}, cli read_set {read:?} ({:.2}x)",
        ours.as_secs_f64() / raw.as_secs_f64(),
        read.as_secs_f64() / raw_list.as_secs_f64()
    );
}

/// Timing against raw `ipset restore` (printed; run with --nocapture and
/// in release for meaningful numbers).
#[test]
fn perf_vs_raw_restore() {
    conformance::run(
        "perf_vs_raw_restore",
        conformance::Mode::Kernel,
        || Box::new(CliDataplane::new()),
        perf_body,
    );
}
