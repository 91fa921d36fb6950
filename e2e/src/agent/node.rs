//! Node registration and heartbeats: the three Node objects (labels, addresses, capacity,
//! nodeInfo, Ready condition renewed every 10 s, the admission's not-ready taint removed) and
//! their Leases in `kube-node-lease`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::image::{NODE_CPU, NODE_MEMORY};
use crate::state::{ClusterState, NODE_NAMES, NODE_ZONES};

/// How often node status and leases are renewed.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
const LEASE_NS: &str = "kube-node-lease";

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("node {node}: {source}")]
    Kube { node: String, source: kube::Error },
}

/// The Node object as first created (labels only; status is patched separately).
pub fn node_object(name: &str, zone: &str) -> Node {
    let labels = BTreeMap::from(
        [
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", "amd64"),
            ("topology.kubernetes.io/zone", zone),
            ("failure-domain.beta.kubernetes.io/zone", zone),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: None,
    }
}

/// The status patch of node `index` at `now` (`since`: when the agent came up, the Ready
/// condition's transition time).
pub fn status_patch(
    state: &ClusterState,
    index: usize,
    now: Timestamp,
    since: Timestamp,
) -> serde_json::Value {
    let name = NODE_NAMES[index];
    let port = state.kubelet_ports.get(index).copied().unwrap_or(10250);
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now.to_string(), "lastTransitionTime": since.to_string(),
        })
    };
    let resources = json!({
        "cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": "110", "ephemeral-storage": "100Gi",
    });
    json!({
        "status": {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "localcluster node agent is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "machineID": format!("{}-{name}", state.id),
                "systemUUID": format!("{}-{name}", state.id),
                "bootID": format!("{}-{name}", state.id),
                "kernelVersion": kernel_version(),
                "osImage": "localcluster (host filesystem)",
                "containerRuntimeVersion": "localcluster://0.1",
                "kubeletVersion": crate::controlplane::KUBERNETES_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
    })
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether node taints include one the agent removes (admission's not-ready, unreachable).
fn removable(key: &str) -> bool {
    key == NOT_READY_TAINT || key == UNREACHABLE_TAINT
}

fn kerr(node: &str) -> impl FnOnce(kube::Error) -> NodeError + '_ {
    move |source| NodeError::Kube {
        node: node.to_string(),
        source,
    }
}

/// Creates the node when missing, then renews its status and drops the not-ready taint.
async fn register(
    nodes: &Api<Node>,
    state: &ClusterState,
    index: usize,
    since: Timestamp,
) -> Result<(), NodeError> {
    let name = NODE_NAMES[index];
    let zone = NODE_ZONES[index];
    if nodes.get_opt(name).await.map_err(kerr(name))?.is_none() {
        match nodes
            .create(&PostParams::default(), &node_object(name, zone))
            .await
        {
            Ok(_) => tracing::info!(node = name, "node registered"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(kerr(name)(e)),
        }
    } else {
        // Labels may have been changed by hand or by an older agent: put ours back.
        let labels = node_object(name, zone).metadata.labels;
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .map_err(kerr(name))?;
    }
    heartbeat(nodes, state, index, since).await
}

/// Renews node `index`'s status and removes the not-ready taint if present.
async fn heartbeat(
    nodes: &Api<Node>,
    state: &ClusterState,
    index: usize,
    since: Timestamp,
) -> Result<(), NodeError> {
    let name = NODE_NAMES[index];
    let patch = status_patch(state, index, Timestamp::now(), since);
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(kerr(name))?;
    let node = nodes.get(name).await.map_err(kerr(name))?;
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(|t| removable(&t.key)) {
        let kept: Vec<_> = taints.into_iter().filter(|t| !removable(&t.key)).collect();
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": kept},
        });
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => tracing::info!(node = name, "not-ready taint removed"),
            // Changed meanwhile: the next heartbeat tries again.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(kerr(name)(e)),
        }
    }
    Ok(())
}

/// Creates or renews the node's Lease.
async fn renew_lease(
    client: &kube::Client,
    nodes: &Api<Node>,
    name: &str,
) -> Result<(), NodeError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);
    let now = MicroTime(Timestamp::now());
    match leases.get_opt(name).await.map_err(kerr(name))? {
        Some(_) => {
            let patch = json!({"spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}});
            leases
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(kerr(name))?;
        }
        None => {
            let uid = nodes.get(name).await.map_err(kerr(name))?.metadata.uid;
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(LEASE_NS.to_string()),
                    owner_references: uid.map(|uid| {
                        vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: name.to_string(),
                            uid,
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name.to_string()),
                    lease_duration_seconds: Some(40),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(kerr(name)(e)),
            }
        }
    }
    Ok(())
}

/// The status patch of a node that stopped posting its status, as the node lifecycle
/// controller writes it: every condition `Unknown`, reason `NodeStatusUnknown`.
pub fn unknown_patch(now: Timestamp) -> serde_json::Value {
    let cond = |type_: &str| {
        json!({
            "type": type_, "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastHeartbeatTime": now.to_string(), "lastTransitionTime": now.to_string(),
        })
    };
    json!({"status": {"conditions": [
        cond("MemoryPressure"), cond("DiskPressure"), cond("PIDPressure"), cond("Ready"),
    ]}})
}

/// Registers every node, then renews status and leases every [`HEARTBEAT`] until dropped.
/// A node in `down` (`localcluster node down`) gets no heartbeat nor lease renewal; its
/// conditions turn `Unknown` at once (this cluster has no node lifecycle controller to do it).
/// Errors are logged and retried.
pub async fn run(
    client: kube::Client,
    state: ClusterState,
    mut down: tokio::sync::watch::Receiver<std::collections::BTreeSet<String>>,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut since = [Timestamp::now(); 3];
    let mut registered = [false; 3];
    let mut was_down = [false; 3];
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = down.changed() => {}
        }
        let down_now = down.borrow_and_update().clone();
        for (i, name) in NODE_NAMES.iter().enumerate() {
            if down_now.contains(*name) {
                if !was_down[i] {
                    let patch = unknown_patch(Timestamp::now());
                    match nodes
                        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        Ok(_) => was_down[i] = true,
                        Err(e) => {
                            tracing::warn!(node = name, error = %e, "cannot mark node Unknown")
                        }
                    }
                }
                continue;
            }
            if was_down[i] {
                was_down[i] = false;
                since[i] = Timestamp::now();
            }
            let since = since[i];
            let res = if registered[i] {
                heartbeat(&nodes, &state, i, since).await
            } else {
                register(&nodes, &state, i, since).await
            };
            match res {
                Ok(()) => registered[i] = true,
                Err(e) => tracing::warn!(node = name, error = %e, "node status update failed"),
            }
            if let Err(e) = renew_lease(&client, &nodes, name).await {
                tracing::warn!(node = name, error = %e, "lease renewal failed");
            }
        }
    }
}

/// Registers every node once (so the scheduler can place pods right away).
pub async fn register_all(client: &kube::Client, state: &ClusterState) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let since = Timestamp::now();
    for i in 0..NODE_NAMES.len() {
        register(&nodes, state, i, since).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::path::PathBuf;

    fn state() -> ClusterState {
        ClusterState {
            id: "abc123".into(),
            dir: PathBuf::from("/x"),
            bin_dir: PathBuf::from("/b"),
            etcd_client_port: 1,
            etcd_peer_port: 2,
            apiserver_port: 3,
            controller_manager_port: 4,
            scheduler_port: 5,
            kubelet_ports: vec![10250, 10251, 10252],
            pod_net: 7,
            service_net: 8,
        }
    }

    #[test]
    fn node_object_and_status() {
        let n = node_object("node-b", "zone-b");
        let labels = n.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "node-b");
        assert_eq!(labels["topology.kubernetes.io/zone"], "zone-b");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        let now = Timestamp::from_second(100).unwrap();
        let p = status_patch(&state(), 1, now, now);
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": "node-b"}, "status": p["status"]}))
                .unwrap();
        let st = node.status.unwrap();
        assert_eq!(
            st.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
            10251
        );
        let ready = st
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        let info = st.node_info.unwrap();
        assert_eq!(
            info.kubelet_version,
            crate::controlplane::KUBERNETES_VERSION
        );
        assert_eq!(info.container_runtime_version, "localcluster://0.1");
        assert_eq!(st.capacity.unwrap()["pods"], Quantity("110".into()));
        let addrs = st.addresses.unwrap();
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[0].address, "127.0.0.1");
        let down = unknown_patch(now);
        let conds = down["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 4);
        assert!(conds.iter().all(|c| c["status"] == "Unknown"));
        assert!(conds.iter().any(|c| c["type"] == "Ready"));
        assert!(removable(NOT_READY_TAINT));
        assert!(!removable("dedicated"));
    }
}
