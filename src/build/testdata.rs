//! Realistic inputs for the builders' tests: the three-member etcd StatefulSet (template `data`,
//! class `standard`, 1Gi) as the API server returns it, one member's pod and claim, and a request
//! with its plan.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use serde_json::{Value, json};

use crate::api::{Plan, PlannedMember, StorageMigrationRequest};
use crate::image::ImageRef;

use super::{Manifest, temp_claim_name};

/// The typed view of [`statefulset_manifest`].
pub fn statefulset() -> StatefulSet {
    statefulset_manifest().typed().clone()
}

/// The StatefulSet's raw JSON as the API server returns it.
pub fn statefulset_manifest() -> Manifest<StatefulSet> {
    Manifest::from_raw(serde_norway::from_str(include_str!("testdata/statefulset.yaml")).unwrap())
        .unwrap()
}

/// Member etcd-1's raw JSON as the API server returns it.
pub fn pod_manifest() -> Manifest<Pod> {
    Manifest::from_raw(serde_norway::from_str(include_str!("testdata/pod.yaml")).unwrap()).unwrap()
}

/// Adds to the pod spec at `pointer` (`/spec` of a pod, `/spec/template/spec` of a set) fields
/// that no k8s-openapi struct knows, as a newer API server returns them: one in the spec, one in
/// its first container, one in that container's first volume mount (if any).
pub fn add_future_fields(raw: &mut Value, pointer: &str) {
    let spec = raw.pointer_mut(pointer).unwrap().as_object_mut().unwrap();
    spec.insert("someFutureField".into(), json!({"x": 1}));
    let container = spec["containers"][0].as_object_mut().unwrap();
    container.insert("futureContainerField".into(), json!(["a", {"b": true}]));
    if let Some(mount) = container
        .get_mut("volumeMounts")
        .and_then(|m| m.get_mut(0))
        .and_then(Value::as_object_mut)
    {
        mount.insert("futureMountField".into(), json!("y"));
    }
}

/// `manifest` with [`add_future_fields`] at `pointer`.
pub fn with_future_fields<K>(manifest: &Manifest<K>, pointer: &str) -> Manifest<K>
where
    K: k8s_openapi::Resource + serde::de::DeserializeOwned,
{
    let mut raw = manifest.raw().clone();
    add_future_fields(&mut raw, pointer);
    Manifest::from_raw(raw).unwrap()
}

pub fn claim() -> PersistentVolumeClaim {
    serde_norway::from_str(include_str!("testdata/claim.yaml")).unwrap()
}

/// The operator's image in the builders' tests (not the real default, so that the snapshots do
/// not change with the version).
pub const IMAGE: &str = "registry.test/storage-migrator:test";

pub fn image() -> ImageRef {
    ImageRef::parse(IMAGE).unwrap()
}

/// The request, its plan's temporary claim names computed as the planner would.
pub fn request() -> StorageMigrationRequest {
    let mut req: StorageMigrationRequest =
        serde_norway::from_str(include_str!("testdata/request.yaml")).unwrap();
    let name = req.metadata.name.clone().unwrap();
    let plan = req.status.as_mut().unwrap().plan.as_mut().unwrap();
    for m in &mut plan.members {
        m.temp_claim = temp_claim_name(&name, &m.claim);
    }
    req
}

pub fn plan() -> Plan {
    request().status.unwrap().plan.unwrap()
}

/// Member `etcd-1` (on `node-b`), the one `pod()` and `claim()` belong to.
pub fn member() -> PlannedMember {
    plan().members.into_iter().nth(1).unwrap()
}
