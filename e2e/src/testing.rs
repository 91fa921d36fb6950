//! Helpers for end-to-end scenarios. They work against any cluster `KUBECONFIG` points at (the
//! local cluster from `localcluster up`, kind, a staging cluster): storage class names and the
//! mover image come from the environment.
//!
//! - [`TestCluster`]: the client and the scenario settings.
//! - [`TestNamespace`]: a unique namespace per test, deleted on drop; YAML apply, waits, claims,
//!   one-off mover pods and Jobs.
//! - [`etcd`]: one etcd client per member endpoint, member list, leader, put/get.
//! - [`operator`]: the operator as a child process, the CRD, creating and awaiting requests.
//!
//! Every wait is a watch bounded by a timeout; a timeout error says what was awaited and the
//! object's last state.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Event as CoreEvent, Namespace, Node, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec,
    Volume, VolumeMount, VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, LogParams, Patch, PatchParams,
    PostParams, PropagationPolicy,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope;
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

/// Field manager of every server-side apply done by the tests.
pub const FIELD_MANAGER: &str = "storage-migrator-e2e";
/// Default mover image (the local cluster's agent runs it as the host's rsync and sh).
pub const DEFAULT_MOVER_IMAGE: &str = "storage-migrator-mover:latest";

#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("KUBECONFIG is not set: set KUBECONFIG to a cluster, e.g. from `localcluster up`")]
    NoKubeconfig,
    #[error("cannot load KUBECONFIG: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("invalid YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
    #[error("manifest document {index} has no apiVersion/kind or name")]
    Manifest { index: usize },
    #[error("cannot read fixture {path}: {source}")]
    Fixture {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("timed out after {waited:?} waiting for {what}; last state: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
    #[error("watch for {what} failed: {detail}")]
    Watch { what: String, detail: String },
    #[error("{what}: {detail}")]
    Unexpected { what: String, detail: String },
    #[error("etcd request to {endpoint} failed: {source}")]
    Etcd {
        endpoint: String,
        source: etcd_client::Error,
    },
}

fn unexpected(what: impl Into<String>, detail: impl Into<String>) -> TestError {
    TestError::Unexpected {
        what: what.into(),
        detail: detail.into(),
    }
}

/// Installs a test-friendly tracing subscriber once (`RUST_LOG` filters, default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// How long the etcd fixture may take to reach 3/3 Ready.
pub const ETCD_READY: Duration = Duration::from_secs(300);

/// The start of every scenario: tracing, the cluster `KUBECONFIG` points at, and a fresh
/// namespace for `test`. Panics with a clear message when the cluster cannot be reached.
pub async fn scenario(test: &str) -> (TestCluster, TestNamespace) {
    init_tracing();
    let cluster = TestCluster::from_env()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the cluster under test: {e}"));
    let ns = cluster
        .namespace(test)
        .await
        .unwrap_or_else(|e| panic!("cannot create the namespace of {test}: {e}"));
    (cluster, ns)
}

/// A random 6-hex-digit suffix (from std's randomly seeded hasher; no crate needed).
pub fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:06x}", h.finish() & 0xff_ffff)
}

/// `e2e-<test>-<suffix>`, the test name reduced to a valid DNS label.
pub fn namespace_name(test: &str, suffix: &str) -> String {
    let mut base: String = test
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while base.contains("--") {
        base = base.replace("--", "-");
    }
    let base = base.trim_matches('-');
    // 63 max: "e2e-" (4) + base + "-" (1) + suffix.
    let room = 63usize.saturating_sub(5 + suffix.len());
    let base: String = base.chars().take(room).collect();
    let base = base.trim_end_matches('-');
    if base.is_empty() {
        format!("e2e-{suffix}")
    } else {
        format!("e2e-{base}-{suffix}")
    }
}

/// The cluster under test and the scenario settings.
#[derive(Clone)]
pub struct TestCluster {
    pub client: kube::Client,
    config: kube::Config,
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

/// A namespace owned by one test; deleted on drop, unless the test panicked and `E2E_KEEP=1`.
pub struct TestNamespace {
    pub name: String,
    pub cluster: TestCluster,
}

/// A claim mounted into a mover pod.
#[derive(Debug, Clone)]
pub struct ClaimMount {
    pub claim: String,
    pub mount_path: String,
    pub read_only: bool,
}

impl ClaimMount {
    pub fn new(claim: &str, mount_path: &str) -> Self {
        Self {
            claim: claim.to_string(),
            mount_path: mount_path.to_string(),
            read_only: false,
        }
    }
}

/// A one-off mover container: the mover image running `argv`, optionally pinned to a node.
#[derive(Debug, Clone)]
pub struct MoverSpec {
    pub name: String,
    pub argv: Vec<String>,
    /// Pin with required node affinity (`metadata.name In [node]`), never `spec.nodeName`:
    /// the scheduler must run so that WaitForFirstConsumer claims get a node.
    pub node: Option<String>,
    pub mounts: Vec<ClaimMount>,
}

impl MoverSpec {
    /// `sh -c SCRIPT` in the mover image.
    pub fn shell(name: &str, script: &str) -> Self {
        Self {
            name: name.to_string(),
            argv: vec!["sh".into(), "-c".into(), script.to_string()],
            node: None,
            mounts: Vec::new(),
        }
    }
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }
    pub fn mount(mut self, claim: &str, path: &str) -> Self {
        self.mounts.push(ClaimMount::new(claim, path));
        self
    }
}

/// How a one-off pod ended.
#[derive(Debug, Clone)]
pub struct PodOutcome {
    pub pod: String,
    pub node: Option<String>,
    /// `Succeeded` or `Failed`.
    pub phase: String,
    pub exit_code: Option<i32>,
    /// The container's termination message (with `FallbackToLogsOnError`, the log tail of a
    /// failed container).
    pub message: String,
    /// The container's log, or a note why it could not be read.
    pub logs: String,
}

impl PodOutcome {
    pub fn succeeded(&self) -> bool {
        self.phase == "Succeeded" && self.exit_code == Some(0)
    }
    /// Termination message and logs together, for assertions on output.
    pub fn output(&self) -> String {
        format!("{}\n{}", self.message, self.logs)
    }
}

/// How a Job ended, with its (last) pod.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub job: String,
    pub complete: bool,
    pub pod: Option<PodOutcome>,
}

/// The pod spec of a one-off mover container (restartPolicy Never).
pub fn mover_pod_spec(image: &str, spec: &MoverSpec) -> PodSpec {
    let volumes: Vec<Volume> = spec
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| Volume {
            name: format!("vol{i}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: m.claim.clone(),
                read_only: Some(m.read_only),
            }),
            ..Default::default()
        })
        .collect();
    let mounts: Vec<VolumeMount> = spec
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| VolumeMount {
            name: format!("vol{i}"),
            mount_path: m.mount_path.clone(),
            read_only: Some(m.read_only),
            ..Default::default()
        })
        .collect();
    let affinity = spec.node.as_ref().map(|node| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.clone()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    PodSpec {
        restart_policy: Some("Never".into()),
        affinity,
        termination_grace_period_seconds: Some(5),
        containers: vec![Container {
            name: "mover".into(),
            image: Some(image.to_string()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(spec.argv.clone()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            volume_mounts: (!mounts.is_empty()).then_some(mounts),
            ..Default::default()
        }],
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..Default::default()
    }
}

/// A claim of `size` on `class`.
pub fn claim_manifest(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.to_string()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// Path of a file in `e2e/fixtures/`.
pub fn fixture_path(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(file)
}

/// In a StatefulSet, replaces the class `from` of its claim templates by `to`.
pub fn set_template_class(obj: &mut DynamicObject, from: &str, to: &str) {
    let is_sts = obj.types.as_ref().is_some_and(|t| t.kind == "StatefulSet");
    if !is_sts || from == to {
        return;
    }
    let templates = obj
        .data
        .get_mut("spec")
        .and_then(|s| s.get_mut("volumeClaimTemplates"))
        .and_then(|t| t.as_array_mut());
    for t in templates.into_iter().flatten() {
        if let Some(class) = t
            .get_mut("spec")
            .and_then(|s| s.get_mut("storageClassName"))
            && class.as_str() == Some(from)
        {
            *class = serde_json::Value::String(to.to_string());
        }
    }
}

/// Whether `node` satisfies a PV's required node affinity (terms ORed, requirements ANDed;
/// operators In, NotIn, Exists, DoesNotExist on labels and on the field `metadata.name`).
pub fn node_satisfies(affinity: &VolumeNodeAffinity, node: &Node) -> bool {
    let Some(required) = affinity.required.as_ref() else {
        return true;
    };
    let labels = node.labels();
    let name = node.name_any();
    let matches = |req: &NodeSelectorRequirement, value: Option<&str>| {
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
            "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    };
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs
                .iter()
                .all(|r| matches(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .iter()
                .all(|r| matches(r, (r.key == "metadata.name").then_some(name.as_str())))
    })
}

/// One line per interesting fact of a pod's state, for failure messages.
pub fn describe_pod(pod: &Pod) -> String {
    let Some(status) = pod.status.as_ref() else {
        return "no status".into();
    };
    let mut out = format!(
        "phase={} node={}",
        status.phase.as_deref().unwrap_or("?"),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("<unscheduled>")
    );
    for c in status.conditions.iter().flatten() {
        out.push_str(&format!(" {}={}", c.type_, c.status));
        if let Some(m) = &c.message {
            out.push_str(&format!("({m})"));
        }
    }
    for cs in status.container_statuses.iter().flatten() {
        out.push_str(&format!(
            " [{} ready={} restarts={}",
            cs.name, cs.ready, cs.restart_count
        ));
        if let Some(state) = &cs.state {
            if let Some(w) = &state.waiting {
                out.push_str(&format!(
                    " waiting {} {}",
                    w.reason.as_deref().unwrap_or(""),
                    w.message.as_deref().unwrap_or("")
                ));
            }
            if let Some(t) = &state.terminated {
                out.push_str(&format!(
                    " terminated exit={} {} {}",
                    t.exit_code,
                    t.reason.as_deref().unwrap_or(""),
                    t.message.as_deref().unwrap_or("")
                ));
            }
        }
        out.push(']');
    }
    out
}

fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn job_finished(job: &Job) -> Option<bool> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    if conds
        .iter()
        .any(|c| c.type_ == "Complete" && c.status == "True")
    {
        Some(true)
    } else if conds
        .iter()
        .any(|c| c.type_ == "Failed" && c.status == "True")
    {
        Some(false)
    } else {
        None
    }
}

impl TestNamespace {
    pub fn client(&self) -> kube::Client {
        self.cluster.client.clone()
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
        self.apply_fixture("etcd.yaml").await?;
        self.wait_statefulset_ready("etcd", 3, ETCD_READY).await
    }

    /// Waits (watch + timeout) until `cond` holds for the object `name` of `api`; returns the
    /// object (None when the condition is met by its absence). On timeout, the error holds
    /// `describe` of the object's last state.
    pub async fn wait_for<K>(
        &self,
        api: Api<K>,
        name: &str,
        what: &str,
        timeout: Duration,
        cond: impl Condition<K>,
        describe: impl Fn(&K) -> String,
    ) -> Result<Option<K>, TestError>
    where
        K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
    {
        let what = format!("{what} ({}/{name})", self.name);
        match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
            Ok(Ok(obj)) => Ok(obj),
            Ok(Err(e)) => Err(TestError::Watch {
                what,
                detail: e.to_string(),
            }),
            Err(_) => {
                let last = match api.get_opt(name).await {
                    Ok(Some(obj)) => describe(&obj),
                    Ok(None) => "object does not exist".to_string(),
                    Err(e) => format!("cannot read it: {e}"),
                };
                let events = self.events_for(name).await.unwrap_or_default();
                Err(TestError::Timeout {
                    what,
                    waited: timeout,
                    last: format!("{last}; events: [{}]", events.join("; ")),
                })
            }
        }
    }

    /// `reason: message` of the events about object `name` in this namespace, oldest first.
    pub async fn events_for(&self, name: &str) -> Result<Vec<String>, TestError> {
        let api: Api<CoreEvent> = self.api();
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let mut events = api.list(&lp).await?.items;
        events.sort_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
        });
        Ok(events
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect())
    }

    /// Waits for an event with `reason` about object `name` (watch + timeout); returns its
    /// message.
    pub async fn wait_for_event(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<String, TestError> {
        let api: Api<CoreEvent> = self.api();
        let config = watcher::Config::default()
            .fields(&format!("involvedObject.name={name},reason={reason}"));
        let mut stream = watcher::watcher(api, config).applied_objects().boxed();
        let what = format!("event {reason} on {}/{name}", self.name);
        match tokio::time::timeout(timeout, stream.try_next()).await {
            Ok(Ok(Some(ev))) => Ok(ev.message.unwrap_or_default()),
            Ok(Ok(None)) => Err(TestError::Watch {
                what,
                detail: "watch ended".into(),
            }),
            Ok(Err(e)) => Err(TestError::Watch {
                what,
                detail: e.to_string(),
            }),
            Err(_) => Err(TestError::Timeout {
                what,
                waited: timeout,
                last: format!(
                    "events: [{}]",
                    self.events_for(name).await.unwrap_or_default().join("; ")
                ),
            }),
        }
    }

    /// Waits until pod `name` is Ready.
    pub async fn wait_pod_ready(&self, name: &str, timeout: Duration) -> Result<Pod, TestError> {
        let cond = |p: Option<&Pod>| p.is_some_and(pod_is_ready);
        self.wait_for(self.api(), name, "pod Ready", timeout, cond, describe_pod)
            .await?
            .ok_or_else(|| unexpected(name, "pod vanished"))
    }

    /// Waits until pod `name` is Succeeded or Failed.
    pub async fn wait_pod_finished(&self, name: &str, timeout: Duration) -> Result<Pod, TestError> {
        let cond = |p: Option<&Pod>| p.is_some_and(pod_is_finished);
        self.wait_for(
            self.api(),
            name,
            "pod finished",
            timeout,
            cond,
            describe_pod,
        )
        .await?
        .ok_or_else(|| unexpected(name, "pod vanished"))
    }

    /// Waits until StatefulSet `name` has `replicas` ready replicas (and wants that many).
    pub async fn wait_statefulset_ready(
        &self,
        name: &str,
        replicas: i32,
        timeout: Duration,
    ) -> Result<StatefulSet, TestError> {
        let cond = move |s: Option<&StatefulSet>| {
            s.is_some_and(|s| {
                let want = s.spec.as_ref().and_then(|sp| sp.replicas).unwrap_or(1);
                let ready = s
                    .status
                    .as_ref()
                    .and_then(|st| st.ready_replicas)
                    .unwrap_or(0);
                want == replicas && ready == replicas
            })
        };
        let describe = |s: &StatefulSet| {
            let st = s.status.clone().unwrap_or_default();
            format!(
                "replicas={} ready={} current={}",
                st.replicas,
                st.ready_replicas.unwrap_or(0),
                st.current_replicas.unwrap_or(0)
            )
        };
        let what = format!("StatefulSet {replicas}/{replicas} ready");
        let sts = self
            .wait_for(self.api(), name, &what, timeout, cond, describe)
            .await?
            .ok_or_else(|| unexpected(name, "StatefulSet vanished"))?;
        Ok(sts)
    }

    /// Waits until claim `name` is Bound; returns it.
    pub async fn wait_pvc_bound(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<PersistentVolumeClaim, TestError> {
        let cond = |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound")
        };
        let describe = |c: &PersistentVolumeClaim| {
            format!(
                "phase={} volumeName={} annotations={:?}",
                c.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("?"),
                c.spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .unwrap_or(""),
                c.annotations()
            )
        };
        self.wait_for(self.api(), name, "claim Bound", timeout, cond, describe)
            .await?
            .ok_or_else(|| unexpected(name, "claim vanished"))
    }

    /// Waits until a Job has a Complete or Failed condition; returns it and whether it completed.
    pub async fn wait_job_finished(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Job, bool), TestError> {
        let cond = |j: Option<&Job>| j.and_then(job_finished).is_some();
        let describe = |j: &Job| {
            let st = j.status.clone().unwrap_or_default();
            format!(
                "active={} succeeded={} failed={} conditions={:?}",
                st.active.unwrap_or(0),
                st.succeeded.unwrap_or(0),
                st.failed.unwrap_or(0),
                st.conditions
                    .unwrap_or_default()
                    .iter()
                    .map(|c| format!(
                        "{}={} {}",
                        c.type_,
                        c.status,
                        c.message.clone().unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
            )
        };
        let job = self
            .wait_for(self.api(), name, "Job finished", timeout, cond, describe)
            .await?
            .ok_or_else(|| unexpected(name, "Job vanished"))?;
        let complete = job_finished(&job).unwrap_or(false);
        Ok((job, complete))
    }

    /// Waits until the object is gone (404), or replaced by one with another uid.
    pub async fn wait_deleted<K>(
        &self,
        api: Api<K>,
        name: &str,
        uid: &str,
        timeout: Duration,
    ) -> Result<(), TestError>
    where
        K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
    {
        let cond = kube::runtime::wait::conditions::is_deleted::<K>(uid);
        let describe = |o: &K| {
            format!(
                "still exists, deletionTimestamp={:?} finalizers={:?}",
                o.meta().deletion_timestamp,
                o.meta().finalizers
            )
        };
        self.wait_for(api, name, "deletion", timeout, cond, describe)
            .await
            .map(|_| ())
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

    /// IP of a running pod.
    pub async fn pod_ip(&self, name: &str) -> Result<String, TestError> {
        let pod = self.api::<Pod>().get(name).await?;
        pod.status
            .and_then(|s| s.pod_ip)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| unexpected(format!("pod {}/{name}", self.name), "has no IP"))
    }

    /// Creates a claim of `size` on `class`.
    pub async fn create_pvc(
        &self,
        name: &str,
        class: &str,
        size: &str,
    ) -> Result<PersistentVolumeClaim, TestError> {
        let claim = claim_manifest(name, class, size);
        Ok(self.api().create(&PostParams::default(), &claim).await?)
    }

    /// Creates a one-off mover pod (not waiting for it).
    pub async fn create_mover_pod(&self, spec: &MoverSpec) -> Result<Pod, TestError> {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                labels: Some(BTreeMap::from([(
                    "e2e/mover".to_string(),
                    spec.name.clone(),
                )])),
                ..Default::default()
            },
            spec: Some(mover_pod_spec(&self.cluster.mover_image, spec)),
            status: None,
        };
        Ok(self.api().create(&PostParams::default(), &pod).await?)
    }

    /// Runs a one-off mover pod to its end and collects exit code, termination message and
    /// logs.
    pub async fn run_pod(
        &self,
        spec: &MoverSpec,
        timeout: Duration,
    ) -> Result<PodOutcome, TestError> {
        self.create_mover_pod(spec).await?;
        let pod = self.wait_pod_finished(&spec.name, timeout).await?;
        Ok(self.outcome_of(&pod).await)
    }

    async fn outcome_of(&self, pod: &Pod) -> PodOutcome {
        let name = pod.name_any();
        let status = pod.status.clone().unwrap_or_default();
        let terminated = status
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == "mover")
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        let logs = match self
            .api::<Pod>()
            .logs(
                &name,
                &LogParams {
                    container: Some("mover".into()),
                    ..Default::default()
                },
            )
            .await
        {
            Ok(l) => l,
            Err(e) => format!("<logs unavailable: {e}>"),
        };
        PodOutcome {
            pod: name,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: status.phase.unwrap_or_default(),
            exit_code: terminated.as_ref().map(|t| t.exit_code),
            message: terminated.and_then(|t| t.message).unwrap_or_default(),
            logs,
        }
    }

    /// Runs a mover Job (backoffLimit 0, bounded by `timeout`) to its end; returns whether it
    /// completed and how its pod ended.
    pub async fn run_job(
        &self,
        spec: &MoverSpec,
        timeout: Duration,
    ) -> Result<JobOutcome, TestError> {
        let deadline = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX).max(1);
        let job = Job {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                active_deadline_seconds: Some(deadline),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([(
                            "e2e/mover".to_string(),
                            spec.name.clone(),
                        )])),
                        ..Default::default()
                    }),
                    spec: Some(mover_pod_spec(&self.cluster.mover_image, spec)),
                },
                ..Default::default()
            }),
            status: None,
        };
        let created = self
            .api::<Job>()
            .create(&PostParams::default(), &job)
            .await?;
        let uid = created.uid().unwrap_or_default();
        let (_, complete) = self
            .wait_job_finished(&spec.name, timeout + Duration::from_secs(30))
            .await?;
        // The Job's pods carry `controller-uid=<job uid>` on every Kubernetes version.
        let pods = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
            .await?;
        let mut pods = pods.items;
        pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
        let pod = match pods.last() {
            // The Job is finished, but its pod's final status may lag a moment behind.
            Some(p) => {
                let p = self
                    .wait_pod_finished(&p.name_any(), Duration::from_secs(30))
                    .await
                    .unwrap_or_else(|_| p.clone());
                Some(self.outcome_of(&p).await)
            }
            None => None,
        };
        Ok(JobOutcome {
            job: spec.name.clone(),
            complete,
            pod,
        })
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
        // The test's runtime may be single-threaded and blocked in this drop: delete from a
        // fresh runtime and client on another thread, and wait for the request (not for the
        // namespace to be gone).
        let config = self.cluster.config.clone();
        let name = self.name.clone();
        let handle = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return Err(e.to_string()),
            };
            rt.block_on(async {
                let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
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
            })
        });
        match handle.join() {
            Ok(Ok(())) => info!(namespace = %self.name, "deleting test namespace"),
            Ok(Err(e)) => warn!(namespace = %self.name, error = %e, "cannot delete test namespace"),
            Err(_) => warn!(namespace = %self.name, "namespace deletion thread panicked"),
        }
    }
}

/// etcd helpers: one client per member endpoint (a multi-endpoint client answers `status` from
/// any one of them).
pub mod operator;

pub mod etcd {
    use std::time::Duration;

    use etcd_client::{Client, ConnectOptions};

    use super::{TestError, TestNamespace};

    /// One etcd member, reached at its pod IP.
    pub struct EtcdMember {
        pub pod: String,
        pub endpoint: String,
        pub client: Client,
    }

    impl std::fmt::Debug for EtcdMember {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("EtcdMember")
                .field("pod", &self.pod)
                .field("endpoint", &self.endpoint)
                .finish()
        }
    }

    /// What one member reports about the cluster.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct MemberView {
        /// This member's id.
        pub id: u64,
        /// The leader this member knows (0: none).
        pub leader: u64,
        /// `(id, name, is_learner)` of every member.
        pub members: Vec<(u64, String, bool)>,
    }

    fn err(endpoint: &str) -> impl FnOnce(etcd_client::Error) -> TestError {
        let endpoint = endpoint.to_string();
        move |source| TestError::Etcd { endpoint, source }
    }

    /// A client for exactly one endpoint (`http://<ip>:2379`).
    pub async fn connect(endpoint: &str) -> Result<Client, TestError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10));
        Client::connect([endpoint], Some(options))
            .await
            .map_err(err(endpoint))
    }

    /// Clients for the members `<set>-0 .. <set>-(replicas-1)` of a StatefulSet, at their pod
    /// IPs, port 2379.
    pub async fn members(
        ns: &TestNamespace,
        set: &str,
        replicas: usize,
    ) -> Result<Vec<EtcdMember>, TestError> {
        let mut out = Vec::with_capacity(replicas);
        for i in 0..replicas {
            let pod = format!("{set}-{i}");
            out.push(member(ns, &pod).await?);
        }
        Ok(out)
    }

    /// A client for one member pod.
    pub async fn member(ns: &TestNamespace, pod: &str) -> Result<EtcdMember, TestError> {
        let ip = ns.pod_ip(pod).await?;
        let endpoint = format!("http://{ip}:2379");
        let client = connect(&endpoint).await?;
        Ok(EtcdMember {
            pod: pod.to_string(),
            endpoint,
            client,
        })
    }

    impl EtcdMember {
        /// This member's view: its id, the leader it knows, the member list.
        pub async fn view(&mut self) -> Result<MemberView, TestError> {
            let status = self.client.status().await.map_err(err(&self.endpoint))?;
            let id = status.header().map(|h| h.member_id()).unwrap_or_default();
            let leader = status.leader();
            let list = self
                .client
                .member_list()
                .await
                .map_err(err(&self.endpoint))?;
            let members = list
                .members()
                .iter()
                .map(|m| (m.id(), m.name().to_string(), m.is_learner()))
                .collect();
            Ok(MemberView {
                id,
                leader,
                members,
            })
        }

        pub async fn put(&mut self, key: &str, value: &str) -> Result<(), TestError> {
            self.client
                .put(key, value, None)
                .await
                .map_err(err(&self.endpoint))?;
            Ok(())
        }

        /// The value of `key` (linearizable read), if any.
        pub async fn get(&mut self, key: &str) -> Result<Option<String>, TestError> {
            let resp = self
                .client
                .get(key, None)
                .await
                .map_err(err(&self.endpoint))?;
            Ok(resp
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        assert_eq!(
            namespace_name("etcd_ready", "abc123"),
            "e2e-etcd-ready-abc123"
        );
        assert_eq!(namespace_name("A::B__c", "000001"), "e2e-a-b-c-000001");
        assert_eq!(namespace_name("__", "ffffff"), "e2e-ffffff");
        let long = namespace_name(&"x".repeat(200), "abcdef");
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-abcdef"));
    }

    #[test]
    fn random_suffixes_differ() {
        let a = random_suffix();
        let b = random_suffix();
        assert_eq!(a.len(), 6);
        assert_ne!(a, b);
    }

    #[test]
    fn mover_pod_is_pinned_by_affinity_not_node_name() {
        let spec = MoverSpec::shell("fill", "dd if=/dev/zero of=/data/f")
            .on_node("node-b")
            .mount("small", "/data");
        let pod = mover_pod_spec("storage-migrator-mover:latest", &spec);
        assert_eq!(pod.node_name, None);
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let terms = pod
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        let field = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(field.key, "metadata.name");
        assert_eq!(field.values.as_deref(), Some(&["node-b".to_string()][..]));
        let c = &pod.containers[0];
        assert_eq!(c.command.as_ref().unwrap()[0], "sh");
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        assert_eq!(c.volume_mounts.as_ref().unwrap()[0].mount_path, "/data");
        let vol = &pod.volumes.unwrap()[0];
        assert_eq!(
            vol.persistent_volume_claim.as_ref().unwrap().claim_name,
            "small"
        );
    }

    #[test]
    fn node_affinity_matching() {
        let node = |name: &str| Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/hostname".to_string(),
                    name.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let aff = |key: &str, op: &str, vals: &[&str], field: bool| {
            let req = NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(vals.iter().map(|v| v.to_string()).collect()),
            };
            let term = if field {
                NodeSelectorTerm {
                    match_fields: Some(vec![req]),
                    ..Default::default()
                }
            } else {
                NodeSelectorTerm {
                    match_expressions: Some(vec![req]),
                    ..Default::default()
                }
            };
            VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![term],
                }),
            }
        };
        let by_host = aff("kubernetes.io/hostname", "In", &["node-b"], false);
        assert!(node_satisfies(&by_host, &node("node-b")));
        assert!(!node_satisfies(&by_host, &node("node-a")));
        let by_name = aff("metadata.name", "In", &["node-c"], true);
        assert!(node_satisfies(&by_name, &node("node-c")));
        assert!(!node_satisfies(&by_name, &node("node-b")));
        let not_in = aff("kubernetes.io/hostname", "NotIn", &["node-a"], false);
        assert!(node_satisfies(&not_in, &node("node-b")));
        assert!(!node_satisfies(&not_in, &node("node-a")));
    }

    #[test]
    fn claims_ask_for_size_on_class() {
        let c = claim_manifest("a", "fast", "32Mi");
        let spec = c.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            Quantity("32Mi".into())
        );
    }

    #[test]
    fn etcd_fixture_parses_and_is_namespace_free() {
        let yaml = std::fs::read_to_string(fixture_path("etcd.yaml")).unwrap();
        let mut docs: Vec<DynamicObject> = serde_norway::Deserializer::from_str(&yaml)
            .map(|d| {
                serde_norway::from_value(serde_norway::Value::deserialize(d).unwrap()).unwrap()
            })
            .collect();
        assert_eq!(docs.len(), 2);
        for d in &docs {
            assert!(
                d.metadata.namespace.is_none(),
                "fixture must not pin a namespace"
            );
        }
        let sts: StatefulSet =
            serde_json::from_value(serde_json::to_value(&docs[1]).unwrap()).unwrap();
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(spec.service_name.as_deref(), Some("etcd"));
        let vct = &spec.volume_claim_templates.unwrap()[0];
        assert_eq!(vct.metadata.name.as_deref(), Some("data"));
        let vspec = vct.spec.as_ref().unwrap();
        assert_eq!(vspec.storage_class_name.as_deref(), Some("standard"));
        let c = &spec.template.spec.unwrap().containers[0];
        let args = c.args.clone().unwrap_or_default().join(" ");
        assert!(args.contains("--name=$(POD_NAME)"), "{args}");
        assert!(args.contains("etcd-2=http://etcd-2.etcd.$(NAMESPACE).svc.cluster.local:2380"));
        assert!(
            !args.contains("default.svc"),
            "namespace must not be hard-coded"
        );

        set_template_class(&mut docs[1], "standard", "gp3");
        assert_eq!(
            docs[1].data["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
            "gp3"
        );
    }
}
