//! Preflight: everything is checked before anything is touched. Every failed check ends the
//! request `Denied` (condition `Accepted=False` with a reason, a message naming the problem, an
//! Event); success accepts it with a fixed plan.
//!
//! The only objects preflight creates are the Shrink measure Jobs (read-only mounts of the old
//! claims, owned by the request).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::quantity::{self, human};
use super::{
    Action, Ctx, EventType, JobOutcome, Kind, Propagation, REQUEUE_WAITING, claim_class,
    claim_phase, claim_request, claim_volume, class_is_wffc, is_terminating, timeout_seconds,
};
use crate::api::conditions;
use crate::api::{
    ApplyPolicy, MemberStatus, MigrationType, Phase, Plan, PlannedMember, Stage,
    StorageMigrationRequestSpec,
};
use crate::build::{self, JobKind};
use crate::engine::{self, Role};
use crate::labels;

/// Minimum free headroom a shrunk volume keeps above the used bytes.
pub const MIN_HEADROOM_BYTES: i128 = 16 << 20;

/// Why a request is denied: a condition reason and a message naming the problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    pub reason: &'static str,
    pub message: String,
}

fn denial(reason: &'static str, message: impl Into<String>) -> Denial {
    Denial {
        reason,
        message: message.into(),
    }
}

/// What preflight found.
enum Verdict {
    Deny(Denial),
    /// Still measuring; the message says what is awaited.
    Wait(String),
    Accept(Plan),
}

pub(crate) fn run(cx: &mut Ctx) {
    match check(cx, true) {
        Verdict::Deny(d) => deny(cx, d),
        Verdict::Wait(message) => {
            if cx.status.message.as_deref() != Some(message.as_str()) {
                cx.status.message = Some(message);
            }
            cx.wait(REQUEUE_WAITING);
        }
        Verdict::Accept(plan) => accept(cx, plan),
    }
}

/// The pure validation of a spec on its own (no cluster needed).
pub fn validate_spec(spec: &StorageMigrationRequestSpec) -> Result<(), Denial> {
    match spec.type_ {
        MigrationType::StorageClassChange => {
            let Some(change) = &spec.storage_class_change else {
                return Err(denial(
                    "InvalidSpec",
                    "type StorageClassChange needs spec.storageClassChange.storageClassName",
                ));
            };
            if change.storage_class_name.trim().is_empty() {
                return Err(denial(
                    "InvalidSpec",
                    "spec.storageClassChange.storageClassName is empty",
                ));
            }
            if spec.shrink.is_some() {
                return Err(denial(
                    "InvalidSpec",
                    "type StorageClassChange does not take spec.shrink",
                ));
            }
        }
        MigrationType::Shrink => {
            let Some(shrink) = &spec.shrink else {
                return Err(denial("InvalidSpec", "type Shrink needs spec.shrink.size"));
            };
            match quantity::bytes(&shrink.size) {
                Some(b) if b > 0 => {}
                Some(_) => {
                    return Err(denial("InvalidSpec", "spec.shrink.size must be positive"));
                }
                None => {
                    return Err(denial(
                        "InvalidSpec",
                        format!("spec.shrink.size {:?} is not a quantity", shrink.size.0),
                    ));
                }
            }
            if spec.storage_class_change.is_some() {
                return Err(denial(
                    "InvalidSpec",
                    "type Shrink does not take spec.storageClassChange",
                ));
            }
        }
    }
    if let Err(e) = timeout_seconds(&spec.timeout) {
        return Err(denial(
            "InvalidSpec",
            format!("spec.timeout: {e} (use e.g. 30m or 1h30m)"),
        ));
    }
    if spec.target.name.trim().is_empty() {
        return Err(denial("InvalidSpec", "spec.target.name is empty"));
    }
    Ok(())
}

/// The name of the volumeClaimTemplate to migrate.
pub fn choose_template(
    set: &StatefulSet,
    wanted: Option<&str>,
) -> Result<PersistentVolumeClaim, Denial> {
    let set_name = set.name_any();
    let templates = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default();
    match wanted {
        Some(name) => templates
            .into_iter()
            .find(|t| t.metadata.name.as_deref() == Some(name))
            .ok_or_else(|| {
                denial(
                    "TemplateNotFound",
                    format!("StatefulSet {set_name} has no volumeClaimTemplate {name:?}"),
                )
            }),
        None => match templates.len() {
            0 => Err(denial(
                "TemplateNotFound",
                format!("StatefulSet {set_name} has no volumeClaimTemplates: nothing to migrate"),
            )),
            1 => Ok(templates.into_iter().next().unwrap_or_default()),
            n => Err(denial(
                "TemplateRequired",
                format!(
                    "StatefulSet {set_name} has {n} volumeClaimTemplates ({}); set \
                     spec.volumeClaimTemplate",
                    templates
                        .iter()
                        .map(|t| t.name_any())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        },
    }
}

/// What preflight would decide for a new request, without creating anything (no measure Jobs:
/// a Shrink plan then has no `usedBytes`). For `storage-migrator plan`.
pub fn dry_run(o: &super::Observed) -> Result<Plan, Denial> {
    let mut cx = Ctx::new(o);
    match check(&mut cx, false) {
        Verdict::Deny(d) => Err(d),
        Verdict::Accept(plan) => Ok(plan),
        Verdict::Wait(message) => Err(denial("Waiting", message)),
    }
}

fn check(cx: &mut Ctx, measuring: bool) -> Verdict {
    let spec = cx.spec().clone();
    if let Err(d) = validate_spec(&spec) {
        return Verdict::Deny(d);
    }
    let set_name = spec.target.name.clone();
    let Some(set) =
        cx.o.stateful_set
            .as_ref()
            .map(|s| s.typed())
            .filter(|s| !is_terminating(*s))
    else {
        return Verdict::Deny(denial(
            "TargetNotFound",
            format!("StatefulSet {set_name} not found in namespace {}", ns(cx)),
        ));
    };
    let template = match choose_template(set, spec.volume_claim_template.as_deref()) {
        Ok(t) => t,
        Err(d) => return Verdict::Deny(d),
    };
    let template_name = template.name_any();
    if let Some(mode) = template
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        && mode != "Filesystem"
    {
        return Verdict::Deny(denial(
            "UnsupportedVolumeMode",
            format!(
                "volumeClaimTemplate {template_name} has volumeMode {mode}; only Filesystem volumes can be copied"
            ),
        ));
    }

    // Only one request at a time per target: the accepted one, else the oldest.
    let me_created =
        cx.o.request
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0);
    let me_name = cx.name();
    for other in &cx.o.other_requests {
        if other.phase.is_final() {
            continue;
        }
        let older = match (other.created, me_created) {
            (Some(a), Some(b)) => (a, &other.name) < (b, &me_name),
            _ => other.name < me_name,
        };
        if other.phase == Phase::Progressing || older {
            return Verdict::Deny(denial(
                "ConcurrentRequest",
                format!(
                    "request {} is already running on StatefulSet {set_name}; wait for it to finish",
                    other.name
                ),
            ));
        }
    }

    // Members: every pod exists, runs on a node, and is bound to its claim.
    let spec_ref = set.spec.as_ref();
    let replicas = spec_ref.and_then(|s| s.replicas).unwrap_or(1);
    if replicas < 1 {
        return Verdict::Deny(denial(
            "NoMembers",
            format!("StatefulSet {set_name} has 0 replicas: nothing to migrate"),
        ));
    }
    let start = spec_ref
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0);
    let req_name = cx.name();
    let mut members = Vec::new();
    let mut source_classes = Vec::new();
    for ordinal in start..start + replicas {
        let pod_name = format!("{set_name}-{ordinal}");
        let claim_name = format!("{template_name}-{set_name}-{ordinal}");
        let Some(pod) =
            cx.o.pods
                .get(&pod_name)
                .map(|p| p.typed())
                .filter(|p| !is_terminating(*p))
        else {
            return Verdict::Deny(denial(
                "MemberMissing",
                format!(
                    "member pod {pod_name} does not exist; every member must run before a migration"
                ),
            ));
        };
        let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
        else {
            return Verdict::Deny(denial(
                "MemberNotScheduled",
                format!("member pod {pod_name} is not scheduled on a node"),
            ));
        };
        let uses_claim = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|vs| {
                vs.iter().any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim_name)
                })
            });
        let Some(claim) = cx.o.claims.get(&claim_name) else {
            return Verdict::Deny(denial(
                "ClaimNotFound",
                format!("claim {claim_name} of member {pod_name} does not exist"),
            ));
        };
        if !uses_claim {
            return Verdict::Deny(denial(
                "ClaimNotFound",
                format!("member pod {pod_name} does not mount claim {claim_name}"),
            ));
        }
        let volume = match (claim_phase(claim), claim_volume(claim)) {
            ("Bound", Some(v)) if !is_terminating(claim) => v.to_string(),
            (phase, _) => {
                return Verdict::Deny(denial(
                    "ClaimNotBound",
                    format!("claim {claim_name} of member {pod_name} is {phase}, not Bound"),
                ));
            }
        };
        if !cx.o.volumes.contains_key(&volume) {
            return Verdict::Deny(denial(
                "VolumeNotFound",
                format!("volume {volume} of claim {claim_name} does not exist"),
            ));
        }
        if let Some(mode) = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref())
            && mode != "Filesystem"
        {
            return Verdict::Deny(denial(
                "UnsupportedVolumeMode",
                format!(
                    "claim {claim_name} has volumeMode {mode}; only Filesystem volumes can be copied"
                ),
            ));
        }
        let Some(old_size) = claim_request(claim).cloned() else {
            return Verdict::Deny(denial(
                "InvalidClaim",
                format!("claim {claim_name} has no storage request"),
            ));
        };
        if quantity::bytes(&old_size).is_none() {
            return Verdict::Deny(denial(
                "InvalidClaim",
                format!(
                    "claim {claim_name} requests {:?}, not a quantity",
                    old_size.0
                ),
            ));
        }
        source_classes.push(claim_class(claim).unwrap_or_default().to_string());
        members.push(PlannedMember {
            ordinal,
            pod: pod_name,
            node,
            claim: claim_name.clone(),
            old_volume: volume,
            temp_claim: build::temp_claim_name(&req_name, &claim_name),
            new_size: old_size.clone(),
            old_size,
            used_bytes: None,
            role: None,
        });
    }

    // Classes and sizes.
    source_classes.sort();
    source_classes.dedup();
    let source_class = source_classes.first().cloned().unwrap_or_default();
    let target_class = match spec.type_ {
        MigrationType::StorageClassChange => spec
            .storage_class_change
            .as_ref()
            .map(|c| c.storage_class_name.clone())
            .unwrap_or_default(),
        MigrationType::Shrink => {
            if source_classes.len() > 1 {
                return Verdict::Deny(denial(
                    "MixedStorageClasses",
                    format!(
                        "the members' claims are on different StorageClasses ({}); migrate them to one class first",
                        source_classes.join(", ")
                    ),
                ));
            }
            source_class.clone()
        }
    };
    let Some(target) = cx.o.storage_classes.get(&target_class) else {
        return Verdict::Deny(denial(
            "StorageClassNotFound",
            format!("StorageClass {target_class:?} does not exist"),
        ));
    };
    let target_size = match spec.type_ {
        MigrationType::StorageClassChange => {
            if source_classes.contains(&target_class) {
                return Verdict::Deny(denial(
                    "SameStorageClass",
                    format!("the claims are already on StorageClass {target_class}"),
                ));
            }
            for class in &source_classes {
                if let Some(source) = cx.o.storage_classes.get(class)
                    && class_is_wffc(source)
                    && !class_is_wffc(target)
                {
                    return Verdict::Deny(denial(
                        "BindingModeMismatch",
                        format!(
                            "source StorageClass {class} is WaitForFirstConsumer but target {target_class} is not: the new volumes could be provisioned away from the members' nodes"
                        ),
                    ));
                }
            }
            template_size(&template)
        }
        MigrationType::Shrink => {
            let size = spec
                .shrink
                .as_ref()
                .map(|s| s.size.clone())
                .unwrap_or_default();
            let size_bytes = quantity::bytes(&size).unwrap_or_default();
            for m in &mut members {
                let old = quantity::bytes(&m.old_size).unwrap_or_default();
                if size_bytes >= old {
                    return Verdict::Deny(denial(
                        "NotSmaller",
                        format!(
                            "shrink size {} is not below claim {}'s request {}",
                            size.0, m.claim, m.old_size.0
                        ),
                    ));
                }
                m.new_size = size.clone();
            }
            Some(size)
        }
    };
    let Some(target_size) = target_size else {
        return Verdict::Deny(denial(
            "InvalidClaim",
            format!("volumeClaimTemplate {template_name} has no storage request"),
        ));
    };

    // Health (IfReady).
    match &cx.o.health {
        Ok(report) => {
            for m in &mut members {
                if let Some(h) = report.members.iter().find(|h| h.pod == m.pod) {
                    m.role = Some(h.role());
                }
            }
            if spec.apply == ApplyPolicy::IfReady {
                let mut report = report.clone();
                let pods: Vec<String> = members.iter().map(|m| m.pod.clone()).collect();
                engine::note_missing_pods(&mut report, &pods);
                if let Err(problems) = engine::is_healthy_for_start(&report) {
                    return Verdict::Deny(denial(
                        "NotHealthy",
                        format!("apply is IfReady and the database is not healthy: {problems}"),
                    ));
                }
            }
        }
        Err(e) if spec.apply == ApplyPolicy::IfReady => {
            return Verdict::Deny(denial(
                "NotHealthy",
                format!("apply is IfReady and the database's health cannot be read: {e}"),
            ));
        }
        Err(_) => {}
    }
    // Followers first (stable by ordinal), leader last.
    members.sort_by_key(|m| (m.role == Some(Role::Leader), m.ordinal));

    // Shrink: every member's used bytes must fit with headroom (measured on its node).
    if spec.type_ == MigrationType::Shrink && measuring {
        match measure(cx, &mut members, &target_size) {
            Ok(true) => {}
            Ok(false) => {
                return Verdict::Wait(format!(
                    "preflight: measuring the used bytes of {} members",
                    members.len()
                ));
            }
            Err(d) => return Verdict::Deny(d),
        }
    }

    Verdict::Accept(Plan {
        stateful_set: set_name,
        volume_claim_template: template_name,
        source_storage_class: Some(source_class).filter(|c| !c.is_empty()),
        target_storage_class: target_class,
        target_size,
        members,
    })
}

/// Runs (or reads) one Measure Job per member. `Ok(true)` once every member is measured and
/// fits; `Ok(false)` while Jobs run.
fn measure(cx: &mut Ctx, members: &mut [PlannedMember], size: &Quantity) -> Result<bool, Denial> {
    let size_bytes = quantity::bytes(size).unwrap_or_default();
    let req_name = cx.name();
    let mut all = true;
    for m in members.iter_mut() {
        if let Some(claim) = cx.o.claims.get(&m.claim)
            && claim
                .spec
                .as_ref()
                .and_then(|s| s.access_modes.as_ref())
                .is_some_and(|a| a.iter().any(|m| m == "ReadWriteOncePod"))
        {
            return Err(denial(
                "CannotMeasure",
                format!(
                    "claim {} is ReadWriteOncePod: its used bytes cannot be measured while member {} runs",
                    m.claim, m.pod
                ),
            ));
        }
        let job_name = build::job_name(&req_name, &m.pod, JobKind::Measure);
        match cx.o.jobs.get(&job_name).map(|j| &j.outcome) {
            None => {
                let deadline = cx.remaining_seconds();
                let job = build::job(&cx.req, m, JobKind::Measure, deadline);
                cx.act(Action::Create(super::Object::Job(Box::new(job))));
                all = false;
            }
            Some(JobOutcome::Running) => all = false,
            Some(JobOutcome::Failed { reason }) => {
                return Err(denial(
                    "MeasureFailed",
                    format!("measuring the used bytes of {} failed: {reason}", m.claim),
                ));
            }
            Some(JobOutcome::Succeeded { message }) => {
                let used = message
                    .as_deref()
                    .and_then(|msg| build::parse_job_result(msg).ok())
                    .and_then(|r| r.used_bytes);
                let Some(used) = used else {
                    return Err(denial(
                        "MeasureFailed",
                        format!(
                            "the measure Job of {} reported no used bytes ({:?})",
                            m.claim, message
                        ),
                    ));
                };
                m.used_bytes = Some(used);
                let used = i128::from(used);
                let needed = used + (used / 10).max(MIN_HEADROOM_BYTES);
                if needed > size_bytes {
                    return Err(denial(
                        "InsufficientSize",
                        format!(
                            "member {} uses {} on claim {}: with headroom it needs {}, more than the shrink size {}",
                            m.pod,
                            human(used),
                            m.claim,
                            human(needed),
                            size.0
                        ),
                    ));
                }
            }
        }
    }
    Ok(all)
}

fn template_size(template: &PersistentVolumeClaim) -> Option<Quantity> {
    claim_request(template).cloned()
}

fn ns(cx: &Ctx) -> String {
    cx.o.request.namespace().unwrap_or_default()
}

/// Deletes the measure Jobs left by preflight.
fn delete_measure_jobs(cx: &mut Ctx) {
    let jobs: Vec<String> =
        cx.o.jobs
            .iter()
            .filter(|(_, j)| {
                j.job
                    .labels()
                    .get(labels::JOB_KIND_LABEL)
                    .map(String::as_str)
                    == Some(JobKind::Measure.as_str())
            })
            .map(|(n, _)| n.clone())
            .collect();
    for name in jobs {
        cx.act(Action::Delete {
            kind: Kind::Job,
            name,
            propagation: Propagation::Background,
            uid: None,
        });
    }
}

fn deny(cx: &mut Ctx, d: Denial) {
    let generation = cx.o.request.metadata.generation;
    cx.status.phase = Phase::Denied;
    cx.status.stage = Stage::Done;
    cx.status.observed_generation = generation;
    cx.status.message = Some(d.message.clone());
    cx.status.completion_time = Some(cx.now.clone());
    cx.set_condition(conditions::ACCEPTED, false, d.reason, &d.message);
    cx.set_condition(conditions::READY, false, "Denied", &d.message);
    cx.event(EventType::Warning, "Denied", d.message);
    delete_measure_jobs(cx);
    cx.requeue = super::REQUEUE_FINAL;
}

fn accept(cx: &mut Ctx, plan: Plan) {
    let generation = cx.o.request.metadata.generation;
    let n = plan.members.len();
    let message = format!(
        "accepted: {n} members of StatefulSet {} move to StorageClass {} ({}), order {}",
        plan.stateful_set,
        plan.target_storage_class,
        plan.target_size.0,
        plan.members
            .iter()
            .map(|m| m.pod.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    cx.status.phase = Phase::Progressing;
    cx.status.stage = Stage::OrphaningStatefulSet;
    cx.status.observed_generation = generation;
    cx.status.accepted_spec = Some(Box::new(cx.spec().clone()));
    cx.status.start_time = Some(cx.now.clone());
    cx.status.members = plan
        .members
        .iter()
        .map(|m| MemberStatus {
            pod: m.pod.clone(),
            ..Default::default()
        })
        .collect();
    cx.status.plan = Some(plan);
    cx.status.progress = Some(super::progress(&cx.status));
    cx.status.message = Some(message.clone());
    cx.set_condition(conditions::ACCEPTED, true, "Accepted", &message);
    cx.set_condition(
        conditions::READY,
        false,
        "Progressing",
        "migration in progress",
    );
    cx.set_condition(
        conditions::PROGRESSING,
        true,
        "OrphaningStatefulSet",
        "stashing and orphaning the StatefulSet",
    );
    if !cx
        .o
        .request
        .finalizers()
        .iter()
        .any(|f| f == labels::FINALIZER)
    {
        cx.act(Action::AddFinalizer);
    }
    cx.event(EventType::Normal, "Accepted", message);
    delete_measure_jobs(cx);
    cx.requeue = std::time::Duration::ZERO;
}
