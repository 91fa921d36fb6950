//! One pod's life on its node: sandbox and IP, hosts file, volumes, init containers in order,
//! then the containers (restarts per restartPolicy with a capped backoff), probes, status
//! writes, and deletion (SIGTERM, grace period, SIGKILL, cleanup, delete with grace 0).

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodStatus, Probe, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::hosts;
use super::image::{self, EnvContext, ImageError};
use super::probe::{self, ProbeMachine, ProbeTarget, ProbeTiming};
use super::runtime::{self, ContainerSpec, MountSpec, Sandbox};
use super::status::{self, CState, ContainerRecord, PodRecord};
use super::volumes::{self, HostVolume};
use super::{Agent, HostsTarget, logs};

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
            .map(|c| ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or_default()))
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
    stop: CancellationToken,
    grace: Arc<AtomicU64>,
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
    let mut life_done = false;
    let end = loop {
        tokio::select! {
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
            res = &mut life, if !life_done => {
                life_done = true;
                if let Err(e) = res {
                    warn!(pod = %shared.name, error = %e, "pod lifecycle task failed");
                }
            }
        }
    };
    let g = match &end {
        End::Deleted(g) => *g,
        End::Gone | End::Shutdown => SHORT_GRACE,
    };
    info!(pod = %format!("{}/{}", shared.namespace, shared.name), grace_s = g.as_secs_f64(), "stopping pod");
    grace.store(g.as_millis() as u64, Ordering::SeqCst);
    stop.cancel();
    if !life_done && let Err(e) = life.await {
        warn!(pod = %shared.name, error = %e, "pod lifecycle task failed");
    }
    // Final status (containers terminated) while the pod still exists, then release.
    status_stop.cancel();
    let _ = status_task.await;
    release(&agent, &shared).await;
    if let End::Deleted(_) = end {
        let pods: Api<Pod> = Api::namespaced(agent.client.clone(), &shared.namespace);
        delete_now(&pods, &shared.name, &shared.uid).await;
    }
    agent.remove_worker(&shared.uid);
    info!(pod = %format!("{}/{}", shared.namespace, shared.name), "pod released");
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
    Ok(ctx)
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

/// Sandbox, volumes, init containers, containers. Returns when the pod has finished or is
/// stopped (then every container process has exited).
async fn lifecycle(
    agent: Arc<Agent>,
    shared: Arc<PodShared>,
    stop: CancellationToken,
    grace: Arc<AtomicU64>,
) {
    let pod = shared.pod();
    let preferred = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_ref())
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
    let ip = loop {
        if let Some(ip) = agent.allocate_ip(&shared.uid, preferred) {
            break ip;
        }
        shared.update(|r| r.message = Some("no free pod IP on the pod network".into()));
        if sleep_or_stop(&stop, Duration::from_secs(5)).await {
            return;
        }
    };
    shared.update(|r| {
        r.pod_ip = Some(ip.to_string());
        r.start_time = Some(Timestamp::now());
    });
    let key: String = shared.uid.chars().filter(|c| *c != '-').take(8).collect();
    let sandbox = loop {
        let (state, key, dir) = (agent.state.clone(), key.clone(), shared.dir.clone());
        let res =
            tokio::task::spawn_blocking(move || runtime::create_sandbox(&state, &key, ip, &dir))
                .await;
        match res {
            Ok(Ok(sb)) => break sb,
            Ok(Err(e)) => {
                warn!(pod = %shared.name, error = %e, "cannot create sandbox");
                set_all_waiting(&shared, "ContainerCreating", &format!("sandbox: {e}"));
            }
            Err(e) => warn!(pod = %shared.name, error = %e, "sandbox task failed"),
        }
        if sleep_or_stop(&stop, Duration::from_secs(5)).await {
            return;
        }
    };
    *lock(&shared.sandbox) = Some(sandbox.clone());
    shared.update(|r| r.message = None);

    let hostname = hosts::pod_hostname(&pod);
    let hosts_path = shared.dir.join("hosts");
    agent.register_hosts(
        &shared.uid,
        HostsTarget {
            path: hosts_path.clone(),
            ip: ip.to_string(),
            hostname,
            own: hosts::entry_of(&pod, Some(&ip.to_string())),
        },
    );

    let (volumes, env_ctx) = loop {
        let pod = shared.pod();
        let res = match env_context(&agent, &pod, ip).await {
            Ok(ctx) => volumes::prepare(&agent.client, &pod, &shared.dir, &ctx)
                .await
                .map(|v| (v, ctx))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match res {
            Ok(v) => break v,
            Err(msg) => {
                debug!(pod = %shared.name, error = %msg, "volumes not ready");
                set_all_waiting(&shared, "ContainerCreating", &msg);
            }
        }
        if sleep_or_stop(&stop, Duration::from_secs(2)).await {
            return;
        }
    };
    let ctx = Arc::new(RunCtx {
        shared: shared.clone(),
        sandbox,
        volumes,
        env_ctx,
        hosts_path,
        stop: stop.clone(),
        grace,
    });
    let policy = status::restart_policy(&pod).to_string();
    let init: Vec<Container> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    for (i, c) in init.iter().enumerate() {
        let mut attempt = 0;
        let mut backoff_n = 0;
        loop {
            match run_container(&ctx, Slot::Init(i), c, attempt).await {
                Outcome::Stopped => return,
                Outcome::Exited(0) => break,
                Outcome::Exited(code) => {
                    if !status::should_restart_init(&policy, code) {
                        shared.update(|r| r.terminal_phase = Some("Failed".into()));
                        return;
                    }
                    attempt += 1;
                    if crash_backoff(&ctx, Slot::Init(i), &c.name, backoff_n).await {
                        return;
                    }
                    backoff_n += 1;
                }
                Outcome::Waiting => {
                    if sleep_or_stop(&stop, Duration::from_secs(5)).await {
                        return;
                    }
                }
            }
        }
    }
    shared.update(|r| {
        for c in &mut r.containers {
            if matches!(&c.state, CState::Waiting { reason, .. } if reason == "PodInitializing") {
                c.state = CState::waiting("ContainerCreating", None);
            }
        }
    });
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let tasks: Vec<_> = containers
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let ctx = ctx.clone();
            let policy = policy.clone();
            tokio::spawn(async move { supervise(ctx, i, c, policy).await })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            warn!(pod = %shared.name, error = %e, "container supervisor failed");
        }
    }
    if !stop.is_cancelled() {
        shared.update(|r| {
            let phase = status::compute_phase(&policy, r);
            if phase == "Succeeded" || phase == "Failed" {
                r.terminal_phase = Some(phase);
            }
        });
        info!(pod = %shared.name, "all containers finished");
    }
}

/// Waits out the crash-loop backoff `n` (state Waiting/CrashLoopBackOff); true when stopped.
async fn crash_backoff(ctx: &RunCtx, slot: Slot, name: &str, n: u32) -> bool {
    let d = status::restart_backoff(n);
    let msg = format!(
        "back-off {}s restarting failed container={name} pod={}_{}({})",
        d.as_secs(),
        ctx.shared.name,
        ctx.shared.namespace,
        ctx.shared.uid
    );
    ctx.shared.update_container(slot, |c| {
        if matches!(c.state, CState::Terminated { .. }) {
            c.last_state = Some(c.state.clone());
        }
        c.state = CState::waiting("CrashLoopBackOff", Some(msg));
    });
    sleep_or_stop(&ctx.stop, d).await
}

/// Runs container `i` again and again as its restart policy says.
async fn supervise(ctx: Arc<RunCtx>, i: usize, c: Container, policy: String) {
    let mut attempt = 0;
    let mut backoff_n = 0;
    loop {
        let started = Instant::now();
        match run_container(&ctx, Slot::Main(i), &c, attempt).await {
            Outcome::Stopped => return,
            Outcome::Waiting => {
                if sleep_or_stop(&ctx.stop, Duration::from_secs(5)).await {
                    return;
                }
            }
            Outcome::Exited(code) => {
                if !status::should_restart(&policy, code) {
                    return;
                }
                if started.elapsed() > status::BACKOFF_RESET {
                    backoff_n = 0;
                }
                attempt += 1;
                if crash_backoff(&ctx, Slot::Main(i), &c.name, backoff_n).await {
                    return;
                }
                backoff_n += 1;
            }
        }
    }
}

/// The current spec of container `name` (its image may have been changed), else `fallback`.
fn current_container(pod: &Pod, slot: Slot, fallback: &Container) -> Container {
    let spec = pod.spec.as_ref();
    let list = match slot {
        Slot::Init(_) => spec.and_then(|s| s.init_containers.as_deref()),
        Slot::Main(_) => spec.map(|s| s.containers.as_slice()),
    };
    list.and_then(|l| l.iter().find(|c| c.name == fallback.name))
        .cloned()
        .unwrap_or_else(|| fallback.clone())
}

/// Why a container cannot start.
enum BuildError {
    /// Wait and retry (reason, message).
    Wait(&'static str, String),
    /// Counts as a failed run (message).
    Fail(String),
}

/// The runtime spec of a container: argv, env, mounts (volumes, /etc/hosts, termination log).
fn build_spec(
    ctx: &RunCtx,
    pod: &Pod,
    c: &Container,
    attempt: i32,
) -> Result<(ContainerSpec, PathBuf), BuildError> {
    let image_name = c.image.clone().unwrap_or_default();
    let img = image::lookup(&image_name).map_err(|e| match e {
        ImageError::Unknown(_) => BuildError::Wait("ErrImagePull", e.to_string()),
        other => BuildError::Fail(other.to_string()),
    })?;
    let env = image::build_env(pod, c, &ctx.env_ctx)
        .map_err(|e| BuildError::Wait("CreateContainerConfigError", e.to_string()))?;
    let mut argv = image::command_line(&img, c.command.as_deref(), c.args.as_deref(), &env);
    let Some(first) = argv.first() else {
        return Err(BuildError::Fail(ImageError::NoCommand.to_string()));
    };
    let program = image::resolve_program(first, image::path_of(&env))
        .map_err(|e| BuildError::Fail(e.to_string()))?;
    argv[0] = program.to_string_lossy().into_owned();
    let mut mounts = volumes::container_mounts(c, &ctx.volumes, &env)
        .map_err(|e| BuildError::Wait("CreateContainerConfigError", e.to_string()))?;
    if !mounts.iter().any(|m| m.target == Path::new("/etc/hosts")) {
        mounts.push(MountSpec {
            source: ctx.hosts_path.clone(),
            target: PathBuf::from("/etc/hosts"),
            read_only: false,
        });
    }
    // As the kubelet: a fresh, empty, world-writable file per container run, mounted at the
    // container's terminationMessagePath (in the container's private /dev by default).
    let term_file = termination_file(&ctx.shared.dir, &c.name);
    prepare_termination_file(&term_file).map_err(|e| {
        BuildError::Wait(
            "CreateContainerError",
            format!("{}: {e}", term_file.display()),
        )
    })?;
    match termination_target(c) {
        Some(target) => mounts.push(MountSpec {
            source: term_file.clone(),
            target,
            read_only: false,
        }),
        None => warn!(
            pod = %ctx.shared.name,
            container = %c.name,
            path = ?c.termination_message_path,
            "terminationMessagePath contains '..': not mounted"
        ),
    }
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let c_sc = c.security_context.as_ref();
    let uid = c_sc
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user));
    let gid = c_sc
        .and_then(|s| s.run_as_group)
        .or_else(|| pod_sc.and_then(|s| s.run_as_group));
    let log_path = logs::log_file(&ctx.shared.dir, &c.name, attempt);
    if log_path.exists() {
        let _ = std::fs::remove_file(&log_path);
    }
    Ok((
        ContainerSpec {
            argv,
            env,
            working_dir: c
                .working_dir
                .clone()
                .filter(|w| !w.is_empty())
                .map(PathBuf::from),
            mounts,
            hostname: hosts::pod_hostname(pod),
            log_path,
            run_as_user: uid.and_then(|u| u32::try_from(u).ok()),
            run_as_group: gid.and_then(|g| u32::try_from(g).ok()),
        },
        term_file,
    ))
}

fn exit_of(status: std::process::ExitStatus) -> (i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (c, None),
        (None, Some(s)) => (128 + s, Some(s)),
        (None, None) => (255, None),
    }
}

/// SIGTERM to the container's process group, up to `grace`, then SIGKILL.
async fn kill_container(
    pid: u32,
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    if let Err(e) = runtime::signal_container(pid, Signal::SIGTERM) {
        warn!(pid, error = %e, "SIGTERM failed");
    }
    if let Ok(res) = tokio::time::timeout(grace, child.wait()).await {
        let _ = runtime::signal_container(pid, Signal::SIGKILL);
        return res;
    }
    debug!(pid, "grace period over, SIGKILL");
    if let Err(e) = runtime::signal_container(pid, Signal::SIGKILL) {
        warn!(pid, error = %e, "SIGKILL failed");
    }
    child.wait().await
}

/// The file in the pod's dir that backs container `name`'s termination message.
fn termination_file(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join("termination").join(name)
}

/// Creates (or empties) the termination message file, mode 0666 as the kubelet makes it, so a
/// container running as any user can write it.
fn prepare_termination_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// Where the termination message file is mounted in the container: `terminationMessagePath`
/// (the API server defaults it to `/dev/termination-log`; so do we when it is unset or empty),
/// made absolute as the kubelet does (a leading `/` added). `None` for a path with `..`.
fn termination_target(c: &Container) -> Option<PathBuf> {
    let path = c
        .termination_message_path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH);
    let path = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        PathBuf::from(format!("/{path}"))
    };
    (!path
        .components()
        .any(|c| c == std::path::Component::ParentDir))
    .then_some(path)
}

/// At most the last `max` bytes of a file (empty if it cannot be read), as the kubelet reads a
/// termination message.
fn read_tail(path: &Path, max: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let max = max as u64;
    if len > max && f.seek(SeekFrom::Start(len - max)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.take(max).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    buf
}

/// The termination message: the file's content (its last 4096 bytes), else
/// (FallbackToLogsOnError and a failure) the log's tail.
fn termination_message(
    c: &Container,
    term_file: &Path,
    log: &Path,
    exit_code: i32,
) -> Option<String> {
    let mut msg = read_tail(term_file, TERMINATION_MESSAGE_MAX);
    if msg.is_empty()
        && exit_code != 0
        && c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
    {
        // The last 80 lines, at most 2048 bytes: the shorter of the two suffixes.
        let data = read_tail(log, FALLBACK_LOG_BYTES);
        msg = logs::tail_lines(&data, Some(FALLBACK_LOG_LINES)).to_vec();
    }
    (!msg.is_empty()).then(|| String::from_utf8_lossy(&msg).into_owned())
}

/// One run of a container: build, start, probe, wait (or stop), record the exit.
async fn run_container(
    ctx: &Arc<RunCtx>,
    slot: Slot,
    fallback: &Container,
    attempt: i32,
) -> Outcome {
    if ctx.stop.is_cancelled() {
        return Outcome::Stopped;
    }
    let shared = &ctx.shared;
    let pod = shared.pod();
    let c = current_container(&pod, slot, fallback);
    let image_name = c.image.clone().unwrap_or_default();
    let (spec, term_file) = match build_spec(ctx, &pod, &c, attempt) {
        Ok(s) => s,
        Err(BuildError::Wait(reason, msg)) => {
            shared.update_container(slot, |r| {
                let reason = match &r.state {
                    CState::Waiting { reason: old, .. }
                        if reason == "ErrImagePull"
                            && (old == "ErrImagePull" || old == "ImagePullBackOff") =>
                    {
                        "ImagePullBackOff"
                    }
                    _ => reason,
                };
                r.image = image_name.clone();
                r.state = CState::waiting(reason, Some(msg.clone()));
            });
            debug!(pod = %shared.name, container = %c.name, reason, %msg, "container waiting");
            return Outcome::Waiting;
        }
        Err(BuildError::Fail(msg)) => {
            warn!(pod = %shared.name, container = %c.name, %msg, "container cannot start");
            let now = Timestamp::now();
            shared.update_container(slot, |r| {
                r.image = image_name.clone();
                r.restart_count = attempt;
                r.ready = false;
                r.state = CState::Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(msg.clone()),
                    started_at: None,
                    finished_at: now,
                    container_id: None,
                };
            });
            return Outcome::Exited(128);
        }
    };
    let mut child = match runtime::spawn_container(&ctx.sandbox, &c.name, &spec) {
        Ok(child) => child,
        Err(e) => {
            warn!(pod = %shared.name, container = %c.name, error = %e, "spawn failed");
            let now = Timestamp::now();
            shared.update_container(slot, |r| {
                r.restart_count = attempt;
                r.ready = false;
                r.state = CState::Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(e.to_string()),
                    started_at: None,
                    finished_at: now,
                    container_id: None,
                };
            });
            return Outcome::Exited(128);
        }
    };
    let pid = child.id().unwrap_or_default();
    let started_at = Timestamp::now();
    let container_id = format!("localcluster://{pid}");
    let has_startup = c.startup_probe.is_some();
    let main = matches!(slot, Slot::Main(_));
    shared.update_container(slot, |r| {
        r.image = image_name.clone();
        r.restart_count = attempt;
        r.container_id = Some(container_id.clone());
        r.state = CState::Running { started_at };
        r.started = !has_startup;
        r.ready = main && !has_startup && c.readiness_probe.is_none();
    });
    let probes_stop = CancellationToken::new();
    let live_kill = CancellationToken::new();
    let probes = main.then(|| {
        tokio::spawn(run_probes(
            ctx.clone(),
            slot,
            c.clone(),
            spec.clone(),
            probes_stop.clone(),
            live_kill.clone(),
        ))
    });
    let grace = || Duration::from_millis(ctx.grace.load(Ordering::SeqCst));
    let res = tokio::select! {
        res = child.wait() => res,
        _ = ctx.stop.cancelled() => kill_container(pid, &mut child, grace()).await,
        _ = live_kill.cancelled() => {
            let g = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(DEFAULT_GRACE_SECS);
            info!(pod = %shared.name, container = %c.name, "liveness probe failed, restarting");
            kill_container(pid, &mut child, Duration::from_secs(g.max(0) as u64)).await
        }
    };
    // Whatever the main process left in its process group goes with it.
    let _ = runtime::signal_container(pid, Signal::SIGKILL);
    probes_stop.cancel();
    if let Some(p) = probes {
        let _ = p.await;
    }
    let (exit_code, signal) = match res {
        Ok(st) => exit_of(st),
        Err(e) => {
            warn!(pod = %shared.name, container = %c.name, error = %e, "cannot wait for container");
            (255, None)
        }
    };
    let message = termination_message(&c, &term_file, &spec.log_path, exit_code);
    let finished_at = Timestamp::now();
    info!(pod = %shared.name, container = %c.name, exit_code, "container exited");
    shared.update_container(slot, |r| {
        r.ready = false;
        r.started = false;
        r.state = CState::Terminated {
            exit_code,
            signal,
            reason: status::exit_reason(exit_code).into(),
            message,
            started_at: Some(started_at),
            finished_at,
            container_id: Some(container_id.clone()),
        };
    });
    if ctx.stop.is_cancelled() {
        Outcome::Stopped
    } else {
        Outcome::Exited(exit_code)
    }
}

/// One probe: true when it passed.
async fn probe_once(
    ctx: &RunCtx,
    spec: &ContainerSpec,
    target: &ProbeTarget,
    timeout: Duration,
) -> bool {
    match target {
        ProbeTarget::Exec(argv) => {
            if argv.is_empty() {
                return false;
            }
            match runtime::exec_in_container(&ctx.sandbox, spec, argv, timeout).await {
                Ok(out) => out.exit_code == 0,
                Err(e) => {
                    debug!(error = %e, "exec probe failed");
                    false
                }
            }
        }
        ProbeTarget::Http {
            https,
            addr,
            host_header,
            path,
            headers,
        } => probe::check_http(*https, *addr, host_header, path, headers, timeout).await,
        ProbeTarget::Tcp(addr) => probe::check_tcp(*addr, timeout).await,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

/// Runs one probe of a container until `stop`; returns the final result (startup probes
/// return at their first success or failure verdict).
async fn probe_loop(
    ctx: &Arc<RunCtx>,
    slot: Slot,
    c: &Container,
    spec: &ContainerSpec,
    p: &Probe,
    kind: ProbeKind,
    stop: &CancellationToken,
) -> bool {
    let timing = ProbeTiming::of(p);
    let ip = ctx.sandbox.ip.to_string();
    let target = match probe::target_of(p, c, &ip) {
        Ok(t) => t,
        Err(e) => {
            warn!(pod = %ctx.shared.name, container = %c.name, error = %e, ?kind, "invalid probe");
            return kind == ProbeKind::Liveness;
        }
    };
    let mut machine = ProbeMachine::new(&timing, kind == ProbeKind::Liveness);
    if sleep_or_stop(stop, timing.initial_delay).await {
        return machine.result();
    }
    loop {
        let ok = probe_once(ctx, spec, &target, timing.timeout).await;
        let before = machine.result();
        let result = machine.record(ok);
        match kind {
            ProbeKind::Startup => {
                if result {
                    return true;
                }
                if machine.failed() {
                    return false;
                }
            }
            ProbeKind::Liveness => {
                if !result {
                    return false;
                }
            }
            ProbeKind::Readiness => {
                if result != before || !ok {
                    ctx.shared.update_container(slot, |r| {
                        if r.state.is_running() {
                            r.ready = result;
                        }
                    });
                }
            }
        }
        if sleep_or_stop(stop, timing.period).await {
            return machine.result();
        }
    }
}

/// Startup probe first; then readiness and liveness side by side. A failed startup or
/// liveness probe fires `live_kill`.
async fn run_probes(
    ctx: Arc<RunCtx>,
    slot: Slot,
    c: Container,
    spec: ContainerSpec,
    stop: CancellationToken,
    live_kill: CancellationToken,
) {
    if let Some(p) = &c.startup_probe {
        if !probe_loop(&ctx, slot, &c, &spec, p, ProbeKind::Startup, &stop).await {
            if !stop.is_cancelled() {
                live_kill.cancel();
            }
            return;
        }
        let ready_now = c.readiness_probe.is_none();
        ctx.shared.update_container(slot, |r| {
            if r.state.is_running() {
                r.started = true;
                r.ready = ready_now;
            }
        });
    }
    let readiness = async {
        if let Some(p) = &c.readiness_probe {
            probe_loop(&ctx, slot, &c, &spec, p, ProbeKind::Readiness, &stop).await;
        }
    };
    let liveness = async {
        if let Some(p) = &c.liveness_probe
            && !probe_loop(&ctx, slot, &c, &spec, p, ProbeKind::Liveness, &stop).await
            && !stop.is_cancelled()
        {
            live_kill.cancel();
        }
    };
    tokio::join!(readiness, liveness);
}

/// Writes the pod's status whenever the record changes (and every 10 s), until `stop`, then
/// once more.
async fn status_writer(client: kube::Client, shared: Arc<PodShared>, stop: CancellationToken) {
    let pods: Api<Pod> = Api::namespaced(client, &shared.namespace);
    let mut last: Option<PodStatus> = None;
    loop {
        let stopping = tokio::select! {
            _ = shared.dirty.notified() => false,
            _ = tokio::time::sleep(Duration::from_secs(10)) => false,
            _ = stop.cancelled() => true,
        };
        if !stopping {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        write_status(&pods, &shared, &mut last).await;
        if stopping {
            return;
        }
    }
}

async fn write_status(pods: &Api<Pod>, shared: &PodShared, last: &mut Option<PodStatus>) {
    let mut pod = (*shared.pod()).clone();
    if let Some(l) = last.as_ref() {
        pod.status = Some(l.clone());
    }
    let rec = lock(&shared.record).clone();
    let st = status::compute_status(&pod, &rec, Timestamp::now());
    if last.as_ref() == Some(&st) {
        return;
    }
    let mut value = match serde_json::to_value(&st) {
        Ok(v) => v,
        Err(e) => {
            warn!(error = %e, "cannot serialize pod status");
            return;
        }
    };
    if let Some(obj) = value.as_object_mut() {
        for k in ["message", "reason"] {
            obj.entry(k).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({"metadata": {"uid": shared.uid}, "status": value});
    match pods
        .patch_status(&shared.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => *last = Some(st),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
            debug!(pod = %shared.name, code = s.code, "status not written: pod gone or replaced");
        }
        Err(e) => warn!(pod = %shared.name, error = %e, "status write failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn termination_messages() {
        let dir = std::env::temp_dir().join(format!("sm-term-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let term = dir.join("term");
        let log = dir.join("log");
        std::fs::write(&term, "").unwrap();
        std::fs::write(&log, "l1\nl2\nboom\n").unwrap();
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert_eq!(termination_message(&c, &term, &log, 1), None);
        c.termination_message_policy = Some("FallbackToLogsOnError".into());
        assert_eq!(termination_message(&c, &term, &log, 0), None);
        assert_eq!(
            termination_message(&c, &term, &log, 1).as_deref(),
            Some("l1\nl2\nboom\n")
        );
        std::fs::write(&term, "bye").unwrap();
        assert_eq!(
            termination_message(&c, &term, &log, 1).as_deref(),
            Some("bye")
        );
        // Success with a message, and a missing file (no message, fallback when failed).
        assert_eq!(
            termination_message(&c, &term, &log, 0).as_deref(),
            Some("bye")
        );
        let missing = dir.join("missing");
        assert_eq!(termination_message(&c, &missing, &log, 0), None);
        assert_eq!(
            termination_message(&c, &missing, &log, 2).as_deref(),
            Some("l1\nl2\nboom\n")
        );
        // Only the end of the file counts (4096 bytes, as the kubelet reads it).
        let long = format!(
            "{}{}",
            "a".repeat(10_000),
            "b".repeat(TERMINATION_MESSAGE_MAX - 3)
        );
        std::fs::write(&term, format!("{long}end")).unwrap();
        let msg = termination_message(&c, &term, &log, 0).unwrap();
        assert_eq!(msg.len(), TERMINATION_MESSAGE_MAX);
        assert!(msg.starts_with("bbb") && msg.ends_with("bend"), "{msg}");
        // The log fallback: at most 80 lines and 2048 bytes of the log's end.
        std::fs::write(&term, "").unwrap();
        let lines: String = (0..200).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, &lines).unwrap();
        let msg = termination_message(&c, &term, &log, 1).unwrap();
        assert_eq!(msg.lines().count(), FALLBACK_LOG_LINES);
        assert!(
            msg.starts_with("line 120\n") && msg.ends_with("line 199\n"),
            "{msg}"
        );
        let wide: String = (0..50).map(|i| format!("{i:0>99}\n")).collect();
        std::fs::write(&log, &wide).unwrap();
        let msg = termination_message(&c, &term, &log, 1).unwrap();
        assert_eq!(msg.len(), FALLBACK_LOG_BYTES);
        assert!(msg.ends_with(&format!("{:0>99}\n", 49)), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn termination_message_targets() {
        let target = |path: Option<&str>| {
            termination_target(&Container {
                name: "c".into(),
                termination_message_path: path.map(String::from),
                ..Default::default()
            })
        };
        // The default lives in the container's private /dev: always mounted.
        assert_eq!(target(None), Some(PathBuf::from("/dev/termination-log")));
        assert_eq!(
            target(Some("")),
            Some(PathBuf::from("/dev/termination-log"))
        );
        assert_eq!(
            target(Some("/dev/termination-log")),
            Some(PathBuf::from("/dev/termination-log"))
        );
        assert_eq!(
            target(Some("/tmp/result.json")),
            Some(PathBuf::from("/tmp/result.json"))
        );
        // Relative paths are made absolute, as the kubelet does.
        assert_eq!(target(Some("var/msg")), Some(PathBuf::from("/var/msg")));
        assert_eq!(target(Some("/dev/../etc/passwd")), None);
    }

    #[test]
    fn termination_files_are_fresh_and_world_writable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sm-term-file-{}", std::process::id()));
        let file = termination_file(&dir, "copy");
        assert_eq!(file, dir.join("termination").join("copy"));
        prepare_termination_file(&file).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"");
        std::fs::write(&file, "from the last run").unwrap();
        prepare_termination_file(&file).unwrap();
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"",
            "emptied for the next run"
        );
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
