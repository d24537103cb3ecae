//! The netlink backend against `nft` itself, each run in a fresh network
//! namespace (needs root):
//!
//! ```text
//! cargo run --release -p ipsetmgr-nft --example nft_bench -- bench [RUNS] [N]
//! cargo run --release -p ipsetmgr-nft --example nft_bench -- demo
//! ```
//!
//! `bench`: creating and filling a new N-element (default 1,000,000)
//! `ipv4_addr` set, end to end from typed members (building the elements
//! included), against `nft -f` of the same set written as nft's syntax
//! (generated beforehand, not timed); then a resync (reading every element
//! back into typed elements) against `nft list set` of the same set.
//! `demo`: one set of every type through netlink, then `nft list ruleset`.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipsetmgr_ipset::{Family, HeaderOptions, Member, SetType};
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{NftDataplane, NftOp, SetShape, Table, TableFamily};

fn in_fresh_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET): run as root");
            f()
        })
        .join()
        .expect("run thread")
    })
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn nft(args: &[&str]) -> Duration {
    timed(|| {
        let st = Command::new("nft")
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("run nft");
        assert!(st.success(), "nft {args:?}");
    })
}

/// This thread's user and system CPU time so far (from /proc), to tell the
/// kernel's share of a read from ours.
fn cpu() -> (Duration, Duration) {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the
    // 14th field of the line, stime the 15th, in clock ticks (100 per second).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let tick = |t: u64| Duration::from_millis(t * 10);
    (
        tick(*f.get(11).unwrap_or(&0)),
        tick(*f.get(12).unwrap_or(&0)),
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn bench(runs: usize, n: u32) {
    let table = Table::new(TableFamily::Inet, "t");
    let owned = |s: &str| s == "s";
    let members: Vec<Member> = (0..n)
        .map(|i| Member::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))))
        .collect();
    let shape = SetShape::new(
        SetType::HashIp,
        Some(Family::V4),
        &HeaderOptions::default(),
        1 << 20,
    )
    .unwrap();
    // The same set in nft's own syntax.
    let path = std::env::temp_dir().join(format!("nft_bench_{n}.nft"));
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        writeln!(f, "add table inet t").unwrap();
        writeln!(f, "add set inet t s {{ type ipv4_addr; size 1048576; }}").unwrap();
        write!(f, "add element inet t s {{ ").unwrap();
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                write!(f, ", ").unwrap();
            }
            write!(f, "{m}").unwrap();
        }
        writeln!(f, " }}").unwrap();
    }
    let file = path.to_str().unwrap().to_string();
    println!("run  netlink-fill(ms)  nft-f(ms)  ratio  netlink-read(ms)  nft-list(ms)  ratio");
    let mut sums = [0f64; 4];
    for run in 0..runs {
        let (fill, read, list_a) = in_fresh_netns(|| {
            let mut dp = NetlinkNft::new().unwrap();
            let fill = timed(|| {
                let e = shape.elements(&members).unwrap();
                dp.apply(
                    &table,
                    &[
                        NftOp::EnsureTable,
                        NftOp::CreateSet {
                            name: "s",
                            spec: &shape.spec,
                        },
                        NftOp::AddElements {
                            set: "s",
                            elements: &e,
                        },
                    ],
                    &owned,
                )
                .unwrap();
            });
            let mut got = 0;
            let (u0, s0) = cpu();
            let read = timed(|| {
                got = dp
                    .read_set(&table, "s")
                    .unwrap()
                    .unwrap()
                    .elements
                    .unwrap()
                    .len()
            });
            let (u1, s1) = cpu();
            eprintln!(
                "     read: user {:?}, system (the kernel's dump) {:?}",
                u1 - u0,
                s1 - s0
            );
            assert_eq!(got, n as usize);
            let list = nft(&["list", "set", "inet", "t", "s"]);
            (fill, read, list)
        });
        let (file_t, list_b) = in_fresh_netns(|| {
            let t = nft(&["-f", &file]);
            (t, nft(&["list", "set", "inet", "t", "s"]))
        });
        let list = (list_a + list_b) / 2;
        println!(
            "{run:>3}  {:>16.0}  {:>9.0}  {:>5.2}  {:>16.0}  {:>12.0}  {:>5.2}",
            ms(fill),
            ms(file_t),
            ms(fill) / ms(file_t),
            ms(read),
            ms(list),
            ms(read) / ms(list)
        );
        for (s, v) in sums.iter_mut().zip([fill, file_t, read, list]) {
            *s += ms(v);
        }
    }
    let r = runs as f64;
    println!(
        "mean {:>16.0}  {:>9.0}  {:>5.2}  {:>16.0}  {:>12.0}  {:>5.2}",
        sums[0] / r,
        sums[1] / r,
        sums[0] / sums[1],
        sums[2] / r,
        sums[3] / r,
        sums[2] / sums[3]
    );
    let _ = std::fs::remove_file(&path);
}

fn demo() {
    in_fresh_netns(|| {
        let table = Table::new(TableFamily::Inet, "ipsetmgr");
        let mut dp = NetlinkNft::new().unwrap();
        let cases: [(&str, SetType, Option<Family>, &[&str]); 8] = [
            (
                "ipm4-ip",
                SetType::HashIp,
                Some(Family::V4),
                &["10.0.0.1 comment:office", "10.0.0.2"],
            ),
            (
                "ipm4-net",
                SetType::HashNet,
                Some(Family::V4),
                &["10.0.0.0/8", "10.1.0.0/16 nomatch", "10.1.2.0/24"],
            ),
            (
                "ipm6-net",
                SetType::HashNet,
                Some(Family::V6),
                &["::/0", "2001:db8::/32 nomatch"],
            ),
            (
                "ipm4-port",
                SetType::HashIpPort,
                Some(Family::V4),
                &["10.0.0.1,tcp:80", "10.0.0.1,udp:53"],
            ),
            (
                "ipm4-np",
                SetType::HashNetPort,
                Some(Family::V4),
                &["10.0.0.0/8,80", "10.0.0.0/9,80 nomatch"],
            ),
            (
                "ipm4-if",
                SetType::HashNetIface,
                Some(Family::V4),
                &["0.0.0.0/0,eth0", "10.0.0.0/8,eth0 nomatch"],
            ),
            ("ipmx-mac", SetType::HashMac, None, &["aa:bb:cc:dd:ee:ff"]),
            (
                "ipm4-mark",
                SetType::HashIpMark,
                Some(Family::V4),
                &["10.0.0.1,0x10"],
            ),
        ];
        let opts = HeaderOptions {
            comment: true,
            ..Default::default()
        };
        for (name, t, f, items) in cases {
            let s = SetShape::new(t, f, &opts, 1000).unwrap();
            let members: Vec<Member> = items
                .iter()
                .flat_map(|i| Member::parse_user(t, i).unwrap().members)
                .collect();
            let e = s.elements(&members).unwrap();
            dp.apply(
                &table,
                &[
                    NftOp::EnsureTable,
                    NftOp::CreateSet {
                        name,
                        spec: &s.spec,
                    },
                    NftOp::AddElements {
                        set: name,
                        elements: &e,
                    },
                ],
                &|n| n.starts_with("ipm"),
            )
            .unwrap();
        }
        let out = Command::new("nft")
            .args(["list", "ruleset"])
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("demo") => demo(),
        Some("bench") => {
            let runs = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3);
            let n = args
                .get(3)
                .and_then(|a| a.parse().ok())
                .unwrap_or(1_000_000);
            bench(runs, n);
        }
        _ => eprintln!("usage: nft_bench demo | bench [RUNS] [N]"),
    }
}
