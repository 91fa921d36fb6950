//! What the API server checks at admission, beyond the types: the values of single fields (the
//! patterns of `spec.timeout` and `spec.shrink.size`, enums, minimums: field attributes of the
//! derived schema in `super`), and the rules across fields of `spec` ([`spec_rules`]): the type's
//! block is given and the other type's is not; `volumeClaimTemplate` and `volumeClaimTemplates`
//! are not both set.
//!
//! The rules across fields are CEL (`x-kubernetes-validations`, GA since Kubernetes 1.29; the
//! operator supports 1.30 and newer), each with a message and the field it is about
//! (`fieldPath`, `reason`), so the API server's refusal names that field and says the rule
//! (`spec.shrink: Required value: type Shrink requires spec.shrink`). [`crd`] adds them to `spec`
//! after derivation; they are not on `status.acceptedSpec` (the operator writes it, and copies
//! only accepted specs). Preflight checks the same rules again (`InvalidSpec`), for requests
//! stored before the CRD had them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrBool, ValidationRule,
};
use kube::CustomResourceExt;

use super::StorageMigrationRequest;

/// `spec.timeout`: hours, minutes and seconds in that order, each part a whole number with its
/// unit, each optional but at least one given, and not all zero (`30m`, `1h30m`, `90s`, `1h0m`).
/// At most [`TIMEOUT_MAX_LENGTH`] characters. The operator's parser (`plan::timeout_seconds`)
/// accepts exactly these strings (a unit test compares the two on every short string and a table
/// of long ones).
pub const TIMEOUT_PATTERN: &str = "^([0-9]*[1-9][0-9]*h([0-9]+m)?([0-9]+s)?|([0-9]+h)?[0-9]*[1-9][0-9]*m([0-9]+s)?|([0-9]+h)?([0-9]+m)?[0-9]*[1-9][0-9]*s)$";

/// The longest `spec.timeout` admitted (`maxLength`).
pub const TIMEOUT_MAX_LENGTH: usize = 32;

/// `spec.shrink.size` written as a string: a positive Kubernetes quantity (an optional `+`, a
/// decimal number that is not zero, an optional suffix: `Ki` to `Ei`, `n`, `u`, `m`, `k` to `E`, or
/// an exponent `e3`/`E-2`). The field is int-or-string (a Quantity), and the API server applies a
/// `pattern` only to strings; an integer is held to `minimum: 1` instead. A quantity out of the
/// operator's range (an exponent beyond ±18, more than 18 decimals, beyond 2^127) passes the
/// pattern and is denied at preflight (`InvalidSpec`).
pub const SIZE_PATTERN: &str = r"^\+?([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$";

/// The CRD (`storage-migrator crd`, `crds/`): the derived one, with the rules across fields added
/// to `spec` ([`spec_rules`]) and the input checks taken off `status.acceptedSpec`.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = StorageMigrationRequest::crd();
    for version in &mut crd.spec.versions {
        let spec = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|props| props.get_mut("spec"));
        if let Some(spec) = spec {
            spec.x_kubernetes_validations = Some(spec_rules());
        }
        let accepted = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|props| props.get_mut("status"))
            .and_then(|status| status.properties.as_mut())
            .and_then(|props| props.get_mut("acceptedSpec"));
        if let Some(accepted) = accepted {
            drop_input_checks(accepted);
        }
    }
    crd
}

/// Removes the admission checks of user input (`pattern`, `minimum`, `maxLength`, `minLength`)
/// from `status.acceptedSpec`: the operator writes it, as a copy of a spec admitted earlier, maybe
/// under an older CRD with looser rules, and a status write refused for it would stop a request
/// in the middle of its migration.
fn drop_input_checks(schema: &mut JSONSchemaProps) {
    schema.pattern = None;
    schema.minimum = None;
    schema.max_length = None;
    schema.min_length = None;
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        drop_input_checks(child);
    }
    // The values of a map (`shrink.sizes`).
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = schema.additional_properties.as_mut() {
        drop_input_checks(values);
    }
}

/// How a broken rule is reported: the `reason` of its field error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// `<field>: Required value: <message>`.
    Required,
    /// `<field>: Forbidden: <message>`.
    Forbidden,
}

/// One rule across fields of `spec`: `rule` (CEL, `self` is `spec`) holds, else the API server
/// refuses the request with `message`, reported on `field` (relative to `spec`, e.g.
/// `.shrink`) for `reason`.
fn rule(rule: &str, message: &str, field: &str, reason: Reason) -> ValidationRule {
    let reason = match reason {
        Reason::Required => "FieldValueRequired",
        Reason::Forbidden => "FieldValueForbidden",
    };
    ValidationRule {
        rule: rule.to_string(),
        message: Some(message.to_string()),
        field_path: Some(field.to_string()),
        reason: Some(reason.to_string()),
        ..Default::default()
    }
}

/// The rules across fields of `spec` (CEL, `x-kubernetes-validations`): `spec` holds the block
/// of its type and not the other type's block; `volumeClaimTemplate` and
/// `volumeClaimTemplates` are not both set (an empty list counts as unset, as in preflight). A
/// field set to `null` counts as absent (CEL's `has`), as it does for the operator. Each is
/// reported on the field it is about, so a refusal names it: `spec.shrink: Required value: type
/// Shrink requires spec.shrink`, `spec.storageClassChange: Forbidden: type Shrink does not take
/// spec.storageClassChange`.
pub fn spec_rules() -> Vec<ValidationRule> {
    let requires = |type_: &str, block: &str| {
        rule(
            &format!("self.type != '{type_}' || has(self.{block})"),
            &format!("type {type_} requires spec.{block}"),
            &format!(".{block}"),
            Reason::Required,
        )
    };
    let refuses = |type_: &str, block: &str| {
        rule(
            &format!("self.type != '{type_}' || !has(self.{block})"),
            &format!("type {type_} does not take spec.{block}"),
            &format!(".{block}"),
            Reason::Forbidden,
        )
    };
    vec![
        requires("StorageClassChange", "storageClassChange"),
        requires("Shrink", "shrink"),
        refuses("StorageClassChange", "shrink"),
        refuses("Shrink", "storageClassChange"),
        rule(
            "!has(self.volumeClaimTemplate) || !has(self.volumeClaimTemplates) \
             || size(self.volumeClaimTemplates) == 0",
            "spec.volumeClaimTemplate and spec.volumeClaimTemplates are exclusive: name one \
             template, or list several",
            ".volumeClaimTemplates",
            Reason::Forbidden,
        ),
        only_for_engines(
            "maxLagBytes",
            &["Patroni", "RedisSentinel"],
            "engines that measure lag in bytes (Patroni, RedisSentinel)",
        ),
        only_for_engines("patroni", &["Patroni"], "engine Patroni"),
        only_for_engines("redisSentinel", &["RedisSentinel"], "engine RedisSentinel"),
        only_for_engines("zookeeper", &["ZooKeeper"], "engine ZooKeeper"),
        rule(
            "!has(self.database) || !has(self.database.zookeeper) || \
             !has(self.database.zookeeper.authSecretName) || \
             (has(self.database.zookeeper.handover) && \
             self.database.zookeeper.handover == 'Reconfig')",
            "spec.database.zookeeper.authSecretName is only for handover: Reconfig",
            ".database.zookeeper.authSecretName",
            Reason::Forbidden,
        ),
    ]
}

/// `spec.database.<field>` is refused unless the engine is one of `engines`.
fn only_for_engines(field: &str, engines: &[&str], what: &str) -> ValidationRule {
    let allowed = engines
        .iter()
        .map(|e| format!("self.database.engine == '{e}'"))
        .collect::<Vec<_>>()
        .join(" || ");
    rule(
        &format!(
            "!has(self.database) || !has(self.database.{field}) || \
             (has(self.database.engine) && ({allowed}))"
        ),
        &format!("spec.database.{field} is only for {what}"),
        &format!(".database.{field}"),
        Reason::Forbidden,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn schema() -> Value {
        let crd = serde_json::to_value(crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    /// Every property of ours has its own description for `kubectl explain` (the descriptions of
    /// Kubernetes' own types inside, such as `conditions[]` and `resources`, are theirs).
    fn undescribed(path: &str, node: &Value, out: &mut Vec<String>) {
        let generic = [
            "Auto-generated",
            "Time is a wrapper",
            "Quantity is a fixed-point",
        ];
        match node.get("description").and_then(Value::as_str) {
            None => out.push(path.to_string()),
            Some(d) if generic.iter().any(|g| d.contains(g)) => out.push(format!("{path}: {d}")),
            Some(_) => {}
        }
        if path.ends_with(".conditions") || path.ends_with(".resources") {
            return;
        }
        let children = node
            .get("properties")
            .or_else(|| node.get("items").and_then(|i| i.get("properties")));
        for (name, child) in children.and_then(Value::as_object).into_iter().flatten() {
            undescribed(&format!("{path}.{name}"), child, out);
        }
    }

    #[test]
    fn every_field_has_a_real_description() {
        let mut missing = Vec::new();
        undescribed("", &schema(), &mut missing);
        assert!(
            missing.is_empty(),
            "fields without a real description: {missing:#?}"
        );
    }

    #[test]
    fn the_kind_belongs_to_its_category() {
        let crd = crd();
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["storage-migrator".to_string()])
        );
    }

    #[test]
    fn enum_like_fields_list_their_values() {
        let s = schema();
        let spec = &s["properties"]["spec"]["properties"];
        let status = &s["properties"]["status"]["properties"];
        for (field, values) in [
            (&spec["type"], vec!["StorageClassChange", "Shrink"]),
            (
                &spec["target"]["properties"]["kind"],
                vec!["StatefulSet", "PersistentVolumeClaim", "Deployment"],
            ),
            (&spec["oldPVReclaimPolicy"], vec!["Retain", "Delete"]),
            (&spec["apply"], vec!["IfReady", "Always"]),
            (
                &spec["database"]["properties"]["engine"],
                vec!["Generic", "Etcd", "Patroni", "RedisSentinel", "ZooKeeper"],
            ),
            (
                &status["phase"],
                vec!["Pending", "Progressing", "Successful", "Failed", "Denied"],
            ),
            (
                &status["stage"],
                vec![
                    "Preflight",
                    "OrphaningStatefulSet",
                    "Migrating",
                    "RecreatingStatefulSet",
                    "Finalizing",
                    "RollingBack",
                    "Done",
                ],
            ),
            (
                &status["members"]["items"]["properties"]["step"],
                vec![
                    "Pending",
                    "CreatingClaim",
                    "PreCopying",
                    "GatingStop",
                    "StoppingPod",
                    "Copying",
                    "RetainingVolumes",
                    "DeletingOldClaim",
                    "DeletingTempClaim",
                    "ReleasingNewVolume",
                    "RecreatingClaim",
                    "RecreatingPod",
                    "Done",
                    "RolledBack",
                    "AlreadyThere",
                    "NotTargeted",
                ],
            ),
            (
                &status["plan"]["properties"]["members"]["items"]["properties"]["role"],
                vec!["leader", "follower"],
            ),
        ] {
            assert_eq!(field["enum"], serde_json::json!(values), "{field}");
        }
    }

    #[test]
    fn spec_carries_the_input_checks_and_accepted_spec_does_not() {
        let s = schema();
        let spec = &s["properties"]["spec"];
        assert_eq!(spec["properties"]["timeout"]["pattern"], TIMEOUT_PATTERN);
        assert_eq!(
            spec["properties"]["timeout"]["maxLength"],
            TIMEOUT_MAX_LENGTH
        );
        let size = &spec["properties"]["shrink"]["properties"]["size"];
        assert_eq!(size["pattern"], SIZE_PATTERN);
        let sizes = &spec["properties"]["shrink"]["properties"]["sizes"]["additionalProperties"];
        assert_eq!(sizes["pattern"], SIZE_PATTERN);
        assert_eq!(sizes["x-kubernetes-int-or-string"], true);
        assert_eq!(size["minimum"], 1.0);
        assert_eq!(size["x-kubernetes-int-or-string"], true);
        assert_eq!(
            spec["x-kubernetes-validations"],
            serde_json::to_value(spec_rules()).unwrap()
        );
        fn keys(node: &Value, out: &mut Vec<String>) {
            for (k, v) in node.as_object().into_iter().flatten() {
                out.push(k.clone());
                keys(v, out);
            }
        }
        let mut accepted = Vec::new();
        keys(
            &s["properties"]["status"]["properties"]["acceptedSpec"],
            &mut accepted,
        );
        for check in [
            "pattern",
            "minimum",
            "minLength",
            "maxLength",
            "allOf",
            "x-kubernetes-validations",
        ] {
            assert!(
                !accepted.iter().any(|k| k == check),
                "acceptedSpec has {check}"
            );
        }
    }

    /// The rules across fields are CEL, each reported on the field it is about (which `spec`
    /// has) with a message naming that field; no structural `allOf`/`anyOf`/`oneOf`/`not`
    /// stands in for them any more.
    #[test]
    fn rules_across_fields_are_cel_naming_their_field() {
        let s = schema();
        let spec = &s["properties"]["spec"];
        let rules = spec["x-kubernetes-validations"].clone();
        let required = "FieldValueRequired";
        let forbidden = "FieldValueForbidden";
        assert_eq!(
            rules,
            serde_json::json!([
                {
                    "rule": "self.type != 'StorageClassChange' || has(self.storageClassChange)",
                    "message": "type StorageClassChange requires spec.storageClassChange",
                    "fieldPath": ".storageClassChange",
                    "reason": required,
                },
                {
                    "rule": "self.type != 'Shrink' || has(self.shrink)",
                    "message": "type Shrink requires spec.shrink",
                    "fieldPath": ".shrink",
                    "reason": required,
                },
                {
                    "rule": "self.type != 'StorageClassChange' || !has(self.shrink)",
                    "message": "type StorageClassChange does not take spec.shrink",
                    "fieldPath": ".shrink",
                    "reason": forbidden,
                },
                {
                    "rule": "self.type != 'Shrink' || !has(self.storageClassChange)",
                    "message": "type Shrink does not take spec.storageClassChange",
                    "fieldPath": ".storageClassChange",
                    "reason": forbidden,
                },
                {
                    "rule": "!has(self.volumeClaimTemplate) || !has(self.volumeClaimTemplates) \
                             || size(self.volumeClaimTemplates) == 0",
                    "message": "spec.volumeClaimTemplate and spec.volumeClaimTemplates are \
                                exclusive: name one template, or list several",
                    "fieldPath": ".volumeClaimTemplates",
                    "reason": forbidden,
                },
                {
                    "rule": "!has(self.database) || !has(self.database.maxLagBytes) || \
                             (has(self.database.engine) && (self.database.engine == 'Patroni' \
                             || self.database.engine == 'RedisSentinel'))",
                    "message": "spec.database.maxLagBytes is only for engines that measure lag \
                                in bytes (Patroni, RedisSentinel)",
                    "fieldPath": ".database.maxLagBytes",
                    "reason": forbidden,
                },
                {
                    "rule": "!has(self.database) || !has(self.database.patroni) || \
                             (has(self.database.engine) && (self.database.engine == 'Patroni'))",
                    "message": "spec.database.patroni is only for engine Patroni",
                    "fieldPath": ".database.patroni",
                    "reason": forbidden,
                },
                {
                    "rule": "!has(self.database) || !has(self.database.redisSentinel) || \
                             (has(self.database.engine) && \
                             (self.database.engine == 'RedisSentinel'))",
                    "message": "spec.database.redisSentinel is only for engine RedisSentinel",
                    "fieldPath": ".database.redisSentinel",
                    "reason": forbidden,
                },
                {
                    "rule": "!has(self.database) || !has(self.database.zookeeper) || \
                             (has(self.database.engine) && \
                             (self.database.engine == 'ZooKeeper'))",
                    "message": "spec.database.zookeeper is only for engine ZooKeeper",
                    "fieldPath": ".database.zookeeper",
                    "reason": forbidden,
                },
                {
                    "rule": "!has(self.database) || !has(self.database.zookeeper) || \
                             !has(self.database.zookeeper.authSecretName) || \
                             (has(self.database.zookeeper.handover) && \
                             self.database.zookeeper.handover == 'Reconfig')",
                    "message": "spec.database.zookeeper.authSecretName is only for handover: \
                                Reconfig",
                    "fieldPath": ".database.zookeeper.authSecretName",
                    "reason": forbidden,
                },
            ])
        );
        let required_props = spec["required"].as_array().unwrap();
        assert!(
            required_props.contains(&serde_json::json!("type")),
            "the rules read self.type without has()"
        );
        for r in rules.as_array().unwrap() {
            let field = r["fieldPath"].as_str().unwrap();
            let mut node = spec;
            for name in field.strip_prefix('.').unwrap().split('.') {
                node = &node["properties"][name];
                assert!(node.is_object(), "spec has {field}");
            }
            let message = r["message"].as_str().unwrap();
            assert!(message.contains(&format!("spec{field}")), "{message}");
            assert!(!message.contains('\n'), "one line: {message}");
        }
        for combinator in ["allOf", "anyOf", "oneOf", "not"] {
            assert!(spec.get(combinator).is_none(), "spec has {combinator}");
        }
    }

    /// The checked-in CRD is what [`crd`] prints (`.ci/check-crd.sh` compares the same in CI).
    #[test]
    fn checked_in_crd_is_current() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crds/storagemigrationrequests.yaml"
        ))
        .unwrap();
        let file: Value = serde_norway::from_str(&text).unwrap();
        assert!(
            file == serde_json::to_value(crd()).unwrap(),
            "crds/ is stale: CRDGEN_BIN=target/debug/storage-migrator bash .ci/check-crd.sh --fix"
        );
    }
}
