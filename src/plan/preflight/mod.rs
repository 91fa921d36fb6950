//! Preflight: everything is checked before anything is touched. Every failed check ends the
//! request `Denied` (condition `Accepted=False` with a [`DenialReason`], a message naming the
//! problem, an Event); success accepts it with a fixed plan.
//!
//! [`checks`] is the list of checks, in the order they run: the first one that fails decides the
//! denial (`kubectl smr plan` runs the same list and keeps every denial). Each check is a small pure function returning `Result<_, Denial>`.
//!
//! The only objects preflight creates are the Shrink measure Jobs (read-only mounts of the old
//! claims, owned by the request).
//!
//! Requests on one StatefulSet are judged one at a time, oldest first ([`queue`]): while
//! another one is `Progressing`, or is older and still `Pending`, a request waits in `Pending`
//! with the condition `Queued` naming the request it waits for, and nothing is touched. A
//! request whose spec is malformed waits for nobody: it is denied at once.

use kube::ResourceExt;

use super::{Action, Ctx, EventType, Kind, Propagation, REQUEUE_QUEUED, REQUEUE_WAITING};
use crate::api::conditions;
use crate::api::{
    ClaimStatus, MemberStatus, MemberStep, MigrationType, Phase, Plan, PlannedWork, Stage,
};
use crate::build::JobKind;
use crate::labels;

mod checks;
mod claim_target;
mod classes;
mod denial;
mod deployment;
pub(crate) mod headroom;
mod health;
mod measure;
mod members;
mod mover;
mod owner;
mod queue;
mod spec;
mod target;
#[cfg(test)]
mod tests;

pub use checks::all_denials;
pub use denial::{Denial, DenialReason};
pub use measure::{MIN_HEADROOM_BYTES, max_used_bytes};
pub use owner::{ForeignOwner, foreign_owner};
pub use queue::{Ahead, waiting_for};
pub use spec::validate_spec;
pub use target::choose_template;

use measure::Measurement;

/// What preflight found.
enum Verdict {
    Deny(Denial),
    /// Still measuring; the message says what is awaited.
    Wait(String),
    Accept(Box<Plan>),
}

/// Preflight of a new request: the checks, then (Shrink) the measuring; the request ends
/// `Denied`, waits for the measure Jobs, or is accepted with its plan.
pub(crate) fn run(cx: &mut Ctx) {
    let o = cx.o;
    if validate_spec(cx.spec()).is_ok() {
        let me_created = o.request.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if let Some(ahead) = waiting_for(&cx.name(), me_created, &o.other_requests) {
            queued(cx, &ahead);
            return;
        }
    }
    dequeued(cx);
    let verdict = match check(cx) {
        Ok(plan) => measured(cx, plan),
        Err(d) => Verdict::Deny(d),
    };
    match verdict {
        Verdict::Deny(d) => deny(cx, d),
        Verdict::Wait(message) => {
            if cx.status.message.as_deref() != Some(message.as_str()) {
                cx.status.message = Some(message);
            }
            cx.wait(REQUEUE_WAITING);
        }
        Verdict::Accept(plan) => accept(cx, *plan),
    }
}

/// What preflight would decide for a new request, without creating anything (no measure Jobs:
/// a Shrink plan then has no `usedBytes`), once its turn comes: other requests on the same
/// target are not looked at (see [`waiting_for`]). For `storage-migrator plan`.
pub fn dry_run(o: &super::Observed, settings: &super::Settings) -> Result<Plan, Denial> {
    check(&Ctx::new(o, settings))
}

/// Every check but the measuring, in order ([`checks::checks`]); the plan, or the first denial.
fn check(cx: &Ctx) -> Result<Plan, Denial> {
    let mut c = checks::Checks::new(checks::Mode::First);
    match checks::checks(cx, &mut c) {
        Some(plan) => Ok(plan),
        // `checks` ends without a plan only after recording a denial.
        None => Err(c.found.into_iter().next().unwrap_or_else(|| {
            Denial::new(
                DenialReason::InvalidSpec,
                "preflight found no plan and no denial (a bug: please report it)",
            )
        })),
    }
}

/// Waits for the request ahead: condition `Queued=True` naming it, the same message, an Event
/// when the request starts waiting. Nothing is touched (measure Jobs left by an earlier
/// reconcile are deleted); looked at again every [`REQUEUE_QUEUED`].
fn queued(cx: &mut Ctx, ahead: &Ahead) {
    let message = format!(
        "waiting for request {} ({:?}) on {}: requests on one workload are \
         judged one at a time, oldest first",
        ahead.name,
        ahead.phase,
        workload(cx)
    );
    let was_queued = conditions::get(&cx.status.conditions, conditions::QUEUED)
        .is_some_and(|c| c.status == "True");
    cx.set_condition(conditions::QUEUED, true, WAITING_FOR_REQUEST, &message);
    if cx.status.message.as_deref() != Some(message.as_str()) {
        cx.status.message = Some(message.clone());
    }
    if !was_queued {
        cx.event(EventType::Normal, "Queued", message);
    }
    delete_measure_jobs(cx);
    cx.requeue = REQUEUE_QUEUED;
}

/// A request that was queued and whose turn came: `Queued=False`.
fn dequeued(cx: &mut Ctx) {
    let was_queued = conditions::get(&cx.status.conditions, conditions::QUEUED)
        .is_some_and(|c| c.status == "True");
    if was_queued {
        let message = format!("no other request is ahead on {}: judged now", workload(cx));
        cx.set_condition(conditions::QUEUED, false, "TurnCame", &message);
    }
}

/// The workload the request works on (for a claim target, the one that controls its pod).
fn workload(cx: &Ctx) -> String {
    super::observe::target_workload(cx.spec(), &cx.status, &cx.o.target_claim_users).to_string()
}

/// The reason of the `Queued=True` condition.
pub const WAITING_FOR_REQUEST: &str = "WaitingForRequest";

/// Shrink: every member's used bytes must fit with headroom (measured on its node); the plan
/// waits for the measure Jobs. Other types are accepted as checked.
fn measured(cx: &mut Ctx, mut plan: Plan) -> Verdict {
    if cx.spec().type_ != MigrationType::Shrink {
        return Verdict::Accept(Box::new(plan));
    }
    match measure::measure(cx, &mut plan.members) {
        Ok(Measurement::Complete) => Verdict::Accept(Box::new(plan)),
        Ok(Measurement::Running) => Verdict::Wait(format!(
            "preflight: measuring the used bytes of {} members",
            plan.members
                .iter()
                .filter(|m| m.work == PlannedWork::Migrate)
                .count()
        )),
        Err(d) => Verdict::Deny(d),
    }
}

/// Deletes the measure Jobs left by preflight.
fn delete_measure_jobs(cx: &mut Ctx) {
    let jobs: Vec<(String, Option<String>)> =
        cx.o.jobs
            .iter()
            .filter(|(_, j)| {
                j.job
                    .labels()
                    .get(labels::JOB_KIND_LABEL)
                    .map(String::as_str)
                    == Some(JobKind::Measure.as_str())
            })
            .map(|(n, j)| (n.clone(), j.job.uid()))
            .collect();
    // By uid: a Job of that name made since the snapshot (by a later request) is not deleted.
    for (name, uid) in jobs {
        cx.act(Action::Delete {
            kind: Kind::Job,
            name,
            propagation: Propagation::Background,
            uid,
            resource_version: None,
        });
    }
}

fn deny(cx: &mut Ctx, d: Denial) {
    let generation = cx.o.request.metadata.generation;
    let d = Denial {
        message: format!("{}{}", d.message, super::runbook::pointer(d.reason)),
        ..d
    };
    cx.status.phase = Phase::Denied;
    cx.enter_stage(Stage::Done);
    cx.status.observed_generation = generation;
    cx.status.message = Some(d.message.clone());
    cx.status.completion_time = Some(cx.now.clone());
    cx.set_condition(conditions::ACCEPTED, false, d.reason.as_str(), &d.message);
    cx.set_condition(conditions::READY, false, "Denied", &d.message);
    cx.event(EventType::Warning, "Denied", d.message);
    delete_measure_jobs(cx);
    cx.requeue = super::REQUEUE_FINAL;
}

fn accept(cx: &mut Ctx, plan: Plan) {
    let generation = cx.o.request.metadata.generation;
    let mut message = accepted_message(&plan);
    if let Some(owner) = declared_paused(cx) {
        message.push_str(&owner::paused_note(&owner));
    }
    cx.status.phase = Phase::Progressing;
    // A Deployment is scaled, never deleted, and a bare pod has no set: nothing to orphan.
    let (stage, doing) = match (&plan.deployment, plan.has_stateful_set()) {
        (Some(_), _) => (Stage::Migrating, "migrating the Deployment's claim"),
        (None, false) => (Stage::Migrating, "migrating the pod's claim"),
        (None, true) => (
            Stage::OrphaningStatefulSet,
            "stashing and orphaning the StatefulSet",
        ),
    };
    cx.enter_stage(stage);
    cx.status.observed_generation = generation;
    cx.status.accepted_spec = Some(Box::new(cx.spec().clone()));
    cx.status.start_time = Some(cx.now.clone());
    cx.status.members = plan
        .members
        .iter()
        .map(|m| MemberStatus {
            pod: m.pod.clone(),
            first_claim: ClaimStatus {
                claim: m.claim.clone(),
                ..Default::default()
            },
            further_claims: (m.further_claims.iter())
                .map(|c| ClaimStatus {
                    claim: c.claim.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let left_alone: Vec<(usize, MemberStep)> = plan
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| match m.work {
            PlannedWork::Migrate => None,
            PlannedWork::AlreadyThere => Some((i, MemberStep::AlreadyThere)),
            PlannedWork::NotTargeted => Some((i, MemberStep::NotTargeted)),
        })
        .collect();
    for (i, step) in left_alone {
        cx.advance_member(i, step);
    }
    cx.status.plan = Some(plan);
    cx.status.progress = Some(super::progress(&cx.status));
    cx.status.message = Some(message.clone());
    cx.set_condition(conditions::ACCEPTED, true, "Accepted", &message);
    cx.set_condition(
        conditions::READY,
        false,
        "Progressing",
        "migration in progress",
    );
    cx.set_condition(conditions::PROGRESSING, true, &format!("{stage:?}"), doing);
    if !crate::plan::observe::has_finalizer(&cx.o.request) {
        cx.act(Action::AddFinalizer);
    }
    cx.event(EventType::Normal, "Accepted", message);
    delete_measure_jobs(cx);
    cx.requeue = std::time::Duration::ZERO;
}

/// The set's other owner, when the request declared it paused (`spec.ownerPaused`).
fn declared_paused(cx: &Ctx) -> Option<ForeignOwner> {
    let set = cx.o.stateful_set.as_ref()?.typed();
    foreign_owner(set).filter(|_| cx.spec().owner_paused)
}

/// The `Accepted` message: the members to migrate, the target class and size, the order, and the
/// members already there.
fn accepted_message(plan: &Plan) -> String {
    let pods = |work: PlannedWork| {
        plan.members
            .iter()
            .filter(|m| m.work == work)
            .map(|m| m.pod.as_str())
            .collect::<Vec<_>>()
    };
    let migrate = pods(PlannedWork::Migrate);
    let there = pods(PlannedWork::AlreadyThere);
    if let (Some(claim), Some(d)) = (&plan.target_claim, &plan.deployment) {
        return format!(
            "accepted: claim {claim} of Deployment {d} moves to StorageClass {} ({}); the \
             Deployment is scaled to zero while the claim is copied and swapped, then back to \
             its replicas",
            plan.target_storage_class, plan.target_size.0
        );
    }
    if let (Some(claim), Some(pod)) = (&plan.target_claim, &plan.pod) {
        return format!(
            "accepted: claim {claim} of pod {pod} moves to StorageClass {} ({}); the pod is \
             stashed and deleted while the claim is copied and swapped, then recreated from its \
             stash",
            plan.target_storage_class, plan.target_size.0
        );
    }
    if let Some(claim) = &plan.target_claim {
        return format!(
            "accepted: claim {claim} of member {} (StatefulSet {}) moves to StorageClass {} \
             ({}); not targeted, left running: {}; the StatefulSet keeps its \
             volumeClaimTemplates",
            migrate.join(", "),
            plan.stateful_set,
            plan.target_storage_class,
            plan.target_size.0,
            pods(PlannedWork::NotTargeted).join(", ")
        );
    }
    let sizes = match plan.further_templates.as_slice() {
        [] => plan.target_size.0.clone(),
        further => format!(
            "templates {} {}, {}; each member's claims in one stop",
            plan.volume_claim_template,
            plan.target_size.0,
            (further.iter())
                .map(|t| format!("{} {}", t.name, t.size.0))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut message = format!(
        "accepted: {} members of StatefulSet {} move to StorageClass {} ({sizes}), order {}",
        migrate.len(),
        plan.stateful_set,
        plan.target_storage_class,
        if migrate.is_empty() {
            "none (only the StatefulSet's template changes)".to_string()
        } else {
            migrate.join(", ")
        }
    );
    if !there.is_empty() {
        message.push_str(&format!(
            "; already there, left running: {}",
            there.join(", ")
        ));
    }
    message
}
