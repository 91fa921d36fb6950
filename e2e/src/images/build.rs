//! Builds small OCI archives in memory, for tests (of the loader here, of the cluster in
//! `e2e/tests/images.rs`): layers from [`LayerBuilder`], a config, one manifest, `index.json`
//! naming the image.

use serde_json::json;
use sha2::Digest;

use super::oci;

/// One uncompressed layer tar.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    fn append(
        &mut self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        owner: (u64, u64),
        link: Option<&str>,
        data: &[u8],
    ) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(owner.0);
        h.set_gid(owner.1);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        // Raw names, so that tests can also write the unsafe ones a loader must refuse.
        let name = &mut h.as_old_mut().name;
        let n = path.len().min(name.len());
        name[..n].copy_from_slice(&path.as_bytes()[..n]);
        if let Some(l) = link {
            let linkname = &mut h.as_old_mut().linkname;
            let n = l.len().min(linkname.len());
            linkname[..n].copy_from_slice(&l.as_bytes()[..n]);
        }
        h.set_cksum();
        // Appending to a Vec cannot fail.
        let _ = self.tar.append(&h, data);
        self
    }

    pub fn dir(&mut self, path: &str, mode: u32, owner: (u64, u64)) -> &mut Self {
        self.append(path, tar::EntryType::Directory, mode, owner, None, &[])
    }

    pub fn file(&mut self, path: &str, mode: u32, owner: (u64, u64), data: &[u8]) -> &mut Self {
        self.append(path, tar::EntryType::Regular, mode, owner, None, data)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.append(
            path,
            tar::EntryType::Symlink,
            0o777,
            (0, 0),
            Some(target),
            &[],
        )
    }

    pub fn hard_link(&mut self, path: &str, target: &str) -> &mut Self {
        self.append(path, tar::EntryType::Link, 0o644, (0, 0), Some(target), &[])
    }

    /// A whiteout entry (`.wh.NAME` or `.wh..wh..opq`).
    pub fn whiteout(&mut self, path: &str) -> &mut Self {
        self.file(path, 0o644, (0, 0), &[])
    }

    pub fn finish(&mut self) -> Vec<u8> {
        let _ = self.tar.finish();
        std::mem::take(self.tar.get_mut())
    }
}

/// A blob: its bytes and `sha256:<hex>`.
pub struct Blob {
    pub bytes: Vec<u8>,
    pub digest: String,
}

impl Blob {
    pub fn new(bytes: Vec<u8>) -> Self {
        let digest = sha256(&bytes);
        Self { bytes, digest }
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    let mut h = sha2::Sha256::new();
    h.update(bytes);
    oci::digest_of(h)
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

/// A layer of the image: its uncompressed tar and whether it is stored gzipped.
pub struct Layer {
    pub tar: Vec<u8>,
    pub gzip: bool,
    /// A media type to write instead of the right one (to test refusals).
    pub media_type: Option<&'static str>,
}

impl Layer {
    pub fn gzip(tar: Vec<u8>) -> Self {
        Self {
            tar,
            gzip: true,
            media_type: None,
        }
    }

    pub fn plain(tar: Vec<u8>) -> Self {
        Self {
            tar,
            gzip: false,
            media_type: None,
        }
    }
}

/// An OCI archive of one image: `layers`, a config whose `config` object is `run_config`
/// (Docker/OCI keys: `Entrypoint`, `Env`...), `index.json` naming it `name`. Blobs come first,
/// `index.json` last (as skopeo writes them). Returns the archive and the layer blobs' digests.
pub fn oci_archive(
    layers: &[Layer],
    run_config: serde_json::Value,
    name: &str,
) -> (Vec<u8>, Vec<String>) {
    let mut blobs = Vec::new();
    let mut layer_descs = Vec::new();
    let mut diff_ids = Vec::new();
    for l in layers {
        diff_ids.push(sha256(&l.tar));
        let (bytes, media_type) = if l.gzip {
            (gzip(&l.tar), "application/vnd.oci.image.layer.v1.tar+gzip")
        } else {
            (l.tar.clone(), "application/vnd.oci.image.layer.v1.tar")
        };
        let media_type = l.media_type.unwrap_or(media_type);
        let b = Blob::new(bytes);
        layer_descs
            .push(json!({"mediaType": media_type, "digest": b.digest, "size": b.bytes.len()}));
        blobs.push(b);
    }
    let layer_digests = blobs.iter().map(|b| b.digest.clone()).collect();
    let config = Blob::new(
        serde_json::to_vec(&json!({
            "architecture": oci::host_architecture(), "os": "linux",
            "config": run_config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap_or_default(),
    );
    let manifest = Blob::new(
        serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": oci::OCI_MANIFEST,
            "config": {"mediaType": oci::OCI_CONFIG, "digest": config.digest, "size": config.bytes.len()},
            "layers": layer_descs,
        }))
        .unwrap_or_default(),
    );
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": oci::OCI_MANIFEST, "digest": manifest.digest, "size": manifest.bytes.len(),
        "annotations": {oci::REF_NAME: name},
    }]});
    blobs.push(config);
    blobs.push(manifest);
    let mut out = LayerBuilder::new();
    out.file(
        "oci-layout",
        0o644,
        (0, 0),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    );
    out.dir("blobs/", 0o755, (0, 0));
    out.dir("blobs/sha256/", 0o755, (0, 0));
    for b in &blobs {
        out.file(
            &format!("blobs/sha256/{}", &b.digest[7..]),
            0o644,
            (0, 0),
            &b.bytes,
        );
    }
    out.file(
        "index.json",
        0o644,
        (0, 0),
        &serde_json::to_vec(&index).unwrap_or_default(),
    );
    (out.finish(), layer_digests)
}
