//! `ipsetmgr slice` end to end: the binary on real files and standard
//! input. Its output must parse back into IPSetMemberSlice objects that
//! carry every member once, with the labels that bind them to the policy;
//! bad input must exit 1 naming the line and print nothing; usage errors
//! exit 2. No kernel and no root are needed.

use std::collections::BTreeSet;
use std::path::Path;

use ipsetmgr_api::{IPSetMemberSlice, POLICY_LABEL};

#[path = "common/cli.rs"]
mod cli;
use cli::{ipsetmgr, text};

/// 20,000 addresses as a FireHOL-style netset, comments and all.
fn netset(dir: &Path) -> (std::path::PathBuf, BTreeSet<String>) {
    let members: BTreeSet<String> = (0..20_000u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i * 7).to_string())
        .collect();
    let mut body = String::from("#\n# blocklist, generated\n#\n\n");
    for m in &members {
        body.push_str(m);
        body.push_str(" # entry\n");
    }
    let path = dir.join("blocklist.netset");
    std::fs::write(&path, body).unwrap();
    (path, members)
}

#[test]
fn a_member_list_becomes_a_yaml_stream_of_labelled_slices() {
    let d = tempfile::tempdir().unwrap();
    let (file, members) = netset(d.path());
    let out = ipsetmgr(
        &[
            "slice",
            "--policy",
            "blocklist",
            "-f",
            file.to_str().unwrap(),
            "--type",
            "hash:ip",
            "--max-members",
            "1000",
        ],
        None,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let slices: Vec<IPSetMemberSlice> =
        serde_saphyr::from_multiple(&stdout).expect("a YAML stream of slices");
    // 20,000 members at 70% of 1000 per slice: 32 slices, every one emitted.
    assert_eq!(slices.len(), 32);
    assert_eq!(stdout.matches("\n---\n").count(), 31);
    let mut seen = BTreeSet::new();
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(
            s.metadata.name.as_deref(),
            Some(&*format!("blocklist-{i:02}-of-32"))
        );
        let labels = s.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels[POLICY_LABEL], "blocklist");
        assert_eq!(labels["ipsetmgr.io/slice-count"], "32");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "ipsetmgr-slice");
        assert!(s.spec.members.len() <= 1000);
        for m in &s.spec.members {
            assert!(seen.insert(m.clone()), "{m} is in two slices");
        }
    }
    assert_eq!(seen, members);
    assert!(
        stderr.contains("20000 members of policy blocklist in 32 slices"),
        "{stderr}"
    );
    assert!(
        stderr.contains("kubectl delete ipsetmemberslices -l 'ipsetmgr.io/policy=blocklist,ipsetmgr.io/slice-count!=32'"),
        "{stderr}"
    );
}

#[test]
fn standard_input_and_json_output_work_too() {
    let out = ipsetmgr(
        &[
            "slice",
            "--policy",
            "nets",
            "-f",
            "-",
            "--type",
            "hash:net",
            "--family",
            "Dual",
            "--output-format",
            "json",
        ],
        Some("; Spamhaus DROP\r\n10.1.2.3/8 ; SBL1\r\n2001:DB8::/32\r\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(list["kind"], "List");
    let items: Vec<IPSetMemberSlice> = serde_json::from_value(list["items"].clone()).unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].spec.members, ["10.0.0.0/8", "2001:db8::/32"]);
    // YAML on standard input, said so with --format; no --type: schema only.
    let out = ipsetmgr(
        &["slice", "--policy", "hosts", "-f", "-", "--format", "yaml"],
        Some("members: [b.example, a.example]\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let slices: Vec<IPSetMemberSlice> = serde_saphyr::from_multiple(&text(&out.stdout)).unwrap();
    assert_eq!(slices[0].spec.members, ["a.example", "b.example"]);
}

#[test]
fn bad_members_exit_1_naming_the_line_and_print_nothing() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("list.txt");
    std::fs::write(&file, "# list\n10.0.0.1\n\n10.0.0.256\nexample.com\n").unwrap();
    let out = ipsetmgr(
        &[
            "slice",
            "--policy",
            "blocklist",
            "-f",
            file.to_str().unwrap(),
            "--type",
            "hash:ip",
        ],
        None,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing printed: {}",
        text(&out.stdout)
    );
    assert!(
        stderr.contains("list.txt: line 4: \"10.0.0.256\": not a valid IP address"),
        "{stderr}"
    );
    assert!(
        // Only the first bad member is quoted (a file that is no list at
        // all must not reach a log line by line).
        stderr.contains("list.txt: line 5: looks like a host name")
            && !stderr.contains("example.com"),
        "{stderr}"
    );
    // An empty or missing list is an error too, never zero members.
    for (path, needle) in [
        ("/dev/null", "not a regular file"),
        ("/nonexistent/list", "/nonexistent/list"),
    ] {
        let out = ipsetmgr(&["slice", "--policy", "b", "-f", path], None);
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains(needle), "{}", text(&out.stderr));
    }
    let empty = d.path().join("empty.txt");
    std::fs::write(&empty, "# nothing yet\n").unwrap();
    let out = ipsetmgr(
        &["slice", "--policy", "b", "-f", empty.to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("contains no members"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn usage_errors_exit_2() {
    let long = "a".repeat(64);
    for args in [
        &["slice", "--policy", &long, "-f", "-"][..],
        &["slice", "--policy", "Bad_Name", "-f", "-"],
        &["slice", "--policy", "b", "-f", "-", "--type", "list:set"],
        &[
            "slice",
            "--policy",
            "b",
            "-f",
            "-",
            "--max-members",
            "50001",
        ],
        &["slice", "-f", "-"],
    ] {
        let out = ipsetmgr(args, Some("10.0.0.1\n"));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    let out = ipsetmgr(&["slice", "--policy", &long, "-f", "-"], None);
    assert!(
        text(&out.stderr).contains("at most 63"),
        "{}",
        text(&out.stderr)
    );
}
