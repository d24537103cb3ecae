//! End-to-end tests of the `ipsetmgr` binary in file mode, against the real
//! kernel. Each test creates its own named network namespace (the binary's
//! `--netns` enters it) and removes it afterwards. Without root they skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use ipsetmgr_ipset::{Naming, SetType};
use ipsetmgr_policy::{compile, load_policies};
use nix::sys::signal::Signal;

const BIN: &str = env!("CARGO_BIN_EXE_ipsetmgr");

#[path = "common/kernel_gate.rs"]
mod kernel_gate;
#[path = "common/loopback.rs"]
mod loopback;

/// Send `sig` to the process `pid`.
fn signal(pid: u32, sig: Signal) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, sig).unwrap_or_else(|e| panic!("kill {pid} {sig:?}: {e}"));
}

/// A throwaway named network namespace, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    /// `None` (with a message) when the test cannot run here.
    fn new(tag: &str) -> Option<Netns> {
        if !nix::unistd::geteuid().is_root() {
            kernel_gate::cannot_run(tag, "");
            return None;
        }
        let name = format!("ipsetmgr-t-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            kernel_gate::cannot_run(
                tag,
                " (`ip netns add` failed: no iproute2 or no netns support)",
            );
            return None;
        }
        Some(Netns { name })
    }

    /// The binary, in this namespace, with this backend.
    fn command(&self, backend: &str) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(["--netns", &self.name, "--backend", backend]);
        cmd
    }

    /// `ipsetmgr run --policy-dir DIR` in the background (netlink backend).
    fn spawn_run(&self, dir: &Path) -> Running {
        let child = self
            .command("netlink")
            .args(["run", "--policy-dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ipsetmgr run");
        Running(Some(child))
    }

    fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("ip netns exec")
    }

    fn sh(&self, args: &[&str]) {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ipset save` of one set: (create line, sorted add lines' members).
    fn saved(&self, set: &str) -> Option<(String, Vec<String>)> {
        let out = self.exec(&["ipset", "save", set]);
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8(out.stdout).unwrap();
        let mut create = String::new();
        let mut members = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("create ") {
                create = rest.to_string();
            } else if let Some(rest) = line.strip_prefix(&format!("add {set} ")) {
                members.push(rest.to_string());
            }
        }
        members.sort();
        Some((create, members))
    }

    fn set_names(&self) -> Vec<String> {
        let out = self.exec(&["ipset", "list", "-n"]);
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    }

    fn ipsetmgr(&self, backend: &str, args: &[&str]) -> (bool, String) {
        self.ipsetmgr_with_path(backend, args, None)
    }

    /// Run the binary with its own PATH (`Some`) to hide tools from it.
    fn ipsetmgr_with_path(
        &self,
        backend: &str,
        args: &[&str],
        path: Option<&str>,
    ) -> (bool, String) {
        let mut cmd = self.command(backend);
        cmd.args(args);
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        let out = cmd.output().expect("run ipsetmgr");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn backends() -> Vec<&'static str> {
    vec!["cli", "netlink"]
}

fn samples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples")
}

fn write_policy(dir: &Path, file: &str, yaml: &str) {
    std::fs::write(dir.join(file), yaml).unwrap();
}

fn policy_yaml(name: &str, set_type: &str, members: &[&str]) -> String {
    let list: Vec<String> = members.iter().map(|m| format!("{m:?}")).collect();
    format!(
        "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: {name}\nspec:\n  type: \"{set_type}\"\n  members: [{}]\n",
        list.join(", ")
    )
}

/// The row of the result table for a set: its PROBLEMS and RESULT cells.
fn row<'a>(output: &'a str, set: &str) -> Option<Vec<&'a str>> {
    output
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.get(1) == Some(&set))
}

#[test]
fn samples_apply_exactly_and_idempotently() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("samples-{backend}")) else {
            return;
        };
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", samples().to_str().unwrap()]);
        // The hash:mac and hash:ip,mark samples fail on kernels without
        // those types; everything else applies.
        let unsupported: Vec<SetType> = [SetType::HashMac, SetType::HashIpMark]
            .into_iter()
            .filter(|t| out.contains(&format!("set type {t} is not supported by this kernel")))
            .collect();
        assert!(ok || !unsupported.is_empty(), "{backend}: {out}");
        // Logged warnings (the isolated sets) carry no colour codes when
        // stderr is not a terminal.
        assert!(
            out.contains("WARN") || unsupported.is_empty(),
            "a warning was logged: {out}"
        );
        assert!(!out.contains('\u{1b}'), "{backend}: ANSI codes in {out:?}");

        let policies: Vec<_> = load_policies(&samples())
            .unwrap()
            .into_iter()
            .map(|l| l.policy)
            .collect();
        let compiled = compile(&policies, &Naming::default(), None);
        assert!(
            compiled.errors.is_empty(),
            "samples are valid: {:?}",
            compiled.errors
        );
        for set in &compiled.sets {
            if unsupported.contains(&set.header.kind.set_type) {
                assert!(ns.saved(&set.name).is_none());
                continue;
            }
            let (create, members) = ns
                .saved(&set.name)
                .unwrap_or_else(|| panic!("{backend}: {} missing\n{out}", set.name));
            assert!(
                create.contains(set.header.kind.set_type.as_str()),
                "{create}"
            );
            if let Some(f) = set
                .header
                .kind
                .family
                // Bitmaps print their range instead of a family.
                .filter(|_| set.header.options.range.is_none())
                .filter(|_| set.header.kind.set_type.has_family())
            {
                assert!(
                    create.contains(&format!("family {}", f.ipset_name())),
                    "{create}"
                );
            }
            let mut want = set.members.sorted_strings();
            want.sort();
            assert_eq!(members, want, "{backend}: {}", set.name);
        }

        let (_, again) = ns.ipsetmgr(backend, &["apply", "-f", samples().to_str().unwrap()]);
        if unsupported.is_empty() {
            assert!(again.contains("Nothing to change"), "{backend}: {again}");
        }
        for set in compiled
            .sets
            .iter()
            .filter(|s| !unsupported.contains(&s.header.kind.set_type))
        {
            let cells = row(&again, &set.name).unwrap_or_else(|| panic!("{again}"));
            assert_eq!(cells[5], "unchanged", "{backend}: {again}");
        }
    }
}

#[test]
fn owned_sets_with_options_never_set_are_replaced() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("opts-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "p.yaml",
            &policy_yaml("pre", "hash:ip", &["10.0.0.1"]),
        );
        let path = dir.path().to_str().unwrap();
        // Each option makes the set match more than the declared address
        // (a whole /24), or hold other things: all must be repaired.
        for options in [
            &["netmask", "24"][..],
            &["bitmask", "255.255.255.0"],
            &["timeout", "0"],
            &["counters"],
        ] {
            let _ = ns.exec(&["ipset", "destroy", "ipm4-pre"]);
            let mut create = vec!["ipset", "create", "ipm4-pre", "hash:ip"];
            create.extend(options);
            ns.sh(&create);
            ns.sh(&["ipset", "add", "ipm4-pre", "10.0.0.1"]);
            let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
            assert!(ok, "{backend} {options:?}: {out}");
            assert_eq!(
                row(&out, "ipm4-pre").unwrap()[5],
                "replaced",
                "{backend} {options:?}: {out}"
            );
            let (header, members) = ns.saved("ipm4-pre").unwrap();
            assert!(
                !header.contains(options[0]),
                "{backend}: {header} still has {options:?}"
            );
            assert_eq!(members, ["10.0.0.1"]);
            // Repaired for good: the next run changes nothing.
            let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
            assert!(ok && out.contains("Nothing to change"), "{backend}: {out}");
        }
    }
}

/// `spec.except` in a policy file: the kernel set holds the members cut
/// around the except ranges, and the output says how many members were
/// dropped or cut (docs/member-sources.md, "Except").
#[test]
fn except_ranges_are_cut_out_and_counted() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("except-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let yaml = policy_yaml(
            "blocklist",
            "hash:net",
            &[
                "10.0.0.0/8",
                "10.1.2.0/24",
                "192.168.0.0/16",
                "198.51.100.0/24",
            ],
        ) + "  except: [\"10.1.0.0/16\", \"192.168.0.0/16\"]\n";
        write_policy(dir.path(), "p.yaml", &yaml);
        let path = dir.path().to_str().unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
        assert!(ok, "{backend}: {out}");
        assert!(
            out.contains("policy \"blocklist\": 3 members dropped or cut by spec.except"),
            "{backend}: {out}"
        );
        let (_, members) = ns.saved("ipm4-blocklist").unwrap();
        assert_eq!(
            members,
            ["10.0.0.0/8", "10.1.0.0/16 nomatch", "198.51.100.0/24"],
            "{backend}"
        );
        for (addr, listed) in [
            ("10.9.9.9", true),
            ("10.1.2.3", false),
            ("192.168.1.1", false),
        ] {
            let test = ns.exec(&["ipset", "test", "ipm4-blocklist", addr]);
            assert_eq!(test.status.success(), listed, "{backend}: {addr}");
        }
    }
}

/// Run the binary with a deadline: a hang is a failure, not a stuck suite.
fn ipsetmgr_within(ns: &Netns, secs: u64, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Running(Some(
        ns.command("netlink")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.still_running() {
        assert!(Instant::now() < deadline, "ipsetmgr {args:?} hung");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.output();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn hostile_policy_directories_fail_clearly_and_never_prune() {
    let Some(ns) = Netns::new("hostile") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_policy(
        d,
        "good.yaml",
        &policy_yaml("good", "hash:ip", &["10.0.0.1"]),
    );
    write_policy(
        d,
        "keep.yaml",
        &policy_yaml("keep", "hash:ip", &["10.0.0.2"]),
    );
    let path = d.to_str().unwrap();
    let (code, out) = ipsetmgr_within(&ns, 20, &["apply", "-f", path, "--prune"]);
    assert_eq!(code, Some(0), "{out}");

    // Every hostile entry at once; `keep.yaml` is emptied (the first step of
    // a non-atomic rewrite), which must never delete its set.
    std::fs::write(d.join("keep.yaml"), "").unwrap();
    nix::unistd::mkfifo(&d.join("pipe.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("zero.yaml")).unwrap();
    std::os::unix::fs::symlink(".", d.join("loop1")).unwrap();
    std::os::unix::fs::symlink(".", d.join("loop2")).unwrap();
    let long = format!(
        "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {{name: {}}}\nspec: {{type: hash:ip}}\n",
        "n".repeat(70_000)
    );
    std::fs::write(d.join("long.yaml"), long).unwrap();
    write_policy(
        d,
        "good.yaml",
        &policy_yaml("good", "hash:ip", &["10.0.0.1", "10.0.0.3"]),
    );
    let (code, out) = ipsetmgr_within(&ns, 20, &["apply", "-f", path, "--prune"]);
    assert_eq!(code, Some(1), "an error, not a panic (101): {out}");
    for needle in [
        "pipe.yaml: not a regular file (a FIFO)",
        "zero.yaml: not a regular file (a character device)",
        "keep.yaml: contains no policies",
        "is 70000 bytes long; at most 253",
        "not pruning because some policy files could not be loaded",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert!(
        !out.contains("defined more than once"),
        "loops load once: {out}"
    );
    assert_eq!(ns.set_names(), ["ipm4-good", "ipm4-keep"], "nothing pruned");
    assert_eq!(
        ns.saved("ipm4-good").unwrap().1,
        ["10.0.0.1", "10.0.0.3"],
        "the good policy still applies"
    );
    assert_eq!(ns.saved("ipm4-keep").unwrap().1, ["10.0.0.2"], "held");
}

#[test]
fn drift_is_repaired_and_counted() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("drift-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "p.yaml",
            &policy_yaml("drift", "hash:ip", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        );
        let path = dir.path().to_str().unwrap();
        let apply = || ns.ipsetmgr(backend, &["apply", "-f", path]);
        let (ok, out) = apply();
        assert!(ok, "{out}");
        let want = vec!["10.0.0.1".to_string(), "10.0.0.2".into(), "10.0.0.3".into()];

        // Two members added and one removed out of band: 3 problems.
        ns.sh(&["ipset", "add", "ipm4-drift", "192.0.2.1"]);
        ns.sh(&["ipset", "add", "ipm4-drift", "192.0.2.2"]);
        ns.sh(&["ipset", "del", "ipm4-drift", "10.0.0.1"]);
        let (ok, out) = apply();
        assert!(ok, "{out}");
        assert_eq!(row(&out, "ipm4-drift").unwrap()[4], "3", "{out}");
        assert_eq!(ns.saved("ipm4-drift").unwrap().1, want);

        // Flushed: 3 problems.
        ns.sh(&["ipset", "flush", "ipm4-drift"]);
        let (ok, out) = apply();
        assert!(ok, "{out}");
        assert_eq!(row(&out, "ipm4-drift").unwrap()[4], "3", "{out}");
        assert_eq!(ns.saved("ipm4-drift").unwrap().1, want);

        // Recreated with another type: 1 problem, replaced.
        ns.sh(&["ipset", "destroy", "ipm4-drift"]);
        ns.sh(&["ipset", "create", "ipm4-drift", "hash:net"]);
        let (ok, out) = apply();
        assert!(ok, "{out}");
        assert_eq!(row(&out, "ipm4-drift").unwrap()[4], "1", "{out}");
        let (create, members) = ns.saved("ipm4-drift").unwrap();
        assert!(create.contains("hash:ip "), "{create}");
        assert_eq!(members, want);

        // Recreated with another maxelem: 1 problem, swapped in atomically.
        ns.sh(&["ipset", "destroy", "ipm4-drift"]);
        ns.sh(&[
            "ipset",
            "create",
            "ipm4-drift",
            "hash:ip",
            "maxelem",
            "1024",
        ]);
        ns.sh(&["ipset", "add", "ipm4-drift", "10.0.0.1"]);
        let (ok, out) = apply();
        assert!(ok, "{out}");
        assert_eq!(row(&out, "ipm4-drift").unwrap()[4], "1", "{out}");
        let (create, members) = ns.saved("ipm4-drift").unwrap();
        assert!(create.contains("maxelem 65536"), "{create}");
        assert_eq!(members, want);
        assert_eq!(ns.set_names(), ["ipm4-drift"], "no temp set left");

        // Destroyed: recreated (a fresh process has no memory of it: 0 problems, "created").
        ns.sh(&["ipset", "destroy", "ipm4-drift"]);
        let (ok, out) = apply();
        assert!(ok, "{out}");
        assert_eq!(row(&out, "ipm4-drift").unwrap()[5], "created", "{out}");
        assert_eq!(ns.saved("ipm4-drift").unwrap().1, want);
    }
}

#[test]
fn foreign_sets_survive_prune_and_temp_leftovers_go() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("prune-{backend}")) else {
            return;
        };
        ns.sh(&["ipset", "create", "KUBE-TEST", "hash:ip"]);
        ns.sh(&["ipset", "add", "KUBE-TEST", "10.9.9.9"]);
        ns.sh(&["ipset", "create", "ipmt-1234", "hash:ip"]);
        ns.sh(&["ipset", "create", "ipm4-unwanted", "hash:ip"]);
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "p.yaml",
            &policy_yaml("keep", "hash:ip", &["10.0.0.1"]),
        );
        let path = dir.path().to_str().unwrap();

        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
        assert!(ok, "{out}");
        assert!(out.contains("removed leftover temp set ipmt-1234"), "{out}");
        assert!(out.contains("kept ipm4-unwanted"), "{out}");
        assert_eq!(ns.set_names(), ["KUBE-TEST", "ipm4-keep", "ipm4-unwanted"]);

        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path, "--prune"]);
        assert!(ok, "{out}");
        assert!(out.contains("deleted ipm4-unwanted"), "{out}");
        assert_eq!(ns.set_names(), ["KUBE-TEST", "ipm4-keep"]);
        assert_eq!(ns.saved("KUBE-TEST").unwrap().1, ["10.9.9.9"]);
    }
}

#[test]
fn unsupported_type_fails_alone() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("mac-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "a.yaml",
            &policy_yaml("macs", "hash:mac", &["aa:bb:cc:dd:ee:ff"]),
        );
        write_policy(
            dir.path(),
            "b.yaml",
            &policy_yaml("ips", "hash:ip", &["10.0.0.1"]),
        );
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", dir.path().to_str().unwrap()]);
        let mac_supported = ns.set_names().contains(&"ipmx-macs".to_string());
        if mac_supported {
            eprintln!("this kernel has hash:mac; the unsupported-type case cannot be shown here");
            assert!(ok, "{out}");
            continue;
        }
        assert!(!ok, "{out}");
        let cells = row(&out, "ipmx-macs").unwrap_or_else(|| panic!("{out}"));
        assert_eq!(cells[5], "FAILED:", "{out}");
        assert!(
            out.contains("set type hash:mac is not supported by this kernel"),
            "{out}"
        );
        assert_eq!(ns.saved("ipm4-ips").unwrap().1, ["10.0.0.1"]);
    }
}

#[test]
fn deleting_a_referenced_set_is_reported_and_retried() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("inuse-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "a.yaml",
            &policy_yaml("a", "hash:ip", &["10.0.0.1"]),
        );
        write_policy(
            dir.path(),
            "b.yaml",
            &policy_yaml("b", "hash:ip", &["10.0.0.2"]),
        );
        let path = dir.path().to_str().unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
        assert!(ok, "{out}");

        // A list:set outside the project and an iptables rule hold references.
        ns.sh(&["ipset", "create", "USER-LIST", "list:set"]);
        ns.sh(&["ipset", "add", "USER-LIST", "ipm4-a"]);
        let have_iptables = ns
            .exec(&[
                "iptables",
                "-A",
                "INPUT",
                "-m",
                "set",
                "--match-set",
                "ipm4-b",
                "src",
                "-j",
                "DROP",
            ])
            .status
            .success();
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        write_policy(dir.path(), "c.yaml", &policy_yaml("c", "hash:ip", &[]));

        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path, "--prune"]);
        // Everything else applies, but a prune that could not finish is
        // not reported as success, nor as "nothing to change".
        assert!(!ok, "a prune left undone fails the run: {out}");
        assert!(out.contains("1 of 1 sets in sync"), "ipm4-c applied: {out}");
        assert!(!out.contains("Nothing to change"), "{out}");
        assert!(
            out.contains("could not delete ipm4-a") && out.contains("in use"),
            "{out}"
        );
        assert!(
            out.contains("left in place because they could not be deleted"),
            "{out}"
        );
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path, "--prune"]);
        assert!(!ok && !out.contains("Nothing to change"), "again: {out}");
        if have_iptables {
            assert!(out.contains("could not delete ipm4-b"), "{out}");
        } else {
            eprintln!("iptables not available: only the list:set reference is checked");
        }
        assert!(ns.set_names().contains(&"ipm4-a".to_string()));

        // References gone: the next run deletes them.
        ns.sh(&["ipset", "destroy", "USER-LIST"]);
        if have_iptables {
            ns.sh(&["iptables", "-F", "INPUT"]);
        }
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path, "--prune"]);
        assert!(ok, "{out}");
        assert!(out.contains("deleted ipm4-a"), "{out}");
        assert_eq!(ns.set_names(), ["ipm4-c"]);
    }
}

#[test]
fn a_type_change_of_a_set_in_our_own_list_set_goes_through() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("relink-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        write_policy(dir.path(), "l.yaml", &policy_yaml("l", "list:set", &["a"]));
        write_policy(
            dir.path(),
            "a.yaml",
            &policy_yaml("a", "hash:ip", &["10.0.0.1"]),
        );
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
        assert!(ok, "{out}");
        write_policy(
            dir.path(),
            "a.yaml",
            &policy_yaml("a", "hash:net", &["10.0.0.0/8"]),
        );
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
        assert!(ok, "{backend}: {out}");
        assert_eq!(row(&out, "ipm4-a").unwrap()[5], "recreated", "{out}");
        let (create, members) = ns.saved("ipm4-a").unwrap();
        assert!(create.contains("hash:net"), "{create}");
        assert_eq!(members, ["10.0.0.0/8"]);
        assert_eq!(ns.saved("ipm4-l").unwrap().1, ["ipm4-a"]);
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", path]);
        assert!(ok && out.contains("Nothing to change"), "{backend}: {out}");
    }
}

#[test]
fn bad_input_is_rejected_by_name_and_never_reaches_the_kernel() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("bad-{backend}")) else {
            return;
        };
        ns.sh(&["ipset", "create", "KUBE-X", "hash:ip"]);
        let dir = tempfile::tempdir().unwrap();
        let cases: BTreeMap<&str, (&str, &str, &str)> = [
            (
                "inject",
                (
                    "hash:ip",
                    "1.2.3.4\ndestroy KUBE-X",
                    "contains whitespace or control characters",
                ),
            ),
            ("hostname", ("hash:ip", "example.com", "host name")),
            (
                "wrongfamily",
                (
                    "hash:ip",
                    "2001:db8::1",
                    "IPv6 member but the policy family is IPv4",
                ),
            ),
            ("widecidr", ("hash:ip", "10.0.0.0/24", "use hash:net")),
            (
                "portrange",
                ("hash:ip,port", "10.0.0.1,tcp:80-90", "port ranges"),
            ),
            ("badlist", ("list:set", "nosuchpolicy", "does not exist")),
        ]
        .into();
        for (name, (t, member, _)) in &cases {
            write_policy(
                dir.path(),
                &format!("{name}.yaml"),
                &policy_yaml(name, t, &[member]),
            );
        }
        let mut p = policy_yaml("toomany", "hash:ip", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        p.push_str("  maxElem: 2\n");
        write_policy(dir.path(), "toomany.yaml", &p);
        write_policy(
            dir.path(),
            "good.yaml",
            &policy_yaml("good", "hash:ip", &["10.0.0.7"]),
        );

        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", dir.path().to_str().unwrap()]);
        assert!(!ok, "{out}");
        for (name, (_, member, reason)) in &cases {
            let line = out
                .lines()
                .find(|l| l.contains(&format!("policy \"{name}\": member")))
                .unwrap_or_else(|| panic!("{name}: {out}"));
            assert!(line.contains(&member.escape_debug().to_string()), "{line}");
            assert!(line.contains(reason), "{name}: {line}");
        }
        assert!(
            out.contains("policy \"toomany\": 3 members exceed maxElem 2"),
            "{out}"
        );
        assert_eq!(ns.set_names(), ["KUBE-X", "ipm4-good"], "{out}");
        assert_eq!(ns.saved("ipm4-good").unwrap().1, ["10.0.0.7"]);
    }
}

#[test]
fn dry_run_changes_nothing() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("dry-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "p.yaml",
            &policy_yaml("dry", "hash:net", &["10.0.0.0/8", "0.0.0.0/0"]),
        );
        let (ok, out) = ns.ipsetmgr(
            backend,
            &["apply", "-f", dir.path().to_str().unwrap(), "--dry-run"],
        );
        assert!(ok, "{out}");
        assert!(
            out.contains("create ipm4-dry hash:net with 3 members"),
            "{out}"
        );
        assert!(ns.set_names().is_empty());
        let (ok, out) = ns.ipsetmgr(backend, &["sets"]);
        assert!(ok && out.contains("No sets with prefix"), "{out}");
    }
}

#[test]
fn netlink_needs_no_ipset_binary() {
    let Some(ns) = Netns::new("nobinary") else {
        return;
    };
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    // The binary cannot find `ipset` (nor anything else) on this PATH.
    let (ok, out) = ns.ipsetmgr_with_path("cli", &["sets"], Some(path));
    assert!(
        !ok && out.contains("ipset binary"),
        "the cli backend really needs the binary: {out}"
    );

    let dir = tempfile::tempdir().unwrap();
    write_policy(
        dir.path(),
        "p.yaml",
        &policy_yaml("nobin", "hash:net", &["10.0.0.0/8", "192.0.2.1"]),
    );
    let (ok, out) = ns.ipsetmgr_with_path(
        "netlink",
        &["apply", "-f", dir.path().to_str().unwrap()],
        Some(path),
    );
    assert!(ok, "{out}");
    assert!(out.contains("netlink backend"), "{out}");
    assert!(!out.contains("falling back"), "{out}");
    assert_eq!(
        ns.saved("ipm4-nobin").unwrap().1,
        ["10.0.0.0/8", "192.0.2.1"]
    );
    let (ok, out) = ns.ipsetmgr_with_path("netlink", &["sets"], Some(path));
    assert!(ok && out.contains("ipm4-nobin"), "{out}");
}

/// Poll until `check` holds (or fail after `secs`).
fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("timed out waiting for: {what}");
}

#[test]
fn run_follows_the_directory_and_repairs_drift() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("run-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "a.yaml",
            &policy_yaml("live", "hash:ip", &["10.0.0.1"]),
        );
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = ns
            .command(backend)
            .args(["--log-format", "json", "run", "--resync-interval", "1s"])
            .arg("--policy-dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let members = |ns: &Netns| ns.saved("ipm4-live").map(|(_, m)| m);
        eventually(10, "set created", || {
            members(&ns) == Some(vec!["10.0.0.1".into()])
        });

        write_policy(
            dir.path(),
            "a.yaml",
            &policy_yaml("live", "hash:ip", &["10.0.0.1", "10.0.0.9"]),
        );
        eventually(10, "member added", || {
            members(&ns) == Some(vec!["10.0.0.1".into(), "10.0.0.9".into()])
        });

        // Drift is repaired by the periodic resync.
        ns.sh(&["ipset", "add", "ipm4-live", "192.0.2.66"]);
        eventually(10, "drift repaired", || {
            members(&ns) == Some(vec!["10.0.0.1".into(), "10.0.0.9".into()])
        });
        // ... and logged, with what was repaired.
        eventually(10, "drift logged", || {
            std::fs::read_to_string(log.path())
                .unwrap()
                .lines()
                .any(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
                    let f = &v["fields"];
                    v["level"] == "INFO"
                        && f["message"] == "repaired drift"
                        && f["set"] == "ipm4-live"
                        && f["policy"] == "live"
                        && f["added"] == 0
                        && f["removed"] == 1
                })
        });

        // A file that does not parse freezes the kernel as it is.
        std::fs::write(dir.path().join("broken.yaml"), "spec: [").unwrap();
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(
            members(&ns).is_some(),
            "kept while the directory does not load"
        );

        // Fixed, and the last policy gone: its set is deleted.
        std::fs::remove_file(dir.path().join("broken.yaml")).unwrap();
        eventually(10, "set deleted", || ns.set_names().is_empty());

        // SIGTERM: a clean exit that leaves the kernel alone.
        write_policy(
            dir.path(),
            "b.yaml",
            &policy_yaml("stay", "hash:ip", &["10.0.0.2"]),
        );
        eventually(10, "second set", || ns.saved("ipm4-stay").is_some());
        signal(child.id(), Signal::SIGTERM);
        let status = child.wait().unwrap();
        assert!(status.success(), "{status}");
        assert_eq!(ns.set_names(), ["ipm4-stay"]);
    }
}

#[test]
fn run_reloads_on_sighup_and_recovers_a_recreated_directory() {
    let Some(ns) = Netns::new("run-hup") else {
        return;
    };
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    write_policy(
        &dir,
        "a.yaml",
        &policy_yaml("live", "hash:ip", &["10.0.0.1"]),
    );
    // A long interval: only SIGHUP can explain a prompt resync.
    let mut run = Running(Some(
        ns.command("netlink")
            .args(["run", "--resync-interval", "60s", "--policy-dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let members = |ns: &Netns| ns.saved("ipm4-live").map(|(_, m)| m);
    eventually(10, "set created", || {
        members(&ns) == Some(vec!["10.0.0.1".into()])
    });

    // SIGHUP: not a death (exit 129 before), but "reload and resync now".
    ns.sh(&["ipset", "add", "ipm4-live", "192.0.2.7"]);
    run.signal(Signal::SIGHUP);
    eventually(5, "drift repaired on SIGHUP", || {
        members(&ns) == Some(vec!["10.0.0.1".into()])
    });
    assert!(run.still_running(), "SIGHUP does not stop run");

    // The first step of a non-atomic rewrite (`: > a.yaml`) is an error for
    // that file, never "no policies": the set stays.
    std::fs::write(dir.join("a.yaml"), "").unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(members(&ns), Some(vec!["10.0.0.1".into()]), "kept");
    write_policy(
        &dir,
        "a.yaml",
        &policy_yaml("live", "hash:ip", &["10.0.0.1"]),
    );

    // The directory is removed: the kernel stays as it is...
    std::fs::remove_dir_all(&dir).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(members(&ns), Some(vec!["10.0.0.1".into()]));
    // ...and when it is back, run follows it again (watched anew), long
    // before the next periodic resync.
    std::fs::create_dir(&dir).unwrap();
    write_policy(
        &dir,
        "a.yaml",
        &policy_yaml("live", "hash:ip", &["10.0.0.1", "10.0.0.2"]),
    );
    eventually(10, "the recreated directory is followed", || {
        members(&ns) == Some(vec!["10.0.0.1".into(), "10.0.0.2".into()])
    });
    write_policy(
        &dir,
        "a.yaml",
        &policy_yaml("live", "hash:ip", &["10.0.0.3"]),
    );
    eventually(10, "and its changes are seen without a signal", || {
        members(&ns) == Some(vec!["10.0.0.3".into()])
    });
    run.signal(Signal::SIGTERM);
    assert!(run.wait().success());
}

/// A background ipsetmgr, killed and reaped when dropped, so a failed
/// assertion never leaves a process behind that holds its lock.
struct Running(Option<Child>);

impl Running {
    fn child(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .expect("the child is only taken by consuming methods")
    }

    fn pid(&mut self) -> u32 {
        self.child().id()
    }

    fn signal(&mut self, sig: Signal) {
        signal(self.pid(), sig);
    }

    fn still_running(&mut self) -> bool {
        self.child().try_wait().expect("try_wait").is_none()
    }

    fn wait(mut self) -> ExitStatus {
        let mut child = self.0.take().expect("child");
        child.wait().expect("wait")
    }

    fn output(mut self) -> Output {
        let child = self.0.take().expect("child");
        child.wait_with_output().expect("wait_with_output")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Two policy directories: `held` (set ipm4-held) and `other` (ipm4-other).
fn two_policy_dirs() -> (tempfile::TempDir, tempfile::TempDir) {
    let held = tempfile::tempdir().unwrap();
    write_policy(
        held.path(),
        "p.yaml",
        &policy_yaml("held", "hash:ip", &["10.0.0.1"]),
    );
    let other = tempfile::tempdir().unwrap();
    write_policy(
        other.path(),
        "p.yaml",
        &policy_yaml("other", "hash:ip", &["10.0.0.2"]),
    );
    (held, other)
}

#[test]
fn a_second_writer_waits_for_the_lock_holder() {
    let Some(ns) = Netns::new("lock") else {
        return;
    };
    let (held, other) = two_policy_dirs();
    let other = other.path().to_str().unwrap();
    let mut run = ns.spawn_run(held.path());
    let run_pid = run.pid();
    eventually(10, "run applied its policy", || {
        ns.set_names() == ["ipm4-held"]
    });

    // Without waiting: refused at once as a usage error naming the holder,
    // before it could prune the run's set.
    let out = ns
        .command("netlink")
        .args(["--lock-wait", "0", "apply", "-f", other, "--prune"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("held by pid {run_pid}, ipsetmgr run")),
        "{stderr}"
    );
    assert!(stderr.contains("--lock-wait"), "{stderr}");
    assert_eq!(ns.set_names(), ["ipm4-held"], "the kernel was not touched");

    // Readers take no lock.
    let (ok, out) = ns.ipsetmgr(
        "netlink",
        &["--lock-wait", "0", "apply", "-f", other, "--dry-run"],
    );
    assert!(ok && out.contains("create ipm4-other"), "{out}");
    let (ok, out) = ns.ipsetmgr("netlink", &["--lock-wait", "0", "sets"]);
    assert!(ok && out.contains("ipm4-held"), "{out}");

    // A patient writer waits, and goes ahead once the holder has exited.
    let mut waiter = Running(Some(
        ns.command("netlink")
            .args(["--lock-wait", "10s", "apply", "-f", other, "--prune"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert!(waiter.still_running(), "the apply waits for the lock");
    assert_eq!(ns.set_names(), ["ipm4-held"]);
    run.signal(Signal::SIGTERM);
    assert!(run.wait().success());
    let out = waiter.output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let waiting = format!(
        "waiting for the lock on ipsets with prefix \"ipm\" in this network namespace \
         (held by pid {run_pid}, ipsetmgr run)"
    );
    assert_eq!(stderr.matches(&waiting).count(), 1, "said once: {stderr}");
    assert_eq!(ns.set_names(), ["ipm4-other"], "pruned and applied");
}

#[test]
fn the_lock_is_per_network_namespace_and_prefix() {
    let (Some(a), Some(b)) = (Netns::new("lock-a"), Netns::new("lock-b")) else {
        return;
    };
    let (held, _) = two_policy_dirs();
    let held = held.path();
    let _run = a.spawn_run(held);
    eventually(10, "run applied its policy", || {
        a.set_names() == ["ipm4-held"]
    });

    // Other namespace: not blocked.
    let out = b
        .command("netlink")
        .args(["--lock-wait", "0", "apply", "-f"])
        .arg(held)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(b.set_names(), ["ipm4-held"]);

    // Same namespace, other prefix: disjoint sets, not blocked either.
    let (ok, out) = a.ipsetmgr(
        "netlink",
        &[
            "--set-prefix",
            "alt",
            "--lock-wait",
            "0",
            "apply",
            "-f",
            held.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(a.set_names(), ["alt4-held", "ipm4-held"]);
}

#[test]
fn a_killed_holder_leaves_no_stale_lock() {
    let Some(ns) = Netns::new("lock-kill") else {
        return;
    };
    let (held, _) = two_policy_dirs();
    let held = held.path().to_str().unwrap();
    let mut run = ns.spawn_run(Path::new(held));
    eventually(10, "run applied its policy", || {
        ns.set_names() == ["ipm4-held"]
    });
    let (ok, out) = ns.ipsetmgr("netlink", &["--lock-wait", "0", "apply", "-f", held]);
    assert!(!ok && out.contains("held by pid"), "held: {out}");

    run.signal(Signal::SIGKILL);
    assert!(!run.wait().success());
    // The kernel freed the socket name with the dead process.
    let start = Instant::now();
    let out = ns
        .command("netlink")
        .args(["--lock-wait", "0", "apply", "-f", held])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("waiting for the lock"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn slices_and_plain_member_lists_apply_with_their_policy() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("slices-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "drop.yaml",
            &policy_yaml("drop", "hash:net", &["10.0.0.0/8"]),
        );
        write_policy(
            dir.path(),
            "drop-slice.yaml",
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetMemberSlice\nmetadata:\n  name: drop-a\n  labels: {ipsetmgr.io/policy: drop}\nspec:\n  members: [192.0.2.0/24]\n",
        );
        let list = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            list.path(),
            "; Spamhaus style header\n198.51.100.0/24 ; SBL1\n",
        )
        .unwrap();
        let members = format!("drop={}", list.path().display());
        let args = [
            "apply",
            "-f",
            dir.path().to_str().unwrap(),
            "--members",
            &members,
        ];
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(ok, "{backend}: {out}");
        let (_, got) = ns.saved("ipm4-drop").unwrap_or_else(|| panic!("{out}"));
        assert_eq!(
            got,
            ["10.0.0.0/8", "192.0.2.0/24", "198.51.100.0/24"],
            "{backend}"
        );

        // A bad member in the list holds the set as it is and fails.
        std::fs::write(list.path(), "198.51.100.0/33\n").unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(!ok && out.contains("198.51.100.0/33"), "{backend}: {out}");
        let (_, kept) = ns.saved("ipm4-drop").unwrap();
        assert_eq!(kept, got, "{backend}: held, not emptied");

        // A list that is empty, or gone, holds the set too: the policy is
        // never applied without the members the list gave.
        std::fs::write(list.path(), "# nothing\n").unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(!ok && out.contains("no members"), "{backend}: {out}");
        assert_eq!(
            ns.saved("ipm4-drop").unwrap().1,
            got,
            "{backend}: empty list"
        );
        let gone = format!("drop={}/missing.netset", dir.path().display());
        let missing = [
            "apply",
            "-f",
            dir.path().to_str().unwrap(),
            "--members",
            &gone,
        ];
        let (ok, out) = ns.ipsetmgr(backend, &missing);
        assert!(!ok && out.contains("missing.netset"), "{backend}: {out}");
        assert_eq!(
            ns.saved("ipm4-drop").unwrap().1,
            got,
            "{backend}: missing list"
        );

        // One slice name in two files: both policies held, nothing applied
        // of either (which members are meant is not known).
        write_policy(
            dir.path(),
            "drop-slice-again.yaml",
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetMemberSlice\nmetadata:\n  name: drop-a\n  labels: {ipsetmgr.io/policy: drop}\nspec:\n  members: [203.0.113.0/24]\n",
        );
        std::fs::write(list.path(), "198.51.100.0/24\n").unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(!ok && out.contains("drop-a"), "{backend}: {out}");
        assert_eq!(
            ns.saved("ipm4-drop").unwrap().1,
            got,
            "{backend}: duplicate slice"
        );
        std::fs::remove_file(dir.path().join("drop-slice-again.yaml")).unwrap();

        // One list may feed two policies.
        write_policy(
            dir.path(),
            "allow.yaml",
            &policy_yaml("allow", "hash:net", &["10.1.0.0/16"]),
        );
        let second = format!("allow={}", list.path().display());
        let both = [
            "apply",
            "-f",
            dir.path().to_str().unwrap(),
            "--members",
            &members,
            "--members",
            &second,
        ];
        let (ok, out) = ns.ipsetmgr(backend, &both);
        assert!(ok, "{backend}: {out}");
        assert_eq!(
            ns.saved("ipm4-allow").unwrap().1,
            ["10.1.0.0/16", "198.51.100.0/24"],
            "{backend}"
        );
        assert_eq!(ns.saved("ipm4-drop").unwrap().1, got, "{backend}");
        std::fs::remove_file(dir.path().join("allow.yaml")).unwrap();
    }
}

/// A FireHOL netset: comments, blank lines, CIDRs (one with host bits).
const FIREHOL_NETSET: &str = "#\n# firehol_level1\n#\n# ipv4 hash:net ipset\n#\n\n192.0.2.0/24\n198.51.100.7/24  # host bits\n\n203.0.113.0/24\n";

fn sourced_policy(name: &str, set_type: &str, source: &str) -> String {
    format!(
        "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: {name}\nspec:\n  type: \"{set_type}\"\n  membersFrom:\n    - {source}\n"
    )
}

#[test]
fn file_sources_apply_relative_to_the_policy_file_and_bad_lines_hold_the_set() {
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("fsrc-{backend}")) else {
            return;
        };
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("policies");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(root.path().join("lists")).unwrap();
        let list = root.path().join("lists/level1.netset");
        std::fs::write(&list, FIREHOL_NETSET).unwrap();
        write_policy(
            &dir,
            "l1.yaml",
            &sourced_policy("l1", "hash:net", "file: {path: ../lists/level1.netset}"),
        );
        let args = ["apply", "-f", dir.to_str().unwrap()];
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(ok, "{backend}: {out}");
        let (_, got) = ns.saved("ipm4-l1").unwrap_or_else(|| panic!("{out}"));
        assert_eq!(got, ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"]);

        // A malformed line: the policy fails by file and line, its set stays.
        std::fs::write(&list, format!("{FIREHOL_NETSET}\n203.0.113.0/33\n")).unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(!ok, "{backend}: {out}");
        assert!(
            out.contains("policy \"l1\": slice \"membersFrom[0] (file)\"")
                && out.contains("level1.netset: line 12: \"203.0.113.0/33\""),
            "{backend}: {out}"
        );
        assert_eq!(ns.saved("ipm4-l1").unwrap().1, got, "{backend}: held");
        // Missing, too; and with --prune the set is still not deleted.
        std::fs::remove_file(&list).unwrap();
        let (ok, out) = ns.ipsetmgr(backend, &[&args[..], &["--prune"]].concat());
        assert!(!ok && out.contains("level1.netset"), "{backend}: {out}");
        assert_eq!(ns.saved("ipm4-l1").unwrap().1, got, "{backend}: held");

        // A Kubernetes source in a file is refused, naming file, policy and source.
        write_policy(&dir, "n.yaml", &sourced_policy("n", "hash:ip", "nodes: {}"));
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(!ok, "{backend}: {out}");
        assert!(
            out.contains(&format!(
                "policy \"n\": membersFrom[0] (nodes) in {} is refused: a Kubernetes source works only in a cluster",
                dir.join("n.yaml").display()
            )),
            "{backend}: {out}"
        );
        assert!(ns.saved("ipm4-n").is_none());
    }
}

/// A feed on loopback, in the test's own network namespace (the binary
/// fetches from the namespace it started in; `--netns` is where the sets
/// are). Returns its URL.
fn serve_feed(body: &'static str) -> String {
    let app = axum::Router::new().route(
        "/level1.netset",
        axum::routing::get(move || async move { body }),
    );
    format!("http://{}/level1.netset", loopback::serve(app))
}

#[test]
fn url_sources_apply_from_a_loopback_server() {
    let url = serve_feed(FIREHOL_NETSET);
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("usrc-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "feed.yaml",
            &sourced_policy("feed", "hash:net", &format!("url: {{url: \"{url}\"}}")),
        );
        let args = ["apply", "-f", dir.path().to_str().unwrap()];
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(ok, "{backend}: {out}");
        assert_eq!(
            ns.saved("ipm4-feed").unwrap().1,
            ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"]
        );
        // The server gone (a port nothing listens on): held, naming the URL.
        write_policy(
            dir.path(),
            "feed.yaml",
            &sourced_policy("feed", "hash:net", "url: {url: \"http://127.0.0.1:1/x\"}"),
        );
        let (ok, out) = ns.ipsetmgr(backend, &args);
        assert!(
            !ok && out.contains("membersFrom[0] (url)") && out.contains("http://127.0.0.1:1/x"),
            "{backend}: {out}"
        );
        assert_eq!(ns.saved("ipm4-feed").unwrap().1.len(), 3, "{backend}: held");
    }
}

#[test]
fn run_follows_a_member_list_file_and_holds_its_sets_while_it_is_broken() {
    let Some(ns) = Netns::new("run-fsrc") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    let list = root.path().join("allow.txt");
    std::fs::write(&list, "# allowed\n192.0.2.1\n").unwrap();
    write_policy(
        &dir,
        "allow.yaml",
        &sourced_policy("allow", "hash:ip", "file: {path: ../allow.txt}"),
    );
    // A resync far away: the change must be seen by the watch. The policy
    // directory is given relative (`policies`), and the list relative to it
    // (`../allow.txt`): edits were missed until the next resync then.
    let mut child = ns
        .command("netlink")
        .args(["run", "--resync-interval", "1h", "--policy-dir", "policies"])
        .current_dir(root.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let members = |ns: &Netns| ns.saved("ipm4-allow").map(|(_, m)| m);
    eventually(10, "set created", || {
        members(&ns) == Some(vec!["192.0.2.1".into()])
    });
    std::fs::write(&list, "# allowed\n192.0.2.1\n192.0.2.2\n").unwrap();
    eventually(10, "list change applied", || {
        members(&ns) == Some(vec!["192.0.2.1".into(), "192.0.2.2".into()])
    });
    // Replaced by a rename (as editors and downloaders do): still followed.
    let tmp = root.path().join(".allow.txt.new");
    std::fs::write(&tmp, "192.0.2.3\n").unwrap();
    std::fs::rename(&tmp, &list).unwrap();
    eventually(10, "renamed list applied", || {
        members(&ns) == Some(vec!["192.0.2.3".into()])
    });
    // A broken list holds the policy: the kernel keeps the last good
    // members; fixed, it applies.
    std::fs::write(&list, "192.0.2.3\n192.0.2.300\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(members(&ns), Some(vec!["192.0.2.3".into()]));
    std::fs::write(&list, "192.0.2.4\n").unwrap();
    eventually(10, "fixed list applied", || {
        members(&ns) == Some(vec!["192.0.2.4".into()])
    });
    signal(child.id(), Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
}

/// Comments survive every way a list reaches a policy: a `file` source,
/// `--members`, and the slices `ipsetmgr slice --type` writes (it wrote the
/// kernel's `comment "x"` form, which apply then refused as user input).
#[test]
fn comments_round_trip_from_lists_sources_and_slice_output() {
    let Some(ns) = Netns::new("comments") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lists = tempfile::tempdir().unwrap();
    let list = lists.path().join("l.txt");
    std::fs::write(&list, "10.61.0.0/16 comment:from a list\n10.62.0.0/16\n").unwrap();
    write_policy(
        dir.path(),
        "sourced.yaml",
        &sourced_policy(
            "sourced",
            "hash:net",
            &format!("file: {{path: {}}}", list.display()),
        ),
    );
    write_policy(
        dir.path(),
        "listed.yaml",
        &policy_yaml("listed", "hash:net", &["10.1.0.0/16"]),
    );
    write_policy(
        dir.path(),
        "sliced.yaml",
        &policy_yaml("sliced", "hash:net", &["10.2.0.0/16"]),
    );
    let out = Command::new(BIN)
        .args(["slice", "--policy", "sliced", "--type", "hash:net", "-f"])
        .arg(&list)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slices = String::from_utf8(out.stdout).unwrap();
    assert!(
        slices.contains("10.61.0.0/16 comment:from a list"),
        "{slices}"
    );
    std::fs::write(dir.path().join("sliced-slices.yaml"), slices).unwrap();
    let members = format!("listed={}", list.display());
    let args = [
        "apply",
        "-f",
        dir.path().to_str().unwrap(),
        "--members",
        &members,
    ];
    let (ok, out) = ns.ipsetmgr("netlink", &args);
    assert!(ok, "{out}");
    for (set, own) in [
        ("ipm4-sourced", None),
        ("ipm4-listed", Some("10.1.0.0/16")),
        ("ipm4-sliced", Some("10.2.0.0/16")),
    ] {
        let (_, got) = ns.saved(set).unwrap_or_else(|| panic!("{set}: {out}"));
        let mut want = vec!["10.61.0.0/16 comment \"from a list\"", "10.62.0.0/16"];
        want.extend(own);
        want.sort();
        assert_eq!(got, want, "{set}");
    }
    let (ok, out) = ns.ipsetmgr("netlink", &args);
    assert!(
        ok && !out.contains("updated"),
        "a second apply changes nothing: {out}"
    );
}

/// A url that accepts and never answers: the other policies are applied at
/// once (the fetch runs off `run`'s loop; they waited for the 60 s timeout),
/// the url's own policy is held, and SIGTERM ends `run` within 2 seconds.
#[test]
fn a_url_that_never_answers_delays_nothing_and_sigterm_is_prompt() {
    let Some(ns) = Netns::new("run-hang") else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        // Accept and hold every connection, answering nothing.
        let mut held = Vec::new();
        for c in listener.incoming() {
            held.push(c);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    write_policy(
        dir.path(),
        "slow.yaml",
        &sourced_policy(
            "slow",
            "hash:net",
            &format!("url: {{url: \"http://{addr}/l.netset\"}}"),
        ),
    );
    write_policy(
        dir.path(),
        "quick.yaml",
        &policy_yaml("quick", "hash:ip", &["192.0.2.1"]),
    );
    let start = Instant::now();
    let mut child = ns
        .command("netlink")
        .args(["run", "--policy-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "the other policy applied", || {
        ns.saved("ipm4-quick").is_some()
    });
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(ns.saved("ipm4-slow").is_none(), "the url's policy is held");
    let stop = Instant::now();
    signal(child.id(), Signal::SIGTERM);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            stop.elapsed() < Duration::from_secs(5),
            "run ignored SIGTERM for 5 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped_in = stop.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        stopped_in < Duration::from_millis(2500),
        "SIGTERM took {stopped_in:?}"
    );
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    let stopped = log
        .find("stopped; kernel sets are left as they are")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        !log[stopped..].contains("written"),
        "a write after the last line:\n{log}"
    );
    eprintln!("applied the other policy after {took:?}; SIGTERM to exit {stopped_in:?}");
}

/// A list:set over a policy that is held (its url never delivered) is made
/// with the members that exist, and says which one is held (it was created
/// empty, and failed on the missing member).
#[test]
fn a_list_set_leaves_out_a_held_member_and_lists_the_rest() {
    let Some(ns) = Netns::new("list-held") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard): nothing listens on loopback here.
    write_policy(
        dir.path(),
        "feed.yaml",
        &sourced_policy(
            "feed",
            "hash:net",
            "url: {url: \"http://127.0.0.1:9/l.netset\"}",
        ),
    );
    write_policy(
        dir.path(),
        "local.yaml",
        &policy_yaml("local", "hash:net", &["10.0.0.0/8"]),
    );
    write_policy(
        dir.path(),
        "all.yaml",
        &policy_yaml("all", "list:set", &["feed", "local"]),
    );
    for backend in backends() {
        let (ok, out) = ns.ipsetmgr(backend, &["apply", "-f", dir.path().to_str().unwrap()]);
        assert!(!ok, "the feed's policy failed: {backend}: {out}");
        assert!(
            out.contains("list:set member \"feed\": policy \"feed\" is held"),
            "{backend}: {out}"
        );
        let (_, members) = ns
            .saved("ipm4-all")
            .unwrap_or_else(|| panic!("{backend}: {out}"));
        assert_eq!(members, ["ipm4-local"], "{backend}: {out}");
        assert!(ns.saved("ipm4-feed").is_none(), "{backend}");
    }
}

/// A list:set over a url-fed policy keeps listing it when the url fails
/// later: the feed's set keeps its last good members, and the list still
/// holds it (a failure to load never changes the kernel). It was rewritten
/// to list only the local set.
#[test]
fn a_list_set_keeps_listing_a_held_member_whose_set_exists() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let failing = Arc::new(AtomicBool::new(false));
    let flag = failing.clone();
    let app = axum::Router::new().route(
        "/l.netset",
        axum::routing::get(move || {
            let failing = flag.load(Ordering::SeqCst);
            async move {
                if failing {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "").into_response()
                } else {
                    "192.0.2.0/24\n".into_response()
                }
            }
        }),
    );
    use axum::response::IntoResponse;
    let url = format!("http://{}/l.netset", loopback::serve(app));
    for backend in backends() {
        let Some(ns) = Netns::new(&format!("list-keep-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "feed.yaml",
            &sourced_policy("feed", "hash:net", &format!("url: {{url: \"{url}\"}}")),
        );
        write_policy(
            dir.path(),
            "local.yaml",
            &policy_yaml("local", "hash:net", &["10.0.0.0/8"]),
        );
        write_policy(
            dir.path(),
            "all.yaml",
            &policy_yaml("all", "list:set", &["feed", "local"]),
        );
        let apply = || ns.ipsetmgr(backend, &["apply", "-f", dir.path().to_str().unwrap()]);
        failing.store(false, Ordering::SeqCst);
        let (ok, out) = apply();
        assert!(ok, "{backend}: {out}");
        let listed = |out: &str| {
            ns.saved("ipm4-all")
                .unwrap_or_else(|| panic!("{backend}: {out}"))
                .1
        };
        assert_eq!(listed(&out), ["ipm4-feed", "ipm4-local"], "{backend}");
        failing.store(true, Ordering::SeqCst);
        let (ok, out) = apply();
        assert!(!ok, "the feed's policy failed: {backend}: {out}");
        assert_eq!(
            listed(&out),
            ["ipm4-feed", "ipm4-local"],
            "{backend}: a failure to load changed the list: {out}"
        );
        let (_, feed) = ns.saved("ipm4-feed").expect("the feed's set stays");
        assert_eq!(feed, ["192.0.2.0/24"], "{backend}");
    }
}

/// A policy without `maxElem` fed by a url that grows from 1,000 to 200,000
/// addresses (README, "Sets that grow"): every apply succeeds and the
/// kernel set's size follows, on ipset and on nft; it went down with the
/// list too. Before, the second apply failed ("exceed maxElem 65536").
#[test]
fn a_url_fed_set_without_max_elem_grows_with_its_list() {
    let body = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let served = body.clone();
    let app = axum::Router::new().route(
        "/grow.txt",
        axum::routing::get(move || {
            let served = served.clone();
            async move { served.lock().unwrap().clone() }
        }),
    );
    let url = format!("http://{}/grow.txt", loopback::serve(app));
    let list = |n: u32| -> String {
        (0..n)
            .map(|i| format!("{}\n", std::net::Ipv4Addr::from(0x0a00_0000 + i)))
            .collect()
    };
    for backend in ["netlink", "nft"] {
        let Some(ns) = Netns::new(&format!("grow-{backend}")) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        write_policy(
            dir.path(),
            "grow.yaml",
            &sourced_policy(
                "grow",
                "hash:ip",
                &format!("url: {{url: \"{url}\", maxMembers: 300000}}"),
            ),
        );
        let args = ["apply", "-f", dir.path().to_str().unwrap()];
        // (size, members) as the kernel reports them.
        let kernel = |ns: &Netns| -> (u64, u64) {
            if backend == "nft" {
                let out = ns.exec(&["nft", "-j", "list", "set", "inet", "ipsetmgr", "ipm4-grow"]);
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let set = v["nftables"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find_map(|o| o.get("set"))
                    .expect("the set")
                    .clone();
                let n = set["elem"].as_array().map_or(0, |e| e.len() as u64);
                (set["size"].as_u64().unwrap(), n)
            } else {
                let out = ns.exec(&["ipset", "list", "-t", "ipm4-grow"]);
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                let field = |after: &str| -> u64 {
                    let at = text
                        .find(after)
                        .unwrap_or_else(|| panic!("{after}: {text}"));
                    text[at + after.len()..]
                        .split(|c: char| !c.is_ascii_digit())
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap()
                };
                (field("maxelem "), field("Number of entries: "))
            }
        };
        for (n, size) in [(1_000, 65536), (200_000, 262144), (1_000, 65536)] {
            *body.lock().unwrap() = list(n);
            let (ok, out) = ns.ipsetmgr(backend, &args);
            assert!(ok, "{backend} at {n}: {out}");
            assert_eq!(kernel(&ns), (size, u64::from(n)), "{backend} at {n}");
        }
    }
}
