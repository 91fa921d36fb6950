//! The node agent's host runtime: pod sandboxes (network namespace, veth on the cluster bridge,
//! pod IP) and containers (an image's program or a host program in its own mount and UTS namespace, inside the pod's
//! network namespace, with bind-mounted volumes). Knows nothing about the Kubernetes API.
//!
//! How a container is built (see `init.rs`): `spawn_container` writes `<sandbox.dir>/<name>.json`
//! and starts `<init program> container-init <json>` (the init program is `$LOCALCLUSTER_BIN` if
//! set, else the current executable). That fresh, single-threaded process enters the pod's network
//! namespace, unshares mount + UTS + IPC namespaces, makes `/` rprivate and builds a private root:
//! a tmpfs mounted on `<sandbox.dir>/<name>.root` (only inside the container's mount namespace)
//! holds the upper and work dirs of an overlayfs whose lower dir is the image's root
//! (`ContainerSpec::image_root`, a stored image's flattened layers) or, for the host-program
//! images, the host's `/`; writes outside volumes (`mkdir /data`, `/var/run/etcd`) never touch
//! the lower dir. Fresh `/proc`, `/sys` (read-only), `/run` and a private `/dev` are
//! mounted in it (a small tmpfs with the host's null, zero, full, random, urandom and tty bound
//! into it, a new devpts instance, `ptmx -> pts/ptmx`, `/dev/shm`, `/dev/mqueue`, the
//! `fd`/`stdin`/`stdout`/`stderr` symlinks: what a container runtime gives), then `pivot_root`,
//! then the volumes are bind-mounted (from file descriptors opened before the pivot; a missing
//! file target such as `/dev/termination-log` is created inside the container's root, never on
//! the host), then the old root is detached, so the container's mount namespace pins no host
//! mount but its own volumes. Then hostname, the working dir, the read-only remount of the root
//! (`readOnlyRootFilesystem`), the capability bounding set cut and inheritable/ambient sets
//! cleared, uid/gid, the permitted/effective capabilities (see `confine.rs` and
//! [`ProcessSecurity`]), no_new_privs, chdir, signal dispositions reset, and `execve` with
//! exactly the given environment. An exec into a running container gets the same
//! credentials, capabilities and no_new_privs.
//!
//! Process lifetime: every child (container or exec) is forked from one dedicated, never-exiting
//! thread of the agent process and gets `PR_SET_PDEATHSIG(SIGKILL)` (the kernel's "parent died"
//! signal is bound to the forking *thread*: forking from a tokio blocking thread would kill
//! children when that thread idles out). An exec dies with the agent. A container does not:
//! once its namespaces and root are built its init forks, the child execs the program and the
//! init stays as its supervisor (`supervise.rs`), which drops the parent-death signal, waits for
//! the program and records its exit code in `<name>.exit`. So containers outlive a killed agent,
//! and an agent started again re-adopts them ([`recorded_container`], [`wait_recorded`],
//! [`cleanup_host_except`] for what no live pod owns). Each child calls `setsid()`, so its pid is
//! also its process group: [`signal_container`] signals the group (program and supervisor).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::ClusterState;

mod confine;
mod host;
mod init;
mod net;
mod spawn;
mod supervise;

/// Environment variable naming the program that implements `container-init` (default: the
/// current executable, i.e. `localcluster`). Tests set it to their own binary.
pub const INIT_PROGRAM_ENV: &str = "LOCALCLUSTER_BIN";

/// The subcommand of the init program that runs [`container_init`].
pub const INIT_SUBCOMMAND: &str = "container-init";

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Sys {
        what: String,
        source: nix::errno::Errno,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid container init spec: {source}")]
    Spec {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("no free veth name with prefix {0} after several attempts")]
    NoFreeVethName(String),
    #[error("spawning a container needs a tokio runtime context")]
    NoTokioRuntime,
    #[error("the runtime's process-spawning thread is gone")]
    SpawnerGone,
    #[error("a helper thread ({0}) panicked")]
    ThreadPanicked(&'static str),
    #[error("command did not finish within {0:?} and was killed")]
    ExecTimeout(Duration),
    #[error("container-init must run in a single-threaded process, found {0} threads")]
    NotSingleThreaded(usize),
    #[error("the agent process (pid {0}) that started this container is gone")]
    ParentGone(u32),
    #[error("executable {program:?} not found in PATH {path:?}")]
    ProgramNotFound { program: String, path: String },
    #[error("capabilities: cannot {what}: {detail}")]
    Caps { what: String, detail: String },
    #[error("cleanup left {0} problem(s); see the log")]
    Cleanup(usize),
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
    /// A program without `/` is looked up in the `PATH` of `env` (or a default PATH).
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
    /// Capabilities, no_new_privs, read-only root (absent in older specs: nothing confined).
    #[serde(default)]
    pub security: ProcessSecurity,
    /// Root filesystem of a stored image ([`crate::images`]): the lower dir of the container's
    /// overlay root. `None`: the host's `/` (host-program images).
    #[serde(default)]
    pub image_root: Option<PathBuf>,
    /// The uid the image's config asks for (its `User`, resolved in the image's `/etc/passwd`;
    /// 0 when it names none), for `runAsNonRoot`. `None` for host-program images.
    #[serde(default)]
    pub image_uid: Option<u32>,
}

/// How a container process is confined besides its uid and gid (applied by `container-init`,
/// for the container and for every exec into it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessSecurity {
    /// `CAP_*` names. `Some`: the bounding set is exactly these (those the kernel supports);
    /// a process running as uid 0 gets them as its permitted and effective sets, any other uid
    /// ends with empty sets (no file capabilities, no ambient ones); inheritable and ambient
    /// sets are cleared, as containerd does since CVE-2022-24769. `None`: the process keeps
    /// the init's capabilities (all of root's).
    pub capabilities: Option<Vec<String>>,
    /// PR_SET_NO_NEW_PRIVS before exec (`allowPrivilegeEscalation: false`).
    pub no_new_privs: bool,
    /// The container's root filesystem is remounted read-only (its volumes, `/dev`, `/proc`,
    /// `/run` keep their own modes).
    pub read_only_root: bool,
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
    /// The exit status, or `128 + signal` when the command was killed by a signal.
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Creates the cluster bridge if missing (address `state.bridge_ip()`/24), a network namespace
/// named `state.netns_prefix() + key`, a veth pair (host end on the bridge, pod end `eth0` with `ip`,
/// a route for the service range via the bridge, `lo` up) and the scratch dir `dir`.
///
/// `ip` must be a host address of the cluster's pod network (198.18.N.2 to .254). Safe to call
/// concurrently (threads or processes): host changes are serialized by a flock on
/// `<state.dir>/runtime.lock`. A stale namespace of the same name is replaced.
pub fn create_sandbox(
    state: &ClusterState,
    key: &str,
    ip: Ipv4Addr,
    dir: &Path,
) -> Result<Sandbox, RuntimeError> {
    net::create_sandbox(state, key, ip, dir)
}

/// Creates the cluster bridge if missing and puts the `kubernetes` Service's ClusterIP
/// (`state.kubernetes_service_ip()`) on it as a /32: the address pods reach the API server at
/// (the agent listens there, see `agent::apiproxy`). Sandboxes route the service range via the
/// bridge. Idempotent; serialized with sandbox creation.
pub fn prepare_service_address(state: &ClusterState) -> Result<(), RuntimeError> {
    net::prepare_service_address(state)
}

/// Deletes the sandbox's veth and network namespace. Idempotent. Leaves `dir` (logs) in place.
/// Processes still inside the namespace keep it alive until they exit; kill them first.
pub fn destroy_sandbox(sandbox: &Sandbox) -> Result<(), RuntimeError> {
    net::destroy_sandbox(sandbox)
}

/// Starts a container process (`<init program> container-init <dir>/<name>.json`). The child
/// outlives the agent (see the module docs) and its pid is recorded for `cleanup_host` in
/// `<dir>/<name>.pid`. stdout and stderr are appended to `spec.log_path`; stdin is /dev/null.
/// The returned child is not killed on drop. Must be called within a tokio runtime.
/// Errors of the init phase itself (bad mount, program not found) are reported by the init
/// program on stderr, i.e. in the log, and as its exit status.
pub fn spawn_container(
    sandbox: &Sandbox,
    name: &str,
    spec: &ContainerSpec,
) -> Result<tokio::process::Child, RuntimeError> {
    spawn::spawn_container(sandbox, name, spec)
}

/// Runs `argv` inside a container's namespaces and mounts (as `spec` describes them), bounded by
/// `timeout`; output is captured, not logged.
///
/// If a container of `sandbox` started with this very `spec` is running, the command joins its
/// network, UTS, IPC and mount namespaces (as `kubectl exec` does: it sees the container's files).
/// (A container still in its init phase is given up to 2 s to exec its program first.)
/// Otherwise it gets fresh namespaces built from `spec`, like a new container would.
/// On timeout the command's process group is killed with SIGKILL and
/// [`RuntimeError::ExecTimeout`] is returned. After the command exits, whatever it left running
/// in its process group is killed too. Output is capped at 1 MiB per stream (the rest is read and
/// discarded).
pub async fn exec_in_container(
    sandbox: &Sandbox,
    spec: &ContainerSpec,
    argv: &[String],
    timeout: Duration,
) -> Result<ExecOutput, RuntimeError> {
    spawn::exec_in_container(sandbox, spec, argv, timeout).await
}

/// Removes every host resource of this cluster the runtime may have left: container processes,
/// mounts under the state dir's `nodes/`, network namespaces with the cluster prefix, veths,
/// the bridge. Idempotent.
///
/// Processes: those recorded in `*.pid` files under `nodes/` whose command line still shows
/// `container-init <json>` or the recorded argv, with their process groups, and every process
/// inside one of the cluster's network namespaces: SIGKILL. Mounts under
/// `nodes/<node>/volumes/` are left to the volume provisioner. Problems are logged and the other
/// steps still run; the result then is [`RuntimeError::Cleanup`].
pub fn cleanup_host(state: &ClusterState) -> Result<(), RuntimeError> {
    host::cleanup_host(state, &Keep::default())
}

/// [`cleanup_host`] for an agent started again: everything but the pod dirs of `keep` (their
/// processes, mounts) and the sandboxes recorded in them (network namespaces, veths; the bridge
/// stays while any pod is kept).
pub fn cleanup_host_except(state: &ClusterState, keep: &Keep) -> Result<(), RuntimeError> {
    host::cleanup_host(state, keep)
}

/// What [`cleanup_host_except`] leaves alone: pods whose containers an agent re-adopts.
#[derive(Debug, Default)]
pub struct Keep {
    /// Pod dirs, as given and canonical.
    dirs: Vec<PathBuf>,
    netns: std::collections::BTreeSet<String>,
    veths: std::collections::BTreeSet<String>,
}

impl Keep {
    /// Keeps the pod dirs `dirs` and the sandboxes their init specs record.
    pub fn pods(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut keep = Keep::default();
        for dir in dirs {
            for sb in host::recorded_sandboxes(&dir) {
                keep.netns.insert(sb.netns);
                keep.veths.insert(sb.host_veth);
            }
            if let Ok(canonical) = std::fs::canonicalize(&dir) {
                keep.dirs.push(canonical);
            }
            keep.dirs.push(dir);
        }
        keep
    }

    fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    fn has_path(&self, p: &Path) -> bool {
        self.dirs.iter().any(|d| p.starts_with(d))
    }
}

/// `container-init`: enter the sandbox's network namespace, new mount + UTS namespaces, private
/// propagation, bind mounts, hostname, uid/gid, chdir, then exec. Returns only on error.
/// Must be called in a fresh single-threaded process (before any tokio runtime is built).
pub fn container_init(spec_path: &Path) -> RuntimeError {
    init::container_init(spec_path)
}

/// The `CAP_*` names of every capability the running kernel supports (what a privileged
/// container gets).
pub fn supported_capabilities() -> Vec<String> {
    let mut names: Vec<String> = caps::runtime::thread_all_supported()
        .iter()
        .map(|c| c.to_string())
        .collect();
    names.sort();
    names
}

/// Sends `signal` to a container started by [`spawn_container`] and to every process of its
/// process group (its children, unless they made their own). `ESRCH` (already gone) is not an
/// error.
pub fn signal_container(pid: u32, signal: nix::sys::signal::Signal) -> Result<(), RuntimeError> {
    spawn::signal_group(pid, signal)
}

/// A container that [`spawn_container`] started in pod dir `dir` (found by an agent started
/// again).
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub sandbox: Sandbox,
    pub spec: ContainerSpec,
    /// Its supervisor (the process group), see `supervise.rs`.
    pub pid: u32,
    /// The exit code its supervisor recorded, once the program has ended.
    pub exit_code: Option<i32>,
    /// The supervisor is alive.
    pub running: bool,
}

/// The container `name` recorded in pod dir `dir` (its init spec and pid file), if any.
pub fn recorded_container(dir: &Path, name: &str) -> Option<Recorded> {
    let json = dir.join(format!("{name}.json"));
    let init: init::InitSpec = serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()?;
    let pid = std::fs::read_to_string(dir.join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()?;
    let running = host::process_is_container(pid, &json, &[], Some(&init.sandbox.netns));
    Some(Recorded {
        exit_code: supervise::recorded_exit(&json),
        sandbox: init.sandbox,
        spec: init.spec,
        pid,
        running,
    })
}

/// Whether a container recorded in pod dir `dir` still runs.
pub fn any_recorded_running(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".pid")?.to_string();
            (!name.starts_with('.')).then_some(name)
        })
        .any(|name| recorded_container(dir, &name).is_some_and(|r| r.running))
}

/// The sandboxes recorded by the containers started in pod dir `dir`.
pub fn recorded_sandboxes(dir: &Path) -> Vec<Sandbox> {
    host::recorded_sandboxes(dir)
}

/// Waits (polling) until the recorded container `name` of `dir` (supervisor `pid`) has ended;
/// returns the exit code its supervisor recorded (`None`: it was killed before it could).
pub async fn wait_recorded(dir: &Path, name: &str, pid: u32) -> Option<i32> {
    let json = dir.join(format!("{name}.json"));
    let netns = recorded_container(dir, name).map(|r| r.sandbox.netns);
    while host::process_is_container(pid, &json, &[], netns.as_deref()) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    supervise::recorded_exit(&json)
}

/// Where `spawn_container` records the pid of container `name` of `sandbox`.
pub fn pid_file(sandbox: &Sandbox, name: &str) -> PathBuf {
    sandbox.dir.join(format!("{name}.pid"))
}

/// A random number (for unique host names), from the std hasher's per-process random keys.
fn random_u64(salt: &str) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    RandomState::new().hash_one((salt, nanos, std::process::id()))
}

/// Names that become file names or interface names: ASCII letters, digits, `.`, `_`, `-`, not
/// starting with `.` or `-`.
fn validate_name(what: &'static str, value: &str, max_len: usize) -> Result<(), RuntimeError> {
    let invalid = |reason| RuntimeError::Invalid {
        what,
        value: value.to_owned(),
        reason,
    };
    if value.is_empty() {
        return Err(invalid("empty"));
    }
    if value.len() > max_len {
        return Err(invalid("too long"));
    }
    if value.starts_with('.') || value.starts_with('-') {
        return Err(invalid("must not start with '.' or '-'"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(invalid(
            "only ASCII letters, digits, '.', '_' and '-' are allowed",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("key", "0b5e-1c2d.etcd_0", 64).is_ok());
        for bad in ["", ".x", "-x", "a/b", "a b", "é", "x\0"] {
            assert!(validate_name("key", bad, 64).is_err(), "{bad:?}");
        }
        assert!(validate_name("key", "abcdef", 5).is_err());
    }

    #[test]
    fn random_numbers_differ() {
        assert_ne!(random_u64("a"), random_u64("a"));
    }
}
