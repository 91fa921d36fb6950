//! Unit tests of each preflight check on pure inputs: `Ok`, or the expected [`DenialReason`]
//! with a message naming the problem. The whole preflight (through `decide`) is covered in
//! `plan::tests`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::*;
use crate::api::{ApplyPolicy, PlannedMember, PlannedWork, Role};
use crate::engine::generic::GenericRules;
use crate::engine::{HealthUnavailable, MemberHealth};
use crate::plan::fixtures::*;
use crate::plan::{JobOutcome, Observed, ObservedJob, OtherRequest};

/// The reason of a denial; panics on `Ok`.
fn reason<T: std::fmt::Debug>(r: Result<T, Denial>) -> DenialReason {
    r.expect_err("expected a denial").reason
}

/// The whole decision on `o`, and the status it writes (panics when it writes none).
fn decided_status(
    o: &Observed,
) -> (
    crate::plan::Decision,
    crate::api::StorageMigrationRequestStatus,
) {
    let decision = crate::plan::decide(o, &SETTINGS);
    let status = decision
        .actions
        .iter()
        .find_map(|a| match a {
            crate::plan::Action::SetStatus(s) => Some((**s).clone()),
            _ => None,
        })
        .expect("a status write");
    (decision, status)
}

/// The denial; panics on `Ok`.
fn denied<T: std::fmt::Debug>(r: Result<T, Denial>) -> Denial {
    r.expect_err("expected a denial")
}

fn terminating<K: kube::Resource>(mut obj: K) -> K {
    obj.meta_mut().deletion_timestamp = Some(Time(t(5)));
    obj
}

fn planned(ordinal: i32, size: &str) -> PlannedMember {
    PlannedMember {
        ordinal,
        pod: format!("etcd-{ordinal}"),
        node: NODES[ordinal as usize % 3].to_string(),
        claim: format!("data-etcd-{ordinal}"),
        old_volume: format!("pv-old-{ordinal}"),
        temp_claim: format!("temp-{ordinal}"),
        old_size: Quantity(size.to_string()),
        new_size: Quantity(size.to_string()),
        used_bytes: None,
        role: None,
        work: PlannedWork::Migrate,
        further_claims: Vec::new(),
    }
}

// ---- spec ----------------------------------------------------------------------------------

#[test]
fn class_change_spec_needs_a_class_and_no_shrink() {
    assert!(spec::check_class_change_spec(&spec_class_change("fast")).is_ok());
    let mut s = spec_class_change("fast");
    s.storage_class_change = None;
    assert_eq!(
        denied(spec::check_class_change_spec(&s)).message,
        "type StorageClassChange needs spec.storageClassChange.storageClassName"
    );
    let s = spec_class_change("  ");
    assert_eq!(
        denied(spec::check_class_change_spec(&s)).message,
        "spec.storageClassChange.storageClassName is empty"
    );
    let mut s = spec_class_change("fast");
    s.shrink = spec_shrink("1Mi").shrink;
    let d = denied(spec::check_class_change_spec(&s));
    assert_eq!(d.reason, DenialReason::InvalidSpec);
    assert_eq!(
        d.message,
        "type StorageClassChange does not take spec.shrink"
    );
}

#[test]
fn shrink_spec_needs_a_positive_size_and_no_class() {
    assert!(spec::check_shrink_spec(&spec_shrink("256Mi")).is_ok());
    let mut s = spec_shrink("1Mi");
    s.shrink = None;
    assert_eq!(
        denied(spec::check_shrink_spec(&s)).message,
        "type Shrink needs spec.shrink.size (or spec.shrink.sizes, one per template)"
    );
    assert_eq!(
        denied(spec::check_shrink_spec(&spec_shrink("0"))).message,
        "spec.shrink.size must be positive"
    );
    assert_eq!(
        denied(spec::check_shrink_spec(&spec_shrink("small"))).message,
        "spec.shrink.size \"small\" is not a quantity"
    );
    let mut s = spec_shrink("1Mi");
    s.storage_class_change = spec_class_change("fast").storage_class_change;
    let d = denied(spec::check_shrink_spec(&s));
    assert_eq!(d.reason, DenialReason::InvalidSpec);
    assert_eq!(
        d.message,
        "type Shrink does not take spec.storageClassChange"
    );
}

#[test]
fn timeout_and_target_name() {
    assert!(spec::check_timeout("1h30m").is_ok());
    let d = denied(spec::check_timeout("soon"));
    assert_eq!(d.reason, DenialReason::InvalidSpec);
    assert!(d.message.starts_with("spec.timeout: "), "{}", d.message);
    assert!(
        d.message.ends_with(" (use e.g. 30m or 1h30m)"),
        "{}",
        d.message
    );
    assert_eq!(reason(spec::check_timeout("0s")), DenialReason::InvalidSpec);
    assert!(spec::check_target_name("etcd").is_ok());
    assert_eq!(
        denied(spec::check_target_name(" ")).message,
        "spec.target.name is empty"
    );
}

#[test]
fn pre_copy_bandwidth_is_a_quantity_of_at_least_one_kib() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut s = spec_class_change("fast");
    assert!(spec::check_pre_copy_bandwidth(&s.copy).is_ok(), "unset");
    for good in ["50Mi", "1Ki", "1024", "1G"] {
        s.copy.pre_copy_bandwidth = Some(Quantity(good.into()));
        assert!(spec::check_pre_copy_bandwidth(&s.copy).is_ok(), "{good}");
    }
    s.copy.pre_copy_bandwidth = Some(Quantity("fast".into()));
    let d = denied(validate_spec(&s));
    assert_eq!(d.reason, DenialReason::InvalidSpec);
    assert_eq!(
        d.message,
        "spec.copy.preCopyBandwidth \"fast\" is not a quantity (use e.g. 50Mi, per second)"
    );
    for low in ["1023", "0", "-5Mi"] {
        s.copy.pre_copy_bandwidth = Some(Quantity(low.into()));
        let d = denied(spec::check_pre_copy_bandwidth(&s.copy));
        assert!(
            d.message.contains("is below 1Ki per second"),
            "{low}: {}",
            d.message
        );
    }
}

#[test]
fn validate_spec_reports_the_type_before_the_timeout() {
    assert!(validate_spec(&spec_class_change("fast")).is_ok());
    let mut s = spec_class_change("");
    s.timeout = "soon".into();
    s.target.name = String::new();
    assert_eq!(
        denied(validate_spec(&s)).message,
        "spec.storageClassChange.storageClassName is empty"
    );
    s.storage_class_change = spec_class_change("fast").storage_class_change;
    assert!(
        denied(validate_spec(&s))
            .message
            .starts_with("spec.timeout")
    );
    s.timeout = "30m".into();
    assert_eq!(
        denied(validate_spec(&s)).message,
        "spec.target.name is empty"
    );
}

// ---- target --------------------------------------------------------------------------------

#[test]
fn target_exists_unless_missing_or_terminating() {
    let set = manifest(stateful_set(3));
    let found = target::check_target_exists(Some(&set), "etcd", NS).unwrap();
    assert_eq!(found.name_any(), "etcd");
    let d = denied(target::check_target_exists(None, "etcd", NS));
    assert_eq!(d.reason, DenialReason::TargetNotFound);
    assert_eq!(d.message, "StatefulSet etcd not found in namespace demo");
    let gone = manifest(terminating(stateful_set(3)));
    assert_eq!(
        reason(target::check_target_exists(Some(&gone), "etcd", NS)),
        DenialReason::TargetNotFound
    );
}

// ---- other owners --------------------------------------------------------------------------

fn labelled(pairs: &[(&str, &str)]) -> k8s_openapi::api::apps::v1::StatefulSet {
    let mut set = stateful_set(3);
    for (k, v) in pairs {
        set.labels_mut().insert(k.to_string(), v.to_string());
    }
    set
}

fn owned_by(
    kind: &str,
    name: &str,
    controller: Option<bool>,
) -> k8s_openapi::api::apps::v1::StatefulSet {
    let mut set = stateful_set(3);
    set.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "example.com/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u-1".into(),
            controller,
            ..Default::default()
        },
    ]);
    set
}

#[test]
fn no_other_owner_passes() {
    assert_eq!(owner::check_owner(&stateful_set(3), false), Ok(None));
    // The instance label alone is set by many charts: not Argo CD's tracking.
    let chart = labelled(&[("app.kubernetes.io/instance", "etcd")]);
    assert_eq!(owner::check_owner(&chart, false), Ok(None));
}

#[test]
fn a_controller_owner_is_named_and_denied() {
    let set = owned_by("EtcdCluster", "main", Some(true));
    let d = denied(owner::check_owner(&set, false));
    assert_eq!(d.reason, DenialReason::ForeignOwner);
    assert!(
        d.message
            .starts_with("StatefulSet etcd is managed by EtcdCluster main (its controller)"),
        "{}",
        d.message
    );
    assert!(
        d.message
            .contains("pause the reconciliation of the EtcdCluster"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("spec.ownerPaused: true"),
        "{}",
        d.message
    );
}

#[test]
fn an_owner_that_is_not_the_controller_is_ignored() {
    for controller in [Some(false), None] {
        let set = owned_by("ConfigMap", "holder", controller);
        assert_eq!(owner::check_owner(&set, false), Ok(None));
    }
}

#[test]
fn argo_cd_is_found_by_its_tracking_id_or_instance_label() {
    let mut set = stateful_set(3);
    set.annotations_mut().insert(
        crate::labels::ARGOCD_TRACKING_ID_ANNOTATION.into(),
        "db:apps/StatefulSet:demo/etcd".into(),
    );
    let d = denied(owner::check_owner(&set, false));
    assert_eq!(d.reason, DenialReason::ForeignOwner);
    assert!(
        d.message.contains("managed by Argo CD application db,"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("disable automated sync and self-heal"),
        "{}",
        d.message
    );
    let set = labelled(&[(crate::labels::ARGOCD_INSTANCE_LABEL, "db2")]);
    assert_eq!(
        foreign_owner(&set),
        Some(ForeignOwner::ArgoCd {
            application: "db2".into()
        })
    );
}

#[test]
fn flux_kustomization_and_helm_release_are_named() {
    let [name, ns] = crate::labels::FLUX_KUSTOMIZATION_LABELS;
    let set = labelled(&[(name, "apps"), (ns, "flux-system")]);
    let d = denied(owner::check_owner(&set, false));
    assert_eq!(d.reason, DenialReason::ForeignOwner);
    assert!(
        d.message.contains("Flux Kustomization flux-system/apps"),
        "{}",
        d.message
    );
    assert!(
        d.message
            .contains("`flux suspend kustomization apps -n flux-system`"),
        "{}",
        d.message
    );
    let [name, ns] = crate::labels::FLUX_HELM_RELEASE_LABELS;
    let set = labelled(&[(name, "etcd"), (ns, "infra")]);
    let d = denied(owner::check_owner(&set, false));
    assert!(
        d.message.contains("Flux HelmRelease infra/etcd"),
        "{}",
        d.message
    );
    assert!(
        d.message
            .contains("`flux suspend helmrelease etcd -n infra`"),
        "{}",
        d.message
    );
    // Without its namespace label the Flux object is taken to be in the set's namespace.
    let set = labelled(&[(name, "etcd")]);
    assert_eq!(
        foreign_owner(&set),
        Some(ForeignOwner::FluxHelmRelease {
            namespace: NS.into(),
            name: "etcd".into()
        })
    );
}

#[test]
fn a_declared_pause_lets_the_owner_pass() {
    let set = owned_by("EtcdCluster", "main", Some(true));
    let owner = owner::check_owner(&set, true).unwrap();
    assert_eq!(
        owner,
        Some(ForeignOwner::Controller {
            kind: "EtcdCluster".into(),
            name: "main".into()
        })
    );
    assert_eq!(owner::check_owner(&stateful_set(3), true), Ok(None));
}

#[test]
fn an_owned_set_is_denied_after_the_target_check_and_accepted_when_paused() {
    let [name, ns] = crate::labels::FLUX_KUSTOMIZATION_LABELS;
    let mut o = observed(spec_class_change("fast"));
    let mut set = o.stateful_set.take().unwrap().typed().clone();
    set.labels_mut().insert(name.into(), "apps".into());
    set.labels_mut().insert(ns.into(), "flux-system".into());
    o.stateful_set = Some(manifest(set));
    assert_eq!(reason(dry_run(&o, &SETTINGS)), DenialReason::ForeignOwner);
    o.request.spec.owner_paused = true;
    assert!(dry_run(&o, &SETTINGS).is_ok());
    let d = crate::plan::decide(&o, &SETTINGS);
    let accepted = match d.actions.first() {
        Some(crate::plan::Action::SetStatus(s)) => s.message.clone().unwrap_or_default(),
        other => panic!("expected SetStatus first, got {other:?}"),
    };
    assert!(
        accepted
            .ends_with("; Flux Kustomization flux-system/apps declared paused by spec.ownerPaused"),
        "{accepted}"
    );
}

#[test]
fn templates_are_the_named_ones_or_every_one() {
    let names =
        |r: Result<Vec<k8s_openapi::api::core::v1::PersistentVolumeClaim>, Denial>| -> Vec<String> {
            r.unwrap().iter().map(|t| t.name_any()).collect()
        };
    let list = |names: &[&str]| -> Vec<String> { names.iter().map(|n| n.to_string()).collect() };
    let mut set = stateful_set(3);
    assert_eq!(names(target::choose_templates(&set, &[])), ["data"]);
    assert_eq!(choose_template(&set, "data").unwrap().name_any(), "data");
    let d = denied(choose_template(&set, "logs"));
    assert_eq!(d.reason, DenialReason::TemplateNotFound);
    assert_eq!(
        d.message,
        "StatefulSet etcd has no volumeClaimTemplate \"logs\""
    );

    let mut logs = claim_template("standard", "1Gi");
    logs.metadata.name = Some("logs".into());
    let templates = set.spec.as_mut().unwrap().volume_claim_templates.as_mut();
    templates.unwrap().push(logs);
    // None named: every one, in the set's order; named: those, in the order named.
    assert_eq!(names(target::choose_templates(&set, &[])), ["data", "logs"]);
    let named = target::choose_templates(&set, &list(&["logs", "data"]));
    assert_eq!(names(named), ["logs", "data"]);
    let missing = target::choose_templates(&set, &list(&["data", "wal"]));
    assert_eq!(denied(missing).reason, DenialReason::TemplateNotFound);

    set.spec.as_mut().unwrap().volume_claim_templates = None;
    let d = denied(target::choose_templates(&set, &[]));
    assert_eq!(d.reason, DenialReason::TemplateNotFound);
    assert!(d.message.contains("nothing to migrate"), "{}", d.message);
}

#[test]
fn template_must_be_a_filesystem_volume() {
    let mut template = claim_template("standard", "1Gi");
    assert!(target::check_template_volume_mode(&template).is_ok());
    template.spec.as_mut().unwrap().volume_mode = None;
    assert!(target::check_template_volume_mode(&template).is_ok());
    template.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let d = denied(target::check_template_volume_mode(&template));
    assert_eq!(d.reason, DenialReason::UnsupportedVolumeMode);
    assert_eq!(
        d.message,
        "volumeClaimTemplate data has volumeMode Block; only Filesystem volumes can be copied"
    );
}

#[test]
fn queue_waits_for_the_progressing_one_else_the_oldest_pending_one() {
    let other = |name: &str, created: Option<i64>, phase| OtherRequest {
        name: name.into(),
        created: created.map(t),
        phase,
    };
    let ahead = |others: &[OtherRequest]| {
        waiting_for("move", Some(t(0)), others).map(|a| (a.name.to_string(), a.phase))
    };
    assert_eq!(ahead(&[]), None);
    // Newer and pending, or finished (even older): not in the way.
    assert_eq!(ahead(&[other("later", Some(10), Phase::Pending)]), None);
    for phase in [Phase::Successful, Phase::Failed, Phase::Denied] {
        assert_eq!(
            ahead(&[other("first", Some(-10), phase)]),
            None,
            "{phase:?}"
        );
    }
    // Older and pending: judged first.
    assert_eq!(
        ahead(&[other("first", Some(-10), Phase::Pending)]),
        Some(("first".into(), Phase::Pending))
    );
    // Progressing, even when newer: it runs; it is named before any older pending one.
    assert_eq!(
        ahead(&[
            other("first", Some(-10), Phase::Pending),
            other("later", Some(10), Phase::Progressing),
        ]),
        Some(("later".into(), Phase::Progressing))
    );
    // Several older pending ones: the oldest (the head of the queue) is named.
    assert_eq!(
        ahead(&[
            other("second", Some(-5), Phase::Pending),
            other("first", Some(-10), Phase::Pending),
            other("gone", Some(-20), Phase::Denied),
        ]),
        Some(("first".into(), Phase::Pending))
    );
    // Same creation time: the name decides; no creation time: the name alone.
    assert_eq!(ahead(&[other("zzz", Some(0), Phase::Pending)]), None);
    assert_eq!(
        ahead(&[other("aaa", Some(0), Phase::Pending)]),
        Some(("aaa".into(), Phase::Pending))
    );
    assert_eq!(
        ahead(&[
            other("mmm", Some(0), Phase::Pending),
            other("aaa", Some(0), Phase::Pending),
        ]),
        Some(("aaa".into(), Phase::Pending))
    );
    assert!(ahead(&[other("aaa", None, Phase::Pending)]).is_some());
    assert!(ahead(&[other("zzz", Some(-10), Phase::Pending)]).is_some());
    let others = [other("zzz", Some(-10), Phase::Pending)];
    let by_name = waiting_for("move", None, &others);
    assert_eq!(by_name, None, "by name alone: zzz is after move");
}

// ---- members -------------------------------------------------------------------------------

#[test]
fn ordinals_come_from_replicas_and_start() {
    let mut set = stateful_set(3);
    assert_eq!(members::check_ordinals(&set, "etcd").unwrap(), 0..3);
    set.spec.as_mut().unwrap().ordinals = Some(Default::default());
    set.spec.as_mut().unwrap().ordinals.as_mut().unwrap().start = Some(5);
    assert_eq!(members::check_ordinals(&set, "etcd").unwrap(), 5..8);
    set.spec.as_mut().unwrap().replicas = None;
    assert_eq!(members::check_ordinals(&set, "etcd").unwrap(), 5..6);
    let d = denied(members::check_ordinals(&stateful_set(0), "etcd"));
    assert_eq!(d.reason, DenialReason::NoMembers);
    assert_eq!(
        d.message,
        "StatefulSet etcd has 0 replicas: nothing to migrate"
    );
}

#[test]
fn member_pod_exists_and_is_scheduled() {
    let mut pods = BTreeMap::from([("etcd-0".to_string(), manifest(member_pod(0)))]);
    let pod = members::check_pod_exists(&pods, "etcd-0").unwrap();
    assert_eq!(members::check_scheduled(pod, "etcd-0").unwrap(), "node-a");
    let d = denied(members::check_pod_exists(&pods, "etcd-1"));
    assert_eq!(d.reason, DenialReason::MemberMissing);
    assert_eq!(
        d.message,
        "member pod etcd-1 does not exist; every member must run before a migration"
    );
    pods.insert("etcd-0".into(), manifest(terminating(member_pod(0))));
    assert_eq!(
        reason(members::check_pod_exists(&pods, "etcd-0")),
        DenialReason::MemberMissing
    );

    let mut pod = member_pod(0);
    pod.spec.as_mut().unwrap().node_name = Some(String::new());
    let d = denied(members::check_scheduled(&pod, "etcd-0"));
    assert_eq!(d.reason, DenialReason::MemberNotScheduled);
    assert_eq!(d.message, "member pod etcd-0 is not scheduled on a node");
    pod.spec.as_mut().unwrap().node_name = None;
    assert_eq!(
        reason(members::check_scheduled(&pod, "etcd-0")),
        DenialReason::MemberNotScheduled
    );
}

#[test]
fn member_claim_exists_and_is_mounted() {
    let claims = BTreeMap::from([(
        "data-etcd-0".to_string(),
        bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0"),
    )]);
    assert!(members::check_claim_exists(&claims, "data-etcd-0", "etcd-0").is_ok());
    let d = denied(members::check_claim_exists(
        &claims,
        "data-etcd-1",
        "etcd-1",
    ));
    assert_eq!(d.reason, DenialReason::ClaimNotFound);
    assert_eq!(
        d.message,
        "claim data-etcd-1 of member etcd-1 does not exist"
    );

    let pod = member_pod(0);
    assert!(members::check_pod_mounts_claim(&pod, "data-etcd-0", "etcd-0").is_ok());
    let d = denied(members::check_pod_mounts_claim(
        &pod,
        "data-etcd-1",
        "etcd-0",
    ));
    assert_eq!(d.reason, DenialReason::ClaimNotFound);
    assert_eq!(
        d.message,
        "member pod etcd-0 does not mount claim data-etcd-1"
    );
}

#[test]
fn member_claim_is_bound_to_an_existing_volume() {
    let claim = bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
    assert_eq!(
        members::check_claim_bound(&claim, "data-etcd-0", "etcd-0").unwrap(),
        "pv-old-0"
    );
    let mut pending = claim.clone();
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    let d = denied(members::check_claim_bound(
        &pending,
        "data-etcd-0",
        "etcd-0",
    ));
    assert_eq!(d.reason, DenialReason::ClaimNotBound);
    assert_eq!(
        d.message,
        "claim data-etcd-0 of member etcd-0 is Pending, not Bound"
    );
    let mut no_volume = claim.clone();
    no_volume.spec.as_mut().unwrap().volume_name = Some(String::new());
    let d = denied(members::check_claim_bound(
        &no_volume,
        "data-etcd-0",
        "etcd-0",
    ));
    assert_eq!(
        d.message,
        "claim data-etcd-0 of member etcd-0 is Bound, not Bound"
    );
    assert_eq!(
        reason(members::check_claim_bound(&terminating(claim), "c", "p")),
        DenialReason::ClaimNotBound
    );

    let volumes = BTreeMap::from([(
        "pv-old-0".to_string(),
        volume("pv-old-0", "standard", "1Gi", "data-etcd-0", "node-a"),
    )]);
    assert!(members::check_volume_exists(&volumes, "pv-old-0", "data-etcd-0").is_ok());
    let d = denied(members::check_volume_exists(
        &volumes,
        "pv-x",
        "data-etcd-0",
    ));
    assert_eq!(d.reason, DenialReason::VolumeNotFound);
    assert_eq!(d.message, "volume pv-x of claim data-etcd-0 does not exist");
}

#[test]
fn member_claim_is_a_filesystem_volume_with_a_request() {
    let mut claim = bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
    assert!(members::check_claim_volume_mode(&claim, "data-etcd-0").is_ok());
    assert_eq!(
        members::check_claim_request(&claim, "data-etcd-0").unwrap(),
        Quantity("1Gi".into())
    );
    claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let d = denied(members::check_claim_volume_mode(&claim, "data-etcd-0"));
    assert_eq!(d.reason, DenialReason::UnsupportedVolumeMode);
    assert_eq!(
        d.message,
        "claim data-etcd-0 has volumeMode Block; only Filesystem volumes can be copied"
    );

    let requests = |c: &mut k8s_openapi::api::core::v1::PersistentVolumeClaim| {
        c.spec
            .as_mut()
            .unwrap()
            .resources
            .as_mut()
            .unwrap()
            .requests = None;
    };
    let mut no_request = claim.clone();
    requests(&mut no_request);
    let d = denied(members::check_claim_request(&no_request, "data-etcd-0"));
    assert_eq!(d.reason, DenialReason::InvalidClaim);
    assert_eq!(d.message, "claim data-etcd-0 has no storage request");
    let mut bad = bound_claim("data-etcd-0", "standard", "lots", "pv-old-0");
    let d = denied(members::check_claim_request(&bad, "data-etcd-0"));
    assert_eq!(d.reason, DenialReason::InvalidClaim);
    assert_eq!(
        d.message,
        "claim data-etcd-0 requests \"lots\", not a quantity"
    );
    bad.spec.as_mut().unwrap().volume_mode = None;
    assert!(members::check_claim_volume_mode(&bad, "data-etcd-0").is_ok());
}

fn names() -> members::Names {
    members::Names {
        request: REQ.into(),
        set: "etcd".into(),
        template: "data".into(),
    }
}

#[test]
fn member_is_planned_from_its_pod_claim_and_volume() {
    let o = observed(spec_class_change("fast"));
    let (m, class) = members::check_member(&o, &names(), 1).unwrap();
    assert_eq!(class, "standard");
    assert_eq!(
        m,
        PlannedMember {
            ordinal: 1,
            pod: "etcd-1".into(),
            node: "node-b".into(),
            claim: "data-etcd-1".into(),
            old_volume: "pv-old-1".into(),
            temp_claim: crate::build::temp_claim_name(REQ, "data-etcd-1"),
            old_size: Quantity("1Gi".into()),
            new_size: Quantity("1Gi".into()),
            used_bytes: None,
            role: None,
            work: PlannedWork::Migrate,
            further_claims: Vec::new(),
        }
    );
}

#[test]
fn member_checks_run_in_order() {
    // Pod missing and claim missing: the pod is reported.
    let mut o = observed(spec_class_change("fast"));
    o.pods.remove("etcd-2");
    o.claims.remove("data-etcd-2");
    assert_eq!(
        reason(members::check_member(&o, &names(), 2)),
        DenialReason::MemberMissing
    );
    // Claim missing and volume missing: the claim.
    let mut o = observed(spec_class_change("fast"));
    o.claims.remove("data-etcd-2");
    o.volumes.remove("pv-old-2");
    assert_eq!(
        reason(members::check_member(&o, &names(), 2)),
        DenialReason::ClaimNotFound
    );
    // Volume missing and a Block claim: the volume.
    let mut o = observed(spec_class_change("fast"));
    o.volumes.remove("pv-old-2");
    let claim = o.claims.get_mut("data-etcd-2").unwrap();
    claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert_eq!(
        reason(members::check_member(&o, &names(), 2)),
        DenialReason::VolumeNotFound
    );
}

#[test]
fn leader_goes_last_followers_by_ordinal() {
    let mut ms: Vec<PlannedMember> = (0..4).map(|i| planned(i, "1Gi")).collect();
    ms[1].role = Some(Role::Leader);
    ms[0].role = Some(Role::Follower);
    ms.reverse();
    members::order(&mut ms);
    let order: Vec<i32> = ms.iter().map(|m| m.ordinal).collect();
    assert_eq!(order, [0, 2, 3, 1]);
}

#[test]
fn members_already_there_come_first_and_the_leader_still_last() {
    let mut ms: Vec<PlannedMember> = (0..4).map(|i| planned(i, "1Gi")).collect();
    ms[1].role = Some(Role::Leader);
    ms[2].work = PlannedWork::AlreadyThere;
    ms[3].role = Some(Role::Leader);
    ms[3].work = PlannedWork::AlreadyThere;
    ms.reverse();
    members::order(&mut ms);
    let order: Vec<i32> = ms.iter().map(|m| m.ordinal).collect();
    assert_eq!(
        order,
        [2, 3, 0, 1],
        "already there (by ordinal), then followers, leader last"
    );
}

// ---- classes and sizes ---------------------------------------------------------------------

#[test]
fn source_classes_are_sorted_and_distinct() {
    let classes = ["b", "a", "b", ""].map(String::from).to_vec();
    assert_eq!(classes::distinct(classes), ["", "a", "b"]);
}

#[test]
fn target_class_is_the_requested_one_or_the_one_shrunk() {
    let one = vec!["standard".to_string()];
    let two = vec!["fast".to_string(), "standard".to_string()];
    let change = spec_class_change("fast");
    assert_eq!(classes::check_target_class(&change, &two).unwrap(), "fast");
    let shrink = spec_shrink("256Mi");
    assert_eq!(
        classes::check_target_class(&shrink, &one).unwrap(),
        "standard"
    );
    assert_eq!(classes::check_target_class(&shrink, &[]).unwrap(), "");
    let d = denied(classes::check_target_class(&shrink, &two));
    assert_eq!(d.reason, DenialReason::MixedStorageClasses);
    assert_eq!(
        d.message,
        "the members' claims are on different StorageClasses (fast, standard); migrate them to \
         one class first"
    );
}

#[test]
fn target_class_exists_and_differs() {
    let o = observed(spec_class_change("fast"));
    assert!(classes::check_storage_class(&o.storage_classes, "fast").is_ok());
    let d = denied(classes::check_storage_class(&o.storage_classes, "gold"));
    assert_eq!(d.reason, DenialReason::StorageClassNotFound);
    assert_eq!(d.message, "StorageClass \"gold\" does not exist");
}

/// Moves member `ordinal`'s claim and volume to `class` (as a request that migrated it would).
fn move_member(o: &mut Observed, ordinal: usize, class: &str) {
    let claim = o.claims.get_mut(&format!("data-etcd-{ordinal}")).unwrap();
    claim.spec.as_mut().unwrap().storage_class_name = Some(class.into());
    let pv = o.volumes.get_mut(&format!("pv-old-{ordinal}")).unwrap();
    pv.spec.as_mut().unwrap().storage_class_name = Some(class.into());
}

/// The members' planned work, by ordinal.
fn work_of(o: &Observed, ms: &mut [PlannedMember], target: &str) -> Vec<PlannedWork> {
    classes::mark_on_class(o, ms, target);
    ms.iter().map(|m| m.work).collect()
}

#[test]
fn a_member_is_already_there_when_its_claim_and_volume_are_on_the_target() {
    use PlannedWork::{AlreadyThere, Migrate};
    let mut o = observed(spec_class_change("fast"));
    let mut ms: Vec<PlannedMember> = (0..3).map(|i| planned(i, "1Gi")).collect();
    assert_eq!(work_of(&o, &mut ms, "fast"), [Migrate, Migrate, Migrate]);
    move_member(&mut o, 0, "fast");
    assert_eq!(
        work_of(&o, &mut ms, "fast"),
        [AlreadyThere, Migrate, Migrate]
    );
    // Only the claim, or only the volume, on the target: not there.
    let mut ms: Vec<PlannedMember> = (0..3).map(|i| planned(i, "1Gi")).collect();
    let claim = o.claims.get_mut("data-etcd-1").unwrap();
    claim.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
    let pv = o.volumes.get_mut("pv-old-2").unwrap();
    pv.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
    assert_eq!(
        work_of(&o, &mut ms, "fast"),
        [AlreadyThere, Migrate, Migrate]
    );
    // Back to the source class: the other way round.
    let mut ms: Vec<PlannedMember> = (0..3).map(|i| planned(i, "1Gi")).collect();
    move_member(&mut o, 1, "standard");
    move_member(&mut o, 2, "standard");
    assert_eq!(
        work_of(&o, &mut ms, "standard"),
        [Migrate, AlreadyThere, AlreadyThere]
    );
}

#[test]
fn same_class_is_denied_only_when_every_member_and_the_template_are_there() {
    let mut ms: Vec<PlannedMember> = (0..2).map(|i| planned(i, "1Gi")).collect();
    let template = claim_template("standard", "1Gi");
    ms[0].work = PlannedWork::AlreadyThere;
    assert!(classes::check_not_all_on_class(&ms, Some(&template), "standard").is_ok());
    ms[1].work = PlannedWork::AlreadyThere;
    let d = denied(classes::check_not_all_on_class(
        &ms,
        Some(&template),
        "standard",
    ));
    assert_eq!(d.reason, DenialReason::SameStorageClass);
    assert_eq!(
        d.message,
        "every member's claim and volume, and the StatefulSet's volumeClaimTemplate data, are \
         already on StorageClass standard: nothing to do"
    );
    // Every member there but the template is not: accepted, to recreate the set.
    let other = claim_template("slow", "1Gi");
    assert!(classes::check_not_all_on_class(&ms, Some(&other), "standard").is_ok());
}

#[test]
fn classes_of_the_members_to_migrate_only() {
    let mut ms: Vec<PlannedMember> = (0..3).map(|i| planned(i, "1Gi")).collect();
    let classes = ["fast", "standard", "standard"].map(String::from).to_vec();
    ms[0].work = PlannedWork::AlreadyThere;
    assert_eq!(classes::migrating_classes(&ms, &classes), ["standard"]);
    ms[1].work = PlannedWork::AlreadyThere;
    ms[2].work = PlannedWork::AlreadyThere;
    assert!(classes::migrating_classes(&ms, &classes).is_empty());
}

#[test]
fn wait_for_first_consumer_source_needs_such_a_target() {
    let all = observed(spec_class_change("fast")).storage_classes;
    let check = |sources: &[&str], target: &str| {
        let sources: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
        classes::check_binding_mode(&all, &sources, &all[target], target)
    };
    // fast: WaitForFirstConsumer; standard, slow: Immediate.
    assert!(check(&["standard"], "fast").is_ok());
    assert!(check(&["standard"], "slow").is_ok());
    assert!(check(&["fast"], "fast").is_ok());
    assert!(
        check(&["gone"], "slow").is_ok(),
        "unknown sources are not compared"
    );
    let d = denied(check(&["standard", "fast"], "slow"));
    assert_eq!(d.reason, DenialReason::BindingModeMismatch);
    assert_eq!(
        d.message,
        "source StorageClass fast is WaitForFirstConsumer but target slow is not: the new \
         volumes could be provisioned away from the members' nodes"
    );
}

#[test]
fn template_size_is_its_storage_request() {
    let mut template = claim_template("standard", "2Gi");
    assert_eq!(
        classes::check_template_size(&template).unwrap(),
        Quantity("2Gi".into())
    );
    template.spec.as_mut().unwrap().resources = None;
    let d = denied(classes::check_template_size(&template));
    assert_eq!(d.reason, DenialReason::InvalidClaim);
    assert_eq!(d.message, "volumeClaimTemplate data has no storage request");
}

#[test]
fn shrink_size_is_below_every_request_but_the_ones_already_there() {
    let template = claim_template("standard", "1Gi");
    let mut ms = vec![planned(0, "1Gi"), planned(1, "512Mi")];
    assert_eq!(
        classes::check_shrink_size(Quantity("256Mi".into()), &mut ms, Some(&template)).unwrap(),
        Quantity("256Mi".into())
    );
    assert!(ms.iter().all(|m| m.work == PlannedWork::Migrate));
    // A claim at the size already is there; the others still shrink.
    let size = classes::check_shrink_size(Quantity("512Mi".into()), &mut ms, Some(&template));
    assert_eq!(size.unwrap(), Quantity("512Mi".into()));
    let work: Vec<PlannedWork> = ms.iter().map(|m| m.work).collect();
    assert_eq!(work, [PlannedWork::Migrate, PlannedWork::AlreadyThere]);
    // Above a claim's request: it would grow.
    let mut ms = vec![planned(0, "1Gi"), planned(1, "512Mi")];
    let d = denied(classes::check_shrink_size(
        Quantity("768Mi".into()),
        &mut ms,
        Some(&template),
    ));
    assert_eq!(d.reason, DenialReason::NotSmaller);
    assert_eq!(
        d.message,
        "shrink size 768Mi is above claim data-etcd-1's request 512Mi: it would grow"
    );
}

#[test]
fn shrink_is_denied_when_every_member_and_the_template_are_at_the_size() {
    let mut ms = vec![planned(0, "512Mi"), planned(1, "512Mi")];
    let at_size = claim_template("standard", "512Mi");
    let d = denied(classes::check_shrink_size(
        Quantity("512Mi".into()),
        &mut ms,
        Some(&at_size),
    ));
    assert_eq!(d.reason, DenialReason::NotSmaller);
    assert_eq!(
        d.message,
        "every member's claim, and the StatefulSet's volumeClaimTemplate data, already request \
         512Mi: nothing to do"
    );
    // The template still at the old size: accepted, every member already there.
    let bigger = claim_template("standard", "1Gi");
    assert!(classes::check_shrink_size(Quantity("512Mi".into()), &mut ms, Some(&bigger)).is_ok());
    assert!(ms.iter().all(|m| m.work == PlannedWork::AlreadyThere));
}

// ---- health --------------------------------------------------------------------------------

fn health(
    members: &[(&str, bool, bool)],
) -> Result<crate::engine::HealthReport, HealthUnavailable> {
    Ok(crate::engine::HealthReport {
        members: members
            .iter()
            .map(|&(pod, healthy, leader)| MemberHealth {
                pod: pod.into(),
                healthy,
                leader,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

#[test]
fn roles_come_from_the_report() {
    let mut ms: Vec<PlannedMember> = (0..3).map(|i| planned(i, "1Gi")).collect();
    health::assign_roles(
        &health(&[("etcd-0", true, false), ("etcd-1", true, true)]),
        &mut ms,
    );
    let roles: Vec<Option<Role>> = ms.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Some(Role::Follower), Some(Role::Leader), None]);
    let mut ms: Vec<PlannedMember> = (0..3).map(|i| planned(i, "1Gi")).collect();
    health::assign_roles(&Err(HealthUnavailable::Engine("down".into())), &mut ms);
    assert!(ms.iter().all(|m| m.role.is_none()));
}

#[test]
fn if_ready_needs_every_member_healthy() {
    let ms: Vec<PlannedMember> = (0..2).map(|i| planned(i, "1Gi")).collect();
    let good = health(&[("etcd-0", true, false), ("etcd-1", true, true)]);
    assert!(health::check_engine_health(ApplyPolicy::IfReady, &GenericRules, &good, &ms).is_ok());

    let sick = health(&[("etcd-0", true, false), ("etcd-1", false, true)]);
    let d = denied(health::check_engine_health(
        ApplyPolicy::IfReady,
        &GenericRules,
        &sick,
        &ms,
    ));
    assert_eq!(d.reason, DenialReason::NotHealthy);
    assert!(
        d.message
            .starts_with("apply is IfReady and the database is not healthy: "),
        "{}",
        d.message
    );
    assert!(d.message.contains("etcd-1"), "{}", d.message);

    let missing = health(&[("etcd-0", true, false)]);
    let d = denied(health::check_engine_health(
        ApplyPolicy::IfReady,
        &GenericRules,
        &missing,
        &ms,
    ));
    assert!(d.message.contains("etcd-1"), "{}", d.message);

    let unreadable = Err(HealthUnavailable::Engine("connection refused".to_string()));
    let d = denied(health::check_engine_health(
        ApplyPolicy::IfReady,
        &GenericRules,
        &unreadable,
        &ms,
    ));
    assert_eq!(d.reason, DenialReason::NotHealthy);
    assert_eq!(
        d.message,
        "apply is IfReady and the database's health cannot be read: connection refused"
    );
}

#[test]
fn always_starts_whatever_the_health() {
    let ms: Vec<PlannedMember> = (0..2).map(|i| planned(i, "1Gi")).collect();
    let sick = health(&[("etcd-0", false, false)]);
    assert!(health::check_engine_health(ApplyPolicy::Always, &GenericRules, &sick, &ms).is_ok());
    let unreadable = Err(HealthUnavailable::Engine("connection refused".to_string()));
    assert!(
        health::check_engine_health(ApplyPolicy::Always, &GenericRules, &unreadable, &ms).is_ok()
    );
}

// ---- measuring -----------------------------------------------------------------------------

#[test]
fn read_write_once_pod_claims_cannot_be_measured() {
    let m = planned(0, "1Gi");
    let mut claim = bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
    assert!(measure::check_measurable(Some(&claim), &m).is_ok());
    assert!(measure::check_measurable(None, &m).is_ok());
    claim.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOncePod".into()]);
    let d = denied(measure::check_measurable(Some(&claim), &m));
    assert_eq!(d.reason, DenialReason::CannotMeasure);
    assert_eq!(
        d.message,
        "claim data-etcd-0 is ReadWriteOncePod: its used bytes cannot be measured while member \
         etcd-0 runs"
    );
}

#[test]
fn measured_bytes_come_from_the_termination_message() {
    let m = planned(0, "1Gi");
    assert_eq!(
        measure::check_measured_bytes(&m, Some(r#"{"usedBytes":1048576}"#)).unwrap(),
        1 << 20
    );
    let d = denied(measure::check_measured_bytes(&m, None));
    assert_eq!(d.reason, DenialReason::MeasureFailed);
    assert_eq!(
        d.message,
        "the measure Job of data-etcd-0 reported no used bytes (None)"
    );
    let d = denied(measure::check_measured_bytes(&m, Some(r#"{"bytes":1}"#)));
    assert_eq!(
        d.message,
        "the measure Job of data-etcd-0 reported no used bytes (Some(\"{\\\"bytes\\\":1}\"))"
    );
    assert_eq!(
        reason(measure::check_measured_bytes(&m, Some("garbage"))),
        DenialReason::MeasureFailed
    );
}

#[test]
fn used_bytes_fit_with_headroom() {
    let m = planned(0, "1Gi");
    let size = Quantity("256Mi".into());
    // Below 160 MiB used, the headroom is the 16 MiB minimum; above, a tenth.
    assert!(measure::check_fits(&m, 100 << 20, &size).is_ok());
    assert!(measure::check_fits(&m, 232 << 20, &size).is_ok());
    assert!(measure::check_fits(&m, 240 << 20, &size).is_err());
    let d = denied(measure::check_fits(&m, 250 << 20, &size));
    assert_eq!(d.reason, DenialReason::InsufficientSize);
    assert_eq!(
        d.message,
        "member etcd-0 uses 250Mi on claim data-etcd-0: with headroom it needs 275Mi, more than \
         the shrink size 256Mi"
    );
    let small = Quantity("32Mi".into());
    assert!(measure::check_fits(&m, 16 << 20, &small).is_ok());
    assert_eq!(
        reason(measure::check_fits(&m, (16 << 20) + 1, &small)),
        DenialReason::InsufficientSize
    );
}

/// `statfs` of a 1 GiB ext4 volume made by `mkfs.ext4` (4 KiB blocks), `files` in use.
fn ext4_1gib(files: i64) -> crate::build::FsReport {
    crate::build::FsReport {
        fs_type: "ext2/ext3".into(),
        block_size: 4096,
        blocks: 249_195,
        blocks_free: 200_000,
        blocks_available: 183_000,
        inodes: 65_536,
        inodes_free: 65_536 - files,
    }
}

#[test]
fn a_shrink_counts_what_the_new_filesystem_takes() {
    let m = planned(0, "1Gi");
    let fs = ext4_1gib(100);
    let check = |used: i64, size: &str| {
        measure::check_filesystem_fits(&m, &fs, 1 << 30, used, &Quantity(size.into()))
    };
    // 100 MiB passes the naive rule for 128Mi (116 MiB with headroom), but a 128 MiB ext4
    // volume holds about 104 MiB.
    assert!(measure::check_fits(&m, 100 << 20, &Quantity("128Mi".into())).is_ok());
    let d = denied(check(100 << 20, "128Mi"));
    assert_eq!(d.reason, DenialReason::InsufficientSize);
    assert!(
        d.message.starts_with(
            "member etcd-0 uses 100Mi on claim data-etcd-0: with headroom it needs 116Mi, but a \
             128Mi volume holds about 103.8Mi once its filesystem is made"
        ),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("ext4: inode tables 8Mi, journal 4Mi"),
        "{}",
        d.message
    );
    assert!(check(100 << 20, "160Mi").is_ok());
}

#[test]
fn a_shrink_counts_inodes_on_ext4() {
    let m = planned(0, "1Gi");
    // 40,000 files fit 1 GiB (65,536 inodes), not 128 MiB (32,440 after group rounding).
    let d = denied(measure::check_filesystem_fits(
        &m,
        &ext4_1gib(40_000),
        1 << 30,
        10 << 20,
        &Quantity("128Mi".into()),
    ));
    assert!(
        d.message.contains("has 40000 files and directories") && d.message.contains("32440 inodes"),
        "{}",
        d.message
    );
    // On a disk shared with others (a host path), nothing is predicted: only headroom counts.
    let mut shared = ext4_1gib(40_000);
    shared.blocks = 25_000_000;
    let ok =
        measure::check_filesystem_fits(&m, &shared, 1 << 30, 10 << 20, &Quantity("128Mi".into()));
    assert!(ok.is_ok());
}

/// The measure Job of `pod`, as observed.
fn measure_job(pod: &str, outcome: JobOutcome) -> (String, ObservedJob) {
    let name = crate::build::job_name(REQ, pod, crate::build::JobKind::Measure);
    job(&name, "measure", outcome)
}

#[test]
fn measuring_creates_jobs_then_waits_then_completes() {
    let size = Quantity("256Mi".into());
    let mut ms: Vec<PlannedMember> = (0..2).map(|i| planned(i, "1Gi")).collect();
    ms.iter_mut().for_each(|m| m.new_size = size.clone());

    let o = observed(spec_shrink("256Mi"));
    let mut cx = Ctx::new(&o, &SETTINGS);
    let got = measure::measure(&mut cx, &mut ms).unwrap();
    assert_eq!(got, Measurement::Running);
    let created: Vec<String> = created_jobs(&cx.actions);
    assert_eq!(created.len(), 2, "{:?}", cx.actions);

    let mut o = observed(spec_shrink("256Mi"));
    let done = JobOutcome::Succeeded {
        message: Some(r#"{"usedBytes":104857600}"#.into()),
    };
    let (name, j) = measure_job("etcd-0", done.clone());
    o.jobs.insert(name, j);
    let (name, j) = measure_job("etcd-1", JobOutcome::Running);
    o.jobs.insert(name, j);
    let mut cx = Ctx::new(&o, &SETTINGS);
    assert_eq!(
        measure::measure(&mut cx, &mut ms).unwrap(),
        Measurement::Running
    );
    assert!(cx.actions.is_empty(), "{:?}", cx.actions);
    assert_eq!(ms[0].used_bytes, Some(100 << 20));

    let (name, j) = measure_job("etcd-1", done);
    o.jobs.insert(name, j);
    let mut cx = Ctx::new(&o, &SETTINGS);
    assert_eq!(
        measure::measure(&mut cx, &mut ms).unwrap(),
        Measurement::Complete
    );
    assert!(ms.iter().all(|m| m.used_bytes == Some(100 << 20)));
}

#[test]
fn a_failed_measure_job_denies() {
    let mut o = observed(spec_shrink("256Mi"));
    let failed = JobOutcome::Failed {
        reason: "BackoffLimitExceeded".into(),
    };
    let (name, j) = measure_job("etcd-0", failed);
    o.jobs.insert(name, j);
    let mut ms = vec![planned(0, "1Gi")];
    ms[0].new_size = Quantity("256Mi".into());
    let d = denied(measure::measure(&mut Ctx::new(&o, &SETTINGS), &mut ms));
    assert_eq!(d.reason, DenialReason::MeasureFailed);
    assert_eq!(
        d.message,
        "measuring the used bytes of data-etcd-0 failed: BackoffLimitExceeded"
    );
}

// ---- the list ------------------------------------------------------------------------------

#[test]
fn dry_run_plans_without_measuring() {
    let plan = dry_run(&observed(spec_shrink("256Mi")), &SETTINGS).unwrap();
    assert_eq!(plan.target_storage_class, "standard");
    assert_eq!(plan.source_storage_class.as_deref(), Some("standard"));
    assert_eq!(plan.target_size, Quantity("256Mi".into()));
    assert!(plan.members.iter().all(|m| m.new_size.0 == "256Mi"));
    assert!(plan.members.iter().all(|m| m.used_bytes.is_none()));
    let mut o = observed(spec_class_change("fast"));
    o.stateful_set = None;
    assert_eq!(reason(dry_run(&o, &SETTINGS)), DenialReason::TargetNotFound);
}

#[test]
fn a_requests_mover_image_and_a_restricted_namespace_are_denied_before_anything_else() {
    let mut spec = spec_class_change("fast");
    spec.copy.mover_image = Some("registry.test/mine:1".into());
    let mut o = observed(spec);
    // Checked right after the spec, before the target (here missing too).
    o.stateful_set = None;
    let d = denied(dry_run(&o, &SETTINGS));
    assert_eq!(d.reason, DenialReason::MoverImageNotAllowed, "{d}");
    let mut allowed = SETTINGS.clone();
    allowed.allow_request_mover_image = true;
    assert_eq!(reason(dry_run(&o, &allowed)), DenialReason::TargetNotFound);

    let mut o = observed(spec_class_change("fast"));
    o.namespace_labels.insert(
        crate::labels::POD_SECURITY_ENFORCE_LABEL.into(),
        "restricted".into(),
    );
    let d = denied(dry_run(&o, &SETTINGS));
    assert_eq!(d.reason, DenialReason::PodSecurityLevel, "{d}");
    // The whole decision: Denied, with the label named in the status.
    let (_, status) = decided_status(&o);
    assert_eq!(status.phase, crate::api::Phase::Denied);
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("pod-security.kubernetes.io/enforce=restricted"),
        "{message}"
    );
    o.namespace_labels.insert(
        crate::labels::POD_SECURITY_ENFORCE_LABEL.into(),
        "baseline".into(),
    );
    assert!(dry_run(&o, &SETTINGS).is_ok());
}

#[test]
fn the_most_a_member_may_use_fits_with_its_headroom() {
    let mib = 1_i64 << 20;
    let max = max_used_bytes(256 * mib);
    let fits = |used: i64| measure::check_fits(&planned(0, "1Gi"), used, &Quantity("256Mi".into()));
    assert!(fits(max).is_ok());
    assert!(fits(max + 1).is_err());
    // Below 176 MiB the 16 MiB floor is the headroom.
    assert_eq!(max_used_bytes(100 * mib), 84 * mib);
    assert!(fits(0).is_ok());
    assert_eq!(max_used_bytes(8 * mib), 0);
    assert_eq!(max_used_bytes(-1), 0);
}

// ---- claims mounted by other pods ----------------------------------------------------------

#[test]
fn a_claim_another_pod_mounts_is_denied_naming_the_pods() {
    let members = vec![planned(0, "1Gi"), planned(1, "1Gi")];
    let users = |claim: &str, pods: &[&str]| {
        BTreeMap::from([(
            claim.to_string(),
            pods.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        )])
    };
    // The member alone: fine.
    let only_member = users("data-etcd-1", &["etcd-1"]);
    assert!(members::check_claims_not_shared(&only_member, &members).is_ok());
    // A backup pod beside the member: denied, naming claim, member and pods.
    let shared = users("data-etcd-1", &["backup-x", "etcd-1", "debug"]);
    let d = denied(members::check_claims_not_shared(&shared, &members));
    assert_eq!(d.reason, DenialReason::ClaimShared);
    assert!(
        d.message.starts_with(
            "claim data-etcd-1 of member etcd-1 is also mounted by pod backup-x, debug:"
        ),
        "{}",
        d.message
    );
    // A member already on the target is not stopped: its claim may be shared.
    let mut there = members.clone();
    there[1].work = PlannedWork::AlreadyThere;
    assert!(members::check_claims_not_shared(&shared, &there).is_ok());
}

#[test]
fn preflight_denies_a_shared_claim_before_anything_is_touched() {
    let mut o = observed(spec_class_change("fast"));
    o.claim_users = BTreeMap::from([(
        "data-etcd-2".to_string(),
        vec!["etcd-2".to_string(), "backup-1".to_string()],
    )]);
    let d = denied(dry_run(&o, &SETTINGS));
    assert_eq!(d.reason, DenialReason::ClaimShared, "{}", d.message);
    assert!(d.message.contains("pod backup-1"), "{}", d.message);
    let (decision, status) = decided_status(&o);
    assert_eq!(status.phase, crate::api::Phase::Denied);
    assert_eq!(
        decision.actions.len(),
        2,
        "status and Event only: {decision:?}"
    );
}

/// The measure Jobs are deleted by their uid: a Job of that name made since the snapshot is
/// never deleted in their place.
#[test]
fn measure_jobs_are_deleted_by_their_uid() {
    let mut o = observed(spec_class_change("no-such-class"));
    let (name, job) = job(
        "move-measure-etcd-0",
        crate::build::JobKind::Measure.as_str(),
        JobOutcome::Running,
    );
    o.jobs.insert(name.clone(), job);
    let (d, status) = decided_status(&o);
    assert_eq!(status.phase, crate::api::Phase::Denied, "{status:?}");
    let deletes: Vec<_> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            crate::plan::Action::Delete {
                kind: crate::plan::Kind::Job,
                name,
                uid,
                ..
            } => Some((name.clone(), uid.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deletes,
        [(name, Some("uid-move-measure-etcd-0".to_string()))]
    );
}
