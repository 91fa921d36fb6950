//! The parts of the OCI image layout, index, manifest and config (and their Docker
//! equivalents) that loading and running an image need, as serde types, plus media types and
//! digests. Unknown fields are ignored, as the specs require.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// Annotation of an index entry naming the image (the full reference, or only a tag).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// containerd's annotation with the full reference (its exports put only the tag in REF_NAME).
pub const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// How a layer blob is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// The compression of a layer of media type `media_type`; `None` for a media type this loader
/// does not support (zstd, foreign layers, anything else).
pub fn layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(Compression::Gzip),
        _ => None,
    }
}

/// What an index entry points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    Manifest,
    Index,
}

/// The kind of a manifest or index media type; `None` when unsupported.
pub fn manifest_kind(media_type: &str) -> Option<ManifestKind> {
    match media_type {
        OCI_MANIFEST | DOCKER_MANIFEST => Some(ManifestKind::Manifest),
        OCI_INDEX | DOCKER_MANIFEST_LIST => Some(ManifestKind::Index),
        _ => None,
    }
}

/// `oci-layout`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layout {
    pub image_layout_version: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// `index.json` (or a nested image index / manifest list).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The image configuration (OCI `config` blob or Docker's image JSON).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ImageConfigFile {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// How the image wants to be run.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct RootFs {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DigestError {
    #[error("digest {0:?} is not of the form sha256:<64 lowercase hex digits>")]
    Malformed(String),
    #[error("digest {0:?} uses an unsupported algorithm (only sha256 is supported)")]
    Algorithm(String),
}

/// The hex part of a `sha256:<hex>` digest (safe as a file name).
pub fn sha256_hex(digest: &str) -> Result<&str, DigestError> {
    let (alg, hex) = digest
        .split_once(':')
        .ok_or_else(|| DigestError::Malformed(digest.to_string()))?;
    if alg != "sha256" {
        return Err(DigestError::Algorithm(digest.to_string()));
    }
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(DigestError::Malformed(digest.to_string()));
    }
    Ok(hex)
}

/// `sha256:<hex>` of a finished hasher.
pub fn digest_of(hasher: sha2::Sha256) -> String {
    use sha2::Digest;
    let bytes = hasher.finalize();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The Go architecture name of this machine (`amd64`, `arm64`, ...).
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    #[test]
    fn digests_are_checked() {
        let mut h = sha2::Sha256::new();
        h.update(b"abc");
        let d = digest_of(h);
        assert_eq!(
            d,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(sha256_hex(&d).unwrap(), &d[7..]);
        assert!(matches!(
            sha256_hex("sha512:00"),
            Err(DigestError::Algorithm(_))
        ));
        for bad in [
            "",
            "sha256",
            "sha256:",
            "sha256:../../etc",
            &d.to_uppercase()[..],
        ] {
            assert!(sha256_hex(bad).is_err(), "{bad:?}");
        }
        assert!(sha256_hex(&format!("{d}0")).is_err());
    }

    #[test]
    fn media_types() {
        use Compression::*;
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar"),
            Some(None)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+gzip"),
            Some(Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            Option::None
        );
        assert_eq!(manifest_kind(DOCKER_MANIFEST), Some(ManifestKind::Manifest));
        assert_eq!(manifest_kind(OCI_INDEX), Some(ManifestKind::Index));
        assert_eq!(manifest_kind("text/plain"), Option::None);
    }

    #[test]
    fn docker_and_oci_configs_parse() {
        let c: ImageConfigFile = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","config":{"User":"65532:65532",
            "Env":["PATH=/bin"],"Entrypoint":["/app"],"Cmd":["run"],"WorkingDir":"/w",
            "Labels":{"a":"b"}},"rootfs":{"type":"layers","diff_ids":["sha256:00"]},
            "history":[]}"#,
        )
        .unwrap();
        let rc = c.config.unwrap();
        assert_eq!(rc.user.as_deref(), Some("65532:65532"));
        assert_eq!(rc.entrypoint, Some(vec!["/app".to_string()]));
        assert_eq!(rc.working_dir.as_deref(), Some("/w"));
        assert_eq!(c.rootfs.unwrap().diff_ids, vec!["sha256:00"]);
        let empty: ImageConfigFile = serde_json::from_str(r#"{"config":null}"#).unwrap();
        assert_eq!(empty.config, Option::None);
    }
}
