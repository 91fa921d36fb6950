//! The objects the provisioner writes (pure): PersistentVolumes and the StorageClasses.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, LocalVolumeSource, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::provisioner::claims::ProvisionRequest;
use crate::provisioner::host::image_size;
use crate::provisioner::{ANN_PROVISIONED_BY, LABEL_HOSTNAME, LABEL_NODE, ProvisionerError};
use crate::state::{CSI_DRIVER, PROVISIONER};

/// Name of the PV provisioned for a claim.
pub fn pv_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// Whether this provisioner created the PV.
pub fn is_ours(pv: &PersistentVolume) -> bool {
    pv.annotations().get(ANN_PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER)
}

/// Capacity written into the PV: the claim's quantity when the image has exactly that size,
/// else the image size (requests below [`MIN_IMAGE_BYTES`] or not block-aligned).
pub fn pv_capacity(request: &ProvisionRequest) -> Quantity {
    let size = image_size(request.bytes);
    if size == request.bytes {
        request.quantity.clone()
    } else {
        Quantity(format_bytes(size))
    }
}

/// A byte count as a quantity in the largest binary unit that divides it (`4Mi`, `12Ki`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    UNITS
        .iter()
        .find(|(_, shift)| bytes != 0 && bytes.is_multiple_of(1u64 << shift))
        .map(|(unit, shift)| format!("{}{unit}", bytes >> shift))
        .unwrap_or_else(|| bytes.to_string())
}

/// Builds the PV for `claim` on `node`, mounted at `path`.
pub fn build_pv(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    path: &Path,
    capacity: Quantity,
) -> Result<PersistentVolume, ProvisionerError> {
    let claim_id = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    let uid = claim
        .uid()
        .ok_or_else(|| ProvisionerError::Unprovisionable {
            claim: claim_id.clone(),
            reason: "claim has no uid".into(),
        })?;
    let vac = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.clone());
    let access_modes = claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["ReadWriteOnce".to_string()]);
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name(&uid)),
            annotations: Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_string(),
                PROVISIONER.to_string(),
            )])),
            labels: Some(BTreeMap::from([(LABEL_NODE.to_string(), node.to_string())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_string(), capacity)])),
            access_modes: Some(access_modes),
            volume_mode: Some("Filesystem".into()),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".to_string()),
            ),
            storage_class_name: Some(class.name_any()),
            // As an external provisioner does: the volume is made with the claim's
            // VolumeAttributesClass, and a claim binds only a volume of its own. Kubernetes
            // allows one only on a CSI volume: such a volume is published as one of the
            // driver `CSI_DRIVER` (its handle is the same host path), every other as `local`.
            volume_attributes_class_name: vac.clone(),
            csi: vac.is_some().then(|| CSIPersistentVolumeSource {
                driver: CSI_DRIVER.to_string(),
                volume_handle: path.to_string_lossy().into_owned(),
                fs_type: Some("ext4".into()),
                ..Default::default()
            }),
            mount_options: class.mount_options.clone(),
            local: vac.is_none().then(|| LocalVolumeSource {
                path: path.to_string_lossy().into_owned(),
                fs_type: Some("ext4".into()),
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: LABEL_HOSTNAME.into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.namespace(),
                name: Some(claim.name_any()),
                uid: Some(uid),
                resource_version: claim.resource_version(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// The CSIDriver object of [`CSI_DRIVER`]: its volumes need no attach (so the attach/detach
/// controller makes no VolumeAttachment for them) and the agent mounts them itself.
pub fn csi_driver() -> CSIDriver {
    CSIDriver {
        metadata: ObjectMeta {
            name: Some(CSI_DRIVER.to_string()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(false),
            volume_lifecycle_modes: Some(vec!["Persistent".into()]),
            ..Default::default()
        },
    }
}

/// The two StorageClasses every local cluster offers.
pub fn storage_classes() -> Vec<StorageClass> {
    let class = |name: &str, mode: &str, expansion: Option<bool>| StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        provisioner: PROVISIONER.to_string(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some(mode.to_string()),
        allow_volume_expansion: expansion,
        ..Default::default()
    };
    vec![
        class("standard", "Immediate", Some(false)),
        class("fast", "WaitForFirstConsumer", None),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::Path;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::ResourceExt;

    use crate::provisioner::claims::{ClaimDecision, ProvisionRequest, decide_claim};
    use crate::provisioner::test_support::{claim, class};
    use crate::provisioner::{ANN_PROVISIONED_BY, LABEL_HOSTNAME, LABEL_NODE};
    use crate::quantity;
    use crate::state::{CSI_DRIVER, PROVISIONER};

    #[test]
    fn builds_pv_bound_to_claim() {
        let c = claim("32Mi", "standard");
        let request = match decide_claim(&c, Some(&class("standard", "Immediate"))) {
            ClaimDecision::Provision(r) => r,
            other => panic!("{other:?}"),
        };
        let mut sc = class("standard", "Immediate");
        sc.reclaim_policy = Some("Retain".into());
        let pv = build_pv(
            &c,
            &sc,
            "node-b",
            Path::new("/s/nodes/node-b/volumes/pvc-1234-abcd"),
            pv_capacity(&request),
        )
        .unwrap();
        assert_eq!(pv.name_any(), "pvc-1234-abcd");
        assert_eq!(pv.annotations()[ANN_PROVISIONED_BY], PROVISIONER);
        assert_eq!(pv.labels()[LABEL_NODE], "node-b");
        let spec = pv.spec.unwrap();
        assert_eq!(spec.capacity.unwrap()["storage"], Quantity("32Mi".into()));
        assert_eq!(
            spec.access_modes.unwrap(),
            vec!["ReadWriteOnce".to_string()]
        );
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
        assert_eq!(spec.volume_attributes_class_name, None);
        assert_eq!(
            spec.local.unwrap().path,
            "/s/nodes/node-b/volumes/pvc-1234-abcd"
        );
        let term = &spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms[0];
        let req = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(req.key, LABEL_HOSTNAME);
        assert_eq!(req.operator, "In");
        assert_eq!(req.values.as_deref(), Some(&["node-b".to_string()][..]));
        let cref = spec.claim_ref.unwrap();
        assert_eq!(cref.namespace.as_deref(), Some("ns1"));
        assert_eq!(cref.name.as_deref(), Some("data-etcd-0"));
        assert_eq!(cref.uid.as_deref(), Some("1234-abcd"));
    }

    #[test]
    fn small_requests_report_the_real_capacity() {
        let request = ProvisionRequest {
            node: None,
            quantity: Quantity("1Ki".into()),
            bytes: 1024,
        };
        assert_eq!(pv_capacity(&request), Quantity("4Mi".into()));
        assert_eq!(format_bytes(3 << 30), "3Gi");
        assert_eq!(format_bytes((4 << 20) + 4096), "4100Ki");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        for b in [1u64 << 40, 5 << 20, 12 << 10, 7] {
            assert_eq!(quantity::parse_bytes(&format_bytes(b)).unwrap(), b);
        }
    }

    /// A claim of a VolumeAttributesClass gets a CSI volume of the local driver carrying the
    /// class (Kubernetes allows the class only on CSI volumes); its handle is the host path.
    #[test]
    fn a_claim_of_a_volume_attributes_class_gets_a_csi_volume() {
        let mut c = claim("32Mi", "standard");
        if let Some(spec) = c.spec.as_mut() {
            spec.volume_attributes_class_name = Some("gold".into());
        }
        let sc = class("standard", "Immediate");
        let path = Path::new("/s/nodes/node-b/volumes/pvc-1234-abcd");
        let pv = build_pv(&c, &sc, "node-b", path, Quantity("32Mi".into())).unwrap();
        let spec = pv.spec.unwrap();
        assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));
        assert!(spec.local.is_none());
        let csi = spec.csi.unwrap();
        assert_eq!(csi.driver, CSI_DRIVER);
        assert_eq!(csi.volume_handle, "/s/nodes/node-b/volumes/pvc-1234-abcd");
        assert_eq!(csi_driver().spec.attach_required, Some(false));
    }

    #[test]
    fn storage_classes_match_the_contract() {
        let classes = storage_classes();
        let standard = &classes[0];
        assert_eq!(standard.name_any(), "standard");
        assert_eq!(standard.volume_binding_mode.as_deref(), Some("Immediate"));
        assert_eq!(standard.allow_volume_expansion, Some(false));
        assert!(
            standard.annotations().is_empty(),
            "standard must not be the default class"
        );
        let fast = &classes[1];
        assert_eq!(fast.name_any(), "fast");
        assert_eq!(
            fast.volume_binding_mode.as_deref(),
            Some("WaitForFirstConsumer")
        );
        for c in &classes {
            assert_eq!(c.provisioner, PROVISIONER);
            assert_eq!(c.reclaim_policy.as_deref(), Some("Delete"));
        }
    }
}
