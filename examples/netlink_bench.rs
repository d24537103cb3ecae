//! Side-by-side timing of the netlink backend against the `ipset` binary:
//! filling a new hash:ip set (netlink `apply` vs `ipset restore` of the
//! equivalent script) and reading it back (netlink `read_set`, which also
//! parses into a MemberSet, vs `ipset save` to a pipe that is discarded).
//!
//! Runs in a fresh network namespace; needs root.
//! `cargo run --release --example netlink_bench [-- SIZE...]`

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipsetmgr_dataplane::netlink::NetlinkDataplane;
use ipsetmgr_dataplane::{Dataplane, Op};
use ipsetmgr_ipset::{Family, Member, MemberSet, SetHeader, SetKind, SetType};

const RUNS: usize = 3;

fn ipset(args: &[&str]) {
    let st = Command::new("ipset")
        .args(args)
        .status()
        .expect("run ipset");
    assert!(st.success(), "ipset {args:?}");
}

fn best(mut f: impl FnMut() -> Duration) -> Duration {
    (0..RUNS).map(|_| f()).min().unwrap_or_default()
}

fn main() {
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        eprintln!("skipped: needs root (runs in a fresh network namespace): {e}");
        return;
    }
    let sizes: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100_000, 1_000_000]
    } else {
        sizes
    };
    let mut d = NetlinkDataplane::new().expect("netlink backend");
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    for n in sizes {
        // Spread over 10.0.0.0/8 and beyond, like real address lists.
        let members = MemberSet::from_members(
            kind,
            (0..n).map(|i| Member::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000u32 + i * 3)))),
        );
        for hash_size in [None, Some(n.next_power_of_two())] {
            let header = SetHeader {
                kind,
                max_elem: n.max(65536) * 2,
                hash_size,
                options: Default::default(),
            };
            let hs = hash_size.unwrap_or(1024);
            let mut script = format!(
                "create bench hash:ip family inet hashsize {hs} maxelem {}\n",
                header.max_elem
            );
            for m in members.iter() {
                script.push_str("add bench ");
                script.push_str(&m.to_string());
                script.push('\n');
            }

            let fill = [
                Op::Create {
                    set: "bench",
                    header: &header,
                },
                Op::Add {
                    set: "bench",
                    members: &members,
                },
            ];
            let nl_add = best(|| {
                let t = Instant::now();
                d.apply(&fill).expect("netlink fill");
                let e = t.elapsed();
                d.apply(&[Op::Destroy { set: "bench" }]).unwrap();
                e
            });
            let cli_add = best(|| {
                let t = Instant::now();
                let mut child = Command::new("ipset")
                    .arg("restore")
                    .stdin(Stdio::piped())
                    .spawn()
                    .expect("spawn ipset restore");
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(script.as_bytes())
                    .unwrap();
                assert!(child.wait().unwrap().success());
                let e = t.elapsed();
                ipset(&["destroy", "bench"]);
                e
            });

            // Read back the same set.
            d.apply(&fill).unwrap();
            let nl_read = best(|| {
                let t = Instant::now();
                let ks = d.read_set("bench").unwrap().unwrap();
                let e = t.elapsed();
                assert_eq!(ks.members.unwrap().len(), n as usize);
                e
            });
            let cli_read = best(|| {
                let t = Instant::now();
                let out = Command::new("ipset")
                    .args(["save", "bench"])
                    .stdout(Stdio::piped())
                    .output()
                    .unwrap();
                let e = t.elapsed();
                assert!(out.status.success() && out.stdout.len() > n as usize);
                e
            });
            d.apply(&[Op::Destroy { set: "bench" }]).unwrap();

            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "{n:>8} members, hashsize {hs:>8}: fill netlink {:8.1} ms, ipset restore {:8.1} ms ({:.1}x) | read netlink {:8.1} ms, ipset save {:8.1} ms ({:.1}x)",
                ms(nl_add),
                ms(cli_add),
                ms(cli_add) / ms(nl_add),
                ms(nl_read),
                ms(cli_read),
                ms(cli_read) / ms(nl_read),
            );
        }
    }
}
