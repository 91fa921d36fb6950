//! The processes of a pod's containers on the local cluster, where pods are host processes
//! (docs/local-cluster.md), for faults a test injects: a database member's process killed as if
//! it crashed, or cut off from a peer. Only processes whose command line (or, for ZooKeeper's JVM, whose
//! environment) names the test's own pod and namespace are found, so a test never signals
//! anything it did not start.

use std::path::Path;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The command line of process `pid`, split at NULs (empty when it is gone or unreadable).
fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The processes running `program` (the basename of argv[0]'s first word: Redis rewrites its
/// process title to `redis-server *:6379`): pid and arguments, by pid.
fn processes(program: &str) -> Vec<(i32, Vec<String>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(i32, Vec<String>)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .map(|pid| (pid, cmdline(pid)))
        .filter(|(_, args)| {
            args.first()
                .and_then(|a| a.split_whitespace().next())
                .and_then(|a| Path::new(a).file_name())
                .and_then(|n| n.to_str())
                == Some(program)
        })
        .collect();
    found.sort_unstable();
    found
}

/// The etcd member a process of namespace `ns` serves: `<pod>` of its `--name=<pod>`, when it
/// also advertises `<pod>.etcd.<ns>.svc...` (as the fixture's members do).
fn etcd_member_of(ns: &str, args: &[String]) -> Option<String> {
    let pod = args.iter().find_map(|a| a.strip_prefix("--name="))?;
    let advertised = format!("{pod}.etcd.{ns}.svc");
    args.iter()
        .any(|a| a.contains(&advertised))
        .then(|| pod.to_string())
}

/// The pids of the etcd processes of member pod `pod` of namespace `ns`.
pub fn etcd_member(ns: &str, pod: &str) -> Vec<i32> {
    processes("etcd")
        .into_iter()
        .filter(|(_, args)| etcd_member_of(ns, args).as_deref() == Some(pod))
        .map(|(pid, _)| pid)
        .collect()
}

/// The member pods of namespace `ns` that have an etcd process running now.
pub fn etcd_members_running(ns: &str) -> std::collections::BTreeSet<String> {
    processes("etcd")
        .iter()
        .filter_map(|(_, args)| etcd_member_of(ns, args))
        .collect()
}

/// The environment of process `pid` as `NAME=value` strings (empty when unreadable).
fn environ(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The pids of the processes running `program` whose arguments include one ending in `arg`
/// (any, when empty) in member pod `pod` of namespace `ns`: the fixtures set `POD_NAME` and
/// `NAMESPACE` in the container's environment.
pub fn pod_processes(program: &str, arg: &str, ns: &str, pod: &str) -> Vec<i32> {
    let (want_pod, want_ns) = (format!("POD_NAME={pod}"), format!("NAMESPACE={ns}"));
    processes(program)
        .into_iter()
        .filter(|(_, args)| args.iter().any(|a| a.ends_with(arg)))
        .filter(|(pid, _)| {
            let env = environ(*pid);
            env.contains(&want_pod) && env.contains(&want_ns)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// The pids of the ZooKeeper JVMs (`java ... QuorumPeerMain`) of member pod `pod` of namespace
/// `ns`.
pub fn zookeeper_member(ns: &str, pod: &str) -> Vec<i32> {
    pod_processes("java", "QuorumPeerMain", ns, pod)
}

/// Is `ip` a local address of the network namespace of process `pid` (a `host LOCAL` entry of
/// its FIB)?
fn has_local_ip(pid: i32, ip: &str) -> bool {
    let Ok(trie) = std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie")) else {
        return false;
    };
    let lines: Vec<&str> = trie.lines().collect();
    lines
        .windows(2)
        .any(|w| w[0].trim_start_matches([' ', '|', '+', '-']) == ip && w[1].contains("host LOCAL"))
}

/// The pids of the Redis servers (not the Sentinels, `redis-server` too, titled `... [sentinel]`)
/// of the pod at `ip` of namespace `ns`. Redis's process title overwrites its environment, so
/// the pod is found by its IP (a local address of the process's network namespace) and the
/// namespace by the pod's `/etc/hosts` (its headless-service names end in `.NS.svc...`).
pub fn redis_server(ns: &str, ip: &str) -> Vec<i32> {
    let in_ns = format!(".{ns}.svc");
    processes("redis-server")
        .into_iter()
        .filter(|(_, args)| !args.iter().any(|a| a.contains("[sentinel]")))
        .filter(|(pid, _)| has_local_ip(*pid, ip))
        .filter(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/root/etc/hosts"))
                .is_ok_and(|h| h.contains(&in_ns))
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Runs `ip ARGS` in the network namespace of process `pid` (a pod's, on the local cluster).
fn ip_in_netns_of(pid: i32, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("nsenter: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Cuts the pod of process `pid` off from `peer` (an IP): a blackhole route in its network
/// namespace, so nothing it sends to `peer` (nor any answer to `peer`) leaves.
pub fn cut_off(pid: i32, peer: &str) -> Result<(), String> {
    ip_in_netns_of(pid, &["route", "add", "blackhole", &format!("{peer}/32")])
}

/// Removes what [`cut_off`] added.
pub fn reconnect(pid: i32, peer: &str) -> Result<(), String> {
    ip_in_netns_of(pid, &["route", "del", "blackhole", &format!("{peer}/32")])
}

/// Sends SIGKILL to `pid`, as a crash would end it. False when it was already gone.
pub fn crash(pid: i32) -> bool {
    kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
}
