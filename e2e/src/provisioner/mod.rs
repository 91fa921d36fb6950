//! The local volume provisioner `local.e2e/ext4`.
//!
//! Every PersistentVolume is a sparse image file `state.volumes_dir()/<pv>.img` holding a real
//! ext4 filesystem of the requested size (no reserved blocks, so a full volume gives ENOSPC at the
//! size asked), loop-mounted at `state.node_dir(node)/volumes/<pv>`, with a `local` volume source
//! and node affinity to that node. It behaves like an external provisioner: it watches claims
//! whose class names [`PROVISIONER`] and that the PV controller annotated with
//! `volume.beta.kubernetes.io/storage-provisioner`, creates a PV pre-bound to the claim
//! (`claimRef` with the claim's uid) and lets the PV controller bind it; it deletes Released PVs
//! whose reclaim policy is `Delete` (unmount, detach, remove the image, delete the PV).
//!
//! Node choice, as the external-provisioner does: a claim annotated with
//! `volume.kubernetes.io/selected-node` is provisioned on that node, whatever the class's
//! binding mode (the scheduler sets it for WaitForFirstConsumer claims; anyone, e.g. a migrator
//! that wants the new volume next to a member's data, may set it on an Immediate claim). A node
//! that is not one of this cluster's nodes (or that the class's `allowedTopologies` exclude) is
//! refused with a `ProvisioningFailed` event naming it. Immediate claims without the annotation
//! go to the node with the fewest volumes.
//!
//! The pure parts (claim triage, node choice, object builders) are separate functions with unit
//! tests; host operations (`mkfs.ext4`, `mount`, `umount`, `losetup`) are
//! synchronous functions run on the blocking pool.

use std::path::{Path, PathBuf};

use crate::quantity::QuantityError;

mod claims;
mod controller;
mod host;
mod objects;
mod placement;
mod provision;
mod reclaim;

pub use claims::{ClaimDecision, ProvisionRequest, claim_class_name, decide_claim};
pub use controller::{ensure_storage_classes, run};
pub use host::{
    cleanup_volumes, create_image, destroy_volume, detach_loops, image_size, loop_devices,
    mount_image, mount_points, unmount_dir,
};
pub use objects::{build_pv, format_bytes, is_ours, pv_capacity, pv_name, storage_classes};
pub use placement::{allowed_nodes, choose_node, provision_node};
pub use reclaim::{VolumeDecision, decide_volume};

/// Claim annotation set by the PV controller (Kubernetes < 1.23) naming the provisioner.
pub const ANN_STORAGE_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Claim annotation set by the PV controller (Kubernetes >= 1.23) naming the provisioner.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Claim annotation set by the scheduler for WaitForFirstConsumer claims.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// PV annotation naming the provisioner that created it.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PV label naming the node whose loop mount backs it.
pub const LABEL_NODE: &str = "local.e2e/node";
/// Node label used in PV node affinity.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Deprecated claim annotation naming the class (still honoured by Kubernetes 1.20).
const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// Smallest image the provisioner creates; smaller requests are rounded up to it (ext4 needs
/// room for its metadata and journal).
pub const MIN_IMAGE_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} {args:?} failed ({status}): {stderr}")]
    Command {
        program: String,
        args: Vec<String>,
        status: String,
        stderr: String,
    },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("claim {claim} cannot be provisioned: {reason}")]
    Unprovisionable { claim: String, reason: String },
    #[error("persistent volume {pv}: {reason}")]
    Volume { pv: String, reason: String },
    #[error("volume {pv} is still in use: {reason}")]
    Busy { pv: String, reason: String },
    #[error("a blocking host task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ProvisionerError {
    let path = path.to_path_buf();
    move |source| ProvisionerError::Io {
        action,
        path,
        source,
    }
}

fn is_api_status(err: &kube::Error, check: impl Fn(&kube::core::Status) -> bool) -> bool {
    matches!(err, kube::Error::Api(status) if check(status))
}

/// Claims, classes and volumes for unit tests of the provisioner modules.
#[cfg(test)]
mod test_support {
    use super::*;

    use std::collections::BTreeMap;
    use std::path::Path;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, VolumeResourceRequirements,
    };
    use k8s_openapi::api::storage::v1::StorageClass;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::ResourceExt;

    use crate::provisioner::objects::{build_pv, storage_classes};
    use crate::state::PROVISIONER;

    pub(super) fn class(name: &str, mode: &str) -> StorageClass {
        storage_classes()
            .into_iter()
            .find(|c| c.name_any() == name)
            .map(|mut c| {
                c.volume_binding_mode = Some(mode.into());
                c
            })
            .unwrap()
    }

    pub(super) fn claim(size: &str, class: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data-etcd-0".into()),
                namespace: Some("ns1".into()),
                uid: Some("1234-abcd".into()),
                resource_version: Some("77".into()),
                annotations: Some(BTreeMap::from([(
                    ANN_STORAGE_PROVISIONER_BETA.to_string(),
                    PROVISIONER.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some(class.into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    pub(super) fn pv_on(name: &str, node: &str) -> PersistentVolume {
        let mut pv = build_pv(
            &claim("1Gi", "standard"),
            &class("standard", "Immediate"),
            node,
            Path::new("/x"),
            Quantity("1Gi".into()),
        )
        .unwrap();
        pv.metadata.name = Some(name.into());
        pv
    }
}
