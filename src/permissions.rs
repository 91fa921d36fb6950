//! Every permission the operator uses, in one table ([`RULES`]), each with where it applies
//! ([`RuleScope`]).
//!
//! The chart (`charts/storage-migrator/templates/_rules.tpl`, used by `rbac.yaml`) must grant
//! exactly these rules, each in its scope: a unit test compares the two. Cluster-wide mode puts
//! the cluster and watched rules in one ClusterRole; with `watchNamespaces` the watched rules go
//! to a Role in each listed namespace. The Lease rules are always a Role in the release namespace. At start and then periodically, the operator asks
//! the API server (SelfSubjectAccessReview, which every authenticated user may create) whether
//! each verb is allowed, and reports the first one refused ([`refused`]), so a missing rule shows
//! up as not-ready with the rule named, before any request is touched.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::scope::WatchScope;

/// Where a rule must be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleScope {
    /// Cluster-scoped objects: a ClusterRole in every mode.
    Cluster,
    /// Objects in the namespaces of the requests: a ClusterRole when watching all namespaces,
    /// else a Role in each watched namespace.
    Watched,
    /// The leader-election Lease: a Role in the Lease's namespace.
    Lease,
}

/// One RBAC rule: verbs on one resource of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub scope: RuleScope,
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// Which part of the flow uses it.
    pub why: &'static str,
}

/// The rules the operator needs, and no others.
pub const RULES: &[Rule] = &[
    Rule {
        scope: RuleScope::Watched,
        group: "storagemigrator.io",
        resource: "storagemigrationrequests",
        verbs: &["get", "list", "watch", "patch"],
        why: "watch requests; the finalizer",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "storagemigrator.io",
        resource: "storagemigrationrequests/status",
        verbs: &["patch"],
        why: "status records every step",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "storagemigrator.io",
        resource: "storagemigrationrequests/finalizers",
        verbs: &["update"],
        why: "owned Jobs and pods carry blockOwnerDeletion",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "apps",
        resource: "statefulsets",
        verbs: &["get", "list", "watch", "create", "delete", "patch"],
        why: "protect, orphan-delete and recreate the target StatefulSet; watched as metadata: \
              a set read is kept until it changes",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "apps",
        resource: "deployments",
        verbs: &["get"],
        why: "read the target Deployment (its claims, replicas, rollout)",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "apps",
        resource: "deployments/scale",
        verbs: &["patch"],
        why: "scale the target Deployment to zero and back",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "apps",
        resource: "replicasets",
        verbs: &["get"],
        why: "find the Deployment of a claim target's pod",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "autoscaling",
        resource: "horizontalpodautoscalers",
        verbs: &["list"],
        why: "preflight: an autoscaler of the target Deployment",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "pods",
        verbs: &["list", "watch", "create", "delete"],
        why: "stop and recreate members; mounter pods; a change of a pod a plan names wakes its request",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "pods/log",
        verbs: &["get"],
        why: "live copy progress from the tail of a copy Job's log",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "list", "watch", "create", "delete", "patch"],
        why: "temporary claims and the swap; a change of a claim a plan names wakes its request",
    },
    Rule {
        scope: RuleScope::Cluster,
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch", "patch"],
        why: "Retain, claimRef re-pointing, migrated-by label (merge patches), never delete; \
              watched as metadata: a change of a volume a plan names wakes its request",
    },
    Rule {
        scope: RuleScope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["get"],
        why: "a member pod stuck terminating: is its node NotReady or gone (then force-delete)",
    },
    Rule {
        scope: RuleScope::Cluster,
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["list", "watch"],
        why: "preflight: the target class and its binding mode; watched as metadata: a list \
              read is kept until one changes",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        why: "preflight: the namespace's Pod Security level (its own Namespace, by name)",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "policy",
        resource: "poddisruptionbudgets",
        verbs: &["list", "watch"],
        why: "a member is not stopped while a PodDisruptionBudget that selects it allows none; \
              watched as metadata: a list read is kept until one changes",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "batch",
        resource: "jobs",
        verbs: &["list", "watch", "create", "delete"],
        why: "measure, pre-copy, copy and verify Jobs",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        why: "the stash ConfigMap of each request; ours watched as metadata (by our label): a \
              stash read is kept until it changes",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "secrets",
        verbs: &["get"],
        why: "etcd engine: TLS and auth Secrets named in a request (by name, never list)",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "discovery.k8s.io",
        resource: "endpointslices",
        verbs: &["list"],
        why: "RedisSentinel engine: the Sentinels at the ready endpoints of redisSentinel.sentinelService",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "",
        resource: "events",
        verbs: &["list"],
        why: "a Job that creates no pod: the API server's reason (its FailedCreate Events)",
    },
    Rule {
        scope: RuleScope::Watched,
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        why: "one Event per step (kube-runtime's Recorder: events.k8s.io/v1; patch when one repeats)",
    },
    Rule {
        scope: RuleScope::Lease,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "update"],
        why: "leader election (the holder replaces the Lease to renew it; candidates watch it)",
    },
];

#[derive(Debug, thiserror::Error)]
pub enum PermissionError {
    #[error(
        "permission refused: {verb} {resource} in API group {group:?}{scope} ({why}); grant it in the operator's {grant}"
    )]
    Refused {
        verb: &'static str,
        resource: &'static str,
        group: &'static str,
        scope: String,
        why: &'static str,
        grant: &'static str,
    },
    #[error("cannot check permission {verb} {resource} (POST selfsubjectaccessreviews): {source}")]
    Check {
        verb: &'static str,
        resource: &'static str,
        source: kube::Error,
    },
}

/// Where the operator checks its rules: the watched namespaces, and the Lease's namespace when
/// leader election is on.
#[derive(Debug, Clone)]
pub struct CheckScope {
    pub watch: WatchScope,
    pub lease_namespace: Option<String>,
}

impl CheckScope {
    /// The namespaces (`None`: cluster-wide) in which `rule` must be allowed.
    pub fn namespaces_of(&self, rule: &Rule) -> Vec<Option<&str>> {
        match rule.scope {
            RuleScope::Cluster => vec![None],
            RuleScope::Watched => self.watch.namespaces(),
            RuleScope::Lease => self
                .lease_namespace
                .as_deref()
                .map(Some)
                .into_iter()
                .collect(),
        }
    }
}

/// The first rule verb the API server refuses to this operator, in each namespace of its scope.
pub async fn refused(client: &Client, scope: &CheckScope) -> Result<(), PermissionError> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for rule in RULES {
        for namespace in scope.namespaces_of(rule) {
            for verb in rule.verbs {
                check(&api, rule, verb, namespace).await?;
            }
        }
    }
    Ok(())
}

/// One SelfSubjectAccessReview: is `verb` on `rule`'s resource allowed in `namespace`?
async fn check(
    api: &Api<SelfSubjectAccessReview>,
    rule: &Rule,
    verb: &'static str,
    namespace: Option<&str>,
) -> Result<(), PermissionError> {
    let (resource, subresource) = match rule.resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (rule.resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(rule.group.to_string()),
                resource: Some(resource.to_string()),
                subresource,
                verb: Some(verb.to_string()),
                namespace: namespace.map(String::from),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| PermissionError::Check {
            verb,
            resource: rule.resource,
            source,
        })?;
    if answer.status.is_some_and(|s| s.allowed) {
        return Ok(());
    }
    Err(PermissionError::Refused {
        verb,
        resource: rule.resource,
        group: rule.group,
        scope: namespace.map_or(" cluster-wide".into(), |ns| format!(" in namespace {ns}")),
        why: rule.why,
        grant: match (rule.scope, namespace) {
            (RuleScope::Cluster, _) | (_, None) => "ClusterRole",
            (_, Some(_)) => "Role in that namespace",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    type Triple = (String, String, String);

    /// (group, resource, verb) triples of the chart's rules named `define` in `_rules.tpl`.
    fn chart_rules(define: &str) -> BTreeSet<Triple> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/storage-migrator/templates/_rules.tpl"
        );
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let start = format!("{{{{- define \"storage-migrator.rules.{define}\" -}}}}");
        let body = text
            .split_once(&start)
            .and_then(|(_, rest)| rest.split_once("{{- end }}"))
            .map_or("", |(body, _)| body);
        let doc: serde_json::Value = serde_norway::from_str(body).unwrap_or_default();
        let list = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = BTreeSet::new();
        for rule in doc.as_array().cloned().unwrap_or_default() {
            for g in list(&rule["apiGroups"]) {
                for r in list(&rule["resources"]) {
                    for v in list(&rule["verbs"]) {
                        out.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
        out
    }

    fn code_rules(scope: RuleScope) -> BTreeSet<Triple> {
        RULES
            .iter()
            .filter(|r| r.scope == scope)
            .flat_map(|r| {
                r.verbs
                    .iter()
                    .map(|v| (r.group.to_string(), r.resource.to_string(), v.to_string()))
            })
            .collect()
    }

    #[test]
    fn the_chart_grants_exactly_the_rules_the_code_uses_in_each_scope() {
        for (define, scope) in [
            ("cluster", RuleScope::Cluster),
            ("watched", RuleScope::Watched),
            ("lease", RuleScope::Lease),
        ] {
            let code = code_rules(scope);
            let chart = chart_rules(define);
            assert!(!chart.is_empty(), "no {define} rules parsed from the chart");
            let missing: Vec<_> = code.difference(&chart).collect();
            let extra: Vec<_> = chart.difference(&code).collect();
            assert!(
                missing.is_empty(),
                "the chart's {define} rules lack {missing:?}"
            );
            assert!(
                extra.is_empty(),
                "the chart's {define} rules grant unused {extra:?}"
            );
        }
    }

    #[test]
    fn each_scope_is_checked_where_it_is_granted() {
        let rule = |scope| Rule {
            scope,
            group: "",
            resource: "pods",
            verbs: &["get"],
            why: "",
        };
        let two = CheckScope {
            watch: WatchScope::parse(&["a", "b"]).unwrap_or(WatchScope::All),
            lease_namespace: Some("ops".into()),
        };
        assert_eq!(two.namespaces_of(&rule(RuleScope::Cluster)), vec![None]);
        assert_eq!(
            two.namespaces_of(&rule(RuleScope::Watched)),
            vec![Some("a"), Some("b")]
        );
        assert_eq!(
            two.namespaces_of(&rule(RuleScope::Lease)),
            vec![Some("ops")]
        );
        let all = CheckScope {
            watch: WatchScope::All,
            lease_namespace: None,
        };
        assert_eq!(all.namespaces_of(&rule(RuleScope::Watched)), vec![None]);
        assert!(all.namespaces_of(&rule(RuleScope::Lease)).is_empty());
    }
}
