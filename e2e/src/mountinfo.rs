//! The `/proc/<pid>/mountinfo` format: one [`MountEntry`] per line, with the kernel's octal
//! escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash) undone.
//!
//! A line reads `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`;
//! the optional fields (`shared:1`, `master:2`, ...) end at the lone `-`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The mount table of the calling process's mount namespace.
pub const SELF: &str = "/proc/self/mountinfo";

/// One line of a mountinfo text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: String,
    pub parent_id: String,
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub options: String,
    /// Propagation fields before the `-` separator (`shared:N`, `master:N`, ...).
    pub optional_fields: Vec<String>,
    /// Empty when the line has no `-` separator.
    pub fs_type: String,
    /// Empty when the line has no `-` separator.
    pub source: String,
}

/// Undoes the octal escapes of a mountinfo field. A backslash not followed by three octal digits
/// of a byte value (at most `\377`) is kept as it is.
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if let Some(byte) = octal_escape(&b[i..]) {
            out.push(byte);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// The byte of an escape `\ooo` at the start of `b`, if there is one.
fn octal_escape(b: &[u8]) -> Option<u8> {
    let [b'\\', digits @ ..] = b.get(..4)? else {
        return None;
    };
    let mut value: u32 = 0;
    for d in digits {
        if !(b'0'..=b'7').contains(d) {
            return None;
        }
        value = value * 8 + u32::from(d - b'0');
    }
    u8::try_from(value).ok()
}

/// Parses one mountinfo line; `None` when it has fewer than the five fields up to the mount
/// point.
pub fn parse_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    let mount_id = fields.next()?.to_string();
    let parent_id = fields.next()?.to_string();
    let _device = fields.next()?;
    let root = unescape(fields.next()?);
    let mount_point = unescape(fields.next()?);
    let options = fields.next().unwrap_or_default().to_string();
    let optional_fields: Vec<String> = fields
        .by_ref()
        .take_while(|f| *f != "-")
        .map(str::to_string)
        .collect();
    let fs_type = fields.next().map(unescape_str).unwrap_or_default();
    let source = fields.next().map(unescape_str).unwrap_or_default();
    Some(MountEntry {
        mount_id,
        parent_id,
        root,
        mount_point,
        options,
        optional_fields,
        fs_type,
        source,
    })
}

fn unescape_str(field: &str) -> String {
    unescape(field).to_string_lossy().into_owned()
}

/// Every entry of a mountinfo text, in mount order.
pub fn parse(mountinfo: &str) -> Vec<MountEntry> {
    mountinfo.lines().filter_map(parse_line).collect()
}

/// The mount points of a mountinfo text, in mount order.
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    parse(mountinfo)
        .into_iter()
        .map(|m| m.mount_point)
        .collect()
}

/// The mount points at or under `dir` of a mountinfo text, in mount order.
pub fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mount_points(mountinfo)
        .into_iter()
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// The mount points of the calling process's mount namespace, in mount order.
pub fn self_mount_points() -> std::io::Result<Vec<PathBuf>> {
    Ok(mount_points(&std::fs::read_to_string(SELF)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_spaces_tabs_newlines_and_backslashes() {
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/a\\011b"), PathBuf::from("/a\tb"));
        assert_eq!(unescape("/a\\012b"), PathBuf::from("/a\nb"));
        assert_eq!(unescape("a\\134b"), PathBuf::from("a\\b"));
        assert_eq!(unescape("a\\134040"), PathBuf::from("a\\040"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape("/end\\040"), PathBuf::from("/end "));
        assert_eq!(unescape("a\\134b\\011"), PathBuf::from("a\\b\t"));
    }

    #[test]
    fn keeps_backslashes_that_are_not_escapes() {
        assert_eq!(unescape("tail\\04"), PathBuf::from("tail\\04"));
        assert_eq!(unescape("a\\08b"), PathBuf::from("a\\08b"));
        assert_eq!(unescape("a\\777"), PathBuf::from("a\\777"));
        assert_eq!(unescape("\\"), PathBuf::from("\\"));
    }

    #[test]
    fn unescapes_bytes_that_are_not_utf8() {
        assert_eq!(unescape("a\\377").as_os_str().as_bytes(), b"a\xff");
    }

    #[test]
    fn parses_optional_fields_before_the_separator() {
        let line = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue";
        let m = parse_line(line).unwrap();
        assert_eq!(m.mount_id, "36");
        assert_eq!(m.parent_id, "35");
        assert_eq!(m.root, PathBuf::from("/mnt1"));
        assert_eq!(m.mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m.options, "rw,noatime");
        assert_eq!(m.optional_fields, vec!["master:1", "shared:7"]);
        assert_eq!(m.fs_type, "ext3");
        assert_eq!(m.source, "/dev/root");
    }

    #[test]
    fn parses_lines_without_optional_fields() {
        let m = parse_line("37 35 7:0 / /s/vol rw - ext4 /dev/loop0 rw").unwrap();
        assert!(m.optional_fields.is_empty());
        assert_eq!(m.fs_type, "ext4");
        assert_eq!(m.source, "/dev/loop0");
    }

    #[test]
    fn short_lines_are_skipped_and_truncated_ones_kept() {
        assert_eq!(parse_line("1 2 3 /"), None);
        let m = parse_line("1 2 3:4 / /x").unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/x"));
        assert_eq!(m.fs_type, "");
    }

    #[test]
    fn lists_mount_points_in_order_and_under_a_dir() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 7:0 / /s/nodes/node-a/volumes/pvc-1 rw - ext4 /dev/loop0 rw\n\
                    38 35 0:5 / /s/tab\\011dir rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_points(text),
            vec![
                PathBuf::from("/mnt/with space"),
                PathBuf::from("/s/nodes/node-a/volumes/pvc-1"),
                PathBuf::from("/s/tab\tdir"),
            ]
        );
        assert_eq!(
            mount_points_under(text, Path::new("/s/nodes")),
            vec![PathBuf::from("/s/nodes/node-a/volumes/pvc-1")]
        );
        assert!(mount_points_under(text, Path::new("/s/node")).is_empty());
    }
}
