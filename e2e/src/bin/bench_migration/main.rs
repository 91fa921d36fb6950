//! `bench-migration`: per-member downtime of a StorageClassChange with and without pre-copy.
//!
//! Against the cluster `KUBECONFIG` points at, for each data size (`--sizes`, default
//! `64Mi,1Gi`) and each mode (`copy.preCopy` true / false), in a fresh namespace:
//!
//! 1. a Generic StatefulSet of `--replicas` members (default 3) (`busybox`, a writer appending a line to its volume every
//!    100 ms and, once filled, overwriting the next 4 KiB of its first 64 MiB file in place, as a
//!    database writes a WAL segment; ready once `/data/ready` exists) with its claims on the Immediate class
//!    (`E2E_STORAGE_CLASS`, default `standard`), sized data + 50% (at least 256Mi);
//! 2. each member's volume filled with that many bytes of incompressible data (64 MiB files from
//!    `/dev/urandom`) by a one-off pod pinned to the member's node, which then writes the
//!    readiness file;
//! 3. a plain restart: the last member's pod deleted under its StatefulSet, and the time until a
//!    client sees it Ready again (the floor each member's downtime is compared with);
//! 4. the operator (`storage-migrator run --namespace NS`, started and stopped through the shared
//!    harness `e2e::testing::operator`, which also installs the CRD) migrates the set to the WaitForFirstConsumer class (`E2E_WFFC_STORAGE_CLASS`,
//!    default `fast`), engine Generic, timeout 30m;
//! 5. the request's `status.members[].downtimeSeconds`, `bytesCopied`, `bytesWritten` and its
//!    `startTime`→`completionTime` are read, and a pod watcher measures each member's
//!    unavailability as a client sees it (from the first event showing the pod deleted or not
//!    Ready to the first showing it Ready again);
//! 6. where each member's downtime went after its pod stopped, from the operator's Events
//!    (microsecond `eventTime`): the final copy with its verification (`PodStopped` →
//!    `Verified`), the claim swap (→ `ClaimSwapped`, issue 10's target 5) and the member back
//!    (→ `MemberMigrated`: Ready and through its gate);
//! 7. what the operator cost: its peak resident memory (`VmHWM`, read before it is stopped) and
//!    its API requests, from the API server's audit log (the local cluster's `audit.log` beside
//!    `KUBECONFIG`), in total and per member.
//!
//! With `--workloads copy`, first, issue 10's target 6 on this machine (no cluster needed, root):
//! the pre-copy's script against `cp -a` on two loop-mounted ext4 volumes, `--copy-runs` times
//! per tool and data set ([`e2e::copy_speed`], as `bench-copy`). So `--workloads
//! copy,generic,etcd` prints every number of issue 10 in one run.
//!
//! With `--workloads etcd` (or `generic,etcd`), for each `--etcd-members` count (default 3 and
//! 5): an etcd set of that many members (the e2e fixture) on the Immediate class, a client
//! writing through every Ready member about every 20 ms from 2 s before the request to 2 s after
//! it, and one migration with pre-copy and engine `Etcd`; its table gives the longest gap between
//! two acknowledged writes (issue 10's target 8), the writes retried and failed, and each
//! member's recorded downtime.
//!
//! With `--unrelated N` (issue 30, item 2): first N Pending pods and N Pending claims in
//! `--unrelated-namespaces` other namespaces, which every scenario's operator watches too
//! (`unrelated.rs`); compare a run with and one without.
//!
//! With `--workloads idle`: an operator holding `--idle-requests` finished requests (default
//! 100), and the API requests it makes in `--idle-minutes` (default 5) while nothing changes,
//! by verb, with its resident memory (`idle.rs`).
//!
//! Prints a Markdown table on stdout (progress goes to stderr) and deletes the namespaces
//! (`--keep` keeps them).
//!
//! ```sh
//! export KUBECONFIG=/tmp/sm-bench/kubeconfig
//! bench-migration --operator-bin target/debug/storage-migrator --sizes 64Mi,1Gi --modes both
//! ```

mod availability;
mod cli;
mod etcd;
mod frugal;
mod idle;
mod output;
mod phases;
mod scenario;
mod unrelated;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use e2e::testing::operator::{OperatorError, install_crd_cluster_wide};
use e2e::testing::{TestCluster, TestError};
use tracing::{info, warn};

use crate::cli::{Cli, Workload};
use crate::output::{ScenarioResult, etcd_table, tables};
use crate::scenario::{Settings, run_scenario};

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Test(#[from] TestError),
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Operator(#[from] OperatorError),
    #[error(
        "operator binary {path} is not usable: {detail} (build it with `cargo build --bins`, or pass --operator-bin / STORAGE_MIGRATOR_BIN)"
    )]
    OperatorBin { path: PathBuf, detail: String },
    #[error("cannot create {path}: {source}")]
    LogFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("fill pod {pod} on {node} did not succeed (phase {phase}, exit {exit:?}): {output}")]
    Fill {
        pod: String,
        node: String,
        phase: String,
        exit: Option<i32>,
        output: String,
    },
    #[error(
        "pod {namespace}/{pod}, deleted under its StatefulSet, was not Ready again within {waited:?}"
    )]
    PlainRestart {
        namespace: String,
        pod: String,
        waited: std::time::Duration,
    },
    #[error("cannot read the API server's audit log {path}: {source}")]
    Audit {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("a manifest of the benchmark does not parse: {0}")]
    Manifest(#[from] serde_json::Error),
    #[error("request {namespace}/{name} ended {phase}: {detail}")]
    NotSuccessful {
        namespace: String,
        name: String,
        phase: String,
        detail: String,
    },
}

fn check_operator_bin(path: &Path) -> Result<(), BenchError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| BenchError::OperatorBin {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(BenchError::OperatorBin {
            path: path.to_path_buf(),
            detail: "not an executable file".into(),
        });
    }
    Ok(())
}

/// The settings of every scenario: the operator binary (checked) and the log dir (created).
fn settings(cli: &Cli) -> Result<Settings, BenchError> {
    let operator_bin = match &cli.operator_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("storage-migrator")))
            .unwrap_or_else(|| PathBuf::from("storage-migrator")),
    };
    check_operator_bin(&operator_bin)?;
    let log_dir = cli
        .log_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("bench-migration"));
    std::fs::create_dir_all(&log_dir).map_err(|source| BenchError::LogFile {
        path: log_dir.clone(),
        source,
    })?;
    Ok(Settings {
        operator_bin,
        log_dir,
        keep: cli.keep,
        replicas: cli.replicas,
        first_pass_tool: cli.first_pass_tool.spec_value(),
        unrelated: Vec::new(),
        cluster_wide: cli.cluster_wide,
        operator_args: cli.operator_args.clone(),
    })
}

/// Runs one scenario and logs how it went.
async fn scenario(
    cluster: &TestCluster,
    settings: &Settings,
    size: &cli::DataSize,
    pre_copy: bool,
) -> ScenarioResult {
    let started = Instant::now();
    let result = run_scenario(cluster, settings, size, pre_copy).await;
    match &result {
        Ok(row) => {
            info!(size = %size.label, pre_copy, took = ?started.elapsed(), ?row, "scenario done")
        }
        Err(e) => warn!(size = %size.label, pre_copy, error = %e, "scenario failed"),
    }
    (
        size.label.clone(),
        pre_copy,
        result.map_err(|e| e.to_string()),
    )
}

/// `--workloads copy`: the copy speed tables, or why there are none. Runs on a blocking thread
/// (minutes of `cp` and rsync).
async fn copy_speed(cli: &Cli) -> Result<(), String> {
    let options = e2e::copy_speed::Options {
        dir: cli.copy_dir.clone(),
        runs: usize::from(cli.copy_runs),
        volume_gib: 3,
    };
    let tables = tokio::task::spawn_blocking(move || e2e::copy_speed::bench(&options))
        .await
        .map_err(|e| format!("the copy benchmark stopped: {e}"))?
        .map_err(|e| e.to_string())?;
    print!("{tables}");
    Ok(())
}

async fn run(cli: Cli) -> Result<bool, BenchError> {
    let copied = if cli.workloads.contains(&Workload::Copy) {
        let outcome = copy_speed(&cli).await;
        if let Err(e) = &outcome {
            warn!(error = %e, "copy speed benchmark failed");
            println!("\ncopy speed: failed: {e}");
        }
        println!();
        outcome.is_ok()
    } else {
        true
    };
    if !cli.workloads.iter().any(|w| *w != Workload::Copy) {
        return Ok(copied);
    }
    let mut settings = settings(&cli)?;
    let cluster = TestCluster::from_env().await?;
    install_crd_cluster_wide(&cluster.client).await?;
    if cli.unrelated > 0 {
        let n = cli.unrelated;
        settings.unrelated =
            unrelated::create(&cluster, n, cli.unrelated_namespaces.into()).await?;
        println!(
            "Unrelated: {n} Pending pods and {n} Pending claims in {} namespaces, all watched by \
             each scenario's operator ({}).\n",
            settings.unrelated.len(),
            match settings.cluster_wide {
                true => "it watches every namespace",
                false => "--namespace each",
            }
        );
    }
    info!(
        operator = %settings.operator_bin.display(),
        from = %cluster.storage_class,
        to = %cluster.wffc_storage_class,
        "benchmark starting"
    );
    let mut results = Vec::new();
    if cli.workloads.contains(&Workload::Generic) {
        for size in &cli.sizes {
            for &pre_copy in cli.modes.pre_copy_values() {
                results.push(scenario(&cluster, &settings, size, pre_copy).await);
            }
        }
        print!("{}", tables(&results));
    }
    let mut etcd_results = Vec::new();
    if cli.workloads.contains(&Workload::Etcd) {
        for &n in &cli.etcd_members {
            let n = usize::from(n);
            let result = etcd::run_etcd_scenario(&cluster, &settings, n).await;
            match &result {
                Ok(row) => info!(members = n, ?row, "etcd scenario done"),
                Err(e) => warn!(members = n, error = %e, "etcd scenario failed"),
            }
            etcd_results.push((n, result.map_err(|e| e.to_string())));
        }
        if !results.is_empty() {
            println!();
        }
        print!("{}", etcd_table(&etcd_results));
    }
    let idle_ok = match cli.workloads.contains(&Workload::Idle) {
        false => true,
        true => {
            let window = std::time::Duration::from_secs(u64::from(cli.idle_minutes) * 60);
            let idle = idle::run_idle(&cluster, &settings, cli.idle_requests.into(), window).await;
            println!();
            match idle {
                Ok(row) => {
                    print!("{}", idle::idle_table(&row));
                    true
                }
                Err(e) => {
                    warn!(error = %e, "idle scenario failed");
                    println!("idle operator: failed: {e}");
                    false
                }
            }
        }
    };
    Ok(copied
        && idle_ok
        && results.iter().all(|(_, _, r)| r.is_ok())
        && etcd_results.iter().all(|(_, r)| r.is_ok()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube=warn,zookeeper_client=warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-migration: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench-migration: some scenarios failed (see the table)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench-migration: {e}");
            ExitCode::FAILURE
        }
    }
}
