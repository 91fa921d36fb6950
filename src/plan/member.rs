//! One member's migration, one function per [`MemberStep`]. Each function looks at what the
//! cluster shows for its step and either acts (idempotently), waits, advances to the next step
//! (status first, through [`super::machine`]), or fails (before the swap only: the request then
//! rolls back).

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;

use super::claims;
use super::disruption;
use super::foreign;
use super::helpers::{self, Trouble};
use super::machine;
use super::observe::other_claim_users;
use super::retain;
use super::runbook::{self, Stuck};
use super::scaled;
use super::stash::{StashKey, stash};
use super::{
    Action, Ctx, EventType, Failure, JobOutcome, Kind, MemoryShortfall, Object, Propagation,
    claim_phase, claim_volume, claims_held, claims_named, class_is_wffc, is_terminating,
    pod_finished, pod_ready, pod_ready_since, progress, stuck, volume_policy,
};
use crate::api::conditions;
use crate::api::{
    ClaimStatus, LeaderChange, LeaderChangeKind, MemberStatus, MemberStep, Plan, PlannedMember,
    VerifyMode,
};
use crate::build::{self, JobKind, JobResult, Verification};
use crate::engine::{self, Gate, HealthReport};
use crate::labels::{self, BIND_NUDGE_ANNOTATION, SELECTED_NODE_ANNOTATION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

/// Seconds between two nudges of a recreated claim that stays Pending.
pub const BIND_NUDGE_AFTER_SECONDS: i64 = 1;
/// Seconds after its creation before a recreated claim whose volume already carries its uid is
/// nudged (the PV controller's lost race, before Kubernetes 1.36).
pub const BIND_NUDGE_LOST_RACE_SECONDS: i64 = 1;
/// Seconds after its creation (by its `creationTimestamp`, whole seconds) a recreated claim is
/// nudged even when its volume does not show the PV controller's half of the binding.
pub const BIND_NUDGE_FALLBACK_SECONDS: i64 = 2;

/// How soon the claim swap looks again while the member is down, all of it downtime, when nothing
/// wakes it sooner. What it waits for does: a change of a claim or a volume the plan names ends
/// the wait at once (the controller watches their metadata). So this is the fallback for a lost
/// event, and the step of the binding nudges (whole seconds after a claim's creation).
pub const SWAP_POLL: Duration = Duration::from_millis(500);

/// How often a running Job is looked at again, for its progress and a stuck pod: a quarter of
/// the time it has run, at least [`COPY_POLL_MIN`], at most [`COPY_POLL_MAX`]. Its end (its
/// `Complete` or `Failed` condition, a failed pod) wakes the request at once through the watch of
/// our Jobs (`controller::job_trigger`), so this bounds only how old the status's progress is and
/// how late a stuck pod is seen (its limit, `--helper-start-timeout`, is minutes). A copy of an
/// hour is looked at about 360 times, not 3,600; one of a few seconds every second, as before.
pub fn copy_poll(running: Duration) -> Duration {
    (running / 4).clamp(COPY_POLL_MIN, COPY_POLL_MAX)
}
pub const COPY_POLL_MIN: Duration = Duration::from_secs(1);
pub const COPY_POLL_MAX: Duration = Duration::from_secs(10);

/// Forward (the normal flow) or carrying a swapped member forward during a rollback (no health
/// gates, no waiting for readiness: the rollback must end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Rollback,
}

/// Everything one step function needs about its member, seen on the claim the step works on
/// (`status.members[].claimIndex`): `m` and `ms` carry that claim's names, sizes and status in
/// their own fields ([`PlannedMember::on_claim`], [`MemberStatus::on_claim`]), so a step acts
/// on a further claim exactly as on the first.
pub(super) struct Member {
    pub(super) i: usize,
    pub(super) m: PlannedMember,
    pub(super) ms: MemberStatus,
    pub(super) mode: Mode,
    /// The claim the step works on (0: the plan's `claim`).
    pub(super) slot: usize,
    /// How many claims the member has.
    pub(super) claims: usize,
    /// What the claim's helpers (Jobs, mounter pod) are named after.
    pub(super) subject: String,
    /// The member as planned, every claim.
    pub(super) planned: PlannedMember,
}

fn member(cx: &Ctx, i: usize, mode: Mode) -> Result<Member, Failure> {
    let ms = cx
        .status
        .members
        .get(i)
        .cloned()
        .ok_or(Failure::NoMemberStatus { index: i })?;
    let m = cx
        .status
        .plan
        .as_ref()
        .and_then(|p| p.members.iter().find(|m| m.pod == ms.pod))
        .cloned()
        .ok_or_else(|| Failure::NotInPlan {
            pod: ms.pod.clone(),
        })?;
    Ok(on_claim(i, &m, &ms, mode, ms.claim_index))
}

/// The member seen on its claim `slot` (the last one when `slot` is past it), as
/// [`claims::member_claim`] sees it.
fn on_claim(i: usize, m: &PlannedMember, ms: &MemberStatus, mode: Mode, slot: usize) -> Member {
    let c = claims::member_claim(m, ms, slot);
    Member {
        i,
        slot: c.slot,
        claims: m.further_claims.len() + 1,
        subject: c.subject,
        ms: c.status,
        m: c.planned,
        planned: m.clone(),
        mode,
    }
}

/// Runs the member in flight forward, each step behind the checks for foreign objects
/// ([`foreign::hold_member`]); when a step only recorded the advance to a step of
/// [`machine::PASSED_IN_ONE_DECISION`] (no action but Events), the next one runs in the same
/// decision: the claim swap's steps that find nothing to wait for cost no reconcile round of
/// the member's downtime. The status, written before any action, records the last step entered;
/// the decision waits as the last step run asks ([`advance`]'s "at once" is for a step not run).
/// Not into `RecreatingPod` from a round that did not read the database's health (its gate
/// needs it; see [`super::reads_health`]).
pub(crate) fn forward(cx: &mut Ctx, i: usize) -> Result<(), Failure> {
    note_leader_change(cx, i);
    let health_read =
        cx.o.request
            .status
            .as_ref()
            .is_some_and(super::reads_health);
    for _ in 0..=machine::PASSED_IN_ONE_DECISION.len() {
        if foreign::hold_member(cx, i)? {
            return Ok(());
        }
        let (from, acted_before) = (step_of(cx, i), cx.actions.len());
        let requeue_before = cx.requeue;
        step(cx, i, Mode::Forward)?;
        let to = step_of(cx, i);
        let to_step = to.map(|(step, _)| step);
        let acted = cx.actions[acted_before..]
            .iter()
            .any(|a| !matches!(a, Action::Event { .. }));
        let passable = to_step.is_some_and(|s| {
            machine::PASSED_IN_ONE_DECISION.contains(&s)
                && (health_read || s != MemberStep::RecreatingPod)
        });
        if to == from || acted || !passable || cx.rejected.is_some() {
            break;
        }
        // The step advanced to runs now: its own waits decide when to look again, not the
        // advance's "at once" ([`advance`]), which is for a step not yet run.
        cx.requeue = requeue_before;
    }
    Ok(())
}

/// The member's step and the claim it works on.
fn step_of(cx: &Ctx, i: usize) -> Option<(MemberStep, usize)> {
    cx.status.members.get(i).map(|m| (m.step, m.claim_index))
}

/// Runs the member's current step.
pub(crate) fn step(cx: &mut Ctx, i: usize, mode: Mode) -> Result<(), Failure> {
    let mb = member(cx, i, mode)?;
    match mb.ms.step {
        MemberStep::Pending
        | MemberStep::Done
        | MemberStep::RolledBack
        | MemberStep::AlreadyThere
        | MemberStep::NotTargeted => Ok(()),
        MemberStep::CreatingClaim => creating_claim(cx, &mb),
        MemberStep::PreCopying => pre_copying(cx, &mb),
        MemberStep::GatingStop if scaled::is_scaled(cx) => scaled::gating(cx, &mb),
        MemberStep::GatingStop => gating_stop(cx, &mb),
        MemberStep::StoppingPod if scaled::is_scaled(cx) => scaled::stopping(cx, &mb),
        MemberStep::StoppingPod => stopping_pod(cx, &mb),
        MemberStep::Copying => copying(cx, &mb),
        MemberStep::RetainingVolumes => retaining_volumes(cx, &mb),
        MemberStep::DeletingOldClaim => deleting_old_claim(cx, &mb),
        MemberStep::DeletingTempClaim => deleting_temp_claim(cx, &mb),
        MemberStep::ReleasingNewVolume => releasing_new_volume(cx, &mb),
        MemberStep::RecreatingClaim => recreating_claim(cx, &mb),
        MemberStep::RecreatingPod if scaled::is_scaled(cx) => scaled::starting(cx, &mb),
        MemberStep::RecreatingPod => recreating_pod(cx, &mb),
    }
}

/// Records the member's next step (the next decision carries it out, or this one: see
/// [`forward`]). A step that acts on claims ([`MemberStep::per_claim`]) is taken for each of the
/// member's claims in turn: done with one that is not the last, it moves on to the next claim
/// and stays; done with the last, the member advances, back on its first claim.
pub(super) fn advance(cx: &mut Ctx, mb: &Member, next: MemberStep) {
    let next_claim = mb.ms.step.per_claim() && mb.slot + 1 < mb.claims;
    if let Some(ms) = cx.status.members.get_mut(mb.i) {
        ms.claim_index = if next_claim { mb.slot + 1 } else { 0 };
    }
    if !next_claim {
        cx.advance_member(mb.i, next);
    }
    cx.requeue = Duration::ZERO;
}

pub(super) fn ms_mut<'c>(cx: &'c mut Ctx, mb: &Member) -> Option<&'c mut MemberStatus> {
    cx.status.members.get_mut(mb.i)
}

/// Changes the status of the claim the step works on (the member's own fields for its first
/// claim, `furtherClaims[k-1]` for claim `k`).
fn record_claim(cx: &mut Ctx, mb: &Member, change: impl FnOnce(&mut ClaimStatus)) {
    if let Some(ms) = cx.status.members.get_mut(mb.i) {
        let mut c = ms.claim_status(mb.slot);
        change(&mut c);
        ms.set_claim_status(mb.slot, c);
    }
}

fn job_outcome<'o>(cx: &Ctx<'o>, mb: &Member, kind: JobKind) -> Option<&'o JobOutcome> {
    let name = build::job_name(&cx.name(), &mb.subject, kind);
    cx.o.jobs.get(&name).map(|j| &j.outcome)
}

/// Creates the member's Job of `kind`. The first copy pass records when it was created
/// (`copyStarted`); the verification, in `Changed` mode, compares the content of the files
/// changed since [`super::VERIFY_CLOCK_MARGIN_SECONDS`] before that. The first final pass of
/// the claim records when it was created (`finalPassStarted`).
fn create_job(cx: &mut Ctx, mb: &Member, kind: JobKind) {
    let deadline = cx.remaining_seconds();
    let mut copy_started = mb.ms.copy_started.clone();
    if matches!(kind, JobKind::PreCopy | JobKind::Copy) && copy_started.is_none() {
        copy_started = Some(cx.now.clone());
        if let Some(ms) = ms_mut(cx, mb) {
            ms.copy_started = copy_started.clone();
        }
    }
    // A final pass after one that was evicted: that one may have stopped between an entry's
    // content and time and its ACLs and xattrs, so this one compares every entry's.
    let replaces = kind == JobKind::Copy && mb.ms.first_claim.final_pass_started.is_some();
    if kind == JobKind::Copy && !replaces {
        let now = cx.now.clone();
        record_claim(cx, mb, |c| c.final_pass_started = Some(now));
    }
    let copy = &cx.spec().copy;
    let verify = verification(copy.verify, copy.verify_mode, copy_started.as_ref());
    let attributes_since = copy_started
        .as_ref()
        .filter(|_| !replaces && attributes_of_changed_only(&mb.ms.first_claim))
        .map(changed_since);
    let job = build::job(
        &cx.req,
        &cx.image,
        &mb.m,
        &mb.subject,
        kind,
        deadline,
        build::Pass {
            verification: verify,
            source: build::SourceContents::recorded(&mb.ms.first_claim),
            attributes_since,
        },
    );
    cx.act(Action::Create(Object::Job(Box::new(job))));
    cx.wait(Duration::from_secs(1));
}

/// Whether the final pass compares the ACLs and xattrs of the entries changed since the first
/// copy pass only: after a pre-copy that compared every entry's, on an old volume of at least
/// [`build::job::ATTRIBUTES_OF_CHANGED_MIN_ENTRIES`] entries (below, comparing them all is cheaper).
fn attributes_of_changed_only(c: &ClaimStatus) -> bool {
    c.pre_copy_compared_attributes == Some(true)
        && c.source_entries
            .is_some_and(|n| n >= build::job::ATTRIBUTES_OF_CHANGED_MIN_ENTRIES)
}

/// Seconds since the epoch from which an entry counts as changed since the first copy pass
/// (created at `copy_started`): that time less the clock margin. The verification's `SINCE` and
/// the final pass's `ATTRS_SINCE` both.
fn changed_since(copy_started: &Time) -> i64 {
    copy_started.0.as_second() - super::VERIFY_CLOCK_MARGIN_SECONDS
}

/// What a verification pass compares: nothing without `spec.copy.verify`; every file's content
/// in `Full` mode, or when no first copy pass is on record (a status written before
/// `copyStarted` existed); else the content of the files changed since that pass began, less
/// the clock margin.
fn verification(verify: bool, mode: VerifyMode, copy_started: Option<&Time>) -> Verification {
    match (verify, mode, copy_started) {
        (false, ..) => Verification::Skip,
        (true, VerifyMode::Changed, Some(t)) => Verification::ChangedSince(changed_since(t)),
        (true, ..) => Verification::Full,
    }
}

/// Drives the member's Job of `kind`: creates it when missing, waits while it runs. `Ok(None)`:
/// not finished yet; `Ok(Some(result))`: it succeeded, with its parsed result when its pod
/// reported one; `Err`: it failed, with `failed(reason)` as the request's failure, or, when its
/// verification pass failed (a Verify Job, or a Copy Job verifying in its pod), with the
/// differences it counted or `VerifyFailed` ([`verification_failed`]).
fn run_job(
    cx: &mut Ctx,
    mb: &Member,
    kind: JobKind,
    failed: impl FnOnce(String) -> Failure,
) -> Result<Option<Option<JobResult>>, Failure> {
    let name = build::job_name(&cx.name(), &mb.subject, kind);
    let job = cx.o.jobs.get(&name);
    if job.is_some_and(|j| is_terminating(&j.job)) {
        // An evicted Job being replaced: wait until it is gone.
        cx.wait(Duration::from_secs(1));
        return Ok(None);
    }
    let trouble = job.and_then(|j| {
        helpers::job_trouble(
            j,
            &cx.o.helper_pods,
            cx.o.now,
            cx.settings.helper_start_timeout,
        )
    });
    match job_outcome(cx, mb, kind).cloned() {
        None => {
            create_job(cx, mb, kind);
            Ok(None)
        }
        Some(JobOutcome::Running) => match trouble {
            Some(Trouble::Stuck(reason)) => Err(failed(reason)),
            _ => {
                record_progress(cx, mb, kind);
                let created = job.and_then(|j| j.job.creation_timestamp());
                let running = created.map_or(0, |t| cx.o.now.as_second() - t.0.as_second());
                let running = Duration::from_secs(u64::try_from(running).unwrap_or(0));
                cx.wait_longer(copy_poll(running));
                Ok(None)
            }
        },
        Some(JobOutcome::Failed { reason }) => match trouble {
            Some(Trouble::Evicted(why)) => {
                replace_evicted(cx, mb, kind, why).map_err(|why| failed(format!("{reason}; {why}")))
            }
            _ => Err(failed(reason)),
        },
        Some(JobOutcome::NoSpace { result, .. }) => Err(out_of_space(mb, kind, &result)),
        Some(JobOutcome::VerifyFailed { reason, result }) => {
            Err(verification_failed(mb, &reason, &result))
        }
        Some(JobOutcome::Succeeded { message }) => Ok(Some(
            message
                .as_deref()
                .and_then(|msg| build::parse_job_result(msg).ok()),
        )),
    }
}

/// The failure of a copy pass of `kind` that found no space left on the temporary claim, with
/// every number known: the size asked for, the target's filesystem when it filled, what the
/// pass had copied, the bytes on the old claim now and at preflight.
fn out_of_space(mb: &Member, kind: JobKind, result: &JobResult) -> Failure {
    Failure::OutOfSpace(Box::new(space_report(mb, kind, result)))
}

/// The numbers of [`out_of_space`].
fn space_report(mb: &Member, kind: JobKind, result: &JobResult) -> super::failure::OutOfSpace {
    let m = &mb.m;
    let fs = result.target_filesystem.as_ref();
    let pass = match kind {
        JobKind::PreCopy => crate::api::CopyPass::PreCopy,
        _ => crate::api::CopyPass::Copy,
    };
    let copied = mb
        .ms
        .copy_progress
        .as_ref()
        .filter(|p| p.pass == pass)
        .map(|p| p.bytes_done);
    super::failure::OutOfSpace {
        pod: m.pod.clone(),
        pass: match kind {
            JobKind::PreCopy => "pre-copy",
            JobKind::Copy => "final copy",
            JobKind::Verify => "verification",
            JobKind::Measure => "measurement",
        },
        claim: m.claim.clone(),
        temp_claim: m.temp_claim.clone(),
        size: m.new_size.0.clone(),
        measured_bytes: m.used_bytes,
        used_bytes: result.used_bytes,
        target_bytes: fs.map(|f| f.block_size.saturating_mul(f.blocks)),
        copied_bytes: result.bytes.or(copied),
        fs_type: fs.map(|f| f.fs_type.clone()),
        left_bytes: None,
    }
}

/// A final copy that fitted but left the new volume almost full: less free than the headroom
/// preflight asks of a shrink, and less than the member had on its old volume (a member that
/// already ran that full is left to it). It would start on a volume it cannot write to.
fn too_full(mb: &Member, result: &JobResult) -> Option<Failure> {
    let target = result.target_filesystem.as_ref()?;
    let left = target.available_bytes();
    let had = result
        .source_filesystem
        .as_ref()
        .map(|f| f.available_bytes());
    let short =
        i128::from(left) < super::preflight::MIN_HEADROOM_BYTES && had.is_none_or(|had| left < had);
    if !short {
        return None;
    }
    let mut report = space_report(mb, JobKind::Copy, result);
    report.left_bytes = Some(left);
    Some(Failure::OutOfSpace(Box::new(report)))
}

/// Puts the running copy's latest progress reading, if any, in the member's status.
fn record_progress(cx: &mut Ctx, mb: &Member, kind: JobKind) {
    let name = build::job_name(&cx.name(), &mb.subject, kind);
    let progress = cx.o.jobs.get(&name).and_then(|j| j.progress.clone());
    if let (Some(p), Some(ms)) = (progress, ms_mut(cx, mb)) {
        ms.copy_progress = Some(p);
    }
}

/// A Job whose pod was evicted: deleted (the next pass creates it again) and counted in the
/// member's `helperEvictions`, while fewer than `--max-evictions` were; else the reason why not.
fn replace_evicted(
    cx: &mut Ctx,
    mb: &Member,
    kind: JobKind,
    why: String,
) -> Result<Option<Option<JobResult>>, String> {
    count_eviction(cx, mb, &why)?;
    delete_jobs(cx, mb, &[kind]);
    cx.wait(Duration::from_secs(1));
    Ok(None)
}

/// Counts one more eviction of the member's helper pods, with a Warning Event, while the budget
/// (`--max-evictions`) allows; `Err` once it is spent.
fn count_eviction(cx: &mut Ctx, mb: &Member, why: &str) -> Result<(), String> {
    let max = cx.settings.max_evictions;
    let done = mb.ms.helper_evictions;
    if done >= max {
        return Err(format!(
            "{why} ({done} evictions replaced already, --max-evictions is {max})"
        ));
    }
    if let Some(ms) = ms_mut(cx, mb) {
        ms.helper_evictions = done + 1;
    }
    cx.event(
        EventType::Warning,
        "HelperEvicted",
        format!("{why}; replacing it ({} of {max})", done + 1),
    );
    Ok(())
}

/// Deletes the member's Jobs of these kinds that still exist.
fn delete_jobs(cx: &mut Ctx, mb: &Member, kinds: &[JobKind]) {
    for &kind in kinds {
        let name = build::job_name(&cx.name(), &mb.subject, kind);
        if let Some(job) = cx.o.jobs.get(&name)
            && !is_terminating(&job.job)
        {
            let uid = job.job.uid();
            cx.act(Action::Delete {
                kind: Kind::Job,
                name,
                propagation: Propagation::Background,
                uid,
                resource_version: None,
            });
        }
    }
}

const ALL_JOBS: [JobKind; 3] = [JobKind::PreCopy, JobKind::Copy, JobKind::Verify];

fn is_rwop(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_some_and(|a| a.iter().any(|m| m == "ReadWriteOncePod"))
}

/// False only when the volume's node affinity names nodes by hostname and `node` is not one of
/// them (other topology keys are not judged here).
pub(crate) fn volume_reachable_from(pv: &PersistentVolume, node: &str) -> bool {
    let Some(terms) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms)
    else {
        return true;
    };
    terms.iter().any(|t| {
        let exprs = t.match_expressions.as_deref().unwrap_or_default();
        let fields = t.match_fields.as_deref().unwrap_or_default();
        exprs
            .iter()
            .filter(|e| e.key == labels::HOSTNAME_LABEL && e.operator == "In")
            .chain(
                fields
                    .iter()
                    .filter(|e| e.key == "metadata.name" && e.operator == "In"),
            )
            .all(|e| {
                e.values
                    .as_ref()
                    .is_some_and(|v| v.iter().any(|v| v == node))
            })
    })
}

// ------------------------------------------------------------------------------------------
// The steps, in order.

/// Temporary claim on the target class and size; a mounter pod pinned to the member's node when
/// the class waits for a consumer; until it is bound.
fn creating_claim(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let plan = cx.status.plan.clone().unwrap_or_default();
    let m = &mb.m;
    let target = cx.o.storage_classes.get(&plan.target_storage_class);
    let wffc = target.is_some_and(class_is_wffc);
    let mounter = build::mounter_name(&cx.name(), &mb.subject);
    let Some(temp) = cx.o.claims.get(&m.temp_claim) else {
        return create_temp_claim(cx, mb, &plan, wffc);
    };
    if !claims::temp_claim_is_ours(temp, &cx.o.request) {
        return Err(Failure::TempClaimNotOurs {
            claim: m.temp_claim.clone(),
            pod: m.pod.clone(),
            found: claims::claim_origin(temp),
        });
    }
    if is_terminating(temp) {
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    match (claim_phase(temp), claim_volume(temp)) {
        ("Bound", Some(volume)) => temp_claim_bound(cx, mb, volume, mounter)?,
        ("Lost", _) => {
            return Err(Failure::TempClaimLost {
                claim: m.temp_claim.clone(),
            });
        }
        _ => {
            if wffc {
                mounter_pod(cx, mb, mounter)?;
            }
            cx.wait(Duration::from_secs(1));
        }
    }
    Ok(())
}

/// The mounter pod of a WaitForFirstConsumer claim: created when missing; one that cannot start
/// fails the member with its reason; an evicted one is deleted (and created again on the next
/// pass) within the eviction budget.
fn mounter_pod(cx: &mut Ctx, mb: &Member, mounter: String) -> Result<(), Failure> {
    let m = &mb.m;
    let Some(pod) = cx.o.helper_pods.get(&mounter) else {
        let mounter_pod = build::mounter_pod(&cx.req, &cx.image, m, &mb.subject);
        let pod = build::Manifest::from_typed(mounter_pod).map_err(|e| Failure::MounterPod {
            error: e.to_string(),
        })?;
        cx.act(Action::Create(Object::Pod(Box::new(pod))));
        return Ok(());
    };
    let stuck = |reason: String| Failure::MounterStuck {
        pod: m.pod.clone(),
        reason,
    };
    match helpers::pod_trouble(pod, cx.o.now, cx.settings.helper_start_timeout) {
        Some(Trouble::Stuck(reason)) => Err(stuck(reason)),
        Some(Trouble::Evicted(why)) if !is_terminating(pod) => {
            let uid = pod.uid();
            count_eviction(cx, mb, &why).map_err(stuck)?;
            cx.delete(Kind::Pod, mounter, uid);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Creates the temporary claim from the member's original claim.
fn create_temp_claim(cx: &mut Ctx, mb: &Member, plan: &Plan, wffc: bool) -> Result<(), Failure> {
    let m = &mb.m;
    let Some(original) = cx.o.claims.get(&m.claim) else {
        return Err(Failure::ClaimDisappeared {
            claim: m.claim.clone(),
            pod: m.pod.clone(),
        });
    };
    let mut claim = build::temp_claim(&cx.req, plan, m, original);
    if !wffc {
        // An Immediate class may place the volume on any node; provisioners that honour
        // the selected-node annotation put it where the member's data is.
        claim
            .annotations_mut()
            .insert(SELECTED_NODE_ANNOTATION.to_string(), m.node.clone());
    }
    cx.event(
        EventType::Normal,
        "ClaimCreated",
        format!(
            "created temporary claim {} on StorageClass {} ({}) for member {}",
            m.temp_claim, plan.target_storage_class, m.new_size.0, m.pod
        ),
    );
    cx.act(Action::Create(Object::Claim(Box::new(claim))));
    cx.wait(Duration::from_secs(1));
    Ok(())
}

/// The temporary claim is bound to `volume`: record the volume, check the member's node reaches
/// it, remove the mounter pod, then go on with the pre-copy, or straight to the gate before the
/// stop when the pre-copy is off or the original claim is ReadWriteOncePod (no second mount).
fn temp_claim_bound(
    cx: &mut Ctx,
    mb: &Member,
    volume: &str,
    mounter: String,
) -> Result<(), Failure> {
    let m = &mb.m;
    if mb.ms.first_claim.new_volume.as_deref() != Some(volume) {
        record_claim(cx, mb, |c| c.new_volume = Some(volume.to_string()));
        cx.requeue = Duration::ZERO;
        return Ok(());
    }
    if let Some(pv) = cx.o.volumes.get(volume)
        && !volume_reachable_from(pv, &m.node)
    {
        return Err(Failure::VolumeUnreachable {
            volume: volume.to_string(),
            node: m.node.clone(),
            pod: m.pod.clone(),
        });
    }
    if let Some(pod) = cx.o.helper_pods.get(&mounter) {
        if !is_terminating(pod) {
            let uid = pod.uid();
            cx.delete(Kind::Pod, mounter, uid);
        }
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    // One choice for every claim of the member: none is pre-copied if one is ReadWriteOncePod.
    let any_rwop = claims::member_claims(&mb.planned, &mb.ms)
        .iter()
        .any(|c| cx.o.claims.get(c.claim()).is_some_and(is_rwop));
    let pre_copy = cx.spec().copy.pre_copy && !any_rwop;
    // The member's first copy (or its gate, without one) waits while the operator's copy caps
    // are reached; it is still serving, and keeps its slot until its final copy is done.
    let last_claim = mb.slot + 1 >= mb.claims;
    if last_claim && super::slots::hold(cx, &mb.m.pod, &mb.m.node) {
        return Ok(());
    }
    advance(
        cx,
        mb,
        if pre_copy {
            MemberStep::PreCopying
        } else {
            MemberStep::GatingStop
        },
    );
    Ok(())
}

/// First rsync pass while the member serves.
fn pre_copying(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let pod = mb.m.pod.clone();
    let Some(result) = run_job(cx, mb, JobKind::PreCopy, |reason| Failure::PreCopyFailed {
        pod,
        reason,
    })?
    else {
        return Ok(());
    };
    let with = match result.as_ref().and_then(|r| r.mode) {
        Some(build::CopyMode::KernelCopy) => "cp",
        _ => "rsync",
    };
    let note = match result.as_ref().and_then(|r| r.bytes) {
        Some(bytes) => format!(
            "pre-copied {} ({} files) with {with} while the member served",
            super::quantity::human(i128::from(bytes)),
            result.as_ref().and_then(|r| r.files).unwrap_or_default()
        ),
        None => format!("pre-copied with {with} while the member served"),
    };
    if let Some(ms) = ms_mut(cx, mb) {
        ms.message = Some(note.clone());
    }
    let contents = result
        .as_ref()
        .and_then(|r| r.source_filesystem.as_ref())
        .and_then(build::FsReport::contents);
    let compared =
        result.as_ref().and_then(|r| r.attributes_compared) == Some(build::AttributesCompared::All);
    record_claim(cx, mb, |s| {
        if let Some(c) = contents {
            s.source_entries = Some(c.entries);
            s.source_bytes = Some(c.bytes);
        }
        s.pre_copy_compared_attributes = compared.then_some(true);
    });
    if let Some(c) = contents {
        check_memory_fits(cx, mb, c)?;
    }
    advance(cx, mb, MemberStep::GatingStop);
    cx.event(
        EventType::Normal,
        "PreCopied",
        format!("member {}: {note}", mb.m.pod),
    );
    delete_jobs(cx, mb, &[JobKind::PreCopy]);
    Ok(())
}

/// Before the member stops: a memory limit the request sets on its copy pods
/// (`spec.copy.resources.limits.memory`) must hold what the final pass needs for the old
/// volume's contents ([`build::copy_memory`]); else the final pass could be killed for memory
/// while the member is down. The member still serves: the request fails here, naming both.
fn check_memory_fits(cx: &Ctx, mb: &Member, c: build::SourceContents) -> Result<(), Failure> {
    let limit = cx
        .spec()
        .copy
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"));
    let Some(limit) = limit else {
        return Ok(());
    };
    let needed = build::copy_memory(c);
    let (Some(have), Some(need)) = (
        super::quantity::bytes(limit),
        super::quantity::bytes(&needed),
    ) else {
        return Ok(());
    };
    if have >= need {
        return Ok(());
    }
    Err(Failure::CopyMemoryTooLow(Box::new(MemoryShortfall {
        pod: mb.m.pod.clone(),
        claim: mb.m.claim.clone(),
        needed: needed.0,
        entries: c.entries,
        bytes: super::quantity::human(i128::from(c.bytes)),
        limit: limit.0.clone(),
    })))
}

/// The PodDisruptionBudgets that select the member, then the engine's gate before the member
/// stops; an etcd leader hands its leadership over first.
fn gating_stop(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let pod = mb.m.pod.clone();
    if disruption::hold(cx, &pod) {
        return Ok(());
    }
    let report = match &cx.o.health {
        Ok(r) => r.clone(),
        Err(e) => {
            waiting_for_health(cx, &format!("the database's health cannot be read: {e}"));
            return Ok(());
        }
    };
    if let Some((reason, stable_at)) = unstable_member(cx) {
        waiting_for_stability(cx, &reason, stable_at);
        return Ok(());
    }
    if handover_unfinished(cx, &report, &pod) {
        return Ok(());
    }
    match engine::rules(&cx.spec().database).gate_before_stop(&report, &pod) {
        Gate::Open => {
            cx.set_condition(
                conditions::HEALTH_GATE,
                true,
                "Open",
                &format!("member {pod} may stop"),
            );
            advance(cx, mb, MemberStep::StoppingPod);
        }
        Gate::TransferLeadershipFirst => transfer_leadership(cx, &report, &pod),
        Gate::Wait(reason) => waiting_for_health(cx, &reason),
    }
    Ok(())
}

/// A handover asked of `pod` that the engine does not see complete ([`Rules::handed_over`]: a
/// ZooKeeper leader left an observer when its handover was cut short between its two
/// reconfigurations) is asked again, and the member does not stop. True when it is.
///
/// [`Rules::handed_over`]: crate::engine::Rules::handed_over
fn handover_unfinished(cx: &mut Ctx, report: &HealthReport, pod: &str) -> bool {
    let asked = (cx.status.members.iter())
        .find(|m| m.pod == pod)
        .and_then(|m| m.leader_change.as_ref())
        .is_some_and(|c| c.how == LeaderChangeKind::Handover);
    if !asked || engine::rules(&cx.spec().database).handed_over(report, pod) {
        return false;
    }
    transfer_leadership(cx, report, pod);
    true
}

/// The member is the leader: hand its leadership to a healthy, caught-up member, or wait.
fn transfer_leadership(cx: &mut Ctx, report: &HealthReport, pod: &str) {
    let migrated: Vec<String> = cx
        .status
        .members
        .iter()
        .filter(|m| m.step.settled())
        .map(|m| m.pod.clone())
        .collect();
    match engine::rules(&cx.spec().database).handover_target(report, pod, &migrated) {
        Some(to) => {
            cx.event(
                EventType::Normal,
                "LeaderTransfer",
                format!("member {pod} is the leader: handing leadership to {to}"),
            );
            start_leader_change(cx, pod, LeaderChangeKind::Handover);
            cx.act(Action::TransferLeadership {
                from: pod.to_string(),
                to,
            });
            cx.wait(Duration::from_secs(1));
        }
        None => waiting_for_health(
            cx,
            &format!(
                "member {pod} is the leader and no healthy, caught-up member can take over ({})",
                Gate::TransferLeadershipFirst
            ),
        ),
    }
}

/// Records that leadership starts to leave `pod` (its first handover asked, or its pod deleted
/// while it leads); [`note_leader_change`] records its end.
fn start_leader_change(cx: &mut Ctx, pod: &str, how: LeaderChangeKind) {
    let now = MicroTime(cx.now.0);
    let Some(ms) = cx.status.members.iter_mut().find(|m| m.pod == pod) else {
        return;
    };
    if ms.leader_change.as_ref().is_some_and(|c| c.how == how) {
        return;
    }
    ms.leader_change = Some(LeaderChange {
        from: pod.to_string(),
        to: None,
        how,
        started: now,
        seconds: None,
        leaderless: None,
        election_seconds: None,
    });
}

/// Member `i`'s leader change is done once the members agree on another leader: records who
/// and how long after its start ([`start_leader_change`]); for an election, also when no member
/// was first seen leading, and how long after that. Looks again within a second while it
/// waits.
fn note_leader_change(cx: &mut Ctx, i: usize) {
    let Ok(report) = &cx.o.health else {
        return;
    };
    let now = cx.now.0;
    let Some(change) = (cx.status.members.get_mut(i))
        .and_then(|m| m.leader_change.as_mut())
        .filter(|c| c.seconds.is_none())
    else {
        return;
    };
    if change.how == LeaderChangeKind::Election
        && change.leaderless.is_none()
        && report.leader.is_none()
    {
        change.leaderless = Some(MicroTime(now));
    }
    let seconds = |since: k8s_openapi::jiff::Timestamp| {
        (now.as_millisecond() - since.as_millisecond()).max(0)
    };
    match report.leader.as_ref().filter(|l| **l != change.from) {
        Some(leader) => {
            change.to = Some(leader.clone());
            change.seconds = Some(seconds(change.started.0) as f64 / 1000.0);
            change.election_seconds =
                (change.leaderless.as_ref()).map(|s| seconds(s.0) as f64 / 1000.0);
        }
        None => cx.wait(Duration::from_secs(1)),
    }
}

/// The same gates as `GatingStop` (budgets, health), checked again just before the running
/// pod is deleted. True when both are open; when one is closed, the pod is not deleted: the
/// member waits in `StoppingPod` (an etcd leader hands its leadership over first).
fn gate_still_open(cx: &mut Ctx, pod: &str) -> bool {
    if disruption::hold(cx, pod) {
        return false;
    }
    let report = match &cx.o.health {
        Ok(r) => r.clone(),
        Err(e) => {
            waiting_for_health(
                cx,
                &format!(
                    "member pod {pod} is not deleted: the database's health cannot be read: {e}"
                ),
            );
            return false;
        }
    };
    if let Some((reason, stable_at)) = unstable_member(cx) {
        let reason = format!("member pod {pod} is not deleted: {reason}");
        waiting_for_stability(cx, &reason, stable_at);
        return false;
    }
    if handover_unfinished(cx, &report, pod) {
        return false;
    }
    match engine::rules(&cx.spec().database).gate_before_stop(&report, pod) {
        Gate::Open => {
            cx.set_condition(
                conditions::HEALTH_GATE,
                true,
                "Open",
                &format!("member {pod} may stop"),
            );
            true
        }
        Gate::TransferLeadershipFirst => {
            transfer_leadership(cx, &report, pod);
            false
        }
        Gate::Wait(reason) => {
            waiting_for_health(
                cx,
                &format!(
                    "member pod {pod} is not deleted: the health gate closed again ({reason})"
                ),
            );
            false
        }
    }
}

/// Why the gate waits for stability, if it does: the first member pod of the plan that has not
/// been running and Ready, with no restart, for `--stable-window` ([`super::stability`]); and
/// when every member will be, if none changes before.
fn unstable_member(cx: &Ctx) -> Option<(String, Option<k8s_openapi::jiff::Timestamp>)> {
    let plan = cx.status.plan.as_ref()?;
    let pods = || {
        (plan.members.iter()).map(|m| (m.pod.as_str(), cx.o.pods.get(&m.pod).map(|p| p.typed())))
    };
    let window = cx.settings.stable_window;
    let reason = super::stability::first_unstable(pods(), cx.o.now, window)?;
    let stable_at = super::stability::stable_at(pods().map(|(_, p)| p), window);
    Some((reason, stable_at))
}

/// The gate waits for the members to be stable: as [`waiting_for_health`], but looking again
/// only when they will be (`stable_at`, when known), not every 2 s: a member pod that changes
/// before (a restart, Ready lost) wakes the request through the watch of the pods.
fn waiting_for_stability(
    cx: &mut Ctx,
    reason: &str,
    stable_at: Option<k8s_openapi::jiff::Timestamp>,
) {
    if cx.set_condition(conditions::HEALTH_GATE, false, "Waiting", reason) {
        cx.event(EventType::Warning, "WaitingForHealth", reason.to_string());
    }
    let until = stable_at.and_then(|at| Duration::try_from(at.duration_since(cx.o.now)).ok());
    match until {
        // Just past it: the gate counts whole seconds since times on record in whole seconds.
        Some(until) => cx.wait_longer(until + Duration::from_millis(100)),
        None => cx.wait(Duration::from_secs(2)),
    }
}

/// Health gate closed: a condition and an Event (once per reason), and look again soon.
fn waiting_for_health(cx: &mut Ctx, reason: &str) {
    if cx.set_condition(conditions::HEALTH_GATE, false, "Waiting", reason) {
        cx.event(EventType::Warning, "WaitingForHealth", reason.to_string());
    }
    cx.wait(Duration::from_secs(2));
}

/// Stash the pod's manifest, delete the pod (only while the health gate is open), wait until
/// it is gone.
fn stopping_pod(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    let pod = cx.o.pods.get(&m.pod).cloned();
    if !cx.o.stash.pods.contains_key(&m.pod) {
        return match pod {
            // The raw JSON as the API server returned it: recreated from it, the pod keeps
            // every field, also those our API structs do not know.
            Some(p) if !is_terminating(p.typed()) => stash(cx, StashKey::Pod(m.pod.clone()), &p),
            _ => Err(Failure::PodDisappeared { pod: m.pod.clone() }),
        };
    }
    match pod {
        Some(p) if !is_terminating(p.typed()) => {
            if !gate_still_open(cx, &m.pod) {
                return Ok(());
            }
            let now = cx.now.clone();
            if mb.ms.pod_deleted_at.is_none()
                && let Some(ms) = ms_mut(cx, mb)
            {
                ms.pod_deleted_at = Some(now);
            }
            let leads = (cx.o.health.as_ref()).is_ok_and(|r| r.leader.as_ref() == Some(&m.pod));
            if leads {
                start_leader_change(cx, &m.pod, LeaderChangeKind::Election);
            }
            cx.delete(Kind::Pod, m.pod.clone(), p.uid());
            cx.wait(Duration::from_secs(1));
        }
        Some(p) => {
            let bound = cx.settings.helper_start_timeout;
            if let Some(lost) = helpers::lost_pod(p.typed(), &cx.o.nodes, cx.o.now, bound)
                && may_force(cx, &m.pod, &lost)
            {
                // The rollback's `undo` force-deletes it (this decision's actions are dropped).
                return Err(Failure::NodeLost {
                    pod: m.pod.clone(),
                    node: lost.node,
                    node_state: lost.node_state,
                    waited: lost.waited,
                });
            }
            cx.wait(Duration::from_secs(1));
        }
        None => {
            if let Some(failure) = deleted_on_lost_node(cx, mb) {
                return Err(failure);
            }
            lost_node_over(cx, &format!("member pod {} is gone", m.pod));
            let now = cx.now.clone();
            if mb.ms.pod_deleted_at.is_none()
                && let Some(ms) = ms_mut(cx, mb)
            {
                ms.pod_deleted_at = Some(now);
            }
            advance(cx, mb, MemberStep::Copying);
            cx.event(
                EventType::Normal,
                "PodStopped",
                format!("member pod {} is stopped; copying its data", m.pod),
            );
        }
    }
    Ok(())
}

/// Records the final pass's numbers in the member's status, with an Event.
fn record_copy(cx: &mut Ctx, mb: &Member, copied: Option<&JobResult>) {
    let m = &mb.m;
    let bytes = copied.and_then(|r| r.bytes).unwrap_or(0);
    let files = copied.and_then(|r| r.files).unwrap_or(0);
    let written = copied.and_then(|r| r.literal_bytes);
    let listed = copied.and_then(|r| r.listed_entries);
    record_claim(cx, mb, |c| {
        c.bytes_copied = Some(bytes);
        c.files_copied = Some(files);
        c.bytes_written = written;
        c.final_pass_listed_entries = listed;
    });
    let wrote = match (written, copied.and_then(|r| r.mode)) {
        (Some(w), Some(build::CopyMode::Delta)) => format!(
            " (delta transfer: wrote {})",
            super::quantity::human(i128::from(w))
        ),
        (_, Some(build::CopyMode::WholeFile)) => {
            " (whole files: the target has hard-linked files, or `find` could not tell)".to_string()
        }
        (_, Some(build::CopyMode::KernelCopy)) => {
            " (with cp: no pre-copy ran, the new volume was empty)".to_string()
        }
        _ => String::new(),
    };
    cx.event(
        EventType::Normal,
        "Copied",
        format!(
            "member {}: copied {} in {files} files from {} to {}{wrote}",
            m.pod,
            super::quantity::human(i128::from(bytes)),
            m.claim,
            m.temp_claim
        ),
    );
}

/// Records a verification that found no difference, with an Event saying what it compared.
fn record_verified(cx: &mut Ctx, mb: &Member, result: Option<&JobResult>) {
    let m = &mb.m;
    let now = cx.now.clone();
    let checked = result.and_then(|r| r.checked_files);
    record_claim(cx, mb, |c| {
        c.verified = Some(now);
        c.verified_files = checked;
    });
    let what = match (result.and_then(|r| r.verify_mode), checked) {
        (Some(VerifyMode::Changed), Some(n)) => format!(
            "in metadata, and in content for the {n} files changed since the first copy pass"
        ),
        _ => "in content and metadata".to_string(),
    };
    cx.event(
        EventType::Normal,
        "Verified",
        format!(
            "member {}: {} and {} match {what}",
            m.pod, m.claim, m.temp_claim
        ),
    );
}

/// Final rsync pass while the member is down, then the verification pass.
fn copying(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    if cx.o.pods.contains_key(&m.pod) {
        return Err(Failure::PodCameBack { pod: m.pod.clone() });
    }
    if let Some(others) = other_claim_users(&cx.o.claim_users, &m.claim, &m.pod) {
        return Err(Failure::ClaimSharedDuringCopy {
            pod: m.pod.clone(),
            claim: m.claim.clone(),
            others,
        });
    }
    let Some(copied) = run_job(cx, mb, JobKind::Copy, |reason| Failure::CopyFailed {
        claim: m.claim.clone(),
        temp_claim: m.temp_claim.clone(),
        reason,
    })?
    else {
        return Ok(());
    };
    if let Some(full) = copied.as_ref().and_then(|r| too_full(mb, r)) {
        return Err(full);
    }
    if mb.ms.first_claim.bytes_copied.is_none() {
        record_copy(cx, mb, copied.as_ref());
    }
    if cx.spec().copy.verify {
        // Verified in the copy's own pod; a Copy Job without that pass (created by an operator
        // before it verified there) gets the verification Job.
        let verified = match copied.filter(JobResult::verified_in_pass) {
            Some(result) => Some(result),
            None => {
                let Some(verified) =
                    run_job(cx, mb, JobKind::Verify, |reason| Failure::VerifyFailed {
                        pod: m.pod.clone(),
                        reason,
                    })?
                else {
                    return Ok(());
                };
                verified
            }
        };
        check_verified(cx, mb, verified)?;
    }
    advance(cx, mb, MemberStep::RetainingVolumes);
    delete_jobs(cx, mb, &ALL_JOBS);
    // The claim's stash, which RetainingVolumes needs first, goes with this decision: one
    // round less of the member's downtime.
    match cx.o.claims.get(&m.claim).cloned() {
        Some(c)
            if claim_volume(&c) == Some(m.old_volume.as_str())
                && !cx.o.stash.claims.contains_key(&m.claim) =>
        {
            stash(cx, StashKey::Claim(m.claim.clone()), &c)
        }
        _ => Ok(()),
    }
}

/// A verification that passed is recorded; differences, or no count at all, fail the member.
fn check_verified(cx: &mut Ctx, mb: &Member, verified: Option<JobResult>) -> Result<(), Failure> {
    let m = &mb.m;
    match verified.as_ref().and_then(|r| r.differences) {
        Some(0) => {
            record_verified(cx, mb, verified.as_ref());
            Ok(())
        }
        Some(n) => Err(differences(m, n)),
        None => Err(Failure::NoVerification {
            pod: m.pod.clone(),
            result: verified.map(Box::new),
        }),
    }
}

fn differences(m: &PlannedMember, n: i64) -> Failure {
    Failure::Differences {
        pod: m.pod.clone(),
        differences: n,
        claim: m.claim.clone(),
        temp_claim: m.temp_claim.clone(),
    }
}

/// A Job whose verification pass failed: the differences it counted, or why it could not
/// compare.
fn verification_failed(mb: &Member, reason: &str, result: &JobResult) -> Failure {
    match result.differences {
        Some(n) if n > 0 => differences(&mb.m, n),
        _ => Failure::VerifyFailed {
            pod: mb.m.pod.clone(),
            reason: reason.to_string(),
        },
    }
}

/// From here on the swap is finished even on failure. Stash the original claim; record both
/// volumes' reclaim policies; set both to Retain.
fn retaining_volumes(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    if pod_reappeared(cx, mb) {
        return Ok(());
    }
    if !cx.o.stash.claims.contains_key(&m.claim) {
        match cx.o.claims.get(&m.claim).cloned() {
            Some(c) if claim_volume(&c) == Some(m.old_volume.as_str()) => {
                return stash(cx, StashKey::Claim(m.claim.clone()), &c);
            }
            _ => {
                stuck(
                    cx,
                    Stuck::StashEntry,
                    &format!("claim {} is gone and was not stashed", m.claim),
                );
                return Ok(());
            }
        }
    }
    let Some(new_name) = mb.ms.first_claim.new_volume.clone() else {
        stuck(
            cx,
            Stuck::Volume,
            &format!("member {} has no new volume recorded", m.pod),
        );
        return Ok(());
    };
    let (Some(old), Some(new)) = (
        cx.o.volumes.get(&m.old_volume).cloned(),
        cx.o.volumes.get(&new_name).cloned(),
    ) else {
        stuck(
            cx,
            Stuck::Volume,
            &format!(
                "volume {} or {new_name} of member {} is missing",
                m.old_volume, m.pod
            ),
        );
        return Ok(());
    };
    // Recorded in the status, which is written before any action of this decision (status
    // first): a patch below never runs unless the original policy is on record.
    record_claim(cx, mb, |c| {
        c.old_volume_original_policy
            .get_or_insert_with(|| volume_policy(&old));
        c.new_volume_original_policy
            .get_or_insert_with(|| volume_policy(&new));
    });
    let mut patched = false;
    for (name, pv) in [(&m.old_volume, &old), (&new_name, &new)] {
        if volume_policy(pv) != "Retain" {
            cx.act(Action::PatchReclaimPolicy {
                volume: name.clone(),
                policy: "Retain".to_string(),
            });
            patched = true;
        }
    }
    if !patched {
        advance(cx, mb, MemberStep::DeletingOldClaim);
    }
    Ok(())
}

/// Delete the original claim (its volume is Retain) until it is gone: only the claim stashed
/// (by its uid), only once no pod uses it, and only while both volumes of the claim are seen
/// on Retain in this decision's snapshot ([`retain`]).
fn deleting_old_claim(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    if pod_reappeared(cx, mb) || retain::hold_swap(cx, mb) {
        return Ok(());
    }
    match cx.o.claims.get(&m.claim) {
        Some(c)
            if claim_volume(c) == mb.ms.first_claim.new_volume.as_deref()
                && claim_volume(c).is_some() =>
        {
            // Already recreated on the new volume.
            advance(cx, mb, MemberStep::DeletingTempClaim);
        }
        Some(c) if !is_terminating(c) => {
            let Some(stashed) = cx.o.stash.claims.get(&m.claim).map(|s| s.uid()) else {
                stuck(
                    cx,
                    Stuck::StashEntry,
                    &format!("the stash of claim {} is missing", m.claim),
                );
                return Ok(());
            };
            if c.uid() != stashed {
                return Err(Failure::ClaimReplaced {
                    claim: m.claim.clone(),
                    stashed_uid: stashed.unwrap_or_default(),
                    live_uid: c.uid().unwrap_or_default(),
                });
            }
            delete_jobs(cx, mb, &ALL_JOBS);
            if let Some(holder) = pod_using_claim(cx, &m.claim) {
                stuck(
                    cx,
                    Stuck::ClaimInUse,
                    &format!(
                        "claim {} is still used by pod {holder}: it is deleted once no pod uses it",
                        m.claim
                    ),
                );
                return Ok(());
            }
            if let Err(why) = retain::delete_allowed(cx.o, c) {
                stuck(
                    cx,
                    Stuck::Volume,
                    &format!("{why}: the claim is not deleted"),
                );
                return Ok(());
            }
            cx.delete(Kind::Claim, m.claim.clone(), stashed);
            delete_temp_claim(cx, mb);
            remove_finished_users(cx, mb);
            cx.wait(SWAP_POLL);
        }
        Some(_) => {
            // pvc-protection: gone once no pod uses it.
            delete_jobs(cx, mb, &ALL_JOBS);
            delete_temp_claim(cx, mb);
            remove_finished_users(cx, mb);
            cx.wait(SWAP_POLL);
        }
        None => advance(cx, mb, MemberStep::DeletingTempClaim),
    }
    Ok(())
}

/// Force-deletes (grace period 0, by uid) our finished helper pods, a copy or verify Job's pod
/// that `Succeeded` or `Failed`, whose volumes name the member's claim or temporary claim, as
/// Kubernetes' pod garbage collector deletes terminated pods: their containers have exited, so
/// nothing is cut short, but claim protection keeps a deleted claim while such a pod object
/// exists (every version: its deletion check counts a scheduled pod whatever its phase; only
/// the `Unused` condition of 1.36+ ignores finished pods; measured on 1.37: held 60 s, gone
/// 0.15 s after the pod), and the swap would wait for the Job's garbage collection to remove
/// it. A pod still running is never touched here.
fn remove_finished_users(cx: &mut Ctx, mb: &Member) {
    let names = [mb.m.claim.as_str(), mb.m.temp_claim.as_str()];
    let finished: Vec<(String, Option<String>)> =
        cx.o.helper_pods
            .values()
            .filter(|p| pod_finished(p) && claims_named(p).any(|c| names.contains(&c)))
            .map(|p| (p.name_any(), p.uid()))
            .collect();
    for (name, uid) in finished {
        cx.act(Action::ForceDeletePod { name, uid });
    }
}

/// Deletes the temporary claim (by its uid) unless it is gone or going. Both volumes are on
/// Retain from this step on, so it can go together with the original claim: the swap then waits
/// once for both rather than once for each (the claim swap is all downtime).
fn delete_temp_claim(cx: &mut Ctx, mb: &Member) {
    let Some(c) = cx.o.claims.get(&mb.m.temp_claim) else {
        return;
    };
    if is_terminating(c) {
        return;
    }
    match retain::delete_allowed(cx.o, c) {
        Ok(()) => cx.delete(Kind::Claim, mb.m.temp_claim.clone(), c.uid()),
        Err(why) => stuck(
            cx,
            Stuck::Volume,
            &format!("{why}: the claim is not deleted"),
        ),
    }
}

/// The first pod (member or helper, terminating or not) whose volumes name `claim`, unless it
/// has finished (`Succeeded`, `Failed`): a finished pod (e.g. the pod of a deleted copy Job) no
/// longer uses it, as the claim's `Unused` condition says; claim protection still waits for
/// such a pod object to go, which [`remove_finished_users`] sees to.
fn pod_using_claim(cx: &Ctx, claim: &str) -> Option<String> {
    let uses = |pod: &Pod| claims_held(pod).any(|c| c == claim);
    let members = cx.o.pods.values().map(|p| p.typed());
    members
        .chain(cx.o.helper_pods.values())
        .find(|p| uses(p))
        .map(|p| p.name_any())
}

/// During the swap the member's pod must stay gone (the operator recreates it only after the
/// swap): a pod of that name that appeared anyway holds the swap where it is, with a message
/// naming it; the request's timeout bounds the wait. True when it is there. Rolling back, the
/// swap is not held (see `foreign::hold_in_rollback`: a member whose old claim is still in place
/// is held on it before this; after that the remaining steps touch only the operator's own
/// temporary claim and new volume, and no rollback waits without end).
fn pod_reappeared(cx: &mut Ctx, mb: &Member) -> bool {
    if mb.mode == Mode::Rollback {
        return false;
    }
    let Some(pod) = cx.o.pods.get(&mb.m.pod) else {
        return false;
    };
    let uid = pod.uid().unwrap_or_default();
    stuck(
        cx,
        Stuck::PodDuringSwap,
        &format!(
            "member pod {} (uid {uid}) appeared while its claims are being swapped; the swap waits until it is gone",
            mb.m.pod
        ),
    );
    true
}

/// Delete the temporary claim (its volume, the new one, is Retain) until it is gone.
fn deleting_temp_claim(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    if pod_reappeared(cx, mb) || retain::hold_swap(cx, mb) {
        return Ok(());
    }
    match cx.o.claims.get(&m.temp_claim) {
        Some(_) => {
            delete_temp_claim(cx, mb);
            cx.wait(SWAP_POLL);
        }
        None => advance(cx, mb, MemberStep::ReleasingNewVolume),
    }
    Ok(())
}

/// Point the new volume's claimRef at the original claim name (namespace and name only).
fn releasing_new_volume(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    if pod_reappeared(cx, mb) || retain::hold_swap(cx, mb) {
        return Ok(());
    }
    let Some(name) = mb.ms.first_claim.new_volume.clone() else {
        stuck(
            cx,
            Stuck::Volume,
            &format!("member {} has no new volume recorded", m.pod),
        );
        return Ok(());
    };
    let Some(pv) = cx.o.volumes.get(&name) else {
        stuck(
            cx,
            Stuck::Volume,
            &format!("new volume {name} of member {} is missing", m.pod),
        );
        return Ok(());
    };
    let ns = cx.o.request.namespace().unwrap_or_default();
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let live_uid = cx.o.claims.get(&m.claim).and_then(|c| c.uid());
    let points_at_claim = claim_ref.is_some_and(|r| {
        r.name.as_deref() == Some(m.claim.as_str())
            && r.namespace.as_deref() == Some(ns.as_str())
            && (r.uid.is_none() || r.uid == live_uid)
    });
    // Wait until the PV controller has seen the new claimRef: it writes `Available` once it
    // has (and keeps that in its own cache). A volume still `Bound` is the controller's old
    // view (bound to the temporary claim): a claim created then meets that stale cache, is
    // left Pending with no retry, and binds only at the periodic sync (~15 s; measured on
    // 1.37: 8% of swaps). `Bound` is ready only to the live claim's uid (a resumed swap).
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let bound_to_live = phase == Some("Bound")
        && live_uid.is_some()
        && claim_ref.and_then(|r| r.uid.clone()) == live_uid;
    if points_at_claim && (phase == Some("Available") || bound_to_live) {
        advance(cx, mb, MemberStep::RecreatingClaim);
    } else if points_at_claim {
        cx.wait(SWAP_POLL);
    } else {
        cx.act(Action::SetClaimRef {
            volume: name,
            claim: m.claim.clone(),
        });
        cx.wait(SWAP_POLL);
    }
    Ok(())
}

/// Waits for a pre-bound claim to bind. The PV controller binds one at once (0.24 s median on
/// 1.37), unless its first attempt lost a race: its claim worker binds the volume, its volume
/// worker sees that update and sets the volume's phase, and the claim worker's own update then
/// conflicts. Kubernetes 1.36 and later retry that at once (kubernetes#135402); before 1.36 only
/// the periodic sync (~15 s) looks again, and an update of the claim makes it look again now.
/// The lost race shows as a volume whose claimRef carries the claim's uid while the claim is
/// still Pending: such a claim is nudged [`BIND_NUDGE_LOST_RACE_SECONDS`] after its creation;
/// one whose volume shows no binding [`BIND_NUDGE_FALLBACK_SECONDS`] after it; then once every
/// [`BIND_NUDGE_AFTER_SECONDS`]. On 1.36+ a claim binds before either (no nudge in 600
/// measured swaps once `swapping` waits for `Available`).
fn nudge_binding(cx: &mut Ctx, claim: &str, c: &PersistentVolumeClaim, volume: &str) {
    let now = cx.o.now.as_second();
    let last_nudge = c
        .annotations()
        .get(BIND_NUDGE_ANNOTATION)
        .and_then(|v| v.parse::<i64>().ok());
    let volume_side_bound =
        cx.o.volumes
            .get(volume)
            .and_then(|pv| pv.spec.as_ref()?.claim_ref.as_ref()?.uid.clone())
            .is_some_and(|uid| c.uid().as_deref() == Some(uid.as_str()));
    let age = c
        .creation_timestamp()
        .map_or(i64::MAX, |t| now - t.0.as_second());
    let due = match last_nudge {
        Some(last) => now - last >= BIND_NUDGE_AFTER_SECONDS,
        None => {
            (volume_side_bound && age >= BIND_NUDGE_LOST_RACE_SECONDS)
                || age >= BIND_NUDGE_FALLBACK_SECONDS
        }
    };
    if due {
        cx.act(Action::AnnotateClaim {
            claim: claim.to_string(),
            key: BIND_NUDGE_ANNOTATION.to_string(),
            value: Some(now.to_string()),
        });
    }
    cx.wait(SWAP_POLL);
}

/// Recreate the claim under its original name, bound to the new volume; wait until Bound.
fn recreating_claim(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    if pod_reappeared(cx, mb) || retain::hold_swap(cx, mb) {
        return Ok(());
    }
    let plan = cx.status.plan.clone().unwrap_or_default();
    let Some(new_volume) = mb.ms.first_claim.new_volume.clone() else {
        stuck(
            cx,
            Stuck::Volume,
            &format!("member {} has no new volume recorded", m.pod),
        );
        return Ok(());
    };
    match cx.o.claims.get(&m.claim) {
        None => {
            let Some(original) = cx.o.stash.claims.get(&m.claim) else {
                stuck(
                    cx,
                    Stuck::StashEntry,
                    &format!("the stash of claim {} is missing", m.claim),
                );
                return Ok(());
            };
            let claim = build::swapped_claim(
                original,
                &new_volume,
                &plan.target_storage_class,
                &m.new_size,
                &plan.stateful_set,
                &m.pod,
            );
            cx.act(Action::Create(Object::Claim(Box::new(claim))));
            cx.wait(SWAP_POLL);
        }
        Some(c) if claim_volume(c) == Some(new_volume.as_str()) && !is_terminating(c) => {
            if claim_phase(c) == "Bound" {
                if c.annotations().contains_key(BIND_NUDGE_ANNOTATION) {
                    cx.act(Action::AnnotateClaim {
                        claim: m.claim.clone(),
                        key: BIND_NUDGE_ANNOTATION.to_string(),
                        value: None,
                    });
                }
                advance(cx, mb, MemberStep::RecreatingPod);
                cx.event(
                    EventType::Normal,
                    "ClaimSwapped",
                    format!(
                        "claim {} is bound to the new volume {new_volume} (StorageClass {}, {})",
                        m.claim, plan.target_storage_class, m.new_size.0
                    ),
                );
            } else {
                nudge_binding(cx, &m.claim, c, &new_volume);
            }
        }
        Some(_) => stuck(
            cx,
            Stuck::ClaimNotOnNewVolume,
            &format!(
                "claim {} exists but is not bound to the new volume {new_volume}",
                m.claim
            ),
        ),
    }
    Ok(())
}

/// Recreate the pod from the stash; wait until it is Ready and the engine's gate after return
/// opens; record the member's downtime.
fn recreating_pod(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let m = &mb.m;
    let mode = mb.mode;
    let Some(pod) = cx.o.pods.get(&m.pod).cloned() else {
        if mode == Mode::Rollback && foreign::foreign_set(cx).is_some() {
            // Not created over a foreign set: that set starts it on the swapped claim.
            finish_member(cx, mb, None);
            return Ok(());
        }
        let Some(stashed) = cx.o.stash.pods.get(&m.pod) else {
            if mode == Mode::Rollback {
                // The recreated StatefulSet creates it.
                finish_member(cx, mb, None);
                return Ok(());
            }
            stuck(
                cx,
                Stuck::StashEntry,
                &format!("the stash of pod {} is missing", m.pod),
            );
            return Ok(());
        };
        match our_pod(cx, stashed) {
            Ok(pod) => cx.act(Action::Create(Object::Pod(Box::new(pod)))),
            Err(e) => stuck(
                cx,
                Stuck::CannotRebuild,
                &format!("pod {} cannot be recreated: {e}", m.pod),
            ),
        }
        cx.wait(Duration::from_secs(1));
        return Ok(());
    };
    if is_terminating(pod.typed()) {
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    if mode == Mode::Rollback {
        finish_member(cx, mb, pod_ready_since(&pod).filter(|_| pod_ready(&pod)));
        return Ok(());
    }
    if !pod_ready(&pod) {
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    let report = match &cx.o.health {
        Ok(r) => r.clone(),
        Err(e) => {
            waiting_for_health(cx, &format!("the database's health cannot be read: {e}"));
            return Ok(());
        }
    };
    match engine::rules(&cx.spec().database).gate_after_return(&report, &m.pod) {
        Gate::Open => finish_member(cx, mb, pod_ready_since(&pod)),
        closed => waiting_for_health(cx, &closed.to_string()),
    }
    Ok(())
}

/// The member pod recreated from its stash, marked as the operator's (see `foreign`).
fn our_pod(
    cx: &Ctx,
    stashed: &build::Manifest<Pod>,
) -> Result<build::Manifest<Pod>, build::BuildError> {
    build::recreated_pod(stashed)?
        .with_annotation(labels::CREATED_BY_REQUEST_ANNOTATION, &foreign::marker(cx))
}

pub(super) fn finish_member(
    cx: &mut Ctx,
    mb: &Member,
    ready_since: Option<k8s_openapi::jiff::Timestamp>,
) {
    let now = cx.now.clone();
    let downtime = mb.ms.pod_deleted_at.as_ref().map(|deleted| {
        let back = ready_since.filter(|t| t >= &deleted.0).unwrap_or(now.0);
        (back.as_millisecond() - deleted.0.as_millisecond()) as f64 / 1000.0
    });
    cx.advance_member(mb.i, MemberStep::Done);
    if let Some(ms) = ms_mut(cx, mb) {
        ms.finished = Some(now);
        ms.downtime_seconds = downtime;
    }
    let progress = progress(&cx.status);
    cx.status.progress = Some(progress.clone());
    cx.set_condition(
        conditions::HEALTH_GATE,
        true,
        "Open",
        &format!("member {} is back and healthy", mb.m.pod),
    );
    cx.event(
        EventType::Normal,
        "MemberMigrated",
        format!(
            "member {} migrated ({progress}); downtime {}",
            mb.m.pod,
            downtime
                .map(|d| format!("{d:.1}s"))
                .unwrap_or_else(|| "unknown".into())
        ),
    );
    delete_jobs(cx, mb, &ALL_JOBS);
    cx.requeue = Duration::ZERO;
}

/// Whether member pod `pod`, stuck terminating on a lost node, may be force-deleted
/// ([`helpers::LostPod::force`]). When it may not, the condition `NodeLost` names the node and
/// says how to go on (one Event when it changes), and the decision looks again soon: the
/// request waits, within its timeout (in a rollback, its `--stage-timeout`).
pub(crate) fn may_force(cx: &mut Ctx, pod: &str, lost: &helpers::LostPod) -> bool {
    if lost.force(cx.spec().force_delete_on_lost_node).is_some() {
        return true;
    }
    let message = format!(
        "{}{}",
        lost.waiting_message(pod),
        runbook::pointer(runbook::Section::NodeLostWaiting)
    );
    if cx.set_condition(conditions::NODE_LOST, true, NODE_LOST_WAITING, &message) {
        cx.event(EventType::Warning, NODE_LOST_WAITING, message);
    }
    cx.wait(Duration::from_secs(5));
    false
}

/// The reason of the condition `NodeLost` (and of its Event) while the request waits for a
/// lost node.
pub(crate) const NODE_LOST_WAITING: &str = "WaitingForLostNode";

/// The member's pod is gone while the request waited for its lost node (condition
/// `NodeLost` True): something else deleted it (the pod garbage collector once the node was
/// tainted out-of-service, or an administrator). Its copy is pinned to the member's node: when
/// that node is still down ([`helpers::node_down`]), the member fails now rather than after a
/// copy pod that cannot start there. `None`: not waiting, the node not read, or up again.
pub(super) fn deleted_on_lost_node(cx: &Ctx, mb: &Member) -> Option<Failure> {
    if !conditions::is_true(&cx.status.conditions, conditions::NODE_LOST) {
        return None;
    }
    let node = &mb.m.node;
    let node_state = helpers::node_down(cx.o.nodes.get(node)?.as_ref())?;
    Some(Failure::NodeLostPodDeleted {
        pod: mb.m.pod.clone(),
        node: node.clone(),
        node_state,
    })
}

/// The condition `NodeLost`, when it is `True`, turns `False` saying why (`message`).
pub(crate) fn lost_node_over(cx: &mut Ctx, message: &str) {
    if conditions::is_true(&cx.status.conditions, conditions::NODE_LOST) {
        cx.set_condition(conditions::NODE_LOST, false, "Resolved", message);
    }
}

/// A helper pod still terminating on a lost node ([`helpers::lost_pod`]) is force-deleted, with
/// its uid as precondition; a member pod only when [`may_force`] allows it. A member's data
/// stays on its claim, and its stashed manifest brings it back.
fn force_delete_if_lost(cx: &mut Ctx, pod: &Pod, member: bool) {
    let bound = cx.settings.helper_start_timeout;
    let Some(lost) = helpers::lost_pod(pod, &cx.o.nodes, cx.o.now, bound) else {
        return;
    };
    let name = pod.name_any();
    let why = match lost.force(cx.spec().force_delete_on_lost_node) {
        _ if !member => "a helper pod of this request".to_string(),
        Some(why) => why.to_string(),
        None => {
            may_force(cx, &name, &lost);
            return;
        }
    };
    cx.act(Action::ForceDeletePod {
        name: name.clone(),
        uid: pod.uid(),
    });
    let message = format!(
        "pod {name} was still terminating {}s after its grace period on node {} ({}): force-deleted, because {why}",
        lost.waited, lost.node, lost.node_state
    );
    if member {
        lost_node_over(cx, &message);
    }
    cx.event(EventType::Warning, "PodForceDeleted", message);
}

/// The member's Jobs and mounter pod deleted; its helper pods (its Jobs' pods, the mounter)
/// stuck terminating on a lost node, which hold its temporary claim, force-deleted. True while
/// any is still there.
fn undo_helpers(cx: &mut Ctx, mb: &Member) -> bool {
    let m = &mb.m;
    let mut pending = ALL_JOBS
        .iter()
        .any(|kind| (cx.o.jobs).contains_key(&build::job_name(&cx.name(), &mb.subject, *kind)));
    delete_jobs(cx, mb, &ALL_JOBS);
    let mounter = build::mounter_name(&cx.name(), &mb.subject);
    if let Some(pod) = cx.o.helper_pods.get(&mounter) {
        pending = true;
        if !is_terminating(pod) {
            let uid = pod.uid();
            cx.delete(Kind::Pod, mounter, uid);
        }
    }
    let stuck_helpers: Vec<Pod> = (cx.o.helper_pods.values())
        .filter(|p| is_terminating(*p))
        .filter(|p| p.labels().get(labels::MEMBER_LABEL) == Some(&m.pod))
        .cloned()
        .collect();
    for pod in &stuck_helpers {
        force_delete_if_lost(cx, pod, false);
    }
    pending
}

/// Rollback of a member whose swap had not begun: drop its temporary objects, bring its pod
/// back on its untouched claim.
pub(crate) fn undo(cx: &mut Ctx, i: usize) {
    let Ok(mb) = member(cx, i, Mode::Rollback) else {
        return;
    };
    let mut pending = false;
    for slot in 0..mb.claims {
        pending |= undo_claim(cx, &member_on(cx, &mb, slot));
    }
    let m = &mb.planned;
    if scaled::is_scaled(cx) {
        // A Deployment's pods: it is scaled back, not the pod recreated.
        pending |= scaled::restore_replicas(cx);
    } else {
        pending |= bring_pod_back(cx, m);
    }
    if pending {
        cx.wait(Duration::from_secs(1));
        return;
    }
    rolled_back(cx, i, m);
}

/// The member `mb` seen on its claim `slot`.
fn member_on(cx: &Ctx, mb: &Member, slot: usize) -> Member {
    let ms = cx.status.members.get(mb.i).cloned().unwrap_or_default();
    on_claim(mb.i, &mb.planned, &ms, mb.mode, slot)
}

/// Rollback of one claim of a member whose swap had not begun: its helpers and its temporary
/// claim deleted. True while that is pending.
fn undo_claim(cx: &mut Ctx, mb: &Member) -> bool {
    let m = &mb.m;
    let mut pending = undo_helpers(cx, mb);
    // A claim of that name that this request did not make is left alone.
    let ours = |c: &&PersistentVolumeClaim| claims::temp_claim_is_ours(c, &cx.o.request);
    if let Some(temp) = cx.o.claims.get(&m.temp_claim).filter(ours) {
        pending = true;
        if !is_terminating(temp) {
            let uid = temp.uid();
            cx.delete(Kind::Claim, m.temp_claim.clone(), uid);
        }
    }
    pending
}

/// Rollback: the member's pod back on its untouched claim, from its stash (unless it is there,
/// or a foreign set starts it). True while that is pending.
fn bring_pod_back(cx: &mut Ctx, m: &PlannedMember) -> bool {
    let mut pending = false;
    match cx.o.pods.get(&m.pod) {
        Some(p) if is_terminating(p.typed()) => {
            pending = true;
            force_delete_if_lost(cx, p.typed(), true);
        }
        Some(_) => {}
        // A foreign set starts it on its untouched claim: no pod of ours is created over it.
        None if foreign::foreign_set(cx).is_some() => {}
        None => {
            if let Some(stashed) = cx.o.stash.pods.get(&m.pod) {
                match our_pod(cx, stashed) {
                    Ok(pod) => cx.act(Action::Create(Object::Pod(Box::new(pod)))),
                    Err(e) => stuck(
                        cx,
                        Stuck::CannotRebuild,
                        &format!("pod {} cannot be recreated: {e}", m.pod),
                    ),
                }
                pending = true;
            }
        }
    }
    pending
}

/// The member's rollback is done: `RolledBack`, saying where its data stays.
fn rolled_back(cx: &mut Ctx, i: usize, m: &PlannedMember) {
    let plan = cx.status.plan.clone().unwrap_or_default();
    let ms = cx.status.members.get(i).cloned().unwrap_or_default();
    let claims: Vec<String> = (claims::member_claims(m, &ms).iter())
        .map(|c| format!("claim {} (volume {}", c.claim(), c.old_volume()))
        .collect();
    let message = format!(
        "rolled back: data stays on {}, StorageClass {})",
        claims.join("), "),
        plan.source_storage_class.as_deref().unwrap_or("?")
    );
    cx.advance_member(i, MemberStep::RolledBack);
    if let Some(ms) = cx.status.members.get_mut(i) {
        ms.message = Some(message.clone());
    }
    cx.event(
        EventType::Normal,
        "MemberRolledBack",
        format!("member {}: {message}", m.pod),
    );
    cx.requeue = Duration::ZERO;
}
