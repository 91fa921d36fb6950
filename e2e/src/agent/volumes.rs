//! Pod volumes on the host: persistentVolumeClaim (the bound PV's `local.path`), emptyDir (a
//! directory, or a tmpfs for medium Memory), hostPath, configMap / secret / downwardAPI /
//! projected (files written under the pod dir), and each container's bind mounts
//! (`subPath`, `subPathExpr`, `readOnly`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    Volume,
};
use kube::Api;

use super::image::{self, EnvContext};
use super::runtime::MountSpec;
use crate::{mountinfo, quantity};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("persistentvolumeclaim {0:?} not found")]
    ClaimNotFound(String),
    #[error("persistentvolumeclaim {0:?} is not bound yet")]
    ClaimNotBound(String),
    #[error("persistentvolume {0:?} (of claim {1:?}) not found")]
    VolumeNotFound(String, String),
    #[error(
        "persistentvolume {0:?} has neither spec.local.path, spec.hostPath.path nor a volume of the local CSI driver"
    )]
    NoLocalPath(String),
    #[error("volume {0:?}: {1}")]
    Source(String, String),
    #[error("volume {volume:?}: unsupported volume type")]
    Unsupported { volume: String },
    #[error("volumeMount {0:?} names no volume of the pod")]
    NoSuchVolume(String),
    #[error("invalid path {0:?} (must be relative, without '..')")]
    BadPath(String),
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot mount tmpfs on {path}: {source}")]
    Mount { path: PathBuf, source: nix::Error },
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A volume made ready on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostVolume {
    pub name: String,
    pub path: PathBuf,
    /// Mounted read-only whatever the volumeMount says (configMap, secret, downwardAPI,
    /// projected, readOnly claims).
    pub read_only: bool,
}

/// One file of a configMap/secret/downwardAPI/projected volume.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeFile {
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
}

fn check_rel(p: &str) -> Result<(), VolumeError> {
    let path = Path::new(p);
    if p.is_empty()
        || path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::RootDir))
    {
        return Err(VolumeError::BadPath(p.to_string()));
    }
    Ok(())
}

/// The files of a key-value source (`items` select and rename keys; without `items`, every key).
/// `None` data means the source does not exist.
pub fn key_files(
    volume: &str,
    kind: &str,
    name: &str,
    data: Option<&BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Vec<VolumeFile>, VolumeError> {
    let Some(data) = data else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(VolumeError::Source(
                volume.to_string(),
                format!("{kind} {name:?} not found"),
            ))
        };
    };
    let mut out = Vec::new();
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                check_rel(&it.path)?;
                match data.get(&it.key) {
                    Some(v) => out.push(VolumeFile {
                        path: it.path.clone(),
                        content: v.clone(),
                        mode: it.mode.map_or(default_mode, |m| m as u32),
                    }),
                    None if optional => {}
                    None => {
                        return Err(VolumeError::Source(
                            volume.to_string(),
                            format!("{kind} {name:?} has no key {:?}", it.key),
                        ));
                    }
                }
            }
        }
        _ => {
            for (k, v) in data {
                check_rel(k)?;
                out.push(VolumeFile {
                    path: k.clone(),
                    content: v.clone(),
                    mode: default_mode,
                });
            }
        }
    }
    Ok(out)
}

/// The files of downwardAPI items.
pub fn downward_files(
    volume: &str,
    pod: &Pod,
    ctx: &EnvContext,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
) -> Result<Vec<VolumeFile>, VolumeError> {
    let mut out = Vec::new();
    for it in items {
        check_rel(&it.path)?;
        let value = if let Some(f) = &it.field_ref {
            image::field_value(pod, ctx, &f.field_path)
        } else if let Some(r) = &it.resource_field_ref {
            let spec = pod.spec.as_ref();
            let c = spec.and_then(|s| {
                s.containers
                    .iter()
                    .find(|c| Some(&c.name) == r.container_name.as_ref())
                    .or_else(|| s.containers.first())
            });
            match c {
                Some(c) => {
                    image::resource_value(c, &r.resource, r.divisor.as_ref().map(|q| q.0.as_str()))
                }
                None => Ok(String::new()),
            }
        } else {
            Ok(String::new())
        }
        .map_err(|e| VolumeError::Source(volume.to_string(), e.to_string()))?;
        out.push(VolumeFile {
            path: it.path.clone(),
            content: value.into_bytes(),
            mode: it.mode.map_or(default_mode, |m| m as u32),
        });
    }
    Ok(out)
}

/// The audiences ("" for the API server's own) and lifetimes of the pod's projected
/// `serviceAccountToken` sources: one token is requested per audience.
pub fn token_audiences(pod: &Pod) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[]);
    let sources = volumes
        .iter()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten());
    for t in sources.filter_map(|s| s.service_account_token.as_ref()) {
        let secs = t.expiration_seconds.unwrap_or(3600);
        let e = out
            .entry(t.audience.clone().unwrap_or_default())
            .or_insert(secs);
        *e = (*e).min(secs);
    }
    out
}

/// The files of a configMap, secret, downwardAPI or projected volume (None for other types).
pub fn projected_files(
    v: &Volume,
    pod: &Pod,
    ctx: &EnvContext,
) -> Result<Option<Vec<VolumeFile>>, VolumeError> {
    let mode = |m: Option<i32>| m.map_or(0o644, |m| m as u32);
    let cm_data = |name: &str| ctx.config_maps.get(name).map(image::config_map_data);
    let secret_data = |name: &str| ctx.secrets.get(name).map(image::secret_data);
    if let Some(cm) = &v.config_map {
        let data = cm_data(&cm.name);
        return key_files(
            &v.name,
            "configmap",
            &cm.name,
            data.as_ref(),
            cm.items.as_deref(),
            mode(cm.default_mode),
            cm.optional == Some(true),
        )
        .map(Some);
    }
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let data = secret_data(&name);
        return key_files(
            &v.name,
            "secret",
            &name,
            data.as_ref(),
            s.items.as_deref(),
            mode(s.default_mode),
            s.optional == Some(true),
        )
        .map(Some);
    }
    if let Some(d) = &v.downward_api {
        let items = d.items.as_deref().unwrap_or(&[]);
        return downward_files(&v.name, pod, ctx, items, mode(d.default_mode)).map(Some);
    }
    if let Some(p) = &v.projected {
        let dm = mode(p.default_mode);
        let mut out = Vec::new();
        for src in p.sources.iter().flatten() {
            if let Some(cm) = &src.config_map {
                let data = cm_data(&cm.name);
                out.extend(key_files(
                    &v.name,
                    "configmap",
                    &cm.name,
                    data.as_ref(),
                    cm.items.as_deref(),
                    dm,
                    cm.optional == Some(true),
                )?);
            } else if let Some(s) = &src.secret {
                let data = secret_data(&s.name);
                out.extend(key_files(
                    &v.name,
                    "secret",
                    &s.name,
                    data.as_ref(),
                    s.items.as_deref(),
                    dm,
                    s.optional == Some(true),
                )?);
            } else if let Some(d) = &src.downward_api {
                let items = d.items.as_deref().unwrap_or(&[]);
                out.extend(downward_files(&v.name, pod, ctx, items, dm)?);
            } else if let Some(t) = &src.service_account_token {
                check_rel(&t.path)?;
                let audience = t.audience.clone().unwrap_or_default();
                let token = ctx.service_account_tokens.get(&audience).ok_or_else(|| {
                    VolumeError::Source(
                        v.name.clone(),
                        format!("no service-account token for audience {audience:?}"),
                    )
                })?;
                out.push(VolumeFile {
                    path: t.path.clone(),
                    content: token.clone().into_bytes(),
                    mode: dm,
                });
            }
        }
        return Ok(Some(out));
    }
    Ok(None)
}

fn write_files(dir: &Path, files: &[VolumeFile]) -> Result<(), VolumeError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for f in files {
        let p = dir.join(&f.path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&p, &f.content).map_err(io(&p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(f.mode & 0o7777))
            .map_err(io(&p))?;
    }
    Ok(())
}

/// The host directory of a bound claim's PersistentVolume.
pub async fn claim_path(
    client: &kube::Client,
    ns: &str,
    claim: &str,
) -> Result<PathBuf, VolumeError> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = pvcs
        .get_opt(claim)
        .await?
        .ok_or_else(|| VolumeError::ClaimNotFound(claim.to_string()))?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty() && bound)
        .ok_or_else(|| VolumeError::ClaimNotBound(claim.to_string()))?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs
        .get_opt(&pv_name)
        .await?
        .ok_or_else(|| VolumeError::VolumeNotFound(pv_name.clone(), claim.to_string()))?;
    let spec = pv.spec.as_ref();
    // A volume of the local provisioner's CSI driver (one with a VolumeAttributesClass) has
    // its host path as its handle.
    let ours_csi = spec
        .and_then(|s| s.csi.as_ref())
        .filter(|c| c.driver == crate::state::CSI_DRIVER)
        .map(|c| c.volume_handle.clone());
    spec.and_then(|s| s.local.as_ref().map(|l| l.path.clone()))
        .or_else(|| spec.and_then(|s| s.host_path.as_ref().map(|h| h.path.clone())))
        .or(ours_csi)
        .map(PathBuf::from)
        .ok_or(VolumeError::NoLocalPath(pv_name))
}

/// Prepares every volume of `pod` under `pod_dir/volumes/<name>` (or finds its host path).
/// Fails while a claim is not bound or a referenced object is missing: the caller retries.
/// `keep_files`: file volumes (projected, configMap, secret, downward API) already written are
/// kept as they are (a re-adopted pod's running containers have those directories bind-mounted:
/// writing them anew would replace the directory under them).
pub async fn prepare(
    client: &kube::Client,
    pod: &Pod,
    pod_dir: &Path,
    ctx: &EnvContext,
    keep_files: bool,
) -> Result<Vec<HostVolume>, VolumeError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = Vec::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for v in &volumes {
        let dir = pod_dir.join("volumes").join(&v.name);
        if let Some(pvc) = &v.persistent_volume_claim {
            out.push(HostVolume {
                name: v.name.clone(),
                path: claim_path(client, &ns, &pvc.claim_name).await?,
                read_only: pvc.read_only == Some(true),
            });
        } else if let Some(e) = &v.empty_dir {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            if e.medium.as_deref() == Some("Memory") {
                mount_tmpfs(&dir, e.size_limit.as_ref().map(|q| q.0.as_str()))?;
            }
            out.push(HostVolume {
                name: v.name.clone(),
                path: dir,
                read_only: false,
            });
        } else if let Some(h) = &v.host_path {
            let p = PathBuf::from(&h.path);
            match h.type_.as_deref() {
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&p).map_err(io(&p))?,
                Some("FileOrCreate") if !p.exists() => {
                    std::fs::write(&p, b"").map_err(io(&p))?;
                }
                _ => {}
            }
            out.push(HostVolume {
                name: v.name.clone(),
                path: p,
                read_only: false,
            });
        } else if let Some(files) = projected_files(v, pod, ctx)? {
            if !(keep_files && dir.is_dir()) {
                write_files(&dir, &files)?;
            }
            out.push(HostVolume {
                name: v.name.clone(),
                path: dir,
                read_only: true,
            });
        } else {
            return Err(VolumeError::Unsupported {
                volume: v.name.clone(),
            });
        }
    }
    Ok(out)
}

fn is_mountpoint(p: &Path) -> bool {
    mounts_under(p).iter().any(|m| m == p)
}

/// Mount points at or below `dir` in this mount namespace (deepest first).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(mountinfo::SELF) else {
        return Vec::new();
    };
    let mut out = mountinfo::mount_points_under(&text, dir);
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

fn mount_tmpfs(dir: &Path, size: Option<&str>) -> Result<(), VolumeError> {
    if is_mountpoint(dir) {
        return Ok(());
    }
    let mut data = String::from("mode=0777");
    if let Some(bytes) = size.and_then(|s| quantity::parse_bytes(s).ok()) {
        data.push_str(&format!(",size={bytes}"));
    }
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|source| VolumeError::Mount {
        path: dir.to_path_buf(),
        source,
    })
}

/// Unmounts what `prepare` mounted under `pod_dir` and removes the directory, unless something
/// is still mounted below it (then it is left alone, never deleted through a mount).
pub fn teardown(pod_dir: &Path) -> Result<(), VolumeError> {
    for m in mounts_under(pod_dir) {
        if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mount = %m.display(), error = %e, "cannot unmount");
        }
    }
    let left = mounts_under(pod_dir);
    if !left.is_empty() {
        tracing::warn!(dir = %pod_dir.display(), ?left, "mounts left, pod dir kept");
        return Ok(());
    }
    match std::fs::remove_dir_all(pod_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(VolumeError::Io {
            path: pod_dir.to_path_buf(),
            source: e,
        }),
    }
}

/// The bind mounts of one container: its volumeMounts (with subPath/subPathExpr, expanded
/// against `env`), in order. Creates subPath directories that do not exist yet.
pub fn container_mounts(
    container: &Container,
    volumes: &[HostVolume],
    env: &[(String, String)],
) -> Result<Vec<MountSpec>, VolumeError> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut out = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == vm.name)
            .ok_or_else(|| VolumeError::NoSuchVolume(vm.name.clone()))?;
        let sub = match (&vm.sub_path, &vm.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => Some(s.clone()),
            (_, Some(e)) if !e.is_empty() => Some(image::expand(e, &lookup)),
            _ => None,
        };
        let source = match sub {
            Some(s) => {
                check_rel(&s)?;
                let p = v.path.join(&s);
                if !p.exists() {
                    std::fs::create_dir_all(&p).map_err(io(&p))?;
                }
                p
            }
            None => v.path.clone(),
        };
        out.push(MountSpec {
            source,
            target: PathBuf::from(&vm.mount_path),
            read_only: v.read_only || vm.read_only == Some(true),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn key_files_items_modes_and_optional() {
        let d = data(&[("a", "1"), ("b", "2")]);
        let all = key_files("v", "configmap", "cm", Some(&d), None, 0o644, false).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].path, "a");
        assert_eq!(all[0].mode, 0o644);
        let items = vec![KeyToPath {
            key: "b".into(),
            path: "sub/b.txt".into(),
            mode: Some(0o600),
        }];
        let sel = key_files("v", "secret", "s", Some(&d), Some(&items), 0o644, false).unwrap();
        assert_eq!(
            sel,
            vec![VolumeFile {
                path: "sub/b.txt".into(),
                content: b"2".to_vec(),
                mode: 0o600
            }]
        );
        assert!(key_files("v", "configmap", "cm", None, None, 0o644, false).is_err());
        assert!(
            key_files("v", "configmap", "cm", None, None, 0o644, true)
                .unwrap()
                .is_empty()
        );
        let missing = vec![KeyToPath {
            key: "zz".into(),
            path: "z".into(),
            mode: None,
        }];
        assert!(
            key_files(
                "v",
                "configmap",
                "cm",
                Some(&d),
                Some(&missing),
                0o644,
                false
            )
            .is_err()
        );
        let escape = vec![KeyToPath {
            key: "a".into(),
            path: "../x".into(),
            mode: None,
        }];
        assert!(
            key_files(
                "v",
                "configmap",
                "cm",
                Some(&d),
                Some(&escape),
                0o644,
                false
            )
            .is_err()
        );
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [
                    {"name": "data", "mountPath": "/var/lib/data", "subPathExpr": "$(POD)"},
                    {"name": "cfg", "mountPath": "/etc/cfg"},
                    {"name": "scratch", "mountPath": "/scratch", "readOnly": true}
                ]}],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "cm", "defaultMode": 0o400}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o600}
                    ]}},
                    {"name": "proj", "projected": {"sources": [
                        {"configMap": {"name": "cm", "items": [{"key": "k", "path": "cm-k"}]}},
                        {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                        {"serviceAccountToken": {"path": "token"}}
                    ]}}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn projected_and_downward_files() {
        let p = pod();
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "cm"}, "data": {"k": "v"}}),
        )
        .unwrap();
        let ctx = EnvContext {
            config_maps: BTreeMap::from([("cm".to_string(), cm)]),
            service_account_tokens: BTreeMap::from([(String::new(), "tok".to_string())]),
            ..Default::default()
        };
        assert_eq!(token_audiences(&p), BTreeMap::from([(String::new(), 3600)]));
        let vols = p.spec.as_ref().unwrap().volumes.clone().unwrap();
        let cfg = projected_files(&vols[0], &p, &ctx).unwrap().unwrap();
        assert_eq!(cfg[0].mode, 0o400);
        let info = projected_files(&vols[1], &p, &ctx).unwrap().unwrap();
        assert_eq!(info[0].content, b"a=\"b\"\n");
        assert_eq!(info[1].content, b"p");
        assert_eq!(info[1].mode, 0o600);
        let proj = projected_files(&vols[2], &p, &ctx).unwrap().unwrap();
        let names: Vec<&str> = proj.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, vec!["cm-k", "ns", "token"]);
        assert_eq!(proj[2].content, b"tok");
        assert!(projected_files(&vols[0], &p, &EnvContext::default()).is_err());
    }

    #[test]
    fn mounts_with_subpath_and_read_only() {
        let dir = std::env::temp_dir().join(format!("sm-vol-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let vols = vec![
            HostVolume {
                name: "data".into(),
                path: dir.join("pv"),
                read_only: false,
            },
            HostVolume {
                name: "cfg".into(),
                path: dir.join("cfg"),
                read_only: true,
            },
            HostVolume {
                name: "scratch".into(),
                path: dir.join("scratch"),
                read_only: false,
            },
        ];
        let env = vec![("POD".to_string(), "p-0".to_string())];
        let m = container_mounts(c, &vols, &env).unwrap();
        assert_eq!(m[0].source, dir.join("pv/p-0"));
        assert!(dir.join("pv/p-0").is_dir());
        assert_eq!(m[0].target, PathBuf::from("/var/lib/data"));
        assert!(!m[0].read_only);
        assert!(m[1].read_only);
        assert!(m[2].read_only);
        assert!(container_mounts(c, &vols[..1], &env).is_err());

        let files = vec![VolumeFile {
            path: "x/y".into(),
            content: b"z".to_vec(),
            mode: 0o640,
        }];
        write_files(&dir.join("cfg"), &files).unwrap();
        let meta = std::fs::metadata(dir.join("cfg/x/y")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        teardown(&dir).unwrap();
        assert!(!dir.exists());
    }
}
