//! One run of a container: its runtime spec (argv, env, mounts), start, wait or stop, exit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::agent::hosts;
use crate::agent::image::{self, ImageError};
use crate::agent::logs;
use crate::agent::pod::lifecycle::current_container;
use crate::agent::pod::probes::run_probes;
use crate::agent::pod::termination::{
    prepare_termination_file, termination_file, termination_message, termination_target,
};
use crate::agent::pod::{DEFAULT_GRACE_SECS, Outcome, PodShared, RunCtx, Slot};
use crate::agent::runtime::{self, ContainerSpec, MountSpec, ProcessSecurity};
use crate::agent::security;
use crate::agent::status::{self, CState};
use crate::agent::volumes;

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
    let term_file = termination_mount(ctx, c, &mut mounts)?;
    // The image's user: None until images carry one (then: root).
    let sec = container_security(pod, c, None)?;
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
            run_as_user: sec.run_as_user,
            run_as_group: sec.run_as_group,
            security: ProcessSecurity {
                capabilities: Some(sec.capabilities),
                no_new_privs: sec.no_new_privs,
                read_only_root: sec.read_only_root,
            },
        },
        term_file,
    ))
}

/// As the kubelet: a fresh, empty, world-writable file per container run, mounted at the
/// container's terminationMessagePath (in the container's private /dev by default). Returns the
/// file.
fn termination_mount(
    ctx: &RunCtx,
    c: &Container,
    mounts: &mut Vec<MountSpec>,
) -> Result<PathBuf, BuildError> {
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
    Ok(term_file)
}

/// The effective security settings of `c` (see [`security`]); `runAsNonRoot` violated by the
/// effective uid (`runAsUser`, else `image_uid`, else root) is a CreateContainerConfigError with
/// the kubelet's message.
fn container_security(
    pod: &Pod,
    c: &Container,
    image_uid: Option<u32>,
) -> Result<security::Effective, BuildError> {
    let eff = security::effective(pod, c, &runtime::supported_capabilities());
    security::verify_run_as_non_root(pod, c, &eff, image_uid)
        .map_err(|msg| BuildError::Wait("CreateContainerConfigError", msg))?;
    Ok(eff)
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

/// Records container `slot` as Waiting (`ErrImagePull` a second time becomes
/// `ImagePullBackOff`).
fn record_waiting(shared: &PodShared, slot: Slot, image: &str, reason: &'static str, msg: &str) {
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
        r.image = image.to_string();
        r.state = CState::waiting(reason, Some(msg.to_string()));
    });
}

/// Records a run that never started: Terminated with exit code 128 and reason `StartError`
/// (and the image, when given).
fn record_start_error(
    shared: &PodShared,
    slot: Slot,
    attempt: i32,
    image: Option<&str>,
    msg: String,
) {
    let now = Timestamp::now();
    shared.update_container(slot, |r| {
        if let Some(image) = image {
            r.image = image.to_string();
        }
        r.restart_count = attempt;
        r.ready = false;
        r.state = CState::Terminated {
            exit_code: 128,
            signal: None,
            reason: "StartError".into(),
            message: Some(msg),
            started_at: None,
            finished_at: now,
            container_id: None,
        };
    });
}

/// Runs the probes of a main container while waiting for its process to exit; stops it when the
/// pod stops (grace period) or its liveness probe fails (the pod's termination grace period).
async fn wait_with_probes(
    ctx: &Arc<RunCtx>,
    pod: &Pod,
    slot: Slot,
    c: &Container,
    spec: &ContainerSpec,
    child: &mut tokio::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    let shared = &ctx.shared;
    let pid = child.id().unwrap_or_default();
    let probes_stop = CancellationToken::new();
    let live_kill = CancellationToken::new();
    let probes = matches!(slot, Slot::Main(_)).then(|| {
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
        _ = ctx.stop.cancelled() => kill_container(pid, child, grace()).await,
        _ = live_kill.cancelled() => {
            let g = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(DEFAULT_GRACE_SECS);
            info!(pod = %shared.name, container = %c.name, "liveness probe failed, restarting");
            kill_container(pid, child, Duration::from_secs(g.max(0) as u64)).await
        }
    };
    // Whatever the main process left in its process group goes with it.
    let _ = runtime::signal_container(pid, Signal::SIGKILL);
    probes_stop.cancel();
    if let Some(p) = probes {
        let _ = p.await;
    }
    res
}

/// One run of a container: build, start, probe, wait (or stop), record the exit.
pub(super) async fn run_container(
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
            record_waiting(shared, slot, &image_name, reason, &msg);
            debug!(pod = %shared.name, container = %c.name, reason, %msg, "container waiting");
            return Outcome::Waiting;
        }
        Err(BuildError::Fail(msg)) => {
            warn!(pod = %shared.name, container = %c.name, %msg, "container cannot start");
            record_start_error(shared, slot, attempt, Some(&image_name), msg);
            return Outcome::Exited(128);
        }
    };
    let mut child = match runtime::spawn_container(&ctx.sandbox, &c.name, &spec) {
        Ok(child) => child,
        Err(e) => {
            warn!(pod = %shared.name, container = %c.name, error = %e, "spawn failed");
            record_start_error(shared, slot, attempt, None, e.to_string());
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
    let res = wait_with_probes(ctx, &pod, slot, &c, &spec, &mut child).await;
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
