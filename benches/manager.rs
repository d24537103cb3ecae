//! Criterion benchmarks of the hot paths that do not need a kernel:
//! member parsing, policy compilation, resync diffs and a 10-member delta on
//! a 1M-member set through the manager (in-memory kernel).

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use ipsetmgr_dataplane::model::ModelDataplane;
use ipsetmgr_ipset::{Family, Member, MemberSet, MemberSetBuilder, Naming, SetKind, SetType};
use ipsetmgr_policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec, compile};
use ipsetmgr_sets::ReconcilerConfig;

fn addresses(n: u32) -> Vec<String> {
    (0..n)
        .map(|i| Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect()
}

fn policy(members: Vec<String>) -> IPSetPolicy {
    IPSetPolicy::new(
        "big",
        IPSetPolicySpec {
            max_elem: Some(2_000_000),
            ..IPSetPolicySpec::new(SetType::HashIp, FamilySpec::IPv4, members)
        },
    )
}

fn parse(c: &mut Criterion) {
    let members = addresses(100_000);
    c.bench_function("parse 100k hash:ip members", |b| {
        b.iter(|| {
            for m in &members {
                black_box(Member::parse_user(SetType::HashIp, m).unwrap());
            }
        })
    });
    let p = policy(members);
    c.bench_function("compile 100k-member policy", |b| {
        b.iter(|| black_box(compile(std::slice::from_ref(&p), &Naming::default(), None)))
    });
    // The same with 1024 except ranges (the most a policy may have), a
    // /24 every 256 addresses: each drops 256 of the members, and every
    // member is looked up among the ranges.
    let mut excepting = p.clone();
    excepting.spec.except = (0..1024u32)
        .map(|i| format!("{}/24", Ipv4Addr::from(0x0a00_0000 + i * 512)))
        .collect();
    c.bench_function("compile 100k-member policy with 1024 except ranges", |b| {
        b.iter(|| {
            black_box(compile(
                std::slice::from_ref(&excepting),
                &Naming::default(),
                None,
            ))
        })
    });
}

/// What resync does per set: diff the desired members against a kernel
/// snapshot (both built in bulk, as compile and the backends build them).
fn diff(c: &mut Criterion) {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let bulk = |range: std::ops::Range<u32>| {
        let mut b = MemberSetBuilder::with_capacity(kind, range.len());
        for i in range {
            b.push(Member::Ip(Ipv4Addr::from(i).into()));
        }
        b.finish().0
    };
    let desired = bulk(0..1_000_000);
    let kernel = bulk(10..1_000_010);
    c.bench_function(
        "resync diff of a 1M-member set against a kernel snapshot",
        |bench| bench.iter(|| black_box(desired.diff_both(&kernel))),
    );

    // IPv6 members are not packed: snapshots are sorted vectors of members,
    // diffed by one merge; hash sets (what a set changed in place becomes)
    // are diffed by lookups.
    let kind = SetKind::new(SetType::HashNet, Some(Family::V6));
    let net = |i: u32| Member::Net {
        addr: Ipv6Addr::from((0x2001_0db8_u128 << 96) + (u128::from(i) << 64)).into(),
        prefix: 64,
        nomatch: false,
    };
    let bulk = |range: std::ops::Range<u32>| {
        let mut b = MemberSetBuilder::with_capacity(kind, range.len());
        range.for_each(|i| b.push(net(i)));
        b.finish().0
    };
    let (desired, kernel) = (bulk(0..1_000_000), bulk(10..1_000_010));
    c.bench_function(
        "resync diff of a 1M-member IPv6 hash:net set against a kernel snapshot",
        |bench| bench.iter(|| black_box(desired.diff_both(&kernel))),
    );
    let hashed = |range: std::ops::Range<u32>| MemberSet::from_members(kind, range.map(net));
    let (desired, kernel) = (hashed(0..1_000_000), hashed(10..1_000_010));
    c.bench_function(
        "diff of two 1M-member IPv6 hash:net hash sets (after changes in place)",
        |bench| bench.iter(|| black_box(desired.diff_both(&kernel))),
    );
}

fn delta(c: &mut Criterion) {
    let kernel = ModelDataplane::new();
    let mut mgr = ipsetmgr_dataplane::adapter::reconciler(kernel, ReconcilerConfig::default());
    let base = addresses(1_000_000);
    let compiled = compile(&[policy(base.clone())], &Naming::default(), None);
    mgr.set_desired(compiled.sets, compiled.held);
    assert!(mgr.apply_updates().applied);
    // Alternate between the base set and one with 10 members swapped, so
    // every iteration sends exactly 10 adds and 10 deletes.
    let mut changed = base;
    for (i, m) in changed.iter_mut().take(10).enumerate() {
        *m = Ipv4Addr::new(192, 0, 2, i as u8).to_string();
    }
    let variants: Vec<_> = [
        compile(&[policy(changed)], &Naming::default(), None),
        compile(&[policy(addresses(1_000_000))], &Naming::default(), None),
    ]
    .into_iter()
    .map(|c| c.sets)
    .collect();
    let mut i = 0;
    c.bench_function(
        "apply_updates of a 10-member change to a 1M set (model kernel)",
        |b| {
            b.iter_batched(
                || {
                    i += 1;
                    variants[i % 2].clone()
                },
                |sets| {
                    mgr.set_desired(sets, Vec::new());
                    assert!(mgr.apply_updates().applied);
                },
                criterion::BatchSize::LargeInput,
            )
        },
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = parse, diff, delta
}
criterion_main!(benches);
