//! The only code that talks to the API server: gather an [`Observed`](crate::plan::Observed)
//! snapshot for one request ([`gather`]), and carry out the planner's
//! [`Action`](crate::plan::Action)s ([`execute`]) as each one's contract says.
//!
//! - [`gather`]: one function per kind of thing gathered; [`stash`]: the stash read back;
//!   [`budgets`]: the PodDisruptionBudgets (`policy/v1`);
//! - [`execute`]: one function per action;
//! - [`raw`]: GET/LIST/CREATE keeping the raw JSON the API server returned;
//! - [`replay`]: one round's answers, replayed to the round that follows a status write;
//! - [`error`]: [`ClusterError`] and whether retrying it can help;
//! - [`database`]: the database clients (etcd) and the Secrets they need, driven from here.

use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::{Client, Resource, ResourceExt};

use crate::api::StorageMigrationRequest;
use crate::plan::observe::effective_spec;

pub mod bodies;
pub mod budgets;
pub mod database;
pub mod error;
pub mod execute;
pub mod gather;
pub mod raw;
pub mod replay;
pub mod stash;
pub mod volume_cache;

#[cfg(test)]
pub(crate) mod mock;
#[cfg(test)]
mod tests;

pub use database::{Engine, EngineError};
pub use error::{ClusterError, Retry};
pub use volume_cache::VolumeCache;

/// Everything the cluster layer needs for one request.
pub struct Cluster {
    pub client: Client,
    pub recorder: Recorder,
    /// Where volumes read by name are kept between rounds; `None`: each read is a GET.
    volumes: Option<Arc<VolumeCache>>,
}

impl Cluster {
    pub fn new(client: Client, recorder: Recorder) -> Self {
        Self {
            client,
            recorder,
            volumes: None,
        }
    }

    /// Reads volumes through `cache` ([`VolumeCache`]).
    pub fn with_volume_cache(mut self, cache: Arc<VolumeCache>) -> Self {
        self.volumes = Some(cache);
        self
    }

    /// Whether volumes may come from the cache rather than be read now.
    pub fn caches_volumes(&self) -> bool {
        self.volumes.is_some()
    }

    /// The same cluster, reading every volume now.
    pub fn uncached(&self) -> Self {
        Self::new(self.client.clone(), self.recorder.clone())
    }

    /// The same cluster (its recorder, its volume cache), reading through `client` (a
    /// [`replay`] client).
    pub fn reading_through(&self, client: Client) -> Self {
        Self {
            client,
            recorder: self.recorder.clone(),
            volumes: self.volumes.clone(),
        }
    }

    fn ns_api<K>(&self, ns: &str) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The request as stored now (`None` once it is gone).
    pub async fn fetch(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<StorageMigrationRequest>, ClusterError> {
        self.ns_api::<StorageMigrationRequest>(ns)
            .get_opt(name)
            .await
            .map_err(error::kube_err(format!("get request {ns}/{name}")))
    }

    /// The database engine of a request (from its accepted spec).
    pub async fn engine(&self, req: &StorageMigrationRequest) -> Result<Engine, ClusterError> {
        let ns = namespace(req)?;
        let spec = effective_spec(req);
        Ok(Engine::from_spec(&self.client, &ns, &spec.database).await?)
    }
}

/// The request's namespace (a request always has one).
fn namespace(req: &StorageMigrationRequest) -> Result<String, ClusterError> {
    req.namespace()
        .ok_or_else(|| ClusterError::NoNamespace(req.name_any()))
}
