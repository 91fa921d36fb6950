//! The checks of preflight, in the order they run ([`checks`]), run in one of two modes:
//! - [`Mode::First`]: the first denial ends them; it is the request's denial (`check`, `dry_run`);
//! - [`Mode::All`]: every denial is kept and the checks go on where they can, for
//!   `kubectl smr plan` ([`all_denials`]). A check that needs what a failed one would have given
//!   is skipped (no members without the StatefulSet and its template; no class checks without the
//!   target class).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::{
    Denial, claim_target, classes, deployment, health, members, mover, owner, spec, target,
};
use crate::api::{
    ApplyPolicy, MigrationType, Plan, PlannedClaim, PlannedMember, PlannedWork, TargetKind,
    TemplateSize,
};
use crate::engine;
use crate::plan::observe::{self, Workload};
use crate::plan::{
    Ctx, Observed, Settings, claim_class, claim_request, claim_volume, quantity, volume_class,
};

/// Whether the checks stop at the first denial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    First,
    All,
}

/// The denials found so far.
pub(super) struct Checks {
    mode: Mode,
    pub(super) found: Vec<Denial>,
}

impl Checks {
    pub(super) fn new(mode: Mode) -> Self {
        Self {
            mode,
            found: Vec::new(),
        }
    }

    /// `r`'s value; its denial, if any, is recorded.
    fn keep<T>(&mut self, r: Result<T, Denial>) -> Option<T> {
        r.map_err(|d| self.found.push(d)).ok()
    }

    /// The checks end here: a denial was found and only the first counts.
    fn stop(&self) -> bool {
        self.mode == Mode::First && !self.found.is_empty()
    }
}

/// A check the next ones do not depend on: recorded; the checks end only in [`Mode::First`].
macro_rules! check {
    ($c:expr, $r:expr) => {{
        $c.keep($r);
        if $c.stop() {
            return None;
        }
    }};
}

/// A check whose value the next ones need: without it the checks end.
macro_rules! need {
    ($c:expr, $r:expr) => {
        match $c.keep($r) {
            Some(v) => v,
            None => return None,
        }
    };
}

/// Every denial, in the order the checks run; empty when preflight would accept the request
/// (before measuring a Shrink). The first one is the denial preflight gives.
pub fn all_denials(o: &Observed, settings: &Settings) -> Vec<Denial> {
    let mut c = Checks::new(Mode::All);
    checks(&Ctx::new(o, settings), &mut c);
    c.found.dedup();
    c.found
}

/// Every check but the measuring, in order; the plan when none denied.
pub(super) fn checks(cx: &Ctx, c: &mut Checks) -> Option<Plan> {
    let o = cx.o;
    let spec = cx.spec();
    check!(
        c,
        match spec.type_ {
            MigrationType::StorageClassChange => spec::check_class_change_spec(spec),
            MigrationType::Shrink => spec::check_shrink_spec(spec),
        }
    );
    check!(c, spec::check_template_names(spec));
    check!(c, spec::check_timeout(&spec.timeout));
    check!(c, spec::check_pre_copy_bandwidth(&spec.copy));
    check!(c, spec::check_target_name(&spec.target.name));
    let namespace = o.request.namespace().unwrap_or_default();
    let allowed = cx.settings.allow_request_mover_image;
    check!(c, mover::check_mover_image(spec, allowed));
    check!(
        c,
        mover::check_pod_security(&namespace, &o.namespace_labels)
    );
    let workload = observe::target_workload(spec, &cx.status, &o.target_claim_users);
    match workload {
        Workload::Deployment(name) => return deployment_checks(cx, c, &namespace, &name),
        Workload::Pod(name) => return bare_pod_checks(cx, c, &namespace, &name),
        Workload::StatefulSet(_) | Workload::None => {}
    }
    let mut target = target(cx, c, &namespace)?;
    let unnamed = spec.volume_claim_template.is_none() && spec.volume_claim_templates.is_empty();
    if unnamed && target.claim_member.is_none() {
        skip_templates_already_there(cx, &mut target);
    }
    let mut moves = Vec::new();
    for template in &target.templates {
        moves.push(template_members(cx, c, &target, template)?);
    }
    let (first, further) = moves.split_first()?;
    let (members, further_templates) = merge_templates(first, further);
    check!(
        c,
        members::check_claims_not_shared(&o.claim_users, &members)
    );
    let source_classes = classes::migrating_classes(&first.members, &first.classes);
    let mut members = members;
    // Health (IfReady), then the order: members already there first, then the ones to migrate,
    // followers first (stable by ordinal), leader last.
    health::assign_roles(&o.health, &mut members);
    check!(
        c,
        health::check_engine_health(
            spec.apply,
            engine::rules(&spec.database).as_ref(),
            &o.health,
            &members
        )
    );
    check!(
        c,
        health::check_budgets(spec.apply, &o.budgets, &o.pods, &members)
    );
    let (target_class, target_size) = first.target.clone()?;
    if !c.found.is_empty() {
        return None;
    }
    members::order(&mut members);
    Some(Plan {
        stateful_set: target.set_name,
        deployment: None,
        pod: None,
        volume_claim_template: first.template.clone(),
        target_claim: target.claim_member.map(|_| spec.target.name.clone()),
        source_storage_class: source_classes.first().cloned().filter(|c| !c.is_empty()),
        target_storage_class: target_class,
        target_size,
        further_templates,
        members,
    })
}

/// With no template named, a template whose every claim (and the template itself) already is
/// on the target class and size moves no more: an earlier request moved it. Kept when every
/// template is there (preflight then denies: nothing to do).
fn skip_templates_already_there(cx: &Ctx, target: &mut Target) {
    let there = |t: &PersistentVolumeClaim| template_already_there(cx, target, t);
    let left: Vec<PersistentVolumeClaim> = target
        .templates
        .iter()
        .filter(|t| !there(t))
        .cloned()
        .collect();
    if !left.is_empty() {
        target.templates = left;
    }
}

/// The template and every member's claim of it (and the claim's volume) already are on the
/// target class (StorageClassChange) or at the shrink size (Shrink).
fn template_already_there(cx: &Ctx, target: &Target, template: &PersistentVolumeClaim) -> bool {
    let (o, spec) = (cx.o, cx.spec());
    let name = template.name_any();
    let fits = |claim: &PersistentVolumeClaim, volume_ok: &dyn Fn(&str) -> bool| match spec.type_ {
        MigrationType::StorageClassChange => {
            let class = (spec.storage_class_change.as_ref()).map(|c| &c.storage_class_name);
            claim_class(claim) == class.map(String::as_str)
                && claim_volume(claim).is_none_or(volume_ok)
        }
        MigrationType::Shrink => {
            let size = spec::shrink_size(spec, &name).ok();
            let bytes = |q: Option<&Quantity>| q.and_then(quantity::bytes);
            size.is_some() && bytes(claim_request(claim)) == bytes(size.as_ref())
        }
    };
    let class = (spec.storage_class_change.as_ref()).map(|c| c.storage_class_name.as_str());
    let volume_ok = |v: &str| {
        spec.type_ == MigrationType::Shrink || o.volumes.get(v).and_then(volume_class) == class
    };
    let Ok(ordinals) = members::check_ordinals(target.set, &target.set_name) else {
        return false;
    };
    fits(template, &|_| true)
        && ordinals.into_iter().all(|i| {
            let claim = o.claims.get(&format!("{name}-{}-{i}", target.set_name));
            claim.is_some_and(|c| fits(c, &volume_ok))
        })
}

/// One volumeClaimTemplate's claims, planned as if they alone moved.
struct TemplateMove {
    template: String,
    members: Vec<PlannedMember>,
    /// Each member's claim's StorageClass.
    classes: Vec<String>,
    /// The target class and the size of the new claims.
    target: Option<(String, Quantity)>,
}

/// Every member's claim of `template`, with its class and size checks; members already there
/// (an earlier request moved them) are marked so. A claim target keeps the template: only its
/// claim is compared with the target.
fn template_members(
    cx: &Ctx,
    c: &mut Checks,
    target: &Target,
    template: &PersistentVolumeClaim,
) -> Option<TemplateMove> {
    let names = members::Names {
        request: cx.name(),
        set: target.set_name.clone(),
        template: template.name_any(),
    };
    let (mut members, classes) = set_members(cx, c, target.set, &names)?;
    if let Some(m) = &target.claim_member {
        claim_target::mark_not_targeted(&mut members, m.ordinal);
    }
    let changed_template = target.claim_member.is_none().then_some(template);
    let sized = (names.template.as_str(), changed_template);
    let target = target_class_and_size(cx, c, sized, &mut members, &classes);
    if c.stop() {
        return None;
    }
    Some(TemplateMove {
        template: names.template,
        members,
        classes,
        target,
    })
}

/// The members of the first template, each with its claims of the further ones
/// (`furtherClaims`): a member is left alone only when every claim of it is; and the further
/// templates with their sizes.
fn merge_templates(
    first: &TemplateMove,
    further: &[TemplateMove],
) -> (Vec<PlannedMember>, Vec<TemplateSize>) {
    let mut members = first.members.clone();
    for t in further {
        for m in &mut members {
            let Some(other) = t.members.iter().find(|o| o.ordinal == m.ordinal) else {
                continue;
            };
            if other.work == PlannedWork::Migrate {
                m.work = PlannedWork::Migrate;
            }
            m.further_claims.push(PlannedClaim {
                template: t.template.clone(),
                claim: other.claim.clone(),
                old_volume: other.old_volume.clone(),
                temp_claim: other.temp_claim.clone(),
                old_size: other.old_size.clone(),
                new_size: other.new_size.clone(),
                used_bytes: None,
            });
        }
    }
    let sizes = further.iter().filter_map(|t| {
        let (_, size) = t.target.clone()?;
        Some(TemplateSize {
            name: t.template.clone(),
            size,
        })
    });
    (members, sizes.collect())
}

/// The checks of a Deployment's claim ([`deployment`]): one member, the claim, stopped by
/// scaling the Deployment to zero.
fn deployment_checks(cx: &Ctx, c: &mut Checks, namespace: &str, name: &str) -> Option<Plan> {
    let (o, spec) = (cx.o, cx.spec());
    check!(
        c,
        deployment::check_spec(spec, &format!("Deployment {name}"))
    );
    let d = need!(
        c,
        deployment::check_exists(o.deployment.as_ref(), name, namespace)
    );
    check!(c, owner::check_deployment_owner(d, spec.owner_paused));
    check!(
        c,
        deployment::check_autoscalers(&o.autoscalers, name, spec.owner_paused)
    );
    let claims = need!(c, deployment::check_claim(d, spec));
    let replicas = need!(c, deployment::check_replicas(d));
    for claim in &claims {
        check!(c, deployment::check_replicas_share(o, d, replicas, claim));
    }
    if spec.apply == ApplyPolicy::IfReady {
        check!(c, deployment::check_available(d, replicas));
    }
    let first = claims.first()?;
    let pod = need!(c, deployment::check_member_pod(o, name, first));
    let mut moved = Vec::new();
    for claim in claims {
        let checked = members::check_pod_and_claim(o, &cx.name(), 0, pod.clone(), claim);
        let (member, class) = need!(c, checked);
        check!(
            c,
            deployment::check_claim_not_shared(&o.claim_users, o, &member, name)
        );
        moved.push((member, class));
    }
    let owner = (Some(name.to_string()), None);
    single_claim_plan(cx, c, moved, owner)
}

/// The plan of the claims of one pod of a Deployment or a bare pod (`owner`, one of them set),
/// each with its class and size (a Shrink size keyed by the claim's name), then the budgets of
/// the pods. The first claim is the member's; the others are its further claims.
fn single_claim_plan(
    cx: &Ctx,
    c: &mut Checks,
    claims: Vec<(PlannedMember, String)>,
    (deployment, pod): (Option<String>, Option<String>),
) -> Option<Plan> {
    let spec = cx.spec();
    let names: Vec<String> = claims.iter().map(|(m, _)| m.claim.clone()).collect();
    if spec.type_ == MigrationType::Shrink {
        check!(c, spec::check_sizes_named(spec, &names));
    }
    let mut moves = Vec::new();
    for (member, class) in claims {
        let (mut members, classes) = (vec![member], vec![class]);
        let sized = (members[0].claim.clone(), None);
        let target = target_class_and_size(cx, c, (&sized.0, sized.1), &mut members, &classes);
        if c.stop() {
            return None;
        }
        moves.push(TemplateMove {
            template: members[0].claim.clone(),
            members,
            classes,
            target,
        });
    }
    let (first, further) = moves.split_first()?;
    let (members, further_templates) = merge_templates(first, further);
    check!(
        c,
        health::check_budgets(spec.apply, &cx.o.budgets, &cx.o.pods, &members)
    );
    let (target_class, target_size) = first.target.clone()?;
    if !c.found.is_empty() {
        return None;
    }
    Some(Plan {
        stateful_set: String::new(),
        deployment,
        pod,
        volume_claim_template: String::new(),
        target_claim: Some(members[0].claim.clone()),
        source_storage_class: first.classes.first().cloned().filter(|c| !c.is_empty()),
        target_storage_class: target_class,
        target_size,
        further_templates,
        members,
    })
}

/// Every member: its pod exists, runs on a node, and is bound to its claim; with each claim's
/// class.
fn set_members(
    cx: &Ctx,
    c: &mut Checks,
    set: &StatefulSet,
    names: &members::Names,
) -> Option<(Vec<PlannedMember>, Vec<String>)> {
    let (mut members, mut claim_classes) = (Vec::new(), Vec::new());
    for ordinal in need!(c, members::check_ordinals(set, &names.set)) {
        if let Some((member, class)) = c.keep(members::check_member(cx.o, names, ordinal)) {
            members.push(member);
            claim_classes.push(class);
        }
        if c.stop() {
            return None;
        }
    }
    Some((members, claim_classes))
}

/// The checks of a bare pod's claim (a claim target that a pod no controller owns mounts): one
/// member, the pod, stopped and recreated from its stash like a StatefulSet member's.
fn bare_pod_checks(cx: &Ctx, c: &mut Checks, namespace: &str, name: &str) -> Option<Plan> {
    let (o, spec) = (cx.o, cx.spec());
    check!(c, deployment::check_spec(spec, &format!("pod {name}")));
    let pod = need!(c, deployment::check_bare_pod(o, name, namespace));
    check!(c, owner::check_pod_owner(pod, spec.owner_paused));
    if spec.apply == ApplyPolicy::IfReady {
        check!(c, deployment::check_pod_ready(pod, name));
    }
    let claim = spec.target.name.clone();
    let checked = members::check_pod_and_claim(o, &cx.name(), 0, name.to_string(), claim);
    let moved = vec![need!(c, checked)];
    single_claim_plan(cx, c, moved, (None, Some(name.to_string())))
}

/// What the request works on.
struct Target<'o> {
    set: &'o StatefulSet,
    set_name: String,
    /// The volumeClaimTemplates whose claims move, the plan's `volumeClaimTemplate` first.
    templates: Vec<PersistentVolumeClaim>,
    /// For a claim target, its member: only that member moves.
    claim_member: Option<claim_target::ClaimMember>,
}

/// The StatefulSet and the template: the target's, or a claim target's member's.
fn target<'o>(cx: &Ctx<'o>, c: &mut Checks, namespace: &str) -> Option<Target<'o>> {
    let (o, spec) = (cx.o, cx.spec());
    let claim_member = match spec.target.kind {
        TargetKind::StatefulSet | TargetKind::Deployment => None,
        TargetKind::PersistentVolumeClaim => {
            let m = need!(
                c,
                claim_target::check_claim_target(o, &spec.target.name, namespace)
            );
            check!(c, claim_target::check_template_matches(spec, &m));
            Some(m)
        }
    };
    let (set_name, wanted) = match &claim_member {
        Some(m) => (m.set.clone(), vec![m.template.clone()]),
        None => (
            spec.target.name.clone(),
            (spec.volume_claim_template.iter())
                .chain(&spec.volume_claim_templates)
                .cloned()
                .collect(),
        ),
    };
    let set = need!(
        c,
        target::check_target_exists(o.stateful_set.as_ref(), &set_name, namespace)
    );
    check!(c, owner::check_owner(set, spec.owner_paused));
    let templates = need!(c, target::choose_templates(set, &wanted));
    for template in &templates {
        check!(c, target::check_template_volume_mode(template));
    }
    if spec.type_ == MigrationType::Shrink {
        let names: Vec<String> = templates.iter().map(|t| t.name_any()).collect();
        check!(c, spec::check_sizes_named(spec, &names));
    }
    Some(Target {
        set,
        set_name,
        templates,
        claim_member,
    })
}

/// The target class and the new size of every member; members already on the target class are
/// marked so. `template` is the one the recreated set changes (`None` for a claim target: the
/// set keeps its templates, the members left alone are not compared).
fn target_class_and_size(
    cx: &Ctx,
    c: &mut Checks,
    (sized, template): (&str, Option<&PersistentVolumeClaim>),
    members: &mut [PlannedMember],
    claim_classes: &[String],
) -> Option<(String, Quantity)> {
    let spec = cx.spec();
    let classes_of = &cx.o.storage_classes;
    let targeted = members.iter().zip(claim_classes);
    let all_classes = classes::distinct(
        targeted
            .filter(|(m, _)| m.work != PlannedWork::NotTargeted)
            .map(|(_, class)| class.clone())
            .collect(),
    );
    let target_class = need!(c, classes::check_target_class(spec, &all_classes));
    let target = c.keep(classes::check_storage_class(classes_of, &target_class));
    if c.stop() {
        return None;
    }
    let size = match spec.type_ {
        MigrationType::StorageClassChange => {
            classes::mark_on_class(cx.o, members, &target_class);
            check!(
                c,
                classes::check_not_all_on_class(members, template, &target_class)
            );
            let sources = classes::migrating_classes(members, claim_classes);
            if let Some(target) = target {
                let mode = classes::check_binding_mode(classes_of, &sources, target, &target_class);
                check!(c, mode);
            }
            match template {
                Some(template) => need!(c, classes::check_template_size(template)),
                None => classes::targeted_size(members),
            }
        }
        MigrationType::Shrink => {
            let size = need!(c, spec::shrink_size(spec, sized));
            let size = need!(c, classes::check_shrink_size(size, members, template));
            members
                .iter_mut()
                .filter(|m| m.work != PlannedWork::NotTargeted)
                .for_each(|m| m.new_size = size.clone());
            size
        }
    };
    Some((target_class, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::*;
    use crate::plan::preflight::{DenialReason, dry_run};

    fn image() -> Settings {
        SETTINGS.clone()
    }

    #[test]
    fn an_acceptable_request_has_no_denial() {
        let o = observed(spec_class_change("fast"));
        assert!(dry_run(&o, &image()).is_ok());
        assert_eq!(all_denials(&o, &image()), vec![]);
    }

    #[test]
    fn every_problem_is_listed_the_first_as_preflight_gives_it() {
        let mut spec = spec_class_change("nowhere");
        spec.timeout = "soon".into();
        let mut o = observed(spec);
        o.pods.remove("etcd-1");
        o.claims.remove("data-etcd-2");
        let all = all_denials(&o, &image());
        let reasons: Vec<DenialReason> = all.iter().map(|d| d.reason).collect();
        assert_eq!(
            reasons,
            vec![
                DenialReason::InvalidSpec,
                DenialReason::MemberMissing,
                DenialReason::ClaimNotFound,
                DenialReason::StorageClassNotFound,
            ],
            "{all:#?}"
        );
        assert_eq!(Err(all[0].clone()), dry_run(&o, &image()));
        assert!(all[1].message.contains("etcd-1"), "{}", all[1].message);
        assert!(all[2].message.contains("data-etcd-2"), "{}", all[2].message);
    }

    #[test]
    fn without_the_stateful_set_nothing_after_it_is_judged() {
        let mut o = observed(spec_class_change("fast"));
        o.stateful_set = None;
        let reasons: Vec<DenialReason> = (all_denials(&o, &image()).iter())
            .map(|d| d.reason)
            .collect();
        assert_eq!(reasons, vec![DenialReason::TargetNotFound]);
    }
}
