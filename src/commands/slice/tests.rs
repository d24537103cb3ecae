//! Properties of `ipsetmgr slice` as a whole: a million members survive
//! the round trip exactly, a small change touches few slices, and every
//! slice stays within what the API server and `kubectl apply` accept.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;
use std::time::Instant;

use super::*;
use ipsetmgr_api::POLICY_LABEL;
use ipsetmgr_ipset::{Member, SetType};
use ipsetmgr_policy::FamilySpec;
use ipsetmgr_policy::slicing::objects::{self, MANAGED_BY, MANAGED_BY_LABEL};

/// The annotation client-side `kubectl apply` keeps the applied object in;
/// the API server refuses annotations over 256 KiB in all (keys included).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const ANNOTATIONS_LIMIT: usize = 262_144;

/// The annotation's value as kubectl writes it: the object as JSON, by Go's
/// encoder (which escapes `<`, `>` and `&`), and a newline.
fn last_applied(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        + "\n"
}

/// `n` distinct IPv4 addresses from `first` on, in address order.
fn ipv4(first: u32, n: u32) -> Vec<String> {
    (first..first + n)
        .map(|i| Ipv4Addr::from(i).to_string())
        .collect()
}

const MILLION: u32 = 1_000_000;
const FIRST: u32 = 0x0100_0000;

/// A million IPv4 members and their slices, made once for all the tests
/// that need them.
fn million() -> &'static (Vec<String>, Sliced) {
    static MILLION_SLICED: OnceLock<(Vec<String>, Sliced)> = OnceLock::new();
    MILLION_SLICED.get_or_init(|| {
        let members = ipv4(FIRST, MILLION);
        let started = Instant::now();
        let sliced = slice_members("blocklist", &members, 5000).unwrap();
        eprintln!(
            "1M IPv4: {} slices, largest {} members / {} bytes, sliced in {:?}",
            sliced.slices.len(),
            sliced
                .slices
                .iter()
                .map(|s| s.spec.members.len())
                .max()
                .unwrap(),
            sliced.bytes.iter().max().unwrap(),
            started.elapsed()
        );
        (members, sliced)
    })
}

/// Every slice within the byte bound, as measured and as kubectl stores it.
fn assert_within_bounds(sliced: &Sliced) {
    for (slice, &bytes) in sliced.slices.iter().zip(&sliced.bytes) {
        let name = slice.metadata.name.as_deref().unwrap();
        let json = serde_json::to_string(slice).unwrap();
        assert!(
            json.len() <= bytes,
            "{name}: measured {bytes} < {}",
            json.len()
        );
        assert!(bytes <= MAX_SLICE_BYTES, "{name}: {bytes} bytes");
        let annotation = LAST_APPLIED.len() + last_applied(&json).len();
        assert!(
            annotation < ANNOTATIONS_LIMIT,
            "{name}: {annotation} bytes of annotations"
        );
    }
}

#[test]
fn a_million_members_round_trip_exactly() {
    let started = Instant::now();
    let (members, sliced) = million();
    assert_eq!(sliced.slices.len(), 512);
    let mut seen: HashSet<&str> = HashSet::with_capacity(members.len());
    let mut total = 0;
    for (index, slice) in sliced.slices.iter().enumerate() {
        assert_eq!(
            slice.metadata.name.as_deref(),
            Some(&*format!("blocklist-{index:03}-of-512"))
        );
        let labels = slice.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[POLICY_LABEL], "blocklist");
        assert_eq!(labels[objects::SLICE_COUNT_LABEL], "512");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
        let addrs: Vec<u32> = slice
            .spec
            .members
            .iter()
            .map(|m| m.parse::<Ipv4Addr>().unwrap().into())
            .collect();
        assert!(addrs.is_sorted(), "{index}: members keep the sorted order");
        assert!(slice.spec.members.len() <= 5000);
        total += slice.spec.members.len();
        seen.extend(slice.spec.members.iter().map(String::as_str));
    }
    // As many members as went in, all distinct, and exactly those.
    assert_eq!(total, members.len(), "no member lost or repeated");
    assert_eq!(seen.len(), members.len(), "no duplicates across slices");
    assert!(members.iter().all(|m| seen.contains(m.as_str())));
    assert_within_bounds(sliced);
    eprintln!(
        "1M round trip (with slicing when first): {:?}",
        started.elapsed()
    );
}

#[test]
fn changing_ten_members_changes_at_most_ten_slices() {
    let (members, before) = million();
    // Five removed from across the list, five added past its end.
    let removed: HashSet<&str> = [0, 123_457, 500_000, 765_432, 999_999]
        .iter()
        .map(|&i| members[i].as_str())
        .collect();
    let mut changed: Vec<String> = members
        .iter()
        .filter(|m| !removed.contains(m.as_str()))
        .cloned()
        .collect();
    changed.extend(ipv4(FIRST + MILLION + 1000, 5));
    assert_eq!(changed.len(), members.len());
    let after = slice_members("blocklist", &changed, 5000).unwrap();
    assert_eq!(after.slices.len(), before.slices.len(), "the count stays");
    let by_name = |s: &Sliced| -> BTreeMap<String, String> {
        s.slices
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    serde_json::to_string(o).unwrap(),
                )
            })
            .collect()
    };
    let (old, new) = (by_name(before), by_name(&after));
    assert_eq!(
        old.keys().collect::<Vec<_>>(),
        new.keys().collect::<Vec<_>>()
    );
    let differing = old
        .iter()
        .filter(|(name, json)| new[*name] != **json)
        .count();
    assert!((1..=10).contains(&differing), "{differing} slices changed");
}

/// A long hash:net member: eight full groups, a /120, and ` nomatch`.
fn long_ipv6_net(i: u128) -> String {
    let addr = 0xabcd_ef01_2345_6789_abcd_ef01_8000_0000u128 | (i << 8);
    Member::Net {
        addr: IpAddr::V6(Ipv6Addr::from(addr)),
        prefix: 120,
        nomatch: true,
    }
    .to_string()
}

#[test]
fn long_ipv6_members_grow_the_count_to_respect_the_byte_bound() {
    let members: Vec<String> = (0..170_000).map(long_ipv6_net).collect();
    assert!(members[0].len() > 45, "{}", members[0]);
    assert!(
        members
            .iter()
            .all(|m| Member::parse_user(SetType::HashNet, m).is_ok())
    );
    // 170,000 members at 70% of 8000 need 32 slices by count, but 5,300
    // members of 55 bytes are 290 KB: the count doubles for the bytes.
    let sliced = slice_members("v6-nets", &members, 8000).unwrap();
    assert_eq!(sliced.minimum, 32);
    assert_eq!(sliced.raised, Some(Raised::Bytes));
    assert_eq!(sliced.slices.len(), 64);
    eprintln!(
        "170k IPv6 nets: {} slices, largest {} members / {} bytes",
        sliced.slices.len(),
        sliced
            .slices
            .iter()
            .map(|s| s.spec.members.len())
            .max()
            .unwrap(),
        sliced.bytes.iter().max().unwrap()
    );
    assert_within_bounds(&sliced);
    let out: HashSet<&String> = sliced.slices.iter().flat_map(|s| &s.spec.members).collect();
    assert_eq!(out.len(), members.len());
    assert!(members.iter().all(|m| out.contains(m)));
}

#[test]
fn the_byte_bound_counts_go_escapes_of_schema_only_members() {
    // `&` is printable ASCII, so the CRD's schema allows it; kubectl writes
    // each as six bytes. 1000 members of 200 `&` are 1.2 MB to kubectl.
    let members: Vec<String> = (0..1000)
        .map(|i| format!("{i:04}{}", "&".repeat(200)))
        .collect();
    let sliced = slice_members("amps", &members, 5000).unwrap();
    assert_eq!(sliced.raised, Some(Raised::Bytes));
    assert_within_bounds(&sliced);
}

fn args(input: &Path, check: Check) -> SliceArgs {
    SliceArgs {
        policy: "blocklist".into(),
        input: input.to_path_buf(),
        input_format: None,
        check,
        max_members: 5000,
        output: None,
        output_format: OutputFormat::Yaml,
    }
}

fn run(args: &SliceArgs) -> (Result<bool, SliceError>, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = slice(args, &mut out, &mut err);
    (
        result,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

const HASH_NET: Check = Check::Typed {
    set_type: SetType::HashNet,
    family: FamilySpec::IPv4,
};

#[test]
fn yaml_and_json_output_parse_back_into_slices() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("drop.txt");
    std::fs::write(
        &f,
        "; Spamhaus DROP\n10.1.2.3/8 ; SBL1\n192.168.0.0/16\n10.0.0.0/8\n",
    )
    .unwrap();
    let (ok, out, err) = run(&args(&f, HASH_NET));
    assert!(ok.unwrap(), "{err}");
    let docs: Vec<IPSetMemberSlice> = serde_saphyr::from_multiple(&out).unwrap();
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0].spec.members, ["10.0.0.0/8", "192.168.0.0/16"]);
    assert_eq!(
        docs[0].metadata.labels.as_ref().unwrap()[objects::SLICE_COUNT_LABEL],
        "1"
    );
    assert!(
        err.contains("2 members of policy blocklist in 1 slices (1 duplicates dropped)"),
        "{err}"
    );
    assert!(
        err.contains("kubectl delete ipsetmemberslices -l 'ipsetmgr.io/policy=blocklist,ipsetmgr.io/slice-count!=1'"),
        "{err}"
    );
    let json = SliceArgs {
        output_format: OutputFormat::Json,
        ..args(&f, HASH_NET)
    };
    let (ok, out, _) = run(&json);
    assert!(ok.unwrap());
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (list["apiVersion"].as_str(), list["kind"].as_str()),
        (Some("v1"), Some("List"))
    );
    let items: Vec<IPSetMemberSlice> = serde_json::from_value(list["items"].clone()).unwrap();
    let names = |s: &[IPSetMemberSlice]| -> Vec<(Option<String>, Vec<String>)> {
        s.iter()
            .map(|o| (o.metadata.name.clone(), o.spec.members.clone()))
            .collect()
    };
    assert_eq!(names(&items), names(&docs));
    assert_eq!(items[0].metadata.labels, docs[0].metadata.labels);
}

#[test]
fn bad_members_write_nothing_and_output_files_are_all_or_nothing() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("list.netset");
    std::fs::write(&f, "10.0.0.0/8\n10.0.0.300\n").unwrap();
    let target = d.path().join("slices.yaml");
    let to_file = SliceArgs {
        output: Some(target.clone()),
        ..args(&f, HASH_NET)
    };
    let (ok, out, err) = run(&to_file);
    assert!(!ok.unwrap());
    assert_eq!(out, "");
    assert!(
        err.contains("list.netset: line 2: \"10.0.0.300\": not a valid IP address"),
        "{err}"
    );
    assert!(!target.exists());
    std::fs::write(&f, "10.0.0.0/8\n").unwrap();
    let (ok, out, _) = run(&to_file);
    assert!(ok.unwrap());
    assert_eq!(out, "");
    let written: Vec<IPSetMemberSlice> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(&target).unwrap()).unwrap();
    assert_eq!(written[0].spec.members, ["10.0.0.0/8"]);
    // Only the target is left: the temporary file was renamed.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    let nowhere = SliceArgs {
        output: Some(d.path().join("no/such/dir/x.yaml")),
        ..args(&f, HASH_NET)
    };
    assert!(matches!(run(&nowhere).0, Err(SliceError::Write { .. })));
    let (ok, _, err) = run(&args(&d.path().join("missing"), HASH_NET));
    assert!(!ok.unwrap());
    assert!(
        err.starts_with("error: ") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn policy_names_must_be_valid_label_values() {
    assert_eq!(parse_policy_name("blocklist").unwrap(), "blocklist");
    assert!(parse_policy_name(&"a".repeat(63)).is_ok());
    let e = parse_policy_name(&"a".repeat(64)).unwrap_err();
    assert!(
        e.contains("64 characters long") && e.contains("at most 63"),
        "{e}"
    );
    for bad in ["", "Blocklist", "-a", "a-", "a_b", "a b"] {
        assert!(parse_policy_name(bad).is_err(), "{bad:?}");
    }
}
