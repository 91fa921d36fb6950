//! Checks of the spec on its own (no cluster needed).

use super::{Denial, DenialReason};
use crate::api::{CopySpec, MigrationType, StorageMigrationRequestSpec};
use crate::plan::{quantity, timeout_seconds};

/// The pure validation of a spec on its own: the type's parameters, the timeout, the target.
pub fn validate_spec(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    match spec.type_ {
        MigrationType::StorageClassChange => check_class_change_spec(spec)?,
        MigrationType::Shrink => check_shrink_spec(spec)?,
    }
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

/// A Shrink has a positive size and takes no `storageClassChange`.
pub(super) fn check_shrink_spec(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    let Some(shrink) = &spec.shrink else {
        return Err(invalid("type Shrink needs spec.shrink.size"));
    };
    match quantity::bytes(&shrink.size) {
        Some(b) if b > 0 => {}
        Some(_) => return Err(invalid("spec.shrink.size must be positive")),
        None => {
            return Err(invalid(format!(
                "spec.shrink.size {:?} is not a quantity",
                shrink.size.0
            )));
        }
    }
    if spec.storage_class_change.is_some() {
        return Err(invalid("type Shrink does not take spec.storageClassChange"));
    }
    Ok(())
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
