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
//! The pure parts (quantity parsing, claim triage, node choice, object builders) are separate
//! functions with unit tests; host operations (`mkfs.ext4`, `mount`, `umount`, `losetup`) are
//! synchronous functions run on the blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio::sync::Mutex;
use tracing::{debug, info, warn};

use crate::mountinfo;
use crate::quantity::{self, QuantityError};
use crate::state::{ClusterState, NODE_NAMES, PROVISIONER};

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

/// Size of the image file for a request of `bytes`: at least [`MIN_IMAGE_BYTES`], rounded up to
/// whole 4 KiB blocks.
pub fn image_size(bytes: u64) -> u64 {
    bytes
        .max(MIN_IMAGE_BYTES)
        .div_ceil(4096)
        .saturating_mul(4096)
}

// ---------------------------------------------------------------------------------------------
// Claim triage (pure)
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Node choice and object builders (pure)
// ---------------------------------------------------------------------------------------------

/// Nodes of `candidates` that the class's `allowedTopologies` (on `kubernetes.io/hostname`)
/// admit; a class without hostname restrictions admits them all.
pub fn allowed_nodes(class: &StorageClass, candidates: &[&str]) -> Vec<String> {
    let terms = class.allowed_topologies.as_deref().unwrap_or_default();
    let admitted = |node: &str| {
        if terms.is_empty() {
            return true;
        }
        // Terms are ORed; the expressions of one term are ANDed.
        terms.iter().any(|term| {
            term.match_label_expressions
                .as_deref()
                .unwrap_or_default()
                .iter()
                .filter(|req| req.key == LABEL_HOSTNAME)
                .all(|req| req.values.iter().any(|v| v == node))
        })
    };
    candidates
        .iter()
        .filter(|n| admitted(n))
        .map(|n| (*n).to_string())
        .collect()
}

/// The node with the fewest volumes of ours among `candidates`; ties go to the earliest
/// candidate (the order of [`NODE_NAMES`]).
pub fn choose_node(candidates: &[String], volumes: &[PersistentVolume]) -> Option<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for pv in volumes.iter().filter(|pv| is_ours(pv)) {
        if let Some(node) = pv.labels().get(LABEL_NODE) {
            *counts.entry(node.as_str()).or_default() += 1;
        }
    }
    candidates
        .iter()
        .enumerate()
        .min_by_key(|(i, n)| (counts.get(n.as_str()).copied().unwrap_or(0), *i))
        .map(|(_, n)| n.clone())
}

/// The node to provision a claim's volume on: its selected node (`selected`), which must be one
/// of `candidates` (this cluster's nodes the class admits), else the candidate with the fewest
/// volumes ([`choose_node`]). `Err` holds the reason for a `ProvisioningFailed` event; it names
/// the node.
pub fn provision_node(
    selected: Option<&str>,
    candidates: &[String],
    volumes: &[PersistentVolume],
    class: &str,
) -> Result<String, String> {
    match selected {
        Some(node) if candidates.iter().any(|c| c == node) => Ok(node.to_string()),
        Some(node) if NODE_NAMES.contains(&node) => Err(format!(
            "selected node {node:?} is not allowed by the allowedTopologies of StorageClass \"{class}\""
        )),
        Some(node) => Err(format!(
            "selected node {node:?} is not a node of this cluster (nodes: {})",
            NODE_NAMES.join(", ")
        )),
        None => choose_node(candidates, volumes)
            .ok_or_else(|| format!("StorageClass \"{class}\" admits no node of this cluster")),
    }
}

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
            mount_options: class.mount_options.clone(),
            local: Some(LocalVolumeSource {
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

// ---------------------------------------------------------------------------------------------
// Host operations (synchronous; run them on the blocking pool)
// ---------------------------------------------------------------------------------------------

fn run_cmd(program: &str, args: &[&str]) -> Result<(), ProvisionerError> {
    debug!(program, ?args, "running");
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| ProvisionerError::Spawn {
            program: program.to_string(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ProvisionerError::Command {
            program: program.to_string(),
            args: args.iter().map(|a| (*a).to_string()).collect(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Mount points of this process's mount namespace.
pub fn mount_points() -> Result<Vec<PathBuf>, ProvisionerError> {
    mountinfo::self_mount_points().map_err(io_err("read", Path::new(mountinfo::SELF)))
}

fn is_mount_point(dir: &Path) -> Result<bool, ProvisionerError> {
    Ok(mount_points()?.iter().any(|m| m == dir))
}

/// Loop devices and their backing files (`/sys/block/loopN/loop/backing_file`; a ` (deleted)`
/// suffix is removed).
pub fn loop_devices() -> Result<Vec<(PathBuf, PathBuf)>, ProvisionerError> {
    let sys = Path::new("/sys/block");
    let entries = std::fs::read_dir(sys).map_err(io_err("list", sys))?;
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue; // not attached
        };
        let backing = backing.trim_end_matches('\n');
        let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
        out.push((PathBuf::from("/dev").join(&name), PathBuf::from(backing)));
    }
    Ok(out)
}

/// Creates a formatted image of `size` bytes at `image` unless it exists. The image is built
/// under a temporary name and renamed, so an existing `image` is always a complete filesystem.
pub fn create_image(image: &Path, size: u64) -> Result<(), ProvisionerError> {
    if image.exists() {
        return Ok(());
    }
    if let Some(parent) = image.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    let mut part_name = image.as_os_str().to_owned();
    part_name.push(".part");
    let part = PathBuf::from(part_name);
    let file = std::fs::File::create(&part).map_err(io_err("create", &part))?;
    file.set_len(size).map_err(io_err("resize", &part))?;
    drop(file);
    let part_str = part.to_string_lossy().into_owned();
    // -m 0: no reserved blocks, so ENOSPC comes at the size asked for. Lazy init keeps the
    // image sparse (it is mounted with noinit_itable, see `mount_image`).
    run_cmd(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
            &part_str,
        ],
    )?;
    std::fs::rename(&part, image).map_err(io_err("rename", &part))?;
    info!(image = %image.display(), size, "created ext4 image");
    Ok(())
}

/// Loop-mounts `image` at `dir` (created if missing) unless something is mounted there already.
/// `mount -o loop` sets the loop device's autoclear flag: unmounting detaches it.
pub fn mount_image(image: &Path, dir: &Path) -> Result<(), ProvisionerError> {
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    if is_mount_point(dir)? {
        return Ok(());
    }
    let image_str = image.to_string_lossy().into_owned();
    let dir_str = dir.to_string_lossy().into_owned();
    run_cmd(
        "mount",
        &[
            "-t",
            "ext4",
            "-o",
            "loop,noinit_itable",
            &image_str,
            &dir_str,
        ],
    )?;
    info!(image = %image.display(), dir = %dir.display(), "mounted volume");
    Ok(())
}

/// Unmounts everything mounted at `dir` (stacked mounts too) and removes the empty directory.
pub fn unmount_dir(dir: &Path) -> Result<(), ProvisionerError> {
    let dir_str = dir.to_string_lossy().into_owned();
    while is_mount_point(dir)? {
        run_cmd("umount", &[&dir_str])?;
        info!(dir = %dir.display(), "unmounted volume");
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ProvisionerError::Io {
            action: "remove",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

/// Detaches every loop device whose backing file satisfies `pred`.
pub fn detach_loops(pred: impl Fn(&Path) -> bool) -> Result<(), ProvisionerError> {
    for (dev, backing) in loop_devices()? {
        if pred(&backing) {
            let dev_str = dev.to_string_lossy().into_owned();
            match run_cmd("losetup", &["-d", &dev_str]) {
                Ok(()) => {
                    info!(dev = %dev.display(), backing = %backing.display(), "detached loop device")
                }
                // Raced with autoclear: the device is gone already.
                Err(e) if !Path::new(&format!("/sys/block/{}/loop", dev_name(&dev))).exists() => {
                    debug!(error = %e, "loop device already detached");
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn dev_name(dev: &Path) -> String {
    dev.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Frees one volume: unmount at `dir`, detach its loop devices, remove `image`.
pub fn destroy_volume(image: &Path, dir: &Path) -> Result<(), ProvisionerError> {
    unmount_dir(dir)?;
    detach_loops(|backing| backing == image)?;
    match std::fs::remove_file(image) {
        Ok(()) => {
            info!(image = %image.display(), "removed image");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ProvisionerError::Io {
            action: "remove",
            path: image.to_path_buf(),
            source: e,
        }),
    }
}

fn image_path(state: &ClusterState, pv: &str) -> PathBuf {
    state.volumes_dir().join(format!("{pv}.img"))
}

fn mount_dir(state: &ClusterState, node: &str, pv: &str) -> PathBuf {
    state.node_dir(node).join("volumes").join(pv)
}

/// The node where the image of `pv` is mounted already, if any (a restart between mounting and
/// creating the PV must not mount it a second time elsewhere).
fn mounted_node(state: &ClusterState, pv: &str) -> Result<Option<String>, ProvisionerError> {
    let mounts = mount_points()?;
    Ok(NODE_NAMES
        .iter()
        .find(|node| mounts.contains(&mount_dir(state, node, pv)))
        .map(|n| (*n).to_string()))
}

/// Unmounts every mount under `state.dir/nodes/*/volumes/` and detaches every loop device
/// backed by a file under `state.volumes_dir()`; the images stay. Safe when nothing is left.
pub fn cleanup_volumes(state: &ClusterState) -> Result<(), ProvisionerError> {
    let nodes_dir = state.dir.join("nodes");
    // Deepest first, so stacked or nested mounts come off cleanly.
    let mut ours: Vec<PathBuf> = mount_points()?
        .into_iter()
        .filter(|m| {
            m.strip_prefix(&nodes_dir).is_ok_and(|rest| {
                let mut parts = rest.components();
                parts.next().is_some()
                    && parts.next().is_some_and(|c| c.as_os_str() == "volumes")
                    && parts.next().is_some()
            })
        })
        .collect();
    ours.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    ours.dedup();
    let mut first_error = None;
    for m in ours {
        let m_str = m.to_string_lossy().into_owned();
        if let Err(e) = run_cmd("umount", &[&m_str]) {
            // Maybe unmounted already as part of a stack; only report what is still there.
            if is_mount_point(&m)? {
                warn!(mount = %m.display(), error = %e, "cannot unmount volume");
                first_error.get_or_insert(e);
            }
        } else {
            info!(mount = %m.display(), "unmounted volume");
        }
    }
    let volumes_dir = state.volumes_dir();
    if let Err(e) = detach_loops(|backing| backing.starts_with(&volumes_dir)) {
        first_error.get_or_insert(e);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Controllers
// ---------------------------------------------------------------------------------------------

struct Ctx {
    client: kube::Client,
    state: ClusterState,
    recorder: Recorder,
    /// Serialises host changes and node choice (two claims must not both see the same counts).
    host: Mutex<()>,
}

/// Creates the StorageClasses `standard` (Immediate) and `fast` (WaitForFirstConsumer); existing
/// classes are left as they are.
pub async fn ensure_storage_classes(client: &kube::Client) -> Result<(), ProvisionerError> {
    let api: Api<StorageClass> = Api::all(client.clone());
    for class in storage_classes() {
        let name = class.name_any();
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => info!(class = %name, "created StorageClass"),
            Err(e) if is_api_status(&e, |s| s.is_already_exists()) => {
                debug!(class = %name, "StorageClass exists");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Provisions and deletes volumes until the future is dropped. First re-mounts the images of
/// existing PVs of ours whose mounts are missing (an agent restart keeps its volumes).
pub async fn run(client: kube::Client, state: ClusterState) -> Result<(), ProvisionerError> {
    let reporter = Reporter {
        controller: PROVISIONER.to_string(),
        instance: Some(format!("local-e2e-ext4-{}", state.id)),
    };
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        state,
        host: Mutex::new(()),
    });
    remount_existing(&ctx).await?;

    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .run(reconcile_claim, claim_error_policy, ctx.clone())
    .for_each(|res| async move {
        match res {
            Ok((obj, _)) => debug!(claim = %obj, "claim reconciled"),
            Err(e) => debug!(error = %e, "claim reconcile failed"),
        }
    });
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default().labels(LABEL_NODE),
    )
    .run(reconcile_volume, volume_error_policy, ctx)
    .for_each(|res| async move {
        match res {
            Ok((obj, _)) => debug!(pv = %obj, "volume reconciled"),
            Err(e) => debug!(error = %e, "volume reconcile failed"),
        }
    });
    info!("volume provisioner {PROVISIONER} running");
    futures::future::join(claims, volumes).await;
    Ok(())
}

/// Mounts the image of every PV of ours whose mount is missing (skips PVs being deleted).
async fn remount_existing(ctx: &Ctx) -> Result<(), ProvisionerError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let pvs = api.list(&ListParams::default().labels(LABEL_NODE)).await?;
    for pv in pvs.items.iter().filter(|pv| is_ours(pv)) {
        if let Err(e) = ensure_mounted(ctx, pv).await {
            warn!(pv = %pv.name_any(), error = %e, "cannot re-mount volume");
        }
    }
    Ok(())
}

/// Node of one of our PVs, if it is one of this cluster's nodes.
fn pv_node(pv: &PersistentVolume) -> Option<&str> {
    let node = pv.labels().get(LABEL_NODE)?;
    NODE_NAMES.iter().copied().find(|n| n == node)
}

async fn ensure_mounted(ctx: &Ctx, pv: &PersistentVolume) -> Result<(), ProvisionerError> {
    let name = pv.name_any();
    let Some(node) = pv_node(pv) else {
        return Err(ProvisionerError::Volume {
            pv: name,
            reason: format!("label {LABEL_NODE} does not name a node of this cluster"),
        });
    };
    let image = image_path(&ctx.state, &name);
    let dir = mount_dir(&ctx.state, node, &name);
    let _guard = ctx.host.lock().await;
    tokio::task::spawn_blocking(move || {
        if !image.exists() {
            warn!(image = %image.display(), "image of volume is missing; not mounting");
            return Ok(());
        }
        mount_image(&image, &dir)
    })
    .await?
}

async fn publish(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Provision".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &claim.object_ref(&())).await {
        warn!(claim = %claim.name_any(), reason, error = %e, "cannot publish event");
    }
}

async fn reconcile_claim(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Ctx>,
) -> Result<Action, ProvisionerError> {
    let Some(class_name) = claim_class_name(&claim) else {
        return Ok(Action::await_change());
    };
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let class = classes.get_opt(&class_name).await?;
    let claim_id = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    match decide_claim(&claim, class.as_ref()) {
        ClaimDecision::Ignore => Ok(Action::await_change()),
        ClaimDecision::WaitForConsumer => {
            debug!(claim = %claim_id, "waiting for a consumer to be scheduled");
            Ok(Action::await_change())
        }
        ClaimDecision::Refuse(reason) => {
            warn!(claim = %claim_id, %reason, "refusing claim");
            publish(
                &ctx,
                &claim,
                EventType::Warning,
                "ProvisioningFailed",
                reason,
            )
            .await;
            Ok(Action::await_change())
        }
        ClaimDecision::Provision(request) => {
            let Some(class) = class else {
                return Ok(Action::await_change());
            };
            provision(&ctx, &claim, &class, request).await?;
            Ok(Action::await_change())
        }
    }
}

async fn provision(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    request: ProvisionRequest,
) -> Result<(), ProvisionerError> {
    let claim_id = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    let Some(uid) = claim.uid() else {
        return Ok(());
    };
    let name = pv_name(&uid);
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if pvs.get_opt(&name).await?.is_some() {
        debug!(claim = %claim_id, pv = %name, "volume exists already");
        return Ok(());
    }
    let _guard = ctx.host.lock().await;
    let candidates = allowed_nodes(class, &NODE_NAMES);
    let node = match mounted_node(&ctx.state, &name)? {
        // A previous attempt for this claim got as far as mounting: finish it there.
        Some(mounted) => mounted,
        None => {
            let existing = match request.node {
                Some(_) => Vec::new(),
                None => {
                    pvs.list(&ListParams::default().labels(LABEL_NODE))
                        .await?
                        .items
                }
            };
            match provision_node(
                request.node.as_deref(),
                &candidates,
                &existing,
                &class.name_any(),
            ) {
                Ok(node) => node,
                Err(reason) => {
                    // Nothing a retry could change (the nodes are fixed): wait for the claim
                    // to change, e.g. a new selected node.
                    warn!(claim = %claim_id, %reason, "cannot provision claim");
                    publish(ctx, claim, EventType::Warning, "ProvisioningFailed", reason).await;
                    return Ok(());
                }
            }
        }
    };
    publish(
        ctx,
        claim,
        EventType::Normal,
        "Provisioning",
        format!("External provisioner is provisioning volume for claim \"{claim_id}\""),
    )
    .await;
    let image = image_path(&ctx.state, &name);
    let dir = mount_dir(&ctx.state, &node, &name);
    let size = image_size(request.bytes);
    let host_result = {
        let (image, dir) = (image.clone(), dir.clone());
        tokio::task::spawn_blocking(move || {
            create_image(&image, size)?;
            mount_image(&image, &dir)
        })
        .await?
    };
    if let Err(e) = host_result {
        publish(
            ctx,
            claim,
            EventType::Warning,
            "ProvisioningFailed",
            format!(
                "failed to provision volume with StorageClass \"{}\": {e}",
                class.name_any()
            ),
        )
        .await;
        return Err(e);
    }
    let pv = build_pv(claim, class, &node, &dir, pv_capacity(&request))?;
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {}
        Err(e) if is_api_status(&e, |s| s.is_already_exists()) => {}
        Err(e) => {
            publish(
                ctx,
                claim,
                EventType::Warning,
                "ProvisioningFailed",
                format!("failed to create PersistentVolume {name}: {e}"),
            )
            .await;
            return Err(e.into());
        }
    }
    info!(claim = %claim_id, pv = %name, %node, bytes = size, "provisioned volume");
    publish(
        ctx,
        claim,
        EventType::Normal,
        "ProvisioningSucceeded",
        format!("Successfully provisioned volume {name}"),
    )
    .await;
    Ok(())
}

fn claim_error_policy(
    claim: Arc<PersistentVolumeClaim>,
    err: &ProvisionerError,
    _ctx: Arc<Ctx>,
) -> Action {
    warn!(claim = %claim.name_any(), error = %err, "provisioning failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// What to do with one of our PVs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeDecision {
    Ignore,
    /// Released with reclaim policy Delete: free it.
    Delete,
    /// In use or retained: make sure its mount exists.
    KeepMounted,
}

pub fn decide_volume(pv: &PersistentVolume) -> VolumeDecision {
    if !is_ours(pv) || pv.metadata.deletion_timestamp.is_some() {
        return VolumeDecision::Ignore;
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    match (phase, policy) {
        (Some("Released"), Some("Delete")) => VolumeDecision::Delete,
        (Some("Failed"), _) => VolumeDecision::Ignore,
        _ => VolumeDecision::KeepMounted,
    }
}

async fn reconcile_volume(
    pv: Arc<PersistentVolume>,
    ctx: Arc<Ctx>,
) -> Result<Action, ProvisionerError> {
    match decide_volume(&pv) {
        VolumeDecision::Ignore => Ok(Action::await_change()),
        VolumeDecision::KeepMounted => {
            ensure_mounted(&ctx, &pv).await?;
            Ok(Action::await_change())
        }
        VolumeDecision::Delete => {
            let name = pv.name_any();
            let Some(node) = pv_node(&pv) else {
                return Err(ProvisionerError::Volume {
                    pv: name,
                    reason: format!("label {LABEL_NODE} does not name a node of this cluster"),
                });
            };
            let image = image_path(&ctx.state, &name);
            let dir = mount_dir(&ctx.state, node, &name);
            {
                let _guard = ctx.host.lock().await;
                let pv_name = name.clone();
                tokio::task::spawn_blocking(move || {
                    destroy_volume(&image, &dir).map_err(|e| ProvisionerError::Busy {
                        pv: pv_name,
                        reason: e.to_string(),
                    })
                })
                .await??;
            }
            let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(pv = %name, "deleted released volume"),
                Err(e) if is_api_status(&e, |s| s.is_not_found()) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
    }
}

fn volume_error_policy(
    pv: Arc<PersistentVolume>,
    err: &ProvisionerError,
    _ctx: Arc<Ctx>,
) -> Action {
    warn!(pv = %pv.name_any(), error = %err, "volume reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeStatus,
        TopologySelectorLabelRequirement, TopologySelectorTerm, VolumeResourceRequirements,
    };

    #[test]
    fn image_sizes_round_up() {
        assert_eq!(image_size(32 << 20), 32 << 20);
        assert_eq!(image_size(1), MIN_IMAGE_BYTES);
        assert_eq!(image_size(MIN_IMAGE_BYTES + 1), MIN_IMAGE_BYTES + 4096);
    }

    fn class(name: &str, mode: &str) -> StorageClass {
        storage_classes()
            .into_iter()
            .find(|c| c.name_any() == name)
            .map(|mut c| {
                c.volume_binding_mode = Some(mode.into());
                c
            })
            .unwrap()
    }

    fn claim(size: &str, class: &str) -> PersistentVolumeClaim {
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

    fn pv_on(name: &str, node: &str) -> PersistentVolume {
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
    fn provision_node_takes_the_selected_node_or_the_fewest_volumes() {
        let nodes: Vec<String> = NODE_NAMES.iter().map(|n| n.to_string()).collect();
        let pvs = vec![
            pv_on("p1", "node-a"),
            pv_on("p2", "node-a"),
            pv_on("p3", "node-b"),
        ];
        // No selected node: fewest volumes.
        assert_eq!(
            provision_node(None, &nodes, &pvs, "standard").as_deref(),
            Ok("node-c")
        );
        // A selected node wins even when it holds the most volumes.
        assert_eq!(
            provision_node(Some("node-a"), &nodes, &pvs, "standard").as_deref(),
            Ok("node-a")
        );
        // Not a node of this cluster: refused, naming it.
        let err = provision_node(Some("node-x"), &nodes, &pvs, "standard").unwrap_err();
        assert!(err.contains("\"node-x\""), "{err}");
        assert!(err.contains("not a node of this cluster"), "{err}");
        // Ours, but excluded by the class's allowedTopologies: refused, naming it.
        let only_c = vec!["node-c".to_string()];
        let err = provision_node(Some("node-a"), &only_c, &pvs, "standard").unwrap_err();
        assert!(err.contains("\"node-a\""), "{err}");
        assert!(err.contains("allowedTopologies"), "{err}");
        // No candidate at all.
        let err = provision_node(None, &[], &pvs, "standard").unwrap_err();
        assert!(err.contains("admits no node"), "{err}");
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

    #[test]
    fn node_choice_prefers_fewest_volumes_with_stable_ties() {
        let nodes: Vec<String> = NODE_NAMES.iter().map(|n| n.to_string()).collect();
        assert_eq!(choose_node(&nodes, &[]).as_deref(), Some("node-a"));
        let pvs = vec![pv_on("p1", "node-a")];
        assert_eq!(choose_node(&nodes, &pvs).as_deref(), Some("node-b"));
        let pvs = vec![pv_on("p1", "node-a"), pv_on("p2", "node-b")];
        assert_eq!(choose_node(&nodes, &pvs).as_deref(), Some("node-c"));
        let pvs = vec![
            pv_on("p1", "node-a"),
            pv_on("p2", "node-b"),
            pv_on("p3", "node-c"),
            pv_on("p4", "node-a"),
        ];
        assert_eq!(choose_node(&nodes, &pvs).as_deref(), Some("node-b"));
        // PVs of other provisioners do not count.
        let mut foreign = pv_on("p5", "node-a");
        foreign.metadata.annotations = None;
        assert_eq!(choose_node(&nodes, &[foreign]).as_deref(), Some("node-a"));
        assert_eq!(choose_node(&[], &[]), None);
    }

    #[test]
    fn allowed_topologies_restrict_nodes() {
        let mut c = class("standard", "Immediate");
        assert_eq!(allowed_nodes(&c, &NODE_NAMES).len(), 3);
        c.allowed_topologies = Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: LABEL_HOSTNAME.into(),
                values: vec!["node-c".into(), "node-x".into()],
            }]),
        }]);
        assert_eq!(allowed_nodes(&c, &NODE_NAMES), vec!["node-c".to_string()]);
    }

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

    #[test]
    fn volume_decisions() {
        let mut pv = pv_on("p1", "node-a");
        assert_eq!(decide_volume(&pv), VolumeDecision::KeepMounted);
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        assert_eq!(decide_volume(&pv), VolumeDecision::Delete);
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide_volume(&pv), VolumeDecision::KeepMounted);
        pv.metadata.annotations = None;
        assert_eq!(decide_volume(&pv), VolumeDecision::Ignore);
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Root only: a real image, loop-mounted, filled until ENOSPC, then freed.
    #[test]
    fn provisions_mounts_fills_and_frees_an_image() {
        if !is_root() {
            eprintln!("skipped: needs root (loop devices, mount)");
            return;
        }
        let base = std::env::temp_dir().join(format!("sm-prov-test-{}", std::process::id()));
        let state = ClusterState {
            id: "t00001".into(),
            dir: base.clone(),
            bin_dir: PathBuf::from("/nonexistent"),
            etcd_client_port: 1,
            etcd_peer_port: 2,
            apiserver_port: 3,
            controller_manager_port: 4,
            scheduler_port: 5,
            kubelet_ports: vec![6, 7, 8],
            pod_net: 250,
            service_net: 250,
        };
        let image = image_path(&state, "pvc-test");
        let dir = mount_dir(&state, "node-a", "pvc-test");
        let size: u64 = 8 << 20;
        create_image(&image, size).unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().len(), size);
        mount_image(&image, &dir).unwrap();
        mount_image(&image, &dir).unwrap(); // idempotent
        assert!(is_mount_point(&dir).unwrap());
        assert!(loop_devices().unwrap().iter().any(|(_, b)| b == &image));
        assert_eq!(
            mounted_node(&state, "pvc-test").unwrap().as_deref(),
            Some("node-a")
        );

        // Fill it: writing 16 MiB into an 8 MiB volume must end in ENOSPC.
        let mut f = std::fs::File::create(dir.join("fill")).unwrap();
        let chunk = vec![0xabu8; 1 << 20];
        let mut written = 0u64;
        let err = loop {
            use std::io::Write;
            match f.write_all(&chunk).and_then(|_| f.sync_data()) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(
                written <= 16 << 20,
                "wrote {written} bytes into an 8 MiB volume"
            );
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert!(written >= 5 << 20, "only {written} bytes fit");
        drop(f);

        // cleanup_volumes unmounts and detaches but keeps the image; mounting again works.
        cleanup_volumes(&state).unwrap();
        assert!(!is_mount_point(&dir).unwrap());
        assert!(
            !loop_devices()
                .unwrap()
                .iter()
                .any(|(_, b)| b.starts_with(&base))
        );
        assert!(image.exists());
        cleanup_volumes(&state).unwrap(); // idempotent
        mount_image(&image, &dir).unwrap();
        assert!(dir.join("fill").exists(), "data survives a re-mount");

        destroy_volume(&image, &dir).unwrap();
        assert!(!image.exists());
        assert!(!dir.exists());
        assert!(
            !loop_devices()
                .unwrap()
                .iter()
                .any(|(_, b)| b.starts_with(&base))
        );
        destroy_volume(&image, &dir).unwrap(); // idempotent
        std::fs::remove_dir_all(&base).unwrap();
    }
}
