//! The processes of a pod's containers on the local cluster, where pods are host processes
//! (docs/local-cluster.md), for faults a test injects: a database member's process killed as if
//! it crashed. Only processes whose command line names the test's own pod and namespace are
//! found, so a test never signals anything it did not start.

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

/// The processes running `program` (the basename of argv[0]): pid and arguments, by pid.
fn processes(program: &str) -> Vec<(i32, Vec<String>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(i32, Vec<String>)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .map(|pid| (pid, cmdline(pid)))
        .filter(|(_, args)| {
            args.first()
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

/// Sends SIGKILL to `pid`, as a crash would end it. False when it was already gone.
pub fn crash(pid: i32) -> bool {
    kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
}
