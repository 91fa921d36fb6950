//! Detached component processes: spawn with pid and log files, signal, stop; a recorded
//! pid is only signalled when its command line names the state dir.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{info, warn};

use crate::controlplane::{ControlPlaneError, Result, io_err};

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
pub(super) fn is_ours(pid: i32, dir: &Path) -> bool {
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

pub(super) struct Started {
    pub(super) name: &'static str,
    pub(super) child: Child,
    pub(super) log: PathBuf,
}

/// Starts `program args` detached, logging to `logs/<name>.log`, pid in `pids/<name>.pid`.
pub(super) fn spawn(
    dir: &Path,
    name: &'static str,
    program: &Path,
    args: &[String],
) -> Result<Started> {
    spawn_env(dir, name, program, args, None)
}

/// The NUL-separated entries of `/proc/<pid>/<file>` (`cmdline`, `environ`).
pub(super) fn proc_list(pid: i32, file: &str) -> Option<Vec<std::ffi::OsString>> {
    use std::os::unix::ffi::OsStringExt;
    let raw = std::fs::read(format!("/proc/{pid}/{file}")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| std::ffi::OsString::from_vec(s.to_vec()))
            .collect(),
    )
}

/// The recorded pid of component `name` of `dir`, if it is alive and ours.
pub(super) fn running_pid(dir: &Path, name: &str) -> Option<i32> {
    read_pid(&pid_path(dir, name)).filter(|pid| is_ours(*pid, dir))
}

/// Waits (up to `timeout`) until `pid` is gone; false if it is still there.
pub(super) fn wait_exit(pid: i32, timeout: Duration) -> bool {
    wait_gone(pid, timeout)
}

/// [`spawn`], with exactly the environment `env` when given (`KEY=VALUE` entries).
pub(super) fn spawn_env(
    dir: &Path,
    name: &'static str,
    program: &Path,
    args: &[String],
    env: Option<&[std::ffi::OsString]>,
) -> Result<Started> {
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
    if let Some(env) = env {
        use std::os::unix::ffi::OsStrExt;
        cmd.env_clear();
        for entry in env {
            let bytes = entry.as_bytes();
            if let Some(i) = bytes.iter().position(|b| *b == b'=') {
                cmd.env(
                    std::ffi::OsStr::from_bytes(&bytes[..i]),
                    std::ffi::OsStr::from_bytes(&bytes[i + 1..]),
                );
            }
        }
    }
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
pub(super) fn signal(pid: i32, sig: Signal) {
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
pub(super) fn stop(dir: &Path, name: &str, grace: Duration) {
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

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::Path;

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
}
