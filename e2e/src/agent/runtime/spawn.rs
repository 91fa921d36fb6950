//! Starting container and exec processes: the init program, the spawner thread, pid files.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::{debug, info, warn};

use super::init::InitSpec;
use super::{
    ContainerSpec, ExecOutput, INIT_PROGRAM_ENV, INIT_SUBCOMMAND, RuntimeError, Sandbox,
    host::{process_is_container, still_in_init},
    pid_file, random_u64, validate_name,
};

/// Output kept per stream of an exec.
const EXEC_OUTPUT_LIMIT: usize = 1 << 20;
/// How long an exec waits for a container that is still in its init phase.
const INIT_GRACE: Duration = Duration::from_secs(2);

/// The program implementing `container-init`: `$LOCALCLUSTER_BIN`, else the running executable
/// through `/proc/self/exe`. Not `current_exe()`: once cargo relinks the binary while the agent
/// runs, that path names a deleted file (`.../localcluster (deleted)`) and every container start
/// would fail; `/proc/self/exe` still opens the image the agent was started from.
pub(super) fn init_program() -> Result<PathBuf, RuntimeError> {
    match std::env::var_os(INIT_PROGRAM_ENV) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Ok(PathBuf::from("/proc/self/exe")),
    }
}

type Job = Box<dyn FnOnce() + Send>;

static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

fn spawner() -> Result<mpsc::Sender<Job>, RuntimeError> {
    let mut slot = SPAWNER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(tx) = slot.as_ref() {
        return Ok(tx.clone());
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("sm-spawner".into())
        .spawn(move || {
            for job in rx {
                job();
            }
        })
        .map_err(|source| RuntimeError::Io {
            what: "cannot start the spawner thread",
            path: PathBuf::new(),
            source,
        })?;
    *slot = Some(tx.clone());
    Ok(tx)
}

/// Spawns `cmd` from the spawner thread (a thread that never exits, so PR_SET_PDEATHSIG fires
/// only when the agent process dies), inside the caller's tokio runtime.
fn spawn_from_spawner(
    mut cmd: tokio::process::Command,
    program: &Path,
) -> Result<tokio::process::Child, RuntimeError> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| RuntimeError::NoTokioRuntime)?;
    let (done_tx, done_rx) = mpsc::channel();
    let job: Job = Box::new(move || {
        let _ctx = handle.enter();
        let _ = done_tx.send(cmd.spawn());
    });
    spawner()?
        .send(job)
        .map_err(|_| RuntimeError::SpawnerGone)?;
    done_rx
        .recv()
        .map_err(|_| RuntimeError::SpawnerGone)?
        .map_err(|source| RuntimeError::Spawn {
            program: program.to_path_buf(),
            source,
        })
}

/// `<init program> container-init <json>`, with an empty environment, stdin from /dev/null, in a
/// session of its own, with PR_SET_PDEATHSIG(SIGKILL).
fn init_command(program: &Path, json: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg(INIT_SUBCOMMAND)
        .arg(json)
        .env_clear()
        .stdin(Stdio::null());
    let parent = std::process::id();
    // SAFETY: runs in the forked child before exec; only async-signal-safe syscalls, no
    // allocation (the error is built from a raw errno).
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd
}

fn write_json(path: &Path, init: &InitSpec) -> Result<(), RuntimeError> {
    let text = serde_json::to_vec_pretty(init).map_err(|source| RuntimeError::Spec {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text).map_err(|source| RuntimeError::Io {
        what: "cannot write",
        path: path.to_path_buf(),
        source,
    })
}

fn mkdir_p(p: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(p).map_err(|source| RuntimeError::Io {
        what: "cannot create",
        path: p.to_path_buf(),
        source,
    })
}

/// Checks what every container run needs: a program, and mount targets that are clean absolute
/// paths.
pub(super) fn check_spec(spec: &ContainerSpec) -> Result<(), RuntimeError> {
    if spec.argv.is_empty() {
        return Err(RuntimeError::Invalid {
            what: "argv",
            value: String::new(),
            reason: "empty",
        });
    }
    for m in &spec.mounts {
        super::init::check_container_path("mount target", &m.target)?;
    }
    Ok(())
}

pub(super) fn spawn_container(
    sandbox: &Sandbox,
    name: &str,
    spec: &ContainerSpec,
) -> Result<tokio::process::Child, RuntimeError> {
    validate_name("container name", name, 200)?;
    check_spec(spec)?;
    let program = init_program()?;
    mkdir_p(&sandbox.dir)?;
    let root_dir = sandbox.dir.join(format!("{name}.root"));
    mkdir_p(&root_dir)?;
    let json = sandbox.dir.join(format!("{name}.json"));
    write_json(
        &json,
        &InitSpec {
            sandbox: sandbox.clone(),
            spec: spec.clone(),
            parent_pid: std::process::id(),
            join_pid: None,
            root_dir,
        },
    )?;
    if let Some(parent) = spec.log_path.parent() {
        mkdir_p(parent)?;
    }
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log_path)
        .map_err(|source| RuntimeError::Io {
            what: "cannot open log",
            path: spec.log_path.clone(),
            source,
        })?;
    let log2 = log.try_clone().map_err(|source| RuntimeError::Io {
        what: "cannot duplicate log fd of",
        path: spec.log_path.clone(),
        source,
    })?;
    // The previous run's exit code must not pass for this one's.
    let _ = std::fs::remove_file(super::supervise::exit_path(&json));
    let mut cmd = init_command(&program, &json);
    cmd.stdout(log).stderr(log2).kill_on_drop(false);
    let child = spawn_from_spawner(cmd, &program)?;
    let pid = child.id().unwrap_or_default();
    let pid_path = pid_file(sandbox, name);
    if let Err(source) = std::fs::write(&pid_path, format!("{pid}\n")) {
        // The container runs; only crash cleanup loses track of it (the netns scan remains).
        warn!(path = %pid_path.display(), %source, "cannot record container pid");
    }
    info!(container = name, pid, netns = %sandbox.netns, program = %spec.argv[0], "started container");
    Ok(child)
}

/// Signals the process group `pid` (a container or exec started here). ESRCH is success.
pub(super) fn signal_group(pid: u32, signal: Signal) -> Result<(), RuntimeError> {
    let Ok(raw) = i32::try_from(pid) else {
        return Err(RuntimeError::Invalid {
            what: "pid",
            value: pid.to_string(),
            reason: "out of range",
        });
    };
    if raw <= 1 {
        return Err(RuntimeError::Invalid {
            what: "pid",
            value: pid.to_string(),
            reason: "refusing to signal pid 0/1 groups",
        });
    }
    match nix::sys::signal::killpg(Pid::from_raw(raw), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(source) => Err(RuntimeError::Sys {
            what: format!("kill(-{pid}, {signal})"),
            source,
        }),
    }
}

/// The pid and init spec path of a running container of `sandbox` started with exactly `spec`.
fn running_container(sandbox: &Sandbox, spec: &ContainerSpec) -> Option<(u32, PathBuf)> {
    let entries = std::fs::read_dir(&sandbox.dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if stem.starts_with('.') {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(init) = serde_json::from_str::<InitSpec>(&text) else {
            continue;
        };
        if init.join_pid.is_some() || init.spec != *spec {
            continue;
        }
        let pid_path = sandbox.dir.join(format!("{stem}.pid"));
        let Some(pid) = std::fs::read_to_string(&pid_path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if process_is_container(pid, &path, &spec.argv, Some(&init.sandbox.netns)) {
            return Some((pid, path));
        }
    }
    None
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Reads `r` to its end, keeping at most `EXEC_OUTPUT_LIMIT` bytes.
async fn read_capped<R: AsyncRead + Unpin>(r: Option<R>) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut r) = r else { return kept };
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = EXEC_OUTPUT_LIMIT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// Removes an exec's scratch files (best effort).
struct ExecFiles {
    json: PathBuf,
    root: Option<PathBuf>,
}

impl Drop for ExecFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.json);
        if let Some(root) = &self.root {
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// The pid of a running container of `sandbox` started with `spec` that an exec can join; a
/// container still in its init after [`INIT_GRACE`] is not joined.
async fn joinable_container(sandbox: &Sandbox, spec: &ContainerSpec) -> Option<u32> {
    let (pid, json) = running_container(sandbox, spec)?;
    // A container still in its init has half-built namespaces: give it a moment to exec.
    let deadline = tokio::time::Instant::now() + INIT_GRACE;
    while still_in_init(pid, &json) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if still_in_init(pid, &json) {
        warn!(pid, "container still starting: exec gets fresh namespaces");
        None
    } else {
        Some(pid)
    }
}

/// Waits for the exec'd command (at most `timeout`, then it is killed) and collects its
/// output.
async fn exec_output(
    mut child: tokio::process::Child,
    program: &Path,
    timeout: Duration,
) -> Result<ExecOutput, RuntimeError> {
    let pid = child.id().unwrap_or_default();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let run = async {
        let status = child.wait().await;
        // Whatever the command left in its process group would hold the pipes open.
        if pid > 1 {
            let _ = signal_group(pid, Signal::SIGKILL);
        }
        status
    };
    let finished = tokio::time::timeout(timeout, async {
        tokio::join!(run, read_capped(stdout), read_capped(stderr))
    })
    .await;
    match finished {
        Ok((status, stdout, stderr)) => {
            let status = status.map_err(|source| RuntimeError::Spawn {
                program: program.to_path_buf(),
                source,
            })?;
            Ok(ExecOutput {
                exit_code: exit_code(status),
                stdout,
                stderr,
            })
        }
        Err(_) => {
            if pid > 1 {
                let _ = signal_group(pid, Signal::SIGKILL);
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(RuntimeError::ExecTimeout(timeout))
        }
    }
}

pub(super) async fn exec_in_container(
    sandbox: &Sandbox,
    spec: &ContainerSpec,
    argv: &[String],
    timeout: Duration,
) -> Result<ExecOutput, RuntimeError> {
    let mut exec_spec = spec.clone();
    exec_spec.argv = argv.to_vec();
    check_spec(&exec_spec)?;
    let program = init_program()?;
    mkdir_p(&sandbox.dir)?;
    let join_pid = joinable_container(sandbox, spec).await;
    let tag = format!(".exec-{:016x}", random_u64(&sandbox.netns));
    let root_dir = sandbox.dir.join(format!("{tag}.root"));
    let files = ExecFiles {
        json: sandbox.dir.join(format!("{tag}.json")),
        root: join_pid.is_none().then(|| root_dir.clone()),
    };
    if join_pid.is_none() {
        mkdir_p(&root_dir)?;
    }
    write_json(
        &files.json,
        &InitSpec {
            sandbox: sandbox.clone(),
            spec: exec_spec,
            parent_pid: std::process::id(),
            join_pid,
            root_dir,
        },
    )?;
    let mut cmd = init_command(&program, &files.json);
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = spawn_from_spawner(cmd, &program)?;
    debug!(pid = child.id().unwrap_or_default(), ?join_pid, argv = ?argv, "exec started");
    let output = exec_output(child, &program, timeout).await;
    drop(files);
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
    }

    #[test]
    fn refuses_to_signal_special_groups() {
        assert!(signal_group(0, Signal::SIGTERM).is_err());
        assert!(signal_group(1, Signal::SIGTERM).is_err());
        assert!(signal_group(u32::MAX, Signal::SIGTERM).is_err());
    }

    #[tokio::test]
    async fn output_is_capped() {
        let data = vec![7u8; EXEC_OUTPUT_LIMIT + 10];
        let out = read_capped(Some(&data[..])).await;
        assert_eq!(out.len(), EXEC_OUTPUT_LIMIT);
        assert!(read_capped(None::<&[u8]>).await.is_empty());
    }
}
