//! Checks of the spec on its own (no cluster needed).

use super::{Denial, DenialReason};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::{CopySpec, MigrationType, StorageMigrationRequestSpec};
use crate::plan::{quantity, timeout_seconds};

/// The pure validation of a spec on its own: the type's parameters, the timeout, the target.
pub fn validate_spec(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    match spec.type_ {
        MigrationType::StorageClassChange => check_class_change_spec(spec)?,
        MigrationType::Shrink => check_shrink_spec(spec)?,
    }
    check_template_names(spec)?;
    check_timeout(&spec.timeout)?;
    check_pre_copy_bandwidth(&spec.copy)?;
    check_target_name(&spec.target.name)
}

fn invalid(message: impl Into<String>) -> Denial {
    Denial::new(DenialReason::InvalidSpec, message)
}

/// A StorageClassChange names a class and takes no `shrink`.
pub(super) fn check_class_change_spec(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    let Some(change) = &spec.storage_class_change else {
        return Err(invalid(
            "type StorageClassChange needs spec.storageClassChange.storageClassName",
        ));
    };
    if change.storage_class_name.trim().is_empty() {
        return Err(invalid("spec.storageClassChange.storageClassName is empty"));
    }
    if spec.shrink.is_some() {
        return Err(invalid("type StorageClassChange does not take spec.shrink"));
    }
    Ok(())
}

/// A Shrink has a size (`size`, or one per template in `sizes`), each a positive quantity, and
/// takes no `storageClassChange`.
pub(super) fn check_shrink_spec(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    let Some(shrink) = spec
        .shrink
        .as_ref()
        .filter(|s| s.size.is_some() || !s.sizes.is_empty())
    else {
        return Err(invalid(
            "type Shrink needs spec.shrink.size (or spec.shrink.sizes, one per template)",
        ));
    };
    let named = shrink.sizes.iter().map(|(t, q)| (format!("sizes.{t}"), q));
    for (field, size) in shrink
        .size
        .iter()
        .map(|q| ("size".to_string(), q))
        .chain(named)
    {
        match quantity::bytes(size) {
            Some(b) if b > 0 => {}
            Some(_) => return Err(invalid(format!("spec.shrink.{field} must be positive"))),
            None => {
                return Err(invalid(format!(
                    "spec.shrink.{field} {:?} is not a quantity",
                    size.0
                )));
            }
        }
    }
    if spec.storage_class_change.is_some() {
        return Err(invalid("type Shrink does not take spec.storageClassChange"));
    }
    Ok(())
}

/// `volumeClaimTemplate` and `volumeClaimTemplates` are not both set, and the list names each
/// template once.
pub(super) fn check_template_names(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    let list = &spec.volume_claim_templates;
    if spec.volume_claim_template.is_some() && !list.is_empty() {
        return Err(invalid(
            "spec.volumeClaimTemplate and spec.volumeClaimTemplates are both set: name one \
             template, or list several",
        ));
    }
    if let Some(empty) = list.iter().position(|t| t.trim().is_empty()) {
        return Err(invalid(format!(
            "spec.volumeClaimTemplates[{empty}] is empty"
        )));
    }
    if let Some(twice) = (list.iter().enumerate()).find(|(i, t)| list[..*i].contains(t)) {
        return Err(invalid(format!(
            "spec.volumeClaimTemplates names {:?} twice",
            twice.1
        )));
    }
    Ok(())
}

/// The Shrink size of the claims of `template`: `shrink.sizes[template]`, else `shrink.size`.
pub(super) fn shrink_size(
    spec: &StorageMigrationRequestSpec,
    template: &str,
) -> Result<Quantity, Denial> {
    let shrink = spec.shrink.as_ref();
    shrink
        .and_then(|s| s.sizes.get(template).or(s.size.as_ref()))
        .cloned()
        .ok_or_else(|| {
            invalid(format!(
                "spec.shrink.sizes has no size for {template:?} and spec.shrink.size is unset"
            ))
        })
}

/// Every template `shrink.sizes` names is one that moves (`moved`).
pub(super) fn check_sizes_named(
    spec: &StorageMigrationRequestSpec,
    moved: &[String],
) -> Result<(), Denial> {
    let sizes = spec.shrink.iter().flat_map(|s| s.sizes.keys());
    match sizes.into_iter().find(|t| !moved.contains(t)) {
        Some(t) => Err(invalid(format!(
            "spec.shrink.sizes names {t:?}, which this request does not move (it moves: {})",
            moved.join(", ")
        ))),
        None => Ok(()),
    }
}

/// The timeout parses as a positive duration.
pub(super) fn check_timeout(timeout: &str) -> Result<(), Denial> {
    match timeout_seconds(timeout) {
        Ok(_) => Ok(()),
        Err(e) => Err(invalid(format!(
            "spec.timeout: {e} (use e.g. 30m or 1h30m)"
        ))),
    }
}

/// The target is named.
pub(super) fn check_target_name(name: &str) -> Result<(), Denial> {
    if name.trim().is_empty() {
        return Err(invalid("spec.target.name is empty"));
    }
    Ok(())
}

/// `spec.copy.preCopyBandwidth`, when set, is a quantity of at least 1Ki (rsync's `--bwlimit`
/// counts whole KiB per second).
pub(super) fn check_pre_copy_bandwidth(copy: &CopySpec) -> Result<(), Denial> {
    let Some(limit) = &copy.pre_copy_bandwidth else {
        return Ok(());
    };
    match quantity::bytes(limit) {
        Some(b) if b >= 1024 => Ok(()),
        Some(_) => Err(invalid(format!(
            "spec.copy.preCopyBandwidth {:?} is below 1Ki per second, the least rsync can be held to",
            limit.0
        ))),
        None => Err(invalid(format!(
            "spec.copy.preCopyBandwidth {:?} is not a quantity (use e.g. 50Mi, per second)",
            limit.0
        ))),
    }
}
