//! Claim triage (pure): which claims are ours, and whether to provision, wait or refuse.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use crate::provisioner::{
    ANN_BETA_STORAGE_CLASS, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
    ANN_STORAGE_PROVISIONER_BETA,
};
use crate::quantity;
use crate::state::PROVISIONER;

/// What to do with a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimDecision {
    /// Not ours, or nothing to do (bound, being deleted, not yet annotated).
    Ignore,
    /// WaitForFirstConsumer claim without a selected node yet.
    WaitForConsumer,
    /// Provision it; `node` is the claim's selected node (always set for WaitForFirstConsumer
    /// claims), `None` when the provisioner picks it.
    Provision(ProvisionRequest),
    /// Ours, but it cannot be provisioned (reported as a ProvisioningFailed event).
    Refuse(String),
}

/// A claim the provisioner should satisfy.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvisionRequest {
    /// The claim's `volume.kubernetes.io/selected-node`, if any.
    pub node: Option<String>,
    /// The requested storage as written in the claim.
    pub quantity: Quantity,
    pub bytes: u64,
}

/// Name of the class a claim asks for (`spec.storageClassName`, or the beta annotation).
pub fn claim_class_name(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .or_else(|| claim.annotations().get(ANN_BETA_STORAGE_CLASS).cloned())
        .filter(|name| !name.is_empty())
}

/// Whether the PV controller handed the claim to us.
fn annotated_for_us(claim: &PersistentVolumeClaim) -> bool {
    let anns = claim.annotations();
    [ANN_STORAGE_PROVISIONER_BETA, ANN_STORAGE_PROVISIONER]
        .iter()
        .any(|key| anns.get(*key).map(String::as_str) == Some(PROVISIONER))
}

fn is_wait_for_first_consumer(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}

/// Decides what to do with `claim`, given the class it names (if that class exists).
pub fn decide_claim(claim: &PersistentVolumeClaim, class: Option<&StorageClass>) -> ClaimDecision {
    let Some(class) = class else {
        return ClaimDecision::Ignore;
    };
    if class.provisioner != PROVISIONER || !annotated_for_us(claim) {
        return ClaimDecision::Ignore;
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return ClaimDecision::Ignore;
    }
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase.is_some_and(|p| p != "Pending") {
        return ClaimDecision::Ignore;
    }
    let Some(spec) = claim.spec.as_ref() else {
        return ClaimDecision::Refuse("claim has no spec".into());
    };
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return ClaimDecision::Ignore;
    }
    if spec.volume_mode.as_deref() == Some("Block") {
        return ClaimDecision::Refuse(format!(
            "volumeMode Block is not supported by {PROVISIONER} (only Filesystem)"
        ));
    }
    if spec.selector.is_some() {
        return ClaimDecision::Refuse("claim Selector is not supported".into());
    }
    if spec.data_source.is_some() || spec.data_source_ref.is_some() {
        return ClaimDecision::Refuse(format!(
            "data sources (clones, snapshots) are not supported by {PROVISIONER}"
        ));
    }
    let Some(quantity) = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    else {
        return ClaimDecision::Refuse("claim has no spec.resources.requests.storage".into());
    };
    let bytes = match quantity::parse_bytes(&quantity.0) {
        Ok(0) => return ClaimDecision::Refuse("requested storage is zero".into()),
        Ok(b) => b,
        Err(e) => return ClaimDecision::Refuse(e.to_string()),
    };
    // The selected node counts for Immediate claims too (as in the external-provisioner).
    let node = claim
        .annotations()
        .get(ANN_SELECTED_NODE)
        .filter(|node| !node.is_empty())
        .cloned();
    if node.is_none() && is_wait_for_first_consumer(class) {
        return ClaimDecision::WaitForConsumer;
    }
    ClaimDecision::Provision(ProvisionRequest {
        node,
        quantity: quantity.clone(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::ResourceExt;

    use crate::provisioner::test_support::{claim, class};
    use crate::provisioner::{ANN_BETA_STORAGE_CLASS, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER};
    use crate::state::PROVISIONER;

    #[test]
    fn immediate_claim_is_provisioned_anywhere() {
        let c = claim("32Mi", "standard");
        let d = decide_claim(&c, Some(&class("standard", "Immediate")));
        assert_eq!(
            d,
            ClaimDecision::Provision(ProvisionRequest {
                node: None,
                quantity: Quantity("32Mi".into()),
                bytes: 32 << 20,
            })
        );
    }

    #[test]
    fn immediate_claim_honours_the_selected_node() {
        let standard = class("standard", "Immediate");
        let mut c = claim("256Mi", "standard");
        c.annotations_mut()
            .insert(ANN_SELECTED_NODE.into(), "node-c".into());
        assert_eq!(
            decide_claim(&c, Some(&standard)),
            ClaimDecision::Provision(ProvisionRequest {
                node: Some("node-c".into()),
                quantity: Quantity("256Mi".into()),
                bytes: 256 << 20,
            })
        );
        // An empty annotation selects nothing.
        c.annotations_mut()
            .insert(ANN_SELECTED_NODE.into(), "".into());
        match decide_claim(&c, Some(&standard)) {
            ClaimDecision::Provision(r) => assert_eq!(r.node, None),
            other => panic!("{other:?}"),
        }
        // A selected node that is not ours still reaches the node choice (which refuses it).
        c.annotations_mut()
            .insert(ANN_SELECTED_NODE.into(), "node-x".into());
        match decide_claim(&c, Some(&standard)) {
            ClaimDecision::Provision(r) => assert_eq!(r.node.as_deref(), Some("node-x")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn wffc_claim_waits_for_selected_node() {
        let mut c = claim("1Gi", "fast");
        let fast = class("fast", "WaitForFirstConsumer");
        assert_eq!(
            decide_claim(&c, Some(&fast)),
            ClaimDecision::WaitForConsumer
        );
        c.annotations_mut()
            .insert(ANN_SELECTED_NODE.into(), "node-b".into());
        match decide_claim(&c, Some(&fast)) {
            ClaimDecision::Provision(r) => assert_eq!(r.node.as_deref(), Some("node-b")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn foreign_or_done_claims_are_ignored() {
        let std_class = class("standard", "Immediate");
        // Class of another provisioner.
        let mut other = std_class.clone();
        other.provisioner = "ebs.csi.aws.com".into();
        assert_eq!(
            decide_claim(&claim("1Gi", "standard"), Some(&other)),
            ClaimDecision::Ignore
        );
        // Unknown class.
        assert_eq!(
            decide_claim(&claim("1Gi", "standard"), None),
            ClaimDecision::Ignore
        );
        // Not (yet) annotated by the PV controller.
        let mut c = claim("1Gi", "standard");
        c.metadata.annotations = None;
        assert_eq!(decide_claim(&c, Some(&std_class)), ClaimDecision::Ignore);
        // The newer annotation is honoured too.
        c.annotations_mut()
            .insert(ANN_STORAGE_PROVISIONER.into(), PROVISIONER.into());
        assert!(matches!(
            decide_claim(&c, Some(&std_class)),
            ClaimDecision::Provision(_)
        ));
        // Bound already.
        let mut c = claim("1Gi", "standard");
        c.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        assert_eq!(decide_claim(&c, Some(&std_class)), ClaimDecision::Ignore);
        let mut c = claim("1Gi", "standard");
        c.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(decide_claim(&c, Some(&std_class)), ClaimDecision::Ignore);
    }

    #[test]
    fn block_and_bad_claims_are_refused() {
        let std_class = class("standard", "Immediate");
        let mut c = claim("1Gi", "standard");
        c.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        assert!(
            matches!(decide_claim(&c, Some(&std_class)), ClaimDecision::Refuse(r) if r.contains("Block"))
        );
        let c = claim("lots", "standard");
        assert!(matches!(
            decide_claim(&c, Some(&std_class)),
            ClaimDecision::Refuse(_)
        ));
        let mut c = claim("1Gi", "standard");
        c.spec.as_mut().unwrap().resources = None;
        assert!(matches!(
            decide_claim(&c, Some(&std_class)),
            ClaimDecision::Refuse(_)
        ));
    }

    #[test]
    fn class_name_falls_back_to_beta_annotation() {
        let mut c = claim("1Gi", "standard");
        c.spec.as_mut().unwrap().storage_class_name = None;
        assert_eq!(claim_class_name(&c), None);
        c.annotations_mut()
            .insert(ANN_BETA_STORAGE_CLASS.into(), "fast".into());
        assert_eq!(claim_class_name(&c).as_deref(), Some("fast"));
    }
}
