//! `localcluster image load`: imports an OCI archive (a tar of an OCI image layout) into the
//! store. See the module doc of [`crate::images`] for the store's layout and guarantees.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use sha2::Digest;

use super::layer::{self, LayerError};
use super::oci::{self, Compression, Descriptor, ImageConfigFile, Index, Manifest, ManifestKind};
use super::reference::{self, ReferenceError};
use super::{Store, StoreError, io_err};

/// Nested indexes followed at most (index.json → image index → manifest).
const MAX_INDEX_DEPTH: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read the archive {path}: {source}")]
    Archive {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("unexpected end of archive in {entry}: {got} of {want} bytes (truncated archive?)")]
    Truncated { entry: String, got: u64, want: u64 },
    #[error("archive entry {entry:?}: {reason}")]
    BadEntry { entry: String, reason: String },
    #[error(
        "blob {blob}: digest mismatch (its content hashes to {actual}): the archive is corrupt"
    )]
    BlobDigest { blob: String, actual: String },
    #[error(
        "blob {blob} ({what}): size mismatch: its descriptor says {want} bytes, the archive holds {got}"
    )]
    BlobSize {
        blob: String,
        what: String,
        want: u64,
        got: u64,
    },
    #[error("blob {blob} ({what}) is missing from the archive (truncated archive?)")]
    MissingBlob { blob: String, what: String },
    #[error("not an OCI image layout: {0} is missing (truncated archive, or not an OCI archive?)")]
    MissingFile(&'static str),
    #[error("unsupported OCI image layout version {0:?} (expected 1.0.0)")]
    LayoutVersion(String),
    #[error("{what} is not valid JSON: {source}")]
    Json {
        what: String,
        source: serde_json::Error,
    },
    #[error("{what}: unsupported media type {media_type:?}")]
    MediaType { what: String, media_type: String },
    #[error("index.json lists no image")]
    Empty,
    #[error("manifest {0} has no name (annotation {ref_name} or {cn}); pass --name", ref_name = oci::REF_NAME, cn = oci::CONTAINERD_NAME)]
    NoName(String),
    #[error("--name names one image, but the archive holds {0}")]
    NameAmbiguous(usize),
    #[error("image index {index} has no manifest for linux/{arch}")]
    NoPlatform { index: String, arch: &'static str },
    #[error("image index nesting deeper than {MAX_INDEX_DEPTH} at {0}")]
    TooDeep(String),
    #[error("config {config}: {layers} layers but {diff_ids} diff_ids")]
    DiffIdCount {
        config: String,
        layers: usize,
        diff_ids: usize,
    },
    #[error(
        "layer {blob}: uncompressed content hashes to {actual}, the config's diff_id is {want}"
    )]
    DiffId {
        blob: String,
        want: String,
        actual: String,
    },
    #[error("layer {blob}: {source}")]
    Layer { blob: String, source: LayerError },
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Digest(#[from] oci::DigestError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot lock the image store {path}: {source}")]
    Lock {
        path: PathBuf,
        source: nix::errno::Errno,
    },
}

/// One image a load put into the store.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedImage {
    /// The normalized reference it is known by.
    pub name: String,
    /// Its manifest digest.
    pub digest: String,
    /// The store already held this manifest (nothing was extracted).
    pub already_present: bool,
}

/// The load's work dir under the store, removed when dropped.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove the load's work dir");
        }
    }
}

/// Imports every image of the OCI archive `archive` into `store` under its name (the
/// manifest's `org.opencontainers.image.ref.name`, or `name` when given); see the module doc
/// of [`crate::images`] for the guarantees.
pub fn load_archive(
    store: &Store,
    archive: &Path,
    name: Option<&str>,
) -> Result<Vec<LoadedImage>, LoadError> {
    std::fs::create_dir_all(&store.dir).map_err(io_err("cannot create", &store.dir))?;
    // Root only: image roots hold set-id programs that no host user may reach through the store
    // (containers see them through their overlay, mounted by root).
    std::fs::set_permissions(
        &store.dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .map_err(io_err("cannot set the mode of", &store.dir))?;
    let lock_path = store.dir.join("lock");
    let lock_file = File::create(&lock_path).map_err(io_err("cannot create", &lock_path))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive).map_err(
        |(_, source)| LoadError::Lock {
            path: lock_path.clone(),
            source,
        },
    )?;
    remove_stale_work_dirs(store)?;
    let work = WorkDir(store.dir.join(format!(".load-{}", std::process::id())));
    std::fs::create_dir(&work.0).map_err(io_err("cannot create", &work.0))?;
    let layout = work.0.join("layout");
    unpack_layout(archive, &layout)?;
    let index = read_layout_index(&layout)?;
    let targets = select_manifests(&layout, &index, name)?;
    let mut index = store.read_index()?;
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut loaded = Vec::new();
    for (name, manifest) in targets {
        let final_dir = store.image_dir(&manifest.digest)?;
        let already_present = final_dir.exists();
        let staged_dir = work.0.join(oci::sha256_hex(&manifest.digest)?);
        if !already_present && !staged_dir.exists() {
            build_image(&layout, &manifest, &staged_dir)?;
            staged.push((staged_dir, final_dir));
        }
        index.images.insert(name.clone(), manifest.digest.clone());
        loaded.push(LoadedImage {
            name,
            digest: manifest.digest,
            already_present,
        });
    }
    let images_dir = store.dir.join("sha256");
    std::fs::create_dir_all(&images_dir).map_err(io_err("cannot create", &images_dir))?;
    for (from, to) in staged {
        std::fs::rename(&from, &to).map_err(io_err("cannot rename into", &to))?;
    }
    store.write_index(&index)?;
    Ok(loaded)
}

fn remove_stale_work_dirs(store: &Store) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(&store.dir).map_err(io_err("cannot list", &store.dir))?;
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(".load-") {
            let p = e.path();
            std::fs::remove_dir_all(&p).map_err(io_err("cannot remove", &p))?;
        }
    }
    Ok(())
}

fn archive_err(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError {
    let path = path.to_path_buf();
    move |source| LoadError::Archive { path, source }
}

/// Unpacks the archive's regular files and directories into `dest`, checking every
/// `blobs/sha256/<hex>` against its digest on the way.
fn unpack_layout(archive: &Path, dest: &Path) -> Result<(), LoadError> {
    let file = File::open(archive).map_err(archive_err(archive))?;
    let mut ar = tar::Archive::new(BufReader::new(file));
    std::fs::create_dir_all(dest).map_err(io_err("cannot create", dest))?;
    for entry in ar.entries().map_err(archive_err(archive))? {
        let mut entry = entry.map_err(archive_err(archive))?;
        let raw = entry.path().map_err(archive_err(archive))?.into_owned();
        let bad = |reason: String| LoadError::BadEntry {
            entry: raw.display().to_string(),
            reason,
        };
        let Some(rel) = layer::safe_relative(&raw).map_err(|e| bad(e.to_string()))? else {
            continue;
        };
        let path = dest.join(&rel);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&path).map_err(io_err("cannot create", &path))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
                }
                copy_entry(&mut entry, &rel, &path, archive)?;
            }
            tar::EntryType::XGlobalHeader => {}
            other => return Err(bad(format!("unexpected entry type {other:?}"))),
        }
    }
    Ok(())
}

/// Writes one archive entry to `path`; a `blobs/sha256/<hex>` entry must hash to `<hex>`.
fn copy_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    rel: &Path,
    path: &Path,
    archive: &Path,
) -> Result<(), LoadError> {
    let want = entry.size();
    let mut out = File::create(path).map_err(io_err("cannot create", path))?;
    let mut hashing = HashingReader::new(entry);
    let got = std::io::copy(&mut hashing, &mut out).map_err(archive_err(archive))?;
    if got != want {
        return Err(LoadError::Truncated {
            entry: rel.display().to_string(),
            got,
            want,
        });
    }
    let mut parts = rel.iter().map(|p| p.to_string_lossy());
    if let (Some(b), Some(alg), Some(hex), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
        && b == "blobs"
        && alg == "sha256"
    {
        let blob = format!("sha256:{hex}");
        let actual = oci::digest_of(hashing.hasher);
        if actual != blob {
            return Err(LoadError::BlobDigest { blob, actual });
        }
    }
    Ok(())
}

/// Checks `oci-layout` and parses `index.json`.
fn read_layout_index(layout: &Path) -> Result<Index, LoadError> {
    let version = layout.join("oci-layout");
    if !version.exists() {
        return Err(LoadError::MissingFile("oci-layout"));
    }
    let v: oci::Layout = read_json(&version, "oci-layout")?;
    if v.image_layout_version != "1.0.0" {
        return Err(LoadError::LayoutVersion(v.image_layout_version));
    }
    let index = layout.join("index.json");
    if !index.exists() {
        return Err(LoadError::MissingFile("index.json"));
    }
    read_json(&index, "index.json")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T, LoadError> {
    let bytes = std::fs::read(path).map_err(io_err("cannot read", path))?;
    serde_json::from_slice(&bytes).map_err(|source| LoadError::Json {
        what: what.to_string(),
        source,
    })
}

/// The file of blob `desc` in the layout, checked for presence and size (its digest was
/// checked when it was unpacked).
fn blob_path(layout: &Path, desc: &Descriptor, what: &str) -> Result<PathBuf, LoadError> {
    let hex = oci::sha256_hex(&desc.digest)?;
    let path = layout.join("blobs").join("sha256").join(hex);
    let meta = std::fs::metadata(&path).map_err(|_| LoadError::MissingBlob {
        blob: desc.digest.clone(),
        what: what.to_string(),
    })?;
    if meta.len() != desc.size {
        return Err(LoadError::BlobSize {
            blob: desc.digest.clone(),
            what: what.to_string(),
            want: desc.size,
            got: meta.len(),
        });
    }
    Ok(path)
}

fn read_blob(layout: &Path, desc: &Descriptor, what: &str) -> Result<Vec<u8>, LoadError> {
    let path = blob_path(layout, desc, what)?;
    std::fs::read(&path).map_err(|e| LoadError::from(io_err("cannot read", &path)(e)))
}

fn parse_blob<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    desc: &Descriptor,
    what: &str,
) -> Result<T, LoadError> {
    serde_json::from_slice(bytes).map_err(|source| LoadError::Json {
        what: format!("{what} {}", desc.digest),
        source,
    })
}

/// The name of an index.json entry: containerd's full-name annotation, else
/// `org.opencontainers.image.ref.name` when it is a full reference (not only a tag).
fn entry_name(d: &Descriptor) -> Option<&str> {
    if let Some(n) = d.annotations.get(oci::CONTAINERD_NAME) {
        return Some(n);
    }
    d.annotations
        .get(oci::REF_NAME)
        .map(String::as_str)
        .filter(|n| n.contains('/') || n.contains(':'))
}

/// (normalized name, manifest descriptor) of every image of the archive.
fn select_manifests(
    layout: &Path,
    index: &Index,
    name: Option<&str>,
) -> Result<Vec<(String, Descriptor)>, LoadError> {
    if index.manifests.is_empty() {
        return Err(LoadError::Empty);
    }
    if name.is_some() && index.manifests.len() > 1 {
        return Err(LoadError::NameAmbiguous(index.manifests.len()));
    }
    let mut out = Vec::new();
    for d in &index.manifests {
        let image_name = name
            .or_else(|| entry_name(d))
            .ok_or_else(|| LoadError::NoName(d.digest.clone()))?;
        let manifest = to_manifest(layout, d, 0)?;
        out.push((reference::normalize(image_name)?, manifest));
    }
    Ok(out)
}

/// Follows an index entry to an image manifest (through image indexes, picking linux on this
/// machine's architecture).
fn to_manifest(layout: &Path, d: &Descriptor, depth: usize) -> Result<Descriptor, LoadError> {
    let kind = oci::manifest_kind(&d.media_type).ok_or_else(|| LoadError::MediaType {
        what: format!("index entry {}", d.digest),
        media_type: d.media_type.clone(),
    })?;
    if kind == ManifestKind::Manifest {
        return Ok(d.clone());
    }
    if depth >= MAX_INDEX_DEPTH {
        return Err(LoadError::TooDeep(d.digest.clone()));
    }
    let bytes = read_blob(layout, d, "image index")?;
    let nested: Index = parse_blob(&bytes, d, "image index")?;
    let arch = oci::host_architecture();
    let chosen = nested
        .manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .ok_or_else(|| LoadError::NoPlatform {
            index: d.digest.clone(),
            arch,
        })?;
    to_manifest(layout, chosen, depth + 1)
}

/// Builds the image of `manifest` in `dir`: `rootfs/` (its layers applied in order), then
/// `manifest.json` and `config.json`.
fn build_image(layout: &Path, desc: &Descriptor, dir: &Path) -> Result<(), LoadError> {
    let manifest_bytes = read_blob(layout, desc, "manifest")?;
    let manifest: Manifest = parse_blob(&manifest_bytes, desc, "manifest")?;
    if let Some(mt) = manifest.media_type.as_deref()
        && oci::manifest_kind(mt) != Some(ManifestKind::Manifest)
    {
        return Err(LoadError::MediaType {
            what: format!("manifest {}", desc.digest),
            media_type: mt.to_string(),
        });
    }
    let config_mt = manifest.config.media_type.as_str();
    if !matches!(config_mt, oci::OCI_CONFIG | oci::DOCKER_CONFIG) {
        return Err(LoadError::MediaType {
            what: format!("config {}", manifest.config.digest),
            media_type: config_mt.to_string(),
        });
    }
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for l in &manifest.layers {
        let c = oci::layer_compression(&l.media_type).ok_or_else(|| LoadError::MediaType {
            what: format!("layer {}", l.digest),
            media_type: l.media_type.clone(),
        })?;
        layers.push((l, c, blob_path(layout, l, "layer")?));
    }
    let config_bytes = read_blob(layout, &manifest.config, "config")?;
    let config: ImageConfigFile = parse_blob(&config_bytes, &manifest.config, "config")?;
    let diff_ids = config.rootfs.map(|r| r.diff_ids).unwrap_or_default();
    if diff_ids.len() != layers.len() {
        return Err(LoadError::DiffIdCount {
            config: manifest.config.digest.clone(),
            layers: layers.len(),
            diff_ids: diff_ids.len(),
        });
    }
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).map_err(io_err("cannot create", &rootfs))?;
    for ((l, compression, path), diff_id) in layers.into_iter().zip(&diff_ids) {
        apply_blob(&rootfs, l, compression, &path, diff_id)?;
    }
    for (name, bytes) in [
        ("manifest.json", &manifest_bytes),
        ("config.json", &config_bytes),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(io_err("cannot write", &p))?;
    }
    Ok(())
}

/// Applies one layer blob to `rootfs` and checks its uncompressed digest.
fn apply_blob(
    rootfs: &Path,
    l: &Descriptor,
    compression: Compression,
    path: &Path,
    diff_id: &str,
) -> Result<(), LoadError> {
    let layer_err = |source| LoadError::Layer {
        blob: l.digest.clone(),
        source,
    };
    let file = BufReader::new(File::open(path).map_err(io_err("cannot open", path))?);
    let stream: Box<dyn Read> = match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
    };
    let mut rest = layer::apply_layer(rootfs, HashingReader::new(stream)).map_err(layer_err)?;
    // The tar end marker and padding are part of the uncompressed digest.
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(|e| layer_err(LayerError::Read(e)))?;
    let actual = oci::digest_of(rest.hasher);
    if actual != diff_id {
        return Err(LoadError::DiffId {
            blob: l.digest.clone(),
            want: diff_id.to_string(),
            actual,
        });
    }
    Ok(())
}

/// A reader that hashes (sha256) what goes through it.
struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R> HashingReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: sha2::Sha256::new(),
        }
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::build::{Layer, LayerBuilder, oci_archive};

    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "sm-load-{}-{}",
            std::process::id(),
            crate::testing::random_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn archive(marker: &str) -> (Vec<u8>, Vec<String>) {
        archive_with(marker, None)
    }

    fn archive_with(marker: &str, media_type: Option<&'static str>) -> (Vec<u8>, Vec<String>) {
        let l1 = LayerBuilder::new()
            .dir("etc/", 0o755, (0, 0))
            .file("etc/marker", 0o644, (0, 0), marker.as_bytes())
            .file("etc/doomed", 0o644, (0, 0), b"x")
            .file("etc/filler", 0o644, (0, 0), &[b'z'; 20_000])
            .finish();
        let l2 = LayerBuilder::new().whiteout("etc/.wh.doomed").finish();
        oci_archive(
            &[
                Layer {
                    media_type,
                    ..Layer::gzip(l1)
                },
                Layer::plain(l2),
            ],
            serde_json::json!({"Entrypoint": ["/bin/sh"], "User": "1:2", "WorkingDir": "/w"}),
            "localhost/test/img:1",
        )
    }

    /// index.json and the names under the store (what a refused load must not change).
    fn snapshot(store: &Store) -> (String, Vec<String>) {
        let index = std::fs::read_to_string(store.index_path()).unwrap_or_default();
        let mut names: Vec<String> = std::fs::read_dir(&store.dir)
            .unwrap()
            .chain(std::fs::read_dir(store.dir.join("sha256")).unwrap())
            .map(|e| e.unwrap().path().display().to_string())
            .collect();
        names.sort();
        (index, names)
    }

    fn load(store: &Store, dir: &Path, bytes: &[u8]) -> Result<Vec<LoadedImage>, LoadError> {
        let path = dir.join(format!("a-{}.tar", crate::testing::random_suffix()));
        std::fs::write(&path, bytes).unwrap();
        load_archive(store, &path, None)
    }

    #[test]
    fn load_lookup_replace_and_idempotence() {
        let dir = scratch();
        let store = Store::new(dir.0.join("images"));
        let (a, _) = archive("A");
        let first = load(&store, &dir.0, &a).unwrap();
        assert_eq!(first.len(), 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&store.dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(first[0].name, "localhost/test/img:1");
        assert!(!first[0].already_present);
        let img = store.lookup("localhost/test/img:1").unwrap().unwrap();
        assert_eq!(std::fs::read(img.rootfs.join("etc/marker")).unwrap(), b"A");
        assert!(!img.rootfs.join("etc/doomed").exists());
        assert_eq!(img.config.user.as_deref(), Some("1:2"));
        assert_eq!(img.config.working_dir.as_deref(), Some("/w"));
        assert_eq!(store.lookup("localhost/test/other:1").unwrap(), None);
        let before = snapshot(&store);
        let again = load(&store, &dir.0, &a).unwrap();
        assert!(again[0].already_present);
        assert_eq!(snapshot(&store), before);
        let (b, _) = archive("B");
        let replaced = load(&store, &dir.0, &b).unwrap();
        assert_ne!(replaced[0].digest, first[0].digest);
        let img = store.lookup("localhost/test/img:1").unwrap().unwrap();
        assert_eq!(std::fs::read(img.rootfs.join("etc/marker")).unwrap(), b"B");
    }

    #[test]
    fn corrupt_and_truncated_archives_leave_the_store_unchanged() {
        let dir = scratch();
        let store = Store::new(dir.0.join("images"));
        let (a, _) = archive("A");
        load(&store, &dir.0, &a).unwrap();
        let before = snapshot(&store);
        let (b, layers) = archive("B");
        // A flipped byte in the middle of the first layer's blob.
        let blob_hex = &layers[0][7..];
        let name_at = b
            .windows(blob_hex.len())
            .position(|w| w == blob_hex.as_bytes())
            .unwrap();
        let mut corrupt = b.clone();
        let data_at = (name_at / 512 + 1) * 512;
        corrupt[data_at + 100] ^= 0x40;
        let err = load(&store, &dir.0, &corrupt).unwrap_err().to_string();
        assert!(
            err.contains("digest mismatch") && err.contains(&layers[0]),
            "{err}"
        );
        assert_eq!(snapshot(&store), before);
        // Cut inside that blob, and at an entry boundary (before index.json).
        let err = load(&store, &dir.0, &b[..data_at + 300])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unexpected end of archive"), "{err}");
        assert_eq!(snapshot(&store), before);
        let index_at = b.windows(10).rposition(|w| w == b"index.json").unwrap();
        let err = load(&store, &dir.0, &b[..index_at])
            .unwrap_err()
            .to_string();
        assert!(err.contains("index.json is missing"), "{err}");
        assert_eq!(snapshot(&store), before);
        let err = load(&store, &dir.0, b"not a tar at all")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot read the archive") || err.contains("missing"),
            "{err}"
        );
        assert_eq!(snapshot(&store), before);
        let img = store.lookup("localhost/test/img:1").unwrap().unwrap();
        assert_eq!(std::fs::read(img.rootfs.join("etc/marker")).unwrap(), b"A");
    }

    #[test]
    fn unsupported_media_types_are_named() {
        let dir = scratch();
        let store = Store::new(dir.0.join("images"));
        let zstd = "application/vnd.oci.image.layer.v1.tar+zstd";
        let (a, layers) = archive_with("A", Some(zstd));
        let err = load(&store, &dir.0, &a).unwrap_err().to_string();
        assert!(err.contains(zstd) && err.contains(&layers[0]), "{err}");
        assert!(!store.index_path().exists());
    }
}
