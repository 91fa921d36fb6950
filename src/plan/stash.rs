//! The stash: manifests saved before the objects they describe are deleted, in the request's
//! stash ConfigMap `<request>-stash`, one key per manifest (`statefulset`, `pod-<pod>`,
//! `claim-<claim>`; values gzip + base64 JSON, see `build::stash`).
//!
//! - Where: an object of its own, found again by its name and checked by its labels
//!   (`storagemigrator.io/request` and `storagemigrator.io/request-uid`). Never on the request
//!   and never owned by it: a `kubectl replace` or `apply` of the request (which drops its
//!   annotations and finalizer), the removal of its finalizer, or its deletion leave the stash
//!   where it is.
//! - When: created (empty) before the first destructive step, on the first stash; recorded in
//!   `status.stashConfigMap` once it has been seen to exist.
//! - Until: deleted once the request succeeded (after the final check passed). Kept when the
//!   request Failed, and when a Failed request is deleted: it may be all that is left of a
//!   member's pod or of the StatefulSet; deleting it is a human's call (docs/architecture.md).
//! - Read-checked: an entry that cannot be decoded, or holds another object than its key names,
//!   a ConfigMap of that name that belongs to another request, or the ConfigMap gone after it
//!   was recorded, stop the request ([`stash_problem`]); none is ever skipped silently.
//! - Size: one ConfigMap holds up to 1 MiB; the stash stays within `build::STASH_BUDGET` (900
//!   KiB, a few hundred members); an entry that would exceed it is refused with
//!   [`Failure::StashFull`] before the destructive step it precedes, and the request rolls back.
//!
//! Stashes written on the request's annotations by earlier versions (before 1.0) are not read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::ResourceExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::runbook::Stuck;
use super::{Action, Ctx, Failure, Object, Stash, StashObject, stuck};
use crate::api::{Stage, StorageMigrationRequestStatus};
use crate::build::{self, Manifest};
use crate::labels;

/// A stashed manifest's key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StashKey {
    StatefulSet,
    Pod(String),
    Claim(String),
}

impl StashKey {
    /// The key in the stash ConfigMap.
    pub fn config_map_key(&self) -> String {
        match self {
            StashKey::StatefulSet => labels::STASH_STATEFULSET_KEY.to_string(),
            StashKey::Pod(pod) => build::stash_key(labels::STASH_POD_KEY_PREFIX, pod),
            StashKey::Claim(claim) => build::stash_key(labels::STASH_CLAIM_KEY_PREFIX, claim),
        }
    }
}

/// Stores `obj` in the stash ConfigMap. When the ConfigMap does not exist yet it is created
/// first (this decision), and the entry is stored by the next one; when it belongs to another
/// request nothing is stored (the request is stuck, see [`stash_problem`]). The caller returns
/// after this: the destructive step that follows a stash waits for the next decision, which sees
/// the entry stored.
pub(crate) fn stash<T: Serialize>(cx: &mut Ctx, key: StashKey, obj: &T) -> Result<(), Failure> {
    let config_map = build::stash_config_map_name(&cx.name());
    let key = key.config_map_key();
    let sizes = match &cx.o.stash.object {
        StashObject::Ours { sizes, .. } => sizes,
        StashObject::Missing => {
            cx.act(Action::Create(Object::ConfigMap(Box::new(
                build::stash_config_map(&cx.o.request),
            ))));
            cx.wait(std::time::Duration::from_millis(500));
            return Ok(());
        }
        StashObject::Foreign { .. } => {
            if let Some(problem) = stash_problem(cx) {
                stuck(cx, Stuck::Stash, &problem);
            }
            return Ok(());
        }
    };
    let value = build::stash_encode(obj).map_err(|e| Failure::Stash {
        key: key.clone(),
        error: e.to_string(),
    })?;
    let total = sizes.values().sum();
    if !build::stash_fits(total, sizes.get(&key).copied(), &key, &value) {
        return Err(Failure::StashFull {
            key,
            config_map,
            budget: build::STASH_BUDGET,
        });
    }
    cx.act(Action::Stash {
        config_map,
        key,
        value,
    });
    Ok(())
}

/// Records the stash ConfigMap's name in the status once it has been seen to exist (not when
/// its creation is asked for: a crash in between must not make a ConfigMap never created look
/// deleted); then, when the stash has a problem ([`stash_problem`]), says so and stops: true
/// when the decision must do nothing else.
pub(crate) fn stopped_by_a_problem(cx: &mut Ctx) -> bool {
    if cx.status.stash_config_map.is_none() && matches!(cx.o.stash.object, StashObject::Ours { .. })
    {
        cx.status.stash_config_map = Some(build::stash_config_map_name(&cx.name()));
    }
    let Some(problem) = stash_problem(cx) else {
        return false;
    };
    stuck(cx, Stuck::Stash, &problem);
    true
}

/// What is wrong with the stash, in a stage that may need it (the StatefulSet orphaned, members
/// migrating, rolling back): a ConfigMap of another request under its name, an entry that
/// cannot be read, or the ConfigMap gone after it was recorded. `None` when all is well, and in
/// the stages that never read it (Preflight, Finalizing, Done).
pub(crate) fn stash_problem(cx: &Ctx) -> Option<String> {
    if !matches!(
        cx.status.stage,
        Stage::OrphaningStatefulSet
            | Stage::Migrating
            | Stage::RecreatingStatefulSet
            | Stage::RollingBack
    ) {
        return None;
    }
    let name = build::stash_config_map_name(&cx.name());
    match &cx.o.stash.object {
        StashObject::Foreign { uid_label } => {
            return Some(format!(
                "ConfigMap {name} is not this request's stash (its {} label is {}, this \
                 request's uid is {}): it is likely the stash kept after an earlier request of \
                 the same name; restore what it holds if needed, delete it, and this request \
                 goes on",
                labels::REQUEST_UID_LABEL,
                uid_label.as_deref().unwrap_or("missing"),
                cx.o.request.uid().unwrap_or_default(),
            ));
        }
        StashObject::Missing if cx.status.stash_config_map.is_some() => {
            return Some(format!(
                "the stash ConfigMap {name} was deleted while the request was in progress: the \
                 manifests it held are lost and the request cannot go on safely"
            ));
        }
        _ => {}
    }
    let (key, reason) = cx.o.stash.errors.first()?;
    Some(format!(
        "stash entry {key} of ConfigMap {name} cannot be read: {reason}"
    ))
}

/// The stash as read from the ConfigMap `cm` (when there is one) of the request with uid
/// `request_uid`: the entries the plan names (the StatefulSet, each member's pod and claim)
/// decoded. Pure.
///
/// A ConfigMap whose uid label is not `request_uid` is [`StashObject::Foreign`] and none of its
/// entries are read. An entry that cannot be decoded, or that holds an object of another name
/// than its key says, is recorded in `errors`, never dropped silently.
pub fn read_stash(
    cm: Option<&ConfigMap>,
    request_uid: Option<&str>,
    status: &StorageMigrationRequestStatus,
) -> Stash {
    let Some(cm) = cm else {
        return Stash::default();
    };
    let uid_label = cm.labels().get(labels::REQUEST_UID_LABEL).cloned();
    if request_uid.is_none() || uid_label.as_deref() != request_uid {
        return Stash {
            object: StashObject::Foreign { uid_label },
            ..Default::default()
        };
    }
    let empty = BTreeMap::new();
    let data = cm.data.as_ref().unwrap_or(&empty);
    let mut stash = Stash {
        object: StashObject::Ours {
            uid: cm.uid(),
            sizes: data
                .iter()
                .map(|(k, v)| (k.clone(), k.len() + v.len()))
                .collect(),
        },
        ..Default::default()
    };
    let mut errors = Vec::new();
    let plan = status.plan.as_ref();
    let set_name = plan.map(|p| p.stateful_set.as_str());
    let key = StashKey::StatefulSet;
    stash.stateful_set = decode_entry(data, &key, set_name, manifest_name, &mut errors);
    for m in plan.iter().flat_map(|p| p.members.iter()) {
        let key = StashKey::Pod(m.pod.clone());
        if let Some(p) = decode_entry(data, &key, Some(&m.pod), manifest_name, &mut errors) {
            stash.pods.insert(m.pod.clone(), p);
        }
        let claims = super::claims::member_claims(m, &Default::default());
        for claim in claims.iter().map(|c| c.claim().to_string()) {
            let key = StashKey::Claim(claim.clone());
            let claim_name = |c: &PersistentVolumeClaim| c.name_any();
            if let Some(c) = decode_entry(data, &key, Some(&claim), claim_name, &mut errors) {
                stash.claims.insert(claim, c);
            }
        }
    }
    stash.errors = errors;
    stash
}

fn manifest_name<K: kube::Resource>(m: &Manifest<K>) -> String {
    m.name_any()
}

/// The entry `key` decoded; `None` when it is absent, or when it cannot be decoded or names
/// another object than `name` (then the key and the reason are added to `errors`).
fn decode_entry<T: DeserializeOwned>(
    data: &BTreeMap<String, String>,
    key: &StashKey,
    name: Option<&str>,
    name_of: impl Fn(&T) -> String,
    errors: &mut Vec<(String, String)>,
) -> Option<T> {
    let key = key.config_map_key();
    let value = data.get(&key)?;
    match build::stash_decode::<T>(value) {
        Ok(v) if name.is_none_or(|n| name_of(&v) == n) => Some(v),
        Ok(v) => {
            let expected = name.unwrap_or_default();
            errors.push((key, format!("holds {}, not {expected}", name_of(&v))));
            None
        }
        Err(e) => {
            errors.push((key, e.to_string()));
            None
        }
    }
}

#[cfg(test)]
mod tests;
