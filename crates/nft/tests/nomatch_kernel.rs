//! nomatch against the kernel (issue 22): for random hash:net member lists
//! with `nomatch` entries and overlapping networks, the nft interval set
//! this crate makes from the members holds exactly the addresses the
//! kernel's ipset matches.
//!
//! Per case, in a fresh network namespace (the test's thread calls
//! `unshare(CLONE_NEWNET)` again for every case, so no case sees another's
//! sets and nothing needs flushing):
//! 1. `ipset create s hash:net` and `ipset -! restore` of `add s MEMBER`
//!    lines, each member as the project writes it (`10.1.0.0/16 nomatch`;
//!    a `/0`, which ipset refuses, as the two `/1` halves the parser makes);
//! 2. the nft set `inet T S` through [`NetlinkNft`], its elements made by
//!    [`SetShape::elements`] from the same members, as the backend does;
//! 3. for every probe (each network's first and last address, the address
//!    below and above each, and random addresses; 64 to about 200) the
//!    kernel answers both: `ipset test s ADDR` and
//!    `nft get element inet T S { ADDR }` must succeed or fail together.
//!
//! Both sides are asked in one process per case, each probe its own
//! command, so the kernel answers every probe: `ipset -` (interactive mode)
//! runs one `test` a line and prints one answer a line, and `nft -i` runs
//! one `get element` a line and goes on after an error. (`ipset restore`
//! stops at the first `test`; an nft `get element` of several elements
//! fails as a whole when any is absent; `nft -f` stops at the first error.)
//!
//! Members are generated as a compiled policy holds them: one network never
//! appears both with and without `nomatch` (compile rejects that, and the
//! two sides would resolve it differently: ipset keeps the flag of the last
//! add, [`ipsetmgr_nft::interval`] makes such a network nomatch).
//!
//! A failure prints the member list, the ranges the crate computed, the
//! disagreeing addresses with both answers (and what the longest-prefix
//! rule says), and the seed (`PROPTEST_RNG_SEED`). Cases: 24 (IPv4) and 8
//! (IPv6) unless `PROPTEST_CASES` says otherwise. Needs root; without it the
//! tests print a skip message, except under `CI=true`, where they fail.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Output, Stdio};

use ipsetmgr_ipset::{Family, HeaderOptions, Member, SetType};
use ipsetmgr_nft::interval::{NetRule, matching_ranges};
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{NftDataplane, NftOp, SetShape, Table, TableFamily};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError, TestRunner};

#[path = "../../../tests/common/kernel_gate.rs"]
mod kernel_gate;
#[path = "../../../tests/common/kernel_props.rs"]
mod kernel_props;

/// One case: members as a policy writes them, and random probes (numbers
/// of the case's family).
#[derive(Clone)]
struct Case {
    family: Family,
    members: Vec<String>,
    random: Vec<u128>,
}

/// As the failure message shows the case: the members as written, the
/// random probes as addresses.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let random: Vec<String> = self
            .random
            .iter()
            .map(|&a| addr_of(self.family, a).to_string())
            .collect();
        write!(
            f,
            "members {:?}, random probes [{}]",
            self.members,
            random.join(", ")
        )
    }
}

fn member_text(family: Family, addr: u128, prefix: u8, nomatch: bool) -> String {
    let flag = if nomatch { " nomatch" } else { "" };
    format!("{}/{prefix}{flag}", addr_of(family, addr))
}

fn addr_of(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn num(a: &IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

fn bits(family: Family) -> u32 {
    u32::from(family.max_prefix())
}

fn host_mask(bits: u32, prefix: u8) -> u128 {
    match bits - u32::from(prefix) {
        128 => u128::MAX,
        h => (1u128 << h) - 1,
    }
}

/// Networks at addresses of a small region (so that they nest and nomatch
/// falls inside nomatch all the time), up to two wider ones there that hold
/// much of the region, up to one anywhere (`/0` among them), and random
/// probes, mostly in the region. Host bits are left set at random: the
/// parser masks them.
fn case(
    family: Family,
    base: u128,
    region_bits: u32,
    region_prefixes: std::ops::RangeInclusive<u8>,
    covering_prefixes: std::ops::RangeInclusive<u8>,
    anywhere_prefixes: std::ops::RangeInclusive<u8>,
) -> impl Strategy<Value = Case> {
    let region = 1u128 << region_bits;
    let all = host_mask(bits(family), 0);
    let anywhere = (0..=all, anywhere_prefixes, any::<bool>());
    (
        prop::collection::vec(
            (0..region, region_prefixes, prop::bool::weighted(0.4)),
            1..24,
        ),
        prop::collection::vec((0..region, covering_prefixes, any::<bool>()), 0..3),
        prop::collection::vec(anywhere, 0..2),
        prop::collection::vec(0..region, 48),
        prop::collection::vec(0..=all, 16),
    )
        .prop_map(move |(small, covering, anywhere, near, far)| {
            let mut members: Vec<String> = small
                .into_iter()
                .chain(covering)
                .map(|(a, p, n)| member_text(family, base + a, p, n))
                .collect();
            members.extend(
                anywhere
                    .into_iter()
                    .map(|(a, p, n)| member_text(family, a, p, n)),
            );
            let random = near.into_iter().map(|a| base + a).chain(far).collect();
            Case {
                family,
                members,
                random,
            }
        })
}

/// The members of a case as the project's parser makes them, without a
/// member whose network an earlier one already has with the other flag.
fn parse_members(c: &Case) -> Vec<Member> {
    let mut flags: HashMap<(u128, u8), bool> = HashMap::new();
    let mut out = Vec::new();
    for text in &c.members {
        let parsed = Member::parse_user(SetType::HashNet, text)
            .unwrap_or_else(|e| panic!("the generator wrote {text:?}: {e}"));
        for m in parsed.members {
            let Member::Net {
                addr,
                prefix,
                nomatch,
            } = m
            else {
                panic!("{text:?} parsed to {m:?}");
            };
            if *flags.entry((num(&addr), prefix)).or_insert(nomatch) == nomatch {
                out.push(m);
            }
        }
    }
    out
}

/// `(start, prefix, nomatch)` of each member.
fn networks(members: &[Member]) -> Vec<(u128, u8, bool)> {
    members
        .iter()
        .map(|m| match m {
            Member::Net {
                addr,
                prefix,
                nomatch,
            } => (num(addr), *prefix, *nomatch),
            _ => unreachable!("hash:net members only"),
        })
        .collect()
}

/// Every network's ends and their neighbours, and the random probes.
fn probes(c: &Case, nets: &[(u128, u8, bool)]) -> Vec<IpAddr> {
    let b = bits(c.family);
    let max = host_mask(b, 0);
    let mut set: BTreeSet<u128> = c.random.iter().copied().collect();
    for &(start, prefix, _) in nets {
        let end = start | host_mask(b, prefix);
        set.extend(
            [
                Some(start),
                Some(end),
                start.checked_sub(1),
                end.checked_add(1),
            ]
            .into_iter()
            .flatten()
            .filter(|&a| a <= max),
        );
    }
    set.into_iter().map(|a| addr_of(c.family, a)).collect()
}

/// ipset's rule, for the failure message: the longest prefix containing
/// `a` decides.
fn longest_prefix_matches(b: u32, nets: &[(u128, u8, bool)], a: u128) -> bool {
    nets.iter()
        .filter(|&&(start, prefix, _)| a & !host_mask(b, prefix) == start)
        .max_by_key(|&&(_, prefix, _)| prefix)
        .is_some_and(|&(_, _, nomatch)| !nomatch)
}

/// Run `program args` with `input` on stdin.
fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<Output, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run {program}: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_string();
    // Written from another thread: the child's output could fill its pipes
    // before it has read all of its input.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for {program}: {e}"))?;
    writer
        .join()
        .expect("writer thread")
        .map_err(|e| format!("write to {program}: {e}"))?;
    Ok(out)
}

fn ok(program: &str, args: &[&str], input: &str) -> Result<(), String> {
    let out = run_with_input(program, args, input)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?} failed: {}\ninput:\n{input}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `ipset test s ADDR` for every probe, in one `ipset -`: one answer line
/// per probe on stderr, `Warning: ADDR is in set s.` or
/// `ADDR is NOT in set s.`, in order.
fn ipset_answers(probes: &[IpAddr]) -> Result<Vec<bool>, String> {
    let input: String = probes.iter().map(|a| format!("test s {a}\n")).collect();
    let out = run_with_input("ipset", &["-"], &input)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bad = |why: String| format!("ipset -: {why}\nstderr:\n{stderr}");
    if !out.status.success() {
        return Err(bad(format!("exit status {}", out.status)));
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    if lines.len() != probes.len() {
        return Err(bad(format!(
            "{} answers for {} probes",
            lines.len(),
            probes.len()
        )));
    }
    probes
        .iter()
        .zip(lines)
        .map(|(probe, line)| {
            let line_ = line.strip_prefix("Warning: ").unwrap_or(line);
            let (addr, found) = match (
                line_.strip_suffix(" is in set s."),
                line_.strip_suffix(" is NOT in set s."),
            ) {
                (Some(a), None) => (a, true),
                (None, Some(a)) => (a, false),
                _ => return Err(bad(format!("not an answer: {line:?}"))),
            };
            if addr.parse::<IpAddr>().ok() != Some(*probe) {
                return Err(bad(format!("answer {line:?} for the probe {probe}")));
            }
            Ok(found)
        })
        .collect()
}

/// The elements of one `nft get element` answer (`elements = { A, B }`,
/// over one or more lines).
fn answer_elements(block: &str) -> Option<Vec<String>> {
    let (_, rest) = block.split_once("elements = {")?;
    let (list, _) = rest.split_once('}')?;
    Some(
        list.split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
    )
}

/// Whether an element as nft prints it (`A`, `A/N`, `A-B`) holds `a`.
fn element_holds(family: Family, element: &str, a: &IpAddr) -> Option<bool> {
    let parse = |s: &str| s.parse::<IpAddr>().ok().filter(|x| Family::of(x) == family);
    let (first, last) = if let Some((x, p)) = element.split_once('/') {
        let x = num(&parse(x)?);
        let p: u8 = p.parse().ok().filter(|&p| p <= family.max_prefix())?;
        (x, x | host_mask(bits(family), p))
    } else if let Some((x, y)) = element.split_once('-') {
        (num(&parse(x)?), num(&parse(y)?))
    } else {
        let x = num(&parse(element)?);
        (x, x)
    };
    Some((first..=last).contains(&num(a)))
}

const NFT_ABSENT: &str = "Error: Could not process rule: No such file or directory";

/// `nft get element inet T S { ADDR }` for every probe, in one `nft -i`.
/// Each absent probe is an error on stderr that quotes its command; each
/// present one is a listing on stdout (in order) of the element holding it,
/// which is checked to hold it.
fn nft_answers(family: Family, probes: &[IpAddr]) -> Result<Vec<bool>, String> {
    let command = |a: &IpAddr| format!("get element inet T S {{ {a} }}");
    let input: String = probes.iter().map(|a| command(a) + "\n").collect();
    let out = run_with_input("nft", &["-i"], &input)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bad = |why: String| format!("nft -i: {why}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    if !out.status.success() {
        return Err(bad(format!("exit status {}", out.status)));
    }
    // stderr: per absent probe, the error, the command, a line of carets.
    let mut absent: BTreeSet<String> = BTreeSet::new();
    let mut lines = stderr.lines().filter(|l| !l.trim().is_empty());
    while let Some(line) = lines.next() {
        if line != NFT_ABSENT {
            return Err(bad(format!("unexpected error line {line:?}")));
        }
        let Some(cmd) = lines.next() else {
            return Err(bad("an error without its command".into()));
        };
        if !absent.insert(cmd.to_string()) {
            return Err(bad(format!("two errors for {cmd:?}")));
        }
        if !lines
            .next()
            .is_some_and(|l| l.trim().chars().all(|c| c == '^'))
        {
            return Err(bad(format!("no carets after {cmd:?}")));
        }
    }
    let answers: Vec<bool> = probes
        .iter()
        .map(|a| !absent.contains(&command(a)))
        .collect();
    let quoted = answers.iter().filter(|found| !**found).count();
    if quoted != absent.len() {
        return Err(bad(format!(
            "errors for commands that were never sent ({} quoted, {quoted} probes)",
            absent.len()
        )));
    }
    // stdout: one `table inet T { ... }` listing per present probe.
    let blocks: Vec<&str> = stdout.split("table inet T {").skip(1).collect();
    let present: Vec<&IpAddr> = probes
        .iter()
        .zip(&answers)
        .filter(|(_, f)| **f)
        .map(|(a, _)| a)
        .collect();
    if blocks.len() != present.len() {
        return Err(bad(format!(
            "{} listings for {} present probes",
            blocks.len(),
            present.len()
        )));
    }
    for (a, block) in present.into_iter().zip(blocks) {
        let elements = answer_elements(block)
            .ok_or_else(|| bad(format!("no elements in the answer for {a}: {block}")))?;
        let holds = elements
            .iter()
            .map(|e| element_holds(family, e, a))
            .collect::<Option<Vec<bool>>>()
            .ok_or_else(|| bad(format!("unreadable elements {elements:?} for {a}")))?;
        if !holds.contains(&true) {
            return Err(bad(format!(
                "the answer for {a} is {elements:?}, which does not hold it"
            )));
        }
    }
    Ok(answers)
}

fn yes(found: bool) -> &'static str {
    if found {
        "in the set"
    } else {
        "not in the set"
    }
}

/// One case in the namespace the thread is in (fresh for each case): the
/// number of probes and how many of them both sides found.
fn check(c: &Case) -> Result<(usize, usize), String> {
    let members = parse_members(c);
    let nets = networks(&members);
    let family_word = match c.family {
        Family::V4 => "inet",
        Family::V6 => "inet6",
    };
    // ipset.
    ok(
        "ipset",
        &["create", "s", "hash:net", "family", family_word],
        "",
    )?;
    let restore: String = members.iter().map(|m| format!("add s {m}\n")).collect();
    ok("ipset", &["-!", "restore"], &restore)?;
    // nft, as the backend makes it.
    let shape = SetShape::new(
        SetType::HashNet,
        Some(c.family),
        &HeaderOptions::default(),
        65536,
    )
    .map_err(|e| format!("shape: {e}"))?;
    let elements = shape
        .elements(&members)
        .map_err(|e| format!("elements: {e}"))?;
    let mut dp = NetlinkNft::new().map_err(|e| format!("netlink socket: {e}"))?;
    dp.apply(
        &Table::new(TableFamily::Inet, "T"),
        &[
            NftOp::EnsureTable,
            NftOp::CreateSet {
                name: "S",
                spec: &shape.spec,
            },
            NftOp::AddElements {
                set: "S",
                elements: &elements,
            },
        ],
        &|n| n == "S",
    )
    .map_err(|e| format!("nft apply: {e}"))?;
    // Both kernels answer every probe.
    let probes = probes(c, &nets);
    let from_ipset = ipset_answers(&probes)?;
    let from_nft = nft_answers(c.family, &probes)?;
    let b = bits(c.family);
    let differ: Vec<String> = probes
        .iter()
        .zip(from_ipset.iter().zip(&from_nft))
        .filter(|(_, (i, n))| i != n)
        .map(|(a, (&i, &n))| {
            let rule = longest_prefix_matches(b, &nets, num(a));
            format!(
                "  {a}: `ipset test s {a}` says {}, `nft get element inet T S {{ {a} }}` says {} (the longest-prefix rule: {})",
                yes(i),
                yes(n),
                yes(rule)
            )
        })
        .collect();
    if differ.is_empty() {
        let found = from_ipset.iter().filter(|f| **f).count();
        return Ok((probes.len(), found));
    }
    let rules: Vec<NetRule<'_>> = nets
        .iter()
        .map(|&(start, prefix, nomatch)| NetRule {
            addr: addr_of(c.family, start),
            prefix,
            nomatch,
            comment: None,
        })
        .collect();
    let ranges = matching_ranges(c.family, &rules)
        .map(|r| {
            r.iter()
                .map(|r| format!("  {}-{}", r.first, r.last))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|e| format!("  (matching_ranges: {e})"));
    let listed: Vec<String> = members.iter().map(|m| format!("  add s {m}")).collect();
    let sent: Vec<String> = elements.iter().map(|e| format!("  {e}")).collect();
    // The first few: one wrong range is often many probes.
    const SHOWN: usize = 16;
    let more = differ.len().saturating_sub(SHOWN);
    let mut shown = differ[..differ.len().min(SHOWN)].join("\n");
    if more > 0 {
        shown += &format!("\n  ... and {more} more");
    }
    Err(format!(
        "ipset and nft disagree on {} of {} probes:\n{}\nmembers (ipset -! restore):\n{}\nmatching_ranges:\n{}\nnft elements sent:\n{}",
        differ.len(),
        probes.len(),
        shown,
        listed.join("\n"),
        ranges,
        sent.join("\n"),
    ))
}

/// Run `cases` cases of `strategy` on a thread of its own, each in a fresh
/// network namespace.
fn run(test: &'static str, cases: u32, strategy: impl Strategy<Value = Case> + Send + 'static) {
    let handle = std::thread::spawn(move || {
        if !kernel_gate::enter_fresh_netns(test) {
            return;
        }
        let mut config = kernel_props::config(cases);
        // Each shrinking step is a kernel case too (tens of milliseconds):
        // a failure is reported within seconds, its input mostly shrunk.
        config.max_shrink_iters = 256;
        let seed = config.rng_seed;
        let started = std::time::Instant::now();
        let mut runner = TestRunner::new(config);
        // Probes asked and found, over the cases (shrinking steps too).
        let counts = std::cell::Cell::new((0usize, 0usize, 0usize));
        let result = runner.run(&strategy, |c| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| TestCaseError::fail(format!("unshare: {e}")))?;
            let (asked, found) = check(&c).map_err(TestCaseError::fail)?;
            let (n, a, f) = counts.get();
            counts.set((n + 1, a + asked, f + found));
            Ok(())
        });
        match result {
            Ok(()) => {
                let (n, asked, found) = counts.get();
                eprintln!(
                    "{test}: {n} cases, {asked} probes ({found} in both sets, the rest in neither) in {:?}",
                    started.elapsed()
                );
            }
            Err(TestError::Fail(why, minimal)) => panic!(
                "{test}: {why}\nminimal failing input: {minimal:?}\n(rerun with PROPTEST_RNG_SEED={seed})"
            ),
            Err(e) => panic!("{test}: {e}"),
        }
    });
    if let Err(p) = handle.join() {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn ipv4_nomatch_matches_ipset_in_the_kernel() {
    // /18 to /32 networks at addresses of 10.0.0.0/20, up to two /4 to /19
    // ones there too, up to one /0 to /8 anywhere.
    run(
        "ipv4_nomatch_matches_ipset_in_the_kernel",
        24,
        case(Family::V4, 0x0a00_0000, 12, 18..=32, 4..=19, 0..=8),
    );
}

#[test]
fn ipv6_nomatch_matches_ipset_in_the_kernel() {
    // /100 to /128 networks at addresses of 2001:db8::/112, up to two /16
    // to /111 ones there too, up to one /0 to /16 anywhere.
    run(
        "ipv6_nomatch_matches_ipset_in_the_kernel",
        8,
        case(
            Family::V6,
            0x2001_0db8 << 96,
            16,
            100..=128,
            16..=111,
            0..=16,
        ),
    );
}
