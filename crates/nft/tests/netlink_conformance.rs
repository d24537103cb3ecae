//! The nf_tables conformance suite against the native netlink backend.
//! Needs root; each test runs in a fresh network namespace, with `nft` as
//! the oracle.

#[macro_use]
mod conformance;

use ipsetmgr_nft::netlink::NetlinkNft;

conformance_tests!(kernel: || Box::new(NetlinkNft::new().expect("a NETLINK_NETFILTER socket")));

use ipsetmgr_nft::cli::CliNft;
use ipsetmgr_nft::{NftDataplane, Table, TableFamily};

/// Sets that `nft` itself wrote (with its null interval-end element at the
/// bottom of interval sets, its open-interval flag, its comments) read back
/// through netlink exactly as `nft -j` lists them.
#[test]
fn netlink_reads_what_nft_wrote() {
    conformance::run(
        "netlink_reads_what_nft_wrote",
        conformance::Mode::Kernel,
        || Box::new(NetlinkNft::new().expect("a NETLINK_NETFILTER socket")),
        |dp, _env| {
            let script = r#"
                add table inet T
                add set inet T ipm4-n { type ipv4_addr; flags interval; elements = { 0.0.0.0/8 comment "low", 10.0.0.0-10.0.0.9, 192.168.0.0/16, 255.0.0.0/8 comment "top" }; }
                add set inet T ipm6-n { type ipv6_addr; flags interval; size 99; elements = { ::/1, fe80::/10 }; }
                add set inet T ipm4-c { type ipv4_addr . inet_proto . inet_service; flags interval; elements = { 10.0.0.0/8 . tcp . 80 comment "web", 1.1.1.1 . udp . 53 }; }
                add set inet T ipm4-i { type ipv4_addr . ifname; flags interval; elements = { 0.0.0.0/0 . "eth0" }; }
                add set inet T ipm4-m { type ipv4_addr . mark; elements = { 10.0.0.1 . 0x10 }; }
                add set inet T ipmx-e { type ether_addr; elements = { aa:bb:cc:dd:ee:ff comment "nic" }; }
                add set inet T ipmx-p { type inet_service; elements = { 22, 443 }; }
            "#;
            let mut child = std::process::Command::new("nft")
                .args(["-f", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("run nft");
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(script.as_bytes())
                .unwrap();
            assert!(child.wait().unwrap().success(), "nft -f");
            let table = Table::new(TableFamily::Inet, "T");
            let mut cli = CliNft::new();
            let names = dp.list_sets(&table, &conformance::owned).unwrap().unwrap();
            assert_eq!(names.len(), 7, "{names:?}");
            for name in names {
                let ours = dp.read_set(&table, &name).unwrap().unwrap();
                let nfts = cli.read_set(&table, &name).unwrap().unwrap();
                assert_eq!(ours.unreadable_elements, 0, "{name}");
                assert_eq!(ours.unmanaged, Vec::<String>::new(), "{name}");
                assert_eq!(ours.spec, nfts.spec, "{name}");
                let show = |k: &ipsetmgr_nft::NftKernelSet| {
                    k.elements
                        .as_ref()
                        .unwrap()
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                };
                assert_eq!(show(&ours), show(&nfts), "{name}");
                assert_eq!(ours.elements, nfts.elements, "{name}");
            }
        },
    );
}
