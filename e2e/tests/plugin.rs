//! End-to-end tests of the kubectl plugin: the built `kubectl-smr` binary run against the
//! cluster `KUBECONFIG` points at (the variable is passed on to it), each scenario in its own
//! namespace with its own operator process where one is needed.
//!
//! - `plan`: an acceptable request (exit 0, the members in order) and one with several problems
//!   (exit 2, every reason listed);
//! - `watch` of a real etcd StorageClassChange to its end (exit 0, the final lines with each
//!   member's downtime), then `describe` of the finished request;
//! - `abort` of a migrating request: it rolls back and ends `Failed` (`aborted`), and `watch`
//!   exits 3;
//! - `orphans`: a volume no claim refers to is listed with its delete command; `--delete`
//!   without `--yes` and without a terminal refuses; `--delete --yes` deletes it;
//! - `fleet`: a StatefulSet, a Deployment and a loose claim on one class (the claim denied),
//!   planned (the requests printed, none created), applied, followed by `watch --all -l` to
//!   the end, the claims then on the other class.
//!
//! The binary comes from `KUBECTL_SMR_BIN` (default `<workspace>/target/debug/kubectl-smr`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test plugin -- --test-threads=2`

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{
    TestCluster, TestNamespace, assert_claims_bound, claim_manifest, one_claim_deployment,
    one_member_set, scenario,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use storage_migrator::api::{Phase, Stage, StorageMigrationRequest};

const MIGRATION: Duration = Duration::from_secs(600);
const SET: &str = "etcd";

fn plugin_bin() -> PathBuf {
    std::env::var_os("KUBECTL_SMR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/kubectl-smr")
        })
}

/// What one run of the plugin gave.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `kubectl-smr ARGS` with no terminal (stdin closed, output piped), bounded by `limit`.
async fn smr(args: &[&str], limit: Duration) -> Run {
    let child = tokio::process::Command::new(plugin_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", plugin_bin().display()));
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl-smr {args:?} still running after {limit:?}"))
        .unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    tracing::info!(?args, code = run.code, stdout = %run.stdout, stderr = %run.stderr, "kubectl-smr");
    run
}

/// The CRD and the etcd fixture, 3/3 Ready.
async fn setup(test: &str) -> (TestCluster, TestNamespace) {
    let (cluster, ns) = scenario(test).await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    (cluster, ns)
}

fn class_change(cluster: &TestCluster) -> serde_json::Value {
    json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "15m",
        "database": {"engine": "Etcd"},
    })
}

fn request_file(dir: &tempfile::TempDir, name: &str, spec: serde_json::Value) -> String {
    let path = dir.path().join(format!("{name}.yaml"));
    let manifest = json!({
        "apiVersion": "storagemigrator.io/v1alpha1",
        "kind": "StorageMigrationRequest",
        "metadata": {"name": name},
        "spec": spec,
    });
    std::fs::write(&path, serde_norway::to_string(&manifest).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_accepts_and_lists_every_denial() {
    let (cluster, ns) = setup("smr-plugin-plan").await;
    let dir = tempfile::tempdir().unwrap();
    let good = request_file(&dir, "to-fast", class_change(&cluster));
    let run = smr(
        &["plan", "-f", &good, "-n", &ns.name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("Would be accepted"), "{run:?}");
    for member in ["etcd-0", "etcd-1", "etcd-2"] {
        assert!(run.stdout.contains(member), "{member} missing: {run:?}");
    }
    assert!(run.stdout.contains("1Gi -> 1Gi"), "{run:?}");
    // The etcd leader goes last, after MoveLeader.
    assert!(
        run.stdout.lines().any(|l| l.starts_with("Leader: etcd-")
            && l.contains("goes last; before it stops, its Raft leadership moved (MoveLeader)")),
        "{run:?}"
    );
    // How long each stop lasts: nothing ran in this namespace before.
    assert!(
        run.stdout
            .contains("Downtime: 3 member pod(s) are stopped once each, one at a time"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains(&format!(
            "no earlier successful request in namespace {} to estimate from",
            ns.name
        )),
        "{run:?}"
    );

    // A Shrink: what its measurement will require of each member.
    let mut shrink = class_change(&cluster);
    shrink["type"] = json!("Shrink");
    shrink["shrink"] = json!({"size": "256Mi"});
    shrink.as_object_mut().unwrap().remove("storageClassChange");
    let small = request_file(&dir, "smaller", shrink);
    let run = smr(
        &["plan", "-f", &small, "-n", &ns.name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("Shrink measurement: "), "{run:?}");
    assert!(
        run.stdout
            .contains("  etcd-0: claim data-etcd-0 (1Gi -> 256Mi) may have at most "),
        "{run:?}"
    );

    let mut spec = class_change(&cluster);
    spec["storageClassChange"]["storageClassName"] = json!("no-such-class");
    spec["timeout"] = json!("soon");
    let bad = request_file(&dir, "bad", spec);
    let run = smr(
        &["plan", "-f", &bad, "-n", &ns.name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stdout.contains("Would be DENIED for 2 reasons"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("- InvalidSpec: spec.timeout"),
        "{run:?}"
    );
    assert!(run.stdout.contains("- StorageClassNotFound:"), "{run:?}");
    ns.delete_and_wait(Duration::from_secs(120)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_a_migration_to_its_end_and_describe_tells_it() {
    let (cluster, ns) = setup("smr-plugin-watch").await;
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    // The pre-copy capped at 32 MiB/s: its 60 to 120 MiB of etcd data take 2 to 4 s, long
    // enough for the operator to read the copy's progress while it runs (uncapped, a pass here
    // can end within a second, between two of the operator's looks).
    let mut spec = class_change(&cluster);
    spec["copy"] = json!({"preCopyBandwidth": "32Mi"});
    create_request(&ns, "to-fast", spec).await.unwrap();
    let run = smr(&["watch", "to-fast", "-n", &ns.name], MIGRATION).await;
    let req = wait_final(&ns, "to-fast", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(run.code, 0, "{run:?}\n{}", summary(&req));
    let lines: Vec<&str> = run.stdout.lines().collect();
    let end = lines
        .iter()
        .rposition(|l| l.starts_with("to-fast: Successful in "));
    let end = end.unwrap_or_else(|| panic!("no final line: {run:?}"));
    let members: Vec<&&str> = (lines[end + 1..].iter())
        .filter(|l| l.starts_with("  etcd-"))
        .collect();
    assert_eq!(members.len(), 3, "{run:?}");
    for m in members {
        assert!(m.contains("Done") && m.contains("downtime "), "{m}");
    }
    // The operator read the copies' progress from their logs while they ran (the last reading
    // stays in the status): it looks every second or so while a copy pod runs.
    let status = req.status.clone().unwrap();
    assert!(
        status.members.iter().any(|m| m.copy_progress.is_some()),
        "no copy progress recorded: {:?}",
        status.members
    );
    assert_eq!(status.percent, Some(100));
    // No terminal: plain lines, no cursor movement.
    assert!(!run.stdout.contains('\x1b'), "{run:?}");
    assert!(
        run.stdout.contains("to-fast: Progressing, Migrating"),
        "{run:?}"
    );

    let run = smr(
        &["describe", "to-fast", "-n", &ns.name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let out = &run.stdout;
    assert!(out.starts_with("to-fast: Successful, Done, 100%"), "{out}");
    assert!(out.contains("Plan:\n"), "{out}");
    assert!(out.contains("  etcd-0 Done\n"), "{out}");
    assert!(
        out.contains("(claim data-etcd-0); original volume pvc-"),
        "{out}"
    );
    assert!(out.contains("    downtime "), "{out}");
    let events = out.split("Events:\n").nth(1).unwrap_or_default();
    assert!(events.contains("Normal"), "no events: {out}");
    ns.delete_and_wait(Duration::from_secs(300)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_rolls_the_request_back() {
    let (cluster, ns) = setup("smr-plugin-abort").await;
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(&ns, "to-fast", class_change(&cluster))
        .await
        .unwrap();
    wait_status(&ns, "to-fast", "migrating", MIGRATION, |s| {
        s.stage == Stage::Migrating
    })
    .await
    .unwrap();
    let run = smr(
        &["abort", "to-fast", "-n", &ns.name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains("asked the operator to roll back"),
        "{run:?}"
    );
    let watch = smr(&["watch", "to-fast", "-n", &ns.name], MIGRATION).await;
    let req = wait_final(&ns, "to-fast", Duration::from_secs(10))
        .await
        .unwrap();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    assert!(
        (status.failure.as_deref()).is_some_and(|f| f.starts_with("aborted: ")),
        "{}",
        summary(&req)
    );
    assert_eq!(watch.code, 3, "{watch:?}");
    assert!(watch.stdout.contains("to-fast: Failed"), "{watch:?}");
    // Every member serves again.
    e2e::testing::assert_claims_bound(&ns, SET, 3).await;
    // A second abort has nothing to do.
    let again = smr(
        &["abort", "to-fast", "-n", &ns.name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.stderr.contains("nothing to abort"), "{again:?}");
    ns.delete_and_wait(Duration::from_secs(300)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_lists_a_volume_no_claim_refers_to_and_deletes_it_on_request() {
    let (cluster, ns) = scenario("smr-plugin-orphans").await;
    let name = format!("orphan-{}", ns.name);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "left-behind",
            "hostPath": {"path": "/tmp/smr-orphan-test"},
            "claimRef": {"namespace": ns.name, "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"},
        },
    }))
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client.clone());
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    // The PV controller marks it Released (its claim is gone).
    let released = async {
        loop {
            let phase = (pvs.get(&name).await.ok())
                .and_then(|p| p.status)
                .and_then(|s| s.phase);
            if phase.as_deref() == Some("Released") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), released)
        .await
        .expect("the volume never became Released");

    let run = smr(&["orphans"], Duration::from_secs(60)).await;
    assert_eq!(run.code, 0, "{run:?}");
    let row = (run.stdout.lines())
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} not listed: {run:?}"));
    assert!(row.contains("Released") && row.contains("1Mi"), "{row}");
    assert!(
        row.contains("left-behind") && row.contains("Retain"),
        "{row}"
    );
    assert!(row.contains(&format!("{}/gone", ns.name)), "{row}");
    let command = format!("  kubectl delete persistentvolume {name}");
    assert!(run.stdout.lines().any(|l| l == command), "{run:?}");

    // Every --delete names the volume this test made: the suite may run against a cluster whose
    // other Released volumes an administrator keeps on purpose.
    let refused = smr(&["orphans", "--delete", &name], Duration::from_secs(60)).await;
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("needs a terminal"), "{refused:?}");
    assert!(
        pvs.get_opt(&name).await.unwrap().is_some(),
        "deleted without --yes"
    );

    let deleted = smr(
        &["orphans", "--delete", "--yes", &name],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert!(
        deleted
            .stdout
            .contains(&format!("persistentvolume/{name} deleted")),
        "{deleted:?}"
    );
    let others = (deleted.stdout.lines())
        .filter(|l| l.ends_with(" deleted") && !l.contains(&name))
        .count();
    assert_eq!(others, 0, "deleted beyond its scope: {deleted:?}");
    let gone = async {
        while pvs.get_opt(&name).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), gone)
        .await
        .expect("the volume is still there");
    ns.delete_and_wait(Duration::from_secs(120)).await.unwrap();
}

/// The fleet's workloads: a one-member StatefulSet and a Deployment on `standard`, a claim on
/// `standard` no pod mounts (denied), and a set already on the target class (no workload).
async fn fleet_workloads(cluster: &TestCluster, ns: &TestNamespace) {
    let data = "trap 'exit 0' TERM; [ -f /data/random ] || \
        { head -c 4194304 /dev/urandom > /data/random; sync; }; while true; do sleep 1; done";
    for (set, class) in [
        ("app", &cluster.storage_class),
        ("moved", &cluster.wffc_storage_class),
    ] {
        let s = one_member_set(set, &cluster.mover_image, class, "64Mi", data);
        ns.create_statefulset_ready(&s).await.unwrap();
    }
    for claim in ["web-data", "loose"] {
        let c = claim_manifest(claim, &cluster.storage_class, "64Mi");
        ns.api::<PersistentVolumeClaim>()
            .create(&PostParams::default(), &c)
            .await
            .unwrap();
    }
    let web = one_claim_deployment("web", "web-data", &cluster.mover_image, data);
    ns.api::<Deployment>()
        .create(&PostParams::default(), &web)
        .await
        .unwrap();
    let available = |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref())
            .is_some_and(|s| s.available_replicas == Some(1) && s.ready_replicas == Some(1))
    };
    ns.wait_for(
        ns.api::<Deployment>(),
        "web",
        "Deployment web available",
        Duration::from_secs(180),
        available,
        |d: &Deployment| format!("{:?}", d.status),
    )
    .await
    .unwrap();
}

/// `fleet` in plan mode lists every workload on the class with its plan or its denial and
/// prints the requests that would be accepted (creating none); `--apply` creates them; `watch
/// --all -l` follows them to the end; their claims are then on the target class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_plans_applies_and_watch_all_follows_every_workload_on_a_class() {
    let (cluster, ns) = scenario("smr-plugin-fleet").await;
    install_crd(&ns).await.unwrap();
    fleet_workloads(&cluster, &ns).await;
    let (from, to) = (
        cluster.storage_class.as_str(),
        cluster.wffc_storage_class.as_str(),
    );
    let args = [
        "fleet",
        "--from-class",
        from,
        "--to-class",
        to,
        "-n",
        &ns.name,
    ];
    let run = smr(&args, Duration::from_secs(120)).await;
    assert_eq!(run.code, 2, "one would be denied: {run:?}");
    let err = &run.stderr;
    for line in [
        format!(
            "{}/app StatefulSet: claims data-app-0; request sts-app-to-{to}",
            ns.name
        ),
        format!(
            "{}/web Deployment: claims web-data; request deploy-web-to-{to}",
            ns.name
        ),
        format!(
            "{}/loose PersistentVolumeClaim: claims loose; request pvc-loose-to-{to}",
            ns.name
        ),
        format!(
            "3 workloads on StorageClass {from}: 2 would move to {to} (2 members, 128Mi of claims), 1 would be denied"
        ),
    ] {
        assert!(err.lines().any(|l| l == line), "missing {line:?}: {run:?}");
    }
    assert!(err.contains("no pod mounts claim loose"), "{run:?}");
    assert!(
        !err.contains("moved"),
        "a set on the target class is no workload: {run:?}"
    );
    let printed: Vec<StorageMigrationRequest> = (run.stdout.split("---\n"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_norway::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    let names: Vec<String> = printed.iter().map(|r| r.name_any()).collect();
    assert_eq!(
        names,
        [format!("sts-app-to-{to}"), format!("deploy-web-to-{to}")]
    );
    let requests = ns.api::<StorageMigrationRequest>();
    assert!(
        requests
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "plan mode created requests"
    );

    let _op = Operator::start(&ns, 0, None).await.unwrap();
    let applied = [&args[..], &["--apply"]].concat();
    let run = smr(&applied, Duration::from_secs(120)).await;
    assert_eq!(run.code, 2, "{run:?}");
    for name in &names {
        let created = format!("storagemigrationrequest/{name} created in {}", ns.name);
        assert!(run.stdout.lines().any(|l| l == created), "{run:?}");
    }
    let label = format!("storagemigrator.io/fleet={from}-to-{to}");
    assert!(
        run.stderr.contains(&format!(
            "kubectl smr watch --all -l {label} -n {}",
            ns.name
        )),
        "{run:?}"
    );
    let run = smr(&["watch", "--all", "-l", &label, "-n", &ns.name], MIGRATION).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.lines().any(|l| l == "2 requests: 2 Successful"),
        "{run:?}"
    );
    for r in requests.list(&Default::default()).await.unwrap().items {
        assert_eq!(
            r.status.clone().unwrap_or_default().phase,
            Phase::Successful,
            "{}",
            summary(&r)
        );
    }
    for (claim, (_, class, _)) in assert_claims_bound(&ns, "app", 1).await {
        assert_eq!(class, to, "{claim}");
    }
    let web_data = ns
        .api::<PersistentVolumeClaim>()
        .get("web-data")
        .await
        .unwrap();
    assert_eq!(
        web_data.spec.and_then(|s| s.storage_class_name).as_deref(),
        Some(to)
    );
    ns.delete_and_wait(Duration::from_secs(300)).await.unwrap();
}
