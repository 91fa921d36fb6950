//! The operator under test and its requests: `storage-migrator run --namespace NS` as a child
//! process of the test, running as a ServiceAccount under the chart's RBAC for NS (binary from `STORAGE_MIGRATOR_BIN`, default
//! `<workspace>/target/debug/storage-migrator`), the CRD, and creating / waiting for
//! `StorageMigrationRequest`s in a [`TestNamespace`].
//!
//! The operator's `--image` (env `STORAGE_MIGRATOR_IMAGE`, the default image of its Jobs) is
//! the tests' mover image ([`operator_image`]) unless the environment sets it.
//!
//! Started without failpoints, the operator is restarted when it exits by itself, as the kubelet
//! restarts the Deployment's pod (it exits when a Lease renewal does not land in time); with
//! failpoints the test awaits its exit instead.
//!
//! The operator's log goes to `<workspace>/target/e2e-logs/<namespace>-operator-<run>.log` and
//! is kept; when the test panics, its tail is printed. `OPERATOR_LOG` sets its `RUST_LOG`
//! (default `info,kube=warn,zookeeper_client=warn`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use storage_migrator::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use tokio::process::{Child, Command};
use tracing::{info, warn};

use super::{DEFAULT_MOVER_IMAGE, FIELD_MANAGER, TestError, TestNamespace, rbac};

/// The CRD of `StorageMigrationRequest`, as the repository ships it.
pub const CRD: &str = include_str!("../../../crds/storagemigrationrequests.yaml");

/// How long [`install_crd`] waits for the API to serve the kind.
const CRD_SERVED: Duration = Duration::from_secs(30);

/// How many lines of the operator's log are printed when the test panics.
const LOG_TAIL: usize = 60;

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("cannot write the operator log {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot start the operator {bin}: {source} (`cargo build --all-features --bins` or set \
         STORAGE_MIGRATOR_BIN)"
    )]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("waiting for the operator (log {log}): {source}")]
    Wait {
        log: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the operator was started without failpoints: it is restarted when it exits, not awaited; \
         log {log}"
    )]
    Supervised { log: PathBuf },
    #[error("the operator did not exit within {timeout:?}; log {log}")]
    NoExit { timeout: Duration, log: PathBuf },
    #[error("the operator exited at start ({status}); log {log}")]
    Exited { status: String, log: PathBuf },
    #[error("the {what} is not served after {waited:?}: {source}")]
    NotServed {
        what: &'static str,
        waited: Duration,
        source: kube::Error,
    },
    #[error("cannot read the CRD manifest: {0}")]
    CrdManifest(#[source] serde_norway::Error),
    #[error("cannot apply the CRD: {0}")]
    CrdApply(#[source] kube::Error),
    #[error("request {name} is gone")]
    Gone { name: String },
    #[error("cannot encode request {name}: {source}")]
    Encode {
        name: String,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Test(#[from] TestError),
}

/// The operator binary: `STORAGE_MIGRATOR_BIN`, default `<workspace>/target/debug/storage-migrator`.
pub fn operator_bin() -> PathBuf {
    std::env::var_os("STORAGE_MIGRATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/debug/storage-migrator"))
}

/// The operator's `--image` in the tests: `STORAGE_MIGRATOR_IMAGE` if set, else the tests' mover
/// image (`E2E_MOVER_IMAGE`, default [`DEFAULT_MOVER_IMAGE`]: the project's image, from the
/// local cluster's image store).
pub fn operator_image() -> String {
    ["STORAGE_MIGRATOR_IMAGE", "E2E_MOVER_IMAGE"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| DEFAULT_MOVER_IMAGE.to_string())
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One operator process watching one namespace; killed when dropped.
///
/// Started without failpoints it is supervised as a Deployment's pod is: when it exits by
/// itself (it does when a renewal of its Lease does not land in time, which a loaded 2-core
/// machine can cause), it is started again after [`RESTART_DELAY`], appending to the same log.
/// With failpoints it is not: the test waits for its exit ([`Operator::wait_exit`]).
#[derive(Debug)]
pub struct Operator {
    log: PathBuf,
    process: Process,
}

#[derive(Debug)]
enum Process {
    /// The one process; the test waits for its exit.
    Direct(Child),
    /// Restarted when it exits, until `stop` is set; `pid` is the current process's.
    Supervised {
        stop: Arc<AtomicBool>,
        pid: Arc<AtomicI32>,
        restarts: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl Process {
    /// A supervised operator: no restart from now on, and `sig` to its current process.
    fn halt(&self, sig: nix::sys::signal::Signal) {
        if let Process::Supervised { stop, pid, .. } = self {
            stop.store(true, Ordering::SeqCst);
            signal(pid.load(Ordering::SeqCst), sig);
        }
    }
}

/// How long a supervised operator that exited waits before it is started again.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);

/// What an operator watches besides its own namespace.
#[derive(Clone, Copy)]
enum Watching<'a> {
    /// These namespaces too (`--namespace` each, the chart's Roles in each).
    These(&'a [&'a TestNamespace]),
    /// Every namespace (no `--namespace`, the chart's ClusterRole).
    All,
}

/// Whether the harness restarts the operator when it exits.
#[derive(Clone, Copy)]
enum Supervision<'a> {
    /// Restarted when it exits, as the kubelet restarts the Deployment's pod.
    Restarted,
    /// One process the test waits for or kills, with these failpoints if any.
    Once(Option<&'a str>),
}

/// Everything needed to start the operator process again.
#[derive(Debug, Clone)]
struct Launch {
    bin: PathBuf,
    ns: String,
    /// Watch every namespace (no `--namespace`; the Lease in `ns`).
    all_namespaces: bool,
    kubeconfig: PathBuf,
    log: PathBuf,
    failpoints: Option<String>,
    flags: Vec<String>,
}

impl Launch {
    /// Starts `bin run --namespace NS ...`, appending its output to the log.
    fn spawn(&self) -> Result<Child, OperatorError> {
        let log_error = |source| OperatorError::Log {
            path: self.log.clone(),
            source,
        };
        let out = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.log)
            .map_err(log_error)?;
        let err = out.try_clone().map_err(log_error)?;
        let mut cmd = Command::new(&self.bin);
        // A stable lease identity per namespace (unless the flags name one): an operator
        // restarted by a test (after a failpoint exit, which releases nothing) takes the lease
        // over at once, as a restarted pod of the same name does; an ephemeral port for
        // /metrics and the probes.
        let identity = format!("e2e-{}", self.ns);
        let named = self.flags.iter().any(|f| f.starts_with("--lease-identity"));
        let scope = match self.all_namespaces {
            true => "--lease-namespace",
            false => "--namespace",
        };
        cmd.args(["run", scope, &self.ns, "--http-address", "127.0.0.1:0"]);
        if !named {
            cmd.args(["--lease-identity", &identity]);
        }
        cmd.args(&self.flags)
            .env(
                "RUST_LOG",
                std::env::var("OPERATOR_LOG")
                    .unwrap_or_else(|_| "info,kube=warn,zookeeper_client=warn".into()),
            )
            .env("STORAGE_MIGRATOR_IMAGE", operator_image())
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        if let Some(fp) = &self.failpoints {
            cmd.env("FAILPOINTS", fp);
        }
        let child = cmd.spawn().map_err(|source| OperatorError::Spawn {
            bin: self.bin.clone(),
            source,
        })?;
        info!(ns = self.ns, failpoints = ?self.failpoints, pid = ?child.id(), log = %self.log.display(), "operator started");
        Ok(child)
    }
}

/// Waits for `child`; starts the operator again whenever it exits, until `stop`.
async fn supervise(
    launch: Launch,
    mut child: Child,
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicI32>,
    restarts: Arc<AtomicUsize>,
) {
    loop {
        let status = child.wait().await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        warn!(?status, log = %launch.log.display(), "operator exited by itself; starting it again, as the kubelet restarts a pod");
        restarts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(RESTART_DELAY).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match launch.spawn() {
            Ok(c) => {
                pid.store(
                    c.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0),
                    Ordering::SeqCst,
                );
                child = c;
            }
            Err(e) => {
                warn!(error = %e, "cannot start the operator again");
                return;
            }
        }
    }
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    if pid > 0
        && let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
    {
        warn!(pid, error = %e, "cannot signal the operator");
    }
}

/// The log of the operator of `ns` started for the `run`th time in a test.
pub fn log_path(ns: &TestNamespace, run: usize) -> PathBuf {
    workspace()
        .join("target/e2e-logs")
        .join(format!("{}-operator-{run}.log", ns.name))
}

impl Operator {
    /// Starts `storage-migrator run --namespace NS`; `run` numbers the log file of each
    /// (re)start in a test; `failpoints` becomes the process's `FAILPOINTS` (never inherited).
    pub async fn start(
        ns: &TestNamespace,
        run: usize,
        failpoints: Option<&str>,
    ) -> Result<Operator, OperatorError> {
        Self::start_with(ns, run, failpoints, &[]).await
    }

    /// [`Operator::start`] with more flags for `run` (e.g. `--allow-request-mover-image`).
    pub async fn start_with(
        ns: &TestNamespace,
        run: usize,
        failpoints: Option<&str>,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        let log = log_path(ns, run);
        Self::spawn_with(&operator_bin(), ns, log, failpoints, flags).await
    }

    /// Starts `bin run --namespace NS` as the namespace's operator ServiceAccount, under the
    /// chart's RBAC for that namespace ([`rbac::operator_kubeconfig`]), logging to `log` (its
    /// directory is created); `failpoints` becomes the process's `FAILPOINTS` (never inherited).
    pub async fn spawn(
        bin: &Path,
        ns: &TestNamespace,
        log: PathBuf,
        failpoints: Option<&str>,
    ) -> Result<Operator, OperatorError> {
        Self::spawn_with(bin, ns, log, failpoints, &[]).await
    }

    /// [`Operator::start_with`] for an operator that also watches `others` (`--namespace` each,
    /// under the chart's Roles in every one), without failpoints.
    pub async fn start_watching(
        ns: &TestNamespace,
        others: &[&TestNamespace],
        run: usize,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        let log = log_path(ns, run);
        Self::spawn_watching_with(&operator_bin(), ns, others, log, flags).await
    }

    /// [`Operator::spawn`] of an operator watching every namespace, under the chart's
    /// cluster-wide RBAC; its Lease in `ns`.
    pub async fn spawn_cluster_wide(
        bin: &Path,
        ns: &TestNamespace,
        log: PathBuf,
    ) -> Result<Operator, OperatorError> {
        Self::spawn_cluster_wide_with(bin, ns, log, &[]).await
    }

    /// [`Operator::spawn_cluster_wide`] with more flags for `run`.
    pub async fn spawn_cluster_wide_with(
        bin: &Path,
        ns: &TestNamespace,
        log: PathBuf,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        Self::spawn_inner(bin, ns, Watching::All, log, Supervision::Restarted, flags).await
    }

    /// [`Operator::spawn`] of an operator that also watches `others` (none: as `spawn`).
    pub async fn spawn_watching(
        bin: &Path,
        ns: &TestNamespace,
        others: &[&TestNamespace],
        log: PathBuf,
    ) -> Result<Operator, OperatorError> {
        Self::spawn_watching_with(bin, ns, others, log, &[]).await
    }

    /// [`Operator::spawn_watching`] with more flags for `run`.
    pub async fn spawn_watching_with(
        bin: &Path,
        ns: &TestNamespace,
        others: &[&TestNamespace],
        log: PathBuf,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        if others.is_empty() {
            return Self::spawn_inner(
                bin,
                ns,
                Watching::These(&[]),
                log,
                Supervision::Restarted,
                flags,
            )
            .await;
        }
        // The Lease in the first namespace, as a chart install puts it in its own (with more
        // than one watched namespace the operator has no other to default to).
        let mut all: Vec<&str> = vec!["--lease-namespace", ns.name.as_str()];
        all.extend(flags);
        for o in others {
            all.extend(["--namespace", o.name.as_str()]);
        }
        Self::spawn_inner(
            bin,
            ns,
            Watching::These(others),
            log,
            Supervision::Restarted,
            &all,
        )
        .await
    }

    /// [`Operator::spawn`] with more flags for `run`. Supervised (restarted on exit) unless
    /// `failpoints` is set.
    pub async fn spawn_with(
        bin: &Path,
        ns: &TestNamespace,
        log: PathBuf,
        failpoints: Option<&str>,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        let how = match failpoints {
            Some(fp) => Supervision::Once(Some(fp)),
            None => Supervision::Restarted,
        };
        Self::spawn_inner(bin, ns, Watching::These(&[]), log, how, flags).await
    }

    /// [`Operator::spawn_with`] without failpoints and not restarted when it exits: for a test
    /// that kills it and looks at what follows (another replica, say; `flags` may name its
    /// `--lease-identity`).
    pub async fn spawn_unsupervised(
        bin: &Path,
        ns: &TestNamespace,
        log: PathBuf,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        let how = Supervision::Once(None);
        Self::spawn_inner(bin, ns, Watching::These(&[]), log, how, flags).await
    }

    async fn spawn_inner(
        bin: &Path,
        ns: &TestNamespace,
        watching: Watching<'_>,
        log: PathBuf,
        how: Supervision<'_>,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        let log_error = |source| OperatorError::Log {
            path: log.clone(),
            source,
        };
        let failpoints = match how {
            Supervision::Once(fp) => fp,
            Supervision::Restarted => None,
        };
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(log_error)?;
        }
        std::fs::File::create(&log).map_err(log_error)?;
        let kubeconfig = log.with_extension("kubeconfig");
        let all_namespaces = matches!(watching, Watching::All);
        match watching {
            Watching::All => rbac::operator_kubeconfig_cluster_wide(ns, &kubeconfig).await?,
            Watching::These(others) => {
                rbac::operator_kubeconfig_watching(ns, others, &kubeconfig).await?
            }
        }
        let launch = Launch {
            bin: bin.to_path_buf(),
            ns: ns.name.clone(),
            all_namespaces,
            kubeconfig,
            log: log.clone(),
            failpoints: failpoints.map(str::to_string),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        };
        let child = launch.spawn()?;
        if let Supervision::Once(_) = how {
            return Ok(Operator {
                log,
                process: Process::Direct(child),
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicI32::new(
            child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0),
        ));
        let restarts = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(supervise(
            launch,
            child,
            stop.clone(),
            pid.clone(),
            restarts.clone(),
        ));
        Ok(Operator {
            log,
            process: Process::Supervised {
                stop,
                pid,
                restarts,
                task,
            },
        })
    }

    /// Waits `settle`, then fails with [`OperatorError::Exited`] if the process has exited
    /// already (a bad binary, flag or kubeconfig; a supervised one that had to be restarted).
    pub async fn check_running(&mut self, settle: Duration) -> Result<(), OperatorError> {
        tokio::time::sleep(settle).await;
        let exited = match &mut self.process {
            Process::Direct(child) => match child.try_wait() {
                Ok(Some(status)) => Some(status.to_string()),
                _ => None,
            },
            Process::Supervised { restarts, task, .. } => {
                let n = restarts.load(Ordering::SeqCst);
                (n > 0 || task.is_finished()).then(|| format!("exited and restarted {n} time(s)"))
            }
        };
        match exited {
            Some(status) => Err(OperatorError::Exited {
                status,
                log: self.log.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The running process's pid (`None` once a direct child has been reaped).
    pub fn pid(&self) -> Option<u32> {
        match &self.process {
            Process::Direct(child) => child.id(),
            Process::Supervised { pid, .. } => u32::try_from(pid.load(Ordering::SeqCst)).ok(),
        }
    }

    /// The process's peak resident memory so far (`VmHWM` of `/proc/<pid>/status`), in bytes.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status_kib(&status, "VmHWM:")
    }

    /// The operator's resident memory now (`VmRSS`), while it runs.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status_kib(&status, "VmRSS:")
    }

    /// How many times a supervised operator exited by itself and was started again.
    pub fn restarts(&self) -> usize {
        match &self.process {
            Process::Direct(_) => 0,
            Process::Supervised { restarts, .. } => restarts.load(Ordering::SeqCst),
        }
    }

    /// Stops the process: SIGTERM to its pid, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) {
        match &mut self.process {
            Process::Direct(child) => {
                let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
                    return; // already reaped
                };
                signal(pid, nix::sys::signal::Signal::SIGTERM);
                match tokio::time::timeout(grace, child.wait()).await {
                    Ok(Ok(status)) => {
                        info!(pid, %status, log = %self.log.display(), "operator stopped")
                    }
                    Ok(Err(e)) => warn!(pid, error = %e, "cannot wait for the operator"),
                    Err(_) => {
                        warn!(pid, "operator ignored SIGTERM; killing it");
                        if let Err(e) = child.kill().await {
                            warn!(pid, error = %e, "cannot kill the operator");
                        }
                    }
                }
            }
            Process::Supervised { .. } => {
                self.process.halt(nix::sys::signal::Signal::SIGTERM);
                let Process::Supervised { task, .. } = &mut self.process else {
                    return;
                };
                if tokio::time::timeout(grace, &mut *task).await.is_err() {
                    warn!("operator ignored SIGTERM; killing it");
                    task.abort(); // drops the child: SIGKILL (kill_on_drop)
                }
                info!(log = %self.log.display(), "operator stopped");
            }
        }
    }

    /// The file the operator logs to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Where the process serves `/healthz`, `/readyz` and `/metrics` (it binds an ephemeral
    /// port and logs it at start): the last `serving ... address=` line of its log, waited for
    /// up to `timeout`.
    pub async fn http_address(&self, timeout: Duration) -> Result<std::net::SocketAddr, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let found = (text.lines().rev())
                .filter(|l| l.contains("serving /healthz"))
                .find_map(|l| l.split("address=").nth(1)?.split_whitespace().next())
                .and_then(|a| a.parse().ok());
            if let Some(address) = found {
                return Ok(address);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no `serving /healthz` line with an address in {} after {timeout:?}",
                    self.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the process exits by itself (e.g. at a failpoint); its exit code (-1 when
    /// killed by a signal). Only for an operator started with failpoints: a supervised one is
    /// started again instead.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<i32, OperatorError> {
        let Process::Direct(child) = &mut self.process else {
            return Err(OperatorError::Supervised {
                log: self.log.clone(),
            });
        };
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => Ok(status.code().unwrap_or(-1)),
            Ok(Err(source)) => Err(OperatorError::Wait {
                log: self.log.clone(),
                source,
            }),
            Err(_) => Err(OperatorError::NoExit {
                timeout,
                log: self.log.clone(),
            }),
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        match &mut self.process {
            Process::Direct(child) => {
                let _ = child.start_kill();
            }
            Process::Supervised { .. } => {
                self.process.halt(nix::sys::signal::Signal::SIGKILL);
                if let Process::Supervised { task, .. } = &self.process {
                    task.abort();
                }
            }
        }
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n");
            eprintln!(
                "--- operator log tail (whole log kept: {}) ---\n{tail}",
                self.log.display()
            );
        }
    }
}

/// Applies [`CRD`] and waits until the API serves the kind in `ns`.
pub async fn install_crd(ns: &TestNamespace) -> Result<(), OperatorError> {
    ns.apply_yaml(CRD).await?;
    wait_served(ns.api()).await
}

/// Applies [`CRD`] (server-side, as [`FIELD_MANAGER`]) without a test namespace, and waits until
/// the API serves the kind in every namespace.
pub async fn install_crd_cluster_wide(client: &kube::Client) -> Result<(), OperatorError> {
    let crd: CustomResourceDefinition =
        serde_norway::from_str(CRD).map_err(OperatorError::CrdManifest)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&crd.name_any(), &params, &Patch::Apply(&crd))
        .await
        .map_err(OperatorError::CrdApply)?;
    wait_served(Api::all(client.clone())).await
}

/// Waits until listing requests through `api` succeeds (at most [`CRD_SERVED`]).
async fn wait_served(api: Api<StorageMigrationRequest>) -> Result<(), OperatorError> {
    let deadline = Instant::now() + CRD_SERVED;
    loop {
        match api.list(&ListParams::default()).await {
            Ok(_) => return Ok(()),
            Err(source) if Instant::now() >= deadline => {
                return Err(OperatorError::NotServed {
                    what: "StorageMigrationRequest kind",
                    waited: CRD_SERVED,
                    source,
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Creates (server-side apply) the request `name` with `spec` (the CRD's `spec`, as JSON).
pub async fn create_request(
    ns: &TestNamespace,
    name: &str,
    spec: serde_json::Value,
) -> Result<(), OperatorError> {
    let manifest = serde_json::to_string(&json!({
        "apiVersion": "storagemigrator.io/v1alpha1",
        "kind": "StorageMigrationRequest",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .map_err(|source| OperatorError::Encode {
        name: name.to_string(),
        source,
    })?;
    ns.apply_yaml(&manifest).await?;
    Ok(())
}

/// Waits until the request's phase is final (`Successful`, `Failed`, `Denied`); returns it.
pub async fn wait_final(
    ns: &TestNamespace,
    name: &str,
    timeout: Duration,
) -> Result<StorageMigrationRequest, OperatorError> {
    wait_status(ns, name, "request final", timeout, |s| s.phase.is_final()).await
}

/// Waits until the request has a status that satisfies `pred`; returns the request. On
/// timeout the error holds [`summary`] of its last state and its events.
pub async fn wait_status(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&StorageMigrationRequestStatus) -> bool + Send + 'static,
) -> Result<StorageMigrationRequest, OperatorError> {
    let api: Api<StorageMigrationRequest> = ns.api();
    let cond = move |r: Option<&StorageMigrationRequest>| {
        r.and_then(|r| r.status.as_ref()).is_some_and(&pred)
    };
    ns.wait_for(api, name, what, timeout, cond, summary)
        .await?
        .ok_or_else(|| OperatorError::Gone {
            name: name.to_string(),
        })
}

/// The reason and message of the request's `Accepted` condition (empty when it has none).
pub fn accepted_condition(req: &StorageMigrationRequest) -> (String, String) {
    let status = req.status.clone().unwrap_or_default();
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

/// The request's status on one line: phase, stage, message, failure, each member's step,
/// downtime and bytes copied, final hash.
pub fn summary(req: &StorageMigrationRequest) -> String {
    let s = req.status.clone().unwrap_or_default();
    let members: Vec<String> = s
        .members
        .iter()
        .map(|m| {
            format!(
                "{} {:?} downtime {:?}s copied {:?}B",
                m.pod, m.step, m.downtime_seconds, m.first_claim.bytes_copied
            )
        })
        .collect();
    format!(
        "phase {:?}, stage {:?}, message {:?}, failure {:?}, members [{}], finalHash {:?}",
        s.phase,
        s.stage,
        s.message,
        s.failure,
        members.join("; "),
        s.final_hash
    )
}
/// `VmHWM` of a `/proc/<pid>/status` text (kB there), in bytes.
/// The `field` (`VmHWM:`, `VmRSS:`) of a `/proc/PID/status`, in bytes.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Pod names of a request's members in the order the operator migrated them (its status as
/// JSON).
pub fn member_order(status: &serde_json::Value) -> Vec<String> {
    (status["members"].as_array().into_iter().flatten())
        .filter_map(|m| m["pod"].as_str().map(str::to_string))
        .collect()
}

/// Each member's downtime from a request's status as JSON, as `pod Ns`.
pub fn member_downtimes(status: &serde_json::Value) -> Vec<String> {
    (status["members"].as_array().into_iter().flatten())
        .map(|m| {
            format!(
                "{} {}s",
                m["pod"].as_str().unwrap_or("?"),
                m["downtimeSeconds"]
            )
        })
        .collect()
}

/// The old leader's member (the last migrated) records the handover the operator asked for:
/// from it, to `to` (the member leading afterwards), and its length. Panics with the status
/// otherwise; returns the length in seconds.
pub fn handover_on_record(status: &serde_json::Value, from: &str, to: &str) -> f64 {
    let last = (status["members"].as_array())
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    let change = &last["leaderChange"];
    assert_eq!(
        (&change["how"], &change["from"], &change["to"]),
        (&"Handover".into(), &from.into(), &to.into()),
        "the handover on record: {change}"
    );
    let seconds = change["seconds"].as_f64();
    assert!(
        seconds.is_some_and(|s| s >= 0.0),
        "its length on record: {change}"
    );
    let others = (status["members"].as_array().into_iter().flatten())
        .filter(|m| !m["leaderChange"].is_null())
        .count();
    assert_eq!(others, 1, "only the leader's member changes leadership");
    seconds.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_is_read_from_vm_hwm() {
        let status = "Name:\tstorage-migrator\nVmPeak:\t  900000 kB\nVmHWM:\t   23456 kB\nVmRSS:\t   20000 kB\n";
        assert_eq!(status_kib(status, "VmHWM:"), Some(23456 * 1024));
        assert_eq!(status_kib(status, "VmRSS:"), Some(20000 * 1024));
        assert_eq!(status_kib("Name:\tx\n", "VmHWM:"), None);
        // This very process has one.
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(status_kib(&own, "VmHWM:").is_some_and(|b| b > 0));
    }
}
