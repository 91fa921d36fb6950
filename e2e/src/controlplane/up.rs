//! `up`: preflight, state dir, identity, then the components one after another with a
//! readiness wait for each.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use tracing::{info, warn};

use crate::controlplane::args::{
    AUDIT_POLICY, AUDIT_POLICY_FILE, apiserver_args, controller_manager_args, etcd_args,
    scheduler_args,
};
use crate::controlplane::down::down;
use crate::controlplane::identity::choose_identity;
use crate::controlplane::kubeconfig::{client_from_kubeconfig, write_kubeconfigs};
use crate::controlplane::leftovers::leftovers;
use crate::controlplane::process::{Started, running_processes, spawn};
use crate::controlplane::{
    AGENT, AGENT_TIMEOUT, APISERVER, APISERVER_TIMEOUT, CONTROLLER_MANAGER, CONTROLLERS_TIMEOUT,
    ControlPlaneError, ETCD, ETCD_TIMEOUT, OWN_ENTRIES, PROBE_TIMEOUT, Result, SCHEDULER, io_err,
};
use crate::pki;
use crate::state::{ClusterState, NODE_NAMES};

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
        if name == "logs" || name == "runtime.lock" || name == "images" {
            // Logs are appended to (each start writes a header line); the node runtime's lock
            // file is its own (nothing holds it: nothing runs); loaded images stay loaded.
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
pub(super) async fn interrupted() {
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
    let t = Instant::now();
    let bundle = pki::generate(state)?;
    pki::write(state, &bundle)?;
    write_kubeconfigs(state, &bundle)?;
    let policy = state.dir.join(AUDIT_POLICY_FILE);
    std::fs::write(&policy, AUDIT_POLICY).map_err(io_err("write", &policy))?;
    timings.push(("pki+kubeconfigs", t.elapsed()));

    let t = Instant::now();
    start_etcd(state, started).await?;
    timings.push(("etcd", t.elapsed()));

    let t = Instant::now();
    let client = start_apiserver(state, started).await?;
    timings.push(("kube-apiserver", t.elapsed()));

    let t = Instant::now();
    start_controllers(state, started, &client).await?;
    timings.push(("controllers", t.elapsed()));

    if let Some(agent_exe) = &opts.agent_exe {
        let t = Instant::now();
        start_agent(state, agent_exe, started, &client).await?;
        timings.push(("agent", t.elapsed()));
    }
    Ok(())
}

/// `GET path` through `client`; any answer but an error status is success.
async fn get_ok(client: &kube::Client, path: &str) -> std::result::Result<(), String> {
    let req = http::Request::get(path)
        .body(vec![])
        .map_err(|e| e.to_string())?;
    client
        .request_text(req)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Starts etcd and waits until it answers `status`.
async fn start_etcd(state: &ClusterState, started: &mut Vec<Started>) -> Result<()> {
    started.push(spawn(
        &state.dir,
        ETCD,
        &state.bin_dir.join(ETCD),
        &etcd_args(state),
    )?);
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
    .await
}

/// Restarts the kube-apiserver of the running cluster `state` (a fault the e2e suite injects):
/// SIGTERM, up to 10 s, SIGKILL, then the same command line again until `/readyz` answers.
/// Returns how long the API was unavailable.
pub async fn restart_apiserver(state: &ClusterState) -> Result<Duration> {
    let t = Instant::now();
    let dir = state.dir.clone();
    tokio::task::spawn_blocking(move || {
        super::process::stop(&dir, APISERVER, Duration::from_secs(10));
    })
    .await
    .map_err(|e| io_err("stop", &state.dir)(io::Error::other(e)))?;
    let mut started = Vec::new();
    start_apiserver(state, &mut started).await?;
    Ok(t.elapsed())
}

/// How long a [`restart_agent`] took.
#[derive(Debug, Clone, Copy)]
pub struct AgentRestart {
    /// From the SIGKILL until the agent was started again.
    pub down: Duration,
    /// From the start until every node had renewed its Lease and was Ready.
    pub until_ready: Duration,
}

/// Kills the node agent with SIGKILL (no cleanup: the containers it started keep running),
/// waits `down_for`, starts it again with the same command line and environment, and waits
/// until every node has renewed its Lease since and is Ready.
pub async fn restart_agent(state: &ClusterState, down_for: Duration) -> Result<AgentRestart> {
    let dir = state.dir.clone();
    let not_running = || ControlPlaneError::Exited {
        component: AGENT,
        status: "not running".into(),
        log: super::process::log_path(&dir, AGENT),
    };
    let pid = super::process::running_pid(&dir, AGENT).ok_or_else(not_running)?;
    let argv = super::process::proc_list(pid, "cmdline").ok_or_else(not_running)?;
    let env = super::process::proc_list(pid, "environ").unwrap_or_default();
    let (program, args) = argv.split_first().ok_or_else(not_running)?;
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    info!(pid, "killing the node agent (SIGKILL)");
    super::process::signal(pid, nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    let gone = tokio::task::spawn_blocking(move || {
        super::process::wait_exit(pid, Duration::from_secs(10))
    })
    .await
    .unwrap_or(false);
    if !gone {
        return Err(not_running());
    }
    tokio::time::sleep(down_for.saturating_sub(killed.elapsed())).await;
    let down = killed.elapsed();
    let since = k8s_openapi::jiff::Timestamp::now();
    let mut started = vec![super::process::spawn_env(
        &dir,
        AGENT,
        Path::new(program),
        &args,
        Some(&env),
    )?];
    let client = client_from_kubeconfig(&state.kubeconfig()).await?;
    wait_for(
        &mut started,
        AGENT,
        "3 nodes renewed and Ready",
        AGENT_TIMEOUT,
        || nodes_renewed_since(client.clone(), since),
    )
    .await?;
    Ok(AgentRestart {
        down,
        until_ready: since
            .duration_until(k8s_openapi::jiff::Timestamp::now())
            .unsigned_abs(),
    })
}

/// Ok when every node's Lease was renewed after `since` and every node is Ready.
async fn nodes_renewed_since(
    client: kube::Client,
    since: k8s_openapi::jiff::Timestamp,
) -> std::result::Result<(), String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    for node in NODE_NAMES {
        let lease = leases.get(node).await.map_err(|e| e.to_string())?;
        let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
        if renewed.is_none_or(|t| t < since) {
            return Err(format!("lease of {node} not renewed yet"));
        }
    }
    all_nodes_ready(Api::all(client)).await
}

/// Ok when every node is Ready; else which are not.
async fn all_nodes_ready(nodes: Api<Node>) -> std::result::Result<(), String> {
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

/// Starts kube-apiserver and waits for `/readyz`; returns the admin client.
async fn start_apiserver(state: &ClusterState, started: &mut Vec<Started>) -> Result<kube::Client> {
    let spawned = jiff::Timestamp::now();
    started.push(spawn(
        &state.dir,
        APISERVER,
        &state.bin_dir.join(APISERVER),
        &apiserver_args(state),
    )?);
    let client = client_from_kubeconfig(&state.kubeconfig()).await?;
    wait_for(started, APISERVER, "/readyz ok", APISERVER_TIMEOUT, || {
        let client = client.clone();
        async move { get_ok(&client, "/readyz").await }
    })
    .await?;
    crate::state::record_apiserver_start(&state.dir, spawned, jiff::Timestamp::now())?;
    Ok(client)
}

/// Starts kube-controller-manager and kube-scheduler, waits for their `/healthz`, then for the
/// ServiceAccount `default/default` (the controllers are working).
async fn start_controllers(
    state: &ClusterState,
    started: &mut Vec<Started>,
    client: &kube::Client,
) -> Result<()> {
    for (component, args) in [
        (CONTROLLER_MANAGER, controller_manager_args(state)),
        (SCHEDULER, scheduler_args(state)),
    ] {
        let program = state.bin_dir.join(component);
        started.push(spawn(&state.dir, component, &program, &args)?);
    }
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
                async move { get_ok(&health, "/healthz").await }
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
    .await
}

/// Starts the node agent and waits until the three nodes are Ready and the StorageClasses exist.
async fn start_agent(
    state: &ClusterState,
    agent_exe: &Path,
    started: &mut Vec<Started>,
    client: &kube::Client,
) -> Result<()> {
    let dir = &state.dir;
    let args = vec![
        "agent".to_string(),
        "--state-dir".to_string(),
        dir.display().to_string(),
    ];
    started.push(spawn(dir, AGENT, agent_exe, &args)?);
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(started, AGENT, "3 nodes Ready", AGENT_TIMEOUT, || {
        all_nodes_ready(nodes.clone())
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
    .await
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

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::Node;

    use crate::controlplane::process::pid_path;
    use crate::controlplane::test_support::sample;
    use crate::controlplane::{ControlPlaneError, ETCD};

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
