//! The `StorageMigrationRequest` API (`storagemigrator.io/v1alpha1`). Depends on nothing of ours.
//!
//! The CRD YAML in `crds/` is generated from these types (`storage-migrator crd`); CI fails when
//! it is stale.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod conditions;
pub mod schema;

/// What to migrate and how. Fixed once the request is accepted (later changes are ignored, see
/// `status.acceptedSpec` and the condition `SpecChangeIgnored`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "storagemigrator.io",
    version = "v1alpha1",
    kind = "StorageMigrationRequest",
    doc = "A request to move the volumes of one StatefulSet's members, one member at a time, to another StorageClass or to a smaller size, keeping the claims' names and the workload's quorum. Nothing is touched before preflight accepts it; on failure every member ends on a complete copy of its data. Runbook: docs/runbook.md.",
    category = "storage-migrator",
    plural = "storagemigrationrequests",
    shortname = "smr",
    namespaced,
    status = "StorageMigrationRequestStatus",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type","priority":1}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.target.name","priority":1}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Stage","type":"string","jsonPath":".status.stage"}"#,
    printcolumn = r#"{"name":"Member","type":"string","jsonPath":".status.currentMember","description":"the member in flight"}"#,
    printcolumn = r#"{"name":"Percent","type":"integer","jsonPath":".status.percent","description":"overall progress in percent"}"#,
    printcolumn = r#"{"name":"Members","type":"string","jsonPath":".status.progress","description":"members done/total"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct StorageMigrationRequestSpec {
    /// What to do with the volumes: `StorageClassChange` (move them to another StorageClass,
    /// block `storageClassChange` required) or `Shrink` (move them to smaller volumes of the same
    /// class, block `shrink` required).
    #[serde(rename = "type")]
    pub type_: MigrationType,
    /// The workload whose volumes move, in the request's namespace.
    pub target: TargetRef,
    /// Name of the one volumeClaimTemplate to migrate. Absent (and `volumeClaimTemplates`
    /// absent too): every volumeClaimTemplate of the StatefulSet moves, each member's claims in
    /// one stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_template: Option<String>,
    /// Names of several volumeClaimTemplates to migrate together: each member's claims of them
    /// move in one stop of the member. Not with `volumeClaimTemplate`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<String>,
    /// Parameters of a `StorageClassChange`; required for that type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_change: Option<StorageClassChangeSpec>,
    /// Parameters of a `Shrink`; required for that type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrink: Option<ShrinkSpec>,
    /// Bound on the whole request, counted from its acceptance: hours, minutes and seconds in
    /// that order, each a whole number with its unit, e.g. `30m`, `1h30m`, `90s`. When it expires
    /// the request rolls back and ends `Failed`.
    #[schemars(extend("pattern" = schema::TIMEOUT_PATTERN, "maxLength" = schema::TIMEOUT_MAX_LENGTH))]
    pub timeout: String,
    /// What happens to the old volumes after success: `Retain` keeps them, `Delete` deletes them.
    /// Absent: each old volume gets back the reclaim policy it had before, once the whole request
    /// succeeded (so volumes of a `Delete` class are then reclaimed). Either way only after the
    /// final check passed; with `copy.verify` false (engine Generic) they stay `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "oldPVReclaimPolicy")]
    #[schemars(
        rename = "oldPVReclaimPolicy",
        schema_with = "old_pv_reclaim_policy_schema"
    )]
    pub old_pv_reclaim_policy: Option<OldPvReclaimPolicy>,
    /// `IfReady` (default) refuses to start unless every member is healthy; `Always` starts anyway
    /// (the per-member health gates still hold).
    #[serde(default)]
    pub apply: ApplyPolicy,
    /// How the data is copied.
    #[serde(default)]
    pub copy: CopySpec,
    /// Which health and leadership logic gates and orders the members.
    #[serde(default)]
    pub database: DatabaseSpec,
    /// `true` declares that whatever else manages the StatefulSet (an owning controller, Argo CD,
    /// Flux) is paused for the whole request: the user takes responsibility that nothing
    /// recreates or changes the set meanwhile. Without it, preflight denies a set with such an
    /// owner (`ForeignOwner`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owner_paused: bool,
    /// `true` allows the operator to force-delete (grace period 0) a member pod stuck
    /// terminating on a node that is NotReady or Unknown, without the Node being deleted or
    /// tainted `node.kubernetes.io/out-of-service`: you declare that node really down (a
    /// partitioned node may still run the pod and write to its volume). Off by default: such a
    /// request waits (condition `NodeLost`). May be set while the request runs; it is read from
    /// the current spec, not the accepted one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_delete_on_lost_node: bool,
}

/// What a request does with the volumes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MigrationType {
    StorageClassChange,
    Shrink,
}

/// The workload whose volumes move, or the one claim that moves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// `StatefulSet` (the default): every member's claim of one volumeClaimTemplate moves.
    /// `Deployment`: the one claim its pod template mounts moves; its pods stop by scaling it to
    /// zero and start by scaling it back. `PersistentVolumeClaim`: only that claim moves; it must
    /// be mounted by the pods of one workload only: one StatefulSet member's claim made from one
    /// of the set's volumeClaimTemplates, a claim of one Deployment's pod template, or the claim
    /// of one pod that no controller owns (preflight finds the workload and says so in the
    /// plan).
    #[serde(default)]
    pub kind: TargetKind,
    /// Name of the StatefulSet, Deployment or PersistentVolumeClaim, in the request's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// The kind of object a request's target names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TargetKind {
    /// A StatefulSet: every member's claim of one volumeClaimTemplate moves.
    #[default]
    StatefulSet,
    /// One claim of a StatefulSet member (only that member is stopped, and the StatefulSet is
    /// recreated with its volumeClaimTemplates unchanged) or of a Deployment.
    PersistentVolumeClaim,
    /// A Deployment: the claim its pods mount moves while it is scaled to zero; its template
    /// never changes.
    Deployment,
}

/// Parameters of a `StorageClassChange`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageClassChangeSpec {
    /// The StorageClass every member's claim moves to.
    #[schemars(length(min = 1))]
    pub storage_class_name: String,
}

/// Parameters of a `Shrink`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShrinkSpec {
    /// The new, smaller size of every member's claim (of every template `sizes` does not name):
    /// a positive quantity, e.g. `256Mi` or `1Gi` (or a whole number of bytes). It must hold each
    /// member's used bytes plus 10% (at least 16 MiB); preflight measures them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = schema::SIZE_PATTERN, "minimum" = 1))]
    pub size: Option<Quantity>,
    /// The new size per volumeClaimTemplate (for a Deployment, per claim name), for requests
    /// that move several: `{data: 1Gi, wal: 256Mi}`. A template it does not name takes `size`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(schema_with = "sizes_schema")]
    pub sizes: std::collections::BTreeMap<String, Quantity>,
}

/// The schema of the optional `oldPVReclaimPolicy`: a plain string enum. The derived schema of an
/// `Option<enum>` lists `null` among the enum values, which Kubernetes 1.20's apiserver refuses
/// (it cannot compare such schemas and rejects the CRD with "per-version schemas may not all be
/// set to identical values").
fn old_pv_reclaim_policy_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Retain", "Delete"],
        "description": "What happens to the old volumes after success: `Retain` keeps them, `Delete` deletes them. Absent: each old volume gets back the reclaim policy it had before, once the whole request succeeded (so volumes of a `Delete` class are then reclaimed). Either way only after the final check passed; with `copy.verify` false (engine Generic) they stay `Retain`.",
    })
}

/// What happens to the old volumes after success.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OldPvReclaimPolicy {
    Retain,
    Delete,
}

/// Whether a request starts while a member is unhealthy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ApplyPolicy {
    #[default]
    IfReady,
    Always,
}

/// How the data is copied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopySpec {
    /// First rsync pass while the member still serves (old claim mounted read-only by a pod on
    /// the member's node), so the member is down only for the final delta. Falls back to an
    /// offline copy when the access mode forbids a second mount (ReadWriteOncePod).
    #[serde(default = "default_true")]
    pub pre_copy: bool,
    /// After the final pass, check that source and target trees match in content and metadata
    /// before any swap. False with engine Generic: nothing vouches for the copies, and the old
    /// volumes stay `Retain` after success.
    #[serde(default = "default_true")]
    pub verify: bool,
    /// What the verification reads while the member is down. `Changed` (default): metadata of
    /// the whole tree (names, sizes, modification times, modes, owners, links, ACLs, xattrs) and
    /// the content of every regular file whose inode changed (ctime) since a minute before the
    /// member's first copy pass; `Full`: the content of every file as well.
    #[serde(default)]
    pub verify_mode: VerifyMode,
    /// Image of the copy, verify and measure Jobs and of the mounter pods; must provide `sh`,
    /// `rsync`, `du`, `stat`, GNU `find`, `sed`, `grep`, `sort`, `tr`, `head`, `tail`, `sync` and
    /// `sleep`, and should provide GNU `cp` (else the pre-copy copies with rsync). Allowed only
    /// when the operator runs with `--allow-request-mover-image` (otherwise the request is Denied,
    /// reason `MoverImageNotAllowed`). Default: the operator's own image (its `--image`), which has
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover_image: Option<String>,
    /// Resources (requests and limits) of the copy Jobs' container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Cap on the pre-copy passes' transfer rate, per second (e.g. `50Mi`: 50 MiB/s), so that
    /// the copy made while the member still serves leaves disk and network to it. rsync's
    /// `--bwlimit`, in whole KiB/s: at least `1Ki`. The final pass, while the member is down,
    /// is never capped. Default: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_copy_bandwidth: Option<Quantity>,
    /// What copies the tree in the first copy pass, onto the still empty new volume: the
    /// pre-copy, or the final pass when there is none. `Cp` (default): GNU `cp -a`, which
    /// copies in the kernel (`copy_file_range`) at the disk's speed; rsync takes over when `cp`
    /// is not GNU's, when the new volume is not empty (a pass resumed, the final pass after a
    /// pre-copy), with `preCopyBandwidth` (cp has no cap), and to finish a `cp` that failed (a
    /// file that vanished under it). `Rsync`: rsync only, which checks every file it writes
    /// against a whole-file checksum of its source as it transfers it.
    #[serde(default)]
    pub first_pass_tool: FirstPassTool,
}

/// What copies the tree in the first copy pass (`spec.copy.firstPassTool`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FirstPassTool {
    /// GNU `cp -a` onto the empty new volume, in the kernel; rsync where it cannot serve.
    #[default]
    Cp,
    /// rsync only, checking each file it transfers against a whole-file checksum.
    Rsync,
}

impl Default for CopySpec {
    fn default() -> Self {
        Self {
            pre_copy: true,
            verify: true,
            verify_mode: VerifyMode::default(),
            mover_image: None,
            resources: None,
            pre_copy_bandwidth: None,
            first_pass_tool: FirstPassTool::default(),
        }
    }
}

/// What the verification after the final copy compares (`spec.copy.verifyMode`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum VerifyMode {
    /// Metadata of the whole tree, and the content of the regular files whose inode changed
    /// since a minute before the member's first copy pass. A file unchanged since then was
    /// stable through every pass, and the pass that copied it copied it whole (rsync checks each
    /// file it writes against a whole-file checksum of its source; `cp` copies in the kernel);
    /// the work while the member is down follows what changed.
    #[default]
    Changed,
    /// Metadata and the content of every file, read again on both sides.
    Full,
}

fn default_true() -> bool {
    true
}

/// Which health and leadership logic gates and orders the members.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// `Generic` (pod readiness; optional leader label), `Etcd` (Raft-aware), `Patroni`
    /// (PostgreSQL run by Patroni: replication-aware, switchover before the leader moves) or
    /// `RedisSentinel` (Redis replicas managed by Sentinel: replication offsets, a Sentinel
    /// failover steered to a migrated replica, with writes paused, before the master moves).
    /// `ZooKeeper` (an ensemble read through its four-letter words: synced followers, quorum;
    /// the leader stops last).
    #[serde(default)]
    pub engine: DatabaseEngine,
    /// How far, in bytes of the replication stream, a member may trail the leader when a
    /// member stops, comes back, or takes over (Patroni: WAL bytes; default 1048576, Patroni's
    /// own `maximum_lag_on_failover`. RedisSentinel: replication offset bytes; default 1048576,
    /// Redis's default `repl-backlog-size`). Only for engines that measure lag in bytes
    /// (Patroni, RedisSentinel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_lag_bytes: Option<u64>,
    /// Settings of the `Generic` engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic: Option<GenericSpec>,
    /// Settings of the `Etcd` engine: how the operator reaches each member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,
    /// Settings of the `Patroni` engine: how the operator reaches Patroni's REST API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patroni: Option<PatroniSpec>,
    /// Settings of the `RedisSentinel` engine: the master group and how the operator reaches
    /// Redis and the Sentinels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_sentinel: Option<RedisSentinelSpec>,
    /// Settings of the `ZooKeeper` engine: how the operator reaches each member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zookeeper: Option<ZooKeeperSpec>,
}

/// The health and leadership logic of a database.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DatabaseEngine {
    #[default]
    Generic,
    Etcd,
    Patroni,
    RedisSentinel,
    ZooKeeper,
}

/// Settings of the `RedisSentinel` engine. The operator reaches Redis at each member pod's IP;
/// the Sentinels either beside each member, in the member pod (the layout of the Bitnami chart),
/// at the pod's IP, or, with `sentinelService`, at the ready endpoints of that Service (no
/// cluster DNS, no ClusterIP).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisSentinelSpec {
    /// The master group's name as the Sentinels monitor it (`sentinel monitor <name> ...`;
    /// default `mymaster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub master_name: Option<String>,
    /// Redis's port on every member pod (default 6379).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub redis_port: Option<u16>,
    /// Sentinel's port on every member pod (default 26379); with `sentinelService`, the port
    /// of its endpoints when their EndpointSlice has no port named `sentinel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub sentinel_port: Option<u16>,
    /// A Service in the request's namespace whose ready endpoints are the Sentinels (read from
    /// its EndpointSlices, port named `sentinel`, else `sentinelPort`). Unset: a Sentinel runs
    /// in each member pod. A Service that does not exist or has no ready endpoint is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub sentinel_service: Option<String>,
    /// Secret whose key `password` is Redis's password (`requirepass`), sent with `AUTH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_name: Option<String>,
    /// Secret whose key `password` is the Sentinels' password (`requirepass` in their
    /// configuration), when they have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel_password_secret_name: Option<String>,
    /// How long the handover may take, from pausing writes on the master to Sentinel naming
    /// the new master (default 30). Writes stay paused on the old master until it replicates
    /// from the new one; a handover not done in time is reported (`HandoverRefused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub handover_timeout_seconds: Option<u32>,
}

/// Settings of the `ZooKeeper` engine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZooKeeperSpec {
    /// Client port of every member (default 2181), where the four-letter words `srvr` and
    /// `mntr` are asked (zoo.cfg must list them in `4lw.commands.whitelist`).
    #[serde(default = "default_zookeeper_port")]
    #[schemars(range(min = 1))]
    pub client_port: u16,
    /// How leadership leaves the leader, which moves last (default `Election`).
    #[serde(default)]
    pub handover: ZooKeeperHandover,
    /// Secret whose keys `username` and `password` the operator sends as digest auth before a
    /// `reconfig` (`handover: Reconfig`): ZooKeeper's super user
    /// (`zookeeper.DigestAuthenticationProvider.superDigest`), or a user the ACL of
    /// `/zookeeper/config` lets write. Unset: no auth (the ensemble runs with `skipACL=yes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub auth_secret_name: Option<String>,
}

/// How a ZooKeeper leader's leadership moves before its stop.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ZooKeeperHandover {
    /// No handover: the leader stops last and the ensemble elects another (ZooKeeper's own
    /// rolling restart; its default `reconfigEnabled=false` allows nothing else).
    #[default]
    Election,
    /// Dynamic reconfiguration (`reconfigEnabled=true`, asked in preflight): the leader is made
    /// an observer, ZooKeeper hands leadership to a synced voter it designates (no election),
    /// and the old leader is made a participant again before it stops. Preflight denies the
    /// request when the ensemble has `reconfigEnabled=false`.
    Reconfig,
}

impl Default for ZooKeeperSpec {
    fn default() -> Self {
        Self {
            client_port: default_zookeeper_port(),
            handover: ZooKeeperHandover::default(),
            auth_secret_name: None,
        }
    }
}

fn default_zookeeper_port() -> u16 {
    2181
}

/// Settings of the `Patroni` engine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatroniSpec {
    /// Port of Patroni's REST API on every member. Default: the member container's port named
    /// `patroni` or `restapi`, else the port of `PATRONI_RESTAPI_LISTEN` in its environment,
    /// else 8008.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub api_port: Option<u16>,
    /// Secret with `ca.crt` (and, for client certificates, `tls.crt` and `tls.key`): the API
    /// is then reached over HTTPS, its certificate checked against `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret_name: Option<String>,
    /// Secret with `username` and `password` for the API's basic authentication
    /// (`restapi.authentication`), sent with every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_secret_name: Option<String>,
    /// How long Patroni may take to answer `POST /switchover`, which it answers once the
    /// candidate leads (default 60). An answer that does not come in time is reported
    /// (`HandoverRefused`); Patroni may still complete the switchover, and the operator stops
    /// the old leader only once a later look shows another member leading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub switchover_timeout_seconds: Option<u32>,
}

/// Settings of the `Generic` engine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GenericSpec {
    /// A pod label `key=value` that marks the leader; that member is migrated last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = r"^[^=]*[^=\s][^=]*=[^=]*$"))]
    pub leader_label: Option<String>,
}

/// Settings of the `Etcd` engine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpec {
    /// Client port of every member (default 2379).
    #[serde(default = "default_etcd_port")]
    #[schemars(range(min = 1))]
    pub client_port: u16,
    /// Secret with `ca.crt`, `tls.crt` and `tls.key` for TLS client connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret_name: Option<String>,
    /// Secret with `username` and `password` when etcd auth is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_secret_name: Option<String>,
}

impl Default for EtcdSpec {
    fn default() -> Self {
        Self {
            client_port: default_etcd_port(),
            tls_secret_name: None,
            auth_secret_name: None,
        }
    }
}

fn default_etcd_port() -> u16 {
    2379
}

/// Phase of a request. `Successful`, `Failed` and `Denied` are final.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    #[default]
    Pending,
    Progressing,
    Successful,
    Failed,
    Denied,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Successful | Phase::Failed | Phase::Denied)
    }
}

/// Where the whole request stands. Recorded before the step's destructive action is taken, so a
/// restarted operator resumes from it. The allowed transitions are listed in
/// `plan::machine::STAGES`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Stage {
    /// Checking the request against the cluster; nothing touched yet.
    #[default]
    Preflight,
    /// StatefulSet stashed; claims protected; orphan-deleting the StatefulSet.
    OrphaningStatefulSet,
    /// Migrating members one at a time.
    Migrating,
    /// Recreating the StatefulSet from the stash with the new template.
    RecreatingStatefulSet,
    /// Applying the old-PV policy, labelling old PVs, removing temporary objects.
    Finalizing,
    /// Failure, timeout or deletion: undoing the member in flight, recreating the StatefulSet to
    /// fit.
    RollingBack,
    /// Ended; the phase says how (`Successful`, `Failed` or `Denied`).
    Done,
}

/// Where one member stands: the step in progress. Entering a step is recorded in the status
/// before the step's action is taken, and every action is idempotent, so a restarted operator
/// carries on with the recorded step. The allowed transitions are listed in
/// `plan::machine::STEPS`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum MemberStep {
    /// Not started.
    #[default]
    Pending,
    /// Creating the temporary claim on the target class/size (with a mounter pod on the member's
    /// node when the class is WaitForFirstConsumer) until it is bound.
    CreatingClaim,
    /// First rsync pass while the member serves.
    PreCopying,
    /// Waiting for the health gate before the member stops (etcd: leadership handed over).
    GatingStop,
    /// Pod manifest stashed; deleting the pod until it is gone.
    StoppingPod,
    /// Final rsync pass (and verification) while the member is down.
    Copying,
    /// Verified copy; setting both volumes to Retain (original policies recorded first). From
    /// here on the swap is finished even on failure.
    RetainingVolumes,
    /// Deleting the original claim until it is gone (the temporary claim is deleted with it).
    DeletingOldClaim,
    /// Deleting the temporary claim until it is gone (usually already gone or going).
    DeletingTempClaim,
    /// Pointing the new volume's claimRef at the original claim name.
    ReleasingNewVolume,
    /// Recreating the claim under its original name, bound to the new volume.
    RecreatingClaim,
    /// Recreating the pod from the stash; waiting for Ready and the health gate.
    RecreatingPod,
    /// Migrated.
    Done,
    /// Rolled back before its swap: pod recreated on the untouched old claim.
    RolledBack,
    /// Already on the target class and size at preflight (e.g. migrated by an earlier request
    /// that failed later): nothing is done to it, its pod is never stopped.
    AlreadyThere,
    /// Not the member of the request's target claim (`target.kind: PersistentVolumeClaim`):
    /// nothing is done to it, its pod is never stopped.
    NotTargeted,
}

impl MemberStep {
    /// True once the swap has begun: such a member is carried forward, never back.
    pub fn swap_begun(self) -> bool {
        self >= MemberStep::RetainingVolumes && self != MemberStep::RolledBack && !self.left_alone()
    }

    /// True between `Pending` and the end (`Done`, `RolledBack`, `AlreadyThere`,
    /// `NotTargeted`): the member in flight.
    pub fn in_flight(self) -> bool {
        !matches!(
            self,
            MemberStep::Pending | MemberStep::Done | MemberStep::RolledBack
        ) && !self.left_alone()
    }

    /// True for a member the request leaves alone from its acceptance on (`AlreadyThere`,
    /// `NotTargeted`): its pod is never stopped.
    pub fn left_alone(self) -> bool {
        matches!(self, MemberStep::AlreadyThere | MemberStep::NotTargeted)
    }

    /// True for a member with nothing left to do: `Done`, or left alone.
    pub fn settled(self) -> bool {
        self == MemberStep::Done || self.left_alone()
    }

    /// True for the steps that act on the member's claims (each of them in turn, see
    /// `MemberStatus::claim_index`); false for those that act on its pod.
    pub fn per_claim(self) -> bool {
        matches!(
            self,
            MemberStep::CreatingClaim
                | MemberStep::PreCopying
                | MemberStep::Copying
                | MemberStep::RetainingVolumes
                | MemberStep::DeletingOldClaim
                | MemberStep::DeletingTempClaim
                | MemberStep::ReleasingNewVolume
                | MemberStep::RecreatingClaim
        )
    }

    /// True from the final copy to the release of the new volume: the member is down, and no
    /// health gate is due before its claim is recreated.
    pub fn down_without_gate(self) -> bool {
        matches!(
            self,
            MemberStep::Copying
                | MemberStep::RetainingVolumes
                | MemberStep::DeletingOldClaim
                | MemberStep::DeletingTempClaim
                | MemberStep::ReleasingNewVolume
        )
    }
}

/// Where the request stands, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageMigrationRequestStatus {
    /// `Pending` (not yet accepted), `Progressing`, or final: `Successful`, `Failed`, `Denied`.
    #[serde(default)]
    pub phase: Phase,
    /// Where the whole request stands: `Preflight`, `OrphaningStatefulSet`, `Migrating`,
    /// `RecreatingStatefulSet`, `Finalizing`, `RollingBack` or `Done`.
    #[serde(default)]
    pub stage: Stage,
    /// The `metadata.generation` the operator last looked at: it follows every spec change, also
    /// after acceptance (when a change is ignored, the condition `SpecChangeIgnored` says so and
    /// why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `Ready`, `Progressing`, `HealthGate`, `DisruptionBudget`, `Failed`,
    /// `Blocked`, `Queued` and `SpecChangeIgnored`, each with the generation it was set at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Human-readable summary; on failure it says where each member's data is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Members done / total, e.g. `2/3` (printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The member in flight (its pod name), while one is (printer column `Member`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_member: Option<String>,
    /// Overall progress of the migration in percent, 0 to 100 (printer column `Percent`): each
    /// member weighs the same; the member in flight counts by its step and its copy's progress
    /// (see `plan::progress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// When the request was accepted; `spec.timeout` counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the request reached a final phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// When the current stage was entered (in `Finalizing`: when the final check passed). The
    /// operator's `--stage-timeout` counts from here for `RecreatingStatefulSet`, `Finalizing`
    /// and `RollingBack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_started: Option<Time>,
    /// The plan fixed at preflight: the set, the template, the classes, the target size and
    /// each member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// Per-member progress, in the order members were (or will be) migrated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Why the request failed or is rolling back (set once; drives the rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Whether the StatefulSet's retention policy/ownerReferences were neutralised, and what the
    /// original retention policy was (JSON), to restore it on the recreated set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_retention_policy: Option<String>,
    /// A Deployment target: its `spec.replicas` when the request scaled it to zero (recorded
    /// before the scale-down); it is scaled back to this number, on success and on rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_replicas: Option<i32>,
    /// The ConfigMap holding the stash (`<request>-stash`): the StatefulSet, pod and claim
    /// manifests saved before they were deleted. Recorded once it exists; deleted after success,
    /// kept after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stash_config_map: Option<String>,
    /// The spec as accepted at preflight. Later spec changes are ignored (condition
    /// `SpecChangeIgnored`); the migration carries on with this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_spec: Option<Box<StorageMigrationRequestSpec>>,
    /// etcd: `hash_kv` of every member at a common revision after the last member (engine Etcd);
    /// recorded before any old volume's reclaim policy is restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_hash: Option<String>,
    /// The uid of the StatefulSet the operator recreated (recorded when it is first seen): any
    /// other set of the target's name after the orphan delete was created by someone else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recreated_stateful_set_uid: Option<String>,
}

/// The migration plan, fixed at preflight. Member order may adapt to leadership changes; the
/// order actually used is the order of `status.members`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The StatefulSet migrated (absent for a Deployment's claim).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stateful_set: String,
    /// Set for a Deployment's claim: the Deployment, scaled to zero while the claim moves and
    /// back to its replicas after (its template is not changed); the plan's one member is its
    /// claim, named after one of its pods at preflight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// Set for the claim of a pod that no workload controls (a claim target mounted by a bare
    /// pod): the pod, stashed, deleted and recreated from its stash around the final copy and
    /// the swap, as a StatefulSet member's pod is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The volumeClaimTemplate whose claims move (absent for a Deployment's claim).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume_claim_template: String,
    /// Set when the request's target is one claim (`target.kind: PersistentVolumeClaim`): only
    /// the member that mounts it moves, every other member is `NotTargeted`, and the StatefulSet
    /// is recreated with its volumeClaimTemplates unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_claim: Option<String>,
    /// The StorageClass the claims were on (unset when they name none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_storage_class: Option<String>,
    /// The StorageClass the new volumes are provisioned on.
    pub target_storage_class: String,
    /// The size of the new volumes.
    pub target_size: Quantity,
    /// The further volumeClaimTemplates (or a Deployment pod's further claims) that move in the
    /// same stops as `volumeClaimTemplate`, each with the size of its new volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub further_templates: Vec<TemplateSize>,
    /// The members, in the order planned.
    pub members: Vec<PlannedMember>,
}

/// A further volumeClaimTemplate of a plan and the size its claims move to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSize {
    /// The volumeClaimTemplate (for a Deployment, the pod volume naming the claim).
    pub name: String,
    /// The storage request of its new volumes.
    pub size: Quantity,
}

impl Plan {
    /// True when the request works on a StatefulSet (which it orphans and recreates); false for
    /// a Deployment's claim or a bare pod's.
    pub fn has_stateful_set(&self) -> bool {
        !self.stateful_set.is_empty()
    }
}

/// One member as planned at preflight.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMember {
    /// The member's ordinal in the StatefulSet.
    pub ordinal: i32,
    /// The member's pod.
    pub pod: String,
    /// The node the member's pod ran on at preflight.
    pub node: String,
    /// The member's claim (keeps its name throughout).
    pub claim: String,
    /// The volume the claim was bound to at preflight (kept until the whole request succeeded).
    pub old_volume: String,
    /// The temporary claim the new volume is provisioned for.
    pub temp_claim: String,
    /// The claim's storage request at preflight.
    pub old_size: Quantity,
    /// The storage request of the new volume.
    pub new_size: Quantity,
    /// Bytes in use on the old volume, measured at preflight (Shrink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<i64>,
    /// `leader` or `follower` when the engine knows (at planning time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "role_schema")]
    pub role: Option<Role>,
    /// What the request does to this member: `Migrate`, or `AlreadyThere` when its claim and
    /// volume already are on the target class and size (it is not stopped).
    #[serde(default)]
    pub work: PlannedWork,
    /// The member's further claims (one per further volumeClaimTemplate moved, or per further
    /// claim of a Deployment's pod): they move in the same stop as `claim`, each through the
    /// same steps, one after the other within each step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub further_claims: Vec<PlannedClaim>,
}

/// One further claim of a member, moved in the same stop as its first ([`PlannedMember`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedClaim {
    /// The volumeClaimTemplate it was made from (for a Deployment, the pod volume naming it).
    pub template: String,
    /// The claim (keeps its name throughout).
    pub claim: String,
    /// The volume the claim was bound to at preflight (kept until the whole request succeeded).
    pub old_volume: String,
    /// The temporary claim the new volume is provisioned for.
    pub temp_claim: String,
    /// The claim's storage request at preflight.
    pub old_size: Quantity,
    /// The storage request of the new volume.
    pub new_size: Quantity,
    /// Bytes in use on the old volume, measured at preflight (Shrink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<i64>,
}

impl PlannedMember {
    /// The member as the steps see it while they work on its claim `slot` (0: `claim`; `k`:
    /// `furtherClaims[k-1]`): that claim's names and sizes in the member's own fields.
    pub fn on_claim(&self, slot: usize) -> PlannedMember {
        let mut m = self.clone();
        if let Some(c) = slot.checked_sub(1).and_then(|k| self.further_claims.get(k)) {
            m.claim = c.claim.clone();
            m.old_volume = c.old_volume.clone();
            m.temp_claim = c.temp_claim.clone();
            m.old_size = c.old_size.clone();
            m.new_size = c.new_size.clone();
            m.used_bytes = c.used_bytes;
        }
        m
    }

    /// The name the helpers of claim `slot` (its Jobs, its mounter pod) are named after: the
    /// pod's for the first claim (as before further claims existed, so requests in flight find
    /// theirs), `<pod>-<template>` for a further one.
    pub fn helper_subject(&self, slot: usize) -> String {
        match slot.checked_sub(1).and_then(|k| self.further_claims.get(k)) {
            Some(c) => format!("{}-{}", self.pod, c.template),
            None => self.pod.clone(),
        }
    }
}

/// What a request does to one member, decided at preflight.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PlannedWork {
    /// Copied to a new volume on the target class and size, then swapped.
    #[default]
    Migrate,
    /// Its claim (and the claim's volume) already are on the target class and size: left as it
    /// is, never stopped; `status.members[].step` is `AlreadyThere`.
    AlreadyThere,
    /// Not the member of the request's target claim (`target.kind: PersistentVolumeClaim`):
    /// left as it is, never stopped; `status.members[].step` is `NotTargeted`. Its health still
    /// gates the target member's stop.
    NotTargeted,
}

/// The schema of `shrink.sizes`: an object whose every value is a size as `shrink.size` takes
/// it (without the long generic description of a `Quantity` repeated in the CRD).
fn sizes_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "x-kubernetes-int-or-string": true,
            "pattern": schema::SIZE_PATTERN,
            "minimum": 1,
        },
        "description": "The new size per volumeClaimTemplate (for a Deployment, per claim name), for requests that move several: `{data: 1Gi, wal: 256Mi}`. A template it does not name takes `size`.",
    })
}

/// The schema of the optional `role`: a nullable string enum, without the `null` enum value the
/// derived schema of an `Option<enum>` lists (see [`old_pv_reclaim_policy_schema`]).
fn role_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["leader", "follower"],
        "nullable": true,
        "description": "`leader` or `follower` when the engine knows (at planning time).",
    })
}

/// A member's part in the database, as the engine sees it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Leader,
    Follower,
}

/// Where one member stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The member's pod.
    pub pod: String,
    /// The step in progress, recorded before its action is taken (`Pending` to `Done`, or
    /// `RolledBack`).
    #[serde(default)]
    pub step: MemberStep,
    /// The member's first claim (the plan's `claim`): its name, new volume, original reclaim
    /// policies, bytes copied, verification and data location, as for each of `furtherClaims`.
    #[serde(flatten)]
    pub first_claim: ClaimStatus,
    /// Live progress of the member's running copy (pre-copy or final pass), read from the copy
    /// Job's log every few seconds while it runs; the last reading stays after it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_progress: Option<CopyProgress>,
    /// When the operator created the member's first copy pass (pre-copy, or the final copy
    /// without one): the verification in `Changed` mode compares the content of the files
    /// changed since a minute before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_started: Option<Time>,
    /// When the member's migration started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// When the member's pod was deleted for the final copy (its downtime starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_deleted_at: Option<Time>,
    /// When the member was migrated or rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Time>,
    /// Seconds from the pod's deletion until it was Ready again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_seconds: Option<f64>,
    /// What the member is waiting for or what happened to it, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Helper pods of this member (its Jobs' pods, its mounter) the kubelet evicted and the
    /// operator replaced; at `--max-evictions` the next eviction fails the member.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub helper_evictions: u32,
    /// Set when a rollback left this member in the middle of its swap instead of carrying it
    /// forward (something else recreated its pod or the StatefulSet): why, and where its data is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// Which of the member's claims the step in progress works on: 0 for the plan's `claim`,
    /// `k` for `furtherClaims[k-1]`. A step that acts on claims is taken for each in turn.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub claim_index: usize,
    /// Where each further claim of the member stands (the plan's `furtherClaims`, in order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub further_claims: Vec<ClaimStatus>,
    /// Set when the member led the database at its turn: how leadership left it (a handover
    /// the operator asked for, or the election that followed its stop) and how long until the
    /// operator saw another member lead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_change: Option<LeaderChange>,
}

/// How leadership left a member that led when its turn came, as the operator saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderChange {
    /// The member that led (this member's pod).
    pub from: String,
    /// The member seen leading afterwards, once seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `Handover`: the operator asked the engine to move leadership before the stop.
    /// `Election`: the engine has no handover (ZooKeeper without dynamic reconfiguration), so the
    /// member stopped while it led and the others elected a new leader.
    pub how: LeaderChangeKind,
    /// When the handover was first asked for, or when the leader's pod was deleted (to the
    /// microsecond: `podDeletedAt` is in whole seconds).
    pub started: MicroTime,
    /// Seconds from `started` until the operator first saw the members agree on another
    /// leader: an upper bound by up to one look (the operator looks at least once a second
    /// while it waits for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// `Election` only: when the operator first saw no member lead (the old leader gone, the
    /// election under way). Unset when the new leader was already there at the first look
    /// without the old one: the election was shorter than the time between two looks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaderless: Option<MicroTime>,
    /// `Election` only: seconds from `leaderless` until another member was seen leading: the
    /// election as the operator saw it, to about a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election_seconds: Option<f64>,
}

/// How leadership moved (see [`LeaderChange`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LeaderChangeKind {
    Handover,
    Election,
}

/// Where one claim of a member stands: its first claim's (flattened into [`MemberStatus`]) or
/// a further one's (`furtherClaims[]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// The claim.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim: String,
    /// The new volume, once provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_volume: Option<String>,
    /// The reclaim policy the old volume had before the swap set it to Retain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_volume_original_policy: Option<String>,
    /// The reclaim policy the new volume had before the swap set it to Retain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_volume_original_policy: Option<String>,
    /// Bytes the final copy transferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_copied: Option<i64>,
    /// Files the final copy transferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_copied: Option<i64>,
    /// Files and directories on the old volume when the pre-copy read it (its filesystem's
    /// inodes in use). The copy Jobs after the pre-copy get their memory from it and
    /// `sourceBytes` (`build::job::copy_memory`, docs/install.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_entries: Option<i64>,
    /// Bytes in use on the old volume's filesystem when the pre-copy read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_bytes: Option<i64>,
    /// The pre-copy's rsync compared every entry's ACLs and xattrs with the old volume's (and
    /// copied what differed): the final pass and its verification then compare those of the
    /// entries changed since `copyStarted` less a minute only (docs/api.md, "Verification").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_copy_compared_attributes: Option<bool>,
    /// When the claim's final copy pass was first created. A final pass created after that
    /// (one that replaces an evicted pass) compares every entry's ACLs and xattrs: the one
    /// before may have stopped between an entry's content and its attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_pass_started: Option<Time>,
    /// Entries the final pass found differing or changed in its one walk of both volumes
    /// (`storage-migrator tree-diff`), and copied and verified alone; unset when rsync walked
    /// the whole tree (below 50,000 entries, without a pre-copy that compared every entry's
    /// ACLs and xattrs, or with a mover image that lacks the binary). docs/api.md,
    /// "What verification proves".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_pass_listed_entries: Option<i64>,
    /// Bytes the final copy wrote to the new volume: with its delta transfer only the blocks
    /// that changed since the pre-copy, so at most `bytesCopied` (the sizes of the files that
    /// changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_written: Option<i64>,
    /// When the verification found the copy identical to the original in content and
    /// metadata; unset when `spec.copy.verify` is false. The final check of a `Generic` request
    /// requires it of every migrated claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<Time>,
    /// Regular files whose content the verification compared (`Changed` mode: those changed
    /// since `copyStarted` less a minute; `Full`: every one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_files: Option<i64>,
    /// Where the claim's data is, recorded when the request ends `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_location: Option<DataLocation>,
    /// The claim's volumes whose reclaim policy the claim swap found changed from `Retain`
    /// after it had set it, and set back (no claim of such a volume is deleted meanwhile).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_resets: Vec<PolicyReset>,
}

/// A volume whose reclaim policy something else changed from `Retain` during the claim swap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReset {
    /// The PersistentVolume.
    pub volume: String,
    /// The reclaim policy it was last found with (e.g. `Delete`).
    pub policy: String,
    /// How many times it was found changed: each time at another `resourceVersion` of the
    /// volume. From the second on, condition `ReclaimPolicy` names it.
    pub times: u32,
    /// The volume's `resourceVersion` when it was last found changed: found so again at the
    /// same one, it is the same change (the patch back has not landed), not another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

impl MemberStatus {
    /// True while the member's leader change waits to be seen done.
    pub fn leader_change_pending(&self) -> bool {
        (self.leader_change.as_ref()).is_some_and(|c| c.seconds.is_none())
    }

    /// The status of claim `slot` (0: `first_claim`; `k`: `furtherClaims[k-1]`).
    pub fn claim_status(&self, slot: usize) -> ClaimStatus {
        match slot.checked_sub(1) {
            Some(k) => self.further_claims.get(k).cloned().unwrap_or_default(),
            None => self.first_claim.clone(),
        }
    }

    /// The member as the steps see it while they work on its claim `slot`: that claim's
    /// status as its first claim's.
    pub fn on_claim(&self, slot: usize) -> MemberStatus {
        let mut ms = self.clone();
        ms.first_claim = self.claim_status(slot);
        ms
    }

    /// Writes `c` to claim `slot`'s status (the claim's name stays).
    pub fn set_claim_status(&mut self, slot: usize, c: ClaimStatus) {
        let target = match slot.checked_sub(1) {
            None => &mut self.first_claim,
            Some(k) => {
                if self.further_claims.len() <= k {
                    self.further_claims.resize_with(k + 1, Default::default);
                }
                &mut self.further_claims[k]
            }
        };
        *target = ClaimStatus {
            claim: std::mem::take(&mut target.claim),
            ..c
        };
    }
}

/// Where a member's data is: the claim its pod mounts, that claim's volume and class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataLocation {
    /// The claim (by its own name) the member's data is reached through.
    pub claim: String,
    /// The PersistentVolume that holds the data now.
    pub volume: String,
    /// That volume's StorageClass.
    pub storage_class: String,
    /// `Migrated` (on its new volume; the old one kept on Retain), `Untouched` (on its
    /// original volume), `AlreadyThere` (on the target before the request started) or
    /// `SwapInterrupted` (the rollback gave up in the middle of its swap).
    pub state: DataState,
}

/// How a member's data came to be where [`DataLocation`] says.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DataState {
    /// On its original volume, untouched by the request.
    #[default]
    Untouched,
    /// Copied, verified and swapped onto its new volume; the old volume is kept on Retain.
    Migrated,
    /// Already on the target class and size before the request; untouched.
    AlreadyThere,
    /// In the middle of its swap when the rollback gave up (`--stage-timeout`): the original
    /// data on the old volume and its verified copy on the new one, both on Retain; `volume`
    /// is the one the claim is (or is about to be) bound to.
    SwapInterrupted,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

/// An rsync pass of a member's copy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CopyPass {
    /// The first pass, while the member serves.
    #[default]
    PreCopy,
    /// The final pass, while the member is stopped.
    Copy,
}

/// The progress of a running rsync pass, as its `--info=progress2` lines report it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyProgress {
    /// Which pass: `PreCopy` (while the member serves) or `Copy` (the final pass).
    pub pass: CopyPass,
    /// Bytes rsync has dealt with so far in this pass.
    pub bytes_done: i64,
    /// The bytes of the whole tree as far as rsync knows them (estimated from its percentage;
    /// before the first percent, the size measured at preflight when there is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<i64>,
    /// rsync's percentage, 0 to 100.
    pub percent: i32,
    /// Current transfer rate in bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<i64>,
    /// Seconds left at the current rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// Files (and directories) checked so far, for trees of many small files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_done: Option<i64>,
    /// Files (and directories) in the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_total: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as a user writes it (the README's example plus the KubeDB-style field names).
    #[test]
    fn parses_a_request_as_users_write_it() {
        let yaml = r#"
apiVersion: storagemigrator.io/v1alpha1
kind: StorageMigrationRequest
metadata: {name: etcd-to-fast, namespace: db}
spec:
  type: StorageClassChange
  target: {name: etcd}
  storageClassChange: {storageClassName: fast}
  timeout: 30m
  oldPVReclaimPolicy: Retain
"#;
        let req: StorageMigrationRequest = serde_norway::from_str(yaml).unwrap();
        let spec = &req.spec;
        assert_eq!(spec.type_, MigrationType::StorageClassChange);
        assert_eq!(spec.target.kind, TargetKind::StatefulSet, "kind defaults");
        assert_eq!(spec.old_pv_reclaim_policy, Some(OldPvReclaimPolicy::Retain));
        assert_eq!(spec.apply, ApplyPolicy::IfReady);
        assert!(spec.copy.pre_copy && spec.copy.verify);
        assert_eq!(spec.copy.mover_image, None);
        assert_eq!(spec.database.engine, DatabaseEngine::Generic);
        let back = serde_json::to_value(spec).unwrap();
        assert_eq!(back["oldPVReclaimPolicy"], "Retain");
    }

    #[test]
    fn crd_schema_names_the_fields_users_write() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(StorageMigrationRequest::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for field in [
            "type",
            "target",
            "volumeClaimTemplate",
            "storageClassChange",
            "shrink",
            "timeout",
            "oldPVReclaimPolicy",
            "apply",
            "copy",
            "database",
        ] {
            assert!(
                spec.get(field).is_some(),
                "spec.{field} missing from the CRD schema"
            );
        }
    }
}
