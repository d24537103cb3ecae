//! Times what a running manager does with a big set: create a set of
//! `--members` IPv4 addresses (hash:ip) or, with `--ipv6`, IPv6 /64
//! networks (hash:net), change `--changes` of them, and resync it.
//! `--backend` is `ipsetmgr --backend`'s (ipsets, nft sets or BPF maps). Used by
//! scripts/bench_vs_restore.py and scripts/bench_vs_bpftool.py; prints one
//! line of key=value pairs.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use clap::Parser;
use ipsetmgr_ipset::{Naming, SetType};
use ipsetmgr_node::{BackendList, Opened};
use ipsetmgr_policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec, compile};
use ipsetmgr_sets::ReconcilerConfig;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    netns: String,
    /// Any of `ipsetmgr --backend`'s lists: ipsets, nft sets or both,
    /// driven through the same trait as `run` and the agent drive them.
    #[arg(long, default_value = "netlink")]
    backend: BackendList,
    #[arg(long, default_value_t = 1_000_000)]
    members: u32,
    #[arg(long, default_value_t = 10)]
    changes: u32,
    /// IPv6 /64 networks in a hash:net set instead of IPv4 addresses.
    #[arg(long)]
    ipv6: bool,
    /// The bpffs of `--backend bpf` (`ipsetmgr --bpf-path`).
    #[arg(long, default_value = ipsetmgr_bpf::DEFAULT_MOUNT)]
    bpf_path: std::path::PathBuf,
}

/// Member `i` of the set, and replacement `i` for a change.
fn member(ipv6: bool, i: u32) -> String {
    if ipv6 {
        format!(
            "{}/64",
            Ipv6Addr::from((0x2001_0db8_u128 << 96) + (u128::from(i) << 64))
        )
    } else {
        Ipv4Addr::from(0x0a00_0000 + i).to_string()
    }
}

fn replacement(ipv6: bool, i: u32) -> String {
    if ipv6 {
        format!("2001:db8:ffff:{i:x}::/64")
    } else {
        Ipv4Addr::from(0xc000_0200 + i).to_string()
    }
}

fn policy(members: Vec<String>, max: u32, ipv6: bool) -> IPSetPolicy {
    IPSetPolicy::new(
        "delta-bench",
        IPSetPolicySpec {
            set_type: if ipv6 {
                SetType::HashNet
            } else {
                SetType::HashIp
            },
            family: if ipv6 {
                FamilySpec::IPv6
            } else {
                FamilySpec::IPv4
            },
            members,
            node_selector: None,
            max_elem: Some(max),
            hash_size: None,
            members_from: Vec::new(),
            range: None,
            netmask: None,
            bitmask: None,
            except: Vec::new(),
        },
    )
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ipsetmgr_dataplane::netns::enter(&args.netns)?;
    let opened = Opened::open(
        &args.backend,
        ipsetmgr_nft::backend::default_table(),
        &args.bpf_path,
    )?;
    let mut mgr = opened.into_backend(ReconcilerConfig::default());
    let backend = mgr.name();
    let naming = Naming::default();
    let max = args.members + args.changes + 10;
    let base: Vec<String> = (0..args.members).map(|i| member(args.ipv6, i)).collect();
    let c = compile(&[policy(base.clone(), max, args.ipv6)], &naming, None);
    mgr.set_desired(c.sets, c.held);
    let out = mgr.apply_updates();
    anyhow::ensure!(out.applied, "initial apply failed: {:?}", out.error);

    let mut changed = base;
    for (i, m) in changed.iter_mut().take(args.changes as usize).enumerate() {
        *m = replacement(args.ipv6, i as u32);
    }
    // The in-process part of a change: what `run` and the agent do once the
    // new policy is compiled (the manager's diff and the kernel write).
    let c = compile(&[policy(changed, max, args.ipv6)], &naming, None);
    // The policy's million strings were freed just now; glibc sorts its
    // free lists on the next allocation (about 9 ms here), which belongs to
    // the loader, not to the update: in `run` and the agent the loader
    // frees them on its own side and the kernel side trims the heap.
    ipsetmgr_dataplane::memory::release_free_memory();
    let t = Instant::now();
    mgr.set_desired(c.sets, c.held);
    let diff = t.elapsed();
    let t = Instant::now();
    let out = mgr.apply_updates();
    let apply = t.elapsed();
    anyhow::ensure!(out.applied, "delta apply failed: {:?}", out.error);

    mgr.queue_resync();
    let t = Instant::now();
    let out = mgr.apply_updates();
    anyhow::ensure!(out.applied, "resync failed: {:?}", out.error);
    let resync = t.elapsed();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    // One line of key=value pairs, for scripts/bench_vs_restore.py.
    println!(
        "backend={backend} members={} changes={} diff_ms={:.3} update_ms={:.3} resync_ms={:.1} peak_rss_mb={:.0}",
        args.members,
        args.changes,
        ms(diff),
        ms(apply),
        ms(resync),
        peak_rss_mb()
    );
    // Leave the namespace clean for the next backend's run.
    mgr.set_desired(Vec::new(), Vec::new());
    mgr.apply_updates();
    Ok(())
}
