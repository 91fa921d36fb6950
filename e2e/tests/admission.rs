//! End-to-end check of validation at admission, against the cluster `KUBECONFIG` points at
//! (Kubernetes 1.30 or newer): the API server itself refuses a malformed request, with a message
//! naming the field, before the operator ever sees it; well-formed ones are admitted. The
//! cross-field rules are CEL (`x-kubernetes-validations`): their refusals name the field and the
//! kind of error (`spec.shrink: Required value: ...`, `...: Forbidden: ...`), as the API server
//! renders a rule's `fieldPath` and `reason`. After acceptance, a spec edit is ignored with the condition `SpecChangeIgnored`
//! while `status.observedGeneration` follows `metadata.generation`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test admission`

use std::time::{Duration, Instant};

use e2e::testing::operator::{Operator, install_crd, summary, wait_final, wait_status};
use e2e::testing::{TestNamespace, scenario};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequest};
use tracing::info;

const SET: &str = "etcd";

fn requests(ns: &TestNamespace) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<StorageMigrationRequest>(&());
    Api::namespaced_with(ns.client(), &ns.name, &ar)
}

/// A request named `name` with a good Shrink spec, then `edit` applied to its spec.
fn request(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> DynamicObject {
    let mut spec = json!({
        "type": "Shrink",
        "target": {"kind": "StatefulSet", "name": SET},
        "shrink": {"size": "256Mi"},
        "timeout": "30m",
    });
    edit(&mut spec);
    serde_json::from_value(json!({
        "apiVersion": "storagemigrator.io/v1alpha1",
        "kind": "StorageMigrationRequest",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// Creates the request; `Err` carries the API server's refusal as text.
async fn create(api: &Api<DynamicObject>, obj: &DynamicObject) -> Result<(), String> {
    api.create(&PostParams::default(), obj)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_malformed_requests_naming_the_field() {
    let (_cluster, ns) = scenario("smr-admission").await;
    install_crd(&ns).await.unwrap();
    let api = requests(&ns);

    let bad: Vec<(&str, &str, Edit)> = vec![
        (
            "bad-timeout-words",
            "spec.timeout",
            Box::new(|s| s["timeout"] = json!("1 hour")),
        ),
        (
            "bad-timeout-zero",
            "spec.timeout",
            Box::new(|s| s["timeout"] = json!("0s")),
        ),
        (
            "bad-timeout-iso",
            "spec.timeout",
            Box::new(|s| s["timeout"] = json!("PT1H")),
        ),
        (
            "bad-timeout-long",
            "spec.timeout",
            Box::new(|s| s["timeout"] = json!(format!("{}1s", "0".repeat(40)))),
        ),
        (
            "bad-size-unit",
            "spec.shrink.size",
            Box::new(|s| s["shrink"]["size"] = json!("1GB")),
        ),
        (
            "bad-size-zero",
            "spec.shrink.size",
            Box::new(|s| s["shrink"]["size"] = json!("0Gi")),
        ),
        (
            "bad-size-negative",
            "spec.shrink.size",
            Box::new(|s| s["shrink"]["size"] = json!("-1Gi")),
        ),
        (
            "bad-size-int-zero",
            "spec.shrink.size",
            Box::new(|s| s["shrink"]["size"] = json!(0)),
        ),
        (
            "bad-sizes-unit",
            "spec.shrink.sizes.wal",
            Box::new(|s| s["shrink"]["sizes"] = json!({"wal": "1GB"})),
        ),
        (
            "bad-sizes-int-zero",
            "spec.shrink.sizes.data",
            Box::new(|s| s["shrink"]["sizes"] = json!({"data": 0})),
        ),
        (
            "bad-missing-shrink",
            "spec.shrink: Required value: type Shrink requires spec.shrink",
            Box::new(|s| {
                s.as_object_mut().unwrap().remove("shrink");
            }),
        ),
        (
            "bad-missing-class",
            "spec.storageClassChange: Required value",
            Box::new(|s| {
                s["type"] = json!("StorageClassChange");
                s.as_object_mut().unwrap().remove("shrink");
            }),
        ),
        (
            "bad-both-blocks",
            "spec.storageClassChange: Forbidden",
            Box::new(|s| {
                s["storageClassChange"] = json!({"storageClassName": "fast"});
            }),
        ),
        (
            "bad-wrong-block",
            "spec.shrink: Required value",
            Box::new(|s| {
                s.as_object_mut().unwrap().remove("shrink");
                s["storageClassChange"] = json!({"storageClassName": "fast"});
            }),
        ),
        (
            "bad-both-template-fields",
            "spec.volumeClaimTemplates: Forbidden",
            Box::new(|s| {
                s["volumeClaimTemplate"] = json!("data");
                s["volumeClaimTemplates"] = json!(["data", "wal"]);
            }),
        ),
        (
            "bad-type",
            "spec.type",
            Box::new(|s| s["type"] = json!("Grow")),
        ),
        (
            "bad-kind",
            "spec.target.kind",
            Box::new(|s| s["target"]["kind"] = json!("DaemonSet")),
        ),
        (
            "bad-apply",
            "spec.apply",
            Box::new(|s| s["apply"] = json!("Sometimes")),
        ),
        (
            "bad-engine",
            "spec.database.engine",
            Box::new(|s| s["database"] = json!({"engine": "Mongo"})),
        ),
        (
            "bad-policy",
            "spec.oldPVReclaimPolicy",
            Box::new(|s| s["oldPVReclaimPolicy"] = json!("Recycle")),
        ),
        (
            "bad-target-name",
            "spec.target.name",
            Box::new(|s| s["target"]["name"] = json!("")),
        ),
        (
            "bad-class-name",
            "spec.storageClassChange.storageClassName",
            Box::new(|s| {
                s["type"] = json!("StorageClassChange");
                s.as_object_mut().unwrap().remove("shrink");
                s["storageClassChange"] = json!({"storageClassName": ""});
            }),
        ),
        (
            "bad-leader-label",
            "spec.database.generic.leaderLabel",
            Box::new(|s| {
                s["database"] = json!({"generic": {"leaderLabel": "leader"}});
            }),
        ),
        (
            "bad-port",
            "spec.database.etcd.clientPort",
            Box::new(|s| {
                s["database"] = json!({"engine": "Etcd", "etcd": {"clientPort": 0}});
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (name, field, edit) in bad {
        match create(&api, &request(name, edit)).await {
            Ok(()) => failures.push(format!("{name}: admitted")),
            Err(message) => {
                info!(name, %message, "refused");
                if !message.contains(field) {
                    failures.push(format!(
                        "{name}: the refusal does not name {field}: {message}"
                    ));
                }
            }
        }
    }

    let good: Vec<(&str, Edit)> = vec![
        ("good-shrink", Box::new(|_| {})),
        (
            "good-sizes",
            Box::new(|s| s["shrink"] = json!({"sizes": {"data": "1Gi", "wal": 268435456}})),
        ),
        (
            "good-timeout-hms",
            Box::new(|s| s["timeout"] = json!("1h0m30s")),
        ),
        (
            "good-size-int",
            Box::new(|s| s["shrink"]["size"] = json!(1_073_741_824)),
        ),
        (
            "good-size-decimal",
            Box::new(|s| s["shrink"]["size"] = json!("1.5Gi")),
        ),
        (
            "good-class-change",
            Box::new(|s| {
                s["type"] = json!("StorageClassChange");
                s.as_object_mut().unwrap().remove("shrink");
                s["storageClassChange"] = json!({"storageClassName": "fast"});
                s["database"] = json!({"engine": "Etcd", "etcd": {"clientPort": 2379}});
                s["oldPVReclaimPolicy"] = json!("Retain");
                s["apply"] = json!("Always");
            }),
        ),
    ];
    for (name, edit) in good {
        if let Err(message) = create(&api, &request(name, edit)).await {
            failures.push(format!("{name}: refused: {message}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A request denied for a missing StatefulSet, edited: the edit is ignored (a denied request is
/// final) with `SpecChangeIgnored`, and `observedGeneration` follows the generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_edit_after_the_verdict_is_ignored_and_observed() {
    let (_cluster, ns) = scenario("smr-admission-edit").await;
    install_crd(&ns).await.unwrap();
    let api = requests(&ns);
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create(
        &api,
        &request("denied", |s| s["target"]["name"] = json!("no-such-set")),
    )
    .await
    .unwrap();
    let denied = wait_final(&ns, "denied", Duration::from_secs(60))
        .await
        .unwrap();
    let status = denied.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Denied, "{}", summary(&denied));
    assert_eq!(status.observed_generation, Some(1));

    let started = Instant::now();
    let seen = edit_timeout_and_see_it_ignored(
        &ns,
        "denied",
        "2h",
        "after the request was denied at generation 1",
    )
    .await;
    assert_eq!(seen.status.unwrap().phase, Phase::Denied);
    info!(after = ?started.elapsed(), "edit seen and ignored");
}

/// Sets `spec.timeout` of request `name` to `timeout` (its generation becomes 2) and waits until
/// the operator has seen it: `observedGeneration` 2 and `SpecChangeIgnored=True` whose message
/// contains `says`. The request as then seen.
async fn edit_timeout_and_see_it_ignored(
    ns: &TestNamespace,
    name: &str,
    timeout: &str,
    says: &'static str,
) -> StorageMigrationRequest {
    requests(ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"timeout": timeout}})),
        )
        .await
        .unwrap();
    let seen = wait_status(
        ns,
        name,
        "SpecChangeIgnored",
        Duration::from_secs(30),
        move |s| {
            s.observed_generation == Some(2)
                && s.conditions.iter().any(|c| {
                    c.type_ == "SpecChangeIgnored" && c.status == "True" && c.message.contains(says)
                })
        },
    )
    .await
    .unwrap();
    assert_eq!(seen.metadata.generation, Some(2));
    seen
}

/// An accepted request (a StorageClassChange of the etcd fixture), edited while it runs: the
/// edit is ignored with `SpecChangeIgnored` naming the field, `observedGeneration` follows, and
/// the migration ends `Successful` with the accepted spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_edit_after_acceptance_is_ignored_and_observed() {
    let (cluster, ns) = scenario("smr-admission-accepted").await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    e2e::testing::assert_claims_bound(&ns, SET, 3).await;
    let api = requests(&ns);
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    let class = cluster.wffc_storage_class.clone();
    create(
        &api,
        &request("move", move |s| {
            s["type"] = json!("StorageClassChange");
            s.as_object_mut().unwrap().remove("shrink");
            s["storageClassChange"] = json!({"storageClassName": class});
            s["database"] = json!({"engine": "Etcd"});
            s["timeout"] = json!("15m");
        }),
    )
    .await
    .unwrap();
    wait_status(&ns, "move", "progressing", Duration::from_secs(120), |s| {
        s.phase == Phase::Progressing
    })
    .await
    .unwrap();
    edit_timeout_and_see_it_ignored(
        &ns,
        "move",
        "1h",
        "spec.timeout differ from status.acceptedSpec",
    )
    .await;
    let done = wait_final(&ns, "move", Duration::from_secs(600))
        .await
        .unwrap();
    let status = done.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&done));
    assert_eq!(status.observed_generation, Some(2));
    assert_eq!(
        status.accepted_spec.map(|s| s.timeout).as_deref(),
        Some("15m"),
        "the accepted spec was kept"
    );
}
