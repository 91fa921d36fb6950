//! The PodDisruptionBudgets of a request's namespace, read through the API version the cluster
//! serves (`policy/v1`, else `policy/v1beta1`, else none), found by discovery once per operator
//! process and kept in a [`BudgetApiCache`] shared by every reconcile. Budgets are read only
//! in Preflight (`apply: IfReady`) and while migrating (the gate before a member stops, see
//! `plan::disruption`).

use std::sync::{Arc, Mutex, MutexGuard};

use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

use super::Cluster;
use super::error::{ClusterError, kube_err};
use crate::api::{Stage, StorageMigrationRequestStatus};
use crate::plan::disruption::{Budget, BudgetApi};

/// The version PodDisruptionBudgets are read through: `None` until discovered, then
/// `Some(None)` for a cluster serving neither version.
pub type BudgetApiCache = Arc<Mutex<Option<Option<BudgetApi>>>>;

fn lock(cache: &BudgetApiCache) -> MutexGuard<'_, Option<Option<BudgetApi>>> {
    cache.lock().unwrap_or_else(|p| p.into_inner())
}

/// The API resource of PodDisruptionBudgets in `api`'s version.
fn resource(api: BudgetApi) -> ApiResource {
    ApiResource {
        group: BudgetApi::GROUP.to_string(),
        version: api.version().to_string(),
        api_version: format!("{}/{}", BudgetApi::GROUP, api.version()),
        kind: BudgetApi::KIND.to_string(),
        plural: BudgetApi::PLURAL.to_string(),
    }
}

impl Cluster {
    /// The budgets of `ns` in Preflight and while migrating (none in other stages). A cluster that stopped
    /// serving the cached version (upgraded under the operator: a 404) is asked again once.
    pub(super) async fn budgets(
        &self,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<Vec<Budget>, ClusterError> {
        if status.phase.is_final() || !matches!(status.stage, Stage::Preflight | Stage::Migrating) {
            return Ok(Vec::new());
        }
        let mut retried = false;
        loop {
            let Some(api) = self.budget_api().await? else {
                return Ok(Vec::new());
            };
            let list =
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource(api))
                    .list(&ListParams::default())
                    .await;
            match list {
                Ok(list) => {
                    return Ok(list
                        .into_iter()
                        .map(|o| {
                            Budget::from_object(o.name_any(), o.metadata.generation, &o.data, api)
                        })
                        .collect());
                }
                Err(kube::Error::Api(s)) if s.code == 404 && !retried => {
                    *lock(&self.budget_api) = None;
                    retried = true;
                }
                Err(e) => return Err(kube_err("list PodDisruptionBudgets")(e)),
            }
        }
    }

    /// The version to read budgets through: from the cache, else by discovery (the versions of
    /// the `policy` group), then cached.
    async fn budget_api(&self) -> Result<Option<BudgetApi>, ClusterError> {
        if let Some(known) = *lock(&self.budget_api) {
            return Ok(known);
        }
        let groups = self
            .client
            .list_api_groups()
            .await
            .map_err(kube_err("discover the API groups (PodDisruptionBudgets)"))?;
        let api = BudgetApi::choose(
            groups
                .groups
                .iter()
                .filter(|g| g.name == BudgetApi::GROUP)
                .flat_map(|g| g.versions.iter().map(|v| v.version.as_str())),
        );
        tracing::info!(version = ?api.map(BudgetApi::version), "PodDisruptionBudget API");
        *lock(&self.budget_api) = Some(api);
        Ok(api)
    }
}
