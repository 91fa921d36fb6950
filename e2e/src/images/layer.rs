//! Applies a layer (an uncompressed tar stream) on top of a root directory: OCI whiteouts
//! (`.wh.NAME` deletes NAME from the layers below, `.wh..wh..opq` empties its directory of what
//! the layers below put there), owners, modes, symlinks, hard links, device nodes, FIFOs and
//! `SCHILY.xattr.*` extended attributes. Nothing is ever written outside the root: entry paths
//! must be relative without `..`, and no path is followed through a symlink (a parent that is a
//! symlink is an error; an existing entry is replaced, never written through).

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
const XATTR_PREFIX: &str = "SCHILY.xattr.";

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("unsafe path {0:?} in layer: {1}")]
    UnsafePath(String, &'static str),
    #[error("layer entry {0:?}: unsupported entry type {1:?}")]
    EntryType(String, EntryType),
    #[error("layer entry {path:?}: {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("unexpected end of layer data in {path:?}: {got} of {want} bytes")]
    Truncated { path: String, got: u64, want: u64 },
    #[error("cannot read the layer's tar stream: {0}")]
    Read(std::io::Error),
}

fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> LayerError {
    let path = path.display().to_string();
    move |source| LayerError::Io { path, what, source }
}

/// A layer entry's path as a relative path of normal components (`./` prefixes dropped);
/// `None` for the root itself.
pub fn safe_relative(raw: &Path) -> Result<Option<PathBuf>, LayerError> {
    let shown = || raw.display().to_string();
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(LayerError::UnsafePath(shown(), "contains '..'")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(LayerError::UnsafePath(shown(), "absolute"));
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// What a layer entry's file name asks for.
#[derive(Debug, PartialEq)]
pub enum Whiteout<'a> {
    /// A regular entry.
    None,
    /// `.wh..wh..opq`: empty the directory.
    Opaque,
    /// `.wh.NAME`: delete NAME.
    Delete(&'a str),
}

pub fn whiteout(name: &str) -> Whiteout<'_> {
    if name == OPAQUE {
        Whiteout::Opaque
    } else if let Some(target) = name.strip_prefix(WHITEOUT_PREFIX) {
        Whiteout::Delete(target)
    } else {
        Whiteout::None
    }
}

/// Checks that every ancestor of `rel` under `root` is a real directory (not a symlink),
/// creating missing ones (mode 0755) when `create`; false when one is missing and not created.
fn check_parents(root: &Path, rel: &Path, create: bool) -> Result<bool, LayerError> {
    let mut cur = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(true);
    };
    for part in parent.components() {
        cur.push(part);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(LayerError::UnsafePath(
                    rel.display().to_string(),
                    "a parent directory is a symlink",
                ));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) if create => {
                std::fs::remove_file(&cur).map_err(io(&cur, "cannot replace file by directory"))?;
                std::fs::create_dir(&cur).map_err(io(&cur, "cannot create directory"))?;
            }
            Ok(_) => return Ok(false),
            Err(_) if create => {
                std::fs::create_dir(&cur).map_err(io(&cur, "cannot create directory"))?;
            }
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// Removes whatever is at `path` (a directory recursively; symlinks are not followed).
fn remove_any(path: &Path) -> Result<(), LayerError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(io(path, "cannot remove")),
        Ok(_) => std::fs::remove_file(path).map_err(io(path, "cannot remove")),
        Err(_) => Ok(()),
    }
}

/// Applies one whiteout entry found at `rel` (its parent is the directory concerned).
fn apply_whiteout(
    root: &Path,
    rel: &Path,
    kind: Whiteout<'_>,
    created: &HashSet<PathBuf>,
) -> Result<(), LayerError> {
    if !check_parents(root, rel, false)? {
        return Ok(());
    }
    let dir_rel = rel.parent().unwrap_or(Path::new(""));
    let dir = root.join(dir_rel);
    match kind {
        Whiteout::Delete(name) => {
            if name.is_empty() || name == "." || name == ".." {
                return Err(LayerError::UnsafePath(
                    rel.display().to_string(),
                    "bad whiteout",
                ));
            }
            remove_any(&dir.join(name))
        }
        Whiteout::Opaque => {
            let entries = std::fs::read_dir(&dir).map_err(io(&dir, "cannot list"))?;
            for e in entries {
                let e = e.map_err(io(&dir, "cannot list"))?;
                if !created.contains(&dir_rel.join(e.file_name())) {
                    remove_any(&e.path())?;
                }
            }
            Ok(())
        }
        Whiteout::None => Ok(()),
    }
}

/// Applies the tar stream `layer` to `root`. Returns the reader (to drain its tail).
pub fn apply_layer<R: Read>(root: &Path, layer: R) -> Result<R, LayerError> {
    let mut archive = tar::Archive::new(layer);
    let mut created: HashSet<PathBuf> = HashSet::new();
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    for entry in archive.entries().map_err(LayerError::Read)? {
        let mut entry = entry.map_err(LayerError::Read)?;
        let raw = entry.path().map_err(LayerError::Read)?.into_owned();
        let Some(rel) = safe_relative(&raw)? else {
            continue;
        };
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match whiteout(&name) {
            Whiteout::None => {}
            kind => {
                apply_whiteout(root, &rel, kind, &created)?;
                continue;
            }
        }
        check_parents(root, &rel, true)?;
        let path = root.join(&rel);
        if let Some(mode) = write_entry(root, &rel, &path, &mut entry)? {
            dirs.push((path.clone(), mode));
        }
        // The entry and its parents belong to this layer (an opaque whiteout keeps them).
        for a in rel.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            created.insert(a.to_path_buf());
        }
    }
    // Directory modes last: a read-only directory must not stop its own entries.
    for (path, mode) in dirs.iter().rev() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
            .map_err(io(path, "cannot set mode"))?;
    }
    Ok(archive.into_inner())
}

/// Creates one entry at `path` with its owner, mode and xattrs. Returns the mode of a
/// directory (set after the layer, see [`apply_layer`]).
fn write_entry<R: Read>(
    root: &Path,
    rel: &Path,
    path: &Path,
    entry: &mut tar::Entry<'_, R>,
) -> Result<Option<u32>, LayerError> {
    let header = entry.header().clone();
    let kind = header.entry_type();
    let mode = header.mode().map_err(LayerError::Read)? & 0o7777;
    let existing = std::fs::symlink_metadata(path).ok();
    if !(kind.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir())) {
        remove_any(path)?;
    }
    let shown = || rel.display().to_string();
    match kind {
        EntryType::Directory => {
            if !path.is_dir() {
                std::fs::create_dir(path).map_err(io(path, "cannot create directory"))?;
            }
        }
        EntryType::Regular | EntryType::Continuous => write_file(path, entry, &shown())?,
        EntryType::Symlink => {
            let target = link_name(entry, &shown())?;
            std::os::unix::fs::symlink(&target, path).map_err(io(path, "cannot create symlink"))?;
        }
        EntryType::Link => {
            let target = link_name(entry, &shown())?;
            let target_rel = safe_relative(&target)?
                .ok_or_else(|| LayerError::UnsafePath(shown(), "hard link to the root"))?;
            if !check_parents(root, &target_rel, false)? {
                return Err(LayerError::UnsafePath(shown(), "hard link target missing"));
            }
            let source = root.join(&target_rel);
            std::fs::hard_link(&source, path).map_err(io(path, "cannot create hard link"))?;
            // A hard link shares the target's inode: its owner and mode are the target's.
            return Ok(None);
        }
        EntryType::Char | EntryType::Block | EntryType::Fifo => make_node(path, &header, kind)?,
        EntryType::XGlobalHeader => return Ok(None),
        other => return Err(LayerError::EntryType(shown(), other)),
    }
    let uid = header.uid().map_err(LayerError::Read)? as u32;
    let gid = header.gid().map_err(LayerError::Read)? as u32;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io(path, "cannot chown"))?;
    set_xattrs(path, entry)?;
    match kind {
        EntryType::Symlink => Ok(None),
        EntryType::Directory => Ok(Some(mode)),
        _ => {
            // After chown, which clears set-id bits.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(io(path, "cannot set mode"))?;
            Ok(None)
        }
    }
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>, shown: &str) -> Result<PathBuf, LayerError> {
    entry
        .link_name()
        .map_err(LayerError::Read)?
        .map(|l| l.into_owned())
        .ok_or_else(|| LayerError::UnsafePath(shown.to_string(), "link without a target"))
}

fn write_file<R: Read>(
    path: &Path,
    entry: &mut tar::Entry<'_, R>,
    shown: &str,
) -> Result<(), LayerError> {
    let want = entry.size();
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path, "cannot create file"))?;
    let got = std::io::copy(entry, &mut file).map_err(LayerError::Read)?;
    if got != want {
        return Err(LayerError::Truncated {
            path: shown.to_string(),
            got,
            want,
        });
    }
    Ok(())
}

fn make_node(path: &Path, header: &tar::Header, kind: EntryType) -> Result<(), LayerError> {
    use nix::sys::stat::{Mode, SFlag};
    let flag = match kind {
        EntryType::Char => SFlag::S_IFCHR,
        EntryType::Block => SFlag::S_IFBLK,
        _ => SFlag::S_IFIFO,
    };
    let major = header.device_major().ok().flatten().unwrap_or(0);
    let minor = header.device_minor().ok().flatten().unwrap_or(0);
    let dev = nix::sys::stat::makedev(u64::from(major), u64::from(minor));
    nix::sys::stat::mknod(path, flag, Mode::from_bits_truncate(0o600), dev).map_err(|e| {
        LayerError::Io {
            path: path.display().to_string(),
            what: "cannot create device node",
            source: e.into(),
        }
    })
}

/// Sets the entry's `SCHILY.xattr.*` PAX records on `path` (not following a symlink).
fn set_xattrs<R: Read>(path: &Path, entry: &mut tar::Entry<'_, R>) -> Result<(), LayerError> {
    let Some(exts) = entry.pax_extensions().map_err(LayerError::Read)? else {
        return Ok(());
    };
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| LayerError::UnsafePath(path.display().to_string(), "contains NUL"))?;
    for ext in exts {
        let ext = ext.map_err(LayerError::Read)?;
        let Some(name) = ext.key().ok().and_then(|k| k.strip_prefix(XATTR_PREFIX)) else {
            continue;
        };
        let Ok(c_name) = CString::new(name) else {
            continue;
        };
        let value = ext.value_bytes();
        // SAFETY: valid NUL-terminated strings and a buffer of the given length.
        let rc = unsafe {
            libc::lsetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            tracing::warn!(path = %path.display(), xattr = name, error = %err, "xattr not set");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::build::LayerBuilder;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sm-layer-{name}-{}-{}",
            std::process::id(),
            crate::testing::random_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn listing(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                    out.push(format!("{rel}/"));
                } else {
                    out.push(rel);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn entry_paths_must_stay_inside() {
        assert_eq!(
            safe_relative(Path::new("./a/b")).unwrap(),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(safe_relative(Path::new("./")).unwrap(), None);
        assert!(safe_relative(Path::new("/etc/passwd")).is_err());
        assert!(safe_relative(Path::new("a/../../b")).is_err());
        assert_eq!(whiteout(".wh..wh..opq"), Whiteout::Opaque);
        assert_eq!(whiteout(".wh.foo"), Whiteout::Delete("foo"));
        assert_eq!(whiteout("foo.wh."), Whiteout::None);
    }

    #[test]
    fn layers_stack_with_whiteouts_links_owners_and_modes() {
        let root = scratch("stack");
        let l1 = LayerBuilder::new()
            .dir("etc/", 0o755, (0, 0))
            .file("etc/keep", 0o640, (12, 34), b"keep")
            .file("etc/doomed", 0o644, (0, 0), b"x")
            .dir("etc/sub/", 0o700, (0, 0))
            .file("etc/sub/deep", 0o644, (0, 0), b"deep")
            .dir("opq/", 0o755, (0, 0))
            .file("opq/old", 0o644, (0, 0), b"old")
            .file("bin/prog", 0o4755, (0, 0), b"#!")
            .hard_link("bin/alias", "bin/prog")
            .symlink("bin/sh", "prog")
            .finish();
        apply_layer(&root, &l1[..]).unwrap();
        let l2 = LayerBuilder::new()
            .whiteout("etc/.wh.doomed")
            .whiteout("etc/.wh.sub")
            .file("opq/new", 0o644, (0, 0), b"new")
            .whiteout("opq/.wh..wh..opq")
            .whiteout("nothere/.wh.x")
            .finish();
        apply_layer(&root, &l2[..]).unwrap();
        assert_eq!(
            listing(&root),
            [
                "bin/",
                "bin/alias",
                "bin/prog",
                "bin/sh",
                "etc/",
                "etc/keep",
                "opq/",
                "opq/new"
            ]
        );
        use std::os::unix::fs::MetadataExt;
        let keep = std::fs::metadata(root.join("etc/keep")).unwrap();
        assert_eq!(
            (keep.uid(), keep.gid(), keep.mode() & 0o7777),
            (12, 34, 0o640)
        );
        let prog = std::fs::metadata(root.join("bin/prog")).unwrap();
        assert_eq!(prog.mode() & 0o7777, 0o4755);
        assert_eq!(
            prog.ino(),
            std::fs::metadata(root.join("bin/alias")).unwrap().ino()
        );
        assert_eq!(
            std::fs::read_link(root.join("bin/sh")).unwrap(),
            PathBuf::from("prog")
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn nothing_is_written_outside_the_root() {
        let root = scratch("escape");
        let outside = scratch("outside");
        let l1 = LayerBuilder::new()
            .symlink("link", outside.to_str().unwrap())
            .symlink("up", "..")
            .finish();
        apply_layer(&root, &l1[..]).unwrap();
        for (evil, why) in [
            (
                LayerBuilder::new()
                    .file("link/pwned", 0o644, (0, 0), b"x")
                    .finish(),
                "symlink",
            ),
            (
                LayerBuilder::new()
                    .file("up/pwned", 0o644, (0, 0), b"x")
                    .finish(),
                "symlink",
            ),
            (
                LayerBuilder::new()
                    .file("../pwned", 0o644, (0, 0), b"x")
                    .finish(),
                "'..'",
            ),
            (
                LayerBuilder::new()
                    .file("/tmp/pwned", 0o644, (0, 0), b"x")
                    .finish(),
                "absolute",
            ),
            (
                LayerBuilder::new().hard_link("h", "../etc/passwd").finish(),
                "'..'",
            ),
            (
                LayerBuilder::new().whiteout("link/.wh.x").finish(),
                "symlink",
            ),
        ] {
            let err = apply_layer(&root, &evil[..]).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        assert!(listing(&outside).is_empty());
        // A file replacing a symlink replaces the link, never writes through it.
        let l3 = LayerBuilder::new()
            .file("link", 0o644, (0, 0), b"mine")
            .finish();
        apply_layer(&root, &l3[..]).unwrap();
        assert_eq!(std::fs::read(root.join("link")).unwrap(), b"mine");
        assert!(listing(&outside).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn a_truncated_layer_is_an_error() {
        let root = scratch("trunc");
        let l = LayerBuilder::new()
            .file("big", 0o644, (0, 0), &[7u8; 5000])
            .finish();
        let err = apply_layer(&root, &l[..2000]).unwrap_err();
        assert!(
            matches!(err, LayerError::Truncated { .. } | LayerError::Read(_)),
            "{err}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
