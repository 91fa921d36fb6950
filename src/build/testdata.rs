//! Realistic inputs for the builders' tests: the three-member etcd StatefulSet (template `data`,
//! class `standard`, 1Gi) as the API server returns it, one member's pod and claim, and a request
//! with its plan.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use crate::api::{Plan, PlannedMember, StorageMigrationRequest};

use super::temp_claim_name;

pub fn statefulset() -> StatefulSet {
    serde_norway::from_str(include_str!("testdata/statefulset.yaml")).unwrap()
}

pub fn pod() -> Pod {
    serde_norway::from_str(include_str!("testdata/pod.yaml")).unwrap()
}

pub fn claim() -> PersistentVolumeClaim {
    serde_norway::from_str(include_str!("testdata/claim.yaml")).unwrap()
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
