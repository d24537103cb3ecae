//! The nf_tables conformance suite against the native netlink backend.
//! Needs root; each test runs in a fresh network namespace, with `nft` as
//! the oracle.

#[macro_use]
mod conformance;

conformance_tests!(kernel: conformance::netlink);

use ipsetmgr_nft::cli::CliNft;
use ipsetmgr_nft::{NftDataplane, NftOp, Table, TableFamily};

/// Sets that `nft` itself wrote (with its null interval-end element at the
/// bottom of interval sets, its open-interval flag, its comments) read back
/// through netlink exactly as `nft -j` lists them.
#[test]
fn netlink_reads_what_nft_wrote() {
    conformance::run(
        "netlink_reads_what_nft_wrote",
        conformance::Mode::Kernel,
        conformance::netlink,
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
            nft_script(script);
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

/// Shapes of an owned name that nft 1.0.6's JSON does not show as sets of
/// ours: a map (listed as a `map`), `flags dynamic` (left out of its JSON).
/// Netlink and nft-cli both leave the map out of `list_sets`, read each as
/// a shape to replace, and delete each with `DeleteSet` (nft-cli: `delete
/// map` for the map).
#[test]
fn hidden_shapes_read_alike_through_netlink_and_nft() {
    conformance::run(
        "hidden_shapes_read_alike_through_netlink_and_nft",
        conformance::Mode::Kernel,
        conformance::netlink,
        |dp, _env| {
            nft_script(
                r#"
                add table inet T
                add map inet T ipm4-map { type ipv4_addr : verdict; }
                add set inet T ipm4-dyn { type ipv4_addr; flags dynamic; }
                add set inet T ipm4-dynsz { type ipv4_addr; size 65536; flags dynamic; }
                add set inet T ipm4-plain { type ipv4_addr; size 65536; elements = { 10.0.0.1 }; }
            "#,
            );
            let table = Table::new(TableFamily::Inet, "T");
            let mut cli = CliNft::new();
            let sets = ["ipm4-dyn", "ipm4-dynsz", "ipm4-plain"].map(String::from);
            assert_eq!(
                dp.list_sets(&table, &conformance::owned).unwrap(),
                Some(sets.to_vec())
            );
            assert_eq!(
                cli.list_sets(&table, &conformance::owned).unwrap(),
                Some(sets.to_vec())
            );
            for (name, word) in [
                ("ipm4-map", Some("map")),
                ("ipm4-dyn", Some("flags dynamic")),
                ("ipm4-dynsz", Some("flags dynamic")),
                ("ipm4-plain", None),
            ] {
                let ours = dp.read_set(&table, name).unwrap().expect(name);
                let nfts = cli.read_set(&table, name).unwrap().expect(name);
                for (backend, k) in [("netlink", &ours), ("cli", &nfts)] {
                    match word {
                        Some(w) => assert!(
                            k.unmanaged.iter().any(|u| u == w),
                            "{backend} {name}: {:?}",
                            k.unmanaged
                        ),
                        None => assert_eq!(k.unmanaged, Vec::<String>::new(), "{backend} {name}"),
                    }
                }
                assert_eq!(ours.unmanaged, nfts.unmanaged, "{name}");
                assert_eq!(ours.handle, nfts.handle, "{name}");
                assert_eq!(ours.spec.map(|s| s.key), nfts.spec.map(|s| s.key), "{name}");
            }
            assert_eq!(
                cli.read_set(&table, "ipm4-plain")
                    .unwrap()
                    .unwrap()
                    .elements,
                dp.read_set(&table, "ipm4-plain").unwrap().unwrap().elements
            );
            let owned = &conformance::owned;
            cli.apply(
                &table,
                &[
                    NftOp::DeleteSet { set: "ipm4-map" },
                    NftOp::DeleteSet { set: "ipm4-dyn" },
                ],
                owned,
            )
            .expect("nft deletes the map and the dynamic set");
            dp.apply(&table, &[NftOp::DeleteSet { set: "ipm4-dynsz" }], owned)
                .expect("netlink deletes the dynamic set");
            for name in ["ipm4-map", "ipm4-dyn", "ipm4-dynsz"] {
                assert_eq!(dp.read_set(&table, name).unwrap(), None, "{name}");
                assert_eq!(cli.read_set(&table, name).unwrap(), None, "{name}");
            }
            assert_eq!(
                cli.list_sets(&table, owned).unwrap(),
                Some(vec!["ipm4-plain".to_string()])
            );
        },
    );
}

/// Run `script` through `nft -f -`; it must succeed.
fn nft_script(script: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft -f");
}
