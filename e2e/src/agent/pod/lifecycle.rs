//! A pod's lifecycle: sandbox, volumes, init containers in order, then one supervisor per
//! container restarting it as its restartPolicy says, with a capped crash-loop backoff.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::agent::hosts;
use crate::agent::image::EnvContext;
use crate::agent::pod::adopt;
use crate::agent::pod::container::run_container;
use crate::agent::pod::{
    Outcome, PodShared, RunCtx, Slot, env_context, lock, set_all_waiting, sleep_or_stop,
};
use crate::agent::runtime::{self, Sandbox};
use crate::agent::status::{self, CState};
use crate::agent::volumes::{self, HostVolume};
use crate::agent::{Agent, HostsTarget};

/// A pod IP (the one in the pod's status if still free), retried every 5 s; `None` when stopped.
async fn allocate_ip(
    agent: &Agent,
    shared: &PodShared,
    pod: &Pod,
    stop: &CancellationToken,
) -> Option<Ipv4Addr> {
    let preferred = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_ref())
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
    loop {
        if let Some(ip) = agent.allocate_ip(&shared.uid, preferred) {
            return Some(ip);
        }
        shared.update(|r| r.message = Some("no free pod IP on the pod network".into()));
        if sleep_or_stop(stop, Duration::from_secs(5)).await {
            return None;
        }
    }
}

/// The pod's sandbox at `ip`, retried every 5 s; `None` when stopped.
async fn create_sandbox(
    agent: &Agent,
    shared: &PodShared,
    ip: Ipv4Addr,
    stop: &CancellationToken,
) -> Option<Sandbox> {
    let key: String = shared.uid.chars().filter(|c| *c != '-').take(8).collect();
    loop {
        let (state, key, dir) = (agent.state.clone(), key.clone(), shared.dir.clone());
        let res =
            tokio::task::spawn_blocking(move || runtime::create_sandbox(&state, &key, ip, &dir))
                .await;
        match res {
            Ok(Ok(sb)) => return Some(sb),
            Ok(Err(e)) => {
                warn!(pod = %shared.name, error = %e, "cannot create sandbox");
                set_all_waiting(shared, "ContainerCreating", &format!("sandbox: {e}"));
            }
            Err(e) => warn!(pod = %shared.name, error = %e, "sandbox task failed"),
        }
        if sleep_or_stop(stop, Duration::from_secs(5)).await {
            return None;
        }
    }
}

/// Registers the pod's hosts file with the agent; returns its path.
fn register_hosts(agent: &Agent, shared: &PodShared, pod: &Pod, ip: Ipv4Addr) -> PathBuf {
    let hosts_path = shared.dir.join("hosts");
    agent.register_hosts(
        &shared.uid,
        HostsTarget {
            path: hosts_path.clone(),
            ip: ip.to_string(),
            hostname: hosts::pod_hostname(pod),
            own: hosts::entry_of(pod, Some(&ip.to_string())),
        },
    );
    hosts_path
}

/// The pod's volumes and environment context, retried every 2 s; `None` when stopped.
async fn prepare_volumes(
    agent: &Agent,
    shared: &PodShared,
    ip: Ipv4Addr,
    stop: &CancellationToken,
    adopted: bool,
) -> Option<(Vec<HostVolume>, EnvContext)> {
    loop {
        let pod = shared.pod();
        let res = match env_context(agent, &pod, ip).await {
            Ok(ctx) => volumes::prepare(&agent.client, &pod, &shared.dir, &ctx, adopted)
                .await
                .map(|v| (v, ctx))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match res {
            Ok(v) => return Some(v),
            Err(msg) => {
                debug!(pod = %shared.name, error = %msg, "volumes not ready");
                set_all_waiting(shared, "ContainerCreating", &msg);
            }
        }
        if sleep_or_stop(stop, Duration::from_secs(2)).await {
            return None;
        }
    }
}

/// The supervisors of a pod's native sidecars.
type Sidecars = Vec<tokio::task::JoinHandle<()>>;

/// Runs the init containers in order, each until it succeeds (restarts with backoff as the
/// policy says); a native sidecar (`restartPolicy: Always`) is started under a supervisor of
/// its own and the next one waits until it has started, as a kubelet does. `None` when the pod
/// stopped or failed (then its phase is `Failed`).
async fn run_init_containers(ctx: &Arc<RunCtx>, pod: &Pod, policy: &str) -> Option<Sidecars> {
    let init: Vec<Container> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    let mut sidecars = Vec::new();
    for (i, c) in init.iter().enumerate() {
        if status::is_sidecar(c) {
            let task = supervise(ctx.clone(), Slot::Init(i), c.clone(), "Always".into(), None);
            sidecars.push(tokio::spawn(task));
            if !sidecar_started(ctx, i).await {
                return None;
            }
            continue;
        }
        if !run_init_container(ctx, i, c, policy).await {
            return None;
        }
    }
    Some(sidecars)
}

/// Waits until sidecar `i` runs and its startup probe (if any) passed; false when the pod
/// stopped first.
async fn sidecar_started(ctx: &RunCtx, i: usize) -> bool {
    loop {
        if ctx.shared.init_started(i) {
            return true;
        }
        if sleep_or_stop(&ctx.stop, Duration::from_millis(100)).await {
            return false;
        }
    }
}

/// Runs regular init container `i` until it succeeds; false when the pod stopped or failed.
async fn run_init_container(ctx: &Arc<RunCtx>, i: usize, c: &Container, policy: &str) -> bool {
    let mut attempt = 0;
    let mut backoff_n = 0;
    loop {
        match run_container(ctx, Slot::Init(i), c, attempt, None).await {
            Outcome::Stopped => return false,
            Outcome::Exited(0) => return true,
            Outcome::Exited(code) => {
                if !status::should_restart_init(policy, code) {
                    ctx.shared
                        .update(|r| r.terminal_phase = Some("Failed".into()));
                    return false;
                }
                attempt += 1;
                if crash_backoff(ctx, Slot::Init(i), &c.name, backoff_n).await {
                    return false;
                }
                backoff_n += 1;
            }
            Outcome::Waiting => {
                if sleep_or_stop(&ctx.stop, Duration::from_secs(5)).await {
                    return false;
                }
            }
        }
    }
}

/// Runs every main container under its own supervisor until all have finished (taking over
/// `adopted`, in spec order, when given).
async fn run_main_containers(
    ctx: &Arc<RunCtx>,
    pod: &Pod,
    policy: &str,
    adopted: Vec<adopt::Adopted>,
) {
    let shared = &ctx.shared;
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
    let mut adopted = adopted.into_iter();
    let tasks: Vec<_> = containers
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let ctx = ctx.clone();
            let policy = policy.to_string();
            let a = adopted.next();
            tokio::spawn(async move { supervise(ctx, Slot::Main(i), c, policy, a).await })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            warn!(pod = %shared.name, error = %e, "container supervisor failed");
        }
    }
}

/// What the pod dir holds of this pod (left by an agent that died), and what to do about it.
fn adoption_decision(shared: &PodShared, pod: &Pod) -> adopt::Decision {
    let spec = pod.spec.as_ref();
    let dir = &shared.dir;
    let found: Vec<adopt::Found> = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| adopt::Found {
            name: c.name.clone(),
            run: adopt::read_run_record(dir, &c.name),
            container: runtime::recorded_container(dir, &c.name),
        })
        .collect();
    let inits_found = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| runtime::recorded_container(dir, &c.name).is_some());
    adopt::decide(pod, &found, inits_found)
}

/// Records the adopted containers as they were last reported (running, or ended meanwhile:
/// reported as such once their run is looked at), before the first status write, so the
/// restart shows in no status.
fn record_adopted(shared: &PodShared, a: &adopt::Adoption) {
    info!(pod = %shared.name, containers = a.containers.len(), "re-adopting the pod's containers");
    shared.update(|r| {
        for (rec, st) in r.init_containers.iter_mut().zip(&a.init_states) {
            rec.state = st.clone();
        }
        for (rec, c) in r.containers.iter_mut().zip(&a.containers) {
            rec.image = c.image.clone();
            rec.restart_count = c.attempt;
            rec.container_id = Some(format!("localcluster://{}", c.pid));
            rec.state = CState::Running {
                started_at: c.started_at,
            };
            rec.ready = c.ready;
            rec.started = c.started;
        }
    });
}

/// Kills and removes what a previous agent left of this pod (processes, sandboxes, mounts).
async fn discard_leftovers(shared: &PodShared, why: &str) {
    info!(pod = %shared.name, why, "discarding what a previous agent left of the pod");
    let dir = shared.dir.clone();
    let res = tokio::task::spawn_blocking(move || {
        for sb in runtime::recorded_sandboxes(&dir) {
            super::kill_netns_processes(&sb.netns);
            if let Err(e) = runtime::destroy_sandbox(&sb) {
                warn!(netns = %sb.netns, error = %e, "cannot destroy a stale sandbox");
            }
        }
        if let Err(e) = volumes::teardown(&dir) {
            warn!(dir = %dir.display(), error = %e, "cannot remove a stale pod dir");
        }
    })
    .await;
    if let Err(e) = res {
        warn!(error = %e, "cleanup task failed");
    }
}

/// The pod's IP and sandbox: those of `adoption`, else new ones. `None` when stopped first.
async fn ip_and_sandbox(
    agent: &Agent,
    shared: &PodShared,
    pod: &Pod,
    adoption: Option<&adopt::Adoption>,
    stop: &CancellationToken,
) -> Option<(Ipv4Addr, Sandbox)> {
    if let Some(a) = adoption {
        let ip = a.sandbox.ip;
        if agent.allocate_ip(&shared.uid, Some(ip)) != Some(ip) {
            warn!(pod = %shared.name, %ip, "adopted pod IP also handed out to another pod");
        }
        let start = pod.status.as_ref().and_then(|s| s.start_time.as_ref());
        let start = start.map_or_else(Timestamp::now, |t| t.0);
        shared.update(|r| {
            r.pod_ip = Some(ip.to_string());
            r.start_time = Some(start);
        });
        return Some((ip, a.sandbox.clone()));
    }
    let ip = allocate_ip(agent, shared, pod, stop).await?;
    shared.update(|r| {
        r.pod_ip = Some(ip.to_string());
        r.start_time = Some(Timestamp::now());
    });
    Some((ip, create_sandbox(agent, shared, ip, stop).await?))
}

/// Sandbox, volumes, init containers, containers; or, for a pod whose containers a previous
/// agent left running, their sandbox and the containers themselves (see `adopt.rs`). Returns
/// when the pod has finished or is stopped (then every container process has exited).
pub(super) async fn lifecycle(
    agent: Arc<Agent>,
    shared: Arc<PodShared>,
    stop: CancellationToken,
    grace: Arc<AtomicU64>,
) {
    let pod = shared.pod();
    let adoption = match adoption_decision(&shared, &pod) {
        adopt::Decision::Adopt(a) => {
            record_adopted(&shared, &a);
            Some(a)
        }
        adopt::Decision::Fresh => None,
        adopt::Decision::Discard(why) => {
            discard_leftovers(&shared, &why).await;
            None
        }
    };
    if adoption.is_none() && stop.is_cancelled() {
        // Deleted before anything of it ran.
        return;
    }
    let Some((ip, sandbox)) = ip_and_sandbox(&agent, &shared, &pod, adoption.as_ref(), &stop).await
    else {
        return;
    };
    *lock(&shared.sandbox) = Some(sandbox.clone());
    shared.update(|r| r.message = None);
    let hosts_path = register_hosts(&agent, &shared, &pod, ip);
    let adopted = adoption.is_some();
    let Some((volumes, env_ctx)) = prepare_volumes(&agent, &shared, ip, &stop, adopted).await
    else {
        return;
    };
    let ctx = Arc::new(RunCtx {
        shared: shared.clone(),
        sandbox,
        volumes,
        env_ctx,
        hosts_path,
        images: crate::images::Store::new(crate::images::store_dir(&agent.state.dir)),
        stop: stop.clone(),
        sidecars: stop.child_token(),
        grace,
    });
    let policy = status::restart_policy(&pod).to_string();
    let (containers, sidecars) = match adoption {
        Some(a) => (a.containers, Vec::new()),
        None => match run_init_containers(&ctx, &pod, &policy).await {
            Some(sidecars) => (Vec::new(), sidecars),
            None => return,
        },
    };
    run_main_containers(&ctx, &pod, &policy, containers).await;
    // The main containers are done (or the pod stops): the sidecars go after them.
    ctx.sidecars.cancel();
    for s in sidecars {
        if let Err(e) = s.await {
            warn!(pod = %shared.name, error = %e, "sidecar supervisor failed");
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
    let stop = ctx.stop_for_name(slot, name);
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
    sleep_or_stop(stop, d).await
}

/// Runs the container in `slot` again and again as its restart policy says.
async fn supervise(
    ctx: Arc<RunCtx>,
    slot: Slot,
    c: Container,
    policy: String,
    mut adopted: Option<adopt::Adopted>,
) {
    let stop = ctx.stop_for(slot, &c).clone();
    let mut attempt = adopted.as_ref().map_or(0, |a| a.attempt);
    let mut backoff_n = 0;
    loop {
        let started = Instant::now();
        match run_container(&ctx, slot, &c, attempt, adopted.take()).await {
            Outcome::Stopped => return,
            Outcome::Waiting => {
                if sleep_or_stop(&stop, Duration::from_secs(5)).await {
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
                if crash_backoff(&ctx, slot, &c.name, backoff_n).await {
                    return;
                }
                backoff_n += 1;
            }
        }
    }
}

/// The current spec of container `name` (its image may have been changed), else `fallback`.
pub(super) fn current_container(pod: &Pod, slot: Slot, fallback: &Container) -> Container {
    let spec = pod.spec.as_ref();
    let list = match slot {
        Slot::Init(_) => spec.and_then(|s| s.init_containers.as_deref()),
        Slot::Main(_) => spec.map(|s| s.containers.as_slice()),
    };
    list.and_then(|l| l.iter().find(|c| c.name == fallback.name))
        .cloned()
        .unwrap_or_else(|| fallback.clone())
}
