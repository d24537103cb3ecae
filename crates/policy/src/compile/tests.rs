//! Tests of the compiler: rejection rules, family routing, caching.

use super::parse::PARALLEL_PARSE_MIN;
use super::*;
use crate::IPSetPolicySpec;
use ipsetmgr_api::policy::FamilySpec;
use ipsetmgr_ipset::{Family, Member, MemberError};

/// The long-running compiler's entry point, for policies without slices.
fn compile_cached<'a>(
    policies: impl IntoIterator<Item = &'a IPSetPolicy>,
    naming: &Naming,
    labels: Option<&BTreeMap<String, String>>,
    cache: &mut MemberCache,
) -> Compiled {
    let inputs: Vec<PolicyInput<'a>> = policies
        .into_iter()
        .map(|policy| PolicyInput {
            held_by: Vec::new(),
            size_cap: MAX_MAX_ELEM,
            extra_except: &[],
            members: None,
            policy,
            slices: Vec::new(),
        })
        .collect();
    compile_inputs(&inputs, naming, labels, cache)
}

fn policy(name: &str, t: SetType, fam: FamilySpec, members: &[&str]) -> IPSetPolicy {
    IPSetPolicy::new(
        name,
        IPSetPolicySpec::new(t, fam, members.iter().map(|s| s.to_string()).collect()),
    )
}

#[test]
fn dual_splits_and_dedupes() {
    let p = policy(
        "mix",
        SetType::HashNet,
        FamilySpec::Dual,
        &["10.0.0.1/8", "10.9.9.9/8", "2001:db8::/32", "0.0.0.0/0"],
    );
    let c = compile(&[p], &Naming::default(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.sets.len(), 2);
    assert_eq!(c.sets[0].name, "ipm4-mix");
    assert_eq!(
        c.sets[0].members.sorted_strings(),
        ["0.0.0.0/1", "10.0.0.0/8", "128.0.0.0/1"]
    );
    assert_eq!(c.sets[1].members.sorted_strings(), ["2001:db8::/32"]);
}

#[test]
fn a_bad_member_fails_the_whole_policy_only() {
    let bad = policy(
        "bad",
        SetType::HashIp,
        FamilySpec::IPv4,
        &["10.0.0.1", "1.2.3.4\ndestroy KUBE-X", "::1", "example.com"],
    );
    let good = policy("good", SetType::HashIp, FamilySpec::IPv4, &["10.0.0.2"]);
    let c = compile(&[bad, good], &Naming::default(), None);
    assert_eq!(c.sets.len(), 1);
    assert_eq!(c.sets[0].policy, "good");
    let msgs: Vec<String> = c.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert!(
        msgs[0].contains(r#"member "1.2.3.4\ndestroy KUBE-X" rejected: contains whitespace"#),
        "{}",
        msgs[0]
    );
    assert!(
        msgs[1].contains("IPv6 member but the policy family is IPv4"),
        "{}",
        msgs[1]
    );
    assert!(msgs[2].contains("host name"), "{}", msgs[2]);
    assert!(c.held.contains(&"bad".to_string()));
}

#[test]
fn max_elem_is_enforced_after_dedup() {
    let mut p = policy(
        "small",
        SetType::HashIp,
        FamilySpec::IPv4,
        &["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"],
    );
    p.spec.max_elem = Some(2);
    let c = compile(&[p], &Naming::default(), None);
    assert_eq!(
        c.errors[0].kind,
        PolicyErrorKind::TooManyMembers { count: 3, max: 2 }
    );
}

#[test]
fn list_set_references() {
    let a = policy("a", SetType::HashIp, FamilySpec::IPv4, &[]);
    let l = policy("l", SetType::ListSet, FamilySpec::IPv4, &["a"]);
    let nested = policy("n", SetType::ListSet, FamilySpec::IPv4, &["l"]);
    let selfref = policy("s", SetType::ListSet, FamilySpec::IPv4, &["s"]);
    let missing = policy("m", SetType::ListSet, FamilySpec::IPv4, &["nope"]);
    let v6 = policy("v6", SetType::ListSet, FamilySpec::IPv6, &["a"]);
    let c = compile(
        &[a, l, nested, selfref, missing, v6],
        &Naming::default(),
        None,
    );
    let l_set = c.sets.iter().find(|s| s.policy == "l").unwrap();
    assert_eq!(l_set.members.sorted_strings(), ["ipm4-a"]);
    let kinds: Vec<_> = c
        .errors
        .iter()
        .map(|e| (e.policy.as_str(), e.kind.clone()))
        .collect();
    assert!(kinds.contains(&("n", PolicyErrorKind::ListSetNested("l".into()))));
    assert!(kinds.contains(&("s", PolicyErrorKind::ListSetSelf)));
    assert!(kinds.contains(&("m", PolicyErrorKind::ListSetMissing("nope".into()))));
    assert!(kinds.contains(&("v6", PolicyErrorKind::ListSetFamily("a".into(), Family::V6))));
}

#[test]
fn a_network_with_and_without_nomatch_is_rejected_naming_both() {
    for (plain, flagged, network) in [
        ("10.0.0.0/8", "10.0.0.0/8 nomatch", "10.0.0.0/8"),
        ("10.1.2.3/8", "10.0.0.0/8 nomatch", "10.0.0.0/8"),
        ("2001:db8::1/32", "2001:db8::/32 nomatch", "2001:db8::/32"),
    ] {
        let p = policy(
            "flip",
            SetType::HashNet,
            FamilySpec::Dual,
            &[plain, "192.168.0.0/16", flagged],
        );
        let c = compile(&[p], &Naming::default(), None);
        assert!(c.sets.is_empty(), "{:?}", c.sets);
        assert_eq!(c.errors.len(), 1, "{:?}", c.errors);
        let msg = c.errors[0].to_string();
        assert!(msg.contains(&format!("member \"{plain}\"")), "{msg}");
        assert!(msg.contains(&format!("{flagged:?}")), "{msg}");
        assert!(msg.contains(&format!("network {network}")), "{msg}");
        assert!(c.held.contains(&"flip".to_string()));
    }
    // Different networks, one excluded from the other, are the point of nomatch.
    let ok = policy(
        "carve",
        SetType::HashNet,
        FamilySpec::IPv4,
        &["10.0.0.0/8", "10.1.0.0/16 nomatch"],
    );
    assert!(compile(&[ok], &Naming::default(), None).errors.is_empty());
}

#[test]
fn policies_sharing_a_kernel_set_name_both_fail() {
    let naming = Naming::default();
    let long = "a-very-long-policy-name-for-the-edge-nodes";
    let shortened = naming.main_set_name(long, Some(Family::V4));
    // A short policy named exactly like the long one's shortened set.
    let short = shortened.strip_prefix("ipm4-").unwrap();
    let a = policy(long, SetType::HashIp, FamilySpec::IPv4, &["10.0.0.1"]);
    let b = policy(short, SetType::HashIp, FamilySpec::IPv4, &["10.0.0.2"]);
    let other = policy("other", SetType::HashIp, FamilySpec::IPv4, &["10.0.0.3"]);
    let c = compile(&[a, b, other], &naming, None);
    assert_eq!(c.sets.len(), 1);
    assert_eq!(c.sets[0].policy, "other");
    let failed: Vec<&str> = c.errors.iter().map(|e| e.policy.as_str()).collect();
    assert_eq!(failed.len(), 2, "{:?}", c.errors);
    assert!(failed.contains(&long) && failed.contains(&short));
    for e in &c.errors {
        assert!(e.to_string().contains(&shortened), "{e}");
    }
    // Both policies are held: every set either may have stays as it is.
    assert!(c.held.iter().any(|h| h == long) && c.held.iter().any(|h| h == short));
}

#[test]
fn header_fields_out_of_the_kernels_range_are_rejected() {
    for (max_elem, hash_size, field) in [
        (Some(0), None, "maxElem"),
        (None, Some(4_294_967_295), "hashSize"),
        (None, Some(16), "hashSize"),
    ] {
        let mut p = policy("f", SetType::HashIp, FamilySpec::IPv4, &[]);
        p.spec.max_elem = max_elem;
        p.spec.hash_size = hash_size;
        let c = compile(&[p], &Naming::default(), None);
        assert!(c.sets.is_empty());
        let msg = c.errors[0].to_string();
        assert!(msg.contains(&format!("{field} must be between")), "{msg}");
    }
    let mut p = policy("f", SetType::HashIp, FamilySpec::IPv4, &[]);
    p.spec.hash_size = Some(MAX_HASH_SIZE);
    assert!(compile(&[p], &Naming::default(), None).errors.is_empty());
}

/// More IPv4 members than one thread parses, with 15 bad ones (`bad-<i>`)
/// spread over every chunk: the members, the bad ones' indices, and `n`.
fn big_list_with_bad_members() -> (Vec<String>, Vec<usize>, usize) {
    let n = PARALLEL_PARSE_MIN + 50_000;
    let mut members: Vec<String> = (0..n as u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect();
    let bad: Vec<usize> = (0..15).map(|k| k * n / 15 + 7).collect();
    for &i in &bad {
        members[i] = format!("bad-{i}");
    }
    (members, bad, n)
}

#[test]
fn big_policies_parse_on_several_threads_with_the_same_result() {
    let (mut members, bad, _) = big_list_with_bad_members();
    members.push("10.0.0.1".into()); // duplicate: silently merged
    let strs: Vec<&str> = members.iter().map(String::as_str).collect();
    let mut p = policy("big", SetType::HashIp, FamilySpec::IPv4, &strs);
    p.spec.max_elem = Some(1_000_000);
    let c = compile(&[p.clone()], &Naming::default(), None);
    assert_eq!(c.errors.len(), MAX_MEMBER_ERRORS + 1);
    for (e, i) in c.errors[..MAX_MEMBER_ERRORS].iter().zip(&bad) {
        assert_eq!(
            e.member.as_deref(),
            Some(format!("bad-{i}").as_str()),
            "in member order"
        );
        assert_eq!(e.kind, PolicyErrorKind::Member(MemberError::HostName));
    }
    assert_eq!(c.errors[MAX_MEMBER_ERRORS].kind, PolicyErrorKind::More(5));

    for &i in &bad {
        members[i] = format!("192.168.0.{}", i % 250);
    }
    let strs: Vec<&str> = members.iter().map(String::as_str).collect();
    p.spec.members = strs.iter().map(|s| s.to_string()).collect();
    let c = compile(&[p], &Naming::default(), None);
    assert!(c.errors.is_empty());
    let serial: std::collections::HashSet<String> = strs
        .iter()
        .map(|s| {
            Member::parse_user(SetType::HashIp, s)
                .unwrap()
                .members
                .iter()
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(c.sets[0].members.len(), serial.len());
    assert!(
        c.sets[0]
            .members
            .iter()
            .all(|m| serial.contains(&m.to_string()))
    );
}

#[test]
fn big_texts_of_lines_parse_on_several_threads_with_the_same_result() {
    let (members, bad, n) = big_list_with_bad_members();
    let mut p = policy("big", SetType::HashIp, FamilySpec::IPv4, &[]);
    p.spec.max_elem = Some(1_000_000);
    let compile_lines = |text: &str| {
        let inputs = [PolicyInput {
            held_by: Vec::new(),
            size_cap: MAX_MAX_ELEM,
            extra_except: &[],
            members: Some(MemberList::Lines(text)),
            policy: &p,
            slices: Vec::new(),
        }];
        compile_inputs(
            &inputs,
            &Naming::default(),
            None,
            &mut MemberCache::default(),
        )
    };
    for (eol, last) in [("\n", ""), ("\r\n", "\r\n")] {
        let c = compile_lines(&(members.join(eol) + last));
        assert_eq!(c.errors.len(), MAX_MEMBER_ERRORS + 1, "{eol:?}");
        for (e, i) in c.errors[..MAX_MEMBER_ERRORS].iter().zip(&bad) {
            assert_eq!(
                e.member.as_deref(),
                Some(format!("bad-{i}").as_str()),
                "in member order"
            );
        }
        assert_eq!(c.errors[MAX_MEMBER_ERRORS].kind, PolicyErrorKind::More(5));
    }
    let good = members
        .iter()
        .filter(|m| !m.starts_with("bad-"))
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");
    let c = compile_lines(&good);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.sets[0].members.len(), n - bad.len());
}

mod member_lists {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec!["a", "bc", "\r", "\n", "\r\n"]),
            0..40,
        )
        .prop_map(|v| v.concat())
    }

    fn all(m: MemberList<'_>) -> Vec<&str> {
        let mut v = Vec::new();
        m.for_each(|s| v.push(s));
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn a_text_has_the_lines_of_str_lines(t in text()) {
            prop_assert_eq!(all(MemberList::Lines(&t)), t.lines().collect::<Vec<_>>());
            prop_assert!(MemberList::Lines(&t).count_hint() >= t.lines().count());
        }

        #[test]
        fn split_parts_hold_the_members_in_order(t in text(), n in 1usize..6) {
            let whole = all(MemberList::Lines(&t));
            let parts = MemberList::Lines(&t).split(n);
            prop_assert!(parts.len() <= n);
            let joined: Vec<&str> = parts.into_iter().flat_map(all).collect();
            prop_assert_eq!(joined, whole);

            let strings: Vec<String> = t.split('\n').map(String::from).collect();
            let parts = MemberList::Strings(&strings).split(n);
            prop_assert!(parts.len() <= n);
            let joined: Vec<&str> = parts.into_iter().flat_map(all).collect();
            prop_assert_eq!(joined, strings.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }
}

#[test]
fn cache_reuses_parsed_members_per_generation() {
    let mut p = policy(
        "big",
        SetType::HashIp,
        FamilySpec::IPv4,
        &["10.0.0.1", "10.0.0.2"],
    );
    p.metadata.generation = Some(1);
    p.metadata.uid = Some("u1".into());
    let naming = Naming::default();
    let mut cache = MemberCache::default();
    let first = compile_cached([&p], &naming, None, &mut cache);
    assert!(cache.has_inline(&p));

    // The agent drops the strings; the cached result is still complete
    // and shares the same member set.
    let mut stripped = p.clone();
    stripped.spec.members.clear();
    let again = compile_cached([&stripped], &naming, None, &mut cache);
    assert_eq!(again.sets[0].members.len(), 2);
    assert!(Arc::ptr_eq(&first.sets[0].members, &again.sets[0].members));

    // A new generation is parsed again; a vanished policy is evicted.
    let mut next = p.clone();
    next.metadata.generation = Some(2);
    next.spec.members = vec!["10.0.0.3".into()];
    let third = compile_cached([&next], &naming, None, &mut cache);
    assert_eq!(third.sets[0].members.sorted_strings(), ["10.0.0.3"]);
    assert!(!cache.has_inline(&p));
    compile_cached(std::iter::empty(), &naming, None, &mut cache);
    assert!(!cache.has_inline(&next));

    // File-mode policies (no generation) and list:sets are never cached.
    let file = policy("file", SetType::HashIp, FamilySpec::IPv4, &["10.0.0.1"]);
    compile_cached([&file], &naming, None, &mut cache);
    assert!(!cache.has_inline(&file));
}

#[test]
fn selectors_and_names() {
    let mut edge = policy("edge", SetType::HashIp, FamilySpec::IPv4, &[]);
    edge.spec.node_selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some([("role".to_string(), "edge".to_string())].into()),
            match_expressions: None,
        },
    );
    let upper = policy("Upper", SetType::HashIp, FamilySpec::IPv4, &[]);
    let labels = BTreeMap::new();
    let c = compile(&[edge.clone(), upper], &Naming::default(), Some(&labels));
    assert_eq!(c.not_selected, ["edge"]);
    assert!(matches!(c.errors[0].kind, PolicyErrorKind::BadName(_)));
    let c = compile(&[edge], &Naming::default(), None);
    assert_eq!(c.sets.len(), 1);
}

fn server_policy(name: &str, t: SetType, members: &[&str], generation: i64) -> IPSetPolicy {
    let mut p = policy(name, t, FamilySpec::IPv4, members);
    p.metadata.generation = Some(generation);
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn slice<'a>(name: &'a str, version: &'a str, members: &'a [String]) -> SliceInput<'a> {
    SliceInput {
        name,
        version,
        members: Ok(MemberList::Strings(members)),
    }
}

#[test]
fn slices_add_their_members_under_the_same_rules() {
    let p = server_policy("big", SetType::HashIp, &["10.0.0.1"], 1);
    let (a, b) = (
        strings(&["10.0.0.2", "10.0.0.3"]),
        strings(&["10.0.0.3", "10.0.0.4"]),
    );
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("big-0", "7", &a), slice("big-1", "8", &b)],
    }];
    let c = compile_inputs(
        &inputs,
        &Naming::default(),
        None,
        &mut MemberCache::default(),
    );
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(
        c.sets[0].members.sorted_strings(),
        ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    );

    // A bad member in a slice fails the policy, naming the slice.
    let bad = strings(&["10.0.0.5", "not-an-ip"]);
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("big-0", "7", &a), slice("big-2", "9", &bad)],
    }];
    let c = compile_inputs(
        &inputs,
        &Naming::default(),
        None,
        &mut MemberCache::default(),
    );
    assert!(c.sets.is_empty());
    let msg = c.errors[0].to_string();
    assert_eq!(
        msg,
        "policy \"big\": slice \"big-2\": member \"not-an-ip\" rejected: looks like a host name; only literal addresses are accepted (host names would need DNS)"
    );
    assert!(c.held.contains(&"big".to_string()));

    // A slice that could not be read at all holds the policy too.
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![SliceInput {
            name: "big-3",
            version: "10",
            members: Err(NoMembers::Unreadable(
                "invalid type: integer, expected a string",
            )),
        }],
    }];
    let c = compile_inputs(
        &inputs,
        &Naming::default(),
        None,
        &mut MemberCache::default(),
    );
    assert!(c.sets.is_empty());
    assert!(
        c.errors[0]
            .to_string()
            .contains("slice \"big-3\": could not be read")
    );
    assert!(c.held.contains(&"big".to_string()));
}

#[test]
fn whole_policy_rules_apply_to_the_union_of_slices() {
    // The same network with and without nomatch, in two slices.
    let p = server_policy("nets", SetType::HashNet, &[], 1);
    let (a, b) = (strings(&["10.0.0.0/8"]), strings(&["10.1.2.3/8 nomatch"]));
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("nets-0", "1", &a), slice("nets-1", "2", &b)],
    }];
    let c = compile_inputs(
        &inputs,
        &Naming::default(),
        None,
        &mut MemberCache::default(),
    );
    assert!(
        c.errors[0]
            .to_string()
            .contains("conflicts with member \"10.1.2.3/8 nomatch\"")
    );
    // maxElem counts every slice's members.
    let mut p = server_policy("small", SetType::HashIp, &["10.0.0.1"], 1);
    p.spec.max_elem = Some(2);
    let (a, b) = (strings(&["10.0.0.2"]), strings(&["10.0.0.3"]));
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("small-0", "1", &a), slice("small-1", "2", &b)],
    }];
    let c = compile_inputs(
        &inputs,
        &Naming::default(),
        None,
        &mut MemberCache::default(),
    );
    assert_eq!(
        c.errors[0].kind,
        PolicyErrorKind::TooManyMembers { count: 3, max: 2 }
    );
}

#[test]
fn only_changed_slices_are_parsed_again() {
    let naming = Naming::default();
    let mut cache = MemberCache::default();
    let p = server_policy("big", SetType::HashIp, &[], 1);
    let (a, b) = (strings(&["10.0.0.1"]), strings(&["10.0.0.2"]));
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("big-0", "1", &a), slice("big-1", "1", &b)],
    }];
    let first = compile_inputs(&inputs, &naming, None, &mut cache);
    // Same versions: the very same result, even with the strings gone.
    let gone = Vec::new();
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("big-0", "1", &gone), slice("big-1", "1", &gone)],
    }];
    let again = compile_inputs(&inputs, &naming, None, &mut cache);
    assert!(Arc::ptr_eq(&first.sets[0].members, &again.sets[0].members));
    // One slice changes: it is parsed, the other comes from the cache.
    let b2 = strings(&["10.0.0.3"]);
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &p,
        slices: vec![slice("big-0", "1", &gone), slice("big-1", "2", &b2)],
    }];
    let third = compile_inputs(&inputs, &naming, None, &mut cache);
    assert_eq!(
        third.sets[0].members.sorted_strings(),
        ["10.0.0.1", "10.0.0.3"]
    );

    // The policy's type changes: slices kept as text are parsed anew.
    let net = server_policy("big", SetType::HashNet, &[], 2);
    let text = "10.0.0.0/8\n192.168.0.0/16\n";
    let inputs = [PolicyInput {
        held_by: Vec::new(),
        size_cap: MAX_MAX_ELEM,
        extra_except: &[],
        members: None,
        policy: &net,
        slices: vec![SliceInput {
            name: "big-0",
            version: "1",
            members: Ok(MemberList::Lines(text)),
        }],
    }];
    let fourth = compile_inputs(&inputs, &naming, None, &mut cache);
    assert!(fourth.errors.is_empty(), "{:?}", fourth.errors);
    assert_eq!(
        fourth.sets[0].members.sorted_strings(),
        ["10.0.0.0/8", "192.168.0.0/16"]
    );
}

#[test]
fn a_bad_selector_is_an_error_even_where_selectors_are_not_evaluated() {
    let mut p = policy("sel", SetType::HashIp, FamilySpec::IPv4, &[]);
    p.spec.node_selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Near".into(),
                    values: None,
                },
            ]),
        },
    );
    let c = compile(&[p], &Naming::default(), None);
    assert!(c.sets.is_empty());
    assert!(
        c.errors[0].to_string().contains("invalid nodeSelector"),
        "{:?}",
        c.errors
    );
}

#[test]
fn pair_types_compile_per_family_and_reject_naming_the_member() {
    let p = policy(
        "pairs",
        SetType::HashIpPortNet,
        FamilySpec::Dual,
        &["10.0.0.1,80,10.1.2.3/16", "2001:db8::1,udp:53,::/0"],
    );
    let c = compile(&[p], &Naming::default(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(
        c.sets[0].members.sorted_strings(),
        ["10.0.0.1,tcp:80,10.1.0.0/16"]
    );
    assert_eq!(
        c.sets[1].members.sorted_strings(),
        ["2001:db8::1,udp:53,::/1", "2001:db8::1,udp:53,8000::/1"]
    );

    let bad = policy(
        "mixed",
        SetType::HashIpPortIp,
        FamilySpec::IPv4,
        &["10.0.0.1,80,::1"],
    );
    let c = compile(&[bad], &Naming::default(), None);
    assert!(c.sets.is_empty());
    assert_eq!(
        c.errors[0].to_string(),
        "policy \"mixed\": member \"10.0.0.1,80,::1\" rejected: both addresses must be of one family"
    );
}

#[test]
fn nomatch_conflicts_of_net_port_members_are_rejected() {
    let p = policy(
        "np",
        SetType::HashNetPort,
        FamilySpec::IPv4,
        &[
            "10.0.0.0/8,80",
            "10.1.2.3/8,tcp:80 nomatch",
            "10.0.0.0/8,81",
        ],
    );
    let c = compile(&[p], &Naming::default(), None);
    assert!(c.sets.is_empty());
    assert_eq!(c.errors.len(), 1, "{:?}", c.errors);
    let e = &c.errors[0];
    assert_eq!(e.member.as_deref(), Some("10.0.0.0/8,80"));
    assert!(
        matches!(&e.kind, PolicyErrorKind::NomatchConflict { other, .. } if other == "10.1.2.3/8,tcp:80 nomatch"),
        "{e}"
    );
}

fn bitmap(
    name: &str,
    t: SetType,
    fam: FamilySpec,
    range: Option<&str>,
    members: &[&str],
) -> IPSetPolicy {
    let mut p = policy(name, t, fam, members);
    p.spec.range = range.map(str::to_string);
    p
}

fn messages(c: &Compiled) -> Vec<String> {
    c.errors.iter().map(|e| e.to_string()).collect()
}

#[test]
fn bitmaps_are_sized_by_their_range() {
    let ip = bitmap(
        "dense",
        SetType::BitmapIp,
        FamilySpec::IPv4,
        Some("10.0.0.7/24"),
        &["10.0.0.1", "10.0.0.255/32", "10.0.0.0"],
    );
    let port = bitmap(
        "ports",
        SetType::BitmapPort,
        FamilySpec::Dual,
        Some("0-1023"),
        &["22", "80", "0"],
    );
    let c = compile(&[ip, port], &Naming::default(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let names: Vec<&str> = c.sets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ipm4-dense", "ipmx-ports"]);
    let h = &c.sets[0].header;
    assert_eq!(h.max_elem, 256);
    assert_eq!(h.hash_size, None);
    assert_eq!(h.options.range.unwrap().to_string(), "10.0.0.0-10.0.0.255");
    assert_eq!(c.sets[1].header.max_elem, 1024);
    assert_eq!(c.sets[1].header.kind.family, None);
    assert_eq!(c.sets[1].members.sorted_strings(), ["0", "22", "80"]);
}

#[test]
fn bitmap_rules_name_the_policy_and_the_reason() {
    let cases: Vec<(IPSetPolicy, &str)> = vec![
        (
            bitmap("a", SetType::BitmapIp, FamilySpec::IPv4, None, &[]),
            "policy \"a\": bitmap:ip needs a range",
        ),
        (
            bitmap(
                "b",
                SetType::BitmapIp,
                FamilySpec::IPv4,
                Some("10.0.0.0/15"),
                &[],
            ),
            "policy \"b\": range: the range holds 131072 elements; a bitmap holds at most 65536",
        ),
        (
            bitmap(
                "c",
                SetType::BitmapIp,
                FamilySpec::Dual,
                Some("10.0.0.0/24"),
                &[],
            ),
            "policy \"c\": bitmap:ip holds IPv4 addresses only",
        ),
        (
            bitmap(
                "d",
                SetType::BitmapPort,
                FamilySpec::IPv4,
                Some("10-20"),
                &["9", "21", "15"],
            ),
            "policy \"d\": member \"21\" rejected: is outside the set's range 10-20",
        ),
        (
            bitmap("e", SetType::HashIp, FamilySpec::IPv4, Some("10-20"), &[]),
            "policy \"e\": range does not apply to hash:ip",
        ),
        (
            bitmap(
                "f",
                SetType::BitmapPort,
                FamilySpec::IPv4,
                Some("20-10"),
                &[],
            ),
            "policy \"f\": range: the range starts after it ends (20 > 10)",
        ),
        (
            {
                let mut p = bitmap("g", SetType::BitmapPort, FamilySpec::IPv4, Some("1-2"), &[]);
                p.spec.max_elem = Some(5);
                p
            },
            "policy \"g\": maxElem does not apply to bitmap:port",
        ),
        (
            bitmap(
                "h",
                SetType::BitmapIp,
                FamilySpec::IPv4,
                Some("10.0.0.0/30"),
                &["::1"],
            ),
            "policy \"h\": member \"::1\" rejected: is an IPv6 member but the policy family is IPv4",
        ),
    ];
    for (p, want) in cases {
        let c = compile(&[p], &Naming::default(), None);
        assert!(c.sets.is_empty());
        let got = messages(&c);
        assert!(got.iter().any(|m| m.starts_with(want)), "{want}\n{got:#?}");
    }
}

#[test]
fn comments_ask_for_the_extension_only_when_used() {
    let with = policy(
        "noted",
        SetType::HashNet,
        FamilySpec::Dual,
        &["10.0.0.0/8 comment:office", "2001:db8::/32"],
    );
    let without = policy("plain", SetType::HashNet, FamilySpec::IPv4, &["10.0.0.0/8"]);
    let c = compile(&[with, without], &Naming::default(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let by_name = |n: &str| c.sets.iter().find(|s| s.name == n).unwrap();
    // Policy-wide: both families of a policy that uses comments.
    assert!(by_name("ipm4-noted").header.options.comment);
    assert!(by_name("ipm6-noted").header.options.comment);
    assert!(!by_name("ipm4-plain").header.options.comment);
    assert_eq!(
        by_name("ipm4-noted").members.sorted_strings(),
        ["10.0.0.0/8 comment \"office\""]
    );
}

#[test]
fn one_entry_with_two_comments_is_rejected_naming_both() {
    let p = policy(
        "twice",
        SetType::HashIp,
        FamilySpec::IPv4,
        &["10.0.0.1 comment:a", "10.0.0.1 comment:b", "10.0.0.2"],
    );
    let c = compile(&[p], &Naming::default(), None);
    assert!(c.sets.is_empty());
    assert_eq!(
        messages(&c),
        [
            "policy \"twice\": member \"10.0.0.1 comment:a\" rejected: conflicts with member \"10.0.0.1 comment:b\": both are the entry 10.0.0.1, which the kernel holds once, with one comment; keep only one of them"
        ]
    );
    let bad = policy(
        "q",
        SetType::HashIp,
        FamilySpec::IPv4,
        &["10.0.0.1 comment:say \"hi\""],
    );
    let c = compile(&[bad], &Naming::default(), None);
    assert!(
        messages(&c)[0].contains("not a valid comment"),
        "{:?}",
        messages(&c)
    );
}

#[test]
fn netmask_and_bitmask_store_members_as_the_kernel_does() {
    let mut nm = policy(
        "nets",
        SetType::HashIp,
        FamilySpec::Dual,
        &[
            "10.0.0.5",
            "10.0.0.6 comment:same entry? no: conflict",
            "2001:db8::1",
        ],
    );
    nm.spec.netmask = Some(24);
    let c = compile(&[nm.clone()], &Naming::default(), None);
    assert!(
        messages(&c)[0].contains("both are the entry 10.0.0.0"),
        "{:?}",
        messages(&c)
    );
    nm.spec.members = strings(&["10.0.0.5", "10.0.0.6", "2001:db8::1"]);
    let c = compile(&[nm], &Naming::default(), None);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.sets[0].members.sorted_strings(), ["10.0.0.0"]);
    assert_eq!(
        c.sets[0].header.options.mask.unwrap().to_string(),
        "netmask 24"
    );
    assert_eq!(c.sets[1].members.sorted_strings(), ["2001:d00::"]);

    let mut bm = policy(
        "bits",
        SetType::HashIp,
        FamilySpec::IPv6,
        &["1234:5678::abcd"],
    );
    bm.spec.bitmask = Some("ffff::ff".into());
    let c = compile(&[bm], &Naming::default(), None);
    assert_eq!(c.sets[0].members.sorted_strings(), ["1234::cd"]);

    let with = |t, fam, netmask: Option<u8>, bitmask: Option<&str>, members: &[&str]| {
        let mut p = policy("m", t, fam, members);
        p.spec.netmask = netmask;
        p.spec.bitmask = bitmask.map(str::to_string);
        messages(&compile(&[p], &Naming::default(), None))
    };
    for (got, want) in [
        (
            with(SetType::HashNet, FamilySpec::IPv4, Some(24), None, &[]),
            "netmask does not apply to hash:net",
        ),
        (
            with(
                SetType::HashIp,
                FamilySpec::IPv4,
                Some(24),
                Some("255.0.0.0"),
                &[],
            ),
            "netmask and bitmask exclude each other",
        ),
        (
            with(SetType::HashIp, FamilySpec::IPv4, Some(33), None, &[]),
            "netmask must be between 1 and 32",
        ),
        (
            with(
                SetType::HashIp,
                FamilySpec::Dual,
                None,
                Some("255.0.0.0"),
                &[],
            ),
            "not Dual",
        ),
        (
            with(
                SetType::HashIp,
                FamilySpec::IPv6,
                None,
                Some("255.0.0.0"),
                &[],
            ),
            "bitmask must be an IPv6 address",
        ),
        (
            with(
                SetType::HashIp,
                FamilySpec::IPv4,
                Some(8),
                None,
                &["0.1.2.3"],
            ),
            "member \"0.1.2.3\" rejected: is the all-zero address under netmask 8",
        ),
    ] {
        assert!(got.iter().any(|m| m.contains(want)), "{want}: {got:?}");
    }
}

/// Without `maxElem` a set's size follows its members (README, "Sets that
/// grow"): the default while they fit it with a quarter to spare, then the
/// next power of two; each family's set its own; a given `maxElem` stays a
/// hard cap, and the cluster's cap bounds the growth.
#[test]
fn a_set_without_max_elem_grows_with_its_members() {
    use super::checks::grown_size;
    assert_eq!(grown_size(0, MAX_MAX_ELEM), 65536);
    assert_eq!(grown_size(52_429, MAX_MAX_ELEM), 65536);
    assert_eq!(grown_size(52_430, MAX_MAX_ELEM), 131072);
    assert_eq!(grown_size(200_000, MAX_MAX_ELEM), 262144);
    assert_eq!(grown_size(1_000_000, MAX_MAX_ELEM), 2_097_152);
    assert_eq!(grown_size(20_000_000, MAX_MAX_ELEM), MAX_MAX_ELEM);
    // A cluster's cap bounds the growth, never the default.
    assert_eq!(grown_size(200_000, 100_000), 100_000);
    assert_eq!(grown_size(10, 1_000), 65536);

    let v4: Vec<String> = (0..70_000u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect();
    let mut p = policy("grow", SetType::HashIp, FamilySpec::Dual, &[]);
    p.spec.members = v4;
    p.spec.members.push("2001:db8::1".into());
    let compile_with_cap = |p: &IPSetPolicy, cap: u32| {
        let mut input = PolicyInput::new(p, Vec::new());
        input.size_cap = cap;
        compile_inputs(
            &[input],
            &Naming::default(),
            None,
            &mut MemberCache::default(),
        )
    };
    let c = compile_with_cap(&p, MAX_MAX_ELEM);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let sizes: Vec<(usize, u32)> = c
        .sets
        .iter()
        .map(|s| (s.members.len(), s.header.max_elem))
        .collect();
    assert_eq!(sizes, [(70_000, 131072), (1, 65536)]);

    // Over the cluster's cap: refused, saying why, nothing applied.
    let c = compile_with_cap(&p, 65536);
    assert!(c.sets.is_empty());
    assert_eq!(
        c.errors[0].kind,
        PolicyErrorKind::TooManyToGrow {
            count: 70_000,
            max: 65536
        }
    );
    // A given maxElem is a hard cap, as before.
    p.spec.max_elem = Some(100_000);
    let c = compile_with_cap(&p, MAX_MAX_ELEM);
    assert_eq!(c.sets[0].header.max_elem, 100_000);
    p.spec.max_elem = Some(60_000);
    let c = compile_with_cap(&p, MAX_MAX_ELEM);
    assert_eq!(
        c.errors[0].kind,
        PolicyErrorKind::TooManyMembers {
            count: 70_000,
            max: 60_000
        }
    );
}
