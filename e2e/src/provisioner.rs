//! The local volume provisioner `local.e2e/ext4`. (Stub: interface only.)

use crate::state::ClusterState;

#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    #[error("provisioner not implemented yet")]
    NotImplemented,
}

/// Creates the StorageClasses `standard` (Immediate) and `fast` (WaitForFirstConsumer).
pub async fn ensure_storage_classes(_client: &kube::Client) -> Result<(), ProvisionerError> {
    Err(ProvisionerError::NotImplemented)
}

/// Provisions and deletes volumes until the future is dropped.
pub async fn run(_client: kube::Client, _state: ClusterState) -> Result<(), ProvisionerError> {
    Err(ProvisionerError::NotImplemented)
}

/// Unmounts every volume of this cluster and detaches its loop devices (images are kept on
/// disk under the state dir until the dir is removed). Safe to call when nothing is left.
pub fn cleanup_volumes(_state: &ClusterState) -> Result<(), ProvisionerError> {
    Err(ProvisionerError::NotImplemented)
}
