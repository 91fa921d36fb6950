//! Host cleanup: container processes, mounts under `nodes/`, network namespaces, veths, bridge.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::MntFlags;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tracing::{info, warn};

use super::net::{NETNS_DIR, delete_link, delete_netns, lock_cluster, netns_path};
use super::{INIT_SUBCOMMAND, Keep, RuntimeError};
use crate::mountinfo;
use crate::state::ClusterState;

/// How deep below `nodes/` pid files are looked for (`<node>/pods/<uid>/<name>.pid` is 4).
const PID_FILE_MAX_DEPTH: usize = 6;

/// The NUL-separated command line of `pid`, `None` if the process is gone.
fn cmdline(pid: u32) -> Option<Vec<Vec<u8>>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// Whether `cmdline` is our init for `json` (`<prog> container-init <json>`) or the container's
/// program after exec (exactly `argv`).
pub(super) fn cmdline_is_container(cmdline: &[Vec<u8>], json: &Path, argv: &[String]) -> bool {
    let is_init = cmdline.len() == 3
        && cmdline[1] == INIT_SUBCOMMAND.as_bytes()
        && cmdline[2] == json.as_os_str().as_bytes();
    let is_program = !argv.is_empty()
        && cmdline.len() == argv.len()
        && cmdline.iter().zip(argv).all(|(a, b)| a == b.as_bytes());
    is_init || is_program
}

/// Whether process `pid` is still our init for `json` (it has not exec'd the program yet, so its
/// namespaces and mounts may be half-built).
/// A new container's init stays as its supervisor (see `supervise.rs`): it is still in its init
/// until a child of it has exec'd the program.
pub(super) fn still_in_init(pid: u32, json: &Path) -> bool {
    let is_init = |p: u32| cmdline(p).is_some_and(|c| cmdline_is_container(&c, json, &[]));
    is_init(pid)
        && !children(pid)
            .into_iter()
            .any(|c| is_alive(c) && !is_init(c))
}

/// The children of `pid` (`/proc/<pid>/task/<pid>/children`).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The sandbox recorded in every init spec (`*.json`) of `dir`.
pub(super) fn recorded_sandboxes(dir: &Path) -> Vec<super::Sandbox> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|t| serde_json::from_str::<super::init::InitSpec>(&t).ok())
        .map(|i| i.sandbox)
        .collect()
}

/// Whether process `pid` is in network namespace `/run/netns/<netns>`.
fn in_netns(pid: u32, netns: &str) -> bool {
    let Ok(ns) = std::fs::metadata(netns_path(netns)) else {
        return false;
    };
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .is_ok_and(|m| (m.dev(), m.ino()) == (ns.dev(), ns.ino()))
}

/// Whether process `pid` is alive (not a zombie) and still the container recorded by `json`
/// (`argv`, sandbox `netns`): its command line shows the init for `json` or `argv`, or (the
/// program may have exec'd another, as `sh -c '...; exec x'` does) it runs inside `netns`.
pub(super) fn process_is_container(
    pid: u32,
    json: &Path,
    argv: &[String],
    netns: Option<&str>,
) -> bool {
    pid > 1
        && is_alive(pid)
        && (cmdline(pid).is_some_and(|c| cmdline_is_container(&c, json, argv))
            || netns.is_some_and(|ns| in_netns(pid, ns)))
}

/// Alive and not a zombie.
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself contain ") ".
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Mount points under `nodes_dir` to unmount, deepest first: all but those under
/// `nodes/<node>/volumes/` (the provisioner's loop mounts). Duplicates (stacked mounts) are kept
/// once; lazy unmount removes the whole stack.
pub(super) fn mounts_to_remove(all: &[PathBuf], nodes_dir: &Path) -> Vec<PathBuf> {
    let mut chosen: BTreeSet<PathBuf> = BTreeSet::new();
    for mp in all {
        let Ok(rel) = mp.strip_prefix(nodes_dir) else {
            continue;
        };
        let comps: Vec<Component> = rel.components().collect();
        let is_volume = comps.len() >= 2 && comps[1].as_os_str() == "volumes";
        if comps.is_empty() || is_volume {
            continue;
        }
        chosen.insert(mp.clone());
    }
    let mut out: Vec<PathBuf> = chosen.into_iter().collect();
    out.sort_by(|a, b| {
        b.components()
            .count()
            .cmp(&a.components().count())
            .then_with(|| b.cmp(a))
    });
    out
}

/// `*.pid` files below `nodes_dir` (not below `<node>/volumes`, not crossing filesystems).
fn pid_files(nodes_dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(top) = std::fs::symlink_metadata(nodes_dir) else {
        return found;
    };
    let mut stack = vec![(nodes_dir.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                let is_volumes = depth == 1 && entry.file_name() == "volumes";
                if !is_volumes && meta.dev() == top.dev() && depth < PID_FILE_MAX_DEPTH {
                    stack.push((path, depth + 1));
                }
            } else if meta.is_file() && path.extension().is_some_and(|e| e == "pid") {
                found.push(path);
            }
        }
    }
    found
}

/// `(dev, inode)` of every network namespace of this cluster, with its name.
fn cluster_netns(state: &ClusterState) -> Vec<(String, (u64, u64))> {
    let prefix = state.netns_prefix();
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with(&prefix))
        .map(|n| {
            let id = std::fs::metadata(netns_path(&n))
                .map(|m| (m.dev(), m.ino()))
                .unwrap_or((0, 0));
            (n, id)
        })
        .collect()
}

/// Pids of the processes whose network namespace is one of `ns_ids`.
fn processes_in(ns_ids: &[(u64, u64)]) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| *pid != me && *pid > 1)
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| ns_ids.contains(&(m.dev(), m.ino())))
        })
        .collect()
}

fn kill(pid: u32, group: bool) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 {
        return;
    }
    if group {
        let _ = nix::sys::signal::killpg(Pid::from_raw(raw), Signal::SIGKILL);
    }
    let _ = nix::sys::signal::kill(Pid::from_raw(raw), Signal::SIGKILL);
}

/// Kills the cluster's container processes but those of `keep`; returns how many were
/// signalled.
fn kill_containers(state: &ClusterState, keep: &Keep) -> usize {
    let mut victims: BTreeSet<u32> = BTreeSet::new();
    for pid_path in pid_files(&state.dir.join("nodes")) {
        if keep.has_path(&pid_path) {
            continue;
        }
        let Some(pid) = std::fs::read_to_string(&pid_path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let json = pid_path.with_extension("json");
        let init = std::fs::read_to_string(&json)
            .ok()
            .and_then(|t| serde_json::from_str::<super::init::InitSpec>(&t).ok());
        let argv = init
            .as_ref()
            .map(|i| i.spec.argv.clone())
            .unwrap_or_default();
        let netns = init.as_ref().map(|i| i.sandbox.netns.as_str());
        if process_is_container(pid, &json, &argv, netns) {
            info!(pid, pid_file = %pid_path.display(), "killing container (and its process group)");
            kill(pid, true);
            victims.insert(pid);
        }
    }
    let ns_ids: Vec<(u64, u64)> = cluster_netns(state)
        .into_iter()
        .filter(|(name, _)| !keep.netns.contains(name))
        .map(|(_, id)| id)
        .filter(|id| *id != (0, 0))
        .collect();
    for pid in processes_in(&ns_ids) {
        if victims.insert(pid) {
            info!(pid, "killing a process inside a cluster network namespace");
        }
        kill(pid, false);
    }
    // Give the kernel a moment to tear them down (mounts and namespaces get released).
    let deadline = Instant::now() + Duration::from_secs(5);
    while victims.iter().any(|p| is_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    victims.len()
}

/// Unmounts (lazily, deepest first) the mounts under `nodes/` but the volume loop mounts:
/// `(unmounted, problems)`.
fn unmount_pod_mounts(state: &ClusterState, keep: &Keep) -> (usize, usize) {
    let nodes_dir = std::fs::canonicalize(&state.dir)
        .unwrap_or_else(|_| state.dir.clone())
        .join("nodes");
    let (mut unmounted, mut problems) = (0usize, 0usize);
    match std::fs::read_to_string(mountinfo::SELF) {
        Ok(text) => {
            let all = mounts_to_remove(&mountinfo::mount_points(&text), &nodes_dir);
            for mp in all.into_iter().filter(|m| !keep.has_path(m)) {
                match nix::mount::umount2(&mp, MntFlags::MNT_DETACH) {
                    Ok(()) => {
                        info!(mountpoint = %mp.display(), "unmounted");
                        unmounted += 1;
                    }
                    Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(e) => {
                        warn!(mountpoint = %mp.display(), error = %e, "cannot unmount");
                        problems += 1;
                    }
                }
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot read /proc/self/mountinfo");
            problems += 1;
        }
    }
    (unmounted, problems)
}

/// Deletes the cluster's network namespaces: `(deleted, problems)`.
fn delete_namespaces(state: &ClusterState, keep: &Keep) -> (usize, usize) {
    let (mut namespaces, mut problems) = (0usize, 0usize);
    for (name, _) in cluster_netns(state)
        .into_iter()
        .filter(|(n, _)| !keep.netns.contains(n))
    {
        match delete_netns(&name) {
            Ok(true) => {
                info!(netns = %name, "deleted network namespace");
                namespaces += 1;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(netns = %name, error = %e, "cannot delete network namespace");
                problems += 1;
            }
        }
    }
    (namespaces, problems)
}

/// Deletes the cluster's veths and its bridge: `(deleted, problems)`.
fn delete_links(state: &ClusterState, keep: &Keep) -> (usize, usize) {
    let (mut links, mut problems) = (0usize, 0usize);
    let veth_prefix = state.veth_prefix();
    let bridge = state.bridge_name();
    let names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for name in names
        .iter()
        .filter(|n| n.starts_with(&veth_prefix) && !keep.veths.contains(*n))
        .chain(names.iter().filter(|n| **n == bridge && keep.is_empty()))
    {
        match delete_link(name) {
            Ok(true) => {
                info!(link = %name, "deleted link");
                links += 1;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(link = %name, error = %e, "cannot delete link");
                problems += 1;
            }
        }
    }
    (links, problems)
}

pub(super) fn cleanup_host(state: &ClusterState, keep: &Keep) -> Result<(), RuntimeError> {
    let killed = kill_containers(state, keep);
    let (unmounted, mount_problems) = unmount_pod_mounts(state, keep);
    // Namespaces, veths, bridge: under the cluster lock when the state dir still exists.
    let _lock = if state.dir.exists() {
        lock_cluster(state).ok()
    } else {
        None
    };
    let (namespaces, netns_problems) = delete_namespaces(state, keep);
    let (links, link_problems) = delete_links(state, keep);
    let problems = mount_problems + netns_problems + link_problems;
    info!(
        cluster = %state.id,
        killed, unmounted, namespaces, links, problems, kept_pods = keep.dirs.len(),
        "host cleanup done"
    );
    if problems > 0 {
        return Err(RuntimeError::Cleanup(problems));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_mounts_are_left_to_the_provisioner() {
        let nodes = Path::new("/s/nodes");
        let all: Vec<PathBuf> = [
            "/",
            "/s/nodes",
            "/s/nodes/node-a/volumes/pv-1",
            "/s/nodes/node-a/volumes/pv-1/sub",
            "/s/nodes/node-a/pods/u1/tmp",
            "/s/nodes/node-a/pods/u1/tmp/inner",
            "/s/nodes/node-a/pods/u1/tmp",
            "/s/nodes/node-b/pods/u2/secret",
            "/s/nodes-other/x",
            "/s/other",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(
            mounts_to_remove(&all, nodes),
            vec![
                PathBuf::from("/s/nodes/node-a/pods/u1/tmp/inner"),
                PathBuf::from("/s/nodes/node-b/pods/u2/secret"),
                PathBuf::from("/s/nodes/node-a/pods/u1/tmp"),
            ]
        );
    }

    #[test]
    fn recognises_container_command_lines() {
        let json = Path::new("/s/nodes/node-a/pods/u/etcd.json");
        let argv = vec!["/usr/bin/etcd".to_string(), "--name".into(), "e".into()];
        let init: Vec<Vec<u8>> = vec![
            b"/usr/bin/localcluster".to_vec(),
            b"container-init".to_vec(),
            json.as_os_str().as_bytes().to_vec(),
        ];
        assert!(cmdline_is_container(&init, json, &argv));
        let prog: Vec<Vec<u8>> = argv.iter().map(|a| a.as_bytes().to_vec()).collect();
        assert!(cmdline_is_container(&prog, json, &argv));
        let other: Vec<Vec<u8>> = vec![b"/usr/bin/etcd".to_vec()];
        assert!(!cmdline_is_container(&other, json, &argv));
        let other_json: Vec<Vec<u8>> = vec![
            b"x".to_vec(),
            b"container-init".to_vec(),
            b"/s/other.json".to_vec(),
        ];
        assert!(!cmdline_is_container(&other_json, json, &argv));
        assert!(!cmdline_is_container(&[], json, &[]));
    }

    #[test]
    fn this_process_is_alive_and_no_pid_files_in_missing_dirs() {
        assert!(is_alive(std::process::id()));
        assert!(pid_files(Path::new("/nonexistent/nodes")).is_empty());
    }
}
