//! Checks of the StorageClasses and sizes: where the claims move to, and how big they become.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::{Denial, DenialReason};
use crate::api::{MigrationType, PlannedMember, PlannedWork, StorageMigrationRequestSpec};
use crate::plan::{Observed, claim_class, claim_request, class_is_wffc, quantity, volume_class};

/// The members' claim classes, sorted and without duplicates.
pub(super) fn distinct(mut classes: Vec<String>) -> Vec<String> {
    classes.sort();
    classes.dedup();
    classes
}

/// The class the claims move to: the requested one (StorageClassChange), else the one class
/// they are all on (Shrink).
pub(super) fn check_target_class(
    spec: &StorageMigrationRequestSpec,
    source_classes: &[String],
) -> Result<String, Denial> {
    match spec.type_ {
        MigrationType::StorageClassChange => Ok(spec
            .storage_class_change
            .as_ref()
            .map(|c| c.storage_class_name.clone())
            .unwrap_or_default()),
        MigrationType::Shrink => {
            if source_classes.len() > 1 {
                return Err(Denial::new(
                    DenialReason::MixedStorageClasses,
                    format!(
                        "the members' claims are on different StorageClasses ({}); migrate them to one class first",
                        source_classes.join(", ")
                    ),
                ));
            }
            Ok(source_classes.first().cloned().unwrap_or_default())
        }
    }
}

/// The target class exists.
pub(super) fn check_storage_class<'a>(
    classes: &'a BTreeMap<String, StorageClass>,
    target_class: &str,
) -> Result<&'a StorageClass, Denial> {
    classes.get(target_class).ok_or_else(|| {
        Denial::new(
            DenialReason::StorageClassNotFound,
            format!("StorageClass {target_class:?} does not exist"),
        )
    })
}

/// StorageClassChange: marks `AlreadyThere` each member whose claim and the claim's volume both
/// are on the target class (an earlier request migrated it); the others stay `Migrate`.
pub(super) fn mark_on_class(o: &Observed, members: &mut [PlannedMember], target_class: &str) {
    for m in members
        .iter_mut()
        .filter(|m| m.work == PlannedWork::Migrate)
    {
        let claim = o.claims.get(&m.claim).and_then(claim_class);
        let volume = o.volumes.get(&m.old_volume).and_then(volume_class);
        if claim == Some(target_class) && volume == Some(target_class) {
            m.work = PlannedWork::AlreadyThere;
        }
    }
}

/// StorageClassChange: denied only when every member already is on the target class and so is
/// the StatefulSet's template (nothing left to do). `template` is `None` for a claim target (the
/// set keeps it): then only the target claim counts.
pub(super) fn check_not_all_on_class(
    members: &[PlannedMember],
    template: Option<&PersistentVolumeClaim>,
    target_class: &str,
) -> Result<(), Denial> {
    let template_there = template.is_none_or(|t| claim_class(t) == Some(target_class));
    if template_there && all_already_there(members) {
        let what = match template {
            Some(t) => format!(
                "every member's claim and volume, and the StatefulSet's volumeClaimTemplate {}, \
                 are",
                t.name_any()
            ),
            None => "the claim and its volume are".to_string(),
        };
        return Err(Denial::new(
            DenialReason::SameStorageClass,
            format!("{what} already on StorageClass {target_class}: nothing to do"),
        ));
    }
    Ok(())
}

/// Every member the request targets already is there.
fn all_already_there(members: &[PlannedMember]) -> bool {
    members
        .iter()
        .filter(|m| m.work != PlannedWork::NotTargeted)
        .all(|m| m.work == PlannedWork::AlreadyThere)
}

/// StorageClassChange of a claim target: the claim keeps its own size.
pub(super) fn targeted_size(members: &[PlannedMember]) -> Quantity {
    members
        .iter()
        .find(|m| m.work != PlannedWork::NotTargeted)
        .map(|m| m.old_size.clone())
        .unwrap_or_default()
}

/// The distinct classes of the members that will migrate (`classes[i]` is member `i`'s).
pub(super) fn migrating_classes(members: &[PlannedMember], classes: &[String]) -> Vec<String> {
    distinct(
        members
            .iter()
            .zip(classes)
            .filter(|(m, _)| m.work == PlannedWork::Migrate)
            .map(|(_, c)| c.clone())
            .collect(),
    )
}

/// StorageClassChange: a WaitForFirstConsumer source class needs a WaitForFirstConsumer target
/// (an Immediate one could provision the new volumes away from the members' nodes). Source
/// classes that do not exist are not compared.
pub(super) fn check_binding_mode(
    classes: &BTreeMap<String, StorageClass>,
    source_classes: &[String],
    target: &StorageClass,
    target_class: &str,
) -> Result<(), Denial> {
    for class in source_classes {
        if let Some(source) = classes.get(class)
            && class_is_wffc(source)
            && !class_is_wffc(target)
        {
            return Err(Denial::new(
                DenialReason::BindingModeMismatch,
                format!(
                    "source StorageClass {class} is WaitForFirstConsumer but target {target_class} is not: the new volumes could be provisioned away from the members' nodes"
                ),
            ));
        }
    }
    Ok(())
}

/// StorageClassChange: the template's storage request, which the new claims keep.
pub(super) fn check_template_size(template: &PersistentVolumeClaim) -> Result<Quantity, Denial> {
    claim_request(template).cloned().ok_or_else(|| {
        Denial::new(
            DenialReason::InvalidClaim,
            format!(
                "volumeClaimTemplate {} has no storage request",
                template.name_any()
            ),
        )
    })
}

/// Shrink: the size; each member whose claim already requests it is marked `AlreadyThere`, the
/// others must request more (a smaller claim would grow). Denied when every member and the
/// template already are at the size.
pub(super) fn check_shrink_size(
    size: Quantity,
    members: &mut [PlannedMember],
    template: Option<&PersistentVolumeClaim>,
) -> Result<Quantity, Denial> {
    let size_bytes = quantity::bytes(&size).unwrap_or_default();
    for m in members
        .iter_mut()
        .filter(|m| m.work != PlannedWork::NotTargeted)
    {
        let old = quantity::bytes(&m.old_size).unwrap_or_default();
        if size_bytes > old {
            return Err(Denial::new(
                DenialReason::NotSmaller,
                format!(
                    "shrink size {} is above claim {}'s request {}: it would grow",
                    size.0, m.claim, m.old_size.0
                ),
            ));
        }
        if size_bytes == old {
            m.work = PlannedWork::AlreadyThere;
        }
    }
    let template_there =
        template.is_none_or(|t| claim_request(t).and_then(quantity::bytes) == Some(size_bytes));
    if template_there && all_already_there(members) {
        let what = match template {
            Some(t) => format!(
                "every member's claim, and the StatefulSet's volumeClaimTemplate {}, already \
                 request",
                t.name_any()
            ),
            None => "the claim already requests".to_string(),
        };
        return Err(Denial::new(
            DenialReason::NotSmaller,
            format!("{what} {}: nothing to do", size.0),
        ));
    }
    Ok(size)
}
