//! The checks of a Deployment's claim (`target.kind: Deployment`, or a claim target that a
//! Deployment's pods mount). Its pods stop by scaling the Deployment to zero and start by
//! scaling it back, so the plan has one member: the claim, with one of its pods' node for the
//! helpers.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Denial, DenialReason};
use crate::api::{DatabaseEngine, PlannedMember, StorageMigrationRequestSpec, TargetKind};
use crate::plan::{Autoscaler, Observed, is_terminating};

/// The Deployment exists and is not being deleted.
pub(super) fn check_exists<'a>(
    deployment: Option<&'a Deployment>,
    name: &str,
    namespace: &str,
) -> Result<&'a Deployment, Denial> {
    deployment.filter(|d| !is_terminating(*d)).ok_or_else(|| {
        Denial::new(
            DenialReason::TargetNotFound,
            format!("Deployment {name} not found in namespace {namespace}"),
        )
    })
}

/// What a StatefulSet alone has is not asked of another workload (`what`, e.g. "Deployment
/// web"): no `volumeClaimTemplate`, no etcd engine (its pods are no cluster's members).
pub(super) fn check_spec(spec: &StorageMigrationRequestSpec, what: &str) -> Result<(), Denial> {
    let invalid = |why: String| Denial::new(DenialReason::InvalidSpec, why);
    if spec.volume_claim_template.is_some() || !spec.volume_claim_templates.is_empty() {
        return Err(invalid(format!(
            "spec.volumeClaimTemplate(s) is for StatefulSet targets; {what} has no templates \
             (leave it unset, and name a claim with target.kind PersistentVolumeClaim)"
        )));
    }
    if spec.database.engine != DatabaseEngine::Generic {
        return Err(invalid(format!(
            "spec.database.engine {:?} needs a StatefulSet; {what} is not a database's members \
             (use Generic)",
            spec.database.engine
        )));
    }
    Ok(())
}

/// A claim target's bare pod exists and is not being deleted.
pub(super) fn check_bare_pod<'a>(
    o: &'a Observed,
    name: &str,
    namespace: &str,
) -> Result<&'a Pod, Denial> {
    super::members::check_pod_exists(&o.pods, name).map_err(|_| {
        Denial::new(
            DenialReason::TargetNotFound,
            format!("pod {name} not found in namespace {namespace}"),
        )
    })
}

/// The bare pod is Ready (`apply: IfReady`).
pub(super) fn check_pod_ready(pod: &Pod, name: &str) -> Result<(), Denial> {
    if crate::plan::pod_ready(pod) {
        return Ok(());
    }
    Err(Denial::new(
        DenialReason::NotHealthy,
        format!("pod {name} is not Ready; wait for it, or set apply: Always"),
    ))
}

/// The claims the Deployment's pod template mounts, in its order.
fn template_claims(deployment: &Deployment) -> Vec<String> {
    let volumes = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect()
}

/// The claims that move: the claim target, or every claim the pod template mounts (moved
/// together, in one scale-down).
pub(super) fn check_claim(
    deployment: &Deployment,
    spec: &StorageMigrationRequestSpec,
) -> Result<Vec<String>, Denial> {
    let name = deployment.name_any();
    let claims = template_claims(deployment);
    match spec.target.kind {
        TargetKind::PersistentVolumeClaim if claims.contains(&spec.target.name) => {
            Ok(vec![spec.target.name.clone()])
        }
        TargetKind::PersistentVolumeClaim => Err(Denial::new(
            DenialReason::TemplateNotFound,
            format!(
                "the pod template of Deployment {name} does not mount claim {} (it mounts: {})",
                spec.target.name,
                if claims.is_empty() {
                    "none".to_string()
                } else {
                    claims.join(", ")
                }
            ),
        )),
        _ if claims.is_empty() => Err(Denial::new(
            DenialReason::TemplateNotFound,
            format!("Deployment {name} mounts no PersistentVolumeClaim: nothing to migrate"),
        )),
        _ => Ok(claims),
    }
}

pub(super) fn check_replicas(deployment: &Deployment) -> Result<i32, Denial> {
    let replicas = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    if replicas < 1 {
        return Err(Denial::new(
            DenialReason::NoMembers,
            format!(
                "Deployment {} has 0 replicas: no pod uses its claim, so there is nothing to \
                 stop; scale it up first",
                deployment.name_any()
            ),
        ));
    }
    Ok(replicas)
}

/// Several replicas share the claim only when its access mode lets pods on several nodes mount
/// it (ReadWriteMany, ReadOnlyMany); a ReadWriteOnce claim would pin them to one node, and a
/// ReadWriteOncePod one admits one pod.
pub(super) fn check_replicas_share(
    o: &Observed,
    deployment: &Deployment,
    replicas: i32,
    claim: &str,
) -> Result<(), Denial> {
    let modes = o
        .claims
        .get(claim)
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    let shared = modes
        .iter()
        .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
    if replicas > 1 && !shared {
        return Err(Denial::new(
            DenialReason::ReplicasShareClaim,
            format!(
                "Deployment {} has {replicas} replicas sharing claim {claim} ({}): only one pod \
                 (or one node's pods) can mount it, so the replicas are not what they seem; \
                 scale it to 1 first",
                deployment.name_any(),
                if modes.is_empty() {
                    "no access mode".to_string()
                } else {
                    modes.join(", ")
                }
            ),
        ));
    }
    Ok(())
}

/// No HorizontalPodAutoscaler scales the Deployment, unless the request declares whatever
/// manages it paused (`spec.ownerPaused`).
pub(super) fn check_autoscalers(
    autoscalers: &[Autoscaler],
    deployment: &str,
    owner_paused: bool,
) -> Result<(), Denial> {
    let fighting: Vec<&str> = autoscalers
        .iter()
        .filter(|a| a.target_kind == "Deployment" && a.target_name == deployment)
        .map(|a| a.name.as_str())
        .collect();
    if fighting.is_empty() || owner_paused {
        return Ok(());
    }
    Err(Denial::new(
        DenialReason::Autoscaler,
        format!(
            "HorizontalPodAutoscaler {} scales Deployment {deployment}: it could change the \
             replicas the migration records and scales back to; delete it (or set its min and \
             max to the current replicas) for the request, then set spec.ownerPaused: true to \
             declare it paused",
            fighting.join(", ")
        ),
    ))
}

/// The Deployment is available and its rollout done (`apply: IfReady`): every replica updated
/// and ready, so the pods stopped are the ones its template makes.
pub(super) fn check_available(deployment: &Deployment, replicas: i32) -> Result<(), Denial> {
    let status = deployment.status.clone().unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let observed = status.observed_generation >= deployment.metadata.generation;
    if observed && ready == replicas && updated == replicas {
        return Ok(());
    }
    Err(Denial::new(
        DenialReason::NotHealthy,
        format!(
            "Deployment {} is not ready: {ready} of {replicas} replicas ready, {updated} \
             updated{}; wait for its rollout, or set apply: Always",
            deployment.name_any(),
            if observed {
                ""
            } else {
                ", its newest generation not yet observed"
            }
        ),
    ))
}

/// The pod the member is named after: the first of the Deployment's pods (by name) that runs
/// and mounts the claim.
pub(super) fn check_member_pod(
    o: &Observed,
    deployment: &str,
    claim: &str,
) -> Result<String, Denial> {
    o.pods
        .iter()
        .filter(|(_, p)| !is_terminating(p.typed()))
        .find(|(_, p)| crate::plan::claims_named(p.typed()).any(|c| c == claim))
        .map(|(name, _)| name.clone())
        .ok_or_else(|| {
            Denial::new(
                DenialReason::MemberMissing,
                format!("no running pod of Deployment {deployment} mounts claim {claim}"),
            )
        })
}

/// Only the Deployment's pods mount the claim.
pub(super) fn check_claim_not_shared(
    users: &BTreeMap<String, Vec<String>>,
    o: &Observed,
    member: &PlannedMember,
    deployment: &str,
) -> Result<(), Denial> {
    let others: Vec<&str> = users
        .get(&member.claim)
        .into_iter()
        .flatten()
        .filter(|p| !o.pods.contains_key(*p))
        .map(String::as_str)
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(Denial::new(
        DenialReason::ClaimShared,
        format!(
            "claim {} of Deployment {deployment} is also mounted by pod {}: the migration scales \
             only the Deployment to zero, so writes of that pod after the final copy would be \
             left behind on the old volume; stop it and create the request again",
            member.claim,
            others.join(", ")
        ),
    ))
}
