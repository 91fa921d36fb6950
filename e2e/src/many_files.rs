//! Millions of files (issue 30, item 4), for `bench-files`: what the copy scripts cost as the
//! number of files grows, on this machine, with no cluster.
//!
//! For each file count: two ext4 volumes like the local cluster's (image files, loop-mounted
//! under [`Options::dir`], sized so the default inode ratio holds the files), and on the source
//! that many files of 4 KiB in directories of 1,000. Then, with the very scripts the operator's
//! pods run ([`storage_migrator::build::job`], paths rewritten):
//!
//! 1. the pre-copy ([`PRECOPY_SCRIPT`], `cp -a` onto the empty target, with the planner's
//!    `ATTRS_MIN_ENTRIES`), from a cold page
//!    cache, started more than a minute after the files were written (so that, as on a volume
//!    in service, the verification's `SINCE` leaves the old files out);
//! 2. 1% of the files rewritten (every 100th, new content, same size);
//! 3. the final pass ([`COPY_SCRIPT`] with `VERIFY=1` and `SINCE` = the pre-copy's start less
//!    the operator's clock margin: the copy of what changed, then the `Changed` verification;
//!    and `ATTRS_SINCE`, the same, when the pre-copy reported that it compared every entry's
//!    ACLs and xattrs and there are at least `ATTRIBUTES_OF_CHANGED_MIN_ENTRIES` files, as the
//!    planner gives it),
//!    once with the page cache as the pre-copy left it (warm: the member stops right after its
//!    pre-copy) and once from a cold cache, each after its own 1% rewrite;
//! 4. in the same cache state as each final pass, one bare metadata walk of both trees
//!    (`find -printf` with a stat field: every entry `lstat`ed), the floor issue 30 compares the
//!    final pass with.
//!
//! The memory of each script is the peak of its memory cgroup's anonymous memory (`total_rss`
//! of cgroup v1, `anon` of cgroup v2; page cache is not counted: the kernel reclaims it under
//! a limit), sampled every 20 ms, with the cgroup's own peak including page cache beside it.
//!
//! Needs root (mount, drop_caches, cgroups), `mkfs.ext4`, `rsync`, GNU `cp` and `find`, and
//! `storage-migrator` built beside it (`cargo build --release --bins`: the final pass's
//! `tree-diff`). Not a
//! test: nothing is asserted.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::copy_speed::{
    CopySpeedError, drop_caches, flush, io, path_str, script_at, volume, volume_paths,
};
use crate::provisioner::destroy_volume;
use storage_migrator::build::job::ATTRIBUTES_OF_CHANGED_MIN_ENTRIES;
use storage_migrator::build::job::{COPY_SCRIPT, PRECOPY_SCRIPT};
use storage_migrator::plan::VERIFY_CLOCK_MARGIN_SECONDS;

/// Files per directory of the data set.
const PER_DIR: u64 = 1000;
/// Bytes of every file.
const FILE_BYTES: usize = 4096;

/// What to measure, and where.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the volume images and their mount points go (created; removed at the end).
    pub dir: PathBuf,
    /// The file counts, one measurement each.
    pub counts: Vec<u64>,
}

/// One script's run: how long, and its memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    pub took: Duration,
    /// Peak anonymous memory of the script's processes, bytes.
    pub anon_peak: u64,
    /// The cgroup's own peak, page cache included, bytes.
    pub cgroup_peak: u64,
}

/// Every number of one file count.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub files: u64,
    pub fill: Duration,
    pub pre_copy: Run,
    pub changed: u64,
    pub final_warm: Run,
    pub walk_warm: Duration,
    pub final_cold: Run,
    pub walk_cold: Duration,
    /// The final pass's result line (its JSON), warm run.
    pub final_result: String,
}

/// Measures every count in turn; the volumes are removed whatever happened.
pub fn bench(o: &Options) -> Result<Vec<Measured>, CopySpeedError> {
    let mut all = Vec::new();
    for &files in &o.counts {
        let outcome = measure_count(&o.dir, files);
        for name in ["source", "target"] {
            let (image, mount) = volume_paths(&o.dir, name);
            if let Err(e) = destroy_volume(&image, &mount) {
                eprintln!("cannot remove volume {}: {e}", image.display());
            }
        }
        all.push(outcome?);
    }
    let _ = std::fs::remove_dir_all(&o.dir);
    Ok(all)
}

/// GiB of each volume: the default ext4 ratio gives one inode per 16 KiB, plus a fifth and at
/// least 2 GiB (the images are sparse).
fn volume_gib(files: u64) -> u64 {
    (files * 16 * 1024 * 6 / 5).div_ceil(1 << 30).max(2)
}

fn measure_count(dir: &Path, files: u64) -> Result<Measured, CopySpeedError> {
    std::fs::create_dir_all(dir).map_err(io(dir.display().to_string()))?;
    let gib = volume_gib(files);
    let source = volume(dir, "source", gib)?;
    let target = volume(dir, "target", gib)?;
    let scratch = dir.join("termination-log");
    eprintln!(
        "{files} files: filling {} ({gib} GiB volumes)",
        source.display()
    );
    let started = Instant::now();
    fill(&source, files, 0)?;
    flush(&source)?;
    let fill = started.elapsed();
    let filled_at = epoch_seconds();
    // As on a volume in service: the files are older than the verification's margin.
    while epoch_seconds() <= filled_at + VERIFY_CLOCK_MARGIN_SECONDS {
        std::thread::sleep(Duration::from_millis(500));
    }
    drop_caches()?;
    let since = epoch_seconds() - VERIFY_CLOCK_MARGIN_SECONDS;
    let min = ATTRIBUTES_OF_CHANGED_MIN_ENTRIES.to_string();
    let pre_env = [("ATTRS_MIN_ENTRIES", min.as_str())];
    let pre_copy = script_run(PRECOPY_SCRIPT, &source, &target, &scratch, &pre_env, files)?;
    // As the planner does: the final pass compares the ACLs and xattrs of what changed only
    // after a pre-copy that compared every entry's, on a volume of many files.
    let compared = std::fs::read_to_string(&scratch)
        .is_ok_and(|r| r.contains(r#""attributesCompared":"All""#))
        && i64::try_from(files).is_ok_and(|n| n >= ATTRIBUTES_OF_CHANGED_MIN_ENTRIES);
    flush(&target)?;
    eprintln!(
        "  pre-copy {:.2}s (the final pass compares the ACLs and xattrs of what changed only: {compared})",
        pre_copy.took.as_secs_f64()
    );
    let since = since.to_string();
    let mut env = vec![("VERIFY", "1"), ("SINCE", since.as_str())];
    if compared {
        env.push(("ATTRS_SINCE", since.as_str()));
    }
    let changed = rewrite_every_hundredth(&source, files, 1)?;
    let final_warm = script_run(COPY_SCRIPT, &source, &target, &scratch, &env, files)?;
    let final_result = std::fs::read_to_string(&scratch).unwrap_or_default();
    let walk_warm = walk(&source, &target)?;
    eprintln!(
        "  warm: final pass {:.2}s, walk {:.2}s",
        final_warm.took.as_secs_f64(),
        walk_warm.as_secs_f64()
    );
    rewrite_every_hundredth(&source, files, 2)?;
    flush(&source)?;
    drop_caches()?;
    let final_cold = script_run(COPY_SCRIPT, &source, &target, &scratch, &env, files)?;
    drop_caches()?;
    let walk_cold = walk(&source, &target)?;
    eprintln!(
        "  cold: final pass {:.2}s, walk {:.2}s",
        final_cold.took.as_secs_f64(),
        walk_cold.as_secs_f64()
    );
    Ok(Measured {
        files,
        fill,
        pre_copy,
        changed,
        final_warm,
        walk_warm,
        final_cold,
        walk_cold,
        final_result,
    })
}

fn epoch_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

fn file_path(root: &Path, i: u64) -> PathBuf {
    root.join(format!("d{:05}", i / PER_DIR))
        .join(format!("f{:04}", i % PER_DIR))
}

/// 4 KiB of content that differs by file and by `round`.
fn content(i: u64, round: u64) -> Vec<u8> {
    let seed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..FILE_BYTES as u64)
        .map(|k| (seed.rotate_left((k % 64) as u32) ^ k) as u8)
        .collect()
}

/// `files` files of 4 KiB under `root`, in directories of [`PER_DIR`].
fn fill(root: &Path, files: u64, round: u64) -> Result<(), CopySpeedError> {
    for i in 0..files {
        let path = file_path(root, i);
        if i % PER_DIR == 0
            && let Some(parent) = path.parent()
        {
            std::fs::create_dir_all(parent).map_err(io(parent.display().to_string()))?;
        }
        std::fs::write(&path, content(i, round)).map_err(io(path.display().to_string()))?;
    }
    Ok(())
}

/// Rewrites every 100th file with the content of `round`; returns how many.
fn rewrite_every_hundredth(root: &Path, files: u64, round: u64) -> Result<u64, CopySpeedError> {
    let mut n = 0;
    for i in (0..files).step_by(100) {
        let path = file_path(root, i);
        std::fs::write(&path, content(i, round)).map_err(io(path.display().to_string()))?;
        n += 1;
    }
    Ok(n)
}

/// One bare metadata walk of both trees: every entry `lstat`ed (`%s`, `%T@`), nothing kept.
fn walk(source: &Path, target: &Path) -> Result<Duration, CopySpeedError> {
    let started = Instant::now();
    let status = Command::new("find")
        .args([&path_str(source), &path_str(target), "-printf", "%s %T@\n"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|source| CopySpeedError::Spawn {
            program: "find".into(),
            source,
        })?;
    if !status.success() {
        return Err(CopySpeedError::Failed {
            what: "find (the bare walk)".into(),
            status: status.to_string(),
            stderr: String::new(),
        });
    }
    Ok(started.elapsed())
}

/// A memory cgroup of its own for one script (v1 `memory` controller, else v2), removed on drop.
struct Cgroup {
    dir: PathBuf,
    anon_key: &'static str,
    peak_file: &'static str,
}

impl Cgroup {
    fn new(name: &str) -> Result<Self, CopySpeedError> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (base, anon_key, peak_file) = if v1.join("memory.stat").exists() {
            (v1, "total_rss", "memory.max_usage_in_bytes")
        } else {
            (Path::new("/sys/fs/cgroup"), "anon", "memory.peak")
        };
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        Ok(Self {
            dir,
            anon_key,
            peak_file,
        })
    }

    fn anon(&self) -> u64 {
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap_or_default();
        stat.lines()
            .find_map(|l| l.strip_prefix(self.anon_key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    fn peak(&self) -> u64 {
        std::fs::read_to_string(self.dir.join(self.peak_file))
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Runs `script` (paths rewritten to `source`, `target`, `scratch`) in a cgroup of its own,
/// with `env` and `FIRST_PASS_TOOL=Cp`; its time and memory.
fn script_run(
    script: &str,
    source: &Path,
    target: &Path,
    scratch: &Path,
    env: &[(&str, &str)],
    files: u64,
) -> Result<Run, CopySpeedError> {
    let script = script_at(script, source, target, scratch);
    let list_dir = scratch.with_extension("scratch");
    std::fs::create_dir_all(&list_dir).map_err(io(list_dir.display().to_string()))?;
    let path = operator_first_on_path()?;
    let cg = Arc::new(Cgroup::new(&format!(
        "bench-files-{files}-{}",
        std::process::id()
    ))?);
    let procs = path_str(&cg.dir.join("cgroup.procs"));
    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (cg, peak, done) = (cg.clone(), peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(cg.anon(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    // The wrapper joins the cgroup, then becomes the script: `$1` and `$2` are arguments.
    let out = Command::new("sh")
        .args([
            "-c",
            r#"echo $$ > "$1" && exec sh -c "$2""#,
            "sh",
            &procs,
            &script,
        ])
        .envs(env.iter().copied())
        .env("FIRST_PASS_TOOL", "Cp")
        .env("LC_ALL", "C")
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output();
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let out = out.map_err(|source| CopySpeedError::Spawn {
        program: "sh".into(),
        source,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        return Err(CopySpeedError::Failed {
            what: "the copy script".into(),
            status: out.status.to_string(),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(Run {
        took,
        anon_peak: peak.load(Ordering::Relaxed),
        cgroup_peak: cg.peak(),
    })
}

/// `PATH` with the operator's binary's directory first: the final pass runs `storage-migrator
/// tree-diff`, as in the operator's image. The binary is `STORAGE_MIGRATOR_BIN` when set (as
/// `bench-cost.sh` sets it, to the release build), else the one beside this program, where
/// `cargo build --release --bins` puts it. An error when it is not there: the pass would walk
/// the whole tree instead.
fn operator_first_on_path() -> Result<String, CopySpeedError> {
    let bin = match std::env::var_os("STORAGE_MIGRATOR_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => {
            let exe = std::env::current_exe().map_err(io("this program's path"))?;
            exe.with_file_name("storage-migrator")
        }
    };
    let not_usable = |why: &str| {
        CopySpeedError::Io(
            bin.display().to_string(),
            std::io::Error::other(why.to_string()),
        )
    };
    if bin.file_name() != Some(std::ffi::OsStr::new("storage-migrator")) {
        return Err(not_usable(
            "the script runs `storage-migrator tree-diff`: the binary must be named storage-migrator",
        ));
    }
    if !bin.is_file() {
        return Err(not_usable(
            "not built: run cargo build --release --bins first",
        ));
    }
    let dir = bin.parent().unwrap_or(Path::new("."));
    Ok(format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    ))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// The Markdown table of every count.
pub fn table(all: &[Measured]) -> String {
    let mut out = String::from(
        "\n| files | pre-copy s | pre-copy memory MiB | changed | final pass, warm s | walk of both trees, warm s | final − walk, warm s | final pass, cold s | walk, cold s | final − walk, cold s | final pass memory MiB (page cache incl.) | bytes of memory a file |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for m in all {
        let memory = m.final_warm.anon_peak.max(m.final_cold.anon_peak);
        let cache = m.final_warm.cgroup_peak.max(m.final_cold.cgroup_peak);
        out.push_str(&format!(
            "| {} | {:.2} | {:.1} | {} | {:.2} | {:.2} | {:+.2} | {:.2} | {:.2} | {:+.2} | {:.1} ({:.0}) | {:.0} |\n",
            m.files,
            m.pre_copy.took.as_secs_f64(),
            mib(m.pre_copy.anon_peak),
            m.changed,
            m.final_warm.took.as_secs_f64(),
            m.walk_warm.as_secs_f64(),
            m.final_warm.took.as_secs_f64() - m.walk_warm.as_secs_f64(),
            m.final_cold.took.as_secs_f64(),
            m.walk_cold.as_secs_f64(),
            m.final_cold.took.as_secs_f64() - m.walk_cold.as_secs_f64(),
            mib(memory),
            mib(cache),
            memory as f64 / m.files.max(1) as f64,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_hold_the_files_at_the_default_inode_ratio() {
        assert_eq!(volume_gib(10_000), 2);
        // 1,000,000 inodes at 16 KiB each are 15.3 GiB; a fifth more.
        assert_eq!(volume_gib(1_000_000), 19);
        assert!(volume_gib(300_000) << 30 >= 300_000 * 16 * 1024);
    }

    #[test]
    fn paths_and_contents_differ_by_file_and_round() {
        let root = Path::new("/v");
        assert_eq!(file_path(root, 1234), Path::new("/v/d00001/f0234"));
        assert_ne!(content(1, 0), content(2, 0));
        assert_ne!(content(1, 0), content(1, 1));
        assert_eq!(content(7, 3).len(), FILE_BYTES);
    }
}
