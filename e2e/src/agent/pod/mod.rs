//! One pod's life on its node: sandbox and IP, hosts file, volumes, init containers in order,
//! then the containers (restarts per restartPolicy with a capped backoff), probes, status
//! writes, and deletion (SIGTERM, grace period, SIGKILL, cleanup, delete with grace 0).

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::agent::Agent;
use crate::agent::apiproxy;
use crate::agent::hosts;
use crate::agent::image::{self, EnvContext};
use crate::agent::runtime::{self, Sandbox};
use crate::agent::status::{self, CState, ContainerRecord, PodRecord};
use crate::agent::volumes::{self, HostVolume};

pub mod adopt;
mod container;
mod lifecycle;
mod probes;
mod status_writer;
mod termination;

use lifecycle::lifecycle;
use status_writer::status_writer;

/// Grace period when the agent shuts down or a pod vanished from the API.
pub const SHORT_GRACE: Duration = Duration::from_secs(2);
/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_SECS: i64 = 30;
/// Kubernetes' limits on termination messages.
const TERMINATION_MESSAGE_MAX: usize = 4096;
const FALLBACK_LOG_LINES: usize = 80;
const FALLBACK_LOG_BYTES: usize = 2048;
/// The API server's default `terminationMessagePath`.
const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the worker, the container supervisors, the status writer and the log server share.
pub struct PodShared {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// `nodes/<node>/pods/<uid>`: the sandbox dir (volumes, hosts file, logs, runtime files).
    pub dir: PathBuf,
    record: Mutex<PodRecord>,
    latest: Mutex<Arc<Pod>>,
    sandbox: Mutex<Option<Sandbox>>,
    dirty: Notify,
}

impl PodShared {
    fn new(pod: Arc<Pod>, node: &str, dir: PathBuf) -> Self {
        let spec = pod.spec.as_ref();
        let init_containers = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .map(|c| ContainerRecord {
                sidecar: status::is_sidecar(c),
                ..ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or_default())
            })
            .collect();
        let has_init =
            spec.is_some_and(|s| s.init_containers.as_ref().is_some_and(|v| !v.is_empty()));
        let containers = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let mut r = ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or_default());
                if has_init {
                    r.state = CState::waiting("PodInitializing", None);
                }
                r
            })
            .collect();
        PodShared {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            node: node.to_string(),
            dir,
            record: Mutex::new(PodRecord {
                init_containers,
                containers,
                ..Default::default()
            }),
            latest: Mutex::new(pod),
            sandbox: Mutex::new(None),
            dirty: Notify::new(),
        }
    }

    pub fn pod(&self) -> Arc<Pod> {
        lock(&self.latest).clone()
    }

    fn update(&self, f: impl FnOnce(&mut PodRecord)) {
        f(&mut lock(&self.record));
        self.dirty.notify_one();
    }

    fn update_container(&self, slot: Slot, f: impl FnOnce(&mut ContainerRecord)) {
        self.update(|r| {
            let list = match slot {
                Slot::Init(_) => &mut r.init_containers,
                Slot::Main(_) => &mut r.containers,
            };
            if let Some(c) = list.get_mut(slot.index()) {
                f(c);
            }
        });
    }

    /// Whether init container `i` runs and has started (its startup probe passed, if any).
    fn init_started(&self, i: usize) -> bool {
        let r = lock(&self.record);
        let c = r.init_containers.get(i);
        c.is_some_and(|c| c.state.is_running() && c.started)
    }

    /// Whether instance `n` (its restart count) of container `name` is running.
    pub fn instance_running(&self, name: &str, n: i32) -> bool {
        let r = lock(&self.record);
        r.init_containers
            .iter()
            .chain(r.containers.iter())
            .any(|c| c.name == name && c.restart_count == n && c.state.is_running())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Init(usize),
    Main(usize),
}

impl Slot {
    fn index(self) -> usize {
        match self {
            Slot::Init(i) | Slot::Main(i) => i,
        }
    }
}

/// How one run of a container ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// It ran (or failed to start) and exited with this code.
    Exited(i32),
    /// It could not be started yet (image unknown, config missing): try again later.
    Waiting,
    /// The pod is being stopped.
    Stopped,
}

/// Everything a container run needs, once the sandbox and volumes exist.
struct RunCtx {
    shared: Arc<PodShared>,
    sandbox: Sandbox,
    volumes: Vec<HostVolume>,
    env_ctx: EnvContext,
    hosts_path: PathBuf,
    /// The cluster's image store (shared by its nodes).
    images: crate::images::Store,
    stop: CancellationToken,
    /// Stops the native sidecars (a child of `stop`): when the pod stops, or when its main
    /// containers have all finished.
    sidecars: CancellationToken,
    grace: Arc<AtomicU64>,
}

impl RunCtx {
    /// The token that stops the container in `slot` (see [`RunCtx::sidecars`]).
    fn stop_for(
        &self,
        slot: Slot,
        c: &k8s_openapi::api::core::v1::Container,
    ) -> &CancellationToken {
        self.stop_for_name(slot, &c.name)
    }

    /// [`RunCtx::stop_for`] by the container's name.
    fn stop_for_name(&self, slot: Slot, name: &str) -> &CancellationToken {
        let sidecar = || {
            let pod = self.shared.pod();
            let inits = pod.spec.as_ref().and_then(|s| s.init_containers.as_deref());
            inits
                .unwrap_or_default()
                .iter()
                .any(|c| c.name == name && status::is_sidecar(c))
        };
        if matches!(slot, Slot::Init(_)) && sidecar() {
            &self.sidecars
        } else {
            &self.stop
        }
    }
}

/// Sleeps `d`; true when `stop` fired first.
async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// The grace period of a deleted pod: `deletionGracePeriodSeconds` capped by the spec's
/// `terminationGracePeriodSeconds`.
pub fn deletion_grace(pod: &Pod) -> Duration {
    let spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds);
    let del = pod.metadata.deletion_grace_period_seconds;
    let secs = match (del, spec) {
        (Some(d), Some(s)) => d.min(s),
        (Some(d), None) => d,
        (None, Some(s)) => s,
        (None, None) => DEFAULT_GRACE_SECS,
    };
    Duration::from_secs(secs.max(0) as u64)
}

enum End {
    /// deletionTimestamp set: stop with this grace, then delete from the API.
    Deleted(Duration),
    /// Gone from the API: stop quickly, nothing to delete.
    Gone,
    /// The agent shuts down.
    Shutdown,
    /// Its node lost power (`localcluster node down`): processes killed at once, no status
    /// written, nothing deleted from the API.
    PowerLoss,
}

/// Runs one pod until it is deleted (or the agent stops: `rx`'s sender dropped).
pub async fn run_pod(agent: Arc<Agent>, pod: Arc<Pod>, mut rx: watch::Receiver<Option<Arc<Pod>>>) {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir = agent.state.node_dir(&node).join("pods").join(&uid);
    let shared = Arc::new(PodShared::new(pod, &node, dir));
    info!(pod = %format!("{}/{}", shared.namespace, shared.name), %node, %uid, "pod admitted");
    agent.add_running(shared.clone());
    let stop = CancellationToken::new();
    let grace = Arc::new(AtomicU64::new(SHORT_GRACE.as_millis() as u64));
    let status_stop = CancellationToken::new();
    let status_task = tokio::spawn(status_writer(
        agent.client.clone(),
        shared.clone(),
        status_stop.clone(),
    ));
    let mut life = tokio::spawn(lifecycle(
        agent.clone(),
        shared.clone(),
        stop.clone(),
        grace.clone(),
    ));
    let mut down = agent.down.subscribe();
    let (end, life_done) = wait_end(&shared, &mut rx, &mut down, &mut life).await;
    let g = match &end {
        End::Deleted(g) => *g,
        End::Gone | End::Shutdown => SHORT_GRACE,
        End::PowerLoss => Duration::ZERO,
    };
    let power_loss = matches!(end, End::PowerLoss);
    if power_loss {
        status_task.abort();
    }
    info!(pod = %format!("{}/{}", shared.namespace, shared.name), grace_s = g.as_secs_f64(), "stopping pod");
    grace.store(g.as_millis() as u64, Ordering::SeqCst);
    stop.cancel();
    let stopping = Stopping {
        life: (!life_done).then_some(life),
        status_task,
        status_stop,
    };
    let power_loss = stopping.finish(&shared, &mut down, power_loss).await;
    if power_loss {
        warn!(pod = %shared.name, node = %shared.node, "node lost power: pod processes killed");
    }
    release(&agent, &shared).await;
    if let End::Deleted(_) = end
        && !power_loss
    {
        let pods: Api<Pod> = Api::namespaced(agent.client.clone(), &shared.namespace);
        delete_now(&pods, &shared.name, &shared.uid).await;
    }
    agent.remove_worker(&shared.uid);
    info!(pod = %format!("{}/{}", shared.namespace, shared.name), "pod released");
}

/// Runs until the pod is deleted, gone, its node loses power or the agent stops, passing
/// updates of the pod on to its workers; also notes when its lifecycle ends by itself.
async fn wait_end<L>(
    shared: &PodShared,
    rx: &mut watch::Receiver<Option<Arc<Pod>>>,
    down: &mut watch::Receiver<std::collections::BTreeSet<String>>,
    life: &mut tokio::task::JoinHandle<L>,
) -> (End, bool) {
    let mut life_done = false;
    // A pod being deleted already (while a previous agent was away): stop what it left.
    let first = rx.borrow().clone();
    if let Some(p) = first.filter(|p| p.metadata.deletion_timestamp.is_some()) {
        return (End::Deleted(deletion_grace(&p)), false);
    }
    let end = loop {
        tokio::select! {
            _ = down.wait_for(|d| d.contains(&shared.node)) => break End::PowerLoss,
            changed = rx.changed() => {
                if changed.is_err() {
                    break End::Shutdown;
                }
                let latest = rx.borrow_and_update().clone();
                match latest {
                    None => break End::Gone,
                    Some(p) => {
                        let deleting = p.metadata.deletion_timestamp.is_some();
                        let g = deletion_grace(&p);
                        *lock(&shared.latest) = p;
                        if deleting {
                            break End::Deleted(g);
                        }
                        shared.dirty.notify_one();
                    }
                }
            }
            res = &mut *life, if !life_done => {
                life_done = true;
                if let Err(e) = res {
                    warn!(pod = %shared.name, error = %e, "pod lifecycle task failed");
                }
            }
        }
    };
    (end, life_done)
}

/// The tasks of a pod being stopped.
struct Stopping<L, S> {
    /// The lifecycle, unless it has ended already.
    life: Option<tokio::task::JoinHandle<L>>,
    status_task: tokio::task::JoinHandle<S>,
    status_stop: CancellationToken,
}

impl<L, S> Stopping<L, S> {
    /// Waits until the lifecycle has stopped the containers, then for the final status write
    /// (containers terminated) while the pod still exists. A node that loses power meanwhile
    /// ends the stop at once: the processes die with the sandbox (see `release`), nothing is
    /// reported. True after a power loss (before or during the stop).
    async fn finish(
        mut self,
        shared: &PodShared,
        down: &mut watch::Receiver<std::collections::BTreeSet<String>>,
        mut power_loss: bool,
    ) -> bool {
        if let Some(mut life) = self.life.take() {
            tokio::select! {
                res = &mut life => {
                    if let Err(e) = res {
                        warn!(pod = %shared.name, error = %e, "pod lifecycle task failed");
                    }
                }
                _ = down.wait_for(|d| d.contains(&shared.node)), if !power_loss => {
                    power_loss = true;
                    self.status_task.abort();
                    life.abort();
                }
            }
        }
        self.status_stop.cancel();
        let _ = self.status_task.await;
        power_loss
    }
}

/// Deletes a pod with grace period 0 and a uid precondition (404 and 409 are fine).
pub async fn delete_now(pods: &Api<Pod>, name: &str, uid: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete(name, &dp).await {
        Ok(_) => debug!(pod = name, "deleted with grace period 0"),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => warn!(pod = name, error = %e, "final delete failed"),
    }
}

/// Frees the pod's host resources: leftover processes, sandbox, volumes, hosts file, IP.
async fn release(agent: &Arc<Agent>, shared: &Arc<PodShared>) {
    agent.unregister_hosts(&shared.uid);
    let sandbox = lock(&shared.sandbox).take();
    let dir = shared.dir.clone();
    let res = tokio::task::spawn_blocking(move || {
        if let Some(sb) = &sandbox {
            kill_netns_processes(&sb.netns);
            if let Err(e) = runtime::destroy_sandbox(sb) {
                warn!(netns = %sb.netns, error = %e, "cannot destroy sandbox");
            }
        }
        if let Err(e) = volumes::teardown(&dir) {
            warn!(dir = %dir.display(), error = %e, "cannot remove pod dir");
        }
    })
    .await;
    if let Err(e) = res {
        warn!(error = %e, "pod cleanup task failed");
    }
    agent.release_ip(&shared.uid);
    agent.remove_running(shared);
}

/// SIGKILLs every process left in network namespace `netns` (children that left the
/// container's process group).
fn kill_netns_processes(netns: &str) {
    let Ok(target) = std::fs::metadata(Path::new("/run/netns").join(netns)) else {
        return;
    };
    let own = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).ok();
    if Some(target.ino()) == own {
        return;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid <= 1 {
            continue;
        }
        let same = std::fs::metadata(e.path().join("ns/net"))
            .is_ok_and(|m| m.ino() == target.ino() && m.dev() == target.dev());
        if same {
            debug!(pid, netns, "killing leftover process");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Fetches the ConfigMaps and Secrets the pod refers to (missing ones are left out).
async fn env_context(agent: &Agent, pod: &Pod, ip: Ipv4Addr) -> Result<EnvContext, kube::Error> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let (cms, secrets) = image::referenced_objects(pod);
    let mut ctx = EnvContext {
        pod_ip: ip.to_string(),
        host_ip: status::HOST_IP.to_string(),
        hostname: hosts::pod_hostname(pod),
        service_env: apiproxy::service_env(agent.state.kubernetes_service_ip()),
        ..Default::default()
    };
    let cm_api: Api<ConfigMap> = Api::namespaced(agent.client.clone(), &ns);
    for name in cms {
        if let Some(cm) = cm_api.get_opt(&name).await? {
            ctx.config_maps.insert(name, cm);
        }
    }
    let sec_api: Api<Secret> = Api::namespaced(agent.client.clone(), &ns);
    for name in secrets {
        if let Some(s) = sec_api.get_opt(&name).await? {
            ctx.secrets.insert(name, s);
        }
    }
    for (audience, secs) in volumes::token_audiences(pod) {
        // An answer without a token leaves the audience out: the volume then fails, naming it.
        if let Some(token) = service_account_token(agent, pod, &audience, secs).await? {
            ctx.service_account_tokens.insert(audience, token);
        }
    }
    Ok(ctx)
}

/// A token of the pod's service account for `audience` ("" for the API server's), bound to the
/// pod (it stops being valid when the pod is deleted), through the TokenRequest API.
async fn service_account_token(
    agent: &Agent,
    pod: &Pod,
    audience: &str,
    expiration_seconds: i64,
) -> Result<Option<String>, kube::Error> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let account = spec
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".to_string());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Some(audience)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .into_iter()
                .collect(),
            expiration_seconds: Some(expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..TokenRequest::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(agent.client.clone(), &ns);
    let tr: TokenRequest = api
        .create_subresource("token", &account, &PostParams::default(), &request)
        .await?;
    Ok(tr.status.map(|s| s.token).filter(|t| !t.is_empty()))
}

fn set_all_waiting(shared: &PodShared, reason: &str, message: &str) {
    shared.update(|r| {
        for c in r.init_containers.iter_mut().chain(r.containers.iter_mut()) {
            if matches!(c.state, CState::Waiting { .. }) {
                c.state = CState::waiting(reason, Some(message.to_string()));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn grace_periods() {
        let pod = |del: Option<i64>, spec: Option<i64>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "deletionGracePeriodSeconds": del},
                "spec": {"containers": [], "terminationGracePeriodSeconds": spec}
            }))
            .unwrap()
        };
        assert_eq!(
            deletion_grace(&pod(Some(30), Some(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            deletion_grace(&pod(Some(0), Some(30))),
            Duration::from_secs(0)
        );
        assert_eq!(
            deletion_grace(&pod(Some(60), Some(5))),
            Duration::from_secs(5)
        );
        assert_eq!(deletion_grace(&pod(None, Some(7))), Duration::from_secs(7));
        assert_eq!(deletion_grace(&pod(None, None)), Duration::from_secs(30));
    }
}
