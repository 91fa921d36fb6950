//! Per-pod `/etc/hosts`: the kubelet's managed hosts file plus the pod hostnames of headless
//! services (`hostname.subdomain.NS.svc.cluster.local` and its short forms), which stand in for
//! cluster DNS. The file is rewritten in place (same inode) because it is bind-mounted.

use std::io::Write;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

/// Cluster domain of every local cluster.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// One pod that has a DNS name through a headless service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostEntry {
    pub namespace: String,
    pub hostname: String,
    pub subdomain: String,
    pub ip: String,
}

/// The hostname of a pod: `spec.hostname`, else the pod name (at most 63 chars, as the kubelet).
pub fn pod_hostname(pod: &Pod) -> String {
    let h = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let mut h: String = h.chars().take(63).collect();
    while h.ends_with(['-', '.']) {
        h.pop();
    }
    h
}

/// The host entry of a pod (hostname and subdomain set, IP known).
pub fn entry_of(pod: &Pod, ip: Option<&str>) -> Option<HostEntry> {
    let spec = pod.spec.as_ref()?;
    let hostname = spec.hostname.clone().filter(|h| !h.is_empty())?;
    let subdomain = spec.subdomain.clone().filter(|s| !s.is_empty())?;
    let ip = ip.filter(|i| !i.is_empty())?.to_string();
    Some(HostEntry {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        hostname,
        subdomain,
        ip,
    })
}

fn names(e: &HostEntry) -> [String; 4] {
    let base = format!("{}.{}", e.hostname, e.subdomain);
    [
        format!("{base}.{}.svc.{CLUSTER_DOMAIN}", e.namespace),
        format!("{base}.{}.svc", e.namespace),
        format!("{base}.{}", e.namespace),
        base,
    ]
}

/// Renders the hosts file of a pod with `ip`, `hostname` (and `own` when it has a subdomain)
/// and every headless-service pod in `entries`.
pub fn render(ip: &str, hostname: &str, own: Option<&HostEntry>, entries: &[HostEntry]) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file (localcluster node agent).\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    match own {
        Some(e) => out.push_str(&format!("{ip}\t{} {hostname}\n", names(e).join(" "))),
        None => out.push_str(&format!("{ip}\t{hostname}\n")),
    }
    let mut sorted: Vec<&HostEntry> = entries.iter().filter(|e| Some(*e) != own).collect();
    sorted.sort();
    sorted.dedup();
    if !sorted.is_empty() {
        out.push_str("# Pods of headless services (stands in for cluster DNS).\n");
    }
    for e in sorted {
        out.push_str(&format!("{}\t{}\n", e.ip, names(e).join(" ")));
    }
    out
}

/// Writes `content` into `path` in place (truncate and write, same inode), so a bind mount of
/// the file sees the new content. Returns whether the content changed.
pub fn write_in_place(path: &Path, content: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == content) {
        return Ok(false);
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.write_all(content.as_bytes())?;
    f.sync_data()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn pod(name: &str, hostname: Option<&str>, sub: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "db"},
            "spec": {"containers": [], "hostname": hostname, "subdomain": sub}
        }))
        .unwrap()
    }

    #[test]
    fn hostnames() {
        assert_eq!(pod_hostname(&pod("etcd-0", None, None)), "etcd-0");
        assert_eq!(pod_hostname(&pod("etcd-0", Some("h"), None)), "h");
        let long = "a".repeat(70);
        assert_eq!(pod_hostname(&pod(&long, None, None)).len(), 63);
        assert!(entry_of(&pod("x", Some("x"), None), Some("1.2.3.4")).is_none());
        assert!(entry_of(&pod("x", Some("x"), Some("s")), None).is_none());
    }

    #[test]
    fn renders_headless_service_names() {
        let p0 = pod("etcd-0", Some("etcd-0"), Some("etcd"));
        let p1 = pod("etcd-1", Some("etcd-1"), Some("etcd"));
        let e0 = entry_of(&p0, Some("198.18.5.2")).unwrap();
        let e1 = entry_of(&p1, Some("198.18.5.3")).unwrap();
        let text = render("198.18.5.2", "etcd-0", Some(&e0), &[e1.clone(), e0.clone()]);
        assert!(text.contains("127.0.0.1\tlocalhost\n"));
        assert!(text.contains(
            "198.18.5.2\tetcd-0.etcd.db.svc.cluster.local etcd-0.etcd.db.svc etcd-0.etcd.db etcd-0.etcd etcd-0\n"
        ));
        assert!(text.contains(
            "198.18.5.3\tetcd-1.etcd.db.svc.cluster.local etcd-1.etcd.db.svc etcd-1.etcd.db etcd-1.etcd\n"
        ));
        assert_eq!(text.matches("198.18.5.2").count(), 1);
        let plain = render("198.18.5.9", "web", None, &[]);
        assert!(plain.ends_with("198.18.5.9\tweb\n"));
    }

    #[test]
    fn rewrites_keep_the_inode() {
        let dir = std::env::temp_dir().join(format!("sm-hosts-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("hosts");
        assert!(write_in_place(&f, "a long first content\n").unwrap());
        let ino = std::fs::metadata(&f).unwrap().ino();
        assert!(!write_in_place(&f, "a long first content\n").unwrap());
        assert!(write_in_place(&f, "short\n").unwrap());
        assert_eq!(std::fs::metadata(&f).unwrap().ino(), ino);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "short\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
