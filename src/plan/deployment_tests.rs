//! A Deployment's claim: preflight, the run to success by scaling it to zero and back, the
//! rollback, and the denials.

use kube::ResourceExt;

use super::fixtures::*;
use super::observe::ClaimUser;
use super::preflight::{DenialReason, dry_run};
use super::tests::assert_machine_transitions;
use super::*;
use crate::api::{DatabaseEngine, Phase, StorageMigrationRequestSpec, TargetKind};

fn replicas(o: &Observed) -> i32 {
    (o.deployment.as_ref())
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(-1)
}

fn scales(sim: &Sim) -> Vec<i32> {
    scales_in(&sim.log)
}

#[test]
fn the_plan_of_a_deployment_has_its_claim_as_the_one_member() {
    let plan = dry_run(&deployment_observed(spec_shrink("256Mi")), &SETTINGS).expect("accepted");
    assert_eq!(plan.deployment.as_deref(), Some("web"));
    assert_eq!(plan.stateful_set, "");
    assert_eq!(plan.target_claim.as_deref(), Some("data-web"));
    let m: Vec<_> = (plan.members.iter())
        .map(|m| {
            (
                m.pod.as_str(),
                m.claim.as_str(),
                m.node.as_str(),
                m.new_size.0.as_str(),
            )
        })
        .collect();
    assert_eq!(m, vec![("web-7d9f-0", "data-web", "node-a", "256Mi")]);
}

#[test]
fn a_deployments_claim_moves_while_it_is_scaled_to_zero_and_it_comes_back() {
    let mut sim = Sim::new(deployment_observed(spec_class_change("fast")));
    let rounds = sim.run(400);
    let s = sim.status();
    assert_eq!(
        s.phase,
        Phase::Successful,
        "after {rounds}: {:?}",
        s.message
    );
    assert_machine_transitions(&sim);
    assert_eq!(s.deployment_replicas, Some(1));
    assert_eq!(scales(&sim), vec![0, 1], "scaled to zero once, then back");
    assert_eq!(replicas(&sim.o), 1);
    let claim = &sim.o.claims["data-web"];
    assert_eq!(claim_class(claim), Some("fast"));
    assert!(claim_volume(claim).is_some_and(|v| v.starts_with("pv-new-")));
    assert_eq!(sim.o.pods.len(), 1, "{:?}", sim.o.pods.keys());
    assert!(!sim.o.pods.contains_key("web-7d9f-0"), "a new pod");
    assert_eq!(sim.step_of("web-7d9f-0"), MemberStep::Done);
    let message = s.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("migrated claim data-web of Deployment web to StorageClass fast"),
        "{message}"
    );
    // Nothing of a StatefulSet: no stash of a set, no orphan delete, no recreation.
    for a in &sim.log {
        let set_action = matches!(
            a,
            Action::Create(Object::StatefulSet(_))
                | Action::Delete {
                    kind: Kind::StatefulSet,
                    ..
                }
                | Action::PatchRetentionPolicy { .. }
        );
        assert!(!set_action, "{a:?}");
    }
    let reasons = sim.reasons();
    for want in [
        "Accepted",
        "PreCopied",
        "PodStopped",
        "Copied",
        "ClaimSwapped",
        "MemberMigrated",
    ] {
        assert!(reasons.contains(&want), "no {want} event in {reasons:?}");
    }
    assert!(!reasons.contains(&"StatefulSetRecreated"), "{reasons:?}");
}

#[test]
fn a_failed_copy_scales_the_deployment_back_on_its_old_claim() {
    let mut sim = Sim::new(deployment_observed(spec_shrink("256Mi")));
    sim.jobs.used_bytes = 1 << 20;
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert_machine_transitions(&sim);
    assert_eq!(sim.step_of("web-7d9f-0"), MemberStep::RolledBack);
    assert_eq!(scales(&sim), vec![0, 1]);
    assert_eq!(replicas(&sim.o), 1);
    assert_eq!(claim_volume(&sim.o.claims["data-web"]), Some("pv-web"));
    assert_eq!(sim.o.pods.len(), 1);
    assert_eq!(sim.o.claims.len(), 1, "temporary claim deleted");
    let message = s.message.clone().unwrap_or_default();
    assert!(
        message.contains("web-7d9f-0 on claim data-web -> original volume pv-web"),
        "{message}"
    );
}

#[test]
fn a_claim_target_a_deployments_pod_mounts_takes_the_deployment_flow() {
    let mut spec = spec_class_change("fast");
    spec.target.kind = TargetKind::PersistentVolumeClaim;
    spec.target.name = "data-web".into();
    let mut o = deployment_observed(spec_class_change("fast"));
    o.request = request(spec);
    o.target_claim_users = vec![ClaimUser {
        pod: "web-7d9f-0".into(),
        owner: Some(("Deployment".into(), "web".into())),
    }];
    let plan = dry_run(&o, &SETTINGS).expect("accepted");
    assert_eq!(plan.deployment.as_deref(), Some("web"));
    assert_eq!(plan.target_claim.as_deref(), Some("data-web"));

    let mut other = o.clone();
    other.request = request(StorageMigrationRequestSpec {
        target: crate::api::TargetRef {
            kind: TargetKind::PersistentVolumeClaim,
            name: "cache".into(),
        },
        ..spec_class_change("fast")
    });
    let (reason, message) = denial(&other);
    assert_eq!(reason, DenialReason::TemplateNotFound);
    assert!(
        message.contains("Deployment web does not mount claim cache (it mounts: data-web)"),
        "{message}"
    );
}

/// The fixture with a change to its Deployment.
fn with_deployment(
    spec: StorageMigrationRequestSpec,
    change: impl FnOnce(&mut k8s_openapi::api::apps::v1::Deployment),
) -> Observed {
    let mut o = deployment_observed(spec);
    if let Some(d) = o.deployment.as_mut() {
        change(d);
    }
    o
}

#[test]
fn deployments_that_cannot_be_stopped_safely_are_denied_naming_why() {
    let spec = spec_class_change("fast");
    let cases: Vec<(Observed, DenialReason, &str)> = vec![
        (
            with_deployment(spec.clone(), |d| {
                d.spec.as_mut().unwrap().replicas = Some(2);
            }),
            DenialReason::ReplicasShareClaim,
            "Deployment web has 2 replicas sharing claim data-web (ReadWriteOnce)",
        ),
        (
            with_deployment(spec.clone(), |d| {
                d.spec.as_mut().unwrap().replicas = Some(0);
            }),
            DenialReason::NoMembers,
            "Deployment web has 0 replicas",
        ),
        (
            with_deployment(spec.clone(), |d| {
                let pod = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
                let mut second = pod.volumes.as_ref().unwrap()[0].clone();
                second.name = "logs".into();
                second.persistent_volume_claim.as_mut().unwrap().claim_name = "logs-web".into();
                pod.volumes.as_mut().unwrap().push(second);
            }),
            // Every claim of the pod template moves: each must be there.
            DenialReason::ClaimNotFound,
            "claim logs-web of member web-7d9f-0 does not exist",
        ),
        (
            with_deployment(spec.clone(), |d| {
                d.spec
                    .as_mut()
                    .unwrap()
                    .template
                    .spec
                    .as_mut()
                    .unwrap()
                    .volumes = None;
            }),
            DenialReason::TemplateNotFound,
            "Deployment web mounts no PersistentVolumeClaim",
        ),
        (
            with_deployment(spec.clone(), |d| {
                d.status.as_mut().unwrap().ready_replicas = Some(0);
            }),
            DenialReason::NotHealthy,
            "Deployment web is not ready: 0 of 1 replicas ready, 1 updated",
        ),
        (
            with_deployment(spec.clone(), |d| {
                d.labels_mut()
                    .insert(crate::labels::ARGOCD_INSTANCE_LABEL.into(), "shop".into());
            }),
            DenialReason::ForeignOwner,
            "Deployment web is managed by Argo CD application shop",
        ),
    ];
    for (o, reason, says) in cases {
        let (got, message) = denial(&o);
        assert_eq!(got, reason, "{message}");
        assert!(message.contains(says), "{message}");
    }

    let mut gone = deployment_observed(spec.clone());
    gone.deployment = None;
    let (reason, message) = denial(&gone);
    assert_eq!(reason, DenialReason::TargetNotFound);
    assert!(message.contains("Deployment web not found"), "{message}");

    let mut etcd = spec.clone();
    etcd.database.engine = DatabaseEngine::Etcd;
    let (reason, message) = denial(&deployment_observed(etcd));
    assert_eq!(reason, DenialReason::InvalidSpec);
    assert!(message.contains("needs a StatefulSet"), "{message}");

    let mut shared = deployment_observed(spec.clone());
    shared.claim_users = std::collections::BTreeMap::from([(
        "data-web".to_string(),
        vec!["backup".to_string(), "web-7d9f-0".to_string()],
    )]);
    let (reason, message) = denial(&shared);
    assert_eq!(reason, DenialReason::ClaimShared);
    assert!(message.contains("also mounted by pod backup"), "{message}");
}

#[test]
fn an_autoscaler_of_the_deployment_is_denied_unless_declared_paused() {
    let mut o = deployment_observed(spec_class_change("fast"));
    o.autoscalers = vec![
        Autoscaler {
            name: "other".into(),
            target_kind: "Deployment".into(),
            target_name: "api".into(),
        },
        Autoscaler {
            name: "web-hpa".into(),
            target_kind: "Deployment".into(),
            target_name: "web".into(),
        },
    ];
    let (reason, message) = denial(&o);
    assert_eq!(reason, DenialReason::Autoscaler);
    assert!(
        message.starts_with("HorizontalPodAutoscaler web-hpa scales Deployment web"),
        "{message}"
    );
    let mut paused = spec_class_change("fast");
    paused.owner_paused = true;
    paused.target = o.request.spec.target.clone();
    o.request = request(paused);
    assert!(dry_run(&o, &SETTINGS).is_ok());
}

#[test]
fn a_pod_replaced_after_preflight_does_not_hold_the_stop_and_a_not_ready_one_does() {
    let mut sim = Sim::new(deployment_observed(spec_class_change("fast")));
    while sim.step_of("web-7d9f-0") < MemberStep::PreCopying {
        assert!(sim.run(1) == 1, "{:?}", sim.status().message);
    }
    // The Deployment replaced its pod (an eviction, a node drain): the member keeps the name
    // it was planned with; the gates look at the pods there are.
    let pod = sim.o.pods.remove("web-7d9f-0").expect("the pod");
    let mut replacement = pod.typed().clone();
    replacement.metadata.name = Some("web-7d9f-9".into());
    sim.o
        .pods
        .insert("web-7d9f-9".into(), manifest(replacement));
    while sim.step_of("web-7d9f-0") < MemberStep::GatingStop {
        assert!(sim.run(1) == 1, "{:?}", sim.status().message);
    }
    assert_eq!(sim.step_of("web-7d9f-0"), MemberStep::GatingStop);
    // Not ready: the stop waits, naming why.
    if let Some(st) = sim.o.deployment.as_mut().and_then(|d| d.status.as_mut()) {
        st.ready_replicas = Some(0);
    }
    let d = decide(&sim.o, &sim.settings);
    assert!(scales_in(&d.actions).is_empty(), "{:?}", d.actions);
    let status = d
        .actions
        .iter()
        .find_map(|a| match a {
            Action::SetStatus(s) => Some(s.clone()),
            _ => None,
        })
        .expect("a status");
    let gate = crate::api::conditions::get(&status.conditions, crate::api::conditions::HEALTH_GATE)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert_eq!(
        gate,
        "Deployment web is not ready: 0 of 1 replicas ready, 1 updated"
    );
    // Ready again (the simulated controller rewrites the status): it goes on to success.
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    assert_eq!(scales(&sim), vec![0, 1]);
}

fn scales_in(actions: &[Action]) -> Vec<i32> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ScaleDeployment { replicas, .. } => Some(*replicas),
            _ => None,
        })
        .collect()
}

/// A bare pod `solo-0` (no controller) mounting claim `data-solo-0`, targeted by its claim.
fn bare_pod_observed(spec: StorageMigrationRequestSpec) -> Observed {
    let mut o = deployment_observed(spec);
    let mut pod = deployment_pod("solo", "solo-0");
    pod.metadata.owner_references = None;
    if let Some(v) = pod.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
        v[0].persistent_volume_claim.as_mut().unwrap().claim_name = "data-solo-0".into();
    }
    o.deployment = None;
    o.pods = std::collections::BTreeMap::from([("solo-0".to_string(), manifest(pod))]);
    o.claims = std::collections::BTreeMap::from([(
        "data-solo-0".to_string(),
        bound_claim("data-solo-0", "standard", "1Gi", "pv-solo"),
    )]);
    o.volumes = std::collections::BTreeMap::from([(
        "pv-solo".to_string(),
        volume("pv-solo", "standard", "1Gi", "data-solo-0", NODES[0]),
    )]);
    o.health = Ok(generic_report(&o.pods));
    let mut spec = o.request.spec.clone();
    spec.target = crate::api::TargetRef {
        kind: TargetKind::PersistentVolumeClaim,
        name: "data-solo-0".into(),
    };
    o.request = request(spec);
    o.target_claim_users = vec![ClaimUser {
        pod: "solo-0".into(),
        owner: None,
    }];
    o
}

#[test]
fn a_bare_pods_claim_moves_with_the_pod_stashed_and_recreated() {
    let plan = dry_run(&bare_pod_observed(spec_class_change("fast")), &SETTINGS).expect("accepted");
    assert_eq!(plan.pod.as_deref(), Some("solo-0"));
    assert_eq!(plan.target_claim.as_deref(), Some("data-solo-0"));
    assert!(!plan.has_stateful_set());

    let mut sim = Sim::new(bare_pod_observed(spec_class_change("fast")));
    sim.run(400);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_machine_transitions(&sim);
    assert_eq!(claim_class(&sim.o.claims["data-solo-0"]), Some("fast"));
    let pod = sim.o.pods.get("solo-0").expect("recreated under its name");
    assert!(
        pod.typed()
            .annotations()
            .contains_key(crate::labels::CREATED_BY_REQUEST_ANNOTATION)
    );
    let message = s.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("migrated claim data-solo-0 of pod solo-0 to StorageClass fast"),
        "{message}"
    );
    let deleted_pods = (sim.log.iter())
        .filter(|a| matches!(a, Action::Delete { kind: Kind::Pod, name, .. } if name == "solo-0"))
        .count();
    assert_eq!(deleted_pods, 1, "stopped once");
    assert!(!sim.log.iter().any(|a| matches!(
        a,
        Action::Create(Object::StatefulSet(_)) | Action::ScaleDeployment { .. }
    )));
}

#[test]
fn a_failed_copy_of_a_bare_pods_claim_recreates_it_on_its_old_claim() {
    let mut sim = Sim::new(bare_pod_observed(spec_class_change("fast")));
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert_eq!(sim.step_of("solo-0"), MemberStep::RolledBack);
    assert_eq!(claim_volume(&sim.o.claims["data-solo-0"]), Some("pv-solo"));
    assert!(
        sim.o.pods.contains_key("solo-0"),
        "recreated from its stash"
    );
}

#[test]
fn a_bare_pod_that_gitops_manages_or_that_is_not_ready_is_denied() {
    let mut o = bare_pod_observed(spec_class_change("fast"));
    if let Some(p) = o.pods.get_mut("solo-0") {
        p.update(|p| {
            p.labels_mut()
                .insert(crate::labels::ARGOCD_INSTANCE_LABEL.into(), "tools".into());
        });
    }
    let (reason, message) = denial(&o);
    assert_eq!(reason, DenialReason::ForeignOwner);
    assert!(
        message.starts_with("pod solo-0 is managed by Argo CD application tools"),
        "{message}"
    );

    let mut o = bare_pod_observed(spec_class_change("fast"));
    if let Some(p) = o.pods.get_mut("solo-0") {
        p.update(|p| p.status = None);
    }
    let (reason, message) = denial(&o);
    assert_eq!(reason, DenialReason::NotHealthy);
    assert!(message.starts_with("pod solo-0 is not Ready"), "{message}");

    let mut spec = spec_class_change("fast");
    spec.volume_claim_template = Some("data".into());
    let mut o = bare_pod_observed(spec_class_change("fast"));
    spec.target = o.request.spec.target.clone();
    o.request = request(spec);
    let (reason, message) = denial(&o);
    assert_eq!(reason, DenialReason::InvalidSpec);
    assert!(message.contains("pod solo-0 has no templates"), "{message}");
}
