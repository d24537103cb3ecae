//! Conformance bodies for the set types added after the first five: every
//! type, in each family it has, through the whole life the manager gives a
//! set (create, a second apply that changes nothing, deltas, drift found by
//! a resync and repaired, a header change replaced through a swap), with
//! the kernel's own listing compared to this project's rendering.

use std::sync::Arc;

use ipsetmgr_dataplane::{BatchError, Dataplane, DataplaneError, KernelSet, Op};
use ipsetmgr_ipset::{
    AddrMask, Family, HeaderOptions, Member, MemberSet, SetHeader, SetRange, SetType,
};
use ipsetmgr_sets::{DesiredSet, ReconcilerConfig, WriteKind};

use super::{header, kernel_listing, members, ok, read, sorted_display};

/// One type in one family: members before and after a change, one member
/// to inject as drift (not in `after`), and one of `after` to remove.
pub struct TypeCase {
    pub set_type: SetType,
    pub family: Option<Family>,
    pub before: &'static [&'static str],
    pub after: &'static [&'static str],
    pub drift_extra: &'static str,
    pub drift_gone: &'static str,
    /// Bitmaps: the range at creation and after the header change (which
    /// for the other types is a bigger maxelem).
    pub ranges: Option<(&'static str, &'static str)>,
}

/// The cases of every new type this kernel has.
pub fn new_type_cases() -> Vec<TypeCase> {
    use Family::*;
    use SetType::*;
    vec![
        TypeCase {
            set_type: HashNetPort,
            family: Some(V4),
            before: &[
                "10.1.2.3/24,80",
                "10.1.2.3,udp:53",
                "10.0.0.0/8,icmp:8/0",
                "10.2.0.0/16,tcp:22 nomatch",
                "0.0.0.0/0,sctp:9",
                "192.168.0.0/31,udplite:7",
                "10.9.0.0/32,tcp:0",
            ],
            after: &[
                "10.1.2.0/24,tcp:80",
                "10.2.0.0/16,tcp:22",
                "10.0.0.0/8,icmp:3/4",
                "172.16.0.0/12,tcp:65535",
            ],
            drift_extra: "10.77.0.0/16,udp:1",
            drift_gone: "172.16.0.0/12,tcp:65535",
            ranges: None,
        },
        TypeCase {
            set_type: HashNetPort,
            family: Some(V6),
            before: &[
                "2001:db8::/32,tcp:443",
                "::/0,udp:53",
                "2001:db8:1::1,ipv6-icmp:ping",
                "fd00::/8,80 nomatch",
                "::1.2.3.4/126,tcp:1",
            ],
            after: &["2001:db8::/32,tcp:443", "fd00::/8,80"],
            drift_extra: "fe80::/10,udp:67",
            drift_gone: "fd00::/8,80",
            ranges: None,
        },
        TypeCase {
            set_type: HashIpPortIp,
            family: Some(V4),
            before: &[
                "10.0.0.1,80,10.0.0.2",
                "10.0.0.1,udp:53,10.0.0.2/32",
                "0.0.0.0,tcp:0,0.0.0.0",
                "10.0.0.1,icmp:3/4,10.0.0.3",
                "10.0.0.1,icmp:echo-reply,10.0.0.3",
            ],
            after: &["10.0.0.1,tcp:80,10.0.0.2", "192.0.2.1,sctp:9,192.0.2.2"],
            drift_extra: "10.9.9.9,udp:9,10.9.9.8",
            drift_gone: "192.0.2.1,sctp:9,192.0.2.2",
            ranges: None,
        },
        TypeCase {
            set_type: HashIpPortIp,
            family: Some(V6),
            before: &[
                "2001:db8::1,tcp:443,2001:db8::2",
                "::1,ipv6-icmp:1/0,::ffff:1.2.3.4",
                "::1.2.3.4,udp:5,::2",
            ],
            after: &["2001:db8::1,tcp:443,2001:db8::2", "::1,udp:53,::1"],
            drift_extra: "fe80::1,tcp:1,fe80::2",
            drift_gone: "::1,udp:53,::1",
            ranges: None,
        },
        TypeCase {
            set_type: HashIpPortNet,
            family: Some(V4),
            before: &[
                "10.0.0.1,80,10.0.0.0/8",
                "10.0.0.1,80,10.1.1.1 nomatch",
                "10.0.0.1,udp:53,0.0.0.0/0",
                "0.0.0.0,tcp:65535,192.168.1.7/24",
                "10.0.0.2,icmp:echo-request,10.0.0.0/30",
            ],
            after: &["10.0.0.1,tcp:80,10.0.0.0/8", "10.0.0.1,tcp:80,10.1.1.1"],
            drift_extra: "10.5.5.5,udp:1,10.6.0.0/16",
            drift_gone: "10.0.0.1,tcp:80,10.1.1.1",
            ranges: None,
        },
        TypeCase {
            set_type: HashIpPortNet,
            family: Some(V6),
            before: &[
                "2001:db8::1,tcp:22,2001:db8::/48",
                "::2,udp:1,::/0 nomatch",
                "::2,ipv6-icmp:128/0,2001:db8::7",
            ],
            after: &["2001:db8::1,tcp:22,2001:db8::/48"],
            drift_extra: "::3,udp:3,fd00::/8",
            drift_gone: "2001:db8::1,tcp:22,2001:db8::/48",
            ranges: None,
        },
        TypeCase {
            set_type: HashNetIface,
            family: Some(V4),
            before: &[
                "10.1.2.3/8,eth0",
                "10.0.0.0/8,physdev:eth0",
                "10.0.0.0/16,eth0 nomatch",
                "0.0.0.0/0,lo",
                "192.168.0.1,abcdefghijklmno",
                "172.16.0.0/12,br-0.100",
            ],
            after: &[
                "10.0.0.0/8,eth0",
                "10.0.0.0/16,eth0",
                "10.0.0.0/8,physdev:eth1",
            ],
            drift_extra: "192.0.2.0/24,wg0",
            drift_gone: "10.0.0.0/8,physdev:eth1",
            ranges: None,
        },
        TypeCase {
            set_type: HashNetIface,
            family: Some(V6),
            before: &[
                "2001:db8::/32,eth0",
                "::/0,lo nomatch",
                "fe80::1,physdev:veth_1",
            ],
            after: &["2001:db8::/32,eth0", "::/0,lo"],
            drift_extra: "fd00::/8,eth9",
            drift_gone: "::/0,lo",
            ranges: None,
        },
        TypeCase {
            set_type: BitmapIp,
            family: Some(V4),
            before: &["10.0.0.0", "10.0.0.5", "10.0.0.255", "10.0.0.17/32"],
            after: &["10.0.0.5", "10.0.0.6"],
            drift_extra: "10.0.0.99",
            drift_gone: "10.0.0.6",
            // The same size, shifted: only the range differs.
            ranges: Some(("10.0.0.0/24", "10.0.0.1-10.0.1.0")),
        },
        TypeCase {
            set_type: BitmapPort,
            family: None,
            before: &["0", "22", "80", "1023"],
            after: &["22", "443"],
            drift_extra: "8",
            drift_gone: "443",
            ranges: Some(("0-1023", "0-65535")),
        },
    ]
}

/// A borrowed backend as a manager's own: the bodies get `&mut dyn Dataplane`.
struct Lend<'a>(&'a mut dyn Dataplane);

impl Dataplane for Lend<'_> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError> {
        self.0.apply(ops)
    }
    fn list_owned(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<Vec<String>, DataplaneError> {
        self.0.list_owned(owned)
    }
    fn read_set(&mut self, name: &str) -> Result<Option<KernelSet>, DataplaneError> {
        self.0.read_set(name)
    }
    fn supports(&mut self, set_type: SetType) -> Option<bool> {
        self.0.supports(set_type)
    }
}

fn set_name(case: &TypeCase) -> String {
    let fam = match case.family {
        Some(Family::V4) => "4",
        Some(Family::V6) => "6",
        None => "x",
    };
    let t: String = case
        .set_type
        .as_str()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    format!("ipm{fam}-{t}")
}

fn desired(name: &str, h: &SetHeader, m: MemberSet) -> Vec<DesiredSet> {
    vec![DesiredSet {
        name: name.to_string(),
        policy: name.to_string(),
        header: h.clone(),
        members: Arc::new(m),
    }]
}

/// The kernel holds exactly `m` under header `h`, and (with a real kernel)
/// `ipset list` prints every member exactly as this project renders it.
fn holds(dp: &mut dyn Dataplane, name: &str, h: &SetHeader, m: &MemberSet) {
    let k = read(dp, name);
    let kh = k
        .header
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no header"));
    assert!(h.compatible_with(kh), "{name}: {kh:?} vs {h:?}");
    assert_eq!(k.unparsable_members, 0, "{name}: unparsable members");
    assert!(
        k.unmanaged_options.is_empty(),
        "{name}: {:?}",
        k.unmanaged_options
    );
    let km = k.members.expect("members");
    assert_eq!(km.sorted_strings(), m.sorted_strings(), "{name}: members");
    if dp.name() != "model"
        && let Some(listed) = kernel_listing(name)
    {
        assert_eq!(sorted_display(m), listed, "{name}: rendering");
    }
}

fn written(out: &ipsetmgr_sets::ApplyOutcome) -> Vec<(String, WriteKind)> {
    assert!(out.applied, "apply failed: {:?}", out.error);
    out.written
        .iter()
        .map(|(set, kind)| (set.name.clone(), *kind))
        .collect()
}

/// The header of a case: for bitmaps its first or second range, for the
/// other types a maxelem of 1000 or 2000.
fn case_header(case: &TypeCase, changed: bool) -> SetHeader {
    let Some((first, second)) = case.ranges else {
        return header(
            case.set_type,
            case.family,
            if changed { 2000 } else { 1000 },
        );
    };
    bitmap_header(case.set_type, if changed { second } else { first })
}

pub fn bitmap_header(t: SetType, range: &str) -> SetHeader {
    let range = SetRange::parse(t, range).unwrap_or_else(|e| panic!("{range}: {e}"));
    SetHeader {
        max_elem: range.len() as u32,
        options: HeaderOptions {
            range: Some(range),
            comment: false,
            mask: None,
        },
        ..header(t, t.only_family(), 0)
    }
}

/// Create, apply again (nothing to do), delta, drift repaired by a resync,
/// and a header change replaced through a swap, for one case.
fn lifecycle(dp: &mut dyn Dataplane, case: &TypeCase) {
    lifecycle_with(dp, case, case_header(case, false), case_header(case, true));
}

/// [`lifecycle`] with the headers before and after the header change.
fn lifecycle_with(dp: &mut dyn Dataplane, case: &TypeCase, h: SetHeader, bigger: SetHeader) {
    let name = set_name(case);
    let (t, fam) = (case.set_type, case.family);
    let before = members(t, fam, case.before);
    let after = members(t, fam, case.after);
    let mut mgr = ipsetmgr_dataplane::adapter::reconciler(Lend(dp), ReconcilerConfig::default());

    mgr.set_desired(desired(&name, &h, before.clone()), []);
    assert_eq!(
        written(&mgr.apply_updates()),
        [(name.clone(), WriteKind::Create)]
    );
    holds(mgr.kernel_mut().dataplane_mut().0, &name, &h, &before);

    // The canonical forms are the kernel's: a full resync finds nothing.
    mgr.queue_resync();
    assert_eq!(written(&mgr.apply_updates()), []);
    let report = mgr.report();
    assert_eq!(report[0].problems, 0, "{name}: {report:?}");

    mgr.set_desired(desired(&name, &h, after.clone()), []);
    assert_eq!(
        written(&mgr.apply_updates()),
        [(name.clone(), WriteKind::Delta)]
    );
    holds(mgr.kernel_mut().dataplane_mut().0, &name, &h, &after);

    // Someone adds one entry and removes another behind the manager's back.
    let extra = members(t, fam, &[case.drift_extra]);
    let gone = members(t, fam, &[case.drift_gone]);
    ok(
        mgr.kernel_mut().dataplane_mut().0,
        &[
            Op::Add {
                set: &name,
                members: &extra,
            },
            Op::Del {
                set: &name,
                members: &gone,
            },
        ],
    );
    mgr.queue_resync();
    assert_eq!(
        written(&mgr.apply_updates()),
        [(name.clone(), WriteKind::Delta)]
    );
    let report = mgr.report();
    assert_eq!(report[0].problems, 2, "{name}: {report:?}");
    holds(mgr.kernel_mut().dataplane_mut().0, &name, &h, &after);

    // A header change of the same type and family: a temp set swapped in.
    mgr.set_desired(desired(&name, &bigger, after.clone()), []);
    assert_eq!(
        written(&mgr.apply_updates()),
        [(name.clone(), WriteKind::Replace)]
    );
    holds(mgr.kernel_mut().dataplane_mut().0, &name, &bigger, &after);
    let kh = read(mgr.kernel_mut().dataplane_mut().0, &name)
        .header
        .unwrap();
    assert_eq!(
        (kh.max_elem, &kh.options),
        (bigger.max_elem, &bigger.options)
    );
    mgr.queue_resync();
    assert_eq!(written(&mgr.apply_updates()), []);
}

pub fn new_types_through_the_manager(dp: &mut dyn Dataplane) {
    for case in new_type_cases() {
        lifecycle(dp, &case);
    }
}

/// In every type with a network part, `nomatch` is outside the key: adding
/// the other spelling overwrites the flag, deleting either removes it.
pub fn nomatch_flag_of_new_types(dp: &mut dyn Dataplane) {
    let cases = [
        (SetType::HashNet, "10.0.0.0/8"),
        (SetType::HashNetPort, "10.0.0.0/8,tcp:80"),
        (SetType::HashIpPortNet, "10.0.0.1,udp:53,10.0.0.0/8"),
        (SetType::HashNetIface, "10.0.0.0/8,physdev:eth0"),
    ];
    for (i, (t, plain_s)) in cases.into_iter().enumerate() {
        let name = format!("ipm4-nm{i}");
        let fam = Some(Family::V4);
        let h = header(t, fam, 100);
        let plain = members(t, fam, &[plain_s]);
        let flagged = members(t, fam, &[&format!("{plain_s} nomatch")]);
        ok(
            dp,
            &[
                Op::Create {
                    set: &name,
                    header: &h,
                },
                Op::Add {
                    set: &name,
                    members: &plain,
                },
                Op::Add {
                    set: &name,
                    members: &flagged,
                },
            ],
        );
        holds(dp, &name, &h, &flagged);
        ok(
            dp,
            &[Op::Del {
                set: &name,
                members: &plain,
            }],
        );
        holds(dp, &name, &h, &members(t, fam, &[]));
        // Deleting by the flagged spelling removes the entry as well.
        ok(
            dp,
            &[
                Op::Add {
                    set: &name,
                    members: &flagged,
                },
                Op::Del {
                    set: &name,
                    members: &flagged,
                },
            ],
        );
        holds(dp, &name, &h, &members(t, fam, &[]));
    }
}

/// The kernel's bitmap limits: members outside the range are refused,
/// naming the member; a range above 65536 elements is refused at creation.
pub fn bitmap_limits(dp: &mut dyn Dataplane) {
    let h = bitmap_header(SetType::BitmapPort, "10-20");
    let inside = members(SetType::BitmapPort, None, &["10", "20"]);
    let outside = members(SetType::BitmapPort, None, &["21"]);
    let e = dp
        .apply(&[
            Op::Create {
                set: "ipmx-bp",
                header: &h,
            },
            Op::Add {
                set: "ipmx-bp",
                members: &inside,
            },
            Op::Add {
                set: "ipmx-bp",
                members: &outside,
            },
        ])
        .unwrap_err();
    assert_eq!(e.op_index, 2, "{e:?}");
    assert_eq!(e.member, Some(Member::Port(21)), "{e:?}");
    assert!(
        matches!(&e.error, DataplaneError::InvalidElement { element, .. } if element == "21"),
        "{e:?}"
    );
    holds(dp, "ipmx-bp", &h, &inside);

    // 65537 addresses: one more than a bitmap can hold.
    let too_big = SetHeader {
        max_elem: 65537,
        options: HeaderOptions {
            range: Some(SetRange::Ipv4 {
                from: "10.0.0.0".parse().unwrap(),
                to: "10.1.0.0".parse().unwrap(),
            }),
            comment: false,
            mask: None,
        },
        ..header(SetType::BitmapIp, Some(Family::V4), 0)
    };
    let e = dp
        .apply(&[Op::Create {
            set: "ipm4-big",
            header: &too_big,
        }])
        .unwrap_err();
    assert_eq!(e.op_index, 0, "{e:?}");
    assert!(
        matches!(&e.error, DataplaneError::Other(m) if m.contains("size limit")),
        "{e:?}"
    );
    assert_eq!(dp.read_set("ipm4-big").unwrap(), None);
}

/// hash:ip,mark, which the CI kernel lacks: creating it fails clearly
/// (typed, naming the type, set-specific so the other sets of the batch
/// are not blamed), and nothing is left behind. On a kernel that has the
/// type it must go through the manager's whole life like the others.
pub fn hash_ip_mark_not_supported(dp: &mut dyn Dataplane) {
    let h4 = header(SetType::HashIp, Some(Family::V4), 100);
    let hm = header(SetType::HashIpMark, Some(Family::V4), 100);
    let r = dp.apply(&[
        Op::Create {
            set: "ipm4-before",
            header: &h4,
        },
        Op::Create {
            set: "ipm4-mark",
            header: &hm,
        },
        Op::Create {
            set: "ipm4-after",
            header: &h4,
        },
    ]);
    match r {
        Err(e) => {
            assert_eq!(e.op_index, 1, "{e:?}");
            assert_eq!(
                e.error,
                DataplaneError::TypeNotSupported("hash:ip,mark".into())
            );
            assert!(e.error.is_set_specific());
            assert_eq!(
                e.error.to_string(),
                "set type hash:ip,mark is not supported by this kernel"
            );
            assert!(dp.read_set("ipm4-before").unwrap().is_some());
            assert_eq!(dp.read_set("ipm4-mark").unwrap(), None);
            assert_eq!(dp.read_set("ipm4-after").unwrap(), None);
        }
        Ok(()) => {
            eprintln!("note: this kernel supports hash:ip,mark");
            ok(dp, &[Op::Destroy { set: "ipm4-mark" }]);
            lifecycle(
                dp,
                &TypeCase {
                    set_type: SetType::HashIpMark,
                    family: Some(Family::V4),
                    before: &["10.0.0.1,0x10", "10.0.0.1,0", "10.0.0.2,4294967295"],
                    after: &["10.0.0.1,16", "10.0.0.3,0x1"],
                    drift_extra: "10.0.0.9,0x9",
                    drift_gone: "10.0.0.3,0x1",
                    ranges: None,
                },
            );
        }
    }
}

/// One type's members with comments: at creation, after a change of
/// comments, and one entry as someone rewrote it out of band.
struct CommentCase {
    set_type: SetType,
    family: Option<Family>,
    range: Option<&'static str>,
    before: &'static [&'static str],
    after: &'static [&'static str],
    drift: &'static str,
}

fn with_comments(h: SetHeader, comment: bool) -> SetHeader {
    SetHeader {
        options: HeaderOptions {
            comment,
            ..h.options
        },
        ..h
    }
}

/// Comments are attributes of an entry, not of its key: the kernel lists
/// them as rendered; changing one is a delta; one rewritten out of band is
/// drift a resync repairs; dropping every comment swaps in a set without
/// the extension, and adding one to such a set fails naming the member.
pub fn comments_through_the_manager(dp: &mut dyn Dataplane) {
    use Family::*;
    use SetType::*;
    let cases = [
        CommentCase {
            set_type: HashIp,
            family: Some(V4),
            range: None,
            before: &["10.0.0.1 comment:source: spamhaus 2026-11-30", "10.0.0.2"],
            after: &[
                "10.0.0.1 comment:source: spamhaus 2026-12-01",
                "10.0.0.2 comment:a,b:c; d",
                "10.0.0.3",
            ],
            drift: "10.0.0.3 comment:by hand",
        },
        CommentCase {
            set_type: HashNet,
            family: Some(V6),
            range: None,
            before: &["2001:db8::/32 nomatch comment:lab", "::/0 comment:all"],
            after: &["2001:db8::/32 comment:lab", "::/0 comment:everything"],
            drift: "2001:db8::/32 nomatch comment:lab",
        },
        CommentCase {
            set_type: HashNetPort,
            family: Some(V4),
            range: None,
            before: &["10.0.0.0/8,tcp:80 comment:web"],
            after: &["10.0.0.0/8,tcp:80 comment:web, again", "10.0.0.0/8,udp:53"],
            drift: "10.0.0.0/8,udp:53 comment:dns",
        },
        CommentCase {
            set_type: BitmapPort,
            family: None,
            range: Some("0-1023"),
            before: &["22 comment:ssh"],
            after: &["22 comment:ssh (bastion)", "443"],
            drift: "22",
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let (t, fam) = (case.set_type, case.family);
        let name = format!("ipm-c{i}");
        let plain = match case.range {
            Some(r) => bitmap_header(t, r),
            None => header(t, fam, 1000),
        };
        let h = with_comments(plain.clone(), true);
        let before = members(t, fam, case.before);
        let after = members(t, fam, case.after);
        let mut mgr =
            ipsetmgr_dataplane::adapter::reconciler(Lend(&mut *dp), ReconcilerConfig::default());

        mgr.set_desired(desired(&name, &h, before.clone()), []);
        assert_eq!(
            written(&mgr.apply_updates()),
            [(name.clone(), WriteKind::Create)]
        );
        holds(mgr.kernel_mut().dataplane_mut().0, &name, &h, &before);
        mgr.queue_resync();
        assert_eq!(written(&mgr.apply_updates()), [], "{name}: second apply");

        mgr.set_desired(desired(&name, &h, after.clone()), []);
        assert_eq!(
            written(&mgr.apply_updates()),
            [(name.clone(), WriteKind::Delta)]
        );
        holds(mgr.kernel_mut().dataplane_mut().0, &name, &h, &after);

        // Someone rewrites one entry (its comment or flag) by hand.
        let drift = members(t, fam, &[case.drift]);
        ok(
            mgr.kernel_mut().dataplane_mut().0,
            &[Op::Add {
                set: &name,
                members: &drift,
            }],
        );
        mgr.queue_resync();
        assert_eq!(
            written(&mgr.apply_updates()),
            [(name.clone(), WriteKind::Delta)]
        );
        let report = mgr.report();
        assert!(report[0].problems > 0, "{name}: drift not seen: {report:?}");
        holds(mgr.kernel_mut().dataplane_mut().0, &name, &h, &after);

        // Without comments: a set without the extension is swapped in.
        let bare = MemberSet::from_members(
            after.kind(),
            after.iter().map(|m| m.without_comment().clone()),
        );
        mgr.set_desired(desired(&name, &plain, bare.clone()), []);
        assert_eq!(
            written(&mgr.apply_updates()),
            [(name.clone(), WriteKind::Replace)]
        );
        holds(mgr.kernel_mut().dataplane_mut().0, &name, &plain, &bare);
        drop(mgr);

        // A comment in a set without the extension is refused, by member.
        let commented = members(t, fam, &[case.before[0]]);
        let e = dp
            .apply(&[Op::Add {
                set: &name,
                members: &commented,
            }])
            .unwrap_err();
        assert!(
            matches!(&e.error, DataplaneError::InvalidElement { .. }),
            "{name}: {e:?}"
        );
        assert!(
            e.member.as_ref().is_some_and(|m| m.comment().is_some()),
            "{e:?}"
        );
        ok(dp, &[Op::Destroy { set: &name }]);
    }
}

fn masked_header(fam: Family, mask: AddrMask) -> SetHeader {
    let mut h = header(SetType::HashIp, Some(fam), 1000);
    h.options.mask = Some(mask);
    h
}

/// hash:ip with a netmask or bitmask: the kernel stores masked addresses,
/// which is what the compiler hands the manager; an unmasked address added
/// by hand lands as its masked entry, drift a resync removes; a change of
/// mask is swapped in.
pub fn masks_through_the_manager(dp: &mut dyn Dataplane) {
    let nm = |n| AddrMask::prefix(n, Family::V4).unwrap().unwrap();
    let bm = |b| AddrMask::bits(b, Family::V6).unwrap().unwrap();
    lifecycle_with(
        dp,
        &TypeCase {
            set_type: SetType::HashIp,
            family: Some(Family::V4),
            before: &["10.0.0.0", "10.0.7.0", "192.168.1.0"],
            after: &["10.0.0.0", "10.1.0.0"],
            drift_extra: "10.77.0.0",
            drift_gone: "10.1.0.0",
            ranges: None,
        },
        masked_header(Family::V4, nm(24)),
        masked_header(Family::V4, nm(16)),
    );
    lifecycle_with(
        dp,
        &TypeCase {
            set_type: SetType::HashIp,
            family: Some(Family::V6),
            before: &["1234::cd", "2001::1"],
            after: &["1234::cd", "ffff::ff"],
            drift_extra: "1::",
            drift_gone: "ffff::ff",
            ranges: None,
        },
        masked_header(Family::V6, bm("ffff::ff")),
        masked_header(Family::V6, bm("ffff:ffff::ffff")),
    );
    // An unmasked address is stored as its masked entry.
    let h = masked_header(Family::V4, nm(24));
    let raw = members(SetType::HashIp, Some(Family::V4), &["10.9.9.77"]);
    ok(
        dp,
        &[
            Op::Create {
                set: "ipm4-nm",
                header: &h,
            },
            Op::Add {
                set: "ipm4-nm",
                members: &raw,
            },
        ],
    );
    holds(
        dp,
        "ipm4-nm",
        &h,
        &members(SetType::HashIp, Some(Family::V4), &["10.9.9.0"]),
    );
}
