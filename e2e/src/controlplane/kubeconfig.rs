//! Kubeconfig files for the admin, the controller-manager, the scheduler and the agent.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Serialize;

use crate::controlplane::{
    ControlPlaneError, KUBECONFIG_AGENT, KUBECONFIG_CONTROLLER_MANAGER, KUBECONFIG_SCHEDULER,
    Result, io_err,
};
use crate::pki::{self, CertKey};
use crate::state::ClusterState;

#[derive(Serialize)]
struct KubeconfigDoc<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    clusters: [Named<'a, ClusterEntry<'a>>; 1],
    users: [Named<'a, UserEntry>; 1],
    contexts: [Named<'a, ContextEntry<'a>>; 1],
    #[serde(rename = "current-context")]
    current_context: &'a str,
}
#[derive(Serialize)]
struct Named<'a, T> {
    name: &'a str,
    #[serde(flatten)]
    value: T,
}
#[derive(Serialize)]
struct ClusterEntry<'a> {
    cluster: ClusterFields<'a>,
}
#[derive(Serialize)]
struct ClusterFields<'a> {
    server: &'a str,
    #[serde(rename = "certificate-authority-data")]
    certificate_authority_data: String,
}
#[derive(Serialize)]
struct UserEntry {
    user: UserFields,
}
#[derive(Serialize)]
struct UserFields {
    #[serde(rename = "client-certificate-data")]
    client_certificate_data: String,
    #[serde(rename = "client-key-data")]
    client_key_data: String,
}
#[derive(Serialize)]
struct ContextEntry<'a> {
    context: ContextFields<'a>,
}
#[derive(Serialize)]
struct ContextFields<'a> {
    cluster: &'a str,
    user: &'a str,
}

/// A kubeconfig for `server` with the CA and the client certificate embedded (it stays valid
/// when copied). Cluster and context are named `name`, the user `user`.
pub fn render_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    client: &CertKey,
) -> Result<String> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let doc = KubeconfigDoc {
        api_version: "v1",
        kind: "Config",
        clusters: [Named {
            name,
            value: ClusterEntry {
                cluster: ClusterFields {
                    server,
                    certificate_authority_data: b64(ca_pem),
                },
            },
        }],
        users: [Named {
            name: user,
            value: UserEntry {
                user: UserFields {
                    client_certificate_data: b64(&client.cert_pem),
                    client_key_data: b64(&client.key_pem),
                },
            },
        }],
        contexts: [Named {
            name,
            value: ContextEntry {
                context: ContextFields {
                    cluster: name,
                    user,
                },
            },
        }],
        current_context: name,
    };
    serde_norway::to_string(&doc).map_err(ControlPlaneError::Render)
}

/// Writes `content` to `path` (its directory created) readable by its owner only (0600), replacing
/// any file there.
pub(crate) fn write_private(path: &Path, content: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", path)(e)),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    f.write_all(content.as_bytes())
        .map_err(io_err("write", path))
}

/// Writes `DIR/kubeconfig` (admin) and the component kubeconfigs.
pub(super) fn write_kubeconfigs(state: &ClusterState, bundle: &pki::Bundle) -> Result<()> {
    let name = format!("localcluster-{}", state.id);
    let server = state.apiserver_url();
    let ca = &bundle.ca.cert_pem;
    write_private(
        &state.kubeconfig(),
        &render_kubeconfig(&name, &server, ca, "kubernetes-admin", &bundle.admin)?,
    )?;
    for (component, user, ck) in [
        (
            KUBECONFIG_CONTROLLER_MANAGER,
            "system:kube-controller-manager",
            &bundle.controller_manager,
        ),
        (
            KUBECONFIG_SCHEDULER,
            "system:kube-scheduler",
            &bundle.scheduler,
        ),
        (KUBECONFIG_AGENT, "system:node-agent", &bundle.agent),
    ] {
        write_private(
            &state.component_kubeconfig(component),
            &render_kubeconfig(&name, &server, ca, user, ck)?,
        )?;
    }
    Ok(())
}

/// A client for the cluster of a kubeconfig file (e.g. `state.kubeconfig()`).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(path).map_err(|source| ControlPlaneError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| ControlPlaneError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    kube::Client::try_from(config).map_err(ControlPlaneError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    use kube::config::Kubeconfig;

    use crate::pki::CertKey;

    #[test]
    fn kubeconfig_embeds_credentials_and_parses() {
        let ck = CertKey {
            cert_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----\n".into(),
        };
        let text = render_kubeconfig(
            "localcluster-abc",
            "https://127.0.0.1:1234",
            "CA PEM",
            "kubernetes-admin",
            &ck,
        )
        .unwrap();
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("localcluster-abc"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:1234"));
        use base64::Engine;
        let dec = |s: &str| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
        };
        assert_eq!(
            dec(cluster.certificate_authority_data.as_deref().unwrap()),
            "CA PEM"
        );
        assert_eq!(kc.auth_infos[0].name, "kubernetes-admin");
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(
            dec(user.client_certificate_data.as_deref().unwrap()),
            ck.cert_pem
        );
        let ctx = kc.contexts[0].context.as_ref().unwrap();
        assert_eq!(
            (ctx.cluster.as_str(), ctx.user.as_deref()),
            ("localcluster-abc", Some("kubernetes-admin"))
        );
    }
}
