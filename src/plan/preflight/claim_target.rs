//! A claim as the target (`target.kind: PersistentVolumeClaim`): the StatefulSet member whose
//! claim it is. Only a claim that one StatefulSet member's pod alone mounts, made from one of
//! the set's volumeClaimTemplates (`<template>-<set>-<ordinal>`), is accepted: that member is
//! the only one stopped, the others are `NotTargeted`.

use kube::ResourceExt;

use super::{Denial, DenialReason};
use crate::api::{PlannedMember, PlannedWork, StorageMigrationRequestSpec};
use crate::plan::Observed;
use crate::plan::observe::ClaimUser;

/// The member a target claim belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClaimMember {
    /// The StatefulSet that controls the claim's pod.
    pub set: String,
    /// The volumeClaimTemplate the claim was made from.
    pub template: String,
    /// The member's ordinal.
    pub ordinal: i32,
}

/// The member of target claim `claim`: the claim exists, one pod mounts it, a StatefulSet
/// controls that pod, and the claim is that member's claim of one of the set's templates.
pub(super) fn check_claim_target(
    o: &Observed,
    claim: &str,
    namespace: &str,
) -> Result<ClaimMember, Denial> {
    if !o.claims.contains_key(claim) {
        return Err(Denial::new(
            DenialReason::TargetNotFound,
            format!("PersistentVolumeClaim {claim} not found in namespace {namespace}"),
        ));
    }
    let user = only_user(&o.target_claim_users, claim)?;
    let set = match &user.owner {
        Some((kind, name)) if kind == "StatefulSet" => name.clone(),
        owner => return Err(unsupported_owner(claim, &user.pod, owner.as_ref())),
    };
    let not_from_template = |why: String| {
        Denial::new(
            DenialReason::TemplateNotFound,
            format!(
                "claim {claim} of pod {} is not made from a volumeClaimTemplate of StatefulSet \
                 {set}: {why}; only a member's claim of one of its templates can be migrated",
                user.pod
            ),
        )
    };
    let ordinal = user
        .pod
        .strip_prefix(&format!("{set}-"))
        .and_then(|n| n.parse::<i32>().ok())
        .ok_or_else(|| {
            not_from_template(format!("pod {} is not named {set}-<ordinal>", user.pod))
        })?;
    let template = claim
        .strip_suffix(&format!("-{}", user.pod))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| not_from_template(format!("its name does not end in -{}", user.pod)))?;
    let stateful_set = o.stateful_set.as_ref().map(|s| s.typed()).ok_or_else(|| {
        Denial::new(
            DenialReason::TargetNotFound,
            format!(
                "StatefulSet {set}, the controller of pod {} that mounts claim {claim}, not \
                 found in namespace {namespace}",
                user.pod
            ),
        )
    })?;
    let templates = stateful_set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .map(|ts| ts.iter().map(|t| t.name_any()).collect::<Vec<_>>())
        .unwrap_or_default();
    if !templates.iter().any(|t| t == template) {
        return Err(not_from_template(format!(
            "the set has no template {template:?} (it has: {})",
            if templates.is_empty() {
                "none".to_string()
            } else {
                templates.join(", ")
            }
        )));
    }
    Ok(ClaimMember {
        set,
        template: template.to_string(),
        ordinal,
    })
}

/// The one pod that mounts the claim: none is nothing to stop, several would write to it
/// after the final copy.
fn only_user<'a>(users: &'a [ClaimUser], claim: &str) -> Result<&'a ClaimUser, Denial> {
    match users {
        [user] => Ok(user),
        [] => Err(Denial::new(
            DenialReason::ClaimUnused,
            format!(
                "no pod mounts claim {claim}: there is no workload to stop and start again, so \
                 the migrator cannot tell which one its data belongs to; start the workload that \
                 uses it, or migrate that workload"
            ),
        )),
        several => Err(Denial::new(
            DenialReason::ClaimShared,
            format!(
                "claim {claim} is mounted by {} pods ({}): the migration stops one StatefulSet \
                 member, so the others' writes after the final copy would be left behind on the \
                 old volume",
                several.len(),
                several
                    .iter()
                    .map(|u| u.pod.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn unsupported_owner(claim: &str, pod: &str, owner: Option<&(String, String)>) -> Denial {
    let owner = match owner {
        Some((kind, name)) => format!("is controlled by {kind} {name}"),
        None => "has no controller (a bare pod)".to_string(),
    };
    Denial::new(
        DenialReason::UnsupportedOwner,
        format!(
            "claim {claim} is mounted by pod {pod}, which {owner}: only the claims of \
             StatefulSet members, Deployments and bare pods can be migrated"
        ),
    )
}

/// `spec.volumeClaimTemplate`, when set with a claim target, names the claim's own template.
pub(super) fn check_template_matches(
    spec: &StorageMigrationRequestSpec,
    member: &ClaimMember,
) -> Result<(), Denial> {
    match spec.volume_claim_template.as_deref() {
        Some(t) if t != member.template => Err(Denial::new(
            DenialReason::InvalidSpec,
            format!(
                "spec.volumeClaimTemplate is {t:?} but claim {} was made from template {:?} of \
                 StatefulSet {}; leave it unset for a PersistentVolumeClaim target",
                spec.target.name, member.template, member.set
            ),
        )),
        _ => Ok(()),
    }
}

/// Every member but the target claim's is left alone.
pub(super) fn mark_not_targeted(members: &mut [PlannedMember], ordinal: i32) {
    for m in members.iter_mut().filter(|m| m.ordinal != ordinal) {
        m.work = PlannedWork::NotTargeted;
    }
}
