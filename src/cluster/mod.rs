//! The only code that talks to the API server: gather an [`Observed`](crate::plan::Observed)
//! snapshot for one request ([`gather`]), and carry out the planner's
//! [`Action`](crate::plan::Action)s ([`execute`]) as each one's contract says.
//!
//! - [`gather`]: one function per kind of thing gathered; [`stash`]: the stash read back;
//!   [`budgets`]: the PodDisruptionBudgets (`policy/v1`);
//! - [`execute`]: one function per action;
//! - [`raw`]: GET/LIST/CREATE keeping the raw JSON the API server returned;
//! - [`replay`]: one round's answers, replayed to the round that follows a status write;
//! - [`read_cache`]: reads of watched kinds kept from round to round while their watches see
//!   no change; [`volume_cache`]: the volumes read by name, the same way;
//! - [`watch_retry`]: how the operator's watches go on after a failure;
//! - [`error`]: [`ClusterError`] and whether retrying it can help;
//! - [`database`]: the database clients (etcd) and the Secrets they need, driven from here.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

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
pub mod read_cache;
pub mod replay;
pub mod stash;
pub mod volume_cache;
pub mod watch_retry;

#[cfg(test)]
pub(crate) mod mock;
#[cfg(test)]
mod tests;

pub use database::{Engine, EngineError};
pub use error::{ClusterError, Retry};
pub use read_cache::ReadCache;
pub use volume_cache::VolumeCache;

/// How long the [`ReadCache`] and the [`VolumeCache`] use a kept read at most without a change
/// seen. Both are voided at once by a failure or a new list of the watch that feeds them (and
/// keep nothing from a failure until it reports again), so this bounds only what a watch that lags without failing could hide; Kubernetes' own
/// controllers trust their watches with no such bound. A decision that acts on more than the
/// status, events and creates reads what it acts on now (`controller::decided`), whatever is
/// kept. Longer than `--stable-window`'s default (10 s), so waiting it out does not make every
/// kept read go at once.
pub const KEPT_MAX_AGE: Duration = Duration::from_secs(30);

/// How long each watch call of the operator lasts before it is made again (`timeoutSeconds`):
/// 9 minutes, within the 5 to 10 that Kubernetes' own informers pick, where the client's
/// default (290 s) made every watch one request each 5 minutes even in an idle operator. The
/// API server sends a bookmark on each watch about once a minute, and a watch that stays silent
/// 5 s past this is taken for a dead connection and made again.
pub const WATCH_TIMEOUT_SECS: u32 = 540;

/// Everything the cluster layer needs for one request.
pub struct Cluster {
    pub client: Client,
    pub recorder: Recorder,
    /// Where volumes read by name are kept between rounds; `None`: each read is a GET.
    volumes: Option<Arc<VolumeCache>>,
    /// The volumes read now whatever the cache keeps of them.
    volumes_now: Arc<BTreeSet<String>>,
    /// Where the reads of watched kinds are kept between rounds, with the client `client`
    /// wraps (see [`Cluster::with_read_cache`]); `None`: every read goes to the API server.
    reads: Option<(Arc<ReadCache>, Client)>,
}

impl Cluster {
    pub fn new(client: Client, recorder: Recorder) -> Self {
        Self {
            client,
            recorder,
            volumes: None,
            volumes_now: Arc::default(),
            reads: None,
        }
    }

    /// Keeps the reads of watched kinds in `cache` ([`ReadCache`]): this cluster's client reads
    /// now (and counts its writes as changes); [`Cluster::kept_reads`] answers from `cache`.
    pub fn with_read_cache(mut self, cache: Arc<ReadCache>) -> Self {
        let plain = self.client.clone();
        self.client = cache.client(plain.clone(), read_cache::Use::ReadNow);
        self.reads = Some((cache, plain));
        self
    }

    /// A client that answers the reads of watched kinds but those of `now` from the
    /// [`ReadCache`] when it keeps them; this cluster's client when there is no cache.
    pub fn kept_reads(&self, now: &BTreeSet<read_cache::Watched>) -> Client {
        match &self.reads {
            Some((cache, plain)) => {
                cache.client(plain.clone(), read_cache::Use::KeptBut(now.clone()))
            }
            None => self.client.clone(),
        }
    }

    /// Reads volumes through `cache` ([`VolumeCache`]).
    pub fn with_volume_cache(mut self, cache: Arc<VolumeCache>) -> Self {
        self.volumes = Some(cache);
        self
    }

    /// A client that reads now, past the [`ReadCache`] and the replayed answers this cluster may
    /// read through (and keeps what it read in the cache).
    pub fn read_now(&self) -> Client {
        match &self.reads {
            Some((cache, plain)) => cache.client(plain.clone(), read_cache::Use::ReadNow),
            None => self.client.clone(),
        }
    }

    /// Whether volumes may come from the cache rather than be read now.
    pub fn caches_volumes(&self) -> bool {
        self.volumes.is_some()
    }

    /// The same cluster, reading `volumes` now whatever the cache keeps of them.
    pub fn reading_volumes_now(self, volumes: BTreeSet<String>) -> Self {
        Self {
            volumes_now: Arc::new(volumes),
            ..self
        }
    }

    /// The same cluster (its recorder, its caches), reading through `client` (a [`replay`]
    /// client).
    pub fn reading_through(&self, client: Client) -> Self {
        Self {
            client,
            recorder: self.recorder.clone(),
            volumes: self.volumes.clone(),
            volumes_now: self.volumes_now.clone(),
            reads: self.reads.clone(),
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
