//! What the API server checks at admission, beyond the types: the patterns of `spec.timeout` and
//! `spec.shrink.size`, and the rule that the type's block is given (and the other type's is not).
//!
//! Kubernetes 1.20 has no CEL; a structural schema may still carry value validations: `pattern`,
//! `enum`, `minimum`, `minLength`, and `oneOf`/`not` whose branches hold only value validations
//! (no `type`, no `description`). The patterns are used by the derived schema (field attributes in
//! `super`); the `oneOf` is added by [`crd`] after derivation, because kube's schema rewriter
//! hoists the properties of `oneOf` branches into the parent (made for tagged enums) and would
//! turn `{properties: {type: {enum: [Shrink]}}}` into a conflicting definition of `type`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON, JSONSchemaProps, JSONSchemaPropsOrBool,
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

/// The CRD (`storage-migrator crd`, `crds/`): the derived one, with the per-type rule added to
/// `spec` (see [`type_block_rule`]) and the input checks taken off `status.acceptedSpec`.
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
            spec.all_of = Some(type_block_rule());
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

/// `spec` must hold the block of its type and not the other type's block: for each type, "the
/// block is there, or the type is another" and "the other block is absent, or the type is
/// another". Value validations only, as structural schemas require. Written as `allOf` of
/// `anyOf`s with the block's own check first because the 1.20 API server then names the field in
/// its refusal (`spec.shrink: Required value`, `"spec.storageClassChange" must not validate the
/// schema (not)`); a `oneOf` over the types reports the checks of the wrong branch instead. (Not
/// on `status.acceptedSpec`: the operator writes it, and copies only accepted specs.)
pub fn type_block_rule() -> Vec<JSONSchemaProps> {
    let props = |name: &str, schema: JSONSchemaProps| JSONSchemaProps {
        properties: Some([(name.to_string(), schema)].into()),
        ..Default::default()
    };
    let type_is_not = |type_: &str| JSONSchemaProps {
        not: Some(Box::new(props(
            "type",
            JSONSchemaProps {
                enum_: Some(vec![JSON(serde_json::Value::String(type_.to_string()))]),
                ..Default::default()
            },
        ))),
        ..Default::default()
    };
    let either = |first: JSONSchemaProps, type_: &str| JSONSchemaProps {
        any_of: Some(vec![first, type_is_not(type_)]),
        ..Default::default()
    };
    let required = |block: &str| JSONSchemaProps {
        required: Some(vec![block.to_string()]),
        ..Default::default()
    };
    // `not: {}` refuses any value: the property must be absent.
    let absent = |block: &str| {
        props(
            block,
            JSONSchemaProps {
                not: Some(Box::default()),
                ..Default::default()
            },
        )
    };
    vec![
        either(required("storageClassChange"), "StorageClassChange"),
        either(required("shrink"), "Shrink"),
        either(absent("shrink"), "StorageClassChange"),
        either(absent("storageClassChange"), "Shrink"),
    ]
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
                vec!["Generic", "Etcd"],
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
        let rule = serde_json::to_value(type_block_rule()).unwrap();
        assert_eq!(spec["allOf"], rule);
        assert_eq!(
            rule[1],
            serde_json::json!({"anyOf": [
                {"required": ["shrink"]},
                {"not": {"properties": {"type": {"enum": ["Shrink"]}}}},
            ]})
        );
        assert_eq!(
            rule[3]["anyOf"][0],
            serde_json::json!({"properties": {"storageClassChange": {"not": {}}}})
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
        for check in ["pattern", "minimum", "minLength", "maxLength", "allOf"] {
            assert!(
                !accepted.iter().any(|k| k == check),
                "acceptedSpec has {check}"
            );
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
