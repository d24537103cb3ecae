//! What the kernel-oracle property tests share (`nomatch_kernel.rs`,
//! `iface_kernel.rs`, `hash_ip_kernel.rs`): loading one member list into
//! both kernels, address arithmetic, asking `ipset -` and `nft -i` one
//! command per probe and reading their answers, the third kernel (a BPF
//! map written by the bpf backend, [`bpf_answers`]), and the runner that
//! gives every case a fresh network namespace. A probe type says how each
//! tool spells it ([`Probe`]).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Output, Stdio};

use ipsetmgr_ipset::{Family, HeaderOptions, Member, SetType};
use ipsetmgr_nft::netlink::NetlinkNft;
use ipsetmgr_nft::{Elements, NftDataplane, NftOp, SetShape, Table, TableFamily};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError, TestRunner};

#[path = "../../../../tests/common/kernel_gate.rs"]
mod kernel_gate;
#[path = "../../../../tests/common/kernel_props.rs"]
mod kernel_props;

/// One question to both kernels, as each tool spells it.
pub trait Probe {
    /// What `ipset test s` takes (`ADDR`, `ADDR,IFACE`).
    fn ipset_text(&self) -> String;
    /// Whether `answer`, the probe as ipset prints it back, is this one.
    fn is_named_by(&self, answer: &str) -> bool;
    /// The key of `nft get element` (`ADDR`, `ADDR . "IFACE"`).
    fn nft_key(&self) -> String;
    /// Whether an element as nft prints it holds this probe (`None`: not
    /// an element this test can read).
    fn held_by(&self, family: Family, element: &str) -> Option<bool>;
}

/// A plain address (hash:net).
impl Probe for IpAddr {
    fn ipset_text(&self) -> String {
        self.to_string()
    }
    fn is_named_by(&self, answer: &str) -> bool {
        answer.parse::<IpAddr>().ok() == Some(*self)
    }
    fn nft_key(&self) -> String {
        self.to_string()
    }
    fn held_by(&self, family: Family, element: &str) -> Option<bool> {
        let (first, last) = element_range(family, element)?;
        Some((first..=last).contains(&num(self)))
    }
}

/// The ipset `s` and the nft set `inet T S`, as the backend makes it, of
/// type `t` holding `members`: the elements sent to nft.
pub fn load_both(t: SetType, family: Family, members: &[Member]) -> Result<Elements, String> {
    let family_word = match family {
        Family::V4 => "inet",
        Family::V6 => "inet6",
    };
    ok(
        "ipset",
        &["create", "s", t.as_str(), "family", family_word],
        "",
    )?;
    let restore: String = members.iter().map(|m| format!("add s {m}\n")).collect();
    ok("ipset", &["-!", "restore"], &restore)?;
    let shape = SetShape::new(t, Some(family), &HeaderOptions::default(), 65536)
        .map_err(|e| format!("shape: {e}"))?;
    let elements = shape
        .elements(members)
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
    Ok(elements)
}

/// The addresses of an element's address part as nft prints it (`A`,
/// `A/N`, `A-B`).
pub fn element_range(family: Family, element: &str) -> Option<(u128, u128)> {
    let parse = |s: &str| s.parse::<IpAddr>().ok().filter(|x| Family::of(x) == family);
    Some(if let Some((x, p)) = element.split_once('/') {
        let x = num(&parse(x)?);
        let p: u8 = p.parse().ok().filter(|&p| p <= family.max_prefix())?;
        (x, x | host_mask(bits(family), p))
    } else if let Some((x, y)) = element.split_once('-') {
        (num(&parse(x)?), num(&parse(y)?))
    } else {
        let x = num(&parse(element)?);
        (x, x)
    })
}

pub fn addr_of(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

pub fn num(a: &IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

pub fn bits(family: Family) -> u32 {
    u32::from(family.max_prefix())
}

pub fn host_mask(bits: u32, prefix: u8) -> u128 {
    match bits - u32::from(prefix) {
        128 => u128::MAX,
        h => (1u128 << h) - 1,
    }
}

/// Run `program args` with `input` on stdin.
pub fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<Output, String> {
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

pub fn ok(program: &str, args: &[&str], input: &str) -> Result<(), String> {
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

/// `ipset test s PROBE` for every probe, in one `ipset -`: one answer line
/// per probe on stderr, `Warning: PROBE is in set s.` or
/// `PROBE is NOT in set s.`, in order.
pub fn ipset_answers<P: Probe>(probes: &[P]) -> Result<Vec<bool>, String> {
    let input: String = probes
        .iter()
        .map(|p| format!("test s {}\n", p.ipset_text()))
        .collect();
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
            let (named, found) = match (
                line_.strip_suffix(" is in set s."),
                line_.strip_suffix(" is NOT in set s."),
            ) {
                (Some(a), None) => (a, true),
                (None, Some(a)) => (a, false),
                _ => return Err(bad(format!("not an answer: {line:?}"))),
            };
            if !probe.is_named_by(named) {
                return Err(bad(format!(
                    "answer {line:?} for the probe {}",
                    probe.ipset_text()
                )));
            }
            Ok(found)
        })
        .collect()
}

/// The elements of one `nft get element` answer (`elements = { A, B }`,
/// over one or more lines).
pub fn answer_elements(block: &str) -> Option<Vec<String>> {
    let (_, rest) = block.split_once("elements = {")?;
    let (list, _) = rest.split_once('}')?;
    Some(
        list.split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
    )
}

pub const NFT_ABSENT: &str = "Error: Could not process rule: No such file or directory";

/// `nft get element inet T S { KEY }` for every probe, in one `nft -i`.
/// Each absent probe is an error on stderr that quotes its command; each
/// present one is a listing on stdout (in order) of the element holding it,
/// which is checked to hold it.
pub fn nft_answers<P: Probe>(family: Family, probes: &[P]) -> Result<Vec<bool>, String> {
    let command = |p: &P| format!("get element inet T S {{ {} }}", p.nft_key());
    let input: String = probes.iter().map(|p| command(p) + "\n").collect();
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
        .map(|p| !absent.contains(&command(p)))
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
    let present: Vec<&P> = probes
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
    for (p, block) in present.into_iter().zip(blocks) {
        let a = p.nft_key();
        let elements = answer_elements(block)
            .ok_or_else(|| bad(format!("no elements in the answer for {a}: {block}")))?;
        let holds = elements
            .iter()
            .map(|e| p.held_by(family, e))
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

/// The BPF oracle's bpffs: on the calling thread's first call, a fresh mount
/// namespace whose `/sys/fs/bpf` is a bpffs of its own (a tmpfs first hides
/// the host's, then `Bpffs::open` mounts one), so no case sees the host's
/// pins; kept for the thread's later cases.
#[allow(dead_code)] // iface_kernel.rs asks no BPF map
fn private_bpffs() -> Result<ipsetmgr_bpf::Bpffs, String> {
    use nix::mount::{MsFlags, mount};
    thread_local! {
        static FS: std::cell::OnceCell<ipsetmgr_bpf::Bpffs> = const { std::cell::OnceCell::new() };
    }
    if let Some(fs) = FS.with(|f| f.get().cloned()) {
        return Ok(fs);
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    let none = None::<&str>;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| format!("making / private: {e}"))?;
    mount(
        Some("tmpfs"),
        ipsetmgr_bpf::DEFAULT_MOUNT,
        Some("tmpfs"),
        MsFlags::empty(),
        none,
    )
    .map_err(|e| format!("hiding the host's bpffs: {e}"))?;
    let fs = ipsetmgr_bpf::Bpffs::open(std::path::Path::new(ipsetmgr_bpf::DEFAULT_MOUNT))
        .map_err(|e| format!("bpffs: {e}"))?;
    FS.with(|f| f.set(fs.clone()).ok());
    Ok(fs)
}

/// The third kernel: `members` written by the bpf backend (its reconciler
/// and adapter, as `--backend bpf` writes them: set `ipm4-p` or `ipm6-p`
/// of type `t`), then each probe looked up in the map the kernel's way (a
/// full-length key, longest prefix wins, value 0 is `nomatch`): whether
/// the set holds it.
#[allow(dead_code)] // iface_kernel.rs asks no BPF map
pub fn bpf_answers(
    t: SetType,
    family: Family,
    members: &[Member],
    probes: &[IpAddr],
) -> Result<Vec<bool>, String> {
    use ipsetmgr_ipset::{MemberSet, Naming, SetHeader, SetKind};
    use ipsetmgr_sets::{DesiredSet, ReconcilerConfig};
    let fs = private_bpffs()?;
    // The previous case's set (the mount namespace is the thread's).
    for name in fs.list("ipm").map_err(|e| e.to_string())? {
        fs.delete(&name).map_err(|e| e.to_string())?;
    }
    let kind = SetKind {
        set_type: t,
        family: Some(family),
    };
    let name = Naming::default().main_set_name("p", Some(family));
    let desired = DesiredSet {
        name: name.clone(),
        policy: "p".into(),
        header: SetHeader {
            kind,
            max_elem: 65536,
            hash_size: None,
            options: HeaderOptions::default(),
        },
        members: std::sync::Arc::new(MemberSet::from_members(kind, members.iter().cloned())),
    };
    let mut r = ipsetmgr_bpf::backend::reconciler(fs.clone(), ReconcilerConfig::default());
    r.set_desired(vec![desired], Vec::<String>::new());
    let out = r.apply_updates();
    if !out.applied || r.report().iter().any(|s| !s.synced) {
        return Err(format!("bpf backend: {out:?} {:?}", r.report()));
    }
    let set = fs.open_set(&name).map_err(|e| e.to_string())?;
    probes
        .iter()
        .map(|a| {
            set.lookup(*a)
                .map(|v| v == Some(true))
                .map_err(|e| format!("bpf lookup {a}: {e}"))
        })
        .collect()
}

pub fn yes(found: bool) -> &'static str {
    if found {
        "in the set"
    } else {
        "not in the set"
    }
}

/// Run `cases` cases of `strategy` on a thread of its own, each in a fresh
/// network namespace.
pub fn run<C: std::fmt::Debug + Clone + 'static>(
    test: &'static str,
    cases: u32,
    strategy: impl Strategy<Value = C> + Send + 'static,
    check: fn(&C) -> Result<(usize, usize), String>,
) {
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
