//! What a leader-only writer task waits for: the newest plan, whenever it
//! changes while this replica holds the Lease, and the current one when it
//! becomes the holder (that plan was written by the previous holder, or by
//! nobody). The status writer and the slice writer both run on this.

use std::sync::Arc;

use tokio::sync::watch;

pub(crate) struct LeaderPlans<P> {
    plans: watch::Receiver<Arc<P>>,
    leader: watch::Receiver<bool>,
}

impl<P> LeaderPlans<P> {
    pub(crate) fn new(plans: watch::Receiver<Arc<P>>, leader: watch::Receiver<bool>) -> Self {
        LeaderPlans { plans, leader }
    }

    /// Whether this replica leads now: one-off jobs are dropped otherwise
    /// (the leader does the same work).
    pub(crate) fn leads(&self) -> bool {
        *self.leader.borrow()
    }

    /// The next plan to write; `None` once either sender is gone (the
    /// controller is stopping). A plan that changes while not leading is
    /// skipped: only the newest matters, and it is taken on becoming the
    /// leader. Cancel safe (it only awaits `watch::Receiver::changed`), so
    /// it can stand in a `select!` beside other work.
    pub(crate) async fn next(&mut self) -> Option<Arc<P>> {
        loop {
            tokio::select! {
                changed = self.plans.changed() => {
                    changed.ok()?;
                    let plan = self.plans.borrow_and_update().clone();
                    if *self.leader.borrow() {
                        return Some(plan);
                    }
                }
                changed = self.leader.changed() => {
                    changed.ok()?;
                    if *self.leader.borrow_and_update() {
                        return Some(self.plans.borrow().clone());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plans_are_written_only_while_leading_and_the_current_one_on_taking_the_lease() {
        let (plan_tx, plan_rx) = watch::channel(Arc::new(0));
        let (lead_tx, lead_rx) = watch::channel(false);
        let mut p = LeaderPlans::new(plan_rx, lead_rx);
        assert!(!p.leads());
        // Not leading: plans 1 and 2 are skipped; taking the lease gives 2.
        plan_tx.send(Arc::new(1)).unwrap();
        plan_tx.send(Arc::new(2)).unwrap();
        lead_tx.send(true).unwrap();
        assert_eq!(*p.next().await.unwrap(), 2);
        assert!(p.leads());
        plan_tx.send(Arc::new(3)).unwrap();
        assert_eq!(*p.next().await.unwrap(), 3);
        // Losing the lease gives nothing; a plan then is skipped too.
        lead_tx.send(false).unwrap();
        plan_tx.send(Arc::new(4)).unwrap();
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), p.next()).await;
        assert!(waited.is_err(), "nothing to write while not leading");
        drop(plan_tx);
        assert!(p.next().await.is_none(), "a closed channel ends the writer");
    }
}
