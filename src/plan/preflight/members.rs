//! Checks of the members: every pod exists, runs on a node, mounts its claim, and the claim is
//! bound to an existing Filesystem volume with a storage request.

use std::collections::BTreeMap;
use std::ops::Range;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Denial, DenialReason};
use crate::api::{PlannedMember, PlannedWork, Role};
use crate::build::{self, Manifest};
use crate::plan::observe::other_claim_users;
use crate::plan::{
    Observed, claim_class, claim_phase, claim_request, claim_volume, is_terminating, quantity,
};

/// The names a member's objects are derived from.
pub(super) struct Names {
    /// The request (temporary claims are named after it).
    pub request: String,
    /// The StatefulSet.
    pub set: String,
    /// The volumeClaimTemplate.
    pub template: String,
}

/// The members' ordinals (`ordinals.start` on, `replicas` of them; at least one).
pub(super) fn check_ordinals(set: &StatefulSet, set_name: &str) -> Result<Range<i32>, Denial> {
    let spec = set.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    if replicas < 1 {
        return Err(Denial::new(
            DenialReason::NoMembers,
            format!("StatefulSet {set_name} has 0 replicas: nothing to migrate"),
        ));
    }
    let start = spec
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0);
    Ok(start..start + replicas)
}

/// Every check of one member, in order; its planned migration and its claim's StorageClass
/// (empty when the claim names none).
pub(super) fn check_member(
    o: &Observed,
    names: &Names,
    ordinal: i32,
) -> Result<(PlannedMember, String), Denial> {
    let set = &names.set;
    let pod_name = format!("{set}-{ordinal}");
    let claim_name = format!("{}-{set}-{ordinal}", names.template);
    check_pod_and_claim(o, &names.request, ordinal, pod_name, claim_name)
}

/// Every check of a pod and the claim it mounts, in order; the planned migration and the
/// claim's StorageClass (empty when the claim names none).
pub(super) fn check_pod_and_claim(
    o: &Observed,
    request: &str,
    ordinal: i32,
    pod_name: String,
    claim_name: String,
) -> Result<(PlannedMember, String), Denial> {
    let pod = check_pod_exists(&o.pods, &pod_name)?;
    let node = check_scheduled(pod, &pod_name)?;
    let claim = check_claim_exists(&o.claims, &claim_name, &pod_name)?;
    check_pod_mounts_claim(pod, &claim_name, &pod_name)?;
    let volume = check_claim_bound(claim, &claim_name, &pod_name)?;
    check_volume_exists(&o.volumes, &volume, &claim_name)?;
    check_claim_volume_mode(claim, &claim_name)?;
    let old_size = check_claim_request(claim, &claim_name)?;
    let class = claim_class(claim).unwrap_or_default().to_string();
    let member = PlannedMember {
        ordinal,
        pod: pod_name,
        node,
        temp_claim: build::temp_claim_name(request, &claim_name),
        claim: claim_name,
        old_volume: volume,
        new_size: old_size.clone(),
        old_size,
        used_bytes: None,
        role: None,
        work: PlannedWork::Migrate,
        further_claims: Vec::new(),
    };
    Ok((member, class))
}

/// No pod but its member mounts the claim of a member to migrate: the migration stops only the
/// member, so another pod could write to the claim after the final copy, and those writes would
/// stay behind on the old volume.
pub(super) fn check_claims_not_shared(
    users: &BTreeMap<String, Vec<String>>,
    members: &[PlannedMember],
) -> Result<(), Denial> {
    let migrating = members.iter().filter(|m| m.work == PlannedWork::Migrate);
    let claims = migrating.flat_map(|m| crate::plan::claims::member_claims(m, &Default::default()));
    for m in claims.map(|c| c.planned) {
        if let Some(others) = other_claim_users(users, &m.claim, &m.pod) {
            return Err(Denial::new(
                DenialReason::ClaimShared,
                format!(
                    "claim {} of member {} is also mounted by pod {others}: the migration stops \
                     only the member, so writes of that pod after the final copy would be left \
                     behind on the old volume; stop it (or point it at another claim) and create \
                     the request again",
                    m.claim, m.pod
                ),
            ));
        }
    }
    Ok(())
}

/// The member pod exists and is not being deleted.
pub(super) fn check_pod_exists<'a>(
    pods: &'a BTreeMap<String, Manifest<Pod>>,
    pod_name: &str,
) -> Result<&'a Pod, Denial> {
    pods.get(pod_name)
        .map(|p| p.typed())
        .filter(|p| !is_terminating(*p))
        .ok_or_else(|| {
            Denial::new(
                DenialReason::MemberMissing,
                format!(
                    "member pod {pod_name} does not exist; every member must run before a migration"
                ),
            )
        })
}

/// The member pod is scheduled: the name of its node.
pub(super) fn check_scheduled(pod: &Pod, pod_name: &str) -> Result<String, Denial> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Denial::new(
                DenialReason::MemberNotScheduled,
                format!("member pod {pod_name} is not scheduled on a node"),
            )
        })
}

/// The member's claim exists.
pub(super) fn check_claim_exists<'a>(
    claims: &'a BTreeMap<String, PersistentVolumeClaim>,
    claim_name: &str,
    pod_name: &str,
) -> Result<&'a PersistentVolumeClaim, Denial> {
    claims.get(claim_name).ok_or_else(|| {
        Denial::new(
            DenialReason::ClaimNotFound,
            format!("claim {claim_name} of member {pod_name} does not exist"),
        )
    })
}

/// The member pod mounts its claim.
pub(super) fn check_pod_mounts_claim(
    pod: &Pod,
    claim_name: &str,
    pod_name: &str,
) -> Result<(), Denial> {
    let uses_claim = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| {
            vs.iter().any(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == claim_name)
            })
        });
    if !uses_claim {
        return Err(Denial::new(
            DenialReason::ClaimNotFound,
            format!("member pod {pod_name} does not mount claim {claim_name}"),
        ));
    }
    Ok(())
}

/// The claim is Bound and not being deleted: the name of its volume.
pub(super) fn check_claim_bound(
    claim: &PersistentVolumeClaim,
    claim_name: &str,
    pod_name: &str,
) -> Result<String, Denial> {
    match (claim_phase(claim), claim_volume(claim)) {
        ("Bound", Some(v)) if !is_terminating(claim) => Ok(v.to_string()),
        (phase, _) => Err(Denial::new(
            DenialReason::ClaimNotBound,
            format!("claim {claim_name} of member {pod_name} is {phase}, not Bound"),
        )),
    }
}

/// The claim's volume exists.
pub(super) fn check_volume_exists(
    volumes: &BTreeMap<String, PersistentVolume>,
    volume: &str,
    claim_name: &str,
) -> Result<(), Denial> {
    if !volumes.contains_key(volume) {
        return Err(Denial::new(
            DenialReason::VolumeNotFound,
            format!("volume {volume} of claim {claim_name} does not exist"),
        ));
    }
    Ok(())
}

/// The claim is a Filesystem volume (the default when unset).
pub(super) fn check_claim_volume_mode(
    claim: &PersistentVolumeClaim,
    claim_name: &str,
) -> Result<(), Denial> {
    if let Some(mode) = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref())
        && mode != "Filesystem"
    {
        return Err(Denial::new(
            DenialReason::UnsupportedVolumeMode,
            format!(
                "claim {claim_name} has volumeMode {mode}; only Filesystem volumes can be copied"
            ),
        ));
    }
    Ok(())
}

/// The claim requests storage, as a quantity: the request.
pub(super) fn check_claim_request(
    claim: &PersistentVolumeClaim,
    claim_name: &str,
) -> Result<Quantity, Denial> {
    let Some(size) = claim_request(claim).cloned() else {
        return Err(Denial::new(
            DenialReason::InvalidClaim,
            format!("claim {claim_name} has no storage request"),
        ));
    };
    if quantity::bytes(&size).is_none() {
        return Err(Denial::new(
            DenialReason::InvalidClaim,
            format!("claim {claim_name} requests {:?}, not a quantity", size.0),
        ));
    }
    Ok(size)
}

/// The migration order: members already there first (they are not migrated), then followers
/// (stable by ordinal), leader last.
pub(super) fn order(members: &mut [PlannedMember]) {
    members.sort_by_key(|m| {
        (
            m.work == PlannedWork::Migrate,
            m.role == Some(Role::Leader),
            m.ordinal,
        )
    });
}
