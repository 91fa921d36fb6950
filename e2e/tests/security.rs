//! The security context is enforced on the process (capabilities, read-only root, no_new_privs,
//! runAsNonRoot) and pods reach the API server in-cluster with their service account token.
//! Local-cluster-only (`E2E_LOCALCLUSTER=1`): the pods run the host's programs (`sh`, `grep`,
//! `chown`, `curl`) as the local cluster's agent does for the `debian` image.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::LogParams;

use e2e::testing::{TestCluster, TestNamespace, describe_pod, scenario};

const RUN: Duration = Duration::from_secs(120);

/// containerd's default capability set as a /proc/<pid>/status mask (CHOWN, DAC_OVERRIDE,
/// FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD,
/// AUDIT_WRITE, SETFCAP): the same value a Docker or containerd container shows.
const DEFAULT_CAPS: &str = "00000000a80425fb";
const NO_CAPS: &str = "0000000000000000";

/// Pods run host programs: local cluster only.
fn local_cluster_only() -> bool {
    e2e::testing::require::local_cluster_flag("security")
}

/// The manifest of a one-container pod (restartPolicy Never, image `debian`) running `sh -c
/// script`, with `security` as the container's securityContext (a YAML flow mapping) and
/// `extra` added to the pod spec (YAML lines indented by two spaces).
fn pod_yaml(name: &str, security: &str, script: &str, extra: &str) -> String {
    let script: String = script.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
{extra}
  containers:
  - name: main
    image: debian
    securityContext: {security}
    command:
    - sh
    - -c
    - |
{script}"
    )
}

/// Waits until the namespace's default ServiceAccount exists (the ServiceAccount admission
/// plugin refuses pods until then; their token comes from the TokenRequest API, bound to the
/// pod, since Kubernetes 1.24 has no token Secrets).
async fn wait_default_service_account(ns: &TestNamespace) {
    let api: Api<ServiceAccount> = ns.api();
    let cond = |sa: Option<&ServiceAccount>| sa.is_some();
    ns.wait_for(
        api,
        "default",
        "default service account",
        Duration::from_secs(60),
        cond,
        |sa| format!("{:?}", sa.metadata.name),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Applies `yaml` (one pod), waits for its end and returns the pod with the log of `main`.
async fn run_pod(ns: &TestNamespace, name: &str, yaml: &str) -> (Pod, String) {
    ns.apply_yaml(yaml)
        .await
        .unwrap_or_else(|e| panic!("cannot create pod {name}: {e}"));
    let pod = ns
        .wait_pod_finished(name, RUN)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let logs = ns
        .api::<Pod>()
        .logs(
            name,
            &LogParams {
                container: Some("main".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("cannot read the log of {name}: {e}"));
    (pod, logs)
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// The value of `key:` in a /proc/self/status dump within `logs`.
fn status_field<'a>(logs: &'a str, key: &str) -> Option<&'a str> {
    logs.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// Prints the capability sets and NoNewPrivs, then tries to chown a file it creates in `dir`
/// and to create `/x` in the root filesystem.
fn probe(dir: &str) -> String {
    format!(
        "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status
touch {dir}/owned && if chown 4321 {dir}/owned 2>{dir}/err; then echo CHOWN-OK; else echo \"CHOWN-FAILED $(cat {dir}/err)\"; fi
if touch /x 2>{dir}/err; then echo ROOT-WRITABLE; else echo \"ROOT-REFUSED $(cat {dir}/err)\"; fi"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_read_only_root_and_no_new_privs_are_enforced() {
    if !local_cluster_only() {
        return;
    }
    let (_cluster, ns) = scenario("security-caps").await;
    wait_default_service_account(&ns).await;
    let scratch = "  volumes:\n  - name: scratch\n    emptyDir: {}";
    let cases = [
        ("defaults", "{}", probe("/tmp"), ""),
        (
            "drop-all",
            "{capabilities: {drop: [ALL]}}",
            probe("/tmp"),
            "",
        ),
        (
            "locked",
            "{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [CHOWN], add: [NET_ADMIN]}}",
            format!(
                "{}\ntouch /scratch/y && echo VOLUME-WRITABLE",
                probe("/scratch")
            ),
            scratch,
        ),
        (
            "nonroot",
            "{runAsUser: 1000, runAsNonRoot: true}",
            probe("/tmp"),
            "",
        ),
    ];
    let runs = cases.iter().map(|(name, sec, script, extra)| {
        let yaml = pod_yaml(name, sec, script, extra);
        let ns = &ns;
        async move {
            let mut yaml = yaml;
            if !extra.is_empty() {
                yaml.push_str(
                    "    volumeMounts:\n    - name: scratch\n      mountPath: /scratch\n",
                );
            }
            run_pod(ns, name, &yaml).await
        }
    });
    let results = futures::future::join_all(runs).await;
    let [defaults, drop_all, locked, nonroot] = &results[..] else {
        panic!("four pods expected");
    };

    assert_defaults(&defaults.1);
    assert_eq!(
        phase(&defaults.0),
        "Succeeded",
        "{}",
        describe_pod(&defaults.0)
    );
    assert_confined(&drop_all.1, &locked.1, &nonroot.1);
}

/// Defaults: containerd's set for a root process; chown and a writable root work.
fn assert_defaults(logs: &str) {
    assert_eq!(status_field(logs, "CapBnd"), Some(DEFAULT_CAPS), "{logs}");
    assert_eq!(status_field(logs, "CapEff"), Some(DEFAULT_CAPS), "{logs}");
    assert_eq!(status_field(logs, "CapPrm"), Some(DEFAULT_CAPS), "{logs}");
    assert_eq!(status_field(logs, "CapInh"), Some(NO_CAPS), "{logs}");
    assert_eq!(status_field(logs, "CapAmb"), Some(NO_CAPS), "{logs}");
    assert_eq!(status_field(logs, "NoNewPrivs"), Some("0"), "{logs}");
    assert!(
        logs.contains("CHOWN-OK") && logs.contains("ROOT-WRITABLE"),
        "{logs}"
    );
}

/// drop ALL, the locked-down container and the non-root one.
fn assert_confined(drop_all: &str, locked: &str, nonroot: &str) {
    // drop: [ALL], still uid 0: no capability at all, chown is refused.
    let logs = drop_all;
    for set in ["CapBnd", "CapEff", "CapPrm"] {
        assert_eq!(status_field(logs, set), Some(NO_CAPS), "{set}: {logs}");
    }
    assert!(
        logs.contains("CHOWN-FAILED") && logs.contains("Operation not permitted"),
        "{logs}"
    );

    // Read-only root, no_new_privs, CHOWN dropped and NET_ADMIN (bit 12) added.
    let logs = locked;
    let want = format!("{:016x}", (0xa80425fbu64 & !1) | 1 << 12);
    assert_eq!(status_field(logs, "CapEff"), Some(want.as_str()), "{logs}");
    assert_eq!(status_field(logs, "NoNewPrivs"), Some("1"), "{logs}");
    assert!(
        logs.contains("CHOWN-FAILED") && logs.contains("Operation not permitted"),
        "{logs}"
    );
    assert!(
        logs.contains("ROOT-REFUSED") && logs.contains("Read-only file system"),
        "{logs}"
    );
    assert!(logs.contains("VOLUME-WRITABLE"), "{logs}");

    // A non-root process keeps the bounding set but has no effective capabilities: as uid 1000
    // it cannot chown, and it runs (runAsNonRoot holds).
    let logs = nonroot;
    assert_eq!(status_field(logs, "CapBnd"), Some(DEFAULT_CAPS), "{logs}");
    assert_eq!(status_field(logs, "CapEff"), Some(NO_CAPS), "{logs}");
    assert_eq!(status_field(logs, "CapPrm"), Some(NO_CAPS), "{logs}");
    assert!(
        logs.contains("CHOWN-FAILED") && logs.contains("Operation not permitted"),
        "{logs}"
    );
}

/// The container's state (waiting reason and message, restart count, whether it ever ran).
fn container_state(pod: &Pod) -> Option<(String, String, i32, bool)> {
    let cs = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let state = cs.state.as_ref()?;
    let waiting = state.waiting.as_ref()?;
    let ran = state.running.is_some()
        || state.terminated.is_some()
        || cs
            .last_state
            .as_ref()
            .is_some_and(|l| l.running.is_some() || l.terminated.is_some());
    Some((
        waiting.reason.clone().unwrap_or_default(),
        waiting.message.clone().unwrap_or_default(),
        cs.restart_count,
        ran,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_non_root_refuses_uid_zero() {
    if !local_cluster_only() {
        return;
    }
    let (_cluster, ns) = scenario("security-nonroot").await;
    wait_default_service_account(&ns).await;
    let cases = [
        (
            "explicit-root",
            "{runAsUser: 0, runAsNonRoot: true}",
            "container's runAsUser breaks non-root policy",
        ),
        // No runAsUser and an image without a user: it would run as root.
        (
            "image-root",
            "{runAsNonRoot: true}",
            "container has runAsNonRoot and image will run as root",
        ),
    ];
    for (name, sec, _) in &cases {
        let yaml = pod_yaml(name, sec, "touch /tmp/ran; echo RAN", "");
        ns.apply_yaml(&yaml)
            .await
            .unwrap_or_else(|e| panic!("cannot create pod {name}: {e}"));
    }
    for (name, _, message) in &cases {
        let cond = |p: Option<&Pod>| {
            p.and_then(container_state)
                .is_some_and(|(reason, _, _, _)| reason == "CreateContainerConfigError")
        };
        let pod = ns
            .wait_for(
                ns.api(),
                name,
                "CreateContainerConfigError",
                RUN,
                cond,
                describe_pod,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("pod {name} vanished"));
        let (_, got, _, _) = container_state(&pod).unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        assert!(got.starts_with(message), "{name}: {got}");
        assert!(
            got.contains(&format!(
                "(pod: \"{name}_{}({uid})\", container: main)",
                ns.name
            )),
            "{name}: {got}"
        );
    }
    // It never starts: still waiting a while later, never ran, no restart.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, _, _) in &cases {
        let pod = ns
            .api::<Pod>()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let state = container_state(&pod);
        assert!(
            matches!(&state, Some((reason, _, 0, false)) if reason == "CreateContainerConfigError"),
            "{name}: {state:?} / {}",
            describe_pod(&pod)
        );
        assert_eq!(phase(&pod), "Pending", "{name}");
    }
}

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Prints the in-cluster environment and the HTTP codes of three API calls made with the pod's
/// token and CA at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
fn api_script() -> String {
    format!(
        "SA={SA_DIR}
echo host=$KUBERNETES_SERVICE_HOST port=$KUBERNETES_SERVICE_PORT https=$KUBERNETES_SERVICE_PORT_HTTPS
echo link=$KUBERNETES_PORT_443_TCP
echo ns=$(cat $SA/namespace) uid=$(id -u)
URL=https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
TOKEN=$(cat $SA/token)
curl -sS --max-time 20 --cacert $SA/ca.crt -H \"Authorization: Bearer $TOKEN\" -o /dev/null -w 'api=%{{http_code}}\\n' $URL/api
curl -sS --max-time 20 --cacert $SA/ca.crt -H \"Authorization: Bearer $TOKEN\" -w '\\npods=%{{http_code}}\\n' $URL/api/v1/namespaces/$(cat $SA/namespace)/pods
curl -sS --max-time 20 --cacert $SA/ca.crt -o /dev/null -w 'anonymous=%{{http_code}}\\n' $URL/api/v1/namespaces/$(cat $SA/namespace)/pods"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_the_api_server_with_their_service_account() {
    if !local_cluster_only() {
        return;
    }
    let (_cluster, ns) = scenario("security-api").await;
    let state = TestCluster::local_state().expect("a local cluster's kubeconfig");
    let service_ip = state.kubernetes_service_ip().to_string();
    wait_default_service_account(&ns).await;

    // No RBAC for the default service account: authenticated as it, but forbidden.
    let sec = "{runAsUser: 65532, runAsNonRoot: true, allowPrivilegeEscalation: false}";
    let (pod, logs) = run_pod(&ns, "no-rbac", &pod_yaml("no-rbac", sec, &api_script(), "")).await;
    assert_eq!(phase(&pod), "Succeeded", "{logs}\n{}", describe_pod(&pod));
    assert!(
        logs.contains(&format!("host={service_ip} port=443 https=443")),
        "{logs}"
    );
    assert!(
        logs.contains(&format!("link=tcp://{service_ip}:443")),
        "{logs}"
    );
    assert!(
        logs.contains(&format!("ns={} uid=65532", ns.name)),
        "{logs}"
    );
    assert!(logs.contains("api=200"), "{logs}");
    assert!(logs.contains("pods=403"), "{logs}");
    assert!(
        logs.contains(&format!("system:serviceaccount:{}:default", ns.name)),
        "the refusal names the pod's service account: {logs}"
    );
    assert!(
        logs.contains("anonymous=403") || logs.contains("anonymous=401"),
        "{logs}"
    );

    // The same service account, granted `list pods` in its namespace: the same call succeeds.
    ns.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: pod-reader
rules:
- apiGroups: [\"\"]
  resources: [pods]
  verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: pod-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: pod-reader
subjects:
- kind: ServiceAccount
  name: default
",
    )
    .await
    .unwrap_or_else(|e| panic!("cannot grant RBAC: {e}"));
    let (pod, logs) = run_pod(
        &ns,
        "with-rbac",
        &pod_yaml("with-rbac", sec, &api_script(), ""),
    )
    .await;
    assert_eq!(phase(&pod), "Succeeded", "{logs}\n{}", describe_pod(&pod));
    assert!(logs.contains("pods=200"), "{logs}");
    assert!(
        logs.contains("\"kind\": \"PodList\"") && logs.contains("\"name\": \"no-rbac\""),
        "the list holds the namespace's pods: {logs}"
    );
}

/// The operator's binary, copied into a new directory under the temporary directory that every
/// user may enter: the pod runs it as uid 65532, and the build directory may be where that user
/// cannot reach (a checkout or a `CARGO_TARGET_DIR` under `/root`, mode 0700: exit 126).
fn reachable_operator_bin() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let open = || std::fs::Permissions::from_mode(0o755);
    let dir = tempfile::Builder::new()
        .prefix("smr-operator-bin.")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}"));
    std::fs::set_permissions(dir.path(), open()).unwrap_or_else(|e| panic!("chmod: {e}"));
    let bin = dir.path().join("storage-migrator");
    let from = e2e::testing::operator::operator_bin();
    std::fs::copy(&from, &bin).unwrap_or_else(|e| panic!("cannot copy {}: {e}", from.display()));
    std::fs::set_permissions(&bin, open()).unwrap_or_else(|e| panic!("chmod: {e}"));
    (dir, bin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mount_follows_automount_and_the_operators_client_works_in_a_pod() {
    if !local_cluster_only() {
        return;
    }
    let (_cluster, ns) = scenario("security-client").await;
    wait_default_service_account(&ns).await;
    let sec = "{runAsUser: 65532, runAsNonRoot: true, allowPrivilegeEscalation: false}";
    // automountServiceAccountToken: false: no token in the pod.
    let script = format!("if [ -e {SA_DIR} ]; then echo TOKEN-MOUNTED; else echo NO-TOKEN; fi");
    let (pod, logs) = run_pod(
        &ns,
        "no-automount",
        &pod_yaml(
            "no-automount",
            "{}",
            &script,
            "  automountServiceAccountToken: false",
        ),
    )
    .await;
    assert_eq!(phase(&pod), "Succeeded", "{logs}\n{}", describe_pod(&pod));
    assert!(logs.contains("NO-TOKEN"), "{logs}");

    // The operator's own client, `kube::Client::try_default()`, in a pod as a non-root user: it
    // picks the in-cluster config (no kubeconfig there), so its namespace is the pod's and the
    // API server sees the pod's service account (which may not read StatefulSets).
    let (_bin_dir, bin) = reachable_operator_bin();
    let script = format!(
        "cat > /tmp/req.yaml <<'EOF'
apiVersion: storagemigrator.io/v1alpha1
kind: StorageMigrationRequest
metadata: {{name: r}}
spec: {{type: Shrink, target: {{kind: StatefulSet, name: etcd}}, shrink: {{size: 256Mi}}, timeout: 15m, database: {{engine: Etcd}}}}
EOF
{} plan -f /tmp/req.yaml",
        bin.display()
    );
    let (pod, logs) = run_pod(
        &ns,
        "in-cluster-client",
        &pod_yaml("in-cluster-client", sec, &script, ""),
    )
    .await;
    let want = format!(
        "User \"system:serviceaccount:{0}:default\" cannot get resource \"statefulsets\" in API group \"apps\" in the namespace \"{0}\"",
        ns.name
    );
    assert!(logs.contains(&want), "{logs}\n{}", describe_pod(&pod));
}
