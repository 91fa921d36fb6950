//! The node agent's host runtime: pod sandboxes (network namespace, veth on the cluster bridge,
//! pod IP) and containers (a host program in its own mount and UTS namespace, inside the pod's
//! network namespace, with bind-mounted volumes). Knows nothing about the Kubernetes API.
//! (Stub: interface only; bodies are being written.)

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::ClusterState;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime not implemented yet")]
    NotImplemented,
}

/// One bind mount into a container: `source` (a host path) appears at `target`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MountSpec {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// Everything needed to start one container process. Written as JSON for `container-init`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContainerSpec {
    /// Program (absolute host path) and its arguments, already resolved and `$(VAR)`-expanded.
    pub argv: Vec<String>,
    /// The complete environment of the process.
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
    /// Volumes and the pod's hosts file (`/etc/hosts`), in mount order.
    pub mounts: Vec<MountSpec>,
    /// UTS hostname of the container (the pod's hostname).
    pub hostname: String,
    /// stdout and stderr are appended here (what `kubectl logs` shows).
    pub log_path: PathBuf,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
}

/// A pod's network sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sandbox {
    /// Name of the network namespace (`/run/netns/<netns>`), prefixed by `state.netns_prefix()`.
    pub netns: String,
    pub ip: Ipv4Addr,
    /// Host end of the veth pair, attached to `state.bridge_name()`.
    pub host_veth: String,
    /// Scratch directory of the pod (under `state.node_dir(node)/pods/<uid>`).
    pub dir: PathBuf,
}

/// Result of a command run inside a container's namespaces (exec probes).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Creates the cluster bridge if missing (address `state.bridge_ip()`/24), a network namespace
/// named `state.netns_prefix() + key`, a veth pair (host end on the bridge, pod end `eth0` with `ip`,
/// default route via the bridge, `lo` up) and the scratch dir `dir`.
pub fn create_sandbox(
    _state: &ClusterState,
    _key: &str,
    _ip: Ipv4Addr,
    _dir: &Path,
) -> Result<Sandbox, RuntimeError> {
    Err(RuntimeError::NotImplemented)
}

/// Deletes the sandbox's veth and network namespace. Idempotent.
pub fn destroy_sandbox(_sandbox: &Sandbox) -> Result<(), RuntimeError> {
    Err(RuntimeError::NotImplemented)
}

/// Starts a container process (`<current_exe> container-init <dir>/<name>.json`). The child dies
/// with the agent (PR_SET_PDEATHSIG) and its pid is recorded for `cleanup_host`.
pub fn spawn_container(
    _sandbox: &Sandbox,
    _name: &str,
    _spec: &ContainerSpec,
) -> Result<tokio::process::Child, RuntimeError> {
    Err(RuntimeError::NotImplemented)
}

/// Runs `argv` inside a container's namespaces and mounts (as `spec` describes them), bounded by
/// `timeout`; output is captured, not logged.
pub async fn exec_in_container(
    _sandbox: &Sandbox,
    _spec: &ContainerSpec,
    _argv: &[String],
    _timeout: Duration,
) -> Result<ExecOutput, RuntimeError> {
    Err(RuntimeError::NotImplemented)
}

/// Removes every host resource of this cluster the runtime may have left: container processes,
/// mounts under the state dir's `nodes/`, network namespaces with the cluster prefix, veths,
/// the bridge. Idempotent.
pub fn cleanup_host(_state: &ClusterState) -> Result<(), RuntimeError> {
    Err(RuntimeError::NotImplemented)
}

/// `container-init`: enter the sandbox's network namespace, new mount + UTS namespaces, private
/// propagation, bind mounts, hostname, uid/gid, chdir, then exec. Returns only on error.
pub fn container_init(_spec_path: &Path) -> RuntimeError {
    RuntimeError::NotImplemented
}
