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

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tracing::{info, warn};

use crate::mountinfo;
use crate::pki::{self, CertKey, PkiError};
use crate::state::{ClusterState, NODE_NAMES, StateError};

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
/// Debian's etcd 3.4 (package `etcd-server`).
pub const ETCD_BIN: &str = "/usr/bin/etcd";
/// The controllers the controller-manager runs: all but nodelifecycle, so that nodes never go
/// `Unknown` and pods are never evicted when the node agent is slow; the agent removes the
/// `node.kubernetes.io/not-ready` taint that admission puts on new nodes.
pub const CONTROLLERS: &str = "*,-nodelifecycle";
/// Issuer and audience of service-account tokens.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Entries `up` creates in a state dir; a dir holding anything else and no `cluster.json` is
/// refused, so that a mistyped `--state-dir` never has its files replaced.
const OWN_ENTRIES: [&str; 10] = [
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

// ---------------------------------------------------------------------------------------------
// dependencies

/// Runs `install-deps.sh` (progress passed through to our stderr) and returns the directory
/// holding kube-apiserver, kube-controller-manager and kube-scheduler (its stdout's last line).
pub fn install_deps() -> Result<PathBuf> {
    let script = PathBuf::from(INSTALL_DEPS);
    let fail = |reason: String| ControlPlaneError::InstallDeps {
        script: script.clone(),
        reason,
    };
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!("{} (its progress is above)", out.status)));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bin_dir = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| fail("it printed no directory".into()))?;
    for b in [APISERVER, CONTROLLER_MANAGER, SCHEDULER] {
        if !bin_dir.join(b).is_file() {
            return Err(fail(format!("{} has no {b}", bin_dir.display())));
        }
    }
    Ok(bin_dir)
}

// ---------------------------------------------------------------------------------------------
// identity: id, ports, networks

/// A random 6-hex-char cluster id.
pub fn random_id() -> Result<String> {
    let mut buf = [0u8; 3];
    let path = Path::new("/dev/urandom");
    let mut f = File::open(path).map_err(io_err("open", path))?;
    io::Read::read_exact(&mut f, &mut buf).map_err(io_err("read", path))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// `n` distinct free TCP ports on 127.0.0.1: bound all at once on port 0 (so the kernel gives
/// distinct ones), released, then each checked bindable again.
pub fn choose_ports(n: usize) -> io::Result<Vec<u16>> {
    let mut last_err = None;
    for _ in 0..5 {
        let listeners = (0..n)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<io::Result<Vec<_>>>()?;
        let ports = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<io::Result<Vec<_>>>()?;
        drop(listeners);
        match ports
            .iter()
            .try_for_each(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).map(drop))
        {
            Ok(()) => return Ok(ports),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("no ports")))
}

/// Third octets N of every IPv4 address in 198.18.N.0/24 found in `ip -o -4 addr show` output.
pub fn host_nets_in_use(ip_addr_output: &str) -> BTreeSet<u8> {
    let mut used = BTreeSet::new();
    for line in ip_addr_output.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w != "inet" {
                continue;
            }
            let Some(addr) = words.next() else { break };
            let ip = addr.split('/').next().unwrap_or(addr);
            if let Ok(ip) = ip.parse::<Ipv4Addr>() {
                let o = ip.octets();
                if o[0] == 198 && o[1] == 18 {
                    used.insert(o[2]);
                }
            }
        }
    }
    used
}

/// The first N in 1..=250 not in `host_used` for which `try_reserve(N)` succeeds.
pub fn pick_net<E>(
    host_used: &BTreeSet<u8>,
    mut try_reserve: impl FnMut(u8) -> Result<bool, E>,
) -> Result<Option<u8>, E> {
    for n in 1..=250u8 {
        if host_used.contains(&n) {
            continue;
        }
        if try_reserve(n)? {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// Content of a reservation file.
pub fn reservation_content(dir: &Path, id: &str) -> String {
    format!("{}\n{}\n", dir.display(), id)
}

/// `(state dir, cluster id)` recorded in a reservation file.
pub fn parse_reservation(content: &str) -> Option<(PathBuf, String)> {
    let mut lines = content.lines();
    let dir = lines.next().filter(|d| d.starts_with('/'))?;
    let id = lines.next().filter(|i| !i.is_empty())?;
    Some((PathBuf::from(dir), id.to_string()))
}

/// A reservation is stale when the cluster it names is gone: its dir has no readable
/// cluster.json, or one with another id.
fn reservation_is_stale(content: &str) -> bool {
    match parse_reservation(content) {
        None => true,
        Some((dir, id)) => match ClusterState::load(&dir) {
            Ok(s) => s.id != id,
            Err(_) => true,
        },
    }
}

/// The reserved network number, and the lock serialising reservations: hold it until the
/// cluster.json naming this reservation is saved, so that no one sees the reservation as stale.
pub struct NetReservation {
    pub net: u8,
    _lock: Flock<File>,
}

/// Reserves a network number for the cluster `id` in `dir`.
pub fn reserve_net(dir: &Path, id: &str) -> Result<NetReservation> {
    let nets = Path::new(NETS_DIR);
    std::fs::create_dir_all(nets).map_err(io_err("create", nets))?;
    let lock_path = nets.join(".lock");
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    let lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| io_err("lock", &lock_path)(e.into()))?;
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(ControlPlaneError::IpAddr)?;
    if !out.status.success() {
        return Err(ControlPlaneError::IpAddr(io::Error::other(format!(
            "{}",
            out.status
        ))));
    }
    let host_used = host_nets_in_use(&String::from_utf8_lossy(&out.stdout));
    let content = reservation_content(dir, id);
    let net = pick_net(&host_used, |n| {
        try_reserve_one(&nets.join(n.to_string()), &content)
    })?
    .ok_or(ControlPlaneError::NoFreeNet)?;
    Ok(NetReservation { net, _lock: lock })
}

fn try_reserve_one(path: &Path, content: &str) -> Result<bool> {
    for _ in 0..2 {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
        {
            Ok(mut f) => {
                f.write_all(content.as_bytes())
                    .map_err(io_err("write", path))?;
                return Ok(true);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let held = match std::fs::read_to_string(path) {
                    Ok(c) => c,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err("read", path)(e)),
                };
                if !reservation_is_stale(&held) {
                    return Ok(false);
                }
                info!(path = %path.display(), "removing stale network reservation");
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("remove", path)(e)),
                }
            }
            Err(e) => return Err(io_err("create", path)(e)),
        }
    }
    Ok(false)
}

/// Releases `state`'s network reservation if it is still its own.
pub fn release_net(state: &ClusterState) {
    let path = Path::new(NETS_DIR).join(state.pod_net.to_string());
    let Ok(content) = std::fs::read_to_string(&path) else {
        return;
    };
    if parse_reservation(&content) == Some((state.dir.clone(), state.id.clone()))
        && let Err(e) = std::fs::remove_file(&path)
    {
        warn!(path = %path.display(), "cannot release network reservation: {e}");
    }
}

/// Chooses the cluster's identity, reserves its network and saves it to `DIR/cluster.json`.
fn choose_identity(dir: &Path, bin_dir: &Path) -> Result<ClusterState> {
    let id = random_id()?;
    let ports = choose_ports(8).map_err(ControlPlaneError::Ports)?;
    let reservation = reserve_net(dir, &id)?;
    let state = ClusterState {
        id,
        dir: dir.to_path_buf(),
        bin_dir: bin_dir.to_path_buf(),
        etcd_client_port: ports[0],
        etcd_peer_port: ports[1],
        apiserver_port: ports[2],
        controller_manager_port: ports[3],
        scheduler_port: ports[4],
        kubelet_ports: ports[5..8].to_vec(),
        pod_net: reservation.net,
        service_net: reservation.net,
    };
    let saved = state.save();
    if saved.is_err() {
        release_net(&state);
    }
    saved?;
    drop(reservation);
    Ok(state)
}

// ---------------------------------------------------------------------------------------------
// kubeconfigs

#[derive(Serialize)]
struct KubeconfigDoc<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    clusters: [Named<'a, ClusterEntry<'a>>; 1],
    users: [Named<'a, UserEntry>; 1],
    contexts: [Named<'a, ContextEntry<'a>>; 1],
    #[serde(rename = "current-context")]
    current_context: &'a str,
}
#[derive(Serialize)]
struct Named<'a, T> {
    name: &'a str,
    #[serde(flatten)]
    value: T,
}
#[derive(Serialize)]
struct ClusterEntry<'a> {
    cluster: ClusterFields<'a>,
}
#[derive(Serialize)]
struct ClusterFields<'a> {
    server: &'a str,
    #[serde(rename = "certificate-authority-data")]
    certificate_authority_data: String,
}
#[derive(Serialize)]
struct UserEntry {
    user: UserFields,
}
#[derive(Serialize)]
struct UserFields {
    #[serde(rename = "client-certificate-data")]
    client_certificate_data: String,
    #[serde(rename = "client-key-data")]
    client_key_data: String,
}
#[derive(Serialize)]
struct ContextEntry<'a> {
    context: ContextFields<'a>,
}
#[derive(Serialize)]
struct ContextFields<'a> {
    cluster: &'a str,
    user: &'a str,
}

/// A kubeconfig for `server` with the CA and the client certificate embedded (it stays valid
/// when copied). Cluster and context are named `name`, the user `user`.
pub fn render_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    client: &CertKey,
) -> Result<String> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let doc = KubeconfigDoc {
        api_version: "v1",
        kind: "Config",
        clusters: [Named {
            name,
            value: ClusterEntry {
                cluster: ClusterFields {
                    server,
                    certificate_authority_data: b64(ca_pem),
                },
            },
        }],
        users: [Named {
            name: user,
            value: UserEntry {
                user: UserFields {
                    client_certificate_data: b64(&client.cert_pem),
                    client_key_data: b64(&client.key_pem),
                },
            },
        }],
        contexts: [Named {
            name,
            value: ContextEntry {
                context: ContextFields {
                    cluster: name,
                    user,
                },
            },
        }],
        current_context: name,
    };
    serde_norway::to_string(&doc).map_err(ControlPlaneError::Render)
}

fn write_private(path: &Path, content: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", path)(e)),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    f.write_all(content.as_bytes())
        .map_err(io_err("write", path))
}

/// Writes `DIR/kubeconfig` (admin) and the component kubeconfigs.
fn write_kubeconfigs(state: &ClusterState, bundle: &pki::Bundle) -> Result<()> {
    let name = format!("localcluster-{}", state.id);
    let server = state.apiserver_url();
    let ca = &bundle.ca.cert_pem;
    write_private(
        &state.kubeconfig(),
        &render_kubeconfig(&name, &server, ca, "kubernetes-admin", &bundle.admin)?,
    )?;
    for (component, user, ck) in [
        (
            KUBECONFIG_CONTROLLER_MANAGER,
            "system:kube-controller-manager",
            &bundle.controller_manager,
        ),
        (
            KUBECONFIG_SCHEDULER,
            "system:kube-scheduler",
            &bundle.scheduler,
        ),
        (KUBECONFIG_AGENT, "system:node-agent", &bundle.agent),
    ] {
        write_private(
            &state.component_kubeconfig(component),
            &render_kubeconfig(&name, &server, ca, user, ck)?,
        )?;
    }
    Ok(())
}

/// A client for the cluster of a kubeconfig file (e.g. `state.kubeconfig()`).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(path).map_err(|source| ControlPlaneError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| ControlPlaneError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    kube::Client::try_from(config).map_err(ControlPlaneError::Client)
}

// ---------------------------------------------------------------------------------------------
// component command lines

fn flag(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

fn path_flag(name: &str, path: &Path) -> String {
    format!("--{name}={}", path.display())
}

pub fn etcd_args(state: &ClusterState) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", state.etcd_client_port);
    let peer = format!("http://127.0.0.1:{}", state.etcd_peer_port);
    vec![
        flag("name", "default"),
        path_flag("data-dir", &state.dir.join("etcd")),
        flag("listen-client-urls", &client),
        flag("advertise-client-urls", &client),
        flag("listen-peer-urls", &peer),
        flag("initial-advertise-peer-urls", &peer),
        flag("initial-cluster", format!("default={peer}")),
        flag(
            "initial-cluster-token",
            format!("localcluster-{}", state.id),
        ),
        flag("initial-cluster-state", "new"),
        flag("logger", "zap"),
        flag("log-outputs", "stderr"),
    ]
}

pub fn apiserver_args(state: &ClusterState) -> Vec<String> {
    let pki_dir = state.pki_dir();
    let cert = |stem| pki::cert_path(state, stem);
    let key = |stem| pki::key_path(state, stem);
    vec![
        flag(
            "etcd-servers",
            format!("http://127.0.0.1:{}", state.etcd_client_port),
        ),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", state.apiserver_port),
        flag("insecure-port", 0),
        // The advertise address is what the apiserver publishes as the endpoint of the
        // `kubernetes` Service. 127.0.0.1 does not work: the apiserver then logs `Endpoints
        // "kubernetes" is invalid: ... may not be in the loopback range (127.0.0.0/8)` every 10 s
        // and the Service has no endpoints (seen on 1.20.2). Without the flag it publishes the
        // host's default-route address (not ours), and refuses to start on a host without a
        // default route ("Unable to find suitable network address"). The cluster's own bridge
        // address 198.18.N.1 is accepted (checked: the endpoint is 198.18.N.1:<port>), is unique
        // per cluster and needs no interface to exist.
        flag("advertise-address", state.bridge_ip()),
        path_flag("cert-dir", &pki_dir.join(APISERVER)),
        path_flag("tls-cert-file", &cert(pki::APISERVER)),
        path_flag("tls-private-key-file", &key(pki::APISERVER)),
        path_flag("client-ca-file", &cert(pki::CA)),
        flag("authorization-mode", "Node,RBAC"),
        path_flag(
            "service-account-key-file",
            &pki::service_account_pub_path(state),
        ),
        path_flag(
            "service-account-signing-key-file",
            &key(pki::SERVICE_ACCOUNT),
        ),
        flag("service-account-issuer", SERVICE_ACCOUNT_ISSUER),
        flag("api-audiences", SERVICE_ACCOUNT_ISSUER),
        flag("service-cluster-ip-range", state.service_cidr()),
        path_flag(
            "kubelet-client-certificate",
            &cert(pki::APISERVER_KUBELET_CLIENT),
        ),
        path_flag("kubelet-client-key", &key(pki::APISERVER_KUBELET_CLIENT)),
        flag("kubelet-preferred-address-types", "InternalIP"),
        flag("allow-privileged", "true"),
        flag("profiling", "false"),
    ]
}

pub fn controller_manager_args(state: &ClusterState) -> Vec<String> {
    let kubeconfig = state.component_kubeconfig(KUBECONFIG_CONTROLLER_MANAGER);
    vec![
        path_flag("kubeconfig", &kubeconfig),
        path_flag("authentication-kubeconfig", &kubeconfig),
        path_flag("authorization-kubeconfig", &kubeconfig),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", state.controller_manager_port),
        flag("port", 0),
        path_flag("cert-dir", &state.pki_dir().join(CONTROLLER_MANAGER)),
        flag("use-service-account-credentials", "true"),
        path_flag(
            "service-account-private-key-file",
            &pki::key_path(state, pki::SERVICE_ACCOUNT),
        ),
        path_flag("root-ca-file", &pki::cert_path(state, pki::CA)),
        path_flag("cluster-signing-cert-file", &pki::cert_path(state, pki::CA)),
        path_flag("cluster-signing-key-file", &pki::key_path(state, pki::CA)),
        flag("controllers", CONTROLLERS),
        flag("leader-elect", "false"),
        flag("profiling", "false"),
    ]
}

pub fn scheduler_args(state: &ClusterState) -> Vec<String> {
    let kubeconfig = state.component_kubeconfig(KUBECONFIG_SCHEDULER);
    vec![
        path_flag("kubeconfig", &kubeconfig),
        path_flag("authentication-kubeconfig", &kubeconfig),
        path_flag("authorization-kubeconfig", &kubeconfig),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", state.scheduler_port),
        flag("port", 0),
        path_flag("cert-dir", &state.pki_dir().join(SCHEDULER)),
        flag("leader-elect", "false"),
        flag("profiling", "false"),
    ]
}

// ---------------------------------------------------------------------------------------------
// processes

pub fn pid_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("pids").join(format!("{name}.pid"))
}

pub fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("logs").join(format!("{name}.log"))
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path)
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|p| *p > 1)
}

/// Whether `pid` exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

/// Whether a command line (NUL-separated args) names `dir`: one argument is `dir`, ends with
/// `=dir`, or contains `dir/`.
pub fn cmdline_names_dir(cmdline: &[u8], dir: &Path) -> bool {
    let dir = dir.to_string_lossy();
    let with_slash = format!("{dir}/");
    let with_eq = format!("={dir}");
    cmdline.split(|b| *b == 0).any(|arg| {
        let arg = String::from_utf8_lossy(arg);
        arg == dir || arg.ends_with(&with_eq) || arg.contains(&with_slash)
    })
}

/// Whether `pid` is alive and one of this state dir's processes.
fn is_ours(pid: i32, dir: &Path) -> bool {
    process_alive(pid)
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| cmdline_names_dir(&c, dir))
}

/// `(name, pid)` of every recorded process of `dir` still running.
pub fn running_processes(dir: &Path) -> Vec<(String, i32)> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(dir.join("pids")) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".pid"))
        else {
            continue;
        };
        if let Some(pid) = read_pid(&path)
            && is_ours(pid, dir)
        {
            out.push((name.to_string(), pid));
        }
    }
    out.sort();
    out
}

struct Started {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// Starts `program args` detached, logging to `logs/<name>.log`, pid in `pids/<name>.pid`.
fn spawn(dir: &Path, name: &'static str, program: &Path, args: &[String]) -> Result<Started> {
    let log = log_path(dir, name);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(io_err("open", &log))?;
    let _ = writeln!(
        file,
        "==== localcluster: starting {name} at {} ====",
        jiff::Timestamp::now()
    );
    let stdout = file.try_clone().map_err(io_err("open", &log))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file);
    // etcd reads every ETCD_* variable as a flag and refuses to start when one shadows a
    // command-line flag; no child needs any of them (nor ETCDCTL_*), nor the user's KUBECONFIG.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD") {
            cmd.env_remove(&key);
        }
    }
    cmd.env_remove("KUBECONFIG");
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| ControlPlaneError::Spawn {
        component: name,
        program: program.to_path_buf(),
        source,
    })?;
    let pid_file = pid_path(dir, name);
    if let Err(e) = std::fs::write(&pid_file, format!("{}\n", child.id())) {
        // Unrecorded, nothing could stop it later: stop it now.
        let _ = child.kill();
        let _ = child.wait();
        return Err(io_err("write", &pid_file)(e));
    }
    info!(component = name, pid = child.id(), log = %log.display(), "started");
    Ok(Started { name, child, log })
}

/// Signals `pid` (ignoring "no such process").
fn signal(pid: i32, sig: Signal) {
    if let Err(e) = kill(Pid::from_raw(pid), sig)
        && e != nix::errno::Errno::ESRCH
    {
        warn!(pid, "cannot send {sig}: {e}");
    }
}

fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let start = Instant::now();
    while process_alive(pid) {
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// Stops the recorded process `name` of `dir`: SIGTERM, up to `grace`, SIGKILL. Removes its pid
/// file once it is gone.
fn stop(dir: &Path, name: &str, grace: Duration) {
    let pid_file = pid_path(dir, name);
    let Some(pid) = read_pid(&pid_file) else {
        let _ = std::fs::remove_file(&pid_file);
        return;
    };
    if is_ours(pid, dir) {
        info!(component = name, pid, "stopping (SIGTERM)");
        signal(pid, Signal::SIGTERM);
        if !wait_gone(pid, grace) {
            warn!(
                component = name,
                pid, "still running after {grace:?}: SIGKILL"
            );
            signal(pid, Signal::SIGKILL);
            wait_gone(pid, Duration::from_secs(10));
        }
    }
    if !is_ours(pid, dir) {
        let _ = std::fs::remove_file(&pid_file);
    }
}

// ---------------------------------------------------------------------------------------------
// leftovers

/// Loop devices whose backing file is under `dir`: `(device, backing file)`.
pub fn loops_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim_end_matches('\n');
        let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
        let backing = PathBuf::from(backing);
        if backing.starts_with(dir) {
            out.push((format!("/dev/{name}"), backing));
        }
    }
    out.sort();
    out
}

/// `(port, socket inode)` of every socket in LISTEN state in a `/proc/net/tcp` or
/// `/proc/net/tcp6` text.
pub fn listening_sockets(proc_net_tcp: &str) -> Vec<(u16, u64)> {
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(3) != Some(&"0A") {
                return None;
            }
            let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            let inode = f.get(9)?.parse().ok()?;
            Some((port, inode))
        })
        .collect()
}

fn all_listening_sockets() -> Vec<(u16, u64)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| listening_sockets(&t))
        .collect()
}

/// The pid of a process holding the socket with `inode` open, if any is visible.
fn socket_owner(inode: u64) -> Option<i32> {
    let target = format!("socket:[{inode}]");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                return Some(pid);
            }
        }
    }
    None
}

fn state_ports(state: &ClusterState) -> Vec<(String, u16)> {
    let mut ports = vec![
        ("etcd client".to_string(), state.etcd_client_port),
        ("etcd peer".to_string(), state.etcd_peer_port),
        (APISERVER.to_string(), state.apiserver_port),
        (
            CONTROLLER_MANAGER.to_string(),
            state.controller_manager_port,
        ),
        (SCHEDULER.to_string(), state.scheduler_port),
    ];
    for (node, port) in NODE_NAMES.iter().zip(&state.kubelet_ports) {
        ports.push((format!("kubelet of {node}"), *port));
    }
    ports
}

/// Everything of `dir`'s cluster still present on the host, one line each.
pub fn leftovers(dir: &Path, state: Option<&ClusterState>) -> Vec<String> {
    let mut left = vec![];
    for (name, pid) in running_processes(dir) {
        left.push(format!("process {name} (pid {pid}) still running"));
    }
    match std::fs::read_to_string(mountinfo::SELF) {
        Ok(mi) => {
            for m in mountinfo::mount_points_under(&mi, dir) {
                left.push(format!("mount {}", m.display()));
            }
        }
        Err(e) => left.push(format!("cannot read /proc/self/mountinfo: {e}")),
    }
    for (dev, backing) in loops_under(dir) {
        left.push(format!("loop device {dev} backed by {}", backing.display()));
    }
    if let Some(state) = state {
        let listening = all_listening_sockets();
        for (what, port) in state_ports(state) {
            for (_, inode) in listening.iter().filter(|(p, _)| *p == port) {
                // A port of a long-stopped cluster may since have been taken by someone else:
                // only a listener of one of this dir's processes (or of an unknown one) is left.
                match socket_owner(*inode) {
                    Some(pid) if !is_ours(pid, dir) => {
                        info!(
                            port,
                            pid, "port {port} ({what}) is now used by another process"
                        )
                    }
                    Some(pid) => left.push(format!("listener on port {port} ({what}), pid {pid}")),
                    None => left.push(format!("listener on port {port} ({what})")),
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/run/netns") {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&state.netns_prefix()) {
                    left.push(format!("network namespace {n}"));
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n == state.bridge_name() || n.starts_with(&state.veth_prefix()) {
                    left.push(format!("network interface {n}"));
                }
            }
        }
    }
    left
}

// ---------------------------------------------------------------------------------------------
// up

/// What `up` needs.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The state dir (created if missing).
    pub dir: PathBuf,
    /// Directory holding the Kubernetes server binaries (from [`install_deps`]).
    pub bin_dir: PathBuf,
    /// The node agent program, run as `<agent_exe> agent --state-dir DIR`. `None`: start no
    /// agent and do not wait for nodes and StorageClasses (control plane only).
    pub agent_exe: Option<PathBuf>,
}

/// What `up` did: the cluster and how long each phase took.
#[derive(Debug, Clone)]
pub struct UpReport {
    pub state: ClusterState,
    pub timings: Vec<(&'static str, Duration)>,
}

/// Checks that `up` may use `dir`, before anything is installed or changed: no process of its
/// cluster still runs ([`ControlPlaneError::AlreadyRunning`]), and it is either new, empty, or a
/// state dir ([`ControlPlaneError::ForeignDir`]). A missing dir passes.
pub fn preflight(dir: &Path) -> Result<()> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Ok(());
    };
    let running = running_processes(&dir);
    if !running.is_empty() {
        let running = running
            .iter()
            .map(|(n, p)| format!("{n} pid {p}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ControlPlaneError::AlreadyRunning { dir, running });
    }
    if !dir.join("cluster.json").exists() {
        let entries = std::fs::read_dir(&dir).map_err(io_err("read", &dir))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !OWN_ENTRIES.contains(&name.as_str()) {
                return Err(ControlPlaneError::ForeignDir { dir, entry: name });
            }
        }
    }
    Ok(())
}

/// Prepares the state dir: refuses one whose cluster still runs (or left mounts), or a foreign
/// non-empty dir; removes what an earlier, stopped cluster left. Returns the absolute dir.
fn prepare_dir(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let dir = std::fs::canonicalize(dir).map_err(io_err("resolve", dir))?;
    preflight(&dir)?;
    let has_state = dir.join("cluster.json").exists();
    // An earlier cluster of this dir is not running; whatever it may have left (it crashed, or
    // `down` was never run) is removed the way `down` removes it, and must then be gone.
    let left = if has_state {
        info!(dir = %dir.display(), "replacing a stopped cluster: cleaning up after it");
        down(&dir)?.leftovers
    } else {
        leftovers(&dir, None)
    };
    if !left.is_empty() {
        return Err(ControlPlaneError::Leftovers {
            dir,
            left: left.join("; "),
        });
    }
    for name in OWN_ENTRIES {
        if name == "logs" || name == "runtime.lock" {
            // Logs are appended to (each start writes a header line); the node runtime's lock
            // file is its own (nothing holds it: nothing runs).
            continue;
        }
        let path = dir.join(name);
        let res = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
    }
    for sub in ["logs", "pids", "kubeconfigs"] {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p).map_err(io_err("create", &p))?;
    }
    Ok(dir)
}

/// Starts the cluster in `opts.dir` and waits until it is usable. On failure, stops whatever it
/// started (through [`down`]) before returning the error.
pub async fn up(opts: &UpOptions) -> Result<UpReport> {
    let t0 = Instant::now();
    let dir = prepare_dir(&opts.dir)?;
    let state = choose_identity(&dir, &opts.bin_dir)?;
    info!(
        id = %state.id,
        dir = %dir.display(),
        apiserver = %state.apiserver_url(),
        pod_cidr = %state.pod_cidr(),
        service_cidr = %state.service_cidr(),
        "cluster identity chosen"
    );
    let mut timings = vec![("identity", t0.elapsed())];
    let mut started: Vec<Started> = vec![];
    let result = tokio::select! {
        r = bring_up(&state, opts, &mut started, &mut timings) => r,
        _ = interrupted() => Err(ControlPlaneError::Interrupted),
    };
    match result {
        Ok(()) => {
            timings.push(("total", t0.elapsed()));
            Ok(UpReport { state, timings })
        }
        Err(e) => {
            warn!("up failed: {e}; stopping what it started");
            let d = dir.clone();
            match tokio::task::spawn_blocking(move || down(&d)).await {
                Ok(Ok(report)) if report.leftovers.is_empty() => {}
                Ok(Ok(report)) => warn!("left after cleanup: {}", report.leftovers.join("; ")),
                Ok(Err(e)) => warn!("cleanup failed: {e}"),
                Err(e) => warn!("cleanup panicked: {e}"),
            }
            for s in &mut started {
                let _ = s.child.try_wait();
            }
            Err(e)
        }
    }
}

/// Resolves on SIGINT or SIGTERM (so that an interrupted `up` stops what it started).
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            warn!("cannot install signal handlers; an interrupted up may leave processes");
            std::future::pending::<()>().await
        }
    }
}

async fn bring_up(
    state: &ClusterState,
    opts: &UpOptions,
    started: &mut Vec<Started>,
    timings: &mut Vec<(&'static str, Duration)>,
) -> Result<()> {
    let dir = &state.dir;
    let t = Instant::now();
    let bundle = pki::generate(state)?;
    pki::write(state, &bundle)?;
    write_kubeconfigs(state, &bundle)?;
    timings.push(("pki+kubeconfigs", t.elapsed()));

    // etcd
    let t = Instant::now();
    started.push(spawn(dir, ETCD, Path::new(ETCD_BIN), &etcd_args(state))?);
    let endpoint = format!("http://127.0.0.1:{}", state.etcd_client_port);
    wait_for(started, ETCD, "etcd healthy", ETCD_TIMEOUT, || {
        let endpoint = endpoint.clone();
        async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(2));
            let mut c = etcd_client::Client::connect([endpoint], Some(opts))
                .await
                .map_err(|e| e.to_string())?;
            c.status().await.map(drop).map_err(|e| e.to_string())
        }
    })
    .await?;
    timings.push(("etcd", t.elapsed()));

    // kube-apiserver
    let t = Instant::now();
    started.push(spawn(
        dir,
        APISERVER,
        &state.bin_dir.join(APISERVER),
        &apiserver_args(state),
    )?);
    let client = client_from_kubeconfig(&state.kubeconfig()).await?;
    wait_for(started, APISERVER, "/readyz ok", APISERVER_TIMEOUT, || {
        let client = client.clone();
        async move {
            let req = http::Request::get("/readyz")
                .body(vec![])
                .map_err(|e| e.to_string())?;
            client
                .request_text(req)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    })
    .await?;
    timings.push(("kube-apiserver", t.elapsed()));

    // controller-manager and scheduler
    let t = Instant::now();
    started.push(spawn(
        dir,
        CONTROLLER_MANAGER,
        &state.bin_dir.join(CONTROLLER_MANAGER),
        &controller_manager_args(state),
    )?);
    started.push(spawn(
        dir,
        SCHEDULER,
        &state.bin_dir.join(SCHEDULER),
        &scheduler_args(state),
    )?);
    for (component, port) in [
        (SCHEDULER, state.scheduler_port),
        (CONTROLLER_MANAGER, state.controller_manager_port),
    ] {
        let health = healthz_client(port)?;
        wait_for(
            started,
            component,
            "/healthz ok",
            CONTROLLERS_TIMEOUT,
            || {
                let health = health.clone();
                async move {
                    let req = http::Request::get("/healthz")
                        .body(vec![])
                        .map_err(|e| e.to_string())?;
                    health
                        .request_text(req)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await?;
    }
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait_for(
        started,
        CONTROLLER_MANAGER,
        "ServiceAccount default/default",
        CONTROLLERS_TIMEOUT,
        || {
            let sas = sas.clone();
            async move {
                match sas.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("not created yet".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await?;
    timings.push(("controllers", t.elapsed()));

    // node agent
    if let Some(agent_exe) = &opts.agent_exe {
        let t = Instant::now();
        let args = vec![
            "agent".to_string(),
            "--state-dir".to_string(),
            dir.display().to_string(),
        ];
        started.push(spawn(dir, AGENT, agent_exe, &args)?);
        let nodes: Api<Node> = Api::all(client.clone());
        wait_for(started, AGENT, "3 nodes Ready", AGENT_TIMEOUT, || {
            let nodes = nodes.clone();
            async move {
                let list = nodes
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let not_ready = not_ready_nodes(&list.items);
                if not_ready.is_empty() {
                    Ok(())
                } else {
                    Err(format!("not Ready: {}", not_ready.join(", ")))
                }
            }
        })
        .await?;
        let scs: Api<StorageClass> = Api::all(client.clone());
        wait_for(
            started,
            AGENT,
            "StorageClasses standard and fast",
            AGENT_TIMEOUT,
            || {
                let scs = scs.clone();
                async move {
                    for name in ["standard", "fast"] {
                        if scs
                            .get_opt(name)
                            .await
                            .map_err(|e| e.to_string())?
                            .is_none()
                        {
                            return Err(format!("StorageClass {name} missing"));
                        }
                    }
                    Ok(())
                }
            },
        )
        .await?;
        timings.push(("agent", t.elapsed()));
    }
    Ok(())
}

/// Names of [`NODE_NAMES`] that are missing from `nodes` or not Ready.
pub fn not_ready_nodes(nodes: &[Node]) -> Vec<&'static str> {
    NODE_NAMES
        .iter()
        .copied()
        .filter(|name| {
            !nodes.iter().any(|n| {
                n.metadata.name.as_deref() == Some(*name)
                    && n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
            })
        })
        .collect()
}

/// A client for a component's own HTTPS health endpoint (self-signed serving certificate).
fn healthz_client(port: u16) -> Result<kube::Client> {
    let url: http::Uri =
        format!("https://127.0.0.1:{port}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| {
                ControlPlaneError::Client(kube::Error::Service(Box::new(e)))
            })?;
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    kube::Client::try_from(config).map_err(ControlPlaneError::Client)
}

/// Polls `probe` until it succeeds, `timeout` passes (error naming `component` and its log), or
/// any started process exits (error naming that one).
async fn wait_for<F, Fut>(
    started: &mut [Started],
    component: &'static str,
    what: &'static str,
    timeout: Duration,
    mut probe: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    let mut last: String;
    loop {
        for s in started.iter_mut() {
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(ControlPlaneError::Exited {
                    component: s.name,
                    status: status.to_string(),
                    log: s.log.clone(),
                });
            }
        }
        match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
            Ok(Ok(())) => {
                info!(
                    component,
                    "{what} after {:.1}s",
                    start.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("no answer within {PROBE_TIMEOUT:?}"),
        }
        if start.elapsed() >= timeout {
            let log = started
                .iter()
                .find(|s| s.name == component)
                .map(|s| s.log.clone())
                .unwrap_or_default();
            return Err(ControlPlaneError::Timeout {
                component,
                what,
                timeout,
                last,
                log,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// down

/// What `down` found after stopping everything.
#[derive(Debug, Clone, Default)]
pub struct DownReport {
    /// What is still present (empty: nothing left).
    pub leftovers: Vec<String>,
    pub elapsed: Duration,
}

/// Stops everything `up` started in `dir` and reports what is left. Idempotent.
pub fn down(dir: &Path) -> Result<DownReport> {
    let t0 = Instant::now();
    if !dir.exists() {
        return Ok(DownReport::default());
    }
    let dir = std::fs::canonicalize(dir).map_err(io_err("resolve", dir))?;
    let state = match ClusterState::load(&dir) {
        Ok(s) => Some(s),
        Err(StateError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            warn!("{e}; stopping recorded processes only");
            None
        }
    };

    stop(&dir, AGENT, AGENT_GRACE);
    if let Some(state) = &state {
        if let Err(e) = crate::agent::cleanup_host(state) {
            warn!("agent::cleanup_host: {e}");
        }
        if let Err(e) = crate::provisioner::cleanup_volumes(state) {
            warn!("provisioner::cleanup_volumes: {e}");
        }
    }
    for name in [SCHEDULER, CONTROLLER_MANAGER, APISERVER, ETCD] {
        stop(&dir, name, COMPONENT_GRACE);
    }
    // Anything else recorded (e.g. by a newer version).
    if let Ok(entries) = std::fs::read_dir(dir.join("pids")) {
        for e in entries.flatten() {
            if let Some(name) = e.file_name().to_str().and_then(|n| n.strip_suffix(".pid")) {
                stop(&dir, name, COMPONENT_GRACE);
            }
        }
    }
    if let Some(state) = &state {
        release_net(state);
    }
    let leftovers = leftovers(&dir, state.as_ref());
    Ok(DownReport {
        leftovers,
        elapsed: t0.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> ClusterState {
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

    #[test]
    fn chosen_ports_are_distinct_and_free() {
        let ports = choose_ports(8).unwrap();
        assert_eq!(ports.len(), 8);
        assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), 8);
        for p in ports {
            assert_ne!(p, 0);
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        }
    }

    #[test]
    fn random_ids_are_six_hex_chars() {
        let a = random_id().unwrap();
        assert_eq!(a.len(), 6);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase())
        );
    }

    #[test]
    fn host_nets_are_read_from_ip_addr() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\n\
                   7: smbrabc    inet 198.18.3.1/24 scope global smbrabc\n\
                   8: other    inet 198.18.200.7/16 scope global other\n\
                   9: x    inet 198.19.4.1/24 scope global x\n";
        assert_eq!(host_nets_in_use(out), BTreeSet::from([3, 200]));
    }

    #[test]
    fn net_choice_skips_host_and_reserved_numbers() {
        let host = BTreeSet::from([1, 3]);
        let mut tried = vec![];
        let n = pick_net(&host, |n| {
            tried.push(n);
            Ok::<_, ()>(n == 4)
        })
        .unwrap();
        assert_eq!(n, Some(4));
        assert_eq!(tried, [2, 4]);
        assert_eq!(pick_net(&host, |_| Ok::<_, ()>(false)).unwrap(), None);
        assert_eq!(pick_net(&host, |_| Err::<bool, _>("e")), Err("e"));
    }

    #[test]
    fn reservations_round_trip_and_go_stale() {
        let dir = std::env::temp_dir().join(format!("sm-cp-res-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = reservation_content(&dir, "abcdef");
        assert_eq!(parse_reservation(&c), Some((dir.clone(), "abcdef".into())));
        assert_eq!(parse_reservation(""), None);
        assert_eq!(parse_reservation("relative\nid\n"), None);
        // No cluster.json: stale.
        assert!(reservation_is_stale(&c));
        let mut s = sample(&dir);
        s.id = "abcdef".into();
        s.save().unwrap();
        assert!(!reservation_is_stale(&c));
        // Another cluster now lives in that dir: stale.
        s.id = "123456".into();
        s.save().unwrap();
        assert!(reservation_is_stale(&c));
        assert!(reservation_is_stale("garbage"));

        // try_reserve_one: free, held by a live cluster, stale.
        let res = dir.join("res");
        assert!(try_reserve_one(&res, &reservation_content(&dir, "123456")).unwrap());
        assert!(!try_reserve_one(&res, &reservation_content(&dir, "ffffff")).unwrap());
        s.id = "ffffff".into();
        s.save().unwrap();
        assert!(try_reserve_one(&res, &reservation_content(&dir, "ffffff")).unwrap());
        assert_eq!(
            std::fs::read_to_string(&res).unwrap(),
            reservation_content(&dir, "ffffff")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn preflight_refuses_foreign_dirs_only() {
        let dir = std::env::temp_dir().join(format!("sm-cp-pre-{}", std::process::id()));
        assert!(preflight(&dir).is_ok(), "missing dir");
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        assert!(preflight(&dir).is_ok(), "only our own entries");
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        assert!(matches!(
            preflight(&dir),
            Err(ControlPlaneError::ForeignDir { entry, .. }) if entry == "notes.txt"
        ));
        sample(&dir).save().unwrap();
        assert!(preflight(&dir).is_ok(), "a state dir may hold other files");
        // A recorded pid that is not one of this dir's processes does not count as running.
        std::fs::create_dir_all(dir.join("pids")).unwrap();
        std::fs::write(pid_path(&dir, ETCD), format!("{}\n", std::process::id())).unwrap();
        assert!(preflight(&dir).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kubeconfig_embeds_credentials_and_parses() {
        let ck = CertKey {
            cert_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----\n".into(),
        };
        let text = render_kubeconfig(
            "localcluster-abc",
            "https://127.0.0.1:1234",
            "CA PEM",
            "kubernetes-admin",
            &ck,
        )
        .unwrap();
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("localcluster-abc"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:1234"));
        use base64::Engine;
        let dec = |s: &str| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
        };
        assert_eq!(
            dec(cluster.certificate_authority_data.as_deref().unwrap()),
            "CA PEM"
        );
        assert_eq!(kc.auth_infos[0].name, "kubernetes-admin");
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(
            dec(user.client_certificate_data.as_deref().unwrap()),
            ck.cert_pem
        );
        let ctx = kc.contexts[0].context.as_ref().unwrap();
        assert_eq!(
            (ctx.cluster.as_str(), ctx.user.as_deref()),
            ("localcluster-abc", Some("kubernetes-admin"))
        );
    }

    #[test]
    fn mountinfo_is_filtered_by_dir() {
        let mi = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                  90 22 7:0 / /tmp/sm\\040a/nodes/node-a/volumes/pv1 rw - ext4 /dev/loop0 rw\n\
                  91 22 0:5 / /tmp/sm\\040ab/x rw - tmpfs tmpfs rw\n\
                  92 22 0:5 / /tmp/sm\\040a rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mountinfo::mount_points_under(mi, Path::new("/tmp/sm a")),
            [
                PathBuf::from("/tmp/sm a/nodes/node-a/volumes/pv1"),
                PathBuf::from("/tmp/sm a")
            ]
        );
    }

    #[test]
    fn listeners_are_parsed_from_proc_net_tcp() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n\
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 100 0 0 10 0\n";
        assert_eq!(listening_sockets(t), [(8080, 4242)]);
    }

    #[test]
    fn a_listener_is_traced_to_its_process() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let (_, inode) = all_listening_sockets()
            .into_iter()
            .find(|(p, _)| *p == port)
            .unwrap();
        assert_eq!(socket_owner(inode), Some(std::process::id() as i32));
    }

    #[test]
    fn cmdline_must_name_the_dir_exactly() {
        let dir = Path::new("/tmp/sm-a");
        assert!(cmdline_names_dir(b"etcd\0--data-dir=/tmp/sm-a/etcd\0", dir));
        assert!(cmdline_names_dir(
            b"lc\0agent\0--state-dir\0/tmp/sm-a\0",
            dir
        ));
        assert!(cmdline_names_dir(b"lc\0--state-dir=/tmp/sm-a\0", dir));
        assert!(!cmdline_names_dir(
            b"etcd\0--data-dir=/tmp/sm-ab/etcd\0",
            dir
        ));
        assert!(!cmdline_names_dir(b"lc\0--state-dir\0/tmp/sm-ab\0", dir));
    }

    #[test]
    fn component_flags_use_the_cluster_identity() {
        let s = sample(Path::new("/st"));
        let a = apiserver_args(&s);
        for f in [
            "--secure-port=30003",
            "--etcd-servers=http://127.0.0.1:30001",
            "--service-cluster-ip-range=198.19.42.0/24",
            "--advertise-address=198.18.42.1",
            "--insecure-port=0",
            "--bind-address=127.0.0.1",
            "--client-ca-file=/st/pki/ca.crt",
        ] {
            assert!(a.contains(&f.to_string()), "{f} not in {a:?}");
        }
        let e = etcd_args(&s);
        assert!(e.contains(&"--listen-peer-urls=http://127.0.0.1:30002".to_string()));
        assert!(e.contains(&"--data-dir=/st/etcd".to_string()));
        let cm = controller_manager_args(&s);
        assert!(cm.contains(&"--secure-port=30004".to_string()));
        assert!(
            cm.contains(&"--kubeconfig=/st/kubeconfigs/controller-manager.kubeconfig".to_string())
        );
        let sc = scheduler_args(&s);
        assert!(sc.contains(&"--secure-port=30005".to_string()));
        // Every process names the state dir, which `down` relies on to recognise it.
        for args in [a, e, cm, sc] {
            let cmdline = args.join("\0");
            assert!(cmdline_names_dir(cmdline.as_bytes(), Path::new("/st")));
        }
    }

    #[test]
    fn readiness_needs_every_node_ready() {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
        let node = |name: &str, ready: &str| Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let nodes = [node("node-a", "True"), node("node-b", "False")];
        assert_eq!(not_ready_nodes(&nodes), ["node-b", "node-c"]);
        let nodes = [
            node("node-a", "True"),
            node("node-b", "True"),
            node("node-c", "True"),
        ];
        assert!(not_ready_nodes(&nodes).is_empty());
    }
}
