//! The stash read back: the request's stash ConfigMap, found by its name, checked by its uid
//! label and decoded by `plan::stash::read_stash` (see `plan::stash` for where the stash lives
//! and for how long).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use tracing::warn;

use super::Cluster;
use super::error::{ClusterError, kube_err};
use crate::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::build;
use crate::plan::Stash;
use crate::plan::stash::read_stash;

impl Cluster {
    /// The request's stash: its ConfigMap `<request>-stash` (whatever the status says) and
    /// the manifests in it, decoded.
    pub(crate) async fn stash(
        &self,
        req: &StorageMigrationRequest,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<Stash, ClusterError> {
        let name = build::stash_config_map_name(&req.name_any());
        let cm = self
            .ns_api::<ConfigMap>(ns)
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get stash ConfigMap {name}")))?;
        let stash = read_stash(cm.as_ref(), req.uid().as_deref(), status);
        for (key, e) in &stash.errors {
            warn!(config_map = name, key, error = %e, "stash entry cannot be read");
        }
        Ok(stash)
    }
}
