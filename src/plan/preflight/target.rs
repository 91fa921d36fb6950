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

/// The volumeClaimTemplate to migrate: the one named, else the only one.
pub fn choose_template(
    set: &StatefulSet,
    wanted: Option<&str>,
) -> Result<PersistentVolumeClaim, Denial> {
    let set_name = set.name_any();
    let templates = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default();
    match wanted {
        Some(name) => templates
            .into_iter()
            .find(|t| t.metadata.name.as_deref() == Some(name))
            .ok_or_else(|| {
                Denial::new(
                    DenialReason::TemplateNotFound,
                    format!("StatefulSet {set_name} has no volumeClaimTemplate {name:?}"),
                )
            }),
        None => match templates.len() {
            0 => Err(Denial::new(
                DenialReason::TemplateNotFound,
                format!("StatefulSet {set_name} has no volumeClaimTemplates: nothing to migrate"),
            )),
            1 => Ok(templates.into_iter().next().unwrap_or_default()),
            n => Err(Denial::new(
                DenialReason::TemplateRequired,
                format!(
                    "StatefulSet {set_name} has {n} volumeClaimTemplates ({}); set \
                     spec.volumeClaimTemplate",
                    templates
                        .iter()
                        .map(|t| t.name_any())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        },
    }
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
