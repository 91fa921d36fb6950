//! Every volumeClaimTemplate of a member in one stop: with no `volumeClaimTemplate` (or a list
//! of them) each member's claims move together, each member is stopped once, and the
//! StatefulSet is recreated with every moved template on the target; a Deployment's claims all
//! move in one scale-down.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::fixtures::*;
use super::preflight::{DenialReason, dry_run};
use super::tests::assert_machine_transitions;
use super::*;
use crate::api::{Phase, StorageMigrationRequestSpec};

/// The fixture cluster with a second template, `wal` (512Mi on `standard`): each member has
/// claim `wal-etcd-<i>` bound to volume `pv-wal-<i>`, mounted by its pod.
fn with_wal(spec: StorageMigrationRequestSpec) -> Observed {
    let mut o = observed(spec);
    o.stateful_set.as_mut().expect("a set").update(|s| {
        let mut wal = claim_template("standard", "512Mi");
        wal.metadata.name = Some("wal".into());
        let templates = s
            .spec
            .as_mut()
            .and_then(|s| s.volume_claim_templates.as_mut());
        templates.expect("templates").push(wal);
    });
    for (i, node) in NODES.iter().enumerate() {
        let (claim, pv) = (format!("wal-etcd-{i}"), format!("pv-wal-{i}"));
        let claimed = bound_claim(&claim, "standard", "512Mi", &pv);
        o.claims.insert(claim.clone(), claimed);
        o.volumes
            .insert(pv.clone(), volume(&pv, "standard", "512Mi", &claim, node));
        let pod = o.pods.get_mut(&format!("etcd-{i}")).expect("a member pod");
        pod.update(|p| {
            let volumes = p.spec.as_mut().and_then(|s| s.volumes.as_mut());
            volumes.expect("volumes").push(Volume {
                name: "wal".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: None,
                }),
                ..Default::default()
            });
        });
    }
    o
}

/// How many times the member's pod was deleted.
fn pod_deletions(sim: &Sim, pod: &str) -> usize {
    let deleted = |a: &&Action| {
        matches!(a, Action::Delete { kind: Kind::Pod, name, .. } if name == pod)
            || matches!(a, Action::ForceDeletePod { name, .. } if name == pod)
    };
    sim.log.iter().filter(deleted).count()
}

/// The StatefulSet's template `name`: its class and size.
fn template_of(sim: &Sim, name: &str) -> (Option<String>, Option<String>) {
    let set = sim.o.stateful_set.as_ref().expect("a StatefulSet");
    let templates = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref());
    let t = (templates.into_iter().flatten())
        .find(|t| t.metadata.name.as_deref() == Some(name))
        .expect("the template");
    (
        claim_class(t).map(str::to_string),
        claim_request(t).map(|q| q.0.clone()),
    )
}

#[test]
fn with_no_template_named_every_template_is_planned_per_member() {
    let plan = dry_run(&with_wal(spec_class_change("fast")), &SETTINGS).expect("accepted");
    assert_eq!(plan.volume_claim_template, "data");
    let further: Vec<(&str, &str)> = (plan.further_templates.iter())
        .map(|t| (t.name.as_str(), t.size.0.as_str()))
        .collect();
    assert_eq!(further, [("wal", "512Mi")]);
    for m in &plan.members {
        let i = m.ordinal;
        assert_eq!(m.claim, format!("data-etcd-{i}"));
        assert_eq!(m.further_claims.len(), 1, "{m:?}");
        let wal = &m.further_claims[0];
        assert_eq!(wal.template, "wal");
        assert_eq!(wal.claim, format!("wal-etcd-{i}"));
        assert_eq!(wal.old_volume, format!("pv-wal-{i}"));
        assert_eq!(
            (wal.old_size.0.as_str(), wal.new_size.0.as_str()),
            ("512Mi", "512Mi")
        );
        assert_ne!(wal.temp_claim, m.temp_claim);
        assert_eq!(m.helper_subject(1), format!("etcd-{i}-wal"));
    }
}

#[test]
fn both_templates_move_with_each_member_stopped_once() {
    let mut sim = Sim::new(with_wal(spec_class_change("fast")));
    let rounds = sim.run(800);
    let s = sim.status();
    assert_eq!(
        s.phase,
        Phase::Successful,
        "after {rounds}: {:?} {:#?} {:?}",
        s.message,
        s.members,
        sim.o.claims.keys()
    );
    assert_machine_transitions(&sim);
    let accepted = sim.events.iter().find(|(reason, _)| reason == "Accepted");
    let accepted = accepted.map(|(_, m)| m.as_str()).unwrap_or_default();
    assert!(
        accepted.contains(
            "move to StorageClass fast (templates data 1Gi, wal 512Mi; each member's claims in \
             one stop)"
        ),
        "{accepted}"
    );
    for i in 0..3 {
        let pod = format!("etcd-{i}");
        assert_eq!(pod_deletions(&sim, &pod), 1, "{pod} stopped once");
        for (template, old) in [("data", "pv-old"), ("wal", "pv-wal")] {
            let claim = &sim.o.claims[&format!("{template}-etcd-{i}")];
            assert_eq!(claim_class(claim), Some("fast"), "{template}-etcd-{i}");
            let volume = claim_volume(claim).unwrap_or_default();
            assert_ne!(
                volume,
                format!("{old}-{i}"),
                "{template}-etcd-{i} on a new volume"
            );
        }
        let ms = s.members.iter().find(|m| m.pod == pod).expect("status");
        let wal = &ms.further_claims[0];
        assert_eq!(wal.claim, format!("wal-etcd-{i}"));
        let claim = &sim.o.claims[&format!("wal-etcd-{i}")];
        assert_eq!(wal.new_volume.as_deref(), claim_volume(claim));
        assert!(wal.verified.is_some(), "{wal:?}");
        assert_eq!(wal.old_volume_original_policy.as_deref(), Some("Delete"));
        assert_eq!(ms.claim_index, 0);
    }
    assert_eq!(template_of(&sim, "data").0.as_deref(), Some("fast"));
    assert_eq!(
        template_of(&sim, "wal"),
        (Some("fast".into()), Some("512Mi".into()))
    );
    // The old volumes of both templates are kept until the request succeeded, then get their
    // policy back and the request's label.
    for i in 0..3 {
        let old = &sim.o.volumes[&format!("pv-wal-{i}")];
        assert!(old.labels().contains_key(crate::labels::MIGRATED_BY_LABEL));
    }
    assert!(sim.o.jobs.is_empty() && sim.o.helper_pods.is_empty());
    let temp_left = (sim.o.claims.keys())
        .filter(|c| c.contains("-smr-"))
        .count();
    assert_eq!(temp_left, 0);
}

#[test]
fn a_listed_template_moves_alone() {
    let mut spec = spec_class_change("fast");
    spec.volume_claim_templates = vec!["wal".into()];
    let mut sim = Sim::new(with_wal(spec));
    sim.run(600);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    let plan = sim.status().plan.expect("a plan");
    assert_eq!(plan.volume_claim_template, "wal");
    assert!(plan.further_templates.is_empty());
    for i in 0..3 {
        let data = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_volume(data), Some(format!("pv-old-{i}").as_str()));
        let wal = &sim.o.claims[&format!("wal-etcd-{i}")];
        assert_eq!(claim_class(wal), Some("fast"));
    }
    assert_eq!(template_of(&sim, "data").0.as_deref(), Some("standard"));
    assert_eq!(template_of(&sim, "wal").0.as_deref(), Some("fast"));
}

#[test]
fn a_shrink_takes_a_size_per_template() {
    let mut spec = spec_shrink("256Mi");
    let shrink = spec.shrink.as_mut().expect("shrink");
    shrink.sizes = [("wal".to_string(), Quantity("128Mi".into()))].into();
    let mut sim = Sim::new(with_wal(spec));
    sim.run(800);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    for i in 0..3 {
        for (template, size) in [("data", "256Mi"), ("wal", "128Mi")] {
            let claim = &sim.o.claims[&format!("{template}-etcd-{i}")];
            assert_eq!(claim_request(claim).map(|q| q.0.as_str()), Some(size));
        }
    }
    assert_eq!(template_of(&sim, "data").1.as_deref(), Some("256Mi"));
    assert_eq!(template_of(&sim, "wal").1.as_deref(), Some("128Mi"));
    let plan = sim.status().plan.expect("a plan");
    // Both claims of each member were measured.
    for m in &plan.members {
        assert!(m.used_bytes.is_some() && m.further_claims[0].used_bytes.is_some());
    }
}

#[test]
fn a_failed_copy_of_the_second_claim_rolls_both_back() {
    let mut sim = Sim::new(with_wal(spec_class_change("fast")));
    // The final copy of the first member's wal claim fails, after its data claim's succeeded.
    let first = dry_run(&sim.o, &SETTINGS).expect("accepted").members[0]
        .pod
        .clone();
    sim.jobs.fail_named = Some(format!("{first}-wal-copy"));
    sim.run(800);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert_eq!(sim.step_of(&first), MemberStep::RolledBack);
    assert_eq!(pod_deletions(&sim, &first), 1);
    for template in ["data", "wal"] {
        let (claim, old) = (format!("{template}-{first}"), format!("pv-{template}-"));
        let claimed = &sim.o.claims[&claim];
        assert_eq!(claim_class(claimed), Some("standard"), "{claim}");
        assert!(
            claim_volume(claimed)
                .unwrap_or_default()
                .starts_with(if template == "data" {
                    "pv-old-"
                } else {
                    old.as_str()
                })
        );
    }
    let temp_left = (sim.o.claims.keys())
        .filter(|c| c.contains("-smr-"))
        .count();
    assert_eq!(temp_left, 0, "{:?}", sim.o.claims.keys());
    assert!(sim.o.pods.contains_key(&first));
    let message = s
        .members
        .iter()
        .find(|m| m.pod == first)
        .and_then(|m| m.message.clone());
    let message = message.unwrap_or_default();
    assert!(
        message.contains(&format!("data-{first}")) && message.contains(&format!("wal-{first}")),
        "{message}"
    );
}

#[test]
fn template_lists_and_sizes_are_checked_naming_the_problem() {
    let mut both = spec_class_change("fast");
    both.volume_claim_template = Some("data".into());
    both.volume_claim_templates = vec!["wal".into()];
    let mut twice = spec_class_change("fast");
    twice.volume_claim_templates = vec!["wal".into(), "wal".into()];
    let mut unknown_size = spec_shrink("256Mi");
    let shrink = unknown_size.shrink.as_mut().expect("shrink");
    shrink.sizes = [("logs".to_string(), Quantity("128Mi".into()))].into();
    let mut no_size = spec_shrink("256Mi");
    let shrink = no_size.shrink.as_mut().expect("shrink");
    shrink.size = None;
    shrink.sizes = [("data".to_string(), Quantity("128Mi".into()))].into();
    let cases = [
        (
            both,
            "spec.volumeClaimTemplate and spec.volumeClaimTemplates are both set",
        ),
        (twice, "spec.volumeClaimTemplates names \"wal\" twice"),
        (
            unknown_size,
            "spec.shrink.sizes names \"logs\", which this request does not move",
        ),
        (
            no_size,
            "spec.shrink.sizes has no size for \"wal\" and spec.shrink.size is unset",
        ),
    ];
    for (spec, expected) in cases {
        let (reason, message) = denial(&with_wal(spec));
        assert_eq!(reason, DenialReason::InvalidSpec, "{message}");
        assert!(message.starts_with(expected), "{message}");
    }
}

#[test]
fn a_deployment_moves_every_claim_in_one_scale_down() {
    let mut o = deployment_observed(spec_class_change("fast"));
    let add_logs = |spec: &mut Option<k8s_openapi::api::core::v1::PodSpec>| {
        let volumes = spec
            .as_mut()
            .and_then(|s| s.volumes.as_mut())
            .expect("volumes");
        let mut logs = volumes[0].clone();
        logs.name = "logs".into();
        if let Some(c) = logs.persistent_volume_claim.as_mut() {
            c.claim_name = "logs-web".into();
        }
        volumes.push(logs);
    };
    if let Some(d) = o.deployment.as_mut().and_then(|d| d.spec.as_mut()) {
        add_logs(&mut d.template.spec);
    }
    o.pods
        .get_mut("web-7d9f-0")
        .expect("the pod")
        .update(|p| add_logs(&mut p.spec));
    let claimed = bound_claim("logs-web", "standard", "1Gi", "pv-logs");
    o.claims.insert("logs-web".into(), claimed);
    let pv = volume("pv-logs", "standard", "1Gi", "logs-web", NODES[0]);
    o.volumes.insert("pv-logs".into(), pv);
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    let plan = sim.status().plan.expect("a plan");
    assert_eq!(plan.members[0].further_claims[0].claim, "logs-web");
    let scales: Vec<i32> = (sim.log.iter())
        .filter_map(|a| match a {
            Action::ScaleDeployment { replicas, .. } => Some(*replicas),
            _ => None,
        })
        .collect();
    assert_eq!(scales, [0, 1], "one scale-down, one scale-up");
    for claim in ["data-web", "logs-web"] {
        assert_eq!(claim_class(&sim.o.claims[claim]), Some("fast"), "{claim}");
    }
}

/// `with_wal`, its wal template, claims and volumes already on `fast` (an earlier request moved
/// them).
fn with_wal_on_fast(spec: StorageMigrationRequestSpec) -> Observed {
    let mut o = with_wal(spec);
    o.stateful_set.as_mut().expect("a set").update(|s| {
        let templates = s
            .spec
            .as_mut()
            .and_then(|s| s.volume_claim_templates.as_mut());
        let wal = &mut templates.expect("templates")[1];
        wal.spec.as_mut().expect("a spec").storage_class_name = Some("fast".into());
    });
    for (i, node) in NODES.iter().enumerate() {
        let (claim, pv) = (format!("wal-etcd-{i}"), format!("pv-wal-{i}"));
        let on_fast = bound_claim(&claim, "fast", "512Mi", &pv);
        o.claims.insert(claim.clone(), on_fast);
        o.volumes
            .insert(pv.clone(), volume(&pv, "fast", "512Mi", &claim, node));
    }
    o
}

#[test]
fn with_no_template_named_a_template_already_there_is_left_out() {
    let plan = dry_run(&with_wal_on_fast(spec_class_change("fast")), &SETTINGS);
    let plan = plan.expect("accepted");
    assert_eq!(plan.volume_claim_template, "data");
    assert!(plan.further_templates.is_empty(), "{plan:?}");
    assert!(plan.members.iter().all(|m| m.further_claims.is_empty()));
    // Named, it is denied, naming it: the list asks for a move that has nothing to do.
    let mut spec = spec_class_change("fast");
    spec.volume_claim_templates = vec!["data".into(), "wal".into()];
    let (reason, message) = denial(&with_wal_on_fast(spec));
    assert_eq!(reason, DenialReason::SameStorageClass, "{message}");
    assert!(message.contains("volumeClaimTemplate wal, are already on StorageClass fast"));
}

/// The final check of a `Generic` request covers every claim the plan gives a member: a further
/// claim with no verification on record (here its status is missing altogether) fails it, and
/// no old volume gets back a policy that can delete it.
#[test]
fn the_final_check_wants_every_planned_claim_verified() {
    let mut sim = Sim::new(with_wal(spec_class_change("fast")));
    for _ in 0..400 {
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
        if sim.status().stage == Stage::Finalizing {
            break;
        }
    }
    assert_eq!(sim.status().stage, Stage::Finalizing);
    let ms = &mut sim.o.request.status.as_mut().expect("a status").members[1];
    assert_eq!(ms.further_claims.len(), 1, "{ms:?}");
    ms.further_claims.clear();
    let pod = ms.pod.clone();
    sim.run(100);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    let failure = s.failure.unwrap_or_default();
    assert!(
        failure.contains(&format!("no verification on record for members {pod}")),
        "{failure}"
    );
    let old_volume = |v: &str| v.starts_with("pv-old-") || v.starts_with("pv-wal-");
    let restored = |a: &Action| {
        matches!(a, Action::PatchReclaimPolicy { volume, policy }
            if policy != "Retain" && old_volume(volume))
    };
    assert!(!sim.log.iter().any(restored), "{:?}", sim.log);
}
