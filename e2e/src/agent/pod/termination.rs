//! Termination messages: the file each container may write, and the message read from it
//! (or from the log's tail) when the container ends.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Container;

use crate::agent::logs;
use crate::agent::pod::{
    DEFAULT_TERMINATION_MESSAGE_PATH, FALLBACK_LOG_BYTES, FALLBACK_LOG_LINES,
    TERMINATION_MESSAGE_MAX,
};

/// The file in the pod's dir that backs container `name`'s termination message.
pub(super) fn termination_file(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join("termination").join(name)
}

/// Creates (or empties) the termination message file, mode 0666 as the kubelet makes it, so a
/// container running as any user can write it.
pub(super) fn prepare_termination_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// Where the termination message file is mounted in the container: `terminationMessagePath`
/// (the API server defaults it to `/dev/termination-log`; so do we when it is unset or empty),
/// made absolute as the kubelet does (a leading `/` added). `None` for a path with `..`.
pub(super) fn termination_target(c: &Container) -> Option<PathBuf> {
    let path = c
        .termination_message_path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH);
    let path = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        PathBuf::from(format!("/{path}"))
    };
    (!path
        .components()
        .any(|c| c == std::path::Component::ParentDir))
    .then_some(path)
}

/// At most the last `max` bytes of a file (empty if it cannot be read), as the kubelet reads a
/// termination message.
fn read_tail(path: &Path, max: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let max = max as u64;
    if len > max && f.seek(SeekFrom::Start(len - max)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.take(max).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    buf
}

/// The termination message: the file's content (its last 4096 bytes), else
/// (FallbackToLogsOnError and a failure) the log's tail.
pub(super) fn termination_message(
    c: &Container,
    term_file: &Path,
    log: &Path,
    exit_code: i32,
) -> Option<String> {
    let mut msg = read_tail(term_file, TERMINATION_MESSAGE_MAX);
    if msg.is_empty()
        && exit_code != 0
        && c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
    {
        // The last 80 lines, at most 2048 bytes: the shorter of the two suffixes.
        let data = read_tail(log, FALLBACK_LOG_BYTES);
        msg = logs::tail_lines(&data, Some(FALLBACK_LOG_LINES)).to_vec();
    }
    (!msg.is_empty()).then(|| String::from_utf8_lossy(&msg).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    use k8s_openapi::api::core::v1::Container;

    use crate::agent::pod::{FALLBACK_LOG_BYTES, FALLBACK_LOG_LINES, TERMINATION_MESSAGE_MAX};

    #[test]
    fn termination_messages() {
        let dir = std::env::temp_dir().join(format!("sm-term-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let term = dir.join("term");
        let log = dir.join("log");
        std::fs::write(&term, "").unwrap();
        std::fs::write(&log, "l1\nl2\nboom\n").unwrap();
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert_eq!(termination_message(&c, &term, &log, 1), None);
        c.termination_message_policy = Some("FallbackToLogsOnError".into());
        assert_eq!(termination_message(&c, &term, &log, 0), None);
        assert_eq!(
            termination_message(&c, &term, &log, 1).as_deref(),
            Some("l1\nl2\nboom\n")
        );
        std::fs::write(&term, "bye").unwrap();
        assert_eq!(
            termination_message(&c, &term, &log, 1).as_deref(),
            Some("bye")
        );
        // Success with a message, and a missing file (no message, fallback when failed).
        assert_eq!(
            termination_message(&c, &term, &log, 0).as_deref(),
            Some("bye")
        );
        let missing = dir.join("missing");
        assert_eq!(termination_message(&c, &missing, &log, 0), None);
        assert_eq!(
            termination_message(&c, &missing, &log, 2).as_deref(),
            Some("l1\nl2\nboom\n")
        );
        // Only the end of the file counts (4096 bytes, as the kubelet reads it).
        let long = format!(
            "{}{}",
            "a".repeat(10_000),
            "b".repeat(TERMINATION_MESSAGE_MAX - 3)
        );
        std::fs::write(&term, format!("{long}end")).unwrap();
        let msg = termination_message(&c, &term, &log, 0).unwrap();
        assert_eq!(msg.len(), TERMINATION_MESSAGE_MAX);
        assert!(msg.starts_with("bbb") && msg.ends_with("bend"), "{msg}");
        // The log fallback: at most 80 lines and 2048 bytes of the log's end.
        std::fs::write(&term, "").unwrap();
        let lines: String = (0..200).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, &lines).unwrap();
        let msg = termination_message(&c, &term, &log, 1).unwrap();
        assert_eq!(msg.lines().count(), FALLBACK_LOG_LINES);
        assert!(
            msg.starts_with("line 120\n") && msg.ends_with("line 199\n"),
            "{msg}"
        );
        let wide: String = (0..50).map(|i| format!("{i:0>99}\n")).collect();
        std::fs::write(&log, &wide).unwrap();
        let msg = termination_message(&c, &term, &log, 1).unwrap();
        assert_eq!(msg.len(), FALLBACK_LOG_BYTES);
        assert!(msg.ends_with(&format!("{:0>99}\n", 49)), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn termination_message_targets() {
        let target = |path: Option<&str>| {
            termination_target(&Container {
                name: "c".into(),
                termination_message_path: path.map(String::from),
                ..Default::default()
            })
        };
        // The default lives in the container's private /dev: always mounted.
        assert_eq!(target(None), Some(PathBuf::from("/dev/termination-log")));
        assert_eq!(
            target(Some("")),
            Some(PathBuf::from("/dev/termination-log"))
        );
        assert_eq!(
            target(Some("/dev/termination-log")),
            Some(PathBuf::from("/dev/termination-log"))
        );
        assert_eq!(
            target(Some("/tmp/result.json")),
            Some(PathBuf::from("/tmp/result.json"))
        );
        // Relative paths are made absolute, as the kubelet does.
        assert_eq!(target(Some("var/msg")), Some(PathBuf::from("/var/msg")));
        assert_eq!(target(Some("/dev/../etc/passwd")), None);
    }

    #[test]
    fn termination_files_are_fresh_and_world_writable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sm-term-file-{}", std::process::id()));
        let file = termination_file(&dir, "copy");
        assert_eq!(file, dir.join("termination").join("copy"));
        prepare_termination_file(&file).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"");
        std::fs::write(&file, "from the last run").unwrap();
        prepare_termination_file(&file).unwrap();
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"",
            "emptied for the next run"
        );
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
