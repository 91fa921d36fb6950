//! The Jobs that measure, copy and verify a member's data, and the parsing of their results.
//!
//! Every Job runs one constant shell script (never built from names or input) in the mover
//! image, with the member's old claim at `/source` (read-only) and, except for `Measure`, the
//! temporary claim at `/target`. Each script writes its result as one line of JSON to the
//! container's termination message, which the cluster layer reads from the Job's pod status and
//! hands to [`parse_job_result`]: no log scraping, no exec.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, ResourceRequirements, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::api::{ClaimStatus, FirstPassTool, PlannedMember, StorageMigrationRequest};
use crate::image::ImageRef;
use crate::labels::JOB_KIND_LABEL;

use super::{BuildError, job_name, member_meta, pinned_to_node, req_name, security, tolerate_all};

/// Name of the single container of every Job's pod.
pub const JOB_CONTAINER: &str = "mover";
/// Where the old claim is mounted (read-only).
pub const SOURCE_PATH: &str = "/source";
/// Where the temporary claim is mounted.
pub const TARGET_PATH: &str = "/target";
/// Where the scripts write their one-line JSON result.
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// The final pass's scratch directory (an `emptyDir`): the list of what it copies.
pub const SCRATCH_PATH: &str = "/scratch";

/// What a Job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobKind {
    /// Measure the bytes in use on the old volume (Shrink preflight).
    Measure,
    /// First rsync pass while the member still serves.
    PreCopy,
    /// Final rsync pass while the member is stopped.
    Copy,
    /// Checksum comparison of source and target after the final pass.
    Verify,
}

impl JobKind {
    /// The kind as used in names and the [`JOB_KIND_LABEL`].
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Measure => "measure",
            JobKind::PreCopy => "precopy",
            JobKind::Copy => "copy",
            JobKind::Verify => "verify",
        }
    }

    /// The constant script this kind runs (`sh -c SCRIPT`).
    pub fn script(self) -> &'static str {
        match self {
            JobKind::Measure => MEASURE_SCRIPT,
            JobKind::PreCopy => PRECOPY_SCRIPT,
            JobKind::Copy => COPY_SCRIPT,
            JobKind::Verify => VERIFY_SCRIPT,
        }
    }

    /// Whether the Job mounts the temporary claim at [`TARGET_PATH`].
    pub fn mounts_target(self) -> bool {
        self != JobKind::Measure
    }

    /// Whether the Job writes the temporary claim (else every mount is read-only).
    pub fn writes_target(self) -> bool {
        matches!(self, JobKind::PreCopy | JobKind::Copy)
    }

    /// The capabilities its container adds (after dropping all): what rsync needs to write a
    /// tree of files of every owner, or only to read one (see [`super::security`]).
    pub fn capabilities(self) -> &'static [&'static str] {
        if self.writes_target() {
            &security::COPY_CAPABILITIES
        } else {
            &security::READ_CAPABILITIES
        }
    }
}

/// `stat -f` format of a volume's `statfs` as the JSON of [`FsReport`].
macro_rules! statfs_format {
    () => {
        r#"{"type":"%T","blockSize":%S,"blocks":%b,"blocksFree":%f,"blocksAvailable":%a,"inodes":%c,"inodesFree":%d}"#
    };
}

/// The rsync pass, with the exit codes it accepts (`$ok`, space-separated and padded), after
/// `$mode`, which sets `mode`, `delta`, `cap` and `copied` (non-empty when [`kernel_copy!`]
/// already copied the tree: rsync is skipped).
///
/// `-aHAXS --numeric-ids --delete` keeps hard links, ACLs, xattrs, sparse files and numeric
/// owners (names would be remapped through the mover image's /etc/passwd) and removes what no
/// longer exists on the source. `--modify-window=-1` makes rsync's quick check compare
/// modification times to the nanosecond: by default it compares whole seconds, so a file that a
/// member rewrote within the second after the pre-copy, at the same size (etcd preallocates its
/// WAL segments), would be skipped by the final pass.
///
/// Progress: `--info=progress2` reports the whole transfer (bytes, percent, rate, files) and
/// `--no-inc-recursive` lets rsync know the whole tree before it starts, so its percentage is
/// of the whole tree (the price: the whole file list in memory at once, 136 bytes a file
/// measured at a million files; the pods after the pre-copy get memory for it,
/// [`copy_memory`]). rsync separates its updates with carriage returns; `tr` turns them into
/// lines, line-buffered by `stdbuf` where the image has it (without it the lines come in blocks
/// of 4 KiB), and `sed -u` writes every line to the log (`w /dev/stderr`, which GNU sed and
/// busybox sed write without opening a file) while passing on only the lines without a `%` (the
/// summary and the exit code) and the last progress line (held, printed after the last line) to
/// `$out`. So `kubectl logs -f` shows the copy live and the
/// operator reads the tail of the log (`build::progress`). rsync's exit code travels as the last
/// line, `rc=N` (a plain `sh` has no `pipefail`).
///
/// The stats are parsed into `{"bytes","files","totalBytes"}`; rsync groups digits with `,`
/// (C locale), hence the `tr`.
///
/// Durable before it reports: once rsync succeeded, the pass flushes the target's filesystem
/// (`sync -f`, syncfs; plain `sync` where that is refused). After the final pass the claims are
/// swapped and the member starts on the copy, so a node that crashed a moment later must not
/// leave it a copy still in the page cache; after the pre-copy, the gigabytes it wrote are
/// written back while the member still serves, not while it is stopped (its stop waited behind
/// that writeback: 1 s more downtime for a member stopped right after a 4 GiB pre-copy).
///
/// Out of space: when rsync fails and its output says `No space left on device` (ENOSPC, also
/// what a filesystem out of inodes returns), the result says so, `"cause":"NoSpace"`, with the
/// bytes its last progress line had dealt with (`bytes`), the bytes now allocated on the source
/// (`usedBytes`, `du` as at preflight) and the target's `statfs` (`targetFilesystem`): the
/// planner quotes them ([`JobFailureCause::NoSpace`]). The `sed` passes that line on even when
/// it holds a `%` (a file name).
macro_rules! rsync_copy_script {
    ($ok:literal, $mode:expr, $after:expr, $tail:expr) => {
        concat!(
            "set -u\nok=' ",
            $ok,
            " '\n",
            $mode,
            r#"
if [ -z "$copied" ] || [ -n "$recheck" ]; then
lb=
if command -v stdbuf >/dev/null 2>&1; then lb='stdbuf -oL'; fi
info='--info=progress2 --no-inc-recursive'
if [ -n "$copied" ]; then info=; fi
out=$( { rsync -aHS $attrs $delta $cap $select --numeric-ids --delete --modify-window=-1 $info --stats /source/ /target/ 2>&1; echo "rc=$?"; } | $lb tr '\r' '\n' | sed -u -n -e 'w /dev/stderr' -e '/No space left on device/{p;d;}' -e '/%/{h;d;}' -e p -e '${x;p;}')
rc=$(printf '%s\n' "$out" | sed -n 's/^rc=\([0-9][0-9]*\)$/\1/p' | tail -n 1)
rc=${rc:-1}
case "$ok" in
*" $rc "*) ;;
*)
  case "$out" in
  *"No space left on device"*)
    used=$(du -s -B1 /source 2>/dev/null) || used=""
    used=${used%%[!0-9]*}
    done=$(printf '%s\n' "$out" | sed -n 's/^ *\([0-9][0-9,]*\)  *[0-9][0-9]*%.*/\1/p' | tail -n 1 | tr -d ',')
    fs=$(stat -f -c '"#,
            statfs_format!(),
            r#"' /target 2>/dev/null) || fs=""
    printf '{"error":"rsync exited with %d: no space left on the target","exitCode":%d,"cause":"NoSpace"%s%s%s}' "$rc" "$rc" "${done:+,\"bytes\":$done}" "${used:+,\"usedBytes\":$used}" "${fs:+,\"targetFilesystem\":$fs}" > /dev/termination-log
    echo "rsync failed with exit code $rc: no space left on the target" >&2
    ;;
  *)
    printf '{"error":"rsync exited with %d","exitCode":%d}' "$rc" "$rc" > /dev/termination-log
    echo "rsync failed with exit code $rc" >&2
    ;;
  esac
  exit "$rc"
  ;;
esac
field() {
  printf '%s\n' "$out" | sed -n "s/^$1: *\([0-9][0-9,.]*\).*/\1/p" | tr -d ',.'
}
moved=$(field 'Number of regular files transferred')
[ -n "$moved" ] || moved=$(field 'Number of files transferred')
if [ -z "$copied" ]; then
bytes=$(field 'Total transferred file size')
total=$(field 'Total file size')
literal=$(field 'Literal data')
files=$moved
else
echo "rsync after cp compared every entry, ACLs and xattrs included, and copied ${moved:-0} files again" >&2
fi
fi
"#,
            $after,
            r#"
sync -f /target 2>/dev/null || sync
fs=$(stat -f -c '"#,
            statfs_format!(),
            r#"' /target 2>/dev/null) || fs=""
sfs=$(stat -f -c '"#,
            statfs_format!(),
            r#"' /source 2>/dev/null) || sfs=""
result=$(printf '{"bytes":%s,"files":%s,"totalBytes":%s,"literalBytes":%s,"mode":"%s","attributesCompared":"%s","exitCode":%d%s%s%s}' "${bytes:-0}" "${files:-0}" "${total:-0}" "${literal:-0}" "$mode" "$ascope" "$rc" "${lcount:+,\"listedEntries\":$lcount}" "${fs:+,\"targetFilesystem\":$fs}" "${sfs:+,\"sourceFilesystem\":$sfs}")
"#,
            $tail
        )
    };
}

/// The end of a script: its result to the log and the termination message.
macro_rules! write_result {
    () => {
        r#"printf '%s\n' "$result"
printf '%s' "$result" > /dev/termination-log
"#
    };
}

/// The verification pass (see [`VERIFY_SCRIPT`]): compares `/source` and `/target` without
/// changing anything and leaves `$verified` (its result's fields, without braces), `$n` (the
/// differences) and `$vout` (them, one a line); on an rsync or `find` failure it writes the
/// error, with the mode, and exits.
macro_rules! verify_pass {
    () => {
        r#"vfail() {
  printf '{"error":"rsync verification exited with %d","exitCode":%d,"verifyMode":"%s"}' "$1" "$1" "$vmode" > /dev/termination-log
  echo "rsync verification failed with exit code $1" >&2
  exit "$1"
}
if [ -n "${lcount:-}" ]; then
  vmode=Changed
  vout=$(rsync -aHAXS --numeric-ids --delete --modify-window=-1 --checksum --dry-run --itemize-changes --files-from=/scratch/list --from0 --delete-missing-args /source/ /target/) || vfail $?
  checked=$lfiles
elif [ -z "${SINCE:-}" ]; then
  vmode=Full
  vout=$(rsync -aHAXS --numeric-ids --delete --checksum --dry-run --itemize-changes /source/ /target/) || vfail $?
  checked=
else
  vmode=Changed
  vattrs=-AX
  vtype='-type f'
  vsince=$SINCE
  if [ -n "${asince:-}" ]; then
    vattrs=
    vtype=
    if [ "$asince" -lt "$vsince" ]; then vsince=$asince; fi
  fi
  meta=$(rsync -aHS $vattrs --numeric-ids --delete --modify-window=-1 --dry-run --itemize-changes /source/ /target/) || vfail $?
  content=$(cd /source && find . -xdev $vtype -newerct "@$vsince" -exec sh -c 'f=0; for p; do if [ -f "$p" ] && [ ! -h "$p" ]; then f=$((f + 1)); fi; done; echo "checked $f"; exec rsync -aAXS --no-r -d --numeric-ids --checksum --dry-run --itemize-changes -R "$@" /target/' sh '{}' +) || vfail $?
  if [ -n "${asince:-}" ]; then
    written=$(cd /target && find . -xdev -newerct "@$wrote" -exec sh -c 'cd /source && exec rsync -aAXS --no-r -d --numeric-ids --dry-run --itemize-changes -R "$@" /target/' sh '{}' +) || vfail $?
    content=$(printf '%s\n%s' "$content" "$written")
  fi
  checked=0
  for c in $(printf '%s\n' "$content" | sed -n 's/^checked \([0-9][0-9]*\)$/\1/p'); do checked=$((checked + c)); done
  vout=$(printf '%s\n%s' "$meta" "$content" | grep -v '^checked [0-9][0-9]*$' | grep .)
fi
# One difference per path (a file may differ in both passes of Changed).
n=$(printf '%s' "$vout" | sed 's/^[^ ]* *//' | sort -u | grep -c .)
verified=$(printf '"differences":%d,"verifyMode":"%s"%s' "${n:-0}" "$vmode" "${checked:+,\"checkedFiles\":$checked}")
"#
    };
}

/// After the result is written: a verification that found differences prints the first ones
/// and fails the script.
macro_rules! fail_on_differences {
    () => {
        r#"if [ "${n:-0}" -ne 0 ]; then
  echo "source and target differ in $n entries ($vmode); the first ones:" >&2
  printf '%s\n' "$vout" | head -n 50 >&2
  exit 1
fi
"#
    };
}

/// After the final pass's rsync, when it left out ACLs and xattrs (`$asince` set, from
/// `ATTRS_SINCE`): rsync copies those of the entries changed on the old volume since then
/// (inode change time, `find -newerct`) and of the entries this pass wrote on the new one
/// (changed since `$wrote`, a second before its rsync began: what it created, rewrote or
/// linked, such as the files of a directory renamed on the old volume, whose own inodes did not
/// change), each entry itself (`--no-r -d`: a directory's attributes, not its tree), in
/// batches (`find -exec ... +`, whose exit code fails the script when a batch fails). The other
/// entries' ACLs and xattrs are as the pre-copy's rsync left them on both volumes: it compared
/// every entry's, an entry's ACLs or xattrs cannot change on the old volume without changing
/// its inode change time, and nothing but these passes writes the new one.
macro_rules! attributes_of_changed {
    () => {
        r#"
if [ -n "$asince" ]; then
  echo "ACLs and xattrs: of the entries changed since $asince and of those this pass wrote (the pre-copy compared every other entry's)" >&2
  if ! (cd /source && find . -xdev -newerct "@$asince" -exec sh -c 'exec rsync -aAXS --no-r -d --numeric-ids -R "$@" /target/' sh '{}' +) \
    || ! (cd /target && find . -xdev -newerct "@$wrote" -exec sh -c 'cd /source && exec rsync -aAXS --no-r -d --numeric-ids -R "$@" /target/' sh '{}' +); then
    printf '{"error":"copying the ACLs and xattrs of the changed entries failed","exitCode":1}' > /dev/termination-log
    echo "copying the ACLs and xattrs of the changed entries failed" >&2
    exit 1
  fi
fi"#
    };
}

/// Whether the pre-copy compares the whole tree with rsync after `cp` (`recheck`): with
/// `ATTRS_MIN_ENTRIES` set, on an old volume with at least that many inodes in use (`stat -f`),
/// where the final pass will compare the ACLs and xattrs of the changed entries only. Elsewhere
/// not: rsync would copy again, whole, every file the member wrote while `cp` ran (an etcd
/// member's WAL and database: nearly all of its data), while the member serves.
macro_rules! recheck_from {
    () => {
        r#"recheck=
if [ -n "${ATTRS_MIN_ENTRIES:-}" ] && inodes=$(stat -f -c '%c %d' /source 2>/dev/null); then
  set -- $inodes
  if [ "$(($1 - $2))" -ge "$ATTRS_MIN_ENTRIES" ]; then recheck=1; fi
fi
"#
    };
}

/// The final pass after a pre-copy that compared every entry's ACLs and xattrs (`$asince`
/// set): `storage-migrator tree-diff` walks both trees side by side, in parallel threads, and
/// lists what differs or changed since `$asince` ([`crate::tree_diff`]) in
/// `/scratch/list` ([`SCRATCH_PATH`]); rsync then copies exactly those entries, with their ACLs and xattrs
/// (`--files-from`, `--delete-missing-args` for what the old volume no longer has, and
/// `--ignore-times`: an entry changed since `$asince` may keep its size and time), and the
/// verification compares exactly those ([`verify_pass!`]). It sets `select` (rsync's file
/// selection), `lcount` (entries listed), `lfiles` (regular files among them) and clears
/// `asince` ([`attributes_of_changed!`] has nothing left to do). A mover image without the
/// `storage-migrator` binary (one a request names) walks the whole tree as before, and the log
/// says so; a walk that fails fails the pass (a list it could not finish would leave entries
/// out).
macro_rules! tree_diff {
    () => {
        r#"
select=
lcount=
lfiles=
if [ -n "$asince" ] && ! command -v storage-migrator >/dev/null 2>&1; then
  echo "rsync walks the whole tree: the image has no storage-migrator binary to list what changed" >&2
elif [ -n "$asince" ]; then
  if ! tout=$(storage-migrator tree-diff /source /target --since "$asince" --output /scratch/list); then
    printf '{"error":"listing what differs between the volumes failed","exitCode":1}' > /dev/termination-log
    echo "storage-migrator tree-diff failed: the pass copies nothing" >&2
    exit 1
  fi
  lcount=$(printf '%s\n' "$tout" | sed -n 's/.*listed=\([0-9][0-9]*\).*/\1/p')
  lfiles=$(printf '%s\n' "$tout" | sed -n 's/.*files=\([0-9][0-9]*\).*/\1/p')
  echo "tree-diff: $tout; rsync copies the listed entries with their ACLs and xattrs" >&2
  select='--files-from=/scratch/list --from0 --delete-missing-args --ignore-times'
  attrs=-AX
  asince=
fi"#
    };
}

/// The first pass's first choice (see [`PRECOPY_SCRIPT`]; the final pass's too when no pre-copy
/// ran, [`COPY_SCRIPT`]): GNU `cp -a` onto the empty new volume. It sets `copied` and the
/// result's fields when `cp` copied the whole tree; rsync runs when it is empty: with
/// `FIRST_PASS_TOOL=Rsync`, with a bandwidth cap (`$cap`), with a `cp` that is not
/// GNU's (busybox's, for one, keeps no xattrs), with anything but `lost+found` on the target
/// already (a pass resumed, the final pass after a pre-copy: rsync moves only what changed), and
/// after a `cp` that failed (a file that vanished under it: rsync finishes the pass, tolerating
/// that). The log says which way it copies and why (`rsync copies: <why>`).
///
/// Progress: every second, a line in the shape of rsync's `--info=progress2` with the bytes
/// `cp` has written so far (`wchar` of its `/proc/PID/io`, which counts `copy_file_range`),
/// their share of the bytes allocated on the source (`du`, run by the monitor while `cp`
/// copies; at most 99 %; 0 % while `du` runs or when it failed, and the planner then takes the
/// size measured at preflight, if any) and the mean rate. The monitor's `sleep` has its output
/// closed, so that a monitor killed mid-sleep holds no pipe open.
/// Then the tree's apparent size (`du --apparent-size`) and its regular files are the result's
/// `bytes` and `files`.
macro_rules! kernel_copy {
    () => {
        r#"copied=
why=
if [ "${FIRST_PASS_TOOL:-Cp}" != Cp ]; then why="firstPassTool is ${FIRST_PASS_TOOL}"
elif [ -n "$cap" ]; then why="the pass is capped (preCopyBandwidth), cp has no cap"
elif ! cp --version 2>/dev/null | grep -q 'GNU coreutils'; then why="the image's cp is not GNU coreutils'"
elif ! entries=$(find /target -mindepth 1 -maxdepth 1 ! -name lost+found -print -quit); then why="find could not list the new volume"
elif [ -n "$entries" ]; then why="the new volume already holds data"
fi
if [ -n "$why" ]; then
  echo "rsync copies: $why" >&2
else
  echo "the new volume is empty: cp -a copies the tree" >&2
  cp -a /source/. /target/ &
  cpid=$!
  (
    t=$(du -s -B1 /source 2>/dev/null) || t=
    t=${t%%[!0-9]*}
    s=0
    while sleep 1 </dev/null >/dev/null 2>&1; do
      s=$((s + 1))
      w=$(sed -n 's/^wchar: *//p' "/proc/$cpid/io" 2>/dev/null)
      [ -n "$w" ] || continue
      p=0
      if [ "${t:-0}" -gt 0 ]; then p=$((w * 100 / t)); [ "$p" -le 99 ] || p=99; fi
      printf '%15s %3d%%  %sB/s    0:00:00\n' "$w" "$p" "$((w / s))"
    done
  ) >&2 &
  mpid=$!
  wait "$cpid"
  crc=$?
  kill "$mpid" 2>/dev/null
  if [ "$crc" -eq 0 ]; then
    copied=1
    mode=KernelCopy
    rc=0
    bytes=$(du -s -B1 --apparent-size /target 2>/dev/null) || bytes=
    bytes=${bytes%%[!0-9]*}
    total=$bytes
    literal=$bytes
    marks=$(find /target -xdev -type f -printf x 2>/dev/null) || marks=
    files=${#marks}
    echo "cp copied the tree: ${bytes:-?} bytes, $files files" >&2
  else
    echo "cp exited with $crc: rsync finishes the pass" >&2
  fi
fi"#
    };
}

/// Live pass, while the member serves; the final pass repairs whatever it missed.
///
/// Onto an empty new volume, GNU `cp -a` copies the tree ([`kernel_copy!`], `"mode":"KernelCopy"`):
/// in the kernel (`copy_file_range`), holes kept (`SEEK_DATA`), hard links, owners, modes,
/// ACLs, xattrs and nanosecond times preserved. rsync pipes every byte from its sender to its
/// receiver process and checksums it: 0.64× of `cp -a` on 1 GiB in 4 files (bench-copy). After
/// `cp`, rsync compares the whole tree, ACLs and xattrs included, and copies what differs (no
/// progress lines: the percentage shown stays `cp`'s; so rsync's incremental recursion, which
/// holds a directory's list at a time, not the tree's): an xattr `cp -a` could not set (it does
/// not fail for one), a file written while it ran. So every pre-copy ends with every entry's
/// ACLs and xattrs compared (`"attributesCompared":"All"`), and the final pass needs to compare
/// only those of the entries changed since ([`COPY_SCRIPT`], `ATTRS_SINCE`).
///
/// Otherwise rsync: exit 24 ("some files vanished before they could be transferred") is
/// expected while the member writes, and tolerated. Whole files (rsync's default between local
/// paths): the target is empty or nearly so, and reading both sides for a delta would only cost
/// time. With `BWLIMIT` in its environment (whole KiB per second, set from
/// `spec.copy.preCopyBandwidth`), rsync is held to that rate (`--bwlimit`): the member still
/// serves while this pass reads its volume.
pub const PRECOPY_SCRIPT: &str = rsync_copy_script!(
    "0 24",
    concat!(
        "mode=WholeFile\ndelta=\ncap=${BWLIMIT:+--bwlimit=$BWLIMIT}\nattrs=-AX\nselect=\nlcount=\n",
        recheck_from!(),
        kernel_copy!(),
        "\nif [ -n \"$copied\" ] && [ -z \"$recheck\" ]; then ascope=None; else ascope=All; fi"
    ),
    "",
    write_result!()
);

/// Final pass over a stopped member: anything but exit 0 fails the Job.
///
/// It moves what changed since the pre-copy, not whole files (issue: a few KiB appended to a
/// 64 MiB etcd WAL segment copied the whole segment): `--no-whole-file` turns on rsync's delta
/// transfer between local paths and `--inplace` writes only the blocks that differ into the
/// existing target file, instead of a full new copy renamed over it. `Literal data` in rsync's
/// stats (`literalBytes`) is then what was written. In place is safe here: nothing else uses
/// the temporary claim, and an interrupted pass leaves files whose modification time differs
/// from the source, which the next pass sends again; verification reads every file after it.
///
/// Except when a regular file on the target has more than one link: writing it in place would
/// write through every name of that inode, and if the source no longer links them ("tug of
/// war", rsync's manual) the target ends up different. Then the pass copies whole files and
/// says so (`"mode":"WholeFile"` instead of `"Delta"`). So does a `find` that cannot answer
/// (a mover image whose `find` lacks `-quit`): in place only when no such file is known to
/// exist. After `tree-diff` ([`tree_diff!`]) its walk counts them (`linked=`), and no `find`
/// walks the new volume again.
///
/// Onto an empty new volume (no pre-copy ran: `copy.preCopy` false, a `ReadWriteOncePod`
/// claim), `cp -a` copies first, as in [`PRECOPY_SCRIPT`]; the member is stopped, so nothing
/// changes under it.
///
/// ACLs and xattrs (`"attributesCompared"`): reading every entry's on both sides doubles the
/// walk of the tree (docs/benchmarks.md). With `ATTRS_SINCE` (seconds since the epoch, which
/// the planner sets only after a pre-copy that compared every entry's, from the first copy
/// pass's creation less the clock margin), rsync walks the tree without them (`Changed`) and
/// then copies those of the entries changed since ([`attributes_of_changed!`]); the
/// verification likewise. An entry whose ACLs or xattrs changed has a newer inode change time.
/// Without it (`All`), or after `cp` copied onto an empty volume (`None`: the verification
/// then compares them on the whole tree), `ATTRS_SINCE` is not used.
///
/// With `VERIFY` set (`spec.copy.verify`), the same pod then runs the verification pass of
/// [`VERIFY_SCRIPT`] (with its `SINCE`) and writes one result with the fields of both: a
/// member is down for one pod start, not two. Differences fail the script (exit 1) with the
/// copy's numbers and `differences` in its result; a failed verification writes its error
/// with `verifyMode`, which is how the planner tells it from a failed copy.
pub const COPY_SCRIPT: &str = rsync_copy_script!(
    "0",
    concat!(
        r#"mode=Delta
delta='--no-whole-file --inplace'
cap=
recheck=
asince=${ATTRS_SINCE:-}
wrote=$(($(date +%s) - 1))
"#,
        kernel_copy!(),
        r#"
if [ -n "$copied" ]; then asince=; attrs=-AX; ascope=None
elif [ -n "$asince" ]; then attrs=; ascope=Changed
else attrs=-AX; ascope=All
fi"#,
        tree_diff!(),
        r#"
if [ -z "$copied" ]; then
  if [ -n "$lcount" ]; then
    linked=$(printf '%s\n' "$tout" | sed -n 's/.*linked=\([1-9][0-9]*\).*/\1/p')
  elif ! linked=$(find /target -xdev -type f -links +1 -print -quit 2>/dev/null); then linked=unknown
  fi
  if [ -n "$linked" ]; then mode=WholeFile; delta=; fi
fi"#
    ),
    attributes_of_changed!(),
    concat!(
        "if [ -n \"${VERIFY:-}\" ]; then\n",
        verify_pass!(),
        "result=\"${result%\\}},$verified}\"\nfi\n",
        write_result!(),
        fail_on_differences!()
    )
);

/// Compares both trees without changing anything (`--dry-run`); every line of
/// `--itemize-changes` is a difference. Writes `{"differences":N,"verifyMode":M,...}` and fails
/// unless N is 0, printing the first differences to stderr.
///
/// - `SINCE` empty (`Full`): one pass comparing content (`--checksum`) and metadata of every
///   entry.
/// - `SINCE` set to seconds since the epoch (`Changed`): a metadata pass over the whole tree
///   (rsync's quick check: sizes and exact modification times, plus modes, owners, links, ACLs,
///   xattrs and what exists on one side only), then a content pass (`--checksum`) over the
///   regular files whose inode changed (`find -newerct`) since then, in batches
///   (`find -exec ... +`, whose exit code also fails the script when `find` or a batch fails).
///   `checkedFiles` counts those files: each batch first prints `checked N` (its file count),
///   which no `--itemize-changes` line can be (those start with 11 change letters and a
///   space), so one walk both finds and counts them.
/// - In the final pass's pod with `ATTRS_SINCE` set (see [`COPY_SCRIPT`]): the metadata pass
///   leaves ACLs and xattrs out, and the content pass takes every entry changed since the
///   earlier of `SINCE` and `ATTRS_SINCE`, each by itself (`--no-r -d`: a directory's own
///   metadata, not its tree), with its ACLs and xattrs; `checkedFiles` still counts the
///   regular files among them. Then the ACLs and xattrs (and metadata) of every entry the
///   final pass wrote on the new volume (changed there since `$wrote`), each by itself.
pub const VERIFY_SCRIPT: &str = concat!(
    "set -u\n",
    verify_pass!(),
    "result=\"{$verified}\"\n",
    write_result!(),
    fail_on_differences!()
);

/// Bytes allocated on the old volume (`du -s -B1`: blocks in use, so sparse files count what
/// they occupy, which is what must fit on the smaller volume), and the filesystem's `statfs`
/// (type, blocks, inodes: how much of a volume its filesystem leaves usable). Writes
/// `{"usedBytes":N,"filesystem":{...}}`; `filesystem` is left out when `stat -f` fails.
pub const MEASURE_SCRIPT: &str = concat!(
    r#"set -u
out=$(du -s -B1 /source)
rc=$?
used=${out%%[!0-9]*}
if [ "$rc" -ne 0 ] || [ -z "$used" ]; then
  printf '{"error":"du exited with %d","exitCode":%d}' "$rc" "$rc" > /dev/termination-log
  echo "du failed with exit code $rc: $out" >&2
  exit 1
fi
fs=$(stat -f -c '"#,
    statfs_format!(),
    r#"' /source 2>/dev/null) || fs=""
result=$(printf '{"usedBytes":%s%s}' "$used" "${fs:+,\"filesystem\":$fs}")
printf '%s\n' "$result"
printf '%s' "$result" > /dev/termination-log
"#
);

/// The Job of `kind` for `member`, bounded by `deadline_seconds` (the request's remaining
/// timeout; at least 1), running `image` (the planner's choice: the operator's own image, or
/// the request's `moverImage` where the operator allows one).
///
/// Why each part:
/// - Node affinity to the member's node ([`super::pinned_to_node`]), not `nodeName`: a
///   ReadWriteOnce volume can be mounted by several pods only on the same node, and the
///   scheduler must still see the pod so the volumes' own node affinity is honoured.
/// - `/source` is read-only twice (claim volume source and mount): the pre-copy runs while the
///   member serves from that volume, and no bug in a script may write to it.
/// - Runs as root (uid and gid 0) with every capability dropped but those of its kind
///   ([`JobKind::capabilities`], see [`super::security`]): rsync keeps owners, modes, ACLs and
///   xattrs of files of every owner only as root with them. No privilege escalation, a
///   read-only root, the `RuntimeDefault` seccomp profile. Verify and Measure mount everything
///   read-only.
/// - `backoffLimit: 0`: a failed copy is a decision for the planner (rollback), not a retry
///   hidden from it. `activeDeadlineSeconds` keeps a stuck copy within the request's timeout.
/// - An ownerReference to the request so the Job goes with it (the cluster layer still deletes
///   Jobs with `propagationPolicy: Background`, since deleting a Job orphans its pods by
///   default).
/// - No service-account token, no service links: the pod needs no API access.
/// - `terminationMessagePolicy: FallbackToLogsOnError`: if a script dies before writing its
///   result, the log tail still explains why.
pub fn job(
    req: &StorageMigrationRequest,
    image: &ImageRef,
    member: &PlannedMember,
    subject: &str,
    kind: JobKind,
    deadline_seconds: i64,
    pass: impl Into<Pass>,
) -> Job {
    let pass = pass.into();
    let metadata = job_metadata(req, member, subject, kind);
    let pod_labels = metadata.labels.clone();
    Job {
        metadata,
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            completions: Some(1),
            parallelism: Some(1),
            active_deadline_seconds: Some(deadline_seconds.max(1)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: pod_labels,
                    ..Default::default()
                }),
                spec: Some(job_pod_spec(req, image, member, kind, pass)),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// The Job's name, owner and labels (the member's, plus the Job's kind); its pod gets the same
/// labels.
fn job_metadata(
    req: &StorageMigrationRequest,
    member: &PlannedMember,
    subject: &str,
    kind: JobKind,
) -> ObjectMeta {
    let name = job_name(&req_name(req), subject, kind);
    let mut metadata = member_meta(req, name, &member.pod, true);
    let labels = metadata.labels.get_or_insert_with(Default::default);
    labels.insert(JOB_KIND_LABEL.to_string(), kind.as_str().to_string());
    metadata
}

/// The pod of the Job: pinned to the member's node, root, no API access, never restarted.
fn job_pod_spec(
    req: &StorageMigrationRequest,
    image: &ImageRef,
    member: &PlannedMember,
    kind: JobKind,
    pass: Pass,
) -> PodSpec {
    let (volumes, mounts) = job_volumes(member, kind);
    PodSpec {
        affinity: Some(pinned_to_node(&member.node)),
        tolerations: Some(tolerate_all()),
        restart_policy: Some("Never".to_string()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(10),
        security_context: Some(security::pod_security(0)),
        containers: vec![job_container(req, image, kind, mounts, pass)],
        volumes: Some(volumes),
        ..Default::default()
    }
}

/// The old claim at `/source`, read-only in both the volume source and the mount; except for
/// Measure, the temporary claim at `/target`, read-only too for Verify; for Copy, an `emptyDir`
/// at [`SCRATCH_PATH`] for the list of what the final pass copies (the root filesystem is
/// read-only).
fn job_volumes(member: &PlannedMember, kind: JobKind) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![claim_volume("source", &member.claim, true)];
    let mut mounts = vec![volume_mount("source", SOURCE_PATH, true)];
    if kind.mounts_target() {
        let read_only = !kind.writes_target();
        volumes.push(claim_volume("target", &member.temp_claim, read_only));
        mounts.push(volume_mount("target", TARGET_PATH, read_only));
    }
    if kind == JobKind::Copy {
        volumes.push(Volume {
            name: "scratch".to_string(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
        mounts.push(volume_mount("scratch", SCRATCH_PATH, false));
    }
    (volumes, mounts)
}

fn claim_volume(name: &str, claim: &str, read_only: bool) -> Volume {
    Volume {
        name: name.to_string(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_string(),
            read_only: Some(read_only),
        }),
        ..Default::default()
    }
}

fn volume_mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The single container: the kind's constant script under `sh -c` in the mover image, C
/// locale, the request's resources, the result in the termination message.
fn job_container(
    req: &StorageMigrationRequest,
    image: &ImageRef,
    kind: JobKind,
    mounts: Vec<VolumeMount>,
    pass: Pass,
) -> Container {
    Container {
        name: JOB_CONTAINER.to_string(),
        image: Some(image.as_str().to_string()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec![
            "sh".to_string(),
            "-c".to_string(),
            kind.script().to_string(),
        ]),
        env: Some(job_env(
            kind,
            pass,
            pre_copy_kib(req),
            req.spec.copy.first_pass_tool,
        )),
        resources: job_resources(req.spec.copy.resources.as_ref(), kind, pass.source),
        security_context: Some(security::container_security(kind.capabilities())),
        volume_mounts: Some(mounts),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.to_string()),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Default::default()
    }
}

/// The C locale; for a verification pass (Verify, or Copy with `VERIFY=1`) in `Changed` mode,
/// `SINCE` (seconds since the epoch): the content of the files changed since then is compared;
/// for PreCopy and Copy, `FIRST_PASS_TOOL` (`spec.copy.firstPassTool`); for PreCopy with a
/// cap, `BWLIMIT` (whole KiB per second, rsync's `--bwlimit`); for Copy after a pre-copy that
/// compared every entry's ACLs and xattrs, `ATTRS_SINCE` (seconds since the epoch): the pass
/// and its verification compare those of the entries changed since then only.
fn job_env(
    kind: JobKind,
    pass: Pass,
    pre_copy_kib: Option<i64>,
    tool: FirstPassTool,
) -> Vec<EnvVar> {
    let verification = pass.verification;
    let var = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    };
    let mut env = vec![var("LC_ALL", "C".to_string())];
    let verifies = match kind {
        JobKind::Verify => true,
        JobKind::Copy => verification != Verification::Skip,
        JobKind::PreCopy | JobKind::Measure => false,
    };
    if kind == JobKind::Copy && verifies {
        env.push(var("VERIFY", "1".to_string()));
    }
    if let (true, Verification::ChangedSince(since)) = (verifies, verification) {
        env.push(var("SINCE", since.to_string()));
    }
    if matches!(kind, JobKind::PreCopy | JobKind::Copy) {
        let tool = match tool {
            FirstPassTool::Cp => "Cp",
            FirstPassTool::Rsync => "Rsync",
        };
        env.push(var("FIRST_PASS_TOOL", tool.to_string()));
    }
    if let (JobKind::PreCopy, Some(kib)) = (kind, pre_copy_kib) {
        env.push(var("BWLIMIT", kib.to_string()));
    }
    if kind == JobKind::PreCopy {
        let min = ATTRIBUTES_OF_CHANGED_MIN_ENTRIES.to_string();
        env.push(var("ATTRS_MIN_ENTRIES", min));
    }
    if let (JobKind::Copy, Some(since)) = (kind, pass.attributes_since) {
        env.push(var("ATTRS_SINCE", since.to_string()));
    }
    env
}

/// What a Job's verification pass compares: a Verify Job always runs one (`Skip` counts as
/// `Full` there), a Copy Job only when this is not `Skip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// No verification pass (`spec.copy.verify` false; Measure and PreCopy Jobs).
    Skip,
    /// Content (`--checksum`) and metadata of every entry.
    Full,
    /// Metadata of every entry, and the content of the regular files changed since these
    /// seconds since the epoch (`SINCE`).
    ChangedSince(i64),
}

/// What one Job's pass needs to know beyond the request and the member: what its
/// verification compares, and what the old volume holds when a pre-copy has read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub verification: Verification,
    /// The old volume's contents as the pre-copy found them (`status.members[].sourceEntries`,
    /// `sourceBytes`): the Job's memory comes from them ([`copy_memory`]).
    pub source: Option<SourceContents>,
    /// For the final pass: when the pre-copy compared every entry's ACLs and xattrs, the
    /// seconds since the epoch before which an entry unchanged since was compared by it
    /// (`ATTRS_SINCE`; the first copy pass's creation less the clock margin).
    pub attributes_since: Option<i64>,
}

impl From<Verification> for Pass {
    fn from(verification: Verification) -> Self {
        Pass {
            verification,
            source: None,
            attributes_since: None,
        }
    }
}

/// Files and directories (inodes in use) and bytes in use on a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceContents {
    pub entries: i64,
    pub bytes: i64,
}

impl SourceContents {
    /// The old volume's contents as a claim's pre-copy recorded them
    /// (`sourceEntries`, `sourceBytes`), if it did.
    pub fn recorded(c: &ClaimStatus) -> Option<Self> {
        Some(SourceContents {
            entries: c.source_entries?,
            bytes: c.source_bytes.unwrap_or(0),
        })
    }
}

/// The memory a copy pod holds at most, as a function of the old volume's contents:
///
/// `COPY_MEMORY_BASE_MIB` MiB + `COPY_MEMORY_PER_ENTRY` bytes × entries +
/// bytes in use / `COPY_MEMORY_BYTES_PER_DELTA_BYTE`.
///
/// - The entries term is rsync's file list: `--no-inc-recursive` keeps the whole tree's list
///   in memory, in the sender and again in the receiver and generator (one forked process,
///   whose copy of it diverges as it works). `bench-files` measured the final pass with its
///   verification at 10,000, 300,000 and 1,000,000 files of 4 KiB: 136 bytes a file at
///   1,000,000 (129.5 MiB, anonymous memory of every process of the pass; docs/benchmarks.md);
///   the constant is nearly twice that.
/// - The bytes term is the delta transfer's block checksums of the largest file (rsync's
///   blocks are at most 128 KiB, a checksum entry about 40 bytes, held by the generator and
///   the sender's hash table): at most one 2,048th of the file, and no file is larger than the
///   volume's bytes in use. Read in rsync's source, not measured.
/// - The base is the processes themselves, the shell, `find` and `sort` of the verification.
///
/// Rounded up to whole MiB.
pub fn copy_memory(source: SourceContents) -> Quantity {
    let bytes = COPY_MEMORY_BASE_MIB
        .saturating_mul(1 << 20)
        .saturating_add(source.entries.max(0).saturating_mul(COPY_MEMORY_PER_ENTRY))
        .saturating_add(source.bytes.max(0) / COPY_MEMORY_BYTES_PER_DELTA_BYTE);
    let mib = (bytes.max(0) as u64).div_ceil(1 << 20);
    Quantity(format!("{mib}Mi"))
}

/// From how many files and directories on the old volume (inodes in use) the pre-copy compares
/// every entry's ACLs and xattrs after `cp` (`ATTRS_MIN_ENTRIES`), and the final pass then
/// compares those of the changed entries only (`ATTRS_SINCE`): reading them on both whole trees
/// doubles the walk, while finding the changed entries costs more walks of one tree and a few
/// more processes. Measured on ext4 with 1% of the files changed (docs/benchmarks.md): 0.1 s
/// slower at 10,000 files, 1.1 s faster at 300,000; even at about 36,000. Below it the
/// pre-copy does not run rsync after `cp`, which would copy again every file the member wrote
/// meanwhile.
pub const ATTRIBUTES_OF_CHANGED_MIN_ENTRIES: i64 = 50_000;

/// See [`copy_memory`].
pub const COPY_MEMORY_BASE_MIB: i64 = 64;
/// See [`copy_memory`].
pub const COPY_MEMORY_PER_ENTRY: i64 = 256;
/// See [`copy_memory`].
pub const COPY_MEMORY_BYTES_PER_DELTA_BYTE: i64 = 2048;

/// The container's resources: the request's `spec.copy.resources` as given when they set a
/// memory request or limit; else, for the kinds that hold rsync's file list (PreCopy, Copy,
/// Verify) with the old volume's contents known, theirs plus a memory request and limit of
/// [`copy_memory`]. A Measure Job (`du`, no file list) and a pass before any pre-copy read the
/// volume get the request's resources alone.
pub fn job_resources(
    given: Option<&ResourceRequirements>,
    kind: JobKind,
    source: Option<SourceContents>,
) -> Option<ResourceRequirements> {
    let sets_memory =
        |m: Option<&BTreeMap<String, Quantity>>| m.is_some_and(|m| m.contains_key("memory"));
    let user_memory =
        given.is_some_and(|r| sets_memory(r.requests.as_ref()) || sets_memory(r.limits.as_ref()));
    let Some(source) = source.filter(|_| kind != JobKind::Measure && !user_memory) else {
        return given.cloned();
    };
    let memory = copy_memory(source);
    let mut r = given.cloned().unwrap_or_default();
    r.requests
        .get_or_insert_with(Default::default)
        .insert("memory".to_string(), memory.clone());
    r.limits
        .get_or_insert_with(Default::default)
        .insert("memory".to_string(), memory);
    Some(r)
}

/// `spec.copy.preCopyBandwidth` in whole KiB per second (rounded down, at least 1); `None`
/// when unset or not a quantity (preflight denies that).
pub fn pre_copy_kib(req: &StorageMigrationRequest) -> Option<i64> {
    let limit = req.spec.copy.pre_copy_bandwidth.as_ref()?;
    let kib = crate::quantity::bytes(limit)? / 1024;
    i64::try_from(kib).ok().map(|k| k.max(1))
}

/// A Job's result, from its container's termination message. Which fields are set depends on
/// the kind: `bytes`/`files`/`totalBytes`/`exitCode` (PreCopy, Copy), `usedBytes` (Measure),
/// `differences` (Verify), `error`/`exitCode` (a failed script).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JobResult {
    /// Bytes rsync transferred (`Total transferred file size`); on a copy out of space, the
    /// bytes of its last progress line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
    /// Regular files rsync transferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<i64>,
    /// Size of all files on the source (`Total file size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<i64>,
    /// Bytes rsync wrote as new data (`Literal data`): with the final pass's delta transfer,
    /// the blocks that changed; with whole files, the same as `bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub literal_bytes: Option<i64>,
    /// How the pass copied (PreCopy, Copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<CopyMode>,
    /// Whose ACLs and xattrs rsync compared with the source's in the pass (PreCopy, Copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes_compared: Option<AttributesCompared>,
    /// Entries `storage-migrator tree-diff` listed for the final pass to copy (Copy; absent
    /// when rsync walked the whole tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed_entries: Option<i64>,
    /// Bytes allocated on the source (Measure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<i64>,
    /// The old volume's filesystem (Measure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FsReport>,
    /// Entries that differ between source and target (Verify).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub differences: Option<i64>,
    /// What the verification compared (Verify).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_mode: Option<crate::api::VerifyMode>,
    /// Regular files whose content the verification compared (Verify, `Changed` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_files: Option<i64>,
    /// rsync's (or du's) exit code; 24 on a tolerated pre-copy pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Set when the script failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the script failed, when it knows a cause the planner treats apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<JobFailureCause>,
    /// The temporary claim's filesystem after a copy pass (also when one failed for lack of
    /// space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_filesystem: Option<FsReport>,
    /// The old claim's filesystem after a copy pass: how much room the member had there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_filesystem: Option<FsReport>,
}

/// How a copy pass copied changed files (`"mode"` of its result).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMode {
    /// Each changed file written anew, whole.
    WholeFile,
    /// rsync's delta transfer, in place: only the blocks that differ are written.
    Delta,
    /// The whole tree copied by GNU `cp -a` onto the empty new volume, in the kernel
    /// (`copy_file_range`): the pre-copy's first choice (`spec.copy.firstPassTool: Cp`).
    KernelCopy,
}

/// Whose ACLs and xattrs a copy pass's rsync compared with the source's (`"attributesCompared"`
/// of its result).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributesCompared {
    /// Every entry's: the pre-copy's rsync (also after `cp`), a final pass without
    /// `ATTRS_SINCE`.
    All,
    /// Only those of the entries changed since `ATTRS_SINCE`: the pre-copy compared the rest.
    Changed,
    /// None: `cp -a` copied the tree onto an empty volume and rsync did not run after it.
    None,
}

/// A cause of failure a script recognises (`"cause"` of its result).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobFailureCause {
    /// A copy pass found no space left on the target (rsync: `No space left on device`).
    NoSpace,
}

/// A volume's `statfs`, as `stat -f` prints it (block counts in `block_size` units).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FsReport {
    /// `statfs` type name, e.g. `ext2/ext3` (ext4 too), `xfs`.
    #[serde(rename = "type")]
    pub fs_type: String,
    pub block_size: i64,
    pub blocks: i64,
    pub blocks_free: i64,
    /// Free blocks a non-root user may use.
    pub blocks_available: i64,
    pub inodes: i64,
    pub inodes_free: i64,
}

impl FsReport {
    /// Bytes a non-root user may still write.
    pub fn available_bytes(&self) -> i64 {
        self.block_size.saturating_mul(self.blocks_available)
    }

    /// What the filesystem holds, for the copy's memory ([`copy_memory`]): its inodes in use
    /// and bytes in use. `None` when it counts no inodes (btrfs reports 0 of them), so its
    /// files cannot be known this way.
    pub fn contents(&self) -> Option<SourceContents> {
        (self.inodes > 0).then(|| SourceContents {
            entries: self.inodes.saturating_sub(self.inodes_free).max(0),
            bytes: self
                .block_size
                .saturating_mul(self.blocks.saturating_sub(self.blocks_free))
                .max(0),
        })
    }
}

impl JobResult {
    /// True when the script reported a failure or, for Verify, any difference.
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.differences.is_some_and(|d| d != 0)
    }

    /// True when the result comes from a verification pass (a Verify Job's, or a Copy Job's
    /// that verified in the same pod): it names the mode, or counts differences.
    pub fn verified_in_pass(&self) -> bool {
        self.verify_mode.is_some() || self.differences.is_some()
    }

    fn is_empty(&self) -> bool {
        *self == JobResult::default()
    }
}

/// Parses a Job's termination message.
///
/// The message should be exactly the script's JSON line; when a script died before writing it,
/// `FallbackToLogsOnError` puts the log tail there instead, whose last line may still be the
/// result, so the last non-empty line is tried as well. An empty message, text that is no such
/// JSON, a JSON object with none of the known fields, or a negative count is an error (the
/// caller treats the Job as failed and says why).
pub fn parse_job_result(msg: &str) -> Result<JobResult, BuildError> {
    let err = |reason: String| BuildError::JobResult {
        message: msg.chars().take(512).collect(),
        reason,
    };
    let trimmed = msg.trim();
    if trimmed.is_empty() {
        return Err(err("the termination message is empty".to_string()));
    }
    let parsed = parse_object(trimmed).or_else(|whole| {
        let last = trimmed.lines().rev().map(str::trim).find(|l| !l.is_empty());
        match last {
            Some(line) if line != trimmed => parse_object(line).map_err(|_| whole),
            _ => Err(whole),
        }
    });
    let result = parsed.map_err(err)?;
    if result.is_empty() {
        return Err(err("none of the known result fields is set".to_string()));
    }
    let counts = [
        result.bytes,
        result.files,
        result.total_bytes,
        result.literal_bytes,
        result.used_bytes,
        result.differences,
    ];
    if counts.iter().flatten().any(|n| *n < 0) {
        return Err(err("a count is negative".to_string()));
    }
    Ok(result)
}

/// One JSON object (serde would also accept a JSON array for a struct: `[1,2]` is no result).
fn parse_object(text: &str) -> Result<JobResult, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err("not a JSON object".to_string());
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::testdata;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const KINDS: [JobKind; 4] = [
        JobKind::Measure,
        JobKind::PreCopy,
        JobKind::Copy,
        JobKind::Verify,
    ];

    #[test]
    fn copy_memory_follows_the_documented_formula() {
        let m = |entries, bytes| copy_memory(SourceContents { entries, bytes }).0;
        assert_eq!(m(0, 0), "64Mi");
        // 64 MiB + 256 B × 1,000,000 (244.1 MiB) + 1 GiB / 2,048 (0.5 MiB), rounded up.
        assert_eq!(m(1_000_000, 1 << 30), "309Mi");
        assert_eq!(m(10_000_000, 0), "2506Mi");
        // A 1 TiB file's delta checksums: 512 MiB more.
        assert_eq!(m(0, 1 << 40), "576Mi");
        assert_eq!(m(-5, -1), "64Mi", "nonsense counts add nothing");
        assert_eq!(
            m(i64::MAX, i64::MAX),
            "8796093022208Mi",
            "saturates, no overflow"
        );
    }

    #[test]
    fn memory_is_set_from_the_source_unless_the_request_sets_it() {
        let q = |s: &str| Quantity(s.to_string());
        let source = Some(SourceContents {
            entries: 300_000,
            bytes: 1 << 30,
        });
        let memory_of = |r: &Option<ResourceRequirements>, which: &str| {
            let side = match which {
                "requests" => r.as_ref().and_then(|r| r.requests.as_ref()),
                _ => r.as_ref().and_then(|r| r.limits.as_ref()),
            };
            side.and_then(|m| m.get("memory")).map(|q| q.0.clone())
        };
        for kind in [JobKind::PreCopy, JobKind::Copy, JobKind::Verify] {
            let r = job_resources(None, kind, source);
            assert_eq!(memory_of(&r, "requests").as_deref(), Some("138Mi"));
            assert_eq!(memory_of(&r, "limits").as_deref(), Some("138Mi"));
            assert_eq!(
                job_resources(None, kind, None),
                None,
                "unknown source: nothing set"
            );
        }
        assert_eq!(
            job_resources(None, JobKind::Measure, source),
            None,
            "du holds no list"
        );
        // The request's CPU stays, with the memory added.
        let cpu = ResourceRequirements {
            requests: Some([("cpu".to_string(), q("250m"))].into()),
            ..Default::default()
        };
        let r = job_resources(Some(&cpu), JobKind::Copy, source).unwrap();
        assert_eq!(r.requests.as_ref().unwrap()["cpu"], q("250m"));
        assert_eq!(r.limits.as_ref().unwrap()["memory"], q("138Mi"));
        // Memory the request sets (a request alone, or a limit alone) is kept as given.
        for side in ["requests", "limits"] {
            let mine: BTreeMap<String, Quantity> = [("memory".to_string(), q("3Gi"))].into();
            let given = ResourceRequirements {
                requests: (side == "requests").then(|| mine.clone()),
                limits: (side == "limits").then_some(mine),
                ..Default::default()
            };
            let r = job_resources(Some(&given), JobKind::Copy, source);
            assert_eq!(r.as_ref(), Some(&given), "{side}");
        }
    }

    #[test]
    fn a_filesystem_without_inode_counts_tells_nothing_of_its_files() {
        let fs = |inodes, inodes_free| FsReport {
            fs_type: "btrfs".into(),
            block_size: 4096,
            blocks: 1000,
            blocks_free: 400,
            blocks_available: 400,
            inodes,
            inodes_free,
        };
        assert_eq!(fs(0, 0).contents(), None);
        assert_eq!(
            fs(100, 30).contents(),
            Some(SourceContents {
                entries: 70,
                bytes: 600 * 4096
            })
        );
    }

    #[test]
    fn job_snapshots() {
        let req = testdata::request();
        let member = testdata::member();
        for kind in KINDS {
            let job = job(
                &req,
                &testdata::image(),
                &member,
                &member.pod,
                kind,
                1200,
                Verification::ChangedSince(1_700_000_000),
            );
            insta::assert_yaml_snapshot!(format!("job_{}", kind.as_str()), job);
        }
    }

    /// The value of the environment variable `name` in the container of the Job of `kind` built
    /// for `req` with `verification`.
    fn env_value(
        req: &StorageMigrationRequest,
        kind: JobKind,
        verification: impl Into<Pass>,
        name: &str,
    ) -> Option<String> {
        let job = job(
            req,
            &testdata::image(),
            &testdata::member(),
            &testdata::member().pod,
            kind,
            60,
            verification,
        );
        let pod = job.spec.and_then(|s| s.template.spec).unwrap();
        let env = pod.containers[0].env.clone().unwrap_or_default();
        env.into_iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value)
    }

    /// `spec.copy.preCopyBandwidth` reaches the pre-copy's pod as whole KiB per second, and
    /// no other Job's.
    #[test]
    fn only_the_pre_copy_gets_the_bandwidth_cap() {
        let mut req = testdata::request();
        let env_of = |req: &StorageMigrationRequest, kind: JobKind| {
            env_value(req, kind, Verification::ChangedSince(1), "BWLIMIT")
        };
        assert_eq!(env_of(&req, JobKind::PreCopy), None, "no cap asked");
        for (limit, kib) in [("50Mi", "51200"), ("1500", "1"), ("100M", "97656")] {
            req.spec.copy.pre_copy_bandwidth = Some(Quantity(limit.into()));
            assert_eq!(
                env_of(&req, JobKind::PreCopy).as_deref(),
                Some(kib),
                "{limit}"
            );
            for kind in [JobKind::Copy, JobKind::Verify, JobKind::Measure] {
                assert_eq!(env_of(&req, kind), None, "{kind:?}");
            }
        }
    }

    /// `spec.copy.firstPassTool` reaches both copy passes, whichever finds the new volume
    /// empty, and no other Job.
    #[test]
    fn both_copy_passes_get_the_first_pass_tool() {
        let mut req = testdata::request();
        let tool_of = |req: &StorageMigrationRequest, kind: JobKind| {
            env_value(req, kind, Verification::Full, "FIRST_PASS_TOOL")
        };
        for (tool, value) in [(FirstPassTool::Cp, "Cp"), (FirstPassTool::Rsync, "Rsync")] {
            req.spec.copy.first_pass_tool = tool;
            for kind in [JobKind::PreCopy, JobKind::Copy] {
                assert_eq!(tool_of(&req, kind).as_deref(), Some(value), "{kind:?}");
            }
            for kind in [JobKind::Verify, JobKind::Measure] {
                assert_eq!(tool_of(&req, kind), None, "{kind:?}");
            }
        }
    }

    /// The final copy verifies in its own pod only when asked (`VERIFY`), with the same
    /// `SINCE` a Verify Job gets; the other kinds never see either.
    #[test]
    fn the_final_copy_carries_the_verification_it_is_asked_for() {
        let env_of = |kind: JobKind, v: Verification| {
            let req = testdata::request();
            (
                env_value(&req, kind, v, "VERIFY"),
                env_value(&req, kind, v, "SINCE"),
            )
        };
        let since = Verification::ChangedSince(42);
        let on = Some("1".to_string());
        let at = Some("42".to_string());
        assert_eq!(env_of(JobKind::Copy, Verification::Skip), (None, None));
        assert_eq!(
            env_of(JobKind::Copy, Verification::Full),
            (on.clone(), None)
        );
        assert_eq!(env_of(JobKind::Copy, since), (on, at.clone()));
        assert_eq!(env_of(JobKind::Verify, since), (None, at));
        assert_eq!(env_of(JobKind::Verify, Verification::Full), (None, None));
        for kind in [JobKind::PreCopy, JobKind::Measure] {
            assert_eq!(env_of(kind, since), (None, None), "{kind:?}");
        }
    }

    /// `ATTRS_SINCE` (the final pass compares the ACLs and xattrs of what changed since, the
    /// pre-copy having compared every entry's) reaches the final pass only, and only when the
    /// planner gives it.
    #[test]
    fn only_the_final_pass_learns_since_when_attributes_were_compared() {
        let req = testdata::request();
        let pass = |attributes_since| Pass {
            verification: Verification::ChangedSince(42),
            source: None,
            attributes_since,
        };
        assert_eq!(
            env_value(&req, JobKind::Copy, pass(Some(40)), "ATTRS_SINCE").as_deref(),
            Some("40")
        );
        assert_eq!(
            env_value(&req, JobKind::Copy, pass(None), "ATTRS_SINCE"),
            None
        );
        for kind in [JobKind::PreCopy, JobKind::Verify, JobKind::Measure] {
            assert_eq!(
                env_value(&req, kind, pass(Some(40)), "ATTRS_SINCE"),
                None,
                "{kind:?}"
            );
        }
    }

    /// The pre-copy learns from how many entries it compares every entry's ACLs and xattrs
    /// after `cp`; no other Job does.
    #[test]
    fn only_the_pre_copy_learns_from_how_many_entries_it_compares_attributes() {
        let req = testdata::request();
        let min = ATTRIBUTES_OF_CHANGED_MIN_ENTRIES.to_string();
        let of = |kind| env_value(&req, kind, Verification::Full, "ATTRS_MIN_ENTRIES");
        assert_eq!(of(JobKind::PreCopy), Some(min));
        for kind in [JobKind::Copy, JobKind::Verify, JobKind::Measure] {
            assert_eq!(of(kind), None, "{kind:?}");
        }
    }

    #[test]
    fn job_invariants() {
        let req = testdata::request();
        let member = testdata::member();
        for kind in KINDS {
            let job = job(
                &req,
                &testdata::image(),
                &member,
                &member.pod,
                kind,
                1200,
                Verification::Skip,
            );
            let name = job.metadata.name.clone().unwrap();
            assert!(crate::build::is_dns1123_label(&name), "{name}");
            let refs = job.metadata.owner_references.clone().unwrap();
            assert_eq!(refs[0].kind, "StorageMigrationRequest");
            let spec = job.spec.unwrap();
            assert_eq!(spec.backoff_limit, Some(0));
            assert_eq!(spec.active_deadline_seconds, Some(1200));
            let pod = spec.template.spec.unwrap();
            assert!(
                pod.node_name.is_none(),
                "pinned by affinity, never nodeName"
            );
            let fields = pod
                .affinity
                .unwrap()
                .node_affinity
                .unwrap()
                .required_during_scheduling_ignored_during_execution
                .unwrap()
                .node_selector_terms[0]
                .match_fields
                .clone()
                .unwrap();
            assert_eq!(fields[0].values, Some(vec!["node-b".to_string()]));
            assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
            assert_eq!(pod.security_context.unwrap().run_as_user, Some(0));
            let volumes = pod.volumes.unwrap();
            let source = volumes[0].persistent_volume_claim.clone().unwrap();
            assert_eq!(source.claim_name, "data-etcd-1");
            assert_eq!(source.read_only, Some(true));
            let c = &pod.containers[0];
            let mounts = c.volume_mounts.clone().unwrap();
            assert_eq!(mounts[0].mount_path, "/source");
            assert_eq!(mounts[0].read_only, Some(true));
            assert_eq!(c.resources, req.spec.copy.resources);
            assert_eq!(
                c.image.as_deref(),
                Some(testdata::IMAGE),
                "the operator's image"
            );
            let command = c.command.clone().unwrap();
            assert_eq!(command[..2], ["sh".to_string(), "-c".to_string()]);
            assert_eq!(command[2], kind.script());
            if kind == JobKind::Measure {
                assert_eq!(volumes.len(), 1, "measure mounts no target");
            } else {
                let target = volumes[1].persistent_volume_claim.clone().unwrap();
                assert_eq!(target.claim_name, member.temp_claim);
                assert_eq!(mounts[1].mount_path, "/target");
            }
            let labels = job.metadata.labels.unwrap();
            assert_eq!(labels[JOB_KIND_LABEL], kind.as_str());
            assert_eq!(spec.template.metadata.unwrap().labels.unwrap(), labels);
        }
    }

    #[test]
    fn pods_get_only_the_capabilities_of_their_kind_and_read_only_mounts_when_reading() {
        for kind in KINDS {
            let job = job(
                &testdata::request(),
                &testdata::image(),
                &testdata::member(),
                &testdata::member().pod,
                kind,
                60,
                Verification::Skip,
            );
            let pod = job.spec.unwrap().template.spec.unwrap();
            let psc = pod.security_context.unwrap();
            assert_eq!((psc.run_as_user, psc.run_as_group), (Some(0), Some(0)));
            assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
            let c = &pod.containers[0];
            let sc = c.security_context.clone().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{kind:?}");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{kind:?}");
            assert_eq!(sc.privileged, Some(false), "{kind:?}");
            let caps = sc.capabilities.unwrap();
            assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
            let add = caps.add.unwrap();
            let writes = matches!(kind, JobKind::PreCopy | JobKind::Copy);
            if writes {
                assert_eq!(add, security::COPY_CAPABILITIES, "{kind:?}");
            } else {
                assert_eq!(add, ["DAC_OVERRIDE"], "{kind:?}");
            }
            let mounts = c.volume_mounts.clone().unwrap();
            let volumes = pod.volumes.unwrap();
            for (m, v) in mounts.iter().zip(&volumes) {
                if m.mount_path == SCRATCH_PATH {
                    assert_eq!(kind, JobKind::Copy, "only the final pass has a scratch dir");
                    assert!(v.empty_dir.is_some() && v.persistent_volume_claim.is_none());
                    continue;
                }
                let ro = m.mount_path == SOURCE_PATH || !writes;
                assert_eq!(m.read_only, Some(ro), "{kind:?} {}", m.mount_path);
                let claim = v.persistent_volume_claim.as_ref().unwrap();
                assert_eq!(claim.read_only, Some(ro), "{kind:?} {}", m.mount_path);
            }
        }
    }

    #[test]
    fn runs_the_image_it_is_given_never_the_requests() {
        // The planner decides whether a request's moverImage is allowed
        // (`plan::Settings::mover_image`); the builder only runs what it is given.
        let mut req = testdata::request();
        req.spec.copy.mover_image = Some("registry.test/my-mover:1".into());
        for kind in KINDS {
            let job = job(
                &req,
                &testdata::image(),
                &testdata::member(),
                &testdata::member().pod,
                kind,
                60,
                Verification::Skip,
            );
            let pod = job.spec.unwrap().template.spec.unwrap();
            let image = pod.containers[0].image.as_deref();
            assert_eq!(image, Some(testdata::IMAGE), "{kind:?}");
        }
    }

    #[test]
    fn deadline_is_positive() {
        let job = job(
            &testdata::request(),
            &testdata::image(),
            &testdata::member(),
            &testdata::member().pod,
            JobKind::Copy,
            -5,
            Verification::Skip,
        );
        assert_eq!(job.spec.unwrap().active_deadline_seconds, Some(1));
    }

    #[test]
    fn scripts_use_fixed_flags() {
        for script in [PRECOPY_SCRIPT, COPY_SCRIPT] {
            assert!(script.contains(
                "rsync -aHS $attrs $delta $cap $select --numeric-ids --delete --modify-window=-1 $info --stats /source/ /target/"
            ));
            assert!(script.contains(
                "tr '\\r' '\\n' | sed -u -n -e 'w /dev/stderr' -e '/No space left on device/{p;d;}' -e '/%/{h;d;}' -e p -e '${x;p;}'"
            ));
        }
        assert!(PRECOPY_SCRIPT.starts_with("set -u\nok=' 0 24 '\n"));
        assert!(COPY_SCRIPT.starts_with("set -u\nok=' 0 '\n"));
        // The delta mode is chosen from constants only: nothing of the request reaches it.
        assert!(PRECOPY_SCRIPT.contains(
            "\nmode=WholeFile\ndelta=\ncap=${BWLIMIT:+--bwlimit=$BWLIMIT}\nattrs=-AX\nselect=\nlcount=\nrecheck=\n"
        ));
        // The final pass's file selection is tree-diff's list or nothing, fixed text.
        assert!(COPY_SCRIPT.contains(
            "\n  select='--files-from=/scratch/list --from0 --delete-missing-args --ignore-times'\n"
        ));
        assert!(COPY_SCRIPT.contains(
            "storage-migrator tree-diff /source /target --since \"$asince\" --output /scratch/list"
        ));
        // ACLs and xattrs are left out of the final pass's walk only on ATTRS_SINCE, which only
        // the planner sets, and with the pass over what changed since then after it.
        assert!(COPY_SCRIPT.contains("elif [ -n \"$asince\" ]; then attrs=; ascope=Changed\n"));
        assert!(COPY_SCRIPT.contains(
            "find . -xdev -newerct \"@$asince\" -exec sh -c 'exec rsync -aAXS --no-r -d --numeric-ids -R \"$@\" /target/' sh '{}' +"
        ));
        // The final pass is never capped, whatever its environment says.
        assert!(COPY_SCRIPT.contains("\nmode=Delta\ndelta='--no-whole-file --inplace'\ncap=\n"));
        assert!(VERIFY_SCRIPT.contains(
            "rsync -aHAXS --numeric-ids --delete --checksum --dry-run --itemize-changes /source/ /target/"
        ));
        assert!(MEASURE_SCRIPT.contains("du -s -B1 /source"));
    }

    #[test]
    fn parse_good_results() {
        assert_eq!(
            parse_job_result(r#"{"bytes":123,"files":4,"totalBytes":200,"exitCode":24}"#).unwrap(),
            JobResult {
                bytes: Some(123),
                files: Some(4),
                total_bytes: Some(200),
                exit_code: Some(24),
                ..Default::default()
            }
        );
        assert_eq!(
            parse_job_result("{\"usedBytes\":16384}\n")
                .unwrap()
                .used_bytes,
            Some(16384)
        );
        let verify = parse_job_result(r#"{"differences":0}"#).unwrap();
        assert_eq!(verify.differences, Some(0));
        assert!(!verify.failed());
        assert!(parse_job_result(r#"{"differences":3}"#).unwrap().failed());
        let failed = parse_job_result(r#"{"error":"rsync exited with 23","exitCode":23}"#).unwrap();
        assert!(failed.failed());
        assert_eq!(failed.exit_code, Some(23));
        // Log tail (FallbackToLogsOnError) whose last line is the result.
        let logs = "Number of files: 3\nTotal file size: 10 bytes\n{\"bytes\":10,\"files\":2}\n";
        assert_eq!(parse_job_result(logs).unwrap().files, Some(2));
        // Unknown extra fields are ignored (a newer mover script).
        assert_eq!(
            parse_job_result(r#"{"usedBytes":1,"elapsedMs":5}"#)
                .unwrap()
                .used_bytes,
            Some(1)
        );
    }

    #[test]
    fn parse_bad_results() {
        for bad in [
            "",
            "   \n",
            "rsync: command not found",
            "{",
            "{}",
            r#"{"bytes":"many"}"#,
            r#"{"bytes":-1}"#,
            "[1,2]",
            "null",
            "sh: 1: cannot create /dev/termination-log: Read-only file system\n",
        ] {
            let err = parse_job_result(bad).unwrap_err();
            assert!(
                matches!(err, BuildError::JobResult { .. }),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn job_result_round_trip() {
        let r = JobResult {
            bytes: Some(1),
            files: Some(2),
            ..Default::default()
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"bytes":1,"files":2}"#);
        assert_eq!(parse_job_result(&text).unwrap(), r);
    }

    #[test]
    fn scripts_snapshot() {
        for kind in KINDS {
            insta::assert_snapshot!(format!("script_{}", kind.as_str()), kind.script());
        }
    }

    /// Runs the real scripts (rsync, du, sh of this machine) on temporary trees, with the fixed
    /// paths rewritten to them. Skipped where rsync is missing.
    mod scripts {
        use super::*;
        use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
        use std::path::Path;
        use std::process::Command;

        struct Run {
            code: i32,
            result: Result<JobResult, BuildError>,
            stderr: String,
        }

        fn run(kind: JobKind, dir: &Path) -> Run {
            run_with_path(kind, dir, None)
        }

        /// The verification in `Changed` mode: the content of files changed since `since`.
        fn verify_changed(dir: &Path, since: i64) -> JobResult {
            let run = run_in(JobKind::Verify, dir, None, &[("SINCE", since.to_string())]);
            run.result.unwrap_or_else(|e| panic!("{e}: {}", run.stderr))
        }

        /// [`run`] with `bin` first on the `PATH` (programs standing in for the real ones).
        fn run_with_path(kind: JobKind, dir: &Path, bin: Option<&Path>) -> Run {
            run_in(kind, dir, bin, &[])
        }

        /// [`run_with_path`] with these environment variables as well.
        fn run_in(kind: JobKind, dir: &Path, bin: Option<&Path>, env: &[(&str, String)]) -> Run {
            let path = match bin {
                Some(bin) => format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
                None => std::env::var("PATH").unwrap_or_default(),
            };
            let src = dir.join("source");
            let dst = dir.join("target");
            let msg = dir.join("termination-log");
            let _ = std::fs::remove_file(&msg);
            let scratch = dir.join("scratch");
            std::fs::create_dir_all(&scratch).unwrap();
            let script = kind
                .script()
                .replace(SOURCE_PATH, src.to_str().unwrap())
                .replace(TARGET_PATH, dst.to_str().unwrap())
                .replace(SCRATCH_PATH, scratch.to_str().unwrap())
                .replace(TERMINATION_MESSAGE_PATH, msg.to_str().unwrap());
            let out = Command::new("sh")
                .args(["-c", &script])
                .env("LC_ALL", "C")
                .env("PATH", path)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .unwrap();
            let message = std::fs::read_to_string(&msg).unwrap_or_default();
            Run {
                code: out.status.code().unwrap_or(-1),
                result: parse_job_result(&message),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        }

        fn have(program: &str) -> bool {
            Command::new(program)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        }

        /// Whether rsync is installed. Without it these tests fail under CI (`CI=true`) or the
        /// README's command (`E2E_REQUIRE_ALL=1`), naming it; a run by hand prints `NOT RUN`.
        fn rsync_present(test: &str) -> bool {
            if have("rsync") {
                return true;
            }
            assert!(
                !must_run(),
                "{test}: rsync is not installed (CI refuses to skip)"
            );
            eprintln!("NOT RUN {test}: rsync is not installed");
            false
        }

        /// Whether a check that cannot run here fails the test (under CI or the README's
        /// command) instead of being left out.
        fn must_run() -> bool {
            let set = |var: &str, value: &str| std::env::var(var).is_ok_and(|v| v == value);
            set("CI", "true") || set("E2E_REQUIRE_ALL", "1")
        }

        /// A temporary dir with empty `source` and `target` trees; None (the test does not run)
        /// where rsync is not installed (see [`rsync_present`]).
        fn empty_trees() -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> {
            if !rsync_present("copy script test") {
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("source");
            let dst = dir.path().join("target");
            std::fs::create_dir_all(&src).unwrap();
            std::fs::create_dir_all(&dst).unwrap();
            Some((dir, src, dst))
        }

        /// The final pass after a pre-copy writes the blocks that changed, not the files that
        /// changed; with a hard-linked file on the target it copies whole files and says so.
        #[test]
        fn final_pass_writes_only_what_changed() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            // 8 MiB of varied bytes (a WAL segment): a pattern no block of which repeats.
            let wal: Vec<u8> = (0u32..2 << 20).flat_map(|i| i.to_le_bytes()).collect();
            std::fs::write(src.join("wal"), &wal).unwrap();
            let pre = run(JobKind::PreCopy, dir.path()).result.unwrap();
            assert_eq!(pre.mode, Some(CopyMode::KernelCopy), "{pre:?}");
            assert_eq!(pre.files, Some(1), "{pre:?}");
            // The tree's apparent size: the file and the target directory.
            assert!(pre.bytes.is_some_and(|b| b >= 8 << 20), "{pre:?}");

            // The member appends 4 KiB and rewrites 100 bytes in the middle, then stops.
            let mut changed = wal.clone();
            changed[4 << 20..(4 << 20) + 100].fill(0xAB);
            changed.extend(std::iter::repeat_n(0xCDu8, 4096));
            std::fs::write(src.join("wal"), &changed).unwrap();
            let copy = run(JobKind::Copy, dir.path());
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!(r.mode, Some(CopyMode::Delta), "{r:?}");
            // Both filesystems, for the check that the copy left room to run.
            let free = r.target_filesystem.as_ref().map(FsReport::available_bytes);
            assert!(free.is_some_and(|b| b > 0), "{r:?}");
            assert!(r.source_filesystem.is_some(), "{r:?}");
            assert_eq!(
                r.bytes,
                Some((8 << 20) + 4096),
                "the changed file's size: {r:?}"
            );
            let written = r.literal_bytes.unwrap();
            assert!(
                (4096..256 << 10).contains(&written),
                "wrote {written} bytes for 4196 changed"
            );
            assert_eq!(std::fs::read(dst.join("wal")).unwrap(), changed);
            let verify = run(JobKind::Verify, dir.path());
            assert_eq!(verify.result.unwrap().differences, Some(0));

            // A hard link on the target: an in-place write would change both names.
            std::fs::hard_link(dst.join("wal"), dst.join("wal-link")).unwrap();
            std::fs::hard_link(src.join("wal"), src.join("wal-link")).unwrap();
            changed[100..200].fill(0x11);
            std::fs::write(src.join("other"), &changed).unwrap();
            std::fs::remove_file(src.join("wal-link")).unwrap();
            std::fs::rename(src.join("other"), src.join("wal-link")).unwrap();
            let copy = run(JobKind::Copy, dir.path());
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!(r.mode, Some(CopyMode::WholeFile), "{r:?}");
            assert_eq!(std::fs::read(dst.join("wal-link")).unwrap(), changed);
            let verify = run(JobKind::Verify, dir.path());
            assert_eq!(
                verify.result.unwrap().differences,
                Some(0),
                "{}",
                verify.stderr
            );

            // A `find` that cannot answer (no `-quit`): whole files, not a guess.
            std::fs::remove_file(dst.join("wal-link")).unwrap();
            std::fs::remove_file(src.join("wal-link")).unwrap();
            let bin = stand_in(dir.path(), "find", "#!/bin/sh\nexit 1\n");
            let copy = run_with_path(JobKind::Copy, dir.path(), Some(&bin));
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            assert_eq!(copy.result.unwrap().mode, Some(CopyMode::WholeFile));
        }

        /// With `VERIFY`, the final pass verifies in the same run and writes one result with
        /// the copy's numbers and the verification's; without it, no verification fields.
        /// Differences fail it with both; a comparison that fails writes its error and mode.
        #[test]
        fn the_final_pass_verifies_in_its_own_run_when_asked() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            std::fs::write(src.join("a"), b"first").unwrap();
            assert_eq!(run(JobKind::PreCopy, dir.path()).code, 0);
            std::fs::write(src.join("b"), b"written while it served").unwrap();
            let verify = [("VERIFY", "1".to_string()), ("SINCE", "0".to_string())];
            let copy = run_in(JobKind::Copy, dir.path(), None, &verify);
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!((r.files, r.differences), (Some(1), Some(0)), "{r:?}");
            assert_eq!(r.verify_mode, Some(crate::api::VerifyMode::Changed));
            assert_eq!(
                r.checked_files,
                Some(2),
                "both files are newer than 0: {r:?}"
            );
            let full = run_in(JobKind::Copy, dir.path(), None, &verify[..1]);
            let r = full.result.unwrap();
            assert_eq!(
                (r.differences, r.verify_mode),
                (Some(0), Some(crate::api::VerifyMode::Full))
            );
            let plain = run(JobKind::Copy, dir.path()).result.unwrap();
            assert!(!plain.verified_in_pass(), "{plain:?}");

            // An rsync that corrupts what it writes: the copy succeeds, the verification in
            // the same run does not.
            let real = real_program("rsync");
            let wrapper = format!(
                "#!/bin/sh\n\"{real}\" \"$@\"; rc=$?\ncase \" $* \" in *\" --dry-run \"*) [ -n \"${{BREAK:-}}\" ] && exit 23;; *) echo bad >> {}/b;; esac\nexit $rc\n",
                dst.display()
            );
            let bin = stand_in(dir.path(), "rsync", &wrapper);
            std::fs::write(src.join("b"), b"changed while it was down").unwrap();
            let corrupt = run_in(JobKind::Copy, dir.path(), Some(&bin), &verify);
            assert_eq!(corrupt.code, 1, "{}", corrupt.stderr);
            let r = corrupt.result.unwrap();
            assert!(r.verified_in_pass() && r.failed(), "{r:?}");
            assert_eq!((r.differences, r.files), (Some(1), Some(1)), "{r:?}");
            assert!(
                corrupt.stderr.contains("differ in 1 entries"),
                "{}",
                corrupt.stderr
            );

            let mut broken = verify.to_vec();
            broken.push(("BREAK", "1".to_string()));
            let failed = run_in(JobKind::Copy, dir.path(), Some(&bin), &broken);
            assert_eq!(failed.code, 23, "{}", failed.stderr);
            let r = failed.result.unwrap();
            assert_eq!(
                r.verify_mode,
                Some(crate::api::VerifyMode::Changed),
                "{r:?}"
            );
            assert!(r.error.unwrap().contains("verification"));
        }

        /// Both copy passes flush the target's filesystem before they report (`sync -f`), and
        /// fall back to a plain `sync` where `-f` is refused.
        #[test]
        fn both_passes_flush_the_target_before_they_report() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            std::fs::write(src.join("a"), b"data").unwrap();
            let calls = dir.path().join("sync-calls");
            let fake = |refuse_f: bool| {
                let refuse = if refuse_f {
                    "[ \"$1\" = -f ] && exit 1\n"
                } else {
                    ""
                };
                let script = format!(
                    "#!/bin/sh\necho \"sync $*\" >> {}\n{refuse}exit 0\n",
                    calls.display()
                );
                stand_in(dir.path(), "sync", &script)
            };
            let bin = fake(false);
            for kind in [JobKind::PreCopy, JobKind::Copy] {
                let _ = std::fs::remove_file(&calls);
                let run = run_with_path(kind, dir.path(), Some(&bin));
                assert_eq!(run.code, 0, "{kind:?}: {}", run.stderr);
                let log = std::fs::read_to_string(&calls).unwrap_or_default();
                assert_eq!(log, format!("sync -f {}\n", dst.display()), "{kind:?}");
            }
            fake(true);
            let _ = std::fs::remove_file(&calls);
            assert_eq!(run_with_path(JobKind::Copy, dir.path(), Some(&bin)).code, 0);
            let log = std::fs::read_to_string(&calls).unwrap_or_default();
            assert_eq!(log, format!("sync -f {}\nsync \n", dst.display()));
        }

        /// Writes `script` as the program `name` in `dir/bin`, executable, standing in for the
        /// real one when `dir/bin` comes first on the `PATH`; returns `dir/bin`.
        /// `dir/bin` with `storage-migrator` in it (the binary `cargo build --bins` left beside
        /// this test's): the final pass's `tree-diff`. None (the test does not run) without
        /// it, which fails under CI or the README's command.
        fn with_tree_diff(dir: &Path) -> Option<std::path::PathBuf> {
            let exe = std::env::current_exe().unwrap();
            let built = exe
                .parent()
                .and_then(Path::parent)
                .map(|d| d.join("storage-migrator"));
            let Some(built) = built.filter(|b| b.is_file()) else {
                assert!(
                    !must_run(),
                    "storage-migrator is not built beside the tests: run cargo build --bins first (CI refuses to skip)"
                );
                eprintln!("NOT RUN: storage-migrator is not built beside the tests");
                return None;
            };
            let bin = dir.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            let link = bin.join("storage-migrator");
            if !link.exists() {
                std::os::unix::fs::symlink(built, link).unwrap();
            }
            Some(bin)
        }

        fn stand_in(dir: &Path, name: &str, script: &str) -> std::path::PathBuf {
            let bin = dir.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join(name), script).unwrap();
            std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755))
                .unwrap();
            bin
        }

        /// Sets `path`'s modification time to `other`'s, as a writer that keeps it would.
        fn same_mtime(path: &Path, other: &Path) {
            let mtime = std::fs::metadata(other).unwrap().modified().unwrap();
            let f = std::fs::File::options().write(true).open(path).unwrap();
            f.set_modified(mtime).unwrap();
        }

        /// Overwrites `path` with bytes of the same size, keeping its modification time: rsync's
        /// quick check cannot see the change.
        fn rewrite_in_place(path: &Path, byte: u8) {
            let before = std::fs::metadata(path).unwrap();
            let len = usize::try_from(before.len()).unwrap();
            let f = std::fs::File::options().write(true).open(path).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &vec![byte; len], 0).unwrap();
            f.set_modified(before.modified().unwrap()).unwrap();
        }

        /// `Changed` compares the content of the files changed since `SINCE` (also where the
        /// copy's quick check missed a change), metadata of the whole tree, and nothing more;
        /// `Full` also finds a difference in a file unchanged since.
        #[test]
        fn verify_changed_reads_the_content_of_what_changed() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            std::fs::write(src.join("old"), vec![1u8; 1 << 20]).unwrap();
            std::fs::write(src.join("kept-mtime"), vec![2u8; 4096]).unwrap();
            assert_eq!(run(JobKind::PreCopy, dir.path()).code, 0);
            // Every file so far changed before `since` (find compares whole seconds).
            std::thread::sleep(std::time::Duration::from_millis(1100));
            let since = jiff::Timestamp::now().as_second();
            // Past `since` by more than the kernel's coarse clock may lag.
            std::thread::sleep(std::time::Duration::from_millis(100));
            std::fs::write(src.join("hot"), "written after the pre-copy").unwrap();
            // Same size and modification time: the final pass's quick check skips it.
            rewrite_in_place(&src.join("kept-mtime"), 3);
            assert_eq!(run(JobKind::Copy, dir.path()).code, 0);

            let r = verify_changed(dir.path(), since);
            assert_eq!(r.verify_mode, Some(crate::api::VerifyMode::Changed));
            assert_eq!(r.checked_files, Some(2), "hot and kept-mtime: {r:?}");
            assert_eq!(r.differences, Some(1), "kept-mtime's content: {r:?}");
            assert_eq!(
                std::fs::read(dst.join("kept-mtime")).unwrap(),
                vec![2u8; 4096]
            );

            // Once copied (checksums force it), both modes agree.
            std::fs::write(dst.join("kept-mtime"), vec![3u8; 4096]).unwrap();
            same_mtime(&dst.join("kept-mtime"), &src.join("kept-mtime"));
            assert_eq!(verify_changed(dir.path(), since).differences, Some(0));
            let full = run(JobKind::Verify, dir.path()).result.unwrap();
            assert_eq!(full.verify_mode, Some(crate::api::VerifyMode::Full));
            assert_eq!((full.differences, full.checked_files), (Some(0), None));

            // A file unchanged since `since` is not read again in Changed mode: damage to its
            // copy is what only Full finds.
            rewrite_in_place(&dst.join("old"), 9);
            assert_eq!(verify_changed(dir.path(), since).differences, Some(0));
            assert_eq!(run(JobKind::Verify, dir.path()).code, 1);

            // Metadata is compared over the whole tree: a mode, an extra entry.
            std::fs::write(dst.join("old"), vec![1u8; 1 << 20]).unwrap();
            same_mtime(&dst.join("old"), &src.join("old"));
            std::fs::set_permissions(dst.join("old"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
            std::fs::write(dst.join("extra"), "only on the target").unwrap();
            let r = run_in(
                JobKind::Verify,
                dir.path(),
                None,
                &[("SINCE", since.to_string())],
            );
            assert_eq!(r.code, 1, "{}", r.stderr);
            // The mode, the extra file, and the target directory's time it changed.
            assert_eq!(r.result.unwrap().differences, Some(3), "{}", r.stderr);
            assert!(
                r.stderr.contains("extra") && r.stderr.contains("old"),
                "{}",
                r.stderr
            );
        }

        /// Sets (`Some`) or removes (`None`) the xattr `user.smr` of `path`; false where the
        /// filesystem takes no user xattrs (or `setfattr` is missing).
        fn set_xattr(path: &Path, value: Option<&str>) -> bool {
            let mut cmd = Command::new("setfattr");
            match value {
                Some(v) => cmd.args(["-n", "user.smr", "-v", v]),
                None => cmd.args(["-x", "user.smr"]),
            };
            cmd.arg(path).status().is_ok_and(|s| s.success())
        }

        /// The value of `path`'s xattr `user.smr`, if it has one.
        fn xattr(path: &Path) -> Option<String> {
            let out = Command::new("getfattr")
                .args(["--only-values", "-n", "user.smr"])
                .arg(path)
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        }

        /// The pre-copy compares every entry's ACLs and xattrs after `cp` (and copies what
        /// `cp` left out); a final pass given `ATTRS_SINCE` leaves them out of its walk of the
        /// whole tree and copies and verifies those of the entries changed since: an xattr
        /// added, changed or removed, an ACL set, a new file's. Its verification finds an xattr
        /// of a changed entry that the copy got wrong.
        #[test]
        fn final_pass_compares_the_attributes_of_what_changed_since_the_pre_copy() {
            attributes_of_what_changed(false);
        }

        /// The same with `storage-migrator tree-diff` listing what the final pass copies.
        #[test]
        fn final_pass_on_tree_diffs_list_keeps_the_attributes_of_what_changed() {
            attributes_of_what_changed(true);
        }

        /// tree-diff's list: content rewritten at the same size and time, a tree removed, a
        /// hard link added and one removed, a new tree, a mode, a directory become a file and a
        /// file become a directory; then nothing to list at all.
        #[test]
        fn final_pass_on_tree_diffs_list_copies_removes_and_links() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            std::fs::create_dir_all(src.join("x/y")).unwrap();
            std::fs::create_dir_all(src.join("swap")).unwrap();
            for name in ["a", "keep", "h1", "x/y/z", "swap/inside", "flip"] {
                std::fs::write(src.join(name), name).unwrap();
            }
            std::fs::hard_link(src.join("h1"), src.join("h2")).unwrap();
            let many = [("ATTRS_MIN_ENTRIES", "1".to_string())];
            let pre = run_in(JobKind::PreCopy, dir.path(), None, &many);
            assert_eq!(pre.code, 0, "{}", pre.stderr);
            std::thread::sleep(std::time::Duration::from_millis(1100));
            let since = jiff::Timestamp::now().as_second();
            std::thread::sleep(std::time::Duration::from_millis(100));
            let before = std::fs::metadata(src.join("a"))
                .unwrap()
                .modified()
                .unwrap();
            std::fs::write(src.join("a"), "A").unwrap();
            let f = std::fs::File::options()
                .write(true)
                .open(src.join("a"))
                .unwrap();
            f.set_modified(before).unwrap();
            std::fs::remove_dir_all(src.join("x")).unwrap();
            std::fs::hard_link(src.join("h1"), src.join("h3")).unwrap();
            std::fs::remove_file(src.join("h2")).unwrap();
            std::fs::create_dir_all(src.join("n/m")).unwrap();
            std::fs::write(src.join("n/m/file"), "new").unwrap();
            std::fs::set_permissions(src.join("keep"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
            // A directory that became a file, a file that became a directory.
            std::fs::remove_dir_all(src.join("swap")).unwrap();
            std::fs::write(src.join("swap"), "a file now").unwrap();
            std::fs::remove_file(src.join("flip")).unwrap();
            std::fs::create_dir(src.join("flip")).unwrap();
            std::fs::write(src.join("flip/child"), "child").unwrap();
            let Some(bin) = with_tree_diff(dir.path()) else {
                return;
            };
            let env = |attrs_since: i64| {
                [
                    ("VERIFY", "1".to_string()),
                    ("SINCE", since.to_string()),
                    ("ATTRS_SINCE", attrs_since.to_string()),
                ]
            };
            let copy = run_in(JobKind::Copy, dir.path(), Some(&bin), &env(since));
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!(
                (r.differences, r.mode),
                (Some(0), Some(CopyMode::WholeFile)),
                "{r:?}"
            );
            // a, keep, h1, h3, n, n/m, n/m/file, swap, flip, flip/child, and h2, x (gone
            // from the old volume); the root and its time.
            assert_eq!(r.listed_entries, Some(13), "{}", copy.stderr);
            assert_eq!(std::fs::read_to_string(dst.join("a")).unwrap(), "A");
            assert!(!dst.join("x").exists() && !dst.join("h2").exists());
            assert_eq!(
                std::fs::read_to_string(dst.join("swap")).unwrap(),
                "a file now"
            );
            assert_eq!(
                std::fs::read_to_string(dst.join("flip/child")).unwrap(),
                "child"
            );
            let ino = |p: &str| std::fs::metadata(dst.join(p)).unwrap().ino();
            assert_eq!(ino("h1"), ino("h3"));
            // Checked apart from the script: nothing differs, content included.
            let out = Command::new("rsync")
                .args([
                    "-aHAXS",
                    "--delete",
                    "--checksum",
                    "--dry-run",
                    "--itemize-changes",
                ])
                .arg(format!("{}/", src.display()))
                .arg(format!("{}/", dst.display()))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "");
            // Nothing changed after ATTRS_SINCE: an empty list, nothing copied, nothing differs.
            let far = since + 1_000_000;
            let again = run_in(JobKind::Copy, dir.path(), Some(&bin), &env(far));
            assert_eq!(again.code, 0, "{}", again.stderr);
            let r = again.result.unwrap();
            assert_eq!(
                (r.listed_entries, r.files, r.differences),
                (Some(0), Some(0), Some(0)),
                "{r:?}"
            );
        }

        fn attributes_of_what_changed(listed: bool) {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            for name in ["kept", "added", "removed", "acl"] {
                std::fs::write(src.join(name), name).unwrap();
            }
            std::fs::create_dir(src.join("dir")).unwrap();
            std::fs::create_dir_all(src.join("tree/sub")).unwrap();
            std::fs::write(src.join("tree/sub/labelled"), "moved with its directory").unwrap();
            if !set_xattr(&src.join("kept"), Some("1")) {
                assert!(!must_run(), "setfattr failed (CI refuses to skip)");
                eprintln!("NOT RUN: no user xattrs on the temporary filesystem");
                return;
            }
            assert!(set_xattr(&src.join("removed"), Some("2")));
            assert!(set_xattr(&src.join("tree/sub/labelled"), Some("7")));
            // A `cp` that copies but leaves out an xattr: rsync after it puts it back.
            let real = real_program("cp");
            let lossy = format!(
                "#!/bin/sh\ncase \"$1\" in --version) exec {real} --version;; esac\n{real} \"$@\" || exit $?\nsetfattr -x user.smr {}\n",
                dst.join("kept").display()
            );
            let bin = stand_in(dir.path(), "cp", &lossy);
            // As on a volume of that many entries: this filesystem has more in use.
            let many = [("ATTRS_MIN_ENTRIES", "1".to_string())];
            let pre = run_in(JobKind::PreCopy, dir.path(), Some(&bin), &many);
            assert_eq!(pre.code, 0, "{}", pre.stderr);
            let r = pre.result.unwrap();
            assert_eq!(r.mode, Some(CopyMode::KernelCopy), "{r:?}");
            assert_eq!(
                r.attributes_compared,
                Some(AttributesCompared::All),
                "{r:?}"
            );
            assert_eq!(
                xattr(&dst.join("kept")).as_deref(),
                Some("1"),
                "{}",
                pre.stderr
            );

            std::thread::sleep(std::time::Duration::from_millis(1100));
            let since = jiff::Timestamp::now().as_second();
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(set_xattr(&src.join("added"), Some("3")));
            assert!(set_xattr(&src.join("removed"), None));
            assert!(set_xattr(&src.join("dir"), Some("6")));
            // A directory renamed: the files under it keep their inode change times, but the
            // final pass writes them anew at their new paths.
            std::fs::rename(src.join("tree"), src.join("renamed")).unwrap();
            std::fs::write(src.join("new"), "new").unwrap();
            assert!(set_xattr(&src.join("new"), Some("4")));
            let setfacl = |args: &[&str], path: &Path| {
                Command::new("setfacl")
                    .args(args)
                    .arg(path)
                    .status()
                    .is_ok_and(|s| s.success())
            };
            let acl = setfacl(&["-m", "u:1234:r"], &src.join("acl"));
            assert!(acl || !must_run(), "setfacl failed (CI refuses to skip)");
            if acl {
                // A new file in a directory with a default ACL, its inherited ACL then removed:
                // the copy, made by a pass that sets no ACLs, inherits it on the new volume.
                std::fs::create_dir(src.join("inherits")).unwrap();
                assert!(setfacl(&["-d", "-m", "u:1234:rw"], &src.join("inherits")));
                std::fs::write(src.join("inherits/file"), "inherits").unwrap();
                assert!(setfacl(&["-b"], &src.join("inherits/file")));
            }
            let env = [
                ("VERIFY", "1".to_string()),
                ("SINCE", since.to_string()),
                ("ATTRS_SINCE", since.to_string()),
            ];
            let bin = if listed {
                let Some(bin) = with_tree_diff(dir.path()) else {
                    return;
                };
                std::fs::remove_file(bin.join("cp")).unwrap();
                Some(bin)
            } else {
                None
            };
            let copy = run_in(JobKind::Copy, dir.path(), bin.as_deref(), &env);
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!(
                r.attributes_compared,
                Some(AttributesCompared::Changed),
                "{r:?}"
            );
            assert_eq!(r.listed_entries.is_some(), listed, "{}", copy.stderr);
            // added, removed, acl, new (and inherits/file): the regular files changed; tree-diff
            // also lists renamed/sub/labelled (at a path the new volume lacks).
            let changed_files = if acl { 5 } else { 4 } + i64::from(listed);
            assert_eq!(
                (r.differences, r.checked_files),
                (Some(0), Some(changed_files)),
                "{r:?}"
            );
            let expected = [
                ("kept", Some("1")),
                ("added", Some("3")),
                ("removed", None),
                ("dir", Some("6")),
                ("renamed/sub/labelled", Some("7")),
            ];
            for (name, value) in expected {
                assert_eq!(xattr(&dst.join(name)).as_deref(), value, "{name}");
            }
            assert_eq!(xattr(&dst.join("new")).as_deref(), Some("4"));
            if acl {
                let acl_of = |p: &Path| {
                    let out = Command::new("getfacl").args(["-c", "-n"]).arg(p).output();
                    String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
                };
                assert!(acl_of(&dst.join("acl")).contains("user:1234:r--"));
                for name in ["acl", "inherits", "inherits/file"] {
                    assert_eq!(acl_of(&dst.join(name)), acl_of(&src.join(name)), "{name}");
                }
                assert!(!acl_of(&dst.join("inherits/file")).contains("1234"));
            }
            // Independent of the copy's pass: an rsync that loses the xattrs of a changed
            // file, a changed directory and a file the pass wrote (renamed again: written anew)
            // after every copy fails the verification in the same run, on all three.
            assert!(set_xattr(&src.join("added"), Some("5")));
            std::fs::rename(src.join("renamed"), src.join("again")).unwrap();
            let real = real_program("rsync");
            let lossy = format!(
                "#!/bin/sh\n\"{real}\" \"$@\"; rc=$?\ncase \" $* \" in *\" --dry-run \"*) ;; *) setfattr -x user.smr {} {} {} 2>/dev/null;; esac\nexit $rc\n",
                dst.join("added").display(),
                dst.join("dir").display(),
                dst.join("again/sub/labelled").display()
            );
            let bin = stand_in(dir.path(), "rsync", &lossy);
            let broken = run_in(JobKind::Copy, dir.path(), Some(&bin), &env);
            assert_eq!(broken.code, 1, "{}", broken.stderr);
            let r = broken.result.unwrap();
            assert_eq!(r.differences, Some(3), "{}", broken.stderr);
            for name in ["added", "dir", "again/sub/labelled"] {
                assert!(broken.stderr.contains(name), "{name}: {}", broken.stderr);
            }
        }

        #[test]
        fn copy_verify_measure_on_real_trees() {
            if !rsync_present("copy script test") {
                return;
            }
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("source");
            let dst = dir.path().join("target");
            std::fs::create_dir_all(&dst).unwrap();
            let kept = rich_tree(&src);
            // Stale file on the target that --delete must remove.
            std::fs::write(dst.join("stale"), "old").unwrap();

            let copy = run(JobKind::Copy, dir.path());
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!(r.exit_code, Some(0));
            // a.txt, b.bin, secret, sparse: the hard link is made, not transferred.
            assert_eq!(r.files, Some(4), "{r:?}");
            assert!(r.bytes.unwrap() >= 100_000, "{r:?}");
            assert!(r.total_bytes.unwrap() >= r.bytes.unwrap());
            // The progress went to the log, one update a line, and reads as complete.
            let progress =
                crate::build::parse_progress(&copy.stderr, crate::api::CopyPass::Copy, None)
                    .unwrap_or_else(|| panic!("no progress line in {:?}", copy.stderr));
            // rsync may stop at 99 % (its percentage counts sizes it does not transfer), but it
            // checked every entry.
            assert!(progress.percent >= 99, "{progress:?}");
            assert_eq!(progress.files_done, progress.files_total, "{progress:?}");
            assert_eq!(progress.files_total, Some(9), "{progress:?}");
            assert!(!copy.stderr.contains('\r'), "{:?}", copy.stderr);

            assert!(!dst.join("stale").exists());
            assert_kept(&dst, kept);

            // A second pass transfers nothing.
            let again = run(JobKind::PreCopy, dir.path()).result.unwrap();
            assert_eq!((again.files, again.bytes), (Some(0), Some(0)), "{again:?}");

            let verify = run(JobKind::Verify, dir.path());
            assert_eq!(verify.code, 0, "{}", verify.stderr);
            assert_eq!(verify.result.unwrap().differences, Some(0));

            let measure = run(JobKind::Measure, dir.path());
            assert_eq!(measure.code, 0, "{}", measure.stderr);
            let result = measure.result.unwrap();
            let fs = result
                .filesystem
                .clone()
                .expect("stat -f reported the filesystem");
            assert!(
                !fs.fs_type.is_empty() && fs.blocks > 0 && fs.inodes >= 0,
                "{fs:?}"
            );
            let used = result.used_bytes.unwrap();
            assert!(
                (100_000..8 << 20).contains(&used),
                "allocated bytes, not apparent: {used}"
            );

            // Same size and mtime, other content: only --checksum sees it. Plus an extra file.
            let b = dst.join("nested/b.bin");
            let mtime = std::fs::metadata(&b).unwrap().modified().unwrap();
            std::fs::write(&b, vec![8u8; 100_000]).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&b)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
            std::fs::write(dst.join("extra"), "x").unwrap();
            let verify = run(JobKind::Verify, dir.path());
            assert_eq!(verify.code, 1);
            let r = verify.result.unwrap();
            // b.bin's content, the extra file, and (when the clock ticked over a second since
            // the copy) the target root's mtime, which the extra file changed.
            let n = r.differences.unwrap();
            assert!((2..=3).contains(&n), "{n}: {}", verify.stderr);
            assert!(r.failed());
            assert!(verify.stderr.contains("nested/b.bin"), "{}", verify.stderr);
            assert!(
                verify.stderr.contains("*deleting   extra"),
                "{}",
                verify.stderr
            );
        }

        /// A tree with what a copy must keep: nested and empty directories, a hard link, a
        /// symlink, a file of mode 0600 (owned by 1234:5678 when run as root), a sparse file of
        /// 8 MiB with nothing written, and an xattr where the filesystem takes them. Returns
        /// which of the owner and the xattr it could set, for [`assert_kept`].
        fn rich_tree(src: &Path) -> (bool, bool) {
            std::fs::create_dir_all(src.join("nested/empty")).unwrap();
            std::fs::write(src.join("a.txt"), "hello world\n").unwrap();
            std::fs::write(src.join("nested/b.bin"), vec![7u8; 100_000]).unwrap();
            std::fs::hard_link(src.join("a.txt"), src.join("nested/a-link.txt")).unwrap();
            symlink("../a.txt", src.join("nested/sym")).unwrap();
            let secret = src.join("secret");
            std::fs::write(&secret, "s").unwrap();
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
            let is_root = nix_is_root();
            if is_root {
                std::os::unix::fs::chown(&secret, Some(1234), Some(5678)).unwrap();
            }
            let f = std::fs::File::create(src.join("sparse")).unwrap();
            f.set_len(8 << 20).unwrap();
            drop(f);
            let xattr = Command::new("setfattr")
                .args(["-n", "user.smr", "-v", "kept"])
                .arg(src.join("a.txt"))
                .status()
                .is_ok_and(|s| s.success());
            (is_root, xattr)
        }

        /// The copy of [`rich_tree`] in `dst` kept all of it.
        fn assert_kept(dst: &Path, (is_root, xattr): (bool, bool)) {
            let a = std::fs::metadata(dst.join("a.txt")).unwrap();
            let link = std::fs::metadata(dst.join("nested/a-link.txt")).unwrap();
            assert_eq!(a.ino(), link.ino(), "hard link kept");
            assert!(dst.join("nested/empty").is_dir());
            assert_eq!(
                std::fs::read_link(dst.join("nested/sym")).unwrap(),
                Path::new("../a.txt")
            );
            let s = std::fs::metadata(dst.join("secret")).unwrap();
            assert_eq!(s.mode() & 0o777, 0o600);
            if is_root {
                assert_eq!((s.uid(), s.gid()), (1234, 5678), "numeric owner kept");
            }
            if xattr {
                let out = Command::new("getfattr")
                    .args(["--only-values", "-n", "user.smr"])
                    .arg(dst.join("a.txt"))
                    .output()
                    .unwrap();
                assert_eq!(String::from_utf8_lossy(&out.stdout), "kept", "xattr kept");
            } else {
                assert!(
                    !must_run(),
                    "setfattr failed: no user xattrs on the temporary filesystem (CI refuses to skip the xattr check)"
                );
                eprintln!("NOT RUN xattr check: no user xattrs on the temporary filesystem");
            }
            let sparse = std::fs::metadata(dst.join("sparse")).unwrap();
            assert_eq!(sparse.len(), 8 << 20);
            assert!(sparse.blocks() * 512 < 1 << 20, "sparse file stays sparse");
        }

        /// Onto an empty target the pre-copy copies with `cp -a` and keeps everything rsync
        /// keeps: a verification of the whole tree finds no difference, and the final pass
        /// after it has nothing to copy. Its progress reaches the log while `cp` runs (a `cp`
        /// slowed by a second after its copy).
        #[test]
        fn pre_copy_onto_an_empty_target_copies_with_cp_and_keeps_everything() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            let kept = rich_tree(&src);
            let real = real_program("cp");
            let slow = format!(
                "#!/bin/sh\ncase \"$1\" in --version) exec {real} --version;; esac\n{real} \"$@\" || exit $?\nsleep 2\n"
            );
            let bin = stand_in(dir.path(), "cp", &slow);
            let pre = run_with_path(JobKind::PreCopy, dir.path(), Some(&bin));
            assert_eq!(pre.code, 0, "{}", pre.stderr);
            let r = pre.result.unwrap();
            assert_eq!(r.mode, Some(CopyMode::KernelCopy), "{r:?}");
            // a.txt and its link, b.bin, secret, sparse: regular file names.
            assert_eq!(r.files, Some(5), "{r:?}");
            assert!(r.bytes.is_some_and(|b| b >= 100_000 + (8 << 20)), "{r:?}");
            let progress =
                crate::build::parse_progress(&pre.stderr, crate::api::CopyPass::PreCopy, None)
                    .unwrap_or_else(|| panic!("no progress line in {:?}", pre.stderr));
            assert!(progress.bytes_done >= 100_000, "{progress:?}");
            assert_kept(&dst, kept);
            // Fewer entries than ATTRS_MIN_ENTRIES (none given here): no rsync after `cp`.
            assert_eq!(
                r.attributes_compared,
                Some(AttributesCompared::None),
                "{r:?}"
            );
            assert!(!pre.stderr.contains("rsync after cp"), "{}", pre.stderr);

            let verify = run(JobKind::Verify, dir.path());
            assert_eq!(verify.code, 0, "{}", verify.stderr);
            assert_eq!(verify.result.unwrap().differences, Some(0));
            let copy = run(JobKind::Copy, dir.path()).result.unwrap();
            assert_eq!((copy.files, copy.bytes), (Some(0), Some(0)), "{copy:?}");
            // rsync after the pre-copy, in whole files: the tree has a hard link.
            assert_eq!(copy.mode, Some(CopyMode::WholeFile), "{copy:?}");
        }

        /// Without a pre-copy the final pass finds the new volume empty and copies with `cp -a`
        /// too; its verification pass in the same run finds the trees equal.
        #[test]
        fn final_pass_onto_an_empty_target_copies_with_cp_and_verifies() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            let kept = rich_tree(&src);
            let copy = run_in(JobKind::Copy, dir.path(), None, &[("VERIFY", "1".into())]);
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            let r = copy.result.unwrap();
            assert_eq!(r.mode, Some(CopyMode::KernelCopy), "{r:?}");
            assert_eq!((r.files, r.differences), (Some(5), Some(0)), "{r:?}");
            assert_eq!(r.verify_mode, Some(crate::api::VerifyMode::Full), "{r:?}");
            assert_kept(&dst, kept);
        }

        /// rsync copies instead of `cp` when asked (`FIRST_PASS_TOOL=Rsync`), when `cp` is not
        /// GNU's, when the target already holds something (a pass resumed), and after a `cp`
        /// that failed (rsync finishes its pass): each ends with the whole tree copied.
        #[test]
        fn pre_copy_falls_to_rsync_where_cp_cannot_serve() {
            let real = real_program("cp");
            let busybox = "#!/bin/sh\necho 'BusyBox v1.36.1 multi-call binary.'\nexit 1\n";
            let failing = format!(
                "#!/bin/sh\ncase \"$1\" in --version) exec {real} --version;; esac\n{real} \"$@\"\necho 'cp: cannot stat: No such file or directory' >&2\nexit 1\n"
            );
            for case in ["asked", "busybox", "not empty", "cp failed"] {
                let Some((dir, src, dst)) = empty_trees() else {
                    return;
                };
                let kept = rich_tree(&src);
                let mut env = vec![];
                let bin = match case {
                    "asked" => {
                        env.push(("FIRST_PASS_TOOL", "Rsync".to_string()));
                        None
                    }
                    "busybox" => Some(stand_in(dir.path(), "cp", busybox)),
                    "not empty" => {
                        std::fs::write(dst.join("a.txt"), "partial").unwrap();
                        None
                    }
                    _ => Some(stand_in(dir.path(), "cp", &failing)),
                };
                let pre = run_in(JobKind::PreCopy, dir.path(), bin.as_deref(), &env);
                assert_eq!(pre.code, 0, "{case}: {}", pre.stderr);
                let r = pre.result.unwrap();
                assert_eq!(r.mode, Some(CopyMode::WholeFile), "{case}: {r:?}");
                let why = match case {
                    "asked" => "rsync copies: firstPassTool is Rsync",
                    "busybox" => "rsync copies: the image's cp is not GNU coreutils'",
                    "not empty" => "rsync copies: the new volume already holds data",
                    _ => "cp exited with 1: rsync finishes the pass",
                };
                assert!(pre.stderr.contains(why), "{case}: {}", pre.stderr);
                assert_kept(&dst, kept);
                let verify = run(JobKind::Verify, dir.path());
                assert_eq!(verify.code, 0, "{case}: {}", verify.stderr);
            }
        }

        /// The path of `program` on this machine's `PATH`.
        fn real_program(program: &str) -> String {
            let out = Command::new("sh")
                .args(["-c", &format!("command -v {program}")])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }

        /// A file the member rewrote within the same second as the pre-copy, at the same size
        /// (etcd preallocates its WAL segments), must be copied by the final pass: rsync's quick
        /// check compares whole seconds unless told otherwise.
        #[test]
        fn final_pass_copies_a_same_second_same_size_rewrite() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            let wal = src.join("wal");
            let at =
                |nanos: u32| std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, nanos);
            std::fs::write(&wal, vec![1u8; 64 * 1024]).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&wal)
                .unwrap()
                .set_modified(at(100))
                .unwrap();
            let pre = run(JobKind::PreCopy, dir.path());
            assert_eq!(pre.code, 0, "{}", pre.stderr);
            // Rewritten 0.5 s later in the same second, same size.
            std::fs::write(&wal, vec![2u8; 64 * 1024]).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&wal)
                .unwrap()
                .set_modified(at(500_000_100))
                .unwrap();
            let copy = run(JobKind::Copy, dir.path());
            assert_eq!(copy.code, 0, "{}", copy.stderr);
            assert_eq!(copy.result.unwrap().files, Some(1));
            assert_eq!(
                std::fs::read(dst.join("wal")).unwrap(),
                vec![2u8; 64 * 1024]
            );
            let verify = run(JobKind::Verify, dir.path());
            assert_eq!(verify.code, 0, "{}", verify.stderr);
        }

        /// With `BWLIMIT` set, the pre-copy is held to that many KiB per second: 3 MiB at
        /// 1 MiB/s takes at least 1.5 s (rsync may send its first block unthrottled), and copies
        /// every byte.
        #[test]
        fn pre_copy_keeps_to_its_bandwidth_cap() {
            let Some((dir, src, dst)) = empty_trees() else {
                return;
            };
            let data: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
            std::fs::write(src.join("big"), &data).unwrap();
            let started = std::time::Instant::now();
            let run = run_in(
                JobKind::PreCopy,
                dir.path(),
                None,
                &[("BWLIMIT", "1024".into())],
            );
            let took = started.elapsed();
            let result = run.result.unwrap_or_else(|e| panic!("{e}: {}", run.stderr));
            assert_eq!(result.bytes, Some(3 * 1024 * 1024), "{}", run.stderr);
            // rsync, not cp, which has no cap.
            assert_eq!(result.mode, Some(CopyMode::WholeFile), "{result:?}");
            assert!(
                run.stderr.contains("rsync copies: the pass is capped"),
                "{}",
                run.stderr
            );
            assert_eq!(std::fs::read(dst.join("big")).unwrap(), data);
            assert!(
                took >= std::time::Duration::from_millis(1500),
                "3 MiB at 1 MiB/s took {took:?}"
            );
        }

        #[test]
        fn copy_failure_is_reported() {
            if !rsync_present("copy script test") {
                return;
            }
            // No source directory: rsync exits 23.
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("target")).unwrap();
            for kind in [JobKind::Copy, JobKind::PreCopy, JobKind::Verify] {
                let run = run(kind, dir.path());
                assert_eq!(run.code, 23, "{kind:?}: {}", run.stderr);
                let r = run.result.unwrap();
                assert!(r.failed());
                assert_eq!(r.exit_code, Some(23));
            }
            let measure = run(JobKind::Measure, dir.path());
            assert_eq!(measure.code, 1);
            assert!(measure.result.unwrap().failed());
        }

        /// rsync reporting ENOSPC (as it does when the target fills: exit 11, or 23 when it
        /// failed on some files): the result says `NoSpace`, with the source's bytes and the
        /// target's `statfs`; any other failure does not.
        #[test]
        fn copy_out_of_space_is_reported_with_its_cause_and_numbers() {
            let dir = tempfile::tempdir().unwrap();
            let bin = dir.path().join("bin");
            std::fs::create_dir_all(dir.path().join("source")).unwrap();
            std::fs::create_dir_all(dir.path().join("target")).unwrap();
            std::fs::write(dir.path().join("source/data"), vec![7u8; 64 * 1024]).unwrap();
            std::fs::create_dir_all(&bin).unwrap();
            let fake = bin.join("rsync");
            const PROGRESS: &str =
                "         57,344  89%   54.69MB/s    0:00:01 (xfr#1, to-chk=0/3)";
            for (code, line, no_space) in [
                (
                    11,
                    r#"rsync: [receiver] write failed on "/target/data": No space left on device (28)"#,
                    true,
                ),
                (
                    23,
                    r#"rsync: [receiver] mkstemp "/target/.50%.x" failed: No space left on device (28)"#,
                    true,
                ),
                (
                    23,
                    r#"rsync: [sender] link_stat "/source/x" failed: No such file or directory (2)"#,
                    false,
                ),
            ] {
                std::fs::write(
                    &fake,
                    format!(
                        "#!/bin/sh\nprintf '%s\\r' '{PROGRESS}'\necho '{line}' >&2\nexit {code}\n"
                    ),
                )
                .unwrap();
                std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
                for kind in [JobKind::PreCopy, JobKind::Copy] {
                    // The pre-copy's rsync, not its cp onto the empty target.
                    let rsync = [("FIRST_PASS_TOOL", "Rsync".to_string())];
                    let run = run_in(kind, dir.path(), Some(&bin), &rsync);
                    assert_eq!(run.code, code, "{kind:?}: {}", run.stderr);
                    let r = run.result.unwrap();
                    assert!(r.failed());
                    assert_eq!(r.exit_code, Some(code));
                    if !no_space {
                        assert_eq!(r.cause, None, "{line}");
                        assert_eq!(r.target_filesystem, None);
                        continue;
                    }
                    assert_eq!(r.cause, Some(JobFailureCause::NoSpace), "{line}");
                    assert_eq!(r.bytes, Some(57_344), "{r:?}");
                    assert!(r.used_bytes.is_some_and(|b| b >= 64 * 1024), "{r:?}");
                    let fs = r.target_filesystem.expect("the target's statfs");
                    assert!(fs.blocks > 0 && fs.block_size > 0, "{fs:?}");
                }
            }
        }

        fn nix_is_root() -> bool {
            Command::new("id")
                .arg("-u")
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        }
    }
}
