//! Criterion benchmarks of reading big member lists, as `ipsetmgr apply`
//! and `run` read them: a policy file in YAML (the lifted fast path) and in
//! JSON, and a plain list (one member per line), each then compiled into
//! its kernel set; IPv4 hash:ip and IPv6 hash:net, 100k and 1M members.
//! Texts are in memory, so the figures leave out only the file read.
//! scripts/bench_vs_restore.py measures the same end to end against the
//! kernel and `ipset restore`.

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ipsetmgr::bench_support::{ListFormat, parse_json_policies, parse_member_list, parse_policies};
use ipsetmgr_ipset::Naming;
use ipsetmgr_policy::compile;

struct Case {
    name: &'static str,
    set_type: &'static str,
    family: &'static str,
    members: Vec<String>,
}

fn cases() -> Vec<Case> {
    let v4 = |n: u32| -> Vec<String> {
        (0..n)
            .map(|i| Ipv4Addr::from(0x0a00_0000 + i).to_string())
            .collect()
    };
    let v6 = |n: u128| -> Vec<String> {
        (0..n)
            .map(|i| format!("{}/64", Ipv6Addr::from((0x2001_0db8u128 << 96) + (i << 64))))
            .collect()
    };
    vec![
        Case {
            name: "hash:ip v4 100k",
            set_type: "hash:ip",
            family: "IPv4",
            members: v4(100_000),
        },
        Case {
            name: "hash:ip v4 1M",
            set_type: "hash:ip",
            family: "IPv4",
            members: v4(1_000_000),
        },
        Case {
            name: "hash:net v6 1M",
            set_type: "hash:net",
            family: "IPv6",
            members: v6(1_000_000),
        },
    ]
}

fn head(c: &Case) -> String {
    format!(
        "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: big\nspec:\n  type: {}\n  family: {}\n  maxElem: 2000000\n",
        c.set_type, c.family
    )
}

fn yaml(c: &Case) -> String {
    let mut s = head(c) + "  members:\n";
    for m in &c.members {
        s += "  - ";
        s += m;
        s.push('\n');
    }
    s
}

fn json(c: &Case) -> String {
    serde_json::json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy", "metadata": {"name": "big"},
        "spec": {"type": c.set_type, "family": c.family, "maxElem": 2_000_000, "members": c.members},
    })
    .to_string()
}

fn text(c: &Case) -> String {
    let mut s = String::from("# one member per line\n");
    for m in &c.members {
        s += m;
        s.push('\n');
    }
    s
}

fn load_and_compile(crit: &mut Criterion) {
    let path = Path::new("bench.yaml");
    let naming = Naming::default();
    let mut group = crit.benchmark_group("load and compile");
    group.sample_size(10);
    for case in cases() {
        let y = yaml(&case);
        group.bench_with_input(BenchmarkId::new("yaml", case.name), &y, |b, y| {
            b.iter(|| {
                let loaded = parse_policies(y, path).unwrap();
                let policies: Vec<_> = loaded.policies.into_iter().map(|p| p.policy).collect();
                black_box(compile(&policies, &naming, None))
            })
        });
        let j = json(&case);
        group.bench_with_input(BenchmarkId::new("json", case.name), &j, |b, j| {
            b.iter(|| {
                let loaded = parse_json_policies(j, path).unwrap();
                let policies: Vec<_> = loaded.policies.into_iter().map(|p| p.policy).collect();
                black_box(compile(&policies, &naming, None))
            })
        });
        // The plain list's members join a policy that has none of its own,
        // as `--members` and a `file` source do.
        let t = text(&case);
        let bare = parse_policies(&head(&case), path).unwrap().policies;
        group.bench_with_input(BenchmarkId::new("text", case.name), &t, |b, t| {
            b.iter(|| {
                let listed = parse_member_list(t, ListFormat::Text, path).unwrap();
                let mut policies: Vec<_> = bare.iter().map(|p| p.policy.clone()).collect();
                policies[0].spec.members = listed.into_iter().map(|m| m.text).collect();
                black_box(compile(&policies, &naming, None))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, load_and_compile);
criterion_main!(benches);
