//! Objects of the target's names that the operator did not create, noticed while the request is
//! past orphaning (`Migrating`, `RecreatingStatefulSet`, `RollingBack`): a StatefulSet of the
//! target's name recreated by another controller (its owning operator, Argo CD or Flux
//! self-heal, a person), and a pod of the member in flight that something else started.
//!
//! Which set is the operator's own: the stashed original (until its orphan delete), and the one it
//! recreates, which carries [`labels::CREATED_BY_REQUEST_ANNOTATION`] (the request's uid) and
//! whose uid is recorded in `status.recreatedStatefulSetUid` as soon as it is seen; once
//! recorded, only that uid is the operator's. Any other set of that name is foreign.
//!
//! Which pod of the member in flight is foreign: one controlled by a foreign set (at any step);
//! during the copy and the swap (`Copying` to `RecreatingClaim`), where the operator keeps the
//! member down, any pod of that name; in `StoppingPod`, a pod whose uid is not the stashed one
//! (the original was deleted and something else started another).
//!
//! What the planner does about them (see `stages::migrating`, `stages::rolling_back`):
//! - forward: before every destructive step it holds still ([`hold_member`]): no pod is stopped,
//!   no claim deleted or created, no volume released, no pod or set recreated; condition
//!   `Blocked` names what appeared; when it is gone the condition is cleared and the member goes
//!   on. The request's timeout bounds the wait: it then rolls back with
//!   [`Failure::BlockedUntilTimeout`] naming what appeared. Two cases do not wait:
//!   - a pod that came back after the member's final copy while the old claim is still in place
//!     (`Copying`, `RetainingVolumes`, `DeletingOldClaim`) may have written to the old volume
//!     since: the copy is stale, so the request rolls back at once and the member stays on its
//!     old claim ([`Failure::StaleCopy`], `Failure::PodCameBack` during the copy);
//!   - once the old claim is gone (`DeletingTempClaim` to `RecreatingClaim`) and only a foreign
//!     set is there (no pod yet), the claim steps go on: they touch only the operator's own
//!     temporary claim and new volume, and filling the claim's name with the verified copy is what
//!     keeps the set's controller from creating an empty claim under it.
//! - rolling back ([`hold_in_rollback`]): the operator's set is not recreated over a foreign one
//!   (a create answered 409 is an error, not a success), a member before its swap gets no pod of
//!   ours (the foreign set starts it on its untouched claim), a member whose old claim is still
//!   there is held on it instead of being carried forward, and one that cannot go on is held where
//!   it is; the request then ends `Failed`, saying where each member's data is.

use kube::ResourceExt;

use super::claims::{self, RequestClaim};
use super::{Ctx, EventType, Failure, claim_volume, is_terminating};
use crate::api::{MemberStatus, MemberStep, PlannedMember, Stage, conditions};
use crate::labels;
use crate::plan::preflight::foreign_owner;

/// The reason of the `Blocked` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockedReason {
    /// A StatefulSet of the target's name that the operator did not create.
    ForeignStatefulSet,
    /// A pod of the member in flight that the operator did not create.
    ForeignPod,
    /// Nothing foreign is there (any more): condition `Blocked` is False.
    Clear,
}

impl BlockedReason {
    pub const ALL: [BlockedReason; 3] = [Self::ForeignStatefulSet, Self::ForeignPod, Self::Clear];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ForeignStatefulSet => "ForeignStatefulSet",
            Self::ForeignPod => "ForeignPod",
            Self::Clear => "Clear",
        }
    }
}

/// Something that appeared under the target's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Foreign {
    /// A StatefulSet (name, uid), with what manages it when that can be told.
    StatefulSet {
        name: String,
        uid: String,
        owner: Option<String>,
        how_to_pause: Option<String>,
    },
    /// A member pod (name, uid), with the foreign set that controls it, if one does.
    Pod {
        name: String,
        uid: String,
        owner: Option<String>,
    },
}

impl Foreign {
    pub fn reason(&self) -> BlockedReason {
        match self {
            Foreign::StatefulSet { .. } => BlockedReason::ForeignStatefulSet,
            Foreign::Pod { .. } => BlockedReason::ForeignPod,
        }
    }

    /// `StatefulSet kv (uid u)` or `pod kv-0 (uid u, controlled by StatefulSet kv (uid s))`.
    pub fn describe(&self) -> String {
        match self {
            Foreign::StatefulSet { name, uid, .. } => format!("StatefulSet {name} (uid {uid})"),
            Foreign::Pod { name, uid, owner } => match owner {
                Some(o) => format!("pod {name} (uid {uid}, controlled by {o})"),
                None => format!("pod {name} (uid {uid})"),
            },
        }
    }

    /// What appeared, as the start of the `Blocked` message.
    fn sentence(&self, stage: &str) -> String {
        match self {
            Foreign::Pod {
                name,
                uid,
                owner: Some(owner),
            } => format!(
                "pod {name} (uid {uid}) is controlled by {owner}, which someone else created \
                 while the request was {stage}"
            ),
            _ => format!(
                "{} was created by someone else while the request was {stage}",
                self.describe()
            ),
        }
    }

    /// What the user can do about it.
    fn advice(&self) -> String {
        match self {
            Foreign::StatefulSet {
                owner,
                how_to_pause,
                ..
            } => {
                let pause = match (owner, how_to_pause) {
                    (Some(o), Some(how)) => format!("pause its owner, {o} ({how})"),
                    _ => "pause its owner (the controller, GitOps tool or script that applies it)"
                        .to_string(),
                };
                format!(
                    "{pause}, then delete that StatefulSet with --cascade=orphan; the request \
                     goes on once it is gone"
                )
            }
            Foreign::Pod { .. } => "stop whatever starts it and delete the pod; the request \
                                    goes on once it is gone"
                .to_string(),
        }
    }
}

/// The value of [`labels::CREATED_BY_REQUEST_ANNOTATION`] on what this request recreates.
pub(crate) fn marker(cx: &Ctx) -> String {
    cx.o.request.uid().unwrap_or_else(|| cx.name())
}

/// What the stage is doing, for messages.
fn doing(stage: Stage) -> &'static str {
    match stage {
        Stage::RecreatingStatefulSet => "recreating the StatefulSet",
        Stage::RollingBack => "rolling back",
        _ => "migrating",
    }
}

/// Whether the live set is the operator's: the stashed original (never orphaned, or before its
/// delete), the recorded recreated uid, or, before that is recorded, the request's marker.
fn set_is_ours(cx: &Ctx) -> bool {
    let Some(set) = &cx.o.stateful_set else {
        return true;
    };
    let uid = set.uid();
    let Some(stashed) = &cx.o.stash.stateful_set else {
        return true;
    };
    if uid.is_some() && uid == stashed.uid() {
        return true;
    }
    match &cx.status.recreated_stateful_set_uid {
        Some(ours) => uid.as_deref() == Some(ours.as_str()),
        None => {
            set.annotations()
                .get(labels::CREATED_BY_REQUEST_ANNOTATION)
                .map(String::as_str)
                == Some(marker(cx).as_str())
        }
    }
}

/// Records the uid of the set the operator recreated the first time it is seen.
pub(crate) fn record_our_set(cx: &mut Ctx) {
    if cx.status.recreated_stateful_set_uid.is_some() || !set_is_ours(cx) {
        return;
    }
    let Some(set) = &cx.o.stateful_set else {
        return;
    };
    let recreated = set
        .annotations()
        .get(labels::CREATED_BY_REQUEST_ANNOTATION)
        .is_some();
    if recreated {
        cx.status.recreated_stateful_set_uid = set.uid();
    }
}

/// A StatefulSet of the target's name that the operator did not create, past orphaning.
pub(crate) fn foreign_set(cx: &Ctx) -> Option<Foreign> {
    if !matches!(
        cx.status.stage,
        Stage::Migrating | Stage::RecreatingStatefulSet | Stage::RollingBack
    ) || set_is_ours(cx)
    {
        return None;
    }
    let set = cx.o.stateful_set.as_ref()?;
    let owner = foreign_owner(set.typed());
    Some(Foreign::StatefulSet {
        name: set.name_any(),
        uid: set.uid().unwrap_or_default(),
        how_to_pause: owner.as_ref().map(|o| o.how_to_pause()),
        owner: owner.map(|o| o.to_string()),
    })
}

/// The StatefulSet that controls `pod` when it is not the operator's (nor the original).
fn foreign_controller(cx: &Ctx, pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    let r = super::controller_ref(pod).filter(|r| r.kind == "StatefulSet")?;
    let live_ours = set_is_ours(cx)
        .then(|| cx.o.stateful_set.as_ref().and_then(|s| s.uid()))
        .flatten();
    let stashed = cx.o.stash.stateful_set.as_ref().and_then(|s| s.uid());
    let ours = [
        live_ours,
        stashed,
        cx.status.recreated_stateful_set_uid.clone(),
    ];
    if ours.iter().flatten().any(|u| *u == r.uid) {
        return None;
    }
    Some(format!("StatefulSet {} (uid {})", r.name, r.uid))
}

/// A pod of member `ms` that the operator did not create (see the module's doc).
pub(crate) fn foreign_pod(cx: &Ctx, m: &PlannedMember, ms: &MemberStatus) -> Option<Foreign> {
    let pod = cx.o.pods.get(&m.pod)?;
    let uid = pod.uid().unwrap_or_default();
    let owner = foreign_controller(cx, pod.typed());
    let foreign = owner.is_some()
        || match ms.step {
            MemberStep::StoppingPod => {
                cx.o.stash
                    .pods
                    .get(&m.pod)
                    .is_some_and(|s| s.uid().is_some_and(|s| s != uid))
            }
            s => s >= MemberStep::Copying && s < MemberStep::RecreatingPod,
        };
    foreign.then(|| Foreign::Pod {
        name: m.pod.clone(),
        uid,
        owner,
    })
}

/// Says (condition `Blocked`, the status message, one Event per new message) that the request
/// holds still because of `what`, and looks again soon.
pub(crate) fn block(cx: &mut Ctx, what: &Foreign, note: &str) {
    let stage = doing(cx.status.stage);
    let timeout = cx.spec().timeout.clone();
    let message = format!(
        "{}; {}. {note}It rolls back when its timeout of {timeout} expires.{}",
        what.sentence(stage),
        what.advice(),
        super::runbook::pointer(what.reason()),
    );
    if cx.set_condition(conditions::BLOCKED, true, what.reason().as_str(), &message) {
        cx.event(EventType::Warning, "Blocked", message.clone());
    }
    cx.status.message = Some(format!("blocked: {message}"));
    cx.wait(super::REQUEUE_WAITING);
}

/// Clears a `Blocked` condition that is True (with an Event): what appeared is gone.
pub(crate) fn unblock(cx: &mut Ctx) {
    let blocked = conditions::get(&cx.status.conditions, conditions::BLOCKED)
        .is_some_and(|c| c.status == "True");
    if !blocked {
        return;
    }
    let message = "nothing that the operator did not create is there any more; the request goes on";
    cx.set_condition(
        conditions::BLOCKED,
        false,
        BlockedReason::Clear.as_str(),
        message,
    );
    cx.event(EventType::Normal, "Unblocked", message);
}

/// Whether the member's original claim is still in place: there, not being deleted, on the old
/// volume.
fn old_claim_intact(cx: &Ctx, m: &PlannedMember) -> bool {
    cx.o.claims
        .get(&m.claim)
        .is_some_and(|c| !is_terminating(c) && claim_volume(c) == Some(m.old_volume.as_str()))
}

/// Forward: whether member `i` must hold still (it is then `Blocked`), or fail because its copy
/// is stale; clears `Blocked` when nothing foreign is there. `Ok(false)`: its step may run.
pub(crate) fn hold_member(cx: &mut Ctx, i: usize) -> Result<bool, Failure> {
    let Some(c) = cx
        .status
        .members
        .get(i)
        .and_then(|ms| claim_in_flight(cx, ms))
    else {
        return Ok(false);
    };
    let (m, ms) = (c.planned, c.status);
    let set = foreign_set(cx);
    let pod = foreign_pod(cx, &m, &ms);
    match ms.step {
        // The pod came back during the copy: the step itself fails (`PodCameBack`), or, with a
        // foreign set there or named by the pod's controller reference, this names what
        // started it. The set may be missing from a snapshot that has its pod: the set is read
        // before the pods, and its controller creates the pod at once.
        MemberStep::Copying if cx.o.pods.contains_key(&m.pod) => {
            return match (&pod, &set) {
                (Some(p @ Foreign::Pod { owner: Some(_), .. }), _) => {
                    Err(Failure::ForeignPodDuringCopy {
                        pod: m.pod,
                        what: p.describe(),
                    })
                }
                (Some(p @ Foreign::Pod { owner: None, .. }), Some(s)) => {
                    let what = format!("{}, with {} there,", p.describe(), s.describe());
                    Err(Failure::ForeignPodDuringCopy { pod: m.pod, what })
                }
                _ => Ok(false),
            };
        }
        MemberStep::RetainingVolumes | MemberStep::DeletingOldClaim
            if pod.is_some() && old_claim_intact(cx, &m) =>
        {
            let what = pod.as_ref().map(Foreign::describe).unwrap_or_default();
            return Err(Failure::StaleCopy { pod: m.pod, what });
        }
        MemberStep::DeletingTempClaim
        | MemberStep::ReleasingNewVolume
        | MemberStep::RecreatingClaim
            if pod.is_none() =>
        {
            if let Some(set) = &set {
                block(
                    cx,
                    set,
                    &format!(
                        "The swap of member {} goes on (the old claim is gone: claim {} is \
                         recreated on the verified copy so that the set cannot create an empty \
                         one); its pod is not recreated. ",
                        m.pod, m.claim
                    ),
                );
            }
            return Ok(false);
        }
        _ => {}
    }
    // The set first: it is what starts the pods, and what the user has to pause.
    match set.or(pod) {
        Some(what) => {
            block(cx, &what, "No destructive step is taken. ");
            Ok(true)
        }
        None => {
            unblock(cx);
            Ok(false)
        }
    }
}

/// Forward, with no member in flight: a foreign set keeps the next member from starting.
pub(crate) fn hold_stage(cx: &mut Ctx) -> bool {
    match foreign_set(cx) {
        Some(set) => {
            block(cx, &set, "No member is started. ");
            true
        }
        None => {
            unblock(cx);
            false
        }
    }
}

/// The member's claim its step works on (`claimIndex`), as [`claims::member_claim`] sees it:
/// the member as planned and its status, both seen on that claim.
fn claim_in_flight(cx: &Ctx, ms: &MemberStatus) -> Option<RequestClaim> {
    let plan = cx.status.plan.as_ref()?;
    let m = plan.members.iter().find(|m| m.pod == ms.pod)?;
    Some(claims::member_claim(m, ms, ms.claim_index))
}

/// The timeout's failure: [`Failure::BlockedUntilTimeout`] naming what appeared when something
/// foreign is there, else `timed_out` as it is.
pub(crate) fn timeout_failure(cx: &Ctx, timed_out: Failure) -> Failure {
    let in_flight = super::in_flight(&cx.status)
        .and_then(|i| cx.status.members.get(i).cloned())
        .and_then(|ms| claim_in_flight(cx, &ms))
        .and_then(|c| foreign_pod(cx, &c.planned, &c.status));
    match foreign_set(cx).or(in_flight) {
        Some(what) => Failure::BlockedUntilTimeout {
            timeout: cx.spec().timeout.clone(),
            what: what.describe(),
        },
        None => timed_out,
    }
}

/// Rolling back a member whose swap has begun: whether it is held where it is (see the module's
/// doc), recording why in `members[i].held` (once, with an Event). False: carry it forward.
pub(crate) fn hold_in_rollback(cx: &mut Ctx, i: usize) -> bool {
    let Some(ms) = cx.status.members.get(i).cloned() else {
        return false;
    };
    if ms.held.is_some() {
        return true;
    }
    let Some(c) = claim_in_flight(cx, &ms) else {
        return false;
    };
    let (m, ms) = (c.planned, c.status);
    let set = foreign_set(cx);
    let pod = cx.o.pods.get(&m.pod).map(|p| p.uid().unwrap_or_default());
    let new = ms
        .first_claim
        .new_volume
        .clone()
        .unwrap_or_else(|| "?".into());
    let stale = cx
        .status
        .failure
        .as_deref()
        .is_some_and(|f| f.starts_with(&super::failure::stale_copy_prefix(&m.pod)));
    let why = match ms.step {
        MemberStep::RetainingVolumes | MemberStep::DeletingOldClaim => {
            let claim_gone_soon = !old_claim_intact(cx, &m);
            if pod.is_none() && set.is_none() && !stale {
                return false;
            }
            if claim_gone_soon && pod.is_none() {
                // Being deleted and unused: carry on and fill the name with the copy.
                return false;
            }
            let policy =
                cx.o.volumes
                    .get(&m.old_volume)
                    .map(super::volume_policy)
                    .unwrap_or_else(|| "?".into());
            format!(
                "held on its old claim {} (volume {}, reclaim policy {policy}{}): {}; the copy \
                 taken when it stopped stays on temporary claim {} (new volume {new})",
                m.claim,
                m.old_volume,
                if claim_gone_soon {
                    ", the claim is being deleted or gone"
                } else {
                    ""
                },
                holder(&m, pod.as_deref(), set.as_ref()),
                m.temp_claim
            )
        }
        MemberStep::DeletingTempClaim
        | MemberStep::ReleasingNewVolume
        | MemberStep::RecreatingClaim => {
            let taken = cx.o.claims.get(&m.claim).filter(|c| {
                claim_volume(c) != ms.first_claim.new_volume.as_deref()
                    || ms.first_claim.new_volume.is_none()
            });
            let Some(taken) = taken else {
                return false;
            };
            format!(
                "held: claim {} was created by someone else (volume {}); the member's data is on \
                 new volume {new} (verified copy, Retain) and old volume {} (Retain)",
                m.claim,
                claim_volume(taken).unwrap_or("none yet"),
                m.old_volume
            )
        }
        _ => return false,
    };
    if let Some(s) = cx.status.members.get_mut(i) {
        s.held = Some(why.clone());
        s.message = Some(why.clone());
    }
    cx.event(
        EventType::Warning,
        "MemberHeld",
        format!("member {}: {why}", m.pod),
    );
    true
}

fn holder(m: &PlannedMember, pod: Option<&str>, set: Option<&Foreign>) -> String {
    match (pod, set) {
        (Some(uid), _) => format!(
            "pod {} (uid {uid}) was started on it by someone else after the final copy, so it \
             may hold writes the copy lacks",
            m.pod
        ),
        (None, Some(set)) => format!(
            "{} was created by someone else and would start the member on it",
            set.describe()
        ),
        (None, None) => format!("pod {} ran on it again after the final copy", m.pod),
    }
}

/// The note the `Failed` message ends with when a foreign set is there.
pub(crate) fn failed_note(cx: &Ctx) -> String {
    match foreign_set(cx) {
        Some(set) => format!(
            ". {} was created by someone else and is left alone: the operator did not recreate \
             its own StatefulSet over it; check that its template fits the claims above",
            set.describe()
        ),
        None => String::new(),
    }
}
