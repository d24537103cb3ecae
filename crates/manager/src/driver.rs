//! The one loop that drives a [`SetsBackend`] (the ipset [`Manager`](crate::Manager) or another): used by `ipsetmgr run` and by the
//! cluster agent alike, each feeding it complete desired states through a
//! channel from its own source (a policy directory, the API server).
//!
//! The loop owns the manager's clock: a full resync every
//! `resync_interval`, retries of isolated sets when their backoff ends, a
//! quick retry after an apply that did not reach the kernel, coalescing of
//! desired states that arrive while it is busy (only the newest complete
//! state matters), and returning freed memory after each new state (a
//! million-member policy leaves parser garbage behind). It never touches the
//! kernel before the first desired state arrives, so a source that has not
//! loaded yet can never make it delete anything.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::{ApplyOutcome, DeletionReport, DesiredSet, SetReport, SetsBackend};

/// What a source tells the driver.
pub enum Command {
    /// The complete desired state (never a partial one). `seq` identifies
    /// it in the reports that follow.
    Desired {
        seq: u64,
        sets: Vec<DesiredSet>,
        /// Kernel names of failed policies' sets: left exactly as they are.
        held: Vec<String>,
    },
    /// Resync with the kernel now (SIGHUP; a source that reloaded).
    Resync,
    /// Finish the current apply and stop, leaving the kernel as it is.
    Shutdown,
}

/// What the driver reports after each apply.
#[derive(Clone, Debug)]
pub struct Report {
    /// The `seq` of the desired state this report describes.
    pub seq: u64,
    pub outcome: ApplyOutcome,
    pub sets: Vec<SetReport>,
    pub deletions: Vec<DeletionReport>,
    /// Owned sets no desired state wants, kept because pruning is off.
    pub unwanted: Vec<String>,
    /// The apply started with a full resync: problem counts are fresh.
    pub full_resync: bool,
}

/// Timing of the loop.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub resync_interval: Duration,
    /// Wait before trying again after an apply that did not reach the kernel.
    pub retry_after_failure: Duration,
}

impl DriverConfig {
    pub fn new(resync_interval: Duration) -> DriverConfig {
        DriverConfig {
            resync_interval,
            retry_after_failure: Duration::from_secs(1),
        }
    }
}

/// Whoever consumes the driver's reports.
pub trait Observer {
    /// Called every time the loop wakes up (liveness heartbeats).
    fn tick(&mut self) {}
    /// After each apply; returning `false` stops the loop (nobody listens).
    fn report(&mut self, report: Report) -> bool;
}

/// Run the loop until [`Command::Shutdown`], the command channel closes, or
/// the observer stops listening. The kernel is left as it is on the way out.
pub fn run<B: SetsBackend + ?Sized>(
    manager: &mut B,
    config: &DriverConfig,
    commands: &Receiver<Command>,
    observer: &mut dyn Observer,
) {
    let mut seq: Option<u64> = None;
    let mut first = true;
    let mut next_resync = Instant::now() + config.resync_interval;
    let mut retry_at: Option<Instant> = None;
    loop {
        observer.tick();
        let mut deadline = next_resync;
        if seq.is_some() {
            for t in [manager.next_retry(), retry_at].into_iter().flatten() {
                deadline = deadline.min(t);
            }
        }
        let mut periodic = false;
        let wait = deadline.saturating_duration_since(Instant::now());
        match commands.recv_timeout(wait) {
            Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(Command::Resync) => manager.queue_resync(),
            Ok(Command::Desired { seq: s, sets, held }) => {
                let Some((s, sets, held)) = newest(s, sets, held, commands, manager) else {
                    break;
                };
                seq = Some(s);
                // The heap is trimmed after the apply that follows.
                manager.set_desired(sets, held);
            }
            Err(RecvTimeoutError::Timeout) => {
                if Instant::now() >= next_resync {
                    next_resync = Instant::now() + config.resync_interval;
                    periodic = true;
                }
                if seq.is_none() {
                    // Nothing declared yet: never touch the kernel.
                    continue;
                }
                let retry_due = retry_at.is_some_and(|t| t <= Instant::now());
                if periodic {
                    manager.queue_resync();
                } else if !manager.retry_due() && !retry_due {
                    continue;
                }
            }
        }
        let Some(s) = seq else { continue };
        let outcome = manager.apply_updates();
        // Kernel listings read during the apply are freed by now.
        ipsetmgr_dataplane::memory::release_free_memory();
        retry_at = (!outcome.applied).then(|| Instant::now() + config.retry_after_failure);
        let report = Report {
            seq: s,
            sets: manager.report(),
            deletions: manager.deletion_report(),
            unwanted: manager.unwanted(),
            full_resync: first || periodic,
            outcome,
        };
        first = false;
        if !observer.report(report) {
            break;
        }
    }
}

/// The newest desired state among `first` and whatever else is queued
/// (resync requests in between are honoured). `None` when a shutdown is
/// queued behind it.
fn newest<B: SetsBackend + ?Sized>(
    seq: u64,
    sets: Vec<DesiredSet>,
    held: Vec<String>,
    commands: &Receiver<Command>,
    manager: &mut B,
) -> Option<(u64, Vec<DesiredSet>, Vec<String>)> {
    let mut latest = (seq, sets, held);
    while let Ok(cmd) = commands.try_recv() {
        match cmd {
            Command::Desired { seq, sets, held } => latest = (seq, sets, held),
            Command::Resync => manager.queue_resync(),
            Command::Shutdown => return None,
        }
    }
    Some(latest)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;

    use ipsetmgr_dataplane::model::ModelDataplane;
    use ipsetmgr_ipset::{Family, Member, MemberSet, SetHeader, SetKind, SetType};

    use super::*;
    use crate::{Manager, ManagerConfig};

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

    fn manager(model: &ModelDataplane) -> Manager<ModelDataplane> {
        Manager::new(model.clone(), ManagerConfig::default()).with_sleep(|_| {})
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
}
