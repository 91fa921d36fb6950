//! `localcluster up` of a second cluster in a temporary state dir, a pod with a volume on it,
//! the agent SIGKILLed and restarted (it re-adopts the pod; a second pod's program that exits 3
//! during the outage is reported so and restarted; a third pod deleted during the outage is
//! stopped with SIGTERM), SIGKILLed again (the pods run on),
//! then `localcluster down`: afterwards nothing of it is left (no process, mount, loop device,
//! listener, network namespace or link). Local-cluster-only: runs when `E2E_LOCALCLUSTER=1`.
//!
//! The checks here read the host directly (`/proc`, `/sys`, `/run/netns`) and do not reuse the
//! harness's own leftover checks, so they verify them independently.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::state::ClusterState;
use e2e::testing::{MoverSpec, TestCluster, init_tracing};

const LOCALCLUSTER: &str = env!("CARGO_BIN_EXE_localcluster");

fn localcluster(args: &[&str]) -> std::process::Output {
    Command::new(LOCALCLUSTER)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {LOCALCLUSTER}: {e}"))
}

/// Mount points under `dir` in the host's mount table.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(e2e::mountinfo::SELF).unwrap();
    e2e::mountinfo::mount_points_under(&text, dir)
}

/// Loop devices whose backing file is under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file"))
            && Path::new(backing.trim_end().trim_end_matches(" (deleted)")).starts_with(dir)
        {
            out.push(format!("{name} -> {}", backing.trim_end()));
        }
    }
    out
}

/// TCP ports in LISTEN state in the host network namespace (IPv4 and IPv6).
fn listening_ports() -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) == Some(&"0A")
                && let Some(port) = fields
                    .get(1)
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}

/// Network namespaces (`/run/netns`) whose name starts with `prefix`.
fn netns_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Host network interfaces whose name starts with one of `prefixes`.
fn links_with_prefix(prefixes: &[String]) -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p.as_str())))
        .collect()
}

/// Processes whose command line mentions `dir`, or whose network namespace is one of
/// `netns_inodes`.
fn processes_of(dir: &Path, netns_inodes: &BTreeSet<u64>) -> Vec<String> {
    let me = std::process::id();
    let needle = dir.as_os_str().as_encoded_bytes();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let names_dir = cmdline.windows(needle.len()).any(|w| w == needle);
        let in_netns = std::fs::metadata(entry.path().join("ns/net"))
            .is_ok_and(|m| netns_inodes.contains(&m.ino()));
        if names_dir || in_netns {
            let shown = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            out.push(format!("{pid}: {shown}"));
        }
    }
    out
}

/// The pod's uid, its container's restart count and start time (a new run changes them).
fn run_of(p: &k8s_openapi::api::core::v1::Pod) -> (Option<String>, i32, Option<String>) {
    let st = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|l| l.first());
    let started = st
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0.to_string());
    (
        p.metadata.uid.clone(),
        st.map_or(-1, |c| c.restart_count),
        started,
    )
}

/// Restarts the agent (SIGKILL, 1 s down) and checks that it re-adopts the running `before`
/// (its log says so) and reports the same pod, restart count and start time.
async fn assert_readopted(
    state: &ClusterState,
    ns: &e2e::testing::TestNamespace,
    before: &k8s_openapi::api::core::v1::Pod,
) {
    let log = e2e::controlplane::log_path(&state.dir, "agent");
    let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize;
    let stop = e2e::agent::volumes::claim_path(&ns.cluster.client, &ns.name, "data")
        .await
        .unwrap()
        .join("stop");
    let pid = std::fs::read_to_string(e2e::controlplane::pid_path(&state.dir, "agent")).unwrap();
    let outage = async {
        // While the agent is away, the ender's program ends (exit 3).
        let gone = Path::new("/proc").join(pid.trim());
        while gone.exists() && !is_zombie(&gone) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::fs::write(&stop, b"").unwrap();
        // And a pod is deleted: the restarted agent stops it gracefully (SIGTERM).
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = ns.api();
        pods.delete("graceful", &Default::default()).await.unwrap();
    };
    let (restart, ()) = tokio::join!(
        e2e::controlplane::restart_agent(state, Duration::from_secs(3)),
        outage
    );
    restart.unwrap();
    let t = std::time::Instant::now();
    while !String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()[from..])
        .lines()
        .any(|l| l.contains("re-adopting the pod's containers") && l.contains("holder"))
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "holder not re-adopted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = ns
        .wait_pod_ready("holder", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(run_of(&after), run_of(before), "the holder was re-adopted");
    assert_ender_restarted(ns).await;
    assert_stopped_gracefully(ns, &stop.with_file_name("term")).await;
}

/// A pod on the holder's claim that writes `graceful` to the claim's file `term` on SIGTERM.
async fn create_graceful(ns: &e2e::testing::TestNamespace) {
    let script = "trap 'echo graceful > /data/term; exit 0' TERM; while true; do sleep 0.2; done";
    let spec = MoverSpec::shell("graceful", script).mount("data", "/data");
    ns.create_mover_pod(&spec).await.unwrap();
    ns.wait_pod_ready("graceful", Duration::from_secs(120))
        .await
        .unwrap();
}

/// The pod deleted during the outage is gone, after its program got SIGTERM (its marker).
async fn assert_stopped_gracefully(ns: &e2e::testing::TestNamespace, marker: &Path) {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = ns.api();
    let t = std::time::Instant::now();
    while pods.get_opt("graceful").await.unwrap().is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "graceful not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = std::fs::read_to_string(marker).unwrap_or_default();
    assert_eq!(
        text, "graceful\n",
        "deleted while the agent was away: stopped with SIGTERM"
    );
}

/// A pod (restartPolicy Always) on the holder's claim whose container waits for the file `stop`
/// on the claim, removes it and exits 3.
async fn create_ender(ns: &e2e::testing::TestNamespace) {
    use k8s_openapi::api::core::v1::Pod;
    let script = "until [ -e /data/stop ]; do sleep 0.2; done; rm /data/stop; exit 3";
    let spec = MoverSpec::shell("ender", script).mount("data", "/data");
    let mut pod_spec = e2e::testing::mover_pod_spec(&ns.cluster.mover_image, &spec);
    pod_spec.restart_policy = Some("Always".into());
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("ender".into()),
            ..Default::default()
        },
        spec: Some(pod_spec),
        ..Default::default()
    };
    let pods: kube::Api<Pod> = ns.api();
    pods.create(&Default::default(), &pod).await.unwrap();
    ns.wait_pod_ready("ender", Duration::from_secs(120))
        .await
        .unwrap();
}

/// The ender's run that ended while the agent was away is reported with its exit code (3) and
/// restarted (restartPolicy Always).
async fn assert_ender_restarted(ns: &e2e::testing::TestNamespace) {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = ns.api();
    let t = std::time::Instant::now();
    loop {
        let p = pods.get("ender").await.unwrap();
        let st = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let c = st.first();
        let last = c
            .and_then(|c| c.last_state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        let running = c
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        if c.is_some_and(|c| c.restart_count == 1) && last == Some(3) && running {
            println!(
                "NOTE localcluster: a run that ended during the agent's outage: exit 3, restarted"
            );
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "ender not restarted after exit 3: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn is_zombie(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// SIGKILLs the cluster's agent.
fn kill_agent(dir: &Path) {
    let pid = std::fs::read_to_string(e2e::controlplane::pid_path(dir, "agent")).unwrap();
    let status = Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `down`'s sweep (its log on `stderr`) killed the containers the killed agent left running.
fn assert_sweep_killed(stderr: &[u8]) {
    let stderr = strip_ansi(&String::from_utf8_lossy(stderr));
    let sweep = stderr
        .lines()
        .find(|l| l.contains("host cleanup done"))
        .unwrap_or_default();
    println!("NOTE localcluster down after the agent was SIGKILLed: {sweep}");
    assert!(
        sweep.contains("killed=") && !sweep.contains("killed=0"),
        "the sweep killed nothing: {stderr}"
    );
}

/// `text` without ANSI colour sequences.
fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Best effort `down` if the test fails half-way.
struct DownOnDrop(PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dir = self.0.to_string_lossy().into_owned();
            let out = localcluster(&["down", "--state-dir", &dir]);
            eprintln!(
                "cleanup after failure: localcluster down: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn down_leaves_nothing_behind() {
    // It starts a second local cluster (root).
    if !e2e::testing::require::local_cluster_flag("down leaves nothing behind") {
        return;
    }
    init_tracing();
    let dir = std::env::temp_dir().join(format!("sm-lc-test-{}", std::process::id()));
    let dir_str = dir.to_string_lossy().into_owned();
    let guard = DownOnDrop(dir.clone());

    let up = localcluster(&["up", "--state-dir", &dir_str]);
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "localcluster up failed: {}\n{}",
        up.status,
        String::from_utf8_lossy(&up.stderr)
    );
    let kubeconfig = dir.join("kubeconfig");
    assert!(
        stdout.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "up prints the export line: {stdout}"
    );
    let state = ClusterState::load(&dir).unwrap();

    // A pod with a volume, running when `down` comes.
    let netns_before = {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut cluster = TestCluster::from_kubeconfig_file(&kubeconfig)
                .await
                .unwrap();
            // This cluster's image store is empty: the holder runs a host-program image.
            cluster.mover_image = "busybox:1.36".into();
            let ns = cluster.namespace("localcluster-down").await.unwrap();
            ns.create_pvc("data", &cluster.storage_class, "16Mi")
                .await
                .unwrap();
            ns.wait_pvc_bound("data", Duration::from_secs(90))
                .await
                .unwrap();
            let spec = MoverSpec::shell("holder", "echo kept > /data/file && exec sleep 3600")
                .mount("data", "/data");
            ns.create_mover_pod(&spec).await.unwrap();
            let before = ns
                .wait_pod_ready("holder", Duration::from_secs(120))
                .await
                .unwrap();
            create_ender(&ns).await;
            create_graceful(&ns).await;
            // The agent SIGKILLed and started again re-adopts the running holder.
            assert_readopted(&state, &ns, &before).await;
            // The namespace is left for `down` to tear down with everything else.
            std::mem::forget(ns);
        });
        // Killed again and not restarted: its containers run on for `down` to sweep.
        kill_agent(&dir);
        netns_with_prefix(&state.netns_prefix())
    };

    // Sanity: the checks below see this cluster's resources while it runs.
    let ports: BTreeSet<u16> = [
        state.etcd_client_port,
        state.etcd_peer_port,
        state.apiserver_port,
        state.controller_manager_port,
        state.scheduler_port,
    ]
    .into_iter()
    .chain(state.kubelet_ports.iter().copied())
    .collect();
    let netns_inodes: BTreeSet<u64> = netns_before
        .iter()
        .filter_map(|n| std::fs::metadata(Path::new("/run/netns").join(n)).ok())
        .map(|m| m.ino())
        .collect();
    let link_prefixes = vec![state.bridge_name(), state.veth_prefix()];
    assert!(!netns_before.is_empty(), "the pod has a network namespace");
    assert!(!mounts_under(&dir).is_empty(), "the volume is mounted");
    assert!(
        !loops_under(&dir).is_empty(),
        "the volume has a loop device"
    );
    assert!(
        !processes_of(&dir, &netns_inodes).is_empty(),
        "the cluster's processes are visible"
    );
    assert!(
        listening_ports().contains(&state.apiserver_port),
        "the apiserver listens on {}",
        state.apiserver_port
    );
    assert!(
        !links_with_prefix(&link_prefixes).is_empty(),
        "bridge and veth exist"
    );

    let down = localcluster(&["down", "--state-dir", &dir_str]);
    assert!(
        down.status.success(),
        "localcluster down failed: {}\n{}",
        down.status,
        String::from_utf8_lossy(&down.stderr)
    );
    assert_sweep_killed(&down.stderr);

    let procs = processes_of(&dir, &netns_inodes);
    assert!(procs.is_empty(), "processes left: {procs:#?}");
    let mounts = mounts_under(&dir);
    assert!(mounts.is_empty(), "mounts left: {mounts:#?}");
    let loops = loops_under(&dir);
    assert!(loops.is_empty(), "loop devices left: {loops:#?}");
    let listening: Vec<u16> = listening_ports().intersection(&ports).copied().collect();
    assert!(listening.is_empty(), "ports still listening: {listening:?}");
    let netns = netns_with_prefix(&state.netns_prefix());
    assert!(netns.is_empty(), "network namespaces left: {netns:?}");
    let links = links_with_prefix(&link_prefixes);
    assert!(links.is_empty(), "links left: {links:?}");

    drop(guard);
    std::fs::remove_dir_all(&dir).unwrap();
}
