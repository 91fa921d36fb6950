//! The requests as the rounds last read or wrote them ([`Kept`]).
//!
//! A round decides on the request as it is now. Between two rounds only the operator writes a
//! live request's status, and every other change of the request (its spec, labels,
//! annotations, finalizers, deletion) reaches the operator through its watch of the requests.
//! So the copy a round read, or the one its status write returned, is still the request as it
//! is while no such change arrived since before that read or write: the next round decides on
//! it without reading the request again. A change counted after the copy was taken voids it,
//! and so does a write the copy does not carry (the round takes the copy; only a round that
//! ends well keeps one again).

use std::collections::HashMap;
use std::hash::Hash;

/// Per request: how many changes of it the watch delivered, and the copy kept, with the count
/// taken before it was read or written.
#[derive(Debug)]
pub struct Kept<K, V> {
    by_key: HashMap<K, Entry<V>>,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
        }
    }
}

#[derive(Debug)]
struct Entry<V> {
    changes: u64,
    copy: Option<(V, u64)>,
}

impl<V> Default for Entry<V> {
    fn default() -> Self {
        Self {
            changes: 0,
            copy: None,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Kept<K, V> {
    /// Counts a change of `key` delivered by the watch; the copy kept of it is void.
    pub fn changed(&mut self, key: &K) {
        let entry = self.by_key.entry(key.clone()).or_default();
        entry.changes += 1;
        entry.copy = None;
    }

    /// The count of `key`'s changes, taken before a read or a write of it.
    pub fn count(&mut self, key: &K) -> u64 {
        self.by_key.entry(key.clone()).or_default().changes
    }

    /// Keeps `copy` of `key`, read or written after its changes were counted at `seen`; not
    /// when a change came since (the copy may not carry it).
    pub fn keep(&mut self, key: &K, copy: V, seen: u64) {
        let entry = self.by_key.entry(key.clone()).or_default();
        entry.copy = (entry.changes == seen).then_some((copy, seen));
    }

    /// The copy kept of `key`, taken out (a round that ends well keeps one again), with the
    /// count it was kept at; when there is none, `Err` with the count to read it against.
    pub fn take(&mut self, key: &K) -> Result<(V, u64), u64> {
        let entry = self.by_key.entry(key.clone()).or_default();
        entry.copy.take().ok_or(entry.changes)
    }

    /// Voids every copy, as if each request had changed: the watch of the requests failed or
    /// lists them anew, and what changed meanwhile (a deletion too) may never come as a change
    /// of its own.
    pub fn changed_all(&mut self) {
        for entry in self.by_key.values_mut() {
            entry.changes += 1;
            entry.copy = None;
        }
    }

    /// Forgets `key` (the request is gone).
    pub fn forget(&mut self, key: &K) {
        self.by_key.remove(key);
    }

    /// How many requests are kept.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_given_back_once_while_nothing_changed() {
        let mut kept = Kept::default();
        let seen = kept.count(&"a");
        kept.keep(&"a", "written", seen);
        assert_eq!(kept.take(&"a"), Ok(("written", seen)));
        assert_eq!(
            kept.take(&"a"),
            Err(seen),
            "taken out: a round keeps one again"
        );
        assert_eq!(kept.take(&"b"), Err(0));
    }

    #[test]
    fn a_change_counted_after_the_count_voids_the_copy() {
        let mut kept = Kept::default();
        let seen = kept.count(&"a");
        kept.keep(&"a", "read", seen);
        kept.changed(&"a");
        assert_eq!(kept.take(&"a"), Err(seen + 1), "changed after it was kept");
        // A change between the count and the read or write: not kept at all.
        let seen = kept.count(&"a");
        kept.changed(&"a");
        kept.keep(&"a", "read", seen);
        assert_eq!(kept.take(&"a"), Err(seen + 1), "changed before it was kept");
        let seen = kept.count(&"a");
        kept.keep(&"a", "read again", seen);
        assert_eq!(kept.take(&"a"), Ok(("read again", seen)));
    }

    #[test]
    fn changes_of_one_request_leave_the_others_copies() {
        let mut kept = Kept::default();
        let (a, b) = (kept.count(&"a"), kept.count(&"b"));
        kept.keep(&"a", 1, a);
        kept.keep(&"b", 2, b);
        kept.changed(&"b");
        assert_eq!(kept.take(&"a"), Ok((1, a)));
        assert_eq!(kept.take(&"b"), Err(b + 1));
    }

    #[test]
    fn a_new_list_of_the_requests_voids_every_copy() {
        let mut kept = Kept::default();
        let (a, b) = (kept.count(&"a"), kept.count(&"b"));
        kept.keep(&"a", 1, a);
        kept.keep(&"b", 2, b);
        kept.changed_all();
        assert_eq!(kept.take(&"a"), Err(a + 1));
        assert_eq!(kept.take(&"b"), Err(b + 1));
        // A copy read before the new list, kept after it: void too.
        let seen = kept.count(&"a");
        kept.changed_all();
        kept.keep(&"a", 3, seen);
        assert_eq!(kept.take(&"a"), Err(seen + 1));
    }

    #[test]
    fn a_request_gone_is_forgotten() {
        let mut kept = Kept::default();
        let seen = kept.count(&"a");
        kept.keep(&"a", 1, seen);
        assert_eq!(kept.len(), 1);
        kept.forget(&"a");
        assert!(kept.is_empty());
        assert_eq!(kept.take(&"a"), Err(0));
    }
}
