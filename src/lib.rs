//! storage-migrator: a Kubernetes operator that moves a StatefulSet's volumes, member by member,
//! to another StorageClass or to a smaller size, keeping quorum and every byte.
//!
//! - [`api`]: the `StorageMigrationRequest` types (no dependency on the rest).

pub mod api;
pub mod build;
pub mod engine;
