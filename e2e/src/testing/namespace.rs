//! [`TestNamespace`]: a unique namespace per test, deleted on drop; YAML and fixture apply,
//! deletes.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
    PropagationPolicy,
};
use kube::discovery::Scope;
use kube::{Resource, ResourceExt};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use storage_migrator::api::StorageMigrationRequest;
use storage_migrator::labels;

use crate::testing::cluster::TestCluster;
use crate::testing::objects::{fixture_path, set_template_class};
use crate::testing::{ETCD_READY, FIELD_MANAGER, TestError};

/// A namespace owned by one test; deleted on drop, unless the test panicked and `E2E_KEEP=1`.
/// Dropped by a failed test, its requests first lose the operator's finalizer
/// ([`release_requests`]).
pub struct TestNamespace {
    pub name: String,
    pub cluster: TestCluster,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let keep = std::env::var("E2E_KEEP").is_ok_and(|v| v == "1");
        if std::thread::panicking() && keep {
            eprintln!(
                "E2E_KEEP=1: keeping namespace {} of the failed test",
                self.name
            );
            return;
        }
        // From a fresh runtime ([`super::from_drop`]), waiting for the request, not for the
        // namespace to be gone.
        let name = self.name.clone();
        let failed = std::thread::panicking();
        let deleted = super::from_drop(self.cluster.config.clone(), move |client| async move {
            release_requests(&client, &name, failed).await?;
            let api: Api<Namespace> = Api::all(client);
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        });
        match deleted {
            Ok(()) => info!(namespace = %self.name, "deleting test namespace"),
            Err(e) => warn!(namespace = %self.name, error = %e, "cannot delete test namespace"),
        }
    }
}

/// Takes the operator's finalizer off every request of the namespace `ns` of a test that ended
/// (`failed` or not). Its operator stopped with the test, so nothing would take it off: the
/// namespace would stay `Terminating` until an operator watching every namespace that a later
/// test or benchmark starts picked its requests up. A passing test's operator stops as soon as
/// the test has seen the final phase, often before it lifts the finalizer itself.
async fn release_requests(client: &kube::Client, ns: &str, failed: bool) -> Result<(), String> {
    let api: Api<StorageMigrationRequest> = Api::namespaced(client.clone(), ns);
    let requests = match api.list(&Default::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
        Err(e) => return Err(format!("cannot list the requests to release them: {e}")),
    };
    for r in requests {
        let kept: Vec<&String> = (r.finalizers().iter())
            .filter(|f| f.as_str() != labels::FINALIZER)
            .collect();
        if kept.len() == r.finalizers().len() {
            continue;
        }
        let patch = serde_json::json!({
            "metadata": {"finalizers": kept, "resourceVersion": r.resource_version()}
        });
        let name = r.name_any();
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) if failed => {
                warn!(namespace = %ns, request = %name, "the failed test's request released")
            }
            Ok(_) => info!(namespace = %ns, request = %name, "the test's request released"),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(format!("cannot release request {name}: {e}")),
        }
    }
    Ok(())
}

impl TestNamespace {
    pub fn client(&self) -> kube::Client {
        self.cluster.client.clone()
    }

    /// `claim → volume` of every claim of the namespace (panics when they cannot be listed:
    /// for tests).
    pub async fn claim_volumes(&self) -> std::collections::BTreeMap<String, String> {
        let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = self.api();
        let list = api
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("list the claims of {}: {e}", self.name));
        list.items
            .iter()
            .map(|c| {
                let volume = c.spec.as_ref().and_then(|s| s.volume_name.clone());
                (c.name_any(), volume.unwrap_or_default())
            })
            .collect()
    }

    /// A namespaced API in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client(), &self.name)
    }

    /// Server-side applies every document of a multi-document YAML into this namespace (any
    /// `metadata.namespace` in it is replaced); cluster-scoped objects are applied as they are.
    /// On Kubernetes 1.20, list entries must carry all their key fields (e.g. `protocol` of
    /// Service and container ports), else apply fails with HTTP 500.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<Vec<DynamicObject>, TestError> {
        self.apply_yaml_with(yaml, |_| {}).await
    }

    /// [`Self::apply_yaml`], with `edit` applied to each object before it is sent.
    pub async fn apply_yaml_with(
        &self,
        yaml: &str,
        edit: impl Fn(&mut DynamicObject),
    ) -> Result<Vec<DynamicObject>, TestError> {
        let mut applied = Vec::new();
        for (index, doc) in serde_norway::Deserializer::from_str(yaml).enumerate() {
            let value = serde_norway::Value::deserialize(doc)?;
            if value.is_null() {
                continue;
            }
            let mut obj: DynamicObject = serde_norway::from_value(value)?;
            edit(&mut obj);
            let types = obj.types.clone().ok_or(TestError::Manifest { index })?;
            let name = obj
                .metadata
                .name
                .clone()
                .ok_or(TestError::Manifest { index })?;
            let gvk =
                GroupVersionKind::try_from(&types).map_err(|_| TestError::Manifest { index })?;
            let (resource, caps) = kube::discovery::pinned_kind(&self.client(), &gvk).await?;
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => {
                    obj.metadata.namespace = Some(self.name.clone());
                    Api::namespaced_with(self.client(), &self.name, &resource)
                }
                Scope::Cluster => Api::all_with(self.client(), &resource),
            };
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let result = api.patch(&name, &params, &Patch::Apply(&obj)).await?;
            info!(namespace = %self.name, kind = %gvk.kind, %name, "applied");
            applied.push(result);
        }
        Ok(applied)
    }

    /// Applies `e2e/fixtures/<file>`. Claim templates of StatefulSets that name the class
    /// `standard` get the cluster's [`TestCluster::storage_class`] instead.
    pub async fn apply_fixture(&self, file: &str) -> Result<Vec<DynamicObject>, TestError> {
        let path = fixture_path(file);
        let yaml = std::fs::read_to_string(&path).map_err(|source| TestError::Fixture {
            path: path.clone(),
            source,
        })?;
        let class = self.cluster.storage_class.clone();
        self.apply_yaml_with(&yaml, |obj| set_template_class(obj, "standard", &class))
            .await
    }

    /// Applies the etcd fixture (`e2e/fixtures/etcd.yaml`, claims on the cluster's class) and
    /// waits until its StatefulSet `etcd` is 3/3 Ready.
    pub async fn apply_etcd(&self) -> Result<StatefulSet, TestError> {
        self.apply_etcd_with(|_| {}).await
    }

    /// Creates `set` (e.g. a [`crate::testing::one_member_set`]) and waits until its replicas
    /// are Ready (at most two minutes).
    pub async fn create_statefulset_ready(
        &self,
        set: &StatefulSet,
    ) -> Result<StatefulSet, TestError> {
        self.api::<StatefulSet>()
            .create(&PostParams::default(), set)
            .await?;
        let name = set.name_any();
        let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        self.wait_statefulset_ready(&name, replicas, Duration::from_secs(120))
            .await
    }

    /// [`Self::apply_etcd`], with `edit` applied to each object of the fixture (after the
    /// class) before it is sent: a variant of the fixture for one test.
    pub async fn apply_etcd_with(
        &self,
        edit: impl Fn(&mut DynamicObject),
    ) -> Result<StatefulSet, TestError> {
        let path = fixture_path("etcd.yaml");
        let yaml = std::fs::read_to_string(&path).map_err(|source| TestError::Fixture {
            path: path.clone(),
            source,
        })?;
        let class = self.cluster.storage_class.clone();
        self.apply_yaml_with(&yaml, |obj| {
            set_template_class(obj, "standard", &class);
            edit(obj);
        })
        .await?;
        self.wait_statefulset_ready("etcd", 3, ETCD_READY).await
    }

    /// Keeps the namespace: disarms the delete-on-drop and returns its name.
    pub fn keep(self) -> String {
        let this = std::mem::ManuallyDrop::new(self);
        this.name.clone()
    }

    /// Deletes the namespace and waits (bounded) until it is gone, so that what it held (pods,
    /// claims, volumes of a `Delete` class) is released before the caller goes on.
    pub async fn delete_and_wait(self, timeout: Duration) -> Result<(), TestError> {
        let api: Api<Namespace> = Api::all(self.client());
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let Some(uid) = api.get_opt(&self.name).await?.and_then(|ns| ns.uid()) else {
            return Ok(());
        };
        match api.delete(&self.name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        // Deleted: no second delete on drop.
        let this = std::mem::ManuallyDrop::new(self);
        let cond = kube::runtime::wait::conditions::is_deleted::<Namespace>(&uid);
        let describe = |n: &Namespace| {
            let st = n.status.clone().unwrap_or_default();
            let conditions: Vec<String> = st
                .conditions
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    format!(
                        "{}={} {}",
                        c.type_,
                        c.status,
                        c.message.clone().unwrap_or_default()
                    )
                })
                .collect();
            format!(
                "phase={} conditions={conditions:?}",
                st.phase.unwrap_or_default()
            )
        };
        let name = this.name.clone();
        this.wait_for(api, &name, "namespace gone", timeout, cond, describe)
            .await
            .map(|_| ())
    }

    /// Deletes an object with the given propagation (Jobs: use Background, the API default for
    /// batch/v1 orphans their pods).
    pub async fn delete<K>(
        &self,
        api: &Api<K>,
        name: &str,
        propagation: PropagationPolicy,
    ) -> Result<(), TestError>
    where
        K: Clone + Debug + DeserializeOwned + Resource,
    {
        let dp = DeleteParams {
            propagation_policy: Some(propagation),
            ..Default::default()
        };
        api.delete(name, &dp).await?;
        Ok(())
    }
}
