//! Faults injected into the local cluster: [`NodeDown`] takes a node down as a power loss
//! would (`localcluster node down`, see `agent::Agent::watch_down`), can declare it down with
//! the out-of-service taint, and takes the taint off and brings the node up again when dropped,
//! so a failing test never leaves a node down or tainted for the next one.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;

use crate::testing::{TestCluster, TestError, unexpected};

/// A node of the local cluster taken down; up again (and its out-of-service taint off) on
/// [`NodeDown::up`] or drop.
pub struct NodeDown {
    state_dir: PathBuf,
    pub node: String,
    up: bool,
    /// Set while the node carries the out-of-service taint ([`NodeDown::out_of_service`]): the
    /// cluster to take it off on drop.
    tainted: Option<kube::Config>,
}

/// The taint of non-graceful node shutdown: an administrator's word that a node is down.
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// The Ready condition's status of a node (`None` without one).
pub fn node_ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

impl NodeDown {
    /// Takes `node` down and waits (at most `timeout`) until its Ready condition is
    /// `Unknown`. Only on the local cluster (`KUBECONFIG` from `localcluster up`).
    pub async fn take(
        cluster: &TestCluster,
        node: &str,
        timeout: Duration,
    ) -> Result<Self, TestError> {
        let state = TestCluster::local_state()
            .ok_or_else(|| unexpected("node down", "KUBECONFIG is not a localcluster's"))?;
        crate::state::set_node_down(&state.dir, node, true)
            .map_err(|e| unexpected(format!("mark {node} down"), e.to_string()))?;
        let guard = NodeDown {
            state_dir: state.dir.clone(),
            node: node.to_string(),
            up: false,
            tainted: None,
        };
        wait_ready(cluster, node, "Unknown", timeout).await?;
        Ok(guard)
    }

    /// Puts the out-of-service taint (`NoExecute`) on the node (`on`), as an administrator does
    /// once it is really down, or takes it off again.
    pub async fn out_of_service(
        &mut self,
        cluster: &TestCluster,
        on: bool,
    ) -> Result<(), TestError> {
        set_out_of_service(&cluster.client, &self.node, on).await?;
        self.tainted = on.then(|| cluster.config.clone());
        Ok(())
    }

    /// Takes the out-of-service taint off (if this guard put it on), brings the node up and
    /// waits (at most `timeout`) until it is Ready again.
    pub async fn up(mut self, cluster: &TestCluster, timeout: Duration) -> Result<(), TestError> {
        if self.tainted.is_some() {
            self.out_of_service(cluster, false).await?;
        }
        self.mark_up()?;
        wait_ready(cluster, &self.node, "True", timeout).await
    }

    fn mark_up(&mut self) -> Result<(), TestError> {
        if !self.up {
            crate::state::set_node_down(&self.state_dir, &self.node, false)
                .map_err(|e| unexpected(format!("mark {} up", self.node), e.to_string()))?;
            self.up = true;
        }
        Ok(())
    }
}

impl Drop for NodeDown {
    fn drop(&mut self) {
        if let Some(config) = self.tainted.take()
            && let Err(e) = untaint_from_drop(config, self.node.clone())
        {
            eprintln!(
                "cannot take the out-of-service taint off node {}: {e}",
                self.node
            );
        }
        if let Err(e) = self.mark_up() {
            eprintln!("cannot bring node {} up again: {e}", self.node);
        }
    }
}

/// Takes the out-of-service taint off `node` from a drop ([`crate::testing::from_drop`]).
fn untaint_from_drop(config: kube::Config, node: String) -> Result<(), String> {
    crate::testing::from_drop(config, |client| async move {
        set_out_of_service(&client, &node, false)
            .await
            .map_err(|e| e.to_string())
    })
}

/// Puts the out-of-service taint on `node` (`on`) or takes it off, keeping its other taints.
async fn set_out_of_service(client: &kube::Client, node: &str, on: bool) -> Result<(), TestError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let what = || format!("taint node {node} out-of-service: {on}");
    let n = nodes
        .get(node)
        .await
        .map_err(|e| unexpected(what(), e.to_string()))?;
    let mut taints: Vec<_> = (n.spec.and_then(|s| s.taints).unwrap_or_default())
        .into_iter()
        .filter(|t| t.key != OUT_OF_SERVICE)
        .collect();
    if on {
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: OUT_OF_SERVICE.into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            time_added: None,
        });
    }
    let patch = serde_json::json!({"spec": {"taints": taints}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| unexpected(what(), e.to_string()))?;
    Ok(())
}

/// Waits until node `node`'s Ready condition is `status`.
async fn wait_ready(
    cluster: &TestCluster,
    node: &str,
    status: &str,
    timeout: Duration,
) -> Result<(), TestError> {
    let api: Api<Node> = Api::all(cluster.client.clone());
    let want = status.to_string();
    let cond = move |n: Option<&Node>| n.and_then(node_ready).as_deref() == Some(want.as_str());
    match tokio::time::timeout(timeout, await_condition(api.clone(), node, cond)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(unexpected(format!("watch node {node}"), e.to_string())),
        Err(_) => {
            let last = api.get_opt(node).await.ok().flatten();
            Err(TestError::Timeout {
                what: format!("node {node} Ready={status}"),
                waited: timeout,
                last: format!("Ready={:?}", last.as_ref().and_then(node_ready)),
            })
        }
    }
}

/// A fault scenario on the etcd fixture: a 3-member set, seeded, with a client writing
/// `seed/w-<n>` keys until [`EtcdUnderLoad::finish`].
pub struct EtcdUnderLoad {
    pub cluster: TestCluster,
    pub ns: crate::testing::TestNamespace,
    seeded: std::collections::BTreeSet<String>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writer: tokio::task::JoinHandle<crate::testing::etcd::Written>,
}

/// The set's name in the etcd fixture.
pub const ETCD_SET: &str = "etcd";

/// A variant of the etcd fixture whose members take `delay` seconds to stop: etcd runs in a
/// session of its own under a shell that, on SIGTERM (sent to the container's process group),
/// waits `delay` seconds before passing it on; the grace period is `delay + 20` s. So a member
/// being stopped stays `Terminating`, still serving, long enough for a test to act (a node
/// that loses power kills every process of the pod's network namespace, etcd with them).
pub fn etcd_slow_stop(delay: u32) -> impl Fn(&mut kube::api::DynamicObject) {
    move |obj| {
        if obj.types.as_ref().is_none_or(|t| t.kind != "StatefulSet") {
            return;
        }
        let Some(spec) = obj.data.pointer_mut("/spec/template/spec") else {
            return;
        };
        spec["terminationGracePeriodSeconds"] = serde_json::json!(delay + 20);
        let script = format!(
            "setsid etcd \"$@\" &\npid=$!\ntrap 'sleep {delay}; kill -TERM $pid' TERM\n\
             while kill -0 $pid 2>/dev/null; do wait $pid; done"
        );
        if let Some(c) = spec.pointer_mut("/containers/0") {
            c["command"] = serde_json::json!(["sh", "-c", script, "etcd"]);
        }
    }
}

/// A variant of the etcd fixture with each member on a node of its own (a required pod
/// anti-affinity on the hostname): without it the scheduler may put two members on one node,
/// and a test that takes that node down takes the quorum with it.
pub fn one_member_per_node(obj: &mut kube::api::DynamicObject) {
    if obj.types.as_ref().is_none_or(|t| t.kind != "StatefulSet") {
        return;
    }
    let Some(spec) = obj.data.pointer_mut("/spec/template/spec") else {
        return;
    };
    spec["affinity"] = serde_json::json!({
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": ETCD_SET}},
                "topologyKey": "kubernetes.io/hostname",
            }],
        },
    });
}

impl EtcdUnderLoad {
    /// A fresh namespace with the CRD, the etcd fixture Ready, 50 seeded keys and the writer.
    pub async fn start(test: &str) -> Result<Self, TestError> {
        Self::start_with(test, |_| {}).await
    }

    /// [`Self::start`] on a variant of the fixture (`edit`: see
    /// [`crate::testing::TestNamespace::apply_etcd_with`]), e.g. [`etcd_slow_stop`].
    pub async fn start_with(
        test: &str,
        edit: impl Fn(&mut kube::api::DynamicObject),
    ) -> Result<Self, TestError> {
        use crate::testing::{etcd, operator, scenario};
        let (cluster, ns) = scenario(test).await;
        operator::install_crd(&ns)
            .await
            .map_err(|e| unexpected("install the CRD", e.to_string()))?;
        ns.apply_etcd_with(edit).await?;
        let seeded = etcd::seed_keys(&ns, ETCD_SET, 50).await?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = etcd::start_writer(&ns, ETCD_SET, 3, "seed/w-", stop.clone());
        Ok(Self {
            cluster,
            ns,
            seeded,
            stop,
            writer,
        })
    }

    /// Creates request `name`: the set's volumes to the WaitForFirstConsumer class.
    pub async fn create_request(&self, name: &str) -> Result<(), TestError> {
        let spec = serde_json::json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": ETCD_SET},
            "storageClassChange": {"storageClassName": self.cluster.wffc_storage_class},
            "timeout": "20m",
            "database": {"engine": "Etcd"},
        });
        crate::testing::operator::create_request(&self.ns, name, spec)
            .await
            .map_err(|e| unexpected(format!("create request {name}"), e.to_string()))
    }

    /// The end of every scenario: the writer stopped, every acknowledged and seeded key on
    /// every member (which agree), nothing of the request left (asserted). Returns the writer's
    /// counts.
    pub async fn finish(
        self,
    ) -> (
        TestCluster,
        crate::testing::TestNamespace,
        crate::testing::etcd::Written,
    ) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written = match self.writer.await {
            Ok(w) => w,
            Err(e) => panic!("the writer task failed: {e}"),
        };
        let mut expected = self.seeded;
        expected.extend(written.acked.iter().cloned());
        crate::testing::etcd::assert_keys_everywhere(&self.ns, ETCD_SET, 3, &expected).await;
        let left = request_leftovers(&self.ns).await;
        assert!(
            left.as_ref().is_ok_and(Vec::is_empty),
            "left behind: {left:?}"
        );
        (self.cluster, self.ns, written)
    }
}

/// The Jobs, helper pods (labelled with the request) and temporary claims (`-smr-`) still in
/// the namespace. A list that fails is an error, never "nothing left".
pub async fn request_leftovers(
    ns: &crate::testing::TestNamespace,
) -> Result<Vec<String>, TestError> {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::ResourceExt;
    use kube::api::ListParams;
    let mut left = Vec::new();
    let jobs: Api<Job> = ns.api();
    for j in jobs.list(&ListParams::default()).await?.items {
        left.push(format!("job {}", j.name_any()));
    }
    let pods: Api<Pod> = ns.api();
    let ours = ListParams::default().labels(storage_migrator::labels::REQUEST_LABEL);
    for p in pods.list(&ours).await?.items {
        left.push(format!("pod {}", p.name_any()));
    }
    let claims: Api<PersistentVolumeClaim> = ns.api();
    for c in claims.list(&ListParams::default()).await?.items {
        if c.name_any().contains("-smr-") {
            left.push(format!("claim {}", c.name_any()));
        }
    }
    Ok(left)
}

/// [`request_leftovers`] for a wait that polls it: a failed list counts as something left
/// (named), so the wait goes on and, at its end, shows the error.
pub async fn leftovers_or_error(ns: &crate::testing::TestNamespace) -> Vec<String> {
    request_leftovers(ns)
        .await
        .unwrap_or_else(|e| vec![format!("(cannot list what is left: {e})")])
}
