//! Command lines of etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

use std::path::Path;

use crate::controlplane::{
    APISERVER, CONTROLLER_MANAGER, CONTROLLERS, KUBECONFIG_CONTROLLER_MANAGER,
    KUBECONFIG_SCHEDULER, SCHEDULER, SERVICE_ACCOUNT_ISSUER,
};
use crate::pki;
use crate::state::ClusterState;

fn flag(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

fn path_flag(name: &str, path: &Path) -> String {
    format!("--{name}={}", path.display())
}

pub fn etcd_args(state: &ClusterState) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", state.etcd_client_port);
    let peer = format!("http://127.0.0.1:{}", state.etcd_peer_port);
    vec![
        flag("name", "default"),
        path_flag("data-dir", &state.dir.join("etcd")),
        flag("listen-client-urls", &client),
        flag("advertise-client-urls", &client),
        flag("listen-peer-urls", &peer),
        flag("initial-advertise-peer-urls", &peer),
        flag("initial-cluster", format!("default={peer}")),
        flag(
            "initial-cluster-token",
            format!("localcluster-{}", state.id),
        ),
        flag("initial-cluster-state", "new"),
        flag("logger", "zap"),
        flag("log-outputs", "stderr"),
    ]
}

pub fn apiserver_args(state: &ClusterState) -> Vec<String> {
    let pki_dir = state.pki_dir();
    let cert = |stem| pki::cert_path(state, stem);
    let key = |stem| pki::key_path(state, stem);
    vec![
        flag(
            "etcd-servers",
            format!("http://127.0.0.1:{}", state.etcd_client_port),
        ),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", state.apiserver_port),
        // The advertise address is what the apiserver publishes as the endpoint of the
        // `kubernetes` Service. 127.0.0.1 does not work: the apiserver then logs `Endpoints
        // "kubernetes" is invalid: ... may not be in the loopback range (127.0.0.0/8)` every 10 s
        // and the Service has no endpoints (seen on 1.20.2). Without the flag it publishes the
        // host's default-route address (not ours), and refuses to start on a host without a
        // default route ("Unable to find suitable network address"). The cluster's own bridge
        // address 198.18.N.1 is accepted (checked: the endpoint is 198.18.N.1:<port>), is unique
        // per cluster and needs no interface to exist.
        flag("advertise-address", state.bridge_ip()),
        path_flag("cert-dir", &pki_dir.join(APISERVER)),
        path_flag("tls-cert-file", &cert(pki::APISERVER)),
        path_flag("tls-private-key-file", &key(pki::APISERVER)),
        path_flag("client-ca-file", &cert(pki::CA)),
        flag("authorization-mode", "Node,RBAC"),
        path_flag(
            "service-account-key-file",
            &pki::service_account_pub_path(state),
        ),
        path_flag(
            "service-account-signing-key-file",
            &key(pki::SERVICE_ACCOUNT),
        ),
        flag("service-account-issuer", SERVICE_ACCOUNT_ISSUER),
        flag("api-audiences", SERVICE_ACCOUNT_ISSUER),
        flag("service-cluster-ip-range", state.service_cidr()),
        path_flag(
            "kubelet-client-certificate",
            &cert(pki::APISERVER_KUBELET_CLIENT),
        ),
        path_flag("kubelet-client-key", &key(pki::APISERVER_KUBELET_CLIENT)),
        flag("kubelet-preferred-address-types", "InternalIP"),
        flag("allow-privileged", "true"),
        flag("profiling", "false"),
        // The audit log records what ServiceAccounts do (see `AUDIT_POLICY`): the e2e suite
        // reads it to prove the operator's RBAC rules are each used and none is missing.
        path_flag("audit-policy-file", &state.dir.join(AUDIT_POLICY_FILE)),
        path_flag("audit-log-path", &state.audit_log()),
        flag("audit-log-format", "json"),
        flag("audit-log-maxsize", 1024),
        flag("audit-log-maxbackup", 1),
    ]
}

/// File name of the audit policy in the state directory.
pub const AUDIT_POLICY_FILE: &str = "audit-policy.yaml";

/// What the API server audits: at Metadata level (who, verb, object, response code) every
/// request of a ServiceAccount outside kube-system, and every deletion of a namespace or a
/// RoleBinding (a test's namespace deleted while its operator still runs, `helm uninstall`:
/// what revokes an operator's rules); nothing else. Requests are logged once, when the response
/// is complete (or when a watch starts).
pub const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: Metadata
    verbs: ["delete", "deletecollection"]
    resources:
      - group: ""
        resources: ["namespaces"]
      - group: "rbac.authorization.k8s.io"
        resources: ["rolebindings"]
  - level: None
"#;

pub fn controller_manager_args(state: &ClusterState) -> Vec<String> {
    let kubeconfig = state.component_kubeconfig(KUBECONFIG_CONTROLLER_MANAGER);
    vec![
        path_flag("kubeconfig", &kubeconfig),
        path_flag("authentication-kubeconfig", &kubeconfig),
        path_flag("authorization-kubeconfig", &kubeconfig),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", state.controller_manager_port),
        path_flag("cert-dir", &state.pki_dir().join(CONTROLLER_MANAGER)),
        flag("use-service-account-credentials", "true"),
        path_flag(
            "service-account-private-key-file",
            &pki::key_path(state, pki::SERVICE_ACCOUNT),
        ),
        path_flag("root-ca-file", &pki::cert_path(state, pki::CA)),
        path_flag("cluster-signing-cert-file", &pki::cert_path(state, pki::CA)),
        path_flag("cluster-signing-key-file", &pki::key_path(state, pki::CA)),
        flag("controllers", CONTROLLERS),
        flag("leader-elect", "false"),
        flag("profiling", "false"),
    ]
}

pub fn scheduler_args(state: &ClusterState) -> Vec<String> {
    let kubeconfig = state.component_kubeconfig(KUBECONFIG_SCHEDULER);
    vec![
        path_flag("kubeconfig", &kubeconfig),
        path_flag("authentication-kubeconfig", &kubeconfig),
        path_flag("authorization-kubeconfig", &kubeconfig),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", state.scheduler_port),
        path_flag("cert-dir", &state.pki_dir().join(SCHEDULER)),
        flag("leader-elect", "false"),
        flag("profiling", "false"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::Path;

    use crate::controlplane::process::cmdline_names_dir;
    use crate::controlplane::test_support::sample;

    #[test]
    fn component_flags_use_the_cluster_identity() {
        let s = sample(Path::new("/st"));
        let a = apiserver_args(&s);
        for f in [
            "--secure-port=30003",
            "--etcd-servers=http://127.0.0.1:30001",
            "--service-cluster-ip-range=198.19.42.0/24",
            "--advertise-address=198.18.42.1",
            "--bind-address=127.0.0.1",
            "--client-ca-file=/st/pki/ca.crt",
        ] {
            assert!(a.contains(&f.to_string()), "{f} not in {a:?}");
        }
        let e = etcd_args(&s);
        assert!(e.contains(&"--listen-peer-urls=http://127.0.0.1:30002".to_string()));
        assert!(e.contains(&"--data-dir=/st/etcd".to_string()));
        let cm = controller_manager_args(&s);
        assert!(cm.contains(&"--secure-port=30004".to_string()));
        assert!(
            cm.contains(&"--kubeconfig=/st/kubeconfigs/controller-manager.kubeconfig".to_string())
        );
        let sc = scheduler_args(&s);
        assert!(sc.contains(&"--secure-port=30005".to_string()));
        // Every process names the state dir, which `down` relies on to recognise it.
        for args in [a, e, cm, sc] {
            let cmdline = args.join("\0");
            assert!(cmdline_names_dir(cmdline.as_bytes(), Path::new("/st")));
        }
    }
}
