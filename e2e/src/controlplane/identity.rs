//! The cluster's identity: its id, free loopback ports and the reserved pod/service
//! network number (an exclusive-create file under [`NETS_DIR`](super::NETS_DIR)).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

use crate::controlplane::{ControlPlaneError, NETS_DIR, Result, io_err};
use crate::state::ClusterState;

/// A random 6-hex-char cluster id.
pub fn random_id() -> Result<String> {
    let mut buf = [0u8; 3];
    let path = Path::new("/dev/urandom");
    let mut f = File::open(path).map_err(io_err("open", path))?;
    io::Read::read_exact(&mut f, &mut buf).map_err(io_err("read", path))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// `n` distinct free TCP ports on 127.0.0.1: bound all at once on port 0 (so the kernel gives
/// distinct ones), released, then each checked bindable again.
pub fn choose_ports(n: usize) -> io::Result<Vec<u16>> {
    let mut last_err = None;
    for _ in 0..5 {
        let listeners = (0..n)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<io::Result<Vec<_>>>()?;
        let ports = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<io::Result<Vec<_>>>()?;
        drop(listeners);
        match ports
            .iter()
            .try_for_each(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).map(drop))
        {
            Ok(()) => return Ok(ports),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("no ports")))
}

/// Third octets N of every IPv4 address in 198.18.N.0/24 found in `ip -o -4 addr show` output.
pub fn host_nets_in_use(ip_addr_output: &str) -> BTreeSet<u8> {
    let mut used = BTreeSet::new();
    for line in ip_addr_output.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w != "inet" {
                continue;
            }
            let Some(addr) = words.next() else { break };
            let ip = addr.split('/').next().unwrap_or(addr);
            if let Ok(ip) = ip.parse::<Ipv4Addr>() {
                let o = ip.octets();
                if o[0] == 198 && o[1] == 18 {
                    used.insert(o[2]);
                }
            }
        }
    }
    used
}

/// The first N in 1..=250 not in `host_used` for which `try_reserve(N)` succeeds.
pub fn pick_net<E>(
    host_used: &BTreeSet<u8>,
    mut try_reserve: impl FnMut(u8) -> Result<bool, E>,
) -> Result<Option<u8>, E> {
    for n in 1..=250u8 {
        if host_used.contains(&n) {
            continue;
        }
        if try_reserve(n)? {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// Content of a reservation file.
pub fn reservation_content(dir: &Path, id: &str) -> String {
    format!("{}\n{}\n", dir.display(), id)
}

/// `(state dir, cluster id)` recorded in a reservation file.
pub fn parse_reservation(content: &str) -> Option<(PathBuf, String)> {
    let mut lines = content.lines();
    let dir = lines.next().filter(|d| d.starts_with('/'))?;
    let id = lines.next().filter(|i| !i.is_empty())?;
    Some((PathBuf::from(dir), id.to_string()))
}

/// A reservation is stale when the cluster it names is gone: its dir has no readable
/// cluster.json, or one with another id.
pub(super) fn reservation_is_stale(content: &str) -> bool {
    match parse_reservation(content) {
        None => true,
        Some((dir, id)) => match ClusterState::load(&dir) {
            Ok(s) => s.id != id,
            Err(_) => true,
        },
    }
}

/// The reserved network number, and the lock serialising reservations: hold it until the
/// cluster.json naming this reservation is saved, so that no one sees the reservation as stale.
pub struct NetReservation {
    pub net: u8,
    _lock: Flock<File>,
}

/// Reserves a network number for the cluster `id` in `dir`.
pub fn reserve_net(dir: &Path, id: &str) -> Result<NetReservation> {
    let nets = Path::new(NETS_DIR);
    std::fs::create_dir_all(nets).map_err(io_err("create", nets))?;
    let lock_path = nets.join(".lock");
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    let lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| io_err("lock", &lock_path)(e.into()))?;
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(ControlPlaneError::IpAddr)?;
    if !out.status.success() {
        return Err(ControlPlaneError::IpAddr(io::Error::other(format!(
            "{}",
            out.status
        ))));
    }
    let host_used = host_nets_in_use(&String::from_utf8_lossy(&out.stdout));
    let content = reservation_content(dir, id);
    let net = pick_net(&host_used, |n| {
        try_reserve_one(&nets.join(n.to_string()), &content)
    })?
    .ok_or(ControlPlaneError::NoFreeNet)?;
    Ok(NetReservation { net, _lock: lock })
}

pub(super) fn try_reserve_one(path: &Path, content: &str) -> Result<bool> {
    for _ in 0..2 {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
        {
            Ok(mut f) => {
                f.write_all(content.as_bytes())
                    .map_err(io_err("write", path))?;
                return Ok(true);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let held = match std::fs::read_to_string(path) {
                    Ok(c) => c,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err("read", path)(e)),
                };
                if !reservation_is_stale(&held) {
                    return Ok(false);
                }
                info!(path = %path.display(), "removing stale network reservation");
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("remove", path)(e)),
                }
            }
            Err(e) => return Err(io_err("create", path)(e)),
        }
    }
    Ok(false)
}

/// Releases `state`'s network reservation if it is still its own.
pub fn release_net(state: &ClusterState) {
    let path = Path::new(NETS_DIR).join(state.pod_net.to_string());
    let Ok(content) = std::fs::read_to_string(&path) else {
        return;
    };
    if parse_reservation(&content) == Some((state.dir.clone(), state.id.clone()))
        && let Err(e) = std::fs::remove_file(&path)
    {
        warn!(path = %path.display(), "cannot release network reservation: {e}");
    }
}

/// Chooses the cluster's identity, reserves its network and saves it to `DIR/cluster.json`.
pub(super) fn choose_identity(dir: &Path, bin_dir: &Path) -> Result<ClusterState> {
    let id = random_id()?;
    let ports = choose_ports(8).map_err(ControlPlaneError::Ports)?;
    let reservation = reserve_net(dir, &id)?;
    let state = ClusterState {
        id,
        dir: dir.to_path_buf(),
        bin_dir: bin_dir.to_path_buf(),
        etcd_client_port: ports[0],
        etcd_peer_port: ports[1],
        apiserver_port: ports[2],
        controller_manager_port: ports[3],
        scheduler_port: ports[4],
        kubelet_ports: ports[5..8].to_vec(),
        pod_net: reservation.net,
        service_net: reservation.net,
    };
    let saved = state.save();
    if saved.is_err() {
        release_net(&state);
    }
    saved?;
    drop(reservation);
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;
    use std::net::{Ipv4Addr, TcpListener};

    use crate::controlplane::test_support::sample;

    #[test]
    fn chosen_ports_are_distinct_and_free() {
        let ports = choose_ports(8).unwrap();
        assert_eq!(ports.len(), 8);
        assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), 8);
        for p in ports {
            assert_ne!(p, 0);
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        }
    }

    #[test]
    fn random_ids_are_six_hex_chars() {
        let a = random_id().unwrap();
        assert_eq!(a.len(), 6);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase())
        );
    }

    #[test]
    fn host_nets_are_read_from_ip_addr() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\n\
                   7: smbrabc    inet 198.18.3.1/24 scope global smbrabc\n\
                   8: other    inet 198.18.200.7/16 scope global other\n\
                   9: x    inet 198.19.4.1/24 scope global x\n";
        assert_eq!(host_nets_in_use(out), BTreeSet::from([3, 200]));
    }

    #[test]
    fn net_choice_skips_host_and_reserved_numbers() {
        let host = BTreeSet::from([1, 3]);
        let mut tried = vec![];
        let n = pick_net(&host, |n| {
            tried.push(n);
            Ok::<_, ()>(n == 4)
        })
        .unwrap();
        assert_eq!(n, Some(4));
        assert_eq!(tried, [2, 4]);
        assert_eq!(pick_net(&host, |_| Ok::<_, ()>(false)).unwrap(), None);
        assert_eq!(pick_net(&host, |_| Err::<bool, _>("e")), Err("e"));
    }

    #[test]
    fn reservations_round_trip_and_go_stale() {
        let dir = std::env::temp_dir().join(format!("sm-cp-res-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = reservation_content(&dir, "abcdef");
        assert_eq!(parse_reservation(&c), Some((dir.clone(), "abcdef".into())));
        assert_eq!(parse_reservation(""), None);
        assert_eq!(parse_reservation("relative\nid\n"), None);
        // No cluster.json: stale.
        assert!(reservation_is_stale(&c));
        let mut s = sample(&dir);
        s.id = "abcdef".into();
        s.save().unwrap();
        assert!(!reservation_is_stale(&c));
        // Another cluster now lives in that dir: stale.
        s.id = "123456".into();
        s.save().unwrap();
        assert!(reservation_is_stale(&c));
        assert!(reservation_is_stale("garbage"));

        // try_reserve_one: free, held by a live cluster, stale.
        let res = dir.join("res");
        assert!(try_reserve_one(&res, &reservation_content(&dir, "123456")).unwrap());
        assert!(!try_reserve_one(&res, &reservation_content(&dir, "ffffff")).unwrap());
        s.id = "ffffff".into();
        s.save().unwrap();
        assert!(try_reserve_one(&res, &reservation_content(&dir, "ffffff")).unwrap());
        assert_eq!(
            std::fs::read_to_string(&res).unwrap(),
            reservation_content(&dir, "ffffff")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
