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
use crate::agent::image::{self, ImageConfig, ImageError, ImageSource};
use crate::agent::logs;
use crate::agent::pod::adopt;
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
use crate::images::user::ImageUser;
use crate::images::{self, PullPolicy, StoredImage};

/// Why a container cannot start.
enum BuildError {
    /// Wait and retry (reason, message).
    Wait(&'static str, String),
    /// Counts as a failed run (message).
    Fail(String),
}

/// The process a container runs: argv, env, working dir, and what its image decides (root,
/// user).
struct Process {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    working_dir: Option<PathBuf>,
    /// The stored image's root (None: a host program).
    image_root: Option<PathBuf>,
    /// The stored image's user (None: a host program).
    image_user: Option<ImageUser>,
    /// The stored image's `/etc/passwd` (for the group of a `runAsUser` without `runAsGroup`).
    passwd: String,
}

/// Chooses the image as the kubelet's pull policy says (store or host-program table) and builds
/// the process from it.
fn image_process(ctx: &RunCtx, pod: &Pod, c: &Container) -> Result<Process, BuildError> {
    let image_name = c.image.clone().unwrap_or_default();
    let policy = PullPolicy::of(c.image_pull_policy.as_deref(), &image_name);
    let stored = ctx.images.lookup(&image_name).map_err(|e| match e {
        images::StoreError::Reference(e) => BuildError::Wait("InvalidImageName", e.to_string()),
        e => BuildError::Wait("ErrImagePull", format!("image {image_name:?}: {e}")),
    })?;
    let source = image::choose_source(&image_name, policy, stored)
        .map_err(|e| BuildError::Wait(e.reason(), e.to_string()))?;
    let env_error =
        |e: image::EnvError| BuildError::Wait("CreateContainerConfigError", e.to_string());
    let container_wd = c.working_dir.clone().filter(|w| !w.is_empty());
    match source {
        ImageSource::Host(img) => {
            let env = image::build_env(pod, c, &ctx.env_ctx).map_err(env_error)?;
            let mut argv = image::command_line(&img, c.command.as_deref(), c.args.as_deref(), &env);
            let Some(first) = argv.first() else {
                return Err(BuildError::Fail(ImageError::NoCommand.to_string()));
            };
            let program = image::resolve_program(first, image::path_of(&env))
                .map_err(|e| BuildError::Fail(e.to_string()))?;
            argv[0] = program.to_string_lossy().into_owned();
            Ok(Process {
                argv,
                env,
                working_dir: container_wd.map(PathBuf::from),
                image_root: None,
                image_user: None,
                passwd: String::new(),
            })
        }
        ImageSource::Store(stored) => {
            let env = image::container_env(pod, c, &ctx.env_ctx).map_err(env_error)?;
            stored_process(ctx, c, stored, env, container_wd)
        }
    }
}

/// The process of a container from a stored image: the image's Entrypoint/Cmd (under the
/// container's command/args), Env (under the container's), WorkingDir (unless the container
/// sets one) and User (resolved in the image's /etc/passwd and /etc/group). The program is
/// resolved on the image's PATH inside its root by `container-init`.
fn stored_process(
    ctx: &RunCtx,
    c: &Container,
    stored: StoredImage,
    container_env: Vec<(String, String)>,
    container_wd: Option<String>,
) -> Result<Process, BuildError> {
    let cfg = &stored.config;
    let passwd = images::read_in_root(&stored.rootfs, "etc/passwd").unwrap_or_default();
    let group = images::read_in_root(&stored.rootfs, "etc/group").unwrap_or_default();
    let user = images::user::resolve(cfg.user.as_deref().unwrap_or(""), &passwd, &group)
        .map_err(|e| BuildError::Wait("CreateContainerError", e.to_string()))?;
    let img = ImageConfig {
        entrypoint: cfg.entrypoint.clone().unwrap_or_default(),
        cmd: cfg.cmd.clone().unwrap_or_default(),
    };
    // `$(VAR)` in command/args refers to the container's own variables, as in Kubernetes.
    let argv = image::command_line(
        &img,
        c.command.as_deref(),
        c.args.as_deref(),
        &container_env,
    );
    if argv.first().is_none_or(|a| a.is_empty()) {
        return Err(BuildError::Fail(ImageError::NoCommand.to_string()));
    }
    let env = image::env_over_image(
        cfg.env.as_deref().unwrap_or_default(),
        &container_env,
        &ctx.env_ctx.hostname,
        &user.home,
    );
    let working_dir = container_wd
        .or_else(|| cfg.working_dir.clone().filter(|w| !w.is_empty()))
        .map(PathBuf::from);
    Ok(Process {
        argv,
        env,
        working_dir,
        image_root: Some(stored.rootfs),
        image_user: Some(user),
        passwd,
    })
}

/// The uid and gid a container runs as: `runAsUser`/`runAsGroup` where set; else the image's
/// user. A `runAsUser` without `runAsGroup` gets that uid's primary group from the image's
/// /etc/passwd (0 when it has no entry), as container runtimes do.
fn effective_user(
    (uid, gid): (Option<u32>, Option<u32>),
    process: &Process,
) -> (Option<u32>, Option<u32>) {
    let Some(image_user) = &process.image_user else {
        return (uid, gid);
    };
    match uid {
        Some(u) => (
            Some(u),
            gid.or_else(|| images::user::user_by_uid(u, &process.passwd).map(|(g, _)| g)),
        ),
        None if image_user.uid == 0 && image_user.gid == 0 && gid.is_none() => (None, None),
        None => (Some(image_user.uid), Some(gid.unwrap_or(image_user.gid))),
    }
}

/// The runtime spec of a container: argv, env, mounts (volumes, /etc/hosts, termination log).
fn build_spec(
    ctx: &RunCtx,
    pod: &Pod,
    c: &Container,
    attempt: i32,
) -> Result<(ContainerSpec, PathBuf), BuildError> {
    let process = image_process(ctx, pod, c)?;
    let mut mounts = volumes::container_mounts(c, &ctx.volumes, &process.env)
        .map_err(|e| BuildError::Wait("CreateContainerConfigError", e.to_string()))?;
    if !mounts.iter().any(|m| m.target == Path::new("/etc/hosts")) {
        mounts.push(MountSpec {
            source: ctx.hosts_path.clone(),
            target: PathBuf::from("/etc/hosts"),
            read_only: false,
        });
    }
    let term_file = termination_mount(ctx, c, &mut mounts)?;
    let image_uid = process.image_user.as_ref().map(|u| u.uid);
    let sec = container_security(pod, c, image_uid)?;
    let (run_as_user, run_as_group) = effective_user((sec.run_as_user, sec.run_as_group), &process);
    let log_path = logs::log_file(&ctx.shared.dir, &c.name, attempt);
    if log_path.exists() {
        let _ = std::fs::remove_file(&log_path);
    }
    Ok((
        ContainerSpec {
            argv: process.argv,
            env: process.env,
            working_dir: process.working_dir,
            mounts,
            hostname: hosts::pod_hostname(pod),
            log_path,
            run_as_user,
            run_as_group,
            security: ProcessSecurity {
                capabilities: Some(sec.capabilities),
                no_new_privs: sec.no_new_privs,
                read_only_root: sec.read_only_root,
            },
            image_uid,
            image_root: process.image_root,
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

/// A container's process: one this agent started, or one it re-adopted (see `adopt.rs`).
pub(super) enum Proc {
    Child(tokio::process::Child),
    Adopted {
        dir: PathBuf,
        name: String,
        pid: u32,
        /// Ended while the agent was away (with the recorded code, if any).
        ended: Option<Option<i32>>,
    },
}

impl Proc {
    fn pid(&self) -> u32 {
        match self {
            Proc::Child(c) => c.id().unwrap_or_default(),
            Proc::Adopted { pid, .. } => *pid,
        }
    }

    /// Waits for the end: `(exit code, signal)`. An adopted container without a recorded code
    /// was killed with its supervisor: 137, SIGKILL. Cancel-safe.
    async fn wait(&mut self) -> (i32, Option<i32>) {
        match self {
            Proc::Child(child) => match child.wait().await {
                Ok(st) => exit_of(st),
                Err(e) => {
                    warn!(error = %e, "cannot wait for container");
                    (255, None)
                }
            },
            Proc::Adopted {
                dir,
                name,
                pid,
                ended,
            } => {
                let code = match ended {
                    Some(code) => *code,
                    None => runtime::wait_recorded(dir, name, *pid).await,
                };
                code.map_or((137, Some(9)), |c| (c, None))
            }
        }
    }
}

/// SIGTERM to the container's process group, up to `grace`, then SIGKILL.
async fn kill_container(proc: &mut Proc, grace: Duration) -> (i32, Option<i32>) {
    let pid = proc.pid();
    if let Err(e) = runtime::signal_container(pid, Signal::SIGTERM) {
        warn!(pid, error = %e, "SIGTERM failed");
    }
    if let Ok(res) = tokio::time::timeout(grace, proc.wait()).await {
        let _ = runtime::signal_container(pid, Signal::SIGKILL);
        return res;
    }
    debug!(pid, "grace period over, SIGKILL");
    if let Err(e) = runtime::signal_container(pid, Signal::SIGKILL) {
        warn!(pid, error = %e, "SIGKILL failed");
    }
    proc.wait().await
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
    proc: &mut Proc,
) -> (i32, Option<i32>) {
    let shared = &ctx.shared;
    let pid = proc.pid();
    let probes_stop = CancellationToken::new();
    let live_kill = CancellationToken::new();
    let probes = probed(slot, c).then(|| {
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
        res = proc.wait() => res,
        _ = ctx.stop_for(slot, c).cancelled() => kill_container(proc, grace()).await,
        _ = live_kill.cancelled() => {
            let g = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(DEFAULT_GRACE_SECS);
            info!(pod = %shared.name, container = %c.name, "liveness probe failed, restarting");
            kill_container(proc, Duration::from_secs(g.max(0) as u64)).await
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

/// Whether the container in `slot` is probed and has a readiness: main containers and native
/// sidecars (regular init containers have neither).
fn probed(slot: Slot, c: &Container) -> bool {
    matches!(slot, Slot::Main(_)) || crate::agent::status::is_sidecar(c)
}

/// A container run that has started (or was re-adopted).
struct Started {
    spec: ContainerSpec,
    term_file: PathBuf,
    proc: Proc,
    started_at: Timestamp,
    attempt: i32,
    image: String,
    ready: bool,
    started: bool,
}

/// Builds and starts run `attempt` of `c`; `Err` is how the run ended without starting.
fn start(
    ctx: &RunCtx,
    pod: &Pod,
    slot: Slot,
    c: &Container,
    attempt: i32,
) -> Result<Started, Outcome> {
    let shared = &ctx.shared;
    let image_name = c.image.clone().unwrap_or_default();
    let (spec, term_file) = match build_spec(ctx, pod, c, attempt) {
        Ok(s) => s,
        Err(BuildError::Wait(reason, msg)) => {
            record_waiting(shared, slot, &image_name, reason, &msg);
            debug!(pod = %shared.name, container = %c.name, reason, %msg, "container waiting");
            return Err(Outcome::Waiting);
        }
        Err(BuildError::Fail(msg)) => {
            warn!(pod = %shared.name, container = %c.name, %msg, "container cannot start");
            record_start_error(shared, slot, attempt, Some(&image_name), msg);
            return Err(Outcome::Exited(128));
        }
    };
    let child = match runtime::spawn_container(&ctx.sandbox, &c.name, &spec) {
        Ok(child) => child,
        Err(e) => {
            warn!(pod = %shared.name, container = %c.name, error = %e, "spawn failed");
            record_start_error(shared, slot, attempt, None, e.to_string());
            return Err(Outcome::Exited(128));
        }
    };
    let started_at = Timestamp::now();
    let record = adopt::RunRecord {
        pid: child.id().unwrap_or_default(),
        attempt,
        started_at: started_at.to_string(),
        image: image_name.clone(),
    };
    if let Err(e) = adopt::write_run_record(&shared.dir, &c.name, &record) {
        // It runs; only an agent started again cannot re-adopt it.
        warn!(pod = %shared.name, container = %c.name, error = %e, "no run record");
    }
    let has_startup = c.startup_probe.is_some();
    Ok(Started {
        spec,
        term_file,
        proc: Proc::Child(child),
        started_at,
        attempt,
        image: image_name,
        ready: probed(slot, c) && !has_startup && c.readiness_probe.is_none(),
        started: !has_startup,
    })
}

/// An adopted container as a started run.
fn adopted_run(ctx: &RunCtx, c: &Container, a: adopt::Adopted) -> Started {
    Started {
        term_file: termination_file(&ctx.shared.dir, &c.name),
        proc: Proc::Adopted {
            dir: ctx.shared.dir.clone(),
            name: c.name.clone(),
            pid: a.pid,
            ended: a.ended,
        },
        spec: a.spec,
        started_at: a.started_at,
        attempt: a.attempt,
        image: a.image,
        ready: a.ready,
        started: a.started,
    }
}

/// One run of a container: build, start (or take over `adopted`), probe, wait (or stop),
/// record the exit.
pub(super) async fn run_container(
    ctx: &Arc<RunCtx>,
    slot: Slot,
    fallback: &Container,
    attempt: i32,
    adopted: Option<adopt::Adopted>,
) -> Outcome {
    let shared = &ctx.shared;
    let pod = shared.pod();
    let c = current_container(&pod, slot, fallback);
    let stop = ctx.stop_for(slot, &c);
    if stop.is_cancelled() && adopted.is_none() {
        return Outcome::Stopped;
    }
    let mut run = match adopted {
        Some(a) => adopted_run(ctx, &c, a),
        None => match start(ctx, &pod, slot, &c, attempt) {
            Ok(run) => run,
            Err(outcome) => return outcome,
        },
    };
    let pid = run.proc.pid();
    let container_id = format!("localcluster://{pid}");
    let started_at = run.started_at;
    shared.update_container(slot, |r| {
        r.image = run.image.clone();
        r.restart_count = run.attempt;
        r.container_id = Some(container_id.clone());
        r.state = CState::Running { started_at };
        r.started = run.started;
        r.ready = run.ready;
    });
    let (exit_code, signal) = wait_with_probes(ctx, &pod, slot, &c, &run.spec, &mut run.proc).await;
    let message = termination_message(&c, &run.term_file, &run.spec.log_path, exit_code);
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
    if stop.is_cancelled() {
        Outcome::Stopped
    } else {
        Outcome::Exited(exit_code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(image_user: Option<(u32, u32)>) -> Process {
        Process {
            argv: vec!["/bin/sh".into()],
            env: Vec::new(),
            working_dir: None,
            image_root: image_user.map(|_| PathBuf::from("/img")),
            image_user: image_user.map(|(uid, gid)| ImageUser {
                uid,
                gid,
                home: "/".into(),
            }),
            passwd: "root:x:0:0::/root:/bin/sh\napp:x:1000:100::/app:/bin/sh\n".into(),
        }
    }

    #[test]
    fn security_context_wins_over_the_image_user() {
        let nonroot = process(Some((65532, 65532)));
        assert_eq!(
            effective_user((None, None), &nonroot),
            (Some(65532), Some(65532))
        );
        assert_eq!(
            effective_user((None, Some(5)), &nonroot),
            (Some(65532), Some(5))
        );
        assert_eq!(
            effective_user((Some(0), None), &nonroot),
            (Some(0), Some(0))
        );
        assert_eq!(
            effective_user((Some(1000), None), &nonroot),
            (Some(1000), Some(100))
        );
        assert_eq!(effective_user((Some(7), None), &nonroot), (Some(7), None));
        assert_eq!(
            effective_user((Some(7), Some(8)), &nonroot),
            (Some(7), Some(8))
        );
        // A root image changes nothing; host programs keep the security context as it is.
        assert_eq!(
            effective_user((None, None), &process(Some((0, 0)))),
            (None, None)
        );
        assert_eq!(effective_user((None, None), &process(None)), (None, None));
        assert_eq!(
            effective_user((Some(3), None), &process(None)),
            (Some(3), None)
        );
    }
}
