//! Test helpers: small Pods/PVCs/PVs/StatefulSets of a 3-member set `etcd` (template `data`,
//! class `standard`, 1Gi) in namespace `demo`, an [`Observed`] of it, and [`Sim`], a tiny model
//! of the cluster that carries out the planner's actions and plays the controllers (binding,
//! provisioning, Jobs, readiness, garbage collection), to drive the planner end to end.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStatus, StatefulSet, StatefulSetSpec, StatefulSetStatus,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod,
    PodCondition, PodSpec, PodStatus, PodTemplateSpec, Volume, VolumeNodeAffinity,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{Action, JobOutcome, Kind, Object, Observed, ObservedJob, Propagation, Stash, decide};
use crate::api::{
    MemberStep, Phase, ShrinkSpec, StorageClassChangeSpec, StorageMigrationRequest,
    StorageMigrationRequestSpec, TargetKind, TargetRef,
};
use crate::build::{self, Manifest};
use crate::engine::{FinalCheckKind, HealthReport, MemberHealth};
use crate::labels;

pub const NS: &str = "demo";
pub const REQ: &str = "move";
pub const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

/// The operator's image (`--image`) in the planner's tests.
pub static IMAGE: std::sync::LazyLock<crate::image::ImageRef> = std::sync::LazyLock::new(|| {
    crate::image::ImageRef::parse("registry.test/storage-migrator:test").unwrap()
});

/// The operator's settings in the planner's tests: the defaults of the flags with [`IMAGE`].
pub static SETTINGS: std::sync::LazyLock<super::Settings> =
    std::sync::LazyLock::new(|| super::Settings::new(IMAGE.clone()));

pub fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(NS.to_string()),
        uid: Some(format!("uid-{name}")),
        creation_timestamp: Some(Time(t(0))),
        ..Default::default()
    }
}

pub fn class(name: &str, binding: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        provisioner: "local.e2e/ext4".to_string(),
        volume_binding_mode: Some(binding.to_string()),
        reclaim_policy: Some("Delete".to_string()),
        ..Default::default()
    }
}

pub fn spec_class_change(to: &str) -> StorageMigrationRequestSpec {
    StorageMigrationRequestSpec {
        type_: crate::api::MigrationType::StorageClassChange,
        target: TargetRef {
            kind: TargetKind::StatefulSet,
            name: "etcd".to_string(),
        },
        volume_claim_template: None,
        volume_claim_templates: Vec::new(),
        storage_class_change: Some(StorageClassChangeSpec {
            storage_class_name: to.to_string(),
        }),
        shrink: None,
        timeout: "30m".to_string(),
        old_pv_reclaim_policy: None,
        apply: Default::default(),
        copy: Default::default(),
        database: Default::default(),
        owner_paused: false,
        force_delete_on_lost_node: false,
    }
}

pub fn spec_shrink(size: &str) -> StorageMigrationRequestSpec {
    StorageMigrationRequestSpec {
        type_: crate::api::MigrationType::Shrink,
        storage_class_change: None,
        shrink: Some(ShrinkSpec {
            size: Some(Quantity(size.to_string())),
            sizes: Default::default(),
        }),
        ..spec_class_change("unused")
    }
}

pub fn request(spec: StorageMigrationRequestSpec) -> StorageMigrationRequest {
    let mut req = StorageMigrationRequest::new(REQ, spec);
    req.metadata = ObjectMeta {
        generation: Some(1),
        ..meta(REQ)
    };
    req
}

pub fn claim_template(class: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: Some(class.to_string()),
            volume_mode: Some("Filesystem".to_string()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

pub fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), "etcd".to_string())])
}

pub fn stateful_set(replicas: i32) -> StatefulSet {
    StatefulSet {
        metadata: ObjectMeta {
            generation: Some(1),
            labels: Some(labels()),
            resource_version: Some("1".to_string()),
            ..meta("etcd")
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some("etcd".to_string()),
            selector: LabelSelector {
                match_labels: Some(labels()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "etcd".to_string(),
                        image: Some("quay.io/coreos/etcd:v3.4.23".to_string()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![claim_template("standard", "1Gi")]),
            ..Default::default()
        }),
        status: Some(StatefulSetStatus {
            observed_generation: Some(1),
            replicas,
            ready_replicas: Some(replicas),
            ..Default::default()
        }),
    }
}

fn ready_status(since: Timestamp) -> PodStatus {
    PodStatus {
        phase: Some("Running".to_string()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".to_string(),
            status: "True".to_string(),
            last_transition_time: Some(Time(since)),
            ..Default::default()
        }]),
        pod_ip: Some("198.18.0.10".to_string()),
        ..Default::default()
    }
}

pub fn member_pod(ordinal: usize) -> Pod {
    let name = format!("etcd-{ordinal}");
    Pod {
        metadata: ObjectMeta {
            labels: Some(labels()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".to_string(),
                kind: "StatefulSet".to_string(),
                name: "etcd".to_string(),
                uid: "uid-etcd".to_string(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..meta(&name)
        },
        spec: Some(PodSpec {
            node_name: Some(NODES[ordinal % 3].to_string()),
            hostname: Some(name.clone()),
            subdomain: Some("etcd".to_string()),
            containers: vec![Container {
                name: "etcd".to_string(),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "data".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: format!("data-etcd-{ordinal}"),
                    read_only: None,
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(ready_status(t(0))),
    }
}

pub fn bound_claim(name: &str, class: &str, size: &str, volume: &str) -> PersistentVolumeClaim {
    let mut c = claim_template(class, size);
    c.metadata = ObjectMeta {
        labels: Some(labels()),
        annotations: Some(BTreeMap::from([(
            "pv.kubernetes.io/bind-completed".to_string(),
            "yes".to_string(),
        )])),
        ..meta(name)
    };
    if let Some(spec) = c.spec.as_mut() {
        spec.volume_name = Some(volume.to_string());
    }
    c.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".to_string()),
        capacity: Some(BTreeMap::from([(
            "storage".to_string(),
            Quantity(size.to_string()),
        )])),
        ..Default::default()
    });
    c
}

pub fn volume(name: &str, class: &str, size: &str, claim: &str, node: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(size.to_string()),
            )])),
            storage_class_name: Some(class.to_string()),
            persistent_volume_reclaim_policy: Some("Delete".to_string()),
            claim_ref: Some(ObjectReference {
                namespace: Some(NS.to_string()),
                name: Some(claim.to_string()),
                uid: Some(format!("uid-{claim}")),
                ..Default::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".to_string(),
                            operator: "In".to_string(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// `obj` with its raw JSON (what the cluster layer gathers).
pub fn manifest<K>(obj: K) -> Manifest<K>
where
    K: k8s_openapi::Resource + serde::Serialize + serde::de::DeserializeOwned,
{
    Manifest::from_typed(obj).unwrap()
}

/// A generic engine's report: healthy when the pod is Ready.
pub fn generic_report(pods: &BTreeMap<String, Manifest<Pod>>) -> HealthReport {
    HealthReport {
        members: pods
            .values()
            .map(|p| MemberHealth {
                pod: p.name_any(),
                healthy: super::pod_ready(p) && p.metadata.deletion_timestamp.is_none(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The healthy 3-member set on `standard`, and a fresh request with `spec`.
pub fn observed(spec: StorageMigrationRequestSpec) -> Observed {
    let mut pods = BTreeMap::new();
    let mut claims = BTreeMap::new();
    let mut volumes = BTreeMap::new();
    for (i, node) in NODES.iter().enumerate() {
        let claim = format!("data-etcd-{i}");
        let pv = format!("pv-old-{i}");
        pods.insert(format!("etcd-{i}"), manifest(member_pod(i)));
        claims.insert(claim.clone(), bound_claim(&claim, "standard", "1Gi", &pv));
        volumes.insert(pv.clone(), volume(&pv, "standard", "1Gi", &claim, node));
    }
    let health = Ok(generic_report(&pods));
    Observed {
        request: request(spec),
        now: t(10),
        namespace_labels: BTreeMap::new(),
        stateful_set: Some(manifest(stateful_set(3))),
        stash: Stash::default(),
        pods,
        helper_pods: BTreeMap::new(),
        claims,
        volumes,
        jobs: BTreeMap::new(),
        storage_classes: BTreeMap::from([
            ("standard".to_string(), class("standard", "Immediate")),
            ("fast".to_string(), class("fast", "WaitForFirstConsumer")),
            ("slow".to_string(), class("slow", "Immediate")),
        ]),
        other_requests: Vec::new(),
        budgets: Vec::new(),
        health,
        final_hash: None,
        nodes: BTreeMap::new(),
        copy_holders: Vec::new(),
        claim_users: BTreeMap::new(),
        target_claim_users: Vec::new(),
        deployment: None,
        autoscalers: Vec::new(),
    }
}

/// A pod of Deployment `deployment` (controlled by its ReplicaSet `<deployment>-7d9f`)
/// mounting claim `data-<deployment>` on the first node, Ready.
pub fn deployment_pod(deployment: &str, name: &str) -> Pod {
    let mut pod = member_pod(0);
    pod.metadata = ObjectMeta {
        labels: Some(BTreeMap::from([(
            "app".to_string(),
            deployment.to_string(),
        )])),
        owner_references: Some(vec![OwnerReference {
            api_version: "apps/v1".to_string(),
            kind: "ReplicaSet".to_string(),
            name: format!("{deployment}-7d9f"),
            uid: format!("uid-{deployment}-7d9f"),
            controller: Some(true),
            ..Default::default()
        }]),
        ..meta(name)
    };
    if let Some(spec) = pod.spec.as_mut() {
        spec.hostname = None;
        spec.subdomain = None;
        spec.volumes = Some(vec![Volume {
            name: "data".to_string(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: format!("data-{deployment}"),
                read_only: None,
            }),
            ..Default::default()
        }]);
    }
    pod
}

/// A one-replica Deployment `web` whose pod `web-7d9f-0` mounts claim `data-web` (1Gi on
/// `standard`, volume `pv-web` on the first node); no StatefulSet. The request targets it.
pub fn deployment_observed(mut spec: StorageMigrationRequestSpec) -> Observed {
    spec.target = TargetRef {
        kind: TargetKind::Deployment,
        name: "web".to_string(),
    };
    let mut o = observed(spec);
    let pod = deployment_pod("web", "web-7d9f-0");
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: pod.metadata.labels.clone(),
            ..Default::default()
        }),
        spec: pod.spec.clone().map(|mut s| {
            s.node_name = None;
            s
        }),
    };
    o.deployment = Some(Deployment {
        metadata: ObjectMeta {
            generation: Some(1),
            resource_version: Some("1".to_string()),
            ..meta("web")
        },
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            },
            template,
            ..Default::default()
        }),
        status: Some(DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(1),
            updated_replicas: Some(1),
            ready_replicas: Some(1),
            available_replicas: Some(1),
            ..Default::default()
        }),
    });
    o.stateful_set = None;
    o.pods = BTreeMap::from([("web-7d9f-0".to_string(), manifest(pod))]);
    o.claims = BTreeMap::from([(
        "data-web".to_string(),
        bound_claim("data-web", "standard", "1Gi", "pv-web"),
    )]);
    o.volumes = BTreeMap::from([(
        "pv-web".to_string(),
        volume("pv-web", "standard", "1Gi", "data-web", NODES[0]),
    )]);
    o.health = Ok(generic_report(&o.pods));
    o
}

/// The first volumeClaimTemplate of the simulated cluster's StatefulSet (panics when there is
/// none).
pub fn first_template(sim: &Sim) -> &PersistentVolumeClaim {
    let set = sim.o.stateful_set.as_ref().expect("a StatefulSet");
    let templates = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref());
    templates
        .and_then(|t| t.first())
        .expect("a volumeClaimTemplate")
}

/// Preflight's denial of `o` (panics when the dry run accepts it): its reason and message.
pub fn denial(o: &Observed) -> (super::preflight::DenialReason, String) {
    let d = super::preflight::dry_run(o, &SETTINGS).expect_err("denied");
    (d.reason, d.message)
}

/// How the simulated Jobs end.
#[derive(Debug, Clone, Default)]
pub struct JobScript {
    /// Bytes in use that Measure Jobs report.
    pub used_bytes: i64,
    /// Job kinds (`copy`, `verify`, ...) that fail.
    pub fail: Vec<String>,
    /// Verify reports this many differences.
    pub differences: i64,
    /// Jobs stay Running (e.g. to let a timeout expire).
    pub hang: bool,
    /// Jobs whose name starts with this fail (e.g. one claim's copy: `etcd-1-wal-copy`).
    pub fail_named: Option<String>,
    /// Pre-copies report an old volume of ext4 with this many inodes in use and 1 GiB in use.
    pub source_entries: Option<i64>,
    /// Pre-copies do not report that they compared every entry's ACLs and xattrs (as those of
    /// an operator before they did); by default they report it, as the script does.
    pub pre_copy_without_attributes: bool,
}

impl JobScript {
    /// How a Job of `kind` ends; `verifies` for a Copy Job that verifies in its own pod (its
    /// result then carries the verification's fields, and a failure of `verify` fails it).
    fn outcome(&self, kind: &str, verifies: bool) -> JobOutcome {
        let verify = format!(
            r#""differences":{},"verifyMode":"Changed","checkedFiles":2"#,
            self.differences
        );
        let verify_failed = |reason: String, message: &str| JobOutcome::VerifyFailed {
            reason,
            result: Box::new(build::parse_job_result(message).unwrap()),
        };
        let fails = |k: &str| self.fail.iter().any(|f| f == k);
        let reason = format!("{kind} exited 23");
        let broken =
            r#"{"error":"rsync verification exited with 23","exitCode":23,"verifyMode":"Changed"}"#;
        let verifying = kind == "verify" || (kind == "copy" && verifies);
        let message = match kind {
            _ if fails(kind) => return JobOutcome::Failed { reason },
            _ if verifying && fails("verify") => return verify_failed(reason, broken),
            "measure" => format!(r#"{{"usedBytes":{}}}"#, self.used_bytes),
            "verify" => format!("{{{verify}}}"),
            "copy" if verifies => format!(r#"{{"bytes":1048576,"files":3,{verify}}}"#),
            "precopy" if self.source_entries.is_some() => format!(
                r#"{{"bytes":1048576,"files":3,"sourceFilesystem":{{"type":"ext2/ext3","blockSize":4096,"blocks":1000000,"blocksFree":737856,"blocksAvailable":737856,"inodes":2000000,"inodesFree":{}}}}}"#,
                2_000_000 - self.source_entries.unwrap_or(0)
            ),
            _ => r#"{"bytes":1048576,"files":3}"#.to_string(),
        };
        let message = match message.strip_prefix('{') {
            Some(rest) if kind == "precopy" && !self.pre_copy_without_attributes => {
                format!(r#"{{"attributesCompared":"All",{rest}"#)
            }
            _ => message,
        };
        if verifying && self.differences != 0 {
            return verify_failed(reason, &message);
        }
        JobOutcome::Succeeded {
            message: Some(message),
        }
    }
}

/// True for a Job whose pod has `VERIFY` in its environment (a Copy Job verifying in its pod).
fn verifies_in_pod(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .into_iter()
        .flat_map(|p| &p.containers)
        .flat_map(|c| c.env.iter().flatten())
        .any(|e| e.name == "VERIFY")
}

/// A tiny cluster: applies actions, plays the controllers.
pub struct Sim {
    pub o: Observed,
    pub jobs: JobScript,
    pub events: Vec<(String, String)>,
    /// Every action applied, in order.
    pub log: Vec<Action>,
    next_uid: u64,
    /// The last resourceVersion given to a write of the StatefulSet.
    pub next_version: u64,
    /// Actions the simulated API server refused (a failed resourceVersion precondition).
    pub refused: Vec<Action>,
    pub pvc_counter: u64,
    /// The stash ConfigMap as the simulated API server holds it (`o.stash` is read from it
    /// after every action that touches it).
    pub stash_config_map: Option<k8s_openapi::api::core::v1::ConfigMap>,
    /// The operator's settings the decisions are made with ([`SETTINGS`] unless a test changes
    /// them).
    pub settings: super::Settings,
    /// How many handovers end cut short, as a ZooKeeper handover by reconfiguration stopped
    /// between its two reconfigurations: leadership moves, the old leader is left an observer
    /// (no member id); the next handover asked of it makes it a voter again.
    pub handovers_cut_short: u32,
    /// The members such a handover left observers.
    pub observers: Vec<String>,
}

/// The stash ConfigMap `o.stash` was read from (entries encoded again: the encoding is
/// deterministic), for a [`Sim`] started on a snapshot taken from another.
pub fn stash_config_map_of(o: &Observed) -> Option<k8s_openapi::api::core::v1::ConfigMap> {
    use super::stash::StashKey;
    let uid = match &o.stash.object {
        super::StashObject::Missing => return None,
        super::StashObject::Ours { uid, .. } => uid.clone(),
        super::StashObject::Foreign { uid_label } => {
            let mut cm = build::stash_config_map(&o.request);
            let labels = cm.metadata.labels.get_or_insert_with(BTreeMap::new);
            match uid_label {
                Some(l) => labels.insert(labels::REQUEST_UID_LABEL.into(), l.clone()),
                None => labels.remove(labels::REQUEST_UID_LABEL),
            };
            return Some(cm);
        }
    };
    let mut cm = build::stash_config_map(&o.request);
    cm.metadata.uid = uid;
    let mut data = BTreeMap::new();
    let mut put = |key: StashKey, value: String| data.insert(key.config_map_key(), value);
    if let Some(set) = &o.stash.stateful_set {
        put(StashKey::StatefulSet, build::stash_encode(set).unwrap());
    }
    for (pod, p) in &o.stash.pods {
        put(StashKey::Pod(pod.clone()), build::stash_encode(p).unwrap());
    }
    for (claim, c) in &o.stash.claims {
        put(
            StashKey::Claim(claim.clone()),
            build::stash_encode(c).unwrap(),
        );
    }
    cm.data = Some(data);
    Some(cm)
}

impl Sim {
    pub fn new(o: Observed) -> Self {
        let stash_config_map = stash_config_map_of(&o);
        Self {
            o,
            jobs: JobScript {
                used_bytes: 100 << 20,
                ..Default::default()
            },
            events: Vec::new(),
            log: Vec::new(),
            next_uid: 0,
            next_version: 0,
            refused: Vec::new(),
            pvc_counter: 0,
            handovers_cut_short: 0,
            observers: Vec::new(),
            stash_config_map,
            settings: SETTINGS.clone(),
        }
    }

    /// `o.stash` read again from the simulated stash ConfigMap, as the cluster layer does.
    pub fn reread_stash(&mut self) {
        self.o.stash = super::stash::read_stash(
            self.stash_config_map.as_ref(),
            self.o.request.uid().as_deref(),
            &self.status(),
        );
    }

    fn uid(&mut self, name: &str) -> String {
        self.next_uid += 1;
        format!("uid-{name}-{}", self.next_uid)
    }

    pub fn status(&self) -> crate::api::StorageMigrationRequestStatus {
        self.o.request.status.clone().unwrap_or_default()
    }

    pub fn phase(&self) -> Phase {
        self.status().phase
    }

    /// Checks that an action is safe in the current state (data-loss invariants).
    fn check_invariants(&self, a: &Action) {
        let status = self.status();
        let plan = status.plan.clone().unwrap_or_default();
        match a {
            Action::Delete {
                kind: Kind::Claim,
                name,
                ..
            } => {
                let claim = &self.o.claims[name];
                if let Some(pv) = super::claim_volume(claim).and_then(|v| self.o.volumes.get(v)) {
                    let original = plan.members.iter().any(|m| &m.claim == name);
                    let temp_after_copy = plan.members.iter().any(|m| {
                        &m.temp_claim == name
                            && status
                                .members
                                .iter()
                                .any(|ms| ms.pod == m.pod && ms.step.swap_begun())
                    });
                    if original || temp_after_copy {
                        assert_eq!(
                            super::volume_policy(pv),
                            "Retain",
                            "deleting claim {name} whose volume is not Retain"
                        );
                    }
                }
            }
            Action::Delete {
                kind: Kind::Pod,
                name,
                ..
            } if plan.members.iter().any(|m| &m.pod == name) => {
                assert!(
                    self.o.stash.pods.contains_key(name),
                    "deleting member pod {name} before it was stashed"
                );
            }
            Action::Delete {
                kind: Kind::StatefulSet,
                propagation,
                ..
            } => {
                assert_eq!(*propagation, Propagation::Orphan);
                assert!(self.o.stash.stateful_set.is_some(), "set not stashed");
            }
            Action::Delete {
                kind: Kind::ConfigMap,
                ..
            } => {
                // The stash goes only once the request is about to succeed.
                assert_eq!(status.stage, crate::api::Stage::Finalizing);
                assert!(status.failure.is_none());
                assert!(
                    (status.members.iter()).all(|m| m.step.settled()),
                    "stash deleted with members not done"
                );
                let spec = super::observe::effective_spec(&self.o.request);
                let rules = crate::engine::rules(&spec.database);
                if matches!(rules.final_check(), FinalCheckKind::Agreement { .. }) {
                    assert!(
                        status.final_hash.is_some(),
                        "stash deleted before the final check"
                    );
                }
            }
            Action::PatchReclaimPolicy { volume, policy }
                if policy != "Retain" && plan.members.iter().any(|m| &m.old_volume == volume) =>
            {
                // An old volume gets back a policy that can delete it only once the final check
                // passed: recorded in the status written first in the same decision.
                assert_eq!(
                    status.stage,
                    crate::api::Stage::Finalizing,
                    "{volume} to {policy}"
                );
                let spec = super::observe::effective_spec(&self.o.request);
                let checked = match crate::engine::rules(&spec.database).final_check() {
                    FinalCheckKind::Agreement { .. } => status.final_hash.is_some(),
                    FinalCheckKind::CopiesVerified => {
                        // Members left alone were not copied by this request.
                        spec.copy.verify
                            && (status.members.iter())
                                .all(|m| m.step.left_alone() || m.first_claim.verified.is_some())
                    }
                };
                assert!(
                    checked,
                    "old volume {volume} set to {policy} before the final check"
                );
            }
            Action::PatchReclaimPolicy { volume, policy } if policy == "Delete" => {
                // Only after success, and never on a volume a live claim is bound to unless it
                // is that claim's own (the new volume's original policy).
                assert!(
                    matches!(
                        status.stage,
                        crate::api::Stage::Finalizing | crate::api::Stage::RollingBack
                    ),
                    "setting {volume} to Delete in stage {:?}",
                    status.stage
                );
                if status.stage == crate::api::Stage::RollingBack {
                    assert!(
                        !plan.members.iter().any(|m| &m.old_volume == volume),
                        "old volume {volume} set to Delete during a rollback"
                    );
                }
            }
            _ => {}
        }
    }

    pub fn apply(&mut self, a: &Action) {
        self.check_invariants(a);
        self.log.push(a.clone());
        match a {
            Action::SetStatus(s) => self.o.request.status = Some((**s).clone()),
            Action::AddFinalizer => {
                let finalizers = self
                    .o
                    .request
                    .metadata
                    .finalizers
                    .get_or_insert_with(Vec::new);
                if !finalizers.iter().any(|f| f == labels::FINALIZER) {
                    finalizers.push(labels::FINALIZER.to_string());
                }
            }
            Action::RemoveFinalizer => {
                if let Some(f) = self.o.request.metadata.finalizers.as_mut() {
                    f.retain(|f| f != labels::FINALIZER);
                }
            }
            Action::Event {
                reason, message, ..
            } => self.events.push((reason.clone(), message.clone())),
            Action::Stash {
                config_map,
                key,
                value,
            } => {
                let cm = self
                    .stash_config_map
                    .as_mut()
                    .filter(|cm| cm.name_any() == *config_map)
                    .expect("stash into a ConfigMap that does not exist");
                assert_eq!(
                    cm.labels().get(labels::REQUEST_UID_LABEL),
                    self.o.request.uid().as_ref(),
                    "stash into another request's ConfigMap"
                );
                cm.data
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key.clone(), value.clone());
                self.reread_stash();
            }
            Action::Create(obj) => self.create(obj.clone()),
            Action::Delete {
                kind,
                name,
                propagation,
                uid,
                resource_version,
            } => {
                if let Some(version) = resource_version
                    && !self.version_matches(*kind, name, version)
                {
                    // 409: changed since the planner saw it; an error, nothing applied.
                    self.refused.push(a.clone());
                    return;
                }
                if self.uid_matches(*kind, name, uid.as_deref()) {
                    self.delete(*kind, name, *propagation);
                }
            }
            Action::ForceDeletePod { name, uid } => {
                if self.uid_matches(Kind::Pod, name, uid.as_deref()) {
                    self.delete(Kind::Pod, name, Propagation::Background);
                }
            }
            Action::PatchReclaimPolicy { volume, policy } => {
                self.set_reclaim_policy(volume, policy);
            }
            Action::SetClaimRef { volume, claim } => {
                if let Some(pv) = self.o.volumes.get_mut(volume) {
                    pv.spec.get_or_insert_with(Default::default).claim_ref =
                        Some(ObjectReference {
                            namespace: Some(NS.to_string()),
                            name: Some(claim.clone()),
                            ..Default::default()
                        });
                    pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
                        phase: Some("Available".to_string()),
                        ..Default::default()
                    });
                }
            }
            Action::RemoveOwnerReferences { claim, uids } => {
                if let Some(c) = self.o.claims.get_mut(claim)
                    && let Some(refs) = c.metadata.owner_references.as_mut()
                {
                    refs.retain(|r| !uids.contains(&r.uid));
                }
            }
            Action::PatchRetentionPolicy { policy, .. } => {
                self.next_version += 1;
                let version = format!("sim-{}", self.next_version);
                if let Some(set) = self.o.stateful_set.as_mut() {
                    set.update(|set| {
                        set.metadata.resource_version = Some(version);
                        set.spec
                            .get_or_insert_with(Default::default)
                            .persistent_volume_claim_retention_policy =
                            serde_json::from_str(policy).unwrap();
                    });
                }
            }
            Action::TransferLeadership { from, to } => {
                let cut_short = self.handovers_cut_short > 0;
                self.handovers_cut_short = self.handovers_cut_short.saturating_sub(1);
                if let Ok(h) = self.o.health.as_mut() {
                    let leader = (h.leader.clone())
                        .filter(|l| l != from)
                        .unwrap_or(to.clone());
                    h.leader = Some(leader.clone());
                    for m in &mut h.members {
                        m.leader = m.pod == leader;
                    }
                }
                self.observers.retain(|o| o != from);
                if cut_short {
                    self.observers.push(from.clone());
                }
            }
            Action::AnnotateClaim { claim, key, value } => {
                if let Some(c) = self.o.claims.get_mut(claim) {
                    match value {
                        Some(v) => {
                            c.annotations_mut().insert(key.clone(), v.clone());
                        }
                        None => {
                            c.annotations_mut().remove(key);
                        }
                    }
                }
            }
            Action::LabelVolume { volume } => {
                let request = self.o.request.name_any();
                if let Some(pv) = self.o.volumes.get_mut(volume) {
                    pv.labels_mut()
                        .insert(labels::MIGRATED_BY_LABEL.to_string(), request);
                }
            }
            Action::ScaleDeployment {
                deployment,
                replicas,
                resource_version,
            } => {
                let Some(d) = self
                    .o
                    .deployment
                    .as_mut()
                    .filter(|d| &d.name_any() == deployment)
                else {
                    return;
                };
                if resource_version.is_some() && *resource_version != d.resource_version() {
                    self.refused.push(a.clone());
                    return;
                }
                self.next_version += 1;
                d.metadata.resource_version = Some(self.next_version.to_string());
                d.metadata.generation = Some(d.metadata.generation.unwrap_or(1) + 1);
                d.spec.get_or_insert_with(Default::default).replicas = Some(*replicas);
            }
        }
    }

    fn create(&mut self, obj: Object) {
        match obj {
            Object::Claim(mut c) => {
                let name = c.name_any();
                if self.o.claims.contains_key(&name) {
                    return;
                }
                c.metadata.uid = Some(self.uid(&name));
                c.status = Some(PersistentVolumeClaimStatus {
                    phase: Some("Pending".to_string()),
                    ..Default::default()
                });
                self.o.claims.insert(name, *c);
            }
            Object::Pod(mut p) => {
                let name = p.name_any();
                let uid = self.uid(&name);
                p.update(|p| p.metadata.uid = Some(uid));
                if p.labels().contains_key(labels::MEMBER_LABEL) {
                    self.o.helper_pods.entry(name).or_insert(p.typed().clone());
                } else {
                    self.o.pods.entry(name).or_insert(*p);
                }
            }
            Object::Job(mut j) => {
                let name = j.name_any();
                j.metadata.uid = Some(self.uid(&name));
                self.o.jobs.entry(name).or_insert(ObservedJob {
                    job: *j,
                    outcome: JobOutcome::Running,
                    progress: None,
                    refused: None,
                });
            }
            Object::StatefulSet(mut s) => {
                if self.o.stateful_set.is_some() {
                    // 409: an error for a StatefulSet (it may be someone else's); nothing applied.
                    self.refused.push(Action::Create(Object::StatefulSet(s)));
                    return;
                }
                let uid = self.uid("etcd");
                s.update(|s| {
                    s.metadata.uid = Some(uid);
                    s.metadata.generation = Some(1);
                });
                self.o.stateful_set = Some(*s);
            }
            Object::ConfigMap(mut c) => {
                if self.stash_config_map.is_none() {
                    c.metadata.uid = Some(self.uid(&c.name_any()));
                    self.stash_config_map = Some(*c);
                    self.reread_stash();
                }
            }
        }
    }

    /// The delete's resourceVersion precondition: no object (a 404, a success), or the object
    /// has that resourceVersion. Modelled for the StatefulSet only; other kinds always match.
    fn version_matches(&self, kind: Kind, name: &str, version: &str) -> bool {
        match kind {
            Kind::StatefulSet => self
                .o
                .stateful_set
                .as_ref()
                .filter(|s| s.name_any() == name)
                .is_none_or(|s| s.resource_version().as_deref() == Some(version)),
            _ => true,
        }
    }

    /// The delete's uid precondition: no uid, no object, or the object has that uid.
    fn uid_matches(&self, kind: Kind, name: &str, uid: Option<&str>) -> bool {
        let Some(uid) = uid else { return true };
        let current = match kind {
            Kind::Claim => self.o.claims.get(name).map(|c| c.uid()),
            Kind::Pod => (self.o.pods.get(name).map(|p| p.uid()))
                .or_else(|| self.o.helper_pods.get(name).map(|p| p.uid())),
            Kind::Job => self.o.jobs.get(name).map(|j| j.job.uid()),
            Kind::StatefulSet => self.o.stateful_set.as_ref().map(|s| s.uid()),
            Kind::ConfigMap => self.stash_config_map.as_ref().map(|c| c.uid()),
        };
        current.is_none_or(|current| current.as_deref() == Some(uid))
    }

    fn delete(&mut self, kind: Kind, name: &str, propagation: Propagation) {
        match kind {
            Kind::Claim => {
                if let Some(c) = self.o.claims.remove(name)
                    && let Some(v) = super::claim_volume(&c).map(str::to_string)
                {
                    let delete = self
                        .o
                        .volumes
                        .get(&v)
                        .is_some_and(|pv| super::volume_policy(pv) == "Delete");
                    if delete {
                        self.o.volumes.remove(&v);
                    }
                }
            }
            Kind::Pod => {
                self.o.pods.remove(name);
                self.o.helper_pods.remove(name);
            }
            Kind::Job => {
                self.o.jobs.remove(name);
            }
            Kind::StatefulSet => {
                assert_eq!(propagation, Propagation::Orphan);
                self.o.stateful_set = None;
                for p in self.o.pods.values_mut() {
                    p.update(|p| p.metadata.owner_references = None);
                }
            }
            Kind::ConfigMap => {
                self.stash_config_map = None;
                self.reread_stash();
            }
        }
    }

    /// The controllers: provisioning, binding, Jobs, readiness, StatefulSet status, health.
    pub fn settle(&mut self) {
        self.o.now = Timestamp::from_second(self.o.now.as_second() + 1).unwrap();
        let names: Vec<String> = self.o.claims.keys().cloned().collect();
        for name in names {
            let claim = self.o.claims[&name].clone();
            if super::claim_phase(&claim) == "Bound" {
                continue;
            }
            let class = super::claim_class(&claim).unwrap_or_default().to_string();
            let size = super::claim_request(&claim).cloned().unwrap_or_default();
            if let Some(v) = super::claim_volume(&claim).map(str::to_string) {
                // Pre-bound: binds when the PV's claimRef names it.
                let ok = self.o.volumes.get(&v).is_some_and(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_some_and(|r| r.name.as_deref() == Some(name.as_str()))
                });
                if ok {
                    let uid = claim.metadata.uid.clone();
                    if let Some(pv) = self.o.volumes.get_mut(&v)
                        && let Some(r) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut())
                    {
                        r.uid = uid;
                    }
                    if let Some(c) = self.o.claims.get_mut(&name) {
                        c.status.get_or_insert_with(Default::default).phase =
                            Some("Bound".to_string());
                    }
                }
                continue;
            }
            let wffc = self
                .o
                .storage_classes
                .get(&class)
                .is_some_and(super::class_is_wffc);
            let node = if wffc {
                let consumer = self.o.helper_pods.values().find(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.volumes.as_ref())
                        .is_some_and(|vs| {
                            vs.iter().any(|v| {
                                v.persistent_volume_claim
                                    .as_ref()
                                    .is_some_and(|c| c.claim_name == name)
                            })
                        })
                });
                let Some(consumer) = consumer else { continue };
                let member = consumer.labels()[labels::MEMBER_LABEL].clone();
                let ordinal: usize = member.rsplit('-').next().unwrap().parse().unwrap();
                NODES[ordinal % 3].to_string()
            } else {
                claim
                    .annotations()
                    .get(labels::SELECTED_NODE_ANNOTATION)
                    .cloned()
                    .unwrap_or_else(|| NODES[0].to_string())
            };
            self.pvc_counter += 1;
            let pv_name = format!("pv-new-{}", self.pvc_counter);
            let mut pv = volume(&pv_name, &class, &size.0, &name, &node);
            if let Some(r) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
                r.uid = claim.metadata.uid.clone();
            }
            self.o.volumes.insert(pv_name.clone(), pv);
            if let Some(c) = self.o.claims.get_mut(&name) {
                c.spec.get_or_insert_with(Default::default).volume_name = Some(pv_name);
                c.status.get_or_insert_with(Default::default).phase = Some("Bound".to_string());
            }
        }
        // Released volumes: a deleted claim leaves its Retain volume with a stale claimRef.
        for (name, job) in self.o.jobs.iter_mut() {
            if job.outcome != JobOutcome::Running || self.jobs.hang {
                continue;
            }
            let kind = job.job.labels()[labels::JOB_KIND_LABEL].clone();
            job.outcome = match &self.jobs.fail_named {
                Some(prefix) if name.starts_with(prefix.as_str()) => JobOutcome::Failed {
                    reason: format!("{name} exited 23"),
                },
                _ => self.jobs.outcome(&kind, verifies_in_pod(&job.job)),
            };
        }
        let now = self.o.now;
        for p in self.o.pods.values_mut() {
            if p.status.is_none() {
                p.update(|p| p.status = Some(ready_status(now)));
            }
        }
        self.settle_deployment();
        if let Some(set) = self.o.stateful_set.as_mut()
            && set.status.is_none()
        {
            let want = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            set.update(|set| {
                set.status = Some(StatefulSetStatus {
                    observed_generation: Some(1),
                    replicas: want,
                    ..Default::default()
                });
            });
        }
        let leader = self.o.health.as_ref().ok().and_then(|h| h.leader.clone());
        // A database with a quorum (member ids and positions) keeps one as pods come and go.
        let quorum = self
            .o
            .health
            .as_ref()
            .is_ok_and(|h| h.voting_members.is_some());
        let mut report = generic_report(&self.o.pods);
        if quorum {
            for m in &mut report.members {
                m.member_id = (!self.observers.contains(&m.pod)).then(|| m.pod.clone());
                m.position = Some(100);
                m.leader = leader.as_deref() == Some(m.pod.as_str());
            }
            report.leader = match leader {
                // The leader's pod is gone: an election is under way, this look sees no leader.
                Some(l) => Some(l).filter(|l| self.o.pods.contains_key(l)),
                // The next look sees the highest member still Ready elected (ZooKeeper's ties).
                None => (report.members.iter().rev())
                    .find(|m| m.healthy)
                    .map(|m| m.pod.clone()),
            };
            for m in &mut report.members {
                m.leader = report.leader.as_deref() == Some(m.pod.as_str());
            }
            report.voting_members = Some(3);
        }
        self.o.health = Ok(report);
    }

    /// The Deployment controller: its pods follow its replicas (new pods are named
    /// `<deployment>-7d9f-<n>`, mount its claims and are Ready at once); its status follows.
    fn settle_deployment(&mut self) {
        let Some(d) = self.o.deployment.clone() else {
            return;
        };
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0) as usize;
        let name = d.name_any();
        let mut names: Vec<String> = self.o.pods.keys().cloned().collect();
        while names.len() > want {
            if let Some(pod) = names.pop() {
                self.o.pods.remove(&pod);
            }
        }
        let template = d
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default();
        while self.o.pods.len() < want {
            self.pvc_counter += 1;
            let pod_name = format!("{name}-7d9f-{}", self.pvc_counter);
            let mut pod = deployment_pod(&name, &pod_name);
            pod.spec = template.spec.clone().map(|mut s| {
                s.node_name = Some(NODES[0].to_string());
                s
            });
            pod.status = Some(ready_status(self.o.now));
            self.o.pods.insert(pod_name, manifest(pod));
        }
        let n = want as i32;
        if let Some(d) = self.o.deployment.as_mut() {
            d.status = Some(DeploymentStatus {
                observed_generation: d.metadata.generation,
                replicas: Some(n),
                updated_replicas: Some(n),
                ready_replicas: Some(n),
                available_replicas: Some(n),
                ..Default::default()
            });
        }
    }

    /// Runs decide → apply → settle until the request is final (or `max` rounds).
    pub fn run(&mut self, max: usize) -> usize {
        for round in 0..max {
            if self.phase().is_final() && self.o.request.finalizers().is_empty() {
                return round;
            }
            let d = decide(&self.o, &self.settings);
            for a in &d.actions {
                self.apply(a);
            }
            self.settle();
        }
        max
    }

    /// Like [`run`], but at round `crash_at` applies only the first `keep` actions of that
    /// decision (the operator dies in the middle of it).
    pub fn run_with_crash(&mut self, max: usize, crash_at: usize, keep: usize) -> usize {
        for round in 0..max {
            if self.phase().is_final() && self.o.request.finalizers().is_empty() {
                return round;
            }
            let d = decide(&self.o, &self.settings);
            let n = if round == crash_at {
                keep.min(d.actions.len())
            } else {
                d.actions.len()
            };
            for a in &d.actions[..n] {
                self.apply(a);
            }
            self.settle();
        }
        max
    }

    /// A class-change request simulated until member etcd-0 is at `step` (the set orphaned).
    /// Runs until `etcd-0` is recorded at `step`. For a step a decision may enter and carry out
    /// at once (`plan::machine::PASSED_IN_ONE_DECISION`) it stops right after that status
    /// write, so that the step's own actions, which the same decision may carry, are not yet
    /// taken (a crash there, as a failpoint makes): the state the step is entered in.
    pub fn at(step: MemberStep) -> Sim {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        for _ in 0..400 {
            if sim.step_of("etcd-0") == step {
                break;
            }
            let passable = super::machine::PASSED_IN_ONE_DECISION.contains(&step);
            if sim.decide_until(passable.then_some(step)) {
                return sim;
            }
            sim.settle();
        }
        assert_eq!(sim.step_of("etcd-0"), step);
        sim
    }

    /// Applies one decision's actions, stopping right after the status write that records
    /// `etcd-0` at `stop` (true then).
    fn decide_until(&mut self, stop: Option<MemberStep>) -> bool {
        let d = decide(&self.o, &self.settings);
        for a in &d.actions {
            self.apply(a);
            if stop == Some(self.step_of("etcd-0")) {
                return true;
            }
        }
        false
    }

    /// [`Sim::at`], except for `DeletingTempClaim`, which a member is recorded at only when its
    /// temporary claim outlives the old one (`DeletingOldClaim` deletes both, and the next step
    /// is taken in the same decision when the temporary claim is already gone): the temporary
    /// claim left behind and not terminating, the old claim gone before the operator got to
    /// delete it.
    pub fn at_or_left_behind(step: MemberStep) -> Sim {
        if step != MemberStep::DeletingTempClaim {
            return Sim::at(step);
        }
        let mut sim = Sim::at(MemberStep::DeletingOldClaim);
        sim.o.claims.remove("data-etcd-0");
        assert!(sim.decide_until(Some(step)), "{:?}", sim.step_of("etcd-0"));
        sim
    }

    /// Sets a volume's reclaim policy as the API server would (a new resourceVersion): the
    /// operator's patch, or another actor's (a test playing a GitOps tool).
    pub fn set_reclaim_policy(&mut self, volume: &str, policy: &str) {
        self.next_version += 1;
        let version = self.next_version.to_string();
        if let Some(pv) = self.o.volumes.get_mut(volume) {
            pv.spec
                .get_or_insert_with(Default::default)
                .persistent_volume_reclaim_policy = Some(policy.to_string());
            pv.metadata.resource_version = Some(version);
        }
    }

    pub fn step_of(&self, pod: &str) -> MemberStep {
        self.status()
            .members
            .iter()
            .find(|m| m.pod == pod)
            .map(|m| m.step)
            .unwrap_or_default()
    }

    pub fn reasons(&self) -> Vec<&str> {
        self.events.iter().map(|(r, _)| r.as_str()).collect()
    }
}

/// A Job as `decide` sees it, for table tests.
pub fn job(name: &str, kind: &str, outcome: JobOutcome) -> (String, ObservedJob) {
    let mut job = Job {
        metadata: meta(name),
        ..Default::default()
    };
    job.labels_mut()
        .insert(labels::JOB_KIND_LABEL.to_string(), kind.to_string());
    let progress = None;
    (
        name.to_string(),
        ObservedJob {
            job,
            outcome,
            progress,
            refused: None,
        },
    )
}

/// The simulator against the actions' contracts (`plan::action`).
/// The names of the Jobs `actions` create, in order.
pub fn created_jobs(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Create(Object::Job(j)) => Some(j.name_any()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod contract_tests {
    use super::*;
    use crate::plan::action::contract;

    #[test]
    fn remove_owner_references_removes_exactly_the_listed_uids() {
        for case in contract::remove_owner_references_cases() {
            let mut sim = Sim::new(observed(spec_class_change("fast")));
            let claim = sim.o.claims.get_mut("data-etcd-0").unwrap();
            claim.metadata.owner_references = Some(case.before.clone());
            sim.apply(&Action::RemoveOwnerReferences {
                claim: "data-etcd-0".into(),
                uids: case.uids.clone(),
            });
            let after = sim.o.claims["data-etcd-0"].owner_references().to_vec();
            assert_eq!(after, case.after.unwrap_or(case.before), "{}", case.name);
        }
        // A missing claim: nothing to do.
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        sim.apply(&Action::RemoveOwnerReferences {
            claim: "gone".into(),
            uids: vec!["uid-set".into()],
        });
        assert!(!sim.o.claims.contains_key("gone"));
    }

    #[test]
    fn delete_honours_the_uid_precondition_and_finds_nothing_gracefully() {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        let delete = |uid: Option<&str>| Action::Delete {
            kind: Kind::Pod,
            name: "etcd-0".into(),
            propagation: Propagation::Background,
            uid: uid.map(str::to_string),
            resource_version: None,
        };
        sim.o
            .stash
            .pods
            .insert("etcd-0".into(), manifest(member_pod(0)));
        sim.apply(&delete(Some("uid-successor")));
        assert!(
            sim.o.pods.contains_key("etcd-0"),
            "a successor is never deleted"
        );
        sim.apply(&delete(Some("uid-etcd-0")));
        assert!(!sim.o.pods.contains_key("etcd-0"));
        sim.apply(&delete(Some("uid-etcd-0")));
        sim.apply(&delete(None));
        assert!(!sim.o.pods.contains_key("etcd-0"));
    }

    #[test]
    fn create_finds_the_object_and_leaves_it_as_it_is() {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        let mut other = bound_claim("data-etcd-0", "fast", "2Gi", "pv-x");
        other.metadata.uid = None;
        sim.apply(&Action::Create(Object::Claim(Box::new(other))));
        let claim = &sim.o.claims["data-etcd-0"];
        assert_eq!(super::super::claim_volume(claim), Some("pv-old-0"));
        assert_eq!(claim.uid().as_deref(), Some("uid-data-etcd-0"));
    }

    #[test]
    fn finalizers_are_added_once_and_removed() {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        sim.apply(&Action::AddFinalizer);
        sim.apply(&Action::AddFinalizer);
        assert_eq!(sim.o.request.finalizers(), [labels::FINALIZER]);
        sim.apply(&Action::RemoveFinalizer);
        sim.apply(&Action::RemoveFinalizer);
        assert!(sim.o.request.finalizers().is_empty());
    }

    #[test]
    fn patches_of_missing_objects_are_successes() {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        let before = sim.o.clone();
        for a in [
            Action::PatchReclaimPolicy {
                volume: "gone".into(),
                policy: "Retain".into(),
            },
            Action::SetClaimRef {
                volume: "gone".into(),
                claim: "data-etcd-0".into(),
            },
            Action::LabelVolume {
                volume: "gone".into(),
            },
            Action::AnnotateClaim {
                claim: "gone".into(),
                key: "k".into(),
                value: Some("v".into()),
            },
        ] {
            sim.apply(&a);
        }
        assert_eq!(sim.o.volumes, before.volumes);
        assert_eq!(sim.o.claims, before.claims);
    }
}
