//! Checks of the target: the StatefulSet and its volumeClaimTemplate.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use super::{Denial, DenialReason};
use crate::build::Manifest;
use crate::plan::is_terminating;

/// The target StatefulSet exists and is not being deleted.
pub(super) fn check_target_exists<'a>(
    set: Option<&'a Manifest<StatefulSet>>,
    set_name: &str,
    namespace: &str,
) -> Result<&'a StatefulSet, Denial> {
    set.map(|s| s.typed())
        .filter(|s| !is_terminating(*s))
        .ok_or_else(|| {
            Denial::new(
                DenialReason::TargetNotFound,
                format!("StatefulSet {set_name} not found in namespace {namespace}"),
            )
        })
}

/// The volumeClaimTemplate named `name`.
pub fn choose_template(set: &StatefulSet, name: &str) -> Result<PersistentVolumeClaim, Denial> {
    set.spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
        .find(|t| t.metadata.name.as_deref() == Some(name))
        .cloned()
        .ok_or_else(|| {
            Denial::new(
                DenialReason::TemplateNotFound,
                format!(
                    "StatefulSet {} has no volumeClaimTemplate {name:?}",
                    set.name_any()
                ),
            )
        })
}

/// The volumeClaimTemplates to migrate, in the order named: those `wanted` names, or every one
/// of the set when it names none.
pub(super) fn choose_templates(
    set: &StatefulSet,
    wanted: &[String],
) -> Result<Vec<PersistentVolumeClaim>, Denial> {
    if !wanted.is_empty() {
        return (wanted.iter())
            .map(|name| choose_template(set, name))
            .collect();
    }
    let templates = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default();
    if templates.is_empty() {
        return Err(Denial::new(
            DenialReason::TemplateNotFound,
            format!(
                "StatefulSet {} has no volumeClaimTemplates: nothing to migrate",
                set.name_any()
            ),
        ));
    }
    Ok(templates)
}

/// The template's claims are Filesystem volumes (the default when unset).
pub(super) fn check_template_volume_mode(template: &PersistentVolumeClaim) -> Result<(), Denial> {
    if let Some(mode) = template
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        && mode != "Filesystem"
    {
        return Err(Denial::new(
            DenialReason::UnsupportedVolumeMode,
            format!(
                "volumeClaimTemplate {} has volumeMode {mode}; only Filesystem volumes can be copied",
                template.name_any()
            ),
        ));
    }
    Ok(())
}
