//! Root-only integration tests of the node agent's host runtime (`e2e::agent::runtime`): real
//! network namespaces, veths, a bridge, containers with private roots, exec, host cleanup.
//!
//! This test binary has no libtest harness (`harness = false` in Cargo.toml): its `main` is also
//! the container init program (`<this binary> container-init <json>`, via `LOCALCLUSTER_BIN`)
//! and provides tiny helper programs for the containers (`serve`, `connect`, `agent-spawn`), so
//! the tests depend on nothing but the runtime itself. One test also runs a container through the
//! real `localcluster container-init` dispatch.
//!
//! Every test makes a throw-away cluster identity (random id, free pod network, temp state dir)
//! whose guard runs `cleanup_host` and removes the dir even when the test panics. Skipped (with a
//! message) when not run as root. Arguments: substrings selecting tests; `--list` lists them.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use e2e::agent::runtime::{
    self, ContainerSpec, ExecOutput, INIT_PROGRAM_ENV, MountSpec, ProcessSecurity, RuntimeError,
    Sandbox,
};
use e2e::state::ClusterState;
use nix::sys::signal::Signal;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(runtime::INIT_SUBCOMMAND) => {
            let spec = args.get(2).map(PathBuf::from).unwrap_or_default();
            let err = runtime::container_init(&spec);
            eprintln!("container-init {}: {err}", spec.display());
            ExitCode::from(127)
        }
        Some("serve") => serve(&args[2..]),
        Some("connect") => connect(&args[2..]),
        Some("agent-spawn") => agent_spawn(&args[2..]),
        _ => run_tests(&args[1..]),
    }
}

// ---------------------------------------------------------------- helper programs

/// `serve PORT REPLY`: answers every TCP connection with `REPLY <hostname>\n`.
fn serve(args: &[String]) -> ExitCode {
    let port: u16 = args[0].parse().unwrap();
    let listener = TcpListener::bind(("0.0.0.0", port)).unwrap();
    let host = nix::unistd::gethostname().unwrap();
    println!("listening on {port}");
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = writeln!(conn, "{} {}", args[1], host.to_string_lossy());
    }
    ExitCode::SUCCESS
}

/// `connect IP PORT`: prints what the server at IP:PORT sends.
fn connect(args: &[String]) -> ExitCode {
    let addr = SocketAddr::new(args[0].parse().unwrap(), args[1].parse().unwrap());
    match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
        Ok(mut s) => {
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("connect {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `agent-spawn SANDBOX_JSON SPEC_JSON wait|exit`: plays the agent in a process of its own:
/// spawns the container from a tokio blocking thread and prints its pid; with `wait`, waits for
/// it and prints its exit code; with `exit`, exits at once (the container must die with it).
fn agent_spawn(args: &[String]) -> ExitCode {
    let sandbox: Sandbox =
        serde_json::from_str(&std::fs::read_to_string(&args[0]).unwrap()).unwrap();
    let spec: ContainerSpec =
        serde_json::from_str(&std::fs::read_to_string(&args[1]).unwrap()).unwrap();
    let spec_argv0 = spec.argv[0].clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut child = tokio::task::spawn_blocking(move || {
            runtime::spawn_container(&sandbox, "agent-spawned", &spec)
        })
        .await
        .unwrap()
        .unwrap();
        let pid = child.id().unwrap();
        println!("pid {pid}");
        if args[2] == "exit" {
            // Exit once the container runs (an init still being built dies with its agent).
            let argv0 = spec_argv0.as_bytes();
            while !program_runs(pid, argv0) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if args[2] == "wait" {
            let status = child.wait().await.unwrap();
            println!("exit {}", status.code().unwrap_or(-1));
        }
    });
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------- harness

type TestFn = fn();

const TESTS: &[(&str, TestFn)] = &[
    (
        "network_host_to_pod_and_pod_to_pod",
        network_host_to_pod_and_pod_to_pod,
    ),
    (
        "filesystem_mounts_identity_and_isolation",
        filesystem_mounts_identity_and_isolation,
    ),
    ("exact_environment", exact_environment),
    (
        "private_dev_and_termination_log",
        private_dev_and_termination_log,
    ),
    (
        "exec_joins_the_running_container",
        exec_joins_the_running_container,
    ),
    (
        "confinement_holds_for_the_container_and_its_execs",
        confinement_holds_for_the_container_and_its_execs,
    ),
    (
        "containers_outlive_the_agent_process_and_record_their_exit",
        containers_outlive_the_agent_process_and_record_their_exit,
    ),
    (
        "localcluster_binary_runs_containers",
        localcluster_binary_runs_containers,
    ),
    (
        "etcd_cluster_across_three_pods",
        etcd_cluster_across_three_pods,
    ),
    (
        "cleanup_host_removes_everything_but_volumes",
        cleanup_host_removes_everything_but_volumes,
    ),
];

fn run_tests(args: &[String]) -> ExitCode {
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in TESTS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    if !e2e::testing::require::root("runtime tests") {
        return ExitCode::SUCCESS;
    }
    // SAFETY: no other thread exists yet (first thing the harness does).
    unsafe { std::env::set_var(INIT_PROGRAM_ENV, std::env::current_exe().unwrap()) };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();

    let selected: Vec<&(&str, TestFn)> = TESTS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} runtime tests", selected.len());
    let mut failed = Vec::new();
    for (name, test) in &selected {
        let t = Instant::now();
        let ok = std::panic::catch_unwind(test).is_ok();
        println!(
            "test {name} ... {} ({:.1}s)",
            if ok { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        if !ok {
            failed.push(*name);
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        selected.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failures: {failed:?}");
        ExitCode::FAILURE
    }
}

/// A throw-away cluster identity; dropping it cleans the host and removes the state dir.
struct TestCluster {
    state: ClusterState,
}

fn random_hex(len: usize) -> String {
    use std::hash::BuildHasher;
    let n = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    format!("{n:016x}")[..len].to_string()
}

impl TestCluster {
    fn new() -> Self {
        let id = random_hex(6);
        let dir = std::env::temp_dir().join(format!("sm-runtime-test-{id}"));
        std::fs::create_dir_all(dir.join("nodes")).unwrap();
        // The pod network is reserved as `localcluster up` does, so that a real cluster started
        // meanwhile never gets the same 198.18.N.0/24.
        let reservation = e2e::controlplane::reserve_net(&dir, &id).unwrap();
        let state = ClusterState {
            id,
            dir,
            bin_dir: PathBuf::from("/nonexistent"),
            etcd_client_port: 0,
            etcd_peer_port: 0,
            apiserver_port: 0,
            controller_manager_port: 0,
            scheduler_port: 0,
            kubelet_ports: vec![0, 0, 0],
            pod_net: reservation.net,
            service_net: reservation.net,
        };
        state.save().unwrap();
        drop(reservation);
        TestCluster { state }
    }

    fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.state.pod_net, host)
    }

    fn pod_dir(&self, node: &str, pod: &str) -> PathBuf {
        self.state.node_dir(node).join("pods").join(pod)
    }

    fn sandbox(&self, key: &str, host: u8) -> Sandbox {
        runtime::create_sandbox(
            &self.state,
            key,
            self.ip(host),
            &self.pod_dir("node-a", key),
        )
        .unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Err(e) = runtime::cleanup_host(&self.state) {
            eprintln!("cleanup_host: {e}");
        }
        e2e::controlplane::release_net(&self.state);
        // Also whatever a test mounted under volumes/ (cleanup_host leaves those alone), so that
        // removing the dir never descends into a mounted filesystem.
        let dir = std::fs::canonicalize(&self.state.dir).unwrap_or(self.state.dir.clone());
        for mp in mounts_under(&dir).iter().rev() {
            let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
        }
        if mounts_under(&dir).is_empty() {
            let _ = std::fs::remove_dir_all(&self.state.dir);
        } else {
            eprintln!("leaving {} in place: still has mounts", dir.display());
        }
    }
}

fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(e2e::mountinfo::SELF).unwrap();
    e2e::mountinfo::mount_points_under(&text, dir)
}

fn cmd(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("");
            state != "Z" && state != "X"
        })
        .unwrap_or(false)
}

/// Whether the program of the container `pid` (its supervisor) runs with a command line
/// starting with `prefix` (the supervisor's child has exec'd it).
fn program_runs(pid: u32, prefix: &[u8]) -> bool {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
    children
        .unwrap_or_default()
        .split_whitespace()
        .any(|c| std::fs::read(format!("/proc/{c}/cmdline")).is_ok_and(|l| l.starts_with(prefix)))
}

/// The pid of the program of the container `pid` (its supervisor's child).
fn program_pid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .find_map(|c| c.parse().ok())
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn self_exe() -> String {
    std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn spec(sandbox: &Sandbox, name: &str, argv: &[&str]) -> ContainerSpec {
    ContainerSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), PATH.into())],
        working_dir: None,
        mounts: vec![],
        hostname: name.to_string(),
        log_path: sandbox.dir.join(format!("{name}.log")),
        run_as_user: None,
        run_as_group: None,
        security: Default::default(),
        image_root: None,
        image_uid: None,
    }
}

/// Runs a container to completion (bounded) and returns its exit code and log.
async fn run_to_end(sandbox: &Sandbox, name: &str, spec: &ContainerSpec) -> (i32, String) {
    let mut child = runtime::spawn_container(sandbox, name, spec).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("container finishes")
        .unwrap();
    let log = std::fs::read_to_string(&spec.log_path).unwrap_or_default();
    (status.code().unwrap_or(-1), log)
}

fn text(out: &ExecOutput) -> String {
    format!(
        "exit {} stdout {:?} stderr {:?}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// ---------------------------------------------------------------- tests

fn network_host_to_pod_and_pod_to_pod() {
    let c = TestCluster::new();
    let st = &c.state;
    // Two sandboxes created concurrently on a cluster without a bridge yet.
    let (a, b) = std::thread::scope(|s| {
        let ta = s.spawn(|| c.sandbox("pod-a", 2));
        let tb = s.spawn(|| c.sandbox("pod-b", 3));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert_eq!(a.netns, format!("{}pod-a", st.netns_prefix()));
    assert!(netns_exists(&a.netns) && netns_exists(&b.netns));
    for sb in [&a, &b] {
        assert!(sb.host_veth.starts_with(&st.veth_prefix()) && sb.host_veth.len() <= 15);
        assert!(link_exists(&sb.host_veth));
        let master = std::fs::read_link(format!("/sys/class/net/{}/master", sb.host_veth)).unwrap();
        assert!(master.ends_with(st.bridge_name()), "{master:?}");
        let inside = cmd(
            "ip",
            &["-n", &sb.netns, "-4", "-o", "addr", "show", "dev", "eth0"],
        );
        assert!(inside.contains(&format!("inet {}/24", sb.ip)), "{inside}");
        // No default route: only the pod /24 is reachable from a pod.
        let route = cmd("ip", &["-n", &sb.netns, "route", "show", "default"]);
        assert!(route.trim().is_empty(), "unexpected default route: {route}");
        let get = std::process::Command::new("ip")
            .args(["-n", &sb.netns, "route", "get", "192.0.2.1"])
            .output()
            .unwrap();
        assert!(
            !get.status.success() && String::from_utf8_lossy(&get.stderr).contains("unreachable"),
            "a pod must not reach 192.0.2.1: {:?}",
            get
        );
    }
    assert_ne!(a.host_veth, b.host_veth);
    let br = cmd(
        "ip",
        &["-4", "-o", "addr", "show", "dev", &st.bridge_name()],
    );
    assert!(br.contains(&format!("inet {}/24", st.bridge_ip())), "{br}");
    assert!(a.dir.is_dir());
    // iproute2's `ip netns add` would leave /run/netns as a mount point; we do not.
    assert!(!mounts_under(Path::new("/run")).contains(&PathBuf::from("/run/netns")));

    rt().block_on(async {
        let server = spec(
            &a,
            "server",
            &[&self_exe(), "serve", "2379", "hello-from-a"],
        );
        let mut child = runtime::spawn_container(&a, "server", &server).unwrap();
        let pid = child.id().unwrap();
        assert_eq!(
            std::fs::read_to_string(runtime::pid_file(&a, "server"))
                .unwrap()
                .trim(),
            pid.to_string()
        );
        // host -> pod
        let addr = SocketAddr::new(a.ip.into(), 2379);
        let t = Instant::now();
        let reply = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(mut s) => {
                    let mut r = String::new();
                    s.read_to_string(&mut r).unwrap();
                    break r;
                }
                Err(e) => {
                    assert!(t.elapsed() < Duration::from_secs(10), "host -> {addr}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        assert_eq!(reply, "hello-from-a server\n");
        println!("host -> pod: first reply after {:?}", t.elapsed());
        // pod -> pod (an exec in pod-b, which has no running container: fresh namespaces)
        let probe = spec(&b, "client", &["/bin/true"]);
        let out = runtime::exec_in_container(
            &b,
            &probe,
            &[
                self_exe(),
                "connect".into(),
                a.ip.to_string(),
                "2379".into(),
            ],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(out.exit_code, 0, "{}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello-from-a server\n"
        );
        // pod-b reaching itself on its own loopback / address fails: nothing listens there.
        let out = runtime::exec_in_container(
            &b,
            &probe,
            &[
                self_exe(),
                "connect".into(),
                b.ip.to_string(),
                "2379".into(),
            ],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_ne!(out.exit_code, 0, "{}", text(&out));

        runtime::signal_container(pid, Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .unwrap()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    });

    for sb in [&a, &b] {
        runtime::destroy_sandbox(sb).unwrap();
        assert!(!netns_exists(&sb.netns));
        wait_until("veth removal", Duration::from_secs(5), || {
            !link_exists(&sb.host_veth)
        });
        runtime::destroy_sandbox(sb).unwrap();
    }
    // A stale namespace of the same name is replaced.
    let again = c.sandbox("pod-a", 2);
    assert!(netns_exists(&again.netns));
    let replaced = c.sandbox("pod-a", 2);
    assert!(netns_exists(&replaced.netns));
    runtime::destroy_sandbox(&again).unwrap();
    runtime::destroy_sandbox(&replaced).unwrap();
    // Bad input is refused before anything is made.
    assert!(matches!(
        runtime::create_sandbox(
            st,
            "x",
            Ipv4Addr::new(10, 0, 0, 2),
            &c.pod_dir("node-a", "x")
        ),
        Err(RuntimeError::Invalid { .. })
    ));
    assert!(runtime::create_sandbox(st, "../x", c.ip(9), &c.pod_dir("node-a", "x")).is_err());
}

fn filesystem_mounts_identity_and_isolation() {
    let c = TestCluster::new();
    let sb = c.sandbox("fs", 4);
    let vol = sb.dir.join("vol");
    let ro = sb.dir.join("ro");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::write(vol.join("seed"), "seed-data\n").unwrap();
    std::fs::write(ro.join("config"), "cfg\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).unwrap();
    let hosts = sb.dir.join("hosts");
    std::fs::write(
        &hosts,
        format!("{} fs-0.fs.ns.svc.cluster.local fs-0\n", sb.ip),
    )
    .unwrap();
    let marker = format!("sm-runtime-test-{}", c.state.id);
    assert!(!Path::new("/var/run").join(&marker).exists());
    assert!(!Path::new("/").join(&marker).exists());
    let host_hostname = nix::unistd::gethostname().unwrap();
    let data_existed = Path::new("/data").exists();

    let mounts = vec![
        MountSpec {
            source: vol.clone(),
            target: PathBuf::from("/data"),
            read_only: false,
        },
        MountSpec {
            source: ro.clone(),
            target: PathBuf::from("/etc/sm-config"),
            read_only: true,
        },
        MountSpec {
            source: hosts.clone(),
            target: PathBuf::from("/etc/hosts"),
            read_only: true,
        },
    ];
    rt().block_on(async {
        // As root: the root filesystem is private (mkdir under /var/run and / stays inside).
        let script = format!(
            "set -e; mkdir -p /var/run/{marker}/etcd /{marker}; echo mk=ok; \
             echo host=$(hostname); cat /data/seed; \
             if ls /.sm-oldroot >/dev/null 2>&1; then echo oldroot=visible; else echo oldroot=gone; fi; \
             if grep -q ' /etc/hosts ' /proc/self/mountinfo; then echo hostsmount=yes; fi; \
             grep -c . /proc/self/mountinfo | sed 's/^/mounts=/'; \
             cat /proc/self/mountinfo; \
             cat /etc/hosts; ls /sys/class/net | tr '\\n' ' '; echo"
        );
        let mut root_spec = spec(&sb, "rootctr", &["/bin/sh", "-c", &script]);
        root_spec.mounts = mounts.clone();
        root_spec.hostname = "fs-0".into();
        let (code, log) = run_to_end(&sb, "rootctr", &root_spec).await;
        println!("{log}");
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("mk=ok\n"), "{log}");
        assert!(log.contains("host=fs-0\n"), "{log}");
        assert!(log.contains("seed-data\n"), "{log}");
        assert!(log.contains("oldroot=gone\n"), "{log}");
        assert!(log.contains("hostsmount=yes\n"), "{log}");
        assert!(log.contains("fs-0.fs.ns.svc.cluster.local"), "{log}");
        assert!(log.contains("eth0") && log.contains("lo"), "{log}");
        // The container sees no host mount of the state dir other than its own binds.
        let state_dir = std::fs::canonicalize(&c.state.dir).unwrap();
        assert!(!log.contains(&format!(" {} ", state_dir.display())), "{log}");
        assert!(!Path::new("/var/run").join(&marker).exists(), "mkdir leaked to the host /run");
        assert!(!Path::new("/").join(&marker).exists(), "mkdir leaked to the host /");
        assert_eq!(nix::unistd::gethostname().unwrap(), host_hostname);

        // As nobody: identity, working dir, read-only and read-write binds.
        let script = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); echo pwd=$(pwd); \
                      cat /etc/sm-config/config; \
                      if touch /etc/sm-config/x 2>/dev/null; then echo ro=writable; else echo ro=readonly; fi; \
                      echo written > /data/out && echo data=rw";
        let mut user_spec = spec(&sb, "userctr", &["sh", "-c", script]);
        user_spec.mounts = mounts.clone();
        user_spec.working_dir = Some(PathBuf::from("/data/wd"));
        user_spec.run_as_user = Some(65534);
        user_spec.run_as_group = Some(65534);
        let (code, log) = run_to_end(&sb, "userctr", &user_spec).await;
        println!("{log}");
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("uid=65534 gid=65534 groups=65534\n"), "{log}");
        assert!(log.contains("pwd=/data/wd\n"), "{log}");
        assert!(log.contains("cfg\nro=readonly\n"), "{log}");
        assert!(log.contains("data=rw\n"), "{log}");
        assert_eq!(std::fs::read_to_string(vol.join("out")).unwrap(), "written\n");
        assert!(vol.join("wd").is_dir());
        assert!(!ro.join("x").exists());

        // Failures of the init phase land in the log and the exit status.
        let bad = spec(&sb, "badctr", &["no-such-program-sm"]);
        let (code, log) = run_to_end(&sb, "badctr", &bad).await;
        assert_eq!(code, 127, "{log}");
        assert!(log.contains("no-such-program-sm"), "{log}");
        let mut bad_mount = spec(&sb, "badmount", &["/bin/true"]);
        bad_mount.mounts = vec![MountSpec {
            source: sb.dir.join("missing"),
            target: PathBuf::from("/x"),
            read_only: false,
        }];
        let (code, log) = run_to_end(&sb, "badmount", &bad_mount).await;
        assert_eq!(code, 127, "{log}");
        assert!(log.contains("cannot open mount source"), "{log}");
    });
    if !data_existed {
        assert!(
            !Path::new("/data").exists(),
            "mkdir of /data leaked to the host"
        );
    }
    runtime::destroy_sandbox(&sb).unwrap();
}

fn exact_environment() {
    let c = TestCluster::new();
    let sb = c.sandbox("env", 5);
    rt().block_on(async {
        let mut s = spec(&sb, "envctr", &["/usr/bin/env"]);
        s.env = vec![
            ("A".into(), "1".into()),
            ("B".into(), "two words $(NOT_EXPANDED)".into()),
            ("PATH".into(), "/nowhere".into()),
        ];
        let (code, log) = run_to_end(&sb, "envctr", &s).await;
        assert_eq!(code, 0, "{log}");
        assert_eq!(log, "A=1\nB=two words $(NOT_EXPANDED)\nPATH=/nowhere\n");
        // argv[0] without '/' is looked up in the container's PATH.
        let mut s = spec(&sb, "pathctr", &["env"]);
        s.env = vec![("PATH".into(), "/nowhere:/usr/bin".into())];
        let (code, log) = run_to_end(&sb, "pathctr", &s).await;
        assert_eq!(code, 0, "{log}");
        assert_eq!(log, "PATH=/nowhere:/usr/bin\n");
        // SIGPIPE is back to its default (a Rust parent ignores it): `yes | head` ends at once.
        let s = spec(
            &sb,
            "pipectr",
            &["/bin/sh", "-c", "yes | head -n 2; echo done"],
        );
        let (code, log) = run_to_end(&sb, "pipectr", &s).await;
        assert_eq!(code, 0, "{log}");
        assert_eq!(log, "y\ny\ndone\n");
    });
}

/// Names in the host's `/dev`, without loop devices (other clusters' volume provisioners may
/// attach some meanwhile).
fn host_dev_names() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/dev")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !(n.starts_with("loop") && n[4..].bytes().all(|b| b.is_ascii_digit())))
        .collect()
}

/// Size, mtime and inode of a host file, if it exists.
fn file_identity(p: &Path) -> Option<(u64, i64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.len(), m.mtime_nsec() + m.mtime() * 1_000_000_000, m.ino()))
}

/// A termination message file as the agent prepares it: empty, mode 0666.
fn termination_file(sb: &Sandbox, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let f = sb.dir.join("termination").join(name);
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(&f, "").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
    f
}

fn private_dev_and_termination_log() {
    let c = TestCluster::new();
    let sb = c.sandbox("dev", 9);
    let marker = format!("sm-dev-test-{}", c.state.id);
    let host_names = host_dev_names();
    let host_term = Path::new("/dev/termination-log");
    let host_term_before = file_identity(host_term);
    let term_mount = |source: &Path| MountSpec {
        source: source.to_path_buf(),
        target: PathBuf::from("/dev/termination-log"),
        read_only: false,
    };
    rt().block_on(async {
        let term = termination_file(&sb, "devctr");
        // (`>> /dev/stdout`: the log is a file, and `>` would reopen it with O_TRUNC.)
        let script = format!(
            "set -e; \
             printf 'zero=%s\\n' \"$(head -c 16 /dev/zero | od -An -tx1 | tr -d ' \\n')\"; \
             echo discarded > /dev/null; printf 'null=%s\\n' \"$(wc -c < /dev/null)\"; \
             printf 'urandom=%s\\n' \"$(head -c 32 /dev/urandom | wc -c)\"; \
             printf 'random=%s\\n' \"$(head -c 8 /dev/random | wc -c)\"; \
             if echo x 2>/dev/null > /dev/full; then echo full=written; else echo full=ENOSPC; fi; \
             echo via-dev-stdout >> /dev/stdout; \
             printf 'ptmx=%s fd=%s\\n' \"$(readlink /dev/ptmx)\" \"$(readlink /dev/fd)\"; \
             test -c /dev/pts/ptmx && echo pts=ok; \
             if command -v script >/dev/null; then \
               printf 'tty=%s\\n' \"$(script -qec tty /dev/null | tr -d '\\r')\"; \
             else echo tty=/dev/pts/0; fi; \
             printf 'devfs=%s\\n' \"$(awk '$5 == \"/dev\" {{print $9}}' /proc/self/mountinfo)\"; \
             printf 'names=%s\\n' \"$(ls -A /dev | tr '\\n' ' ')\"; \
             touch /dev/{marker}; \
             printf hello > /dev/termination-log; echo done"
        );
        let mut s = spec(&sb, "devctr", &["/bin/sh", "-c", &script]);
        s.mounts = vec![term_mount(&term)];
        let (code, log) = run_to_end(&sb, "devctr", &s).await;
        println!("{log}");
        assert_eq!(code, 0, "{log}");
        assert!(
            log.contains(&format!("zero={}\n", "00".repeat(16))),
            "{log}"
        );
        assert!(log.contains("null=0\n"), "{log}");
        assert!(log.contains("urandom=32\n"), "{log}");
        assert!(log.contains("random=8\n"), "{log}");
        assert!(log.contains("full=ENOSPC\n"), "{log}");
        assert!(log.contains("via-dev-stdout\n"), "{log}");
        assert!(log.contains("ptmx=pts/ptmx fd=/proc/self/fd\n"), "{log}");
        assert!(log.contains("pts=ok\n"), "{log}");
        // A pty of the container's own devpts instance (the host's ptys are not numbered here).
        assert!(log.contains("tty=/dev/pts/0\n"), "{log}");
        assert!(log.contains("devfs=tmpfs\n"), "{log}");
        // Exactly the runtime's /dev: no host device (disks, loop devices, kvm) is visible.
        let names = log
            .lines()
            .find_map(|l| l.strip_prefix("names="))
            .unwrap_or_default();
        let mut names: Vec<&str> = names.split_whitespace().collect();
        names.sort_unstable();
        let mut expected = vec![
            "fd",
            "full",
            "null",
            "ptmx",
            "pts",
            "random",
            "shm",
            "stderr",
            "stdin",
            "stdout",
            "termination-log",
            "tty",
            "urandom",
            "zero",
        ];
        if names.contains(&"mqueue") {
            expected.push("mqueue");
        }
        expected.sort_unstable();
        assert_eq!(names, expected, "{log}");
        assert!(log.contains("done\n"), "{log}");
        assert_eq!(std::fs::read_to_string(&term).unwrap(), "hello");

        // As nobody: the file (mode 0666) is writable, /dev/null too.
        let term = termination_file(&sb, "nobody");
        let mut s = spec(
            &sb,
            "nobody",
            &[
                "/bin/sh",
                "-c",
                "echo x > /dev/null && printf 'from nobody' > /dev/termination-log",
            ],
        );
        s.mounts = vec![term_mount(&term)];
        s.run_as_user = Some(65534);
        s.run_as_group = Some(65534);
        let (code, log) = run_to_end(&sb, "nobody", &s).await;
        assert_eq!(code, 0, "{log}");
        assert_eq!(std::fs::read_to_string(&term).unwrap(), "from nobody");

        // An exec into the running container writes the same file.
        let term = termination_file(&sb, "sleeper");
        let mut s = spec(&sb, "sleeper", &["/bin/sleep", "300"]);
        s.mounts = vec![term_mount(&term)];
        let mut child = runtime::spawn_container(&sb, "sleeper", &s).unwrap();
        let argv: Vec<String> = ["/bin/sh", "-c", "printf via-exec > /dev/termination-log"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let out = runtime::exec_in_container(&sb, &s, &argv, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0, "{}", text(&out));
        assert_eq!(std::fs::read_to_string(&term).unwrap(), "via-exec");
        runtime::signal_container(child.id().unwrap(), Signal::SIGKILL).unwrap();
        child.wait().await.unwrap();
    });
    // Nothing reached the host's /dev.
    assert!(
        !Path::new("/dev").join(&marker).exists(),
        "a container created a file in the host's /dev"
    );
    assert_eq!(
        file_identity(host_term),
        host_term_before,
        "the host's /dev/termination-log was created or written"
    );
    let added: Vec<String> = host_dev_names().difference(&host_names).cloned().collect();
    assert!(added.is_empty(), "the host's /dev gained {added:?}");
    runtime::destroy_sandbox(&sb).unwrap();
}

/// The lines of /proc/self/status a confinement check prints.
const CAPS_PROBE: &str =
    "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status; touch /x || echo ROOT-RO";

fn confinement_holds_for_the_container_and_its_execs() {
    let c = TestCluster::new();
    let sb = c.sandbox("confine", 12);
    rt().block_on(async {
        let script = format!("{CAPS_PROBE}; exec sleep 300");
        let mut main = spec(&sb, "main", &["/bin/sh", "-c", &script]);
        main.security = ProcessSecurity {
            capabilities: Some(vec!["CAP_KILL".into(), "CAP_CHOWN".into()]),
            no_new_privs: true,
            read_only_root: true,
        };
        let mut child = runtime::spawn_container(&sb, "main", &main).unwrap();
        let pid = child.id().unwrap();
        wait_until("the shell to exec sleep", Duration::from_secs(5), || {
            program_runs(pid, b"sleep\0")
        });
        // Root keeps exactly CHOWN (bit 0) and KILL (bit 5); the root is read-only.
        let want = "CapPrm:\t0000000000000021\nCapEff:\t0000000000000021\n\
                    CapBnd:\t0000000000000021\nNoNewPrivs:\t1\n";
        let log = std::fs::read_to_string(&main.log_path).unwrap();
        assert!(log.starts_with(want), "{log}");
        assert!(
            log.contains("Read-only file system") && log.contains("ROOT-RO"),
            "{log}"
        );
        // An exec into it (a probe) is confined the same way.
        let argv = ["/bin/sh", "-c", CAPS_PROBE].map(String::from);
        let out = runtime::exec_in_container(&sb, &main, &argv, Duration::from_secs(5))
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout, format!("{want}ROOT-RO\n"), "{}", text(&out));
        runtime::signal_container(pid, Signal::SIGKILL).unwrap();
        let _ = child.wait().await;
        // Another uid keeps the bounding set and ends with no permitted or effective capability.
        let mut user = spec(&sb, "user", &["/bin/sh", "-c", CAPS_PROBE]);
        user.run_as_user = Some(1000);
        user.security.capabilities = Some(vec!["CAP_KILL".into()]);
        let (code, log) = run_to_end(&sb, "user", &user).await;
        assert_eq!(code, 0, "{log}");
        let want = "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
                    CapBnd:\t0000000000000020\nNoNewPrivs:\t0\n";
        assert!(log.starts_with(want), "{log}");
    });
    runtime::destroy_sandbox(&sb).unwrap();
}

fn exec_joins_the_running_container() {
    let c = TestCluster::new();
    let sb = c.sandbox("exec", 6);
    rt().block_on(async {
        let main = spec(
            &sb,
            "main",
            &["/bin/sh", "-c", "echo marker-$$ > /tmp/m; exec sleep 300"],
        );
        let mut child = runtime::spawn_container(&sb, "main", &main).unwrap();
        let pid = child.id().unwrap();
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // At once: the exec waits for the container to leave its init, then joins it.
        let out = runtime::exec_in_container(
            &sb,
            &main,
            &argv(&[
                "/bin/sh",
                "-c",
                "test -e /.sm-oldroot && echo half-built; hostname",
            ]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "main\n",
            "{}",
            text(&out)
        );
        // Let the shell exec `sleep`: the container's command line then differs from its argv.
        wait_until("the shell to exec sleep", Duration::from_secs(5), || {
            program_runs(pid, b"sleep\0")
        });
        // The container's private /tmp is visible to the exec: it joined the mount namespace.
        let t = Instant::now();
        let out = loop {
            let out = runtime::exec_in_container(
                &sb,
                &main,
                &argv(&["cat", "/tmp/m"]),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
            if out.exit_code == 0 || t.elapsed() > Duration::from_secs(10) {
                break out;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("marker-{}\n", program_pid(pid).expect("the program")),
            "{}",
            text(&out)
        );
        let t = Instant::now();
        let out =
            runtime::exec_in_container(&sb, &main, &argv(&["hostname"]), Duration::from_secs(5))
                .await
                .unwrap();
        println!("exec round trip: {:?}", t.elapsed());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "main\n");
        let out = runtime::exec_in_container(
            &sb,
            &main,
            &argv(&["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(
            out,
            ExecOutput {
                exit_code: 3,
                stdout: b"out\n".to_vec(),
                stderr: b"err\n".to_vec()
            }
        );
        // Timeout: killed, reported as ExecTimeout, promptly.
        let t = Instant::now();
        let r = runtime::exec_in_container(
            &sb,
            &main,
            &argv(&["sleep", "30"]),
            Duration::from_millis(300),
        )
        .await;
        assert!(matches!(r, Err(RuntimeError::ExecTimeout(_))), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // Leftover background processes do not hold the exec open.
        let t = Instant::now();
        let out = runtime::exec_in_container(
            &sb,
            &main,
            &argv(&["/bin/sh", "-c", "sleep 100 & echo bg"]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "bg\n");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // Exec scratch files are removed.
        let leftovers: Vec<_> = std::fs::read_dir(&sb.dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".exec-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // The container itself is untouched by all that.
        assert!(pid_alive(pid));
        runtime::signal_container(pid, Signal::SIGKILL).unwrap();
        tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .unwrap()
            .unwrap();
        // Without a running container the exec gets fresh namespaces: no /tmp/m there.
        let out = runtime::exec_in_container(
            &sb,
            &main,
            &argv(&["/bin/sh", "-c", "cat /tmp/m || echo fresh; hostname"]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "fresh\nmain\n",
            "{}",
            text(&out)
        );
    });
    runtime::destroy_sandbox(&sb).unwrap();
}

fn agent_process(
    sb: &Sandbox,
    spec: &ContainerSpec,
    init: &str,
    mode: &str,
) -> std::process::Child {
    let sb_json = sb.dir.join("agent-sandbox.json");
    let spec_json = sb.dir.join("agent-spec.json");
    std::fs::write(&sb_json, serde_json::to_string(sb).unwrap()).unwrap();
    std::fs::write(&spec_json, serde_json::to_string(spec).unwrap()).unwrap();
    std::process::Command::new(self_exe())
        .arg("agent-spawn")
        .arg(&sb_json)
        .arg(&spec_json)
        .arg(mode)
        .env(INIT_PROGRAM_ENV, init)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn read_pid(out: &str) -> u32 {
    out.lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {out:?}"))
}

fn containers_outlive_the_agent_process_and_record_their_exit() {
    let c = TestCluster::new();
    let sb = c.sandbox("orphan", 7);
    // The agent spawns from a tokio blocking thread, prints the pid, and exits (as if killed:
    // it stops nothing).
    let s = spec(&sb, "agent-spawned", &["/bin/sh", "-c", "sleep 2; exit 7"]);
    let agent = agent_process(&sb, &s, &self_exe(), "exit");
    let out = agent.wait_with_output().unwrap();
    assert!(out.status.success());
    let pid = read_pid(&String::from_utf8_lossy(&out.stdout));
    assert!(pid_alive(pid), "the container lives on after its agent");
    let rec = runtime::recorded_container(&sb.dir, "agent-spawned").expect("recorded");
    assert!(
        rec.running && rec.pid == pid && rec.exit_code.is_none(),
        "{rec:?}"
    );
    let t = Instant::now();
    wait_until(
        "the orphaned container to end",
        Duration::from_secs(10),
        || !pid_alive(pid),
    );
    let rec = runtime::recorded_container(&sb.dir, "agent-spawned").expect("recorded");
    assert_eq!((rec.running, rec.exit_code), (false, Some(7)), "{rec:?}");
    println!(
        "orphaned container ended {:?} after its agent, exit 7 recorded",
        t.elapsed()
    );
    // Terminated by a signal to its process group: recorded as 128 + SIGTERM.
    let s = spec(&sb, "agent-spawned", &["/bin/sleep", "300"]);
    let out = agent_process(&sb, &s, &self_exe(), "exit")
        .wait_with_output()
        .unwrap();
    let pid = read_pid(&String::from_utf8_lossy(&out.stdout));
    wait_until("the program to run", Duration::from_secs(5), || {
        program_runs(pid, b"/bin/sleep")
    });
    runtime::signal_container(pid, Signal::SIGTERM).unwrap();
    wait_until("the container to end", Duration::from_secs(10), || {
        !pid_alive(pid)
    });
    let rec = runtime::recorded_container(&sb.dir, "agent-spawned").expect("recorded");
    assert_eq!(rec.exit_code, Some(143), "{rec:?}");
}

fn localcluster_binary_runs_containers() {
    let c = TestCluster::new();
    let sb = c.sandbox("lc", 8);
    let s = spec(
        &sb,
        "agent-spawned",
        &["/bin/sh", "-c", "echo via-localcluster $(hostname)"],
    );
    let agent = agent_process(&sb, &s, env!("CARGO_BIN_EXE_localcluster"), "wait");
    let out = agent.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(&s.log_path).unwrap_or_default();
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("exit 0"), "{stdout} / log: {log}");
    assert_eq!(log, "via-localcluster agent-spawned\n");
}

fn cleanup_host_removes_everything_but_volumes() {
    let c = TestCluster::new();
    let st = c.state.clone();
    let a = c.sandbox("clean-a", 10);
    let b = c.sandbox("clean-b", 11);
    // A host mount in a pod dir (as an emptyDir on tmpfs would be), and a "volume" mount.
    let pod_mount = a.dir.join("tmpvol");
    let vol_mount = st.node_dir("node-a").join("volumes").join("pv-1");
    for (p, name) in [(&pod_mount, "sm-test-pod"), (&vol_mount, "sm-test-vol")] {
        std::fs::create_dir_all(p).unwrap();
        nix::mount::mount(
            Some(name),
            p,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
    }
    let pids = rt().block_on(async {
        let one = spec(&a, "one", &["/bin/sleep", "300"]);
        let two = spec(&b, "two", &["/bin/sh", "-c", "sleep 301 & exec sleep 302"]);
        let c1 = runtime::spawn_container(&a, "one", &one).unwrap();
        let c2 = runtime::spawn_container(&b, "two", &two).unwrap();
        let pids = vec![c1.id().unwrap(), c2.id().unwrap()];
        // The background `sleep 301` is found through the namespace, not a pid file.
        let ns_ino = std::fs::metadata(format!("/run/netns/{}", b.netns)).unwrap();
        use std::os::unix::fs::MetadataExt;
        let mut in_b = Vec::new();
        wait_until("two processes in pod b", Duration::from_secs(5), || {
            in_b = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
                .filter(|p| {
                    std::fs::metadata(format!("/proc/{p}/ns/net"))
                        .is_ok_and(|m| (m.dev(), m.ino()) == (ns_ino.dev(), ns_ino.ino()))
                })
                .collect();
            in_b.len() >= 2
        });
        // Child handles are dropped without killing (kill_on_drop(false)).
        drop((c1, c2));
        pids.into_iter().chain(in_b).collect::<Vec<u32>>()
    });
    assert!(pids.iter().all(|p| pid_alive(*p)));

    let t = Instant::now();
    runtime::cleanup_host(&st).unwrap();
    println!("cleanup_host took {:?}", t.elapsed());
    for p in &pids {
        assert!(!pid_alive(*p), "pid {p} survived");
    }
    assert!(!netns_exists(&a.netns) && !netns_exists(&b.netns));
    assert!(!link_exists(&a.host_veth) && !link_exists(&b.host_veth));
    assert!(!link_exists(&st.bridge_name()));
    let dir = std::fs::canonicalize(&st.dir).unwrap();
    let left = mounts_under(&dir);
    assert_eq!(
        left,
        vec![std::fs::canonicalize(&vol_mount).unwrap()],
        "{left:?}"
    );
    // Idempotent.
    runtime::cleanup_host(&st).unwrap();
    nix::mount::umount2(&vol_mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

/// Debian's etcd, unmodified, as a 3-member cluster in three pods: peers find each other by the
/// pod hostnames of the per-pod hosts file; the host talks to every member at its pod IP.
fn etcd_cluster_across_three_pods() {
    if !e2e::testing::require::program("etcd across three pods", "/usr/bin/etcd") {
        return;
    }
    let c = TestCluster::new();
    let fqdn = |i: usize| format!("etcd-{i}.etcd.default.svc.cluster.local");
    let sandboxes: Vec<Sandbox> = (0..3)
        .map(|i| c.sandbox(&format!("etcd-{i}"), 20 + i as u8))
        .collect();
    let mut hosts = String::from("127.0.0.1 localhost\n");
    for (i, sb) in sandboxes.iter().enumerate() {
        hosts.push_str(&format!("{} {} etcd-{i}.etcd etcd-{i}\n", sb.ip, fqdn(i)));
    }
    let initial_cluster = (0..3)
        .map(|i| format!("etcd-{i}=http://{}:2380", fqdn(i)))
        .collect::<Vec<_>>()
        .join(",");
    rt().block_on(async {
        let mut children = Vec::new();
        let mut specs = Vec::new();
        for (i, sb) in sandboxes.iter().enumerate() {
            let data = sb.dir.join("volume");
            std::fs::create_dir_all(&data).unwrap();
            let hosts_file = sb.dir.join("hosts");
            std::fs::write(&hosts_file, &hosts).unwrap();
            let name = format!("etcd-{i}");
            let args = [
                "/usr/bin/etcd".to_string(),
                format!("--name={name}"),
                "--data-dir=/var/run/etcd/default.etcd".into(),
                "--listen-client-urls=http://0.0.0.0:2379".into(),
                format!("--advertise-client-urls=http://{}:2379", fqdn(i)),
                "--listen-peer-urls=http://0.0.0.0:2380".into(),
                format!("--initial-advertise-peer-urls=http://{}:2380", fqdn(i)),
                format!("--initial-cluster={initial_cluster}"),
                "--initial-cluster-state=new".into(),
                "--initial-cluster-token=runtime-test".into(),
            ];
            let mut s = spec(sb, "etcd", &[]);
            s.argv = args.to_vec();
            s.hostname = name;
            s.mounts = vec![
                MountSpec {
                    source: data,
                    target: PathBuf::from("/var/run/etcd"),
                    read_only: false,
                },
                MountSpec {
                    source: hosts_file,
                    target: PathBuf::from("/etc/hosts"),
                    read_only: false,
                },
            ];
            children.push(runtime::spawn_container(sb, "etcd", &s).unwrap());
            specs.push(s);
        }
        let t = Instant::now();
        let endpoints: Vec<String> = sandboxes
            .iter()
            .map(|sb| format!("http://{}:2379", sb.ip))
            .collect();
        // Every member, asked on its own endpoint, sees 3 members and a leader.
        let opts = || {
            etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(2))
        };
        let mut leaders = Vec::new();
        for ep in &endpoints {
            loop {
                let attempt = async {
                    let mut cl = etcd_client::Client::connect([ep.as_str()], Some(opts())).await?;
                    let members = cl.member_list().await?.members().len();
                    let status = cl.status().await?;
                    Ok::<_, etcd_client::Error>((members, status.leader()))
                };
                match attempt.await {
                    Ok((3, leader)) if leader != 0 => {
                        leaders.push(leader);
                        break;
                    }
                    other => {
                        assert!(
                            t.elapsed() < Duration::from_secs(60),
                            "{ep}: {other:?}; logs: {}",
                            specs
                                .iter()
                                .map(|s| std::fs::read_to_string(&s.log_path).unwrap_or_default())
                                .collect::<Vec<_>>()
                                .join("\n----\n")
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        println!("etcd: 3 members with a leader after {:?}", t.elapsed());
        assert!(leaders.iter().all(|l| *l == leaders[0]), "{leaders:?}");
        let mut first = etcd_client::Client::connect([endpoints[0].as_str()], Some(opts()))
            .await
            .unwrap();
        first
            .put("runtime-test", "written-via-etcd-0", None)
            .await
            .unwrap();
        let mut last = etcd_client::Client::connect([endpoints[2].as_str()], Some(opts()))
            .await
            .unwrap();
        let got = last.get("runtime-test", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"written-via-etcd-0");
        // An exec probe in a member (etcdctl inside the pod, on its loopback).
        if Path::new("/usr/bin/etcdctl").exists() {
            let out = runtime::exec_in_container(
                &sandboxes[1],
                &specs[1],
                &[
                    "/usr/bin/etcdctl".into(),
                    "--endpoints=http://127.0.0.1:2379".into(),
                    "endpoint".into(),
                    "health".into(),
                ],
                Duration::from_secs(10),
            )
            .await
            .unwrap();
            assert_eq!(out.exit_code, 0, "{}", text(&out));
        }
        // The data is in the volumes, on the host.
        for sb in &sandboxes {
            assert!(sb.dir.join("volume/default.etcd/member/wal").is_dir());
        }
        for child in &mut children {
            runtime::signal_container(child.id().unwrap(), Signal::SIGTERM).unwrap();
        }
        for child in &mut children {
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .unwrap()
                .unwrap();
            println!("etcd exited: {status}");
        }
    });
    for sb in &sandboxes {
        runtime::destroy_sandbox(sb).unwrap();
    }
}
