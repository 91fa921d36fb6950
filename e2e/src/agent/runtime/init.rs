//! `container-init`: runs in a fresh single-threaded process started by the agent, turns it into
//! the container (namespaces, private root, mounts, credentials) and execs the program.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};
use nix::unistd::{AccessFlags, Gid, Uid};
use serde::{Deserialize, Serialize};

use super::confine;
use super::net::netns_path;
use super::spawn::check_spec;
use super::supervise;
use super::{ContainerSpec, RuntimeError, Sandbox};

/// What `spawn_container` / `exec_in_container` write for `container-init`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct InitSpec {
    pub sandbox: Sandbox,
    pub spec: ContainerSpec,
    /// pid of the agent process; the init exits if it is no longer its parent (until a new
    /// container's supervisor forks, see `supervise.rs`).
    pub parent_pid: u32,
    /// `Some(pid)`: an exec into the running container `pid` (join its namespaces);
    /// `None`: build a new container.
    pub join_pid: Option<u32>,
    /// Existing (empty) host directory on which the container's private tmpfs (overlay upper and
    /// work dirs, merged root) is mounted, inside the container's mount namespace only.
    pub root_dir: PathBuf,
}

/// PATH used to find a program without `/` when the spec's env has none (the kubelet default).
pub(super) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Size limits of the container's private tmpfs mounts (memory is used only as written).
const ROOT_TMPFS: &str = "mode=0755,size=1g";
const RUN_TMPFS: &str = "mode=0755,size=256m";
const SHM_TMPFS: &str = "mode=1777,size=64m";
/// The container's own `/dev` (device nodes are bind mounts and take no space in it).
const DEV_TMPFS: &str = "mode=0755,size=4m";
/// Host device nodes bound into every container's `/dev` (the default set of runc).
const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// A new devpts instance per container, as runc mounts it (group 5 is `tty`).
const DEVPTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0620,gid=5";
/// Symlinks of a container's `/dev` (as runc makes them).
const DEV_SYMLINKS: &[(&str, &str)] = &[
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];
/// Mount point of the old root between `pivot_root` and its detach.
const OLD_ROOT: &str = "/.sm-oldroot";

pub(super) fn container_init(spec_path: &Path) -> RuntimeError {
    match run(spec_path) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Sys { what, source }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let path = path.to_path_buf();
    move |source| RuntimeError::Io { what, path, source }
}

fn run(spec_path: &Path) -> Result<Infallible, RuntimeError> {
    let threads = thread_count();
    if threads > 1 {
        return Err(RuntimeError::NotSingleThreaded(threads));
    }
    let text = std::fs::read_to_string(spec_path).map_err(io("cannot read", spec_path))?;
    let init: InitSpec = serde_json::from_str(&text).map_err(|source| RuntimeError::Spec {
        path: spec_path.to_path_buf(),
        source,
    })?;
    ensure_parent(init.parent_pid)?;
    let spec = &init.spec;
    // Everything that can fail on bad input is checked before the process is changed.
    let (argv, envp) = checked_argv_envp(spec)?;
    // A new container records its exit code (see `supervise.rs`); the file is opened while the
    // host's pod dir is still visible.
    let exit_file = match init.join_pid {
        Some(pid) => {
            join_container(pid)?;
            None
        }
        None => {
            let file = supervise::open_exit_file(spec_path)?;
            new_container(&init)?;
            Some(file)
        }
    };
    if let Some(wd) = &spec.working_dir {
        // As the runtime does for a missing workingDir: create it (as root).
        std::fs::create_dir_all(wd).map_err(io("cannot create working dir", wd))?;
    }
    if init.join_pid.is_none() && spec.security.read_only_root {
        confine::read_only_root()?;
    }
    // From here on a new container's program is the child of its supervisor.
    let parent = match exit_file {
        Some(file) => supervise::fork_supervisor(file)?,
        None => init.parent_pid,
    };
    confine::before_credentials(&spec.security)?;
    set_credentials(spec)?;
    confine::after_credentials(&spec.security)?;
    // A credential change clears the parent-death signal: set it again, then re-check that the
    // parent (the agent for an exec, the supervisor for a container) did not die in between.
    ensure_parent(parent)?;
    let wd = spec.working_dir.as_deref().unwrap_or(Path::new("/"));
    nix::unistd::chdir(wd).map_err(sys(format!("chdir({})", wd.display())))?;
    exec(spec, &argv, &envp)
}

/// Checks the spec's argv, mounts, working dir and environment; returns argv and envp as C
/// strings.
fn checked_argv_envp(spec: &ContainerSpec) -> Result<(Vec<CString>, Vec<CString>), RuntimeError> {
    check_spec(spec)?;
    for m in &spec.mounts {
        if !m.source.is_absolute() {
            return Err(RuntimeError::Invalid {
                what: "mount source",
                value: m.source.display().to_string(),
                reason: "must be absolute",
            });
        }
    }
    if let Some(wd) = &spec.working_dir {
        check_container_path("working dir", wd)?;
    }
    let argv = cstrings(spec.argv.iter().map(String::as_str))?;
    let envp = cstrings(
        spec.env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
    )?;
    for (k, _) in &spec.env {
        if k.is_empty() || k.contains('=') {
            return Err(RuntimeError::Invalid {
                what: "environment variable name",
                value: k.clone(),
                reason: "empty or contains '='",
            });
        }
    }
    Ok((argv, envp))
}

/// Switches to `runAsUser` / `runAsGroup` (0 for the one unset) when either is set.
fn set_credentials(spec: &ContainerSpec) -> Result<(), RuntimeError> {
    if spec.run_as_user.is_some() || spec.run_as_group.is_some() {
        let gid = Gid::from_raw(spec.run_as_group.unwrap_or(0));
        let uid = Uid::from_raw(spec.run_as_user.unwrap_or(0));
        nix::unistd::setgroups(&[gid]).map_err(sys("setgroups"))?;
        nix::unistd::setgid(gid).map_err(sys(format!("setgid({gid})")))?;
        nix::unistd::setuid(uid).map_err(sys(format!("setuid({uid})")))?;
    }
    Ok(())
}

/// Resolves the program on the container's PATH and replaces this process with it.
fn exec(
    spec: &ContainerSpec,
    argv: &[CString],
    envp: &[CString],
) -> Result<Infallible, RuntimeError> {
    let program = spec.argv.first().map(String::as_str).unwrap_or_default();
    let path_var = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(DEFAULT_PATH);
    let resolved = resolve_program(program, path_var, is_executable)?;
    let resolved =
        CString::new(resolved.as_os_str().as_bytes()).map_err(|_| RuntimeError::Invalid {
            what: "program",
            value: program.to_string(),
            reason: "contains NUL",
        })?;
    reset_signals()?;
    let err = nix::unistd::execve(&resolved, argv, envp).map_err(sys(format!("execve({program})")));
    match err {
        Ok(never) => match never {},
        Err(e) => Err(e),
    }
}

/// Number of threads of this process (from /proc/self/status), 0 if unknown.
fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Sets PR_SET_PDEATHSIG(SIGKILL) and checks that the agent is still the parent.
fn ensure_parent(parent_pid: u32) -> Result<(), RuntimeError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys("prctl(PR_SET_PDEATHSIG)"))?;
    if nix::unistd::getppid().as_raw() as u32 != parent_pid {
        return Err(RuntimeError::ParentGone(parent_pid));
    }
    Ok(())
}

fn cstrings<'a>(items: impl Iterator<Item = &'a str>) -> Result<Vec<CString>, RuntimeError> {
    items
        .map(|s| {
            CString::new(s).map_err(|_| RuntimeError::Invalid {
                what: "argument or environment entry",
                value: s.to_owned(),
                reason: "contains NUL",
            })
        })
        .collect()
}

/// Paths inside the container must be absolute and free of `..`.
pub(super) fn check_container_path(what: &'static str, p: &Path) -> Result<(), RuntimeError> {
    if !p.is_absolute() {
        return Err(RuntimeError::Invalid {
            what,
            value: p.display().to_string(),
            reason: "must be absolute",
        });
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(RuntimeError::Invalid {
            what,
            value: p.display().to_string(),
            reason: "must not contain '..'",
        });
    }
    Ok(())
}

fn is_executable(p: &Path) -> bool {
    p.is_file() && nix::unistd::access(p, AccessFlags::X_OK).is_ok()
}

/// `program` as is if it contains `/`, else the first executable `<dir>/program` of `path_var`.
pub(super) fn resolve_program(
    program: &str,
    path_var: &str,
    executable: impl Fn(&Path) -> bool,
) -> Result<PathBuf, RuntimeError> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    if !program.is_empty() {
        for dir in path_var.split(':') {
            let dir = if dir.is_empty() { "." } else { dir };
            let candidate = Path::new(dir).join(program);
            if executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    Err(RuntimeError::ProgramNotFound {
        program: program.to_owned(),
        path: path_var.to_owned(),
    })
}

/// Default dispositions for every signal (a Rust parent ignores SIGPIPE; ignored signals would
/// stay ignored across exec) and an empty signal mask.
fn reset_signals() -> Result<(), RuntimeError> {
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: single-threaded process about to exec; SIG_DFL installs no Rust handler.
        unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) }
            .map_err(sys(format!("signal({sig}, SIG_DFL)")))?;
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(sys("sigprocmask"))
}

/// Exec: join the network, UTS, IPC and mount namespaces of the running container `pid`. Joining
/// the mount namespace also moves root and cwd to that namespace's root: the container's root.
fn join_container(pid: u32) -> Result<(), RuntimeError> {
    let kinds = [
        ("net", CloneFlags::CLONE_NEWNET),
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("mnt", CloneFlags::CLONE_NEWNS),
    ];
    let mut fds = Vec::with_capacity(kinds.len());
    for (kind, flag) in kinds {
        let path = PathBuf::from(format!("/proc/{pid}/ns/{kind}"));
        fds.push((
            File::open(&path).map_err(io("cannot open", &path))?,
            flag,
            path,
        ));
    }
    for (fd, flag, path) in fds {
        nix::sched::setns(&fd, flag).map_err(sys(format!("setns({})", path.display())))?;
    }
    nix::unistd::chdir("/").map_err(sys("chdir(/)"))
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), RuntimeError> {
    nix::mount::mount(source, target, fstype, flags, data).map_err(sys(format!(
        "mount {} on {} ({})",
        source.map(|s| s.display().to_string()).unwrap_or_default(),
        target.display(),
        fstype.unwrap_or("bind/remount"),
    )))
}

fn mkdir_p(p: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(p).map_err(io("cannot create", p))
}

/// New container: the sandbox's network namespace, new mount/UTS/IPC namespaces, a private root
/// (overlay of the image's root or the host's `/`), the spec's bind mounts, the hostname.
fn new_container(init: &InitSpec) -> Result<(), RuntimeError> {
    let spec = &init.spec;
    enter_namespaces(init)?;
    // Sources are opened while the host's tree is visible; they are mounted after the pivot
    // from /proc/self/fd, so targets resolve inside the new root (its absolute symlinks such as
    // /var/run -> /run included) and never on the host.
    let sources = open_mount_sources(spec)?;
    let lower = overlay_lower(spec)?;
    let merged = private_root(&init.root_dir, &lower)?;
    nix::unistd::chdir(merged.as_path()).map_err(sys(format!("chdir({})", merged.display())))?;
    let old = Path::new(OLD_ROOT);
    let old_rel = Path::new(OLD_ROOT.trim_start_matches('/'));
    mkdir_p(old_rel)?;
    nix::unistd::pivot_root(".", old_rel).map_err(sys("pivot_root"))?;
    nix::unistd::chdir("/").map_err(sys("chdir(/)"))?;
    bind_mounts(spec, &sources)?;
    drop(sources);
    nix::mount::umount2(old, MntFlags::MNT_DETACH).map_err(sys("detach the old root"))?;
    std::fs::remove_dir(old).map_err(io("cannot remove", old))?;
    if !spec.hostname.is_empty() {
        nix::unistd::sethostname(&spec.hostname)
            .map_err(sys(format!("sethostname({})", spec.hostname)))?;
    }
    Ok(())
}

/// Joins the sandbox's network namespace, then unshares new mount, UTS and IPC namespaces and
/// makes every mount private.
fn enter_namespaces(init: &InitSpec) -> Result<(), RuntimeError> {
    let ns = netns_path(&init.sandbox.netns);
    let ns_fd = File::open(&ns).map_err(io("cannot open network namespace", &ns))?;
    nix::sched::setns(&ns_fd, CloneFlags::CLONE_NEWNET)
        .map_err(sys(format!("setns({})", ns.display())))?;
    drop(ns_fd);
    nix::sched::unshare(
        CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC,
    )
    .map_err(sys("unshare(mount, UTS, IPC)"))?;
    mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )
}

/// Opens every mount source (`O_PATH`); with whether it is a directory.
fn open_mount_sources(spec: &ContainerSpec) -> Result<Vec<(OwnedFd, bool)>, RuntimeError> {
    let mut sources: Vec<(OwnedFd, bool)> = Vec::with_capacity(spec.mounts.len());
    for m in &spec.mounts {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(&m.source)
            .map_err(io("cannot open mount source", &m.source))?;
        let is_dir = file
            .metadata()
            .map_err(io("cannot stat mount source", &m.source))?
            .is_dir();
        sources.push((file.into(), is_dir));
    }
    Ok(sources)
}

/// The lower dir of the container's overlay root: the stored image's root filesystem, else the
/// host's `/`. It goes into the overlay's option string: absolute, an existing directory, and
/// free of the characters that separate or escape overlay options.
fn overlay_lower(spec: &ContainerSpec) -> Result<PathBuf, RuntimeError> {
    let Some(lower) = &spec.image_root else {
        return Ok(PathBuf::from("/"));
    };
    check_container_path("image root", lower)?;
    let text = lower.to_str().unwrap_or(",");
    if text.contains([',', ':', '\\', '=']) {
        return Err(RuntimeError::Invalid {
            what: "image root",
            value: lower.display().to_string(),
            reason: "must not contain ',', ':', '=' or '\\'",
        });
    }
    if !lower.is_dir() {
        return Err(RuntimeError::Invalid {
            what: "image root",
            value: lower.display().to_string(),
            reason: "is not a directory (image removed from the store?)",
        });
    }
    Ok(lower.clone())
}

/// Builds the private root under `root`: a tmpfs holding an overlay of `lower` (the image's
/// root) at `merged`, with fresh `proc`, `sys`, `dev` and `run`. Returns the `merged` path.
fn private_root(root: &Path, lower: &Path) -> Result<PathBuf, RuntimeError> {
    mount(
        Some(Path::new("tmpfs")),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(ROOT_TMPFS),
    )?;
    nix::unistd::chdir(root).map_err(sys(format!("chdir({})", root.display())))?;
    for d in ["upper", "work", "merged"] {
        mkdir_p(Path::new(d))?;
    }
    // Relative upper/work paths (resolved against the cwd) keep odd characters of the state
    // dir out of the option string. The upper layer is on a tmpfs: overlayfs refuses an upper
    // dir inside its lower dir's filesystem.
    mount(
        Some(Path::new("overlay")),
        Path::new("merged"),
        Some("overlay"),
        MsFlags::empty(),
        Some(&format!(
            "lowerdir={},upperdir=upper,workdir=work",
            lower.display()
        )),
    )?;
    let merged = root.join("merged");
    let at = |p: &str| merged.join(p);
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // `/tmp` is the image's (the host's, through the overlay: writes stay private). A fresh tmpfs
    // there would hide programs that live under the host's /tmp, e.g. a checkout in /tmp.
    for d in ["proc", "sys", "dev", "run"] {
        mkdir_p(&at(d))?;
    }
    mount(
        Some(Path::new("proc")),
        &at("proc"),
        Some("proc"),
        nosuid_nodev | MsFlags::MS_NOEXEC,
        None,
    )?;
    // A fresh sysfs shows the pod's network devices.
    mount(
        Some(Path::new("sysfs")),
        &at("sys"),
        Some("sysfs"),
        nosuid_nodev | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        None,
    )?;
    private_dev(&at("dev"))?;
    mount(
        Some(Path::new("tmpfs")),
        &at("run"),
        Some("tmpfs"),
        nosuid_nodev,
        Some(RUN_TMPFS),
    )?;
    Ok(merged)
}

/// Bind-mounts each source (opened before the pivot) on its target inside the new root,
/// read-only where asked.
fn bind_mounts(spec: &ContainerSpec, sources: &[(OwnedFd, bool)]) -> Result<(), RuntimeError> {
    for (m, (fd, is_dir)) in spec.mounts.iter().zip(sources) {
        prepare_target(&m.target, *is_dir)?;
        let src = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        mount(Some(&src), &m.target, None, MsFlags::MS_BIND, None).map_err(|e| match e {
            RuntimeError::Sys { source, .. } => RuntimeError::Sys {
                what: format!("bind {} on {}", m.source.display(), m.target.display()),
                source,
            },
            e => e,
        })?;
        if m.read_only {
            mount(
                None,
                &m.target,
                None,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None,
            )?;
        }
    }
    Ok(())
}

/// The container's private `/dev` on `dev` (before the pivot, so the host's `/dev` is still
/// visible as the source of the device nodes): a small tmpfs with the host's null, zero, full,
/// random, urandom and tty bound into it, a new devpts instance on `pts` (a recursive bind of the
/// host's `/dev/pts` where a new instance is refused), `ptmx -> pts/ptmx`, a tmpfs on `shm`, the
/// IPC namespace's `mqueue` (skipped if refused) and the `fd`/`stdin`/`stdout`/`stderr`
/// symlinks. Nothing a container creates in its `/dev` (e.g. `/dev/termination-log`, mounted
/// from the pod's dir by the agent) reaches the host's devtmpfs.
fn private_dev(dev: &Path) -> Result<(), RuntimeError> {
    let host_dev = Path::new("/dev");
    mount(
        Some(Path::new("tmpfs")),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some(DEV_TMPFS),
    )?;
    for name in DEV_NODES {
        let source = host_dev.join(name);
        if std::fs::symlink_metadata(&source).is_err() {
            continue;
        }
        let target = dev.join(name);
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(&target)
            .map_err(io("cannot create device mount point", &target))?;
        mount(Some(&source), &target, None, MsFlags::MS_BIND, None)?;
    }
    let pts = dev.join("pts");
    mkdir_p(&pts)?;
    let new_devpts = nix::mount::mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(DEVPTS_OPTIONS),
    );
    if new_devpts.is_err() {
        mount(
            Some(&host_dev.join("pts")),
            &pts,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?;
    }
    let shm = dev.join("shm");
    mkdir_p(&shm)?;
    mount(
        Some(Path::new("shm")),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(SHM_TMPFS),
    )?;
    let mqueue = dev.join("mqueue");
    mkdir_p(&mqueue)?;
    let mq = nix::mount::mount(
        Some("mqueue"),
        &mqueue,
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    );
    if mq.is_err() {
        // Optional, as in runc's defaults: a container without it only lacks POSIX queues' fs.
        std::fs::remove_dir(&mqueue).map_err(io("cannot remove", &mqueue))?;
    }
    for (name, points_to) in DEV_SYMLINKS {
        let link = dev.join(name);
        std::os::unix::fs::symlink(points_to, &link).map_err(io("cannot create symlink", &link))?;
    }
    Ok(())
}

/// Makes the bind target exist (in the container's root): a directory for a directory source,
/// an empty file (and its parent directories) otherwise.
fn prepare_target(target: &Path, source_is_dir: bool) -> Result<(), RuntimeError> {
    if source_is_dir {
        return mkdir_p(target);
    }
    if let Some(parent) = target.parent() {
        mkdir_p(parent)?;
    }
    if std::fs::symlink_metadata(target).is_err() {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(target)
            .map_err(io("cannot create mount target", target))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_resolve_through_path() {
        let exe = |p: &Path| p == Path::new("/opt/b/etcd") || p == Path::new("/opt/c/etcd");
        assert_eq!(
            resolve_program("etcd", "/opt/a:/opt/b:/opt/c", exe).unwrap(),
            PathBuf::from("/opt/b/etcd")
        );
        assert_eq!(
            resolve_program("/usr/bin/x", "", |_| false).unwrap(),
            PathBuf::from("/usr/bin/x")
        );
        assert!(matches!(
            resolve_program("etcd", "/opt/a", exe),
            Err(RuntimeError::ProgramNotFound { .. })
        ));
        assert!(resolve_program("", "/opt/b", exe).is_err());
        assert!(resolve_program("sh", DEFAULT_PATH, is_executable).is_ok());
    }

    #[test]
    fn overlay_lower_is_the_image_root_or_the_host() {
        let mut spec = ContainerSpec {
            argv: vec!["sh".into()],
            env: Vec::new(),
            working_dir: None,
            mounts: Vec::new(),
            hostname: String::new(),
            log_path: PathBuf::from("/l"),
            run_as_user: None,
            run_as_group: None,
            security: Default::default(),
            image_root: None,
            image_uid: None,
        };
        assert_eq!(overlay_lower(&spec).unwrap(), PathBuf::from("/"));
        let dir = std::env::temp_dir();
        spec.image_root = Some(dir.clone());
        assert_eq!(overlay_lower(&spec).unwrap(), dir);
        for bad in [
            "/a,b",
            "/a:b",
            "/a=b",
            "rel",
            "/a/../b",
            "/nonexistent-image-root",
        ] {
            spec.image_root = Some(PathBuf::from(bad));
            assert!(overlay_lower(&spec).is_err(), "{bad}");
        }
    }

    #[test]
    fn container_paths_are_absolute_without_dotdot() {
        assert!(check_container_path("t", Path::new("/var/run/etcd")).is_ok());
        assert!(check_container_path("t", Path::new("data")).is_err());
        assert!(check_container_path("t", Path::new("/data/../etc")).is_err());
    }

    #[test]
    fn this_test_process_is_not_single_threaded() {
        // Guards the check container_init relies on (the test harness runs threads).
        let _t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        assert!(thread_count() > 1);
    }

    #[test]
    fn init_spec_round_trips() {
        let spec = InitSpec {
            sandbox: Sandbox {
                netns: "smabc123-pod".into(),
                ip: std::net::Ipv4Addr::new(198, 18, 7, 2),
                host_veth: "smvabc1230001".into(),
                dir: PathBuf::from("/s/nodes/node-a/pods/u"),
            },
            spec: ContainerSpec {
                argv: vec!["/usr/bin/etcd".into(), "--name".into(), "etcd-0".into()],
                env: vec![("A".into(), "1".into())],
                working_dir: None,
                mounts: vec![super::super::MountSpec {
                    source: PathBuf::from("/s/v"),
                    target: PathBuf::from("/var/run/etcd"),
                    read_only: false,
                }],
                hostname: "etcd-0".into(),
                log_path: PathBuf::from("/s/l.log"),
                run_as_user: Some(1000),
                run_as_group: None,
                security: super::super::ProcessSecurity {
                    capabilities: Some(vec!["CAP_CHOWN".into()]),
                    no_new_privs: true,
                    read_only_root: true,
                },
                image_root: Some(PathBuf::from("/s/images/sha256/ab/rootfs")),
                image_uid: Some(65532),
            },
            parent_pid: 1,
            join_pid: None,
            root_dir: PathBuf::from("/s/nodes/node-a/pods/u/etcd.root"),
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<InitSpec>(&text).unwrap(), spec);
    }
}
