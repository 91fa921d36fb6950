#!/usr/bin/env bash
# Issue 30's numbers in one run: what the operator's work costs as the work and the cluster grow.
# A benchmark, not a test: it asserts nothing but that every part ran, and prints the tables of
#   1. bench-migration, one 3-member Generic set (64Mi, pre-copy on), the operator watching every
#      namespace (the chart's default): API requests per member, by verb, the claim swap, the
#      operator's peak RSS; then the idle operator holding finished requests: its requests a
#      minute (item 1);
#   2. bench-fleet: single-member sets in namespaces of their own, all requested at once, under
#      a cluster cap of copies: Successful, wall time against the ideal, most copies at once, RSS
#      (item 3);
#   3. bench-migration again with unrelated Pending pods and claims in other namespaces: compare
#      its requests per member and RSS with the first table (item 2);
#   4. bench-files: the final pass and the copy's memory at each file count (item 4; no cluster;
#      its final pass runs the same operator binary's `tree-diff`).
# The fleet runs before the unrelated objects exist; the unrelated namespaces are deleted when
# their run ends, and bench-files waits until they are gone.
#
# The operator measured is its release build, as users run it (the image's): the script builds
# it (`cargo build --release --bin storage-migrator`) unless STORAGE_MIGRATOR_BIN names one. A
# debug build is slower in every round (the claim swap) and larger (RSS).
# Needs: the workspace's binaries built (`cargo build --workspace --all-features --bins`:
# BIN_DIR), a local cluster up with the operator's image loaded (docs/benchmarks.md),
# KUBECONFIG pointing at it (its audit log beside it), root (bench-files mounts loop devices).
# Usage: KUBECONFIG=DIR/kubeconfig e2e/scripts/bench-cost.sh [REPORT]   (default: bench-cost.md)
# Env (defaults are issue 30's sizes; smaller ones for a quick try):
#   BIN_DIR=target/debug  STORAGE_MIGRATOR_BIN=target/release/storage-migrator (built)
#   IDLE_REQUESTS=100  IDLE_MINUTES=5  FLEET_SETS=30  FLEET_MAX_COPIES=2  UNRELATED=5000
#   FILE_COUNTS=10000,300000,1000000  FILES_DIR=/var/tmp/bench-files  LOG_DIR=<report>.logs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REPORT="${1:-bench-cost.md}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN_DIR="${BIN_DIR:-$TARGET/debug}"
export E2E_LOCALCLUSTER=1
IDLE_REQUESTS="${IDLE_REQUESTS:-100}"
IDLE_MINUTES="${IDLE_MINUTES:-5}"
FLEET_SETS="${FLEET_SETS:-30}"
FLEET_MAX_COPIES="${FLEET_MAX_COPIES:-2}"
UNRELATED="${UNRELATED:-5000}"
FILE_COUNTS="${FILE_COUNTS:-10000,300000,1000000}"
FILES_DIR="${FILES_DIR:-/var/tmp/bench-files}"
LOG_DIR="${LOG_DIR:-$REPORT.logs}"

fail() { echo "bench-cost.sh: $*" >&2; exit 1; }
[ -n "${KUBECONFIG:-}" ] && [ -f "$KUBECONFIG" ] ||
  fail "KUBECONFIG must name the local cluster's kubeconfig (localcluster up prints it)"
[ -f "$(dirname "$KUBECONFIG")/audit.log" ] ||
  fail "no audit.log beside $KUBECONFIG: the requests are counted from the local cluster's audit log"
[ "$(id -u)" = 0 ] || fail "bench-files mounts loop devices: run as root"
for bin in bench-migration bench-fleet bench-files; do
  [ -x "$BIN_DIR/$bin" ] || fail "$BIN_DIR/$bin is missing: cargo build --workspace --all-features --bins"
done
if [ -z "${STORAGE_MIGRATOR_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release --bin storage-migrator) ||
    fail "cannot build the operator's release binary (cargo build --release --bin storage-migrator)"
  STORAGE_MIGRATOR_BIN="$TARGET/release/storage-migrator"
fi
export STORAGE_MIGRATOR_BIN
[ -x "$STORAGE_MIGRATOR_BIN" ] || fail "the operator binary $STORAGE_MIGRATOR_BIN is missing"
mkdir -p "$LOG_DIR"
: > "$REPORT"

# Runs one part: its tables to the report and stdout, its progress to LOG_DIR/NAME.log.
part() {
  local name="$1" title="$2"
  shift 2
  local started
  started=$(date +%s)
  printf '\n## %s\n\n`%s`\n\n' "$title" "$*" | tee -a "$REPORT"
  echo "bench-cost.sh: $name started $(date +%H:%M:%S), progress in $LOG_DIR/$name.log" >&2
  "$@" 2> "$LOG_DIR/$name.log" | tee -a "$REPORT" ||
    fail "$name failed (exit ${PIPESTATUS[0]}): the end of its log, $LOG_DIR/$name.log: $(tail -n 5 "$LOG_DIR/$name.log")"
  printf '\n(%s: %d s)\n' "$name" "$(($(date +%s) - started))" | tee -a "$REPORT"
}

{
  echo "# Issue 30's numbers, one run"
  echo
  echo "$(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), operator $STORAGE_MIGRATOR_BIN, $(nproc) cores."
  echo "Targets: at most 150 API requests per member; an idle operator with $IDLE_REQUESTS finished requests a few requests a minute; the swap at most 0.5 s;"
  echo "with $UNRELATED unrelated pods and claims, RSS and requests per member within 10% of the first table;"
  echo "the fleet all Successful, never more copies than the cap, RSS at most 64 MiB, wall time within 1.3x of the ideal;"
  echo "downtime at most restart + 1.5 s + one bare walk of both trees, at every file count."
} | tee -a "$REPORT"

part migration "Requests per member and an idle operator (items 1 and 2, empty cluster)" \
  "$BIN_DIR/bench-migration" --workloads generic,idle --sizes 64Mi --modes on --cluster-wide \
  --idle-requests "$IDLE_REQUESTS" --idle-minutes "$IDLE_MINUTES" --log-dir "$LOG_DIR/migration"
part fleet "A fleet under a cluster cap of $FLEET_MAX_COPIES copies (item 3)" \
  "$BIN_DIR/bench-fleet" --sets "$FLEET_SETS" --max-copies "$FLEET_MAX_COPIES"
part unrelated "The same migration with $UNRELATED unrelated pods and claims (item 2)" \
  "$BIN_DIR/bench-migration" --workloads generic --sizes 64Mi --modes on --cluster-wide \
  --unrelated "$UNRELATED" --log-dir "$LOG_DIR/unrelated"
# Deleting the namespaces of the parts before (the unrelated pods and claims above all) keeps
# the API server and the controllers busy for minutes; bench-files times walks on the same
# cores, so it starts once every e2e- namespace is gone (bounded: 15 minutes).
waited=$(date +%s)
while :; do
  spaces="$(kubectl get namespaces -o name)" || fail "cannot list the namespaces (kubectl get namespaces)"
  grep -q '^namespace/e2e-' <<<"$spaces" || break
  [ $(($(date +%s) - waited)) -lt 900 ] ||
    fail "the parts' namespaces are still being deleted after 900 s: $(grep '^namespace/e2e-' <<<"$spaces" | tr '\n' ' ')"
  sleep 5
done
printf '\n(the namespaces of the parts above gone after %d s more)\n' "$(($(date +%s) - waited))" | tee -a "$REPORT"
part files "Millions of files (item 4)" \
  "$BIN_DIR/bench-files" --dir "$FILES_DIR" --counts "$FILE_COUNTS"
echo "bench-cost.sh: every part ran; the report is $REPORT" >&2
