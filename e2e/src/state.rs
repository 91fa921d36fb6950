//! The state directory of one local cluster: its layout, and the identity (ports, names, address
//! ranges) chosen at `up` so that two clusters on one machine never collide.
//!
//! Layout of `DIR`:
//! - `cluster.json`      this [`ClusterState`]
//! - `kubeconfig`        admin kubeconfig (what `up` tells the user to export)
//! - `pki/`              CA, serving and client certificates, service-account keys
//! - `kubeconfigs/`      one kubeconfig per component (controller-manager, scheduler, agent)
//! - `etcd/`             the control plane's etcd data directory
//! - `logs/`             one log file per process (`etcd.log`, `kube-apiserver.log`, ..., `agent.log`)
//! - `pids/`             one pid file per background process started by `up`
//! - `apiserver-starts`  one line per start of the API server: spawned and ready (RFC 3339)
//! - `volumes/`          sparse ext4 images backing PersistentVolumes (`<pv>.img`)
//! - `nodes/<node>/`     per node: `volumes/<pv>` loop mount points, `pods/<uid>/` pod scratch
//!   (emptyDirs, configMap/secret files, hosts file, container logs, overlay upper dirs)

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Names of the three nodes every local cluster registers.
pub const NODE_NAMES: [&str; 3] = ["node-a", "node-b", "node-c"];
/// Zone label of each node (same index as [`NODE_NAMES`]).
pub const NODE_ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
/// Provisioner name of the local volume provisioner.
pub const PROVISIONER: &str = "local.e2e/ext4";
/// The CSI driver name of the provisioner's volumes that carry a VolumeAttributesClass
/// (Kubernetes allows the class only on CSI volumes; a CSI driver name is a DNS subdomain, which
/// [`PROVISIONER`] is not).
pub const CSI_DRIVER: &str = "ext4.local.e2e";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid cluster state: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Everything `up` chose for one cluster; written to `DIR/cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterState {
    /// Short unique id (6 lowercase hex chars); prefixes every host-level name (bridge, netns,
    /// veth) so two clusters never collide and `down` can find what is its own.
    pub id: String,
    /// Absolute state directory.
    pub dir: PathBuf,
    /// Directory holding kube-apiserver, kube-controller-manager, kube-scheduler.
    pub bin_dir: PathBuf,
    pub etcd_client_port: u16,
    pub etcd_peer_port: u16,
    pub apiserver_port: u16,
    pub controller_manager_port: u16,
    pub scheduler_port: u16,
    /// One kubelet (node agent) HTTPS port per node, same index as [`NODE_NAMES`].
    pub kubelet_ports: Vec<u16>,
    /// Third octet N of the pod network 198.18.N.0/24 (RFC 2544 benchmarking range: our own
    /// test hosts, never a private or public network). The bridge has 198.18.N.1.
    pub pod_net: u8,
    /// Third octet N of the service range 198.19.N.0/24 (no traffic is ever sent there).
    pub service_net: u8,
}

impl ClusterState {
    pub fn load(dir: &Path) -> Result<Self, StateError> {
        let path = dir.join("cluster.json");
        let text = std::fs::read_to_string(&path).map_err(|source| StateError::Read {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| StateError::Parse { path, source })
    }

    pub fn save(&self) -> Result<(), StateError> {
        let path = self.dir.join("cluster.json");
        let text = serde_json::to_string_pretty(self).map_err(|source| StateError::Parse {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, text).map_err(|source| StateError::Write { path, source })
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    /// The API server's audit log (JSON lines): ServiceAccounts' requests, see
    /// `controlplane::args::AUDIT_POLICY`. Always beside [`Self::kubeconfig`], so a test finds it
    /// from `KUBECONFIG`.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }
    pub fn component_kubeconfig(&self, component: &str) -> PathBuf {
        self.dir
            .join("kubeconfigs")
            .join(format!("{component}.kubeconfig"))
    }
    pub fn pki_dir(&self) -> PathBuf {
        self.dir.join("pki")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn pids_dir(&self) -> PathBuf {
        self.dir.join("pids")
    }
    pub fn volumes_dir(&self) -> PathBuf {
        self.dir.join("volumes")
    }
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }
    pub fn apiserver_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// Linux bridge joining every pod of this cluster (at most 15 chars).
    pub fn bridge_name(&self) -> String {
        format!("smbr{}", self.id)
    }
    /// Prefix of every network namespace this cluster creates.
    pub fn netns_prefix(&self) -> String {
        format!("sm{}-", self.id)
    }
    /// Prefix of every host-side veth this cluster creates (at most 15 chars with a suffix).
    pub fn veth_prefix(&self) -> String {
        format!("smv{}", self.id)
    }
    pub fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.pod_net, 1)
    }
    /// The bridge's MAC address, set when it is created: locally administered, unicast, from
    /// its address. Left to the kernel, a bridge takes the lowest MAC of its ports and changes
    /// it as pods come and go; pods that cached the old one in their ARP table then lose
    /// packets to the host (the `kubernetes` Service, the gateway) until that entry expires.
    pub fn bridge_mac(&self) -> String {
        let [a, b, c, d] = self.bridge_ip().octets();
        format!("02:00:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
    }
    pub fn pod_cidr(&self) -> String {
        format!("198.18.{}.0/24", self.pod_net)
    }
    pub fn service_cidr(&self) -> String {
        format!("198.19.{}.0/24", self.service_net)
    }
    /// The ClusterIP of the `kubernetes` Service (first address of the service range).
    pub fn kubernetes_service_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.service_net, 1)
    }
}

/// The directory of the markers of nodes taken down (`localcluster node down`): one empty
/// file per node that is down. The agent polls it (see `agent::down`).
pub fn nodes_down_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("nodes-down")
}

/// Marks node `node` down (power loss) or up again.
pub fn set_node_down(state_dir: &Path, node: &str, down: bool) -> std::io::Result<()> {
    let marker = nodes_down_dir(state_dir).join(node);
    if down {
        std::fs::create_dir_all(nodes_down_dir(state_dir))?;
        std::fs::write(marker, b"")
    } else {
        match std::fs::remove_file(marker) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// The nodes marked down, among [`NODE_NAMES`].
pub fn nodes_down(state_dir: &Path) -> std::collections::BTreeSet<String> {
    NODE_NAMES
        .iter()
        .filter(|n| nodes_down_dir(state_dir).join(n).exists())
        .map(|n| n.to_string())
        .collect()
}

/// The file recording each start of the API server ([`record_apiserver_start`]).
fn apiserver_starts_path(state_dir: &Path) -> PathBuf {
    state_dir.join("apiserver-starts")
}

/// Appends one start of the API server: when its process was spawned and when it first
/// answered `/readyz`. In between, its authorizer may not have read every RBAC binding yet and
/// refuses (403) requests the rules allow; the audit check ([`apiserver_starts`]) tells such
/// refusals from missing rules.
pub fn record_apiserver_start(
    state_dir: &Path,
    spawned: jiff::Timestamp,
    ready: jiff::Timestamp,
) -> Result<(), StateError> {
    use std::io::Write as _;
    let path = apiserver_starts_path(state_dir);
    let write = |source| StateError::Write {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(write)?;
    writeln!(file, "{spawned} {ready}").map_err(write)
}

/// Every start of the API server recorded in `state_dir`, as (spawned, ready); none when the
/// file is absent. A line that does not parse is an error naming it.
pub fn apiserver_starts(
    state_dir: &Path,
) -> Result<Vec<(jiff::Timestamp, jiff::Timestamp)>, StateError> {
    let path = apiserver_starts_path(state_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(StateError::Read { path, source }),
    };
    let bad = |line: &str| StateError::Read {
        path: path.clone(),
        source: std::io::Error::other(format!("not `<spawned> <ready>` in RFC 3339: {line:?}")),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (a, b) = line.split_once(' ').ok_or_else(|| bad(line))?;
            let a = a.parse().map_err(|_| bad(line))?;
            let b = b.parse().map_err(|_| bad(line))?;
            Ok((a, b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> ClusterState {
        ClusterState {
            id: "a1b2c3".into(),
            dir: dir.to_path_buf(),
            bin_dir: PathBuf::from("/cache/bin"),
            etcd_client_port: 1,
            etcd_peer_port: 2,
            apiserver_port: 3,
            controller_manager_port: 4,
            scheduler_port: 5,
            kubelet_ports: vec![6, 7, 8],
            pod_net: 9,
            service_net: 10,
        }
    }

    #[test]
    fn host_names_fit_linux_interface_limit() {
        let s = sample(Path::new("/x"));
        assert!(s.bridge_name().len() <= 15);
        assert!(format!("{}{}", s.veth_prefix(), "ffff").len() <= 15);
        assert_eq!(s.pod_cidr(), "198.18.9.0/24");
        assert_eq!(s.kubernetes_service_ip(), Ipv4Addr::new(198, 19, 10, 1));
    }

    #[test]
    fn the_bridge_mac_is_fixed_local_and_unicast() {
        let s = sample(Path::new("/x"));
        assert_eq!(s.bridge_mac(), "02:00:c6:12:09:01");
        let first = u8::from_str_radix(&s.bridge_mac()[..2], 16).unwrap();
        assert_eq!(first & 0b11, 0b10, "locally administered, unicast");
    }

    #[test]
    fn round_trips_through_disk() {
        let dir = std::env::temp_dir().join(format!("sm-state-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = sample(&dir);
        s.save().unwrap();
        assert_eq!(ClusterState::load(&dir).unwrap(), s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn apiserver_starts_are_appended_and_read_back_and_a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(apiserver_starts(dir.path()).unwrap(), Vec::new());
        let t = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        let first = (t("2026-12-06T20:34:24.3Z"), t("2026-12-06T20:34:26.1Z"));
        let second = (t("2026-12-06T20:34:45.0Z"), t("2026-12-06T20:34:46.5Z"));
        for (spawned, ready) in [first, second] {
            record_apiserver_start(dir.path(), spawned, ready).unwrap();
        }
        assert_eq!(apiserver_starts(dir.path()).unwrap(), vec![first, second]);
        std::fs::write(apiserver_starts_path(dir.path()), "yesterday\n").unwrap();
        let e = apiserver_starts(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("apiserver-starts") && e.contains("yesterday"),
            "{e}"
        );
    }

    #[test]
    fn node_down_markers() {
        let dir = std::env::temp_dir().join(format!("nodes-down-{}", std::process::id()));
        assert!(nodes_down(&dir).is_empty());
        set_node_down(&dir, "node-b", true).unwrap();
        assert_eq!(nodes_down(&dir).into_iter().collect::<Vec<_>>(), ["node-b"]);
        set_node_down(&dir, "node-b", false).unwrap();
        set_node_down(&dir, "node-b", false).unwrap();
        assert!(nodes_down(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
