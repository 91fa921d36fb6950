//! The operator under test and its requests: `storage-migrator run --namespace NS` as a child
//! process of the test, running as a ServiceAccount under the chart's RBAC for NS (binary from `STORAGE_MIGRATOR_BIN`, default
//! `<workspace>/target/debug/storage-migrator`), the CRD, and creating / waiting for
//! `StorageMigrationRequest`s in a [`TestNamespace`].
//!
//! The operator's `--image` (env `STORAGE_MIGRATOR_IMAGE`, the default image of its Jobs) is
//! the tests' mover image ([`operator_image`]) unless the environment sets it.
//!
//! The operator's log goes to `<workspace>/target/e2e-logs/<namespace>-operator-<run>.log` and
//! is kept; when the test panics, its tail is printed. `OPERATOR_LOG` sets its `RUST_LOG`
//! (default `info,kube=warn`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
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
#[derive(Debug)]
pub struct Operator {
    child: Child,
    log: PathBuf,
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
        let log = workspace()
            .join("target/e2e-logs")
            .join(format!("{}-operator-{run}.log", ns.name));
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

    /// [`Operator::spawn`] with more flags for `run`.
    pub async fn spawn_with(
        bin: &Path,
        ns: &TestNamespace,
        log: PathBuf,
        failpoints: Option<&str>,
        flags: &[&str],
    ) -> Result<Operator, OperatorError> {
        let log_error = |source| OperatorError::Log {
            path: log.clone(),
            source,
        };
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(log_error)?;
        }
        let kubeconfig = log.with_extension("kubeconfig");
        rbac::operator_kubeconfig(ns, &kubeconfig).await?;
        let ns = ns.name.as_str();
        let out = std::fs::File::create(&log).map_err(log_error)?;
        let err = out.try_clone().map_err(log_error)?;
        let bin = bin.to_path_buf();
        let mut cmd = Command::new(&bin);
        // A stable lease identity per namespace: an operator restarted by a test (after a
        // failpoint exit, which releases nothing) takes the lease over at once, as a restarted
        // pod of the same name does; an ephemeral port for /metrics and the probes.
        let identity = format!("e2e-{ns}");
        cmd.args(["run", "--namespace", ns, "--http-address", "127.0.0.1:0"])
            .args(["--lease-identity", &identity])
            .args(flags)
            .env(
                "RUST_LOG",
                std::env::var("OPERATOR_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .env("STORAGE_MIGRATOR_IMAGE", operator_image())
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        if let Some(fp) = failpoints {
            cmd.env("FAILPOINTS", fp);
        }
        let child = cmd
            .spawn()
            .map_err(|source| OperatorError::Spawn { bin, source })?;
        info!(ns, ?failpoints, pid = ?child.id(), log = %log.display(), "operator started");
        Ok(Operator { child, log })
    }

    /// Waits `settle`, then fails with [`OperatorError::Exited`] if the process has exited
    /// already (a bad binary, flag or kubeconfig).
    pub async fn check_running(&mut self, settle: Duration) -> Result<(), OperatorError> {
        tokio::time::sleep(settle).await;
        match self.child.try_wait() {
            Ok(Some(status)) => Err(OperatorError::Exited {
                status: status.to_string(),
                log: self.log.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Stops the process: SIGTERM to its pid, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) {
        let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) else {
            return; // already reaped
        };
        let pid = nix::unistd::Pid::from_raw(pid);
        if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
            warn!(%pid, error = %e, "cannot signal the operator");
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => info!(%pid, %status, log = %self.log.display(), "operator stopped"),
            Ok(Err(e)) => warn!(%pid, error = %e, "cannot wait for the operator"),
            Err(_) => {
                warn!(%pid, "operator ignored SIGTERM; killing it");
                if let Err(e) = self.child.kill().await {
                    warn!(%pid, error = %e, "cannot kill the operator");
                }
            }
        }
    }

    /// The file the operator logs to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits until the process exits by itself (e.g. at a failpoint); its exit code (-1 when
    /// killed by a signal).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<i32, OperatorError> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
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
        let _ = self.child.start_kill();
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
                m.pod, m.step, m.downtime_seconds, m.bytes_copied
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
