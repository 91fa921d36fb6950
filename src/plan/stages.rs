//! The request's stages after acceptance, in the order of the flow: orphaning the StatefulSet,
//! migrating members (one at a time, see [`super::member`]), recreating the StatefulSet,
//! finalizing; and rolling back on failure or timeout. Stage changes go through
//! [`super::machine`] (`Ctx::enter_stage`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::claims;
use super::foreign;
use super::member::{self, Mode};
use super::preflight::choose_template;
use super::runbook::Stuck;
use super::stash::{StashKey, stash};
use super::{
    Action, Ctx, EventType, Failure, Kind, Object, Propagation, StashObject, claim_class,
    claim_request, in_flight, is_terminating, progress, stuck, volume_class, volume_policy,
};
use crate::api::conditions;
use crate::api::{
    DataLocation, DataState, MemberStatus, MemberStep, OldPvReclaimPolicy, Phase, Plan,
    PlannedMember, Stage,
};
use crate::build::{self, Manifest};
use crate::engine::{self, FinalCheckKind, FinalHashError};
use crate::labels;

/// The retention policy that cannot delete claims (JSON of the policy object).
pub const PROTECTED_RETENTION_POLICY: &str = r#"{"whenDeleted":"Retain","whenScaled":"Retain"}"#;

fn plan(cx: &Ctx) -> Result<Plan, Failure> {
    cx.status.plan.clone().ok_or(Failure::NoPlan)
}

/// Stash the StatefulSet, make its retention policy and the claims' ownerReferences
/// unable to delete a claim, orphan-delete it, wait until it is gone.
pub(crate) fn orphaning(cx: &mut Ctx) -> Result<(), Failure> {
    let plan = plan(cx)?;
    let live =
        cx.o.stateful_set
            .clone()
            .filter(|s| !is_terminating(s.typed()));
    if cx.o.stash.stateful_set.is_none() {
        let Some(set) = &live else {
            return Err(Failure::StatefulSetDisappeared {
                name: plan.stateful_set.clone(),
            });
        };
        return stash(cx, StashKey::StatefulSet, set);
    }
    if cx.status.original_retention_policy.is_none() {
        let from = live.as_ref().or(cx.o.stash.stateful_set.as_ref());
        cx.status.original_retention_policy = Some(
            from.map(|s| build::original_retention_policy(s))
                .unwrap_or_else(|| "null".into()),
        );
        return Ok(());
    }
    if let Some(set) = &live
        && build::retention_needs_protection(set)
    {
        cx.act(Action::PatchRetentionPolicy {
            stateful_set: set.name_any(),
            policy: PROTECTED_RETENTION_POLICY.to_string(),
        });
    }
    for c in claims::plan_claims(&plan) {
        protect_claim(cx, &plan.stateful_set, &c.planned);
    }
    if !cx.actions.is_empty() {
        return Ok(());
    }
    match &cx.o.stateful_set {
        Some(set) if !is_terminating(set.typed()) => {
            let set = set.clone();
            return orphan_delete(cx, &plan, &set);
        }
        Some(_) => cx.wait(Duration::from_secs(1)),
        None => {
            cx.enter_stage(Stage::Migrating);
            cx.set_condition(
                conditions::PROGRESSING,
                true,
                "Migrating",
                &format!("migrating members {}", progress(&cx.status)),
            );
            cx.event(
                EventType::Normal,
                "StatefulSetOrphaned",
                format!(
                    "StatefulSet {} is gone; its pods keep running unmanaged until it is recreated",
                    plan.stateful_set
                ),
            );
            cx.requeue = Duration::ZERO;
        }
    }
    Ok(())
}

/// Orphan-deletes the live set with its uid and the resourceVersion of the stash; a set changed
/// since the stash (edited, scaled, or the retention patch) is stashed again instead, and
/// deleted with its new version on a later pass.
fn orphan_delete(cx: &mut Ctx, plan: &Plan, set: &Manifest<StatefulSet>) -> Result<(), Failure> {
    let stashed_version =
        cx.o.stash
            .stateful_set
            .as_ref()
            .and_then(|s| s.resource_version());
    if set.resource_version() != stashed_version {
        // Changed since the stash (edited, scaled, or the retention patch): stash it
        // as it is now, and delete that version on a later pass.
        return stash(cx, StashKey::StatefulSet, set);
    }
    cx.event(
        EventType::Normal,
        "OrphaningStatefulSet",
        format!(
            "deleting StatefulSet {} with propagationPolicy Orphan; its pods keep running",
            plan.stateful_set
        ),
    );
    cx.act(Action::Delete {
        kind: Kind::StatefulSet,
        name: set.name_any(),
        propagation: Propagation::Orphan,
        uid: set.uid(),
        resource_version: stashed_version,
    });
    cx.wait(Duration::from_secs(1));
    Ok(())
}

/// Removes the ownerReferences through which the StatefulSet `set` (retention policy) or the
/// member's pod could garbage-collect the member's claim; a reference to anything else stays
/// (see `build::kept_metadata`).
fn protect_claim(cx: &mut Ctx, set: &str, m: &PlannedMember) {
    let Some(claim) = cx.o.claims.get(&m.claim) else {
        return;
    };
    let uids: Vec<String> = claim
        .owner_references()
        .iter()
        .filter(|r| build::is_adoption_ref(r, set, &m.pod))
        .map(|r| r.uid.clone())
        .collect();
    if !uids.is_empty() {
        cx.act(Action::RemoveOwnerReferences {
            claim: m.claim.clone(),
            uids,
        });
    }
}

/// One member at a time, the member in flight first, then the engine's choice.
pub(crate) fn migrating(cx: &mut Ctx) -> Result<(), Failure> {
    super::retain::keep_swapped(cx);
    if let Some(i) = in_flight(&cx.status) {
        return member::forward(cx, i);
    }
    if foreign::hold_stage(cx) {
        return Ok(());
    }
    let remaining: Vec<String> = cx
        .status
        .members
        .iter()
        .filter(|m| m.step == MemberStep::Pending)
        .map(|m| m.pod.clone())
        .collect();
    if remaining.is_empty() {
        // A StatefulSet is recreated next; a Deployment's or bare pod's claim has nothing to
        // recreate.
        let has_set = cx.status.plan.as_ref().is_some_and(Plan::has_stateful_set);
        let (stage, doing) = if has_set {
            (
                Stage::RecreatingStatefulSet,
                "every member is migrated; recreating the StatefulSet",
            )
        } else {
            (
                Stage::Finalizing,
                "the claim is moved and its workload is back; applying the old-volume policy and \
                 cleaning up",
            )
        };
        cx.enter_stage(stage);
        cx.set_condition(conditions::PROGRESSING, true, &format!("{stage:?}"), doing);
        cx.requeue = Duration::ZERO;
        return Ok(());
    }
    let next = match &cx.o.health {
        Ok(report) => engine::rules(&cx.spec().database).next_member(report, &remaining),
        Err(_) => None,
    }
    .filter(|p| remaining.contains(p))
    .unwrap_or_else(|| remaining[0].clone());
    // status.members is the order actually used: move the next member before the pending ones.
    let Some(from) = cx.status.members.iter().position(|m| m.pod == next) else {
        return Ok(());
    };
    let ms = cx.status.members.remove(from);
    let to = cx
        .status
        .members
        .iter()
        .position(|m| m.step == MemberStep::Pending)
        .unwrap_or(cx.status.members.len());
    cx.status.members.insert(to, ms);
    cx.advance_member(to, MemberStep::CreatingClaim);
    let now = cx.now.clone();
    if let Some(ms) = cx.status.members.get_mut(to) {
        ms.started = Some(now);
    }
    let n = cx.status.members.len();
    let message = format!("migrating member {next} ({}/{n})", to + 1);
    cx.set_condition(conditions::PROGRESSING, true, "Migrating", &message);
    cx.status.message = Some(message.clone());
    cx.event(EventType::Normal, "MemberStarted", message);
    cx.requeue = Duration::ZERO;
    Ok(())
}

/// The class and size each changed template of the recreated StatefulSet gets: the target when
/// every member is migrated, else the original template's. None for a claim target: it keeps
/// every template, the other members' claims did not move.
fn template_changes(cx: &Ctx, plan: &Plan, stashed: &StatefulSet) -> Vec<build::TemplateChange> {
    if plan.target_claim.is_some() {
        return Vec::new();
    }
    let all_done = cx.status.members.iter().all(|m| m.step.settled());
    let first = (plan.volume_claim_template.clone(), plan.target_size.clone());
    let further = (plan.further_templates.iter()).map(|t| (t.name.clone(), t.size.clone()));
    let change = |(template, size): (String, Quantity)| {
        if all_done {
            let class = plan.target_storage_class.clone();
            return build::TemplateChange {
                template,
                class,
                size,
            };
        }
        let original = choose_template(stashed, &template).ok();
        let class = original
            .as_ref()
            .and_then(|t| claim_class(t).map(str::to_string))
            .or_else(|| plan.source_storage_class.clone())
            .unwrap_or_default();
        let size = original
            .as_ref()
            .and_then(|t| claim_request(t).cloned())
            .unwrap_or(size);
        build::TemplateChange {
            template,
            class,
            size,
        }
    };
    std::iter::once(first).chain(further).map(change).collect()
}

fn recreate_stateful_set(
    cx: &mut Ctx,
    plan: &Plan,
    stashed: &Manifest<StatefulSet>,
) -> Result<(), Failure> {
    let changes = template_changes(cx, plan, stashed);
    let retention = match cx.status.original_retention_policy.as_deref() {
        Some(json) => {
            build::parse_retention_policy(json).map_err(|e| Failure::RetentionPolicy {
                error: e.to_string(),
            })?
        }
        None => stashed
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_claim_retention_policy.clone()),
    };
    let built = build::recreated_statefulset(stashed, &changes, retention).and_then(|set| {
        set.with_annotation(labels::CREATED_BY_REQUEST_ANNOTATION, &foreign::marker(cx))
    });
    let set = match built {
        Ok(set) => set,
        Err(e) => {
            stuck(
                cx,
                Stuck::CannotRebuild,
                &format!("StatefulSet {} cannot be recreated: {e}", plan.stateful_set),
            );
            return Ok(());
        }
    };
    let with = match changes.as_slice() {
        [] => "its volumeClaimTemplates unchanged".to_string(),
        changes => (changes.iter())
            .map(|c| {
                format!(
                    "template {} on StorageClass {} ({})",
                    c.template, c.class, c.size.0
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    cx.event(
        EventType::Normal,
        "StatefulSetRecreated",
        format!(
            "recreating StatefulSet {} with {with}; it adopts the running pods",
            plan.stateful_set
        ),
    );
    cx.act(Action::Create(Object::StatefulSet(Box::new(set))));
    Ok(())
}

/// Recreate the StatefulSet from the stash with the new template; wait until it has
/// adopted its pods, at most `--stage-timeout`: then the request rolls back
/// ([`Failure::StageTimedOut`], naming what it waited for).
pub(crate) fn recreating_stateful_set(cx: &mut Ctx) -> Result<(), Failure> {
    super::retain::keep_swapped(cx);
    recreate_and_wait(cx)?;
    if cx.status.stage == Stage::RecreatingStatefulSet && stage_expired(cx) {
        let plan = plan(cx)?;
        return Err(stage_timed_out(cx, recreation_waits_for(cx, &plan)));
    }
    Ok(())
}

/// [`Failure::StageTimedOut`] of the current stage.
fn stage_timed_out(cx: &Ctx, waiting: String) -> Failure {
    Failure::StageTimedOut {
        stage: format!("{:?}", cx.status.stage),
        timeout: stage_timeout_text(cx),
        waiting,
    }
}

/// Whether the current stage has waited longer than `--stage-timeout`, counted from
/// `status.stageStarted` (a request from before that field counts from now on).
pub(crate) fn stage_expired(cx: &mut Ctx) -> bool {
    let Some(started) = &cx.status.stage_started else {
        cx.status.stage_started = Some(cx.now.clone());
        return false;
    };
    let limit = i64::try_from(cx.settings.stage_timeout.as_secs()).unwrap_or(i64::MAX);
    cx.o.now.as_second() - started.0.as_second() > limit
}

/// `--stage-timeout` for messages: `10m`, `90s`.
fn stage_timeout_text(cx: &Ctx) -> String {
    let secs = cx.settings.stage_timeout.as_secs();
    if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// What the recreation still waits for, for [`Failure::StageTimedOut`].
fn recreation_waits_for(cx: &Ctx, plan: &Plan) -> String {
    let name = &plan.stateful_set;
    let what = match &cx.o.stateful_set {
        None => format!("StatefulSet {name} to be created"),
        Some(_) if foreign::foreign_set(cx).is_some() => {
            format!("StatefulSet {name}, created by someone else, to be deleted")
        }
        Some(set) if is_terminating(set.typed()) => {
            format!("the earlier StatefulSet {name} to finish terminating")
        }
        Some(set) => {
            let want = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let (seen, has) = set
                .status
                .as_ref()
                .map_or((0, 0), |s| (s.observed_generation.unwrap_or(0), s.replicas));
            format!(
                "StatefulSet {name} to adopt its pods (it owns {has} of {want}; observed \
                 generation {seen} of {})",
                set.metadata.generation.unwrap_or(0)
            )
        }
    };
    with_stuck_message(cx, what)
}

/// `what`, followed by the status message when the request reports itself stuck.
fn with_stuck_message(cx: &Ctx, what: String) -> String {
    match cx.status.message.as_deref() {
        Some(m) if m.starts_with("stuck: ") => format!("{what} ({m})"),
        _ => what,
    }
}

/// A decision stopped by a stash problem (see `stash::stopped_by_a_problem`) stays bounded:
/// past `--stage-timeout` a recreation rolls back (the returned failure) and a rollback gives
/// up.
pub(crate) fn stuck_past_deadline(cx: &mut Ctx) -> Option<Failure> {
    let stage = cx.status.stage;
    if !matches!(stage, Stage::RecreatingStatefulSet | Stage::RollingBack) || !stage_expired(cx) {
        return None;
    }
    match stage {
        Stage::RecreatingStatefulSet => {
            let waiting = with_stuck_message(cx, "the stash to be readable".to_string());
            Some(stage_timed_out(cx, waiting))
        }
        _ => {
            let plan = cx.status.plan.clone().unwrap_or_default();
            let waiting = with_stuck_message(cx, "the stash to be readable".to_string());
            give_up(cx, &plan, &waiting);
            None
        }
    }
}

fn recreate_and_wait(cx: &mut Ctx) -> Result<(), Failure> {
    let plan = plan(cx)?;
    foreign::record_our_set(cx);
    if let Some(set) = foreign::foreign_set(cx) {
        if let Some(timed_out) = super::expired(cx) {
            return Err(foreign::timeout_failure(cx, timed_out));
        }
        foreign::block(
            cx,
            &set,
            "The operator's StatefulSet is not recreated over it. ",
        );
        return Ok(());
    }
    foreign::unblock(cx);
    match cx.o.stateful_set.clone() {
        None => {
            let Some(stashed) = cx.o.stash.stateful_set.clone() else {
                stuck(
                    cx,
                    Stuck::StashEntry,
                    "the stashed StatefulSet is missing: it cannot be recreated",
                );
                return Ok(());
            };
            recreate_stateful_set(cx, &plan, &stashed)?;
            cx.wait(Duration::from_secs(1));
        }
        Some(set) if is_terminating(set.typed()) => cx.wait(Duration::from_secs(1)),
        Some(set) => {
            if adopted(&set) {
                cx.enter_stage(Stage::Finalizing);
                cx.set_condition(
                    conditions::PROGRESSING,
                    true,
                    "Finalizing",
                    "StatefulSet recreated; applying the old-volume policy and cleaning up",
                );
                cx.requeue = Duration::ZERO;
            } else {
                cx.wait(Duration::from_secs(1));
            }
        }
    }
    Ok(())
}

/// The recreated set has seen its spec and owns as many pods as it wants.
fn adopted(set: &StatefulSet) -> bool {
    let want = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = &set.status else {
        return false;
    };
    status.observed_generation.unwrap_or(0) >= set.metadata.generation.unwrap_or(0)
        && status.replicas >= want
}

/// Deletes what the request created and no longer needs: Jobs, mounter pods, temporary claims
/// (the stash is not: see [`delete_stash`]). Returns true when something is still there.
fn clean_up(cx: &mut Ctx) -> bool {
    let mut pending = false;
    for (name, job) in &cx.o.jobs {
        pending = true;
        if !is_terminating(&job.job) {
            cx.actions.push(Action::Delete {
                kind: Kind::Job,
                name: name.clone(),
                propagation: Propagation::Background,
                uid: job.job.uid(),
                resource_version: None,
            });
        }
    }
    for c in claims::request_claims(&cx.status) {
        let mounter = build::mounter_name(&cx.name(), &c.subject);
        if let Some(pod) = cx.o.helper_pods.get(&mounter) {
            pending = true;
            if !is_terminating(pod) {
                cx.actions.push(Action::Delete {
                    kind: Kind::Pod,
                    name: mounter,
                    propagation: Propagation::Background,
                    uid: pod.uid(),
                    resource_version: None,
                });
            }
        }
        let held = c.status.held.is_some();
        // A held member's copy stays on its temporary claim (see `foreign`); a claim of that
        // name that this request did not make is left alone.
        let ours = |claim: &&_| claims::temp_claim_is_ours(claim, &cx.o.request);
        if let Some(claim) =
            cx.o.claims
                .get(c.temp_claim())
                .filter(|_| !held)
                .filter(ours)
        {
            pending = true;
            if !is_terminating(claim) {
                cx.actions.push(Action::Delete {
                    kind: Kind::Claim,
                    name: c.temp_claim().to_string(),
                    propagation: Propagation::Background,
                    uid: claim.uid(),
                    resource_version: None,
                });
            }
        }
    }
    pending
}

/// Deletes the request's stash ConfigMap (by its uid: never another request's), once the
/// request is about to succeed: every member is on its new volume, the StatefulSet is recreated
/// and the final check passed. A Failed request keeps it (see `plan::stash`). True while it is
/// still there.
fn delete_stash(cx: &mut Ctx) -> bool {
    let StashObject::Ours { uid, .. } = &cx.o.stash.object else {
        return false;
    };
    let uid = uid.clone();
    cx.delete(
        Kind::ConfigMap,
        build::stash_config_map_name(&cx.name()),
        uid,
    );
    true
}

/// The final consistency check first; once it passed: old-volume policy, labels, cleanup,
/// `Successful`. A check that fails definitively (or times out) is a [`Failure`]: the request
/// rolls back to `Failed` with every old volume kept on Retain.
pub(crate) fn finalizing(cx: &mut Ctx) -> Result<(), Failure> {
    let plan = plan(cx)?;
    let (note, restore_old) = match final_check(cx)? {
        FinalCheck::Passed { note, restore_old } => (note, restore_old),
        FinalCheck::Pending(reason) => {
            super::retain::keep_swapped(cx);
            wait_for_final_check(cx, &reason);
            return Ok(());
        }
    };
    for ms in cx.status.members.clone() {
        if ms.step != MemberStep::Done {
            continue;
        }
        let Some(m) = plan.members.iter().find(|m| m.pod == ms.pod) else {
            continue;
        };
        for c in claims::member_claims(m, &ms) {
            if restore_old {
                settle_old_volume(cx, &c.planned, &c.status);
            } else {
                label_old_volume(cx, &c.planned);
            }
            restore_new_volume_policy(cx, &c.status);
        }
    }
    let pending = clean_up(cx) | delete_stash(cx);
    let mut note = note;
    if !cx.actions.is_empty() || pending {
        if !stage_expired(cx) {
            cx.wait(Duration::from_secs(1));
            return Ok(());
        }
        note.push_str(&cleanup_gave_up(cx));
    }
    if !restore_old {
        cx.event(
            EventType::Warning,
            "OldVolumesRetained",
            UNVERIFIED_NOTE.trim_start_matches("; ").to_string(),
        );
    }
    succeed(cx, &plan, &note);
    Ok(())
}

/// The cleanup after a passed final check waited longer than `--stage-timeout`: every member
/// is on its verified new volume, so the request still ends `Successful`, naming (note, Event
/// `CleanupIncomplete`) what is left behind for a human to remove.
fn cleanup_gave_up(cx: &mut Ctx) -> String {
    let mut left: Vec<String> = Vec::new();
    left.extend(cx.o.jobs.keys().map(|j| format!("Job {j}")));
    for c in claims::request_claims(&cx.status) {
        let mounter = build::mounter_name(&cx.name(), &c.subject);
        if cx.o.helper_pods.contains_key(&mounter) {
            left.push(format!("pod {mounter}"));
        }
        if cx.o.claims.contains_key(c.temp_claim()) {
            left.push(format!("temporary claim {}", c.temp_claim()));
        }
    }
    if matches!(cx.o.stash.object, StashObject::Ours { .. }) {
        left.push(format!(
            "ConfigMap {}",
            build::stash_config_map_name(&cx.name())
        ));
    }
    for a in &cx.actions {
        match a {
            Action::PatchReclaimPolicy { volume, policy } => left.push(format!(
                "volume {volume} not yet on reclaim policy {policy}"
            )),
            Action::LabelVolume { volume } => {
                left.push(format!("volume {volume} not yet labelled"))
            }
            _ => {}
        }
    }
    let message = format!(
        "; the cleanup gave up after {} (--stage-timeout), left behind: {}{}",
        stage_timeout_text(cx),
        left.join(", "),
        super::runbook::pointer(super::runbook::Section::FailedStageTimedOut)
    );
    cx.event(
        EventType::Warning,
        "CleanupIncomplete",
        message.trim_start_matches("; ").to_string(),
    );
    message
}

/// What the final consistency check allows.
#[derive(Debug, Clone, PartialEq)]
enum FinalCheck {
    /// It passed (or nothing can vouch for the copies: `restore_old` is then false and the old
    /// volumes stay on Retain); `note` ends the success message.
    Passed { note: String, restore_old: bool },
    /// It cannot be computed yet (why); it is retried until the request's timeout.
    Pending(String),
}

/// The note of a success whose copies nothing verified.
const UNVERIFIED_NOTE: &str = "; the copies were not verified (spec.copy.verify is false): the old volumes are kept on Retain";

/// The final consistency check of the engine the request names.
fn final_check(cx: &mut Ctx) -> Result<FinalCheck, Failure> {
    match engine::rules(&cx.spec().database).final_check() {
        FinalCheckKind::Agreement { what } => agreement_final_check(cx, what),
        FinalCheckKind::CopiesVerified => generic_final_check(cx),
    }
}

/// An engine that agrees on a digest (etcd: every member's `hash_kv` at a common revision;
/// Patroni: every member replayed the leader's WAL position): the digest is recorded in
/// `status.finalHash` before any old volume's policy is touched.
fn agreement_final_check(cx: &mut Ctx, what: &str) -> Result<FinalCheck, Failure> {
    let passed = |hash: &str| FinalCheck::Passed {
        note: format!("; every member's {what} is {hash}"),
        restore_old: true,
    };
    if let Some(hash) = &cx.status.final_hash {
        return Ok(passed(hash));
    }
    let reason = match &cx.o.final_hash {
        Some(Ok(Some(h))) => match uncovered(cx, h, what) {
            Some(reason) => reason,
            None => {
                cx.status.final_hash = Some(h.hash.clone());
                // The cleanup's `--stage-timeout` counts from here (the wait for the check is
                // bounded by the request's timeout).
                cx.status.stage_started = Some(cx.now.clone());
                return Ok(passed(&h.hash));
            }
        },
        Some(Err(e @ FinalHashError::Inconsistent(_))) => {
            return Err(Failure::FinalCheckFailed {
                reason: e.to_string(),
            });
        }
        Some(Err(e @ FinalHashError::Engine(_))) => e.to_string(),
        Some(Ok(None)) | None => format!("the database engine computed no {what}"),
    };
    pending_until_timeout(cx, reason)
}

/// Why a hash that agrees does not pass yet: a planned member it does not cover (no pod, or
/// no answer), so the check stays pending; `None` when it covers every one.
fn uncovered(cx: &Ctx, h: &engine::FinalHash, what: &str) -> Option<String> {
    let plan = cx.status.plan.as_ref();
    let planned = plan
        .into_iter()
        .flat_map(|p| &p.members)
        .map(|m| m.pod.as_str());
    let missing: Vec<String> = (h.missing(planned).into_iter())
        .map(|pod| match cx.o.pods.contains_key(pod) {
            true => format!("{pod} (no {what})"),
            false => format!("{pod} (no pod)"),
        })
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "the agreed {what} does not cover every planned member: missing {}; covered: {}",
        missing.join(", "),
        match h.members.as_slice() {
            [] => "none".to_string(),
            m => m.join(", "),
        }
    ))
}

/// Generic: every migrated member's verification is on record (of each of its claims); with
/// verification off nothing vouches for the copies and the old volumes stay on Retain.
fn generic_final_check(cx: &mut Ctx) -> Result<FinalCheck, Failure> {
    if !cx.spec().copy.verify {
        return Ok(FinalCheck::Passed {
            note: UNVERIFIED_NOTE.to_string(),
            restore_old: false,
        });
    }
    // Every claim the plan gives a migrated member (one its status lacks is unverified).
    let mut unverified: Vec<String> = claims::request_claims(&cx.status)
        .into_iter()
        .filter(|c| c.status.step == MemberStep::Done && c.status.first_claim.verified.is_none())
        .map(|c| c.pod().to_string())
        .collect();
    unverified.dedup();
    if !unverified.is_empty() {
        return Err(Failure::Unverified {
            pods: unverified.join(", "),
        });
    }
    Ok(FinalCheck::Passed {
        note: String::new(),
        restore_old: true,
    })
}

/// A check that cannot be computed yet waits, until the request's timeout has expired.
fn pending_until_timeout(cx: &Ctx, reason: String) -> Result<FinalCheck, Failure> {
    match super::expired(cx) {
        Some(_) => Err(Failure::FinalCheckTimedOut {
            timeout: cx.spec().timeout.clone(),
            reason,
        }),
        None => Ok(FinalCheck::Pending(reason)),
    }
}

/// Says (condition, message, one Event per new reason) that the final check is awaited.
fn wait_for_final_check(cx: &mut Ctx, reason: &str) {
    let message = format!(
        "waiting for the final consistency check ({reason}); the old volumes stay on Retain until it passes"
    );
    if cx.set_condition(conditions::PROGRESSING, true, "FinalCheckPending", &message) {
        cx.event(EventType::Warning, "FinalCheckPending", message.clone());
    }
    cx.status.message = Some(message);
    cx.wait(super::REQUEUE_WAITING);
}

/// A migrated member's old volume: labelled `migrated-by`, and given the policy the request asks
/// for (by default the one it had before the swap). Only after the final check passed.
fn settle_old_volume(cx: &mut Ctx, m: &PlannedMember, ms: &MemberStatus) {
    let Some(old) = cx.o.volumes.get(&m.old_volume) else {
        return;
    };
    label_old_volume(cx, m);
    let desired = match cx.spec().old_pv_reclaim_policy {
        Some(OldPvReclaimPolicy::Retain) => "Retain".to_string(),
        Some(OldPvReclaimPolicy::Delete) => "Delete".to_string(),
        None => ms
            .first_claim
            .old_volume_original_policy
            .clone()
            .unwrap_or_else(|| "Retain".to_string()),
    };
    if volume_policy(old) != desired && !is_terminating(old) {
        cx.act(Action::PatchReclaimPolicy {
            volume: m.old_volume.clone(),
            policy: desired,
        });
    }
}

/// Labels a migrated member's old volume `migrated-by=<request>` unless it already is.
fn label_old_volume(cx: &mut Ctx, m: &PlannedMember) {
    let req_name = cx.name();
    if let Some(old) = cx.o.volumes.get(&m.old_volume)
        && old.labels().get(labels::MIGRATED_BY_LABEL) != Some(&req_name)
    {
        cx.act(Action::LabelVolume {
            volume: m.old_volume.clone(),
        });
    }
}

/// What a successful request did: the members migrated and their downtimes, the members left
/// alone.
fn success_message(cx: &Ctx, plan: &Plan, hash_note: &str) -> String {
    let there: Vec<&str> = cx
        .status
        .members
        .iter()
        .filter(|m| m.step == MemberStep::AlreadyThere)
        .map(|m| m.pod.as_str())
        .collect();
    let mut there_note = if there.is_empty() {
        String::new()
    } else {
        format!("; already there, left running: {}", there.join(", "))
    };
    let not_targeted: Vec<&str> = cx
        .status
        .members
        .iter()
        .filter(|m| m.step == MemberStep::NotTargeted)
        .map(|m| m.pod.as_str())
        .collect();
    if !not_targeted.is_empty() {
        there_note.push_str(&format!(
            "; not targeted, left running: {}",
            not_targeted.join(", ")
        ));
    }
    let downtimes: Vec<String> = cx
        .status
        .members
        .iter()
        .filter(|m| m.step == MemberStep::Done)
        .map(|m| {
            format!(
                "{} {}",
                m.pod,
                m.downtime_seconds
                    .map(|d| format!("{d:.1}s"))
                    .unwrap_or_else(|| "?".into())
            )
        })
        .collect();
    let claim = plan.target_claim.as_deref().unwrap_or("?");
    let what = match (&plan.deployment, &plan.pod) {
        (Some(d), _) => format!("migrated claim {claim} of Deployment {d}"),
        (None, Some(pod)) => format!("migrated claim {claim} of pod {pod}"),
        (None, None) => format!(
            "migrated {} members of StatefulSet {}",
            downtimes.len(),
            plan.stateful_set
        ),
    };
    format!(
        "{what} to StorageClass {} ({}); downtime: {}{there_note}{hash_note}",
        plan.target_storage_class,
        plan.target_size.0,
        downtimes.join(", ")
    )
}

/// The request ends `Successful`: status, conditions, Event, finalizer removed.
fn succeed(cx: &mut Ctx, plan: &Plan, hash_note: &str) {
    let message = success_message(cx, plan, hash_note);
    cx.status.phase = Phase::Successful;
    cx.enter_stage(Stage::Done);
    cx.status.completion_time = Some(cx.now.clone());
    cx.status.progress = Some(progress(&cx.status));
    cx.status.message = Some(message.clone());
    cx.set_condition(conditions::READY, true, "Successful", &message);
    cx.set_condition(conditions::PROGRESSING, false, "Done", "migration finished");
    cx.event(EventType::Normal, "Successful", message);
    remove_finalizer(cx);
    cx.requeue = super::REQUEUE_FINAL;
}

/// Removes the request's finalizer when it has it (the request has ended).
fn remove_finalizer(cx: &mut Ctx) {
    if super::observe::has_finalizer(&cx.o.request) {
        cx.act(Action::RemoveFinalizer);
    }
}

/// The new volume was set to Retain for the swap; it is now the member's live volume and gets
/// back the policy its class gave it.
fn restore_new_volume_policy(cx: &mut Ctx, ms: &MemberStatus) {
    let (Some(name), Some(original)) = (
        &ms.first_claim.new_volume,
        &ms.first_claim.new_volume_original_policy,
    ) else {
        return;
    };
    if let Some(pv) = cx.o.volumes.get(name)
        && volume_policy(pv) != *original
        && !is_terminating(pv)
    {
        cx.act(Action::PatchReclaimPolicy {
            volume: name.clone(),
            policy: original.clone(),
        });
    }
}

/// Failure or timeout: the member in flight before its swap is undone, a member whose swap began
/// is carried forward; then the StatefulSet is recreated with a template that fits; `Failed`.
/// Past `--stage-timeout` the rollback gives up: `Failed` anyway ([`give_up`]).
pub(crate) fn rolling_back(cx: &mut Ctx) -> Result<(), Failure> {
    let plan = match plan(cx) {
        Ok(plan) => plan,
        Err(f) if stage_expired(cx) => {
            give_up(cx, &Plan::default(), &f.to_string());
            return Ok(());
        }
        Err(f) => return Err(f),
    };
    let result = roll_back(cx, &plan);
    if cx.status.stage != Stage::RollingBack || !stage_expired(cx) {
        return result;
    }
    let waiting = match result {
        Ok(()) => rollback_waits_for(cx, &plan),
        Err(f) => f.to_string(),
    };
    give_up(cx, &plan, &waiting);
    Ok(())
}

/// The rollback waited longer than `--stage-timeout`: the request ends `Failed` anyway, saying
/// what it still waited for, where each member's data is and whether the StatefulSet is back.
fn give_up(cx: &mut Ctx, plan: &Plan, waiting: &str) {
    let reason = format!(
        "rollback gave up after {} (--stage-timeout): still waiting for {waiting}; {}{}",
        stage_timeout_text(cx),
        set_state(cx, plan),
        super::runbook::pointer(super::runbook::Section::FailedRollbackGaveUp)
    );
    let failure = cx
        .status
        .failure
        .clone()
        .unwrap_or_else(|| "unknown failure".to_string());
    cx.status.failure = Some(format!("{failure}; {reason}"));
    cx.event(EventType::Warning, "RollbackGaveUp", reason);
    fail(cx, plan);
}

/// Whether the StatefulSet is back, for a rollback that gave up.
fn set_state(cx: &Ctx, plan: &Plan) -> String {
    let name = &plan.stateful_set;
    let stash = build::stash_config_map_name(&cx.name());
    let by_hand = format!(
        "recreate it from ConfigMap {stash} (runbook: docs/runbook.md#restoring-from-the-stash-by-hand)"
    );
    match &cx.o.stateful_set {
        Some(_) if foreign::foreign_set(cx).is_some() => {
            format!("StatefulSet {name} exists, created by someone else")
        }
        Some(set) if is_terminating(set.typed()) => {
            format!("StatefulSet {name} is still terminating and was not recreated: {by_hand}")
        }
        Some(_) => format!("StatefulSet {name} is in place"),
        None => format!("StatefulSet {name} was not recreated: {by_hand}"),
    }
}

/// What a rollback still waits for: the member in flight, member pods terminating, the
/// StatefulSet, the request's leftovers.
fn rollback_waits_for(cx: &Ctx, plan: &Plan) -> String {
    let mut what: Vec<String> = Vec::new();
    for ms in &cx.status.members {
        if ms.step.in_flight() && ms.held.is_none() && ms.step.swap_begun() {
            what.push(format!(
                "member {} to be carried forward from step {:?}",
                ms.pod, ms.step
            ));
        }
    }
    for m in &plan.members {
        if let Some(p) = cx.o.pods.get(&m.pod).filter(|p| is_terminating(p.typed())) {
            let node = p.typed().spec.as_ref().and_then(|s| s.node_name.clone());
            what.push(format!(
                "member pod {} to finish terminating (node {})",
                m.pod,
                node.as_deref().unwrap_or("none")
            ));
        }
        for c in claims::member_claims(m, &MemberStatus::default()) {
            let mounter = build::mounter_name(&cx.name(), &c.subject);
            if cx.o.helper_pods.contains_key(&mounter) {
                what.push(format!("pod {mounter} to be deleted"));
            }
            if cx.o.claims.contains_key(c.temp_claim()) {
                what.push(format!("temporary claim {} to be deleted", c.temp_claim()));
            }
        }
    }
    what.extend(cx.o.jobs.keys().map(|j| format!("Job {j} to be deleted")));
    match &cx.o.stateful_set {
        None => what.push(format!("StatefulSet {} to be recreated", plan.stateful_set)),
        Some(set) if is_terminating(set.typed()) => what.push(format!(
            "StatefulSet {} to finish terminating",
            plan.stateful_set
        )),
        Some(_) => {}
    }
    if what.is_empty() {
        what.push("the rollback's last changes to take effect".to_string());
    }
    with_stuck_message(cx, what.join(", "))
}

fn roll_back(cx: &mut Ctx, plan: &Plan) -> Result<(), Failure> {
    foreign::record_our_set(cx);
    if roll_back_member_in_flight(cx) {
        return Ok(());
    }
    if restore_stateful_set(cx, plan)? {
        return Ok(());
    }
    // Migrated members keep their new volume: its policy goes back to the class's.
    for ms in cx.status.members.clone() {
        if ms.step != MemberStep::Done {
            continue;
        }
        let Some(m) = plan.members.iter().find(|m| m.pod == ms.pod) else {
            continue;
        };
        for c in claims::member_claims(m, &ms) {
            restore_new_volume_policy(cx, &c.status);
            label_old_volume(cx, &c.planned);
        }
    }
    let pending = clean_up(cx);
    if !cx.actions.is_empty() || pending {
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    fail(cx, plan);
    Ok(())
}

/// The first member in flight: undone before its swap, carried forward after it begun. True when
/// there was one (the rest of the rollback waits for it).
fn roll_back_member_in_flight(cx: &mut Ctx) -> bool {
    for i in 0..cx.status.members.len() {
        let step = cx.status.members[i].step;
        match step {
            s if !s.in_flight() => continue,
            s if s.swap_begun() && foreign::hold_in_rollback(cx, i) => continue,
            s if s.swap_begun() => {
                if let Err(failure) = member::step(cx, i, Mode::Rollback) {
                    stuck(cx, Stuck::RollbackStep, &failure.to_string());
                }
                return true;
            }
            _ => {
                member::undo(cx, i);
                return true;
            }
        }
    }
    false
}

/// The StatefulSet: the original's retention policy restored when it was never deleted, else
/// recreated from the stash. True while that is under way. A set someone else created is left
/// alone (see `foreign`).
fn restore_stateful_set(cx: &mut Ctx, plan: &Plan) -> Result<bool, Failure> {
    if foreign::foreign_set(cx).is_some() {
        return Ok(false);
    }
    match cx.o.stateful_set.clone() {
        Some(set) if is_terminating(set.typed()) => {
            cx.wait(Duration::from_secs(1));
            Ok(true)
        }
        Some(set) => {
            if cx.o.stash.stateful_set.is_some()
                && let Some(original) = cx.status.original_retention_policy.clone()
                && build::original_retention_policy(&set) != original
                && set.uid() == cx.o.stash.stateful_set.as_ref().and_then(|s| s.uid())
            {
                cx.act(Action::PatchRetentionPolicy {
                    stateful_set: set.name_any(),
                    policy: original,
                });
                return Ok(true);
            }
            Ok(false)
        }
        None => {
            if let Some(stashed) = cx.o.stash.stateful_set.clone() {
                recreate_stateful_set(cx, plan, &stashed)?;
                cx.wait(Duration::from_secs(1));
                return Ok(true);
            }
            Ok(false)
        }
    }
}

/// The request ends `Failed`, saying where each member's data is.
fn fail(cx: &mut Ctx, plan: &Plan) {
    let failure = cx
        .status
        .failure
        .clone()
        .unwrap_or_else(|| "unknown failure".to_string());
    let locations = data_locations(cx, plan);
    let note = foreign::failed_note(cx);
    let message = format!("failed: {failure}. Data: {locations}{note}");
    cx.status.phase = Phase::Failed;
    cx.enter_stage(Stage::Done);
    cx.status.completion_time = Some(cx.now.clone());
    cx.status.progress = Some(progress(&cx.status));
    cx.status.message = Some(message.clone());
    cx.set_condition(conditions::FAILED, true, "RolledBack", &message);
    cx.set_condition(conditions::READY, false, "Failed", &message);
    cx.set_condition(
        conditions::PROGRESSING,
        false,
        "RolledBack",
        "rollback finished",
    );
    cx.event(EventType::Warning, "Failed", message);
    remove_finalizer(cx);
    cx.requeue = super::REQUEUE_FINAL;
}

/// For each member: which claim, volume and class hold its data now, recorded in its
/// `dataLocation`; the text says it per class first, then per member.
fn data_locations(cx: &mut Ctx, plan: &Plan) -> String {
    let mut details = Vec::new();
    let mut by_class: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..cx.status.members.len() {
        let ms = cx.status.members[i].clone();
        let Some(m) = plan.members.iter().find(|m| m.pod == ms.pod) else {
            continue;
        };
        if let Some(held) = &ms.held {
            details.push(format!("{} {held}", m.pod));
            continue;
        }
        for c in claims::member_claims(m, &ms) {
            let (slot, m, ms) = (c.slot, &c.planned, &c.status);
            let location = data_location(cx, plan, m, ms);
            let pods = by_class.entry(location.storage_class.clone()).or_default();
            if !pods.contains(&m.pod) {
                pods.push(m.pod.clone());
            }
            details.push(describe_location(m, ms, &location));
            let mut c = cx.status.members[i].claim_status(slot);
            c.data_location = Some(location);
            cx.status.members[i].set_claim_status(slot, c);
        }
    }
    let summary: Vec<String> = by_class
        .iter()
        .map(|(class, pods)| format!("on StorageClass {class}: {}", pods.join(", ")))
        .collect();
    format!("{} -- {}", summary.join("; "), details.join("; "))
}

/// Where one member's data is: its new volume once migrated, else the volume it had.
fn data_location(cx: &Ctx, plan: &Plan, m: &PlannedMember, ms: &MemberStatus) -> DataLocation {
    let (volume, state, class) = match ms.step {
        MemberStep::Done => (
            ms.first_claim.new_volume.clone().unwrap_or_default(),
            DataState::Migrated,
            plan.target_storage_class.clone(),
        ),
        MemberStep::AlreadyThere => (
            m.old_volume.clone(),
            DataState::AlreadyThere,
            plan.target_storage_class.clone(),
        ),
        // Only when a rollback gave up in the middle of a swap: the claim is (or is about to
        // be) bound to the new volume once the old claim is gone.
        s if s.swap_begun() => match (&ms.first_claim.new_volume, s) {
            (Some(new), s)
                if !matches!(
                    s,
                    MemberStep::RetainingVolumes | MemberStep::DeletingOldClaim
                ) =>
            {
                (
                    new.clone(),
                    DataState::SwapInterrupted,
                    plan.target_storage_class.clone(),
                )
            }
            _ => (
                m.old_volume.clone(),
                DataState::SwapInterrupted,
                plan.source_storage_class.clone().unwrap_or_default(),
            ),
        },
        _ => (
            m.old_volume.clone(),
            DataState::Untouched,
            plan.source_storage_class.clone().unwrap_or_default(),
        ),
    };
    let storage_class =
        cx.o.volumes
            .get(&volume)
            .and_then(volume_class)
            .map_or(class, str::to_string);
    DataLocation {
        claim: m.claim.clone(),
        volume,
        storage_class,
        state,
    }
}

fn describe_location(m: &PlannedMember, ms: &MemberStatus, l: &DataLocation) -> String {
    let (pod, claim, volume, class) = (&m.pod, &l.claim, &l.volume, &l.storage_class);
    match l.state {
        DataState::SwapInterrupted => format!(
            "{pod} swap interrupted at step {:?}: claim {claim} -> volume {volume} ({class}); \
             the original data is on volume {}, its verified copy on volume {}, both Retain",
            ms.step,
            m.old_volume,
            ms.first_claim
                .new_volume
                .as_deref()
                .unwrap_or("(not recorded)")
        ),
        DataState::Migrated => format!(
            "{pod} on claim {claim} -> new volume {volume} ({class}; old volume {} kept, Retain)",
            m.old_volume
        ),
        DataState::Untouched => {
            format!("{pod} on claim {claim} -> original volume {volume} ({class}, untouched)")
        }
        DataState::AlreadyThere => format!(
            "{pod} on claim {claim} -> volume {volume} ({class}, already there before this \
             request, untouched)"
        ),
    }
}
