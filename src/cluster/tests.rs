//! The executor against a mocked API server ([`super::mock`]): each action that deletes,
//! swaps or writes sends exactly the requests its contract (in `plan::action`) implies.

use http::Method;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::ClusterError;
use super::Retry;
use super::mock::{Exchange, execute};
use crate::api::{Phase, StorageMigrationRequestStatus};
use crate::labels;
use crate::plan::action::contract;
use crate::plan::fixtures::{self, NS, REQ};
use crate::plan::{Action, Kind, Object, Observed, Propagation};

const CLAIMS: &str = "/api/v1/namespaces/demo/persistentvolumeclaims";
const SETS: &str = "/apis/apps/v1/namespaces/demo/statefulsets";
const BUDGETS: &str = "/apis/policy/v1/namespaces/demo/poddisruptionbudgets";
const REQUESTS: &str = "/apis/storagemigrator.io/v1alpha1/namespaces/demo/storagemigrationrequests";

fn observed() -> Observed {
    fixtures::observed(fixtures::spec_class_change("fast"))
}

fn pv(name: &str) -> String {
    format!("/api/v1/persistentvolumes/{name}")
}

fn json_of<T: serde::Serialize>(obj: &T) -> Value {
    serde_json::to_value(obj).unwrap()
}

fn claim_json() -> Value {
    json_of(&fixtures::bound_claim(
        "data-etcd-0",
        "standard",
        "1Gi",
        "pv-old-0",
    ))
}

fn volume_json() -> Value {
    json_of(&fixtures::volume(
        "pv-old-0",
        "standard",
        "1Gi",
        "data-etcd-0",
        "node-a",
    ))
}

fn request_json(o: &Observed) -> Value {
    json_of(&o.request)
}

fn retry(r: Result<(), ClusterError>) -> Retry {
    r.expect_err("the action should fail").retry()
}

fn delete(kind: Kind, name: &str, propagation: Propagation, uid: Option<&str>) -> Action {
    Action::Delete {
        kind,
        name: name.into(),
        propagation,
        uid: uid.map(str::to_string),
        resource_version: None,
    }
}

#[tokio::test]
async fn delete_sends_the_uid_precondition_and_orphan_propagation() {
    let action = delete(
        Kind::StatefulSet,
        "etcd",
        Propagation::Orphan,
        Some("uid-etcd"),
    );
    let set = json_of(&fixtures::stateful_set(3));
    let expected = Exchange::new(Method::DELETE, &format!("{SETS}/etcd"))
        .json(json!({
            "propagationPolicy": "Orphan",
            "preconditions": {"uid": "uid-etcd"},
        }))
        .returns(set);
    execute(observed(), action, vec![expected]).await.unwrap();
}

#[tokio::test]
async fn delete_without_uid_sends_no_precondition() {
    let action = delete(Kind::Claim, "data-etcd-0", Propagation::Background, None);
    let expected = Exchange::new(Method::DELETE, &format!("{CLAIMS}/data-etcd-0"))
        .json(json!({"propagationPolicy": "Background"}))
        .returns(claim_json());
    execute(observed(), action, vec![expected]).await.unwrap();
}

#[tokio::test]
async fn delete_that_finds_nothing_or_a_successor_is_a_success() {
    let path = format!("{CLAIMS}/data-etcd-0");
    let action = delete(
        Kind::Claim,
        "data-etcd-0",
        Propagation::Background,
        Some("u"),
    );
    let gone = Exchange::new(Method::DELETE, &path).fails(404, "NotFound");
    execute(observed(), action.clone(), vec![gone])
        .await
        .unwrap();
    // A failed uid precondition: the object the planner meant is gone.
    let successor = Exchange::new(Method::DELETE, &path).fails(409, "Conflict");
    execute(observed(), action.clone(), vec![successor])
        .await
        .unwrap();
    let refused = Exchange::new(Method::DELETE, &path).fails(403, "Forbidden");
    let err = execute(observed(), action.clone(), vec![refused]).await;
    assert_eq!(retry(err), Retry::Permanent);
    let unavailable = Exchange::new(Method::DELETE, &path).fails(503, "ServiceUnavailable");
    let err = execute(observed(), action, vec![unavailable]).await;
    assert_eq!(retry(err), Retry::Transient);
}

#[tokio::test]
async fn patch_reclaim_policy_merges_one_field_and_a_missing_volume_is_a_success() {
    let action = Action::PatchReclaimPolicy {
        volume: "pv-old-0".into(),
        policy: "Retain".into(),
    };
    let patch = json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    let ok = Exchange::new(Method::PATCH, &pv("pv-old-0"))
        .merge_patch(patch.clone())
        .returns(volume_json());
    execute(observed(), action.clone(), vec![ok]).await.unwrap();
    let gone = Exchange::new(Method::PATCH, &pv("pv-old-0"))
        .merge_patch(patch)
        .fails(404, "NotFound");
    execute(observed(), action, vec![gone]).await.unwrap();
}

/// The volume a patch answers with is kept as its read (the watch's echo of the patch then
/// changes nothing); a read of it is not sent again.
#[tokio::test]
async fn a_patched_volume_is_kept_as_the_patch_answered_it() {
    let cache = std::sync::Arc::new(super::VolumeCache::default());
    let action = Action::PatchReclaimPolicy {
        volume: "pv-old-0".into(),
        policy: "Retain".into(),
    };
    let mut answered = volume_json();
    answered["metadata"]["name"] = json!("pv-old-0");
    answered["metadata"]["resourceVersion"] = json!("42");
    let ok = Exchange::new(Method::PATCH, &pv("pv-old-0")).returns(answered);
    let kept = cache.clone();
    super::mock::verify(vec![ok], move |cluster| async move {
        let cluster = cluster.with_volume_cache(kept);
        let engine: Result<super::Engine, String> = Err("no engine in this test".into());
        cluster
            .execute(&observed(), &engine, &action)
            .await
            .map(drop)
    })
    .await
    .unwrap();
    let volume = cache
        .get("pv-old-0")
        .and_then(|v| v.metadata.resource_version);
    assert_eq!(volume.as_deref(), Some("42"));
}

#[tokio::test]
async fn set_claim_ref_names_the_claim_and_clears_the_stale_binding() {
    let action = Action::SetClaimRef {
        volume: "pv-new-1".into(),
        claim: "data-etcd-0".into(),
    };
    let expected = Exchange::new(Method::PATCH, &pv("pv-new-1"))
        .merge_patch(json!({"spec": {"claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": NS,
            "name": "data-etcd-0",
            "uid": null,
            "resourceVersion": null,
            "fieldPath": null,
        }}}))
        .returns(volume_json());
    execute(observed(), action, vec![expected]).await.unwrap();
}

/// The same contract cases as the simulator's (`plan::action::contract`).
#[tokio::test]
async fn remove_owner_references_removes_exactly_the_listed_uids() {
    let path = format!("{CLAIMS}/data-etcd-0");
    for case in contract::remove_owner_references_cases() {
        let mut claim = claim_json();
        claim["metadata"]["resourceVersion"] = json!("42");
        claim["metadata"]["ownerReferences"] = json_of(&case.before);
        let mut exchanges = vec![Exchange::new(Method::GET, &path).returns(claim.clone())];
        if let Some(after) = &case.after {
            let kept = if after.is_empty() {
                Value::Null
            } else {
                json_of(after)
            };
            let patch = json!({"metadata": {"ownerReferences": kept, "resourceVersion": "42"}});
            exchanges.push(
                Exchange::new(Method::PATCH, &path)
                    .merge_patch(patch)
                    .returns(claim),
            );
        }
        let action = Action::RemoveOwnerReferences {
            claim: "data-etcd-0".into(),
            uids: case.uids.clone(),
        };
        let result = execute(observed(), action, exchanges).await;
        assert!(result.is_ok(), "{}: {result:?}", case.name);
    }
}

#[tokio::test]
async fn remove_owner_references_of_a_missing_claim_is_a_success_and_a_conflict_retried() {
    let path = format!("{CLAIMS}/data-etcd-0");
    let action = Action::RemoveOwnerReferences {
        claim: "data-etcd-0".into(),
        uids: vec!["uid-set".into()],
    };
    let gone = Exchange::new(Method::GET, &path).fails(404, "NotFound");
    execute(observed(), action.clone(), vec![gone])
        .await
        .unwrap();
    let mut claim = claim_json();
    claim["metadata"]["ownerReferences"] =
        json!([contract::owner("StatefulSet", "apps/v1", "uid-set")]);
    let exchanges = vec![
        Exchange::new(Method::GET, &path).returns(claim),
        Exchange::new(Method::PATCH, &path).fails(409, "Conflict"),
    ];
    let err = execute(observed(), action, exchanges).await;
    assert_eq!(retry(err), Retry::Transient);
}

#[tokio::test]
async fn patch_retention_policy_sends_the_policy_and_refuses_bad_json() {
    let action = Action::PatchRetentionPolicy {
        stateful_set: "etcd".into(),
        policy: r#"{"whenDeleted":"Retain","whenScaled":"Retain"}"#.into(),
    };
    let expected = Exchange::new(Method::PATCH, &format!("{SETS}/etcd"))
        .merge_patch(json!({"spec": {"persistentVolumeClaimRetentionPolicy": {
            "whenDeleted": "Retain",
            "whenScaled": "Retain",
        }}}))
        .returns(json_of(&fixtures::stateful_set(3)));
    execute(observed(), action, vec![expected]).await.unwrap();
    let bad = Action::PatchRetentionPolicy {
        stateful_set: "etcd".into(),
        policy: "{".into(),
    };
    let err = execute(observed(), bad, vec![]).await;
    assert_eq!(retry(err), Retry::Permanent);
}

#[tokio::test]
async fn create_of_a_claim_that_exists_is_a_success() {
    let claim = fixtures::bound_claim("data-etcd-0", "fast", "1Gi", "pv-new-1");
    let action = Action::Create(Object::Claim(Box::new(claim.clone())));
    let post = || Exchange::new(Method::POST, CLAIMS).json(json_of(&claim));
    let created = post().returns(json_of(&claim));
    execute(observed(), action.clone(), vec![created])
        .await
        .unwrap();
    let exists = post().fails(409, "AlreadyExists");
    execute(observed(), action.clone(), vec![exists])
        .await
        .unwrap();
    let invalid = post().fails(422, "Invalid");
    let err = execute(observed(), action, vec![invalid]).await;
    assert_eq!(retry(err), Retry::Permanent);
}

/// A StatefulSet of that name may be one someone else created: a 409 is not taken for ours.
#[tokio::test]
async fn create_of_a_stateful_set_that_exists_is_an_error() {
    let set = fixtures::manifest(fixtures::stateful_set(3));
    let action = Action::Create(Object::StatefulSet(Box::new(set.clone())));
    let post = || Exchange::new(Method::POST, SETS).json(set.raw().clone());
    let created = post().returns(set.raw().clone());
    execute(observed(), action.clone(), vec![created])
        .await
        .unwrap();
    let exists = post().fails(409, "AlreadyExists");
    let err = execute(observed(), action, vec![exists]).await;
    assert_eq!(retry(err), Retry::Transient);
}

#[tokio::test]
async fn set_status_applies_the_status_subresource_with_our_field_manager() {
    let o = observed();
    let status = StorageMigrationRequestStatus {
        phase: Phase::Progressing,
        message: Some("migrating".into()),
        ..Default::default()
    };
    let action = Action::SetStatus(Box::new(status.clone()));
    let mut stored = request_json(&o);
    stored["metadata"]["resourceVersion"] = json!("42");
    stored["status"] = json_of(&status);
    let expected = Exchange::new(Method::PATCH, &format!("{REQUESTS}/{REQ}/status"))
        .query(&format!(
            "&force=true&fieldManager={}",
            labels::FIELD_MANAGER
        ))
        .apply_patch(json!({
            "apiVersion": "storagemigrator.io/v1alpha1",
            "kind": "StorageMigrationRequest",
            "status": json_of(&status),
        }))
        .returns(stored);
    // The request as the API server stored it is returned (the next round may start from it).
    let written = super::mock::verify(vec![expected], {
        let (o, action) = (o.clone(), action.clone());
        move |cluster| async move {
            let engine = Err("no engine in this test".to_string());
            cluster.execute(&o, &engine, &action).await
        }
    })
    .await
    .unwrap()
    .expect("a status write returns the request");
    assert_eq!(written.metadata.resource_version.as_deref(), Some("42"));
    assert_eq!(written.status.map(|s| s.phase), Some(Phase::Progressing));
    let gone = Exchange::new(Method::PATCH, &format!("{REQUESTS}/{REQ}/status"))
        .query(&format!(
            "&force=true&fieldManager={}",
            labels::FIELD_MANAGER
        ))
        .fails(404, "NotFound");
    assert!(execute(o, action, vec![gone]).await.is_err());
}

/// A status write carries the resourceVersion the decision was made from; when the request
/// changed since (a deposed leader deciding on an old view, after the new leader wrote), the
/// API server refuses it with 409 and the write is `StaleStatus`: nothing written, decided again.
#[tokio::test]
async fn a_status_write_decided_on_a_stale_view_is_refused() {
    let mut o = observed();
    o.request.metadata.resource_version = Some("41".into());
    let status = StorageMigrationRequestStatus {
        phase: Phase::Progressing,
        message: Some("stopping etcd-0".into()),
        ..Default::default()
    };
    let action = Action::SetStatus(Box::new(status.clone()));
    let write = || {
        Exchange::new(Method::PATCH, &format!("{REQUESTS}/{REQ}/status"))
            .query(&format!(
                "&force=true&fieldManager={}",
                labels::FIELD_MANAGER
            ))
            .apply_patch(json!({
                "apiVersion": "storagemigrator.io/v1alpha1",
                "kind": "StorageMigrationRequest",
                "metadata": {"resourceVersion": "41"},
                "status": json_of(&status),
            }))
    };
    execute(
        o.clone(),
        action.clone(),
        vec![write().returns(request_json(&o))],
    )
    .await
    .unwrap();
    let refused = execute(o, action, vec![write().fails(409, "Conflict")]).await;
    match refused {
        Err(ClusterError::StaleStatus {
            request,
            resource_version,
        }) => {
            assert_eq!(request, format!("demo/{REQ}"));
            assert_eq!(resource_version, "41");
        }
        other => panic!("expected StaleStatus, got {other:?}"),
    }
}

#[tokio::test]
async fn add_finalizer_patches_the_request_as_read_with_its_resource_version() {
    let mut o = observed();
    o.request.metadata.resource_version = Some("7".into());
    o.request.metadata.finalizers = Some(vec!["other".into()]);
    let path = format!("{REQUESTS}/{REQ}");
    let exchanges = vec![
        Exchange::new(Method::GET, &path).returns(request_json(&o)),
        Exchange::new(Method::PATCH, &path)
            .merge_patch(json!({"metadata": {
                "finalizers": ["other", labels::FINALIZER],
                "resourceVersion": "7",
            }}))
            .returns(request_json(&o)),
    ];
    execute(o.clone(), Action::AddFinalizer, exchanges)
        .await
        .unwrap();
    // Already there: read, nothing written.
    let mut has = o.clone();
    has.request
        .finalizers_mut()
        .push(labels::FINALIZER.to_string());
    let read = Exchange::new(Method::GET, &path).returns(request_json(&has));
    execute(o.clone(), Action::AddFinalizer, vec![read])
        .await
        .unwrap();
    // Gone: nothing to do.
    let gone = Exchange::new(Method::GET, &path).fails(404, "NotFound");
    execute(o, Action::AddFinalizer, vec![gone]).await.unwrap();
}

#[tokio::test]
async fn remove_finalizer_keeps_the_other_finalizers() {
    let mut o = observed();
    o.request.metadata.resource_version = Some("8".into());
    o.request.metadata.finalizers = Some(vec![labels::FINALIZER.into(), "other".into()]);
    let path = format!("{REQUESTS}/{REQ}");
    let exchanges = vec![
        Exchange::new(Method::GET, &path).returns(request_json(&o)),
        Exchange::new(Method::PATCH, &path)
            .merge_patch(json!({"metadata": {
                "finalizers": ["other"],
                "resourceVersion": "8",
            }}))
            .fails(404, "NotFound"),
    ];
    execute(o.clone(), Action::RemoveFinalizer, exchanges)
        .await
        .unwrap();
    let conflict = vec![
        Exchange::new(Method::GET, &path).returns(request_json(&o)),
        Exchange::new(Method::PATCH, &path).fails(409, "Conflict"),
    ];
    let err = execute(o, Action::RemoveFinalizer, conflict).await;
    assert_eq!(retry(err), Retry::Transient);
}

#[tokio::test]
async fn label_volume_and_annotate_claim_are_merge_patches() {
    let label = Action::LabelVolume {
        volume: "pv-old-0".into(),
    };
    let expected = Exchange::new(Method::PATCH, &pv("pv-old-0"))
        .merge_patch(json!({"metadata": {"labels": {labels::MIGRATED_BY_LABEL: REQ}}}))
        .returns(volume_json());
    execute(observed(), label, vec![expected]).await.unwrap();
    let annotate = Action::AnnotateClaim {
        claim: "data-etcd-0".into(),
        key: "k".into(),
        value: None,
    };
    let expected = Exchange::new(Method::PATCH, &format!("{CLAIMS}/data-etcd-0"))
        .merge_patch(json!({"metadata": {"annotations": {"k": null}}}))
        .fails(404, "NotFound");
    execute(observed(), annotate, vec![expected]).await.unwrap();
}

fn stash_config_map_json(uid_label: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "move-stash", "namespace": "demo", "uid": "uid-cm", "resourceVersion": "12",
        "labels": {labels::REQUEST_LABEL: REQ, labels::REQUEST_UID_LABEL: uid_label},
    }})
}

#[tokio::test]
async fn stash_checks_the_config_maps_uid_label_then_patches_with_its_version() {
    let action = Action::Stash {
        config_map: "move-stash".into(),
        key: "pod-etcd-0".into(),
        value: "encoded".into(),
    };
    let cms = "/api/v1/namespaces/demo/configmaps";
    let ours = format!("uid-{REQ}");
    let exchanges = vec![
        Exchange::new(Method::GET, &format!("{cms}/move-stash"))
            .returns(stash_config_map_json(&ours)),
        Exchange::new(Method::PATCH, &format!("{cms}/move-stash"))
            .merge_patch(json!({
                "metadata": {"resourceVersion": "12"},
                "data": {"pod-etcd-0": "encoded"},
            }))
            .returns(stash_config_map_json(&ours)),
    ];
    execute(observed(), action.clone(), exchanges)
        .await
        .unwrap();
    // Another request's ConfigMap (an earlier one of the same name): nothing written.
    let exchanges = vec![
        Exchange::new(Method::GET, &format!("{cms}/move-stash"))
            .returns(stash_config_map_json("uid-earlier")),
    ];
    let err = execute(observed(), action.clone(), exchanges).await;
    assert!(matches!(err, Err(ClusterError::Invalid { .. })), "{err:?}");
    // None at all: an error too (it is created by its own action first).
    let exchanges =
        vec![Exchange::new(Method::GET, &format!("{cms}/move-stash")).fails(404, "NotFound")];
    let err = execute(observed(), action, exchanges).await;
    assert!(matches!(err, Err(ClusterError::Invalid { .. })), "{err:?}");
}

#[tokio::test]
async fn transfer_leadership_without_an_engine_fails_without_a_request() {
    let action = Action::TransferLeadership {
        from: "etcd-0".into(),
        to: "etcd-1".into(),
    };
    let err = execute(observed(), action, vec![]).await;
    assert!(matches!(err, Err(ClusterError::Engine(_))));
}

/// Every read of a gather in Preflight of a StatefulSet's request (the fixture `observed`), with
/// its answer.
fn everything_gathered(o: &Observed) -> Vec<Exchange> {
    let list = list_of;
    let mut pod = json_of(&fixtures::member_pod(0));
    pod["metadata"]["annotations"] = json!({"unknown.example.com/kept": "yes"});
    pod["spec"]["someFutureField"] = json!({"kept": true});
    let mut helper = json_of(&fixtures::member_pod(1));
    helper["metadata"]["name"] = json!("mounter-etcd-1");
    helper["metadata"]["labels"] = json!({labels::REQUEST_LABEL: REQ, "app": "etcd"});
    let mut other = request_json(o);
    other["metadata"]["name"] = json!("other");
    let mut stash = stash_config_map_json(&format!("uid-{REQ}"));
    stash["data"] = json!({"statefulset": "not base64!"});
    let podless_job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "move-etcd-0-copy", "namespace": "demo"},
        "spec": {"template": {"spec": {"containers": []}}},
    });
    let failed_create = |message: &str, at: &str| {
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("e-{at}"), "namespace": "demo"},
            "involvedObject": {"kind": "Job", "name": "move-etcd-0-copy"},
            "reason": "FailedCreate", "message": message, "lastTimestamp": at,
        })
    };
    let owned = owned_query();
    let mut backup = pod.clone();
    backup["metadata"]["name"] = json!("backup-1");
    backup["metadata"]["labels"] = json!({});
    let helper_too = helper.clone();
    let exchanges = vec![
        Exchange::new(Method::GET, &format!("{SETS}/etcd"))
            .returns(json_of(&fixtures::stateful_set(3))),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/configmaps/move-stash").returns(stash),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/pods")
            .query("&labelSelector=app%3Detcd")
            .returns(list(vec![pod.clone(), helper.clone()])),
        Exchange::new(Method::GET, "/apis/batch/v1/namespaces/demo/jobs")
            .query(&format!("&{owned}"))
            .returns(list(vec![podless_job])),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/pods")
            .query(&format!("&{owned}"))
            .returns(list(vec![helper])),
        // A running Job without a pod: why its pods are refused.
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/events")
            .query("&fieldSelector=involvedObject.kind%3DJob%2CinvolvedObject.name%3Dmove-etcd-0-copy%2Creason%3DFailedCreate")
            .returns(list(vec![
                failed_create("older", "2026-01-01T00:00:00Z"),
                failed_create("exceeded quota: q", "2026-01-01T00:01:00Z"),
            ])),
        Exchange::new(Method::GET, CLAIMS).returns(list(vec![claim_json()])),
        Exchange::new(Method::GET, &pv("pv-old-0")).returns(volume_json()),
        Exchange::new(Method::GET, "/apis/storage.k8s.io/v1/storageclasses")
            .returns(list(vec![json_of(&fixtures::class("fast", "Immediate"))])),
        Exchange::new(Method::GET, REQUESTS).returns(list(vec![request_json(o), other])),
        // In Preflight only: the namespace, for its Pod Security level.
        Exchange::new(Method::GET, "/api/v1/namespaces/demo").returns(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "demo", "labels": {labels::POD_SECURITY_ENFORCE_LABEL: "baseline"}},
        })),
        // In Preflight and Migrating: the PodDisruptionBudgets (policy/v1).
        Exchange::new(Method::GET, BUDGETS).returns(budget_list()),
        // In Preflight (and during a member's copy): every pod, for who mounts which claim.
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/pods")
            .returns(list(vec![pod.clone(), backup, helper_too])),
    ];
    exchanges
}

/// Gathering reads exactly these, each once, concurrently where they do not depend on each
/// other (so in any order here): the set (raw), its member pods by its selector, our Jobs and
/// helper pods, the claims and their volumes, the classes, the other requests, and (in
/// Preflight) the namespace and the PodDisruptionBudgets; the FailedCreate Events of a running
/// Job that has no pod.
#[tokio::test]
async fn gather_reads_everything_the_planner_needs() {
    let o = observed();
    let exchanges = everything_gathered(&o);
    let request = o.request.clone();
    let observed = super::mock::verify_unordered(exchanges, move |cluster| async move {
        let engine = Err("no engine in this test".to_string());
        cluster.gather(request, &engine).await
    })
    .await
    .unwrap();
    assert_eq!(observed.pods.keys().collect::<Vec<_>>(), ["etcd-0"]);
    assert_eq!(
        observed.pods["etcd-0"].raw()["spec"]["someFutureField"],
        json!({"kept": true})
    );
    assert_eq!(
        observed.helper_pods.keys().collect::<Vec<_>>(),
        ["mounter-etcd-1"]
    );
    assert_eq!(
        observed.jobs["move-etcd-0-copy"].refused.as_deref(),
        Some("exceeded quota: q"),
        "the newest FailedCreate message"
    );
    assert_eq!(observed.claims.keys().collect::<Vec<_>>(), ["data-etcd-0"]);
    assert_eq!(observed.volumes.keys().collect::<Vec<_>>(), ["pv-old-0"]);
    assert_eq!(
        observed.storage_classes.keys().collect::<Vec<_>>(),
        ["fast"]
    );
    let others: Vec<_> = observed
        .other_requests
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(others, ["other"]);
    assert_eq!(
        observed.namespace_labels[labels::POD_SECURITY_ENFORCE_LABEL],
        "baseline"
    );
    let budgets: Vec<_> = observed.budgets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(budgets, ["etcd-pdb"]);
    assert_eq!(
        observed.health,
        Err(crate::engine::HealthUnavailable::NoEngine(
            "no engine in this test".to_string()
        ))
    );
    assert_eq!(observed.final_hash, None);
    // The member and the backup pod mount the member's claim; our helper does not count.
    let users: Vec<_> = observed.claim_users.iter().collect();
    assert_eq!(
        users,
        [(
            &"data-etcd-0".to_string(),
            &vec!["backup-1".to_string(), "etcd-0".to_string()]
        )],
        "{:?}",
        observed.claim_users
    );
    // The stash ConfigMap is read (whatever the status says) and its entries checked.
    assert!(matches!(
        observed.stash.object,
        crate::plan::StashObject::Ours { .. }
    ));
    assert!(observed.stash.stateful_set.is_none());
    assert_eq!(
        observed.stash.errors.len(),
        1,
        "{:?}",
        observed.stash.errors
    );
}

/// When several of the first reads fail (here every one: a service account without RBAC), the
/// gather reports the StatefulSet's, whichever answer came first: the error a user sees does
/// not depend on a race. The answers come in the reverse order of the requests.
#[tokio::test]
async fn gather_reports_the_first_failed_read_in_a_fixed_order() {
    let o = observed();
    let owned = owned_query();
    let exchanges = vec![
        Exchange::new(Method::GET, &format!("{SETS}/etcd")).fails(403, "Forbidden"),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/configmaps/move-stash")
            .fails(403, "Forbidden"),
        Exchange::new(Method::GET, "/apis/batch/v1/namespaces/demo/jobs")
            .query(&format!("&{owned}"))
            .fails(403, "Forbidden"),
        Exchange::new(Method::GET, CLAIMS).fails(403, "Forbidden"),
        Exchange::new(Method::GET, "/apis/storage.k8s.io/v1/storageclasses")
            .fails(403, "Forbidden"),
    ];
    let request = o.request.clone();
    let order = super::mock::Order::LastFirst;
    let result = super::mock::verify_in(order, exchanges, move |cluster| async move {
        let engine = Err("no engine in this test".to_string());
        cluster.gather(request, &engine).await
    })
    .await;
    let err = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.starts_with("get StatefulSet demo/etcd"), "{err}");
}

/// A list answer of `items`.
fn list_of(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items})
}

/// The copy Job of member etcd-0, with `status`.
fn copy_job(status: Value) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "etcd-0-copy-abc123", "namespace": NS,
        "labels": {labels::REQUEST_LABEL: REQ, labels::JOB_KIND_LABEL: "copy"},
    }, "status": status})
}

/// The pod of [`copy_job`], with `status`.
fn copy_pod(status: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "etcd-0-copy-abc123-xyz", "namespace": NS,
        "labels": {labels::REQUEST_LABEL: REQ, "job-name": "etcd-0-copy-abc123"},
    }, "status": status})
}

/// The reads of a gather of [`observed`] that finds our Job `job` and, at each list of our
/// helper pods in turn, one of `pods`; `more` (a log read) among them.
fn job_gather(job: Value, pods: Vec<Value>, more: Vec<Exchange>) -> Vec<Exchange> {
    let owned = format!("&{}", owned_query());
    let mut exchanges = vec![
        Exchange::new(Method::GET, &format!("{SETS}/etcd")).fails(404, "NotFound"),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/configmaps/move-stash")
            .fails(404, "NotFound"),
        Exchange::new(Method::GET, "/apis/batch/v1/namespaces/demo/jobs")
            .query(&owned)
            .returns(list_of(vec![job])),
    ];
    exchanges.extend(pods.into_iter().map(|pod| {
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/pods")
            .query(&owned)
            .returns(list_of(vec![pod]))
    }));
    exchanges.extend(more);
    exchanges.extend([
        Exchange::new(Method::GET, CLAIMS).returns(list_of(vec![])),
        Exchange::new(Method::GET, "/apis/storage.k8s.io/v1/storageclasses")
            .returns(list_of(vec![])),
        Exchange::new(Method::GET, REQUESTS).returns(list_of(vec![])),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo").returns(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"},
        })),
        Exchange::new(Method::GET, BUDGETS).returns(budget_list()),
        Exchange::new(Method::GET, "/api/v1/namespaces/demo/pods").returns(list_of(vec![])),
    ]);
    exchanges
}

/// The gather of [`observed`] against `exchanges`, in any order.
async fn gather_unordered(exchanges: Vec<Exchange>) -> Result<Observed, ClusterError> {
    let request = observed().request;
    super::mock::verify_unordered(exchanges, move |cluster| async move {
        let engine = Err("no engine in this test".to_string());
        cluster.gather(request, &engine).await
    })
    .await
}

/// A Job seen ended while the helper pods listed do not show its pod's end (a list kept from
/// before, `read_cache`): the pods are listed again, and the Job's result read from them.
#[tokio::test]
async fn gather_lists_the_helper_pods_again_when_a_job_ended_after_them() {
    let job = copy_job(json!({"conditions": [{"type": "Complete", "status": "True"}]}));
    let pod = |state: Value| {
        copy_pod(
            json!({"containerStatuses": [{"name": "mover", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0, "state": state}]}),
        )
    };
    let running = pod(json!({"running": {}}));
    let ended = pod(json!({"terminated": {"exitCode": 0, "message": "{\"bytes\": 7}"}}));
    let exchanges = job_gather(job, vec![running, ended], Vec::new());
    let observed = gather_unordered(exchanges).await.unwrap();
    let outcome = &observed.jobs["etcd-0-copy-abc123"].outcome;
    let message = Some("{\"bytes\": 7}".to_string());
    assert_eq!(outcome, &crate::plan::JobOutcome::Succeeded { message });
}

/// A running copy Job's progress is read from the tail of its running pod's log; a log that
/// cannot be read gives no reading and no error.
#[tokio::test]
async fn gather_reads_a_running_copys_progress_from_its_log() {
    let log = "/api/v1/namespaces/demo/pods/etcd-0-copy-abc123-xyz/log";
    let gather = |answer: Exchange| {
        let (job, pod) = (copy_job(json!({})), copy_pod(json!({"phase": "Running"})));
        gather_unordered(job_gather(job, vec![pod], vec![answer]))
    };
    let tail = "&container=mover&tailLines=40";
    let text =
        "    512  25%  1.00kB/s  0:00:01\r\n  1,024  50%  1.00kB/s  0:00:01 (xfr#1, to-chk=1/4)\n";
    let read = Exchange::new(Method::GET, log)
        .query(tail)
        .returns_text(text);
    let observed = gather(read).await.unwrap();
    let progress = observed.jobs["etcd-0-copy-abc123"]
        .progress
        .clone()
        .unwrap();
    assert_eq!(progress.pass, crate::api::CopyPass::Copy);
    assert_eq!((progress.bytes_done, progress.percent), (1024, 50));
    assert_eq!(
        (progress.files_done, progress.files_total),
        (Some(3), Some(4))
    );
    let refused = Exchange::new(Method::GET, log)
        .query(tail)
        .fails(500, "InternalError");
    let observed = gather(refused).await.unwrap();
    assert_eq!(observed.jobs["etcd-0-copy-abc123"].progress, None);
}

#[tokio::test]
async fn delete_with_a_resource_version_sends_both_preconditions_and_a_conflict_is_an_error() {
    let action = Action::Delete {
        kind: Kind::StatefulSet,
        name: "etcd".into(),
        propagation: Propagation::Orphan,
        uid: Some("uid-etcd".into()),
        resource_version: Some("42".into()),
    };
    let path = format!("{SETS}/etcd");
    let set = json_of(&fixtures::stateful_set(3));
    let expected = Exchange::new(Method::DELETE, &path)
        .json(json!({
            "propagationPolicy": "Orphan",
            "preconditions": {"uid": "uid-etcd", "resourceVersion": "42"},
        }))
        .returns(set);
    execute(observed(), action.clone(), vec![expected])
        .await
        .unwrap();
    // Changed since (or replaced): not a success, the next reconcile looks again.
    let changed = Exchange::new(Method::DELETE, &path).fails(409, "Conflict");
    let err = execute(observed(), action.clone(), vec![changed]).await;
    assert_eq!(retry(err), Retry::Transient);
    // Gone: a success.
    let gone = Exchange::new(Method::DELETE, &path).fails(404, "NotFound");
    execute(observed(), action, vec![gone]).await.unwrap();
}

/// The namespace's PodDisruptionBudgets as `policy/v1` lists them: one on `app=etcd` that
/// allows no disruption.
fn budget_list() -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList",
    "metadata": {}, "items": [{
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "etcd-pdb", "namespace": "demo", "generation": 2},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "etcd"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 3, "desiredHealthy": 3,
                   "expectedPods": 3, "observedGeneration": 2},
    }]})
}

/// PodDisruptionBudgets are read through `policy/v1`, in Preflight and while migrating only
/// (not in another stage, nor once the request ended), each time they are needed.
#[tokio::test]
async fn budgets_are_read_through_policy_v1_in_preflight_and_before_a_member_stops() {
    use crate::api::{MemberStatus, MemberStep, Stage};
    let exchanges = vec![
        Exchange::new(Method::GET, BUDGETS).returns(budget_list()),
        Exchange::new(Method::GET, BUDGETS).returns(budget_list()),
    ];
    let got = super::mock::verify(exchanges, |cluster| async move {
        let mut status = StorageMigrationRequestStatus {
            stage: Stage::Finalizing,
            ..Default::default()
        };
        let mut got = vec![cluster.budgets(NS, &status).await.unwrap()];
        status.stage = Stage::Preflight;
        got.push(cluster.budgets(NS, &status).await.unwrap());
        status.stage = Stage::Migrating;
        status.members = vec![MemberStatus {
            pod: "etcd-0".into(),
            step: MemberStep::GatingStop,
            ..Default::default()
        }];
        got.push(cluster.budgets(NS, &status).await.unwrap());
        status.phase = Phase::Failed;
        got.push(cluster.budgets(NS, &status).await.unwrap());
        status.phase = Phase::Progressing;
        status.members[0].step = MemberStep::Copying;
        got.push(cluster.budgets(NS, &status).await.unwrap());
        got
    })
    .await;
    assert!(got[0].is_empty(), "not read while finalizing");
    assert!(got[3].is_empty(), "not read once the request ended");
    assert!(got[4].is_empty(), "not read while the member copies");
    for read in &got[1..3] {
        let [b] = read.as_slice() else {
            panic!("one budget: {read:?}");
        };
        assert_eq!((b.name.as_str(), b.generation), ("etcd-pdb", Some(2)));
        assert_eq!(b.rule, "minAvailable 3");
        assert!(b.refusal().unwrap().contains("allows 0 disruptions"));
    }
}

/// A refused list of PodDisruptionBudgets is an error like any other read's (a 404 is not a
/// cluster without budgets: every supported version serves `policy/v1`).
#[tokio::test]
async fn a_refused_list_of_budgets_is_an_error() {
    use crate::api::Stage;
    for (code, reason, expected) in [
        (404, "NotFound", Retry::Permanent),
        (403, "Forbidden", Retry::Permanent),
        (503, "ServiceUnavailable", Retry::Transient),
    ] {
        let exchanges = vec![Exchange::new(Method::GET, BUDGETS).fails(code, reason)];
        let got = super::mock::verify(exchanges, |cluster| async move {
            let status = StorageMigrationRequestStatus {
                stage: Stage::Migrating,
                members: vec![crate::api::MemberStatus {
                    pod: "etcd-0".into(),
                    step: crate::api::MemberStep::StoppingPod,
                    ..Default::default()
                }],
                ..Default::default()
            };
            cluster.budgets(NS, &status).await
        })
        .await;
        let err = got.expect_err(reason);
        assert_eq!(err.refused_call(), Some("list PodDisruptionBudgets"));
        assert_eq!(err.retry(), expected, "{reason}");
    }
}

/// The StorageClasses are read in Preflight and while the member in flight makes its temporary
/// claim, the namespace's other requests in Preflight only: a round of a member's copy or claim
/// swap reads neither.
#[tokio::test]
async fn classes_and_other_requests_are_read_only_where_the_planner_looks_at_them() {
    use crate::api::{MemberStatus, MemberStep, Stage};
    use crate::plan::observe::Workload;
    const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";
    let empty = json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []});
    let exchanges = vec![
        Exchange::new(Method::GET, CLASSES).returns(empty.clone()),
        Exchange::new(Method::GET, REQUESTS).returns(empty.clone()),
        Exchange::new(Method::GET, CLASSES).returns(empty),
    ];
    let read = super::mock::verify(exchanges, |cluster| async move {
        let workload = Workload::StatefulSet("etcd".into());
        let mut status = StorageMigrationRequestStatus::default();
        let mut reads = Vec::new();
        for step in [
            None,
            Some(MemberStep::CreatingClaim),
            Some(MemberStep::Copying),
        ] {
            if let Some(step) = step {
                status.stage = Stage::Migrating;
                let pod = "etcd-0".to_string();
                status.members = vec![MemberStatus {
                    pod,
                    step,
                    ..Default::default()
                }];
            }
            let classes = cluster.storage_classes(&status).await.is_ok();
            let others = cluster
                .other_requests(NS, REQ, &workload, &status)
                .await
                .is_ok();
            reads.push((classes, others));
        }
        reads
    })
    .await;
    assert_eq!(read, [(true, true), (true, true), (true, true)]);
}

/// A round decided again after a status write gathers on the answers of the round before
/// (`replay`): the same snapshot, with no request sent but the volume's (volumes are never
/// replayed: their cache is fed by a watch).
#[tokio::test]
async fn a_replayed_gather_builds_the_same_snapshot_reading_only_the_volumes() {
    use super::replay::{Answers, Mode};
    let o = observed();
    let answers = Answers::new();
    let gather = |mode: Mode| {
        let (answers, request) = (answers.clone(), o.request.clone());
        move |cluster: super::Cluster| async move {
            let reading = cluster.reading_through(answers.client(cluster.client.clone(), mode));
            let engine = Err("no engine in this test".to_string());
            reading.gather(request, &engine).await
        }
    };
    let recorded = super::mock::verify_unordered(everything_gathered(&o), gather(Mode::Record))
        .await
        .unwrap();
    let kept = answers.len();
    assert_eq!(
        kept,
        everything_gathered(&o).len() - 1,
        "all but the volume"
    );
    let volume = Exchange::new(Method::GET, &pv("pv-old-0")).returns(volume_json());
    let replayed = super::mock::verify(vec![volume], gather(Mode::Replay))
        .await
        .unwrap();
    assert_eq!(answers.len(), kept);
    let names = |o: &Observed| {
        (
            o.pods.keys().cloned().collect::<Vec<_>>(),
            o.helper_pods.keys().cloned().collect::<Vec<_>>(),
            o.jobs.keys().cloned().collect::<Vec<_>>(),
            o.claims.keys().cloned().collect::<Vec<_>>(),
            o.volumes.keys().cloned().collect::<Vec<_>>(),
            o.storage_classes.keys().cloned().collect::<Vec<_>>(),
            o.budgets.iter().map(|b| b.name.clone()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(names(&replayed), names(&recorded));
    assert_eq!(replayed.claim_users, recorded.claim_users);
    assert_eq!(replayed.namespace_labels, recorded.namespace_labels);
    assert_eq!(
        replayed.pods["etcd-0"].raw(),
        recorded.pods["etcd-0"].raw(),
        "the raw JSON as returned"
    );
    assert_eq!(
        replayed.jobs["move-etcd-0-copy"].refused,
        recorded.jobs["move-etcd-0-copy"].refused
    );
    assert_eq!(replayed.stash.errors.len(), recorded.stash.errors.len());
    assert!(
        replayed.now >= recorded.now,
        "the snapshot's time is the replay's"
    );
}

/// A replayed round reads what the status it decides on asks for and the round before did
/// not read (here the budgets, read before a member stops but not while it copies), and keeps
/// that answer too; a read the API server refused is never kept.
#[tokio::test]
async fn a_replayed_round_reads_what_the_round_before_did_not() {
    use super::replay::{Answers, Mode};
    use crate::api::{MemberStatus, MemberStep, Stage};
    let answers = Answers::new();
    let exchanges = vec![
        Exchange::new(Method::GET, BUDGETS).fails(503, "ServiceUnavailable"),
        Exchange::new(Method::GET, BUDGETS).returns(budget_list()),
    ];
    let status = |step| StorageMigrationRequestStatus {
        stage: Stage::Migrating,
        members: vec![MemberStatus {
            pod: "etcd-0".into(),
            step,
            ..Default::default()
        }],
        ..Default::default()
    };
    let reads = super::mock::verify(exchanges, {
        let answers = answers.clone();
        move |cluster| async move {
            let replaying =
                cluster.reading_through(answers.client(cluster.client.clone(), Mode::Replay));
            let copying = replaying.budgets(NS, &status(MemberStep::Copying)).await;
            let refused = replaying.budgets(NS, &status(MemberStep::GatingStop)).await;
            let read = replaying.budgets(NS, &status(MemberStep::GatingStop)).await;
            let replayed = replaying
                .budgets(NS, &status(MemberStep::StoppingPod))
                .await;
            (copying, refused, read, replayed)
        }
    })
    .await;
    let (copying, refused, read, replayed) = reads;
    assert!(
        copying.unwrap().is_empty(),
        "not read while the member copies"
    );
    assert_eq!(refused.unwrap_err().retry(), Retry::Transient);
    let (read, replayed) = (read.unwrap(), replayed.unwrap());
    assert_eq!(read.len(), 1);
    assert_eq!(
        replayed, read,
        "answered from the kept answer, no request sent"
    );
    assert_eq!(answers.len(), 1);
}

/// A read the API server answered 404 (a StatefulSet orphan-deleted mid-migration) is
/// replayed as 404: the replayed round sees it absent too, with no request sent.
#[tokio::test]
async fn a_not_found_answer_is_replayed_as_not_found() {
    use super::replay::{Answers, Mode};
    use k8s_openapi::api::apps::v1::StatefulSet;
    let answers = Answers::new();
    let exchanges =
        vec![Exchange::new(Method::GET, &format!("{SETS}/etcd")).fails(404, "NotFound")];
    let (read, replayed) = super::mock::verify(exchanges, {
        let answers = answers.clone();
        move |cluster| async move {
            let recording = answers.client(cluster.client.clone(), Mode::Record);
            let replaying = answers.client(cluster.client.clone(), Mode::Replay);
            let sets = |c: kube::Client| kube::Api::<StatefulSet>::namespaced(c, NS);
            let read = sets(recording).get_opt("etcd").await;
            let replayed = sets(replaying).get_opt("etcd").await;
            (read, replayed)
        }
    })
    .await;
    assert!(matches!(read, Ok(None)), "{read:?}");
    assert!(matches!(replayed, Ok(None)), "{replayed:?}");
    assert_eq!(answers.len(), 1);
}

/// The query of the lists of what the operator created for request `REQ`.
fn owned_query() -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("labelSelector", &labels::owned_selector(REQ))
        .finish()
}
