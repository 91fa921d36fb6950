//! Check that nothing else manages the target StatefulSet: another controller (an
//! ownerReference with `controller: true`) or a GitOps tool (Argo CD, Flux) could recreate the
//! set while its members are moved and start a member on an empty or stale volume.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Denial, DenialReason};
use crate::labels;

/// Who else manages a StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForeignOwner {
    /// The ownerReference with `controller: true`.
    Controller { kind: String, name: String },
    /// An Argo CD Application, from its tracking annotation or its instance label.
    ArgoCd { application: String },
    /// A Flux Kustomization, from the labels kustomize-controller puts on what it applies.
    FluxKustomization { namespace: String, name: String },
    /// A Flux HelmRelease, from the labels helm-controller puts on what it renders.
    FluxHelmRelease { namespace: String, name: String },
}

impl std::fmt::Display for ForeignOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Controller { kind, name } => write!(f, "{kind} {name} (its controller)"),
            Self::ArgoCd { application } => write!(f, "Argo CD application {application}"),
            Self::FluxKustomization { namespace, name } => {
                write!(f, "Flux Kustomization {namespace}/{name}")
            }
            Self::FluxHelmRelease { namespace, name } => {
                write!(f, "Flux HelmRelease {namespace}/{name}")
            }
        }
    }
}

impl ForeignOwner {
    /// How the user pauses this owner.
    pub(crate) fn how_to_pause(&self) -> String {
        match self {
            Self::Controller { kind, .. } => format!(
                "pause the reconciliation of the {kind} (or scale its operator down) as its \
                 documentation says"
            ),
            Self::ArgoCd { application } => format!(
                "disable automated sync and self-heal of the Argo CD Application {application}"
            ),
            Self::FluxKustomization { namespace, name } => {
                format!("run `flux suspend kustomization {name} -n {namespace}`")
            }
            Self::FluxHelmRelease { namespace, name } => {
                format!("run `flux suspend helmrelease {name} -n {namespace}`")
            }
        }
    }
}

/// Who else manages the set, if anyone: its controller ownerReference first, then Argo CD's
/// tracking annotation or instance label, then Flux's Kustomization labels, then Flux's
/// HelmRelease labels. The label `app.kubernetes.io/instance` alone is not enough: many charts
/// set it.
pub fn foreign_owner(set: &impl ResourceExt) -> Option<ForeignOwner> {
    let controller = crate::plan::controller_ref(set).map(|r| ForeignOwner::Controller {
        kind: r.kind.clone(),
        name: r.name.clone(),
    });
    controller
        .or_else(|| argo_cd(set))
        .or_else(|| {
            flux(set, &labels::FLUX_KUSTOMIZATION_LABELS)
                .map(|(namespace, name)| ForeignOwner::FluxKustomization { namespace, name })
        })
        .or_else(|| {
            flux(set, &labels::FLUX_HELM_RELEASE_LABELS)
                .map(|(namespace, name)| ForeignOwner::FluxHelmRelease { namespace, name })
        })
}

/// The Argo CD Application: the part of the tracking id before its first `:`, else the
/// instance label.
fn argo_cd(set: &impl ResourceExt) -> Option<ForeignOwner> {
    let tracked = set
        .annotations()
        .get(labels::ARGOCD_TRACKING_ID_ANNOTATION)
        .map(|id| id.split(':').next().unwrap_or(id.as_str()));
    tracked
        .or_else(|| {
            set.labels()
                .get(labels::ARGOCD_INSTANCE_LABEL)
                .map(String::as_str)
        })
        .filter(|app| !app.is_empty())
        .map(|app| ForeignOwner::ArgoCd {
            application: app.to_string(),
        })
}

/// A Flux object's namespace and name from its pair of labels (the namespace defaults to the
/// set's own).
fn flux(set: &impl ResourceExt, [name_key, namespace_key]: &[&str; 2]) -> Option<(String, String)> {
    let name = set.labels().get(*name_key).filter(|n| !n.is_empty())?;
    let namespace = set
        .labels()
        .get(*namespace_key)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| set.namespace().unwrap_or_default());
    Some((namespace, name.clone()))
}

/// Nothing else manages the set, or the request declares it paused (`spec.ownerPaused`): the
/// owner so declared is returned.
pub(super) fn check_owner(
    set: &StatefulSet,
    owner_paused: bool,
) -> Result<Option<ForeignOwner>, Denial> {
    check_managed(
        set,
        owner_paused,
        "StatefulSet",
        "recreate it during the migration and start a member",
        "recreates or changes the set",
    )
}

/// Nothing else manages the Deployment, or the request declares it paused (`spec.ownerPaused`).
pub(super) fn check_deployment_owner(
    deployment: &Deployment,
    owner_paused: bool,
) -> Result<Option<ForeignOwner>, Denial> {
    check_managed(
        deployment,
        owner_paused,
        "Deployment",
        "scale it up or change it during the migration and start a pod",
        "scales or changes the Deployment",
    )
}

/// Nothing else manages the bare pod (Argo CD or Flux would recreate it), or the request
/// declares it paused (`spec.ownerPaused`).
pub(super) fn check_pod_owner(
    pod: &Pod,
    owner_paused: bool,
) -> Result<Option<ForeignOwner>, Denial> {
    check_managed(
        pod,
        owner_paused,
        "pod",
        "recreate it during the migration and start it",
        "recreates the pod",
    )
}

/// The workload `obj` of kind `kind` has no foreign owner, or it is declared paused; `could`
/// and `nothing` say what such an owner could do.
fn check_managed(
    obj: &impl ResourceExt,
    owner_paused: bool,
    kind: &str,
    could: &str,
    nothing: &str,
) -> Result<Option<ForeignOwner>, Denial> {
    let Some(owner) = foreign_owner(obj) else {
        return Ok(None);
    };
    if owner_paused {
        return Ok(Some(owner));
    }
    Err(Denial::new(
        DenialReason::ForeignOwner,
        format!(
            "{kind} {} is managed by {owner}, which could {could} on an empty or stale volume: \
             {}, then set spec.ownerPaused: true to declare it paused (you take responsibility \
             that nothing {nothing} until the request ends)",
            obj.name_any(),
            owner.how_to_pause()
        ),
    ))
}

/// The note the accepted message carries when the request declared the set's owner paused.
pub(super) fn paused_note(owner: &ForeignOwner) -> String {
    format!("; {owner} declared paused by spec.ownerPaused")
}
