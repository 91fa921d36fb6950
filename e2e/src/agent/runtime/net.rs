//! Pod networking: the cluster bridge, one network namespace and veth pair per pod.
//!
//! Namespaces are created without `ip netns add` (which turns `/run/netns` into a shared mount
//! point that stays on the host forever): a short-lived thread unshares a new network namespace
//! and bind-mounts it on `/run/netns/<name>`. Links and addresses are configured with `ip`
//! (iproute2), always with argument vectors.
//!
//! Traffic stays on the machine: pods get no default route, only the on-link route of the pod
//! /24 (which holds the bridge address, i.e. the host, and every other pod) and a route for the
//! service /24 via the bridge (the host holds the `kubernetes` Service's ClusterIP, where the
//! agent proxies to the API server: `agent::apiproxy`), so a packet for any other address fails
//! at once in the pod with "network unreachable" (DNS lookups of names not in the pod's hosts
//! file fail fast instead of stalling). The bridge has no uplink, no NAT is set up
//! and `ip_forward` is not touched. Pod <-> pod traffic is bridged. With `br_netfilter` loaded (`bridge-nf-call-iptables=1`) bridged frames
//! traverse iptables' FORWARD chain: an empty ruleset (as on the machines this runs on) passes
//! them; a host firewall with a FORWARD DROP policy would need an allowance for the pod range.

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{Flock, FlockArg};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use tracing::{debug, info, warn};

use super::{RuntimeError, Sandbox, random_u64, validate_name};
use crate::state::ClusterState;

/// Where network namespaces are bind-mounted (the iproute2 convention, so `ip -n` finds them).
pub(super) const NETNS_DIR: &str = "/run/netns";
/// Linux interface names are at most 15 bytes.
const IFNAMSIZ_MAX: usize = 15;

pub(super) fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

pub(super) fn link_exists(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && Path::new("/sys/class/net").join(name).exists()
}

/// The `ip` program (the agent may run with a PATH lacking /usr/sbin).
fn ip_program() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// Runs `ip ARGS...`; a non-zero exit is an error carrying its stderr.
pub(super) fn ip(args: &[&str]) -> Result<String, RuntimeError> {
    let program = ip_program();
    let command = format!("{program} {}", args.join(" "));
    debug!(%command, "running");
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| RuntimeError::Spawn {
            program: PathBuf::from(program),
            source,
        })?;
    if !out.status.success() {
        return Err(RuntimeError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Holds the cluster-wide runtime lock (flock on `<state.dir>/runtime.lock`) while alive. flock
/// locks belong to the open file description, so this serializes threads as well as processes.
pub(super) fn lock_cluster(state: &ClusterState) -> Result<Flock<File>, RuntimeError> {
    std::fs::create_dir_all(&state.dir).map_err(|source| RuntimeError::Io {
        what: "cannot create",
        path: state.dir.clone(),
        source,
    })?;
    let path = state.dir.join("runtime.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| RuntimeError::Io {
            what: "cannot open",
            path: path.clone(),
            source,
        })?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, source)| RuntimeError::Sys {
        what: format!("flock {}", path.display()),
        source,
    })
}

/// Checks that `ip` is a host address of the cluster's pod network /24 (not the network, the
/// bridge or the broadcast address): nothing is ever configured outside it.
pub(super) fn check_pod_ip(state: &ClusterState, ip: Ipv4Addr) -> Result<(), RuntimeError> {
    let [a, b, c, d] = ip.octets();
    if (a, b, c) != (198, 18, state.pod_net) {
        return Err(RuntimeError::Invalid {
            what: "pod IP",
            value: ip.to_string(),
            reason: "not in the cluster's pod network",
        });
    }
    if !(2..=254).contains(&d) {
        return Err(RuntimeError::Invalid {
            what: "pod IP",
            value: ip.to_string(),
            reason: "the network, bridge and broadcast addresses are reserved",
        });
    }
    Ok(())
}

/// Creates the cluster bridge if missing, gives it `bridge_ip/24` if it lacks it, sets it up.
/// Call with the cluster lock held.
fn ensure_bridge(state: &ClusterState) -> Result<(), RuntimeError> {
    let bridge = state.bridge_name();
    if !link_exists(&bridge) {
        let mac = state.bridge_mac();
        ip(&[
            "link", "add", "name", &bridge, "address", &mac, "type", "bridge",
        ])?;
        info!(%bridge, %mac, "created cluster bridge");
    }
    let cidr = format!("{}/24", state.bridge_ip());
    let addrs = ip(&["-4", "-o", "addr", "show", "dev", &bridge])?;
    if !has_inet_addr(&addrs, &cidr) {
        ip(&["addr", "add", &cidr, "dev", &bridge])?;
        info!(%bridge, %cidr, "assigned bridge address");
    }
    ip(&["link", "set", "dev", &bridge, "up"])?;
    Ok(())
}

/// Creates the bridge (as [`create_sandbox`] would) and gives it the `kubernetes` Service's
/// ClusterIP as a /32, so that the agent can listen there (see `agent::apiproxy`). Idempotent.
pub(super) fn prepare_service_address(state: &ClusterState) -> Result<(), RuntimeError> {
    let _lock = lock_cluster(state)?;
    ensure_bridge(state)?;
    let bridge = state.bridge_name();
    let cidr = format!("{}/32", state.kubernetes_service_ip());
    let addrs = ip(&["-4", "-o", "addr", "show", "dev", &bridge])?;
    if !has_inet_addr(&addrs, &cidr) {
        ip(&["addr", "add", &cidr, "dev", &bridge])?;
        info!(%bridge, %cidr, "assigned the kubernetes Service address");
    }
    Ok(())
}

/// Whether `ip -o addr show` output lists `cidr` as an inet address.
fn has_inet_addr(ip_output: &str, cidr: &str) -> bool {
    ip_output.lines().any(|line| {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == "inet" {
                return words.next() == Some(cidr);
            }
        }
        false
    })
}

/// Creates network namespace `name` at `/run/netns/<name>` (fails if the file exists).
pub(super) fn add_netns(name: &str) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(NETNS_DIR).map_err(|source| RuntimeError::Io {
        what: "cannot create",
        path: PathBuf::from(NETNS_DIR),
        source,
    })?;
    let path = netns_path(name);
    File::create_new(&path).map_err(|source| RuntimeError::Io {
        what: "cannot create",
        path: path.clone(),
        source,
    })?;
    // The namespace switch is per thread: do it in a thread of its own that then exits.
    let target = path.clone();
    let made = std::thread::Builder::new()
        .name("sm-netns".into())
        .spawn(move || -> Result<(), RuntimeError> {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(|source| RuntimeError::Sys {
                what: "unshare(CLONE_NEWNET)".into(),
                source,
            })?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|source| RuntimeError::Sys {
                what: format!("bind-mount new netns on {}", target.display()),
                source,
            })
        })
        .map_err(|source| RuntimeError::Io {
            what: "cannot start a thread for",
            path: path.clone(),
            source,
        })?
        .join()
        .unwrap_or(Err(RuntimeError::ThreadPanicked("netns creation")));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(())
}

/// Deletes network namespace `name` (unmount + remove the file). Idempotent. Returns whether
/// there was something to delete.
pub(super) fn delete_netns(name: &str) -> Result<bool, RuntimeError> {
    let path = netns_path(name);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(false);
    }
    match nix::mount::umount2(&path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(source) => {
            return Err(RuntimeError::Sys {
                what: format!("umount {}", path.display()),
                source,
            });
        }
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(source) => Err(RuntimeError::Io {
            what: "cannot remove",
            path,
            source,
        }),
    }
}

/// Deletes link `name` if it exists (for a veth, both ends go). Returns whether it existed.
pub(super) fn delete_link(name: &str) -> Result<bool, RuntimeError> {
    if !link_exists(name) {
        return Ok(false);
    }
    match ip(&["link", "delete", "dev", name]) {
        Ok(_) => Ok(true),
        // Gone meanwhile (its namespace died, taking the pair with it).
        Err(_) if !link_exists(name) => Ok(true),
        Err(e) => Err(e),
    }
}

/// A host veth name `<veth_prefix><4 hex>` not in use. Call with the cluster lock held.
fn free_veth_name(state: &ClusterState, key: &str) -> Result<String, RuntimeError> {
    let prefix = state.veth_prefix();
    for attempt in 0..64 {
        let name = format!(
            "{prefix}{:04x}",
            random_u64(&format!("{key}{attempt}")) & 0xffff
        );
        if name.len() > IFNAMSIZ_MAX {
            return Err(RuntimeError::Invalid {
                what: "veth prefix",
                value: prefix,
                reason: "longer than 11 bytes",
            });
        }
        if !link_exists(&name) {
            return Ok(name);
        }
    }
    Err(RuntimeError::NoFreeVethName(prefix))
}

pub(super) fn create_sandbox(
    state: &ClusterState,
    key: &str,
    ip_addr: Ipv4Addr,
    dir: &Path,
) -> Result<Sandbox, RuntimeError> {
    validate_name("sandbox key", key, 200)?;
    check_pod_ip(state, ip_addr)?;
    let netns = format!("{}{key}", state.netns_prefix());
    let _lock = lock_cluster(state)?;
    ensure_bridge(state)?;
    if delete_netns(&netns)? {
        warn!(%netns, "replaced a stale network namespace of the same name");
    }
    let host_veth = free_veth_name(state, key)?;
    add_netns(&netns)?;
    let sandbox = Sandbox {
        netns,
        ip: ip_addr,
        host_veth,
        dir: dir.to_path_buf(),
    };
    if let Err(e) = configure(state, &sandbox) {
        if let Err(undo) = destroy_sandbox(&sandbox) {
            warn!(error = %undo, netns = %sandbox.netns, "cannot undo a half-made sandbox");
        }
        return Err(e);
    }
    info!(netns = %sandbox.netns, ip = %sandbox.ip, veth = %sandbox.host_veth, "created sandbox");
    Ok(sandbox)
}

fn configure(state: &ClusterState, sb: &Sandbox) -> Result<(), RuntimeError> {
    let bridge = state.bridge_name();
    let cidr = format!("{}/24", sb.ip);
    let ns = sb.netns.as_str();
    let veth = sb.host_veth.as_str();
    ip(&[
        "link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    ip(&["link", "set", "dev", veth, "master", &bridge])?;
    ip(&["link", "set", "dev", veth, "up"])?;
    ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
    ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
    ip(&["-n", ns, "link", "set", "dev", "eth0", "up"])?;
    // The service range is reached through the host (the `kubernetes` Service, agent::apiproxy).
    let via = state.bridge_ip().to_string();
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        &state.service_cidr(),
        "via",
        &via,
        "dev",
        "eth0",
    ])?;
    std::fs::create_dir_all(&sb.dir).map_err(|source| RuntimeError::Io {
        what: "cannot create",
        path: sb.dir.clone(),
        source,
    })
}

pub(super) fn destroy_sandbox(sb: &Sandbox) -> Result<(), RuntimeError> {
    validate_name("netns", &sb.netns, 255)?;
    let had_ns = delete_netns(&sb.netns)?;
    // Deleting the host end deletes the pair even while processes keep the namespace alive.
    let had_veth = if sb.host_veth.is_empty() {
        false
    } else {
        validate_name("veth", &sb.host_veth, IFNAMSIZ_MAX)?;
        delete_link(&sb.host_veth)?
    };
    if had_ns || had_veth {
        info!(netns = %sb.netns, veth = %sb.host_veth, "destroyed sandbox");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ClusterState {
        ClusterState {
            id: "abc123".into(),
            dir: PathBuf::from("/nonexistent"),
            bin_dir: PathBuf::from("/nonexistent"),
            etcd_client_port: 0,
            etcd_peer_port: 0,
            apiserver_port: 0,
            controller_manager_port: 0,
            scheduler_port: 0,
            kubelet_ports: vec![],
            pod_net: 7,
            service_net: 8,
        }
    }

    #[test]
    fn pod_ips_must_be_hosts_of_the_pod_network() {
        let s = state();
        assert!(check_pod_ip(&s, Ipv4Addr::new(198, 18, 7, 2)).is_ok());
        assert!(check_pod_ip(&s, Ipv4Addr::new(198, 18, 7, 254)).is_ok());
        for bad in [
            Ipv4Addr::new(198, 18, 7, 0),
            Ipv4Addr::new(198, 18, 7, 1),
            Ipv4Addr::new(198, 18, 7, 255),
            Ipv4Addr::new(198, 18, 8, 2),
            Ipv4Addr::new(10, 0, 0, 2),
        ] {
            assert!(check_pod_ip(&s, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn finds_inet_addresses_in_ip_output() {
        let out = "7: smbrabc123    inet 198.18.7.1/24 scope global smbrabc123\\       valid_lft forever preferred_lft forever\n";
        assert!(has_inet_addr(out, "198.18.7.1/24"));
        assert!(!has_inet_addr(out, "198.18.7.1/16"));
        assert!(!has_inet_addr("", "198.18.7.1/24"));
    }

    #[test]
    fn veth_names_fit_and_carry_the_prefix() {
        let s = state();
        let name = free_veth_name(&s, "pod").unwrap();
        assert!(name.starts_with(&s.veth_prefix()));
        assert_eq!(name.len(), s.veth_prefix().len() + 4);
        assert!(name.len() <= IFNAMSIZ_MAX);
    }
}
