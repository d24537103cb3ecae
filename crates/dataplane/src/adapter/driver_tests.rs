//! The driver loop over the ipset reconciler and the kernel model: when it
//! touches the kernel, coalescing, periodic resyncs.

use std::sync::Arc;
use std::sync::mpsc;

use std::time::Duration;

use ipsetmgr_ipset::{Family, Member, MemberSet, SetHeader, SetKind, SetType};
use ipsetmgr_sets::DesiredSet;
use ipsetmgr_sets::driver::{Command, DriverConfig, Observer, Report, run};

use super::{IpsetReconciler, reconciler};
use crate::model::ModelDataplane;

fn one_set(member: &str) -> Vec<DesiredSet> {
    let kind = SetKind::new(SetType::HashIp, Some(Family::V4));
    let m = Member::parse_user(SetType::HashIp, member).unwrap().members;
    vec![DesiredSet {
        name: "ipm4-a".into(),
        policy: "a".into(),
        header: SetHeader {
            kind,
            max_elem: 65536,
            hash_size: None,
            options: Default::default(),
        },
        members: Arc::new(MemberSet::from_members(kind, m)),
    }]
}

/// Collects reports, stops after `limit` of them.
struct Collect {
    reports: Vec<Report>,
    limit: usize,
}

impl Observer for Collect {
    fn report(&mut self, r: Report) -> bool {
        self.reports.push(r);
        self.reports.len() < self.limit
    }
}

fn manager(model: &ModelDataplane) -> IpsetReconciler<ModelDataplane> {
    reconciler(model.clone(), Default::default()).with_sleep(|_| {})
}

#[test]
fn nothing_touches_the_kernel_before_the_first_desired_state() {
    let model = ModelDataplane::new();
    model.create_raw(
        "ipm4-old",
        SetHeader {
            kind: SetKind::new(SetType::HashIp, Some(Family::V4)),
            max_elem: 65536,
            hash_size: None,
            options: Default::default(),
        },
    );
    let (tx, rx) = mpsc::channel();
    let config = DriverConfig::new(Duration::from_millis(5));
    let handle = std::thread::spawn(move || {
        let mut c = Collect {
            reports: Vec::new(),
            limit: 1,
        };
        run(&mut manager(&model), &config, &rx, &mut c);
        (c.reports, model)
    });
    // Several resync periods pass with no desired state: no report.
    std::thread::sleep(Duration::from_millis(50));
    tx.send(Command::Desired {
        seq: 7,
        sets: one_set("10.0.0.1"),
        held: Vec::new(),
    })
    .unwrap();
    let (reports, model) = handle.join().unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].seq, 7);
    assert!(reports[0].full_resync, "the first apply is a full resync");
    assert_eq!(model.set_names(), ["ipm4-a"], "the old set pruned only now");
}

#[test]
fn queued_states_are_coalesced_to_the_newest() {
    let model = ModelDataplane::new();
    let (tx, rx) = mpsc::channel();
    for (seq, m) in [(1, "10.0.0.1"), (2, "10.0.0.2"), (3, "10.0.0.3")] {
        tx.send(Command::Desired {
            seq,
            sets: one_set(m),
            held: Vec::new(),
        })
        .unwrap();
    }
    tx.send(Command::Shutdown).unwrap();
    let mut c = Collect {
        reports: Vec::new(),
        limit: 10,
    };
    run(
        &mut manager(&model),
        &DriverConfig::new(Duration::from_secs(60)),
        &rx,
        &mut c,
    );
    // The shutdown behind the states stops the loop before any apply.
    assert!(c.reports.is_empty());
    assert!(model.set_names().is_empty());

    let (tx, rx) = mpsc::channel();
    for (seq, m) in [(1, "10.0.0.1"), (2, "10.0.0.2")] {
        tx.send(Command::Desired {
            seq,
            sets: one_set(m),
            held: Vec::new(),
        })
        .unwrap();
    }
    let mut c = Collect {
        reports: Vec::new(),
        limit: 1,
    };
    run(
        &mut manager(&model),
        &DriverConfig::new(Duration::from_secs(60)),
        &rx,
        &mut c,
    );
    assert_eq!(c.reports.len(), 1, "one apply for both states");
    assert_eq!(c.reports[0].seq, 2);
    assert_eq!(model.members("ipm4-a").unwrap(), ["10.0.0.2"]);
}

#[test]
fn periodic_resyncs_repair_drift_and_say_so() {
    let model = ModelDataplane::new();
    let (tx, rx) = mpsc::channel();
    tx.send(Command::Desired {
        seq: 1,
        sets: one_set("10.0.0.1"),
        held: Vec::new(),
    })
    .unwrap();
    let tamper = model.clone();
    struct Drift {
        model: ModelDataplane,
        reports: Vec<Report>,
    }
    impl Observer for Drift {
        fn report(&mut self, r: Report) -> bool {
            if self.reports.is_empty() {
                // Someone adds a member out of band after the first apply.
                self.model.tamper(|sets| {
                    let s = sets.get_mut("ipm4-a").unwrap();
                    s.members.insert(Member::Ip("192.0.2.1".parse().unwrap()));
                });
            }
            self.reports.push(r);
            self.reports.len() < 2
        }
    }
    let mut obs = Drift {
        model: tamper,
        reports: Vec::new(),
    };
    run(
        &mut manager(&model),
        &DriverConfig::new(Duration::from_millis(20)),
        &rx,
        &mut obs,
    );
    let second = &obs.reports[1];
    assert!(second.full_resync);
    assert_eq!(second.sets[0].problems, 1);
    assert_eq!(model.members("ipm4-a").unwrap(), ["10.0.0.1"]);
    drop(tx);
}
