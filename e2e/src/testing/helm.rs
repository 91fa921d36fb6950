//! The chart installed by real Helm (from `e2e/scripts/install-helm.sh`), and plain HTTP GETs of
//! the operator's endpoints on a pod IP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{TestError, unexpected};

/// The repository's chart.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/storage-migrator")
}

/// The Helm binary: `HELM` if set, else the one `install-helm.sh` installs (cached).
pub async fn helm_bin() -> Result<PathBuf, TestError> {
    if let Some(h) = std::env::var_os("HELM") {
        return Ok(PathBuf::from(h));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .await
        .map_err(|e| unexpected("install-helm.sh", e.to_string()))?;
    if !out.status.success() {
        return Err(unexpected(
            "install-helm.sh",
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(dir).join("helm"))
}

/// Runs `helm ARGS` against the cluster of `KUBECONFIG`; its stdout, or an error with stderr.
///
/// Helm runs with `HOME` in a directory beside the kubeconfig: its Kubernetes HTTP cache
/// (`~/.kube/cache`) is keyed by the API server's address, and a local cluster brought up
/// again on a port an earlier one used would otherwise be answered from the earlier one's cache
/// (its `/version` among others).
pub async fn helm(args: &[&str]) -> Result<String, TestError> {
    let bin = helm_bin().await?;
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .ok_or_else(|| unexpected("helm", "KUBECONFIG is not set"))?;
    let home = kubeconfig
        .parent()
        .map_or_else(|| PathBuf::from("helm-home"), |d| d.join("helm-home"));
    std::fs::create_dir_all(&home)
        .map_err(|e| unexpected(format!("create {}", home.display()), e.to_string()))?;
    let out = Command::new(&bin)
        .args(args)
        .env("HOME", &home)
        .output()
        .await
        .map_err(|e| unexpected(format!("helm {}", args.join(" ")), e.to_string()))?;
    if !out.status.success() {
        return Err(unexpected(
            format!("helm {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `GET path` on `host:port` over plain HTTP/1.0: the status code and the body.
pub async fn http_get(host: &str, port: u16, path: &str) -> Result<(u16, String), TestError> {
    let what = format!("GET http://{host}:{port}{path}");
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| unexpected(&what, "timed out"))?
        .map_err(|e| unexpected(&what, e.to_string()))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| unexpected(&what, format!("no status line in {head:?}")))?;
    Ok((code, body.to_string()))
}
