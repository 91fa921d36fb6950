//! A claim as the target (`target.kind: PersistentVolumeClaim`): preflight finds its member,
//! only that member moves, and the StatefulSet keeps its templates.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::fixtures::*;
use super::observe::{ClaimUser, Workload, may_target, target_claim_users, target_workload};
use super::preflight::{DenialReason, dry_run};
use super::tests::assert_machine_transitions;
use super::*;
use crate::api::{
    Phase, Plan, PlannedWork, Stage, StorageMigrationRequestSpec, StorageMigrationRequestStatus,
    TargetKind,
};

/// The spec with a claim target.
fn on_claim(mut spec: StorageMigrationRequestSpec, claim: &str) -> StorageMigrationRequestSpec {
    spec.target.kind = TargetKind::PersistentVolumeClaim;
    spec.target.name = claim.to_string();
    spec
}

/// The fixture cluster with a claim-target request; its users read from the pods as the
/// cluster layer reads them.
fn observed_on_claim(spec: StorageMigrationRequestSpec, claim: &str) -> Observed {
    let mut o = observed(on_claim(spec, claim));
    refresh_users(&mut o, claim);
    o
}

fn refresh_users(o: &mut Observed, claim: &str) {
    let pods: Vec<_> = o.pods.values().map(|p| p.typed().clone()).collect();
    o.target_claim_users = target_claim_users(&pods, claim);
}

#[test]
fn the_plan_moves_only_the_claims_member_and_keeps_the_claims_size() {
    let o = observed_on_claim(spec_class_change("fast"), "data-etcd-1");
    assert_eq!(
        o.target_claim_users,
        vec![ClaimUser {
            pod: "etcd-1".into(),
            owner: Some(("StatefulSet".into(), "etcd".into())),
        }]
    );
    let plan = dry_run(&o, &SETTINGS).expect("accepted");
    assert_eq!(plan.stateful_set, "etcd");
    assert_eq!(plan.volume_claim_template, "data");
    assert_eq!(plan.target_claim.as_deref(), Some("data-etcd-1"));
    assert_eq!(plan.target_size.0, "1Gi");
    let work: Vec<(&str, PlannedWork)> = plan
        .members
        .iter()
        .map(|m| (m.pod.as_str(), m.work))
        .collect();
    assert_eq!(
        work,
        vec![
            ("etcd-0", PlannedWork::NotTargeted),
            ("etcd-2", PlannedWork::NotTargeted),
            ("etcd-1", PlannedWork::Migrate),
        ]
    );
}

#[test]
fn a_claim_target_runs_to_success_touching_only_its_member() {
    let mut sim = Sim::new(observed_on_claim(spec_class_change("fast"), "data-etcd-1"));
    let rounds = sim.run(400);
    let s = sim.status();
    assert_eq!(
        s.phase,
        Phase::Successful,
        "after {rounds}: {:?}",
        s.message
    );
    assert_eq!(s.progress.as_deref(), Some("3/3"));
    assert_machine_transitions(&sim);
    assert_eq!(sim.step_of("etcd-1"), MemberStep::Done);
    for pod in ["etcd-0", "etcd-2"] {
        assert_eq!(sim.step_of(pod), MemberStep::NotTargeted);
    }
    let message = s.message.clone().unwrap_or_default();
    assert!(
        message.contains("not targeted, left running: etcd-0, etcd-2"),
        "{message}"
    );
    // Only the target claim moved.
    let class_of = |claim: &str| claim_class(&sim.o.claims[claim]).map(str::to_string);
    assert_eq!(class_of("data-etcd-1").as_deref(), Some("fast"));
    assert_eq!(class_of("data-etcd-0").as_deref(), Some("standard"));
    assert_eq!(class_of("data-etcd-2").as_deref(), Some("standard"));
    for i in [0, 2] {
        let claim = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_volume(claim), Some(format!("pv-old-{i}").as_str()));
    }
    // No action touched the other members' pods, claims or volumes.
    let untouched = [
        "etcd-0",
        "etcd-2",
        "data-etcd-0",
        "data-etcd-2",
        "pv-old-0",
        "pv-old-2",
    ];
    for a in &sim.log {
        let text = format!("{a:?}");
        // The set's own actions, and the claims' protection from its orphan delete, are for
        // every member.
        let for_the_set = matches!(
            a,
            Action::SetStatus(_)
                | Action::Event { .. }
                | Action::Stash { .. }
                | Action::Create(Object::StatefulSet(_))
                | Action::Delete {
                    kind: Kind::StatefulSet,
                    ..
                }
                | Action::RemoveOwnerReferences { .. }
                | Action::PatchRetentionPolicy { .. }
        );
        if for_the_set {
            continue;
        }
        for name in untouched {
            assert!(
                !text.contains(&format!("\"{name}\"")),
                "{name} touched by {text}"
            );
        }
    }
    // The recreated set keeps its template: class and size as before.
    let tpl = first_template(&sim);
    assert_eq!(claim_class(tpl), Some("standard"));
    assert_eq!(claim_request(tpl).map(|q| q.0.as_str()), Some("1Gi"));
    let recreated = sim
        .events
        .iter()
        .find(|(reason, _)| reason == "StatefulSetRecreated")
        .map(|(_, m)| m.as_str())
        .unwrap_or_default();
    assert!(
        recreated.contains("its volumeClaimTemplates unchanged"),
        "{recreated}"
    );
    assert_eq!(s.stage, Stage::Done);
}

#[test]
fn a_shrink_of_a_claim_looks_at_that_claim_alone() {
    // The other members are on another class: no MixedStorageClasses, since they do not move.
    let mut o = observed_on_claim(spec_shrink("256Mi"), "data-etcd-2");
    for i in [0, 1] {
        let name = format!("data-etcd-{i}");
        let pv = format!("pv-old-{i}");
        o.claims
            .insert(name.clone(), bound_claim(&name, "slow", "2Gi", &pv));
    }
    let plan = dry_run(&o, &SETTINGS).expect("accepted before the measuring");
    let sizes: Vec<(&str, &str, PlannedWork)> = (plan.members.iter())
        .map(|m| (m.pod.as_str(), m.new_size.0.as_str(), m.work))
        .collect();
    assert_eq!(
        sizes,
        vec![
            ("etcd-0", "2Gi", PlannedWork::NotTargeted),
            ("etcd-1", "2Gi", PlannedWork::NotTargeted),
            ("etcd-2", "256Mi", PlannedWork::Migrate),
        ]
    );
    // Measured and shrunk: only that member's used bytes are measured.
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    let measured: Vec<_> = (sim.log.iter())
        .filter_map(|a| match a {
            Action::Create(Object::Job(job)) => job.metadata.name.clone(),
            _ => None,
        })
        .filter(|name| name.contains("measure"))
        .collect();
    assert_eq!(measured.len(), 1, "{measured:?}");
    let shrunk = &sim.o.claims["data-etcd-2"];
    assert_eq!(claim_request(shrunk).map(|q| q.0.as_str()), Some("256Mi"));
    assert_eq!(
        claim_request(&sim.o.claims["data-etcd-0"]).map(|q| q.0.as_str()),
        Some("2Gi")
    );

    let mut at_size = observed_on_claim(spec_shrink("1Gi"), "data-etcd-2");
    at_size.claims.insert(
        "data-etcd-0".into(),
        bound_claim("data-etcd-0", "standard", "2Gi", "pv-old-0"),
    );
    let (reason, message) = denial(&at_size);
    assert_eq!(reason, DenialReason::NotSmaller);
    assert!(
        message.starts_with("the claim already requests 1Gi: nothing to do"),
        "{message}"
    );

    let bigger = observed_on_claim(spec_shrink("2Gi"), "data-etcd-2");
    let (reason, message) = denial(&bigger);
    assert_eq!(reason, DenialReason::NotSmaller);
    assert!(
        message.contains("claim data-etcd-2's request 1Gi"),
        "{message}"
    );
}

#[test]
fn a_claim_already_on_the_class_is_denied_whatever_the_others_are() {
    let mut o = observed_on_claim(spec_class_change("fast"), "data-etcd-0");
    o.claims.insert(
        "data-etcd-0".into(),
        bound_claim("data-etcd-0", "fast", "1Gi", "pv-old-0"),
    );
    o.volumes.insert(
        "pv-old-0".into(),
        volume("pv-old-0", "fast", "1Gi", "data-etcd-0", NODES[0]),
    );
    let (reason, message) = denial(&o);
    assert_eq!(reason, DenialReason::SameStorageClass);
    assert!(
        message.starts_with("the claim and its volume are already on StorageClass fast"),
        "{message}"
    );
}

#[test]
fn claims_without_exactly_one_statefulset_member_are_denied_naming_why() {
    let spec = spec_class_change("fast");

    let missing = observed_on_claim(spec.clone(), "data-etcd-7");
    let (reason, message) = denial(&missing);
    assert_eq!(reason, DenialReason::TargetNotFound);
    assert!(
        message.contains("PersistentVolumeClaim data-etcd-7 not found"),
        "{message}"
    );

    let mut unused = observed_on_claim(spec.clone(), "data-etcd-1");
    unused.pods.remove("etcd-1");
    refresh_users(&mut unused, "data-etcd-1");
    let (reason, message) = denial(&unused);
    assert_eq!(reason, DenialReason::ClaimUnused);
    assert!(
        message.starts_with("no pod mounts claim data-etcd-1"),
        "{message}"
    );

    let mut shared = observed_on_claim(spec.clone(), "data-etcd-1");
    let mut reader = member_pod(1);
    reader.metadata.name = Some("backup".into());
    shared.pods.insert("backup".into(), manifest(reader));
    refresh_users(&mut shared, "data-etcd-1");
    let (reason, message) = denial(&shared);
    assert_eq!(reason, DenialReason::ClaimShared);
    assert!(
        message.contains("mounted by 2 pods (backup, etcd-1)"),
        "{message}"
    );

    for (owner, says) in [
        (
            Some(("ReplicaSet", "web-7d9f")),
            "pod etcd-1, which is controlled by ReplicaSet web-7d9f",
        ),
        (
            Some(("Job", "backup-28")),
            "pod etcd-1, which is controlled by Job backup-28",
        ),
    ] {
        let mut o = observed_on_claim(spec.clone(), "data-etcd-1");
        let mut pod = member_pod(1);
        pod.metadata.owner_references = owner.map(|(kind, name)| {
            vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        o.pods.insert("etcd-1".into(), manifest(pod));
        refresh_users(&mut o, "data-etcd-1");
        let (reason, message) = denial(&o);
        assert_eq!(reason, DenialReason::UnsupportedOwner);
        assert!(message.contains(says), "{message}");
    }
}

#[test]
fn a_claim_not_made_from_a_template_or_named_with_another_is_denied() {
    // The member's pod mounts a claim the set's templates did not make.
    let mut o = observed_on_claim(spec_class_change("fast"), "scratch-etcd-1");
    o.claims.insert(
        "scratch-etcd-1".into(),
        bound_claim("scratch-etcd-1", "standard", "1Gi", "pv-scratch"),
    );
    let mut pod = member_pod(1);
    let volumes = pod.spec.as_mut().unwrap().volumes.as_mut().unwrap();
    volumes[0]
        .persistent_volume_claim
        .as_mut()
        .unwrap()
        .claim_name = "scratch-etcd-1".into();
    o.pods.insert("etcd-1".into(), manifest(pod));
    refresh_users(&mut o, "scratch-etcd-1");
    let (reason, message) = denial(&o);
    assert_eq!(reason, DenialReason::TemplateNotFound);
    assert!(
        message.contains("the set has no template \"scratch\" (it has: data)"),
        "{message}"
    );

    let mut spec = spec_class_change("fast");
    spec.volume_claim_template = Some("wal".into());
    let (reason, message) = denial(&observed_on_claim(spec, "data-etcd-1"));
    assert_eq!(reason, DenialReason::InvalidSpec);
    assert!(
        message.contains("spec.volumeClaimTemplate is \"wal\" but claim data-etcd-1"),
        "{message}"
    );
    let mut same = spec_class_change("fast");
    same.volume_claim_template = Some("data".into());
    assert!(dry_run(&observed_on_claim(same, "data-etcd-1"), &SETTINGS).is_ok());
}

#[test]
fn the_workload_of_a_claim_target_comes_from_its_plan_or_its_only_user() {
    let spec = on_claim(spec_class_change("fast"), "data-etcd-1");
    let user = |kind: &str, name: &str| ClaimUser {
        pod: "etcd-1".into(),
        owner: Some((kind.into(), name.into())),
    };
    let none = StorageMigrationRequestStatus::default();
    let set = Workload::StatefulSet("etcd".into());
    assert_eq!(
        target_workload(&spec, &none, &[user("StatefulSet", "etcd")]),
        set
    );
    assert_eq!(
        target_workload(&spec, &none, &[user("Deployment", "web")]),
        Workload::Deployment("web".into())
    );
    assert_eq!(target_workload(&spec, &none, &[]), Workload::None);
    let two = [user("StatefulSet", "etcd"), user("StatefulSet", "etcd")];
    assert_eq!(target_workload(&spec, &none, &two), Workload::None);
    assert_eq!(
        target_workload(&spec, &none, &[user("ReplicaSet", "web-7d9f")]),
        Workload::None
    );
    let planned = |deployment: Option<&str>| StorageMigrationRequestStatus {
        plan: Some(Plan {
            stateful_set: "db".into(),
            deployment: deployment.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        target_workload(&spec, &planned(None), &[]),
        Workload::StatefulSet("db".into())
    );
    assert_eq!(
        target_workload(&spec, &planned(Some("web")), &[]),
        Workload::Deployment("web".into())
    );
    assert_eq!(target_workload(&spec_class_change("fast"), &none, &[]), set);
    assert_eq!(set.to_string(), "StatefulSet etcd");
}

#[test]
fn a_claim_target_without_a_plan_queues_requests_on_the_workload_it_may_be_of() {
    let claim = |name: &str| request(on_claim(spec_class_change("fast"), name));
    let etcd = Workload::StatefulSet("etcd".into());
    let web = Workload::Deployment("web".into());
    assert!(may_target(&claim("data-etcd-1"), &etcd));
    assert!(may_target(&claim("wal-etcd-12"), &etcd));
    assert!(!may_target(&claim("data-etcd-x"), &etcd));
    assert!(!may_target(&claim("data-etcd2-1"), &etcd));
    assert!(!may_target(&claim("etcd-1"), &etcd));
    // Any claim could be a Deployment's.
    assert!(may_target(&claim("cache"), &web));
    assert!(!may_target(&claim("cache"), &Workload::None));
    let mut planned = claim("anything");
    planned.status = Some(StorageMigrationRequestStatus {
        plan: Some(Plan {
            stateful_set: "etcd".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(may_target(&planned, &etcd));
    assert!(!may_target(&planned, &Workload::StatefulSet("db".into())));
    assert!(!may_target(&planned, &web));
    assert!(may_target(&request(spec_class_change("fast")), &etcd));
    let mut on_web = spec_class_change("fast");
    on_web.target.kind = TargetKind::Deployment;
    on_web.target.name = "web".into();
    assert!(may_target(&request(on_web.clone()), &web));
    assert!(!may_target(&request(on_web), &etcd));
}

#[test]
fn a_failed_copy_of_a_claim_target_rolls_its_member_back_and_says_where_all_data_is() {
    let mut sim = Sim::new(observed_on_claim(spec_class_change("fast"), "data-etcd-1"));
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert_eq!(sim.step_of("etcd-1"), MemberStep::RolledBack);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::NotTargeted);
    for i in 0..3 {
        let claim = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_volume(claim), Some(format!("pv-old-{i}").as_str()));
        assert!(sim.o.pods.contains_key(&format!("etcd-{i}")));
    }
    let failure = s.failure.clone().unwrap_or_default();
    assert!(failure.contains("copy of claim data-etcd-1"), "{failure}");
    let message = s.message.clone().unwrap_or_default();
    for i in 0..3 {
        assert!(
            message.contains(&format!(
                "etcd-{i} on claim data-etcd-{i} -> original volume pv-old-{i} (standard, untouched)"
            )),
            "{message}"
        );
    }
    assert!(sim.o.stateful_set.is_some(), "the set is recreated");
}
