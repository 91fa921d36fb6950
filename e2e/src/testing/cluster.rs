//! [`TestCluster`]: the client of the cluster under test and the scenario settings.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::info;

use crate::testing::namespace::TestNamespace;
use crate::testing::{
    DEFAULT_MOVER_IMAGE, FIELD_MANAGER, TestError, namespace_name, random_suffix, unexpected,
};

/// The cluster under test and the scenario settings.
#[derive(Clone)]
pub struct TestCluster {
    pub client: kube::Client,
    pub(super) config: kube::Config,
    /// Immediate-binding class (`E2E_STORAGE_CLASS`, default `standard`).
    pub storage_class: String,
    /// WaitForFirstConsumer class (`E2E_WFFC_STORAGE_CLASS`, default `fast`).
    pub wffc_storage_class: String,
    /// Image of one-off mover pods (`E2E_MOVER_IMAGE`, default [`DEFAULT_MOVER_IMAGE`]).
    pub mover_image: String,
}

impl TestCluster {
    /// Connects to the cluster in `KUBECONFIG` (fails clearly when it is unset).
    pub async fn from_env() -> Result<Self, TestError> {
        if std::env::var_os("KUBECONFIG").is_none_or(|v| v.is_empty()) {
            return Err(TestError::NoKubeconfig);
        }
        let kubeconfig = Kubeconfig::from_env()?.ok_or(TestError::NoKubeconfig)?;
        Self::from_kubeconfig(kubeconfig).await
    }

    /// Connects to the cluster of one kubeconfig file (settings still from the environment).
    pub async fn from_kubeconfig_file(path: &std::path::Path) -> Result<Self, TestError> {
        Self::from_kubeconfig(Kubeconfig::read_from(path)?).await
    }

    async fn from_kubeconfig(kubeconfig: Kubeconfig) -> Result<Self, TestError> {
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let client = kube::Client::try_from(config.clone())?;
        let env = |key: &str, default: &str| {
            std::env::var(key)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        Ok(Self {
            client,
            config,
            storage_class: env("E2E_STORAGE_CLASS", "standard"),
            wffc_storage_class: env("E2E_WFFC_STORAGE_CLASS", "fast"),
            mover_image: env("E2E_MOVER_IMAGE", DEFAULT_MOVER_IMAGE),
        })
    }

    /// The local cluster's state when `KUBECONFIG` is a `localcluster` kubeconfig
    /// (`DIR/kubeconfig` next to `DIR/cluster.json`); `None` for any other cluster. Lets a test
    /// add host-level checks (images, mounts) on the local cluster only.
    pub fn local_state() -> Option<crate::state::ClusterState> {
        let kubeconfig = std::env::var_os("KUBECONFIG")?;
        let dir = std::path::Path::new(&kubeconfig).parent()?;
        crate::state::ClusterState::load(dir).ok()
    }

    /// Creates a fresh namespace `e2e-<test>-<random>` for one test.
    pub async fn namespace(&self, test: &str) -> Result<TestNamespace, TestError> {
        let name = namespace_name(test, &random_suffix());
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_string(),
                    FIELD_MANAGER.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns).await?;
        info!(namespace = %name, "created test namespace");
        Ok(TestNamespace {
            name,
            cluster: self.clone(),
        })
    }

    /// Names of the nodes pods can be scheduled to (not cordoned, no NoSchedule/NoExecute
    /// taint), sorted.
    pub async fn schedulable_nodes(&self) -> Result<Vec<String>, TestError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut names: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|n| {
                let spec = n.spec.as_ref();
                let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
                let tainted = spec
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.effect != "PreferNoSchedule"));
                !cordoned && !tainted
            })
            .map(|n| n.name_any())
            .collect();
        names.sort();
        Ok(names)
    }

    /// The PV bound to a claim.
    pub async fn pv_of(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<PersistentVolume, TestError> {
        let name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .ok_or_else(|| unexpected(format!("claim {}", claim.name_any()), "not bound"))?;
        Ok(Api::<PersistentVolume>::all(self.client.clone())
            .get(&name)
            .await?)
    }
}
