//! The stash: manifests saved before the objects they describe are deleted, on the request's
//! annotations while they fit, else in the stash ConfigMap.

use kube::ResourceExt;
use serde::Serialize;

use super::{Action, Ctx, Failure, StashTarget};
use crate::build;
use crate::labels;

/// A stashed manifest's key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StashKey {
    StatefulSet,
    Pod(String),
    Claim(String),
}

impl StashKey {
    pub fn annotation(&self) -> String {
        match self {
            StashKey::StatefulSet => labels::STASH_STATEFULSET_ANNOTATION.to_string(),
            StashKey::Pod(pod) => build::stash_pod_annotation(pod),
            StashKey::Claim(claim) => format!("{}{claim}", labels::STASH_CLAIM_ANNOTATION_PREFIX),
        }
    }

    /// The key in the stash ConfigMap: the annotation without its prefix (ConfigMap keys allow
    /// no `/`).
    pub fn config_map_key(&self) -> String {
        build::stash::stash_config_map_key(&self.annotation()).to_string()
    }
}

/// Stores `obj` in the stash: on the request while the annotation budget allows, else in the
/// stash ConfigMap (recorded in the status first).
pub(crate) fn stash<T: Serialize>(cx: &mut Ctx, key: StashKey, obj: &T) -> Result<(), Failure> {
    let value = build::stash_encode(obj).map_err(|e| Failure::Stash {
        key: key.annotation(),
        error: e.to_string(),
    })?;
    let annotation = key.annotation();
    let name_part = annotation
        .rsplit_once('/')
        .map_or(annotation.as_str(), |(_, n)| n);
    let target = match &cx.status.stash_config_map {
        Some(cm) => StashTarget::ConfigMap {
            name: cm.clone(),
            key: key.config_map_key(),
        },
        None => {
            let current = cx.o.request.annotations();
            if name_part.len() <= 63
                && build::stash_fits_in_annotations(current, [(&annotation, &value)])
            {
                StashTarget::Annotation(annotation)
            } else {
                let cm = build::stash_config_map_name(&cx.name());
                cx.status.stash_config_map = Some(cm.clone());
                StashTarget::ConfigMap {
                    name: cm,
                    key: key.config_map_key(),
                }
            }
        }
    };
    cx.act(Action::Stash { target, value });
    Ok(())
}
