//! The node agent: registers the cluster's three nodes and is their kubelet.
//!
//! - [`node`]: Node objects, heartbeats, Leases.
//! - [`pod`]: one worker per pod bound to our nodes (sandbox, volumes, containers, probes,
//!   status, deletion).
//! - [`image`]: image table, pull policy (store or table), command/args, `$(VAR)` expansion,
//!   environment.
//! - [`volumes`], [`hosts`], [`probe`], [`status`], [`logs`]: the parts a worker uses.
//! - [`runtime`]: host sandboxes and container processes (no Kubernetes API).
//!
//! One unfiltered pod watcher feeds both the workers (pods whose `spec.nodeName` is one of our
//! nodes) and the hosts files (every pod with `hostname` + `subdomain` and an IP).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::state::{ClusterState, NODE_NAMES};

pub mod apiproxy;
pub mod hosts;
pub mod image;
pub mod logs;
pub mod node;
pub mod pod;
pub mod probe;
pub mod runtime;
pub mod security;
pub mod status;
pub mod volumes;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    Node(#[from] node::NodeError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error("cannot listen on the kubernetes Service address: {0}")]
    ServiceProxy(#[source] std::io::Error),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pod IPs 198.18.N.2 to .254, handed out round-robin so a freed address is reused late.
#[derive(Debug)]
pub struct IpPool {
    net: u8,
    used: HashMap<String, u8>,
    next: u8,
}

impl IpPool {
    pub const FIRST: u8 = 2;
    pub const LAST: u8 = 254;

    pub fn new(net: u8) -> Self {
        IpPool {
            net,
            used: HashMap::new(),
            next: Self::FIRST,
        }
    }

    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.net, host)
    }

    pub fn get(&self, uid: &str) -> Option<Ipv4Addr> {
        self.used.get(uid).map(|h| self.addr(*h))
    }

    /// The address of `uid` (its existing one, else `preferred` when free and in range, else
    /// the next free one). None when the range is full.
    pub fn allocate(&mut self, uid: &str, preferred: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        if let Some(ip) = self.get(uid) {
            return Some(ip);
        }
        let taken: HashSet<u8> = self.used.values().copied().collect();
        let pref = preferred.and_then(|p| {
            let o = p.octets();
            (o[0] == 198
                && o[1] == 18
                && o[2] == self.net
                && (Self::FIRST..=Self::LAST).contains(&o[3]))
            .then_some(o[3])
        });
        let host = match pref.filter(|h| !taken.contains(h)) {
            Some(h) => h,
            None => {
                let span = (Self::LAST - Self::FIRST + 1) as usize;
                let start = self.next.clamp(Self::FIRST, Self::LAST);
                let h = (0..span)
                    .map(|i| {
                        Self::FIRST + ((start - Self::FIRST) as usize + i).rem_euclid(span) as u8
                    })
                    .find(|h| !taken.contains(h))?;
                self.next = if h == Self::LAST { Self::FIRST } else { h + 1 };
                h
            }
        };
        self.used.insert(uid.to_string(), host);
        Some(self.addr(host))
    }

    pub fn release(&mut self, uid: &str) {
        self.used.remove(uid);
    }
}

/// A running pod's hosts file.
#[derive(Debug, Clone)]
pub struct HostsTarget {
    pub path: PathBuf,
    pub ip: String,
    pub hostname: String,
    pub own: Option<hosts::HostEntry>,
}

struct Worker {
    tx: watch::Sender<Option<Arc<Pod>>>,
}

/// State shared by the pod watcher, the workers, the hosts writer and the log servers.
pub struct Agent {
    pub client: kube::Client,
    pub state: ClusterState,
    ips: Mutex<IpPool>,
    /// Every pod of the cluster (for hosts files), by uid.
    all_pods: Mutex<HashMap<String, Arc<Pod>>>,
    workers: Mutex<HashMap<String, Worker>>,
    worker_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    hosts_files: Mutex<HashMap<String, HostsTarget>>,
    hosts_dirty: Notify,
    /// Pods with a worker, by (namespace, name), for the log servers.
    running: Mutex<HashMap<(String, String), Arc<pod::PodShared>>>,
    /// Pods being deleted without a worker (already finished).
    deleting: Mutex<HashSet<String>>,
    /// The nodes taken down (`localcluster node down`, see [`Agent::watch_down`]).
    pub down: watch::Sender<BTreeSet<String>>,
}

impl Agent {
    fn new(client: kube::Client, state: ClusterState) -> Self {
        Agent {
            ips: Mutex::new(IpPool::new(state.pod_net)),
            client,
            state,
            all_pods: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            worker_tasks: Mutex::new(Vec::new()),
            hosts_files: Mutex::new(HashMap::new()),
            hosts_dirty: Notify::new(),
            running: Mutex::new(HashMap::new()),
            deleting: Mutex::new(HashSet::new()),
            down: watch::Sender::new(BTreeSet::new()),
        }
    }

    /// Polls the down markers (`state::nodes_down`) every half second. A node taken down loses
    /// power: its pod workers kill their processes and end without a status write or a
    /// deletion (see `pod::run_pod`), and while it is down nothing of its pods is run, deleted
    /// or reported (see [`Agent::apply`]); its heartbeat stops and its Ready condition turns
    /// Unknown (see `node::run`). A node brought up again starts its pods as a rebooted kubelet
    /// would: every pod still bound to it is looked at again.
    async fn watch_down(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let now = crate::state::nodes_down(&self.state.dir);
            let before = self.down.borrow().clone();
            if now == before {
                continue;
            }
            info!(down = ?now, "nodes down changed");
            self.down.send_replace(now.clone());
            let up: Vec<&String> = before.difference(&now).collect();
            if up.is_empty() {
                continue;
            }
            let pods: Vec<Arc<Pod>> = lock(&self.all_pods).values().cloned().collect();
            for p in pods {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                if node.is_some_and(|n| up.contains(&&n)) {
                    self.apply((*p).clone());
                }
            }
        }
    }

    pub(crate) fn allocate_ip(&self, uid: &str, preferred: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        let ip = lock(&self.ips).allocate(uid, preferred);
        self.hosts_dirty.notify_one();
        ip
    }

    pub(crate) fn release_ip(&self, uid: &str) {
        lock(&self.ips).release(uid);
        self.hosts_dirty.notify_one();
    }

    pub(crate) fn register_hosts(&self, uid: &str, target: HostsTarget) {
        lock(&self.hosts_files).insert(uid.to_string(), target);
        self.rewrite_hosts();
    }

    pub(crate) fn unregister_hosts(&self, uid: &str) {
        lock(&self.hosts_files).remove(uid);
        self.hosts_dirty.notify_one();
    }

    pub(crate) fn add_running(&self, shared: Arc<pod::PodShared>) {
        lock(&self.running).insert((shared.namespace.clone(), shared.name.clone()), shared);
    }

    pub(crate) fn remove_running(&self, shared: &Arc<pod::PodShared>) {
        let mut running = lock(&self.running);
        let key = (shared.namespace.clone(), shared.name.clone());
        if running.get(&key).is_some_and(|s| s.uid == shared.uid) {
            running.remove(&key);
        }
    }

    pub(crate) fn remove_worker(&self, uid: &str) {
        lock(&self.workers).remove(uid);
    }

    /// The headless-service entries of every live pod.
    fn host_entries(&self) -> Vec<hosts::HostEntry> {
        let pods: Vec<Arc<Pod>> = lock(&self.all_pods).values().cloned().collect();
        let ips = lock(&self.ips);
        pods.iter()
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .filter_map(|p| {
                let uid = p.metadata.uid.as_deref().unwrap_or_default();
                let ip = ips
                    .get(uid)
                    .map(|ip| ip.to_string())
                    .or_else(|| p.status.as_ref().and_then(|s| s.pod_ip.clone()));
                hosts::entry_of(p, ip.as_deref())
            })
            .collect()
    }

    /// Rewrites (in place, only when changed) every running pod's hosts file.
    fn rewrite_hosts(&self) {
        let entries = self.host_entries();
        let targets: Vec<HostsTarget> = lock(&self.hosts_files).values().cloned().collect();
        for t in targets {
            let text = hosts::render(&t.ip, &t.hostname, t.own.as_ref(), &entries);
            if let Err(e) = hosts::write_in_place(&t.path, &text) {
                warn!(path = %t.path.display(), error = %e, "cannot write hosts file");
            }
        }
    }

    /// A pod was added or changed.
    fn apply(self: &Arc<Self>, p: Pod) {
        let p = Arc::new(p);
        let Some(uid) = p.metadata.uid.clone() else {
            return;
        };
        lock(&self.all_pods).insert(uid.clone(), p.clone());
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if !node.is_some_and(|n| NODE_NAMES.contains(&n)) {
            return;
        }
        if node.is_some_and(|n| self.down.borrow().contains(n)) {
            // A node without power runs, deletes and reports nothing.
            return;
        }
        let mut workers = lock(&self.workers);
        if let Some(w) = workers.get(&uid) {
            w.tx.send_replace(Some(p));
            return;
        }
        let finished = matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let deleting = p.metadata.deletion_timestamp.is_some();
        // Deleted while a previous agent was away, its containers still running: its worker
        // re-adopts them and stops them gracefully (see `pod::run_pod`).
        let stop_first = deleting
            && !finished
            && node.is_some_and(|n| {
                runtime::any_recorded_running(&self.state.node_dir(n).join("pods").join(&uid))
            });
        if deleting && !stop_first {
            // Nothing of it runs here: finish its deletion.
            if lock(&self.deleting).insert(uid.clone()) {
                let agent = self.clone();
                tokio::spawn(async move {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let pods: Api<Pod> = Api::namespaced(agent.client.clone(), &ns);
                    pod::delete_now(&pods, &name, &uid).await;
                    lock(&agent.deleting).remove(&uid);
                });
            }
            return;
        }
        if finished {
            return;
        }
        let (tx, rx) = watch::channel(Some(p.clone()));
        workers.insert(uid, Worker { tx });
        let task = tokio::spawn(pod::run_pod(self.clone(), p, rx));
        let mut tasks = lock(&self.worker_tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// A pod is gone from the API.
    fn gone(&self, uid: &str) {
        lock(&self.all_pods).remove(uid);
        if let Some(w) = lock(&self.workers).get(uid) {
            w.tx.send_replace(None);
        }
    }

    /// Watches every pod of the cluster until dropped.
    async fn watch_pods(self: Arc<Self>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        let mut listing: Option<HashSet<String>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => listing = Some(HashSet::new()),
                Ok(Event::InitApply(p)) => {
                    if let (Some(l), Some(uid)) = (listing.as_mut(), p.metadata.uid.clone()) {
                        l.insert(uid);
                    }
                    self.apply(p);
                }
                Ok(Event::InitDone) => {
                    if let Some(seen) = listing.take() {
                        let known: Vec<String> = lock(&self.all_pods).keys().cloned().collect();
                        for uid in known.iter().filter(|u| !seen.contains(*u)) {
                            self.gone(uid);
                        }
                    }
                }
                Ok(Event::Apply(p)) => self.apply(p),
                Ok(Event::Delete(p)) => {
                    if let Some(uid) = p.metadata.uid.as_deref() {
                        self.gone(uid);
                    }
                }
                Err(e) => warn!(error = %e, "pod watch error"),
            }
            self.hosts_dirty.notify_one();
        }
    }

    /// Keeps hosts files current until dropped.
    async fn hosts_writer(self: Arc<Self>) {
        loop {
            self.hosts_dirty.notified().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let agent = self.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || agent.rewrite_hosts()).await {
                warn!(error = %e, "hosts writer failed");
            }
        }
    }

    /// Stops every pod (short grace) and waits for the workers.
    async fn shutdown(&self) {
        let workers: Vec<Worker> = lock(&self.workers).drain().map(|(_, w)| w).collect();
        info!(pods = workers.len(), "stopping all pods");
        drop(workers);
        let tasks: Vec<_> = lock(&self.worker_tasks).drain(..).collect();
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .is_err()
        {
            warn!("some pods did not stop within 30 s");
        }
    }
}

impl logs::PodLookup for Agent {
    fn find(&self, namespace: &str, name: &str) -> Option<Arc<pod::PodShared>> {
        lock(&self.running)
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

async fn client_for(state: &ClusterState) -> Result<kube::Client, AgentError> {
    let path = state.component_kubeconfig("agent");
    let kc =
        kube::config::Kubeconfig::read_from(&path).map_err(|source| AgentError::Kubeconfig {
            path: path.clone(),
            source,
        })?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|source| AgentError::Kubeconfig { path, source })?;
    kube::Client::try_from(config).map_err(AgentError::Client)
}

/// Runs the log server of every node, retrying while the certificate is missing.
async fn serve_logs(agent: Arc<Agent>) {
    let pki = agent.state.pki_dir();
    let (cert, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
    let config = loop {
        match logs::tls_config(&cert, &key) {
            Ok(c) => break Arc::new(c),
            Err(e) => {
                warn!(error = %e, "kubelet log server waits for its certificate");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    let servers = NODE_NAMES
        .iter()
        .zip(&agent.state.kubelet_ports)
        .map(|(node, port)| {
            let addr = SocketAddr::from(([127, 0, 0, 1], *port));
            let (agent, config, node) = (agent.clone(), config.clone(), node.to_string());
            async move {
                loop {
                    match logs::serve(node.clone(), addr, config.clone(), agent.clone()).await {
                        Ok(()) => return,
                        Err(e) => warn!(%node, error = %e, "log server failed, restarting"),
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        });
    futures::future::join_all(servers).await;
}

async fn run_provisioner(client: kube::Client, state: ClusterState) {
    loop {
        match crate::provisioner::ensure_storage_classes(&client).await {
            Ok(()) => break,
            Err(e) => {
                warn!(error = %e, "cannot create StorageClasses (retrying)");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
    if let Err(e) = crate::provisioner::run(client, state).await {
        warn!(error = %e, "volume provisioner stopped");
    }
}

/// `(uid, pod dir)` of the live pods bound to our nodes (not finished, their node not down)
/// whose pod dir a previous agent left: their workers re-adopt their containers (see
/// `pod::adopt`), and stop them gracefully first if the pod is being deleted. Lists until the
/// API server answers.
async fn pods_to_keep(client: &kube::Client, state: &ClusterState) -> Vec<(String, PathBuf)> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = loop {
        match api.list(&Default::default()).await {
            Ok(l) => break l,
            Err(e) => warn!(error = %e, "cannot list pods (retrying)"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let down = crate::state::nodes_down(&state.dir);
    list.items
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.as_deref()?;
            let uid = p.metadata.uid.as_deref()?;
            let dir = state.node_dir(node).join("pods").join(uid);
            (NODE_NAMES.contains(&node) && !down.contains(node) && dir.is_dir())
                .then(|| (uid.to_string(), dir))
        })
        .collect()
}

/// Runs the node agent (and the volume provisioner) until SIGTERM/SIGINT, then stops every
/// container it started and tears down its pods' host resources. An agent killed without that
/// (SIGKILL) leaves its containers running; started again, it re-adopts them.
pub async fn run(state: ClusterState) -> Result<(), AgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).map_err(AgentError::Signal)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(AgentError::Signal)?;
    let client = client_for(&state).await?;
    let agent = Arc::new(Agent::new(client.clone(), state.clone()));
    // A previous agent's containers outlive it: those of live pods are re-adopted by the pod
    // workers (their IPs reserved first), the rest is cleaned up.
    let keep = pods_to_keep(&client, &state).await;
    for (uid, dir) in &keep {
        if let Some(sb) = runtime::recorded_sandboxes(dir).first() {
            agent.allocate_ip(uid, Some(sb.ip));
        }
    }
    info!(pods = keep.len(), "pods a previous agent left running");
    let keep = runtime::Keep::pods(keep.into_iter().map(|(_, dir)| dir));
    let st = state.clone();
    match tokio::task::spawn_blocking(move || runtime::cleanup_host_except(&st, &keep)).await {
        Ok(Err(e)) => warn!(error = %e, "cleanup of a previous agent's leftovers incomplete"),
        Err(e) => warn!(error = %e, "cleanup task failed"),
        Ok(Ok(())) => {}
    }
    // Pods reach the API server at the `kubernetes` Service's ClusterIP (see `apiproxy`).
    let st = state.clone();
    tokio::task::spawn_blocking(move || runtime::prepare_service_address(&st))
        .await
        .map_err(|_| runtime::RuntimeError::ThreadPanicked("service address"))??;
    let proxy = apiproxy::bind(&state)
        .await
        .map_err(AgentError::ServiceProxy)?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(apiproxy::serve(proxy, state.apiserver_port));
    tasks.spawn(run_provisioner(client.clone(), state.clone()));
    tasks.spawn(node::run(
        client.clone(),
        state.clone(),
        agent.down.subscribe(),
    ));
    tasks.spawn(agent.clone().watch_down());
    tasks.spawn(agent.clone().hosts_writer());
    tasks.spawn(serve_logs(agent.clone()));
    let watch = tokio::spawn(agent.clone().watch_pods());
    info!(nodes = ?NODE_NAMES, pod_cidr = %state.pod_cidr(), "node agent running");
    tokio::select! {
        _ = sigterm.recv() => info!("SIGTERM: shutting down"),
        _ = sigint.recv() => info!("SIGINT: shutting down"),
    }
    watch.abort();
    let _ = watch.await;
    agent.shutdown().await;
    tasks.shutdown().await;
    info!("node agent stopped");
    Ok(())
}

/// Removes every host resource of this cluster that the agent may have left (processes,
/// mounts, network namespaces, veths, bridge). Safe to call when nothing is left.
pub fn cleanup_host(state: &ClusterState) -> Result<(), AgentError> {
    runtime::cleanup_host(state).map_err(AgentError::from)
}

/// Entry point of the hidden `container-init SPEC` subcommand: enters the pod's namespaces,
/// sets up the container's mounts and execs its program. Only returns on error.
pub fn container_init(spec: &Path) -> AgentError {
    AgentError::Runtime(runtime::container_init(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_pool_round_robin_and_preference() {
        let mut p = IpPool::new(7);
        let a = p.allocate("a", None).unwrap();
        assert_eq!(a, Ipv4Addr::new(198, 18, 7, 2));
        assert_eq!(p.allocate("a", None), Some(a));
        let b = p.allocate("b", None).unwrap();
        assert_eq!(b, Ipv4Addr::new(198, 18, 7, 3));
        p.release("a");
        // Freed addresses come back only after the rest of the range.
        assert_eq!(p.allocate("c", None).unwrap(), Ipv4Addr::new(198, 18, 7, 4));
        // A preferred free address in range is honoured; a taken or foreign one is not.
        assert_eq!(
            p.allocate("d", Some(Ipv4Addr::new(198, 18, 7, 100)))
                .unwrap(),
            Ipv4Addr::new(198, 18, 7, 100)
        );
        assert_eq!(
            p.allocate("e", Some(Ipv4Addr::new(198, 18, 7, 100)))
                .unwrap(),
            Ipv4Addr::new(198, 18, 7, 5)
        );
        assert_eq!(
            p.allocate("f", Some(Ipv4Addr::new(10, 0, 0, 1))).unwrap(),
            Ipv4Addr::new(198, 18, 7, 6)
        );
        assert_eq!(p.get("d"), Some(Ipv4Addr::new(198, 18, 7, 100)));
    }

    #[test]
    fn ip_pool_fills_up_and_wraps() {
        let mut p = IpPool::new(1);
        for i in 0..253 {
            assert!(p.allocate(&format!("p{i}"), None).is_some(), "{i}");
        }
        assert_eq!(p.allocate("full", None), None);
        p.release("p10");
        assert_eq!(
            p.allocate("again", None),
            Some(Ipv4Addr::new(198, 18, 1, 12))
        );
    }
}
