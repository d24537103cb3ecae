//! The reconciler over nft sets (netlink) with a million-element set: the first apply, a
//! 10-member change and a full resync, timed (printed, not asserted: the
//! figures depend on the machine). Ignored by default (a release build
//! gives the meaningful figures): `cargo test --release -p ipsetmgr-nft
//! --test backend_million -- --ignored --nocapture`. Needs root; runs in a
//! fresh network namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use ipsetmgr_ipset::{
    Family, HeaderOptions, Member, MemberSet, MemberSetBuilder, Naming, SetHeader, SetKind, SetType,
};
use ipsetmgr_nft::backend::{default_table, netlink_reconciler};
use ipsetmgr_sets::{DesiredSet, ReconcilerConfig, WriteKind};

#[path = "../../../tests/common/kernel_gate.rs"]
mod kernel_gate;

fn desired(n: u32, offset: u32) -> DesiredSet {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let members = (0..n).map(|i| Member::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + offset + i))));
    DesiredSet {
        name: Naming::default().main_set_name("big", Some(Family::V4)),
        policy: "big".into(),
        header: SetHeader {
            kind,
            max_elem: 1 << 21,
            hash_size: None,
            options: HeaderOptions::default(),
        },
        // Built as the policy compiler builds them (sorted), so that the
        // backend sees what `run` and the agent hand it.
        members: Arc::new(sorted(kind, members)),
    }
}

fn sorted(kind: SetKind, members: impl Iterator<Item = Member>) -> MemberSet {
    let mut b = MemberSetBuilder::with_capacity(kind, 0);
    for m in members {
        b.push(m);
    }
    b.finish().0
}

#[test]
#[ignore = "a million elements: run with --release --ignored"]
fn a_million_member_policy_applied_changed_and_resynced() {
    let name = "a_million_member_policy_applied_changed_and_resynced";
    std::thread::spawn(move || {
        if !kernel_gate::enter_fresh_netns(name) {
            return;
        }
        let n = 1_000_000;
        let mut b = netlink_reconciler(default_table(), ReconcilerConfig::default()).unwrap();
        let d = desired(n, 0);
        let t = Instant::now();
        b.set_desired(vec![d], vec![]);
        let compiled = t.elapsed();
        let t = Instant::now();
        let o = b.apply_updates();
        let applied = t.elapsed();
        assert!(o.applied, "{:?}", o.error);
        assert_eq!(o.written.len(), 1);
        assert_eq!((o.written[0].0.name.as_str(), o.written[0].1), ("ipm4-big", WriteKind::Create));
        // Ten members out, ten in.
        let d = desired(n, 10);
        let t = Instant::now();
        b.set_desired(vec![d], vec![]);
        let diffed = t.elapsed();
        let o = b.apply_updates();
        let changed = t.elapsed();
        assert_eq!(o.written.len(), 1);
        assert_eq!((o.written[0].0.name.as_str(), o.written[0].1), ("ipm4-big", WriteKind::Delta));
        b.queue_resync();
        let t = Instant::now();
        let o = b.apply_updates();
        let resynced = t.elapsed();
        assert!(o.written.is_empty());
        assert_eq!(b.report()[0].problems, 0);
        eprintln!(
            "1M hash:ip via Reconciler<NftKernel<NetlinkNft>>: set_desired (compile) {compiled:?}, first apply {applied:?}, 10-member change {changed:?} (set_desired {diffed:?}), full resync {resynced:?}"
        );
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p));
}
