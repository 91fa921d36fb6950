//! Which reconciles would decide on nothing new ([`Quiet`]).
//!
//! kube-runtime queues a reconcile of a request for each watched change that names it while
//! its reconcile runs, to run after it. The running reconcile's own pause already ends on those
//! changes (its waker) and its next round reads them; the queued reconcile then reads the whole
//! snapshot again, a few milliseconds later, to find what that round saw. A request whose last
//! round decided nothing, which nothing watched has changed since that round began to read, and
//! whose wait is not over, has nothing to decide on: its reconcile waits out the rest.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Per request: how many watched changes named it, and its last round that decided nothing.
#[derive(Debug)]
pub struct Quiet<K> {
    by_key: HashMap<K, Entry>,
}

impl<K> Default for Quiet<K> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// Watched changes that named the request, counted since it was first looked at.
    changes: u64,
    /// The count when its last round that decided nothing began, and when its wait ends.
    settled: Option<(u64, Instant)>,
}

impl<K: Hash + Eq + Clone> Quiet<K> {
    /// Counts a watched change of what `key` waits on (a request never looked at has nothing to
    /// count against).
    pub fn changed(&mut self, key: &K) {
        if let Some(entry) = self.by_key.get_mut(key) {
            entry.changes += 1;
        }
    }

    /// The count of `key`'s changes, taken as a round begins to read.
    pub fn count(&mut self, key: &K) -> u64 {
        self.by_key.entry(key.clone()).or_default().changes
    }

    /// `key`'s round that began at count `seen` decided nothing, and waits until `until`.
    pub fn settle(&mut self, key: &K, seen: u64, until: Instant) {
        self.by_key.entry(key.clone()).or_default().settled = Some((seen, until));
    }

    /// What is left of `key`'s wait at `now`, when nothing changed since its last round that
    /// decided nothing began; `None` when it must be looked at. Either way the settled round is
    /// forgotten unless it still holds: the next reconcile that reads settles it again.
    pub fn remaining(&mut self, key: &K, now: Instant) -> Option<Duration> {
        let entry = self.by_key.get_mut(key)?;
        let left = match entry.settled {
            Some((seen, until)) if seen == entry.changes => until.checked_duration_since(now),
            _ => None,
        };
        let left = left.filter(|d| !d.is_zero());
        if left.is_none() {
            entry.settled = None;
        }
        left
    }

    /// Forgets `key` (the request is gone).
    pub fn forget(&mut self, key: &K) {
        self.by_key.remove(key);
    }

    /// How many requests are kept.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_reconcile_after_a_round_that_decided_nothing_waits_out_its_wait_unless_a_change_came() {
        let (mut q, t0) = (Quiet::default(), Instant::now());
        assert_eq!(q.remaining(&"a", t0), None, "never looked at");
        let seen = q.count(&"a");
        q.settle(&"a", seen, t0 + SECOND);
        let left = q.remaining(&"a", t0 + SECOND / 4);
        assert_eq!(left, Some(SECOND * 3 / 4), "nothing changed");
        assert_eq!(q.remaining(&"a", t0 + SECOND), None, "the wait is over");
        assert_eq!(q.remaining(&"a", t0), None, "and forgotten once over");
    }

    #[test]
    fn a_change_while_or_after_a_round_reads_makes_the_next_reconcile_read() {
        let (mut q, t0) = (Quiet::default(), Instant::now());
        let seen = q.count(&"a");
        // Seen during the round's reads: the round may have missed it.
        q.changed(&"a");
        q.settle(&"a", seen, t0 + SECOND);
        assert_eq!(q.remaining(&"a", t0), None);
        // A round that began after it, and nothing since.
        let seen = q.count(&"a");
        q.settle(&"a", seen, t0 + SECOND);
        assert!(q.remaining(&"a", t0).is_some());
        q.changed(&"b");
        assert!(q.remaining(&"a", t0).is_some(), "another request's change");
        q.changed(&"a");
        assert_eq!(q.remaining(&"a", t0), None, "a change after it");
    }

    #[test]
    fn changes_of_requests_never_looked_at_are_not_kept_and_gone_ones_are_forgotten() {
        let mut q = Quiet::default();
        q.changed(&"a");
        assert!(q.is_empty());
        q.count(&"a");
        assert_eq!(q.len(), 1);
        q.forget(&"a");
        assert!(q.is_empty());
    }
}
