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
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

step "install dependencies (apt packages; the Kubernetes control plane, built once and cached)"
bash e2e/scripts/install-deps.sh >/dev/null

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "build"
cargo build --workspace --all-features --bins

step "image (operator release build, OCI archive, checked; base root cached)"
IMAGE_ARCHIVE="$(bash e2e/scripts/build-image.sh)"

step "test database images (Debian's packages; cached): patroni, redis, zookeeper"
PATRONI_ARCHIVE="$(bash e2e/scripts/build-test-image.sh patroni)"
REDIS_ARCHIVE="$(bash e2e/scripts/build-test-image.sh redis)"
ZK_ARCHIVE="$(bash e2e/scripts/build-test-image.sh zookeeper)"

step "CRD is generated from the Rust types"
CRDGEN_BIN="$ROOT/target/debug/storage-migrator" bash .ci/check-crd.sh

step "Helm chart: lint, render, Kubernetes schema validation (real Helm 4)"
bash e2e/scripts/check-chart.sh

step "unit tests"
cargo test --workspace --all-features --lib --bins

STATE_DIR="$(mktemp -d /tmp/storage-migrator-e2e.XXXXXX)"
LC="$ROOT/target/debug/localcluster"
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
export STORAGE_MIGRATOR_BIN="$ROOT/target/debug/storage-migrator"
export E2E_LOCALCLUSTER=1
# No test may pass without running: a missing cluster, root or program fails it.
export E2E_REQUIRE_ALL=1

# The end-to-end test binaries, in two lanes that run side by side against the one cluster
# (each test works in a namespace of its own), then the ones that disrupt the whole cluster (a
# node down, the agent or the API server restarted, a second cluster), one after another.
# Every file of e2e/tests/ is in exactly one list (checked below), so none is left out.
LANE_A=(etcd_quorum admission claim_target cluster deployment engine_etcd images install plugin
  queue retention engine_zookeeper engine_redis fleet)
LANE_B=(finish_undo foreign lifecycle migration modern_pods mover_caps out_of_space owners quota
  rbac_usage reclaim_race runtime security shared_claim templates faults_etcd engine_patroni)
ALONE=(faults faults_agent faults_apiserver localcluster)
listed="$(printf '%s\n' "${LANE_A[@]}" "${LANE_B[@]}" "${ALONE[@]}" | sort)"
present="$(cd e2e/tests && ls -- *.rs | sed 's/\.rs$//' | sort)"
if [ "$listed" != "$present" ]; then
  echo "test-all.sh: the e2e lanes do not list exactly the files of e2e/tests:" >&2
  diff <(echo "$listed") <(echo "$present") >&2 || true
  exit 1
fi
e2e_tests() {
  local args=()
  for t in "$@"; do args+=(--test "$t"); done
  # shellcheck disable=SC2086
  cargo test -p e2e --all-features --no-fail-fast "${args[@]}" -- --test-threads=2 ${E2E_ARGS:-}
}

step "end-to-end tests: build"
cargo test -p e2e --all-features --no-run --tests

LANES="$STATE_DIR/lanes"
mkdir -p "$LANES"
step "end-to-end tests: two lanes side by side (${#LANE_A[@]} and ${#LANE_B[@]} binaries)"
e2e_tests "${LANE_A[@]}" >"$LANES/a.log" 2>&1 & lane_a=$!
e2e_tests "${LANE_B[@]}" >"$LANES/b.log" 2>&1 & lane_b=$!
rc_a=0; wait "$lane_a" || rc_a=$?
rc_b=0; wait "$lane_b" || rc_b=$?
for lane in a b; do
  step "end-to-end tests: lane $lane's output"
  cat "$LANES/$lane.log"
done
step "end-to-end tests: the ones that disrupt the whole cluster, one at a time"
rc_alone=0
e2e_tests "${ALONE[@]}" || rc_alone=$?
if [ "$rc_a" != 0 ] || [ "$rc_b" != 0 ] || [ "$rc_alone" != 0 ]; then
  echo "end-to-end tests failed: lane a exit $rc_a, lane b exit $rc_b, alone exit $rc_alone" >&2
  exit 1
fi

# Every operator above ran as a ServiceAccount under the chart's RBAC; the API server's audit
# log now shows whether each rule was used and whether any was missing. Only after the whole
# suite: a filtered run (E2E_ARGS) skips it.
if [ -z "${E2E_ARGS:-}" ]; then
  step "RBAC: every rule used, none missing (audit log)"
  cargo test -p e2e --all-features --test rbac_usage -- --ignored --nocapture
fi
