//! The agent's footprint with a million members: one IPSetPolicy whose
//! 1,000,000 members arrive in 100 IPSetMemberSlices, received and decoded
//! the way the agent's watches decode them, kept in the agent's store and
//! compiled by the agent's own compile step. Prints the time and the
//! resident memory; exits 1 if the peak exceeds the budget (64 MiB).
//!
//! As root it then applies the compiled set to the real kernel in a fresh
//! network namespace through the manager and the netlink backend (what the
//! agent does next) and prints that time and peak too; that figure is
//! reported, not judged, as it includes the manager's own bookkeeping.
//!
//! `cargo bench --bench agent_memory` (a plain program, not criterion: a
//! resident-set figure needs one process doing one thing, once).

use std::net::Ipv4Addr;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use ipsetmgr::bench_support::{MemberCache, Store, decode};
use ipsetmgr_dataplane::netlink::NetlinkDataplane;
use ipsetmgr_ipset::Naming;
use ipsetmgr_sets::ReconcilerConfig;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde_json::json;

const MEMBERS: u32 = 1_000_000;
const SLICES: u32 = 100;
const BUDGET_MIB: f64 = 64.0;

/// The process's current and peak resident set, in MiB.
fn rss() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Member `i` of the blocklist: three in four are addresses, the rest /24
/// networks in a range of their own (all distinct, no overlaps).
fn member(i: u32) -> String {
    if i.is_multiple_of(4) {
        let net = Ipv4Addr::from(0x2000_0000 + (i / 4) * 256);
        format!("{net}/24")
    } else {
        Ipv4Addr::from(0x0a00_0000 + i).to_string()
    }
}

/// One object as the API server sends it, as bytes: the agent's watch
/// reads each into a `DynamicObject` and decodes it on its own.
fn wire(value: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&value).expect("serialisable")
}

fn policy_bytes() -> Vec<u8> {
    wire(json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
        "metadata": {"name": "blocklist", "uid": "u-1", "generation": 1, "resourceVersion": "1"},
        "spec": {"type": "hash:net", "family": "IPv4", "maxElem": 2_000_000, "members": []}
    }))
}

fn slice_bytes(index: u32) -> Vec<u8> {
    let per = MEMBERS / SLICES;
    let members: Vec<String> = (index * per..(index + 1) * per).map(member).collect();
    wire(json!({
        "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetMemberSlice",
        "metadata": {"name": format!("blocklist-{index:03}"), "resourceVersion": format!("{}", 10 + index),
                     "labels": {"ipsetmgr.io/policy": "blocklist"}},
        "spec": {"members": members}
    }))
}

fn object(bytes: &[u8]) -> DynamicObject {
    serde_json::from_slice(bytes).expect("a valid object")
}

fn node() -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": "bench-node", "uid": "n-1"}}))
        .expect("a valid Node")
}

fn mib(label: &str, elapsed: Duration) {
    let (now, peak) = rss();
    println!(
        "{label:<44} {:>8.3} s   RSS {now:>6.1} MiB   peak {peak:>6.1} MiB",
        elapsed.as_secs_f64()
    );
}

fn main() -> ExitCode {
    let (start_rss, _) = rss();
    println!(
        "agent: 1 policy, {MEMBERS} members in {SLICES} slices (hash:net, IPv4); start RSS {start_rss:.1} MiB"
    );
    let naming = Naming::default();
    let mut store = Store::new(&[], Default::default());
    let mut cache = MemberCache::default();

    let t = Instant::now();
    store.on_policy(Event::Init);
    store.on_policy(Event::InitApply(decode(object(&policy_bytes()))));
    store.on_policy(Event::InitDone);
    store.policy_store.on_slice(Event::Init);
    for i in 0..SLICES {
        // Each slice's bytes and parsed object live only while it is read,
        // as in the watch.
        let bytes = slice_bytes(i);
        store
            .policy_store
            .on_slice(Event::InitApply(decode(object(&bytes))));
    }
    store.policy_store.on_slice(Event::InitDone);
    store.on_node(Event::Apply(node()));
    mib("receive + decode + store 100 slices", t.elapsed());
    if let Some(what) = store.waiting_for() {
        eprintln!("the store still waits for {what}");
        return ExitCode::FAILURE;
    }

    let t = Instant::now();
    let compiled = store.compile(&naming, &mut cache);
    let compile_time = t.elapsed();
    ipsetmgr_dataplane::memory::release_free_memory();
    mib("compile (parse, validate, one desired set)", compile_time);
    let (_, peak) = rss();

    let total: usize = compiled.sets.iter().map(|s| s.members.len()).sum();
    if !compiled.errors.is_empty() || total != MEMBERS as usize {
        eprintln!(
            "compiled {total} members with {} errors: {:?}",
            compiled.errors.len(),
            compiled.errors.first()
        );
        return ExitCode::FAILURE;
    }
    let within = peak <= BUDGET_MIB;
    println!(
        "peak RSS through compile: {peak:.1} MiB (budget {BUDGET_MIB:.0} MiB): {}",
        if within { "within" } else { "OVER BUDGET" }
    );

    apply_in_netns(compiled.sets);
    if within {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// As root: apply to the real kernel in a throwaway namespace.
fn apply_in_netns(sets: Vec<ipsetmgr_sets::DesiredSet>) {
    if !nix::unistd::geteuid().is_root() {
        println!("kernel apply: skipped (needs root for a network namespace)");
        return;
    }
    let ns = format!("ipsetmgr-bench-{}", std::process::id());
    let result = ipsetmgr_dataplane::netns::run_in(Some(&ns), || {
        let dp = NetlinkDataplane::new().map_err(|e| e.to_string())?;
        let mut mgr = ipsetmgr_dataplane::adapter::reconciler(dp, ReconcilerConfig::default());
        mgr.set_desired(sets, Vec::new());
        let t = Instant::now();
        let outcome = mgr.apply_updates();
        let elapsed = t.elapsed();
        if !outcome.applied {
            return Err(format!("apply failed: {:?}", outcome.error));
        }
        Ok(elapsed)
    });
    match result {
        Ok(Ok(elapsed)) => mib("kernel apply (netlink, fresh netns)", elapsed),
        Ok(Err(e)) => println!("kernel apply: {e}"),
        Err(e) => println!("kernel apply: {e}"),
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
}
