//! storage-migrator: a Kubernetes operator that moves a StatefulSet's volumes, member by member,
//! to another StorageClass or to a smaller size, keeping quorum and every byte.
//!
//! - [`api`]: the `StorageMigrationRequest` types (no dependency on the rest).
//! - [`build`]: one pure function per object the operator creates.
//! - [`engine`]: database health and leadership (generic, etcd).
//! - [`labels`]: every label, annotation, finalizer and field-manager name.
//! - [`plan`]: the pure state machine (observed snapshot in, actions out).
//! - [`cluster`]: the only code that talks to the API server (gather, execute).
//! - [`controller`]: kube-runtime wiring and error policy.
//! - [`failpoints`]: fault injection for the end-to-end tests (feature `failpoints`).
//! - [`leader`]: leader election on a Lease, with a fence that stops a replica that cannot renew.
//! - [`metrics`], [`serve`], [`permissions`]: `/metrics`, `/healthz`, `/readyz`, and the table of
//!   every RBAC rule the operator uses (checked against the chart and at run time).
//! - [`plugin`]: `kubectl smr` (binary `kubectl-smr`): plan, watch, describe, abort, orphans.
//! - [`image`]: the operator's image reference (`--image`), also its Jobs' default image.
//! - [`scope`]: which namespaces the operator watches (all, or a list).

pub mod api;
pub mod build;
pub mod cluster;
pub mod controller;
pub mod engine;
pub mod failpoints;
pub mod image;
pub mod kept;
pub mod labels;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod permissions;
pub mod plan;
pub mod plugin;
pub mod quantity;
pub mod quiet;
pub mod scope;
pub mod serve;
pub mod tree_diff;
