//! The stash's pure parts (keys, reading the ConfigMap back) and the planner's decisions around
//! it: a replaced request, a Failed one, corrupt or missing entries, another request's
//! ConfigMap, the size budget.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::{MemberStep, Phase, Plan, PlannedMember};
use crate::plan::fixtures::*;
use crate::plan::{Kind, decide};

fn status() -> StorageMigrationRequestStatus {
    StorageMigrationRequestStatus {
        plan: Some(Plan {
            stateful_set: "etcd".into(),
            members: vec![PlannedMember {
                pod: "etcd-0".into(),
                claim: "data-etcd-0".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The stash ConfigMap of request `move` (uid `uid-move`) with `data`.
fn config_map(uid_label: Option<&str>, data: &[(&str, String)]) -> ConfigMap {
    let mut cm = build::stash_config_map(&request(spec_class_change("fast")));
    cm.metadata.uid = Some("uid-cm".into());
    let labels = cm.metadata.labels.get_or_insert_with(BTreeMap::new);
    match uid_label {
        Some(l) => labels.insert(labels::REQUEST_UID_LABEL.into(), l.into()),
        None => labels.remove(labels::REQUEST_UID_LABEL),
    };
    cm.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    );
    cm
}

fn encoded<T: serde::Serialize>(obj: &T) -> String {
    build::stash_encode(obj).unwrap()
}

#[test]
fn keys_name_the_kind_and_the_object() {
    assert_eq!(StashKey::StatefulSet.config_map_key(), "statefulset");
    assert_eq!(
        StashKey::Pod("etcd-0".into()).config_map_key(),
        "pod-etcd-0"
    );
    assert_eq!(
        StashKey::Claim("data-etcd-0".into()).config_map_key(),
        "claim-data-etcd-0"
    );
    let long = StashKey::Claim("c".repeat(253)).config_map_key();
    assert!(long.len() <= 253 && long.starts_with("claim-"), "{long}");
}

#[test]
fn the_plans_entries_are_read_back_and_bad_ones_reported() {
    let set = manifest(stateful_set(3));
    let pod = manifest(member_pod(0));
    let claim = bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
    let cm = config_map(
        Some("uid-move"),
        &[
            ("statefulset", encoded(&set)),
            ("pod-etcd-0", encoded(&pod)),
            ("claim-data-etcd-0", "not base64!".into()),
            // Not a member of the plan: not read.
            ("pod-etcd-9", "not base64!".into()),
        ],
    );
    let stash = read_stash(Some(&cm), Some("uid-move"), &status());
    assert_eq!(stash.stateful_set, Some(set));
    assert_eq!(stash.pods.keys().collect::<Vec<_>>(), ["etcd-0"]);
    assert_eq!(stash.pods["etcd-0"], pod);
    assert!(stash.claims.is_empty());
    assert_eq!(stash.errors.len(), 1, "{:?}", stash.errors);
    assert_eq!(stash.errors[0].0, "claim-data-etcd-0");
    assert!(stash.errors[0].1.contains("base64"), "{:?}", stash.errors);
    let StashObject::Ours { uid, sizes } = &stash.object else {
        panic!("{:?}", stash.object);
    };
    assert_eq!(uid.as_deref(), Some("uid-cm"));
    assert_eq!(
        sizes["pod-etcd-9"],
        "pod-etcd-9".len() + "not base64!".len()
    );
    // A good claim entry is read.
    let cm = config_map(Some("uid-move"), &[("claim-data-etcd-0", encoded(&claim))]);
    let stash = read_stash(Some(&cm), Some("uid-move"), &status());
    assert_eq!(stash.claims["data-etcd-0"], claim);
    assert!(stash.errors.is_empty() && stash.stateful_set.is_none());
}

#[test]
fn an_entry_holding_another_object_than_its_key_names_is_an_error() {
    let other_pod = manifest(member_pod(1));
    let other_set = {
        let mut s = stateful_set(3);
        s.metadata.name = Some("other".into());
        manifest(s)
    };
    let cm = config_map(
        Some("uid-move"),
        &[
            ("pod-etcd-0", encoded(&other_pod)),
            ("statefulset", encoded(&other_set)),
        ],
    );
    let stash = read_stash(Some(&cm), Some("uid-move"), &status());
    assert!(stash.pods.is_empty() && stash.stateful_set.is_none());
    let errors: Vec<&str> = stash.errors.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(errors, ["statefulset", "pod-etcd-0"]);
    assert!(stash.errors[1].1.contains("etcd-1"), "{:?}", stash.errors);
}

#[test]
fn another_requests_config_map_is_foreign_and_never_read() {
    let pod = encoded(&manifest(member_pod(0)));
    for (label, request_uid) in [
        (Some("uid-earlier"), Some("uid-move")),
        (None, Some("uid-move")),
        (Some("uid-move"), None),
    ] {
        let cm = config_map(label, &[("pod-etcd-0", pod.clone())]);
        let stash = read_stash(Some(&cm), request_uid, &status());
        assert_eq!(
            stash.object,
            StashObject::Foreign {
                uid_label: label.map(str::to_string)
            }
        );
        assert!(stash.pods.is_empty() && stash.errors.is_empty());
    }
    assert_eq!(
        read_stash(None, Some("uid-move"), &status()).object,
        StashObject::Missing
    );
}

// --- The planner around the stash, on the simulated cluster. ----------------------------------

/// Runs the simulation until `pred` holds (at most 400 rounds).
fn run_until(sim: &mut Sim, pred: impl Fn(&Sim) -> bool) {
    for _ in 0..400 {
        if pred(sim) {
            return;
        }
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    panic!("never reached; status {:?}", sim.o.request.status);
}

fn message(sim: &Sim) -> String {
    sim.o
        .request
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

fn destructive(a: &Action) -> bool {
    matches!(
        a,
        Action::Delete {
            kind: Kind::Pod | Kind::StatefulSet | Kind::Claim | Kind::ConfigMap,
            ..
        } | Action::Create(Object::Pod(_) | Object::StatefulSet(_))
            | Action::SetClaimRef { .. }
    )
}

/// What `kubectl replace` of the original manifest leaves: the same request (uid, status)
/// without annotations or finalizers.
fn replace_request(sim: &mut Sim) {
    sim.o.request.metadata.annotations = None;
    sim.o.request.metadata.finalizers = None;
}

#[test]
fn a_request_replaced_at_any_point_gets_its_finalizer_back_and_succeeds() {
    let mut reference = Sim::new(observed(spec_class_change("fast")));
    let rounds = reference.run(400);
    assert_eq!(reference.phase(), Phase::Successful);
    for at in (1..rounds).step_by(3) {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        sim.run(at);
        if sim.phase().is_final() {
            break;
        }
        replace_request(&mut sim);
        let in_progress = sim.o.request.status.as_ref().unwrap().stage != Stage::Preflight;
        let d = decide(&sim.o, &SETTINGS);
        if in_progress {
            assert!(d.actions.contains(&Action::AddFinalizer), "round {at}");
            assert!(
                d.actions.iter().any(
                    |a| matches!(a, Action::Event { reason, .. } if reason == "FinalizerRestored")
                ),
                "round {at}"
            );
        }
        sim.run(400);
        assert_eq!(
            sim.phase(),
            Phase::Successful,
            "round {at}: {}",
            message(&sim)
        );
        assert_eq!(sim.o.pods.len(), 3, "round {at}");
        assert!(sim.stash_config_map.is_none(), "round {at}: stash left");
    }
}

#[test]
fn a_failed_request_keeps_its_stash_also_once_deleted() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Failed, "{}", message(&sim));
    let cm = sim.stash_config_map.clone().expect("the stash is kept");
    assert!(cm.data.unwrap().contains_key("pod-etcd-0"));
    sim.o.request.metadata.deletion_timestamp = Some(Time(sim.o.now));
    sim.o.request.metadata.finalizers = Some(vec![labels::FINALIZER.into()]);
    sim.run(50);
    assert!(sim.o.request.finalizers().is_empty(), "the request may go");
    assert!(sim.stash_config_map.is_some(), "the stash stays");
    assert!(!sim.log.iter().any(|a| matches!(
        a,
        Action::Delete {
            kind: Kind::ConfigMap,
            ..
        }
    )));
}

#[test]
fn a_corrupt_stash_entry_stops_the_request_and_is_never_overwritten() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    run_until(&mut sim, |s| s.o.stash.pods.contains_key("etcd-0"));
    let good = sim
        .stash_config_map
        .as_ref()
        .unwrap()
        .data
        .as_ref()
        .unwrap()["pod-etcd-0"]
        .clone();
    let set_cm = |sim: &mut Sim, value: &str| {
        if let Some(cm) = sim.stash_config_map.as_mut() {
            cm.data
                .get_or_insert_with(BTreeMap::new)
                .insert("pod-etcd-0".into(), value.into());
        }
        sim.reread_stash();
    };
    set_cm(&mut sim, "H4sIAAAA-truncated");
    let before = sim.log.len();
    for _ in 0..30 {
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    let acted = &sim.log[before..];
    assert!(!acted.iter().any(destructive), "{acted:?}");
    assert!(
        !acted.iter().any(|a| matches!(a, Action::Stash { .. })),
        "the corrupt entry is not replaced: {acted:?}"
    );
    assert!(sim.o.pods.contains_key("etcd-0"));
    let m = message(&sim);
    assert!(
        m.starts_with("stuck: stash entry pod-etcd-0 of ConfigMap move-stash cannot be read"),
        "{m}"
    );
    // Repaired by hand: the request goes on.
    set_cm(&mut sim, &good);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{}", message(&sim));
}

#[test]
fn a_corrupt_stash_of_the_orphaned_set_stops_a_rollback_too() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    run_until(&mut sim, |s| s.step_of("etcd-0") == MemberStep::Copying);
    assert!(sim.o.stateful_set.is_none());
    if let Some(cm) = sim.stash_config_map.as_mut() {
        cm.data
            .get_or_insert_with(BTreeMap::new)
            .insert("statefulset".into(), "garbage".into());
    }
    sim.reread_stash();
    sim.o.request.metadata.deletion_timestamp = Some(Time(sim.o.now));
    sim.run(100);
    // Rolled back as far as it could without the set's manifest: never Failed without it.
    assert!(!sim.phase().is_final(), "{}", message(&sim));
    assert!(sim.o.stateful_set.is_none());
    assert!(
        message(&sim).contains("stash entry statefulset"),
        "{}",
        message(&sim)
    );
}

#[test]
fn another_requests_stash_config_map_blocks_before_anything_is_deleted() {
    let mut o = observed(spec_class_change("fast"));
    o.stash.object = StashObject::Foreign {
        uid_label: Some("uid-earlier".into()),
    };
    let mut sim = Sim::new(o);
    sim.run(60);
    assert!(!sim.log.iter().any(destructive), "{:?}", sim.log);
    assert!(!sim.log.iter().any(|a| matches!(a, Action::Stash { .. })));
    assert!(sim.o.stateful_set.is_some());
    let m = message(&sim);
    assert!(
        m.contains("ConfigMap move-stash is not this request's stash") && m.contains("uid-earlier"),
        "{m}"
    );
    // Once deleted, the request goes on with a stash of its own.
    sim.stash_config_map = None;
    sim.reread_stash();
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{}", message(&sim));
}

#[test]
fn a_stash_config_map_deleted_mid_flight_stops_the_request() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    run_until(&mut sim, |s| s.step_of("etcd-0") == MemberStep::Copying);
    sim.stash_config_map = None;
    sim.reread_stash();
    let before = sim.log.len();
    sim.run(30);
    let acted = &sim.log[before..];
    assert!(!acted.iter().any(destructive), "{acted:?}");
    assert!(
        !acted
            .iter()
            .any(|a| matches!(a, Action::Create(Object::ConfigMap(_)))),
        "not silently recreated"
    );
    assert!(message(&sim).contains("was deleted"), "{}", message(&sim));
}

#[test]
fn a_stash_over_its_budget_is_refused_before_anything_is_deleted() {
    let mut o = observed(spec_class_change("fast"));
    o.stash.object = StashObject::Ours {
        uid: Some("uid-cm".into()),
        sizes: BTreeMap::new(),
    };
    let mut sim = Sim::new(o);
    if let Some(cm) = sim.stash_config_map.as_mut() {
        cm.data = Some(BTreeMap::from([(
            "junk".to_string(),
            "x".repeat(build::STASH_BUDGET - 100),
        )]));
    }
    sim.reread_stash();
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Failed, "{}", message(&sim));
    let failure = sim.o.request.status.as_ref().unwrap().failure.clone();
    assert!(
        failure
            .as_deref()
            .is_some_and(|f| f.contains("cannot stash statefulset") && f.contains("budget")),
        "{failure:?}"
    );
    assert!(!sim.log.iter().any(destructive), "{:?}", sim.log);
    assert!(sim.o.stateful_set.is_some() && sim.o.pods.len() == 3);
}
