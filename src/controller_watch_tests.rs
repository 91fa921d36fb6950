//! The controller's watches against a mocked API server: which objects it lists and watches, in
//! which scope, with which selector, and as full objects or as metadata only. Pinned: a change
//! here changes what the operator costs on a large cluster (issue 30).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::json;

use super::{Context, METADATA_PAGE, watch_scope};
use crate::image::ImageRef;
use crate::metrics::Metrics;
use crate::plan::Settings;
use crate::scope::WatchScope;

/// One call as the API server sees it: method, path, query, and its Accept header.
type Call = (String, String, String, String);

fn call(r: &Request<Body>) -> Call {
    let accept = r.headers().get(http::header::ACCEPT);
    let accept = accept.and_then(|a| a.to_str().ok()).unwrap_or_default();
    let uri = r.uri();
    let query = uri.query().unwrap_or_default().to_string();
    (
        r.method().to_string(),
        uri.path().into(),
        query,
        accept.into(),
    )
}

fn list(metadata: bool) -> Response<Body> {
    let kind = if metadata {
        "PartialObjectMetadataList"
    } else {
        "List"
    };
    let body = json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "7"}, "items": []});
    Response::builder()
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

/// The first `n` calls of the controllers of `scope`: lists answered empty, watches held open;
/// then none for half a second.
async fn first_calls(scope: WatchScope, n: usize) -> BTreeSet<Call> {
    let (service, mut server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let image = ImageRef::parse("registry.example/storage-migrator:1").unwrap();
    let settings = Settings::new(image);
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings,
        Arc::new(Metrics::new()),
    ));
    let task = tokio::spawn(async move { watch_scope(client, &scope, ctx).await });
    let (mut calls, mut held) = (BTreeSet::new(), Vec::new());
    while calls.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(5), server.next_request()).await;
        let Ok(Some((request, send))) = next else {
            panic!("{} calls, then none: {calls:#?}", calls.len());
        };
        let c = call(&request);
        if c.2.contains("watch=true") {
            held.push(send);
        } else {
            send.send_response(list(c.3.contains("PartialObjectMetadata")));
        }
        assert!(calls.insert(c.clone()), "called twice: {c:?}");
    }
    let more = tokio::time::timeout(Duration::from_millis(500), server.next_request()).await;
    if let Ok(Some((request, _))) = more {
        panic!("a call more than the {n} expected: {:?}", call(&request));
    }
    task.abort();
    calls
}

/// What a list and a watch of metadata only accept (`PartialObjectMetadataList`, then one
/// `PartialObjectMetadata` per event); lists and watches of full objects send no Accept header.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
const METADATA_WATCH: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// Every kind listed then watched from `rv` 7: the requests in full; our Jobs (by our label) in
/// full, for their conditions (`job_changes`); pods, claims, volumes, StatefulSets,
/// PodDisruptionBudgets, StorageClasses and our ConfigMaps (by our label) as metadata.
fn expected(prefix: &str) -> BTreeSet<Call> {
    let mut calls = expected_in(prefix);
    // Volumes and StorageClasses are cluster-scoped: watched across the cluster whatever the
    // scope, once.
    add(&mut calls, "/api/v1/persistentvolumes".into(), "", true);
    add(
        &mut calls,
        "/apis/storage.k8s.io/v1/storageclasses".into(),
        "",
        true,
    );
    calls
}

/// A list, then a watch from `rv` 7, of `path`; the metadata watches list [`METADATA_PAGE`]
/// objects a page, the others kube-runtime's default 500.
fn add(calls: &mut BTreeSet<Call>, path: String, selector: &str, metadata: bool) {
    let amp = if selector.is_empty() { "" } else { "&" };
    let limit = match metadata {
        true => METADATA_PAGE,
        false => 500,
    };
    let list = format!("{amp}{selector}&limit={limit}");
    let watch = format!(
        "&watch=true&timeoutSeconds={}{amp}{selector}&allowWatchBookmarks=true&resourceVersion=7",
        crate::cluster::WATCH_TIMEOUT_SECS
    );
    let (l, w) = match metadata {
        true => (METADATA_LIST, METADATA_WATCH),
        false => ("", ""),
    };
    calls.insert(("GET".into(), path.clone(), list, l.into()));
    calls.insert(("GET".into(), path, watch, w.into()));
}

/// The calls of one namespace's controller (`prefix`: `/namespaces/NS`, or empty for all).
fn expected_in(prefix: &str) -> BTreeSet<Call> {
    let ours = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dstorage-migrator";
    let all = [
        (
            "/apis/storagemigrator.io/v1alpha1",
            "storagemigrationrequests",
            "",
            false,
        ),
        ("/apis/batch/v1", "jobs", ours, false),
        ("/api/v1", "pods", "", true),
        ("/api/v1", "persistentvolumeclaims", "", true),
        ("/apis/apps/v1", "statefulsets", "", true),
        ("/apis/policy/v1", "poddisruptionbudgets", "", true),
        ("/api/v1", "configmaps", ours, true),
    ];
    let mut calls = BTreeSet::new();
    for (group, kind, selector, metadata) in all {
        add(
            &mut calls,
            format!("{group}{prefix}/{kind}"),
            selector,
            metadata,
        );
    }
    calls
}

fn namespaces(names: &[&str]) -> WatchScope {
    WatchScope::parse(names).unwrap()
}

#[tokio::test]
async fn a_namespace_is_watched_in_it_pods_claims_and_volumes_as_metadata_only() {
    let calls = first_calls(namespaces(&["demo"]), 18).await;
    assert_eq!(calls, expected("/namespaces/demo"));
}

#[tokio::test]
async fn every_namespace_is_watched_in_one_call_per_kind() {
    let calls = first_calls(WatchScope::All, 18).await;
    assert_eq!(calls, expected(""));
}

#[tokio::test]
async fn watched_namespaces_share_one_watch_of_the_volumes() {
    let calls = first_calls(namespaces(&["a", "b", "c"]), 46).await;
    let mut want = expected("/namespaces/a");
    want.extend(expected_in("/namespaces/b"));
    want.extend(expected_in("/namespaces/c"));
    assert_eq!(calls, want);
}

/// A failed list of the requests is retried after a growing delay (the controller's backoff of
/// its triggers), not at once in a loop: an API server that fails them (during an upgrade, a
/// CRD being replaced) would otherwise get a list call per round trip, and the log an error each.
/// The request copies kept from round to round are void from the first failure on: the request
/// may be deleted or edited while the list fails.
#[tokio::test(start_paused = true)]
async fn a_failing_list_of_the_requests_is_retried_after_a_backoff_and_voids_kept_copies() {
    let (service, mut server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let settings = Settings::new(ImageRef::parse("registry.example/storage-migrator:1").unwrap());
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings,
        Arc::new(Metrics::new()),
    ));
    // A copy of a request kept from before the failure (the request could be deleted while
    // the list fails).
    let kept: super::Key = kube::runtime::reflector::ObjectRef::new("r").within("demo");
    let seen = ctx.kept().count(&kept);
    let request = crate::plan::fixtures::request(crate::plan::fixtures::spec_shrink("1Gi"));
    ctx.kept().keep(&kept, request, seen);
    let scope = namespaces(&["demo"]);
    let watching = ctx.clone();
    let task = tokio::spawn(async move { watch_scope(client, &scope, watching).await });
    let window = Duration::from_secs(30);
    let end = tokio::time::Instant::now() + window;
    let (mut request_lists, mut held) = (0, Vec::new());
    while request_lists <= 100 {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        let Ok(Some((request, send))) = tokio::time::timeout(left, server.next_request()).await
        else {
            break;
        };
        let c = call(&request);
        if c.2.contains("watch=true") {
            held.push(send);
        } else if c.1.ends_with("/storagemigrationrequests") {
            request_lists += 1;
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "etcdserver: leader changed", "reason": "InternalError", "code": 500});
            let failed = Response::builder().status(500);
            send.send_response(
                failed
                    .body(Body::from(status.to_string().into_bytes()))
                    .unwrap(),
            );
        } else {
            send.send_response(list(c.3.contains("PartialObjectMetadata")));
        }
    }
    task.abort();
    assert!(ctx.kept().take(&kept).is_err(), "the kept copy is void");
    assert!(
        (2..=10).contains(&request_lists),
        "{request_lists} lists of the requests in {window:?} of failures: want a few retries, \
         each after a growing delay"
    );
}
