use serde_json::json;

use super::*;

fn claim(ns: &str, name: &str, class: Option<&str>) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap()
}

fn set(ns: &str, name: &str, replicas: i32, templates: &[&str]) -> StatefulSet {
    let templates: Vec<_> = templates
        .iter()
        .map(|t| json!({"metadata": {"name": t}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "serviceName": name,
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}},
                 "volumeClaimTemplates": templates},
    }))
    .unwrap()
}

fn deployment(ns: &str, name: &str, claims: &[&str]) -> Deployment {
    let volumes: Vec<_> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .chain([json!({"name": "scratch", "emptyDir": {}})])
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [], "volumes": volumes}}},
    }))
    .unwrap()
}

fn names(found: &[Workload]) -> Vec<String> {
    found
        .iter()
        .map(|w| format!("{}/{}/{}", w.namespace, kind_tag(w.kind), w.name))
        .collect()
}

#[test]
fn every_kind_of_workload_on_the_class_is_found_once_and_nothing_else() {
    let claims = [
        claim("a", "data-etcd-0", Some("old")),
        claim("a", "data-etcd-1", Some("old")),
        claim("a", "data-etcd-2", Some("new")),
        // A member beyond the replicas: no member's, a claim target of its own.
        claim("a", "data-etcd-3", Some("old")),
        claim("a", "data-pg-0", Some("other")),
        claim("a", "web-data", Some("old")),
        claim("b", "bare", Some("old")),
        claim("b", "no-class", None),
    ];
    let sets = [set("a", "etcd", 3, &["data"]), set("a", "pg", 1, &["data"])];
    let deployments = [deployment("a", "web", &["web-data"])];
    let inv = Inventory {
        sets: &sets,
        deployments: &deployments,
        claims: &claims,
    };
    let found = discover("old", &inv);
    assert_eq!(
        names(&found),
        [
            "a/sts/etcd",
            "a/deploy/web",
            "a/pvc/data-etcd-3",
            "b/pvc/bare"
        ]
    );
    assert_eq!(found[0].claims, ["data-etcd-0", "data-etcd-1"]);
    assert!(
        found[0].templates.is_empty(),
        "every template is on the class"
    );
    assert_eq!(found[1].claims, ["web-data"]);
}

#[test]
fn only_the_templates_and_claims_on_the_class_move() {
    let claims = [
        claim("a", "data-db-0", Some("old")),
        claim("a", "wal-db-0", Some("fast")),
        claim("a", "logs-db-0", Some("old")),
        claim("a", "one", Some("old")),
        claim("a", "two", Some("fast")),
    ];
    let sets = [set("a", "db", 1, &["data", "wal", "logs"])];
    let deployments = [deployment("a", "web", &["one", "two"])];
    let inv = Inventory {
        sets: &sets,
        deployments: &deployments,
        claims: &claims,
    };
    let found = discover("old", &inv);
    assert_eq!(names(&found), ["a/sts/db", "a/pvc/one"]);
    assert_eq!(found[0].templates, ["data", "logs"]);
    let req = request(&found[0], "old", "new", "12h");
    assert_eq!(req.spec.volume_claim_template, None);
    assert_eq!(req.spec.volume_claim_templates, ["data", "logs"]);
}

#[test]
fn claims_being_deleted_and_temporary_claims_are_no_workloads() {
    let mut gone = claim("a", "gone", Some("old"));
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    let mut temp = claim("a", "data-x-0-smr-abc123", Some("old"));
    temp.metadata.labels = Some([(labels::REQUEST_LABEL.to_string(), "r".to_string())].into());
    let claims = [gone, temp];
    let inv = Inventory {
        sets: &[],
        deployments: &[],
        claims: &claims,
    };
    assert!(discover("old", &inv).is_empty());
}

#[test]
fn a_request_is_a_labelled_class_change_of_the_workload() {
    let w = Workload {
        namespace: "a".into(),
        kind: TargetKind::StatefulSet,
        name: "etcd".into(),
        templates: vec!["data".into()],
        claims: vec!["data-etcd-0".into()],
    };
    let req = request(&w, "gp2", "gp3", "12h");
    assert_eq!(req.name_any(), "sts-etcd-to-gp3");
    assert_eq!(req.namespace().as_deref(), Some("a"));
    assert_eq!(req.labels()[labels::FLEET_LABEL], "gp2-to-gp3");
    assert_eq!(req.spec.type_, MigrationType::StorageClassChange);
    assert_eq!(req.spec.target.kind, TargetKind::StatefulSet);
    assert_eq!(req.spec.volume_claim_template.as_deref(), Some("data"));
    assert_eq!(
        (req.spec.storage_class_change.as_ref()).map(|s| s.storage_class_name.as_str()),
        Some("gp3")
    );
    assert_eq!(req.spec.timeout, "12h");
    assert!(req.status.is_none());
}

#[test]
fn the_total_counts_members_bytes_and_denials() {
    let line = total_line(
        "gp2",
        "gp3",
        &[
            Verdict::Accepted {
                members: 3,
                bytes: 3 << 30,
            },
            Verdict::Denied,
            Verdict::Accepted {
                members: 1,
                bytes: 1 << 30,
            },
        ],
    );
    assert_eq!(
        line,
        "3 workloads on StorageClass gp2: 2 would move to gp3 (4 members, 4Gi of claims), \
         1 would be denied"
    );
    let line = total_line("gp2", "gp3", &[Verdict::Requested, Verdict::Denied]);
    assert_eq!(
        line,
        "2 workloads on StorageClass gp2: 0 would move to gp3 (0 members, 0 of claims), \
         1 would be denied, 1 requested already"
    );
}
