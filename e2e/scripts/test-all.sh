#!/usr/bin/env bash
# Runs every test of the project on this machine, installing what it needs first:
#   formatting, clippy, the build, the image (build-image.sh: the OCI archive of the operator's
#   image, checked), the CRD staleness check, unit tests, then the end-to-end scenarios on a
#   fresh local cluster (brought up in a temporary state dir and brought down at the end).
# Usage: e2e/scripts/test-all.sh            (from anywhere)
# Env:   KEEP_CLUSTER=1  leave the local cluster running after the tests (prints its KUBECONFIG)
#        E2E_ARGS="..."  extra arguments for the e2e test binaries (e.g. a test name filter)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Cargo's build directory: target/ of the checkout unless CARGO_TARGET_DIR says otherwise
# (.ci/run keeps one across CI's clean clones).
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

step "install dependencies (apt packages; the Kubernetes control plane, built once and cached)"
bash e2e/scripts/install-deps.sh >/dev/null

# The test databases' images (Debian's packages; cached) build in the background, beside the
# Rust builds below: on a fresh machine they wait mostly on downloads. Their own process group,
# ended if this script stops before it waits for them.
IMAGES_DIR="$(mktemp -d /tmp/storage-migrator-test-images.XXXXXX)"
step "test database images: patroni, redis, zookeeper, built in the background (log: $IMAGES_DIR/log)"
setsid -w bash -c 'set -e; for i in patroni redis zookeeper; do
    bash e2e/scripts/build-test-image.sh "$i" > "$0/$i.path"; done' "$IMAGES_DIR" \
  >"$IMAGES_DIR/log" 2>&1 </dev/null &
IMAGES_PID=$!
stop_images() { kill -- -"$IMAGES_PID" 2>/dev/null || true; rm -rf "$IMAGES_DIR"; }
trap stop_images EXIT

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "build"
cargo build --workspace --all-features --bins

step "image (operator release build, OCI archive, checked; base root cached)"
IMAGE_ARCHIVE="$(bash e2e/scripts/build-image.sh)"

step "test database images: waiting for their background build"
images_rc=0
wait "$IMAGES_PID" || images_rc=$?
trap - EXIT
cat "$IMAGES_DIR/log"
if [ "$images_rc" != 0 ]; then
  echo "test-all.sh: building the test databases' images failed (exit $images_rc): the log is above" >&2
  exit 1
fi
PATRONI_ARCHIVE="$(cat "$IMAGES_DIR/patroni.path")"
REDIS_ARCHIVE="$(cat "$IMAGES_DIR/redis.path")"
ZK_ARCHIVE="$(cat "$IMAGES_DIR/zookeeper.path")"
rm -rf "$IMAGES_DIR"

step "CRD is generated from the Rust types"
CRDGEN_BIN="$TARGET_DIR/debug/storage-migrator" bash .ci/check-crd.sh

step "Helm chart: lint, render, Kubernetes schema validation (real Helm 4)"
bash e2e/scripts/check-chart.sh

step "unit tests"
cargo test --workspace --all-features --lib --bins

STATE_DIR="$(mktemp -d /tmp/storage-migrator-e2e.XXXXXX)"
LC="$TARGET_DIR/debug/localcluster"
cleanup() {
  rc=$?
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    echo "cluster left running: export KUBECONFIG=$STATE_DIR/kubeconfig; stop it with: $LC down --state-dir $STATE_DIR"
  else
    step "local cluster down"
    "$LC" down --state-dir "$STATE_DIR" || rc=1
    [ $rc -ne 0 ] && echo "logs kept in $STATE_DIR/logs" || rm -rf "$STATE_DIR"
  fi
  exit $rc
}
trap cleanup EXIT

step "local cluster up"
# An assignment, not `eval "$(...)"`: a failed `up` stops the script here, with its own error.
UP_ENV="$("$LC" up --state-dir "$STATE_DIR")"
eval "$UP_ENV"
export KUBECONFIG
step "load the operator's image and the test databases' into the local cluster's image store"
"$LC" image load --state-dir "$STATE_DIR" "$IMAGE_ARCHIVE"
"$LC" image load --state-dir "$STATE_DIR" "$PATRONI_ARCHIVE"
"$LC" image load --state-dir "$STATE_DIR" "$REDIS_ARCHIVE"
"$LC" image load --state-dir "$STATE_DIR" "$ZK_ARCHIVE"
export STORAGE_MIGRATOR_BIN="$TARGET_DIR/debug/storage-migrator"
export KUBECTL_SMR_BIN="$TARGET_DIR/debug/kubectl-smr"
export E2E_LOCALCLUSTER=1
# No test may pass without running: a missing cluster, root or program fails it.
export E2E_REQUIRE_ALL=1

# The end-to-end test binaries, run by E2E_WORKERS workers (3 by default) side by side against
# the one cluster (each test works in a namespace of its own): each worker takes the next binary
# no other worker has taken, longest first (the order below, from CI's timings), so the long
# ones do not end up one after another. Then the ones that disrupt the whole cluster (a node
# down, the agent or the API server restarted, a second cluster), one after another.
# Every file of e2e/tests/ is in exactly one list (checked below), so none is left out.
QUEUE=(engine_patroni etcd_quorum migration engine_zookeeper engine_redis finish_undo retention
  plugin queue foreign faults_etcd install lifecycle out_of_space templates attributes modern_pods
  reclaim_race fleet admission engine_etcd deployment quota claim_target owners shared_claim
  runtime images mover_caps cluster security leader_election rbac_usage)
ALONE=(faults faults_agent faults_apiserver localcluster)
listed="$(printf '%s\n' "${QUEUE[@]}" "${ALONE[@]}" | sort)"
present="$(cd e2e/tests && ls -- *.rs | sed 's/\.rs$//' | sort)"
if [ "$listed" != "$present" ]; then
  echo "test-all.sh: the e2e lists do not name exactly the files of e2e/tests:" >&2
  diff <(echo "$listed") <(echo "$present") >&2 || true
  exit 1
fi
WORKERS="${E2E_WORKERS:-3}"
case "$WORKERS" in
  ''|*[!0-9]*|0) echo "test-all.sh: E2E_WORKERS must be a whole number of at least 1, not '$WORKERS'" >&2; exit 1 ;;
esac
e2e_tests() {
  local args=()
  for t in "$@"; do args+=(--test "$t"); done
  # shellcheck disable=SC2086
  cargo test -p e2e --all-features --no-fail-fast "${args[@]}" -- --test-threads=2 ${E2E_ARGS:-}
}

step "end-to-end tests: build"
cargo test -p e2e --all-features --no-run --tests

RUNS="$STATE_DIR/e2e-runs"
mkdir -p "$RUNS"
# One worker: takes queue entries in order; `mkdir` is the claim (atomic), so each binary runs
# once. Each binary's output goes to its own log, printed whole after all workers are done.
worker() {
  local w="$1" i t rc t0
  for i in "${!QUEUE[@]}"; do
    mkdir "$RUNS/claim.$i" 2>/dev/null || continue
    t="${QUEUE[$i]}"
    t0="$(date +%s)"
    rc=0
    e2e_tests "$t" >"$RUNS/$t.log" 2>&1 || rc=$?
    echo "$rc" >"$RUNS/$t.rc"
    printf '%-18s worker %s  exit %s  %4ss  (ended %s)\n' "$t" "$w" "$rc" \
      "$(( $(date +%s) - t0 ))" "$(date +%H:%M:%S)" >>"$RUNS/summary"
  done
}
# The machine's CPU time, busy and all, from /proc/stat (user+nice+system+irq+softirq+steal).
cpu_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
step "end-to-end tests: ${#QUEUE[@]} binaries, $WORKERS workers side by side"
read -r busy0 all0 < <(cpu_jiffies)
pids=()
for w in $(seq 1 "$WORKERS"); do
  worker "$w" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
read -r busy1 all1 < <(cpu_jiffies)
failed=()
for t in "${QUEUE[@]}"; do
  step "end-to-end tests: $t's output"
  cat "$RUNS/$t.log"
  [ "$(cat "$RUNS/$t.rc" 2>/dev/null || echo missing)" = 0 ] || failed+=("$t")
done
step "end-to-end tests: the binaries in the order they ended"
cat "$RUNS/summary"
echo "CPU busy $(( 100 * (busy1 - busy0) / (all1 - all0 > 0 ? all1 - all0 : 1) ))% of $(nproc) cores while they ran"
step "end-to-end tests: the ones that disrupt the whole cluster, one at a time"
rc_alone=0
e2e_tests "${ALONE[@]}" || rc_alone=$?
if [ "${#failed[@]}" != 0 ] || [ "$rc_alone" != 0 ]; then
  echo "end-to-end tests failed: ${failed[*]:-none of the queue}; the disruptive ones exit $rc_alone" >&2
  exit 1
fi

# Every operator above ran as a ServiceAccount under the chart's RBAC; the API server's audit
# log now shows whether each rule was used and whether any was missing. Only after the whole
# suite: a filtered run (E2E_ARGS) skips it.
if [ -z "${E2E_ARGS:-}" ]; then
  step "RBAC: every rule used, none missing (audit log)"
  cargo test -p e2e --all-features --test rbac_usage -- --ignored --nocapture
fi
