//! The pre-copy's speed against `cp -a` on the same volumes (issue 10, target 6: "copies at
//! disk speed", 0.95× of `cp -a` or better), for `bench-copy` and `bench-migration --workloads
//! copy`.
//!
//! Two ext4 volumes like the local cluster's (image files, loop-mounted: [`Options::dir`] holds
//! them), and two data sets on the source: 1 GiB in 4 files of 256 MiB (incompressible), and
//! 100,000 files of 4 KiB in 100 directories. For each set, [`Options::runs`] times, each tool
//! copies the set onto the emptied target from a cold page cache (flushed, then
//! `drop_caches`), and the time includes a final flush (`sync -f` of the target, then `sync`),
//! so every byte is on the target's disk:
//!
//! - `cp -a` (the floor);
//! - the pre-copy: the very script the operator's pre-copy pod runs
//!   ([`storage_migrator::build::job::PRECOPY_SCRIPT`], paths rewritten), with its progress:
//!   `cp -a` onto the empty target (`firstPassTool: Cp`, the default), and rsync
//!   (`firstPassTool: Rsync`);
//! - `rsync -aHAXS --numeric-ids`, plain (what the issue measured at 0.77×);
//! - `rsync -a --whole-file --numeric-ids --no-inc-recursive`, without hard links, ACLs,
//!   xattrs and sparse handling: what those preservations cost.
//!
//! [`bench`] returns Markdown tables (median, fastest and slowest run, MiB/s, speed against
//! `cp -a`); needs root (mount, drop_caches), `mkfs.ext4`, `rsync` and `cp`. Not a test:
//! nothing is asserted.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::provisioner::{ProvisionerError, create_image, destroy_volume, mount_image};
use storage_migrator::build::job::{
    PRECOPY_SCRIPT, SCRATCH_PATH, SOURCE_PATH, TARGET_PATH, TERMINATION_MESSAGE_PATH,
};

/// Where and how often.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the volume images and their mount points go (created; removed at the end).
    pub dir: PathBuf,
    /// Copies of each set by each tool; the tables show the median.
    pub runs: usize,
    /// Size of each volume image, GiB.
    pub volume_gib: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CopySpeedError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{what} failed ({status}): {stderr}")]
    Failed {
        what: String,
        status: String,
        stderr: String,
    },
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Volume(#[from] ProvisionerError),
}

/// Runs `program args` to its end; an error names it with its stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<(), CopySpeedError> {
    run_with(program, args, &[])
}

/// [`run`] with these environment variables as well.
fn run_with(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), CopySpeedError> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|source| CopySpeedError::Spawn {
            program: program.to_string(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(CopySpeedError::Failed {
        what: format!("{program} {}", args.join(" ")),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CopySpeedError {
    let what = what.into();
    move |e| CopySpeedError::Io(what, e)
}

/// A fresh ext4 image of `gib` GiB at `dir/NAME.img`, loop-mounted at `dir/NAME`: the local
/// cluster's provisioner makes and mounts its volumes the same way.
pub(crate) fn volume(dir: &Path, name: &str, gib: u64) -> Result<PathBuf, CopySpeedError> {
    let (image, mount) = volume_paths(dir, name);
    create_image(&image, gib << 30)?;
    mount_image(&image, &mount)?;
    Ok(mount)
}

pub(crate) fn volume_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.img")), dir.join(name))
}

pub(crate) fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// One of the operator's copy scripts with its paths rewritten to `source`, `target` and the
/// result file `scratch`. One pass per path: each replacement's result is not searched again.
pub(crate) fn script_at(script: &str, source: &Path, target: &Path, scratch: &Path) -> String {
    let list_dir = scratch.with_extension("scratch");
    script
        .replace(SOURCE_PATH, &path_str(source))
        .replace(TARGET_PATH, &path_str(target))
        .replace(SCRATCH_PATH, &path_str(&list_dir))
        .replace(TERMINATION_MESSAGE_PATH, &path_str(scratch))
}

/// Writes back every dirty page, then drops the page cache: the next read comes from disk.
pub(crate) fn drop_caches() -> Result<(), CopySpeedError> {
    run("sync", &[])?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(io("drop_caches"))
}

/// The data sets: `big` (4 × 256 MiB from /dev/urandom) and `small` (100 × 1,000 files of
/// 4 KiB), each in its own directory of the source.
fn fill(source: &Path) -> Result<(), CopySpeedError> {
    let big = source.join("big");
    std::fs::create_dir_all(&big).map_err(io("big"))?;
    for i in 0..4 {
        let of = format!("of={}", path_str(&big.join(format!("file-{i}"))));
        run(
            "dd",
            &["if=/dev/urandom", &of, "bs=1M", "count=256", "status=none"],
        )?;
    }
    let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    for d in 0..100 {
        let dir = source.join("small").join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        for f in 0..1000 {
            let path = dir.join(format!("f{f:04}"));
            std::fs::write(&path, &block).map_err(io(path.display().to_string()))?;
        }
    }
    run("sync", &[])
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tool {
    Cp,
    PreCopy,
    PreCopyRsync,
    RsyncPlain,
    RsyncBare,
}

impl Tool {
    const ALL: [Tool; 5] = [
        Tool::Cp,
        Tool::PreCopy,
        Tool::PreCopyRsync,
        Tool::RsyncPlain,
        Tool::RsyncBare,
    ];

    fn label(self) -> &'static str {
        match self {
            Tool::Cp => "cp -a",
            Tool::PreCopy => "pre-copy (the operator's script: cp -a onto the empty target)",
            Tool::PreCopyRsync => "pre-copy with firstPassTool: Rsync",
            Tool::RsyncPlain => "rsync -aHAXS --numeric-ids",
            Tool::RsyncBare => "rsync -a --whole-file --numeric-ids --no-inc-recursive",
        }
    }

    /// Copies `from/` into the empty `to/`.
    fn copy(self, from: &Path, to: &Path, scratch: &Path) -> Result<(), CopySpeedError> {
        let (src, dst) = (format!("{}/", path_str(from)), format!("{}/", path_str(to)));
        match self {
            Tool::Cp => run("cp", &["-a", &format!("{}/.", path_str(from)), &dst]),
            Tool::RsyncPlain => run("rsync", &["-aHAXS", "--numeric-ids", &src, &dst]),
            Tool::RsyncBare => run(
                "rsync",
                &[
                    "-a",
                    "--whole-file",
                    "--numeric-ids",
                    "--no-inc-recursive",
                    &src,
                    &dst,
                ],
            ),
            Tool::PreCopy | Tool::PreCopyRsync => {
                let script = script_at(PRECOPY_SCRIPT, from, to, scratch);
                let tool = if self == Tool::PreCopy { "Cp" } else { "Rsync" };
                run_with("sh", &["-c", &script], &[("FIRST_PASS_TOOL", tool)])?;
                // Which way it copied, from its result.
                let result = std::fs::read_to_string(scratch).unwrap_or_default();
                let mode = result.split("\"mode\":").nth(1).unwrap_or("?");
                eprintln!(
                    "  {}: mode {}",
                    self.label(),
                    mode.split(',').next().unwrap_or("?")
                );
                Ok(())
            }
        }
    }
}

/// Empties `target` (its data set directory), cold caches, then times one copy and its `sync`.
fn timed_copy(
    tool: Tool,
    from: &Path,
    to: &Path,
    scratch: &Path,
) -> Result<Duration, CopySpeedError> {
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(io(to.display().to_string()))?;
    }
    std::fs::create_dir_all(to).map_err(io(to.display().to_string()))?;
    flush(to)?;
    drop_caches()?;
    let started = Instant::now();
    tool.copy(from, to, scratch)?;
    flush(to)?;
    Ok(started.elapsed())
}

/// Every byte written to `dir`'s loop-mounted volume on the disk: the volume's filesystem first
/// (`sync -f`, into its image file), then every filesystem (the image file's). A plain `sync`
/// may flush the host's filesystem before the volume's writes reach it, and leave them to be
/// written back during the next tool's copy.
pub(crate) fn flush(dir: &Path) -> Result<(), CopySpeedError> {
    run("sync", &["-f", &path_str(dir)])?;
    run("sync", &[])
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs.get(xs.len() / 2).copied().unwrap_or_default()
}

/// One data set: every tool `runs` times, in turn, so that a slow spell of the machine falls on
/// all of them. Returns each tool's times.
fn bench_set(
    set: &str,
    source: &Path,
    target: &Path,
    scratch: &Path,
    runs: usize,
) -> Result<Vec<(Tool, Vec<Duration>)>, CopySpeedError> {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); Tool::ALL.len()];
    for round in 0..runs {
        for (i, tool) in Tool::ALL.iter().enumerate() {
            let took = timed_copy(*tool, &source.join(set), &target.join(set), scratch)?;
            eprintln!(
                "{set} round {round}: {} {:.2}s",
                tool.label(),
                took.as_secs_f64()
            );
            times[i].push(took);
        }
    }
    Ok(Tool::ALL.iter().copied().zip(times).collect())
}

/// One data set's Markdown table: each tool's median, its fastest and slowest run, and its
/// speed against `cp -a`'s median.
fn table(title: &str, mib: f64, results: &[(Tool, Vec<Duration>)]) -> String {
    let cp = results
        .iter()
        .find(|(t, _)| *t == Tool::Cp)
        .map(|(_, xs)| median(xs.clone()).as_secs_f64())
        .unwrap_or(f64::NAN);
    let mut out = format!(
        "\n{title}\n\n| tool | median s | runs s | MiB/s | speed against cp -a |\n| --- | --- | --- | --- | --- |\n"
    );
    for (tool, xs) in results {
        let s = median(xs.clone()).as_secs_f64();
        let min = xs.iter().min().copied().unwrap_or_default().as_secs_f64();
        let max = xs.iter().max().copied().unwrap_or_default().as_secs_f64();
        out.push_str(&format!(
            "| {} | {s:.2} | {min:.2}–{max:.2} | {:.0} | {:.2}x |\n",
            tool.label(),
            mib / s,
            cp / s
        ));
    }
    out
}

/// Makes the volumes, fills the source, times every tool on both sets and returns the tables;
/// the volumes and `dir` are removed whatever happened.
pub fn bench(o: &Options) -> Result<String, CopySpeedError> {
    let outcome = bench_on_volumes(o);
    for name in ["source", "target"] {
        let (image, mount) = volume_paths(&o.dir, name);
        if let Err(e) = destroy_volume(&image, &mount) {
            eprintln!("cannot remove volume {}: {e}", image.display());
        }
    }
    let _ = std::fs::remove_dir_all(&o.dir);
    outcome
}

fn bench_on_volumes(o: &Options) -> Result<String, CopySpeedError> {
    std::fs::create_dir_all(&o.dir).map_err(io(o.dir.display().to_string()))?;
    let source = volume(&o.dir, "source", o.volume_gib)?;
    let target = volume(&o.dir, "target", o.volume_gib)?;
    let scratch = o.dir.join("termination-log");
    eprintln!("filling {}", source.display());
    fill(&source)?;
    let sets = [
        ("big", "1 GiB in 4 files", 1024.0),
        ("small", "100,000 files of 4 KiB", 100_000.0 * 4.0 / 1024.0),
    ];
    let mut out = format!(
        "bench-copy: ext4 on loop devices, cold page cache, {} runs, median\n",
        o.runs
    );
    for (dir, title, mib) in sets {
        let results = bench_set(dir, &source, &target, &scratch, o.runs)?;
        out.push_str(&table(title, mib, &results));
    }
    Ok(out)
}
