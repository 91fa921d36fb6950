//! Every permission the operator uses, in one table ([`RULES`]).
//!
//! The chart's ClusterRole (`charts/storage-migrator/templates/rbac.yaml`) must grant exactly
//! these rules: a unit test compares the two. At start and then periodically, the operator asks
//! the API server (SelfSubjectAccessReview, which every authenticated user may create) whether
//! each verb is allowed, and reports the first one refused ([`refused`]), so a missing rule shows
//! up as not-ready with the rule named, before any request is touched.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

/// One RBAC rule: verbs on one resource of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// Which part of the flow uses it.
    pub why: &'static str,
}

/// The rules the operator needs, and no others.
pub const RULES: &[Rule] = &[
    Rule {
        group: "storagemigrator.io",
        resource: "storagemigrationrequests",
        verbs: &["get", "list", "watch", "update", "patch"],
        why: "watch requests; the finalizer",
    },
    Rule {
        group: "storagemigrator.io",
        resource: "storagemigrationrequests/status",
        verbs: &["get", "update", "patch"],
        why: "status records every step",
    },
    Rule {
        group: "storagemigrator.io",
        resource: "storagemigrationrequests/finalizers",
        verbs: &["update"],
        why: "owned Jobs and pods carry blockOwnerDeletion",
    },
    Rule {
        group: "apps",
        resource: "statefulsets",
        verbs: &["get", "list", "watch", "create", "delete", "patch"],
        why: "protect, orphan-delete and recreate the target StatefulSet",
    },
    Rule {
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch", "create", "delete"],
        why: "stop and recreate members; mounter pods",
    },
    Rule {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "list", "watch", "create", "delete", "patch"],
        why: "temporary claims and the swap",
    },
    Rule {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch", "patch", "update"],
        why: "Retain, claimRef re-pointing, migrated-by label; never delete",
    },
    Rule {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["get", "list", "watch"],
        why: "preflight: the target class and its binding mode",
    },
    Rule {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        why: "preflight: the namespace's Pod Security level (label, by name, never list)",
    },
    Rule {
        group: "batch",
        resource: "jobs",
        verbs: &["get", "list", "watch", "create", "delete"],
        why: "measure, pre-copy, copy and verify Jobs",
    },
    Rule {
        group: "",
        resource: "configmaps",
        verbs: &["get", "create", "patch", "delete"],
        why: "the stash ConfigMap of each request",
    },
    Rule {
        group: "",
        resource: "secrets",
        verbs: &["get"],
        why: "etcd engine: TLS and auth Secrets named in a request (by name, never list)",
    },
    Rule {
        group: "",
        resource: "events",
        verbs: &["create", "patch"],
        why: "one Event per step (core v1)",
    },
    Rule {
        group: "",
        resource: "events",
        verbs: &["list"],
        why: "a Job that creates no pod: the API server's reason (its FailedCreate Events)",
    },
    Rule {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        why: "one Event per step (events.k8s.io/v1)",
    },
    Rule {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        why: "leader election (server-side apply of the Lease)",
    },
];

#[derive(Debug, thiserror::Error)]
pub enum PermissionError {
    #[error(
        "permission refused: {verb} {resource} in API group {group:?}{scope} ({why}); grant it in the operator's ClusterRole"
    )]
    Refused {
        verb: &'static str,
        resource: &'static str,
        group: &'static str,
        scope: String,
        why: &'static str,
    },
    #[error("cannot check permission {verb} {resource} (POST selfsubjectaccessreviews): {source}")]
    Check {
        verb: &'static str,
        resource: &'static str,
        source: kube::Error,
    },
}

/// The first rule verb the API server refuses to this operator (`namespace`: the watched one;
/// cluster-wide otherwise).
pub async fn refused(client: &Client, namespace: Option<&str>) -> Result<(), PermissionError> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for rule in RULES {
        let (resource, subresource) = match rule.resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (rule.resource, None),
        };
        for verb in rule.verbs {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(rule.group.to_string()),
                        resource: Some(resource.to_string()),
                        subresource: subresource.clone(),
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
            if !answer.status.is_some_and(|s| s.allowed) {
                return Err(PermissionError::Refused {
                    verb,
                    resource: rule.resource,
                    group: rule.group,
                    scope: namespace.map_or(String::new(), |ns| format!(" in namespace {ns}")),
                    why: rule.why,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// (group, resource, verb) triples of the chart's ClusterRole.
    fn chart_rules() -> BTreeSet<(String, String, String)> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/storage-migrator/templates/rbac.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap_or_default();
        // The ClusterRole is the first document; drop template lines, keep `rules:`.
        let role = text.split("\n---").next().unwrap_or_default();
        let yaml: String = role
            .lines()
            .filter(|l| !l.contains("{{"))
            .collect::<Vec<_>>()
            .join("\n");
        let doc: serde_json::Value = serde_norway::from_str(&yaml).unwrap_or_default();
        let mut out = BTreeSet::new();
        let list = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        for rule in doc["rules"].as_array().cloned().unwrap_or_default() {
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

    #[test]
    fn the_chart_grants_exactly_the_rules_the_code_uses() {
        let code: BTreeSet<(String, String, String)> = RULES
            .iter()
            .flat_map(|r| {
                r.verbs
                    .iter()
                    .map(|v| (r.group.to_string(), r.resource.to_string(), v.to_string()))
            })
            .collect();
        let chart = chart_rules();
        assert!(!chart.is_empty(), "no rules parsed from the chart");
        let missing: Vec<_> = code.difference(&chart).collect();
        let extra: Vec<_> = chart.difference(&code).collect();
        assert!(missing.is_empty(), "the chart lacks {missing:?}");
        assert!(extra.is_empty(), "the chart grants unused {extra:?}");
    }
}
