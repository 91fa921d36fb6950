//! Checks of the StorageClasses and sizes: where the claims move to, and how big they become.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::{Denial, DenialReason};
use crate::api::{MigrationType, PlannedMember, StorageMigrationRequestSpec};
use crate::plan::{claim_request, class_is_wffc, quantity};

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

/// StorageClassChange: no claim is on the target class already.
pub(super) fn check_not_same_class(
    source_classes: &[String],
    target_class: &str,
) -> Result<(), Denial> {
    if source_classes.iter().any(|c| c == target_class) {
        return Err(Denial::new(
            DenialReason::SameStorageClass,
            format!("the claims are already on StorageClass {target_class}"),
        ));
    }
    Ok(())
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

/// Shrink: the size is below every member's current request; the size.
pub(super) fn check_shrink_size(
    spec: &StorageMigrationRequestSpec,
    members: &[PlannedMember],
) -> Result<Quantity, Denial> {
    let size = spec
        .shrink
        .as_ref()
        .map(|s| s.size.clone())
        .unwrap_or_default();
    let size_bytes = quantity::bytes(&size).unwrap_or_default();
    for m in members {
        let old = quantity::bytes(&m.old_size).unwrap_or_default();
        if size_bytes >= old {
            return Err(Denial::new(
                DenialReason::NotSmaller,
                format!(
                    "shrink size {} is not below claim {}'s request {}",
                    size.0, m.claim, m.old_size.0
                ),
            ));
        }
    }
    Ok(size)
}
