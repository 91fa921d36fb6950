//! Copy slots: the operator's caps on concurrent copies in the whole cluster and per node
//! (`--max-copies`, `--max-copies-per-node`).
//!
//! A member holds a slot from its first copy pass to the end of its last
//! ([`holds_slot`]: `PreCopying` to `Copying`, the gate and the stop between them included), so
//! that a member, once its copy began, never waits for a slot while it is down. A member takes
//! one when its temporary claims are bound, before its pre-copy (or before its gate when it has
//! none): there it waits, still serving, while the caps are reached ([`hold`]), with the
//! condition `CopySlot` naming the holders. Member order and quorum gates are unchanged: the
//! caps only delay the start of a member's copy.
//!
//! The holders of other requests come from the controller's ledger ([`Observed::copy_holders`]),
//! which writes one slot-taking decision at a time; the decision itself is pure.
//!
//! [`Observed::copy_holders`]: super::Observed::copy_holders

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::api::{MemberStatus, MemberStep, StorageMigrationRequestStatus, conditions};

use super::{Action, Ctx, Decision, EventType};

/// How often a member waiting for a slot looks again (a slot freed also wakes it).
pub const REQUEUE_WAITING: Duration = Duration::from_secs(5);

/// A member of a request that holds a copy slot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CopyHolder {
    /// `namespace/name` of the request.
    pub request: String,
    /// The member's pod.
    pub pod: String,
    /// The node the member's copies run on (its pod's node at preflight).
    pub node: String,
}

impl fmt::Display for CopyHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} on {})", self.request, self.pod, self.node)
    }
}

/// The caps (`None`: no cap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyCaps {
    /// `--max-copies`: members copying at once in the whole cluster.
    pub cluster: Option<NonZeroU32>,
    /// `--max-copies-per-node`: members copying at once on one node.
    pub per_node: Option<NonZeroU32>,
}

impl CopyCaps {
    /// True when either cap is set.
    pub fn any(&self) -> bool {
        self.cluster.is_some() || self.per_node.is_some()
    }
}

/// True for the steps in which a member holds a copy slot.
pub fn holds_slot(step: MemberStep) -> bool {
    matches!(
        step,
        MemberStep::PreCopying
            | MemberStep::GatingStop
            | MemberStep::StoppingPod
            | MemberStep::Copying
    )
}

/// True for a member that may take a slot in its next decision (its temporary claims are being
/// bound).
pub fn may_take_slot(status: Option<&StorageMigrationRequestStatus>) -> bool {
    status.is_some_and(|s| {
        s.members
            .iter()
            .any(|m| m.step == MemberStep::CreatingClaim)
    })
}

/// True for a decision that takes a copy slot: the status it writes has a member holding one,
/// the status it was made on none.
pub fn takes_slot(before: Option<&StorageMigrationRequestStatus>, decision: &Decision) -> bool {
    let after = decision.actions.iter().rev().find_map(|a| match a {
        Action::SetStatus(s) => Some(s.as_ref()),
        _ => None,
    });
    let holds = |s: Option<&StorageMigrationRequestStatus>| s.and_then(holding_member).is_some();
    holds(after) && !holds(before)
}

/// True when the status says the member waits for a copy slot (condition `CopySlot` `False`).
pub fn awaits_slot(status: &StorageMigrationRequestStatus) -> bool {
    conditions::get(&status.conditions, conditions::COPY_SLOT).is_some_and(|c| c.status == "False")
}

/// True for a request whose member waits for a copy slot (condition `CopySlot` `False`, its
/// temporary claims bound): the controller pauses it until a slot is given back.
pub fn waiting(status: Option<&StorageMigrationRequestStatus>) -> bool {
    may_take_slot(status) && status.is_some_and(awaits_slot)
}

/// The member of a request with this status that holds a slot, if any. An ended request holds
/// none, whatever step a member was left at.
pub fn holding_member(status: &StorageMigrationRequestStatus) -> Option<&MemberStatus> {
    if status.phase.is_final() {
        return None;
    }
    status.members.iter().find(|m| holds_slot(m.step))
}

/// The member of a request (`namespace/name`) with this status that holds a slot, if any
/// ([`holding_member`]), with its node.
pub fn holder(request: &str, status: &StorageMigrationRequestStatus) -> Option<CopyHolder> {
    let ms = holding_member(status)?;
    let node = (status.plan.as_ref())
        .and_then(|p| p.members.iter().find(|m| m.pod == ms.pod))
        .map(|m| m.node.clone())
        .unwrap_or_default();
    Some(CopyHolder {
        request: request.to_string(),
        pod: ms.pod.clone(),
        node,
    })
}

/// Why a member on `node` may not take a slot now, with `holders` (other requests' members)
/// holding them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotWait {
    /// The cluster's cap is reached.
    Cluster { max: u32, holders: Vec<CopyHolder> },
    /// The node's cap is reached.
    Node {
        node: String,
        max: u32,
        holders: Vec<CopyHolder>,
    },
}

impl fmt::Display for SlotWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scope, max, holders) = match self {
            SlotWait::Cluster { max, holders } => ("in the cluster".to_string(), max, holders),
            SlotWait::Node { node, max, holders } => (format!("on node {node}"), max, holders),
        };
        let names: Vec<String> = holders.iter().map(ToString::to_string).collect();
        write!(
            f,
            "{} of at most {max} copies {scope} are running: {}",
            holders.len(),
            names.join(", ")
        )
    }
}

/// The wait, if any, of a member on `node` under `caps` with `holders` holding slots.
pub fn wait_for(caps: CopyCaps, holders: &[CopyHolder], node: &str) -> Option<SlotWait> {
    let reached = |max: NonZeroU32, n: usize| u32::try_from(n).map_or(true, |n| n >= max.get());
    if let Some(max) = caps.cluster
        && reached(max, holders.len())
    {
        return Some(SlotWait::Cluster {
            max: max.get(),
            holders: holders.to_vec(),
        });
    }
    let on_node: Vec<CopyHolder> = holders.iter().filter(|h| h.node == node).cloned().collect();
    match caps.per_node {
        Some(max) if reached(max, on_node.len()) => Some(SlotWait::Node {
            node: node.to_string(),
            max: max.get(),
            holders: on_node,
        }),
        _ => None,
    }
}

/// Holds member `pod` (on `node`) before its first copy while a cap is reached: the condition
/// `CopySlot` says what it waits for (an Event when that changes) and the decision looks again
/// soon. False when it may go on (the condition then says it took a slot, when caps are set).
pub(super) fn hold(cx: &mut Ctx, pod: &str, node: &str) -> bool {
    let caps = cx.settings.copy_caps;
    if !caps.any() {
        return false;
    }
    if let Some(wait) = wait_for(caps, &cx.o.copy_holders, node) {
        let message = format!("member {pod} waits for a copy slot: {wait}");
        if cx.set_condition(conditions::COPY_SLOT, false, "Waiting", &message) {
            cx.event(EventType::Normal, "WaitingForCopySlot", message);
        }
        cx.wait(REQUEUE_WAITING);
        return true;
    }
    let message = format!(
        "member {pod} took a copy slot ({} other copies running in the cluster, {} on {node})",
        cx.o.copy_holders.len(),
        cx.o.copy_holders.iter().filter(|h| h.node == node).count()
    );
    cx.set_condition(conditions::COPY_SLOT, true, "Taken", &message);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(request: &str, node: &str) -> CopyHolder {
        CopyHolder {
            request: request.to_string(),
            pod: format!("{request}-0"),
            node: node.to_string(),
        }
    }

    fn caps(cluster: u32, per_node: u32) -> CopyCaps {
        CopyCaps {
            cluster: NonZeroU32::new(cluster),
            per_node: NonZeroU32::new(per_node),
        }
    }

    #[test]
    fn no_cap_never_waits() {
        let many: Vec<CopyHolder> = (0..50).map(|i| h(&format!("ns/r{i}"), "n1")).collect();
        assert_eq!(wait_for(CopyCaps::default(), &many, "n1"), None);
    }

    #[test]
    fn the_cluster_cap_counts_every_holder_and_names_them() {
        let holders = [h("a/r1", "n1"), h("b/r2", "n2")];
        assert_eq!(wait_for(caps(3, 0), &holders, "n1"), None);
        let wait = wait_for(caps(2, 0), &holders, "n3").map(|w| w.to_string());
        assert_eq!(
            wait.as_deref(),
            Some(
                "2 of at most 2 copies in the cluster are running: a/r1 (a/r1-0 on n1), \
                 b/r2 (b/r2-0 on n2)"
            )
        );
    }

    #[test]
    fn the_node_cap_counts_only_the_nodes_holders() {
        let holders = [h("a/r1", "n1"), h("b/r2", "n2")];
        assert_eq!(wait_for(caps(0, 1), &holders, "n3"), None);
        assert_eq!(
            wait_for(caps(0, 1), &holders, "n1"),
            Some(SlotWait::Node {
                node: "n1".into(),
                max: 1,
                holders: vec![h("a/r1", "n1")],
            })
        );
        // The cluster's cap is checked first.
        assert!(matches!(
            wait_for(caps(2, 1), &holders, "n1"),
            Some(SlotWait::Cluster { max: 2, .. })
        ));
    }

    #[test]
    fn a_decision_takes_a_slot_when_the_status_it_writes_holds_one_and_the_last_did_not() {
        let status = |step| {
            let mut s = StorageMigrationRequestStatus::default();
            s.members.push(crate::api::MemberStatus {
                pod: "db-0".into(),
                step,
                ..Default::default()
            });
            s
        };
        let writes = |step| Decision {
            actions: vec![Action::SetStatus(Box::new(status(step)))],
            requeue: Duration::ZERO,
        };
        let (claim, copying) = (
            status(MemberStep::CreatingClaim),
            status(MemberStep::PreCopying),
        );
        assert!(takes_slot(Some(&claim), &writes(MemberStep::PreCopying)));
        assert!(takes_slot(Some(&claim), &writes(MemberStep::GatingStop)));
        assert!(!takes_slot(
            Some(&claim),
            &writes(MemberStep::CreatingClaim)
        ));
        assert!(
            !takes_slot(Some(&copying), &writes(MemberStep::GatingStop)),
            "held already"
        );
        let none = Decision {
            actions: Vec::new(),
            requeue: Duration::ZERO,
        };
        assert!(!takes_slot(Some(&claim), &none), "writes no status");
    }

    #[test]
    fn a_slot_is_held_from_the_pre_copy_to_the_end_of_the_final_copy() {
        use MemberStep::*;
        let held: Vec<MemberStep> = [
            Pending,
            CreatingClaim,
            PreCopying,
            GatingStop,
            StoppingPod,
            Copying,
            RetainingVolumes,
            RecreatingPod,
            Done,
            RolledBack,
        ]
        .into_iter()
        .filter(|s| holds_slot(*s))
        .collect();
        assert_eq!(held, [PreCopying, GatingStop, StoppingPod, Copying]);
    }
}
