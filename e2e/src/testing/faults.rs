//! Faults injected into the local cluster: [`NodeDown`] takes a node down as a power loss
//! would (`localcluster node down`, see `agent::Agent::watch_down`) and brings it up again when
//! dropped, so a failing test never leaves a node down for the next one.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::wait::await_condition;

use crate::testing::{TestCluster, TestError, unexpected};

/// A node of the local cluster taken down; up again on [`NodeDown::up`] or drop.
pub struct NodeDown {
    state_dir: PathBuf,
    pub node: String,
    up: bool,
}

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
        };
        wait_ready(cluster, node, "Unknown", timeout).await?;
        Ok(guard)
    }

    /// Brings the node up and waits (at most `timeout`) until it is Ready again.
    pub async fn up(mut self, cluster: &TestCluster, timeout: Duration) -> Result<(), TestError> {
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
        if let Err(e) = self.mark_up() {
            eprintln!("cannot bring node {} up again: {e}", self.node);
        }
    }
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
