//! The local cluster's image store: `localcluster image load` imports OCI archives into it, and
//! the node agent runs containers from it (the image's root as the overlay's lower dir, its
//! config's Entrypoint, Cmd, Env, WorkingDir and User).
//!
//! One store per cluster, shared by its nodes, at `<state dir>/images/`:
//!
//! ```text
//! images/index.json                  {"images": {"<normalized reference>": "sha256:<manifest>"}}
//! images/sha256/<hex>/rootfs/        the image's layers flattened in order (whiteouts applied)
//! images/sha256/<hex>/config.json    the image's config blob, as loaded
//! images/sha256/<hex>/manifest.json  its manifest, as loaded
//! images/lock                        flock held by a load
//! images/.load-*/                    the work dir of a load in progress (removed after it)
//! ```
//!
//! The store is mode 0700: image roots may hold set-id programs, which no host user must reach
//! through it (containers see them through their overlay root, mounted by root).
//!
//! `<hex>` is the manifest digest's. A load verifies every blob it uses (sha256 digest and size,
//! and each layer's uncompressed digest against the config's `diff_ids`), builds the image in
//! its work dir, renames it into `sha256/` and only then replaces `index.json` (write + rename):
//! a refused archive leaves the store as it was. Image directories that no name points at any
//! more are kept (a running container may use one as its root). The store outlives `down` and a
//! new `up` in the same state dir (images stay loaded); removing the state dir removes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod build;
pub mod layer;
mod load;
pub mod oci;
pub mod reference;
pub mod user;

pub use load::{LoadError, LoadedImage, load_archive};
pub use reference::{PullPolicy, normalize};

/// The store's directory under a cluster's state dir.
pub fn store_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("images")
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Reference(#[from] reference::ReferenceError),
    #[error(transparent)]
    Digest(#[from] oci::DigestError),
    #[error("image {name:?} points at {digest}, whose directory {path} is missing")]
    Missing {
        name: String,
        digest: String,
        path: PathBuf,
    },
}

pub(crate) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { what, path, source }
}

/// `index.json`: the name → manifest digest map.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StoreIndex {
    pub images: BTreeMap<String, String>,
}

/// An image of the store, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredImage {
    /// `sha256:<hex>` of its manifest.
    pub digest: String,
    /// The flattened root filesystem.
    pub rootfs: PathBuf,
    pub config: oci::RunConfig,
}

/// The image store at `dir` (see the module doc).
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    /// The directory of the image with manifest digest `digest`.
    pub fn image_dir(&self, digest: &str) -> Result<PathBuf, StoreError> {
        Ok(self.dir.join("sha256").join(oci::sha256_hex(digest)?))
    }

    /// The index (empty when the store has none yet).
    pub fn read_index(&self) -> Result<StoreIndex, StoreError> {
        let path = self.index_path();
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| StoreError::Json { path, source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StoreIndex::default()),
            Err(e) => Err(io_err("cannot read", &path)(e)),
        }
    }

    /// Replaces the index atomically (a temporary file, fsync, rename).
    pub fn write_index(&self, index: &StoreIndex) -> Result<(), StoreError> {
        use std::io::Write;
        let path = self.index_path();
        let tmp = self.dir.join(".index.json.tmp");
        let bytes = serde_json::to_vec_pretty(index).map_err(|source| StoreError::Json {
            path: path.clone(),
            source,
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io_err("cannot create", &tmp))?;
        f.write_all(&bytes).map_err(io_err("cannot write", &tmp))?;
        f.sync_all().map_err(io_err("cannot sync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err("cannot rename into", &path))
    }

    /// The stored image named `image` (any spelling of the same reference), if any.
    pub fn lookup(&self, image: &str) -> Result<Option<StoredImage>, StoreError> {
        let name = normalize(image)?;
        let index = self.read_index()?;
        let Some(digest) = index.images.get(&name) else {
            return Ok(None);
        };
        let dir = self.image_dir(digest)?;
        let config_path = dir.join("config.json");
        let bytes = match std::fs::read(&config_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::Missing {
                    name,
                    digest: digest.clone(),
                    path: dir,
                });
            }
            Err(e) => return Err(io_err("cannot read", &config_path)(e)),
        };
        let config: oci::ImageConfigFile =
            serde_json::from_slice(&bytes).map_err(|source| StoreError::Json {
                path: config_path,
                source,
            })?;
        Ok(Some(StoredImage {
            digest: digest.clone(),
            rootfs: dir.join("rootfs"),
            config: config.config.unwrap_or_default(),
        }))
    }
}

/// Reads `rel` (e.g. `etc/passwd`) inside an image root without following symlinks out of it:
/// `None` when it is missing, is not a regular file, or a component is a symlink.
pub fn read_in_root(rootfs: &Path, rel: &str) -> Option<String> {
    let mut cur = rootfs.to_path_buf();
    for part in Path::new(rel).components() {
        let std::path::Component::Normal(part) = part else {
            return None;
        };
        cur.push(part);
        let meta = std::fs::symlink_metadata(&cur).ok()?;
        if meta.file_type().is_symlink() {
            return None;
        }
    }
    if !std::fs::symlink_metadata(&cur).ok()?.is_file() {
        return None;
    }
    std::fs::read_to_string(&cur).ok()
}
