//! `localcluster`: a real local Kubernetes cluster (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and the node agent) for storage-migrator's e2e tests.
//!
//! - `localcluster up --state-dir DIR`: start it in the background; prints
//!   `export KUBECONFIG=DIR/kubeconfig` on stdout once it is usable (progress goes to stderr).
//! - `localcluster down --state-dir DIR`: stop it and check nothing is left.
//! - `localcluster node down|up --state-dir DIR NODE`: take a node down as a power loss would
//!   (its heartbeat stops and its conditions turn Unknown, its pods' processes are killed, and
//!   nothing of its pods is run, deleted or reported until it is up again), or bring it up.
//! - `localcluster image load --state-dir DIR [--name REF] ARCHIVE`: import an OCI archive into
//!   the image store the cluster's nodes run containers from (`DIR/images`, see `e2e::images`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use e2e::controlplane::{self, UpOptions};
use e2e::state::ClusterState;

#[derive(Parser)]
#[command(
    name = "localcluster",
    about = "Local Kubernetes cluster for storage-migrator's e2e tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster in the background and print `export KUBECONFIG=...` once it is usable.
    Up {
        /// State directory of the cluster (created if missing).
        #[arg(long)]
        state_dir: PathBuf,
        /// Start only the control plane: no node agent, no wait for nodes and StorageClasses.
        #[arg(long, hide = true)]
        no_agent: bool,
        /// Use the Kubernetes server binaries in this directory; skip install-deps.sh.
        #[arg(long, hide = true)]
        bin_dir: Option<PathBuf>,
    },
    /// Stop everything `up` started and check that nothing is left.
    Down {
        /// State directory of the cluster.
        #[arg(long)]
        state_dir: PathBuf,
    },
    /// Take a node down (power loss) or bring it up again.
    Node {
        #[command(subcommand)]
        command: NodeCmd,
    },
    /// The image store shared by the cluster's nodes (`DIR/images`).
    Image {
        #[command(subcommand)]
        command: ImageCmd,
    },
    /// Run the node agent in the foreground (started by `up`).
    #[command(hide = true)]
    Agent {
        #[arg(long)]
        state_dir: PathBuf,
    },
    /// Enter a pod's namespaces and exec a container (started by the agent).
    #[command(hide = true)]
    ContainerInit { spec: PathBuf },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Its heartbeat stops, its conditions turn Unknown, its pods' processes are killed and
    /// nothing of its pods is run, deleted or reported (a kubelet that lost power).
    Down {
        #[arg(long)]
        state_dir: PathBuf,
        /// node-a, node-b or node-c.
        node: String,
    },
    /// Heartbeats again (Ready) and starts the pods still bound to it, as after a reboot.
    Up {
        #[arg(long)]
        state_dir: PathBuf,
        node: String,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Import an OCI archive (a tar of an OCI image layout) into the store. Every blob is checked
    /// against its digest and size; a refused archive leaves the store unchanged.
    Load {
        /// State directory of the cluster.
        #[arg(long)]
        state_dir: PathBuf,
        /// Name the image by this reference instead of its index.json annotation
        /// (org.opencontainers.image.ref.name); only for an archive of one image.
        #[arg(long)]
        name: Option<String>,
        /// The OCI archive.
        archive: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // container-init calls setns/unshare, which need a single-threaded process: dispatch it
    // before any runtime, thread or logger exists.
    if let Cmd::ContainerInit { spec } = &cli.command {
        let err = e2e::agent::container_init(spec);
        eprintln!("localcluster container-init {}: {err}", spec.display());
        std::process::exit(127);
    }
    init_tracing();
    let result = match cli.command {
        Cmd::Up {
            state_dir,
            no_agent,
            bin_dir,
        } => cmd_up(&state_dir, no_agent, bin_dir),
        Cmd::Down { state_dir } => cmd_down(&state_dir),
        Cmd::Agent { state_dir } => cmd_agent(&state_dir),
        Cmd::Node {
            command: NodeCmd::Down { state_dir, node },
        } => cmd_node(&state_dir, &node, true),
        Cmd::Node {
            command: NodeCmd::Up { state_dir, node },
        } => cmd_node(&state_dir, &node, false),
        Cmd::Image {
            command:
                ImageCmd::Load {
                    state_dir,
                    name,
                    archive,
                },
        } => cmd_image_load(&state_dir, name.as_deref(), &archive),
        Cmd::ContainerInit { .. } => unreachable!("dispatched above"),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("localcluster: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Marks `node` down or up (the agent polls the marker every half second).
fn cmd_node(state_dir: &Path, node: &str, down: bool) -> anyhow::Result<ExitCode> {
    if !e2e::state::NODE_NAMES.contains(&node) {
        anyhow::bail!(
            "unknown node {node:?}: one of {}",
            e2e::state::NODE_NAMES.join(", ")
        );
    }
    ClusterState::load(state_dir)
        .with_context(|| format!("no cluster in {}", state_dir.display()))?;
    e2e::state::set_node_down(state_dir, node, down)
        .with_context(|| format!("cannot mark {node} {}", if down { "down" } else { "up" }))?;
    eprintln!("{node} is {}", if down { "down" } else { "up" });
    Ok(ExitCode::SUCCESS)
}

fn init_tracing() {
    // kube's client logs every failed request at ERROR; `up` polls endpoints that are expected
    // to fail until they are ready, and reports real failures itself. RUST_LOG overrides this.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

fn cmd_up(state_dir: &Path, no_agent: bool, bin_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    controlplane::preflight(state_dir)?;
    let t = Instant::now();
    let bin_dir = match bin_dir {
        Some(dir) => dir,
        None => {
            tracing::info!("installing dependencies ({})", controlplane::INSTALL_DEPS);
            controlplane::install_deps()?
        }
    };
    let deps = t.elapsed();
    let agent_exe = if no_agent {
        None
    } else {
        Some(std::env::current_exe().context("cannot locate the localcluster executable")?)
    };
    let opts = UpOptions {
        dir: state_dir.to_path_buf(),
        bin_dir,
        agent_exe,
    };
    let report = runtime()?.block_on(controlplane::up(&opts))?;
    let mut timings = vec![("deps", deps)];
    timings.extend(report.timings);
    if let Some(total) = timings.iter_mut().find(|(n, _)| *n == "total") {
        total.1 += deps;
    }
    eprintln!(
        "localcluster up: cluster {} ready; timings:",
        report.state.id
    );
    for (phase, d) in &timings {
        eprintln!("  {phase:<16} {:>6.1}s", d.as_secs_f64());
    }
    println!("export KUBECONFIG={}", report.state.kubeconfig().display());
    Ok(ExitCode::SUCCESS)
}

fn cmd_down(state_dir: &Path) -> anyhow::Result<ExitCode> {
    let report = controlplane::down(state_dir)?;
    if report.leftovers.is_empty() {
        eprintln!(
            "localcluster down: {} stopped, nothing left ({:.1}s)",
            state_dir.display(),
            report.elapsed.as_secs_f64()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "localcluster down: still present after {:.1}s:",
            report.elapsed.as_secs_f64()
        );
        for l in &report.leftovers {
            eprintln!("  {l}");
        }
        Ok(ExitCode::FAILURE)
    }
}

fn cmd_image_load(
    state_dir: &Path,
    name: Option<&str>,
    archive: &Path,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        state_dir.is_dir(),
        "state dir {} does not exist (start the cluster with `localcluster up --state-dir DIR`)",
        state_dir.display()
    );
    let t = Instant::now();
    let store = e2e::images::Store::new(e2e::images::store_dir(state_dir));
    let loaded = e2e::images::load_archive(&store, archive, name)
        .with_context(|| format!("image load {}: refused", archive.display()))?;
    for image in &loaded {
        let what = if image.already_present {
            "already present"
        } else {
            "loaded"
        };
        eprintln!("{what}: {} ({})", image.name, image.digest);
    }
    eprintln!(
        "localcluster image load: {} image(s) in {:.1}s",
        loaded.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_agent(state_dir: &Path) -> anyhow::Result<ExitCode> {
    let state = ClusterState::load(state_dir)?;
    let rt = runtime()?;
    let result = rt.block_on(e2e::agent::run(state));
    // Do not wait forever for blocking tasks the agent may have left.
    rt.shutdown_timeout(Duration::from_secs(5));
    result.context("node agent failed")?;
    Ok(ExitCode::SUCCESS)
}
