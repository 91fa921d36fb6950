//! The container's supervisor: `container-init` forks once its namespaces and root are built.
//! The child goes on (credentials, exec of the program); the parent stays, as root, in the
//! container's namespaces and waits for the program. It is no child of the agent's lifetime: it
//! clears the parent-death signal, ignores the termination signals (the agent signals the whole
//! process group; the program decides), and when the program ends it writes its exit code to
//! `<name>.exit` next to the init spec and ends the same way (same code, same signal). So a
//! container outlives the agent, and an agent started again learns how it ended
//! ([`recorded_exit`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use super::RuntimeError;

/// Signals the supervisor ignores (the agent sends them to the process group, for the program).
const IGNORED: &[Signal] = &[
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGPIPE,
];

/// `<dir>/<name>.exit` for the init spec `<dir>/<name>.json`.
pub(super) fn exit_path(json: &Path) -> PathBuf {
    json.with_extension("exit")
}

/// The exit code recorded by the supervisor of the container whose init spec is `json`.
pub(super) fn recorded_exit(json: &Path) -> Option<i32> {
    parse_exit(&std::fs::read_to_string(exit_path(json)).ok()?)
}

/// `"<code>\n"` as written by the supervisor.
pub(super) fn parse_exit(text: &str) -> Option<i32> {
    text.trim().parse().ok()
}

/// Opens (empty) the exit file of the container `json` while the host's tree is visible.
pub(super) fn open_exit_file(json: &Path) -> Result<File, RuntimeError> {
    let path = exit_path(json);
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|source| RuntimeError::Io {
            what: "cannot open the exit file",
            path,
            source,
        })
}

fn sys(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> RuntimeError {
    move |source| RuntimeError::Sys {
        what: what.to_string(),
        source,
    }
}

/// Forks the supervisor. Returns in the child (the future program), with the supervisor's pid;
/// the parent never returns. The child dies with its supervisor (PR_SET_PDEATHSIG).
pub(super) fn fork_supervisor(exit_file: File) -> Result<u32, RuntimeError> {
    let supervisor = nix::unistd::getpid();
    for sig in IGNORED {
        // SAFETY: single-threaded process; SIG_IGN installs no handler. The child resets every
        // disposition before exec.
        unsafe { nix::sys::signal::signal(*sig, SigHandler::SigIgn) }
            .map_err(sys("ignore a signal"))?;
    }
    // SAFETY: the process is single-threaded (checked at the start of container-init).
    match unsafe { nix::unistd::fork() }.map_err(sys("fork the supervisor"))? {
        ForkResult::Child => {
            drop(exit_file);
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(sys("prctl(PR_SET_PDEATHSIG)"))?;
            if nix::unistd::getppid() != supervisor {
                return Err(RuntimeError::ParentGone(supervisor.as_raw() as u32));
            }
            Ok(supervisor.as_raw() as u32)
        }
        ForkResult::Parent { child } => supervise(child, exit_file),
    }
}

/// `(exit code, signal)` in the shell's convention.
fn ended(status: WaitStatus) -> Option<(i32, Option<Signal>)> {
    match status {
        WaitStatus::Exited(_, code) => Some((code, None)),
        WaitStatus::Signaled(_, sig, _) => Some((128 + sig as i32, Some(sig))),
        _ => None,
    }
}

/// Waits for the program, records its exit code, and ends as it did.
fn supervise(child: Pid, mut exit_file: File) -> ! {
    let _ = nix::sys::prctl::set_pdeathsig(None);
    let (code, signal) = loop {
        match waitpid(child, None) {
            Ok(status) => {
                if let Some(end) = ended(status) {
                    break end;
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break (255, None),
        }
    };
    let _ = writeln!(exit_file, "{code}");
    let _ = exit_file.sync_all();
    if let Some(sig) = signal {
        // End by the same signal (no core dump of the supervisor).
        let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
        // SAFETY: single-threaded; SIG_DFL installs no handler.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
        let mut set = SigSet::empty();
        set.add(sig);
        let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
        let _ = nix::sys::signal::raise(sig);
    }
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_files_and_codes() {
        assert_eq!(
            exit_path(Path::new("/p/etcd.json")),
            PathBuf::from("/p/etcd.exit")
        );
        assert_eq!(parse_exit("3\n"), Some(3));
        assert_eq!(parse_exit(""), None);
        let pid = Pid::from_raw(5);
        assert_eq!(ended(WaitStatus::Exited(pid, 2)), Some((2, None)));
        assert_eq!(
            ended(WaitStatus::Signaled(pid, Signal::SIGKILL, false)),
            Some((137, Some(Signal::SIGKILL)))
        );
    }
}
