//! The operator under the chart's RBAC: every operator a test starts runs as a ServiceAccount
//! of its namespace, bound to exactly the Roles the chart renders for `watchNamespaces: [ns]`
//! (real `helm template`), with a token from the TokenRequest API. A rule the code needs and the
//! chart lacks fails the scenario; the audit log ([`audit_log`]) shows which rules were used.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;

use super::helm::{chart_dir, helm};
use super::{TestError, TestNamespace, unexpected};
use crate::controlplane::write_private;

/// Suffix of the operator's ServiceAccount name, in the tests (`<ns>-storage-migrator`) as in a
/// chart install (`<release>-storage-migrator`): the audit check finds the operator by it.
pub const SERVICE_ACCOUNT_SUFFIX: &str = "storage-migrator";

/// How long the operator's token is valid (the longest test runs minutes).
const TOKEN_SECONDS: i64 = 4 * 3600;

/// The ServiceAccount the operator of `ns` runs as.
pub fn service_account(ns: &str) -> String {
    format!("{ns}-{SERVICE_ACCOUNT_SUFFIX}")
}

/// Applies the chart's ServiceAccount and RBAC for watching `ns` only, and writes a kubeconfig
/// (beside `KUBECONFIG`'s cluster, with a fresh token of that ServiceAccount) to `path`.
pub async fn operator_kubeconfig(ns: &TestNamespace, path: &Path) -> Result<(), TestError> {
    operator_kubeconfig_watching(ns, &[], path).await
}

/// [`operator_kubeconfig`] for an operator of `ns` that also watches `others`: the chart's Roles
/// for `watchNamespaces: [ns, others...]`, each applied in its namespace.
pub async fn operator_kubeconfig_watching(
    ns: &TestNamespace,
    others: &[&TestNamespace],
    path: &Path,
) -> Result<(), TestError> {
    let names: Vec<&str> = std::iter::once(ns)
        .chain(others.iter().copied())
        .map(|n| n.name.as_str())
        .collect();
    let watch = format!("watchNamespaces={{{}}}", names.join(","));
    kubeconfig_under_chart(ns, others, Some(&watch), path).await
}

/// [`operator_kubeconfig`] for an operator of `ns` watching every namespace: the chart's
/// cluster-wide RBAC (`watchNamespaces` empty: one ClusterRole).
pub async fn operator_kubeconfig_cluster_wide(
    ns: &TestNamespace,
    path: &Path,
) -> Result<(), TestError> {
    kubeconfig_under_chart(ns, &[], None, path).await
}

/// Renders and applies the chart's ServiceAccount and RBAC for the release in `ns` (`watch`:
/// the `--set watchNamespaces=...` value, none for cluster-wide), each namespaced document in
/// its namespace, then writes the kubeconfig of a fresh token of that ServiceAccount.
async fn kubeconfig_under_chart(
    ns: &TestNamespace,
    others: &[&TestNamespace],
    watch: Option<&str>,
    path: &Path,
) -> Result<(), TestError> {
    let name = service_account(&ns.name);
    let chart = chart_dir();
    let full = format!("fullnameOverride={name}");
    let chart_path = chart.to_string_lossy();
    let mut args = vec!["template", &name, &chart_path, "--namespace", &ns.name];
    if let Some(watch) = watch {
        args.extend(["--set", watch]);
    }
    args.extend([
        "--set",
        &full,
        "--show-only",
        "templates/serviceaccount.yaml",
        "--show-only",
        "templates/rbac.yaml",
    ]);
    let rendered = helm(&args).await?;
    for doc in rendered.split("\n---") {
        let other = others
            .iter()
            .find(|o| doc.contains(&format!("namespace: {}\n", o.name)));
        match other {
            Some(o) => o.apply_yaml(doc).await?,
            None => ns.apply_yaml(doc).await?,
        };
    }
    let token = token(ns, &name).await?;
    let admin = std::env::var_os("KUBECONFIG").ok_or(TestError::NoKubeconfig)?;
    let text = std::fs::read_to_string(&admin)
        .map_err(|e| unexpected(format!("read {}", admin.to_string_lossy()), e.to_string()))?;
    let config = with_token(&text, &token)?;
    write_private(path, &config)
        .map_err(|e| unexpected(format!("write {}", path.display()), e.to_string()))
}

/// A token of ServiceAccount `name` from the TokenRequest API.
async fn token(ns: &TestNamespace, name: &str) -> Result<String, TestError> {
    let api: Api<ServiceAccount> = Api::namespaced(ns.client(), &ns.name);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer: TokenRequest = api
        .create_subresource("token", name, &PostParams::default(), &request)
        .await?;
    answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| unexpected(format!("token of {name}"), "the answer has no token"))
}

/// The kubeconfig `text` with every user's credentials replaced by `token`.
pub fn with_token(text: &str, token: &str) -> Result<String, TestError> {
    let mut doc: serde_norway::Value = serde_norway::from_str(text)?;
    let users = doc
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .ok_or_else(|| unexpected("kubeconfig", "no users"))?;
    for user in users.iter_mut() {
        let mut creds = serde_norway::Mapping::new();
        creds.insert("token".into(), token.into());
        if let Some(u) = user.as_mapping_mut() {
            u.insert("user".into(), serde_norway::Value::Mapping(creds));
        }
    }
    Ok(serde_norway::to_string(&doc)?)
}

/// The local cluster's state directory: the one holding `KUBECONFIG` (see `ClusterState`).
fn state_dir() -> Result<PathBuf, TestError> {
    let kubeconfig = std::env::var_os("KUBECONFIG").ok_or(TestError::NoKubeconfig)?;
    Ok(Path::new(&kubeconfig)
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf())
}

/// The local cluster's audit log: `audit.log` beside `KUBECONFIG`.
pub fn audit_log() -> Result<PathBuf, TestError> {
    Ok(state_dir()?.join("audit.log"))
}

/// The local cluster's API server starts, as (spawned, ready): until ready, its authorizer may
/// refuse what the rules allow (see `state::record_apiserver_start`).
pub fn apiserver_starts() -> Result<Vec<(jiff::Timestamp, jiff::Timestamp)>, TestError> {
    crate::state::apiserver_starts(&state_dir()?)
        .map_err(|e| unexpected("read the API server's starts", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_user_gets_the_token_and_nothing_else() {
        let admin = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: Q0E=\nusers:\n- name: admin\n  user:\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: admin\ncurrent-context: c\n";
        let out = with_token(admin, "tok").unwrap_or_default();
        assert!(out.contains("token: tok"), "{out}");
        assert!(!out.contains("client-key-data"), "{out}");
        assert!(out.contains("certificate-authority-data: Q0E="), "{out}");
        assert!(out.contains("user: admin"), "{out}");
    }
}
