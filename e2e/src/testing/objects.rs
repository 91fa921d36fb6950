//! Manifests and checks used by scenarios: claims, fixtures, a StatefulSet template's class,
//! a volume's node affinity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::DynamicObject;

/// A claim of `size` on `class`.
pub fn claim_manifest(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.to_string()),
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

/// Path of a file in `e2e/fixtures/`.
pub fn fixture_path(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(file)
}

/// In a StatefulSet, replaces the class `from` of its claim templates by `to`.
pub fn set_template_class(obj: &mut DynamicObject, from: &str, to: &str) {
    let is_sts = obj.types.as_ref().is_some_and(|t| t.kind == "StatefulSet");
    if !is_sts || from == to {
        return;
    }
    let templates = obj
        .data
        .get_mut("spec")
        .and_then(|s| s.get_mut("volumeClaimTemplates"))
        .and_then(|t| t.as_array_mut());
    for t in templates.into_iter().flatten() {
        if let Some(class) = t
            .get_mut("spec")
            .and_then(|s| s.get_mut("storageClassName"))
            && class.as_str() == Some(from)
        {
            *class = serde_json::Value::String(to.to_string());
        }
    }
}

/// Whether `node` satisfies a PV's required node affinity (terms ORed, requirements ANDed;
/// operators In, NotIn, Exists, DoesNotExist on labels and on the field `metadata.name`).
pub fn node_satisfies(affinity: &VolumeNodeAffinity, node: &Node) -> bool {
    let Some(required) = affinity.required.as_ref() else {
        return true;
    };
    let labels = node.labels();
    let name = node.name_any();
    let matches = |req: &NodeSelectorRequirement, value: Option<&str>| {
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
            "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    };
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs
                .iter()
                .all(|r| matches(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .iter()
                .all(|r| matches(r, (r.key == "metadata.name").then_some(name.as_str())))
    })
}

/// `claim → (volume, class, requested size)` of the claims `data-<set>-0 .. data-<set>-(n-1)`;
/// panics unless each exists and is Bound.
/// The storage a claim (or a claim template) requests, as written (`""` when none).
pub fn requested_size(spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec) -> String {
    (spec.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

pub async fn assert_claims_bound(
    ns: &super::TestNamespace,
    set: &str,
    n: usize,
) -> BTreeMap<String, (String, String, String)> {
    let api: kube::Api<PersistentVolumeClaim> = ns.api();
    let mut out = BTreeMap::new();
    for i in 0..n {
        let name = format!("data-{set}-{i}");
        let c = api.get(&name).await.unwrap();
        assert_eq!(
            c.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Bound"),
            "claim {name}"
        );
        let spec = c.spec.unwrap_or_default();
        let size = requested_size(&spec);
        let volume = spec.volume_name.unwrap_or_default();
        let class = spec.storage_class_name.unwrap_or_default();
        out.insert(name, (volume, class, size));
    }
    out
}

/// A one-member StatefulSet `name` (label `app: name`) running `script` as root in `image`,
/// with a `data` claim template of `size` on `class` mounted at `/data`; grace period 5 s.
pub fn one_member_set(
    name: &str,
    image: &str,
    class: &str,
    size: &str,
    script: &str,
) -> k8s_openapi::api::apps::v1::StatefulSet {
    let set = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                    "containers": [{
                        "name": "app",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "storageClassName": class,
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": size}},
                },
            }],
        },
    });
    match serde_json::from_value(set) {
        Ok(s) => s,
        Err(e) => panic!("the one-member StatefulSet does not decode: {e}"),
    }
}

/// A one-replica Deployment `name` (label `app: name`) running `script` as root in `image`,
/// with claim `claim` mounted at `/data`; grace period 5 s.
pub fn one_claim_deployment(
    name: &str,
    claim: &str,
    image: &str,
    script: &str,
) -> k8s_openapi::api::apps::v1::Deployment {
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                    "containers": [{
                        "name": "app",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
                },
            },
        },
    });
    match serde_json::from_value(deployment) {
        Ok(d) => d,
        Err(e) => panic!("the one-claim Deployment does not decode: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{
        Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::api::DynamicObject;
    use serde::Deserialize;

    #[test]
    fn node_affinity_matching() {
        let node = |name: &str| Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/hostname".to_string(),
                    name.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let aff = |key: &str, op: &str, vals: &[&str], field: bool| {
            let req = NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(vals.iter().map(|v| v.to_string()).collect()),
            };
            let term = if field {
                NodeSelectorTerm {
                    match_fields: Some(vec![req]),
                    ..Default::default()
                }
            } else {
                NodeSelectorTerm {
                    match_expressions: Some(vec![req]),
                    ..Default::default()
                }
            };
            VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![term],
                }),
            }
        };
        let by_host = aff("kubernetes.io/hostname", "In", &["node-b"], false);
        assert!(node_satisfies(&by_host, &node("node-b")));
        assert!(!node_satisfies(&by_host, &node("node-a")));
        let by_name = aff("metadata.name", "In", &["node-c"], true);
        assert!(node_satisfies(&by_name, &node("node-c")));
        assert!(!node_satisfies(&by_name, &node("node-b")));
        let not_in = aff("kubernetes.io/hostname", "NotIn", &["node-a"], false);
        assert!(node_satisfies(&not_in, &node("node-b")));
        assert!(!node_satisfies(&not_in, &node("node-a")));
    }

    #[test]
    fn claims_ask_for_size_on_class() {
        let c = claim_manifest("a", "fast", "32Mi");
        let spec = c.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            Quantity("32Mi".into())
        );
    }

    #[test]
    fn etcd_fixture_parses_and_is_namespace_free() {
        let yaml = std::fs::read_to_string(fixture_path("etcd.yaml")).unwrap();
        let mut docs: Vec<DynamicObject> = serde_norway::Deserializer::from_str(&yaml)
            .map(|d| {
                serde_norway::from_value(serde_norway::Value::deserialize(d).unwrap()).unwrap()
            })
            .collect();
        assert_eq!(docs.len(), 2);
        for d in &docs {
            assert!(
                d.metadata.namespace.is_none(),
                "fixture must not pin a namespace"
            );
        }
        let sts: StatefulSet =
            serde_json::from_value(serde_json::to_value(&docs[1]).unwrap()).unwrap();
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(spec.service_name.as_deref(), Some("etcd"));
        let vct = &spec.volume_claim_templates.unwrap()[0];
        assert_eq!(vct.metadata.name.as_deref(), Some("data"));
        let vspec = vct.spec.as_ref().unwrap();
        assert_eq!(vspec.storage_class_name.as_deref(), Some("standard"));
        let c = &spec.template.spec.unwrap().containers[0];
        let args = c.args.clone().unwrap_or_default().join(" ");
        assert!(args.contains("--name=$(POD_NAME)"), "{args}");
        assert!(args.contains("etcd-2=http://etcd-2.etcd.$(NAMESPACE).svc.cluster.local:2380"));
        assert!(
            !args.contains("default.svc"),
            "namespace must not be hard-coded"
        );

        set_template_class(&mut docs[1], "standard", "gp3");
        assert_eq!(
            docs[1].data["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
            "gp3"
        );
    }
}
