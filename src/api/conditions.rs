//! Helpers for `status.conditions` in the `metav1.Condition` shape.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types the operator sets.
pub const READY: &str = "Ready";
pub const ACCEPTED: &str = "Accepted";
pub const PROGRESSING: &str = "Progressing";
pub const HEALTH_GATE: &str = "HealthGate";
pub const FAILED: &str = "Failed";
/// True while a progressing request holds still because a StatefulSet or member pod that the
/// operator did not create appeared under the target's names (see `plan::foreign`).
pub const BLOCKED: &str = "Blocked";
/// A `Pending` request waiting for another request on the same target (see the preflight).
pub const QUEUED: &str = "Queued";
/// Whether the PodDisruptionBudgets that select the member about to stop allow it: `False`
/// (reason `Waiting`) while one allows no disruption (see `plan::disruption`).
pub const DISRUPTION_BUDGET: &str = "DisruptionBudget";
/// `False` (reason `ChangedAgain`) once something other than the operator changed a volume's
/// reclaim policy from `Retain` a second time during its claim swap: the message names the
/// volume (see `plan::retain`).
pub const RECLAIM_POLICY: &str = "ReclaimPolicy";
/// `True` (reason `WaitingForLostNode`) while a member pod is stuck terminating on a node that
/// is NotReady or Unknown and may not be force-deleted: the message names the node and says how
/// to go on (taint it `node.kubernetes.io/out-of-service`, delete the Node object, or set
/// `spec.forceDeleteOnLostNode`); `False` (reason `Resolved`) once the pod is gone or
/// force-deleted (see `plan::helpers::LostPod`).
pub const NODE_LOST: &str = "NodeLost";
/// `True` (reason `Failing`) once reading what a request needs has kept failing past its
/// timeout, so that the planner cannot run (nor its timeout's rollback): the message names the
/// read that fails; `False` (reason `Recovered`) once the reads succeed again, when the planner
/// rolls the request back if its timeout expired (written by `controller`, not the planner).
pub const READ_FAILING: &str = "ReadFailing";
/// Set only when the operator caps concurrent copies (`--max-copies`, `--max-copies-per-node`):
/// `False` (reason `Waiting`) while the member about to copy waits for a slot, the message naming
/// the cap and the requests' members holding the slots; `True` (reason `Taken`) once it took one
/// (see `plan::slots`).
pub const COPY_SLOT: &str = "CopySlot";

/// Sets (or replaces) the condition of `type_`, keeping `lastTransitionTime` when the status did
/// not change. Returns true when anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    let status_str = if status { "True" } else { "False" };
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let changed_status = existing.status != status_str;
        let changed = changed_status
            || existing.reason != reason
            || existing.message != message
            || existing.observed_generation != observed_generation;
        if changed_status {
            existing.last_transition_time = now.clone();
        }
        existing.status = status_str.to_string();
        existing.reason = reason.to_string();
        existing.message = message.to_string();
        existing.observed_generation = observed_generation;
        return changed;
    }
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status_str.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation,
        last_transition_time: now.clone(),
    });
    true
}

pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition `type_` is there with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut c = Vec::new();
        assert!(set(
            &mut c,
            READY,
            false,
            "Migrating",
            "1/3",
            Some(1),
            &t(10)
        ));
        assert!(set(
            &mut c,
            READY,
            false,
            "Migrating",
            "2/3",
            Some(1),
            &t(20)
        ));
        assert_eq!(c[0].last_transition_time, t(10));
        assert!(!set(
            &mut c,
            READY,
            false,
            "Migrating",
            "2/3",
            Some(1),
            &t(25)
        ));
        assert!(set(
            &mut c,
            READY,
            true,
            "Successful",
            "3/3",
            Some(1),
            &t(30)
        ));
        assert_eq!(c[0].last_transition_time, t(30));
        assert_eq!(c.len(), 1);
        assert_eq!(get(&c, READY).map(|c| c.status.as_str()), Some("True"));
    }
}
