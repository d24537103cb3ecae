//! The nf_tables conformance suite against the in-memory model: the
//! manager's tests will run on it, so it must answer as the kernel does
//! (the same bodies the netlink and cli backends run). Needs no root.

#[macro_use]
mod conformance;

conformance_tests!(model);

use ipsetmgr_ipset::{Family, SetType};
use ipsetmgr_nft::model::{Fault, ModelNft};
use ipsetmgr_nft::{NftBatchError, NftDataplane, NftError, NftOp};

/// The model's own hooks: injected faults fail exactly one call and apply
/// nothing; every transaction is counted once.
#[test]
fn injected_faults_fail_one_call_and_apply_nothing() {
    let m = ModelNft::new();
    let mut dp = m.clone();
    let s = conformance::shape(SetType::HashIp, Some(Family::V4), false);
    let e = conformance::elements(&s, &["10.0.0.1"]);
    let ops = [
        NftOp::EnsureTable,
        NftOp::CreateSet {
            name: "ipm4-a",
            spec: &s.spec,
        },
        NftOp::AddElements {
            set: "ipm4-a",
            elements: &e,
        },
    ];
    let injected = NftBatchError {
        op_index: Some(2),
        element_index: None,
        error: NftError::Unavailable("injected".into()),
    };
    m.inject(Fault::FailNextApply(injected.clone()));
    assert_eq!(
        dp.apply(&conformance::table(), &ops, &conformance::owned),
        Err(injected)
    );
    assert_eq!(m.table(&conformance::table()), None, "nothing applied");
    conformance::ok(&mut dp, &ops, &conformance::owned);
    assert_eq!(m.stats().transactions, 1);
    m.inject(Fault::FailNextRead(NftError::Protocol("torn".into())));
    assert!(dp.read_set(&conformance::table(), "ipm4-a").is_err());
    assert!(
        dp.read_set(&conformance::table(), "ipm4-a")
            .unwrap()
            .is_some()
    );
    m.inject(Fault::FailNextList(NftError::Unavailable("down".into())));
    assert!(
        dp.list_sets(&conformance::table(), &conformance::owned)
            .is_err()
    );
    assert_eq!(
        dp.list_sets(&conformance::table(), &conformance::owned)
            .unwrap(),
        Some(vec!["ipm4-a".to_string()])
    );
}
