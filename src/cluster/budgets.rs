//! The PodDisruptionBudgets of a request's namespace, read through `policy/v1` (served since
//! Kubernetes 1.21, the only version since 1.25; the operator supports 1.30 and newer). Budgets
//! are read only in Preflight (`apply: IfReady`) and while migrating (the gate before a member
//! stops, see `plan::disruption`).

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;

use super::Cluster;
use super::error::{ClusterError, kube_err};
use crate::api::{Stage, StorageMigrationRequestStatus};
use crate::plan::disruption::Budget;

impl Cluster {
    /// The budgets of `ns` in Preflight and while migrating (none in other stages).
    pub(super) async fn budgets(
        &self,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<Vec<Budget>, ClusterError> {
        if status.phase.is_final() || !matches!(status.stage, Stage::Preflight | Stage::Migrating) {
            return Ok(Vec::new());
        }
        let list = self
            .ns_api::<PodDisruptionBudget>(ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list PodDisruptionBudgets"))?;
        Ok(list.into_iter().map(Budget::from_budget).collect())
    }
}
