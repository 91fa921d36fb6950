//! The controller's ledger of copy slots: which of the operator's requests holds one (its member
//! between the first and the last copy pass, [`slots::holds_slot`]) and which waits for one.
//!
//! It is the operator's own account, kept from every status the controller reads or writes, so
//! that a decision that may take a slot sees every holder at once, also those whose status the
//! watch has not delivered yet. It starts from a list of every request ([`CopyLedger::seed`]),
//! before the first reconcile: a restarted operator counts the slots its requests still hold.
//! The controller writes the decisions that take a slot one at a time, each only if the ledger
//! did not change since it was made (see `controller::reconcile`), so that two requests never
//! take the last slot together.

use std::collections::{HashMap, HashSet};

use kube::runtime::reflector::ObjectRef;

use crate::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::plan::slots::{self, CopyHolder};

type Key = ObjectRef<StorageMigrationRequest>;

/// Slots held, and the requests waiting for one.
#[derive(Debug, Default)]
pub struct CopyLedger {
    holders: HashMap<Key, CopyHolder>,
    waiting: HashSet<Key>,
}

impl CopyLedger {
    /// The ledger of these requests, as listed.
    pub fn seed(requests: &[StorageMigrationRequest]) -> Self {
        let mut ledger = Self::default();
        for req in requests {
            ledger.note(&ObjectRef::from_obj(req), req.status.as_ref());
        }
        ledger
    }

    /// Records what a status of request `key` (read or just written) says: the slot its member
    /// holds, whether it waits for one. Returns the requests to wake: every waiting one when
    /// this request gave a slot back.
    pub fn note(&mut self, key: &Key, status: Option<&StorageMigrationRequestStatus>) -> Vec<Key> {
        let request = format!(
            "{}/{}",
            key.namespace.as_deref().unwrap_or_default(),
            key.name
        );
        let holder = status.and_then(|s| slots::holder(&request, s));
        if status.is_some_and(slots::awaits_slot) {
            self.waiting.insert(key.clone());
        } else {
            self.waiting.remove(key);
        }
        let freed = match holder {
            Some(h) => {
                self.holders.insert(key.clone(), h);
                false
            }
            None => self.holders.remove(key).is_some(),
        };
        if freed {
            self.waiting.iter().cloned().collect()
        } else {
            Vec::new()
        }
    }

    /// The holders other than request `key`'s own member, sorted.
    pub fn holders_except(&self, key: &Key) -> Vec<CopyHolder> {
        let mut others: Vec<CopyHolder> = (self.holders.iter())
            .filter(|(k, _)| *k != key)
            .map(|(_, h)| h.clone())
            .collect();
        others.sort();
        others
    }

    /// How many slots are held.
    pub fn held(&self) -> usize {
        self.holders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MemberStatus, MemberStep, Plan, PlannedMember, conditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status(step: MemberStep, waiting: bool) -> StorageMigrationRequestStatus {
        let mut s = StorageMigrationRequestStatus::default();
        s.members.push(MemberStatus {
            pod: "db-0".into(),
            step,
            ..MemberStatus::default()
        });
        s.plan = Some(Plan {
            members: vec![PlannedMember {
                pod: "db-0".into(),
                node: "node-a".into(),
                ..PlannedMember::default()
            }],
            ..Plan::default()
        });
        if waiting {
            conditions::set(
                &mut s.conditions,
                conditions::COPY_SLOT,
                false,
                "Waiting",
                "waits",
                None,
                &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            );
        }
        s
    }

    fn k(ns: &str, name: &str) -> Key {
        ObjectRef::new(name).within(ns)
    }

    #[test]
    fn a_slot_given_back_wakes_every_waiting_request_and_no_other() {
        let mut ledger = CopyLedger::default();
        let (a, b, c) = (k("one", "a"), k("two", "b"), k("two", "c"));
        assert!(
            ledger
                .note(&a, Some(&status(MemberStep::Copying, false)))
                .is_empty()
        );
        assert!(
            ledger
                .note(&b, Some(&status(MemberStep::CreatingClaim, true)))
                .is_empty()
        );
        assert!(
            ledger
                .note(&c, Some(&status(MemberStep::Pending, false)))
                .is_empty()
        );
        assert_eq!(ledger.held(), 1);
        assert_eq!(
            ledger.holders_except(&b),
            [CopyHolder {
                request: "one/a".into(),
                pod: "db-0".into(),
                node: "node-a".into()
            }]
        );
        assert!(
            ledger.holders_except(&a).is_empty(),
            "its own slot is not counted"
        );
        // Still copying: nothing to wake.
        assert!(
            ledger
                .note(&a, Some(&status(MemberStep::GatingStop, false)))
                .is_empty()
        );
        assert_eq!(
            ledger.note(&a, Some(&status(MemberStep::RetainingVolumes, false))),
            std::slice::from_ref(&b)
        );
        assert_eq!(ledger.held(), 0);
        // b took it; a request gone gives its slot back too.
        assert!(
            ledger
                .note(&b, Some(&status(MemberStep::PreCopying, false)))
                .is_empty()
        );
        assert!(
            ledger
                .note(&c, Some(&status(MemberStep::CreatingClaim, true)))
                .is_empty()
        );
        assert_eq!(ledger.note(&b, None), std::slice::from_ref(&c));
        // A request that ended with its member left mid-copy (a failure) gives its slot back.
        assert!(
            ledger
                .note(&a, Some(&status(MemberStep::Copying, false)))
                .is_empty()
        );
        let mut failed = status(MemberStep::Copying, false);
        failed.phase = crate::api::Phase::Failed;
        assert_eq!(ledger.note(&a, Some(&failed)), [c]);
        assert_eq!(ledger.held(), 0);
    }

    #[test]
    fn a_seeded_ledger_counts_the_slots_held_before_a_restart() {
        let spec = crate::plan::fixtures::spec_class_change("fast");
        let mut held = StorageMigrationRequest::new("a", spec.clone());
        held.metadata.namespace = Some("one".into());
        held.status = Some(status(MemberStep::StoppingPod, false));
        let mut idle = StorageMigrationRequest::new("b", spec);
        idle.metadata.namespace = Some("one".into());
        let ledger = CopyLedger::seed(&[held.clone(), idle]);
        assert_eq!(ledger.held(), 1);
        assert_eq!(ledger.holders_except(&ObjectRef::from_obj(&held)).len(), 0);
        assert_eq!(ledger.holders_except(&k("one", "b")).len(), 1);
    }
}
