//! `kubectl smr fleet`: every workload with a claim on one StorageClass, and the request that
//! moves it to another. The pure parts: which workloads (from lists the command reads), the
//! request for each, and the lines of the plan. Each request is then judged by the same
//! preflight as `kubectl smr plan`.
//!
//! A workload is one of:
//! - a StatefulSet, when a claim of one of its members (`<template>-<set>-<ordinal>`, for the
//!   ordinals its replicas run) is on the class: the request names the templates whose claims
//!   are (none when all of them are: every template moves);
//! - a Deployment, when every claim its pod template mounts is on the class; when only some
//!   are, each of those is a claim target of its own (a Deployment request moves all its
//!   claims, and the others are not to move);
//! - any other claim on the class (a bare pod's, one no pod mounts, one of a scaled-down
//!   member): a claim target, for preflight to accept or deny with its reason.
//!
//! Claims being deleted and the temporary claims of running requests (labelled
//! [`labels::REQUEST_LABEL`]) are no workload's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use crate::api::{
    MigrationType, StorageClassChangeSpec, StorageMigrationRequest, StorageMigrationRequestSpec,
    TargetKind, TargetRef,
};
use crate::build::names;
use crate::labels;

/// One workload with claims on the class being retired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub kind: TargetKind,
    pub name: String,
    /// A StatefulSet's templates to move, when not all of them are on the class.
    pub templates: Vec<String>,
    /// The claims on the class it mounts.
    pub claims: Vec<String>,
}

/// What the command listed, in the namespaces it covers.
pub struct Inventory<'a> {
    pub sets: &'a [StatefulSet],
    pub deployments: &'a [Deployment],
    pub claims: &'a [PersistentVolumeClaim],
}

/// `(namespace, claim)` of every claim on `class` that can be a workload's.
fn claims_on(class: &str, claims: &[PersistentVolumeClaim]) -> BTreeSet<(String, String)> {
    claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| !c.labels().contains_key(labels::REQUEST_LABEL))
        .filter(|c| (c.spec.as_ref()).and_then(|s| s.storage_class_name.as_deref()) == Some(class))
        .map(|c| (c.namespace().unwrap_or_default(), c.name_any()))
        .collect()
}

/// Every workload with a claim on `from`, ordered by namespace, kind and name.
pub fn discover(from: &str, inv: &Inventory) -> Vec<Workload> {
    let mut left = claims_on(from, inv.claims);
    let mut found = Vec::new();
    for set in inv.sets {
        if let Some(w) = stateful_set(set, &mut left) {
            found.push(w);
        }
    }
    for d in inv.deployments {
        found.extend(deployment(d, &mut left));
    }
    found.extend(left.into_iter().map(|(namespace, claim)| Workload {
        namespace,
        kind: TargetKind::PersistentVolumeClaim,
        name: claim.clone(),
        templates: Vec::new(),
        claims: vec![claim],
    }));
    found.sort_by(|a, b| {
        (&a.namespace, kind_order(a.kind), &a.name).cmp(&(
            &b.namespace,
            kind_order(b.kind),
            &b.name,
        ))
    });
    found
}

fn kind_order(kind: TargetKind) -> u8 {
    match kind {
        TargetKind::StatefulSet => 0,
        TargetKind::Deployment => 1,
        TargetKind::PersistentVolumeClaim => 2,
    }
}

/// The set as a workload when a member's claim is in `left` (taken out of it).
fn stateful_set(set: &StatefulSet, left: &mut BTreeSet<(String, String)>) -> Option<Workload> {
    let ns = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let spec = set.spec.as_ref()?;
    let start = (spec.ordinals.as_ref()).and_then(|o| o.start).unwrap_or(0);
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let templates: Vec<String> = (spec.volume_claim_templates.iter().flatten())
        .map(|t| t.name_any())
        .collect();
    let (mut moving, mut claims) = (Vec::new(), Vec::new());
    for t in &templates {
        let on_class: Vec<String> = (start..start + replicas)
            .map(|i| format!("{t}-{name}-{i}"))
            .filter(|c| left.remove(&(ns.clone(), c.clone())))
            .collect();
        if !on_class.is_empty() {
            moving.push(t.clone());
            claims.extend(on_class);
        }
    }
    if moving.is_empty() {
        return None;
    }
    let templates = if moving.len() == templates.len() {
        Vec::new()
    } else {
        moving
    };
    Some(Workload {
        namespace: ns,
        kind: TargetKind::StatefulSet,
        name,
        templates,
        claims,
    })
}

/// The Deployment as a workload when all the claims it mounts are in `left`, else each of its
/// claims in `left` as a claim target (all taken out of `left`).
fn deployment(d: &Deployment, left: &mut BTreeSet<(String, String)>) -> Vec<Workload> {
    let ns = d.namespace().unwrap_or_default();
    let mounted: Vec<String> = (d.spec.as_ref())
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect();
    let on_class: Vec<String> = (mounted.iter())
        .filter(|c| left.remove(&(ns.clone(), (*c).clone())))
        .cloned()
        .collect();
    if on_class.is_empty() {
        return Vec::new();
    }
    if on_class.len() == mounted.len() {
        return vec![Workload {
            namespace: ns,
            kind: TargetKind::Deployment,
            name: d.name_any(),
            templates: Vec::new(),
            claims: on_class,
        }];
    }
    (on_class.into_iter())
        .map(|claim| Workload {
            namespace: ns.clone(),
            kind: TargetKind::PersistentVolumeClaim,
            name: claim.clone(),
            templates: Vec::new(),
            claims: vec![claim],
        })
        .collect()
}

/// The short kind of a workload in a request's name and in the plan.
pub fn kind_tag(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::StatefulSet => "sts",
        TargetKind::Deployment => "deploy",
        TargetKind::PersistentVolumeClaim => "pvc",
    }
}

/// The request that moves `w` from class `from` to `to`: a `StorageClassChange`, engine
/// `Generic`, the defaults for everything else, labelled [`labels::FLEET_LABEL`].
pub fn request(w: &Workload, from: &str, to: &str, timeout: &str) -> StorageMigrationRequest {
    let (volume_claim_template, volume_claim_templates) = match w.templates.as_slice() {
        [one] => (Some(one.clone()), Vec::new()),
        many => (None, many.to_vec()),
    };
    let spec = StorageMigrationRequestSpec {
        type_: MigrationType::StorageClassChange,
        target: TargetRef {
            kind: w.kind,
            name: w.name.clone(),
        },
        volume_claim_template,
        volume_claim_templates,
        storage_class_change: Some(StorageClassChangeSpec {
            storage_class_name: to.to_string(),
        }),
        shrink: None,
        timeout: timeout.to_string(),
        old_pv_reclaim_policy: None,
        apply: Default::default(),
        copy: Default::default(),
        database: Default::default(),
        owner_paused: false,
        force_delete_on_lost_node: false,
    };
    let mut req = StorageMigrationRequest::new(
        &names::fleet_request_name(kind_tag(w.kind), &w.name, to),
        spec,
    );
    req.metadata = ObjectMeta {
        namespace: Some(w.namespace.clone()),
        labels: Some(BTreeMap::from([(
            labels::FLEET_LABEL.to_string(),
            names::fleet_label_value(from, to),
        )])),
        ..req.metadata
    };
    req
}

/// The heading of one workload in the plan: `ns kind name (claims) -> request`.
pub fn workload_line(w: &Workload, request: &str) -> String {
    let templates = if w.templates.is_empty() {
        String::new()
    } else {
        format!(", templates {}", w.templates.join(", "))
    };
    format!(
        "{}/{} {}{templates}: claims {}; request {request}",
        w.namespace,
        w.name,
        kind_name(w.kind),
        w.claims.join(", "),
    )
}

fn kind_name(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::StatefulSet => "StatefulSet",
        TargetKind::Deployment => "Deployment",
        TargetKind::PersistentVolumeClaim => "PersistentVolumeClaim",
    }
}

/// How one workload was judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Preflight accepts it: its members to move and their bytes (the claims' requests).
    Accepted { members: usize, bytes: i128 },
    /// Preflight denies it, with the reasons.
    Denied,
    /// Its request exists already (an earlier run's), left as it is.
    Requested,
}

/// The plan's closing line: how many workloads, members and bytes, how many denied, how many
/// requested already.
pub fn total_line(from: &str, to: &str, verdicts: &[Verdict]) -> String {
    let (mut accepted, mut members, mut bytes) = (0, 0, 0i128);
    let (mut denied, mut requested) = (0, 0);
    for v in verdicts {
        match v {
            Verdict::Accepted {
                members: m,
                bytes: b,
            } => {
                accepted += 1;
                members += m;
                bytes += b;
            }
            Verdict::Denied => denied += 1,
            Verdict::Requested => requested += 1,
        }
    }
    let mut line = format!(
        "{} workloads on StorageClass {from}: {accepted} would move to {to} ({members} members, \
         {} of claims), {denied} would be denied",
        verdicts.len(),
        crate::quantity::human(bytes),
    );
    if requested > 0 {
        line.push_str(&format!(", {requested} requested already"));
    }
    line
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
