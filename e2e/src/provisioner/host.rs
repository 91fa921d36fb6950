//! Host operations: image files, ext4, loop devices and mounts. Synchronous; run them on the
//! blocking pool.

use std::path::{Path, PathBuf};
use std::process::Command;

use tracing::{debug, info, warn};

use crate::mountinfo;
use crate::provisioner::{MIN_IMAGE_BYTES, ProvisionerError, io_err};
use crate::state::{ClusterState, NODE_NAMES};

/// Size of the image file for a request of `bytes`: at least [`MIN_IMAGE_BYTES`], rounded up to
/// whole 4 KiB blocks.
pub fn image_size(bytes: u64) -> u64 {
    bytes
        .max(MIN_IMAGE_BYTES)
        .div_ceil(4096)
        .saturating_mul(4096)
}

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

pub(super) fn is_mount_point(dir: &Path) -> Result<bool, ProvisionerError> {
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

pub(super) fn image_path(state: &ClusterState, pv: &str) -> PathBuf {
    state.volumes_dir().join(format!("{pv}.img"))
}

pub(super) fn mount_dir(state: &ClusterState, node: &str, pv: &str) -> PathBuf {
    state.node_dir(node).join("volumes").join(pv)
}

/// The node where the image of `pv` is mounted already, if any (a restart between mounting and
/// creating the PV must not mount it a second time elsewhere).
pub(super) fn mounted_node(
    state: &ClusterState,
    pv: &str,
) -> Result<Option<String>, ProvisionerError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    use crate::provisioner::MIN_IMAGE_BYTES;
    use crate::state::ClusterState;

    #[test]
    fn image_sizes_round_up() {
        assert_eq!(image_size(32 << 20), 32 << 20);
        assert_eq!(image_size(1), MIN_IMAGE_BYTES);
        assert_eq!(image_size(MIN_IMAGE_BYTES + 1), MIN_IMAGE_BYTES + 4096);
    }

    /// Root only: a real image, loop-mounted, filled until ENOSPC, then freed.
    #[test]
    fn provisions_mounts_fills_and_frees_an_image() {
        if !crate::testing::require::root("provisions, mounts, fills and frees an image") {
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
