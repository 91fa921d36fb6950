//! What a cluster leaves on the host (processes, mounts, loop devices, listening ports):
//! checked before `up` and after `down`.

use std::path::{Path, PathBuf};

use tracing::info;

use crate::controlplane::process::{is_ours, running_processes};
use crate::controlplane::{APISERVER, CONTROLLER_MANAGER, SCHEDULER};
use crate::mountinfo;
use crate::state::{ClusterState, NODE_NAMES};

/// Loop devices whose backing file is under `dir`: `(device, backing file)`.
pub fn loops_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim_end_matches('\n');
        let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
        let backing = PathBuf::from(backing);
        if backing.starts_with(dir) {
            out.push((format!("/dev/{name}"), backing));
        }
    }
    out.sort();
    out
}

/// `(port, socket inode)` of every socket in LISTEN state in a `/proc/net/tcp` or
/// `/proc/net/tcp6` text.
pub fn listening_sockets(proc_net_tcp: &str) -> Vec<(u16, u64)> {
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(3) != Some(&"0A") {
                return None;
            }
            let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            let inode = f.get(9)?.parse().ok()?;
            Some((port, inode))
        })
        .collect()
}

pub(super) fn all_listening_sockets() -> Vec<(u16, u64)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| listening_sockets(&t))
        .collect()
}

/// The pid of a process holding the socket with `inode` open, if any is visible.
pub(super) fn socket_owner(inode: u64) -> Option<i32> {
    let target = format!("socket:[{inode}]");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                return Some(pid);
            }
        }
    }
    None
}

fn state_ports(state: &ClusterState) -> Vec<(String, u16)> {
    let mut ports = vec![
        ("etcd client".to_string(), state.etcd_client_port),
        ("etcd peer".to_string(), state.etcd_peer_port),
        (APISERVER.to_string(), state.apiserver_port),
        (
            CONTROLLER_MANAGER.to_string(),
            state.controller_manager_port,
        ),
        (SCHEDULER.to_string(), state.scheduler_port),
    ];
    for (node, port) in NODE_NAMES.iter().zip(&state.kubelet_ports) {
        ports.push((format!("kubelet of {node}"), *port));
    }
    ports
}

/// Everything of `dir`'s cluster still present on the host, one line each.
pub fn leftovers(dir: &Path, state: Option<&ClusterState>) -> Vec<String> {
    let mut left = vec![];
    for (name, pid) in running_processes(dir) {
        left.push(format!("process {name} (pid {pid}) still running"));
    }
    match std::fs::read_to_string(mountinfo::SELF) {
        Ok(mi) => {
            for m in mountinfo::mount_points_under(&mi, dir) {
                left.push(format!("mount {}", m.display()));
            }
        }
        Err(e) => left.push(format!("cannot read /proc/self/mountinfo: {e}")),
    }
    for (dev, backing) in loops_under(dir) {
        left.push(format!("loop device {dev} backed by {}", backing.display()));
    }
    if let Some(state) = state {
        let listening = all_listening_sockets();
        for (what, port) in state_ports(state) {
            for (_, inode) in listening.iter().filter(|(p, _)| *p == port) {
                // A port of a long-stopped cluster may since have been taken by someone else:
                // only a listener of one of this dir's processes (or of an unknown one) is left.
                match socket_owner(*inode) {
                    Some(pid) if !is_ours(pid, dir) => {
                        info!(
                            port,
                            pid, "port {port} ({what}) is now used by another process"
                        )
                    }
                    Some(pid) => left.push(format!("listener on port {port} ({what}), pid {pid}")),
                    None => left.push(format!("listener on port {port} ({what})")),
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/run/netns") {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&state.netns_prefix()) {
                    left.push(format!("network namespace {n}"));
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n == state.bridge_name() || n.starts_with(&state.veth_prefix()) {
                    left.push(format!("network interface {n}"));
                }
            }
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::{Ipv4Addr, TcpListener};
    use std::path::{Path, PathBuf};

    use crate::mountinfo;

    #[test]
    fn mountinfo_is_filtered_by_dir() {
        let mi = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                  90 22 7:0 / /tmp/sm\\040a/nodes/node-a/volumes/pv1 rw - ext4 /dev/loop0 rw\n\
                  91 22 0:5 / /tmp/sm\\040ab/x rw - tmpfs tmpfs rw\n\
                  92 22 0:5 / /tmp/sm\\040a rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mountinfo::mount_points_under(mi, Path::new("/tmp/sm a")),
            [
                PathBuf::from("/tmp/sm a/nodes/node-a/volumes/pv1"),
                PathBuf::from("/tmp/sm a")
            ]
        );
    }

    #[test]
    fn listeners_are_parsed_from_proc_net_tcp() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n\
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 100 0 0 10 0\n";
        assert_eq!(listening_sockets(t), [(8080, 4242)]);
    }

    #[test]
    fn a_listener_is_traced_to_its_process() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let (_, inode) = all_listening_sockets()
            .into_iter()
            .find(|(p, _)| *p == port)
            .unwrap();
        assert_eq!(socket_owner(inode), Some(std::process::id() as i32));
    }
}
