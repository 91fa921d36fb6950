//! The PodDisruptionBudgets of a request's namespace, read through `policy/v1` (served since
//! Kubernetes 1.21, the only version since 1.25; the operator supports 1.30 and newer). Budgets
//! are read only in Preflight (`apply: IfReady`) and while the member in flight is about to stop
//! (the gate before its pod is deleted, see `plan::disruption`; `plan::observe::reads_budgets`).

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;

use super::Cluster;
use super::error::{ClusterError, kube_err};
use crate::api::StorageMigrationRequestStatus;
use crate::plan::disruption::Budget;
use crate::plan::observe::reads_budgets;

impl Cluster {
    /// The budgets of `ns` when the planner looks at them ([`reads_budgets`]); none otherwise.
    pub(super) async fn budgets(
        &self,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<Vec<Budget>, ClusterError> {
        if !reads_budgets(status) {
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
