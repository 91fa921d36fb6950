//! The node agent: registers the cluster's nodes and is their kubelet. (Stub: interface only.)

use std::path::Path;

use crate::state::ClusterState;

pub mod runtime;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("node agent not implemented yet")]
    NotImplemented,
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
}

/// Runs the node agent (and the volume provisioner) until SIGTERM/SIGINT, then stops every
/// container it started and tears down its pods' host resources.
pub async fn run(_state: ClusterState) -> Result<(), AgentError> {
    Err(AgentError::NotImplemented)
}

/// Removes every host resource of this cluster that the agent may have left (processes,
/// mounts, network namespaces, veths, bridge). Safe to call when nothing is left.
pub fn cleanup_host(_state: &ClusterState) -> Result<(), AgentError> {
    Err(AgentError::NotImplemented)
}

/// Entry point of the hidden `container-init SPEC` subcommand: enters the pod's namespaces,
/// sets up the container's mounts and execs its program. Only returns on error.
pub fn container_init(spec: &Path) -> AgentError {
    AgentError::Runtime(runtime::container_init(spec))
}
