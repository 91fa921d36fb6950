//! Every reason preflight would deny a request, not only the first: for `kubectl smr plan`.
//!
//! The same checks as [`super::check`], in the same order, but each failure is collected and
//! the checks go on. A check that needs what a failed one would have given is skipped (no
//! members without the StatefulSet and its template; no class checks without the target class).

use kube::ResourceExt;

use super::{Denial, classes, health, members, mover, owner, spec, target};
use crate::api::MigrationType;
use crate::plan::{Ctx, Observed, Settings};

/// Every denial, in the order the checks run; empty when preflight would accept the request
/// (before measuring a Shrink). The first one is the denial preflight gives.
pub fn all_denials(o: &Observed, settings: &Settings) -> Vec<Denial> {
    let cx = Ctx::new(o, settings);
    let mut out = Vec::new();
    spec_denials(&cx, &mut out);
    cluster_denials(&cx, &mut out);
    out.dedup();
    out
}

/// Keeps `r`'s denial in `out`; its value, if any.
fn keep<T>(out: &mut Vec<Denial>, r: Result<T, Denial>) -> Option<T> {
    r.map_err(|d| out.push(d)).ok()
}

fn spec_denials(cx: &Ctx, out: &mut Vec<Denial>) {
    let s = cx.spec();
    let by_type = match s.type_ {
        MigrationType::StorageClassChange => spec::check_class_change_spec(s),
        MigrationType::Shrink => spec::check_shrink_spec(s),
    };
    keep(out, by_type);
    keep(out, spec::check_timeout(&s.timeout));
    keep(out, spec::check_target_name(&s.target.name));
    let namespace = cx.o.request.namespace().unwrap_or_default();
    let allowed = cx.settings.allow_request_mover_image;
    keep(out, mover::check_mover_image(s, allowed));
    keep(
        out,
        mover::check_pod_security(&namespace, &cx.o.namespace_labels),
    );
}

fn cluster_denials(cx: &Ctx, out: &mut Vec<Denial>) {
    let o = cx.o;
    let s = cx.spec();
    let set_name = s.target.name.as_str();
    let namespace = o.request.namespace().unwrap_or_default();
    let found = target::check_target_exists(o.stateful_set.as_ref(), set_name, &namespace);
    let Some(set) = keep(out, found) else {
        return;
    };
    keep(out, owner::check_owner(set, s.owner_paused));
    let chosen = target::choose_template(set, s.volume_claim_template.as_deref());
    let Some(template) = keep(out, chosen) else {
        return;
    };
    keep(out, target::check_template_volume_mode(&template));
    let Some(ordinals) = keep(out, members::check_ordinals(set, set_name)) else {
        return;
    };
    let names = members::Names {
        request: cx.name(),
        set: set_name.to_string(),
        template: template.name_any(),
    };
    let (mut planned, mut claim_classes) = (Vec::new(), Vec::new());
    for ordinal in ordinals {
        if let Some((m, class)) = keep(out, members::check_member(o, &names, ordinal)) {
            planned.push(m);
            claim_classes.push(class);
        }
    }
    class_denials(cx, &template, &mut planned, claim_classes, out);
    health::assign_roles(&o.health, &mut planned);
    keep(
        out,
        health::check_engine_health(s.apply, &o.health, &planned),
    );
}

fn class_denials(
    cx: &Ctx,
    template: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
    planned: &mut [crate::api::PlannedMember],
    claim_classes: Vec<String>,
    out: &mut Vec<Denial>,
) {
    let s = cx.spec();
    let classes_of = &cx.o.storage_classes;
    let all_classes = classes::distinct(claim_classes.clone());
    let Some(target_class) = keep(out, classes::check_target_class(s, &all_classes)) else {
        return;
    };
    let target = keep(out, classes::check_storage_class(classes_of, &target_class));
    match s.type_ {
        MigrationType::StorageClassChange => {
            classes::mark_on_class(cx.o, planned, &target_class);
            let all_there = classes::check_not_all_on_class(planned, template, &target_class);
            keep(out, all_there);
            let sources = classes::migrating_classes(planned, &claim_classes);
            if let Some(target) = target {
                let mode = classes::check_binding_mode(classes_of, &sources, target, &target_class);
                keep(out, mode);
            }
            keep(out, classes::check_template_size(template));
        }
        MigrationType::Shrink => {
            keep(out, classes::check_shrink_size(s, planned, template));
        }
    }
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
