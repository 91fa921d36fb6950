//! `storage-migrator tree-diff`: what the final pass must copy or delete, found in one walk of
//! both trees (issue 30, item 4).
//!
//! The final pass runs while the member is down, so its time is downtime. rsync finds what
//! changed by walking both trees, a directory at a time, with every entry's ACLs and xattrs
//! read on both sides; and the verification walked them again. This walk reads both trees
//! side by side, in parallel threads (a directory of the old volume and the same directory of
//! the new one at a time, their entries `lstat`ed, names sorted), and lists every entry that:
//! - exists on one side only (a new entry to copy, an old one to delete; a directory's whole
//!   subtree, since `rsync --files-from` does not recurse);
//! - differs in its type, mode, owner, group, modification time (to the nanosecond), device
//!   number, or, for a non-directory, its size or link count (a directory's size and link count
//!   are the filesystem's, not the data's);
//! - changed on the old volume after `since` (its inode change time, as `find -newerct`): its
//!   content, ACLs, xattrs or hard links may differ although the fields above are equal.
//!
//! Every other entry is, at the moment of the walk, equal on both volumes in those fields, and
//! its content, ACLs and xattrs are as the pass that last wrote it left them (the ground of the
//! `Changed` verification, see `build::job::COPY_SCRIPT`). The list is written NUL-separated, as
//! `rsync --files-from --from0` reads it, paths relative to the roots (`.` for the root).

use std::cmp::Ordering;
use std::ffi::OsString;
use std::fs::{Metadata, read_dir};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

/// A walk that could not read an entry: the list would be incomplete, so there is none.
#[derive(Debug, thiserror::Error)]
pub enum TreeDiffError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing the list to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What one walk found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Paths to copy or delete, relative to the roots (`.` for the root itself).
    pub paths: Vec<OsString>,
    /// Entries of the old volume walked (its root included).
    pub source_entries: u64,
    /// Regular files of the old volume among `paths`.
    pub regular_files: u64,
    /// Regular files of the new volume with more than one link (the final pass writes in place
    /// only where there are none, see `build::job::COPY_SCRIPT`).
    pub target_linked: u64,
}

impl Listed {
    fn merge(mut self, other: Listed) -> Listed {
        self.paths.extend(other.paths);
        self.source_entries += other.source_entries;
        self.regular_files += other.regular_files;
        self.target_linked += other.target_linked;
        self
    }

    fn push(&mut self, rel: &Path, source: Option<&Stat>) {
        self.paths.push(shown(rel));
        if source.is_some_and(Stat::is_file) {
            self.regular_files += 1;
        }
    }
}

/// The path as listed: `.` for the root.
fn shown(rel: &Path) -> OsString {
    if rel.as_os_str().is_empty() {
        OsString::from(".")
    } else {
        rel.as_os_str().to_owned()
    }
}

/// What the walk keeps of an entry's `lstat`: 64 bytes, not the 170 or so of `Metadata`, since
/// a directory's entries are held at once on both sides (a flat directory of a million files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime_nsec: u32,
    ctime_nsec: u32,
    mtime: i64,
    ctime: i64,
    size: u64,
    nlink: u64,
    rdev: u64,
}

impl From<&Metadata> for Stat {
    fn from(m: &Metadata) -> Self {
        // Nanoseconds are below 10^9; a filesystem that said otherwise differs either way.
        let nsec = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
        Stat {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            mtime_nsec: nsec(m.mtime_nsec()),
            ctime_nsec: nsec(m.ctime_nsec()),
            mtime: m.mtime(),
            ctime: m.ctime(),
            size: m.size(),
            nlink: m.nlink(),
            rdev: m.rdev(),
        }
    }
}

const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFBLK: u32 = 0o060_000;

impl Stat {
    fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    fn is_file(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }

    fn is_device(&self) -> bool {
        matches!(self.mode & S_IFMT, S_IFCHR | S_IFBLK)
    }

    /// Whether the old volume's entry changed after `since` (seconds since the epoch): inode
    /// change time strictly later than `since`, as `find -newerct @since`.
    fn changed_after(&self, since: i64) -> bool {
        self.ctime > since || (self.ctime == since && self.ctime_nsec > 0)
    }

    /// Whether two entries differ in what a copy preserves and `lstat` shows (see the module):
    /// type and mode, owner, group, modification time, a device's number, and for all but
    /// directories size and link count (a directory's are its filesystem's).
    fn differs(&self, target: &Stat) -> bool {
        self.mode != target.mode
            || self.uid != target.uid
            || self.gid != target.gid
            || self.mtime != target.mtime
            || self.mtime_nsec != target.mtime_nsec
            || (!self.is_dir() && (self.size != target.size || self.nlink != target.nlink))
            || (self.is_device() && self.rdev != target.rdev)
    }
}

/// Lists what differs between `source` and `target` (see the module).
pub fn list(source: &Path, target: &Path, since: i64) -> Result<Listed, TreeDiffError> {
    let (s, t) = (lstat(source)?, lstat(target)?);
    let mut listed = Listed {
        source_entries: 1,
        ..Listed::default()
    };
    if s.differs(&t) || s.changed_after(since) {
        listed.push(Path::new(""), Some(&s));
    }
    let roots = Roots {
        source,
        target,
        since,
    };
    Ok(listed.merge(roots.directory(Path::new(""))?))
}

fn lstat(path: &Path) -> Result<Stat, TreeDiffError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(Stat::from(&m)),
        Ok(_) => Err(TreeDiffError::Read {
            path: path.to_owned(),
            source: std::io::Error::other("not a directory"),
        }),
        Err(source) => Err(TreeDiffError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

struct Roots<'a> {
    source: &'a Path,
    target: &'a Path,
    since: i64,
}

/// A directory's entries, sorted by name, each `lstat`ed (through the directory's descriptor).
fn entries(dir: &Path) -> Result<Vec<(OsString, Stat)>, TreeDiffError> {
    let read = |source| TreeDiffError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut all = Vec::new();
    for entry in read_dir(dir).map_err(read)? {
        let entry = entry.map_err(read)?;
        let meta = entry.metadata().map_err(|source| TreeDiffError::Read {
            path: entry.path(),
            source,
        })?;
        all.push((entry.file_name(), Stat::from(&meta)));
    }
    all.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(all)
}

impl Roots<'_> {
    /// Compares the directory `rel` of both trees (both exist as directories) and, in
    /// parallel, the subdirectories both have.
    fn directory(&self, rel: &Path) -> Result<Listed, TreeDiffError> {
        let sources = entries(&self.source.join(rel))?;
        let targets = entries(&self.target.join(rel))?;
        let mut listed = Listed {
            target_linked: targets
                .iter()
                .filter(|(_, m)| m.is_file() && m.nlink > 1)
                .count() as u64,
            ..Listed::default()
        };
        let mut both = Vec::new();
        let (mut s, mut t) = (sources.iter().peekable(), targets.iter().peekable());
        loop {
            let order = match (s.peek(), t.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(a), Some(b)) => a.0.as_bytes().cmp(b.0.as_bytes()),
            };
            match order {
                Ordering::Less => {
                    let Some((name, meta)) = s.next() else { break };
                    self.only_on_source(&rel.join(name), meta, &mut listed)?;
                }
                Ordering::Greater => {
                    let Some((name, _)) = t.next() else { break };
                    listed.push(&rel.join(name), None);
                }
                Ordering::Equal => {
                    let (Some((name, sm)), Some((_, tm))) = (s.next(), t.next()) else {
                        break;
                    };
                    let path = rel.join(name);
                    listed.source_entries += 1;
                    if sm.differs(tm) || sm.changed_after(self.since) {
                        listed.push(&path, Some(sm));
                    }
                    match (sm.is_dir(), tm.is_dir()) {
                        (true, true) => both.push(path),
                        (true, false) => self.subtree(&path, &mut listed)?,
                        _ => {}
                    }
                }
            }
        }
        let below = both
            .par_iter()
            .map(|path| self.directory(path))
            .try_reduce(Listed::default, |a, b| Ok(a.merge(b)))?;
        Ok(listed.merge(below))
    }

    /// An entry the new volume lacks: it, and for a directory every entry below it.
    fn only_on_source(
        &self,
        rel: &Path,
        meta: &Stat,
        listed: &mut Listed,
    ) -> Result<(), TreeDiffError> {
        listed.source_entries += 1;
        listed.push(rel, Some(meta));
        if meta.is_dir() {
            self.subtree(rel, listed)?;
        }
        Ok(())
    }

    /// Every entry below the old volume's directory `rel`.
    fn subtree(&self, rel: &Path, listed: &mut Listed) -> Result<(), TreeDiffError> {
        for (name, meta) in entries(&self.source.join(rel))? {
            self.only_on_source(&rel.join(name), &meta, listed)?;
        }
        Ok(())
    }
}

/// Writes the list NUL-separated (`rsync --from0`) to `path`.
pub fn write(listed: &Listed, path: &Path) -> Result<(), TreeDiffError> {
    let mut bytes = Vec::with_capacity(listed.paths.iter().map(|p| p.len() + 1).sum());
    for p in &listed.paths {
        bytes.extend_from_slice(p.as_bytes());
        bytes.push(0);
    }
    std::fs::write(path, bytes).map_err(|source| TreeDiffError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::process::Command;

    /// `source` filled by `fill`, copied to `target` by `cp -a` (times, modes, links kept).
    fn trees(fill: impl Fn(&Path)) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("source"), dir.path().join("target"));
        std::fs::create_dir(&src).unwrap();
        fill(&src);
        let ok = Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(&dst)
            .status()
            .unwrap();
        assert!(ok.success());
        (dir, src, dst)
    }

    fn sorted(listed: &Listed) -> Vec<String> {
        let mut all: Vec<String> = listed
            .paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        all.sort();
        all
    }

    /// Far in the future: no entry changed after it, only the metadata decides.
    const NEVER: i64 = i64::MAX / 2;

    fn tree(src: &Path) {
        std::fs::create_dir_all(src.join("dir/sub")).unwrap();
        for f in ["a", "b", "dir/c", "dir/sub/d"] {
            std::fs::write(src.join(f), f).unwrap();
        }
        std::fs::hard_link(src.join("a"), src.join("a-link")).unwrap();
        symlink("a", src.join("to-a")).unwrap();
    }

    #[test]
    fn equal_trees_list_nothing_and_count_every_entry() {
        let (_d, src, dst) = trees(tree);
        let listed = list(&src, &dst, NEVER).unwrap();
        assert_eq!(sorted(&listed), Vec::<String>::new());
        // The root, a, a-link, b, to-a, dir, dir/c, dir/sub, dir/sub/d.
        assert_eq!(listed.source_entries, 9);
        assert_eq!(listed.target_linked, 2, "a and a-link");
    }

    #[test]
    fn lists_what_differs_in_metadata_or_exists_on_one_side() {
        let (_d, src, dst) = trees(tree);
        std::fs::set_permissions(src.join("b"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(src.join("dir/c"), "longer content").unwrap();
        std::fs::write(src.join("new"), "new").unwrap();
        std::fs::create_dir_all(src.join("fresh/deeper")).unwrap();
        std::fs::write(src.join("fresh/deeper/e"), "e").unwrap();
        std::fs::remove_file(src.join("a-link")).unwrap();
        // A directory renamed: its files, unchanged, now live at a path the target lacks.
        std::fs::rename(src.join("dir/sub"), src.join("moved")).unwrap();
        // The root's mode.
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o750)).unwrap();
        let listed = list(&src, &dst, NEVER).unwrap();
        assert_eq!(
            sorted(&listed),
            [
                ".",
                "a",
                "a-link",
                "b",
                "dir",
                "dir/c",
                "dir/sub",
                "fresh",
                "fresh/deeper",
                "fresh/deeper/e",
                "moved",
                "moved/d",
                "new",
            ],
            "a: its link count; dir: its time (entries renamed out); a-link and dir/sub: gone"
        );
        // a, b, dir/c, fresh/deeper/e, moved/d, new.
        assert_eq!(listed.regular_files, 6);
    }

    #[test]
    fn lists_an_entry_replaced_by_one_of_another_type() {
        let (_d, src, dst) = trees(tree);
        std::fs::remove_file(src.join("b")).unwrap();
        std::fs::create_dir(src.join("b")).unwrap();
        std::fs::write(src.join("b/inside"), "x").unwrap();
        std::fs::remove_dir_all(src.join("dir")).unwrap();
        std::fs::write(src.join("dir"), "now a file").unwrap();
        let listed = list(&src, &dst, NEVER).unwrap();
        assert_eq!(sorted(&listed), [".", "b", "b/inside", "dir"]);
    }

    #[test]
    fn lists_entries_changed_after_since_even_with_equal_metadata() {
        let (_d, src, dst) = trees(tree);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Same size, time put back: only the inode change time tells.
        let mtime = std::fs::metadata(src.join("dir/c"))
            .unwrap()
            .modified()
            .unwrap();
        std::fs::write(src.join("dir/c"), "DIR/C").unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(src.join("dir/c"))
            .unwrap();
        f.set_modified(mtime).unwrap();
        // A mode changed and changed back (as an ACL or xattr change would leave it).
        let b = src.join("b");
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            sorted(&list(&src, &dst, NEVER).unwrap()),
            Vec::<String>::new(),
            "equal metadata"
        );
        assert_eq!(sorted(&list(&src, &dst, since).unwrap()), ["b", "dir/c"]);
    }

    #[test]
    fn a_tree_it_cannot_read_gives_no_list() {
        let dir = tempfile::tempdir().unwrap();
        let err = list(&dir.path().join("missing"), dir.path(), NEVER).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
