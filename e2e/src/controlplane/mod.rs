//! The local control plane: `up` starts etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler (and the node agent) in the background for one state directory; `down` stops
//! them and checks that nothing is left.
//!
//! Every process runs detached (its own session, stdin `/dev/null`, stdout and stderr appended to
//! `DIR/logs/<name>.log`) with its pid in `DIR/pids/<name>.pid`. A recorded pid is only ever
//! signalled after checking that the process's command line names the state dir (pid reuse).
//!
//! Two clusters can run at once: ports are free loopback ports chosen at `up`, and the third octet
//! N of the pod range 198.18.N.0/24 (and of the service range 198.19.N.0/24) is reserved with an
//! exclusive-create file `/run/storage-migrator/nets/N` holding the state dir and cluster id.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pki::PkiError;
use crate::state::StateError;

mod args;
mod deps;
mod down;
mod identity;
mod kubeconfig;
pub(crate) use kubeconfig::write_private;
mod leftovers;
mod process;
mod up;

pub use args::{apiserver_args, controller_manager_args, etcd_args, scheduler_args};
pub use deps::install_deps;
pub use down::{DownReport, down};
pub use identity::{
    NetReservation, choose_ports, host_nets_in_use, parse_reservation, pick_net, random_id,
    release_net, reservation_content, reserve_net,
};
pub use kubeconfig::{client_from_kubeconfig, render_kubeconfig};
pub use leftovers::{leftovers, listening_sockets, loops_under};
pub use process::{cmdline_names_dir, log_path, pid_path, running_processes};
pub use up::{
    AgentRestart, UpOptions, UpReport, not_ready_nodes, preflight, restart_agent,
    restart_apiserver, up,
};

/// Process names (log file `logs/<name>.log`, pid file `pids/<name>.pid`).
pub const ETCD: &str = "etcd";
pub const APISERVER: &str = "kube-apiserver";
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";
pub const SCHEDULER: &str = "kube-scheduler";
pub const AGENT: &str = "agent";
/// The order in which `down` stops the processes.
pub const STOP_ORDER: [&str; 5] = [AGENT, SCHEDULER, CONTROLLER_MANAGER, APISERVER, ETCD];

/// Component kubeconfig names (see [`ClusterState::component_kubeconfig`]).
pub const KUBECONFIG_CONTROLLER_MANAGER: &str = "controller-manager";
pub const KUBECONFIG_SCHEDULER: &str = "scheduler";
pub const KUBECONFIG_AGENT: &str = "agent";

/// Where network reservations live (tmpfs: cleared at reboot, as are the networks).
pub const NETS_DIR: &str = "/run/storage-migrator/nets";
/// The script that installs the dependencies and prints the server binaries' directory.
pub const INSTALL_DEPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/install-deps.sh");
/// The Kubernetes release of the control plane (`scripts/install-deps.sh` builds it; the node
/// agent registers its nodes as kubelets of the same version).
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The controllers the controller-manager runs: all but nodelifecycle, so that nodes never go
/// `Unknown` and pods are never evicted when the node agent is slow; the agent removes the
/// `node.kubernetes.io/not-ready` taint that admission puts on new nodes.
pub const CONTROLLERS: &str = "*,-nodelifecycle";
/// Issuer and audience of service-account tokens.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Entries `up` creates in a state dir; a dir holding anything else and no `cluster.json` is
/// refused, so that a mistyped `--state-dir` never has its files replaced.
const OWN_ENTRIES: [&str; 11] = [
    "cluster.json",
    "runtime.lock",
    "kubeconfig",
    "kubeconfigs",
    "pki",
    "etcd",
    "logs",
    "pids",
    "nodes",
    "volumes",
    "images",
];

const ETCD_TIMEOUT: Duration = Duration::from_secs(60);
const APISERVER_TIMEOUT: Duration = Duration::from_secs(180);
const CONTROLLERS_TIMEOUT: Duration = Duration::from_secs(120);
const AGENT_TIMEOUT: Duration = Duration::from_secs(180);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const AGENT_GRACE: Duration = Duration::from_secs(30);
const COMPONENT_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(
        "a cluster is still running in {dir} ({running}); run `localcluster down --state-dir {dir}` first",
        dir = dir.display()
    )]
    AlreadyRunning { dir: PathBuf, running: String },
    #[error(
        "{dir} still holds resources of an earlier cluster ({left}); run `localcluster down --state-dir {dir}` first",
        dir = dir.display()
    )]
    Leftovers { dir: PathBuf, left: String },
    #[error(
        "{dir} is not empty and holds no cluster.json (found {entry:?}): refusing to use it as a state dir",
        dir = dir.display()
    )]
    ForeignDir { dir: PathBuf, entry: String },
    #[error("installing dependencies with {script} failed: {reason}", script = script.display())]
    InstallDeps { script: PathBuf, reason: String },
    #[error("cannot start {component} ({program}): {source}", program = program.display())]
    Spawn {
        component: &'static str,
        program: PathBuf,
        source: io::Error,
    },
    #[error("{component} exited during startup ({status}); see {log}", log = log.display())]
    Exited {
        component: &'static str,
        status: String,
        log: PathBuf,
    },
    #[error(
        "{component}: {what} not reached within {secs}s (last check: {last}); see {log}",
        secs = timeout.as_secs(),
        log = log.display()
    )]
    Timeout {
        component: &'static str,
        what: &'static str,
        timeout: Duration,
        last: String,
        log: PathBuf,
    },
    #[error("interrupted by a signal")]
    Interrupted,
    #[error("no free loopback TCP ports: {0}")]
    Ports(#[source] io::Error),
    #[error(
        "no free network: every N in 1..=250 of 198.18.N.0/24 is reserved in {NETS_DIR} or present on the host"
    )]
    NoFreeNet,
    #[error("cannot run `ip -o -4 addr show`: {0}")]
    IpAddr(#[source] io::Error),
    #[error("cannot render a kubeconfig: {0}")]
    Render(#[source] serde_norway::Error),
    #[error("cannot load kubeconfig {path}: {source}", path = path.display())]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

type Result<T, E = ControlPlaneError> = std::result::Result<T, E>;

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ControlPlaneError {
    let path = path.to_path_buf();
    move |source| ControlPlaneError::Io { what, path, source }
}

/// A cluster identity for unit tests of the control plane modules.
#[cfg(test)]
mod test_support {
    use std::path::{Path, PathBuf};

    use crate::state::ClusterState;

    pub(super) fn sample(dir: &Path) -> ClusterState {
        ClusterState {
            id: "0a1b2c".into(),
            dir: dir.to_path_buf(),
            bin_dir: PathBuf::from("/bin"),
            etcd_client_port: 30001,
            etcd_peer_port: 30002,
            apiserver_port: 30003,
            controller_manager_port: 30004,
            scheduler_port: 30005,
            kubelet_ports: vec![30006, 30007, 30008],
            pod_net: 42,
            service_net: 42,
        }
    }
}
