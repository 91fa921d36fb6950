//! Installing the Kubernetes server binaries (`scripts/install-deps.sh`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::controlplane::{
    APISERVER, CONTROLLER_MANAGER, ControlPlaneError, ETCD, INSTALL_DEPS, Result, SCHEDULER,
};

/// Runs `install-deps.sh` (progress passed through to our stderr) and returns the directory
/// holding kube-apiserver, kube-controller-manager, kube-scheduler and the control plane's etcd (its stdout's last line).
pub fn install_deps() -> Result<PathBuf> {
    let script = PathBuf::from(INSTALL_DEPS);
    let fail = |reason: String| ControlPlaneError::InstallDeps {
        script: script.clone(),
        reason,
    };
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!("{} (its progress is above)", out.status)));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bin_dir = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| fail("it printed no directory".into()))?;
    for b in [APISERVER, CONTROLLER_MANAGER, SCHEDULER, ETCD] {
        if !bin_dir.join(b).is_file() {
            return Err(fail(format!("{} has no {b}", bin_dir.display())));
        }
    }
    Ok(bin_dir)
}

#[cfg(test)]
mod tests {
    use crate::controlplane::KUBERNETES_VERSION;

    /// The version the nodes report is the one the script builds and the wrapper module pins.
    #[test]
    fn one_kubernetes_version_everywhere() {
        let script = include_str!("../../scripts/install-deps.sh");
        let pinned = format!("K8S_VERSION=\"{KUBERNETES_VERSION}\"");
        assert!(script.contains(&pinned), "install-deps.sh lacks {pinned}");
        let module = include_str!("../../kubernetes/go.mod");
        let required = format!("k8s.io/kubernetes {KUBERNETES_VERSION}");
        assert!(module.contains(&required), "go.mod lacks {required}");
    }
}
