//! The copy Jobs' capabilities are each needed, and enough: the pod spec the operator's pure
//! builder makes (`storage_migrator::build::job`, security context included) runs on the local
//! cluster against a source tree of files of several owners with a 0000 file in a 0700
//! directory, setuid and setgid bits, an ACL, a user xattr, a character device and a file
//! capability; once with the builder's capabilities (the copy, by `cp -a` onto the empty claim,
//! exits 0, its own verification pass finding the trees equal, and the read-only verify pod
//! agrees) and once with each
//! capability removed (the copy or its verification fails, on the file that needs it). The verify and measure pods (read-only
//! mounts, DAC_OVERRIDE only) read the whole tree; the mounter (non-root, no capability) gets
//! a WaitForFirstConsumer claim provisioned.
//!
//! Local-cluster-only (`E2E_LOCALCLUSTER=1`): the preparing pod runs the host's `setfacl`,
//! `setcap` and `mknod` (the `debian` image of the local cluster's agent), whose container
//! runtime applies capabilities, no_new_privs and the read-only root as runc does; it does
//! not apply seccomp profiles (see docs/local-cluster.md).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use serde_json::json;

use e2e::testing::{MoverSpec, PodOutcome, TestNamespace, mover_pod_spec, scenario};
use storage_migrator::api::{PlannedMember, StorageMigrationRequest};
use storage_migrator::build::security::COPY_CAPABILITIES;
use storage_migrator::build::{self, JobKind};
use storage_migrator::image::ImageRef;

const CLAIM_BOUND: Duration = Duration::from_secs(90);
const POD_RUN: Duration = Duration::from_secs(180);

/// The source tree: what each capability of the copy is needed for.
const PREPARE_SOURCE: &str = r#"set -eu
cd /src
mkdir private && echo secret > private/data
chown 1001:1001 private private/data && chmod 0000 private/data && chmod 0700 private
echo g > setgid && chown 1002:1002 setgid && chmod 2755 setgid
echo u > setuid && chown 1003:1003 setuid && chmod 4755 setuid
echo a > acl && chown 1004:1004 acl && setfacl -m u:2000:rw acl
echo x > xattr && chown 1005:1005 xattr && setfattr -n user.note -v kept xattr
mknod chardev c 1 3 && chown 1006:1006 chardev
echo c > fcap && chown 1007:1007 fcap && setcap cap_net_bind_service+ep fcap
getfacl -p acl | grep -q user:2000:rw-
getcap fcap | grep -q cap_net_bind_service
ls -lnR /src
echo PREPARED
"#;

/// The source tree is made with host tools.
fn local_cluster_only() -> bool {
    e2e::testing::require::local_cluster_flag("mover caps")
}

/// A request whose Jobs the builder makes (only its name, namespace and copy settings matter;
/// the pods are created without its ownerReference).
fn request(ns: &str) -> StorageMigrationRequest {
    serde_json::from_value(json!({
        "apiVersion": "storagemigrator.io/v1alpha1",
        "kind": "StorageMigrationRequest",
        "metadata": {"name": "caps", "namespace": ns, "uid": "00000000-0000-0000-0000-000000000000"},
        "spec": {
            "type": "StorageClassChange",
            "target": {"name": "none"},
            "timeout": "30m",
            "storageClassChange": {"storageClassName": "none"},
        },
    }))
    .expect("a request")
}

fn member(node: &str, target: &str) -> PlannedMember {
    PlannedMember {
        pod: "none-0".into(),
        node: node.into(),
        claim: "src".into(),
        temp_claim: target.into(),
        ..Default::default()
    }
}

/// Creates pod `name` with `spec` (labels and owner dropped: a bare pod), waits for its end.
async fn run(ns: &TestNamespace, name: &str, spec: PodSpec) -> PodOutcome {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("cannot create pod {name}: {e}"));
    let pod = ns
        .wait_pod_finished(name, POD_RUN)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    ns.outcome_of(&pod).await
}

/// The pod spec of the operator's Job of `kind` for `member`, with `caps` as the capabilities
/// its container adds (None: the builder's own).
fn job_pod(
    ns: &TestNamespace,
    image: &ImageRef,
    member: &PlannedMember,
    kind: JobKind,
    caps: Option<Vec<String>>,
) -> PodSpec {
    // SINCE=0 (a verification in `Changed` mode, the default, reading every file's content):
    // its metadata pass, `find` and content pass all run under these capabilities, in the
    // final copy's pod (which verifies what it copied) and in the read-only verify pod.
    let verification = build::Verification::ChangedSince(0);
    let job = build::job(
        &request(&ns.name),
        image,
        member,
        &member.pod,
        kind,
        600,
        verification,
    );
    let mut spec = job.spec.and_then(|s| s.template.spec).expect("pod spec");
    if let Some(caps) = caps {
        let sc = spec.containers[0].security_context.as_mut().expect("sc");
        sc.capabilities.as_mut().expect("capabilities").add = Some(caps);
    }
    spec
}

/// A case: the capability dropped (None: the full set) and what its failure must name.
struct Case {
    drop: Option<&'static str>,
    /// Text the failing copy's or verification's output must contain.
    names: &'static str,
}

const CASES: [Case; 7] = [
    Case {
        drop: None,
        names: "",
    },
    Case {
        drop: Some("CHOWN"),
        names: "chown",
    },
    Case {
        drop: Some("DAC_OVERRIDE"),
        names: "private",
    },
    Case {
        drop: Some("FOWNER"),
        names: "Operation not permitted",
    },
    Case {
        drop: Some("FSETID"),
        names: "setgid",
    },
    Case {
        drop: Some("MKNOD"),
        names: "chardev",
    },
    Case {
        drop: Some("SETFCAP"),
        names: "fcap",
    },
];

/// Copy with the case's capabilities into a fresh claim on `node` (the copy pod verifies its
/// own work, as the operator's final copy does), then verify again with a read-only verify pod
/// (what an operator resuming a copy made without that pass runs): (copy, verify).
async fn copy_and_verify(
    ns: &TestNamespace,
    image: &ImageRef,
    class: &str,
    node: &str,
    case: &Case,
) -> (PodOutcome, PodOutcome) {
    let label = case.drop.unwrap_or("all").to_lowercase().replace('_', "-");
    let target = format!("dst-{label}");
    ns.create_pvc(&target, class, "64Mi").await.unwrap();
    let m = member(node, &target);
    let caps = case.drop.map(|d| {
        COPY_CAPABILITIES
            .iter()
            .filter(|c| **c != d)
            .map(|c| c.to_string())
            .collect()
    });
    let copy = run(
        ns,
        &format!("copy-{label}"),
        job_pod(ns, image, &m, JobKind::Copy, caps),
    )
    .await;
    let verify = run(
        ns,
        &format!("verify-{label}"),
        job_pod(ns, image, &m, JobKind::Verify, None),
    )
    .await;
    (copy, verify)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_copy_capability_is_needed_and_the_set_is_enough() {
    if !local_cluster_only() {
        return;
    }
    let (cluster, ns) = scenario("mover-caps").await;
    let image = ImageRef::parse(&cluster.mover_image).expect("the tests' mover image");
    ns.create_pvc("src", &cluster.storage_class, "64Mi")
        .await
        .unwrap();
    ns.wait_pvc_bound("src", CLAIM_BOUND).await.unwrap();
    let prepare = MoverSpec::shell("prepare", PREPARE_SOURCE).mount("src", "/src");
    let out = run(&ns, "prepare", mover_pod_spec("debian", &prepare)).await;
    assert!(out.succeeded(), "preparing the source tree: {out:?}");
    let node = out.node.clone().expect("prepare pod ran on a node");

    let started = std::time::Instant::now();
    let runs = CASES
        .iter()
        .map(|case| copy_and_verify(&ns, &image, &cluster.wffc_storage_class, &node, case));
    let results = futures::future::join_all(runs).await;
    let mut table = BTreeMap::new();
    for (case, (copy, verify)) in CASES.iter().zip(&results) {
        let what = case.drop.unwrap_or("none (the builder's set)");
        let row = format!(
            "copy exit {:?}, verify exit {:?}",
            copy.exit_code, verify.exit_code
        );
        eprintln!("dropped {what}: {row}");
        table.insert(what, row);
        match case.drop {
            None => {
                assert!(copy.succeeded(), "full set: copy {copy:?}");
                // The copy pod verified what it copied, under the same capabilities; onto the
                // empty claim GNU cp copied (the first pass's default), not rsync.
                assert!(copy.output().contains("\"differences\":0"), "{copy:?}");
                assert!(
                    copy.output().contains("\"mode\":\"KernelCopy\""),
                    "{copy:?}"
                );
                assert!(verify.succeeded(), "full set: trees differ: {verify:?}");
                assert!(verify.output().contains("\"differences\":0"), "{verify:?}");
            }
            Some(cap) => {
                assert!(
                    !copy.succeeded() || !verify.succeeded(),
                    "without {cap} the copy and its verification still passed: the capability \
                     is not needed\ncopy: {copy:?}\nverify: {verify:?}"
                );
                let output = format!("{}\n{}", copy.output(), verify.output());
                assert!(
                    output.contains(case.names),
                    "without {cap} the failure should name {:?}:\n{output}",
                    case.names
                );
            }
        }
    }
    eprintln!(
        "NOTE mover caps: {} cases in {:.0?}: {table:#?}",
        CASES.len(),
        started.elapsed()
    );

    // The read-only pods read the whole tree (the 0000 file in the 0700 directory included)
    // with DAC_OVERRIDE alone and every mount read-only.
    let m = member(&node, "dst-all");
    let measure = run(
        &ns,
        "measure",
        job_pod(&ns, &image, &m, JobKind::Measure, None),
    )
    .await;
    assert!(measure.succeeded(), "{measure:?}");
    assert!(measure.output().contains("usedBytes"), "{measure:?}");
}

/// The mounter (uid 65532, no capability, read-only root and mount) gets a WaitForFirstConsumer
/// claim provisioned on the member's node, as the operator uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unprivileged_mounter_still_gets_a_claim_provisioned() {
    if !local_cluster_only() {
        return;
    }
    let (cluster, ns) = scenario("mover-mounter").await;
    let node = cluster.schedulable_nodes().await.unwrap()[0].clone();
    let image = ImageRef::parse(&cluster.mover_image).expect("the tests' mover image");
    ns.create_pvc("late", &cluster.wffc_storage_class, "64Mi")
        .await
        .unwrap();
    let late = member(&node, "late");
    let mut pod = build::mounter_pod(&request(&ns.name), &image, &late, &late.pod);
    pod.metadata.owner_references = None;
    let spec = pod.spec.clone().expect("spec");
    let sc = spec
        .security_context
        .as_ref()
        .expect("pod security context");
    assert_eq!(sc.run_as_user, Some(65532));
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let claim = ns.wait_pvc_bound("late", CLAIM_BOUND).await.unwrap();
    let selected = claim
        .metadata
        .annotations
        .unwrap_or_default()
        .get("volume.kubernetes.io/selected-node")
        .cloned();
    assert_eq!(selected.as_deref(), Some(node.as_str()));
    let name = pod.metadata.name.clone().expect("name");
    ns.wait_pod_ready(&name, POD_RUN)
        .await
        .unwrap_or_else(|e| panic!("the mounter does not run: {e}"));
}

/// Preflight on a real API server: a request's own moverImage is Denied unless the operator
/// allows it, and a namespace whose Pod Security level is `restricted` is Denied naming the
/// label (read with the operator's `get namespaces`). Both are checked before the target, so
/// no StatefulSet is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_denies_a_requests_image_and_a_restricted_namespace() {
    use e2e::testing::operator::{Operator, create_request, install_crd, wait_final};
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams};
    use storage_migrator::api::Phase;

    let (cluster, ns) = scenario("mover-preflight").await;
    install_crd(&ns).await.unwrap();
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    let spec = |image: Option<&str>| {
        let mut spec = json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": "etcd"},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "5m",
        });
        if let Some(image) = image {
            spec["copy"] = json!({"moverImage": image});
        }
        spec
    };
    let reason_of = |req: &StorageMigrationRequest| {
        let status = req.status.clone().unwrap_or_default();
        let accepted = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Accepted")
            .cloned();
        (status.phase, accepted.map(|c| (c.reason, c.message)))
    };
    create_request(&ns, "own-image", spec(Some("registry.test/mine:1")))
        .await
        .unwrap();
    let req = wait_final(&ns, "own-image", Duration::from_secs(60))
        .await
        .unwrap();
    let (phase, accepted) = reason_of(&req);
    assert_eq!(phase, Phase::Denied);
    let (reason, message) = accepted.expect("Accepted condition");
    assert_eq!(reason, "MoverImageNotAllowed", "{message}");
    assert!(message.contains("--allow-request-mover-image"), "{message}");

    let label = "pod-security.kubernetes.io/enforce";
    let patch = json!({"metadata": {"labels": {label: "restricted"}}});
    Api::<Namespace>::all(ns.client())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    create_request(&ns, "restricted", spec(None)).await.unwrap();
    let req = wait_final(&ns, "restricted", Duration::from_secs(60))
        .await
        .unwrap();
    let (phase, accepted) = reason_of(&req);
    assert_eq!(phase, Phase::Denied);
    let (reason, message) = accepted.expect("Accepted condition");
    assert_eq!(reason, "PodSecurityLevel", "{message}");
    assert!(
        message.contains(&format!("{label}=restricted")),
        "{message}"
    );
}
