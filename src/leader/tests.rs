//! The elector against a mocked API server (paused time: the waits are exact): which requests
//! it sends, with which `resourceVersion`, and when.

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use serde_json::json;

use super::*;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

/// The defaults (30 s, 10 s grace), replica `op-0`, Lease `ops/storage-migrator`.
pub(super) fn cfg() -> LeaseConfig {
    LeaseConfig {
        name: "storage-migrator".into(),
        namespace: "ops".into(),
        identity: "op-0".into(),
        duration: Duration::from_secs(30),
        grace: Duration::from_secs(10),
    }
}

fn lease(holder: Option<&str>, version: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("storage-migrator".into()),
            namespace: Some("ops".into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(String::from),
            lease_duration_seconds: Some(30),
            ..LeaseSpec::default()
        }),
    }
}

/// One request the mocked server got: method, path and query, the Lease it carried, and when
/// (since the test began).
#[derive(Debug, Clone)]
struct Got {
    method: String,
    uri: String,
    body: Option<Lease>,
    at: Duration,
}

/// What the mocked server answers.
enum Answer {
    Json(serde_json::Value),
    Status(u16),
    /// Never answers (a watch that stays open, a server that hangs).
    Never,
}

fn ok(lease: Lease) -> Answer {
    Answer::Json(json!(lease))
}

/// An API whose server answers each request with `answer(request, how many came before)` and
/// records every request.
fn server(
    mut answer: impl FnMut(&Got, usize) -> Answer + Send + 'static,
) -> (Api<Lease>, Arc<Mutex<Vec<Got>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let got = Arc::new(Mutex::new(Vec::new()));
    let log = got.clone();
    let t0 = Instant::now();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let g = Got {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                body: serde_json::from_slice(&bytes).ok(),
                at: t0.elapsed(),
            };
            let n = log.lock().map(|mut l| {
                l.push(g.clone());
                l.len() - 1
            });
            let reply = |status: StatusCode, value: serde_json::Value| {
                let mut r = Response::new(Body::from(value.to_string().into_bytes()));
                *r.status_mut() = status;
                r
            };
            match answer(&g, n.unwrap_or_default()) {
                Answer::Json(v) => send.send_response(reply(StatusCode::OK, v)),
                Answer::Status(code) => send.send_response(reply(
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "refused", "code": code}),
                )),
                Answer::Never => open.push(send),
            }
        }
    });
    (Api::namespaced(Client::new(service, "ops"), "ops"), got)
}

fn elector(leases: Api<Lease>, seen: Option<Lease>) -> Elector {
    Elector {
        leases,
        cfg: cfg(),
        seen,
        seen_at: Instant::now(),
    }
}

fn held_now(record: Lease) -> Held {
    let sent = Instant::now();
    Held {
        record,
        sent,
        until: sent + cfg().margin(),
    }
}

fn puts(got: &Arc<Mutex<Vec<Got>>>) -> Vec<Got> {
    let all = got.lock().map(|g| g.clone()).unwrap_or_default();
    all.into_iter().filter(|g| g.method == "PUT").collect()
}

fn version(g: &Got) -> Option<String> {
    g.body.as_ref()?.metadata.resource_version.clone()
}

/// The watch of a candidate: its list shows `listed` (at version 7), its watch stays open.
fn watch_answer(g: &Got, listed: &[Lease]) -> Option<Answer> {
    if g.method != "GET" || !g.uri.starts_with(&format!("{LEASES}?")) {
        return None;
    }
    Some(match g.uri.contains("watch=true") {
        true => Answer::Never,
        false => Answer::Json(
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
            "metadata": {"resourceVersion": "7"}, "items": listed}),
        ),
    })
}

#[tokio::test(start_paused = true)]
async fn the_holder_renews_once_per_period_with_one_replace_on_its_last_version() {
    let (leases, got) = server(|g, n| match g.method.as_str() {
        "PUT" => ok(lease(Some("op-0"), &format!("{}", 10 + n))),
        _ => Answer::Status(500),
    });
    let e = elector(leases, None);
    let mut held = held_now(lease(Some("op-0"), "9"));
    let kept = tokio::time::timeout(Duration::from_secs(65), e.keep(&mut held)).await;
    assert!(kept.is_err(), "the term went on: {kept:?}");
    let puts = puts(&got);
    let at: Vec<u64> = puts.iter().map(|g| g.at.as_secs()).collect();
    assert_eq!(at, [20, 40, 60], "one renewal every duration - grace");
    let versions: Vec<_> = puts.iter().filter_map(version).collect();
    assert_eq!(
        versions,
        ["9", "10", "11"],
        "each on the version the last one wrote"
    );
    assert!(
        puts.iter()
            .all(|g| g.uri.ends_with("/leases/storage-migrator?"))
    );
    assert_eq!(
        got.lock().map(|g| g.len()).unwrap_or_default(),
        3,
        "nothing else"
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_renewals_fail_is_fenced_half_a_grace_before_the_lease_expires() {
    for hangs in [false, true] {
        let (leases, got) = server(move |_, _| match hangs {
            true => Answer::Never,
            false => Answer::Status(503),
        });
        let e = elector(leases, None);
        let t0 = Instant::now();
        let mut held = held_now(lease(Some("op-0"), "9"));
        let term = e.keep(&mut held).await;
        assert!(
            matches!(term, Term::Fenced(ref r) if r.contains("no renewal")),
            "{term:?}"
        );
        assert_eq!(t0.elapsed(), Duration::from_secs(25), "hangs: {hangs}");
        let tries = puts(&got).len();
        assert!(tries >= 1, "it tried to renew ({tries})");
    }
}

#[tokio::test(start_paused = true)]
async fn a_renewal_refused_because_another_holds_the_lease_loses_the_term() {
    let (leases, got) = server(|g, _| match g.method.as_str() {
        "PUT" => Answer::Status(409),
        _ => ok(lease(Some("op-1"), "12")),
    });
    let e = elector(leases, None);
    let term = e.keep(&mut held_now(lease(Some("op-0"), "9"))).await;
    assert_eq!(term, Term::Lost);
    assert_eq!(puts(&got).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_refused_on_our_own_newer_record_renews_on_its_version_at_once() {
    let (leases, got) = server(|g, n| match (g.method.as_str(), n) {
        ("PUT", 0) => Answer::Status(409),
        ("GET", _) => ok(lease(Some("op-0"), "15")),
        _ => ok(lease(Some("op-0"), "16")),
    });
    let e = elector(leases, None);
    let mut held = held_now(lease(Some("op-0"), "9"));
    let kept = tokio::time::timeout(Duration::from_secs(30), e.keep(&mut held)).await;
    assert!(kept.is_err(), "the term went on: {kept:?}");
    let puts = puts(&got);
    let versions: Vec<_> = puts.iter().filter_map(version).collect();
    assert_eq!(versions, ["9", "15"]);
    assert_eq!(puts[1].at, Duration::from_secs(20), "renewed again at once");
    assert_eq!(held.record.metadata.resource_version.as_deref(), Some("16"));
}

#[tokio::test(start_paused = true)]
async fn a_candidate_takes_anothers_lease_only_after_it_stayed_unchanged_a_whole_duration() {
    let seen = lease(Some("op-1"), "7");
    let list = [seen.clone()];
    let (leases, got) = server(move |g, _| {
        if let Some(a) = watch_answer(g, &list) {
            return a;
        }
        match g.method.as_str() {
            "PUT" => ok(lease(Some("op-0"), "8")),
            _ => Answer::Status(500),
        }
    });
    let mut e = elector(leases, Some(seen));
    let held = e.acquire().await;
    let puts = puts(&got);
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0].at, Duration::from_secs(30));
    assert_eq!(version(&puts[0]).as_deref(), Some("7"));
    let spec = puts[0].body.as_ref().and_then(|l| l.spec.clone());
    assert_eq!(
        spec.and_then(|s| s.holder_identity).as_deref(),
        Some("op-0")
    );
    assert_eq!(held.record.metadata.resource_version.as_deref(), Some("8"));
    assert_eq!(held.until - held.sent, Duration::from_secs(25));
}

#[tokio::test(start_paused = true)]
async fn a_leader_creates_a_missing_lease_works_and_releases_it_on_shutdown() {
    let (leases, got) = server(|g, _| {
        if let Some(a) = watch_answer(g, &[]) {
            return a;
        }
        match g.method.as_str() {
            "POST" => ok(lease(Some("op-0"), "1")),
            "PUT" => ok(lease(None, "2")),
            _ => Answer::Status(500),
        }
    });
    let roles = Arc::new(Mutex::new(Vec::new()));
    let noted = roles.clone();
    let on_role = move |leading| {
        noted
            .lock()
            .map(|mut r| r.push(leading))
            .unwrap_or_default()
    };
    let worked = Arc::new(Mutex::new(None));
    let started = worked.clone();
    let work = move || async move {
        let _ = started.lock().map(|mut w| *w = Some(Instant::now()));
        std::future::pending::<()>().await;
    };
    let t0 = Instant::now();
    let shutdown = tokio::time::sleep(Duration::from_secs(5));
    let term = lead(elector(leases, None), on_role, work, shutdown).await;
    assert_eq!(term, Term::Finished);
    assert_eq!(
        roles.lock().map(|r| r.clone()).unwrap_or_default(),
        [false, true, false]
    );
    let began = worked.lock().map(|w| *w).unwrap_or_default();
    assert_eq!(
        began.map(|b| b - t0),
        Some(Duration::ZERO),
        "works once the Lease is ours"
    );
    let all = got.lock().map(|g| g.clone()).unwrap_or_default();
    let writes: Vec<_> = all.iter().filter(|g| g.method != "GET").collect();
    assert_eq!(writes.len(), 2, "{all:?}");
    assert_eq!(writes[0].method, "POST");
    assert_eq!(writes[0].at, Duration::ZERO);
    assert_eq!(writes[1].method, "PUT");
    assert_eq!(writes[1].at, Duration::from_secs(5), "released on shutdown");
    let released = writes[1].body.as_ref().map(record::holder);
    assert_eq!(released, Some(None), "the holder is cleared");
    assert_eq!(version(writes[1]).as_deref(), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn a_read_that_never_answers_after_a_refused_renewal_still_ends_the_term_at_the_fence() {
    let (leases, _got) = server(|g, _| match g.method.as_str() {
        "PUT" => Answer::Status(409),
        _ => Answer::Never,
    });
    let e = elector(leases, None);
    let t0 = Instant::now();
    let term = e.keep(&mut held_now(lease(Some("op-0"), "9"))).await;
    assert!(matches!(term, Term::Fenced(_)), "{term:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(25));
}
