//! Local Kubernetes cluster harness and end-to-end scenario helpers for storage-migrator.
//!
//! - [`state`]: the state directory and the cluster's identity (ports, names, ranges).
//! - [`controlplane`]: etcd + kube-apiserver + controller-manager + scheduler (`up`/`down`).
//! - [`agent`]: the node agent (kubelet) for the cluster's three nodes.
//! - [`images`]: the image store (`localcluster image load`, OCI archives) the agent runs from.
//! - [`provisioner`]: the `local.e2e/ext4` volume provisioner.
//! - [`pki`]: the cluster's certificates and keys.
//! - [`mountinfo`]: the `/proc/<pid>/mountinfo` parser.
//! - [`quantity`]: Kubernetes resource quantities (`1Gi`, `500m`).
//! - [`testing`]: helpers for e2e scenarios against any cluster (namespaces, waits, mover pods, etcd).

pub mod agent;
pub mod controlplane;
pub mod copy_speed;
pub mod images;
pub mod many_files;
pub mod mountinfo;
pub mod pki;
pub mod provisioner;
pub mod quantity;
pub mod state;
pub mod testing;
