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
) -> Option<(Vec<HostVolume>, EnvContext)> {
    loop {
        let pod = shared.pod();
        let res = match env_context(agent, &pod, ip).await {
            Ok(ctx) => volumes::prepare(&agent.client, &pod, &shared.dir, &ctx)
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

/// Runs the init containers in order, each until it succeeds (restarts with backoff as the
/// policy says). False when the pod stopped or failed (then its phase is `Failed`).
async fn run_init_containers(ctx: &Arc<RunCtx>, pod: &Pod, policy: &str) -> bool {
    let init: Vec<Container> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    for (i, c) in init.iter().enumerate() {
        let mut attempt = 0;
        let mut backoff_n = 0;
        loop {
            match run_container(ctx, Slot::Init(i), c, attempt).await {
                Outcome::Stopped => return false,
                Outcome::Exited(0) => break,
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
    true
}

/// Runs every main container under its own supervisor until all have finished.
async fn run_main_containers(ctx: &Arc<RunCtx>, pod: &Pod, policy: &str) {
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
    let tasks: Vec<_> = containers
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let ctx = ctx.clone();
            let policy = policy.to_string();
            tokio::spawn(async move { supervise(ctx, i, c, policy).await })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            warn!(pod = %shared.name, error = %e, "container supervisor failed");
        }
    }
}

/// Sandbox, volumes, init containers, containers. Returns when the pod has finished or is
/// stopped (then every container process has exited).
pub(super) async fn lifecycle(
    agent: Arc<Agent>,
    shared: Arc<PodShared>,
    stop: CancellationToken,
    grace: Arc<AtomicU64>,
) {
    let pod = shared.pod();
    let Some(ip) = allocate_ip(&agent, &shared, &pod, &stop).await else {
        return;
    };
    shared.update(|r| {
        r.pod_ip = Some(ip.to_string());
        r.start_time = Some(Timestamp::now());
    });
    let Some(sandbox) = create_sandbox(&agent, &shared, ip, &stop).await else {
        return;
    };
    *lock(&shared.sandbox) = Some(sandbox.clone());
    shared.update(|r| r.message = None);
    let hosts_path = register_hosts(&agent, &shared, &pod, ip);
    let Some((volumes, env_ctx)) = prepare_volumes(&agent, &shared, ip, &stop).await else {
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
        grace,
    });
    let policy = status::restart_policy(&pod).to_string();
    if !run_init_containers(&ctx, &pod, &policy).await {
        return;
    }
    run_main_containers(&ctx, &pod, &policy).await;
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
