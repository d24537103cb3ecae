//! The netlink backend fills a new 1,000,000-element `ipv4_addr` set in one
//! transaction (one sendmsg of one batch) and reads it back whole. Prints
//! the times; asserts only what the kernel holds. Needs root; runs in a
//! fresh network namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use ipsetmgr_ipset::{Family, HeaderOptions, Member, SetType};
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{NftDataplane, NftOp, SetShape, Table, TableFamily};

#[path = "../../../tests/common/kernel_gate.rs"]
mod kernel_gate;

#[test]
fn a_million_elements_in_one_transaction() {
    let name = "a_million_elements_in_one_transaction";
    std::thread::spawn(move || {
        if !kernel_gate::enter_fresh_netns(name) {
            return;
        }
        let n = 1_000_000u32;
        let s = SetShape::new(SetType::HashIp, Some(Family::V4), &HeaderOptions::default(), 1 << 20).unwrap();
        let members: Vec<Member> = (0..n)
            .map(|i| Member::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))))
            .collect();
        let t = Instant::now();
        let e = s.elements(&members).unwrap();
        let built = t.elapsed();
        let table = Table::new(TableFamily::Inet, "t");
        let mut dp = NetlinkNft::new().unwrap();
        let t = Instant::now();
        dp.apply(
            &table,
            &[
                NftOp::EnsureTable,
                NftOp::CreateSet { name: "ipm4-m", spec: &s.spec },
                NftOp::AddElements { set: "ipm4-m", elements: &e },
            ],
            &|n| n.starts_with("ipm"),
        )
        .unwrap();
        let applied = t.elapsed();
        let t = Instant::now();
        let k = dp.read_set(&table, "ipm4-m").unwrap().unwrap();
        let read = t.elapsed();
        eprintln!("1M ipv4_addr: build elements {built:?}, one transaction {applied:?}, read back {read:?}");
        let got = k.elements.unwrap();
        assert_eq!(got.len(), n as usize);
        assert_eq!(got, e);
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p));
}
